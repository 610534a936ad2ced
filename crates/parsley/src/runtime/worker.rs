//! [`Worker`]: the host core. One per stream thread (one consumer and one
//! transactional producer); it owns the tasks assigned to that thread and
//! makes every decision a host makes. The thing around it only moves bytes.
//!
//! # Calls in, one door out
//!
//! Like raft-rs's `RawNode`, the worker takes calls that say what happened,
//! and hands back everything the host must do in one [`Ready`]
//! ([`ready`](Worker::ready)): task failures, restore jobs, fetch pauses
//! and resumes, consumer seeks, a fresh metrics sample, and the transaction
//! to commit. What the host did about it comes back through one
//! [`advance`](Worker::advance) ([`Ack`]: a seek made, a transaction's
//! delivery reports and its fate, a restore finished). The inputs:
//!
//! * [`assign`](Worker::assign) / [`revoke`](Worker::revoke): the group's
//!   assignment changes. The worker groups partitions into tasks (partition
//!   `p` of every source of a stage, and of its tick topic, is one task),
//!   refuses a task whose partitions did not all land here
//!   ([`WorkerError::SplitTask`]), restores each new task's stores from its
//!   changelogs, and decides where each channel starts: the protocol's
//!   resume position for an input that joined its scope, else the committed
//!   position, else the start policy, never below the log start. The
//!   consumer seeks go out in the next [`Ready`].
//! * [`on_record`](Worker::on_record) and
//!   [`on_position`](Worker::on_position): what a poll returned. A consumer
//!   position is passed to the task only once every record the polls
//!   returned at or below it went through the task (the position-capture
//!   rule); a position behind what was handed over is refused.
//! * [`punctuate`](Worker::punctuate): the wall clock. Ticks and hold
//!   warnings per task, and the log-start truncation sweep on its interval
//!   (a failed lookup skips the cycle and is counted).
//! * [`ready`](Worker::ready) with a commit point, or
//!   [`flush`](Worker::flush): one transaction over every task, paced by the
//!   commit interval: the records to produce (emissions and ticks, then the
//!   changelog records of both stores, task by task), the consumed
//!   positions to commit, and what each task did, in order.
//! * [`Ack::Committed`]: committed, aborted, fenced, or of unknown fate.
//!   An abort returns every task to its committed state and seeks every
//!   channel back to its committed position, so the retry redelivers the
//!   same records in the same causal order; fencing (a zombie) and an
//!   unknown fate drop every task.
//!
//! Any error from a task makes the open transaction unusable: the worker
//! refuses further work until the host aborts ([`abort`](Worker::abort)).
//!
//! # Backpressure
//!
//! A held record waits in memory until its causes arrive, and when a cause
//! topic stalls (an upstream outage, a transaction left open) every later
//! record of the partitions behind it would pile up there. The worker owns
//! fetching, so it bounds that: once what a task holds passes
//! [`WorkerConfig::hold_budget`], it pauses fetching
//! ([`Ready::flow`]) on the task's
//! partitions whose queue heads are held. Their next records could not be
//! delivered before those heads anyway, so they are better left in the
//! log. The rule never wedges:
//!
//! * a partition that a held head's unmet claim points into is never
//!   paused: some held record is waiting for its records;
//! * a paused partition resumes as soon as a record arrives with an unmet
//!   claim into it, a held head comes to claim it, its queue drains (its
//!   head was released), or the task's holds fall to half the budget;
//! * an abort rebuilds every task from its committed state and resumes all
//!   of its paused partitions.
//!
//! Only partitions of running tasks are paused this way, and only their
//! own heads decide; a partition with nothing held is never paused. What
//! is held, what is paused and the budget are metrics
//! ([`metrics`](crate::runtime::metrics)). A record larger than the whole
//! budget that has to wait fails its task
//! ([`TaskError::HoldBudget`]), saying which option to raise; nothing is
//! dropped, the record is fetched again when the task restarts. The
//! simulator runs worlds with budgets small enough that partitions pause
//! all the time, and checks that each still drains in causal order.
//!
//! Within what is held, only the front of each hold queue stays in memory
//! ([`WorkerConfig::hold_window`] records): the rest, once committed, is
//! kept only as the protocol-store entry every held record is written as,
//! and each task reads it back in order as its gate reaches it. With a
//! local store that can be read while the task runs, that entry leaves
//! memory too once the store holds it
//! ([`HeldPages`](crate::runtime::paging::HeldPages)). A release pages in
//! at most [`WorkerConfig::release_per_transaction`] records per
//! transaction; the transaction is then due at once, and the release goes
//! on at the next punctuation ([`Worker::release_due_in`]). Every
//! simulator application world runs with a window of one to three
//! records and releases of one or two records per transaction.
//!
//! # Determinism
//!
//! Tasks, channels and writes are kept in ordered maps; the same calls give
//! the same transactions, byte for byte.

