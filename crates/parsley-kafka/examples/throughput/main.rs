//! End to end on a broker: the same consume-transform-produce work done by
//! a plain rdkafka exactly-once loop, by Parsley stages and by a Kafka
//! Streams peer (`bench/kstreams-peer`), each loop in a process of its own.
//!
//! Two kinds of work: a **copy** (plain loop, Parsley, Kafka Streams) and a
//! **per-key running sum** written on every record (Parsley, Kafka Streams
//! with its in-memory store, Kafka Streams with RocksDB).
//!
//! * **Throughput**: RECORDS records (default 300,000; 10,000 keys, or
//!   `BENCH_KEYS` of them, `BENCH_KEYS=distinct` for a key per record;
//!   64-byte values) written up front; each loop works through them while a
//!   `read_committed` reader times the outputs, from the first tenth to
//!   the last (steady state: start-up, a group join and the first
//!   transaction, is not part of it). CPU per record is the loop process's
//!   (all its threads) and the loop thread's over the same window, and for
//!   the Rust loops librdkafka's threads' (`client µs`) and the state-file
//!   writer's (`writer µs`) apart; peak RSS is the process's `VmHWM`.
//! * **Latency**: each loop running and warmed up, records written at a
//!   steady RATE per second for SECONDS, each carrying its send time in
//!   microseconds; a `read_committed` reader takes the time each output
//!   becomes visible. Every loop commits every COMMIT_MS (default 100, the
//!   Kafka Streams default under exactly-once). The loops write the times
//!   of each record's delivery to their logic and of each commit's steps
//!   to a timing file, from which the breakdown of a record's trip is
//!   taken.
//!
//! The loops take turns: ROUNDS rounds (default 3), each starting one loop
//! later in the list than the round before; figures are the medians over
//! rounds (latency percentiles over every round's records).
//!
//! The Kafka Streams peer runs when `KSTREAMS_PEER` names its launcher
//! (`scripts/bench/throughput` builds it and sets it). Set
//! `PLAIN_STAMP_SIZED_HEADERS=1` for a control run whose plain loop writes
//! headers of the stamp's sizes, and `STAMPED_INPUT=1` for input records
//! that carry an upstream stage's causal headers. `BENCH_ONLY=sum,copy: k`
//! runs only the loops whose names contain one of the comma-separated
//! words; SECONDS 0 skips the latency runs; `BENCH_PERF_DIR=DIR` records a
//! `perf` profile of each Parsley loop's steady window (see [`Profile`]).
//! `BENCH_COMMIT_WHEN_IDLE=MS` runs the Parsley loops with
//! `StreamsOptions::commit_when_idle` at that floor (`off`: none), and `BENCH_LINGER=MS`
//! with the producers' `linger.ms` at that value.
//! `BENCH_BUILDS=a=PATH,b=PATH` compares builds: each Rust stage loop runs
//! once per build in every round, with that build's `--child`, on the same
//! backlog (`scripts/bench/compare` builds two revisions and runs this).
//! After the medians come the ratios the stateful path is judged by: the
//! sum against Kafka Streams' faster store, the copy against Kafka
//! Streams, the sum against the copy, and the state file's cost per
//! record (the sum with and without `state_dir`).
//!
//! ```text
//! scripts/bench/throughput [RECORDS [RATE SECONDS COMMIT_MS [ROUNDS]]]
//! cargo run --release -p parsley-kafka --example throughput -- BOOTSTRAP [RECORDS [RATE SECONDS COMMIT_MS [ROUNDS]]]
//! ```

#[path = "../shared/bench_util.rs"]
mod bench_util;
mod child;
mod procfs;

use std::alloc::System;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley_kafka::KafkaCluster;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use bench_util::send_when_room;

/// Counts allocations made through Rust's allocator (librdkafka's own, in
/// C, are not counted; every Rust loop makes those alike).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Keys of the throughput backlog by default (the sum keeps one running
/// sum each).
const KEYS: usize = 10_000;

/// How many distinct keys the backlog cycles through: `BENCH_KEYS` (0, or
/// `distinct`, for a key of its own on every record, as when each record
/// creates an entity), else [`KEYS`].
fn keys(n: usize) -> Result<usize> {
    match std::env::var("BENCH_KEYS").as_deref() {
        Err(_) => Ok(KEYS),
        Ok("distinct" | "0") => Ok(n.max(1)),
        Ok(k) => match k.parse::<usize>() {
            Ok(k) => Ok(k),
            Err(e) => Err(format!("BENCH_KEYS={k}: {e}").into()),
        },
    }
}

