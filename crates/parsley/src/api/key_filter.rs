//! The key filter of a bounded fold store: which keys its local store may
//! hold (see [`FoldStore`](crate::fold::FoldStore)).
//!
//! A split-block Bloom filter, the layout Parquet specifies for its column
//! filters: the bits are grouped in blocks of 256 (one cache line's half),
//! and a key sets one bit in each of the eight 32-bit words of one block
//! chosen by its hash. A lookup or an insert therefore touches one block,
//! one cache miss, where a classic Bloom filter touches a line per hash
//! function: the filter is read on every miss of the fold cache and
//! written for every new key, so that difference is most of its cost.

use std::hash::BuildHasher;

/// The hash the filter uses: fast, with a fixed seed, so a run behaves the
/// same every time.
type Fixed = foldhash::fast::FixedState;

/// Odd constants that spread a key's 32 low hash bits over the eight words
/// of its block (one bit position per word); any odd multipliers with well
/// spread high bits do. These are Parquet's.
const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

/// One stage: a fixed number of blocks, sized for `capacity` keys.
#[derive(Clone, Debug)]
struct Stage {
    blocks: Vec<[u32; 8]>,
    capacity: usize,
    keys: usize,
}

impl Stage {
    fn new(capacity: usize, bits_per_key: usize) -> Self {
        let blocks = capacity.saturating_mul(bits_per_key).div_ceil(256).max(1);
        Stage {
            blocks: vec![[0; 8]; blocks],
            capacity,
            keys: 0,
        }
    }

    /// The block of `hash` (its high half, scaled to the block count) and
    /// the bit each word of it takes (from its low half).
    fn place(&self, hash: u64) -> (usize, [u32; 8]) {
        let n = self.blocks.len() as u64;
        // Below n: (hash >> 32) < 2^32, so the product shifted down is < n.
        let block = usize::try_from(((hash >> 32) * n) >> 32).unwrap_or(0);
        let low = hash as u32;
        (block, SALT.map(|s| 1u32 << (low.wrapping_mul(s) >> 27)))
    }

    fn contains(&self, hash: u64) -> bool {
        let (i, mask) = self.place(hash);
        self.blocks
            .get(i)
            .is_some_and(|b| b.iter().zip(mask).all(|(w, m)| w & m == m))
    }

    fn insert(&mut self, hash: u64) {
        let (i, mask) = self.place(hash);
        if let Some(b) = self.blocks.get_mut(i) {
            for (w, m) in b.iter_mut().zip(mask) {
                *w |= m;
            }
            self.keys += 1;
        }
    }
}

/// Which keys a bounded fold store's local store may hold: every key that
/// was in the local store when the fold store was attached (walked in
/// steps, see the fold store), and every key put since. Deletes are not
/// taken out: a deleted key only costs a read that finds nothing.
///
/// A key the filter has never seen is certainly not on disk; a key it may
/// have seen is read, and a read of a key that is not there goes to the
/// store by mistake well under one time in a hundred. The filter grows in
/// stages: when one holds as many keys as it was sized for, a new one
/// twice as large, with more bits per key, takes the keys after it, so the
/// mistakes stay under 1% however large the state grows, and growing
/// never rereads the store.
#[derive(Clone, Debug)]
pub(crate) struct KeyFilter {
    hasher: Fixed,
    /// Oldest first; keys go into the last.
    stages: Vec<Stage>,
}

/// The smallest stage, in keys (24 KiB of filter).
const MIN_KEYS: usize = 16 * 1024;
/// The first stage's bits per key (a wrong "may hold" about one time in
/// 250); each later stage takes two more (about half as many mistakes), so
/// all stages together stay under twice the first's rate.
const BITS_PER_KEY: usize = 12;

impl KeyFilter {
    /// A filter with room for twice `keys` keys before it grows, holding
    /// none yet.
    pub(crate) fn with_room_for(keys: usize) -> Self {
        let mut f = KeyFilter {
            hasher: Fixed::default(),
            stages: Vec::new(),
        };
        f.grow(keys.saturating_mul(2).max(MIN_KEYS));
        f
    }

    fn grow(&mut self, capacity: usize) {
        let bits = BITS_PER_KEY + 2 * self.stages.len().min(10);
        self.stages.push(Stage::new(capacity, bits));
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// False only for a key never [`insert`](Self::insert)ed.
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        let h = self.hash(key);
        self.stages.iter().any(|s| s.contains(h))
    }

    /// Adds `key`.
    pub(crate) fn insert(&mut self, key: &[u8]) {
        let h = self.hash(key);
        if self.stages.iter().any(|s| s.contains(h)) {
            return;
        }
        if self.stages.last().is_none_or(|s| s.keys >= s.capacity) {
            let next = self
                .stages
                .last()
                .map_or(MIN_KEYS, |s| s.capacity.saturating_mul(2));
            self.grow(next);
        }
        if let Some(s) = self.stages.last_mut() {
            s.insert(h);
        }
    }

    /// How many stages it has grown to.
    pub(crate) fn stages(&self) -> usize {
        self.stages.len()
    }

    /// The filter's size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.stages.iter().map(|s| s.blocks.len() * 32).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key inserted is held, through growth; keys never inserted are
    /// mostly not, at the rate the sizing promises.
    #[test]
    fn no_key_inserted_is_ever_missed_and_few_others_are_taken() {
        let mut f = KeyFilter::with_room_for(10_000);
        let inserted = 200_000u32;
        for k in 0..inserted {
            f.insert(&k.to_be_bytes());
        }
        assert!(f.stages() >= 3, "grew to {} stages", f.stages());
        for k in 0..inserted {
            assert!(f.may_hold(&k.to_be_bytes()), "key {k} was inserted");
        }
        let tries = 200_000u32;
        let wrong = (inserted..inserted + tries)
            .filter(|k| f.may_hold(&k.to_be_bytes()))
            .count();
        let rate = wrong as f64 / f64::from(tries);
        assert!(rate < 0.01, "{wrong} of {tries} absent keys taken ({rate})");
        // A filled first stage alone keeps to its own rate.
        let mut one = KeyFilter::with_room_for(50_000);
        for k in 0..100_000u32 {
            one.insert(&k.to_be_bytes());
        }
        assert_eq!(one.stages(), 1);
        let wrong = (1_000_000..1_000_000 + tries)
            .filter(|k: &u32| one.may_hold(&k.to_be_bytes()))
            .count();
        assert!(
            f64::from(u32::try_from(wrong).unwrap_or(u32::MAX)) / f64::from(tries) < 0.006,
            "{wrong} of {tries}"
        );
    }

    /// The block a hash picks is always inside the stage, for the extreme
    /// hashes too.
    #[test]
    fn every_hash_lands_in_a_block() {
        let s = Stage::new(1000, 12);
        for h in [0, u64::MAX, 1 << 32, (1 << 32) - 1, u64::MAX << 32] {
            let (i, mask) = s.place(h);
            assert!(i < s.blocks.len());
            assert!(mask.iter().all(|m| m.count_ones() == 1));
        }
    }
}
