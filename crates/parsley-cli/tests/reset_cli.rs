//! `parsley reset` on a live broker (`PARSLEY_BOOTSTRAP`): a two-stage
//! application (a relay writing an internal topic, and a running total per
//! key reading it) runs once; the command refuses while it runs, prints a
//! plan that changes nothing, then resets it; the restarted application
//! reprocesses everything and its totals are the first run's again, its
//! relay's send sequences go on from where they were, and a second reset
//! of the reset application writes no state.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{config, create, parsley, unique};
use parsley::runtime::host::{ChangelogReader, TopicMetadata};
use parsley::*;
use parsley_kafka::{CausalStreams, ErrorResponse, KafkaCluster, StreamsOptions, StreamsState};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 2;
const KEYS: usize = 6;
const ROUNDS: usize = 5;

/// One output: its partition, key, value, `vc-sender` and `vc-seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Out {
    partition: i32,
    key: String,
    value: String,
    sender: Vec<u8>,
    seq: i64,
}

/// Every committed record of `topic`, waiting up to a minute for `n`.
fn read_all(topic: &str, n: usize) -> Vec<Out> {
    read_partitions(topic, PARTITIONS, n)
}

/// [`read_all`] of a topic with `partitions` partitions.
fn read_partitions(topic: &str, partitions: i32, n: usize) -> Vec<Out> {
    let consumer = common::reader(topic, partitions);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let header = |name: &str| {
                m.headers()
                    .and_then(|hs| hs.iter().find(|h| h.key == name))
                    .and_then(|h| h.value)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            };
            let seq = i64::from_be_bytes(header("vc-seq").try_into().unwrap());
            out.push(Out {
                partition: m.partition(),
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                sender: header("vc-sender"),
                seq,
            });
        }
    }
    assert_eq!(out.len(), n, "{topic}: expected {n} records, read {out:?}");
    out
}

/// Per partition, the key and value of each record in offset order.
/// Each key's values, in the order its partition holds them. Keys of one
/// output partition come from different tasks, whose records interleave
/// as the tasks happen to run (each emission is produced as it is made);
/// one key's come from one task, in its order.
fn by_key(records: &[Out]) -> BTreeMap<(i32, String), Vec<String>> {
    let mut m: BTreeMap<(i32, String), Vec<String>> = BTreeMap::new();
    for r in records {
        m.entry((r.partition, r.key.clone()))
            .or_default()
            .push(r.value.clone());
    }
    m
}

