//! Held records on disk, on a real broker: with no hold budget (nothing
//! pauses), 400k records wait for an open upstream transaction. Past the
//! window each held record's copy lives in the task's state file, not in
//! memory, so the resident set grows by far less than the records' own
//! bytes; when the transaction commits every record is read back and
//! delivered once, in offset order.
//!
//! One test in its own binary, so that the resident set it reads is its
//! own. It needs a broker: it runs when `PARSLEY_BOOTSTRAP` names one.

#[path = "../examples/shared/bench_util.rs"]
mod bench_util;
mod common;
#[path = "common/open_cause.rs"]
mod open_cause;

use std::time::{Duration, Instant};

use common::{config, create_topics, unique};
use open_cause::{open_cause, send_effects};

use parsley::protocol::Channel;
use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::producer::Producer;

/// Dependent records produced while the cause's transaction is open.
const EFFECTS: usize = 400_000;

fn topic(name: &str) -> Topic<String, String> {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn rss() -> u64 {
    bench_util::status_bytes("self", "VmRSS").expect("the resident set is readable on Linux")
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn records_held_behind_an_open_transaction_wait_on_disk_and_all_arrive_in_order() {
    let (c, e, out) = (unique("causes"), unique("effects"), unique("out"));
    create_topics(&[(&c, 1), (&e, 1), (&out, 1)]);
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let causes_id = cluster.describe(&c).unwrap().id;

    let upstream = open_cause(&c);
    send_effects(&e, EFFECTS, Channel::new(causes_id, 0));

    let (causes, effects, sink) = (topic(&c), topic(&e), topic(&out));
    let (o1, o2) = (sink.clone(), sink.clone());
    let stage = Stage::named("wait")
        .on(&causes, move |m: &Message<String, String>| {
            vec![o1.send(m.key().cloned(), "cause".to_owned())]
        })
        .on(&effects, move |m: &Message<String, String>| {
            vec![o2.send(m.key().cloned(), m.key().cloned().unwrap_or_default())]
        })
        .sink(&sink)
        .build()
        .unwrap();
    let app = Parsley::named(unique("app").as_str(), [stage]).unwrap();
    let dir = std::env::temp_dir().join(unique("held-on-disk"));
    let baseline = rss();
    let mut s = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            state_dir: Some(dir.clone()),
            hold_budget: None,
            ..common::options()
        });
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(60)).unwrap();

    // Until every effect is held.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peak = rss();
    let (held, paged) = loop {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(rss());
        let m = s.metrics();
        let held: u64 = m.iter().map(|t| t.records_held).sum();
        let paged: u64 = m.iter().map(|t| t.records_held_paged).sum();
        if held as usize >= EFFECTS {
            break (held, paged);
        }
        assert!(Instant::now() < deadline, "only {held} of {EFFECTS} held");
    };
    // A moment for the last commits' writes to reach the file: a record is
    // paged out once the commit that holds it is in the file, so the count
    // read when the last record arrived can trail by a commit or two. It
    // is read again until it settles (or the deadline passes).
    let settle = Instant::now();
    let mut paged = paged;
    while settle.elapsed() < Duration::from_secs(2)
        || (paged as usize <= EFFECTS - 1_000 && Instant::now() < deadline)
    {
        peak = peak.max(rss());
        std::thread::sleep(Duration::from_millis(20));
        paged = s.metrics().iter().map(|t| t.records_held_paged).sum();
    }
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "{held} held ({paged} paged), baseline {} MiB, peak {} MiB (growth {} MiB)",
        baseline >> 20,
        peak >> 20,
        growth >> 20
    );
    assert!(
        paged as usize > EFFECTS - 1_000,
        "{paged} of {held} paged out"
    );
    // Kept in memory, the held records' copies in the protocol store
    // took the resident set up by about 200 MiB here (measured with the
    // rule switched off); on disk, what grows is the file's page cache
    // (8 MiB), the consumer's prefetch, each commit's writes while they
    // are in flight, and a few bytes per held record: about 90 MiB.
    assert!(
        growth < 128 << 20,
        "the resident set grew by {} MiB while {held} records were held",
        growth >> 20
    );

    upstream
        .commit_transaction(Duration::from_secs(20))
        .unwrap();
    let total = EFFECTS + 1;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let delivered: u64 = s.metrics().iter().map(|t| t.records_delivered_total).sum();
        if delivered as usize >= total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {delivered} of {total} delivered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.close(Duration::from_secs(30)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let read = common::read_committed(&out, 1, total + 1, Duration::from_secs(60));
    let values: Vec<&str> = read.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values.len(), total, "exactly once");
    assert_eq!(values[0], "cause", "the cause first");
    let expected: Vec<String> = (0..EFFECTS).map(|i| format!("k{i:06}")).collect();
    assert!(
        values[1..].iter().zip(&expected).all(|(a, b)| a == b),
        "every effect once, in offset order"
    );
}
