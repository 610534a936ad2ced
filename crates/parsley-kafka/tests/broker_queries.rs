//! State queries on a real broker: a key's committed state read from the
//! instance that runs its task, a key whose task runs elsewhere answered
//! as such, each key's host and endpoint named from either instance, and a
//! causal query that waits for its cause and includes it.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one.

mod common;

use std::time::{Duration, Instant};

use common::{Acks, config, create_topics, unique};
use parsley::protocol::{Channel, VectorClock};
use parsley::*;
use parsley_kafka::{CausalClock, CausalStreams, QueryError, StreamsOptions};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

type Orders = Topic<String, i64>;
type Notes = Topic<String, String>;

/// A total per account: orders add to it; a note only has to be
/// delivered (an order can claim one as its cause).
fn totals(app_id: &str, orders: &Orders, notes: &Notes) -> (Parsley, StateStore<String, i64>) {
    let stage = Stage::named("totals").state(Codec::int64(), || 0);
    let store = stage.store(Codec::utf8());
    let stage = stage
        .fold(orders, |t: i64, m: &Message<String, i64>| {
            Step::to(t + m.value().copied().unwrap_or(0))
        })
        .fold(notes, |t: i64, _m: &Message<String, String>| Step::to(t))
        .build()
        .unwrap();
    (Parsley::named(app_id, [stage]).unwrap(), store)
}

fn start(app: &Parsley, instance: &str) -> CausalStreams {
    let mut s = CausalStreams::new(app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            instance_id: Some(instance.to_owned()),
            application_server: Some(format!("{instance}.example:8080")),
            state_dir: None,
            ..common::options()
        });
    s.start().unwrap();
    s.wait_until_running(Duration::from_secs(60)).unwrap();
    s
}

/// Produces one record (with `headers`, if any) and returns its offset.
fn produce(
    topic: &str,
    partition: i32,
    key: &str,
    value: &[u8],
    headers: Option<OwnedHeaders>,
) -> i64 {
    let producer: BaseProducer<Acks> = config().create_with_context(Acks::default()).unwrap();
    let mut record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    if let Some(h) = headers {
        record = record.headers(h);
    }
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
    producer.context().0.lock().unwrap()[0].1
}

