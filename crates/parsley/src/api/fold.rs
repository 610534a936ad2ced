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

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::codec::{Codec, CodecError};
use crate::key_filter::KeyFilter;
use crate::runtime::local::{LocalReader, LocalStoreError};
use parsley_protocol::host::RecordBytes;

mod key;
mod view;

pub use key::FoldKey;
pub(crate) use view::StateSource;
pub use view::StateView;

/// One key and its value as the fold store hands them out: borrowed where
/// resident, owned where read back from disk.
pub type FoldEntry<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// The hasher of the fold state's in-memory indexes: fast, with a fixed
/// seed. Nothing iterates a hash index in its own order where the order
/// could reach an output: [`FoldWrites`] iterates in insertion order, and
/// [`FoldStore::iter`] sorts.
type Fixed = foldhash::fast::FixedState;

/// The fold state's hash maps (hashbrown's, which std's wraps: it can
/// rewrite an entry and clone its shared key in one lookup).
type HashMap<K, V> = hashbrown::HashMap<K, V, Fixed>;

/// Changes to a fold store: puts and deletes by store key, one per key
/// (a key written twice keeps its last write, in its first write's place),
/// in the order the keys were first written.
///
/// That order is the records' order, so it is the same on every run of
/// the same input; the changelog records of a transaction come out in it.
/// Only the last write of each key is kept because nothing can observe the
/// ones before: the changelog and the local store are written once per
/// transaction, and a restore reads them only at transaction boundaries.
///
/// Each key is one shared allocation, and each value one (none when it is
/// short) once the commit takes the writes: the changelog record, the
/// committed store and the local store's entry all hold the same bytes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct FoldWrites {
    writes: indexmap::IndexMap<Arc<[u8]>, Option<RecordBytes>, Fixed>,
}

impl fmt::Debug for FoldWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.writes
                    .iter()
                    .map(|(k, v)| (&**k, v.as_ref().map(|v| format!("{} bytes", v.len())))),
            )
            .finish()
    }
}

impl FoldWrites {
    /// No writes.
    pub fn new() -> Self {
        FoldWrites::default()
    }

    /// Puts `value` under `key`, copying the key only when it is new to
    /// this batch.
    pub(crate) fn put(&mut self, key: &[u8], value: impl Into<RecordBytes>) {
        self.set(key, Some(value.into()));
    }

    /// Deletes `key`, copying the key only when it is new to this batch.
    pub(crate) fn delete(&mut self, key: &[u8]) {
        self.set(key, None);
    }

    fn set(&mut self, key: &[u8], value: Option<RecordBytes>) {
        match self.writes.get_mut(key) {
            Some(slot) => *slot = value,
            None => {
                self.writes.insert(Arc::from(key), value);
            }
        }
    }

    /// Moves every value into its shared form (once per key, for a value
    /// its codec did not write shared already), so that what reads the
    /// writes next (the changelog, the committed store, the local store)
    /// holds the bytes without a copy.
    pub(crate) fn share(&mut self) {
        for value in self.writes.values_mut().flatten() {
            value.make_shared();
        }
    }

    /// The changes as [`iter`](Self::iter) gives them, each key and value
    /// as shared bytes (a clone of the shared form: no copy once the
    /// writes were [shared](Self::share)).
    pub(crate) fn iter_shared(
        &self,
    ) -> impl Iterator<Item = (RecordBytes, Option<RecordBytes>)> + '_ {
        self.writes
            .iter()
            .map(|(k, v)| (RecordBytes::from(Arc::clone(k)), v.clone()))
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

    /// The changes, one per key, in the order the keys were first written:
    /// `Some` is a put, `None` a delete.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes.iter().map(|(k, v)| (&**k, v.as_deref()))
    }

    /// The changes in [`iter`](Self::iter)'s order, by value (for a host's
    /// local store, once the committed store has read them).
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (RecordBytes, Option<RecordBytes>)> {
        self.writes
            .into_iter()
            .map(|(k, v)| (RecordBytes::from(k), v))
    }
}

/// A task's committed fold store.
///
/// By default every entry is kept in memory. A task whose host keeps a
/// local store that can be read while the task runs can
/// [`attach`](Self::attach) it with a budget in bytes: the store then keeps
/// at most about that much in memory and reads the rest from the local
/// store. An entry leaves memory only once the local store reports holding
/// its latest write (writes reach the local store after their commit, and
/// may lag behind it), so a read from the local store never sees an older
/// value than the one committed. Entries leave oldest write first.
///
/// A bounded store also keeps a filter of the keys its local store may
/// hold: a read of a key that is neither in memory nor possibly on disk (a
/// new key, the common case when each record creates an entity) is
/// answered without reading the local store.
#[derive(Clone, Default)]
pub struct FoldStore {
    /// Keys are shared with the eviction order (one allocation each).
    entries: HashMap<Arc<[u8]>, Resident>,
    cold: Option<Box<Cold>>,
}

/// An entry kept in memory: its bytes (shared with the write that put
/// them, its changelog record and its local store entry), the fold
/// sequence number of the commit that wrote it, and its place in the
/// eviction order.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Resident {
    value: RecordBytes,
    seq: u64,
    stamp: u64,
}

/// A write's value as the committed store keeps it: its shared bytes, or
/// a copy where the write was not shared (a store applied outside a
/// commit, in a test).
fn shared(v: &RecordBytes) -> RecordBytes {
    if v.is_shared() {
        v.clone()
    } else {
        RecordBytes::copy_from_slice(v)
    }
}

/// What an entry is taken to cost in memory beyond its key and value: its
/// slots in the two maps (with the maps' spare room), the key's and the
/// value's allocations with the allocator's rounding, and the memory that
/// entries leaving and arriving scatter. Measured, not derived: a bounded
/// store of 1M short keys (`probe_resident_cost` below, run by hand) holds
/// its resident set to about its budget with this figure.
const ENTRY_OVERHEAD: usize = 208;

