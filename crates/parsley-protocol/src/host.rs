//! The records a host and its core exchange, shared by every host: the
//! Kafka runtime, the `parsley` crate's TestDriver and the simulator. A
//! fetched record goes in as a [`RecordView`] (a view of the client's own
//! message, or a [`PolledRecord`] where the host keeps its records); an
//! assigned partition as an [`AssignedPartition`]; a record to append comes
//! out as an [`OutgoingRecord`], its causal stamp already encoded (by a
//! [`StampWriter`]), and consumer seeks and fetch pauses as [`Seek`] and
//! [`FlowChange`].
//!
//! They live in the protocol crate so that the simulator, which never
//! depends on the user crate, speaks the same types as the runtime instead
//! of look-alikes and a translation.

use std::sync::Arc;

/// The shared byte slice a [`Stamp`] keeps its clock in (the `bytes`
/// crate's), re-exported so that a host needs no dependency of its own.
pub use ::bytes::Bytes;
use ::bytes::BytesMut;

use crate::clock::{ClockVersion, VectorClock};
use crate::error::ProtocolError;
use crate::headers::{CLOCK_HEADER, CorruptHeader, SENDER_HEADER, SEQ_HEADER};
use crate::node::CausalNode;
use crate::{CausalHeaders, Channel, Header, SenderTag};

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
    /// The partition's end (last stable offset), for a start at the latest
    /// offset; `None` when the lookup gave no answer. A channel that needs
    /// it (no committed position, start policy latest) then fails its task
    /// with an error naming the unknown end rather than guess.
    pub end: Option<i64>,
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

/// Where an emission came from: the delivered record (or tick) whose logic
/// made it, and its place among that delivery's emissions (from 0). The
/// same delivery, handled again after an abort, makes the same emissions
/// in the same places, as long as the logic is deterministic.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct EmissionOrigin {
    /// The delivered record's channel.
    pub channel: Channel,
    /// Its offset.
    pub offset: i64,
    /// The emission's place among those the delivery made.
    pub ordinal: u32,
}

/// A record the host must append: partitioned, stamped and encoded.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OutgoingRecord {
    /// The destination topic, shared with every other record to it (a
    /// reference count per record, not a copy of the name).
    pub topic: Arc<str>,
    /// The destination partition.
    pub partition: i32,
    /// Key bytes; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None` is a null value.
    pub value: Option<Vec<u8>>,
    /// The record timestamp.
    pub timestamp: i64,
    /// The causal stamp (emissions and ticks), encoded: a host writes it
    /// as the first headers, `vc`, `vc-sender`, `vc-seq`
    /// ([`write_headers`](Self::write_headers), or
    /// [`header_list`](Self::header_list) for a host that stores them).
    /// Changelog records and dead letters carry none.
    pub stamp: Option<Stamp>,
    /// The record's own headers (the emission's, or a dead letter's), which
    /// follow the stamp's.
    pub headers: Vec<Header>,
    /// The emission it is, if it is one (not a changelog record or a
    /// tick).
    pub origin: Option<EmissionOrigin>,
}

/// A record's causal stamp, encoded as it goes on the wire.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Stamp {
    /// The `vc` header's value, in the clock version of the record's sink.
    /// Stamps written by one [`StampWriter`] share its buffers, so a stamp
    /// kept keeps its buffer: a host drops stamps with their records.
    pub clock: Bytes,
    /// The sender tag: the `vc-sender` and `vc-seq` headers.
    pub sender: SenderTag,
}

impl Stamp {
    /// The stamp decoded (for a host or a test that looks into it).
    pub fn decode(&self) -> Result<CausalHeaders, CorruptHeader> {
        Ok(CausalHeaders {
            clock: VectorClock::decode(&self.clock)?,
            sender: Some(self.sender),
        })
    }
}

/// Stamps a host's outgoing records: asks the node for each stamp and
/// writes its `vc` value into buffers the stamps share, so stamping a
/// record allocates nothing of its own. A new buffer is taken when the last
/// is full, sized for several dozen stamps of the current width (between
/// 1 KiB and 64 KiB, or one stamp when a stamp is larger). One per task,
/// [released](Self::release) whenever the task hands its records over.
#[derive(Debug, Default)]
pub struct StampWriter {
    /// The rest of the current buffer (what stamps already took is split off).
    buf: BytesMut,
    /// The stamp as the node writes it, before it joins the buffer.
    scratch: Vec<u8>,
}

impl StampWriter {
    /// Stamps per buffer.
    const STAMPS_PER_BUFFER: usize = 64;
    /// The smallest and largest buffer taken for several stamps.
    const BUFFER_BOUNDS: (usize, usize) = (1 << 10, 64 << 10);

    /// A writer with no buffer yet.
    pub fn new() -> StampWriter {
        StampWriter::default()
    }

    /// Lets go of the current buffer, so that a writer keeps none between
    /// transactions (the stamps already written keep theirs while they
    /// live). A task calls it when it hands its records over.
    pub fn release(&mut self) {
        self.buf = BytesMut::new();
    }

    /// The stamp of one record `node` sends to `destination`, its clock in
    /// `version`: [`CausalNode::prepare_send_into`] (which assigns the
    /// record's send sequence), written into the shared buffer.
    pub fn stamp(
        &mut self,
        node: &mut CausalNode,
        destination: Channel,
        version: ClockVersion,
    ) -> Result<Stamp, ProtocolError> {
        self.scratch.clear();
        let sender = node.prepare_send_into(destination, version, &mut self.scratch)?;
        let len = self.scratch.len();
        if self.buf.capacity() < len {
            let (low, high) = Self::BUFFER_BOUNDS;
            let room = (len * Self::STAMPS_PER_BUFFER).clamp(low, high).max(len);
            self.buf = BytesMut::with_capacity(room);
        }
        self.buf.extend_from_slice(&self.scratch);
        Ok(Stamp {
            clock: self.buf.split().freeze(),
            sender,
        })
    }
}

impl OutgoingRecord {
    /// How many headers the record carries on the wire.
    pub fn header_count(&self) -> usize {
        let stamp = if self.stamp.is_some() { 3 } else { 0 };
        stamp + self.headers.len()
    }

    /// Hands `put` every header in wire order (the stamp's, then the
    /// record's own) with no allocation: the stamp is already encoded.
    pub fn write_headers(&self, mut put: impl FnMut(&str, Option<&[u8]>)) {
        if let Some(s) = &self.stamp {
            put(CLOCK_HEADER, Some(&s.clock));
            put(SENDER_HEADER, Some(&s.sender.sender.to_bytes()));
            put(SEQ_HEADER, Some(&s.sender.seq.to_be_bytes()));
        }
        for h in &self.headers {
            put(h.name(), h.value.as_deref());
        }
    }

    /// Every header in wire order, as owned values: for a host that stores
    /// the record as written (the TestDriver's log, the simulator's broker).
    pub fn header_list(&self) -> Vec<Header> {
        let mut out = Vec::with_capacity(self.header_count());
        if let Some(s) = &self.stamp {
            out.push(Header::new(CLOCK_HEADER, s.clock.to_vec()));
            out.push(Header::new(SENDER_HEADER, s.sender.sender.to_bytes()));
            out.push(Header::new(SEQ_HEADER, s.sender.seq.to_be_bytes()));
        }
        out.extend(self.headers.iter().cloned());
        out
    }
}
