//! The lifecycle an operator sees, on a real broker: an instance is
//! `Rebalancing` until every stream thread has its assignment and has
//! started every task of it, and `Running` only then; a second instance
//! joining makes the first rebalance and run again; `metrics()` lists only
//! the tasks a thread holds now.
//!
//! These tests need a broker: they run when `PARSLEY_BOOTSTRAP` names one.
//! This file counts task starts through a process-wide tracing subscriber
//! (`common::assignments`), so it is a test binary of its own.

mod common;

use common::assignments;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{config, create_topics, unique};
use parsley::*;
use parsley_kafka::{CausalStreams, GroupProtocol, StreamsOptions, StreamsState};

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A stateful stage (a count per key, so every task has two changelogs to
/// restore).
fn counting(app_id: &str, input: &T, output: &T) -> Parsley {
    let mut builder = Stage::named("count").state(Codec::int64(), || 0);
    let out = builder.add_sink(output);
    let stage = builder
        .fold(input, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(out.send(m.key().cloned(), (n + 1).to_string()))
        })
        .build()
        .unwrap();
    Parsley::named(app_id, [stage]).unwrap()
}

fn instance(app: &Parsley, name: &str) -> (CausalStreams, Arc<Mutex<Vec<String>>>) {
    instance_on(app, name, GroupProtocol::Consumer)
}

fn instance_on(
    app: &Parsley,
    name: &str,
    group_protocol: GroupProtocol,
) -> (CausalStreams, Arc<Mutex<Vec<String>>>) {
    instance_with(
        app,
        StreamsOptions {
            commit_interval: Duration::from_millis(50),
            instance_id: Some(name.to_owned()),
            group_protocol,
            ..StreamsOptions::default()
        },
    )
}

fn instance_with(
    app: &Parsley,
    options: StreamsOptions,
) -> (CausalStreams, Arc<Mutex<Vec<String>>>) {
    let mut s = CausalStreams::new(app, config())
        .unwrap()
        .with_options(options);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    s.set_state_listener(move |old, new| {
        log.lock().unwrap().push(format!("{old:?} -> {new:?}"));
    });
    (s, seen)
}

fn tasks(s: &CausalStreams) -> BTreeSet<String> {
    s.metrics()
        .into_iter()
        .map(|m| m.task.to_string())
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn running_means_every_task_started_and_a_join_rebalances_then_runs_again() {
    assignments::taken();
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 6), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let (mut a, a_seen) = instance(&app, "a");
    a.start().unwrap();
    assert_eq!(
        a.state(),
        StreamsState::Rebalancing,
        "not running before any assignment"
    );
    a.wait_until_running(Duration::from_secs(90)).unwrap();
    // Running only once every task has started (and published).
    wait_for("a's six tasks", || tasks(&a).len() == 6);
    assert_eq!(a.state(), StreamsState::Running);

    let (mut b, _) = instance(&app, "b");
    b.start().unwrap();
    b.wait_until_running(Duration::from_secs(90)).unwrap();
    wait_for("both to run with the tasks split", || {
        a.state() == StreamsState::Running
            && b.state() == StreamsState::Running
            && tasks(&a).len() + tasks(&b).len() == 6
            && !tasks(&b).is_empty()
    });
    let (ta, tb) = (tasks(&a), tasks(&b));
    // The consumer group protocol moves only what must move: the tasks a
    // keeps were never stopped, so a started six tasks in all, once each.
    assert_eq!(
        assignments::tasks_started(&app_id, "a"),
        6,
        "a restarted none of the tasks it kept"
    );
    assert_eq!(assignments::tasks_started(&app_id, "b"), tb.len());
    assert!(
        ta.is_disjoint(&tb),
        "a task is listed by one instance: {ta:?} {tb:?}"
    );
    assert_eq!(ta.union(&tb).count(), 6);
    let changes = a_seen.lock().unwrap().clone();
    assert_eq!(
        changes[..2],
        ["Created -> Rebalancing", "Rebalancing -> Running"],
        "{changes:?}"
    );
    assert!(
        changes
            .windows(2)
            .skip(1)
            .any(|w| w == ["Running -> Rebalancing", "Rebalancing -> Running"]),
        "the join made a rebalance and run again: {changes:?}"
    );
    b.close(Duration::from_secs(30)).unwrap();
    a.close(Duration::from_secs(30)).unwrap();
    assert_eq!(a.state(), StreamsState::Stopped);
}

