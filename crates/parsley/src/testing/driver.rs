//! The broker-less test host: [`TestDriver`].

mod error;
mod log;
mod records;
mod state;
mod steps;

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

pub use error::DriverError;
use log::{Entry, Log, NextEntry, StoredRecord, TopicLog, stored};

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

/// Configures a [`TestDriver`]: partition counts, the initial wall clock and
/// the step budget.
#[derive(Debug)]
pub struct TestDriverBuilder {
    app: Parsley,
    partitions: BTreeMap<String, i32>,
    wall_clock: i64,
    budget: usize,
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

    /// The partition a keyed record lands on, as the topic's producers'
    /// partitioner picks it ([`Topic::partitioned_by`], Kafka's default
    /// unless declared; null keys go to partition 0).
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
        Ok(topic.partitioner().partition_for(key.as_deref(), 0, n))
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
            .unwrap_or_else(|| topic.partitioner().partition_for(key.as_deref(), 0, n));
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
}
