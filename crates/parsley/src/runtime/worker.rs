//! [`Worker`]: the host core. One per stream thread (one consumer and one
//! transactional producer); it owns the tasks assigned to that thread and
//! makes every decision a host makes. The thing around it only moves bytes.
//!
//! # Calls in, one transaction out
//!
//! Like raft-rs's `RawNode`, the worker takes calls and hands back what the
//! host must do, pulled:
//!
//! * [`assign`](Worker::assign) / [`revoke`](Worker::revoke): the group's
//!   assignment changes. The worker groups partitions into tasks (partition
//!   `p` of every source of a stage, and of its tick topic, is one task),
//!   refuses a task whose partitions did not all land here
//!   ([`WorkerError::SplitTask`]), restores each new task's stores from its
//!   changelogs, and decides where each channel starts: the protocol's
//!   resume position for an input that joined its scope, else the committed
//!   position, else the start policy, never below the log start. The
//!   consumer seeks go out through [`take_seeks`](Worker::take_seeks).
//! * [`on_record`](Worker::on_record) and
//!   [`on_position`](Worker::on_position): what a poll returned. A consumer
//!   position is passed to the task only once every record the polls
//!   returned at or below it went through the task (the position-capture
//!   rule); a position behind what was handed over is refused.
//! * [`punctuate`](Worker::punctuate): the wall clock. Ticks and hold
//!   warnings per task, and the log-start truncation sweep on its interval
//!   (a failed lookup skips the cycle and is counted).
//! * [`poll_transaction`](Worker::poll_transaction) /
//!   [`flush`](Worker::flush): one transaction over every task, paced by the
//!   commit interval: the records to produce (emissions and ticks, then the
//!   changelog records of both stores, task by task), the consumed
//!   positions to commit, and what each task did, in order.
//! * [`commit_outcome`](Worker::commit_outcome): committed, aborted or
//!   fenced. An abort returns every task to its committed state and seeks
//!   every channel back to its committed position, so the retry redelivers
//!   the same records in the same causal order; fencing (a zombie) drops
//!   every task.
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
//! ([`take_flow_changes`](Worker::take_flow_changes)) on the task's
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
//! Within what is held, only the front of each hold queue stays decoded
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parsley_protocol::{BrokerOffsets, Channel};
use tracing::{debug, info, warn};

use crate::app::Parsley;
use crate::message::Header;
use crate::runtime::changelog::{self, ChangelogError, ChangelogReader, Changelogs};
pub use crate::runtime::failure::{
    Backoff, Directive, Fault, RefusedRecord, TaskFailure, WorkerError,
};
use crate::runtime::failure::{Stopped, Streak};
use crate::runtime::local::{self, LocalStore, LocalWrite, StoreIdentity, StoreKind, WipeReason};
use crate::runtime::metrics::{Published, SAMPLE_INTERVAL, TaskMeters};
pub use crate::runtime::restore::{RestoreJob, RestoreMode, RestoreOutcome};
use crate::runtime::task::{
    Diversion, EmissionOrigin, FetchedRecord, OutgoingRecord, Task, TaskError, TaskEvent, TaskId,
    TaskStats, TopicMetadata,
};

/// Everything the worker may ask of the cluster: topic metadata, broker
/// offsets, and changelog replay.
pub trait Cluster: TopicMetadata + BrokerOffsets + ChangelogReader {}

impl<T: TopicMetadata + BrokerOffsets + ChangelogReader> Cluster for T {}

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

/// How a worker paces its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// How often [`Worker::poll_transaction`] hands a transaction over, at
    /// most: one is due once work is open and this long has passed since
    /// the previous one was handed over (the first is due at once). As with
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
    /// jobs the host runs elsewhere ([`Worker::take_restore_jobs`]).
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
    /// delete at once. `None` sets no bound. 16,384 by default.
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
            task_backoff: Backoff::default(),
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

/// The default [`WorkerConfig::hold_budget`]: 32 MiB per task.
pub const DEFAULT_HOLD_BUDGET: usize = 32 << 20;

/// The default [`WorkerConfig::release_per_transaction`]: 16,384 held
/// records per task and transaction.
pub const DEFAULT_RELEASE_PER_TRANSACTION: usize = 16_384;

/// The default [`WorkerConfig::hold_window`]: 256 records per hold queue.
pub const DEFAULT_HOLD_WINDOW: usize = 256;

/// The default [`WorkerConfig::fold_cache`]: 64 MiB per worker.
pub const DEFAULT_FOLD_CACHE: usize = 64 << 20;

/// One partition the group assigned, with the facts the worker needs to
/// choose its start.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AssignedPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The group's committed position, if any.
    pub committed: Option<i64>,
    /// The partition's log start.
    pub log_start: i64,
    /// The partition's end (last stable offset), for [`StartPolicy::Latest`];
    /// `None` when the lookup gave no answer. A channel that needs it (no
    /// committed position, start policy latest) then fails its task with
    /// [`WorkerError::EndUnknown`] rather than guess.
    pub end: Option<i64>,
}

/// A record as a poll returned it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PolledRecord {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Every header, in record order.
    pub headers: Vec<Header>,
}

/// A consumer seek the host must make.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Seek {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to fetch.
    pub offset: i64,
}

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

/// A partition whose fetching pauses or resumes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FlowChange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// True to pause fetching, false to resume it.
    pub paused: bool,
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
    /// Commit the open work first ([`Worker::flush`]).
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
}

struct Slot {
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
}

