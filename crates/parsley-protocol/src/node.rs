//! [`CausalNode`]: the delivery gate, hold queues, density adaptation, the
//! stamp, rescope, restore and truncation for one task.
//!
//! # The host contract
//!
//! A host drives one node per task and owes it these duties (they are the
//! H1-H6 of the conformance kit, and the simulator's reference host performs
//! each one):
//!
//! 1. Hand records to [`on_record`](CausalNode::on_record) per channel in
//!    strictly increasing offset order, as a `read_committed` consumer
//!    returns them.
//! 2. Report the consumer's position through
//!    [`position_advance`](CausalNode::position_advance), but only once every
//!    record below that position has gone through `on_record`. That
//!    includes the starting position right after init: the node does not
//!    persist what it was told about positions, so a marker skipped before
//!    a restart is only covered again once the host reports the position
//!    it resumed from.
//! 3. Process the returned [`Delivery`] values in order, and commit
//!    [`take_writes`](CausalNode::take_writes), the consumed positions and
//!    every send atomically. On abort, drop the node and initialise a new one
//!    from the committed store.
//! 4. Partition every outgoing record first, then stamp it with
//!    [`prepare_send`](CausalNode::prepare_send) for its concrete destination
//!    channel, and send exactly what was stamped.
//! 5. Start through [`CausalNode::init`] from committed state, and seek the
//!    channels in [`resume_positions`](CausalNode::resume_positions).
//! 6. Never start a channel below its log start.
//!
//! # Determinism
//!
//! Everything that can reach deliveries, stamps or stored bytes iterates in
//! sorted order: channels are a sorted vector, every map is a `BTreeMap`.
//! Two nodes fed the same calls produce the same outputs, byte for byte.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tracing::{debug, info};

use crate::broker::{BrokerOffsets, TopicOffsets, answer_for};
use crate::clock::VectorClock;
use crate::error::ProtocolError;
use crate::headers::{CausalHeaders, SenderTag};
use crate::ids::{Channel, SenderId, TopicId};
use crate::record::{Delivery, InboundRecord};
use crate::restore::Persisted;
pub use crate::restore::{DeliveredMark, SkipMark};
use crate::store::{ScopeRecord, StateKey, SteppedPast, StoreRead, WriteBatch, encode_envelope};

/// What a node is: who it is, what it consumes, where it may send.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NodeConfig {
    /// The node's stable sender identity (the same across restarts).
    pub sender: SenderId,
    /// The channels this node consumes.
    pub inputs: BTreeSet<Channel>,
    /// The topics this node may send to.
    pub sinks: BTreeSet<TopicId>,
}

/// Counters a host can export as metrics.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct NodeStats {
    /// Records released through the gate since init.
    pub delivered_total: u64,
    /// Records fed at or below the frontier and discarded.
    pub replays_skipped_total: u64,
    /// Records on a joined input skipped because the node's past already
    /// claimed them by sequence (see [`CausalNode::init`] on scope growth).
    pub past_skipped_total: u64,
    /// Held records paged out of memory (see
    /// [`CausalNode::set_resident_window`]).
    pub paged_out_total: u64,
    /// Held records paged back in by the host.
    pub paged_in_total: u64,
}

/// A run of paged-out held records the node needs back before its gate can
/// go on: the host reads queue entries `from..from + count` of `channel`
/// from its committed store (the [`StateKey::QueueEntry`] values the node
/// wrote) and hands the decoded records to
/// [`CausalNode::page_in`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PageRequest {
    /// The channel.
    pub channel: Channel,
    /// The queue index of the first record wanted (the head's).
    pub from: i64,
    /// How many records, in index order.
    pub count: usize,
}

/// What [`CausalNode::init`] found and did.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct InitReport {
    /// True when the store held no state at all.
    pub fresh: bool,
    /// Held records restored into hold queues.
    pub restored_held: usize,
    /// Inputs that left the scope; their past was folded into carried
    /// ancestry.
    pub shrunk: Vec<Channel>,
    /// Inputs that joined the scope.
    pub grown: Vec<Channel>,
    /// Joined inputs whose frontier was seeded from the node's past (every
    /// offset its stamps already claimed on the channel).
    pub seeded: BTreeMap<Channel, i64>,
    /// Joined inputs on which sequence claims of the node's past will skip
    /// records as they arrive, with the claimed sender and sequence.
    pub skip_marks: BTreeMap<Channel, BTreeMap<SenderId, SkipMark>>,
    /// Former sinks whose end offsets were folded into carried ancestry.
    pub former_sinks_folded: Vec<TopicId>,
    /// Former sinks skipped because the topic no longer exists.
    pub former_sinks_absent: Vec<TopicId>,
}

/// A node fresh from [`CausalNode::init`], with the records that became
/// deliverable during init (a rescope can release restored records). The host
/// processes them in the first transaction like any other deliveries.
#[derive(Debug)]
pub struct Initialized<N = CausalNode> {
    /// The node.
    pub node: N,
    /// Records released by init, in order.
    pub deliveries: Vec<Delivery>,
    /// What init did.
    pub report: InitReport,
}

/// What a truncation sweep removed.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct TruncationReport {
    /// Stamp-side clock entries removed.
    pub entries_removed: usize,
    /// Topics found to no longer exist, whose entries were all removed.
    pub destroyed_topics: Vec<TopicId>,
}

/// A claim a held record still waits for, as the diagnostics see it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum UnmetClaim {
    /// An offset claim on a consumed channel above its frontier.
    Offset {
        /// The claimed channel.
        channel: Channel,
        /// The claimed offset.
        offset: i64,
        /// The channel's delivered frontier here.
        frontier: i64,
        /// The highest offset fetched on the channel here (held or
        /// delivered); a claim at or below it is fetched but held.
        received: i64,
        /// The last consumer position reported for the channel (0 if none).
        position: i64,
    },
    /// A sequence claim not yet satisfied by a delivery from its sender.
    Sequence {
        /// The claimed channel.
        channel: Channel,
        /// The claimed sender.
        sender: SenderId,
        /// The claimed send sequence.
        seq: i64,
        /// What has been delivered from that sender on the channel, if
        /// anything.
        delivered: Option<DeliveredMark>,
    },
}

/// The most room (in records) a drained hold queue keeps for the next hold.
const KEPT_QUEUE_CAPACITY: usize = 64;

/// A read-only view of one gating queue head.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HeldHead {
    /// The channel the head blocks.
    pub channel: Channel,
    /// The head's offset.
    pub offset: i64,
    /// The head's record timestamp.
    pub timestamp: i64,
    /// The head's sender tag.
    pub sender: Option<SenderTag>,
    /// Records in the queue, the head included.
    pub depth: usize,
    /// Every claim the head still waits for.
    pub unmet: Vec<UnmetClaim>,
}

