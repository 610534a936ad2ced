//! The runtime's promises under failure, ticks, headers, partitioning and
//! density, driven through the TestDriver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use parsley::partition::partition_for_key;
use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn value(m: &Message<String, String>) -> String {
    m.value().cloned().unwrap_or_default()
}

// ---------------------------------------------------------------- abort and retry

// ANCHOR: abort-retry
#[test]
fn a_failing_handler_aborts_and_the_retry_redelivers_in_causal_order() {
    let (c1, c2, out) = (topic("c1"), topic("c2"), topic("out"));
    let attempts: Arc<Mutex<Vec<String>>> = Arc::default();
    let fail_once = Arc::new(AtomicBool::new(true));
    let handler = |attempts: Arc<Mutex<Vec<String>>>, fail: Arc<AtomicBool>, out: T| {
        move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
            attempts.lock().unwrap().push(m.coordinate().to_string());
            if value(m) == "effect" && fail.swap(false, Ordering::SeqCst) {
                return Err("transient failure".into());
            }
            let trace = m
                .header("trace")
                .map(|h| String::from_utf8_lossy(h).into_owned());
            Ok(vec![
                out.send(m.key().cloned(), format!("{} {trace:?}", value(m))),
            ])
        }
    };
    let stage = Stage::named("audit")
        .on(
            &c1,
            handler(attempts.clone(), fail_once.clone(), out.clone()),
        )
        .on(
            &c2,
            handler(attempts.clone(), fail_once.clone(), out.clone()),
        )
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();

    // The effect arrives first (with a header of its own) and is held.
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(
        &c2,
        Input::new("k", "effect")
            .after(&cause)
            .header("trace", "t-7"),
    )
    .unwrap();
    assert_eq!(d.held().len(), 1);

    // The cause releases the effect, whose handler fails: the whole step
    // aborts, the cause's delivery included.
    let err = d.pipe(&c1, "k", "cause").unwrap_err();
    assert!(
        matches!(&err, DriverError::Task(TaskError::Logic { coordinate, .. }) if coordinate.topic == "c2"),
        "{err}"
    );
    assert_eq!(d.aborts(), 1);
    assert!(
        d.values(&out).unwrap().is_empty(),
        "nothing of the step is committed"
    );
    assert!(d.deliveries().is_empty());

    // The retry restarts the task from committed state (the held effect is
    // restored from the store, its header with it) and redelivers in the
    // same order.
    d.run().unwrap();
    assert_eq!(
        *attempts.lock().unwrap(),
        vec!["c1:0@0", "c2:0@0", "c1:0@0", "c2:0@0"]
    );
    assert_eq!(
        d.values(&out).unwrap(),
        vec!["cause None".to_string(), "effect Some(\"t-7\")".to_string()]
    );
    assert!(d.held().is_empty());
}
// ANCHOR_END: abort-retry

// ANCHOR: deterministic
#[test]
fn a_panicking_fold_fails_the_task_and_keeps_committed_state() {
    let c1: Topic<String, i64> = Topic::new("c1", Codec::utf8(), Codec::int64());
    let stage = Stage::named("sum")
        .state(Codec::int64(), || 0)
        .fold(&c1, |s: i64, m: &Message<String, i64>| {
            let v = m.value().copied().unwrap_or(0);
            assert!(v >= 0, "negative input");
            Step::to(s + v)
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&c1, "k", 5).unwrap();
    let err = d.pipe(&c1, "k", -1).unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::Panic { .. })),
        "{err}"
    );
    assert_eq!(
        d.fold_state::<i64, _>("sum", &Codec::utf8(), "k").unwrap(),
        Some(5)
    );
    // Deterministic: every retry fails again, and the record blocks its channel.
    assert!(d.run().is_err());
    d.append(&c1, Input::new("k", 1)).unwrap();
    assert!(d.run().is_err());
    assert_eq!(
        d.fold_state::<i64, _>("sum", &Codec::utf8(), "k").unwrap(),
        Some(5)
    );
}
// ANCHOR_END: deterministic

// ANCHOR: recovering
#[test]
fn a_recovering_handler_routes_to_the_error_sink_exactly_once() {
    let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    let shipments: Topic<String, i64> = Topic::new("shipments", Codec::utf8(), Codec::int64());
    let rejects = topic("rejects");
    let (s, r) = (shipments.clone(), rejects.clone());
    let stage = Stage::named("shipping")
        .on(
            &orders,
            recovering(
                move |m: &Message<String, i64>| -> Result<Vec<Emission>, String> {
                    match m.value() {
                        Some(&q) if q > 0 => Ok(vec![s.send(m.key().cloned(), q)]),
                        _ => Err("quantity must be positive".into()),
                    }
                },
                move |m: &Message<String, i64>, e: &String| {
                    vec![r.send(m.key().cloned(), e.clone())]
                },
            ),
        )
        .sink(&shipments)
        .sink(&rejects)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&orders, "o-1", 0).unwrap();
    d.pipe(&orders, "o-2", 3).unwrap();
    d.restart().unwrap();
    d.run().unwrap();
    assert_eq!(
        d.key_values(&rejects).unwrap(),
        vec![(
            Some("o-1".to_string()),
            Some("quantity must be positive".to_string())
        )]
    );
    assert_eq!(d.values(&shipments).unwrap(), vec![3]);
    assert_eq!(d.aborts(), 0);
    // The reject is stamped and ordered like any other emission.
    assert!(d.records(&rejects).unwrap()[0].is_stamped());
}
// ANCHOR_END: recovering

