//! Task metrics: what each task records through the [`metrics`] facade,
//! and the snapshot a host publishes.
//!
//! Holding is invisible to ordinary consumer-lag monitoring: a task's
//! consumer position moves past the records it holds, so a stalled task
//! can show no lag at all. These metrics are the signal to alert on.
//!
//! Every series carries the labels `thread-id`, `task-id` (`stage[p]`) and
//! `stage`; the per-topic pair adds `topic`. Counters move where their
//! events happen (right after the call into the task that caused them);
//! gauges are sampled every [`SAMPLE_INTERVAL`] when the host punctuates.
//! The names are the Java library's, so dashboards carry over; a
//! Prometheus recorder renders `-` as `_` (`records_held`), and a prefix
//! layer on the recorder can add a namespace.
//!
//! When a task leaves the thread (revoked, fenced, closed) its gauges are
//! set to zero, since the `metrics` facade cannot unregister a series: a
//! moved task must not keep an old hold age alerting under its old
//! `thread-id`. Exporters drop idle series on their own (the Prometheus
//! exporter's idle timeout). The published snapshot
//! ([`Worker::published`](crate::runtime::worker::Worker::published)) only
//! ever lists the tasks the thread runs.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics::{Counter, Gauge, Label};

use crate::holds::HeldRecord;
use crate::runtime::task::{Task, TaskId};

/// Records currently held across the task's hold queues (gauge); per
/// topic, on that source's channel.
pub const RECORDS_HELD: &str = "records-held";
/// Milliseconds the longest-gating head has been held, since it became its
/// queue's head (gauge); per topic, that channel's head.
pub const RECORDS_HELD_AGE_MAX_MS: &str = "records-held-age-max-ms";
/// Records released through the gate per second, over the last sample
/// interval (gauge).
pub const RECORDS_DELIVERED_RATE: &str = "records-delivered-rate";
/// Records released through the gate (counter).
pub const RECORDS_DELIVERED_TOTAL: &str = "records-delivered-total";
/// Records fed at or below the frontier and discarded (counter); nonzero
/// only while a rescope refetch replays covered offsets.
pub const REPLAYS_SKIPPED_TOTAL: &str = "replays-skipped-total";
/// Truncation sweeps that failed and skipped their cycle (counter).
pub const TRUNCATION_SWEEPS_SKIPPED_TOTAL: &str = "truncation-sweeps-skipped-total";
/// Tick records emitted (counter).
pub const TICKS_EMITTED_TOTAL: &str = "ticks-emitted-total";
/// Records sent to a dead-letter topic (counter): emissions a sink
/// refused, and input records stepped past.
pub const RECORDS_DEAD_LETTERED_TOTAL: &str = "records-dead-lettered-total";
/// Records a stateful stage folded whose key its sources' partitioner
/// places on another partition than the one they came from (counter): a
/// producer that does not partition as the topic declares. Their state is
/// kept, but not where a query for the key looks.
pub const RECORDS_KEY_MISPLACED_TOTAL: &str = "records-key-misplaced-total";
/// Offset entries in the stamp-side clock (gauge).
pub const STAMP_OFFSET_ENTRIES: &str = "stamp-offset-entries";
/// Sequence entries in the stamp-side clock (gauge).
pub const STAMP_SEQUENCE_ENTRIES: &str = "stamp-sequence-entries";

/// What the records in the task's hold queues take, in bytes (gauge),
/// counted as the hold budget counts them (key, value, headers and clock
/// of each record, and its fixed size).
pub const RECORDS_HELD_BYTES: &str = "records-held-bytes";
/// The most the task may hold before it pauses fetching, in bytes (gauge;
/// 0 when unbounded).
pub const HOLD_BUDGET_BYTES: &str = "hold-budget-bytes";
/// Held records paged out of the task's node: kept only in its committed
/// protocol store, or its state file, until the gate reaches them
/// (gauge).
pub const RECORDS_HELD_PAGED: &str = "records-held-paged";
/// What the paged-out held records take, counted as the hold budget counts
/// them (gauge).
pub const RECORDS_HELD_PAGED_BYTES: &str = "records-held-paged-bytes";
/// Held records read back from the committed store as the gate reached
/// them (counter).
pub const RECORDS_PAGED_IN_TOTAL: &str = "records-paged-in-total";
/// What the task's fold state kept in memory takes, estimated, when it
/// reads through a bounded cache (gauge; 0 otherwise).
pub const FOLD_CACHE_BYTES: &str = "fold-cache-bytes";
/// Fold state entries read from the task's local store because they had
/// left memory (counter).
pub const FOLD_STORE_READS_TOTAL: &str = "fold-store-reads-total";
/// Fold state entries that left memory for the task's local store
/// (counter).
pub const FOLD_CACHE_EVICTIONS_TOTAL: &str = "fold-cache-evictions-total";
/// Fold state reads of keys in neither memory nor, by the key filter's
/// answer, the task's local store: answered without reading it (counter).
pub const FOLD_STORE_READS_SKIPPED_TOTAL: &str = "fold-store-reads-skipped-total";
/// The task's partitions whose fetching is paused because its holds passed
/// the budget (gauge).
pub const PARTITIONS_PAUSED: &str = "partitions-paused";
/// Times one of the task's partitions was paused for the hold budget
/// (counter).
pub const HOLD_PAUSES_TOTAL: &str = "hold-pauses-total";

