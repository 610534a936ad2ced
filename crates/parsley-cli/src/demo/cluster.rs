//! `parsley demo --bootstrap B`: the demo on a live cluster, through the
//! exactly-once runtime.
//!
//! The broker-less demo replays one drawn arrival schedule through both
//! ledgers. On a cluster nothing can replay a schedule: the stamps name the
//! cluster's own topic ids and offsets, and a record reaches a consumer when
//! the consumer's fetches bring it. So the cluster run sets up the situation
//! in which payments overtake their orders for real, and measures what each
//! ledger's logic received:
//!
//! 1. The order service writes the orders one record per produce request
//!    (one batch each), as a service that writes each order when it is
//!    placed does.
//! 2. The checkout application (the real runtime) pays every order: its
//!    payments land in transactions, many to a batch.
//! 3. The ledger starts after both, catching up on the backlog (a ledger
//!    redeployed or down for a while is in this position), with small
//!    fetches per partition. A fetch brings one small batch of orders but a
//!    whole batch of payments per partition, so its consumer receives most
//!    payments well before their orders.
//!
//! The ledger then runs twice over the same topics: through Parsley's
//! runtime (the gated run), and as a plain `read_committed` consumer that
//! hands each record to the same settlement logic in the order its fetches
//! deliver them (the plain run). The same independent [`checker`] judges
//! both from the delivery order alone.
//!
//! Every topic, changelog and consumer group the run makes carries a
//! per-run prefix (`parsley-demo-<millis>-<nonce>-`) and is deleted at the
//! end, unless asked to keep them.
//!
//! [`checker`]: super::checker

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley::partition::partition_for_key;
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::field::{Field, Visit};
use tracing::{Event as TraceEvent, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::checker::{self, Event};
use super::pipeline::{self, Observer, Topics};
use super::{DemoConfig, DemoError, DemoReport, PARTITIONS, RunReport, Setting, order_id};

/// The ledger consumers' `max.partition.fetch.bytes`: small fetches per
/// partition, so one fetch brings a batch or a few of each partition.
pub const FETCH_BYTES: &str = "1024";

/// What to run, and where.
#[derive(Clone, Debug)]
pub struct ClusterDemo {
    /// The cluster.
    pub cluster: crate::connect::Connection,
    /// Orders and seed (the seed draws the amounts; arrival order is the
    /// cluster's).
    pub config: DemoConfig,
    /// Keep the run's topics and consumer groups instead of deleting them.
    pub keep_topics: bool,
}

impl ClusterDemo {
    /// The topic and group name prefix of a run that started at `millis`
    /// and drew `nonce` (two runs starting in the same millisecond must not
    /// share topics).
    pub fn prefix(millis: u128, nonce: u32) -> String {
        format!("parsley-demo-{millis}-{nonce:08x}-")
    }

    fn phase_timeout(&self) -> Duration {
        Duration::from_secs(60) + Duration::from_millis(5 * u64::from(self.config.orders))
    }
}

/// Counts the records the runtime held and how long each waited, from the
/// runtime's per-record DEBUG events (`record held`, then `delivering to
/// logic` with `was_held`). Install it as (part of) the global tracing
/// subscriber before [`run`]: stream threads log from their own threads.
#[derive(Clone, Debug, Default)]
pub struct HoldWatch {
    inner: Arc<Mutex<Watched>>,
}

#[derive(Debug, Default)]
struct Watched {
    since: BTreeMap<String, Instant>,
    ever: BTreeSet<String>,
    longest: Duration,
}

impl HoldWatch {
    fn with<T>(&self, f: impl FnOnce(&mut Watched) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Forgets everything seen so far.
    pub fn reset(&self) {
        self.with(|w| *w = Watched::default());
    }

    /// Distinct records held since the last reset.
    pub fn held(&self) -> usize {
        self.with(|w| w.ever.len())
    }

    /// The longest a released record waited since the last reset.
    pub fn longest(&self) -> Duration {
        self.with(|w| w.longest)
    }

    fn saw(&self, message: &str, coordinate: String, was_held: bool) {
        self.with(|w| match message {
            "record held" => {
                w.since
                    .entry(coordinate.clone())
                    .or_insert_with(Instant::now);
                w.ever.insert(coordinate);
            }
            "delivering to logic" if was_held => {
                if let Some(at) = w.since.remove(&coordinate) {
                    w.longest = w.longest.max(at.elapsed());
                }
            }
            _ => {}
        });
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    coordinate: Option<String>,
    was_held: bool,
}

impl Visit for Fields {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "was_held" {
            self.was_held = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "coordinate" => self.coordinate = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl<S: Subscriber> Layer<S> for HoldWatch {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target().starts_with("parsley::runtime::task")
    }

    fn on_event(&self, event: &TraceEvent<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let (Some(message), Some(coordinate)) = (fields.message, fields.coordinate) {
            self.saw(&message, coordinate, fields.was_held);
        }
    }
}

/// Delivery failures of the order service's producer.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// Runs the demo on the cluster. `progress` is told what each phase does.
pub fn run(
    demo: &ClusterDemo,
    watch: &HoldWatch,
    progress: &dyn Fn(&str),
) -> Result<DemoReport, DemoError> {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let prefix = ClusterDemo::prefix(millis, rand::random());
    let base = demo.cluster.client_config();
    let cluster = KafkaCluster::new(&base, Duration::from_secs(30))
        .map_err(|e| format!("cannot reach {}: {e}", demo.cluster.bootstrap))?;
    let topics = Topics::prefixed(&prefix);
    // Nothing is deleted unless this run created its topics: a prefix that
    // somehow exists already belongs to someone else.
    create_topics(&cluster, &topics)?;
    let result = run_on(demo, &base, &topics, &prefix, watch, progress);
    if !demo.keep_topics {
        progress("deleting the run's topics and consumer groups");
        // Best effort: a failure to clean up does not change the result.
        let _ = clean_up(&cluster, &base, &prefix);
    }
    result
}

fn create_topics(cluster: &KafkaCluster, topics: &Topics) -> Result<(), DemoError> {
    let names = [
        topics.orders.name(),
        topics.payments.name(),
        topics.settlements.name(),
    ];
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, PARTITIONS, TopicReplication::Fixed(-1)))
        .collect();
    let created = futures_executor::block_on(cluster.admin().create_topics(
        &new,
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in created {
        r.map_err(|(t, e)| format!("cannot create topic {t}: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in names {
        while cluster.describe(n).is_err() {
            if Instant::now() > deadline {
                return Err(format!("topic {n} did not appear within 30 s").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn clean_up(cluster: &KafkaCluster, base: &ClientConfig, prefix: &str) -> Result<(), DemoError> {
    let consumer: BaseConsumer = base.create()?;
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(20))?;
    let topics: Vec<&str> = metadata
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| n.starts_with(prefix))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    futures_executor::block_on(cluster.admin().delete_topics(&topics, &options))?;
    let groups: Vec<String> = ["checkout", "ledger", "plain-ledger"]
        .iter()
        .map(|g| format!("{prefix}{g}"))
        .collect();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    futures_executor::block_on(cluster.admin().delete_groups(&groups, &options))?;
    Ok(())
}

fn run_on(
    demo: &ClusterDemo,
    base: &ClientConfig,
    topics: &Topics,
    prefix: &str,
    watch: &HoldWatch,
    progress: &dyn Fn(&str),
) -> Result<DemoReport, DemoError> {
    let orders = demo.config.orders;
    let timeout = demo.phase_timeout();
    progress(&format!(
        "writing {orders} orders to {}",
        topics.orders.name()
    ));
    write_orders(base, topics, demo.config, timeout)?;

    progress(&format!(
        "running the checkout application until it has paid every order into {}",
        topics.payments.name()
    ));
    run_checkout(base, topics, prefix, orders, timeout)?;
    let payments = read_all(base, &[topics.payments.name()], orders as usize, timeout)?;
    if payments.len() != orders as usize {
        return Err(format!(
            "{} holds {} committed payments; expected {orders}",
            topics.payments.name(),
            payments.len()
        )
        .into());
    }

    let mut ledger = base.clone();
    ledger.set("max.partition.fetch.bytes", FETCH_BYTES);

    progress("running the ledger through Parsley's runtime over the backlog");
    let gated = run_gated(&ledger, topics, prefix, orders, watch, timeout)?;

    progress("running the ledger as a plain consumer over the same topics");
    let plain = run_plain(&ledger, topics, prefix, orders, timeout)?;

    Ok(DemoReport {
        config: demo.config,
        setting: Setting::Cluster {
            bootstrap: demo.cluster.bootstrap.clone(),
        },
        overtaken: plain.verdict.violations,
        gated,
        plain,
    })
}

/// Writes the orders, one record per produce request, each to the
/// partition its key hashes to (as the runtime partitions the payments).
fn write_orders(
    base: &ClientConfig,
    topics: &Topics,
    config: DemoConfig,
    timeout: Duration,
) -> Result<(), DemoError> {
    let producer: BaseProducer<Deliveries> = base
        .clone()
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .create_with_context(Deliveries::default())?;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    for n in 0..config.orders {
        let amount = rng.random_range(100..=50_000i64);
        let key = order_id(n);
        let value = topics.orders.value_codec().encode(&amount)?;
        let partition = partition_for_key(key.as_bytes(), PARTITIONS);
        let mut record = BaseRecord::to(topics.orders.name())
            .partition(partition)
            .key(&key)
            .payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(format!("cannot write order {n}: {e}").into()),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(timeout)?;
    if let Some(e) = producer
        .context()
        .failed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        return Err(format!("an order was not written: {e}").into());
    }
    Ok(())
}

fn options() -> StreamsOptions {
    StreamsOptions {
        commit_interval: Duration::from_millis(100),
        instance_id: Some("demo".to_owned()),
        ..StreamsOptions::default()
    }
}

/// Runs `streams` until `done` says so, then closes it (committing its
/// last transaction).
fn run_until(
    mut streams: CausalStreams,
    timeout: Duration,
    what: &str,
    done: &dyn Fn(&CausalStreams) -> bool,
) -> Result<(), DemoError> {
    streams.start()?;
    let deadline = Instant::now() + timeout;
    let outcome = loop {
        if done(&streams) {
            break Ok(());
        }
        if let parsley_kafka::StreamsState::Failed(m) = streams.state() {
            break Err(format!("{what} failed: {m}"));
        }
        if Instant::now() > deadline {
            break Err(format!("{what} did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let closed = streams.close(Duration::from_secs(30));
    outcome?;
    closed?;
    Ok(())
}

fn run_checkout(
    base: &ClientConfig,
    topics: &Topics,
    prefix: &str,
    orders: u32,
    timeout: Duration,
) -> Result<(), DemoError> {
    let app = pipeline::checkout_on(topics, &format!("{prefix}checkout"))?;
    let streams = CausalStreams::new(&app, base.clone())?.with_options(options());
    run_until(streams, timeout, "the checkout application", &|s| {
        s.metrics()
            .iter()
            .map(|m| m.records_delivered_total)
            .sum::<u64>()
            >= u64::from(orders)
    })
}

/// The record a ledger delivery was: its key names the order, its topic
/// whether it is the order or the payment.
fn event(key: Option<&str>, is_order: bool) -> Option<Event> {
    let n = key?.strip_prefix("order-")?.parse().ok()?;
    Some(if is_order {
        Event::Order(n)
    } else {
        Event::Payment(n)
    })
}

fn run_gated(
    config: &ClientConfig,
    topics: &Topics,
    prefix: &str,
    orders: u32,
    watch: &HoldWatch,
    timeout: Duration,
) -> Result<RunReport, DemoError> {
    let received: Arc<Mutex<Vec<Event>>> = Arc::default();
    let observer: Observer = {
        let received = received.clone();
        Arc::new(move |key, is_order| {
            if let Some(e) = event(key, is_order) {
                received
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e);
            }
        })
    };
    let app = pipeline::ledger_on(topics, &format!("{prefix}ledger"), observer)?;
    let streams = CausalStreams::new(&app, config.clone())?.with_options(options());
    watch.reset();
    let everything = 2 * orders as usize;
    let distinct = |r: &[Event]| r.iter().collect::<BTreeSet<_>>().len();
    run_until(streams, timeout, "the ledger application", &|_| {
        distinct(&received.lock().unwrap_or_else(PoisonError::into_inner)) >= everything
    })?;
    let received = received
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let settlements = read_all(
        config,
        &[topics.settlements.name()],
        orders as usize,
        timeout,
    )?;
    let rejected = settlements
        .iter()
        .filter(|m| m.payload() == Some(pipeline::REJECTED.as_bytes()))
        .count();
    Ok(RunReport {
        delivered: distinct(&received),
        held: watch.held(),
        longest_hold_ms: i64::try_from(watch.longest().as_millis()).unwrap_or(i64::MAX),
        verdict: checker::check(&received),
        rejected,
    })
}

fn run_plain(
    config: &ClientConfig,
    topics: &Topics,
    prefix: &str,
    orders: u32,
    timeout: Duration,
) -> Result<RunReport, DemoError> {
    let mut config = config.clone();
    config.set("group.id", format!("{prefix}plain-ledger"));
    let records = read_all(
        &config,
        &[topics.orders.name(), topics.payments.name()],
        2 * orders as usize,
        timeout,
    )?;
    // The ledger's logic, without a gate: the amount due per order, settled
    // by its payment, or the payment rejected when no order is known.
    let mut due: BTreeMap<u32, i64> = BTreeMap::new();
    let mut received = Vec::with_capacity(records.len());
    let mut rejected = 0;
    for m in &records {
        let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
        let is_order = m.topic() == topics.orders.name();
        let Some(e) = event(key, is_order) else {
            return Err(format!(
                "{}:{}@{} is not a demo record",
                m.topic(),
                m.partition(),
                m.offset()
            )
            .into());
        };
        received.push(e);
        let amount = m
            .payload()
            .map(|p| topics.orders.value_codec().decode(p))
            .transpose()?
            .unwrap_or(0);
        match e {
            Event::Order(n) => {
                due.insert(n, amount);
            }
            Event::Payment(n) => {
                if due.remove(&n).is_none_or(|d| d <= 0) {
                    rejected += 1;
                }
            }
        }
    }
    Ok(RunReport {
        delivered: received.len(),
        held: 0,
        longest_hold_ms: 0,
        verdict: checker::check(&received),
        rejected,
    })
}

/// Reads `topics` from the beginning as a `read_committed` consumer, in
/// the order its fetches deliver, until `expected` records came or the
/// partitions reached the ends they had at the start.
fn read_all(
    config: &ClientConfig,
    topics: &[&str],
    expected: usize,
    timeout: Duration,
) -> Result<Vec<OwnedMessage>, DemoError> {
    let mut config = config.clone();
    config
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false");
    if config.get("group.id").is_none() {
        config.set("group.id", "parsley-demo-reader");
    }
    let consumer: BaseConsumer = config.create()?;
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(t, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(expected);
    while out.len() < expected {
        if Instant::now() > deadline {
            return Err(format!(
                "read {} of {expected} records from {} within {timeout:?}",
                out.len(),
                topics.join(", ")
            )
            .into());
        }
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            out.push(m?.detach());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn event_reads_the_order_number_from_the_key() {
        assert_eq!(event(Some("order-000042"), true), Some(Event::Order(42)));
        assert_eq!(event(Some("order-7"), false), Some(Event::Payment(7)));
        assert_eq!(event(Some("refund-1"), true), None);
        assert_eq!(event(None, true), None);
    }

    #[test]
    fn the_hold_watch_counts_held_records_and_their_longest_wait() {
        let watch = HoldWatch::default();
        let subscriber = tracing_subscriber::registry().with(watch.clone());
        tracing::subscriber::with_default(subscriber, || {
            // The runtime's events, under its module path.
            let held = |c: &str| {
                tracing::debug!(target: "parsley::runtime::task", coordinate = %c, "record held");
            };
            let delivered = |c: &str, was_held: bool| {
                tracing::debug!(target: "parsley::runtime::task", coordinate = %c, was_held, "delivering to logic");
            };
            held("payments-0@3");
            held("payments-0@3");
            held("payments-1@9");
            std::thread::sleep(Duration::from_millis(30));
            delivered("orders-0@1", false);
            delivered("payments-0@3", true);
            // Another module's event with the same words is not the runtime's.
            tracing::debug!(target: "elsewhere", coordinate = %"x@1", "record held");
        });
        assert_eq!(watch.held(), 2);
        assert!(watch.longest() >= Duration::from_millis(30));
        watch.reset();
        assert_eq!((watch.held(), watch.longest()), (0, Duration::ZERO));
    }
}
