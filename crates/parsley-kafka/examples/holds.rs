//! Memory while a cause is missing, on a cluster: how the resident set of
//! one instance grows while records that wait for an open upstream
//! transaction pile up, how fast they are released when it commits, and
//! where the resident set ends.
//!
//! ```text
//! PARSLEY_BOOTSTRAP=127.0.0.1:9092 cargo run --profile ci -p parsley-kafka --example holds -- [RECORDS [BUDGET_MIB|none [PARTITIONS]]]
//! ```
//!
//! An upstream transactional producer writes one cause to every partition
//! of `causes` and leaves its transaction open. Then RECORDS (default
//! 1,000,000) records of 100-byte values and 7-byte keys go to `effects`,
//! spread over PARTITIONS (default 6) partitions, each stamped as caused by
//! the open cause of its partition. One instance runs a stage over both
//! topics with a hold budget of BUDGET_MIB per task (default 32; `none` for
//! no bound), until its holds stop growing. Then the transaction commits
//! and the example waits until everything is delivered. It prints the
//! resident set (`VmRSS`) before the start, at the plateau (the holds no
//! longer growing, just before the commit), at its peak (the release
//! included), and after the release, with the time the release took.
//! With `HOLDS_STOP_AT_PLATEAU` set it exits at the plateau instead (for a
//! heap profiler, whose peak is then the plateau's); `RELEASE_PER_TRANSACTION`
//! (a number, or `none`) sets the option of that name.
//!
//! With `HOLDS_RESTART` set the instance closes at the plateau and a new
//! one starts on the same state directory; the time until it holds every
//! held record again is printed, and the new instance does the release.
//!
//! With `HOLDS_FLOOR` set it then measures what a release would write at
//! the least if held records were stored one per key (the Java library's
//! layout, and this library's before pages), on the same broker: a plain
//! transactional producer sends one tombstone per held record (keyed as
//! that layout keys it) to a compacted topic, in transactions of the
//! release's size, and the time to its last commit is printed as the
//! floor. Stored in pages, a release writes one tombstone per page.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley::protocol::headers::CLOCK_HEADER;
use parsley::protocol::{Channel, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[path = "shared/bench_util.rs"]
mod bench_util;
use bench_util::{resident_mib, send_when_room};

type T = Topic<String, String>;

struct Reading {
    held: u64,
    held_bytes: u64,
    paused: u64,
    delivered: u64,
}

fn read(s: &CausalStreams) -> Reading {
    let m = s.metrics();
    Reading {
        held: m.iter().map(|t| t.records_held).sum(),
        held_bytes: m.iter().map(|t| t.records_held_bytes).sum(),
        paused: m.iter().map(|t| t.partitions_paused).sum(),
        delivered: m.iter().map(|t| t.records_delivered_total).sum(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let budget: Option<usize> = match args.next().as_deref() {
        None => Some(32 << 20),
        Some("none") => None,
        Some(mib) => Some(mib.parse::<usize>()? << 20),
    };
    let partitions: i32 = args.next().map_or(Ok(6), |a| a.parse())?;
    let release_per_transaction: Option<usize> =
        match std::env::var("RELEASE_PER_TRANSACTION").as_deref() {
            Ok("none") => None,
            Ok(n) => Some(n.parse()?),
            Err(_) => StreamsOptions::default().release_per_transaction,
        };
    let bootstrap =
        std::env::var("PARSLEY_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let (causes, effects, done) = (
        format!("holds-bench-{nanos}-causes"),
        format!("holds-bench-{nanos}-effects"),
        format!("holds-bench-{nanos}-done"),
    );
    let cluster = KafkaCluster::new(&config, Duration::from_secs(30))?;
    let new: Vec<NewTopic<'_>> = [&causes, &effects, &done]
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    create_topics(&cluster, &new)?;
    let causes_id = cluster.describe(&causes)?.id;

    // The causes: one per partition, in a transaction left open.
    let mut upstream_config = config.clone();
    upstream_config.set("transactional.id", format!("holds-bench-{nanos}"));
    upstream_config.set("transaction.timeout.ms", "900000");
    let upstream: BaseProducer = upstream_config.create()?;
    upstream.init_transactions(Duration::from_secs(30))?;
    upstream.begin_transaction()?;
    for p in 0..partitions {
        send_when_room(
            &upstream,
            BaseRecord::to(&causes)
                .partition(p)
                .key("cause")
                .payload(&b"cause"[..]),
        );
    }
    upstream.flush(Duration::from_secs(30))?;

    // The effects, each claiming its partition's cause (offset 0).
    {
        let producer: BaseProducer = config.clone().set("linger.ms", "20").create()?;
        let value = [b'v'; 100];
        let clocks: Vec<Vec<u8>> = (0..partitions)
            .map(|p| {
                let mut c = VectorClock::new();
                c.claim_offset(Channel::new(causes_id, p), 0);
                c.encode()
            })
            .collect();
        for i in 0..records {
            let p = (i % partitions as usize) as i32;
            let key = format!("k{:06}", i % 1_000_000);
            let headers = OwnedHeaders::new().insert(Header {
                key: CLOCK_HEADER,
                value: Some(&clocks[p as usize]),
            });
            send_when_room(
                &producer,
                BaseRecord::to(&effects)
                    .partition(p)
                    .key(key.as_str())
                    .payload(&value[..])
                    .headers(headers),
            );
        }
        producer.flush(Duration::from_secs(300))?;
    }

    let (c, e, d): (T, T, T) = (
        Topic::new(&causes, Codec::utf8(), Codec::utf8()),
        Topic::new(&effects, Codec::utf8(), Codec::utf8()),
        Topic::new(&done, Codec::utf8(), Codec::utf8()),
    );
    // The last effect of each partition sends one record: once all are
    // committed (read_committed), the release is.
    let last: std::collections::BTreeSet<String> = (records.saturating_sub(partitions as usize)
        ..records)
        .map(|i| format!("k{:06}", i % 1_000_000))
        .collect();
    let sink = d.clone();
    let stage = Stage::named("wait")
        .on(&c, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&e, move |m: &Message<String, String>| match m.key() {
            Some(k) if last.contains(k) => vec![sink.send(Some(k.clone()), "done".to_owned())],
            _ => Vec::new(),
        })
        .sink(&d)
        .build()?;
    let app = Parsley::named(format!("holds-bench-{nanos}").as_str(), [stage])?;
    let before = resident_mib();
    let options = || StreamsOptions {
        instance_id: Some("bench".to_owned()),
        state_dir: Some(std::env::temp_dir().join(format!("holds-bench-{nanos}"))),
        hold_budget: budget,
        release_per_transaction,
        ..StreamsOptions::default()
    };
    let mut s = CausalStreams::new(&app, config.clone())?.with_options(options());
    s.start()?;
    s.wait_until_running(Duration::from_secs(120))?;

    // Until the holds stop growing (or everything is held).
    let mut peak = resident_mib();
    let mut last = (0, Instant::now());
    let mut peak_held = (0, 0);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(resident_mib());
        let r = read(&s);
        peak_held = (peak_held.0.max(r.held), peak_held.1.max(r.held_bytes));
        if r.held != last.0 {
            last = (r.held, Instant::now());
        } else if r.held > 0 && last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        if r.held as usize >= records {
            break;
        }
    }
    let waiting = read(&s);
    let plateau = resident_mib();
    if std::env::var_os("HOLDS_STOP_AT_PLATEAU").is_some() {
        // For a heap profiler: the process ends holding everything (its
        // peak is then the plateau).
        println!(
            "plateau: {} held, {plateau:.0} MiB resident ({before:.0} MiB before)",
            waiting.held
        );
        std::process::exit(0);
    }
    if std::env::var_os("HOLDS_RESTART").is_some() {
        // A restart with everything held: the instance closes, and a new
        // one starts on the same state directory and reads its holds back.
        s.close(Duration::from_secs(60))?;
        let began = Instant::now();
        s = CausalStreams::new(&app, config.clone())?.with_options(options());
        s.start()?;
        while read(&s).held < waiting.held {
            if began.elapsed() > Duration::from_secs(600) {
                return Err(format!(
                    "only {} of {} held records back",
                    read(&s).held,
                    waiting.held
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        println!(
            "restart: {} held records back in {:.2} s, {:.0} MiB resident",
            read(&s).held,
            began.elapsed().as_secs_f64(),
            resident_mib()
        );
    }
    let committed = Instant::now();
    upstream.commit_transaction(Duration::from_secs(30))?;
    let total = (records + partitions as usize) as u64;
    while read(&s).delivered < total {
        peak = peak.max(resident_mib());
        if committed.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {} of {total} delivered", read(&s).delivered).into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The counts are sampled every half second: the release took at most
    // this long (and at least this minus half a second).
    let released = committed.elapsed();
    // Delivered is not committed: the release is over when the last
    // effects' records are readable (read_committed).
    let reader: rdkafka::consumer::BaseConsumer = config
        .clone()
        .set("group.id", format!("holds-bench-{nanos}-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()?;
    // Assigned, not subscribed: no group join in the measured time.
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&done, p, rdkafka::Offset::Beginning)?;
    }
    rdkafka::consumer::Consumer::assign(&reader, &tpl)?;
    let mut seen = 0;
    while seen < partitions {
        peak = peak.max(resident_mib());
        if let Some(m) = reader.poll(Duration::from_millis(5)) {
            m?;
            seen += 1;
        }
        if committed.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {seen} of the last effects committed").into());
        }
    }
    let committed_all = committed.elapsed();
    drop(reader);
    // The last commits (and their local store writes) finish meanwhile.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(2) {
        peak = peak.max(resident_mib());
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = resident_mib();
    s.close(Duration::from_secs(60))?;
    if std::env::var_os("HOLDS_FLOOR").is_some() {
        let took = tombstone_floor(
            &config,
            &cluster,
            &format!("holds-bench-{nanos}-floor"),
            records,
            partitions,
            // The stage releases up to the cap per task in one transaction.
            release_per_transaction.map(|n| n * partitions as usize),
        )?;
        println!(
            "floor: {records} changelog tombstones, committed in {:.2} s ({:.0}/s)",
            took.as_secs_f64(),
            records as f64 / took.as_secs_f64()
        );
    }
    let budget_text = budget.map_or("none".to_owned(), |b| format!("{} MiB", b >> 20));
    println!(
        "| records | budget per task | held at the plateau (bytes) | partitions paused | RSS before | RSS at the plateau | RSS peak | RSS after the release | release: delivered / committed |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {records} | {budget_text} | {} ({:.1} MiB; peak {} records) | {} | {before:.0} MiB | {plateau:.0} MiB | {peak:.0} MiB | {after:.0} MiB | {:.2} s / {:.2} s |",
        waiting.held,
        waiting.held_bytes as f64 / (1 << 20) as f64,
        peak_held.0,
        waiting.paused,
        released.as_secs_f64(),
        committed_all.as_secs_f64(),
    );
    Ok(())
}

/// Creates `topics` and waits until the cluster describes each of them.
fn create_topics(
    cluster: &KafkaCluster,
    topics: &[NewTopic<'_>],
) -> Result<(), Box<dyn std::error::Error>> {
    for r in
        futures_executor::block_on(cluster.admin().create_topics(topics, &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    while topics.iter().any(|t| cluster.describe(t.name).is_err()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The time a plain transactional producer takes to write and commit one
/// tombstone per record, keyed as a held record's entry of the one-key-per-
/// record layout, to a
/// compacted topic of `partitions` partitions, `per_transaction` at a time
/// (all in one when `None`): the least a release of that many records
/// writes in that layout.
fn tombstone_floor(
    config: &ClientConfig,
    cluster: &KafkaCluster,
    topic: &str,
    records: usize,
    partitions: i32,
    per_transaction: Option<usize>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    use parsley::protocol::store::StateKey;
    create_topics(
        cluster,
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
            .set("cleanup.policy", "compact")],
    )?;
    let id = cluster.describe(topic)?.id;
    let keys: Vec<String> = (0..records)
        .map(|i| {
            let p = (i % partitions as usize) as i32;
            StateKey::QueueEntry(Channel::new(id, p), (i / partitions as usize) as i64).to_key()
        })
        .collect();
    let producer: BaseProducer = config
        .clone()
        .set("transactional.id", format!("{topic}-producer"))
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    let chunk = per_transaction.unwrap_or(records).max(1);
    let start = Instant::now();
    for part in keys.chunks(chunk).enumerate() {
        let (n, part) = part;
        producer.begin_transaction()?;
        for (i, key) in part.iter().enumerate() {
            let p = ((n * chunk + i) % partitions as usize) as i32;
            send_when_room(
                &producer,
                BaseRecord::<str, [u8]>::to(topic)
                    .partition(p)
                    .key(key.as_str()),
            );
        }
        producer.commit_transaction(Duration::from_secs(120))?;
    }
    Ok(start.elapsed())
}
