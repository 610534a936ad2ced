//! The worker's one door out: whatever it has for its host comes out in one
//! [`Ready`], and whatever the host did about it goes back through
//! [`Worker::advance`].
//!
//! The calls that tell the worker what happened (records, positions,
//! assignments, revocations, the clock, faults) stay separate inputs, as
//! raft-rs's `step` and `tick` are; what the host must *do* is never
//! pulled piece by piece. A host asks for [`Worker::ready`] after each
//! input it makes, acts on every part of the answer, and acknowledges the
//! parts that ask for it.

use super::*;

/// What one task did, tagged with the task.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WorkerEvent {
    /// The task.
    pub task: TaskId,
    /// What it did.
    pub event: TaskEvent,
}

/// A consumed position to commit: the next offset to fetch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConsumedOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to fetch.
    pub offset: i64,
}

/// One transaction: produce the records, commit the offsets with the
/// consumer's group metadata, all or nothing.
#[derive(Debug, Default)]
pub struct Transaction {
    /// The transaction's number on this worker (from 1).
    pub id: u64,
    /// How many of the transaction's records went out before it, in
    /// [`Ready::produce`] ([`WorkerConfig::stream_records`]): `records[i]`
    /// is record `streamed + i` of the transaction, the index its delivery
    /// report and a refusal of it ([`Fault::RecordRefused`]) go by. Zero
    /// for a worker that does not stream.
    pub streamed: usize,
    /// Records to produce, in order: per task, its emissions and ticks
    /// (those not streamed already), then its changelog records.
    pub records: Vec<OutgoingRecord>,
    /// Consumed positions to commit.
    pub offsets: Vec<ConsumedOffset>,
    /// What the tasks did, per task in order (empty when
    /// [`WorkerConfig::events`] is off).
    pub events: Vec<WorkerEvent>,
}

/// How a transaction ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CommitOutcome {
    /// Committed: records, offsets and state are durable.
    Committed,
    /// Aborted (the commit failed, or the host aborted it).
    Aborted,
    /// The producer or the group generation was fenced: another owner has
    /// the tasks now. The worker drops them all.
    Fenced,
    /// The commit's fate is unknown (it timed out: it may have committed).
    /// The worker drops every task as for fencing; the host rejoins the
    /// group, and the tasks restart from their changelogs and the group's
    /// committed offsets (read with `require_stable`), whichever way the
    /// commit went.
    Unknown,
}

/// What the host must do before handing a revocation to the worker.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RevokePlan {
    /// Nothing is open.
    Nothing,
    /// Commit the open work first: [`Worker::before_revoke`] closes it into
    /// the next [`Ready`].
    Commit,
    /// The assignment was lost: abort the open transaction
    /// ([`Worker::abort`]).
    Abort,
}

