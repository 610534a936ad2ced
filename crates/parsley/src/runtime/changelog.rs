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

use parsley_protocol::MemStore;

use crate::fold::FoldStore;
use crate::runtime::task::{MetadataError, TaskId, TaskStores, TopicMetadata};

/// One committed changelog record, as read back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChangelogRecord {
    /// The store key.
    pub key: Option<Vec<u8>>,
    /// The stored bytes; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
}

/// Reads changelog partitions back, supplied by the host.
pub trait ChangelogReader {
    /// Every committed record of one changelog partition, from its log start
    /// to its end, in offset order (a `read_committed` replay).
    fn read_changelog(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ChangelogRecord>, MetadataError>;

    /// The same records, handed to `apply` one by one as they arrive, so a
    /// restore keeps only the live state, never every superseded version
    /// at once. The default reads them all first; a host that can stream
    /// overrides it.
    fn replay_changelog(
        &self,
        topic: &str,
        partition: i32,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<(), MetadataError> {
        for r in self.read_changelog(topic, partition)? {
            apply(r);
        }
        Ok(())
    }
}

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
    let mut stores = TaskStores::default();
    let mut protocol = Rebuild::<MemStore>::default();
    replay(task, state_changelog, tasks, metadata, reader, &mut |r| {
        protocol.apply(r, put_protocol)
    })?;
    stores.protocol = protocol.finish(task, state_changelog)?;
    if let Some(topic) = fold_changelog {
        let mut fold = Rebuild::<FoldStore>::default();
        replay(task, topic, tasks, metadata, reader, &mut |r| {
            fold.apply(r, put_fold)
        })?;
        stores.fold = fold.finish(task, topic)?;
    }
    Ok(stores)
}

fn replay(
    task: &TaskId,
    topic: &str,
    tasks: i32,
    metadata: &dyn TopicMetadata,
    reader: &dyn ChangelogReader,
    apply: &mut dyn FnMut(ChangelogRecord),
) -> Result<(), ChangelogError> {
    let unavailable = |source| ChangelogError::Unavailable {
        task: task.clone(),
        topic: topic.to_owned(),
        cause: source,
    };
    let d = metadata.describe(topic).map_err(unavailable)?;
    if d.partitions != tasks {
        return Err(ChangelogError::Partitions {
            task: task.clone(),
            topic: topic.to_owned(),
            expected: tasks,
            actual: d.partitions,
        });
    }
    reader
        .replay_changelog(topic, task.partition, apply)
        .map_err(unavailable)
}

/// How a store takes one changelog record (key, value or tombstone),
/// refusing one it never writes.
type Put<S> = fn(&mut S, Vec<u8>, Option<Vec<u8>>) -> Result<(), String>;

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

/// Why a step past cannot be recorded for a task ([`step_past_record`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The task has never run: there is no recorded scope to add to.
    #[error(
        "task {task} has no recorded state yet (its state changelog holds no scope): start the application once, so the task records what it consumes"
    )]
    NoScope {
        /// The task.
        task: TaskId,
    },
    /// The task does not consume the channel.
    #[error("task {task} does not consume {channel} (its recorded inputs: {inputs})")]
    NotAnInput {
        /// The task.
        task: TaskId,
        /// The channel named.
        channel: parsley_protocol::Channel,
        /// The channels it consumes.
        inputs: String,
    },
    /// The changelog does not restore.
    #[error("the state changelog of task {task} does not restore: {reason}")]
    Corrupt {
        /// The task.
        task: TaskId,
        /// What is wrong.
        reason: String,
    },
}

/// The state changelog record that makes a task step past one input
/// record: appended to the task's partition of the stage's state changelog
/// while the application is stopped, it is part of the protocol store the
/// task restores, and the task then sends the record at `offset` of
/// `channel` to `stepped.dead_letter` instead of delivering it (the CLI's
/// `parsley skip`). `current` is the partition's committed records, from
/// which the task's recorded scope is checked: the restore refuses an
/// entry for a channel the task does not consume, so this refuses it first.
pub fn step_past_record(
    task: &TaskId,
    current: Vec<ChangelogRecord>,
    channel: parsley_protocol::Channel,
    offset: i64,
    stepped: &parsley_protocol::SteppedPast,
) -> Result<ChangelogRecord, StepError> {
    use parsley_protocol::StateKey;
    use parsley_protocol::store::ScopeRecord;
    let store = protocol_store(task, "", current).map_err(|e| StepError::Corrupt {
        task: task.clone(),
        reason: e.to_string(),
    })?;
    let Some(scope) = store.get_state(StateKey::Scope) else {
        return Err(StepError::NoScope { task: task.clone() });
    };
    let scope = ScopeRecord::decode(scope).map_err(|reason| StepError::Corrupt {
        task: task.clone(),
        reason,
    })?;
    if !scope.inputs.contains(&channel) {
        return Err(StepError::NotAnInput {
            task: task.clone(),
            channel,
            inputs: scope
                .inputs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(ChangelogRecord {
        key: Some(StateKey::Stepped(channel, offset).to_key().into_bytes()),
        value: Some(stepped.encode()),
    })
}
