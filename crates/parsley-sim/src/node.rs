//! [`SimNode`]: the reference host.
//!
//! `SimNode` drives a [`DeliveryProtocol`] exactly as a production host must,
//! one duty at a time (the H1-H6 of the conformance kit):
//!
//! * **H1** [`step`](SimNode::step) with [`NodeAction::Fetch`] hands records
//!   to `on_record` per channel in offset order, starting from the committed
//!   consumer position.
//! * **H2** [`NodeAction::Advance`] reports the consumer position moving past
//!   offsets that never arrive as records (markers, aborted records); the
//!   world offers it whenever the log continues past the position with
//!   nothing fetchable before it.
//! * **H3** every step is one transaction: store writes and consumer
//!   positions are staged and committed together with the step's appended
//!   records; a crash mid-step appends the records as aborted (with abort
//!   markers), discards the staged state, and takes the node down. A crash
//!   can land between any two host calls: inside any kind of step, after
//!   any number of the step's stamped sends, and inside a start (see
//!   [`StartCrash`]).
//! * **H4** every emission is partitioned first, then stamped with
//!   `prepare_send` for that concrete channel, and exactly that record is
//!   appended; every offset claim of the stamp is checked to name an offset
//!   that really exists, or existed before its topic was deleted
//!   ([`check_offset_claims`]).
//! * **H5** [`start`](SimNode::start) restarts from committed state through
//!   the protocol's full init path, seeks channels that joined the scope to
//!   the protocol's resume positions (unless [`NodeSpec::seek_resume`] is
//!   off, which re-reads the prefix so the replay guard must drop it), and
//!   reports each channel's starting position (the position watermark is
//!   not persisted; the host re-reports it). A scope change the protocol
//!   refuses because a departing input still holds records is retried at
//!   the next restart, with the input redeclared meanwhile.
//! * **H6** positions below the log start are moved up to it.
//!
//! Nothing hands a send's offset back to the node that made it.
//!
//! [`HostFault`] switches one duty off, for the kit's self-test.

use std::collections::{BTreeMap, BTreeSet};

use parsley_protocol::reset::{ResetPoint, reset_writes};
use parsley_protocol::{
    CausalHeaders, Channel, Delivery, DeliveryProtocol, InboundRecord, MemStore, NodeConfig,
    NodeStats, ProtocolError, SenderId, StateKey, StoreRead, TopicId, VectorClock, WriteBatch,
};

use crate::behavior::{Behavior, Output, Payload, Route};

use crate::broker::{SimBroker, StoredRecord};
use crate::oracle::{ActorId, Oracle, PendingSend, Violation};

/// A host duty switched off, so the kit can prove it notices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFault {
    /// H3 broken: a crash mid-step still commits the node's store writes and
    /// consumer positions, while its sends abort.
    StepAtomicity,
    /// H2 broken: the consumer position is never reported.
    WithholdPositionAdvance,
    /// H2 broken the other way: the position is reported before the records
    /// below it have been handed over (the buffered-batch hazard).
    EarlyPositionReport,
    /// An operator reset that deletes the node's state outright, as a
    /// Kafka Streams reset deletes its changelogs: send sequences restart
    /// at 1 and the delivered past is no longer claimed.
    ResetDeletesState,
    /// An operator reset that leaves no skip marks for the records below a
    /// reset position, so sequence claims on them are never met.
    ResetWithoutSkipMarks,
    /// An operator reset that drops the node's delivered past instead of
    /// carrying it: stamps after the reset no longer claim the causes of
    /// what the node sent before it.
    ResetForgetsPast,
}

/// An operator reset (`parsley reset`) applied while the node is down,
/// before its n-th restart: its inputs are read again from a position and
/// its state is rewritten by [`parsley_protocol::reset::reset_writes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset {
    /// Applies before this restart (1 = the first restart).
    pub at_restart: u32,
    /// Where each input is read again from.
    pub to: ResetTo,
}

/// Where a reset positions a node's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetTo {
    /// The log start.
    Earliest,
    /// Half way between the log start and the last stable offset: the
    /// records below are never delivered again.
    Middle,
}

/// Where a node's consumer starts on a channel it has no committed
/// position for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPolicy {
    /// The log start (everything retention kept).
    Earliest,
    /// The log end (a late joiner that skips history).
    Latest,
}

/// A node's ticks: a channel it both consumes and sinks to, and what a
/// delivered tick emits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickSpec {
    /// The tick topic's name (the node must consume and sink it).
    pub topic: String,
    /// The node's own partition of it.
    pub partition: i32,
    /// What each delivered tick emits.
    pub outputs: Vec<Output>,
}

