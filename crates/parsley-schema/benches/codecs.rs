//! What a registry codec costs per record once its schemas are cached, next
//! to plain Avro and serde JSON:
//! `cargo bench -p parsley-schema --bench codecs`.
//!
//! The registry is a stand-in served from this process (it answers the two
//! requests the codecs make, once each); every measured call is a cache
//! hit, as on the hot path.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use apache_avro::Schema;
use criterion::{Criterion, criterion_group, criterion_main};
use parsley::Codec;
use parsley_schema::{AvroCodec, PlainAvro, SchemaRegistry};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Order {
    id: String,
    customer: String,
    total: i64,
    note: Option<String>,
}

const SCHEMA: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"}, {"name": "customer", "type": "string"},
    {"name": "total", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": null}]}"#;

/// A registry that knows one schema, under id 1.
fn stand_in_registry() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut first, mut length) = (String::new(), 0usize);
            reader.read_line(&mut first).unwrap();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let answer = if first.starts_with("GET") {
                serde_json::json!({ "schema": SCHEMA }).to_string()
            } else {
                r#"{"id": 1}"#.to_owned()
            };
            let mut stream = stream;
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{answer}",
                answer.len()
            )
            .unwrap();
        }
    });
    url
}

fn codecs(c: &mut Criterion) {
    let order = Order {
        id: "o-123456".into(),
        customer: "customer-42".into(),
        total: 12_345,
        note: Some("gift".into()),
    };
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let registry = SchemaRegistry::at(stand_in_registry()).unwrap();
    let cases: [(&str, Codec<Order>); 3] = [
        (
            "avro-registry",
            AvroCodec::value(&registry, "orders", schema.clone())
                .typed()
                .unwrap(),
        ),
        ("avro-plain", PlainAvro::new(schema).typed()),
        ("json", Codec::json()),
    ];
    for (name, codec) in cases {
        // Warm: the registry codec registers and fetches here, once.
        let bytes = codec.encode(&order).unwrap();
        assert_eq!(codec.decode(&bytes).unwrap(), order);
        c.bench_function(&format!("encode/{name}"), |b| {
            b.iter(|| codec.encode(black_box(&order)).unwrap())
        });
        c.bench_function(&format!("decode/{name}"), |b| {
            b.iter(|| codec.decode(black_box(&bytes)).unwrap())
        });
    }
}

criterion_group!(benches, codecs);
criterion_main!(benches);
