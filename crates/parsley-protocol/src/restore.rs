//! Reading a committed protocol store back into typed state, strictly.

use std::collections::{BTreeMap, VecDeque};

use crate::store::SteppedPast;

use crate::clock::VectorClock;
use crate::error::ProtocolError;
use crate::ids::{Channel, SenderId};
use crate::record::InboundRecord;
use crate::store::{
    CorruptState, PageEntries, ScopeRecord, StateKey, StoreRead, check_envelope, decode_envelope,
    decode_i64, decode_pair,
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

/// A run of committed held records as the store keeps them: queue indices
/// `first..end`, under one page key, or (restored from state written before
/// pages) under one entry key per index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct StoredRun {
    pub(crate) first: i64,
    pub(crate) end: i64,
    pub(crate) page: bool,
}

/// A held record read back from the store, kept as its envelope: checked
/// when read (so a damaged one is refused at restore, as before), decoded
/// only when it is released or a diagnostic asks for it. One allocation,
/// the envelope's, instead of the decoded record's key, value, clock and
/// headers.
#[derive(Debug)]
pub(crate) struct HeldEnvelope {
    pub(crate) offset: i64,
    /// The decoded record's [`InboundRecord::held_size`]: hold budgets
    /// count a record the same whichever form it is kept in, so what a
    /// queue weighs never depends on whether a restart or a page-in came
    /// in between.
    held_size: usize,
    bytes: Box<[u8]>,
}

impl HeldEnvelope {
    /// Checks `bytes` as an envelope and keeps them.
    pub(crate) fn read(bytes: &[u8]) -> Result<HeldEnvelope, String> {
        let (offset, held_size) = check_envelope(bytes)?;
        Ok(HeldEnvelope {
            offset,
            held_size,
            bytes: bytes.into(),
        })
    }

    /// What the record counts for in hold budgets (see `held_size`).
    pub(crate) fn held_size(&self) -> usize {
        self.held_size
    }

    /// The record, for `channel`. The envelope was checked when read, so
    /// this fails only if the store's checks and its decoder disagree; the
    /// caller refuses to go on rather than guess.
    pub(crate) fn decode(&self, channel: Channel) -> Result<InboundRecord, CorruptState> {
        decode_envelope(channel, &self.bytes).map_err(|reason| {
            CorruptState::new(
                format_args!("held record {channel}@{}", self.offset),
                reason,
            )
        })
    }
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
    /// their metadata claims: the first ones as their checked envelopes,
    /// the rest (beyond the window [`read`](Self::read) was given) as
    /// offset and size only.
    pub(crate) queues: BTreeMap<Channel, RestoredQueue>,
    /// The pages read, per channel: first index and one past the last.
    pub(crate) pages: BTreeMap<Channel, Vec<(i64, i64)>>,
    pub(crate) send_seq: BTreeMap<Channel, i64>,
    pub(crate) delivered: BTreeMap<Channel, BTreeMap<SenderId, DeliveredMark>>,
    /// Skip marks of joined inputs: per sender, (sequence, end bound).
    pub(crate) skips: BTreeMap<Channel, BTreeMap<SenderId, SkipMark>>,
    /// Records stepped past, per channel and offset.
    pub(crate) stepped: BTreeMap<Channel, BTreeMap<i64, SteppedPast>>,
}

