//! `parsley inspect` against a live broker (`PARSLEY_BOOTSTRAP`; the test
//! command starts one): a stamped record shows its claims by topic name, an
//! unstamped one says so, and a corrupt one is reported with its coordinate
//! and fails the command.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bootstrap, create, unique};
use parsley::protocol::headers::CLOCK_HEADER;
use parsley::protocol::{Channel, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn inspect_shows_claims_by_name_and_reports_corrupt_headers() {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    let cluster = KafkaCluster::new(&config, Duration::from_secs(20)).unwrap();
    let (causes, effects) = (unique("causes"), unique("effects"));
    create(&cluster, &[(&causes, 1), (&effects, 1)]);
    let causes_id = cluster.describe(&causes).unwrap().id;
    let mut clock = VectorClock::new();
    clock.claim_offset(Channel::new(causes_id, 0), 4);
    let producer: BaseProducer = config.create().unwrap();
    let send = |headers: Option<OwnedHeaders>| {
        let mut r = BaseRecord::to(&effects).partition(0).key("k").payload("v");
        if let Some(h) = headers {
            r = r.headers(h);
        }
        producer.send(r).map_err(|(e, _)| e).unwrap();
    };
    send(Some(OwnedHeaders::new().insert(Header {
        key: CLOCK_HEADER,
        value: Some(&clock.encode()),
    })));
    send(None);
    send(Some(OwnedHeaders::new().insert(Header {
        key: CLOCK_HEADER,
        value: Some(&[0xde, 0xad][..]),
    })));
    producer.flush(Duration::from_secs(20)).unwrap();

    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_parsley"));
        cmd.args([
            "inspect",
            "--bootstrap",
            &bootstrap(),
            "--topic",
            &effects,
            "--from-beginning",
        ]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = run(false);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains(&format!("{effects}:0@0")), "{text}");
    assert!(
        lines[0].contains(&format!("claims {causes}:0 <= 4")),
        "names, not ids: {text}"
    );
    assert!(lines[1].contains("unstamped"), "{text}");
    assert!(
        lines[2].contains(&format!("{effects}:0@2")) && lines[2].contains("CORRUPT"),
        "{text}"
    );
    assert!(!out.status.success(), "a corrupt record fails the command");
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt"));

    let out = run(true);
    let text = String::from_utf8_lossy(&out.stdout);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["offset"], 0);
    assert_eq!(first["stamped"], true);
    assert_eq!(first["claims"][0]["topic"], causes.as_str());
    assert_eq!(first["claims"][0]["offset"], 4);

    // A missing topic is one clear line and a failure.
    let out = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args([
            "inspect",
            "--bootstrap",
            &bootstrap(),
            "--topic",
            "pt-no-such-topic",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not exist"), "{err}");
}
