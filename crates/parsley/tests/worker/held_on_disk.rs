//! Held records on disk: once a task's local store holds the commit that
//! held a record, the record's copy leaves memory; it comes back from the
//! store as the gate reaches it, when an abort rebuilds the task, and when
//! the task starts again from its store.

use super::*;

/// `a@offset` claiming `b@0`, which has not arrived.
fn waiting_for_b(offset: i64) -> PolledRecord {
    let mut r = rec("a", 0, offset, "x");
    let mut clock = protocol::VectorClock::new();
    clock.claim_offset(protocol::Channel::new(TopicId::from_u128(0x1001), 0), 0);
    r.headers.push(Header::new("vc", clock.encode()));
    r
}

fn on_disk_worker(app: &Parsley, store: &ReadableLocal) -> Worker {
    Worker::new(
        app,
        WorkerConfig {
            hold_window: Some(2),
            // The fold state stays in memory: only held records are on
            // disk (a failed write then matters only for them).
            fold_cache: None,
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()))
}

/// A started on-disk worker (with its cluster and store) whose task holds
/// `a@0..n`, committed.
fn holding(app: &Parsley, n: i64) -> (Worker, Cluster, ReadableLocal) {
    let cluster = counting_cluster(1);
    let store = ReadableLocal::default();
    let mut w = started_with(&cluster, on_disk_worker(app, &store));
    if n > 0 {
        hold(&mut w, &cluster, 0..n);
    }
    (w, cluster, store)
}

/// Hands over `a@range`, each waiting for `b@0`, and commits.
fn hold(w: &mut Worker, cluster: &Cluster, range: std::ops::Range<i64>) {
    for o in range {
        w.on_record(waiting_for_b(o)).unwrap();
    }
    commit(w, cluster);
}

/// The held records under a protocol store key: a page's count, one for an
/// entry of the older layout, none for any other key.
fn records_in(key: &[u8], value: &[u8]) -> usize {
    if !parsley::runtime::local::is_held_entry(key) {
        return 0;
    }
    if key.windows(3).any(|w| w == b"/p/") {
        protocol::store::PageEntries::count(value).unwrap()
    } else {
        1
    }
}

/// Held records in the task's committed in-memory store.
fn in_memory(w: &Worker) -> usize {
    let id = w.tasks().next().unwrap().clone();
    w.task(&id)
        .unwrap()
        .stores()
        .protocol
        .iter()
        .map(|(k, v)| records_in(k.as_bytes(), v))
        .sum()
}

/// Held records in the local store.
fn on_disk(store: &ReadableLocal) -> usize {
    store
        .inner
        .0
        .lock()
        .unwrap()
        .values()
        .map(|s| {
            s.protocol
                .iter()
                .map(|(k, v)| records_in(k, v))
                .sum::<usize>()
        })
        .sum()
}

#[test]
fn held_records_leave_memory_for_the_store_and_come_back_in_order() {
    let app = counting_app();
    let (mut w, cluster, store) = holding(&app, 10);
    assert_eq!(on_disk(&store), 10);
    assert_eq!(
        in_memory(&w),
        0,
        "the store holds them: none stays in memory"
    );
    let id = w.tasks().next().unwrap().clone();
    let held = w.task(&id).unwrap().stores().held.stats().unwrap();
    assert_eq!(held.evicted, 10);
    assert_eq!(w.task(&id).unwrap().node().held_count(), 10);

    // An abort rebuilds the task from its committed stores: the held
    // records come from the store.
    w.on_record(waiting_for_b(10)).unwrap();
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.stats().resets_with_held_on_disk, 1);
    assert_eq!(w.task(&id).unwrap().node().held_count(), 10);
    assert_eq!(
        w.task(&id).unwrap().node().paged_count(),
        8,
        "beyond the window of two, never decoded"
    );
    seek(&mut w);

    // b@0 releases all ten, in order, read back from the store.
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut w, &cluster);
    let mut want = vec!["count[0]:b:0@0".to_owned()];
    want.extend((0..10).map(|o| format!("count[0]:a:0@{o}")));
    assert_eq!(delivered(&txn), want);
    assert!(w.stats().held_records_read_from_disk >= 10);
    assert_eq!(on_disk(&store), 0, "released records are deleted");
}

