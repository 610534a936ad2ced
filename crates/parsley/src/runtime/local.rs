//! Local state stores: a task's two stores kept on the host's disk between
//! runs, so a restart (or a task coming back after a rebalance) reads only
//! the changelog records written since, not the whole changelog.
//!
//! The changelog stays the truth. A local store is a cache of it at a
//! committed point, and says which point: its **checkpoint**, the next
//! changelog offset it does not reflect, per changelog topic. The rules the
//! [`Worker`](crate::runtime::worker::Worker) keeps:
//!
//! * A store is written only with writes whose transaction is known to have
//!   committed, together with the checkpoint those writes reach, in one
//!   atomic write ([`LocalStore::write`]). A transaction that aborts, or
//!   whose fate is unknown, never reaches it.
//! * A task that starts opens its store and replays the changelog from the
//!   checkpoint. A store that is missing, unreadable, written for another
//!   application, task or changelog topic (a topic deleted and created
//!   again has a new topic id), or whose checkpoint lies outside the
//!   changelog (ahead of its end, or below its log start), is wiped and
//!   rebuilt from the whole changelog, with a WARN that says why.
//! * When a write fails, the store no longer matches its checkpoint's
//!   successors: it is wiped, and that task writes no more to it until it
//!   starts again (then it is rebuilt).
//!
//! Replaying from a checkpoint that is too early is harmless (every
//! changelog record is an absolute put or a delete, so applying one again
//! changes nothing); one that is too late would lose writes, which is why
//! a checkpoint is only ever the offset after a record the store holds.
//!
//! The host supplies the engine: the Kafka runtime keeps one embedded
//! database file per task under its state directory; the simulator keeps
//! its "disks" in memory and crashes around every write.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use parsley_protocol::TopicId;
use parsley_protocol::store::StateKey;

use crate::runtime::identity::TaskId;

/// What a local store belongs to. A store whose identity differs from the
/// task that opens it is wiped.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoreIdentity {
    /// The application id.
    pub application: String,
    /// The task.
    pub task: TaskId,
    /// Each changelog the store mirrors, by topic name, with the topic id
    /// it had when the store was written.
    pub changelogs: BTreeMap<String, TopicId>,
}

impl fmt::Display for StoreIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "application {:?}, task {}", self.application, self.task)?;
        for (topic, id) in &self.changelogs {
            write!(f, ", {topic} ({id})")?;
        }
        Ok(())
    }
}

/// Which store of a task an entry belongs to.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum StoreKind {
    /// The protocol store (UTF-8 keys).
    Protocol,
    /// The fold store.
    Fold,
}

/// One entry of a write: the store, the key, and the value (`None`
/// deletes). A fold entry's bytes are the ones its changelog record and
/// the committed store hold (shared, not copied).
pub type LocalEntry = (StoreKind, RecordBytes, Option<RecordBytes>);

pub use parsley_protocol::host::RecordBytes;

/// One key and its value, as a store hands them back.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What a task's start may leave in its local store instead of loading
/// into memory (see [`LocalStore::open_leaving`]): it reads those entries
/// through a [`LocalReader`] while it runs.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct LeaveOnDisk {
    /// The fold store's entries.
    pub fold: bool,
    /// The held records in the protocol store (its
    /// [`StateKey::QueuePage`] and [`StateKey::QueueEntry`] entries; see
    /// [`is_held_entry`]).
    pub held: bool,
}

/// Whether a protocol store key holds held records (a page, or one record
/// in the layout before pages).
pub fn is_held_entry(key: &[u8]) -> bool {
    // Cheap test first: every other key is short or starts differently.
    key.starts_with(b"q/")
        && std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse::<StateKey>().ok())
            .is_some_and(|k| k.is_held())
}

/// A store's content as it was last written.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct LocalSnapshot {
    /// What it belongs to; `None` when the store holds no identity (a
    /// store that was never completely written).
    pub identity: Option<StoreIdentity>,
    /// The next changelog offset it does not reflect, per changelog topic.
    pub checkpoint: BTreeMap<String, i64>,
    /// When it was last written (the host's clock, in milliseconds).
    pub written_at: Option<i64>,
    /// Protocol store entries, in key order.
    pub protocol: Vec<(Vec<u8>, Vec<u8>)>,
    /// Fold store entries, in key order.
    pub fold: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One atomic write to a task's local store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LocalWrite {
    /// What the store belongs to; `None` leaves the store's identity as it
    /// is (none, after `replace`): a part of a rebuild written while its
    /// replay goes on, which no start may trust until the rebuild's last
    /// write names the identity.
    pub identity: Option<StoreIdentity>,
    /// The checkpoint after this write: the offsets given replace the ones
    /// stored; a changelog not named keeps its offset.
    pub checkpoint: BTreeMap<String, i64>,
    /// True to clear the store before writing (a rebuild).
    pub replace: bool,
    /// When it is written (the host's clock, in milliseconds).
    pub written_at: i64,
    /// Puts (`Some`) and deletes (`None`), in order.
    pub entries: Vec<LocalEntry>,
    /// The task's fold sequence number after this write (see
    /// [`LocalReader::applied`]): the store reports it back once the write
    /// is in the store.
    pub seq: u64,
}

