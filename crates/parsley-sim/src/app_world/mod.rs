//! [`AppWorld`]: real applications on real host cores, under a consumer
//! group, transactions, fencing, crashes and retention, judged by the
//! oracle.
//!
//! The reference host ([`SimNode`](crate::SimNode)) runs the protocol alone.
//! An application world instead runs whole stream threads, each behind the
//! [`HostThread`] trait: a production host core (the `parsley` crate's
//! `Worker`, bridged in that crate's tests, so the kit never depends on the
//! user crate) with its task runner, codecs, folds and ticks. The world is
//! the rest of a Kafka deployment:
//!
//! * **A consumer group.** Members join, crash and rejoin; every change is a
//!   rebalance with a new generation and a range assignment over the
//!   members. A member commits or aborts its open work and is told what it
//!   lost before it is told what it got, as in the eager protocol.
//! * **Zombies.** A member can miss a rebalance: it keeps its old
//!   assignment and generation and carries on, while its tasks run
//!   elsewhere. Its next commit carries the stale generation and is fenced
//!   (EOS v2): its records are aborted, and it rejoins.
//! * **Transactions over many tasks.** A commit appends the thread's
//!   records and commit markers, and commits its consumed offsets with the
//!   group; an injected abort or a crash during the commit leaves the
//!   records in the log as aborted records at real offsets.
//! * **Buffered polls.** A poll returns several records at once, and the
//!   consumer position after them is reported before they are all handed
//!   over, so the position-capture rule matters.
//! * **Changelogs, retention and lookups.** Changelog topics are ordinary
//!   topics of the broker; retention moves log starts (never past what the
//!   group committed or a thread holds); log-start lookups fail now and
//!   then.
//!
//! # Judging
//!
//! Each task is an oracle actor. When a transaction commits, the world
//! replays what the thread says its tasks did, in order (deliveries, then
//! the sends they made), through the oracle: every committed delivery is
//! checked for causal order, FIFO, duplicates and re-entry, and every sent
//! record is registered with its sender's real causal past. Nothing of an
//! aborted or fenced transaction reaches the oracle. At drain, completeness
//! is checked for every task, and a scenario can compare fold state with
//! [`committed_deliveries`](AppWorld::committed_deliveries).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use parsley_protocol::clock::ClockVersion;
use parsley_protocol::headers::CLOCK_HEADER;
use parsley_protocol::host::{AssignedPartition, FlowChange, OutgoingRecord, PolledRecord, Seek};
use parsley_protocol::{CausalHeaders, Channel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::broker::{SimBroker, StoredRecord};
use crate::edge::{EdgeProducer, EdgeSpec};
use crate::oracle::{ActorId, Oracle, PendingSend};

mod config;
mod group;
mod host;
mod judge;
mod transactions;

pub use config::*;
use host::Gone;
pub use host::*;
use transactions::CommitFate;

struct Member {
    id: usize,
    thread: Box<dyn HostThread>,
    generation: u64,
    assignment: Vec<(String, i32)>,
    positions: BTreeMap<(String, i32), i64>,
    buffer: VecDeque<PolledRecord>,
    zombie: bool,
    paused: BTreeSet<(String, i32)>,
    /// The records of its open transaction already in the log, in the
    /// transaction's order, and the transaction's number there.
    open: Vec<(Channel, i64)>,
    open_txn: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Edge(usize),
    Poll(usize, usize),
    Feed(usize),
    Clock(usize),
    Retry(usize),
    Commit(usize),
    Crash(usize),
    Join,
    Zombie(usize),
    Retain(Channel, i64),
    LookupOutage,
    PollFault(usize),
    Wake(usize, i64),
    Reconcile,
    Bounce(usize),
    Restore(usize),
    LandMarker,
    Stream(usize),
    Lost(usize),
}

/// A seeded application world. See the [module documentation](self).
pub struct AppWorld {
    seed: u64,
    rng: ChaCha8Rng,
    /// The broker.
    pub broker: SimBroker,
    /// The oracle.
    pub oracle: Oracle,
    factory: ThreadFactory,
    config: AppWorldConfig,
    budget: AppBudget,
    members: Vec<Member>,
    next_member: usize,
    generation: u64,
    group_offsets: BTreeMap<(String, i32), i64>,
    owners: BTreeMap<String, usize>,
    task_actor: BTreeMap<String, ActorId>,
    edges: Vec<EdgeProducer>,
    committed_deliveries: BTreeMap<String, Vec<(String, i32, i64)>>,
    now: i64,
    stats: AppStats,
    /// The moves an incremental reconciliation still has to make.
    pending: Vec<Move>,
    /// The tasks that held records when the reconciliation was planned.
    holding_at_plan: BTreeSet<String>,
    /// The reconciliation's target assignment, by member id.
    target: BTreeMap<usize, Vec<(String, i32)>>,
    /// Tasks counted as kept while holding in this reconciliation.
    kept_this_round: BTreeSet<String>,
    /// The offset each record of the transaction judged last got.
    last_offsets: Vec<i64>,
    /// Records refused with the dead-letter topic as the production
    /// handler's choice: the most dead letters that may be committed.
    dead_letters_allowed: u64,
    /// Commit markers still to land: (partition, transaction).
    late: Vec<(Channel, u64)>,
    /// The next committed transaction's number.
    next_txn: u64,
}

impl AppWorld {
    /// Builds the world and starts its first members.
    pub fn new(
        config: AppWorldConfig,
        factory: ThreadFactory,
        seed: u64,
    ) -> Result<Self, AppFailure> {
        let mut broker = SimBroker::new();
        let mut ids = BTreeMap::new();
        for (name, n) in &config.topics {
            ids.insert(name.clone(), broker.create_topic(name, *n));
        }
        let names: Vec<String> = config
            .tasks
            .iter()
            .map(|t| t.name.clone())
            .chain(config.edges.iter().map(|e| e.name.clone()))
            .collect();
        let mut oracle = Oracle::new(&names);
        for (name, &id) in &ids {
            for p in 0..broker.partitions(id).unwrap_or(0) {
                oracle.name_channel(Channel::new(id, p), format!("{name}:{p}"));
            }
        }
        let base = config.tasks.len();
        let resolve = |v: &[(String, i32)]| -> Vec<Channel> {
            v.iter()
                .filter_map(|(t, p)| ids.get(t).map(|&id| Channel::new(id, *p)))
                .collect()
        };
        let edges = config
            .edges
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                EdgeProducer::new(
                    spec.clone(),
                    base + i,
                    resolve(&spec.targets),
                    resolve(&spec.observes),
                )
            })
            .collect();
        let task_actor = config
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut world = AppWorld {
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            broker,
            oracle,
            factory,
            budget: config.budget.clone(),
            config,
            members: Vec::new(),
            next_member: 0,
            generation: 0,
            group_offsets: BTreeMap::new(),
            owners: BTreeMap::new(),
            task_actor,
            edges,
            committed_deliveries: BTreeMap::new(),
            now: 0,
            stats: AppStats::default(),
            pending: Vec::new(),
            holding_at_plan: BTreeSet::new(),
            target: BTreeMap::new(),
            kept_this_round: BTreeSet::new(),
            last_offsets: Vec::new(),
            dead_letters_allowed: 0,
            late: Vec::new(),
            next_txn: 0,
        };
        for _ in 0..world.config.members {
            world.add_member();
        }
        world.rebalance(None)?;
        Ok(world)
    }

    /// Counts so far.
    pub fn stats(&self) -> AppStats {
        self.stats
    }

    /// The world's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Every committed delivery of a task, in order, as (topic, partition,
    /// offset).
    pub fn committed_deliveries(&self, task: &str) -> &[(String, i32, i64)] {
        self.committed_deliveries
            .get(task)
            .map_or(&[], Vec::as_slice)
    }

    /// The stored record at a coordinate (for decoding what was delivered).
    pub fn record(&self, topic: &str, partition: i32, offset: i64) -> Option<&StoredRecord> {
        let c = Channel::new(self.broker.topic_id(topic)?, partition);
        match self.broker.entry(c, offset)? {
            crate::broker::Entry::Record { record, .. } => Some(record),
            crate::broker::Entry::Marker { .. } => None,
        }
    }

    fn fail(&self, message: impl Into<String>) -> AppFailure {
        AppFailure {
            seed: self.seed,
            step: self.stats.steps,
            message: message.into(),
        }
    }

    fn channel(&self, topic: &str, partition: i32) -> Option<Channel> {
        self.broker
            .topic_id(topic)
            .map(|id| Channel::new(id, partition))
    }

    /// Runs until nothing is left to do, then checks completeness.
    pub fn run(&mut self) -> Result<AppStats, AppFailure> {
        loop {
            let actions = self.enabled();
            if actions.is_empty() {
                break;
            }
            if self.stats.steps >= self.budget.max_steps {
                return Err(self.fail(format!(
                    "did not drain within {} steps",
                    self.budget.max_steps
                )));
            }
            let chosen = crate::world::pick_weighted(&mut self.rng, &actions);
            self.stats.steps += 1;
            self.execute(chosen)?;
            // A host makes the seeks its core asks for as soon as it asks.
            for i in 0..self.members.len() {
                self.apply_seeks(i)?;
            }
        }
        self.oracle
            .check_complete(&self.broker)
            .map_err(|v| self.fail(v.message))?;
        Ok(self.stats)
    }

    fn enabled(&self) -> Vec<(u32, Action)> {
        let mut out = Vec::new();
        if self.budget.edge_ops > 0 {
            for e in 0..self.edges.len() {
                out.push((4, Action::Edge(e)));
            }
        }
        for (i, m) in self.members.iter().enumerate() {
            for (k, (t, p)) in m.assignment.iter().enumerate() {
                let Some(c) = self.channel(t, *p) else {
                    continue;
                };
                let pos = m.positions.get(&(t.clone(), *p)).copied().unwrap_or(0);
                if pos < self.broker.last_stable(c) && !m.paused.contains(&(t.clone(), *p)) {
                    out.push((4, Action::Poll(i, k)));
                }
            }
            if !m.buffer.is_empty() {
                out.push((6, Action::Feed(i)));
            }
            if m.thread.has_open_work() {
                out.push((2, Action::Commit(i)));
            }
            if self.budget.clock_moves > 0 {
                out.push((1, Action::Clock(i)));
            }
            if m.thread.needs_punctuation() {
                out.push((2, Action::Retry(i)));
            }
            if let Some(wait) = m.thread.wake_in(self.now) {
                out.push((2, Action::Wake(i, wait.max(0))));
            }
            if self.budget.poll_faults > 0 {
                out.push((1, Action::PollFault(i)));
            }
            // A member whose open transaction has records in the log is
            // the interesting one to lose: what it streamed is orphaned, or
            // goes on as a zombie's.
            let streaming = if m.open.is_empty() { 1 } else { 4 };
            if self.budget.crashes > 0 {
                out.push((streaming, Action::Crash(i)));
            }
            if self.budget.zombies > 0 && !m.zombie && self.members.len() > 1 {
                out.push((streaming, Action::Zombie(i)));
            }
            if self.budget.bounces > 0 && !m.zombie && self.pending.is_empty() {
                out.push((1, Action::Bounce(i)));
            }
            if m.thread.restoring() {
                out.push((2, Action::Restore(i)));
            }
            if m.thread.has_streamed() {
                out.push((4, Action::Stream(i)));
            }
            if !m.open.is_empty() && (m.zombie || self.budget.zombies > 0) {
                // A member with records in the log whose session the group
                // ended learns it from its consumer: a zombie (the others
                // learn it from their fenced commit), or a live member
                // whose heartbeats stopped for a while.
                out.push((if m.zombie { 3 } else { 1 }, Action::Lost(i)));
            }
        }
        if !self.late.is_empty() {
            out.push((2, Action::LandMarker));
        }
        let live = self.members.iter().filter(|m| !m.zombie).count();
        if (self.budget.joins > 0 && self.members.len() < self.config.max_members) || live == 0 {
            out.push((1, Action::Join));
        }
        if self.budget.retention > 0 {
            for c in self.broker.channels() {
                let bound = self.retention_bound(c);
                if bound > self.broker.log_start(c) {
                    out.push((1, Action::Retain(c, bound)));
                }
            }
        }
        if self.budget.lookup_failures > 0 {
            out.push((1, Action::LookupOutage));
        }
        if !self.pending.is_empty() {
            out.push((3, Action::Reconcile));
        }
        out
    }

    /// Retention never passes what the group committed on a consumed
    /// partition, nor a record a thread holds; changelogs and sinks nobody
    /// consumes may be trimmed freely up to their end.
    fn retention_bound(&self, c: Channel) -> i64 {
        let Some(name) = self.broker.topic_name(c.topic).map(str::to_owned) else {
            return 0;
        };
        if !self.config.subscriptions.contains(&name) {
            // Changelogs are compacted, not deleted; other topics nobody
            // here consumes keep their history for the oracle's sake.
            return self.broker.log_start(c);
        }
        let mut bound = self
            .group_offsets
            .get(&(name.clone(), c.partition))
            .copied()
            .unwrap_or(0);
        for m in &self.members {
            if let Some(&p) = m.positions.get(&(name.clone(), c.partition)) {
                bound = bound.min(p);
            }
            for (t, p, offset) in m.thread.held_heads() {
                if t == name && p == c.partition {
                    bound = bound.min(offset);
                }
            }
        }
        bound
    }

    // Longer than 100 lines on purpose: one arm per action the world
    // can take, each a few lines; the list of actions is the point.
    fn execute(&mut self, action: Action) -> Result<(), AppFailure> {
        match action {
            Action::Edge(e) => {
                self.budget.edge_ops -= 1;
                let key = self.rng.random_range(0..1_000u64);
                let hops = self.config.hops;
                self.edges[e].op(&mut self.broker, &mut self.oracle, key, hops);
            }
            Action::Poll(i, k) => self.poll(i, k)?,
            Action::Feed(i) => {
                let Some(record) = self.members[i].buffer.pop_front() else {
                    return Ok(());
                };
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .on_record(record, broker)
                    .map_err(|e| self.fail(format!("member {i}: record refused: {e}")))?;
            }
            Action::Clock(i) => {
                self.budget.clock_moves -= 1;
                self.stats.clock_moves += 1;
                let step = self.rng.random_range(1..=self.config.clock_step_ms.max(1));
                self.now += step;
                let now = self.now;
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .punctuate(now, broker)
                    .map_err(|e| self.fail(format!("member {i}: punctuate refused: {e}")))?;
            }
            Action::Retry(i) => {
                let now = self.now;
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .punctuate(now, broker)
                    .map_err(|e| self.fail(format!("member {i}: punctuate refused: {e}")))?;
            }
            Action::Commit(i) => {
                let now = self.now + self.config.clock_step_ms;
                let broker = &self.broker;
                let txn = if self.rng.random_bool(0.5) {
                    let drained = self.members[i].buffer.is_empty();
                    self.members[i]
                        .thread
                        .poll_transaction(now, drained, broker)
                } else {
                    self.members[i].thread.flush(broker)
                }
                .map_err(|e| self.fail(format!("member {i}: transaction refused: {e}")))?;
                if let Some(txn) = txn {
                    let fate = if self.budget.faults > 0 && self.rng.random_bool(0.3) {
                        self.budget.faults -= 1;
                        // A refused record takes two shares of eight: its
                        // dead letter commits only if the task's next
                        // transactions go through, which the other faults
                        // often stop.
                        let fault = match self.rng.random_range(0..8) {
                            6 => SimFault::Hung,
                            0 => SimFault::Fenced,
                            1 => SimFault::Fatal,
                            2 => SimFault::Abortable,
                            3 => SimFault::Retriable,
                            4 => SimFault::Transient {
                                record: self.refusable(&txn),
                            },
                            _ => SimFault::RecordRefused {
                                record: self.refusable(&txn),
                                dead_letter: self.config.dead_letter_topic.is_some()
                                    && self.rng.random_bool(0.5),
                            },
                        };
                        CommitFate::Fault(fault)
                    } else if self.budget.aborts > 0 && self.rng.random_bool(0.3) {
                        self.budget.aborts -= 1;
                        CommitFate::Abort
                    } else if self.budget.crashes > 0 && self.rng.random_bool(0.1) {
                        self.budget.crashes -= 1;
                        CommitFate::Crash
                    } else if self.budget.store_faults > 0 && self.rng.random_bool(0.2) {
                        CommitFate::Store(match self.rng.random_range(0..4) {
                            0 => StoreFault::CrashAfterWrite,
                            1 => StoreFault::CrashBeforeWrite,
                            2 => StoreFault::WriteFails,
                            _ => StoreFault::CorruptAndCrash,
                        })
                    } else {
                        CommitFate::Commit
                    };
                    self.commit(i, txn, fate)?;
                }
            }
            Action::Crash(i) => {
                self.budget.crashes -= 1;
                self.crash(i)?;
            }
            Action::Join => {
                self.budget.joins = self.budget.joins.saturating_sub(1);
                self.add_member();
                self.rebalance(None)?;
            }
            Action::Zombie(i) => {
                self.budget.zombies -= 1;
                self.rebalance(Some(i))?;
            }
            Action::Retain(c, bound) => {
                self.budget.retention -= 1;
                self.stats.retention_moves += 1;
                let start = self.broker.log_start(c);
                let to = self.rng.random_range(start + 1..=bound);
                self.broker.advance_log_start(c, to);
            }
            Action::PollFault(i) => {
                self.budget.poll_faults -= 1;
                let fatal = self.rng.random_bool(0.3);
                let fault = SimFault::Poll { fatal };
                self.stats.faults[if fatal { 7 } else { 6 }] += 1;
                let d = self.answer(i, fault)?;
                if d != SimDirective::Continue {
                    // The thread failed, or rejoins: nothing was in flight.
                    self.replace(i)?;
                }
            }
            Action::Wake(i, wait) => {
                self.stats.wakes += 1;
                self.now += wait;
                let now = self.now;
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .punctuate(now, broker)
                    .map_err(|e| self.fail(format!("member {i}: punctuate refused: {e}")))?;
            }
            Action::Reconcile => self.reconcile()?,
            Action::Bounce(i) => {
                self.budget.bounces -= 1;
                self.bounce(i)?;
            }
            Action::Stream(i) => self.stream(i)?,
            Action::Lost(i) => self.lost(i)?,
            Action::LandMarker => {
                let k = self.rng.random_range(0..self.late.len());
                let (c, txn) = self.late.remove(k);
                self.broker.land_marker(c, txn);
            }
            Action::Restore(i) => {
                self.stats.restores_run += 1;
                if !self.late.is_empty() {
                    self.stats.restores_before_a_marker += 1;
                }
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .restore_step(broker)
                    .map_err(|e| self.fail(format!("member {i}: restore refused: {e}")))?;
            }
            Action::LookupOutage => {
                self.budget.lookup_failures -= 1;
                self.stats.lookup_failures += 1;
                let n = self.rng.random_range(1..=3);
                if self.rng.random_bool(0.5) {
                    self.broker.fail_log_starts(n);
                } else {
                    self.broker.fail_lookups(n);
                }
            }
        }
        Ok(())
    }

    fn poll(&mut self, i: usize, k: usize) -> Result<(), AppFailure> {
        let Some((t, p)) = self.members[i].assignment.get(k).cloned() else {
            return Ok(());
        };
        let Some(c) = self.channel(&t, p) else {
            return Ok(());
        };
        let batch = self.rng.random_range(1..=self.config.poll_batch.max(1));
        let mut pos = self.members[i]
            .positions
            .get(&(t.clone(), p))
            .copied()
            .unwrap_or(0)
            .max(self.broker.log_start(c));
        let mut last = None;
        for _ in 0..batch {
            let Some((offset, rec)) = self.broker.fetch(c, pos) else {
                break;
            };
            let mut headers = rec.headers.clone();
            rec.causal
                .encode_headers_into_as(rec.clock_version, &mut headers);
            // Counted from the bytes served, so a broker that rewrote the
            // clock in version 1 would count none.
            let served = headers.iter().rev().find(|h| h.name() == CLOCK_HEADER);
            if served.and_then(|h| ClockVersion::of(h.value.as_deref()?))
                == Some(ClockVersion::Compact)
            {
                self.stats.compact_clocks_fetched += 1;
            }
            self.members[i].buffer.push_back(PolledRecord {
                topic: t.clone(),
                partition: p,
                offset,
                timestamp: rec.timestamp,
                key: rec.key.clone(),
                value: rec.value.clone(),
                headers,
            });
            self.stats.polled += 1;
            last = Some(offset);
            pos = offset + 1;
        }
        // The consumer moves past markers and aborted records that follow;
        // or, as librdkafka's application position may, stops right after
        // the last record it returned (a later poll moves it on).
        let position = match (last, self.rng.random_bool(0.5)) {
            (Some(l), true) => l + 1,
            _ => match self.broker.fetch(c, pos) {
                Some((o, _)) => o,
                None => self.broker.last_stable(c).max(pos),
            },
        };
        self.members[i].positions.insert((t.clone(), p), position);
        let buffered_before = self.members[i]
            .buffer
            .iter()
            .filter(|f| f.topic == t && f.partition == p)
            .count();
        let last_returned = self.members[i]
            .buffer
            .iter()
            .filter(|f| f.topic == t && f.partition == p)
            .map(|f| f.offset)
            .max()
            .or(last);
        if buffered_before > 0 {
            self.stats.early_positions += 1;
        }
        let broker = &self.broker;
        self.members[i]
            .thread
            .on_position(&t, p, position, last_returned, broker)
            .map_err(|e| self.fail(format!("member {i}: position refused: {e}")))
    }
}