/// Everything the worker has for its host, taken at once by
/// [`Worker::ready`]. A host acts on every part; the ones that need an
/// answer say which [`Ack`] it is.
#[derive(Debug, Default)]
#[must_use = "a host acts on every part of a Ready"]
pub struct Ready {
    /// Tasks that failed and stopped alone since the last ready; nothing of
    /// theirs is open any more. The host's error policy decides what
    /// follows ([`Worker::restart_task`], [`Worker::divert`], or ending the
    /// membership).
    pub failures: Vec<TaskFailure>,
    /// Changelog replays to run off the poll loop
    /// ([`RestoreMode::Deferred`]); each finished one comes back as
    /// [`Ack::Restored`]. A job whose task leaves before it starts is
    /// cancelled ([`RestoreJob::is_cancelled`]): run, it returns at once.
    pub restores: Vec<RestoreJob>,
    /// Fetch pauses and resumes (backpressure, and the partitions of a task
    /// that has not formed yet). A partition no longer assigned may refuse;
    /// nothing depends on it then.
    pub flow: Vec<FlowChange>,
    /// Consumer seeks, to make before the next poll, in order; each is
    /// acknowledged with [`Ack::Seeked`] once made. A record or a position
    /// of a partition whose seek was not acknowledged is refused
    /// ([`WorkerError::SeekNotApplied`]), so a host that forgot one fails
    /// instead of skipping records.
    pub seeks: Vec<Seek>,
    /// A fresh sample of every task's metrics and held heads, when one was
    /// taken since the last ready.
    pub published: Option<Published>,
    /// The transaction to produce and commit: one that was due when the
    /// host offered a commit point, or the one a
    /// [`flush`](Worker::flush) or a [`before_revoke`](Worker::before_revoke)
    /// closed. Its delivery reports go back as [`Ack::Delivered`] and its
    /// fate as [`Ack::Committed`].
    pub transaction: Option<Transaction>,
    /// How long to wait before polling again: a transaction aborted for a
    /// transient fault (a broker down or moving), and the next attempt
    /// waits this long ([`WorkerConfig::transient_backoff`]) rather than
    /// fetching and processing records that could not be written either.
    /// The tasks are back at their committed state.
    pub backoff: Option<Duration>,
    /// The records of an open transaction the host aborted
    /// ([`Worker::abort`]), as far as the tasks had produced them. A host
    /// that streams records into the open transaction has seen them
    /// aborted (a log that models the broker keeps them as aborted
    /// records); one that produces only at commit never sent them. Always
    /// empty with [`WorkerConfig::stream_records`]: what was streamed the
    /// host has, and what was not never goes out.
    pub abandoned: Vec<OutgoingRecord>,
    /// Emissions and ticks to produce now, in order, into the open
    /// transaction ([`WorkerConfig::stream_records`]; the host begins the
    /// transaction with the first). Its commit or abort decides them, as
    /// it does the records the [`Transaction`] carries later. Empty in a
    /// ready that hands a transaction over: that one carries them.
    pub produce: Vec<OutgoingRecord>,
    /// The index in the open transaction of `produce`'s first record: the
    /// index its delivery report, and a refusal of it
    /// ([`Fault::RecordRefused`]), go by (0 when there is none).
    pub produce_at: usize,
    /// The worker aborted an open transaction that records were streamed
    /// into ([`Worker::abort`], or a revocation that aborts): the host
    /// aborts it on its producer, before anything else of this ready.
    /// (An abort the host made itself, reported with
    /// [`Ack::Committed`], does not say it again.)
    pub abort_streamed: bool,
}

impl Ready {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
            && self.restores.is_empty()
            && self.flow.is_empty()
            && self.seeks.is_empty()
            && self.published.is_none()
            && self.transaction.is_none()
            && self.backoff.is_none()
            && self.abandoned.is_empty()
            && self.produce.is_empty()
            && !self.abort_streamed
    }

    /// Appends `later`'s parts to these, in order (a newer sample
    /// replaces an older one), for a host that keeps a ready's parts until
    /// it acts on each; returns `later`'s transaction, which such a host
    /// takes at once rather than keeps.
    pub fn append(&mut self, later: Ready) -> Option<Transaction> {
        let Ready {
            failures,
            restores,
            flow,
            seeks,
            published,
            transaction,
            backoff,
            abandoned,
            produce,
            produce_at,
            abort_streamed,
        } = later;
        if abort_streamed {
            // What was kept to produce belongs to the aborted transaction.
            self.produce.clear();
            self.abort_streamed = true;
        }
        if self.produce.is_empty() {
            self.produce_at = produce_at;
        }
        self.produce.extend(produce);
        self.backoff = self.backoff.max(backoff);
        self.abandoned.extend(abandoned);
        self.failures.extend(failures);
        self.restores.extend(restores);
        self.flow.extend(flow);
        self.seeks.extend(seeks);
        if published.is_some() {
            self.published = published;
        }
        transaction
    }

    /// Drops the seeks, pauses and resumes of `partitions`, for a host
    /// that keeps a ready's parts past a revocation of them: the worker
    /// drops the same from what it still queues when it takes a
    /// revocation.
    pub fn forget(&mut self, partitions: &[(String, i32)]) {
        forget(&mut self.seeks, &mut self.flow, partitions);
    }
}

/// The revocation's rule for queued seeks and fetch changes: those of the
/// partitions that leave go with them.
fn forget(seeks: &mut Vec<Seek>, flow: &mut Vec<FlowChange>, gone: &[(String, i32)]) {
    let left =
        |topic: &str, partition: i32| gone.iter().any(|(t, p)| t == topic && *p == partition);
    seeks.retain(|s| !left(&s.topic, s.partition));
    flow.retain(|f| !left(&f.topic, f.partition));
}

