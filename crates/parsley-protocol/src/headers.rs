//! The three record headers every stamped record carries.
//!
//! | header      | value                                                     |
//! |-------------|-----------------------------------------------------------|
//! | `vc`        | the record's dependency clock ([`VectorClock`] wire form) |
//! | `vc-sender` | 16 bytes: the sender's UUID, most significant half first  |
//! | `vc-seq`    | 8 bytes, big-endian: the record's send sequence on its channel |
//!
//! These names and layouts are shared with the Java library byte for byte.
//!
//! Reading is strict. An absent `vc` means the producer claims nothing (the
//! empty clock). Everything else that is not exactly right is a
//! [`CorruptHeader`]: a `vc` that does not decode, a `vc-sender` without a
//! `vc-seq` or the reverse, a wrong length, a negative sequence, a header with
//! a null value, or the same causal header twice. Reading any of these as "no
//! claim" would let an effect overtake its cause, so the caller must fail the
//! record's task instead.

use std::borrow::Cow;

use crate::clock::{ClockVersion, CorruptClock, VectorClock};
use crate::ids::SenderId;

/// A record header. Kafka allows repeated names and null values; both are
/// kept as they are.
///
/// The name is a `Cow` so that the names every record carries (the three
/// causal ones, and any a host knows in advance) cost no allocation; see
/// [`Header::named`].
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Header {
    /// The header name.
    pub name: Cow<'static, str>,
    /// The header value; `None` is Kafka's null value.
    pub value: Option<Vec<u8>>,
}

impl Header {
    /// A header with a value.
    pub fn new(name: impl Into<Cow<'static, str>>, value: impl Into<Vec<u8>>) -> Self {
        Header {
            name: name.into(),
            value: Some(value.into()),
        }
    }

    /// A header named by text read off the wire: the three causal names
    /// are borrowed from constants (every stamped record carries them, and
    /// a host copies headers per record), any other name is copied.
    pub fn named(name: &str, value: Option<Vec<u8>>) -> Self {
        let name = match name {
            CLOCK_HEADER => Cow::Borrowed(CLOCK_HEADER),
            SENDER_HEADER => Cow::Borrowed(SENDER_HEADER),
            SEQ_HEADER => Cow::Borrowed(SEQ_HEADER),
            other => Cow::Owned(other.to_owned()),
        };
        Header { name, value }
    }

    /// The header name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Header name of the dependency clock.
pub const CLOCK_HEADER: &str = "vc";
/// Header name of the sender identity.
pub const SENDER_HEADER: &str = "vc-sender";
/// Header name of the per-channel send sequence.
pub const SEQ_HEADER: &str = "vc-seq";

/// A record's sender identity and its send sequence on the record's channel.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SenderTag {
    /// The producing node.
    pub sender: SenderId,
    /// The record's send sequence on its channel at that sender.
    pub seq: i64,
}

/// Why a record's causal headers cannot be trusted.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CorruptHeader {
    /// The `vc` header is present but is not a valid clock.
    #[error("corrupt `vc` header: {0}")]
    Clock(#[from] CorruptClock),
    /// `vc-sender` has the wrong length.
    #[error("corrupt `vc-sender` header: expected 16 bytes, found {0}")]
    SenderLength(usize),
    /// `vc-seq` has the wrong length.
    #[error("corrupt `vc-seq` header: expected 8 bytes, found {0}")]
    SeqLength(usize),
    /// `vc-seq` holds a negative number.
    #[error("corrupt `vc-seq` header: negative sequence {0}")]
    NegativeSeq(i64),
    /// `vc-sender` is present without `vc-seq`.
    #[error("corrupt causal headers: `vc-sender` present without `vc-seq`")]
    SenderWithoutSeq,
    /// `vc-seq` is present without `vc-sender`.
    #[error("corrupt causal headers: `vc-seq` present without `vc-sender`")]
    SeqWithoutSender,
    /// A causal header appears more than once.
    #[error("corrupt causal headers: `{0}` appears more than once")]
    Duplicate(&'static str),
    /// A causal header is present with a null value.
    #[error("corrupt causal headers: `{0}` has a null value")]
    NullValue(&'static str),
}

/// Whether `name` is one of the three causal header names.
pub fn is_causal_header(name: &str) -> bool {
    matches!(name, CLOCK_HEADER | SENDER_HEADER | SEQ_HEADER)
}

/// Decodes a `vc-sender` value.
pub fn decode_sender(value: &[u8]) -> Result<SenderId, CorruptHeader> {
    let bytes: [u8; 16] = value
        .try_into()
        .map_err(|_| CorruptHeader::SenderLength(value.len()))?;
    Ok(SenderId::from_bytes(bytes))
}

/// Decodes a `vc-seq` value.
pub fn decode_seq(value: &[u8]) -> Result<i64, CorruptHeader> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| CorruptHeader::SeqLength(value.len()))?;
    let seq = i64::from_be_bytes(bytes);
    if seq < 0 {
        return Err(CorruptHeader::NegativeSeq(seq));
    }
    Ok(seq)
}

