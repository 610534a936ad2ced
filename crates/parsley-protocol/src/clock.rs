//! Vector clocks: offset claims, sequence claims, and their wire form.
//!
//! A [`VectorClock`] is a set of claims about what causally precedes a record.
//!
//! * An **offset claim** `(channel, n)` claims every offset `<= n` on the
//!   channel.
//! * A **sequence claim** `(channel, sender, s)` claims every record `sender`
//!   sent to `channel` with a per-channel send sequence `<= s`. Senders use it
//!   for their own in-flight sends, whose offsets the broker has not assigned
//!   yet when the next record is stamped.
//!
//! Both sections are kept sorted in the canonical order (see [`crate::ids`])
//! with at most one entry per key, so two equal clocks encode to identical
//! bytes, in this implementation and in the Java one.
//!
//! # Wire form, version 1
//!
//! All integers big-endian:
//!
//! ```text
//! u8   version (= 1)
//! i32  offset entry count
//!      per entry: i64 topic msb, i64 topic lsb, i32 partition, i64 offset
//! i32  sequence entry count
//!      per entry: i64 topic msb, i64 topic lsb, i32 partition,
//!                 i64 sender msb, i64 sender lsb, i64 sequence
//! ```
//!
//! # Decoding rules
//!
//! [`VectorClock::decode`] accepts entries in any order and re-sorts them. It
//! rejects, with a [`CorruptClock`] error and without panicking: an empty
//! input, an unknown version, a negative count, a negative partition, offset
//! or sequence, a count that the remaining bytes cannot hold (checked before
//! anything is allocated), and trailing bytes.
//!
//! **Duplicate entries merge by maximum.** Two offset claims on one channel,
//! `n1` and `n2`, together claim everything at or below either of them, which
//! is exactly the single claim `max(n1, n2)`; the same holds for two sequence
//! claims on one channel and sender. Merging is therefore the precise meaning
//! of such an input, never a guess, and it can only claim what the input
//! claimed. (Keeping the last entry would silently drop a claim, which could
//! let an effect overtake its cause.) The canonical encoder never writes
//! duplicates.

use std::fmt;

use crate::bytes::{be_i32, be_i64};
use crate::ids::{Channel, SenderId, TopicId};

mod compact;

pub use compact::CLOCK_VERSION_COMPACT;

/// The clock version the Java library reads and writes, and the one this
/// library writes unless a sink asks for the compact one
/// ([`CLOCK_VERSION_COMPACT`]). Both are read.
pub const CLOCK_VERSION: u8 = 1;

/// Which version a clock is written in.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum ClockVersion {
    /// Version 1, the Java library's ([`VectorClock::encode`]).
    #[default]
    V1,
    /// Version 2, compact ([`VectorClock::encode_compact`]).
    Compact,
}

impl ClockVersion {
    /// The version its first byte names, `None` for one this build does
    /// not know.
    pub fn from_byte(byte: u8) -> Option<ClockVersion> {
        match byte {
            CLOCK_VERSION => Some(ClockVersion::V1),
            CLOCK_VERSION_COMPACT => Some(ClockVersion::Compact),
            _ => None,
        }
    }

    /// The version an encoded clock is written in, by its first byte
    /// (`None` for empty bytes or an unknown version; the rest is not
    /// checked).
    pub fn of(encoded: &[u8]) -> Option<ClockVersion> {
        encoded.first().copied().and_then(ClockVersion::from_byte)
    }
}

const OFFSET_ENTRY_LEN: usize = 8 + 8 + 4 + 8;
const SEQUENCE_ENTRY_LEN: usize = 8 + 8 + 4 + 8 + 8 + 8;

/// A claim on every offset at or below `offset` of `channel`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct OffsetClaim {
    /// The claimed channel.
    pub channel: Channel,
    /// The highest claimed offset (inclusive).
    pub offset: i64,
}

/// A claim on every record `sender` sent to `channel` with a send sequence at
/// or below `seq`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SequenceClaim {
    /// The channel the claimed records were sent to.
    pub channel: Channel,
    /// The sender that sent them.
    pub sender: SenderId,
    /// The highest claimed send sequence (inclusive).
    pub seq: i64,
}

impl SequenceClaim {
    fn key(&self) -> (Channel, SenderId) {
        (self.channel, self.sender)
    }
}

