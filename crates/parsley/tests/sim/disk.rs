//! The simulated disk a stream thread keeps its local stores on, between
//! its processes: what landed, what a crash or a failed write leaves, and
//! the store and reader the worker uses over it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use parsley::runtime::local::{
    KeyValue, LocalReader, LocalSnapshot, LocalStore, LocalStoreError, LocalWrite, LocalWriter,
    StoreIdentity, StoreKind,
};
use parsley::task::TaskId;
use parsley_sim::StoreFault;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One task's local store on a simulated disk.
#[derive(Clone, Debug, Default)]
pub struct DiskStore {
    pub identity: Option<StoreIdentity>,
    pub checkpoint: BTreeMap<String, i64>,
    pub written_at: Option<i64>,
    pub protocol: BTreeMap<Vec<u8>, Vec<u8>>,
    pub fold: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The file was damaged: it no longer reads back.
    pub corrupt: bool,
}

/// A simulated state directory: one store per task. It outlives the
/// process (the stream thread) that wrote it; the next process on the same
/// disk finds what was written.
#[derive(Debug, Default)]
pub struct Disk {
    pub stores: BTreeMap<TaskId, DiskStore>,
    /// The fault armed for the next write, if any.
    pub(super) armed: Option<StoreFault>,
    /// The process writing here died: nothing more lands.
    dead: bool,
    /// Faults that struck a write, by [`StoreFault`] order.
    pub struck: [u64; 4],
    /// How many writes may wait to land, as writes wait for the Kafka
    /// runtime's writer thread (0: every write lands before it returns).
    pub lag: usize,
    /// Writes accepted but not landed yet, oldest first. A process that
    /// dies loses them.
    pending: VecDeque<(TaskId, LocalWrite)>,
    /// The sequence counter of each task's live reader.
    readers: BTreeMap<TaskId, Arc<AtomicU64>>,
    /// Writes that waited behind another before they landed.
    pub lagged: u64,
    /// Writes a restore made in parts as it replayed (its writer's).
    pub parts: u64,
    /// Held records read back from a store while their task ran.
    pub held_reads: u64,
    /// Restore parts that carried held records.
    pub held_parts: u64,
    /// Tasks whose last write here failed, and nothing of theirs has
    /// landed since.
    failed: BTreeSet<TaskId>,
    /// Writes that landed on a task's file after a write of it failed
    /// (commits after the failure, once the file was reopened).
    pub landed_after_failure: u64,
}

impl Disk {
    /// Lands every waiting write, in order (what a job queued behind them
    /// on the writer thread waits for).
    fn flush(&mut self) {
        while let Some((task, write)) = self.pending.pop_front() {
            self.land(&task, write);
        }
    }

    /// The process is gone: what waited to land is lost with it.
    fn die(&mut self) {
        self.dead = true;
        self.pending.clear();
        self.readers.clear();
    }

    fn land(&mut self, task: &TaskId, write: LocalWrite) {
        if self.failed.remove(task) {
            self.landed_after_failure += 1;
        }
        let seq = write.seq;
        let s = self.stores.entry(task.clone()).or_default();
        if write.replace {
            *s = DiskStore::default();
        }
        if write.identity.is_some() {
            s.identity = write.identity;
        }
        s.checkpoint.extend(write.checkpoint);
        s.written_at = Some(write.written_at);
        for (kind, key, value) in write.entries {
            let m = match kind {
                StoreKind::Protocol => &mut s.protocol,
                StoreKind::Fold => &mut s.fold,
            };
            match value {
                Some(v) => {
                    m.insert(key.into_vec(), v.into_vec());
                }
                None => {
                    m.remove(&*key);
                }
            }
        }
        if let Some(applied) = self.readers.get(task) {
            applied.store(seq, Ordering::SeqCst);
        }
    }
}

/// The disks of a world, handed to processes as they start: a process
/// takes the first disk no live process holds (a restart on the same
/// machine), else a new, empty one.
#[derive(Clone, Default)]
pub struct Disks(pub Rc<RefCell<Vec<Arc<Mutex<Disk>>>>>);

impl Disks {
    /// Faults that struck a write on any disk.
    pub fn struck(&self) -> [u64; 4] {
        let mut out = [0; 4];
        for d in self.0.borrow().iter() {
            for (a, b) in out.iter_mut().zip(d.lock().unwrap().struck) {
                *a += b;
            }
        }
        out
    }

    /// Writes that waited behind another before they landed, on any disk.
    pub fn lagged(&self) -> u64 {
        self.0
            .borrow()
            .iter()
            .map(|d| d.lock().unwrap().lagged)
            .sum()
    }

    /// Restore writes made in parts, on any disk.
    pub fn parts(&self) -> u64 {
        self.0
            .borrow()
            .iter()
            .map(|d| d.lock().unwrap().parts)
            .sum()
    }

    /// Of those, parts that carried held records.
    pub fn held_parts(&self) -> u64 {
        self.0
            .borrow()
            .iter()
            .map(|d| d.lock().unwrap().held_parts)
            .sum()
    }

    /// Writes that landed on a task's file after a write of it failed,
    /// on any disk.
    pub fn landed_after_failure(&self) -> u64 {
        self.0
            .borrow()
            .iter()
            .map(|d| d.lock().unwrap().landed_after_failure)
            .sum()
    }

    pub fn take(&self) -> Arc<Mutex<Disk>> {
        let mut all = self.0.borrow_mut();
        if let Some(free) = all.iter().find(|d| Arc::strong_count(d) == 1) {
            let free = free.clone();
            let mut d = free.lock().unwrap();
            // The process that held the disk is gone, and with it the
            // writes it had not landed.
            d.pending.clear();
            d.readers.clear();
            d.dead = false;
            d.armed = None;
            drop(d);
            return free;
        }
        let new = Arc::new(Mutex::new(Disk::default()));
        all.push(new.clone());
        new
    }
}