/// A change of scope applied when the node restarts for the n-th time (a
/// node may have several, at different restarts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rescope {
    /// Applies at this restart (1 = the first restart).
    pub at_restart: u32,
    /// The new inputs, as (topic, partition).
    pub inputs: Vec<(String, i32)>,
    /// The new sinks.
    pub sinks: Vec<String>,
    /// The new behaviour, if it changes (it must not emit to a dropped
    /// sink).
    pub behavior: Option<Behavior>,
}

/// Everything that defines a simulated node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// A readable name (also derives its sender id).
    pub name: String,
    /// Consumed channels, as (topic, partition).
    pub inputs: Vec<(String, i32)>,
    /// Sink topics.
    pub sinks: Vec<String>,
    /// What it emits per delivery.
    pub behavior: Behavior,
    /// Its ticks, if it ticks.
    pub tick: Option<TickSpec>,
    /// Where its consumer starts on channels without a committed position.
    pub start: StartPolicy,
    /// False for a node that joins only when the scenario says so.
    pub joins_at_start: bool,
    /// Scope changes at later restarts.
    pub rescopes: Vec<Rescope>,
    /// Operator resets before later restarts.
    pub resets: Vec<Reset>,
    /// Whether the host seeks a joining input to the protocol's resume
    /// position (the host contract). A host that does not re-reads the
    /// prefix from its own start position, and the protocol's replay guard
    /// must drop it: that is how the kit exercises the guard.
    pub seek_resume: bool,
}

impl NodeSpec {
    /// A node that joins at the start, reads from the earliest offset, and
    /// neither ticks nor rescopes.
    pub fn new(name: &str, inputs: &[(&str, i32)], sinks: &[&str], behavior: Behavior) -> NodeSpec {
        NodeSpec {
            name: name.to_owned(),
            inputs: inputs.iter().map(|&(t, p)| (t.to_owned(), p)).collect(),
            sinks: sinks.iter().map(|&t| t.to_owned()).collect(),
            behavior,
            tick: None,
            start: StartPolicy::Earliest,
            joins_at_start: true,
            rescopes: Vec::new(),
            resets: Vec::new(),
            seek_resume: true,
        }
    }
}

/// Where inside a (re)start a crash lands. The start is a transaction like
/// any step: whichever point it lands at, nothing of it commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartCrash {
    /// Right after the protocol's init returned, before anything it
    /// released reached user logic.
    AfterInit,
    /// After what init itself released (restored records a rescope made
    /// deliverable) went through user logic and its sends were stamped, but
    /// before the starting positions were reported.
    AfterInitReleases,
    /// After the starting positions were reported and everything released
    /// went through user logic, just before the commit.
    AfterStartPositions,
}

/// One transactional step of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// Fetch the next record on a channel.
    Fetch(Channel),
    /// Report the consumer position moving past non-records on a channel.
    Advance(Channel),
    /// Emit a tick.
    Tick,
    /// Run the truncation sweep.
    Sweep,
}

/// What one step did, for the world's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Records delivered (and checked by the oracle).
    pub delivered: usize,
    /// Of those, how many had waited in a hold queue.
    pub released_from_hold: usize,
    /// Records appended (committed or, on a crash, aborted).
    pub sent: usize,
    /// Stamp-side entries a sweep removed.
    pub truncated: usize,
    /// Held records left at the node after the step.
    pub held_after: usize,
    /// Held records a (re)start restored from the committed store.
    pub restored_held: usize,
    /// Replays the protocol dropped at or below a frontier.
    pub replays_skipped: usize,
    /// Records on joined inputs the protocol skipped as already past.
    pub past_skipped: usize,
    /// Inputs that joined by a redeploy at this (re)start.
    pub joined_inputs: usize,
    /// Operator resets applied before this (re)start.
    pub resets: usize,
    /// Skip marks those resets wrote for records below a reset position.
    pub reset_skip_marks: usize,
    /// Of those, inputs the protocol asked to resume past a seed.
    pub seeded_inputs: usize,
    /// Inputs that left the scope at this (re)start.
    pub left_inputs: usize,
    /// Redeploys the protocol refused because a departing input still held
    /// records (retried at the next restart).
    pub refused_shrinks: usize,
    /// Deliveries of records that claim, by sequence, one of the node's
    /// own sends made before that channel joined its inputs.
    pub own_past_claims_delivered: usize,
    /// The step crashed before a send its user logic still had to make (the
    /// crash landed between two stamping calls, or before the first).
    pub cut_sends: bool,
    /// The step fetched a record right after (at the next offset from) the
    /// record this node fetched before on that channel: two business records
    /// with no marker between them.
    pub adjacent_fetch: bool,
    /// Like `adjacent_fetch`, with both records carrying a sender tag, so
    /// both came from node steps.
    pub adjacent_tagged_fetch: bool,
    /// Partitions this (committed) step appended two or more records to,
    /// which therefore sit at adjacent offsets.
    pub adjacent_sends: usize,
    /// Released held records that sat on, or carried a sequence claim on, a
    /// channel written by two or more tagged senders.
    pub multi_sender_holds: usize,
    /// The fetched record was held, and in ground truth it waited only for
    /// its own sender's sends from an earlier incarnation (see
    /// [`Oracle::waits_only_on_prior_incarnation`]).
    pub held_on_prior_incarnation: bool,
}

