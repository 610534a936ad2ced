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

mod start;
mod step;

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
}

/// A staged send.
pub(crate) struct Send {
    channel: Channel,
    pending: PendingSend,
    record: StoredRecord,
}
