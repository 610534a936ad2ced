//! Broker failures under a running application, on a replicated cluster
//! (three nodes, replication factor 3, `min.insync.replicas` 2): the
//! leader of a sink or a source partition killed, the transaction and the
//! group coordinator killed, a broker frozen past its session, a rolling
//! restart, and two brokers down so that no write can reach its in-sync
//! replicas.
//!
//! The application is the settlement shape: a checkout stage turns each
//! order into a payment, and a ledger stage settles each payment against
//! its order in keyed fold state, so every payment causally follows its
//! order and the ledger must deliver the order first. Three instances run
//! it while a steady stream of orders comes in and the fault strikes. Each
//! test then checks, from the committed outputs, that every order was
//! paid once and settled once, after its order (never rejected), that
//! nothing went to the dead-letter topic, that no task failed, no
//! instance stopped and nothing was logged at ERROR (the test's own
//! clients log through the library's rules too); and it prints the
//! longest pause of the outputs and the longest time from an order to its
//! settlement (`FIGURE ...` lines).
//!
//! Needs a replicated cluster: `PARSLEY_CLUSTER_BOOTSTRAP` (the test
//! command starts one with `scripts/kafka/cluster`), and
//! `PARSLEY_CLUSTER_CONTROL` for a cluster of your own (see
//! `common/cluster.rs`). The tests share the cluster's nodes, so they run
//! one at a time (`--test-threads=1`).

#[path = "common/cluster.rs"]
mod cluster;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster::NodeAction::{Kill, Pause, Restart, Resume, Term};
use futures_executor::block_on;
use parsley::{Codec, Message, Parsley, Stage, Step, Topic};
use parsley_kafka::{
    CausalStreams, ClientLogs, GroupProtocol, KafkaCluster, ProductionResponse, StreamsOptions,
    StreamsState,
};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Partitions of each topic: one task per instance and stage.
const PARTITIONS: i32 = 3;
/// Instances of the ledger application (the checkout application runs
/// on two).
const INSTANCES: usize = 3;
/// Orders per second.
const RATE: u64 = 100;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cf-{prefix}-{nanos}")
}

// ---------------------------------------------------------------------
// What the process logs: every WARN and ERROR event, counted and printed.

#[derive(Default)]
struct LogCounts {
    errors: Vec<String>,
    warnings: Vec<String>,
}

fn logs() -> &'static Mutex<LogCounts> {
    static LOGS: OnceLock<Mutex<LogCounts>> = OnceLock::new();
    LOGS.get_or_init(|| {
        tracing_subscriber::registry()
            .with(Count)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_thread_names(true)
                    .with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_default(tracing::Level::WARN)
                            .with_target("parsley_kafka", tracing::Level::INFO)
                            .with_target("parsley", tracing::Level::INFO),
                    ),
            )
            .init();
        Mutex::new(LogCounts::default())
    })
}

struct Count;