/// What the protocol calls of one step produced.
struct Work {
    deliveries: Vec<Delivery>,
    sends: Vec<Send>,
    truncated: usize,
    /// The fetched record's coordinate, for a fetch that fetched one.
    fetched: Option<(Channel, i64)>,
    adjacent_fetch: bool,
    adjacent_tagged_fetch: bool,
}

/// H4's check of a stamp's offset claims: each must name an offset below
/// the channel's end offset, or, for a channel whose topic has been
/// deleted, below the end offset it had when it was deleted. A claim on a
/// deleted topic is harmless (no receiver can resolve or wait on it, and a
/// truncation sweep drops it), but it must still name history that existed.
/// Returns a description of the first claim that does not.
pub fn check_offset_claims(broker: &SimBroker, clock: &VectorClock) -> Result<(), String> {
    for claim in clock.offsets() {
        let end = broker.claimable_end(claim.channel);
        if claim.offset >= end {
            let state = if broker.partitions(claim.channel.topic).is_some() {
                "that channel ends"
            } else {
                "that channel (deleted or unknown) ended"
            };
            return Err(format!(
                "stamp claims {}@{} but {state} at {end}",
                claim.channel, claim.offset
            ));
        }
    }
    Ok(())
}

/// A failure of the world: a violation, a protocol refusal, or a host
/// assertion.
pub type StepResult = Result<StepReport, Violation>;

fn violation(message: String) -> Violation {
    Violation { message }
}

/// The reference host for one node.
pub struct SimNode<P: DeliveryProtocol> {
    /// The node's definition.
    pub spec: NodeSpec,
    /// The node's oracle actor.
    pub actor: ActorId,
    sender: SenderId,
    protocol: Option<P>,
    joined: bool,
    store: MemStore,
    positions: BTreeMap<Channel, i64>,
    inputs: BTreeSet<Channel>,
    sinks: BTreeSet<TopicId>,
    restarts: u32,
    round_robin: u64,
    fault: Option<HostFault>,
    stats_seen: NodeStats,
    rescopes_applied: usize,
    resets_applied: usize,
    /// Per input that joined by a redeploy: the node's own send sequence
    /// there when it joined (for the kit's counters only).
    joined_own_seq: BTreeMap<Channel, i64>,
    /// Per channel, the last offset this node fetched there (in any
    /// incarnation) and whether that record carried a sender tag.
    last_fetched: BTreeMap<Channel, (i64, bool)>,
}

/// Resolves topic names for a node.
pub trait Topics {
    /// The id of a topic by name.
    fn id(&self, name: &str) -> TopicId;
}

impl<P: DeliveryProtocol> SimNode<P> {
    /// A node that has not joined yet.
    pub fn new(
        spec: NodeSpec,
        actor: ActorId,
        topics: &dyn Topics,
        fault: Option<HostFault>,
    ) -> Self {
        let inputs = spec
            .inputs
            .iter()
            .map(|(t, p)| Channel::new(topics.id(t), *p))
            .collect();
        let sinks = spec.sinks.iter().map(|t| topics.id(t)).collect();
        let sender = SenderId::from_u128(
            0x5157_0000_0000_0000_0000_0000_0000_0000 | ((actor as u128 + 1) * 0x1_0000_0001),
        );
        SimNode {
            spec,
            actor,
            sender,
            protocol: None,
            joined: false,
            store: MemStore::new(),
            positions: BTreeMap::new(),
            inputs,
            sinks,
            restarts: 0,
            round_robin: 0,
            fault,
            stats_seen: NodeStats::default(),
            rescopes_applied: 0,
            resets_applied: 0,
            joined_own_seq: BTreeMap::new(),
            last_fetched: BTreeMap::new(),
        }
    }

