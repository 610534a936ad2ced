//! The keyed-bytes state seam: store keys, value layouts, the held-record
//! envelope, and the write batch the node hands its host.
//!
//! # How a host persists node state
//!
//! The node never writes anywhere itself. It records what changed, and
//! [`CausalNode::take_writes`](crate::CausalNode::take_writes) hands the host
//! a [`WriteBatch`] holding only the keys that changed since the last call.
//! The host commits that batch in the same transaction as the consumed
//! positions and the sends of the step, and a restart restores from exactly
//! what was committed through [`StoreRead`]. If the transaction aborts instead,
//! the host discards the node and initialises a new one from the committed
//! store: the node's memory is never rolled back piecemeal.
//!
//! # Keys
//!
//! Keys are UTF-8 strings; `<channel>` is `<topic-uuid>:<partition>` with the
//! UUID in lower-case hyphenated form.
//!
//! | key | value |
//! |-----|-------|
//! | `scope` | `i32` input count, per input `i64 msb, i64 lsb, i32 partition`; `i32` sink count, per sink `i64 msb, i64 lsb` |
//! | `f/<channel>` | `i64` frontier |
//! | `cc/<channel>` | clock: the channel's advertised clock |
//! | `ca` | clock: carried ancestry |
//! | `q/<channel>/m` | `i64` head index, `i64` tail index (one past the last entry) |
//! | `q/<channel>/p/<index>` | a page of held records (below), the first at queue index `index` (16 lower-case hex digits) |
//! | `q/<channel>/e/<index>` | one held record (envelope below): the Java library's layout, and this one's before pages; read and deleted, no longer written |
//! | `sq/<channel>` | `i64`: the last send sequence issued to that sink channel |
//! | `ds/<channel>/<sender-uuid>` | `i64` seq, `i64` offset: the highest delivered sequence from that sender on the channel, and its offset |
//! | `sk/<channel>/<sender-uuid>` | `i64` seq, `i64` bound: a skip mark set when the channel joined the inputs (this implementation's own key; see `docs/decisions.md`) |
//!
//! Keys parse only in exactly this spelling (no upper-case hex, no leading
//! zeros), so two keys can never name one entry.
//!
//! # Held-record envelope
//!
//! ```text
//! i64 offset
//! i64 timestamp
//! u8  tagged (0 = no sender tag, 1 = tagged)
//! i64 sender msb    (0 when untagged)
//! i64 sender lsb    (0 when untagged)
//! i64 sender seq    (0 when untagged)
//! i32 clock length, then the clock (the empty clock when the record had no `vc`)
//! i32 key length (-1 = null key), then the key
//! i32 value length (-1 = null value), then the value
//! ```
//!
//! That is the layout the Java library writes, and a record without other
//! headers is stored in exactly that form. This implementation also keeps a
//! held record's other headers (Java drops them), in an optional extension
//! after the value:
//!
//! ```text
//! u8  extension tag (1 = headers)
//! i32 header count
//!     per header: i32 name length, UTF-8 name, i32 value length (-1 = null), value
//! ```
//!
//! The extension is written only when there is at least one header, so
//! header-less envelopes stay byte-identical to the Java layout. An unknown
//! extension tag, or any byte after the extension, is corrupt.
//!
//! # Pages of held records
//!
//! A commit writes the records it newly holds on a queue as pages: runs of
//! consecutive queue indices, at most [`PAGE_RECORDS`] records each, and
//! no larger than [`PAGE_BYTES`] unless the page holds a single record (a
//! record that would take a page past it starts the next page, so a record
//! larger than that has a page of its own). A page is deleted once the
//! queue's head has passed all of its records; until then its records
//! below the head are released already, and restore skips them.
//!
//! ```text
//! i32 record count (at least 1)
//!     per record: i32 envelope length, the envelope
//! ```
//!
//! Nothing may follow the last record. One key per page rather than one per
//! record means a long hold costs one changelog record (and one tombstone
//! at its release) per page, and reading a page back is one store lookup.
//! This layout is ours: a stage's state store is private to one
//! implementation (see `docs/decisions.md`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::bytes::Reader;
use crate::clock::{OffsetClaim, SequenceClaim, VectorClock};
use crate::headers::{CausalHeaders, SenderTag};
use crate::ids::{
    Channel, SenderId, TopicId, hex_digit, parse_channel_prefix_canonical,
    parse_hyphenated_canonical,
};
use crate::record::{Header, InboundRecord};

