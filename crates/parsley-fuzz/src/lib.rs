//! The fuzz targets' bodies: one function per decoder that reads bytes
//! from outside the process. Each must return a typed error on any input
//! and never panic, overflow or allocate without bound; where a decoder
//! accepts, re-encoding must give bytes that decode to the same value.
//!
//! `fuzz/` (cargo-fuzz, nightly) drives them with libFuzzer; this crate's
//! tests replay the committed corpus and random inputs on stable, in the
//! test command.

use std::collections::{BTreeMap, BTreeSet};

use parsley::FoldKey;
use parsley::runtime::changelog::{self};
use parsley::runtime::host::{ChangelogReader, ChangelogRecord};
use parsley::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
use parsley::task::TaskId;
use parsley_protocol::headers::{CLOCK_HEADER, CausalHeaders, SENDER_HEADER, SEQ_HEADER};
use parsley_protocol::store::{
    PageBuilder, PageEntries, ScopeRecord, StateKey, check_envelope, decode_envelope, decode_i64,
    decode_pair, encode_envelope,
};
use parsley_protocol::{
    BrokerOffsets, BrokerOffsetsError, CausalNode, Channel, NodeConfig, SenderId, TopicId,
    TopicOffsets, VectorClock,
};

/// The names of the fuzz targets, as directories of `fuzz/corpus`.
pub const TARGETS: &[&str] = &[
    "clock",
    "causal_headers",
    "envelope",
    "store_key",
    "store_values",
    "node_restore",
    "changelog",
    "avro_frame",
];

/// Runs target `name` on `data`. Panics only on a broken invariant (which
/// is what a fuzzer reports).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "clock" => clock(data),
        "causal_headers" => causal_headers(data),
        "envelope" => envelope(data),
        "store_key" => store_key(data),
        "store_values" => store_values(data),
        "node_restore" => node_restore(data),
        "changelog" => changelog_restore(data),
        "avro_frame" => avro_frame(data),
        other => panic!("no fuzz target {other}"),
    }
}

/// The `vc` header: a clock of either version decodes or is refused; an
/// accepted clock re-encodes canonically in both versions, to bytes that
/// decode to the same clock.
pub fn clock(data: &[u8]) {
    if let Ok(c) = VectorClock::decode(data) {
        let again = c.encode();
        let back = VectorClock::decode(&again).expect("a clock's own encoding decodes");
        assert_eq!(back, c, "the encoding round-trips");
        assert_eq!(back.encode(), again, "the encoding is canonical");
        let compact = c.encode_compact();
        assert_eq!(
            compact.len(),
            c.encoded_len_compact(),
            "the compact length is exact"
        );
        let back = VectorClock::decode(&compact).expect("a clock's compact encoding decodes");
        assert_eq!(back, c, "the compact encoding round-trips");
        assert_eq!(
            back.encode_compact(),
            compact,
            "the compact encoding is canonical"
        );
    }
}

/// Splits `data` into headers: each is a selector byte (which name), a
/// length byte (255: a null value), then that many value bytes.
fn headers(data: &[u8]) -> Vec<(&'static str, Option<&[u8]>)> {
    let names = [CLOCK_HEADER, SENDER_HEADER, SEQ_HEADER, "other", "vc-other"];
    let mut out = Vec::new();
    let mut rest = data;
    while let [sel, len, tail @ ..] = rest {
        let name = names[*sel as usize % names.len()];
        if *len == 255 {
            out.push((name, None));
            rest = tail;
            continue;
        }
        let n = (*len as usize).min(tail.len());
        out.push((name, Some(&tail[..n])));
        rest = &tail[n..];
    }
    out
}

/// The three causal headers among others: decoded strictly or refused.
pub fn causal_headers(data: &[u8]) {
    let hs = headers(data);
    if let Ok(c) = CausalHeaders::decode(hs.iter().copied()) {
        let encoded = c.encode();
        let back = CausalHeaders::decode(encoded.iter().map(|(n, v)| (*n, Some(v.as_slice()))))
            .expect("headers the decoder accepted re-encode to headers it accepts");
        assert_eq!(back, c);
    }
}