/// Records each latency run writes and waits for before measuring (the
/// loop has its partition and its first transactions behind it).
const WARMUP: usize = 200;

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("tp-{prefix}-{nanos}")
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A record's value: its send time in microseconds (20 digits), then its
/// index (44 digits).
fn value(sent: u64, index: usize) -> String {
    format!("{sent:020}{index:044}")
}

/// Who does the work.
#[derive(Clone, Copy, PartialEq)]
enum Runner {
    Plain,
    Parsley,
    /// The Kafka Streams peer, with its store kind.
    Peer(&'static str),
}

/// One loop and its work.
#[derive(Clone, Copy)]
struct Loop {
    name: &'static str,
    sum: bool,
    runner: Runner,
    /// A Parsley stage without a state directory (`state_dir: None`): the
    /// fold state in memory only, for the local file's cost.
    no_file: bool,
}

/// One loop as a round runs it: with this build's child loops, or (in a
/// comparison, `BENCH_BUILDS`) another build's.
#[derive(Clone)]
struct Contestant {
    name: String,
    work: Loop,
    /// The executable whose `--child` runs a Rust loop: this one, or a
    /// build named in `BENCH_BUILDS`.
    exe: std::path::PathBuf,
    /// The build's label in a comparison.
    build: Option<String>,
}

impl Contestant {
    /// The name prefix of the threads that run the loop's own work (for
    /// Parsley, the stream threads: the state-file writer's
    /// `parsley-state` is counted apart).
    fn thread_prefix(&self) -> &'static str {
        match self.work.runner {
            Runner::Plain => "plain-loop",
            Runner::Parsley => "parsley-",
            Runner::Peer(_) => "ks-StreamThread",
        }
    }
}

/// The builds a comparison runs (`BENCH_BUILDS=LABEL=PATH,LABEL=PATH`,
/// each PATH a build of this example, of any revision whose child loops
/// speak the same `--child` arguments): every Rust loop runs once per
/// build in each round, on the same backlog and broker, measured by this
/// process alike. Empty without the variable.
fn builds() -> Result<Vec<(String, std::path::PathBuf)>> {
    let Ok(list) = std::env::var("BENCH_BUILDS") else {
        return Ok(Vec::new());
    };
    list.split(',')
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let (label, path) = b
                .split_once('=')
                .ok_or_else(|| format!("BENCH_BUILDS: {b:?} is not LABEL=PATH"))?;
            Ok((
                label.trim().to_owned(),
                std::path::PathBuf::from(path.trim()),
            ))
        })
        .collect()
}

const LOOPS: &[Loop] = &[
    Loop {
        name: "copy: plain rdkafka loop",
        sum: false,
        runner: Runner::Plain,
        no_file: false,
    },
    Loop {
        name: "copy: parsley stage",
        sum: false,
        runner: Runner::Parsley,
        no_file: false,
    },
    Loop {
        name: "copy: kafka streams",
        sum: false,
        runner: Runner::Peer("memory"),
        no_file: false,
    },
    Loop {
        name: "sum: parsley stage",
        sum: true,
        runner: Runner::Parsley,
        no_file: false,
    },
    Loop {
        name: "sum: parsley, no state file",
        sum: true,
        runner: Runner::Parsley,
        no_file: true,
    },
    Loop {
        name: "sum: kafka streams, in-memory",
        sum: true,
        runner: Runner::Peer("memory"),
        no_file: false,
    },
    Loop {
        name: "sum: kafka streams, rocksdb",
        sum: true,
        runner: Runner::Peer("rocksdb"),
        no_file: false,
    },
];

