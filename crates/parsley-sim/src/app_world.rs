//! [`AppWorld`]: real applications on real host cores, under a consumer
//! group, transactions, fencing, crashes and retention, judged by the
//! oracle.
//!
//! The reference host ([`SimNode`](crate::SimNode)) runs the protocol alone.
//! An application world instead runs whole stream threads, each behind the
//! [`StreamThread`] trait: a production host core (the `parsley` crate's
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

/// What a task did inside a transaction, in order.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TaskAct {
    /// The task delivered a record to its logic.
    Delivered {
        /// The task.
        task: String,
        /// The record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
    },
    /// The task sent an emission to the dead-letter topic instead of its
    /// sink: the next record of the transaction on the dead-letter topic,
    /// unstamped, and no causal send.
    DeadLettered {
        /// The task.
        task: String,
    },
    /// The task sent a record (an emission or a tick): the next record of
    /// the transaction that is not a changelog record.
    Sent {
        /// The task.
        task: String,
        /// The destination topic.
        topic: String,
        /// The destination partition.
        partition: i32,
    },
}

/// One transaction of a thread.
#[derive(Clone, Debug, Default)]
pub struct HostTransaction {
    /// Records to produce, in order.
    pub records: Vec<OutgoingRecord>,
    /// Consumed positions to commit.
    pub offsets: Vec<(String, i32, i64)>,
    /// What the tasks did, in order.
    pub acts: Vec<TaskAct>,
}

/// How a transaction ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// Committed.
    Committed,
    /// Aborted.
    Aborted,
    /// Fenced: another member owns the tasks now.
    Fenced,
}

/// A failure the world injects at a thread's client, by class: what the
/// host reports to its core, which decides what follows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimFault {
    /// The producer was fenced: its epoch is stale (its coordinator ended
    /// the transaction at its timeout, or another producer took its
    /// transactional id).
    Fenced,
    /// The client failed for good.
    Fatal,
    /// The transaction must be aborted.
    Abortable,
    /// A commit step failed in a way that may pass on a retry.
    Retriable,
    /// One record of the transaction was refused; `dead_letter` says
    /// whether the host's production handler sends it to the world's
    /// dead-letter topic (else the task fails and restarts).
    RecordRefused {
        /// The record's index in the transaction.
        record: usize,
        /// The production handler's choice.
        dead_letter: bool,
    },
    /// The consumer's poll reported an error.
    Poll {
        /// Whether the client gave up on the consumer.
        fatal: bool,
    },
    /// One record of the transaction could not be written *now* (it timed
    /// out while a leader moved, too few replicas were in sync): the
    /// transaction must be aborted and tried again, and the record is not
    /// refused. The host's production handler would send a refused record
    /// to the dead-letter topic, so a core that took this for a refusal
    /// dead-letters a valid emission, which the world counts.
    Transient {
        /// The record's index in the transaction.
        record: usize,
    },
    /// A call of the transactional producer never returned (a client
    /// defect waiting on a coordinator that went away); the commit had not
    /// happened.
    Hung,
    /// The abort the core asked for failed; `retriable` when the client
    /// says it may succeed if made again (its coordinator unreachable).
    AbortFailed {
        /// Whether the abort may be made again.
        retriable: bool,
    },
}

/// What a thread's core told its host to do about a fault.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimDirective {
    /// Retry the step.
    Retry,
    /// Abort the transaction.
    Abort,
    /// Leave the group and join again as a new member.
    Rejoin,
    /// The thread failed (its replacement joins the group).
    Fail,
    /// Nothing to do.
    Continue,
    /// Make a new producer (its initialisation ends the open transaction),
    /// then report the transaction aborted; the membership stays.
    ReplaceProducer,
}

impl SimFault {
    /// Whether `d` is a safe answer to this fault: one that never lets a
    /// transaction of unknown fate, or a fenced producer, go on.
    fn allows(self, d: SimDirective) -> bool {
        use SimDirective::*;
        match self {
            SimFault::Fenced | SimFault::Hung => matches!(d, Rejoin | ReplaceProducer),
            SimFault::Fatal => matches!(d, Fail | Rejoin),
            SimFault::Abortable | SimFault::RecordRefused { .. } | SimFault::Transient { .. } => {
                d == Abort
            }
            SimFault::Retriable => matches!(d, Retry | Rejoin),
            SimFault::Poll { fatal: true } => matches!(d, Fail | Rejoin),
            SimFault::Poll { fatal: false } => d == Continue,
            SimFault::AbortFailed { retriable: true } => {
                matches!(d, Retry | ReplaceProducer | Rejoin)
            }
            SimFault::AbortFailed { retriable: false } => matches!(d, ReplaceProducer | Rejoin),
        }
    }
}

/// A fault of a thread's local store (its state directory), armed just
/// before a committed transaction's outcome reaches the thread, so it
/// strikes the write that outcome makes. A thread without a local store
/// declines it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreFault {
    /// The process dies inside the write, after the write landed (a write
    /// is atomic: all of it or none).
    CrashAfterWrite,
    /// The process dies inside the write, before it landed.
    CrashBeforeWrite,
    /// The write fails (a full disk) and changes nothing; the process
    /// goes on.
    WriteFails,
    /// The store's file is damaged, then the process dies.
    CorruptAndCrash,
}

