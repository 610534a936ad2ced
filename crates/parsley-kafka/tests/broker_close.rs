//! Closing the instances of an application together, on a real broker.
//! While members leave one by one, the group keeps handing the leaving
//! ones the tasks of those that left first; a closing instance must not
//! start (and restore) them, and every close must return within its
//! timeout, having committed and left the group.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one
//! (the README's test command starts Apache Kafka and runs them); a plain
//! `cargo test` skips them. This file installs a process-wide tracing
//! subscriber, so it is a test binary of its own.

mod common;

use common::assignments;

use std::time::{Duration, Instant};

use common::{config, create_topics, unique};

use parsley::*;
use parsley_kafka::{CausalStreams, StreamsOptions};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A stateful stage (a count per key, so every task has changelogs to
/// restore).
fn counting(app_id: &str, input: &T, output: &T) -> Parsley {
    let mut stage = Stage::named("count").state(Codec::int64(), || 0);
    let out = stage.add_sink(output);
    let stage = stage
        .fold(input, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(out.send(m.key().cloned(), format!("{}", n + 1)))
        })
        .build()
        .unwrap();
    Parsley::named(app_id, [stage]).unwrap()
}

fn produce(topic: &str, partitions: i32, n: usize) {
    let producer: BaseProducer = config().create().unwrap();
    for i in 0..n {
        let key = format!("k{i}");
        let p = i32::try_from(i).unwrap() % partitions;
        producer
            .send(BaseRecord::to(topic).partition(p).key(&key).payload("v"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(20)).unwrap();
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn instances_closed_together_return_in_time_and_take_no_new_tasks() {
    const INSTANCES: usize = 5;
    const PARTITIONS: i32 = 6;
    let timeout = Duration::from_secs(60);
    let starts = assignments::taken();
    let (i, o) = (unique("close-in"), unique("close-out"));
    create_topics(&[(&i, PARTITIONS), (&o, 1)]);
    let app = counting(&unique("app"), &topic(&i), &topic(&o));
    let mut written = 0;
    for round in 0..5 {
        let mut instances: Vec<(String, CausalStreams)> = (0..INSTANCES)
            .map(|k| {
                let name = format!("r{round}i{k}");
                let mut s =
                    CausalStreams::new(&app, config())
                        .unwrap()
                        .with_options(StreamsOptions {
                            commit_interval: Duration::from_millis(50),
                            instance_id: Some(name.clone()),
                            ..common::options()
                        });
                s.start().unwrap();
                (name, s)
            })
            .collect();
        produce(&i, PARTITIONS, 30);
        written += 30;
        assert_eq!(
            common::read_committed(&o, 1, written, Duration::from_secs(90)).len(),
            written,
            "round {round}: every record went through before the close"
        );
        let started_before = starts.lock().unwrap().len();
        assert!(
            started_before > 0,
            "assignments were taken (the capture works)"
        );

        // Close them all at once.
        let closed: Vec<(String, Instant, Duration, Result<(), String>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = instances
                    .iter_mut()
                    .map(|(name, s)| {
                        scope.spawn(move || {
                            let began = Instant::now();
                            let r = s.close(timeout).map_err(|e| e.to_string());
                            (name.clone(), began, began.elapsed(), r)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
        let log = starts.lock().unwrap().clone();
        for (name, began, took, r) in &closed {
            assert!(r.is_ok(), "round {round}: {name}'s close failed: {r:?}");
            assert!(
                *took <= timeout + Duration::from_secs(1),
                "round {round}: {name}'s close took {took:?}"
            );
            let late: Vec<&(Instant, String)> = log
                .iter()
                .filter(|(at, thread)| at > began && thread.contains(&format!("-{name}-")))
                .collect();
            assert!(
                late.is_empty(),
                "round {round}: {name} took {} assignment(s) while closing",
                late.len()
            );
        }
    }
    // Nothing was processed twice across the closes.
    assert_eq!(
        common::read_committed(&o, 1, written + 1, Duration::from_secs(3)).len(),
        written
    );
}