// ANCHOR: owned-forward
#[test]
fn an_owned_handler_forwards_the_key_and_value_it_owns() {
    let (orders, audit) = (topic("orders"), topic("audit"));
    let mut builder = Stage::named("audit");
    let out = builder.add_sink(&audit);
    let stage = builder
        .on_owned(&orders, move |m| {
            let (key, value) = m.into_key_value();
            out.send(key, value)
        })
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("shop", [stage]).unwrap()).unwrap();
    d.pipe(&orders, "o-1", "two pears").unwrap();
    d.pipe(&orders, None, None).unwrap();
    assert_eq!(
        d.key_values(&audit).unwrap(),
        vec![
            (Some("o-1".to_string()), Some("two pears".to_string())),
            (None, None)
        ]
    );
}
// ANCHOR_END: owned-forward

/// Every form a handler may return goes through a stage: a bare
/// `Option`, a `Result` of one emission, and `Emissions`.
#[test]
fn handlers_may_return_every_emission_form() {
    let (a, b, c, out) = (topic("a"), topic("b"), topic("c"), topic("out"));
    let mut builder = Stage::named("forms");
    let sink = builder.add_sink(&out);
    let stage = builder
        .on(&a, move |m| {
            (value(m) != "skip").then(|| sink.send(m.key().cloned(), value(m)))
        })
        .on(&b, move |m| -> Result<Emission, String> {
            if value(m) == "bad" {
                return Err("bad".into());
            }
            Ok(sink.send(m.key().cloned(), value(m)))
        })
        .on(&c, move |m| {
            let mut all = Emissions::new();
            all.push(sink.send("first", value(m)));
            all.push(sink.send("second", value(m)));
            all
        })
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    d.pipe(&a, "k", "skip").unwrap();
    d.pipe(&a, "k", "kept").unwrap();
    d.pipe(&b, "k", "good").unwrap();
    d.pipe(&c, "k", "twice").unwrap();
    assert!(matches!(
        d.pipe(&b, "k", "bad").unwrap_err(),
        DriverError::Task(TaskError::Logic { .. })
    ));
    assert_eq!(
        d.values(&out).unwrap(),
        vec!["kept", "good", "twice", "twice"]
    );
    assert_eq!(
        d.key_values(&out).unwrap()[2..]
            .iter()
            .map(|(k, _)| k.clone().unwrap())
            .collect::<Vec<_>>(),
        vec!["first", "second"]
    );
}

/// A handler given the message by value may return one emission, none, or
/// an error, without a list: `Ok(None)` emits nothing and commits the
/// delivery, an `Err` aborts and the retry redelivers, and the moved key
/// and value arrive intact.
#[test]
fn an_owned_handler_returns_one_emission_none_or_an_error() {
    let (input, out) = (topic("in"), topic("out"));
    let fail_once = Arc::new(AtomicBool::new(true));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut builder = Stage::named("filter");
    let sink = builder.add_sink(&out);
    let (fail, log) = (fail_once.clone(), seen.clone());
    let stage = builder
        .on_owned(
            &input,
            move |m: Message<String, String>| -> Result<Option<Emission>, String> {
                log.lock().unwrap().push(value(&m));
                match m.value().map(String::as_str) {
                    Some("skip") => Ok(None),
                    Some("flaky") if fail.swap(false, Ordering::SeqCst) => Err("not yet".into()),
                    _ => {
                        let (key, value) = m.into_key_value();
                        Ok(Some(sink.send(key, value)))
                    }
                }
            },
        )
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&input, "a", "one").unwrap();
    d.pipe(&input, "b", "skip").unwrap();
    let err = d.pipe(&input, "c", "flaky").unwrap_err();
    assert!(
        matches!(&err, DriverError::Task(TaskError::Logic { coordinate, .. }) if coordinate.offset == 2),
        "{err}"
    );
    // The retry handles the failed record again, and the next one after it.
    d.run().unwrap();
    d.pipe(&input, "d", "two").unwrap();
    assert_eq!(
        d.key_values(&out).unwrap(),
        vec![
            (Some("a".to_string()), Some("one".to_string())),
            (Some("c".to_string()), Some("flaky".to_string())),
            (Some("d".to_string()), Some("two".to_string())),
        ]
    );
    assert_eq!(d.aborts(), 1, "the Err aborted its step once");
    assert!(!fail_once.load(Ordering::SeqCst));
    // The failed record was handled again; the skipped one only once.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().filter(|v| *v == "flaky").count(), 2);
    assert_eq!(seen.iter().filter(|v| *v == "skip").count(), 1);
}

// ANCHOR: recovering-fold
#[test]
fn a_recovering_fold_keeps_the_prior_state() {
    let pay: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    let rejects = topic("rejects");
    let r = rejects.clone();
    let stage = Stage::named("balances")
        .state(Codec::int64(), || 0)
        .fold(
            &pay,
            recovering_fold(
                |b: i64, m: &Message<String, i64>| -> Result<Step<i64>, String> {
                    let next = b + m.value().copied().unwrap_or(0);
                    if next < 0 {
                        Err(format!("overdraft {next}"))
                    } else {
                        Ok(Step::to(next))
                    }
                },
                move |m: &Message<String, i64>, e: &String| {
                    vec![r.send(m.key().cloned(), e.clone())]
                },
            ),
        )
        .sink(&rejects)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    d.pipe(&pay, "a", 10).unwrap();
    d.pipe(&pay, "a", -15).unwrap();
    assert_eq!(
        d.fold_state::<i64, _>("balances", &Codec::utf8(), "a")
            .unwrap(),
        Some(10)
    );
    assert_eq!(d.values(&rejects).unwrap(), vec!["overdraft -5"]);
}
// ANCHOR_END: recovering-fold

