//! Details of the clock that the property suites did not pin down, each
//! found by a mutant that survived them (see docs/mutation.md): the
//! boundary values of the claim methods, the return values of the removing
//! methods, emptiness, and the debug and error text.

use parsley_protocol::clock::ClockSection;
use parsley_protocol::*;

fn ch(t: u128, p: i32) -> Channel {
    Channel::new(TopicId::from_u128(t), p)
}

#[test]
fn zero_is_a_claim_and_a_negative_value_is_not() {
    let mut c = VectorClock::new();
    assert!(c.claim_offset(ch(1, 0), 0));
    assert_eq!(c.offset(ch(1, 0)), Some(0));
    assert!(!c.claim_offset(ch(2, 0), -1));
    assert_eq!(c.offset(ch(2, 0)), None);
    let s = SenderId::from_u128(9);
    assert!(c.claim_sequence(ch(1, 0), s, 0));
    assert_eq!(c.sequence(ch(1, 0), s), Some(0));
    assert!(!c.claim_sequence(ch(2, 0), s, -1));
    assert_eq!(c.sequence(ch(2, 0), s), None);
}

#[test]
fn a_clock_is_empty_only_without_any_claim() {
    assert!(VectorClock::new().is_empty());
    let mut offsets = VectorClock::new();
    offsets.claim_offset(ch(1, 0), 3);
    assert!(!offsets.is_empty());
    let mut sequences = VectorClock::new();
    sequences.claim_sequence(ch(1, 0), SenderId::from_u128(2), 1);
    assert!(!sequences.is_empty());
}

#[test]
fn truncate_and_remove_topic_say_whether_they_removed_anything() {
    let (t, u) = (ch(1, 0), ch(2, 0));
    let mut c = VectorClock::new();
    c.claim_offset(t, 5);
    c.claim_offset(u, 5);
    let mut below = VectorClock::new();
    below.claim_offset(t, 4);
    assert!(!c.truncate(&below));
    let mut above = VectorClock::new();
    above.claim_offset(t, 5);
    assert!(c.truncate(&above));
    assert_eq!(c.offset(t), None);
    assert_eq!(c.offset(u), Some(5));

    // One offset claim on the topic, no sequence claims.
    let mut only_offset = VectorClock::new();
    only_offset.claim_offset(t, 1);
    assert!(only_offset.remove_topic(t.topic));
    assert!(only_offset.is_empty());
    assert!(!only_offset.remove_topic(t.topic));
    // More sequence claims than offset claims.
    let s = SenderId::from_u128(3);
    let mut mixed = VectorClock::new();
    mixed.claim_offset(u, 1);
    mixed.claim_sequence(t, s, 1);
    mixed.claim_sequence(ch(3, 0), s, 1);
    assert!(mixed.remove_topic(t.topic));
    assert_eq!(mixed.sequences().len(), 1);
    assert_eq!(mixed.offsets().len(), 1);
}

#[test]
fn debug_lists_every_claim_separated_by_commas() {
    let s = SenderId::from_u128(0xABC);
    let mut c = VectorClock::new();
    assert_eq!(format!("{c:?}"), "{}");
    c.claim_offset(ch(1, 0), 4);
    c.claim_offset(ch(2, 1), 7);
    c.claim_sequence(ch(3, 0), s, 2);
    assert_eq!(
        format!("{c:?}"),
        format!("{{{}@4, {}@7, {}#{s}/2}}", ch(1, 0), ch(2, 1), ch(3, 0))
    );
    let mut only_sequence = VectorClock::new();
    only_sequence.claim_sequence(ch(3, 0), s, 2);
    assert_eq!(
        format!("{only_sequence:?}"),
        format!("{{{}#{s}/2}}", ch(3, 0))
    );
}

#[test]
fn sections_are_named_in_errors() {
    assert_eq!(ClockSection::Offsets.to_string(), "offset");
    assert_eq!(ClockSection::Sequences.to_string(), "sequence");
}

