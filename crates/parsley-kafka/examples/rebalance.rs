//! How long an instance takes from `start()` to `Running` (every task
//! started: lookups and changelog restores done), alone and while others
//! join, for a stateful stage over many partitions.
//!
//! ```text
//! PARSLEY_BOOTSTRAP=127.0.0.1:9092 cargo run --release -p parsley-kafka --example rebalance -- [PARTITIONS [INSTANCES]]
//! ```
//!
//! It creates a source and a sink of PARTITIONS (default 48) partitions,
//! starts one instance and times it to `Running`, then starts INSTANCES - 1
//! more (default 4 in all) together and times the group until every one
//! of them is `Running` again. Each stateful task restores two (empty)
//! changelog partitions and looks up its sink's end offsets.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions, StreamsState};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let partitions: i32 = args.next().map_or(Ok(48), |a| a.parse())?;
    let instances: usize = args.next().map_or(Ok(4), |a| a.parse())?;
    let bootstrap =
        std::env::var("PARSLEY_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let (src, out) = (format!("rb-{nanos}-in"), format!("rb-{nanos}-out"));
    let cluster = KafkaCluster::new(&config, Duration::from_secs(30))?;
    let topics: Vec<NewTopic<'_>> = [&src, &out]
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
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
            Step::to(n + 1).emit(sink.send(m.key().cloned(), (n + 1).to_string()))
        })
        .build()?;
    let app = Parsley::named(format!("rb-{nanos}").as_str(), [stage])?;
    let start = |name: &str| -> Result<CausalStreams, Box<dyn std::error::Error>> {
        let mut s = CausalStreams::new(&app, config.clone())?.with_options(StreamsOptions {
            instance_id: Some(name.to_owned()),
            ..StreamsOptions::default()
        });
        s.start()?;
        Ok(s)
    };
    println!(
        "{partitions} partitions, a stateful stage: {partitions} tasks, {} changelog partitions",
        2 * partitions
    );
    // Settled: every instance Running and, between them, every task listed
    // by `metrics()` once (a thread publishes its tasks as a rebalance
    // leaves them, and on its half-second sample).
    let settled = |all: &[CausalStreams]| {
        all.iter().all(|s| s.state() == StreamsState::Running)
            && all.iter().map(|s| s.metrics().len()).sum::<usize>() == partitions as usize
    };
    let began = Instant::now();
    let first = start("i0")?;
    let mut all = vec![first];
    while !settled(&all) && began.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "  one instance: every task started after {:.2} s",
        began.elapsed().as_secs_f64()
    );
    let began = Instant::now();
    for k in 1..instances {
        all.push(start(&format!("i{k}"))?);
    }
    // Settled: every instance Running, and stays so for a second.
    let mut settled_at = None;
    while began.elapsed() < Duration::from_secs(600) {
        let running = settled(&all);
        match (running, settled_at) {
            (true, None) => settled_at = Some(began.elapsed()),
            (true, Some(at)) if began.elapsed() - at > Duration::from_secs(1) => break,
            (false, _) => settled_at = None,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match settled_at {
        Some(at) => println!(
            "  {} more joining: all {instances} running every task after {:.2} s",
            instances - 1,
            at.as_secs_f64()
        ),
        None => println!("  the group did not settle within 600 s"),
    }
    for mut s in all {
        s.close(Duration::from_secs(60))?;
    }
    Ok(())
}
