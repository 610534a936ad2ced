//! [`FoldSpill`]: a fold changelog's replay that leaves what a bounded
//! cache cannot hold in the task's local store.

use super::*;
use crate::runtime::local::LocalEntry;

/// Writes a fold state out to the task's local store as a replay goes,
/// whenever what the replay holds in memory passes `budget` bytes, so a
/// fold state larger than memory can be restored. A rebuild's parts carry
/// no identity (the first clears the store), so a crash between them
/// leaves a store no start trusts; a tail's parts go into the store it
/// started from without moving its checkpoint, and replaying that tail
/// again after a crash rewrites the same values in the same order.
pub struct FoldSpill {
    pub(super) writer: Box<dyn crate::runtime::local::LocalWriter>,
    /// The task's share of the fold cache, as its worker sets it.
    pub(super) budget: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub(super) written_at: i64,
    /// Estimated bytes the replay added to memory since the last part.
    pub(super) held: usize,
    pub(super) spilled: bool,
    /// A rebuild's deletes since the last part (the keys may be in parts
    /// written before), by store.
    pub(super) deletes: std::collections::BTreeSet<(StoreKind, Vec<u8>)>,
    pub(super) failed: Option<crate::runtime::local::LocalStoreError>,
    /// Whether fold entries go out in parts (the task reads its fold state
    /// through a bounded cache).
    pub(super) fold: bool,
    /// Whether a rebuild's held records go out in parts (the task reads
    /// its held records from the store), and the bytes of them replayed
    /// into memory since the last part, with their keys.
    pub(super) held_records: bool,
    pub(super) held_bytes: usize,
    pub(super) held_keys: Vec<parsley_protocol::store::StateKey>,
    /// Set once the worker no longer waits for the restore (its task
    /// left): no more parts are written, so a job that was already running
    /// does not open the task's file again after the worker closed it.
    pub(super) cancelled: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A rebuild writes the held records it replayed to the local store each
/// time they pass this many bytes (or the task's fold cache share, when
/// smaller).
pub(super) const HELD_PART_BYTES: usize = 8 << 20;

impl std::fmt::Debug for FoldSpill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoldSpill")
            .field("budget", &self.budget)
            .field("spilled", &self.spilled)
            .finish_non_exhaustive()
    }
}

impl FoldSpill {
    /// Parts of at most about `budget` bytes in memory (read as the
    /// replay goes: the worker changes it as tasks come and go), written
    /// through `writer`, stamped `written_at`.
    pub fn new(
        writer: Box<dyn crate::runtime::local::LocalWriter>,
        budget: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        written_at: i64,
    ) -> FoldSpill {
        FoldSpill {
            writer,
            budget,
            written_at,
            held: 0,
            spilled: false,
            deletes: Default::default(),
            failed: None,
            fold: true,
            held_records: false,
            held_bytes: 0,
            held_keys: Vec::new(),
            cancelled: None,
        }
    }

