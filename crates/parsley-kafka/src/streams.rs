//! [`CausalStreams`]: a Parsley application running on a Kafka cluster.
//!
//! Each stream thread is one OS thread with one consumer in the
//! application's group and one transactional producer (exactly-once v2: the
//! consumed offsets go into the producer's transaction with the consumer's
//! group metadata). The thread only moves bytes between rdkafka and its
//! [`Worker`]: every decision (task grouping, start positions, position
//! capture, what a transaction holds, what an abort rolls back, ticks and
//! sweeps) is the worker's, so the simulator has judged it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::runtime::metrics::{Published, TaskMetrics};
use parsley::runtime::worker::{
    AssignedPartition, CommitOutcome, Directive, Fault, OnRetentionLoss, PolledRecord, RevokePlan,
    StartPolicy, TaskFailure, Transaction, Worker, WorkerConfig,
};
use parsley::task::{MetadataError, TopicMetadata};
use parsley::{HeldRecord, Parsley};
use parsley_protocol::Header;
use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::TopicPartitionListElem;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use crate::KafkaCluster;
use crate::diagnostics::{HoldReport, Publisher, ThreadReport, diagnostics_topic};
use crate::error::consumer_error_is_fatal;
pub use crate::error::{StreamsError, StreamsState};
use crate::policy::{
    self, ErrorHandler, ErrorResponse, ProductionHandler, ProductionResponse, RefusedRecord,
};
use crate::settings;
use crate::state_dir::StateDir;
pub use parsley::runtime::changelog::RestoreListener;

/// Records a stream thread takes from its consumer's buffer before it
/// turns to position reports, the clock and its transaction.
const POLL_BATCH: usize = 256;

/// How long a stream thread waits before it repeats a cluster lookup that
/// failed.
const LOOKUP_RETRY: Duration = Duration::from_millis(200);

/// The longest a stream thread waits for a record before it turns to its
/// clock (ticks, sweeps, samples, a due commit).
const POLL_WAIT: Duration = Duration::from_millis(20);

/// Settings the runtime owns; a client configuration that sets one of them
/// to something else is refused.
const OWNED: &[(&str, &str)] = &[
    ("isolation.level", "read_committed"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
];

/// The consumer's prefetch, unless the client configuration sets it: at
/// most 8 MiB fetched ahead of the stream thread (the consumer's one
/// queue, whatever its partitions); a partition is fetched again 20 ms
/// after that queue was full (librdkafka waits a second by
/// default, which at this size starves a fast stage).
const PREFETCH: &[(&str, &str)] = &[
    ("queued.max.messages.kbytes", "8192"),
    ("fetch.queue.backoff.ms", "20"),
];

/// What librdkafka fetches ahead of the stream thread is memory the hold
/// budget does not see: keep it to a few MiB ([`PREFETCH`]) where the
/// user's configuration says nothing (librdkafka's own default is 64 MiB).
fn set_prefetch_defaults(consumer_config: &mut ClientConfig) {
    for (setting, value) in PREFETCH {
        if consumer_config.get(setting).is_none() {
            consumer_config.set(*setting, *value);
        }
    }
}

/// Which consumer group protocol the stream threads use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The consumer group protocol of KIP-848 (Kafka 4.0 and later), with
    /// the broker's range assignor: sticky, and partition `p` of
    /// co-partitioned topics goes to one member. Partitions move one by one
    /// as the group reconciles, so a task whose partitions stay keeps
    /// running through a rebalance with its state, open work and hold
    /// queues. Session and heartbeat timeouts are the broker's
    /// (`group.consumer.session.timeout.ms`); a client configuration's
    /// `session.timeout.ms` and `heartbeat.interval.ms` are ignored, with a
    /// warning. The default.
    #[default]
    Consumer,
    /// The classic protocol with the eager range assignor, for brokers
    /// older than 4.0: every rebalance revokes every partition of every
    /// member, and each task restarts from its changelogs.
    Classic,
}

impl GroupProtocol {
    fn name(self) -> &'static str {
        match self {
            GroupProtocol::Consumer => "consumer",
            GroupProtocol::Classic => "classic",
        }
    }
}

/// The settings of the changelog topics the runtime creates. Compaction
/// never touches a partition's active segment, and with Kafka's defaults
/// (1 GiB segments, rolled weekly) a changelog under a gigabyte never
/// compacts at all: every superseded version stays, and a restore from
/// empty reads them all. Small segments rolled every ten minutes, cleaned
/// once a fifth of the log is superseded, keep a restore near one record
/// per live key. (A changelog you create yourself keeps your settings.)
const CHANGELOG_SETTINGS: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.bytes", "67108864"),
    ("segment.ms", "600000"),
    ("min.cleanable.dirty.ratio", "0.2"),
];

/// How the runtime runs an application.
#[derive(Clone, Debug)]
pub struct StreamsOptions {
    /// Stream threads (consumers and transactional producers) in this
    /// instance.
    pub threads: usize,
    /// How long a transaction collects work before it commits.
    pub commit_interval: Duration,
    /// How often each task runs the truncation sweep.
    pub truncation_interval: Duration,
    /// Where a channel with no committed position starts.
    pub start_policy: StartPolicy,
    /// What a channel whose committed position lies below its log start
    /// does: fail its task (the default), or go on from the log start.
    pub on_retention_loss: OnRetentionLoss,
    /// How long one cluster lookup may take.
    pub request_timeout: Duration,
    /// How long a changelog replay may receive nothing, while its
    /// partition's end lies ahead, before its task fails with
    /// `MetadataError::Stalled` (naming the partition and offsets). A
    /// replay that makes progress never times out.
    pub restore_stall_timeout: Duration,
    /// The consumer group protocol.
    pub group_protocol: GroupProtocol,
    /// How long a stream thread waits before it joins the group again,
    /// after a failure the error handler answered with
    /// [`ErrorResponse::ReplaceThread`] or after being fenced.
    pub rejoin_backoff: Backoff,
    /// How long a failed task waits before it restarts in place, after a
    /// failure the error handler answered with
    /// [`ErrorResponse::ReplaceThread`]. The task's partitions stay with
    /// its thread meanwhile, so the group does not rebalance.
    pub task_backoff: Backoff,
    /// This instance's identity within the application: it names the
    /// stream threads' transactional ids (`<app>-<instance>-<thread>`), so
    /// it must be the same when an instance restarts (its new producers
    /// then fence the dead one's open transactions at once, instead of
    /// leaving them to time out and hold back readers) and different for
    /// instances that run at the same time (they would fence each other).
    /// `None` takes the host name.
    pub instance_id: Option<String>,
    /// Where each task's stores are kept between runs: a task that starts
    /// opens its store there and replays only the changelog written after
    /// the store's checkpoint. The instance locks
    /// `<state_dir>/<application id>/<instance id>` for its life; a second
    /// instance on it is refused ([`StreamsError::StateDir`]). `None` keeps the
    /// stores in memory only, and every task start replays its whole
    /// changelogs. The default is `parsley-streams` under the system's
    /// temporary directory; in production choose a directory that survives
    /// a restart.
    pub state_dir: Option<std::path::PathBuf>,
    /// The most memory each task's store file may keep cached, in bytes:
    /// the file engine's read cache and the pages of commits written
    /// without a flush, together. 8 MiB by default (the engine's own
    /// default, 1 GiB per file, let an instance keep in memory much of
    /// what its files ever held).
    pub state_file_cache: usize,
    /// Static group membership: each stream thread joins with the stable
    /// `group.instance.id` `<application id>-<instance id>-<thread index>`.
    /// An instance that closes and starts again within the group's session
    /// timeout gets its partitions back without a rebalance of the other
    /// members. The costs, under the consumer group protocol: a closed
    /// instance's partitions stay reserved for it until the session
    /// timeout passes (a scale-down waits that long before the others
    /// take them), and an instance restarted after a crash is refused by
    /// the broker (`UNRELEASED_INSTANCE_ID`, fatal to the consumer) until
    /// the crashed member's session has expired; its threads retry after
    /// `rejoin_backoff`. Off by default.
    pub static_membership: bool,
    /// The most one task may hold in memory, in bytes, before its thread
    /// pauses fetching on the task's partitions whose queue heads are held
    /// (records wait in the log instead; see the guide's "Memory and
    /// backpressure"). A partition a held record waits for is never
    /// paused. A record larger than this that has to wait fails its task.
    /// `None` sets no bound. 32 MiB by default.
    pub hold_budget: Option<usize>,
    /// How many held records of each hold queue a task keeps decoded in
    /// memory (the head and the ones right behind it); the others, once
    /// committed, are kept only in the task's committed store and read
    /// back in order when the gate reaches them. `None` keeps them all.
    /// 256 by default.
    pub hold_window: Option<usize>,
    /// How many held records a task releases per transaction at most,
    /// when a cause lets many go at once: the rest go in the next
    /// transactions, each committed as soon as the one before. Keeps the
    /// memory a large release takes (its deliveries, and a changelog
    /// delete per record) to a transaction's worth. `None` sets no bound.
    /// 16,384 by default.
    pub release_per_transaction: Option<usize>,
    /// How much fold state the instance keeps in memory, in bytes, at
    /// most (an estimate of what the entries take), shared evenly by its
    /// stream threads and, within a thread, by its stateful tasks: the
    /// rest is read from each task's file in the state directory when a
    /// record needs it. Entries leave memory oldest write first, once the
    /// file holds them. Needs a state directory; without one (or with
    /// `None`) the whole fold state stays in memory. 64 MiB by default.
    pub fold_cache: Option<usize>,
}

impl Default for StreamsOptions {
    fn default() -> Self {
        StreamsOptions {
            threads: 1,
            commit_interval: Duration::from_millis(100),
            truncation_interval: Duration::from_secs(600),
            start_policy: StartPolicy::Earliest,
            on_retention_loss: OnRetentionLoss::Fail,
            request_timeout: Duration::from_secs(30),
            restore_stall_timeout: Duration::from_secs(90),
            group_protocol: GroupProtocol::Consumer,
            rejoin_backoff: Backoff::default(),
            task_backoff: Backoff::default(),
            instance_id: None,
            state_dir: Some(std::env::temp_dir().join("parsley-streams")),
            state_file_cache: crate::state_dir::DEFAULT_FILE_CACHE,
            static_membership: false,
            hold_budget: Some(parsley::runtime::worker::DEFAULT_HOLD_BUDGET),
            hold_window: Some(parsley::runtime::worker::DEFAULT_HOLD_WINDOW),
            release_per_transaction: Some(
                parsley::runtime::worker::DEFAULT_RELEASE_PER_TRANSACTION,
            ),
            fold_cache: Some(parsley::runtime::worker::DEFAULT_FOLD_CACHE),
        }
    }
}