#[test]
fn codec_failures_fail_the_task() {
    let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    let out: Topic<String, i64> = Topic::new(
        "out",
        Codec::utf8(),
        Codec::try_new(
            |v: &i64| {
                if *v == 13 {
                    Err("unlucky")
                } else {
                    Ok(v.to_be_bytes().to_vec())
                }
            },
            |b: &[u8]| Codec::int64().decode(b),
        ),
    );
    let o = out.clone();
    let stage = Stage::named("copy")
        .on(&orders, move |m: &Message<String, i64>| {
            vec![o.send(m.key().cloned(), m.value().copied())]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();

    // Undecodable bytes on a source: the task fails, and keeps failing.
    let mut d = TestDriver::new(&app).unwrap();
    d.append_raw(
        "orders",
        0,
        Some(b"k".to_vec()),
        Some(b"not a long".to_vec()),
        0,
        vec![],
    )
    .unwrap();
    let err = d.run().unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::Task(TaskError::Decode {
                part: Part::Value,
                ..
            })
        ),
        "{err}"
    );
    assert!(d.run().is_err());
    assert!(d.values(&out).unwrap().is_empty());

    // An emission that does not encode fails at the stamping site.
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&orders, "k", 12).unwrap();
    let err = d.pipe(&orders, "k", 13).unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::Task(TaskError::Encode {
                part: Part::Value,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(d.values(&out).unwrap(), vec![12]);

    // A routable decode failure reaches the handler as data instead.
    let raw: Topic<String, Decoded<i64>> =
        Topic::new("raw", Codec::utf8(), Codec::attempting(Codec::int64()));
    let bad = topic("bad");
    let b = bad.clone();
    let stage = Stage::named("router")
        .on(&raw, move |m: &Message<String, Decoded<i64>>| {
            match m.value() {
                Some(Decoded::Malformed { reason, .. }) => {
                    vec![b.send(m.key().cloned(), reason.clone())]
                }
                _ => vec![],
            }
        })
        .sink(&bad)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app2", [stage]).unwrap()).unwrap();
    d.append_raw(
        "raw",
        0,
        Some(b"k".to_vec()),
        Some(b"xyz".to_vec()),
        0,
        vec![],
    )
    .unwrap();
    d.run().unwrap();
    assert_eq!(d.values(&bad).unwrap().len(), 1);
}

#[test]
fn an_emission_to_an_undeclared_sink_fails_at_the_stamping_site() {
    let (c1, elsewhere) = (topic("c1"), topic("elsewhere"));
    let e = elsewhere.clone();
    let stage = Stage::named("leaky")
        .on(&c1, move |m: &Message<String, String>| {
            vec![e.send(m.key().cloned(), value(m))]
        })
        .build()
        .unwrap();
    let mut d = TestDriver::builder(&Parsley::named("app", [stage]).unwrap())
        .partitions("elsewhere", 1)
        .build()
        .unwrap();
    let err = d.pipe(&c1, "k", "v").unwrap_err();
    assert!(
        matches!(&err, DriverError::Task(TaskError::UndeclaredSink { topic, .. }) if topic == "elsewhere"),
        "{err}"
    );
    assert!(d.raw_records("elsewhere").unwrap().is_empty());
}

#[test]
fn corrupt_stamps_fail_the_task() {
    let c1 = topic("c1");
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let err = d
        .pipe_input(&c1, Input::new("k", "v").header("vc", vec![9, 9]))
        .unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::CorruptHeaders { .. })),
        "{err}"
    );
}

/// With the opt-in, a record with a corrupt clock is stepped past: it goes,
/// bytes and headers unchanged, to the dead-letter topic with the reason and
/// its coordinate; the stage goes on (a record on another channel whose
/// clock claims the stepped-past offset is delivered once the channel
/// passes it); the step is in the protocol store, so a restart that meets
/// the record again steps past it again, without a second dead letter for
/// what was committed.
#[test]
fn a_stage_can_step_past_corrupt_stamps_to_a_dead_letter_topic() {
    let (c1, c2, out) = (topic("c1"), topic("c2"), topic("out"));
    let o = out.clone();
    // ANCHOR: step-past-corrupt
    let stage = Stage::named("s")
        .on(&c1, {
            let o = o.clone();
            move |m: &Message<String, String>| vec![o.send(m.key().cloned(), m.value().cloned())]
        })
        .on(&c2, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), m.value().cloned())]
        })
        .sink(&out)
        .dead_letter_corrupt_headers("dead")
        .build()
        .unwrap();
    // ANCHOR_END: step-past-corrupt
    let app = Parsley::named("app", [stage]).unwrap();
    assert!(app.topics().contains(&"dead"));
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&c1, "a", "first").unwrap();
    let bad = d
        .pipe_input(
            &c1,
            Input::new("b", "corrupt")
                .header("vc", vec![9, 9])
                .header("mine", "kept"),
        )
        .unwrap();
    // A cause on c2 that claims c1 up to the stepped-past offset.
    let mut claim = parsley::protocol::VectorClock::new();
    claim.claim_offset(d.channel("c1", 0).unwrap(), bad.offset);
    d.pipe_input(&c2, Input::new("c", "waits").clock(&claim))
        .unwrap();
    d.pipe(&c1, "d", "after").unwrap();
    assert_eq!(d.values(&out).unwrap(), ["first", "waits", "after"]);
    let dead = d.raw_records("dead").unwrap();
    assert_eq!(dead.len(), 1);
    let r = &dead[0];
    assert_eq!(r.value.as_deref(), Some(&b"corrupt"[..]), "bytes unchanged");
    assert_eq!(r.key.as_deref(), Some(&b"b"[..]));
    let header = |n: &str| {
        r.headers
            .iter()
            .find(|h| h.name == n)
            .and_then(|h| h.value.clone())
    };
    assert_eq!(header("vc"), Some(vec![9, 9]), "headers unchanged");
    assert_eq!(header("mine").as_deref(), Some(&b"kept"[..]));
    assert_eq!(header(DEAD_LETTER_TOPIC).as_deref(), Some(&b"c1"[..]));
    assert_eq!(
        header(DEAD_LETTER_OFFSET),
        Some(bad.offset.to_string().into_bytes())
    );
    assert!(
        String::from_utf8(header(DEAD_LETTER_ERROR).unwrap())
            .unwrap()
            .contains("corrupt causal headers")
    );
    let stats = d.task_stats();
    assert_eq!(stats[0].1.stepped_past, 1);
    assert_eq!(d.metrics()[0].records_dead_lettered_total, 1);
    // Restarted from the changelogs: the step is remembered, nothing is
    // delivered or dead-lettered twice.
    d.restart().unwrap();
    assert_eq!(d.values(&out).unwrap().len(), 3);
    assert_eq!(d.raw_records("dead").unwrap().len(), 1);
}

