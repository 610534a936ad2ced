//! What the worker does when something fails: the backoff it waits before
//! a retry, and the record of a task that failed.
//!
//! A task's failure stays at that task. The worker aborts the open
//! transaction (it spans every task of the thread, so every task returns to
//! its committed state), but only the failed task stops: its partitions
//! stay assigned to the thread and their records are dropped until it
//! restarts, so nothing past the failing record is committed for it. The
//! other tasks carry on from their committed positions, and the group does
//! not rebalance.
//!
//! Whether the failed task restarts is the host's error handler's call
//! ([`Worker::restart_task`](crate::runtime::worker::Worker::restart_task));
//! when it does, the worker restarts it after one step of the task
//! backoff, so a failure that recurs at once (a record the logic always
//! refuses) is met, and reported, once per step instead of in a loop.

use std::time::Duration;

use crate::runtime::changelog::ChangelogError;
use crate::runtime::identity::TaskId;
use crate::runtime::task::TaskError;

/// How long to wait before a retry: `initial` after the first failure,
/// doubling with each further failure in a row, up to `max`. A run that
/// lasted longer than `max` since the last retry starts the count again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// No wait at all (a test host that retries at once).
    pub const NONE: Backoff = Backoff {
        initial: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// The wait after `in_a_row` earlier failures in a row.
    pub fn step(&self, in_a_row: u32) -> Duration {
        let factor = 1u32.checked_shl(in_a_row.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// A failure the host's Kafka client reported, sorted by the client's own
/// classification of its error and nothing more: what follows is the
/// worker's decision ([`Worker::on_fault`](crate::runtime::worker::Worker::on_fault)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The group moved on without this member (its consumer has no
    /// current membership): another owner has the tasks now.
    Fenced(String),
    /// The producer's epoch is no longer current: its transaction
    /// coordinator ended the open transaction (one that ran past
    /// `transaction.timeout.ms`, as a broker failover can make it run), or
    /// another producer took its transactional id. The producer can go no
    /// further; the consumer's membership is not in question (a member
    /// that did lose it is fenced by the group at its next offset commit).
    ProducerFenced(String),
    /// The client reports an error it will not recover from (the producer
    /// or consumer must be recreated).
    Fatal(String),
    /// The open transaction cannot commit and must be aborted; the client
    /// itself can go on.
    Abortable(String),
    /// A transactional call failed in a way the client says may succeed
    /// if called again (a timeout among them): its effect is not known.
    Retriable(String),
    /// The transaction could not be written *now*, for a reason that
    /// passes: a record timed out or was turned away while a partition's
    /// leader moved, a broker was down, or too few replicas were in sync.
    /// The transaction must be aborted, and its retry writes the same
    /// records; nothing about the records themselves is wrong.
    Transient(String),
    /// One record of the transaction handed over last was refused by the
    /// client or the broker (too large, say): `record` is its index in
    /// [`Transaction::records`](crate::runtime::worker::Transaction::records).
    RecordRefused {
        /// The record's index.
        record: usize,
        /// The topic it was for.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The emission it was, if it was one
        /// ([`OutgoingRecord::origin`](crate::runtime::task::OutgoingRecord::origin)).
        origin: Option<crate::runtime::task::EmissionOrigin>,
        /// Why it was refused.
        reason: String,
    },
    /// A call of the transactional producer did not return within its
    /// timeout and a margin (librdkafka can wait forever for a coordinator
    /// that went away). The producer is given up; the transaction it had
    /// open never committed (the call that hung comes before the commit).
    ClientHung(String),
    /// Aborting the open transaction failed. `retriable` when the client
    /// says the abort may succeed if made again (its transaction
    /// coordinator unreachable or moving, a timeout).
    AbortFailed {
        /// Whether the abort may be made again.
        retriable: bool,
        /// The error.
        message: String,
    },
    /// The consumer's poll reported an error; `fatal` as the client says.
    Poll {
        /// Whether the client gave up on the consumer.
        fatal: bool,
        /// The error.
        message: String,
    },
}

impl Fault {
    /// The class's name, for logs and counters.
    pub fn class(&self) -> &'static str {
        match self {
            Fault::Fenced(_) => "fenced",
            Fault::ProducerFenced(_) => "producer-fenced",
            Fault::ClientHung(_) => "client-hung",
            Fault::Fatal(_) => "fatal",
            Fault::Abortable(_) => "abortable",
            Fault::Retriable(_) => "retriable",
            Fault::Transient(_) => "transient",
            Fault::RecordRefused { .. } => "record-refused",
            Fault::AbortFailed { .. } => "abort-failed",
            Fault::Poll { fatal: true, .. } => "poll-fatal",
            Fault::Poll { fatal: false, .. } => "poll",
        }
    }
}

/// What the worker tells its host to do about a [`Fault`].
#[derive(Debug)]
pub enum Directive {
    /// Call the step that failed again (the abort, for a failed abort),
    /// after `after`.
    Retry {
        /// The wait first.
        after: Duration,
    },
    /// Abort the open transaction, then report it
    /// ([`CommitOutcome::Aborted`](crate::runtime::worker::CommitOutcome::Aborted)).
    /// Every task returns to its committed state; for a refused record, the
    /// task that made it stops ([`TaskFailure::refused`]).
    Abort,
    /// The worker dropped every task: leave the group and join again as a
    /// new member, with a new producer.
    Rejoin,
    /// The producer can go no further, but nothing says another member
    /// owns the tasks: make a new producer with the same transactional id
    /// (initialising it ends whatever the old one left open), then report
    /// the transaction aborted
    /// ([`CommitOutcome::Aborted`](crate::runtime::worker::CommitOutcome::Aborted)).
    /// Every task returns to its committed state; the group membership
    /// stays, so nothing rebalances. A failure of the new producer's
    /// initialisation is a fault like any other.
    ReplaceProducer,
    /// Stop the stream thread with this error; the error handler decides
    /// what follows.
    Fail(Box<WorkerError>),
    /// Nothing to do: the client recovers by itself.
    Continue,
}

/// A record of a task's transaction that the client or the broker
/// refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedRecord {
    /// The topic it was for.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Why it was refused.
    pub reason: String,
    /// The emission it was, when it was one: which delivery made it, and
    /// which of that delivery's emissions it was. Changelog records and
    /// ticks have none, and cannot be sent elsewhere.
    pub origin: Option<crate::runtime::task::EmissionOrigin>,
}

