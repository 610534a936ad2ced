//! Backpressure: a task whose holds pass its budget pauses fetching on the
//! partitions whose heads are held, never on one a held head waits for,
//! and resumes each as soon as it drains, is claimed, or the holds fall to
//! half the budget.

use super::*;

/// One stage over three sources `a`, `b` and `c`, forwarding each record
/// to `out`.
fn three_source_app() -> Parsley {
    let (a, b, c, out) = (topic("a"), topic("b"), topic("c"), topic("out"));
    let mut stage = Stage::named("fwd");
    for t in [&a, &b, &c] {
        let o = out.clone();
        stage = stage.on(t, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), m.key().cloned())]
        });
    }
    let stage = stage.sink(&out).build().unwrap();
    Parsley::named("bp", [stage]).unwrap()
}

fn three_source_cluster() -> Cluster {
    Cluster::with(&[
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("out", 1),
        ("bp-fwd-state-changelog", 1),
    ])
}

/// A worker with a small hold budget, its one task started on `a:0`,
/// `b:0` and `c:0`.
fn budgeted(app: &Parsley, cluster: &Cluster, budget: usize) -> Worker {
    let mut w = Worker::new(
        app,
        WorkerConfig {
            hold_budget: Some(budget),
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("b", 0), part("c", 0)], cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, cluster);
    w
}

/// `topic@offset` on partition 0, claiming `claims` (topic, offset).
fn claiming(topic: &str, offset: i64, cluster: &Cluster, claims: &[(&str, i64)]) -> PolledRecord {
    let mut clock = parsley::protocol::VectorClock::new();
    for &(t, o) in claims {
        clock.claim_offset(parsley::protocol::Channel::new(cluster.topics[t].0, 0), o);
    }
    PolledRecord {
        headers: vec![Header::new("vc", clock.encode())],
        ..rec(topic, 0, offset, "k")
    }
}

fn held_bytes(w: &mut Worker) -> u64 {
    w.sample().metrics[0].records_held_bytes
}

/// The cause on `c` is missing: `a`'s records pile up behind their held
/// head until the budget is passed, then `a` pauses (and only `a`: `b`
/// and `c` hold nothing). The cause arrives, `a` drains and resumes, and
/// every record is delivered once, in order.
#[test]
fn a_partition_whose_head_is_held_pauses_past_the_budget_and_resumes_when_it_drains() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut n = 0;
    while flow(&mut w).is_empty() {
        assert!(
            n < 100,
            "never paused, holding {} bytes",
            held_bytes(&mut w)
        );
        w.on_record(claiming("a", n, &cluster, &[("c", 0)]))
            .unwrap();
        n += 1;
    }
    let held = held_bytes(&mut w);
    assert!(held > 2_000, "paused under the budget: {held}");
    assert_eq!(w.stats().hold_pauses, 1);
    let sample = w.sample().metrics[0].clone();
    assert_eq!(sample.partitions_paused, 1);
    assert_eq!(sample.hold_budget_bytes, 2_000);
    assert_eq!(sample.hold_pauses_total, 1);
    // More of a (fetched before the pause took) changes nothing.
    w.on_record(claiming("a", n, &cluster, &[("c", 0)]))
        .unwrap();
    n += 1;
    assert!(flow(&mut w).is_empty());

    w.on_record(rec("c", 0, 0, "cause")).unwrap();
    assert_eq!(flow(&mut w), vec![("a".to_owned(), 0, false)]);
    assert_eq!(w.stats().hold_resumes_drained, 1);
    let txn = commit(&mut w, &cluster);
    let mut want = vec!["fwd[0]:c:0@0".to_owned()];
    want.extend((0..n).map(|o| format!("fwd[0]:a:0@{o}")));
    assert_eq!(delivered(&txn), want);
    assert_eq!(w.sample().metrics[0].partitions_paused, 0);
}