impl<S: tracing::Subscriber> Layer<S> for Count {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let level = *event.metadata().level();
        if level > tracing::Level::WARN {
            return;
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        let mut counts = logs().lock().unwrap_or_else(|e| e.into_inner());
        if level == tracing::Level::ERROR {
            counts
                .errors
                .push(format!("{}: {}", event.metadata().target(), text.0));
        } else {
            counts
                .warnings
                .push(format!("{}: {}", event.metadata().target(), text.0));
        }
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

// ---------------------------------------------------------------------
// The application and its inputs and outputs.

struct Topics {
    orders: String,
    payments: String,
    settled: String,
    dead_letters: String,
}

impl Topics {
    fn new() -> Topics {
        Topics {
            orders: unique("orders"),
            payments: unique("payments"),
            settled: unique("settled"),
            dead_letters: unique("dlq"),
        }
    }

    fn names(&self) -> [&str; 4] {
        [
            &self.orders,
            &self.payments,
            &self.settled,
            &self.dead_letters,
        ]
    }

    /// Creates them with the cluster's replication factor.
    fn create(&self) {
        let admin = KafkaCluster::new(&cluster::config(), Duration::from_secs(30)).unwrap();
        let topics: Vec<NewTopic<'_>> = self
            .names()
            .iter()
            .map(|n| {
                let partitions = if *n == self.dead_letters {
                    1
                } else {
                    PARTITIONS
                };
                let topic = NewTopic::new(n, partitions, TopicReplication::Fixed(-1));
                // Orders and settlements carry the time the broker appended
                // them: an order's time to its settlement is then the
                // application's alone, not the test producer's (whose own
                // writes wait out a fault too) nor the test reader's.
                if *n == self.orders || *n == self.settled {
                    topic.set("message.timestamp.type", "LogAppendTime")
                } else {
                    topic
                }
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in block_on(admin.admin().create_topics(&topics, &opts)).unwrap() {
            r.unwrap();
        }
        cluster::await_in_sync(&self.names(), Duration::from_secs(30));
        cluster::await_known_everywhere(&self.names(), Duration::from_secs(30));
    }
}

/// Two applications (a topic feeds one stage per application): checkout
/// pays each order; the ledger records each order in its fold state and
/// settles each payment against it.
fn settlement(app_id: &str, t: &Topics) -> (Parsley, Parsley) {
    let (orders, payments, settled) = (topic(&t.orders), topic(&t.payments), topic(&t.settled));
    let mut checkout = Stage::named("checkout");
    let pay = checkout.add_sink(&payments);
    let checkout = checkout
        .on(&orders, move |m: &Message<String, String>| {
            vec![pay.send(
                m.key().cloned(),
                format!("pay {}", m.value().map_or("", |v| v)),
            )]
        })
        .build()
        .unwrap();
    let mut ledger = Stage::named("ledger").state(Codec::utf8(), String::new);
    let (out1, out2) = (ledger.add_sink(&settled), ledger.add_sink(&settled));
    let ledger = ledger
        .fold(&orders, move |_: String, m: &Message<String, String>| {
            let order = m.value().cloned().unwrap_or_default();
            Step::to(order.clone()).emit(out1.send(m.key().cloned(), format!("order {order}")))
        })
        .fold(
            &payments,
            move |order: String, m: &Message<String, String>| {
                let verdict = if order.is_empty() {
                    "rejected"
                } else {
                    "settled"
                };
                Step::to(order.clone())
                    .emit(out2.send(m.key().cloned(), format!("{verdict} {order}")))
            },
        )
        .build()
        .unwrap();
    (
        Parsley::named(format!("{app_id}-checkout"), [checkout]).unwrap(),
        Parsley::named(app_id, [ledger]).unwrap(),
    )
}

/// Produces orders `k00000`, `k00001`, ... at [`RATE`] per second until
/// `stop` is set, keyed and partitioned as the stages partition (murmur2),
/// through an idempotent producer that keeps retrying through the fault.
/// Returns when each was handed to the producer.
fn feed(orders: String, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Instant>> {
    std::thread::spawn(move || {
        let mut c = cluster::config();
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "300000")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5");
        let producer: BaseProducer<ClientLogs> = c.create_with_context(ClientLogs).unwrap();
        let began = Instant::now();
        let mut sent = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let i = sent.len();
            let due = began + Duration::from_millis(i as u64 * 1000 / RATE);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let (key, value) = (format!("k{i:05}"), format!("{i}"));
            let mut record = BaseRecord::to(&orders).key(&key).payload(&value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        producer.poll(Duration::from_millis(10));
                        record = back;
                    }
                }
            }
            sent.push(Instant::now());
            producer.poll(Duration::ZERO);
        }
        producer
            .flush(Duration::from_secs(300))
            .expect("every order produced");
        sent
    })
}

/// One committed record as the reader saw it.
struct Out {
    key: String,
    value: String,
    /// When the reader received it, in milliseconds since the epoch (to
    /// compare with a log append time).
    at_ms: i64,
    /// The record's timestamp (the broker's append time on the orders
    /// and settled topics).
    timestamp: i64,
    /// Its partition.
    partition: i32,
}

/// Every committed record of `topic`, read from the beginning until the
/// reader has been idle for a few seconds.
fn read_all(topic: &str, partitions: i32) -> Vec<Out> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let reader = read(topic.to_owned(), partitions, stop.clone(), count.clone());
    let mut last = (usize::MAX, Instant::now());
    while last.1.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        let now = count.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("the reader")
}

