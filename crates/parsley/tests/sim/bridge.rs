//! The bridge between the conformance kit's application worlds and the
//! production host core: a [`HostThread`] around a real [`Worker`], and
//! the broker views the worker reads through. It only translates; a
//! [`HostFault`] switches one host duty off for the self-test.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use parsley::Parsley;
use parsley::protocol::{BrokerOffsets, BrokerOffsetsError, Channel, TopicId, TopicOffsets};
use parsley::runtime::host::{ChangelogReader, ChangelogRecord};
use parsley::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
use parsley::runtime::metrics::Published;
use parsley::runtime::task::OutgoingRecord;
use parsley::runtime::worker::*;
use parsley::task::EmissionOrigin;
use parsley::task::TaskEvent;
use parsley::task::TaskId;
use parsley_sim::{
    ConsumerMoves, HostThread, HostTransaction, Outcome, SimBroker, SimDirective, SimFault,
    StoreFault, Streamed, TaskAct, TaskSpec,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use super::disk::{Disk, Disks, SimLocal};

/// The simulated broker as the worker sees a cluster.
pub struct View<'a>(pub &'a SimBroker);

impl TopicMetadata for View<'_> {
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
        if self.0.lookup_outage() {
            return Err(MetadataError::Failed {
                topic: topic.to_owned(),
                message: "metadata lookup failed (simulated)".to_owned(),
            });
        }
        let id = self
            .0
            .topic_id(topic)
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))?;
        let partitions = self
            .0
            .partitions(id)
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))?;
        Ok(TopicDescription { id, partitions })
    }
}

impl BrokerOffsets for View<'_> {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<std::collections::BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.0.end_offsets(topics)
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<std::collections::BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.0.log_starts(topics)
    }
}

impl ChangelogReader for View<'_> {
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        if self.0.lookup_outage() {
            return Err(MetadataError::Failed {
                topic: topic.to_owned(),
                message: "changelog read failed (simulated)".to_owned(),
            });
        }
        let id = self
            .0
            .topic_id(topic)
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))?;
        // As a read_committed consumer: up to the last stable offset, which
        // a transaction whose marker has not landed here holds back.
        let (records, stable) = self.0.stable_from_start(Channel::new(id, partition));
        for (offset, r) in records {
            if offset >= from {
                apply(ChangelogRecord {
                    offset,
                    key: r.key.clone(),
                    value: r.value.clone(),
                });
            }
        }
        Ok(stable)
    }
}

/// A host duty the bridge can switch off, so the kit proves it notices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFault {
    /// Positions go to the worker as if every polled record had been
    /// handed over already (the buffered-poll hazard).
    EarlyPositionReport,
    /// Changelog records are dropped from every transaction.
    SkipChangelogWrites,
    /// The consumer does not seek back after an abort.
    NoSeekAfterAbort,
    /// A split assignment is completed with partitions this thread does
    /// not own, instead of being refused.
    AcceptSplitTask,
    /// The producer's open transaction is left open when the worker aborts
    /// one that records were streamed into: its records would commit with
    /// the next transaction.
    KeepStreamedAfterAbort,
}

