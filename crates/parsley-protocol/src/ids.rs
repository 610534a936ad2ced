//! Identities: topics, channels and senders.
//!
//! Both [`TopicId`] and [`SenderId`] are 16-byte UUIDs. Their ordering is the
//! one the Java implementation uses (`java.util.UUID::compareTo`): the most
//! significant 64 bits compared as a *signed* integer, then the least
//! significant 64 bits, also signed. The canonical clock encoding sorts by this
//! order, so it is part of the wire format: a plain byte-wise order would put
//! every UUID whose top bit is set in a different place and break byte
//! equality of equal clocks across implementations.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

/// Error returned when a UUID or channel string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct ParseIdError {
    what: &'static str,
    input: String,
    reason: String,
}

impl ParseIdError {
    fn new(what: &'static str, input: &str, reason: impl fmt::Display) -> Self {
        ParseIdError {
            what,
            input: input.to_owned(),
            reason: reason.to_string(),
        }
    }
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name {
            // Field order matters: the derived `Ord` compares `msb` first, then
            // `lsb`, both as signed integers, which is the canonical order.
            msb: i64,
            lsb: i64,
        }

        impl $name {
            /// Builds the identity from its two halves, most significant first.
            pub const fn from_halves(msb: i64, lsb: i64) -> Self {
                $name { msb, lsb }
            }

            /// Builds the identity from its 16 big-endian bytes.
            pub const fn from_bytes(bytes: [u8; 16]) -> Self {
                let v = u128::from_be_bytes(bytes);
                Self::from_u128(v)
            }

            /// Builds the identity from a 128-bit integer (big-endian bit order).
            pub const fn from_u128(v: u128) -> Self {
                $name {
                    msb: (v >> 64) as u64 as i64,
                    lsb: v as u64 as i64,
                }
            }

            /// The most significant 64 bits, as the wire format writes them.
            pub const fn msb(self) -> i64 {
                self.msb
            }

            /// The least significant 64 bits, as the wire format writes them.
            pub const fn lsb(self) -> i64 {
                self.lsb
            }

            /// The 16 big-endian bytes.
            pub const fn to_bytes(self) -> [u8; 16] {
                self.to_u128().to_be_bytes()
            }

            /// The identity as a 128-bit integer.
            pub const fn to_u128(self) -> u128 {
                ((self.msb as u64 as u128) << 64) | (self.lsb as u64 as u128)
            }

            /// The identity as a [`Uuid`].
            pub const fn to_uuid(self) -> Uuid {
                Uuid::from_u128(self.to_u128())
            }
        }

        impl From<Uuid> for $name {
            fn from(u: Uuid) -> Self {
                Self::from_u128(u.as_u128())
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Uuid {
                id.to_uuid()
            }
        }

        impl fmt::Display for $name {
            /// Lower-case hyphenated UUID text, the form state keys use.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_uuid().hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            /// Parses the hyphenated UUID text form (either case).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_hyphenated(s.as_bytes())
                    .map(Self::from_u128)
                    .ok_or_else(|| ParseIdError::new($what, s, "expected a hyphenated UUID (8-4-4-4-12 hex digits)"))
            }
        }
    };
}

uuid_id!(
    /// The broker-assigned identity of a topic. A topic that is deleted and
    /// recreated under the same name gets a new id, and so is a different
    /// causal channel.
    TopicId,
    "topic id"
);

uuid_id!(
    /// The stable identity of a producing node, carried in the `vc-sender`
    /// header and named by sequence claims.
    SenderId,
    "sender id"
);

/// One partition of one topic: the unit of FIFO delivery and of causal
/// bookkeeping. Orders by topic id (canonical order), then partition.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Channel {
    /// The topic's identity.
    pub topic: TopicId,
    /// The partition number; never negative in a valid channel.
    pub partition: i32,
}

impl Channel {
    /// A channel for `partition` of `topic`.
    pub const fn new(topic: TopicId, partition: i32) -> Self {
        Channel { topic, partition }
    }
}

impl fmt::Display for Channel {
    /// `<topic-uuid>:<partition>`, the form state keys use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.topic, self.partition)
    }
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Channel({self})")
    }
}

impl FromStr for Channel {
    type Err = ParseIdError;

    /// Parses `<topic-uuid>:<partition>` with a non-negative decimal partition.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match parse_channel_prefix(s.as_bytes()) {
            Some((channel, [])) => Ok(channel),
            _ => Err(ParseIdError::new(
                "channel",
                s,
                "expected <topic-uuid>:<partition> with a non-negative decimal partition",
            )),
        }
    }
}

/// Parses a hyphenated UUID (either case) from exactly 36 bytes.
pub(crate) fn parse_hyphenated(b: &[u8]) -> Option<u128> {
    if b.len() != 36 {
        return None;
    }
    Uuid::try_parse_ascii(b).ok().map(|u| u.as_u128())
}

/// Parses a hyphenated UUID in its one canonical spelling (lower-case hex,
/// the form [`fmt::Display`] writes), from exactly 36 bytes. State keys use
/// this: two spellings of one id must never name two entries.
pub(crate) fn parse_hyphenated_canonical(b: &[u8]) -> Option<u128> {
    if b.iter().any(u8::is_ascii_uppercase) {
        return None;
    }
    parse_hyphenated(b)
}

