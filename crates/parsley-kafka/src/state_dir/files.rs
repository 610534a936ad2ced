//! The writer thread's side of the task files: opening, reading, writing
//! and wiping one task's redb database.

use super::*;

impl Files {
    pub(super) fn close_all(&mut self) {
        let tasks: Vec<TaskId> = self.open.keys().cloned().collect();
        for task in tasks {
            let _ = self.close(&task);
        }
    }

    pub(super) fn db(&mut self, task: &TaskId) -> Result<&mut Open, LocalStoreError> {
        if !self.open.contains_key(task) {
            let db = Database::builder()
                .set_cache_size(self.dir.cache)
                .create(self.dir.task_file(task))
                .map_err(|e| match e {
                    // Held by another of this instance's threads (a task that
                    // has not finished leaving it), or another process: not a
                    // damaged store.
                    redb::DatabaseError::DatabaseAlreadyOpen => io(task, e),
                    // The file system refused; a file that is not a database
                    // (redb says "invalid data") is damaged.
                    redb::DatabaseError::Storage(redb::StorageError::Io(ref x))
                        if x.kind() != std::io::ErrorKind::InvalidData =>
                    {
                        io(task, e)
                    }
                    e => corrupt(task, e),
                })?;
            self.open.insert(
                task.clone(),
                Open {
                    db: Arc::new(db),
                    last_durable: Instant::now(),
                    applied: None,
                },
            );
        }
        self.open
            .get_mut(task)
            .ok_or_else(|| io(task, "the store is not open"))
    }
}

impl Files {
    /// A reader on the task's file; the writes after this call tell it
    /// their sequence numbers.
    pub(super) fn reader(
        &mut self,
        task: &TaskId,
    ) -> Result<Option<Arc<dyn LocalReader>>, LocalStoreError> {
        let open = self.db(task)?;
        let applied = Arc::new(AtomicU64::new(0));
        open.applied = Some(applied.clone());
        Ok(Some(Arc::new(FileReader {
            task: task.clone(),
            db: open.db.clone(),
            applied,
        })))
    }

    /// Reads the task's store, with or without its fold entries.
    pub(super) fn read(
        &mut self,
        task: &TaskId,
        leave: LeaveOnDisk,
    ) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        if !self.open.contains_key(task) && !self.dir.task_file(task).exists() {
            return Ok(None);
        }
        let open = self.db(task)?;
        let read = open.db.begin_read().map_err(|e| corrupt(task, e))?;
        let mut snapshot = LocalSnapshot::default();
        let meta = match read.open_table(META) {
            Ok(t) => t,
            // A file created but never written.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Some(snapshot)),
            Err(e) => return Err(corrupt(task, e)),
        };
        let mut fields: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for entry in meta.iter().map_err(|e| corrupt(task, e))? {
            let (k, v) = entry.map_err(|e| corrupt(task, e))?;
            fields.insert(k.value().to_owned(), v.value().to_vec());
        }
        snapshot.identity = decode_identity(&fields);
        snapshot.written_at = fields
            .get("written-at")
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(i64::from_be_bytes);
        for (k, v) in &fields {
            if let Some(topic) = k.strip_prefix("checkpoint:") {
                let bytes: [u8; 8] = v
                    .as_slice()
                    .try_into()
                    .map_err(|_| corrupt(task, format!("checkpoint of {topic} is not 8 bytes")))?;
                snapshot
                    .checkpoint
                    .insert(topic.to_owned(), i64::from_be_bytes(bytes));
            }
        }
        let tables = [
            Some((PROTOCOL, &mut snapshot.protocol, leave.held)),
            (!leave.fold).then_some((FOLD, &mut snapshot.fold, false)),
        ];
        for (def, out, skip_held) in tables.into_iter().flatten() {
            let table = match read.open_table(def) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(corrupt(task, e)),
            };
            for entry in table.iter().map_err(|e| corrupt(task, e))? {
                let (k, v) = entry.map_err(|e| corrupt(task, e))?;
                if skip_held && is_held_entry(k.value()) {
                    continue;
                }
                out.push((k.value().to_vec(), v.value().to_vec()));
            }
        }
        Ok(Some(snapshot))
    }
}

