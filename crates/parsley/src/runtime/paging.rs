//! Held records kept on disk instead of in memory.
//!
//! Every held record is written to the task's committed protocol store
//! (in a [`StateKey::QueuePage`], one per run of records a commit holds)
//! when the transaction that holds it commits, and the local store
//! receives the same page with that commit's write. Until then the
//! committed in-memory store ([`MemStore`]) is the only place a paged-out
//! record can be read back from, so it keeps a copy.
//! Once the local store reports the write applied ([`LocalReader::applied`]),
//! that copy is redundant: [`HeldPages`] drops it, and the task reads the
//! record from the local store when its gate reaches it, when an abort
//! rebuilds the node, and when the task starts from its local store.
//!
//! The rule that keeps this safe is the fold cache's: an entry leaves
//! memory only once the store holds the commit that wrote it. Queue
//! indices are handed out once (a queue's head and tail only grow), so a
//! page is put once and deleted once; a delete the store has not applied
//! yet is harmless, because readers only ask for records between the
//! committed head and tail, and skip a page that ends at the head.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parsley_protocol::store::{
    PAGE_RECORDS, PageEntries, QueueEntryKeys, StateKey, StateVisitor, StoreRead, WriteBatch,
    decode_pair,
};
use parsley_protocol::{Channel, MemStore};

use crate::runtime::local::{LocalReader, LocalStoreError};

/// Where a task's held records are read back from once they leave its
/// committed in-memory store: nowhere (the default: every held record stays
/// in memory), or a local store (see the [module docs](self)).
#[derive(Clone, Default)]
pub struct HeldPages {
    disk: Option<Box<HeldDisk>>,
}

#[derive(Clone)]
struct HeldDisk {
    reader: Arc<dyn LocalReader>,
    /// The node's resident window, for a start from the store.
    window: Option<usize>,
    /// Commits applied since [`HeldPages::attach`].
    seq: u64,
    /// Held records' keys put by each commit, with its sequence number and
    /// the records each holds, still in memory until the local store holds
    /// that commit.
    waiting: VecDeque<(u64, Vec<(StateKey, u64)>)>,
    evicted: u64,
    reads: Arc<AtomicU64>,
}

/// How a task's held records have used its local store.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct HeldPagesStats {
    /// Held records whose in-memory copy was dropped because the local
    /// store holds them.
    pub evicted: u64,
    /// Held records read back from the local store.
    pub disk_reads: u64,
    /// Held records committed but not yet in the local store (their copy
    /// stays in memory).
    pub waiting: usize,
}

impl fmt::Debug for HeldPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldPages")
            .field("on_disk", &self.disk.is_some())
            .finish()
    }
}

impl HeldPages {
    /// Reads held records back from `reader` from now on, and drops every
    /// held record's entry from `committed`: the reader's store must hold
    /// everything `committed` holds (attach right after the host wrote the
    /// store, with a reader that waited for that write). `window` is the
    /// node's resident window, for a node started from the store.
    pub fn attach(
        &mut self,
        reader: Arc<dyn LocalReader>,
        window: Option<usize>,
        committed: &mut MemStore,
    ) {
        let mut keys = Vec::new();
        let mut evicted = 0;
        committed.for_each_state(&mut |key, value| {
            if let Ok(k) = key
                && k.is_held()
            {
                evicted += records_in(k, value);
                keys.push(k);
            }
        });
        for k in keys {
            committed.remove_state(k);
        }
        self.disk = Some(Box::new(HeldDisk {
            reader,
            window,
            seq: 0,
            waiting: VecDeque::new(),
            evicted,
            reads: Arc::default(),
        }));
    }

    /// Whether held records are read back from a local store.
    pub fn is_attached(&self) -> bool {
        self.disk.is_some()
    }

    /// The resident window a node started from these stores keeps.
    pub(crate) fn window(&self) -> Option<usize> {
        self.disk.as_ref().and_then(|d| d.window)
    }