/// Which section of a clock a decoding error refers to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClockSection {
    /// The offset-claim section.
    Offsets,
    /// The sequence-claim section.
    Sequences,
}

impl fmt::Display for ClockSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClockSection::Offsets => "offset",
            ClockSection::Sequences => "sequence",
        })
    }
}

/// Why a byte string is not a valid clock.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CorruptClock {
    /// Zero bytes: not even a version.
    #[error("corrupt clock: empty input, expected at least a version byte")]
    Empty,
    /// A version this build does not know.
    #[error(
        "corrupt clock: unknown version {0}, this build reads versions {CLOCK_VERSION} and {CLOCK_VERSION_COMPACT}"
    )]
    UnknownVersion(u8),
    /// An entry count below zero.
    #[error("corrupt clock: negative {section} entry count {count}")]
    NegativeCount {
        /// The section whose count is negative.
        section: ClockSection,
        /// The count as read.
        count: i32,
    },
    /// The input ends before the data its header promises.
    #[error(
        "corrupt clock: truncated {section} section at byte {at}: needs {needed} bytes, {available} remain"
    )]
    Truncated {
        /// The section being read.
        section: ClockSection,
        /// Byte position where the section's data starts.
        at: usize,
        /// Bytes the section needs.
        needed: u64,
        /// Bytes left in the input.
        available: usize,
    },
    /// A partition below zero.
    #[error("corrupt clock: negative partition {partition} in {section} entry {index}")]
    NegativePartition {
        /// The section of the entry.
        section: ClockSection,
        /// Zero-based entry index within the section.
        index: usize,
        /// The partition as read.
        partition: i32,
    },
    /// An offset watermark below zero.
    #[error("corrupt clock: negative offset {offset} in offset entry {index}")]
    NegativeOffset {
        /// Zero-based entry index.
        index: usize,
        /// The offset as read.
        offset: i64,
    },
    /// A sequence watermark below zero.
    #[error("corrupt clock: negative sequence {seq} in sequence entry {index}")]
    NegativeSequence {
        /// Zero-based entry index.
        index: usize,
        /// The sequence as read.
        seq: i64,
    },
    /// Bytes left over after the sequence section.
    #[error("corrupt clock: {0} trailing bytes after the sequence section")]
    TrailingBytes(usize),
    /// A version-2 varint that is cut off, longer than ten bytes, spelt
    /// with more bytes than its value needs, or larger than 64 bits.
    #[error("corrupt clock: malformed varint at byte {at}")]
    BadVarint {
        /// Byte position where the varint starts.
        at: usize,
    },
    /// A version-2 value outside its field's range (a partition above
    /// `i32::MAX`, an offset or sequence above `i64::MAX` or below zero).
    #[error("corrupt clock: value out of range at byte {at}")]
    OutOfRange {
        /// Byte position of the entry or value.
        at: usize,
    },
    /// A version-2 topic group without entries.
    #[error("corrupt clock: empty {section} group at byte {at}")]
    EmptyGroup {
        /// The section of the group.
        section: ClockSection,
        /// Byte position of its entry count.
        at: usize,
    },
}

/// A vector clock with an offset section and a sequence section, both in
/// canonical order with one entry per key.
///
/// Claims are monotone facts, so every mutation is a pointwise max-merge.
/// A claim below zero claims nothing and is never stored.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct VectorClock {
    offsets: Vec<OffsetClaim>,
    sequences: Vec<SequenceClaim>,
}

impl fmt::Debug for VectorClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        let mut first = true;
        for c in &self.offsets {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}@{}", c.channel, c.offset)?;
        }
        for c in &self.sequences {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}#{}/{}", c.channel, c.sender, c.seq)?;
        }
        f.write_str("}")
    }
}

impl VectorClock {
    /// The empty clock: claims nothing.
    pub const fn new() -> Self {
        VectorClock {
            offsets: Vec::new(),
            sequences: Vec::new(),
        }
    }

    /// Builds a clock from claims in any order; duplicates merge by maximum
    /// and negative claims are ignored.
    pub fn from_claims(
        offsets: impl IntoIterator<Item = OffsetClaim>,
        sequences: impl IntoIterator<Item = SequenceClaim>,
    ) -> Self {
        let mut offsets: Vec<OffsetClaim> = offsets.into_iter().filter(|c| c.offset >= 0).collect();
        let mut sequences: Vec<SequenceClaim> =
            sequences.into_iter().filter(|c| c.seq >= 0).collect();
        canonicalise_offsets(&mut offsets);
        canonicalise_sequences(&mut sequences);
        VectorClock { offsets, sequences }
    }

