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
//!    channel (or [`prepare_send_into`](CausalNode::prepare_send_into), or a
//!    [`StampWriter`](crate::host::StampWriter), for the stamp already
//!    encoded), and send exactly what was stamped.
//! 5. Start through [`CausalNode::init`] from committed state, and seek the
//!    channels in [`resume_positions`](CausalNode::resume_positions).
//! 6. Never start a channel below its log start.
//!
//! # Determinism
//!
//! Everything that can reach deliveries, stamps or stored bytes iterates in
//! sorted order: channels are a sorted vector, every map is a `BTreeMap`.
//! Two nodes fed the same calls produce the same outputs, byte for byte.

mod gate;
mod init;
mod paging;
mod stamp;
mod writes;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tracing::{debug, info};

use crate::broker::{BrokerOffsets, TopicOffsets, answer_for};
use crate::clock::VectorClock;
use crate::error::ProtocolError;
use crate::headers::{CausalHeaders, SenderTag};
use crate::ids::{Channel, SenderId, TopicId};
use crate::record::{Delivery, InboundRecord};
pub use crate::restore::{DeliveredMark, SkipMark};
use crate::restore::{HeldEnvelope, Persisted, StoredRun};
use crate::store::{
    CorruptState, PageBuilder, PageEntries, ScopeRecord, StateKey, SteppedPast, StoreRead,
    WriteBatch, decode_envelope,
};

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
/// go on: the records at queue indices `from..from + count` of `channel`.
/// The host reads the values of [`keys`](Self::keys) from its committed
/// store, turns them into records with [`decode`](Self::decode), and hands
/// those to [`CausalNode::page_in`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PageRequest {
    /// The channel.
    pub channel: Channel,
    /// The queue index of the first record wanted (the head's).
    pub from: i64,
    /// How many records, in index order.
    pub count: usize,
    /// Where they are stored: one page ([`StateKey::QueuePage`], which may
    /// start below `from` and end past the request), or (state written
    /// before pages) one [`StateKey::QueueEntry`] per record, from `from`.
    pub stored: StateKey,
}

impl PageRequest {
    /// The store keys holding the wanted records, in index order.
    pub fn keys(&self) -> PageKeys {
        match self.stored {
            StateKey::QueueEntry(channel, from) => PageKeys {
                key: StateKey::QueueEntry(channel, from),
                left: self.count,
            },
            page => PageKeys {
                key: page,
                left: usize::from(self.count > 0),
            },
        }
    }

    /// Appends to `out`, in index order, the wanted records `value` (the
    /// stored value of `key`, one of [`keys`](Self::keys)) holds.
    pub fn decode(
        &self,
        key: StateKey,
        value: &[u8],
        out: &mut Vec<InboundRecord>,
    ) -> Result<(), CorruptState> {
        let bad = |reason: String| CorruptState::new(key, reason);
        match key {
            StateKey::QueueEntry(channel, _) => {
                out.push(decode_envelope(channel, value).map_err(bad)?);
            }
            StateKey::QueuePage(channel, first) => {
                let entries = PageEntries::new(value).map_err(bad)?;
                let total = entries.len();
                let skip = usize::try_from(self.from - first)
                    .map_err(|_| bad(format!("page starts past index {}", self.from)))?;
                if skip + self.count > total {
                    return Err(bad(format!(
                        "page of {total} records lacks index {}",
                        first + total as i64
                    )));
                }
                for entry in entries.skip(skip).take(self.count) {
                    out.push(decode_envelope(channel, entry).map_err(bad)?);
                }
            }
            other => return Err(bad(format!("{other} does not hold held records"))),
        }
        Ok(())
    }
}

/// The keys of a [`PageRequest`] (see [`PageRequest::keys`]).
#[derive(Clone, Debug)]
pub struct PageKeys {
    key: StateKey,
    left: usize,
}

impl Iterator for PageKeys {
    type Item = StateKey;

