//! Records written into a changelog from outside a task's run: a step
//! past a record (`parsley skip`) and a reset (`parsley reset`).

use super::*;

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
            inputs: scope.inputs_text(),
        });
    }
    Ok(ChangelogRecord {
        // The broker gives it its offset when it is appended.
        offset: -1,
        key: Some(StateKey::Stepped(channel, offset).to_key().into_bytes()),
        value: Some(stepped.encode()),
    })
}

/// A task's state changelog that a reset cannot rewrite.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the state changelog of task {task} cannot be reset: {reason}")]
pub struct ResetRefused {
    /// The task.
    pub task: TaskId,
    /// What is wrong.
    pub reason: String,
}

/// The state changelog records that reset a task for reprocessing
/// (`parsley reset`), to append to its partition of the stage's state
/// changelog while the application is stopped. `current` is the
/// partition's committed records; `points` where each of the task's inputs
/// is read again from, and what lies below. What the reset keeps and why
/// is [`parsley_protocol::reset`]'s to say; empty when the state is
/// already reset to these points.
pub fn reset_records(
    task: &TaskId,
    current: Vec<ChangelogRecord>,
    points: &BTreeMap<parsley_protocol::Channel, parsley_protocol::reset::ResetPoint>,
) -> Result<Vec<ChangelogRecord>, ResetRefused> {
    let refused = |reason: String| ResetRefused {
        task: task.clone(),
        reason,
    };
    let store = protocol_store(task, "", current).map_err(|e| refused(e.to_string()))?;
    let batch = parsley_protocol::reset::reset_writes(&store, points)
        .map_err(|e| refused(e.to_string()))?;
    Ok(batch
        .into_iter()
        .map(|(key, value)| ChangelogRecord {
            // The broker gives each its offset when it is appended.
            offset: -1,
            key: Some(key.to_key().into_bytes()),
            value,
        })
        .collect())
}

/// The fold changelog records that empty a task's fold state: a tombstone
/// for every key the committed records `current` leave with a value.
/// Empty when the state is already empty.
pub fn fold_reset_records(current: Vec<ChangelogRecord>) -> Vec<ChangelogRecord> {
    let mut last: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
    for r in current {
        if let Some(key) = r.key {
            last.insert(key, r.value.is_some());
        }
    }
    last.into_iter()
        .filter(|&(_, live)| live)
        .map(|(key, _)| ChangelogRecord {
            offset: -1,
            key: Some(key),
            value: None,
        })
        .collect()
}
