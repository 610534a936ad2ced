//! The task runner: everything a stage task does, with no I/O.
//!
//! A task is one stage consuming one partition number `p` of each of its
//! source topics (and of its tick topic). [`Task`] owns the task's
//! [`CausalNode`], its fold state and its tick schedule, and does all the
//! per-record work: splitting the causal headers off a fetched record,
//! gating it, decoding a delivery with the source topic's codecs, applying
//! the handler or fold, reading and writing fold state, emitting ticks,
//! partitioning each emission (Kafka's default murmur2 partitioner on the
//! encoded key; see [`partition`](crate::partition)), stamping it, and
//! encoding it. Every host drives this same code: the broker-less
//! [`TestDriver`](crate::TestDriver) and the Kafka runtime.
//!
//! # What a host supplies
//!
//! The log, the wall clock and the commit; nothing else:
//!
//! * topic metadata by name ([`TopicMetadata`]: topic id and partition
//!   count) and broker offsets ([`BrokerOffsets`]) at init;
//! * fetched records through [`Task::on_record`], per channel in strictly
//!   increasing offset order (a `read_committed` view), and consumer
//!   positions through [`Task::position_advance`], only once every record
//!   below the position went through `on_record`, starting with the
//!   position each consumer resumes from right after [`Task::init`] (the
//!   node does not persist positions it was told);
//! * the wall clock through [`Task::punctuate`] (ticks and hold warnings);
//! * the commit: [`Task::take_commit`] hands over the records to append
//!   (already partitioned, stamped and encoded) and the changelog records
//!   of both stores. The host appends them and commits them with the
//!   consumed positions in one transaction, then tells the task with
//!   [`Task::commit_done`].
//!
//! The task owns its committed stores ([`TaskStores`]: the protocol store
//! and the fold store) and keeps the open transaction's writes apart from
//! them, so an abort never copies a store.
//!
//! # Failure
//!
//! Any error is final for the task object: the host aborts the transaction
//! and rebuilds the task from its committed stores with [`Task::reset`],
//! then refetches from the committed positions. A task that returned an
//! error refuses every later call with [`TaskError::Poisoned`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use parsley_protocol::clock::ClockVersion;
use parsley_protocol::headers::is_causal_header;
use parsley_protocol::{
    BrokerOffsets, CausalHeaders, CausalNode, Channel, CorruptHeader, Delivery, Header,
    InboundRecord, MemStore, NodeConfig, PageRequest, ProtocolError, StateKey, SteppedPast,
    TopicId, TruncationReport, VectorClock, WriteBatch,
};
use tracing::{debug, info, warn};

use crate::app::Parsley;
use crate::codec::CodecError;
use crate::fold::{FoldEntry, FoldKey, FoldStore, FoldWrites, StateSource};
use crate::holds::{HeldRecord, WaitingOn};
use crate::logic::LogicError;
use crate::message::{Coordinate, Tick};
use crate::partition::partition_for;
use crate::stage::{Failure, Outcome, RawInput, Stage, StateWrite};
use crate::topic::{AnyTopic, Emission, Part};

/// A topic as the cluster (or the test driver) describes it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TopicDescription {
    /// The topic's id.
    pub id: TopicId,
    /// Its partition count.
    pub partitions: i32,
}

/// A topic lookup that could not be answered.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum MetadataError {
    /// The topic does not exist.
    #[error("topic {0:?} does not exist; create it before starting the application")]
    Missing(String),
    /// The lookup failed.
    #[error("metadata lookup for topic {topic:?} failed: {message}")]
    Failed {
        /// The topic.
        topic: String,
        /// What went wrong.
        message: String,
    },
    /// A changelog replay stopped making progress: nothing arrived for
    /// `stalled_for` while the partition's end lay ahead (an upstream
    /// transaction left open blocks a `read_committed` replay, or the
    /// broker stopped serving it). Not retried at once: the task fails.
    #[error(
        "the replay of changelog {topic}:{partition} made no progress for {stalled_for:?}: it had read up to offset {at} and the partition ends at {end}"
    )]
    Stalled {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The next offset the replay was waiting for.
        at: i64,
        /// The partition's end (high watermark) when it gave up.
        end: i64,
        /// How long nothing arrived.
        stalled_for: std::time::Duration,
    },
}

/// Topic metadata by name, supplied by the host.
pub trait TopicMetadata {
    /// The id and partition count of `topic`.
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError>;
}

pub use crate::runtime::identity::TaskId;

/// A record as the host fetched it: raw bytes and every header, the causal
/// ones included.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FetchedRecord {
    /// The channel it was fetched from.
    pub channel: Channel,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
    /// Key bytes; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None` is a null value.
    pub value: Option<Vec<u8>>,
    /// All headers, in record order.
    pub headers: Vec<Header>,
}

/// Where an emission came from: the delivered record (or tick) whose logic
/// made it, and its place among that delivery's emissions (from 0). The
/// same delivery, handled again after an abort, makes the same emissions
/// in the same places, as long as the logic is deterministic.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct EmissionOrigin {
    /// The delivered record's channel.
    pub channel: Channel,
    /// Its offset.
    pub offset: i64,
    /// The emission's place among those the delivery made.
    pub ordinal: u32,
}

/// An emission to send to a dead-letter topic instead of its sink: the
/// sink (or the client) refused it, and the host's production error
/// handler chose the dead-letter topic.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Diversion {
    /// The dead-letter topic.
    pub topic: String,
    /// Its partition count.
    pub partitions: i32,
    /// Why the sink refused the emission.
    pub reason: String,
}

/// Header naming the sink a dead-lettered emission was refused by (the
/// other `parsley.dlq.*` headers name the delivery that made it).
pub const DEAD_LETTER_SINK: &str = "parsley.dlq.sink";

/// A record the host must append: partitioned, stamped and encoded.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OutgoingRecord {
    /// The destination topic.
    pub topic: String,
    /// The destination partition.
    pub partition: i32,
    /// Key bytes; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None` is a null value.
    pub value: Option<Vec<u8>>,
    /// The record timestamp.
    pub timestamp: i64,
    /// The headers: `vc`, `vc-sender`, `vc-seq`, then the emission's own.
    pub headers: Vec<Header>,
    /// The emission it is, if it is one (not a changelog record or a
    /// tick).
    pub origin: Option<EmissionOrigin>,
}

/// Something a task did, in the order it happened.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TaskEvent {
    /// A record reached the stage's logic.
    Delivered(DeliveredRecord),
    /// A fetched record was held at the gate.
    Held {
        /// The held record.
        coordinate: Coordinate,
    },
    /// A record was stamped and queued for the transaction (an emission or
    /// a tick).
    Sent {
        /// The destination topic.
        topic: String,
        /// The destination partition.
        partition: i32,
        /// True for a tick.
        tick: bool,
    },
    /// An input record was stepped past: sent, unchanged, to a dead-letter
    /// topic instead of delivered.
    SteppedPast {
        /// The record.
        coordinate: Coordinate,
        /// The dead-letter topic.
        topic: String,
        /// Its partition.
        partition: i32,
    },
    /// An emission went to a dead-letter topic instead of its sink, as the
    /// host asked ([`Diversion`]): unstamped, so it claims nothing and
    /// nothing claims it.
    Diverted {
        /// The dead-letter topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The sink it was meant for.
        sink: String,
    },
}

/// A record that reached the stage's logic in this transaction.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DeliveredRecord {
    /// The record's own coordinate.
    pub coordinate: Coordinate,
    /// The record's timestamp.
    pub timestamp: i64,
    /// True when it waited in a hold queue.
    pub was_held: bool,
    /// True for a tick.
    pub tick: bool,
}

/// What a host commits for one transaction of a task.
#[derive(Debug, Default)]
pub struct TaskCommit {
    /// Records to append, in send order (emissions and ticks).
    pub records: Vec<OutgoingRecord>,
    /// Changelog records of the protocol store, then of the fold store, in
    /// key order (a delete is a tombstone).
    pub changelog: Vec<OutgoingRecord>,
    /// What the task did, in order.
    pub events: Vec<TaskEvent>,
}

impl TaskCommit {
    /// True when the transaction changed nothing.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.changelog.is_empty() && self.events.is_empty()
    }
}