/// How long a stream thread waits before it joins its group again, and a
/// failed task before it restarts (the worker's type): `initial` after the
/// first failure, doubling with each one in a row, up to `max`.
pub use parsley::runtime::worker::Backoff;

/// One record the producer could not produce: its index in the
/// transaction, and the client's or the broker's reason.
#[derive(Clone, Debug)]
struct RecordFailure {
    record: usize,
    error: String,
}

/// The transactional producer's context: it keeps the first record-level
/// failure its delivery reports carry (each record's opaque is its index in
/// the transaction), for the commit to hand to the worker as
/// [`Fault::RecordRefused`] instead of an abort-and-retry loop on the same
/// record.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<RecordFailure>>,
    /// The offset each record of the open transaction got (-1 until its
    /// report arrives), for the worker's local store checkpoints.
    offsets: Mutex<Vec<i64>>,
}

impl Deliveries {
    fn record(&self, failure: RecordFailure) {
        lock(&self.failed).get_or_insert(failure);
    }

    /// A new transaction of `records` records begins.
    fn begin(&self, records: usize) {
        let mut offsets = lock(&self.offsets);
        offsets.clear();
        offsets.resize(records, -1);
    }

    fn take(&self) -> Option<RecordFailure> {
        lock(&self.failed).take()
    }
}

impl ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, record: usize) {
        use rdkafka::types::RDKafkaErrorCode::{PurgeInflight, PurgeQueue};
        if let Ok(m) = result {
            if let Some(slot) = lock(&self.offsets).get_mut(record) {
                *slot = rdkafka::Message::offset(m);
            }
            return;
        }
        if let Err((e, _)) = result {
            // Records purged because the transaction failed are its
            // consequence, not its cause.
            if matches!(e.rdkafka_error_code(), Some(PurgeQueue | PurgeInflight)) {
                return;
            }
            self.record(RecordFailure {
                record,
                error: e.to_string(),
            });
        }
    }
}

type TxnProducer = BaseProducer<Deliveries>;

/// What a stream thread is doing, for a close that cannot finish to name.
type Phase = Arc<Mutex<&'static str>>;

fn set_phase(phase: &Phase, now: &'static str) {
    *lock(phase) = now;
}

/// What each stream thread last published (metrics and held heads), by
/// thread index. A thread writes its entry on its sampling punctuation
/// (every 500 ms); readers take the lock only to copy it.
type Reports = Arc<Mutex<BTreeMap<usize, Published>>>;

type StateListener = Box<dyn Fn(&StreamsState, &StreamsState) + Send + Sync>;

/// The application's state and who listens to its changes.
struct StateCell {
    state: Mutex<StreamsState>,
    listener: Mutex<Option<StateListener>>,
}

impl Default for StateCell {
    fn default() -> Self {
        StateCell {
            state: Mutex::new(StreamsState::Created),
            listener: Mutex::new(None),
        }
    }
}

impl StateCell {
    fn get(&self) -> StreamsState {
        lock(&self.state).clone()
    }

    /// Moves to `new`; a failure is final (a later stop keeps it).
    fn set(&self, new: StreamsState) {
        let old = {
            let mut state = lock(&self.state);
            if matches!(*state, StreamsState::Failed(_))
                && matches!(new, StreamsState::Stopping | StreamsState::Stopped)
            {
                return;
            }
            std::mem::replace(&mut *state, new.clone())
        };
        if std::mem::discriminant(&old) != std::mem::discriminant(&new)
            && let Some(listener) = lock(&self.listener).as_ref()
        {
            listener(&old, &new);
        }
    }
}

/// Which stream threads are ready (their assignment taken and every task
/// of it started): all of them make the instance `Running`, any other
/// mix `Rebalancing`. Stopping, stopped and failed states are left alone.
struct Readiness {
    threads: Mutex<Vec<bool>>,
    state: Arc<StateCell>,
}

impl Readiness {
    fn new(threads: usize, state: Arc<StateCell>) -> Readiness {
        Readiness {
            threads: Mutex::new(vec![false; threads]),
            state,
        }
    }

    /// Thread `index` is ready, or not.
    fn set(&self, index: usize, ready: bool) {
        let mut threads = lock(&self.threads);
        let Some(slot) = threads.get_mut(index) else {
            return;
        };
        if *slot == ready {
            return;
        }
        *slot = ready;
        let all = threads.iter().all(|r| *r);
        // Under the lock, so two threads' changes apply in order.
        let now = self.state.get();
        if matches!(now, StreamsState::Running | StreamsState::Rebalancing) {
            self.state.set(if all {
                StreamsState::Running
            } else {
                StreamsState::Rebalancing
            });
        }
    }
}

/// A Parsley application on a Kafka cluster.
pub struct CausalStreams {
    app: Parsley,
    config: ClientConfig,
    options: StreamsOptions,
    instance: String,
    stop: Arc<AtomicBool>,
    rejoins: Arc<AtomicU64>,
    reports: Reports,
    handler: Option<ErrorHandler>,
    production_handler: Option<ProductionHandler>,
    replacements: Arc<AtomicU64>,
    task_restarts: Arc<AtomicU64>,
    dead_lettered: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    watcher: Option<JoinHandle<()>>,
    state: Arc<StateCell>,
    threads: Vec<JoinHandle<Result<(), StreamsError>>>,
    /// What each stream thread is doing.
    phases: Vec<Phase>,
    /// The locked state directory, while the instance runs.
    state_dir: Option<Arc<StateDir>>,
    restores: Arc<RestoreTotals>,
    restore_listener: Option<Arc<dyn RestoreListener>>,
}

/// What the instance's task starts restored, summed over its threads.
#[derive(Debug, Default)]
struct RestoreTotals {
    replayed: AtomicU64,
    from_local: AtomicU64,
    rebuilt: AtomicU64,
}

/// What this instance's task starts restored so far
/// ([`CausalStreams::restored`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Restores {
    /// Changelog records replayed.
    pub records_replayed: u64,
    /// Tasks started from their local store (replaying only the changelog
    /// after its checkpoint).
    pub from_local_store: u64,
    /// Local stores found unusable, wiped and rebuilt from the changelog.
    pub local_stores_rebuilt: u64,
}