    /// Writes no more parts once `cancelled` is set (the restore's task
    /// left the worker).
    pub fn stopping_when(
        mut self,
        cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> FoldSpill {
        self.cancelled = Some(cancelled);
        self
    }

    /// Which parts to write: fold entries (on by default), and a rebuild's
    /// held records.
    pub fn with_parts(mut self, fold: bool, held_records: bool) -> FoldSpill {
        self.fold = fold;
        self.held_records = held_records;
        self
    }

    /// After a rebuild's protocol record: a held record's entry counts
    /// towards the next part, and once they pass [`HELD_PART_BYTES`] the
    /// held records in memory go to the store (first part: replacing it).
    pub(super) fn take_held(
        &mut self,
        task: &TaskId,
        key: &[u8],
        value: Option<&[u8]>,
        store: &mut MemStore,
    ) {
        use parsley_protocol::store::StateKey;
        if self.failed.is_some() || !self.held_records {
            return;
        }
        let Some(k) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse::<StateKey>().ok())
            .filter(StateKey::is_held)
        else {
            return;
        };
        match value {
            Some(v) => {
                self.deletes.remove(&(StoreKind::Protocol, key.to_vec()));
                self.held_keys.push(k);
                self.held_bytes += key.len() + v.len();
            }
            None => {
                self.deletes.insert((StoreKind::Protocol, key.to_vec()));
            }
        }
        let part = HELD_PART_BYTES.min(self.budget.load(std::sync::atomic::Ordering::Relaxed));
        if self.held_bytes < part {
            return;
        }
        let mut entries = Vec::new();
        for k in std::mem::take(&mut self.held_keys) {
            // Released later in the replay: its delete is in `deletes`.
            if let Some(v) = store.remove_state(k) {
                entries.push((
                    StoreKind::Protocol,
                    k.text().as_bytes().into(),
                    Some(v.into()),
                ));
            }
        }
        let deletes = std::mem::take(&mut self.deletes);
        let (protocol, fold): (Vec<_>, Vec<_>) = deletes
            .into_iter()
            .partition(|(kind, _)| *kind == StoreKind::Protocol);
        // Fold deletes wait for the fold's own parts.
        self.deletes.extend(fold);
        entries.extend(protocol.into_iter().map(|(kind, k)| (kind, k.into(), None)));
        self.write_part(task, true, entries);
        self.held_bytes = 0;
    }

    pub(super) fn write_part(&mut self, task: &TaskId, rebuild: bool, entries: Vec<LocalEntry>) {
        let write = crate::runtime::local::LocalWrite {
            identity: None,
            checkpoint: BTreeMap::new(),
            replace: rebuild && !self.spilled,
            written_at: self.written_at,
            entries,
            seq: 0,
        };
        // The cancellation is checked where the write is applied, in order
        // with the worker's close of the task's store: checked here and
        // then sent, a part could land after the close and open the store
        // again.
        let written = match &self.cancelled {
            Some(c) => self.writer.write_unless_cancelled(task, write, c),
            None => self.writer.write(task, write).map(|()| true),
        };
        match written {
            Ok(true) => {
                self.spilled = true;
            }
            Ok(false) => {
                self.failed = Some(crate::runtime::local::LocalStoreError::Io {
                    task: task.clone(),
                    message: "the restore was cancelled: its task left".to_owned(),
                });
            }
            Err(e) => self.failed = Some(e),
        }
    }

    /// Counts one replayed fold record; writes a part when memory is full.
    pub(super) fn take(
        &mut self,
        task: &TaskId,
        rebuild: bool,
        key: &[u8],
        value: Option<&[u8]>,
        fold: &mut FoldStore,
        tail: &mut TailWrites,
    ) {
        if self.failed.is_some() || !self.fold {
            return;
        }
        self.held += crate::fold::cost(key, value.unwrap_or_default());
        if rebuild {
            let k = (StoreKind::Fold, key.to_vec());
            match value {
                Some(_) => self.deletes.remove(&k),
                None => self.deletes.insert(k),
            };
        }
        if self.held <= self.budget.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let entries: Vec<LocalEntry> = if rebuild {
            let mut entries: Vec<LocalEntry> = fold
                .drain_bytes()
                .into_iter()
                .map(|(k, v)| (StoreKind::Fold, k.into(), Some(v.into())))
                .collect();
            let deletes = std::mem::take(&mut self.deletes);
            let (fold, protocol): (Vec<_>, Vec<_>) = deletes
                .into_iter()
                .partition(|(kind, _)| *kind == StoreKind::Fold);
            // Held records' deletes wait for the held records' own parts.
            self.deletes.extend(protocol);
            entries.extend(fold.into_iter().map(|(kind, k)| (kind, k.into(), None)));
            entries
        } else {
            // The tail holds each key's last write; what memory holds is
            // the outcome for the keys it touched.
            drop(fold.drain_bytes());
            tail_entries(std::mem::take(tail))
        };
        self.write_part(task, rebuild, entries);
        self.held = 0;
    }
}