/// A read-only view of one consumed channel's bookkeeping.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChannelView {
    /// The channel.
    pub channel: Channel,
    /// Highest offset below which everything is delivered or skipped (-1:
    /// nothing yet).
    pub frontier: i64,
    /// Last reported consumer position (0: none since init).
    pub position: i64,
    /// Records held in the queue.
    pub held: usize,
    /// The advertised clock folded from records received on the channel.
    pub advertised: VectorClock,
}

#[derive(Clone, Copy, Debug)]
enum Claim {
    Offset {
        idx: usize,
        offset: i64,
    },
    Seq {
        idx: usize,
        sender: SenderId,
        seq: i64,
    },
}

#[derive(Debug)]
struct ChannelState {
    channel: Channel,
    frontier: i64,
    position: i64,
    advertised: VectorClock,
    /// The held records, in index order, as three runs: `queue` (resident,
    /// the head first), `paged` (committed records beyond the resident
    /// window, kept only as offset and size; the host reads them back from
    /// its store by index), and `back` (resident records queued after a
    /// paged run). `back` is empty whenever `paged` is.
    queue: VecDeque<InboundRecord>,
    paged: VecDeque<(i64, usize)>,
    back: VecDeque<InboundRecord>,
    /// The head's claims not yet known to be met, once the head has been
    /// evaluated (`None` before that). Only heads are ever gated, so records
    /// behind a head cost nothing until they reach the front. Frontiers and
    /// delivery marks only grow, so a met claim stays met and is pruned for
    /// good.
    head_unmet: Option<Vec<Claim>>,
    head_index: i64,
    committed_head: i64,
    committed_tail: i64,
    delivered: BTreeMap<SenderId, DeliveredMark>,
    /// Skip marks set when the channel joined the scope (kept for as long
    /// as the channel stays an input: they also meet claims on the skipped
    /// records, which are never delivered here).
    skip: BTreeMap<SenderId, SkipMark>,
    skip_dirty: bool,
    frontier_dirty: bool,
    advertised_dirty: bool,
    delivered_dirty: BTreeSet<SenderId>,
}

impl ChannelState {
    fn new(channel: Channel) -> Self {
        ChannelState {
            channel,
            frontier: -1,
            position: 0,
            advertised: VectorClock::new(),
            queue: VecDeque::new(),
            paged: VecDeque::new(),
            back: VecDeque::new(),
            head_unmet: None,
            head_index: 0,
            committed_head: 0,
            committed_tail: 0,
            delivered: BTreeMap::new(),
            skip: BTreeMap::new(),
            skip_dirty: false,
            frontier_dirty: false,
            advertised_dirty: false,
            delivered_dirty: BTreeSet::new(),
        }
    }

    /// Records held, resident or paged.
    fn len(&self) -> usize {
        self.queue.len() + self.paged.len() + self.back.len()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.paged.is_empty()
    }

    fn tail_index(&self) -> i64 {
        self.head_index + self.len() as i64
    }

    /// The offset of the last record queued.
    fn last_offset(&self) -> Option<i64> {
        self.back
            .back()
            .map(|r| r.offset)
            .or_else(|| self.paged.back().map(|&(o, _)| o))
            .or_else(|| self.queue.back().map(|r| r.offset))
    }

    /// The last record queued, when it is resident.
    fn last_resident(&self) -> Option<&InboundRecord> {
        if self.paged.is_empty() {
            self.queue.back()
        } else {
            self.back.back()
        }
    }

    /// The offset of the head, resident or (for a moment, until the host
    /// pages it in) paged.
    fn head_offset(&self) -> Option<i64> {
        self.queue
            .front()
            .map(|r| r.offset)
            .or_else(|| self.paged.front().map(|&(o, _)| o))
    }

    /// Queues a record behind everything held.
    fn push(&mut self, record: InboundRecord) {
        if self.paged.is_empty() {
            self.queue.push_back(record);
        } else {
            self.back.push_back(record);
        }
    }

    /// The held record at queue index `index`, if it is resident.
    fn resident(&self, index: i64) -> Option<&InboundRecord> {
        let mut at = usize::try_from(index - self.head_index).ok()?;
        if at < self.queue.len() {
            return self.queue.get(at);
        }
        at -= self.queue.len();
        if at < self.paged.len() {
            return None;
        }
        self.back.get(at - self.paged.len())
    }

    /// The bytes the held records take, paged ones included.
    fn held_bytes(&self) -> usize {
        self.queue
            .iter()
            .chain(&self.back)
            .map(InboundRecord::held_size)
            .sum::<usize>()
            + self.paged.iter().map(|&(_, size)| size).sum::<usize>()
    }

    /// Pages out committed records beyond the first `window`: what is
    /// queued after a paged run joins it; otherwise the resident run is cut
    /// at the window. Only call with every held record committed.
    fn page_out(&mut self, window: usize) -> usize {
        let before = self.paged.len();
        if self.paged.is_empty() {
            if self.queue.len() > window {
                for r in self.queue.drain(window..) {
                    self.paged.push_back((r.offset, r.held_size()));
                }
                self.queue.shrink_to(window.max(KEPT_QUEUE_CAPACITY));
            }
        } else {
            for r in self.back.drain(..) {
                self.paged.push_back((r.offset, r.held_size()));
            }
        }
        // What arrived since the last commit needed room only until now.
        if self.back.capacity() > KEPT_QUEUE_CAPACITY {
            self.back = VecDeque::new();
        }
        self.paged.len() - before
    }

    /// The highest offset this node has received on the channel.
    fn received(&self) -> i64 {
        self.last_offset()
            .map_or(self.frontier, |o| o.max(self.frontier))
    }

    /// The prefix known to hold nothing undelivered: everything below a held
    /// head (FIFO delivered the rest, so what is missing was skipped), or,
    /// with an empty queue, everything below the reported position.
    fn clean_prefix(&self) -> i64 {
        match self.head_offset() {
            Some(head) => head - 1,
            None => self.position - 1,
        }
    }
}

/// The causal delivery protocol for one task. See the [module
/// documentation](self) for the host contract.
#[derive(Debug)]
pub struct CausalNode {
    sender: SenderId,
    sinks: BTreeSet<TopicId>,
    /// Consumed channels, sorted by channel.
    channels: Vec<ChannelState>,
    carried: VectorClock,
    carried_dirty: bool,
    /// Delivery marks of channels no longer consumed; still used to resolve
    /// sequence claims on them at the stamping site.
    carried_delivered: BTreeMap<Channel, BTreeMap<SenderId, DeliveredMark>>,
    own_outputs: VectorClock,
    send_seq: BTreeMap<Channel, i64>,
    /// Send sequences committed by earlier incarnations (read at init).
    prior_send_seq: BTreeMap<Channel, i64>,
    /// This incarnation's sends: the last sequence per sink channel.
    self_claims: BTreeMap<Channel, i64>,
    send_seq_dirty: BTreeSet<Channel>,
    pending: WriteBatch,
    resume: BTreeMap<Channel, i64>,
    held: usize,
    /// What the held records cost, by [`InboundRecord::held_size`].
    held_bytes: usize,
    stamp_base: Option<VectorClock>,
    /// Records stepped past instead of delivered, per channel and offset.
    stepped: BTreeMap<Channel, BTreeMap<i64, SteppedPast>>,
    stats: NodeStats,
    /// Held records kept resident per queue (`None`: all of them).
    window: Option<usize>,
}

