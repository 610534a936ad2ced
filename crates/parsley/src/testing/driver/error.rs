//! What the driver reports when a call fails.

use super::*;

/// A failure the driver reports.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A task failed; its step was aborted. Committed state is as before the
    /// step, and the next run retries from there.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// No such topic in the driver.
    #[error(
        "topic {topic:?} does not exist in this driver; declare it in a stage or create it with TestDriverBuilder::partitions"
    )]
    UnknownTopic {
        /// The topic.
        topic: String,
    },
    /// A topic was given a partition count below one.
    #[error("topic {topic:?} was given {partitions} partition(s); a topic needs at least one")]
    PartitionCount {
        /// The topic.
        topic: String,
        /// The count given.
        partitions: i32,
    },
    /// No such stage in the application.
    #[error("the application has no stage {stage:?}")]
    UnknownStage {
        /// The stage.
        stage: String,
    },
    /// A partition outside the topic.
    #[error("partition {partition} does not exist: topic {topic:?} has {partitions} partition(s)")]
    InvalidPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
        /// The topic's partition count.
        partitions: i32,
    },
    /// A piped key or value did not encode.
    #[error("the {part} piped to {topic:?} does not encode: {cause}")]
    Encode {
        /// The topic.
        topic: String,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// A committed record did not decode with the topic's codecs.
    #[error("the {part} of {coordinate} does not decode: {cause}")]
    Decode {
        /// The record.
        coordinate: Coordinate,
        /// Key or value.
        part: Part,
        /// The codec's error.
        cause: CodecError,
    },
    /// The stage has no state, or state of another type.
    #[error("stage {stage:?} has {found}, not state of type {expected}")]
    StateType {
        /// The stage.
        stage: String,
        /// The type asked for.
        expected: &'static str,
        /// What the stage has.
        found: String,
    },
    /// Stored state did not decode.
    #[error("state of stage {stage:?} does not decode: {cause}")]
    StateDecode {
        /// The stage.
        stage: String,
        /// The codec's error.
        cause: CodecError,
    },
    /// The host core refused (for example a changelog with the wrong
    /// partition count).
    #[error(transparent)]
    Worker(WorkerError),
    /// A state query found the stage's task not running (it failed and
    /// stopped).
    #[error("stage {stage:?} could not answer the state query: {answer}")]
    QueryNotAnswered {
        /// The stage queried.
        stage: String,
        /// What the worker answered.
        answer: String,
    },
    /// A causal state query found causes the stage has not delivered.
    #[error(
        "stage {stage:?} has not delivered every cause of the query: {}",
        waiting_on.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    CausesMissing {
        /// The stage queried.
        stage: String,
        /// What its task still waits for, as `explain_holds` says it.
        waiting_on: Vec<crate::holds::WaitingOn>,
    },
    /// A causal state query named a record on a partition of the stage's
    /// own input that the key's task does not read: the key's state can
    /// never reflect it. Its producer placed the key by another
    /// partitioner than the topic declares.
    #[error(
        "stage {stage:?}: record {cause} is on a partition the key's task ({task_partition}) does not read, so the key's state can never include it; the topic's declared partitioner ({partitioner:?}) places the key on partition {task_partition}, and its producer placed it elsewhere (declare the producer's partitioner with Topic::partitioned_by)"
    )]
    KeyNotOnPartition {
        /// The stage queried.
        stage: String,
        /// The partition of the key's task.
        task_partition: i32,
        /// The record the query named.
        cause: crate::Coordinate,
        /// The partitioner the stage's sources declare.
        partitioner: crate::partition::Partitioner,
    },
    /// A causal state query named a record on a topic that reaches the
    /// queried stage only through other stages. Whether its effect has
    /// reached the stage's state cannot be told yet, and the query does not
    /// answer rather than risk a stale answer.
    #[error(
        "stage {stage:?}: record {cause} is on a topic that reaches the stage only through {}; this version cannot tell when its effect has reached the stage's state, and does not answer rather than answer without it. Name the records the stage consumes, or query the stage that consumes {} (see the guide's \"Reading your own writes\")",
        via.join(", "), cause.topic
    )]
    UpstreamCause {
        /// The stage queried.
        stage: String,
        /// The record the query named.
        cause: crate::Coordinate,
        /// The stages of the application that read its topic on the way.
        via: Vec<String>,
    },
    /// The application did not settle within the step budget.
    #[error(
        "the application did not settle within {steps} steps; a cycle whose logic never converges keeps emitting (emit only on change, or count rounds in state)"
    )]
    NoQuiescence {
        /// The budget.
        steps: usize,
    },
}

impl From<WorkerError> for DriverError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Task(t) => DriverError::Task(t),
            other => DriverError::Worker(other),
        }
    }
}
