//! The broker side of the cluster seam, on a real Kafka-protocol broker:
//! topic ids, partition counts, end offsets with empty partitions, log
//! starts moved by DeleteRecords, and definitive absence of an id whose
//! topic was recreated under the same name.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one
//! (the README's test command starts Apache Kafka and runs them with
//! `--include-ignored`); a plain `cargo test` skips them.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{config, unique};

use futures_executor::block_on;
use parsley::runtime::host::{MetadataError, TopicMetadata};
use parsley_kafka::KafkaCluster;
use parsley_protocol::{BrokerOffsets, TopicOffsets};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

fn cluster() -> KafkaCluster {
    KafkaCluster::new(&config(), Duration::from_secs(20)).expect("admin client")
}

fn create(cluster: &KafkaCluster, name: &str, partitions: i32) {
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let results = block_on(cluster.admin().create_topics(
        [&topic],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
    ))
    .expect("create topics");
    for r in results {
        r.expect("topic created");
    }
    wait_until(|| cluster.describe(name).is_ok());
}

fn delete(cluster: &KafkaCluster, name: &str) {
    let results = block_on(cluster.admin().delete_topics(
        &[name],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
    ))
    .expect("delete topics");
    for r in results {
        r.expect("topic deleted");
    }
    wait_until(|| matches!(cluster.describe(name), Err(MetadataError::Missing(_))));
}

/// Topic creation and deletion settle asynchronously on the broker.
fn wait_until(mut ready: impl FnMut() -> bool) {
    for _ in 0..100 {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the broker did not settle within 10 s");
}

fn produce(name: &str, partition: i32, n: usize) {
    let producer: BaseProducer = config().create().expect("producer");
    for i in 0..n {
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::to(name)
                    .partition(partition)
                    .key(&key)
                    .payload("v"),
            )
            .expect("send");
    }
    producer.flush(Duration::from_secs(20)).expect("flush");
}

