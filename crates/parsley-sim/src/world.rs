//! [`SimWorld`]: the seeded scheduler.
//!
//! A world is a broker, some nodes, some edge producers and an oracle. Each
//! step the scheduler lists every enabled action (fetch, position advance,
//! tick, truncation sweep, edge-producer operation, retention move, crash
//! idle or mid-step, restart, join) and draws one with a ChaCha8 generator
//! seeded from the world's seed, so a seed reproduces its run on any
//! machine. Budgets bound ticks, crashes, edge operations and retention, so
//! a world eventually has nothing left to do: it has drained. A world that
//! has not drained within its step budget fails.
//!
//! Crashes are drawn at double weight on nodes that hold records, and the
//! last crash of the budget is reserved for a holding node: a crash while
//! records are held is the only way into the hold-queue restore path, and an
//! unweighted draw tends to spend the budget before such a state exists.
//!
//! A crash can land between any two host calls. An idle crash lands between
//! steps. A mid-step crash picks one of the node's enabled steps (a fetch on
//! any fetchable channel, a position advance, a tick, a sweep) and a number
//! of stamping calls after which it cuts the step short. A node that is
//! down can crash again inside its restart, at one of the points of
//! [`StartCrash`]. Each kind is counted in [`WorldStats`], so scenarios can
//! show that each occurred.
//!
//! [`SimWorld::trace_hash`] digests every delivery (node, channel, offset,
//! in order) and the bytes and coordinates of every append, committed or
//! aborted, interleaved with the scheduler's choices: two runs with the same
//! hash did the same things in the same order.

use std::collections::BTreeMap;
use std::fmt;

use parsley_protocol::{Channel, DeliveryProtocol, StateKey, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::broker::SimBroker;
use crate::edge::{EdgeProducer, EdgeSpec};
use crate::node::{HostFault, NodeAction, NodeSpec, SimNode, StartCrash, StepReport, Topics};
use crate::oracle::Oracle;
use crate::trace::Trace;

mod stats;

pub use stats::WorldStats;

/// When a node joins the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Join {
    /// At the start.
    Start,
    /// Once the named node has restarted this many times.
    AfterRestarts(String, u32),
    /// Only when the scenario calls [`SimWorld::join`].
    Manual,
}

/// What the world may spend.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Steps before an undrained world fails.
    pub max_steps: u64,
    /// Crashes (idle or mid-step) to inject.
    pub crashes: u32,
    /// Ticks to emit, over all ticking nodes.
    pub ticks: u32,
    /// Edge-producer operations.
    pub edge_ops: u32,
    /// Retention moves (log-start advances).
    pub retention: u32,
    /// Truncation sweeps.
    pub sweeps: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_steps: 20_000,
            crashes: 0,
            ticks: 0,
            edge_ops: 0,
            retention: 0,
            sweeps: 0,
        }
    }
}

/// A world's definition.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// Topics as (name, partitions).
    pub topics: Vec<(String, i32)>,
    /// Nodes, with when each joins.
    pub nodes: Vec<(NodeSpec, Join)>,
    /// Edge producers.
    pub edges: Vec<EdgeSpec>,
    /// Budgets.
    pub budget: Budget,
    /// The feedback hop budget of edge-produced records.
    pub hops: u32,
    /// A host fault on one node (by name), for the self-test.
    pub fault: Option<(String, HostFault)>,
}

impl WorldConfig {
    /// A world with the given topics and nothing else.
    pub fn new(topics: &[(&str, i32)]) -> WorldConfig {
        WorldConfig {
            topics: topics.iter().map(|&(t, p)| (t.to_owned(), p)).collect(),
            nodes: Vec::new(),
            edges: Vec::new(),
            budget: Budget::default(),
            hops: 0,
            fault: None,
        }
    }

    /// Adds a node that joins at the start.
    pub fn node(mut self, spec: NodeSpec) -> Self {
        self.nodes.push((spec, Join::Start));
        self
    }

