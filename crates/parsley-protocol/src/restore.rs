//! Reading a committed protocol store back into typed state, strictly.

use std::collections::{BTreeMap, VecDeque};

use crate::store::SteppedPast;

use crate::clock::VectorClock;
use crate::error::ProtocolError;
use crate::ids::{Channel, SenderId};
use crate::record::InboundRecord;
use crate::store::{
    CorruptState, ScopeRecord, StateKey, StoreRead, decode_envelope, decode_i64, decode_pair,
};

/// The highest send sequence delivered from one sender on one channel, and
/// the offset of that record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DeliveredMark {
    /// The sender's send sequence on the channel.
    pub seq: i64,
    /// The offset of the record that carried it.
    pub offset: i64,
}

/// Records of one sender on a joined input that the node's past already
/// claimed by sequence when the input joined: that sender's records on the
/// channel with a send sequence up to `seq` and an offset below `bound` (the
/// channel's end offset at the join) are skipped, not delivered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SkipMark {
    /// The highest claimed send sequence.
    pub seq: i64,
    /// The channel's end offset when the input joined; nothing at or above
    /// it can have been in the node's past.
    pub bound: i64,
}

/// Everything a committed store holds, parsed and checked for consistency.
#[derive(Default)]
pub(crate) struct Persisted {
    /// The recorded scope and its exact bytes.
    pub(crate) scope: Option<(ScopeRecord, Vec<u8>)>,
    pub(crate) frontiers: BTreeMap<Channel, i64>,
    pub(crate) advertised: BTreeMap<Channel, VectorClock>,
    pub(crate) carried: Option<VectorClock>,
    pub(crate) queue_meta: BTreeMap<Channel, (i64, i64)>,
    /// Held records per channel, in index order; complete for the indices
    /// their metadata claims: the first ones decoded, the rest (beyond the
    /// window [`read`](Self::read) was given) as offset and size only.
    pub(crate) queues: BTreeMap<Channel, RestoredQueue>,
    pub(crate) send_seq: BTreeMap<Channel, i64>,
    pub(crate) delivered: BTreeMap<Channel, BTreeMap<SenderId, DeliveredMark>>,
    /// Skip marks of joined inputs: per sender, (sequence, end bound).
    pub(crate) skips: BTreeMap<Channel, BTreeMap<SenderId, SkipMark>>,
    /// Records stepped past, per channel and offset.
    pub(crate) stepped: BTreeMap<Channel, BTreeMap<i64, SteppedPast>>,
}

/// A held record as a store read gives it: decoded, or (beyond the
/// resident window) checked and kept as its offset and held size only.
pub(crate) enum HeldEntry {
    Resident(InboundRecord),
    Paged(i64, usize),
}

impl HeldEntry {
    fn offset(&self) -> i64 {
        match self {
            HeldEntry::Resident(r) => r.offset,
            HeldEntry::Paged(offset, _) => *offset,
        }
    }
}

type Entries = BTreeMap<Channel, Vec<(i64, HeldEntry)>>;

/// One restored hold queue: its decoded records (the head first), then
/// the offset and held size of each record beyond the window.
pub(crate) type RestoredQueue = (Vec<InboundRecord>, VecDeque<(i64, usize)>);

impl Persisted {
    /// Reads and checks `store`. With a `window`, a held record whose
    /// index lies `window` or more past its queue's head is decoded (so a
    /// damaged one is still refused) and then dropped, keeping only its
    /// offset and size: a start with a million records held then never
    /// has them all decoded at once. (A store that hands a queue's entries
    /// over before its metadata gets them all decoded; the node pages the
    /// excess out right after.)
    pub(crate) fn read(
        store: &dyn StoreRead,
        window: Option<usize>,
    ) -> Result<Persisted, ProtocolError> {
        let mut p = Persisted::default();
        let mut entries: Entries = BTreeMap::new();
        let mut first_error: Option<CorruptState> = None;
        store.for_each_state(&mut |key, value| {
            if first_error.is_some() {
                return;
            }
            let absorbed = match key {
                Ok(key) => p.absorb(key, value, window, &mut entries),
                Err(text) => Err(CorruptState::new(text, "not a protocol state key")),
            };
            if let Err(e) = absorbed {
                first_error = Some(e);
            }
        });
        if let Some(e) = first_error {
            return Err(e.into());
        }
        p.check(entries)?;
        Ok(p)
    }

