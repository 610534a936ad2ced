//! The registry codecs against a real schema registry
//! (`PARSLEY_SCHEMA_REGISTRY`; the test command starts Apicurio Registry and
//! sets it): round trips under each subject strategy, evolution, refusals,
//! a registry that is down, corrupt framing, and records written and read
//! by Confluent's own serializer.

mod common;

use std::time::Duration;

use apache_avro::types::Value;
use apache_avro::{AvroSchema, Schema};
use common::{Gate, confluent, from_hex, registry_url, to_hex, unique};
use parsley::{Codec, DriverError, Input, Parsley, Stage, TestDriver, Topic};
use parsley_schema::framing::{frame, unframe};
use parsley_schema::{
    AvroCodec, JsonSchemaCodec, RegistryConfig, SchemaError, SchemaRegistry, SchemaType,
    SubjectNameStrategy,
};
use serde::{Deserialize, Serialize};

fn registry() -> SchemaRegistry {
    SchemaRegistry::at(registry_url()).unwrap()
}

/// An order schema in a namespace of its own, so record-name subjects do
/// not meet earlier runs'.
fn order_schema(namespace: &str) -> Schema {
    Schema::parse_str(&format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{namespace}",
            "fields": [{{"name": "id", "type": "string"}}, {{"name": "total", "type": "long"}}]}}"#
    ))
    .unwrap()
}