impl CausalNode {
    /// Starts a node from committed state: restores everything persisted,
    /// reconciles the recorded scope with `config` (shrink, growth, former
    /// sinks), seeds own outputs from every declared sink's end offset, and
    /// releases whatever the reconciliation made deliverable.
    ///
    /// The writes init makes are idempotent and are returned by the first
    /// [`take_writes`](Self::take_writes), to be committed with the first
    /// step.
    pub fn init(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
    ) -> Result<Initialized, ProtocolError> {
        Self::init_windowed(config, store, broker, None)
    }

    /// [`init`](Self::init) with a resident window set from the start (see
    /// [`set_resident_window`](Self::set_resident_window)): held records
    /// beyond it are checked as they are read and kept only as offset and
    /// size, so a node restored with many records held never has them all
    /// in memory. The host serves the node's
    /// [`page_requests`](Self::page_requests), as after any call.
    pub fn init_windowed(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
        window: Option<usize>,
    ) -> Result<Initialized, ProtocolError> {
        let window = window.map(|w| w.max(1));
        if let Some(c) = config.inputs.iter().find(|c| c.partition < 0) {
            return Err(ProtocolError::InvalidConfig(format!(
                "input {c} has a negative partition"
            )));
        }
        let mut p = Persisted::read(store, window)?;
        let mut report = InitReport {
            fresh: p.scope.is_none(),
            ..InitReport::default()
        };
        let recorded = p.scope.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
        let recorded_inputs: BTreeSet<Channel> = recorded.inputs.iter().copied().collect();
        let recorded_sinks: BTreeSet<TopicId> = recorded.sinks.iter().copied().collect();
        let persisted_carried = p.carried.clone().unwrap_or_default();
        let mut carried = persisted_carried.clone();
        let mut pending = WriteBatch::new();

        // Shrink: a departing input's past moves into carried ancestry.
        for &ch in recorded_inputs.difference(&config.inputs) {
            let (head, tail) = p.queue_meta.get(&ch).copied().unwrap_or((0, 0));
            if tail > head {
                return Err(ProtocolError::HeldRecordsOnDepartingInput {
                    channel: ch,
                    held: tail - head,
                });
            }
            if let Some(f) = p.frontiers.remove(&ch) {
                carried.claim_offset(ch, f);
                pending.delete(StateKey::Frontier(ch));
            }
            if let Some(cc) = p.advertised.remove(&ch) {
                carried.merge(&cc);
                pending.delete(StateKey::ChannelClock(ch));
            }
            if p.queue_meta.remove(&ch).is_some() {
                pending.delete(StateKey::QueueMeta(ch));
            }
            for sender in p.skips.remove(&ch).unwrap_or_default().into_keys() {
                pending.delete(StateKey::SkipMark(ch, sender));
            }
            for offset in p.stepped.remove(&ch).unwrap_or_default().into_keys() {
                pending.delete(StateKey::Stepped(ch, offset));
            }
            report.shrunk.push(ch);
        }

        // One end-offset query: current and former sinks (own outputs and
        // their folding), and joining inputs (the bound of what the node's
        // past can name there).
        let former: BTreeSet<TopicId> = recorded_sinks.difference(&config.sinks).copied().collect();
        let grown: Vec<Channel> = config
            .inputs
            .difference(&recorded_inputs)
            .copied()
            .collect();
        let mut query: BTreeSet<TopicId> = config.sinks.union(&former).copied().collect();
        query.extend(grown.iter().map(|c| c.topic));
        let answers = if query.is_empty() {
            BTreeMap::new()
        } else {
            broker.end_offsets(&query)?
        };
        let mut own_outputs = VectorClock::new();
        for &topic in &config.sinks {
            match answer_for(&answers, topic)? {
                TopicOffsets::Absent => return Err(ProtocolError::MissingSink { topic }),
                TopicOffsets::Present(ends) => {
                    for (&partition, &end) in ends {
                        own_outputs.claim_offset(Channel::new(topic, partition), end - 1);
                    }
                }
            }
        }
        for &topic in &former {
            match answer_for(&answers, topic)? {
                TopicOffsets::Absent => report.former_sinks_absent.push(topic),
                TopicOffsets::Present(ends) => {
                    for (&partition, &end) in ends {
                        carried.claim_offset(Channel::new(topic, partition), end - 1);
                    }
                    report.former_sinks_folded.push(topic);
                }
            }
        }

        let end_of = |c: Channel| match answers.get(&c.topic) {
            Some(TopicOffsets::Present(ends)) => ends.get(&c.partition).copied(),
            _ => None,
        };

        // Growth: a joining input skips everything the node's stamps already
        // claim as past on it, so that history is never re-entered after
        // the effects the node delivered. That past is what a stamp would
        // carry: carried ancestry (departed inputs, former sinks), own
        // outputs, and the advertised clocks of the inputs it keeps, with
        // sequence claims it can resolve turned into offsets. Sequence
        // claims it cannot resolve name records whose offsets are unknown
        // here; they become skip marks, applied as those records arrive.
        // The node's own committed sends to the channel (it was a sink) are
        // in its past by definition: they become a skip mark too, which is
        // what meets claims on them that come back through custody (they
        // sit below the seed, so they will never be delivered here).
        //
        // A fresh node has no past: its own outputs at a first start are an
        // over-claim on whatever others wrote to its sinks, not history it
        // ignored, so they seed nothing and the host's start policy decides.
        let mut past = carried.clone();
        if !report.fresh {
            past.merge(&own_outputs);
        }
        for (c, cc) in &p.advertised {
            if config.inputs.contains(c) {
                past.merge(cc);
            }
        }
        let mut resume = BTreeMap::new();
        let mut seeded = BTreeMap::new();
        let mut skips: BTreeMap<Channel, BTreeMap<SenderId, SkipMark>> = BTreeMap::new();
        for &ch in &grown {
            report.grown.push(ch);
            let mut seed = past.offset(ch);
            let marks = p.delivered.get(&ch);
            if let (Some(&seq), Some(bound)) = (p.send_seq.get(&ch), end_of(ch)) {
                skips
                    .entry(ch)
                    .or_default()
                    .insert(config.sender, SkipMark { seq, bound });
            }
            for claim in past.sequences().iter().filter(|c| c.channel == ch) {
                if claim.sender == config.sender {
                    // Our own committed sends: the own-claim rule covers them.
                    continue;
                }
                match marks.and_then(|m| m.get(&claim.sender)) {
                    Some(m) if m.seq >= claim.seq => {
                        seed = Some(seed.map_or(m.offset, |s| s.max(m.offset)));
                    }
                    _ => {
                        if let Some(bound) = end_of(ch) {
                            skips.entry(ch).or_default().insert(
                                claim.sender,
                                SkipMark {
                                    seq: claim.seq,
                                    bound,
                                },
                            );
                        }
                    }
                }
            }
            if let Some(n) = seed {
                seeded.insert(ch, n);
                resume.insert(ch, n + 1);
            }
        }
        report.seeded = seeded.clone();
        report.skip_marks = skips.clone();

        let mut carried_delivered = std::mem::take(&mut p.delivered);
        let mut channels = Vec::with_capacity(config.inputs.len());
        for &ch in &config.inputs {
            let mut st = ChannelState::new(ch);
            if let Some(&f) = p.frontiers.get(&ch) {
                st.frontier = f;
            }
            if let Some(&n) = seeded.get(&ch)
                && n > st.frontier
            {
                st.frontier = n;
                st.frontier_dirty = true;
            }
            if let Some(cc) = p.advertised.remove(&ch) {
                st.advertised = cc;
            }
            if let Some(&(head, tail)) = p.queue_meta.get(&ch) {
                st.head_index = head;
                st.committed_head = head;
                st.committed_tail = tail;
            }
            let (resident, paged) = p.queues.remove(&ch).unwrap_or_default();
            st.queue = VecDeque::from(resident);
            st.paged = paged;
            if let Some(marks) = carried_delivered.remove(&ch) {
                st.delivered = marks;
            }
            if let Some(marks) = p.skips.remove(&ch) {
                st.skip = marks;
            }
            if let Some(marks) = skips.remove(&ch) {
                st.skip = marks;
                st.skip_dirty = true;
            }
            channels.push(st);
        }

        let scope = ScopeRecord {
            inputs: config.inputs.iter().copied().collect(),
            sinks: config.sinks.iter().copied().collect(),
        }
        .encode();
        if p.scope.as_ref().map(|(_, bytes)| bytes.as_slice()) != Some(scope.as_slice()) {
            pending.put(StateKey::Scope, scope);
        }

        let mut node = CausalNode {
            sender: config.sender,
            sinks: config.sinks,
            channels,
            carried_dirty: carried != persisted_carried,
            carried,
            carried_delivered,
            own_outputs,
            prior_send_seq: p.send_seq.clone(),
            send_seq: p.send_seq,
            self_claims: BTreeMap::new(),
            send_seq_dirty: BTreeSet::new(),
            pending,
            resume,
            held: 0,
            held_bytes: 0,
            stamp_base: None,
            stepped: std::mem::take(&mut p.stepped),
            stats: NodeStats::default(),
            window,
        };
        node.stats.paged_out_total = node.channels.iter().map(|c| c.paged.len() as u64).sum();
        // Restored records are gated (lazily, head first) against the
        // reconciled scope.
        node.held = node.channels.iter().map(ChannelState::len).sum();
        node.held_bytes = node.channels.iter().map(ChannelState::held_bytes).sum();
        report.restored_held = node.held;
        let mut deliveries = Vec::new();
        node.cascade(&mut deliveries);
        info!(
            sender = %node.sender,
            inputs = node.channels.len(),
            sinks = node.sinks.len(),
            restored_held = report.restored_held,
            released_at_init = deliveries.len(),
            shrunk = ?report.shrunk,
            grown = ?report.grown,
            former_sinks_absent = ?report.former_sinks_absent,
            "causal node initialised"
        );
        Ok(Initialized {
            node,
            deliveries,
            report,
        })
    }