mod assign;
mod commit;
mod door;
mod faults;
mod in_flight;
mod queries;
mod records;
mod start;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parsley_protocol::Channel;
use tracing::{debug, info, warn};

use crate::app::Parsley;
use crate::runtime::changelog::{self, ChangelogError, Changelogs};
pub use crate::runtime::failure::{
    Backoff, Directive, Fault, RefusedRecord, TaskFailure, WorkerError,
};
use crate::runtime::failure::{Stopped, Streak};
pub use crate::runtime::host::{
    AssignedPartition, Cluster, FlowChange, PolledRecord, RecordView, Seek,
};
use crate::runtime::local::{self, LocalStore, LocalWrite, StoreIdentity, StoreKind, WipeReason};
use crate::runtime::metrics::{Published, SAMPLE_INTERVAL, TaskMeters};
pub use crate::runtime::restore::{RestoreJob, RestoreMode, RestoreOutcome};
use crate::runtime::task::{
    Diversion, EmissionOrigin, OutgoingRecord, Task, TaskError, TaskEvent, TaskId, TaskStats,
};

pub use door::{Ack, Host, Ready, act_on};

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
    /// task's holds fall to half the budget: see the [module
    /// documentation](self) on backpressure. A record larger than the
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
    /// Records to produce, in order: per task, its emissions and ticks, then
    /// its changelog records.
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