    /// True when the clock claims nothing.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty() && self.sequences.is_empty()
    }

    /// The offset claims in canonical order.
    pub fn offsets(&self) -> &[OffsetClaim] {
        &self.offsets
    }

    /// The sequence claims in canonical order.
    pub fn sequences(&self) -> &[SequenceClaim] {
        &self.sequences
    }

    /// The offset claimed on `channel`, if any.
    pub fn offset(&self, channel: Channel) -> Option<i64> {
        self.offsets
            .binary_search_by(|c| c.channel.cmp(&channel))
            .ok()
            .map(|i| self.offsets[i].offset)
    }

    /// The sequence claimed on `channel` for `sender`, if any.
    pub fn sequence(&self, channel: Channel, sender: SenderId) -> Option<i64> {
        self.sequences
            .binary_search_by(|c| c.key().cmp(&(channel, sender)))
            .ok()
            .map(|i| self.sequences[i].seq)
    }

    /// Makes room for `offsets` and `sequences` more claims.
    pub(crate) fn reserve(&mut self, offsets: usize, sequences: usize) {
        self.offsets.reserve(offsets);
        self.sequences.reserve(sequences);
    }

    /// Empties the clock, keeping its room.
    pub(crate) fn clear(&mut self) {
        self.offsets.clear();
        self.sequences.clear();
    }

    /// Makes this clock a copy of `other`, in the room it already has.
    pub(crate) fn copy_from(&mut self, other: &VectorClock) {
        self.clear();
        self.offsets.extend_from_slice(&other.offsets);
        self.sequences.extend_from_slice(&other.sequences);
    }

    /// Claims every offset at or below `offset` on `channel` (max-merge).
    /// Returns whether the clock changed. A negative offset claims nothing.
    pub fn claim_offset(&mut self, channel: Channel, offset: i64) -> bool {
        if offset < 0 {
            return false;
        }
        match self.offsets.binary_search_by(|c| c.channel.cmp(&channel)) {
            Ok(i) => raise(&mut self.offsets[i].offset, offset),
            Err(i) => {
                self.offsets.insert(i, OffsetClaim { channel, offset });
                true
            }
        }
    }

    /// Claims every record `sender` sent to `channel` up to send sequence
    /// `seq` (max-merge). Returns whether the clock changed.
    pub fn claim_sequence(&mut self, channel: Channel, sender: SenderId, seq: i64) -> bool {
        if seq < 0 {
            return false;
        }
        match self
            .sequences
            .binary_search_by(|c| c.key().cmp(&(channel, sender)))
        {
            Ok(i) => raise(&mut self.sequences[i].seq, seq),
            Err(i) => {
                self.sequences.insert(
                    i,
                    SequenceClaim {
                        channel,
                        sender,
                        seq,
                    },
                );
                true
            }
        }
    }

    /// Pointwise max-merge of `other` into `self`. Returns whether `self`
    /// changed.
    pub fn merge(&mut self, other: &VectorClock) -> bool {
        let a = merge_sorted(
            &mut self.offsets,
            &other.offsets,
            |c| c.channel,
            |c| &mut c.offset,
        );
        let b = merge_sorted(
            &mut self.sequences,
            &other.sequences,
            SequenceClaim::key,
            |c| &mut c.seq,
        );
        a | b
    }

    /// True when every offset claim of `other` is covered by an offset claim
    /// of `self` at the same or a higher offset. Only the offset sections take
    /// part; sequence claims are resolved against delivery marks, not clocks.
    pub fn dominates(&self, other: &VectorClock) -> bool {
        let (mine, theirs) = (self.offsets.as_slice(), other.offsets.as_slice());
        if theirs.len() > mine.len() {
            // Keys are unique, so every claim needs its own entry here.
            return false;
        }
        if mine.len() == theirs.len() {
            // The common case: both clocks name the same channels. One
            // branch-free pass decides it.
            let mut same = true;
            let mut covered = true;
            for (m, t) in mine.iter().zip(theirs) {
                same &= m.channel == t.channel;
                covered &= m.offset >= t.offset;
            }
            if same {
                return covered;
            }
        }
        let mut i = 0;
        for claim in theirs {
            loop {
                let Some(m) = mine.get(i) else { return false };
                i += 1;
                if m.channel == claim.channel {
                    if m.offset < claim.offset {
                        return false;
                    }
                    break;
                }
                if m.channel > claim.channel {
                    return false;
                }
            }
        }
        true
    }

    /// Removes every offset claim at or below the stability clock's claim on
    /// the same channel. Sequence claims are kept: they name no offset a
    /// stability bound could be compared with. Returns whether anything was
    /// removed.
    pub fn truncate(&mut self, stability: &VectorClock) -> bool {
        let before = self.offsets.len();
        let bound = &stability.offsets;
        let mut j = 0;
        self.offsets.retain(|c| {
            while j < bound.len() && bound[j].channel < c.channel {
                j += 1;
            }
            match bound.get(j) {
                Some(b) if b.channel == c.channel => c.offset > b.offset,
                _ => true,
            }
        });
        self.offsets.len() != before
    }

    /// Removes every claim, offset and sequence, on any partition of `topic`.
    /// Used when a topic no longer exists: its channels can never be consumed
    /// again, so claims on them can never be honoured or needed.
    pub fn remove_topic(&mut self, topic: TopicId) -> bool {
        let before = self.offsets.len() + self.sequences.len();
        self.offsets.retain(|c| c.channel.topic != topic);
        self.sequences.retain(|c| c.channel.topic != topic);
        self.offsets.len() + self.sequences.len() != before
    }

    /// Keeps only the sequence claims for which `keep` returns true.
    pub fn retain_sequences(&mut self, keep: impl FnMut(&SequenceClaim) -> bool) -> bool {
        let before = self.sequences.len();
        self.sequences.retain(keep);
        self.sequences.len() != before
    }

    /// The exact length of [`encode`](Self::encode)'s output.
    pub fn encoded_len(&self) -> usize {
        1 + 4
            + self.offsets.len() * OFFSET_ENTRY_LEN
            + 4
            + self.sequences.len() * SEQUENCE_ENTRY_LEN
    }

    /// The canonical version-1 encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// The canonical encoding in `version`.
    pub fn encode_as(&self, version: ClockVersion) -> Vec<u8> {
        match version {
            ClockVersion::V1 => self.encode(),
            ClockVersion::Compact => self.encode_compact(),
        }
    }

    /// Appends the encoding in `version` to `out`.
    pub fn encode_into_as(&self, version: ClockVersion, out: &mut Vec<u8>) {
        match version {
            ClockVersion::V1 => self.encode_into(out),
            ClockVersion::Compact => self.encode_compact_into(out),
        }
    }

    /// Appends the canonical version-1 encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.encoded_len(), 0);
        let buf = &mut out[start..];
        buf[0] = CLOCK_VERSION;
        // Entry counts cannot exceed i32::MAX: a clock that large would
        // already occupy more memory than a process can hold.
        buf[1..5].copy_from_slice(&(self.offsets.len() as i32).to_be_bytes());
        let (entries, rest) = buf[5..].split_at_mut(self.offsets.len() * OFFSET_ENTRY_LEN);
        for (e, c) in entries
            .as_chunks_mut::<OFFSET_ENTRY_LEN>()
            .0
            .iter_mut()
            .zip(&self.offsets)
        {
            e[0..8].copy_from_slice(&c.channel.topic.msb().to_be_bytes());
            e[8..16].copy_from_slice(&c.channel.topic.lsb().to_be_bytes());
            e[16..20].copy_from_slice(&c.channel.partition.to_be_bytes());
            e[20..28].copy_from_slice(&c.offset.to_be_bytes());
        }
        rest[0..4].copy_from_slice(&(self.sequences.len() as i32).to_be_bytes());
        for (e, c) in rest[4..]
            .as_chunks_mut::<SEQUENCE_ENTRY_LEN>()
            .0
            .iter_mut()
            .zip(&self.sequences)
        {
            e[0..8].copy_from_slice(&c.channel.topic.msb().to_be_bytes());
            e[8..16].copy_from_slice(&c.channel.topic.lsb().to_be_bytes());
            e[16..20].copy_from_slice(&c.channel.partition.to_be_bytes());
            e[20..28].copy_from_slice(&c.sender.msb().to_be_bytes());
            e[28..36].copy_from_slice(&c.sender.lsb().to_be_bytes());
            e[36..44].copy_from_slice(&c.seq.to_be_bytes());
        }
    }

    /// The number of offset and sequence claims [`decode`](Self::decode)
    /// would give for `bytes`, or its error, without building the clock
    /// when it is canonical version 1 (what this library writes; see
    /// [`canonical_counts`]). Anything else (a compact clock, entries the
    /// decoder would sort or merge, or a fault to name) goes through the
    /// decoder.
    pub(crate) fn claim_counts(bytes: &[u8]) -> Result<(usize, usize), CorruptClock> {
        match canonical_counts(bytes) {
            Some(counts) => Ok(counts),
            None => VectorClock::decode(bytes).map(|c| (c.offsets.len(), c.sequences.len())),
        }
    }

    /// Decodes a clock of either version (1, or the compact 2; see
    /// [`encode_compact`](Self::encode_compact)). See the module
    /// documentation for what is rejected and how duplicates are treated.
    pub fn decode(bytes: &[u8]) -> Result<VectorClock, CorruptClock> {
        let (&version, rest) = bytes.split_first().ok_or(CorruptClock::Empty)?;
        if version == CLOCK_VERSION_COMPACT {
            return compact::decode(bytes);
        }
        if version != CLOCK_VERSION {
            return Err(CorruptClock::UnknownVersion(version));
        }
        let (data, rest) = section(rest, 1, ClockSection::Offsets, OFFSET_ENTRY_LEN)?;
        // Validity and order are accumulated without an early exit per
        // entry; the rare failure is located afterwards.
        let mut negative = false;
        let mut sorted = true;
        let mut prev = (0u128, -1i32);
        let mut offsets: Vec<OffsetClaim> = Vec::with_capacity(data.len() / OFFSET_ENTRY_LEN);
        offsets.extend(data.as_chunks::<OFFSET_ENTRY_LEN>().0.iter().map(|e| {
            let (msb, lsb, partition) = (be_i64(e, 0), be_i64(e, 8), be_i32(e, 16));
            let offset = be_i64(e, 20);
            negative |= (partition < 0) | (offset < 0);
            let key = (order_key(msb, lsb), partition);
            sorted &= prev < key;
            prev = key;
            OffsetClaim {
                channel: Channel::new(TopicId::from_halves(msb, lsb), partition),
                offset,
            }
        }));
        if negative {
            return Err(first_bad_offset(&offsets));
        }
        let at = bytes.len() - rest.len();
        let (data, rest) = section(rest, at, ClockSection::Sequences, SEQUENCE_ENTRY_LEN)?;
        let mut seq_sorted = true;
        let mut prev = (0u128, -1i32, 0u128);
        let mut sequences: Vec<SequenceClaim> = Vec::with_capacity(data.len() / SEQUENCE_ENTRY_LEN);
        sequences.extend(data.as_chunks::<SEQUENCE_ENTRY_LEN>().0.iter().map(|e| {
            let (msb, lsb, partition) = (be_i64(e, 0), be_i64(e, 8), be_i32(e, 16));
            let (smsb, slsb, seq) = (be_i64(e, 20), be_i64(e, 28), be_i64(e, 36));
            negative |= (partition < 0) | (seq < 0);
            let key = (order_key(msb, lsb), partition, order_key(smsb, slsb));
            seq_sorted &= prev < key;
            prev = key;
            SequenceClaim {
                channel: Channel::new(TopicId::from_halves(msb, lsb), partition),
                sender: SenderId::from_halves(smsb, slsb),
                seq,
            }
        }));
        if negative {
            return Err(first_bad_sequence(&sequences));
        }
        if !rest.is_empty() {
            return Err(CorruptClock::TrailingBytes(rest.len()));
        }
        if !sorted {
            canonicalise_offsets(&mut offsets);
        }
        if !seq_sorted {
            canonicalise_sequences(&mut sequences);
        }
        Ok(VectorClock { offsets, sequences })
    }
}