fn app(app_id: &str, input: &str, internal: &str, output: &str) -> Parsley {
    let t = |n: &str| -> Topic<String, String> { Topic::new(n, Codec::utf8(), Codec::utf8()) };
    let mut relay = Stage::named("relay");
    let to_internal = relay.add_sink(&t(internal));
    let relay = relay
        .on(&t(input), move |m: &parsley::Message<String, String>| {
            vec![to_internal.send(m.key().cloned(), m.value().cloned())]
        })
        .build()
        .unwrap();
    let mut totals = Stage::named("totals").state(Codec::int64(), || 0);
    let to_output = totals.add_sink(&t(output));
    let totals = totals
        .fold(
            &t(internal),
            move |sum: i64, m: &parsley::Message<String, String>| {
                let next = sum + m.value().and_then(|v| v.parse().ok()).unwrap_or(0);
                Step::to(next).emit(to_output.send(m.key().cloned(), next.to_string()))
            },
        )
        .build()
        .unwrap();
    Parsley::named(app_id, [relay, totals]).unwrap()
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_reset_application_reprocesses_to_the_same_outputs() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, internal, output, app_id) = (
        unique("in"),
        unique("internal"),
        unique("out"),
        unique("app"),
    );
    create(
        &cluster,
        &[
            (&input, PARTITIONS),
            (&internal, PARTITIONS),
            (&output, PARTITIONS),
        ],
    );
    let app = app(&app_id, &input, &internal, &output);
    let file = std::env::temp_dir().join(format!("{app_id}.json"));
    std::fs::write(&file, parsley_kafka::topology(&app).to_json()).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let start = || {
        let mut s = CausalStreams::new(&app, config())
            .unwrap()
            .with_options(StreamsOptions {
                commit_interval: Duration::from_millis(50),
                instance_id: Some("reset".to_owned()),
                state_dir: None,
                ..StreamsOptions::default()
            });
        s.start().unwrap();
        s
    };
    let reset = |extra: &[&str]| {
        let bootstrap = common::bootstrap();
        let mut args = vec!["reset", "--bootstrap", &bootstrap, "--app", &file];
        args.extend_from_slice(extra);
        parsley(&args)
    };

    let producer: BaseProducer = config().create().unwrap();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let (key, value) = (format!("k{k}"), format!("{}", round * 10 + k));
            producer
                .send(BaseRecord::to(&input).key(&key).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    producer.flush(Duration::from_secs(20)).unwrap();
    let n = ROUNDS * KEYS;

    let mut s = start();
    let first = read_all(&output, n);
    let (ok, text) = reset(&["--execute"]);
    assert!(!ok && text.contains("is running"), "{text}");
    // The coordinator's answer, under either group protocol, not only the
    // threads' reports.
    assert!(
        text.contains("its consumer group (") && text.contains("member(s)"),
        "{text}"
    );
    s.close(Duration::from_secs(30)).unwrap();
    assert_eq!(s.state(), StreamsState::Stopped);

    // The plan names every position and changes nothing.
    let (ok, plan) = reset(&[]);
    assert!(ok, "{plan}");
    assert!(plan.contains("Nothing was changed"), "{plan}");
    assert!(
        plan.contains(&format!("{input}:0  committed ")) && plan.contains(" -> 0"),
        "{plan}"
    );
    assert!(
        plan.contains("its end: the application writes this topic"),
        "{plan}"
    );
    assert!(plan.contains("read for their senders' sequences"), "{plan}");
    let committed = |topic: &str| {
        let mut c = config();
        c.set("group.id", &app_id);
        let consumer: BaseConsumer = c.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(topic, p);
        }
        consumer
            .committed_offsets(tpl, Duration::from_secs(20))
            .unwrap()
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            })
            .sum::<i64>()
    };
    // An application file naming a source that does not exist is refused
    // before anything is read or written.
    let missing = std::env::temp_dir().join(format!("{app_id}-missing.json"));
    std::fs::write(
        &missing,
        format!(
            r#"{{"application_id": "{app_id}", "stages": [{{"name": "relay", "sources": ["pt-no-such-topic"]}}]}}"#
        ),
    )
    .unwrap();
    let bootstrap = common::bootstrap();
    let (ok, text) = parsley(&[
        "reset",
        "--bootstrap",
        &bootstrap,
        "--app",
        missing.to_str().unwrap(),
        "--execute",
    ]);
    assert!(
        !ok && text.contains("\"pt-no-such-topic\" of stage \"relay\" does not exist"),
        "{text}"
    );
    let consumed = committed(&input);
    assert!(consumed >= n as i64, "the first run consumed {consumed}");
    assert_eq!(committed(&input), consumed, "a plan changes nothing");

    let (ok, text) = reset(&["--execute"]);
    assert!(ok, "{text}");
    assert!(text.contains("Done"), "{text}");
    assert_eq!(committed(&input), 0, "sources go back to their start");
    // A second reset has nothing left to write.
    let (ok, again) = reset(&["--execute"]);
    assert!(ok, "{again}");
    assert!(
        again.contains("Protocol state: 0 record(s) to append"),
        "{again}"
    );
    assert!(again.contains("Fold state: 0 key(s) to delete"), "{again}");

    let mut s = start();
    let all = read_all(&output, 2 * n);
    s.close(Duration::from_secs(30)).unwrap();
    // Per key, the reprocessed totals follow the first run's and equal
    // them: the fold state started again from nothing, and the relay's old
    // records were not read twice.
    let before = by_key(&first);
    let after = by_key(&all);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (key, old) in &before {
        let now = &after[key];
        assert_eq!(&now[..old.len()], &old[..], "{key:?}");
        assert_eq!(&now[old.len()..], &old[..], "{key:?} reprocessed");
    }
    // The sequences of both stages go on from where the first run left
    // them, never again from 1: each sender's, on each partition, rise
    // through both runs.
    for topic in [&internal, &output] {
        let mut seqs: BTreeMap<(i32, Vec<u8>), Vec<i64>> = BTreeMap::new();
        for r in read_all(topic, 2 * n) {
            seqs.entry((r.partition, r.sender)).or_default().push(r.seq);
        }
        assert!(!seqs.is_empty());
        for ((p, _), seqs) in seqs {
            assert!(
                seqs.windows(2).all(|w| w[1] > w[0]),
                "{topic}:{p} sequences {seqs:?}"
            );
        }
    }
}