/// Counters since the worker was created.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct WorkerStats {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions aborted.
    pub aborts: u64,
    /// Times the worker was fenced.
    pub fenced: u64,
    /// Tasks started (assignment).
    pub tasks_started: u64,
    /// Tasks restored with held records.
    pub restored_with_held: u64,
    /// Of those, tasks whose held records were read from their local store
    /// (not kept in memory at the start).
    pub restored_with_held_on_disk: u64,
    /// Tasks rebuilt after an abort while they held records their local
    /// store kept for them.
    pub resets_with_held_on_disk: u64,
    /// Truncation sweeps run (per task).
    pub sweeps: u64,
    /// Stamp-side entries the sweeps removed.
    pub truncated_entries: u64,
    /// Sweeps skipped because the log-start lookup failed.
    pub truncation_sweeps_skipped: u64,
    /// Positions deferred because polled records below them were not yet
    /// handed over.
    pub positions_deferred: u64,
    /// Task starts that failed on a transient lookup and were retried.
    pub task_start_retries: u64,
    /// Records dropped because their task was waiting to start (they are
    /// fetched again from the task's start position).
    pub dropped_while_waiting: u64,
    /// Channels that went on from their log start past records retention
    /// removed before the stage read them
    /// ([`OnRetentionLoss::ResumeAtLogStart`]).
    pub retention_losses: u64,
    /// Tasks that failed and were stopped.
    pub task_failures: u64,
    /// Stopped tasks restarted.
    pub task_restarts: u64,
    /// Faults the host reported ([`Worker::on_fault`]).
    pub faults: u64,
    /// Commit steps retried after a retriable fault.
    pub commit_retries: u64,
    /// Transactions aborted for a transient fault
    /// ([`Fault::Transient`], [`Fault::Abortable`]), each followed by a
    /// backoff.
    pub transient_aborts: u64,
    /// Producers replaced with the membership kept
    /// ([`Directive::ReplaceProducer`]).
    pub producer_replacements: u64,
    /// Task restores that read a changelog only up to below the end the
    /// task started against ([`ChangelogError::Unstable`]) and waited.
    pub short_restores: u64,
    /// Times a task was left partial: some of its partitions here, the
    /// rest not yet ([`Assignment::Incremental`]).
    pub partial_tasks: u64,
    /// Changelog records replayed by task starts.
    pub changelog_records_replayed: u64,
    /// Tasks started from their local store (replaying only the changelog
    /// after its checkpoint).
    pub local_store_starts: u64,
    /// Local stores wiped and rebuilt from the whole changelog (missing
    /// ones are not counted).
    pub local_store_rebuilds: u64,
    /// Local store writes that failed or could not be checkpointed (the
    /// store was wiped).
    pub local_store_write_failures: u64,
    /// Partitions paused because their task's holds passed the hold
    /// budget.
    pub hold_pauses: u64,
    /// Of those, resumed because their queue drained.
    pub hold_resumes_drained: u64,
    /// Of those, resumed because a held head or an arriving record claimed
    /// records on them.
    pub hold_resumes_claimed: u64,
    /// Of those, resumed because the task's holds fell to half the budget.
    pub hold_resumes_relieved: u64,
    /// Times a partition with a held head was left fetching past the
    /// budget because a held head (or an arriving record) waited for its
    /// records.
    pub hold_pauses_withheld: u64,
    /// Held records read back from a task's committed store as the gate
    /// reached them (see [`WorkerConfig::hold_window`]).
    pub records_paged_in: u64,
    /// Fold state entries read from a task's local store because they had
    /// left memory (see [`WorkerConfig::fold_cache`]).
    pub fold_store_reads: u64,
    /// Fold state entries that left memory for the local store.
    pub fold_cache_evictions: u64,
    /// Times an entry over the fold cache stayed in memory because the
    /// local store did not hold its latest write yet.
    pub fold_evictions_withheld: u64,
    /// Held records whose in-memory copy was dropped once the task's
    /// local store held them.
    pub held_records_evicted: u64,
    /// Held records read back from a task's local store (as the gate
    /// reached them, or when the task started or was rebuilt).
    pub held_records_read_from_disk: u64,
    /// Releases that went on in a later transaction after stopping at
    /// [`WorkerConfig::release_per_transaction`].
    pub releases_resumed: u64,
}

impl WorkerStats {
    fn add(&mut self, c: crate::runtime::metrics::Counted) {
        self.records_paged_in += c.paged_in;
        self.fold_store_reads += c.fold.reads;
        self.fold_cache_evictions += c.fold.evicted;
        self.fold_evictions_withheld += c.fold.withheld;
        self.held_records_evicted += c.held_evicted;
        self.held_records_read_from_disk += c.held_disk_reads;
    }
}

/// The task an abort is owed to, and why.
#[derive(Debug)]
struct Failing {
    task: TaskId,
    reason: String,
    refused: Option<RefusedRecord>,
    /// Whether the failure passes with time ([`TaskError::is_transient`]).
    transient: bool,
}

#[derive(Debug)]
enum State {
    Open,
    InFlight,
    MustAbort(String),
}

struct ChannelSlot {
    topic: String,
    partition: i32,
    channel: Channel,
    /// Next offset expected from the consumer (after the last record handed
    /// over, or a position applied).
    position: i64,
    /// The committed consumer position.
    committed: i64,
    /// A captured position waiting for records at or below `last` to be
    /// handed over first: (position, last returned offset).
    pending: Option<(i64, i64)>,
    /// A seek handed out and not yet confirmed by the host.
    awaiting_seek: Option<i64>,
    /// Facts from the assignment.
    assigned: AssignedPartition,
}

impl ChannelSlot {
    /// Moves the channel to `offset` and asks the host for the seek there;
    /// its records are refused until the host confirms it.
    fn restart_at(&mut self, offset: i64, seeks: &mut Vec<Seek>) {
        self.position = offset;
        self.pending = None;
        self.awaiting_seek = Some(offset);
        seeks.push(Seek {
            topic: self.topic.clone(),
            partition: self.partition,
            offset,
        });
    }