/// Settings every run shares.
struct Bench {
    base: ClientConfig,
    cluster: KafkaCluster,
    peer: Option<String>,
    commit: Duration,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child::run(&args[1..]);
    }
    let bootstrap = args
        .first()
        .ok_or("usage: throughput BOOTSTRAP [RECORDS [RATE SECONDS COMMIT_MS [ROUNDS]]]")?;
    let n: usize = args.get(1).map_or(Ok(300_000), |s| s.parse())?;
    let rate: u64 = args.get(2).map_or(Ok(500), |s| s.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(10), |s| s.parse())?;
    let commit = Duration::from_millis(args.get(4).map_or(Ok(100), |s| s.parse())?);
    let rounds: usize = args.get(5).map_or(Ok(3), |s| s.parse())?;
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", bootstrap);
    let bench = Bench {
        cluster: KafkaCluster::new(&base, Duration::from_secs(30))?,
        base,
        peer: std::env::var("KSTREAMS_PEER")
            .ok()
            .filter(|p| !p.is_empty()),
        commit,
    };
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let builds = builds()?;
    let this = std::env::current_exe()?;
    let mut contestants: Vec<Contestant> = Vec::new();
    for work in LOOPS
        .iter()
        .copied()
        .filter(|c| bench.peer.is_some() || !matches!(c.runner, Runner::Peer(_)))
        .filter(|c| only.is_empty() || only.split(',').any(|o| c.name.contains(o.trim())))
    {
        if builds.is_empty() || !matches!(work.runner, Runner::Parsley) {
            contestants.push(Contestant {
                name: work.name.to_owned(),
                work,
                exe: this.clone(),
                build: None,
            });
            continue;
        }
        for (label, exe) in &builds {
            contestants.push(Contestant {
                name: format!("{} [{label}]", work.name),
                work,
                exe: exe.clone(),
                build: Some(label.clone()),
            });
        }
    }
    if bench.peer.is_none() {
        println!("KSTREAMS_PEER is not set: the Kafka Streams peer does not run");
    }

    let input = unique("in");
    create_topics(&bench.cluster, &[&input])?;
    let keys = keys(n)?;
    write_backlog(&bench.base, &input, n, keys)?;
    println!("throughput: {n} records, {keys} keys, {rounds} rounds, commits every {commit:?}");
    let mut figures: Vec<Vec<Throughput>> = vec![Vec::new(); contestants.len()];
    for round in 0..rounds {
        for k in 0..contestants.len() {
            let i = (round + k) % contestants.len();
            let f = throughput(&bench, &contestants[i], &input, n)?;
            println!("  round {}: {:<36} {}", round + 1, contestants[i].name, f);
            figures[i].push(f);
        }
    }
    println!();
    println!(
        "{:<36} {:>12} {:>12} {:>12} {:>9} {:>13} {:>10} {:>10}",
        "median over rounds",
        "records/s",
        "µs CPU/rec",
        "thread µs",
        "allocs",
        "peak RSS",
        "client µs",
        "writer µs"
    );
    let medians: Vec<Throughput> = figures.iter().map(|f| Throughput::median(f)).collect();
    for (c, f) in contestants.iter().zip(&medians) {
        println!("{:<36} {}", c.name, f);
    }
    if builds.is_empty() {
        print_ratios(&contestants, &medians);
    } else {
        print_build_ratios(&contestants, &medians);
    }
    drop_topics(&bench.cluster, &input, &[]);
    if seconds == 0 {
        return Ok(());
    }

    println!();
    println!(
        "latency: {rate} records/s for {seconds} s, commits every {commit:?}, {rounds} rounds"
    );
    let measured = usize::try_from(rate * seconds)?;
    let mut trips: Vec<Vec<Trip>> = vec![Vec::new(); contestants.len()];
    for round in 0..rounds {
        for k in 0..contestants.len() {
            let i = (round + k) % contestants.len();
            let t = latency(&bench, &contestants[i], measured, rate)?;
            println!(
                "  round {}: {:<36} median {:>7.2} ms",
                round + 1,
                contestants[i].name,
                percentile(&mut t.iter().map(|t| t.total).collect::<Vec<_>>(), 0.5)
            );
            trips[i].extend(t);
        }
    }
    println!();
    println!(
        "{:<36} {:>8} {:>8} {:>8}   {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)",
        "median",
        "p90",
        "p99",
        "to logic",
        "to commit",
        "offs+acks",
        "(offsets",
        "acks)",
        "end txn",
        "to reader"
    );
    for (c, t) in contestants.iter().zip(&mut trips) {
        let col = |f: fn(&Trip) -> f64| percentile(&mut t.iter().map(f).collect::<Vec<_>>(), 0.5);
        let mut totals: Vec<f64> = t.iter().map(|t| t.total).collect();
        println!(
            "{:<36} {:>8.2} {:>8.2} {:>8.2}   {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            c.name,
            percentile(&mut totals, 0.5),
            percentile(&mut totals, 0.9),
            percentile(&mut totals, 0.99),
            col(|t| t.to_logic),
            col(|t| t.to_commit),
            col(|t| t.offsets_and_acks),
            col(|t| t.offsets),
            col(|t| t.acks),
            col(|t| t.end_txn),
            col(|t| t.to_reader),
        );
    }
    println!(
        "(breakdown columns are medians of each step: send to the loop's logic, then to the start of the commit that carries it, \
the commit's offsets, produce and acknowledgements (of which: up to the offsets' acknowledgement, and the wait for the records' \
acknowledgements after it; zero and all of it for a loop that does not say), its EndTxn, and from the commit's end to the reader)"
    );
    Ok(())
}