/// Releasing a long hold does not leave the memory it took behind: the
/// node's queue and the task's delivery buffer give back their room.
#[test]
fn a_released_hold_gives_back_its_room() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = Worker::new(&app, WorkerConfig::default());
    w.assign(vec![part("a", 0), part("b", 0), part("c", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    for o in 0..5_000 {
        w.on_record(claiming("a", o, &cluster, &[("c", 0)]))
            .unwrap();
    }
    let id = w.tasks().next().unwrap().clone();
    assert!(w.task(&id).unwrap().node().held_capacity() >= 5_000);
    w.on_record(rec("c", 0, 0, "cause")).unwrap();
    let task = w.task(&id).unwrap();
    assert_eq!(task.node().held_count(), 0);
    assert!(
        task.node().held_capacity() <= 3 * 64,
        "queues kept their room"
    );
    assert!(
        task.delivery_room() <= 256,
        "the delivery buffer kept room for {}",
        task.delivery_room()
    );
    assert_eq!(delivered(&commit(&mut w, &cluster)).len(), 5_001);
}

/// `b`'s head waits for `c`, and `a`'s head waits for `b`: past the
/// budget `a` pauses, but `b` never does, since a held head waits for its
/// records. When `c` arrives both drain and `a` resumes.
#[test]
fn a_partition_a_held_head_waits_for_is_never_paused() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    w.on_record(claiming("b", 0, &cluster, &[("c", 0)]))
        .unwrap();
    let mut n = 0;
    for o in 1..30 {
        w.on_record(claiming("b", o, &cluster, &[("c", 0)]))
            .unwrap();
        w.on_record(claiming("a", n, &cluster, &[("b", 0)]))
            .unwrap();
        n += 1;
    }
    assert!(held_bytes(&mut w) > 2_000);
    let changes = flow(&mut w);
    assert_eq!(changes, vec![("a".to_owned(), 0, true)], "only a pauses");
    w.on_record(rec("c", 0, 0, "cause")).unwrap();
    assert_eq!(flow(&mut w), vec![("a".to_owned(), 0, false)]);
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 1 + 30 + n as usize);
}

/// `b` pauses with its head held on `c`; a record arriving on `a` that
/// claims `b` resumes it at once, even though it only queues behind `a`'s
/// own held head, and `b` is not paused again while that head of `b` is
/// held. A held head that comes to claim a paused partition resumes it
/// too.
#[test]
fn a_claim_into_a_paused_partition_resumes_it() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut o = 0;
    while flow(&mut w).is_empty() {
        assert!(o < 100);
        w.on_record(claiming("b", o, &cluster, &[("c", 0)]))
            .unwrap();
        o += 1;
    }
    // a's head waits on c too (no claim on b), so a pauses as well once
    // it holds anything past the budget.
    w.on_record(claiming("a", 0, &cluster, &[("c", 0)]))
        .unwrap();
    assert_eq!(flow(&mut w), vec![("a".to_owned(), 0, true)]);
    // Queued behind a@0, a@1 claims b: b resumes.
    w.on_record(claiming("a", 1, &cluster, &[("b", 2)]))
        .unwrap();
    assert_eq!(flow(&mut w), vec![("b".to_owned(), 0, false)]);
    assert_eq!(w.stats().hold_resumes_claimed, 1);
    // More of b while its head is the same: not paused again.
    w.on_record(claiming("b", o, &cluster, &[("c", 0)]))
        .unwrap();
    assert!(flow(&mut w).is_empty());
    w.on_record(rec("c", 0, 0, "cause")).unwrap();
    let mut changes = flow(&mut w);
    changes.sort();
    assert_eq!(changes, vec![("a".to_owned(), 0, false)]);
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 1 + (o as usize + 1) + 2);
}

/// A paused partition whose head stays held resumes once the task's holds
/// fall to half the budget (here: another channel's queue drained).
#[test]
fn paused_partitions_resume_when_the_holds_fall_to_half_the_budget() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 4_000);
    // a holds a little on c@0; b holds a lot on c@1.
    w.on_record(claiming("a", 0, &cluster, &[("c", 1)]))
        .unwrap();
    let mut o = 0;
    while flow(&mut w).is_empty() {
        assert!(o < 100);
        w.on_record(claiming("b", o, &cluster, &[("c", 0)]))
            .unwrap();
        o += 1;
    }
    assert_eq!(w.stats().hold_pauses, 2, "a and b");
    // c@0 releases b (and drains it), not a.
    w.on_record(rec("c", 0, 0, "first")).unwrap();
    let mut changes = flow(&mut w);
    changes.sort();
    assert_eq!(
        changes,
        vec![("a".to_owned(), 0, false), ("b".to_owned(), 0, false)]
    );
    assert_eq!(w.stats().hold_resumes_drained, 1);
    assert_eq!(w.stats().hold_resumes_relieved, 1);
}