    /// The refusal of anything read on the channel while the seek it asked
    /// for is not confirmed.
    fn unsought(&self) -> Option<WorkerError> {
        self.awaiting_seek
            .map(|offset| WorkerError::SeekNotApplied {
                topic: self.topic.clone(),
                partition: self.partition,
                offset,
            })
    }
}

struct TaskSlot {
    task: Option<Task>,
    meters: TaskMeters,
    channels: Vec<ChannelSlot>,
    next_sweep_at: i64,
    local: Local,
    throttle: Throttle,
}

impl Throttle {
    /// Whether the hold budget has anything to decide for `task`:
    /// something is paused, or its holds are past `budget`. (The common
    /// path: one comparison.)
    fn engaged(&self, task: &Task, budget: Option<usize>) -> bool {
        budget.is_some_and(|b| !self.paused.is_empty() || task.node().held_bytes() > b)
    }
}

/// A running task's partitions paused for its hold budget.
#[derive(Debug, Default)]
struct Throttle {
    /// Indexes into the slot's channels.
    paused: BTreeSet<usize>,
    /// The heads (channel, offset) at the last look: while they stay the
    /// same, no claim can have appeared that a resume would answer.
    heads: Vec<(Channel, i64)>,
    /// Channels an arriving record claimed, with their head offset then:
    /// not paused again until that head is released.
    exempt: BTreeMap<Channel, i64>,
    /// Whether the holds were over the budget at the last look.
    over: bool,
}

/// A task's local store, as this worker keeps it.
#[derive(Debug)]
enum Local {
    /// The worker has no local store.
    Off,
    /// Written after each commit; holds what it belongs to and its
    /// checkpoint.
    Writing {
        identity: StoreIdentity,
        checkpoint: BTreeMap<String, i64>,
    },
    /// A write failed or could not be checkpointed: the store was wiped,
    /// and this task writes no more to it until it starts again.
    Stale,
    /// As `Stale`, for a task whose fold state reads through the store:
    /// what left memory is no longer kept, so the task fails at its next
    /// transaction and restarts from its changelogs.
    Lost(String),
}

/// What a task's restore needs once its replay is done.
#[derive(Debug)]
struct Prepared {
    identity: StoreIdentity,
    from_local: bool,
    /// The local store is not used for this task (none, or it would not
    /// open).
    local_off: bool,
    /// The task's fold state reads through its local store: the store's
    /// fold entries were not loaded.
    bounded: bool,
    /// The task's held records are read back from its local store: the
    /// store's held records were not loaded.
    held_on_disk: bool,
}

/// A task whose restore job is out.
#[derive(Debug)]
struct Restoring {
    job: u64,
    prepared: Prepared,
    /// A failed task restarting in place, not a task of a new assignment.
    restart: bool,
    /// The job's flag: set when the worker stops waiting for it, so a host
    /// that has not started it yet never does.
    cancelled: Arc<std::sync::atomic::AtomicBool>,
}

impl Restoring {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }
}

/// Which task, and which of its channels, each assigned partition's
/// records go to. Looked up by a borrowed topic name and the task named by
/// a shared id, so routing a record allocates nothing.
#[derive(Default)]
struct Routes(BTreeMap<String, BTreeMap<i32, (Arc<TaskId>, usize)>>);

impl Routes {
    fn get(&self, topic: &str, partition: i32) -> Option<&(Arc<TaskId>, usize)> {
        self.0.get(topic)?.get(&partition)
    }

    fn insert(&mut self, topic: &str, partition: i32, task: &Arc<TaskId>, channel: usize) {
        self.0
            .entry(topic.to_owned())
            .or_default()
            .insert(partition, (Arc::clone(task), channel));
    }

    fn remove(&mut self, topic: &str, partition: i32) {
        if let Some(partitions) = self.0.get_mut(topic) {
            partitions.remove(&partition);
            if partitions.is_empty() {
                self.0.remove(topic);
            }
        }
    }
}