fn ends(cluster: &KafkaCluster, id: parsley_protocol::TopicId, start: bool) -> TopicOffsets {
    let ids = BTreeSet::from([id]);
    // Right after a topic is created, its partitions may have no leader yet:
    // the lookup fails (it is never mistaken for absence); ask again.
    let mut tries = 0;
    let mut answer = loop {
        let r = if start {
            cluster.log_starts(&ids)
        } else {
            cluster.end_offsets(&ids)
        };
        match r {
            Ok(a) => break a,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("offsets not available yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("offsets: {e:?}"),
        }
    };
    answer.remove(&id).expect("an answer for the id")
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn describes_topic_ids_and_partition_counts() {
    let c = cluster();
    let name = unique("describe");
    create(&c, &name, 3);
    let d = c.describe(&name).unwrap();
    assert_eq!(d.partitions, 3);
    assert_ne!(d.id.to_u128(), 0, "brokers serve topic ids");
    assert_eq!(c.describe(&name).unwrap().id, d.id, "stable");
    assert!(matches!(
        c.describe(&unique("missing")),
        Err(MetadataError::Missing(_))
    ));
    delete(&c, &name);
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn end_offsets_include_empty_partitions_and_log_starts_follow_delete_records() {
    let c = cluster();
    let name = unique("offsets");
    create(&c, &name, 3);
    let id = c.describe(&name).unwrap().id;
    produce(&name, 0, 4);
    let TopicOffsets::Present(end) = ends(&c, id, false) else {
        panic!("present")
    };
    assert_eq!(end.len(), 3, "every partition, the empty ones too: {end:?}");
    assert_eq!(end[&0], 4);
    assert_eq!(end[&1], 0);
    assert_eq!(end[&2], 0);
    let TopicOffsets::Present(start) = ends(&c, id, true) else {
        panic!("present")
    };
    assert_eq!(start[&0], 0);

    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&name, 0, Offset::Offset(3))
        .expect("partition offset");
    block_on(c.admin().delete_records(&tpl, &AdminOptions::new())).expect("delete records");
    let TopicOffsets::Present(start) = ends(&c, id, true) else {
        panic!("present")
    };
    assert_eq!(start[&0], 3, "DeleteRecords moved the log start");
    delete(&c, &name);
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_recreated_topic_is_another_channel() {
    let c = cluster();
    let name = unique("recreate");
    create(&c, &name, 1);
    let old = c.describe(&name).unwrap().id;
    delete(&c, &name);
    assert_eq!(ends(&c, old, false), TopicOffsets::Absent);
    create(&c, &name, 2);
    let new = c.describe(&name).unwrap().id;
    assert_ne!(old, new);
    // The old id stays absent, even though its name exists again.
    assert_eq!(ends(&c, old, false), TopicOffsets::Absent);
    assert_eq!(ends(&c, old, true), TopicOffsets::Absent);
    assert!(matches!(ends(&c, new, false), TopicOffsets::Present(p) if p.len() == 2));
    delete(&c, &name);
}

/// End offsets are the high watermark: a record of a transaction still
/// open counts (the own-output seed must cover every send, and the last
/// stable offset would stop below it).
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn end_offsets_are_the_high_watermark_not_the_last_stable_offset() {
    let c = cluster();
    let name = unique("hw");
    create(&c, &name, 1);
    let id = c.describe(&name).unwrap().id;
    produce(&name, 0, 2);
    let mut tc = config();
    tc.set("transactional.id", unique("open"));
    let txn: BaseProducer = tc.create().expect("producer");
    txn.init_transactions(Duration::from_secs(20)).unwrap();
    txn.begin_transaction().unwrap();
    txn.send(BaseRecord::to(&name).partition(0).key("k").payload("open"))
        .map_err(|(e, _)| e)
        .unwrap();
    txn.flush(Duration::from_secs(20)).unwrap();
    let TopicOffsets::Present(end) = ends(&c, id, false) else {
        panic!("present")
    };
    assert_eq!(end[&0], 3, "the open transaction's record counts");
    txn.abort_transaction(Duration::from_secs(20)).unwrap();
    delete(&c, &name);
}

/// The cluster probes against a deliberately broken topic set: sources
/// with different partition counts, a missing sink and a tick topic of the
/// wrong width are all reported at once; the repaired set passes.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn cluster_probes_report_a_broken_topic_set() {
    use parsley::*;
    let c = cluster();
    let app_id = unique("probed");
    let (customers, orders, enriched) = (unique("customers"), unique("orders"), unique("enriched"));
    create(&c, &customers, 4);
    create(&c, &orders, 2);
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut builder = Stage::named("join").state(Codec::utf8(), String::new);
    let out = builder.add_sink(&t(&enriched));
    let stage = builder
        .fold(&t(&customers), |_, m| {
            Step::to(m.value().cloned().unwrap_or_default())
        })
        .fold(&t(&orders), move |s, m| {
            Step::keep().emit(out.send(m.key().cloned(), s))
        })
        .tick_fold(Duration::from_secs(60), |s, _t| Step::to(s))
        .build()
        .unwrap();
    let app = Parsley::named(app_id.as_str(), [stage]).unwrap();
    let tick_topic = app.tick_topic("join").unwrap().to_owned();
    create(&c, &tick_topic, 1);
    wait_until(|| c.describe(&tick_topic).is_ok() && c.describe(&orders).is_ok());

    let report = probe_cluster(&app, &c);
    let observed = |p: Probe| -> Vec<String> {
        report
            .findings_of(p)
            .iter()
            .map(|f| f.observed.clone())
            .collect()
    };
    assert_eq!(observed(Probe::TopicExists).len(), 1, "{report}");
    assert!(
        observed(Probe::TopicExists)[0].contains(&enriched),
        "{report}"
    );
    assert!(
        observed(Probe::CoPartitioning)[0]
            .contains(&format!("{customers:?} has 4, {orders:?} has 2")),
        "{report}"
    );
    assert!(
        observed(Probe::TickTopic)[0].contains("has 1 partition(s); its widest source has 4"),
        "{report}"
    );
    assert!(!report.passed());

    // The same application over a repaired set: every check passes.
    let app_id = unique("probed");
    let (customers, enriched) = (unique("customers"), unique("enriched"));
    create(&c, &customers, 2);
    create(&c, &enriched, 1);
    let mut builder = Stage::named("join").state(Codec::utf8(), String::new);
    let out = builder.add_sink(&t(&enriched));
    let stage = builder
        .fold(&t(&customers), |_, m| {
            Step::to(m.value().cloned().unwrap_or_default())
        })
        .fold(&t(&orders), move |s, m| {
            Step::keep().emit(out.send(m.key().cloned(), s))
        })
        .tick_fold(Duration::from_secs(60), |s, _t| Step::to(s))
        .build()
        .unwrap();
    let app = Parsley::named(app_id.as_str(), [stage]).unwrap();
    let tick_topic = app.tick_topic("join").unwrap().to_owned();
    create(&c, &tick_topic, 2);
    wait_until(|| c.describe(&tick_topic).is_ok() && c.describe(&enriched).is_ok());
    let report = probe_cluster(&app, &c);
    assert!(report.passed(), "{report}");
}

/// A changelog replay ends at the partition's end without logging an
/// ERROR: librdkafka reports the end as an error event, which rdkafka's
/// default context logs at ERROR, and an operator pages on those.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_changelog_replay_logs_no_error_at_the_partitions_end() {
    use parsley::runtime::host::ChangelogReader;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tracing_subscriber::layer::SubscriberExt;

    /// Counts ERROR events.
    struct Errors(Arc<AtomicUsize>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    let cluster = cluster();
    let (full, empty) = (unique("replay-full"), unique("replay-empty"));
    create(&cluster, &full, 1);
    create(&cluster, &empty, 1);
    produce(&full, 0, 3);
    let errors = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Errors(errors.clone()));
    tracing::subscriber::with_default(subscriber, || {
        assert_eq!(cluster.read_changelog(&full, 0).expect("replay").len(), 3);
        assert!(
            cluster
                .read_changelog(&empty, 0)
                .expect("replay")
                .is_empty()
        );
    });
    assert_eq!(errors.load(Ordering::SeqCst), 0, "a replay logged an ERROR");
    delete(&cluster, &full);
    delete(&cluster, &empty);
}
