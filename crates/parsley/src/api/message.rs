//! Delivered messages, their coordinates, and ticks.

use std::fmt;

pub use parsley_protocol::Header;

use crate::topic::{
    DEAD_LETTER_ERROR, DEAD_LETTER_OFFSET, DEAD_LETTER_PARTITION, DEAD_LETTER_TOPIC, Emission,
    IntoNullable, Payload, Topic,
};

/// Where a record sits: topic name, partition and offset.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Coordinate {
    /// The topic name.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset within the partition.
    pub offset: i64,
}

impl Coordinate {
    /// A coordinate.
    pub fn new(topic: impl Into<String>, partition: i32, offset: i64) -> Self {
        Coordinate {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl fmt::Display for Coordinate {
    /// `topic:partition@offset`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}", self.topic, self.partition, self.offset)
    }
}

/// A causally delivered record, decoded with its source topic's codecs.
///
/// Every cause of it that the stage consumes has been delivered before it.
/// The coordinate, timestamp and headers are the record's own, also when it
/// waited in a hold queue and was released by another record's arrival. The
/// headers are the record's non-Parsley headers (`vc`, `vc-sender` and
/// `vc-seq` are the runtime's).
///
/// Build one by hand to unit-test a handler:
///
/// ```
/// use parsley::{Codec, Message, Topic};
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let m = Message::new(&orders, "o-1", 250)
///     .with_position(2, 17)
///     .with_timestamp(1_000)
///     .with_header("trace", "abc");
/// assert_eq!(m.key().map(String::as_str), Some("o-1"));
/// assert_eq!(m.value(), Some(&250));
/// assert_eq!(m.coordinate().to_string(), "orders:2@17");
/// assert_eq!(m.header("trace"), Some(&b"abc"[..]));
/// ```
#[derive(Clone, PartialEq, Debug)]
pub struct Message<K, V> {
    key: Option<K>,
    value: Option<V>,
    topic: std::sync::Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: i64,
    headers: Vec<Header>,
}

impl<K: Payload, V: Payload> Message<K, V> {
    /// A message on `topic` at partition 0, offset 0, timestamp 0, without
    /// headers (for tests; the runtime builds real ones). Pass `None` for a
    /// null key or value.
    pub fn new(
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Self {
        Message {
            key: key.into_nullable(),
            value: value.into_nullable(),
            topic: topic.name().into(),
            partition: 0,
            offset: 0,
            timestamp: 0,
            headers: Vec::new(),
        }
    }
}

impl<K, V> Message<K, V> {
    pub(crate) fn from_parts(
        key: Option<K>,
        value: Option<V>,
        topic: std::sync::Arc<str>,
        partition: i32,
        offset: i64,
        timestamp: i64,
        headers: Vec<Header>,
    ) -> Self {
        Message {
            key,
            value,
            topic,
            partition,
            offset,
            timestamp,
            headers,
        }
    }

    /// The same message at another partition and offset.
    pub fn with_position(mut self, partition: i32, offset: i64) -> Self {
        self.partition = partition;
        self.offset = offset;
        self
    }

    /// The same message with another timestamp.
    pub fn with_timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The same message with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers
            .push(Header::new(Into::<String>::into(name), value));
        self
    }

    /// The key; `None` for a null key.
    pub fn key(&self) -> Option<&K> {
        self.key.as_ref()
    }

    /// The value; `None` for a null value (a tombstone).
    pub fn value(&self) -> Option<&V> {
        self.value.as_ref()
    }

    /// Key and value, by value.
    pub fn into_key_value(self) -> (Option<K>, Option<V>) {
        (self.key, self.value)
    }

    /// The source topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition the record was read from.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The record's timestamp (milliseconds since the epoch). Emissions
    /// inherit it unless they set their own.
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// The record's coordinate.
    pub fn coordinate(&self) -> Coordinate {
        Coordinate::new(self.topic.to_string(), self.partition, self.offset)
    }

    /// The record's non-Parsley headers, in record order.
    pub fn headers(&self) -> &[Header] {
        &self.headers
    }

    /// The value of the first header called `name` (`None` if absent or
    /// null).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
    }
}

/// A tick: wall-clock time delivered as data, through the causal gate.
///
/// A ticking stage emits one tick record per task per interval to its tick
/// topic and consumes it back; the tick's stamp claims everything the task
/// had delivered when it fired. Tick logic receives the tick's timestamp
/// (the task's wall clock at emission) and the task's partition.
///
/// ```
/// use parsley::Tick;
/// let t = Tick::new(60_000);
/// assert_eq!(t.timestamp(), 60_000);
/// assert_eq!(t.partition(), 0);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Tick {
    timestamp: i64,
    partition: i32,
}

impl Tick {
    /// A tick at `timestamp` on partition 0.
    pub fn new(timestamp: i64) -> Self {
        Tick {
            timestamp,
            partition: 0,
        }
    }

    /// The same tick on another partition.
    pub fn on_partition(mut self, partition: i32) -> Self {
        self.partition = partition;
        self
    }

    /// The task's wall clock when the tick was emitted.
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// The emitting task's partition (ticks are scoped to one task's slice
    /// of its sources).
    pub fn partition(&self) -> i32 {
        self.partition
    }
}

/// Kept beside [`Message`], whose coordinate it copies, so that the topic
/// module does not import this one.
impl Emission {
    /// The same emission carrying the dead-letter headers for a record that
    /// could not be processed: the error and the source record's
    /// coordinate ([`DEAD_LETTER_ERROR`], [`DEAD_LETTER_TOPIC`],
    /// [`DEAD_LETTER_PARTITION`], [`DEAD_LETTER_OFFSET`]), so whoever reads
    /// the dead-letter topic can find the original and the reason.
    ///
    /// ```
    /// use parsley::{Codec, Message, Topic, DEAD_LETTER_ERROR, DEAD_LETTER_OFFSET};
    /// let orders: Topic<String, String> = Topic::new("orders", Codec::utf8(), Codec::utf8());
    /// let dead: Topic<String, String> = Topic::new("orders-dlq", Codec::utf8(), Codec::utf8());
    /// let m = Message::new(&orders, "o-1", "{not json").with_position(0, 41);
    /// let e = dead
    ///     .send(m.key().cloned(), m.value().cloned())
    ///     .dead_letter(&m, "expected value at line 1 column 2");
    /// assert_eq!(e.header(DEAD_LETTER_OFFSET), Some(&b"41"[..]));
    /// assert_eq!(e.header(DEAD_LETTER_ERROR), Some(&b"expected value at line 1 column 2"[..]));
    /// ```
    pub fn dead_letter<K, V>(self, source: &Message<K, V>, error: impl fmt::Display) -> Self {
        self.with_header(DEAD_LETTER_ERROR, error.to_string())
            .with_header(DEAD_LETTER_TOPIC, source.topic())
            .with_header(DEAD_LETTER_PARTITION, source.partition().to_string())
            .with_header(DEAD_LETTER_OFFSET, source.offset().to_string())
    }
}
