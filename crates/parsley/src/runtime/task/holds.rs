//! What a task holds: the resident window, releases paced per transaction,
//! pages read back from the local store, and the gauges and claims the
//! worker's backpressure reads.

use parsley_protocol::store::{CorruptState, decode_envelope};

use super::*;

/// A task's holds as its gauges and the worker's backpressure see them:
/// since when each queue's head is held, the budget and the release cap,
/// and the channels paused for the budget with the claims that arrived on
/// them. Private to this file but for a few methods.
#[derive(Debug, Default)]
pub(super) struct Holds {
    /// Each held queue's head and when it became the head.
    tracks: BTreeMap<Channel, HoldTrack>,
    /// The most one held record may take, in bytes, if bounded.
    budget: Option<usize>,
    /// Held records a release may page in per transaction (`None`: no
    /// bound); the rest wait for the next one.
    release_cap: Option<usize>,
    /// Held records paged in since the last transaction was handed over.
    paged_in: usize,
    /// Channels whose fetching is paused for the hold budget: an arriving
    /// record with an unmet claim on one of them is noted in
    /// `arrival_claims`, for the host core to resume it.
    watched: Vec<Channel>,
    arrival_claims: Vec<Channel>,
}

impl Holds {
    /// The most one held record may take, if bounded.
    pub(super) fn budget(&self) -> Option<usize> {
        self.budget
    }

    /// A transaction was handed over: the release cap counts afresh.
    pub(super) fn handed_over(&mut self) {
        self.paged_in = 0;
    }

    /// Whether a held head has waited `threshold` by `now` without a
    /// warning yet.
    pub(super) fn warning_due(&self, now: i64, threshold: i64) -> bool {
        self.tracks
            .values()
            .any(|h| !h.warned && now - h.since >= threshold)
    }

    /// Marks `channel`'s head warned about; whether it was not before.
    pub(super) fn mark_warned(&mut self, channel: Channel) -> bool {
        match self.tracks.get_mut(&channel) {
            Some(track) if !track.warned => {
                track.warned = true;
                true
            }
            _ => false,
        }
    }

    /// Notes the watched channels an arriving record has an unmet claim
    /// on (`unmet` says which).
    pub(super) fn note_claims(&mut self, unmet: impl Fn(Channel) -> bool) {
        for &w in &self.watched {
            if unmet(w) {
                self.arrival_claims.push(w);
            }
        }
    }
}

impl Task {
    /// Bounds what one held record may take ([`InboundRecord::held_size`]):
    /// a record larger than `budget` that has to wait fails the task with
    /// [`TaskError::HoldBudget`]. `None` (the default) sets no bound.
    pub fn set_hold_budget(&mut self, budget: Option<usize>) {
        self.holds.budget = budget;
    }

    /// Keeps at most `window` held records of each hold queue in the
    /// node's memory (`None`: all of them). The rest stay in the task's
    /// committed protocol store, where every held record is written at
    /// commit, and are read back in order as the gate reaches them (see
    /// [`CausalNode::set_resident_window`]). Returns how many records left
    /// memory now (restored holds beyond the window).
    pub fn set_hold_window(&mut self, window: Option<usize>) -> usize {
        self.node.set_resident_window(window)
    }

    /// Hands `deliveries` to the logic, in order, then serves the node's
    /// page requests (from the transaction in flight, the committed
    /// protocol store, or the local store) and hands over what each page
    /// releases, until the node asks for nothing more. A page's records
    /// reach the logic before the next page is read, so a release of a
    /// million held records never has them all decoded at once. A held
    /// record the stores do not have, or that does not decode, fails the
    /// task: it is never skipped.
    ///
    /// With a release cap ([`set_release_cap`](Self::set_release_cap)),
    /// it stops paging in once the open transaction has paged in that
    /// many records: the queues wait, and the host resumes the release
    /// after the commit ([`resume_release`](Self::resume_release)).
    pub(super) fn release(&mut self, deliveries: &mut Vec<Delivery>) -> Result<(), TaskError> {
        loop {
            for d in deliveries.drain(..) {
                self.process(d)?;
            }
            if self.release_full() {
                return Ok(());
            }
            let requests = self.node.page_requests();
            if requests.is_empty() {
                return Ok(());
            }
            for request in requests {
                let records = self.read_paged(request)?;
                self.holds.paged_in += records.len();
                self.node
                    .page_in(request.channel, records, deliveries)
                    .map_err(|e| self.protocol(e))?;
            }
        }
    }

    fn release_full(&self) -> bool {
        self.holds
            .release_cap
            .is_some_and(|cap| self.holds.paged_in >= cap)
    }