/// Changelog records replayed by the task's restores (counter).
pub const RECORDS_RESTORED_TOTAL: &str = "records-restored-total";
/// Changelog offsets the task's restore still has to read (gauge): set as
/// a restore goes, zero once it is done. Offsets include transaction
/// markers, so this is an upper bound on the records.
pub const RESTORE_REMAINING: &str = "restore-records-remaining";

/// How often gauges are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);

/// One task's metrics at a sample.
#[derive(Clone, PartialEq, Debug)]
pub struct TaskMetrics {
    /// The stream thread running the task.
    pub thread_id: String,
    /// The task.
    pub task: TaskId,
    /// [`RECORDS_HELD`].
    pub records_held: u64,
    /// [`RECORDS_HELD_AGE_MAX_MS`] (0 when nothing is held).
    pub records_held_age_max_ms: i64,
    /// [`RECORDS_DELIVERED_RATE`].
    pub records_delivered_rate: f64,
    /// [`RECORDS_DELIVERED_TOTAL`], since the task came to this thread.
    pub records_delivered_total: u64,
    /// [`REPLAYS_SKIPPED_TOTAL`].
    pub replays_skipped_total: u64,
    /// [`TRUNCATION_SWEEPS_SKIPPED_TOTAL`].
    pub truncation_sweeps_skipped_total: u64,
    /// [`TICKS_EMITTED_TOTAL`].
    pub ticks_emitted_total: u64,
    /// [`RECORDS_DEAD_LETTERED_TOTAL`].
    pub records_dead_lettered_total: u64,
    /// [`RECORDS_KEY_MISPLACED_TOTAL`].
    pub records_key_misplaced_total: u64,
    /// [`STAMP_OFFSET_ENTRIES`].
    pub stamp_offset_entries: u64,
    /// [`STAMP_SEQUENCE_ENTRIES`].
    pub stamp_sequence_entries: u64,
    /// [`RECORDS_HELD_BYTES`].
    pub records_held_bytes: u64,
    /// [`HOLD_BUDGET_BYTES`].
    pub hold_budget_bytes: u64,
    /// [`RECORDS_HELD_PAGED`].
    pub records_held_paged: u64,
    /// [`RECORDS_HELD_PAGED_BYTES`].
    pub records_held_paged_bytes: u64,
    /// [`RECORDS_PAGED_IN_TOTAL`], since the task came to this thread.
    pub records_paged_in_total: u64,
    /// [`FOLD_CACHE_BYTES`].
    pub fold_cache_bytes: u64,
    /// [`FOLD_STORE_READS_TOTAL`], since the task started on this thread.
    pub fold_store_reads_total: u64,
    /// [`FOLD_CACHE_EVICTIONS_TOTAL`], since the task started on this
    /// thread.
    pub fold_cache_evictions_total: u64,
    /// [`FOLD_STORE_READS_SKIPPED_TOTAL`], since the task started on this
    /// thread.
    pub fold_store_reads_skipped_total: u64,
    /// [`PARTITIONS_PAUSED`].
    pub partitions_paused: u64,
    /// [`HOLD_PAUSES_TOTAL`], since the task came to this thread.
    pub hold_pauses_total: u64,
    /// The per-topic pair, one entry per source channel (the tick topic
    /// included), in topic order.
    pub topics: Vec<TopicMetrics>,
}

/// One source channel's hold gauges.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TopicMetrics {
    /// The source topic.
    pub topic: String,
    /// [`RECORDS_HELD`] on this channel.
    pub records_held: u64,
    /// [`RECORDS_HELD_AGE_MAX_MS`] of this channel's head.
    pub records_held_age_max_ms: i64,
}

