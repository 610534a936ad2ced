//! [`CausalStreams`]: a Parsley application running on a Kafka cluster.
//!
//! Each stream thread is one OS thread with one consumer in the
//! application's group and one transactional producer (exactly-once v2: the
//! consumed offsets go into the producer's transaction with the consumer's
//! group metadata). The thread only moves bytes between rdkafka and its
//! [`Worker`]: every decision (task grouping, start positions, position
//! capture, what a transaction holds, what an abort rolls back, ticks and
//! sweeps) is the worker's, so the simulator has judged it.

mod classify;
mod membership;
mod options;
mod produce;
mod protocol;
mod queries;
mod rebalance;
mod state;
mod thread;
mod topics;

use produce::{Deliveries, TxnProducer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use thread::StreamThread;

use futures_executor::block_on;
use parsley::runtime::host::{AssignedPartition, RecordView};
use parsley::runtime::host::{MetadataError, TopicMetadata};
use parsley::runtime::metrics::{Published, TaskMetrics};
use parsley::runtime::worker::{
    Ack, CommitOutcome, Directive, Fault, OnRetentionLoss, Ready, StartPolicy, Streaming,
    TaskFailure, Transaction, Worker, WorkerConfig,
};
use parsley::{HeldRecord, Parsley};
use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedHeaders, BorrowedMessage, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::TopicPartitionListElem;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use crate::KafkaCluster;
use crate::diagnostics::{HoldReport, ThreadReport, diagnostics_topic};
use crate::error::consumer_error_is_fatal;
pub use crate::error::{StreamsError, StreamsState};
use crate::policy::{
    self, ErrorHandler, ErrorResponse, ProductionHandler, ProductionResponse, RefusedRecord,
};
use crate::settings;
use crate::state_dir::StateDir;
pub use options::{Backoff, DEFAULT_COMMIT_WHEN_IDLE, GroupProtocol, StreamsOptions};
pub use parsley::runtime::changelog::RestoreListener;
pub use queries::{KeyHost, QueryError};
use state::{Doing, Phase, Readiness, Reports, StateCell, set_phase};

/// Records a stream thread takes from its consumer's buffer before it
/// turns to position reports, the clock and its transaction.
const POLL_BATCH: usize = 256;

/// The transactional producers' `linger.ms` unless the configuration sets
/// one. Records go to the producer while the transaction is open, a
/// poll's worth at a time; with no linger at all librdkafka sent each
/// handful in a request of its own, and its threads cost twice as much
/// CPU per record as when records went out at the commit. Two
/// milliseconds batch them again, and cost the commit nothing
/// measurable: the records a commit produces itself wait at most that
/// long, while the offsets it sends next take longer (see
/// `docs/performance.md`, issue 55).
const PRODUCER_LINGER_MS: &str = "2";

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
    restores: Arc<Totals>,
    restore_listener: Option<Arc<dyn RestoreListener>>,
    /// The group protocol the stream threads use, once started (a thread
    /// whose consumer protocol the coordinator refused sets the classic
    /// one).
    chosen_protocol: Arc<Mutex<Option<GroupProtocol>>>,
    /// State queries on their way to the stream threads.
    inboxes: queries::Inboxes,
    next_query: AtomicU64,
    /// Partition counts and ids of the topics queries named.
    query_topics: Mutex<queries::QueryTopics>,
}

/// What the instance's threads counted: their task starts' restores, and
/// the producers they replaced.
#[derive(Debug, Default)]
struct Totals {
    replayed: AtomicU64,
    from_local: AtomicU64,
    rebuilt: AtomicU64,
    producers_replaced: AtomicU64,
    aborts: AtomicU64,
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
            chosen_protocol: Arc::default(),
            inboxes: queries::Inboxes::default(),
            next_query: AtomicU64::new(0),
            query_topics: Mutex::new(queries::QueryTopics::default()),
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