/// An operator's step past (what `parsley skip` writes): a record of the
/// task's state changelog, appended while the application is stopped,
/// makes the restored task send a poison record (here one its logic
/// refuses) to the dead-letter topic instead of failing on it. A step for a
/// channel the task does not consume, or for a task that never ran, is
/// refused before anything is written.
#[test]
fn a_recorded_step_past_lets_a_restored_task_go_on_past_a_poison_record() {
    use parsley::protocol::SteppedPast;
    use parsley::runtime::changelog::{StepError, step_past_record};
    use parsley::runtime::host::ChangelogRecord;
    let (c1, out) = (topic("c1"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(
            &c1,
            move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
                if m.value().map(String::as_str) == Some("poison") {
                    return Err("cannot handle this".into());
                }
                Ok(vec![o.send(m.key().cloned(), m.value().cloned())])
            },
        )
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::builder(&app)
        .partitions("dead", 1)
        .build()
        .unwrap();
    let task = TaskId {
        stage: "s".into(),
        partition: 0,
    };
    let changelog = "app-s-state-changelog";
    let current = |d: &TestDriver| -> Vec<ChangelogRecord> {
        d.raw_records(changelog)
            .unwrap()
            .into_iter()
            .map(|r| ChangelogRecord {
                offset: r.coordinate.offset,
                key: r.key,
                value: r.value,
            })
            .collect()
    };
    let channel = d.channel("c1", 0).unwrap();
    let stepped = SteppedPast {
        dead_letter: "dead".into(),
        reason: "skipped by the operator".into(),
    };
    // A task that never ran (an empty changelog partition).
    assert!(matches!(
        step_past_record(&task, Vec::new(), channel, 1, &stepped),
        Err(StepError::NoScope { .. })
    ));
    d.pipe(&c1, "a", "first").unwrap();
    let poison = d.next_coordinate(&c1, "b").unwrap();
    assert!(d.pipe(&c1, "b", "poison").is_err(), "the logic refuses it");
    let other = d.channel("out", 0).unwrap();
    assert!(matches!(
        step_past_record(&task, current(&d), other, poison.offset, &stepped),
        Err(StepError::NotAnInput { .. })
    ));
    let r = step_past_record(&task, current(&d), channel, poison.offset, &stepped).unwrap();
    d.append_raw(changelog, 0, r.key, r.value, 0, Vec::new())
        .unwrap();
    d.restart().unwrap();
    d.pipe(&c1, "c", "after").unwrap();
    assert_eq!(d.values(&out).unwrap(), ["first", "after"]);
    let dead = d.raw_records("dead").unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value.as_deref(), Some(&b"poison"[..]));
    let reason = dead[0]
        .headers
        .iter()
        .find(|h| h.name == DEAD_LETTER_ERROR)
        .and_then(|h| h.value.clone());
    assert_eq!(reason.as_deref(), Some(&b"skipped by the operator"[..]));
}

/// Without the opt-in the same record fails the task, and nothing is
/// dead-lettered.
#[test]
fn a_stage_without_the_opt_in_fails_on_corrupt_stamps_and_dead_letters_nothing() {
    let c1 = topic("c1");
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    assert!(app.stages()[0].corrupt_headers_dead_letter().is_none());
    let mut d = TestDriver::new(&app).unwrap();
    assert!(
        d.pipe_input(&c1, Input::new("k", "v").header("vc", vec![9, 9]))
            .is_err()
    );
    assert_eq!(d.task_stats()[0].1.stepped_past, 0);
}

// ---------------------------------------------------------------- ticks

