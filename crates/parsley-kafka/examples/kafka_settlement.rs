//! The settlement application on a Kafka cluster: the same application the
//! TestDriver example runs (`cargo run -p parsley --example settlement`),
//! through the exactly-once runtime.
//!
//! ```text
//! cargo run -p parsley-kafka --example kafka_settlement -- --bootstrap HOST:PORT [--metrics ADDR]
//! ```
//!
//! With `--metrics ADDR` (port 0 picks a free one) it serves the task
//! metrics on a Prometheus scrape endpoint while it runs, scrapes it once
//! itself at the end and prints the Parsley series it found.
//!
//! It creates three fresh topics (named after the run), starts the
//! application, produces a payment, an order, a payment its producer
//! stamped as caused by an order not yet written, and then that order, and
//! prints the settlements: the stamped payment waits for its order, so the
//! balances come out as in the TestDriver run.

#[path = "../../parsley/examples/shared/settlement_app.rs"]
mod settlement_app;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::protocol::headers::CLOCK_HEADER;
use parsley::protocol::{BrokerOffsets, Channel, TopicOffsets, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use settlement_app::{
    Order, Payment, Settlement, order_codec, payment_codec, settled_codec, settlement_app,
};

type Error = Box<dyn std::error::Error>;

/// The end offset of a channel (where the next record lands).
fn end_of(cluster: &KafkaCluster, c: Channel) -> Result<i64, Error> {
    match cluster.end_offsets(&[c.topic].into())?.get(&c.topic) {
        Some(TopicOffsets::Present(p)) => Ok(p.get(&c.partition).copied().unwrap_or(0)),
        _ => Err(format!("no end offset for {c}").into()),
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (bootstrap, metrics_addr) = match args.as_slice() {
        [flag, b] if flag == "--bootstrap" => (b.clone(), None),
        [flag, b, m, addr] if flag == "--bootstrap" && m == "--metrics" => {
            (b.clone(), Some(addr.clone()))
        }
        _ => {
            eprintln!("usage: settlement --bootstrap HOST:PORT [--metrics ADDR]");
            std::process::exit(2);
        }
    };
    let metrics_addr = match metrics_addr {
        Some(a) => Some(serve_metrics(&a)?),
        None => None,
    };
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let Settlement {
        app,
        orders,
        payments,
        settlements,
    } = settlement_app(&format!("settlements-app-{run}"), &format!("run-{run}-"))?;
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &bootstrap);
    let cluster = KafkaCluster::new(&config, Duration::from_secs(30))?;
    let topics: Vec<NewTopic<'_>> = [orders.name(), payments.name(), settlements.name()]
        .into_iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for r in block_on(cluster.admin().create_topics(&topics, &AdminOptions::new()))? {
        r.map_err(|(t, e)| format!("creating {t}: {e}"))?;
    }
    for t in [orders.name(), payments.name(), settlements.name()] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.describe(t).is_err() {
            if Instant::now() > deadline {
                return Err(format!("topic {t} did not appear").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let mut streams = CausalStreams::new(&app, config.clone())?.with_options(StreamsOptions {
        commit_interval: Duration::from_millis(50),
        ..StreamsOptions::default()
    });
    streams.start()?;
    streams.wait_until_running(Duration::from_secs(30))?;

    // A plain producer that stamps its sends: each one claims every send it
    // made before (as a causal clock on a plain client does), so the
    // application sees them in the order they were made.
    let producer: BaseProducer = config.create()?;
    let mut clock = VectorClock::new();
    // `refund_for`: sent by another service (the refunds), stamped only as
    // caused by the next record of that channel, not yet written.
    let mut send =
        |topic: &str, value: Vec<u8>, refund_for: Option<Channel>| -> Result<(), Error> {
            let stamp = match refund_for {
                None => clock.clone(),
                Some(c) => {
                    let mut s = VectorClock::new();
                    s.claim_offset(c, end_of(&cluster, c)?);
                    s
                }
            };
            let record = BaseRecord::to(topic)
                .partition(0)
                .key("acct-1")
                .payload(&value)
                .headers(OwnedHeaders::new().insert(rdkafka::message::Header {
                    key: CLOCK_HEADER,
                    value: Some(&stamp.encode()),
                }));
            producer.send(record).map_err(|(e, _)| e)?;
            producer.flush(Duration::from_secs(20))?;
            if refund_for.is_none() {
                let written = Channel::new(cluster.describe(topic)?.id, 0);
                clock.claim_offset(written, end_of(&cluster, written)? - 1);
            }
            Ok(())
        };
    send(
        payments.name(),
        payment_codec().encode(&Payment { amount: 10_000 })?,
        None,
    )?;
    send(
        orders.name(),
        order_codec().encode(&Order {
            id: "o-1".into(),
            total: 2_500,
        })?,
        None,
    )?;
    // A refund-like payment stamped as caused by the next order, which is
    // not written yet: it waits at the gate until that order is delivered.
    let orders0 = Channel::new(cluster.describe(orders.name())?.id, 0);
    send(
        payments.name(),
        payment_codec().encode(&Payment { amount: 4_000 })?,
        Some(orders0),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    send(
        orders.name(),
        order_codec().encode(&Order {
            id: "o-2".into(),
            total: 4_000,
        })?,
        None,
    )?;

    let mut reader_config = config.clone();
    reader_config
        .set("isolation.level", "read_committed")
        .set("group.id", format!("settlement-reader-{run}"));
    let reader: BaseConsumer = reader_config.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(settlements.name(), 0, Offset::Beginning)?;
    reader.assign(&tpl)?;
    let mut balances = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while balances.len() < 2 && Instant::now() < deadline {
        if let Some(m) = reader.poll(Duration::from_millis(100)) {
            let m = m?;
            let settled = settled_codec().decode(m.payload().unwrap_or_default())?;
            println!(
                "{}:{}@{} {:?}",
                m.topic(),
                m.partition(),
                m.offset(),
                settled
            );
            balances.push(settled.balance);
        }
    }
    // ANCHOR: metrics_check
    if let Some(addr) = metrics_addr {
        // Gauges are sampled every 500 ms: let one sample pass.
        std::thread::sleep(Duration::from_millis(700));
        let page = scrape(addr)?;
        let ours: Vec<&str> = page
            .lines()
            .filter(|l| {
                l.starts_with("records_") || l.starts_with("ticks_") || l.starts_with("stamp_")
            })
            .collect();
        for l in &ours {
            println!("metrics: {l}");
        }
        let delivered = ours
            .iter()
            .find(|l| {
                l.starts_with("records_delivered_total{") && l.contains("stage=\"settlement\"")
            })
            .ok_or("no records_delivered_total series on the endpoint")?;
        if delivered.rsplit(' ').next() != Some("4") {
            return Err(format!("expected 4 records delivered: {delivered}").into());
        }
    }
    // ANCHOR_END: metrics_check
    streams.close(Duration::from_secs(30))?;
    // o-2 settles before the held payment is applied: 10000 - 2500 - 4000.
    if balances != vec![7_500, 3_500] {
        return Err(format!("unexpected balances {balances:?}").into());
    }
    println!("balances as in the TestDriver run: {balances:?}");
    Ok(())
}

// ANCHOR: serve_metrics
/// Installs the Prometheus recorder with a scrape endpoint on `addr` (port
/// 0: a free one) and returns the address it listens on. Series of tasks
/// that moved away are dropped after a minute without updates.
fn serve_metrics(addr: &str) -> Result<std::net::SocketAddr, Error> {
    let mut addr: std::net::SocketAddr = addr.parse()?;
    if addr.port() == 0 {
        addr = std::net::TcpListener::bind(addr)?.local_addr()?;
    }
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .idle_timeout(
            metrics_util::MetricKindMask::ALL,
            Some(Duration::from_secs(60)),
        )
        .install()?;
    println!("metrics on http://{addr}/metrics");
    Ok(addr)
}
// ANCHOR_END: serve_metrics

/// One plain HTTP GET of the scrape endpoint.
fn scrape(addr: std::net::SocketAddr) -> Result<String, Error> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut page = String::new();
    stream.read_to_string(&mut page)?;
    Ok(page)
}