    /// Operator resets declared but not applied yet.
    pub fn resets_pending(&self) -> usize {
        self.spec.resets.len().saturating_sub(self.resets_applied)
    }

    /// Whether the node has joined the world.
    pub fn joined(&self) -> bool {
        self.joined
    }

    /// Whether the node is running.
    pub fn is_up(&self) -> bool {
        self.protocol.is_some()
    }

    /// Records held right now (0 when down).
    pub fn held(&self) -> usize {
        self.protocol.as_ref().map_or(0, P::held_count)
    }

    /// Times the node restarted.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Scope changes not applied yet (their restart has not come, or the
    /// protocol refused them so far).
    pub fn rescopes_pending(&self) -> usize {
        self.spec.rescopes.len() - self.rescopes_applied
    }

    /// The committed consumer position on a channel.
    pub fn position(&self, c: Channel) -> Option<i64> {
        self.positions.get(&c).copied()
    }

    /// The channels currently consumed.
    pub fn inputs(&self) -> &BTreeSet<Channel> {
        &self.inputs
    }

    /// The sink topics currently declared.
    pub fn sinks(&self) -> &BTreeSet<TopicId> {
        &self.sinks
    }

    /// The host fault this node runs with, if any.
    pub fn fault(&self) -> Option<HostFault> {
        self.fault
    }

    /// The protocol, while the node is up.
    pub fn protocol(&self) -> Option<&P> {
        self.protocol.as_ref()
    }

    /// The committed protocol store.
    pub fn store(&self) -> &MemStore {
        &self.store
    }

    /// Takes the node down: in-memory state is lost, committed state stays.
    pub fn crash(&mut self) {
        self.protocol = None;
    }

    /// Starts (first join or restart) from committed state through the full
    /// init path; processes whatever init releases as the first step.
    pub fn start(
        &mut self,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        self.start_crashing(None, broker, oracle, topics)
    }