/// The claim counts of a canonical version-1 clock, checked in one pass
/// that allocates nothing: section lengths, no negative partition, offset
/// or sequence, strictly ascending entries, nothing trailing. `None` for
/// anything else, which the decoder then judges.
fn canonical_counts(bytes: &[u8]) -> Option<(usize, usize)> {
    let (&CLOCK_VERSION, rest) = bytes.split_first()? else {
        return None;
    };
    let (offsets, rest) = section(rest, 1, ClockSection::Offsets, OFFSET_ENTRY_LEN).ok()?;
    let mut ok = true;
    let mut prev = (0u128, -1i32);
    for e in offsets.as_chunks::<OFFSET_ENTRY_LEN>().0 {
        let key = (order_key(be_i64(e, 0), be_i64(e, 8)), be_i32(e, 16));
        ok &= (key.1 >= 0) & (be_i64(e, 20) >= 0) & (prev < key);
        prev = key;
    }
    let at = bytes.len() - rest.len();
    let (sequences, rest) = section(rest, at, ClockSection::Sequences, SEQUENCE_ENTRY_LEN).ok()?;
    let mut prev = (0u128, -1i32, 0u128);
    for e in sequences.as_chunks::<SEQUENCE_ENTRY_LEN>().0 {
        let key = (
            order_key(be_i64(e, 0), be_i64(e, 8)),
            be_i32(e, 16),
            order_key(be_i64(e, 20), be_i64(e, 28)),
        );
        ok &= (key.1 >= 0) & (be_i64(e, 36) >= 0) & (prev < key);
        prev = key;
    }
    (ok && rest.is_empty()).then_some((
        offsets.len() / OFFSET_ENTRY_LEN,
        sequences.len() / SEQUENCE_ENTRY_LEN,
    ))
}

