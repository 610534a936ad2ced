//! A Parsley application on a real broker, under exactly-once: a payment
//! produced before the order it depends on is held until the order arrives;
//! outputs carry parseable causal headers; a restart resumes with its fold
//! state and processes every record exactly once.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one
//! (the README's test command starts Apache Kafka and runs them); a plain
//! `cargo test` skips them.

mod common;

use std::time::{Duration, Instant};

use common::{config, create_topics, unique};

use futures_executor::block_on;
use parsley::protocol::headers::{CLOCK_HEADER, CausalHeaders};
use parsley::protocol::{Channel, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

fn produce(topic: &str, partition: i32, key: &str, value: &str, clock: Option<&VectorClock>) {
    let producer: BaseProducer = config().create().unwrap();
    let mut record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    if let Some(c) = clock {
        record = record.headers(OwnedHeaders::new().insert(rdkafka::message::Header {
            key: CLOCK_HEADER,
            value: Some(&c.encode()),
        }));
    }
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
}

/// Every committed record of `topic`, with its causal headers parsed.
fn read(
    topic: &str,
    partitions: i32,
    n: usize,
    within: Duration,
) -> Vec<(String, String, CausalHeaders)> {
    common::read_committed(topic, partitions, n, within)
        .into_iter()
        .map(|r| {
            let causal =
                CausalHeaders::decode(r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())))
                    .expect("parseable causal headers");
            (r.key, r.value, causal)
        })
        .collect()
}

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// The ledger: remembers each order's amount; a payment settles only
/// against a known order. Also counts what it saw per key.
fn ledger(app_id: &str, orders: &T, payments: &T, settled: &T) -> Parsley {
    let s1 = settled.clone();
    let s2 = settled.clone();
    let stage = Stage::named("ledger")
        .state(Codec::utf8(), String::new)
        .fold(orders, move |_seen: String, m: &Message<String, String>| {
            Step::to(m.value().cloned().unwrap_or_default()).emit(s1.send(
                m.key().cloned(),
                format!("order {}", m.value().cloned().unwrap_or_default()),
            ))
        })
        .fold(
            payments,
            move |order: String, m: &Message<String, String>| {
                let verdict = if order.is_empty() {
                    "rejected"
                } else {
                    "settled"
                };
                Step::to(order.clone())
                    .emit(s2.send(m.key().cloned(), format!("{verdict} {order}")))
            },
        )
        .sink(settled)
        .build()
        .unwrap();
    Parsley::named(app_id, [stage]).unwrap()
}

fn start(app: &Parsley) -> CausalStreams {
    start_as(app, "a")
}

/// Starts an instance with its own instance id (two instances running at
/// once need distinct ones).
fn start_as(app: &Parsley, instance: &str) -> CausalStreams {
    start_with(app, options(instance))
}

/// The tests' options: short commit interval, the given instance id.
fn options(instance: &str) -> StreamsOptions {
    StreamsOptions {
        commit_interval: Duration::from_millis(50),
        instance_id: Some(instance.to_owned()),
        ..common::options()
    }
}

fn start_with(app: &Parsley, options: StreamsOptions) -> CausalStreams {
    start_with_config(app, options, config())
}

