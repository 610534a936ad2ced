//! The host core's decisions, one at a time, against a small in-memory
//! cluster: task grouping, start positions, position capture, pacing,
//! abort, fencing, changelogs, sweeps and revocation.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use parsley::protocol::{BrokerOffsets, BrokerOffsetsError, TopicId, TopicOffsets};
use parsley::runtime::changelog::{self, ChangelogError};
use parsley::runtime::host::{ChangelogReader, ChangelogRecord};
use parsley::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
use parsley::runtime::worker::*;
use parsley::task::{OutgoingRecord, TaskEvent};
use parsley::*;

#[path = "worker/backpressure.rs"]
mod backpressure;
#[path = "worker/host.rs"]
mod host;
use host::Worker;
#[path = "worker/held_on_disk.rs"]
mod held_on_disk;
#[path = "worker/streaming.rs"]
mod streaming;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// Topics with partition counts, per-partition end offsets and log starts,
/// and the committed records of every partition (for changelog replay).
#[derive(Default)]
struct Cluster {
    topics: BTreeMap<String, (TopicId, i32)>,
    logs: RefCell<BTreeMap<(String, i32), Vec<ChangelogRecord>>>,
    ends: RefCell<BTreeMap<(String, i32), i64>>,
    starts: RefCell<BTreeMap<(String, i32), i64>>,
    fail_log_starts: Cell<bool>,
    /// Changelog reads still to fail.
    fail_reads: Cell<u32>,
    /// End-offset lookups still to fail.
    fail_ends: Cell<u32>,
    /// Changelog partitions whose last stable offset is held back at this
    /// offset (a transaction whose marker has not landed there).
    unstable: RefCell<BTreeMap<(String, i32), i64>>,
}

impl Cluster {
    fn with(topics: &[(&str, i32)]) -> Cluster {
        let mut c = Cluster::default();
        for (i, &(name, n)) in topics.iter().enumerate() {
            c.topics
                .insert(name.to_owned(), (TopicId::from_u128(0x1000 + i as u128), n));
        }
        c
    }

    /// Appends a committed transaction's records (one marker per partition
    /// written, as Kafka does).
    fn commit(&self, records: &[OutgoingRecord]) -> Vec<i64> {
        let mut touched = BTreeSet::new();
        let mut offsets = Vec::new();
        for r in records {
            let key = (r.topic.to_string(), r.partition);
            let offset = self.ends.borrow().get(&key).copied().unwrap_or(0);
            offsets.push(offset);
            self.logs
                .borrow_mut()
                .entry(key.clone())
                .or_default()
                .push(ChangelogRecord {
                    offset,
                    key: r.key.as_deref().map(<[u8]>::to_vec),
                    value: r.value.as_deref().map(<[u8]>::to_vec),
                });
            *self.ends.borrow_mut().entry(key.clone()).or_default() += 1;
            touched.insert(key);
        }
        for key in touched {
            *self.ends.borrow_mut().entry(key).or_default() += 1;
        }
        offsets
    }

    fn name_of(&self, id: TopicId) -> Option<(&String, i32)> {
        self.topics
            .iter()
            .find(|(_, (t, _))| *t == id)
            .map(|(n, (_, p))| (n, *p))
    }

    fn offsets(
        &self,
        topics: &BTreeSet<TopicId>,
        map: &BTreeMap<(String, i32), i64>,
    ) -> BTreeMap<TopicId, TopicOffsets> {
        topics
            .iter()
            .map(|&id| {
                let answer = match self.name_of(id) {
                    Some((name, n)) => TopicOffsets::Present(
                        (0..n)
                            .map(|p| (p, map.get(&(name.clone(), p)).copied().unwrap_or(0)))
                            .collect(),
                    ),
                    None => TopicOffsets::Absent,
                };
                (id, answer)
            })
            .collect()
    }
}

impl TopicMetadata for Cluster {
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
        self.topics
            .get(topic)
            .map(|&(id, partitions)| TopicDescription { id, partitions })
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))
    }
}

impl BrokerOffsets for Cluster {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        if self.fail_ends.get() > 0 {
            self.fail_ends.set(self.fail_ends.get() - 1);
            return Err(BrokerOffsetsError::new("unreachable (test)"));
        }
        Ok(self.offsets(topics, &self.ends.borrow()))
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        if self.fail_log_starts.get() {
            return Err(BrokerOffsetsError::new("broker unreachable (test)"));
        }
        Ok(self.offsets(topics, &self.starts.borrow()))
    }
}

impl ChangelogReader for Cluster {
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        if self.fail_reads.get() > 0 {
            self.fail_reads.set(self.fail_reads.get() - 1);
            return Err(MetadataError::Failed {
                topic: topic.to_owned(),
                message: "unreachable (test)".to_owned(),
            });
        }
        let key = (topic.to_owned(), partition);
        let records = self.logs.borrow().get(&key).cloned().unwrap_or_default();
        // Where a read_committed replay stops: the end, unless a test holds
        // the last stable offset back (a transaction whose marker has not
        // landed here).
        let end = self
            .ends
            .borrow()
            .get(&key)
            .copied()
            .unwrap_or_else(|| records.last().map_or(0, |r| r.offset + 1));
        let stable = self
            .unstable
            .borrow()
            .get(&key)
            .copied()
            .map_or(end, |s| s.min(end));
        for r in records
            .into_iter()
            .filter(|r| r.offset >= from && r.offset < stable)
        {
            apply(r);
        }
        Ok(stable)
    }
}

/// A stateful stage counting per key over `a` and `b`, emitting the count
/// to `out`.
fn counting_app() -> Parsley {
    let (a, b, out) = (topic("a"), topic("b"), topic("out"));
    let o1 = out.clone();
    let o2 = out.clone();
    let stage = Stage::named("count")
        .state(Codec::int64(), || 0)
        .fold(&a, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(o1.send(m.key().cloned(), format!("{}", n + 1)))
        })
        .fold(&b, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(o2.send(m.key().cloned(), format!("{}", n + 1)))
        })
        .sink(&out)
        .build()
        .unwrap();
    Parsley::named("app", [stage]).unwrap()
}

fn counting_cluster(partitions: i32) -> Cluster {
    Cluster::with(&[
        ("a", partitions),
        ("b", partitions),
        ("out", 1),
        ("app-count-state-changelog", partitions),
        ("app-count-fold-changelog", partitions),
    ])
}

fn part(topic: &str, partition: i32) -> AssignedPartition {
    AssignedPartition {
        topic: topic.to_owned(),
        partition,
        committed: None,
        log_start: 0,
        end: Some(0),
        committed_metadata: None,
    }
}

fn rec(topic: &str, partition: i32, offset: i64, key: &str) -> PolledRecord {
    PolledRecord {
        topic: topic.to_owned(),
        partition,
        offset,
        timestamp: 0,
        key: Some(key.as_bytes().to_vec()),
        value: Some(b"v".to_vec()),
        headers: Vec::new(),
    }
}

/// Makes every seek the worker asks for (confirming each) and returns them
/// by topic and partition.
fn seek(w: &mut Worker) -> BTreeMap<(String, i32), i64> {
    let mut out = BTreeMap::new();
    for s in w.take_seeks() {
        w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
        out.insert((s.topic, s.partition), s.offset);
    }
    out
}

fn worker(app: &Parsley) -> Worker {
    Worker::new(
        app,
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            ..WorkerConfig::default()
        },
    )
}

/// A worker that returns a task's start error to its caller instead of
/// stopping the task (as the test driver does), so a test can look at the
/// error itself.
fn worker_reporting_starts(app: &Parsley) -> Worker {
    Worker::new(
        app,
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            stop_tasks_that_cannot_start: false,
            ..WorkerConfig::default()
        },
    )
}

/// Assigns every partition of every task and commits the start
/// transaction.
fn started(app: &Parsley, cluster: &Cluster) -> Worker {
    started_with(cluster, worker(app))
}

/// [`started`] for a worker of the caller's configuration.
fn started_with(cluster: &Cluster, mut w: Worker) -> Worker {
    let n = cluster.topics["a"].1;
    let parts = (0..n).flat_map(|p| [part("a", p), part("b", p)]).collect();
    w.assign(parts, cluster, 0).unwrap();
    seek(&mut w);
    let txn = w.flush().unwrap().expect("init writes");
    let offsets = cluster.commit(&txn.records);
    w.delivered(&offsets);
    w.commit_outcome(CommitOutcome::Committed, cluster).unwrap();
    w
}

/// Flushes the open transaction, appends it to the cluster and reports it
/// committed; returns it.
fn commit(w: &mut Worker, cluster: &Cluster) -> Transaction {
    let txn = w.flush().unwrap().unwrap();
    let offsets = cluster.commit(&txn.records);
    w.delivered(&offsets);
    w.commit_outcome(CommitOutcome::Committed, cluster).unwrap();
    txn
}

/// Another worker (after a rebalance) takes over `from`'s task on `a:0`
/// and `b:0`, from `from`'s committed position on `a:0`.
fn take_over(app: &Parsley, from: &Worker, cluster: &Cluster) -> Worker {
    let mut w = worker(app);
    w.assign(
        vec![
            AssignedPartition {
                committed: from.committed("a", 0),
                ..part("a", 0)
            },
            part("b", 0),
        ],
        cluster,
        0,
    )
    .unwrap();
    w
}

fn delivered(txn: &Transaction) -> Vec<String> {
    txn.events
        .iter()
        .filter_map(|e| match &e.event {
            TaskEvent::Delivered(d) => Some(format!("{}:{}", e.task, d.coordinate)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_task_split_across_workers_is_refused() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut w = worker(&app);
    let err = w
        .assign(vec![part("a", 0), part("b", 1)], &cluster, 0)
        .unwrap_err();
    match &err {
        WorkerError::SplitTask {
            task,
            needed,
            assigned,
        } => {
            assert_eq!(task.partition, 0);
            assert_eq!(needed, &vec!["a:0".to_owned(), "b:0".to_owned()]);
            assert_eq!(assigned, &vec!["a:0".to_owned()]);
        }
        other => panic!("expected SplitTask, got {other}"),
    }
    assert!(err.to_string().contains("range assignor"), "{err}");
    // The whole assignment was refused before anything changed.
    assert_eq!(w.assignment().count(), 0);
    assert!(matches!(
        w.on_record(rec("a", 0, 0, "k")),
        Err(WorkerError::NotAssigned { .. })
    ));
}

#[test]
fn a_partition_no_stage_consumes_is_refused() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = worker(&app);
    let err = w.assign(vec![part("out", 0)], &cluster, 0).unwrap_err();
    assert!(matches!(err, WorkerError::UnknownPartition { .. }), "{err}");
}

/// A committed position marked by `parsley reset` (a reset that began and
/// did not finish) refuses the whole assignment before any task starts;
/// other metadata is none of the worker's business.
#[test]
fn a_position_marked_by_an_unfinished_reset_refuses_the_assignment() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = worker(&app);
    let marked = AssignedPartition {
        committed: Some(3),
        committed_metadata: Some(parsley::protocol::host::RESET_IN_PROGRESS.to_owned()),
        ..part("a", 0)
    };
    let err = w.assign(vec![marked], &cluster, 0).unwrap_err();
    match &err {
        WorkerError::ResetUnfinished { topic, partition } => {
            assert_eq!((topic.as_str(), *partition), ("a", 0));
        }
        other => panic!("expected ResetUnfinished, got {other}"),
    }
    assert!(err.to_string().contains("parsley reset again"), "{err}");
    assert_eq!(w.assignment().count(), 0);
    assert_eq!(w.tasks().count(), 0);

    let mut w = worker(&app);
    let other = AssignedPartition {
        committed: Some(3),
        committed_metadata: Some("a note of someone else's".to_owned()),
        ..part("a", 0)
    };
    w.assign(vec![other, part("b", 0)], &cluster, 0).unwrap();
    assert_eq!(w.tasks().count(), 1);
}

#[test]
fn start_positions_follow_resume_committed_policy_and_the_log_start() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = worker(&app);
    w.assign(
        vec![
            AssignedPartition {
                committed: Some(7),
                log_start: 2,
                end: Some(20),
                committed_metadata: None,
                ..part("a", 0)
            },
            AssignedPartition {
                committed: None,
                log_start: 3,
                end: Some(9),
                committed_metadata: None,
                ..part("b", 0)
            },
        ],
        &cluster,
        0,
    )
    .unwrap();
    let seeks: BTreeMap<String, i64> = seek(&mut w).into_iter().map(|((t, _), o)| (t, o)).collect();
    assert_eq!(seeks["a"], 7, "the committed position");
    assert_eq!(seeks["b"], 3, "earliest: the log start");

    // Latest starts at the end.
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            start_policy: StartPolicy::Latest,
            ..WorkerConfig::default()
        },
    );
    w.assign(
        vec![
            AssignedPartition {
                committed: Some(11),
                log_start: 4,
                end: Some(20),
                committed_metadata: None,
                ..part("a", 0)
            },
            AssignedPartition {
                end: Some(9),
                committed_metadata: None,
                ..part("b", 0)
            },
        ],
        &cluster,
        0,
    )
    .unwrap();
    let seeks: BTreeMap<String, i64> = seek(&mut w).into_iter().map(|((t, _), o)| (t, o)).collect();
    assert_eq!(seeks["a"], 11);
    assert_eq!(seeks["b"], 9);
}

/// A committed position below the log start means retention removed
/// records the stage never read: the task fails, naming the partition and
/// both offsets, unless the configuration says to go on from the log start.
#[test]
fn a_committed_position_below_the_log_start_fails_unless_told_to_resume() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let lost = || {
        vec![
            AssignedPartition {
                committed: Some(1),
                log_start: 4,
                ..part("a", 0)
            },
            part("b", 0),
        ]
    };
    let mut w = worker_reporting_starts(&app);
    let err = w.assign(lost(), &cluster, 0).unwrap_err();
    match &err {
        WorkerError::RetentionLoss {
            topic,
            partition,
            committed,
            log_start,
            ..
        } => assert_eq!(
            (topic.as_str(), *partition, *committed, *log_start),
            ("a", 0, 1, 4)
        ),
        other => panic!("expected a retention loss, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("a:0") && text.contains("offset 1") && text.contains("starts at 4"),
        "{text}"
    );
    assert!(
        text.contains("ResumeAtLogStart"),
        "the error says what to change: {text}"
    );
    assert!(w.take_seeks().is_empty(), "no seek past the loss");

    let mut w = Worker::new(
        &app,
        WorkerConfig {
            on_retention_loss: OnRetentionLoss::ResumeAtLogStart,
            ..WorkerConfig::default()
        },
    );
    w.assign(lost(), &cluster, 0).unwrap();
    let seeks: BTreeMap<String, i64> = seek(&mut w).into_iter().map(|((t, _), o)| (t, o)).collect();
    assert_eq!(seeks["a"], 4, "on from the log start, as configured");
    assert_eq!(w.stats().retention_losses, 1);
}

/// A late joiner whose last stable offset is unknown does not start (at
/// the high watermark or anywhere else); one with a committed position
/// does not need it.
#[test]
fn a_late_joiner_without_a_known_end_does_not_guess() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let latest = || {
        Worker::new(
            &app,
            WorkerConfig {
                start_policy: StartPolicy::Latest,
                stop_tasks_that_cannot_start: false,
                ..WorkerConfig::default()
            },
        )
    };
    let mut w = latest();
    let err = w
        .assign(
            vec![
                AssignedPartition {
                    end: None,
                    committed_metadata: None,
                    ..part("a", 0)
                },
                part("b", 0),
            ],
            &cluster,
            0,
        )
        .unwrap_err();
    assert!(
        matches!(&err, WorkerError::EndUnknown { topic, partition: 0, .. } if topic == "a"),
        "{err}"
    );
    let mut w = latest();
    w.assign(
        vec![
            AssignedPartition {
                committed: Some(5),
                end: None,
                committed_metadata: None,
                ..part("a", 0)
            },
            part("b", 0),
        ],
        &cluster,
        0,
    )
    .unwrap();
    let seeks: BTreeMap<String, i64> = seek(&mut w).into_iter().map(|((t, _), o)| (t, o)).collect();
    assert_eq!(seeks["a"], 5);
}

#[test]
fn a_position_waits_for_the_records_the_poll_returned_below_it() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    let a0 = {
        let t = w.tasks().next().unwrap().clone();
        w.task(&t).unwrap().inputs()[0].channel
    };
    // A poll returned a@0 and a@1 (then a marker): the consumer's position
    // is 3, but only a@0 has been handed over so far.
    w.on_record(rec("a", 0, 0, "k")).unwrap();
    w.on_position("a", 0, 3, Some(1)).unwrap();
    let task = w.tasks().next().unwrap().clone();
    let view = |w: &Worker| w.task(&task).unwrap().node().channel_view(a0).unwrap();
    assert_eq!(view(&w).position, 0, "deferred: a@1 is not handed over yet");
    assert_eq!(w.stats().positions_deferred, 1);
    // Handing a@1 over releases the position.
    w.on_record(rec("a", 0, 1, "k")).unwrap();
    assert_eq!(view(&w).position, 3);
    assert_eq!(view(&w).frontier, 2, "the trailing marker is covered");
    // A position behind what was handed over is refused.
    let err = w.on_position("a", 0, 2, None).unwrap_err();
    assert!(matches!(err, WorkerError::PositionBehind { .. }), "{err}");
}

