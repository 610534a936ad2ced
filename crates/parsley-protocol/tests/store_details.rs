//! Details of the store encodings and containers that no other suite
//! pinned down, each found by a mutant that survived them (see
//! docs/mutation.md): the envelope's sender and length checks, the pair
//! check, and the write batch and memory store the hosts build on.

use parsley_protocol::store::{
    MemStore, StateKey, WriteBatch, decode_envelope, decode_pair, encode_envelope, encode_pair,
};
use parsley_protocol::*;

fn ch(t: u128, p: i32) -> Channel {
    Channel::new(TopicId::from_u128(t), p)
}

/// A held record's envelope, tagged by sender 0xAB with sequence 4.
fn envelope() -> (Channel, Vec<u8>) {
    let c = ch(1, 0);
    let mut clock = VectorClock::new();
    clock.claim_offset(ch(2, 0), 3);
    let record = InboundRecord {
        channel: c,
        offset: 7,
        timestamp: 11,
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        headers: vec![],
        causal: CausalHeaders {
            clock,
            sender: Some(SenderTag {
                sender: SenderId::from_u128(0xAB),
                seq: 4,
            }),
        },
    };
    (c, encode_envelope(&record))
}

// Field positions in an envelope: offset, timestamp, tag flag, sender
// halves, sequence, clock length.
const TAG: usize = 16;
const MSB: usize = 17;
const LSB: usize = 25;
const SEQ: usize = 33;
const CLOCK_LEN: usize = 41;

fn set_i64(bytes: &mut [u8], at: usize, v: i64) {
    bytes[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

#[test]
fn an_untagged_envelope_must_have_every_sender_field_zero() {
    let (c, good) = envelope();
    let untagged = |msb: i64, lsb: i64, seq: i64| {
        let mut b = good.clone();
        b[TAG] = 0;
        set_i64(&mut b, MSB, msb);
        set_i64(&mut b, LSB, lsb);
        set_i64(&mut b, SEQ, seq);
        decode_envelope(c, &b)
    };
    assert_eq!(untagged(0, 0, 0).unwrap().causal.sender, None);
    for (msb, lsb, seq) in [(1, 0, 0), (0, 1, 0), (0, 0, 1)] {
        let err = untagged(msb, lsb, seq).unwrap_err();
        assert!(err.contains("non-zero sender"), "{err}");
    }
}

#[test]
fn a_tagged_envelope_takes_sequence_zero_and_refuses_a_negative_one() {
    let (c, good) = envelope();
    let mut zero = good.clone();
    set_i64(&mut zero, SEQ, 0);
    assert_eq!(
        decode_envelope(c, &zero)
            .unwrap()
            .causal
            .sender
            .unwrap()
            .seq,
        0
    );
    let mut negative = good.clone();
    set_i64(&mut negative, SEQ, -1);
    let err = decode_envelope(c, &negative).unwrap_err();
    assert!(err.contains("negative sender sequence -1"), "{err}");
}

#[test]
fn envelope_length_errors_say_what_is_wrong() {
    let (c, good) = envelope();
    let with_clock_len = |n: i32| {
        let mut b = good.clone();
        b[CLOCK_LEN..CLOCK_LEN + 4].copy_from_slice(&n.to_be_bytes());
        decode_envelope(c, &b).unwrap_err()
    };
    assert!(
        with_clock_len(-1).contains("negative clock length -1"),
        "{}",
        with_clock_len(-1)
    );
    // A zero-length clock is not negative: it is an empty clock, refused
    // by the clock decoder.
    assert!(
        with_clock_len(0).contains("empty input"),
        "{}",
        with_clock_len(0)
    );
    // The key's length field follows the clock bytes.
    let clock_len = i32::from_be_bytes(good[CLOCK_LEN..CLOCK_LEN + 4].try_into().unwrap());
    let key_at = CLOCK_LEN + 4 + clock_len as usize;
    let mut bad_key = good.clone();
    bad_key[key_at..key_at + 4].copy_from_slice(&(-2i32).to_be_bytes());
    let err = decode_envelope(c, &bad_key).unwrap_err();
    assert!(err.contains("invalid key length -2"), "{err}");
}

#[test]
fn a_pair_with_either_value_negative_is_refused() {
    assert_eq!(decode_pair(&encode_pair(0, 5)), Ok((0, 5)));
    assert!(decode_pair(&encode_pair(-1, 5)).is_err());
    assert!(decode_pair(&encode_pair(5, -1)).is_err());
}

#[test]
fn a_write_batch_counts_folds_and_hands_over_its_writes() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut first = WriteBatch::new();
    assert_eq!(first.len(), 0);
    first.put(StateKey::Frontier(a), vec![1, 2, 3]);
    first.put(StateKey::Frontier(b), vec![4]);
    assert_eq!(first.len(), 2);
    let mut later = WriteBatch::new();
    later.delete(StateKey::Frontier(b));
    later.put(StateKey::QueueMeta(a), vec![5]);
    first.extend(later);
    assert_eq!(first.len(), 3);
    assert_eq!(first.get(&StateKey::Frontier(b).to_key()), Some(None));
    assert_eq!(
        format!("{first:?}"),
        format!(
            "{{{:?}: Some(\"3 bytes\"), {:?}: None, {:?}: Some(\"1 bytes\")}}",
            StateKey::Frontier(a).to_key(),
            StateKey::Frontier(b).to_key(),
            StateKey::QueueMeta(a).to_key(),
        )
    );
    let owned: Vec<(String, Option<Vec<u8>>)> = first.into_iter().collect();
    assert_eq!(owned.len(), 3);
    assert_eq!(
        owned[0],
        (StateKey::Frontier(a).to_key(), Some(vec![1, 2, 3]))
    );
}

#[test]
fn a_memory_store_reports_its_size() {
    let a = ch(1, 0);
    let mut store = MemStore::new();
    assert!(store.is_empty());
    assert_eq!((store.len(), store.size_bytes()), (0, 0));
    let mut batch = WriteBatch::new();
    batch.put(StateKey::Frontier(a), vec![0; 8]);
    batch.put(StateKey::QueueMeta(a), vec![0; 16]);
    store.apply(&batch);
    assert!(!store.is_empty());
    assert_eq!(store.len(), 2);
    let keys = StateKey::Frontier(a).to_key().len() + StateKey::QueueMeta(a).to_key().len();
    assert_eq!(store.size_bytes(), keys + 24);
}