fn start_with_config(
    app: &Parsley,
    options: StreamsOptions,
    config: ClientConfig,
) -> CausalStreams {
    let mut s = CausalStreams::new(app, config)
        .unwrap()
        .with_options(options);
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(30)).unwrap();
    s
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_payment_before_its_order_is_held_and_settles_after_it() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut streams = start(&app);

    // The payment claims orders:0@0, where the order will land.
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let orders_id = cluster.describe(&o).unwrap().id;
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(orders_id, 0), 0);
    produce(&p, 0, "o-1", "pay 5", Some(&clock));
    // ANCHOR: explain_holds
    // An operator asks why: the runtime names the missing cause.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holds = loop {
        let holds = streams.explain_holds();
        if !holds.is_empty() && holds[0].held_for_ms >= 1_000 {
            break holds;
        }
        assert!(Instant::now() < deadline, "no hold reported");
        std::thread::sleep(Duration::from_millis(100));
    };
    let summary = holds[0].summary();
    eprintln!("explain_holds: {summary}");
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].coordinate, Coordinate::new(p.as_str(), 0, 0));
    assert!(
        summary.contains(&format!("vc-hold-not-fetched waiting on {o}:0 offset 0")),
        "{summary}"
    );
    let metrics = streams.metrics();
    assert_eq!(metrics.len(), 1, "{metrics:?}");
    assert_eq!(metrics[0].records_held, 1);
    assert!(metrics[0].records_held_age_max_ms >= 500, "{metrics:?}");
    // ANCHOR_END: explain_holds
    assert!(
        read(&s, 1, 1, Duration::from_millis(500)).is_empty(),
        "held, not settled"
    );
    produce(&o, 0, "o-1", "5", None);

    let out = read(&s, 1, 2, Duration::from_secs(30));
    let values: Vec<&str> = out.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(values, vec!["order 5", "settled 5"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !streams.explain_holds().is_empty() {
        assert!(Instant::now() < deadline, "the hold did not clear");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (_, _, causal) in &out {
        assert!(causal.sender.is_some(), "vc-sender and vc-seq are present");
    }
    // The settlement claims the order it was caused by.
    assert!(
        out[1]
            .2
            .clock
            .offset(Channel::new(orders_id, 0))
            .is_some_and(|o| o >= 0)
    );
    streams.close(Duration::from_secs(30)).unwrap();
}

/// With `commit_when_idle`, a stream thread whose fetch ran dry commits
/// its open work at the floor instead of at the interval: under a
/// ten-minute interval, the outputs of a trickle are readable within
/// seconds, where an instance without the option (the control, same
/// interval) has committed none of them yet. (Both run with a two-minute
/// transaction timeout: a transaction whose records went out ends at
/// half of it whatever the interval, which the next test shows.)
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_drained_fetch_commits_at_the_floor_not_the_interval() {
    let run = |commit_when_idle: Option<Duration>| {
        let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
        create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
        let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
        let app = ledger(&unique("app"), &orders, &payments, &settled);
        let mut long_lived = config();
        long_lived.set("transaction.timeout.ms", "120000");
        let streams = start_with_config(
            &app,
            StreamsOptions {
                commit_interval: Duration::from_secs(600),
                commit_when_idle,
                ..options("a")
            },
            long_lived,
        );
        // One record: the test is about when its output commits, not about
        // the order of two unrelated ones.
        produce(&o, 0, "o-1", "5", None);
        (streams, s)
    };
    let (mut control, control_out) = run(None);
    let (mut idle, idle_out) = run(Some(Duration::from_millis(10)));
    let values = |out: Vec<(String, String, CausalHeaders)>| {
        out.into_iter().map(|(_, v, _)| v).collect::<Vec<_>>()
    };
    assert_eq!(
        values(read(&idle_out, 1, 1, Duration::from_secs(30))),
        vec!["order 5"]
    );
    // The control had as long, and more, and still waits for its interval.
    assert!(
        read(&control_out, 1, 1, Duration::from_secs(2)).is_empty(),
        "without the option nothing commits before the interval"
    );
    idle.close(Duration::from_secs(30)).unwrap();
    // Its close commits what is open.
    control.close(Duration::from_secs(30)).unwrap();
    assert_eq!(
        values(read(&control_out, 1, 1, Duration::from_secs(30))),
        vec!["order 5"]
    );
}

/// Records go to the producer as they are made, so a transaction is open
/// on its coordinator from its first record: under a commit interval
/// longer than the transaction timeout it still commits, at half the
/// timeout, instead of being aborted by its coordinator (and its producer
/// fenced) at the timeout, again and again.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_streamed_transaction_commits_before_its_coordinator_times_it_out() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut short = config();
    short.set("transaction.timeout.ms", "6000");
    let mut streams = start_with_config(
        &app,
        StreamsOptions {
            commit_interval: Duration::from_secs(600),
            // The limit is what commits it, not a drained fetch.
            commit_when_idle: None,
            ..options("a")
        },
        short,
    );
    let began = std::time::Instant::now();
    produce(&o, 0, "o-1", "5", None);
    let out = read(&s, 1, 1, Duration::from_secs(30));
    let waited = began.elapsed();
    assert_eq!(out.len(), 1, "committed before the interval");
    // About half the timeout after the record was processed: never the
    // interval, and never after the coordinator would have aborted it.
    assert!(
        waited < Duration::from_secs(6),
        "committed after {waited:?}, past the transaction timeout"
    );
    assert_eq!(
        streams.aborted_transactions(),
        0,
        "no transaction timed out"
    );
    assert_eq!(streams.producer_replacements(), 0, "no producer was fenced");
    streams.close(Duration::from_secs(30)).unwrap();
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_restart_resumes_with_its_fold_state_exactly_once() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 2), (&p, 2), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut first = start(&app);
    for i in 0..10 {
        produce(&o, i % 2, &format!("k{i}"), &format!("{i}"), None);
    }
    assert_eq!(read(&s, 1, 10, Duration::from_secs(30)).len(), 10);
    first.close(Duration::from_secs(30)).unwrap();

    // Payments arrive while the application is down; it resumes from its
    // committed positions with the orders it folded before.
    for i in 0..10 {
        produce(&p, i % 2, &format!("k{i}"), "pay", None);
    }
    let mut second = start(&app);
    let out = read(&s, 1, 20, Duration::from_secs(60));
    second.close(Duration::from_secs(30)).unwrap();
    assert_eq!(out.len(), 20, "every input exactly once");
    let settled: Vec<&String> = out
        .iter()
        .filter(|(_, v, _)| v.starts_with("settled"))
        .map(|(_, v, _)| v)
        .collect();
    assert_eq!(
        settled.len(),
        10,
        "every payment found its order after the restart: {out:?}"
    );
    // Nothing more arrives: no duplicates.
    assert_eq!(read(&s, 1, 21, Duration::from_secs(2)).len(), 20);
}

