//! The broker-less test host: [`TestDriver`].

mod log;
mod records;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use parsley_protocol::{
    BrokerOffsets, BrokerOffsetsError, CausalHeaders, Channel, CorruptHeader, Header, SenderId,
    TopicId, TopicOffsets, VectorClock,
    headers::{CLOCK_HEADER, is_causal_header},
};

use crate::app::Parsley;
use crate::codec::{Codec, CodecError};
use crate::fold::FoldKey;
use crate::holds::HeldRecord;
use crate::identity::test_topic_id;
use crate::message::Coordinate;
use crate::partition::partition_for;
use crate::runtime::host::{AssignedPartition, PolledRecord, Seek};
use crate::runtime::host::{ChangelogReader, ChangelogRecord};
use crate::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
use crate::runtime::metrics::TaskMetrics;
use crate::runtime::query::{QueryAnswer, StateQuery};
use crate::runtime::task::{
    OutgoingRecord, TaskError, TaskEvent, TaskId, TaskStats, causal_headers,
};
use crate::runtime::worker::{Ack, Host, Ready, RestoreJob, TaskFailure, act_on};
use crate::runtime::worker::{CommitOutcome, Transaction, Worker, WorkerConfig, WorkerError};
use crate::stage::StateStore;
use crate::topic::{IntoNullable, Part, Payload, Topic};

use log::{Entry, Log, NextEntry, StoredRecord, TopicLog, stored};

/// A state key's bytes (`None` for the null key), encoded with the key
/// codec of `stage`'s store.
fn encode_state_key<K: 'static>(
    stage: &str,
    codec: &Codec<K>,
    key: impl IntoNullable<K>,
) -> Result<Option<Vec<u8>>, DriverError> {
    key.into_nullable()
        .map(|k| codec.encode(&k))
        .transpose()
        .map_err(|source| DriverError::Encode {
            topic: format!("<state key of {stage}>"),
            part: Part::Key,
            cause: source,
        })
}

fn decode_state<S: 'static>(stage: &str, codec: &Codec<S>, bytes: &[u8]) -> Result<S, DriverError> {
    codec
        .decode(bytes)
        .map_err(|source| DriverError::StateDecode {
            stage: stage.to_owned(),
            cause: source,
        })
}
use records::encode_part;
pub use records::{Input, OutputRecord, RawRecord, StageDelivery};

/// A key and value as read back; `None` is a null.
pub type KeyValue<K, V> = (Option<K>, Option<V>);

/// How many processing steps one call may take before the driver decides
/// the application does not settle (a cycle that never converges).
pub const DEFAULT_STEP_BUDGET: usize = 100_000;

/// The driver's view of one task: its partitions, in channel order, and
/// where its round-robin over them stands.
struct DriverTask {
    id: TaskId,
    partitions: Vec<(String, i32)>,
    cursor: usize,
}

/// A failure the driver reports.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A task failed; its step was aborted. Committed state is as before the
    /// step, and the next run retries from there.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// No such topic in the driver.
    #[error(
        "topic {topic:?} does not exist in this driver; declare it in a stage or create it with TestDriverBuilder::partitions"
    )]
    UnknownTopic {
        /// The topic.
        topic: String,
    },
    /// A topic was given a partition count below one.
    #[error("topic {topic:?} was given {partitions} partition(s); a topic needs at least one")]
    PartitionCount {
        /// The topic.
        topic: String,
        /// The count given.
        partitions: i32,
    },
    /// No such stage in the application.
    #[error("the application has no stage {stage:?}")]
    UnknownStage {
        /// The stage.
        stage: String,
    },
    /// A partition outside the topic.
    #[error("partition {partition} does not exist: topic {topic:?} has {partitions} partition(s)")]
    InvalidPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
        /// The topic's partition count.
        partitions: i32,
    },
    /// A piped key or value did not encode.
    #[error("the {part} piped to {topic:?} does not encode: {cause}")]
    Encode {
        /// The topic.
        topic: String,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// A committed record did not decode with the topic's codecs.
    #[error("the {part} of {coordinate} does not decode: {cause}")]
    Decode {
        /// The record.
        coordinate: Coordinate,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// The stage has no state, or state of another type.
    #[error("stage {stage:?} has {found}, not state of type {expected}")]
    StateType {
        /// The stage.
        stage: String,
        /// The type asked for.
        expected: &'static str,
        /// What the stage has.
        found: String,
    },
    /// Stored state did not decode.
    #[error("state of stage {stage:?} does not decode: {cause}")]
    StateDecode {
        /// The stage.
        stage: String,
        /// The codec's error.
        cause: CodecError,
    },
    /// The host core refused (for example a changelog with the wrong
    /// partition count).
    #[error(transparent)]
    Worker(WorkerError),
    /// A state query found the stage's task not running (it failed and
    /// stopped).
    #[error("stage {stage:?} could not answer the state query: {answer}")]
    QueryNotAnswered {
        /// The stage queried.
        stage: String,
        /// What the worker answered.
        answer: String,
    },
    /// A causal state query found causes the stage has not delivered.
    #[error(
        "stage {stage:?} has not delivered every cause of the query: {}",
        waiting_on.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    CausesMissing {
        /// The stage queried.
        stage: String,
        /// What its task still waits for, as `explain_holds` says it.
        waiting_on: Vec<crate::holds::WaitingOn>,
    },
    /// The application did not settle within the step budget.
    #[error(
        "the application did not settle within {steps} steps; a cycle whose logic never converges keeps emitting (emit only on change, or count rounds in state)"
    )]
    NoQuiescence {
        /// The budget.
        steps: usize,
    },
}