/// The ratios the stateful path's goals are stated in (issue 43), from
/// the medians of whichever loops ran.
fn print_ratios(contestants: &[Contestant], medians: &[Throughput]) {
    let find = |name: &str| {
        contestants
            .iter()
            .position(|c| c.name == name)
            .map(|i| medians[i])
    };
    let copy = find("copy: parsley stage");
    let sum = find("sum: parsley stage");
    let nofile = find("sum: parsley, no state file");
    let ks_copy = find("copy: kafka streams");
    // Kafka Streams' faster store in this run.
    let ks_sum = [
        find("sum: kafka streams, in-memory"),
        find("sum: kafka streams, rocksdb"),
    ]
    .into_iter()
    .flatten()
    .max_by(|a, b| a.rate.total_cmp(&b.rate));
    println!();
    let pair = |what: &str, a: Option<Throughput>, b: Option<Throughput>| {
        if let (Some(a), Some(b)) = (a, b) {
            println!(
                "{what:<44} rate {:>5.2}x   CPU per record {:>5.2}x",
                a.rate / b.rate,
                a.cpu_us / b.cpu_us
            );
        }
    };
    pair("sum vs Kafka Streams' faster store", sum, ks_sum);
    pair("copy vs Kafka Streams", copy, ks_copy);
    pair("sum vs copy (Parsley)", sum, copy);
    if let (Some(s), Some(n)) = (sum, nofile) {
        println!(
            "{:<44} {:>+.2} µs CPU per record",
            "the state file's cost (sum - no file)",
            s.cpu_us - n.cpu_us
        );
    }
}

/// In a comparison, each later build's figures against the first's, loop
/// by loop (`b/a` below 1 is faster or cheaper for CPU and allocations).
fn print_build_ratios(contestants: &[Contestant], medians: &[Throughput]) {
    println!();
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ratio to the first build", "rate", "CPU/rec", "thread", "client", "writer", "allocs"
    );
    let ratio = |b: Option<f64>, a: Option<f64>| match (b, a) {
        (Some(b), Some(a)) if a > 0.0 => format!("{:.3}", b / a),
        _ => "n/a".to_owned(),
    };
    for (i, c) in contestants.iter().enumerate() {
        let Some(first) = contestants
            .iter()
            .position(|f| f.work.name == c.work.name && f.build.is_some())
        else {
            continue;
        };
        if first == i {
            continue;
        }
        let (b, a) = (medians[i], medians[first]);
        println!(
            "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            c.name,
            ratio(Some(b.rate), Some(a.rate)),
            ratio(Some(b.cpu_us), Some(a.cpu_us)),
            ratio(b.thread_cpu_us, a.thread_cpu_us),
            ratio(b.client_cpu_us, a.client_cpu_us),
            ratio(b.writer_cpu_us, a.writer_cpu_us),
            ratio(b.allocations, a.allocations),
        );
    }
}

