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
//! fetch pause or resume out.

use parsley_protocol::TopicId;
pub use parsley_protocol::{BrokerOffsets, BrokerOffsetsError, TopicOffsets};

use crate::message::Header;

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

/// One partition the group assigned, with the facts the worker needs to
/// choose its start.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AssignedPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The group's committed position, if any.
    pub committed: Option<i64>,
    /// The partition's log start.
    pub log_start: i64,
    /// The partition's end (last stable offset), for [`StartPolicy::Latest`](crate::runtime::worker::StartPolicy::Latest);
    /// `None` when the lookup gave no answer. A channel that needs it (no
    /// committed position, start policy latest) then fails its task with
    /// [`WorkerError::EndUnknown`](crate::runtime::failure::WorkerError::EndUnknown) rather than guess.
    pub end: Option<i64>,
}

/// A fetched record as a host hands it to the worker: read through, never
/// taken over. The task copies out of it only what it keeps (the key, the
/// value and the headers other than the stamp's, when the record goes on
/// to its gate); the stamp's headers are decoded where they lie. The Kafka
/// runtime hands over a view of librdkafka's message this way, so a
/// fetched record is copied once; a host that owns its records hands over
/// a [`PolledRecord`].
pub trait RecordView {
    /// The topic.
    fn topic(&self) -> &str;
    /// The partition.
    fn partition(&self) -> i32;
    /// The offset.
    fn offset(&self) -> i64;
    /// The timestamp, in milliseconds since the epoch.
    fn timestamp(&self) -> i64;
    /// The key bytes; `None` is a null key.
    fn key(&self) -> Option<&[u8]>;
    /// The value bytes; `None` is a null value.
    fn value(&self) -> Option<&[u8]>;
    /// How many headers the record has.
    fn header_count(&self) -> usize;
    /// Header `index` (in record order) as name and value; `None` past the
    /// last.
    fn header(&self, index: usize) -> Option<(&str, Option<&[u8]>)>;
}

impl dyn RecordView + '_ {
    /// Every header, in record order.
    pub fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> + '_ {
        (0..self.header_count()).filter_map(|i| self.header(i))
    }
}

/// A record as a poll returned it, owned: what a host that keeps its own
/// copy hands over (the TestDriver, the simulator).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PolledRecord {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Every header, in record order.
    pub headers: Vec<Header>,
}

impl RecordView for PolledRecord {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn partition(&self) -> i32 {
        self.partition
    }
    fn offset(&self) -> i64 {
        self.offset
    }
    fn timestamp(&self) -> i64 {
        self.timestamp
    }
    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }
    fn header_count(&self) -> usize {
        self.headers.len()
    }
    fn header(&self, index: usize) -> Option<(&str, Option<&[u8]>)> {
        self.headers
            .get(index)
            .map(|h| (h.name(), h.value.as_deref()))
    }
}

/// A consumer seek the host must make.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Seek {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to fetch.
    pub offset: i64,
}

/// A partition whose fetching pauses or resumes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FlowChange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// True to pause fetching, false to resume it.
    pub paused: bool,
}
