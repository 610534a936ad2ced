//! The node's typed errors. Each one is a refusal to guess: the host fails
//! the task (aborting its transaction) rather than deliver out of order,
//! drop a record, or start from state it cannot trust.

use crate::broker::BrokerOffsetsError;
use crate::ids::{Channel, TopicId};
use crate::store::CorruptState;

/// Everything [`CausalNode`](crate::CausalNode) can refuse.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A record or position advance for a channel this node does not consume.
    #[error("{operation} on channel {channel}, which this node does not consume")]
    UnconsumedChannel {
        /// The channel named by the host.
        channel: Channel,
        /// `"record"`, `"position advance"` or `"step past"`.
        operation: &'static str,
    },
    /// A send to a topic that is not a declared sink.
    #[error("send to {channel}: topic {} is not a declared sink of this node", .channel.topic)]
    UndeclaredSink {
        /// The destination the host asked to stamp for.
        channel: Channel,
    },
    /// A record handed over out of offset order: at or below a record
    /// already received, or below a position the host already reported.
    #[error(
        "record {channel}@{offset} is out of order: the node already knows the channel up to offset {known}"
    )]
    OutOfOrder {
        /// The channel.
        channel: Channel,
        /// The offending offset.
        offset: i64,
        /// The highest offset already received or reported skipped.
        known: i64,
    },
    /// At init, an input leaving the scope still has held records. They can
    /// neither be delivered (the input is gone) nor discarded.
    #[error(
        "input {channel} is leaving the scope with {held} held record(s); redeclare it as an input or reset the application's state"
    )]
    HeldRecordsOnDepartingInput {
        /// The departing channel.
        channel: Channel,
        /// How many records it holds.
        held: i64,
    },
    /// A hold queue's indices promise an entry the store does not have.
    #[error(
        "hold queue of {channel} is missing entry {index} (indices claim {head}..{tail}); the store lost held records"
    )]
    MissingHeldRecords {
        /// The channel.
        channel: Channel,
        /// The first missing index.
        index: i64,
        /// The persisted head index.
        head: i64,
        /// The persisted tail index.
        tail: i64,
    },
    /// A record the host paged back in is not the one the hold queue
    /// holds at that place (see [`CausalNode::page_in`](crate::CausalNode::page_in)).
    #[error(
        "paged-in record {channel}@{found} does not match the held record @{expected} at that place in the hold queue; the store's held records disagree with the node"
    )]
    PagedRecordMismatch {
        /// The channel.
        channel: Channel,
        /// The offset the queue holds there (-1: no paged record there).
        expected: i64,
        /// The offset of the record handed in.
        found: i64,
    },
    /// A persisted key or value that does not parse.
    #[error(transparent)]
    CorruptState(#[from] CorruptState),
    /// A declared sink topic does not exist at init.
    #[error("declared sink topic {topic} does not exist; create it before starting")]
    MissingSink {
        /// The missing topic.
        topic: TopicId,
    },
    /// A broker offset query failed.
    #[error(transparent)]
    BrokerOffsets(#[from] BrokerOffsetsError),
    /// The node configuration is unusable.
    #[error("invalid node configuration: {0}")]
    InvalidConfig(String),
}
