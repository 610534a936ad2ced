//! The fold-state store: per-key state of a stateful stage, in bytes.
//!
//! One store per stage task, named `<stage>-fold` (backed by the changelog
//! `<applicationId>-<stage>-fold-changelog` in the Kafka runtime). Keys are
//! the message key's encoded bytes behind a one-byte presence prefix, so a
//! null key has its own slot and never collides with an empty key; the tick
//! state has a reserved key of its own. Values are the state codec's bytes,
//! unframed.
//!
//! | key | slot |
//! |-----|------|
//! | `0x00` | the null key |
//! | `0x01` followed by the key bytes | a key |
//! | `0x02` | the tick state |

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

use crate::codec::{Codec, CodecError};

/// A slot of the fold-state store.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum FoldKey {
    /// The null key's state.
    Null,
    /// The state of a key, by its encoded bytes.
    Key(Vec<u8>),
    /// The reserved tick-state slot.
    Ticks,
}

impl FoldKey {
    /// The slot of a record key (`None` is a null key).
    pub fn for_key(key: Option<&[u8]>) -> Self {
        match key {
            None => FoldKey::Null,
            Some(k) => FoldKey::Key(k.to_vec()),
        }
    }

    /// The store key bytes.
    ///
    /// ```
    /// use parsley::FoldKey;
    /// assert_eq!(FoldKey::Null.to_bytes(), vec![0x00]);
    /// assert_eq!(FoldKey::Key(b"k".to_vec()).to_bytes(), vec![0x01, b'k']);
    /// assert_eq!(FoldKey::Key(vec![]).to_bytes(), vec![0x01]);
    /// assert_eq!(FoldKey::Ticks.to_bytes(), vec![0x02]);
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            FoldKey::Null => vec![0x00],
            FoldKey::Key(k) => {
                let mut out = Vec::with_capacity(k.len() + 1);
                out.push(0x01);
                out.extend_from_slice(k);
                out
            }
            FoldKey::Ticks => vec![0x02],
        }
    }

    /// Parses store key bytes; `None` for bytes no slot produces.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0x00] => Some(FoldKey::Null),
            [0x01, rest @ ..] => Some(FoldKey::Key(rest.to_vec())),
            [0x02] => Some(FoldKey::Ticks),
            _ => None,
        }
    }
}

/// Changes to a fold store: puts and deletes by store key, in key order.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct FoldWrites {
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl fmt::Debug for FoldWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.writes
                    .iter()
                    .map(|(k, v)| (k, v.as_ref().map(|v| format!("{} bytes", v.len())))),
            )
            .finish()
    }
}

impl FoldWrites {
    /// No writes.
    pub fn new() -> Self {
        FoldWrites::default()
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The change to one store key: `None` if unchanged, `Some(None)` for a
    /// delete, `Some(Some(bytes))` for a put.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.writes.get(key).map(Option::as_deref)
    }

    /// How many keys changed.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// The changes in key order: `Some` is a put, `None` a delete.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
    }
}

/// A committed fold store in memory. Hosts commit [`FoldWrites`] into it
/// and start tasks from it.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct FoldStore {
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl FoldStore {
    /// An empty store.
    pub fn new() -> Self {
        FoldStore::default()
    }

    /// Applies committed writes.
    pub fn apply(&mut self, writes: &FoldWrites) {
        for (k, v) in writes.iter() {
            match v {
                Some(v) => {
                    self.entries.insert(k.to_vec(), v.to_vec());
                }
                None => {
                    self.entries.remove(k);
                }
            }
        }
    }

    /// The state bytes in `slot`.
    pub fn get(&self, slot: &FoldKey) -> Option<&[u8]> {
        self.entries.get(&slot.to_bytes()).map(Vec::as_slice)
    }

    /// Every entry, in store-key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
    }

    /// The number of slots holding state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no slot holds state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The state bytes under a raw store key.
    pub fn get_bytes(&self, key: &[u8]) -> Option<&[u8]> {
        self.entries.get(key).map(Vec::as_slice)
    }

    /// Puts raw bytes under a raw store key (changelog restore).
    pub(crate) fn put_bytes(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.entries.insert(key, value);
    }

    /// Removes a raw store key (a changelog tombstone).
    pub(crate) fn remove_bytes(&mut self, key: &[u8]) {
        self.entries.remove(key);
    }
}

