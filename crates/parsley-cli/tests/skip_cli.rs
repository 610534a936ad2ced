//! `parsley skip` on a live broker (`PARSLEY_BOOTSTRAP`): a stage whose
//! logic refuses one record stops on it; the command refuses to step past
//! it while the application runs, refuses a record already consumed, a
//! stage that does not consume the topic and a missing dead-letter topic;
//! with the application stopped, it records the step, and the restarted
//! application sends the record to the dead-letter topic and goes on.

mod common;

use std::time::{Duration, Instant};

use common::{bootstrap, config, create, parsley, unique};
use parsley::*;
use parsley_kafka::{CausalStreams, ErrorResponse, KafkaCluster, StreamsOptions, StreamsState};
use rdkafka::message::{Headers, Message as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn produce(topic: &str, value: &str) {
    let producer: BaseProducer = config().create().unwrap();
    producer
        .send(BaseRecord::to(topic).partition(0).key("k").payload(value))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
}

/// A read record: its value and its headers.
type Read = (String, Vec<(String, Vec<u8>)>);

/// Committed values of partition 0 of `topic`, waiting up to `within` for
/// `n`, with each record's headers.
fn read(topic: &str, n: usize, within: Duration) -> Vec<Read> {
    let consumer = common::reader(topic, 1);
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let headers = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            out.push((v, headers));
        }
    }
    out
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn skip_steps_a_stopped_application_past_a_named_record() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (i, o, dlq, app_id) = (unique("in"), unique("out"), unique("dead"), unique("app"));
    create(&cluster, &[(&i, 1), (&o, 1), (&dlq, 1)]);
    let stage = common::refusing_stage("echo", &i, &o);
    let app = Parsley::named(app_id.as_str(), [stage]).unwrap();
    let start = || {
        let mut s = CausalStreams::new(&app, config())
            .unwrap()
            .with_options(StreamsOptions {
                commit_interval: Duration::from_millis(50),
                instance_id: Some("cli".to_owned()),
                ..StreamsOptions::default()
            });
        // The task keeps restarting in place: the instance stays in the
        // group.
        s.set_uncaught_error_handler(|_| ErrorResponse::ReplaceThread);
        s.start().unwrap();
        s
    };
    let skip = |offset: &str, stage: &str, dead: &str| {
        parsley(&[
            "skip",
            "--bootstrap",
            &bootstrap(),
            "--app",
            &app_id,
            "--stage",
            stage,
            "--topic",
            &i,
            "--partition",
            "0",
            "--offset",
            offset,
            "--dead-letter",
            dead,
            "--reason",
            "known bad",
        ])
    };
    let mut s = start();
    produce(&i, "one");
    assert_eq!(read(&o, 1, Duration::from_secs(30)).len(), 1);
    produce(&i, "poison");
    produce(&i, "three");
    wait_for("the task to fail on the record", || {
        s.restarted_tasks() >= 1
    });
    let (ok, text) = skip("1", "echo", &dlq);
    assert!(!ok && text.contains("is running"), "{text}");
    // The coordinator's answer, under either group protocol, not only the
    // threads' reports.
    assert!(
        text.contains("its consumer group (") && text.contains("member(s)"),
        "{text}"
    );
    s.close(Duration::from_secs(30)).unwrap();
    assert_eq!(s.state(), StreamsState::Stopped);

    let (ok, text) = skip("0", "echo", &dlq);
    assert!(!ok && text.contains("already consumed"), "{text}");
    let (ok, text) = skip("1", "other", &dlq);
    assert!(!ok && text.contains("no such stage"), "{text}");
    let (ok, text) = skip("1", "echo", "pt-no-such-topic");
    assert!(!ok && text.contains("create it first"), "{text}");
    let (ok, text) = skip("9", "echo", &dlq);
    assert!(!ok && text.contains("not in the log"), "{text}");
    let (ok, text) = skip("1", "echo", &dlq);
    assert!(ok, "{text}");
    assert!(text.contains("will step past"), "{text}");

    let mut s = start();
    let delivered: Vec<String> = read(&o, 2, Duration::from_secs(30))
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    assert_eq!(delivered, ["one", "three"]);
    let dead = read(&dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, "poison");
    assert!(
        dead[0]
            .1
            .iter()
            .any(|(k, v)| k == "parsley.dlq.error" && v == b"known bad"),
        "{:?}",
        dead[0].1
    );
    assert_eq!(s.restarted_tasks(), 0, "nothing failed this time");
    s.close(Duration::from_secs(30)).unwrap();
}
