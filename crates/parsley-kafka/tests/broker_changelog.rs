//! Changelog replays on a real broker say where they stopped: the last
//! stable offset, past trailing transaction markers, and below a
//! transaction that is still open. The worker starts a task only once a
//! replay reaches the end the task started against, so a replay that
//! reported less would wait for nothing, and one that reported more would
//! start a task without a transaction's writes.
//!
//! Needs a broker (`PARSLEY_BOOTSTRAP`); a plain `cargo test` skips it.

mod common;

use std::time::Duration;

use common::{config, create_topics, unique};
use parsley::runtime::host::ChangelogReader;
use parsley_kafka::KafkaCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn transactional() -> BaseProducer {
    let mut c = config();
    c.set("transactional.id", unique("txn"));
    let p: BaseProducer = c.create().unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    p
}

fn send(p: &BaseProducer, topic: &str, key: &str) {
    p.send(BaseRecord::to(topic).partition(0).key(key).payload("v"))
        .map_err(|(e, _)| e)
        .unwrap();
}

/// (keys read, where the replay stopped) from `from`.
fn replay(cluster: &KafkaCluster, topic: &str, from: i64) -> (Vec<String>, i64) {
    let mut keys = Vec::new();
    let reached = cluster
        .replay_changelog_from(topic, 0, from, &mut |r| {
            keys.push(String::from_utf8(r.key.unwrap_or_default()).unwrap());
        })
        .unwrap();
    (keys, reached)
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_replay_stops_at_the_last_stable_offset_and_says_so() {
    let topic = unique("changelog");
    create_topics(&[(&topic, 1)]);
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(30)).unwrap();

    // Empty: it stops at 0.
    assert_eq!(replay(&cluster, &topic, 0), (vec![], 0));

    // Three records in a committed transaction (offsets 0-2) and its
    // marker (3): the replay passes the marker.
    let a = transactional();
    a.begin_transaction().unwrap();
    for k in ["a0", "a1", "a2"] {
        send(&a, &topic, k);
    }
    a.commit_transaction(Duration::from_secs(30)).unwrap();
    assert_eq!(
        replay(&cluster, &topic, 0),
        (vec!["a0".into(), "a1".into(), "a2".into()], 4)
    );

    // A transaction left open (offsets 4, 5) under a record of another
    // transaction that committed (6, marker 7): a read_committed replay
    // stops below the open one, and says so.
    let b = transactional();
    b.begin_transaction().unwrap();
    send(&b, &topic, "b0");
    send(&b, &topic, "b1");
    b.flush(Duration::from_secs(30)).unwrap();
    let c = transactional();
    c.begin_transaction().unwrap();
    send(&c, &topic, "c0");
    c.commit_transaction(Duration::from_secs(30)).unwrap();
    let (keys, reached) = replay(&cluster, &topic, 0);
    assert_eq!(reached, 4, "stopped below the open transaction");
    assert_eq!(keys, ["a0", "a1", "a2"]);

    // Once it commits (marker 8), the replay reaches the end (9).
    b.commit_transaction(Duration::from_secs(30)).unwrap();
    let (keys, reached) = replay(&cluster, &topic, 0);
    assert_eq!(keys, ["a0", "a1", "a2", "b0", "b1", "c0"]);
    assert_eq!(reached, 9);
    // From a checkpoint, the same end.
    assert_eq!(
        replay(&cluster, &topic, 4),
        (vec!["b0".into(), "b1".into(), "c0".into()], 9)
    );

    // An aborted transaction at the end (9, 10, marker 11) is passed too.
    let d = transactional();
    d.begin_transaction().unwrap();
    send(&d, &topic, "d0");
    send(&d, &topic, "d1");
    d.flush(Duration::from_secs(30)).unwrap();
    d.abort_transaction(Duration::from_secs(30)).unwrap();
    assert_eq!(replay(&cluster, &topic, 0).1, 12);
}