/// Writes `values` to partition 0 of `topic` as a stage upstream would:
/// each stamped with a sender tag, its send sequence rising from 1.
fn produce_tagged(topic: &str, values: &[&str]) {
    use parsley::protocol::{CausalHeaders, SenderId, SenderTag};
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: BaseProducer = config().create().unwrap();
    for (i, value) in values.iter().enumerate() {
        let stamp = CausalHeaders {
            sender: Some(SenderTag {
                sender: SenderId::from_u128(0x5E17),
                seq: i as i64 + 1,
            }),
            ..CausalHeaders::default()
        };
        let headers = stamp
            .encode()
            .into_iter()
            .fold(OwnedHeaders::new(), |hs, (key, value)| {
                hs.insert(Header {
                    key,
                    value: Some(&value),
                })
            });
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(0)
                    .key("k")
                    .payload(*value)
                    .headers(headers),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(20)).unwrap();
}

/// A stage that refuses the record "poison" and copies the rest to
/// `output`, its topology written to a file for `parsley reset --app`.
fn checking_app(app_id: &str, input: &str, output: &str) -> (Parsley, String) {
    let stage = common::refusing_stage("check", input, output);
    let app = Parsley::named(app_id, [stage]).unwrap();
    let file = std::env::temp_dir().join(format!("{app_id}.json"));
    std::fs::write(&file, parsley_kafka::topology(&app).to_json()).unwrap();
    (app, file.to_str().unwrap().to_owned())
}

fn start_checking(app: &Parsley) -> CausalStreams {
    let mut s = CausalStreams::new(app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            instance_id: Some("reset-first".to_owned()),
            state_dir: None,
            ..StreamsOptions::default()
        });
    // A failing task restarts in place: the instance stays in the group.
    s.set_uncaught_error_handler(|_| ErrorResponse::ReplaceThread);
    s.start().unwrap();
    s
}

/// `parsley reset --to-offset 1 --execute` of the application in `file`;
/// its output.
fn reset_past_the_first(file: &str) -> String {
    let bootstrap = common::bootstrap();
    let (ok, text) = parsley(&[
        "reset",
        "--bootstrap",
        &bootstrap,
        "--app",
        file,
        "--to-offset",
        "1",
        "--execute",
    ]);
    assert!(ok, "{text}");
    text
}

/// Starts the application after its reset: the stage starts at once and
/// copies the two records after the first.
fn runs_past_the_first(app: &Parsley, output: &str) {
    let mut s = start_checking(app);
    let read = read_partitions(output, 1, 2);
    let values: Vec<&str> = read.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values, ["two", "three"]);
    assert_eq!(s.restarted_tasks(), 0, "the task started at once");
    s.close(Duration::from_secs(30)).unwrap();
}

