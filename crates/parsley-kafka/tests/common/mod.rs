//! What the broker suites share: the broker address, unique names, topic
//! creation, and a `read_committed` reader.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod assignments;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The broker under test: `PARSLEY_BOOTSTRAP`.
pub fn bootstrap() -> String {
    std::env::var("PARSLEY_BOOTSTRAP")
        .expect("set PARSLEY_BOOTSTRAP to a broker address (the test command does)")
}

/// A client configuration for the broker under test.
pub fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap());
    c
}

/// The runtime options the broker suites start from: the defaults, with
/// the group protocol `PARSLEY_TEST_GROUP_PROTOCOL` names (`classic`,
/// `consumer`, or `auto`, the default: chosen by what the cluster serves,
/// which is the consumer protocol on Kafka 4.0 and later), so the suite
/// runs under either protocol and on older brokers.
pub fn options() -> parsley_kafka::StreamsOptions {
    let group_protocol = match std::env::var("PARSLEY_TEST_GROUP_PROTOCOL").as_deref() {
        Ok("classic") => parsley_kafka::GroupProtocol::Classic,
        Ok("consumer") => parsley_kafka::GroupProtocol::Consumer,
        Ok("auto") | Err(_) => parsley_kafka::GroupProtocol::Auto,
        Ok(other) => {
            panic!("PARSLEY_TEST_GROUP_PROTOCOL={other:?}: use classic, consumer or auto")
        }
    };
    parsley_kafka::StreamsOptions {
        group_protocol,
        ..parsley_kafka::StreamsOptions::default()
    }
}

/// A name no earlier run used.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("pt-{prefix}-{nanos}")
}

/// Creates topics and waits until the broker describes them.
pub fn create_topics(names: &[(&str, i32)]) {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|(n, p)| NewTopic::new(n, *p, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in block_on(cluster.admin().create_topics(&topics, &opts)).unwrap() {
        r.unwrap();
    }
    for (n, _) in names {
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.describe(n).is_err() {
            assert!(Instant::now() < deadline, "topic {n} did not appear");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One committed record as read back.
pub struct Read {
    pub key: String,
    pub value: String,
    /// The value's bytes as they were (binary payloads: Avro, framed).
    pub raw_value: Vec<u8>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Every committed record of `topic` (partitions `0..partitions`), read
/// from the beginning until `n` arrived or `within` passed.
pub fn read_committed(topic: &str, partitions: i32, n: usize, within: Duration) -> Vec<Read> {
    let mut c = config();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            out.push(Read {
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                raw_value: m.payload().unwrap_or_default().to_vec(),
                headers: m
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    out
}

// ANCHOR: acks
/// Remembers the partition and offset of each acknowledged send.
#[derive(Default)]
pub struct Acks(pub std::sync::Mutex<Vec<(i32, i64)>>);

impl rdkafka::ClientContext for Acks {}

impl rdkafka::producer::ProducerContext for Acks {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        use rdkafka::message::Message as _;
        if let Ok(m) = result {
            self.0.lock().unwrap().push((m.partition(), m.offset()));
        }
    }
}
// ANCHOR_END: acks