/// Counters the bridge keeps across every thread of a world.
#[derive(Clone, Copy, Debug, Default)]
pub struct BridgeStats {
    /// Truncation sweeps that removed entries.
    pub sweeps_that_removed: u64,
    /// Sweeps skipped for a failed lookup.
    pub sweeps_skipped: u64,
    /// Positions the worker deferred.
    pub positions_deferred: u64,
    /// Tasks started with held records restored from a changelog.
    pub restored_with_held: u64,
    pub restored_with_held_on_disk: u64,
    pub resets_with_held_on_disk: u64,
    /// Task starts retried after a failed lookup.
    pub start_retries: u64,
    /// Task restores that read a changelog only up to below the end the
    /// task started against (a late marker), and waited.
    pub short_restores: u64,
    /// Tasks that failed and stopped.
    pub task_failures: u64,
    /// Stopped tasks restarted.
    pub task_restarts: u64,
    /// Refused emissions sent to the dead-letter topic.
    pub diverted: u64,
    /// Tasks started from a local store.
    pub local_starts: u64,
    /// Local stores wiped and rebuilt.
    pub local_rebuilds: u64,
    /// Local store writes that failed.
    pub local_write_failures: u64,
    /// Changelog records replayed by task starts.
    pub replayed: u64,
    /// Restore outcomes for tasks that had left before their job ran.
    pub stale_restores: u64,
    /// Partitions paused for a task's hold budget.
    pub hold_pauses: u64,
    /// Paused partitions resumed because their queue drained.
    pub hold_resumes_drained: u64,
    /// Paused partitions resumed because a held record claimed them.
    pub hold_resumes_claimed: u64,
    /// Paused partitions resumed because the holds fell to half the budget.
    pub hold_resumes_relieved: u64,
    /// Pauses left out because a held record waited for the partition.
    pub hold_pauses_withheld: u64,
    /// Held records read back from a task's committed store.
    pub paged_in: u64,
    /// Fold entries read from a local store (not in the bounded cache).
    pub fold_reads: u64,
    /// Fold entries that left a bounded cache.
    pub fold_evictions: u64,
    /// Evictions put off because the disk did not hold the entry yet.
    pub fold_withheld: u64,
    pub held_evicted: u64,
    pub releases_resumed: u64,
    pub held_disk_reads: u64,
    /// Tasks failed because fold state beyond their cache was lost with a
    /// store write that failed.
    pub fold_store_failures: u64,
    /// Running tasks that lost some of their partitions in a revocation
    /// and kept the others.
    pub tasks_split_by_revocation: u64,
    /// Transactions handed over before the interval because the fetch
    /// was drained.
    pub idle_commits: u64,
    /// Readies that kept streamed records back for a larger batch.
    pub streams_held_for_batch: u64,
}

/// One stream thread: a worker and its fault, if any.
pub struct Thread {
    worker: Worker,
    fault: Option<HostFault>,
    app: Parsley,
    stats: Rc<RefCell<BridgeStats>>,
    seen: WorkerStats,
    just_aborted: bool,
    /// The last transaction's records, as (topic, partition, origin).
    last: Vec<(String, i32, Option<EmissionOrigin>)>,
    /// The dead-letter topic, if the production handler uses one.
    dead_letter: Option<String>,
    /// The production handler's choice for the record refused last.
    divert_next: bool,
    /// The thread's disk, when it keeps local stores.
    disk: Option<Arc<Mutex<Disk>>>,
    /// Restore jobs taken from the worker, not run yet.
    jobs: std::collections::VecDeque<RestoreJob>,
    /// What the worker handed over that the world has not asked for yet:
    /// the world takes pauses, seeks and failures at moments of its own
    /// choosing (that is how it explores their interleavings), so the
    /// bridge keeps each part of a `Ready` until its moment comes.
    pending: Ready,
    /// Every record streamed into the open transaction so far, for the
    /// transaction the world judges at its hand-over.
    txn_records: Vec<OutgoingRecord>,
    /// What the producer did with the open transaction that the world has
    /// not taken yet.
    streamed: Vec<Streamed>,
}

impl Thread {
    pub fn new(
        app: &Parsley,
        config: WorkerConfig,
        fault: Option<HostFault>,
        stats: Rc<RefCell<BridgeStats>>,
    ) -> Thread {
        Thread {
            worker: Worker::new(app, config),
            fault,
            app: app.clone(),
            stats,
            seen: WorkerStats::default(),
            just_aborted: false,
            last: Vec::new(),
            dead_letter: None,
            divert_next: false,
            disk: None,
            jobs: std::collections::VecDeque::new(),
            pending: Ready::default(),
            txn_records: Vec::new(),
            streamed: Vec::new(),
        }
    }

    /// The worker aborted the open transaction records were streamed into:
    /// the world hears of it in order with what was streamed.
    fn abort_streamed(&mut self) {
        self.txn_records.clear();
        if self.fault != Some(HostFault::KeepStreamedAfterAbort) {
            self.streamed.push(Streamed::Aborted);
        }
    }