/// Configures a [`TestDriver`]: partition counts, the initial wall clock and
/// the step budget.
#[derive(Debug)]
pub struct TestDriverBuilder {
    app: Parsley,
    partitions: BTreeMap<String, i32>,
    wall_clock: i64,
    budget: usize,
}

impl From<WorkerError> for DriverError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Task(t) => DriverError::Task(t),
            other => DriverError::Worker(other),
        }
    }
}

impl TestDriverBuilder {
    /// Creates `topic` with `partitions` partitions (default 1). Works for
    /// any name: a topic of the application, a tick topic (whose default is
    /// the stage's source count), or an extra topic. A count below one
    /// fails [`build`](Self::build) with [`DriverError::PartitionCount`];
    /// sources of one stage with different counts fail it with
    /// [`TaskError::PartitionCounts`], as a cluster start does.
    pub fn partitions(mut self, topic: impl AsRef<str>, partitions: i32) -> Self {
        self.partitions
            .insert(topic.as_ref().to_owned(), partitions);
        self
    }

    /// The initial wall clock (milliseconds), default 0.
    pub fn wall_clock(mut self, now_ms: i64) -> Self {
        self.wall_clock = now_ms;
        self
    }

    /// The most processing steps one call may take (default
    /// [`DEFAULT_STEP_BUDGET`]).
    pub fn step_budget(mut self, steps: usize) -> Self {
        self.budget = steps;
        self
    }

    /// Creates the topics, starts every task, and runs to quiescence.
    pub fn build(self) -> Result<TestDriver, DriverError> {
        let app = self.app;
        if let Some((topic, &partitions)) = self.partitions.iter().find(|(_, n)| **n < 1) {
            return Err(DriverError::PartitionCount {
                topic: topic.clone(),
                partitions,
            });
        }
        let mut log = Log::default();
        let count = |name: &str| self.partitions.get(name).copied().unwrap_or(1);
        for name in app.topics() {
            if app
                .def
                .topics
                .get(name)
                .is_some_and(|u| u.ticks_of.is_none())
            {
                log.create(name, count(name));
            }
        }
        let mut slots = Vec::new();
        for (i, stage) in app.stages().iter().enumerate() {
            let names = &app.def.names[i];
            // A tick-only stage runs one task per tick topic partition.
            let widest = stage
                .source_topics()
                .iter()
                .map(|t| count(t))
                .max()
                .or_else(|| {
                    names
                        .tick_topic
                        .as_ref()
                        .and_then(|t| self.partitions.get(t).copied())
                })
                .unwrap_or(1);
            let mut topics: Vec<String> = stage
                .source_topics()
                .iter()
                .map(|t| (*t).to_owned())
                .collect();
            if let Some(tick_topic) = &names.tick_topic {
                let n = self.partitions.get(tick_topic).copied().unwrap_or(widest);
                log.create(tick_topic, n);
                topics.push(tick_topic.clone());
            }
            for changelog in std::iter::once(&names.state_changelog).chain(&names.fold_changelog) {
                let n = self.partitions.get(changelog).copied().unwrap_or(widest);
                log.create(changelog, n);
            }
            for p in 0..widest {
                slots.push(DriverTask {
                    id: TaskId {
                        stage: stage.name().to_owned(),
                        partition: p,
                    },
                    partitions: topics.iter().map(|t| (t.clone(), p)).collect(),
                    cursor: 0,
                });
            }
        }
        for (name, &n) in &self.partitions {
            if !log.topics.contains_key(name) {
                log.create(name, n);
            }
        }
        let worker = Worker::new(&app, driver_config());
        let senders = slots
            .iter()
            .map(|s: &DriverTask| (app.sender_id(&s.id.stage, s.id.partition), s.id.clone()))
            .collect();
        let mut driver = TestDriver {
            app,
            log,
            wall_clock: self.wall_clock,
            worker,
            slots,
            positions: BTreeMap::new(),
            group_offsets: BTreeMap::new(),
            deliveries: Vec::new(),
            budget: self.budget,
            aborts: 0,
            senders,
            cursors: BTreeMap::new(),
        };
        driver.start_worker()?;
        driver.run()?;
        Ok(driver)
    }
}

/// The driver commits every step as its own transaction and never sweeps on
/// its own (a test's wall clock jumps by whole minutes at a time).
fn driver_config() -> WorkerConfig {
    WorkerConfig {
        commit_interval: Duration::ZERO,
        truncation_interval: Duration::from_secs(600),
        // A failed step is retried at the next call, as before the task
        // backoff existed: the driver's clock moves only when told.
        task_backoff: crate::runtime::failure::Backoff::NONE,
        lookup_retry: crate::runtime::failure::Backoff::NONE,
        // A task that cannot start is the caller's error at once, not a
        // failure the driver would restart in a loop.
        stop_tasks_that_cannot_start: false,
        // A step releases everything it can: a test sees a release whole,
        // not a transaction's share of it.
        release_per_transaction: None,
        ..WorkerConfig::default()
    }
}