/// A run of one task's changelog records on one topic in the transaction
/// in flight.
#[derive(Debug)]
struct Span {
    task: TaskId,
    topic: String,
    end: usize,
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
    tasks: BTreeMap<TaskId, Slot>,
    /// Tasks whose start failed on a transient lookup, retried at each
    /// punctuation.
    waiting: BTreeSet<TaskId>,
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
    /// Which task made which records of the transaction in flight: per
    /// task, the end (exclusive) of its records.
    owners: Vec<(usize, TaskId)>,
    /// Retries of the in-flight transaction's commit so far.
    commit_retries: u32,
    /// Where each task's changelog records lie in the transaction in
    /// flight.
    spans: Vec<Span>,
    /// The checkpoint each task's changelog records reach, once the host
    /// reported the transaction's offsets ([`Worker::delivered`]).
    reached: BTreeMap<TaskId, BTreeMap<String, i64>>,
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
            waiting: BTreeSet::new(),
            failing: None,
            stopped: BTreeMap::new(),
            failures: Vec::new(),
            streaks: BTreeMap::new(),
            flow: Vec::new(),
            partial: BTreeSet::new(),
            diversions: BTreeMap::new(),
            owners: Vec::new(),
            commit_retries: 0,
            spans: Vec::new(),
            reached: BTreeMap::new(),
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
        }
    }

    /// Keeps each task's stores in `store` between runs: a task that
    /// starts reads its store and replays only the changelog after the
    /// store's checkpoint, and each commit's writes reach the store once
    /// the commit is known (see [`local`] for the
    /// rules). The host then reports each transaction's offsets
    /// ([`delivered`](Self::delivered)).
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

    /// The offset each record of the transaction handed over last got, by
    /// index (from the producer's delivery reports), reported before its
    /// [`commit_outcome`](Self::commit_outcome). With a local store, these
    /// are the checkpoints the commit's writes reach; a commit whose
    /// offsets were not reported cannot be checkpointed, and the stores of
    /// the tasks it wrote are wiped (rebuilt at their next start).
    pub fn delivered(&mut self, offsets: &[i64]) {
        self.reached.clear();
        if self.local.is_none() {
            return;
        }
        let mut broken = BTreeSet::new();
        for span in &self.spans {
            // A partition's records get increasing offsets: the last one
            // is the furthest.
            match span.end.checked_sub(1).and_then(|i| offsets.get(i)) {
                Some(&offset) if offset >= 0 => {
                    let next = self
                        .reached
                        .entry(span.task.clone())
                        .or_default()
                        .entry(span.topic.clone())
                        .or_insert(0);
                    *next = (*next).max(offset.saturating_add(1));
                }
                _ => {
                    broken.insert(span.task.clone());
                }
            }
        }
        for task in broken {
            self.reached.remove(&task);
        }
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

    /// The seeks the consumer must make, in order (after an assignment or
    /// an abort).
    pub fn take_seeks(&mut self) -> Vec<Seek> {
        std::mem::take(&mut self.seeks)
    }

    fn ready(&self) -> Result<(), WorkerError> {
        match &self.state {
            State::Open => Ok(()),
            State::InFlight => Err(WorkerError::CommitInFlight),
            State::MustAbort(reason) => Err(WorkerError::AbortRequired {
                reason: reason.clone(),
            }),
        }
    }

    fn poison<T>(&mut self, e: impl Into<WorkerError>) -> Result<T, WorkerError> {
        let e = e.into();
        self.state = State::MustAbort(e.to_string());
        Err(e)
    }

    /// A task's own error: it poisons the open transaction like any other,
    /// and the abort that follows stops that task alone.
    fn fail_task<T>(&mut self, id: TaskId, e: impl Into<WorkerError>) -> Result<T, WorkerError> {
        let e = e.into();
        if let WorkerError::Task(task_error) = &e
            && wipe_unreadable(self.local.as_mut(), &id, task_error)
            && let Some(slot) = self.tasks.get_mut(&id)
        {
            slot.local = Local::Stale;
        }
        self.failing = Some(Failing {
            task: id,
            reason: e.to_string(),
            refused: None,
        });
        self.poison(e)
    }

    /// The group assigned these partitions (in addition to what this worker
    /// holds). Starts every task they complete, restoring its stores from
    /// its changelogs, and queues the consumer seeks.
    pub fn assign(
        &mut self,
        partitions: Vec<AssignedPartition>,
        cluster: &dyn Cluster,
        now: i64,
    ) -> Result<(), WorkerError> {
        self.ready()?;
        self.now = self.now.max(now);
        // Validate the whole assignment before changing anything.
        let mut touched = BTreeSet::new();
        let mut incoming = BTreeSet::new();
        for p in &partitions {
            let Some(id) = self.task_of(&p.topic, p.partition) else {
                return Err(WorkerError::UnknownPartition {
                    application: self.app.application_id().to_owned(),
                    topic: p.topic.clone(),
                    partition: p.partition,
                });
            };
            touched.insert(id);
            incoming.insert((p.topic.clone(), p.partition));
        }
        for id in &touched {
            if self.tasks.contains_key(id)
                || self.waiting.contains(id)
                || self.restoring.contains_key(id)
                || self.stopped.contains_key(id)
            {
                continue;
            }
            let needed = self.needed(id);
            let here = |k: &(String, i32)| self.assigned.contains_key(k) || incoming.contains(k);
            if self.config.assignment == Assignment::Complete && !needed.iter().all(here) {
                let fmt =
                    |v: &[&(String, i32)]| v.iter().map(|(t, p)| format!("{t}:{p}")).collect();
                let held: Vec<&(String, i32)> = needed.iter().filter(|k| here(k)).collect();
                return Err(WorkerError::SplitTask {
                    task: id.clone(),
                    needed: fmt(&needed.iter().collect::<Vec<_>>()),
                    assigned: fmt(&held),
                });
            }
        }
        for p in partitions {
            self.assigned.insert((p.topic.clone(), p.partition), p);
        }
        for id in touched {
            if self.tasks.contains_key(&id)
                || self.waiting.contains(&id)
                || self.restoring.contains_key(&id)
                || self.stopped.contains_key(&id)
            {
                continue;
            }
            let needed = self.needed(&id);
            if !needed.iter().all(|k| self.assigned.contains_key(k)) {
                // Only under incremental assignment (checked above): wait
                // for the rest, fetching nothing meanwhile.
                self.hold_partial(&id);
                continue;
            }
            if self.partial.remove(&id) {
                debug!(task = %id, "every partition of the task is here; it forms");
                for (topic, partition) in needed {
                    self.flow.push(FlowChange {
                        topic,
                        partition,
                        paused: false,
                    });
                }
            }
            self.try_start(id, cluster)?;
        }
        Ok(())
    }

    /// A task with only some of its partitions here: they are paused (and
    /// their records dropped) until the rest arrive.
    fn hold_partial(&mut self, id: &TaskId) {
        if self.partial.insert(id.clone()) {
            self.stats.partial_tasks += 1;
        }
        let here: Vec<(String, i32)> = self
            .needed(id)
            .into_iter()
            .filter(|k| self.assigned.contains_key(k))
            .collect();
        debug!(task = %id, here = here.len(), "some of the task's partitions are here; it forms when the rest arrive");
        for (topic, partition) in here {
            self.flow.push(FlowChange {
                topic,
                partition,
                paused: true,
            });
        }
    }

    /// Tasks waiting for the rest of their partitions
    /// ([`Assignment::Incremental`]).
    pub fn partial_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.partial.iter()
    }

    /// Starts a task; a transient lookup failure leaves it waiting (its
    /// partitions' records are dropped, to be fetched again from its start
    /// position once it runs), to be retried at the next punctuation. Any
    /// other failure is final.
    fn try_start(&mut self, id: TaskId, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        match self.start_task(&id, cluster) {
            Ok(()) => {
                self.waiting.remove(&id);
                Ok(())
            }
            Err(e) if transient(&e) => {
                warn!(task = %id, error = %e, "task start failed on a lookup; retrying at the next punctuation");
                self.stats.task_start_retries += 1;
                self.waiting.insert(id);
                Ok(())
            }
            Err(e) => self.poison(e),
        }
    }

    /// Tasks still waiting to start.
    pub fn waiting_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.waiting.iter()
    }

    /// Takes a failed task out of the running set after the abort its
    /// error required: its records are dropped (and fetched again from its
    /// committed position when it restarts) and the failure is queued for
    /// the host.
    fn stop_task(&mut self, slot: Slot, failing: Failing) {
        let Failing {
            task: id,
            reason,
            refused,
        } = failing;
        for c in &slot.channels {
            self.routes.remove(&c.topic, c.partition);
            // Nothing reads them until the task restarts.
            self.flow.push(FlowChange {
                topic: c.topic.clone(),
                partition: c.partition,
                paused: true,
            });
        }
        let earlier = self
            .streaks
            .entry(id.clone())
            .or_default()
            .fail(self.now, &self.config.task_backoff);
        self.stats.task_failures += 1;
        warn!(task = %id, error = %reason, failures_in_a_row = earlier + 1,
            "task failed and stopped; nothing past the failing record is committed for it, and the thread's other tasks go on");
        self.stopped
            .insert(id.clone(), Stopped { restart_at: None });
        self.failures.push(TaskFailure {
            task: id,
            error: reason,
            earlier_in_a_row: earlier,
            refused,
        });
    }

    /// The tasks that failed since the last call, in the order they failed:
    /// each is stopped until [`restart_task`](Self::restart_task) (the
    /// host's error handler decides), its partitions still assigned here.
    pub fn take_task_failures(&mut self) -> Vec<TaskFailure> {
        std::mem::take(&mut self.failures)
    }

    /// The fetch pauses and resumes to make, in order, before the seeks
    /// ([`take_seeks`](Self::take_seeks)): a stopped task's partitions
    /// pause, and resume when it restarts.
    pub fn take_flow_changes(&mut self) -> Vec<FlowChange> {
        std::mem::take(&mut self.flow)
    }

    /// The task whose error the open transaction must be aborted for, if
    /// a task's error poisoned it (the abort stops that task).
    pub fn failing_task(&self) -> Option<&TaskId> {
        self.failing.as_ref().map(|f| &f.task)
    }

    /// The tasks stopped after a failure.
    pub fn stopped_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.stopped.keys()
    }

    /// Restarts a stopped task after one step of
    /// [`WorkerConfig::task_backoff`] (for its failures in a row), from its
    /// changelogs and committed positions; at once when the step is zero.
    /// Returns the wait, or `None` when the task is not stopped here (its
    /// partitions were revoked meanwhile).
    pub fn restart_task(
        &mut self,
        id: &TaskId,
        cluster: &dyn Cluster,
    ) -> Result<Option<Duration>, WorkerError> {
        let earlier = self
            .streaks
            .get(id)
            .map_or(0, |s| s.failures.saturating_sub(1));
        let wait = self.config.task_backoff.step(earlier);
        let now = self.now;
        let Some(stopped) = self.stopped.get_mut(id) else {
            return Ok(None);
        };
        stopped.restart_at = Some(now.saturating_add(ms(wait)));
        info!(task = %id, ?wait, "the stopped task restarts after its backoff");
        if wait.is_zero() {
            self.restart_due(cluster)?;
        }
        Ok(Some(wait))
    }

    /// How long from `now` until a stopped task is due to restart, if one
    /// is to. A host that waits for records waits no longer than this.
    pub fn restart_due_in(&self, now: i64) -> Option<Duration> {
        self.stopped
            .values()
            .filter_map(|s| s.restart_at)
            .min()
            .map(|at| Duration::from_millis(u64::try_from(at - now.max(self.now)).unwrap_or(0)))
    }

    /// Starts every stopped task whose restart is due.
    fn restart_due(&mut self, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        if !matches!(self.state, State::Open) {
            // A transaction in flight, or one to abort: the next
            // punctuation restarts it.
            return Ok(());
        }
        let now = self.now;
        let due: Vec<TaskId> = self
            .stopped
            .iter()
            .filter(|(_, s)| s.restart_at.is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.stopped.remove(&id);
            self.stats.task_restarts += 1;
            self.streaks.entry(id.clone()).or_default().restarted_at = Some(now);
            info!(task = %id, "stopped task restarting");
            self.restarting.insert(id.clone());
            // A deferred restore keeps them paused until it is done
            // (`restored` resumes them).
            let resume = self.config.restores == RestoreMode::Inline;
            for (topic, partition) in self.needed(&id).into_iter().filter(|_| resume) {
                self.flow.push(FlowChange {
                    topic,
                    partition,
                    paused: false,
                });
            }
            self.try_start(id.clone(), cluster)?;
            self.restarting.remove(&id);
        }
        Ok(())
    }

    /// The partitions a task consumes: partition `p` of every source and of
    /// the tick topic.
    fn needed(&self, id: &TaskId) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        if let Some(stage) = self.app.stage(&id.stage) {
            for t in stage.source_topics() {
                out.push((t.to_owned(), id.partition));
            }
        }
        if let Some(t) = self.app.tick_topic(&id.stage) {
            out.push((t.to_owned(), id.partition));
        }
        out
    }

    fn task_of(&self, topic: &str, partition: i32) -> Option<TaskId> {
        self.app.stages().iter().find_map(|s| {
            let consumes =
                s.source_topics().contains(&topic) || self.app.tick_topic(s.name()) == Some(topic);
            consumes.then(|| TaskId {
                stage: s.name().to_owned(),
                partition,
            })
        })
    }

    fn start_task(&mut self, id: &TaskId, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        let Some(names) = self.app.owned_names(&id.stage).cloned() else {
            return Err(WorkerError::UnknownPartition {
                application: self.app.application_id().to_owned(),
                topic: id.stage.clone(),
                partition: id.partition,
            });
        };
        let needed = self.needed(id);
        let tasks = match needed.first() {
            Some((t, _)) => {
                cluster
                    .describe(t)
                    .map_err(|source| TaskError::Metadata {
                        task: id.clone(),
                        cause: source,
                    })?
                    .partitions
            }
            None => 0,
        };
        let changelogs = Changelogs {
            state: &names.state_changelog,
            fold: names.fold_changelog.as_deref(),
            tasks,
        };
        let (prepared, job) = self.prepare(id, &changelogs, cluster)?;
        match self.config.restores {
            RestoreMode::Inline => {
                let RestoreOutcome {
                    result, unusable, ..
                } = job.run(cluster, cluster);
                self.complete_start(id, prepared, result?, unusable, cluster)
            }
            RestoreMode::Deferred => {
                // Nothing is fetched for the task until it runs.
                for (topic, partition) in self.needed(id) {
                    self.flow.push(FlowChange {
                        topic,
                        partition,
                        paused: true,
                    });
                }
                debug!(task = %id, job = job.id, from_local_store = job.from_local, "task restore queued");
                let restart = self.restarting.remove(id);
                self.restoring.insert(
                    id.clone(),
                    Restoring {
                        job: job.id,
                        prepared,
                        restart,
                    },
                );
                self.jobs.push(job);
                Ok(())
            }
        }
    }

    /// Starts a restored task: its node and fold state from the stores,
    /// its channels, and its start positions (the seeks).
    fn complete_start(
        &mut self,
        id: &TaskId,
        mut prepared: Prepared,
        restored: changelog::Restored,
        unusable: Option<WipeReason>,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        if let Some(reason) = unusable {
            // The job found the store's entries unusable and replayed the
            // whole changelog instead; the rewrite below replaces the file.
            self.stats.local_store_rebuilds += 1;
            warn!(task = %id, %reason, "the local store is wiped and rebuilt from the changelog");
            prepared.from_local = false;
        }
        let (mut stores, local) = self.finish_restore(id, prepared, restored)?;
        if let Some(diversions) = self.diversions.get_mut(id) {
            for d in diversions.values_mut() {
                d.partitions = cluster
                    .describe(&d.topic)
                    .map_err(|cause| TaskError::Metadata {
                        task: id.clone(),
                        cause,
                    })?
                    .partitions;
            }
            stores.diverted = diversions.clone();
        }
        // The start's own release keeps to the cap too.
        stores.release_cap = self.config.release_per_transaction;
        let started = Task::init(
            &self.app,
            &id.stage,
            id.partition,
            stores,
            cluster,
            cluster,
            self.now,
        );
        let mut task = match started {
            Ok(task) => task,
            Err(e) => {
                // It could not read back the held records it left in the
                // file: the next start rebuilds the file instead.
                wipe_unreadable(self.local.as_mut(), id, &e);
                return Err(e.into());
            }
        };
        task.set_record_events(self.config.events);
        task.set_hold_budget(self.config.hold_budget);
        task.set_hold_window(self.config.hold_window);
        if task.node().held_count() > 0 {
            self.stats.restored_with_held += 1;
            if task.stores().held.is_attached() {
                self.stats.restored_with_held_on_disk += 1;
            }
        }
        self.stats.tasks_started += 1;
        let mut channels = Vec::new();
        for input in task.inputs() {
            let key = (input.topic.clone(), input.channel.partition);
            let Some(assigned) = self.assigned.get(&key).cloned() else {
                return Err(WorkerError::NotAssigned {
                    topic: key.0,
                    partition: key.1,
                });
            };
            channels.push(ChannelSlot {
                topic: input.topic.clone(),
                partition: input.channel.partition,
                channel: input.channel,
                position: 0,
                committed: assigned.committed.unwrap_or(-1),
                pending: None,
                awaiting_seek: None,
                assigned,
            });
        }
        let shared = Arc::new(id.clone());
        for (i, c) in channels.iter().enumerate() {
            self.routes.insert(&c.topic, c.partition, &shared, i);
        }
        info!(task = %id, channels = channels.len(), "task started");
        let next_sweep_at = self.now.saturating_add(ms(self.config.truncation_interval));
        let meters = TaskMeters::new(&self.config.thread_id, &task);
        self.tasks.insert(
            id.clone(),
            Slot {
                task: Some(task),
                meters,
                channels,
                next_sweep_at,
                local,
                throttle: Throttle::default(),
            },
        );
        // A new task's init writes (its scope, at least) go into the next
        // transaction.
        self.begin_task(id, true)
    }

    /// Prepares a task's restore: reads its local store and checks it
    /// against the changelogs (wiping it, with a WARN that says why, when
    /// it cannot be used), and makes the replay job: from the store's
    /// checkpoint, or from the beginning.
    fn prepare(
        &mut self,
        id: &TaskId,
        changelogs: &Changelogs<'_>,
        cluster: &dyn Cluster,
    ) -> Result<(Prepared, RestoreJob), WorkerError> {
        let mut ids = BTreeMap::new();
        for topic in std::iter::once(changelogs.state).chain(changelogs.fold) {
            let d = cluster
                .describe(topic)
                .map_err(|cause| ChangelogError::Unavailable {
                    task: id.clone(),
                    topic: topic.to_owned(),
                    cause,
                })?;
            ids.insert(topic.to_owned(), d.id);
        }
        let identity = StoreIdentity {
            application: self.app.application_id().to_owned(),
            task: id.clone(),
            changelogs: ids,
        };
        // A stateful task whose fold state can read through its local
        // store starts without loading the store's fold entries.
        // Every task whose store can be read while it runs leaves its held
        // records there: they are read back as the gate reaches them.
        let held_on_disk = self.local.as_ref().is_some_and(|s| s.reads_while_running());
        let bounded = self.config.fold_cache.is_some() && changelogs.fold.is_some() && held_on_disk;
        let leave = local::LeaveOnDisk {
            fold: bounded,
            held: held_on_disk,
        };
        let opened = self
            .local
            .as_mut()
            .map(|store| store.open_leaving(id, leave));
        // Log starts only to check a store; ends for progress, always.
        let with_starts = matches!(opened, Some(Ok(Some(_))));
        let bounds = changelog_bounds(&identity, id.partition, cluster, with_starts).map_err(
            |(topic, message)| ChangelogError::Unavailable {
                task: id.clone(),
                topic: topic.clone(),
                cause: crate::runtime::task::MetadataError::Failed { topic, message },
            },
        )?;
        let mut local_off = self.local.is_none();
        let start = match (opened, self.local.as_mut()) {
            (Some(Ok(Some(snapshot))), Some(store)) => {
                let usable = local::check(
                    &snapshot,
                    &identity,
                    &bounds,
                    self.now,
                    ms(self.config.local_store_max_age),
                )
                .map(|()| snapshot);
                match usable {
                    Ok(snapshot) => Some(snapshot),
                    Err(reason) => {
                        self.stats.local_store_rebuilds += 1;
                        wipe(store.as_mut(), id, &reason);
                        None
                    }
                }
            }
            (Some(Err(e @ local::LocalStoreError::Io { .. })), _) => {
                // The disk refused (not a damaged store): leave the store
                // as it is, at its older checkpoint, and run this task
                // without it.
                warn!(task = %id, error = %e, "the local store cannot be opened; the task restores from its changelogs and runs without it");
                local_off = true;
                None
            }
            (Some(Err(e)), Some(store)) => {
                self.stats.local_store_rebuilds += 1;
                wipe(store.as_mut(), id, &WipeReason::Unreadable(e.to_string()));
                None
            }
            _ => None,
        };
        self.next_job += 1;
        // A bounded task's replay writes its fold state out in parts as it
        // goes, holding no more than the cache in memory.
        if let Some(total) = self.config.fold_cache {
            // This task's replay takes its share at once.
            let n = self.tasks.len() + self.restoring.len() + 1;
            self.fold_share.store(total / n, Ordering::Relaxed);
        }
        // A tail's parts leave the store's age as it was: they do not move
        // its checkpoint, so they must not make it look fresher either.
        let written_at = start
            .as_ref()
            .and_then(|s| s.written_at)
            .unwrap_or(self.now);
        let spill = match ((bounded || held_on_disk) && !local_off, self.local.as_mut()) {
            (true, Some(store)) => store.writer().map(|w| {
                changelog::FoldSpill::new(w, self.fold_share.clone(), written_at)
                    .with_parts(bounded, held_on_disk)
            }),
            _ => None,
        };
        let job = RestoreJob {
            spill,
            id: self.next_job,
            task: id.clone(),
            state: changelogs.state.to_owned(),
            fold: changelogs.fold.map(str::to_owned),
            tasks: changelogs.tasks,
            from_local: start.is_some(),
            start,
            bounds,
            listener: self.restore_listener.clone(),
            thread_id: self.config.thread_id.clone(),
        };
        let prepared = Prepared {
            identity,
            from_local: job.from_local,
            bounded: bounded && !local_off,
            held_on_disk: held_on_disk && !local_off,
            local_off,
        };
        Ok((prepared, job))
    }

    /// What a finished replay leaves: the stores, and the local store
    /// brought up to the changelog's end (rewritten whole after a rebuild).
    fn finish_restore(
        &mut self,
        id: &TaskId,
        prepared: Prepared,
        restored: changelog::Restored,
    ) -> Result<(crate::runtime::task::TaskStores, Local), TaskError> {
        let Prepared {
            identity,
            from_local,
            local_off,
            bounded,
            held_on_disk,
        } = prepared;
        self.stats.changelog_records_replayed += restored.replayed;
        if from_local {
            self.stats.local_store_starts += 1;
        }
        let Some(store) = self.local.as_mut().filter(|_| !local_off) else {
            info!(task = %id, replayed = restored.replayed, "task restored");
            return Ok((restored.stores, Local::Off));
        };
        let spilled = restored.spilled;
        if let Some(cause) = restored.spill_failed {
            // Part of the fold state went to a store that then failed:
            // neither holds it whole. Start again from the changelog.
            self.stats.local_store_write_failures += 1;
            let _ = store.wipe(id);
            return Err(TaskError::LocalStore {
                task: id.clone(),
                cause,
            });
        }
        let write = LocalWrite {
            identity: Some(identity.clone()),
            checkpoint: restored.next.clone(),
            replace: !from_local && !spilled,
            written_at: self.now,
            seq: 0,
            entries: if from_local {
                restored.tail
            } else {
                let mut entries = all_entries(&restored.stores);
                entries.extend(restored.pending);
                entries
            },
        };
        info!(
            task = %id,
            replayed = restored.replayed,
            from_local_store = from_local,
            fold_keys_in_memory = restored.stores.fold.len(),
            "task restored"
        );
        let mut stores = restored.stores;
        let written = store.write(id, write);
        // Once the write is in the store, the fold state can read through
        // it (the reader waits for the write).
        let reader = match &written {
            Ok(()) if bounded || held_on_disk => store.reader(id),
            _ => Ok(None),
        };
        // What the start left in the store is only there now.
        let needs_reader = (bounded || held_on_disk) && (from_local || spilled);
        match (written, reader) {
            (Ok(()), Ok(Some(reader))) => {
                if bounded {
                    stores
                        .fold
                        .attach(reader.clone(), self.fold_share.load(Ordering::Relaxed));
                }
                if held_on_disk {
                    let crate::runtime::task::TaskStores { held, protocol, .. } = &mut stores;
                    held.attach(reader, self.config.hold_window, protocol);
                }
                Ok((
                    stores,
                    Local::Writing {
                        identity,
                        checkpoint: restored.next,
                    },
                ))
            }
            (Ok(()), Ok(None)) if !needs_reader => Ok((
                stores,
                Local::Writing {
                    identity,
                    checkpoint: restored.next,
                },
            )),
            (Err(e), _) if !needs_reader => {
                self.stats.local_store_write_failures += 1;
                warn!(task = %id, error = %e, "the local store could not be written; the task runs without it, its whole fold state in memory, until it starts again");
                let _ = store.wipe(id);
                Ok((stores, Local::Stale))
            }
            (written, reader) => {
                // The store's fold entries were not loaded and cannot be
                // read: start again from the whole changelog.
                self.stats.local_store_write_failures += 1;
                let cause = match (written, reader) {
                    (Err(e), _) | (_, Err(e)) => e,
                    _ => local::LocalStoreError::Io {
                        task: id.clone(),
                        message: "the store gives no reader".to_owned(),
                    },
                };
                let _ = store.wipe(id);
                Err(TaskError::LocalStore {
                    task: id.clone(),
                    cause,
                })
            }
        }
    }

    /// The restore jobs queued since the last call
    /// ([`RestoreMode::Deferred`]), for the host to run.
    pub fn take_restore_jobs(&mut self) -> Vec<RestoreJob> {
        std::mem::take(&mut self.jobs)
    }

    /// Tasks whose restore job has not come back yet.
    pub fn restoring_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.restoring.keys()
    }

    /// Tasks of the assignment still restoring (not counting failed tasks
    /// restarting in place): while there are any, the thread is not ready.
    pub fn assignment_restoring(&self) -> impl Iterator<Item = &TaskId> {
        self.restoring
            .iter()
            .filter(|(_, r)| !r.restart)
            .map(|(id, _)| id)
    }

    /// A restore job's outcome: its task starts (its partitions resume and
    /// its seeks are queued). An outcome for a task that is no longer
    /// restoring here (revoked, fenced, restarted since) is ignored. A
    /// failed replay leaves the task waiting when it was a lookup (retried
    /// at the next punctuation), and fails the worker's open work
    /// otherwise, as a failed start does.
    pub fn restored(
        &mut self,
        outcome: RestoreOutcome,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        self.ready()?;
        let RestoreOutcome {
            job,
            task,
            result,
            unusable,
        } = outcome;
        if self.restoring.get(&task).map(|r| r.job) != Some(job) {
            debug!(task = %task, job, "a restore outcome for a task that is not restoring here; ignored");
            return Ok(());
        }
        let Some(pending) = self.restoring.remove(&task) else {
            return Ok(());
        };
        for (topic, partition) in self.needed(&task) {
            if self.assigned.contains_key(&(topic.clone(), partition)) {
                self.flow.push(FlowChange {
                    topic,
                    partition,
                    paused: false,
                });
            }
        }
        let r = result.map_err(WorkerError::from).and_then(|restored| {
            self.complete_start(&task, pending.prepared, restored, unusable, cluster)
        });
        match r {
            Ok(()) => Ok(()),
            Err(e) if transient(&e) => {
                warn!(task = %task, error = %e, "task restore failed on a lookup; retrying at the next punctuation");
                self.stats.task_start_retries += 1;
                self.waiting.insert(task);
                Ok(())
            }
            Err(e) => self.poison(e),
        }
    }

    /// The task left this worker: its local store is made durable and
    /// released (it stays on disk for the task's return).
    fn close_local(&mut self, id: &TaskId) {
        if let Some(store) = self.local.as_mut()
            && let Err(e) = store.close(id)
        {
            warn!(task = %id, error = %e, "the local store could not be closed");
        }
    }

    /// Chooses each channel's start, queues the seeks, and reports the
    /// starting positions to the task (the node does not persist what it
    /// was told about positions). Records are refused on each channel until
    /// the host confirms its seek.
    fn begin_task(&mut self, id: &TaskId, new_work: bool) -> Result<(), WorkerError> {
        let policy = self.config.start_policy;
        let on_loss = self.config.on_retention_loss;
        let Some(slot) = self.tasks.get_mut(id) else {
            return Ok(());
        };
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        let resume = task.resume_positions().clone();
        for c in &mut slot.channels {
            let a = &c.assigned;
            // Where the stage's own history says to go on, if it has one.
            let consumed = match (resume.get(&c.channel), c.committed) {
                (Some(&r), _) => Some(r),
                (None, committed) if committed >= 0 => Some(committed),
                _ => None,
            };
            let start = match consumed {
                Some(at) if at < a.log_start => {
                    retention_loss(on_loss, &mut self.stats, id, c, at, a.log_start)?
                }
                Some(at) => at,
                None => match (policy, a.end) {
                    (StartPolicy::Earliest, _) => a.log_start,
                    (StartPolicy::Latest, Some(end)) => end,
                    (StartPolicy::Latest, None) => {
                        return Err(WorkerError::EndUnknown {
                            task: id.clone(),
                            topic: c.topic.clone(),
                            partition: c.partition,
                        });
                    }
                },
            };
            // H6: never below the log start.
            let start = start.max(a.log_start);
            c.restart_at(start, &mut self.seeks);
            debug!(task = %id, topic = %c.topic, partition = c.partition, start, "channel starts");
        }
        for c in &slot.channels {
            task.position_advance(c.channel, c.position)?;
        }
        if new_work || task.has_work() {
            self.dirty = true;
        }
        Ok(())
    }

    /// The consumer stopped fetching a partition because its fetch offset
    /// is out of range (librdkafka's `auto.offset.reset=error`, which the
    /// Kafka runtime sets): retention or DeleteRecords removed records
    /// this thread had not read yet, or the log was truncated. The worker
    /// looks up the log start of every channel of its running tasks; each
    /// channel whose position lies below its log start has lost records,
    /// and [`WorkerConfig::on_retention_loss`] decides: fail with
    /// [`WorkerError::RetentionLoss`], or go on from the log start (a seek
    /// to ask for, the frontier moved past the loss). When no channel is
    /// below its log start the cause is unknown, and the worker fails with
    /// [`WorkerError::OffsetOutOfRange`] rather than guess.
    ///
    /// A channel below its log start whose records still sit in the
    /// consumer's buffer counts as lost too: what is below the log start
    /// is gone from the cluster, and a restart could not read it again.
    pub fn offset_out_of_range(&mut self, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        self.ready()?;
        let ids: BTreeSet<parsley_protocol::TopicId> = self
            .tasks
            .values()
            .flat_map(|s| s.channels.iter().map(|c| c.channel.topic))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let starts = match cluster.log_starts(&ids) {
            Ok(s) => s,
            // A failed lookup cannot tell a loss from anything else; the
            // consumer stays stopped on that partition, so fail loudly.
            Err(e) => return self.poison(WorkerError::LogStartUnknown(e.to_string())),
        };
        let on_loss = self.config.on_retention_loss;
        let mut lost = 0;
        for (id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            for c in &mut slot.channels {
                let log_start = match starts.get(&c.channel.topic) {
                    Some(parsley_protocol::TopicOffsets::Present(p)) => {
                        p.get(&c.partition).copied().unwrap_or(0)
                    }
                    _ => continue,
                };
                if c.position >= log_start {
                    continue;
                }
                lost += 1;
                let at = c.position;
                match retention_loss(on_loss, &mut self.stats, id, c, at, log_start) {
                    Ok(start) => {
                        c.restart_at(start, &mut self.seeks);
                        task.position_advance(c.channel, start)?;
                        self.dirty = true;
                    }
                    Err(e) => {
                        self.failing = Some(Failing {
                            task: id.clone(),
                            reason: e.to_string(),
                            refused: None,
                        });
                        self.state = State::MustAbort(e.to_string());
                        return Err(e);
                    }
                }
            }
        }
        if lost == 0 {
            return self.poison(WorkerError::OffsetOutOfRange);
        }
        Ok(())
    }

    /// The host made a seek the worker asked for: records of the partition
    /// are accepted again. Until then they are refused, so a host that
    /// forgot a seek fails at once instead of skipping records.
    pub fn seek_applied(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), WorkerError> {
        let Some((id, i)) = self.routes.get(topic, partition).cloned() else {
            return Ok(());
        };
        if let Some(slot) = self.tasks.get_mut(&*id) {
            let c = &mut slot.channels[i];
            if c.awaiting_seek == Some(offset) {
                c.awaiting_seek = None;
            }
        }
        Ok(())
    }

    /// What the host must do before revoking: commit open work, abort it
    /// when the assignment was lost, or nothing.
    pub fn revoke_plan(&self, lost: bool) -> RevokePlan {
        let failed = matches!(self.state, State::MustAbort(_));
        if failed || (lost && self.dirty) {
            RevokePlan::Abort
        } else if self.dirty {
            RevokePlan::Commit
        } else {
            RevokePlan::Nothing
        }
    }

    /// The group took these partitions away. The open work must have been
    /// committed or aborted first ([`revoke_plan`](Self::revoke_plan)).
    /// Every task owning one of them is closed; its committed state lives
    /// on in its changelogs.
    pub fn revoke(&mut self, partitions: &[(String, i32)]) -> Result<(), WorkerError> {
        self.ready()?;
        if self.dirty {
            return Err(WorkerError::OpenTransaction);
        }
        let mut closing = BTreeSet::new();
        self.seeks.retain(|k| {
            !partitions
                .iter()
                .any(|(t, p)| *t == k.topic && *p == k.partition)
        });
        self.flow.retain(|f| {
            !partitions
                .iter()
                .any(|(t, p)| *t == f.topic && *p == f.partition)
        });
        let mut touched = BTreeSet::new();
        for key in partitions {
            self.assigned.remove(key);
            if let Some((id, _)) = self.routes.get(&key.0, key.1) {
                closing.insert(TaskId::clone(id));
            }
            if let Some(id) = self.task_of(&key.0, key.1) {
                self.waiting.remove(&id);
                if self.restoring.remove(&id).is_some() {
                    info!(task = %id, "restoring task revoked");
                    self.jobs.retain(|j| j.task != id);
                }
                if self.stopped.remove(&id).is_some() {
                    info!(task = %id, "stopped task revoked");
                }
                self.diversions.remove(&id);
                touched.insert(id);
            }
        }
        for id in closing {
            if let Some(slot) = self.tasks.remove(&id) {
                self.close_local(&id);
                for c in &slot.channels {
                    self.routes.remove(&c.topic, c.partition);
                }
                let left: Vec<String> = slot
                    .channels
                    .iter()
                    .filter(|c| self.assigned.contains_key(&(c.topic.clone(), c.partition)))
                    .map(|c| format!("{}:{}", c.topic, c.partition))
                    .collect();
                info!(task = %id, "task revoked");
                if !left.is_empty() && self.config.assignment == Assignment::Complete {
                    let needed = slot
                        .channels
                        .iter()
                        .map(|c| format!("{}:{}", c.topic, c.partition))
                        .collect();
                    return self.poison(WorkerError::SplitTask {
                        task: id,
                        needed,
                        assigned: left,
                    });
                }
            }
        }
        // What is left of each touched task waits for the task to form
        // again (incremental assignment), or is gone.
        for id in touched {
            if self.tasks.contains_key(&id) {
                continue;
            }
            if self
                .needed(&id)
                .iter()
                .any(|k| self.assigned.contains_key(k))
            {
                self.hold_partial(&id);
            } else {
                self.partial.remove(&id);
            }
        }
        Ok(())
    }

    /// The task and channel of a partition; `None` for a partition assigned
    /// here whose task is waiting to start.
    fn route(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(Arc<TaskId>, usize)>, WorkerError> {
        if let Some(r) = self.routes.get(topic, partition) {
            return Ok(Some(r.clone()));
        }
        if self.assigned.contains_key(&(topic.to_owned(), partition)) {
            return Ok(None);
        }
        Err(WorkerError::NotAssigned {
            topic: topic.to_owned(),
            partition,
        })
    }

    /// One record a poll returned, handed to its task now.
    pub fn on_record(&mut self, record: PolledRecord) -> Result<(), WorkerError> {
        self.ready()?;
        let Some((id, i)) = self.route(&record.topic, record.partition)? else {
            self.stats.dropped_while_waiting += 1;
            return Ok(());
        };
        let Some(slot) = self.tasks.get_mut(&*id) else {
            return Err(WorkerError::NotAssigned {
                topic: record.topic,
                partition: record.partition,
            });
        };
        let c = &mut slot.channels[i];
        if let Some(offset) = c.awaiting_seek {
            let e = WorkerError::SeekNotApplied {
                topic: record.topic,
                partition: record.partition,
                offset,
            };
            return self.poison(e);
        }
        if record.offset < c.position {
            let e = WorkerError::OutOfOrder {
                topic: record.topic,
                partition: record.partition,
                offset: record.offset,
                expected: c.position,
            };
            return self.poison(e);
        }
        let channel = c.channel;
        c.position = record.offset + 1;
        let offset = record.offset;
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        task.observe_time(self.now);
        let r = task.on_record(FetchedRecord {
            channel,
            offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers: record.headers,
        });
        if let Err(e) = r {
            return self.fail_task(TaskId::clone(&id), e);
        }
        self.stats.add(slot.meters.count(task));
        self.dirty = true;
        let regulate = slot.throttle.engaged(task, self.config.hold_budget);
        // A position captured earlier may be covered now.
        let c = &mut slot.channels[i];
        if let Some((position, last)) = c.pending
            && last <= offset
        {
            c.pending = None;
            return self.apply_position(&id, i, position);
        }
        if regulate {
            self.regulate(&id);
        }
        Ok(())
    }

    /// The consumer's position on a partition after a poll, with the
    /// highest offset the polls have returned there (`None` if none).
    /// Passed to the task once every returned record up to that offset has
    /// been handed over; refused if it is behind what was handed over.
    pub fn on_position(
        &mut self,
        topic: &str,
        partition: i32,
        position: i64,
        last_returned: Option<i64>,
    ) -> Result<(), WorkerError> {
        self.ready()?;
        let Some((id, i)) = self.route(topic, partition)? else {
            return Ok(());
        };
        let Some(slot) = self.tasks.get_mut(&*id) else {
            return Ok(());
        };
        let c = &mut slot.channels[i];
        if let Some(offset) = c.awaiting_seek {
            let e = WorkerError::SeekNotApplied {
                topic: topic.to_owned(),
                partition,
                offset,
            };
            return self.poison(e);
        }
        if position < c.position {
            let e = WorkerError::PositionBehind {
                topic: topic.to_owned(),
                partition,
                position,
                consumed: c.position,
            };
            return self.poison(e);
        }
        if let Some(last) = last_returned
            && last >= c.position
        {
            // Records up to `last` were polled but not handed over yet: the
            // position would jump the frontier past them.
            c.pending = Some((position, last));
            self.stats.positions_deferred += 1;
            return Ok(());
        }
        self.apply_position(&id, i, position)
    }

    fn apply_position(&mut self, id: &TaskId, i: usize, position: i64) -> Result<(), WorkerError> {
        let Some(slot) = self.tasks.get_mut(id) else {
            return Ok(());
        };
        let c = &mut slot.channels[i];
        let advanced = position > c.position;
        c.position = c.position.max(position);
        let channel = c.channel;
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        task.observe_time(self.now);
        let r = task.position_advance(channel, position);
        self.stats.add(slot.meters.count(task));
        if let Err(e) = r {
            return self.fail_task(id.clone(), e);
        }
        if advanced || task.has_work() {
            self.dirty = true;
        }
        if slot.throttle.engaged(task, self.config.hold_budget) {
            self.regulate(id);
        }
        Ok(())
    }

    /// Backpressure for one running task: pauses or resumes fetching on
    /// its partitions by what it holds against the budget (see the [module
    /// documentation](self)).
    fn regulate(&mut self, id: &TaskId) {
        let Some(budget) = self.config.hold_budget else {
            return;
        };
        let Some(slot) = self.tasks.get_mut(id) else {
            return;
        };
        let Some(task) = slot.task.as_mut() else {
            return;
        };
        if !slot.throttle.engaged(task, Some(budget)) {
            return;
        }
        let held = task.node().held_bytes();
        let throttle = &mut slot.throttle;
        let arrivals = task.take_arrival_claims();
        let node = task.node();
        let same_heads = node.head_offsets().eq(throttle.heads.iter().copied());
        let relieved = held <= budget / 2;
        let over = held > budget;
        if same_heads && arrivals.is_empty() && !relieved && over == throttle.over {
            // Nothing to change: the same heads are held (their claims can
            // only have been met since), no arriving record claimed a
            // paused partition, and the holds are on the same side of the
            // budget.
            return;
        }
        throttle.over = over;
        throttle.heads.clear();
        throttle.heads.extend(node.head_offsets());
        let heads: BTreeMap<Channel, i64> = throttle.heads.iter().copied().collect();
        for c in arrivals {
            if let Some(&head) = heads.get(&c) {
                throttle.exempt.insert(c, head);
            }
        }
        // An exemption lasts while the head it was made under is held.
        throttle.exempt.retain(|c, head| heads.get(c) == Some(head));
        let holding: BTreeSet<Channel> = heads.keys().copied().collect();
        let mut claimed = node.claimed_by_heads();
        claimed.extend(throttle.exempt.keys().copied());
        let mut resumed = Vec::new();
        for &i in &throttle.paused {
            let c = slot.channels[i].channel;
            let why = if !holding.contains(&c) {
                &mut self.stats.hold_resumes_drained
            } else if claimed.contains(&c) {
                &mut self.stats.hold_resumes_claimed
            } else if relieved {
                &mut self.stats.hold_resumes_relieved
            } else {
                continue;
            };
            *why += 1;
            resumed.push(i);
        }
        for i in resumed {
            throttle.paused.remove(&i);
            let c = &slot.channels[i];
            debug!(task = %id, topic = %c.topic, partition = c.partition, held, budget, "fetching resumed");
            self.flow.push(FlowChange {
                topic: c.topic.clone(),
                partition: c.partition,
                paused: false,
            });
        }
        let mut paused = 0;
        for (i, c) in slot.channels.iter().enumerate() {
            if !over || !holding.contains(&c.channel) {
                continue;
            }
            if claimed.contains(&c.channel) {
                if !throttle.paused.contains(&i) {
                    self.stats.hold_pauses_withheld += 1;
                }
                continue;
            }
            if throttle.paused.insert(i) {
                paused += 1;
                debug!(task = %id, topic = %c.topic, partition = c.partition, held, budget, "holds passed the budget; fetching paused");
                self.flow.push(FlowChange {
                    topic: c.topic.clone(),
                    partition: c.partition,
                    paused: true,
                });
            }
        }
        if paused > 0 {
            self.stats.hold_pauses += paused as u64;
            slot.meters.paused(paused);
        }
        task.watch(throttle.paused.iter().map(|&i| slot.channels[i].channel));
    }

    /// The wall clock: ticks and hold warnings in every task, and the
    /// truncation sweep of every task whose interval has passed.
    pub fn punctuate(&mut self, now: i64, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        self.ready()?;
        self.now = self.now.max(now);
        let now = self.now;
        for id in std::mem::take(&mut self.waiting) {
            self.try_start(id, cluster)?;
        }
        self.restart_due(cluster)?;
        self.resume_releases()?;
        let interval = ms(self.config.truncation_interval);
        let mut failed = None;
        for (id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let r = task.punctuate(now);
            // What a lagging file took in since the last commit (held
            // records, fold entries over the cache) leaves memory now, not
            // at the next commit: an idle task lets go too.
            task.evict_local();
            self.stats.add(slot.meters.count(task));
            if let Err(e) = r {
                failed = Some((id.clone(), e));
                break;
            }
            if task.has_work() {
                self.dirty = true;
            }
            if now >= slot.next_sweep_at {
                slot.next_sweep_at = now.saturating_add(interval);
                match task.sweep(cluster) {
                    Ok(report) => {
                        self.stats.sweeps += 1;
                        self.stats.truncated_entries += report.entries_removed as u64;
                        if report.entries_removed > 0 {
                            self.dirty = true;
                        }
                    }
                    Err(e) => {
                        self.stats.truncation_sweeps_skipped += 1;
                        slot.meters.sweep_skipped();
                        warn!(task = %id, error = %e, "truncation sweep skipped; it runs again next interval");
                    }
                }
            }
        }
        if let Some((id, e)) = failed {
            return self.fail_task(id, e);
        }
        if now >= self.next_sample_at {
            self.next_sample_at = now.saturating_add(ms(SAMPLE_INTERVAL));
            self.sample();
        }
        Ok(())
    }

    /// Samples every task's gauges now and publishes them with every held
    /// head ([`published`](Self::published)). [`punctuate`](Self::punctuate)
    /// does this every [`SAMPLE_INTERVAL`]; a host (or a test) that wants a
    /// fresh reading can call it any time.
    pub fn sample(&mut self) -> &Published {
        let now = self.now;
        let mut metrics = Vec::with_capacity(self.tasks.len());
        let mut holds = Vec::new();
        for slot in self.tasks.values_mut() {
            let Some(task) = slot.task.as_ref() else {
                continue;
            };
            metrics.push(slot.meters.sample(
                now,
                task,
                slot.throttle.paused.len(),
                self.config.hold_budget.unwrap_or(0),
            ));
            holds.extend(task.held());
        }
        crate::holds::sort_longest_first(&mut holds);
        self.published = Published {
            at: now,
            metrics,
            holds,
        };
        &self.published
    }

    /// The last sample: every task's metrics and every held head, longest
    /// held first (`explain_holds`). It lists only tasks this worker runs.
    pub fn published(&self) -> &Published {
        &self.published
    }

    /// The open transaction, once it has been open for the commit interval
    /// (and holds anything).
    pub fn poll_transaction(&mut self, now: i64) -> Result<Option<Transaction>, WorkerError> {
        self.ready()?;
        self.now = self.now.max(now);
        if self.commit_due_in(self.now) == Some(Duration::ZERO) {
            self.take_transaction().map(Some)
        } else {
            Ok(None)
        }
    }

    /// How long from `now` (the host's clock) until
    /// [`poll_transaction`](Self::poll_transaction) hands a transaction
    /// over: zero when one is due, `None` while no work is open. A host
    /// that waits for records waits no longer than this, so a due commit
    /// is not held back by an idle poll.
    ///
    /// The interval runs from the previous hand-over, so a steady stream
    /// commits every interval (a record waits half of one on average) and
    /// a record after a quiet spell longer than the interval commits at
    /// once; either way there is at most one transaction per interval.
    pub fn commit_due_in(&self, now: i64) -> Option<Duration> {
        if !self.dirty {
            return None;
        }
        // A release waiting for this transaction to go out: at once.
        if self.releases_waiting() {
            return Some(Duration::ZERO);
        }
        let Some(last) = self.last_handed else {
            return Some(Duration::ZERO);
        };
        let due = last.saturating_add(ms(self.config.commit_interval));
        Some(Duration::from_millis(
            u64::try_from(due.saturating_sub(now.max(self.now))).unwrap_or(0),
        ))
    }

    /// Whether a task's release stopped at
    /// [`WorkerConfig::release_per_transaction`] and waits for the open
    /// transaction to be handed over.
    pub fn releases_waiting(&self) -> bool {
        self.config.release_per_transaction.is_some()
            && self
                .tasks
                .values()
                .any(|s| s.task.as_ref().is_some_and(Task::release_waiting))
    }

    /// `Some(ZERO)` when a release that stopped at the cap can go on now
    /// (the transaction it filled was handed over): the host punctuates
    /// without waiting, as it does for a due restart.
    pub fn release_due_in(&self) -> Option<Duration> {
        let resumable = matches!(self.state, State::Open)
            && self.config.release_per_transaction.is_some()
            && self
                .tasks
                .values()
                .any(|s| s.task.as_ref().is_some_and(Task::release_resumable));
        resumable.then_some(Duration::ZERO)
    }

    /// Goes on with the releases that stopped at the cap (after the
    /// transaction they filled was handed over).
    fn resume_releases(&mut self) -> Result<(), WorkerError> {
        if self.config.release_per_transaction.is_none() {
            return Ok(());
        }
        let ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, s)| s.task.as_ref().is_some_and(Task::release_resumable))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(slot) = self.tasks.get_mut(&id) else {
                continue;
            };
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let r = task.resume_release();
            self.stats.add(slot.meters.count(task));
            match r {
                Err(e) => return self.fail_task(id, e),
                Ok(true) => self.stats.releases_resumed += 1,
                Ok(false) => continue,
            }
            if task.has_work() {
                self.dirty = true;
            }
            let regulate = slot.throttle.engaged(task, self.config.hold_budget);
            if regulate {
                self.regulate(&id);
            }
        }
        Ok(())
    }

    /// The open transaction now, whatever its age (before a revocation or a
    /// shutdown); `None` when nothing is open.
    pub fn flush(&mut self) -> Result<Option<Transaction>, WorkerError> {
        self.ready()?;
        if !self.dirty {
            return Ok(None);
        }
        self.take_transaction().map(Some)
    }

    /// Splits the fold cache evenly over the tasks whose fold state reads
    /// through it (their number changes as tasks start and leave).
    fn share_fold_cache(&mut self) {
        let Some(total) = self.config.fold_cache else {
            return;
        };
        let bounded = |slot: &Slot| {
            slot.task
                .as_ref()
                .is_some_and(|t| t.stores().fold.is_bounded())
        };
        // Tasks restoring count too: their replays hold fold state as well.
        let n = self.tasks.values().filter(|s| bounded(s)).count() + self.restoring.len();
        let Some(share) = total.checked_div(n) else {
            return;
        };
        self.fold_share.store(share, Ordering::Relaxed);
        for slot in self.tasks.values_mut() {
            if let Some(task) = slot.task.as_mut() {
                task.set_fold_budget(share);
            }
        }
    }

    fn take_transaction(&mut self) -> Result<Transaction, WorkerError> {
        let id = self.next_txn;
        self.owners.clear();
        self.spans.clear();
        self.reached.clear();
        self.commit_retries = 0;
        let mut txn = Transaction {
            id,
            ..Transaction::default()
        };
        self.share_fold_cache();
        let mut failed = None;
        for (task_id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            if let Local::Lost(reason) = &slot.local {
                // Its fold state beyond the cache is gone with the store.
                failed = Some((
                    task_id.clone(),
                    TaskError::LocalStore {
                        task: task_id.clone(),
                        cause: local::LocalStoreError::Io {
                            task: task_id.clone(),
                            message: reason.clone(),
                        },
                    },
                ));
                break;
            }
            match task.take_commit() {
                Ok(commit) => {
                    // The first task's records move over whole (no copy of
                    // a transaction's worth of records on one task).
                    if txn.records.is_empty() {
                        txn.records = commit.records;
                    } else {
                        txn.records.extend(commit.records);
                    }
                    let mut run: Option<Span> = None;
                    for (at, r) in (txn.records.len()..).zip(&commit.changelog) {
                        match &mut run {
                            Some(span) if span.topic == r.topic => span.end = at + 1,
                            _ => {
                                self.spans.extend(run.take());
                                run = Some(Span {
                                    task: task_id.clone(),
                                    topic: r.topic.clone(),
                                    end: at + 1,
                                });
                            }
                        }
                    }
                    self.spans.extend(run);
                    txn.records.extend(commit.changelog);
                    self.owners.push((txn.records.len(), task_id.clone()));
                    txn.events
                        .extend(commit.events.into_iter().map(|event| WorkerEvent {
                            task: task_id.clone(),
                            event,
                        }));
                }
                Err(e) => {
                    failed = Some((task_id.clone(), e));
                    break;
                }
            }
            // Every channel's position, moved or not: the offset commit is
            // what carries the group generation, so it is what fences a
            // zombie (EOS v2), even for a transaction of ticks alone.
            for c in &slot.channels {
                {
                    txn.offsets.push(ConsumedOffset {
                        topic: c.topic.clone(),
                        partition: c.partition,
                        offset: c.position,
                    });
                }
            }
        }
        if let Some((id, e)) = failed {
            return self.fail_task(id, e);
        }
        self.next_txn += 1;
        self.state = State::InFlight;
        self.last_handed = Some(self.now);
        Ok(txn)
    }

    /// How the transaction handed over last ended.
    pub fn commit_outcome(
        &mut self,
        outcome: CommitOutcome,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        if !matches!(self.state, State::InFlight) {
            return Err(WorkerError::NoTransaction);
        }
        match outcome {
            CommitOutcome::Committed => {
                let written: BTreeSet<&TaskId> = self.spans.iter().map(|s| &s.task).collect();
                for (id, slot) in &mut self.tasks {
                    if let Some(task) = slot.task.as_mut() {
                        match (&mut self.local, &mut slot.local) {
                            (Some(store), Local::Writing { .. }) if written.contains(id) => {
                                let mut entries = Vec::new();
                                task.commit_done_into(Some(&mut entries));
                                let seq = task.stores().local_seq();
                                let reached = self.reached.remove(id);
                                if write_committed(
                                    store.as_mut(),
                                    self.now,
                                    id,
                                    slot,
                                    (entries, seq),
                                    reached,
                                ) {
                                    // A store that applied the write at once
                                    // lets this commit's entries go now.
                                    if let Some(task) = slot.task.as_mut() {
                                        task.evict_local();
                                    }
                                } else {
                                    self.stats.local_store_write_failures += 1;
                                }
                            }
                            _ => task.commit_done(),
                        }
                    }
                    for c in &mut slot.channels {
                        c.committed = c.position;
                        // A task that restarts later (after a failed reset)
                        // starts from here, not from the assignment's offset.
                        if let Some(a) = self.assigned.get_mut(&(c.topic.clone(), c.partition)) {
                            a.committed = Some(c.position);
                        }
                    }
                }
                self.stats.commits += 1;
                self.state = State::Open;
                self.dirty = false;
                self.spans.clear();
                self.reached.clear();
                self.prune_diversions();
                Ok(())
            }
            CommitOutcome::Aborted => {
                self.state = State::Open;
                self.rollback(cluster).map(|_| ())
            }
            CommitOutcome::Fenced | CommitOutcome::Unknown => {
                self.fenced();
                Ok(())
            }
        }
    }

    /// A failure the host's client reported, by class; the answer is what
    /// the host does next:
    ///
    /// | fault | what the worker does | directive |
    /// |-------|----------------------|-----------|
    /// | [`Fault::Fenced`], [`Fault::AbortFailed`] | drops every task | [`Directive::Rejoin`] |
    /// | [`Fault::Fatal`] | drops every task | [`Directive::Fail`] (the error handler decides) |
    /// | [`Fault::Abortable`] | nothing yet | [`Directive::Abort`]; report the abort as usual |
    /// | [`Fault::Retriable`] in a commit | counts the retry | [`Directive::Retry`], up to [`WorkerConfig::commit_retries`] times; then the commit's fate is unknown: drops every task, [`Directive::Rejoin`] |
    /// | [`Fault::RecordRefused`] | marks the task that made the record | [`Directive::Abort`]; the abort stops that task, and its [`TaskFailure::refused`] names the record |
    /// | [`Fault::Poll`], not fatal | nothing (the client retries) | [`Directive::Continue`] |
    /// | [`Fault::Poll`], fatal | drops every task | [`Directive::Fail`] |
    pub fn on_fault(&mut self, fault: Fault) -> Directive {
        self.stats.faults += 1;
        let class = fault.class();
        match fault {
            Fault::Poll {
                fatal: false,
                message,
            } => {
                warn!(class, error = %message, "consumer error; the client retries it");
                Directive::Continue
            }
            Fault::Fenced(message) | Fault::AbortFailed(message) => {
                warn!(class, error = %message, "another owner has the tasks now; rejoining");
                self.fenced();
                Directive::Rejoin
            }
            Fault::Fatal(message)
            | Fault::Poll {
                fatal: true,
                message,
            } => {
                self.fenced();
                Directive::Fail(Box::new(WorkerError::Client { class, message }))
            }
            Fault::Abortable(message) => {
                debug!(class, error = %message, "the transaction aborts");
                Directive::Abort
            }
            Fault::Retriable(message) => {
                let in_flight = matches!(self.state, State::InFlight);
                if in_flight && self.commit_retries < self.config.commit_retries {
                    let after = COMMIT_RETRY.saturating_mul(1 << self.commit_retries.min(16));
                    self.commit_retries += 1;
                    self.stats.commit_retries += 1;
                    warn!(class, error = %message, attempt = self.commit_retries, ?after, "a commit step failed in a way that may pass on a retry; retrying it");
                    Directive::Retry { after }
                } else {
                    warn!(class, error = %message, "the commit's fate is unknown after its retries; dropping every task and rejoining");
                    self.fenced();
                    Directive::Rejoin
                }
            }
            Fault::RecordRefused {
                record,
                topic,
                partition,
                origin,
                reason,
            } => {
                let owner = self
                    .owners
                    .iter()
                    .find(|(end, _)| record < *end)
                    .map(|(_, id)| id.clone());
                let Some(task) = owner else {
                    // Not a record of the transaction in flight: nothing to
                    // pin it on, so nothing is safe to keep.
                    self.fenced();
                    return Directive::Fail(Box::new(WorkerError::Client {
                        class,
                        message: format!(
                            "record {record} for {topic}:{partition} was refused ({reason}), but the transaction in flight has no such record"
                        ),
                    }));
                };
                let diverted = origin.is_some_and(|o| {
                    self.diversions
                        .get(&task)
                        .is_some_and(|d| d.contains_key(&o))
                });
                let why = if diverted {
                    format!(
                        "the dead-letter topic {topic:?} refused the emission sent there instead of its sink: {reason}"
                    )
                } else {
                    format!("a record for {topic}:{partition} could not be produced: {reason}")
                };
                self.failing = Some(Failing {
                    task,
                    reason: why,
                    // A dead-letter record refused in turn is not sent
                    // anywhere else: the task fails.
                    refused: (!diverted).then_some(RefusedRecord {
                        topic,
                        partition,
                        reason,
                        origin,
                    }),
                });
                Directive::Abort
            }
        }
    }

    /// After a refused record stopped its task ([`TaskFailure::refused`]),
    /// sends that emission to `topic`, a dead-letter topic, instead of its
    /// sink, and restarts the task at once (no backoff: this is a fix, not
    /// a retry). The emission goes there unstamped, with its own headers
    /// and the `parsley.dlq.*` headers naming the delivery that made it,
    /// the sink and the reason. Returns false when the task is not stopped
    /// here (revoked meanwhile).
    pub fn divert(
        &mut self,
        task: &TaskId,
        refused: &RefusedRecord,
        topic: &str,
        cluster: &dyn Cluster,
    ) -> Result<bool, WorkerError> {
        let Some(origin) = refused.origin else {
            return Err(WorkerError::NotAnEmission {
                task: task.clone(),
                topic: refused.topic.clone(),
                reason: refused.reason.clone(),
            });
        };
        if !self.stopped.contains_key(task) {
            return Ok(false);
        }
        // The topic's partition count is looked up when the task starts,
        // where a failed lookup is retried.
        self.diversions.entry(task.clone()).or_default().insert(
            origin,
            Diversion {
                topic: topic.to_owned(),
                partitions: 0,
                reason: refused.reason.clone(),
            },
        );
        if let Some(s) = self.stopped.get_mut(task) {
            s.restart_at = Some(self.now);
        }
        self.restart_due(cluster)?;
        Ok(true)
    }

    /// Drops the diversions whose delivery is committed (it will not be
    /// handled again).
    fn prune_diversions(&mut self) {
        let tasks = &self.tasks;
        self.diversions.retain(|id, d| {
            let Some(slot) = tasks.get(id) else {
                // Stopped (or waiting): kept for its restart.
                return true;
            };
            d.retain(|o, _| {
                slot.channels
                    .iter()
                    .find(|c| c.channel == o.channel)
                    .is_none_or(|c| o.offset >= c.committed)
            });
            !d.is_empty()
        });
    }

    /// Drops every task and the whole assignment: the producer or the group
    /// membership was fenced (also outside a commit), or a commit's fate is
    /// unknown. The host rejoins the group; nothing here is committed.
    pub fn fenced(&mut self) {
        self.stats.fenced += 1;
        warn!("fenced or commit fate unknown: dropping every task; rejoin the group");
        let ids: Vec<TaskId> = self.tasks.keys().cloned().collect();
        for id in &ids {
            self.close_local(id);
        }
        self.tasks.clear();
        self.spans.clear();
        self.reached.clear();
        self.restoring.clear();
        self.jobs.clear();
        self.waiting.clear();
        self.failing = None;
        self.stopped.clear();
        self.partial.clear();
        self.flow.clear();
        self.diversions.clear();
        self.owners.clear();
        self.routes = Routes::default();
        self.assigned.clear();
        self.seeks.clear();
        self.state = State::Open;
        self.dirty = false;
    }

    /// The host aborted the open transaction (a task failed, or the
    /// assignment was lost). Every task returns to its committed state and
    /// every channel is sought back to its committed position. Returns the
    /// records the open transaction had produced so far, which a host that
    /// streams records into the open transaction has seen aborted.
    pub fn abort(&mut self, cluster: &dyn Cluster) -> Result<Vec<OutgoingRecord>, WorkerError> {
        if matches!(self.state, State::InFlight) {
            return Err(WorkerError::CommitInFlight);
        }
        self.state = State::Open;
        self.rollback(cluster)
    }

    fn rollback(&mut self, cluster: &dyn Cluster) -> Result<Vec<OutgoingRecord>, WorkerError> {
        self.stats.aborts += 1;
        self.dirty = false;
        self.seeks.clear();
        let mut abandoned = Vec::new();
        if let Some(failing) = self.failing.take()
            && let Some(mut slot) = self.tasks.remove(&failing.task)
        {
            if let Some(old) = slot.task.as_mut() {
                abandoned.extend(old.take_abandoned());
            }
            self.stop_task(slot, failing);
        }
        let ids: Vec<TaskId> = self.tasks.keys().cloned().collect();
        let mut failed = None;
        for id in &ids {
            let Some(slot) = self.tasks.get_mut(id) else {
                continue;
            };
            let Some(mut old) = slot.task.take() else {
                continue;
            };
            abandoned.extend(old.take_abandoned());
            for c in &mut slot.channels {
                c.position = c.committed;
                c.pending = None;
            }
            self.stats.add(slot.meters.count(&old));
            slot.meters.rebase();
            match old.reset(cluster, cluster, self.now) {
                Ok(mut task) => {
                    if task.node().held_count() > 0 && task.stores().held.is_attached() {
                        self.stats.resets_with_held_on_disk += 1;
                    }
                    // The rebuilt task keeps its hold window itself.
                    task.set_hold_budget(self.config.hold_budget);
                    slot.task = Some(task);
                    // What it holds starts again from the committed state.
                    let paused = std::mem::take(&mut slot.throttle.paused);
                    slot.throttle = Throttle::default();
                    for i in paused {
                        let c = &slot.channels[i];
                        self.flow.push(FlowChange {
                            topic: c.topic.clone(),
                            partition: c.partition,
                            paused: false,
                        });
                    }
                }
                Err(e) => {
                    // The committed state is in the changelogs: the task
                    // restarts from there, now or at the next punctuation.
                    warn!(task = %id, error = %e, "task reset failed; it restarts from its changelogs");
                    // A store that cannot read back what it holds would
                    // fail the restart too: it is rebuilt.
                    wipe_unreadable(self.local.as_mut(), id, &e);
                    if let Some(slot) = self.tasks.remove(id) {
                        for c in &slot.channels {
                            self.routes.remove(&c.topic, c.partition);
                        }
                        // Its next start fetches them again.
                        for &i in &slot.throttle.paused {
                            let c = &slot.channels[i];
                            self.flow.push(FlowChange {
                                topic: c.topic.clone(),
                                partition: c.partition,
                                paused: false,
                            });
                        }
                    }
                    if transient_task(&e) {
                        self.waiting.insert(id.clone());
                    } else {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        for id in &ids {
            if !self.tasks.contains_key(id) {
                continue;
            }
            if let Err(e) = self.begin_task(id, false) {
                failed.get_or_insert(match e {
                    WorkerError::Task(t) => t,
                    other => return self.poison(other),
                });
            }
        }
        if let Some(e) = failed {
            return self.poison(e);
        }
        debug!(
            tasks = ids.len(),
            "transaction aborted; tasks back at their committed state"
        );
        Ok(abandoned)
    }
}

/// Whether a failure is a lookup that may succeed on a retry (a broker
/// offset query, or a metadata or changelog read that failed rather than
/// found the topic missing).
fn transient(e: &WorkerError) -> bool {
    use crate::runtime::task::MetadataError;
    match e {
        WorkerError::Task(t) => transient_task(t),
        WorkerError::Changelog(ChangelogError::Unavailable {
            cause: MetadataError::Failed { .. },
            ..
        }) => true,
        _ => false,
    }
}

fn transient_task(e: &TaskError) -> bool {
    use crate::runtime::task::MetadataError;
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

/// Each changelog's (log start, end) for the task's partition: one lookup
/// of each kind for all of the task's changelogs (the log starts only when
/// `with_starts`; else they read as 0). The error names the topic
/// and what the lookup said.
fn changelog_bounds(
    identity: &StoreIdentity,
    partition: i32,
    cluster: &dyn Cluster,
    with_starts: bool,
) -> Result<BTreeMap<String, (i64, i64)>, (String, String)> {
    let ids: BTreeSet<parsley_protocol::TopicId> = identity.changelogs.values().copied().collect();
    let first = identity
        .changelogs
        .keys()
        .next()
        .cloned()
        .unwrap_or_default();
    let starts = if with_starts {
        cluster
            .log_starts(&ids)
            .map_err(|e| (first.clone(), e.to_string()))?
    } else {
        // Not looked up: every partition's start reads as 0.
        ids.iter()
            .map(|&id| {
                (
                    id,
                    parsley_protocol::TopicOffsets::Present(
                        (0..=partition).map(|p| (p, 0)).collect(),
                    ),
                )
            })
            .collect()
    };
    let ends = cluster
        .end_offsets(&ids)
        .map_err(|e| (first.clone(), e.to_string()))?;
    let mut out = BTreeMap::new();
    for (topic, tid) in &identity.changelogs {
        let at = |answers: &BTreeMap<parsley_protocol::TopicId, parsley_protocol::TopicOffsets>| {
            match answers.get(tid) {
                Some(parsley_protocol::TopicOffsets::Present(by_partition)) => {
                    by_partition.get(&partition).copied()
                }
                _ => None,
            }
        };
        match (at(&starts), at(&ends)) {
            (Some(start), Some(end)) => {
                out.insert(topic.clone(), (start, end));
            }
            _ => {
                return Err((
                    topic.clone(),
                    format!("no offsets for partition {partition}"),
                ));
            }
        }
    }
    Ok(out)
}

/// Every entry of both stores, as puts (a rebuild's write).
fn all_entries(
    stores: &crate::runtime::task::TaskStores,
) -> Vec<crate::runtime::local::LocalEntry> {
    let mut out = Vec::with_capacity(stores.protocol.len() + stores.fold.len());
    for (key, value) in stores.protocol.iter() {
        out.push((StoreKind::Protocol, key.into_bytes(), Some(value.to_vec())));
    }
    for (key, value) in stores.fold.iter() {
        out.push((StoreKind::Fold, key.to_vec(), Some(value.to_vec())));
    }
    out
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

/// Writes one committed transaction's writes of a task to its local store,
/// with the checkpoint they reach. Without a checkpoint (the host did not
/// report the offsets), or when the write fails, the store is wiped and the
/// task writes no more to it. Returns false then.
fn write_committed(
    store: &mut dyn LocalStore,
    now: i64,
    id: &TaskId,
    slot: &mut Slot,
    (entries, seq): (Vec<crate::runtime::local::LocalEntry>, u64),
    reached: Option<BTreeMap<String, i64>>,
) -> bool {
    let Local::Writing {
        identity,
        checkpoint,
    } = &mut slot.local
    else {
        return true;
    };
    let failure = match reached {
        None => "the commit's changelog offsets were not reported".to_owned(),
        Some(reached) => {
            let mut next = checkpoint.clone();
            next.extend(reached);
            let write = LocalWrite {
                identity: Some(identity.clone()),
                checkpoint: next.clone(),
                replace: false,
                written_at: now,
                entries,
                seq,
            };
            match store.write(id, write) {
                Ok(()) => {
                    *checkpoint = next;
                    return true;
                }
                Err(e) => e.to_string(),
            }
        }
    };
    warn!(task = %id, reason = %failure, "the local store missed a commit: it is wiped, and rebuilt when the task starts again");
    if let Err(e) = store.wipe(id) {
        warn!(task = %id, error = %e, "the local store could not be wiped");
    }
    let bounded = slot
        .task
        .as_ref()
        .is_some_and(|t| t.stores().reads_through_local());
    if !bounded && let Some(task) = slot.task.as_mut() {
        // Every held record is still in memory: keep them there.
        task.detach_held();
    }
    slot.local = if bounded {
        Local::Lost(failure)
    } else {
        Local::Stale
    };
    false
}
