//! Records streamed into the open transaction
//! ([`WorkerConfig::stream_records`]): each emission goes out in the next
//! ready as it is made, counted in the transaction by its index, and the
//! commit carries the rest.

use super::*;

fn streaming(app: &Parsley, limit: Duration) -> Worker {
    Worker::new(
        app,
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            // Every record's emissions go out at the next ready.
            stream_records: Some(Streaming::within(limit).every(1)),
            ..WorkerConfig::default()
        },
    )
}

/// A streaming worker on one partition after two records: the first's
/// emission streamed (and taken), the second's made but not taken yet.
fn one_streamed_one_not() -> (Cluster, Worker) {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started_with(&cluster, streaming(&app, Duration::from_secs(5)));
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.take_produced().1.len(), 1);
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    (cluster, w)
}

fn topics(records: &[OutgoingRecord]) -> Vec<&str> {
    records.iter().map(|r| &*r.topic).collect()
}

fn refused(record: usize, r: &OutgoingRecord) -> Fault {
    Fault::RecordRefused {
        record,
        topic: r.topic.to_string(),
        partition: r.partition,
        origin: r.origin,
        reason: "too large".to_owned(),
    }
}

/// Each emission goes out as made, and the commit carries what was not
/// streamed (the changelog records) with the index they continue from; a
/// refusal of any record, streamed or not, is pinned on the task that
/// made it by its index in the whole transaction.
#[test]
fn emissions_go_out_as_made_and_the_commit_carries_the_rest() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut w = started_with(&cluster, streaming(&app, Duration::from_secs(5)));
    assert_eq!(w.take_produced(), (0, Vec::new()), "nothing made yet");
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let (at, first) = w.take_produced();
    assert_eq!((at, topics(&first)), (0, vec!["out"]));
    w.on_record(rec("a", 1, 0, "y")).unwrap();
    w.on_record(rec("b", 1, 0, "y")).unwrap();
    let (at, second) = w.take_produced();
    assert_eq!((at, topics(&second)), (1, vec!["out", "out"]));
    let txn = w.poll_transaction(100).unwrap().expect("due");
    assert_eq!(txn.streamed, 3);
    assert!(
        txn.records.iter().all(|r| r.topic.ends_with("-changelog")),
        "the commit carries only what did not go out: {:?}",
        topics(&txn.records)
    );
    // Record 0 was count[0]'s, records 1 and 2 count[1]'s; the commit's
    // own records follow from index 3, count[0]'s first.
    let owner = |w: &mut Worker, index: usize, r: &OutgoingRecord| {
        assert!(matches!(w.on_fault(refused(index, r)), Directive::Abort));
        w.failing_task().map(ToString::to_string)
    };
    assert_eq!(owner(&mut w, 0, &first[0]).as_deref(), Some("count[0]"));
    assert_eq!(owner(&mut w, 2, &second[1]).as_deref(), Some("count[1]"));
    assert_eq!(
        owner(&mut w, 3, &txn.records[0]).as_deref(),
        Some("count[0]")
    );
    let last = txn.streamed + txn.records.len() - 1;
    assert_eq!(
        owner(&mut w, last, &txn.records[txn.records.len() - 1]).as_deref(),
        Some("count[1]")
    );
    // Past the transaction's last record: nothing to pin it on.
    assert!(matches!(
        w.on_fault(refused(last + 1, &first[0])),
        Directive::Fail(_)
    ));
}

/// After a commit the next record opens a new transaction, counted from
/// zero again.
#[test]
fn the_next_transaction_counts_from_zero() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started_with(&cluster, streaming(&app, Duration::from_secs(5)));
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let (_, made) = w.take_produced();
    let txn = w.poll_transaction(100).unwrap().expect("due");
    assert_eq!(txn.streamed, 1);
    cluster.commit(&made);
    cluster.commit(&txn.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    let (at, made) = w.take_produced();
    assert_eq!((at, made.len()), (0, 1));
    assert_eq!(w.flush().unwrap().expect("open").streamed, 1);
}

/// An abort of an open transaction records went out in says so once, and
/// what was made but not taken yet never goes out; the next record opens
/// a new transaction from index zero. An abort with nothing streamed says
/// nothing, and an abort the host made itself (reported as the commit's
/// outcome) is not echoed back.
#[test]
fn an_abort_of_a_streamed_transaction_is_said_once() {
    let (cluster, mut w) = one_streamed_one_not();
    w.abort(&cluster).unwrap();
    assert!(w.take_abort_streamed());
    assert!(!w.take_abort_streamed(), "said once");
    assert_eq!(
        w.take_produced(),
        (0, Vec::new()),
        "the second never goes out"
    );
    assert!(w.take_task_failures().is_empty());
    seek(&mut w);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let (at, made) = w.take_produced();
    assert_eq!((at, made.len()), (0, 1), "a new transaction");
    // The host aborts the handed-over transaction itself.
    let txn = w.flush().unwrap().expect("open");
    assert_eq!(txn.streamed, 1);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert!(!w.take_abort_streamed(), "the host made this abort");
    seek(&mut w);
    // Nothing streamed: an abort has nothing to say.
    w.punctuate(10, &cluster).unwrap();
    w.abort(&cluster).unwrap();
    assert!(!w.take_abort_streamed());
}