/// A synchronous, deterministic, in-memory host for one application: this
/// project's `TopologyTestDriver`.
///
/// It runs the real [`Task`](crate::runtime::task::Task) runner and [`CausalNode`](parsley_protocol::CausalNode)
/// of every stage task: real stamps (`vc`, `vc-sender`, `vc-seq`), real
/// gating and hold queues, fold state, hops between stages, and ticks
/// through each ticking stage's tick topic when the wall clock advances.
///
/// * **The host.** The driver is a thin host around the same
///   [`Worker`](crate::runtime::worker::Worker) every runtime drives: it
///   moves bytes between the worker and an in-memory log, and the worker
///   makes every decision (start positions, position capture, commits,
///   aborts, changelog restore).
/// * **The log.** Every topic has in-memory partitions with real offsets,
///   and each stage has its changelog topics. Each processing step is one
///   transaction: its outputs and changelog records are appended, then a
///   commit marker on every partition it wrote, and the consumed positions
///   are committed. Consumers read `read_committed`: markers and aborted
///   records occupy offsets and are never returned, so the protocol's
///   density adaptation (bridging skipped offsets, position advances past
///   trailing markers) runs in every test.
/// * **Scheduling.** After every pipe or clock advance the driver runs to
///   quiescence, one step per task in turn (stages in application order,
///   then partitions), each step feeding one record or one position
///   advance, rotating over the task's channels. The same calls always
///   produce the same run.
/// * **Failure.** A failing step aborts: nothing of it is committed, the
///   records it had emitted stay in the log as aborted records (with an
///   abort marker), every task returns to its committed state, and the
///   error is returned. The next call (any pipe, [`run`](Self::run), or
///   clock advance) redelivers the same records in the same order.
///
/// Pipe records with [`pipe`](Self::pipe) / [`pipe_input`](Self::pipe_input)
/// (optionally with stamps of your own, see [`Input::after`]), read
/// committed records with [`records`](Self::records), see what is held with
/// [`held`](Self::held) and what was delivered where with
/// [`deliveries`](Self::deliveries).
pub struct TestDriver {
    app: Parsley,
    log: Log,
    wall_clock: i64,
    worker: Worker,
    /// Tasks in scheduling order (stages in application order, then
    /// partitions).
    slots: Vec<DriverTask>,
    /// The consumer's fetch positions.
    positions: BTreeMap<(String, i32), i64>,
    /// The group's committed positions.
    group_offsets: BTreeMap<(String, i32), i64>,
    deliveries: Vec<StageDelivery>,
    budget: usize,
    aborts: usize,
    /// Each task by its sender identity, to tag the records it produces.
    senders: BTreeMap<SenderId, TaskId>,
    /// How many records of each topic the `read_*` cursors handed out.
    cursors: BTreeMap<String, usize>,
}

