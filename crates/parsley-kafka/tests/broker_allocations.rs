//! Allocations per record through the real Kafka host, counted: the copy
//! and the per-key sum of the throughput benchmark, with a key per record
//! and with keys that recur, must stay within the record path's budget
//! (issue 55): 4 allocations per record on the copy, 8 on the sum.
//!
//! Allocations are counted where times are not repeatable: a counting
//! allocator around the system one, for the whole process (the stream
//! thread, the state-file writer and everything else the runtime runs).
//! What a run costs besides its records (starting the instance, joining
//! the group, the first transaction, the commit at the close, leaving) is
//! taken out by running the same stage over two backlogs and dividing the
//! difference by the difference in records; each backlog runs twice and
//! the lesser count stands, since work that comes with time rather than
//! records (an idle poll, a metrics sample) can only add. Commits wait
//! for the close (a long interval), so a run's changelog records are all
//! in its final commit, and the larger backlog's extra keys are counted
//! with their changelog records and local store writes.
//!
//! One test in its own binary, so that nothing else allocates beside the
//! instances it counts. It needs a broker: it runs when `PARSLEY_BOOTSTRAP`
//! names one.

#[path = "../examples/shared/bench_util.rs"]
mod bench_util;
mod common;

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bench_util::send_when_room;
use common::{config, create_topics, unique};
use parsley::*;
use parsley_kafka::{CausalStreams, StreamsOptions};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The record path's budget (issue 55), in allocations per record.
const COPY_BUDGET: f64 = 4.0;
const SUM_BUDGET: f64 = 8.0;

/// What comes on top of the budget per batch rather than per record, at
/// most: a stamp buffer per 64 emissions, a list per hand-out of a poll's
/// records, librdkafka's delivery-report event (a list and a reference
/// count in rdkafka) per produce request. Two of the copy's four
/// allocations per record are rdkafka's own (the topic name as a C string
/// on every send, a reference count on every polled message), so the
/// copy's budget leaves no room for these.
const PER_BATCH: f64 = 0.1;

/// The two backlogs.
const SMALL: usize = 2_000;
const LARGE: usize = 10_000;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    Copy,
    Sum,
}

/// The benchmark's stages (`examples/throughput/child.rs`): a copy with
/// the owned handler, or a running sum per key of the value's last 12
/// digits, written on every record as 20 digits then the sum in 44.
fn app(work: Work, app_id: &str, input: &T, output: &T, seen: &Arc<AtomicU64>) -> Parsley {
    let seen = seen.clone();
    let stage = match work {
        Work::Copy => {
            let out = output.clone();
            Stage::named("copy")
                .on_owned(input, move |m: Message<String, String>| {
                    seen.fetch_add(1, Ordering::Relaxed);
                    let (key, value) = m.into_key_value();
                    out.send(key, value)
                })
                .sink(output)
                .build()
                .unwrap()
        }
        Work::Sum => {
            let mut stage = Stage::named("sum").state(Codec::int64(), || 0);
            let out = stage.add_sink(output);
            stage
                .fold_owned(input, move |sum: i64, m: Message<String, String>| {
                    seen.fetch_add(1, Ordering::Relaxed);
                    let v = m.value().map_or("", String::as_str);
                    let n: i64 = v.get(52..).and_then(|t| t.parse().ok()).unwrap_or(0);
                    let sum = sum + n;
                    let sent = v.get(..20).unwrap_or("00000000000000000000");
                    let value = format!("{sent}{sum:044}");
                    Step::to(sum).emit(out.send(m.into_key_value().0, value))
                })
                .build()
                .unwrap()
        }
    };
    Parsley::named(app_id, [stage]).unwrap()
}

/// Writes `n` records to `input`: 64-byte values, keys cycling through
/// `keys` of them.
fn backlog(input: &str, n: usize, keys: usize) {
    let mut c = config();
    c.set("linger.ms", "5");
    let producer: BaseProducer = c.create().unwrap();
    for i in 0..n {
        let key = format!("k{}", i % keys);
        let value = format!("{:020}{i:044}", 0);
        send_when_room(
            &producer,
            BaseRecord::to(input).partition(0).key(&key).payload(&value),
        );
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// The allocations one instance makes from its start to its close over a
/// backlog of `n` records.
fn run(work: Work, n: usize, keys: usize) -> u64 {
    let (input, output) = (unique("alloc-in"), unique("alloc-out"));
    create_topics(&[(&input, 1), (&output, 1)]);
    backlog(&input, n, keys);
    let seen = Arc::new(AtomicU64::new(0));
    let app = app(
        work,
        &unique("alloc"),
        &topic(&input),
        &topic(&output),
        &seen,
    );
    let dir = std::env::temp_dir().join(unique("alloc-state"));
    let mut c = config();
    // Nothing commits on time while the records go through: each run's
    // changelog records are in the commit its close makes.
    c.set("transaction.timeout.ms", "120000");
    let before = GLOBAL.stats().allocations;
    let mut s = CausalStreams::new(&app, c)
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_secs(60),
            commit_when_idle: None,
            state_dir: Some(dir.clone()),
            ..common::options()
        });
    s.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.load(Ordering::Relaxed) < n as u64 {
        assert!(
            Instant::now() < deadline,
            "{work:?}: {} of {n} records went through",
            seen.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.close(Duration::from_secs(30)).unwrap();
    let after = GLOBAL.stats().allocations;
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    (after - before) as u64
}

/// Allocations per record of `work` on `keys` distinct keys (`None`: a
/// key per record).
fn per_record(work: Work, keys: Option<usize>) -> f64 {
    let least = |n: usize| {
        (0..2)
            .map(|_| run(work, n, keys.unwrap_or(n)))
            .min()
            .unwrap_or(u64::MAX)
    };
    let (small, large) = (least(SMALL), least(LARGE));
    let per = (large as f64 - small as f64) / (LARGE - SMALL) as f64;
    eprintln!(
        "{work:?}, {}: {small} allocations over {SMALL} records, {large} over {LARGE}: {per:.3} per record",
        keys.map_or("a key per record".to_owned(), |k| format!("{k} keys"))
    );
    per
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn the_record_path_stays_within_its_allocation_budget() {
    let mut over = Vec::new();
    for (work, budget) in [(Work::Copy, COPY_BUDGET), (Work::Sum, SUM_BUDGET)] {
        for keys in [None, Some(100)] {
            let per = per_record(work, keys);
            // A count well below what every record costs would mean the
            // difference missed the records: the copy's two payloads and
            // rdkafka's two, the sum's too and its format.
            let floor = match work {
                Work::Copy => 3.5,
                Work::Sum => 4.5,
            };
            assert!(
                per >= floor,
                "{work:?}: {per:.3} allocations per record cannot be the whole record path"
            );
            if per > budget + PER_BATCH {
                over.push(format!("{work:?} on {keys:?} keys: {per:.3} > {budget}"));
            }
        }
    }
    assert!(over.is_empty(), "over the allocation budget: {over:?}");
}
