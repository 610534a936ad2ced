//! The host interface in one place: what the core asks of the cluster, and
//! the values a host and the [`Worker`](crate::runtime::worker::Worker)
//! exchange about partitions and records.
//!
//! A host answers three kinds of question, each a trait here or in the
//! protocol crate: topic metadata by name ([`TopicMetadata`]), broker
//! offsets ([`BrokerOffsets`]: end offsets and log starts), and changelog
//! reads ([`ChangelogReader`]). [`Cluster`] is all three, and is what the
//! worker takes. The Kafka runtime answers them from the broker, the
//! [`TestDriver`](crate::TestDriver) from its in-memory log, the simulator
//! from its modelled broker. The core asks them synchronously; where and why
//! is written down in the decisions page.
//!
//! The records and requests that cross between a host and the worker are
//! here too: a polled record in, an assigned partition in, a seek and a
//! fetch pause or resume out. The record types themselves are defined in
//! the protocol crate ([`parsley_protocol::host`]) and re-exported here, so
//! that the simulator, which does not depend on this crate, uses the same
//! ones.

use parsley_protocol::TopicId;
pub use parsley_protocol::host::{AssignedPartition, FlowChange, PolledRecord, RecordView, Seek};
pub use parsley_protocol::{BrokerOffsets, BrokerOffsetsError, TopicOffsets};

/// A topic as the cluster (or the test driver) describes it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TopicDescription {
    /// The topic's id.
    pub id: TopicId,
    /// Its partition count.
    pub partitions: i32,
}

/// A topic lookup that could not be answered.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum MetadataError {
    /// The topic does not exist.
    #[error("topic {0:?} does not exist; create it before starting the application")]
    Missing(String),
    /// The lookup failed.
    #[error("metadata lookup for topic {topic:?} failed: {message}")]
    Failed {
        /// The topic.
        topic: String,
        /// What went wrong.
        message: String,
    },
    /// A changelog replay stopped making progress: nothing arrived for
    /// `stalled_for` while the partition's end lay ahead (an upstream
    /// transaction left open blocks a `read_committed` replay, or the
    /// broker stopped serving it). Not retried at once: the task fails.
    #[error(
        "the replay of changelog {topic}:{partition} made no progress for {stalled_for:?}: it had read up to offset {at} and the partition ends at {end}"
    )]
    Stalled {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The next offset the replay was waiting for.
        at: i64,
        /// The partition's end (high watermark) when it gave up.
        end: i64,
        /// How long nothing arrived.
        stalled_for: std::time::Duration,
    },
}

/// Topic metadata by name, supplied by the host.
pub trait TopicMetadata {
    /// The id and partition count of `topic`.
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError>;
}

/// One committed changelog record, as read back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChangelogRecord {
    /// Its offset in the changelog partition.
    pub offset: i64,
    /// The store key.
    pub key: Option<Vec<u8>>,
    /// The stored bytes; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
}

/// Reads changelog partitions back, supplied by the host.
///
/// A replay reads as a `read_committed` consumer does, and says where it
/// stopped: the offset below which every offset is resolved (its committed
/// records handed over, aborted records and transaction markers passed),
/// which is the partition's last stable offset when it ran. A transaction
/// whose commit marker has not reached this partition yet stops it below
/// that transaction's records, even when the transaction committed
/// elsewhere (its consumed offsets, say): Kafka writes a transaction's
/// markers partition by partition. The worker compares where a replay
/// stopped with the end the task started against, and waits for a
/// replay that falls short instead of starting a task that misses writes
/// ([`ChangelogError::Unstable`](crate::runtime::changelog::ChangelogError::Unstable)).
pub trait ChangelogReader {
    /// The committed records of one changelog partition at offset `from`
    /// and above (from its log start, when that is above `from`), handed
    /// to `apply` in offset order as they arrive, so a restore keeps only
    /// the live state, never every superseded version at once. Returns
    /// the offset where the replay stopped (see the trait's
    /// documentation).
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError>;

    /// The same, from the partition's log start.
    fn replay_changelog(
        &self,
        topic: &str,
        partition: i32,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        self.replay_changelog_from(topic, partition, 0, apply)
    }

    /// Every committed record of one changelog partition from its log
    /// start to where a replay stops, in offset order.
    fn read_changelog(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ChangelogRecord>, MetadataError> {
        let mut out = Vec::new();
        self.replay_changelog(topic, partition, &mut |r| out.push(r))?;
        Ok(out)
    }
}

/// Everything the worker may ask of the cluster: topic metadata, broker
/// offsets, and changelog replay.
pub trait Cluster: TopicMetadata + BrokerOffsets + ChangelogReader {}

impl<T: TopicMetadata + BrokerOffsets + ChangelogReader> Cluster for T {}