    /// Receives one fetched record: seeds or bridges the channel's frontier
    /// when its queue is empty, folds the record's clock into the channel's
    /// advertised clock, queues the record, and releases everything that
    /// became deliverable, in order.
    ///
    /// A record at or below the frontier is a replay and is dropped without
    /// effect. A record at or below one already received, or below a
    /// reported position, is refused.
    pub fn on_record(&mut self, record: InboundRecord) -> Result<Vec<Delivery>, ProtocolError> {
        let mut out = Vec::new();
        self.on_record_into(record, &mut out)?;
        Ok(out)
    }

    /// [`on_record`](Self::on_record), appending deliveries to `out`.
    pub fn on_record_into(
        &mut self,
        record: InboundRecord,
        out: &mut Vec<Delivery>,
    ) -> Result<(), ProtocolError> {
        let i = self.index_of(record.channel, "record")?;
        let ch = &self.channels[i];
        if record.offset <= ch.frontier {
            self.stats.replays_skipped_total += 1;
            debug!(channel = %record.channel, offset = record.offset, "replay at or below the frontier dropped");
            return Ok(());
        }
        let known = ch.received().max(ch.position - 1);
        if record.offset <= known {
            return Err(ProtocolError::OutOfOrder {
                channel: record.channel,
                offset: record.offset,
                known,
            });
        }
        let ch = &mut self.channels[i];
        if ch.advertised.merge(&record.causal.clock) {
            ch.advertised_dirty = true;
            self.stamp_base = None;
        }
        if let Some(tag) = record.causal.sender
            && ch
                .skip
                .get(&tag.sender)
                .is_some_and(|m| tag.seq <= m.seq && record.offset < m.bound)
        {
            // Already in the node's past when the channel joined: skipped
            // like a replay. With nothing held, the frontier passes it.
            self.stats.past_skipped_total += 1;
            debug!(channel = %record.channel, offset = record.offset, "record of the node's past skipped on a joined input");
            if ch.is_empty() && set_frontier(ch, record.offset) {
                self.stamp_base = None;
                if self.held > 0 {
                    self.cascade(out);
                }
            }
            return Ok(());
        }
        if !ch.is_empty() {
            debug!(channel = %record.channel, offset = record.offset, depth = ch.len(), "record queued behind a held head");
            self.held_bytes += record.held_size();
            ch.push(record);
            self.held += 1;
            return Ok(());
        }
        let unmet = self.unmet_claims(i, &record.causal.clock);
        let ch = &mut self.channels[i];
        // Empty queue: everything between the frontier and this record was
        // skipped by the consumer (seed on first sighting, bridge after).
        let bridged = set_frontier(ch, record.offset - 1);
        if unmet.is_empty() {
            self.deliver(i, record, false, out);
        } else {
            debug!(channel = %record.channel, offset = record.offset, clock = ?record.causal.clock, "record held at the gate");
            self.held_bytes += record.held_size();
            ch.queue.push_back(record);
            ch.head_unmet = Some(unmet);
            self.held += 1;
            if bridged {
                self.stamp_base = None;
            }
        }
        if self.held > 0 {
            self.cascade(out);
        }
        Ok(())
    }

    /// Reports the consumer's position on a channel: every offset below
    /// `position` has been fetched (and handed to `on_record`) or skipped by
    /// the consumer. With an empty queue the frontier rises to
    /// `position - 1`; with a held head it does so once the queue drains.
    pub fn position_advance(
        &mut self,
        channel: Channel,
        position: i64,
    ) -> Result<Vec<Delivery>, ProtocolError> {
        let i = self.index_of(channel, "position advance")?;
        let mut out = Vec::new();
        let ch = &mut self.channels[i];
        if position <= ch.position {
            return Ok(out);
        }
        ch.position = position;
        if ch.is_empty() && set_frontier(ch, position - 1) {
            self.stamp_base = None;
            if self.held > 0 {
                self.cascade(&mut out);
            }
        }
        Ok(out)
    }