/// A task that failed and was stopped, for the host's error handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskFailure {
    /// The task.
    pub task: TaskId,
    /// Why it failed.
    pub error: String,
    /// Failures of this task in a row before this one (0 for the first).
    pub earlier_in_a_row: u32,
    /// The refused record, when that was the failure.
    pub refused: Option<RefusedRecord>,
    /// Whether the failure passes with time: a codec reported a
    /// [transient](crate::CodecError::is_transient) error (a schema
    /// registry that could not be reached). The record is not at fault,
    /// and a restart after the backoff retries it.
    pub transient: bool,
}

/// A stopped task, kept until it restarts or its partitions leave.
#[derive(Clone, Debug)]
pub(crate) struct Stopped {
    /// When the host's handler asked for a restart, the time it is due.
    pub(crate) restart_at: Option<i64>,
}

/// A task's failures in a row, kept across its restarts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Streak {
    /// Failures in a row so far.
    pub(crate) failures: u32,
    /// When the task last restarted after one.
    pub(crate) restarted_at: Option<i64>,
}

impl Streak {
    /// Counts a failure at `now`; returns the failures in a row before it.
    /// A task that ran longer than the backoff's cap since its last restart
    /// starts the count again.
    pub(crate) fn fail(&mut self, now: i64, backoff: &Backoff) -> u32 {
        let cap = i64::try_from(backoff.max.as_millis()).unwrap_or(i64::MAX);
        if self
            .restarted_at
            .is_some_and(|at| now.saturating_sub(at) > cap)
        {
            self.failures = 0;
        }
        let earlier = self.failures;
        self.failures = self.failures.saturating_add(1);
        earlier
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_per_failure_in_a_row_up_to_its_cap() {
        let b = Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        };
        let steps: Vec<u64> = (0..9).map(|k| b.step(k).as_millis() as u64).collect();
        assert_eq!(
            steps,
            [
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000
            ]
        );
        assert_eq!(b.step(u32::MAX), b.max);
        assert_eq!(Backoff::NONE.step(7), Duration::ZERO);
    }

    #[test]
    fn a_streak_starts_again_after_a_run_longer_than_the_cap() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1_000),
        };
        let mut s = Streak::default();
        assert_eq!(s.fail(0, &b), 0);
        s.restarted_at = Some(100);
        assert_eq!(s.fail(200, &b), 1, "failed again soon after the restart");
        s.restarted_at = Some(500);
        assert_eq!(s.fail(1_501, &b), 0, "ran longer than the cap");
    }
}

