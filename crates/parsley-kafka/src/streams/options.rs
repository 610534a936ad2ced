//! How the runtime runs an application: [`StreamsOptions`] and the group
//! protocol it names.

use super::*;

/// Which consumer group protocol the stream threads use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// Chosen at [`start`](CausalStreams::start) by what the cluster's
    /// brokers serve (their `group.coordinator.rebalance.protocols`): the
    /// consumer protocol where every broker serves it (Kafka 4.0 and
    /// later), else the classic one (Kafka 3.7 to 3.9, or brokers that
    /// could not be asked). The choice and its reason are logged once at
    /// INFO, and [`CausalStreams::group_protocol`] says which it was. A
    /// cluster that lists the consumer protocol but refuses it at the join
    /// (`UnsupportedVersion`: a 4.x cluster upgraded from 3.x whose
    /// `group.version` feature is still 0) has its stream threads join
    /// again with the classic protocol, with a WARN. A `group.protocol` in
    /// the client configuration counts as an explicit choice. The default.
    #[default]
    Auto,
    /// The consumer group protocol of KIP-848 (Kafka 4.0 and later), with
    /// the broker's range assignor: sticky, and partition `p` of
    /// co-partitioned topics goes to one member. Partitions move one by one
    /// as the group reconciles, so a task whose partitions stay keeps
    /// running through a rebalance with its state, open work and hold
    /// queues. Session and heartbeat timeouts are the broker's
    /// (`group.consumer.session.timeout.ms`); a client configuration's
    /// `session.timeout.ms` and `heartbeat.interval.ms` are ignored, with a
    /// warning. Asked for explicitly on a cluster whose brokers say they do
    /// not serve it, [`start`](CausalStreams::start) fails with
    /// [`StreamsError::GroupProtocolUnsupported`].
    Consumer,
    /// The classic protocol with the eager range assignor, for brokers
    /// older than 4.0: every rebalance revokes every partition of every
    /// member, and each task restarts from its changelogs.
    Classic,
}

impl GroupProtocol {
    /// The `group.protocol` client setting's value, for a protocol that is
    /// chosen.
    pub(super) fn name(self) -> Option<&'static str> {
        match self {
            GroupProtocol::Consumer => Some("consumer"),
            GroupProtocol::Classic => Some("classic"),
            GroupProtocol::Auto => None,
        }
    }

    /// The protocol a `group.protocol` client setting names.
    pub(super) fn from_setting(value: &str) -> Option<GroupProtocol> {
        match value.trim().to_ascii_lowercase().as_str() {
            "consumer" => Some(GroupProtocol::Consumer),
            "classic" => Some(GroupProtocol::Classic),
            _ => None,
        }
    }
}

/// The default [`StreamsOptions::commit_when_idle`]: a stream thread whose
/// fetch is drained commits once 10 ms of processing have passed since its
/// previous commit ended. Of the floors measured (5, 10 and 20 ms), 10
/// gave the best tail: 5 had a lower median but a p99 two to three times
/// higher (`docs/performance.md`).
pub const DEFAULT_COMMIT_WHEN_IDLE: Duration = Duration::from_millis(10);

/// How the runtime runs an application.
#[derive(Clone, Debug)]
pub struct StreamsOptions {
    /// Stream threads (consumers and transactional producers) in this
    /// instance.
    pub threads: usize,
    /// How long a transaction collects work before it commits. Emissions
    /// go to the producer while the transaction is open (a poll's worth at
    /// a time), so the transaction is open on its coordinator from its
    /// first record: it commits at half
    /// of the producer's `transaction.timeout.ms` (10 s unless set) at the
    /// latest, however long this is.
    pub commit_interval: Duration,
    /// Commit before the interval when the stream thread has drained its
    /// fetch, once this floor has passed since its previous commit ended:
    /// a trickle of records waits about the floor plus a commit instead of
    /// half an interval on average, while a stream that keeps the fetch
    /// busy commits every interval as before. 10 ms by default
    /// ([`DEFAULT_COMMIT_WHEN_IDLE`]): at 500 records a second on a local
    /// broker it cuts the median latency from about 60 ms to 15 ms, with
    /// full-speed throughput unchanged. The price is more, smaller
    /// transactions on a quiet stage (up to one per floor and commit,
    /// each a commit round trip and a marker in every partition it
    /// wrote). `None` commits every `commit_interval` only, as Kafka
    /// Streams does. The guide's limits page has the figures.
    pub commit_when_idle: Option<Duration>,
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
    /// The consumer group protocol; by default chosen at start by what the
    /// cluster serves ([`GroupProtocol::Auto`]).
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
    /// Where this instance answers state queries for the keys of its tasks
    /// (`host:port`, or a URL), as Kafka Streams' `application.server`:
    /// published with each stream thread's report, so any instance can
    /// tell a caller where a key lives ([`CausalStreams::query_host`]).
    /// Parsley does not serve it; the service that embeds the instance
    /// does. `None` publishes no endpoint.
    pub application_server: Option<String>,
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
    /// How many held records of each hold queue a task keeps in
    /// memory (the head and the ones right behind it); the others, once
    /// committed, are kept only in the task's committed store and read
    /// back in order when the gate reaches them. `None` keeps them all.
    /// 256 by default.
    pub hold_window: Option<usize>,
    /// How many held records a task releases per transaction at most,
    /// when a cause lets many go at once: the rest go in the next
    /// transactions, each committed as soon as the one before. Keeps the
    /// memory a large release takes (its deliveries, and a changelog
    /// delete per page of held records) to a transaction's worth. `None`
    /// sets no bound. 65,536 by default.
    pub release_per_transaction: Option<usize>,
    /// How much fold state the instance keeps in memory, in bytes, at
    /// most (an estimate of what the entries take), shared evenly by its
    /// stream threads and, within a thread, by its stateful tasks: the
    /// rest is read from each task's file in the state directory when a
    /// record needs it. Entries leave memory oldest write first, once the
    /// file holds them. Needs a state directory; without one (or with
    /// `None`) the whole fold state stays in memory. 64 MiB by default.
    pub fold_cache: Option<usize>,
    /// The replication factor of the topics the runtime creates (the
    /// changelogs, the control and diagnostics topics). `None` takes the
    /// broker's `default.replication.factor`. With a factor asked for,
    /// `start()` warns about an existing changelog replicated less, or
    /// whose `min.insync.replicas` lets one replica alone acknowledge a
    /// write while it has three or more (a broker lost then can take
    /// committed state with it).
    pub replication_factor: Option<i16>,
}

