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

mod envelope;
mod keys;

pub use envelope::*;
pub use keys::*;

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

/// The scope a node's state was written under: its declared inputs and sinks.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ScopeRecord {
    /// Consumed channels, sorted.
    pub inputs: Vec<Channel>,
    /// Sink topics, sorted.
    pub sinks: Vec<TopicId>,
}

impl ScopeRecord {
    /// The recorded inputs as text, comma-separated (for errors that name
    /// them).
    pub fn inputs_text(&self) -> String {
        self.inputs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

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