    /// Adds a node that joins later.
    pub fn node_joining(mut self, spec: NodeSpec, join: Join) -> Self {
        self.nodes.push((spec, join));
        self
    }

    /// Adds an edge producer.
    pub fn edge(mut self, spec: EdgeSpec) -> Self {
        self.edges.push(spec);
        self
    }
}

/// A world that failed: the seed and step reproduce it.
#[derive(Clone, Debug)]
pub struct WorldFailure {
    /// The world's seed.
    pub seed: u64,
    /// The step at which it failed.
    pub step: u64,
    /// What went wrong.
    pub message: String,
    /// What the world had done by then.
    pub stats: Box<WorldStats>,
}

impl fmt::Display for WorldFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}",
            self.seed, self.step, self.message
        )
    }
}

impl std::error::Error for WorldFailure {}

struct TopicMap(BTreeMap<String, TopicId>);

impl Topics for TopicMap {
    fn id(&self, name: &str) -> TopicId {
        *self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("sim: unknown topic {name:?}"))
    }
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Join(usize),
    Restart(usize),
    /// A restart that crashes inside its start transaction (the point and
    /// the cut are drawn when it runs).
    CrashStart(usize),
    Node(usize, NodeAction),
    Crash(usize),
    /// A crash inside one of the node's enabled steps (the step and the
    /// cut are drawn when it runs).
    CrashMid(usize),
    Edge(usize),
    Retain(Channel, i64),
}

/// A mid-transaction crash cuts the work short after this many stamping
/// calls at most (drawn uniformly below it); most steps stamp fewer, and
/// crash after all their work.
const CRASH_CUT_RANGE: usize = 4;

/// A seeded simulated world.
pub struct SimWorld<P: DeliveryProtocol> {
    seed: u64,
    rng: ChaCha8Rng,
    /// The broker.
    pub broker: SimBroker,
    /// The oracle.
    pub oracle: Oracle,
    nodes: Vec<SimNode<P>>,
    joins: Vec<Join>,
    edges: Vec<EdgeProducer>,
    topics: TopicMap,
    budget: Budget,
    hops: u32,
    stats: WorldStats,
    trace: Trace,
}