#[test]
fn ticks_flow_through_the_tick_topic_and_fold_the_tick_slot() {
    let c1: Topic<String, i64> = Topic::new("c1", Codec::utf8(), Codec::int64());
    let audits = topic("audits");
    let a = audits.clone();
    // ANCHOR: tick-fold
    let stage = Stage::named("policy")
        .state(Codec::int64(), || 0)
        .fold(&c1, |s: i64, m: &Message<String, i64>| {
            Step::to(s + m.value().copied().unwrap_or(0))
        })
        .tick_fold(Duration::from_secs(60), move |quiet: i64, tick: &Tick| {
            if quiet + 1 >= 2 {
                Step::to(0).emit(a.send(None, format!("cut@{}", tick.timestamp())))
            } else {
                Step::to(quiet + 1)
            }
        })
        .sink(&audits)
        .build()
        .unwrap();
    // ANCHOR_END: tick-fold
    let app = Parsley::named("pay", [stage]).unwrap();
    let mut d = TestDriver::builder(&app)
        .partitions("c1", 2)
        .wall_clock(1_000)
        .build()
        .unwrap();
    assert_eq!(
        d.partitions("pay-policy-ticks"),
        Some(2),
        "tick topic matches the widest source"
    );
    d.pipe(&c1, "k", 5).unwrap();
    d.advance_wall_clock(Duration::from_secs(30)).unwrap();
    assert!(
        d.raw_records("pay-policy-ticks").unwrap().is_empty(),
        "not due yet"
    );
    d.advance_wall_clock(Duration::from_secs(30)).unwrap();
    d.advance_wall_clock(Duration::from_secs(60)).unwrap();

    // Tick records: key = the task's partition as a big-endian i32, null
    // value, the wall clock as timestamp, stamped.
    let ticks = d.raw_records("pay-policy-ticks").unwrap();
    assert_eq!(ticks.len(), 4, "two tasks, two ticks each");
    for t in &ticks {
        assert_eq!(
            t.key.as_deref(),
            Some(&t.coordinate.partition.to_be_bytes()[..])
        );
        assert_eq!(t.value, None);
        assert!(t.headers.iter().any(|h| h.name == "vc-sender"));
    }
    assert_eq!(ticks[0].timestamp, 61_000);
    assert_eq!(ticks[2].timestamp, 121_000);

    // Every second tick cuts; the tick slot is separate from key state.
    assert_eq!(d.values(&audits).unwrap(), vec!["cut@121000", "cut@121000"]);
    assert_eq!(d.tick_state::<i64>("policy", 0).unwrap(), Some(0));
    assert_eq!(
        d.fold_state::<i64, _>("policy", &Codec::utf8(), "k")
            .unwrap(),
        Some(5)
    );
    let tick_deliveries = d.deliveries().iter().filter(|x| x.tick).count();
    assert_eq!(tick_deliveries, 4);

    // The tick's stamp claims what the task had delivered.
    let p = partition_for_key(b"k", 2);
    let tick = ticks.iter().find(|t| t.coordinate.partition == p).unwrap();
    let causal = parsley::protocol::CausalHeaders::decode(
        tick.headers.iter().map(|h| (h.name(), h.value.as_deref())),
    )
    .unwrap();
    assert_eq!(causal.clock.offset(d.channel("c1", p).unwrap()), Some(0));
}

// ANCHOR: held-tick
#[test]
fn a_tick_emitted_while_a_record_is_held_is_held_too() {
    let (c1, c2, audits) = (topic("c1"), topic("c2"), topic("audits"));
    let a = audits.clone();
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&c2, |_m: &Message<String, String>| Vec::<Emission>::new())
        .ticks(Duration::from_secs(1), move |t: &Tick| {
            vec![a.send(None, t.timestamp().to_string())]
        })
        .sink(&audits)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "effect").after(&cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(1)).unwrap();
    let held = d.held();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().any(|h| h.coordinate.topic == "app-s-ticks"));
    assert!(d.values(&audits).unwrap().is_empty());
    d.pipe(&c1, "k", "cause").unwrap();
    assert!(d.held().is_empty());
    // The tick waited for the held record's cause, not for the held record
    // itself (it claims what had been delivered, and the record had not):
    // both come after the cause, in either order.
    let order: Vec<String> = d
        .delivered_to("s")
        .iter()
        .map(|c| c.topic.clone())
        .collect();
    assert_eq!(order[0], "c1");
    let mut rest = order[1..].to_vec();
    rest.sort();
    assert_eq!(rest, vec!["app-s-ticks", "c2"]);
    assert!(d.deliveries().iter().filter(|x| x.was_held).count() == 2);
    assert_eq!(d.values(&audits).unwrap(), vec!["1000"]);
}
// ANCHOR_END: held-tick

#[test]
fn hold_diagnostics_report_how_long_a_record_has_been_held() {
    let (c1, c2) = (topic("c1"), topic("c2"));
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&c2, |_m: &Message<String, String>| Vec::<Emission>::new())
        .hold_warning_after(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "x").after(&cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(7)).unwrap();
    let held = d.held();
    assert_eq!(held[0].held_for_ms, 7_000);
    // Past the threshold: warned once, however long the hold lasts.
    let warnings = |d: &TestDriver| {
        d.task_stats()
            .iter()
            .map(|(_, s)| s.hold_warnings)
            .sum::<u64>()
    };
    assert_eq!(warnings(&d), 1);
    d.advance_wall_clock(Duration::from_secs(7)).unwrap();
    assert_eq!(warnings(&d), 1);
    let summary = held[0].summary();
    assert!(summary.contains("vc-hold-not-fetched"), "{summary}");
    assert!(
        summary.contains("c2:0@0") && summary.contains("c1:0 offset 0"),
        "{summary}"
    );
}

// ---------------------------------------------------------------- headers, partitions, density

