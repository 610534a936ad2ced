//! Version 2 of the `vc` header: the same claims as version 1, written
//! compactly. A stage's own-output seed claims every partition of each
//! sink, so a clock's width grows with partition counts; version 1 spends
//! 28 bytes on each claim, 16 of them on a topic id that every claim of
//! the topic repeats. Version 2 names each topic once and writes
//! partitions and values as variable-length integers, partitions and
//! offsets as differences from the entry before.
//!
//! ```text
//! u8      version (2)
//! varint  offset groups
//!         per group (one topic, its claims by ascending partition):
//!   16 bytes  topic id (most significant half first, as in version 1)
//!   varint    entries (at least 1)
//!             per entry:
//!     varint  partition: the first entry's partition, then the gap to the
//!             entry before (partition - previous partition - 1)
//!     varint  offset for the first entry; for the others, zigzag of
//!             (offset - previous entry's offset)
//! varint  sequence groups
//!         per group (one topic, its claims by partition, then sender):
//!   16 bytes  topic id
//!   varint    entries (at least 1)
//!             per entry:
//!     varint  partition: the first entry's partition, then the difference
//!             from the entry before (0: the same partition)
//!     16 bytes sender id
//!     varint  sequence
//! ```
//!
//! A varint is unsigned LEB128: seven bits per byte, least significant
//! first, the top bit set on every byte but the last; at most ten bytes,
//! and no longer than the value needs (one spelling per value). Zigzag maps
//! a signed difference d to (d << 1) ^ (d >> 63), so small differences of
//! either sign take one byte.
//!
//! Reading is as strict as version 1: a malformed, overlong or
//! out-of-range varint, a count the remaining bytes cannot hold, an empty
//! group, a partition, offset or sequence outside `0..` its type's maximum,
//! and trailing bytes are refused, and no count read from the input sizes
//! an allocation beyond what the remaining bytes could hold. Groups may
//! come in any order and may repeat a topic; entries of a sequence group
//! may repeat a partition and sender; those are merged by maximum, as
//! version 1 merges duplicate entries. The encoder writes one group per
//! topic in canonical order.

use super::{
    ClockSection, CorruptClock, OffsetClaim, SequenceClaim, VectorClock, canonicalise_offsets,
    canonicalise_sequences,
};
use crate::ids::{Channel, SenderId, TopicId};

/// The compact clock version.
pub const CLOCK_VERSION_COMPACT: u8 = 2;

/// The fewest bytes an offset group takes: a topic id, a count, and one
/// entry of a partition and an offset.
const MIN_OFFSET_GROUP: usize = 16 + 1 + 2;
/// The fewest bytes a sequence group takes.
const MIN_SEQUENCE_GROUP: usize = 16 + 1 + 18;
const MIN_OFFSET_ENTRY: usize = 2;
const MIN_SEQUENCE_ENTRY: usize = 1 + 16 + 1;

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

impl VectorClock {
    /// The exact length of [`encode_compact`](Self::encode_compact)'s
    /// output.
    pub fn encoded_len_compact(&self) -> usize {
        let mut n = 1 + varint_len(offset_groups(&self.offsets).count() as u64);
        for group in offset_groups(&self.offsets) {
            n += 16 + varint_len(group.len() as u64);
            let mut prev: Option<&OffsetClaim> = None;
            for c in group {
                let (step, value) = offset_entry(prev, c);
                n += varint_len(step) + varint_len(value);
                prev = Some(c);
            }
        }
        n += varint_len(sequence_groups(&self.sequences).count() as u64);
        for group in sequence_groups(&self.sequences) {
            n += 16 + varint_len(group.len() as u64);
            let mut prev: Option<i32> = None;
            for c in group {
                n += varint_len(sequence_step(prev, c)) + 16 + varint_len(c.seq as u64);
                prev = Some(c.channel.partition);
            }
        }
        n
    }

    /// The canonical version-2 (compact) encoding. Only this library reads
    /// it: the Java library reads version 1 alone (see the wire-format
    /// page of the guide).
    pub fn encode_compact(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len_compact());
        self.encode_compact_into(&mut out);
        out
    }

    /// Appends the canonical version-2 encoding to `out`.
    pub fn encode_compact_into(&self, out: &mut Vec<u8>) {
        out.push(CLOCK_VERSION_COMPACT);
        put_varint(out, offset_groups(&self.offsets).count() as u64);
        for group in offset_groups(&self.offsets) {
            out.extend_from_slice(&group[0].channel.topic.to_bytes());
            put_varint(out, group.len() as u64);
            let mut prev: Option<&OffsetClaim> = None;
            for c in group {
                let (step, value) = offset_entry(prev, c);
                put_varint(out, step);
                put_varint(out, value);
                prev = Some(c);
            }
        }
        put_varint(out, sequence_groups(&self.sequences).count() as u64);
        for group in sequence_groups(&self.sequences) {
            out.extend_from_slice(&group[0].channel.topic.to_bytes());
            put_varint(out, group.len() as u64);
            let mut prev: Option<i32> = None;
            for c in group {
                put_varint(out, sequence_step(prev, c));
                out.extend_from_slice(&c.sender.to_bytes());
                put_varint(out, c.seq as u64);
                prev = Some(c.channel.partition);
            }
        }
    }
}