/// A transactional upstream producer aborts a transaction between committed
/// ones: the stage never delivers the aborted records (read_committed), and
/// its frontier bridges the offsets they and the markers occupy.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn aborted_upstream_records_are_never_delivered() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut streams = start(&app);
    let mut c = config();
    c.set("transactional.id", unique("upstream"));
    let producer: BaseProducer = c.create().unwrap();
    producer.init_transactions(Duration::from_secs(20)).unwrap();
    for (value, commit) in [("1", true), ("2", false), ("3", true), ("4", false)] {
        producer.begin_transaction().unwrap();
        producer
            .send(BaseRecord::to(&o).partition(0).key("k").payload(value))
            .map_err(|(e, _)| e)
            .unwrap();
        if commit {
            producer
                .commit_transaction(Duration::from_secs(20))
                .unwrap();
        } else {
            // The records go out first, so the abort leaves them in the
            // log as aborted records at real offsets.
            producer.flush(Duration::from_secs(20)).unwrap();
            producer.abort_transaction(Duration::from_secs(20)).unwrap();
        }
    }
    let out = read(&s, 1, 2, Duration::from_secs(30));
    let values: Vec<&str> = out.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(values, vec!["order 1", "order 3"]);
    // The trailing abort is bridged: a later record claiming the last
    // offset of the partition (the abort marker) is not held for ever.
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let id = cluster.describe(&o).unwrap().id;
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(id, 0), 7);
    produce(&p, 0, "k", "pay", Some(&clock));
    let out = read(&s, 1, 3, Duration::from_secs(30));
    assert_eq!(out.len(), 3, "the payment was released: {out:?}");
    assert_eq!(out[2].1, "settled 3");
    streams.close(Duration::from_secs(30)).unwrap();
}

/// Two instances over a two-partition source: the second joins (tasks
/// move), then the first stops (they move back). Each partition's records
/// are processed exactly once, in order, and a moved task keeps its sender
/// identity in its stamps.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn tasks_migrate_between_instances_exactly_once() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 2), (&p, 2), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut a = start(&app);
    for i in 0..6 {
        produce(&o, i % 2, &format!("a{i}"), &format!("{i}"), None);
    }
    assert_eq!(read(&s, 1, 6, Duration::from_secs(30)).len(), 6);
    let mut b = start_as(&app, "b");
    std::thread::sleep(Duration::from_secs(3));
    for i in 6..12 {
        produce(&o, i % 2, &format!("b{i}"), &format!("{i}"), None);
    }
    assert_eq!(read(&s, 1, 12, Duration::from_secs(30)).len(), 12);
    a.close(Duration::from_secs(30)).unwrap();
    for i in 12..18 {
        produce(&o, i % 2, &format!("c{i}"), &format!("{i}"), None);
    }
    let out = read(&s, 1, 18, Duration::from_secs(60));
    b.close(Duration::from_secs(30)).unwrap();
    assert_eq!(out.len(), 18, "exactly once");
    assert_eq!(
        read(&s, 1, 19, Duration::from_secs(2)).len(),
        18,
        "no duplicates"
    );
    // Per source partition, in order, and one sender identity per task.
    for part in 0..2 {
        let seen: Vec<i64> = out
            .iter()
            .filter_map(|(_, v, _)| v.strip_prefix("order ").and_then(|n| n.parse().ok()))
            .filter(|n: &i64| n % 2 == part)
            .collect();
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(seen, sorted, "partition {part} in order");
    }
    let senders: std::collections::BTreeSet<_> = out
        .iter()
        .filter_map(|(_, _, c)| c.sender.map(|t| t.sender))
        .collect();
    assert_eq!(
        senders.len(),
        2,
        "two tasks, each with one identity across owners"
    );
}