    /// The number of commits applied since [`attach`](Self::attach) (the
    /// same count as [`FoldStore::seq`](crate::fold::FoldStore::seq) when
    /// both read through one store).
    pub fn seq(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.seq)
    }

    /// The figures, when attached.
    pub fn stats(&self) -> Option<HeldPagesStats> {
        self.disk.as_ref().map(|d| HeldPagesStats {
            evicted: d.evicted,
            disk_reads: d.reads.load(Ordering::Relaxed),
            waiting: d
                .waiting
                .iter()
                .flat_map(|(_, k)| k.iter().map(|&(_, n)| n as usize))
                .sum(),
        })
    }

    /// Notes one commit's protocol writes, about to be applied to the
    /// committed store: the held records it puts stay in memory until the
    /// local store holds this commit.
    pub(crate) fn committed(&mut self, batch: &WriteBatch) {
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        disk.seq += 1;
        let keys: Vec<(StateKey, u64)> = batch
            .iter()
            .filter_map(|(k, v)| match v {
                Some(v) if k.is_held() => Some((k, records_in(k, v))),
                _ => None,
            })
            .collect();
        if !keys.is_empty() {
            disk.waiting.push_back((disk.seq, keys));
        }
    }

    /// Drops from `committed` the held records the local store now holds.
    pub(crate) fn evict(&mut self, committed: &mut MemStore) {
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        let applied = disk.reader.applied();
        while disk.waiting.front().is_some_and(|(seq, _)| *seq <= applied) {
            if let Some((_, keys)) = disk.waiting.pop_front() {
                for (k, n) in keys {
                    // Released already: the delete took it.
                    if committed.remove_state(k).is_some() {
                        disk.evicted += n;
                    }
                }
            }
        }
        if disk.waiting.is_empty() && disk.waiting.capacity() > 64 {
            disk.waiting = VecDeque::new();
        }
    }

    /// Hands `f` what the local store holds of `channel`'s held records at
    /// queue indices `from..to`, key by key: the entries of the layout
    /// before pages in index order, then the pages that hold any of those
    /// indices in index order. Nothing when not attached.
    pub(crate) fn read(
        &self,
        channel: Channel,
        from: i64,
        to: i64,
        f: &mut dyn FnMut(StateKey, &[u8]),
    ) -> Result<(), LocalStoreError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(());
        };
        if from >= to {
            return Ok(());
        }
        let mut read = 0i64;
        let entries = QueueEntryKeys::new(channel);
        disk.reader.protocol_range(
            StateKey::QueueEntry(channel, from).text().as_bytes(),
            StateKey::QueueEntry(channel, to).text().as_bytes(),
            &mut |key, value| {
                if let Some(index) = entries.index(key) {
                    read += 1;
                    f(StateKey::QueueEntry(channel, index), value);
                }
            },
        )?;
        // A page that holds `from` starts at or below it, and at most
        // `PAGE_RECORDS - 1` below (a store is refused at a start if a page
        // holds more): read from there on, and skip pages that end at or
        // below `from` (deletes the store has not applied yet). Reading
        // from the queue's first index instead made every page-in of a
        // release walk every page released since the file last applied a
        // delete.
        let pages = QueueEntryKeys::pages(channel);
        let lowest = from.saturating_sub(PAGE_RECORDS as i64 - 1).max(0);
        let result = disk.reader.protocol_range(
            StateKey::QueuePage(channel, lowest).text().as_bytes(),
            StateKey::QueuePage(channel, to).text().as_bytes(),
            &mut |key, value| {
                let Some(first) = pages.index(key) else {
                    return;
                };
                // A page that does not parse is handed over too, for the
                // reader to refuse as corrupt.
                if let Ok(n) = PageEntries::count(value) {
                    let end = first.saturating_add(n as i64);
                    if end <= from {
                        return;
                    }
                    read += end.min(to) - first.max(from);
                }
                f(StateKey::QueuePage(channel, first), value);
            },
        );
        disk.reads
            .fetch_add(u64::try_from(read).unwrap_or(0), Ordering::Relaxed);
        result
    }

    /// The committed protocol store as a node start reads it: `committed`,
    /// and each queue's held records that only the local store holds.
    pub(crate) fn view<'a>(&'a self, committed: &'a MemStore) -> HeldView<'a> {
        HeldView {
            committed,
            pages: self,
            failure: RefCell::new(None),
        }
    }
}

/// The held records a held-record key's value holds: a page's count, or
/// one.
fn records_in(key: StateKey, value: &[u8]) -> u64 {
    match key {
        StateKey::QueuePage(..) => PageEntries::count(value).map_or(0, |n| n as u64),
        _ => 1,
    }
}

/// See [`HeldPages::view`]. A failed read of the local store ends the
/// iteration early and is kept for [`failure`](Self::failure): the node
/// then finds records missing, and the host reports the store's error.
pub(crate) struct HeldView<'a> {
    committed: &'a MemStore,
    pages: &'a HeldPages,
    failure: RefCell<Option<LocalStoreError>>,
}

impl HeldView<'_> {
    /// The local store's failure during the last read, if any.
    pub(crate) fn failure(&self) -> Option<LocalStoreError> {
        self.failure.borrow_mut().take()
    }

    /// Each queue's committed (head, tail).
    fn queues(&self) -> Vec<(Channel, i64, i64)> {
        let mut out = Vec::new();
        self.committed.for_each_state(&mut |key, value| {
            if let Ok(StateKey::QueueMeta(c)) = key
                && let Ok((head, tail)) = decode_pair(value)
            {
                out.push((c, head, tail));
            }
        });
        out
    }

    fn on_disk(&self, f: &mut dyn FnMut(StateKey, &[u8])) {
        if !self.pages.is_attached() {
            return;
        }
        for (channel, head, tail) in self.queues() {
            let read = self.pages.read(channel, head, tail, &mut |key, value| {
                // A copy still in memory was handed over already.
                if self.committed.get_state(key).is_none() {
                    f(key, value);
                }
            });
            if let Err(e) = read {
                *self.failure.borrow_mut() = Some(e);
                return;
            }
        }
    }
}

impl StoreRead for HeldView<'_> {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, &[u8])) {
        self.committed.for_each_entry(f);
        self.on_disk(&mut |key, value| f(key.text().as_str(), value));
    }

    fn for_each_state(&self, f: &mut StateVisitor<'_>) {
        self.committed.for_each_state(f);
        self.on_disk(&mut |key, value| f(Ok(key), value));
    }
}