    /// Stamps one outgoing record for its concrete destination channel and
    /// assigns its send sequence. The host attaches the returned headers and
    /// sends exactly that record; the sequence bump is part of the step's
    /// writes.
    ///
    /// The stamp is the pointwise max of the delivered frontier, every
    /// channel's advertised clock, carried ancestry, and own outputs, plus
    /// this incarnation's own sends to other channels as sequence claims.
    /// Foreign sequence claims this node can resolve become offset claims,
    /// and echoes of earlier incarnations' own sends are dropped (own outputs
    /// or carried ancestry already claim them in offset form).
    pub fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError> {
        if !self.sinks.contains(&destination.topic) || destination.partition < 0 {
            return Err(ProtocolError::UndeclaredSink {
                channel: destination,
            });
        }
        let base = match self.stamp_base.take() {
            Some(b) => b,
            None => self.compute_stamp_base(),
        };
        let mut clock = base.clone();
        self.stamp_base = Some(base);
        // Never a claim of our own on the destination itself (an echo of an
        // earlier send there, this incarnation's or a prior one's): the
        // record travels behind those sends on the same channel.
        let me = self.sender;
        clock.retain_sequences(|c| !(c.sender == me && c.channel == destination));
        for (&ch, &seq) in &self.self_claims {
            if ch != destination {
                clock.claim_sequence(ch, self.sender, seq);
            }
        }
        let seq = self.send_seq.get(&destination).map_or(1, |s| s + 1);
        self.send_seq.insert(destination, seq);
        self.send_seq_dirty.insert(destination);
        self.self_claims.insert(destination, seq);
        Ok(CausalHeaders {
            clock,
            sender: Some(SenderTag {
                sender: self.sender,
                seq,
            }),
        })
    }

    /// Removes stamp-side entries (carried ancestry and advertised clocks) at
    /// or below `stability`. Returns how many entries were removed.
    pub fn truncate(&mut self, stability: &VectorClock) -> usize {
        let before = self.stamp_side_len();
        if self.carried.truncate(stability) {
            self.carried_dirty = true;
        }
        for ch in &mut self.channels {
            if ch.advertised.truncate(stability) {
                ch.advertised_dirty = true;
            }
        }
        let removed = before - self.stamp_side_len();
        if removed > 0 {
            self.stamp_base = None;
        }
        removed
    }

    /// The truncation sweep: asks the broker for the log start of every
    /// channel the stamp-side clocks name, truncates below it, and removes
    /// every entry of topics that no longer exist. A failed query changes
    /// nothing and returns the error, so the host can skip this cycle.
    pub fn truncate_to_log_starts(
        &mut self,
        broker: &dyn BrokerOffsets,
    ) -> Result<TruncationReport, ProtocolError> {
        let channels = self.stamp_channels();
        let topics: BTreeSet<TopicId> = channels.iter().map(|c| c.topic).collect();
        if topics.is_empty() {
            return Ok(TruncationReport::default());
        }
        let answers = broker.log_starts(&topics)?;
        let mut stability = VectorClock::new();
        let mut destroyed = Vec::new();
        for &topic in &topics {
            match answer_for(&answers, topic)? {
                TopicOffsets::Absent => destroyed.push(topic),
                TopicOffsets::Present(starts) => {
                    for (&partition, &start) in starts {
                        stability.claim_offset(Channel::new(topic, partition), start - 1);
                    }
                }
            }
        }
        let before = self.stamp_side_len();
        self.truncate(&stability);
        for &topic in &destroyed {
            info!(%topic, "truncating every claim on a topic that no longer exists");
            if self.carried.remove_topic(topic) {
                self.carried_dirty = true;
            }
            for ch in &mut self.channels {
                if ch.advertised.remove_topic(topic) {
                    ch.advertised_dirty = true;
                }
            }
        }
        self.stamp_base = None;
        Ok(TruncationReport {
            entries_removed: before - self.stamp_side_len(),
            destroyed_topics: destroyed,
        })
    }

    /// Every channel named by the stamp-side clocks (carried ancestry and
    /// the advertised clocks): what a truncation sweep must ask about.
    pub fn stamp_channels(&self) -> BTreeSet<Channel> {
        let mut out = BTreeSet::new();
        for clock in
            std::iter::once(&self.carried).chain(self.channels.iter().map(|c| &c.advertised))
        {
            out.extend(clock.offsets().iter().map(|c| c.channel));
            out.extend(clock.sequences().iter().map(|c| c.channel));
        }
        out
    }

    /// The number of offset and sequence entries in the union of the
    /// stamp-side clocks (for the width gauges).
    pub fn stamp_side_width(&self) -> (usize, usize) {
        let mut union = self.carried.clone();
        for ch in &self.channels {
            union.merge(&ch.advertised);
        }
        (union.offsets().len(), union.sequences().len())
    }

    /// Where the host must start fetching channels that joined the scope and
    /// were seeded from the node's past: one past the seed. Other channels
    /// resume from the host's committed positions (or the host's start
    /// policy, for a joining channel the node's past says nothing about).
    pub fn resume_positions(&self) -> &BTreeMap<Channel, i64> {
        &self.resume
    }

    /// Whether the record at `offset` of `channel` was stepped past (see
    /// [`step_past`](Self::step_past)), and where it went.
    pub fn stepped_past(&self, channel: Channel, offset: i64) -> Option<&SteppedPast> {
        self.stepped.get(&channel)?.get(&offset)
    }

    /// Records that the record at `offset` of `channel` is stepped past
    /// instead of delivered: the host hands it to the node no more, so to
    /// the gate it is like an offset the consumer skips (a transaction
    /// marker). Its sender's sequence on the channel is not learned from
    /// it. Persisted with the step, so a restore that meets the record
    /// again steps past it again.
    pub fn step_past(
        &mut self,
        channel: Channel,
        offset: i64,
        stepped: SteppedPast,
    ) -> Result<(), ProtocolError> {
        self.index_of(channel, "step past")?;
        self.pending
            .put(StateKey::Stepped(channel, offset), stepped.encode());
        self.stepped
            .entry(channel)
            .or_default()
            .insert(offset, stepped);
        Ok(())
    }

    /// Every record stepped past, as (channel, offset, where it went).
    pub fn stepped(&self) -> impl Iterator<Item = (Channel, i64, &SteppedPast)> {
        self.stepped
            .iter()
            .flat_map(|(c, m)| m.iter().map(move |(o, s)| (*c, *o, s)))
    }