    /// How many times a stream thread of this instance left the group and
    /// joined it again as a new member: after a commit of unknown fate, or
    /// when its producer was refused three times in a row without a
    /// commit (see [`producer_replacements`](Self::producer_replacements)).
    pub fn rejoins(&self) -> u64 {
        self.rejoins.load(Ordering::SeqCst)
    }

    /// How many times a stream thread of this instance replaced its
    /// producer and kept its membership: the producer was fenced, could
    /// not abort, or a call of it never returned. The tasks went on from
    /// their committed state.
    pub fn producer_replacements(&self) -> u64 {
        self.restores.producers_replaced.load(Ordering::Relaxed)
    }

    /// How many transactions this instance's stream threads aborted: for a
    /// fault (a broker down or moving, an offset commit refused during a
    /// rebalance), a failed task, or an assignment lost with work open.
    /// Each one's work is redone from the committed state; none of it is
    /// lost or written twice. A steady count while the group is stable and
    /// the brokers are up is worth a look.
    pub fn aborted_transactions(&self) -> u64 {
        self.restores.aborts.load(Ordering::Relaxed)
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

    /// The consumer group protocol the stream threads use: the one
    /// [`StreamsOptions::group_protocol`] names, or, left to the cluster
    /// ([`GroupProtocol::Auto`]), the one [`start`](Self::start) chose.
    /// `None` before the start.
    pub fn group_protocol(&self) -> Option<GroupProtocol> {
        *lock(&self.chosen_protocol)
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
        let mut asked = self.options.group_protocol;
        if let Some(v) = self.config.get("group.protocol") {
            match (GroupProtocol::from_setting(v), asked.name()) {
                (Some(named), None) => asked = named,
                (Some(named), Some(_)) if named == asked => {}
                (_, protocol) => {
                    return Err(StreamsError::Config {
                        setting: "group.protocol".to_owned(),
                        value: v.to_owned(),
                        reason: match protocol {
                            Some(protocol) => format!(
                                "the stream threads use {protocol:?} (StreamsOptions::group_protocol chooses it)"
                            ),
                            None => "it must be \"consumer\" or \"classic\" (or unset, to choose by what the cluster serves)".to_owned(),
                        },
                    });
                }
            }
        }
        let cluster = KafkaCluster::new(&self.config, self.options.request_timeout)?;
        let choice = protocol::choose(asked, || {
            protocol::offered(&cluster, self.options.request_timeout)
        })?;
        choice.log();
        *lock(&self.chosen_protocol) = Some(choice.protocol);
        if let Some(root) = &self.options.state_dir {
            self.state_dir = Some(StateDir::with_cache(
                root,
                self.app.application_id(),
                &self.instance,
                self.options.state_file_cache,
            )?);
        }
        let largest_batch = self.prepare_topics(&cluster)?;
        // The producers' batches fit the smallest topic they write:
        // librdkafka sends a batch whole, and a broker that refuses it as
        // too large fails every record in it, the valid ones too.
        let mut thread_config = self.config.clone();
        if let Some(cap) = largest_batch {
            let asked = thread_config
                .get("batch.size")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1_000_000);
            if cap < asked {
                info!(
                    batch_size = cap,
                    asked,
                    "producer batches held to the smallest max.message.bytes of the topics the application writes"
                );
                thread_config.set("batch.size", cap.to_string());
            }
        }
        self.start_watcher()?;
        self.state.set(StreamsState::Rebalancing);
        let threads = self.options.threads.max(1);
        let readiness = Arc::new(Readiness::new(threads, self.state.clone()));
        for index in 0..threads {
            let thread = StreamThread {
                app: self.app.clone(),
                index,
                config: thread_config.clone(),
                // What was asked (a client setting included): the thread
                // reads the chosen protocol from `protocol`.
                options: StreamsOptions {
                    group_protocol: asked,
                    ..self.options.clone()
                },
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
                phase: Arc::new(Mutex::new(Doing::Starting)),
                readiness: readiness.clone(),
                state_dir: self.state_dir.clone(),
                restores: self.restores.clone(),
                restore_listener: self.restore_listener.clone(),
                protocol: self.chosen_protocol.clone(),
                inboxes: self.inboxes.clone(),
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
                let phase = self
                    .phases
                    .get(i)
                    .map_or_else(|| "running".to_owned(), |p| lock(p).to_string());
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
    /// Shared with a helper thread while a call that can hang runs there
    /// ([`produce::guarded`]).
    producer: Arc<TxnProducer>,
    /// What a replacement producer is made from
    /// ([`Directive::ReplaceProducer`]).
    producer_config: ClientConfig,
    /// The producer's open transaction.
    open: produce::OpenTxn,
    cluster: KafkaCluster,
    /// How long a lookup may take.
    timeout: Duration,
    /// How long a transaction may stay open (the producer's
    /// `transaction.timeout.ms`): the longest any step of a commit waits,
    /// since the coordinator aborts the transaction past it anyway.
    txn_timeout: Duration,
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
    restores: Arc<Totals>,
    seen: parsley::runtime::worker::WorkerStats,
    /// The parts of the worker's readies that the poll loop acts on
    /// between polls, not where they were handed over (inside a group
    /// change, or in the middle of a batch): failed tasks for the error
    /// handler, restore jobs for the restore thread, and a fresh sample to
    /// publish. Pauses, resumes, seeks and transactions never wait here.
    later: Ready,
    /// The group changes librdkafka reported during the last poll, for the
    /// turn to act on ([`Shared::take_group_changes`]).
    group_changes: Vec<rebalance::GroupChange>,
    /// Where the answers to the state queries the worker holds go.
    replies: BTreeMap<
        parsley::runtime::query::QueryId,
        std::sync::mpsc::Sender<parsley::runtime::query::QueryAnswer>,
    >,
}

impl Shared {
    /// Adds what the worker restored and replaced since the last call to
    /// the instance's counts.
    fn count_restores(&mut self) {
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
        r.producers_replaced.fetch_add(
            now.producer_replacements - self.seen.producer_replacements,
            Ordering::Relaxed,
        );
        r.aborts
            .fetch_add(now.aborts - self.seen.aborts, Ordering::Relaxed);
        self.seen = now;
    }

    /// Publishes this thread's tasks as they are now (after a rebalance
    /// changed them), and whether the thread is ready.
    fn republish(&mut self) {
        self.count_restores();
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
    fn a_group_protocol_client_setting_is_a_choice_that_must_agree_with_the_options() {
        // Refused before any connection: the bootstrap address is never
        // dialled.
        for (asked, setting) in [
            (GroupProtocol::Classic, "consumer"),
            (GroupProtocol::Consumer, "classic"),
            (GroupProtocol::Auto, "cooperative"),
        ] {
            let mut c = ClientConfig::new();
            c.set("bootstrap.servers", "127.0.0.1:1")
                .set("group.protocol", setting);
            let mut s = CausalStreams::new(&app(), c)
                .unwrap()
                .with_options(StreamsOptions {
                    group_protocol: asked,
                    ..StreamsOptions::default()
                });
            match s.start() {
                Err(StreamsError::Config {
                    setting: name,
                    value,
                    ..
                }) => {
                    assert_eq!((name.as_str(), value.as_str()), ("group.protocol", setting));
                }
                other => panic!("{asked:?} with group.protocol={setting}: {other:?}"),
            }
            assert_eq!(s.state(), StreamsState::Created);
            assert_eq!(s.group_protocol(), None);
        }
        assert_eq!(
            GroupProtocol::from_setting(" Consumer "),
            Some(GroupProtocol::Consumer)
        );
        assert_eq!(
            GroupProtocol::from_setting("classic"),
            Some(GroupProtocol::Classic)
        );
        assert_eq!(
            StreamsOptions::default().group_protocol,
            GroupProtocol::Auto
        );
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
