//! Algebraic properties of clocks and their encoding.

use parsley_protocol::*;
use proptest::prelude::*;

/// A small universe so that generated clocks overlap, with ids on both sides
/// of the signed-order boundary.
fn topic() -> impl Strategy<Value = TopicId> {
    prop_oneof![
        Just(TopicId::from_halves(i64::MIN, 1)),
        Just(TopicId::from_halves(-1, 5)),
        Just(TopicId::from_halves(1, i64::MIN)),
        Just(TopicId::from_halves(1, 2)),
        Just(TopicId::from_halves(i64::MAX, -1)),
    ]
}

fn channel() -> impl Strategy<Value = Channel> {
    (topic(), 0..3i32).prop_map(|(t, p)| Channel::new(t, p))
}

fn sender() -> impl Strategy<Value = SenderId> {
    prop_oneof![
        Just(SenderId::from_halves(i64::MIN, 0)),
        Just(SenderId::from_halves(3, 3)),
        Just(SenderId::from_halves(3, -3)),
    ]
}

fn clock() -> impl Strategy<Value = VectorClock> {
    (
        prop::collection::vec((channel(), 0..40i64), 0..10),
        prop::collection::vec((channel(), sender(), 0..20i64), 0..6),
    )
        .prop_map(|(o, s)| {
            VectorClock::from_claims(
                o.into_iter()
                    .map(|(channel, offset)| OffsetClaim { channel, offset }),
                s.into_iter().map(|(channel, sender, seq)| SequenceClaim {
                    channel,
                    sender,
                    seq,
                }),
            )
        })
}

fn merged(a: &VectorClock, b: &VectorClock) -> VectorClock {
    let mut m = a.clone();
    m.merge(b);
    m
}

fn offsets_only(c: &VectorClock) -> VectorClock {
    VectorClock::from_claims(c.offsets().iter().copied(), [])
}

