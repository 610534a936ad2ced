//! Avro schema resolution, judged by Confluent's own deserializer.
//!
//! Each case writes records with one schema through Confluent's Python
//! serializer (into the registry the test command starts), then reads the
//! frames twice into another schema: with Confluent's `AvroDeserializer`
//! and with this crate's codec. The two values are compared exactly:
//! Confluent's is written back in the reader's schema (by fastavro) and
//! read here with that schema alone, so a union branch, an enum symbol, a
//! default or a promoted number that differs is a difference in value.
//! (Values, not bytes: a map's entries may be written in any order.)

mod common;

use common::{confluent, from_hex, registry_url, unique};
use parsley_schema::apache_avro::Schema;
use parsley_schema::apache_avro::types::Value;
use parsley_schema::{AvroCodec, PlainAvro, SchemaRegistry};
use serde_json::{Value as Json, json};

struct Case {
    name: &'static str,
    writer: Json,
    reader: Json,
    /// Schemas the writer names, registered under subjects of their own.
    references: Vec<(&'static str, Json)>,
    records: Vec<Json>,
}

fn case(name: &'static str, writer: Json, reader: Json, records: Vec<Json>) -> Case {
    Case {
        name,
        writer,
        reader,
        references: Vec::new(),
        records,
    }
}

fn cases() -> Vec<Case> {
    let created = json!({"type": "record", "name": "Created", "namespace": "shop",
        "fields": [{"name": "id", "type": "string"}]});
    let deleted = json!({"type": "record", "name": "Deleted", "namespace": "shop",
        "fields": [{"name": "id", "type": "string"}]});
    let address = json!({"type": "record", "name": "Address", "namespace": "shop",
        "fields": [{"name": "street", "type": "string"}, {"name": "zip", "type": "int"}]});
    let address_v2 = json!({"type": "record", "name": "Address", "namespace": "shop",
        "fields": [{"name": "street", "type": "string"}, {"name": "zip", "type": "long"},
                   {"name": "country", "type": "string", "default": "NL"}]});
    vec![
        // The issue's case: two records of one shape in a union, and a
        // writer that added a field; the branch is chosen by name.
        case(
            "union branches are matched by name, not by shape",
            json!({"type": "record", "name": "Event", "namespace": "shop", "fields": [
                {"name": "body", "type": [created, deleted]},
                {"name": "memo", "type": ["null", "string"], "default": null}]}),
            json!({"type": "record", "name": "Event", "namespace": "shop", "fields": [
                {"name": "body", "type": [created, deleted]}]}),
            vec![
                json!({"body": {"$branch": ["shop.Deleted", {"id": "a"}]}, "memo": "x"}),
                json!({"body": {"$branch": ["shop.Created", {"id": "b"}]}, "memo": null}),
            ],
        ),
        case(
            "a reader's union in another order takes each branch by name",
            json!({"type": "record", "name": "Event", "namespace": "shop", "fields": [
                {"name": "body", "type": [created, deleted]}]}),
            json!({"type": "record", "name": "Event", "namespace": "shop", "fields": [
                {"name": "body", "type": ["null", deleted, created]}]}),
            vec![
                json!({"body": {"$branch": ["shop.Created", {"id": "c"}]}}),
                json!({"body": {"$branch": ["shop.Deleted", {"id": "d"}]}}),
            ],
        ),
        case(
            "a field renamed with an alias reads the written value",
            json!({"type": "record", "name": "Payment", "fields": [
                {"name": "amount", "type": "long"}, {"name": "who", "type": "string"}]}),
            json!({"type": "record", "name": "Payment", "fields": [
                {"name": "who", "type": "string"},
                {"name": "amount_cents", "type": "long", "aliases": ["amount"], "default": 0}]}),
            vec![json!({"amount": 1234, "who": "ann"})],
        ),
        case(
            "a field renamed with an alias and no default reads the written value",
            json!({"type": "record", "name": "Payment", "fields": [
                {"name": "amount", "type": "long"}]}),
            json!({"type": "record", "name": "Payment", "fields": [
                {"name": "amount_cents", "type": "long", "aliases": ["amount"]}]}),
            vec![json!({"amount": 99})],
        ),
        case(
            "a record renamed with an alias is found in the reader's union",
            json!({"type": "record", "name": "Wrapper", "fields": [
                {"name": "p", "type": ["null", {"type": "record", "name": "Pay",
                    "namespace": "old", "fields": [{"name": "cents", "type": "int"}]}]}]}),
            json!({"type": "record", "name": "Wrapper", "fields": [
                {"name": "p", "type": ["null", {"type": "record", "name": "Payment",
                    "namespace": "shop", "aliases": ["old.Pay"],
                    "fields": [{"name": "cents", "type": "long"}]}]}]}),
            vec![
                json!({"p": {"$branch": ["old.Pay", {"cents": 7}]}}),
                json!({"p": null}),
            ],
        ),
        case(
            "an enum symbol the reader lacks takes the reader's default",
            json!({"type": "record", "name": "Paint", "fields": [
                {"name": "c", "type": {"type": "enum", "name": "Color",
                    "symbols": ["RED", "GREEN", "BLUE"]}}]}),
            json!({"type": "record", "name": "Paint", "fields": [
                {"name": "c", "type": {"type": "enum", "name": "Color",
                    "symbols": ["GREEN", "RED", "OTHER"], "default": "OTHER"}}]}),
            vec![
                json!({"c": "RED"}),
                json!({"c": "BLUE"}),
                json!({"c": "GREEN"}),
            ],
        ),
        // Fixed types of one size in one union are told apart by name in
        // the unit tests: Confluent's deserializer hands fixed back as
        // bare bytes, so its answer cannot show the branch.
        case(
            "enums and fixed in unions are matched by name",
            json!({"type": "record", "name": "Thing", "fields": [
                {"name": "u", "type": ["null",
                    {"type": "enum", "name": "Kind", "symbols": ["A", "B"]},
                    {"type": "fixed", "name": "Hash", "size": 4},
                    {"type": "fixed", "name": "Tag", "size": 2}]}]}),
            json!({"type": "record", "name": "Thing", "fields": [
                {"name": "u", "type": [
                    {"type": "fixed", "name": "Tag", "size": 2},
                    {"type": "fixed", "name": "Hash", "size": 4},
                    {"type": "enum", "name": "Kind", "symbols": ["B", "A"]},
                    "null"]}]}),
            vec![
                json!({"u": "A"}),
                json!({"u": {"$branch": ["Tag", {"$bytes": "0102"}]}}),
                json!({"u": {"$branch": ["Hash", {"$bytes": "0a0b0c0d"}]}}),
                json!({"u": null}),
            ],
        ),
        case(
            "Avro's promotions, directly and into a union's branch",
            json!({"type": "record", "name": "N", "fields": [
                {"name": "i2l", "type": "int"}, {"name": "i2f", "type": "int"},
                {"name": "l2d", "type": "long"}, {"name": "f2d", "type": "float"},
                {"name": "s2b", "type": "string"}, {"name": "b2s", "type": "bytes"},
                {"name": "u", "type": ["null", "int"]}, {"name": "v", "type": "long"}]}),
            json!({"type": "record", "name": "N", "fields": [
                {"name": "i2l", "type": "long"}, {"name": "i2f", "type": "float"},
                {"name": "l2d", "type": "double"}, {"name": "f2d", "type": "double"},
                {"name": "s2b", "type": "bytes"}, {"name": "b2s", "type": "string"},
                {"name": "u", "type": ["null", "double"]}, {"name": "v", "type": ["null", "string", "double"]}]}),
            vec![
                json!({"i2l": -5, "i2f": 16777217, "l2d": 9007199254740993_i64, "f2d": 0.1,
                    "s2b": "héllo", "b2s": {"$bytes": "6869"}, "u": 3, "v": 12}),
                json!({"i2l": 2147483647, "i2f": 0, "l2d": -1, "f2d": -2.5,
                    "s2b": "", "b2s": {"$bytes": ""}, "u": null, "v": -1}),
            ],
        ),
        case(
            "logical types, read into a reader that added a field",
            json!({"type": "record", "name": "L", "fields": [
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                    "precision": 10, "scale": 2}},
                {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
                {"name": "opt_at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}]}),
            json!({"type": "record", "name": "L", "fields": [
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                    "precision": 10, "scale": 2}},
                {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
                {"name": "opt_at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
                {"name": "added", "type": {"type": "int", "logicalType": "date"}, "default": 3}]}),
            vec![
                json!({"day": 19700, "at": 1_700_000_000_123_i64, "at_us": 1_700_000_000_123_456_i64,
                "t": 3_600_000, "price": {"$decimal": "-1234.56"},
                "id": "1481531d-ccc9-46d9-a56f-5b67459c0537", "opt_at": 5}),
            ],
        ),
        Case {
            name: "named types across references, evolved in the reader",
            writer: json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
                {"name": "ship", "type": "shop.Address"},
                {"name": "bill", "type": ["null", "shop.Address"], "default": null},
                {"name": "history", "type": {"type": "array", "items": "shop.Address"}},
                {"name": "by_name", "type": {"type": "map", "values": ["null", "shop.Address"]}}]}),
            reader: json!({"type": "record", "name": "Order", "namespace": "shop", "fields": [
                {"name": "ship", "type": address_v2},
                {"name": "bill", "type": ["null", "Address"], "default": null},
                {"name": "history", "type": {"type": "array", "items": "Address"}},
                {"name": "by_name", "type": {"type": "map", "values": ["null", "Address"]}},
                {"name": "note", "type": ["null", "string"], "default": null}]}),
            references: vec![("shop.Address", address)],
            records: vec![json!({
                "ship": {"street": "Main", "zip": 1},
                "bill": {"$branch": ["shop.Address", {"street": "Side", "zip": 2}]},
                "history": [{"street": "Old", "zip": 3}],
                "by_name": {"home": {"$branch": ["shop.Address", {"street": "H", "zip": 4}]}, "none": null}})],
        },
        case(
            "a recursive record, with a field added",
            json!({"type": "record", "name": "Node", "fields": [
                {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}),
            json!({"type": "record", "name": "Node", "fields": [
                {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]},
                {"name": "w", "type": {"type": "array", "items": "string"}, "default": ["z"]}]}),
            vec![
                json!({"v": 1, "next": {"$branch": ["Node", {"v": 2, "next": {"$branch": ["Node", {"v": 3, "next": null}]}}]}}),
            ],
        ),
        // Bytes and fixed defaults are left to the unit tests: fastavro
        // 1.13 hands them back as text, which its own writer refuses.
        case(
            "defaults of every kind fill fields the writer lacks",
            json!({"type": "record", "name": "D", "fields": [{"name": "k", "type": "string"}]}),
            json!({"type": "record", "name": "D", "fields": [
                {"name": "k", "type": "string"},
                {"name": "rec", "type": {"type": "record", "name": "Inner", "fields": [
                    {"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": "bee"}]},
                    "default": {"a": 4}},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}, "default": "Y"},
                {"name": "m", "type": {"type": "map", "values": "double"}, "default": {"x": 1.5}},
                {"name": "u", "type": ["int", "null"], "default": 7},
                {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1000},
                {"name": "ok", "type": "boolean", "default": true}]}),
            vec![json!({"k": "only"})],
        ),
    ]
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY) and Confluent's Python client; the test command starts both"]
fn the_codec_reads_what_confluents_deserializer_reads() {
    let url = registry_url();
    let registry = SchemaRegistry::at(&url).unwrap();
    let mut failures = Vec::new();
    let mut compared = 0;
    for case in cases() {
        let topic = unique("resolve");
        let references: Vec<Json> = case
            .references
            .iter()
            .map(|(name, schema)| {
                json!({"name": name, "subject": unique("ref"), "schema": schema.to_string()})
            })
            .collect();
        let input = json!({
            "writer": case.writer.to_string(),
            "reader": case.reader.to_string(),
            "references": references,
            "records": case.records,
        });
        let out = confluent(&[&url, "resolve", &topic], &input.to_string());
        let reader = Schema::parse_str(&case.reader.to_string()).unwrap();
        let codec = AvroCodec::value(&registry, &topic, reader.clone())
            .generic()
            .unwrap();
        let plain = PlainAvro::new(reader).generic();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), case.records.len(), "{}: {out}", case.name);
        for line in lines {
            let line: Json = serde_json::from_str(line).unwrap();
            let frame = from_hex(line["frame"].as_str().unwrap());
            let theirs = plain
                .decode(&from_hex(line["read"].as_str().unwrap()))
                .unwrap();
            match codec.decode(&frame) {
                Ok(ours) => {
                    if ours != theirs {
                        failures.push(format!(
                            "{}: ours {ours:?}, Confluent's {theirs:?} ({})",
                            case.name, line["value"]
                        ));
                    }
                }
                Err(e) => failures.push(format!(
                    "{}: ours failed ({e}), Confluent's {}",
                    case.name, line["value"]
                )),
            }
            compared += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} records read differently:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compared >= 20, "only {compared} records were compared");
}