/// Writes to a host's local stores from another thread: a restore job
/// that writes a large fold state out in parts as it replays it, so that
/// no more than the fold cache is in memory at once (see
/// [`LocalStore::writer`]).
pub trait LocalWriter: Send {
    /// Applies one write, after every write made through the store or a
    /// writer before it.
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError>;

    /// Applies one write unless `cancelled` is set when the store comes to
    /// it; whether it was applied. A restore's writer uses it: the worker
    /// sets the flag when the restore's task leaves, before it closes the
    /// task's store, and a part that reaches the store after that must not
    /// open it again. The default checks the flag and then writes, which a
    /// store that applies writes on another thread must do better: check
    /// where the write is applied, in order with the close.
    fn write_unless_cancelled(
        &mut self,
        task: &TaskId,
        write: LocalWrite,
        cancelled: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<bool, LocalStoreError> {
        if cancelled.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(false);
        }
        self.write(task, write).map(|()| true)
    }
}

/// Reads one task's local store by key while the task runs: the fold
/// store's entries that its bounded cache let go (see
/// [`FoldStore::attach`](crate::fold::FoldStore::attach)), and held
/// records that left memory once the store held them (see
/// [`HeldPages`](crate::runtime::paging::HeldPages)).
///
/// A host may apply writes after [`LocalStore::write`] returns (the Kafka
/// runtime writes on a thread of its own). A reader therefore answers as of
/// the writes it reports applied, and the cache keeps every entry written
/// since in memory: an entry leaves memory only once the store holds it.
pub trait LocalReader: Send + Sync {
    /// The [`LocalWrite::seq`] of the last write of this task the store
    /// holds, counting from the reader's creation (0 before any).
    fn applied(&self) -> u64;
    /// One fold store entry, as of the applied writes.
    fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError>;
    /// Every fold store entry, in key order, as of the applied writes.
    fn fold_scan(&self) -> Result<Vec<KeyValue>, LocalStoreError>;
    /// Hands `f` every fold store key, in key order, as of the applied
    /// writes, keeping none (counting keys must not load the state). The
    /// default scans; a store that can walk keys overrides it.
    fn fold_keys(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), LocalStoreError> {
        for (k, _) in self.fold_scan()? {
            f(&k);
        }
        Ok(())
    }
    /// Hands `f` at most `limit` fold store keys, in key order, from the
    /// first key after `after` (from the first key when `None`), as of the
    /// applied writes; returns the last key handed over, or `None` when
    /// there was none (the walk is done). A bounded fold store walks its
    /// keys in such steps, one per commit, to fill its key filter without
    /// holding up a task's start. The default walks every key each time; a
    /// store that can seek overrides it.
    fn fold_keys_after(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<Vec<u8>>, LocalStoreError> {
        let mut last: Option<Vec<u8>> = None;
        let mut n = 0;
        self.fold_keys(&mut |k| {
            if n < limit && after.is_none_or(|a| k > a) {
                f(k);
                n += 1;
                last = Some(k.to_vec());
            }
        })?;
        Ok(last)
    }
    /// About how many fold store entries there are, when the store can
    /// tell without reading them (it sizes the key filter; `None` lets the
    /// filter grow as it goes).
    fn fold_len_hint(&self) -> Option<u64> {
        None
    }
    /// Hands `f` each protocol store entry whose key lies in `from..to`
    /// (byte order), in key order, as of the applied writes.
    fn protocol_range(
        &self,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), LocalStoreError>;
}

/// A local store that cannot be used.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum LocalStoreError {
    /// The store's bytes do not read back (a torn or damaged file).
    #[error("the local store of task {task} is corrupt: {reason}")]
    Corrupt {
        /// The task.
        task: TaskId,
        /// What is wrong.
        reason: String,
    },
    /// The disk refused a read or a write (full, gone, no permission).
    #[error("the local store of task {task} failed: {message}")]
    Io {
        /// The task.
        task: TaskId,
        /// What the engine said.
        message: String,
    },
}

