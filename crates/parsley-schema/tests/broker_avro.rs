//! Avro stages on a real broker (`PARSLEY_BOOTSTRAP`) with a real registry
//! (`PARSLEY_SCHEMA_REGISTRY`): inputs written by Confluent's serializer,
//! outputs read back by Confluent's deserializer, and a registry that goes
//! away while the stage runs.

mod common;
/// The broker suites' helpers (the broker's address, topics, a
/// read_committed reader), shared with parsley-kafka's.
#[path = "../../parsley-kafka/tests/common/mod.rs"]
mod kafka;

use std::time::{Duration, Instant};

use apache_avro::Schema;
use common::{Gate, confluent, from_hex, registry_url, to_hex, unique};
use kafka::config;
use parsley::{Codec, Message, Parsley, Stage, Topic};
use parsley_kafka::{Backoff, CausalStreams, StreamsOptions, StreamsState};
use parsley_schema::{AvroCodec, RegistryConfig, SchemaRegistry};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};

fn produce(topic: &str, key: &str, value: &[u8]) {
    let producer: BaseProducer = config().create().unwrap();
    producer
        .send(BaseRecord::to(topic).partition(0).key(key).payload(value))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
}

/// The committed values of `topic`, read until `n` arrived or `within`
/// passed.
fn read_committed(topic: &str, n: usize, within: Duration) -> Vec<Vec<u8>> {
    kafka::read_committed(topic, 1, n, within)
        .into_iter()
        .map(|r| r.raw_value)
        .collect()
}

fn create_topics(names: &[&str]) {
    let names: Vec<(&str, i32)> = names.iter().map(|n| (*n, 1)).collect();
    kafka::create_topics(&names);
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Order {
    id: String,
    total: i64,
}

fn order_schema(namespace: &str, extra: &str) -> Schema {
    Schema::parse_str(&format!(
        r#"{{"type": "record", "name": "Order", "namespace": "{namespace}",
            "fields": [{{"name": "id", "type": "string"}}, {{"name": "total", "type": "long"}}{extra}]}}"#
    ))
    .unwrap()
}

/// A stage that doubles each order's total, Avro in and Avro out, its
/// codecs on `registry`.
fn doubler(registry: &SchemaRegistry, orders: &str, doubled: &str) -> Parsley {
    let schema = order_schema("shop", "");
    let orders: Topic<String, Order> = Topic::new(
        orders,
        Codec::utf8(),
        AvroCodec::value(registry, orders, schema.clone())
            .typed()
            .unwrap(),
    );
    let doubled: Topic<String, Order> = Topic::new(
        doubled,
        Codec::utf8(),
        AvroCodec::value(registry, doubled, schema).typed().unwrap(),
    );
    let mut stage = Stage::named("doubler");
    let out = stage.add_sink(&doubled);
    let stage = stage
        .on(&orders, move |m: &Message<String, Order>| {
            let o = m.value().cloned().unwrap();
            vec![out.send(
                m.key().cloned(),
                Order {
                    id: o.id,
                    total: o.total * 2,
                },
            )]
        })
        .build()
        .unwrap();
    Parsley::named(unique("avro-app"), [stage]).unwrap()
}

fn start(app: &Parsley) -> CausalStreams {
    let mut s = CausalStreams::new(app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            task_backoff: Backoff {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(1),
            },
            state_dir: None,
            ..StreamsOptions::default()
        });
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(30)).unwrap();
    s
}

