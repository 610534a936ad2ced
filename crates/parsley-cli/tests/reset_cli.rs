//! `parsley reset` on a live broker (`PARSLEY_BOOTSTRAP`): a two-stage
//! application (a relay writing an internal topic, and a running total per
//! key reading it) runs once; the command refuses while it runs, prints a
//! plan that changes nothing, then resets it; the restarted application
//! reprocesses everything and its totals are the first run's again, its
//! relay's send sequences go on from where they were, and a second reset
//! of the reset application writes no state.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{config, create, parsley, unique};
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions, StreamsState};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 2;
const KEYS: usize = 6;
const ROUNDS: usize = 5;

/// One output: its partition, key, value, `vc-sender` and `vc-seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Out {
    partition: i32,
    key: String,
    value: String,
    sender: Vec<u8>,
    seq: i64,
}

/// Every committed record of `topic`, waiting up to a minute for `n`.
fn read_all(topic: &str, n: usize) -> Vec<Out> {
    let consumer = common::reader(topic, PARTITIONS);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let header = |name: &str| {
                m.headers()
                    .and_then(|hs| hs.iter().find(|h| h.key == name))
                    .and_then(|h| h.value)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            };
            let seq = i64::from_be_bytes(header("vc-seq").try_into().unwrap());
            out.push(Out {
                partition: m.partition(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                sender: header("vc-sender"),
                seq,
            });
        }
    }
    assert_eq!(out.len(), n, "{topic}: expected {n} records, read {out:?}");
    out
}

/// Per partition, the key and value of each record in offset order.
/// Each key's values, in the order its partition holds them. Keys of one
/// output partition come from different tasks, whose records interleave
/// as the tasks happen to run (each emission is produced as it is made);
/// one key's come from one task, in its order.
fn by_key(records: &[Out]) -> BTreeMap<(i32, String), Vec<String>> {
    let mut m: BTreeMap<(i32, String), Vec<String>> = BTreeMap::new();
    for r in records {
        m.entry((r.partition, r.key.clone()))
            .or_default()
            .push(r.value.clone());
    }
    m
}

