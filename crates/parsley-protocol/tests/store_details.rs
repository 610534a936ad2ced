//! Details of the store encodings and containers that no other suite
//! pinned down, each found by a mutant that survived them (see
//! docs/mutation.md): the envelope's sender and length checks, the pair
//! check, and the write batch and memory store the hosts build on.

use parsley_protocol::store::{
    MemStore, QueueEntryKeys, StateKey, WriteBatch, decode_envelope, decode_pair, encode_envelope,
    encode_i64, encode_pair,
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
    assert_eq!(first.get(StateKey::Frontier(b)), Some(None));
    assert_eq!(
        first.get(StateKey::Frontier(a)),
        Some(Some(&[1u8, 2, 3][..]))
    );
    assert_eq!(first.get(StateKey::Scope), None);
    assert_eq!(
        format!("{first:?}"),
        format!(
            "{{{:?}: Some(\"3 bytes\"), {:?}: None, {:?}: Some(\"1 bytes\")}}",
            StateKey::Frontier(a).to_key(),
            StateKey::Frontier(b).to_key(),
            StateKey::QueueMeta(a).to_key(),
        )
    );
    let owned: Vec<(StateKey, Option<Vec<u8>>)> = first.into_iter().collect();
    assert_eq!(
        owned,
        vec![
            (StateKey::Frontier(a), Some(vec![1, 2, 3])),
            (StateKey::Frontier(b), None),
            (StateKey::QueueMeta(a), Some(vec![5])),
        ]
    );
}

#[test]
fn inline_values_are_the_encoded_bytes() {
    let a = ch(1, 0);
    let mut batch = WriteBatch::new();
    batch.put_i64(StateKey::Frontier(a), 0x0102_0304_0506_0708);
    batch.put_pair(StateKey::QueueMeta(a), 3, -9);
    assert_eq!(
        batch.get(StateKey::Frontier(a)),
        Some(Some(encode_i64(0x0102_0304_0506_0708).as_slice()))
    );
    assert_eq!(
        batch.get(StateKey::QueueMeta(a)),
        Some(Some(encode_pair(3, -9).as_slice()))
    );
    let owned: Vec<(StateKey, Option<Vec<u8>>)> = batch.into_iter().collect();
    assert_eq!(
        owned,
        vec![
            (
                StateKey::Frontier(a),
                Some(encode_i64(0x0102_0304_0506_0708))
            ),
            (StateKey::QueueMeta(a), Some(encode_pair(3, -9))),
        ]
    );
}