/// Maps a UUID's signed halves to an unsigned integer with the same order
/// (flipping each half's sign bit turns signed order into unsigned order).
#[inline(always)]
fn order_key(msb: i64, lsb: i64) -> u128 {
    (((msb ^ i64::MIN) as u64 as u128) << 64) | ((lsb ^ i64::MIN) as u64 as u128)
}

fn first_bad_offset(offsets: &[OffsetClaim]) -> CorruptClock {
    for (index, c) in offsets.iter().enumerate() {
        if c.channel.partition < 0 {
            return CorruptClock::NegativePartition {
                section: ClockSection::Offsets,
                index,
                partition: c.channel.partition,
            };
        }
        if c.offset < 0 {
            return CorruptClock::NegativeOffset {
                index,
                offset: c.offset,
            };
        }
    }
    CorruptClock::NegativeOffset {
        index: 0,
        offset: -1,
    }
}

fn first_bad_sequence(sequences: &[SequenceClaim]) -> CorruptClock {
    for (index, c) in sequences.iter().enumerate() {
        if c.channel.partition < 0 {
            return CorruptClock::NegativePartition {
                section: ClockSection::Sequences,
                index,
                partition: c.channel.partition,
            };
        }
        if c.seq < 0 {
            return CorruptClock::NegativeSequence { index, seq: c.seq };
        }
    }
    CorruptClock::NegativeSequence { index: 0, seq: -1 }
}