    /// Everything that changed since the last call (or since init), for the
    /// host to commit with the step's positions and sends. After this call
    /// the node treats those writes as committed; if the host's transaction
    /// aborts instead, it must discard the node and init a new one.
    pub fn take_writes(&mut self) -> WriteBatch {
        let mut batch = std::mem::take(&mut self.pending);
        for ch in &mut self.channels {
            let c = ch.channel;
            if ch.frontier_dirty {
                batch.put_i64(StateKey::Frontier(c), ch.frontier);
                ch.frontier_dirty = false;
            }
            if ch.advertised_dirty {
                batch.put(StateKey::ChannelClock(c), ch.advertised.encode());
                ch.advertised_dirty = false;
            }
            if std::mem::take(&mut ch.skip_dirty) {
                for (&sender, m) in &ch.skip {
                    batch.put_pair(StateKey::SkipMark(c, sender), m.seq, m.bound);
                }
            }
            for sender in std::mem::take(&mut ch.delivered_dirty) {
                if let Some(m) = ch.delivered.get(&sender) {
                    batch.put_pair(StateKey::DeliveredSeq(c, sender), m.seq, m.offset);
                }
            }
            let (head, tail) = (ch.head_index, ch.tail_index());
            if (head, tail) != (ch.committed_head, ch.committed_tail) {
                // Entries that were committed and have since been delivered.
                for index in ch.committed_head..head.min(ch.committed_tail) {
                    batch.delete(StateKey::QueueEntry(c, index));
                }
                // Entries added since and still held. (Entries added and
                // delivered in between were never committed: nothing to do.)
                for index in ch.committed_tail.max(head)..tail {
                    // Records are paged out only once committed, so every
                    // record not yet written is resident.
                    let Some(held) = ch.resident(index) else {
                        debug_assert!(false, "held record {c} #{index} is paged out uncommitted");
                        tracing::error!(channel = %c, index, "held record paged out before it was committed");
                        continue;
                    };
                    batch.put(StateKey::QueueEntry(c, index), encode_envelope(held));
                }
                batch.put_pair(StateKey::QueueMeta(c), head, tail);
                ch.committed_head = head;
                ch.committed_tail = tail;
            }
        }
        if self.carried_dirty {
            batch.put(StateKey::CarriedAncestry, self.carried.encode());
            self.carried_dirty = false;
        }
        for ch in std::mem::take(&mut self.send_seq_dirty) {
            if let Some(&seq) = self.send_seq.get(&ch) {
                batch.put_i64(StateKey::SendSeq(ch), seq);
            }
        }
        // Everything held is in the batch now: what lies beyond the
        // resident window can leave memory.
        self.page_out();
        batch
    }

    /// Keeps at most `window` held records of each hold queue in memory
    /// (at least 1: the head); `None` keeps them all. Records beyond the
    /// window are paged out once they are committed (at
    /// [`take_writes`](Self::take_writes), or now for records restored at
    /// init): the node keeps only their offset and size, and when a queue's
    /// resident records run out before its paged ones, the gate stops on
    /// that queue and [`page_requests`](Self::page_requests) names the
    /// records the host must read back from its store and hand to
    /// [`page_in`](Self::page_in). A request may stay pending while the
    /// host hands the node other calls (a host that bounds what one
    /// transaction releases serves the rest after its commit): the queue
    /// only waits, its frontier held below the paged head, and nothing
    /// queued behind it moves. Diagnostics that look at heads
    /// ([`held_heads`](Self::held_heads),
    /// [`claimed_by_heads`](Self::claimed_by_heads)) do not see a paged
    /// head until it is paged in.
    ///
    /// Returns how many records were paged out now.
    pub fn set_resident_window(&mut self, window: Option<usize>) -> usize {
        self.window = window.map(|w| w.max(1));
        self.page_out()
    }

    /// The resident window (see [`set_resident_window`](Self::set_resident_window)).
    pub fn resident_window(&self) -> Option<usize> {
        self.window
    }

    /// Pages out, on every queue whose records are all committed, what
    /// lies beyond the window.
    fn page_out(&mut self) -> usize {
        let Some(window) = self.window else {
            return 0;
        };
        let mut paged = 0;
        for ch in &mut self.channels {
            if ch.committed_tail >= ch.tail_index() {
                paged += ch.page_out(window);
            }
        }
        self.stats.paged_out_total += paged as u64;
        paged
    }

    /// Whether [`page_requests`](Self::page_requests) would name anything,
    /// without building the list (a host asks on every turn of its loop).
    pub fn pages_wanted(&self) -> bool {
        self.held > 0
            && self
                .channels
                .iter()
                .any(|ch| ch.queue.is_empty() && !ch.paged.is_empty())
    }

    /// The paged-out runs the gate is waiting for: queues whose resident
    /// records ran out while paged ones remain. Empty once the host has
    /// served every request (it may leave some pending for a while; see
    /// [`set_resident_window`](Self::set_resident_window)).
    pub fn page_requests(&self) -> Vec<PageRequest> {
        if self.held == 0 {
            // The in-order path: nothing held, nothing to look through.
            return Vec::new();
        }
        let window = self.window.unwrap_or(usize::MAX).max(1);
        self.channels
            .iter()
            .filter(|ch| ch.queue.is_empty() && !ch.paged.is_empty())
            .map(|ch| PageRequest {
                channel: ch.channel,
                from: ch.head_index,
                count: ch.paged.len().min(window),
            })
            .collect()
    }

    /// Hands back the records of a [`PageRequest`], decoded from the store,
    /// in index order, and releases whatever becomes deliverable (appended
    /// to `out`). Each record must be the one the queue holds at its place
    /// (same offset), or the node refuses it
    /// ([`ProtocolError::PagedRecordMismatch`]) and changes nothing.
    pub fn page_in(
        &mut self,
        channel: Channel,
        records: Vec<InboundRecord>,
        out: &mut Vec<Delivery>,
    ) -> Result<(), ProtocolError> {
        let i = self.index_of(channel, "page in")?;
        let ch = &self.channels[i];
        let fits = ch.queue.is_empty() && records.len() <= ch.paged.len();
        for (at, record) in records.iter().enumerate() {
            let expected = if fits { ch.paged[at].0 } else { -1 };
            if record.offset != expected || record.channel != channel {
                return Err(ProtocolError::PagedRecordMismatch {
                    channel,
                    expected,
                    found: record.offset,
                });
            }
        }
        let ch = &mut self.channels[i];
        let n = records.len();
        for record in records {
            if let Some((_, size)) = ch.paged.pop_front() {
                self.held_bytes = self.held_bytes - size.min(self.held_bytes) + record.held_size();
            }
            ch.queue.push_back(record);
        }
        if ch.paged.is_empty() {
            let back = std::mem::take(&mut ch.back);
            ch.queue.extend(back);
            // The paged run is over: its room goes too.
            if ch.paged.capacity() > KEPT_QUEUE_CAPACITY {
                ch.paged = VecDeque::new();
            }
        }
        self.stats.paged_in_total += n as u64;
        self.cascade(out);
        Ok(())
    }

    /// Held records not resident in memory (paged out), across all queues.
    pub fn paged_count(&self) -> usize {
        self.channels.iter().map(|c| c.paged.len()).sum()
    }

