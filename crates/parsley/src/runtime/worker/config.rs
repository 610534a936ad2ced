//! How a worker is set up: [`WorkerConfig`] and the policies it names.

use super::*;

/// Where a channel with no committed position starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum StartPolicy {
    /// The log start (everything retention kept).
    #[default]
    Earliest,
    /// The end (the last stable offset): skips history.
    Latest,
}

/// How the group hands out partitions, which decides what a task whose
/// partitions are not all here means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Assignment {
    /// Each rebalance hands every member its whole assignment at once (the
    /// classic protocol's eager range assignor): a task whose partitions
    /// did not all land here is a misconfigured assignor, refused with
    /// [`WorkerError::SplitTask`].
    #[default]
    Complete,
    /// Partitions arrive and leave one by one as the group reconciles (the
    /// consumer group protocol of KIP-848): a task forms only once all of
    /// its partitions are here. Until then its partitions are paused and
    /// their records dropped, so a half task never delivers or commits;
    /// a task that loses one of its partitions closes, and the rest wait
    /// the same way.
    Incremental,
}

/// What a task does when a channel's committed position lies below the
/// partition's log start: retention (or DeleteRecords) removed records the
/// stage never read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRetentionLoss {
    /// Fail the task with [`WorkerError::RetentionLoss`], naming the
    /// partition, the committed offset and the log start. The default: the
    /// contract says lost history fails loudly, never silently.
    #[default]
    Fail,
    /// Go on from the log start, with a WARN naming what was lost (and a
    /// count in [`WorkerStats::retention_losses`]). The removed records
    /// stay lost: the channel's frontier moves past them, so claims on
    /// them count as met and the records that waited on them are released
    /// without them.
    ResumeAtLogStart,
}