    /// Records streamed into the open transaction from index `first`.
    fn produce(&mut self, first: usize, records: Vec<OutgoingRecord>) -> Result<(), String> {
        if records.is_empty() {
            return Ok(());
        }
        if first != self.txn_records.len() {
            return Err(format!(
                "records streamed from index {first}, but the open transaction has {}",
                self.txn_records.len()
            ));
        }
        self.txn_records.extend(records.iter().cloned());
        self.streamed.push(Streamed::Records(records));
        Ok(())
    }

    /// Takes a ready's streamed parts at once (a producer sends them as
    /// they come); the rest is kept for the world's moments.
    fn absorb(&mut self, ready: &mut Ready) -> Result<(), String> {
        if std::mem::take(&mut ready.abort_streamed) {
            self.abort_streamed();
        }
        self.produce(ready.produce_at, std::mem::take(&mut ready.produce))
    }

    /// Takes what the worker has for its host into `pending`, outside a
    /// commit point. A transaction comes out only where a flush or a
    /// revocation closed one, and those take it at once.
    fn fill(&mut self) -> Result<(), String> {
        let mut ready = self.worker.ready(None).map_err(err)?;
        self.absorb(&mut ready)?;
        let closed = self.pending.append(ready);
        // The world appends a transaction's records at commit: an aborted
        // open transaction never sent any.
        self.pending.abandoned.clear();
        if let Some(closed) = closed {
            if self.pending.transaction.is_some() {
                return Err("two transactions closed at once".into());
            }
            self.pending.transaction = Some(closed);
        }
        Ok(())
    }

    /// The transaction a flush or a revocation closed.
    fn closed(&mut self) -> Result<Option<Transaction>, String> {
        self.fill()?;
        Ok(self.pending.transaction.take())
    }

    /// Keeps the tasks' stores on `disk` between processes.
    pub fn with_disk(mut self, disk: Arc<Mutex<Disk>>) -> Thread {
        self.worker = std::mem::replace(
            &mut self.worker,
            Worker::new(&self.app, WorkerConfig::default()),
        )
        .with_local_store(Box::new(SimLocal(disk.clone())));
        self.disk = Some(disk);
        self
    }

    /// A production error handler that may send refused emissions to
    /// `topic`.
    pub fn with_dead_letter(mut self, topic: &str) -> Thread {
        self.dead_letter = Some(topic.to_owned());
        self
    }

    /// What a host does after an abort: every task that failed meets the
    /// handlers. A refused emission goes to the dead-letter topic when the
    /// production handler chose it; everything else restarts after its
    /// backoff (the uncaught error handler's `ReplaceThread`).
    fn handle_failures(&mut self, broker: &SimBroker) -> Result<(), String> {
        self.fill()?;
        for f in std::mem::take(&mut self.pending.failures) {
            self.stats.borrow_mut().task_failures += 1;
            if f.error.contains("cannot be read from its local store") {
                self.stats.borrow_mut().fold_store_failures += 1;
            }
            if let (Some(refused), Some(topic), true) =
                (&f.refused, self.dead_letter.clone(), self.divert_next)
                && refused.origin.is_some()
            {
                self.worker
                    .divert(&f.task, refused, &topic, &View(broker))
                    .map_err(err)?;
                self.stats.borrow_mut().diverted += 1;
                continue;
            }
            if self
                .worker
                .restart_task(&f.task, &View(broker))
                .map_err(err)?
                .is_some()
            {
                self.stats.borrow_mut().task_restarts += 1;
            }
        }
        self.divert_next = false;
        Ok(())
    }

    /// A refusal from the worker: a task's failure is aborted and handled
    /// (as a host does); anything else is the host's refusal.
    fn recover(&mut self, r: Result<(), WorkerError>, broker: &SimBroker) -> Result<(), String> {
        match r {
            Ok(()) => Ok(()),
            Err(_) if self.worker.failing_task().is_some() && !self.worker.in_flight() => {
                self.just_aborted = true;
                self.worker.abort(&View(broker)).map_err(err)?;
                self.handle_failures(broker)
            }
            Err(e) => Err(err(e)),
        }
    }