/// The offset claims of each topic, in order (never an empty group).
fn offset_groups(claims: &[OffsetClaim]) -> impl Iterator<Item = &[OffsetClaim]> {
    claims.chunk_by(|a, b| a.channel.topic == b.channel.topic)
}

/// The sequence claims of each topic, in order.
fn sequence_groups(claims: &[SequenceClaim]) -> impl Iterator<Item = &[SequenceClaim]> {
    claims.chunk_by(|a, b| a.channel.topic == b.channel.topic)
}

/// An offset entry's partition step and value, after `prev` in its group
/// (claims are canonical: partitions strictly ascending, values at least
/// zero).
///
/// A clock built by hand with a negative partition (which no decoder
/// accepts) is written as a value the decoder refuses, never a panic: the
/// arithmetic is in 64 bits and wraps.
fn offset_entry(prev: Option<&OffsetClaim>, c: &OffsetClaim) -> (u64, u64) {
    let partition = i64::from(c.channel.partition);
    match prev {
        None => (partition as u64, c.offset as u64),
        Some(p) => (
            (partition - i64::from(p.channel.partition) - 1) as u64,
            zigzag(c.offset.wrapping_sub(p.offset)),
        ),
    }
}

fn sequence_step(prev: Option<i32>, c: &SequenceClaim) -> u64 {
    let partition = i64::from(c.channel.partition);
    match prev {
        None => partition as u64,
        Some(p) => (partition - i64::from(p)) as u64,
    }
}

/// A cursor over the input that knows where it is, for error positions.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn varint(&mut self) -> Result<u64, CorruptClock> {
        let start = self.at;
        let bad = CorruptClock::BadVarint { at: start };
        let rest = self.bytes.get(start..).unwrap_or_default();
        let mut v: u64 = 0;
        for (i, &b) in rest.iter().take(10).enumerate() {
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                // A last byte of zero after others is an overlong
                // spelling; the tenth byte may carry only a u64's top bit.
                if (b == 0 && i > 0) || (i == 9 && b > 1) {
                    return Err(bad);
                }
                self.at += i + 1;
                return Ok(v);
            }
        }
        Err(bad)
    }

    /// A count of items of at least `min_len` bytes each, refused when the
    /// remaining bytes cannot hold them.
    fn count(&mut self, section: ClockSection, min_len: usize) -> Result<usize, CorruptClock> {
        let count = self.varint()?;
        let available = self.remaining();
        let needed = count.saturating_mul(min_len as u64);
        if needed > available as u64 {
            return Err(CorruptClock::Truncated {
                section,
                at: self.at,
                needed,
                available,
            });
        }
        Ok(count as usize)
    }

    fn id(&mut self, section: ClockSection) -> Result<[u8; 16], CorruptClock> {
        let Some(bytes) = self.bytes.get(self.at..self.at + 16) else {
            return Err(CorruptClock::Truncated {
                section,
                at: self.at,
                needed: 16,
                available: self.remaining(),
            });
        };
        self.at += 16;
        let mut id = [0u8; 16];
        id.copy_from_slice(bytes);
        Ok(id)
    }

    /// A varint that must fit `0..=max`.
    fn bounded(&mut self, max: u64) -> Result<u64, CorruptClock> {
        let at = self.at;
        let v = self.varint()?;
        if v > max {
            return Err(CorruptClock::OutOfRange { at });
        }
        Ok(v)
    }
}