/// The classic protocol (for brokers older than 4.0) still runs: a join
/// splits the tasks between the two instances and both run, exactly once
/// each; but its eager range assignor revokes everything at a rebalance, so
/// the first instance restarts the tasks it keeps (the cost the consumer
/// group protocol removes).
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn the_classic_protocol_runs_and_restarts_every_task_at_a_join() {
    assignments::taken();
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 6), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let (mut a, _) = instance_on(&app, "a", GroupProtocol::Classic);
    a.start().unwrap();
    a.wait_until_running(Duration::from_secs(90)).unwrap();
    wait_for("a's six tasks", || tasks(&a).len() == 6);
    let (mut b, _) = instance_on(&app, "b", GroupProtocol::Classic);
    b.start().unwrap();
    wait_for("both to run with the tasks split", || {
        a.state() == StreamsState::Running
            && b.state() == StreamsState::Running
            && tasks(&a).len() + tasks(&b).len() == 6
            && !tasks(&b).is_empty()
    });
    let (ta, tb) = (tasks(&a), tasks(&b));
    assert!(ta.is_disjoint(&tb));
    assert!(
        assignments::tasks_started(&app_id, "a") > 6,
        "the eager protocol restarted the tasks a kept"
    );
    // Records still go through, once each.
    let producer: rdkafka::producer::BaseProducer = config().create().unwrap();
    for p in 0..6 {
        producer
            .send(
                rdkafka::producer::BaseRecord::to(&i)
                    .partition(p)
                    .key("k")
                    .payload("v"),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(20)).unwrap();
    assert_eq!(
        common::read_committed(&o, 1, 6, Duration::from_secs(60)).len(),
        6
    );
    assert_eq!(
        common::read_committed(&o, 1, 7, Duration::from_secs(2)).len(),
        6,
        "exactly once"
    );
    b.close(Duration::from_secs(30)).unwrap();
    a.close(Duration::from_secs(30)).unwrap();
}

/// Static membership: an instance that closes and starts again within the
/// group's session timeout (6 s on the test broker; here after 3 s) takes
/// its partitions back, and the other instance never takes them over
/// meanwhile: it starts
/// no task beyond its own. (Without static membership the leave moves the
/// three tasks to the other instance and the return moves them back.)
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_static_member_restarting_within_the_session_timeout_moves_no_task() {
    assignments::taken();
    let (i, o, app_id) = (unique("in"), unique("out"), unique("app"));
    create_topics(&[(&i, 6), (&o, 1)]);
    let app = counting(&app_id, &topic(&i), &topic(&o));
    let statically = |name: &str| {
        instance_with(
            &app,
            StreamsOptions {
                commit_interval: Duration::from_millis(50),
                instance_id: Some(name.to_owned()),
                static_membership: true,
                ..StreamsOptions::default()
            },
        )
        .0
    };
    let mut a = statically("a");
    a.start().unwrap();
    a.wait_until_running(Duration::from_secs(90)).unwrap();
    let mut b = statically("b");
    b.start().unwrap();
    wait_for("the tasks split over both", || {
        a.state() == StreamsState::Running
            && b.state() == StreamsState::Running
            && tasks(&a).len() == 3
            && tasks(&b).len() == 3
    });
    let a_started = assignments::tasks_started(&app_id, "a");
    assert_eq!(a_started, 6, "a ran all six before b joined");
    let b_tasks = tasks(&b);
    b.close(Duration::from_secs(30)).unwrap();
    // Down for three heartbeats, within the 6 s session timeout: long
    // enough for a dynamic member's partitions to move.
    std::thread::sleep(Duration::from_secs(3));
    let mut b = statically("b");
    b.start().unwrap();
    wait_for("b to run its three tasks again", || {
        b.state() == StreamsState::Running && tasks(&b) == b_tasks
    });
    // Give a late reassignment the time to show.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        assignments::tasks_started(&app_id, "a"),
        a_started,
        "a took none of b's tasks while b restarted"
    );
    assert_eq!(tasks(&a).len(), 3);
    b.close(Duration::from_secs(30)).unwrap();
    a.close(Duration::from_secs(30)).unwrap();
}