impl<P: DeliveryProtocol> SimWorld<P> {
    /// Builds the world and starts the nodes that join at the start.
    pub fn new(config: WorldConfig, seed: u64) -> Result<Self, WorldFailure> {
        let mut broker = SimBroker::new();
        let mut topics = BTreeMap::new();
        for (name, partitions) in &config.topics {
            topics.insert(name.clone(), broker.create_topic(name, *partitions));
        }
        let topics = TopicMap(topics);
        let actor_names: Vec<String> = config
            .nodes
            .iter()
            .map(|(n, _)| n.name.clone())
            .chain(config.edges.iter().map(|e| e.name.clone()))
            .collect();
        let mut oracle = Oracle::new(&actor_names);
        for (name, &id) in &topics.0 {
            for p in 0..broker.partitions(id).unwrap_or(0) {
                oracle.name_channel(Channel::new(id, p), format!("{name}:{p}"));
            }
        }
        let mut nodes = Vec::new();
        let mut joins = Vec::new();
        for (i, (spec, join)) in config.nodes.into_iter().enumerate() {
            let fault = config
                .fault
                .as_ref()
                .filter(|(n, _)| *n == spec.name)
                .map(|(_, f)| *f);
            nodes.push(SimNode::new(spec, i, &topics, fault));
            joins.push(join);
        }
        let base = nodes.len();
        let edges = config
            .edges
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let resolve = |v: &[(String, i32)]| -> Vec<Channel> {
                    v.iter()
                        .map(|(t, p)| Channel::new(topics.id(t), *p))
                        .collect()
                };
                let targets = resolve(&spec.targets);
                let observes = resolve(&spec.observes);
                EdgeProducer::new(spec, base + i, targets, observes)
            })
            .collect();
        let mut world = SimWorld {
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            broker,
            oracle,
            nodes,
            joins,
            edges,
            topics,
            budget: config.budget,
            hops: config.hops,
            stats: WorldStats::default(),
            trace: Trace::new(),
        };
        for i in 0..world.nodes.len() {
            if world.joins[i] == Join::Start {
                world.execute(Action::Join(i))?;
            }
        }
        Ok(world)
    }

    /// The world's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Counts so far.
    pub fn stats(&self) -> WorldStats {
        self.stats
    }

    /// A digest of the run: every delivery (node, channel, offset) in
    /// order, the bytes and coordinates of every append (committed or
    /// aborted, markers included), and the scheduler's choices between
    /// them. Equal for equal runs.
    pub fn trace_hash(&self) -> u64 {
        let mut t = self.trace;
        t.word(self.broker.trace());
        t.word(self.oracle.trace());
        t.value()
    }

    /// The budgets left (scenarios top them up between phases).
    pub fn budget_mut(&mut self) -> &mut Budget {
        &mut self.budget
    }

    /// The id of a topic.
    pub fn topic(&self, name: &str) -> TopicId {
        self.topics.id(name)
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> &SimNode<P> {
        self.nodes
            .iter()
            .find(|n| n.spec.name == name)
            .unwrap_or_else(|| panic!("sim: unknown node {name:?}"))
    }

    fn node_index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.spec.name == name)
            .unwrap_or_else(|| panic!("sim: unknown node {name:?}"))
    }

    fn fail(&self, message: String) -> WorldFailure {
        WorldFailure {
            seed: self.seed,
            step: self.stats.steps,
            message,
            stats: Box::new(self.stats),
        }
    }

    /// Joins a `Manual` node now.
    pub fn join(&mut self, name: &str) -> Result<(), WorldFailure> {
        let i = self.node_index(name);
        self.execute(Action::Join(i))
    }

    /// Runs one step of a node now (for directed constructions).
    pub fn step_node(
        &mut self,
        name: &str,
        action: NodeAction,
    ) -> Result<StepReport, WorldFailure> {
        let i = self.node_index(name);
        let (broker, oracle, topics) = (&mut self.broker, &mut self.oracle, &self.topics);
        let report = self.nodes[i]
            .step(action, None, broker, oracle, topics)
            .map_err(|v| self.fail(v.message))?;
        self.account(&report);
        Ok(report)
    }

    /// Restarts a node now and crashes it inside the start, at `point` and
    /// after at most `cut` stamped sends (for directed constructions;
    /// outside the crash budget). The node is down afterwards.
    pub fn restart_crashing(
        &mut self,
        name: &str,
        point: StartCrash,
        cut: usize,
    ) -> Result<StepReport, WorldFailure> {
        let i = self.node_index(name);
        self.oracle.begin_incarnation(self.nodes[i].actor);
        let (broker, oracle, topics) = (&mut self.broker, &mut self.oracle, &self.topics);
        let report = self.nodes[i]
            .start_crashing(Some((point, cut)), broker, oracle, topics)
            .map_err(|v| self.fail(v.message))?;
        self.account(&report);
        Ok(report)
    }

    /// Runs one operation of an edge producer now (for directed
    /// constructions).
    pub fn edge_op(&mut self, name: &str) {
        let e = self
            .edges
            .iter()
            .position(|e| e.spec.name == name)
            .unwrap_or_else(|| panic!("sim: unknown edge producer {name:?}"));
        let hops = self.hops;
        self.edges[e].op(&mut self.broker, &mut self.oracle, 0, hops);
    }

    /// A channel by topic name and partition.
    pub fn channel(&self, topic: &str, partition: i32) -> Channel {
        Channel::new(self.topic(topic), partition)
    }

    /// Crashes a node now (outside the budget).
    pub fn crash(&mut self, name: &str) {
        let i = self.node_index(name);
        self.nodes[i].crash();
    }

    /// Moves every channel's log start as far as retention may go (every
    /// active subscriber has delivered everything below it).
    pub fn retain_all(&mut self) {
        for c in self.broker.channels() {
            let bound = self.retention_bound(c);
            self.broker.advance_log_start(c, bound);
        }
    }

    /// Moves one channel's log start as far as retention may go.
    pub fn retain(&mut self, topic: &str, partition: i32) {
        let c = Channel::new(self.topic(topic), partition);
        let bound = self.retention_bound(c);
        self.broker.advance_log_start(c, bound);
    }

    /// Runs a truncation sweep on every running node.
    pub fn sweep_all(&mut self) -> Result<(), WorldFailure> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].is_up() {
                self.execute(Action::Node(i, NodeAction::Sweep))?;
            }
        }
        Ok(())
    }

    /// Runs until nothing is left to do, then checks completeness.
    pub fn run(&mut self) -> Result<WorldStats, WorldFailure> {
        loop {
            let actions = self.enabled();
            if actions.is_empty() {
                break;
            }
            if self.stats.steps >= self.budget.max_steps {
                let held: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|n| n.held() > 0)
                    .map(|n| format!("{} holds {}", n.spec.name, n.held()))
                    .collect();
                return Err(self.fail(format!(
                    "did not drain within {} steps ({})",
                    self.budget.max_steps,
                    held.join(", ")
                )));
            }
            let chosen = crate::world::pick_weighted(&mut self.rng, &actions);
            self.stats.steps += 1;
            self.execute(chosen)?;
        }
        self.oracle
            .check_complete(&self.broker)
            .map_err(|v| self.fail(v.message))?;
        Ok(self.stats)
    }

    /// Where retention may move a channel's log start to: not past what any
    /// joined consumer of it has fetched, and not past a record it still
    /// holds (see the crate docs on why holds bound retention).
    fn retention_bound(&self, c: Channel) -> i64 {
        let mut bound = self.broker.end_offset(c);
        for n in &self.nodes {
            if !n.joined() || !n.inputs().contains(&c) {
                continue;
            }
            if let Some(p) = n.position(c) {
                bound = bound.min(p);
            }
            if let Some(held) = held_head_offset(n.store(), c) {
                bound = bound.min(held);
            }
        }
        bound
    }

    /// The steps a running node can take now, with their weights.
    fn node_actions(&self, n: &SimNode<P>) -> Vec<(u32, NodeAction)> {
        let mut out = Vec::new();
        for &c in n.inputs() {
            let pos = n.position(c).unwrap_or(0);
            if self.broker.fetch(c, pos).is_some() {
                out.push((4, NodeAction::Fetch(c)));
            }
            if n.fault() != Some(HostFault::WithholdPositionAdvance)
                && self.broker.skip_target(c, pos).is_some()
            {
                out.push((2, NodeAction::Advance(c)));
            }
        }
        if n.spec.tick.is_some() && self.budget.ticks > 0 {
            out.push((1, NodeAction::Tick));
        }
        if self.budget.sweeps > 0 {
            out.push((1, NodeAction::Sweep));
        }
        out
    }

    fn enabled(&mut self) -> Vec<(u32, Action)> {
        let mut out = Vec::new();
        let crash_budget = self.budget.crashes;
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.joined() {
                if let Join::AfterRestarts(other, count) = &self.joins[i]
                    && self
                        .nodes
                        .iter()
                        .any(|o| o.spec.name == *other && o.restarts() >= *count)
                {
                    out.push((3, Action::Join(i)));
                }
                continue;
            }
            if !n.is_up() {
                out.push((4, Action::Restart(i)));
                // A down node holds nothing, so this never takes the crash
                // reserved for a holding node.
                if crash_budget > 1 {
                    out.push((1, Action::CrashStart(i)));
                }
                continue;
            }
            let steps = self.node_actions(n);
            let can_step = !steps.is_empty();
            out.extend(steps.into_iter().map(|(w, a)| (w, Action::Node(i, a))));
            let holding = n.held() > 0;
            // The last crash of the budget is for a holding node.
            if crash_budget > 1 || (crash_budget == 1 && holding) {
                let w = if holding { 2 } else { 1 };
                out.push((w, Action::Crash(i)));
                if can_step {
                    out.push((w, Action::CrashMid(i)));
                }
            }
        }
        if self.budget.edge_ops > 0 {
            for e in 0..self.edges.len() {
                out.push((3, Action::Edge(e)));
            }
        }
        if self.budget.retention > 0 {
            for c in self.broker.channels() {
                let bound = self.retention_bound(c);
                if bound > self.broker.log_start(c) {
                    out.push((1, Action::Retain(c, bound)));
                }
            }
        }
        out
    }

    // Longer than 100 lines on purpose: one arm per action the world
    // can take, each a few lines; the list of actions is the point.
    fn execute(&mut self, action: Action) -> Result<(), WorldFailure> {
        let report: StepReport = match action {
            Action::Join(i) | Action::Restart(i) | Action::CrashStart(i) => {
                let restart = !matches!(action, Action::Join(_));
                let crash = match action {
                    Action::CrashStart(_) => {
                        self.count_crash(i);
                        self.stats.mid_step_crashes += 1;
                        let point = match self.rng.random_range(0..3) {
                            0 => {
                                self.stats.crashes_after_init += 1;
                                StartCrash::AfterInit
                            }
                            1 => {
                                self.stats.crashes_after_init_releases += 1;
                                StartCrash::AfterInitReleases
                            }
                            _ => {
                                self.stats.crashes_after_start_positions += 1;
                                StartCrash::AfterStartPositions
                            }
                        };
                        Some((point, self.rng.random_range(0..CRASH_CUT_RANGE)))
                    }
                    _ => None,
                };
                if restart {
                    self.stats.restarts += 1;
                }
                let sinks_before = self.nodes[i].sinks().clone();
                self.oracle.begin_incarnation(self.nodes[i].actor);
                let (broker, oracle, topics) = (&mut self.broker, &mut self.oracle, &self.topics);
                let report = self.nodes[i]
                    .start_crashing(crash, broker, oracle, topics)
                    .map_err(|v| self.fail(v.message))?;
                if restart && !sinks_before.is_subset(self.nodes[i].sinks()) {
                    self.stats.sink_drops += 1;
                }
                report
            }
            Action::Node(i, a) => {
                match a {
                    NodeAction::Advance(_) => self.stats.position_advances += 1,
                    NodeAction::Tick => {
                        self.budget.ticks -= 1;
                        self.stats.ticks += 1;
                    }
                    NodeAction::Sweep => {
                        self.budget.sweeps = self.budget.sweeps.saturating_sub(1);
                        self.stats.sweeps += 1;
                    }
                    NodeAction::Fetch(_) => {}
                }
                let (broker, oracle, topics) = (&mut self.broker, &mut self.oracle, &self.topics);
                self.nodes[i]
                    .step(a, None, broker, oracle, topics)
                    .map_err(|v| self.fail(v.message))?
            }
            Action::Crash(i) => {
                self.count_crash(i);
                self.nodes[i].crash();
                StepReport::default()
            }
            Action::CrashMid(i) => {
                self.count_crash(i);
                let steps = self.node_actions(&self.nodes[i]);
                if steps.is_empty() {
                    // Not reachable from `enabled`, which offers this only
                    // with a step to crash in; crash idle rather than panic.
                    self.nodes[i].crash();
                    self.finish_action(action, &StepReport::default());
                    return Ok(());
                }
                self.stats.mid_step_crashes += 1;
                let first_fetch = steps.iter().find_map(|(_, a)| match a {
                    NodeAction::Fetch(c) => Some(*c),
                    _ => None,
                });
                let a = steps[self.rng.random_range(0..steps.len())].1;
                match a {
                    NodeAction::Fetch(c) => {
                        self.stats.crashes_in_fetch += 1;
                        if Some(c) != first_fetch {
                            self.stats.crashes_in_fetch_not_first += 1;
                        }
                    }
                    NodeAction::Advance(_) => self.stats.crashes_in_advance += 1,
                    NodeAction::Tick => self.stats.crashes_in_tick += 1,
                    NodeAction::Sweep => self.stats.crashes_in_sweep += 1,
                }
                let cut = self.rng.random_range(0..CRASH_CUT_RANGE);
                let (broker, oracle, topics) = (&mut self.broker, &mut self.oracle, &self.topics);
                self.nodes[i]
                    .step(a, Some(cut), broker, oracle, topics)
                    .map_err(|v| self.fail(v.message))?
            }
            Action::Edge(e) => {
                self.budget.edge_ops -= 1;
                self.stats.edge_ops += 1;
                let key = self.rng.random_range(0..1_000u64);
                let (broker, oracle) = (&mut self.broker, &mut self.oracle);
                self.edges[e].op(broker, oracle, key, self.hops);
                StepReport::default()
            }
            Action::Retain(c, bound) => {
                self.budget.retention -= 1;
                self.stats.retention_moves += 1;
                let start = self.broker.log_start(c);
                let to = self.rng.random_range(start + 1..=bound);
                self.broker.advance_log_start(c, to);
                StepReport::default()
            }
        };
        self.finish_action(action, &report);
        Ok(())
    }

    /// Counts an executed action's report and mixes the action into the
    /// trace.
    fn finish_action(&mut self, action: Action, report: &StepReport) {
        self.account(report);
        // The scheduler's choice, then where the delivery and append digests
        // stand after it: this ties the two streams' interleaving together.
        let kind = match action {
            Action::Join(i) => i as u64,
            Action::Restart(i) => 100 + i as u64,
            Action::Node(i, _) => 200 + i as u64,
            Action::Crash(i) => 300 + i as u64,
            Action::CrashMid(i) => 400 + i as u64,
            Action::Edge(e) => 500 + e as u64,
            Action::Retain(..) => 600,
            Action::CrashStart(i) => 700 + i as u64,
        };
        self.trace.word(kind);
        self.trace.word(self.broker.trace());
        self.trace.word(self.oracle.trace());
    }

    /// Adds one step's report to the world's counters.
    fn account(&mut self, report: &StepReport) {
        self.stats.deliveries += report.delivered as u64;
        self.stats.released_from_hold += report.released_from_hold as u64;
        self.stats.sends += report.sent as u64;
        self.stats.truncated_entries += report.truncated as u64;
        self.stats.max_held = self.stats.max_held.max(report.held_after as u64);
        self.stats.restored_held += report.restored_held as u64;
        self.stats.replays_skipped += report.replays_skipped as u64;
        self.stats.past_skipped += report.past_skipped as u64;
        self.stats.joined_inputs += report.joined_inputs as u64;
        self.stats.resets += report.resets as u64;
        self.stats.reset_skip_marks += report.reset_skip_marks as u64;
        self.stats.seeded_inputs += report.seeded_inputs as u64;
        self.stats.left_inputs += report.left_inputs as u64;
        self.stats.refused_shrinks += report.refused_shrinks as u64;
        self.stats.own_past_claims_delivered += report.own_past_claims_delivered as u64;
        self.stats.crashes_cutting_sends += u64::from(report.cut_sends);
        self.stats.adjacent_fetches += u64::from(report.adjacent_fetch);
        self.stats.adjacent_tagged_fetches += u64::from(report.adjacent_tagged_fetch);
        self.stats.steps_with_adjacent_sends += u64::from(report.adjacent_sends > 0);
        self.stats.multi_sender_holds += report.multi_sender_holds as u64;
        self.stats.holds_on_prior_incarnation += u64::from(report.held_on_prior_incarnation);
    }

    fn count_crash(&mut self, i: usize) {
        self.budget.crashes -= 1;
        self.stats.crashes += 1;
        if self.nodes[i].held() > 0 {
            self.stats.crashes_while_holding += 1;
        }
    }

    /// A node's committed consumer position on a channel (for tests).
    pub fn position(&self, node: &str, topic: &str, partition: i32) -> Option<i64> {
        self.node(node)
            .position(Channel::new(self.topic(topic), partition))
    }
}