/// A task's committed stores: what it starts from, and what it keeps
/// committed while it runs.
#[derive(Clone, Default, Debug)]
pub struct TaskStores {
    /// The protocol store.
    pub protocol: MemStore,
    /// The fold store.
    pub fold: FoldStore,
    /// Where held records are read back from once they leave `protocol`.
    pub held: crate::runtime::paging::HeldPages,
    /// Not a store: how many held records a release of the task pages in
    /// per transaction (see [`Task::set_release_cap`]), set by the host
    /// before the task starts so that the start's own release keeps to it
    /// too. `None`: no bound.
    pub release_cap: Option<usize>,
    /// Emissions to send to a dead-letter topic instead of their sink. Not
    /// a store: the host sets them after a refusal, until the delivery that
    /// makes them commits.
    pub diverted: BTreeMap<EmissionOrigin, Diversion>,
}

impl TaskStores {
    /// The sequence number of the last commit applied, counted since the
    /// stores began reading through a local store: what the host puts on
    /// that commit's local write ([`LocalWrite::seq`](crate::runtime::local::LocalWrite::seq)).
    /// The fold store and the held records count the same commits from
    /// the same attach.
    pub fn local_seq(&self) -> u64 {
        if self.fold.is_bounded() {
            self.fold.seq()
        } else {
            self.held.seq()
        }
    }

    /// Whether part of the committed state is only in the local store (a
    /// store that fails then loses it): fold state beyond the cache, or a
    /// held record whose copy left memory.
    pub fn reads_through_local(&self) -> bool {
        self.fold.is_bounded() || (self.held.is_attached() && self.held_only_on_disk())
    }

    /// Whether some committed held record is not in `protocol`.
    fn held_only_on_disk(&self) -> bool {
        use parsley_protocol::store::{StateKey, StoreRead, decode_pair};
        let (mut queued, mut present) = (0i64, 0i64);
        self.protocol.for_each_state(&mut |key, value| match key {
            Ok(StateKey::QueueMeta(_)) => {
                if let Ok((head, tail)) = decode_pair(value) {
                    queued += tail - head;
                }
            }
            Ok(StateKey::QueueEntry(..)) => present += 1,
            _ => {}
        });
        queued > present
    }

    /// Stops reading held records from the local store (it was wiped and
    /// every held record is still in memory): none leaves memory from now
    /// on.
    pub fn detach_held(&mut self) {
        self.held = crate::runtime::paging::HeldPages::default();
    }
}

/// The writes of a transaction handed to the host and not yet known to be
/// committed.
#[derive(Debug, Default)]
struct InFlight {
    protocol: WriteBatch,
    fold: FoldWrites,
}

/// A consumed channel of a task.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct InputChannel {
    /// The topic name.
    pub topic: String,
    /// The channel.
    pub channel: Channel,
    /// True for the stage's tick topic.
    pub tick: bool,
}

/// Why a task failed. After any of these, the host aborts the transaction
/// and restarts the task from committed state.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The protocol refused (a guard of the delivery gate, the stamp or
    /// restore).
    #[error("task {task}: {cause}")]
    Protocol {
        /// The task.
        task: TaskId,
        /// The protocol's error.
        cause: ProtocolError,
    },
    /// A topic could not be described.
    #[error("task {task}: {cause}")]
    Metadata {
        /// The task.
        task: TaskId,
        /// The lookup error.
        cause: MetadataError,
    },
    /// A record that has to wait at the gate is larger than the most a
    /// task may hold. Nothing is dropped: the record stays in its topic
    /// and is fetched again when the task restarts.
    #[error(
        "task {task}: record {coordinate} has to wait for its causes, but holding it takes {size} bytes and the task may hold at most {budget}; raise the hold budget (WorkerConfig::hold_budget, StreamsOptions::hold_budget) above the largest record a stage may have to hold"
    )]
    HoldBudget {
        /// The task.
        task: TaskId,
        /// The record.
        coordinate: Coordinate,
        /// What holding it takes ([`InboundRecord::held_size`]).
        size: usize,
        /// The budget.
        budget: usize,
    },
    /// The task cannot be built as asked.
    #[error("task {task}: {message}")]
    Config {
        /// The task.
        task: TaskId,
        /// What is wrong.
        message: String,
    },
    /// A record's `vc`, `vc-sender` or `vc-seq` header is corrupt.
    #[error("task {task}: record {coordinate} has corrupt causal headers: {cause}")]
    CorruptHeaders {
        /// The task.
        task: TaskId,
        /// The record.
        coordinate: Coordinate,
        /// What is wrong.
        cause: CorruptHeader,
    },
    /// A delivered record did not decode with its topic's codecs.
    #[error(
        "task {task}: the {part} of record {coordinate} does not decode with the topic's codec: {cause}"
    )]
    Decode {
        /// The task.
        task: TaskId,
        /// The record.
        coordinate: Coordinate,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// An emission did not encode with its topic's codecs.
    #[error(
        "task {task}: while handling {coordinate}, the {part} of an emission to {topic:?} does not encode: {cause}"
    )]
    Encode {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The emission's topic.
        topic: String,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// Stored fold state did not decode, or new state did not encode.
    #[error("task {task}: while handling {coordinate}, the state codec failed: {cause}")]
    StateCodec {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The codec's error.
        cause: CodecError,
    },
    /// Fold state that left memory could not be read back from the task's
    /// local store, or the local store stopped taking its writes, so the
    /// state beyond the cache is no longer known. The task restarts from
    /// its changelogs (the truth); nothing it computed is committed.
    #[error(
        "task {task}: its fold state beyond the cache cannot be read from its local store ({cause}); check the disk under the state directory (StreamsOptions::state_dir), or give the fold cache room for the whole state (StreamsOptions::fold_cache)"
    )]
    LocalStore {
        /// The task.
        task: TaskId,
        /// What the store said.
        cause: crate::runtime::local::LocalStoreError,
    },
    /// A handler or fold returned an error it did not recover from.
    #[error("task {task}: logic failed on {coordinate}: {cause}")]
    Logic {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The logic's error.
        cause: LogicError,
    },
    /// A handler or fold panicked.
    #[error("task {task}: logic panicked on {coordinate}: {message}")]
    Panic {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The panic message.
        message: String,
    },
    /// Logic emitted to a topic the stage did not declare as a sink.
    #[error(
        "task {task}: while handling {coordinate}, logic emitted to {topic:?}, which is not a declared sink of the stage; add .sink(..) for it"
    )]
    UndeclaredSink {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The undeclared topic.
        topic: String,
    },
    /// A stage's source topics (and its tick topic) disagree on partition
    /// count. A task consumes partition `p` of every source, so with
    /// unequal counts some tasks would miss a source and related keys would
    /// not meet in one task.
    #[error(
        "task {task}: the stage's topics must all have the same partition count, but {}; recreate them with equal counts",
        counts.iter().map(|(t, n)| format!("{t:?} has {n}")).collect::<Vec<_>>().join(", ")
    )]
    PartitionCounts {
        /// The task.
        task: TaskId,
        /// Each source (and the tick topic) with its partition count.
        counts: Vec<(String, i32)>,
    },
    /// An emission to a declared sink's name, minted by a `Topic` of other
    /// key or value types than the declared sink.
    #[error(
        "task {task}: while handling {coordinate}, logic emitted to {topic:?} with key or value types other than the declared sink's {declared}; emit through the topic declared with .sink(..)"
    )]
    SinkTypes {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The topic.
        topic: String,
        /// The declared sink's types.
        declared: String,
    },
    /// An emission with a timestamp below zero, which Kafka refuses.
    #[error(
        "task {task}: while handling {coordinate}, an emission to {topic:?} has timestamp {timestamp}; Kafka accepts only timestamps of 0 or more"
    )]
    NegativeTimestamp {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The topic.
        topic: String,
        /// The timestamp.
        timestamp: i64,
    },
    /// An emission sets one of the causal headers, which only the runtime
    /// writes.
    #[error(
        "task {task}: while handling {coordinate}, an emission to {topic:?} sets header {header:?}, which is reserved for the causal stamp; use another name"
    )]
    ReservedHeader {
        /// The task.
        task: TaskId,
        /// The record being handled.
        coordinate: Coordinate,
        /// The topic.
        topic: String,
        /// The reserved header.
        header: String,
    },
    /// A commit was taken while an earlier one was still in flight.
    #[error("task {task}: a transaction is already in flight; report its outcome first")]
    InFlight {
        /// The task.
        task: TaskId,
    },
    /// The task failed earlier and must be discarded.
    #[error("task {task} failed earlier; discard it and start a new one from committed state")]
    Poisoned {
        /// The task.
        task: TaskId,
    },
}