/// The host core for one stream thread. See the [module
/// documentation](self).
pub struct Worker {
    app: Parsley,
    config: WorkerConfig,
    assigned: BTreeMap<(String, i32), AssignedPartition>,
    tasks: BTreeMap<TaskId, TaskSlot>,
    /// Tasks whose start failed on a transient lookup (a leader or a
    /// coordinator moving, a broker down), retried at a punctuation once
    /// their pause is over ([`LOOKUP_RETRY`]).
    waiting: BTreeMap<TaskId, Retrying>,
    /// When each task's restore first stopped below its changelog's end
    /// ([`ChangelogError::Unstable`]), by the host's clock.
    unstable_since: BTreeMap<TaskId, i64>,
    /// The task whose error poisoned the open transaction, if a task's did.
    failing: Option<Failing>,
    /// Tasks that failed and stopped; their partitions stay assigned here.
    stopped: BTreeMap<TaskId, Stopped>,
    /// Failures not yet taken by the host.
    failures: Vec<TaskFailure>,
    /// Each task's failures in a row.
    streaks: BTreeMap<TaskId, Streak>,
    /// Fetch pauses and resumes the host has not taken yet.
    flow: Vec<FlowChange>,
    /// Tasks some of whose partitions are here and some not
    /// ([`Assignment::Incremental`]): their partitions are paused.
    partial: BTreeSet<TaskId>,
    /// Emissions each task sends to a dead-letter topic instead of its sink.
    diversions: BTreeMap<TaskId, BTreeMap<EmissionOrigin, Diversion>>,
    /// The transaction in flight: its records' tasks and places, and its
    /// commit retries.
    in_flight: in_flight::InFlight,
    /// Transient faults since the last commit, and the pause they ask of
    /// the host.
    since_commit: faults::SinceCommit,
    /// The host's local stores, if it keeps state on disk.
    local: Option<Box<dyn LocalStore>>,
    /// Told how each restore goes.
    restore_listener: Option<std::sync::Arc<dyn changelog::RestoreListener>>,
    /// Tasks whose restore job is out ([`RestoreMode::Deferred`]).
    restoring: BTreeMap<TaskId, Restoring>,
    /// Each stateful task's share of the fold cache, read by restore jobs
    /// as they write their fold state out (see [`WorkerConfig::fold_cache`]).
    fold_share: Arc<AtomicUsize>,
    /// Restore jobs the host has not taken yet.
    jobs: Vec<RestoreJob>,
    /// Failed tasks whose restart in place is starting now.
    restarting: BTreeSet<TaskId>,
    next_job: u64,
    routes: Routes,
    state: State,
    /// When the last transaction was handed over, by the host's clock.
    last_handed: Option<i64>,
    dirty: bool,
    seeks: Vec<Seek>,
    now: i64,
    next_txn: u64,
    stats: WorkerStats,
    next_sample_at: i64,
    published: Published,
    /// A sample taken since the host's last [`Ready`].
    fresh_sample: bool,
    /// A transaction a flush or a revocation closed, not yet handed over
    /// in a [`Ready`].
    closed: Option<Transaction>,
    /// The records of an open transaction the host aborted, not yet
    /// handed over in a [`Ready`].
    abandoned: Vec<OutgoingRecord>,
    /// State queries waiting for their causes, and answers not taken.
    queries: queries::Queries,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("application_id", &self.app.application_id())
            .field("tasks", &self.tasks.keys().collect::<Vec<_>>())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// The first wait before a commit step is retried.
const COMMIT_RETRY: Duration = Duration::from_millis(100);

/// How long a task whose start failed on a lookup waits before the lookup
/// is made again: 200 ms, doubling with each failure in a row, up to 5 s.
/// (Every punctuation, as before, made a lookup every few milliseconds
/// while a broker failed over, and logged each failure.)
pub const LOOKUP_RETRY: Backoff = Backoff {
    initial: Duration::from_millis(200),
    max: Duration::from_secs(5),
};

/// How many times an abort that could not reach its transaction
/// coordinator is made again before the worker asks for a new producer
/// instead (whose initialisation ends the transaction as surely, and waits
/// for the coordinator by itself): each attempt waits out its own timeout,
/// and three of them kept a partition still for 40 s on a three-broker
/// cluster whose group coordinator was killed.
pub const ABORT_RETRIES: u32 = 1;

/// How many times in a row, with no commit in between, the worker asks its
/// host for a new producer ([`Directive::ReplaceProducer`]) before it
/// gives the membership up instead.
pub const MAX_PRODUCER_REPLACEMENTS: u32 = 2;

/// A task waiting to start again after a failed lookup.
#[derive(Clone, Copy, Debug)]
struct Retrying {
    /// Failed attempts in a row.
    failures: u32,
    /// When the next attempt is due, by the host's clock.
    at: i64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    /// A worker for `app` with nothing assigned.
    pub fn new(app: &Parsley, config: WorkerConfig) -> Worker {
        let fold_cache = config.fold_cache.unwrap_or(usize::MAX);
        Worker {
            app: app.clone(),
            config,
            assigned: BTreeMap::new(),
            tasks: BTreeMap::new(),
            waiting: BTreeMap::new(),
            unstable_since: BTreeMap::new(),
            failing: None,
            stopped: BTreeMap::new(),
            failures: Vec::new(),
            streaks: BTreeMap::new(),
            flow: Vec::new(),
            partial: BTreeSet::new(),
            diversions: BTreeMap::new(),
            in_flight: in_flight::InFlight::default(),
            since_commit: faults::SinceCommit::default(),
            local: None,
            restore_listener: None,
            restoring: BTreeMap::new(),
            fold_share: Arc::new(AtomicUsize::new(fold_cache)),
            jobs: Vec::new(),
            restarting: BTreeSet::new(),
            next_job: 0,
            routes: Routes::default(),
            state: State::Open,
            last_handed: None,
            dirty: false,
            seeks: Vec::new(),
            now: 0,
            next_txn: 1,
            stats: WorkerStats::default(),
            next_sample_at: 0,
            published: Published::default(),
            fresh_sample: false,
            closed: None,
            abandoned: Vec::new(),
            queries: queries::Queries::default(),
        }
    }