pub(crate) fn cost(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

/// The local store behind a bounded fold store.
#[derive(Clone)]
struct Cold {
    reader: Arc<dyn LocalReader>,
    budget: usize,
    /// What the entries in memory cost, by [`cost`].
    bytes: usize,
    /// The commits applied to this store so far.
    seq: u64,
    next_stamp: u64,
    /// Entries in memory by stamp, oldest write first. An entry rewritten
    /// since is listed again at the newest end; its older listing is
    /// stale (the stamp no longer matches the entry's) and skipped.
    order: VecDeque<(u64, Arc<[u8]>)>,
    /// Deletes the local store may not hold yet, with their commit's
    /// sequence number: the key reads as absent until it does.
    tombstones: HashMap<Vec<u8>, u64>,
    /// The keys the local store may hold: every key put since the store
    /// was attached, and the keys the walk has found so far; `None` when
    /// the walk failed (every miss then reads the store).
    filter: Option<KeyFilter>,
    /// How far the walk of the local store's keys has come.
    walk: Walk,
    /// Keys the walk takes per step (one step at attach, one per commit).
    walk_step: usize,
    /// The first read from the local store that failed, for the task to
    /// fail on.
    failure: Arc<Mutex<Option<LocalStoreError>>>,
    counts: Arc<ColdCounts>,
}

/// How a bounded fold store has been used.
#[derive(Default, Debug)]
struct ColdCounts {
    reads: AtomicU64,
    filtered: AtomicU64,
    evicted: AtomicU64,
    withheld: AtomicU64,
}

/// The walk of the local store's keys into the key filter, which a
/// bounded store makes in steps (one when it is attached, one after each
/// commit) so that a task with millions of keys on disk starts at once.
/// Until the walk is done, the filter speaks only for the keys up to where
/// it has come: a key beyond that is read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Walk {
    /// Every key up to and including this one is in the filter (`None`:
    /// the walk has not taken a step yet).
    Until(Option<Vec<u8>>),
    /// Every key the store held when it was attached is in the filter.
    Done,
}

/// A bounded store's key filter has room for at least a key per this many
/// bytes of its cache budget before it grows (twice what the budget holds
/// of short entries): the filter then costs about 3% of the budget on top
/// of it (64 MiB of cache, about 2 MiB of filter).
const FILTER_BUDGET_BYTES_PER_KEY: usize = 100;

/// Keys a bounded store's key walk takes per step: a few milliseconds of a
/// commit's time on a large state.
const WALK_STEP: usize = 64 * 1024;

/// A bounded fold store's figures (see [`FoldStore::cache_stats`]).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct FoldCacheStats {
    /// Entries in memory.
    pub resident: usize,
    /// What they cost in memory, in bytes (an estimate).
    pub resident_bytes: usize,
    /// The budget, in bytes.
    pub budget: usize,
    /// Reads answered by the local store.
    pub disk_reads: u64,
    /// Reads of keys in neither memory nor the local store that the key
    /// filter answered without reading the local store.
    pub filtered_reads: u64,
    /// The key filter's size in bytes (0 when the store has none).
    pub filter_bytes: usize,
    /// The stages the key filter has grown to (0 when there is none).
    pub filter_stages: usize,
    /// Entries that left memory.
    pub evicted: u64,
    /// Times an entry over the budget stayed because the local store did
    /// not hold its latest write yet.
    pub withheld: u64,
}

impl fmt::Debug for FoldStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FoldStore")
            .field("resident", &self.entries.len())
            .field("bounded", &self.cold.is_some())
            .finish()
    }
}

impl FoldStore {
    /// An empty store.
    pub fn new() -> Self {
        FoldStore::default()
    }

    /// Reads what is not in memory from `reader`, keeping at most about
    /// `budget` bytes of entries in memory. Every entry in memory now must
    /// already be in the reader's store (a store attached right after the
    /// host wrote it whole, or after the reader waited for that write).
    /// Evicts down to the budget at once, and starts walking the store's
    /// keys into the key filter (the rest of the walk comes in steps, one
    /// per commit).
    pub fn attach(&mut self, reader: Arc<dyn LocalReader>, budget: usize) {
        self.attach_walking(reader, budget, WALK_STEP);
    }

    /// [`attach`](Self::attach), walking `walk_step` keys per step.
    fn attach_walking(&mut self, reader: Arc<dyn LocalReader>, budget: usize, walk_step: usize) {
        // The entries in memory enter the eviction order by key, so that
        // it is the same on every run.
        let mut resident: Vec<Arc<[u8]>> = self.entries.keys().cloned().collect();
        resident.sort_unstable();
        let mut order = VecDeque::with_capacity(resident.len());
        let mut bytes = 0;
        for (stamp, key) in resident.into_iter().enumerate() {
            let stamp = stamp as u64;
            if let Some(r) = self.entries.get_mut(&key) {
                r.seq = 0;
                r.stamp = stamp;
                bytes += cost(&key, &r.value);
            }
            order.push_back((stamp, key));
        }
        // The filter is sized for the keys the store says it holds (it
        // grows past that if the hint was short or missing).
        // A store that starts empty and grows through its cache is sized
        // for about what its budget holds (a key per
        // [`FILTER_BUDGET_BYTES_PER_KEY`] bytes), so that a state of many
        // times the cache still needs only a few stages.
        let on_disk = reader
            .fold_len_hint()
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let mut filter = KeyFilter::with_room_for(
            on_disk
                .saturating_add(self.entries.len())
                .max(budget / FILTER_BUDGET_BYTES_PER_KEY),
        );
        for k in self.entries.keys() {
            filter.insert(k);
        }
        self.cold = Some(Box::new(Cold {
            reader,
            budget,
            bytes,
            seq: 0,
            next_stamp: order.len() as u64,
            order,
            tombstones: HashMap::default(),
            filter: Some(filter),
            walk: Walk::Until(None),
            walk_step: walk_step.max(1),
            failure: Arc::default(),
            counts: Arc::default(),
        }));
        self.walk_keys();
        self.evict();
    }