/// Deletes a finished run's topics (`names`, and the internal topics of
/// the application `app_id`), so that the broker's logs stay the size of
/// one run and later rounds do not pay for earlier ones' segments. A
/// failure only leaves them behind.
fn drop_topics(cluster: &KafkaCluster, app_id: &str, names: &[&str]) {
    let mut doomed: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    // Kafka Streams names its internal topics after the application id
    // too.
    if let Ok(m) = cluster
        .admin()
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
    {
        doomed.extend(
            m.topics()
                .iter()
                .map(|t| t.name())
                .filter(|n| n.starts_with(app_id))
                .map(str::to_owned),
        );
    }
    let doomed: Vec<&str> = doomed.iter().map(String::as_str).collect();
    if let Err(e) = block_on(cluster.admin().delete_topics(&doomed, &AdminOptions::new())) {
        eprintln!("the run's topics were not deleted: {e}");
    }
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

/// Whether the backlog's records carry causal headers
/// (`STAMPED_INPUT=1`), as records an upstream stage wrote do: a clock
/// claiming one offset on a channel the loops do not read, and a sender tag
/// with its sequence. A stage then decodes each stamp and carries the claim
/// into its own; the plain loop ignores the headers.
fn stamped_input() -> bool {
    std::env::var_os("STAMPED_INPUT").is_some_and(|v| v == "1")
}

fn write_backlog(base: &ClientConfig, input: &str, n: usize, keys: usize) -> Result<()> {
    use parsley_protocol::{CausalHeaders, Channel, SenderId, SenderTag, TopicId, VectorClock};
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: BaseProducer = base.create()?;
    let stamped = stamped_input();
    let upstream = Channel::new(TopicId::from_u128(0x0b5e_55ed), 0);
    let sender = SenderId::from_u128(0x5eed);
    for i in 0..n {
        let key = format!("k{}", i % keys);
        let value = value(0, i);
        let mut record = BaseRecord::to(input).partition(0).key(&key).payload(&value);
        if stamped {
            let mut clock = VectorClock::new();
            clock.claim_offset(upstream, i as i64);
            let stamp = CausalHeaders {
                clock,
                sender: Some(SenderTag {
                    sender,
                    seq: i as i64 + 1,
                }),
            };
            let mut headers = OwnedHeaders::new_with_capacity(3);
            for (name, bytes) in stamp.encode() {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(&bytes),
                });
            }
            record = record.headers(headers);
        }
        send_when_room(&producer, record);
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// A loop running in its own process.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    state_dir: Option<std::path::PathBuf>,
    /// The loop's application id: its internal topics start with it.
    app_id: String,
}

impl Running {
    /// Starts `c`'s loop from `input` to `output`, writing its timing
    /// file to `timing` if given, and waits until it says it runs.
    fn start(
        bench: &Bench,
        c: &Contestant,
        input: &str,
        output: &str,
        timing: Option<&str>,
    ) -> Result<Running> {
        let bootstrap = bench
            .base
            .get("bootstrap.servers")
            .ok_or("no bootstrap")?
            .to_owned();
        let commit_ms = bench.commit.as_millis().to_string();
        let app_id = unique("app");
        let timing = timing.unwrap_or("-").to_owned();
        let mut state_dir = None;
        let work = c.work;
        let mut cmd = match work.runner {
            Runner::Plain | Runner::Parsley => {
                let kind = match (work.runner, work.sum, work.no_file) {
                    (Runner::Plain, _, _) => "plain-copy",
                    (_, false, _) => "parsley-copy",
                    (_, true, false) => "parsley-sum",
                    (_, true, true) => "parsley-sum-nofile",
                };
                let mut cmd = Command::new(&c.exe);
                cmd.args(["--child", kind, &bootstrap, input, output])
                    .args([&commit_ms, &app_id, &timing]);
                cmd
            }
            Runner::Peer(store) => {
                let dir = std::env::temp_dir().join(unique("ks-state"));
                let mut cmd = Command::new(bench.peer.as_deref().ok_or("no peer")?);
                cmd.args([&bootstrap, input, output])
                    .args([
                        if work.sum { "sum" } else { "copy" },
                        store,
                        &commit_ms,
                        &app_id,
                    ])
                    .arg(&dir)
                    .arg(&timing);
                state_dir = Some(dir);
                cmd
            }
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let running = Running {
            child,
            stdin,
            lines,
            state_dir,
            app_id,
        };
        running.wait_for("RUNNING", Duration::from_secs(120))?;
        Ok(running)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the line `want`, returning the lines before it.
    fn wait_for(&self, want: &str, timeout: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == want => return Ok(before),
                Ok(l) => before.push(l),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("the loop did not print {want} within {timeout:?}").into());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the loop exited before it printed {want}").into());
                }
            }
        }
    }

    /// Closes the loop's standard input, waits until it closed, and
    /// returns what it printed on the way.
    fn stop(mut self) -> Result<Vec<String>> {
        drop(self.stdin.take());
        let lines = self.wait_for("CLOSED", Duration::from_secs(60));
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("the loop did not exit".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(dir) = &self.state_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        let lines = lines?;
        if !status.success() {
            return Err(format!("the loop exited with {status}").into());
        }
        Ok(lines)
    }
}