#[test]
fn held_records_keep_their_headers_across_a_restart() {
    let (c1, c2, out) = (topic("c1"), topic("c2"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&c2, move |m: &Message<String, String>| {
            let h: Vec<String> = m
                .headers()
                .iter()
                .map(|h| {
                    format!(
                        "{}={}",
                        h.name,
                        String::from_utf8_lossy(h.value.as_deref().unwrap_or_default())
                    )
                })
                .collect();
            vec![o.send(
                m.key().cloned(),
                format!("{}@{} {}", value(m), m.coordinate(), h.join(",")),
            )]
        })
        .sink(&out)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(
        &c2,
        Input::new("k", "v")
            .after(&cause)
            .header("a", "1")
            .header("b", "2"),
    )
    .unwrap();
    d.restart().unwrap();
    assert_eq!(d.held().len(), 1, "restored from the store");
    d.pipe(&c1, "k", "cause").unwrap();
    // Its own coordinate (not the trigger's), and its non-Parsley headers.
    assert_eq!(d.values(&out).unwrap(), vec!["v@c2:0@0 a=1,b=2"]);
}

/// A host must report where each consumer resumed after a restart: the
/// node does not persist positions it was told. Here `check` holds `mid@0`
/// (it claims `other@0`, not yet piped) when its consumer moves past the
/// commit marker at `mid@1`; after the restart, a record claiming that
/// marker is released only because the driver reports the resumed position.
/// (The simulator found the same gap in its reference host.)
#[test]
fn a_marker_skipped_while_holding_is_covered_after_a_restart() {
    let (src, mid, other) = (topic("src"), topic("mid"), topic("other"));
    let m2 = mid.clone();
    let fwd = Stage::named("fwd")
        .on(&src, move |m: &Message<String, String>| {
            vec![m2.send(m.key().cloned(), value(m))]
        })
        .sink(&mid)
        .build()
        .unwrap();
    let check = Stage::named("check")
        .on(&mid, |_m: &Message<String, String>| Vec::<Emission>::new())
        .on(&other, |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [fwd, check]).unwrap()).unwrap();
    // fwd's output mid@0 (followed by its commit marker at mid@1) carries
    // the claim on other@0 it folded from src.
    d.pipe_input(
        &src,
        Input::new("k", "s0").after(&Coordinate::new("other", 0, 0)),
    )
    .unwrap();
    assert_eq!(d.held().len(), 1, "check must hold mid@0");
    assert_eq!(d.held()[0].coordinate, Coordinate::new("mid", 0, 0));
    d.restart().unwrap();
    d.pipe(&other, "k", "o0").unwrap();
    assert!(d.held().is_empty());
    // A record claiming the marker at mid@1.
    let last = d
        .pipe_input(
            &other,
            Input::new("k", "o1").after(&Coordinate::new("mid", 0, 1)),
        )
        .unwrap();
    assert!(d.held().is_empty(), "wedged on a marker: {:?}", d.held());
    assert_eq!(d.delivered_to("check").last(), Some(&last));
}

#[test]
fn emissions_land_where_kafkas_default_partitioner_puts_them() {
    let c1 = topic("c1");
    let out = topic("out");
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), value(m)), o.send(None, value(m))]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::builder(&app)
        .partitions("c1", 3)
        .partitions("out", 5)
        .build()
        .unwrap();
    for k in ["a", "b", "c", "order-17", "21"] {
        d.pipe(&c1, k, "v").unwrap();
    }
    let recs = d.records(&out).unwrap();
    for r in &recs {
        match &r.key {
            Some(k) => assert_eq!(r.coordinate.partition, partition_for_key(k.as_bytes(), 5)),
            // Null keys go to the emitting task's partition (mod the count).
            None => assert_eq!(
                Some(r.coordinate.partition),
                r.producer.as_ref().map(|t| t.partition % 5)
            ),
        }
    }
    assert_eq!(recs.len(), 10);
    // Piped records use the same partitioner.
    assert_eq!(
        d.partition_of(&c1, "order-17").unwrap(),
        partition_for_key(b"order-17", 3)
    );
}

#[test]
fn commit_markers_occupy_offsets_and_downstream_bridges_them() {
    let (c1, c2, c3) = (topic("c1"), topic("c2"), topic("c3"));
    let fwd = |name: &str, from: &T, to: &T| {
        let o = to.clone();
        Stage::named(name)
            .on(from, move |m: &Message<String, String>| {
                vec![o.send(m.key().cloned(), value(m))]
            })
            .sink(to)
            .build()
            .unwrap()
    };
    let app = Parsley::named("app", [fwd("p1", &c1, &c2), fwd("p2", &c2, &c3)]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    for i in 0..3 {
        d.pipe(&c1, "k", format!("m{i}")).unwrap();
    }
    // c2: record, marker, record, marker, ...
    assert_eq!(d.markers("c2", 0).unwrap(), 3);
    assert_eq!(d.end_offset("c2", 0).unwrap(), 6);
    let offsets: Vec<i64> = d
        .records(&c2)
        .unwrap()
        .iter()
        .map(|r| r.coordinate.offset)
        .collect();
    assert_eq!(offsets, vec![0, 2, 4]);
    assert_eq!(d.values(&c3).unwrap(), vec!["m0", "m1", "m2"]);
    assert!(d.held().is_empty());
    // A record in p2's output claims the c2 offset it came from, not a marker.
    let last = d.records(&c3).unwrap().pop().unwrap();
    assert_eq!(last.clock().offset(d.channel("c2", 0).unwrap()), Some(4));
}

#[test]
fn tombstones_and_null_keys_pass_through_untouched() {
    let strict = || {
        Codec::try_new(
            |s: &String| {
                if s.is_empty() {
                    Err("empty")
                } else {
                    Ok(s.as_bytes().to_vec())
                }
            },
            |b: &[u8]| {
                if b.is_empty() {
                    Err("empty".to_string())
                } else {
                    Ok(String::from_utf8_lossy(b).into_owned())
                }
            },
        )
    };
    let c1: T = Topic::new("c1", strict(), strict());
    let out: T = Topic::new("out", strict(), strict());
    let o = out.clone();
    let stage = Stage::named("s")
        .state(Codec::int64(), || 0)
        .fold(&c1, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(o.send(m.key().cloned(), m.value().cloned()))
        })
        .sink(&out)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    d.pipe(&c1, "k", None).unwrap();
    d.pipe(&c1, None, "v").unwrap();
    d.pipe(&c1, None, None).unwrap();
    assert_eq!(
        d.key_values(&out).unwrap(),
        vec![
            (Some("k".to_string()), None),
            (None, Some("v".to_string())),
            (None, None)
        ]
    );
    // The null key folds under its own slot.
    assert_eq!(
        d.fold_state::<i64, _>("s", &Codec::utf8(), None).unwrap(),
        Some(2)
    );
    assert_eq!(
        d.fold_state::<i64, _>("s", &Codec::utf8(), "k").unwrap(),
        Some(1)
    );
}