    /// [`start`](Self::start), crashing at the given point when `crash` is
    /// set, after at most the given number of stamped sends (see
    /// [`step`](Self::step)). The node ends up down, with nothing of the
    /// start committed.
    pub fn start_crashing(
        &mut self,
        crash: Option<(StartCrash, usize)>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let first_start = !self.joined;
        if self.joined {
            self.restarts += 1;
        }
        self.joined = true;
        let (resets, reset_skip_marks) = self.apply_reset(broker, oracle)?;
        let old_inputs = self.inputs.clone();
        let old_sinks = self.sinks.clone();
        let old_behavior = self.spec.behavior.clone();
        // The next pending scope change, once its restart has come.
        let pending = self
            .spec
            .rescopes
            .get(self.rescopes_applied)
            .filter(|r| r.at_restart <= self.restarts)
            .cloned();
        if let Some(r) = &pending {
            self.inputs = r
                .inputs
                .iter()
                .map(|(t, p)| Channel::new(topics.id(t), *p))
                .collect();
            self.sinks = r.sinks.iter().map(|t| topics.id(t)).collect();
            if let Some(b) = &r.behavior {
                self.spec.behavior = b.clone();
            }
        }
        let config = |inputs: &BTreeSet<Channel>, sinks: &BTreeSet<TopicId>| NodeConfig {
            sender: self.sender,
            inputs: inputs.clone(),
            sinks: sinks.clone(),
        };
        let mut refused_shrink = 0;
        let init = match P::init(config(&self.inputs, &self.sinks), &self.store, broker) {
            Ok(init) => {
                if pending.is_some() {
                    self.rescopes_applied += 1;
                }
                init
            }
            // The protocol refuses to drop an input that still holds
            // records. An operator redeclares the input and tries the
            // redeploy again later: so does the kit, at the next restart.
            Err(ProtocolError::HeldRecordsOnDepartingInput { .. }) if pending.is_some() => {
                refused_shrink = 1;
                self.inputs = old_inputs.clone();
                self.sinks = old_sinks.clone();
                self.spec.behavior = old_behavior;
                P::init(config(&self.inputs, &self.sinks), &self.store, broker)
                    .map_err(|e| violation(format!("node {}: init refused: {e}", self.spec.name)))?
            }
            Err(e) => {
                return Err(violation(format!(
                    "node {}: init refused: {e}",
                    self.spec.name
                )));
            }
        };
        let mut left_inputs = 0;
        for c in old_inputs.difference(&self.inputs) {
            oracle.stop_consuming(self.actor, *c);
            self.positions.remove(c);
            left_inputs += 1;
        }
        let resume = init.node.resume_positions();
        // The oracle's claim envelope takes in the sink end offsets this
        // start's own outputs (and former sinks' folding) claim.
        for &topic in self.sinks.union(&old_sinks) {
            for p in 0..broker.partitions(topic).unwrap_or(0) {
                let c = Channel::new(topic, p);
                oracle.own_output(self.actor, c, broker.end_offset(c));
            }
        }
        let mut joined_inputs = 0;
        let mut seeded_inputs = 0;
        for &c in &self.inputs {
            let start = broker.log_start(c);
            // Where the host's own policy starts: the committed position,
            // else the start policy. This, not the protocol's answer, is the
            // oracle's baseline.
            let own = match self.positions.get(&c) {
                Some(&p) => p,
                None => match self.spec.start {
                    StartPolicy::Earliest => start,
                    StartPolicy::Latest => broker.end_offset(c),
                },
            };
            // H5: a joining input resumes where the protocol says.
            let pos = match resume.get(&c) {
                Some(&r) if self.spec.seek_resume => r,
                _ => own,
            };
            // H6: never start below the log start.
            let (pos, own) = (pos.max(start), own.max(start));
            self.positions.insert(c, pos);
            if !first_start && !old_inputs.contains(&c) {
                joined_inputs += 1;
                if resume.contains_key(&c) {
                    seeded_inputs += 1;
                }
                oracle.consume_joining(self.actor, c, own);
                // The node's own committed sends to the joining channel (it
                // was a sink): records claiming them are what used to wedge.
                match self.store.get_state(StateKey::SendSeq(c)) {
                    Some(v) => {
                        let seq = v.try_into().map(i64::from_be_bytes).map_err(|_| {
                            violation(format!("node {}: corrupt sq/ value", self.spec.name))
                        })?;
                        self.joined_own_seq.insert(c, seq);
                    }
                    None => {
                        self.joined_own_seq.remove(&c);
                    }
                }
            } else {
                oracle.consume(self.actor, c, pos);
            }
        }
        let restored_held = init.report.restored_held;
        let mut node = init.node;
        let mut deliveries = init.deliveries;
        if let Some((point, cut)) = crash
            && point != StartCrash::AfterStartPositions
        {
            if point == StartCrash::AfterInit {
                deliveries.clear();
            }
            let mut report = self.start_transaction(
                node,
                deliveries,
                Some(cut),
                restored_held,
                broker,
                oracle,
                topics,
            )?;
            report.joined_inputs = joined_inputs;
            report.resets = resets;
            report.reset_skip_marks = reset_skip_marks;
            report.seeded_inputs = seeded_inputs;
            report.left_inputs = left_inputs;
            report.refused_shrinks = refused_shrink;
            return Ok(report);
        }
        // H2 at start: the consumer's starting position is a position like
        // any other (a real consumer reports it at its first poll). Every
        // record below it went through `on_record` in an earlier
        // incarnation. Without this, a trailing marker skipped before a
        // crash could never be covered again.
        for (&c, &pos) in &self.positions {
            if self.fault == Some(HostFault::WithholdPositionAdvance) {
                break;
            }
            match node.position_advance(c, pos) {
                Ok(d) => deliveries.extend(d),
                Err(e) => {
                    return Err(violation(format!(
                        "node {}: protocol refused the starting position: {e}",
                        self.spec.name
                    )));
                }
            }
        }
        let cut = crash.map(|(_, cut)| cut);
        let mut report =
            self.start_transaction(node, deliveries, cut, restored_held, broker, oracle, topics)?;
        report.joined_inputs = joined_inputs;
        report.resets = resets;
        report.reset_skip_marks = reset_skip_marks;
        report.seeded_inputs = seeded_inputs;
        report.left_inputs = left_inputs;
        report.refused_shrinks = refused_shrink;
        Ok(report)
    }