/// The keys of the committed records of partition 0 of a changelog.
fn changelog_keys(cluster: &KafkaCluster, topic: &str) -> Vec<String> {
    cluster
        .read_changelog(topic, 0)
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

/// A stage that fails on its first record (an upstream stage's, tagged)
/// is reset to the record after it: the upstream's record below the new
/// position becomes a skip mark in the task's state, and the restarted
/// stage delivers the records after it.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_stage_that_failed_its_first_record_runs_after_a_reset_past_it() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, output, app_id) = (unique("in"), unique("out"), unique("app"));
    create(&cluster, &[(&input, 1), (&output, 1)]);
    let (app, file) = checking_app(&app_id, &input, &output);
    produce_tagged(&input, &["poison", "two", "three"]);

    let mut s = start_checking(&app);
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.restarted_tasks() < 2 {
        assert!(Instant::now() < deadline, "the task never failed");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.close(Duration::from_secs(30)).unwrap();
    // The runtime commits a task's scope before its first record, so the
    // task that failed on every try recorded that and nothing else.
    let state = parsley_kafka::topology(&app).stages[0]
        .state_changelog
        .clone();
    assert_eq!(changelog_keys(&cluster, &state), ["scope"]);

    let text = reset_past_the_first(&file);
    assert!(text.contains(&format!("{input}:0")), "{text}");
    assert!(
        text.contains("Protocol state: 1 record(s) to append"),
        "{text}"
    );

    runs_past_the_first(&app, &output);
}

/// A task that never committed has no recorded scope: here the
/// application never ran, its state changelog created beforehand (as on a
/// cluster where applications may not create topics). A reset above a
/// tagged upstream's records writes nothing into that state (skip marks
/// without a scope would make every restore of it refuse, for good), and
/// the stage then starts at the position and runs.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_task_that_never_committed_starts_after_a_reset() {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, output, app_id) = (unique("in"), unique("out"), unique("app"));
    create(&cluster, &[(&input, 1), (&output, 1)]);
    let (app, file) = checking_app(&app_id, &input, &output);
    let state = parsley_kafka::topology(&app).stages[0]
        .state_changelog
        .clone();
    let changelog =
        NewTopic::new(&state, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    for r in futures_executor::block_on(
        cluster
            .admin()
            .create_topics(&[changelog], &AdminOptions::new()),
    )
    .unwrap()
    {
        r.unwrap();
    }
    produce_tagged(&input, &["poison", "two", "three"]);

    let text = reset_past_the_first(&file);
    assert!(text.contains(&format!("{input}:0")), "{text}");
    assert!(
        text.contains("Protocol state: 0 record(s) to append"),
        "{text}"
    );
    assert!(changelog_keys(&cluster, &state).is_empty());

    runs_past_the_first(&app, &output);
}

/// A stage that never ran has no state changelog at all (the runtime
/// creates it at the first start). A reset to an offset writes its group
/// positions and nothing else, and the plan says exactly that; the stage's
/// first run starts at the positions.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_stage_that_never_ran_is_reset_to_an_offset_and_starts_there() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, output, app_id) = (unique("in"), unique("out"), unique("app"));
    create(&cluster, &[(&input, 1), (&output, 1)]);
    let (app, file) = checking_app(&app_id, &input, &output);
    produce_tagged(&input, &["poison", "two", "three"]);
    let state = parsley_kafka::topology(&app).stages[0]
        .state_changelog
        .clone();

    let text = reset_past_the_first(&file);
    assert!(
        text.contains(&format!("{input}:0  committed none -> 1")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "Stage \"check\" never ran ({state} does not exist): only its group positions above are written"
        )),
        "{text}"
    );
    assert!(cluster.describe(&state).is_err(), "nothing created");
    runs_past_the_first(&app, &output);
}

/// A reset that stopped half way leaves its mark on the group's positions:
/// an instance started on it refuses, naming the interrupted reset, and
/// running the reset again finishes it, after which the stage runs.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn an_interrupted_reset_is_refused_until_it_is_run_again() {
    use parsley::protocol::host::RESET_IN_PROGRESS;
    use rdkafka::consumer::CommitMode;
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (input, output, app_id) = (unique("in"), unique("out"), unique("app"));
    create(&cluster, &[(&input, 1), (&output, 1)]);
    let (app, file) = checking_app(&app_id, &input, &output);
    produce_tagged(&input, &["poison", "two", "three"]);
    // What the reset's first step writes, and nothing after it: the group's
    // position marked.
    let mut c = config();
    c.set("group.id", &app_id)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&input, 0, Offset::Offset(0))
        .unwrap();
    tpl.find_partition(&input, 0)
        .unwrap()
        .set_metadata(RESET_IN_PROGRESS);
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
    drop(consumer);

    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut s = CausalStreams::new(&app, config())
        .unwrap()
        .with_options(StreamsOptions {
            commit_interval: Duration::from_millis(50),
            state_dir: None,
            ..StreamsOptions::default()
        });
    let seen = errors.clone();
    s.set_uncaught_error_handler(move |e| {
        seen.lock().unwrap().push(e.to_string());
        ErrorResponse::ShutdownClient
    });
    s.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while errors.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the instance ran on a half reset"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let error = errors.lock().unwrap()[0].clone();
    assert!(
        error.contains("reset that began and did not finish")
            && error.contains("parsley reset again"),
        "{error}"
    );
    let _ = s.close(Duration::from_secs(30));
    assert!(read_partitions(&output, 1, 0).is_empty());

    reset_past_the_first(&file);
    runs_past_the_first(&app, &output);
}
