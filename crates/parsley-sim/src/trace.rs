//! [`Trace`]: a running digest of what a world did, for the determinism
//! checks.
//!
//! The broker feeds it every append (record bytes and where they landed,
//! markers included) and the oracle every delivery it judges (which node,
//! which channel, which offset). A digest that saw only counts could not
//! tell two runs apart that deliver the same number of records in a
//! different order; this one sees the order and the bytes.
//!
//! The mixing is 64-bit FNV-1a over a framed byte stream: every variable
//! length field is preceded by its length, and every event by a tag, so two
//! different event sequences cannot frame into the same bytes.

use parsley_protocol::{Channel, SenderId};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// A running 64-bit digest over framed words and byte strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace(u64);

impl Default for Trace {
    fn default() -> Self {
        Trace(FNV_OFFSET)
    }
}

impl Trace {
    /// An empty digest.
    pub fn new() -> Self {
        Trace::default()
    }

    /// The digest so far.
    pub fn value(&self) -> u64 {
        self.0
    }

    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(FNV_PRIME);
    }

    /// Mixes a fixed-width word.
    pub fn word(&mut self, w: u64) {
        for b in w.to_le_bytes() {
            self.byte(b);
        }
    }

    /// Mixes a byte string, length first.
    pub fn bytes(&mut self, b: &[u8]) {
        self.word(b.len() as u64);
        for &x in b {
            self.byte(x);
        }
    }

    /// Mixes an optional byte string (absent and empty differ).
    pub fn opt_bytes(&mut self, b: Option<&[u8]>) {
        match b {
            None => self.word(0),
            Some(b) => {
                self.word(1);
                self.bytes(b);
            }
        }
    }

    /// Mixes a channel: its topic id's bytes and its partition.
    pub fn channel(&mut self, c: Channel) {
        self.bytes(&c.topic.to_bytes());
        self.word(c.partition as u32 as u64);
    }

    /// Mixes a sender id.
    pub fn sender(&mut self, s: SenderId) {
        self.bytes(&s.to_bytes());
    }

    /// Mixes one delivery: the node (by actor index), the channel and the
    /// offset.
    pub fn delivery(&mut self, actor: usize, c: Channel, offset: i64) {
        self.word(0xD1);
        self.word(actor as u64);
        self.channel(c);
        self.word(offset as u64);
    }
}

#[cfg(test)]
mod tests {
    use parsley_protocol::TopicId;

    use super::*;

    fn c(p: i32) -> Channel {
        Channel::new(TopicId::from_u128(7), p)
    }

    #[test]
    fn delivery_order_changes_the_digest() {
        let mut a = Trace::new();
        a.delivery(1, c(0), 3);
        a.delivery(1, c(1), 3);
        let mut b = Trace::new();
        b.delivery(1, c(1), 3);
        b.delivery(1, c(0), 3);
        assert_ne!(a.value(), b.value());
        let mut same = Trace::new();
        same.delivery(1, c(0), 3);
        same.delivery(1, c(1), 3);
        assert_eq!(a.value(), same.value());
    }

    #[test]
    fn each_coordinate_of_a_delivery_counts() {
        let base = {
            let mut t = Trace::new();
            t.delivery(1, c(0), 3);
            t.value()
        };
        for (actor, ch, offset) in [(2, c(0), 3), (1, c(1), 3), (1, c(0), 4)] {
            let mut t = Trace::new();
            t.delivery(actor, ch, offset);
            assert_ne!(t.value(), base, "{actor} {ch} {offset}");
        }
    }

    #[test]
    fn framing_separates_fields() {
        // "ab" + "" and "a" + "b" are the same bytes unframed.
        let mut a = Trace::new();
        a.bytes(b"ab");
        a.bytes(b"");
        let mut b = Trace::new();
        b.bytes(b"a");
        b.bytes(b"b");
        assert_ne!(a.value(), b.value());
        let mut none = Trace::new();
        none.opt_bytes(None);
        let mut empty = Trace::new();
        empty.opt_bytes(Some(b""));
        assert_ne!(none.value(), empty.value());
    }
}
