//! The compatibility surface pinned to literal bytes and literal names.
//!
//! Every expected byte string here is written out by hand, never produced by
//! the encoder under test, so a coordinated change to both sides of a codec
//! cannot pass silently. The record headers cross applications (and the
//! Java implementation); the store layouts cross versions of one application.

mod common;

use common::*;
use parsley_protocol::clock::ClockSection;
use parsley_protocol::store::{
    ScopeRecord, decode_envelope, decode_i64, decode_pair, encode_envelope,
};
use parsley_protocol::*;

/// msb 1, lsb 2: "00000000-0000-0001-0000-000000000002".
const T1: TopicId = TopicId::from_halves(1, 2);
/// Top bit set: sorts before every id whose top bit is clear.
const THIGH: TopicId = TopicId::from_halves(i64::MIN, 1);
/// Same msb as T1, negative lsb: sorts before T1.
const TLSB: TopicId = TopicId::from_halves(1, i64::MIN);
/// "00000000-0000-000a-0000-00000000000b".
const S1: SenderId = SenderId::from_halves(10, 11);
const SHIGH: SenderId = SenderId::from_halves(i64::MIN, 0);

fn c(t: TopicId, p: i32) -> Channel {
    Channel::new(t, p)
}

const EMPTY_CLOCK: &str = "01 00000000 00000000";

#[test]
fn empty_clock() {
    assert_eq!(VectorClock::new().encode(), hex(EMPTY_CLOCK));
    assert_eq!(
        VectorClock::decode(&hex(EMPTY_CLOCK)).unwrap(),
        VectorClock::new()
    );
}