/// The extension tag for held-record headers.
pub const ENVELOPE_HEADERS_EXTENSION: u8 = 1;

/// A persisted value (or key) that does not parse. The node refuses to start
/// from state it cannot read.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("corrupt state at key {key:?}: {reason}")]
pub struct CorruptState {
    /// The offending key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

impl CorruptState {
    pub(crate) fn new(key: impl fmt::Display, reason: impl fmt::Display) -> Self {
        CorruptState {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }
}

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

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A non-negative index or offset as 16 lower-case hex digits (keys of one
/// channel then sort in numeric order).
fn hex16(v: i64) -> [u8; 16] {
    let v = v as u64;
    let mut hex = [0u8; 16];
    for (i, h) in hex.iter_mut().enumerate() {
        *h = HEX[((v >> ((15 - i) * 4)) & 0xf) as usize];
    }
    hex
}

/// Parses [`hex16`]'s form back (lower case only: one spelling per key).
fn parse_hex16(b: &[u8]) -> Option<i64> {
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
const HEX_PAIRS: [[u8; 2]; 256] = {
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
const KEY_TEXT_CAPACITY: usize = 96;

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
fn parse_key(b: &[u8]) -> Option<StateKey> {
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

/// The scope a node's state was written under: its declared inputs and sinks.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ScopeRecord {
    /// Consumed channels, sorted.
    pub inputs: Vec<Channel>,
    /// Sink topics, sorted.
    pub sinks: Vec<TopicId>,
}

impl ScopeRecord {
    /// Encodes the `scope` value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.inputs.len() * 20 + self.sinks.len() * 16);
        out.extend_from_slice(&(self.inputs.len() as i32).to_be_bytes());
        for c in &self.inputs {
            out.extend_from_slice(&c.topic.msb().to_be_bytes());
            out.extend_from_slice(&c.topic.lsb().to_be_bytes());
            out.extend_from_slice(&c.partition.to_be_bytes());
        }
        out.extend_from_slice(&(self.sinks.len() as i32).to_be_bytes());
        for t in &self.sinks {
            out.extend_from_slice(&t.msb().to_be_bytes());
            out.extend_from_slice(&t.lsb().to_be_bytes());
        }
        out
    }

    /// Decodes a `scope` value.
    pub fn decode(bytes: &[u8]) -> Result<ScopeRecord, String> {
        let mut r = Reader::new(bytes);
        let n = count(&mut r, 20, "input")?;
        let mut inputs = Vec::with_capacity(n);
        for _ in 0..n {
            let topic = TopicId::from_halves(need(r.i64())?, need(r.i64())?);
            let partition = need(r.i32())?;
            if partition < 0 {
                return Err(format!("negative partition {partition}"));
            }
            inputs.push(Channel::new(topic, partition));
        }
        let n = count(&mut r, 16, "sink")?;
        let mut sinks = Vec::with_capacity(n);
        for _ in 0..n {
            sinks.push(TopicId::from_halves(need(r.i64())?, need(r.i64())?));
        }
        finish(&r)?;
        inputs.sort_unstable();
        inputs.dedup();
        sinks.sort_unstable();
        sinks.dedup();
        Ok(ScopeRecord { inputs, sinks })
    }
}

fn need<T>(v: Option<T>) -> Result<T, String> {
    v.ok_or_else(|| "truncated value".to_owned())
}

fn count(r: &mut Reader<'_>, entry_len: usize, what: &str) -> Result<usize, String> {
    let n = need(r.i32())?;
    if n < 0 {
        return Err(format!("negative {what} count {n}"));
    }
    let n = n as usize;
    if n.saturating_mul(entry_len) > r.remaining() {
        return Err(format!("{what} count {n} exceeds the value's length"));
    }
    Ok(n)
}

fn finish(r: &Reader<'_>) -> Result<(), String> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(format!("{n} trailing bytes")),
    }
}

/// Encodes a single non-negative `i64` value (`f/…`, `sq/…`).
pub fn encode_i64(v: i64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// Decodes a single non-negative `i64` value.
pub fn decode_i64(bytes: &[u8]) -> Result<i64, String> {
    let mut r = Reader::new(bytes);
    let v = need(r.i64())?;
    finish(&r)?;
    if v < 0 {
        return Err(format!("negative value {v}"));
    }
    Ok(v)
}

/// Encodes a pair of `i64`s (`q/…/m`, `ds/…`).
pub fn encode_pair(a: i64, b: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&a.to_be_bytes());
    out.extend_from_slice(&b.to_be_bytes());
    out
}

/// Decodes a pair of non-negative `i64`s.
pub fn decode_pair(bytes: &[u8]) -> Result<(i64, i64), String> {
    let mut r = Reader::new(bytes);
    let a = need(r.i64())?;
    let b = need(r.i64())?;
    finish(&r)?;
    if a < 0 || b < 0 {
        return Err(format!("negative value in ({a}, {b})"));
    }
    Ok((a, b))
}

/// A record a node stepped past instead of delivering (`st/…`): the
/// dead-letter topic it went to, and why.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SteppedPast {
    /// The dead-letter topic.
    pub dead_letter: String,
    /// Why the record was stepped past.
    pub reason: String,
}

impl SteppedPast {
    /// `i32` length and UTF-8 of the topic, then of the reason.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.dead_letter.len() + self.reason.len());
        for part in [&self.dead_letter, &self.reason] {
            out.extend_from_slice(&(part.len() as i32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    /// Decodes [`encode`](Self::encode)'s form; the topic must not be empty.
    pub fn decode(bytes: &[u8]) -> Result<SteppedPast, String> {
        let mut r = Reader::new(bytes);
        let mut text = || -> Result<String, String> {
            let n = usize::try_from(need(r.i32())?).map_err(|_| "negative length".to_owned())?;
            let b = need(r.take(n))?;
            String::from_utf8(b.to_vec()).map_err(|_| "not UTF-8".to_owned())
        };
        let dead_letter = text()?;
        let reason = text()?;
        finish(&r)?;
        if dead_letter.is_empty() {
            return Err("no dead-letter topic".to_owned());
        }
        Ok(SteppedPast {
            dead_letter,
            reason,
        })
    }
}

/// Encodes a held record's envelope. The record's channel is not part of the
/// value; it is in the key.
pub fn encode_envelope(record: &InboundRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(envelope_len(record));
    encode_envelope_into(record, &mut out);
    out
}

/// The bytes [`encode_envelope`] writes, exactly.
fn envelope_len(record: &InboundRecord) -> usize {
    let headers = if record.headers.is_empty() {
        0
    } else {
        1 + 4
            + record
                .headers
                .iter()
                .map(|h| 8 + h.name.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    };
    8 + 8
        + 1
        + 24
        + 4
        + record.causal.clock.encoded_len()
        + 8
        + record.key.as_ref().map_or(0, Vec::len)
        + record.value.as_ref().map_or(0, Vec::len)
        + headers
}

/// The most held records one page holds (see the [module docs](self)).
pub const PAGE_RECORDS: usize = 256;

/// The most bytes a page's value takes, unless it holds a single record.
pub const PAGE_BYTES: usize = 64 * 1024;

/// Builds one page's value (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct PageBuilder {
    bytes: Vec<u8>,
    count: usize,
}

impl Default for PageBuilder {
    fn default() -> Self {
        PageBuilder::new()
    }
}

impl PageBuilder {
    /// An empty page. It allocates nothing until its first record, which
    /// sizes the buffer exactly: most pages a commit writes while records
    /// trickle in hold one record, and growing a four-byte buffer to fit
    /// it cost a reallocation per page.
    pub fn new() -> Self {
        PageBuilder {
            bytes: Vec::new(),
            count: 0,
        }
    }

    /// Whether the page takes `record` as its next one: an empty page
    /// takes any record; otherwise the page must stay within
    /// [`PAGE_RECORDS`] and [`PAGE_BYTES`].
    pub fn fits(&self, record: &InboundRecord) -> bool {
        self.count == 0
            || (self.count < PAGE_RECORDS
                && self.bytes.len() + 4 + envelope_len(record) <= PAGE_BYTES)
    }

    /// Records in the page so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the page has no record yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends `record`'s envelope.
    pub fn push(&mut self, record: &InboundRecord) {
        if self.bytes.is_empty() {
            self.bytes.reserve_exact(4 + 4 + envelope_len(record));
            self.bytes.extend_from_slice(&[0; 4]);
        } else {
            self.bytes.reserve(4 + envelope_len(record));
        }
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        encode_envelope_into(record, &mut self.bytes);
        let len = (self.bytes.len() - at - 4) as i32;
        self.bytes[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.count += 1;
    }

    /// The page's value.
    pub fn finish(mut self) -> Vec<u8> {
        let count = self.count as i32;
        if self.bytes.is_empty() {
            self.bytes.extend_from_slice(&[0; 4]);
        }
        self.bytes[..4].copy_from_slice(&count.to_be_bytes());
        self.bytes
    }
}

/// The envelopes of one page, checked for shape when built: a count of at
/// least one, that many length-prefixed envelopes, nothing after them.
/// The envelopes themselves are decoded by whoever takes them.
#[derive(Clone, Debug)]
pub struct PageEntries<'a> {
    rest: Reader<'a>,
    left: usize,
}

impl<'a> PageEntries<'a> {
    /// Checks `bytes` as a page's value.
    pub fn new(bytes: &'a [u8]) -> Result<Self, String> {
        let mut r = Reader::new(bytes);
        let left = count(&mut r, 4, "page record")?;
        if left == 0 {
            return Err("a page without records".to_owned());
        }
        // Readers find the page that holds an index by looking at most
        // this far below it.
        if left > PAGE_RECORDS {
            return Err(format!("a page of {left} records (at most {PAGE_RECORDS})"));
        }
        let rest = r.clone();
        for at in 0..left {
            let len = need(r.i32())?;
            let len = usize::try_from(len)
                .map_err(|_| format!("page record {at} has negative length {len}"))?;
            r.take(len).ok_or_else(|| {
                format!(
                    "truncated page: record {at} claims {len} bytes, {} remain",
                    r.remaining()
                )
            })?;
        }
        finish(&r)?;
        Ok(PageEntries { rest, left })
    }

    /// Records in the page.
    pub fn count(bytes: &[u8]) -> Result<usize, String> {
        PageEntries::new(bytes).map(|p| p.left)
    }
}

impl<'a> Iterator for PageEntries<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let len = usize::try_from(self.rest.i32()?).ok()?;
        self.left -= 1;
        self.rest.take(len)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for PageEntries<'_> {}

/// Appends a held record's envelope to `out`.
pub fn encode_envelope_into(record: &InboundRecord, out: &mut Vec<u8>) {
    let clock_len = record.causal.clock.encoded_len();
    out.extend_from_slice(&record.offset.to_be_bytes());
    out.extend_from_slice(&record.timestamp.to_be_bytes());
    match record.causal.sender {
        Some(tag) => {
            out.push(1);
            out.extend_from_slice(&tag.sender.msb().to_be_bytes());
            out.extend_from_slice(&tag.sender.lsb().to_be_bytes());
            out.extend_from_slice(&tag.seq.to_be_bytes());
        }
        None => {
            out.push(0);
            out.extend_from_slice(&[0u8; 24]);
        }
    }
    out.extend_from_slice(&(clock_len as i32).to_be_bytes());
    record.causal.clock.encode_into(out);
    put_nullable(out, record.key.as_deref());
    put_nullable(out, record.value.as_deref());
    if !record.headers.is_empty() {
        out.push(ENVELOPE_HEADERS_EXTENSION);
        out.extend_from_slice(&(record.headers.len() as i32).to_be_bytes());
        for h in &record.headers {
            put_nullable(out, Some(h.name.as_bytes()));
            put_nullable(out, h.value.as_deref());
        }
    }
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            out.extend_from_slice(&(b.len() as i32).to_be_bytes());
            out.extend_from_slice(b);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
}

fn get_nullable(r: &mut Reader<'_>, what: &str) -> Result<Option<Vec<u8>>, String> {
    let len = need(r.i32())?;
    match len {
        -1 => Ok(None),
        n if n < 0 => Err(format!("invalid {what} length {n}")),
        n => r.take(n as usize).map(|b| Some(b.to_vec())).ok_or_else(|| {
            format!(
                "truncated {what}: {n} bytes claimed, {} remain",
                r.remaining()
            )
        }),
    }
}

/// Decodes a held record's envelope for `channel`.
pub fn decode_envelope(channel: Channel, bytes: &[u8]) -> Result<InboundRecord, String> {
    let mut r = Reader::new(bytes);
    let offset = need(r.i64())?;
    if offset < 0 {
        return Err(format!("negative offset {offset}"));
    }
    let timestamp = need(r.i64())?;
    let tagged = need(r.u8())?;
    let msb = need(r.i64())?;
    let lsb = need(r.i64())?;
    let seq = need(r.i64())?;
    let sender = match tagged {
        0 if msb == 0 && lsb == 0 && seq == 0 => None,
        0 => return Err("untagged record with non-zero sender fields".to_owned()),
        1 => {
            if seq < 0 {
                return Err(format!("negative sender sequence {seq}"));
            }
            Some(SenderTag {
                sender: SenderId::from_halves(msb, lsb),
                seq,
            })
        }
        t => return Err(format!("invalid sender tag flag {t}")),
    };
    let clock_len = need(r.i32())?;
    if clock_len < 0 {
        return Err(format!("negative clock length {clock_len}"));
    }
    let clock_bytes = r
        .take(clock_len as usize)
        .ok_or_else(|| format!("truncated clock: {clock_len} bytes claimed"))?;
    let clock = VectorClock::decode(clock_bytes).map_err(|e| e.to_string())?;
    let key = get_nullable(&mut r, "key")?;
    let value = get_nullable(&mut r, "value")?;
    let mut headers = Vec::new();
    if r.remaining() > 0 {
        let tag = need(r.u8())?;
        if tag != ENVELOPE_HEADERS_EXTENSION {
            return Err(format!("unknown envelope extension {tag}"));
        }
        let n = count(&mut r, 8, "header")?;
        headers.reserve(n);
        for _ in 0..n {
            let name = get_nullable(&mut r, "header name")?
                .ok_or_else(|| "null header name".to_owned())?;
            let name =
                String::from_utf8(name).map_err(|_| "header name is not UTF-8".to_owned())?;
            let value = get_nullable(&mut r, "header value")?;
            headers.push(Header {
                name: name.into(),
                value,
            });
        }
        finish(&r)?;
    }
    Ok(InboundRecord {
        channel,
        offset,
        timestamp,
        key,
        value,
        headers,
        causal: CausalHeaders { clock, sender },
    })
}

/// Checks a held record's envelope without decoding it: `Ok` with the
/// record's offset and [`InboundRecord::held_size`] exactly when
/// [`decode_envelope`] would succeed, and its error otherwise. An envelope
/// as this library writes it is checked in one pass that allocates
/// nothing (a restore keeps held records as their envelopes and decodes
/// each one only at its release); anything else goes through the decoder,
/// so the reason given for a fault is the decoder's.
pub fn check_envelope(bytes: &[u8]) -> Result<(i64, usize), String> {
    match well_formed_envelope(bytes) {
        Some(checked) => Ok(checked),
        None => decode_envelope(Channel::new(TopicId::from_u128(0), 0), bytes)
            .map(|r| (r.offset, r.held_size())),
    }
}

/// The offset and held size of a well-formed envelope whose clock is
/// canonical, or `None` for anything else (every envelope
/// [`decode_envelope`] refuses among it).
fn well_formed_envelope(bytes: &[u8]) -> Option<(i64, usize)> {
    fn nullable<'a>(r: &mut Reader<'a>) -> Option<Option<&'a [u8]>> {
        match r.i32()? {
            -1 => Some(None),
            n => r.take(usize::try_from(n).ok()?).map(Some),
        }
    }
    let len = |b: Option<&[u8]>| b.map_or(0, <[u8]>::len);
    let mut r = Reader::new(bytes);
    let offset = r.i64()?;
    r.i64()?;
    let (tagged, msb, lsb, seq) = (r.u8()?, r.i64()?, r.i64()?, r.i64()?);
    let sender_ok = match tagged {
        0 => msb == 0 && lsb == 0 && seq == 0,
        1 => seq >= 0,
        _ => false,
    };
    let clock_len = usize::try_from(r.i32()?).ok()?;
    if offset < 0 || !sender_ok {
        return None;
    }
    let (offsets, sequences) = VectorClock::claim_counts(r.take(clock_len)?).ok()?;
    let mut size = std::mem::size_of::<InboundRecord>()
        + offsets * std::mem::size_of::<OffsetClaim>()
        + sequences * std::mem::size_of::<SequenceClaim>()
        + len(nullable(&mut r)?)
        + len(nullable(&mut r)?);
    if r.remaining() > 0 {
        if r.u8()? != ENVELOPE_HEADERS_EXTENSION {
            return None;
        }
        let n = usize::try_from(r.i32()?).ok()?;
        if n.saturating_mul(8) > r.remaining() {
            return None;
        }
        for _ in 0..n {
            let name = std::str::from_utf8(nullable(&mut r)??).ok()?;
            // A decoded header owns its name, so its name counts.
            size += std::mem::size_of::<Header>() + name.len() + len(nullable(&mut r)?);
        }
        if r.remaining() > 0 {
            return None;
        }
    }
    Some((offset, size))
}

/// A value in a [`WriteBatch`]: the counters and marks most writes carry
/// (eight or sixteen bytes) are kept inline, so a batch of them allocates
/// nothing per value.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Value {
    Small { len: u8, bytes: [u8; 16] },
    Bytes(Vec<u8>),
}

impl Value {
    fn as_slice(&self) -> &[u8] {
        match self {
            Value::Small { len, bytes } => &bytes[..usize::from(*len)],
            Value::Bytes(v) => v,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            Value::Small { .. } => self.as_slice().to_vec(),
            Value::Bytes(v) => v,
        }
    }
}

/// The writes of one step: keys to put and keys to delete, in [`StateKey`]
/// order (by kind, then channel, then sender or index), one write per key.
///
/// Keys are kept as [`StateKey`] values and spelt out only by whoever
/// stores them ([`StateKey::text`] builds the text without allocating), and
/// the eight- and sixteen-byte values of frontiers, marks and queue
/// metadata are held inline: an in-order delivery's batch costs one
/// allocation, its vector's.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct WriteBatch {
    /// Sorted by key, one entry per key. A sorted vector rather than a map:
    /// batches are small, mostly written in key order, and taken whole.
    writes: Vec<(StateKey, Option<Value>)>,
}

impl fmt::Debug for WriteBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.writes.iter().map(|(k, v)| {
                (
                    k.text(),
                    v.as_ref().map(|v| format!("{} bytes", v.as_slice().len())),
                )
            }))
            .finish()
    }
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        WriteBatch::default()
    }

    /// Records a put of `value` under `key`.
    pub fn put(&mut self, key: StateKey, value: Vec<u8>) {
        self.insert(key, Some(Value::Bytes(value)));
    }

    /// Sets the write for `key`, replacing an earlier one.
    fn insert(&mut self, key: StateKey, value: Option<Value>) {
        if self.writes.last().is_none_or(|(last, _)| *last < key) {
            // Past every key so far, as most writes come.
            self.writes.push((key, value));
            return;
        }
        match self.writes.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => self.writes[i].1 = value,
            Err(i) => self.writes.insert(i, (key, value)),
        }
    }

    /// Records a put of one big-endian `i64` (see [`encode_i64`]), held
    /// inline.
    pub fn put_i64(&mut self, key: StateKey, v: i64) {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&v.to_be_bytes());
        self.insert(key, Some(Value::Small { len: 8, bytes }));
    }

    /// Records a put of two big-endian `i64`s (see [`encode_pair`]), held
    /// inline.
    pub fn put_pair(&mut self, key: StateKey, a: i64, b: i64) {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&a.to_be_bytes());
        bytes[8..].copy_from_slice(&b.to_be_bytes());
        self.insert(key, Some(Value::Small { len: 16, bytes }));
    }

    /// Records a delete of `key`.
    pub fn delete(&mut self, key: StateKey) {
        self.insert(key, None);
    }

    /// True when the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The number of keys written.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// The writes in key order: `Some(bytes)` is a put, `None` a delete.
    pub fn iter(&self) -> impl Iterator<Item = (StateKey, Option<&[u8]>)> {
        self.writes
            .iter()
            .map(|(k, v)| (*k, v.as_ref().map(Value::as_slice)))
    }

    /// The write for `key`, if the batch has one: `Some(None)` is a delete.
    pub fn get(&self, key: StateKey) -> Option<Option<&[u8]>> {
        self.writes
            .binary_search_by(|(k, _)| k.cmp(&key))
            .ok()
            .map(|i| self.writes[i].1.as_ref().map(Value::as_slice))
    }

    /// Folds a later batch into this one (later writes win).
    pub fn extend(&mut self, later: WriteBatch) {
        for (k, v) in later.writes {
            self.insert(k, v);
        }
    }
}

