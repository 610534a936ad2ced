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

mod commit;
mod holds;
mod init;
mod process;
mod send;
mod ticks;

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

pub use crate::runtime::host::{MetadataError, RecordView, TopicDescription, TopicMetadata};
pub use crate::runtime::identity::TaskId;
pub use parsley_protocol::host::{EmissionOrigin, OutgoingRecord, RecordBytes, Stamp, StampWriter};

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
        use parsley_protocol::store::{PageEntries, StateKey, StoreRead, decode_pair};
        let mut windows = std::collections::BTreeMap::new();
        let mut present = Vec::new();
        self.protocol.for_each_state(&mut |key, value| match key {
            Ok(StateKey::QueueMeta(c)) => {
                if let Ok(window) = decode_pair(value) {
                    windows.insert(c, window);
                }
            }
            Ok(StateKey::QueueEntry(c, index)) => present.push((c, index, 1)),
            Ok(StateKey::QueuePage(c, first)) => {
                let n = PageEntries::count(value).map_or(0, |n| n as i64);
                present.push((c, first, n));
            }
            _ => {}
        });
        let queued: i64 = windows.values().map(|(head, tail)| tail - head).sum();
        // Only a page's records within its queue's window are held.
        let present: i64 = present
            .into_iter()
            .map(|(c, first, n)| match windows.get(&c) {
                Some(&(head, tail)) => (first + n).min(tail) - first.max(head),
                None => 0,
            })
            .map(|n| n.max(0))
            .sum();
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
    /// Whether the failure passes with time: a codec of a source, a sink
    /// or the fold state reported a [transient](crate::CodecError::is_transient)
    /// error (a schema registry that could not be reached). Restarting the
    /// task after a pause retries the same record; nothing is skipped.
    pub fn is_transient(&self) -> bool {
        match self {
            TaskError::Decode { cause, .. }
            | TaskError::Encode { cause, .. }
            | TaskError::StateCodec { cause, .. } => cause.is_transient(),
            _ => false,
        }
    }

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
    /// Records folded into state whose key the source's declared
    /// partitioner places on another partition than the one they came
    /// from.
    pub misplaced_keys: u64,
}

/// The most room for deliveries a task keeps between records.
const KEPT_DELIVERY_ROOM: usize = 256;

/// The most records a task's next outgoing list is given room for up front
/// (about a megabyte); a larger transaction grows its list as it goes.
const KEPT_OUTGOING_ROOM: usize = 4096;

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
    tick_route: Option<(std::sync::Arc<str>, Channel)>,
    /// The partition count the stage's sources share (its task count).
    partitions: i32,
    stores: TaskStores,
    in_flight: Option<InFlight>,
    pending_fold: FoldWrites,
    /// The delivering record's state key (its slot's, or the tick slot's),
    /// built in room reused from one delivery to the next and read from
    /// the state read to the write.
    key_scratch: Vec<u8>,
    outgoing: Vec<OutgoingRecord>,
    /// Writes the stamps of `outgoing` into buffers they share.
    stamps: StampWriter,
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
    /// When ticks fall due, as of now, of the transaction in flight and of
    /// the last commit.
    ticks: ticks::TickSchedule,
    /// What the task holds as its gauges and backpressure see it.
    holds: holds::Holds,
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
        self.ticks.next()
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
}

/// A record's causal headers, read strictly out of all its headers.
pub(crate) fn causal_headers(headers: &[Header]) -> Result<CausalHeaders, CorruptHeader> {
    CausalHeaders::decode(headers.iter().map(|h| (h.name(), h.value.as_deref())))
}

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

    fn count(&self) -> usize {
        // The transaction's own writes (in flight, then pending) decide for
        // the keys they touch; the committed store, for the others, key
        // by key, with no state read.
        let mut layered: BTreeMap<&[u8], bool> = BTreeMap::new();
        for layer in self.in_flight.into_iter().chain([self.pending]) {
            for (k, v) in layer.iter() {
                layered.insert(k, v.is_some());
            }
        }
        let ticks = FoldKey::Ticks.to_bytes();
        let mut n = 0;
        self.committed.for_each_key(&mut |k| {
            if k != ticks.as_slice() && !layered.contains_key(k) {
                n += 1;
            }
        });
        n + layered
            .iter()
            .filter(|(k, present)| **present && **k != ticks.as_slice())
            .count()
    }
}