#[test]
fn transactions_are_paced_and_span_tasks() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.on_record(rec("a", 1, 0, "y")).unwrap();
    // The interval runs from the previous hand-over (the start
    // transaction, at 0).
    assert_eq!(w.commit_due_in(50), Some(Duration::from_millis(50)));
    assert!(w.poll_transaction(50).unwrap().is_none(), "not due yet");
    assert!(w.poll_transaction(99).unwrap().is_none(), "not due yet");
    let txn = w.poll_transaction(100).unwrap().expect("due");
    assert_eq!(
        delivered(&txn),
        vec!["count[0]:a:0@0".to_owned(), "count[1]:a:1@0".to_owned()]
    );
    // Emissions first, then the changelog records of both stores, per task.
    let topics: Vec<&str> = txn.records.iter().map(|r| &*r.topic).collect();
    assert_eq!(topics.iter().filter(|t| **t == "out").count(), 2);
    assert!(topics.contains(&"app-count-state-changelog"));
    assert!(topics.contains(&"app-count-fold-changelog"));
    let fold_partitions: BTreeSet<i32> = txn
        .records
        .iter()
        .filter(|r| &*r.topic == "app-count-fold-changelog")
        .map(|r| r.partition)
        .collect();
    assert_eq!(fold_partitions, BTreeSet::from([0, 1]), "partition = task");
    let offsets: BTreeSet<(String, i32, i64)> = txn
        .offsets
        .iter()
        .map(|o| (o.topic.clone(), o.partition, o.offset))
        .collect();
    assert!(offsets.contains(&("a".to_owned(), 0, 1)));
    assert!(offsets.contains(&("a".to_owned(), 1, 1)));
    // Nothing else is accepted while the transaction is in flight.
    assert!(matches!(
        w.on_record(rec("a", 0, 1, "x")),
        Err(WorkerError::CommitInFlight)
    ));
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    assert_eq!(w.committed("a", 0), Some(1));
}

/// A commit takes its time out of the interval, not on top of it, and a
/// record after a quiet spell commits at once: at most one transaction per
/// interval, and no record waits longer than one.
#[test]
fn the_commit_interval_runs_from_the_previous_hand_over() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    assert_eq!(w.commit_due_in(10), None, "nothing open, nothing due");
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let txn = w.poll_transaction(100).unwrap().expect("due at 100");
    // The commit took 30 ms; the next record is handed over after it.
    cluster.commit(&txn.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    assert_eq!(w.commit_due_in(130), Some(Duration::from_millis(70)));
    assert!(w.poll_transaction(199).unwrap().is_none(), "not due yet");
    let txn = w
        .poll_transaction(200)
        .unwrap()
        .expect("due at 200, not 230");
    cluster.commit(&txn.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    // Quiet for a second: the next record is due at the next call.
    w.on_record(rec("a", 0, 2, "x")).unwrap();
    assert_eq!(w.commit_due_in(1_200), Some(Duration::ZERO));
    assert!(w.poll_transaction(1_200).unwrap().is_some(), "due at once");
}

/// With `commit_when_idle`, open work is due at the floor once the host
/// says its fetch is drained, and only then; the floor counts from the
/// first commit point after the previous commit ended, not from its
/// hand-over, so a slow commit still leaves the floor of processing before
/// the next. A record handed over after the drain puts the interval back,
/// and a worker without the option waits for the interval however idle its
/// host is.
#[test]
fn a_drained_fetch_commits_at_the_floor_when_asked() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let config = |idle| WorkerConfig {
        commit_interval: Duration::from_millis(100),
        commit_when_idle: idle,
        ..WorkerConfig::default()
    };
    let floor = Some(Duration::from_millis(10));
    let mut w = started_with(&cluster, Worker::new(&app, config(floor)));
    let handed = |w: &mut Worker, at: i64| {
        let txn = w.poll_transaction(at).unwrap().expect("due");
        cluster.commit(&txn.records);
        w.commit_outcome(CommitOutcome::Committed, &cluster)
            .unwrap();
    };
    // The start's transaction was handed over at 0: work at 2 waits for
    // the interval while the fetch is busy.
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.commit_due_in(2), Some(Duration::from_millis(98)));
    // Drained: the floor starts at the first commit point after the
    // start's commit ended (here 2), and is due 10 ms later.
    w.fetch_drained();
    assert_eq!(w.commit_due_in(2), Some(Duration::from_millis(10)));
    assert_eq!(w.next_wake(2), Some(Duration::from_millis(10)));
    assert!(w.poll_transaction(2).unwrap().is_none(), "the floor starts");
    assert!(w.poll_transaction(11).unwrap().is_none(), "not before it");
    handed(&mut w, 12);
    assert_eq!(w.stats().idle_commits, 1);
    // A record after the drain: the fetch is busy again, the interval
    // (from the hand-over at 12) holds.
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    assert_eq!(w.commit_due_in(40), Some(Duration::from_millis(72)));
    assert!(w.poll_transaction(40).unwrap().is_none());
    // Drained again: the commit that ended at 12 was first followed by a
    // commit point at 40, so the floor runs to 50.
    w.fetch_drained();
    assert!(w.poll_transaction(49).unwrap().is_none());
    handed(&mut w, 50);
    assert_eq!(w.stats().idle_commits, 2);
    // Nothing open: nothing due, drained or not.
    w.fetch_drained();
    assert_eq!(w.commit_due_in(60), None);

    // Without the option, a drained fetch changes nothing.
    let fresh = counting_cluster(1);
    let mut plain = started_with(&fresh, Worker::new(&app, config(None)));
    plain.on_record(rec("a", 0, 0, "x")).unwrap();
    plain.fetch_drained();
    assert_eq!(plain.commit_due_in(10), Some(Duration::from_millis(90)));
    assert!(plain.poll_transaction(50).unwrap().is_none());
    assert_eq!(plain.stats().idle_commits, 0);
}

#[test]
fn an_abort_returns_every_task_to_committed_state_and_seeks_back() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let first = w.flush().unwrap().unwrap();
    cluster.commit(&first.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.take_seeks();

    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.on_record(rec("b", 0, 0, "x")).unwrap();
    let doomed = w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.stats().aborts, 1);
    let seeks = seek(&mut w);
    assert_eq!(
        seeks,
        BTreeMap::from([(("a".into(), 0), 1), (("b".into(), 0), 0)])
    );
    let task = w.tasks().next().unwrap().clone();
    let state = w
        .task(&task)
        .unwrap()
        .fold_state(&FoldKey::Key(b"x".to_vec()));
    assert_eq!(
        state.as_deref(),
        Some(&1i64.to_be_bytes()[..]),
        "the committed count"
    );

    // The retry redelivers the same records in the same order and emits
    // the same records (the stamps may claim more: the new incarnation's
    // own-output seed covers what was appended since).
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.on_record(rec("b", 0, 0, "x")).unwrap();
    let retry = w.flush().unwrap().unwrap();
    type Emitted = (String, i32, Option<Vec<u8>>, Option<Vec<u8>>);
    let out = |t: &Transaction| -> Vec<Emitted> {
        t.records
            .iter()
            .filter(|r| &*r.topic == "out")
            .map(|r| {
                (
                    r.topic.to_string(),
                    r.partition,
                    r.key.as_deref().map(<[u8]>::to_vec),
                    r.value.as_deref().map(<[u8]>::to_vec),
                )
            })
            .collect()
    };
    assert_eq!(out(&retry), out(&doomed));
    assert_eq!(delivered(&retry), delivered(&doomed));
}

#[test]
fn a_task_failure_requires_an_abort_and_the_abandoned_records_come_back() {
    let (a, out) = (topic("a"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(
            &a,
            move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
                if m.key().map(String::as_str) == Some("bad") {
                    return Err("no".into());
                }
                Ok(vec![o.send(m.key().cloned(), "ok")])
            },
        )
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = Cluster::with(&[("a", 1), ("out", 1), ("app-s-state-changelog", 1)]);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0)], &cluster, 0).unwrap();
    seek(&mut w);
    w.on_record(rec("a", 0, 0, "good")).unwrap();
    let err = w.on_record(rec("a", 0, 1, "bad")).unwrap_err();
    assert!(matches!(err, WorkerError::Task(_)), "{err}");
    assert!(matches!(w.flush(), Err(WorkerError::AbortRequired { .. })));
    assert_eq!(w.revoke_plan(false), RevokePlan::Abort);
    w.abort(&cluster).unwrap();
    let ready = w.ready(None).unwrap();
    assert_eq!(
        ready.abandoned.len(),
        1,
        "good's emission was produced and aborted"
    );
    assert_eq!(&*ready.abandoned[0].topic, "out");
    // The failed task stopped: no seek until it restarts.
    assert!(ready.seeks.is_empty());
    let failures = ready.failures;
    assert_eq!(failures.len(), 1);
    assert!(failures[0].error.contains("no"), "{:?}", failures[0]);
    assert_eq!(
        w.restart_task(&failures[0].task, &cluster).unwrap(),
        Some(Duration::from_millis(500)),
        "the default backoff's first step"
    );
    w.punctuate(500, &cluster).unwrap();
    assert_eq!(seek(&mut w)[&("a".to_owned(), 0)], 0);
}

/// A stage over `a` whose handler fails on key "bad" while `failing` is
/// set, echoing everything else to `out`.
fn failing_app(failing: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Parsley {
    use std::sync::atomic::Ordering;
    let (a, out) = (topic("a"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(
            &a,
            move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
                if m.key().map(String::as_str) == Some("bad") && failing.load(Ordering::SeqCst) {
                    return Err("refused".into());
                }
                Ok(vec![o.send(m.key().cloned(), m.key().cloned())])
            },
        )
        .sink(&out)
        .build()
        .unwrap();
    Parsley::named("app", [stage]).unwrap()
}

fn failing_cluster() -> Cluster {
    Cluster::with(&[("a", 2), ("out", 1), ("app-s-state-changelog", 2)])
}

fn backoff_worker(app: &Parsley, cluster: &Cluster) -> Worker {
    let mut w = Worker::new(
        app,
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            task_backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(1_000),
            },
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("a", 1)], cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, cluster);
    w
}

fn task(stage: &str, partition: i32) -> TaskId {
    TaskId {
        stage: stage.to_owned(),
        partition,
    }
}

/// One task's failure stops that task alone: the other task goes on and
/// commits, the failed one's records are dropped and its position is not
/// committed past the failing record, and it restarts only when asked, one
/// backoff step later, from its committed position.
#[test]
fn a_failed_task_stops_alone_and_restarts_after_its_backoff() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let app = failing_app(failing.clone());
    let cluster = failing_cluster();
    let mut w = backoff_worker(&app, &cluster);
    w.on_record(rec("a", 0, 0, "good")).unwrap();
    w.on_record(rec("a", 1, 0, "ok")).unwrap();
    assert!(w.on_record(rec("a", 1, 1, "bad")).is_err());
    w.abort(&cluster).unwrap();
    let seeks = seek(&mut w);
    assert_eq!(seeks.get(&("a".to_owned(), 0)), Some(&0), "s[0] rolls back");
    assert!(
        !seeks.contains_key(&("a".to_owned(), 1)),
        "s[1] stopped: {seeks:?}"
    );
    assert_eq!(
        w.take_task_failures()
            .iter()
            .map(|f| f.task.clone())
            .collect::<Vec<_>>(),
        vec![task("s", 1)]
    );
    assert_eq!(
        w.stopped_tasks().cloned().collect::<Vec<_>>(),
        vec![task("s", 1)]
    );
    // s[0] carries on; s[1]'s records are dropped.
    w.on_record(rec("a", 0, 0, "good")).unwrap();
    w.on_record(rec("a", 1, 0, "ok")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn), vec!["s[0]:a:0@0"]);
    assert!(
        txn.offsets.iter().all(|o| o.partition == 0),
        "nothing is committed for the stopped task: {:?}",
        txn.offsets
    );
    assert_eq!(w.stats().task_failures, 1);
    // Not restarted without the handler's word, however long it waits.
    w.punctuate(5_000, &cluster).unwrap();
    assert!(w.tasks().all(|t| t.partition == 0));
    // Asked to: one step of the backoff later, from its committed position.
    let wait = w.restart_task(&task("s", 1), &cluster).unwrap();
    assert_eq!(wait, Some(Duration::from_millis(100)));
    assert_eq!(w.restart_due_in(5_000), Some(Duration::from_millis(100)));
    w.punctuate(5_099, &cluster).unwrap();
    assert_eq!(w.stopped_tasks().count(), 1, "not due yet");
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    w.punctuate(5_100, &cluster).unwrap();
    assert_eq!(w.stopped_tasks().count(), 0);
    assert_eq!(w.stats().task_restarts, 1);
    assert_eq!(seek(&mut w).get(&("a".to_owned(), 1)), Some(&0));
    w.on_record(rec("a", 1, 0, "ok")).unwrap();
    w.on_record(rec("a", 1, 1, "bad")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn), vec!["s[1]:a:1@0", "s[1]:a:1@1"]);
}

/// A codec's transient failure (a schema registry that is down) reaches the
/// host's handler marked as such, so the host can retry without stopping;
/// a codec's other failures do not.
#[test]
fn a_transient_codec_failure_is_reported_as_transient() {
    let value: Codec<String> = Codec::try_new(
        |v: &String| Ok::<_, CodecError>(v.as_bytes().to_vec()),
        |b: &[u8]| match b {
            b"down" => Err(CodecError::transient("schema 7: the registry is down")),
            b"junk" => Err(CodecError::new("not a record")),
            _ => Ok(String::from_utf8_lossy(b).into_owned()),
        },
    );
    let (a, out) = (Topic::new("a", Codec::utf8(), value), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&a, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), m.value().cloned())]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = failing_cluster();
    let mut w = backoff_worker(&app, &cluster);
    let with_value = |offset: i64, value: &[u8]| PolledRecord {
        value: Some(value.to_vec()),
        ..rec("a", 1, offset, "k")
    };
    let mut now = 0;
    for (value, transient) in [(&b"down"[..], true), (&b"junk"[..], false)] {
        seek(&mut w);
        let e = w.on_record(with_value(0, value)).unwrap_err();
        w.abort(&cluster).unwrap();
        let f = w.take_task_failures();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].transient, transient, "{e}");
        let wait = w.restart_task(&f[0].task, &cluster).unwrap().unwrap();
        now += i64::try_from(wait.as_millis()).unwrap();
        w.punctuate(now, &cluster).unwrap();
    }
}

/// A failure that recurs at once waits one step longer each time; a task
/// that then runs longer than the cap starts the count again.
#[test]
fn a_recurring_task_failure_backs_off_step_by_step() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let app = failing_app(failing.clone());
    let cluster = failing_cluster();
    let mut w = backoff_worker(&app, &cluster);
    let mut now = 0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        seek(&mut w);
        assert!(w.on_record(rec("a", 1, 0, "bad")).is_err());
        w.abort(&cluster).unwrap();
        let f = w.take_task_failures();
        assert_eq!(f.len(), 1, "one report per failure");
        let wait = w.restart_task(&f[0].task, &cluster).unwrap().unwrap();
        waits.push(wait.as_millis());
        now += i64::try_from(wait.as_millis()).unwrap();
        w.punctuate(now, &cluster).unwrap();
        assert_eq!(w.stopped_tasks().count(), 0);
    }
    assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
    // It runs for longer than the cap, then fails: the first step again.
    now += 1_001;
    w.punctuate(now, &cluster).unwrap();
    seek(&mut w);
    assert!(w.on_record(rec("a", 1, 0, "bad")).is_err());
    w.abort(&cluster).unwrap();
    let f = w.take_task_failures();
    assert_eq!(f[0].earlier_in_a_row, 0);
    assert_eq!(
        w.restart_task(&f[0].task, &cluster).unwrap(),
        Some(Duration::from_millis(100))
    );
}

/// A stopped task whose partitions are revoked is gone: a restart asked
/// for afterwards does nothing, and a new assignment starts it afresh.
#[test]
fn a_stopped_task_leaves_with_its_partitions() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let app = failing_app(failing);
    let cluster = failing_cluster();
    let mut w = backoff_worker(&app, &cluster);
    assert!(w.on_record(rec("a", 1, 0, "bad")).is_err());
    w.abort(&cluster).unwrap();
    seek(&mut w);
    let f = w.take_task_failures();
    assert_eq!(w.revoke_plan(false), RevokePlan::Nothing);
    w.revoke(&[("a".to_owned(), 1)]).unwrap();
    assert_eq!(w.stopped_tasks().count(), 0);
    assert_eq!(w.restart_task(&f[0].task, &cluster).unwrap(), None);
    w.assign(vec![part("a", 1)], &cluster, 0).unwrap();
    assert!(w.tasks().any(|t| *t == task("s", 1)));
}

#[test]
fn fencing_drops_every_task() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Fenced, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0);
    assert_eq!(w.assignment().count(), 0);
    assert_eq!(w.stats().fenced, 1);
    assert!(matches!(
        w.on_record(rec("a", 0, 1, "x")),
        Err(WorkerError::NotAssigned { .. })
    ));
}