impl std::fmt::Debug for CausalStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalStreams")
            .field("application_id", &self.app.application_id())
            .field("instance", &self.instance)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host name, for the default instance id.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "instance".to_owned())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl CausalStreams {
    /// Prepares `app` to run with `config` (bootstrap servers and security
    /// settings pass through untouched). The runtime sets `read_committed`,
    /// manual offsets, the range assignor, the group id (the application
    /// id) and the transactional ids; a setting that contradicts them is a
    /// typed error naming it.
    pub fn new(app: &Parsley, config: ClientConfig) -> Result<CausalStreams, StreamsError> {
        for (setting, required) in OWNED {
            if let Some(v) = config.get(setting)
                && v != *required
            {
                return Err(StreamsError::Config {
                    setting: (*setting).to_owned(),
                    value: v.to_owned(),
                    reason: format!("exactly-once causal delivery needs {required:?}"),
                });
            }
        }
        // Partition p of every source must land on one thread: the range
        // assignor (under the consumer group protocol, the broker's range
        // assignor, which the runtime chooses).
        if let Some(v) = config.get("partition.assignment.strategy")
            && v != "range"
        {
            return Err(StreamsError::Config {
                setting: "partition.assignment.strategy".to_owned(),
                value: v.to_owned(),
                reason:
                    "a task's partitions must land on one stream thread: only \"range\" does that"
                        .to_owned(),
            });
        }
        for setting in ["group.id", "application.id"] {
            if let Some(v) = config.get(setting)
                && v != app.application_id()
            {
                return Err(StreamsError::Config {
                    setting: setting.to_owned(),
                    value: v.to_owned(),
                    reason: format!(
                        "the application's id is {:?}; leave it unset",
                        app.application_id()
                    ),
                });
            }
        }
        if let Some(v) = config.get("group.instance.id") {
            return Err(StreamsError::Config {
                setting: "group.instance.id".to_owned(),
                value: v.to_owned(),
                reason: "every stream thread needs its own; set StreamsOptions::static_membership and the runtime derives them from the instance id".to_owned(),
            });
        }
        if let Some(v) = config.get("transactional.id") {
            return Err(StreamsError::Config {
                setting: "transactional.id".to_owned(),
                value: v.to_owned(),
                reason: "the runtime gives each stream thread its own; leave it unset".to_owned(),
            });
        }
        let instance = host_name();
        Ok(CausalStreams {
            app: app.clone(),
            config,
            options: StreamsOptions::default(),
            instance,
            stop: Arc::new(AtomicBool::new(false)),
            rejoins: Arc::new(AtomicU64::new(0)),
            reports: Reports::default(),
            handler: None,
            replacements: Arc::new(AtomicU64::new(0)),
            task_restarts: Arc::new(AtomicU64::new(0)),
            dead_lettered: Arc::new(AtomicU64::new(0)),
            production_handler: None,
            failure: Arc::new(Mutex::new(None)),
            watcher: None,
            state: Arc::new(StateCell::default()),
            threads: Vec::new(),
            phases: Vec::new(),
            state_dir: None,
            restores: Arc::default(),
            restore_listener: None,
        })
    }

    /// The same runtime with other options.
    pub fn with_options(mut self, options: StreamsOptions) -> Self {
        if let Some(id) = &options.instance_id {
            self.instance = id.clone();
        }
        self.options = options;
        self
    }

    /// Sets what a stream thread's failure does to the application (see
    /// [`ErrorResponse`]); without one, a failure shuts this instance down
    /// ([`ErrorResponse::ShutdownClient`]). Set it before [`start`](Self::start).
    /// A handler that panics resolves to shutting the client down, with
    /// both failures logged.
    pub fn set_uncaught_error_handler(
        &mut self,
        handler: impl Fn(&StreamsError) -> ErrorResponse + Send + Sync + 'static,
    ) {
        self.handler = Some(Arc::new(handler));
    }

    /// How many times a stream thread was replaced after a failure
    /// ([`ErrorResponse::ReplaceThread`]).
    pub fn replaced_threads(&self) -> u64 {
        self.replacements.load(Ordering::SeqCst)
    }

    /// Sets the production error handler, which decides what happens to
    /// an emission the broker or the client refuses: fail its task (the
    /// default, without a handler) or send it to a dead-letter topic. Set
    /// it before [`start`](Self::start).
    pub fn set_production_error_handler(
        &mut self,
        handler: impl Fn(&RefusedRecord) -> ProductionResponse + Send + Sync + 'static,
    ) {
        self.production_handler = Some(Arc::new(handler));
    }

    /// How many refused emissions went to a dead-letter topic
    /// ([`ProductionResponse::DeadLetter`]).
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::SeqCst)
    }

    /// Tells `listener` how each task's restore goes, per changelog
    /// partition: its start (from which offset, to which end), a batch
    /// every 10,000 records (restored so far, offsets left), and its end.
    /// The calls come from the stream thread's restore thread: keep them
    /// short. Set it before [`start`](Self::start).
    pub fn set_restore_listener(&mut self, listener: impl RestoreListener + 'static) {
        self.restore_listener = Some(Arc::new(listener));
    }

    /// What this instance's task starts restored so far: changelog records
    /// replayed, tasks started from their local store, and local stores
    /// rebuilt (updated as threads sample, at most half a second late).
    pub fn restored(&self) -> Restores {
        Restores {
            records_replayed: self.restores.replayed.load(Ordering::Relaxed),
            from_local_store: self.restores.from_local.load(Ordering::Relaxed),
            local_stores_rebuilt: self.restores.rebuilt.load(Ordering::Relaxed),
        }
    }

    /// How many times a failed task was restarted in place
    /// ([`ErrorResponse::ReplaceThread`] answering a task's failure): its
    /// thread and the group membership stayed.
    pub fn restarted_tasks(&self) -> u64 {
        self.task_restarts.load(Ordering::SeqCst)
    }

    /// Every task's metrics on this instance, as last sampled by its stream
    /// thread (at most half a second old). The same numbers go to the
    /// installed `metrics` recorder.
    pub fn metrics(&self) -> Vec<TaskMetrics> {
        lock(&self.reports)
            .values()
            .flat_map(|p| p.metrics.iter().cloned())
            .collect()
    }

    /// Why records are held: one entry per gating head across this
    /// instance's tasks, longest-held first, with every unmet claim, its
    /// `vc-hold-*` diagnosis and the local watermarks that show the gap
    /// (`summary()` gives the one-line form). Payload-free. Each stream
    /// thread publishes its part on its sampling punctuation, so this takes
    /// no lock on the processing path and can be half a second stale.
    pub fn explain_holds(&self) -> Vec<HeldRecord> {
        let mut holds: Vec<HeldRecord> = lock(&self.reports)
            .values()
            .flat_map(|p| p.holds.iter().cloned())
            .collect();
        parsley::holds::sort_longest_first(&mut holds);
        holds
    }

    /// How many times a stream thread of this instance was fenced (or lost
    /// a commit of unknown fate) and joined the group again as a new member.
    pub fn rejoins(&self) -> u64 {
        self.rejoins.load(Ordering::SeqCst)
    }

    /// Calls `listener(old, new)` on every change of state from now on, on
    /// the thread that makes the change (a stream thread, for a failure):
    /// keep it short and do not call back into this instance from it.
    pub fn set_state_listener(
        &mut self,
        listener: impl Fn(&StreamsState, &StreamsState) + Send + Sync + 'static,
    ) {
        *lock(&self.state.listener) = Some(Box::new(listener));
    }

    /// Where the application is.
    pub fn state(&self) -> StreamsState {
        lock(&self.state.state).clone()
    }

    /// Checks the application's topics, creates its changelog topics if
    /// missing (compacted, one partition per task), and starts the stream
    /// threads.
    pub fn start(&mut self) -> Result<(), StreamsError> {
        if self.state() != StreamsState::Created {
            return Err(StreamsError::State(self.state()));
        }
        let protocol = self.options.group_protocol.name();
        if let Some(v) = self.config.get("group.protocol")
            && v != protocol
        {
            return Err(StreamsError::Config {
                setting: "group.protocol".to_owned(),
                value: v.to_owned(),
                reason: format!(
                    "the stream threads use {protocol:?} (StreamsOptions::group_protocol chooses it)"
                ),
            });
        }
        if let Some(root) = &self.options.state_dir {
            self.state_dir = Some(StateDir::with_cache(
                root,
                self.app.application_id(),
                &self.instance,
                self.options.state_file_cache,
            )?);
        }
        let cluster = KafkaCluster::new(&self.config, self.options.request_timeout)?;
        self.prepare_topics(&cluster)?;
        self.start_watcher()?;
        self.state.set(StreamsState::Rebalancing);
        let threads = self.options.threads.max(1);
        let readiness = Arc::new(Readiness::new(threads, self.state.clone()));
        for index in 0..threads {
            let thread = StreamThread {
                app: self.app.clone(),
                index,
                config: self.config.clone(),
                options: self.options.clone(),
                transactional_id: format!(
                    "{}-{}-{index}",
                    self.app.application_id(),
                    self.instance
                ),
                instance: self.instance.clone(),
                stop: self.stop.clone(),
                rejoins: self.rejoins.clone(),
                reports: self.reports.clone(),
                handler: self.handler.clone(),
                replacements: self.replacements.clone(),
                task_restarts: self.task_restarts.clone(),
                production_handler: self.production_handler.clone(),
                dead_lettered: self.dead_lettered.clone(),
                failure: self.failure.clone(),
                phase: Arc::new(Mutex::new("starting")),
                readiness: readiness.clone(),
                state_dir: self.state_dir.clone(),
                restores: self.restores.clone(),
                restore_listener: self.restore_listener.clone(),
            };
            self.phases.push(thread.phase.clone());
            let state = self.state.clone();
            let handle = std::thread::Builder::new()
                .name(format!(
                    "parsley-{}-{}-{index}",
                    self.app.application_id(),
                    self.instance
                ))
                .spawn(move || {
                    let r = thread.run();
                    if let Err(e) = &r {
                        warn!(thread = index, error = %e, "stream thread failed");
                        state.set(StreamsState::Failed(e.to_string()));
                    }
                    r
                })
                .map_err(|e| StreamsError::Thread {
                    thread: index,
                    message: e.to_string(),
                })?;
            self.threads.push(handle);
        }
        Ok(())
    }

    /// Watches the application's control topic: a shutdown request from
    /// any instance ([`ErrorResponse::ShutdownApplication`]) stops this one.
    fn start_watcher(&mut self) -> Result<(), StreamsError> {
        let config = self.config.clone();
        let topic = policy::control_topic(self.app.application_id());
        let stop = self.stop.clone();
        let state = self.state.clone();
        let failure = self.failure.clone();
        let handle = std::thread::Builder::new()
            .name(format!("parsley-{}-control", self.app.application_id()))
            .spawn(move || {
                let watching = policy::watch(&config, &topic, stop.clone(), |reason| {
                    let message = format!("the application was shut down: {reason}");
                    lock(&failure).get_or_insert_with(|| message.clone());
                    state.set(StreamsState::Failed(message));
                    stop.store(true, Ordering::SeqCst);
                });
                if let Err(e) = watching {
                    warn!(error = %e, "the control topic watch failed; application-wide shutdowns will not reach this instance");
                }
            })
            .map_err(|e| StreamsError::Thread {
                thread: usize::MAX,
                message: e.to_string(),
            })?;
        self.watcher = Some(handle);
        Ok(())
    }

    fn prepare_topics(&self, cluster: &KafkaCluster) -> Result<(), StreamsError> {
        let mut creates = Vec::new();
        // The control topic carries application-wide shutdown requests.
        let control = policy::control_topic(self.app.application_id());
        match cluster.describe(&control) {
            Ok(_) => {}
            Err(MetadataError::Missing(_)) => creates.push((control, 1)),
            Err(e) => return Err(e.into()),
        }
        // The diagnostics topic carries each thread's holds, for `parsley
        // holds`.
        let diagnostics = diagnostics_topic(self.app.application_id());
        match cluster.describe(&diagnostics) {
            Ok(_) => {}
            Err(MetadataError::Missing(_)) => creates.push((diagnostics, 1)),
            Err(e) => return Err(e.into()),
        }
        for stage in self.app.stages() {
            // Partition p of every source (and of the tick topic) meets in
            // task p: they must agree on the count.
            let mut counts: Vec<(String, i32)> = Vec::new();
            let tick = self.app.tick_topic(stage.name());
            let mut topics: Vec<&str> = stage.source_topics();
            topics.extend(stage.sink_topics());
            topics.extend(tick);
            topics.extend(stage.corrupt_headers_dead_letter());
            for t in topics {
                match cluster.describe(t) {
                    Ok(d) => {
                        if stage.source_topics().contains(&t) || tick == Some(t) {
                            counts.push((t.to_owned(), d.partitions));
                        }
                    }
                    Err(MetadataError::Missing(_)) => {
                        return Err(StreamsError::MissingTopic {
                            topic: t.to_owned(),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let tasks = counts.first().map_or(1, |(_, n)| *n);
            if counts.iter().any(|(_, n)| *n != tasks) {
                return Err(StreamsError::PartitionCounts {
                    stage: stage.name().to_owned(),
                    counts,
                });
            }
            let Some(names) = self.app.owned_names(stage.name()) else {
                continue;
            };
            for changelog in std::iter::once(&names.state_changelog).chain(&names.fold_changelog) {
                match cluster.describe(changelog) {
                    Ok(d) => self.check_changelog(cluster, changelog, d.partitions, tasks)?,
                    Err(MetadataError::Missing(_)) => creates.push((changelog.clone(), tasks)),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if creates.is_empty() {
            return Ok(());
        }
        let topics: Vec<NewTopic<'_>> = creates
            .iter()
            .map(|(name, n)| {
                let t = NewTopic::new(name, *n, TopicReplication::Fixed(-1));
                if name.ends_with("-control") {
                    // Requests matter only to instances running when they
                    // are made; a day of them is plenty.
                    t.set("cleanup.policy", "delete")
                        .set("retention.ms", "86400000")
                } else {
                    CHANGELOG_SETTINGS.iter().fold(t, |t, (k, v)| t.set(k, v))
                }
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(self.options.request_timeout));
        for result in block_on(cluster.admin().create_topics(&topics, &opts))? {
            match result {
                Ok(name) => info!(topic = %name, "topic created"),
                Err((name, code)) => {
                    if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                        return Err(StreamsError::Kafka(KafkaError::AdminOp(code))).inspect_err(
                            |_| {
                                warn!(topic = %name, "changelog topic could not be created");
                            },
                        );
                    }
                }
            }
        }
        // Creation settles asynchronously.
        for (name, _) in &creates {
            let deadline = Instant::now() + self.options.request_timeout;
            while cluster.describe(name).is_err() {
                if Instant::now() > deadline {
                    return Err(StreamsError::MissingTopic {
                        topic: name.clone(),
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// An existing changelog must have one partition per task (task `p`
    /// writes partition `p`) and be compacted only: a `delete` policy (also
    /// `compact,delete`) lets retention remove a held record or a fold
    /// entry that a restore needs, which would lose it silently.
    fn check_changelog(
        &self,
        cluster: &KafkaCluster,
        topic: &str,
        partitions: i32,
        tasks: i32,
    ) -> Result<(), StreamsError> {
        if partitions != tasks {
            return Err(StreamsError::Changelog {
                topic: topic.to_owned(),
                reason: format!(
                    "it has {partitions} partition(s) but the stage runs {tasks} task(s); a changelog needs one partition per task"
                ),
            });
        }
        let opts = AdminOptions::new().request_timeout(Some(self.options.request_timeout));
        let resources = block_on(
            cluster
                .admin()
                .describe_configs([&ResourceSpecifier::Topic(topic)], &opts),
        )?;
        let policy = resources
            .into_iter()
            .next()
            .and_then(Result::ok)
            .and_then(|r| r.get("cleanup.policy").and_then(|e| e.value.clone()))
            .ok_or_else(|| StreamsError::Changelog {
                topic: topic.to_owned(),
                reason: "its cleanup.policy could not be read".to_owned(),
            })?;
        let parts: Vec<&str> = policy.split(',').map(str::trim).collect();
        if parts != ["compact"] {
            return Err(StreamsError::Changelog {
                topic: topic.to_owned(),
                reason: format!(
                    "its cleanup.policy is {policy:?}; it must be \"compact\", or retention could delete state a restore needs"
                ),
            });
        }
        Ok(())
    }

    /// Waits until the application runs (or fails).
    pub fn wait_until_running(&self, timeout: Duration) -> Result<(), StreamsError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.state() {
                StreamsState::Running => return Ok(()),
                StreamsState::Failed(m) => {
                    return Err(StreamsError::State(StreamsState::Failed(m)));
                }
                s if Instant::now() > deadline => return Err(StreamsError::State(s)),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops gracefully: each thread commits (or aborts) its open
    /// transaction and leaves the group. Returns the first thread failure.
    pub fn close(&mut self, timeout: Duration) -> Result<(), StreamsError> {
        if matches!(
            self.state(),
            StreamsState::Running | StreamsState::Rebalancing
        ) {
            self.state.set(StreamsState::Stopping);
        }
        self.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        let mut first = None;
        for (i, h) in self.threads.drain(..).enumerate() {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !h.is_finished() {
                let phase = self.phases.get(i).map_or("running", |p| *lock(p));
                first.get_or_insert(StreamsError::Thread {
                    thread: i,
                    message: format!("did not stop within {timeout:?}; it was {phase}"),
                });
                continue;
            }
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                }
                Err(_) => {
                    first.get_or_insert(StreamsError::Thread {
                        thread: i,
                        message: "panicked".to_owned(),
                    });
                }
            }
        }
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        // The lock goes with the last thread's stores.
        self.state_dir = None;
        match first {
            None => {
                self.state.set(StreamsState::Stopped);
                Ok(())
            }
            Some(e) => {
                self.state.set(StreamsState::Failed(e.to_string()));
                Err(e)
            }
        }
    }
}

/// What a stream thread shares with its consumer's rebalance callback (the
/// callback runs inside `poll`, on the same thread).
struct Shared {
    worker: Worker,
    start_policy: StartPolicy,
    producer: TxnProducer,
    cluster: KafkaCluster,
    timeout: Duration,
    /// The highest offset handed to the worker per partition since the last
    /// position report.
    last_fed: BTreeMap<String, BTreeMap<i32, i64>>,
    error: Option<StreamsError>,
    /// The instance is closing: the thread takes no new tasks.
    stop: Arc<AtomicBool>,
    /// What the thread is doing.
    phase: Phase,
    /// The worker was fenced (or a commit's fate is unknown) and dropped
    /// every task: the thread leaves the group and joins again as a new
    /// member, with a new producer, as the simulator's members do.
    rejoin: Option<String>,
    /// Whether an assignment was taken since the last revocation.
    assigned: bool,
    /// The membership is over (its consumer is being dropped).
    ending: bool,
    /// Partitions arrive and leave one by one (the consumer group
    /// protocol): assignments are incremental.
    incremental: bool,
    /// This thread's index, and what the threads publish (metrics and
    /// holds), so a rebalance can say at once which tasks it holds now.
    index: usize,
    reports: Reports,
    readiness: Arc<Readiness>,
    /// The instance's restore counts, and what this worker added so far.
    restores: Arc<RestoreTotals>,
    seen: parsley::runtime::worker::WorkerStats,
}

impl Shared {
    /// Adds what the worker restored since the last call to the instance's
    /// counts.
    fn account(&mut self) {
        let now = self.worker.stats();
        let r = &self.restores;
        r.replayed.fetch_add(
            now.changelog_records_replayed - self.seen.changelog_records_replayed,
            Ordering::Relaxed,
        );
        r.from_local.fetch_add(
            now.local_store_starts - self.seen.local_store_starts,
            Ordering::Relaxed,
        );
        r.rebuilt.fetch_add(
            now.local_store_rebuilds - self.seen.local_store_rebuilds,
            Ordering::Relaxed,
        );
        self.seen = now;
    }

    /// Publishes this thread's tasks as they are now (after a rebalance
    /// changed them), and whether the thread is ready.
    fn republish(&mut self) {
        self.account();
        let published = self.worker.sample().clone();
        lock(&self.reports).insert(self.index, published);
        self.refresh_ready();
    }

    /// Ready: an assignment taken, and no task of it still waiting to
    /// start.
    fn refresh_ready(&self) {
        let ready = self.assigned
            && self.worker.waiting_tasks().next().is_none()
            && self.worker.assignment_restoring().next().is_none();
        self.readiness.set(self.index, ready);
    }
}

struct ThreadContext {
    shared: Mutex<Shared>,
}

/// Marks a membership as ending when dropped (see `Shared::ending`).
struct Ending<'a>(&'a BaseConsumer<ThreadContext>);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        lock(&self.0.context().shared).ending = true;
    }
}

impl ClientContext for ThreadContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // An out-of-range fetch also reaches the poll loop, where the
        // worker decides whether it is a loss to fail on; the event itself
        // is not the failure.
        if matches!(
            error,
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AutoOffsetReset)
        ) {
            warn!(%error, reason, "a fetch offset is out of range");
        } else {
            error!(%error, reason, "librdkafka error");
        }
    }
}

impl ConsumerContext for ThreadContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka_sys::rd_kafka_resp_err_t,
        tpl: &mut TopicPartitionList,
    ) {
        let mut shared = lock(&self.shared);
        let assigning =
            err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        if shared.error.is_some() || shared.rejoin.is_some() {
            // The membership is ending: take nothing up.
            let _ = if assigning {
                shared.leave_untaken(consumer, tpl)
            } else {
                shared.give_up(consumer, tpl).map_err(StreamsError::from)
            };
            return;
        }
        if assigning && shared.stop.load(Ordering::SeqCst) {
            // Closing: the partitions wait for this member to leave, and
            // no task starts (or restores) only to be dropped.
            let _ = shared.leave_untaken(consumer, tpl);
            return;
        }
        // Rebalancing until the new assignment's tasks have started (not
        // when the consumer's own close revokes what it held: the thread's
        // state is then its failure's, or the instance's close).
        let ending = shared.ending;
        if !ending {
            shared.assigned = false;
            shared.refresh_ready();
        }
        let r = if assigning {
            info!(partitions = tpl.count(), "assignment taken");
            set_phase(&shared.phase, "starting tasks (lookups and restores)");
            let r = shared.on_assign(consumer, tpl);
            shared.assigned = r.is_ok();
            r
        } else {
            set_phase(&shared.phase, "revoking tasks");
            shared.on_revoke(consumer, tpl)
        };
        if !ending {
            shared.republish();
        }
        set_phase(&shared.phase, "polling");
        if let Err(e) = r {
            warn!(error = %e, "rebalance failed; the stream thread stops");
            let _ = shared.give_up(consumer, tpl);
            shared.error = Some(e);
        }
    }

    // The default post-rebalance hook would log only.
    fn post_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e: &TopicPartitionListElem<'_>| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl Shared {
    fn on_assign(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        let began = Instant::now();
        if tpl.count() == 0 {
            // An incremental step that adds nothing: acknowledge it.
            return self.take(consumer, tpl).map_err(StreamsError::from);
        }
        // The group's committed offsets are unstable while a transaction
        // that sent offsets is still open (a frozen or dead member's):
        // the broker answers once it commits or aborts, which the
        // transaction timeout bounds. Keep asking until then.
        let deadline = Instant::now() + self.timeout.saturating_mul(4);
        let committed = loop {
            match consumer.committed_offsets(tpl.clone(), self.timeout) {
                Ok(c) => break c,
                Err(_) if self.stop.load(Ordering::SeqCst) => {
                    return self.leave_untaken(consumer, tpl);
                }
                Err(e) if Instant::now() < deadline => {
                    warn!(error = %e, "committed offsets not available yet; retrying");
                    std::thread::sleep(LOOKUP_RETRY);
                }
                Err(e) => return Err(e.into()),
            }
        };
        // A late joiner starts at the last stable offset, never the high
        // watermark: records of a transaction still open at the join sit
        // between the two, and they (and the claims on them) must be
        // delivered once it commits. The consumer is read_committed, so its
        // "latest" offset lookup answers the last stable offset.
        let mut stable = BTreeMap::new();
        if self.start_policy == StartPolicy::Latest {
            let mut latest = TopicPartitionList::new();
            for (topic, p) in partitions(tpl) {
                latest.add_partition_offset(&topic, p, Offset::End)?;
            }
            for e in consumer.offsets_for_times(latest, self.timeout)?.elements() {
                if let Offset::Offset(o) = e.offset() {
                    stable.insert((e.topic().to_owned(), e.partition()), o);
                }
            }
        }
        // Every partition's log start in one ListOffsets round (one request
        // per leader), not a watermark lookup per partition. A partition
        // may have no leader for a moment (just created, or a leader
        // moving): ask again within the same bound.
        let mut earliest = TopicPartitionList::new();
        for (topic, p) in partitions(tpl) {
            earliest.add_partition_offset(&topic, p, Offset::Beginning)?;
        }
        let starts = loop {
            let answer = consumer.offsets_for_times(earliest.clone(), self.timeout);
            let missing = answer.as_ref().map_or(true, |a| {
                a.elements()
                    .iter()
                    .any(|e| e.error().is_err() || !matches!(e.offset(), Offset::Offset(_)))
            });
            match answer {
                Ok(a) if !missing => break a,
                _ if self.stop.load(Ordering::SeqCst) => return self.leave_untaken(consumer, tpl),
                r if Instant::now() < deadline => {
                    let error = r.map_or_else(
                        |e| e.to_string(),
                        |_| "a partition without an answer".to_owned(),
                    );
                    warn!(%error, "log starts not available yet; retrying");
                    std::thread::sleep(LOOKUP_RETRY);
                }
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    return Err(StreamsError::Metadata(MetadataError::Failed {
                        topic: "(log starts)".to_owned(),
                        message: "a partition's log start had no answer".to_owned(),
                    }));
                }
            }
        };
        let mut parts = Vec::new();
        for (topic, p) in partitions(tpl) {
            let committed = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            let log_start = match starts.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            // The last stable offset, when the policy asks for it (the
            // worker refuses to start a late joiner without it); nothing
            // reads the end under the other policy.
            let end = if self.start_policy == StartPolicy::Latest {
                stable.get(&(topic.clone(), p)).copied()
            } else {
                None
            };
            parts.push(AssignedPartition {
                topic,
                partition: p,
                committed,
                log_start,
                end,
            });
        }
        if self.stop.load(Ordering::SeqCst) {
            // The instance began to close during the lookups: start nothing.
            return self.leave_untaken(consumer, tpl);
        }
        self.worker.assign(parts, &self.cluster, now_ms())?;
        // Assign with the worker's starts instead of seeking afterwards.
        let mut starts = TopicPartitionList::new();
        let seeks = self.worker.take_seeks();
        for (topic, p) in partitions(tpl) {
            // A started task's position is its seek; the others start
            // at an absolute offset (Worker::fetch_start says why).
            let offset = Offset::Offset(self.worker.fetch_start(&topic, p));
            starts.add_partition_offset(&topic, p, offset)?;
        }
        self.take(consumer, &starts)?;
        // Pauses of partial tasks and resumes of tasks that formed, on the
        // assignment as it is now.
        self.apply_flow(consumer);
        let mut earlier = Vec::new();
        for s in seeks {
            if starts.find_partition(&s.topic, s.partition).is_some() {
                self.worker.seek_applied(&s.topic, s.partition, s.offset)?;
            } else {
                // A partition assigned before, of a task that formed now.
                earlier.push(s);
            }
        }
        self.seek_to(consumer, earlier)?;
        info!(partitions = tpl.count(), tasks = self.worker.tasks().count(), elapsed = ?began.elapsed(), "partitions assigned");
        Ok(())
    }

    fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        match self.worker.revoke_plan(consumer.assignment_lost()) {
            RevokePlan::Nothing => {}
            RevokePlan::Commit => match self.worker.flush() {
                Ok(Some(txn)) => self.commit(consumer, txn)?,
                Ok(None) => {}
                // A task failed taking its commit: it stops (and leaves with
                // its partitions); the other tasks roll back.
                Err(_) if self.worker.failing_task().is_some() => {
                    self.worker.abort(&self.cluster)?;
                    self.worker.take_seeks();
                }
                Err(e) => return Err(e.into()),
            },
            RevokePlan::Abort => {
                self.worker.abort(&self.cluster)?;
            }
        }
        // Seeks for the revoked partitions are dropped with them; the
        // others (tasks that stay, rolled back by an abort) are made.
        self.worker.revoke(&partitions(tpl))?;
        self.last_fed.clear();
        self.give_up(consumer, tpl)?;
        self.apply_seeks(consumer)?;
        info!(
            partitions = tpl.count(),
            tasks = self.worker.tasks().count(),
            "partitions revoked"
        );
        Ok(())
    }

    /// Takes partitions into the consumer's assignment, at `starts`.
    fn take(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        starts: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if self.incremental {
            consumer.incremental_assign(starts)
        } else {
            consumer.assign(starts)
        }
    }

    /// Gives partitions up (under the eager protocol, the whole assignment).
    fn give_up(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if self.incremental {
            consumer.incremental_unassign(tpl)
        } else {
            consumer.unassign()
        }
    }

    /// Leaves an assignment that arrived while the instance closes untaken:
    /// its partitions wait for this member to leave the group. (The
    /// incremental protocol wants every assignment acknowledged, so there
    /// they are taken and paused.)
    fn leave_untaken(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        info!("closing: the assignment is left untaken");
        if self.incremental {
            consumer.incremental_assign(tpl)?;
            consumer.pause(tpl)?;
        } else {
            consumer.unassign()?;
        }
        Ok(())
    }

    fn on_message(&mut self, m: &BorrowedMessage<'_>) -> Result<(), StreamsError> {
        let headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| Header::named(h.key, h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let topic = m.topic();
        let (partition, offset) = (m.partition(), m.offset());
        self.worker.on_record(PolledRecord {
            topic: topic.to_owned(),
            partition,
            offset,
            timestamp: m.timestamp().to_millis().unwrap_or(0),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        })?;
        // Looked up by name first: a topic's entry is made once, not per
        // record.
        match self.last_fed.get_mut(topic) {
            Some(fed) => {
                fed.insert(partition, offset);
            }
            None => {
                self.last_fed
                    .insert(topic.to_owned(), BTreeMap::from([(partition, offset)]));
            }
        }
        Ok(())
    }

    /// Reports the consumer's positions. Every record a poll returned was
    /// handed to the worker before the next poll, so the polls' highest
    /// returned offsets are the ones fed.
    fn report_positions(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        let positions = consumer.position()?;
        for e in positions.elements() {
            if let Offset::Offset(p) = e.offset() {
                let last = self
                    .last_fed
                    .get(e.topic())
                    .and_then(|fed| fed.get(&e.partition()))
                    .copied();
                self.worker.on_position(e.topic(), e.partition(), p, last)?;
            }
        }
        Ok(())
    }

    /// A failure inside a turn of the poll loop. A task's error aborted
    /// nothing on the broker yet (records are produced only at a commit):
    /// the worker rolls back, stopping that task, and the loop goes on. Any
    /// other failure ends the membership.
    fn recover(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        e: StreamsError,
    ) -> Result<(), StreamsError> {
        if self.worker.failing_task().is_none() || self.worker.in_flight() {
            return Err(e);
        }
        debug!(error = %e, "a task failed; the open work rolls back");
        self.worker.abort(&self.cluster)?;
        self.apply_seeks(consumer)
    }

    fn apply_seeks(&mut self, consumer: &BaseConsumer<ThreadContext>) -> Result<(), StreamsError> {
        self.apply_flow(consumer);
        let seeks = self.worker.take_seeks();
        self.seek_to(consumer, seeks)
    }

    /// Makes the fetch pauses and resumes the worker asks for.
    fn apply_flow(&mut self, consumer: &BaseConsumer<ThreadContext>) {
        for f in self.worker.take_flow_changes() {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&f.topic, f.partition);
            // A partition no longer assigned refuses; nothing to do then.
            let r = if f.paused {
                consumer.pause(&tpl)
            } else {
                consumer.resume(&tpl)
            };
            if let Err(e) = r {
                debug!(topic = %f.topic, partition = f.partition, paused = f.paused, error = %e, "fetch pause or resume refused");
            }
            if let Some(fed) = self.last_fed.get_mut(&f.topic) {
                fed.remove(&f.partition);
            }
        }
    }

    /// Makes `seeks` and confirms each to the worker.
    fn seek_to(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        seeks: Vec<parsley::runtime::worker::Seek>,
    ) -> Result<(), StreamsError> {
        for s in seeks {
            if let Err(e) = consumer.seek(
                &s.topic,
                s.partition,
                Offset::Offset(s.offset),
                self.timeout,
            ) {
                // A partition the consumer stopped (an out-of-range fetch,
                // under auto.offset.reset=error) refuses a seek; assigning
                // it again at the offset restarts its fetch.
                debug!(topic = %s.topic, partition = s.partition, error = %e, "seek refused; assigning the partition again");
                self.restart_fetch(consumer, &s.topic, s.partition, s.offset)?;
            }
            self.worker.seek_applied(&s.topic, s.partition, s.offset)?;
            if let Some(fed) = self.last_fed.get_mut(&s.topic) {
                fed.remove(&s.partition);
            }
        }
        Ok(())
    }

    /// Assigns the consumer's whole assignment again: `topic:partition` at
    /// `offset`, every other partition at the next offset the worker
    /// expects (a task still waiting to start: anywhere in range, its
    /// records are dropped until it seeks). Their buffered records are
    /// fetched again, so none is fed twice or skipped.
    fn restart_fetch(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), StreamsError> {
        if self.incremental {
            // Only this partition: the others keep their fetch positions.
            let mut one = TopicPartitionList::new();
            one.add_partition(topic, partition);
            consumer.incremental_unassign(&one)?;
            let mut at = TopicPartitionList::new();
            at.add_partition_offset(topic, partition, Offset::Offset(offset))?;
            consumer.incremental_assign(&at)?;
            if let Some(fed) = self.last_fed.get_mut(topic) {
                fed.remove(&partition);
            }
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions(&consumer.assignment()?) {
            let at = if t == topic && p == partition {
                Offset::Offset(offset)
            } else {
                Offset::Offset(self.worker.fetch_start(&t, p))
            };
            tpl.add_partition_offset(&t, p, at)?;
        }
        consumer.assign(&tpl)?;
        self.last_fed.clear();
        Ok(())
    }

    /// Produces the transaction's records, sends its offsets with the
    /// consumer's group metadata, and commits. A step that fails is handed
    /// to the worker as a [`Fault`] of the client's own class, and the
    /// worker's [`Directive`] is followed: retry the step, abort (the worker
    /// rolls back and asks for seeks; a refused record stops its task),
    /// rejoin the group, or fail the thread.
    fn commit(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        txn: Transaction,
    ) -> Result<(), StreamsError> {
        match self.try_commit(consumer, &txn) {
            Ok(()) => {
                if self.worker.has_local_store() {
                    let offsets = lock(&self.producer.context().offsets);
                    self.worker.delivered(&offsets);
                }
                self.worker
                    .commit_outcome(CommitOutcome::Committed, &self.cluster)?;
                debug!(
                    txn = txn.id,
                    records = txn.records.len(),
                    "transaction committed"
                );
                Ok(())
            }
            Err(Directive::Abort) => {
                warn!(txn = txn.id, "transaction aborted; the tasks roll back");
                self.abort_open(&txn)
            }
            Err(d) => self.follow(d),
        }
    }

    /// Follows a directive that ends the transaction without an abort.
    fn follow(&mut self, d: Directive) -> Result<(), StreamsError> {
        match d {
            Directive::Rejoin => {
                self.rejoin = Some("the worker dropped every task".to_owned());
                Ok(())
            }
            Directive::Fail(e) => Err((*e).into()),
            // Handled where they arise.
            Directive::Abort | Directive::Retry { .. } | Directive::Continue => Ok(()),
        }
    }

    /// Aborts the open transaction and tells the worker, which rolls back.
    /// When the abort fails, the coordinator may already have ended the
    /// transaction (a member that froze past its transaction timeout):
    /// the worker hears [`Fault::AbortFailed`], and a new producer fences
    /// whatever state this one is in.
    fn abort_open(&mut self, txn: &Transaction) -> Result<(), StreamsError> {
        // librdkafka aborts only once the delivery reports of the records
        // already sent have been served.
        let _ = await_deliveries(&self.producer, self.timeout);
        match self.producer.abort_transaction(self.timeout) {
            Ok(()) => {
                self.worker
                    .commit_outcome(CommitOutcome::Aborted, &self.cluster)?;
                Ok(())
            }
            Err(abort) => {
                warn!(txn = txn.id, error = %abort, "the abort failed");
                let d = self.worker.on_fault(Fault::AbortFailed(abort.to_string()));
                self.follow(d)
            }
        }
    }

    /// The fault a failed step of `txn` is: a record the delivery reports
    /// refused, if one was; else the error's own class.
    fn fault_of(&self, txn: &Transaction, e: &KafkaError) -> Fault {
        if let Some(f) = self.producer.context().take()
            && let Some(r) = txn.records.get(f.record)
        {
            return Fault::RecordRefused {
                record: f.record,
                topic: r.topic.clone(),
                partition: r.partition,
                origin: r.origin,
                reason: f.error,
            };
        }
        classify(e)
    }

    /// Runs one step of a commit, retrying it as long as the worker says.
    fn step(
        &mut self,
        txn: &Transaction,
        mut f: impl FnMut(&TxnProducer) -> Result<(), KafkaError>,
    ) -> Result<(), Directive> {
        loop {
            let Err(e) = f(&self.producer) else {
                return Ok(());
            };
            let fault = self.fault_of(txn, &e);
            match self.worker.on_fault(fault) {
                Directive::Retry { after } => std::thread::sleep(after),
                d => return Err(d),
            }
        }
    }

    fn try_commit(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        txn: &Transaction,
    ) -> Result<(), Directive> {
        // The commit's steps are DEBUG events, so a latency breakdown (the
        // throughput example's) can time them with a tracing layer.
        debug!(
            txn = txn.id,
            records = txn.records.len(),
            "transaction producing"
        );
        self.step(txn, |p| p.begin_transaction())?;
        if self.worker.has_local_store() {
            self.producer.context().begin(txn.records.len());
        }
        for (i, r) in txn.records.iter().enumerate() {
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&r.topic, i)
                .partition(r.partition)
                .timestamp(r.timestamp);
            // No header list for a record without headers (a changelog
            // write): librdkafka allocates one per list.
            if !r.headers.is_empty() {
                let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
                for h in &r.headers {
                    headers = headers.insert(rdkafka::message::Header {
                        key: &h.name,
                        value: h.value.as_deref(),
                    });
                }
                record = record.headers(headers);
            }
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                record = record.payload(v.as_slice());
            }
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((
                        KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        back,
                    )) => {
                        self.producer.poll(Duration::from_millis(10));
                        record = back;
                    }
                    Err((e, _)) => {
                        // The client refused the record itself (larger than
                        // its message.max.bytes, say).
                        return Err(self.worker.on_fault(Fault::RecordRefused {
                            record: i,
                            topic: r.topic.clone(),
                            partition: r.partition,
                            origin: r.origin,
                            reason: e.to_string(),
                        }));
                    }
                }
            }
        }
        let mut offsets = TopicPartitionList::new();
        for o in &txn.offsets {
            if let Err(e) =
                offsets.add_partition_offset(&o.topic, o.partition, Offset::Offset(o.offset))
            {
                return Err(self.worker.on_fault(classify(&e)));
            }
        }
        let Some(metadata) = consumer.group_metadata() else {
            return Err(self.worker.on_fault(Fault::Fenced(
                "the consumer has no group metadata: it is not a member of the group".to_owned(),
            )));
        };
        let timeout = self.timeout;
        self.step(txn, |p| {
            p.send_offsets_to_transaction(&offsets, &metadata, timeout)
        })?;
        self.step(txn, |p| await_deliveries(p, timeout))?;
        debug!(txn = txn.id, "transaction ending");
        self.step(txn, |p| p.commit_transaction(timeout))
    }
}