#[test]
fn removing_what_is_not_there_reports_no_change() {
    let s = SenderId::from_u128(3);
    let mut c = VectorClock::new();
    c.claim_offset(ch(2, 0), 1);
    c.claim_offset(ch(4, 0), 1);
    c.claim_sequence(ch(5, 0), s, 1);
    let before = c.clone();
    assert!(!c.remove_topic(TopicId::from_u128(1)));
    assert!(!c.retain_sequences(|_| true));
    assert_eq!(c, before);
    assert!(c.retain_sequences(|q| q.channel != ch(5, 0)));
    assert!(c.sequences().is_empty());
    // More sequence claims than offset claims, none on the topic.
    let mut more = VectorClock::new();
    more.claim_offset(ch(2, 0), 1);
    more.claim_sequence(ch(5, 0), s, 1);
    more.claim_sequence(ch(6, 0), s, 1);
    assert!(!more.remove_topic(TopicId::from_u128(1)));
}

/// Raw version-1 bytes: entries as given, in the order given.
fn raw(offsets: &[(Channel, i64)], sequences: &[(Channel, SenderId, i64)]) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend_from_slice(&(offsets.len() as i32).to_be_bytes());
    for (c, o) in offsets {
        let (msb, lsb) = (c.topic.msb(), c.topic.lsb());
        out.extend_from_slice(&msb.to_be_bytes());
        out.extend_from_slice(&lsb.to_be_bytes());
        out.extend_from_slice(&c.partition.to_be_bytes());
        out.extend_from_slice(&o.to_be_bytes());
    }
    out.extend_from_slice(&(sequences.len() as i32).to_be_bytes());
    for (c, s, q) in sequences {
        let (msb, lsb) = (c.topic.msb(), c.topic.lsb());
        let (smsb, slsb) = (s.msb(), s.lsb());
        out.extend_from_slice(&msb.to_be_bytes());
        out.extend_from_slice(&lsb.to_be_bytes());
        out.extend_from_slice(&c.partition.to_be_bytes());
        out.extend_from_slice(&smsb.to_be_bytes());
        out.extend_from_slice(&slsb.to_be_bytes());
        out.extend_from_slice(&q.to_be_bytes());
    }
    out
}

#[test]
fn decode_names_the_first_bad_entry_exactly() {
    let s = SenderId::from_u128(3);
    let (a, b, c) = (ch(1, 0), ch(2, 0), ch(3, 0));
    // Partition 0 and offset 0 are fine; index 1 has the negative offset.
    let err = VectorClock::decode(&raw(&[(a, 0), (b, -5), (c, 1)], &[])).unwrap_err();
    assert_eq!(
        err,
        CorruptClock::NegativeOffset {
            index: 1,
            offset: -5
        }
    );
    // Both fields negative in one entry: still refused, as its partition.
    let err = VectorClock::decode(&raw(&[(a, 1), (ch(2, -3), -1)], &[])).unwrap_err();
    assert_eq!(
        err,
        CorruptClock::NegativePartition {
            section: parsley_protocol::clock::ClockSection::Offsets,
            index: 1,
            partition: -3
        }
    );
    let err = VectorClock::decode(&raw(&[], &[(a, s, 0), (b, s, -2)])).unwrap_err();
    assert_eq!(err, CorruptClock::NegativeSequence { index: 1, seq: -2 });
    let err = VectorClock::decode(&raw(&[], &[(ch(1, -1), s, -1)])).unwrap_err();
    assert_eq!(
        err,
        CorruptClock::NegativePartition {
            section: parsley_protocol::clock::ClockSection::Sequences,
            index: 0,
            partition: -1
        }
    );
}

#[test]
fn decode_puts_entries_in_canonical_order_whatever_the_wire_order() {
    let s = SenderId::from_u128(3);
    // Topics whose signed halves order differently from their unsigned
    // ones, partitions rising while topics fall.
    let hi = Channel::new(TopicId::from_halves(1, 0), 0);
    let lo = Channel::new(TopicId::from_halves(-1, 0), 1);
    let mid = Channel::new(TopicId::from_halves(0, -1), 2);
    let decoded = VectorClock::decode(&raw(
        &[(hi, 1), (mid, 2), (lo, 3)],
        &[(hi, s, 1), (lo, s, 2)],
    ))
    .unwrap();
    let mut expected = VectorClock::new();
    expected.claim_offset(hi, 1);
    expected.claim_offset(mid, 2);
    expected.claim_offset(lo, 3);
    expected.claim_sequence(hi, s, 1);
    expected.claim_sequence(lo, s, 2);
    assert_eq!(decoded, expected);
    assert_eq!(decoded.encode(), expected.encode());
}

