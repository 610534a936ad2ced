//! Retention loss on a real broker: DeleteRecords removes records a
//! stopped application never read. Starting it again fails the task with
//! an error naming the partition, the committed offset and the log start;
//! with the opt-in it goes on from the log start and says so in a WARN.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one
//! (the README's test command starts Apache Kafka and runs them); a plain
//! `cargo test` skips them. This file installs a process-wide tracing
//! subscriber, so it is a test binary of its own.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{config, create_topics, unique};

use parsley::runtime::worker::OnRetentionLoss;
use parsley::*;
use parsley_kafka::{CausalStreams, KafkaCluster, StreamsOptions, StreamsState};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A stage copying `input` to `output`.
fn copy(app_id: &str, input: &T, output: &T) -> Parsley {
    let out = output.clone();
    let stage = Stage::named("copy")
        .on(input, move |m: &Message<String, String>| {
            vec![out.send(m.key().cloned(), m.value().cloned())]
        })
        .sink(output)
        .build()
        .unwrap();
    Parsley::named(app_id, [stage]).unwrap()
}

/// Writes one record per value, each in a request (and a batch) of its
/// own.
fn produce(topic: &str, values: std::ops::Range<usize>) {
    let producer: BaseProducer = config().create().unwrap();
    for i in values {
        let v = format!("{i}");
        producer
            .send(BaseRecord::to(topic).partition(0).key("k").payload(&v))
            .map_err(|(e, _)| e)
            .unwrap();
        producer.flush(Duration::from_secs(20)).unwrap();
    }
}

fn delete_records_before(topic: &str, offset: i64) {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    futures_executor::block_on(
        cluster
            .admin()
            .delete_records(&tpl, &rdkafka::admin::AdminOptions::new()),
    )
    .unwrap();
}

fn options(on_retention_loss: OnRetentionLoss) -> StreamsOptions {
    StreamsOptions {
        commit_interval: Duration::from_millis(50),
        instance_id: Some("a".to_owned()),
        on_retention_loss,
        ..common::options()
    }
}

/// Waits (a minute at most) until the instance failed.
fn wait_until_failed(streams: &CausalStreams) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(streams.state(), StreamsState::Failed(_)) {
        assert!(
            Instant::now() < deadline,
            "the task did not fail on the loss"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the runtime logged, for the WARN the opt-in writes.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The process's WARN log, captured from the first call on.
fn log() -> &'static Log {
    static LOG: std::sync::OnceLock<Log> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
        log
    })
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn records_removed_before_they_were_read_fail_the_task_unless_told_to_resume() {
    let log = log();

    let (i, o) = (unique("in"), unique("out"));
    create_topics(&[(&i, 1), (&o, 1)]);
    let (input, output) = (topic(&i), topic(&o));
    let app = copy(&unique("app"), &input, &output);
    let mut first = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(options(OnRetentionLoss::Fail));
    first.start().unwrap();
    produce(&i, 0..3);
    assert_eq!(
        common::read_committed(&o, 1, 3, Duration::from_secs(30)).len(),
        3
    );
    first.close(Duration::from_secs(30)).unwrap();

    // While it is stopped, 3..6 arrive and DeleteRecords removes 3 and 4.
    produce(&i, 3..6);
    delete_records_before(&i, 5);

    let mut second = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(options(OnRetentionLoss::Fail));
    second.start().unwrap();
    wait_until_failed(&second);
    let err = second
        .close(Duration::from_secs(30))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{i}:0")) && err.contains("offset 3") && err.contains("starts at 5"),
        "the error names the partition and both offsets: {err}"
    );
    assert_eq!(
        common::read_committed(&o, 1, 4, Duration::from_secs(2)).len(),
        3,
        "nothing was delivered past the loss"
    );

    // With the opt-in it goes on from the log start, and says so.
    let mut third = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(options(OnRetentionLoss::ResumeAtLogStart));
    third.start().unwrap();
    let out = common::read_committed(&o, 1, 4, Duration::from_secs(60));
    third.close(Duration::from_secs(30)).unwrap();
    let values: Vec<&str> = out.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values, ["0", "1", "2", "5"], "3 and 4 are gone, 5 is read");
    let text = log.text();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("retention")
            && l.contains("committed=3")
            && l.contains("log_start=5")),
        "the resume is logged with both offsets: {text}"
    );
}

/// Retention overtakes a running stage: its handler is stuck on a record
/// while later ones arrive and are deleted before the consumer fetched
/// them. The consumer's out-of-range fetch fails the task with both
/// offsets named (librdkafka's reset to the earliest offset would have
/// skipped them silently); with the opt-in it goes on from the log start.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn retention_overtaking_a_running_stage_fails_it_unless_told_to_resume() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STUCK: AtomicBool = AtomicBool::new(false);
    let log = log();

    for (on_loss, name) in [
        (OnRetentionLoss::Fail, "fail"),
        (OnRetentionLoss::ResumeAtLogStart, "resume"),
    ] {
        let (i, o) = (unique(&format!("run-in-{name}")), unique("run-out"));
        create_topics(&[(&i, 1), (&o, 1)]);
        let (input, output) = (topic(&i), topic(&o));
        let out = output.clone();
        let stage = Stage::named("copy")
            .on(&input, move |m: &Message<String, String>| {
                while STUCK.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                vec![out.send(m.key().cloned(), m.value().cloned())]
            })
            .sink(&output)
            .build()
            .unwrap();
        let app = Parsley::named(unique("app").as_str(), [stage]).unwrap();
        // The consumer keeps at most one record buffered, so it has not
        // fetched what gets deleted.
        let mut c = config();
        c.set("queued.min.messages", "1")
            .set("queued.max.messages.kbytes", "1")
            .set("max.partition.fetch.bytes", "512");
        let mut streams = CausalStreams::new(&app, c)
            .unwrap()
            .with_options(options(on_loss));
        STUCK.store(true, Ordering::SeqCst);
        streams.start().unwrap();
        produce(&i, 0..10);
        std::thread::sleep(Duration::from_secs(3));
        delete_records_before(&i, 10);
        produce(&i, 10..12);
        STUCK.store(false, Ordering::SeqCst);
        match on_loss {
            OnRetentionLoss::Fail => {
                wait_until_failed(&streams);
                let err = streams
                    .close(Duration::from_secs(30))
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains(&format!("{i}:0")) && err.contains("starts at 10"),
                    "the error names the partition and the log start: {err}"
                );
                let values: Vec<String> = common::read_committed(&o, 1, 12, Duration::from_secs(3))
                    .into_iter()
                    .map(|r| r.value)
                    .collect();
                assert!(
                    values.len() < 10 && !values.iter().any(|v| v == "10" || v == "11"),
                    "nothing past the loss was committed: {values:?}"
                );
            }
            OnRetentionLoss::ResumeAtLogStart => {
                let values: Vec<String> =
                    common::read_committed(&o, 1, 12, Duration::from_secs(30))
                        .into_iter()
                        .map(|r| r.value)
                        .collect();
                streams.close(Duration::from_secs(30)).unwrap();
                assert!(
                    values.len() < 10 && values.ends_with(&["10".to_owned(), "11".to_owned()]),
                    "some of 0..9 lost, then 10 and 11: {values:?}"
                );
                assert!(
                    log.text().lines().any(|l| l.contains("WARN")
                        && l.contains(&i)
                        && l.contains("log_start=10")),
                    "the resume is logged: {}",
                    log.text()
                );
            }
        }
    }
}