/// A host's local stores, one per task, under one state directory.
///
/// Every write is atomic: after a crash at any point, the store holds
/// either all of a write (entries and checkpoint) or none of it.
pub trait LocalStore: Send {
    /// Reads task `task`'s store: `None` when it has none.
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError>;
    /// Applies one write atomically.
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError>;
    /// Deletes task `task`'s store.
    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError>;
    /// The task left this host for now: make what was written durable and
    /// release what the store holds open. The store stays on disk for the
    /// task's return.
    fn close(&mut self, _task: &TaskId) -> Result<(), LocalStoreError> {
        Ok(())
    }
    /// Reads task `task`'s store as [`open`](Self::open) does, leaving out
    /// what `leave` names (a task that reads those entries through a
    /// [`LocalReader`] while it runs). A store that can do better than
    /// reading everything and dropping the rest overrides this.
    fn open_leaving(
        &mut self,
        task: &TaskId,
        leave: LeaveOnDisk,
    ) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        let mut snapshot = self.open(task)?;
        if let Some(s) = snapshot.as_mut() {
            if leave.fold {
                s.fold = Vec::new();
            }
            if leave.held {
                s.protocol.retain(|(k, _)| !is_held_entry(k));
            }
        }
        Ok(snapshot)
    }
    /// A reader on task `task`'s store, once every write queued before
    /// this call is in the store; its [`LocalReader::applied`] starts at 0.
    /// `Ok(None)` when this store cannot be read while the task runs (the
    /// task then keeps its whole fold state in memory).
    fn reader(&mut self, _task: &TaskId) -> Result<Option<Arc<dyn LocalReader>>, LocalStoreError> {
        Ok(None)
    }
    /// A writer a restore job may use while it runs (see [`LocalWriter`]);
    /// `None` when the store has none (the job then keeps what it replays
    /// in memory until it is done).
    fn writer(&mut self) -> Option<Box<dyn LocalWriter>> {
        None
    }
    /// Whether [`reader`](Self::reader) gives readers: only then may a
    /// task leave fold entries or held records out of memory.
    fn reads_while_running(&self) -> bool {
        false
    }
}

/// Why a task's local store was not used and is rebuilt.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum WipeReason {
    /// It did not read back.
    Unreadable(String),
    /// It holds no identity: it was never completely written.
    NoIdentity,
    /// It belongs to another application, task or changelog topic.
    Foreign {
        /// What it says it belongs to.
        found: StoreIdentity,
    },
    /// Its checkpoint lies past the changelog's end: it reflects writes the
    /// changelog does not hold.
    Ahead {
        /// The changelog topic.
        topic: String,
        /// The store's checkpoint.
        checkpoint: i64,
        /// The changelog partition's end.
        end: i64,
    },
    /// It was last written longer ago than the worker's
    /// `local_store_max_age`: compaction may since have removed the
    /// tombstone of a delete it never saw.
    TooOld {
        /// How long ago, in milliseconds.
        age_ms: i64,
        /// The bound, in milliseconds.
        max_age_ms: i64,
    },
    /// Its checkpoint lies below the changelog's log start: records it
    /// never saw were deleted.
    Truncated {
        /// The changelog topic.
        topic: String,
        /// The store's checkpoint.
        checkpoint: i64,
        /// The changelog partition's log start.
        log_start: i64,
    },
}

impl fmt::Display for WipeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WipeReason::Unreadable(reason) => write!(f, "it does not read back ({reason})"),
            WipeReason::NoIdentity => write!(f, "it was never completely written"),
            WipeReason::Foreign { found } => write!(
                f,
                "it belongs to {found} (another application, task, or an earlier changelog topic of the same name)"
            ),
            WipeReason::TooOld { age_ms, max_age_ms } => write!(
                f,
                "it was last written {age_ms} ms ago, more than the {max_age_ms} ms a store may age (compaction may have removed tombstones it never saw)"
            ),
            WipeReason::Ahead {
                topic,
                checkpoint,
                end,
            } => write!(
                f,
                "its checkpoint {checkpoint} lies past the end {end} of {topic}: it reflects writes the changelog does not hold"
            ),
            WipeReason::Truncated {
                topic,
                checkpoint,
                log_start,
            } => write!(
                f,
                "its checkpoint {checkpoint} lies below the log start {log_start} of {topic}: changelog records it never saw were deleted"
            ),
        }
    }
}