/// One stream thread's host core, as the world drives it. Errors are the
/// host's refusals; the world reports them as failures (a correct host in a
/// correct world never refuses).
pub trait StreamThread {
    /// Partitions assigned (after a rebalance).
    fn assign(
        &mut self,
        parts: Vec<AssignedPartition>,
        broker: &SimBroker,
        now: i64,
    ) -> Result<(), String>;
    /// Settles the open work before partitions are revoked, as the host
    /// core decides: the transaction to commit first, if any (otherwise
    /// there was nothing open, or the core aborted it).
    fn before_revoke(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String>;
    /// Partitions revoked.
    fn revoke(&mut self, parts: &[(String, i32)]) -> Result<(), String>;
    /// One polled record handed over. A task's failure is the host's to
    /// handle (abort, and its error handler), not a refusal.
    fn on_record(&mut self, record: PolledRecord, broker: &SimBroker) -> Result<(), String>;
    /// The consumer position after a poll, with the highest offset the
    /// polls returned there.
    fn on_position(
        &mut self,
        topic: &str,
        partition: i32,
        position: i64,
        last_returned: Option<i64>,
        broker: &SimBroker,
    ) -> Result<(), String>;
    /// The wall clock.
    fn punctuate(&mut self, now: i64, broker: &SimBroker) -> Result<(), String>;
    /// The open transaction if it is due.
    fn poll_transaction(
        &mut self,
        now: i64,
        broker: &SimBroker,
    ) -> Result<Option<HostTransaction>, String>;
    /// The open transaction now, if any.
    fn flush(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String>;
    /// How the transaction handed over last ended.
    fn outcome(&mut self, outcome: Outcome, broker: &SimBroker) -> Result<(), String>;
    /// The host aborted the open (not handed over) work.
    fn abort(&mut self, broker: &SimBroker) -> Result<(), String>;
    /// Consumer seeks to make (acknowledged as made: the world makes every
    /// seek it is handed).
    fn take_seeks(&mut self, broker: &SimBroker) -> Vec<Seek>;
    /// Whether there is open work.
    fn has_open_work(&self) -> bool;
    /// The offset of every held queue head, as (topic, partition, offset).
    fn held_heads(&self) -> Vec<(String, i32, i64)>;
    /// Whether the thread has work to retry at its next punctuation (a task
    /// whose start failed on a lookup). A real poll loop punctuates on every
    /// turn; the world offers a punctuation without moving the clock.
    fn needs_punctuation(&self) -> bool {
        false
    }
    /// A fault at the thread's client; the answer is what the host does.
    /// Commit faults come while the transaction handed over last is in
    /// flight. A host whose answer stops a task (a refused record) also
    /// handles that task's failure, as its error handlers would.
    fn fault(&mut self, fault: SimFault, broker: &SimBroker) -> Result<SimDirective, String>;
    /// How long from `now` until the thread has timed work (a stopped
    /// task's restart), if any: the world lets that much time pass.
    fn wake_in(&self, _now: i64) -> Option<i64> {
        None
    }
    /// Fetch pauses and resumes to make, in order, before the seeks.
    fn take_flow(&mut self) -> Vec<FlowChange> {
        Vec::new()
    }
    /// The offset each record of the transaction handed over last got,
    /// before its committed outcome (a producer's delivery reports).
    fn delivered(&mut self, _offsets: &[i64], _broker: &SimBroker) {}
    /// Arms a local store fault for the next outcome's writes; false when
    /// the thread keeps no local store.
    fn store_fault(&mut self, _fault: StoreFault) -> bool {
        false
    }
    /// Whether the thread has a task restore to run (restores that run
    /// apart from processing).
    fn restoring(&self) -> bool {
        false
    }
    /// Runs one task restore against the broker as it is now, and hands
    /// its outcome to the core.
    fn restore_step(&mut self, _broker: &SimBroker) -> Result<(), String> {
        Ok(())
    }
}

/// Makes stream threads: one per member incarnation.
pub type ThreadFactory = Box<dyn Fn(usize) -> Box<dyn StreamThread>>;

/// A task of the application: an oracle actor consuming some partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    /// The task's name, as the thread reports it in [`TaskAct`].
    pub name: String,
    /// The partitions it consumes.
    pub inputs: Vec<(String, i32)>,
}

/// What an application world may spend.
#[derive(Clone, Debug)]
pub struct AppBudget {
    /// Steps before an undrained world fails.
    pub max_steps: u64,
    /// Edge-producer operations.
    pub edge_ops: u32,
    /// Member crashes (idle or during a commit).
    pub crashes: u32,
    /// Members joining (scale-out).
    pub joins: u32,
    /// Rebalances that one member misses (zombies).
    pub zombies: u32,
    /// Commits made to fail (aborted).
    pub aborts: u32,
    /// Wall-clock advances (each may tick).
    pub clock_moves: u32,
    /// Retention moves.
    pub retention: u32,
    /// Outages of log-start lookups.
    pub lookup_failures: u32,
    /// Client faults injected into commits (each of a random class).
    pub faults: u32,
    /// Consumer poll errors injected.
    pub poll_faults: u32,
    /// Faults of a local store, around a commit's write to it (see
    /// [`StoreFault`]).
    pub store_faults: u32,
    /// Static members whose process restarts within the session timeout
    /// (same member, same partitions, no rebalance).
    pub bounces: u32,
    /// Commit markers written late: a committed transaction's marker on
    /// one partition it wrote lands at a later step, as on Kafka, where
    /// the coordinator writes a transaction's markers partition by
    /// partition (one partition's leader failing over delays its marker).
    /// Until it lands, `read_committed` readers stop below that
    /// transaction's records there, while its consumed offsets already
    /// count.
    pub late_markers: u32,
}

impl Default for AppBudget {
    fn default() -> Self {
        AppBudget {
            max_steps: 50_000,
            edge_ops: 0,
            crashes: 0,
            joins: 0,
            zombies: 0,
            aborts: 0,
            clock_moves: 0,
            retention: 0,
            lookup_failures: 0,
            faults: 0,
            poll_faults: 0,
            store_faults: 0,
            bounces: 0,
            late_markers: 0,
        }
    }
}

/// How the group coordinator spreads partitions over members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Assignor {
    /// Kafka's range assignor: per topic, contiguous ranges over the sorted
    /// members, so partition `p` of equally sized topics lands together.
    #[default]
    Range,
    /// Partitions dealt over the members, the first topic forwards and the
    /// others backwards: splits tasks (for the self-test that a host refuses
    /// a split task).
    RoundRobin,
    /// The consumer group protocol of KIP-848 with its server-side range
    /// assignor: the target is the range assignment, reached partition by
    /// partition while the members go on processing. A partition leaves
    /// its old owner before its new owner gets it; otherwise the moves come
    /// in any order, so a member can hold some of a task's partitions
    /// before the rest, and a task that keeps its partitions never stops.
    Incremental,
}

/// One step of an incremental reconciliation, by member id.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Move {
    Revoke(usize, (String, i32)),
    Assign(usize, (String, i32)),
}