/// A transaction whose records went out is due once the limit has passed
/// since its first record, however long the commit interval.
#[test]
fn a_streamed_transaction_is_due_at_its_limit() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let config = WorkerConfig {
        commit_interval: Duration::from_secs(60),
        stream_records: Some(Streaming::within(Duration::from_millis(500)).every(1)),
        ..WorkerConfig::default()
    };
    let mut w = started_with(&cluster, Worker::new(&app, config));
    w.punctuate(1_000, &cluster).unwrap();
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(
        w.commit_due_in(1_000),
        Some(Duration::from_secs(59)),
        "not streamed yet: the interval"
    );
    assert_eq!(w.take_produced().1.len(), 1);
    assert_eq!(w.commit_due_in(1_200), Some(Duration::from_millis(300)));
    assert!(w.poll_transaction(1_499).unwrap().is_none());
    let txn = w
        .poll_transaction(1_500)
        .unwrap()
        .expect("due at the limit");
    assert_eq!(txn.streamed, 1);
}

/// Without the option nothing streams: the commit carries every record,
/// and an abort hands its records back as before.
#[test]
fn without_the_option_everything_goes_at_the_commit() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.take_produced(), (0, Vec::new()));
    let txn = w.flush().unwrap().expect("open");
    assert_eq!(txn.streamed, 0);
    assert!(topics(&txn.records).contains(&"out"));
}

/// A ready that hands a transaction over streams nothing beside it: the
/// transaction carries what was made since the last ready, so a host
/// never produces records of a transaction already in flight.
#[test]
fn a_transaction_handed_over_carries_what_was_not_streamed() {
    let (_, mut w) = one_streamed_one_not();
    let txn = w.poll_transaction(100).unwrap().expect("due");
    assert_eq!(txn.streamed, 1);
    assert_eq!(
        topics(&txn.records).iter().filter(|t| **t == "out").count(),
        1,
        "the second emission comes with the transaction"
    );
    assert_eq!(w.take_produced(), (0, Vec::new()), "and not beside it");
}

/// With `every` above one, what the tasks make waits for a batch: between
/// commit points it goes out once that many records were handed in, all
/// the tasks' records together (each still pinned on its own task by its
/// index), and at a commit point that hands nothing over it goes out
/// whatever the count.
#[test]
fn records_go_out_in_batches() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let config = WorkerConfig {
        commit_interval: Duration::from_millis(100),
        stream_records: Some(Streaming::within(Duration::from_secs(5)).every(3)),
        ..WorkerConfig::default()
    };
    let mut w = started_with(&cluster, Worker::new(&app, config));
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.on_record(rec("a", 1, 0, "y")).unwrap();
    assert_eq!(w.take_produced(), (0, Vec::new()), "two of three handed in");
    assert_eq!(w.stats().streams_held_for_batch, 1);
    w.on_record(rec("b", 0, 0, "x")).unwrap();
    let (at, batch) = w.take_produced();
    assert_eq!((at, topics(&batch)), (0, vec!["out", "out", "out"]));
    // One batch, the tasks' records in task order: count[0]'s two (from
    // a and b), then count[1]'s.
    let owner = |w: &mut Worker, index: usize, r: &OutgoingRecord| {
        assert!(matches!(w.on_fault(refused(index, r)), Directive::Abort));
        w.failing_task().map(ToString::to_string)
    };
    assert_eq!(owner(&mut w, 0, &batch[0]).as_deref(), Some("count[0]"));
    assert_eq!(owner(&mut w, 1, &batch[1]).as_deref(), Some("count[0]"));
    assert_eq!(owner(&mut w, 2, &batch[2]).as_deref(), Some("count[1]"));

    // A fresh worker: one record, then a commit point before the commit
    // is due takes it out alone.
    let mut w = started_with(
        &cluster,
        Worker::new(
            &app,
            WorkerConfig {
                commit_interval: Duration::from_millis(100),
                stream_records: Some(Streaming::within(Duration::from_secs(5)).every(3)),
                ..WorkerConfig::default()
            },
        ),
    );
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.take_produced(), (0, Vec::new()));
    assert!(w.poll_transaction(50).unwrap().is_none(), "not due yet");
    let (at, alone) = w.take_produced();
    assert_eq!((at, topics(&alone)), (0, vec!["out"]));
    // The count starts again from the hand-out.
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.on_record(rec("a", 0, 2, "x")).unwrap();
    assert_eq!(w.take_produced(), (0, Vec::new()));
    w.on_record(rec("a", 0, 3, "x")).unwrap();
    let (at, three) = w.take_produced();
    assert_eq!((at, three.len()), (1, 3));
    let txn = w.poll_transaction(100).unwrap().expect("due");
    assert_eq!(txn.streamed, 4);
}