/// The held-record envelope (the stored form of a held record), and a
/// page of them: the allocation-free check accepts exactly what the
/// decoder accepts, and an accepted page's records that decode, built
/// into a page again, give the same records back.
pub fn envelope(data: &[u8]) {
    let channel = Channel::new(TopicId::from_u128(7), 3);
    // A restore checks envelopes without decoding them; the check and the
    // decoder agree on everything.
    assert_eq!(
        check_envelope(data),
        decode_envelope(channel, data).map(|r| (r.offset, r.held_size())),
        "the envelope check agrees with the decoder"
    );
    if let Ok(r) = decode_envelope(channel, data) {
        let again = encode_envelope(&r);
        let back = decode_envelope(channel, &again).expect("an envelope's own encoding decodes");
        assert_eq!(back, r);
    }
    if let Ok(page) = PageEntries::new(data) {
        let records: Vec<_> = page
            .filter_map(|e| decode_envelope(channel, e).ok())
            .collect();
        if records.is_empty() {
            return;
        }
        let mut again = PageBuilder::new();
        for r in &records {
            again.push(r);
        }
        let again = again.finish();
        let back: Vec<_> = PageEntries::new(&again)
            .expect("a page's own encoding is a page")
            .map(|e| decode_envelope(channel, e).expect("a page's own record decodes"))
            .collect();
        assert_eq!(back, records);
    }
}

/// Store keys: parse in exactly one spelling, which `Display` writes back.
pub fn store_key(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(k) = s.parse::<StateKey>()
    {
        assert_eq!(k.to_string(), s, "one spelling per key");
    }
}

/// The fixed-layout store values.
pub fn store_values(data: &[u8]) {
    let _ = decode_i64(data);
    let _ = decode_pair(data);
    if let Ok(s) = ScopeRecord::decode(data) {
        let back = ScopeRecord::decode(&s.encode()).expect("a scope's own encoding decodes");
        assert_eq!(back, s);
    }
}

/// A small pool of channels and senders, so generated keys collide.
fn channel(b: u8) -> Channel {
    Channel::new(
        TopicId::from_u128(1 + u128::from(b % 2)),
        i32::from((b / 2) % 2),
    )
}

/// Builds a protocol store from `data`: per entry a shape byte picks a
/// key (with channels, senders and queue indices from the data), then a
/// length byte and that many value bytes. Hostile counts and indices come
/// through unchanged.
fn protocol_store(data: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut store = BTreeMap::new();
    let mut rest = data;
    while let [shape, a, b, len, tail @ ..] = rest {
        let c = channel(*a);
        let sender = SenderId::from_u128(u128::from(*b % 3));
        let key = match shape % 11 {
            0 => StateKey::Scope,
            1 => StateKey::Frontier(c),
            2 => StateKey::ChannelClock(c),
            3 => StateKey::CarriedAncestry,
            4 => StateKey::QueueMeta(c),
            5 => StateKey::QueueEntry(c, i64::from(*b) - 2),
            6 => StateKey::SendSeq(c),
            7 => StateKey::DeliveredSeq(c, sender),
            8 => StateKey::SkipMark(c, sender),
            9 => StateKey::QueuePage(c, i64::from(*b) - 2),
            _ => {
                // A key outside the vocabulary.
                let n = (*len as usize).min(tail.len());
                store.insert(String::from_utf8_lossy(&tail[..n]).into_owned(), Vec::new());
                rest = &tail[n..];
                continue;
            }
        };
        let n = (*len as usize).min(tail.len());
        store.insert(key.to_string(), tail[..n].to_vec());
        rest = &tail[n..];
    }
    store
}

/// A broker that knows the pool's topics, every partition at offset 5.
struct Broker;

impl BrokerOffsets for Broker {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(topics
            .iter()
            .map(|t| (*t, TopicOffsets::Present(BTreeMap::from([(0, 5), (1, 5)]))))
            .collect())
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(topics
            .iter()
            .map(|t| (*t, TopicOffsets::Present(BTreeMap::from([(0, 0), (1, 0)]))))
            .collect())
    }
}

/// A node restored from a hostile store: it starts, or refuses with a
/// typed error; it never panics and never allocates by a count it read.
pub fn node_restore(data: &[u8]) {
    let _ = restore_node(data);
}

/// [`node_restore`]'s restore, with its outcome (`None` for empty input).
pub fn restore_node(data: &[u8]) -> Option<Result<usize, parsley_protocol::ProtocolError>> {
    let (&inputs, rest) = data.split_first()?;
    let store = protocol_store(rest);
    let config = NodeConfig {
        sender: SenderId::from_u128(9),
        inputs: (0..4u8)
            .filter(|i| inputs & (1 << i) != 0)
            .map(channel)
            .collect(),
        sinks: BTreeSet::from([TopicId::from_u128(3)]),
    };
    Some(CausalNode::init(config, &store, &Broker).map(|i| i.report.restored_held))
}

/// Changelog topics as a restore reads them.
struct Changelogs(Vec<ChangelogRecord>);

impl TopicMetadata for Changelogs {
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
        if topic.is_empty() {
            return Err(MetadataError::Missing(topic.to_owned()));
        }
        Ok(TopicDescription {
            id: TopicId::from_u128(11),
            partitions: 1,
        })
    }
}