/// What the worker has for its host and the host has not taken yet: the
/// parts of the next [`Ready`] (its sample and backoff aside, which are
/// kept by their own concerns). Every file of the worker adds to it
/// through these methods; only [`Worker::ready`] empties it.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    failures: Vec<TaskFailure>,
    jobs: Vec<RestoreJob>,
    flow: Vec<FlowChange>,
    seeks: Vec<Seek>,
    /// A transaction a flush or a revocation closed.
    closed: Option<Transaction>,
    /// The records of an open transaction the host aborted.
    abandoned: Vec<OutgoingRecord>,
    /// A sample was taken.
    fresh_sample: bool,
    /// An open transaction with streamed records was aborted.
    abort_streamed: bool,
}

impl Outbox {
    /// A task failed and stopped alone.
    pub(super) fn fail(&mut self, failure: TaskFailure) {
        self.failures.push(failure);
    }

    /// A restore job for the host to run.
    pub(super) fn restore(&mut self, job: RestoreJob) {
        self.jobs.push(job);
    }

    /// Drops the job of a task that left before the host took it.
    pub(super) fn cancel_restore(&mut self, task: &TaskId) {
        self.jobs.retain(|j| j.task != *task);
    }

    /// A fetch pause or resume.
    pub(super) fn flow(&mut self, change: FlowChange) {
        self.flow.push(change);
    }

    /// A consumer seek.
    pub(super) fn seek(&mut self, seek: Seek) {
        self.seeks.push(seek);
    }

    /// Drops the seeks not taken yet (an abort asks for its own).
    pub(super) fn drop_seeks(&mut self) {
        self.seeks.clear();
    }

    /// A transaction a flush or a revocation closed.
    pub(super) fn close(&mut self, txn: Transaction) {
        self.closed = Some(txn);
    }

    /// The closed transaction, if one waits.
    pub(super) fn take_closed(&mut self) -> Option<Transaction> {
        self.closed.take()
    }

    /// The records of an aborted open transaction.
    pub(super) fn abandon(&mut self, records: Vec<OutgoingRecord>) {
        self.abandoned.extend(records);
    }

    /// The host aborts what it streamed into the open transaction.
    pub(super) fn abort_streamed(&mut self) {
        self.abort_streamed = true;
    }

    /// A fresh sample was taken.
    pub(super) fn sampled(&mut self) {
        self.fresh_sample = true;
    }

    /// The seeks, pauses and resumes of partitions that were revoked go
    /// with them.
    pub(super) fn forget(&mut self, partitions: &[(String, i32)]) {
        forget(&mut self.seeks, &mut self.flow, partitions);
    }

    /// Every task was dropped: their closed transaction, restore jobs,
    /// pauses and seeks go with them. Failures already reported, the
    /// records of an abort and a sample stay for the host.
    pub(super) fn forget_tasks(&mut self) {
        self.closed = None;
        self.jobs.clear();
        self.flow.clear();
        self.seeks.clear();
    }

    /// Everything as one [`Ready`], with the worker's transaction, sample
    /// and backoff, and the records to stream (from index `produce.0`).
    pub(super) fn take(
        &mut self,
        transaction: Option<Transaction>,
        published: &Published,
        backoff: Option<Duration>,
        produce: (usize, Vec<OutgoingRecord>),
    ) -> Ready {
        Ready {
            failures: std::mem::take(&mut self.failures),
            restores: std::mem::take(&mut self.jobs),
            flow: std::mem::take(&mut self.flow),
            seeks: std::mem::take(&mut self.seeks),
            published: std::mem::take(&mut self.fresh_sample).then(|| published.clone()),
            transaction,
            backoff,
            abandoned: std::mem::take(&mut self.abandoned),
            produce: produce.1,
            produce_at: produce.0,
            abort_streamed: std::mem::take(&mut self.abort_streamed),
        }
    }
}