#[test]
fn a_restart_reads_held_records_from_the_store_not_into_memory() {
    let app = counting_app();
    let (w, cluster, store) = holding(&app, 6);
    drop(w);

    let mut again = on_disk_worker(&app, &store);
    again
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    let stats = again.stats();
    assert_eq!(stats.local_store_starts, 1);
    assert_eq!(stats.restored_with_held_on_disk, 1);
    let id = again.tasks().next().unwrap().clone();
    let task = again.task(&id).unwrap();
    assert_eq!(task.node().held_count(), 6);
    assert_eq!(task.node().paged_count(), 4);
    assert_eq!(in_memory(&again), 0);
    seek(&mut again);
    again.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut again, &cluster);
    assert_eq!(delivered(&txn).len(), 7);
}

/// A store that fails to read a held record back fails the task (its
/// records are not skipped), and the task's store is wiped so that its
/// restart rebuilds from the changelog.
#[test]
fn a_held_record_the_store_cannot_read_fails_the_task() {
    let app = counting_app();
    let (mut w, cluster, store) = holding(&app, 6);
    store
        .broken_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = w.on_record(rec("b", 0, 0, "y")).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot be read from its local store"),
        "{err}"
    );
    w.abort(&cluster).unwrap();
    assert_eq!(w.take_task_failures().len(), 1);
    let id = w.stopped_tasks().next().unwrap().clone();
    assert!(
        !store.inner.0.lock().unwrap().contains_key(&id),
        "the damaged store is wiped"
    );
    store
        .broken_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // The restart rebuilds from the changelog and delivers everything.
    let wait = w.restart_task(&id, &cluster).unwrap().unwrap();
    w.punctuate(wait.as_millis() as i64, &cluster).unwrap();
    assert_eq!(w.stats().task_restarts, 1);
    seek(&mut w);
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 7, "{:?}", delivered(&txn));
}

/// A held record's copy stays in memory until the store says it holds the
/// commit that wrote it: a store that lags keeps it readable.
#[test]
fn a_held_record_stays_in_memory_until_the_store_holds_it() {
    let app = counting_app();
    let (mut w, cluster, store) = holding(&app, 0);
    store.lag.store(true, std::sync::atomic::Ordering::SeqCst);
    hold(&mut w, &cluster, 0..4);
    assert_eq!(in_memory(&w), 4, "the store has not reported the write");
    store.lag.store(false, std::sync::atomic::Ordering::SeqCst);
    w.on_record(waiting_for_b(4)).unwrap();
    commit(&mut w, &cluster);
    assert_eq!(in_memory(&w), 0);
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 6);
}

/// An abort whose rebuild cannot read the held records back from the
/// store restarts the task from its changelogs, with the store wiped (it
/// would fail that start too).
#[test]
fn an_abort_that_cannot_read_the_store_rebuilds_from_the_changelog() {
    let app = counting_app();
    let (mut w, cluster, store) = holding(&app, 5);
    let id = w.tasks().next().unwrap().clone();
    store
        .broken_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    w.on_record(waiting_for_b(5)).unwrap();
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0, "the reset failed");
    assert!(
        !store.inner.0.lock().unwrap().contains_key(&id),
        "the store that could not be read is wiped"
    );
    store
        .broken_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1);
    assert_eq!(
        w.stats().local_store_starts,
        0,
        "rebuilt from the changelog"
    );
    seek(&mut w);
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 6, "{:?}", delivered(&txn));
}