/// The order with a field added later, with a default.
fn order_v2_schema(namespace: &str) -> Schema {
    Schema::parse_str(&format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{namespace}",
            "fields": [{{"name": "id", "type": "string"}}, {{"name": "total", "type": "long"}},
                       {{"name": "currency", "type": "string", "default": "EUR"}}]}}"#
    ))
    .unwrap()
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Order {
    id: String,
    total: i64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct OrderV2 {
    id: String,
    total: i64,
    currency: String,
}

fn order(id: &str, total: i64) -> Order {
    Order {
        id: id.into(),
        total,
    }
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn avro_round_trips_under_each_subject_strategy() {
    let r = registry();
    let ns = unique("shop");
    let topic = unique("orders");
    let schema = order_schema(&ns);
    for (strategy, subject) in [
        (SubjectNameStrategy::TopicName, format!("{topic}-value")),
        (SubjectNameStrategy::RecordName, format!("{ns}.Order")),
        (
            SubjectNameStrategy::TopicRecordName,
            format!("{topic}-{ns}.Order"),
        ),
    ] {
        let builder = AvroCodec::value(&r, &topic, schema.clone()).subject_names(strategy);
        assert_eq!(builder.subject().unwrap(), subject);
        let codec: Codec<Order> = builder.typed().unwrap();
        assert!(codec.is_registry_framed());
        let o = order("o-1", 12);
        let bytes = codec.encode(&o).unwrap();
        // The frame names the id the registry holds the schema under, in
        // the subject the strategy names (asked by a client of its own).
        let text = serde_json::to_string(&schema).unwrap();
        let id = registry()
            .lookup(&subject, SchemaType::Avro, &text)
            .unwrap();
        assert_eq!(unframe(&bytes).unwrap().id, id, "{strategy:?}");
        // The payload is the Avro datum: "o-1" (length 3, zigzag 6) and 12
        // (zigzag 24).
        assert_eq!(&bytes[5..], &[6, b'o', b'-', b'1', 24]);
        assert_eq!(codec.decode(&bytes).unwrap(), o);
    }
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn generic_values_and_derived_schemas_round_trip() {
    let r = registry();
    let topic = unique("generic");
    let codec = AvroCodec::value(&r, &topic, order_schema("shop"))
        .generic()
        .unwrap();
    let v = Value::Record(vec![
        ("id".into(), Value::String("o-2".into())),
        ("total".into(), Value::Long(-3)),
    ]);
    let bytes = codec.encode(&v).unwrap();
    assert_eq!(codec.decode(&bytes).unwrap(), v);
    // A value that does not fit the schema fails to encode, and names why.
    let wrong = Value::Record(vec![("id".into(), Value::Long(1))]);
    assert!(codec.encode(&wrong).is_err());

    #[derive(AvroSchema, Serialize, Deserialize, Debug, PartialEq)]
    struct Reading {
        sensor: i64,
        note: Option<String>,
    }
    let codec = AvroCodec::value_of::<Reading>(&r, &unique("readings"))
        .typed::<Reading>()
        .unwrap();
    for reading in [
        Reading {
            sensor: 7,
            note: None,
        },
        Reading {
            sensor: 8,
            note: Some("hot".into()),
        },
    ] {
        let b = codec.encode(&reading).unwrap();
        assert_eq!(codec.decode(&b).unwrap(), reading);
    }
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn json_schema_round_trips_and_is_registered_as_json() {
    let r = registry();
    let topic = unique("json");
    let schema = serde_json::json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {"id": {"type": "string"}, "total": {"type": "integer"}}
    });
    let codec: Codec<Order> = JsonSchemaCodec::value(&r, &topic, schema).typed().unwrap();
    let o = order("o-3", 5);
    let bytes = codec.encode(&o).unwrap();
    let f = unframe(&bytes).unwrap();
    assert_eq!(f.payload, br#"{"id":"o-3","total":5}"#);
    assert_eq!(r.schema(f.id).unwrap().schema_type, SchemaType::Json);
    assert_eq!(codec.decode(&bytes).unwrap(), o);
    // An Avro frame is not read as JSON Schema.
    let avro = AvroCodec::value(&r, &unique("avro"), order_schema("shop"))
        .typed::<Order>()
        .unwrap();
    let e = codec.decode(&avro.encode(&o).unwrap()).unwrap_err();
    assert!(!e.is_transient());
    assert!(e.to_string().contains("is a Avro schema"), "{e}");
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn an_old_writer_schema_decodes_into_the_new_reader_and_an_incompatible_one_is_refused() {
    let r = registry();
    let topic = unique("evolving");
    let subject = format!("{topic}-value");
    r.set_compatibility(Some(&subject), "BACKWARD").unwrap();
    let v1: Codec<Order> = AvroCodec::value(&r, &topic, order_schema("shop"))
        .typed()
        .unwrap();
    let old = v1.encode(&order("o-4", 40)).unwrap();
    let v2: Codec<OrderV2> = AvroCodec::value(&r, &topic, order_v2_schema("shop"))
        .typed()
        .unwrap();
    // Written under v1, read as v2: the new field takes its default.
    assert_eq!(
        v2.decode(&old).unwrap(),
        OrderV2 {
            id: "o-4".into(),
            total: 40,
            currency: "EUR".into()
        }
    );
    // v2 registers as a new version (compatible), under a new id.
    let new = v2
        .encode(&OrderV2 {
            id: "o-5".into(),
            total: 1,
            currency: "CHF".into(),
        })
        .unwrap();
    assert_ne!(unframe(&new).unwrap().id, unframe(&old).unwrap().id);
    // v1 reads v2's records too (the added field is skipped).
    assert_eq!(v1.decode(&new).unwrap(), order("o-5", 1));
    // A change that breaks backward compatibility (a new field without a
    // default) is refused by the registry: a typed error, not transient.
    let broken = Schema::parse_str(
        r#"{"type": "record", "name": "Order", "namespace": "shop",
            "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "long"},
                       {"name": "region", "type": "string"}]}"#,
    )
    .unwrap();
    let e = SchemaRegistry::at(registry_url())
        .unwrap()
        .register(
            &subject,
            SchemaType::Avro,
            &serde_json::to_string(&broken).unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(&e, SchemaError::Incompatible { subject: s, .. } if *s == subject),
        "{e}"
    );
    assert!(!e.is_transient());
    // Through a codec, the refusal fails the encoding for good.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Broken {
        id: String,
        total: i64,
        region: String,
    }
    let codec: Codec<Broken> = AvroCodec::value(&r, &topic, broken).typed().unwrap();
    let e = codec
        .encode(&Broken {
            id: "x".into(),
            total: 0,
            region: "eu".into(),
        })
        .unwrap_err();
    assert!(!e.is_transient());
    assert!(e.to_string().contains("incompatible"), "{e}");
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn a_writer_schema_with_references_and_nested_records_decodes() {
    let r = registry();
    let ns = unique("refs");
    // Money is registered on its own; the writer's Order refers to it by
    // name (Confluent's schema references), as Java producers often do.
    let money = format!(
        r#"{{"type": "record", "name": "Money", "namespace": "{ns}", "fields": [{{"name": "cents", "type": "long"}}]}}"#
    );
    let money_subject = unique("money");
    r.register(&money_subject, SchemaType::Avro, &money)
        .unwrap();
    let topic = unique("priced");
    let referring = format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{ns}", "fields": [{{"name": "id", "type": "string"}}, {{"name": "price", "type": "{ns}.Money"}}]}}"#
    );
    let body = serde_json::json!({
        "schema": referring,
        "references": [{"name": format!("{ns}.Money"), "subject": money_subject, "version": 1}],
    });
    let answer: serde_json::Value = ureq::post(format!(
        "{}/subjects/{topic}-value/versions",
        registry_url()
    ))
    .header("Content-Type", "application/vnd.schemaregistry.v1+json")
    .send(body.to_string())
    .unwrap()
    .into_body()
    .read_json()
    .unwrap();
    let id = u32::try_from(answer["id"].as_u64().unwrap()).unwrap();
    assert_eq!(r.schema(id).unwrap().references.len(), 1);
    // The reader's schema is self-contained (as a derived one is): Money
    // defined inline, inside Order.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Money {
        cents: i64,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Priced {
        id: String,
        price: Money,
    }
    let inline = Schema::parse_str(&format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{ns}", "fields": [{{"name": "id", "type": "string"}}, {{"name": "price", "type": {money}}}]}}"#
    ))
    .unwrap();
    let codec: Codec<Priced> = AvroCodec::value(&r, &topic, inline).typed().unwrap();
    // "o" then 250 cents, under the referring schema's id.
    let bytes = frame(id, &[2, b'o', 0xf4, 0x03]);
    let expected = Priced {
        id: "o".into(),
        price: Money { cents: 250 },
    };
    assert_eq!(codec.decode(&bytes).unwrap(), expected);
    // Its own records (the inline schema, registered as a new version)
    // decode too, nested record and all.
    assert_eq!(
        codec.decode(&codec.encode(&expected).unwrap()).unwrap(),
        expected
    );
    // A reference to a version the registry does not hold is a typed
    // error, not a transient one.
    let e = r.schema_version(&money_subject, 99).unwrap_err();
    assert!(
        matches!(&e, SchemaError::UnknownVersion { subject, version: 99 } if *subject == money_subject),
        "{e}"
    );
    assert!(!e.is_transient());
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn unknown_ids_and_corrupt_frames_fail_for_good_and_say_why() {
    let r = registry();
    let codec: Codec<Order> = AvroCodec::value(&r, &unique("corrupt"), order_schema("shop"))
        .typed()
        .unwrap();
    let good = codec.encode(&order("o-6", 6)).unwrap();
    let id = unframe(&good).unwrap().id;
    let names_the_id = format!("schema id {id}");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "unknown id",
            frame(2_000_000_007, &good[5..]),
            "schema id 2000000007 is not known",
        ),
        (
            "wrong magic byte",
            [&[1u8][..], &good[1..]].concat(),
            "zero byte",
        ),
        ("truncated id", good[..3].to_vec(), "3 byte(s) cannot be"),
        // A string whose length runs past the payload.
        (
            "payload not the schema's",
            frame(id, &[0x40, b'x']),
            &names_the_id,
        ),
        (
            "bytes after the datum",
            [&good[..], &[0]].concat(),
            "1 byte(s) left after the datum",
        ),
    ];
    // Under Codec::attempting (a topic whose producers are not ours), the
    // same bytes arrive as Decoded::Malformed, raw bytes and reason kept,
    // for the handler to route to a dead-letter topic.
    let attempting = Codec::attempting(codec.clone());
    for (what, bytes, says) in cases {
        let e = codec.decode(&bytes).unwrap_err();
        assert!(!e.is_transient(), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        match attempting.decode(&bytes).unwrap() {
            parsley::Decoded::Malformed { raw, reason } => {
                assert_eq!(raw, bytes, "{what}");
                assert!(reason.contains(says), "{what}: {reason}");
            }
            ok => panic!("{what}: decoded as {ok:?}"),
        }
    }
    // A registry that is down is not the record's fault: not Malformed.
    let gate = Gate::new(&registry_url(), false);
    let behind =
        SchemaRegistry::new(RegistryConfig::new(gate.url()).timeout(Duration::from_secs(2)))
            .unwrap();
    let unseen: Codec<Order> = AvroCodec::value(&behind, &unique("corrupt"), order_schema("shop"))
        .typed()
        .unwrap();
    let e = Codec::attempting(unseen).decode(&good).unwrap_err();
    assert!(e.is_transient(), "{e}");
    // The unknown id is a typed error when asked directly.
    assert!(matches!(
        r.schema(2_000_000_007),
        Err(SchemaError::UnknownSchemaId { id: 2_000_000_007 })
    ));
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn looking_up_without_registering_finds_only_registered_schemas() {
    let r = registry();
    let topic = unique("lookup");
    let codec: Codec<Order> = AvroCodec::value(&r, &topic, order_schema("shop"))
        .auto_register(false)
        .typed()
        .unwrap();
    let e = codec.encode(&order("o-7", 7)).unwrap_err();
    assert!(!e.is_transient());
    assert!(e.to_string().contains("does not hold this schema"), "{e}");
    // Registered by someone else (a deploy pipeline), it is found.
    let registered: Codec<Order> = AvroCodec::value(&registry(), &topic, order_schema("shop"))
        .typed()
        .unwrap();
    let b1 = registered.encode(&order("o-7", 7)).unwrap();
    let b2 = codec.encode(&order("o-7", 7)).unwrap();
    assert_eq!(b1, b2);
}

/// A stage that reads Avro orders and writes Avro totals, its codecs on
/// the registry behind `gate`; the inputs are written by a codec of their
/// own, straight to the registry.
struct Shop {
    app: Parsley,
    orders: Topic<String, Order>,
    totals: Topic<String, Order>,
}

fn shop(registry: &SchemaRegistry, reader: Schema) -> Shop {
    let orders_topic = unique("orders");
    let totals_topic = unique("totals");
    let orders: Topic<String, Order> = Topic::new(
        orders_topic.clone(),
        Codec::utf8(),
        AvroCodec::value(registry, &orders_topic, reader.clone())
            .typed()
            .unwrap(),
    );
    let totals: Topic<String, Order> = Topic::new(
        totals_topic.clone(),
        Codec::utf8(),
        AvroCodec::value(registry, &totals_topic, reader)
            .typed()
            .unwrap(),
    );
    let mut stage = Stage::named("doubler");
    let out = stage.add_sink(&totals);
    let stage = stage
        .on(&orders, move |m: &parsley::Message<String, Order>| {
            let o = m.value().cloned().unwrap();
            vec![out.send(m.key().cloned(), order(&o.id, o.total * 2))]
        })
        .build()
        .unwrap();
    Shop {
        app: Parsley::named(unique("shop"), [stage]).unwrap(),
        orders,
        totals,
    }
}

fn transient_task_error(e: DriverError) -> String {
    match e {
        DriverError::Task(t) => {
            assert!(t.is_transient(), "not transient: {t}");
            t.to_string()
        }
        other => panic!("expected a task failure, got {other}"),
    }
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn a_registry_down_at_start_holds_the_record_until_it_returns() {
    let gate = Gate::new(&registry_url(), false);
    let behind =
        SchemaRegistry::new(RegistryConfig::new(gate.url()).timeout(Duration::from_secs(2)))
            .unwrap();
    let s = shop(&behind, order_schema("shop"));
    // The input is written by another producer, with the registry up.
    let writer: Codec<Order> = AvroCodec::value(&registry(), s.orders.name(), order_schema("shop"))
        .typed()
        .unwrap();
    let mut driver = TestDriver::new(&s.app).unwrap();
    let input = writer.encode(&order("o-8", 21)).unwrap();
    let id = unframe(&input).unwrap().id;
    driver
        .append_raw(
            s.orders.name(),
            0,
            Some(b"k".to_vec()),
            Some(input),
            0,
            vec![],
        )
        .unwrap();
    let e = transient_task_error(driver.run().unwrap_err());
    assert!(e.contains(&format!("schema id {id}")), "{e}");
    assert!(e.contains("unavailable"), "{e}");
    // Retries while it stays down change nothing: no output, no skip.
    let e = driver.run().unwrap_err();
    transient_task_error(e);
    assert!(driver.read_all(&s.totals).unwrap().is_empty());
    gate.open();
    driver.run().unwrap();
    assert_eq!(
        driver.read_values(&s.totals).unwrap(),
        vec![order("o-8", 42)]
    );
    assert!(driver.read_all(&s.totals).unwrap().is_empty());
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn a_registry_down_mid_run_costs_nothing_for_known_schemas_and_waits_for_new_ones() {
    let gate = Gate::new(&registry_url(), true);
    let behind =
        SchemaRegistry::new(RegistryConfig::new(gate.url()).timeout(Duration::from_secs(2)))
            .unwrap();
    let s = shop(&behind, order_v2_schema("shop"));
    let v1: Codec<Order> = AvroCodec::value(&registry(), s.orders.name(), order_schema("shop"))
        .typed()
        .unwrap();
    let mut driver = TestDriver::new(&s.app).unwrap();
    let append = |driver: &mut TestDriver, bytes: Vec<u8>| {
        driver
            .append_raw(
                s.orders.name(),
                0,
                Some(b"k".to_vec()),
                Some(bytes),
                0,
                vec![],
            )
            .unwrap();
    };
    append(&mut driver, v1.encode(&order("a", 1)).unwrap());
    driver.run().unwrap();
    let connections = gate.connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(connections > 0);
    // Down: a record under a schema already seen needs no registry.
    gate.close();
    append(&mut driver, v1.encode(&order("b", 2)).unwrap());
    driver.run().unwrap();
    // A record under a schema not seen yet (another producer's v2) waits.
    let v2: Codec<OrderV2> =
        AvroCodec::value(&registry(), s.orders.name(), order_v2_schema("shop"))
            .typed()
            .unwrap();
    let newer = v2
        .encode(&OrderV2 {
            id: "c".into(),
            total: 3,
            currency: "CHF".into(),
        })
        .unwrap();
    let id = unframe(&newer).unwrap().id;
    append(&mut driver, newer);
    let e = transient_task_error(driver.run().unwrap_err());
    assert!(e.contains(&format!("schema id {id}")), "{e}");
    gate.open();
    driver.run().unwrap();
    assert_eq!(
        driver
            .read_values(&s.totals)
            .unwrap()
            .into_iter()
            .map(|o| (o.id, o.total))
            .collect::<Vec<_>>(),
        vec![("a".into(), 2), ("b".into(), 4), ("c".into(), 6)]
    );
}

#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn a_held_record_waits_as_bytes_and_decodes_under_the_reader_schema_at_delivery() {
    let r = registry();
    let orders_topic = unique("orders");
    // The stage reads orders under v2; they were written under v1.
    let orders: Topic<String, OrderV2> = Topic::new(
        orders_topic.clone(),
        Codec::utf8(),
        AvroCodec::value(&r, &orders_topic, order_v2_schema("shop"))
            .typed()
            .unwrap(),
    );
    let written: Topic<String, Order> = Topic::new(
        orders_topic.clone(),
        Codec::utf8(),
        AvroCodec::value(&r, &orders_topic, order_schema("shop"))
            .typed()
            .unwrap(),
    );
    let customers: Topic<String, String> =
        Topic::new(unique("customers"), Codec::utf8(), Codec::utf8());
    let seen: Topic<String, String> = Topic::new(unique("seen"), Codec::utf8(), Codec::utf8());
    let mut stage = Stage::named("seen");
    let out = stage.add_sink(&seen);
    let out2 = out;
    let stage = stage
        .on(&customers, move |m: &parsley::Message<String, String>| {
            vec![out.send(m.key().cloned(), format!("customer {}", m.value().unwrap()))]
        })
        .on(&orders, move |m: &parsley::Message<String, OrderV2>| {
            let o = m.value().unwrap();
            vec![out2.send(
                m.key().cloned(),
                format!("order {} in {}", o.id, o.currency),
            )]
        })
        .build()
        .unwrap();
    let app = Parsley::named(unique("held"), [stage]).unwrap();
    let mut driver = TestDriver::new(&app).unwrap();
    // The order names the customer as its cause, and arrives first.
    let customer = driver.next_coordinate(&customers, "k").unwrap();
    driver
        .pipe_input(&written, Input::new("k", order("o-9", 9)).after(&customer))
        .unwrap();
    assert_eq!(driver.held().len(), 1);
    assert!(driver.read_all(&seen).unwrap().is_empty());
    driver.pipe(&customers, "k", "ada").unwrap();
    assert_eq!(
        driver.read_values(&seen).unwrap(),
        vec!["customer ada".to_owned(), "order o-9 in EUR".to_owned()]
    );
}

#[test]
#[ignore = "needs a schema registry and Confluent's Python client (PARSLEY_SCHEMA_REGISTRY, PARSLEY_CONFLUENT_PYTHON); the test command prepares both"]
fn records_from_confluents_serializer_decode_here_and_ours_decode_there() {
    let r = registry();
    let topic = unique("interop");
    let ns = unique("confluent");
    let schema = order_schema(&ns);
    let text = serde_json::to_string(&schema).unwrap();
    let input = "{\"id\": \"o-1\", \"total\": 12}\n{\"id\": \"ü\", \"total\": -300}\n";
    let framed = confluent(&[&registry_url(), "encode", &topic, &text], input);
    let codec: Codec<Order> = AvroCodec::value(&r, &topic, schema).typed().unwrap();
    let decoded: Vec<Order> = framed
        .lines()
        .map(|l| codec.decode(&from_hex(l)).unwrap())
        .collect();
    assert_eq!(decoded, vec![order("o-1", 12), order("ü", -300)]);
    // Ours, read by Confluent's deserializer (which finds our schema by the
    // id in our frame); and the same bytes as Confluent's, id included.
    let ours: Vec<String> = decoded
        .iter()
        .map(|o| to_hex(&codec.encode(o).unwrap()))
        .collect();
    assert_eq!(ours.join("\n"), framed);
    let read = confluent(&[&registry_url(), "decode", &topic], &ours.join("\n"));
    assert_eq!(
        read,
        "{\"id\": \"o-1\", \"total\": 12}\n{\"id\": \"\\u00fc\", \"total\": -300}"
    );
}

/// The schema as a Python or Java client would register it: keys in
/// their order ("name" before "namespace"), spaced, which is not how
/// apache-avro writes the same schema out.
fn confluent_text(ns: &str) -> String {
    format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{ns}", "fields": [{{"name": "id", "type": "string"}}, {{"name": "total", "type": "long"}}]}}"#
    )
}

fn frame_id(hex: &str) -> u32 {
    u32::from_str_radix(&hex[2..10], 16).unwrap()
}

fn versions(subject: &str) -> usize {
    let answer: serde_json::Value =
        ureq::get(format!("{}/subjects/{subject}/versions", registry_url()))
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
    answer.as_array().unwrap().len()
}

/// Confluent's client registers first, with its own spelling of the schema;
/// the codec, holding the same schema, finds that registration (normalized
/// lookup) instead of adding a version, whether it registers or only looks
/// up.
#[test]
#[ignore = "needs a schema registry and Confluent's Python client (PARSLEY_SCHEMA_REGISTRY, PARSLEY_CONFLUENT_PYTHON); the test command prepares both"]
fn a_schema_confluents_client_registered_first_keeps_its_id_for_the_codec() {
    let r = registry();
    let topic = unique("first_confluent");
    let text = confluent_text(&unique("ns"));
    let schema = Schema::parse_str(&text).unwrap();
    assert_ne!(
        serde_json::to_string(&schema).unwrap(),
        text,
        "the test needs two spellings of one schema"
    );
    let theirs = frame_id(&confluent(
        &[&registry_url(), "encode", &topic, &text],
        "{\"id\": \"o-1\", \"total\": 1}",
    ));
    for auto in [true, false] {
        let codec: Codec<Order> = AvroCodec::value(&r, &topic, schema.clone())
            .auto_register(auto)
            .typed()
            .unwrap();
        let ours = codec.encode(&order("o-2", 2)).unwrap();
        assert_eq!(
            u32::from_be_bytes(ours[1..5].try_into().unwrap()),
            theirs,
            "auto_register({auto})"
        );
    }
    assert_eq!(versions(&format!("{topic}-value")), 1);
}

/// The codec registers first. Given the schema's text, it registers that
/// text, so Confluent's client with the same file gets the same id even on
/// a registry that compares text; given a parsed schema, Confluent's client
/// finds it when it normalizes.
#[test]
#[ignore = "needs a schema registry and Confluent's Python client (PARSLEY_SCHEMA_REGISTRY, PARSLEY_CONFLUENT_PYTHON); the test command prepares both"]
fn a_schema_the_codec_registered_first_keeps_its_id_for_confluents_client() {
    let r = registry();
    let record = "{\"id\": \"o-1\", \"total\": 1}";

    let topic = unique("first_codec_text");
    let text = confluent_text(&unique("ns"));
    let codec: Codec<Order> = AvroCodec::value_text(&r, &topic, &text)
        .unwrap()
        .typed()
        .unwrap();
    let ours = codec.encode(&order("o-1", 1)).unwrap();
    let theirs = confluent(&[&registry_url(), "encode", &topic, &text], record);
    assert_eq!(
        frame_id(&theirs),
        u32::from_be_bytes(ours[1..5].try_into().unwrap())
    );
    assert_eq!(theirs, common::to_hex(&ours));
    assert_eq!(versions(&format!("{topic}-value")), 1);

    let topic = unique("first_codec_parsed");
    let text = confluent_text(&unique("ns"));
    let codec: Codec<Order> = AvroCodec::value(&r, &topic, Schema::parse_str(&text).unwrap())
        .typed()
        .unwrap();
    let ours = codec.encode(&order("o-1", 1)).unwrap();
    let theirs = confluent(
        &[
            &registry_url(),
            "encode",
            &topic,
            &text,
            r#"{"normalize.schemas": true}"#,
        ],
        record,
    );
    assert_eq!(
        frame_id(&theirs),
        u32::from_be_bytes(ours[1..5].try_into().unwrap())
    );
    assert_eq!(versions(&format!("{topic}-value")), 1);
}

/// Registers `text` under `subject` as a Java producer or Kafka Connect
/// would (their own spelling, with their properties); its id.
fn register_as_java(subject: &str, text: &str) -> u32 {
    let answer: serde_json::Value =
        ureq::post(format!("{}/subjects/{subject}/versions", registry_url()))
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .send(serde_json::json!({ "schema": text }).to_string())
            .unwrap()
            .into_body()
            .read_json()
            .unwrap();
    u32::try_from(answer["id"].as_u64().unwrap()).unwrap()
}

/// A schema a Java producer or Kafka Connect registered, with properties
/// apache-avro does not keep (`avro.java.string` on a string) and
/// Connect's `connect.*`: a lookup-only codec finds it by the same text
/// (`value_text`), an encoder pinned to the latest version or to its id
/// writes with it, and a new version registered later is what a codec
/// built then writes with.
#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn codecs_find_and_write_with_a_schema_java_or_connect_registered() {
    let r = registry();
    let topic = unique("connect");
    let subject = format!("{topic}-value");
    let ns = unique("java");
    let java = format!(
        r#"{{"type":"record","name":"Order","namespace":"{ns}","fields":[{{"name":"id","type":{{"type":"string","avro.java.string":"String"}}}},{{"name":"total","type":"long"}}],"connect.name":"{ns}.Order","connect.version":1}}"#
    );
    let id = register_as_java(&subject, &java);
    // The registered text kept the properties.
    assert!(r.schema(id).unwrap().text.contains("avro.java.string"));

    let by_text: Codec<Order> = AvroCodec::value_text(&r, &topic, &java)
        .unwrap()
        .auto_register(false)
        .typed()
        .unwrap();
    let latest: Codec<Order> = AvroCodec::value(&r, &topic, order_schema(&ns))
        .use_latest_version()
        .typed()
        .unwrap();
    let pinned: Codec<Order> = AvroCodec::value(&r, &topic, order_schema(&ns))
        .use_schema_id(id)
        .typed()
        .unwrap();
    for codec in [&by_text, &latest, &pinned] {
        let bytes = codec.encode(&order("o-1", 5)).unwrap();
        assert_eq!(u32::from_be_bytes(bytes[1..5].try_into().unwrap()), id);
        assert_eq!(codec.decode(&bytes).unwrap(), order("o-1", 5));
    }
    assert_eq!(versions(&subject), 1, "nothing was registered");

    // Version 2 adds a field with a default: a codec built now writes with
    // it (the default filled in for the value that lacks the field).
    let java_v2 = java.replace(
        r#"{"name":"total","type":"long"}"#,
        r#"{"name":"total","type":"long"},{"name":"currency","type":"string","default":"EUR"}"#,
    );
    assert_ne!(java_v2, java);
    let id_v2 = register_as_java(&subject, &java_v2);
    assert_ne!(id_v2, id);
    let latest_now: Codec<Order> = AvroCodec::value(&r, &topic, order_schema(&ns))
        .use_latest_version()
        .typed()
        .unwrap();
    let bytes = latest_now.encode(&order("o-2", 7)).unwrap();
    assert_eq!(u32::from_be_bytes(bytes[1..5].try_into().unwrap()), id_v2);
    let v2: Codec<OrderV2> = AvroCodec::value(&r, &topic, order_v2_schema(&ns))
        .typed()
        .unwrap();
    assert_eq!(
        v2.decode(&bytes).unwrap(),
        OrderV2 {
            id: "o-2".into(),
            total: 7,
            currency: "EUR".into()
        }
    );
    // The codec built before still writes with the version it read.
    let bytes = latest.encode(&order("o-3", 1)).unwrap();
    assert_eq!(u32::from_be_bytes(bytes[1..5].try_into().unwrap()), id);
}