/// What a worker publishes at each sample: every task's metrics and every
/// held head across its tasks, longest-held first. A host copies it where
/// readers can take it without touching the processing path.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Published {
    /// The wall clock of the sample (0: none yet).
    pub at: i64,
    /// One entry per task, in task order.
    pub metrics: Vec<TaskMetrics>,
    /// Every held head, longest-held first.
    pub holds: Vec<HeldRecord>,
}

/// Describes every metric to the installed recorder (units and help
/// text, which the Prometheus exporter prints as `# HELP`).
// Longer than 100 lines on purpose: one description per metric, the
// list every exporter shows.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        RECORDS_HELD,
        Unit::Count,
        "Records held in the task's hold queues (per topic: on that source's channel)."
    );
    describe_gauge!(
        RECORDS_HELD_AGE_MAX_MS,
        Unit::Milliseconds,
        "How long the longest-gating head record has been held, since it became its queue's head."
    );
    describe_gauge!(
        RECORDS_DELIVERED_RATE,
        "Records released through the causal gate per second."
    );
    describe_counter!(
        RECORDS_DELIVERED_TOTAL,
        Unit::Count,
        "Records released through the causal gate."
    );
    describe_counter!(
        REPLAYS_SKIPPED_TOTAL,
        Unit::Count,
        "Records fed at or below the frontier and discarded."
    );
    describe_counter!(
        TRUNCATION_SWEEPS_SKIPPED_TOTAL,
        Unit::Count,
        "Truncation sweeps that failed and skipped their cycle."
    );
    describe_counter!(
        TICKS_EMITTED_TOTAL,
        Unit::Count,
        "Tick records emitted to the stage's tick topic."
    );
    describe_counter!(
        RECORDS_KEY_MISPLACED_TOTAL,
        Unit::Count,
        "Records a stateful stage folded whose key the topic's declared partitioner places on another partition: their producer partitions otherwise, and queries for those keys look in the wrong task."
    );
    describe_counter!(
        RECORDS_DEAD_LETTERED_TOTAL,
        Unit::Count,
        "Records sent to a dead-letter topic: emissions a sink refused, and input records stepped past."
    );
    describe_gauge!(
        RECORDS_HELD_BYTES,
        Unit::Bytes,
        "What the records in the task's hold queues take, as the hold budget counts them."
    );
    describe_gauge!(
        RECORDS_HELD_PAGED,
        Unit::Count,
        "Held records paged out of memory, kept in the task's committed store until the gate reaches them."
    );
    describe_gauge!(
        RECORDS_HELD_PAGED_BYTES,
        Unit::Bytes,
        "What the paged-out held records take, as the hold budget counts them."
    );
    describe_counter!(
        RECORDS_PAGED_IN_TOTAL,
        Unit::Count,
        "Held records read back from the committed store as the gate reached them."
    );
    describe_gauge!(
        FOLD_CACHE_BYTES,
        Unit::Bytes,
        "What the task's fold state kept in memory takes, when it reads through a bounded cache."
    );
    describe_counter!(
        FOLD_STORE_READS_TOTAL,
        Unit::Count,
        "Fold state entries read from the task's local store because they had left memory."
    );
    describe_counter!(
        FOLD_CACHE_EVICTIONS_TOTAL,
        Unit::Count,
        "Fold state entries that left memory for the task's local store."
    );
    describe_counter!(
        FOLD_STORE_READS_SKIPPED_TOTAL,
        Unit::Count,
        "Fold state reads of keys the task's local store cannot hold, answered by its key filter without reading the store."
    );
    describe_gauge!(
        HOLD_BUDGET_BYTES,
        Unit::Bytes,
        "The most the task may hold before it pauses fetching (0: unbounded)."
    );
    describe_gauge!(
        PARTITIONS_PAUSED,
        Unit::Count,
        "The task's partitions whose fetching is paused because its holds passed the budget."
    );
    describe_counter!(
        HOLD_PAUSES_TOTAL,
        Unit::Count,
        "Times one of the task's partitions was paused for the hold budget."
    );
    describe_counter!(
        RECORDS_RESTORED_TOTAL,
        Unit::Count,
        "Changelog records replayed by the task's restores."
    );
    describe_gauge!(
        RESTORE_REMAINING,
        Unit::Count,
        "Changelog offsets the task's restore still has to read (zero when none runs)."
    );
    describe_gauge!(
        STAMP_OFFSET_ENTRIES,
        Unit::Count,
        "Offset entries in the stamp-side clock."
    );
    describe_gauge!(
        STAMP_SEQUENCE_ENTRIES,
        Unit::Count,
        "Sequence entries in the stamp-side clock."
    );
}

