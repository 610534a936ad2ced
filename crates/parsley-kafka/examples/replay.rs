//! Changelog replay on a cluster: how long a restore takes per changelog
//! partition, empty and full, through the runtime's own reader
//! (`KafkaCluster::replay_changelog`, one reused consumer per stream
//! thread).
//!
//! ```text
//! PARSLEY_BOOTSTRAP=127.0.0.1:9092 cargo run --release -p parsley-kafka --example replay -- [PARTITIONS [RECORDS]]
//! ```
//!
//! It creates a topic of PARTITIONS (default 6) partitions, fills the last
//! one with RECORDS (default 200000) records of 100-byte values over 10k
//! keys, leaves the others empty, and replays each partition in turn on
//! one `KafkaCluster`, as a stream thread restoring its tasks does. The
//! first replay includes the replay consumer's set-up.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley::runtime::host::ChangelogReader;
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let partitions: i32 = args.next().map_or(Ok(6), |a| a.parse())?;
    let records: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let bootstrap =
        std::env::var("PARSLEY_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let topic = format!("replay-bench-{nanos}-state-changelog");
    let setup = KafkaCluster::new(&config, Duration::from_secs(30))?;
    let new = NewTopic::new(&topic, partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    for r in futures_executor::block_on(setup.admin().create_topics([&new], &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    while setup.describe(&topic).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let producer: BaseProducer = config
        .clone()
        .set("linger.ms", "20")
        .set("enable.idempotence", "true")
        .create()?;
    let value = vec![b'v'; 100];
    let full = partitions - 1;
    for i in 0..records {
        let key = format!("key-{}", i % 10_000);
        let mut record = BaseRecord::<str, [u8]>::to(&topic)
            .partition(full)
            .key(key.as_str())
            .payload(value.as_slice());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(5));
                    record = back;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    println!("replay of {topic}: {partitions} partitions, {records} records in partition {full}");
    let cluster = KafkaCluster::new(&config, Duration::from_secs(30))?;
    for p in 0..partitions {
        let started = Instant::now();
        let mut n = 0u64;
        cluster.replay_changelog(&topic, p, &mut |_| n += 1)?;
        let took = started.elapsed();
        let rate = if n > 0 {
            format!(", {:.0} records/s", n as f64 / took.as_secs_f64())
        } else {
            String::new()
        };
        println!(
            "  partition {p}: {n} records in {:.1} ms{rate}{}",
            took.as_secs_f64() * 1e3,
            if p == 0 {
                " (includes the consumer's set-up)"
            } else {
                ""
            }
        );
    }
    futures_executor::block_on(setup.admin().delete_topics(&[&topic], &AdminOptions::new()))?;
    Ok(())
}
