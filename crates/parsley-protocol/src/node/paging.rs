//! The resident window: held records beyond it are kept on the host's store as
//! offset and size, and paged back in when the gate reaches them.

use super::*;

impl CausalNode {
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
    pub(super) fn page_out(&mut self) -> usize {
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
        self.held > 0 && self.channels.iter().any(|ch| ch.head_paged())
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
            .filter(|ch| ch.head_paged())
            .map(|ch| {
                let from = ch.head_index;
                let mut count = ch.paged.len().min(window);
                // A request reads one run: one page, or a stretch of
                // entries of the older layout. Paged records are committed,
                // so a run holds `from`; were it missing, the request names
                // the entry key, and the host finds nothing there and fails.
                let stored = match ch.stored.iter().find(|r| r.end > from && r.first <= from) {
                    Some(run) => {
                        count = count.min(usize::try_from(run.end - from).unwrap_or(usize::MAX));
                        if run.page {
                            StateKey::QueuePage(ch.channel, run.first)
                        } else {
                            StateKey::QueueEntry(ch.channel, from)
                        }
                    }
                    None => StateKey::QueueEntry(ch.channel, from),
                };
                PageRequest {
                    channel: ch.channel,
                    from,
                    count,
                    stored,
                }
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
        let fits = ch.restored.is_empty() && ch.queue.is_empty() && records.len() <= ch.paged.len();
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
        self.cascade(out)?;
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
}