    fn absorb(
        &mut self,
        parsed: StateKey,
        value: &[u8],
        window: Option<usize>,
        entries: &mut Entries,
    ) -> Result<(), CorruptState> {
        let bad = |reason: String| CorruptState::new(parsed.text().as_str(), reason);
        let clock = |v: &[u8]| VectorClock::decode(v).map_err(|e| bad(e.to_string()));
        match parsed {
            StateKey::Scope => {
                let scope = ScopeRecord::decode(value).map_err(bad)?;
                self.scope = Some((scope, value.to_vec()));
            }
            StateKey::Frontier(c) => {
                self.frontiers.insert(c, decode_i64(value).map_err(bad)?);
            }
            StateKey::ChannelClock(c) => {
                self.advertised.insert(c, clock(value)?);
            }
            StateKey::CarriedAncestry => self.carried = Some(clock(value)?),
            StateKey::QueueMeta(c) => {
                let (head, tail) = decode_pair(value).map_err(bad)?;
                if head > tail {
                    return Err(bad(format!("head index {head} is past tail index {tail}")));
                }
                self.queue_meta.insert(c, (head, tail));
            }
            StateKey::QueueEntry(c, index) => {
                let record = decode_envelope(c, value).map_err(bad)?;
                let beyond = match (window, self.queue_meta.get(&c)) {
                    (Some(w), Some(&(head, _))) => {
                        index.saturating_sub(head) >= i64::try_from(w.max(1)).unwrap_or(i64::MAX)
                    }
                    _ => false,
                };
                let entry = if beyond {
                    HeldEntry::Paged(record.offset, record.held_size())
                } else {
                    HeldEntry::Resident(record)
                };
                entries.entry(c).or_default().push((index, entry));
            }
            StateKey::SendSeq(c) => {
                self.send_seq.insert(c, decode_i64(value).map_err(bad)?);
            }
            StateKey::DeliveredSeq(c, sender) => {
                let (seq, offset) = decode_pair(value).map_err(bad)?;
                self.delivered
                    .entry(c)
                    .or_default()
                    .insert(sender, DeliveredMark { seq, offset });
            }
            StateKey::Stepped(c, offset) => {
                let stepped = SteppedPast::decode(value).map_err(bad)?;
                self.stepped.entry(c).or_default().insert(offset, stepped);
            }
            StateKey::SkipMark(c, sender) => {
                let (seq, bound) = decode_pair(value).map_err(bad)?;
                self.skips
                    .entry(c)
                    .or_default()
                    .insert(sender, SkipMark { seq, bound });
            }
        }
        Ok(())
    }