proptest! {
    #[test]
    fn merge_is_commutative(a in clock(), b in clock()) {
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
    }

    #[test]
    fn merge_is_associative(a in clock(), b in clock(), c in clock()) {
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
    }

    #[test]
    fn merge_is_idempotent(a in clock(), b in clock()) {
        prop_assert_eq!(merged(&a, &a), a.clone());
        let ab = merged(&a, &b);
        let mut again = ab.clone();
        prop_assert!(!again.merge(&b), "merging what is already there reports no change");
        prop_assert_eq!(again, ab);
    }

    #[test]
    fn merge_is_pointwise_max(a in clock(), b in clock()) {
        let m = merged(&a, &b);
        for claim in m.offsets() {
            let expect = a.offset(claim.channel).max(b.offset(claim.channel));
            prop_assert_eq!(Some(claim.offset), expect);
        }
        for claim in m.sequences() {
            let expect = a.sequence(claim.channel, claim.sender).max(b.sequence(claim.channel, claim.sender));
            prop_assert_eq!(Some(claim.seq), expect);
        }
        prop_assert_eq!(m.offsets().len(), {
            let mut chans: Vec<Channel> = a.offsets().iter().chain(b.offsets()).map(|c| c.channel).collect();
            chans.sort();
            chans.dedup();
            chans.len()
        });
    }

    /// The merge, which interleaves new claims in place, gives the same
    /// clock as building the canonical one from both clocks' claims.
    #[test]
    fn merge_equals_the_canonical_clock_of_both(a in clock(), b in clock()) {
        let canonical = VectorClock::from_claims(
            a.offsets().iter().chain(b.offsets()).copied(),
            a.sequences().iter().chain(b.sequences()).copied(),
        );
        prop_assert_eq!(merged(&a, &b), canonical);
    }

    /// Clocks naming the same channels take the merge's lockstep pass;
    /// clocks of one length whose channels differ late fall back from it
    /// part way. Either way the result is the pointwise maximum, and the
    /// change is reported exactly when there is one.
    #[test]
    fn merge_of_clocks_of_one_length_is_pointwise_max(
        a in clock(),
        values in prop::collection::vec(0..40i64, 10),
        swap_last in any::<bool>(),
        other in channel(),
    ) {
        let mut claims: Vec<OffsetClaim> = a
            .offsets()
            .iter()
            .zip(&values)
            .map(|(c, &offset)| OffsetClaim { channel: c.channel, offset })
            .collect();
        if swap_last
            && a.offset(other).is_none()
            && let Some(last) = claims.last_mut()
        {
            last.channel = other;
        }
        let b = VectorClock::from_claims(claims, []);
        let mut m = a.clone();
        let changed = m.merge(&b);
        let mut model: std::collections::BTreeMap<Channel, i64> = std::collections::BTreeMap::new();
        for c in a.offsets().iter().chain(b.offsets()) {
            let slot = model.entry(c.channel).or_insert(c.offset);
            *slot = (*slot).max(c.offset);
        }
        let got: Vec<(Channel, i64)> = m.offsets().iter().map(|c| (c.channel, c.offset)).collect();
        prop_assert_eq!(got, model.into_iter().collect::<Vec<_>>());
        prop_assert_eq!(m.sequences(), a.sequences());
        prop_assert_eq!(changed, m != a);
    }

    #[test]
    fn dominance_is_a_partial_order(a in clock(), b in clock(), c in clock()) {
        prop_assert!(a.dominates(&a));
        if a.dominates(&b) && b.dominates(&a) {
            prop_assert_eq!(offsets_only(&a), offsets_only(&b));
        }
        if a.dominates(&b) && b.dominates(&c) {
            prop_assert!(a.dominates(&c));
        }
    }

    #[test]
    fn merge_is_the_least_upper_bound(a in clock(), b in clock(), c in clock()) {
        let m = merged(&a, &b);
        prop_assert!(m.dominates(&a) && m.dominates(&b));
        if c.dominates(&a) && c.dominates(&b) {
            prop_assert!(c.dominates(&m));
        }
    }

    #[test]
    fn dominance_matches_pointwise_definition(a in clock(), b in clock()) {
        let pointwise = b.offsets().iter().all(|claim| a.offset(claim.channel).is_some_and(|n| n >= claim.offset));
        prop_assert_eq!(a.dominates(&b), pointwise);
    }

    #[test]
    fn decode_inverts_encode(a in clock()) {
        let bytes = a.encode();
        prop_assert_eq!(bytes.len(), a.encoded_len());
        prop_assert_eq!(VectorClock::decode(&bytes), Ok(a));
    }

    #[test]
    fn encoding_is_canonical(
        o in prop::collection::vec((channel(), 0..40i64), 0..10),
        s in prop::collection::vec((channel(), sender(), 0..20i64), 0..6),
        seed in any::<u64>(),
    ) {
        let build = |o: &[(Channel, i64)], s: &[(Channel, SenderId, i64)]| {
            let mut c = VectorClock::new();
            for &(ch, n) in o { c.claim_offset(ch, n); }
            for &(ch, snd, q) in s { c.claim_sequence(ch, snd, q); }
            c
        };
        // The same claims in another order give the same bytes.
        let mut o2 = o.clone();
        let mut s2 = s.clone();
        let n = o2.len().max(1);
        o2.rotate_left((seed as usize) % n);
        o2.reverse();
        let n = s2.len().max(1);
        s2.rotate_left((seed as usize / 7) % n);
        s2.reverse();
        let a = build(&o, &s);
        let b = build(&o2, &s2);
        prop_assert_eq!(a.encode(), b.encode());
        // And the sections are strictly sorted.
        prop_assert!(a.offsets().windows(2).all(|w| w[0].channel < w[1].channel));
        prop_assert!(a.sequences().windows(2).all(|w| (w[0].channel, w[0].sender) < (w[1].channel, w[1].sender)));
    }

    #[test]
    fn equal_bytes_iff_equal_clocks(a in clock(), b in clock()) {
        prop_assert_eq!(a == b, a.encode() == b.encode());
    }

    #[test]
    fn truncation_removes_exactly_the_covered_entries(a in clock(), s in clock()) {
        let mut t = a.clone();
        t.truncate(&s);
        for claim in a.offsets() {
            let covered = s.offset(claim.channel).is_some_and(|b| claim.offset <= b);
            prop_assert_eq!(t.offset(claim.channel).is_none(), covered);
        }
        prop_assert_eq!(t.sequences(), a.sequences());
    }

    #[test]
    fn decoding_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(c) = VectorClock::decode(&bytes) {
            prop_assert_eq!(VectorClock::decode(&c.encode()), Ok(c));
        }
    }

    #[test]
    fn decoding_mutated_encodings_never_panics(a in clock(), at in any::<usize>(), bit in 0..8u8, cut in any::<usize>()) {
        let mut bytes = a.encode();
        let i = at % bytes.len();
        bytes[i] ^= 1 << bit;
        let _ = VectorClock::decode(&bytes);
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = VectorClock::decode(&bytes);
    }

    #[test]
    fn header_round_trip(a in clock(), s in proptest::option::of((sender(), 0..i64::MAX))) {
        let h = CausalHeaders { clock: a, sender: s.map(|(sender, seq)| SenderTag { sender, seq }) };
        let encoded = h.encode();
        let decoded = CausalHeaders::decode(encoded.iter().map(|(n, v)| (*n, Some(v.as_slice())))).unwrap();
        prop_assert_eq!(decoded, h);
    }
}

