//! End to end on a broker: the same consume-transform-produce work done by
//! a plain rdkafka exactly-once loop and by a Parsley stage.
//!
//! * **Throughput**: RECORDS records (default 300,000) written up front;
//!   each loop works through them while a `read_committed` reader times
//!   the outputs, from the first tenth to the last (steady state: the
//!   start-up of either loop, a group join and the first transaction, is
//!   not part of it). The loops take turns, ROUNDS rounds (default 5), the
//!   plain loop first in odd rounds and the stage first in even ones; the
//!   medians are compared.
//! * **Latency**: each loop running and warmed up, records written at a
//!   steady RATE per second for SECONDS, each carrying its send time in
//!   microseconds; a `read_committed` reader takes the time each output
//!   becomes visible. Both loops commit every COMMIT_MS, so a record waits
//!   for its transaction in both: the difference of the medians is what
//!   Parsley adds.
//!
//! `PLAIN_STAMP_SIZED_HEADERS=1` makes the plain loop's outputs carry
//! three headers of the sizes of a one-input stage's stamp, so both loops
//! write the same bytes (a control run).
//!
//! ```text
//! cargo run --release -p parsley-kafka --example throughput -- BOOTSTRAP [RECORDS] [RATE SECONDS COMMIT_MS [ROUNDS]]
//! ```