/// A held record as a store read gives it: checked and kept as its
/// envelope, or (beyond the resident window) as its offset and held size
/// only.
pub(crate) enum HeldEntry {
    Resident(HeldEnvelope),
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

/// Held records read so far, per channel: index, record, and the first
/// index of the page that holds it (`None`: an entry key of its own).
type Entries = BTreeMap<Channel, Vec<(i64, HeldEntry, Option<i64>)>>;

/// One restored hold queue.
#[derive(Default)]
pub(crate) struct RestoredQueue {
    /// Its resident records as their envelopes, the head first.
    pub(crate) resident: Vec<HeldEnvelope>,
    /// The offset and held size of each record beyond the window.
    pub(crate) paged: VecDeque<(i64, usize)>,
    /// Where its records are stored, in index order.
    pub(crate) stored: VecDeque<StoredRun>,
}

impl Persisted {
    /// Reads and checks `store`. Every held record's envelope is checked
    /// (so a damaged one is refused) but none is decoded. With a `window`,
    /// a held record whose index lies `window` or more past its queue's
    /// head is then dropped, keeping only its offset and size: a start
    /// with a million records held never keeps them all at once. (A store
    /// that hands a queue's entries over before its metadata gets them all
    /// kept; the node pages the excess out right after.)
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
                let record = HeldEnvelope::read(value).map_err(bad)?;
                let entry = self.held_entry(c, index, window, record);
                entries.entry(c).or_default().push((index, entry, None));
            }
            StateKey::QueuePage(c, first) => {
                let page = PageEntries::new(value).map_err(bad)?;
                let count = page.len() as i64;
                let end = first
                    .checked_add(count)
                    .ok_or_else(|| bad("page indices overflow".to_owned()))?;
                self.pages.entry(c).or_default().push((first, end));
                let head = self.queue_meta.get(&c).map(|&(head, _)| head);
                let held = entries.entry(c).or_default();
                for (index, bytes) in (first..end).zip(page) {
                    // Released already: the page stays until all of its
                    // records are.
                    if head.is_some_and(|head| index < head) {
                        continue;
                    }
                    let record = HeldEnvelope::read(bytes)
                        .map_err(|reason| bad(format!("record {index}: {reason}")))?;
                    let entry = self.held_entry(c, index, window, record);
                    held.push((index, entry, Some(first)));
                }
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

    /// A held record as restore keeps it: its envelope, or (`window` or
    /// more past its queue's head) its offset and size only.
    fn held_entry(
        &self,
        c: Channel,
        index: i64,
        window: Option<usize>,
        record: HeldEnvelope,
    ) -> HeldEntry {
        let beyond = match (window, self.queue_meta.get(&c)) {
            (Some(w), Some(&(head, _))) => {
                index.saturating_sub(head) >= i64::try_from(w.max(1)).unwrap_or(i64::MAX)
            }
            _ => false,
        };
        if beyond {
            HeldEntry::Paged(record.offset, record.held_size())
        } else {
            HeldEntry::Resident(record)
        }
    }

    /// Cross-key consistency: every per-input key belongs to a recorded
    /// input, and every hold queue is complete and in offset order.
    fn check(&mut self, mut entries: Entries) -> Result<(), ProtocolError> {
        self.check_scope(entries.is_empty())?;
        let metas: Vec<(Channel, (i64, i64))> =
            self.queue_meta.iter().map(|(c, m)| (*c, *m)).collect();
        for (channel, (head, tail)) in metas {
            let held = entries.remove(&channel).unwrap_or_default();
            let pages = self.pages.remove(&channel).unwrap_or_default();
            let queue = self.check_queue(channel, head, tail, held, pages)?;
            self.queues.insert(channel, queue);
        }
        if let Some((&channel, held)) = entries.iter().next() {
            let key = match held.first() {
                Some(&(_, _, Some(first))) => StateKey::QueuePage(channel, first),
                Some(&(index, _, None)) => StateKey::QueueEntry(channel, index),
                None => StateKey::QueuePage(channel, 0),
            };
            return Err(CorruptState::new(key, "held record without queue metadata").into());
        }
        Ok(())
    }

    /// Every per-input key belongs to a recorded input; without a scope,
    /// nothing else may be stored. `no_entries`: no held record is stored.
    fn check_scope(&self, no_entries: bool) -> Result<(), ProtocolError> {
        let inputs: Vec<Channel> = match &self.scope {
            Some((scope, _)) => scope.inputs.clone(),
            None => {
                let anything = !self.frontiers.is_empty()
                    || !self.advertised.is_empty()
                    || self.carried.is_some()
                    || !self.queue_meta.is_empty()
                    || !no_entries
                    || !self.pages.is_empty()
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
        Ok(())
    }

    /// One hold queue, checked complete and in offset order within its
    /// window `head..tail`, with its pages; returns it as restored.
    fn check_queue(
        &self,
        channel: Channel,
        head: i64,
        tail: i64,
        mut held: Vec<(i64, HeldEntry, Option<i64>)>,
        pages: Vec<(i64, i64)>,
    ) -> Result<RestoredQueue, ProtocolError> {
        // A page is kept while some of its records are held, and holds
        // no index the queue never handed out.
        if let Some(&(first, end)) = pages.iter().find(|&&(_, end)| end <= head || end > tail) {
            return Err(CorruptState::new(
                StateKey::QueuePage(channel, first),
                format!("page of indices {first}..{end} outside the queue's window {head}..{tail}"),
            )
            .into());
        }
        // Records of a page below the head were released already.
        held.retain(|(index, _, page)| page.is_none() || *index >= head);
        // A sorted store hands entries over in index order already.
        if !held.windows(2).all(|w| w[0].0 < w[1].0) {
            held.sort_by_key(|(index, _, _)| *index);
        }
        let key_of = |index: i64, page: Option<i64>| match page {
            Some(first) => StateKey::QueuePage(channel, first),
            None => StateKey::QueueEntry(channel, index),
        };
        if let Some(w) = held.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CorruptState::new(
                key_of(w[1].0, w[1].2),
                format!("held record {} stored twice", w[0].0),
            )
            .into());
        }
        // Entries outside the window are not ours to interpret.
        if let Some(&(index, _, page)) = held.iter().find(|(i, _, _)| *i < head || *i >= tail) {
            return Err(CorruptState::new(
                key_of(index, page),
                format!("entry outside the queue's window {head}..{tail}"),
            )
            .into());
        }
        // Within the window, sorted and unique: complete exactly when
        // the i-th entry has index head + i.
        if let Some(missing) = (head..tail)
            .zip(&held)
            .find(|(want, (got, _, _))| want != got)
        {
            return Err(ProtocolError::MissingHeldRecords {
                channel,
                index: missing.0,
                head,
                tail,
            });
        }
        if (held.len() as i64) < tail.saturating_sub(head) {
            return Err(ProtocolError::MissingHeldRecords {
                channel,
                index: head + held.len() as i64,
                head,
                tail,
            });
        }
        let frontier = self.frontiers.get(&channel).copied().unwrap_or(-1);
        let mut last = frontier;
        for (index, record, page) in &held {
            let offset = record.offset();
            if offset <= last {
                return Err(CorruptState::new(
                    key_of(*index, *page),
                    format!(
                        "held offset {offset} is not above the frontier and the previous entry ({last})"
                    ),
                )
                .into());
            }
            last = offset;
        }
        let stored = stored_runs(&pages, &held);
        // Resident records first, then the paged run (a record kept
        // after a paged one joins the run).
        let mut queue = RestoredQueue {
            stored: stored.into(),
            ..RestoredQueue::default()
        };
        for (_, entry, _) in held {
            match entry {
                HeldEntry::Resident(r) if queue.paged.is_empty() => queue.resident.push(r),
                HeldEntry::Resident(r) => queue.paged.push_back((r.offset, r.held_size())),
                HeldEntry::Paged(offset, size) => queue.paged.push_back((offset, size)),
            }
        }
        Ok(queue)
    }
}

/// Where a queue's records are stored: each page whole, and runs of
/// consecutive entries of the older layout, in index order.
fn stored_runs(pages: &[(i64, i64)], held: &[(i64, HeldEntry, Option<i64>)]) -> Vec<StoredRun> {
    let mut stored: Vec<StoredRun> = pages
        .iter()
        .map(|&(first, end)| StoredRun {
            first,
            end,
            page: true,
        })
        .collect();
    let mut entry_run: Option<StoredRun> = None;
    for &(index, _, page) in held {
        if page.is_some() {
            continue;
        }
        match entry_run.as_mut() {
            Some(run) if run.end == index => run.end += 1,
            _ => {
                stored.extend(entry_run.take());
                entry_run = Some(StoredRun {
                    first: index,
                    end: index + 1,
                    page: false,
                });
            }
        }
    }
    stored.extend(entry_run);
    stored.sort_by_key(|r| r.first);
    stored
}