/// Reads `topic` from the beginning, `read_committed`, until `stop`,
/// counting what it read in `count`.
fn read(
    topic: String,
    partitions: i32,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> JoinHandle<Vec<Out>> {
    std::thread::spawn(move || {
        let mut c = cluster::config();
        c.set("isolation.level", "read_committed")
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false");
        let consumer: BaseConsumer<ClientLogs> = c.create_with_context(ClientLogs).unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let mut out = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
                out.push(Out {
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    at_ms: now_ms(),
                    timestamp: m.timestamp().to_millis().unwrap_or(0),
                    partition: m.partition(),
                });
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
        out
    })
}

// ---------------------------------------------------------------------
// A run: the application under load, a fault, and the checks.

/// What a fault needs to know to aim.
struct Target<'a> {
    app_id: &'a str,
    topics: &'a Topics,
}

impl Target<'_> {
    /// The transactional id of ledger instance `i`'s stream thread.
    fn transactional_id(&self, i: usize) -> String {
        format!("{}-i{i}-0", self.app_id)
    }
}

/// Restarts or resumes, when dropped, every node a fault left down, so one
/// failed test does not leave the next with a broken cluster.
struct Heal;

impl Drop for Heal {
    fn drop(&mut self) {
        let status = cluster::ask(&["status"]);
        for line in status.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [id, _, state, ..] = words.as_slice()
                && let Ok(id) = id.parse::<i32>()
            {
                let healed = match *state {
                    "paused" => cluster::try_node(Resume, id),
                    "down" => cluster::try_node(Restart, id),
                    _ => Ok(()),
                };
                if let Err(e) = healed {
                    eprintln!("could not heal node {id}: {e}");
                }
            }
        }
    }
}

/// The instances of a run, closed when dropped if the run did not get
/// to close them itself (a failed check), so they do not run on into the
/// next test.
struct Instances(Vec<CausalStreams>);

impl Drop for Instances {
    fn drop(&mut self) {
        for s in &mut self.0 {
            let _ = s.close(Duration::from_secs(20));
        }
    }
}

