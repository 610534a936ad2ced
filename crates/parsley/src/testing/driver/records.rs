//! Records in and out of a [`TestDriver`]: the inputs a test writes, the
//! outputs it reads back (typed, raw, or described with their stamps), and
//! what reached each stage's logic.

use super::*;

/// A record that reached a stage's logic, as the driver's delivery log
/// records it (committed steps only).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StageDelivery {
    /// The task that delivered it.
    pub task: TaskId,
    /// The record's own coordinate.
    pub coordinate: Coordinate,
    /// The record's timestamp.
    pub timestamp: i64,
    /// True when it waited in a hold queue first.
    pub was_held: bool,
    /// True for a tick.
    pub tick: bool,
}

/// A committed record read back from a topic, decoded with the topic's
/// codecs. Its `{:?}` shows the dependency clock with topic names (and the
/// producing task of each sender the driver knows) instead of ids.
#[derive(Clone, PartialEq)]
pub struct OutputRecord<K, V> {
    /// The key; `None` for a null key.
    pub key: Option<K>,
    /// The value; `None` for a tombstone.
    pub value: Option<V>,
    /// Where it sits.
    pub coordinate: Coordinate,
    /// Its timestamp.
    pub timestamp: i64,
    /// Every header, in record order (`vc`, `vc-sender`, `vc-seq` included).
    pub headers: Vec<Header>,
    /// The task that produced it, named by the stamp it wrote; `None` for
    /// a piped record and for a record a task writes unstamped (its
    /// changelog records and dead letters).
    pub producer: Option<TaskId>,
    /// The clock, described with names (see [`describe_clock`](Self::describe_clock)).
    clock_text: String,
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for OutputRecord<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputRecord")
            .field("key", &self.key)
            .field("value", &self.value)
            .field("coordinate", &format_args!("{}", self.coordinate))
            .field("timestamp", &self.timestamp)
            .field("clock", &format_args!("{}", self.clock_text))
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .filter(|h| !is_causal_header(&h.name))
                    .collect::<Vec<_>>(),
            )
            .field("producer", &self.producer)
            .finish()
    }
}

impl<K, V> OutputRecord<K, V> {
    /// The dependency clock with topic names instead of topic ids, and each
    /// sender as the task the driver knows it by: for example
    /// `{orders:0 <= 3, settled:0 seq(settlement/0) <= 2}`; `unstamped` or
    /// `corrupt: ...` when there is no clock to show.
    pub fn describe_clock(&self) -> &str {
        &self.clock_text
    }

    /// The record's causal headers, parsed strictly.
    pub fn causal(&self) -> Result<CausalHeaders, CorruptHeader> {
        causal_headers(&self.headers)
    }

    /// The record's dependency clock (empty when unstamped or corrupt).
    pub fn clock(&self) -> VectorClock {
        self.causal().map(|c| c.clock).unwrap_or_default()
    }

    /// The sender identity from `vc-sender`, if stamped.
    pub fn sender(&self) -> Option<SenderId> {
        self.causal().ok()?.sender.map(|t| t.sender)
    }

    /// True when the record carries a `vc` header.
    pub fn is_stamped(&self) -> bool {
        self.header(CLOCK_HEADER).is_some()
    }

    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
    }
}

/// A committed record with raw bytes (see [`TestDriver::raw_records`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RawRecord {
    /// Where it sits.
    pub coordinate: Coordinate,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Its timestamp.
    pub timestamp: i64,
    /// Every header.
    pub headers: Vec<Header>,
    /// The task that produced it, named by the stamp it wrote; `None` for
    /// a piped record and for a record a task writes unstamped (its
    /// changelog records and dead letters).
    pub producer: Option<TaskId>,
}

/// A record to pipe into a topic, with optional partition, timestamp,
/// headers and causal claims. Built from a typed key and value.
///
/// ```
/// use parsley::{Codec, Coordinate, Input, Topic};
/// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
/// // A payment with a header, claiming the first order as its cause.
/// let input: Input<String, i64> = Input::new("acct-1", 50)
///     .header("trace", "t-1")
///     .after(&Coordinate::new("orders", 0, 0));
/// # let _ = (payments, input);
/// ```
#[derive(Clone, Debug)]
pub struct Input<K, V> {
    pub(super) key: Option<K>,
    pub(super) value: Option<V>,
    pub(super) partition: Option<i32>,
    pub(super) timestamp: Option<i64>,
    pub(super) headers: Vec<Header>,
    pub(super) after: Vec<Coordinate>,
    pub(super) clock: VectorClock,
}