/// A key whose task is partition `p` of a two-partition topic.
fn key_on(p: i32) -> String {
    (0..)
        .map(|i| format!("acct-{i}"))
        .find(|k| parsley::partition::partition_for_key(k.as_bytes(), 2) == p)
        .unwrap()
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_query_reads_committed_state_and_says_where_a_key_is_not() {
    let (o, n) = (unique("orders"), unique("notes"));
    create_topics(&[(&o, 2), (&n, 2)]);
    let orders: Orders = Topic::new(o.as_str(), Codec::utf8(), Codec::int64());
    let notes: Notes = Topic::new(n.as_str(), Codec::utf8(), Codec::utf8());
    let (app, store) = totals(&unique("app"), &orders, &notes);
    let mut first = start(&app, "a");
    let (k0, k1) = (key_on(0), key_on(1));
    for (k, p, v) in [(&k0, 0, 5i64), (&k0, 0, 7), (&k1, 1, 2)] {
        produce(&o, p, k, &v.to_be_bytes(), None);
    }
    eventually("the totals were committed", || {
        (first.query(&store, &k0).unwrap() == Some(12)
            && first.query(&store, &k1).unwrap() == Some(2))
        .then_some(())
    });
    // A key no record touched has no state: None, not an error.
    assert_eq!(first.query(&store, &"untouched".to_owned()).unwrap(), None);

    // A second instance takes one of the two tasks: each instance answers
    // for its own and names the other's as not hosted here.
    let mut second = start(&app, "b");
    let (mine, theirs) = eventually("the tasks were split between the instances", || {
        let a = (first.query(&store, &k0), first.query(&store, &k1));
        match a {
            (Ok(Some(12)), Err(QueryError::NotHosted { task })) if task.partition == 1 => {
                Some((k0.clone(), k1.clone()))
            }
            (Err(QueryError::NotHosted { task }), Ok(Some(2))) if task.partition == 0 => {
                Some((k1.clone(), k0.clone()))
            }
            _ => None,
        }
    });
    let want = |k: &str| if k == k0 { 12 } else { 2 };
    eventually("the other instance answers for the other task", || {
        (second.query(&store, &theirs).ok()? == Some(want(&theirs))).then_some(())
    });
    assert!(matches!(
        second.query(&store, &mine),
        Err(QueryError::NotHosted { .. })
    ));
    // Either instance names the one that hosts a key, with its endpoint,
    // from the reports the threads publish.
    let host_of = |streams: &CausalStreams, k: &String| {
        eventually("the hosts were reported", || {
            streams
                .query_host(&store, k)
                .unwrap()
                .filter(|h| h.instance == if k == &mine { "a" } else { "b" })
        })
    };
    for (streams, name) in [(&first, "a"), (&second, "b")] {
        let h = host_of(streams, &mine);
        assert_eq!(h.endpoint.as_deref(), Some("a.example:8080"));
        assert_eq!(h.here, name == "a");
        let h = host_of(streams, &theirs);
        assert_eq!(h.endpoint.as_deref(), Some("b.example:8080"));
        assert_eq!(h.here, name == "b");
        assert_eq!(
            h.task.partition,
            parsley::partition::partition_for_key(theirs.as_bytes(), 2)
        );
    }
    second.close(Duration::from_secs(30)).unwrap();
    first.close(Duration::from_secs(30)).unwrap();
    // A closed instance answers nothing.
    assert!(matches!(
        first.query(&store, &k0),
        Err(QueryError::NotRunning(_))
    ));
    // With every instance gone, nothing hosts the key: once the reports
    // are stale (the last ones name no task, as each thread leaves).
    eventually("no instance hosts the key", || {
        first
            .query_host(&store, &k0)
            .unwrap()
            .is_none()
            .then_some(())
    });
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_causal_query_waits_for_its_cause_and_includes_it() {
    let (o, n) = (unique("orders"), unique("notes"));
    create_topics(&[(&o, 1), (&n, 1)]);
    let orders: Orders = Topic::new(o.as_str(), Codec::utf8(), Codec::int64());
    let notes: Notes = Topic::new(n.as_str(), Codec::utf8(), Codec::utf8());
    let (app, store) = totals(&unique("app"), &orders, &notes);
    let streams = start(&app, "a");
    produce(&o, 0, "acct", &10i64.to_be_bytes(), None);
    eventually("the first order was committed", || {
        (streams.query(&store, &"acct".to_owned()).ok()? == Some(10)).then_some(())
    });

    // ANCHOR: read_your_writes
    // A service writes an order, stamped with what it has seen (here, a
    // note it was told of that the stage has not received yet, so the
    // stage holds the order), and records its own write in its clock.
    let mut clock = CausalClock::new(&config()).unwrap();
    clock.record_produced(&n, 0, 0).unwrap();
    let headers = clock.stamp(OwnedHeaders::new()).unwrap();
    let offset = produce(&o, 0, "acct", &5i64.to_be_bytes(), Some(headers));
    clock.record_produced(&o, 0, offset).unwrap();
    // ANCHOR_END: read_your_writes
    let mine = clock.clock().clone();

    // Asked with a short timeout, the query says what it waits for.
    let e = streams
        .query_after(
            &store,
            &"acct".to_owned(),
            &mine,
            Duration::from_millis(500),
        )
        .unwrap_err();
    match &e {
        QueryError::CausesMissing { waiting_on, .. } => {
            // The note never arrived; the order arrived and is held.
            assert_eq!(waiting_on.len(), 2, "{e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("waiting on {n}:0 offset 0")),
                "{text}"
            );
            assert!(
                text.contains(&format!("waiting on {o}:0 offset {offset}")),
                "{text}"
            );
        }
        other => panic!("expected CausesMissing, got {other}"),
    }
    // The plain query answers at once, without the held order.
    assert_eq!(streams.query(&store, &"acct".to_owned()).unwrap(), Some(10));

    // Asked with time enough, it waits; the note arrives meanwhile, the
    // order is delivered and committed, and the answer includes it.
    let streams = std::sync::Arc::new(streams);
    let asking = {
        let streams = streams.clone();
        let store = store.clone();
        let mine = mine.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            // ANCHOR: query_after
            // The balance, once the stage has delivered (and committed)
            // everything the service's clock claims on its inputs.
            let balance: Result<Option<i64>, QueryError> =
                streams.query_after(&store, &"acct".to_owned(), &mine, Duration::from_secs(30));
            // ANCHOR_END: query_after
            (balance, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    assert!(!asking.is_finished(), "the query waited for its cause");
    produce(&n, 0, "acct", b"hello", None);
    let (answer, waited) = asking.join().unwrap();
    assert_eq!(answer.unwrap(), Some(15), "the answer includes the cause");
    assert!(waited >= Duration::from_millis(700));
    // A claim on a channel the stage does not consume is not waited for.
    let mut elsewhere = VectorClock::new();
    elsewhere.claim_offset(
        Channel::new(parsley::identity::test_topic_id("x", 0), 0),
        99,
    );
    assert_eq!(
        streams
            .query_after(
                &store,
                &"acct".to_owned(),
                &elsewhere,
                Duration::from_millis(200)
            )
            .unwrap(),
        Some(15)
    );
    let mut streams = std::sync::Arc::try_unwrap(streams).ok().unwrap();
    streams.close(Duration::from_secs(30)).unwrap();
}

/// A producer's delivery reports with each record's key.
#[derive(Default)]
struct Placed(std::sync::Mutex<Vec<(String, i32, i64)>>);

impl rdkafka::ClientContext for Placed {}

impl rdkafka::producer::ProducerContext for Placed {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        use rdkafka::message::Message as _;
        let m = result.as_ref().expect("the record was delivered");
        let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
        self.0
            .lock()
            .unwrap()
            .push((key, m.partition(), m.offset()));
    }
}

/// Produces `keys` (value 1 each) with a librdkafka producer whose
/// `partitioner` is `setting` (`None`: librdkafka's default), letting it
/// place each key; returns where each landed.
fn produce_placed(topic: &str, keys: &[String], setting: Option<&str>) -> Vec<(String, i32, i64)> {
    let mut c = config();
    if let Some(s) = setting {
        c.set("partitioner", s);
    }
    let producer: BaseProducer<Placed> = c.create_with_context(Placed::default()).unwrap();
    for k in keys {
        producer
            .send(BaseRecord::to(topic).key(k).payload(&1i64.to_be_bytes()))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(20)).unwrap();
    let mut placed = producer.context().0.lock().unwrap().clone();
    placed.sort();
    assert_eq!(placed.len(), keys.len());
    placed
}

/// Each partitioner places keys as the librdkafka setting it names does,
/// the default included: checked against librdkafka itself.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn each_partitioner_places_keys_as_librdkafka_does() {
    use parsley::partition::Partitioner;
    let t = unique("placed");
    create_topics(&[(&t, 7)]);
    let keys: Vec<String> = (0..60).map(|i| format!("customer-{i}")).collect();
    for setting in [
        None,
        Some("consistent"),
        Some("consistent_random"),
        Some("murmur2"),
        Some("murmur2_random"),
        Some("fnv1a"),
        Some("fnv1a_random"),
    ] {
        let p = setting.map_or(Partitioner::Crc32, |s| {
            Partitioner::from_librdkafka(s).unwrap()
        });
        for (key, partition, _) in produce_placed(&t, &keys, setting) {
            assert_eq!(
                partition,
                p.partition(key.as_bytes(), 7),
                "{key:?} with partitioner {setting:?}"
            );
        }
    }
}

/// Deposits written by a librdkafka producer on its defaults (CRC-32, not
/// Kafka's murmur2): with the topic declared as such, every key's state is
/// found, nothing is counted as misplaced, and the causal query by the
/// delivery report's coordinates waits for and includes each write.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn queries_find_keys_a_librdkafka_producer_placed() {
    use parsley::partition::Partitioner;
    let (o, n) = (unique("deposits"), unique("notes"));
    create_topics(&[(&o, 6), (&n, 6)]);
    let orders: Orders =
        Topic::new(o.as_str(), Codec::utf8(), Codec::int64()).partitioned_by(Partitioner::Crc32);
    let notes: Notes =
        Topic::new(n.as_str(), Codec::utf8(), Codec::utf8()).partitioned_by(Partitioner::Crc32);
    let (app, store) = totals(&unique("app"), &orders, &notes);
    let streams = start(&app, "a");
    let keys: Vec<String> = (0..30).map(|i| format!("acct-{i}")).collect();
    let placed = produce_placed(&o, &keys, None);
    // The default partitioner is not Kafka's: the test needs keys murmur2
    // would have looked for elsewhere.
    let elsewhere = placed
        .iter()
        .filter(|(k, p, _)| parsley::partition::partition_for_key(k.as_bytes(), 6) != *p)
        .count();
    assert!(elsewhere >= 15, "only {elsewhere} keys differ");
    for (key, partition, offset) in &placed {
        let at = Coordinate {
            topic: o.clone(),
            partition: *partition,
            offset: *offset,
        };
        assert_eq!(
            streams
                .query_after_records(&store, key, &[at], Duration::from_secs(30))
                .unwrap(),
            Some(1),
            "{key}"
        );
    }
    assert_eq!(
        streams
            .metrics()
            .iter()
            .map(|m| m.records_key_misplaced_total)
            .sum::<u64>(),
        0
    );
}

/// The same producer against a topic left on Kafka's partitioner: the
/// records fold where they land, the task counts each as misplaced, and a
/// causal query naming one fails at once with the mismatch instead of
/// answering `None` (or waiting out its timeout).
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_key_placed_by_another_partitioner_is_counted_and_its_query_refused() {
    let (o, n) = (unique("deposits"), unique("notes"));
    create_topics(&[(&o, 6), (&n, 6)]);
    let orders: Orders = Topic::new(o.as_str(), Codec::utf8(), Codec::int64());
    let notes: Notes = Topic::new(n.as_str(), Codec::utf8(), Codec::utf8());
    let (app, store) = totals(&unique("app"), &orders, &notes);
    let streams = start(&app, "a");
    let keys: Vec<String> = (0..30).map(|i| format!("acct-{i}")).collect();
    let placed = produce_placed(&o, &keys, None);
    let misplaced: Vec<&(String, i32, i64)> = placed
        .iter()
        .filter(|(k, p, _)| parsley::partition::partition_for_key(k.as_bytes(), 6) != *p)
        .collect();
    assert!(
        misplaced.len() >= 15,
        "only {} keys differ",
        misplaced.len()
    );
    let (key, partition, offset) = misplaced[0];
    let started = Instant::now();
    let answer = streams.query_after_records(
        &store,
        key,
        &[Coordinate {
            topic: o.clone(),
            partition: *partition,
            offset: *offset,
        }],
        Duration::from_secs(30),
    );
    match answer {
        Err(QueryError::KeyNotOnPartition { task, cause, .. }) => {
            assert_eq!(
                task.partition,
                parsley::partition::partition_for_key(key.as_bytes(), 6)
            );
            assert_eq!(cause.partition, *partition);
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    eventually("every misplaced record was counted", || {
        (streams
            .metrics()
            .iter()
            .map(|m| m.records_key_misplaced_total)
            .sum::<u64>()
            == misplaced.len() as u64)
            .then_some(())
    });
}

/// A relay stage in front of the totals: a causal query of the totals that
/// claims the order (upstream of them, through the relay) fails at once
/// with the reason, by coordinates and by clock, instead of answering a
/// total that may not include it yet.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_causal_query_claiming_an_upstream_write_is_refused_not_answered_stale() {
    let (o, m, n) = (unique("orders"), unique("mid"), unique("notes"));
    create_topics(&[(&o, 1), (&m, 1), (&n, 1)]);
    let orders: Orders = Topic::new(o.as_str(), Codec::utf8(), Codec::int64());
    let mid: Orders = Topic::new(m.as_str(), Codec::utf8(), Codec::int64());
    let notes: Notes = Topic::new(n.as_str(), Codec::utf8(), Codec::utf8());
    let mut relay = Stage::named("relay");
    let to_mid = relay.add_sink(&mid);
    let relay = relay
        .on(&orders, move |msg: &Message<String, i64>| {
            vec![to_mid.send(msg.key().cloned(), msg.value().copied())]
        })
        .build()
        .unwrap();
    let (totals_app, store) = totals(&unique("app"), &mid, &notes);
    let app = Parsley::named(
        totals_app.application_id(),
        [relay, totals_app.stages()[0].clone()],
    )
    .unwrap();
    let streams = start(&app, "a");
    let offset = produce(&o, 0, "acct", &7i64.to_be_bytes(), None);
    let at = Coordinate {
        topic: o.clone(),
        partition: 0,
        offset,
    };
    let started = Instant::now();
    match streams.query_after_records(&store, &"acct".to_owned(), &[at], Duration::from_secs(30)) {
        Err(QueryError::UpstreamCause { claim, via, .. }) => {
            assert_eq!(via, ["relay"]);
            assert!(claim.contains(&o), "{claim}");
        }
        other => panic!("{other:?}"),
    }
    let mut clock = VectorClock::new();
    let id = parsley_kafka::KafkaCluster::new(&config(), Duration::from_secs(20))
        .unwrap()
        .describe_topics(&[&o])
        .unwrap();
    let parsley_kafka::topic_ids::Described::Present { id, .. } = id[&o] else {
        panic!("{o} is not there");
    };
    clock.claim_offset(Channel::new(id, 0), offset);
    assert!(matches!(
        streams.query_after(&store, &"acct".to_owned(), &clock, Duration::from_secs(30)),
        Err(QueryError::UpstreamCause { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
    // The pipeline itself runs: the total arrives.
    eventually("the total was committed", || {
        (streams.query(&store, &"acct".to_owned()).ok()? == Some(7)).then_some(())
    });
}