    fn tally(&mut self) {
        let now = self.worker.stats();
        let mut s = self.stats.borrow_mut();
        if now.truncated_entries > self.seen.truncated_entries {
            s.sweeps_that_removed += 1;
        }
        s.sweeps_skipped += now.truncation_sweeps_skipped - self.seen.truncation_sweeps_skipped;
        s.positions_deferred += now.positions_deferred - self.seen.positions_deferred;
        s.restored_with_held += now.restored_with_held - self.seen.restored_with_held;
        s.restored_with_held_on_disk +=
            now.restored_with_held_on_disk - self.seen.restored_with_held_on_disk;
        s.resets_with_held_on_disk +=
            now.resets_with_held_on_disk - self.seen.resets_with_held_on_disk;
        s.start_retries += now.task_start_retries - self.seen.task_start_retries;
        s.short_restores += now.short_restores - self.seen.short_restores;
        s.local_starts += now.local_store_starts - self.seen.local_store_starts;
        s.local_rebuilds += now.local_store_rebuilds - self.seen.local_store_rebuilds;
        s.local_write_failures +=
            now.local_store_write_failures - self.seen.local_store_write_failures;
        s.replayed += now.changelog_records_replayed - self.seen.changelog_records_replayed;
        s.hold_pauses += now.hold_pauses - self.seen.hold_pauses;
        s.hold_resumes_drained += now.hold_resumes_drained - self.seen.hold_resumes_drained;
        s.hold_resumes_claimed += now.hold_resumes_claimed - self.seen.hold_resumes_claimed;
        s.hold_resumes_relieved += now.hold_resumes_relieved - self.seen.hold_resumes_relieved;
        s.hold_pauses_withheld += now.hold_pauses_withheld - self.seen.hold_pauses_withheld;
        s.paged_in += now.records_paged_in - self.seen.records_paged_in;
        s.fold_reads += now.fold_store_reads - self.seen.fold_store_reads;
        s.fold_evictions += now.fold_cache_evictions - self.seen.fold_cache_evictions;
        s.fold_withheld += now.fold_evictions_withheld - self.seen.fold_evictions_withheld;
        s.held_evicted += now.held_records_evicted - self.seen.held_records_evicted;
        s.releases_resumed += now.releases_resumed - self.seen.releases_resumed;
        s.held_disk_reads +=
            now.held_records_read_from_disk - self.seen.held_records_read_from_disk;
        s.idle_commits += now.idle_commits - self.seen.idle_commits;
        s.streams_held_for_batch += now.streams_held_for_batch - self.seen.streams_held_for_batch;
        self.seen = now;
    }

    /// The transaction as the world judges it: every record, those streamed
    /// first. What was streamed and not taken by the world yet goes with
    /// it (a commit flushes the producer), so only the thread's own aborts
    /// stay for the world to take.
    fn convert(&mut self, txn: Transaction) -> Result<HostTransaction, String> {
        if txn.streamed != self.txn_records.len() {
            return Err(format!(
                "the transaction says {} records were streamed into it, but {} were",
                txn.streamed,
                self.txn_records.len()
            ));
        }
        self.streamed.retain(|s| matches!(s, Streamed::Aborted));
        let skip = self.fault == Some(HostFault::SkipChangelogWrites);
        let records: Vec<OutgoingRecord> = std::mem::take(&mut self.txn_records)
            .into_iter()
            .chain(txn.records)
            .filter(|r| !(skip && r.topic.ends_with("-changelog")))
            .collect();
        self.last = records
            .iter()
            .map(|r| (r.topic.to_string(), r.partition, r.origin))
            .collect();
        Ok(HostTransaction {
            records,
            offsets: txn
                .offsets
                .into_iter()
                .map(|o| (o.topic, o.partition, o.offset))
                .collect(),
            acts: txn
                .events
                .into_iter()
                .filter_map(|e| match e.event {
                    TaskEvent::Delivered(d) => Some(TaskAct::Delivered {
                        task: e.task.to_string(),
                        topic: d.coordinate.topic,
                        partition: d.coordinate.partition,
                        offset: d.coordinate.offset,
                    }),
                    TaskEvent::Sent {
                        topic, partition, ..
                    } => Some(TaskAct::Sent {
                        task: e.task.to_string(),
                        topic,
                        partition,
                    }),
                    TaskEvent::Diverted { .. } | TaskEvent::SteppedPast { .. } => {
                        Some(TaskAct::DeadLettered {
                            task: e.task.to_string(),
                        })
                    }
                    TaskEvent::Held { .. } => None,
                })
                .collect(),
        })
    }