/// Fail closed on a live cluster: a missing declared topic fails start,
/// naming it, and so do sources with different partition counts; a record with a corrupt `vc` header stops the task with the
/// typed error, and nothing past it is committed.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn fails_closed_on_a_missing_topic_and_a_corrupt_header() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut streams = CausalStreams::new(&app, config()).unwrap();
    let err = streams.start().unwrap_err();
    assert!(err.to_string().contains(&s), "{err}");

    create_topics(&[(&s, 1)]);
    // Sources with different partition counts: refused at start, naming
    // each.
    let p2 = unique("payments");
    create_topics(&[(&p2, 2)]);
    let wide = ledger(&unique("app"), &orders, &topic(&p2), &settled);
    let err = CausalStreams::new(&wide, config())
        .unwrap()
        .start()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("{o:?} has 1, {p2:?} has 2")),
        "{err}"
    );
    let mut streams = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(options("a"));
    // ANCHOR: state_listener
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    streams.set_state_listener(move |old, new| {
        log.lock().unwrap().push(format!(
            "{old:?} -> {}",
            format!("{new:?}").split('(').next().unwrap()
        ));
    });
    // ANCHOR_END: state_listener
    streams.start().unwrap();
    streams.wait_until_running(Duration::from_secs(30)).unwrap();
    produce(&o, 0, "k", "1", None);
    assert_eq!(read(&s, 1, 1, Duration::from_secs(30)).len(), 1);
    let producer: BaseProducer = config().create().unwrap();
    producer
        .send(
            BaseRecord::to(&o)
                .partition(0)
                .key("k")
                .payload("2")
                .headers(OwnedHeaders::new().insert(rdkafka::message::Header {
                    key: CLOCK_HEADER,
                    value: Some(&[0xde, 0xad][..]),
                })),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
    produce(&o, 0, "k", "3", None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(streams.state(), parsley_kafka::StreamsState::Failed(_)) {
        assert!(Instant::now() < deadline, "the task did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = streams.close(Duration::from_secs(30)).unwrap_err();
    assert!(err.to_string().contains("corrupt causal headers"), "{err}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            "Created -> Rebalancing",
            "Rebalancing -> Running",
            "Running -> Failed"
        ],
        "the state listener saw each change once; a failure stays final"
    );
    assert_eq!(
        read(&s, 1, 2, Duration::from_secs(2)).len(),
        1,
        "nothing past the corrupt record was committed"
    );
}

/// Log-start truncation on the wire: a payment carries a claim on a topic
/// the ledger does not consume, so the ledger's stamps carry it on. Once
/// DeleteRecords moves that topic's log start past the claim, the
/// truncation sweep retires it: later stamps no longer claim it.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn the_truncation_sweep_retires_claims_below_the_log_start() {
    let (o, p, s, x) = (
        unique("orders"),
        unique("payments"),
        unique("settled"),
        unique("elsewhere"),
    );
    create_topics(&[(&o, 1), (&p, 1), (&s, 1), (&x, 1)]);
    for i in 0..3 {
        produce(&x, 0, "k", &format!("{i}"), None);
    }
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    // ANCHOR: truncation_interval
    let mut streams = start_with(
        &app,
        StreamsOptions {
            truncation_interval: Duration::from_millis(500),
            ..options("a")
        },
    );
    // ANCHOR_END: truncation_interval
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let x0 = Channel::new(cluster.describe(&x).unwrap().id, 0);
    let mut clock = VectorClock::new();
    clock.claim_offset(x0, 2);
    produce(&p, 0, "k", "pay", Some(&clock));
    let first = read(&s, 1, 1, Duration::from_secs(30));
    assert_eq!(
        first[0].2.clock.offset(x0),
        Some(2),
        "the claim is carried on"
    );

    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&x, 0, Offset::Offset(3)).unwrap();
    futures_executor::block_on(
        cluster
            .admin()
            .delete_records(&tpl, &rdkafka::admin::AdminOptions::new()),
    )
    .unwrap();
    // Several sweep intervals pass; the next output no longer claims x.
    std::thread::sleep(Duration::from_secs(2));
    produce(&p, 0, "k", "pay again", None);
    let out = read(&s, 1, 2, Duration::from_secs(30));
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[1].2.clock.offset(x0),
        None,
        "retired by the sweep: {:?}",
        out[1].2.clock
    );
    streams.close(Duration::from_secs(30)).unwrap();
}

