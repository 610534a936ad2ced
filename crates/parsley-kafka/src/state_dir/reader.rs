//! A task's file as its running task reads it.

use super::*;

/// A task's file as its running task reads it (fold entries that left
/// memory): redb serves reads beside the writer thread's writes, each
/// read seeing the writes committed before it began.
pub(super) struct FileReader {
    pub(super) task: TaskId,
    pub(super) db: Arc<Database>,
    pub(super) applied: Arc<AtomicU64>,
}

impl LocalReader for FileReader {
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError> {
        let task = &self.task;
        let read = self.db.begin_read().map_err(|e| io(task, e))?;
        let table = match read.open_table(FOLD) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(corrupt(task, e)),
        };
        let value = table.get(key).map_err(|e| corrupt(task, e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    fn protocol_range(
        &self,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), LocalStoreError> {
        let task = &self.task;
        let read = self.db.begin_read().map_err(|e| io(task, e))?;
        let table = match read.open_table(PROTOCOL) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(corrupt(task, e)),
        };
        for entry in table.range(from..to).map_err(|e| corrupt(task, e))? {
            let (k, v) = entry.map_err(|e| corrupt(task, e))?;
            f(k.value(), v.value());
        }
        Ok(())
    }

    fn fold_keys(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), LocalStoreError> {
        let task = &self.task;
        let read = self.db.begin_read().map_err(|e| io(task, e))?;
        let table = match read.open_table(FOLD) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(corrupt(task, e)),
        };
        for entry in table.iter().map_err(|e| corrupt(task, e))? {
            let (k, _) = entry.map_err(|e| corrupt(task, e))?;
            f(k.value());
        }
        Ok(())
    }

    fn fold_keys_after(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<Vec<u8>>, LocalStoreError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let task = &self.task;
        let read = self.db.begin_read().map_err(|e| io(task, e))?;
        let table = match read.open_table(FOLD) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(corrupt(task, e)),
        };
        let range = match after {
            Some(a) => table.range::<&[u8]>((Excluded(a), Unbounded)),
            None => table.range::<&[u8]>(..),
        };
        let mut last = None;
        for entry in range.map_err(|e| corrupt(task, e))?.take(limit) {
            let (k, _) = entry.map_err(|e| corrupt(task, e))?;
            f(k.value());
            last = Some(k);
        }
        Ok(last.map(|k| k.value().to_vec()))
    }

    fn fold_len_hint(&self) -> Option<u64> {
        let read = self.db.begin_read().ok()?;
        let table = read.open_table(FOLD).ok()?;
        table.len().ok()
    }

    fn fold_scan(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>, LocalStoreError> {
        let task = &self.task;
        let read = self.db.begin_read().map_err(|e| io(task, e))?;
        let table = match read.open_table(FOLD) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(corrupt(task, e)),
        };
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| corrupt(task, e))? {
            let (k, v) = entry.map_err(|e| corrupt(task, e))?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }
}