impl Default for StreamsOptions {
    fn default() -> Self {
        StreamsOptions {
            threads: 1,
            commit_interval: Duration::from_millis(100),
            commit_when_idle: Some(DEFAULT_COMMIT_WHEN_IDLE),
            truncation_interval: Duration::from_secs(600),
            start_policy: StartPolicy::Earliest,
            on_retention_loss: OnRetentionLoss::Fail,
            request_timeout: Duration::from_secs(30),
            restore_stall_timeout: Duration::from_secs(90),
            group_protocol: GroupProtocol::Auto,
            rejoin_backoff: Backoff::default(),
            task_backoff: Backoff::default(),
            instance_id: None,
            application_server: None,
            state_dir: Some(std::env::temp_dir().join("parsley-streams")),
            state_file_cache: crate::state_dir::DEFAULT_FILE_CACHE,
            static_membership: false,
            hold_budget: Some(parsley::runtime::worker::DEFAULT_HOLD_BUDGET),
            hold_window: Some(parsley::runtime::worker::DEFAULT_HOLD_WINDOW),
            release_per_transaction: Some(
                parsley::runtime::worker::DEFAULT_RELEASE_PER_TRANSACTION,
            ),
            fold_cache: Some(parsley::runtime::worker::DEFAULT_FOLD_CACHE),
            replication_factor: None,
        }
    }
}

/// How long a stream thread waits before it joins its group again, and a
/// failed task before it restarts (the worker's type): `initial` after the
/// first failure, doubling with each one in a row, up to `max`.
pub use parsley::runtime::worker::Backoff;

impl StreamsOptions {
    /// The worker configuration of one stream thread: the options that are
    /// the worker's, and what this host decides for it. The one place a
    /// new worker option is passed on.
    pub(super) fn worker_config(
        &self,
        protocol: GroupProtocol,
        txn_timeout: Duration,
        thread_id: String,
    ) -> WorkerConfig {
        WorkerConfig {
            commit_interval: self.commit_interval,
            commit_when_idle: self.commit_when_idle,
            truncation_interval: self.truncation_interval,
            start_policy: self.start_policy,
            on_retention_loss: self.on_retention_loss,
            task_backoff: self.task_backoff,
            // A transaction left unresolved on a changelog resolves within
            // its timeout (its coordinator aborts it then).
            changelog_stable_wait: txn_timeout + Duration::from_secs(5),
            assignment: match protocol {
                GroupProtocol::Consumer => parsley::runtime::worker::Assignment::Incremental,
                // Resolved at start; the classic protocol works everywhere.
                GroupProtocol::Classic | GroupProtocol::Auto => {
                    parsley::runtime::worker::Assignment::Complete
                }
            },
            thread_id,
            // Nothing here reads what the tasks did record by record.
            events: false,
            // Records go to the producer while the transaction is open,
            // a poll's worth at a time, so a commit pays for little more
            // than its end; a transaction open that long ends at half its
            // timeout, well before its coordinator would end it.
            stream_records: Some(Streaming::within(txn_timeout / 2)),
            // Replays run on the thread's restore thread, so the ready tasks
            // go on processing meanwhile.
            restores: parsley::runtime::worker::RestoreMode::Deferred,
            hold_budget: self.hold_budget,
            hold_window: self.hold_window,
            release_per_transaction: self.release_per_transaction,
            // The instance's share, split between its threads.
            fold_cache: self.fold_cache.map(|b| b / self.threads.max(1)),
            ..WorkerConfig::default()
        }
    }
}