/// A record larger than the whole budget that has to wait fails its task
/// with an error naming the option; nothing is lost: after the abort the
/// task's committed state is unchanged, and a record that does not wait
/// is delivered however large.
#[test]
fn a_held_record_larger_than_the_budget_fails_its_task() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut big = claiming("a", 0, &cluster, &[("c", 0)]);
    big.value = Some(vec![b'x'; 4_000]);
    let err = w.on_record(big).unwrap_err().to_string();
    assert!(
        err.contains("hold budget") && err.contains("StreamsOptions::hold_budget"),
        "{err}"
    );
    assert!(err.contains("a:0@0"), "{err}");
    w.abort(&cluster).unwrap();
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1);
    // A large record with nothing to wait for goes through.
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut big = rec("b", 0, 0, "k");
    big.value = Some(vec![b'x'; 4_000]);
    w.on_record(big).unwrap();
    assert_eq!(delivered(&commit(&mut w, &cluster)), vec!["fwd[0]:b:0@0"]);
}

/// An abort rebuilds the task from its committed state: every partition
/// paused for the budget resumes.
#[test]
fn an_abort_resumes_the_partitions_paused_for_the_budget() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut n = 0;
    while flow(&mut w).is_empty() {
        assert!(n < 100);
        w.on_record(claiming("a", n, &cluster, &[("c", 0)]))
            .unwrap();
        n += 1;
    }
    w.abort(&cluster).unwrap();
    assert_eq!(flow(&mut w), vec![("a".to_owned(), 0, false)]);
    assert_eq!(w.sample().metrics[0].partitions_paused, 0);
}

/// No budget, no pauses, however much is held.
#[test]
fn without_a_budget_nothing_pauses() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            hold_budget: None,
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("b", 0), part("c", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    for n in 0..200 {
        w.on_record(claiming("a", n, &cluster, &[("c", 0)]))
            .unwrap();
    }
    assert!(flow(&mut w).is_empty());
    assert_eq!(w.stats().hold_pauses, 0);
}

/// An abort whose task reset fails (a lookup outage) leaves the task
/// waiting to start again: nothing is fetched for it while it waits, and
/// once it starts every one of its partitions is fetched again, the ones
/// its hold budget had paused included, or the task would never fetch
/// them again. (The simulator found the last one.)
#[test]
fn a_task_whose_reset_fails_resumes_its_paused_partitions() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = budgeted(&app, &cluster, 2_000);
    let mut n = 0;
    while flow(&mut w).is_empty() {
        assert!(n < 100);
        w.on_record(claiming("a", n, &cluster, &[("c", 0)]))
            .unwrap();
        n += 1;
    }
    cluster.fail_ends.set(1);
    w.abort(&cluster).unwrap();
    assert_eq!(w.waiting_tasks().count(), 1, "the reset failed");
    let last = |changes: Vec<(String, i32, bool)>| -> BTreeMap<String, bool> {
        changes.into_iter().map(|(t, _, p)| (t, p)).collect()
    };
    assert_eq!(
        last(flow(&mut w)),
        BTreeMap::from([("a".into(), true), ("b".into(), true), ("c".into(), true)]),
        "paused while it waits"
    );
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1, "started");
    assert_eq!(
        last(flow(&mut w)),
        BTreeMap::from([
            ("a".into(), false),
            ("b".into(), false),
            ("c".into(), false)
        ]),
        "fetched again"
    );
}

/// The task's own channel for `topic` partition 0 in `cluster`.
fn channel(cluster: &Cluster, topic: &str) -> parsley::protocol::Channel {
    parsley::protocol::Channel::new(cluster.topics[topic].0, 0)
}