    /// Keeps each task's stores in `store` between runs: a task that
    /// starts reads its store and replays only the changelog after the
    /// store's checkpoint, and each commit's writes reach the store once
    /// the commit is known (see [`local`] for the
    /// rules). The host then reports each transaction's offsets
    /// ([`Ack::Delivered`]).
    pub fn with_local_store(mut self, store: Box<dyn LocalStore>) -> Worker {
        self.local = Some(store);
        self
    }

    /// Tells `listener` how each task's restore goes: per changelog
    /// partition, its start, a batch every
    /// [`PROGRESS_EVERY`](changelog::PROGRESS_EVERY) records, and its end.
    pub fn with_restore_listener(
        mut self,
        listener: std::sync::Arc<dyn changelog::RestoreListener>,
    ) -> Worker {
        self.restore_listener = Some(listener);
        self
    }

    /// Whether this worker keeps local stores.
    pub fn has_local_store(&self) -> bool {
        self.local.is_some()
    }

    /// The application.
    pub fn app(&self) -> &Parsley {
        &self.app
    }

    /// Counters since creation.
    pub fn stats(&self) -> WorkerStats {
        self.stats
    }

    /// The tasks running here, in order.
    pub fn tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.tasks.keys()
    }

    /// A running task.
    pub fn task(&self, id: &TaskId) -> Option<&Task> {
        self.tasks.get(id).and_then(|s| s.task.as_ref())
    }

    /// Per task counters.
    pub fn task_stats(&self) -> Vec<(TaskId, TaskStats)> {
        self.tasks
            .iter()
            .filter_map(|(id, s)| s.task.as_ref().map(|t| (id.clone(), t.stats())))
            .collect()
    }

    /// The partitions assigned here.
    pub fn assignment(&self) -> impl Iterator<Item = &AssignedPartition> {
        self.assigned.values()
    }

    /// Where the consumer fetches an assigned partition from when the host
    /// assigns it (or assigns it again): its task's position when the task
    /// runs, else the partition's log start, to be sought from when the
    /// task starts. Always an absolute offset: a logical one (the
    /// beginning) makes the consumer look it up, and an answer that lands
    /// after the task's seek moves the fetch back to the beginning (seen
    /// on a real broker after a restore of 1M keys, as a record at offset
    /// 0 the worker refused as out of order).
    pub fn fetch_start(&self, topic: &str, partition: i32) -> i64 {
        self.position(topic, partition)
            .or_else(|| {
                self.assigned
                    .get(&(topic.to_owned(), partition))
                    .map(|a| a.log_start)
            })
            .unwrap_or(0)
    }