/// An application world's definition.
#[derive(Clone, Debug)]
pub struct AppWorldConfig {
    /// The assignor.
    pub assignor: Assignor,
    /// Every topic with its partition count (sources, sinks, tick topics,
    /// changelogs).
    pub topics: Vec<(String, i32)>,
    /// The topics the group subscribes to (sources and tick topics).
    pub subscriptions: Vec<String>,
    /// The application's tasks.
    pub tasks: Vec<TaskSpec>,
    /// Plain producers feeding the sources.
    pub edges: Vec<EdgeSpec>,
    /// Stream threads at the start.
    pub members: usize,
    /// The most stream threads at once.
    pub max_members: usize,
    /// The most records one poll returns.
    pub poll_batch: usize,
    /// How far one clock move advances the wall clock at most (ms).
    pub clock_step_ms: i64,
    /// Feedback hops of edge-produced records.
    pub hops: u32,
    /// The topic refused records may be sent to instead of their sink (a
    /// topic of `topics`), if any.
    pub dead_letter_topic: Option<String>,
    /// Budgets.
    pub budget: AppBudget,
}

/// What an application world did: the counts its floors are built on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppStats {
    /// Scheduler steps.
    pub steps: u64,
    /// Committed deliveries checked by the oracle.
    pub deliveries: u64,
    /// Records polled.
    pub polled: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Committed transactions that spanned two or more tasks.
    pub multi_task_commits: u64,
    /// Transactions aborted (injected, or a crash during the commit).
    pub aborts: u64,
    /// Aborts of transactions whose tasks held records.
    pub aborts_while_holding: u64,
    /// Aborted records left in the log.
    pub aborted_records: u64,
    /// Commits fenced (zombies).
    pub fenced: u64,
    /// Member crashes.
    pub crashes: u64,
    /// Rebalances.
    pub rebalances: u64,
    /// Tasks that moved to another member.
    pub migrations: u64,
    /// Tasks that moved while their old owner held records.
    pub migrations_while_holding: u64,
    /// Positions reported while polled records below them were buffered.
    pub early_positions: u64,
    /// Wall-clock moves.
    pub clock_moves: u64,
    /// Log-start advances.
    pub retention_moves: u64,
    /// Log-start lookup outages.
    pub lookup_failures: u64,
    /// Faults injected, by class: fenced, fatal, abortable, retriable,
    /// refused (failed), refused (dead-lettered), poll, fatal poll,
    /// transient record failure, failed abort (retriable), failed abort
    /// (not retriable), hung client call.
    pub faults: [u64; 12],
    /// Producers a thread replaced, keeping its membership.
    pub producer_replacements: u64,
    /// Retriable faults whose retries ran out (the commit's fate unknown),
    /// then committed by the coordinator, and then aborted.
    pub unknown_fates: [u64; 2],
    /// Dead letters committed.
    pub dead_letters: u64,
    /// Times the world let time pass for a thread's timed work.
    pub wakes: u64,
    /// Incremental moves that left a member holding some but not all of a
    /// task's partitions.
    pub partial_holds: u64,
    /// Committed deliveries made while a reconciliation was under way.
    pub deliveries_while_reconciling: u64,
    /// Records fetched whose `vc` was sent in the compact version 2.
    pub compact_clocks_fetched: u64,
    /// Incremental reconciliation steps carried out.
    pub reconcile_steps: u64,
    /// Tasks holding records that kept every partition through a
    /// reconciliation (they never stop).
    pub kept_while_holding: u64,
    /// Local store faults carried out, by [`StoreFault`] (in its order).
    pub store_faults: [u64; 4],
    /// Static members restarted in place.
    pub bounces: u64,
    /// Task restores run apart from processing.
    pub restores_run: u64,
    /// Deliveries committed by a member while one of its tasks restored.
    pub deliveries_while_restoring: u64,
    /// Commit markers written late, partition by partition.
    pub late_markers: u64,
    /// Restores run while a changelog of theirs had a marker still to land.
    pub restores_before_a_marker: u64,
}

impl AppStats {
    /// Adds another world's counts.
    pub fn add(&mut self, o: &AppStats) {
        self.steps += o.steps;
        self.deliveries += o.deliveries;
        self.polled += o.polled;
        self.commits += o.commits;
        self.multi_task_commits += o.multi_task_commits;
        self.aborts += o.aborts;
        self.aborts_while_holding += o.aborts_while_holding;
        self.aborted_records += o.aborted_records;
        self.fenced += o.fenced;
        self.crashes += o.crashes;
        self.rebalances += o.rebalances;
        self.migrations += o.migrations;
        self.migrations_while_holding += o.migrations_while_holding;
        self.early_positions += o.early_positions;
        self.clock_moves += o.clock_moves;
        self.retention_moves += o.retention_moves;
        self.lookup_failures += o.lookup_failures;
        for (a, b) in self.faults.iter_mut().zip(o.faults) {
            *a += b;
        }
        for (a, b) in self.unknown_fates.iter_mut().zip(o.unknown_fates) {
            *a += b;
        }
        self.dead_letters += o.dead_letters;
        self.producer_replacements += o.producer_replacements;
        self.wakes += o.wakes;
        self.partial_holds += o.partial_holds;
        self.deliveries_while_reconciling += o.deliveries_while_reconciling;
        self.reconcile_steps += o.reconcile_steps;
        self.kept_while_holding += o.kept_while_holding;
        for (a, b) in self.store_faults.iter_mut().zip(o.store_faults) {
            *a += b;
        }
        self.bounces += o.bounces;
        self.restores_run += o.restores_run;
        self.deliveries_while_restoring += o.deliveries_while_restoring;
        self.late_markers += o.late_markers;
        self.restores_before_a_marker += o.restores_before_a_marker;
    }
}

/// A world that failed, with the seed and step that reproduce it.
#[derive(Clone, Debug)]
pub struct AppFailure {
    /// The seed.
    pub seed: u64,
    /// The step.
    pub step: u64,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for AppFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}",
            self.seed, self.step, self.message
        )
    }
}

impl std::error::Error for AppFailure {}

struct Member {
    id: usize,
    thread: Box<dyn StreamThread>,
    generation: u64,
    assignment: Vec<(String, i32)>,
    positions: BTreeMap<(String, i32), i64>,
    buffer: VecDeque<PolledRecord>,
    zombie: bool,
    paused: BTreeSet<(String, i32)>,
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

