//! What a node hands its host to commit, and truncation of state nothing can
//! name any more.

use super::*;

impl CausalNode {
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
                // Committed records the head has passed: a page goes once
                // all of its records are released (restore skips the ones
                // below the head until then); an entry of the older layout
                // goes with its record.
                while let Some(run) = ch.stored.front_mut() {
                    if run.page {
                        if run.end > head {
                            break;
                        }
                        batch.delete(StateKey::QueuePage(c, run.first));
                    } else {
                        let stop = run.end.min(head);
                        for index in run.first..stop {
                            batch.delete(StateKey::QueueEntry(c, index));
                        }
                        run.first = stop;
                        if run.first < run.end {
                            break;
                        }
                    }
                    ch.stored.pop_front();
                }
                // Records added since and still held, in pages. (Records
                // added and delivered in between were never committed:
                // nothing to do.)
                let mut index = ch.committed_tail.max(head);
                while index < tail {
                    let first = index;
                    let mut page = PageBuilder::new();
                    while index < tail {
                        // Records are paged out only once committed, so
                        // every record not yet written is resident.
                        let Some(held) = ch.resident(index) else {
                            break;
                        };
                        if !page.fits(held) {
                            break;
                        }
                        page.push(held);
                        index += 1;
                    }
                    if page.is_empty() {
                        debug_assert!(false, "held record {c} #{index} is paged out uncommitted");
                        tracing::error!(channel = %c, index, "held record paged out before it was committed");
                        index += 1;
                        continue;
                    }
                    batch.put(StateKey::QueuePage(c, first), page.finish());
                    ch.stored.push_back(StoredRun {
                        first,
                        end: index,
                        page: true,
                    });
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
            self.stamp_base.fresh = false;
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
        self.stamp_base.fresh = false;
        Ok(TruncationReport {
            entries_removed: before - self.stamp_side_len(),
            destroyed_topics: destroyed,
        })
    }
}