    /// Takes one step of the walk of the local store's keys into the key
    /// filter. A key put or deleted while the walk goes on is accounted
    /// for either way: a put goes into the filter as it is applied, and a
    /// delete only leaves a key in the filter that is no longer on disk.
    /// A walk that fails is the task's failure, and the filter is dropped.
    fn walk_keys(&mut self) {
        let Some(cold) = self.cold.as_mut() else {
            return;
        };
        let Walk::Until(after) = &cold.walk else {
            return;
        };
        let Some(filter) = cold.filter.as_mut() else {
            return;
        };
        match cold
            .reader
            .fold_keys_after(after.as_deref(), cold.walk_step, &mut |k| filter.insert(k))
        {
            Ok(Some(last)) => cold.walk = Walk::Until(Some(last)),
            Ok(None) => cold.walk = Walk::Done,
            Err(e) => {
                cold.filter = None;
                cold.walk = Walk::Done;
                cold.fail(e);
            }
        }
    }

    /// Sets the budget of a bounded store (its share of a worker's cache,
    /// as tasks come and go) and evicts down to it what the local store
    /// holds by now.
    pub fn set_budget(&mut self, budget: usize) {
        let Some(cold) = self.cold.as_mut() else {
            return;
        };
        cold.budget = budget;
        if cold.bytes > cold.budget || !cold.tombstones.is_empty() {
            self.evict();
        }
    }

    /// Whether this store reads through a local store.
    pub fn is_bounded(&self) -> bool {
        self.cold.is_some()
    }

    /// The number of commits applied since [`attach`](Self::attach): the
    /// sequence number a host puts on the local store write of the commit
    /// applied last ([`LocalWrite::seq`](crate::runtime::local::LocalWrite::seq)).
    pub fn seq(&self) -> u64 {
        self.cold.as_ref().map_or(0, |c| c.seq)
    }

    /// The figures of a bounded store (`None` when every entry is in
    /// memory).
    pub fn cache_stats(&self) -> Option<FoldCacheStats> {
        self.cold.as_ref().map(|c| FoldCacheStats {
            resident: self.entries.len(),
            resident_bytes: c.bytes,
            budget: c.budget,
            disk_reads: c.counts.reads.load(Ordering::Relaxed),
            filtered_reads: c.counts.filtered.load(Ordering::Relaxed),
            filter_bytes: c.filter.as_ref().map_or(0, KeyFilter::bytes),
            filter_stages: c.filter.as_ref().map_or(0, KeyFilter::stages),
            evicted: c.counts.evicted.load(Ordering::Relaxed),
            withheld: c.counts.withheld.load(Ordering::Relaxed),
        })
    }

    /// The first read from the local store that failed since the last
    /// call, if any: the task must not go on with what it computed.
    pub fn take_failure(&self) -> Option<LocalStoreError> {
        self.cold
            .as_ref()
            .and_then(|c| c.failure.lock().unwrap_or_else(|p| p.into_inner()).take())
    }

    /// Applies committed writes (one commit).
    pub fn apply(&mut self, writes: &FoldWrites) {
        let Some(cold) = self.cold.as_mut() else {
            for (k, v) in &writes.writes {
                if let (Some(v), Some(old)) = (v, self.entries.get_mut(&**k)) {
                    old.value = shared(v);
                    continue;
                }
                match v {
                    Some(v) => {
                        self.entries.insert(
                            Arc::clone(k),
                            Resident {
                                value: shared(v),
                                seq: 0,
                                stamp: 0,
                            },
                        );
                    }
                    None => {
                        self.entries.remove(&**k);
                    }
                }
            }
            return;
        };
        cold.seq += 1;
        let seq = cold.seq;
        for (shared_key, v) in &writes.writes {
            let k: &[u8] = shared_key;
            let Some(v) = v else {
                // A delete: the entry's listing in the order goes stale, and
                // the key reads as absent until the local store holds the
                // delete.
                if let Some(old) = self.entries.remove(k) {
                    cold.bytes = cold.bytes.saturating_sub(cost(k, &old.value));
                }
                if cold.tombstones.insert(k.to_vec(), seq).is_none() {
                    cold.bytes += cost(k, &[]);
                }
                continue;
            };
            // A put over an entry in memory rewrites it where it is: its key
            // stays shared with the eviction order, and its value becomes
            // the write's bytes (shared, not copied).
            // It moves to the newest end of the eviction order (its older
            // listing goes stale).
            if let Some((key, old)) = self.entries.get_key_value_mut(k) {
                cold.bytes = cold.bytes.saturating_sub(cost(k, &old.value)) + cost(k, v);
                old.value = shared(v);
                old.seq = seq;
                old.stamp = cold.next_stamp;
                cold.order.push_back((cold.next_stamp, key.clone()));
                cold.next_stamp += 1;
                continue;
            }
            if !cold.tombstones.is_empty() && cold.tombstones.remove(k).is_some() {
                cold.bytes = cold.bytes.saturating_sub(cost(k, &[]));
            }
            // The local store will hold this key once the write lands: the
            // filter learns it now, before the entry can leave memory.
            if let Some(f) = cold.filter.as_mut() {
                f.insert(k);
            }
            let stamp = cold.next_stamp;
            cold.next_stamp += 1;
            cold.bytes += cost(k, v);
            let key = Arc::clone(shared_key);
            cold.order.push_back((stamp, key.clone()));
            self.entries.insert(
                key,
                Resident {
                    value: shared(v),
                    seq,
                    stamp,
                },
            );
        }
        self.compact_order();
        self.walk_keys();
        self.evict();
    }

    /// Drops the stale listings of the eviction order once they outnumber
    /// the live ones (a few hot keys rewritten on every commit would
    /// otherwise grow it without bound).
    fn compact_order(&mut self) {
        let Some(cold) = self.cold.as_mut() else {
            return;
        };
        if cold.order.len() <= 2 * self.entries.len() + 1024 {
            return;
        }
        let entries = &self.entries;
        cold.order
            .retain(|(stamp, key)| entries.get(key).is_some_and(|r| r.stamp == *stamp));
    }