impl ChangelogReader for Changelogs {
    fn replay_changelog_from(
        &self,
        _topic: &str,
        _partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        for r in self.0.iter().filter(|r| r.offset >= from) {
            apply(r.clone());
        }
        Ok(self.0.last().map_or(0, |r| r.offset + 1))
    }
}

/// A task restored from hostile changelog records (both stores): the
/// restore succeeds or refuses with a typed error.
pub fn changelog_restore(data: &[u8]) {
    let mut records = Vec::new();
    let mut rest = data;
    while let [flags, klen, vlen, tail @ ..] = rest {
        let k = (*klen as usize).min(tail.len());
        let key = (flags & 1 == 0).then(|| tail[..k].to_vec());
        let tail = &tail[k..];
        let v = (*vlen as usize).min(tail.len());
        let value = (flags & 2 == 0).then(|| tail[..v].to_vec());
        let offset = i64::try_from(records.len()).unwrap_or(i64::MAX);
        records.push(ChangelogRecord { offset, key, value });
        rest = &tail[v..];
    }
    let task = TaskId {
        stage: "s".to_owned(),
        partition: 0,
    };
    let log = Changelogs(records);
    if let Ok(stores) = changelog::restore(&task, "state", Some("fold"), 1, &log, &log) {
        for (k, _) in stores.fold.iter() {
            assert!(
                FoldKey::from_bytes(k).is_some(),
                "restore kept only fold keys"
            );
        }
    }
}

/// The schema an `avro_frame` input's id names. Ids 1 and 3 are those of
/// the seeds Confluent's serializer wrote (`fuzz/corpus/avro_frame`); every
/// other id reads with a schema that has each kind of Avro type.
fn avro_schema(id: u32) -> &'static parsley_schema::apache_avro::Schema {
    use parsley_schema::apache_avro::Schema;
    use std::sync::OnceLock;
    static SCHEMAS: OnceLock<[Schema; 3]> = OnceLock::new();
    let parse = |text: &str| Schema::parse_str(text).expect("the fuzz target's schemas parse");
    let schemas = SCHEMAS.get_or_init(|| {
        [
            parse(
                r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
                    {"name": "id", "type": "string"}, {"name": "total", "type": "long"}]}"#,
            ),
            parse(
                r#"{"type": "record", "name": "Payment", "namespace": "bank", "fields": [
                    {"name": "version", "type": "int"},
                    {"name": "account", "type": "string"},
                    {"name": "amount", "type": "long"},
                    {"name": "memo", "type": ["null", "string"]}]}"#,
            ),
            parse(
                r#"{"type": "record", "name": "Everything", "namespace": "fuzz", "fields": [
                    {"name": "flag", "type": "boolean"},
                    {"name": "n", "type": "int"},
                    {"name": "f", "type": "float"},
                    {"name": "d", "type": "double"},
                    {"name": "raw", "type": "bytes"},
                    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
                    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
                    {"name": "tags", "type": {"type": "array", "items": "string"}},
                    {"name": "counts", "type": {"type": "map", "values": "long"}},
                    {"name": "either", "type": ["null", "long", "string",
                        {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}]},
                    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}"#,
            ),
        ]
    });
    match id {
        3 => &schemas[0],
        1 => &schemas[1],
        _ => &schemas[2],
    }
}

/// The generic codec of the `avro_frame` target's schema for `id`.
pub fn avro_codec(id: u32) -> parsley::Codec<parsley_schema::apache_avro::types::Value> {
    parsley_schema::PlainAvro::new(avro_schema(id).clone()).generic()
}

/// A record in a schema registry's framing, as a consumer reads it: the
/// frame is split, and its payload decoded with the schema its id names.
/// An accepted payload encodes again to bytes that decode to the same
/// value, and every shorter prefix of it is refused: a datum cut short
/// never decodes (apache-avro alone reads a union's missing branch index
/// as a null).
pub fn avro_frame(data: &[u8]) {
    let Ok(frame) = parsley_schema::framing::unframe(data) else {
        return;
    };
    let codec = avro_codec(frame.id);
    let Ok(value) = codec.decode(frame.payload) else {
        return;
    };
    // Bytes, not values, are compared: a float may be a NaN.
    let again = codec.encode(&value).expect("a decoded value encodes");
    let back = codec
        .decode(&again)
        .expect("a value's own encoding decodes");
    assert_eq!(
        codec.encode(&back).expect("a decoded value encodes"),
        again,
        "the datum round-trips"
    );
    // Every prefix of a short payload; of a long one, a few (the check is
    // quadratic in the length).
    let len = frame.payload.len();
    let step = (len / 64).max(1);
    for end in (0..len).step_by(step).chain(len.checked_sub(1)) {
        assert!(
            codec.decode(&frame.payload[..end]).is_err(),
            "a datum cut to {end} of {len} bytes decoded"
        );
    }
}