/// What a task's bounded fold store counted.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct FoldCounts {
    /// Reads from the local store.
    pub(crate) reads: u64,
    /// Entries that left memory.
    pub(crate) evicted: u64,
    /// Evictions put off because the local store lagged.
    pub(crate) withheld: u64,
    /// Reads the key filter answered without the local store.
    pub(crate) skipped: u64,
}

/// What [`TaskMeters::count`] counted since its last call.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Counted {
    /// Held records paged back in.
    pub(crate) paged_in: u64,
    /// The fold store's counts.
    pub(crate) fold: FoldCounts,
    /// Held records whose in-memory copy left for the local store, and
    /// held records read back from it.
    pub(crate) held_evicted: u64,
    pub(crate) held_disk_reads: u64,
}

#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Totals {
    delivered: u64,
    replays: u64,
    ticks: u64,
    dead_lettered: u64,
    misplaced: u64,
    paged_in: u64,
}

/// A task's registered series and what has been counted so far.
pub(crate) struct TaskMeters {
    thread_id: String,
    delivered: Counter,
    replays: Counter,
    sweeps_skipped: Counter,
    ticks: Counter,
    dead_lettered: Counter,
    misplaced: Counter,
    held: Gauge,
    age: Gauge,
    rate: Gauge,
    offsets: Gauge,
    sequences: Gauge,
    held_bytes: Gauge,
    budget: Gauge,
    paused: Gauge,
    paged: Gauge,
    paged_bytes: Gauge,
    paged_in: Counter,
    fold_bytes: Gauge,
    fold_reads: Counter,
    fold_evictions: Counter,
    fold_skipped: Counter,
    /// The fold store's own counts at the last export (they live as long
    /// as the task's store, across aborts).
    fold_exported: FoldCounts,
    /// The held records' local store counts at the last count (evicted,
    /// read back), kept as the fold store's are.
    held_exported: (u64, u64),
    pauses: Counter,
    pauses_total: u64,
    topics: BTreeMap<String, (Gauge, Gauge)>,
    /// What the current incarnation of the task had counted at the last
    /// export.
    exported: Totals,
    /// Totals across incarnations (an abort rebuilds the task).
    cumulative: Totals,
    sweeps_skipped_total: u64,
    last_sample: Option<(i64, u64)>,
}

impl TaskMeters {
    pub(crate) fn restore(thread_id: &str, task: &TaskId) -> (Counter, Gauge) {
        describe();
        let labels = vec![
            Label::new("thread-id", thread_id.to_owned()),
            Label::new("task-id", task.to_string()),
            Label::new("stage", task.stage.clone()),
        ];
        (
            metrics::counter!(RECORDS_RESTORED_TOTAL, labels.clone()),
            metrics::gauge!(RESTORE_REMAINING, labels),
        )
    }