/// The guide's example (docs/guide/src/codecs.md includes the part between
/// the ANCHOR lines).
#[test]
#[ignore = "needs a schema registry (PARSLEY_SCHEMA_REGISTRY); the test command starts one"]
fn the_guide_example_an_avro_stage() -> Result<(), Box<dyn std::error::Error>> {
    let url = registry_url();
    let (payments_topic, receipts_topic) = (unique("payments"), unique("receipts"));
    let (payments_topic, receipts_topic) = (payments_topic.as_str(), receipts_topic.as_str());
    // ANCHOR: avro
    use apache_avro::AvroSchema;
    use parsley_schema::{AvroCodec, RegistryConfig, SchemaRegistry};

    // The record types; their Avro schemas are derived.
    #[derive(AvroSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[avro(namespace = "shop")]
    struct Payment {
        order: String,
        cents: i64,
    }
    #[derive(AvroSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[avro(namespace = "shop")]
    struct Receipt {
        order: String,
        text: String,
    }

    // One client per registry, shared by every codec: it caches what it
    // learns, so each schema is fetched or registered once.
    let registry = SchemaRegistry::new(RegistryConfig::new(&url).timeout(Duration::from_secs(5)))?;

    // Keys stay canonical (UTF-8); values are Avro in Confluent's framing,
    // under the subjects `<topic>-value`.
    let payments: Topic<String, Payment> = Topic::new(
        payments_topic,
        Codec::utf8(),
        AvroCodec::value_of::<Payment>(&registry, payments_topic).typed()?,
    );
    let receipts: Topic<String, Receipt> = Topic::new(
        receipts_topic,
        Codec::utf8(),
        AvroCodec::value_of::<Receipt>(&registry, receipts_topic).typed()?,
    );

    let mut cashier = Stage::named("cashier");
    let out = cashier.add_sink(&receipts);
    let cashier = cashier
        .on(&payments, move |m: &parsley::Message<String, Payment>| {
            let p = m.value().cloned().unwrap();
            let text = format!("paid {}.{:02}", p.cents / 100, p.cents % 100);
            vec![out.send(
                m.key().cloned(),
                Receipt {
                    order: p.order,
                    text,
                },
            )]
        })
        .build()?;
    let app = Parsley::named("shop", [cashier])?;

    // In the TestDriver, as on Kafka, the codecs talk to the registry.
    let mut driver = TestDriver::new(&app)?;
    driver.pipe(
        &payments,
        "acct-1",
        Payment {
            order: "o-1".into(),
            cents: 1250,
        },
    )?;
    assert_eq!(
        driver.read_values(&receipts)?,
        vec![Receipt {
            order: "o-1".into(),
            text: "paid 12.50".into()
        }]
    );
    // ANCHOR_END: avro
    Ok(())
}
