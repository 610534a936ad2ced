//! Writes the seed inputs of every fuzz target into `fuzz/corpus/<target>/`
//! (valid encodings, so the fuzzer starts from inputs the decoders
//! accept). Run with `cargo run -p parsley-fuzz --example seeds`.

use std::path::PathBuf;

use parsley_protocol::headers::{CausalHeaders, SenderTag};
use parsley_protocol::store::{ScopeRecord, StateKey, encode_envelope, encode_i64, encode_pair};
use parsley_protocol::{Channel, Header, InboundRecord, SenderId, TopicId, VectorClock};

fn clock(n: u8) -> VectorClock {
    let mut c = VectorClock::new();
    for i in 0..n {
        let ch = Channel::new(TopicId::from_u128(1 + u128::from(i % 2)), i32::from(i / 2));
        c.claim_offset(ch, i64::from(i) * 7);
        if i % 2 == 1 {
            c.claim_sequence(ch, SenderId::from_u128(u128::from(i)), i64::from(i) + 1);
        }
    }
    c
}

fn channel(b: u8) -> Channel {
    Channel::new(
        TopicId::from_u128(1 + u128::from(b % 2)),
        i32::from((b / 2) % 2),
    )
}

fn record(tagged: bool, headers: bool) -> InboundRecord {
    InboundRecord {
        channel: Channel::new(TopicId::from_u128(7), 3),
        offset: 41,
        timestamp: 1_700_000_000_000,
        key: Some(b"k".to_vec()),
        value: if headers {
            None
        } else {
            Some(b"value".to_vec())
        },
        headers: if headers {
            vec![
                Header::new("trace", "t-1"),
                Header {
                    name: "n".into(),
                    value: None,
                },
            ]
        } else {
            Vec::new()
        },
        causal: CausalHeaders {
            clock: clock(3),
            sender: tagged.then_some(SenderTag {
                sender: SenderId::from_u128(5),
                seq: 2,
            }),
        },
    }
}

