//! Changelog topics: how a task's two stores travel through Kafka, and how
//! they come back.
//!
//! Each stage has a state changelog (`<applicationId>-<stage>-state-changelog`,
//! the protocol store) and, when stateful, a fold changelog
//! (`<applicationId>-<stage>-fold-changelog`). Partition `p` of each belongs
//! to task `p` of the stage. A record's key is the store key (the protocol
//! store's UTF-8 key, or the fold store's slot bytes), its value the stored
//! bytes; a delete is a tombstone (null value). The records are written in
//! the task's transaction, so a `read_committed` replay to the end rebuilds
//! exactly the committed stores.

use std::collections::BTreeMap;

use parsley_protocol::MemStore;

use crate::fold::FoldStore;
pub use crate::runtime::host::{ChangelogReader, ChangelogRecord};
use crate::runtime::host::{MetadataError, TopicMetadata};
use crate::runtime::local::StoreKind;
use crate::runtime::task::{TaskId, TaskStores};

mod rewrite;
mod spill;

pub use rewrite::{ResetRefused, StepError, fold_reset_records, reset_records, step_past_record};
pub use spill::FoldSpill;

/// A changelog that cannot be used to restore a task.
#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    /// The changelog topic is missing or could not be described or read.
    #[error("task {task}: changelog {topic:?}: {cause}")]
    Unavailable {
        /// The task being restored.
        task: TaskId,
        /// The changelog topic.
        topic: String,
        /// What the lookup said.
        cause: MetadataError,
    },
    /// The changelog's partition count differs from the stage's task count.
    #[error(
        "task {task}: changelog {topic:?} has {actual} partition(s) but the stage has {expected} task(s); recreate it with exactly {expected}"
    )]
    Partitions {
        /// The task being restored.
        task: TaskId,
        /// The changelog topic.
        topic: String,
        /// The stage's task count.
        expected: i32,
        /// The changelog's partition count.
        actual: i32,
    },
    /// The restore job was not run: its task left this worker (revoked, or
    /// every task dropped after fencing) after the job was handed over, so
    /// nothing waits for it, and running it could write the task's local
    /// store behind a newer restore's back.
    #[error("task {task}: restore not run, the task left before it began")]
    Cancelled {
        /// The task the job was for.
        task: TaskId,
    },
    /// A replay stopped below the end the task started against: a
    /// transaction with records on the changelog (the previous owner's
    /// last, typically) has not been resolved there yet, its commit marker
    /// not written, while its consumed offsets may already be. Starting
    /// now would miss its writes; the worker waits for the marker (bounded
    /// by [`WorkerConfig::changelog_stable_wait`](crate::runtime::worker::WorkerConfig::changelog_stable_wait)).
    #[error(
        "task {task}: changelog {topic}:{partition} reads only up to offset {reached}, below its end {end} when the task started: a transaction with records there is not resolved yet (its commit marker not written), and restoring without it would miss its writes"
    )]
    Unstable {
        /// The task being restored.
        task: TaskId,
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Where the replay stopped (the last stable offset).
        reached: i64,
        /// The partition's end when the task started.
        end: i64,
    },
    /// A record that no store wrote.
    #[error("task {task}: changelog {topic:?} holds a record the stores never write: {reason}")]
    Corrupt {
        /// The task being restored.
        task: TaskId,
        /// The changelog topic.
        topic: String,
        /// What is wrong.
        reason: String,
    },
}

/// Rebuilds a task's committed stores by replaying its changelog partitions
/// to the end. `fold_changelog` is `None` for a stateless stage. Each
/// changelog must have exactly `tasks` partitions.
pub fn restore(
    task: &TaskId,
    state_changelog: &str,
    fold_changelog: Option<&str>,
    tasks: i32,
    metadata: &dyn TopicMetadata,
    reader: &dyn ChangelogReader,
) -> Result<TaskStores, ChangelogError> {
    let changelogs = Changelogs {
        state: state_changelog,
        fold: fold_changelog,
        tasks,
        ends: None,
    };
    restore_from(task, &changelogs, metadata, reader, None, None, &mut |_| {}).map(|r| r.stores)
}

/// What a host hears as its tasks restore (as Kafka Streams'
/// `StateRestoreListener`): per changelog partition, its start, a batch
/// every [`PROGRESS_EVERY`] records, and its end. Called on the stream
/// thread that restores: keep it short.
pub trait RestoreListener: Send + Sync {
    /// A replay of `topic`'s partition `partition` for `task` begins at
    /// offset `from`; the partition ended at `end` when the restore began.
    fn on_restore_start(&self, task: &TaskId, topic: &str, partition: i32, from: i64, end: i64);
    /// `restored` records replayed so far; `remaining` offsets left to the
    /// end seen at the start (markers included: an upper bound).
    fn on_batch_restored(
        &self,
        task: &TaskId,
        topic: &str,
        partition: i32,
        restored: u64,
        remaining: u64,
    );
    /// The replay is done, after `restored` records.
    fn on_restore_end(&self, task: &TaskId, topic: &str, partition: i32, restored: u64);
}