/// The name of the Parsley state-file writer's thread.
const WRITER_THREAD: &str = "parsley-state";

/// One throughput run's figures.
#[derive(Clone, Copy, Default)]
struct Throughput {
    rate: f64,
    cpu_us: f64,
    thread_cpu_us: Option<f64>,
    /// librdkafka's threads (`rdk:*`), for the Rust loops.
    client_cpu_us: Option<f64>,
    /// The state-file writer's thread (`parsley-state`), for the stateful
    /// Parsley loop with a state directory.
    writer_cpu_us: Option<f64>,
    allocations: Option<f64>,
    peak_rss: Option<u64>,
}

impl Throughput {
    fn median(runs: &[Throughput]) -> Throughput {
        let med = |f: &dyn Fn(&Throughput) -> Option<f64>| {
            let mut v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| percentile(&mut v, 0.5))
        };
        Throughput {
            rate: med(&|t| Some(t.rate)).unwrap_or(0.0),
            cpu_us: med(&|t| Some(t.cpu_us)).unwrap_or(0.0),
            thread_cpu_us: med(&|t| t.thread_cpu_us),
            client_cpu_us: med(&|t| t.client_cpu_us),
            writer_cpu_us: med(&|t| t.writer_cpu_us),
            allocations: med(&|t| t.allocations),
            peak_rss: med(&|t| t.peak_rss.map(|r| r as f64)).map(|r| r as u64),
        }
    }
}

impl std::fmt::Display for Throughput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |v: Option<f64>, d: usize| v.map_or("n/a".to_owned(), |v| format!("{v:.d$}"));
        // The columns after the peak RSS came later: a script that reads
        // older builds' lines finds the first ones where they always were.
        write!(
            f,
            "{:>12.0} {:>12.2} {:>12} {:>9} {:>9.1} MiB {:>10} {:>10}",
            self.rate,
            self.cpu_us,
            opt(self.thread_cpu_us, 2),
            opt(self.allocations, 1),
            self.peak_rss.map_or(0.0, |r| r as f64 / (1024.0 * 1024.0)),
            opt(self.client_cpu_us, 2),
            opt(self.writer_cpu_us, 2),
        )
    }
}

/// Runs `c` over the backlog in `input` and measures it in steady state.
fn throughput(bench: &Bench, c: &Contestant, input: &str, n: usize) -> Result<Throughput> {
    let output = unique("out");
    create_topics(&bench.cluster, &[&output])?;
    let reader = ready_reader(&bench.base, &output)?;
    let run = Running::start(bench, c, input, &output, None)?;
    let pid = run.pid();
    let sample = || {
        (
            Instant::now(),
            procfs::process_cpu(pid),
            procfs::thread_cpu(pid, c.thread_prefix()),
            procfs::thread_cpu(pid, "rdk:"),
            procfs::thread_cpu(pid, WRITER_THREAD),
        )
    };
    let tenth = n / 10;
    let mut from = None;
    let mut profile = None;
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen < n {
        if Instant::now() > deadline {
            return Err(format!("{}: only {seen} of {n} records arrived", c.name).into());
        }
        if let Some(m) = reader.poll(Duration::from_millis(100)) {
            m?;
            seen += 1;
            if seen == tenth {
                from = Some(sample());
                if matches!(c.work.runner, Runner::Parsley) {
                    profile = Profile::start(c, pid)?;
                }
            }
        }
    }
    let to = sample();
    if let Some(p) = profile.take() {
        p.stop()?;
    }
    let peak_rss = procfs::peak_rss(pid);
    let app_id = run.app_id.clone();
    let lines = run.stop()?;
    drop_topics(&bench.cluster, &app_id, &[&output]);
    let (t0, cpu0, th0, rdk0, state0) = from.ok_or("too few records to time")?;
    let records = (n - tenth) as f64;
    let per = |a: Option<Duration>, b: Option<Duration>| {
        Some(b?.saturating_sub(a?).as_secs_f64() * 1e6 / records)
    };
    let allocations = lines.iter().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == "ALLOCATIONS").then_some(())?;
        let a: f64 = w.next()?.parse().ok()?;
        (w.next()? == "RECORDS").then_some(())?;
        let r: f64 = w.next()?.parse().ok()?;
        (r > 0.0).then(|| a / r)
    });
    Ok(Throughput {
        rate: records / to.0.duration_since(t0).as_secs_f64(),
        cpu_us: per(cpu0, to.1).unwrap_or(f64::NAN),
        // The writer's thread shares the stream threads' prefix: its
        // time is taken out of theirs.
        thread_cpu_us: match (per(th0, to.2), per(state0, to.4)) {
            (Some(t), Some(w)) if matches!(c.work.runner, Runner::Parsley) => Some(t - w),
            (t, _) => t,
        },
        client_cpu_us: per(rdk0, to.3),
        writer_cpu_us: per(state0, to.4),
        allocations,
        peak_rss,
    })
}