/// Splits one counted section off the front of `bytes`: returns the entry
/// bytes and what follows. `at` is the section's position in the whole
/// clock, for error messages. The length is checked before anything is
/// allocated, so a hostile count cannot make the decoder reserve memory the
/// input does not back.
fn section(
    bytes: &[u8],
    at: usize,
    section: ClockSection,
    entry_len: usize,
) -> Result<(&[u8], &[u8]), CorruptClock> {
    if bytes.len() < 4 {
        return Err(CorruptClock::Truncated {
            section,
            at,
            needed: 4,
            available: bytes.len(),
        });
    }
    let count = be_i32(bytes, 0);
    if count < 0 {
        return Err(CorruptClock::NegativeCount { section, count });
    }
    let needed = count as u64 * entry_len as u64;
    let available = bytes.len() - 4;
    if needed > available as u64 {
        return Err(CorruptClock::Truncated {
            section,
            at: at + 4,
            needed,
            available,
        });
    }
    Ok(bytes[4..].split_at(count as usize * entry_len))
}

fn raise(slot: &mut i64, value: i64) -> bool {
    if value > *slot {
        *slot = value;
        true
    } else {
        false
    }
}

fn canonicalise_offsets(v: &mut Vec<OffsetClaim>) {
    v.sort_unstable_by(|a, b| a.channel.cmp(&b.channel).then(b.offset.cmp(&a.offset)));
    // After sorting by channel with the highest offset first, keeping the
    // first of each run is a merge by maximum.
    v.dedup_by_key(|c| c.channel);
}