#[test]
fn a_new_worker_restores_both_stores_from_the_changelogs() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    commit(&mut w, &cluster);

    // Another worker (after a rebalance) takes the task over.
    let mut other = take_over(&app, &w, &cluster);
    let task = other.tasks().next().unwrap().clone();
    let t = other.task(&task).unwrap();
    assert_eq!(
        t.fold_state(&FoldKey::Key(b"x".to_vec())).as_deref(),
        Some(&2i64.to_be_bytes()[..])
    );
    assert_eq!(
        t.stores().protocol.len(),
        w.task(&task).unwrap().stores().protocol.len()
    );
    assert_eq!(seek(&mut other)[&("a".to_owned(), 0)], 2);
}

#[test]
fn a_changelog_with_the_wrong_partition_count_is_refused() {
    let app = counting_app();
    let cluster = Cluster::with(&[
        ("a", 2),
        ("b", 2),
        ("out", 1),
        ("app-count-state-changelog", 2),
        ("app-count-fold-changelog", 1),
    ]);
    let mut w = worker_reporting_starts(&app);
    let err = w
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            WorkerError::Changelog(ChangelogError::Partitions {
                expected: 2,
                actual: 1,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn a_failed_truncation_sweep_is_skipped_and_counted() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    // Give the node something stamp-side to sweep: a record claiming a
    // channel it does not consume.
    let mut r = rec("a", 0, 0, "x");
    let mut clock = protocol::VectorClock::new();
    clock.claim_offset(protocol::Channel::new(TopicId::from_u128(0x1002), 0), 0);
    r.headers.push(Header::new("vc", clock.encode()));
    w.on_record(r).unwrap();
    cluster.fail_log_starts.set(true);
    w.punctuate(600_000, &cluster).unwrap();
    assert_eq!(w.stats().truncation_sweeps_skipped, 1);
    assert_eq!(w.stats().sweeps, 0);
    // The task's own count, in its sample, moves with every skip.
    assert_eq!(w.sample().metrics[0].truncation_sweeps_skipped_total, 1);
    w.punctuate(1_200_000, &cluster).unwrap();
    assert_eq!(w.sample().metrics[0].truncation_sweeps_skipped_total, 2);
    // The next interval runs it.
    cluster.fail_log_starts.set(false);
    cluster.starts.borrow_mut().insert(("out".into(), 0), 1);
    w.punctuate(1_800_000, &cluster).unwrap();
    assert_eq!(w.stats().sweeps, 1);
    assert_eq!(w.stats().truncated_entries, 1);
}

#[test]
fn revoking_needs_the_open_work_committed_first() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    assert_eq!(w.revoke_plan(false), RevokePlan::Nothing);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.revoke_plan(false), RevokePlan::Commit);
    assert_eq!(w.revoke_plan(true), RevokePlan::Abort);
    let revoked = [("a".to_owned(), 0), ("b".to_owned(), 0)];
    assert!(matches!(
        w.revoke(&revoked),
        Err(WorkerError::OpenTransaction)
    ));
    commit(&mut w, &cluster);
    w.revoke(&revoked).unwrap();
    assert_eq!(w.tasks().count(), 0);
}

#[test]
fn records_are_refused_until_the_host_confirms_its_seek() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    let seeks = w.take_seeks();
    assert_eq!(seeks.len(), 2);
    let err = w.on_record(rec("a", 0, 0, "k")).unwrap_err();
    assert!(
        matches!(err, WorkerError::SeekNotApplied { offset: 0, .. }),
        "{err}"
    );
}

#[test]
fn a_lost_assignment_aborts_and_revokes_without_looping() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.revoke_plan(true), RevokePlan::Abort);
    w.abort(&cluster).unwrap();
    // The abort reset the tasks; nothing is open any more, so the
    // revocation goes through.
    assert_eq!(w.revoke_plan(true), RevokePlan::Nothing);
    w.revoke(&[("a".to_owned(), 0), ("b".to_owned(), 0)])
        .unwrap();
    assert_eq!(w.tasks().count(), 0);
}

#[test]
fn a_task_whose_start_fails_on_a_lookup_waits_and_retries() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    cluster.fail_reads.set(1);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(w.tasks().count(), 0);
    assert_eq!(w.waiting_tasks().count(), 1);
    assert_eq!(w.stats().task_start_retries, 1);
    assert!(w.take_seeks().is_empty());
    // Nothing is fetched for it while it waits.
    let paused: Vec<(String, i32, bool)> = w
        .take_flow_changes()
        .into_iter()
        .map(|f| (f.topic, f.partition, f.paused))
        .collect();
    assert_eq!(
        paused,
        [("a".to_owned(), 0, true), ("b".to_owned(), 0, true)]
    );
    // An offset out of range on its partitions (a fetch overtaken by
    // retention before the pause) is not a loss of a running task.
    w.offset_out_of_range(&cluster).unwrap();
    // Records of a waiting task are dropped (fetched again after its seek).
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.stats().dropped_while_waiting, 1);
    // Not at once: the lookup is made again after a pause of 200 ms,
    // which the host waits for no longer than it must.
    w.punctuate(10, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0, "not before its pause");
    assert_eq!(w.restart_due_in(10), Some(Duration::from_millis(190)));
    // The first punctuation after it starts it, and fetches again.
    w.punctuate(200, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1);
    assert_eq!(w.restart_due_in(200), None);
    let last: BTreeMap<(String, i32), bool> = w
        .take_flow_changes()
        .into_iter()
        .map(|f| ((f.topic, f.partition), f.paused))
        .collect();
    assert_eq!(
        last.values().copied().collect::<Vec<_>>(),
        [false, false],
        "{last:?}"
    );
    assert_eq!(seek(&mut w)[&("a".to_owned(), 0)], 0);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
}

/// A lookup that keeps failing is made again after 200 ms, then 400, 800,
/// ... up to 5 s, not at every punctuation.
#[test]
fn a_lookup_that_keeps_failing_is_retried_less_and_less_often() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    cluster.fail_reads.set(6);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    let mut now = 0;
    let mut waits = Vec::new();
    while let Some(wait) = w.restart_due_in(now) {
        waits.push(wait.as_millis());
        // Punctuations before it is due change nothing.
        w.punctuate(now + 1, &cluster).unwrap();
        now += i64::try_from(wait.as_millis()).unwrap();
        w.punctuate(now, &cluster).unwrap();
    }
    assert_eq!(waits, [200, 400, 800, 1_600, 3_200, 5_000]);
    assert_eq!(w.tasks().count(), 1, "started once the reads went through");
    assert_eq!(w.stats().task_start_retries, 6);
}

#[test]
fn every_transaction_carries_every_channel_offset() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    let offsets: BTreeMap<(String, i32), i64> = txn
        .offsets
        .iter()
        .map(|o| ((o.topic.clone(), o.partition), o.offset))
        .collect();
    // b:0 did not move, and is committed all the same: the offset commit
    // is what carries the group generation that fences a zombie.
    assert_eq!(
        offsets,
        BTreeMap::from([(("a".into(), 0), 1), (("b".into(), 0), 0)])
    );
}

#[test]
fn an_unknown_commit_outcome_drops_every_task() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Unknown, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0);
    assert_eq!(w.assignment().count(), 0);
    // Fencing outside a commit does the same.
    let mut w = started(&app, &cluster);
    w.fenced();
    assert_eq!(w.tasks().count(), 0);
    assert!(!w.has_open_work());
}

/// Found by the simulator: a task whose reset after an abort fails on a
/// lookup restarts later from its changelog, and must start from the
/// group's latest committed position, not the one its assignment carried.
#[test]
fn a_task_restarted_after_a_failed_reset_starts_from_the_latest_commit() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    commit(&mut w, &cluster);
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap().unwrap();
    cluster.fail_ends.set(1);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0, "the reset failed");
    assert_eq!(w.waiting_tasks().count(), 1);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(
        seek(&mut w)[&("a".to_owned(), 0)],
        1,
        "after a@0, committed"
    );
}

/// A fetched record that waits at the gate is reported, in order, as held.
#[test]
fn a_held_record_is_an_event_of_the_transaction() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    // a@0 claims b@0, which has not arrived.
    let mut r = rec("a", 0, 0, "x");
    let mut clock = protocol::VectorClock::new();
    clock.claim_offset(protocol::Channel::new(TopicId::from_u128(0x1001), 0), 0);
    r.headers.push(Header::new("vc", clock.encode()));
    w.on_record(r).unwrap();
    let txn = w.flush().unwrap().unwrap();
    let held: Vec<String> = txn
        .events
        .iter()
        .filter_map(|e| match &e.event {
            TaskEvent::Held { coordinate } => Some(coordinate.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(held, vec!["a:0@0".to_owned()]);
    assert!(delivered(&txn).is_empty());
}

/// A task hands over one transaction at a time: a second take before the
/// first's outcome is refused (the worker never asks, but a host driving
/// tasks itself must not either).
#[test]
fn a_task_refuses_a_second_commit_in_flight() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut task = parsley::task::Task::init(
        &app,
        "count",
        0,
        parsley::task::TaskStores::default(),
        &cluster,
        &cluster,
        0,
    )
    .unwrap();
    task.take_commit().unwrap();
    assert!(matches!(
        task.take_commit(),
        Err(TaskError::InFlight { .. })
    ));
    task.commit_done();
    assert!(task.take_commit().is_ok());
}

/// A changelog record no store writes (a fold key naming no slot, a
/// protocol key that is not UTF-8) fails the restore with a typed error.
#[test]
fn a_changelog_record_no_store_writes_is_refused() {
    let app = counting_app();
    for (topic, key) in [
        ("app-count-fold-changelog", vec![0x07u8]),
        ("app-count-state-changelog", vec![0xffu8, 0xfe]),
    ] {
        let cluster = counting_cluster(1);
        cluster.logs.borrow_mut().insert(
            (topic.to_owned(), 0),
            vec![ChangelogRecord {
                offset: 0,
                key: Some(key),
                value: Some(vec![1]),
            }],
        );
        let mut w = worker_reporting_starts(&app);
        let err = w
            .assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
            .unwrap_err();
        assert!(
            matches!(err, WorkerError::Changelog(ChangelogError::Corrupt { .. })),
            "{topic}: {err}"
        );
    }
}

/// A task whose changelog reads only up to below the end it started
/// against (the previous owner's last transaction committed, its consumed
/// offsets count, but its marker on the changelog has not landed) does not
/// start on what it read: it waits and tries again, and starts with that
/// transaction's writes once the marker lands. One whose marker never
/// lands stops, alone, once `changelog_stable_wait` has passed, naming the
/// partition and the offsets.
#[test]
fn a_restore_short_of_its_changelogs_end_waits_for_the_marker() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    // The previous owner counted two records of `a` in key "k".
    let mut first = started(&app, &cluster);
    first.on_record(rec("a", 0, 0, "k")).unwrap();
    first.on_record(rec("a", 0, 1, "k")).unwrap();
    let txn = first.flush().unwrap().unwrap();
    cluster.commit(&txn.records);
    first
        .commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    let changelog = ("app-count-fold-changelog".to_owned(), 0);
    let end = cluster.ends.borrow()[&changelog];
    // Its marker on the fold changelog is late: reads stop at its first
    // record there.
    let first_record = cluster.logs.borrow()[&changelog][0].offset;
    cluster
        .unstable
        .borrow_mut()
        .insert(changelog.clone(), first_record);
    let committed = |o| AssignedPartition {
        committed: Some(o),
        ..part("a", 0)
    };
    let mut w = worker(&app);
    w.assign(vec![committed(2), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(w.tasks().count(), 0, "not started on a short read");
    assert_eq!(w.waiting_tasks().count(), 1);
    assert_eq!(w.stats().short_restores, 1);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 0, "still short");
    // The marker lands.
    cluster.unstable.borrow_mut().clear();
    w.punctuate(5_000, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1, "started once the changelog is stable");
    for s in w.take_seeks() {
        w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
    }
    w.on_record(rec("a", 0, 2, "k")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    let counted: Vec<String> = txn
        .records
        .iter()
        .filter(|r| &*r.topic == "out")
        .map(|r| String::from_utf8(r.value.clone().unwrap().into_vec()).unwrap())
        .collect();
    assert_eq!(counted, ["3"], "with the late transaction's writes");
    assert!(end > first_record);

    // A marker that never lands: the task stops after the wait.
    cluster
        .unstable
        .borrow_mut()
        .insert(changelog.clone(), first_record);
    let mut w = worker(&app);
    w.assign(vec![committed(2), part("b", 0)], &cluster, 0)
        .unwrap();
    w.punctuate(14_000, &cluster).unwrap();
    assert!(w.take_task_failures().is_empty(), "still waiting at 14 s");
    w.punctuate(16_000, &cluster).unwrap();
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1, "stopped after 15 s");
    assert!(
        failures[0].error.contains(&format!(
            "app-count-fold-changelog:0 reads only up to offset {first_record}, below its end {end}"
        )),
        "{}",
        failures[0].error
    );
}

/// A task that cannot start for a reason of its own (a changelog record no
/// store writes) stops alone, and the host hears of it as a task failure
/// naming the error; the thread's other task starts and runs, and nothing
/// is refused. Restarted, it fails the same way and stays stopped.
#[test]
fn a_task_that_cannot_start_stops_alone_and_the_others_run() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    cluster.logs.borrow_mut().insert(
        ("app-count-fold-changelog".to_owned(), 1),
        vec![ChangelogRecord {
            offset: 0,
            key: Some(vec![0x07]),
            value: Some(vec![1]),
        }],
    );
    let mut w = worker(&app);
    w.assign(
        vec![part("a", 0), part("b", 0), part("a", 1), part("b", 1)],
        &cluster,
        0,
    )
    .expect("one task's start failure is not the thread's");
    let running: Vec<String> = w.tasks().map(ToString::to_string).collect();
    assert_eq!(running, ["count[0]"]);
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].task.partition, 1);
    assert!(
        failures[0].error.contains("never write"),
        "{}",
        failures[0].error
    );
    assert_eq!(w.stopped_tasks().count(), 1);
    // The running task goes on.
    for s in w.take_seeks() {
        w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
    }
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert!(w.flush().unwrap().is_some());
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    // Restarted, it fails again, alone.
    w.restart_task(&failures[0].task, &cluster).unwrap();
    w.punctuate(10_000, &cluster).unwrap();
    assert_eq!(w.take_task_failures().len(), 1);
    assert_eq!(w.tasks().count(), 1);
}

/// A tick that went into an aborted transaction is emitted again at the
/// next punctuation: the task resumes the committed tick schedule, not a
/// fresh one from the abort (which would lose that tick).
#[test]
fn a_tick_in_an_aborted_transaction_is_emitted_again() {
    let (a, out) = (topic("a"), topic("out"));
    let mut builder = Stage::named("s");
    let sink = builder.add_sink(&out);
    let stage = builder
        .on(&a, |_m| Vec::<Emission>::new())
        .ticks(Duration::from_secs(10), move |t| {
            vec![sink.send(None, t.timestamp().to_string())]
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = Cluster::with(&[
        ("a", 1),
        ("out", 1),
        ("app-s-ticks", 1),
        ("app-s-state-changelog", 1),
    ]);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("app-s-ticks", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    if let Some(txn) = w.flush().unwrap() {
        cluster.commit(&txn.records);
        w.commit_outcome(CommitOutcome::Committed, &cluster)
            .unwrap();
    }
    let ticks = |txn: &Transaction| {
        txn.records
            .iter()
            .filter(|r| &*r.topic == "app-s-ticks")
            .count()
    };
    let id = w.tasks().next().unwrap().clone();
    assert_eq!(w.task(&id).unwrap().next_tick_at(), Some(10_000));
    w.punctuate(10_000, &cluster).unwrap();
    let stats = w.task(&id).unwrap().stats();
    assert_eq!((stats.ticks_emitted, stats.emitted), (1, 1));
    let doomed = w.flush().unwrap().expect("the tick");
    assert_eq!(ticks(&doomed), 1);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    seek(&mut w);
    w.punctuate(10_500, &cluster).unwrap();
    let retry = w.flush().unwrap().expect("the tick again");
    assert_eq!(ticks(&retry), 1, "the aborted tick is emitted again");
}

/// A hold's age starts at the hand-over that made the head, by the host's
/// clock at that moment, not at the last punctuation before it.
#[test]
fn a_hold_ages_from_the_hand_over_not_the_last_punctuation() {
    use parsley::protocol::headers::CLOCK_HEADER;
    use parsley::protocol::{Channel, Header, VectorClock};
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.punctuate(1_000, &cluster).unwrap();
    // The host's clock moves on (it polls, asks for a transaction) with no
    // punctuation in between; then a record that waits on b@0 arrives.
    assert!(w.poll_transaction(5_000).unwrap().is_none());
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(cluster.topics["b"].0, 0), 0);
    let mut held = rec("a", 0, 0, "x");
    held.headers = vec![Header::new(CLOCK_HEADER, clock.encode())];
    w.on_record(held).unwrap();
    w.punctuate(6_000, &cluster).unwrap();
    let task = w.tasks().next().unwrap().clone();
    let holds = w.task(&task).unwrap().held();
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].held_for_ms, 1_000, "from 5000, the hand-over");
}