/// A shared listener listens too (keep an `Arc` to read what it heard).
impl<L: RestoreListener + ?Sized> RestoreListener for std::sync::Arc<L> {
    fn on_restore_start(&self, task: &TaskId, topic: &str, partition: i32, from: i64, end: i64) {
        (**self).on_restore_start(task, topic, partition, from, end);
    }
    fn on_batch_restored(
        &self,
        task: &TaskId,
        topic: &str,
        partition: i32,
        restored: u64,
        remaining: u64,
    ) {
        (**self).on_batch_restored(task, topic, partition, restored, remaining);
    }
    fn on_restore_end(&self, task: &TaskId, topic: &str, partition: i32, restored: u64) {
        (**self).on_restore_end(task, topic, partition, restored);
    }
}

/// How often a restore reports its progress, in records.
pub const PROGRESS_EVERY: u64 = 10_000;

/// A restore's progress on one changelog partition: reported when it
/// starts, every [`PROGRESS_EVERY`] records, and when it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress<'a> {
    /// The changelog topic.
    pub topic: &'a str,
    /// Records replayed from it so far.
    pub restored: u64,
    /// The offset after the last record replayed (where the replay
    /// started, before any).
    pub next: i64,
    /// True for the last report of the partition.
    pub done: bool,
}

/// A task's changelog topics.
#[derive(Clone, Copy, Debug)]
pub struct Changelogs<'a> {
    /// The state changelog (the protocol store).
    pub state: &'a str,
    /// The fold changelog, for a stateful stage.
    pub fold: Option<&'a str>,
    /// The stage's task count: each changelog's partition count.
    pub tasks: i32,
    /// Each changelog's end (the high watermark) when the task started, by
    /// topic: a replay that stops below it fails with
    /// [`ChangelogError::Unstable`]. `None` checks nothing (a restore of
    /// stores outside a task start, for a test or a tool).
    pub ends: Option<&'a BTreeMap<String, i64>>,
}

/// Where a restore starts: stores read from a local store, and the first
/// changelog offset they do not reflect, per changelog topic.
#[derive(Debug, Default)]
pub struct RestoreStart {
    /// The stores as the local store held them.
    pub stores: TaskStores,
    /// The next offset to replay, per changelog topic (0 when absent).
    pub from: BTreeMap<String, i64>,
}

/// What a restore rebuilt.
#[derive(Debug, Default)]
pub struct Restored {
    /// The committed stores.
    pub stores: TaskStores,
    /// Changelog records replayed.
    pub replayed: u64,
    /// The next offset after the last record replayed (or where the replay
    /// started, when it read none), per changelog topic.
    pub next: BTreeMap<String, i64>,
    /// What the replay wrote, when the restore started from a local store
    /// (for the host to bring that store up to date): each key's last
    /// value only, so a tail that rewrote a few keys many times holds a few
    /// entries, not one per record. Empty for a restore from nothing.
    pub tail: TailWrites,
    /// Whether part of the fold state, or of a rebuild's held records,
    /// went to the local store during the replay ([`FoldSpill`]): then the
    /// stores hold only the rest, and the local store must be completed,
    /// not replaced.
    pub spilled: bool,
    /// Deletes of a rebuild that spilled, still to write.
    pub pending: Vec<crate::runtime::local::LocalEntry>,
    /// A part that could not be written: the local store holds an
    /// unknown part of the state and memory not all of it.
    pub spill_failed: Option<crate::runtime::local::LocalStoreError>,
}

/// The writes a replayed tail makes to a local store: each key's last value
/// (`None`: deleted), in key order.
pub type TailWrites = BTreeMap<(StoreKind, Vec<u8>), Option<Vec<u8>>>;

/// The entries of a tail's writes, to hand to a local store.
pub fn tail_entries(tail: TailWrites) -> Vec<crate::runtime::local::LocalEntry> {
    tail.into_iter()
        .map(|((kind, key), value)| (kind, key.into(), value.map(Into::into)))
        .collect()
}

