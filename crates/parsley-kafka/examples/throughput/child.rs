//! The Rust loops, each run in a process of its own (`throughput --child
//! KIND ...`) so that its CPU and peak memory are its own: the plain
//! rdkafka exactly-once loop and the Parsley stages (a copy and a per-key
//! sum).
//!
//! A child prints `RUNNING` once its loop is started, runs until its
//! standard input closes, then prints `ALLOCATIONS <n> RECORDS <m>` (the
//! Rust allocations of the whole process over the records its loop
//! handled) and `CLOSED`. With a timing file it writes one line per event
//! there as it closes: `d INDEX MICROS` when the loop's logic got record
//! INDEX, and for each transaction `cs MICROS` (the commit starts),
//! `ct MICROS` (the commit request is sent) and `ce MICROS` (committed).
//! The Kafka Streams peer writes the same lines.

use std::fmt::Debug;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley::{Codec, Message, Parsley, Stage, Step, Topic};
use parsley_kafka::{CausalStreams, StreamsOptions, StreamsState};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use stats_alloc::Region;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::{GLOBAL, Result, now_micros};

/// One event of a record's trip, as the timing file spells it.
#[derive(Clone, Copy)]
enum Mark {
    Delivered(u64),
    CommitStart,
    OffsetsSent,
    CommitSent,
    CommitEnd,
}

/// The events a loop records when it has a timing file.
#[derive(Default)]
pub(crate) struct Marks {
    on: bool,
    lines: Mutex<Vec<(Mark, u64)>>,
}

impl Marks {
    fn mark(&self, m: Mark) {
        if self.on {
            let at = now_micros();
            self.lines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((m, at));
        }
    }

    /// Notes that the loop's logic got the record whose value is `value`
    /// (its index is characters 20 to 64).
    fn delivered(&self, value: Option<&[u8]>) {
        if self.on
            && let Some(index) = value
                .and_then(|v| std::str::from_utf8(v.get(20..)?).ok())
                .and_then(|s| s.parse().ok())
        {
            self.mark(Mark::Delivered(index));
        }
    }

    fn write(&self, path: &str) -> Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (m, at) in self.lines.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            match m {
                Mark::Delivered(i) => writeln!(out, "d {i} {at}")?,
                Mark::CommitStart => writeln!(out, "cs {at}")?,
                Mark::OffsetsSent => writeln!(out, "co {at}")?,
                Mark::CommitSent => writeln!(out, "ct {at}")?,
                Mark::CommitEnd => writeln!(out, "ce {at}")?,
            }
        }
        out.flush()?;
        Ok(())
    }
}

/// Runs one loop: `KIND BOOTSTRAP INPUT OUTPUT COMMIT_MS APP_ID TIMING_FILE`,
/// KIND one of `plain-copy`, `parsley-copy`, `parsley-sum`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let [kind, bootstrap, input, output, commit_ms, app_id, timing] = args else {
        return Err(
            "usage: throughput --child KIND BOOTSTRAP INPUT OUTPUT COMMIT_MS APP_ID TIMING_FILE"
                .into(),
        );
    };
    let commit = Duration::from_millis(commit_ms.parse()?);
    let marks = Arc::new(Marks {
        on: timing != "-",
        ..Marks::default()
    });
    // Warnings and errors of the runtime reach the benchmark's terminal;
    // with a timing file, the runtime's commit steps are marked too.
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(LevelFilter::WARN),
        )
        .with(
            CommitMarks(marks.clone())
                .with_filter(Targets::new().with_target("parsley_kafka::streams", Level::DEBUG)),
        );
    tracing::subscriber::set_global_default(subscriber)?;
    // The parent closes standard input to stop the loop.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", bootstrap);
    if let Ok(l) = std::env::var("BENCH_LINGER") {
        base.set("linger.ms", l);
    }
    let region = Region::new(GLOBAL);
    let records = match kind.as_str() {
        "plain-copy" => {
            let (b, i, o, m, s) = (
                base.clone(),
                input.clone(),
                output.clone(),
                marks.clone(),
                stop.clone(),
            );
            std::thread::Builder::new()
                .name("plain-loop".to_owned())
                .spawn(move || plain_loop(&b, &i, &o, commit, &m, &s).map_err(|e| e.to_string()))?
                .join()
                .map_err(|_| "the plain loop panicked")??
        }
        "parsley-copy" | "parsley-sum" | "parsley-sum-nofile" => {
            let counter = Arc::new(AtomicU64::new(0));
            let sum = kind != "parsley-copy";
            let defaults = StreamsOptions::default();
            let app = stage_app(sum, app_id, input, output, &counter, &marks)?;
            let mut streams = CausalStreams::new(&app, base)?.with_options(StreamsOptions {
                instance_id: Some("bench".to_owned()),
                commit_interval: commit,
                // `BENCH_FOLD_CACHE=none` keeps the whole fold state in
                // memory (the cache off), for comparison.
                fold_cache: match std::env::var("BENCH_FOLD_CACHE").as_deref() {
                    Ok("none") => None,
                    _ => defaults.fold_cache,
                },
                // `BENCH_COMMIT_WHEN_IDLE=MS` commits once the fetch is
                // drained and MS have passed since the last commit; `off`
                // commits every interval only; unset, the default.
                commit_when_idle: match std::env::var("BENCH_COMMIT_WHEN_IDLE").as_deref() {
                    Ok("off") => None,
                    Ok(ms) => Some(Duration::from_millis(ms.parse()?)),
                    Err(_) => defaults.commit_when_idle,
                },
                // The no-file loop keeps its fold state in memory only.
                state_dir: if kind == "parsley-sum-nofile" {
                    None
                } else {
                    defaults.state_dir.clone()
                },
                ..defaults
            });
            streams.start()?;
            ready();
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                if let StreamsState::Failed(e) = streams.state() {
                    return Err(format!("the stage failed: {e}").into());
                }
            }
            streams.close(Duration::from_secs(30))?;
            counter.load(Ordering::SeqCst)
        }
        other => return Err(format!("unknown loop {other:?}").into()),
    };
    println!(
        "ALLOCATIONS {} RECORDS {records}",
        region.change().allocations
    );
    if marks.on {
        marks.write(timing)?;
    }
    println!("CLOSED");
    Ok(())
}