/// The raw fold state a task shows its tick logic: committed state with
/// this task's uncommitted writes on top.
pub(crate) trait StateSource {
    /// The state bytes under a store key.
    fn get(&self, key: &[u8]) -> Option<&[u8]>;
    /// Every keyed slot (the null key's and each key's, not the tick
    /// slot), in store-key order.
    fn entries(&self) -> Vec<(&[u8], &[u8])>;
}

/// A read view of a stateful stage's per-key fold state, as tick logic
/// declared with
/// [`tick_fold_over`](crate::StageBuilder::tick_fold_over) sees it: the
/// task's state including what earlier records of the same transaction
/// wrote. Iteration follows the encoded key bytes (the null key first), so a
/// run is deterministic; that order is not `K`'s own `Ord` in general.
///
/// A key or state that does not decode fails the task once the tick logic
/// returns (as a state codec error), and iteration stops at it.
pub struct StateView<'a, K, S> {
    source: &'a dyn StateSource,
    key: &'a Codec<K>,
    state: &'a Codec<S>,
    error: &'a RefCell<Option<CodecError>>,
}

impl<K, S> fmt::Debug for StateView<'_, K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateView")
            .field("slots", &self.source.entries().len())
            .finish()
    }
}

impl<'a, K: 'static, S: 'static> StateView<'a, K, S> {
    pub(crate) fn new(
        source: &'a dyn StateSource,
        key: &'a Codec<K>,
        state: &'a Codec<S>,
        error: &'a RefCell<Option<CodecError>>,
    ) -> Self {
        StateView {
            source,
            key,
            state,
            error,
        }
    }

    fn fail(&self, e: CodecError) {
        let mut slot = self.error.borrow_mut();
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn decode_state(&self, bytes: &[u8]) -> Option<S> {
        match self.state.decode(bytes) {
            Ok(s) => Some(s),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// The state of `key`, if it has any.
    pub fn get(&self, key: &K) -> Option<S> {
        let bytes = match self.key.encode(key) {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        let slot = FoldKey::Key(bytes).to_bytes();
        self.source.get(&slot).and_then(|b| self.decode_state(b))
    }

    /// The null key's state, if it has any.
    pub fn get_null(&self) -> Option<S> {
        self.source
            .get(&FoldKey::Null.to_bytes())
            .and_then(|b| self.decode_state(b))
    }

    /// Every key with state and its state (`None` for the null key), in
    /// encoded-key order.
    pub fn iter(&self) -> impl Iterator<Item = (Option<K>, S)> + '_ {
        self.source.entries().into_iter().map_while(move |(k, v)| {
            if self.error.borrow().is_some() {
                return None;
            }
            let key = match FoldKey::from_bytes(k) {
                Some(FoldKey::Key(bytes)) => match self.key.decode(&bytes) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        self.fail(e);
                        return None;
                    }
                },
                _ => None,
            };
            self.decode_state(v).map(|s| (key, s))
        })
    }

    /// How many keys (the null key included) hold state.
    pub fn len(&self) -> usize {
        self.source.entries().len()
    }

    /// True when no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_never_collide() {
        for k in [
            FoldKey::Null,
            FoldKey::Key(vec![]),
            FoldKey::Key(vec![0]),
            FoldKey::Key(b"abc".to_vec()),
            FoldKey::Ticks,
        ] {
            assert_eq!(FoldKey::from_bytes(&k.to_bytes()), Some(k));
        }
        assert_ne!(FoldKey::Null.to_bytes(), FoldKey::Key(vec![]).to_bytes());
        assert_eq!(FoldKey::from_bytes(&[]), None);
        assert_eq!(FoldKey::from_bytes(&[0x03]), None);
        assert_eq!(FoldKey::from_bytes(&[0x00, 1]), None);
    }

    #[test]
    fn store_applies_puts_and_deletes() {
        let mut s = FoldStore::new();
        let mut w = FoldWrites::new();
        w.put(FoldKey::Null.to_bytes(), vec![1]);
        w.put(FoldKey::Ticks.to_bytes(), vec![2]);
        s.apply(&w);
        assert_eq!(s.get(&FoldKey::Null), Some(&[1u8][..]));
        let mut w = FoldWrites::new();
        w.delete(FoldKey::Null.to_bytes());
        s.apply(&w);
        assert_eq!(s.get(&FoldKey::Null), None);
        assert_eq!(s.len(), 1);
    }
}