impl IntoIterator for WriteBatch {
    type Item = (StateKey, Option<Vec<u8>>);
    type IntoIter = WriteBatchIntoIter;

    fn into_iter(self) -> Self::IntoIter {
        WriteBatchIntoIter(self.writes.into_iter())
    }
}

/// The writes of a [`WriteBatch`] by value, in key order.
#[derive(Debug)]
pub struct WriteBatchIntoIter(std::vec::IntoIter<(StateKey, Option<Value>)>);

impl Iterator for WriteBatchIntoIter {
    type Item = (StateKey, Option<Vec<u8>>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (k, v.map(Value::into_vec)))
    }
}

/// What [`StoreRead::for_each_state`] calls with each entry.
pub type StateVisitor<'f> = dyn FnMut(Result<StateKey, &str>, &[u8]) + 'f;

/// Read access to a committed protocol store, for restore at init.
pub trait StoreRead {
    /// Calls `f` with every entry, in any order.
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, &[u8]));

    /// Calls `f` with every entry, in any order: `Ok` with the parsed key
    /// of a protocol key, `Err` with the text of any other key (which a
    /// node refuses to start from). The default parses what
    /// [`for_each_entry`](Self::for_each_entry) gives; a store that keeps
    /// keys parsed ([`MemStore`]) hands them over as they are.
    fn for_each_state(&self, f: &mut StateVisitor<'_>) {
        self.for_each_entry(&mut |key, value| f(parse_key(key.as_bytes()).ok_or(key), value));
    }
}

