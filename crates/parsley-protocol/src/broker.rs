//! The broker-offset seam: the two broker facts the node needs.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::TopicId;

/// A broker's answer for one topic.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TopicOffsets {
    /// The topic exists; one offset per partition.
    Present(BTreeMap<i32, i64>),
    /// The topic definitively does not exist (it was deleted, or a topic
    /// recreated under the same name has a different id). A failed or
    /// uncertain lookup must be reported as an error instead.
    Absent,
}

/// A broker-offset query that could not be answered. The node never guesses
/// around it: init fails, and a truncation sweep skips its cycle.
#[derive(Debug, thiserror::Error)]
#[error("broker offset query failed: {message}")]
pub struct BrokerOffsetsError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BrokerOffsetsError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        BrokerOffsetsError {
            message: message.into(),
            source: None,
        }
    }

    /// An error with a message and an underlying cause.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BrokerOffsetsError {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// Broker offset facts, answered by topic id.
///
/// Implementations must be strict: every requested topic gets an answer, a
/// topic that exists is `Present` with every partition, and `Absent` is said
/// only when the topic is known not to exist. Anything less is an error.
pub trait BrokerOffsets {
    /// The end offset (the offset the next appended record would get) of
    /// every partition of each topic.
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError>;

    /// The log-start offset (the first offset retention still keeps) of every
    /// partition of each topic.
    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError>;
}

/// Looks up `topic` in an answer, treating a missing answer as an error.
pub(crate) fn answer_for(
    answers: &BTreeMap<TopicId, TopicOffsets>,
    topic: TopicId,
) -> Result<&TopicOffsets, BrokerOffsetsError> {
    answers
        .get(&topic)
        .ok_or_else(|| BrokerOffsetsError::new(format!("no answer for topic {topic}")))
}
