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
    let records = read(task, state_changelog, tasks, metadata, reader)?;
    stores.protocol = protocol_store(task, state_changelog, records)?;
    if let Some(topic) = fold_changelog {
        let records = read(task, topic, tasks, metadata, reader)?;
        stores.fold = fold_store(task, topic, records)?;
    }
    Ok(stores)
}

fn read(
    task: &TaskId,
    topic: &str,
    tasks: i32,
    metadata: &dyn TopicMetadata,
    reader: &dyn ChangelogReader,
) -> Result<Vec<ChangelogRecord>, ChangelogError> {
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
        .read_changelog(topic, task.partition)
        .map_err(unavailable)
}

fn protocol_store(
    task: &TaskId,
    topic: &str,
    records: Vec<ChangelogRecord>,
) -> Result<MemStore, ChangelogError> {
    let corrupt = |reason: String| ChangelogError::Corrupt {
        task: task.clone(),
        topic: topic.to_owned(),
        reason,
    };
    let mut store = MemStore::new();
    for r in records {
        let Some(key) = r.key else {
            return Err(corrupt("a record without a key".to_owned()));
        };
        let key = std::str::from_utf8(&key)
            .map_err(|_| corrupt("a protocol store key that is not UTF-8".to_owned()))?;
        match r.value {
            Some(v) => {
                store.insert_raw(key, v);
            }
            None => {
                store.remove_raw(key);
            }
        }
    }
    Ok(store)
}

fn fold_store(
    task: &TaskId,
    topic: &str,
    records: Vec<ChangelogRecord>,
) -> Result<FoldStore, ChangelogError> {
    let mut store = FoldStore::new();
    for r in records {
        let Some(key) = r.key else {
            return Err(ChangelogError::Corrupt {
                task: task.clone(),
                topic: topic.to_owned(),
                reason: "a record without a key".to_owned(),
            });
        };
        if crate::fold::FoldKey::from_bytes(&key).is_none() {
            return Err(ChangelogError::Corrupt {
                task: task.clone(),
                topic: topic.to_owned(),
                reason: format!("{} key bytes that name no fold slot", key.len()),
            });
        }
        match r.value {
            Some(v) => store.put_bytes(key, v),
            None => store.remove_bytes(&key),
        }
    }
    Ok(store)
}