/// Checks a snapshot against the task that opens it: `Ok` when the store
/// can be used and only the changelog after its checkpoint needs
/// replaying. `bounds` gives each changelog's (log start, end) for the
/// task's partition; a store last written more than `max_age_ms` before
/// `now_ms` is too old.
pub fn check(
    snapshot: &LocalSnapshot,
    expected: &StoreIdentity,
    bounds: &BTreeMap<String, (i64, i64)>,
    now_ms: i64,
    max_age_ms: i64,
) -> Result<(), WipeReason> {
    let Some(found) = &snapshot.identity else {
        return Err(WipeReason::NoIdentity);
    };
    if found != expected {
        return Err(WipeReason::Foreign {
            found: found.clone(),
        });
    }
    let age_ms = now_ms.saturating_sub(snapshot.written_at.unwrap_or(i64::MIN));
    if age_ms > max_age_ms {
        return Err(WipeReason::TooOld { age_ms, max_age_ms });
    }
    for (topic, &(log_start, end)) in bounds {
        let checkpoint = snapshot.checkpoint.get(topic).copied().unwrap_or(0);
        if checkpoint > end {
            return Err(WipeReason::Ahead {
                topic: topic.clone(),
                checkpoint,
                end,
            });
        }
        if checkpoint < log_start {
            return Err(WipeReason::Truncated {
                topic: topic.clone(),
                checkpoint,
                log_start,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(topic_id: u8) -> StoreIdentity {
        StoreIdentity {
            application: "app".into(),
            task: TaskId {
                stage: "s".into(),
                partition: 1,
            },
            changelogs: BTreeMap::from([(
                "app-s-state-changelog".to_owned(),
                TopicId::from_bytes([topic_id; 16]),
            )]),
        }
    }

    fn snapshot(id: Option<StoreIdentity>, checkpoint: i64) -> LocalSnapshot {
        LocalSnapshot {
            identity: id,
            written_at: Some(1_000),
            checkpoint: BTreeMap::from([("app-s-state-changelog".to_owned(), checkpoint)]),
            ..LocalSnapshot::default()
        }
    }

    fn bounds(log_start: i64, end: i64) -> BTreeMap<String, (i64, i64)> {
        BTreeMap::from([("app-s-state-changelog".to_owned(), (log_start, end))])
    }

    #[test]
    fn a_store_inside_its_changelog_is_used() {
        assert_eq!(
            check(
                &snapshot(Some(identity(1)), 5),
                &identity(1),
                &bounds(0, 9),
                2_000,
                5_000
            ),
            Ok(())
        );
        // At either edge too.
        assert!(
            check(
                &snapshot(Some(identity(1)), 9),
                &identity(1),
                &bounds(0, 9),
                2_000,
                5_000
            )
            .is_ok()
        );
        assert!(
            check(
                &snapshot(Some(identity(1)), 3),
                &identity(1),
                &bounds(3, 9),
                2_000,
                5_000
            )
            .is_ok()
        );
    }

    #[test]
    fn each_reason_to_rebuild_is_named() {
        let no_id = check(
            &snapshot(None, 5),
            &identity(1),
            &bounds(0, 9),
            2_000,
            5_000,
        );
        assert_eq!(no_id, Err(WipeReason::NoIdentity));
        let recreated = check(
            &snapshot(Some(identity(2)), 5),
            &identity(1),
            &bounds(0, 9),
            2_000,
            5_000,
        );
        assert!(matches!(recreated, Err(WipeReason::Foreign { .. })));
        let ahead = check(
            &snapshot(Some(identity(1)), 10),
            &identity(1),
            &bounds(0, 9),
            2_000,
            5_000,
        );
        assert!(matches!(
            ahead,
            Err(WipeReason::Ahead {
                checkpoint: 10,
                end: 9,
                ..
            })
        ));
        let truncated = check(
            &snapshot(Some(identity(1)), 2),
            &identity(1),
            &bounds(3, 9),
            2_000,
            5_000,
        );
        assert!(matches!(
            truncated,
            Err(WipeReason::Truncated {
                checkpoint: 2,
                log_start: 3,
                ..
            })
        ));
        let old = check(
            &snapshot(Some(identity(1)), 5),
            &identity(1),
            &bounds(0, 9),
            7_000,
            5_000,
        );
        assert_eq!(
            old,
            Err(WipeReason::TooOld {
                age_ms: 6_000,
                max_age_ms: 5_000
            })
        );
        let text = ahead.unwrap_err().to_string();
        assert!(text.contains("past the end 9"), "{text}");
    }
}