    /// The partitions of every task the assignment touches.
    fn complete(&self, parts: &mut Vec<AssignedPartition>, broker: &SimBroker) {
        let have: BTreeSet<(String, i32)> = parts
            .iter()
            .map(|a| (a.topic.clone(), a.partition))
            .collect();
        let mut extra = Vec::new();
        for (topic, p) in &have {
            for stage in self.app.stages() {
                let mut topics: Vec<String> = stage
                    .source_topics()
                    .iter()
                    .map(|t| (*t).to_owned())
                    .collect();
                if let Some(t) = self.app.tick_topic(stage.name()) {
                    topics.push(t.to_owned());
                }
                if !topics.contains(topic) {
                    continue;
                }
                for t in topics {
                    if !have.contains(&(t.clone(), *p))
                        && !extra
                            .iter()
                            .any(|a: &AssignedPartition| a.topic == t && a.partition == *p)
                    {
                        let c = broker.topic_id(&t).map(|id| Channel::new(id, *p));
                        extra.push(AssignedPartition {
                            topic: t,
                            partition: *p,
                            committed: None,
                            log_start: c.map_or(0, |c| broker.log_start(c)),
                            end: Some(c.map_or(0, |c| broker.end_offset(c))),
                            committed_metadata: None,
                        });
                    }
                }
            }
        }
        parts.extend(extra);
    }
}

fn err(e: WorkerError) -> String {
    e.to_string()
}

impl HostThread for Thread {
    fn assign(
        &mut self,
        mut parts: Vec<AssignedPartition>,
        broker: &SimBroker,
        now: i64,
    ) -> Result<(), String> {
        if self.fault == Some(HostFault::AcceptSplitTask) {
            self.complete(&mut parts, broker);
        }
        let r = self.worker.assign(parts, &View(broker), now).map_err(err);
        self.tally();
        r
    }

