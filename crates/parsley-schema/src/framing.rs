//! Confluent's wire format: a zero byte, the schema's id as four bytes in
//! big-endian order, then the payload the schema describes.
//!
//! ```text
//! 0x00 | id (u32, big-endian) | payload ...
//! ```
//!
//! Protobuf payloads carry message indexes between the id and the message;
//! the formats this crate writes (Avro, JSON Schema) do not.

use std::fmt;

/// The first byte of every framed record.
pub const MAGIC: u8 = 0;

/// The length of the frame before the payload: the magic byte and the id.
pub const HEADER_LEN: usize = 5;

/// Bytes that are not a registry frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// Fewer bytes than the magic byte and the schema id need.
    #[error(
        "{len} byte(s) cannot be a schema-registry frame, which starts with a zero byte and a 4-byte schema id"
    )]
    Truncated {
        /// How many bytes there were.
        len: usize,
    },
    /// The first byte is not the format's zero byte.
    #[error(
        "the first byte is {found:#04x}, not the schema-registry frame's zero byte: the record was not written by a registry serializer"
    )]
    WrongMagic {
        /// The byte found.
        found: u8,
    },
}

/// A frame's schema id and the payload after it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The registry's id of the schema the payload was written with.
    pub id: u32,
    /// The payload.
    pub payload: &'a [u8],
}

impl fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Frame(id {}, {} byte(s))", self.id, self.payload.len())
    }
}

/// Splits framed bytes into the schema id and the payload.
///
/// ```
/// use parsley_schema::framing::{unframe, FramingError};
/// let f = unframe(&[0, 0, 0, 1, 2, 0xaa])?;
/// assert_eq!((f.id, f.payload), (258, &[0xaa][..]));
/// assert_eq!(unframe(&[1, 0, 0, 0, 1]), Err(FramingError::WrongMagic { found: 1 }));
/// assert_eq!(unframe(&[0, 0, 0]), Err(FramingError::Truncated { len: 3 }));
/// # Ok::<(), FramingError>(())
/// ```
pub fn unframe(bytes: &[u8]) -> Result<Frame<'_>, FramingError> {
    let Some((header, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(FramingError::Truncated { len: bytes.len() });
    };
    let [magic, id @ ..] = *header;
    if magic != MAGIC {
        return Err(FramingError::WrongMagic { found: magic });
    }
    Ok(Frame {
        id: u32::from_be_bytes(id),
        payload,
    })
}

/// Starts a frame for schema `id`: the header, with room for `payload_hint`
/// more bytes. Write the payload after it.
pub fn header(id: u32, payload_hint: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload_hint);
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    out
}

/// Frames `payload` under schema `id`.
///
/// ```
/// use parsley_schema::framing::frame;
/// assert_eq!(frame(7, b"x"), vec![0, 0, 0, 0, 7, b'x']);
/// ```
pub fn frame(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = header(id, payload.len());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn frames_round_trip(id in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let framed = frame(id, &payload);
            prop_assert_eq!(framed.len(), HEADER_LEN + payload.len());
            let f = unframe(&framed).unwrap();
            prop_assert_eq!(f.id, id);
            prop_assert_eq!(f.payload, &payload[..]);
        }

        #[test]
        fn anything_not_starting_with_zero_is_refused(first in 1u8.., rest in proptest::collection::vec(any::<u8>(), 4..16)) {
            let mut b = vec![first];
            b.extend(rest);
            prop_assert_eq!(unframe(&b), Err(FramingError::WrongMagic { found: first }));
        }
    }

    #[test]
    fn the_id_is_big_endian_and_an_empty_payload_is_a_frame() {
        let f = unframe(&[0, 0x01, 0x02, 0x03, 0x04]).unwrap();
        assert_eq!(f.id, 0x0102_0304);
        assert!(f.payload.is_empty());
        for len in 0..HEADER_LEN {
            assert_eq!(
                unframe(&[0; HEADER_LEN][..len]),
                Err(FramingError::Truncated { len })
            );
        }
    }
}