/// What a host did about a [`Ready`], handed back through
/// [`Worker::advance`].
#[derive(Debug)]
// Built by the host and taken at once, never stored or moved in bulk: the
// restore outcome's size costs nothing a box would save.
#[allow(clippy::large_enum_variant)]
pub enum Ack<'a> {
    /// The consumer made this seek: the partition's next polled record is
    /// the one at `offset`.
    Seeked {
        /// The topic.
        topic: &'a str,
        /// The partition.
        partition: i32,
        /// The offset sought.
        offset: i64,
    },
    /// The offset each record of the transaction handed over last got, by
    /// index (the producer's delivery reports), before its
    /// [`Committed`](Ack::Committed). With a local store these are the
    /// checkpoints the commit's writes reach; a commit whose offsets were
    /// not reported cannot be checkpointed, and the stores of the tasks it
    /// wrote are wiped (rebuilt at their next start).
    Delivered(&'a [i64]),
    /// How the transaction handed over last ended.
    Committed(CommitOutcome),
    /// A restore job finished: its task starts (or fails).
    Restored(RestoreOutcome),
}

impl Worker {
    /// Everything the worker has for its host now.
    ///
    /// `commit_at` is the host's clock when it can start a transaction now
    /// (between polls, with nothing in flight); the open work is then
    /// handed over if it is due ([`commit_due_in`](Self::commit_due_in)).
    /// `None` in the middle of a batch of records, or inside a rebalance:
    /// only a transaction a [`flush`](Self::flush) or a
    /// [`before_revoke`](Self::before_revoke) closed comes out then.
    ///
    /// Fails, taking nothing, when a commit point is offered while a
    /// transaction is in flight or the open one must be aborted first.
    pub fn ready(&mut self, commit_at: Option<i64>) -> Result<Ready, WorkerError> {
        let transaction = match (self.out.take_closed(), commit_at) {
            (Some(txn), _) => Some(txn),
            (None, Some(now)) => self.poll_transaction(now)?,
            (None, None) => None,
        };
        // A transaction handed over carries what was made since the last
        // ready itself: a ready never streams beside one.
        let produce = if transaction.is_none() {
            self.stream_emitted(commit_at.is_some())
        } else {
            (0, Vec::new())
        };
        let backoff = self.since_commit.take_backoff();
        Ok(self
            .out
            .take(transaction, &self.published, backoff, produce))
    }

    /// Takes the host's acknowledgement of a part of a [`Ready`].
    pub fn advance(&mut self, ack: Ack<'_>, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        match ack {
            Ack::Seeked {
                topic,
                partition,
                offset,
            } => self.seek_applied(topic, partition, offset),
            Ack::Delivered(offsets) => {
                self.delivered(offsets);
                Ok(())
            }
            Ack::Committed(outcome) => self.commit_outcome(outcome, cluster),
            Ack::Restored(outcome) => self.restored(outcome, cluster),
        }
    }
}

/// A host as the one act loop ([`act_on`]) sees it: its way to the worker,
/// and what it does with each part of a [`Ready`]. The Kafka runtime, the
/// [`TestDriver`](crate::TestDriver) and the simulator's application
/// worlds each implement it; the order the parts are taken in, the
/// acknowledgements, and what a failed seek means for a transaction in
/// hand are [`act_on`]'s, written once.
pub trait Host {
    /// The host's error; a refusal of the worker's is one.
    type Error: From<WorkerError>;