/// Rebuilds a task's committed stores: from `start` and the changelog
/// records after it, or, without a start, from the whole changelogs.
pub fn restore_from(
    task: &TaskId,
    changelogs: &Changelogs<'_>,
    metadata: &dyn TopicMetadata,
    reader: &dyn ChangelogReader,
    start: Option<RestoreStart>,
    mut spill: Option<&mut FoldSpill>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Restored, ChangelogError> {
    let keep_tail = start.is_some();
    let RestoreStart { stores, from } = start.unwrap_or_default();
    let mut out = Restored {
        next: from,
        ..Restored::default()
    };
    let TaskStores {
        protocol,
        fold,
        held,
        diverted,
        release_cap,
    } = stores;
    out.stores.diverted = diverted;
    out.stores.held = held;
    out.stores.release_cap = release_cap;
    let one = |topic| One {
        task,
        topic,
        tasks: changelogs.tasks,
        end: changelogs.ends.and_then(|e| e.get(topic).copied()),
        metadata,
        reader,
    };
    let kind = |k| keep_tail.then_some(k);
    // A rebuild's held records go out in parts too, when the task reads
    // them from the store.
    let mut held_spilling = spill
        .as_deref_mut()
        .filter(|s| s.held_records && !keep_tail)
        .map(|s| {
            move |store: &mut MemStore, _: &mut TailWrites, key: &[u8], value: Option<&[u8]>| {
                s.take_held(task, key, value, store)
            }
        });
    out.stores.protocol = one(changelogs.state).replay_into(
        &mut out,
        kind(StoreKind::Protocol),
        protocol,
        put_protocol,
        held_spilling
            .as_mut()
            .map(|f| f as &mut After<'_, MemStore>),
        progress,
    )?;
    if let Some(topic) = changelogs.fold {
        let rebuild = !keep_tail;
        let mut spilling = spill.as_deref_mut().map(|s| {
            move |fold: &mut FoldStore, tail: &mut TailWrites, key: &[u8], value: Option<&[u8]>| {
                s.take(task, rebuild, key, value, fold, tail)
            }
        });
        out.stores.fold = one(topic).replay_into(
            &mut out,
            kind(StoreKind::Fold),
            fold,
            put_fold,
            spilling.as_mut().map(|f| f as &mut After<'_, FoldStore>),
            progress,
        )?;
    }
    if let Some(s) = spill {
        out.spilled = s.spilled;
        out.spill_failed = s.failed.take();
        out.pending = std::mem::take(&mut s.deletes)
            .into_iter()
            .map(|(kind, k)| (kind, k.into(), None))
            .collect();
    }
    Ok(out)
}

/// One changelog of a task to replay.
struct One<'a> {
    task: &'a TaskId,
    topic: &'a str,
    tasks: i32,
    /// The end the replay must reach, if checked.
    end: Option<i64>,
    metadata: &'a dyn TopicMetadata,
    reader: &'a dyn ChangelogReader,
}

impl One<'_> {
    /// Replays the changelog from where `out` says into `store` with
    /// `put`, counting in `out` and reporting progress.
    fn replay_into<S>(
        &self,
        out: &mut Restored,
        kind: Option<StoreKind>,
        store: S,
        put: Put<S>,
        mut after: Option<&mut After<'_, S>>,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<S, ChangelogError> {
        let mut rebuild = Rebuild {
            store,
            corrupt: None,
        };
        let mut read = Tail::new(out, self.topic, kind);
        progress(read.progress(false));
        self.replay(read.from, &mut |r| {
            read.take(&r);
            match (after.as_deref_mut(), r.key.clone()) {
                (Some(after), Some(key)) => {
                    let value = r.value.clone();
                    rebuild.apply(r, put);
                    after(
                        &mut rebuild.store,
                        &mut read.out.tail,
                        &key,
                        value.as_deref(),
                    );
                }
                _ => rebuild.apply(r, put),
            }
            if read.count.is_multiple_of(PROGRESS_EVERY) {
                progress(read.progress(false));
            }
        })?;
        progress(read.progress(true));
        read.finish();
        rebuild.finish(self.task, self.topic)
    }
}

/// Counts what one changelog's replay read, and keeps its records for a
/// local store when asked.
struct Tail<'a> {
    out: &'a mut Restored,
    topic: &'a str,
    kind: Option<StoreKind>,
    from: i64,
    next: i64,
    count: u64,
}