    pub(crate) fn new(thread_id: &str, task: &Task) -> TaskMeters {
        describe();
        let id = task.id();
        let labels = vec![
            Label::new("thread-id", thread_id.to_owned()),
            Label::new("task-id", id.to_string()),
            Label::new("stage", id.stage.clone()),
        ];
        let counter = |name: &'static str| metrics::counter!(name, labels.clone());
        let gauge = |name: &'static str| metrics::gauge!(name, labels.clone());
        let mut topics = BTreeMap::new();
        for input in task.inputs() {
            let mut l = labels.clone();
            l.push(Label::new("topic", input.topic.clone()));
            // The per-topic pair is detail: recorders that filter by level
            // can leave it out (the Java library records it at DEBUG).
            topics.insert(
                input.topic.clone(),
                (
                    metrics::gauge!(level: metrics::Level::DEBUG, RECORDS_HELD, l.clone()),
                    metrics::gauge!(level: metrics::Level::DEBUG, RECORDS_HELD_AGE_MAX_MS, l),
                ),
            );
        }
        TaskMeters {
            thread_id: thread_id.to_owned(),
            delivered: counter(RECORDS_DELIVERED_TOTAL),
            replays: counter(REPLAYS_SKIPPED_TOTAL),
            sweeps_skipped: counter(TRUNCATION_SWEEPS_SKIPPED_TOTAL),
            ticks: counter(TICKS_EMITTED_TOTAL),
            dead_lettered: counter(RECORDS_DEAD_LETTERED_TOTAL),
            misplaced: counter(RECORDS_KEY_MISPLACED_TOTAL),
            held: gauge(RECORDS_HELD),
            age: gauge(RECORDS_HELD_AGE_MAX_MS),
            rate: gauge(RECORDS_DELIVERED_RATE),
            offsets: gauge(STAMP_OFFSET_ENTRIES),
            sequences: gauge(STAMP_SEQUENCE_ENTRIES),
            held_bytes: gauge(RECORDS_HELD_BYTES),
            budget: gauge(HOLD_BUDGET_BYTES),
            paged: gauge(RECORDS_HELD_PAGED),
            paged_bytes: gauge(RECORDS_HELD_PAGED_BYTES),
            paged_in: counter(RECORDS_PAGED_IN_TOTAL),
            fold_bytes: gauge(FOLD_CACHE_BYTES),
            fold_reads: counter(FOLD_STORE_READS_TOTAL),
            fold_evictions: counter(FOLD_CACHE_EVICTIONS_TOTAL),
            fold_skipped: counter(FOLD_STORE_READS_SKIPPED_TOTAL),
            fold_exported: FoldCounts::default(),
            held_exported: (0, 0),
            paused: gauge(PARTITIONS_PAUSED),
            pauses: counter(HOLD_PAUSES_TOTAL),
            pauses_total: 0,
            topics,
            exported: Totals::default(),
            cumulative: Totals::default(),
            sweeps_skipped_total: 0,
            last_sample: None,
        }
    }

    /// The task was rebuilt (an abort): its own counts start again.
    pub(crate) fn rebase(&mut self) {
        self.exported = Totals::default();
    }

    /// Moves the counters by what the task did since the last call;
    /// returns what it counted.
    pub(crate) fn count(&mut self, task: &Task) -> Counted {
        let fold = self.count_fold(task);
        let (held_evicted, held_disk_reads) = match task.stores().held.stats() {
            Some(h) => {
                let d = (
                    h.evicted.saturating_sub(self.held_exported.0),
                    h.disk_reads.saturating_sub(self.held_exported.1),
                );
                self.held_exported = (h.evicted, h.disk_reads);
                d
            }
            None => (0, 0),
        };
        Counted {
            paged_in: self.count_node(task),
            fold,
            held_evicted,
            held_disk_reads,
        }
    }

    fn count_fold(&mut self, task: &Task) -> FoldCounts {
        let Some(c) = task.stores().fold.cache_stats() else {
            return FoldCounts::default();
        };
        let d = FoldCounts {
            reads: c.disk_reads.saturating_sub(self.fold_exported.reads),
            evicted: c.evicted.saturating_sub(self.fold_exported.evicted),
            withheld: c.withheld.saturating_sub(self.fold_exported.withheld),
            skipped: c.filtered_reads.saturating_sub(self.fold_exported.skipped),
        };
        self.fold_reads.increment(d.reads);
        self.fold_evictions.increment(d.evicted);
        self.fold_skipped.increment(d.skipped);
        self.fold_exported = FoldCounts {
            reads: c.disk_reads,
            evicted: c.evicted,
            withheld: c.withheld,
            skipped: c.filtered_reads,
        };
        d
    }

    fn count_node(&mut self, task: &Task) -> u64 {
        let node = task.node().stats();
        let now = Totals {
            delivered: node.delivered_total,
            replays: node.replays_skipped_total,
            ticks: task.stats().ticks_emitted,
            dead_lettered: task.stats().diverted + task.stats().stepped_past,
            misplaced: task.stats().misplaced_keys,
            paged_in: node.paged_in_total,
        };
        if now == self.exported {
            return 0;
        }
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let (delivered, replays, ticks) = (
            d(now.delivered, self.exported.delivered),
            d(now.replays, self.exported.replays),
            d(now.ticks, self.exported.ticks),
        );
        self.delivered.increment(delivered);
        self.replays.increment(replays);
        self.ticks.increment(ticks);
        let dead_lettered = d(now.dead_lettered, self.exported.dead_lettered);
        self.dead_lettered.increment(dead_lettered);
        self.cumulative.delivered += delivered;
        self.cumulative.replays += replays;
        self.cumulative.ticks += ticks;
        self.cumulative.dead_lettered += dead_lettered;
        let misplaced = d(now.misplaced, self.exported.misplaced);
        self.misplaced.increment(misplaced);
        self.cumulative.misplaced += misplaced;
        let paged_in = d(now.paged_in, self.exported.paged_in);
        self.paged_in.increment(paged_in);
        self.cumulative.paged_in += paged_in;
        self.exported = now;
        paged_in
    }