/// A revoked task's gauges read zero: the facade cannot unregister a
/// series, and a moved task must not keep its old hold age alerting.
#[test]
fn a_revoked_task_zeroes_its_gauges() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use parsley::protocol::headers::CLOCK_HEADER;
    use parsley::protocol::{Channel, Header, VectorClock};
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let held = |snap: &metrics_util::debugging::Snapshotter| {
        snap.snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(k, _, _, v)| {
                let key = k.key();
                (key.name() == "records-held"
                    && key
                        .labels()
                        .any(|l| l.key() == "task-id" && l.value() == "count[0]")
                    && !key.labels().any(|l| l.key() == "topic"))
                .then(|| match v {
                    DebugValue::Gauge(g) => g.into_inner(),
                    _ => f64::NAN,
                })
            })
    };
    metrics::with_local_recorder(&recorder, || {
        let app = counting_app();
        let cluster = counting_cluster(1);
        let mut w = started(&app, &cluster);
        let mut clock = VectorClock::new();
        clock.claim_offset(Channel::new(cluster.topics["b"].0, 0), 0);
        let mut r = rec("a", 0, 0, "x");
        r.headers = vec![Header::new(CLOCK_HEADER, clock.encode())];
        w.on_record(r).unwrap();
        w.sample();
        assert_eq!(held(&snap), Some(1.0));
        commit(&mut w, &cluster);
        // The stub's snapshot drains what it reports: set the gauge again
        // (still one held) and let the revocation be the last thing that
        // sets it before the next snapshot.
        w.sample();
        w.revoke(&[("a".into(), 0), ("b".into(), 0)]).unwrap();
        assert_eq!(held(&snap), Some(0.0), "zeroed when the task left");
        assert!(w.sample().metrics.is_empty());
    });
}

/// `a@offset` stamped as caused by `claims` (topic, partition, offset).
fn stamped(offset: i64, cluster: &Cluster, claims: &[(&str, i32, i64)]) -> PolledRecord {
    let mut clock = parsley::protocol::VectorClock::new();
    for &(t, p, o) in claims {
        clock.claim_offset(parsley::protocol::Channel::new(cluster.topics[t].0, p), o);
    }
    PolledRecord {
        headers: vec![Header::new("vc", clock.encode())],
        ..rec("a", 0, offset, "x")
    }
}

/// What the hosts read off a worker (every one found by a mutant no
/// other test noticed): positions, whether a transaction is in flight,
/// transaction ids, the counters, per-task stats, the published sample and
/// the debug text.
#[test]
fn the_worker_reports_its_positions_transactions_counters_and_samples() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut w = started(&app, &cluster);
    assert_eq!(w.stats().tasks_started, 2);
    assert_eq!(w.stats().restored_with_held, 0);
    assert_eq!(w.stats().commits, 1);
    assert_eq!(w.task_stats().len(), 2);
    let text = format!("{:?}", &*w);
    assert!(text.contains("Worker") && text.contains("app"), "{text}");

    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    assert_eq!(w.position("a", 0), Some(2));
    assert_eq!(w.position("a", 1), Some(0));
    assert_eq!(w.position("nowhere", 0), None);
    assert!(!w.in_flight());
    let first = w.flush().unwrap().unwrap();
    assert!(w.in_flight());
    cluster.commit(&first.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    assert!(!w.in_flight());
    w.on_record(rec("a", 1, 0, "y")).unwrap();
    let second = w.flush().unwrap().unwrap();
    assert_eq!(second.id, first.id + 1);
    cluster.commit(&second.records);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    assert_eq!(w.stats().commits, 3);

    // The sample: due at the first punctuation, with a gauge per task.
    assert_eq!(w.published().at, 0);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.published().at, 1_000);
    assert_eq!(w.published().metrics.len(), 2);
}

/// Assigning a running task's partitions again leaves it running as it is
/// (no second start, no state lost).
#[test]
fn a_repeated_assignment_does_not_restart_a_running_task() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(w.stats().tasks_started, 1);
    let txn = w.flush().unwrap().unwrap();
    assert_eq!(delivered(&txn), vec!["count[0]:a:0@0".to_owned()]);
}

/// A position that moves past a held head changes nothing in the node,
/// but the new position must still be committed: it opens work. A held
/// record restored by another worker is counted.
#[test]
fn a_position_past_a_held_head_opens_work_and_a_restored_hold_is_counted() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    // a@0 waits for b@0.
    w.on_record(stamped(0, &cluster, &[("b", 0, 0)])).unwrap();
    let txn = commit(&mut w, &cluster);
    assert!(delivered(&txn).is_empty());
    assert!(!w.has_open_work());
    w.on_position("a", 0, 3, None).unwrap();
    assert!(w.has_open_work(), "the position must be committed");
    let txn = commit(&mut w, &cluster);
    assert!(
        txn.offsets
            .iter()
            .any(|o| o.topic == "a" && o.partition == 0 && o.offset == 3),
        "{:?}",
        txn.offsets
    );

    let other = take_over(&app, &w, &cluster);
    assert_eq!(other.stats().restored_with_held, 1);
}

/// A truncation sweep that removes stamp entries leaves writes to commit.
#[test]
fn a_sweep_that_truncates_opens_work() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            truncation_interval: Duration::from_millis(10),
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    // a@0 claims out:0 up to 3, a channel the stage does not consume: the
    // claim is carried in its stamps until retention passes it.
    w.on_record(stamped(0, &cluster, &[("out", 0, 3)])).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 1);
    assert!(!w.has_open_work());
    cluster
        .starts
        .borrow_mut()
        .insert(("out".to_owned(), 0), 10);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.stats().truncated_entries, 1);
    assert!(w.has_open_work(), "the truncated clock must be committed");
}

/// A redeploy that adds an input starts it where the task's past ends:
/// the protocol's resume position wins over the start policy (here,
/// earliest would re-read b@0..=5, causes of what was already delivered).
#[test]
fn an_added_input_starts_at_the_protocols_resume_position() {
    let (a, out) = (topic("a"), topic("out"));
    let o = out.clone();
    let v1 = Parsley::named(
        "app",
        [Stage::named("count")
            .state(Codec::int64(), || 0)
            .fold(&a, move |n: i64, m: &Message<String, String>| {
                Step::to(n + 1).emit(o.send(m.key().cloned(), format!("{}", n + 1)))
            })
            .sink(&out)
            .build()
            .unwrap()],
    )
    .unwrap();
    let cluster = counting_cluster(1);
    let mut w = worker(&v1);
    w.assign(vec![part("a", 0)], &cluster, 0).unwrap();
    seek(&mut w);
    // a@0 was caused by b@5, a topic this version does not consume.
    w.on_record(stamped(0, &cluster, &[("b", 0, 5)])).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 1);

    // Version two consumes b as well.
    let v2 = counting_app();
    let mut next = worker(&v2);
    next.assign(
        vec![
            AssignedPartition {
                committed: w.committed("a", 0),
                ..part("a", 0)
            },
            part("b", 0),
        ],
        &cluster,
        0,
    )
    .unwrap();
    let seeks = seek(&mut next);
    assert_eq!(seeks[&("b".to_owned(), 0)], 6, "{seeks:?}");
    assert_eq!(seeks[&("a".to_owned(), 0)], 1);
}

/// What a task reports about its own work (each found by a mutant no
/// other test noticed): its counters, a `Held` event only for a record
/// that was held, open work when a hold is all it did, the tick schedule,
/// the hold warning (once, after the threshold) and its debug text.
#[test]
fn a_task_counts_its_work_and_reports_holds_once() {
    let (a, b, out) = (topic("a"), topic("b"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("count")
        .state(Codec::int64(), || 0)
        .fold(&a, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(o.send(m.key().cloned(), format!("{}", n + 1)))
        })
        .fold(&b, |n: i64, _m: &Message<String, String>| Step::to(n + 1))
        .sink(&out)
        .hold_warning_after(Duration::from_millis(500))
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    let id = w.tasks().next().unwrap().clone();
    let held_events = |txn: &Transaction| {
        txn.events
            .iter()
            .filter(|e| matches!(e.event, TaskEvent::Held { .. }))
            .count()
    };

    // Delivered at once: counted, no Held event.
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(held_events(&txn), 0);
    let t = w.task(&id).unwrap();
    assert_eq!((t.stats().delivered, t.stats().emitted), (1, 1));
    assert_eq!(t.next_tick_at(), None, "the stage does not tick");
    assert!(format!("{t:?}").contains("count"), "{t:?}");

    // Held: the Held event is the task's only work, and it is work.
    w.punctuate(1_000, &cluster).unwrap();
    w.on_record(stamped(1, &cluster, &[("b", 0, 0)])).unwrap();
    assert!(w.task(&id).unwrap().has_work());
    assert_eq!(w.task(&id).unwrap().stats().delivered, 1);
    // The warning comes once the hold is older than the threshold, once.
    w.punctuate(1_400, &cluster).unwrap();
    assert_eq!(w.task(&id).unwrap().stats().hold_warnings, 0, "too early");
    w.punctuate(1_600, &cluster).unwrap();
    assert_eq!(w.sample().metrics[0].records_held_age_max_ms, 600);
    w.punctuate(2_600, &cluster).unwrap();
    assert_eq!(w.task(&id).unwrap().stats().hold_warnings, 1);
    let txn = commit(&mut w, &cluster);
    assert_eq!(held_events(&txn), 1);

    // Its cause releases it.
    w.on_record(rec("b", 0, 0, "x")).unwrap();
    let t = w.task(&id).unwrap();
    assert_eq!(
        (
            t.stats().delivered,
            t.stats().delivered_after_hold,
            t.stats().emitted
        ),
        (3, 1, 2)
    );
}

/// A task partition outside the stage's partition count is refused.
#[test]
fn a_task_outside_the_partition_count_is_refused() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    for partition in [-1, 2] {
        let r = parsley::task::Task::init(
            &app,
            "count",
            partition,
            Default::default(),
            &cluster,
            &cluster,
            0,
        );
        assert!(r.is_err(), "partition {partition}");
    }
    assert!(
        parsley::task::Task::init(&app, "count", 1, Default::default(), &cluster, &cluster, 0)
            .is_ok()
    );
}

/// Two channels held at different times each warn once: the second
/// channel's warning does not repeat the first's. A task handed its stores
/// back keeps them as they were.
#[test]
fn each_held_channel_warns_once_and_a_task_gives_back_its_stores() {
    let (a, b, c, out) = (topic("a"), topic("b"), topic("c"), topic("out"));
    let count = |n: i64, _m: &Message<String, String>| Step::to(n + 1);
    let stage = Stage::named("count")
        .state(Codec::int64(), || 0)
        .fold(&a, count)
        .fold(&b, count)
        .fold(&c, count)
        .sink(&out)
        .hold_warning_after(Duration::from_millis(500))
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = Cluster::with(&[
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("out", 1),
        ("app-count-state-changelog", 1),
        ("app-count-fold-changelog", 1),
    ]);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("b", 0), part("c", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    let id = w.tasks().next().unwrap().clone();
    let waiting_on_c = |topic: &str| PolledRecord {
        topic: topic.to_owned(),
        ..stamped(0, &cluster, &[("c", 0, 0)])
    };
    w.punctuate(1_000, &cluster).unwrap();
    w.on_record(waiting_on_c("a")).unwrap();
    w.punctuate(1_300, &cluster).unwrap();
    w.on_record(waiting_on_c("b")).unwrap();
    w.punctuate(1_600, &cluster).unwrap();
    assert_eq!(w.task(&id).unwrap().stats().hold_warnings, 1);
    w.punctuate(1_900, &cluster).unwrap();
    assert_eq!(w.task(&id).unwrap().stats().hold_warnings, 2);
    w.punctuate(5_000, &cluster).unwrap();
    assert_eq!(w.task(&id).unwrap().stats().hold_warnings, 2);

    commit(&mut w, &cluster);
    let stores = w.task(&id).unwrap().stores().clone();
    assert!(!stores.protocol.is_empty());
    let again =
        parsley::task::Task::init(&app, "count", 0, stores.clone(), &cluster, &cluster, 0).unwrap();
    assert_eq!(again.node().held_count(), 2);
    assert_eq!(again.into_stores().protocol.len(), stores.protocol.len());
}

#[test]
fn a_commit_is_empty_only_without_records_changelog_and_events() {
    use parsley::task::TaskCommit;
    let record = OutgoingRecord {
        topic: "out".into(),
        partition: 0,
        key: None,
        value: None,
        stamp: None,
        headers: Vec::new(),
        timestamp: 0,
        origin: None,
    };
    let with = |r: bool, c: bool, e: bool| TaskCommit {
        records: if r { vec![record.clone()] } else { vec![] },
        changelog: if c { vec![record.clone()] } else { vec![] },
        events: if e {
            vec![TaskEvent::Sent {
                topic: "out".to_owned(),
                partition: 0,
                tick: false,
            }]
        } else {
            vec![]
        },
    };
    assert!(with(false, false, false).is_empty());
    assert!(!with(true, false, false).is_empty());
    assert!(!with(false, true, false).is_empty());
    assert!(!with(false, false, true).is_empty());
}

/// A worker with events off hands over the same transactions as one with
/// them on (records, stamps, changelog writes, offsets, ids), only without
/// the list of what the tasks did: the Kafka runtime turns them off, and
/// nothing it commits may change with that. The scenario holds a record
/// and releases it, so held, released and in-order deliveries all pass.
#[test]
fn events_off_changes_nothing_but_the_events() {
    let app = counting_app();
    let run = |events: bool| {
        let cluster = counting_cluster(1);
        let mut w = Worker::new(
            &app,
            WorkerConfig {
                events,
                ..WorkerConfig::default()
            },
        );
        w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
            .unwrap();
        seek(&mut w);
        let mut txns = vec![commit(&mut w, &cluster)];
        // a@0 waits for b@0; a@1 queues behind it; b@0 releases both.
        w.on_record(stamped(0, &cluster, &[("b", 0, 0)])).unwrap();
        w.on_record(rec("a", 0, 1, "y")).unwrap();
        txns.push(commit(&mut w, &cluster));
        w.on_record(rec("b", 0, 0, "x")).unwrap();
        txns.push(commit(&mut w, &cluster));
        txns
    };
    let (on, off) = (run(true), run(false));
    assert_eq!(on.len(), off.len());
    for (a, b) in on.iter().zip(&off) {
        assert_eq!(
            (a.id, &a.records, &a.offsets),
            (b.id, &b.records, &b.offsets)
        );
        assert!(b.events.is_empty(), "{:?}", b.events);
    }
    // The scenario did what it says: with events on, a hold and then three
    // deliveries, two of them released.
    assert!(
        on[1]
            .events
            .iter()
            .any(|e| matches!(e.event, TaskEvent::Held { .. }))
    );
    assert_eq!(delivered(&on[2]).len(), 3, "{:?}", on[2].events);
    assert_eq!(
        on[2].records.iter().filter(|r| &*r.topic == "out").count(),
        3
    );
}

/// With events off a task still says it has work once a record reached
/// its logic, even one that emits nothing and writes no state: its
/// position and protocol writes must be committed.
#[test]
fn a_task_without_events_still_has_work_after_a_delivery() {
    let (a, b) = (topic("a"), topic("b"));
    let stage = Stage::named("quiet")
        .on(&a, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&b, |_m: &Message<String, String>| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let cluster = Cluster::with(&[("a", 1), ("b", 1), ("app-quiet-state-changelog", 1)]);
    let mut task = parsley::task::Task::init(
        &app,
        "quiet",
        0,
        parsley::task::TaskStores::default(),
        &cluster,
        &cluster,
        0,
    )
    .unwrap();
    task.set_record_events(false);
    task.take_commit().unwrap();
    task.commit_done();
    assert!(!task.has_work());
    let a0 = protocol::Channel::new(cluster.topics["a"].0, 0);
    task.on_record(
        a0,
        &PolledRecord {
            topic: "a".to_owned(),
            partition: 0,
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(b"v".to_vec()),
            headers: Vec::new(),
        },
    )
    .unwrap();
    assert!(task.has_work());
    let commit = task.take_commit().unwrap();
    assert!(commit.events.is_empty() && commit.records.is_empty());
    assert!(!commit.changelog.is_empty(), "the frontier is written");
    task.commit_done();
    assert!(!task.has_work(), "nothing left once committed");
}

/// Feeds `a@offsets` (partition 0, key "x") in order.
fn feed_a(w: &mut Worker, offsets: std::ops::Range<i64>) {
    for offset in offsets {
        w.on_record(rec("a", 0, offset, "x")).unwrap();
    }
}

/// The delivery rate a sample reports is the records delivered since the
/// previous sample over the time between them, per second; a second sample
/// at the same moment reports no rate rather than dividing by zero.
#[test]
fn the_delivery_rate_is_per_second_between_samples() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    w.punctuate(1_000, &cluster).unwrap();
    feed_a(&mut w, 0..4);
    w.punctuate(3_000, &cluster).unwrap();
    let m = &w.published().metrics[0];
    assert_eq!(m.records_delivered_total, 4);
    assert_eq!(m.records_delivered_rate, 2.0, "4 records in 2 s");
    assert_eq!(w.sample().metrics[0].records_delivered_rate, 0.0);
}

/// After an abort the task is rebuilt with fresh counters; the exported
/// total goes on from where it was (redone work counts again), it neither
/// stalls nor goes back.
#[test]
fn delivered_totals_go_on_across_an_abort() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    feed_a(&mut w, 0..2);
    assert_eq!(w.sample().metrics[0].records_delivered_total, 2);
    w.abort(&cluster).unwrap();
    seek(&mut w);
    feed_a(&mut w, 0..3);
    assert_eq!(w.sample().metrics[0].records_delivered_total, 5);
}