/// A late joiner (start policy "latest") starts at the last stable offset:
/// a transaction open when it joins commits later, and its records are
/// delivered. Starting at the high watermark would skip them.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_late_joiner_starts_at_the_last_stable_offset() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    produce(&o, 0, "old", "0", None);
    let mut c = config();
    c.set("transactional.id", unique("upstream"));
    let upstream: BaseProducer = c.create().unwrap();
    upstream.init_transactions(Duration::from_secs(20)).unwrap();
    upstream.begin_transaction().unwrap();
    upstream
        .send(BaseRecord::to(&o).partition(0).key("open").payload("1"))
        .map_err(|(e, _)| e)
        .unwrap();
    upstream.flush(Duration::from_secs(20)).unwrap();

    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    // ANCHOR: late_joiner
    let mut streams = start_with(
        &app,
        StreamsOptions {
            start_policy: parsley::runtime::worker::StartPolicy::Latest,
            ..options("a")
        },
    );
    // ANCHOR_END: late_joiner
    // Let the assignment happen while the transaction is open.
    std::thread::sleep(Duration::from_secs(3));
    upstream
        .commit_transaction(Duration::from_secs(20))
        .unwrap();
    assert_eq!(read(&s, 1, 1, Duration::from_secs(30)).len(), 1);
    let out = read(&s, 1, 2, Duration::from_secs(3));
    streams.close(Duration::from_secs(30)).unwrap();
    let values: Vec<&str> = out.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(
        values,
        vec!["order 1"],
        "the open transaction's record, not the history before it"
    );
}

/// A stream thread whose producer is fenced (here: another producer takes
/// its transactional id, as a restarted copy of the instance would) loses
/// the transaction it was committing, replaces its producer and keeps its
/// membership (no rebalance for a fault of one producer). It goes on from
/// the committed state: every order settles exactly once, in order, across
/// the fence.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_fenced_stream_thread_replaces_its_producer_and_goes_on_exactly_once() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app_id = unique("app");
    let app = ledger(&app_id, &orders, &payments, &settled);
    let mut streams = start_as(&app, "fenced");
    const N: usize = 40;
    for i in 0..N / 2 {
        produce(&o, 0, &format!("k{i:03}"), &format!("{i}"), None);
    }
    assert_eq!(read(&s, 1, N / 2, Duration::from_secs(30)).len(), N / 2);
    assert_eq!(streams.producer_replacements(), 0);
    assert_eq!(streams.aborted_transactions(), 0);

    // Another producer initialises the thread's transactional id: the
    // thread's producer is fenced at its next transaction.
    let mut c = config();
    c.set("transactional.id", format!("{app_id}-fenced-0"));
    let usurper: BaseProducer = c.create().unwrap();
    usurper.init_transactions(Duration::from_secs(20)).unwrap();
    for i in N / 2..N {
        produce(&o, 0, &format!("k{i:03}"), &format!("{i}"), None);
    }
    let out = read(&s, 1, N, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    while streams.producer_replacements() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (replaced, rejoins) = (streams.producer_replacements(), streams.rejoins());
    let aborted = streams.aborted_transactions();
    streams.close(Duration::from_secs(30)).unwrap();
    assert!(
        replaced >= 1,
        "the fenced thread replaced its producer ({replaced})"
    );
    // The fenced transaction ended with its producer, as an abort.
    assert!(
        aborted >= replaced,
        "{aborted} aborted, {replaced} replaced"
    );
    assert_eq!(rejoins, 0, "and kept its membership");
    let values: Vec<String> = out.iter().map(|(_, v, _)| v.clone()).collect();
    let expected: Vec<String> = (0..N).map(|i| format!("order {i}")).collect();
    assert_eq!(values, expected, "exactly once, in order, across the fence");
    assert_eq!(
        read(&s, 1, N + 1, Duration::from_secs(2)).len(),
        N,
        "nothing duplicated"
    );
}

