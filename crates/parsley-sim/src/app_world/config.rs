//! An application world's definition, budget, counters and failure.

use super::*;

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
pub(super) enum Move {
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
    /// Producers fenced, hung or failed after their host asked the
    /// coordinator to commit: the coordinator had committed, or had not.
    pub lost_after_commit_sent: [u64; 2],
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
    /// Records a thread produced into its open transaction before handing
    /// it over (appended to the log then, their fate decided later).
    pub streamed_records: u64,
    /// Of those, records a zombie produced after the group had moved on.
    pub zombie_streamed_records: u64,
    /// Streamed records that ended aborted.
    pub streamed_aborted: u64,
    /// Commits of a transaction with records in the log before its
    /// hand-over.
    pub streamed_commits: u64,
    /// Open transactions a thread aborted itself (a task's failure, a
    /// lost assignment) after records went out.
    pub streamed_self_aborts: u64,
    /// Open transactions of members gone (crashed, replaced, bounced)
    /// aborted with records in the log.
    pub orphans_aborted: u64,
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
        for (a, b) in self
            .lost_after_commit_sent
            .iter_mut()
            .zip(o.lost_after_commit_sent)
        {
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
        self.streamed_records += o.streamed_records;
        self.zombie_streamed_records += o.zombie_streamed_records;
        self.streamed_aborted += o.streamed_aborted;
        self.streamed_commits += o.streamed_commits;
        self.streamed_self_aborts += o.streamed_self_aborts;
        self.orphans_aborted += o.orphans_aborted;
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