impl fmt::Debug for TestDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDriver")
            .field("application_id", &self.app.application_id())
            .field("wall_clock", &self.wall_clock)
            .field(
                "tasks",
                &self.slots.iter().map(|s| &s.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl TestDriver {
    /// A driver with every topic at one partition and the wall clock at 0.
    pub fn new(app: &Parsley) -> Result<TestDriver, DriverError> {
        TestDriver::builder(app).build()
    }

    /// Configures a driver.
    pub fn builder(app: &Parsley) -> TestDriverBuilder {
        TestDriverBuilder {
            app: app.clone(),
            partitions: BTreeMap::new(),
            wall_clock: 0,
            budget: DEFAULT_STEP_BUDGET,
        }
    }

    /// The application under test.
    pub fn app(&self) -> &Parsley {
        &self.app
    }

    /// The driver's wall clock (milliseconds).
    pub fn wall_clock(&self) -> i64 {
        self.wall_clock
    }

    /// The tasks, in scheduling order.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.slots.iter().map(|s| s.id.clone()).collect()
    }

    /// Counters of the live task incarnations, in scheduling order (a
    /// restarted task starts counting again).
    pub fn task_stats(&self) -> Vec<(TaskId, TaskStats)> {
        self.slots
            .iter()
            .filter_map(|s| self.worker.task(&s.id).map(|t| (s.id.clone(), t.stats())))
            .collect()
    }

    /// How many steps have aborted so far.
    pub fn aborts(&self) -> usize {
        self.aborts
    }

    /// How many aborted records a partition holds (records of transactions
    /// that aborted: they take offsets and are never read).
    pub fn aborted_records(&self, topic: &str, partition: i32) -> Result<usize, DriverError> {
        let t = self.topic_log(topic)?;
        self.check_partition(topic, t, partition)?;
        Ok(t.partitions[partition as usize]
            .iter()
            .filter(|e| matches!(e, Entry::Aborted(_)))
            .count())
    }

    /// The host core the driver runs on (read-only).
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// The partition count of `topic`.
    pub fn partitions(&self, topic: &str) -> Option<i32> {
        self.log
            .topics
            .get(topic)
            .map(|t| t.partitions.len() as i32)
    }

    /// The channel (topic id and partition) of a partition of `topic`, for
    /// building raw clocks.
    pub fn channel(&self, topic: &str, partition: i32) -> Result<Channel, DriverError> {
        let t = self.topic_log(topic)?;
        self.check_partition(topic, t, partition)?;
        Ok(Channel::new(t.id, partition))
    }

    /// The partition a keyed record lands on, as Kafka's default producer
    /// partitioner picks it (null keys go to partition 0).
    pub fn partition_of<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
    ) -> Result<i32, DriverError> {
        let n = self.topic_log(topic.name())?.partitions.len() as i32;
        let key = encode_part(
            topic.name(),
            topic.key_codec(),
            key.into_nullable(),
            Part::Key,
        )?;
        Ok(partition_for(key.as_deref(), 0, n))
    }

    /// The offset the next record appended to a partition will get.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Result<i64, DriverError> {
        let t = self.topic_log(topic)?;
        self.check_partition(topic, t, partition)?;
        Ok(t.partitions[partition as usize].len() as i64)
    }

    /// Where the next record piped with `key` to `topic` will land: use it
    /// with [`Input::after`] to claim a cause before piping it.
    pub fn next_coordinate<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
    ) -> Result<Coordinate, DriverError> {
        let p = self.partition_of(topic, key)?;
        Ok(Coordinate::new(
            topic.name(),
            p,
            self.next_offset(topic.name(), p)?,
        ))
    }

    /// Pipes one record (key and value, `None` for null) and runs to
    /// quiescence. Returns where the record landed.
    pub fn pipe<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Result<Coordinate, DriverError> {
        self.pipe_input(topic, Input::new(key, value))
    }

    /// Pipes one record with options and runs to quiescence.
    pub fn pipe_input<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
        input: Input<K, V>,
    ) -> Result<Coordinate, DriverError> {
        let at = self.append(topic, input)?;
        self.run()?;
        Ok(at)
    }

    /// Appends one record without processing anything (call
    /// [`run`](Self::run) after). Useful to queue several records, or to keep
    /// the coordinate when processing is expected to fail.
    pub fn append<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
        input: Input<K, V>,
    ) -> Result<Coordinate, DriverError> {
        let name = topic.name();
        let key = encode_part(name, topic.key_codec(), input.key, Part::Key)?;
        let value = encode_part(name, topic.value_codec(), input.value, Part::Value)?;
        let n = self.topic_log(name)?.partitions.len() as i32;
        let partition = input
            .partition
            .unwrap_or_else(|| partition_for(key.as_deref(), 0, n));
        let mut clock = input.clock;
        self.claim_records(&mut clock, &input.after)?;
        let mut headers = input.headers;
        if !clock.is_empty() {
            headers.push(Header::new(CLOCK_HEADER, clock.encode()));
        }
        self.append_raw(
            name,
            partition,
            key,
            value,
            input.timestamp.unwrap_or(self.wall_clock),
            headers,
        )
    }

    /// Appends raw bytes to a partition without processing anything (for
    /// piping bytes a codec cannot decode, or headers of your own making).
    pub fn append_raw(
        &mut self,
        topic: &str,
        partition: i32,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        timestamp: i64,
        headers: Vec<Header>,
    ) -> Result<Coordinate, DriverError> {
        let t = self.topic_log(topic)?;
        self.check_partition(topic, t, partition)?;
        let record = StoredRecord {
            key,
            value,
            timestamp,
            headers,
            producer: None,
        };
        let offset =
            self.log
                .append(topic, partition, record)
                .ok_or_else(|| DriverError::UnknownTopic {
                    topic: topic.to_owned(),
                })?;
        Ok(Coordinate::new(topic, partition, offset))
    }

    /// Copies the log of one partition from another driver (another
    /// application sharing the same cluster), entry for entry, records and
    /// transaction markers alike, from this driver's end offset through
    /// `through_offset`. Offsets, bytes and headers stay exactly as they
    /// were, so the copied stamps keep naming the right records. Nothing is
    /// processed; call [`run`](Self::run) after.
    ///
    /// This is how a test controls the order in which one application sees
    /// another's outputs: copy an effect before its cause and watch it held.
    /// Returns how many entries were copied.
    pub fn append_from(
        &mut self,
        source: &TestDriver,
        topic: &str,
        partition: i32,
        through_offset: i64,
    ) -> Result<usize, DriverError> {
        let from = source.topic_log(topic)?;
        source.check_partition(topic, from, partition)?;
        let to = self.topic_log(topic)?;
        self.check_partition(topic, to, partition)?;
        let start = to.partitions[partition as usize].len();
        let entries = &from.partitions[partition as usize];
        let end = usize::try_from(through_offset.saturating_add(1))
            .unwrap_or(0)
            .min(entries.len());
        let copied: Vec<Entry> = entries
            .get(start..end)
            .map(<[Entry]>::to_vec)
            .unwrap_or_default();
        let n = copied.len();
        for e in copied {
            match e {
                Entry::Record { record, .. } => {
                    self.log.append(topic, partition, record);
                }
                Entry::Aborted(record) => {
                    self.log.append_aborted(topic, partition, record);
                }
                Entry::Marker => self.log.append_marker(topic, partition),
            }
        }
        Ok(n)
    }

    /// [`append_from`](Self::append_from) for every partition of `topic`,
    /// through the source's end.
    pub fn append_all_from(
        &mut self,
        source: &TestDriver,
        topic: &str,
    ) -> Result<usize, DriverError> {
        let n = source.topic_log(topic)?.partitions.len() as i32;
        let mut copied = 0;
        for p in 0..n {
            copied += self.append_from(source, topic, p, i64::MAX - 1)?;
        }
        Ok(copied)
    }

    /// Advances the wall clock by `by`: every task is told the new time (a
    /// ticking task emits a tick when one is due), then the driver runs to
    /// quiescence, so ticks are delivered through the tick topic.
    pub fn advance_wall_clock(&mut self, by: Duration) -> Result<(), DriverError> {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.wall_clock = self.wall_clock.saturating_add(by);
        let now = self.wall_clock;
        if let Err(e) = self.worker.punctuate(now, &self.log) {
            return Err(self.abort(e));
        }
        self.commit()?;
        self.run()
    }

    /// Processes until nothing is left to do: every fetchable record has
    /// gone through its task and every position advance was reported. Also
    /// retries steps that failed before.
    pub fn run(&mut self) -> Result<(), DriverError> {
        let mut steps = 0usize;
        loop {
            let mut progressed = false;
            for i in 0..self.slots.len() {
                if self.step(i)? {
                    progressed = true;
                    steps += 1;
                }
            }
            if !progressed {
                return Ok(());
            }
            if steps > self.budget {
                return Err(DriverError::NoQuiescence { steps: self.budget });
            }
        }
    }

    /// Discards every task and starts each from its committed state, as a
    /// crash or a redeploy would; then runs to quiescence.
    pub fn restart(&mut self) -> Result<(), DriverError> {
        // What survives a crash: the log (changelogs included) and the
        // group's committed offsets. The new worker restores every task
        // from its changelogs.
        self.worker = Worker::new(&self.app, driver_config());
        self.start_worker()?;
        self.run()
    }

    /// The committed state of `key` in the stage `store` belongs to
    /// (`None` when the key has no state); `store` comes from
    /// [`StageBuilder::store`](crate::StageBuilder::store) and carries the
    /// key codec and state type.
    pub fn state<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: impl IntoNullable<K>,
    ) -> Result<Option<S>, DriverError> {
        self.fold_state(store.stage(), store.key_codec(), key)
    }

    /// The committed tick state of task `partition` of the stage `store`
    /// belongs to.
    pub fn tick_state_of<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        partition: i32,
    ) -> Result<Option<S>, DriverError> {
        self.tick_state(store.stage(), partition)
    }

    /// Every record now gating a channel, with what it waits for: one
    /// entry per held queue head, longest-held first.
    pub fn held(&self) -> Vec<HeldRecord> {
        let mut held: Vec<HeldRecord> = self
            .slots
            .iter()
            .filter_map(|s| self.worker.task(&s.id))
            .flat_map(|t| t.held())
            .collect();
        crate::holds::sort_longest_first(&mut held);
        held
    }

    /// Every task's metrics, sampled now (the same numbers the runtime
    /// records through the `metrics` facade; see
    /// [`runtime::metrics`](crate::runtime::metrics)).
    pub fn metrics(&mut self) -> Vec<TaskMetrics> {
        self.worker.sample().metrics.clone()
    }

    /// The committed fold state of `key` in `stage`, decoded with the
    /// stage's state codec (`None` when the key has no state). The key is
    /// encoded with `key_codec`; every task of the stage is searched.
    pub fn fold_state<S: 'static, K: 'static>(
        &self,
        stage: &str,
        key_codec: &Codec<K>,
        key: impl IntoNullable<K>,
    ) -> Result<Option<S>, DriverError> {
        let key = encode_state_key(stage, key_codec, key)?;
        self.slot_state(stage, &FoldKey::for_key(key.as_deref()), None)
    }

    /// The committed state of `key` in the stage `store` belongs to, once
    /// that stage has delivered every record in `after` that is on one of
    /// its inputs: the read a service makes after its own write
    /// (read-your-writes across the pipeline). The driver runs to
    /// quiescence first; a cause still missing then (held behind its own
    /// causes, or never piped) fails with [`DriverError::CausesMissing`],
    /// naming what the task waits for. On Kafka the same query waits, up
    /// to a timeout.
    ///
    /// ```
    /// use parsley::{Codec, Input, Message, Parsley, Stage, Step, TestDriver, Topic, DriverError};
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let notes: Topic<String, String> = Topic::new("notes", Codec::utf8(), Codec::utf8());
    /// let stage = Stage::named("totals").state(Codec::int64(), || 0);
    /// let totals = stage.store(Codec::utf8());
    /// let stage = stage
    ///     .fold(&orders, |t: i64, m: &Message<String, i64>| Step::to(t + m.value().copied().unwrap_or(0)))
    ///     .fold(&notes, |t: i64, _m: &Message<String, String>| Step::to(t))
    ///     .build()?;
    /// let app = Parsley::named("shop", [stage])?;
    /// let mut driver = TestDriver::new(&app)?;
    /// let written = driver.pipe(&orders, "acct-1", 30)?;
    /// assert_eq!(driver.state_after(&totals, "acct-1", &[written])?, Some(30));
    /// // An order held behind a note that was never written is not in the
    /// // state yet, and the query says what it waits for.
    /// let note = driver.next_coordinate(&notes, "acct-1")?;
    /// let held = driver.pipe_input(&orders, Input::new("acct-1", 12).after(&note))?;
    /// match driver.state_after(&totals, "acct-1", &[held]) {
    ///     Err(DriverError::CausesMissing { waiting_on, .. }) => assert_eq!(waiting_on[0].topic(), "orders"),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state_after<K: 'static, S: 'static>(
        &mut self,
        store: &StateStore<K, S>,
        key: impl IntoNullable<K>,
        after: &[Coordinate],
    ) -> Result<Option<S>, DriverError> {
        self.run()?;
        let stage = store.stage().to_owned();
        let key = encode_state_key(&stage, store.key_codec(), key)?;
        let mut clock = VectorClock::new();
        self.claim_records(&mut clock, after)?;
        let st = self
            .app
            .stage(&stage)
            .ok_or_else(|| DriverError::UnknownStage {
                stage: stage.clone(),
            })?;
        let first_source = st.source_topics().first().map(|t| (*t).to_owned());
        let partitions = match first_source {
            Some(t) => self.topic_log(&t)?.partitions.len() as i32,
            None => 1,
        };
        // A null key's state is kept by whichever task saw it: the one its
        // records were piped to (partition 0 by default).
        let partition = partition_for(key.as_deref(), 0, partitions);
        let query = StateQuery {
            task: TaskId {
                stage: stage.clone(),
                partition,
            },
            key: FoldKey::for_key(key.as_deref()),
            after: Some(clock),
            // The driver has run to quiescence: nothing more will come, so
            // the query is answered now, value or what it waits for.
            deadline: i64::MIN,
        };
        self.worker.query(0, query);
        let answer = self.worker.take_query_answers().pop().map(|(_, a)| a);
        match answer {
            Some(QueryAnswer::Value(bytes)) => {
                let codec = self.state_codec::<S>(&stage)?;
                bytes.map(|b| decode_state(&stage, codec, &b)).transpose()
            }
            Some(QueryAnswer::TimedOut(waiting_on)) => {
                Err(DriverError::CausesMissing { stage, waiting_on })
            }
            // Every task runs here, settled after the run: a stage whose
            // task did not start (it failed) answers so.
            other => Err(DriverError::QueryNotAnswered {
                stage,
                answer: format!("{other:?}"),
            }),
        }
    }

    /// The committed tick state of task `partition` of `stage`.
    pub fn tick_state<S: 'static>(
        &self,
        stage: &str,
        partition: i32,
    ) -> Result<Option<S>, DriverError> {
        self.slot_state(stage, &FoldKey::Ticks, Some(partition))
    }

    fn slot_state<S: 'static>(
        &self,
        stage: &str,
        slot: &FoldKey,
        partition: Option<i32>,
    ) -> Result<Option<S>, DriverError> {
        let codec = self.state_codec::<S>(stage)?;
        for s in self.slots.iter().filter(|s| s.id.stage == stage) {
            if partition.is_some_and(|p| p != s.id.partition) {
                continue;
            }
            let Some(task) = self.worker.task(&s.id) else {
                continue;
            };
            if let Some(bytes) = task.stores().fold.get(slot) {
                return decode_state(stage, codec, &bytes).map(Some);
            }
        }
        Ok(None)
    }

    /// The state codec of `stage`, typed.
    fn state_codec<S: 'static>(&self, stage: &str) -> Result<&Codec<S>, DriverError> {
        let st = self
            .app
            .stage(stage)
            .ok_or_else(|| DriverError::UnknownStage {
                stage: stage.to_owned(),
            })?;
        match &st.def.state {
            None => Err(DriverError::StateType {
                stage: stage.to_owned(),
                expected: std::any::type_name::<S>(),
                found: "no state".to_owned(),
            }),
            Some(decl) => {
                decl.codec
                    .downcast_ref::<Codec<S>>()
                    .ok_or_else(|| DriverError::StateType {
                        stage: stage.to_owned(),
                        expected: std::any::type_name::<S>(),
                        found: format!("state of type {}", decl.type_name),
                    })
            }
        }
    }

    /// Claims each record of `records` (by its coordinate) in `clock`.
    fn claim_records(
        &self,
        clock: &mut VectorClock,
        records: &[Coordinate],
    ) -> Result<(), DriverError> {
        for r in records {
            let t = self.topic_log(&r.topic)?;
            self.check_partition(&r.topic, t, r.partition)?;
            clock.claim_offset(Channel::new(t.id, r.partition), r.offset);
        }
        Ok(())
    }

    fn topic_log(&self, topic: &str) -> Result<&TopicLog, DriverError> {
        self.log
            .topics
            .get(topic)
            .ok_or_else(|| DriverError::UnknownTopic {
                topic: topic.to_owned(),
            })
    }

    fn check_partition(
        &self,
        topic: &str,
        t: &TopicLog,
        partition: i32,
    ) -> Result<(), DriverError> {
        let n = t.partitions.len() as i32;
        if partition < 0 || partition >= n {
            return Err(DriverError::InvalidPartition {
                topic: topic.to_owned(),
                partition,
                partitions: n,
            });
        }
        Ok(())
    }

    /// Hands the worker every partition of every task (one stream thread
    /// owns the whole application), with the group's committed offsets,
    /// then makes the seeks and commits the first transaction.
    fn start_worker(&mut self) -> Result<(), DriverError> {
        let mut partitions = Vec::new();
        for slot in &self.slots {
            for (topic, p) in &slot.partitions {
                // A partition that does not exist is the task's to report
                // (with every topic's count), not the driver's.
                let end = self
                    .log
                    .topics
                    .get(topic)
                    .and_then(|t| t.partitions.get(usize::try_from(*p).ok()?))
                    .map_or(0, |e| e.len() as i64);
                partitions.push(AssignedPartition {
                    topic: topic.clone(),
                    partition: *p,
                    committed: self.group_offsets.get(&(topic.clone(), *p)).copied(),
                    log_start: 0,
                    end: Some(end),
                });
            }
        }
        let now = self.wall_clock;
        if let Err(e) = self.worker.assign(partitions, &self.log, now) {
            self.aborts += 1;
            return Err(e.into());
        }
        if let Err(e) = self.seek() {
            return Err(self.abort(e));
        }
        // Records released at init belong to the first transaction.
        self.commit()
    }

    /// Acts on what the worker has for the driver, through the worker's one
    /// act loop ([`act_on`]; [`Driving`] says what the driver does with
    /// each part), and returns the transaction, if one was closed.
    fn take_ready(&mut self) -> Result<Option<Transaction>, WorkerError> {
        let ready = self.worker.ready(None)?;
        let mut host = Driving {
            driver: self,
            closed: None,
            refused: None,
        };
        let acted = act_on(&mut host, ready);
        let closed = host.closed;
        match (acted, host.refused) {
            (Err(e), _) | (Ok(()), Some(e)) => {
                if closed.is_some() {
                    // Never committed now: the worker hears it aborted, so
                    // the abort that follows the error finds nothing in
                    // flight.
                    self.worker
                        .advance(Ack::Committed(CommitOutcome::Aborted), &self.log)?;
                }
                Err(e)
            }
            (Ok(()), None) => Ok(closed),
        }
    }

    /// The records of an aborted open transaction, as the broker keeps
    /// them: aborted records and a marker on each partition they reached.
    fn log_aborted(&mut self, abandoned: Vec<OutgoingRecord>) {
        let mut touched = BTreeSet::new();
        for r in abandoned {
            let producer = self.producer_of(&r);
            touched.insert((r.topic.clone(), r.partition));
            let (topic, partition) = (r.topic.clone(), r.partition);
            self.log
                .append_aborted(&topic, partition, stored(r, producer));
        }
        for (topic, partition) in touched {
            self.log.append_marker(&topic, partition);
        }
    }

    /// [`take_ready`](Self::take_ready) where no transaction was closed
    /// (only [`commit`](Self::commit) closes one). Should one come out, it
    /// is reported aborted rather than left in flight.
    fn seek(&mut self) -> Result<(), WorkerError> {
        if self.take_ready()?.is_some() {
            debug_assert!(false, "only a commit closes a transaction");
            let aborted = Ack::Committed(CommitOutcome::Aborted);
            self.worker.advance(aborted, &self.log)?;
        }
        Ok(())
    }

    /// One step of a task: one record (and the position after it) or one
    /// position advance past markers, then the commit.
    fn step(&mut self, i: usize) -> Result<bool, DriverError> {
        let n = self.slots[i].partitions.len();
        if n == 0 || self.worker.task(&self.slots[i].id).is_none() {
            return Ok(false);
        }
        let start = self.slots[i].cursor % n;
        for k in 0..n {
            let (topic, partition) = self.slots[i].partitions[(start + k) % n].clone();
            let Ok(t) = self.topic_log(&topic) else {
                continue;
            };
            let c = Channel::new(t.id, partition);
            let key = (topic.clone(), partition);
            let pos = self.positions.get(&key).copied().unwrap_or(0);
            let r = match self.log.next(c, pos) {
                NextEntry::Nothing => continue,
                NextEntry::Record(offset) => self.feed(&topic, partition, c, offset),
                NextEntry::OnlyMarkers(end) => {
                    self.positions.insert(key, end);
                    self.worker.on_position(&topic, partition, end, None)
                }
            };
            if let Err(e) = r {
                return Err(self.abort(e));
            }
            self.slots[i].cursor = (start + k + 1) % n;
            self.commit()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Polls one record: hands it to the worker, then the consumer's
    /// position after it (past any markers that follow).
    fn feed(
        &mut self,
        topic: &str,
        partition: i32,
        c: Channel,
        offset: i64,
    ) -> Result<(), WorkerError> {
        let Some(Entry::Record { record, .. }) = self
            .log
            .partition(c)
            .and_then(|e| e.get(offset as usize))
            .cloned()
        else {
            return Ok(());
        };
        let after = self.log.position_after(c, offset);
        self.positions.insert((topic.to_owned(), partition), after);
        self.worker.on_record(PolledRecord {
            topic: topic.to_owned(),
            partition,
            offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers: record.headers,
        })?;
        self.worker
            .on_position(topic, partition, after, Some(offset))
    }

    /// Commits the open transaction: records, then a commit marker on every
    /// partition written, then the consumed positions.
    fn commit(&mut self) -> Result<(), DriverError> {
        let txn = match self.worker.flush().and_then(|()| self.take_ready()) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok(()),
            Err(e) => return Err(self.abort(e)),
        };
        let Transaction {
            records,
            offsets,
            events,
            ..
        } = txn;
        // All or nothing: a record for a partition the log lacks aborts the
        // whole transaction.
        if let Some(r) = records
            .iter()
            .find(|r| self.log.partition_mut(&r.topic, r.partition).is_none())
        {
            let topic = r.topic.clone();
            self.aborts += 1;
            self.worker
                .advance(Ack::Committed(CommitOutcome::Aborted), &self.log)
                .map_err(DriverError::from)?;
            self.seek()?;
            return Err(DriverError::UnknownTopic {
                topic: topic.to_string(),
            });
        }
        let mut touched = BTreeSet::new();
        for r in records {
            let producer = self.producer_of(&r);
            touched.insert((r.topic.clone(), r.partition));
            let (topic, partition) = (r.topic.clone(), r.partition);
            self.log.append(&topic, partition, stored(r, producer));
        }
        for (topic, partition) in touched {
            self.log.append_marker(&topic, partition);
        }
        if let Err(e) = self
            .worker
            .advance(Ack::Committed(CommitOutcome::Committed), &self.log)
        {
            return Err(e.into());
        }
        for o in offsets {
            self.group_offsets.insert((o.topic, o.partition), o.offset);
        }
        for e in events {
            if let TaskEvent::Delivered(d) = e.event {
                self.deliveries.push(StageDelivery {
                    task: e.task,
                    coordinate: d.coordinate,
                    timestamp: d.timestamp,
                    was_held: d.was_held,
                    tick: d.tick,
                });
            }
        }
        Ok(())
    }

    /// Which task produced a record: the driver tags records with their
    /// producing task for tests, by the sender of the stamp the task wrote.
    /// Unstamped records (changelog records, dead letters, which carry an
    /// input's headers as they were) name none.
    fn producer_of(&self, r: &OutgoingRecord) -> Option<TaskId> {
        let sender = r.stamp.as_ref()?.sender.sender;
        self.senders.get(&sender).cloned()
    }

    /// Aborts the open transaction: what it had emitted stays in the log as
    /// aborted records, every task goes back to its committed state, and
    /// the consumer seeks back.
    fn abort(&mut self, error: WorkerError) -> DriverError {
        tracing::debug!(%error, "step aborted; the tasks return to their committed state");
        self.aborts += 1;
        if let Err(e) = self.worker.abort(&self.log) {
            return e.into();
        }
        // What the transaction had produced is logged aborted, and the
        // failed task restarts from its committed state at once: the next
        // run retries the step that failed.
        if let Err(e) = self.seek() {
            return e.into();
        }
        error.into()
    }
}