/// Density on the wire: an upstream producer commits one record per
/// transaction, so every record is followed by a commit marker and the
/// records sit at every other offset. Everything is delivered, in order,
/// and a record claiming the trailing marker's offset (the partition's
/// last offset) is released: the captured consumer position bridges it.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn commit_markers_between_records_are_bridged() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut streams = start(&app);
    let mut c = config();
    c.set("transactional.id", unique("upstream"));
    let producer: BaseProducer = c.create().unwrap();
    producer.init_transactions(Duration::from_secs(20)).unwrap();
    const K: usize = 20;
    for i in 0..K {
        producer.begin_transaction().unwrap();
        producer
            .send(
                BaseRecord::to(&o)
                    .partition(0)
                    .key("k")
                    .payload(&format!("{i}")),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        producer
            .commit_transaction(Duration::from_secs(20))
            .unwrap();
    }
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let id = cluster.describe(&o).unwrap().id;
    let (_, high) = cluster
        .admin()
        .inner()
        .fetch_watermarks(&o, 0, Duration::from_secs(20))
        .unwrap();
    assert_eq!(high, 2 * K as i64, "one marker after every record");
    let out = read(&s, 1, K, Duration::from_secs(30));
    let values: Vec<String> = out.iter().map(|(_, v, _)| v.clone()).collect();
    let expected: Vec<String> = (0..K).map(|i| format!("order {i}")).collect();
    assert_eq!(values, expected);
    // The payment claims the trailing marker at offset 2K - 1.
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(id, 0), 2 * K as i64 - 1);
    produce(&p, 0, "k", "pay", Some(&clock));
    let out = read(&s, 1, K + 1, Duration::from_secs(30));
    assert_eq!(out.len(), K + 1, "the payment was released: {out:?}");
    assert_eq!(out[K].1, format!("settled {}", K - 1));
    streams.close(Duration::from_secs(30)).unwrap();
}

/// An existing changelog topic that could lose state fails start, naming
/// the topic: one with a `delete` cleanup policy (retention would remove
/// held records and fold entries a restore needs), and one whose partition
/// count is not the stage's task count. Changelogs the runtime creates are
/// compacted, one partition per task.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn an_unusable_changelog_fails_start_and_created_ones_are_compacted() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 2), (&p, 2), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));

    // A delete policy.
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let names = app.owned_names("ledger").unwrap().clone();
    let fold = names.fold_changelog.clone().unwrap();
    let topic_with = |name: &str, partitions: i32, policy: &str| {
        let t = NewTopic::new(name, partitions, TopicReplication::Fixed(1))
            .set("cleanup.policy", policy);
        for r in block_on(cluster.admin().create_topics([&t], &opts)).unwrap() {
            r.unwrap();
        }
    };
    topic_with(&fold, 2, "delete");
    let err = CausalStreams::new(&app, config())
        .unwrap()
        .start()
        .unwrap_err();
    assert!(
        matches!(&err, parsley_kafka::StreamsError::Changelog { topic, .. } if *topic == fold),
        "{err}"
    );
    assert!(err.to_string().contains("cleanup.policy"), "{err}");

    // A partition count other than the task count.
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let state = app.owned_names("ledger").unwrap().state_changelog.clone();
    topic_with(&state, 3, "compact");
    let err = CausalStreams::new(&app, config())
        .unwrap()
        .start()
        .unwrap_err();
    assert!(
        matches!(&err, parsley_kafka::StreamsError::Changelog { topic, .. } if *topic == state),
        "{err}"
    );
    assert!(err.to_string().contains("3 partition(s)"), "{err}");

    // What the runtime creates passes its own check: a second start finds
    // them and runs.
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let mut first = start(&app);
    first.close(Duration::from_secs(30)).unwrap();
    let names = app.owned_names("ledger").unwrap().clone();
    for changelog in [
        &names.state_changelog,
        names.fold_changelog.as_ref().unwrap(),
    ] {
        assert_eq!(cluster.describe(changelog).unwrap().partitions, 2);
        let r = block_on(
            cluster
                .admin()
                .describe_configs([&ResourceSpecifier::Topic(changelog)], &AdminOptions::new()),
        )
        .unwrap();
        let config = r[0].as_ref().unwrap();
        let setting = |k: &str| config.get(k).unwrap().value.clone();
        assert_eq!(
            setting("cleanup.policy").as_deref(),
            Some("compact"),
            "{changelog}"
        );
        // Segments small enough, and rolled often enough, for compaction
        // to run on a changelog of any size.
        assert_eq!(setting("segment.bytes").as_deref(), Some("67108864"));
        assert_eq!(setting("segment.ms").as_deref(), Some("600000"));
        assert_eq!(setting("min.cleanable.dirty.ratio").as_deref(), Some("0.2"));
    }
    let mut second = start(&app);
    second.close(Duration::from_secs(30)).unwrap();
}