/// Decodes what follows the version byte of a version-2 clock.
pub(super) fn decode(bytes: &[u8]) -> Result<VectorClock, CorruptClock> {
    let mut r = Reader { bytes, at: 1 };
    let section = ClockSection::Offsets;
    let groups = r.count(section, MIN_OFFSET_GROUP)?;
    let mut offsets: Vec<OffsetClaim> = Vec::new();
    let mut sorted = true;
    for _ in 0..groups {
        let topic = TopicId::from_bytes(r.id(section)?);
        let at = r.at;
        let entries = r.count(section, MIN_OFFSET_ENTRY)?;
        if entries == 0 {
            return Err(CorruptClock::EmptyGroup { section, at });
        }
        if let Some(last) = offsets.last() {
            sorted &= last.channel.topic < topic;
        }
        offsets.reserve(entries);
        let mut prev: Option<(i64, i64)> = None;
        for _ in 0..entries {
            let at = r.at;
            let (partition, offset) = match prev {
                None => (
                    r.bounded(i32::MAX as u64)? as i64,
                    r.bounded(i64::MAX as u64)? as i64,
                ),
                Some((p, o)) => {
                    let gap = r.varint()?;
                    let delta = unzigzag(r.varint()?);
                    let partition = i64::try_from(gap)
                        .ok()
                        .and_then(|g| p.checked_add(g)?.checked_add(1))
                        .filter(|&p| p <= i64::from(i32::MAX));
                    let offset = o.checked_add(delta).filter(|&o| o >= 0);
                    match (partition, offset) {
                        (Some(p), Some(o)) => (p, o),
                        _ => return Err(CorruptClock::OutOfRange { at }),
                    }
                }
            };
            prev = Some((partition, offset));
            offsets.push(OffsetClaim {
                channel: Channel::new(topic, partition as i32),
                offset,
            });
        }
    }
    let section = ClockSection::Sequences;
    let groups = r.count(section, MIN_SEQUENCE_GROUP)?;
    let mut sequences: Vec<SequenceClaim> = Vec::new();
    let mut seq_sorted = true;
    for _ in 0..groups {
        let topic = TopicId::from_bytes(r.id(section)?);
        let at = r.at;
        let entries = r.count(section, MIN_SEQUENCE_ENTRY)?;
        if entries == 0 {
            return Err(CorruptClock::EmptyGroup { section, at });
        }
        sequences.reserve(entries);
        let mut prev: Option<i64> = None;
        for _ in 0..entries {
            let at = r.at;
            let partition = match prev {
                None => r.bounded(i32::MAX as u64)? as i64,
                Some(p) => {
                    let step = r.bounded(i32::MAX as u64)? as i64;
                    let p = p + step;
                    if p > i64::from(i32::MAX) {
                        return Err(CorruptClock::OutOfRange { at });
                    }
                    p
                }
            };
            let sender = SenderId::from_bytes(r.id(section)?);
            let seq = r.bounded(i64::MAX as u64)? as i64;
            prev = Some(partition);
            let claim = SequenceClaim {
                channel: Channel::new(topic, partition as i32),
                sender,
                seq,
            };
            if let Some(last) = sequences.last() {
                seq_sorted &= last.key() < claim.key();
            }
            sequences.push(claim);
        }
    }
    if r.remaining() > 0 {
        return Err(CorruptClock::TrailingBytes(r.remaining()));
    }
    if !sorted {
        canonicalise_offsets(&mut offsets);
    }
    if !seq_sorted {
        canonicalise_sequences(&mut sequences);
    }
    Ok(VectorClock { offsets, sequences })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_have_one_spelling() {
        for v in [0u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
            let mut r = Reader { bytes: &out, at: 0 };
            assert_eq!(r.varint(), Ok(v));
            assert_eq!(r.remaining(), 0);
        }
        // Overlong (a trailing zero byte), eleven bytes, and a tenth byte
        // carrying more than the top bit: refused.
        for bad in [
            &[0x80, 0x00][..],
            &[0xff; 11][..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..],
            &[0x80][..],
        ] {
            let mut r = Reader { bytes: bad, at: 0 };
            assert_eq!(
                r.varint(),
                Err(CorruptClock::BadVarint { at: 0 }),
                "{bad:02x?}"
            );
        }
    }

    #[test]
    fn a_negative_partition_built_by_hand_is_written_as_bytes_the_decoder_refuses() {
        let t = TopicId::from_u128(1);
        let clock = VectorClock::from_claims(
            [
                OffsetClaim {
                    channel: Channel::new(t, -1),
                    offset: 0,
                },
                OffsetClaim {
                    channel: Channel::new(t, i32::MAX),
                    offset: 0,
                },
            ],
            [SequenceClaim {
                channel: Channel::new(t, i32::MIN),
                sender: SenderId::from_u128(2),
                seq: 0,
            }],
        );
        let bytes = clock.encode_compact();
        assert_eq!(bytes.len(), clock.encoded_len_compact());
        assert!(matches!(
            VectorClock::decode(&bytes),
            Err(CorruptClock::OutOfRange { .. })
        ));
    }

    #[test]
    fn zigzag_maps_small_differences_of_either_sign_to_small_values() {
        for (d, z) in [
            (0i64, 0u64),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (i64::MAX, u64::MAX - 1),
            (i64::MIN, u64::MAX),
        ] {
            assert_eq!(zigzag(d), z);
            assert_eq!(unzigzag(z), d);
        }
    }
}
