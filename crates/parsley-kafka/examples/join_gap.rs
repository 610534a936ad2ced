//! How long a task stops while another instance joins: the processing gap
//! of every task, those that stay on their instance and those that move,
//! under each group protocol.
//!
//! ```text
//! PARSLEY_BOOTSTRAP=127.0.0.1:9092 cargo run --release -p parsley-kafka --example join_gap -- [KEYS]
//! ```
//!
//! A stateful stage (a count per key) over 6 partitions runs on one
//! instance, with KEYS (default 10000) keys of state loaded first. A probe
//! record goes to every partition every 20 ms; a `read_committed` reader
//! notes when each partition's output advances. A second instance joins;
//! once the group settles, the largest gap between two outputs of each
//! partition during the join is reported, split by whether its task stayed
//! on the first instance, with the transactions the two instances aborted
//! meanwhile. A protocol the cluster does not serve is skipped with a line
//! that says so (the consumer protocol before Kafka 4.0).

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing_subscriber::Layer as _;

use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{
    CausalStreams, GroupProtocol, KafkaCluster, StreamsError, StreamsOptions, StreamsState,
};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 6;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys: usize = std::env::args().nth(1).map_or(Ok(10_000), |a| a.parse())?;
    if std::env::var_os("JOIN_GAP_LOG").is_some() {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_target("parsley_kafka", tracing::Level::DEBUG)
                            .with_target("rdkafka", tracing::Level::DEBUG)
                            .with_target("librdkafka", tracing::Level::DEBUG)
                            .with_target("parsley::runtime::worker", tracing::Level::INFO),
                    ),
            )
            .init();
    }
    let bootstrap =
        std::env::var("PARSLEY_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    // librdkafka's own debug contexts (`cgrp,fetch`, say), with
    // JOIN_GAP_LOG set to see them.
    if let Ok(contexts) = std::env::var("JOIN_GAP_RDKAFKA_DEBUG") {
        config.set("debug", contexts);
    }
    let only = std::env::var("JOIN_GAP_PROTOCOL").ok();
    for protocol in [GroupProtocol::Consumer, GroupProtocol::Classic] {
        if only
            .as_deref()
            .is_some_and(|o| !format!("{protocol:?}").eq_ignore_ascii_case(o))
        {
            continue;
        }
        match run(&config, keys, protocol) {
            Err(e)
                if matches!(
                    e.downcast_ref::<StreamsError>(),
                    Some(StreamsError::GroupProtocolUnsupported { .. })
                ) =>
            {
                println!("{protocol:?}: not served by this cluster ({e})");
            }
            r => r?,
        }
    }
    Ok(())
}