/// A held record survives a restart: the payment waits for its order when
/// the application closes; the next start restores it from the changelog
/// (the consumer's committed position is already past it), and the order's
/// arrival releases it, once.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_held_record_is_restored_from_the_changelog_after_a_restart() {
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let orders_id = cluster.describe(&o).unwrap().id;
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(orders_id, 0), 0);

    let mut first = start(&app);
    produce(&p, 0, "o-1", "pay 5", Some(&clock));
    // Wait until the payment is consumed and committed as held: the
    // group's committed position passes it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = config();
        c.set("group.id", app.application_id());
        let consumer: rdkafka::consumer::BaseConsumer = c.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&p, 0);
        let committed =
            rdkafka::consumer::Consumer::committed_offsets(&consumer, tpl, Duration::from_secs(10))
                .unwrap();
        if committed.elements()[0].offset() == Offset::Offset(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the payment was never committed");
        std::thread::sleep(Duration::from_millis(200));
    }
    first.close(Duration::from_secs(30)).unwrap();
    assert!(
        read(&s, 1, 1, Duration::from_millis(500)).is_empty(),
        "held"
    );

    let mut second = start(&app);
    produce(&o, 0, "o-1", "5", None);
    let out = read(&s, 1, 2, Duration::from_secs(30));
    let values: Vec<&str> = out.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(
        values,
        vec!["order 5", "settled 5"],
        "restored, then released"
    );
    assert_eq!(read(&s, 1, 3, Duration::from_secs(2)).len(), 2, "once");
    second.close(Duration::from_secs(30)).unwrap();
}