/// Runs the settlement application on three instances under a stream of
/// orders; once it runs, calls `fault`, and once that returns (the
/// cluster healthy again), lets the stream go on a little, drains it and
/// checks the outputs, and prints the longest pause of the outputs from
/// the fault's start and the longest time from an order's production to
/// its settlement. `expect_stall`: the fault must stop the outputs for
/// at least this long (it denies the writes their replicas).
fn run(name: &str, expect_stall: Option<Duration>, fault: impl FnOnce(&Target<'_>)) {
    let _ = logs();
    let errors_before = logs().lock().unwrap().errors.len();
    let _heal = Heal;
    let topics = Topics::new();
    topics.create();
    let app_id = unique("app");
    let (checkout, ledger) = settlement(&app_id, &topics);
    let state = std::env::temp_dir().join(unique("state"));
    let apps = (0..INSTANCES)
        .map(|i| (&ledger, format!("i{i}")))
        .chain((0..2).map(|i| (&checkout, format!("c{i}"))));
    let mut instances = Instances(
        apps.map(|(app, instance)| {
            let mut s = CausalStreams::new(app, cluster::config())
                .unwrap()
                .with_options(StreamsOptions {
                    state_dir: Some(state.join(&instance)),
                    instance_id: Some(instance),
                    ..StreamsOptions::default()
                });
            let dlq = topics.dead_letters.clone();
            s.set_production_error_handler(move |_| ProductionResponse::DeadLetter(dlq.clone()));
            s.start().unwrap();
            s
        })
        .collect(),
    );
    for s in &instances.0 {
        s.wait_until_running(Duration::from_secs(90))
            .expect("every instance runs");
    }
    let (stop_feed, stop_read) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let feeder = feed(topics.orders.clone(), stop_feed.clone());
    let progress = Arc::new(AtomicUsize::new(0));
    let settled = read(
        topics.settled.clone(),
        PARTITIONS,
        stop_read.clone(),
        progress.clone(),
    );
    // Warm up: outputs flowing before the fault.
    std::thread::sleep(Duration::from_secs(5));
    let target = Target {
        app_id: &app_id,
        topics: &topics,
    };
    let fault_began = Instant::now();
    eprintln!(
        "[{name}] fault begins at order {}",
        progress.load(Ordering::SeqCst) / 2
    );
    fault(&target);
    let fault_ended = Instant::now();
    eprintln!(
        "[{name}] fault over after {:?}; the stream goes on",
        fault_ended - fault_began
    );
    std::thread::sleep(Duration::from_secs(8));
    stop_feed.store(true, Ordering::SeqCst);
    let sent = feeder.join().expect("the feeder");
    let n = sent.len();
    // Drain: two outputs per order.
    let deadline = Instant::now() + Duration::from_secs(180);
    let counted = Arc::new(AtomicUsize::new(0));
    let dlq = read(
        topics.dead_letters.clone(),
        1,
        stop_read.clone(),
        counted.clone(),
    );
    let payments = read(
        topics.payments.clone(),
        PARTITIONS,
        stop_read.clone(),
        counted,
    );
    let mut said = Instant::now();
    while progress.load(Ordering::SeqCst) < 2 * n && Instant::now() < deadline {
        if said.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "[{name}] draining: {} of {} outputs",
                progress.load(Ordering::SeqCst),
                2 * n
            );
            said = Instant::now();
        }
        let failed: Vec<String> = instances
            .0
            .iter()
            .filter_map(|s| match s.state() {
                StreamsState::Failed(m) => Some(m),
                _ => None,
            })
            .collect();
        assert!(failed.is_empty(), "[{name}] instances failed: {failed:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Anything past the expected count (a duplicate) lands meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    let states: Vec<StreamsState> = instances.0.iter().map(CausalStreams::state).collect();
    let counters: Vec<(u64, u64, u64, u64)> = instances
        .0
        .iter()
        .map(|s| {
            (
                s.dead_lettered(),
                s.restarted_tasks(),
                s.replaced_threads(),
                s.rejoins(),
            )
        })
        .collect();
    for mut s in std::mem::take(&mut instances.0) {
        s.close(Duration::from_secs(60)).expect("a clean close");
    }
    stop_read.store(true, Ordering::SeqCst);
    let outs = settled.join().unwrap();
    let dead = dlq.join().unwrap();
    let paid = payments.join().unwrap();
    let _ = std::fs::remove_dir_all(&state);

    // What went in: every order as the log holds it (the test producer
    // is idempotent, but an epoch bump while a broker restarts can write
    // an order twice; each copy is an input of its own).
    let orders = read_all(&topics.orders, PARTITIONS);
    let mut inputs: BTreeMap<&str, (usize, &str, i64)> = BTreeMap::new();
    for o in &orders {
        let e = inputs.entry(&o.key).or_insert((0, &o.value, o.timestamp));
        e.0 += 1;
    }
    let twice = inputs.values().filter(|(count, _, _)| *count > 1).count();

    // Exactly once, in causal order, with exact per-key state: per key,
    // one "order v" and one "settled v" for each copy of the order, no
    // settlement before its order (never "rejected"), one payment each.
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for o in &outs {
        by_key.entry(&o.key).or_default().push(&o.value);
    }
    let mut wrong = Vec::new();
    for (key, (count, value, _)) in &inputs {
        let got = by_key.remove(key).unwrap_or_default();
        let (order, settled) = (format!("order {value}"), format!("settled {value}"));
        let mut placed = 0usize;
        let mut ok = got.len() == 2 * count;
        for g in &got {
            if *g == order {
                placed += 1;
            } else if *g == settled && placed > 0 {
                placed -= 1;
            } else {
                ok = false;
            }
        }
        if !ok || placed != 0 {
            wrong.push(format!("{key} (ordered {count} time(s)): {got:?}"));
        }
    }
    let extra: Vec<&&str> = by_key.keys().collect();
    let mut pays: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &paid {
        *pays.entry(&p.key).or_default() += 1;
    }
    let unpaid_or_twice = inputs
        .iter()
        .filter(|(key, (count, _, _))| pays.get(*key) != Some(count))
        .count();
    let missing_inputs = (0..n)
        .filter(|i| !inputs.contains_key(format!("k{i:05}").as_str()))
        .count();

    // The figures, from the broker's append times: the longest time a
    // settled partition went without a new settlement from the fault's
    // start (the longest pause of processing, partition by partition), and
    // the longest time from an order's append to its settlement's.
    let fault_ms = now_ms() - i64::try_from(fault_began.elapsed().as_millis()).unwrap_or(0);
    let mut appends: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for o in &outs {
        appends.entry(o.partition).or_default().push(o.timestamp);
    }
    let pause_ms = appends
        .values_mut()
        .filter_map(|at| {
            at.sort_unstable();
            at.windows(2)
                .filter(|w| w[1] >= fault_ms)
                .map(|w| w[1] - w[0].max(fault_ms))
                .max()
        })
        .max()
        .unwrap_or(0);
    let pause = Duration::from_millis(u64::try_from(pause_ms).unwrap_or(0));
    let mut latencies: Vec<(i64, &str)> = outs
        .iter()
        .filter(|o| o.value.starts_with("settled "))
        .filter_map(|o| {
            let appended = inputs.get(o.key.as_str())?.2;
            Some((o.timestamp - appended, o.key.as_str()))
        })
        .collect();
    latencies.sort_unstable();
    let latency = latencies.last().map_or(0, |l| l.0);
    let p99 = latencies.get(latencies.len() * 99 / 100).map_or(0, |l| l.0);
    let slowest = latencies.last().map_or("", |l| l.1);
    // How long the test's own reader took to see settlements (not the
    // application's time; reported to tell the two apart).
    let reader_lag = outs
        .iter()
        .map(|o| o.at_ms - o.timestamp)
        .max()
        .unwrap_or(0);
    let errors: Vec<String> = logs().lock().unwrap().errors[errors_before..].to_vec();
    eprintln!(
        "FIGURE fault={name:?} orders={n} (written twice by the test producer: {twice}) outputs={} longest_pause_ms={} longest_order_to_settlement_ms={latency} (key {slowest}; p99 {p99} ms; the test reader lagged up to {reader_lag} ms) rejoins={:?} errors={}",
        outs.len(),
        pause.as_millis(),
        counters.iter().map(|c| c.3).collect::<Vec<_>>(),
        errors.len(),
    );

    assert!(
        wrong.is_empty(),
        "[{name}] {} of {n} orders not settled exactly once after their order, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(
        extra.is_empty(),
        "[{name}] outputs for unknown keys: {extra:?}"
    );
    assert_eq!(
        missing_inputs, 0,
        "[{name}] every order produced is in its topic"
    );
    assert_eq!(unpaid_or_twice, 0, "[{name}] every order paid exactly once");
    assert!(
        dead.is_empty(),
        "[{name}] {} records went to the dead-letter topic",
        dead.len()
    );
    for (i, (dead_lettered, restarted, replaced, _)) in counters.iter().enumerate() {
        assert_eq!(
            (*dead_lettered, *restarted, *replaced),
            (0, 0, 0),
            "[{name}] instance {i}: nothing dead-lettered, no task restarted, no thread replaced"
        );
    }
    for (i, s) in states.iter().enumerate() {
        assert!(
            matches!(s, StreamsState::Running | StreamsState::Rebalancing),
            "[{name}] instance {i} is {s:?}"
        );
    }
    assert!(errors.is_empty(), "[{name}] ERROR lines: {errors:#?}");
    if let Some(stall) = expect_stall {
        assert!(
            pause >= stall,
            "[{name}] the fault should have stopped the outputs for {stall:?} at least; the longest pause was {pause:?}"
        );
    }
}

/// Kills `node`, waits `down`, restarts it and waits until the topics'
/// replicas are in sync again.
fn bounce(t: &Target<'_>, action: cluster::NodeAction, node: i32, down: Duration) {
    eprintln!("node {node}: {action:?}");
    cluster::node(action, node);
    std::thread::sleep(down);
    let back = if action == Pause { Resume } else { Restart };
    cluster::node(back, node);
    eprintln!("node {node}: {back:?}");
    settle(t);
}

/// Waits until every replica is back in sync, then moves leaderships back
/// to their preferred replicas (as the brokers do by themselves every few
/// minutes), within the fault.
fn settle(t: &Target<'_>) {
    cluster::await_in_sync(&t.topics.names(), Duration::from_secs(180));
    eprintln!(
        "leaders moved back: {}",
        cluster::ask(&["elect-preferred"]).is_empty()
    );
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn the_control_script_and_the_metadata_agree_on_leaders_and_coordinators() {
    let topics = Topics::new();
    topics.create();
    for p in 0..PARTITIONS {
        let by_metadata = cluster::leader(&topics.orders, p);
        let by_script = cluster::ask(&["leader", &topics.orders, &p.to_string()]);
        assert_eq!(
            by_script,
            by_metadata.to_string(),
            "leader of partition {p}"
        );
    }
    // A transactional id and a group in use, so the tools describe them.
    let txn_id = unique("txn");
    let mut c = cluster::config();
    c.set("transactional.id", &txn_id);
    let producer: BaseProducer = c.create().unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    assert_eq!(
        cluster::ask(&["txn-coordinator", &txn_id]),
        cluster::txn_coordinator(&txn_id).to_string()
    );
    let group = unique("group");
    let mut c = cluster::config();
    c.set("group.id", &group);
    let consumer: BaseConsumer = c.create().unwrap();
    consumer.subscribe(&[&topics.orders]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.assignment().map_or(0, |a| a.count()) == 0 {
        assert!(Instant::now() < deadline, "the group formed");
        consumer.poll(Duration::from_millis(100));
    }
    assert_eq!(
        cluster::ask(&["group-coordinator", &group]),
        cluster::group_coordinator(&group).to_string()
    );
    assert_eq!(cluster::nodes().len(), 3, "three nodes");
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn the_leader_of_a_sink_partition_killed_and_restarted() {
    run("sink partition leader killed", None, |t| {
        let node = cluster::leader(&t.topics.settled, 0);
        cluster::node(Kill, node);
        let killed = Instant::now();
        // The controller moves the leadership once the killed broker's
        // session runs out.
        while cluster::leader(&t.topics.settled, 0) == node {
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "the leadership never moved"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("leadership moved after {:?}", killed.elapsed());
        std::thread::sleep(Duration::from_secs(5));
        cluster::node(Restart, node);
        settle(t);
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn the_leader_of_a_source_partition_killed() {
    run("source partition leader killed", None, |t| {
        let node = cluster::leader(&t.topics.orders, 0);
        bounce(t, Kill, node, Duration::from_secs(10));
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn the_transaction_coordinator_killed() {
    run("transaction coordinator killed", None, |t| {
        let node = cluster::txn_coordinator(&t.transactional_id(0));
        bounce(t, Kill, node, Duration::from_secs(10));
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn the_group_coordinator_killed() {
    run("group coordinator killed", None, |t| {
        let node = cluster::group_coordinator(t.app_id);
        bounce(t, Kill, node, Duration::from_secs(10));
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn a_broker_frozen_past_its_session() {
    run("broker paused 15 s", None, |t| {
        let node = cluster::leader(&t.topics.payments, 0);
        bounce(t, Pause, node, Duration::from_secs(15));
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn a_rolling_restart_of_every_broker() {
    run("rolling restart", None, |t| {
        for node in cluster::nodes() {
            bounce(t, Term, node, Duration::from_secs(1));
            std::thread::sleep(Duration::from_secs(3));
        }
    });
}

#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn two_brokers_down_so_no_write_reaches_its_replicas() {
    run(
        "two brokers down 15 s",
        Some(Duration::from_secs(10)),
        |t| {
            let nodes = cluster::nodes();
            let (a, b) = (nodes[0], nodes[1]);
            eprintln!("nodes {a} and {b}: Kill");
            cluster::node(Kill, a);
            cluster::node(Kill, b);
            std::thread::sleep(Duration::from_secs(15));
            cluster::node(Restart, a);
            cluster::node(Restart, b);
            eprintln!("nodes {a} and {b}: Restart");
            settle(t);
        },
    );
}

/// The topics the runtime creates take the replication factor asked
/// (`StreamsOptions::replication_factor`), and an existing changelog
/// replicated less than asked is warned about at start, naming it.
#[test]
#[ignore = "needs a replicated cluster: set PARSLEY_CLUSTER_BOOTSTRAP"]
fn internal_topics_take_the_replication_factor_asked() {
    let _ = logs();
    let warnings_before = logs().lock().unwrap().warnings.len();
    let (input, output) = (unique("in"), unique("out"));
    let app_id = unique("rf");
    let mut stage = Stage::named("count").state(Codec::utf8(), String::new);
    let out = stage.add_sink(&topic(&output));
    let stage = stage
        .fold(
            &topic(&input),
            move |_: String, m: &Message<String, String>| {
                let v = m.value().cloned().unwrap_or_default();
                Step::to(v.clone()).emit(out.send(m.key().cloned(), v))
            },
        )
        .build()
        .unwrap();
    let app = Parsley::named(app_id.as_str(), [stage]).unwrap();
    let names = app.owned_names("count").unwrap().clone();
    let admin = KafkaCluster::new(&cluster::config(), Duration::from_secs(30)).unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    // The state changelog exists already, with one replica.
    let topics = [
        NewTopic::new(&input, 1, TopicReplication::Fixed(3)),
        NewTopic::new(&output, 1, TopicReplication::Fixed(3)),
        NewTopic::new(&names.state_changelog, 1, TopicReplication::Fixed(1))
            .set("cleanup.policy", "compact"),
    ];
    for r in block_on(admin.admin().create_topics(&topics, &opts)).unwrap() {
        r.unwrap();
    }
    let all = [
        input.as_str(),
        output.as_str(),
        names.state_changelog.as_str(),
    ];
    cluster::await_known_everywhere(&all, Duration::from_secs(30));
    let state = std::env::temp_dir().join(unique("rf-state"));
    let mut streams = CausalStreams::new(&app, cluster::config())
        .unwrap()
        .with_options(StreamsOptions {
            replication_factor: Some(3),
            state_dir: Some(state.clone()),
            ..StreamsOptions::default()
        });
    streams.start().unwrap();
    streams.wait_until_running(Duration::from_secs(60)).unwrap();
    // The protocol left to the cluster: every broker was asked (one
    // request each), and a 4.x cluster serves the consumer protocol.
    assert_eq!(
        streams.group_protocol(),
        Some(GroupProtocol::Consumer),
        "the cluster under test is expected to be Kafka 4.0 or later"
    );
    streams.close(Duration::from_secs(30)).unwrap();
    let _ = std::fs::remove_dir_all(&state);
    let unasked: Vec<String> = logs().lock().unwrap().warnings[warnings_before..]
        .iter()
        .filter(|w| w.contains("chosen without the brokers' answer"))
        .cloned()
        .collect();
    assert!(unasked.is_empty(), "{unasked:?}");
    let fold = names.fold_changelog.clone().expect("a stateful stage");
    assert_eq!(
        admin.replication_factor(&fold).unwrap(),
        3,
        "created with 3"
    );
    assert_eq!(
        admin
            .replication_factor(&format!("{app_id}-control"))
            .unwrap(),
        3
    );
    let warned: Vec<String> = logs().lock().unwrap().warnings[warnings_before..]
        .iter()
        .filter(|w| w.contains(&names.state_changelog) && w.contains("fewer than the 3 asked"))
        .cloned()
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
}