fn run(
    config: &ClientConfig,
    keys: usize,
    protocol: GroupProtocol,
) -> Result<(), Box<dyn std::error::Error>> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let (src, out) = (format!("gap-{nanos}-in"), format!("gap-{nanos}-out"));
    let cluster = KafkaCluster::new(config, Duration::from_secs(30))?;
    let topics: Vec<NewTopic<'_>> = [&src, &out]
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    for r in
        futures_executor::block_on(cluster.admin().create_topics(&topics, &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    while cluster.describe(&src).is_err() || cluster.describe(&out).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut builder = Stage::named("count").state(Codec::int64(), || 0);
    let sink = builder.add_sink(&t(&out));
    let stage = builder
        .fold(&t(&src), move |n: i64, m: &Message<String, String>| {
            // Only probes are echoed; the load only builds state.
            let step = Step::to(n + 1);
            if m.key().is_some_and(|k| k.starts_with("probe")) {
                // Unkeyed: the output lands on the task's own partition, so
                // each output partition's gaps are one task's.
                step.emit(sink.send(None::<String>, (n + 1).to_string()))
            } else {
                step
            }
        })
        .build()?;
    let app = Parsley::named(format!("gap-{nanos}").as_str(), [stage])?;
    let start = |name: &str| -> Result<CausalStreams, Box<dyn std::error::Error>> {
        let mut s = CausalStreams::new(&app, config.clone())?.with_options(StreamsOptions {
            instance_id: Some(name.to_owned()),
            commit_interval: Duration::from_millis(50),
            group_protocol: protocol,
            ..StreamsOptions::default()
        });
        s.start()?;
        Ok(s)
    };
    let producer: BaseProducer = config.clone().set("linger.ms", "5").create()?;
    let send = |key: &str, p: i32| {
        let mut r = BaseRecord::to(&src).partition(p).key(key).payload("v");
        loop {
            match producer.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(5));
                    r = back;
                }
            }
        }
    };
    for k in 0..keys {
        send(&format!("key-{k}"), (k % PARTITIONS as usize) as i32);
    }
    producer.flush(Duration::from_secs(60))?;
    let a = start("a")?;
    a.wait_until_running(Duration::from_secs(300))?;
    // The load goes through before the probes start.
    while a
        .metrics()
        .iter()
        .map(|m| m.records_delivered_total)
        .sum::<u64>()
        < keys as u64
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let probing = {
        let (stop, src, config) = (stop.clone(), src.clone(), config.clone());
        std::thread::spawn(move || {
            let producer: BaseProducer = config.clone().set("linger.ms", "0").create().unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for p in 0..PARTITIONS {
                    let _ = producer.send(
                        BaseRecord::to(&src)
                            .partition(p)
                            .key(&format!("probe-{p}"))
                            .payload(&n.to_string()),
                    );
                }
                producer.poll(Duration::ZERO);
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = producer.flush(Duration::from_secs(10));
        })
    };
    let mut reader_config = config.clone();
    reader_config
        .set("isolation.level", "read_committed")
        .set("group.id", format!("gap-{nanos}-reader"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10");
    let reader: BaseConsumer = reader_config.create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&out, p, Offset::End)?;
    }
    reader.assign(&tpl)?;
    let mut last: BTreeMap<i32, Instant> = BTreeMap::new();
    let mut gaps: BTreeMap<i32, Duration> = BTreeMap::new();
    let mut read = |until: Instant, measure: bool| {
        while Instant::now() < until {
            if let Some(Ok(m)) = reader.poll(Duration::from_millis(5)) {
                let now = Instant::now();
                if let Some(prev) = last.insert(m.partition(), now)
                    && measure
                {
                    let g = gaps.entry(m.partition()).or_default();
                    *g = (*g).max(now - prev);
                }
            }
        }
    };
    read(Instant::now() + Duration::from_secs(2), false);
    let aborted_before = a.aborted_transactions();
    let b = start("b")?;
    let began = Instant::now();
    let settled = |a: &CausalStreams, b: &CausalStreams| {
        a.state() == StreamsState::Running
            && b.state() == StreamsState::Running
            && a.metrics().len() + b.metrics().len() == PARTITIONS as usize
            && !b.metrics().is_empty()
    };
    while !settled(&a, &b) && began.elapsed() < Duration::from_secs(300) {
        read(Instant::now() + Duration::from_millis(50), true);
    }
    // Until every partition has output again after the join.
    read(Instant::now() + Duration::from_secs(3), true);
    stop.store(true, Ordering::SeqCst);
    let _ = probing.join();
    let stayed: BTreeSet<i32> = a.metrics().iter().map(|m| m.task.partition).collect();
    let worst = |set: &mut dyn Iterator<Item = i32>| {
        set.filter_map(|p| gaps.get(&p).copied())
            .max()
            .unwrap_or_default()
    };
    let aborted = (a.aborted_transactions() - aborted_before) + b.aborted_transactions();
    println!(
        "{protocol:?}, {keys} keys: largest gap of a task that stayed {:.0} ms, of one that moved {:.0} ms ({} stayed, {} moved; settled after {:.2} s; {aborted} transaction(s) aborted during the join)",
        worst(&mut stayed.iter().copied()).as_secs_f64() * 1e3,
        worst(&mut (0..PARTITIONS).filter(|p| !stayed.contains(p))).as_secs_f64() * 1e3,
        stayed.len(),
        PARTITIONS as usize - stayed.len(),
        began.elapsed().as_secs_f64()
    );
    for mut s in [b, a] {
        s.close(Duration::from_secs(60))?;
    }
    Ok(())
}