fn ready() {
    println!("RUNNING");
    let _ = std::io::stdout().flush();
}

fn utf8_topic(name: &str) -> Topic<String, String> {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// The Parsley side: one stage copying each record of `input` to
/// `output`, or (`sum`) one keeping a running sum per key (of the last 12
/// digits of each value's index) and writing it on every record: the
/// value's 20-digit send time, then the sum in 44 digits.
fn stage_app(
    sum: bool,
    app_id: &str,
    input: &str,
    output: &str,
    counter: &Arc<AtomicU64>,
    marks: &Arc<Marks>,
) -> Result<Parsley> {
    let (src, dst) = (utf8_topic(input), utf8_topic(output));
    let (counter, marks) = (counter.clone(), marks.clone());
    let seen = move |m: &Message<String, String>| {
        counter.fetch_add(1, Ordering::Relaxed);
        marks.delivered(m.value().map(String::as_bytes));
    };
    let stage = if sum {
        let mut stage = Stage::named("sum").state(Codec::int64(), || 0);
        let out = stage.add_sink(&dst);
        stage
            .fold_owned(&src, move |sum: i64, m: Message<String, String>| {
                seen(&m);
                let v = m.value().map_or("", String::as_str);
                let n: i64 = v.get(52..).and_then(|t| t.parse().ok()).unwrap_or(0);
                let sum = sum + n;
                let sent = v.get(..20).unwrap_or("00000000000000000000");
                let value = format!("{sent}{sum:044}");
                Step::to(sum).emit(out.send(m.into_key_value().0, value))
            })
            .build()?
    } else {
        let out = dst.clone();
        Stage::named("copy")
            .on_owned(&src, move |m: Message<String, String>| {
                seen(&m);
                let (key, value) = m.into_key_value();
                out.send(key, value)
            })
            .sink(&dst)
            .build()?
    };
    Ok(Parsley::named(app_id, [stage])?)
}

/// Whether the plain loop attaches headers of the sizes of a stage's stamp
/// to its outputs (`PLAIN_STAMP_SIZED_HEADERS=1`): a control run, to tell
/// what the stamp's bytes cost the broker apart from what the stage runtime
/// costs.
fn stamp_sized_headers() -> bool {
    std::env::var_os("PLAIN_STAMP_SIZED_HEADERS").is_some_and(|v| v == "1")
}

/// A plain exactly-once consume-transform-produce loop: transactions every
/// `commit`, offsets sent with the consumer's group metadata, until `stop`.
/// Before each commit it serves delivery reports in 1 ms waits until none
/// is outstanding, as a careful rdkafka user does: `commit_transaction`
/// alone waits in polls of 100 ms. Returns the records it handled.
fn plain_loop(
    base: &ClientConfig,
    input: &str,
    output: &str,
    commit: Duration,
    marks: &Marks,
    stop: &AtomicBool,
) -> Result<u64> {
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", crate::unique("plain"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[input])?;
    let mut p = base.clone();
    p.set("transactional.id", crate::unique("plain-txn"));
    let producer: BaseProducer = p.create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    ready();
    // Read once: an environment lookup per record would be the plain
    // loop's own cost.
    let stamp_headers = stamp_sized_headers();
    let mut done = 0u64;
    let mut next = None;
    let mut last_commit = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Some(m) = consumer.poll(Duration::from_millis(20)) {
            let m = m?;
            marks.delivered(m.payload());
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
            crate::send_when_room(&producer, record);
            next = Some(m.offset() + 1);
            done += 1;
        }
        if let Some(offset) = next
            && last_commit.elapsed() > commit
        {
            marks.mark(Mark::CommitStart);
            let mut offsets = TopicPartitionList::new();
            offsets.add_partition_offset(input, 0, Offset::Offset(offset))?;
            let metadata = consumer.group_metadata().ok_or("no group metadata")?;
            producer.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(30))?;
            marks.mark(Mark::OffsetsSent);
            while producer.in_flight_count() > 0 {
                producer.poll(Duration::from_millis(1));
            }
            marks.mark(Mark::CommitSent);
            producer.commit_transaction(Duration::from_secs(30))?;
            marks.mark(Mark::CommitEnd);
            producer.begin_transaction()?;
            next = None;
            last_commit = Instant::now();
        }
    }
    producer.abort_transaction(Duration::from_secs(30))?;
    Ok(done)
}

/// Marks the stream thread's commit steps from the runtime's DEBUG events.
struct CommitMarks(Arc<Marks>);

impl<S: Subscriber> Layer<S> for CommitMarks {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut message = MessageText(None);
        event.record(&mut message);
        let mark = match message.0.as_deref() {
            Some("transaction producing") => Mark::CommitStart,
            Some("transaction offsets sent") => Mark::OffsetsSent,
            Some("transaction ending") => Mark::CommitSent,
            Some("transaction committed") => Mark::CommitEnd,
            _ => return,
        };
        self.0.mark(mark);
    }
}

/// An event's message.
struct MessageText(Option<String>);

impl Visit for MessageText {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}