/// What the worker refuses.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A task failed; abort the transaction.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// A changelog could not restore a task.
    #[error(transparent)]
    Changelog(#[from] ChangelogError),
    /// A channel's committed position lies below its partition's log
    /// start: records the stage never read are gone.
    #[error(
        "task {task}: {topic}:{partition} was consumed up to offset {committed}, but its log starts at {log_start}: retention or DeleteRecords removed {} records this stage never read. Restore them, or set the option to resume at the log start (StreamsOptions::on_retention_loss = OnRetentionLoss::ResumeAtLogStart) to go on without them",
        .log_start - .committed
    )]
    RetentionLoss {
        /// The task.
        task: TaskId,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where the channel's consumption stood (the next offset to read).
        committed: i64,
        /// The partition's first offset.
        log_start: i64,
    },
    /// A channel with no committed position starts at its partition's
    /// last stable offset ([`StartPolicy::Latest`](crate::runtime::worker::StartPolicy::Latest)), and that was not known.
    #[error(
        "task {task}: {topic}:{partition} has no committed position and starts at its last stable offset (StartPolicy::Latest), but the lookup of that offset gave no answer; the worker does not guess (the high watermark would skip the records of a transaction still open)"
    )]
    EndUnknown {
        /// The task.
        task: TaskId,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The consumer stopped fetching a partition because its fetch offset
    /// was out of range, yet every channel's position lies within its log.
    #[error(
        "the consumer reported a fetch offset out of range, but every channel of this thread is at or above its log start: the log may have been truncated below what this stage already read (an unclean leader election, or a topic recreated under the same id); the worker does not guess where to go on"
    )]
    OffsetOutOfRange,
    /// The log starts an out-of-range fetch needed could not be looked up.
    #[error(
        "the consumer reported a fetch offset out of range, and the log starts that would tell whether records were lost could not be looked up: {0}"
    )]
    LogStartUnknown(String),
    /// The Kafka client failed and will not recover (the host passes the
    /// client's own words).
    #[error("the Kafka client failed ({class}): {message}")]
    Client {
        /// The fault's class ([`Fault::class`]).
        class: &'static str,
        /// The client's error.
        message: String,
    },
    /// A refused record that is not an emission (a changelog record or a
    /// tick) cannot go to a dead-letter topic.
    #[error(
        "task {task}: the record refused for {topic} is not an emission (a changelog record or a tick), so it cannot go to a dead-letter topic: {reason}"
    )]
    NotAnEmission {
        /// The task.
        task: TaskId,
        /// The topic it was for.
        topic: String,
        /// Why it was refused.
        reason: String,
    },
    /// The group's committed position on an assigned partition carries the
    /// mark of a reset that began and never finished: the application's
    /// state may be half reset.
    #[error(
        "the group's position on {topic}:{partition} is marked by a reset that began and did not finish (parsley reset was interrupted): the application's state may be half reset, and it does not start on it. Stop every instance and run the same parsley reset again to finish it (running it again is safe), then start"
    )]
    ResetUnfinished {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// A partition of a topic no stage of the application consumes.
    #[error(
        "partition {topic}:{partition} is not consumed by any stage of application {application:?}; subscribe only to the application's source and tick topics"
    )]
    UnknownPartition {
        /// The application.
        application: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// A task's partitions did not all land on this worker.
    #[error(
        "task {task} needs {} on one stream thread, but this thread was assigned only {}; use the range assignor with identical subscriptions so partition p of every source lands together",
        .needed.join(", "), .assigned.join(", ")
    )]
    SplitTask {
        /// The task.
        task: TaskId,
        /// Every partition the task consumes.
        needed: Vec<String>,
        /// The ones this worker holds.
        assigned: Vec<String>,
    },
    /// A record or position for a partition not assigned here.
    #[error("{topic}:{partition} is not assigned to this worker")]
    NotAssigned {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// A consumer position behind the records already handed over.
    #[error(
        "position {position} of {topic}:{partition} is behind the records already handed over (next {consumed}); a position must cover what the polls returned"
    )]
    PositionBehind {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The reported position.
        position: i64,
        /// The next offset after what was handed over.
        consumed: i64,
    },
    /// A record below the next expected offset.
    #[error(
        "record {topic}:{partition}@{offset} arrived out of order (next expected {expected}); seek as the worker said"
    )]
    OutOfOrder {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// The next expected offset.
        expected: i64,
    },
    /// A record or position for a partition whose seek the host has not
    /// confirmed.
    #[error(
        "{topic}:{partition} was told to seek to {offset} and the seek was not confirmed; seek, then acknowledge it (Ack::Seeked)"
    )]
    SeekNotApplied {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where the seek goes.
        offset: i64,
    },
    /// A transaction is in flight: report its outcome first.
    #[error("a transaction is in flight; report its outcome (Ack::Committed) first")]
    CommitInFlight,
    /// The open transaction failed: abort it first.
    #[error("the open transaction failed ({reason}); abort it before anything else")]
    AbortRequired {
        /// The failure that poisoned it.
        reason: String,
    },
    /// Work is open: commit or abort it before revoking.
    #[error("work is open; commit (flush) or abort it before revoking partitions")]
    OpenTransaction,
    /// No transaction is in flight.
    #[error("no transaction is in flight")]
    NoTransaction,
}
