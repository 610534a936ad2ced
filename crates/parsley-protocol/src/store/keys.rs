//! The protocol store's keys: [`StateKey`], their text form and parsing.

use super::*;

/// Recognises the entry keys of one queue by their text: one prefix
/// comparison and the index's sixteen digits per key, instead of parsing
/// the whole key (a page-in reads a run of one queue's entries back from
/// the local store, and the channel's text is the same in all of them).
#[derive(Clone)]
pub struct QueueEntryKeys {
    key: KeyText,
}

impl fmt::Debug for QueueEntryKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("QueueEntryKeys")
            .field(&self.key.as_str())
            .finish()
    }
}

impl QueueEntryKeys {
    /// The entry keys of `channel`'s queue.
    pub fn new(channel: Channel) -> Self {
        QueueEntryKeys {
            key: StateKey::QueueEntry(channel, 0).text(),
        }
    }

    /// The page keys of `channel`'s queue.
    pub fn pages(channel: Channel) -> Self {
        QueueEntryKeys {
            key: StateKey::QueuePage(channel, 0).text(),
        }
    }

    /// The index of `key` if it is an entry key of this queue, else `None`.
    pub fn index(&self, key: &[u8]) -> Option<i64> {
        let own = self.key.as_str().as_bytes();
        let head = own.get(..own.len().checked_sub(16)?)?;
        if key.len() != own.len() || !key.starts_with(head) {
            return None;
        }
        parse_hex16(&key[head.len()..])
    }
}

/// A parsed state-store key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum StateKey {
    /// `scope`
    Scope,
    /// `f/<channel>`
    Frontier(Channel),
    /// `cc/<channel>`
    ChannelClock(Channel),
    /// `ca`
    CarriedAncestry,
    /// `q/<channel>/m`
    QueueMeta(Channel),
    /// `q/<channel>/e/<index>`: one held record (the layout before pages;
    /// read and deleted, never written).
    QueueEntry(Channel, i64),
    /// `q/<channel>/p/<index>`: a page of held records, the first at queue
    /// index `index`.
    QueuePage(Channel, i64),
    /// `sq/<channel>`
    SendSeq(Channel),
    /// `ds/<channel>/<sender>`
    DeliveredSeq(Channel, SenderId),
    /// `sk/<channel>/<sender>`: records of `sender` on a joined input that
    /// the node's past already claimed by sequence (this implementation's
    /// own key; see `docs/decisions.md`).
    SkipMark(Channel, SenderId),
    /// `st/<channel>/<offset>`: a record the node stepped past instead of
    /// delivering (sent to a dead-letter topic by an operator's or the
    /// stage's choice; this implementation's own key).
    Stepped(Channel, i64),
}

impl fmt::Display for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateKey::Scope => f.write_str("scope"),
            StateKey::Frontier(c) => write!(f, "f/{c}"),
            StateKey::ChannelClock(c) => write!(f, "cc/{c}"),
            StateKey::CarriedAncestry => f.write_str("ca"),
            StateKey::QueueMeta(c) => write!(f, "q/{c}/m"),
            StateKey::QueueEntry(c, i) => write!(f, "q/{c}/e/{i:016x}"),
            StateKey::QueuePage(c, i) => write!(f, "q/{c}/p/{i:016x}"),
            StateKey::SendSeq(c) => write!(f, "sq/{c}"),
            StateKey::DeliveredSeq(c, s) => write!(f, "ds/{c}/{s}"),
            StateKey::SkipMark(c, s) => write!(f, "sk/{c}/{s}"),
            StateKey::Stepped(c, o) => write!(f, "st/{c}/{:016x}", *o as u64),
        }
    }
}

impl StateKey {
    /// Whether the key holds held records (a page, or one record in the
    /// layout before pages).
    pub fn is_held(&self) -> bool {
        matches!(self, StateKey::QueueEntry(..) | StateKey::QueuePage(..))
    }

    /// The key's text, exactly as `Display` writes it.
    pub fn to_key(&self) -> String {
        self.text().as_str().to_owned()
    }

    /// The key's text in a stack buffer, exactly as `Display` writes it,
    /// built by hand without allocating: every persisted write names its
    /// key, and the formatting machinery was a quarter of a delivered
    /// record's cost (profiled with callgrind; see `docs/performance.md`).
    pub fn text(&self) -> KeyText {
        let mut s = KeyText::new();
        match *self {
            StateKey::Scope => s.push(b"scope"),
            StateKey::CarriedAncestry => s.push(b"ca"),
            StateKey::Frontier(c) => {
                s.push(b"f/");
                s.push_channel(c);
            }
            StateKey::ChannelClock(c) => {
                s.push(b"cc/");
                s.push_channel(c);
            }
            StateKey::QueueMeta(c) => {
                s.push(b"q/");
                s.push_channel(c);
                s.push(b"/m");
            }
            StateKey::QueueEntry(c, index) => {
                s.push(b"q/");
                s.push_channel(c);
                s.push(b"/e/");
                s.push(&hex16(index));
            }
            StateKey::QueuePage(c, index) => {
                s.push(b"q/");
                s.push_channel(c);
                s.push(b"/p/");
                s.push(&hex16(index));
            }
            StateKey::Stepped(c, offset) => {
                s.push(b"st/");
                s.push_channel(c);
                s.push(b"/");
                s.push(&hex16(offset));
            }
            StateKey::SendSeq(c) => {
                s.push(b"sq/");
                s.push_channel(c);
            }
            StateKey::DeliveredSeq(c, sender) => {
                s.push(b"ds/");
                s.push_channel(c);
                s.push(b"/");
                s.push_uuid(sender.to_u128());
            }
            StateKey::SkipMark(c, sender) => {
                s.push(b"sk/");
                s.push_channel(c);
                s.push(b"/");
                s.push_uuid(sender.to_u128());
            }
        }
        s
    }
}

