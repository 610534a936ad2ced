//! A topic's declared partitioner, in the TestDriver: where keys land, where
//! a stage writes them, where queries look, and what happens to a record
//! whose producer placed its key otherwise.

use parsley::partition::Partitioner;
use parsley::*;

type Deposits = Topic<String, i64>;

fn app(deposits: &Deposits, balances: &Deposits) -> (Parsley, StateStore<String, i64>) {
    let stage = Stage::named("balances").state(Codec::int64(), || 0);
    let store = stage.store(Codec::utf8());
    let mut stage = stage;
    let out = stage.add_sink(balances);
    let stage = stage
        .fold(deposits, move |t: i64, m: &Message<String, i64>| {
            let t = t + m.value().copied().unwrap_or(0);
            Step::to(t).emit(out.send(m.key().cloned(), t))
        })
        .build()
        .unwrap();
    (Parsley::named("bank", [stage]).unwrap(), store)
}

fn topics(p: Partitioner) -> (Deposits, Deposits) {
    (
        Topic::new("deposits", Codec::utf8(), Codec::int64()).partitioned_by(p),
        Topic::new("balances", Codec::utf8(), Codec::int64()).partitioned_by(p),
    )
}

fn driver(app: &Parsley) -> TestDriver {
    TestDriver::builder(app)
        .partitions("deposits", 6)
        .partitions("balances", 6)
        .build()
        .unwrap()
}

fn keys() -> Vec<String> {
    (0..40).map(|i| format!("acct-{i}")).collect()
}

#[test]
fn a_declared_partitioner_places_reads_writes_and_finds_every_key() {
    for p in [Partitioner::Murmur2, Partitioner::Crc32, Partitioner::Fnv1a] {
        let (deposits, balances) = topics(p);
        let (app, store) = app(&deposits, &balances);
        let mut d = driver(&app);
        for k in keys() {
            let at = d.pipe(&deposits, k.as_str(), 5).unwrap();
            assert_eq!(at.partition, p.partition(k.as_bytes(), 6), "{p:?} {k}");
            assert_eq!(d.partition_of(&deposits, k.as_str()).unwrap(), at.partition);
            assert_eq!(d.state_after(&store, k.as_str(), &[at]).unwrap(), Some(5));
        }
        // The stage writes to its sink by the sink's partitioner too.
        let out = d.read_all(&balances).unwrap();
        assert_eq!(out.len(), 40);
        for r in &out {
            let k = r.key.as_ref().unwrap();
            assert_eq!(
                r.coordinate.partition,
                p.partition(k.as_bytes(), 6),
                "{p:?} {k}"
            );
        }
        assert!(d.task_stats().iter().all(|(_, s)| s.misplaced_keys == 0));
    }
    // The partitioners disagree on most of these keys, so the checks above
    // could not pass with one partitioner standing in for another.
    let differ = keys()
        .iter()
        .filter(|k| {
            Partitioner::Crc32.partition(k.as_bytes(), 6)
                != Partitioner::Murmur2.partition(k.as_bytes(), 6)
        })
        .count();
    assert!(differ >= 25, "{differ}");
}

#[test]
fn a_record_its_producer_placed_elsewhere_is_counted_and_its_causal_query_refused() {
    let (deposits, balances) = topics(Partitioner::Murmur2);
    let (app, store) = app(&deposits, &balances);
    let mut d = driver(&app);
    // Placed as librdkafka's default partitioner would, on a topic
    // declared (by default) as Kafka's.
    let key = keys()
        .into_iter()
        .find(|k| {
            Partitioner::Crc32.partition(k.as_bytes(), 6)
                != Partitioner::Murmur2.partition(k.as_bytes(), 6)
        })
        .unwrap();
    let elsewhere = Partitioner::Crc32.partition(key.as_bytes(), 6);
    let at = d
        .pipe_input(&deposits, Input::new(key.as_str(), 9).partition(elsewhere))
        .unwrap();
    d.run().unwrap();
    let misplaced: u64 = d.task_stats().iter().map(|(_, s)| s.misplaced_keys).sum();
    assert_eq!(misplaced, 1);
    assert_eq!(
        d.metrics()
            .iter()
            .map(|m| m.records_key_misplaced_total)
            .sum::<u64>(),
        1
    );
    match d.state_after(&store, key.as_str(), std::slice::from_ref(&at)) {
        Err(DriverError::KeyNotOnPartition {
            task_partition,
            cause,
            partitioner,
            ..
        }) => {
            assert_eq!(
                task_partition,
                Partitioner::Murmur2.partition(key.as_bytes(), 6)
            );
            assert_eq!(cause, at);
            assert_eq!(partitioner, Partitioner::Murmur2);
        }
        other => panic!("{other:?}"),
    }
    // A record on the key's own partition is not counted.
    d.pipe(&deposits, key.as_str(), 1).unwrap();
    let misplaced: u64 = d.task_stats().iter().map(|(_, s)| s.misplaced_keys).sum();
    assert_eq!(misplaced, 1);
}

#[test]
fn stateful_sources_on_different_partitioners_are_refused() {
    let a: Deposits =
        Topic::new("a", Codec::utf8(), Codec::int64()).partitioned_by(Partitioner::Crc32);
    let b: Deposits = Topic::new("b", Codec::utf8(), Codec::int64());
    let fold = |t: i64, _m: &Message<String, i64>| Step::to(t);
    let e = Stage::named("s")
        .state(Codec::int64(), || 0)
        .fold(&a, fold)
        .fold(&b, fold)
        .build()
        .unwrap_err();
    match &e {
        StageError::PartitionersDiffer { topics, .. } => assert_eq!(
            topics,
            &vec![
                ("a".to_owned(), Partitioner::Crc32),
                ("b".to_owned(), Partitioner::Murmur2)
            ]
        ),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("Topic::partitioned_by"), "{e}");
    // The same partitioner on both builds.
    let b = b.partitioned_by(Partitioner::Crc32);
    assert!(
        Stage::named("s")
            .state(Codec::int64(), || 0)
            .fold(&a, fold)
            .fold(&b, fold)
            .build()
            .is_ok()
    );
}

/// The guide's example (docs/guide/src/kafka.md includes the part between
/// the ANCHOR lines).
#[test]
fn the_guide_example_declares_librdkafkas_default() {
    // ANCHOR: partitioned_by
    use parsley::partition::Partitioner;
    // Written by rdkafka (or confluent-kafka) producers on their defaults.
    let deposits: Topic<String, i64> = Topic::new("deposits", Codec::utf8(), Codec::int64())
        .partitioned_by(Partitioner::from_librdkafka("consistent_random").unwrap());
    // ANCHOR_END: partitioned_by
    assert_eq!(deposits.partitioner(), Partitioner::Crc32);
}
