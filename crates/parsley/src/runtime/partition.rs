//! Partitioning: where an emission lands.
//!
//! A keyed emission goes where Kafka's default producer partitioner would
//! put it, so a Rust stage and a Java (or any librdkafka `murmur2_random`)
//! producer agree on the partition of every key: the 32-bit MurmurHash2 of
//! the *encoded* key bytes with Kafka's seed, made non-negative by clearing
//! the sign bit, modulo the partition count.
//!
//! A null-key emission has no hash. Kafka's own producer spreads those
//! records (sticky or round-robin), which no deterministic runtime can
//! reproduce. Parsley sends them to the emitting task's own partition number
//! (modulo the sink's partition count): deterministic across restarts, and a
//! task's null-key outputs stay on one channel, in send order. Ticks are
//! routed the same way.

/// Kafka's 32-bit MurmurHash2 (`org.apache.kafka.common.utils.Utils.murmur2`):
/// seed `0x9747b28c`, little-endian 4-byte blocks, the tail folded in
/// highest byte first.
///
/// ```
/// // The vector below is one of the pinned cases of this crate's tests.
/// assert_eq!(parsley::partition::murmur2(b"foobar"), -790332482);
/// ```
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    // Java computes `seed ^ length` on 32-bit ints; a key longer than 4 GiB
    // cannot be a Kafka key, and the truncation matches Java's int anyway.
    let mut h: u32 = SEED ^ (len as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        if tail.len() >= 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (it does not negate, so
/// `i32::MIN` maps to 0).
pub const fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition Kafka's default partitioner picks for `key` on a topic with
/// `partitions` partitions. `partitions` must be positive.
///
/// ```
/// use parsley::partition::partition_for_key;
/// let p = partition_for_key(b"order-17", 6);
/// assert!((0..6).contains(&p));
/// ```
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    debug_assert!(partitions > 0);
    to_positive(murmur2(key)) % partitions.max(1)
}

/// The partition of an outgoing record: the key's partition for a keyed
/// record, the emitting task's own partition (modulo the count) for a null
/// key.
///
/// ```
/// use parsley::partition::partition_for;
/// assert_eq!(partition_for(None, 3, 4), 3);
/// assert_eq!(partition_for(None, 5, 4), 1);
/// ```
pub fn partition_for(key: Option<&[u8]>, task_partition: i32, partitions: i32) -> i32 {
    let n = partitions.max(1);
    match key {
        Some(k) => partition_for_key(k, n),
        None => task_partition.rem_euclid(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each vector comes from:
    ///
    /// * the first six are the inputs and signed results that Apache
    ///   Kafka's own `UtilsTest.testMurmur2` asserts for `Utils.murmur2`;
    /// * every one of them, and the last three, were recomputed with an
    ///   independent implementation (the `murmur2` of the kafka-python
    ///   client's default partitioner, a port of Kafka's Java method whose
    ///   unsigned result was reinterpreted as a signed 32-bit int) while
    ///   writing this test; the two sources agree on all six shared inputs.
    const VECTORS: &[(&[u8], i32)] = &[
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (
            b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58897971,
        ),
        (b"abc", 479470107),
        (b"", 275646681),
        (b"order-17", 1568318961),
        (b"k1", 1684045097),
    ];

    #[test]
    fn murmur2_matches_kafka_vectors() {
        for (input, want) in VECTORS {
            assert_eq!(
                murmur2(input),
                *want,
                "murmur2({:?})",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn to_positive_clears_the_sign_bit() {
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(5), 5);
        assert_eq!(to_positive(-790332482), 1357151166);
    }

    #[test]
    fn partition_is_positive_modulo() {
        // foobar: toPositive(-790332482) = 1357151166; mod 7 = 1357151166 - 7 * 193878738 = 0.
        assert_eq!(partition_for_key(b"foobar", 7), 1357151166 % 7);
        for (input, _) in VECTORS {
            for n in 1..20 {
                let p = partition_for_key(input, n);
                assert!((0..n).contains(&p));
            }
        }
    }

    #[test]
    fn null_keys_go_to_the_task_partition() {
        assert_eq!(partition_for(None, 0, 1), 0);
        assert_eq!(partition_for(None, 2, 3), 2);
        assert_eq!(partition_for(None, 7, 3), 1);
        assert_eq!(
            partition_for(Some(b"foobar"), 2, 7),
            partition_for_key(b"foobar", 7)
        );
    }
}