use std::alloc::System;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::{Codec, Message, Parsley, Stage, Topic};
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts allocations made through Rust's allocator (librdkafka's own, in
/// C, are not counted; both loops make those alike).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("tp-{prefix}-{nanos}")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bootstrap = args
        .first()
        .ok_or("usage: throughput BOOTSTRAP [RECORDS]")?;
    let n: usize = args.get(1).map_or(Ok(300_000), |s| s.parse())?;
    let rate: u64 = args.get(2).map_or(Ok(500), |s| s.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(10), |s| s.parse())?;
    let commit = Duration::from_millis(args.get(4).map_or(Ok(20), |s| s.parse())?);
    let rounds: usize = args.get(5).map_or(Ok(5), |s| s.parse())?;
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", bootstrap);
    let cluster = KafkaCluster::new(&base, Duration::from_secs(30))?;
    let input = unique("in");
    create_topics(&cluster, &[&input])?;
    let producer: BaseProducer = base.create()?;
    for i in 0..n {
        let key = format!("k{i}");
        let value = format!("{i:0>64}");
        let mut record = BaseRecord::to(&input)
            .partition(0)
            .key(&key)
            .payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(5));
                    record = back;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;

    // Each loop runs on the backlog while a reader times its outputs; the
    // rate is taken between the reader's first tenth and its last record,
    // so group joins, transaction set-up and the first fetches (which
    // differ run to run by seconds) are not part of it. The loops take
    // turns, ROUNDS times (default 5), each on a fresh output topic and group, so
    // neither always runs on a busier or a quieter broker.
    let (mut plain_rates, mut parsley_rates) = (Vec::new(), Vec::new());
    let per = |cpu: Option<Duration>| {
        cpu.map_or("n/a".to_owned(), |c| {
            format!("{:.2} µs CPU", c.as_secs_f64() * 1e6 / n as f64)
        })
    };
    let run_plain = || -> Result<(f64, String)> {
        let plain_out = unique("plain");
        create_topics(&cluster, &[&plain_out])?;
        let reader = ready_reader(&base, &plain_out)?;
        let region = Region::new(GLOBAL);
        let (b, i, o) = (base.clone(), input.clone(), plain_out.clone());
        let worker = std::thread::Builder::new()
            .name("plain-loop".to_owned())
            .spawn(move || {
                plain_loop(&b, &i, &o, n, Duration::from_millis(100)).map_err(|e| e.to_string())?;
                Ok::<_, String>(thread_cpu("plain-loop"))
            })?;
        let rate = steady_rate(&reader, n)?;
        let cpu = worker.join().map_err(|_| "the plain loop panicked")??;
        let allocs = region.change().allocations as f64 / n as f64;
        Ok((
            rate,
            format!("{} and {allocs:.1} allocations per record", per(cpu)),
        ))
    };
    let run_parsley = || -> Result<(f64, String)> {
        let parsley_out = unique("parsley");
        create_topics(&cluster, &[&parsley_out])?;
        let app = copy_app(&input, &parsley_out)?;
        let mut streams = CausalStreams::new(&app, base.clone())?.with_options(StreamsOptions {
            instance_id: Some("bench".to_owned()),
            ..StreamsOptions::default()
        });
        let reader = ready_reader(&base, &parsley_out)?;
        let region = Region::new(GLOBAL);
        streams.start()?;
        let rate = steady_rate(&reader, n)?;
        let cpu = thread_cpu("parsley-");
        let allocs = region.change().allocations as f64 / n as f64;
        streams.close(Duration::from_secs(30))?;
        Ok((
            rate,
            format!("{} and {allocs:.1} allocations per record", per(cpu)),
        ))
    };
    for round in 1..=rounds {
        // Odd rounds run the plain loop first, even rounds the stage.
        let ((plain, plain_cost), (parsley, parsley_cost)) = if round % 2 == 1 {
            let p = run_plain()?;
            (p, run_parsley()?)
        } else {
            let q = run_parsley()?;
            (run_plain()?, q)
        };
        println!(
            "round {round}: plain rdkafka exactly-once loop {plain:>9.0} records/s ({plain_cost}), parsley stage {parsley:>9.0} records/s ({parsley_cost})"
        );
        plain_rates.push(plain);
        parsley_rates.push(parsley);
    }
    let (plain, parsley) = (median(&mut plain_rates), median(&mut parsley_rates));
    println!(
        "plain rdkafka exactly-once loop: {n} records, median {plain:.0} records/s in steady state"
    );
    println!(
        "parsley stage:                   {n} records, median {parsley:.0} records/s in steady state"
    );
    println!(
        "throughput ratio (parsley / plain): {:.2}x",
        parsley / plain
    );

    let measured = usize::try_from(rate * seconds)?;
    println!();
    println!(
        "latency: {rate} records/s for {seconds} s, transactions every {commit:?} in both loops"
    );
    let plain = latency(&cluster, &base, "plain", measured, rate, |input, output| {
        let (base, input, output) = (base.clone(), input.to_owned(), output.to_owned());
        let worker = std::thread::spawn(move || {
            plain_loop(&base, &input, &output, WARMUP + measured, commit).map_err(|e| e.to_string())
        });
        Ok(Box::new(move || {
            worker
                .join()
                .map_err(|_| "the plain loop panicked")?
                .map(|_| ())
                .map_err(Into::into)
        }))
    })?;
    let parsley = latency(
        &cluster,
        &base,
        "parsley",
        measured,
        rate,
        |input, output| {
            let app = copy_app(input, output)?;
            let mut streams =
                CausalStreams::new(&app, base.clone())?.with_options(StreamsOptions {
                    instance_id: Some("bench".to_owned()),
                    commit_interval: commit,
                    ..StreamsOptions::default()
                });
            streams.start()?;
            Ok(Box::new(move || {
                streams.close(Duration::from_secs(30))?;
                Ok(())
            }))
        },
    )?;
    for (name, l) in [
        ("plain rdkafka exactly-once loop", &plain),
        ("parsley stage", &parsley),
    ] {
        println!(
            "{name:<33} median {:>7.2} ms, p90 {:>7.2} ms, p99 {:>7.2} ms over {} records",
            l.median_ms, l.p90_ms, l.p99_ms, l.count
        );
    }
    println!(
        "added median latency (parsley - plain): {:.2} ms",
        parsley.median_ms - plain.median_ms
    );
    Ok(())
}

