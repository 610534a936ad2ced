//! The delivery gate: records and positions in, deliveries out, in order.

use super::*;

impl CausalNode {
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
            self.stamp_base.fresh = false;
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
                self.stamp_base.fresh = false;
                if self.held > 0 {
                    self.cascade(out)?;
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
                self.stamp_base.fresh = false;
            }
        }
        if self.held > 0 {
            self.cascade(out)?;
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
            self.stamp_base.fresh = false;
            if self.held > 0 {
                self.cascade(&mut out)?;
            }
        }
        Ok(out)
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

    /// The gate's view of a clock for a record on channel `own`: entries on
    /// the record's own channel are ignored (FIFO already orders them), and
    /// entries on channels this node does not consume are ignored (their
    /// consumed ancestry is claimed directly). What is left and not yet met
    /// is returned.
    pub(super) fn unmet_claims(&self, own: usize, clock: &VectorClock) -> Vec<Claim> {
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
    pub(super) fn satisfied(&self, claim: Claim) -> bool {
        match claim {
            Claim::Offset { idx, offset } => self.channels[idx].frontier >= offset,
            Claim::Seq { idx, sender, seq } => {
                let ch = &self.channels[idx];
                ch.delivered.get(&sender).is_some_and(|m| m.seq >= seq)
                    || ch.skip.get(&sender).is_some_and(|m| m.seq >= seq)
            }
        }
    }

    pub(super) fn describe(&self, claim: Claim) -> UnmetClaim {
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
        self.stamp_base.fresh = false;
        self.stats.delivered_total += 1;
        debug!(channel = %record.channel, offset = record.offset, was_held, "record delivered");
        out.push(Delivery { record, was_held });
    }

    /// Releases heads to fixpoint, visiting channels in sorted order. A pass
    /// that delivers anything or folds any frontier forward is followed by
    /// another, since either can satisfy a claim elsewhere.
    ///
    /// Fails only on a restored head whose envelope does not decode, which
    /// restore's checks rule out: nothing is delivered past it on its
    /// channel, and the caller's error drops the call's deliveries (the
    /// host discards a node after any error).
    pub(super) fn cascade(&mut self, out: &mut Vec<Delivery>) -> Result<(), ProtocolError> {
        loop {
            let mut progressed = false;
            for i in 0..self.channels.len() {
                progressed |= self.drain_channel(i, out)?;
            }
            if !progressed {
                return Ok(());
            }
        }
    }

    fn drain_channel(&mut self, i: usize, out: &mut Vec<Delivery>) -> Result<bool, ProtocolError> {
        let mut progressed = false;
        loop {
            let clean = self.channels[i].clean_prefix();
            if set_frontier(&mut self.channels[i], clean) {
                self.stamp_base.fresh = false;
                progressed = true;
            }
            let ch = &mut self.channels[i];
            if ch.restored.is_empty() && ch.queue.is_empty() {
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
            // A restored head is decoded to be judged; if it must wait, the
            // decoded copy is dropped and it is decoded again at release
            // (a head that waits is judged once and then only its unmet
            // claims are looked at again).
            let mut decoded = None;
            let unmet = match ch.head_unmet.take() {
                Some(mut unmet) => {
                    unmet.retain(|c| !self.satisfied(*c));
                    unmet
                }
                None => match self.channels[i].restored.front() {
                    Some(env) => {
                        let record = env.decode(self.channels[i].channel)?;
                        let unmet = self.unmet_claims(i, &record.causal.clock);
                        decoded = Some(record);
                        unmet
                    }
                    None => match self.channels[i].queue.front() {
                        Some(head) => self.unmet_claims(i, &head.causal.clock),
                        None => break,
                    },
                },
            };
            if !unmet.is_empty() {
                self.channels[i].head_unmet = Some(unmet);
                break;
            }
            let ch = &mut self.channels[i];
            // Decoded before it leaves the queue, so a refusal leaves the
            // queue as it was.
            let restored = match (decoded, ch.restored.front()) {
                (Some(record), _) => Some(record),
                (None, Some(env)) => Some(env.decode(ch.channel)?),
                (None, None) => None,
            };
            let (record, size) = match restored {
                Some(record) => {
                    let size = ch.restored.pop_front().map_or(0, |e| e.held_size());
                    // Only a start fills the restored run: once it is
                    // released, its room goes for good.
                    if ch.restored.is_empty() {
                        ch.restored = VecDeque::new();
                    }
                    (record, size)
                }
                None => {
                    let Some(record) = ch.queue.pop_front() else {
                        break;
                    };
                    let size = record.held_size();
                    (record, size)
                }
            };
            ch.head_index += 1;
            self.held -= 1;
            self.held_bytes -= size;
            self.deliver(i, record, true, out);
            progressed = true;
        }
        Ok(progressed)
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
