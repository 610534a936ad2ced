//! Memory that stays bounded, on a real broker: records waiting for an
//! open upstream transaction make the stage pause fetching once its holds
//! pass the budget, so the process's resident set stays flat however many
//! dependent records arrive; a record claiming the paused partition
//! resumes it; and once the transaction commits everything is delivered
//! once, in causal order.
//!
//! One test in its own binary, so that the resident set it reads is its
//! own. It needs a broker: it runs when `PARSLEY_BOOTSTRAP` names one.

#[path = "../examples/shared/bench_util.rs"]
mod bench_util;
mod common;
#[path = "common/open_cause.rs"]
mod open_cause;

use std::time::{Duration, Instant};

use bench_util::send_when_room;
use common::{config, create_topics, unique};

use open_cause::{open_cause, send_effects, stamped};
use parsley::protocol::Channel;
use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Dependent records produced while the cause's transaction is open.
const EFFECTS: usize = 200_000;
/// The hold budget per task.
const BUDGET: usize = 4 << 20;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// This process's resident set (`VmRSS`), in bytes.
fn rss() -> u64 {
    bench_util::status_bytes("self", "VmRSS").expect("the resident set is readable on Linux")
}

/// Sums over the instance's tasks: (held bytes, partitions paused,
/// records delivered).
fn reading(s: &CausalStreams) -> (u64, u64, u64) {
    let m = s.metrics();
    (
        m.iter().map(|t| t.records_held_bytes).sum(),
        m.iter().map(|t| t.partitions_paused).sum(),
        m.iter().map(|t| t.records_delivered_total).sum(),
    )
}

/// The issue's scenario: an upstream transaction left open while 200k
/// dependent records arrive, then committed.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn records_behind_an_open_transaction_stay_within_the_budget_and_all_arrive_in_order() {
    let (c, e, r, out) = (
        unique("causes"),
        unique("effects"),
        unique("replies"),
        unique("out"),
    );
    create_topics(&[(&c, 1), (&e, 1), (&r, 1), (&out, 1)]);
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (causes_id, effects_id) = (
        cluster.describe(&c).unwrap().id,
        cluster.describe(&e).unwrap().id,
    );

    // The cause, in a transaction left open; every effect claims it
    // (causes:0@0).
    let upstream = open_cause(&c);
    send_effects(&e, EFFECTS, Channel::new(causes_id, 0));

    let (causes, effects, replies, sink) = (topic(&c), topic(&e), topic(&r), topic(&out));
    let (o1, o2, o3) = (sink.clone(), sink.clone(), sink.clone());
    let stage = Stage::named("wait")
        .on(&causes, move |m: &Message<String, String>| {
            vec![o1.send(m.key().cloned(), "cause".to_owned())]
        })
        .on(&effects, move |m: &Message<String, String>| {
            vec![o2.send(m.key().cloned(), m.key().cloned().unwrap_or_default())]
        })
        .on(&replies, move |m: &Message<String, String>| {
            vec![o3.send(m.key().cloned(), "reply".to_owned())]
        })
        .sink(&sink)
        .build()
        .unwrap();
    let app = Parsley::named(unique("app").as_str(), [stage]).unwrap();
    let dir = std::env::temp_dir().join(unique("memory-state"));
    let baseline = rss();
    let mut s = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            instance_id: Some("a".to_owned()),
            state_dir: Some(dir.clone()),
            hold_budget: Some(BUDGET),
            ..common::options()
        });
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(60)).unwrap();

    // Until the holds stop growing: fetching paused.
    let mut peak_rss = rss();
    let mut peak_held = 0;
    let mut steady = (0, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        peak_rss = peak_rss.max(rss());
        let (held, paused, _) = reading(&s);
        peak_held = peak_held.max(held);
        if held != steady.0 {
            steady = (held, Instant::now());
        } else if paused > 0 && steady.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the holds never settled: {held} bytes held, {paused} partitions paused"
        );
    }
    let growth = peak_rss.saturating_sub(baseline);
    eprintln!(
        "baseline {} MiB, peak {} MiB (growth {} MiB), peak held {} KiB of a {} KiB budget",
        baseline >> 20,
        peak_rss >> 20,
        growth >> 20,
        peak_held >> 10,
        BUDGET >> 10
    );
    // Held bytes are the gauge's count: over the budget only by what the
    // fetches in flight when the pause took delivered.
    assert!(
        peak_held < 2 * BUDGET as u64,
        "held {peak_held} bytes against a budget of {BUDGET}"
    );
    // Every effect held would take about 200 MiB; the budget, the
    // consumer's prefetch and the stores' copies of what is held take a
    // small multiple of the budget.
    assert!(
        growth < 64 << 20,
        "the resident set grew by {} MiB while the cause was missing",
        growth >> 20
    );

    // A reply claiming effects:0@10 waits for the paused partition: it
    // resumes (and, since a held head now waits for its records, keeps
    // fetching past the budget; the reply's own partition pauses instead).
    {
        let producer: BaseProducer = config().create().unwrap();
        send_when_room(
            &producer,
            BaseRecord::to(&r)
                .partition(0)
                .key("reply")
                .payload("r")
                .headers(stamped(Channel::new(effects_id, 0), 10)),
        );
        producer.flush(Duration::from_secs(20)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while reading(&s).0 < 2 * peak_held {
        assert!(
            Instant::now() < deadline,
            "the claimed partition fetched nothing more: {} bytes held",
            reading(&s).0
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The cause commits: everything is delivered, once, in causal order.
    upstream
        .commit_transaction(Duration::from_secs(20))
        .unwrap();
    let total = EFFECTS + 2;
    let deadline = Instant::now() + Duration::from_secs(120);
    while (reading(&s).2 as usize) < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} delivered",
            reading(&s).2
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.close(Duration::from_secs(30)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let read = common::read_committed(&out, 1, total + 1, Duration::from_secs(60));
    let values: Vec<&str> = read.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values.len(), total, "exactly once");
    assert_eq!(values[0], "cause", "the cause first");
    let reply_at = values.iter().position(|v| *v == "reply").unwrap();
    assert!(reply_at > 11, "the reply after effects:0@10 ({reply_at})");
    let effects_seen: Vec<&str> = values
        .iter()
        .filter(|v| **v != "cause" && **v != "reply")
        .copied()
        .collect();
    let expected: Vec<String> = (0..EFFECTS).map(|i| format!("k{i:06}")).collect();
    assert!(
        effects_seen.iter().zip(&expected).all(|(a, b)| a == b) && effects_seen.len() == EFFECTS,
        "every effect once, in offset order"
    );
}