/// The driver as the worker's act loop sees it. A failed task restarts
/// from its committed state at once (the next run retries the step that
/// failed); a restore job runs at once; each seek is made at once (the
/// driver's consumer is a map entry: it cannot fail); a closed transaction
/// is kept for [`TestDriver::commit`], which commits it next. Fetch pauses
/// are not needed: the driver fetches one record at a time from its log,
/// never ahead of the task. Nothing waits between polls, so a backoff and
/// a metrics sample (read on demand) are dropped.
struct Driving<'a> {
    driver: &'a mut TestDriver,
    closed: Option<Transaction>,
    /// A restore outcome the worker refused (the driver restores inline,
    /// so none comes out in practice).
    refused: Option<WorkerError>,
}

impl Host for Driving<'_> {
    type Error = WorkerError;

    fn ready(&mut self) -> Result<Ready, WorkerError> {
        self.driver.worker.ready(None)
    }

    fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError> {
        self.driver.worker.advance(ack, &self.driver.log)
    }

    fn abandoned(&mut self, records: Vec<OutgoingRecord>) {
        self.driver.log_aborted(records);
    }

    fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), WorkerError> {
        for failure in failures {
            let d = &mut *self.driver;
            d.worker.restart_task(&failure.task, &d.log)?;
        }
        Ok(())
    }

    fn restores(&mut self, jobs: Vec<RestoreJob>) {
        for job in jobs {
            let d = &mut *self.driver;
            let outcome = job.run(&d.log, &d.log);
            if let Err(e) = d.worker.advance(Ack::Restored(outcome), &d.log) {
                self.refused.get_or_insert(e);
            }
        }
    }

    fn published(&mut self, _sample: crate::runtime::metrics::Published) {}

    fn backoff(&mut self, _pause: Duration) {}

    fn flow(&mut self, _change: crate::runtime::host::FlowChange) {}

    fn seek(&mut self, s: &Seek) -> Result<(), WorkerError> {
        self.driver
            .positions
            .insert((s.topic.clone(), s.partition), s.offset);
        Ok(())
    }

    fn transaction(&mut self, txn: Transaction) -> Result<(), WorkerError> {
        debug_assert!(self.closed.is_none(), "one transaction closes at a time");
        self.closed.get_or_insert(txn);
        Ok(())
    }
}
