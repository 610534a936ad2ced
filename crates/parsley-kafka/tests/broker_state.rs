//! Local state stores on a real broker: a restart opens each task's store
//! in the state directory and replays only the changelog written after its
//! checkpoint; a damaged store, and a store left from a changelog topic
//! that was deleted and created again, are rebuilt from the changelog; and
//! a state directory is held by one instance at a time; and a fold state
//! larger than the fold cache counts right, from its files and through a
//! rebuild written out in parts.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{config, create_topics, unique};
use futures_executor::block_on;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, RestoreListener, StreamsError, StreamsOptions};
use rdkafka::admin::AdminOptions;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A count per key: every input record updates one fold key, so the fold
/// changelog holds one live record per key.
fn counting(app_id: &str, input: &T, output: &T) -> Parsley {
    let mut builder = Stage::named("count").state(Codec::int64(), || 0);
    let out = builder.add_sink(output);
    let stage = builder
        .fold(input, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(out.send(m.key().cloned(), (n + 1).to_string()))
        })
        .build()
        .unwrap();
    Parsley::named(app_id, [stage]).unwrap()
}

/// What a restore listener heard: (event, records restored).
#[derive(Default)]
struct Heard(Mutex<Vec<(String, u64)>>);

impl RestoreListener for Heard {
    fn on_restore_start(&self, _: &TaskId, _: &str, _: i32, _: i64, _: i64) {
        self.0.lock().unwrap().push(("start".into(), 0));
    }
    fn on_batch_restored(&self, _: &TaskId, _: &str, _: i32, restored: u64, _: u64) {
        self.0.lock().unwrap().push(("batch".into(), restored));
    }
    fn on_restore_end(&self, _: &TaskId, _: &str, _: i32, restored: u64) {
        self.0.lock().unwrap().push(("end".into(), restored));
    }
}

fn state_dir(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(unique(name));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn instance(app: &Parsley, dir: &Path, name: &str) -> CausalStreams {
    CausalStreams::new(app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(100),
            instance_id: Some(name.to_owned()),
            state_dir: Some(dir.to_owned()),
            ..common::options()
        })
}

/// Produces one record per key `k0..k{n}` (value ignored), spread over
/// `partitions` by key hash.
fn produce_keys(topic: &str, from: usize, to: usize) {
    let mut c = config();
    c.set("linger.ms", "5");
    let producer: BaseProducer = c.create().unwrap();
    for i in from..to {
        let key = format!("k{i}");
        let mut record = BaseRecord::to(topic).key(&key).payload("v");
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(10));
                    record = back;
                }
            }
        }
        if i % 10_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

fn delivered(s: &CausalStreams) -> u64 {
    s.metrics().iter().map(|m| m.records_delivered_total).sum()
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last output value per key.
fn counts(output: &str, n: usize) -> std::collections::BTreeMap<String, String> {
    common::read_committed(output, 1, n, Duration::from_secs(60))
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect()
}

fn run_until_delivered(s: &mut CausalStreams, n: u64) {
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(90)).unwrap();
    wait_for(&format!("{n} deliveries"), Duration::from_secs(180), || {
        delivered(s) >= n
    });
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_restart_with_100k_keys_replays_only_the_changelog_tail() {
    const KEYS: usize = 100_000;
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 2), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let dir = state_dir("state");
    produce_keys(&i, 0, KEYS);

    let mut first = instance(&app, &dir, "a");
    run_until_delivered(&mut first, KEYS as u64);
    first.close(Duration::from_secs(60)).unwrap();

    // Ten more records for keys that already count one.
    produce_keys(&i, 0, 10);
    let mut second = instance(&app, &dir, "a");
    run_until_delivered(&mut second, 10);
    let restored = second.restored();
    second.close(Duration::from_secs(60)).unwrap();
    eprintln!("restart from the state directory: {restored:?}");
    assert_eq!(
        restored.from_local_store, 2,
        "both tasks opened their store"
    );
    assert_eq!(restored.local_stores_rebuilt, 0);
    assert!(
        restored.records_replayed < 100,
        "only the tail is replayed, not the {KEYS} keys: {restored:?}"
    );

    // The same restart from an empty state directory replays everything.
    produce_keys(&i, 0, 10);
    let empty = state_dir("empty");
    let mut third = instance(&app, &empty, "a");
    let heard = Arc::new(Heard::default());
    third.set_restore_listener(heard.clone());
    run_until_delivered(&mut third, 10);
    let full = third.restored();
    third.close(Duration::from_secs(60)).unwrap();
    eprintln!("restart from an empty state directory: {full:?}");
    assert_eq!(full.from_local_store, 0);
    assert!(
        full.records_replayed >= KEYS as u64,
        "a full replay reads every key: {full:?}"
    );
    // The restore listener heard every changelog partition start, go in
    // batches of 10,000 and end, and the ends add up to what was replayed.
    let heard = heard.0.lock().unwrap();
    let starts = heard.iter().filter(|e| e.0 == "start").count();
    let ends: Vec<&(String, u64)> = heard.iter().filter(|e| e.0 == "end").collect();
    assert_eq!(starts, 4, "two tasks, two changelogs each: {heard:?}");
    assert_eq!(ends.len(), 4);
    assert_eq!(ends.iter().map(|e| e.1).sum::<u64>(), full.records_replayed);
    let batches = heard.iter().filter(|e| e.0 == "batch").count() as u64;
    assert!(
        batches >= full.records_replayed / 10_000 - 4,
        "{batches} batches for {} records",
        full.records_replayed
    );
    // And the counts went on from the state each restart had.
    let last = counts(&o, KEYS + 20);
    assert_eq!(last.len(), KEYS);
    for k in 0..10 {
        assert_eq!(last[&format!("k{k}")], "3", "k{k}");
    }
    assert_eq!(last["k10"], "1");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}