    /// Lets entries the local store holds leave memory while the store is
    /// over its budget, oldest write first, and forgets deletes the local
    /// store holds.
    pub fn evict(&mut self) {
        let Some(cold) = self.cold.as_mut() else {
            return;
        };
        let applied = cold.reader.applied();
        // Deletes the local store holds are forgotten (they count as an
        // entry each while kept).
        let mut freed = 0;
        cold.tombstones.retain(|k, seq| {
            let keep = *seq > applied;
            if !keep {
                freed += cost(k, &[]);
            }
            keep
        });
        cold.bytes = cold.bytes.saturating_sub(freed);
        while cold.bytes > cold.budget {
            let Some((stamp, key)) = cold.order.front() else {
                break;
            };
            match self.entries.entry_ref(&**key) {
                hashbrown::hash_map::EntryRef::Occupied(e) if e.get().stamp == *stamp => {
                    if e.get().seq > applied {
                        cold.counts.withheld.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    let (key, r) = e.remove_entry();
                    cold.bytes = cold.bytes.saturating_sub(cost(&key, &r.value));
                    cold.counts.evicted.fetch_add(1, Ordering::Relaxed);
                }
                // A stale listing: the entry was rewritten or deleted since.
                _ => {}
            }
            cold.order.pop_front();
        }
    }

    /// The state bytes in `slot`.
    pub fn get(&self, slot: &FoldKey) -> Option<Cow<'_, [u8]>> {
        self.get_bytes(&slot.to_bytes())
    }