fn app(app_id: &str, input: &str, internal: &str, output: &str) -> Parsley {
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut relay = Stage::named("relay");
    let to_internal = relay.add_sink(&t(internal));
    let relay = relay
        .on(&t(input), move |m: &parsley::Message<String, String>| {
            vec![to_internal.send(m.key().cloned(), m.value().cloned())]
        })
        .build()
        .unwrap();
    let mut totals = Stage::named("totals").state(Codec::int64(), || 0);
    let to_output = totals.add_sink(&t(output));
    let totals = totals
        .fold(
            &t(internal),
            move |sum: i64, m: &parsley::Message<String, String>| {
                let next = sum + m.value().and_then(|v| v.parse().ok()).unwrap_or(0);
                Step::to(next).emit(to_output.send(m.key().cloned(), next.to_string()))
            },
        )
        .build()
        .unwrap();
    Parsley::named(app_id, [relay, totals]).unwrap()
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_reset_application_reprocesses_to_the_same_outputs() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, internal, output, app_id) = (
        unique("in"),
        unique("internal"),
        unique("out"),
        unique("app"),
    );
    create(
        &cluster,
        &[
            (&input, PARTITIONS),
            (&internal, PARTITIONS),
            (&output, PARTITIONS),
        ],
    );
    let app = app(&app_id, &input, &internal, &output);
    let file = std::env::temp_dir().join(format!("{app_id}.json"));
    std::fs::write(&file, parsley_kafka::topology(&app).to_json()).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let start = || {
        let mut s = CausalStreams::new(&app, config())
            .unwrap()
            .with_options(StreamsOptions {
                commit_interval: Duration::from_millis(50),
                instance_id: Some("reset".to_owned()),
                state_dir: None,
                ..StreamsOptions::default()
            });
        s.start().unwrap();
        s
    };
    let reset = |extra: &[&str]| {
        let bootstrap = common::bootstrap();
        let mut args = vec!["reset", "--bootstrap", &bootstrap, "--app", &file];
        args.extend_from_slice(extra);
        parsley(&args)
    };

    let producer: BaseProducer = config().create().unwrap();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let (key, value) = (format!("k{k}"), format!("{}", round * 10 + k));
            producer
                .send(BaseRecord::to(&input).key(&key).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    producer.flush(Duration::from_secs(20)).unwrap();
    let n = ROUNDS * KEYS;

    let mut s = start();
    let first = read_all(&output, n);
    let (ok, text) = reset(&["--execute"]);
    assert!(!ok && text.contains("is running"), "{text}");
    s.close(Duration::from_secs(30)).unwrap();
    assert_eq!(s.state(), StreamsState::Stopped);

    // The plan names every position and changes nothing.
    let (ok, plan) = reset(&[]);
    assert!(ok, "{plan}");
    assert!(plan.contains("Nothing was changed"), "{plan}");
    assert!(
        plan.contains(&format!("{input}:0  committed ")) && plan.contains(" -> 0"),
        "{plan}"
    );
    assert!(
        plan.contains("its end: the application writes this topic"),
        "{plan}"
    );
    assert!(plan.contains("read for their senders' sequences"), "{plan}");
    let committed = |topic: &str| {
        let mut c = config();
        c.set("group.id", &app_id);
        let consumer: BaseConsumer = c.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(topic, p);
        }
        consumer
            .committed_offsets(tpl, Duration::from_secs(20))
            .unwrap()
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            })
            .sum::<i64>()
    };
    // An application file naming a source that does not exist is refused
    // before anything is read or written.
    let missing = std::env::temp_dir().join(format!("{app_id}-missing.json"));
    std::fs::write(
        &missing,
        format!(
            r#"{{"application_id": "{app_id}", "stages": [{{"name": "relay", "sources": ["pt-no-such-topic"]}}]}}"#
        ),
    )
    .unwrap();
    let bootstrap = common::bootstrap();
    let (ok, text) = parsley(&[
        "reset",
        "--bootstrap",
        &bootstrap,
        "--app",
        missing.to_str().unwrap(),
        "--execute",
    ]);
    assert!(
        !ok && text.contains("\"pt-no-such-topic\" of stage \"relay\" does not exist"),
        "{text}"
    );
    let consumed = committed(&input);
    assert!(consumed >= n as i64, "the first run consumed {consumed}");
    assert_eq!(committed(&input), consumed, "a plan changes nothing");

    let (ok, text) = reset(&["--execute"]);
    assert!(ok, "{text}");
    assert!(text.contains("Done"), "{text}");
    assert_eq!(committed(&input), 0, "sources go back to their start");
    // A second reset has nothing left to write.
    let (ok, again) = reset(&["--execute"]);
    assert!(ok, "{again}");
    assert!(
        again.contains("Protocol state: 0 record(s) to append"),
        "{again}"
    );
    assert!(again.contains("Fold state: 0 key(s) to delete"), "{again}");

    let mut s = start();
    let all = read_all(&output, 2 * n);
    s.close(Duration::from_secs(30)).unwrap();
    // Per key, the reprocessed totals follow the first run's and equal
    // them: the fold state started again from nothing, and the relay's old
    // records were not read twice.
    let before = by_key(&first);
    let after = by_key(&all);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (key, old) in &before {
        let now = &after[key];
        assert_eq!(&now[..old.len()], &old[..], "{key:?}");
        assert_eq!(&now[old.len()..], &old[..], "{key:?} reprocessed");
    }
    // The sequences of both stages go on from where the first run left
    // them, never again from 1: each sender's, on each partition, rise
    // through both runs.
    for topic in [&internal, &output] {
        let mut seqs: BTreeMap<(i32, Vec<u8>), Vec<i64>> = BTreeMap::new();
        for r in read_all(topic, 2 * n) {
            seqs.entry((r.partition, r.sender)).or_default().push(r.seq);
        }
        assert!(!seqs.is_empty());
        for ((p, _), seqs) in seqs {
            assert!(
                seqs.windows(2).all(|w| w[1] > w[0]),
                "{topic}:{p} sequences {seqs:?}"
            );
        }
    }
}