#[test]
fn a_tick_topic_with_the_wrong_partition_count_fails_loudly() {
    let c1 = topic("c1");
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .ticks(Duration::from_secs(1), |_t: &Tick| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let err = TestDriver::builder(&app)
        .partitions("c1", 2)
        .partitions("app-s-ticks", 1)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::PartitionCounts { .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(r#""c1" has 2, "app-s-ticks" has 1"#),
        "{err}"
    );
}

/// A stage whose sources have different partition counts is refused when
/// the driver starts, naming every topic and its count: a task consumes
/// partition p of every source, so related keys would land in different
/// tasks (and a join would silently miss).
#[test]
fn sources_with_different_partition_counts_are_refused() {
    let customers = topic("customers");
    let orders = topic("orders");
    let stage = Stage::named("join")
        .on(&customers, |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .on(&orders, |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let err = TestDriver::builder(&app)
        .partitions("customers", 4)
        .partitions("orders", 2)
        .build()
        .unwrap_err();
    match &err {
        DriverError::Task(TaskError::PartitionCounts { counts, .. }) => assert_eq!(
            counts,
            &vec![("customers".to_owned(), 4), ("orders".to_owned(), 2)]
        ),
        other => panic!("expected PartitionCounts, got {other}"),
    }
}

/// A partition count below one is an error naming the topic, not a
/// silent single partition.
#[test]
fn partition_counts_below_one_are_refused() {
    let c1 = topic("c1");
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    for n in [0, -3] {
        let err = TestDriver::builder(&app)
            .partitions("c1", n)
            .build()
            .unwrap_err();
        match &err {
            DriverError::PartitionCount { topic, partitions } => {
                assert_eq!((topic.as_str(), *partitions), ("c1", n));
            }
            other => panic!("expected PartitionCount, got {other}"),
        }
        assert!(err.to_string().contains("\"c1\""), "{err}");
    }
}

/// A stage with ticks and no sources runs one task per partition of its
/// tick topic: each task ticks on its own partition.
#[test]
fn a_tick_only_stage_runs_a_task_per_tick_partition() {
    let out = topic("out");
    let o = out.clone();
    let stage = Stage::named("beat")
        .ticks(Duration::from_secs(1), move |t: &Tick| {
            vec![o.send(None, format!("{}", t.timestamp()))]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::builder(&app)
        .partitions("app-beat-ticks", 3)
        .build()
        .unwrap();
    d.advance_wall_clock(Duration::from_millis(1500)).unwrap();
    let senders: std::collections::BTreeSet<_> = d
        .raw_records("out")
        .unwrap()
        .iter()
        .filter_map(|r| r.producer.clone())
        .collect();
    assert_eq!(senders.len(), 3, "three tasks ticked: {senders:?}");
}

// ---------------------------------------------------------------- the log holds aborted records

/// A step that emitted and then failed leaves its emission in the log as an
/// aborted record at a real offset, followed by an abort marker. A
/// downstream stage never sees it: `read_committed` skips it and the gate
/// bridges the hole. The retry emits again, committed.
#[test]
fn a_failed_step_leaves_aborted_records_that_the_gate_skips() {
    let (c1, c2, out, out2) = (topic("c1"), topic("c2"), topic("out"), topic("out2"));
    let fail_once = Arc::new(AtomicBool::new(true));
    let o = out.clone();
    let f = fail_once.clone();
    let first = move |m: &Message<String, String>| -> Result<Vec<Emission>, String> {
        if value(m) == "effect" && f.swap(false, Ordering::SeqCst) {
            return Err("transient".into());
        }
        Ok(vec![o.send(m.key().cloned(), value(m))])
    };
    let a = Stage::named("a")
        .on(&c1, first.clone())
        .on(&c2, first)
        .sink(&out)
        .build()
        .unwrap();
    let o2 = out2.clone();
    let b = Stage::named("b")
        .on(&out, move |m: &Message<String, String>| {
            vec![o2.send(m.key().cloned(), format!("seen {}", value(m)))]
        })
        .sink(&out2)
        .build()
        .unwrap();
    let app = Parsley::named("app", [a, b]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    // The effect arrives before its cause and is held; the cause releases
    // it in one step: the cause's emission is made, then the effect fails.
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "effect").after(&cause))
        .unwrap();
    assert_eq!(d.held().len(), 1);
    let err = d.pipe(&c1, "k", "cause").unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::Logic { .. })),
        "{err}"
    );
    assert_eq!(d.aborted_records("out", 0).unwrap(), 1);
    // The retry commits both, after the aborted record and its marker.
    d.run().unwrap();
    assert_eq!(d.values(&out).unwrap(), vec!["cause", "effect"]);
    let offsets: Vec<i64> = d
        .records(&out)
        .unwrap()
        .iter()
        .map(|r| r.coordinate.offset)
        .collect();
    assert_eq!(
        offsets,
        vec![2, 3],
        "offsets 0 and 1: the aborted record and its marker"
    );
    assert_eq!(d.values(&out2).unwrap(), vec!["seen cause", "seen effect"]);
    assert_eq!(
        d.delivered_to("b")
            .iter()
            .map(|c| c.offset)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
}

/// A changelog whose partition count differs from the stage's task count
/// is refused when the task starts, naming both counts.
#[test]
fn a_changelog_with_the_wrong_partition_count_is_refused() {
    let c1 = topic("c1");
    let stage = Stage::named("s")
        .on(&c1, |_m: &Message<String, String>| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let err = TestDriver::builder(&app)
        .partitions("c1", 2)
        .partitions("app-s-state-changelog", 3)
        .build()
        .unwrap_err();
    assert!(matches!(err, DriverError::Worker(_)), "{err}");
    assert!(
        err.to_string()
            .contains("has 3 partition(s) but the stage has 2"),
        "{err}"
    );
}

// ANCHOR: restart
/// A restart restores every task from its changelogs, held records
/// included, and the held record is released when its cause arrives.
#[test]
fn a_restart_restores_held_records_from_the_changelog() {
    let (c1, c2, out) = (topic("c1"), topic("c2"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), value(m))]
        })
        .on(&c2, {
            let o = out.clone();
            move |m: &Message<String, String>| vec![o.send(m.key().cloned(), value(m))]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "effect").after(&cause))
        .unwrap();
    assert_eq!(d.held().len(), 1);
    let changelog = d.raw_records("app-s-state-changelog").unwrap();
    assert!(
        changelog
            .iter()
            .any(|r| r.key.as_deref().is_some_and(|k| k.starts_with(b"q/"))),
        "the held record is in the changelog"
    );
    d.restart().unwrap();
    assert_eq!(d.held().len(), 1, "restored from the changelog");
    d.pipe(&c1, "k", "cause").unwrap();
    assert_eq!(d.values(&out).unwrap(), vec!["cause", "effect"]);
}
// ANCHOR_END: restart

// ---------------------------------------------------------------- the stamping site

/// A codec that panics while encoding an emission fails the step like any
/// other failure of user code: nothing of the step commits (the emission
/// made before the panic ends up aborted), and the retry fails the same way.
#[test]
fn a_panicking_emission_encoder_fails_the_whole_step() {
    let c1 = topic("c1");
    let panicky = Codec::new(
        |s: &String| {
            assert!(s != "boom", "encoder exploded");
            s.as_bytes().to_vec()
        },
        |b: &[u8]| String::from_utf8(b.to_vec()),
    );
    let out: T = Topic::new("out", Codec::utf8(), panicky);
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![
                o.send(m.key().cloned(), "fine"),
                o.send(m.key().cloned(), "boom"),
            ]
        })
        .sink(&out)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let err = d.pipe(&c1, "k", "v").unwrap_err();
    assert!(
        matches!(&err, DriverError::Task(TaskError::Panic { message, .. }) if message.contains("encoder exploded")),
        "{err}"
    );
    assert!(
        d.records(&out).unwrap().is_empty(),
        "nothing half-committed"
    );
    assert_eq!(
        d.aborted_records("out", 0).unwrap(),
        1,
        "'fine' was aborted"
    );
    assert!(d.run().is_err(), "the retry fails the same way");
    assert!(d.records(&out).unwrap().is_empty());
}