/// A `perf record` of a Parsley loop over the steady window of a
/// throughput run, when `BENCH_PERF_DIR` names a directory for the
/// profiles (one file per loop and run; `BENCH_PERF_ARGS` adds options,
/// e.g. `--call-graph dwarf`). Read one thread by thread with
/// `perf report -i FILE --sort comm,dso,sym`. Allocations are counted
/// where they are made with a malloc probe (`perf probe -x
/// /lib/x86_64-linux-gnu/libc.so.6 malloc`, then `BENCH_PERF_ARGS="-e
/// probe_libc:malloc -c 1 --call-graph dwarf"`).
struct Profile(Child);

impl Profile {
    fn start(c: &Contestant, pid: u32) -> Result<Option<Profile>> {
        let Some(dir) = std::env::var_os("BENCH_PERF_DIR") else {
            return Ok(None);
        };
        std::fs::create_dir_all(&dir)?;
        let slug: String = c
            .name
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '-' })
            .collect();
        let file = std::path::Path::new(&dir).join(format!("{}.data", unique(&slug)));
        let extra = std::env::var("BENCH_PERF_ARGS").unwrap_or_default();
        // A count of its own (`-c 1` with an event such as a malloc
        // probe) replaces the sampling frequency.
        let frequency: &[&str] = if extra.split_whitespace().any(|a| a == "-c") {
            &[]
        } else {
            &["-F", "499"]
        };
        let child = Command::new("perf")
            .args(["record", "-q"])
            .args(frequency)
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&file)
            .args(extra.split_whitespace())
            .stdout(Stdio::null())
            .spawn()?;
        println!("  profiling {} into {}", c.name, file.display());
        Ok(Some(Profile(child)))
    }

    /// Ends the recording (perf writes its file on SIGINT).
    fn stop(mut self) -> Result<()> {
        Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status()?;
        self.0.wait()?;
        Ok(())
    }
}

/// One record's trip, in milliseconds.
#[derive(Clone, Copy)]
struct Trip {
    total: f64,
    to_logic: f64,
    to_commit: f64,
    offsets_and_acks: f64,
    /// Of those, the commit's own records and the offsets (up to the
    /// offsets' acknowledgement), and the wait for the records'
    /// acknowledgements after it.
    offsets: f64,
    acks: f64,
    end_txn: f64,
    to_reader: f64,
}