    /// The operator reset due before this restart, if one is: the node's
    /// store is rewritten as `parsley reset` rewrites a task's state
    /// changelog, its inputs are positioned where the reset says, and the
    /// oracle forgets what the node delivered. Like the operator's tool, it
    /// runs while the node is down and is committed whatever the start
    /// then does. Returns the resets applied and the skip marks written.
    fn apply_reset(
        &mut self,
        broker: &SimBroker,
        oracle: &mut Oracle,
    ) -> Result<(usize, usize), Violation> {
        let Some(reset) = self
            .spec
            .resets
            .get(self.resets_applied)
            .filter(|r| r.at_restart <= self.restarts)
            .copied()
        else {
            return Ok((0, 0));
        };
        self.resets_applied += 1;
        let mut points = BTreeMap::new();
        for &c in &self.inputs {
            let start = broker.log_start(c);
            // Never above the last stable offset: a record below the
            // position must be decided (committed or aborted) when the
            // scan reads it.
            let position = match reset.to {
                ResetTo::Earliest => start,
                ResetTo::Middle => start + (broker.last_stable(c) - start).max(0) / 2,
            };
            let records = broker
                .committed_from_start(c)
                .into_iter()
                .map(|(offset, r)| (offset, r.causal.sender));
            let mut point = ResetPoint::scan(position, records);
            if self.fault == Some(HostFault::ResetWithoutSkipMarks) {
                point.below.clear();
            }
            points.insert(c, point);
        }
        let batch = if self.fault == Some(HostFault::ResetDeletesState) {
            let mut batch = WriteBatch::new();
            self.store.for_each_state(&mut |k, _| {
                if let Ok(k) = k {
                    batch.delete(k);
                }
            });
            batch
        } else {
            let mut batch = reset_writes(&self.store, &points)
                .map_err(|e| violation(format!("node {}: reset refused: {e}", self.spec.name)))?;
            if self.fault == Some(HostFault::ResetForgetsPast) {
                match self.store.get_state(StateKey::CarriedAncestry) {
                    Some(before) => batch.put(StateKey::CarriedAncestry, before.to_vec()),
                    None => batch.delete(StateKey::CarriedAncestry),
                }
            }
            batch
        };
        let skip_marks = batch
            .iter()
            .filter(|(k, v)| matches!(k, StateKey::SkipMark(..)) && v.is_some())
            .count();
        self.store.apply(&batch);
        oracle.reset(self.actor);
        for (c, point) in points {
            self.positions.insert(c, point.position);
        }
        Ok((1, skip_marks))
    }

    /// The first transaction of an incarnation: init's writes and whatever
    /// was released, committed or (with `crash`) aborted.
    #[allow(clippy::too_many_arguments)]
    fn start_transaction(
        &mut self,
        node: P,
        deliveries: Vec<Delivery>,
        crash: Option<usize>,
        restored_held: usize,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        self.protocol = Some(node);
        self.stats_seen = NodeStats::default();
        oracle.begin(self.actor);
        if self.fault != Some(HostFault::WithholdPositionAdvance) {
            for (&c, &pos) in &self.positions {
                oracle.position(self.actor, c, pos);
            }
        }
        let positions = self.positions.clone();
        let mut report = self.finish_with(
            deliveries,
            Vec::new(),
            positions,
            crash,
            broker,
            oracle,
            topics,
        )?;
        report.restored_held = restored_held;
        Ok(report)
    }

    /// Runs one transactional step. With `crash = Some(k)` the node crashes
    /// before the commit, and before any stamping call beyond the first `k`
    /// of the step (so `Some(0)` crashes before the step's first send, and a
    /// `k` at or above what the step sends crashes after all its work).
    pub fn step(
        &mut self,
        action: NodeAction,
        crash: Option<usize>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let mut positions = self.positions.clone();
        oracle.begin(self.actor);
        let work = match self.work(action, &mut positions, broker, oracle, topics) {
            Ok(w) => w,
            Err(v) => {
                oracle.rollback(self.actor);
                return Err(v);
            }
        };
        let mut report = self.finish_with(
            work.deliveries,
            work.sends,
            positions,
            crash,
            broker,
            oracle,
            topics,
        )?;
        report.truncated = work.truncated;
        report.adjacent_fetch = work.adjacent_fetch;
        report.adjacent_tagged_fetch = work.adjacent_tagged_fetch;
        if crash.is_none()
            && let Some((c, offset)) = work.fetched
            && let Some(id) = oracle.record_at(c, offset)
            && !oracle.is_delivered(self.actor, id)
        {
            report.held_on_prior_incarnation =
                oracle.waits_only_on_prior_incarnation(self.actor, id);
        }
        Ok(report)
    }