/// The sink check is on the declared sink, not its name: an emission
/// minted by another `Topic` value of the same name but other types is
/// refused, and one with the same types but other codecs is encoded with
/// the declared sink's codecs (what every reader of the topic decodes with).
#[test]
fn emissions_are_encoded_with_the_declared_sink() {
    let (c1, out) = (topic("c1"), topic("out"));
    let wrong_types: Topic<String, i64> = Topic::new("out", Codec::utf8(), Codec::int64());
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![wrong_types.send(m.key().cloned(), 7)]
        })
        .sink(&out)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let err = d.pipe(&c1, "k", "v").unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::SinkTypes { .. })),
        "{err}"
    );

    let shouting = Codec::new(
        |s: &String| s.to_uppercase().into_bytes(),
        |b: &[u8]| String::from_utf8(b.to_vec()),
    );
    let other_codecs: T = Topic::new("out", Codec::utf8(), shouting);
    let out2 = topic("out");
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![other_codecs.send(m.key().cloned(), "quiet")]
        })
        .sink(&out2)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    d.pipe(&c1, "k", "v").unwrap();
    assert_eq!(d.values(&out2).unwrap(), vec!["quiet"]);
}

/// Kafka refuses negative timestamps at send time; the stamping site
/// refuses them first, with the coordinate being handled.
#[test]
fn a_negative_emission_timestamp_is_refused() {
    let (c1, out) = (topic("c1"), topic("out"));
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), "v").at(-5)]
        })
        .sink(&out)
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
    let err = d.pipe(&c1, "k", "v").unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::Task(TaskError::NegativeTimestamp { timestamp: -5, .. })
        ),
        "{err}"
    );
}
