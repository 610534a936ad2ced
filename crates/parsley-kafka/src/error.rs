//! What the runtime reports about itself: where an application is
//! ([`StreamsState`]) and what it refuses or fails with ([`StreamsError`]).
//! Kept apart from the runtime so that the policies and the restorer can
//! name them without importing the runtime that imports them.

use parsley::runtime::host::MetadataError;
use parsley::runtime::worker::WorkerError;
use rdkafka::error::KafkaError;

/// Where a running application is.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StreamsState {
    /// Built, not started.
    Created,
    /// Threads are running, but at least one is joining the group, in a
    /// rebalance, or starting the tasks of its assignment (lookups and
    /// changelog restores).
    Rebalancing,
    /// Every stream thread has its assignment and processes every task of
    /// it (a task stopped after a failure, waiting for its restart, does
    /// not make the instance rebalance).
    Running,
    /// Closing.
    Stopping,
    /// Closed cleanly.
    Stopped,
    /// A thread failed; the message says why.
    Failed(String),
}

/// What the runtime refuses or reports.
#[derive(Debug, thiserror::Error)]
pub enum StreamsError {
    /// A client setting contradicts what the runtime needs.
    #[error("client setting {setting:?} = {value:?} is not allowed: {reason}")]
    Config {
        /// The setting.
        setting: String,
        /// The value given.
        value: String,
        /// Why the runtime refuses it.
        reason: String,
    },
    /// [`GroupProtocol::Consumer`](crate::GroupProtocol::Consumer) was
    /// asked for, and the cluster's brokers say they do not serve it: its
    /// members would wait for an assignment that never comes.
    #[error(
        "StreamsOptions::group_protocol asks for the consumer group protocol (KIP-848), which the cluster does not serve: {offered}. Kafka 4.0 and later serve it; set GroupProtocol::Classic, or leave group_protocol unset to choose by what the cluster serves"
    )]
    GroupProtocolUnsupported {
        /// What the brokers said (their `group.coordinator.rebalance.protocols`).
        offered: String,
    },
    /// A topic the application declares does not exist.
    #[error("topic {topic:?} does not exist; create it before starting the application")]
    MissingTopic {
        /// The topic.
        topic: String,
    },
    /// A stage's source topics (and its tick topic) disagree on partition
    /// count, so related keys would not meet in one task.
    #[error(
        "stage {stage:?}: its topics must all have the same partition count, but {}; recreate them with equal counts",
        counts.iter().map(|(t, n)| format!("{t:?} has {n}")).collect::<Vec<_>>().join(", ")
    )]
    PartitionCounts {
        /// The stage.
        stage: String,
        /// Each source (and the tick topic) with its partition count.
        counts: Vec<(String, i32)>,
    },
    /// An existing changelog topic cannot hold the application's state.
    #[error("changelog topic {topic:?} cannot be used: {reason}")]
    Changelog {
        /// The topic.
        topic: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The Kafka client failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The host core refused.
    #[error(transparent)]
    Worker(Box<WorkerError>),
    /// A lookup failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The application is not in a state for this call.
    #[error("the application is {0:?}")]
    State(StreamsState),
    /// A task failed and stopped (its error aborted the thread's open
    /// transaction; the thread's other tasks went on).
    #[error("task {task} failed ({} failure(s) in a row): {error}", .earlier_in_a_row + 1)]
    Task {
        /// The task.
        task: parsley::TaskId,
        /// Why it failed.
        error: String,
        /// Its failures in a row before this one.
        earlier_in_a_row: u32,
        /// Whether the failure passes with time: a codec could not reach
        /// its schema registry ([`parsley::CodecError::transient`]). The
        /// record is not at fault; without a handler, the task restarts
        /// in place after its backoff and retries it.
        transient: bool,
    },
    /// The state directory cannot be used (another instance holds it, or
    /// it cannot be created).
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::StateDirError),
    /// A stream thread failed.
    #[error("stream thread {thread} failed: {message}")]
    Thread {
        /// The thread index.
        thread: usize,
        /// Why.
        message: String,
    },
}

impl StreamsError {
    /// Whether the failure passes with time: a task whose codec could not
    /// reach its schema registry. The default response to it (no handler
    /// set) restarts the task in place after its backoff; a handler of
    /// your own can ask the same.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StreamsError::Task {
                transient: true,
                ..
            }
        )
    }
}

impl From<WorkerError> for StreamsError {
    fn from(e: WorkerError) -> Self {
        StreamsError::Worker(Box::new(e))
    }
}

/// Whether librdkafka flags an error the consumer's poll returned as fatal
/// (it will not recover the consumer); the others it retries itself.
pub(crate) fn consumer_error_is_fatal(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageConsumptionFatal(_))
        || e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::Fatal)
}