proptest::proptest! {
    /// Applying by reference and by value give the same store, and both
    /// match a plain map keyed by each key's text: puts overwrite (longer or
    /// shorter values, inline or not), deletes remove.
    #[test]
    fn applying_a_batch_by_reference_or_by_value_agree(
        steps in proptest::collection::vec(
            proptest::collection::vec((0u8..6, 0u8..4, proptest::option::of(0usize..40)), 0..8),
            1..8,
        )
    ) {
        let mut by_ref = MemStore::new();
        let mut by_value = MemStore::new();
        let mut model: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
        for step in steps {
            let mut batch = WriteBatch::new();
            for (kind, chan, value) in step {
                let c = ch(u128::from(chan), i32::from(chan));
                let key = match kind % 3 {
                    0 => StateKey::Frontier(c),
                    1 => StateKey::QueueMeta(c),
                    _ => StateKey::QueueEntry(c, i64::from(kind)),
                };
                match value {
                    None => {
                        batch.delete(key);
                        model.remove(&key.to_key());
                    }
                    Some(n) if kind >= 3 && n % 2 == 0 => {
                        batch.put_i64(key, n as i64);
                        model.insert(key.to_key(), encode_i64(n as i64));
                    }
                    Some(n) if kind >= 3 => {
                        batch.put_pair(key, n as i64, 7);
                        model.insert(key.to_key(), encode_pair(n as i64, 7));
                    }
                    Some(n) => {
                        batch.put(key, vec![kind; n]);
                        model.insert(key.to_key(), vec![kind; n]);
                    }
                }
            }
            by_ref.apply(&batch);
            by_value.apply_owned(batch);
            let want: Vec<(String, &[u8])> =
                model.iter().map(|(k, v)| (k.clone(), v.as_slice())).collect();
            proptest::prop_assert_eq!(by_ref.iter().collect::<Vec<_>>(), want.clone());
            proptest::prop_assert_eq!(by_value.iter().collect::<Vec<_>>(), want);
        }
    }
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

#[test]
fn causal_header_names_off_the_wire_are_borrowed_and_others_copied() {
    use std::borrow::Cow;
    for name in ["vc", "vc-sender", "vc-seq"] {
        let h = Header::named(name, Some(vec![1]));
        assert!(matches!(h.name, Cow::Borrowed(_)), "{name}");
        assert_eq!((h.name(), h.value.as_deref()), (name, Some(&[1u8][..])));
    }
    let h = Header::named("trace", None);
    assert!(matches!(h.name, Cow::Owned(_)));
    assert_eq!((h.name(), h.value.as_deref()), ("trace", None));
    assert_eq!(
        Header::new("trace", vec![2]),
        Header::named("trace", Some(vec![2]))
    );
}

#[test]
fn stamp_headers_match_the_encoded_pairs() {
    let mut clock = VectorClock::new();
    clock.claim_offset(ch(2, 0), 3);
    for sender in [
        None,
        Some(SenderTag {
            sender: SenderId::from_u128(0xAB),
            seq: 9,
        }),
    ] {
        let stamp = CausalHeaders {
            clock: clock.clone(),
            sender,
        };
        let mut headers = vec![Header::new("user", vec![0])];
        stamp.encode_headers_into(&mut headers);
        let want: Vec<(String, Option<Vec<u8>>)> =
            std::iter::once(("user".to_owned(), Some(vec![0])))
                .chain(
                    stamp
                        .encode()
                        .into_iter()
                        .map(|(n, v)| (n.to_owned(), Some(v))),
                )
                .collect();
        let got: Vec<(String, Option<Vec<u8>>)> = headers
            .into_iter()
            .map(|h| (h.name.into_owned(), h.value))
            .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn raw_access_keeps_protocol_keys_parsed_and_anything_else_as_text() {
    let a = ch(1, 0);
    let key = StateKey::Frontier(a);
    let mut store = MemStore::new();
    assert_eq!(store.insert_raw(&key.to_key(), encode_i64(4)), None);
    assert_eq!(store.get_state(key), Some(encode_i64(4).as_slice()));
    assert_eq!(store.get(&key.to_key()), Some(encode_i64(4).as_slice()));
    // Upper-case hex is not the key's spelling: kept apart, as text.
    let alias = key.to_key().to_uppercase();
    store.insert_raw(&alias, vec![1]);
    assert_eq!(store.len(), 2);
    assert_eq!(store.size_bytes(), 2 * key.to_key().len() + 8 + 1);
    assert_eq!(store.get(&alias), Some(&[1u8][..]));
    let mut seen = Vec::new();
    store.for_each_state(&mut |k, v| seen.push((k.map_err(str::to_owned), v.to_vec())));
    assert_eq!(
        seen,
        vec![(Ok(key), encode_i64(4)), (Err(alias.clone()), vec![1])]
    );
    store.get_raw_mut(&key.to_key()).unwrap().push(0);
    assert_eq!(store.get_state(key).map(<[u8]>::len), Some(9));
    assert_eq!(store.remove_raw(&alias), Some(vec![1]));
    assert_eq!(store.remove_raw(&key.to_key()).map(|v| v.len()), Some(9));
    assert!(store.is_empty());
}

#[test]
fn a_store_of_parsed_keys_reads_back_as_its_text_does() {
    let a = ch(1, 0);
    let mut store = MemStore::new();
    let mut batch = WriteBatch::new();
    batch.put_i64(StateKey::Frontier(a), 3);
    batch.put_pair(StateKey::QueueMeta(a), 0, 0);
    batch.put(StateKey::CarriedAncestry, VectorClock::new().encode());
    store.apply(&batch);
    let text: std::collections::BTreeMap<String, Vec<u8>> =
        store.iter().map(|(k, v)| (k, v.to_vec())).collect();
    let collect = |s: &dyn StoreRead| {
        let mut all = Vec::new();
        s.for_each_state(&mut |k, v| all.push((k.map_err(str::to_owned), v.to_vec())));
        all.sort();
        all
    };
    assert_eq!(collect(&store), collect(&text));
    let mut entries = Vec::new();
    store.for_each_entry(&mut |k, v| entries.push((k.to_owned(), v.to_vec())));
    entries.sort();
    assert_eq!(entries, text.into_iter().collect::<Vec<_>>());
}

#[test]
fn queue_entry_keys_read_only_their_own_queues_entries() {
    let (a, b) = (ch(1, 0), ch(1, 1));
    let keys = QueueEntryKeys::new(a);
    for index in [0, 1, 0x7f, i64::MAX] {
        let own = StateKey::QueueEntry(a, index).to_key();
        assert_eq!(keys.index(own.as_bytes()), Some(index), "{own}");
        // Another queue's entry, or another key of this queue: not ours.
        let other = StateKey::QueueEntry(b, index).to_key();
        assert_eq!(keys.index(other.as_bytes()), None, "{other}");
    }
    assert_eq!(keys.index(StateKey::QueueMeta(a).to_key().as_bytes()), None);
    assert_eq!(
        keys.index(StateKey::Stepped(a, 1).to_key().as_bytes()),
        None
    );
    // Not the key's spelling (upper case, one digit short or long).
    let own = StateKey::QueueEntry(a, 0xab).to_key();
    assert_eq!(keys.index(own.to_uppercase().as_bytes()), None);
    assert_eq!(keys.index(&own.as_bytes()[..own.len() - 1]), None);
    assert_eq!(keys.index(format!("{own}0").as_bytes()), None);
    assert_eq!(
        keys.index(
            own.replace("00000000000000ab", "000000000000000g")
                .as_bytes()
        ),
        None
    );
}

/// A page of several records stays within its byte bound, headers
/// counted, and fills up to close to it.
#[test]
fn a_page_fills_to_its_byte_bound_and_not_past_it() {
    use parsley_protocol::store::{PAGE_BYTES, PageBuilder, PageEntries};
    let c = ch(1, 0);
    let record = |offset: i64| InboundRecord {
        channel: c,
        offset,
        timestamp: 0,
        key: Some(vec![1; 10]),
        value: Some(vec![2; 900]),
        headers: vec![
            Header {
                name: "trace-id".into(),
                value: Some(vec![3; 200]),
            },
            Header {
                name: "empty".into(),
                value: None,
            },
        ],
        causal: CausalHeaders {
            clock: VectorClock::new(),
            sender: None,
        },
    };
    let mut page = PageBuilder::new();
    let mut n = 0;
    while page.fits(&record(n)) {
        page.push(&record(n));
        n += 1;
    }
    let bytes = page.finish();
    assert!(bytes.len() <= PAGE_BYTES, "{} bytes", bytes.len());
    let one = 4 + encode_envelope(&record(0)).len();
    assert!(bytes.len() + one > PAGE_BYTES, "{} bytes", bytes.len());
    let back: Vec<_> = PageEntries::new(&bytes)
        .unwrap()
        .map(|e| decode_envelope(c, e).unwrap())
        .collect();
    assert_eq!(back, (0..n).map(record).collect::<Vec<_>>());
}

#[test]
fn a_page_builder_gives_the_same_bytes_however_its_buffer_grew() {
    use parsley_protocol::store::{PageBuilder, PageEntries};
    // Nothing pushed: a count of zero, which no reader takes as a page.
    assert_eq!(PageBuilder::new().finish(), vec![0, 0, 0, 0]);
    assert!(PageEntries::new(&PageBuilder::new().finish()).is_err());
    let (c, one) = envelope();
    let record = decode_envelope(c, &one).unwrap();
    for n in 1..4usize {
        let mut page = PageBuilder::new();
        for _ in 0..n {
            page.push(&record);
        }
        let mut want = (n as i32).to_be_bytes().to_vec();
        for _ in 0..n {
            want.extend_from_slice(&(one.len() as i32).to_be_bytes());
            want.extend_from_slice(&one);
        }
        assert_eq!(page.finish(), want, "{n} records");
    }
}

#[test]
fn a_page_of_more_records_than_a_page_may_hold_is_refused() {
    use parsley_protocol::store::{PAGE_RECORDS, PageBuilder, PageEntries};
    let (c, one) = envelope();
    let record = decode_envelope(c, &one).unwrap();
    let mut full = PageBuilder::new();
    let mut over = PageBuilder::new();
    for _ in 0..PAGE_RECORDS {
        full.push(&record);
        over.push(&record);
    }
    // A builder refuses the next record; pushing it anyway makes a page
    // no reader takes (readers look for an index at most a page below it).
    assert!(!over.fits(&record));
    over.push(&record);
    assert_eq!(PageEntries::count(&full.finish()), Ok(PAGE_RECORDS));
    let err = PageEntries::new(&over.finish()).unwrap_err();
    assert!(err.contains("257 records"), "{err}");
}

/// A held record for the checker property: up to four offset and two
/// sequence claims, optional key, value and sender tag, and up to two
/// headers.
fn arbitrary_record() -> impl proptest::strategy::Strategy<Value = InboundRecord> {
    use proptest::prelude::*;
    let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..6));
    (
        0i64..1_000,
        proptest::collection::vec((0u128..4, 0i32..3, 0i64..500), 0..4),
        proptest::collection::vec((0u128..4, 0i32..3, 0u128..3, 0i64..50), 0..2),
        bytes(),
        bytes(),
        proptest::option::of((0u128..3, 0i64..9)),
        proptest::collection::vec(("[a-z]{0,3}", bytes()), 0..2),
    )
        .prop_map(|(offset, offsets, seqs, key, value, tag, headers)| {
            let mut clock = VectorClock::new();
            for (t, p, o) in offsets {
                clock.claim_offset(ch(t, p), o);
            }
            for (t, p, s, q) in seqs {
                clock.claim_sequence(ch(t, p), SenderId::from_u128(s), q);
            }
            InboundRecord {
                channel: ch(1, 0),
                offset,
                timestamp: 5,
                key,
                value,
                headers: headers
                    .into_iter()
                    .map(|(name, value)| Header {
                        name: name.into(),
                        value,
                    })
                    .collect(),
                causal: CausalHeaders {
                    clock,
                    sender: tag.map(|(s, seq)| SenderTag {
                        sender: SenderId::from_u128(s),
                        seq,
                    }),
                },
            }
        })
}

/// The envelope with its clock replaced by `clock`'s bytes.
fn with_clock(envelope: &[u8], clock: &[u8]) -> Vec<u8> {
    let old = i32::from_be_bytes(envelope[CLOCK_LEN..CLOCK_LEN + 4].try_into().unwrap()) as usize;
    let mut out = envelope[..CLOCK_LEN].to_vec();
    out.extend_from_slice(&(clock.len() as i32).to_be_bytes());
    out.extend_from_slice(clock);
    out.extend_from_slice(&envelope[CLOCK_LEN + 4 + old..]);
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// A restore keeps held records as their envelopes, checked by
    /// `check_envelope` instead of decoded: the check must accept exactly
    /// what the decoder accepts, give the decoder's reason for what it
    /// refuses, and count the record as the decoded record counts itself.
    /// The envelopes are a record's own (canonical), its clock in the
    /// compact version, its clock with an entry twice (which the decoder
    /// merges) or its entries reversed (which the decoder sorts), and each
    /// of those with one byte changed or cut short.
    #[test]
    fn the_envelope_check_agrees_with_the_decoder(
        record in arbitrary_record(),
        form in 0u8..4,
        change in proptest::option::of((proptest::prelude::any::<proptest::sample::Index>(), 0u8..3, proptest::prelude::any::<u8>())),
    ) {
        use parsley_protocol::store::check_envelope;
        let c = ch(1, 0);
        let own = encode_envelope(&record);
        let clock = &record.causal.clock;
        let mut bytes = match form {
            0 => own,
            1 => with_clock(&own, &clock.encode_compact()),
            2 if !clock.offsets().is_empty() => {
                // The first offset entry twice: the decoder merges them.
                let mut doubled = clock.encode();
                let n = clock.offsets().len() as i32;
                doubled[1..5].copy_from_slice(&(n + 1).to_be_bytes());
                let first: Vec<u8> = doubled[5..33].to_vec();
                doubled.splice(5..5, first);
                with_clock(&own, &doubled)
            }
            _ => {
                let mut reversed = clock.encode();
                let n = clock.offsets().len();
                let entries = &mut reversed[5..5 + 28 * n];
                let mut chunks: Vec<[u8; 28]> =
                    entries.chunks(28).map(|e| e.try_into().unwrap()).collect();
                chunks.reverse();
                entries.copy_from_slice(&chunks.concat());
                with_clock(&own, &reversed)
            }
        };
        if let Some((at, how, byte)) = change {
            let at = at.index(bytes.len());
            match how {
                0 => bytes[at] = byte,
                1 => bytes.truncate(at),
                _ => bytes[at] ^= 0x80,
            }
        }
        let want = decode_envelope(c, &bytes).map(|r| (r.offset, r.held_size()));
        proptest::prop_assert_eq!(check_envelope(&bytes), want);
    }
}
