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
    /// The metadata string the group's committed position carries, if any.
    /// [`RESET_IN_PROGRESS`] marks a reset that began and has not finished.
    pub committed_metadata: Option<String>,
}

/// The committed-offset metadata `parsley reset` writes on every position it
/// will move before it changes anything, and clears when it commits the new
/// positions, its last step: a group whose positions still carry it was
/// reset half way, and must not start until the reset is run again.
pub const RESET_IN_PROGRESS: &str = "parsley:reset-in-progress";

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

/// The bytes of a record's key or value on their way out: the record's
/// own, or shared with a store that keeps them too.
///
/// A fold state's write is one allocation (none at all for a value of up
/// to [`RecordBytes::INLINE`] bytes, a counter or a sum, which is kept in
/// place) that the transaction's pending writes, its changelog record, the
/// committed store and the local store's entry all hold: cloning the
/// shared form counts a reference or copies the few inline bytes. An
/// emission's bytes are its own, moved in from its codec without a copy.
/// Either way it reads as a byte slice.
#[derive(Clone)]
pub struct RecordBytes(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
    /// The length, then the bytes.
    Inline(u8, [u8; RecordBytes::INLINE]),
}

impl RecordBytes {
    /// The most bytes kept in place, without an allocation of their own
    /// (as many as fit beside the length in the space a vector takes).
    pub const INLINE: usize = 15;

    /// A copy of `bytes` in the shared form: in place when they are short
    /// enough, else in one shared allocation.
    pub fn copy_from_slice(bytes: &[u8]) -> RecordBytes {
        match u8::try_from(bytes.len()) {
            Ok(n) if bytes.len() <= Self::INLINE => {
                let mut inline = [0u8; Self::INLINE];
                inline[..bytes.len()].copy_from_slice(bytes);
                RecordBytes(Repr::Inline(n, inline))
            }
            _ => RecordBytes(Repr::Shared(Arc::from(bytes))),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Shared(a) => a,
            Repr::Inline(n, b) => &b[..usize::from(*n)],
        }
    }

    /// The bytes as a vector: the record's own without a copy, others
    /// copied.
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Repr::Owned(v) => v,
            Repr::Shared(_) | Repr::Inline(..) => self.as_slice().to_vec(),
        }
    }

    /// Moves bytes the record owns into the shared form (in place when
    /// short, else one shared allocation), so that later clones copy
    /// nothing but a reference or the inline bytes.
    pub fn make_shared(&mut self) {
        if let Repr::Owned(v) = &self.0 {
            *self = RecordBytes::copy_from_slice(v);
        }
    }

    /// Whether a clone copies no heap bytes (the shared form, or short
    /// bytes kept in place).
    pub fn is_shared(&self) -> bool {
        !matches!(self.0, Repr::Owned(_))
    }
}

impl std::ops::Deref for RecordBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::borrow::Borrow<[u8]> for RecordBytes {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<Vec<u8>> for RecordBytes {
    fn from(v: Vec<u8>) -> Self {
        RecordBytes(Repr::Owned(v))
    }
}

impl From<Arc<[u8]>> for RecordBytes {
    fn from(a: Arc<[u8]>) -> Self {
        RecordBytes(Repr::Shared(a))
    }
}

impl From<&[u8]> for RecordBytes {
    fn from(b: &[u8]) -> Self {
        RecordBytes::copy_from_slice(b)
    }
}

impl<const N: usize> From<&[u8; N]> for RecordBytes {
    fn from(b: &[u8; N]) -> Self {
        RecordBytes::copy_from_slice(b)
    }
}

impl From<RecordBytes> for Vec<u8> {
    fn from(b: RecordBytes) -> Self {
        b.into_vec()
    }
}

impl PartialEq for RecordBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for RecordBytes {}

impl std::hash::Hash for RecordBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialOrd for RecordBytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RecordBytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl PartialEq<[u8]> for RecordBytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<Vec<u8>> for RecordBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl std::fmt::Debug for RecordBytes {
    /// As the byte slice it holds, whichever form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_slice(), f)
    }
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
    pub key: Option<RecordBytes>,
    /// Value bytes; `None` is a null value.
    pub value: Option<RecordBytes>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    /// Every form reads as the same bytes, compares and hashes as the
    /// slice does (a map keyed by them is looked up by slice), and comes
    /// back out as a vector.
    #[test]
    fn every_form_is_the_same_bytes() {
        let short: &[u8] = b"eight by";
        let long: &[u8] = b"more than fifteen bytes";
        for bytes in [short, long, &[][..]] {
            let forms = [
                RecordBytes::from(bytes.to_vec()),
                RecordBytes::copy_from_slice(bytes),
                RecordBytes::from(Arc::<[u8]>::from(bytes)),
            ];
            for f in &forms {
                assert_eq!(f.as_slice(), bytes);
                assert_eq!(&**f, bytes);
                assert_eq!(*f, forms[0]);
                assert_eq!(hash_of(f), hash_of(bytes));
                assert_eq!(f.clone().into_vec(), bytes.to_vec());
                assert_eq!(format!("{f:?}"), format!("{bytes:?}"));
            }
        }
    }

    /// Short bytes are kept in place and long ones in one shared
    /// allocation that clones share; owned bytes become either once made
    /// shared, and only then.
    #[test]
    fn short_bytes_stay_in_place_and_long_ones_are_shared() {
        let short = RecordBytes::copy_from_slice(&7i64.to_be_bytes());
        assert!(matches!(short.0, Repr::Inline(8, _)));
        let limit = RecordBytes::copy_from_slice(&[1; RecordBytes::INLINE]);
        assert!(matches!(limit.0, Repr::Inline(..)));
        let long = RecordBytes::copy_from_slice(&[1; RecordBytes::INLINE + 1]);
        let Repr::Shared(a) = &long.0 else {
            panic!("{} bytes are not kept in place", RecordBytes::INLINE + 1)
        };
        let Repr::Shared(b) = &long.clone().0 else {
            panic!("a clone of shared bytes is shared");
        };
        assert!(Arc::ptr_eq(a, b), "a clone shares the allocation");

        let mut owned = RecordBytes::from(vec![5; 40]);
        assert!(!owned.is_shared());
        owned.make_shared();
        assert!(owned.is_shared() && matches!(owned.0, Repr::Shared(_)));
        let mut small = RecordBytes::from(vec![5; 3]);
        small.make_shared();
        assert!(matches!(small.0, Repr::Inline(3, _)));
        assert_eq!(small.as_slice(), &[5, 5, 5]);
    }
}
