//! `parsley holds` against a running application on a live broker
//! (`PARSLEY_BOOTSTRAP`): a payment held for its order is reported with its
//! cause, from the application's diagnostics topic; once the order arrives,
//! nothing is held.

mod common;

use std::time::{Duration, Instant};

use common::{bootstrap, create, parsley, unique};
use parsley::protocol::headers::CLOCK_HEADER;
use parsley::protocol::{Channel, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn holds(app: &str) -> (bool, String) {
    parsley(&["holds", "--bootstrap", &bootstrap(), "--app", app])
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn holds_names_the_missing_cause_of_a_running_application() {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    let cluster = KafkaCluster::new(&config, Duration::from_secs(20)).unwrap();
    let (orders, payments, settled) = (unique("orders"), unique("payments"), unique("settled"));
    create(&cluster, &[(&orders, 1), (&payments, 1), (&settled, 1)]);
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut builder = Stage::named("ledger").state(Codec::utf8(), String::new);
    let out = builder.add_sink(&t(&settled));
    let stage = builder
        .fold(&t(&orders), |_, m| {
            Step::to(m.value().cloned().unwrap_or_default())
        })
        .fold(&t(&payments), move |o, m| {
            Step::keep().emit(out.send(m.key().cloned(), o))
        })
        .build()
        .unwrap();
    let app_id = unique("app");
    let app = Parsley::named(app_id.as_str(), [stage]).unwrap();

    let (ok, text) = holds(&app_id);
    assert!(
        !ok && text.contains("no diagnostics topic"),
        "before it ever ran: {text}"
    );

    let mut streams = CausalStreams::new(&app, config.clone())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            instance_id: Some("cli".to_owned()),
            ..StreamsOptions::default()
        });
    streams.start().unwrap();
    streams.wait_until_running(Duration::from_secs(30)).unwrap();
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(cluster.describe(&orders).unwrap().id, 0), 0);
    let producer: BaseProducer = config.create().unwrap();
    producer
        .send(
            BaseRecord::to(&payments)
                .partition(0)
                .key("o-1")
                .payload("pay")
                .headers(OwnedHeaders::new().insert(Header {
                    key: CLOCK_HEADER,
                    value: Some(&clock.encode()),
                })),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (ok, text) = holds(&app_id);
        assert!(ok, "{text}");
        if text.contains("vc-hold-not-fetched") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the hold was never reported: {text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("{text}");
    assert!(text.contains("1 held record(s)"), "{text}");
    assert!(text.contains(&format!("{payments}:0@0")), "{text}");
    assert!(
        text.contains(&format!("waiting on {orders}:0 offset 0")),
        "{text}"
    );
    assert!(text.contains("[cli/0 as of"), "{text}");

    producer
        .send(BaseRecord::to(&orders).partition(0).key("o-1").payload("5"))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, text) = holds(&app_id);
        assert!(ok, "{text}");
        if text.contains("0 held record(s)") {
            break;
        }
        assert!(Instant::now() < deadline, "the hold never cleared: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
    streams.close(Duration::from_secs(30)).unwrap();
    let (ok, text) = holds(&app_id);
    assert!(
        ok && text.contains("no running instance"),
        "after close: {text}"
    );
}