/// A fold state some forty times the cache: the second pass over the keys
/// reads most of them back from the task files, a restart on the same
/// directory goes on from the files, and a rebuild from an empty one
/// (written out in parts) gives the same counts.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_fold_state_larger_than_the_cache_counts_right_from_its_files() {
    const KEYS: usize = 20_000;
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 2), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let cache = 128 << 10;
    let with_cache = |dir: &Path| {
        CausalStreams::new(&app, config())
            .unwrap()
            .with_options(StreamsOptions {
                commit_interval: Duration::from_millis(100),
                instance_id: Some("a".to_owned()),
                state_dir: Some(dir.to_owned()),
                fold_cache: Some(cache),
                ..common::options()
            })
    };
    let dir = state_dir("cache");
    let evicted = |s: &CausalStreams| -> u64 {
        s.metrics()
            .iter()
            .map(|t| t.fold_cache_evictions_total)
            .sum()
    };
    produce_keys(&i, 0, KEYS);
    let mut first = with_cache(&dir);
    run_until_delivered(&mut first, KEYS as u64);
    // The second pass goes in once the first pass's counts have left
    // memory for the files. Produced together, a fast stage can take both
    // passes into one transaction, and the second then finds each count
    // among that transaction's own writes, reading nothing back.
    wait_for(
        "the first pass's counts to leave memory",
        Duration::from_secs(60),
        || evicted(&first) >= KEYS as u64 / 2,
    );
    produce_keys(&i, 0, KEYS);
    wait_for("the second pass", Duration::from_secs(180), || {
        delivered(&first) >= 2 * KEYS as u64
    });
    // The figures are sampled: wait for the last sample.
    std::thread::sleep(Duration::from_millis(700));
    let m = first.metrics();
    let reads: u64 = m.iter().map(|t| t.fold_store_reads_total).sum();
    let skipped: u64 = m.iter().map(|t| t.fold_store_reads_skipped_total).sum();
    let evictions = evicted(&first);
    let resident: u64 = m.iter().map(|t| t.fold_cache_bytes).sum();
    eprintln!(
        "fold cache: {reads} reads, {skipped} skipped by the key filter, {evictions} evictions, {resident} bytes resident"
    );
    first.close(Duration::from_secs(60)).unwrap();
    // The first pass's keys were new: the key filter answered nearly all
    // of them without the files (a wrong "may hold" costs a read about
    // one time in a hundred). The second pass found all but the few
    // hundred counts still in memory in the files.
    assert!(
        reads >= KEYS as u64 - 1_000,
        "the second pass read its keys from the files: {reads} reads"
    );
    assert!(
        reads <= KEYS as u64 + KEYS as u64 / 20,
        "the first pass's new keys were answered by the filter: {reads} reads"
    );
    // And the metric says so: all of them but the filter's few mistakes.
    assert!(
        skipped >= KEYS as u64 - KEYS as u64 / 20 && skipped <= KEYS as u64,
        "{skipped} reads skipped"
    );
    // Each pass left all but what fits in the cache (some 600 counts).
    assert!(evictions >= 3 * KEYS as u64 / 2, "{evictions} evictions");
    assert!(resident > 0, "the cache holds something");

    produce_keys(&i, 0, KEYS);
    let mut second = with_cache(&dir);
    run_until_delivered(&mut second, KEYS as u64);
    let restored = second.restored();
    second.close(Duration::from_secs(60)).unwrap();
    assert_eq!(restored.from_local_store, 2, "{restored:?}");

    produce_keys(&i, 0, 100);
    let empty = state_dir("cache-empty");
    let mut third = with_cache(&empty);
    run_until_delivered(&mut third, 100);
    let full = third.restored();
    third.close(Duration::from_secs(60)).unwrap();
    assert!(full.records_replayed >= KEYS as u64, "{full:?}");

    let last = counts(&o, 3 * KEYS + 100);
    assert_eq!(last.len(), KEYS);
    for k in 0..KEYS {
        let want = if k < 100 { "4" } else { "3" };
        assert_eq!(last[&format!("k{k}")], want, "k{k}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}

fn task_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for app in std::fs::read_dir(dir).unwrap().map_while(Result::ok) {
        for instance in std::fs::read_dir(app.path()).unwrap().map_while(Result::ok) {
            for f in std::fs::read_dir(instance.path())
                .unwrap()
                .map_while(Result::ok)
            {
                if f.path().extension().is_some_and(|e| e == "redb") {
                    out.push(f.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_damaged_store_and_a_store_of_a_recreated_changelog_are_rebuilt() {
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 2), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let dir = state_dir("state");
    produce_keys(&i, 0, 50);
    let mut first = instance(&app, &dir, "a");
    run_until_delivered(&mut first, 50);
    first.close(Duration::from_secs(60)).unwrap();

    // Damage every task's file.
    let files = task_files(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        std::fs::write(f, vec![0x5A; 16_384]).unwrap();
    }
    produce_keys(&i, 0, 1);
    let mut second = instance(&app, &dir, "a");
    run_until_delivered(&mut second, 1);
    let restored = second.restored();
    second.close(Duration::from_secs(60)).unwrap();
    assert_eq!(restored.local_stores_rebuilt, 2, "{restored:?}");
    assert_eq!(restored.from_local_store, 0, "{restored:?}");
    assert_eq!(
        counts(&o, 51)["k0"],
        "2",
        "the rebuilt state is the changelog's"
    );

    // The fold changelog is deleted and created again (empty, with a new
    // topic id): the stores, which remember the old one, must not bring
    // the old counts back.
    let fold = format!("{app_id}-count-fold-changelog");
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in block_on(cluster.admin().delete_topics(&[fold.as_str()], &opts)).unwrap() {
        r.unwrap();
    }
    wait_for("the changelog to be gone", Duration::from_secs(30), || {
        use parsley::runtime::host::TopicMetadata;
        cluster.describe(&fold).is_err()
    });
    std::thread::sleep(Duration::from_secs(1));
    produce_keys(&i, 0, 1);
    let mut third = instance(&app, &dir, "a");
    run_until_delivered(&mut third, 1);
    let again = third.restored();
    third.close(Duration::from_secs(60)).unwrap();
    assert_eq!(again.local_stores_rebuilt, 2, "{again:?}");
    assert_eq!(
        counts(&o, 52)
            .get("k0")
            .map(String::as_str)
            .unwrap_or_default(),
        "1",
        "the count starts again from the new, empty changelog"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_second_instance_on_a_held_state_directory_is_refused() {
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 1), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let dir = state_dir("state");
    let mut first = instance(&app, &dir, "a");
    first.start().unwrap();
    let mut second = instance(&app, &dir, "a");
    let err = second.start().unwrap_err();
    assert!(matches!(err, StreamsError::StateDir(_)), "{err}");
    let held = dir.join(&app_id).join("a");
    assert!(
        err.to_string().contains(&held.display().to_string()),
        "the error names the directory: {err}"
    );
    first.close(Duration::from_secs(60)).unwrap();
    // Released when the first one closed.
    let mut third = instance(&app, &dir, "a");
    third.start().unwrap();
    third.close(Duration::from_secs(60)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