    fn next(&mut self) -> Option<StateKey> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let key = self.key;
        if let StateKey::QueueEntry(c, i) = key {
            self.key = StateKey::QueueEntry(c, i + 1);
        }
        Some(key)
    }
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
    /// The held records, in index order, as four runs: `restored`
    /// (resident records read back from the store at init, kept as their
    /// envelopes until released), `queue` (resident records as the host
    /// handed them over or paged them in), `paged` (committed records
    /// beyond the resident window, kept only as offset and size; the host
    /// reads them back from its store by index), and `back` (resident
    /// records queued after a paged run). Only a start fills `restored`,
    /// and it only shrinks after, so whatever arrives later queues behind
    /// it. `back` is empty whenever `paged` is.
    restored: VecDeque<HeldEnvelope>,
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
    /// Where the committed held records are stored, in index order (runs
    /// the head has passed stay until the next `take_writes` deletes them).
    stored: VecDeque<StoredRun>,
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
            restored: VecDeque::new(),
            queue: VecDeque::new(),
            paged: VecDeque::new(),
            back: VecDeque::new(),
            head_unmet: None,
            head_index: 0,
            committed_head: 0,
            committed_tail: 0,
            stored: VecDeque::new(),
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
        self.restored.len() + self.queue.len() + self.paged.len() + self.back.len()
    }

    fn is_empty(&self) -> bool {
        self.restored.is_empty() && self.queue.is_empty() && self.paged.is_empty()
    }

    /// Whether no held record is resident ahead of the paged run: the
    /// gate waits on the host to page the head in.
    fn head_paged(&self) -> bool {
        self.restored.is_empty() && self.queue.is_empty() && !self.paged.is_empty()
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
            .or_else(|| self.restored.back().map(|r| r.offset))
    }

    /// The held size of the last record queued, when it is resident.
    fn last_resident_size(&self) -> Option<usize> {
        if self.paged.is_empty() {
            self.queue
                .back()
                .map(InboundRecord::held_size)
                .or_else(|| self.restored.back().map(HeldEnvelope::held_size))
        } else {
            self.back.back().map(InboundRecord::held_size)
        }
    }

    /// The offset of the head, resident or (for a moment, until the host
    /// pages it in) paged.
    fn head_offset(&self) -> Option<i64> {
        self.restored
            .front()
            .map(|r| r.offset)
            .or_else(|| self.queue.front().map(|r| r.offset))
            .or_else(|| self.paged.front().map(|&(o, _)| o))
    }

    /// The resident head, decoded if it is kept as its envelope (`None`
    /// for an envelope that does not decode, which restore's checks rule
    /// out; the gate refuses such a head when it reaches it).
    fn head_record(&self) -> Option<Cow<'_, InboundRecord>> {
        match self.restored.front() {
            Some(env) => env.decode(self.channel).ok().map(Cow::Owned),
            None => self.queue.front().map(Cow::Borrowed),
        }
    }

    /// Queues a record behind everything held.
    fn push(&mut self, record: InboundRecord) {
        if self.paged.is_empty() {
            self.queue.push_back(record);
        } else {
            self.back.push_back(record);
        }
    }

    /// The held record at queue index `index`, if it is resident as the
    /// host handed it over (`None` for a restored one, which is committed
    /// and so never written again).
    fn resident(&self, index: i64) -> Option<&InboundRecord> {
        let mut at = usize::try_from(index - self.head_index).ok()?;
        at = at.checked_sub(self.restored.len())?;
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
        self.restored
            .iter()
            .map(HeldEnvelope::held_size)
            .sum::<usize>()
            + self
                .queue
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
            if self.restored.len() > window {
                for r in self.restored.drain(window..) {
                    self.paged.push_back((r.offset, r.held_size()));
                }
                self.restored.shrink_to_fit();
            }
            let window = window.saturating_sub(self.restored.len());
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
    stamp_base: StampBase,
    /// Records stepped past instead of delivered, per channel and offset.
    stepped: BTreeMap<Channel, BTreeMap<i64, SteppedPast>>,
    stats: NodeStats,
    /// Held records kept resident per queue (`None`: all of them).
    window: Option<usize>,
}

/// The part of every stamp that does not depend on the destination, kept
/// between sends until the node's state moves, and the clock each stamp is
/// put together in. Both keep their room from one stamp to the next, so
/// once they have grown to the stamps' width a stamp allocates nothing of
/// its own.
#[derive(Clone, Debug, Default)]
struct StampBase {
    /// Whether `clock` is the base of the node's current state. Whatever
    /// moves what the base reads (a record received or delivered, a
    /// position report, a truncation sweep) clears it.
    fresh: bool,
    /// The base: frontiers, advertised clocks, carried ancestry and own
    /// outputs, with resolvable sequence claims turned into offsets.
    clock: VectorClock,
    /// The stamp under construction: the base with the destination's own
    /// echo left out and this incarnation's other sends claimed.
    stamp: VectorClock,
    /// Sequence claims resolved to offsets while the base is computed.
    upgrades: Vec<(Channel, i64)>,
}

impl CausalNode {
    /// Where the host must start fetching channels that joined the scope and
    /// were seeded from the node's past: one past the seed. Other channels
    /// resume from the host's committed positions (or the host's start
    /// policy, for a joining channel the node's past says nothing about).
    pub fn resume_positions(&self) -> &BTreeMap<Channel, i64> {
        &self.resume
    }

    /// What `clock` claims on the channels this node consumes that it has
    /// not delivered yet: the causes a read of this node's state must wait
    /// for to include them. Claims on channels it does not consume are not
    /// its to wait for.
    pub fn unmet(&self, clock: &VectorClock) -> Vec<UnmetClaim> {
        // No channel is the clock's own: every consumed channel counts.
        self.unmet_claims(usize::MAX, clock)
            .into_iter()
            .map(|c| self.describe(c))
            .collect()
    }

    /// Every gating queue head with its unmet claims, in channel order.
    pub fn held_heads(&self) -> Vec<HeldHead> {
        let mut out = Vec::new();
        for (i, ch) in self.channels.iter().enumerate() {
            let Some(head) = ch.head_record() else {
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

    /// How many held records (decoded, or restored envelopes) the hold
    /// queues have room for without
    /// growing (their capacity, held records included): a drained queue
    /// keeps room for a few, not for what its longest hold needed, and a
    /// queue that paged its records out keeps room for its window.
    pub fn held_capacity(&self) -> usize {
        self.channels
            .iter()
            .map(|c| c.restored.capacity() + c.queue.capacity() + c.back.capacity())
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
        self.channels[i].last_resident_size()
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
            let Some(head) = ch.head_record() else {
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
}