#[test]
fn offsets_only() {
    let bytes = hex("01
         00000001
           0000000000000001 0000000000000002 00000000 0000000000000029
         00000000");
    let clock = offsets(&[(c(T1, 0), 41)]);
    assert_eq!(clock.encode(), bytes);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
    assert_eq!(clock.encoded_len(), bytes.len());
}

#[test]
fn sequences_only() {
    let bytes = hex(
        "01
         00000000
         00000001
           0000000000000001 0000000000000002 00000001 000000000000000a 000000000000000b 0000000000000007",
    );
    let clock = seqs(&[(c(T1, 1), S1, 7)]);
    assert_eq!(clock.encode(), bytes);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

#[test]
fn both_sections() {
    let bytes = hex(
        "01
         00000001
           0000000000000001 0000000000000002 00000000 0000000000000029
         00000001
           0000000000000001 0000000000000002 00000001 000000000000000a 000000000000000b 0000000000000007",
    );
    let mut clock = offsets(&[(c(T1, 0), 41)]);
    clock.claim_sequence(c(T1, 1), S1, 7);
    assert_eq!(clock.encode(), bytes);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

/// The canonical order is Java's UUID order: signed msb, then signed lsb,
/// then partition; for sequences, channel then sender the same way.
const SORTED: &str = "01
     00000004
       8000000000000000 0000000000000001 00000002 0000000000000006
       0000000000000001 8000000000000000 00000000 0000000000000007
       0000000000000001 0000000000000002 00000000 0000000000000005
       0000000000000001 0000000000000002 00000003 0000000000000008
     00000002
       0000000000000001 0000000000000002 00000000 8000000000000000 0000000000000000 0000000000000002
       0000000000000001 0000000000000002 00000000 000000000000000a 000000000000000b 0000000000000001";

#[test]
fn unsorted_input_encodes_sorted_including_top_bit_ids() {
    let mut clock = VectorClock::new();
    clock.claim_offset(c(T1, 3), 8);
    clock.claim_offset(c(T1, 0), 5);
    clock.claim_offset(c(TLSB, 0), 7);
    clock.claim_offset(c(THIGH, 2), 6);
    clock.claim_sequence(c(T1, 0), S1, 1);
    clock.claim_sequence(c(T1, 0), SHIGH, 2);
    assert_eq!(clock.encode(), hex(SORTED));
}

#[test]
fn decoding_accepts_any_entry_order() {
    // The same entries as SORTED, reversed within each section.
    let reversed = hex(
        "01
         00000004
           0000000000000001 0000000000000002 00000003 0000000000000008
           0000000000000001 0000000000000002 00000000 0000000000000005
           0000000000000001 8000000000000000 00000000 0000000000000007
           8000000000000000 0000000000000001 00000002 0000000000000006
         00000002
           0000000000000001 0000000000000002 00000000 000000000000000a 000000000000000b 0000000000000001
           0000000000000001 0000000000000002 00000000 8000000000000000 0000000000000000 0000000000000002",
    );
    let clock = VectorClock::decode(&reversed).unwrap();
    assert_eq!(clock.encode(), hex(SORTED));
    assert_eq!(clock, VectorClock::decode(&hex(SORTED)).unwrap());
}

#[test]
fn duplicate_entries_merge_by_maximum() {
    let bytes = hex(
        "01
         00000003
           0000000000000001 0000000000000002 00000000 0000000000000009
           0000000000000001 0000000000000002 00000000 0000000000000005
           0000000000000001 0000000000000002 00000000 0000000000000007
         00000002
           0000000000000001 0000000000000002 00000000 000000000000000a 000000000000000b 0000000000000001
           0000000000000001 0000000000000002 00000000 000000000000000a 000000000000000b 0000000000000004",
    );
    let clock = VectorClock::decode(&bytes).unwrap();
    assert_eq!(
        clock.offsets(),
        &[OffsetClaim {
            channel: c(T1, 0),
            offset: 9
        }]
    );
    assert_eq!(
        clock.sequences(),
        &[SequenceClaim {
            channel: c(T1, 0),
            sender: S1,
            seq: 4
        }]
    );
}

#[test]
fn malformed_clocks_are_rejected() {
    let cases: Vec<(&str, String, CorruptClock)> = vec![
        ("empty", String::new(), CorruptClock::Empty),
        ("version 0", "00 00000000 00000000".into(), CorruptClock::UnknownVersion(0)),
        // Version 2 is the compact form: these bytes are not one of it.
        ("version 2, laid out as 1", "02 00000000 00000000".into(), CorruptClock::TrailingBytes(6)),
        ("version 3", "03 00000000 00000000".into(), CorruptClock::UnknownVersion(3)),
        (
            "negative offset count",
            "01 ffffffff 00000000".into(),
            CorruptClock::NegativeCount { section: ClockSection::Offsets, count: -1 },
        ),
        (
            "negative sequence count",
            "01 00000000 80000000".into(),
            CorruptClock::NegativeCount { section: ClockSection::Sequences, count: i32::MIN },
        ),
        (
            "count header cut short",
            "01 0000".into(),
            CorruptClock::Truncated { section: ClockSection::Offsets, at: 1, needed: 4, available: 2 },
        ),
        (
            "huge count with no data (must not allocate)",
            "01 7fffffff 00000000".into(),
            CorruptClock::Truncated {
                section: ClockSection::Offsets,
                at: 5,
                needed: 0x7fff_ffff * 28,
                available: 4,
            },
        ),
        (
            "entry cut short",
            "01 00000001 0000000000000001 0000000000000002 00000000 00000000000000".into(),
            CorruptClock::Truncated { section: ClockSection::Offsets, at: 5, needed: 28, available: 27 },
        ),
        (
            "sequence section missing",
            "01 00000000".into(),
            CorruptClock::Truncated { section: ClockSection::Sequences, at: 5, needed: 4, available: 0 },
        ),
        (
            "sequence entry cut short",
            "01 00000000 00000001 0000000000000001".into(),
            CorruptClock::Truncated { section: ClockSection::Sequences, at: 9, needed: 44, available: 8 },
        ),
        (
            "negative partition in an offset entry",
            "01 00000001 0000000000000001 0000000000000002 ffffffff 0000000000000001 00000000".into(),
            CorruptClock::NegativePartition { section: ClockSection::Offsets, index: 0, partition: -1 },
        ),
        (
            "negative offset",
            "01 00000001 0000000000000001 0000000000000002 00000000 ffffffffffffffff 00000000".into(),
            CorruptClock::NegativeOffset { index: 0, offset: -1 },
        ),
        (
            "negative partition in a sequence entry",
            "01 00000000 00000001 0000000000000001 0000000000000002 fffffffe 000000000000000a 000000000000000b 0000000000000001"
                .into(),
            CorruptClock::NegativePartition { section: ClockSection::Sequences, index: 0, partition: -2 },
        ),
        (
            "negative sequence",
            "01 00000000 00000001 0000000000000001 0000000000000002 00000000 000000000000000a 000000000000000b 8000000000000000"
                .into(),
            CorruptClock::NegativeSequence { index: 0, seq: i64::MIN },
        ),
        ("trailing bytes", "01 00000000 00000000 00 00".into(), CorruptClock::TrailingBytes(2)),
    ];
    for (name, input, expected) in cases {
        assert_eq!(
            VectorClock::decode(&hex(&input)),
            Err(expected),
            "case: {name}"
        );
    }
}

#[test]
fn headers_encode_to_literal_bytes() {
    let h = CausalHeaders {
        clock: offsets(&[(c(T1, 0), 41)]),
        sender: Some(SenderTag { sender: S1, seq: 3 }),
    };
    assert_eq!(
        h.encode(),
        vec![
            (
                "vc",
                hex(
                    "01 00000001 0000000000000001 0000000000000002 00000000 0000000000000029 00000000"
                )
            ),
            ("vc-sender", hex("000000000000000a 000000000000000b")),
            ("vc-seq", hex("0000000000000003")),
        ]
    );
    assert_eq!(headers::CLOCK_HEADER, "vc");
    assert_eq!(headers::SENDER_HEADER, "vc-sender");
    assert_eq!(headers::SEQ_HEADER, "vc-seq");
    // An unstamped-sender record still carries vc.
    assert_eq!(
        CausalHeaders::default().encode(),
        vec![("vc", hex(EMPTY_CLOCK))]
    );
}

fn decode_headers(hs: &[(&str, Option<&str>)]) -> Result<CausalHeaders, CorruptHeader> {
    let owned: Vec<(String, Option<Vec<u8>>)> = hs
        .iter()
        .map(|(n, v)| (n.to_string(), v.map(hex)))
        .collect();
    CausalHeaders::decode(owned.iter().map(|(n, v)| (n.as_str(), v.as_deref())))
}

#[test]
fn headers_decode_strictly() {
    let vc = "01 00000001 0000000000000001 0000000000000002 00000000 0000000000000029 00000000";
    let sender = "000000000000000a 000000000000000b";
    let seq = "0000000000000003";
    // Complete, with an unrelated header in between.
    let ok = decode_headers(&[
        ("vc", Some(vc)),
        ("trace-id", Some("ff")),
        ("vc-sender", Some(sender)),
        ("vc-seq", Some(seq)),
    ])
    .unwrap();
    assert_eq!(ok.clock, offsets(&[(c(T1, 0), 41)]));
    assert_eq!(ok.sender, Some(SenderTag { sender: S1, seq: 3 }));
    // Absent vc is the empty clock; absent sender and seq is no tag.
    assert_eq!(
        decode_headers(&[("other", None)]).unwrap(),
        CausalHeaders::default()
    );
    // Every corrupt shape is an error, never "no claim".
    type Case<'a> = (&'a str, Vec<(&'a str, Option<&'a str>)>, CorruptHeader);
    let bad: Vec<Case> = vec![
        (
            "sender without seq",
            vec![("vc-sender", Some(sender))],
            CorruptHeader::SenderWithoutSeq,
        ),
        (
            "seq without sender",
            vec![("vc-seq", Some(seq))],
            CorruptHeader::SeqWithoutSender,
        ),
        (
            "short sender",
            vec![
                ("vc-sender", Some("000000000000000a 0000000000000b")),
                ("vc-seq", Some(seq)),
            ],
            CorruptHeader::SenderLength(15),
        ),
        (
            "long seq",
            vec![
                ("vc-sender", Some(sender)),
                ("vc-seq", Some("000000000000000003")),
            ],
            CorruptHeader::SeqLength(9),
        ),
        (
            "negative seq",
            vec![
                ("vc-sender", Some(sender)),
                ("vc-seq", Some("ffffffffffffffff")),
            ],
            CorruptHeader::NegativeSeq(-1),
        ),
        (
            "undecodable clock",
            vec![("vc", Some("03 00000000 00000000"))],
            CorruptHeader::Clock(CorruptClock::UnknownVersion(3)),
        ),
        (
            "null clock",
            vec![("vc", None)],
            CorruptHeader::NullValue("vc"),
        ),
        (
            "duplicate clock",
            vec![("vc", Some(EMPTY_CLOCK)), ("vc", Some(EMPTY_CLOCK))],
            CorruptHeader::Duplicate("vc"),
        ),
    ];
    for (name, hs, expected) in bad {
        assert_eq!(decode_headers(&hs), Err(expected), "case: {name}");
    }
}

#[test]
fn state_keys_are_literal() {
    let a = c(T1, 3);
    let cases = [
        (StateKey::Scope, "scope"),
        (StateKey::CarriedAncestry, "ca"),
        (
            StateKey::Frontier(a),
            "f/00000000-0000-0001-0000-000000000002:3",
        ),
        (
            StateKey::ChannelClock(a),
            "cc/00000000-0000-0001-0000-000000000002:3",
        ),
        (
            StateKey::QueueMeta(a),
            "q/00000000-0000-0001-0000-000000000002:3/m",
        ),
        (
            StateKey::QueueEntry(a, 42),
            "q/00000000-0000-0001-0000-000000000002:3/e/000000000000002a",
        ),
        (
            StateKey::SendSeq(c(THIGH, 0)),
            "sq/80000000-0000-0000-0000-000000000001:0",
        ),
        (
            StateKey::DeliveredSeq(a, S1),
            "ds/00000000-0000-0001-0000-000000000002:3/00000000-0000-000a-0000-00000000000b",
        ),
        (
            StateKey::SkipMark(a, S1),
            "sk/00000000-0000-0001-0000-000000000002:3/00000000-0000-000a-0000-00000000000b",
        ),
    ];
    for (key, text) in cases {
        assert_eq!(key.to_string(), text);
        assert_eq!(text.parse::<StateKey>().unwrap(), key);
    }
    for bad in [
        "f",
        "x/00000000-0000-0001-0000-000000000002:3",
        "f/00000000-0000-0001-0000-000000000002",
        "q/00000000-0000-0001-0000-000000000002:3/e/2a",
        "q/00000000-0000-0001-0000-000000000002:3/e/000000000000002A",
        "q/00000000-0000-0001-0000-000000000002:3/x",
        "ds/00000000-0000-0001-0000-000000000002:3",
        // Only the spelling the node writes: no upper-case ids, no leading
        // zeros, no sign.
        "f/00000000-0000-0001-0000-00000000000A:3",
        "f/00000000-0000-0001-0000-000000000002:03",
        "f/00000000-0000-0001-0000-000000000002:+3",
        "ds/00000000-0000-0001-0000-000000000002:3/00000000-0000-000A-0000-00000000000B",
        "sk/00000000-0000-0001-0000-000000000002:3/00000000-0000-000A-0000-00000000000b",
    ] {
        assert!(bad.parse::<StateKey>().is_err(), "{bad} should not parse");
    }
}

#[test]
fn state_values_are_literal() {
    let scope = ScopeRecord {
        inputs: vec![c(T1, 3)],
        sinks: vec![THIGH],
    };
    let scope_bytes = hex("00000001 0000000000000001 0000000000000002 00000003
         00000001 8000000000000000 0000000000000001");
    assert_eq!(scope.encode(), scope_bytes);
    assert_eq!(ScopeRecord::decode(&scope_bytes).unwrap(), scope);
    assert!(ScopeRecord::decode(&hex("ffffffff 00000000")).is_err());
    assert!(ScopeRecord::decode(&hex("00000000 00000000 00")).is_err());
    assert_eq!(decode_i64(&hex("000000000000002a")), Ok(42));
    assert!(decode_i64(&hex("ffffffffffffffff")).is_err());
    assert!(decode_i64(&hex("00000000002a")).is_err());
    assert_eq!(
        decode_pair(&hex("0000000000000002 0000000000000005")),
        Ok((2, 5))
    );
    assert!(decode_pair(&hex("0000000000000002")).is_err());
}

/// The writes a node makes, key by key and byte by byte.
#[test]
fn node_writes_are_literal() {
    let a = c(T1, 0);
    let b = c(T1, 1);
    let x = c(THIGH, 0);
    let s2 = SenderId::from_halves(0, 2);
    let broker = FakeBroker::default().with_topic(THIGH, 1, 0);
    let mut h = Harness::start(config(S1, &[a, b], &[THIGH]), broker);
    h.feed(tagged(rec(b, 0, VectorClock::new()), s2, 3));
    let mut held = rec(a, 4, offsets(&[(b, 5)]));
    held.timestamp = 1000;
    held.key = Some(b"k".to_vec());
    held.value = Some(b"v".to_vec());
    assert!(h.feed(held).is_empty());
    h.node.prepare_send(x).unwrap();
    let w = h.commit();
    // The batch is in `StateKey` order; the store keeps text order.
    let mut got: Vec<(String, Option<Vec<u8>>)> = w
        .iter()
        .map(|(k, v)| (k.to_key(), v.map(<[u8]>::to_vec)))
        .collect();
    got.sort();
    let a_s = "00000000-0000-0001-0000-000000000002:0";
    let b_s = "00000000-0000-0001-0000-000000000002:1";
    let expected: Vec<(String, Option<Vec<u8>>)> = vec![
        (
            format!("cc/{a_s}"),
            Some(hex("01 00000001 0000000000000001 0000000000000002 00000001 0000000000000005 00000000")),
        ),
        (
            format!("ds/{b_s}/00000000-0000-0000-0000-000000000002"),
            Some(hex("0000000000000003 0000000000000000")),
        ),
        (format!("f/{a_s}"), Some(hex("0000000000000003"))),
        (format!("f/{b_s}"), Some(hex("0000000000000000"))),
        (format!("q/{a_s}/m"), Some(hex("0000000000000000 0000000000000001"))),
        (
            // A page of one record: the count, then the envelope's length
            // (92 bytes) and the envelope.
            format!("q/{a_s}/p/0000000000000000"),
            Some(hex(
                "00000001 0000005c
                 0000000000000004 00000000000003e8
                 00 0000000000000000 0000000000000000 0000000000000000
                 00000025 01 00000001 0000000000000001 0000000000000002 00000001 0000000000000005 00000000
                 00000001 6b
                 00000001 76",
            )),
        ),
        (
            "scope".to_owned(),
            Some(hex(
                "00000002 0000000000000001 0000000000000002 00000000
                          0000000000000001 0000000000000002 00000001
                 00000001 8000000000000000 0000000000000001",
            )),
        ),
        ("sq/80000000-0000-0000-0000-000000000001:0".to_owned(), Some(hex("0000000000000001"))),
    ];
    assert_eq!(got, expected);

    // Next step: the cause arrives and releases the held record. Only what
    // changed is written: the frontiers, the queue metadata, and the delete
    // of the delivered record's page.
    h.feed(rec(b, 5, VectorClock::new()));
    let w = h.commit();
    // The batch is in `StateKey` order; the store keeps text order.
    let mut got: Vec<(String, Option<Vec<u8>>)> = w
        .iter()
        .map(|(k, v)| (k.to_key(), v.map(<[u8]>::to_vec)))
        .collect();
    got.sort();
    let expected: Vec<(String, Option<Vec<u8>>)> = vec![
        (format!("f/{a_s}"), Some(hex("0000000000000004"))),
        (format!("f/{b_s}"), Some(hex("0000000000000005"))),
        (
            format!("q/{a_s}/m"),
            Some(hex("0000000000000001 0000000000000001")),
        ),
        (format!("q/{a_s}/p/0000000000000000"), None),
    ];
    assert_eq!(got, expected);
    // And a step that changes nothing writes nothing.
    assert!(h.commit().is_empty());
}

#[test]
fn carried_ancestry_is_literal() {
    let a = c(T1, 0);
    let b = c(T1, 1);
    let mut h = Harness::start(config(S1, &[a, b], &[]), FakeBroker::default());
    h.feed(rec(b, 6, VectorClock::new()));
    h.restart_with(config(S1, &[a], &[])).unwrap();
    let w = h.commit();
    assert_eq!(
        w.get(StateKey::CarriedAncestry),
        Some(Some(
            hex("01 00000001 0000000000000001 0000000000000002 00000001 0000000000000006 00000000")
                .as_slice()
        ))
    );
    assert_eq!(
        w.get(
            "f/00000000-0000-0001-0000-000000000002:1"
                .parse::<StateKey>()
                .unwrap()
        ),
        Some(None)
    );
}

fn envelope_record() -> InboundRecord {
    InboundRecord {
        channel: c(T1, 0),
        offset: 5,
        timestamp: 1000,
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        headers: vec![],
        causal: CausalHeaders {
            clock: VectorClock::new(),
            sender: Some(SenderTag { sender: S1, seq: 3 }),
        },
    }
}

fn pin_envelope(record: &InboundRecord, literal: &str) {
    let bytes = hex(literal);
    assert_eq!(encode_envelope(record), bytes);
    assert_eq!(&decode_envelope(record.channel, &bytes).unwrap(), record);
}

#[test]
fn envelope_tagged_sender() {
    pin_envelope(
        &envelope_record(),
        "0000000000000005 00000000000003e8
         01 000000000000000a 000000000000000b 0000000000000003
         00000009 01 00000000 00000000
         00000001 6b
         00000001 76",
    );
}

#[test]
fn envelope_untagged_null_key_null_value() {
    let mut r = envelope_record();
    r.causal.sender = None;
    r.key = None;
    r.value = None;
    pin_envelope(
        &r,
        "0000000000000005 00000000000003e8
         00 0000000000000000 0000000000000000 0000000000000000
         00000009 01 00000000 00000000
         ffffffff
         ffffffff",
    );
}

#[test]
fn envelope_empty_key_and_clock_with_claims() {
    let mut r = envelope_record();
    r.key = Some(vec![]);
    r.causal.clock = offsets(&[(c(T1, 1), 2)]);
    pin_envelope(
        &r,
        "0000000000000005 00000000000003e8
         01 000000000000000a 000000000000000b 0000000000000003
         00000025 01 00000001 0000000000000001 0000000000000002 00000001 0000000000000002 00000000
         00000000
         00000001 76",
    );
}

#[test]
fn envelope_header_extension() {
    let mut r = envelope_record();
    r.headers = vec![
        Header::new("h", b"x".to_vec()),
        Header {
            name: "n".into(),
            value: None,
        },
    ];
    pin_envelope(
        &r,
        "0000000000000005 00000000000003e8
         01 000000000000000a 000000000000000b 0000000000000003
         00000009 01 00000000 00000000
         00000001 6b
         00000001 76
         01 00000002
           00000001 68 00000001 78
           00000001 6e ffffffff",
    );
}

#[test]
fn malformed_envelopes_are_rejected() {
    let ch = c(T1, 0);
    let good = "0000000000000005 00000000000003e8
         01 000000000000000a 000000000000000b 0000000000000003
         00000009 01 00000000 00000000
         00000001 6b
         00000001 76";
    assert!(decode_envelope(ch, &hex(good)).is_ok());
    for (name, bad) in [
        ("truncated value", &good[..good.len() - 2]),
        ("unknown extension", &format!("{good} 02 00000000")[..]),
        (
            "trailing after extension",
            &format!("{good} 01 00000000 00")[..],
        ),
        (
            "bad tag flag",
            &good.replacen("\n         01 ", "\n         02 ", 1)[..],
        ),
        (
            "negative key length",
            &good.replacen("00000001 6b", "fffffffe", 1)[..],
        ),
        (
            "clock length beyond the value",
            &good.replacen("00000009", "00000099", 1)[..],
        ),
        (
            "corrupt clock",
            &good.replacen("00000009 01", "00000009 02", 1)[..],
        ),
    ] {
        assert!(decode_envelope(ch, &hex(bad)).is_err(), "case: {name}");
    }
}

// Version 2 (compact). Each vector is written out by hand from the layout
// on the guide's wire-format page.

const T1_HEX: &str = "0000000000000001 0000000000000002";

#[test]
fn compact_empty_clock() {
    assert_eq!(VectorClock::new().encode_compact(), hex("02 00 00"));
    assert_eq!(
        VectorClock::decode(&hex("02 00 00")).unwrap(),
        VectorClock::new()
    );
}

#[test]
fn compact_one_offset_claim() {
    // 22 bytes where version 1 takes 37.
    let bytes = hex(&format!("02 01 {T1_HEX} 01 00 29 00"));
    let clock = offsets(&[(c(T1, 0), 41)]);
    assert_eq!(clock.encode_compact(), bytes);
    assert_eq!(bytes.len(), 22);
    assert_eq!(clock.encoded_len_compact(), 22);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

#[test]
fn compact_partitions_and_offsets_are_differences() {
    // Partitions 0, 1, 3: 0, then gaps 0 and 1. Offsets 1000 (e8 07),
    // then -2 (zigzag 3) and +5 (zigzag 10).
    let bytes = hex(&format!("02 01 {T1_HEX} 03 00 e807 00 03 01 0a 00"));
    let clock = offsets(&[(c(T1, 0), 1000), (c(T1, 1), 998), (c(T1, 3), 1003)]);
    assert_eq!(clock.encode_compact(), bytes);
    assert_eq!(bytes.len(), 27);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

#[test]
fn compact_groups_follow_the_canonical_topic_order() {
    // THIGH sorts before T1 (its most significant half is negative).
    let bytes = hex(&format!(
        "02 02 8000000000000000 0000000000000001 01 02 05 {T1_HEX} 01 00 ac02 00"
    ));
    let clock = offsets(&[(c(T1, 0), 300), (c(THIGH, 2), 5)]);
    assert_eq!(clock.encode_compact(), bytes);
    assert_eq!(bytes.len(), 42);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

#[test]
fn compact_sequence_claims() {
    // Two claims on partition 1: SHIGH's sorts first (its most significant
    // half is negative), then S1's on the same partition (step 0).
    let bytes = hex(&format!(
        "02 00 01 {T1_HEX} 02
           01 8000000000000000 0000000000000000 03
           00 000000000000000a 000000000000000b 07"
    ));
    let clock = seqs(&[(c(T1, 1), S1, 7), (c(T1, 1), SHIGH, 3)]);
    assert_eq!(clock.encode_compact(), bytes);
    assert_eq!(bytes.len(), 56);
    assert_eq!(VectorClock::decode(&bytes).unwrap(), clock);
}

#[test]
fn compact_repeated_topics_merge_by_maximum() {
    let bytes = hex(&format!("02 02 {T1_HEX} 01 00 05 {T1_HEX} 01 00 07 00"));
    assert_eq!(
        VectorClock::decode(&bytes).unwrap(),
        offsets(&[(c(T1, 0), 7)])
    );
}

#[test]
fn malformed_compact_clocks_are_rejected() {
    use CorruptClock::*;
    let cases: Vec<(String, CorruptClock)> = vec![
        ("02".into(), BadVarint { at: 1 }),
        ("02 8000 00".into(), BadVarint { at: 1 }),
        (
            "02 01".into(),
            Truncated {
                section: ClockSection::Offsets,
                at: 2,
                needed: 19,
                available: 0,
            },
        ),
        (
            format!("02 01 {T1_HEX} 00 00 00"),
            EmptyGroup {
                section: ClockSection::Offsets,
                at: 18,
            },
        ),
        (
            format!("02 01 {T1_HEX} 01 8080808008 00 00"),
            OutOfRange { at: 19 },
        ),
        (
            format!("02 01 {T1_HEX} 02 00 01 00 03 00"),
            OutOfRange { at: 21 },
        ),
        ("02 00 00 00".into(), TrailingBytes(1)),
        ("03 00 00".into(), UnknownVersion(3)),
    ];
    for (input, want) in cases {
        assert_eq!(VectorClock::decode(&hex(&input)), Err(want), "{input}");
    }
}