impl StoreRead for BTreeMap<String, Vec<u8>> {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (k, v) in self {
            f(k, v);
        }
    }
}

/// A simple in-memory protocol store that applies write batches. Hosts that
/// keep state in memory (the simulator, the test driver, a
/// changelog-backed runtime) can use it directly.
///
/// Protocol keys are kept parsed ([`StateKey`]): applying a batch and
/// restoring from the store never spell a key out or parse one back.
/// Anything else put in through the raw methods (a corrupt changelog, a
/// test) is kept under its text, so that a node refuses to start from it.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct MemStore {
    state: BTreeMap<StateKey, Vec<u8>>,
    other: BTreeMap<String, Vec<u8>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        MemStore::default()
    }

    /// Applies a batch: puts overwrite, deletes remove. Overwriting a key
    /// the store already holds reuses its entry (no allocation).
    pub fn apply(&mut self, batch: &WriteBatch) {
        for (k, v) in batch.iter() {
            match v {
                Some(v) => self.overwrite(k, v),
                None => {
                    self.state.remove(&k);
                }
            }
        }
    }

    /// Puts a copy of `value` under `key`, into the existing entry's buffer
    /// when there is one.
    fn overwrite(&mut self, key: StateKey, value: &[u8]) {
        match self.state.get_mut(&key) {
            Some(slot) => {
                slot.clear();
                slot.extend_from_slice(value);
            }
            None => {
                self.state.insert(key, value.to_vec());
            }
        }
    }

    /// [`apply`](Self::apply), moving the batch's values into the store
    /// instead of copying them (a held record's envelope is stored as the
    /// node encoded it).
    pub fn apply_owned(&mut self, batch: WriteBatch) {
        for (k, v) in batch.writes {
            match v {
                Some(Value::Bytes(v)) => {
                    self.state.insert(k, v);
                }
                Some(small) => self.overwrite(k, small.as_slice()),
                None => {
                    self.state.remove(&k);
                }
            }
        }
    }

    /// The value under the key spelt `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        match parse_key(key.as_bytes()) {
            Some(k) => self.get_state(k),
            None => self.other.get(key).map(Vec::as_slice),
        }
    }

    /// The value under a protocol key.
    pub fn get_state(&self, key: StateKey) -> Option<&[u8]> {
        self.state.get(&key).map(Vec::as_slice)
    }

    /// Removes the entry under a protocol key, returning its value (a host
    /// that keeps some entries elsewhere lets them leave memory).
    pub fn remove_state(&mut self, key: StateKey) -> Option<Vec<u8>> {
        self.state.remove(&key)
    }

    /// Every entry, in the order of the keys' text.
    pub fn iter(&self) -> impl Iterator<Item = (String, &[u8])> {
        let mut all: Vec<(String, &[u8])> = self
            .state
            .iter()
            .map(|(k, v)| (k.to_key(), v.as_slice()))
            .chain(self.other.iter().map(|(k, v)| (k.clone(), v.as_slice())))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all.into_iter()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.state.len() + self.other.len()
    }

    /// True when the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty() && self.other.is_empty()
    }

    /// Total bytes of keys (as text) and values held.
    pub fn size_bytes(&self) -> usize {
        self.state
            .iter()
            .map(|(k, v)| k.text().len() + v.len())
            .chain(self.other.iter().map(|(k, v)| k.len() + v.len()))
            .sum()
    }

    /// Puts `value` under the key spelt `key`, whatever it says: a
    /// protocol key joins the parsed entries, anything else is kept as text
    /// (a node refuses to start from it). For hosts restoring a store from
    /// its changelog, and for tests that corrupt state on purpose. Returns
    /// the value it replaced.
    pub fn insert_raw(&mut self, key: &str, value: Vec<u8>) -> Option<Vec<u8>> {
        match parse_key(key.as_bytes()) {
            Some(k) => self.state.insert(k, value),
            None => self.other.insert(key.to_owned(), value),
        }
    }

    /// Removes the entry under the key spelt `key`, returning its value.
    pub fn remove_raw(&mut self, key: &str) -> Option<Vec<u8>> {
        match parse_key(key.as_bytes()) {
            Some(k) => self.state.remove(&k),
            None => self.other.remove(key),
        }
    }

    /// The value under the key spelt `key`, for tests that corrupt state on
    /// purpose.
    pub fn get_raw_mut(&mut self, key: &str) -> Option<&mut Vec<u8>> {
        match parse_key(key.as_bytes()) {
            Some(k) => self.state.get_mut(&k),
            None => self.other.get_mut(key),
        }
    }
}