    /// Bounds how many held records a release pages in per transaction
    /// (`None`, the default: no bound). A release larger than that goes
    /// out over several transactions, each carrying its share of the
    /// deliveries and of the deletes of the records released, instead of
    /// one transaction of them all.
    pub fn set_release_cap(&mut self, cap: Option<usize>) {
        self.holds.release_cap = cap.map(|c| c.max(1));
        self.stores.release_cap = self.holds.release_cap;
    }

    /// Whether a release stopped at the cap and waits for the next
    /// transaction ([`resume_release`](Self::resume_release)).
    pub fn release_waiting(&self) -> bool {
        self.release_full() && self.node.pages_wanted()
    }

    /// Whether a release waits for held records to be paged in and the
    /// open transaction has room for them
    /// ([`resume_release`](Self::resume_release) would go on).
    pub fn release_resumable(&self) -> bool {
        !self.release_full() && self.node.pages_wanted()
    }

    /// Goes on with a release that stopped at the cap, once the open
    /// transaction has been handed over. Returns whether it did (false when
    /// none waits, or the open transaction is full already).
    pub fn resume_release(&mut self) -> Result<bool, TaskError> {
        if !self.release_resumable() {
            return Ok(false);
        }
        self.guarded(|t| {
            t.release(&mut Vec::new())?;
            t.refresh_holds();
            Ok(())
        })?;
        Ok(true)
    }