/// The value of one lower-case hex digit (`None` for anything else,
/// upper case included: store keys have exactly one spelling).
pub(crate) fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Parses `<topic-uuid>:<partition>` at the start of `b` and returns the
/// channel and the bytes after it. The partition is one or more decimal
/// digits fitting an `i32`.
pub(crate) fn parse_channel_prefix(b: &[u8]) -> Option<(Channel, &[u8])> {
    parse_channel_prefix_with(b, parse_hyphenated, false)
}

/// [`parse_channel_prefix`] accepting only the canonical spelling that
/// [`Channel`]'s `Display` writes: a lower-case topic id and a partition
/// without leading zeros.
pub(crate) fn parse_channel_prefix_canonical(b: &[u8]) -> Option<(Channel, &[u8])> {
    parse_channel_prefix_with(b, parse_hyphenated_canonical, true)
}

fn parse_channel_prefix_with(
    b: &[u8],
    uuid: fn(&[u8]) -> Option<u128>,
    canonical: bool,
) -> Option<(Channel, &[u8])> {
    let topic = uuid(b.get(..36)?)?;
    if b.get(36) != Some(&b':') {
        return None;
    }
    let rest = &b[37..];
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits > 10 || (canonical && digits > 1 && rest[0] == b'0') {
        return None;
    }
    let mut partition: i64 = 0;
    for &c in &rest[..digits] {
        partition = partition * 10 + i64::from(c - b'0');
    }
    let partition = i32::try_from(partition).ok()?;
    Some((
        Channel::new(TopicId::from_u128(topic), partition),
        &rest[digits..],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_case_ids_parse_to_the_same_id_and_debug_names_the_channel() {
        let lower = "0123abcd-ef01-2345-6789-abcdefabcdef";
        let upper = lower.to_uppercase();
        let a: TopicId = lower.parse().unwrap();
        let b: TopicId = upper.parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), lower);
        let c = Channel::new(a, 3);
        assert_eq!(format!("{c:?}"), format!("Channel({lower}:3)"));
    }

    #[test]
    fn a_ten_digit_partition_parses_and_an_eleven_digit_one_does_not() {
        let id = "0123abcd-ef01-2345-6789-abcdefabcdef";
        let text = format!("{id}:2147483647/x");
        let (c, rest) = parse_channel_prefix(text.as_bytes()).unwrap();
        assert_eq!((c.partition, rest), (i32::MAX, &b"/x"[..]));
        assert!(parse_channel_prefix(format!("{id}:21474836470").as_bytes()).is_none());
        assert!(parse_channel_prefix(format!("{id}:2147483648").as_bytes()).is_none());
        let (c, _) = parse_channel_prefix_canonical(format!("{id}:1000000000").as_bytes()).unwrap();
        assert_eq!(c.partition, 1_000_000_000);
    }

    #[test]
    fn order_is_signed_msb_then_signed_lsb() {
        // A UUID whose top bit is set is negative as a signed long, so it
        // sorts *before* one whose top bit is clear.
        let high = TopicId::from_u128(0x8000_0000_0000_0000_0000_0000_0000_0001);
        let low = TopicId::from_u128(0x0000_0000_0000_0001_0000_0000_0000_0000);
        assert!(high < low);
        // Same for the least significant half.
        let a = TopicId::from_halves(1, -1);
        let b = TopicId::from_halves(1, 0);
        assert!(a < b);
    }

    #[test]
    fn text_round_trip_is_lower_case_hyphenated() {
        let id = TopicId::from_u128(0xABCDEF01_2345_6789_ABCD_EF0123456789);
        let text = id.to_string();
        assert_eq!(text, "abcdef01-2345-6789-abcd-ef0123456789");
        assert_eq!(text.parse::<TopicId>().unwrap(), id);
        assert_eq!(
            "ABCDEF01-2345-6789-ABCD-EF0123456789"
                .parse::<TopicId>()
                .unwrap(),
            id
        );
        assert!(
            "abcdef0123456789abcdef0123456789"
                .parse::<TopicId>()
                .is_err()
        );
    }

    #[test]
    fn bytes_and_halves_agree() {
        let bytes = [0x80, 1, 2, 3, 4, 5, 6, 7, 0xff, 9, 10, 11, 12, 13, 14, 15];
        let id = SenderId::from_bytes(bytes);
        assert_eq!(id.msb(), i64::from_be_bytes([0x80, 1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(
            id.lsb(),
            i64::from_be_bytes([0xff, 9, 10, 11, 12, 13, 14, 15])
        );
        assert_eq!(id.to_bytes(), bytes);
    }

    #[test]
    fn channel_text_round_trip() {
        let ch = Channel::new(TopicId::from_u128(7), 12);
        assert_eq!(ch.to_string(), "00000000-0000-0000-0000-000000000007:12");
        assert_eq!(ch.to_string().parse::<Channel>().unwrap(), ch);
        assert!(
            "00000000-0000-0000-0000-000000000007:-1"
                .parse::<Channel>()
                .is_err()
        );
        assert!(
            "00000000-0000-0000-0000-000000000007:+1"
                .parse::<Channel>()
                .is_err()
        );
        assert!(
            "00000000-0000-0000-0000-000000000007"
                .parse::<Channel>()
                .is_err()
        );
        assert!(
            "00000000-0000-0000-0000-000000000007:"
                .parse::<Channel>()
                .is_err()
        );
    }
}