/// Starts `c` on fresh topics, warms it up, then writes `measured` records
/// at `rate` per second and times each one's way through.
fn latency(bench: &Bench, c: &Contestant, measured: usize, rate: u64) -> Result<Vec<Trip>> {
    let (input, output) = (unique("lin"), unique("lout"));
    create_topics(&bench.cluster, &[&input, &output])?;
    let mut rc = bench.base.clone();
    rc.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"))
        .set("fetch.wait.max.ms", "1");
    let reader: BaseConsumer = rc.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&output, 0, Offset::Beginning)?;
    reader.assign(&tpl)?;
    let timing = std::env::temp_dir().join(unique("timing"));
    let timing_path = timing.to_str().ok_or("temp path")?.to_owned();
    let run = Running::start(bench, c, &input, &output, Some(&timing_path))?;

    let mut p = bench.base.clone();
    p.set("linger.ms", "0");
    let producer: BaseProducer = p.create()?;
    let send = |i: usize| -> Result<u64> {
        let sent = now_micros();
        producer
            .send(
                BaseRecord::to(&input)
                    .partition(0)
                    .key(&format!("k{}", i % 100))
                    .payload(&value(sent, i)),
            )
            .map_err(|(e, _)| e)?;
        producer.poll(Duration::ZERO);
        Ok(sent)
    };
    // Each output's send time and the time it became visible.
    let read = |n: usize, out: &mut Vec<(u64, u64)>| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = 0;
        while seen < n {
            if Instant::now() > deadline {
                return Err(format!("{}: only {seen} of {n} records came through", c.name).into());
            }
            if let Some(m) = reader.poll(Duration::from_millis(1)) {
                let m = m?;
                let seen_at = now_micros();
                let sent: u64 = m
                    .payload()
                    .and_then(|p| std::str::from_utf8(p.get(..20)?).ok())
                    .and_then(|s| s.parse().ok())
                    .ok_or("an output without its send time")?;
                out.push((sent, seen_at));
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
    let mut arrivals = Vec::with_capacity(measured);
    let sent = std::thread::scope(|s| -> Result<Vec<u64>> {
        let writer = s.spawn(|| -> std::result::Result<Vec<u64>, String> {
            let started = Instant::now();
            let mut sent = Vec::with_capacity(measured);
            for i in 0..measured {
                let due = started + Duration::from_micros(i as u64 * 1_000_000 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                sent.push(send(WARMUP + i).map_err(|e| e.to_string())?);
            }
            producer
                .flush(Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
            Ok(sent)
        });
        read(measured, &mut arrivals)?;
        Ok(writer.join().map_err(|_| "the writer panicked")??)
    })?;
    let app_id = run.app_id.clone();
    run.stop()?;
    drop_topics(&bench.cluster, &app_id, &[&input, &output]);
    let timing = Timing::read(&timing)?;
    let _ = std::fs::remove_file(&timing_path);
    let index_of: HashMap<u64, usize> = sent
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, WARMUP + i))
        .collect();
    let ms = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1000.0;
    let mut trips = Vec::with_capacity(arrivals.len());
    for (sent, seen) in arrivals {
        let index = index_of
            .get(&sent)
            .ok_or("an output whose send time was never sent")?;
        let delivered = *timing
            .delivered
            .get(index)
            .ok_or_else(|| format!("{}: no delivery time for record {index}", c.name))?;
        let commit = timing
            .commit_after(delivered)
            .ok_or_else(|| format!("{}: no commit after record {index}", c.name))?;
        trips.push(Trip {
            total: ms(sent, seen),
            to_logic: ms(sent, delivered),
            to_commit: ms(delivered, commit.start),
            offsets_and_acks: ms(commit.start, commit.sent),
            offsets: ms(commit.start, commit.offsets),
            acks: ms(commit.offsets, commit.sent),
            end_txn: ms(commit.sent, commit.end),
            to_reader: ms(commit.end, seen),
        });
    }
    Ok(trips)
}

/// One commit's times, in microseconds.
#[derive(Clone, Copy)]
struct Commit {
    start: u64,
    /// The offsets were sent (the start, for a loop that does not say).
    offsets: u64,
    sent: u64,
    end: u64,
}

/// A loop's timing file.
struct Timing {
    /// When the loop's logic got each record (the last time, if twice).
    delivered: HashMap<usize, u64>,
    /// Commits in the order they started.
    commits: Vec<Commit>,
}

impl Timing {
    fn read(path: &std::path::Path) -> Result<Timing> {
        let text = std::fs::read_to_string(path)?;
        let mut delivered = HashMap::new();
        let mut commits = Vec::new();
        let mut open: Option<(u64, Option<u64>)> = None;
        let mut offsets_at = None;
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["d", i, at] => {
                    delivered.insert(i.parse()?, at.parse()?);
                }
                ["cs", at] => open = Some((at.parse()?, None)),
                ["co", at] => offsets_at = Some(at.parse()?),
                ["ct", at] => {
                    if let Some((_, sent)) = open.as_mut() {
                        *sent = Some(at.parse()?);
                    }
                }
                ["ce", at] => {
                    if let Some((start, sent)) = open.take() {
                        let end = at.parse()?;
                        commits.push(Commit {
                            start,
                            offsets: offsets_at.take().unwrap_or(start),
                            sent: sent.unwrap_or(end),
                            end,
                        });
                    }
                }
                _ => return Err(format!("a timing line not understood: {line:?}").into()),
            }
        }
        Ok(Timing { delivered, commits })
    }

    /// The first commit that started after `at`: the one that carried a
    /// record delivered then (each loop commits on the thread that
    /// delivers).
    fn commit_after(&self, at: u64) -> Option<Commit> {
        let i = self.commits.partition_point(|c| c.start < at);
        self.commits.get(i).copied()
    }
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

/// The `q` quantile of `v` (sorted in place); NaN when empty.
fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}