fn canonicalise_sequences(v: &mut Vec<SequenceClaim>) {
    v.sort_unstable_by(|a, b| a.key().cmp(&b.key()).then(b.seq.cmp(&a.seq)));
    v.dedup_by_key(|c| c.key());
}

/// Max-merges the sorted, duplicate-free `src` into the sorted, duplicate-free
/// `dst`. Returns whether `dst` changed.
fn merge_sorted<T: Copy, K: Ord>(
    dst: &mut Vec<T>,
    src: &[T],
    key: impl Fn(&T) -> K,
    value: impl Fn(&mut T) -> &mut i64,
) -> bool {
    if src.is_empty() {
        return false;
    }
    if dst.is_empty() {
        dst.extend_from_slice(src);
        return true;
    }
    // The common case (a channel's records name the same channels): one
    // lockstep pass of raises, no searching. A key that differs ends it;
    // the raises made up to there are max-merges the general pass below
    // repeats harmlessly.
    let mut changed = false;
    if dst.len() == src.len() {
        let mut same = true;
        for (d, s) in dst.iter_mut().zip(src) {
            if key(d) != key(s) {
                same = false;
                break;
            }
            let mut s = *s;
            let v = *value(&mut s);
            changed |= raise(value(d), v);
        }
        if same {
            return changed;
        }
    }
    // First pass: raise matching entries in place and count the keys `dst`
    // lacks. A key set that only grows never reallocates.
    let mut missing = 0usize;
    let mut i = 0;
    for s in src {
        let k = key(s);
        while i < dst.len() && key(&dst[i]) < k {
            i += 1;
        }
        if i < dst.len() && key(&dst[i]) == k {
            let mut s = *s;
            let v = *value(&mut s);
            changed |= raise(value(&mut dst[i]), v);
            i += 1;
        } else {
            missing += 1;
        }
    }
    if missing == 0 {
        return changed;
    }
    // Second pass: interleave the missing entries in order, in place and
    // from the back, into room made at the end (no second vector: a base
    // given room up front is never reallocated).
    let old_len = dst.len();
    let Some(&last) = src.last() else {
        return changed;
    };
    dst.resize(old_len + missing, last);
    let (mut a, mut b, mut w) = (old_len, src.len(), old_len + missing);
    // `w - a` is the number of `src` entries still to place, so a write at
    // `w - 1` never lands on an entry of `dst` not yet moved.
    while b > 0 {
        let take_dst = a > 0 && key(&dst[a - 1]) >= key(&src[b - 1]);
        if take_dst {
            if key(&dst[a - 1]) == key(&src[b - 1]) {
                // Already raised by the first pass.
                b -= 1;
            }
            dst[w - 1] = dst[a - 1];
            a -= 1;
        } else {
            dst[w - 1] = src[b - 1];
            b -= 1;
        }
        w -= 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(t: u128, p: i32) -> Channel {
        Channel::new(TopicId::from_u128(t), p)
    }

    /// The allocation-free path is the one a canonical clock takes (the
    /// decoder would give the same counts, so only this can tell).
    #[test]
    fn a_canonical_clock_is_counted_without_the_decoder_and_nothing_else_is() {
        let mut c = VectorClock::new();
        c.claim_offset(ch(1, 0), 5);
        c.claim_offset(ch(2, 3), 7);
        c.claim_sequence(ch(1, 0), SenderId::from_u128(9), 4);
        assert_eq!(canonical_counts(&c.encode()), Some((2, 1)));
        assert_eq!(canonical_counts(&VectorClock::new().encode()), Some((0, 0)));
        // The compact version, entries out of order and an entry twice
        // are the decoder's to judge.
        assert_eq!(canonical_counts(&c.encode_compact()), None);
        let mut reversed = c.encode();
        let (first, second) = (reversed[5..33].to_vec(), reversed[33..61].to_vec());
        reversed[5..33].copy_from_slice(&second);
        reversed[33..61].copy_from_slice(&first);
        assert_eq!(canonical_counts(&reversed), None);
        assert_eq!(VectorClock::claim_counts(&reversed), Ok((2, 1)));
        let mut doubled = reversed.clone();
        doubled[33..61].copy_from_slice(&second);
        assert_eq!(canonical_counts(&doubled), None);
        assert_eq!(VectorClock::claim_counts(&doubled), Ok((1, 1)));
    }
}