/// Creates one-partition topics and gives the broker a moment to serve
/// them.
fn create_topics(cluster: &KafkaCluster, names: &[&str]) -> Result<()> {
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for r in block_on(cluster.admin().create_topics(&topics, &AdminOptions::new()))? {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    std::thread::sleep(Duration::from_secs(1));
    Ok(())
}

/// The Parsley side: one stage copying each record of `input` to
/// `output` (the plain loop's work).
fn copy_app(input: &str, output: &str) -> Result<Parsley> {
    let src = Topic::new(input, Codec::utf8(), Codec::utf8());
    let dst = Topic::new(output, Codec::utf8(), Codec::utf8());
    let out = dst.clone();
    let stage = Stage::named("copy")
        .on(&src, move |m: &Message<String, String>| {
            vec![out.send(m.key().cloned(), m.value().cloned())]
        })
        .sink(&dst)
        .build()?;
    Ok(Parsley::named(unique("app").as_str(), [stage])?)
}

/// Whether the plain loop attaches headers of the sizes of a stage's stamp
/// to its outputs (`PLAIN_STAMP_SIZED_HEADERS=1`): a control run, to tell
/// what the stamp's bytes cost the broker apart from what the stage runtime
/// costs.
fn stamp_sized_headers() -> bool {
    std::env::var_os("PLAIN_STAMP_SIZED_HEADERS").is_some_and(|v| v == "1")
}

/// CPU time (user and system) of this process's threads whose name starts
/// with `prefix`, from `/proc` (Linux; `None` elsewhere). The loop threads
/// do the per-record work; librdkafka's own threads, which both loops
/// share alike, are not counted.
fn thread_cpu(prefix: &str) -> Option<Duration> {
    let mut ticks = 0u64;
    let mut found = false;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).ok()?;
        // The fields after the parenthesised name: utime and stime are the
        // 12th and 13th of them.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        ticks += fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        found = true;
    }
    // Linux reports these in clock ticks of 10 ms.
    found.then(|| Duration::from_millis(ticks * 10))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Records each latency run writes and waits for before measuring (the
/// loop has its partition and its first transactions behind it).
const WARMUP: usize = 200;

/// One latency run's figures.
struct Latency {
    count: usize,
    median_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

type Stop = Box<dyn FnOnce() -> Result<()>>;

/// Creates an input and an output topic, starts a loop between them with
/// `start` (which returns how to stop it), warms it up, then writes
/// `measured` records at `rate` per second and times each one's way
/// through.
fn latency(
    cluster: &KafkaCluster,
    base: &ClientConfig,
    name: &str,
    measured: usize,
    rate: u64,
    start: impl FnOnce(&str, &str) -> Result<Stop>,
) -> Result<Latency> {
    let (input, output) = (
        unique(&format!("{name}-lin")),
        unique(&format!("{name}-lout")),
    );
    create_topics(cluster, &[&input, &output])?;
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"))
        .set("fetch.wait.max.ms", "1");
    let reader: BaseConsumer = c.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&output, 0, Offset::Beginning)?;
    reader.assign(&tpl)?;
    let stop = start(&input, &output)?;

    let mut p = base.clone();
    p.set("linger.ms", "0");
    let producer: BaseProducer = p.create()?;
    let send = |i: usize| -> Result<()> {
        let value = format!("{:020}{:0>44}", now_micros(), i);
        producer
            .send(BaseRecord::to(&input).partition(0).key("k").payload(&value))
            .map_err(|(e, _)| e)?;
        producer.poll(Duration::ZERO);
        Ok(())
    };
    let read = |n: usize, latencies: &mut Vec<u64>| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = 0;
        while seen < n {
            if Instant::now() > deadline {
                return Err(format!("{name}: only {seen} of {n} records came through").into());
            }
            if let Some(m) = reader.poll(Duration::from_millis(1)) {
                let m = m?;
                let sent: u64 = m
                    .payload()
                    .and_then(|p| std::str::from_utf8(p.get(..20)?).ok())
                    .and_then(|s| s.parse().ok())
                    .ok_or("an output without its send time")?;
                latencies.push(now_micros().saturating_sub(sent));
                seen += 1;
            }
        }
        Ok(())
    };
    for i in 0..WARMUP {
        send(i)?;
    }
    producer.flush(Duration::from_secs(30))?;
    read(WARMUP, &mut Vec::new())?;

    // Writes at a steady rate from one thread while this one reads.
    let mut latencies = Vec::with_capacity(measured);
    std::thread::scope(|s| -> Result<()> {
        let writer = s.spawn(|| -> std::result::Result<(), String> {
            let started = Instant::now();
            for i in 0..measured {
                let due = started + Duration::from_micros(i as u64 * 1_000_000 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                send(WARMUP + i).map_err(|e| e.to_string())?;
            }
            producer
                .flush(Duration::from_secs(30))
                .map_err(|e| e.to_string())
        });
        read(measured, &mut latencies)?;
        writer.join().map_err(|_| "the writer panicked")??;
        Ok(())
    })?;
    stop()?;
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    Ok(Latency {
        count: latencies.len(),
        median_ms: at(0.5),
        p90_ms: at(0.9),
        p99_ms: at(0.99),
    })
}

/// A `read_committed` reader of `topic`, assigned and past its first
/// fetch before the loop it times starts.
fn ready_reader(base: &ClientConfig, topic: &str) -> Result<BaseConsumer> {
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"))
        .set("fetch.wait.max.ms", "5");
    let reader: BaseConsumer = c.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    reader.assign(&tpl)?;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if reader.poll(Duration::from_millis(50)).is_some() {
            return Err(format!("{topic} is not empty").into());
        }
    }
    Ok(reader)
}