impl LocalStore for Files {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        self.read(task, LeaveOnDisk::default())
    }

    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        #[cfg(test)]
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(io(task, "no space left on device (test)"));
        }
        let open = self.db(task)?;
        let durable = write.replace || open.last_durable.elapsed() >= DURABLE_EVERY;
        let mut txn = open.db.begin_write().map_err(|e| io(task, e))?;
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(|e| io(task, e))?;
        if write.replace {
            for def in [PROTOCOL, FOLD] {
                txn.delete_table(def).map_err(|e| io(task, e))?;
            }
            txn.delete_table(META).map_err(|e| io(task, e))?;
        }
        {
            let mut protocol = txn.open_table(PROTOCOL).map_err(|e| io(task, e))?;
            let mut fold = txn.open_table(FOLD).map_err(|e| io(task, e))?;
            let mut at = 0;
            while at < write.entries.len() {
                // A run of deletes of one queue's consecutive held records
                // (a release) goes as one range: one walk of the tree
                // instead of a search per key.
                if let Some((first, last, n)) = held_delete_run(&write.entries[at..]) {
                    let (first, last) = (first.text(), last.text());
                    protocol
                        .retain_in(first.as_bytes()..=last.as_bytes(), |_, _| false)
                        .map_err(|e| io(task, e))?;
                    at += n;
                    continue;
                }
                let (kind, key, value) = &write.entries[at];
                at += 1;
                let table = match kind {
                    StoreKind::Protocol => &mut protocol,
                    StoreKind::Fold => &mut fold,
                };
                match value {
                    Some(v) => {
                        table
                            .insert(key.as_slice(), v.as_slice())
                            .map_err(|e| io(task, e))?;
                    }
                    None => {
                        table.remove(key.as_slice()).map_err(|e| io(task, e))?;
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| io(task, e))?;
            for (k, v) in write.identity.iter().flat_map(encode_identity) {
                meta.insert(k.as_str(), v.as_slice())
                    .map_err(|e| io(task, e))?;
            }
            meta.insert("written-at", write.written_at.to_be_bytes().as_slice())
                .map_err(|e| io(task, e))?;
            for (topic, offset) in &write.checkpoint {
                meta.insert(
                    format!("checkpoint:{topic}").as_str(),
                    offset.to_be_bytes().as_slice(),
                )
                .map_err(|e| io(task, e))?;
            }
        }
        txn.commit().map_err(|e| io(task, e))?;
        if durable {
            open.last_durable = Instant::now();
        }
        if let Some(applied) = &open.applied {
            applied.store(write.seq, Ordering::Release);
        }
        Ok(())
    }

    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.open.remove(task);
        match std::fs::remove_file(self.dir.task_file(task)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(task, e)),
        }
    }

    fn close(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        let Some(open) = self.open.remove(task) else {
            return Ok(());
        };
        // An empty durable commit makes every earlier one durable.
        let mut txn = open.db.begin_write().map_err(|e| io(task, e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| io(task, e))?;
        txn.commit().map_err(|e| io(task, e))
    }
}

/// Below this many, deletes go one by one.
pub(super) const RANGE_DELETE_MIN: usize = 16;

/// The run of deletes `entries` starts with when they remove one queue's
/// held records at consecutive indices (at least [`RANGE_DELETE_MIN`] of
/// them): its first and last key and its length. The keys between two
/// held records' keys of one queue are exactly the indices between them,
/// so removing the range removes exactly the run.
pub(super) fn held_delete_run(
    entries: &[parsley::runtime::local::LocalEntry],
) -> Option<(StateKey, StateKey, usize)> {
    let held = |e: &parsley::runtime::local::LocalEntry| match e {
        (StoreKind::Protocol, key, None) => match std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse::<StateKey>().ok())
        {
            Some(StateKey::QueueEntry(c, i)) => Some((c, i)),
            _ => None,
        },
        _ => None,
    };
    let (channel, start) = held(entries.first()?)?;
    let mut n = 1;
    while let Some((c, i)) = entries.get(n).and_then(held) {
        if c != channel || i != start + n as i64 {
            break;
        }
        n += 1;
    }
    (n >= RANGE_DELETE_MIN).then(|| {
        (
            StateKey::QueueEntry(channel, start),
            StateKey::QueueEntry(channel, start + n as i64 - 1),
            n,
        )
    })
}

pub(super) fn encode_identity(id: &StoreIdentity) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("application".to_owned(), id.application.as_bytes().to_vec()),
        ("stage".to_owned(), id.task.stage.as_bytes().to_vec()),
        (
            "partition".to_owned(),
            id.task.partition.to_be_bytes().to_vec(),
        ),
    ];
    for (topic, tid) in &id.changelogs {
        out.push((format!("changelog:{topic}"), tid.to_bytes().to_vec()));
    }
    out
}

pub(super) fn decode_identity(fields: &BTreeMap<String, Vec<u8>>) -> Option<StoreIdentity> {
    let text = |k: &str| {
        fields
            .get(k)
            .and_then(|v| String::from_utf8(v.clone()).ok())
    };
    let partition = fields
        .get("partition")
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(i32::from_be_bytes)?;
    let mut changelogs = BTreeMap::new();
    for (k, v) in fields {
        if let Some(topic) = k.strip_prefix("changelog:") {
            let bytes = <[u8; 16]>::try_from(v.as_slice()).ok()?;
            changelogs.insert(topic.to_owned(), TopicId::from_bytes(bytes));
        }
    }
    Some(StoreIdentity {
        application: text("application")?,
        task: TaskId {
            stage: text("stage")?,
            partition,
        },
        changelogs,
    })
}