impl StoreRead for MemStore {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (k, v) in &self.state {
            f(k.text().as_str(), v);
        }
        self.other.for_each_entry(f)
    }

    fn for_each_state(&self, f: &mut StateVisitor<'_>) {
        for (k, v) in &self.state {
            f(Ok(*k), v);
        }
        for (k, v) in &self.other {
            f(Err(k), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocation-free path is the one this library's own envelopes
    /// take (the decoder gives the same answer, so only this can tell).
    #[test]
    fn own_envelopes_are_checked_without_the_decoder() {
        let mut clock = VectorClock::new();
        clock.claim_offset(Channel::new(TopicId::from_u128(2), 0), 3);
        clock.claim_sequence(
            Channel::new(TopicId::from_u128(2), 1),
            SenderId::from_u128(5),
            8,
        );
        let mut record = InboundRecord {
            channel: Channel::new(TopicId::from_u128(1), 0),
            offset: 7,
            timestamp: 11,
            key: Some(b"k".to_vec()),
            value: None,
            headers: vec![Header {
                name: "trace".into(),
                value: Some(b"t".to_vec()),
            }],
            causal: CausalHeaders {
                clock,
                sender: Some(SenderTag {
                    sender: SenderId::from_u128(0xAB),
                    seq: 4,
                }),
            },
        };
        let bytes = encode_envelope(&record);
        let decoded = decode_envelope(record.channel, &bytes).unwrap();
        assert_eq!(well_formed_envelope(&bytes), Some((7, decoded.held_size())));
        record.headers.clear();
        record.causal.sender = None;
        assert_eq!(
            well_formed_envelope(&encode_envelope(&record)).map(|(o, _)| o),
            Some(7)
        );
    }
}