impl<'a> Tail<'a> {
    fn new(out: &'a mut Restored, topic: &'a str, kind: Option<StoreKind>) -> Tail<'a> {
        let from = out.next.get(topic).copied().unwrap_or(0);
        Tail {
            out,
            topic,
            kind,
            from,
            next: from,
            count: 0,
        }
    }

    fn progress(&self, done: bool) -> Progress<'a> {
        Progress {
            topic: self.topic,
            restored: self.count,
            next: self.next,
            done,
        }
    }

    fn take(&mut self, r: &ChangelogRecord) {
        self.out.replayed += 1;
        self.count += 1;
        self.next = self.next.max(r.offset.saturating_add(1));
        if let (Some(kind), Some(key)) = (self.kind, &r.key) {
            // A later write of the key replaces an earlier one's.
            self.out.tail.insert((kind, key.clone()), r.value.clone());
        }
    }

    fn finish(self) {
        self.out.next.insert(self.topic.to_owned(), self.next);
    }
}

impl One<'_> {
    /// Replays the changelog partition from `from` through the reader,
    /// refusing a partition count that differs from the stage's, and a
    /// replay that stopped below the end the task started against.
    fn replay(
        &self,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<(), ChangelogError> {
        let (task, topic) = (self.task, self.topic);
        let unavailable = |source| ChangelogError::Unavailable {
            task: task.clone(),
            topic: topic.to_owned(),
            cause: source,
        };
        let d = self.metadata.describe(topic).map_err(unavailable)?;
        if d.partitions != self.tasks {
            return Err(ChangelogError::Partitions {
                task: task.clone(),
                topic: topic.to_owned(),
                expected: self.tasks,
                actual: d.partitions,
            });
        }
        let reached = self
            .reader
            .replay_changelog_from(topic, task.partition, from, apply)
            .map_err(unavailable)?;
        // Stopping below the end the task started against means a
        // transaction's records there are not resolved yet: a restore that
        // went on without them would start the task without that
        // transaction's writes while its consumed offsets may already
        // count.
        match self.end {
            Some(end) if reached < end => Err(ChangelogError::Unstable {
                task: task.clone(),
                topic: topic.to_owned(),
                partition: task.partition,
                reached,
                end,
            }),
            _ => Ok(()),
        }
    }
}

/// How a store takes one changelog record (key, value or tombstone),
/// refusing one it never writes.
type Put<S> = fn(&mut S, Vec<u8>, Option<Vec<u8>>) -> Result<(), String>;

/// Called after each record a replay applied: the store, the tail kept so
/// far, and the record's key and value.
type After<'a, S> = dyn FnMut(&mut S, &mut TailWrites, &[u8], Option<&[u8]>) + 'a;

/// A store rebuilt record by record as a replay hands them over; the first
/// record no store wrote is kept as the error, and the rest are ignored.
#[derive(Default)]
struct Rebuild<S> {
    store: S,
    corrupt: Option<String>,
}

impl<S> Rebuild<S> {
    /// Applies one record with `put`, which refuses a record the store never
    /// writes.
    fn apply(&mut self, r: ChangelogRecord, put: Put<S>) {
        if self.corrupt.is_some() {
            return;
        }
        let result = match r.key {
            Some(key) => put(&mut self.store, key, r.value),
            None => Err("a record without a key".to_owned()),
        };
        if let Err(reason) = result {
            self.corrupt = Some(reason);
        }
    }

    fn finish(self, task: &TaskId, topic: &str) -> Result<S, ChangelogError> {
        match self.corrupt {
            Some(reason) => Err(ChangelogError::Corrupt {
                task: task.clone(),
                topic: topic.to_owned(),
                reason,
            }),
            None => Ok(self.store),
        }
    }
}

/// A protocol store record: a UTF-8 key; a tombstone deletes.
fn put_protocol(store: &mut MemStore, key: Vec<u8>, value: Option<Vec<u8>>) -> Result<(), String> {
    let key = std::str::from_utf8(&key)
        .map_err(|_| "a protocol store key that is not UTF-8".to_owned())?;
    match value {
        Some(v) => {
            store.insert_raw(key, v);
        }
        None => {
            store.remove_raw(key);
        }
    }
    Ok(())
}

/// A fold store record: a key that names a fold slot; a tombstone deletes.
fn put_fold(store: &mut FoldStore, key: Vec<u8>, value: Option<Vec<u8>>) -> Result<(), String> {
    if crate::fold::FoldKey::from_bytes(&key).is_none() {
        return Err(format!("{} key bytes that name no fold slot", key.len()));
    }
    match value {
        Some(v) => store.put_bytes(key, v),
        None => store.remove_bytes(&key),
    }
    Ok(())
}

fn protocol_store(
    task: &TaskId,
    topic: &str,
    records: Vec<ChangelogRecord>,
) -> Result<MemStore, ChangelogError> {
    let mut p = Rebuild::<MemStore>::default();
    for r in records {
        p.apply(r, put_protocol);
    }
    p.finish(task, topic)
}