    /// The worker's next [`Ready`] outside a commit point
    /// ([`Worker::ready`] with `None`).
    fn ready(&mut self) -> Result<Ready, WorkerError>;
    /// Hands an acknowledgement to the worker ([`Worker::advance`]).
    fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError>;
    /// The records of an aborted open transaction ([`Ready::abandoned`]).
    fn abandoned(&mut self, records: Vec<OutgoingRecord>);
    /// The worker aborted the open transaction records were streamed into
    /// ([`Ready::abort_streamed`]): abort it on the producer, if one began.
    fn abort_streamed(&mut self) -> Result<(), Self::Error>;
    /// Records to produce now into the open transaction, beginning it if
    /// this is its first ([`Ready::produce`]); `first` is the first one's
    /// index in the transaction.
    fn produce(&mut self, first: usize, records: Vec<OutgoingRecord>) -> Result<(), Self::Error>;
    /// Tasks that failed and stopped alone: the host's error policy
    /// decides now or at its next turn.
    fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), Self::Error>;
    /// Restore jobs to run off the poll loop.
    fn restores(&mut self, jobs: Vec<RestoreJob>);
    /// A fresh metrics sample.
    fn published(&mut self, sample: Published);
    /// A pause to wait before the next poll.
    fn backoff(&mut self, pause: Duration);
    /// A fetch pause or resume; a partition no longer assigned may refuse,
    /// and nothing depends on it then.
    fn flow(&mut self, change: FlowChange);
    /// Makes a consumer seek; [`act_on`] acknowledges it once this returns.
    fn seek(&mut self, seek: &Seek) -> Result<(), Self::Error>;
    /// The transaction a flush or a revocation closed (or one due at a
    /// commit point): the host produces and commits it now, acknowledging
    /// its delivery reports and its fate, or keeps it to do so before
    /// anything else.
    fn transaction(&mut self, txn: Transaction) -> Result<(), Self::Error>;
}