/// Records fed at or below the restored frontier (a position committed
/// behind the changelog, here on purpose) are skipped as replays, and the
/// sample counts them.
#[test]
fn replays_below_the_restored_frontier_are_counted() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    feed_a(&mut w, 0..2);
    commit(&mut w, &cluster);
    let mut next = worker(&app);
    next.assign(
        vec![
            AssignedPartition {
                committed: Some(0),
                ..part("a", 0)
            },
            part("b", 0),
        ],
        &cluster,
        0,
    )
    .unwrap();
    assert_eq!(seek(&mut next)[&("a".to_owned(), 0)], 0);
    feed_a(&mut next, 0..3);
    let m = &next.sample().metrics[0];
    assert_eq!(m.replays_skipped_total, 2);
    assert_eq!(m.records_delivered_total, 1);
}

/// Events stay off for a task the worker rebuilds after an abort.
#[test]
fn a_rebuilt_task_keeps_events_off() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            events: false,
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    feed_a(&mut w, 0..1);
    w.abort(&cluster).unwrap();
    seek(&mut w);
    feed_a(&mut w, 0..2);
    let txn = commit(&mut w, &cluster);
    assert_eq!(txn.records.iter().filter(|r| &*r.topic == "out").count(), 2);
    assert!(txn.events.is_empty(), "{:?}", txn.events);
}

/// A task whose restore releases a held record (its cause's channel left
/// the stage) reports that delivery as an event only while events are on.
#[test]
fn turning_events_off_drops_those_of_records_released_at_init() {
    let cluster = counting_cluster(1);
    let (a, out) = (topic("a"), topic("out"));
    let o = out.clone();
    let only_a = Parsley::named(
        "app",
        [Stage::named("count")
            .state(Codec::int64(), || 0)
            .fold(&a, move |n: i64, m: &Message<String, String>| {
                Step::to(n + 1).emit(o.send(m.key().cloned(), format!("{}", n + 1)))
            })
            .sink(&out)
            .build()
            .unwrap()],
    )
    .unwrap();
    // The full app holds a@0, which waits for b@0, and commits the hold.
    let mut clock = protocol::VectorClock::new();
    clock.claim_offset(protocol::Channel::new(cluster.topics["b"].0, 0), 0);
    let stores = || {
        let mut task = parsley::task::Task::init(
            &counting_app(),
            "count",
            0,
            parsley::task::TaskStores::default(),
            &cluster,
            &cluster,
            0,
        )
        .unwrap();
        task.on_record(
            protocol::Channel::new(cluster.topics["a"].0, 0),
            &PolledRecord {
                topic: "a".to_owned(),
                partition: 0,
                offset: 0,
                timestamp: 0,
                key: Some(b"x".to_vec()),
                value: Some(b"v".to_vec()),
                headers: vec![Header::new("vc", clock.encode())],
            },
        )
        .unwrap();
        assert_eq!(task.node().held_count(), 1);
        task.take_commit().unwrap();
        task.commit_done();
        task.into_stores()
    };
    for events in [true, false] {
        let mut task =
            parsley::task::Task::init(&only_a, "count", 0, stores(), &cluster, &cluster, 0)
                .unwrap();
        task.set_record_events(events);
        let commit = task.take_commit().unwrap();
        assert_eq!(commit.records.len(), 1, "released at init and sent");
        let delivered = commit
            .events
            .iter()
            .filter(|e| matches!(e, TaskEvent::Delivered(_)))
            .count();
        assert_eq!(delivered, usize::from(events));
    }
}

/// An out-of-range fetch: a channel whose position lies below its log
/// start lost records it never read. By default that fails, naming both
/// offsets; with the opt-in the channel goes on from the log start (a seek,
/// the frontier past the loss); with no channel below its log start the
/// cause is unknown and the worker refuses to guess.
#[test]
fn an_out_of_range_fetch_is_a_loss_to_fail_on_or_to_resume_past_as_configured() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let feed = |w: &mut Worker| {
        for o in 0..3 {
            w.on_record(rec("a", 0, o, "k")).unwrap();
        }
    };
    // Nothing below its log start: not a loss, and not a guess either.
    let mut w = started(&app, &cluster);
    feed(&mut w);
    let err = w.offset_out_of_range(&cluster).unwrap_err();
    assert!(matches!(err, WorkerError::OffsetOutOfRange), "{err}");

    cluster.starts.borrow_mut().insert(("a".to_owned(), 0), 5);
    let mut w = started(&app, &cluster);
    feed(&mut w);
    let err = w.offset_out_of_range(&cluster).unwrap_err();
    match &err {
        WorkerError::RetentionLoss {
            topic,
            committed,
            log_start,
            ..
        } => assert_eq!((topic.as_str(), *committed, *log_start), ("a", 3, 5)),
        other => panic!("expected a retention loss, got {other}"),
    }
    assert!(w.take_seeks().is_empty(), "no seek past the loss");

    let resuming = Worker::new(
        &app,
        WorkerConfig {
            on_retention_loss: OnRetentionLoss::ResumeAtLogStart,
            ..WorkerConfig::default()
        },
    );
    cluster.starts.borrow_mut().remove(&("a".to_owned(), 0));
    let mut w = started_with(&cluster, resuming);
    feed(&mut w);
    cluster.starts.borrow_mut().insert(("a".to_owned(), 0), 5);
    w.offset_out_of_range(&cluster).unwrap();
    assert_eq!(w.stats().retention_losses, 1);
    let seeks = seek(&mut w);
    assert_eq!(seeks.get(&("a".to_owned(), 0)), Some(&5), "{seeks:?}");
    assert_eq!(seeks.len(), 1, "only the channel that lost records");
    assert_eq!(w.position("a", 0), Some(5));
    // The next record is the log start's, and it is delivered.
    w.on_record(rec("a", 0, 5, "k")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn).len(), 4, "a@0..2, then a@5");
}

/// A worker with work in flight: one record of `a:0` handled and its
/// transaction handed over.
fn in_flight(app: &Parsley, cluster: &Cluster) -> (Worker, Transaction) {
    let mut w = started(app, cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    (w, txn)
}

/// Each fault class gets its directive: fencing, a failed abort, a fatal
/// client and a fatal poll drop every task; an abortable error aborts; a
/// retriable one retries with a doubling wait, up to the configured count,
/// after which the commit's fate is unknown and every task is dropped; a
/// transient poll error changes nothing.
#[test]
fn each_fault_class_gets_its_directive() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let fenced = |fault: Fault| {
        let (mut w, _) = in_flight(&app, &cluster);
        let d = w.on_fault(fault);
        (d, w.tasks().count(), w.assignment().count())
    };
    let (d, tasks, assigned) = fenced(Fault::Fenced("no longer a member".into()));
    assert!(matches!(d, Directive::Rejoin), "{d:?}");
    assert_eq!((tasks, assigned), (0, 0), "fencing drops every task");
    for fault in [
        Fault::Fatal("dead".into()),
        Fault::Poll {
            fatal: true,
            message: "dead".into(),
        },
    ] {
        let (d, tasks, _) = fenced(fault.clone());
        match d {
            Directive::Fail(e) => assert!(
                matches!(*e, WorkerError::Client { .. }) && e.to_string().contains("dead"),
                "{e}"
            ),
            other => panic!("{fault:?}: {other:?}"),
        }
        assert_eq!(tasks, 0, "{fault:?} drops every task");
    }
    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(
        w.on_fault(Fault::Abortable("abort".into())),
        Directive::Abort
    ));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1, "an abort keeps the tasks");
    assert!(
        w.take_task_failures().is_empty(),
        "and no task failed: {:?}",
        w.stopped_tasks().collect::<Vec<_>>()
    );
    assert!(matches!(
        w.on_fault(Fault::Poll {
            fatal: false,
            message: "broker down".into()
        }),
        Directive::Continue
    ));
    assert_eq!(w.tasks().count(), 1);
    // Retries: 100, 200, 400 ms (three, the default), then unknown.
    let (mut w, _) = in_flight(&app, &cluster);
    let mut waits = Vec::new();
    loop {
        match w.on_fault(Fault::Retriable("timed out".into())) {
            Directive::Retry { after } => waits.push(after.as_millis()),
            Directive::Rejoin => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(waits, [100, 200, 400]);
    assert_eq!(w.tasks().count(), 0, "fate unknown: every task dropped");
    assert_eq!(w.stats().commit_retries, 3);
    // A retry that works commits as usual; the count starts again with
    // the next transaction.
    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(
        w.on_fault(Fault::Retriable("timed out".into())),
        Directive::Retry { .. }
    ));
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap().unwrap();
    let d = w.on_fault(Fault::Retriable("timed out".into()));
    assert!(
        matches!(d, Directive::Retry { after } if after == Duration::from_millis(100)),
        "{d:?}"
    );
}

/// A transient fault (a record that timed out while a leader moved, too
/// few in-sync replicas) aborts the transaction and keeps every task, with
/// no task failure (so nothing reaches the production error handler); the
/// ready after the abort asks the host to pause before it polls again,
/// once, for 100 ms, doubling with each such abort in a row, and back to
/// 100 ms once a transaction commits. An abortable client error counts the
/// same way.
#[test]
fn a_transient_fault_aborts_keeps_every_task_and_asks_for_a_growing_pause() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let (mut w, _) = in_flight(&app, &cluster);
    let mut pauses = Vec::new();
    for i in 0..4 {
        let fault = if i == 2 {
            Fault::Abortable("abortable".into())
        } else {
            Fault::Transient("record 0 for out:0 could not be written now: timed out".into())
        };
        assert!(matches!(w.on_fault(fault), Directive::Abort));
        w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
        assert_eq!(w.tasks().count(), 1, "an abort keeps the tasks");
        assert!(w.take_task_failures().is_empty(), "no task failed");
        pauses.push(w.take_backoff().map(|d| d.as_millis()));
        for s in w.take_seeks() {
            w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
        }
        assert_eq!(w.take_backoff(), None, "a pause is asked once");
        w.on_record(rec("a", 0, 0, "x")).unwrap();
        w.flush().unwrap().unwrap();
    }
    assert_eq!(pauses, [Some(100), Some(200), Some(400), Some(800)]);
    assert_eq!(w.stats().transient_aborts, 4);
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap().unwrap();
    assert!(matches!(
        w.on_fault(Fault::Transient("timed out".into())),
        Directive::Abort
    ));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(
        w.take_backoff(),
        Some(Duration::from_millis(100)),
        "a commit starts the count again"
    );
}

/// An abort that could not reach its transaction coordinator (unreachable,
/// or moving to another broker) is made again once, after 100 ms; one that
/// then goes through keeps every task. One that fails again, or that the
/// coordinator refused, asks for a new producer (its initialisation ends
/// the transaction) and keeps the tasks and the membership.
#[test]
fn an_abort_that_cannot_reach_its_coordinator_is_made_again_before_the_producer_goes() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let unreachable = || Fault::AbortFailed {
        retriable: true,
        message: "Failed to end transaction: Local: Timed out".into(),
    };
    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(
        w.on_fault(Fault::Transient("timed out".into())),
        Directive::Abort
    ));
    let mut waits = Vec::new();
    loop {
        match w.on_fault(unreachable()) {
            Directive::Retry { after } => waits.push(after.as_millis()),
            Directive::ReplaceProducer => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(waits, [100]);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1, "a new producer: the tasks stay");
    assert_eq!(w.stats().producer_replacements, 1);

    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(w.on_fault(unreachable()), Directive::Retry { .. }));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1, "the abort went through on its retry");

    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(
        w.on_fault(Fault::AbortFailed {
            retriable: false,
            message: "refused".into()
        }),
        Directive::ReplaceProducer
    ));
}

/// A fenced producer (its coordinator ended the transaction at its
/// timeout, as happens when a broker fails over) is replaced, keeping the
/// tasks and the membership; a producer replaced twice with no commit in
/// between gives the membership up on the third fencing (two members
/// taking one transactional id from each other), and a commit starts the
/// count again.
#[test]
fn a_fenced_producer_is_replaced_and_a_third_in_a_row_gives_the_membership_up() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let fenced = || Fault::ProducerFenced("Local: This instance has been fenced".into());
    let (mut w, _) = in_flight(&app, &cluster);
    for _ in 0..MAX_PRODUCER_REPLACEMENTS {
        assert!(matches!(w.on_fault(fenced()), Directive::ReplaceProducer));
        w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
        assert_eq!(w.tasks().count(), 1, "the tasks stay");
        for s in w.take_seeks() {
            w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
        }
        w.on_record(rec("a", 0, 0, "x")).unwrap();
        w.flush().unwrap().unwrap();
    }
    assert!(matches!(w.on_fault(fenced()), Directive::Rejoin));
    assert_eq!(w.tasks().count(), 0, "given up: every task dropped");

    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(w.on_fault(fenced()), Directive::ReplaceProducer));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    for s in w.take_seeks() {
        w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
    }
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.flush().unwrap().unwrap();
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap().unwrap();
    assert!(
        matches!(w.on_fault(fenced()), Directive::ReplaceProducer),
        "a commit starts the count again"
    );
}

/// Once the host has asked the coordinator to commit (`Worker::ending`),
/// the coordinator may have recorded the commit whatever the client says
/// next. A fenced producer, a call that never returned or a failed abort
/// from there leaves the commit's fate unknown: every task is dropped and
/// the membership given up (the next one reads what was committed from
/// the broker), never rolled back in place, which would process the
/// transaction's input again if it had committed. Before that request
/// the transaction cannot have committed, and the producer is replaced in
/// place as before; the next transaction starts without the mark.
#[test]
fn a_producer_lost_after_asking_to_commit_leaves_the_commit_of_unknown_fate() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let faults: [fn() -> Fault; 4] = [
        || Fault::ProducerFenced("Failed to end transaction: fenced by a newer instance".into()),
        || Fault::ClientHung("ending the transaction did not return".into()),
        || Fault::AbortFailed {
            retriable: false,
            message: "refused".into(),
        },
        || Fault::AbortFailed {
            retriable: true,
            message: "Timed out".into(),
        },
    ];
    for fault in faults {
        let (mut w, _) = in_flight(&app, &cluster);
        w.ending();
        assert!(
            matches!(w.on_fault(fault()), Directive::Rejoin),
            "{:?}",
            fault()
        );
        assert_eq!(w.tasks().count(), 0, "every task dropped: {:?}", fault());
        assert_eq!(w.stats().producer_replacements, 0);
    }
    // Before the request, a fenced producer is replaced in place.
    let fenced = || Fault::ProducerFenced("fenced".into());
    let (mut w, _) = in_flight(&app, &cluster);
    assert!(matches!(w.on_fault(fenced()), Directive::ReplaceProducer));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    for s in w.take_seeks() {
        w.seek_applied(&s.topic, s.partition, s.offset).unwrap();
    }
    // A commit that asked and went through: the next transaction's
    // faults are judged afresh.
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.flush().unwrap().unwrap();
    w.ending();
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap().unwrap();
    assert!(matches!(w.on_fault(fenced()), Directive::ReplaceProducer));
    // A retriable failure of the request itself is still retried.
    let (mut w, _) = in_flight(&app, &cluster);
    w.ending();
    assert!(matches!(
        w.on_fault(Fault::Retriable("Timed out".into())),
        Directive::Retry { .. }
    ));
}