pub(super) const HEX: &[u8; 16] = b"0123456789abcdef";

/// A non-negative index or offset as 16 lower-case hex digits (keys of one
/// channel then sort in numeric order).
pub(super) fn hex16(v: i64) -> [u8; 16] {
    let v = v as u64;
    let mut hex = [0u8; 16];
    for (i, h) in hex.iter_mut().enumerate() {
        *h = HEX[((v >> ((15 - i) * 4)) & 0xf) as usize];
    }
    hex
}

/// Parses [`hex16`]'s form back (lower case only: one spelling per key).
pub(super) fn parse_hex16(b: &[u8]) -> Option<i64> {
    if b.len() != 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        v = (v << 4) | u64::from(hex_digit(c)?);
    }
    i64::try_from(v).ok()
}

/// Every byte's two lower-case hex digits.
pub(super) const HEX_PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// The longest key: `ds/<uuid>:<-2147483648>/<uuid>` is 88 bytes
/// (`st/<uuid>:<-2147483648>/<16 hex>` is 68).
pub(super) const KEY_TEXT_CAPACITY: usize = 96;

/// A state key's text held on the stack (see [`StateKey::text`]).
#[derive(Clone, Copy)]
pub struct KeyText {
    buf: [u8; KEY_TEXT_CAPACITY],
    len: usize,
}

impl KeyText {
    fn new() -> Self {
        KeyText {
            buf: [0; KEY_TEXT_CAPACITY],
            len: 0,
        }
    }

    /// Appends ASCII bytes. Every caller writes a bounded, ASCII-only part
    /// of a key; the capacity covers the longest key.
    fn push(&mut self, bytes: &[u8]) {
        if let Some(slot) = self.buf.get_mut(self.len..self.len + bytes.len()) {
            slot.copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    /// A UUID in its lower-case hyphenated form (8-4-4-4-12): each byte's
    /// two digits from a table, at fixed positions (the uuid crate's
    /// formatter was a fifth of a key's cost).
    fn push_uuid(&mut self, v: u128) {
        const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
        let mut out = [b'-'; 36];
        for (byte, at) in v.to_be_bytes().into_iter().zip(AT) {
            out[at..at + 2].copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
        }
        self.push(&out);
    }

    /// `<topic-uuid>:<partition>`, the partition in decimal.
    fn push_channel(&mut self, c: Channel) {
        self.push_uuid(c.topic.to_u128());
        self.push(b":");
        let p = c.partition;
        if p < 0 {
            self.push(b"-");
        }
        let mut digits = [0u8; 10];
        let mut n = p.unsigned_abs();
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[start..]);
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever pushed, so this never falls back.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl std::ops::Deref for KeyText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for KeyText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl FromStr for StateKey {
    type Err = CorruptState;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        parse_key(key.as_bytes()).ok_or_else(|| CorruptState::new(key, "not a protocol state key"))
    }
}

/// Parses a state key by fixed positions (keys are generated, so their
/// shapes are exact; anything else is not ours). Only the spelling that
/// `Display` writes is accepted: lower-case ids, partitions and indices
/// without leading zeros. A second spelling of one key would name the same
/// entry twice, and restore could not tell which one is current.
pub(super) fn parse_key(b: &[u8]) -> Option<StateKey> {
    match b {
        b"scope" => return Some(StateKey::Scope),
        b"ca" => return Some(StateKey::CarriedAncestry),
        _ => {}
    }
    let (kind, rest) = if let Some(r) = b.strip_prefix(b"q/") {
        (b'q', r)
    } else if let Some(r) = b.strip_prefix(b"f/") {
        (b'f', r)
    } else if let Some(r) = b.strip_prefix(b"cc/") {
        (b'c', r)
    } else if let Some(r) = b.strip_prefix(b"sq/") {
        (b's', r)
    } else if let Some(r) = b.strip_prefix(b"ds/") {
        (b'd', r)
    } else if let Some(r) = b.strip_prefix(b"sk/") {
        (b'k', r)
    } else if let Some(r) = b.strip_prefix(b"st/") {
        (b't', r)
    } else {
        return None;
    };
    let (channel, rest) = parse_channel_prefix_canonical(rest)?;
    match (kind, rest) {
        (b'f', []) => Some(StateKey::Frontier(channel)),
        (b'c', []) => Some(StateKey::ChannelClock(channel)),
        (b's', []) => Some(StateKey::SendSeq(channel)),
        (b'd', [b'/', sender @ ..]) => Some(StateKey::DeliveredSeq(
            channel,
            SenderId::from_u128(parse_hyphenated_canonical(sender)?),
        )),
        (b'k', [b'/', sender @ ..]) => Some(StateKey::SkipMark(
            channel,
            SenderId::from_u128(parse_hyphenated_canonical(sender)?),
        )),
        (b'q', b"/m") => Some(StateKey::QueueMeta(channel)),
        // Lower-case hex only (`hex_digit` refuses upper case): the index
        // and the offset are written in exactly one form.
        (b'q', [b'/', b'e', b'/', index @ ..]) => {
            parse_hex16(index).map(|i| StateKey::QueueEntry(channel, i))
        }
        (b'q', [b'/', b'p', b'/', index @ ..]) => {
            parse_hex16(index).map(|i| StateKey::QueuePage(channel, i))
        }
        (b't', [b'/', offset @ ..]) => parse_hex16(offset).map(|o| StateKey::Stepped(channel, o)),
        _ => None,
    }
}