/// A fetched record on `topic` partition 0, claiming `claims`, with the
/// channel it comes from.
fn fetched(
    cluster: &Cluster,
    topic: &str,
    offset: i64,
    claims: &[(&str, i64)],
) -> (protocol::Channel, PolledRecord) {
    (
        channel(cluster, topic),
        claiming(topic, offset, cluster, claims),
    )
}

fn delivered_offsets(commit: &parsley::task::TaskCommit) -> Vec<String> {
    commit
        .events
        .iter()
        .filter_map(|e| match e {
            TaskEvent::Delivered(d) => Some(d.coordinate.to_string()),
            _ => None,
        })
        .collect()
}

/// A task with a hold window of 2 keeps only two of `a`'s held records in
/// memory once they are committed; the rest come back from the store, in
/// order, when their cause arrives: here while the transaction that wrote
/// them is still in flight, so they are read from it.
#[test]
fn held_records_beyond_the_window_come_back_from_the_store_in_order() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut task = parsley::task::Task::init(
        &app,
        "fwd",
        0,
        parsley::task::TaskStores::default(),
        &cluster,
        &cluster,
        0,
    )
    .unwrap();
    assert_eq!(task.set_hold_window(Some(2)), 0);
    for o in 0..6 {
        let (c, r) = fetched(&cluster, "a", o, &[("c", 0)]);
        task.on_record(c, &r).unwrap();
    }
    assert_eq!(task.node().held_count(), 6);
    assert_eq!(task.node().paged_count(), 0, "nothing leaves uncommitted");
    let first = task.take_commit().unwrap();
    assert!(delivered_offsets(&first).is_empty());
    assert_eq!(task.node().paged_count(), 4);
    // The cause arrives before the first transaction's outcome.
    let (c, r) = fetched(&cluster, "c", 0, &[]);
    task.on_record(c, &r).unwrap();
    assert_eq!(task.node().held_count(), 0);
    assert_eq!(task.node().stats().paged_in_total, 4);
    task.commit_done();
    let second = task.take_commit().unwrap();
    let mut want = vec!["c:0@0".to_owned()];
    want.extend((0..6).map(|o| format!("a:0@{o}")));
    assert_eq!(delivered_offsets(&second), want);
}

/// Through the worker: held records paged out at commit, an abort that
/// rebuilds the task from its committed store (the window carried over),
/// and a release that pages them back in; the metrics count it.
#[test]
fn a_worker_pages_held_records_through_an_abort() {
    let app = three_source_app();
    let cluster = three_source_cluster();
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            hold_window: Some(3),
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("b", 0), part("c", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    for o in 0..10 {
        w.on_record(claiming("a", o, &cluster, &[("c", 0)]))
            .unwrap();
    }
    commit(&mut w, &cluster);
    let m = w.sample().metrics[0].clone();
    assert_eq!(m.records_held_paged, 7);
    // Seven of ten equal records: seven tenths of the held bytes.
    assert_eq!(m.records_held_paged_bytes * 10, m.records_held_bytes * 7);
    // Two more held, then the transaction aborts: the task is rebuilt from
    // what was committed (ten held, seven of them paged again).
    for o in 10..12 {
        w.on_record(claiming("a", o, &cluster, &[("c", 0)]))
            .unwrap();
    }
    w.abort(&cluster).unwrap();
    let id = w.tasks().next().unwrap().clone();
    assert_eq!(w.task(&id).unwrap().node().held_count(), 10);
    assert_eq!(w.task(&id).unwrap().node().paged_count(), 7);
    seek(&mut w);
    for o in 10..12 {
        w.on_record(claiming("a", o, &cluster, &[("c", 0)]))
            .unwrap();
    }
    w.on_record(rec("c", 0, 0, "cause")).unwrap();
    let txn = commit(&mut w, &cluster);
    let mut want = vec!["fwd[0]:c:0@0".to_owned()];
    want.extend((0..12).map(|o| format!("fwd[0]:a:0@{o}")));
    assert_eq!(delivered(&txn), want);
    let m = w.sample().metrics[0].clone();
    assert_eq!(m.records_held_paged, 0);
    assert!(
        m.records_paged_in_total >= 7,
        "{}",
        m.records_paged_in_total
    );
    assert!(w.stats().records_paged_in >= 7);
}