    fn add_member(&mut self) {
        let id = self.next_member;
        self.next_member += 1;
        let thread = (self.factory)(id);
        self.members.push(Member {
            id,
            thread,
            generation: 0,
            assignment: Vec::new(),
            positions: BTreeMap::new(),
            buffer: VecDeque::new(),
            zombie: false,
            paused: BTreeSet::new(),
        });
    }

    /// The range assignor over the live, non-zombie members (sorted by id):
    /// per topic, contiguous ranges of partitions, the first members taking
    /// one more when the count does not divide.
    fn range_assignment(&self) -> BTreeMap<usize, Vec<(String, i32)>> {
        let live: Vec<usize> = self
            .members
            .iter()
            .filter(|m| !m.zombie)
            .map(|m| m.id)
            .collect();
        let mut out: BTreeMap<usize, Vec<(String, i32)>> =
            live.iter().map(|&id| (id, Vec::new())).collect();
        if live.is_empty() {
            return out;
        }
        let mut topics = self.config.subscriptions.clone();
        topics.sort();
        if self.config.assignor == Assignor::RoundRobin {
            // Dealt by partition, the first topic in member order and every
            // other topic in reverse: with two or more members, partition p
            // of the first topic and of any other land on different members.
            for (ti, t) in topics.iter().enumerate() {
                let n = self
                    .config
                    .topics
                    .iter()
                    .find(|(name, _)| name == t)
                    .map_or(0, |(_, n)| *n);
                for p in 0..n {
                    let m = live.len();
                    let k = p as usize % m;
                    let member = live[if ti == 0 { k } else { m - 1 - k }];
                    if let Some(v) = out.get_mut(&member) {
                        v.push((t.clone(), p));
                    }
                }
            }
            return out;
        }
        for t in topics {
            let n = self
                .config
                .topics
                .iter()
                .find(|(name, _)| *name == t)
                .map_or(0, |(_, n)| *n) as usize;
            let m = live.len();
            let (per, extra) = (n / m, n % m);
            let mut p: i32 = 0;
            for (i, &id) in live.iter().enumerate() {
                let take = per + usize::from(i < extra);
                for _ in 0..take {
                    if let Some(v) = out.get_mut(&id) {
                        v.push((t.clone(), p));
                    }
                    p += 1;
                }
            }
        }
        out
    }

    fn task_of(&self, topic: &str, partition: i32) -> Option<&TaskSpec> {
        self.config.tasks.iter().find(|t| {
            t.inputs
                .iter()
                .any(|(tt, p)| tt == topic && *p == partition)
        })
    }

    /// A rebalance: every live member that takes part commits or aborts
    /// its open work and gives up its partitions; then the new assignment
    /// goes out. `missing` misses it (it becomes a zombie).
    fn rebalance(&mut self, missing: Option<usize>) -> Result<(), AppFailure> {
        self.stats.rebalances += 1;
        let holding = self.holding_tasks();
        if let Some(i) = missing {
            self.members[i].zombie = true;
        }
        if self.config.assignor == Assignor::Incremental {
            self.holding_at_plan = holding;
            self.plan_reconciliation();
            return Ok(());
        }
        for i in 0..self.members.len() {
            if self.members[i].zombie {
                continue;
            }
            self.before_revoke(i)?;
            let revoked = std::mem::take(&mut self.members[i].assignment);
            self.members[i]
                .thread
                .revoke(&revoked)
                .map_err(|e| self.fail(format!("member {i}: revoke refused: {e}")))?;
            self.members[i].buffer.clear();
            self.members[i].positions.clear();
            self.members[i].paused.clear();
        }
        // The revocations ran under the old generation; the assignment is
        // the new one.
        self.generation += 1;
        let assignment = self.range_assignment();
        let mut owners = BTreeMap::new();
        for i in 0..self.members.len() {
            if self.members[i].zombie {
                continue;
            }
            let id = self.members[i].id;
            let parts = assignment.get(&id).cloned().unwrap_or_default();
            for (t, p) in &parts {
                if let Some(task) = self.task_of(t, *p) {
                    owners.insert(task.name.clone(), id);
                }
            }
            let assigned: Vec<AssignedPartition> =
                parts.iter().map(|(t, p)| self.assigned(t, *p)).collect();
            self.members[i].generation = self.generation;
            self.members[i].assignment = parts;
            let now = self.now;
            let broker = &self.broker;
            self.members[i]
                .thread
                .assign(assigned, broker, now)
                .map_err(|e| self.fail(format!("member {id}: assignment refused: {e}")))?;
            self.apply_seeks(i)?;
        }
        for (task, &owner) in &owners {
            if let Some(&old) = self.owners.get(task)
                && old != owner
            {
                self.stats.migrations += 1;
                if holding.contains(task) {
                    self.stats.migrations_while_holding += 1;
                }
            }
        }
        self.owners = owners;
        Ok(())
    }

    /// A new epoch: every live member learns it (its next commit carries
    /// it), and the moves from what each holds to the range assignment are
    /// planned, replacing any left from an earlier epoch.
    fn plan_reconciliation(&mut self) {
        self.generation += 1;
        for m in &mut self.members {
            if !m.zombie {
                m.generation = self.generation;
            }
        }
        let target = self.range_assignment();
        self.kept_this_round.clear();
        self.target = target.clone();
        self.count_kept_while_holding();
        let mut pending = Vec::new();
        for m in &self.members {
            if m.zombie {
                continue;
            }
            let want = target.get(&m.id).cloned().unwrap_or_default();
            for p in &m.assignment {
                if !want.contains(p) {
                    pending.push(Move::Revoke(m.id, p.clone()));
                }
            }
            for p in want {
                if !m.assignment.contains(&p) {
                    pending.push(Move::Assign(m.id, p));
                }
            }
        }
        self.pending = pending;
    }

    /// Counts, once per reconciliation, each task that holds records while
    /// its member keeps every partition of it: it runs through the
    /// rebalance with its queues untouched.
    fn count_kept_while_holding(&mut self) {
        for name in self.holding_tasks() {
            if self.kept_this_round.contains(&name) {
                continue;
            }
            let Some(task) = self.config.tasks.iter().find(|t| t.name == name) else {
                continue;
            };
            let kept = self.members.iter().any(|m| {
                !m.zombie
                    && task.inputs.iter().all(|p| {
                        m.assignment.contains(p)
                            && self.target.get(&m.id).is_some_and(|t| t.contains(p))
                    })
            });
            if kept {
                self.stats.kept_while_holding += 1;
                self.kept_this_round.insert(name);
            }
        }
    }