/// How a worker paces its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// How often [`Worker::ready`] hands a transaction over, at most: one
    /// is due once work is open and this long has passed since the
    /// previous one was handed over (the first is due at once). As with
    /// Kafka Streams' `commit.interval.ms`, the time a commit takes is part
    /// of the interval, not added to it.
    pub commit_interval: Duration,
    /// Commit early when the host has nothing more to hand over: with
    /// `Some(floor)`, open work is due once the host reported its fetch
    /// drained ([`Worker::fetch_drained`]) and `floor` has passed since
    /// the previous commit ended, without waiting for the rest of
    /// [`commit_interval`](Self::commit_interval). A trickle of records
    /// then waits about `floor` plus a commit instead of half an interval
    /// on average; a stream fast enough to keep the fetch busy commits
    /// every interval as before. The floor is time to process between
    /// commits, counted from the end of the previous commit (the first
    /// commit point after its outcome), so commits never follow each other
    /// back to back however short it is. `None` (the default): commits
    /// only every interval.
    pub commit_when_idle: Option<Duration>,
    /// Hand emissions and ticks to the host while the transaction is still
    /// open ([`Ready::produce`]), for a host that produces them into its
    /// open transaction there and then, instead of all of a transaction's
    /// records at the commit ([`Transaction::records`]). The commit then
    /// carries only the changelog records (one per key written, whatever
    /// the number of writes) and what was made since the last hand-out,
    /// so it costs little more than the offsets and the end of the
    /// transaction. [`Streaming`] says how often records go out and how
    /// long such a transaction may stay open. `None` (the default):
    /// records go out with the transaction at the commit.
    pub stream_records: Option<Streaming>,
    /// How often each task runs the truncation sweep.
    pub truncation_interval: Duration,
    /// Where channels with no committed position start.
    pub start_policy: StartPolicy,
    /// What a channel committed below its log start does.
    pub on_retention_loss: OnRetentionLoss,
    /// How partitions arrive: whole assignments, or one by one.
    pub assignment: Assignment,
    /// How many times a commit step that failed with a retriable error is
    /// retried (waiting 100 ms, then doubling) before the commit's fate
    /// counts as unknown.
    pub commit_retries: u32,
    /// How long the host waits before it polls again after a transaction
    /// aborted for a transient fault ([`Fault::Transient`],
    /// [`Fault::Abortable`]): `initial` after the first, doubling with
    /// each further one before a commit goes through, up to `max`. The
    /// tasks are back at their committed state meanwhile and nothing is
    /// fetched, so a broker outage costs no memory and no busy loop.
    /// 100 ms to 5 s by default.
    pub transient_backoff: Backoff,
    /// How long a task whose start failed on a lookup that may succeed
    /// later waits before it tries again: `initial` after the first
    /// failure, doubling with each one in a row, up to `max`
    /// ([`LOOKUP_RETRY`] by default: 200 ms to 5 s).
    pub lookup_retry: Backoff,
    /// Whether a task that cannot start (its restore or its initialisation
    /// fails for a reason of its own, not a lookup that may succeed later)
    /// stops alone, as a task that fails while running does, and reaches
    /// the host as a [`TaskFailure`]: the default, so one task's bad
    /// changelog or lost history never takes the thread's other tasks
    /// down. `false` fails the worker's open work with the error instead,
    /// for a host that reports it to its caller (the test driver).
    pub stop_tasks_that_cannot_start: bool,
    /// How long a task's restore waits for a changelog that reads only up
    /// to below the end the task started against
    /// ([`ChangelogError::Unstable`]: a transaction of the task's previous
    /// owner not resolved on it yet) before the task fails, naming the
    /// partition and the offsets. Such a transaction resolves within its
    /// transaction timeout at most (its coordinator aborts it then): the
    /// Kafka runtime sets this to the producer's `transaction.timeout.ms`
    /// plus 5 s. 15 s by default.
    pub changelog_stable_wait: Duration,
    /// How long a failed task waits before it restarts, once the host's
    /// error handler asked for a restart ([`Worker::restart_task`]).
    pub task_backoff: Backoff,
    /// How long after its last write a local store may still be used: an
    /// older one is rebuilt, since compaction removes a delete's tombstone
    /// from a changelog after its `delete.retention.ms` (24 hours by
    /// default), and a store that never saw the delete would keep the key.
    /// Keep it below the changelogs' `delete.retention.ms`.
    pub local_store_max_age: Duration,
    /// Where task restores run: inside the call that starts the task, or as
    /// jobs the host runs elsewhere ([`Ready::restores`]).
    pub restores: RestoreMode,
    /// The most one task may hold, in bytes ([`InboundRecord::held_size`]
    /// of each held record), before the worker pauses fetching on the
    /// task's partitions whose heads are held. A partition that a held
    /// head's unmet claim points into is never paused, and one is resumed
    /// as soon as an arriving record claims it, its queue drains, or the
    /// task's holds fall to half the budget (the guide's "Memory and
    /// backpressure" says more). A record larger than the
    /// budget that has to wait fails its task ([`TaskError::HoldBudget`]).
    /// `None` sets no bound. 32 MiB by default.
    ///
    /// [`InboundRecord::held_size`]: parsley_protocol::InboundRecord::held_size
    pub hold_budget: Option<usize>,
    /// How many held records of each hold queue a task keeps in the
    /// node's memory (the head and a read-ahead window behind it). The
    /// others, once committed, are kept only in the task's committed
    /// protocol store (every held record is written there at commit in any
    /// case), and with a readable local store only there once it holds
    /// them, and read back in order when the gate reaches them. `None`
    /// keeps every held record in the node. 256 by default.
    pub hold_window: Option<usize>,
    /// How many held records a task's release pages back in per
    /// transaction. A cause that releases more (a million records behind
    /// an upstream transaction that finally commits) is released over
    /// several transactions, each committed as soon as the previous one
    /// is, instead of one transaction carrying every delivery and every
    /// delete at once. `None` sets no bound. 65,536 by default.
    pub release_per_transaction: Option<usize>,
    /// How many bytes of fold state this worker's tasks keep in memory
    /// together, at most, when its host keeps a local store that can be
    /// read while a task runs ([`LocalStore::reader`]): the tasks share it
    /// evenly, and the rest is read from their stores when a record needs
    /// it. Entries leave memory oldest write first, and only once the
    /// local store holds them. `None`, or a host without such a store,
    /// keeps the whole fold state in memory. 64 MiB by default.
    pub fold_cache: Option<usize>,
    /// The `thread-id` label of this worker's metrics.
    pub thread_id: String,
    /// Whether transactions list what each task did
    /// ([`Transaction::events`]). On by default: the test driver and the
    /// simulator read them. A host that never does (the Kafka runtime)
    /// turns it off and saves a few allocations per record; nothing the
    /// worker decides depends on it.
    pub events: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            commit_interval: Duration::from_millis(100),
            commit_when_idle: None,
            stream_records: None,
            truncation_interval: Duration::from_secs(600),
            start_policy: StartPolicy::Earliest,
            on_retention_loss: OnRetentionLoss::Fail,
            assignment: Assignment::Complete,
            commit_retries: 3,
            transient_backoff: DEFAULT_TRANSIENT_BACKOFF,
            task_backoff: Backoff::default(),
            changelog_stable_wait: Duration::from_secs(15),
            lookup_retry: LOOKUP_RETRY,
            stop_tasks_that_cannot_start: true,
            local_store_max_age: Duration::from_secs(12 * 3600),
            restores: RestoreMode::Inline,
            hold_budget: Some(DEFAULT_HOLD_BUDGET),
            hold_window: Some(DEFAULT_HOLD_WINDOW),
            release_per_transaction: Some(DEFAULT_RELEASE_PER_TRANSACTION),
            fold_cache: Some(DEFAULT_FOLD_CACHE),
            thread_id: "0".to_owned(),
            events: true,
        }
    }
}

