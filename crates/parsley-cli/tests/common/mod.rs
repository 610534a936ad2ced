//! What the CLI's broker tests share: the broker address, unique names,
//! topic creation and running the built `parsley` binary.
#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

/// The broker under test: `PARSLEY_BOOTSTRAP`.
pub fn bootstrap() -> String {
    std::env::var("PARSLEY_BOOTSTRAP").expect("set PARSLEY_BOOTSTRAP to a broker address")
}

/// A client configuration for the broker under test.
pub fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap());
    c
}

/// A name no earlier run used.
pub fn unique(prefix: &str) -> String {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("pt-{prefix}-{n}")
}

/// A `read_committed` consumer in a group of its own, reading partitions
/// `0..partitions` of `topic` from the beginning.
pub fn reader(topic: &str, partitions: i32) -> rdkafka::consumer::BaseConsumer {
    use rdkafka::consumer::Consumer;
    let mut c = config();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false");
    let consumer: rdkafka::consumer::BaseConsumer = c.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    consumer
}

/// Creates topics and waits until the broker describes them.
pub fn create(cluster: &KafkaCluster, topics: &[(&str, i32)]) {
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(n, p)| NewTopic::new(n, *p, TopicReplication::Fixed(1)))
        .collect();
    for r in block_on(cluster.admin().create_topics(&new, &AdminOptions::new())).unwrap() {
        r.unwrap();
    }
    for (n, _) in topics {
        let mut tries = 0;
        while cluster.describe(n).is_err() {
            tries += 1;
            assert!(tries < 100, "{n} did not appear");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `parsley` with `args`: whether it succeeded, and its stdout
/// followed by its stderr.
pub fn parsley(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A stage named `name` that copies `input` to `output` and refuses the
/// record whose value is "poison" (its logic fails on it).
pub fn refusing_stage(name: &str, input: &str, output: &str) -> parsley::Stage {
    use parsley::{Codec, Emission, Message, Stage, Topic};
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut builder = Stage::named(name);
    let out = builder.add_sink(&t(output));
    builder
        .on(
            &t(input),
            move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
                if m.value().map(String::as_str) == Some("poison") {
                    return Err("cannot handle this".into());
                }
                Ok(vec![out.send(m.key().cloned(), m.value().cloned())])
            },
        )
        .build()
        .unwrap()
}