    /// One move of the reconciliation, chosen at random among those the
    /// protocol allows now (an assignment only once no live member holds
    /// the partition).
    fn reconcile(&mut self) -> Result<(), AppFailure> {
        let index = |world: &AppWorld, id: usize| world.members.iter().position(|m| m.id == id);
        self.pending.retain(|m| {
            let id = match m {
                Move::Revoke(id, _) | Move::Assign(id, _) => *id,
            };
            self.members.iter().any(|x| x.id == id && !x.zombie)
        });
        let allowed: Vec<usize> = (0..self.pending.len())
            .filter(|&k| match &self.pending[k] {
                Move::Revoke(..) => true,
                Move::Assign(_, p) => !self
                    .members
                    .iter()
                    .any(|m| !m.zombie && m.assignment.contains(p)),
            })
            .collect();
        if allowed.is_empty() {
            self.pending.clear();
            return Ok(());
        }
        self.count_kept_while_holding();
        let pick = allowed[self.rng.random_range(0..allowed.len())];
        let step = self.pending.remove(pick);
        self.stats.reconcile_steps += 1;
        match step {
            Move::Revoke(id, p) => {
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                self.before_revoke(i)?;
                // The commit may have found it a zombie and replaced it.
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                if !self.members[i].assignment.contains(&p) {
                    return Ok(());
                }
                self.members[i]
                    .thread
                    .revoke(std::slice::from_ref(&p))
                    .map_err(|e| self.fail(format!("member {id}: revoke refused: {e}")))?;
                let m = &mut self.members[i];
                m.assignment.retain(|x| *x != p);
                m.buffer.retain(|f| !(f.topic == p.0 && f.partition == p.1));
                m.positions.remove(&p);
                m.paused.remove(&p);
                self.apply_seeks(i)
            }
            Move::Assign(id, p) => {
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                let assigned = self.assigned(&p.0, p.1);
                let now = self.now;
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .assign(vec![assigned], broker, now)
                    .map_err(|e| self.fail(format!("member {id}: assignment refused: {e}")))?;
                self.members[i].assignment.push(p.clone());
                if let Some(task) = self.task_of(&p.0, p.1).cloned() {
                    let held = task
                        .inputs
                        .iter()
                        .filter(|x| self.members[i].assignment.contains(x))
                        .count();
                    if held < task.inputs.len() {
                        self.stats.partial_holds += 1;
                    } else {
                        if let Some(&old) = self.owners.get(&task.name)
                            && old != id
                        {
                            self.stats.migrations += 1;
                            if self.holding_at_plan.contains(&task.name) {
                                self.stats.migrations_while_holding += 1;
                            }
                        }
                        self.owners.insert(task.name.clone(), id);
                    }
                }
                self.apply_seeks(i)
            }
        }
    }

    /// A partition as an assignment hands it to a member: the group's
    /// committed position, and the broker's log start and end now.
    fn assigned(&self, topic: &str, partition: i32) -> AssignedPartition {
        let c = self.channel(topic, partition);
        AssignedPartition {
            topic: topic.to_owned(),
            partition,
            committed: self
                .group_offsets
                .get(&(topic.to_owned(), partition))
                .copied(),
            log_start: c.map_or(0, |c| self.broker.log_start(c)),
            end: Some(c.map_or(0, |c| self.broker.last_stable(c))),
        }
    }

    /// What member `i` does with its open work before a revocation.
    fn before_revoke(&mut self, i: usize) -> Result<(), AppFailure> {
        let broker = &self.broker;
        let txn = self.members[i].thread.before_revoke(broker).map_err(|e| {
            self.fail(format!(
                "member {i}: settling before a revocation refused: {e}"
            ))
        })?;
        match txn {
            Some(txn) => self.commit(i, txn, CommitFate::Commit),
            None => Ok(()),
        }
    }

    fn holding_tasks(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for m in &self.members {
            for (t, p, _) in m.thread.held_heads() {
                if let Some(task) = self.task_of(&t, p) {
                    out.insert(task.name.clone());
                }
            }
        }
        out
    }