/// Draws one action, each with probability proportional to its weight.
/// `actions` must not be empty.
pub(crate) fn pick_weighted<A: Copy>(rng: &mut ChaCha8Rng, actions: &[(u32, A)]) -> A {
    let total: u32 = actions.iter().map(|(w, _)| *w).sum();
    let mut pick = rng.random_range(0..total);
    let mut chosen = actions[0].1;
    for (w, a) in actions {
        if pick < *w {
            chosen = *a;
            break;
        }
        pick -= w;
    }
    chosen
}

/// The offset of the first held record on a channel in a committed protocol
/// store, if the queue is not empty.
fn held_head_offset(store: &parsley_protocol::MemStore, c: Channel) -> Option<i64> {
    use parsley_protocol::StoreRead;
    let meta = store.get_state(StateKey::QueueMeta(c))?;
    let head = i64::from_be_bytes(meta.get(0..8)?.try_into().ok()?);
    let tail = i64::from_be_bytes(meta.get(8..16)?.try_into().ok()?);
    if head >= tail {
        return None;
    }
    let entry = match store.get_state(StateKey::QueueEntry(c, head)) {
        Some(entry) => entry.to_vec(),
        None => {
            // The page that holds the head.
            let mut found = None;
            store.for_each_state(&mut |key, value| {
                if let Ok(StateKey::QueuePage(pc, first)) = key
                    && pc == c
                    && first <= head
                    && let Ok(page) = parsley_protocol::store::PageEntries::new(value)
                    && let Some(entry) = page
                        .clone()
                        .nth(usize::try_from(head - first).unwrap_or(usize::MAX))
                {
                    found = Some(entry.to_vec());
                }
            });
            found?
        }
    };
    Some(i64::from_be_bytes(entry.get(0..8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsley_protocol::store::{PageBuilder, StateKey, WriteBatch, encode_envelope};
    use parsley_protocol::{CausalHeaders, InboundRecord, MemStore, VectorClock};

    fn held(c: Channel, offset: i64) -> InboundRecord {
        InboundRecord {
            channel: c,
            offset,
            timestamp: 0,
            key: None,
            value: None,
            headers: Vec::new(),
            causal: CausalHeaders {
                clock: VectorClock::new(),
                sender: None,
            },
        }
    }

    /// Retention stops at the held head whether it is stored in a page
    /// (found inside it, past released records) or under its own key.
    #[test]
    fn the_held_head_is_found_in_a_page_or_an_entry() {
        let c = Channel::new(TopicId::from_u128(5), 0);
        let mut batch = WriteBatch::new();
        let mut page = PageBuilder::new();
        for offset in [10, 11, 12] {
            page.push(&held(c, offset));
        }
        batch.put(StateKey::QueuePage(c, 4), page.finish());
        batch.put_pair(StateKey::QueueMeta(c), 5, 7);
        let mut store = MemStore::new();
        store.apply(&batch);
        assert_eq!(held_head_offset(&store, c), Some(11));
        let mut batch = WriteBatch::new();
        batch.delete(StateKey::QueuePage(c, 4));
        batch.put(StateKey::QueueEntry(c, 5), encode_envelope(&held(c, 20)));
        store.apply(&batch);
        assert_eq!(held_head_offset(&store, c), Some(20));
        let mut batch = WriteBatch::new();
        batch.put_pair(StateKey::QueueMeta(c), 7, 7);
        store.apply(&batch);
        assert_eq!(held_head_offset(&store, c), None);
    }
}
