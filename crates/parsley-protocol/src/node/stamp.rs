//! The stamp a node writes on each send.

use super::*;
use crate::clock::ClockVersion;

impl CausalNode {
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
    ///
    /// The returned clock is the stamp's own allocation;
    /// [`prepare_send_into`](Self::prepare_send_into) writes the same stamp
    /// encoded, without one.
    pub fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError> {
        let sender = self.assemble_stamp(destination)?;
        Ok(CausalHeaders {
            clock: self.stamp_base.stamp.clone(),
            sender: Some(sender),
        })
    }

    /// [`prepare_send`](Self::prepare_send) for a host that writes the
    /// stamp as bytes: appends the `vc` header's value in `version` to
    /// `out` and returns the sender tag (`vc-sender`, `vc-seq`). The node
    /// puts each stamp together in room it keeps, so this allocates nothing
    /// once that room has grown to the stamps' width (and `out` has room).
    pub fn prepare_send_into(
        &mut self,
        destination: Channel,
        version: ClockVersion,
        out: &mut Vec<u8>,
    ) -> Result<SenderTag, ProtocolError> {
        let sender = self.assemble_stamp(destination)?;
        self.stamp_base.stamp.encode_into_as(version, out);
        Ok(sender)
    }

    /// Puts the stamp for `destination` together in `stamp_base.stamp` and
    /// takes its send sequence.
    fn assemble_stamp(&mut self, destination: Channel) -> Result<SenderTag, ProtocolError> {
        if !self.sinks.contains(&destination.topic) || destination.partition < 0 {
            return Err(ProtocolError::UndeclaredSink {
                channel: destination,
            });
        }
        if !self.stamp_base.fresh {
            let mut base = std::mem::take(&mut self.stamp_base);
            self.compute_stamp_base(&mut base.clock, &mut base.upgrades);
            base.fresh = true;
            self.stamp_base = base;
        }
        let StampBase {
            clock: base,
            stamp: clock,
            ..
        } = &mut self.stamp_base;
        clock.copy_from(base);
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
        Ok(SenderTag {
            sender: self.sender,
            seq,
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

    pub(super) fn stamp_side_len(&self) -> usize {
        let len = |c: &VectorClock| c.offsets().len() + c.sequences().len();
        len(&self.carried)
            + self
                .channels
                .iter()
                .map(|c| len(&c.advertised))
                .sum::<usize>()
    }

    /// Computes the stamp base into `base`, in the room it has.
    fn compute_stamp_base(&self, base: &mut VectorClock, upgrades: &mut Vec<(Channel, i64)>) {
        // Room for every claim the merges below can bring, so that the base
        // grows at most once, whatever the upstream stamps carry.
        let sides = || {
            std::iter::once(&self.carried)
                .chain(std::iter::once(&self.own_outputs))
                .chain(self.channels.iter().map(|c| &c.advertised))
        };
        base.clear();
        base.reserve(
            self.channels.len() + sides().map(|c| c.offsets().len()).sum::<usize>(),
            sides().map(|c| c.sequences().len()).sum(),
        );
        for c in self.channels.iter().filter(|c| c.frontier >= 0) {
            base.claim_offset(c.channel, c.frontier);
        }
        for ch in &self.channels {
            base.merge(&ch.advertised);
        }
        base.merge(&self.carried);
        base.merge(&self.own_outputs);
        upgrades.clear();
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
        for &(ch, offset) in upgrades.iter() {
            base.claim_offset(ch, offset);
        }
    }
}