    /// The protocol calls of one step: what it delivered, what it sent (a
    /// tick), what a sweep truncated, and what a fetch fetched.
    fn work(
        &mut self,
        action: NodeAction,
        positions: &mut BTreeMap<Channel, i64>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> Result<Work, Violation> {
        let name = &self.spec.name;
        let refused = |e: parsley_protocol::ProtocolError| {
            violation(format!("node {name}: protocol refused: {e}"))
        };
        let Some(protocol) = self.protocol.as_mut() else {
            return Err(violation(format!("node {name}: step while down")));
        };
        let mut work = Work {
            deliveries: Vec::new(),
            sends: Vec::new(),
            truncated: 0,
            fetched: None,
            adjacent_fetch: false,
            adjacent_tagged_fetch: false,
        };
        let deliveries = &mut work.deliveries;
        match action {
            NodeAction::Fetch(c) => {
                let from = positions.get(&c).copied().unwrap_or(0);
                let Some((offset, rec)) = broker.fetch(c, from) else {
                    return Ok(work);
                };
                let tagged = rec.causal.sender.is_some();
                if let Some(&(last, last_tagged)) = self.last_fetched.get(&c)
                    && last + 1 == offset
                {
                    work.adjacent_fetch = true;
                    work.adjacent_tagged_fetch = tagged && last_tagged;
                }
                self.last_fetched.insert(c, (offset, tagged));
                work.fetched = Some((c, offset));
                let record = InboundRecord {
                    channel: c,
                    offset,
                    timestamp: rec.timestamp,
                    key: rec.key.clone(),
                    value: rec.value.clone(),
                    headers: rec.headers.clone(),
                    causal: rec.causal.clone(),
                };
                let id = rec.oracle_id;
                positions.insert(c, offset + 1);
                if self.fault == Some(HostFault::EarlyPositionReport) {
                    // The fault: report the end as the position before the
                    // record is handed over.
                    deliveries.extend(
                        protocol
                            .position_advance(c, broker.end_offset(c))
                            .map_err(refused)?,
                    );
                }
                deliveries.extend(protocol.on_record(record).map_err(refused)?);
                oracle.receive(self.actor, id);
                oracle.position(self.actor, c, offset + 1);
            }
            NodeAction::Advance(c) => {
                let from = positions.get(&c).copied().unwrap_or(0);
                if let Some(target) = broker.skip_target(c, from) {
                    positions.insert(c, target);
                    deliveries.extend(protocol.position_advance(c, target).map_err(refused)?);
                    oracle.position(self.actor, c, target);
                }
            }
            NodeAction::Tick => {
                let Some(tick) = &self.spec.tick else {
                    return Err(violation(format!("node {name}: tick without a tick spec")));
                };
                let channel = Channel::new(topics.id(&tick.topic), tick.partition);
                let payload = Payload {
                    key: u64::from(tick.partition as u32),
                    hops: 0,
                };
                let send =
                    Self::send(protocol, oracle, broker, self.actor, name, channel, payload)?;
                work.sends.push(send);
            }
            NodeAction::Sweep => {
                let report = protocol.truncate_to_log_starts(broker).map_err(refused)?;
                work.truncated = report.entries_removed;
            }
        }
        Ok(work)
    }

    /// Processes deliveries (oracle check, behaviour, stamped sends), then
    /// commits or crashes (see [`step`](Self::step) for `crash`).
    #[allow(clippy::too_many_arguments)]
    fn finish_with(
        &mut self,
        deliveries: Vec<Delivery>,
        mut sends: Vec<Send>,
        positions: BTreeMap<Channel, i64>,
        crash: Option<usize>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let name = self.spec.name.clone();
        let mut report = StepReport::default();
        let tick_channel = self
            .spec
            .tick
            .as_ref()
            .map(|t| Channel::new(topics.id(&t.topic), t.partition));
        let Some(protocol) = self.protocol.as_mut() else {
            oracle.rollback(self.actor);
            return Err(violation(format!("node {name}: step while down")));
        };
        'deliveries: for d in deliveries {
            let c = d.record.channel;
            let Some(id) = oracle.record_at(c, d.record.offset) else {
                oracle.rollback(self.actor);
                return Err(violation(format!(
                    "node {name}: delivered {c}@{} which is not a committed record",
                    d.record.offset
                )));
            };
            if let Err(v) = oracle.deliver(self.actor, id) {
                oracle.rollback(self.actor);
                return Err(v);
            }
            report.delivered += 1;
            if d.record.causal.clock.sequences().iter().any(|claim| {
                claim.sender == self.sender
                    && self
                        .joined_own_seq
                        .get(&claim.channel)
                        .is_some_and(|&s| claim.seq <= s)
            }) {
                report.own_past_claims_delivered += 1;
            }
            if d.was_held {
                report.released_from_hold += 1;
                let shared = |ch: Channel| broker.tagged_senders(ch) >= 2;
                if shared(c)
                    || d.record
                        .causal
                        .clock
                        .sequences()
                        .iter()
                        .any(|s| shared(s.channel))
                {
                    report.multi_sender_holds += 1;
                }
            }
            let payload = Payload::decode(d.record.key.as_deref(), d.record.value.as_deref());
            let emissions: Vec<(Output, Payload)> = match &self.spec.tick {
                Some(t) if Some(c) == tick_channel => {
                    t.outputs.iter().map(|o| (o.clone(), payload)).collect()
                }
                _ => self
                    .spec
                    .behavior
                    .react(payload)
                    .into_iter()
                    .map(|(o, p)| (o.clone(), p))
                    .collect(),
            };
            for (out, next) in emissions {
                let topic = topics.id(&out.topic);
                let parts = broker.partitions(topic).unwrap_or(1).max(1);
                let partition = match out.route {
                    Route::Partition(p) => p,
                    Route::ByKey => (next.key % parts as u64) as i32,
                    Route::RoundRobin => {
                        self.round_robin += 1;
                        (self.round_robin % parts as u64) as i32
                    }
                };
                let channel = Channel::new(topic, partition);
                if crash.is_some_and(|k| sends.len() >= k) {
                    // The crash lands here, before this stamping call.
                    report.cut_sends = true;
                    break 'deliveries;
                }
                match Self::send(protocol, oracle, broker, self.actor, &name, channel, next) {
                    Ok(s) => sends.push(s),
                    Err(v) => {
                        oracle.rollback(self.actor);
                        return Err(v);
                    }
                }
            }
        }
        report.sent = sends.len();
        let now = protocol.stats();
        report.replays_skipped =
            (now.replays_skipped_total - self.stats_seen.replays_skipped_total) as usize;
        report.past_skipped =
            (now.past_skipped_total - self.stats_seen.past_skipped_total) as usize;
        self.stats_seen = now;
        let touched: BTreeSet<Channel> = sends.iter().map(|s| s.channel).collect();
        if crash.is_some() {
            // The transaction aborts: its records take offsets as aborted
            // records, each touched partition gets an abort marker, and the
            // node goes down with nothing of the step committed.
            for s in sends {
                broker.append(s.channel, s.record, false);
            }
            for &c in &touched {
                broker.append_marker(c, false);
            }
            if self.fault == Some(HostFault::StepAtomicity) {
                // The fault: state and positions survive the abort.
                let writes = protocol.take_writes();
                self.store.apply(&writes);
                self.positions = positions;
            }
            oracle.rollback(self.actor);
            self.protocol = None;
            return Ok(report);
        }
        let writes = protocol.take_writes();
        report.held_after = protocol.held_count();
        self.store.apply(&writes);
        self.positions = positions;
        report.adjacent_sends = touched
            .iter()
            .filter(|&&c| sends.iter().filter(|s| s.channel == c).count() >= 2)
            .count();
        for s in sends {
            let offset = broker.end_offset(s.channel);
            let id = oracle.register(s.pending, s.channel, offset);
            let mut record = s.record;
            record.oracle_id = id;
            let at = broker.append(s.channel, record, true);
            assert_eq!(at, offset, "sim: append landed at an unexpected offset");
        }
        for &c in &touched {
            broker.append_marker(c, true);
        }
        oracle.commit(self.actor);
        Ok(report)
    }

    /// H4: stamp for the concrete channel, check every offset claim names a
    /// real offset ([`check_offset_claims`]), and stage exactly that record.
    fn send(
        protocol: &mut P,
        oracle: &mut Oracle,
        broker: &SimBroker,
        actor: ActorId,
        name: &str,
        channel: Channel,
        payload: Payload,
    ) -> Result<Send, Violation> {
        let causal: CausalHeaders = protocol
            .prepare_send(channel)
            .map_err(|e| violation(format!("node {name}: stamping refused: {e}")))?;
        check_offset_claims(broker, &causal.clock)
            .map_err(|e| violation(format!("node {name}: {e}")))?;
        let pending: PendingSend = oracle.emit(actor);
        Ok(Send {
            channel,
            pending,
            record: StoredRecord {
                key: Some(payload.key_bytes()),
                value: Some(payload.value_bytes()),
                timestamp: 0,
                headers: Vec::new(),
                causal,
                oracle_id: usize::MAX,
                clock_version: parsley_protocol::clock::ClockVersion::V1,
            },
        })
    }
}

/// A staged send.
pub(crate) struct Send {
    channel: Channel,
    pending: PendingSend,
    record: StoredRecord,
}