    /// The held records of a page request: each key's value from the
    /// transaction in flight, the committed store, or (once it left memory)
    /// the local store. A page is one key; state written before pages has
    /// one key per record, read from the local store in one range.
    fn read_paged(&self, request: PageRequest) -> Result<Vec<InboundRecord>, TaskError> {
        let channel = request.channel;
        let to = request.from.saturating_add(request.count as i64);
        let corrupt = |e: CorruptState| self.protocol(ProtocolError::CorruptState(e));
        let missing = |key: StateKey| {
            let index = match key {
                StateKey::QueueEntry(_, index) => index,
                _ => request.from,
            };
            self.protocol(ProtocolError::MissingHeldRecords {
                channel,
                index,
                head: request.from,
                tail: to,
            })
        };
        let local_failure = |cause| TaskError::LocalStore {
            task: self.id.clone(),
            cause,
        };
        let in_memory =
            |key: StateKey| match self.in_flight.as_ref().and_then(|f| f.protocol.get(key)) {
                Some(written) => written,
                None => self.stores.protocol.get_state(key),
            };
        if let StateKey::QueuePage(..) = request.stored {
            let mut records = Vec::with_capacity(request.count);
            let key = request.stored;
            match in_memory(key) {
                Some(bytes) => request.decode(key, bytes, &mut records).map_err(corrupt)?,
                None => {
                    let mut found = None;
                    self.stores
                        .held
                        .read(channel, request.from, to, &mut |k, bytes| {
                            if k == key {
                                found = Some(request.decode(key, bytes, &mut records));
                            }
                        })
                        .map_err(local_failure)?;
                    found.ok_or_else(|| missing(key))?.map_err(corrupt)?;
                }
            }
            return Ok(records);
        }
        // One key per record: those still in memory first, the rest from
        // the local store in one range read.
        let decode_entry = |index: i64, bytes: &[u8]| {
            decode_envelope(channel, bytes).map_err(|reason| {
                corrupt(CorruptState {
                    key: StateKey::QueueEntry(channel, index).to_key(),
                    reason,
                })
            })
        };
        let mut slots: Vec<Option<InboundRecord>> = Vec::with_capacity(request.count);
        let mut first_missing = None;
        for (index, key) in (request.from..).zip(request.keys()) {
            match in_memory(key) {
                Some(bytes) => slots.push(Some(decode_entry(index, bytes)?)),
                None => {
                    first_missing.get_or_insert(index);
                    slots.push(None);
                }
            }
        }
        if let Some(start) = first_missing {
            let mut failed = None;
            self.stores
                .held
                .read(channel, start, to, &mut |key, bytes| {
                    let StateKey::QueueEntry(_, index) = key else {
                        return;
                    };
                    if failed.is_some() {
                        return;
                    }
                    let Some(slot) = usize::try_from(index - request.from)
                        .ok()
                        .and_then(|at| slots.get_mut(at))
                    else {
                        return;
                    };
                    if slot.is_none() {
                        match decode_entry(index, bytes) {
                            Ok(r) => *slot = Some(r),
                            Err(e) => failed = Some(e),
                        }
                    }
                })
                .map_err(local_failure)?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        slots
            .into_iter()
            .zip(request.keys())
            .map(|(r, key)| r.ok_or_else(|| missing(key)))
            .collect()
    }

    /// The channels whose fetching the host paused for the hold budget:
    /// from now on, the channels among them an arriving record has an
    /// unmet claim on are noted ([`take_arrival_claims`](Self::take_arrival_claims)).
    pub fn watch(&mut self, channels: impl IntoIterator<Item = Channel>) {
        self.holds.watched.clear();
        self.holds.watched.extend(channels);
    }

    /// The watched channels records handed over since the last call have
    /// unmet claims on, sorted, without repeats.
    pub fn take_arrival_claims(&mut self) -> Vec<Channel> {
        let mut out = std::mem::take(&mut self.holds.arrival_claims);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Lets the held records the local store now holds leave memory (the
    /// host calls it when idle too: an eviction otherwise waits for the
    /// task's next commit).
    pub fn evict_held(&mut self) {
        let TaskStores { held, protocol, .. } = &mut self.stores;
        held.evict(protocol);
    }

    /// Stops reading held records from the local store (see
    /// [`TaskStores::detach_held`]).
    pub fn detach_held(&mut self) {
        self.stores.detach_held();
    }

    /// What `clock` claims on this task's inputs that it has not delivered
    /// yet, in the words of the hold diagnostics (nothing for no clock).
    pub fn unmet_causes(&self, clock: Option<&parsley_protocol::VectorClock>) -> Vec<WaitingOn> {
        let Some(clock) = clock else {
            return Vec::new();
        };
        let name = |c: Channel| self.topic_name(c.topic);
        self.node
            .unmet(clock)
            .into_iter()
            .map(|u| WaitingOn::from_unmet(u, name))
            .collect()
    }

    /// The committed state in fold slot `key` (a transaction's writes join
    /// the committed store when its commit is reported).
    pub fn committed_state(
        &self,
        key: &crate::fold::FoldKey,
    ) -> Option<std::borrow::Cow<'_, [u8]>> {
        self.stores.fold.get(key)
    }

    /// Every record gating a channel of this task, with what it waits for,
    /// longest-held first.
    pub fn held(&self) -> Vec<HeldRecord> {
        let mut held: Vec<HeldRecord> =
            self.held_by_channel().into_iter().map(|(_, h)| h).collect();
        crate::holds::sort_longest_first(&mut held);
        held
    }

    pub(super) fn held_by_channel(&self) -> Vec<(Channel, HeldRecord)> {
        let name = |c: Channel| self.topic_name(c.topic);
        self.node
            .held_heads()
            .into_iter()
            .map(|h| {
                let channel = h.channel;
                let since = self
                    .holds
                    .tracks
                    .get(&h.channel)
                    .filter(|t| t.offset == h.offset)
                    .map_or(self.wall_clock, |t| t.since);
                let held = HeldRecord {
                    stage: self.id.stage.clone(),
                    task_partition: self.id.partition,
                    coordinate: Coordinate::new(name(h.channel), h.channel.partition, h.offset),
                    timestamp: h.timestamp,
                    held_for_ms: self.wall_clock - since,
                    queue_depth: h.depth,
                    waiting_on: h
                        .unmet
                        .into_iter()
                        .map(|u| WaitingOn::from_unmet(u, name))
                        .collect(),
                };
                (channel, held)
            })
            .collect()
    }

    /// The hold gauges: records held, the oldest head's age, and per source
    /// channel (in topic order) its held count and its head's age.
    pub(crate) fn hold_gauges(&self) -> HoldGauges {
        let mut channels: Vec<(String, usize, i64)> = self
            .inputs
            .iter()
            .map(|i| {
                let held = self.node.channel_view(i.channel).map_or(0, |v| v.held);
                let age = self
                    .holds
                    .tracks
                    .get(&i.channel)
                    .map_or(0, |t| (self.wall_clock - t.since).max(0));
                (i.topic.clone(), held, age)
            })
            .collect();
        channels.sort();
        HoldGauges {
            held: self.node.held_count(),
            age_max_ms: channels.iter().map(|c| c.2).max().unwrap_or(0),
            channels,
        }
    }

    pub(super) fn refresh_holds(&mut self) {
        if self.node.held_count() == 0 {
            self.holds.tracks.clear();
            return;
        }
        let mut next = BTreeMap::new();
        for (channel, offset) in self.node.head_offsets() {
            // A new head starts its hold now: heads change only in
            // on_record, position_advance and init, each of which refreshes
            // right away, with the host's clock at hand-over.
            let track = match self.holds.tracks.get(&channel) {
                Some(t) if t.offset == offset => *t,
                _ => HoldTrack {
                    offset,
                    since: self.wall_clock,
                    warned: false,
                },
            };
            next.insert(channel, track);
        }
        self.holds.tracks = next;
    }
}