/// Clocks with values across their whole ranges (partitions up to
/// `i32::MAX`, offsets and sequences up to `i64::MAX`), for the compact
/// encoding's varints and differences.
fn wide_clock() -> impl Strategy<Value = VectorClock> {
    let partition = prop_oneof![0..4i32, Just(i32::MAX), 0..i32::MAX];
    let value = prop_oneof![0..300i64, Just(i64::MAX), 0..i64::MAX];
    (
        prop::collection::vec(((topic(), partition.clone()), value.clone()), 0..24),
        prop::collection::vec(((topic(), partition), sender(), value), 0..8),
    )
        .prop_map(|(o, s)| {
            VectorClock::from_claims(
                o.into_iter().map(|((t, p), offset)| OffsetClaim {
                    channel: Channel::new(t, p),
                    offset,
                }),
                s.into_iter().map(|((t, p), sender, seq)| SequenceClaim {
                    channel: Channel::new(t, p),
                    sender,
                    seq,
                }),
            )
        })
}

proptest! {
    #[test]
    fn compact_decode_inverts_encode(a in wide_clock()) {
        let bytes = a.encode_compact();
        prop_assert_eq!(bytes.len(), a.encoded_len_compact());
        prop_assert_eq!(bytes[0], parsley_protocol::clock::CLOCK_VERSION_COMPACT);
        prop_assert_eq!(VectorClock::decode(&bytes), Ok(a.clone()));
        // Both versions say the same thing.
        prop_assert_eq!(VectorClock::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn compact_is_larger_than_version_1_only_by_four_bytes_a_topic(a in wide_clock()) {
        // Per claim the compact form spends at most 5 bytes of partition
        // and 10 of value (and a 16-byte sender), against version 1's 28
        // (44); per topic it adds the id and a count, which a one-claim
        // group with the largest values pays for with 4 bytes over.
        let groups = |topics: Vec<TopicId>| {
            topics.into_iter().collect::<std::collections::BTreeSet<_>>().len()
        };
        let topics = groups(a.offsets().iter().map(|c| c.channel.topic).collect())
            + groups(a.sequences().iter().map(|c| c.channel.topic).collect());
        let (v1, v2) = (a.encoded_len(), a.encoded_len_compact());
        prop_assert!(v2 <= v1 + 4 * topics, "{v2} against {v1} with {topics} groups");
    }

    #[test]
    fn equal_compact_bytes_iff_equal_clocks(a in wide_clock(), b in wide_clock()) {
        prop_assert_eq!(a == b, a.encode_compact() == b.encode_compact());
    }

    #[test]
    fn compact_decoding_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Some(first) = bytes.first_mut() {
            *first = parsley_protocol::clock::CLOCK_VERSION_COMPACT;
        }
        if let Ok(c) = VectorClock::decode(&bytes) {
            prop_assert_eq!(VectorClock::decode(&c.encode_compact()), Ok(c.clone()));
            prop_assert_eq!(VectorClock::decode(&c.encode()), Ok(c));
        }
    }

    #[test]
    fn decoding_mutated_compact_encodings_never_panics(a in wide_clock(), at in any::<usize>(), bit in 0..8u8, cut in any::<usize>()) {
        let mut bytes = a.encode_compact();
        let i = at % bytes.len();
        bytes[i] ^= 1 << bit;
        if let Ok(c) = VectorClock::decode(&bytes) {
            prop_assert_eq!(VectorClock::decode(&c.encode_compact()), Ok(c));
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = VectorClock::decode(&bytes);
    }
}