/// How a worker hands records out into the open transaction
/// ([`WorkerConfig::stream_records`]).
///
/// Records go out in batches, not one by one: everything the tasks made
/// goes out at each commit point the host offers ([`Worker::ready`] with
/// a clock), and between commit points once `every` records have been
/// handed in ([`Worker::on_record`]) since the last hand-out. The host's
/// producer then takes records a batch at a time rather than one by one,
/// and the worker's bookkeeping is paid per batch too (handed out record
/// by record, the Kafka runtime spent about a third more CPU per record:
/// `docs/performance.md`, issue 55).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streaming {
    /// A transaction whose records went out is due once this long has
    /// passed since the first of them, whatever
    /// [`WorkerConfig::commit_interval`] says, so that it ends before its
    /// coordinator's timeout does (the Kafka runtime passes half of
    /// `transaction.timeout.ms`).
    pub limit: Duration,
    /// Between commit points, records go out after this many records
    /// were handed in (1: after every record). At least 1.
    pub every: usize,
}

impl Streaming {
    /// Streams at commit points, and between them after every
    /// [`DEFAULT_STREAM_EVERY`] records handed in, in transactions that
    /// end within `limit` of their first record going out.
    pub fn within(limit: Duration) -> Streaming {
        Streaming {
            limit,
            every: DEFAULT_STREAM_EVERY,
        }
    }

    /// The same, with records going out after every `every` records handed
    /// in between commit points (at least 1).
    pub fn every(self, every: usize) -> Streaming {
        Streaming {
            every: every.max(1),
            ..self
        }
    }
}

/// The default [`Streaming::every`]: 256 records handed in.
pub const DEFAULT_STREAM_EVERY: usize = 256;

/// The default [`WorkerConfig::transient_backoff`]: 100 ms, doubling up
/// to 5 s.
pub const DEFAULT_TRANSIENT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// The default [`WorkerConfig::hold_budget`]: 32 MiB per task.
pub const DEFAULT_HOLD_BUDGET: usize = 32 << 20;

/// The default [`WorkerConfig::release_per_transaction`]: 65,536 held
/// records per task and transaction. (It was 16,384 while each released
/// record cost the transaction a changelog tombstone and a file delete;
/// with held records stored in pages a released record costs its delivery
/// alone, and the larger bound releases faster in less memory: see
/// `docs/performance.md`.)
pub const DEFAULT_RELEASE_PER_TRANSACTION: usize = 65_536;

/// The default [`WorkerConfig::hold_window`]: 256 records per hold queue.
pub const DEFAULT_HOLD_WINDOW: usize = 256;

/// The default [`WorkerConfig::fold_cache`]: 64 MiB per worker.
pub const DEFAULT_FOLD_CACHE: usize = 64 << 20;
