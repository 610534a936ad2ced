//! A restart with a large fold state, on a cluster: how many changelog
//! records a restart replays, and how long until the instance processes
//! again, with its state directory kept and with an empty one.
//!
//! ```text
//! PARSLEY_BOOTSTRAP=127.0.0.1:9092 cargo run --release -p parsley-kafka --example restart -- [KEYS [PARTITIONS [CACHE_MIB|none]]]
//! ```
//!
//! It fills a topic of PARTITIONS (default 6) partitions with one record
//! per key for KEYS keys (default 1,000,000) and runs a stage that counts
//! per key (one fold entry per key, nothing emitted) until every record is
//! folded, then closes. Then it restarts twice, each time after producing
//! 100 records of new keys: once on the same state directory, once on an
//! empty one. For each start it prints the time from `start()` to
//! `Running` (every task restored), to the 100 new records folded, and
//! what the restore did (`CausalStreams::restored()`), with the resident
//! set before each start, once its state is loaded and folded, and the
//! highest it was in between. CACHE_MIB is `StreamsOptions::fold_cache`
//! (64 by default; `none` keeps the whole fold state in memory);
//! `RESTART_FILE_CACHE=MIB` sets `StreamsOptions::state_file_cache` (what
//! each task file's engine caches). Each run also prints the fold cache's
//! own figures from `metrics()`.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[path = "shared/bench_util.rs"]
mod bench_util;
use bench_util::{PeakResident, resident_mib, send_when_room};

type T = Topic<String, String>;

fn produce(
    config: &ClientConfig,
    topic: &str,
    keys: std::ops::Range<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let producer: BaseProducer = config.clone().set("linger.ms", "20").create()?;
    for i in keys {
        let key = format!("key-{i}");
        send_when_room(
            &producer,
            BaseRecord::<str, str>::to(topic)
                .key(key.as_str())
                .payload("v"),
        );
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

fn folded(s: &CausalStreams) -> u64 {
    s.metrics().iter().map(|m| m.records_delivered_total).sum()
}

struct Run {
    to_running: Duration,
    to_processing: Duration,
    /// The resident set before the start, once everything was folded,
    /// and the highest it was in between (`VmRSS`, MiB; 0 off Linux).
    rss: (f64, f64, f64),
}

fn run(
    app: &Parsley,
    config: &ClientConfig,
    dir: &Path,
    until: u64,
    cache: Option<usize>,
) -> Result<(Run, parsley_kafka::Restores), Box<dyn std::error::Error>> {
    let mut s = CausalStreams::new(app, config.clone())?.with_options(StreamsOptions {
        instance_id: Some("bench".to_owned()),
        state_dir: Some(dir.to_owned()),
        fold_cache: cache,
        state_file_cache: std::env::var("RESTART_FILE_CACHE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(parsley_kafka::state_dir::DEFAULT_FILE_CACHE, |mib| {
                mib << 20
            }),
        ..StreamsOptions::default()
    });
    let before = resident_mib();
    let peak = PeakResident::start();
    let started = Instant::now();
    s.start()?;
    s.wait_until_running(Duration::from_secs(600))?;
    let to_running = started.elapsed();
    while folded(&s) < until {
        if started.elapsed() > Duration::from_secs(900) {
            return Err(format!("only {} of {until} folded", folded(&s)).into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let to_processing = started.elapsed();
    // The counts are sampled at most half a second late.
    std::thread::sleep(Duration::from_millis(600));
    let loaded = resident_mib();
    {
        let m = s.metrics();
        eprintln!(
            "fold cache: {:.1} MiB resident, {} reads from the files, {} evictions",
            m.iter().map(|t| t.fold_cache_bytes).sum::<u64>() as f64 / f64::from(1 << 20),
            m.iter().map(|t| t.fold_store_reads_total).sum::<u64>(),
            m.iter().map(|t| t.fold_cache_evictions_total).sum::<u64>(),
        );
    }
    let restored = s.restored();
    let peak = peak.stop();
    s.close(Duration::from_secs(60))?;
    Ok((
        Run {
            to_running,
            to_processing,
            rss: (before, loaded, peak),
        },
        restored,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(level) = std::env::var_os("RESTART_LOG") {
        let level = if level == "debug" {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        };
        tracing_subscriber::fmt().with_max_level(level).init();
    }
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let partitions: i32 = args.next().map_or(Ok(6), |a| a.parse())?;
    // The fold cache in MiB ("none": the whole state in memory).
    let cache = match args.next().as_deref() {
        None => Some(64 << 20),
        Some("none") => None,
        Some(mib) => Some(mib.parse::<usize>()? << 20),
    };
    let bootstrap =
        std::env::var("PARSLEY_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let input = format!("restart-bench-{nanos}-in");
    let setup = KafkaCluster::new(&config, Duration::from_secs(30))?;
    let new = NewTopic::new(&input, partitions, TopicReplication::Fixed(1));
    for r in futures_executor::block_on(setup.admin().create_topics([&new], &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    while setup.describe(&input).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let source: T = Topic::new(&input, Codec::utf8(), Codec::utf8());
    let stage = Stage::named("count")
        .state(Codec::int64(), || 0)
        .fold(&source, |n: i64, _m: &Message<String, String>| {
            Step::to(n + 1)
        })
        .build()?;
    let app = Parsley::named(format!("restart-bench-{nanos}").as_str(), [stage])?;
    let kept = std::env::temp_dir().join(format!("restart-bench-{nanos}-kept"));
    let empty = std::env::temp_dir().join(format!("restart-bench-{nanos}-empty"));

    produce(&config, &input, 0..keys)?;
    let (first, _) = run(&app, &config, &kept, keys as u64, cache)?;
    let cache_text = cache.map_or("no fold cache".to_owned(), |c| {
        format!("a {} MiB fold cache", c >> 20)
    });
    println!(
        "{keys} keys over {partitions} partitions, {cache_text}: folded from empty in {:.2} s; resident set {:.0} MiB before the start, {:.0} MiB with every key folded, {:.0} MiB at the highest",
        first.to_processing.as_secs_f64(),
        first.rss.0,
        first.rss.1,
        first.rss.2,
    );
    println!(
        "| start | records replayed | tasks from their file | start to Running | start to 100 new records folded | resident set before, with the state loaded, highest |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (name, dir, from) in [
        ("state directory kept", &kept, keys),
        ("empty state directory", &empty, keys + 100),
    ] {
        produce(&config, &input, from..from + 100)?;
        let (r, restored) = run(&app, &config, dir, 100, cache)?;
        println!(
            "| {name} | {} | {} | {:.2} s | {:.2} s | {:.0} MiB, {:.0} MiB, {:.0} MiB |",
            restored.records_replayed,
            restored.from_local_store,
            r.to_running.as_secs_f64(),
            r.to_processing.as_secs_f64(),
            r.rss.0,
            r.rss.1,
            r.rss.2,
        );
    }
    let _ = std::fs::remove_dir_all(&kept);
    let _ = std::fs::remove_dir_all(&empty);
    Ok(())
}