/// Sorts a client error into the worker's fault classes by the client's
/// own flags and codes, and nothing more: fencing codes, then librdkafka's
/// fatal, abortable and retriable flags. A transaction error with none of
/// them (a call in the wrong state) counts as fatal; the delivery wait
/// running out is abortable (the abort purges what is in flight).
fn classify(e: &KafkaError) -> Fault {
    use rdkafka::types::RDKafkaErrorCode::{
        Fenced, InvalidProducerEpoch, OperationTimedOut, ProducerFenced,
    };
    let message = e.to_string();
    if matches!(
        e.rdkafka_error_code(),
        Some(Fenced | ProducerFenced | InvalidProducerEpoch)
    ) {
        return Fault::Fenced(message);
    }
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => Fault::Fatal(message),
        KafkaError::Transaction(t) if t.txn_requires_abort() => Fault::Abortable(message),
        KafkaError::Transaction(t) if t.is_retriable() => Fault::Retriable(message),
        KafkaError::Flush(OperationTimedOut) => Fault::Abortable(message),
        _ => Fault::Fatal(message),
    }
}

/// How long one wait for delivery reports lasts before the count of
/// unacknowledged records is read again.
const DELIVERY_POLL: Duration = Duration::from_millis(1);

/// Serves the producer's delivery reports until every record it was given
/// is acknowledged (or `timeout` passes), in waits of [`DELIVERY_POLL`].
///
/// Committing needs every record of the transaction acknowledged first.
/// rdkafka's `commit_transaction` does that by flushing, and its flush
/// waits in polls of 100 ms that run to their end even when the last
/// acknowledgement came a millisecond in: every commit with records in it
/// then took at least 100 ms (measured: median 103 ms, minimum 101.7 ms,
/// for an EndTxn round trip of about 3 ms). With nothing left in flight,
/// the flush inside `commit_transaction` returns at once.
fn await_deliveries(producer: &TxnProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(KafkaError::Flush(
                rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        producer.poll(DELIVERY_POLL);
    }
    Ok(())
}

/// How long a poll waits, at most, while a task restores: a finished
/// restore starts its task within this.
const RESTORE_POLL: Duration = Duration::from_millis(10);

/// A stream thread's restore thread: it runs the worker's restore jobs
/// (changelog replays) with its own replay consumer, while the stream
/// thread goes on processing the tasks that are ready. It ends when the
/// membership does (after the job it is running).
struct Restorer {
    jobs: std::sync::mpsc::Sender<parsley::runtime::worker::RestoreJob>,
    outcomes: std::sync::mpsc::Receiver<parsley::runtime::worker::RestoreOutcome>,
}

impl Restorer {
    /// Sends the worker's new jobs, and hands it the finished ones (each
    /// starts its task: resumes, seeks and readiness follow).
    fn exchange(
        &self,
        shared: &mut Shared,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        for job in shared.worker.take_restore_jobs() {
            if self.jobs.send(job).is_err() {
                return Err(StreamsError::Thread {
                    thread: shared.index,
                    message: "its restore thread is gone".to_owned(),
                });
            }
        }
        let mut started = false;
        while let Ok(outcome) = self.outcomes.try_recv() {
            let Shared {
                worker, cluster, ..
            } = &mut *shared;
            worker.restored(outcome, cluster)?;
            started = true;
        }
        if started {
            shared.apply_seeks(consumer)?;
            shared.republish();
        }
        Ok(())
    }
}

struct StreamThread {
    app: Parsley,
    index: usize,
    config: ClientConfig,
    options: StreamsOptions,
    transactional_id: String,
    /// The instance id (the `thread-id` metric label is `<instance>-<index>`).
    instance: String,
    stop: Arc<AtomicBool>,
    rejoins: Arc<AtomicU64>,
    reports: Reports,
    handler: Option<ErrorHandler>,
    replacements: Arc<AtomicU64>,
    task_restarts: Arc<AtomicU64>,
    production_handler: Option<ProductionHandler>,
    dead_lettered: Arc<AtomicU64>,
    /// The first failure that shut the instance down, for every thread to
    /// see.
    failure: Arc<Mutex<Option<String>>>,
    /// What this thread is doing.
    phase: Phase,
    /// Whether each thread is ready.
    readiness: Arc<Readiness>,
    /// The instance's state directory, if it keeps one.
    state_dir: Option<Arc<StateDir>>,
    restores: Arc<RestoreTotals>,
    restore_listener: Option<Arc<dyn RestoreListener>>,
}

/// How one membership of a stream thread ended.
enum Session {
    /// The application is closing; the thread left the group.
    Closed,
    /// Fenced: join again as a new member.
    Rejoin,
    /// A failure the error handler already answered (a task's).
    Failed(StreamsError, ErrorResponse),
}

impl StreamThread {
    /// Starts this membership's restore thread, its replay consumer
    /// connecting while the stream thread joins its group.
    fn restorer(&self) -> Result<Restorer, StreamsError> {
        let cluster = KafkaCluster::new(&self.config, self.options.request_timeout)?
            .with_restore_stall(self.options.restore_stall_timeout);
        let changelogs: Vec<String> = self
            .app
            .stages()
            .iter()
            .filter_map(|s| self.app.owned_names(s.name()))
            .flat_map(|n| {
                std::iter::once(n.state_changelog.clone()).chain(n.fold_changelog.clone())
            })
            .collect();
        let (jobs, job_rx) = std::sync::mpsc::channel::<parsley::runtime::worker::RestoreJob>();
        let (outcome_tx, outcomes) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!(
                "parsley-restore-{}-{}-{}",
                self.app.application_id(),
                self.instance,
                self.index
            ))
            .spawn(move || {
                let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
                cluster.warm_replayer(&names);
                for job in job_rx {
                    let outcome = job.run(&cluster, &cluster);
                    if outcome_tx.send(outcome).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| StreamsError::Thread {
                thread: self.index,
                message: format!("its restore thread could not start: {e}"),
            })?;
        Ok(Restorer { jobs, outcomes })
    }

    /// Runs memberships until the application closes: a fenced member
    /// (a zombie that woke after the group moved on, or a commit whose fate
    /// is unknown) has already dropped its tasks, and joins again with a new
    /// producer and consumer. Any other failure stops the thread.
    fn run(self) -> Result<(), StreamsError> {
        let backoff = self.options.rejoin_backoff;
        // Failures and rejoins in a row, for the backoff.
        let mut in_a_row = 0;
        loop {
            let began = Instant::now();
            let session = self.session();
            // A thread that left the group runs no tasks until it joins again.
            lock(&self.reports).remove(&self.index);
            if began.elapsed() > backoff.max {
                // It ran long enough that this is not the same failure again.
                in_a_row = 0;
            }
            let e = match session {
                Ok(Session::Closed) => return Ok(()),
                Ok(Session::Rejoin) => {
                    // Out of the group until it joins again.
                    self.readiness.set(self.index, false);
                    self.rejoins.fetch_add(1, Ordering::SeqCst);
                    let wait = backoff.step(in_a_row);
                    in_a_row += 1;
                    info!(
                        thread = self.index,
                        ?wait,
                        "stream thread rejoins the group"
                    );
                    if !self.pause(wait) {
                        return Ok(());
                    }
                    continue;
                }
                Ok(Session::Failed(e, response)) => (e, Some(response)),
                Err(e) => (e, None),
            };
            let (e, decided) = e;
            if self.stop.load(Ordering::SeqCst) {
                // Already shutting down (another thread's failure, or close).
                return Err(e);
            }
            let response =
                decided.unwrap_or_else(|| policy::decide(self.handler.as_ref(), self.index, &e));
            match response {
                ErrorResponse::ReplaceThread => {
                    self.readiness.set(self.index, false);
                    self.replacements.fetch_add(1, Ordering::SeqCst);
                    // A failure that recurs at once is reported once per
                    // step of the backoff, and joins the group once per
                    // step: never a rebalance loop.
                    let wait = backoff.step(in_a_row);
                    in_a_row += 1;
                    warn!(thread = self.index, error = %e, ?wait, failures_in_a_row = in_a_row, "stream thread failed; replacing it after a pause");
                    if !self.pause(wait) {
                        return Ok(());
                    }
                }
                ErrorResponse::ShutdownClient => {
                    error!(thread = self.index, error = %e, "stream thread failed; shutting the instance down");
                    lock(&self.failure).get_or_insert_with(|| e.to_string());
                    self.stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
                ErrorResponse::ShutdownApplication => {
                    error!(thread = self.index, error = %e, "stream thread failed; shutting the application down");
                    let reason = format!("instance {} thread {}: {e}", self.instance, self.index);
                    if let Err(r) = policy::request_shutdown(
                        &self.config,
                        &policy::control_topic(self.app.application_id()),
                        &reason,
                        self.options.request_timeout,
                    ) {
                        error!(error = %r, "the shutdown request could not be written; only this instance stops");
                    }
                    lock(&self.failure).get_or_insert_with(|| e.to_string());
                    self.stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            }
        }
    }

    /// A task failed and stopped (the worker aborted for it). The error
    /// handler hears of it once: `ReplaceThread` restarts the task in place
    /// after its backoff step, with no rebalance; the other responses end
    /// the membership, already decided.
    fn task_failed(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        failure: TaskFailure,
    ) -> Option<Session> {
        if let Some(refused) = &failure.refused
            && let ProductionResponse::DeadLetter(topic) =
                policy::decide_production(self.production_handler.as_ref(), refused)
        {
            let mut shared = lock(&consumer.context().shared);
            let Shared {
                worker, cluster, ..
            } = &mut *shared;
            let r = worker.divert(&failure.task, refused, &topic, cluster);
            let r = r.map_err(StreamsError::from).and_then(|diverted| {
                // The task restarted at once: its seeks go out now.
                shared.apply_seeks(consumer).map(|()| diverted)
            });
            match r {
                Ok(diverted) => {
                    // Not diverted: the task was revoked meanwhile, and its
                    // new owner meets the refusal on its own.
                    if diverted {
                        self.dead_lettered.fetch_add(1, Ordering::SeqCst);
                    }
                    return None;
                }
                Err(e) => {
                    drop(shared);
                    let response = policy::decide(self.handler.as_ref(), self.index, &e);
                    return Some(Session::Failed(e, response));
                }
            }
        }
        let e = StreamsError::Task {
            task: failure.task.clone(),
            error: failure.error,
            earlier_in_a_row: failure.earlier_in_a_row,
        };
        let response = policy::decide(self.handler.as_ref(), self.index, &e);
        if response != ErrorResponse::ReplaceThread {
            return Some(Session::Failed(e, response));
        }
        let mut shared = lock(&consumer.context().shared);
        let Shared {
            worker, cluster, ..
        } = &mut *shared;
        let r = worker.restart_task(&failure.task, cluster);
        // A restart without a wait happened now: its seeks go out now.
        let r = r
            .map_err(StreamsError::from)
            .and_then(|wait| shared.apply_seeks(consumer).map(|()| wait));
        match r {
            Ok(Some(wait)) => {
                self.task_restarts.fetch_add(1, Ordering::SeqCst);
                warn!(thread = self.index, error = %e, ?wait, "task failed; restarting it in place after a pause");
                None
            }
            // Revoked meanwhile: whoever owns it now starts it.
            Ok(None) => None,
            Err(restart) => Some(Session::Failed(restart, ErrorResponse::ShutdownClient)),
        }
    }

    /// Waits `wait`, or less if the application closes meanwhile; says
    /// whether to go on.
    fn pause(&self, wait: Duration) -> bool {
        set_phase(&self.phase, "waiting to join the group again (backoff)");
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(20)),
            );
        }
        !self.stop.load(Ordering::SeqCst)
    }

    fn thread_report(&self, published: &Published) -> ThreadReport {
        ThreadReport {
            instance: self.instance.clone(),
            thread: self.index,
            at: published.at,
            tasks: published
                .metrics
                .iter()
                .map(|m| m.task.to_string())
                .collect(),
            holds: published.holds.iter().map(HoldReport::from).collect(),
        }
    }

    fn session(&self) -> Result<Session, StreamsError> {
        set_phase(
            &self.phase,
            "joining the group (producer and consumer set-up)",
        );
        let timeout = self.options.request_timeout;
        let cluster = KafkaCluster::new(&self.config, timeout)?
            .with_restore_stall(self.options.restore_stall_timeout);
        let restorer = self.restorer()?;
        let mut producer_config = settings::for_producer(&self.config);
        producer_config.set("transactional.id", &self.transactional_id);
        // A transaction left open by a frozen or dead instance holds back
        // every read_committed reader (a restoring task among them) until
        // it times out: keep that short unless the user chose otherwise.
        if producer_config.get("transaction.timeout.ms").is_none() {
            producer_config.set("transaction.timeout.ms", "10000");
        }
        if producer_config.get("linger.ms").is_none() {
            producer_config.set("linger.ms", "0");
        }
        let producer: TxnProducer = producer_config.create_with_context(Deliveries::default())?;
        // Fences any earlier producer of this thread's id (this thread's own
        // previous membership among them) and aborts what it left open.
        producer.init_transactions(timeout)?;
        let mut worker = Worker::new(
            &self.app,
            WorkerConfig {
                commit_interval: self.options.commit_interval,
                truncation_interval: self.options.truncation_interval,
                start_policy: self.options.start_policy,
                on_retention_loss: self.options.on_retention_loss,
                task_backoff: self.options.task_backoff,
                assignment: match self.options.group_protocol {
                    GroupProtocol::Consumer => parsley::runtime::worker::Assignment::Incremental,
                    GroupProtocol::Classic => parsley::runtime::worker::Assignment::Complete,
                },
                thread_id: format!("{}-{}", self.instance, self.index),
                // Nothing here reads what the tasks did record by record.
                events: false,
                // Replays run on the thread's restore thread, so the ready
                // tasks go on processing meanwhile.
                restores: parsley::runtime::worker::RestoreMode::Deferred,
                hold_budget: self.options.hold_budget,
                hold_window: self.options.hold_window,
                release_per_transaction: self.options.release_per_transaction,
                fold_cache: self
                    .options
                    .fold_cache
                    .map(|b| b / self.options.threads.max(1)),
                ..WorkerConfig::default()
            },
        );
        if let Some(dir) = &self.state_dir {
            worker = worker.with_local_store(Box::new(dir.stores()));
        }
        if let Some(listener) = &self.restore_listener {
            worker = worker.with_restore_listener(listener.clone());
        }
        let context = ThreadContext {
            shared: Mutex::new(Shared {
                worker,
                start_policy: self.options.start_policy,
                producer,
                cluster,
                timeout,
                last_fed: BTreeMap::new(),
                error: None,
                stop: self.stop.clone(),
                phase: self.phase.clone(),
                rejoin: None,
                assigned: false,
                ending: false,
                incremental: self.options.group_protocol == GroupProtocol::Consumer,
                index: self.index,
                reports: self.reports.clone(),
                readiness: self.readiness.clone(),
                restores: self.restores.clone(),
                seen: parsley::runtime::worker::WorkerStats::default(),
            }),
        };
        let mut consumer_config = settings::for_consumer(&self.config);
        for (k, v) in OWNED {
            consumer_config.set(*k, *v);
        }
        set_prefetch_defaults(&mut consumer_config);
        match self.options.group_protocol {
            GroupProtocol::Classic => {
                consumer_config.set("partition.assignment.strategy", "range");
            }
            GroupProtocol::Consumer => {
                for setting in [
                    "session.timeout.ms",
                    "heartbeat.interval.ms",
                    "partition.assignment.strategy",
                    "group.protocol.type",
                ] {
                    if consumer_config.get(setting).is_some() {
                        if self.index == 0 {
                            warn!(
                                setting,
                                "ignored under the consumer group protocol (KIP-848): the broker sets it (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms), and assigns with its range assignor"
                            );
                        }
                        consumer_config.remove(setting);
                    }
                }
                consumer_config
                    .set("group.protocol", "consumer")
                    .set("group.remote.assignor", "range");
            }
        }
        if self.options.static_membership {
            consumer_config.set("group.instance.id", &self.transactional_id);
        }
        consumer_config
            .set("group.id", self.app.application_id())
            // A fetch offset out of range (retention passed what this
            // thread had not read) stops the partition and reports an
            // error, which the worker judges; never a silent reset.
            .set("auto.offset.reset", "error");
        let consumer: BaseConsumer<ThreadContext> = consumer_config.create_with_context(context)?;
        // Dropped before the consumer, however the membership ends: the
        // revocation the consumer's close makes then changes no state.
        let _ending = Ending(&consumer);
        let mut topics: Vec<&str> = Vec::new();
        for stage in self.app.stages() {
            topics.extend(stage.source_topics());
            if let Some(t) = self.app.tick_topic(stage.name()) {
                topics.push(t);
            }
        }
        consumer.subscribe(&topics)?;
        info!(thread = self.index, transactional_id = %self.transactional_id, "stream thread started");
        set_phase(&self.phase, "polling");
        let mut last_report = Instant::now();
        let mut published_at = 0;
        let mut accounted_at = 0;
        let mut publisher = Publisher::new(
            &self.config,
            self.app.application_id(),
            &self.instance,
            self.index,
        );
        // Whatever way this membership ends, say the thread holds nothing.
        let leave = |publisher: &mut Option<Publisher>| {
            if let Some(p) = publisher.as_mut() {
                p.leave(&self.thread_report(&Published {
                    at: now_ms(),
                    ..Published::default()
                }));
            }
        };
        while !self.stop.load(Ordering::SeqCst) {
            let mut turn = || -> Result<Option<Session>, StreamsError> {
                // A batch of what the consumer has buffered: the first poll
                // waits, the rest take only what is already fetched. Each
                // record is handed over (and any seek it asks for made) before
                // the next poll, as position reports require; the per-batch
                // work (positions, the clock, transactions) is paid once per
                // batch instead of once per record.
                // The wait for the first record ends no later than the
                // worker's next commit is due.
                let wait = {
                    let mut shared = lock(&consumer.context().shared);
                    // Restores the rebalance queued go to the restore
                    // thread; the finished ones start their tasks.
                    restorer.exchange(&mut shared, &consumer)?;
                    let now = now_ms();
                    let restoring = shared.worker.restoring_tasks().next().map(|_| RESTORE_POLL);
                    [
                        shared.worker.commit_due_in(now),
                        shared.worker.restart_due_in(now),
                        shared.worker.release_due_in(),
                        restoring,
                    ]
                    .into_iter()
                    .flatten()
                    .fold(POLL_WAIT, Duration::min)
                };
                let mut polled = consumer.poll(wait);
                let mut batch = 0;
                let idle = loop {
                    let mut shared = lock(&consumer.context().shared);
                    if let Some(e) = shared.error.take() {
                        return Err(e);
                    }
                    if let Some(e) = shared.rejoin.take() {
                        warn!(thread = self.index, error = %e, "fenced; leaving the group to join again");
                        drop(shared);
                        leave(&mut publisher);
                        return Ok(Some(Session::Rejoin));
                    }
                    match polled {
                        None => break true,
                        Some(Ok(m)) => {
                            shared.on_message(&m)?;
                            shared.apply_seeks(&consumer)?;
                        }
                        Some(Err(KafkaError::MessageConsumption(
                            rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                        ))) => {
                            let Shared {
                                worker, cluster, ..
                            } = &mut *shared;
                            worker.offset_out_of_range(cluster)?;
                            shared.apply_seeks(&consumer)?;
                            break true;
                        }
                        Some(Err(e)) => {
                            // The client says whether it gives up on the
                            // consumer; the worker decides what follows.
                            let fault = Fault::Poll {
                                fatal: consumer_error_is_fatal(&e),
                                message: e.to_string(),
                            };
                            let d = shared.worker.on_fault(fault);
                            shared.follow(d)?;
                            break true;
                        }
                    }
                    batch += 1;
                    if batch == POLL_BATCH {
                        break false;
                    }
                    drop(shared);
                    polled = consumer.poll(Duration::ZERO);
                };
                // Every poll above was followed by the error and rejoin checks.
                let mut shared = lock(&consumer.context().shared);
                let now = now_ms();
                if idle || last_report.elapsed() > Duration::from_millis(50) {
                    shared.report_positions(&consumer)?;
                    last_report = Instant::now();
                }
                {
                    let Shared {
                        worker, cluster, ..
                    } = &mut *shared;
                    worker.punctuate(now, cluster)?;
                    if worker.published().at != published_at {
                        published_at = worker.published().at;
                        let published = worker.published().clone();
                        if let Some(p) = publisher.as_mut() {
                            p.publish(&self.thread_report(&published));
                        }
                        lock(&self.reports).insert(self.index, published);
                    }
                }
                if shared.worker.published().at != accounted_at {
                    accounted_at = shared.worker.published().at;
                    shared.account();
                }
                // A task whose start waited on a lookup may have started.
                shared.refresh_ready();
                shared.apply_seeks(&consumer)?;
                if let Some(txn) = shared.worker.poll_transaction(now)? {
                    set_phase(&self.phase, "committing");
                    shared.commit(&consumer, txn)?;
                    shared.apply_seeks(&consumer)?;
                    set_phase(&self.phase, "polling");
                }
                Ok(None)
            };
            let r = turn();
            match r {
                Ok(Some(session)) => return Ok(session),
                Ok(None) => {}
                Err(e) => lock(&consumer.context().shared).recover(&consumer, e)?,
            }
            // A task that failed stopped alone; the handler decides what
            // follows.
            let failures = lock(&consumer.context().shared).worker.take_task_failures();
            for failure in failures {
                if let Some(session) = self.task_failed(&consumer, failure) {
                    leave(&mut publisher);
                    return Ok(session);
                }
            }
        }
        // Graceful close: commit what is open, then leave the group.
        {
            set_phase(&self.phase, "closing: committing the open transaction");
            let mut shared = lock(&consumer.context().shared);
            shared.report_positions(&consumer)?;
            if let Some(txn) = shared.worker.flush()? {
                shared.commit(&consumer, txn)?;
            }
        }
        set_phase(&self.phase, "closing: leaving the group");
        consumer.unsubscribe();
        // Serve the revocation the unsubscribe triggers.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && consumer
                .assignment()
                .map(|a| a.count() > 0)
                .unwrap_or(false)
        {
            let _ = consumer.poll(Duration::from_millis(50));
        }
        leave(&mut publisher);
        info!(thread = self.index, "stream thread stopped");
        Ok(Session::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> Parsley {
        let t: parsley::Topic<String, String> =
            parsley::Topic::new("in", parsley::Codec::utf8(), parsley::Codec::utf8());
        let stage = parsley::Stage::named("s")
            .on(&t, |_m: &parsley::Message<String, String>| {
                Vec::<parsley::Emission>::new()
            })
            .build()
            .unwrap();
        Parsley::named("app", [stage]).unwrap()
    }

    #[test]
    fn the_prefetch_bound_yields_to_the_users_own_setting() {
        let mut bare = ClientConfig::new();
        set_prefetch_defaults(&mut bare);
        assert_eq!(bare.get("queued.max.messages.kbytes"), Some("8192"));
        assert_eq!(bare.get("fetch.queue.backoff.ms"), Some("20"));
        let mut own = ClientConfig::new();
        own.set("queued.max.messages.kbytes", "65536");
        set_prefetch_defaults(&mut own);
        assert_eq!(own.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(own.get("fetch.queue.backoff.ms"), Some("20"));
    }

    #[test]
    fn only_fatal_consumer_errors_fail_the_thread() {
        use rdkafka::types::RDKafkaErrorCode;
        assert!(consumer_error_is_fatal(
            &KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::Fatal)
        ));
        assert!(consumer_error_is_fatal(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::Fatal
        )));
        assert!(!consumer_error_is_fatal(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!consumer_error_is_fatal(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::AllBrokersDown
        )));
    }

    #[test]
    fn settings_that_contradict_exactly_once_are_refused_by_name() {
        for (setting, value) in [
            ("isolation.level", "read_uncommitted"),
            ("enable.auto.commit", "true"),
            ("partition.assignment.strategy", "roundrobin"),
            ("group.id", "someone-else"),
            ("transactional.id", "mine"),
            ("group.instance.id", "one-for-all-threads"),
        ] {
            let mut c = ClientConfig::new();
            c.set("bootstrap.servers", "127.0.0.1:1")
                .set(setting, value);
            match CausalStreams::new(&app(), c) {
                Err(StreamsError::Config { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("{setting}: expected a Config error, got {other:?}"),
            }
        }
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "127.0.0.1:1")
            .set("isolation.level", "read_committed")
            .set("group.id", "app");
        assert!(CausalStreams::new(&app(), c).is_ok());
    }
}