    /// What the paged-out held records take ([`InboundRecord::held_size`]
    /// of each, as they were when paged out), across all queues.
    pub fn paged_bytes(&self) -> usize {
        self.channels
            .iter()
            .flat_map(|c| c.paged.iter().map(|&(_, size)| size))
            .sum()
    }

    /// Every gating queue head with its unmet claims, in channel order.
    pub fn held_heads(&self) -> Vec<HeldHead> {
        let mut out = Vec::new();
        for (i, ch) in self.channels.iter().enumerate() {
            let Some(head) = ch.queue.front() else {
                continue;
            };
            let unmet = self
                .unmet_claims(i, &head.causal.clock)
                .into_iter()
                .map(|c| self.describe(c))
                .collect();
            out.push(HeldHead {
                channel: ch.channel,
                offset: head.offset,
                timestamp: head.timestamp,
                sender: head.causal.sender,
                depth: ch.len(),
                unmet,
            });
        }
        out
    }

    /// The offset of every gating queue head, in channel order: the cheap
    /// form of [`held_heads`](Self::held_heads) for hosts that track how
    /// long each head has been held (it computes no claims).
    pub fn head_offsets(&self) -> impl Iterator<Item = (Channel, i64)> + '_ {
        self.channels
            .iter()
            .filter_map(|ch| ch.head_offset().map(|head| (ch.channel, head)))
    }

    /// The bookkeeping of one consumed channel.
    pub fn channel_view(&self, channel: Channel) -> Option<ChannelView> {
        let i = self
            .channels
            .binary_search_by(|c| c.channel.cmp(&channel))
            .ok()?;
        let ch = &self.channels[i];
        Some(ChannelView {
            channel,
            frontier: ch.frontier,
            position: ch.position,
            held: ch.len(),
            advertised: ch.advertised.clone(),
        })
    }

    /// The delivered frontier of a consumed channel (-1 when nothing is
    /// delivered or skipped yet).
    pub fn frontier(&self, channel: Channel) -> Option<i64> {
        self.index_of(channel, "frontier")
            .ok()
            .map(|i| self.channels[i].frontier)
    }

    /// The highest sequence delivered from `sender` on `channel`.
    pub fn delivered_mark(&self, channel: Channel, sender: SenderId) -> Option<DeliveredMark> {
        self.mark(channel, sender)
    }

    /// Records currently held across all queues.
    pub fn held_count(&self) -> usize {
        self.held
    }

    /// How many decoded records the hold queues have room for without
    /// growing (their capacity, held records included): a drained queue
    /// keeps room for a few, not for what its longest hold needed, and a
    /// queue that paged its records out keeps room for its window.
    pub fn held_capacity(&self) -> usize {
        self.channels
            .iter()
            .map(|c| c.queue.capacity() + c.back.capacity())
            .sum()
    }

    /// How many paged-out records the hold queues have room for without
    /// growing: once a paged run is read back in, a few.
    pub fn paged_capacity(&self) -> usize {
        self.channels.iter().map(|c| c.paged.capacity()).sum()
    }

    /// What the records held across all queues cost, in bytes
    /// ([`InboundRecord::held_size`]).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// What the last record queued on `channel` takes
    /// ([`InboundRecord::held_size`]), if its queue holds any.
    pub fn last_held_size(&self, channel: Channel) -> Option<usize> {
        let i = self.index_of(channel, "held size").ok()?;
        self.channels[i]
            .last_resident()
            .map(InboundRecord::held_size)
    }

    /// The bytes held in one channel's queue (0 for a channel not consumed).
    pub fn channel_held_bytes(&self, channel: Channel) -> usize {
        self.index_of(channel, "held bytes")
            .map_or(0, |i| self.channels[i].held_bytes())
    }

    /// The consumed channels whose queue holds records (whose head is
    /// held), in channel order.
    pub fn held_channels(&self) -> impl Iterator<Item = Channel> + '_ {
        self.channels
            .iter()
            .filter(|c| !c.is_empty())
            .map(|c| c.channel)
    }

    /// The channels some held head's unmet claims point into, in channel
    /// order: the channels whose records held heads are waiting for.
    pub fn claimed_by_heads(&self) -> BTreeSet<Channel> {
        let mut out = BTreeSet::new();
        for (i, ch) in self.channels.iter().enumerate() {
            let Some(head) = ch.queue.front() else {
                continue;
            };
            for claim in self.unmet_claims(i, &head.causal.clock) {
                let idx = match claim {
                    Claim::Offset { idx, .. } | Claim::Seq { idx, .. } => idx,
                };
                out.insert(self.channels[idx].channel);
            }
        }
        out
    }

    /// Whether `clock` claims anything on `channel` this node has not
    /// delivered yet (an offset above its frontier, or a send sequence
    /// beyond what was delivered from that sender).
    pub fn claims_unmet_on(&self, clock: &VectorClock, channel: Channel) -> bool {
        let Ok(idx) = self.index_of(channel, "claims") else {
            return false;
        };
        clock
            .offsets()
            .iter()
            .filter(|c| c.channel == channel)
            .any(|c| {
                !self.satisfied(Claim::Offset {
                    idx,
                    offset: c.offset,
                })
            })
            || clock
                .sequences()
                .iter()
                .filter(|c| c.channel == channel)
                .any(|c| {
                    !self.satisfied(Claim::Seq {
                        idx,
                        sender: c.sender,
                        seq: c.seq,
                    })
                })
    }

    /// Counters since init.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// The node's sender identity.
    pub fn sender(&self) -> SenderId {
        self.sender
    }

    /// The consumed channels, sorted.
    pub fn inputs(&self) -> impl Iterator<Item = Channel> + '_ {
        self.channels.iter().map(|c| c.channel)
    }

    /// The declared sink topics.
    pub fn sinks(&self) -> &BTreeSet<TopicId> {
        &self.sinks
    }

    /// Carried ancestry: the delivered past of channels no longer consumed.
    pub fn carried_ancestry(&self) -> &VectorClock {
        &self.carried
    }

    /// Own outputs: every declared sink's end offset at init.
    pub fn own_outputs(&self) -> &VectorClock {
        &self.own_outputs
    }

    fn index_of(&self, channel: Channel, operation: &'static str) -> Result<usize, ProtocolError> {
        self.channels
            .binary_search_by(|c| c.channel.cmp(&channel))
            .map_err(|_| ProtocolError::UnconsumedChannel { channel, operation })
    }

    fn mark(&self, channel: Channel, sender: SenderId) -> Option<DeliveredMark> {
        match self.channels.binary_search_by(|c| c.channel.cmp(&channel)) {
            Ok(i) => self.channels[i].delivered.get(&sender).copied(),
            Err(_) => self.carried_delivered.get(&channel)?.get(&sender).copied(),
        }
    }

    fn stamp_side_len(&self) -> usize {
        let len = |c: &VectorClock| c.offsets().len() + c.sequences().len();
        len(&self.carried)
            + self
                .channels
                .iter()
                .map(|c| len(&c.advertised))
                .sum::<usize>()
    }

    /// The gate's view of a clock for a record on channel `own`: entries on
    /// the record's own channel are ignored (FIFO already orders them), and
    /// entries on channels this node does not consume are ignored (their
    /// consumed ancestry is claimed directly). What is left and not yet met
    /// is returned.
    fn unmet_claims(&self, own: usize, clock: &VectorClock) -> Vec<Claim> {
        let chans = &self.channels;
        let mut out = Vec::new();
        let mut i = 0;
        for c in clock.offsets() {
            while i < chans.len() && chans[i].channel < c.channel {
                i += 1;
            }
            if i == chans.len() {
                break;
            }
            if chans[i].channel == c.channel && i != own && chans[i].frontier < c.offset {
                out.push(Claim::Offset {
                    idx: i,
                    offset: c.offset,
                });
            }
        }
        let mut i = 0;
        for c in clock.sequences() {
            while i < chans.len() && chans[i].channel < c.channel {
                i += 1;
            }
            if i == chans.len() {
                break;
            }
            if chans[i].channel == c.channel && i != own {
                let claim = Claim::Seq {
                    idx: i,
                    sender: c.sender,
                    seq: c.seq,
                };
                if !self.satisfied(claim) {
                    out.push(claim);
                }
            }
        }
        out
    }

    /// Whether a claim on a consumed channel is met. A sequence claim is met
    /// by a delivery from its sender at or past the sequence, or by a skip
    /// mark: the claimed records were already in the node's past when the
    /// channel joined (the node's own earlier sends among them), so they
    /// are never delivered here.
    fn satisfied(&self, claim: Claim) -> bool {
        match claim {
            Claim::Offset { idx, offset } => self.channels[idx].frontier >= offset,
            Claim::Seq { idx, sender, seq } => {
                let ch = &self.channels[idx];
                ch.delivered.get(&sender).is_some_and(|m| m.seq >= seq)
                    || ch.skip.get(&sender).is_some_and(|m| m.seq >= seq)
            }
        }
    }

    fn describe(&self, claim: Claim) -> UnmetClaim {
        match claim {
            Claim::Offset { idx, offset } => {
                let ch = &self.channels[idx];
                UnmetClaim::Offset {
                    channel: ch.channel,
                    offset,
                    frontier: ch.frontier,
                    received: ch.received(),
                    position: ch.position,
                }
            }
            Claim::Seq { idx, sender, seq } => {
                let ch = &self.channels[idx];
                UnmetClaim::Sequence {
                    channel: ch.channel,
                    sender,
                    seq,
                    delivered: ch.delivered.get(&sender).copied(),
                }
            }
        }
    }

    fn deliver(
        &mut self,
        i: usize,
        record: InboundRecord,
        was_held: bool,
        out: &mut Vec<Delivery>,
    ) {
        let ch = &mut self.channels[i];
        ch.frontier = record.offset;
        ch.frontier_dirty = true;
        if let Some(tag) = record.causal.sender {
            let mark = ch.delivered.entry(tag.sender).or_insert(DeliveredMark {
                seq: tag.seq,
                offset: record.offset,
            });
            if tag.seq >= mark.seq {
                *mark = DeliveredMark {
                    seq: tag.seq,
                    offset: record.offset,
                };
            }
            ch.delivered_dirty.insert(tag.sender);
        }
        self.stamp_base = None;
        self.stats.delivered_total += 1;
        debug!(channel = %record.channel, offset = record.offset, was_held, "record delivered");
        out.push(Delivery { record, was_held });
    }

    /// Releases heads to fixpoint, visiting channels in sorted order. A pass
    /// that delivers anything or folds any frontier forward is followed by
    /// another, since either can satisfy a claim elsewhere.
    fn cascade(&mut self, out: &mut Vec<Delivery>) {
        loop {
            let mut progressed = false;
            for i in 0..self.channels.len() {
                progressed |= self.drain_channel(i, out);
            }
            if !progressed {
                break;
            }
        }
    }

    fn drain_channel(&mut self, i: usize, out: &mut Vec<Delivery>) -> bool {
        let mut progressed = false;
        loop {
            let clean = self.channels[i].clean_prefix();
            if set_frontier(&mut self.channels[i], clean) {
                self.stamp_base = None;
                progressed = true;
            }
            let ch = &mut self.channels[i];
            if ch.queue.is_empty() {
                if !ch.paged.is_empty() {
                    // The head is paged out: the gate goes on with this
                    // queue once the host pages it in (page_requests).
                    break;
                }
                // A drained queue gives back the room a long hold grew it
                // to (a queue of 100k records keeps about 15 MiB otherwise).
                if ch.queue.capacity() > KEPT_QUEUE_CAPACITY {
                    ch.queue = VecDeque::new();
                }
                break;
            }
            let unmet = match ch.head_unmet.take() {
                Some(mut unmet) => {
                    unmet.retain(|c| !self.satisfied(*c));
                    unmet
                }
                None => match self.channels[i].queue.front() {
                    Some(head) => self.unmet_claims(i, &head.causal.clock),
                    None => break,
                },
            };
            if !unmet.is_empty() {
                self.channels[i].head_unmet = Some(unmet);
                break;
            }
            let Some(record) = self.channels[i].queue.pop_front() else {
                break;
            };
            self.channels[i].head_index += 1;
            self.held -= 1;
            self.held_bytes -= record.held_size();
            self.deliver(i, record, true, out);
            progressed = true;
        }
        progressed
    }

    fn compute_stamp_base(&self) -> VectorClock {
        let mut base = VectorClock::from_claims(
            self.channels
                .iter()
                .filter(|c| c.frontier >= 0)
                .map(|c| crate::clock::OffsetClaim {
                    channel: c.channel,
                    offset: c.frontier,
                }),
            std::iter::empty(),
        );
        for ch in &self.channels {
            base.merge(&ch.advertised);
        }
        base.merge(&self.carried);
        base.merge(&self.own_outputs);
        let mut upgrades = Vec::new();
        base.retain_sequences(|c| {
            if let Some(m) = self.mark(c.channel, c.sender)
                && m.seq >= c.seq
            {
                // Resolved here: the claimed records sit at or below the
                // delivered record's offset.
                upgrades.push((c.channel, m.offset));
                return false;
            }
            // An earlier incarnation's own send echoed back through custody.
            // Own outputs (current sinks) or carried ancestry (former sinks)
            // already claim it by offset; a destroyed topic is unclaimable.
            !(c.sender == self.sender
                && self
                    .prior_send_seq
                    .get(&c.channel)
                    .is_some_and(|&p| c.seq <= p))
        });
        for (ch, offset) in upgrades {
            base.claim_offset(ch, offset);
        }
        base
    }
}

/// Raises a channel's frontier; returns whether it moved.
fn set_frontier(ch: &mut ChannelState, to: i64) -> bool {
    if to > ch.frontier {
        ch.frontier = to;
        ch.frontier_dirty = true;
        true
    } else {
        false
    }
}