mod any_wire_order {
    use super::raw;
    use parsley_protocol::*;
    use proptest::prelude::*;

    /// Ids on both sides of the signed-order boundary, in both halves.
    fn channel() -> impl Strategy<Value = Channel> {
        let topic = prop_oneof![
            Just(TopicId::from_halves(i64::MIN, 1)),
            Just(TopicId::from_halves(-1, 5)),
            Just(TopicId::from_halves(0, -1)),
            Just(TopicId::from_halves(1, i64::MIN)),
            Just(TopicId::from_halves(1, 2)),
            Just(TopicId::from_halves(i64::MAX, -1)),
        ];
        (topic, 0..3i32).prop_map(|(t, p)| Channel::new(t, p))
    }

    fn sender() -> impl Strategy<Value = SenderId> {
        prop_oneof![
            Just(SenderId::from_halves(i64::MIN, 0)),
            Just(SenderId::from_halves(3, 3)),
            Just(SenderId::from_halves(3, -3)),
        ]
    }

    proptest! {
        /// Entries in any order, repeated or not: decoding yields the
        /// canonical clock of the same claims (a repeated entry merged by
        /// maximum).
        #[test]
        fn decode_canonicalises(
            offsets in prop::collection::vec((channel(), 0..40i64), 0..12),
            sequences in prop::collection::vec((channel(), sender(), 0..20i64), 0..8),
        ) {
            let decoded = VectorClock::decode(&raw(&offsets, &sequences)).unwrap();
            let expected = VectorClock::from_claims(
                offsets.iter().map(|&(channel, offset)| OffsetClaim { channel, offset }),
                sequences.iter().map(|&(channel, sender, seq)| SequenceClaim { channel, sender, seq }),
            );
            prop_assert_eq!(&decoded, &expected);
            let mut max = std::collections::BTreeMap::new();
            for &(c, o) in &offsets {
                let e = max.entry(c).or_insert(o);
                *e = (*e).max(o);
            }
            prop_assert!(decoded.offsets().windows(2).all(|w| w[0].channel < w[1].channel));
            prop_assert!(decoded.sequences().windows(2).all(|w| (w[0].channel, w[0].sender) < (w[1].channel, w[1].sender)));
            prop_assert_eq!(decoded.offsets().len(), max.len());
            for (c, o) in max {
                prop_assert_eq!(decoded.offset(c), Some(o));
            }
        }
    }
}

/// Every ordered pair of ids across the sign boundaries of both halves:
/// decoding two entries in either order yields them in canonical order. A
/// two-entry input is sorted under some order, so an order check that
/// disagrees with the canonical one on any pair lets it through unsorted.
#[test]
fn decode_orders_every_pair_of_ids_canonically() {
    let edges = [i64::MIN, -1, 0, 1, i64::MAX];
    let ids: Vec<(i64, i64)> = edges
        .iter()
        .flat_map(|&m| edges.iter().map(move |&l| (m, l)))
        .collect();
    let channel = |(m, l): (i64, i64)| Channel::new(TopicId::from_halves(m, l), 0);
    let sender = |(m, l): (i64, i64)| SenderId::from_halves(m, l);
    let fixed = ch(1, 0);
    for &x in &ids {
        for &y in &ids {
            if x == y {
                continue;
            }
            let decoded =
                VectorClock::decode(&raw(&[(channel(x), 1), (channel(y), 2)], &[])).unwrap();
            let o = decoded.offsets();
            assert!(o[0].channel < o[1].channel, "{x:?} {y:?}: {decoded:?}");
            let decoded =
                VectorClock::decode(&raw(&[], &[(fixed, sender(x), 1), (fixed, sender(y), 2)]))
                    .unwrap();
            let s = decoded.sequences();
            assert!(s[0].sender < s[1].sender, "{x:?} {y:?}: {decoded:?}");
        }
    }
}