/// A reader field the writer never wrote and with no default cannot be
/// filled: the pair is refused, loudly, rather than read with a guess.
#[test]
fn a_pair_the_specification_cannot_resolve_is_refused() {
    let writer = Schema::parse_str(
        r#"{"type": "record", "name": "P", "fields": [{"name": "a", "type": "long"}]}"#,
    )
    .unwrap();
    let bytes = PlainAvro::new(writer.clone())
        .generic()
        .encode(&Value::Record(vec![("a".into(), Value::Long(3))]))
        .unwrap();
    let refused = |reader: &str| {
        let reader = Schema::parse_str(reader).unwrap();
        PlainAvro::evolving(writer.clone(), reader)
            .generic()
            .decode(&bytes)
            .unwrap_err()
            .to_string()
    };
    let e =
        refused(r#"{"type": "record", "name": "P", "fields": [{"name": "b", "type": "long"}]}"#);
    assert!(e.contains("field b") && e.contains("no default"), "{e}");
    let e = refused(r#"{"type": "record", "name": "P", "fields": [{"name": "a", "type": "int"}]}"#);
    assert!(e.contains("cannot be read as"), "{e}");
    let e =
        refused(r#"{"type": "record", "name": "Q", "fields": [{"name": "a", "type": "long"}]}"#);
    assert!(e.contains("is not the reader's"), "{e}");
}

/// A writer's union branch the reader cannot hold fails the datums that
/// use it, and only those.
#[test]
fn a_branch_the_reader_cannot_hold_fails_only_the_records_that_use_it() {
    let writer = Schema::parse_str(
        r#"{"type": "record", "name": "P", "fields": [{"name": "a", "type": ["string", "boolean"]}]}"#,
    )
    .unwrap();
    let reader = Schema::parse_str(
        r#"{"type": "record", "name": "P", "fields": [{"name": "a", "type": ["null", "string"]}]}"#,
    )
    .unwrap();
    let write = PlainAvro::new(writer.clone()).generic();
    let read = PlainAvro::evolving(writer, reader).generic();
    let text = write
        .encode(&Value::Record(vec![(
            "a".into(),
            Value::Union(0, Box::new(Value::String("t".into()))),
        )]))
        .unwrap();
    assert_eq!(
        read.decode(&text).unwrap(),
        Value::Record(vec![(
            "a".into(),
            Value::Union(1, Box::new(Value::String("t".into())))
        )])
    );
    let flag = write
        .encode(&Value::Record(vec![(
            "a".into(),
            Value::Union(1, Box::new(Value::Boolean(true))),
        )]))
        .unwrap();
    let e = read.decode(&flag).unwrap_err().to_string();
    assert!(e.contains("no branch of the reader's union"), "{e}");
}