/// One store entry in the node_restore framing.
fn entry(shape: u8, a: u8, b: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![shape, a, b, u8::try_from(value.len()).expect("short value")];
    out.extend_from_slice(value);
    out
}

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)
    };

    for n in [0u8, 1, 4] {
        write("clock", &format!("width-{n}"), &clock(n).encode())?;
        write(
            "clock",
            &format!("compact-width-{n}"),
            &clock(n).encode_compact(),
        )?;
    }

    let tagged = CausalHeaders {
        clock: clock(2),
        sender: Some(SenderTag {
            sender: SenderId::from_u128(5),
            seq: 9,
        }),
    };
    let mut framed = Vec::new();
    for (name, value) in tagged.encode() {
        let sel = match name {
            "vc" => 0,
            "vc-sender" => 1,
            _ => 2,
        };
        framed.push(sel);
        framed.push(u8::try_from(value.len()).expect("short header"));
        framed.extend_from_slice(&value);
    }
    framed.extend_from_slice(&[3, 2, b'o', b'k']);
    write("causal_headers", "tagged", &framed)?;
    write("causal_headers", "empty", &[])?;

    write("envelope", "plain", &encode_envelope(&record(false, false)))?;
    write(
        "envelope",
        "tagged-headers",
        &encode_envelope(&record(true, true)),
    )?;

    let c = Channel::new(TopicId::from_u128(0xabcdef), 12);
    let s = SenderId::from_u128(0x1234);
    for (i, k) in [
        StateKey::Scope,
        StateKey::Frontier(c),
        StateKey::ChannelClock(c),
        StateKey::CarriedAncestry,
        StateKey::QueueMeta(c),
        StateKey::QueueEntry(c, 255),
        StateKey::SendSeq(c),
        StateKey::DeliveredSeq(c, s),
        StateKey::SkipMark(c, s),
    ]
    .iter()
    .enumerate()
    {
        write("store_key", &format!("key-{i}"), k.to_string().as_bytes())?;
    }

    let scope = ScopeRecord {
        inputs: vec![channel(0), channel(1)],
        sinks: vec![TopicId::from_u128(3)],
    };
    write("store_values", "scope", &scope.encode())?;
    write("store_values", "i64", &encode_i64(-1))?;
    write("store_values", "pair", &encode_pair(3, 9))?;

    // A restored node: scope, frontiers, a queue of one held record.
    let mut store = vec![0b0011];
    store.extend(entry(0, 0, 0, &scope.encode()));
    store.extend(entry(1, 0, 0, &encode_i64(4)));
    store.extend(entry(4, 0, 0, &encode_pair(0, 1)));
    let mut held = record(true, false);
    held.channel = channel(0);
    held.offset = 5;
    held.causal.clock = clock(1);
    // Queue index 0 is `b - 2` in the framing.
    store.extend(entry(5, 0, 2, &encode_envelope(&held)));
    store.extend(entry(7, 1, 1, &encode_pair(2, 3)));
    write("node_restore", "held", &store)?;
    write("node_restore", "fresh", &[0b0001])?;

    // Changelog records: flags (1: null key, 2: tombstone), lengths, bytes.
    let mut log = Vec::new();
    for (key, value) in [
        (&b"\x01k"[..], &b"\x00\x00\x00\x00\x00\x00\x00\x01"[..]),
        (b"\x02", b"t"),
    ] {
        log.extend([
            0,
            u8::try_from(key.len()).unwrap_or(0),
            u8::try_from(value.len()).unwrap_or(0),
        ]);
        log.extend_from_slice(key);
        log.extend_from_slice(value);
    }
    log.extend([2, 2, 0, 0x01, b'k']);
    write("changelog", "fold", &log)?;

    // Frames Confluent's Python serializer wrote: {"id": "o-1", "total":
    // 12} under schema id 3, and the payment issue 57 quoted under id 1
    // (with its last byte, the memo's union index). The third is the
    // codec's own encoding of a record with every kind of Avro type.
    write(
        "avro_frame",
        "confluent-order",
        &[0, 0, 0, 0, 3, 0x06, b'o', b'-', b'1', 0x18],
    )?;
    write(
        "avro_frame",
        "confluent-payment",
        &[
            0, 0, 0, 0, 1, 0x02, 0x0c, b'a', b'c', b'c', b't', b'-', b'1', 0xc4, 0x13, 0x00,
        ],
    )?;
    write("avro_frame", "everything", &everything())?;
    println!("seeds written under {}", root.display());
    Ok(())
}

/// A frame (schema id 9) of the `avro_frame` target's widest schema, every
/// field set.
fn everything() -> Vec<u8> {
    use parsley_schema::apache_avro::types::Value;
    let datum = Value::Record(vec![
        ("flag".into(), Value::Boolean(true)),
        ("n".into(), Value::Int(-7)),
        ("f".into(), Value::Float(1.5)),
        ("d".into(), Value::Double(-2.25)),
        ("raw".into(), Value::Bytes(vec![0, 1, 2])),
        ("kind".into(), Value::Enum(1, "B".into())),
        ("hash".into(), Value::Fixed(4, vec![9, 8, 7, 6])),
        (
            "tags".into(),
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        ),
        (
            "counts".into(),
            Value::Map([("k".to_owned(), Value::Long(3))].into_iter().collect()),
        ),
        (
            "either".into(),
            Value::Union(
                3,
                Box::new(Value::Record(vec![("x".into(), Value::Int(5))])),
            ),
        ),
        ("day".into(), Value::Date(19_000)),
        ("at".into(), Value::TimestampMillis(1_700_000_000_000)),
    ]);
    let payload = parsley_fuzz::avro_codec(9)
        .encode(&datum)
        .expect("the seed fits the schema");
    let mut frame = vec![0, 0, 0, 0, 9];
    frame.extend_from_slice(&payload);
    frame
}