/// A stage that echoes `a` to `out`, its value as the emission's.
fn echo_app() -> Parsley {
    let (a, out) = (topic("a"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&a, move |m: &Message<String, String>| {
            vec![
                o.send(m.key().cloned(), m.key().cloned())
                    .with_header("h", "1"),
            ]
        })
        .sink(&out)
        .build()
        .unwrap();
    Parsley::named("app", [stage]).unwrap()
}

fn seq(r: &OutgoingRecord) -> Option<i64> {
    let causal = parsley::protocol::CausalHeaders::decode(
        r.header_list()
            .iter()
            .map(|h| (h.name(), h.value.as_deref())),
    )
    .unwrap();
    causal.sender.map(|t| t.seq)
}

fn refused_in(w: &mut Worker, txn: &Transaction, i: usize) -> Directive {
    let r = &txn.records[i];
    w.on_fault(Fault::RecordRefused {
        record: i,
        topic: r.topic.to_string(),
        partition: r.partition,
        origin: r.origin,
        reason: "too large".into(),
    })
}

/// A refused emission aborts the transaction and stops the task that made
/// it, naming the record; sent to a dead-letter topic, it goes there
/// unstamped with the dead-letter headers, takes no send sequence (the
/// task's next emission has the next one), and the thread's other task is
/// unaffected.
#[test]
fn a_refused_emission_stops_its_task_and_can_go_to_a_dead_letter_topic() {
    let app = echo_app();
    let cluster = Cluster::with(&[
        ("a", 2),
        ("out", 1),
        ("app-s-state-changelog", 2),
        ("dlq", 3),
    ]);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0), part("a", 1)], &cluster, 0)
        .unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    w.on_record(rec("a", 1, 0, "first")).unwrap();
    let first = commit(&mut w, &cluster);
    let first_seq = seq(&first.records[0]).unwrap();
    w.on_record(rec("a", 0, 0, "other")).unwrap();
    w.on_record(rec("a", 1, 1, "big")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    let big = txn
        .records
        .iter()
        .position(|r| r.key.as_deref() == Some(b"big"))
        .unwrap();
    assert!(matches!(refused_in(&mut w, &txn, big), Directive::Abort));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1);
    let f = &failures[0];
    assert_eq!(f.task, task("s", 1));
    assert!(
        f.error.contains("out:0") && f.error.contains("too large"),
        "{}",
        f.error
    );
    let refused = f.refused.clone().expect("the refused record");
    assert_eq!(
        refused.origin.map(|o| (o.offset, o.ordinal)),
        Some((1, 0)),
        "the first emission of a:1@1"
    );
    assert!(w.divert(&f.task, &refused, "dlq", &cluster).unwrap());
    assert_eq!(w.stopped_tasks().count(), 0, "restarted at once");
    let seeks = seek(&mut w);
    assert_eq!(seeks[&("a".to_owned(), 1)], 1);
    assert_eq!(seeks[&("a".to_owned(), 0)], 0);
    w.on_record(rec("a", 0, 0, "other")).unwrap();
    w.on_record(rec("a", 1, 1, "big")).unwrap();
    w.on_record(rec("a", 1, 2, "after")).unwrap();
    let txn = commit(&mut w, &cluster);
    let to = |topic: &str| -> Vec<&OutgoingRecord> {
        txn.records.iter().filter(|r| &*r.topic == topic).collect()
    };
    let dlq = to("dlq");
    assert_eq!(dlq.len(), 1);
    let d = dlq[0];
    assert_eq!(d.key.as_deref(), Some(&b"big"[..]));
    assert_eq!(seq(d), None, "unstamped");
    let header = |name: &str| {
        d.headers
            .iter()
            .find(|h| h.name() == name)
            .and_then(|h| h.value.clone())
            .map(|v| String::from_utf8(v).unwrap())
    };
    assert_eq!(
        header("h").as_deref(),
        Some("1"),
        "the emission's own header"
    );
    assert_eq!(header(DEAD_LETTER_TOPIC).as_deref(), Some("a"));
    assert_eq!(header(DEAD_LETTER_PARTITION).as_deref(), Some("1"));
    assert_eq!(header(DEAD_LETTER_OFFSET).as_deref(), Some("1"));
    assert_eq!(
        header(parsley::task::DEAD_LETTER_SINK).as_deref(),
        Some("out")
    );
    assert!(header(DEAD_LETTER_ERROR).unwrap().contains("too large"));
    let out: Vec<(Vec<u8>, Option<i64>)> = to("out")
        .iter()
        .map(|r| (r.key.clone().unwrap().into_vec(), seq(r)))
        .collect();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.contains(&(b"other".to_vec(), out[0].1)));
    let after = out.iter().find(|(k, _)| k == b"after").unwrap();
    assert_eq!(
        after.1,
        Some(first_seq + 1),
        "the diverted emission took no send sequence"
    );
    assert_eq!(
        delivered(&txn),
        vec!["s[0]:a:0@0", "s[1]:a:1@1", "s[1]:a:1@2"]
    );
    assert_eq!(w.task(&task("s", 1)).unwrap().stats().diverted, 1);
}

/// What cannot go to a dead-letter topic fails its task: an emission the
/// dead-letter topic refuses in turn (no second diversion), and a record
/// that is not an emission (a changelog record).
#[test]
fn a_refused_dead_letter_or_changelog_record_fails_its_task() {
    let app = echo_app();
    let cluster = Cluster::with(&[
        ("a", 1),
        ("out", 1),
        ("app-s-state-changelog", 1),
        ("dlq", 1),
    ]);
    let mut w = worker(&app);
    w.assign(vec![part("a", 0)], &cluster, 0).unwrap();
    seek(&mut w);
    let init = w.flush().unwrap().unwrap();
    // The init transaction holds only changelog records.
    assert!(matches!(refused_in(&mut w, &init, 0), Directive::Abort));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    let f = w.take_task_failures().remove(0);
    let refused = f.refused.unwrap();
    assert_eq!(refused.origin, None);
    assert!(matches!(
        w.divert(&f.task, &refused, "dlq", &cluster),
        Err(WorkerError::NotAnEmission { .. })
    ));
    w.restart_task(&f.task, &cluster).unwrap();
    w.punctuate(10_000, &cluster).unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    w.on_record(rec("a", 0, 0, "big")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    refused_in(&mut w, &txn, 0);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    let f = w.take_task_failures().remove(0);
    assert!(
        w.divert(&f.task, &f.refused.unwrap(), "dlq", &cluster)
            .unwrap()
    );
    seek(&mut w);
    w.on_record(rec("a", 0, 0, "big")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    assert_eq!(&*txn.records[0].topic, "dlq");
    assert!(matches!(refused_in(&mut w, &txn, 0), Directive::Abort));
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    let f = w.take_task_failures().remove(0);
    assert!(f.refused.is_none(), "not sent anywhere else");
    assert!(f.error.contains("dead-letter topic"), "{}", f.error);
}

fn flow(w: &mut Worker) -> Vec<(String, i32, bool)> {
    w.take_flow_changes()
        .into_iter()
        .map(|f| (f.topic, f.partition, f.paused))
        .collect()
}

/// Under incremental assignment a task forms only once all its partitions
/// are here: until then they are paused and their records dropped, so a
/// half task never delivers; losing one partition closes the task and the
/// rest waits paused again, with the committed state kept in the
/// changelogs. Under complete assignment the same half arrival is refused.
#[test]
fn under_incremental_assignment_a_task_forms_only_with_all_its_partitions() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            assignment: Assignment::Incremental,
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0)], &cluster, 0).unwrap();
    assert_eq!(w.tasks().count(), 0, "no half task");
    assert_eq!(w.partial_tasks().count(), 1);
    assert_eq!(flow(&mut w), [("a".to_owned(), 0, true)]);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(
        w.stats().dropped_while_waiting,
        1,
        "its records are dropped"
    );
    assert!(!w.has_open_work());
    w.assign(vec![part("b", 0)], &cluster, 0).unwrap();
    assert_eq!(w.tasks().count(), 1, "formed");
    assert_eq!(w.partial_tasks().count(), 0);
    assert_eq!(
        flow(&mut w),
        [("a".to_owned(), 0, false), ("b".to_owned(), 0, false)]
    );
    let seeks = seek(&mut w);
    assert_eq!(seeks.len(), 2, "both channels start from their positions");
    commit(&mut w, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert_eq!(delivered(&txn), ["count[0]:a:0@0"]);
    // b:0 leaves: the task closes, a:0 waits paused.
    w.revoke(&[("b".to_owned(), 0)]).unwrap();
    assert_eq!(w.tasks().count(), 0);
    assert_eq!(w.partial_tasks().count(), 1);
    assert_eq!(flow(&mut w), [("a".to_owned(), 0, true)]);
    // It comes back: the task forms again from its changelogs.
    w.assign(
        vec![AssignedPartition {
            committed: Some(0),
            ..part("b", 0)
        }],
        &cluster,
        0,
    )
    .unwrap();
    assert_eq!(w.tasks().count(), 1);
    let seeks = seek(&mut w);
    assert_eq!(
        seeks[&("a".to_owned(), 0)],
        1,
        "past the committed delivery"
    );
    // All of it leaves: nothing is left waiting.
    commit(&mut w, &cluster);
    w.revoke(&[("a".to_owned(), 0), ("b".to_owned(), 0)])
        .unwrap();
    assert_eq!(w.partial_tasks().count() + w.tasks().count(), 0);
    assert_eq!(w.stats().partial_tasks, 2);

    let mut complete = worker(&app);
    assert!(matches!(
        complete.assign(vec![part("a", 0)], &cluster, 0),
        Err(WorkerError::SplitTask { .. })
    ));
}

/// A revocation drops the seeks of the partitions it takes away, and keeps
/// those of the tasks that stay (rolled back by an abort just before,
/// under incremental assignment).
#[test]
fn a_revocation_drops_the_seeks_of_what_it_takes_and_keeps_the_others() {
    assert_eq!(
        seeks_after_task_1_leaves(false),
        BTreeSet::from([("a".to_owned(), 0), ("b".to_owned(), 0)])
    );
}

/// The same, for a host that took the abort's `Ready` before the
/// revocation and makes its seeks after it (the simulator's bridge and
/// these tests' host keep each part until their scenario asks): what it
/// kept for the partitions that left goes with them
/// (`Ready::forget`), as the worker drops what it still queues.
#[test]
fn a_host_that_kept_a_ready_drops_the_seeks_of_what_a_revocation_takes() {
    assert_eq!(
        seeks_after_task_1_leaves(true),
        BTreeSet::from([("a".to_owned(), 0), ("b".to_owned(), 0)])
    );
}

/// Two tasks under incremental assignment; an abort owes every channel a
/// seek back, and task 1 leaves before they are made. `kept`: the host
/// took the abort's ready before the revocation. The seeks made after.
fn seeks_after_task_1_leaves(kept: bool) -> BTreeSet<(String, i32)> {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            assignment: Assignment::Incremental,
            ..WorkerConfig::default()
        },
    );
    let parts = (0..2).flat_map(|p| [part("a", p), part("b", p)]).collect();
    w.assign(parts, &cluster, 0).unwrap();
    seek(&mut w);
    commit(&mut w, &cluster);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.abort(&cluster).unwrap();
    if kept {
        assert!(w.take_task_failures().is_empty());
    }
    w.revoke(&[("a".to_owned(), 1), ("b".to_owned(), 1)])
        .unwrap();
    seek(&mut w).into_keys().collect()
}

/// A local store kept in memory, shared by the workers of a test (a state
/// directory that outlives each process).
#[derive(Clone, Default)]
struct MemLocal(std::sync::Arc<std::sync::Mutex<BTreeMap<TaskId, LocalSnapshot>>>);

use parsley::runtime::local::{LocalSnapshot, LocalStore, LocalStoreError, LocalWrite, StoreKind};

impl LocalStore for MemLocal {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        Ok(self.0.lock().unwrap().get(task).cloned())
    }

    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        let mut all = self.0.lock().unwrap();
        let s = all.entry(task.clone()).or_default();
        if write.replace {
            *s = LocalSnapshot::default();
        }
        if write.identity.is_some() {
            s.identity = write.identity;
        }
        s.checkpoint.extend(write.checkpoint);
        s.written_at = Some(write.written_at);
        for (kind, key, value) in write.entries {
            let v = match kind {
                StoreKind::Protocol => &mut s.protocol,
                StoreKind::Fold => &mut s.fold,
            };
            v.retain(|(k, _)| k.as_slice() != &*key);
            if let Some(value) = value {
                v.push((key.into_vec(), value.into_vec()));
                v.sort();
            }
        }
        Ok(())
    }

    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.0.lock().unwrap().remove(task);
        Ok(())
    }
}

fn local_worker(app: &Parsley, store: &MemLocal) -> Worker {
    worker(app).with_local_store(Box::new(store.clone()))
}

/// Runs three records through a worker with a local store and commits.
fn counted_three(app: &Parsley, cluster: &Cluster, store: &MemLocal) -> Worker {
    let mut w = started_with(cluster, local_worker(app, store));
    for o in 0..3 {
        w.on_record(rec("a", 0, o, "x")).unwrap();
    }
    commit(&mut w, cluster);
    w
}

fn count_of(w: &Worker) -> Option<Vec<u8>> {
    let task = w.tasks().next()?.clone();
    w.task(&task)?
        .fold_state(&FoldKey::Key(b"x".to_vec()))
        .map(|v| v.to_vec())
}

#[test]
fn a_restart_with_a_local_store_replays_only_the_changelog_after_its_checkpoint() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = MemLocal::default();
    let w = counted_three(&app, &cluster, &store);
    let written = cluster.logs.borrow().values().map(Vec::len).sum::<usize>();
    assert!(written > 0);
    drop(w);

    let mut again = local_worker(&app, &store);
    again
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    let stats = again.stats();
    assert_eq!(stats.local_store_starts, 1);
    assert_eq!(
        stats.changelog_records_replayed, 0,
        "nothing was written after the checkpoint"
    );
    assert_eq!(count_of(&again), Some(3i64.to_be_bytes().to_vec()));

    // Another writer's commit after the checkpoint (the task ran elsewhere
    // meanwhile, without this store): only those records are replayed.
    let mut elsewhere = take_over(&app, &again, &cluster);
    seek(&mut elsewhere);
    elsewhere.on_record(rec("a", 0, 3, "x")).unwrap();
    let txn = commit(&mut elsewhere, &cluster);
    let tail = txn
        .records
        .iter()
        .filter(|r| r.topic.ends_with("-changelog"))
        .count() as u64;
    assert!(tail > 0);
    drop(again);
    let mut back = local_worker(&app, &store);
    back.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(back.stats().local_store_starts, 1);
    assert_eq!(back.stats().changelog_records_replayed, tail);
    assert_eq!(count_of(&back), Some(4i64.to_be_bytes().to_vec()));
}

#[test]
fn a_commit_whose_offsets_were_not_reported_wipes_the_local_store() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = MemLocal::default();
    let mut w = counted_three(&app, &cluster, &store);
    w.on_record(rec("a", 0, 3, "x")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    cluster.commit(&txn.records);
    // No `delivered`: the store cannot say which changelog point it holds.
    w.commit_outcome(CommitOutcome::Committed, &cluster)
        .unwrap();
    assert_eq!(w.stats().local_store_write_failures, 1);
    assert!(store.0.lock().unwrap().is_empty());
    drop(w);
    let mut again = local_worker(&app, &store);
    again
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(again.stats().local_store_starts, 0);
    assert!(again.stats().changelog_records_replayed > 0);
    assert_eq!(count_of(&again), Some(4i64.to_be_bytes().to_vec()));
}

#[test]
fn an_aborted_transaction_never_reaches_the_local_store() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = MemLocal::default();
    let mut w = counted_three(&app, &cluster, &store);
    let before = store.0.lock().unwrap().clone();
    w.on_record(rec("a", 0, 3, "x")).unwrap();
    let txn = w.flush().unwrap().unwrap();
    let offsets: Vec<i64> = (100..100 + txn.records.len() as i64).collect();
    w.delivered(&offsets);
    w.commit_outcome(CommitOutcome::Aborted, &cluster).unwrap();
    assert_eq!(*store.0.lock().unwrap(), before);
}

#[test]
fn a_local_store_of_a_recreated_changelog_or_below_its_log_start_is_rebuilt() {
    let app = counting_app();
    let mut cluster = counting_cluster(1);
    let store = MemLocal::default();
    drop(counted_three(&app, &cluster, &store));
    let task = TaskId {
        stage: "count".into(),
        partition: 0,
    };
    let checkpoint = store.0.lock().unwrap()[&task].checkpoint.clone();

    // The changelog's log start moved past the checkpoint.
    let state = "app-count-state-changelog".to_owned();
    cluster
        .starts
        .borrow_mut()
        .insert((state.clone(), 0), checkpoint[&state] + 1);
    let mut w = local_worker(&app, &store);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(w.stats().local_store_rebuilds, 1);
    assert_eq!(w.stats().local_store_starts, 0);
    drop(w);
    cluster.starts.borrow_mut().clear();

    // The changelog topic was deleted and created again: a new topic id.
    let recreated = TopicId::from_u128(0x9999);
    cluster.topics.get_mut(&state).unwrap().0 = recreated;
    let mut w = local_worker(&app, &store);
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(w.stats().local_store_rebuilds, 1);
    assert!(w.stats().changelog_records_replayed > 0);
    assert_eq!(count_of(&w), Some(3i64.to_be_bytes().to_vec()));
    let rebuilt = store.0.lock().unwrap()[&task].identity.clone().unwrap();
    assert_eq!(rebuilt.changelogs[&state], recreated);
}

#[test]
fn a_local_store_older_than_its_max_age_is_rebuilt() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = MemLocal::default();
    drop(counted_three(&app, &cluster, &store));
    let aged = |max_age| {
        Worker::new(
            &app,
            WorkerConfig {
                local_store_max_age: max_age,
                ..WorkerConfig::default()
            },
        )
        .with_local_store(Box::new(store.clone()))
    };
    // Written at 0 on the workers' clock; opened at 10 s.
    let mut young = aged(Duration::from_secs(60));
    young
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 10_000)
        .unwrap();
    assert_eq!(young.stats().local_store_starts, 1);
    drop(young);
    // Its start rewrote it at 10 s; opened at 20 s with a 5 s bound.
    let mut old = aged(Duration::from_secs(5));
    old.assign(vec![part("a", 0), part("b", 0)], &cluster, 20_000)
        .unwrap();
    assert_eq!(old.stats().local_store_rebuilds, 1);
    assert_eq!(count_of(&old), Some(3i64.to_be_bytes().to_vec()));
}

/// What a restore listener hears, in order.
#[derive(Default)]
struct Heard(std::sync::Mutex<Vec<String>>);

impl parsley::runtime::changelog::RestoreListener for Heard {
    fn on_restore_start(&self, task: &TaskId, topic: &str, partition: i32, from: i64, end: i64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("start {task} {topic}:{partition} {from}..{end}"));
    }
    fn on_batch_restored(
        &self,
        task: &TaskId,
        topic: &str,
        partition: i32,
        restored: u64,
        remaining: u64,
    ) {
        self.0.lock().unwrap().push(format!(
            "batch {task} {topic}:{partition} {restored} restored, {remaining} left"
        ));
    }
    fn on_restore_end(&self, task: &TaskId, topic: &str, partition: i32, restored: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("end {task} {topic}:{partition} {restored}"));
    }
}

