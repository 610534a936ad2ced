//! Partitioning: where an emission lands.
//!
//! A keyed emission goes where Kafka's default producer partitioner would
//! put it, so a Rust stage and a Java (or any librdkafka `murmur2_random`)
//! producer agree on the partition of every key: the 32-bit MurmurHash2 of
//! the *encoded* key bytes with Kafka's seed, made non-negative by clearing
//! the sign bit, modulo the partition count.
//!
//! That is the default. A topic whose producers place keys otherwise
//! declares it with [`Topic::partitioner`](crate::Topic::partitioner) and a
//! [`Partitioner`]: librdkafka's default (`consistent_random`, CRC-32) is
//! the usual one, since the Rust, Python, Go and .NET clients are built on
//! librdkafka. A stage then writes to that topic with the same partitioner,
//! and queries look for a key's state where that partitioner put it.
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
    Partitioner::Murmur2.partition(key, partitions)
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
    Partitioner::Murmur2.partition_for(key, task_partition, partitions)
}

/// How a topic's producers map a key to a partition. Every producer of a
/// topic must use the same one (and so must the producers of topics a
/// stage joins on the key): a key's records must all reach one partition,
/// the one whose task holds the key's state.
///
/// The variants are named for their hash; each lists the producer settings
/// that use it. A null key never goes through the partitioner: Parsley
/// sends a null-key record to the emitting task's own partition, and the
/// `*_random` settings of librdkafka pick a random partition for it.
///
/// ```
/// use parsley::partition::Partitioner;
/// // librdkafka's default, as rdkafka, confluent-kafka-python or
/// // confluent-kafka-go produce unless told otherwise.
/// let p = Partitioner::from_librdkafka("consistent_random").unwrap();
/// assert_eq!(p, Partitioner::Crc32);
/// assert_eq!(p.partition(b"order-17", 6), (crc32fast::hash(b"order-17") % 6) as i32);
/// // Kafka's Java producer's default, and Parsley's.
/// assert_eq!(Partitioner::default(), Partitioner::Murmur2);
/// assert_eq!(Partitioner::Murmur2.librdkafka_name(), "murmur2_random");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Partitioner {
    /// Kafka's MurmurHash2 of the key, sign bit cleared, modulo the
    /// partition count: the Java producer's default (and Kafka Streams'),
    /// librdkafka's `murmur2` and `murmur2_random`, and what Parsley uses
    /// unless told otherwise.
    #[default]
    Murmur2,
    /// The CRC-32 of the key (zlib's) modulo the partition count:
    /// librdkafka's `consistent`, and `consistent_random`, its default, and
    /// so the default of every client built on it (rdkafka for Rust,
    /// confluent-kafka for Python, Go and .NET).
    Crc32,
    /// The 32-bit FNV-1a hash of the key, made non-negative by negation, modulo
    /// the partition count: librdkafka's `fnv1a` and `fnv1a_random`, which
    /// agree with Sarama's (Go) hash partitioner.
    Fnv1a,
}

impl Partitioner {
    /// The partitioner of a librdkafka producer's `partitioner` setting.
    /// `None` for `random` (no key placement at all) and for names
    /// librdkafka does not have.
    pub fn from_librdkafka(name: &str) -> Option<Partitioner> {
        Some(match name {
            "murmur2" | "murmur2_random" => Partitioner::Murmur2,
            "consistent" | "consistent_random" => Partitioner::Crc32,
            "fnv1a" | "fnv1a_random" => Partitioner::Fnv1a,
            _ => return None,
        })
    }