    /// Cross-key consistency: every per-input key belongs to a recorded
    /// input, and every hold queue is complete and in offset order.
    fn check(&mut self, mut entries: Entries) -> Result<(), ProtocolError> {
        let inputs: Vec<Channel> = match &self.scope {
            Some((scope, _)) => scope.inputs.clone(),
            None => {
                let anything = !self.frontiers.is_empty()
                    || !self.advertised.is_empty()
                    || self.carried.is_some()
                    || !self.queue_meta.is_empty()
                    || !entries.is_empty()
                    || !self.send_seq.is_empty()
                    || !self.delivered.is_empty()
                    || !self.skips.is_empty()
                    || !self.stepped.is_empty();
                if anything {
                    return Err(CorruptState::new(
                        StateKey::Scope,
                        "missing, but the store holds other protocol state",
                    )
                    .into());
                }
                Vec::new()
            }
        };
        let is_input = |c: &Channel| inputs.binary_search(c).is_ok();
        let outside = |key: StateKey| {
            CorruptState::new(key, "state for a channel outside the recorded scope")
        };
        if let Some(c) = self.frontiers.keys().find(|c| !is_input(c)) {
            return Err(outside(StateKey::Frontier(*c)).into());
        }
        if let Some(c) = self.advertised.keys().find(|c| !is_input(c)) {
            return Err(outside(StateKey::ChannelClock(*c)).into());
        }
        if let Some((c, marks)) = self.skips.iter().find(|(c, _)| !is_input(c)) {
            let sender = marks
                .keys()
                .next()
                .copied()
                .unwrap_or(SenderId::from_u128(0));
            return Err(outside(StateKey::SkipMark(*c, sender)).into());
        }
        if let Some((c, offsets)) = self.stepped.iter().find(|(c, _)| !is_input(c)) {
            let offset = offsets.keys().next().copied().unwrap_or(0);
            return Err(outside(StateKey::Stepped(*c, offset)).into());
        }
        if let Some(c) = self.queue_meta.keys().find(|c| !is_input(c)) {
            return Err(outside(StateKey::QueueMeta(*c)).into());
        }
        for (&channel, &(head, tail)) in &self.queue_meta {
            let mut held = entries.remove(&channel).unwrap_or_default();
            // A sorted store hands entries over in index order already.
            if !held.windows(2).all(|w| w[0].0 < w[1].0) {
                held.sort_by_key(|(index, _)| *index);
            }
            if let Some(w) = held.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(CorruptState::new(
                    StateKey::QueueEntry(channel, w[0].0),
                    "held record stored twice",
                )
                .into());
            }
            // Entries outside the window are not ours to interpret.
            if let Some(&(index, _)) = held.iter().find(|(i, _)| *i < head || *i >= tail) {
                return Err(CorruptState::new(
                    StateKey::QueueEntry(channel, index),
                    format!("entry outside the queue's window {head}..{tail}"),
                )
                .into());
            }
            // Within the window, sorted and unique: complete exactly when
            // the i-th entry has index head + i.
            if let Some(missing) = (head..tail).zip(&held).find(|(want, (got, _))| want != got) {
                return Err(ProtocolError::MissingHeldRecords {
                    channel,
                    index: missing.0,
                    head,
                    tail,
                });
            }
            if (held.len() as i64) < tail - head {
                return Err(ProtocolError::MissingHeldRecords {
                    channel,
                    index: head + held.len() as i64,
                    head,
                    tail,
                });
            }
            let frontier = self.frontiers.get(&channel).copied().unwrap_or(-1);
            let mut last = frontier;
            for (index, record) in &held {
                let offset = record.offset();
                if offset <= last {
                    return Err(CorruptState::new(
                        StateKey::QueueEntry(channel, *index),
                        format!(
                            "held offset {offset} is not above the frontier and the previous entry ({last})"
                        ),
                    )
                    .into());
                }
                last = offset;
            }
            // Decoded records first, then the paged run (a record decoded
            // after a paged one joins the run).
            let mut resident = Vec::new();
            let mut paged = VecDeque::new();
            for (_, entry) in held {
                match entry {
                    HeldEntry::Resident(r) if paged.is_empty() => resident.push(r),
                    HeldEntry::Resident(r) => paged.push_back((r.offset, r.held_size())),
                    HeldEntry::Paged(offset, size) => paged.push_back((offset, size)),
                }
            }
            self.queues.insert(channel, (resident, paged));
        }
        if let Some((&channel, held)) = entries.iter().next() {
            let index = held.first().map_or(0, |(i, _)| *i);
            return Err(CorruptState::new(
                StateKey::QueueEntry(channel, index),
                "held record without queue metadata",
            )
            .into());
        }
        Ok(())
    }
}