#[test]
fn a_restore_reports_its_start_each_batch_and_its_end() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let fold = "app-count-fold-changelog".to_owned();
    let records: Vec<ChangelogRecord> = (0..25_000i64)
        .map(|i| ChangelogRecord {
            offset: i,
            key: Some(FoldKey::Key(format!("k{i}").into_bytes()).to_bytes()),
            value: Some(1i64.to_be_bytes().to_vec()),
        })
        .collect();
    cluster.logs.borrow_mut().insert((fold.clone(), 0), records);
    cluster.ends.borrow_mut().insert((fold.clone(), 0), 25_000);
    let heard = std::sync::Arc::new(Heard::default());
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let mut w = worker(&app).with_restore_listener(heard.clone());
    metrics::with_local_recorder(&recorder, || {
        w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
            .unwrap();
    });
    assert_eq!(w.stats().changelog_records_replayed, 25_000);
    // The restore metrics: records replayed, and nothing left to read.
    let series = snap.snapshot().into_vec();
    let metric = |name: &str| {
        series.iter().find_map(|(k, _, _, v)| {
            let task = k
                .key()
                .labels()
                .any(|l| l.key() == "task-id" && l.value() == "count[0]");
            (k.key().name() == name && task).then_some(v)
        })
    };
    use metrics_util::debugging::DebugValue;
    assert_eq!(
        metric(parsley::runtime::metrics::RECORDS_RESTORED_TOTAL),
        Some(&DebugValue::Counter(25_000))
    );
    assert_eq!(
        metric(parsley::runtime::metrics::RESTORE_REMAINING),
        Some(&DebugValue::Gauge(0.0.into()))
    );
    let heard = heard.0.lock().unwrap().clone();
    assert_eq!(
        heard,
        [
            "start count[0] app-count-state-changelog:0 0..0",
            "end count[0] app-count-state-changelog:0 0",
            "start count[0] app-count-fold-changelog:0 0..25000",
            "batch count[0] app-count-fold-changelog:0 10000 restored, 15000 left",
            "batch count[0] app-count-fold-changelog:0 20000 restored, 5000 left",
            "end count[0] app-count-fold-changelog:0 25000",
        ]
    );
}

#[test]
fn a_local_store_whose_entries_do_not_parse_is_rebuilt_from_the_changelog() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = MemLocal::default();
    drop(counted_three(&app, &cluster, &store));
    let task = TaskId {
        stage: "count".into(),
        partition: 0,
    };
    // A fold entry whose key names no fold slot (bytes no store writes).
    store
        .0
        .lock()
        .unwrap()
        .get_mut(&task)
        .unwrap()
        .fold
        .push((vec![0xff, 0xfe], 1i64.to_be_bytes().to_vec()));
    for mode in [RestoreMode::Inline, RestoreMode::Deferred] {
        let mut w = Worker::new(
            &app,
            WorkerConfig {
                restores: mode,
                ..WorkerConfig::default()
            },
        )
        .with_local_store(Box::new(store.clone()));
        w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
            .unwrap();
        for job in w.take_restore_jobs() {
            let outcome = job.run(&cluster, &cluster);
            w.restored(outcome, &cluster).unwrap();
        }
        assert_eq!(w.stats().local_store_rebuilds, 1, "{mode:?}");
        assert_eq!(w.stats().local_store_starts, 0, "{mode:?}");
        assert_eq!(count_of(&w), Some(3i64.to_be_bytes().to_vec()), "{mode:?}");
        // The rewrite replaced the file: the bad entry is gone.
        let fold = store.0.lock().unwrap()[&task].fold.clone();
        assert!(fold.iter().all(|(k, _)| k != &vec![0xff, 0xfe]), "{mode:?}");
        // Put it back for the next mode.
        store
            .0
            .lock()
            .unwrap()
            .get_mut(&task)
            .unwrap()
            .fold
            .push((vec![0xff, 0xfe], 1i64.to_be_bytes().to_vec()));
    }
}

#[test]
fn a_partition_is_fetched_from_its_task_position_or_else_from_its_log_start() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    // The task cannot start yet (its changelog read fails): it waits.
    cluster.fail_reads.set(1);
    let mut w = worker(&app);
    let at = |offset| AssignedPartition {
        log_start: offset,
        ..part("a", 0)
    };
    w.assign(vec![at(42), part("b", 0)], &cluster, 0).unwrap();
    assert_eq!(w.waiting_tasks().count(), 1);
    // Absolute, never the logical beginning.
    assert_eq!(w.fetch_start("a", 0), 42);
    // Started (at a punctuation once its retry is due): its position,
    // which it seeks to.
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.waiting_tasks().count(), 0);
    let seeks = seek(&mut w);
    assert_eq!(w.fetch_start("a", 0), seeks[&("a".to_owned(), 0)]);
    assert_eq!(w.fetch_start("a", 0), 42);
}

#[test]
fn a_deferred_restore_of_a_task_restarting_in_place_is_not_the_assignment_restoring() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let app = failing_app(failing.clone());
    let cluster = failing_cluster();
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            restores: RestoreMode::Deferred,
            task_backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(1_000),
            },
            ..WorkerConfig::default()
        },
    );
    w.assign(vec![part("a", 0), part("a", 1)], &cluster, 0)
        .unwrap();
    // A new assignment's tasks restore: that is the assignment restoring.
    assert_eq!(w.assignment_restoring().count(), 2);
    for job in w.take_restore_jobs() {
        let outcome = job.run(&cluster, &cluster);
        w.restored(outcome, &cluster).unwrap();
    }
    assert_eq!(w.restoring_tasks().count(), 0);
    seek(&mut w);
    commit(&mut w, &cluster);
    assert!(w.on_record(rec("a", 1, 0, "bad")).is_err());
    w.abort(&cluster).unwrap();
    w.take_task_failures();
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    w.restart_task(&task("s", 1), &cluster).unwrap();
    w.punctuate(1_000, &cluster).unwrap();
    // Restarting in place: restoring, but not the assignment's restore.
    assert_eq!(
        w.restoring_tasks().cloned().collect::<Vec<_>>(),
        vec![task("s", 1)]
    );
    assert_eq!(w.assignment_restoring().count(), 0);
}

/// A restore that replays a tail onto a local store keeps each key's last
/// write for the store, not every record it replayed (finding 5 of the
/// broker-failure review: a long tail that rewrote a few keys was held in
/// memory once per record, besides the stores).
#[test]
fn a_replayed_tail_keeps_one_write_per_key() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    for i in 0..200 {
        w.on_record(rec("a", 0, i, "k")).unwrap();
        commit(&mut w, &cluster);
    }
    let task = task("count", 0);
    let changelogs = changelog::Changelogs {
        state: "app-count-state-changelog",
        fold: Some("app-count-fold-changelog"),
        tasks: 1,
        ends: None,
    };
    // A start at offset 0 of both changelogs: the whole log is the tail.
    let restored = changelog::restore_from(
        &task,
        &changelogs,
        &cluster,
        &cluster,
        Some(changelog::RestoreStart::default()),
        None,
        &mut |_| {},
    )
    .unwrap();
    assert!(restored.replayed >= 400, "replayed {}", restored.replayed);
    let fold_writes = restored
        .tail
        .keys()
        .filter(|(kind, _)| *kind == StoreKind::Fold)
        .count();
    assert_eq!(fold_writes, 1, "one fold key, written 200 times");
    assert!(
        restored.tail.len() < 20,
        "{} writes kept for {} records replayed",
        restored.tail.len(),
        restored.replayed
    );
    assert_eq!(restored.stores.fold.len(), 1);
}

/// [`MemLocal`] that keeps which tasks' files are open, as a file engine
/// that refuses a second open of one file in a process would.
#[derive(Clone, Default)]
struct OpenFiles {
    inner: MemLocal,
    open: std::sync::Arc<std::sync::Mutex<BTreeSet<TaskId>>>,
}

impl OpenFiles {
    fn open_now(&self) -> Vec<TaskId> {
        self.open.lock().unwrap().iter().cloned().collect()
    }
}

impl LocalStore for OpenFiles {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        self.open.lock().unwrap().insert(task.clone());
        self.inner.open(task)
    }
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        self.open.lock().unwrap().insert(task.clone());
        self.inner.write(task, write)
    }
    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.inner.wipe(task)
    }
    fn close(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.open.lock().unwrap().remove(task);
        Ok(())
    }
}

/// A task's file is let go whatever state the task leaves the worker in:
/// revoked while its restore was out, stopped after it failed, unable to
/// start, or dropped with everything when the worker is fenced (finding 4
/// of the broker-failure review: only running tasks were closed, and a
/// task moving to another thread of the instance then ran without its
/// store, the file still held).
#[test]
fn every_task_that_leaves_lets_its_file_go() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = failing_app(failing.clone());
    let cluster = failing_cluster();
    let deferred = || WorkerConfig {
        restores: RestoreMode::Deferred,
        ..WorkerConfig::default()
    };
    let store = OpenFiles::default();
    // Restoring, then revoked before the job ran.
    let mut w = Worker::new(&app, deferred()).with_local_store(Box::new(store.clone()));
    w.assign(vec![part("a", 0), part("a", 1)], &cluster, 0)
        .unwrap();
    assert_eq!(w.restoring_tasks().count(), 2);
    assert_eq!(store.open_now().len(), 2, "each restore opened its file");
    w.revoke(&[("a".to_owned(), 1)]).unwrap();
    assert_eq!(
        store.open_now(),
        [task("s", 0)],
        "the revoked task's file is free"
    );
    // Fenced while restoring: every file goes.
    w.fenced();
    assert!(store.open_now().is_empty());

    // Running, then stopped after a failure.
    let store = OpenFiles::default();
    let mut w = Worker::new(&app, deferred()).with_local_store(Box::new(store.clone()));
    w.assign(vec![part("a", 0), part("a", 1)], &cluster, 0)
        .unwrap();
    for job in w.take_restore_jobs() {
        let outcome = job.run(&cluster, &cluster);
        w.restored(outcome, &cluster).unwrap();
    }
    seek(&mut w);
    commit(&mut w, &cluster);
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(w.on_record(rec("a", 1, 0, "bad")).is_err());
    w.abort(&cluster).unwrap();
    assert_eq!(w.take_task_failures().len(), 1);
    assert_eq!(
        store.open_now(),
        [task("s", 0)],
        "the stopped task's file is free until it restarts"
    );
}

/// [`MemLocal`] with readers: a task's fold state may leave memory.
#[derive(Clone, Default)]
struct ReadableLocal {
    inner: MemLocal,
    applied: std::sync::Arc<std::sync::Mutex<BTreeMap<TaskId, std::sync::Arc<AtomicU64>>>>,
    /// Writes made through a [`LocalWriter`] (a restore's parts).
    parts: std::sync::Arc<AtomicU64>,
    /// The part writes still to go through before the disk fills
    /// (`u64::MAX`: never).
    parts_before_full: std::sync::Arc<AtomicU64>,
    /// The `written_at` of each part written.
    part_times: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    /// Reads fail (a damaged file).
    broken_reads: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Writes land but are not reported applied (a writer thread behind);
    /// the next write once this is off reports both.
    lag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Store writes fail (a full disk).
    writes_fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LocalWriter for ReadableLocal {
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.parts.fetch_add(1, SeqCst);
        self.part_times.lock().unwrap().push(write.written_at);
        if n >= self.parts_before_full.load(SeqCst) {
            return Err(LocalStoreError::Io {
                task: task.clone(),
                message: "no space left on device (test)".into(),
            });
        }
        LocalStore::write(self, task, write)
    }
}

struct MemReader {
    store: MemLocal,
    task: TaskId,
    applied: std::sync::Arc<AtomicU64>,
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

use parsley::runtime::local::{KeyValue, LocalReader, LocalWriter};
use std::sync::atomic::AtomicU64;

impl LocalReader for MemReader {
    fn applied(&self) -> u64 {
        self.applied.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError> {
        Ok(self
            .fold_scan()?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v))
    }
    fn fold_scan(&self) -> Result<Vec<KeyValue>, LocalStoreError> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LocalStoreError::Corrupt {
                task: self.task.clone(),
                reason: "a damaged page (test)".into(),
            });
        }
        let all = self.store.0.lock().unwrap();
        Ok(all
            .get(&self.task)
            .map(|s| s.fold.clone())
            .unwrap_or_default())
    }
    fn protocol_range(
        &self,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), LocalStoreError> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LocalStoreError::Corrupt {
                task: self.task.clone(),
                reason: "a damaged page (test)".into(),
            });
        }
        let all = self.store.0.lock().unwrap();
        for (k, v) in all
            .get(&self.task)
            .map(|s| s.protocol.as_slice())
            .unwrap_or(&[])
        {
            if k.as_slice() >= from && k.as_slice() < to {
                f(k, v);
            }
        }
        Ok(())
    }
}

impl LocalStore for ReadableLocal {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        self.inner.open(task)
    }
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        if self.writes_fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LocalStoreError::Io {
                task: task.clone(),
                message: "no space left on device (test)".into(),
            });
        }
        let seq = write.seq;
        self.inner.write(task, write)?;
        if self.lag.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(a) = self.applied.lock().unwrap().get(task) {
            a.store(seq, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.applied.lock().unwrap().remove(task);
        self.inner.wipe(task)
    }
    fn reader(
        &mut self,
        task: &TaskId,
    ) -> Result<Option<std::sync::Arc<dyn LocalReader>>, LocalStoreError> {
        let applied = std::sync::Arc::new(AtomicU64::new(0));
        self.applied
            .lock()
            .unwrap()
            .insert(task.clone(), applied.clone());
        Ok(Some(std::sync::Arc::new(MemReader {
            store: self.inner.clone(),
            task: task.clone(),
            applied,
            broken: self.broken_reads.clone(),
        })))
    }
    fn reads_while_running(&self) -> bool {
        true
    }
    fn writer(&mut self) -> Option<Box<dyn LocalWriter>> {
        Some(Box::new(self.clone()))
    }
}

/// The fold cache is the worker's, split over its stateful tasks: two
/// tasks together keep no more than the budget in memory, and every count
/// reads back right from the store once it left memory.
#[test]
fn tasks_share_the_worker_fold_cache_and_read_the_rest_back() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let store = ReadableLocal::default();
    let budget = 1_000;
    let w = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(budget),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    let mut w = started_with(&cluster, w);
    let keys = 40;
    for round in 0..2 {
        for p in 0..2 {
            for k in 0..keys {
                let offset = i64::from(round * keys + k);
                w.on_record(rec("a", p, offset, &format!("key-{k}")))
                    .unwrap();
            }
        }
        commit(&mut w, &cluster);
    }
    let ids: Vec<TaskId> = w.tasks().cloned().collect();
    assert_eq!(ids.len(), 2);
    let mut resident = 0;
    for id in &ids {
        let stats = w.task(id).unwrap().stores().fold.cache_stats().unwrap();
        assert_eq!(stats.budget, budget / 2, "{id}: an even share");
        assert!(stats.evicted > 0, "{id}: {stats:?}");
        resident += stats.resident_bytes;
        // Every key counted twice, most of them read back from the store.
        for k in 0..keys {
            let v = w
                .task(id)
                .unwrap()
                .fold_state(&FoldKey::Key(format!("key-{k}").into_bytes()))
                .map(|v| v.to_vec());
            assert_eq!(v, Some(2i64.to_be_bytes().to_vec()), "{id} key-{k}");
        }
        let reads = w
            .task(id)
            .unwrap()
            .stores()
            .fold
            .cache_stats()
            .unwrap()
            .disk_reads;
        assert!(
            reads >= stats.disk_reads + keys as u64 / 2,
            "{id}: {reads} reads"
        );
    }
    assert!(
        resident <= budget,
        "{resident} bytes resident against {budget}"
    );
    assert!(w.stats().fold_cache_evictions > 0);
}

/// Appends a committed record to the counting stage's fold changelog
/// (partition 0): `key-{key}` counts `value`, or is deleted. Returns the
/// record's key and value bytes.
fn append_count(cluster: &Cluster, key: usize, value: Option<i64>) -> (Vec<u8>, Option<Vec<u8>>) {
    let topic = ("app-count-fold-changelog".to_owned(), 0);
    let key = FoldKey::Key(format!("key-{key}").into_bytes()).to_bytes();
    let value = value.map(|v| v.to_be_bytes().to_vec());
    let offset = cluster.ends.borrow().get(&topic).copied().unwrap_or(0);
    cluster
        .logs
        .borrow_mut()
        .entry(topic.clone())
        .or_default()
        .push(ChangelogRecord {
            offset,
            key: Some(key.clone()),
            value: value.clone(),
        });
    *cluster.ends.borrow_mut().entry(topic).or_default() += 1;
    (key, value)
}

