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

    /// The records at offset `from` and above, handed to `apply` in offset
    /// order (the tail a local store's checkpoint leaves to read). The
    /// default filters a whole replay; a host that can seek overrides it.
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<(), MetadataError> {
        self.replay_changelog(topic, partition, &mut |r| {
            if r.offset >= from {
                apply(r);
            }
        })
    }
}

/// Everything the worker may ask of the cluster: topic metadata, broker
/// offsets, and changelog replay.
pub trait Cluster: TopicMetadata + BrokerOffsets + ChangelogReader {}

impl<T: TopicMetadata + BrokerOffsets + ChangelogReader> Cluster for T {}