    /// Some of the task's partitions were paused for the hold budget.
    pub(crate) fn paused(&mut self, n: usize) {
        self.pauses.increment(n as u64);
        self.pauses_total += n as u64;
    }

    /// A truncation sweep of the task failed and was skipped.
    pub(crate) fn sweep_skipped(&mut self) {
        self.sweeps_skipped.increment(1);
        self.sweeps_skipped_total += 1;
    }

    /// Samples the gauges at `now`; `paused` is how many of the task's
    /// partitions are paused for the hold budget, `budget` that budget (0:
    /// none).
    pub(crate) fn sample(
        &mut self,
        now: i64,
        task: &Task,
        paused: usize,
        budget: usize,
    ) -> TaskMetrics {
        self.count(task);
        let holds = task.hold_gauges();
        let (offsets, sequences) = task.node().stamp_side_width();
        let rate = match self.last_sample {
            Some((at, delivered)) if now > at => {
                let per_ms = (self.cumulative.delivered.saturating_sub(delivered)) as f64
                    / (now - at) as f64;
                per_ms * 1000.0
            }
            _ => 0.0,
        };
        self.last_sample = Some((now, self.cumulative.delivered));
        let mut topics = Vec::with_capacity(holds.channels.len());
        for (topic, held, age) in holds.channels {
            if let Some((g_held, g_age)) = self.topics.get(&topic) {
                g_held.set(held as f64);
                g_age.set(age as f64);
            }
            topics.push(TopicMetrics {
                topic,
                records_held: held as u64,
                records_held_age_max_ms: age,
            });
        }
        self.held.set(holds.held as f64);
        self.age.set(holds.age_max_ms as f64);
        self.rate.set(rate);
        self.offsets.set(offsets as f64);
        self.sequences.set(sequences as f64);
        let held_bytes = task.node().held_bytes();
        self.held_bytes.set(held_bytes as f64);
        self.budget.set(budget as f64);
        self.paused.set(paused as f64);
        let paged = task.node().paged_count();
        self.paged.set(paged as f64);
        let paged_bytes = task.node().paged_bytes();
        self.paged_bytes.set(paged_bytes as f64);
        let fold_bytes = task
            .stores()
            .fold
            .cache_stats()
            .map_or(0, |c| c.resident_bytes);
        self.fold_bytes.set(fold_bytes as f64);
        TaskMetrics {
            thread_id: self.thread_id.clone(),
            task: task.id().clone(),
            records_held: holds.held as u64,
            records_held_age_max_ms: holds.age_max_ms,
            records_delivered_rate: rate,
            records_delivered_total: self.cumulative.delivered,
            replays_skipped_total: self.cumulative.replays,
            truncation_sweeps_skipped_total: self.sweeps_skipped_total,
            ticks_emitted_total: self.cumulative.ticks,
            records_dead_lettered_total: self.cumulative.dead_lettered,
            records_key_misplaced_total: self.cumulative.misplaced,
            stamp_offset_entries: offsets as u64,
            stamp_sequence_entries: sequences as u64,
            records_held_bytes: held_bytes as u64,
            hold_budget_bytes: budget as u64,
            records_held_paged: paged as u64,
            records_held_paged_bytes: paged_bytes as u64,
            records_paged_in_total: self.cumulative.paged_in,
            fold_cache_bytes: fold_bytes as u64,
            fold_store_reads_total: self.fold_exported.reads,
            fold_cache_evictions_total: self.fold_exported.evicted,
            fold_store_reads_skipped_total: self.fold_exported.skipped,
            partitions_paused: paused as u64,
            hold_pauses_total: self.pauses_total,
            topics,
        }
    }
}

impl Drop for TaskMeters {
    /// The task left the thread: its gauges read zero from now on.
    fn drop(&mut self) {
        for g in [
            &self.held,
            &self.age,
            &self.rate,
            &self.offsets,
            &self.sequences,
            &self.held_bytes,
            &self.budget,
            &self.paused,
            &self.paged,
            &self.paged_bytes,
            &self.fold_bytes,
        ] {
            g.set(0.0);
        }
        for (held, age) in self.topics.values() {
            held.set(0.0);
            age.set(0.0);
        }
    }
}