/// Reads until `n` records were seen, and returns the rate at which they
/// became visible between the first tenth and the last.
fn steady_rate(reader: &BaseConsumer, n: usize) -> Result<f64> {
    let mut seen = 0;
    let tenth = n / 10;
    let mut at_tenth = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen < n {
        if Instant::now() > deadline {
            return Err(format!("only {seen} of {n} records arrived").into());
        }
        if let Some(Ok(_)) = reader.poll(Duration::from_millis(100)) {
            seen += 1;
            if seen == tenth {
                at_tenth = Some(Instant::now());
            }
        }
    }
    let from = at_tenth.ok_or("too few records to time")?;
    Ok((n - tenth) as f64 / from.elapsed().as_secs_f64())
}

/// A plain exactly-once consume-transform-produce loop: transactions every
/// `commit`, offsets sent with the consumer's group metadata. Returns once
/// it has committed `n` records.
fn plain_loop(
    base: &ClientConfig,
    input: &str,
    output: &str,
    n: usize,
    commit: Duration,
) -> Result<()> {
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("plain"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[input])?;
    let mut p = base.clone();
    p.set("transactional.id", unique("plain-txn"));
    let producer: BaseProducer = p.create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    // Read once: an environment lookup per record would be the plain
    // loop's own cost.
    let stamp_headers = stamp_sized_headers();
    let mut done = 0;
    let mut next = 0i64;
    let mut last_commit = Instant::now();
    while done < n {
        if let Some(m) = consumer.poll(Duration::from_millis(20)) {
            let m = m?;
            let mut record = BaseRecord::<[u8], [u8]>::to(output).partition(0);
            if let Some(k) = m.key() {
                record = record.key(k);
            }
            if let Some(v) = m.payload() {
                record = record.payload(v);
            }
            if stamp_headers {
                // The control run: headers of the sizes a one-input stage's
                // stamp has (a one-entry clock, a sender id, a sequence).
                record = record.headers(
                    OwnedHeaders::new_with_capacity(3)
                        .insert(Header {
                            key: "vc",
                            value: Some(&[0u8; 37][..]),
                        })
                        .insert(Header {
                            key: "vc-sender",
                            value: Some(&[0u8; 16][..]),
                        })
                        .insert(Header {
                            key: "vc-seq",
                            value: Some(&[0u8; 8][..]),
                        }),
                );
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        producer.poll(Duration::from_millis(5));
                        record = back;
                    }
                }
            }
            next = m.offset() + 1;
            done += 1;
        }
        if last_commit.elapsed() > commit || done == n {
            let mut offsets = TopicPartitionList::new();
            offsets.add_partition_offset(input, 0, Offset::Offset(next))?;
            let metadata = consumer.group_metadata().ok_or("no group metadata")?;
            producer.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(30))?;
            producer.commit_transaction(Duration::from_secs(30))?;
            producer.begin_transaction()?;
            last_commit = Instant::now();
        }
    }
    producer.abort_transaction(Duration::from_secs(30))?;
    Ok(())
}