    fn apply_seeks(&mut self, i: usize) -> Result<(), AppFailure> {
        for f in self.members[i].thread.take_flow() {
            if f.paused {
                self.members[i].paused.insert((f.topic, f.partition));
            } else {
                self.members[i].paused.remove(&(f.topic, f.partition));
            }
        }
        for Seek {
            topic: t,
            partition: p,
            offset,
        } in self.members[i].thread.take_seeks(&self.broker)
        {
            let Some(c) = self.channel(&t, p) else {
                return Err(self.fail(format!("seek to unknown topic {t}")));
            };
            if let Some(task) = self.task_of(&t, p)
                && let Some(&actor) = self.task_actor.get(&task.name)
            {
                self.oracle.consume(actor, c, offset);
            }
            self.members[i]
                .buffer
                .retain(|f| !(f.topic == t && f.partition == p));
            self.members[i].positions.insert((t, p), offset);
        }
        Ok(())
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
            if self.budget.crashes > 0 {
                out.push((1, Action::Crash(i)));
            }
            if self.budget.zombies > 0 && !m.zombie && self.members.len() > 1 {
                out.push((1, Action::Zombie(i)));
            }
            if self.budget.bounces > 0 && !m.zombie && self.pending.is_empty() {
                out.push((1, Action::Bounce(i)));
            }
            if m.thread.restoring() {
                out.push((2, Action::Restore(i)));
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
                    self.members[i].thread.poll_transaction(now, broker)
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

    /// A static member's process dies and a new one takes its place within
    /// the session timeout: same member, same generation, same partitions,
    /// and no rebalance of the others. What the dead process had not
    /// committed is gone (its successor's producer fences it); the new
    /// thread starts every task of the assignment from the committed state.
    fn bounce(&mut self, i: usize) -> Result<(), AppFailure> {
        self.stats.bounces += 1;
        let id = self.members[i].id;
        // The old process first: its disk is free for the new one.
        let old = std::mem::replace(&mut self.members[i].thread, Box::new(Gone));
        drop(old);
        self.members[i].thread = (self.factory)(id);
        let m = &mut self.members[i];
        m.buffer.clear();
        m.positions.clear();
        m.paused.clear();
        let parts = m.assignment.clone();
        let assigned: Vec<AssignedPartition> =
            parts.iter().map(|(t, p)| self.assigned(t, *p)).collect();
        let now = self.now;
        let broker = &self.broker;
        self.members[i]
            .thread
            .assign(assigned, broker, now)
            .map_err(|e| {
                self.fail(format!(
                    "member {id}: assignment refused after a restart: {e}"
                ))
            })?;
        self.apply_seeks(i)
    }

    fn crash(&mut self, i: usize) -> Result<(), AppFailure> {
        self.stats.crashes += 1;
        self.members.remove(i);
        let live = self.members.iter().filter(|m| !m.zombie).count();
        if live == 0 {
            self.add_member();
        }
        self.rebalance(None)
    }

    /// Commits (or aborts, or crashes during) a transaction of member `i`,
    /// judging it through the oracle when it commits.
    /// A record of `txn` to refuse: mostly an emission (a record that is
    /// not a changelog record), sometimes any record.
    fn refusable(&mut self, txn: &HostTransaction) -> usize {
        let emissions: Vec<usize> = txn
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.topic.ends_with("-changelog"))
            .map(|(i, _)| i)
            .collect();
        if !emissions.is_empty() && self.rng.random_bool(0.75) {
            emissions[self.rng.random_range(0..emissions.len())]
        } else {
            self.rng.random_range(0..txn.records.len().max(1))
        }
    }

    /// Asks member `i`'s thread what to do about `fault`, and checks the
    /// answer is a safe one for its class.
    fn answer(&mut self, i: usize, fault: SimFault) -> Result<SimDirective, AppFailure> {
        let broker = &self.broker;
        let d = self.members[i]
            .thread
            .fault(fault, broker)
            .map_err(|e| self.fail(format!("member {i}: fault {fault:?} refused: {e}")))?;
        if !fault.allows(d) {
            return Err(self.fail(format!(
                "member {i}: {fault:?} answered with {d:?}, which lets an unsafe transaction or client go on"
            )));
        }
        Ok(d)
    }

    /// Member `i`'s thread is gone (it failed, or left to rejoin): a new
    /// member takes its place, and the group rebalances.
    fn replace(&mut self, i: usize) -> Result<(), AppFailure> {
        self.members.remove(i);
        self.add_member();
        self.rebalance(None)
    }

    /// Leaves a transaction's records in the log as aborted records.
    fn abort_records(&mut self, txn: &HostTransaction) -> Result<(), AppFailure> {
        let touched: BTreeSet<(String, i32)> = txn
            .records
            .iter()
            .map(|r| (r.topic.to_string(), r.partition))
            .collect();
        for r in &txn.records {
            let Some(c) = self.channel(&r.topic, r.partition) else {
                return Err(self.fail(format!("produce to unknown topic {}", r.topic)));
            };
            let record = self.stored(r, usize::MAX)?;
            self.broker.append(c, record, false);
            self.stats.aborted_records += 1;
        }
        for (t, p) in &touched {
            if let Some(c) = self.channel(t, *p) {
                self.broker.append_marker(c, false);
            }
        }
        Ok(())
    }

    /// A commit of member `i` meets a client fault; the thread's answer is
    /// carried out as a host would.
    fn faulted(
        &mut self,
        i: usize,
        txn: HostTransaction,
        fault: SimFault,
    ) -> Result<(), AppFailure> {
        let class = match fault {
            SimFault::Fenced => 0,
            SimFault::Fatal => 1,
            SimFault::Abortable => 2,
            SimFault::Retriable => 3,
            SimFault::RecordRefused {
                dead_letter: false, ..
            } => 4,
            SimFault::RecordRefused { .. } => 5,
            SimFault::Poll { fatal: false } => 6,
            SimFault::Poll { fatal: true } => 7,
            SimFault::Transient { .. } => 8,
            SimFault::AbortFailed { retriable: true } => 9,
            SimFault::AbortFailed { retriable: false } => 10,
            SimFault::Hung => 11,
        };
        let fault = match fault {
            SimFault::RecordRefused { .. } | SimFault::Transient { .. }
                if txn.records.is_empty() =>
            {
                SimFault::Abortable
            }
            other => other,
        };
        if let SimFault::RecordRefused {
            dead_letter: true, ..
        } = fault
        {
            self.dead_letters_allowed += 1;
        }
        self.stats.faults[class] += 1;
        let stale = self.members[i].generation != self.generation || self.members[i].zombie;
        loop {
            match self.answer(i, fault)? {
                SimDirective::Retry => {
                    if self.rng.random_bool(0.3) {
                        // The retried step went through.
                        return self.commit(i, txn, CommitFate::Commit);
                    }
                }
                SimDirective::Abort => {
                    // The abort itself may fail: its coordinator
                    // unreachable (it may go through when made again), or
                    // refusing it.
                    while self.budget.faults > 0 && self.rng.random_bool(0.25) {
                        self.budget.faults -= 1;
                        let retriable = self.rng.random_bool(0.5);
                        self.stats.faults[if retriable { 9 } else { 10 }] += 1;
                        match self.answer(i, SimFault::AbortFailed { retriable })? {
                            // Made again: it fails again, or goes through.
                            SimDirective::Retry => continue,
                            // The new producer's initialisation ends the
                            // transaction.
                            SimDirective::ReplaceProducer => {
                                self.stats.producer_replacements += 1;
                                break;
                            }
                            _ => {
                                self.abort_records(&txn)?;
                                return self.replace(i);
                            }
                        }
                    }
                    return self.aborted(i, &txn);
                }
                SimDirective::ReplaceProducer => {
                    self.stats.producer_replacements += 1;
                    return self.aborted(i, &txn);
                }
                SimDirective::Rejoin | SimDirective::Fail => {
                    if fault == SimFault::Retriable && !stale && self.rng.random_bool(0.5) {
                        // The commit's fate was unknown to the thread; the
                        // coordinator had recorded it.
                        self.stats.unknown_fates[0] += 1;
                        self.judge(i, &txn)?;
                    } else {
                        if fault == SimFault::Retriable {
                            self.stats.unknown_fates[1] += 1;
                        }
                        self.abort_records(&txn)?;
                    }
                    return self.replace(i);
                }
                SimDirective::Continue => {
                    return Err(self.fail(format!("member {i}: {fault:?} answered Continue")));
                }
            }
        }
    }

    /// Member `i`'s transaction ended aborted (its records stay in the log
    /// as aborted records); the thread hears it and makes its seeks.
    fn aborted(&mut self, i: usize, txn: &HostTransaction) -> Result<(), AppFailure> {
        self.abort_records(txn)?;
        self.stats.aborts += 1;
        let broker = &self.broker;
        self.members[i]
            .thread
            .outcome(Outcome::Aborted, broker)
            .map_err(|e| self.fail(format!("member {i}: abort refused: {e}")))?;
        self.apply_seeks(i)
    }

    fn commit(
        &mut self,
        i: usize,
        txn: HostTransaction,
        fate: CommitFate,
    ) -> Result<(), AppFailure> {
        if let CommitFate::Fault(fault) = fate {
            return self.faulted(i, txn, fault);
        }
        let (fate, store) = match fate {
            CommitFate::Store(f) => (CommitFate::Commit, Some(f)),
            other => (other, None),
        };
        // EOS v2 fences a zombie through the offset commit, which carries
        // the member's group generation: a transaction without offsets is
        // not fenced (a host must never send one).
        let stale = (self.members[i].generation != self.generation || self.members[i].zombie)
            && !txn.offsets.is_empty();
        if fate == CommitFate::Crash && !stale && self.rng.random_bool(0.5) {
            // The coordinator recorded the commit before the crash: it
            // commits, and the member is gone.
            self.commit(i, txn, CommitFate::Commit)?;
            self.stats.crashes += 1;
            return self.crash(i);
        }
        let holding = !self.members[i].thread.held_heads().is_empty();
        if stale || fate != CommitFate::Commit {
            self.abort_records(&txn)?;
            let broker = &self.broker;
            if stale {
                self.stats.fenced += 1;
                self.members[i]
                    .thread
                    .outcome(Outcome::Fenced, broker)
                    .map_err(|e| self.fail(format!("member {i}: fencing refused: {e}")))?;
                // The zombie learns it was fenced and rejoins as a new
                // member.
                self.members.remove(i);
                self.add_member();
                return self.rebalance(None);
            }
            self.stats.aborts += 1;
            if holding {
                self.stats.aborts_while_holding += 1;
            }
            if fate == CommitFate::Crash {
                self.stats.crashes += 1;
                return self.crash(i);
            }
            self.members[i]
                .thread
                .outcome(Outcome::Aborted, broker)
                .map_err(|e| self.fail(format!("member {i}: abort refused: {e}")))?;
            return self.apply_seeks(i);
        }
        self.judge(i, &txn)?;
        let offsets = std::mem::take(&mut self.last_offsets);
        self.members[i].thread.delivered(&offsets, &self.broker);
        let armed = store.filter(|&f| self.members[i].thread.store_fault(f));
        let broker = &self.broker;
        self.members[i]
            .thread
            .outcome(Outcome::Committed, broker)
            .map_err(|e| self.fail(format!("member {i}: commit refused: {e}")))?;
        if let Some(f) = armed {
            self.budget.store_faults -= 1;
            self.stats.store_faults[f as usize] += 1;
            if f != StoreFault::WriteFails {
                self.stats.crashes += 1;
                return self.crash(i);
            }
        }
        Ok(())
    }

    /// Judges a committed transaction through the oracle,
    /// then appends it and commits its offsets.
    fn judge(&mut self, i: usize, txn: &HostTransaction) -> Result<(), AppFailure> {
        let touched: BTreeSet<(String, i32)> = txn
            .records
            .iter()
            .map(|r| (r.topic.to_string(), r.partition))
            .collect();
        let mut staged: BTreeSet<ActorId> = BTreeSet::new();
        let mut pending: VecDeque<(ActorId, PendingSend, String, i32)> = VecDeque::new();
        let mut delivered: Vec<(String, (String, i32, i64))> = Vec::new();
        let mut result = Ok(());
        self.last_offsets.clear();
        for act in &txn.acts {
            let task = match act {
                TaskAct::Delivered { task, .. } | TaskAct::Sent { task, .. } => task,
                TaskAct::DeadLettered { .. } => continue,
            };
            let Some(&actor) = self.task_actor.get(task) else {
                result = Err(format!("unknown task {task}"));
                break;
            };
            if staged.insert(actor) {
                self.oracle.begin(actor);
            }
            match act {
                TaskAct::Delivered {
                    task,
                    topic,
                    partition,
                    offset,
                } => {
                    let Some(c) = self.channel(topic, *partition) else {
                        result = Err(format!("delivery on unknown topic {topic}"));
                        break;
                    };
                    let Some(id) = self.oracle.record_at(c, *offset) else {
                        result = Err(format!(
                            "task {task} delivered {topic}:{partition}@{offset}, which is not a committed record"
                        ));
                        break;
                    };
                    // Never a half task: the member holds every partition
                    // of the task whose delivery it commits.
                    if let Some(spec) = self.config.tasks.iter().find(|t| t.name == *task)
                        && let Some(p) = spec
                            .inputs
                            .iter()
                            .find(|p| !self.members[i].assignment.contains(p))
                    {
                        result = Err(format!(
                            "task {task} delivered {topic}:{partition}@{offset} on a member that does not hold its partition {}:{}",
                            p.0, p.1
                        ));
                        break;
                    }
                    if let Err(v) = self.oracle.deliver(actor, id) {
                        result = Err(v.message);
                        break;
                    }
                    delivered.push((task.clone(), (topic.clone(), *partition, *offset)));
                }
                TaskAct::Sent {
                    topic, partition, ..
                } => {
                    let p = self.oracle.emit(actor);
                    pending.push_back((actor, p, topic.clone(), *partition));
                }
                TaskAct::DeadLettered { .. } => {}
            }
        }
        if let Err(message) = result {
            for a in staged {
                self.oracle.rollback(a);
            }
            return Err(self.fail(message));
        }
        let changelog = |t: &str| t.ends_with("-changelog");
        // Which partitions' markers land late (chosen before the records
        // go in: their records wait behind the marker).
        let txn_no = self.next_txn;
        self.next_txn += 1;
        let mut late: BTreeSet<(String, i32)> = BTreeSet::new();
        for key in &touched {
            if self.budget.late_markers > 0 && self.rng.random_bool(0.4) {
                self.budget.late_markers -= 1;
                late.insert(key.clone());
            }
        }
        for r in &txn.records {
            let Some(c) = self.channel(&r.topic, r.partition) else {
                return Err(self.fail(format!("produce to unknown topic {}", r.topic)));
            };
            let mut oracle_id = usize::MAX;
            if self.config.dead_letter_topic.as_deref() == Some(&*r.topic) {
                // Unstamped, and no causal send: the oracle never hears of
                // it, and nothing waits for it.
                if r.header_list().iter().any(|h| h.name() == CLOCK_HEADER) {
                    return Err(self.fail(format!(
                        "a dead letter on {}:{} carries a clock",
                        r.topic, r.partition
                    )));
                }
                self.stats.dead_letters += 1;
                if self.stats.dead_letters > self.dead_letters_allowed {
                    return Err(self.fail(format!(
                        "{} dead letters committed, but only {} records were refused with the dead-letter topic as their handler's choice: a record that was not refused (a transient failure?) went there",
                        self.stats.dead_letters, self.dead_letters_allowed
                    )));
                }
            } else if !changelog(&r.topic) {
                let Some((_, p, t, part)) = pending.pop_front() else {
                    return Err(self.fail(format!(
                        "a record to {}:{} with no task send behind it",
                        r.topic, r.partition
                    )));
                };
                if *t != *r.topic || part != r.partition {
                    return Err(self.fail(format!(
                        "send order mismatch: the task sent to {t}:{part}, the transaction holds {}:{}",
                        r.topic, r.partition
                    )));
                }
                let offset = self.broker.end_offset(c);
                oracle_id = self.oracle.register(p, c, offset);
            }
            let record = self.stored(r, oracle_id)?;
            let offset = if late.contains(&(r.topic.to_string(), r.partition)) {
                self.broker.append_open(c, record, txn_no)
            } else {
                self.broker.append(c, record, true)
            };
            self.last_offsets.push(offset);
        }
        if !pending.is_empty() {
            return Err(self.fail("a task send with no record in the transaction"));
        }
        for (t, p) in &touched {
            if let Some(c) = self.channel(t, *p) {
                if late.contains(&(t.clone(), *p)) {
                    self.stats.late_markers += 1;
                    self.late.push((c, txn_no));
                } else {
                    self.broker.append_marker(c, true);
                }
            }
        }
        for (t, p, o) in &txn.offsets {
            self.group_offsets.insert((t.clone(), *p), *o);
        }
        let tasks: BTreeSet<&String> = delivered.iter().map(|(t, _)| t).collect();
        if tasks.len() > 1 {
            self.stats.multi_task_commits += 1;
        }
        let reconciling = !self.pending.is_empty();
        let restoring = self.members[i].thread.restoring();
        for (task, d) in delivered {
            if restoring {
                self.stats.deliveries_while_restoring += 1;
            }
            self.committed_deliveries.entry(task).or_default().push(d);
            self.stats.deliveries += 1;
            if reconciling {
                self.stats.deliveries_while_reconciling += 1;
            }
        }
        for a in staged {
            self.oracle.commit(a);
        }
        self.stats.commits += 1;
        Ok(())
    }

    /// The record as the broker stores it, from the headers as the host
    /// writes them: the stamp is read back from its wire form, so a stamp
    /// that does not decode fails the world.
    fn stored(&self, r: &OutgoingRecord, oracle_id: usize) -> Result<StoredRecord, AppFailure> {
        let headers = r.header_list();
        let causal = CausalHeaders::decode(headers.iter().map(|h| (h.name(), h.value.as_deref())))
            .map_err(|e| self.fail(format!("a produced record has corrupt causal headers: {e}")))?;
        let clock_version = headers
            .iter()
            .find(|h| h.name() == CLOCK_HEADER)
            .and_then(|h| ClockVersion::of(h.value.as_deref()?))
            .unwrap_or_default();
        Ok(StoredRecord {
            key: r.key.clone(),
            value: r.value.clone(),
            timestamp: r.timestamp,
            headers: headers
                .into_iter()
                .filter(|h| !parsley_protocol::headers::is_causal_header(&h.name))
                .collect(),
            causal,
            oracle_id,
            clock_version,
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CommitFate {
    Commit,
    /// Commits, with a fault armed for the local store writes that follow.
    Store(StoreFault),
    Abort,
    Crash,
    Fault(SimFault),
}

/// The place of a member's thread between its process's death and its
/// successor's start; never driven.
struct Gone;

impl StreamThread for Gone {
    fn assign(&mut self, _: Vec<AssignedPartition>, _: &SimBroker, _: i64) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn before_revoke(&mut self, _: &SimBroker) -> Result<Option<HostTransaction>, String> {
        Ok(None)
    }
    fn revoke(&mut self, _: &[(String, i32)]) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn on_record(&mut self, _: PolledRecord, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn on_position(
        &mut self,
        _: &str,
        _: i32,
        _: i64,
        _: Option<i64>,
        _: &SimBroker,
    ) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn punctuate(&mut self, _: i64, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn poll_transaction(
        &mut self,
        _: i64,
        _: &SimBroker,
    ) -> Result<Option<HostTransaction>, String> {
        Err("the process is gone".into())
    }
    fn flush(&mut self, _: &SimBroker) -> Result<Option<HostTransaction>, String> {
        Err("the process is gone".into())
    }
    fn outcome(&mut self, _: Outcome, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn abort(&mut self, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn take_seeks(&mut self, _: &SimBroker) -> Vec<Seek> {
        Vec::new()
    }
    fn has_open_work(&self) -> bool {
        false
    }
    fn held_heads(&self) -> Vec<(String, i32, i64)> {
        Vec::new()
    }
    fn fault(&mut self, _: SimFault, _: &SimBroker) -> Result<SimDirective, String> {
        Err("the process is gone".into())
    }
}