/// A process's handle on its disk, as the worker's local store.
pub struct SimLocal(pub Arc<Mutex<Disk>>);

impl LocalStore for SimLocal {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        let mut d = self.0.lock().unwrap();
        d.flush();
        let Some(s) = d.stores.get(task) else {
            return Ok(None);
        };
        if s.corrupt {
            return Err(LocalStoreError::Corrupt {
                task: task.clone(),
                reason: "checksum mismatch (simulated)".into(),
            });
        }
        Ok(Some(LocalSnapshot {
            identity: s.identity.clone(),
            checkpoint: s.checkpoint.clone(),
            written_at: s.written_at,
            protocol: s
                .protocol
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            fold: s.fold.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }))
    }

    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        let mut d = self.0.lock().unwrap();
        let io = |m: &str| LocalStoreError::Io {
            task: task.clone(),
            message: m.to_owned(),
        };
        if d.dead {
            return Err(io("the process is gone (simulated)"));
        }
        if let Some(f) = d.armed {
            d.struck[f as usize] += 1;
        }
        match d.armed.take() {
            Some(StoreFault::CrashBeforeWrite) => {
                d.die();
                return Err(io("crashed inside the write (simulated)"));
            }
            Some(StoreFault::WriteFails) => {
                d.failed.insert(task.clone());
                return Err(io("no space left on device (simulated)"));
            }
            Some(StoreFault::CorruptAndCrash) => {
                d.die();
                if let Some(s) = d.stores.get_mut(task) {
                    s.corrupt = true;
                }
                return Err(io("crashed while the file was damaged (simulated)"));
            }
            Some(StoreFault::CrashAfterWrite) => {
                // The write and every one before it landed, then the
                // process died.
                d.pending.push_back((task.clone(), write));
                d.flush();
                d.die();
                return Ok(());
            }
            None => {}
        }
        d.pending.push_back((task.clone(), write));
        if d.pending.len() > 1 {
            d.lagged += 1;
        }
        while d.pending.len() > d.lag {
            if let Some((task, write)) = d.pending.pop_front() {
                d.land(&task, write);
            }
        }
        Ok(())
    }

    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        let mut d = self.0.lock().unwrap();
        if d.dead {
            return Err(LocalStoreError::Io {
                task: task.clone(),
                message: "the process is gone (simulated)".into(),
            });
        }
        d.flush();
        d.stores.remove(task);
        d.readers.remove(task);
        Ok(())
    }

    fn close(&mut self, _task: &TaskId) -> Result<(), LocalStoreError> {
        self.0.lock().unwrap().flush();
        Ok(())
    }

    fn reader(&mut self, task: &TaskId) -> Result<Option<Arc<dyn LocalReader>>, LocalStoreError> {
        let mut d = self.0.lock().unwrap();
        if d.dead {
            return Err(LocalStoreError::Io {
                task: task.clone(),
                message: "the process is gone (simulated)".into(),
            });
        }
        d.flush();
        let applied = Arc::new(AtomicU64::new(0));
        d.readers.insert(task.clone(), applied.clone());
        Ok(Some(Arc::new(SimReader {
            disk: self.0.clone(),
            task: task.clone(),
            applied,
        })))
    }

    fn reads_while_running(&self) -> bool {
        true
    }

    fn writer(&mut self) -> Option<Box<dyn LocalWriter>> {
        Some(Box::new(SimLocal(self.0.clone())))
    }
}

/// A restore job's writes: queued with the process's other writes.
impl LocalWriter for SimLocal {
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        let held = write
            .entries
            .iter()
            .any(|(_, k, v)| v.is_some() && parsley::runtime::local::is_held_entry(k));
        let mut d = self.0.lock().unwrap();
        d.parts += 1;
        d.held_parts += u64::from(held);
        drop(d);
        LocalStore::write(self, task, write)
    }
}

/// A task's reader on a simulated disk: it sees the writes that landed.
struct SimReader {
    disk: Arc<Mutex<Disk>>,
    task: TaskId,
    applied: Arc<AtomicU64>,
}

impl SimReader {
    fn read<T>(&self, f: impl FnOnce(&DiskStore) -> T) -> Result<T, LocalStoreError> {
        let d = self.disk.lock().unwrap();
        let live = d
            .readers
            .get(&self.task)
            .is_some_and(|a| Arc::ptr_eq(a, &self.applied));
        let io = |m: &str| LocalStoreError::Io {
            task: self.task.clone(),
            message: m.to_owned(),
        };
        if d.dead || !live {
            return Err(io("the store was wiped or its process is gone (simulated)"));
        }
        let store = d
            .stores
            .get(&self.task)
            .ok_or_else(|| io("no store (simulated)"))?;
        if store.corrupt {
            return Err(io("the file is damaged (simulated)"));
        }
        Ok(f(store))
    }
}

impl LocalReader for SimReader {
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }

    fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError> {
        self.read(|s| s.fold.get(key).cloned())
    }

    fn fold_scan(&self) -> Result<Vec<KeyValue>, LocalStoreError> {
        self.read(|s| s.fold.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn protocol_range(
        &self,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), LocalStoreError> {
        let entries: Vec<KeyValue> = self.read(|s| {
            s.protocol
                .range(from.to_vec()..to.to_vec())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })?;
        self.disk.lock().unwrap().held_reads += entries.len() as u64;
        for (k, v) in &entries {
            f(k, v);
        }
        Ok(())
    }
}