/// Acts on `ready` and on whatever acting on it brings (an aborted commit
/// asks for seeks, a restarted task for its own), until the worker has
/// nothing more. Each round takes the parts in one order: the abort of a
/// streamed transaction, abandoned records, failures, restores, the
/// sample, the backoff, then pauses and resumes, then seeks (each
/// acknowledged once made), then the records to stream, then the
/// transaction (whose records follow the streamed ones). A failure before
/// the transaction is produced reports it aborted to the worker (it never
/// reached the producer), so the recovery that follows finds nothing in
/// flight.
pub fn act_on<H: Host + ?Sized>(host: &mut H, ready: Ready) -> Result<(), H::Error> {
    let mut ready = ready;
    while !ready.is_empty() {
        let Ready {
            failures,
            restores,
            flow,
            seeks,
            published,
            transaction,
            backoff,
            abandoned,
            produce,
            produce_at,
            abort_streamed,
        } = ready;
        let mut made = if abort_streamed {
            host.abort_streamed()
        } else {
            Ok(())
        };
        host.abandoned(abandoned);
        made = made.and(host.failures(failures));
        host.restores(restores);
        if let Some(sample) = published {
            host.published(sample);
        }
        if let Some(pause) = backoff {
            host.backoff(pause);
        }
        for change in flow {
            host.flow(change);
        }
        for s in seeks {
            if made.is_err() {
                break;
            }
            made = host.seek(&s).and_then(|()| {
                let ack = Ack::Seeked {
                    topic: &s.topic,
                    partition: s.partition,
                    offset: s.offset,
                };
                host.advance(ack).map_err(H::Error::from)
            });
        }
        if made.is_ok() && !produce.is_empty() {
            made = host.produce(produce_at, produce);
        }
        if let Err(e) = made {
            if transaction.is_some() {
                host.advance(Ack::Committed(CommitOutcome::Aborted))?;
            }
            return Err(e);
        }
        if let Some(txn) = transaction {
            host.transaction(txn)?;
        }
        ready = host.ready()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host that logs what the loop asks of it, hands out scripted
    /// readies, and refuses the seek to `refuse`.
    #[derive(Default)]
    struct Scripted {
        next: Vec<Ready>,
        refuse: Option<i64>,
        log: Vec<String>,
    }

    impl Host for Scripted {
        type Error = WorkerError;
        fn ready(&mut self) -> Result<Ready, WorkerError> {
            Ok(if self.next.is_empty() {
                Ready::default()
            } else {
                self.next.remove(0)
            })
        }
        fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError> {
            self.log.push(match ack {
                Ack::Seeked { offset, .. } => format!("ack seek {offset}"),
                Ack::Committed(o) => format!("ack {o:?}"),
                Ack::Delivered(_) => "ack delivered".into(),
                Ack::Restored(_) => "ack restored".into(),
            });
            Ok(())
        }
        fn abandoned(&mut self, records: Vec<OutgoingRecord>) {
            self.log.push(format!("abandoned {}", records.len()));
        }
        fn abort_streamed(&mut self) -> Result<(), WorkerError> {
            self.log.push("abort streamed".into());
            Ok(())
        }
        fn produce(
            &mut self,
            first: usize,
            records: Vec<OutgoingRecord>,
        ) -> Result<(), WorkerError> {
            self.log.push(format!("produce {first}+{}", records.len()));
            Ok(())
        }
        fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), WorkerError> {
            self.log.push(format!("failures {}", failures.len()));
            Ok(())
        }
        fn restores(&mut self, jobs: Vec<RestoreJob>) {
            self.log.push(format!("restores {}", jobs.len()));
        }
        fn published(&mut self, _: Published) {
            self.log.push("published".into());
        }
        fn backoff(&mut self, pause: Duration) {
            self.log.push(format!("backoff {}", pause.as_millis()));
        }
        fn flow(&mut self, change: FlowChange) {
            self.log.push(format!("flow {}", change.paused));
        }
        fn seek(&mut self, seek: &Seek) -> Result<(), WorkerError> {
            if self.refuse == Some(seek.offset) {
                self.log.push(format!("seek {} refused", seek.offset));
                return Err(WorkerError::NoTransaction);
            }
            self.log.push(format!("seek {}", seek.offset));
            Ok(())
        }
        fn transaction(&mut self, txn: Transaction) -> Result<(), WorkerError> {
            self.log.push(format!("transaction {}", txn.id));
            Ok(())
        }
    }

    fn seek(offset: i64) -> Seek {
        Seek {
            topic: "t".into(),
            partition: 0,
            offset,
        }
    }

    fn ready(seeks: &[i64], txn: Option<u64>) -> Ready {
        Ready {
            flow: vec![FlowChange {
                topic: "t".into(),
                partition: 0,
                paused: false,
            }],
            seeks: seeks.iter().map(|&o| seek(o)).collect(),
            backoff: Some(Duration::from_millis(5)),
            transaction: txn.map(|id| Transaction {
                id,
                ..Transaction::default()
            }),
            ..Ready::default()
        }
    }

    #[test]
    fn each_round_takes_the_parts_in_order_until_nothing_is_left() {
        let mut host = Scripted {
            next: vec![ready(&[7], None)],
            ..Scripted::default()
        };
        act_on(&mut host, ready(&[3], Some(1))).unwrap();
        assert_eq!(
            host.log,
            [
                "abandoned 0",
                "failures 0",
                "restores 0",
                "backoff 5",
                "flow false",
                "seek 3",
                "ack seek 3",
                "transaction 1", // the worker is asked again
                "abandoned 0",
                "failures 0",
                "restores 0",
                "backoff 5",
                "flow false",
                "seek 7",
                "ack seek 7",
            ]
        );
    }

    /// The abort of a streamed transaction comes before anything else (the
    /// records to stream after it open the next one), and streamed records
    /// go out before the transaction whose records follow them.
    #[test]
    fn a_streamed_abort_comes_first_and_streamed_records_before_the_commit() {
        let mut host = Scripted::default();
        let mut first = ready(&[3], Some(2));
        first.abort_streamed = true;
        first.produce_at = 4;
        let record = OutgoingRecord {
            topic: "out".into(),
            partition: 0,
            key: None,
            value: None,
            timestamp: 0,
            stamp: None,
            headers: Vec::new(),
            origin: None,
        };
        first.produce = vec![record.clone(), record];
        act_on(&mut host, first).unwrap();
        assert_eq!(
            host.log,
            [
                "abort streamed",
                "abandoned 0",
                "failures 0",
                "restores 0",
                "backoff 5",
                "flow false",
                "seek 3",
                "ack seek 3",
                "produce 4+2",
                "transaction 2",
            ]
        );
    }

    #[test]
    fn a_refused_seek_reports_the_transaction_in_hand_aborted() {
        let mut host = Scripted {
            refuse: Some(3),
            next: vec![ready(&[9], None)],
            ..Scripted::default()
        };
        assert!(act_on(&mut host, ready(&[3, 4], Some(1))).is_err());
        let tail: Vec<&str> = host.log.iter().map(String::as_str).skip(5).collect();
        // Neither the next seek nor the transaction: it never reached the
        // producer, so the worker hears it aborted; and no second round.
        assert_eq!(tail, ["seek 3 refused", "ack Aborted"]);
    }
}