/// A release larger than `release_per_transaction` goes out over several
/// transactions: each commits at once (no waiting for the interval), the
/// release goes on at the next punctuation, and the records arrive in
/// order, each once.
#[test]
fn a_large_release_goes_out_over_several_transactions_in_order() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = ReadableLocal::default();
    let w = Worker::new(
        &app,
        WorkerConfig {
            hold_window: Some(2),
            release_per_transaction: Some(4),
            commit_interval: Duration::from_secs(60),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    let mut w = started_with(&cluster, w);
    hold(&mut w, &cluster, 0..20);
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let mut all = Vec::new();
    let mut transactions = 0;
    let mut now = 1_000;
    loop {
        if w.releases_waiting() {
            assert_eq!(
                w.commit_due_in(now),
                Some(Duration::ZERO),
                "a full release commits at once"
            );
        }
        let Some(txn) = w.flush().unwrap() else { break };
        let got = delivered(&txn);
        assert!(got.len() <= 4 + 2 + 1, "{got:?}");
        all.extend(got);
        let offsets = cluster.commit(&txn.records);
        w.delivered(&offsets);
        w.commit_outcome(CommitOutcome::Committed, &cluster)
            .unwrap();
        transactions += 1;
        assert_eq!(
            w.release_due_in(),
            (w.task(&w.tasks().next().unwrap().clone())
                .unwrap()
                .node()
                .held_count()
                > 0)
            .then_some(Duration::ZERO)
        );
        now += 1;
        w.punctuate(now, &cluster).unwrap();
    }
    let mut want = vec!["count[0]:b:0@0".to_owned()];
    want.extend((0..20).map(|o| format!("count[0]:a:0@{o}")));
    assert_eq!(all, want);
    assert!(transactions >= 4, "{transactions} transactions");
    assert!(w.stats().releases_resumed >= 3);
}

/// A worker on another machine (an empty state directory) assigned `a/0`
/// and `b/0`, which rebuilds their task from the changelogs, with a fold
/// cache share small enough that every held record makes a part of the
/// rebuild's file.
fn rebuilt(app: &Parsley, cluster: &Cluster) -> (Worker, ReadableLocal) {
    let store = ReadableLocal {
        parts_before_full: std::sync::Arc::new(AtomicU64::new(u64::MAX)),
        ..ReadableLocal::default()
    };
    let mut again = Worker::new(
        app,
        WorkerConfig {
            hold_window: Some(2),
            fold_cache: Some(1),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    again
        .assign(vec![part("a", 0), part("b", 0)], cluster, 0)
        .unwrap();
    assert_eq!(again.stats().local_store_starts, 0, "a rebuild");
    (again, store)
}

/// A rebuild from the changelog (a task arriving without its file) writes
/// the held records it replays to the new file in parts, as it goes: none
/// stays in memory, and the release reads them back in order.
#[test]
fn a_rebuild_writes_held_records_out_in_parts() {
    let app = counting_app();
    // Twelve commits of one held record each: twelve pages.
    let (mut w, cluster, _) = holding(&app, 0);
    for o in 0..12 {
        hold(&mut w, &cluster, o..o + 1);
    }
    drop(w);

    // Another machine: an empty state directory.
    let (mut again, store) = rebuilt(&app, &cluster);
    assert!(
        store.parts.load(std::sync::atomic::Ordering::SeqCst) >= 12,
        "{} parts",
        store.parts.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_eq!(in_memory(&again), 0);
    assert_eq!(on_disk(&store), 12);
    seek(&mut again);
    again.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut again, &cluster);
    let mut want = vec!["count[0]:b:0@0".to_owned()];
    want.extend((0..12).map(|o| format!("count[0]:a:0@{o}")));
    assert_eq!(delivered(&txn), want);
}

/// A failed store write is fatal to a task only when part of its state is
/// on disk alone: with every held record still in memory (the store had
/// not reported them yet) the task runs on without its store, keeping them
/// there; with held records on disk only, it fails at its next
/// transaction (and restarts from its changelog).
#[test]
fn a_failed_write_fails_the_task_only_when_held_records_were_on_disk_only() {
    use std::sync::atomic::Ordering::SeqCst;
    let app = counting_app();
    // In memory still: the task runs on.
    let (mut w, cluster, store) = holding(&app, 0);
    store.lag.store(true, SeqCst);
    hold(&mut w, &cluster, 0..4);
    assert_eq!(in_memory(&w), 4);
    store.writes_fail.store(true, SeqCst);
    hold(&mut w, &cluster, 4..6);
    assert_eq!(w.stats().local_store_write_failures, 1);
    store.lag.store(false, SeqCst);
    store.writes_fail.store(false, SeqCst);
    w.on_record(waiting_for_b(6)).unwrap();
    commit(&mut w, &cluster);
    assert_eq!(in_memory(&w), 7, "none leaves for the wiped store");
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 8);
    assert!(w.take_task_failures().is_empty());

    // On disk only: the task fails.
    let (mut w, cluster, store) = holding(&app, 4);
    assert_eq!(in_memory(&w), 0);
    store.writes_fail.store(true, SeqCst);
    hold(&mut w, &cluster, 4..6);
    w.on_record(waiting_for_b(6)).unwrap();
    let err = w.flush().unwrap_err();
    assert!(err.to_string().contains("local store"), "{err}");
}

/// A release that an abort interrupts goes on, after the reset, within the
/// same bound per transaction (the start's own release keeps to it).
#[test]
fn a_reset_keeps_the_release_bound() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let w = Worker::new(
        &app,
        WorkerConfig {
            hold_window: Some(2),
            release_per_transaction: Some(4),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(ReadableLocal::default()));
    let mut w = started_with(&cluster, w);
    hold(&mut w, &cluster, 0..30);
    w.on_record(rec("b", 0, 0, "y")).unwrap();
    commit(&mut w, &cluster);
    w.punctuate(1, &cluster).unwrap();
    // This transaction aborts: the reset starts from the committed state,
    // with about 25 records still held and b@0 delivered.
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    seek(&mut w);
    let mut now = 2;
    let mut total = 0;
    while let Some(txn) = w.flush().unwrap() {
        let n = delivered(&txn).len();
        assert!(n <= 4 + 2, "{n} delivered in one transaction");
        total += n;
        let offsets = cluster.commit(&txn.records);
        w.delivered(&offsets);
        w.commit_outcome(CommitOutcome::Committed, &cluster)
            .unwrap();
        now += 1;
        w.punctuate(now, &cluster).unwrap();
    }
    let held = w
        .task(&w.tasks().next().unwrap().clone())
        .unwrap()
        .node()
        .held_count();
    assert_eq!(held, 0);
    assert!(total >= 20, "{total}");
}

/// A changelog written one key per held record (the Java library's
/// layout, and this library's before pages) rebuilds a task whose held
/// records go to its file, are read back from it a window at a time, and
/// are deleted key by key as they are released.
#[test]
fn a_changelog_in_the_one_key_per_record_layout_rebuilds_releases_and_deletes() {
    use protocol::store::{PageEntries, StateKey};
    let app = counting_app();
    let (mut w, cluster, _) = holding(&app, 0);
    hold(&mut w, &cluster, 0..10);
    drop(w);
    // Rewrite the protocol changelog: every page as its records' entries.
    let log = ("app-count-state-changelog".to_owned(), 0);
    let mut rewritten = Vec::new();
    let mut pages = 0;
    for r in cluster.logs.borrow().get(&log).cloned().unwrap_or_default() {
        let parsed = r
            .key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| k.parse::<StateKey>().ok());
        match (parsed, r.value.as_deref()) {
            (Some(StateKey::QueuePage(c, first)), Some(value)) => {
                pages += 1;
                for (index, entry) in (first..).zip(PageEntries::new(value).unwrap()) {
                    rewritten.push((
                        StateKey::QueueEntry(c, index).to_key().into_bytes(),
                        entry.to_vec(),
                    ));
                }
            }
            _ => rewritten.push((r.key.unwrap_or_default(), r.value.unwrap_or_default())),
        }
    }
    assert_eq!(pages, 1, "one commit held the ten: one page");
    let records: Vec<ChangelogRecord> = rewritten
        .into_iter()
        .enumerate()
        .map(|(offset, (key, value))| ChangelogRecord {
            offset: offset as i64,
            key: Some(key),
            value: Some(value),
        })
        .collect();
    cluster
        .ends
        .borrow_mut()
        .insert(log.clone(), records.len() as i64 + 1);
    cluster.logs.borrow_mut().insert(log, records);

    // Another machine: an empty state directory.
    let (mut again, store) = rebuilt(&app, &cluster);
    seek(&mut again);
    assert_eq!(on_disk(&store), 10, "the entries went to the file");
    assert_eq!(in_memory(&again), 0);
    again.on_record(rec("b", 0, 0, "y")).unwrap();
    let txn = commit(&mut again, &cluster);
    let mut want = vec!["count[0]:b:0@0".to_owned()];
    want.extend((0..10).map(|o| format!("count[0]:a:0@{o}")));
    assert_eq!(delivered(&txn), want);
    let id = again.tasks().next().unwrap().clone();
    assert!(
        again
            .task(&id)
            .unwrap()
            .stores()
            .held
            .stats()
            .unwrap()
            .disk_reads
            >= 8,
        "read back from the file"
    );
    // Every entry deleted, key by key, in the changelog and the file.
    let deleted = txn
        .records
        .iter()
        .filter(|r| {
            r.value.is_none()
                && r.key
                    .as_deref()
                    .is_some_and(|k| k.windows(3).any(|w| w == b"/e/"))
        })
        .count();
    assert_eq!(deleted, 10);
    assert_eq!(on_disk(&store), 0);
}
