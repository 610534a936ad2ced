//! [`Worker`]: the host core. One per stream thread (one consumer and one
//! transactional producer); it owns the tasks assigned to that thread and
//! makes every decision a host makes. The thing around it only moves bytes.
//!
//! Like raft-rs's `RawNode`, it takes calls that say what happened
//! ([`assign`](Worker::assign), [`revoke`](Worker::revoke),
//! [`on_record`](Worker::on_record), [`on_position`](Worker::on_position),
//! [`punctuate`](Worker::punctuate), [`on_fault`](Worker::on_fault)) and
//! hands back everything the host must do in one [`Ready`]; the host acts
//! on it through [`act_on`] and acknowledges through
//! [`advance`](Worker::advance). [`next_wake`](Worker::next_wake) is the
//! one deadline a host waits for.
//!
//! The design (where channels start, position capture, the transaction
//! over every task, aborts, backpressure on held heads, the held window,
//! failures that stay at one task) is written up in `docs/decisions.md`,
//! "The host core". Tasks, channels and writes are kept in ordered maps:
//! the same calls give the same transactions, byte for byte.

mod assign;
mod commit;
mod config;
mod door;
mod faults;
mod in_flight;
mod queries;
mod records;
mod restores;
mod start;
mod stats;
mod stops;

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

pub use config::*;
pub use door::{
    Ack, CommitOutcome, ConsumedOffset, Host, Ready, RevokePlan, Transaction, WorkerEvent, act_on,
};
pub use stats::WorkerStats;

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
    fn restart_at(&mut self, offset: i64, out: &mut door::Outbox) {
        self.position = offset;
        self.pending = None;
        self.awaiting_seek = Some(offset);
        out.seek(Seek {
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
    /// The task whose error poisoned the open transaction, if a task's did.
    failing: Option<Failing>,
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
    routes: Routes,
    state: State,
    /// When the last transaction was handed over, by the host's clock.
    last_handed: Option<i64>,
    /// The host's fetch was drained when it last said
    /// ([`Worker::fetch_drained`]); a record handed over since clears it.
    drained: bool,
    /// Where [`WorkerConfig::commit_when_idle`]'s floor counts from.
    idle_floor: commit::IdleFloor,
    dirty: bool,
    now: i64,
    next_txn: u64,
    stats: WorkerStats,
    next_sample_at: i64,
    published: Published,
    /// State queries waiting for their causes, and answers not taken.
    queries: queries::Queries,
    /// What the host has not taken yet: the next [`Ready`]'s parts.
    out: door::Outbox,
    /// The restore jobs out, and what they share.
    restores: restores::Restores,
    /// Tasks that failed and stopped, and their restarts.
    stops: stops::Stops,
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
            failing: None,
            partial: BTreeSet::new(),
            diversions: BTreeMap::new(),
            in_flight: in_flight::InFlight::default(),
            since_commit: faults::SinceCommit::default(),
            local: None,
            restore_listener: None,
            routes: Routes::default(),
            state: State::Open,
            last_handed: None,
            drained: false,
            idle_floor: commit::IdleFloor::Unset,
            dirty: false,
            now: 0,
            next_txn: 1,
            stats: WorkerStats::default(),
            next_sample_at: 0,
            published: Published::default(),
            queries: queries::Queries::default(),
            out: door::Outbox::default(),
            restores: restores::Restores::new(fold_cache),
            stops: stops::Stops::default(),
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

    /// The host is asking the transaction coordinator to commit the
    /// transaction in flight (librdkafka's `commit_transaction`). Until its
    /// outcome is known, the commit may have happened whatever the client
    /// says next: a fenced producer, a call that never returns or an abort
    /// that fails can all follow a commit the coordinator already
    /// recorded. From here such a fault leaves the commit's fate unknown,
    /// and the worker drops every task ([`Directive::Rejoin`]: the next
    /// membership reads the committed positions and state from the broker)
    /// instead of rolling back to its own last commit, which would process
    /// the transaction's input again. Steps before this one cannot commit
    /// the transaction, and a fault in them still replaces the producer in
    /// place.
    pub fn ending(&mut self) {
        if matches!(self.state, State::InFlight) {
            self.in_flight.ending();
        }
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