    /// The `partitioner` setting that makes a librdkafka producer place
    /// keys as this partitioner does.
    pub fn librdkafka_name(self) -> &'static str {
        match self {
            Partitioner::Murmur2 => "murmur2_random",
            Partitioner::Crc32 => "consistent_random",
            Partitioner::Fnv1a => "fnv1a_random",
        }
    }

    /// The partition of `key` on a topic of `partitions` partitions (which
    /// must be positive).
    pub fn partition(self, key: &[u8], partitions: i32) -> i32 {
        let n = partitions.max(1);
        match self {
            Partitioner::Murmur2 => to_positive(murmur2(key)) % n,
            // Unsigned modulo, as librdkafka computes it.
            Partitioner::Crc32 => (crc32fast::hash(key) % n.unsigned_abs()) as i32,
            Partitioner::Fnv1a => (fnv1a(key) % n.unsigned_abs()) as i32,
        }
    }

    /// The partition of an outgoing record: the key's partition for a
    /// keyed record, the emitting task's own partition (modulo the count)
    /// for a null key.
    pub fn partition_for(self, key: Option<&[u8]>, task_partition: i32, partitions: i32) -> i32 {
        match key {
            Some(k) => self.partition(k, partitions),
            None => task_partition.rem_euclid(partitions.max(1)),
        }
    }
}

/// librdkafka's FNV-1a: the 32-bit hash computed on a signed int, negated
/// when negative (so `i32::MIN` stays as it is), read unsigned.
fn fnv1a(key: &[u8]) -> u32 {
    const PRIME: u32 = 0x0100_0193;
    const OFFSET: u32 = 0x811c_9dc5;
    let mut h = OFFSET;
    for b in key {
        h ^= u32::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    (h as i32).wrapping_abs() as u32
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

    /// librdkafka's own test vectors for its FNV-1a (rdfnv1a.c, taken there
    /// from Go's hash/fnv with the same negation).
    #[test]
    fn fnv1a_matches_librdkafkas_vectors() {
        let short = "1234";
        let long = "PreAmbleWillBeRemoved,ThePrePartThatIs";
        let vectors: &[(&str, u32)] = &[
            ("kafka", 0x0d33_c4e1),
            ("giberish123456789", 0x77a5_8295),
            (short, 0x023b_dd03),
            (&short[1..], 0x2dea_3cd2),
            (&short[2..], 0x740f_a83e),
            (&short[3..], 0x310c_a263),
            (long, 0x65cb_d69c),
            (&long[1..], 0x6e49_c79a),
            (&long[2..], 0x69ee_d356),
            (&long[3..], 0x6abc_c023),
            ("", 0x7ee3_623b),
        ];
        for (key, want) in vectors {
            assert_eq!(fnv1a(key.as_bytes()), *want, "fnv1a({key:?})");
        }
    }

    #[test]
    fn each_partitioner_places_keys_by_its_own_hash() {
        // CRC-32's check value (zlib's crc32 of "123456789").
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
        assert_eq!(
            Partitioner::Crc32.partition(b"123456789", 7),
            (0xcbf4_3926u32 % 7) as i32
        );
        assert_eq!(Partitioner::Fnv1a.partition(b"kafka", 5), 0x0d33_c4e1 % 5);
        assert_eq!(
            Partitioner::Murmur2.partition(b"foobar", 7),
            partition_for_key(b"foobar", 7)
        );
        // The three disagree on most keys: a topic's partitioner matters.
        let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
        let differ = keys
            .iter()
            .filter(|k| {
                Partitioner::Crc32.partition(k.as_bytes(), 12)
                    != Partitioner::Murmur2.partition(k.as_bytes(), 12)
            })
            .count();
        assert!(differ > 80, "{differ}");
        for p in [Partitioner::Murmur2, Partitioner::Crc32, Partitioner::Fnv1a] {
            assert_eq!(Partitioner::from_librdkafka(p.librdkafka_name()), Some(p));
            for k in &keys {
                assert!((0..12).contains(&p.partition(k.as_bytes(), 12)));
            }
            assert_eq!(p.partition_for(None, 7, 3), 1);
        }
        assert_eq!(
            Partitioner::from_librdkafka("consistent"),
            Some(Partitioner::Crc32)
        );
        assert_eq!(Partitioner::from_librdkafka("random"), None);
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