#[test]
#[ignore = "needs a broker, a schema registry and Confluent's Python client (PARSLEY_BOOTSTRAP, PARSLEY_SCHEMA_REGISTRY, PARSLEY_CONFLUENT_PYTHON); the test command prepares them"]
fn an_avro_stage_reads_what_confluent_wrote_and_writes_what_confluent_reads() {
    let (orders, doubled) = (unique("avro-orders"), unique("avro-doubled"));
    create_topics(&[&orders, &doubled]);
    let registry = SchemaRegistry::at(registry_url()).unwrap();
    let app = doubler(&registry, &orders, &doubled);
    let mut streams = start(&app);
    // Confluent's serializer writes the inputs, with a schema of its own
    // text (the same record), registered under the topic's subject.
    let text = serde_json::to_string(&order_schema("shop", "")).unwrap();
    let input = "{\"id\": \"o-1\", \"total\": 5}\n{\"id\": \"o-2\", \"total\": -7}\n";
    for (i, hex) in confluent(&[&registry_url(), "encode", &orders, &text], input)
        .lines()
        .enumerate()
    {
        produce(&orders, &format!("k{i}"), &from_hex(hex));
    }
    let out = read_committed(&doubled, 2, Duration::from_secs(60));
    assert_eq!(out.len(), 2, "both orders were doubled");
    // Confluent's deserializer reads the outputs: our frames name schema
    // ids its client resolves, and our datums are what it expects.
    let hex: Vec<String> = out.iter().map(|b| to_hex(b)).collect();
    assert_eq!(
        confluent(&[&registry_url(), "decode", &doubled], &hex.join("\n")),
        "{\"id\": \"o-1\", \"total\": 10}\n{\"id\": \"o-2\", \"total\": -14}"
    );
    streams.close(Duration::from_secs(30)).unwrap();
}

#[test]
#[ignore = "needs a broker and a schema registry (PARSLEY_BOOTSTRAP, PARSLEY_SCHEMA_REGISTRY); the test command starts both"]
fn a_registry_that_goes_away_mid_run_holds_the_stage_and_loses_nothing() {
    let (orders, doubled) = (unique("avro-orders"), unique("avro-doubled"));
    create_topics(&[&orders, &doubled]);
    let gate = Gate::new(&registry_url(), true);
    let behind =
        SchemaRegistry::new(RegistryConfig::new(gate.url()).timeout(Duration::from_secs(1)))
            .unwrap();
    let app = doubler(&behind, &orders, &doubled);
    // No error handler: a transient codec failure restarts the task in
    // place by default.
    let mut streams = start(&app);
    let direct = SchemaRegistry::at(registry_url()).unwrap();
    let v1: Codec<Order> = AvroCodec::value(&direct, &orders, order_schema("shop", ""))
        .typed()
        .unwrap();
    produce(
        &orders,
        "a",
        &v1.encode(&Order {
            id: "a".into(),
            total: 1,
        })
        .unwrap(),
    );
    assert_eq!(
        read_committed(&doubled, 1, Duration::from_secs(60)).len(),
        1
    );

    // The registry goes away, and a producer writes under a schema the
    // stage has not seen (a compatible new version).
    gate.close();
    let v2: Codec<Order> = AvroCodec::value(
        &direct,
        &orders,
        order_schema(
            "shop",
            r#", {"name": "note", "type": "string", "default": ""}"#,
        ),
    )
    .typed()
    .unwrap();
    produce(
        &orders,
        "b",
        &v2.encode(&Order {
            id: "b".into(),
            total: 2,
        })
        .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while streams.restarted_tasks() < 2 {
        assert!(
            Instant::now() < deadline,
            "the task did not fail and restart while the registry was away"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(streams.state(), StreamsState::Running);
    assert_eq!(
        read_committed(&doubled, 2, Duration::from_secs(2)).len(),
        1,
        "nothing past the record is written while it cannot be decoded"
    );

    gate.open();
    let v1_reader = AvroCodec::value(&direct, &doubled, order_schema("shop", ""))
        .typed::<Order>()
        .unwrap();
    let out: Vec<Order> = read_committed(&doubled, 3, Duration::from_secs(30))
        .iter()
        .map(|b| v1_reader.decode(b).unwrap())
        .collect();
    assert_eq!(
        out,
        vec![
            Order {
                id: "a".into(),
                total: 2
            },
            Order {
                id: "b".into(),
                total: 4
            }
        ],
        "each order doubled once, none skipped"
    );
    assert_eq!(streams.state(), StreamsState::Running);
    streams.close(Duration::from_secs(30)).unwrap();
}