/// A plain producer stamps with `CausalClock` across two topics: its cause
/// (in a transaction it keeps open for a while) and then an effect on
/// another topic stamped after the cause's acknowledgement. A stage
/// consuming both sees the effect first, holds it, and delivers the cause
/// first once the transaction commits.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_plain_producer_stamped_with_causal_clock_is_delivered_in_order() {
    use parsley_kafka::CausalClock;
    let (a, b, out) = (unique("causes"), unique("effects"), unique("seen"));
    create_topics(&[(&a, 1), (&b, 1), (&out, 1)]);
    let mut builder = Stage::named("watch");
    let sink = builder.add_sink(&topic(&out));
    let stage = builder
        .on(&topic(&a), move |m| {
            vec![sink.send(m.key().cloned(), m.value().cloned())]
        })
        .on(&topic(&b), move |m| {
            vec![sink.send(m.key().cloned(), m.value().cloned())]
        })
        .build()
        .unwrap();
    let app = Parsley::named(unique("app").as_str(), [stage]).unwrap();
    let mut streams = start(&app);

    // ANCHOR: plain_producer
    let mut clock = CausalClock::new(&config()).unwrap();
    let mut c = config();
    c.set("transactional.id", unique("plain"));
    let causes: rdkafka::producer::BaseProducer<common::Acks> =
        c.create_with_context(common::Acks::default()).unwrap();
    causes.init_transactions(Duration::from_secs(20)).unwrap();
    causes.begin_transaction().unwrap();
    causes
        .send(
            BaseRecord::to(&a)
                .partition(0)
                .key("k")
                .payload("cause")
                .headers(clock.stamp(OwnedHeaders::new()).unwrap()),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    causes.flush(Duration::from_secs(20)).unwrap();
    let (partition, offset) = causes.context().0.lock().unwrap()[0];
    clock.record_produced(&a, partition, offset).unwrap();

    let effects: BaseProducer = config().create().unwrap();
    effects
        .send(
            BaseRecord::to(&b)
                .partition(0)
                .key("k")
                .payload("effect")
                .headers(clock.stamp(OwnedHeaders::new()).unwrap()),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    effects.flush(Duration::from_secs(20)).unwrap();
    // The effect is visible, its cause is not yet: it is held.
    let deadline = Instant::now() + Duration::from_secs(30);
    while streams.explain_holds().is_empty() {
        assert!(Instant::now() < deadline, "the effect was not held");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(read(&out, 1, 1, Duration::from_millis(500)).is_empty());
    causes.commit_transaction(Duration::from_secs(20)).unwrap();
    let values: Vec<String> = read(&out, 1, 2, Duration::from_secs(30))
        .into_iter()
        .map(|(_, v, _)| v)
        .collect();
    assert_eq!(values, vec!["cause", "effect"]);
    // ANCHOR_END: plain_producer
    // Stamping twice is refused.
    let twice = clock.stamp(clock.stamp(OwnedHeaders::new()).unwrap());
    assert!(twice.is_err());
    streams.close(Duration::from_secs(30)).unwrap();
}

/// Whether every broker of the cluster lists the consumer group protocol
/// in its `group.coordinator.rebalance.protocols`, asked here with the
/// admin client (not through the runtime's own check).
fn cluster_serves_the_consumer_protocol() -> bool {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let md = cluster
        .admin()
        .inner()
        .fetch_metadata(None, Duration::from_secs(20))
        .unwrap();
    let brokers: Vec<ResourceSpecifier<'_>> = md
        .brokers()
        .iter()
        .map(|b| ResourceSpecifier::Broker(b.id()))
        .collect();
    assert!(!brokers.is_empty());
    block_on(
        cluster
            .admin()
            .describe_configs(brokers.iter(), &AdminOptions::new()),
    )
    .unwrap()
    .into_iter()
    .all(|r| {
        r.unwrap()
            .get("group.coordinator.rebalance.protocols")
            .and_then(|e| e.value.clone())
            .is_some_and(|v| v.split(',').any(|p| p.trim() == "consumer"))
    })
}

/// Left unset, the group protocol is the consumer one on a cluster that
/// serves it (Kafka 4.0 and later) and the classic one elsewhere, and the
/// instance processes records under it; asked for explicitly on a cluster
/// that does not serve it, the consumer protocol fails the start at once
/// with an error that says so, instead of an instance that never gets an
/// assignment. A cluster whose settings list the consumer protocol while
/// its `group.version` feature is 0 (one upgraded from 3.x) refuses the
/// protocol only at the join: there the choice falls back to the classic
/// protocol, and an explicit consumer protocol fails the instance with the
/// broker's refusal. `PARSLEY_TEST_GROUP_VERSION=0` says the cluster is of
/// that kind. The test command runs this on Kafka 4.4, on the oldest
/// supported broker, and on a 4.4 broker formatted with group.version=0,
/// so every answer is exercised.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn the_group_protocol_is_chosen_by_what_the_cluster_serves() {
    use parsley_kafka::{GroupProtocol, StreamsError, StreamsState};
    let listed = cluster_serves_the_consumer_protocol();
    let refused_at_join = std::env::var("PARSLEY_TEST_GROUP_VERSION").as_deref() == Ok("0");
    eprintln!(
        "the cluster lists the consumer group protocol: {listed}; refuses it at the join: {refused_at_join}"
    );
    let (o, p, s) = (unique("orders"), unique("payments"), unique("settled"));
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let (orders, payments, settled) = (topic(&o), topic(&p), topic(&s));
    let app = ledger(&unique("app"), &orders, &payments, &settled);

    let mut auto = start_with(
        &app,
        StreamsOptions {
            group_protocol: GroupProtocol::Auto,
            ..options("auto")
        },
    );
    let expected = if listed && !refused_at_join {
        GroupProtocol::Consumer
    } else {
        GroupProtocol::Classic
    };
    assert_eq!(auto.group_protocol(), Some(expected));
    produce(&o, 0, "o-1", "12", None);
    let out = read(&s, 1, 1, Duration::from_secs(30));
    assert_eq!(out[0].1, "order 12");
    auto.close(Duration::from_secs(30)).unwrap();

    let mut explicit = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(StreamsOptions {
            group_protocol: GroupProtocol::Consumer,
            ..options("explicit")
        });
    let started = Instant::now();
    let r = explicit.start();
    match (listed, refused_at_join) {
        (true, false) => {
            r.unwrap();
            explicit
                .wait_until_running(Duration::from_secs(30))
                .unwrap();
            assert_eq!(explicit.group_protocol(), Some(GroupProtocol::Consumer));
            explicit.close(Duration::from_secs(30)).unwrap();
        }
        (true, true) => {
            // Nothing in the settings says no: the start goes ahead, and
            // the join's refusal fails the instance (no fallback for a
            // protocol the user named).
            r.unwrap();
            let e = explicit
                .wait_until_running(Duration::from_secs(30))
                .expect_err("the coordinator refuses the consumer protocol");
            assert!(format!("{e}").contains("UnsupportedVersion"), "{e}");
            assert!(started.elapsed() < Duration::from_secs(25));
            let _ = explicit.close(Duration::from_secs(30));
        }
        (false, _) => {
            match r {
                Err(e @ StreamsError::GroupProtocolUnsupported { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("classic"), "{text}");
                    assert!(text.contains("4.0"), "{text}");
                }
                other => panic!("expected the consumer protocol refused, got {other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(20));
            assert_eq!(explicit.state(), StreamsState::Created);
        }
    }
}