impl<K, V> Input<K, V> {
    /// A record with this key and value (`None` for null).
    pub fn new(key: impl IntoNullable<K>, value: impl IntoNullable<V>) -> Self {
        Input {
            key: key.into_nullable(),
            value: value.into_nullable(),
            partition: None,
            timestamp: None,
            headers: Vec::new(),
            after: Vec::new(),
            clock: VectorClock::new(),
        }
    }

    /// Pipes to this partition instead of the key's.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Uses this timestamp instead of the driver's wall clock.
    pub fn timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// Adds a header. A header named `vc`, `vc-sender` or `vc-seq` is
    /// passed as given (a way to pipe corrupt stamps on purpose).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers
            .push(Header::new(Into::<String>::into(name), value));
        self
    }

    /// Claims the record at `cause` (which need not exist yet): the piped
    /// record's `vc` stamp names it, so a stage consuming both holds this
    /// record until the cause is delivered.
    pub fn after(mut self, cause: &Coordinate) -> Self {
        self.after.push(cause.clone());
        self
    }

    /// Merges a raw clock into the record's `vc` stamp.
    pub fn clock(mut self, clock: &VectorClock) -> Self {
        self.clock.merge(clock);
        self
    }
}

impl TestDriver {
    /// Every committed record of `topic` (piped and produced), in append
    /// order, decoded with the topic's codecs.
    pub fn records<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
    ) -> Result<Vec<OutputRecord<K, V>>, DriverError> {
        self.raw_records(topic.name())?
            .into_iter()
            .map(|r| {
                let key = decode_part(
                    &r.coordinate,
                    topic.key_codec(),
                    r.key.as_deref(),
                    Part::Key,
                )?;
                let value = decode_part(
                    &r.coordinate,
                    topic.value_codec(),
                    r.value.as_deref(),
                    Part::Value,
                )?;
                let clock_text = self.describe_headers(&r.headers);
                Ok(OutputRecord {
                    key,
                    value,
                    coordinate: r.coordinate,
                    timestamp: r.timestamp,
                    headers: r.headers,
                    producer: r.producer,
                    clock_text,
                })
            })
            .collect()
    }

    /// A clock with topic names and task names in place of ids (see
    /// [`OutputRecord::describe_clock`]).
    pub fn describe(&self, clock: &VectorClock) -> String {
        crate::holds::describe_clock(
            clock,
            |t| {
                self.log
                    .names
                    .get(&t)
                    .cloned()
                    .unwrap_or_else(|| t.to_string())
            },
            |s| {
                self.senders
                    .get(&s)
                    .map_or_else(|| s.to_string(), ToString::to_string)
            },
        )
    }

    fn describe_headers(&self, headers: &[Header]) -> String {
        if !headers.iter().any(|h| h.name == CLOCK_HEADER) {
            return "unstamped".to_owned();
        }
        match causal_headers(headers) {
            Ok(c) => self.describe(&c.clock),
            Err(e) => format!("corrupt: {e}"),
        }
    }

    /// Reads the next committed record of `topic` that this driver has not
    /// handed out yet (a cursor per topic, like a consumer's position):
    /// `None` when every record so far was read.
    pub fn read_record<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
    ) -> Result<Option<OutputRecord<K, V>>, DriverError> {
        let read = self.cursors.get(topic.name()).copied().unwrap_or(0);
        let next = self.records(topic)?.into_iter().nth(read);
        if next.is_some() {
            self.cursors.insert(topic.name().to_owned(), read + 1);
        }
        Ok(next)
    }

    /// The next unread record's value (`Some(None)` for a tombstone),
    /// advancing the cursor; `None` when nothing is unread.
    pub fn read_value<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
    ) -> Result<Option<Option<V>>, DriverError> {
        Ok(self.read_record(topic)?.map(|r| r.value))
    }

    /// The next unread record's key and value, advancing the cursor.
    pub fn read_key_value<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
    ) -> Result<Option<KeyValue<K, V>>, DriverError> {
        Ok(self.read_record(topic)?.map(|r| (r.key, r.value)))
    }

    /// Every unread record of `topic`, moving the cursor to the end.
    pub fn read_all<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
    ) -> Result<Vec<OutputRecord<K, V>>, DriverError> {
        let read = self.cursors.get(topic.name()).copied().unwrap_or(0);
        let all = self.records(topic)?;
        self.cursors.insert(topic.name().to_owned(), all.len());
        Ok(all.into_iter().skip(read).collect())
    }

    /// The non-null values of every unread record of `topic`, moving the
    /// cursor to the end.
    pub fn read_values<K: Payload, V: Payload>(
        &mut self,
        topic: &Topic<K, V>,
    ) -> Result<Vec<V>, DriverError> {
        Ok(self
            .read_all(topic)?
            .into_iter()
            .filter_map(|r| r.value)
            .collect())
    }

    /// True when every committed record of `topic` has been read.
    pub fn is_empty<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
    ) -> Result<bool, DriverError> {
        let read = self.cursors.get(topic.name()).copied().unwrap_or(0);
        Ok(self.raw_records(topic.name())?.len() <= read)
    }

    /// The key and value of every committed record of `topic`, in append
    /// order.
    pub fn key_values<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
    ) -> Result<Vec<KeyValue<K, V>>, DriverError> {
        Ok(self
            .records(topic)?
            .into_iter()
            .map(|r| (r.key, r.value))
            .collect())
    }

    /// The non-null values of every committed record of `topic`, in append
    /// order.
    pub fn values<K: Payload, V: Payload>(
        &self,
        topic: &Topic<K, V>,
    ) -> Result<Vec<V>, DriverError> {
        Ok(self
            .records(topic)?
            .into_iter()
            .filter_map(|r| r.value)
            .collect())
    }

    /// Every committed record of `topic` as raw bytes, in append order.
    pub fn raw_records(&self, topic: &str) -> Result<Vec<RawRecord>, DriverError> {
        let t = self.topic_log(topic)?;
        let mut out: Vec<(u64, RawRecord)> = Vec::new();
        for (p, entries) in t.partitions.iter().enumerate() {
            for (offset, e) in entries.iter().enumerate() {
                if let Entry::Record { seq, record } = e {
                    out.push((
                        *seq,
                        RawRecord {
                            coordinate: Coordinate::new(topic, p as i32, offset as i64),
                            key: record.key.clone(),
                            value: record.value.clone(),
                            timestamp: record.timestamp,
                            headers: record.headers.clone(),
                            producer: record.producer.clone(),
                        },
                    ));
                }
            }
        }
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// The number of offsets a partition occupies (records and markers).
    pub fn end_offset(&self, topic: &str, partition: i32) -> Result<i64, DriverError> {
        self.next_offset(topic, partition)
    }

    /// How many transaction markers a partition holds.
    pub fn markers(&self, topic: &str, partition: i32) -> Result<usize, DriverError> {
        let t = self.topic_log(topic)?;
        self.check_partition(topic, t, partition)?;
        Ok(t.partitions[partition as usize]
            .iter()
            .filter(|e| matches!(e, Entry::Marker))
            .count())
    }

    /// Every committed delivery to logic, in the order it happened.
    pub fn deliveries(&self) -> &[StageDelivery] {
        &self.deliveries
    }

    /// The coordinates delivered to `stage`'s logic, in order (ticks
    /// included).
    pub fn delivered_to(&self, stage: &str) -> Vec<Coordinate> {
        self.deliveries
            .iter()
            .filter(|d| d.task.stage == stage)
            .map(|d| d.coordinate.clone())
            .collect()
    }
}

pub(super) fn encode_part<T: 'static>(
    topic: &str,
    codec: &Codec<T>,
    v: Option<T>,
    part: Part,
) -> Result<Option<Vec<u8>>, DriverError> {
    match v {
        Some(v) => codec
            .encode(&v)
            .map(Some)
            .map_err(|source| DriverError::Encode {
                topic: topic.to_owned(),
                part,
                cause: source,
            }),
        None => Ok(None),
    }
}

fn decode_part<T: 'static>(
    coordinate: &Coordinate,
    codec: &Codec<T>,
    b: Option<&[u8]>,
    part: Part,
) -> Result<Option<T>, DriverError> {
    match b {
        Some(b) => codec
            .decode(b)
            .map(Some)
            .map_err(|source| DriverError::Decode {
                coordinate: coordinate.clone(),
                part,
                cause: source,
            }),
        None => Ok(None),
    }
}