    fn before_revoke(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String> {
        // The same call the Kafka runtime makes: the worker commits or
        // aborts the open work, and keeps the seeks an abort queues.
        let aborts = self.worker.stats().aborts;
        self.worker
            .before_revoke(false, &View(broker))
            .map_err(err)?;
        match self.closed()? {
            Some(t) => self.convert(t).map(Some),
            None => {
                if self.worker.stats().aborts > aborts {
                    self.just_aborted = true;
                }
                // A task that failed taking its commit stopped: its
                // handler decides what follows, as after any abort.
                self.handle_failures(broker)?;
                Ok(None)
            }
        }
    }

    fn revoke(&mut self, parts: &[(String, i32)]) -> Result<(), String> {
        // Partitions the fault added are this thread's too.
        let mut all: Vec<(String, i32)> = parts.to_vec();
        if self.fault == Some(HostFault::AcceptSplitTask) {
            all.extend(
                self.worker
                    .assignment()
                    .map(|a| (a.topic.clone(), a.partition)),
            );
        }
        let running: BTreeSet<TaskId> = self.worker.tasks().cloned().collect();
        self.worker.revoke(&all).map_err(err)?;
        // A running task that lost some of its partitions and kept the
        // others here (incremental assignment): it must stop delivering
        // until the rest come back.
        let split = self
            .worker
            .partial_tasks()
            .filter(|t| running.contains(*t))
            .count() as u64;
        self.stats.borrow_mut().tasks_split_by_revocation += split;
        // A host that acts on each ready at once made these before the
        // revocation, which is harmless; the world takes them later, so
        // the ones of partitions it no longer holds go with them (as the
        // worker drops the ones still queued).
        self.pending.forget(&all);
        Ok(())
    }

    fn on_record(&mut self, r: PolledRecord, broker: &SimBroker) -> Result<(), String> {
        let result = self.worker.on_record(r);
        self.recover(result, broker)
    }

    fn on_position(
        &mut self,
        topic: &str,
        partition: i32,
        position: i64,
        last_returned: Option<i64>,
        broker: &SimBroker,
    ) -> Result<(), String> {
        let last = if self.fault == Some(HostFault::EarlyPositionReport) {
            None
        } else {
            last_returned
        };
        let r = self.worker.on_position(topic, partition, position, last);
        let r = self.recover(r, broker);
        self.tally();
        r
    }

    fn punctuate(&mut self, now: i64, broker: &SimBroker) -> Result<(), String> {
        let r = self.worker.punctuate(now, &View(broker));
        let r = self.recover(r, broker);
        self.tally();
        r?;
        // A task that could not start stopped alone: the handlers hear
        // of it, as a host's poll loop takes every ready's failures.
        self.handle_failures(broker)
    }

    fn poll_transaction(
        &mut self,
        now: i64,
        drained: bool,
        broker: &SimBroker,
    ) -> Result<Option<HostTransaction>, String> {
        if drained {
            self.worker.fetch_drained();
        }
        match self.worker.ready(Some(now)) {
            Ok(mut ready) => {
                self.absorb(&mut ready)?;
                let transaction = self.pending.append(ready);
                self.pending.abandoned.clear();
                transaction.map(|t| self.convert(t)).transpose()
            }
            Err(e) => self.recover(Err(e), broker).map(|()| None),
        }
    }

    fn flush(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String> {
        match self.worker.flush() {
            Ok(()) => self.closed()?.map(|t| self.convert(t)).transpose(),
            Err(e) => self.recover(Err(e), broker).map(|()| None),
        }
    }

    fn outcome(&mut self, outcome: Outcome, broker: &SimBroker) -> Result<(), String> {
        let o = match outcome {
            Outcome::Committed => CommitOutcome::Committed,
            Outcome::Aborted => CommitOutcome::Aborted,
            Outcome::Fenced => CommitOutcome::Fenced,
        };
        self.just_aborted = o == CommitOutcome::Aborted;
        let r = self
            .worker
            .advance(Ack::Committed(o), &View(broker))
            .map_err(err);
        if let Some(disk) = &self.disk {
            // A fault armed for this outcome strikes only its writes.
            disk.lock().unwrap().armed = None;
        }
        self.tally();
        r?;
        self.handle_failures(broker)
    }

    fn ending(&mut self) {
        self.worker.ending();
    }

    fn abort(&mut self, broker: &SimBroker) -> Result<(), String> {
        self.just_aborted = true;
        self.worker.abort(&View(broker)).map(|_| ()).map_err(err)?;
        self.handle_failures(broker)
    }

    fn fault(&mut self, fault: SimFault, _broker: &SimBroker) -> Result<SimDirective, String> {
        let fault = match fault {
            SimFault::Fenced => Fault::ProducerFenced("producer fenced (simulated)".into()),
            SimFault::Fatal => Fault::Fatal("client failed (simulated)".into()),
            SimFault::Abortable => Fault::Abortable("abortable (simulated)".into()),
            SimFault::Retriable => Fault::Retriable("timed out (simulated)".into()),
            SimFault::RecordRefused {
                record,
                dead_letter,
            } => {
                self.divert_next = dead_letter;
                let Some((topic, partition, origin)) = self.last.get(record).cloned() else {
                    return Err(format!("no record {record} in the transaction"));
                };
                Fault::RecordRefused {
                    record,
                    topic,
                    partition,
                    origin,
                    reason: "too large (simulated)".into(),
                }
            }
            SimFault::Transient { record } => {
                // A production handler that sends every refused record to
                // the dead-letter topic: a core that took this for a
                // refusal would send a valid emission there, and the
                // world counts dead letters against refusals.
                self.divert_next = true;
                Fault::Transient(format!(
                    "record {record} could not be written now: timed out (simulated)"
                ))
            }
            SimFault::Hung => {
                Fault::ClientHung("a producer call never returned (simulated)".into())
            }
            SimFault::AbortFailed { retriable } => Fault::AbortFailed {
                retriable,
                message: "the abort failed (simulated)".into(),
            },
            SimFault::Poll { fatal } => Fault::Poll {
                fatal,
                message: "poll error (simulated)".into(),
            },
        };
        Ok(match self.worker.on_fault(fault) {
            Directive::Retry { .. } => SimDirective::Retry,
            Directive::Abort => SimDirective::Abort,
            Directive::Rejoin => SimDirective::Rejoin,
            Directive::Fail(_) => SimDirective::Fail,
            Directive::ReplaceProducer => SimDirective::ReplaceProducer,
            Directive::Continue => SimDirective::Continue,
        })
    }

    fn wake_in(&self, now: i64) -> Option<i64> {
        self.worker
            .restart_due_in(now)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    fn restoring(&self) -> bool {
        !self.jobs.is_empty()
            || !self.pending.restores.is_empty()
            || self.worker.restoring_tasks().next().is_some()
    }

    fn restore_step(&mut self, broker: &SimBroker) -> Result<(), String> {
        self.fill()?;
        self.jobs.extend(std::mem::take(&mut self.pending.restores));
        let Some(job) = self.jobs.pop_front() else {
            return Ok(());
        };
        let task = job.task().clone();
        let outcome = job.run(&View(broker), &View(broker));
        if !self.worker.restoring_tasks().any(|t| *t == task) {
            self.stats.borrow_mut().stale_restores += 1;
        }
        let r = self.worker.advance(Ack::Restored(outcome), &View(broker));
        let r = self.recover(r, broker);
        self.tally();
        r?;
        self.handle_failures(broker)
    }

    fn delivered(&mut self, offsets: &[i64], broker: &SimBroker) {
        // Only a transaction in flight has delivery reports, and the
        // worker takes them whenever one is.
        let _ = self.worker.advance(Ack::Delivered(offsets), &View(broker));
    }

    fn store_fault(&mut self, fault: StoreFault) -> bool {
        let Some(disk) = &self.disk else {
            return false;
        };
        disk.lock().unwrap().armed = Some(fault);
        true
    }

    fn take_moves(&mut self, broker: &SimBroker) -> ConsumerMoves {
        // A refusal here (none is possible outside a commit point) shows
        // at the world's next call.
        let _ = self.fill();
        // What waited for this moment goes through the worker's act loop,
        // as a host acts on a ready; the parts the world takes at other
        // moments go back to wait for them.
        let ready = Ready {
            flow: std::mem::take(&mut self.pending.flow),
            seeks: std::mem::take(&mut self.pending.seeks),
            ..Ready::default()
        };
        let mut moment = Moves {
            thread: self,
            broker,
            moves: ConsumerMoves::default(),
        };
        let _ = act_on(&mut moment, ready);
        let mut moves = moment.moves;
        if std::mem::take(&mut self.just_aborted) && self.fault == Some(HostFault::NoSeekAfterAbort)
        {
            // The fault: confirmed to the worker, never made.
            moves.seeks.clear();
        }
        moves
    }

    fn has_open_work(&self) -> bool {
        self.worker.has_open_work()
    }

    fn lose_assignment(&mut self, broker: &SimBroker) -> Result<(), String> {
        // The same call the Kafka runtime makes for a lost assignment.
        self.just_aborted = true;
        self.worker
            .before_revoke(true, &View(broker))
            .map_err(err)?;
        self.handle_failures(broker)
    }

    fn has_streamed(&self) -> bool {
        !self.streamed.is_empty()
    }

    fn take_streamed(&mut self) -> Vec<Streamed> {
        std::mem::take(&mut self.streamed)
    }

    fn needs_punctuation(&self) -> bool {
        // A task waiting on a failed lookup, or a stopped task, whose retry
        // is due now (a later one is a wake-up: the world lets time pass).
        self.worker.restart_due_in(0) == Some(std::time::Duration::ZERO)
            || self.worker.release_due_in().is_some()
    }

    fn held_heads(&self) -> Vec<(String, i32, i64)> {
        let mut out = Vec::new();
        for id in self.worker.tasks() {
            let Some(task) = self.worker.task(id) else {
                continue;
            };
            for (channel, offset) in task.node().head_offsets() {
                if let Some(input) = task.inputs().iter().find(|i| i.channel == channel) {
                    out.push((input.topic.clone(), channel.partition, offset));
                }
            }
        }
        out
    }
}

/// The tasks of an application as oracle actors: `stage[p]`, consuming
/// partition `p` of every source and of the tick topic.
pub fn tasks(app: &Parsley, partitions: impl Fn(&str) -> i32) -> Vec<TaskSpec> {
    let mut out = Vec::new();
    for stage in app.stages() {
        let mut topics: Vec<String> = stage
            .source_topics()
            .iter()
            .map(|t| (*t).to_owned())
            .collect();
        if let Some(t) = app.tick_topic(stage.name()) {
            topics.push(t.to_owned());
        }
        let n = topics.first().map_or(0, |t| partitions(t));
        for p in 0..n {
            out.push(TaskSpec {
                name: format!("{}[{p}]", stage.name()),
                inputs: topics.iter().map(|t| (t.clone(), p)).collect(),
            });
        }
    }
    out
}

/// A thread at the world's moment for its consumer, as the worker's act
/// loop sees it: pauses, resumes and seeks are handed to the world (which
/// makes them at once); every other part waits in the thread's `pending`
/// for the world's moment for it.
struct Moves<'a> {
    thread: &'a mut Thread,
    broker: &'a SimBroker,
    moves: ConsumerMoves,
}

impl Host for Moves<'_> {
    type Error = WorkerError;

    fn ready(&mut self) -> Result<Ready, WorkerError> {
        self.thread.worker.ready(None)
    }

    fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError> {
        self.thread.worker.advance(ack, &View(self.broker))
    }

    fn abandoned(&mut self, _records: Vec<OutgoingRecord>) {
        // A worker that does not stream: the world appends a transaction's
        // records at its commit, so an aborted open one never sent any.
    }

    fn abort_streamed(&mut self) -> Result<(), WorkerError> {
        self.thread.abort_streamed();
        Ok(())
    }

    fn produce(&mut self, first: usize, records: Vec<OutgoingRecord>) -> Result<(), WorkerError> {
        self.thread
            .produce(first, records)
            .map_err(|message| WorkerError::Client {
                class: "host",
                message,
            })
    }

    fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), WorkerError> {
        self.thread.pending.failures.extend(failures);
        Ok(())
    }

    fn restores(&mut self, jobs: Vec<RestoreJob>) {
        self.thread.pending.restores.extend(jobs);
    }

    fn published(&mut self, sample: Published) {
        self.thread.pending.published = Some(sample);
    }

    fn backoff(&mut self, pause: Duration) {
        let kept = &mut self.thread.pending.backoff;
        *kept = (*kept).max(Some(pause));
    }

    fn flow(&mut self, change: FlowChange) {
        self.moves.flow.push(change);
    }

    fn seek(&mut self, seek: &Seek) -> Result<(), WorkerError> {
        self.moves.seeks.push(seek.clone());
        Ok(())
    }

    fn transaction(&mut self, txn: Transaction) -> Result<(), WorkerError> {
        // Only a flush or a revocation closes one, and those take it at
        // once; should one come out here, it waits for the world's next
        // flush.
        self.thread.pending.transaction.get_or_insert(txn);
        Ok(())
    }
}