/// The causal content of a record's headers: its clock and, for records
/// produced by a node, the sender tag.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct CausalHeaders {
    /// The dependency clock; empty when the record carried no `vc`.
    pub clock: VectorClock,
    /// The sender tag; `None` for records from unstamped or plain producers.
    pub sender: Option<SenderTag>,
}

impl CausalHeaders {
    /// Reads the causal headers out of a record's headers, ignoring every
    /// other header. `None` values stand for Kafka's null header values.
    pub fn decode<'a, I>(headers: I) -> Result<CausalHeaders, CorruptHeader>
    where
        I: IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    {
        let mut clock: Option<&[u8]> = None;
        let mut sender: Option<&[u8]> = None;
        let mut seq: Option<&[u8]> = None;
        for (name, value) in headers {
            let (slot, name) = match name {
                CLOCK_HEADER => (&mut clock, CLOCK_HEADER),
                SENDER_HEADER => (&mut sender, SENDER_HEADER),
                SEQ_HEADER => (&mut seq, SEQ_HEADER),
                _ => continue,
            };
            if slot.is_some() {
                return Err(CorruptHeader::Duplicate(name));
            }
            *slot = Some(value.ok_or(CorruptHeader::NullValue(name))?);
        }
        let clock = match clock {
            Some(bytes) => VectorClock::decode(bytes)?,
            None => VectorClock::new(),
        };
        let sender = match (sender, seq) {
            (None, None) => None,
            (Some(_), None) => return Err(CorruptHeader::SenderWithoutSeq),
            (None, Some(_)) => return Err(CorruptHeader::SeqWithoutSender),
            (Some(s), Some(q)) => Some(SenderTag {
                sender: decode_sender(s)?,
                seq: decode_seq(q)?,
            }),
        };
        Ok(CausalHeaders { clock, sender })
    }

    /// The header values to attach to an outgoing record, in the order
    /// `vc`, `vc-sender`, `vc-seq`. `vc` is always written, even for an empty
    /// clock, so a stamped record is distinguishable from an unstamped one.
    pub fn encode(&self) -> Vec<(&'static str, Vec<u8>)> {
        let mut out = Vec::with_capacity(3);
        self.encode_each_as(ClockVersion::V1, |name, value| out.push((name, value)));
        out
    }

    /// [`encode`](Self::encode) as record headers appended to `out`, their
    /// names borrowed (no allocation beyond the three values).
    pub fn encode_headers_into(&self, out: &mut Vec<Header>) {
        self.encode_headers_into_as(ClockVersion::V1, out);
    }

    /// [`encode_headers_into`](Self::encode_headers_into) with the `vc`
    /// written in `version`.
    pub fn encode_headers_into_as(&self, version: ClockVersion, out: &mut Vec<Header>) {
        self.encode_each_as(version, |name, value| {
            out.push(Header {
                name: std::borrow::Cow::Borrowed(name),
                value: Some(value),
            })
        });
    }

    /// Calls `f` with each header name and value, in wire order.
    fn encode_each_as(&self, version: ClockVersion, mut f: impl FnMut(&'static str, Vec<u8>)) {
        f(CLOCK_HEADER, self.clock.encode_as(version));
        if let Some(tag) = self.sender {
            f(SENDER_HEADER, tag.sender.to_bytes().to_vec());
            f(SEQ_HEADER, tag.seq.to_be_bytes().to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_three_causal_names_are_causal() {
        for name in [CLOCK_HEADER, SENDER_HEADER, SEQ_HEADER] {
            assert!(is_causal_header(name), "{name}");
        }
        for name in ["", "v", "vc-other", "VC", "trace", "vc-seq "] {
            assert!(!is_causal_header(name), "{name:?}");
        }
    }

    #[test]
    fn a_sequence_of_zero_decodes_and_a_negative_one_does_not() {
        assert_eq!(decode_seq(&0i64.to_be_bytes()), Ok(0));
        assert_eq!(decode_seq(&i64::MAX.to_be_bytes()), Ok(i64::MAX));
        assert_eq!(
            decode_seq(&(-1i64).to_be_bytes()),
            Err(CorruptHeader::NegativeSeq(-1))
        );
    }
}