    /// The entries in memory, in store-key order: every entry, unless the
    /// store is [bounded](Self::is_bounded) (then see [`all`](Self::all)).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut sorted: Vec<(&[u8], &[u8])> = self
            .entries
            .iter()
            .map(|(k, v)| (&**k, &*v.value))
            .collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        sorted.into_iter()
    }

    /// Every entry, in store-key order, those in memory over those the
    /// local store holds. A failed read of the local store is recorded
    /// (see [`take_failure`](Self::take_failure)) and yields what is in
    /// memory.
    pub fn all(&self) -> Vec<FoldEntry<'_>> {
        let Some(cold) = self.cold.as_ref() else {
            return self
                .iter()
                .map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)))
                .collect();
        };
        let stored = match cold.reader.fold_scan() {
            Ok(s) => s,
            Err(e) => {
                cold.fail(e);
                Vec::new()
            }
        };
        let mut merged: BTreeMap<Cow<'_, [u8]>, Cow<'_, [u8]>> = stored
            .into_iter()
            .filter(|(k, _)| !cold.tombstones.contains_key(k))
            .map(|(k, v)| (Cow::Owned(k), Cow::Owned(v)))
            .collect();
        for (k, v) in self.iter() {
            merged.insert(Cow::Borrowed(k), Cow::Borrowed(v));
        }
        merged.into_iter().collect()
    }

    /// The number of entries in memory (every entry, unless bounded).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Hands `f` every key with state, in memory or in the local store,
    /// without reading any state (keys on disk come in key order first,
    /// then the keys in memory, in key order). A failed read of the local
    /// store is recorded, as for [`all`](Self::all).
    pub fn for_each_key(&self, f: &mut dyn FnMut(&[u8])) {
        if let Some(cold) = self.cold.as_ref() {
            let r = cold.reader.fold_keys(&mut |k| {
                if !self.entries.contains_key(k) && !cold.tombstones.contains_key(k) {
                    f(k);
                }
            });
            if let Err(e) = r {
                cold.fail(e);
            }
        }
        for (k, _) in self.iter() {
            f(k);
        }
    }

    /// True when no entry is in memory and none is stored elsewhere.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.cold.is_none()
    }

    /// The state bytes under a raw store key: from memory, else from the
    /// local store. A failed read of the local store is recorded (see
    /// [`take_failure`](Self::take_failure)) and reads as absent.
    pub fn get_bytes(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        if let Some(r) = self.entries.get(key) {
            return Some(Cow::Borrowed(&r.value));
        }
        let cold = self.cold.as_ref()?;
        if cold.tombstones.contains_key(key) {
            return None;
        }
        if cold.filtered_out(key) {
            cold.counts.filtered.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        cold.counts.reads.fetch_add(1, Ordering::Relaxed);
        match cold.reader.fold_get(key) {
            Ok(v) => v.map(Cow::Owned),
            Err(e) => {
                cold.fail(e);
                None
            }
        }
    }

    /// Takes every entry out (a restore writing what it replayed so far to
    /// the local store; only before the store is attached).
    /// In key order, so that what reaches the store does not depend on the
    /// hash index's layout.
    pub(crate) fn drain_bytes(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = std::mem::take(&mut self.entries)
            .into_iter()
            .map(|(k, r)| (k.to_vec(), r.value.to_vec()))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Puts raw bytes under a raw store key (changelog restore, before the
    /// store is attached).
    pub(crate) fn put_bytes(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.entries.insert(
            Arc::from(key),
            Resident {
                value: RecordBytes::from(value),
                seq: 0,
                stamp: 0,
            },
        );
    }

    /// Removes a raw store key (a changelog tombstone, before the store is
    /// attached).
    pub(crate) fn remove_bytes(&mut self, key: &[u8]) {
        self.entries.remove(key);
    }
}

impl Cold {
    /// Whether `key` is certainly not in the local store: the filter has
    /// never seen it, and the walk has come past it (or is done).
    fn filtered_out(&self, key: &[u8]) -> bool {
        let Some(filter) = self.filter.as_ref() else {
            return false;
        };
        let walked = match &self.walk {
            Walk::Done => true,
            Walk::Until(Some(last)) => key <= last.as_slice(),
            Walk::Until(None) => false,
        };
        walked && !filter.may_hold(key)
    }

    fn fail(&self, e: LocalStoreError) {
        let mut slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
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
        w.put(&FoldKey::Null.to_bytes(), vec![1]);
        w.put(&FoldKey::Ticks.to_bytes(), vec![2]);
        s.apply(&w);
        assert_eq!(s.get(&FoldKey::Null).as_deref(), Some(&[1u8][..]));
        let mut w = FoldWrites::new();
        w.delete(&FoldKey::Null.to_bytes());
        s.apply(&w);
        assert_eq!(s.get(&FoldKey::Null), None);
        assert_eq!(s.len(), 1);
    }

    /// A state key written over a reused buffer is the key alone, whatever
    /// the buffer held before (a longer key, a null key's byte).
    #[test]
    fn a_key_written_over_a_reused_buffer_is_exact() {
        let mut buf = FoldKey::key_bytes(Some(b"a much longer key"));
        FoldKey::write_key_bytes(Some(b"k"), &mut buf);
        assert_eq!(buf, FoldKey::key_bytes(Some(b"k")));
        FoldKey::write_key_bytes(None, &mut buf);
        assert_eq!(buf, FoldKey::Null.to_bytes());
        FoldKey::write_key_bytes(Some(b""), &mut buf);
        assert_eq!(buf, FoldKey::for_key(Some(b"")).to_bytes());
    }

    /// A later write to a key pending in the same batch replaces the
    /// earlier one, put or delete; the batch keeps one entry per key, in
    /// the order the keys were first written, and hands them over by value
    /// in that order.
    #[test]
    fn a_later_write_to_a_pending_key_replaces_it() {
        let mut w = FoldWrites::new();
        let key = FoldKey::key_bytes(Some(b"k"));
        w.put(&key, vec![1]);
        w.put(&FoldKey::Null.to_bytes(), vec![9]);
        w.put(&key, vec![2]);
        assert_eq!(w.get(&key), Some(Some(&[2u8][..])));
        w.delete(&key);
        assert_eq!(w.get(&key), Some(None));
        w.put(&key, vec![3]);
        assert_eq!(w.len(), 2);
        assert_eq!(
            w.into_entries()
                .map(|(k, v)| (k.into_vec(), v.map(RecordBytes::into_vec)))
                .collect::<Vec<_>>(),
            vec![(key, Some(vec![3])), (vec![0x00], Some(vec![9]))]
        );
    }

    /// The coalesced batch ends in each key's last write whatever the mix
    /// of puts and deletes before it: a delete after a put leaves a delete
    /// (not the put, which would resurrect the key on disk and in the
    /// changelog), a put after a delete leaves the put.
    #[test]
    fn a_coalesced_key_keeps_its_last_write_across_deletes() {
        let (a, b) = (
            FoldKey::key_bytes(Some(b"a")),
            FoldKey::key_bytes(Some(b"b")),
        );
        let mut w = FoldWrites::new();
        w.put(&a, vec![1]);
        w.put(&b, vec![1]);
        w.delete(&a);
        w.delete(&b);
        w.put(&b, vec![2]);
        assert_eq!(
            w.iter().collect::<Vec<_>>(),
            vec![(&a[..], None), (&b[..], Some(&[2u8][..]))]
        );
        // Applied to a store that held both, `a` is gone and `b` is new.
        let mut s = FoldStore::new();
        let mut before = FoldWrites::new();
        before.put(&a, vec![0]);
        before.put(&b, vec![0]);
        s.apply(&before);
        s.apply(&w);
        assert_eq!(s.get_bytes(&a), None);
        assert_eq!(s.get_bytes(&b).as_deref(), Some(&[2u8][..]));
    }

    /// A local store the test applies by hand: `writes` are what the store
    /// was sent, `applied` how many of them it holds.
    #[derive(Default)]
    struct FakeDisk {
        writes: Mutex<Vec<FoldWrites>>,
        applied: AtomicU64,
        /// Writes the disk held before the reader was made.
        base: usize,
        broken: std::sync::atomic::AtomicBool,
        /// Full scans (which read every value).
        scans: AtomicU64,
    }

    impl FakeDisk {
        fn state(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
            let mut m = BTreeMap::new();
            let writes = self.writes.lock().unwrap();
            let n = self.base + self.applied.load(Ordering::SeqCst) as usize;
            for w in writes.iter().take(n) {
                for (k, v) in w.iter() {
                    match v {
                        Some(v) => m.insert(k.to_vec(), v.to_vec()),
                        None => m.remove(k),
                    };
                }
            }
            m
        }
        fn check(&self) -> Result<(), LocalStoreError> {
            if self.broken.load(Ordering::SeqCst) {
                return Err(LocalStoreError::Io {
                    task: crate::runtime::identity::TaskId {
                        stage: "s".into(),
                        partition: 0,
                    },
                    message: "disk gone".into(),
                });
            }
            Ok(())
        }
    }

    impl LocalReader for FakeDisk {
        fn applied(&self) -> u64 {
            self.applied.load(Ordering::SeqCst)
        }
        fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError> {
            self.check()?;
            Ok(self.state().get(key).cloned())
        }
        fn fold_scan(&self) -> Result<Vec<crate::runtime::local::KeyValue>, LocalStoreError> {
            self.check()?;
            self.scans.fetch_add(1, Ordering::SeqCst);
            Ok(self.state().into_iter().collect())
        }
        fn fold_keys(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), LocalStoreError> {
            self.check()?;
            for k in self.state().keys() {
                f(k);
            }
            Ok(())
        }
        fn protocol_range(
            &self,
            _from: &[u8],
            _to: &[u8],
            _f: &mut dyn FnMut(&[u8], &[u8]),
        ) -> Result<(), LocalStoreError> {
            // The fold store never reads protocol entries.
            self.check()
        }
    }

    fn put(k: u32, v: &[u8]) -> FoldWrites {
        let mut w = FoldWrites::new();
        w.put(&k.to_be_bytes(), v.to_vec());
        w
    }

    /// Sends one commit to the store and the fake disk, as a host does.
    fn commit(s: &mut FoldStore, disk: &FakeDisk, w: FoldWrites, land: bool) {
        disk.writes.lock().unwrap().push(w.clone());
        if land {
            disk.applied.fetch_add(1, Ordering::SeqCst);
        }
        s.apply(&w);
    }

    fn bounded(budget: usize) -> (FoldStore, Arc<FakeDisk>) {
        let disk = Arc::new(FakeDisk::default());
        let mut s = FoldStore::new();
        s.attach(disk.clone(), budget);
        (s, disk)
    }

    #[test]
    fn a_bounded_store_keeps_its_budget_and_reads_the_rest_back() {
        let value = [7u8; 100];
        let one = cost(&0u32.to_be_bytes(), &value);
        let (mut s, disk) = bounded(10 * one);
        for k in 0..1000u32 {
            commit(&mut s, &disk, put(k, &value), true);
            assert!(s.cache_stats().unwrap().resident_bytes <= 10 * one);
        }
        let stats = s.cache_stats().unwrap();
        assert_eq!(stats.resident, 10);
        assert_eq!(stats.evicted, 990);
        assert_eq!(stats.withheld, 0);
        // The newest writes stay; the oldest read back from disk.
        assert!(s.iter().all(|(k, _)| k >= &990u32.to_be_bytes()[..]));
        assert_eq!(
            s.get_bytes(&3u32.to_be_bytes()).as_deref(),
            Some(&value[..])
        );
        assert_eq!(s.cache_stats().unwrap().disk_reads, 1);
        assert_eq!(s.all().len(), 1000);
        assert!(s.take_failure().is_none());
    }

    /// The keys of a bounded store, counted for a state view's `len`, are
    /// walked without reading any state from disk (finding 8 of the
    /// broker-failure review: the count loaded the whole state), and they
    /// are exactly the keys [`FoldStore::all`] lists: those on disk, those
    /// in memory, less a delete the disk does not hold yet.
    #[test]
    fn a_bounded_store_counts_its_keys_without_reading_state() {
        let value = [7u8; 100];
        let one = cost(&0u32.to_be_bytes(), &value);
        let (mut s, disk) = bounded(10 * one);
        for k in 0..100u32 {
            commit(&mut s, &disk, put(k, &value), true);
        }
        let mut delete = FoldWrites::new();
        delete.delete(&3u32.to_be_bytes());
        commit(&mut s, &disk, delete, false);
        let mut keys = 0;
        s.for_each_key(&mut |_| keys += 1);
        assert_eq!(keys, 99, "the delete not yet on disk counts");
        assert_eq!(disk.scans.load(Ordering::SeqCst), 0, "no state read");
        assert_eq!(s.all().len(), keys);
    }

    /// A local store kept as one map, applied at once (for tests with many
    /// keys, where [`FakeDisk`] replays every write on each read).
    #[derive(Default)]
    struct MapDisk {
        map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
        applied: AtomicU64,
        reads: AtomicU64,
    }

    impl MapDisk {
        fn land(&self, w: &FoldWrites) {
            let mut m = self.map.lock().unwrap();
            for (k, v) in w.iter() {
                match v {
                    Some(v) => m.insert(k.to_vec(), v.to_vec()),
                    None => m.remove(k),
                };
            }
            self.applied.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl LocalReader for MapDisk {
        fn applied(&self) -> u64 {
            self.applied.load(Ordering::SeqCst)
        }
        fn fold_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LocalStoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(self.map.lock().unwrap().get(key).cloned())
        }
        fn fold_keys_after(
            &self,
            after: Option<&[u8]>,
            limit: usize,
            f: &mut dyn FnMut(&[u8]),
        ) -> Result<Option<Vec<u8>>, LocalStoreError> {
            use std::ops::Bound::{Excluded, Unbounded};
            let m = self.map.lock().unwrap();
            let mut last = None;
            let range = match after {
                Some(a) => m.range::<[u8], _>((Excluded(a), Unbounded)),
                None => m.range::<[u8], _>(..),
            };
            for (k, _) in range.take(limit) {
                f(k);
                last = Some(k.clone());
            }
            Ok(last)
        }
        fn fold_len_hint(&self) -> Option<u64> {
            Some(self.map.lock().unwrap().len() as u64)
        }
        fn fold_scan(&self) -> Result<Vec<crate::runtime::local::KeyValue>, LocalStoreError> {
            Ok(self
                .map
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
        fn protocol_range(
            &self,
            _from: &[u8],
            _to: &[u8],
            _f: &mut dyn FnMut(&[u8], &[u8]),
        ) -> Result<(), LocalStoreError> {
            Ok(())
        }
    }

    /// The key filter never answers "absent" for a key the local store
    /// holds: not for the keys that were on disk when the store was
    /// attached (a restart that found its file), and not for keys put
    /// since, through every stage the filter grows. And it earns its
    /// keep: reads of keys that were never written almost never reach the
    /// disk.
    #[test]
    fn the_key_filter_never_hides_a_key_the_local_store_holds() {
        let value = [7u8; 8];
        let on_disk = 20_000u32;
        let disk = Arc::new(MapDisk::default());
        let mut first = FoldWrites::new();
        for k in 0..on_disk {
            first.put(&k.to_be_bytes(), value.to_vec());
        }
        disk.land(&first);
        disk.applied.store(0, Ordering::SeqCst);
        let mut s = FoldStore::new();
        s.attach(disk.clone(), 10 * cost(&0u32.to_be_bytes(), &value));
        // More keys than the first stage was sized for (twice the keys
        // found): the filter grows twice over.
        let added = 3 * on_disk;
        for batch in 0..60u32 {
            let mut w = FoldWrites::new();
            for k in 0..added / 60 {
                w.put(
                    &(on_disk + batch * (added / 60) + k).to_be_bytes(),
                    value.to_vec(),
                );
            }
            s.apply(&w);
            disk.land(&w);
            s.evict();
        }
        let stages = s.cache_stats().unwrap().filter_stages;
        assert!(stages >= 2, "the filter grew ({stages} stages)");
        let total = on_disk + added;
        assert!(s.len() <= 10, "nearly every key left memory");
        for k in 0..total {
            assert_eq!(
                s.get_bytes(&k.to_be_bytes()).as_deref(),
                Some(&value[..]),
                "key {k} is on disk and must read back"
            );
        }
        let before = disk.reads.load(Ordering::SeqCst);
        let absent = 50_000u32;
        for k in total..total + absent {
            assert_eq!(s.get_bytes(&k.to_be_bytes()), None);
        }
        let wasted = disk.reads.load(Ordering::SeqCst) - before;
        assert!(
            wasted * 100 <= u64::from(absent),
            "{wasted} of {absent} reads of absent keys reached the disk (at most 1% may)"
        );
        let stats = s.cache_stats().unwrap();
        assert_eq!(stats.filtered_reads + wasted, u64::from(absent));
        assert!(stats.filter_bytes > 0);
    }

    /// While the walk of the keys on disk goes on (one step per commit), a
    /// key the walk has not reached is read from the store, found or not;
    /// one it has passed is answered by the filter. Once it is done, every
    /// key on disk reads back and absent keys are filtered.
    #[test]
    fn a_key_the_walk_has_not_reached_is_read_from_the_store() {
        let value = [7u8; 8];
        let disk = Arc::new(MapDisk::default());
        let mut first = FoldWrites::new();
        for k in 0..10_000u32 {
            // Even keys only: the odd ones between are absent.
            first.put(&(2 * k).to_be_bytes(), value.to_vec());
        }
        disk.land(&first);
        disk.applied.store(0, Ordering::SeqCst);
        let mut s = FoldStore::new();
        s.attach_walking(disk.clone(), 1 << 20, 1000);
        // The first step covered keys 0..=1998.
        let reads = |d: &MapDisk| d.reads.load(Ordering::SeqCst);
        assert_eq!(s.get_bytes(&1001u32.to_be_bytes()), None);
        assert_eq!(reads(&disk), 0, "an absent key the walk passed is filtered");
        assert_eq!(
            s.get_bytes(&5000u32.to_be_bytes()).as_deref(),
            Some(&value[..]),
            "a key beyond the walk is read from the store"
        );
        assert_eq!(s.get_bytes(&5001u32.to_be_bytes()), None);
        assert_eq!(reads(&disk), 2, "so is an absent one");
        // A key put ahead of the walk, then evicted, still reads back.
        let mut w = FoldWrites::new();
        w.put(&19_999u32.to_be_bytes(), value.to_vec());
        s.apply(&w);
        disk.land(&w);
        for _ in 0..20 {
            s.apply(&FoldWrites::new());
        }
        assert_eq!(s.cold.as_ref().unwrap().walk, Walk::Done);
        let resident: std::collections::BTreeSet<Vec<u8>> =
            s.iter().map(|(k, _)| k.to_vec()).collect();
        let before = reads(&disk);
        let mut on_disk = 0;
        for k in 0..20_000u32 {
            let want = (k % 2 == 0 || k == 19_999).then_some(&value[..]);
            assert_eq!(s.get_bytes(&k.to_be_bytes()).as_deref(), want, "key {k}");
            if want.is_some() && !resident.contains(&k.to_be_bytes()[..]) {
                on_disk += 1;
            }
        }
        let wasted = reads(&disk) - before - on_disk;
        assert!(wasted <= 100, "{wasted} reads of 9,999 absent keys");
    }

    /// A store whose keys cannot be listed at attach has no filter: every
    /// miss reads the local store (never an absent answer made up), and
    /// the listing's failure is the task's.
    #[test]
    fn a_store_whose_keys_cannot_be_listed_reads_every_miss() {
        let disk = Arc::new(FakeDisk::default());
        disk.broken.store(true, Ordering::SeqCst);
        let mut s = FoldStore::new();
        s.attach(disk.clone(), 1 << 20);
        assert!(s.take_failure().is_some());
        disk.broken.store(false, Ordering::SeqCst);
        assert_eq!(s.get_bytes(b"nothing"), None);
        let stats = s.cache_stats().unwrap();
        assert_eq!((stats.disk_reads, stats.filtered_reads), (1, 0));
    }

    /// Keys rewritten on every commit leave stale listings in the eviction
    /// order; they are dropped, so the order stays about the size of what
    /// is in memory, and eviction still takes the oldest write first.
    #[test]
    fn hot_keys_do_not_grow_the_eviction_order() {
        let value = [7u8; 16];
        let one = cost(&0u32.to_be_bytes(), &value);
        let (mut s, disk) = bounded(3 * one);
        for round in 0..5_000u32 {
            let mut w = FoldWrites::new();
            for k in 0..3u32 {
                w.put(&k.to_be_bytes(), round.to_be_bytes().repeat(4));
            }
            s.apply(&w);
            disk.applied.fetch_add(1, Ordering::SeqCst);
        }
        let order = s.cold.as_ref().unwrap().order.len();
        assert!(
            order <= 2 * 3 + 1024 + 3,
            "the order holds {order} listings"
        );
        // The three were last written in key order, so a new key pushes
        // out key 0, the oldest write.
        commit(&mut s, &disk, put(9, &value), true);
        let mut resident: Vec<_> = s.iter().map(|(k, _)| k.to_vec()).collect();
        resident.sort();
        assert_eq!(
            resident,
            vec![
                1u32.to_be_bytes().to_vec(),
                2u32.to_be_bytes().to_vec(),
                9u32.to_be_bytes().to_vec()
            ]
        );
    }

    #[test]
    fn a_rewritten_entry_is_the_newest_and_keeps_its_value_exact() {
        let value = [7u8; 100];
        let one = cost(&0u32.to_be_bytes(), &value);
        let (mut s, disk) = bounded(2 * one);
        commit(&mut s, &disk, put(1, &value), true);
        commit(&mut s, &disk, put(2, &value), true);
        // Key 1 written again, same length and then another length: it is
        // now the newest write, so key 3's arrival evicts key 2.
        commit(&mut s, &disk, put(1, &[8u8; 100]), true);
        commit(&mut s, &disk, put(1, &[9u8; 100]), true);
        commit(&mut s, &disk, put(3, &value), true);
        let resident: Vec<_> = s.iter().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(
            resident,
            vec![1u32.to_be_bytes().to_vec(), 3u32.to_be_bytes().to_vec()]
        );
        assert_eq!(s.cache_stats().unwrap().resident_bytes, 2 * one);
        commit(&mut s, &disk, put(1, b"short"), true);
        assert_eq!(
            s.get_bytes(&1u32.to_be_bytes()).as_deref(),
            Some(&b"short"[..])
        );
        assert_eq!(
            s.cache_stats().unwrap().resident_bytes,
            one + cost(&1u32.to_be_bytes(), b"short")
        );
        // Unbounded, a rewrite keeps the latest value too.
        let mut u = FoldStore::new();
        u.apply(&put(1, b"aa"));
        u.apply(&put(1, b"bb"));
        u.apply(&put(1, b"ccc"));
        assert_eq!(
            u.get_bytes(&1u32.to_be_bytes()).as_deref(),
            Some(&b"ccc"[..])
        );
        assert_eq!(u.len(), 1);
    }

    #[test]
    fn an_entry_the_disk_does_not_hold_yet_stays_in_memory() {
        let (mut s, disk) = bounded(1);
        // The disk lags: none of these writes has landed.
        commit(&mut s, &disk, put(1, b"old"), false);
        commit(&mut s, &disk, put(1, b"new"), false);
        commit(&mut s, &disk, put(2, b"two"), false);
        let stats = s.cache_stats().unwrap();
        assert_eq!(stats.resident, 2, "evicting now would lose the values");
        assert!(stats.withheld > 0);
        assert_eq!(
            s.get_bytes(&1u32.to_be_bytes()).as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(stats.disk_reads, 0);
        // The first write lands: key 1's latest value is the second write,
        // still not on disk, so it must stay.
        disk.applied.store(1, Ordering::SeqCst);
        s.evict();
        assert_eq!(
            s.get_bytes(&1u32.to_be_bytes()).as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(s.cache_stats().unwrap().resident, 2);
        // Everything lands: both may go, and read back as written last.
        disk.applied.store(3, Ordering::SeqCst);
        s.evict();
        assert_eq!(s.cache_stats().unwrap().resident, 0);
        assert_eq!(
            s.get_bytes(&1u32.to_be_bytes()).as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(
            s.get_bytes(&2u32.to_be_bytes()).as_deref(),
            Some(&b"two"[..])
        );
    }

    #[test]
    fn a_delete_hides_the_disk_value_until_the_disk_holds_it() {
        let (mut s, disk) = bounded(1);
        commit(&mut s, &disk, put(1, b"v"), true);
        s.evict();
        assert_eq!(s.cache_stats().unwrap().resident, 0);
        let mut w = FoldWrites::new();
        w.delete(&1u32.to_be_bytes());
        commit(&mut s, &disk, w, false);
        // The disk still has the value; the store must not read it.
        assert_eq!(disk.state().len(), 1);
        assert_eq!(s.get_bytes(&1u32.to_be_bytes()), None);
        assert!(s.all().is_empty());
        disk.applied.store(2, Ordering::SeqCst);
        s.evict();
        assert_eq!(s.get_bytes(&1u32.to_be_bytes()), None);
        assert!(s.all().is_empty());
        assert!(!s.is_empty(), "a bounded store cannot tell it is empty");
    }

    #[test]
    fn a_failed_disk_read_is_kept_for_the_task_to_fail_on() {
        let (mut s, disk) = bounded(1);
        commit(&mut s, &disk, put(1, b"v"), true);
        s.evict();
        disk.broken.store(true, Ordering::SeqCst);
        assert_eq!(s.get_bytes(&1u32.to_be_bytes()), None);
        let e = s.take_failure().expect("the failed read is recorded");
        assert!(e.to_string().contains("disk gone"), "{e}");
        assert!(s.take_failure().is_none(), "taken once");
        let _ = s.all();
        assert!(s.take_failure().is_some(), "a failed scan is recorded too");
    }

    #[test]
    fn attaching_evicts_what_was_restored_down_to_the_budget() {
        let mut s = FoldStore::new();
        let mut restored = FoldWrites::new();
        for k in 0..50u32 {
            s.put_bytes(k.to_be_bytes().to_vec(), vec![1; 10]);
            restored.put(&k.to_be_bytes(), vec![1; 10]);
        }
        // The host wrote the restored state before attaching.
        let disk = Arc::new(FakeDisk {
            writes: Mutex::new(vec![restored]),
            base: 1,
            ..FakeDisk::default()
        });
        let one = cost(&0u32.to_be_bytes(), &[1; 10]);
        s.attach(disk.clone(), 5 * one);
        assert_eq!(s.len(), 5);
        assert_eq!(s.all().len(), 50);
    }

    /// The figure behind [`ENTRY_OVERHEAD`]: the resident set of a bounded
    /// store of 1M short keys against its budget. A measurement, not a
    /// check (run by hand; see docs/performance.md):
    /// `cargo test --profile ci -p parsley --lib probe_resident_cost -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, run by hand"]
    fn probe_resident_cost() {
        fn rss_mib() -> f64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        }
        let budget = 64usize << 20;
        let before = rss_mib();
        let disk = Arc::new(FakeDisk::default());
        // The disk holds every write at once.
        disk.applied.store(u64::MAX / 2, Ordering::SeqCst);
        let mut s = FoldStore::new();
        s.attach(disk, budget);
        for batch in 0..1_000u64 {
            let mut w = FoldWrites::new();
            for i in 0..1_000 {
                let key = FoldKey::Key(format!("key-{}", batch * 1_000 + i).into_bytes());
                w.put(&key.to_bytes(), 1i64.to_be_bytes().to_vec());
            }
            s.apply(&w);
        }
        let st = s.cache_stats().unwrap_or_default();
        let grew = rss_mib() - before;
        println!(
            "1M keys through a {} MiB cache: {} resident, estimated {:.1} MiB; the resident set grew {grew:.1} MiB ({:.0} bytes per resident entry)",
            budget >> 20,
            st.resident,
            st.resident_bytes as f64 / f64::from(1 << 20),
            grew * f64::from(1 << 20) / st.resident.max(1) as f64,
        );
    }
}