    /// The next offset the consumer must fetch on a partition.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let (id, i) = self.routes.get(topic, partition)?;
        Some(self.tasks.get(&**id)?.channels[*i].position)
    }

    /// The committed position of a partition.
    pub fn committed(&self, topic: &str, partition: i32) -> Option<i64> {
        let (id, i) = self.routes.get(topic, partition)?;
        Some(self.tasks.get(&**id)?.channels[*i].committed)
    }

    /// Whether a transaction is in flight.
    pub fn in_flight(&self) -> bool {
        matches!(self.state, State::InFlight)
    }

    /// Whether there is open work for a transaction.
    pub fn has_open_work(&self) -> bool {
        self.dirty
    }
}

/// Whether a failure is a lookup that may succeed on a retry (a broker
/// offset query, or a metadata or changelog read that failed rather than
/// found the topic missing).
fn transient(e: &WorkerError) -> bool {
    use crate::runtime::host::MetadataError;
    match e {
        WorkerError::Task(t) => transient_task(t),
        WorkerError::Changelog(ChangelogError::Unavailable {
            cause: MetadataError::Failed { .. },
            ..
        }) => true,
        WorkerError::Changelog(ChangelogError::Unstable { .. }) => true,
        _ => false,
    }
}

fn transient_task(e: &TaskError) -> bool {
    use crate::runtime::host::MetadataError;
    use parsley_protocol::ProtocolError;
    matches!(
        e,
        TaskError::Metadata {
            cause: MetadataError::Failed { .. },
            ..
        } | TaskError::Protocol {
            cause: ProtocolError::BrokerOffsets(_),
            ..
        } | TaskError::LocalStore { .. }
    )
}

/// Wipes a store that cannot be used, saying why.
/// Wipes the store of a task that failed reading it back
/// (`TaskError::LocalStore`): a damaged file reads as damaged again, so the
/// task's next start rebuilds it from the changelog instead. Anything else
/// leaves the store as it is. Returns whether it wiped.
fn wipe_unreadable(local: Option<&mut Box<dyn LocalStore>>, id: &TaskId, e: &TaskError) -> bool {
    match (e, local) {
        (TaskError::LocalStore { cause, .. }, Some(store)) => {
            wipe(
                store.as_mut(),
                id,
                &WipeReason::Unreadable(cause.to_string()),
            );
            true
        }
        _ => false,
    }
}

fn wipe(store: &mut dyn LocalStore, id: &TaskId, reason: &WipeReason) {
    warn!(task = %id, %reason, "the local store is wiped and rebuilt from the changelog");
    if let Err(e) = store.wipe(id) {
        warn!(task = %id, error = %e, "the local store could not be wiped");
    }
}

/// A channel consumed up to `at` whose partition now starts at
/// `log_start` (above it) lost records it never read. Under
/// [`OnRetentionLoss::Fail`] that is the error to fail with; under
/// [`OnRetentionLoss::ResumeAtLogStart`] it is logged and counted, and the
/// channel goes on from the log start, which this returns.
fn retention_loss(
    on_loss: OnRetentionLoss,
    stats: &mut WorkerStats,
    task: &TaskId,
    c: &ChannelSlot,
    at: i64,
    log_start: i64,
) -> Result<i64, WorkerError> {
    match on_loss {
        OnRetentionLoss::Fail => Err(WorkerError::RetentionLoss {
            task: task.clone(),
            topic: c.topic.clone(),
            partition: c.partition,
            committed: at,
            log_start,
        }),
        OnRetentionLoss::ResumeAtLogStart => {
            warn!(%task, topic = %c.topic, partition = c.partition, committed = at, log_start,
                lost = log_start - at, "records removed by retention before this stage read them; going on from the log start, as configured");
            stats.retention_losses += 1;
            Ok(log_start)
        }
    }
}