impl TaskError {
    /// The failed task.
    pub fn task(&self) -> &TaskId {
        match self {
            TaskError::Protocol { task, .. }
            | TaskError::Metadata { task, .. }
            | TaskError::Config { task, .. }
            | TaskError::HoldBudget { task, .. }
            | TaskError::LocalStore { task, .. }
            | TaskError::CorruptHeaders { task, .. }
            | TaskError::Decode { task, .. }
            | TaskError::Encode { task, .. }
            | TaskError::StateCodec { task, .. }
            | TaskError::Logic { task, .. }
            | TaskError::Panic { task, .. }
            | TaskError::UndeclaredSink { task, .. }
            | TaskError::PartitionCounts { task, .. }
            | TaskError::SinkTypes { task, .. }
            | TaskError::NegativeTimestamp { task, .. }
            | TaskError::ReservedHeader { task, .. }
            | TaskError::InFlight { task }
            | TaskError::Poisoned { task } => task,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum SourceSlot {
    User(usize),
    Ticks,
}

#[derive(Clone)]
struct SinkInfo {
    id: TopicId,
    partitions: i32,
    /// The version its outputs' `vc` is written in.
    clock: ClockVersion,
    /// The declared sink: its types and codecs are the ones that encode.
    topic: AnyTopic,
}

/// What the hold gauges read.
pub(crate) struct HoldGauges {
    pub(crate) held: usize,
    pub(crate) age_max_ms: i64,
    /// (topic, held, head age) per source channel.
    pub(crate) channels: Vec<(String, usize, i64)>,
}

#[derive(Clone, Copy, Debug)]
struct HoldTrack {
    offset: i64,
    since: i64,
    warned: bool,
}

/// Counters since init.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct TaskStats {
    /// Records delivered to logic (ticks included).
    pub delivered: u64,
    /// Of those, records that had waited in a hold queue.
    pub delivered_after_hold: u64,
    /// Records emitted (ticks included).
    pub emitted: u64,
    /// Ticks emitted.
    pub ticks_emitted: u64,
    /// `vc-hold-*` warnings logged (one per hold that outlived the
    /// stage's threshold).
    pub hold_warnings: u64,
    /// Emissions sent to a dead-letter topic instead of their sink.
    pub diverted: u64,
    /// Input records stepped past (sent to a dead-letter topic instead of
    /// delivered).
    pub stepped_past: u64,
}

/// The most room for deliveries a task keeps between records.
const KEPT_DELIVERY_ROOM: usize = 256;

/// One stage task, sans I/O. See the [module documentation](self).
pub struct Task {
    app: Parsley,
    stage: Stage,
    id: TaskId,
    node: CausalNode,
    inputs: Vec<InputChannel>,
    slots: BTreeMap<TopicId, SourceSlot>,
    names: BTreeMap<TopicId, std::sync::Arc<str>>,
    sinks: BTreeMap<String, SinkInfo>,
    tick_route: Option<(String, Channel)>,
    stores: TaskStores,
    in_flight: Option<InFlight>,
    pending_fold: FoldWrites,
    outgoing: Vec<OutgoingRecord>,
    events: Vec<TaskEvent>,
    /// Whether `events` is kept (see [`Task::set_record_events`]).
    record_events: bool,
    /// A record was delivered or held since the last commit: the next
    /// transaction has work (its positions and protocol writes) even when
    /// no event is kept.
    acted: bool,
    /// Reused for the node's deliveries of each record (up to
    /// [`KEPT_DELIVERY_ROOM`] of room).
    deliveries: Vec<Delivery>,
    wall_clock: i64,
    next_tick_at: Option<i64>,
    /// The tick schedule as of the transaction in flight, then as of the
    /// last commit: what an abort resumes.
    in_flight_tick_at: Option<i64>,
    committed_tick_at: Option<i64>,
    holds: BTreeMap<Channel, HoldTrack>,
    /// The most the task may hold, in bytes, if bounded.
    hold_budget: Option<usize>,
    /// Held records a release may page in per transaction (`None`: no
    /// bound); the rest wait for the next one.
    release_cap: Option<usize>,
    /// Held records paged in since the last transaction was handed over.
    paged_in_since_commit: usize,
    /// Channels whose fetching is paused for the hold budget: an arriving
    /// record with an unmet claim on one of them is noted in
    /// `arrival_claims`, for the host core to resume it.
    watched: Vec<Channel>,
    arrival_claims: Vec<Channel>,
    poisoned: bool,
    stats: TaskStats,
    /// Partition counts of the dead-letter topics records are stepped past
    /// to.
    dead_letters: BTreeMap<String, i32>,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.id)
            .field("inputs", &self.inputs)
            .field("held", &self.node.held_count())
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Task {
    /// Starts task `partition` of `stage` from committed state: describes
    /// its topics, initialises the causal node (restore, rescope, own-output
    /// seed), loads the fold state, and processes whatever the node released
    /// during init. Those records' outputs belong to the first transaction.
    ///
    /// A task consumes partition `partition` of each source topic. All of a
    /// stage's sources, and its tick topic, must have the same partition
    /// count ([`TaskError::PartitionCounts`] otherwise).
    pub fn init(
        app: &Parsley,
        stage: &str,
        partition: i32,
        stores: TaskStores,
        metadata: &dyn TopicMetadata,
        broker: &dyn BrokerOffsets,
        now_ms: i64,
    ) -> Result<Task, TaskError> {
        let id = TaskId {
            stage: stage.to_owned(),
            partition,
        };
        let config_err = |message: String| TaskError::Config {
            task: id.clone(),
            message,
        };
        let Some(stage_def) = app.stage(stage).cloned() else {
            return Err(config_err(format!(
                "application {:?} has no stage {stage:?}",
                app.application_id()
            )));
        };
        let describe = |topic: &str| {
            metadata
                .describe(topic)
                .map_err(|source| TaskError::Metadata {
                    task: id.clone(),
                    cause: source,
                })
        };
        let mut inputs = Vec::new();
        let mut slots = BTreeMap::new();
        let mut names = BTreeMap::new();
        let mut counts: Vec<(String, i32)> = Vec::new();
        for (i, src) in stage_def.def.sources.iter().enumerate() {
            let name = src.topic.name();
            let d = describe(name)?;
            counts.push((name.to_owned(), d.partitions));
            slots.insert(d.id, SourceSlot::User(i));
            names.insert(d.id, name.into());
            inputs.push(InputChannel {
                topic: name.to_owned(),
                channel: Channel::new(d.id, partition),
                tick: false,
            });
        }
        let mut sinks = BTreeMap::new();
        for sink in &stage_def.def.sinks {
            let d = describe(sink.name())?;
            names.insert(d.id, sink.name().into());
            sinks.insert(
                sink.name().to_owned(),
                SinkInfo {
                    id: d.id,
                    partitions: d.partitions,
                    clock: if stage_def.writes_compact_clock(sink.name()) {
                        ClockVersion::Compact
                    } else {
                        ClockVersion::V1
                    },
                    topic: sink.clone(),
                },
            );
        }
        let mut tick_route = None;
        if let Some(tick_topic) = app.tick_topic(stage) {
            let d = describe(tick_topic)?;
            counts.push((tick_topic.to_owned(), d.partitions));
            let channel = Channel::new(d.id, partition);
            slots.insert(d.id, SourceSlot::Ticks);
            names.insert(d.id, tick_topic.into());
            inputs.push(InputChannel {
                topic: tick_topic.to_owned(),
                channel,
                tick: true,
            });
            tick_route = Some((tick_topic.to_owned(), channel));
        }
        let tasks = counts.first().map_or(0, |(_, n)| *n);
        if counts.iter().any(|(_, n)| *n != tasks) {
            return Err(TaskError::PartitionCounts {
                task: id.clone(),
                counts,
            });
        }
        if partition < 0 || partition >= tasks {
            return Err(config_err(format!(
                "partition {partition} is out of range: the stage's topics have {tasks} partition(s)"
            )));
        }
        inputs.sort_by_key(|i| i.channel);
        let config = NodeConfig {
            sender: app.sender_id(stage, partition),
            inputs: inputs.iter().map(|i| i.channel).collect(),
            sinks: sinks
                .values()
                .map(|s| s.id)
                .chain(tick_route.as_ref().map(|(_, c)| c.topic))
                .collect(),
        };
        // Held records that only the local store holds are read from it,
        // and those beyond the window are never decoded into memory.
        let view = stores.held.view(&stores.protocol);
        let init = CausalNode::init_windowed(config, &view, broker, stores.held.window());
        if let Some(cause) = view.failure() {
            return Err(TaskError::LocalStore {
                task: id.clone(),
                cause,
            });
        }
        drop(view);
        let init = init.map_err(|source| TaskError::Protocol {
            task: id.clone(),
            cause: source,
        })?;
        info!(
            task = %id,
            channels = ?inputs.iter().map(|i| format!("{} -> {}", i.topic, i.channel)).collect::<Vec<_>>(),
            restored_held = init.report.restored_held,
            released_at_init = init.deliveries.len(),
            "task initialised"
        );
        let next_tick_at = stage_def
            .tick_interval()
            .map(|d| next_grid_point(now_ms, ms(d)));
        let mut task = Task {
            app: app.clone(),
            stage: stage_def,
            id,
            node: init.node,
            inputs,
            slots,
            names,
            sinks,
            tick_route,
            stores,
            in_flight: None,
            pending_fold: FoldWrites::new(),
            outgoing: Vec::new(),
            events: Vec::new(),
            record_events: true,
            acted: false,
            deliveries: Vec::new(),
            wall_clock: now_ms,
            next_tick_at,
            in_flight_tick_at: next_tick_at,
            committed_tick_at: next_tick_at,
            holds: BTreeMap::new(),
            hold_budget: None,
            release_cap: None,
            paged_in_since_commit: 0,
            watched: Vec::new(),
            arrival_claims: Vec::new(),
            poisoned: false,
            stats: TaskStats::default(),
            dead_letters: BTreeMap::new(),
        };
        // The dead-letter topics this task may step records past to: the
        // stage's own, and any an operator recorded in the store.
        let mut dead: Vec<String> = task
            .node
            .stepped()
            .map(|(_, _, s)| s.dead_letter.clone())
            .collect();
        dead.extend(task.stage.corrupt_headers_dead_letter().map(str::to_owned));
        for topic in dead {
            if !task.dead_letters.contains_key(&topic) {
                let d = metadata
                    .describe(&topic)
                    .map_err(|cause| TaskError::Metadata {
                        task: task.id.clone(),
                        cause,
                    })?;
                task.dead_letters.insert(topic, d.partitions);
            }
        }
        task.set_release_cap(task.stores.release_cap);
        let mut deliveries = init.deliveries;
        task.release(&mut deliveries)?;
        task.refresh_holds();
        Ok(task)
    }

    /// Whether the task lists what it did ([`TaskEvent`]s) in each
    /// [`TaskCommit`]. On by default; a host that never reads the events
    /// (the Kafka runtime) turns it off and saves their allocations, a few
    /// per record. Whether a transaction has work does not depend on it.
    pub fn set_record_events(&mut self, on: bool) {
        self.record_events = on;
        if !on {
            // Those of records init released, before the host could say.
            self.events.clear();
        }
    }

    /// Bounds what one held record may take ([`InboundRecord::held_size`]):
    /// a record larger than `budget` that has to wait fails the task with
    /// [`TaskError::HoldBudget`]. `None` (the default) sets no bound.
    pub fn set_hold_budget(&mut self, budget: Option<usize>) {
        self.hold_budget = budget;
    }

    /// Keeps at most `window` held records of each hold queue in the
    /// node's memory (`None`: all of them). The rest stay in the task's
    /// committed protocol store, where every held record is written at
    /// commit, and are read back in order as the gate reaches them (see
    /// [`CausalNode::set_resident_window`]). Returns how many records left
    /// memory now (restored holds beyond the window).
    pub fn set_hold_window(&mut self, window: Option<usize>) -> usize {
        self.node.set_resident_window(window)
    }

    /// Hands `deliveries` to the logic, in order, then serves the node's
    /// page requests (from the transaction in flight, the committed
    /// protocol store, or the local store) and hands over what each page
    /// releases, until the node asks for nothing more. A page's records
    /// reach the logic before the next page is read, so a release of a
    /// million held records never has them all decoded at once. A held
    /// record the stores do not have, or that does not decode, fails the
    /// task: it is never skipped.
    ///
    /// With a release cap ([`set_release_cap`](Self::set_release_cap)),
    /// it stops paging in once the open transaction has paged in that
    /// many records: the queues wait, and the host resumes the release
    /// after the commit ([`resume_release`](Self::resume_release)).
    fn release(&mut self, deliveries: &mut Vec<Delivery>) -> Result<(), TaskError> {
        loop {
            for d in deliveries.drain(..) {
                self.process(d)?;
            }
            if self.release_full() {
                return Ok(());
            }
            let requests = self.node.page_requests();
            if requests.is_empty() {
                return Ok(());
            }
            for request in requests {
                let records = self.read_paged(request)?;
                self.paged_in_since_commit += records.len();
                self.node
                    .page_in(request.channel, records, deliveries)
                    .map_err(|e| self.protocol(e))?;
            }
        }
    }

    fn release_full(&self) -> bool {
        self.release_cap
            .is_some_and(|cap| self.paged_in_since_commit >= cap)
    }

    /// Bounds how many held records a release pages in per transaction
    /// (`None`, the default: no bound). A release larger than that goes
    /// out over several transactions, each carrying its share of the
    /// deliveries and of the deletes of the records released, instead of
    /// one transaction of them all.
    pub fn set_release_cap(&mut self, cap: Option<usize>) {
        self.release_cap = cap.map(|c| c.max(1));
        self.stores.release_cap = self.release_cap;
    }

    /// Whether a release stopped at the cap and waits for the next
    /// transaction ([`resume_release`](Self::resume_release)).
    pub fn release_waiting(&self) -> bool {
        self.release_full() && self.node.pages_wanted()
    }

    /// Whether a release waits for held records to be paged in and the
    /// open transaction has room for them
    /// ([`resume_release`](Self::resume_release) would go on).
    pub fn release_resumable(&self) -> bool {
        !self.release_full() && self.node.pages_wanted()
    }

    /// Goes on with a release that stopped at the cap, once the open
    /// transaction has been handed over. Returns whether it did (false when
    /// none waits, or the open transaction is full already).
    pub fn resume_release(&mut self) -> Result<bool, TaskError> {
        if !self.release_resumable() {
            return Ok(false);
        }
        self.guarded(|t| {
            t.release(&mut Vec::new())?;
            t.refresh_holds();
            Ok(())
        })?;
        Ok(true)
    }

    /// The held records of a page request: from the transaction in flight,
    /// the committed store, or (for those that left memory) the local
    /// store, in one range read.
    fn read_paged(&self, request: PageRequest) -> Result<Vec<InboundRecord>, TaskError> {
        let PageRequest {
            channel,
            from,
            count,
        } = request;
        let to = from.saturating_add(count as i64);
        let decode = |index: i64, bytes: &[u8]| {
            parsley_protocol::store::decode_envelope(channel, bytes).map_err(|reason| {
                self.protocol(ProtocolError::CorruptState(
                    parsley_protocol::store::CorruptState {
                        key: StateKey::QueueEntry(channel, index).to_key(),
                        reason,
                    },
                ))
            })
        };
        let mut records: Vec<Option<InboundRecord>> = Vec::with_capacity(count);
        let mut first_missing = None;
        for index in from..to {
            let key = StateKey::QueueEntry(channel, index);
            let bytes = match self.in_flight.as_ref().and_then(|f| f.protocol.get(key)) {
                Some(written) => written,
                None => self.stores.protocol.get_state(key),
            };
            match bytes {
                Some(bytes) => records.push(Some(decode(index, bytes)?)),
                None => {
                    first_missing.get_or_insert(index);
                    records.push(None);
                }
            }
        }
        if let Some(start) = first_missing {
            let mut failed = None;
            let read = self
                .stores
                .held
                .read(channel, start, to, &mut |index, bytes| {
                    if failed.is_some() {
                        return;
                    }
                    let Some(slot) = usize::try_from(index - from)
                        .ok()
                        .and_then(|at| records.get_mut(at))
                    else {
                        return;
                    };
                    if slot.is_none() {
                        match decode(index, bytes) {
                            Ok(r) => *slot = Some(r),
                            Err(e) => failed = Some(e),
                        }
                    }
                });
            if let Err(cause) = read {
                return Err(TaskError::LocalStore {
                    task: self.id.clone(),
                    cause,
                });
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        records
            .into_iter()
            .zip(from..)
            .map(|(r, index)| {
                r.ok_or_else(|| {
                    self.protocol(ProtocolError::MissingHeldRecords {
                        channel,
                        index,
                        head: from,
                        tail: to,
                    })
                })
            })
            .collect()
    }

    /// The channels whose fetching the host paused for the hold budget:
    /// from now on, the channels among them an arriving record has an
    /// unmet claim on are noted ([`take_arrival_claims`](Self::take_arrival_claims)).
    pub fn watch(&mut self, channels: impl IntoIterator<Item = Channel>) {
        self.watched.clear();
        self.watched.extend(channels);
    }

    /// The watched channels records handed over since the last call have
    /// unmet claims on, sorted, without repeats.
    pub fn take_arrival_claims(&mut self) -> Vec<Channel> {
        let mut out = std::mem::take(&mut self.arrival_claims);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The task's identity.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// The application the task belongs to.
    pub fn app(&self) -> &Parsley {
        &self.app
    }

    /// The channels to fetch, sorted by channel.
    pub fn inputs(&self) -> &[InputChannel] {
        &self.inputs
    }

    /// Where to start fetching channels that joined the scope and were
    /// seeded from the task's past (see `CausalNode::resume_positions`);
    /// other channels resume from the committed positions.
    pub fn resume_positions(&self) -> &BTreeMap<Channel, i64> {
        self.node.resume_positions()
    }

    /// When the next tick is due (host wall clock), if the stage ticks.
    pub fn next_tick_at(&self) -> Option<i64> {
        self.next_tick_at
    }

    /// Counters since init.
    pub fn stats(&self) -> TaskStats {
        self.stats
    }

    /// The causal node, read-only (diagnostics, gauges).
    pub fn node(&self) -> &CausalNode {
        &self.node
    }

    /// Tells the task the host's clock without punctuating (no tick, no
    /// warning): hold ages then start from the hand-over that made a head,
    /// not from the last punctuation.
    pub fn observe_time(&mut self, now_ms: i64) {
        self.wall_clock = self.wall_clock.max(now_ms);
    }

    /// Hands over one fetched record. Records of one channel must come in
    /// strictly increasing offset order.
    pub fn on_record(&mut self, record: FetchedRecord) -> Result<(), TaskError> {
        self.guarded(|t| t.on_record_inner(record))
    }

    /// Reports the consumer position of a channel: every offset below
    /// `position` has been handed to [`on_record`](Self::on_record) or was
    /// skipped by the consumer (transaction markers, aborted records).
    pub fn position_advance(&mut self, channel: Channel, position: i64) -> Result<(), TaskError> {
        self.guarded(|t| {
            let mut deliveries = t
                .node
                .position_advance(channel, position)
                .map_err(|e| t.protocol(e))?;
            t.release(&mut deliveries)?;
            t.refresh_holds();
            Ok(())
        })
    }

    /// Tells the task the wall-clock time: emits a tick if one is due, and
    /// logs a `vc-hold-*` warning once for each hold older than the stage's
    /// threshold. Ticks fall due on a fixed grid, the multiples of the
    /// interval since the epoch, so a late punctuation does not push the
    /// schedule back; one call emits one tick at most, so a clock that
    /// jumps over several grid points gives one tick, not one per point.
    pub fn punctuate(&mut self, now_ms: i64) -> Result<(), TaskError> {
        self.guarded(|t| {
            t.wall_clock = t.wall_clock.max(now_ms);
            if let (Some(at), Some(interval)) = (t.next_tick_at, t.stage.tick_interval())
                && t.wall_clock >= at
            {
                t.emit_tick()?;
                t.next_tick_at = Some(next_grid_point(t.wall_clock, ms(interval)));
            }
            // Hold heads change in on_record, position_advance, init and
            // a resumed release, and each refreshes the tracking; here
            // only time moves.
            if let Some(threshold) = t.stage.hold_warning_after() {
                let threshold = ms(threshold);
                let due = t
                    .holds
                    .values()
                    .any(|h| !h.warned && t.wall_clock - h.since >= threshold);
                if !due {
                    return Ok(());
                }
                for (channel, held) in t.held_by_channel() {
                    let Some(track) = t.holds.get_mut(&channel) else {
                        continue;
                    };
                    if !track.warned && held.held_for_ms >= threshold {
                        track.warned = true;
                        t.stats.hold_warnings += 1;
                        let code = held
                            .waiting_on
                            .first()
                            .map_or("vc-hold", |w| w.diagnosis().code());
                        warn!(code, task = %t.id, "{}", held.summary());
                    }
                }
            }
            Ok(())
        })
    }

    /// Takes everything this transaction produced: the records to append
    /// and the changelog records of both stores. The host appends them and
    /// commits them with the consumed positions, atomically, then reports
    /// the outcome: [`commit_done`](Self::commit_done) once committed, or
    /// [`reset`](Self::reset) after an abort.
    pub fn take_commit(&mut self) -> Result<TaskCommit, TaskError> {
        if self.poisoned {
            return Err(TaskError::Poisoned {
                task: self.id.clone(),
            });
        }
        if self.in_flight.is_some() {
            return Err(TaskError::InFlight {
                task: self.id.clone(),
            });
        }
        self.in_flight_tick_at = self.next_tick_at;
        self.paged_in_since_commit = 0;
        let protocol = self.node.take_writes();
        let fold = std::mem::take(&mut self.pending_fold);
        let mut changelog = Vec::with_capacity(protocol.len() + fold.len());
        let names = self.app.owned_names(&self.id.stage);
        if !protocol.is_empty() {
            let Some(topic) = names.map(|n| n.state_changelog.clone()) else {
                return Err(TaskError::Config {
                    task: self.id.clone(),
                    message: "the stage has no state changelog name".to_owned(),
                });
            };
            for (key, value) in protocol.iter() {
                changelog.push(self.changelog_record(&topic, key.text().as_bytes(), value));
            }
        }
        if !fold.is_empty() {
            let Some(topic) = names.and_then(|n| n.fold_changelog.clone()) else {
                return Err(TaskError::Config {
                    task: self.id.clone(),
                    message: "fold state written by a stage without a fold store".to_owned(),
                });
            };
            for (key, value) in fold.iter() {
                changelog.push(self.changelog_record(&topic, key, value));
            }
        }
        self.in_flight = Some(InFlight { protocol, fold });
        self.acted = false;
        Ok(TaskCommit {
            records: std::mem::take(&mut self.outgoing),
            changelog,
            events: std::mem::take(&mut self.events),
        })
    }

    fn changelog_record(&self, topic: &str, key: &[u8], value: Option<&[u8]>) -> OutgoingRecord {
        OutgoingRecord {
            topic: topic.to_owned(),
            partition: self.id.partition,
            key: Some(key.to_vec()),
            value: value.map(<[u8]>::to_vec),
            timestamp: self.wall_clock,
            headers: Vec::new(),
            origin: None,
        }
    }

    /// The records emitted since the last commit, taken without committing
    /// anything (an abort: a host that streams records into its open
    /// transaction has produced them, and they end up aborted).
    pub fn take_abandoned(&mut self) -> Vec<OutgoingRecord> {
        std::mem::take(&mut self.outgoing)
    }

    /// The transaction taken last was committed: its writes join the
    /// committed stores.
    pub fn commit_done(&mut self) {
        self.commit_done_into(None);
    }

    /// As [`commit_done`](Self::commit_done), also listing the committed
    /// writes in `out` (for a local store): puts and deletes of both
    /// stores, protocol store first, each in key order.
    pub fn commit_done_into(&mut self, out: Option<&mut Vec<crate::runtime::local::LocalEntry>>) {
        use crate::runtime::local::StoreKind;
        if let Some(done) = self.in_flight.take() {
            if let Some(out) = out {
                for (key, value) in done.protocol.iter() {
                    out.push((
                        StoreKind::Protocol,
                        key.text().as_bytes().to_vec(),
                        value.map(<[u8]>::to_vec),
                    ));
                }
                for (key, value) in done.fold.iter() {
                    out.push((StoreKind::Fold, key.to_vec(), value.map(<[u8]>::to_vec)));
                }
            }
            self.stores.held.committed(&done.protocol);
            self.stores.protocol.apply_owned(done.protocol);
            self.stores.fold.apply(&done.fold);
            self.committed_tick_at = self.in_flight_tick_at;
        }
    }

    /// Whether the task has anything for the next transaction.
    pub fn has_work(&self) -> bool {
        // Every event stands for work one of these already shows: a
        // delivery or a hold sets `acted`, a send fills `outgoing`.
        !self.outgoing.is_empty() || self.acted || !self.pending_fold.is_empty()
    }

    /// Lets the committed entries the local store now holds leave memory:
    /// fold entries over the cache's budget (see [`FoldStore::evict`]) and
    /// held records (see [`HeldPages`](crate::runtime::paging::HeldPages)).
    pub fn evict_local(&mut self) {
        self.stores.fold.evict();
        let TaskStores { held, protocol, .. } = &mut self.stores;
        held.evict(protocol);
    }

    /// Stops reading held records from the local store (see
    /// [`TaskStores::detach_held`]).
    pub fn detach_held(&mut self) {
        self.stores.detach_held();
    }

    /// Lets the held records the local store now holds leave memory (the
    /// host calls it when idle too: an eviction otherwise waits for the
    /// task's next commit).
    pub fn evict_held(&mut self) {
        let TaskStores { held, protocol, .. } = &mut self.stores;
        held.evict(protocol);
    }

    /// Gives the committed fold store a new cache budget (see
    /// [`FoldStore::set_budget`]).
    pub fn set_fold_budget(&mut self, budget: usize) {
        self.stores.fold.set_budget(budget);
    }

    /// The committed stores (what an abort returns to).
    pub fn stores(&self) -> &TaskStores {
        &self.stores
    }

    /// Rebuilds the task from its committed stores, dropping everything not
    /// committed (an abort): a new node restored from the committed protocol
    /// store, the committed fold state, and the tick schedule as of the last
    /// commit (a tick the aborted transaction carried falls due again).
    /// Nothing is copied: the stores move into the new task.
    pub fn reset(
        self,
        metadata: &dyn TopicMetadata,
        broker: &dyn BrokerOffsets,
        now_ms: i64,
    ) -> Result<Task, TaskError> {
        let window = self.node.resident_window();
        let Task {
            app,
            id,
            stores,
            committed_tick_at,
            record_events,
            hold_budget,
            ..
        } = self;
        let mut task = Task::init(
            &app,
            &id.stage,
            id.partition,
            stores,
            metadata,
            broker,
            now_ms,
        )?;
        task.record_events = record_events;
        task.hold_budget = hold_budget;
        task.set_hold_window(window);
        // A tick of the aborted transaction is due again: resume the
        // schedule as it was committed, not a fresh one from now.
        if committed_tick_at.is_some() {
            task.next_tick_at = committed_tick_at;
            task.committed_tick_at = committed_tick_at;
        }
        Ok(task)
    }

    /// Gives up the task, keeping only its committed stores.
    pub fn into_stores(self) -> TaskStores {
        self.stores
    }

    /// The truncation sweep: drops stamp-side claims below each claimed
    /// channel's log start. A failed lookup changes nothing and is returned
    /// for the host to count and skip; it never poisons the task.
    pub fn sweep(&mut self, broker: &dyn BrokerOffsets) -> Result<TruncationReport, ProtocolError> {
        self.node.truncate_to_log_starts(broker)
    }

    /// The state bytes in a fold slot, as this task sees them (including
    /// writes not yet committed).
    pub fn fold_state(&self, slot: &FoldKey) -> Option<Cow<'_, [u8]>> {
        self.fold_get(&slot.to_bytes())
    }

    fn fold_get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        if let Some(v) = self.pending_fold.get(key) {
            return v.map(Cow::Borrowed);
        }
        if let Some(v) = self.in_flight.as_ref().and_then(|f| f.fold.get(key)) {
            return v.map(Cow::Borrowed);
        }
        self.stores.fold.get_bytes(key)
    }

    /// The hold gauges: records held, the oldest head's age, and per source
    /// channel (in topic order) its held count and its head's age.
    pub(crate) fn hold_gauges(&self) -> HoldGauges {
        let mut channels: Vec<(String, usize, i64)> = self
            .inputs
            .iter()
            .map(|i| {
                let held = self.node.channel_view(i.channel).map_or(0, |v| v.held);
                let age = self
                    .holds
                    .get(&i.channel)
                    .map_or(0, |t| (self.wall_clock - t.since).max(0));
                (i.topic.clone(), held, age)
            })
            .collect();
        channels.sort();
        HoldGauges {
            held: self.node.held_count(),
            age_max_ms: channels.iter().map(|c| c.2).max().unwrap_or(0),
            channels,
        }
    }

    /// Every record gating a channel of this task, with what it waits for,
    /// longest-held first.
    pub fn held(&self) -> Vec<HeldRecord> {
        let mut held: Vec<HeldRecord> =
            self.held_by_channel().into_iter().map(|(_, h)| h).collect();
        crate::holds::sort_longest_first(&mut held);
        held
    }

    fn held_by_channel(&self) -> Vec<(Channel, HeldRecord)> {
        let name = |c: Channel| self.topic_name(c.topic);
        self.node
            .held_heads()
            .into_iter()
            .map(|h| {
                let channel = h.channel;
                let since = self
                    .holds
                    .get(&h.channel)
                    .filter(|t| t.offset == h.offset)
                    .map_or(self.wall_clock, |t| t.since);
                let held = HeldRecord {
                    stage: self.id.stage.clone(),
                    task_partition: self.id.partition,
                    coordinate: Coordinate::new(name(h.channel), h.channel.partition, h.offset),
                    timestamp: h.timestamp,
                    held_for_ms: self.wall_clock - since,
                    queue_depth: h.depth,
                    waiting_on: h
                        .unmet
                        .into_iter()
                        .map(|u| WaitingOn::from_unmet(u, name))
                        .collect(),
                };
                (channel, held)
            })
            .collect()
    }

    fn guarded(
        &mut self,
        f: impl FnOnce(&mut Task) -> Result<(), TaskError>,
    ) -> Result<(), TaskError> {
        if self.poisoned {
            return Err(TaskError::Poisoned {
                task: self.id.clone(),
            });
        }
        let r = f(self);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn protocol(&self, source: ProtocolError) -> TaskError {
        TaskError::Protocol {
            task: self.id.clone(),
            cause: source,
        }
    }

    /// A clock with the task's topic names in place of ids.
    fn describe_clock(&self, clock: &VectorClock) -> String {
        crate::holds::describe_clock(clock, |t| self.topic_name(t), |s| s.to_string())
    }

    fn coordinate(&self, (channel, offset): (Channel, i64)) -> Coordinate {
        Coordinate::new(self.topic_name(channel.topic), channel.partition, offset)
    }

    /// The topic's name, shared (a reference count, no copy).
    fn shared_topic_name(&self, topic: TopicId) -> std::sync::Arc<str> {
        self.names
            .get(&topic)
            .cloned()
            .unwrap_or_else(|| topic.to_string().into())
    }

    fn topic_name(&self, topic: TopicId) -> String {
        self.names
            .get(&topic)
            .map_or_else(|| topic.to_string(), |name| name.to_string())
    }

    fn on_record_inner(&mut self, record: FetchedRecord) -> Result<(), TaskError> {
        if let Some(stepped) = self
            .node
            .stepped_past(record.channel, record.offset)
            .cloned()
        {
            // Stepped past before (an operator's skip, or a step an aborted
            // transaction made and this one repeats from the store).
            return self.dead_letter_input(record, &stepped);
        }
        let causal = match causal_headers(&record.headers) {
            Ok(c) => c,
            Err(source) => {
                let coordinate = Coordinate::new(
                    self.topic_name(record.channel.topic),
                    record.channel.partition,
                    record.offset,
                );
                let Some(topic) = self.stage.corrupt_headers_dead_letter() else {
                    return Err(TaskError::CorruptHeaders {
                        task: self.id.clone(),
                        coordinate,
                        cause: source,
                    });
                };
                let stepped = SteppedPast {
                    dead_letter: topic.to_owned(),
                    reason: format!("corrupt causal headers: {source}"),
                };
                self.node
                    .step_past(record.channel, record.offset, stepped.clone())
                    .map_err(|e| self.protocol(e))?;
                return self.dead_letter_input(record, &stepped);
            }
        };
        let mut headers: Vec<Header> = record
            .headers
            .into_iter()
            .filter(|h| !is_causal_header(&h.name))
            .collect();
        if headers.is_empty() {
            // The filter reuses the fetched list's allocation; a record
            // with only causal headers should not carry it into a hold.
            headers = Vec::new();
        }
        let inbound = InboundRecord {
            channel: record.channel,
            offset: record.offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers,
            causal,
        };
        let (channel, offset) = (inbound.channel, inbound.offset);
        // What a DEBUG line about a hold shows: the record's claims by
        // topic name and its sender tag, never payload bytes. Built only
        // when that level is on.
        let described = tracing::enabled!(tracing::Level::DEBUG).then(|| {
            (
                self.describe_clock(&inbound.causal.clock),
                inbound
                    .causal
                    .sender
                    .map(|t| format!("{} seq {}", t.sender, t.seq)),
            )
        });
        for &w in &self.watched {
            if self.node.claims_unmet_on(&inbound.causal.clock, w) {
                self.arrival_claims.push(w);
            }
        }
        let held_before = self.node.held_count();
        let mut deliveries = std::mem::take(&mut self.deliveries);
        deliveries.clear();
        if let Err(e) = self.node.on_record_into(inbound, &mut deliveries) {
            return Err(self.protocol(e));
        }
        // Whether the arriving record joined a queue (held now, or held
        // and released by what arrived): known before any page is served.
        let released = deliveries.iter().filter(|d| d.was_held).count();
        if self.node.held_count() + released > held_before {
            // Only the arriving record can join a queue in one call; its
            // coordinate is named only then, off the common path.
            self.acted = true;
            let coordinate = self.coordinate((channel, offset));
            if let Some(budget) = self.hold_budget
                && let Some(size) = self.node.last_held_size(channel)
                && size > budget
            {
                return Err(TaskError::HoldBudget {
                    task: self.id.clone(),
                    coordinate,
                    size,
                    budget,
                });
            }
            if let Some((clock, sender)) = &described {
                debug!(task = %self.id, %coordinate, %clock, sender = sender.as_deref().unwrap_or("none"), "record held");
            }
            if self.record_events {
                self.events.push(TaskEvent::Held { coordinate });
            }
        }
        self.release(&mut deliveries)?;
        // The buffer is kept for the next record, unless the release of a
        // long hold grew it (100k released records leave about 20 MiB of
        // room behind otherwise).
        if deliveries.capacity() <= KEPT_DELIVERY_ROOM {
            self.deliveries = deliveries;
        }
        self.refresh_holds();
        Ok(())
    }

    /// How many deliveries the buffer the task reuses between records has
    /// room for: a few hundred at most, whatever the largest release was.
    pub fn delivery_room(&self) -> usize {
        self.deliveries.capacity()
    }

    /// Sends an input record, bytes and headers unchanged, to the
    /// dead-letter topic it is stepped past to, with the `parsley.dlq.*`
    /// headers saying where it came from and why; it never reaches the
    /// node, so to the gate its offset is like a transaction marker's.
    fn dead_letter_input(
        &mut self,
        record: FetchedRecord,
        stepped: &SteppedPast,
    ) -> Result<(), TaskError> {
        let coordinate = self.coordinate((record.channel, record.offset));
        let Some(&partitions) = self.dead_letters.get(&stepped.dead_letter) else {
            return Err(TaskError::Config {
                task: self.id.clone(),
                message: format!(
                    "record {coordinate} is to be stepped past to {:?}, a topic this task did not look up",
                    stepped.dead_letter
                ),
            });
        };
        warn!(task = %self.id, %coordinate, dead_letter = %stepped.dead_letter, reason = %stepped.reason,
            "record stepped past: sent to the dead-letter topic instead of delivered");
        let partition = partition_for(record.key.as_deref(), self.id.partition, partitions);
        let mut headers = record.headers;
        for (name, value) in [
            (crate::topic::DEAD_LETTER_ERROR, stepped.reason.clone()),
            (crate::topic::DEAD_LETTER_TOPIC, coordinate.topic.clone()),
            (
                crate::topic::DEAD_LETTER_PARTITION,
                coordinate.partition.to_string(),
            ),
            (
                crate::topic::DEAD_LETTER_OFFSET,
                coordinate.offset.to_string(),
            ),
        ] {
            headers.push(Header::new(name, value.into_bytes()));
        }
        self.stats.stepped_past += 1;
        self.acted = true;
        if self.record_events {
            self.events.push(TaskEvent::SteppedPast {
                coordinate,
                topic: stepped.dead_letter.clone(),
                partition,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic: stepped.dead_letter.clone(),
            partition,
            key: record.key,
            value: record.value,
            timestamp: record.timestamp,
            headers,
            origin: None,
        });
        Ok(())
    }

    fn process(&mut self, delivery: Delivery) -> Result<(), TaskError> {
        let Delivery { record, was_held } = delivery;
        // The record's coordinate names its topic: built only where it is
        // kept (an event, an error), never per record on the common path.
        let at = (record.channel, record.offset);
        let Some(&slot) = self.slots.get(&record.channel.topic) else {
            return Err(TaskError::Config {
                task: self.id.clone(),
                message: format!(
                    "delivered record {} is on no source of the stage",
                    self.coordinate(at)
                ),
            });
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let sender = record
                .causal
                .sender
                .map(|t| format!("{} seq {}", t.sender, t.seq));
            debug!(
                task = %self.id,
                coordinate = %self.coordinate(at),
                was_held,
                clock = %self.describe_clock(&record.causal.clock),
                sender = sender.as_deref().unwrap_or("none"),
                "delivering to logic"
            );
        }
        let stage = self.stage.clone();
        let (outcome, state_key) = match slot {
            SourceSlot::Ticks => {
                let Some(decl) = stage.def.ticks.as_ref() else {
                    return Err(TaskError::Config {
                        task: self.id.clone(),
                        message: "tick delivered to a stage without ticks".to_owned(),
                    });
                };
                let tick = Tick::new(record.timestamp).on_partition(record.channel.partition);
                let key = FoldKey::Ticks.to_bytes();
                let state = if decl.uses_state {
                    self.fold_get(&key)
                } else {
                    None
                };
                let keyed = TaskState {
                    pending: &self.pending_fold,
                    in_flight: self.in_flight.as_ref().map(|f| &f.fold),
                    committed: &self.stores.fold,
                };
                let r = catch_unwind(AssertUnwindSafe(|| {
                    (decl.logic)(&tick, state.as_deref(), &keyed)
                }));
                (r, decl.uses_state.then_some(key))
            }
            SourceSlot::User(i) => {
                let src = &stage.def.sources[i];
                let key = src
                    .uses_state
                    .then(|| FoldKey::for_key(record.key.as_deref()).to_bytes());
                let state = key.as_ref().and_then(|k| self.fold_get(k));
                let topic = self.shared_topic_name(record.channel.topic);
                let input = RawInput {
                    topic: &topic,
                    partition: record.channel.partition,
                    offset: record.offset,
                    timestamp: record.timestamp,
                    key: record.key.as_deref(),
                    value: record.value.as_deref(),
                    headers: &record.headers,
                };
                let r = catch_unwind(AssertUnwindSafe(|| (src.logic)(&input, state.as_deref())));
                (r, key)
            }
        };
        // A state read from the local store that failed read as absent:
        // whatever the logic made of it (a result, an error, a panic) must
        // not be kept, and the failure is the store's.
        if let Some(cause) = self.stores.fold.take_failure() {
            return Err(TaskError::LocalStore {
                task: self.id.clone(),
                cause,
            });
        }
        let outcome = match outcome {
            Err(payload) => {
                return Err(TaskError::Panic {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    message: panic_message(payload),
                });
            }
            Ok(Err(failure)) => return Err(self.failure(failure, self.coordinate(at))),
            Ok(Ok(o)) => o,
        };
        self.stats.delivered += 1;
        if was_held {
            self.stats.delivered_after_hold += 1;
        }
        self.acted = true;
        if self.record_events {
            self.events.push(TaskEvent::Delivered(DeliveredRecord {
                coordinate: self.coordinate(at),
                timestamp: record.timestamp,
                was_held,
                tick: matches!(slot, SourceSlot::Ticks),
            }));
        }
        self.apply(outcome, state_key, record.timestamp, at)
    }

    fn failure(&self, failure: Failure, coordinate: Coordinate) -> TaskError {
        let task = self.id.clone();
        match failure {
            Failure::Decode { part, source } => TaskError::Decode {
                task,
                coordinate,
                part,
                cause: source,
            },
            Failure::StateDecode(source) | Failure::StateEncode(source) => TaskError::StateCodec {
                task,
                coordinate,
                cause: source,
            },
            Failure::Logic(source) => TaskError::Logic {
                task,
                coordinate,
                cause: source,
            },
        }
    }

    fn apply(
        &mut self,
        outcome: Outcome,
        state_key: Option<Vec<u8>>,
        timestamp: i64,
        at: (Channel, i64),
    ) -> Result<(), TaskError> {
        if let Some(key) = state_key {
            match outcome.write {
                StateWrite::Keep => {}
                StateWrite::Put(bytes) => self.pending_fold.put(key, bytes),
                StateWrite::Delete => self.pending_fold.delete(key),
            }
        }
        for (ordinal, emission) in outcome.emissions.iter().enumerate() {
            let origin = EmissionOrigin {
                channel: at.0,
                offset: at.1,
                ordinal: u32::try_from(ordinal).unwrap_or(u32::MAX),
            };
            self.send(emission, timestamp, origin)?;
        }
        Ok(())
    }

    /// The single stamping site: check the sink, encode, partition, stamp.
    fn send(
        &mut self,
        emission: &Emission,
        default_timestamp: i64,
        origin: EmissionOrigin,
    ) -> Result<(), TaskError> {
        let at = (origin.channel, origin.offset);
        let topic = emission.topic();
        // `sinks` holds exactly the stage's declared sinks (the tick topic
        // is routed separately).
        let sink = match self.sinks.get(topic) {
            Some(s) => s.clone(),
            None => {
                return Err(TaskError::UndeclaredSink {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    topic: topic.to_owned(),
                });
            }
        };
        // Encoded with the declared sink's codecs, under the panic guard
        // like every other call into user code.
        let encoded = match catch_unwind(AssertUnwindSafe(|| sink.topic.encode_emission(emission)))
        {
            Err(payload) => {
                return Err(TaskError::Panic {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    message: format!(
                        "while encoding an emission to {topic:?}: {}",
                        panic_message(payload)
                    ),
                });
            }
            Ok(None) => {
                let (key, value) = (sink.topic.key_type().1, sink.topic.value_type().1);
                return Err(TaskError::SinkTypes {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    topic: topic.to_owned(),
                    declared: format!("Topic<{key}, {value}>"),
                });
            }
            Ok(Some(r)) => r.map_err(|(part, source)| TaskError::Encode {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                part,
                cause: source,
            })?,
        };
        if let Some(h) = emission
            .headers()
            .iter()
            .find(|h| is_causal_header(&h.name))
        {
            return Err(TaskError::ReservedHeader {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                header: h.name.to_string(),
            });
        }
        let timestamp = encoded.timestamp.unwrap_or(default_timestamp);
        if timestamp < 0 {
            return Err(TaskError::NegativeTimestamp {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                timestamp,
            });
        }
        if let Some(d) = self.stores.diverted.get(&origin).cloned() {
            self.divert(emission, encoded, timestamp, origin, &d);
            return Ok(());
        }
        let partition = partition_for(encoded.key.as_deref(), self.id.partition, sink.partitions);
        let stamp = self
            .node
            .prepare_send(Channel::new(sink.id, partition))
            .map_err(|e| self.protocol(e))?;
        self.stats.emitted += 1;
        if self.record_events {
            self.events.push(TaskEvent::Sent {
                topic: topic.to_owned(),
                partition,
                tick: false,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic: topic.to_owned(),
            partition,
            key: encoded.key,
            value: encoded.value,
            timestamp,
            headers: {
                let mut headers = Vec::with_capacity(3 + emission.headers().len());
                stamp.encode_headers_into_as(sink.clock, &mut headers);
                headers.extend(emission.headers().iter().cloned());
                headers
            },
            origin: Some(origin),
        });
        Ok(())
    }

    /// Sends an emission the sink refused to its dead-letter topic instead:
    /// unstamped (it takes no send sequence, so no record's claims wait for
    /// it), with the emission's own headers and where it came from and why.
    fn divert(
        &mut self,
        emission: &Emission,
        encoded: crate::topic::EncodedEmission,
        timestamp: i64,
        origin: EmissionOrigin,
        d: &Diversion,
    ) {
        let coordinate = self.coordinate((origin.channel, origin.offset));
        let sink = emission.topic().to_owned();
        let partition = partition_for(encoded.key.as_deref(), self.id.partition, d.partitions);
        warn!(task = %self.id, %coordinate, %sink, dead_letter = %d.topic, reason = %d.reason,
            "an emission the sink refused goes to the dead-letter topic instead");
        self.stats.diverted += 1;
        let mut headers: Vec<Header> = emission.headers().to_vec();
        for (name, value) in [
            (crate::topic::DEAD_LETTER_ERROR, d.reason.clone()),
            (crate::topic::DEAD_LETTER_TOPIC, coordinate.topic.clone()),
            (
                crate::topic::DEAD_LETTER_PARTITION,
                coordinate.partition.to_string(),
            ),
            (
                crate::topic::DEAD_LETTER_OFFSET,
                coordinate.offset.to_string(),
            ),
            (DEAD_LETTER_SINK, sink.clone()),
        ] {
            headers.push(Header::new(name, value.into_bytes()));
        }
        if self.record_events {
            self.events.push(TaskEvent::Diverted {
                topic: d.topic.clone(),
                partition,
                sink,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic: d.topic.clone(),
            partition,
            key: encoded.key,
            value: encoded.value,
            timestamp,
            headers,
            origin: Some(origin),
        });
    }

    fn emit_tick(&mut self) -> Result<(), TaskError> {
        let Some((topic, channel)) = self.tick_route.clone() else {
            return Ok(());
        };
        let stamp = self
            .node
            .prepare_send(channel)
            .map_err(|e| self.protocol(e))?;
        self.stats.emitted += 1;
        self.stats.ticks_emitted += 1;
        debug!(task = %self.id, timestamp = self.wall_clock, "tick emitted");
        if self.record_events {
            self.events.push(TaskEvent::Sent {
                topic: topic.clone(),
                partition: channel.partition,
                tick: true,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic,
            partition: channel.partition,
            key: Some(channel.partition.to_be_bytes().to_vec()),
            value: None,
            timestamp: self.wall_clock,
            headers: stamp_headers(&stamp),
            origin: None,
        });
        Ok(())
    }

    fn refresh_holds(&mut self) {
        if self.node.held_count() == 0 {
            self.holds.clear();
            return;
        }
        let mut next = BTreeMap::new();
        for (channel, offset) in self.node.head_offsets() {
            // A new head starts its hold now: heads change only in
            // on_record, position_advance and init, each of which refreshes
            // right away, with the host's clock at hand-over.
            let track = match self.holds.get(&channel) {
                Some(t) if t.offset == offset => *t,
                _ => HoldTrack {
                    offset,
                    since: self.wall_clock,
                    warned: false,
                },
            };
            next.insert(channel, track);
        }
        self.holds = next;
    }
}

/// The first multiple of `interval` after `now`: the tick grid.
fn next_grid_point(now: i64, interval: i64) -> i64 {
    let interval = interval.max(1);
    now.div_euclid(interval)
        .saturating_add(1)
        .saturating_mul(interval)
}

/// A record's causal headers, read strictly out of all its headers.
pub(crate) fn causal_headers(headers: &[Header]) -> Result<CausalHeaders, CorruptHeader> {
    CausalHeaders::decode(headers.iter().map(|h| (h.name(), h.value.as_deref())))
}

/// The stamp as record headers, in the order `vc`, `vc-sender`, `vc-seq`.
/// A task's fold state as its tick logic reads it: committed, then the
/// transaction in flight, then this transaction's writes.
struct TaskState<'a> {
    pending: &'a FoldWrites,
    in_flight: Option<&'a FoldWrites>,
    committed: &'a FoldStore,
}

impl StateSource for TaskState<'_> {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        if let Some(v) = self.pending.get(key) {
            return v.map(Cow::Borrowed);
        }
        if let Some(v) = self.in_flight.and_then(|f| f.get(key)) {
            return v.map(Cow::Borrowed);
        }
        self.committed.get_bytes(key)
    }

    fn entries(&self) -> Vec<FoldEntry<'_>> {
        let mut merged: BTreeMap<Cow<'_, [u8]>, Option<Cow<'_, [u8]>>> = self
            .committed
            .all()
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect();
        for layer in self.in_flight.into_iter().chain([self.pending]) {
            for (k, v) in layer.iter() {
                merged.insert(Cow::Borrowed(k), v.map(Cow::Borrowed));
            }
        }
        let ticks = FoldKey::Ticks.to_bytes();
        merged
            .into_iter()
            .filter(|(k, _)| k.as_ref() != ticks.as_slice())
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }
}

fn stamp_headers(stamp: &CausalHeaders) -> Vec<Header> {
    let mut headers = Vec::with_capacity(3);
    stamp.encode_headers_into(&mut headers);
    headers
}