/// A rebuild whose fold state is larger than the cache writes it to the
/// local store in parts as it replays: what the task then reads, and what
/// the store holds, is the changelog's last word on every key, deletes
/// included (a key written out in one part and deleted after it stays
/// deleted).
#[test]
fn a_rebuild_larger_than_the_cache_goes_to_the_store_in_parts_and_keeps_deletes() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut append = |key: usize, value: Option<i64>| {
        let (key, value) = append_count(&cluster, key, value);
        match value {
            Some(v) => expected.insert(key, v),
            None => expected.remove(&key),
        };
    };
    for k in 0..60 {
        append(k, Some(1));
    }
    // Every third key deleted, long after its part was written; a few of
    // them written again.
    for k in (0..60).step_by(3) {
        append(k, None);
    }
    for k in (0..60).step_by(9) {
        append(k, Some(7));
    }
    let store = ReadableLocal {
        parts_before_full: std::sync::Arc::new(AtomicU64::new(u64::MAX)),
        ..ReadableLocal::default()
    };
    let w = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(2_000),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    let w = started_with(&cluster, w);
    let parts = store.parts.load(std::sync::atomic::Ordering::SeqCst);
    assert!(parts > 2, "the replay went out in {parts} parts");
    let id = w.tasks().next().unwrap().clone();
    let task = w.task(&id).unwrap();
    for k in 0..60 {
        let key = FoldKey::Key(format!("key-{k}").into_bytes());
        assert_eq!(
            task.fold_state(&key).map(|v| v.to_vec()),
            expected.get(&key.to_bytes()).cloned(),
            "key-{k}"
        );
    }
    let stored: BTreeMap<Vec<u8>, Vec<u8>> = store.inner.0.lock().unwrap()[&id]
        .fold
        .iter()
        .cloned()
        .collect();
    assert_eq!(stored, expected);
    assert!(
        task.stores().fold.len() < expected.len(),
        "the state is not all in memory"
    );
}

/// A rebuild's part that cannot be written (the disk is full) leaves the
/// state neither in memory nor on disk whole: the task does not start on
/// it, the store is wiped, and the task waits and rebuilds again.
#[test]
fn a_rebuild_whose_part_fails_does_not_start_the_task_and_tries_again() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    for k in 0..60 {
        append_count(&cluster, k, Some(3));
    }
    let store = ReadableLocal {
        parts_before_full: std::sync::Arc::new(AtomicU64::new(1)),
        ..ReadableLocal::default()
    };
    let mut w = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(2_000),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    assert_eq!(
        w.tasks().count(),
        0,
        "the task must not start on half a state"
    );
    assert_eq!(w.waiting_tasks().count(), 1);
    assert!(w.stats().local_store_write_failures >= 1);
    assert!(
        store.inner.0.lock().unwrap().is_empty(),
        "the store is wiped"
    );
    // The disk has room again: the next try rebuilds the whole state.
    store
        .parts_before_full
        .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    w.punctuate(1_000, &cluster).unwrap();
    assert_eq!(w.tasks().count(), 1);
    let id = w.tasks().next().unwrap().clone();
    for k in 0..60 {
        let key = FoldKey::Key(format!("key-{k}").into_bytes());
        assert_eq!(
            w.task(&id).unwrap().fold_state(&key).map(|v| v.to_vec()),
            Some(3i64.to_be_bytes().to_vec()),
            "key-{k}"
        );
    }
}

/// A task restoring from its file replays the changelog written since, in
/// parts when it is long: the parts leave the file's age as it was (they
/// do not move its checkpoint, so a file left with them must not look
/// fresher than its checkpoint).
#[test]
fn a_long_tail_goes_to_the_store_in_parts_that_keep_its_age() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = ReadableLocal {
        parts_before_full: std::sync::Arc::new(AtomicU64::new(u64::MAX)),
        ..ReadableLocal::default()
    };
    let mut w = started_with(&cluster, local_worker(&app, &store.inner));
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    commit(&mut w, &cluster);
    let id = w.tasks().next().unwrap().clone();
    let written_at = store.inner.0.lock().unwrap()[&id].written_at;
    drop(w);
    // The task ran elsewhere meanwhile: a long tail after the checkpoint.
    for k in 0..60 {
        append_count(&cluster, k, Some(5));
    }
    let mut again = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(2_000),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    again
        .assign(vec![part("a", 0), part("b", 0)], &cluster, 3_600_000)
        .unwrap();
    assert_eq!(again.stats().local_store_starts, 1);
    let times = store.part_times.lock().unwrap().clone();
    assert!(
        times.len() > 1,
        "the tail went out in {} parts",
        times.len()
    );
    assert!(
        times.iter().all(|t| Some(*t) == written_at),
        "parts written at {times:?}, the file at {written_at:?}"
    );
    for k in 0..60 {
        let key = FoldKey::Key(format!("key-{k}").into_bytes());
        assert_eq!(
            again
                .task(&id)
                .unwrap()
                .fold_state(&key)
                .map(|v| v.to_vec()),
            Some(5i64.to_be_bytes().to_vec())
        );
    }
}

/// A fold state read that fails (a damaged file) fails the task with
/// `TaskError::LocalStore`, and the file is wiped, so the restart rebuilds
/// from the changelog instead of reading the damage again.
#[test]
fn a_failed_fold_read_fails_the_task_and_wipes_its_store() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let store = ReadableLocal {
        parts_before_full: std::sync::Arc::new(AtomicU64::new(u64::MAX)),
        ..ReadableLocal::default()
    };
    let w = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(1),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    let mut w = started_with(&cluster, w);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    commit(&mut w, &cluster);
    w.on_record(rec("a", 0, 1, "y")).unwrap();
    commit(&mut w, &cluster);
    let id = w.tasks().next().unwrap().clone();
    assert!(
        w.task(&id)
            .unwrap()
            .stores()
            .fold
            .cache_stats()
            .unwrap()
            .evicted
            > 0,
        "x left memory"
    );
    store
        .broken_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = w.on_record(rec("a", 0, 2, "x")).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot be read from its local store"),
        "{err}"
    );
    w.abort(&cluster).unwrap();
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1);
    assert!(
        !store.inner.0.lock().unwrap().contains_key(&id),
        "the damaged store is wiped"
    );
}

/// A task that fails while its commit is taken at a revocation stops alone;
/// the task that stays rolls back, and the seeks that put it back at its
/// committed positions stay queued for the host. (The Kafka runtime once
/// dropped them at this point, which left the staying task's partitions
/// waiting on seeks that never came: its next record failed the thread.)
#[test]
fn a_task_failing_at_a_revocation_stops_alone_and_the_others_keep_their_seeks() {
    use std::sync::atomic::Ordering::SeqCst;
    let app = counting_app();
    let cluster = counting_cluster(2);
    let store = ReadableLocal::default();
    let w = Worker::new(
        &app,
        WorkerConfig {
            fold_cache: Some(1_000),
            ..WorkerConfig::default()
        },
    )
    .with_local_store(Box::new(store.clone()));
    let mut w = started_with(&cluster, w);
    // A commit whose local write fails for task 0 alone (the only one with
    // writes): its fold state beyond the cache is gone with the store.
    w.on_record(rec("a", 0, 0, "k")).unwrap();
    store.writes_fail.store(true, SeqCst);
    commit(&mut w, &cluster);
    store.writes_fail.store(false, SeqCst);
    let committed_1 = w.committed("a", 1).unwrap_or(0);
    w.on_record(rec("a", 0, 1, "k")).unwrap();
    w.on_record(rec("a", 1, 0, "k")).unwrap();
    assert_eq!(w.revoke_plan(false), RevokePlan::Commit);

    let txn = w.before_revoke(false, &cluster).unwrap();
    assert!(txn.is_none(), "the open work was aborted, not committed");
    let failures = w.take_task_failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].task.partition, 0);
    w.revoke(&[("a".to_owned(), 0), ("b".to_owned(), 0)])
        .unwrap();
    let seeks = seek(&mut w);
    assert_eq!(
        seeks.get(&("a".to_owned(), 1)),
        Some(&committed_1),
        "the staying task seeks back to its committed position: {seeks:?}"
    );
    assert!(!seeks.contains_key(&("a".to_owned(), 0)), "{seeks:?}");
    // Its record comes again and goes through.
    w.on_record(rec("a", 1, committed_1, "k")).unwrap();
    let txn = commit(&mut w, &cluster);
    assert!(
        txn.records.iter().any(|r| &*r.topic == "out"),
        "the staying task emitted again"
    );
}

/// The one door, called directly (not through the test host's kept
/// parts): a ready without a commit point never cuts a transaction, even
/// a due one; one with a commit point cuts it once, and refuses while it
/// is in flight; a flushed transaction, a sample, and seeks each come out
/// of exactly one ready.
#[test]
fn the_door_hands_each_part_over_once_and_cuts_only_at_a_commit_point() {
    let app = counting_app();
    let cluster = counting_cluster(2);
    let mut host = worker(&app);
    // The worker itself, not the test host's keeping of parts.
    let w: &mut parsley::runtime::worker::Worker = &mut host;
    w.assign(vec![part("a", 0), part("b", 0)], &cluster, 0)
        .unwrap();
    let ready = w.ready(None).unwrap();
    assert!(ready.transaction.is_none(), "nothing closed one");
    assert_eq!(ready.seeks.len(), 2, "{:?}", ready.seeks);
    for s in &ready.seeks {
        let ack = Ack::Seeked {
            topic: &s.topic,
            partition: s.partition,
            offset: s.offset,
        };
        w.advance(ack, &cluster).unwrap();
    }
    assert!(w.ready(None).unwrap().seeks.is_empty(), "handed over once");

    // The start's writes are due at once, but only a commit point cuts.
    assert_eq!(w.commit_due_in(0), Some(Duration::ZERO));
    assert!(w.ready(None).unwrap().transaction.is_none());
    let txn = w.ready(Some(0)).unwrap().transaction.expect("due");
    assert!(matches!(
        w.ready(Some(1_000)),
        Err(WorkerError::CommitInFlight)
    ));
    let offsets = cluster.commit(&txn.records);
    w.advance(Ack::Delivered(&offsets), &cluster).unwrap();
    w.advance(Ack::Committed(CommitOutcome::Committed), &cluster)
        .unwrap();

    // A record makes work due at the next interval; a flush closes it
    // now, and it comes out of the next ready, commit point or not.
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert!(w.ready(Some(1)).unwrap().transaction.is_none(), "not due");
    w.flush().unwrap();
    let closed = w.ready(None).unwrap().transaction.expect("closed");
    assert_eq!(closed.id, txn.id + 1);
    assert!(w.ready(None).unwrap().transaction.is_none(), "once");
    w.advance(Ack::Committed(CommitOutcome::Committed), &cluster)
        .unwrap();

    // A sample comes out once.
    let at = w.sample().at;
    let ready = w.ready(None).unwrap();
    assert_eq!(ready.published.map(|p| p.at), Some(at));
    assert!(w.ready(None).unwrap().is_empty());

    // A transaction closed and not taken yet goes with the tasks a fence
    // drops: the next ready has nothing of theirs.
    w.on_record(rec("a", 0, 1, "x")).unwrap();
    w.flush().unwrap();
    assert!(matches!(
        w.on_fault(Fault::Fenced("another owner".into())),
        Directive::Rejoin
    ));
    assert!(w.ready(None).unwrap().transaction.is_none());
}

/// A restore job handed over before its task left is cancelled, even once
/// the task is back with a job of its own; the new job is not.
#[test]
fn a_restore_job_of_a_task_that_left_is_cancelled() {
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut host = Worker::new(
        &app,
        WorkerConfig {
            restores: RestoreMode::Deferred,
            ..WorkerConfig::default()
        },
    );
    let w: &mut parsley::runtime::worker::Worker = &mut host;
    let parts = || vec![part("a", 0), part("b", 0)];
    w.assign(parts(), &cluster, 0).unwrap();
    let mut first = w.ready(None).unwrap().restores;
    assert_eq!(first.len(), 1);
    assert!(!first[0].is_cancelled());
    w.revoke(&[("a".to_owned(), 0), ("b".to_owned(), 0)])
        .unwrap();
    assert!(first[0].is_cancelled(), "its task left");
    w.assign(parts(), &cluster, 0).unwrap();
    let mut second = w.ready(None).unwrap().restores;
    assert_eq!(second.len(), 1);
    assert!(!second[0].is_cancelled());
    assert!(first[0].is_cancelled(), "the task is back with another job");
    // The old job, run now, reads nothing (it would write the task's
    // local store behind the new job's back) and changes nothing: the
    // task still waits for the new one.
    let outcome = first.remove(0).run(&cluster, &Unreadable);
    w.advance(Ack::Restored(outcome), &cluster).unwrap();
    assert_eq!(w.restoring_tasks().count(), 1);
    assert_eq!(w.tasks().count(), 0);
    // A fence cancels the jobs of every task it drops.
    let _ = w.on_fault(Fault::Fenced("another owner".into()));
    assert!(second[0].is_cancelled());
    let outcome = second.remove(0).run(&cluster, &Unreadable);
    assert_eq!(outcome.task().partition, 0);
}

/// A changelog reader that must not be asked.
struct Unreadable;

impl ChangelogReader for Unreadable {
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        _: i64,
        _: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        panic!("a cancelled restore read {topic}:{partition}")
    }
}

/// A state query reads committed state only, whatever the task has
/// delivered since; a causal query waits until its cause is delivered and
/// committed, and at its deadline says what it still waits for; a task not
/// here is named as such.
#[test]
fn state_queries_read_committed_state_and_wait_for_their_causes() {
    use parsley::protocol::{Channel, VectorClock};
    use parsley::runtime::query::{QueryAnswer, StateQuery};
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    let a = Channel::new(cluster.topics["a"].0, 0);
    let b = Channel::new(cluster.topics["b"].0, 0);
    let query = |partition: i32, after: Option<VectorClock>, deadline: i64| StateQuery {
        task: TaskId {
            stage: "count".into(),
            partition,
        },
        key: FoldKey::Key(b"x".to_vec()),
        after,
        deadline,
    };
    let claim = |c: Channel, offset: i64| {
        let mut clock = VectorClock::new();
        clock.claim_offset(c, offset);
        clock
    };
    let count = |n: i64| QueryAnswer::Value(Some(n.to_be_bytes().to_vec()));
    w.query(1, query(0, None, 0));
    assert_eq!(w.take_query_answers(), vec![(1, QueryAnswer::Value(None))]);

    // Delivered, not committed: the plain query sees the committed state;
    // the causal one waits for the commit.
    seek(&mut w);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    w.query(2, query(0, None, 0));
    w.query(3, query(0, Some(claim(a, 0)), 10_000));
    assert_eq!(w.take_query_answers(), vec![(2, QueryAnswer::Value(None))]);
    assert!(w.queries_waiting());
    commit(&mut w, &cluster);
    assert_eq!(w.take_query_answers(), vec![(3, count(1))]);
    assert!(!w.queries_waiting());

    // A cause not delivered yet: answered once it is, and committed.
    w.query(4, query(0, Some(claim(b, 0)), 10_000));
    assert!(w.take_query_answers().is_empty());
    w.on_record(rec("b", 0, 0, "x")).unwrap();
    assert!(
        w.take_query_answers().is_empty(),
        "delivered, not committed"
    );
    commit(&mut w, &cluster);
    assert_eq!(w.take_query_answers(), vec![(4, count(2))]);

    // A cause that never comes: at the deadline, what it waits for.
    w.query(5, query(0, Some(claim(a, 7)), 200));
    w.punctuate(100, &cluster).unwrap();
    assert!(w.take_query_answers().is_empty());
    w.punctuate(300, &cluster).unwrap();
    match w.take_query_answers().as_slice() {
        [(5, QueryAnswer::TimedOut(waiting))] => {
            assert_eq!(waiting.len(), 1);
            assert_eq!(waiting[0].topic(), "a");
            assert!(
                waiting[0].to_string().contains("waiting on a:0 offset 7"),
                "{}",
                waiting[0]
            );
        }
        other => panic!("{other:?}"),
    }

    // A claim on a channel the stage does not consume is not waited for.
    let mut elsewhere = VectorClock::new();
    elsewhere.claim_offset(Channel::new(cluster.topics["out"].0, 0), 40);
    w.query(6, query(0, Some(elsewhere), 10_000));
    assert_eq!(w.take_query_answers(), vec![(6, count(2))]);

    // A task this worker does not run.
    w.query(7, query(3, None, 0));
    assert_eq!(w.take_query_answers(), vec![(7, QueryAnswer::NotHosted)]);
}

/// The one wake-up a host needs: the earliest of what the worker keeps
/// time for (here a causal query's deadline, then a due commit), and none
/// when nothing is due.
#[test]
fn the_next_wake_is_the_earliest_deadline_the_worker_keeps() {
    use parsley::protocol::{Channel, VectorClock};
    use parsley::runtime::query::StateQuery;
    let app = counting_app();
    let cluster = counting_cluster(1);
    let mut w = started(&app, &cluster);
    assert_eq!(w.next_wake(10), None, "nothing open, nothing waits");
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(cluster.topics["b"].0, 0), 0);
    w.query(
        1,
        StateQuery {
            task: TaskId {
                stage: "count".into(),
                partition: 0,
            },
            key: FoldKey::Key(b"x".to_vec()),
            after: Some(clock),
            deadline: 500,
        },
    );
    assert_eq!(w.next_wake(10), Some(Duration::from_millis(490)));
    seek(&mut w);
    w.on_record(rec("a", 0, 0, "x")).unwrap();
    assert_eq!(w.commit_due_in(10), Some(Duration::from_millis(90)));
    assert_eq!(w.next_wake(10), Some(Duration::from_millis(90)));
}
