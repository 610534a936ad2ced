//! End-to-end throughput on a broker: the same consume-transform-produce
//! work done by a plain rdkafka exactly-once loop and by a Parsley stage,
//! each timed from start until a reader has seen every output.
//!
//! ```text
//! cargo run --release -p parsley-kafka --example throughput -- BOOTSTRAP [RECORDS]
//! ```

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::{Codec, Message, Parsley, Stage, Topic};
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("tp-{prefix}-{nanos}")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bootstrap = args
        .first()
        .ok_or("usage: throughput BOOTSTRAP [RECORDS]")?;
    let n: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", bootstrap);
    let cluster = KafkaCluster::new(&base, Duration::from_secs(30))?;
    let (input, plain_out, parsley_out) = (unique("in"), unique("plain"), unique("parsley"));
    let topics: Vec<NewTopic<'_>> = [&input, &plain_out, &parsley_out]
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for r in block_on(cluster.admin().create_topics(&topics, &AdminOptions::new()))? {
        r.map_err(|(t, e)| format!("{t}: {e}"))?;
    }
    std::thread::sleep(Duration::from_secs(1));
    let producer: BaseProducer = base.create()?;
    for i in 0..n {
        let key = format!("k{i}");
        let value = format!("{i:0>64}");
        let mut record = BaseRecord::to(&input)
            .partition(0)
            .key(&key)
            .payload(&value);
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

    let plain = plain_loop(&base, &input, &plain_out, n)?;
    println!(
        "plain rdkafka exactly-once loop: {n} records in {plain:.2?} ({:.0} records/s)",
        n as f64 / plain.as_secs_f64()
    );

    let started = Instant::now();
    let src = Topic::new(input.as_str(), Codec::utf8(), Codec::utf8());
    let dst = Topic::new(parsley_out.as_str(), Codec::utf8(), Codec::utf8());
    let out = dst.clone();
    let stage = Stage::named("copy")
        .on(&src, move |m: &Message<String, String>| {
            vec![out.send(m.key().cloned(), m.value().cloned())]
        })
        .sink(&dst)
        .build()?;
    let app = Parsley::named(unique("app").as_str(), [stage])?;
    let mut streams = CausalStreams::new(&app, base.clone())?.with_options(StreamsOptions {
        instance_id: Some("bench".to_owned()),
        ..StreamsOptions::default()
    });
    streams.start()?;
    wait_for(&base, &parsley_out, n)?;
    let parsley = started.elapsed();
    streams.close(Duration::from_secs(30))?;
    println!(
        "parsley stage:                   {n} records in {parsley:.2?} ({:.0} records/s)",
        n as f64 / parsley.as_secs_f64()
    );
    Ok(())
}

/// Reads `topic` (read_committed) until `n` records were seen.
fn wait_for(base: &ClientConfig, topic: &str, n: usize) -> Result<()> {
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("reader"));
    let reader: BaseConsumer = c.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    reader.assign(&tpl)?;
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen < n {
        if Instant::now() > deadline {
            return Err(format!("only {seen} of {n} records arrived").into());
        }
        if let Some(Ok(_)) = reader.poll(Duration::from_millis(100)) {
            seen += 1;
        }
    }
    Ok(())
}

/// A plain exactly-once consume-transform-produce loop: transactions every
/// 100 ms, offsets sent with the consumer's group metadata.
fn plain_loop(base: &ClientConfig, input: &str, output: &str, n: usize) -> Result<Duration> {
    let started = Instant::now();
    let mut c = base.clone();
    c.set("isolation.level", "read_committed")
        .set("group.id", unique("plain"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[input])?;
    let mut p = base.clone();
    p.set("transactional.id", unique("plain-txn"));
    let producer: BaseProducer = p.create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    let mut done = 0;
    let mut next = 0i64;
    let mut last_commit = Instant::now();
    while done < n {
        if let Some(m) = consumer.poll(Duration::from_millis(20)) {
            let m = m?;
            let mut record = BaseRecord::<[u8], [u8]>::to(output).partition(0);
            if let Some(k) = m.key() {
                record = record.key(k);
            }
            if let Some(v) = m.payload() {
                record = record.payload(v);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        producer.poll(Duration::from_millis(5));
                        record = back;
                    }
                }
            }
            next = m.offset() + 1;
            done += 1;
        }
        if last_commit.elapsed() > Duration::from_millis(100) || done == n {
            let mut offsets = TopicPartitionList::new();
            offsets.add_partition_offset(input, 0, Offset::Offset(next))?;
            let metadata = consumer.group_metadata().ok_or("no group metadata")?;
            producer.send_offsets_to_transaction(&offsets, &metadata, Duration::from_secs(30))?;
            producer.commit_transaction(Duration::from_secs(30))?;
            producer.begin_transaction()?;
            last_commit = Instant::now();
        }
    }
    producer.abort_transaction(Duration::from_secs(30))?;
    wait_for(base, output, n)?;
    Ok(started.elapsed())
}
