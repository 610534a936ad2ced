//! Sink handles, headers on emissions and the dead-letter helper, run
//! through the TestDriver.

use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A handle from `add_sink` declares the sink and emits through it; one
/// `Copy` handle serves two closures without a clone.
#[test]
fn a_sink_handle_declares_its_sink_and_is_shared_by_copy() {
    let (a, b, out) = (topic("a"), topic("b"), topic("out"));
    let mut builder = Stage::named("s");
    let sink = builder.add_sink(&out);
    let stage = builder
        .on(&a, move |m| vec![sink.send(m.key().cloned(), "from a")])
        .on(&b, move |m| vec![sink.send(m.key().cloned(), "from b")])
        .build()
        .unwrap();
    assert_eq!(stage.sink_topics(), vec!["out"]);
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&a, "k", "x").unwrap();
    d.pipe(&b, "k", "y").unwrap();
    let values: Vec<String> = d
        .records(&out)
        .unwrap()
        .into_iter()
        .filter_map(|r| r.value)
        .collect();
    assert_eq!(values, vec!["from a", "from b"]);
}

/// Headers set on an emission arrive on the record, after the causal
/// stamp; setting a causal header fails the task with a typed error and
/// commits nothing of the step.
#[test]
fn emissions_carry_headers_and_causal_ones_are_reserved() {
    let (a, out) = (topic("a"), topic("out"));
    let mut builder = Stage::named("s");
    let sink = builder.add_sink(&out);
    let stage = builder
        .on(&a, move |m| {
            let e = sink.send(m.key().cloned(), "v").with_header("origin", "s");
            if m.value().map(String::as_str) == Some("forge") {
                vec![sink.send(None, "first"), e.with_header("vc-seq", "7")]
            } else {
                vec![e]
            }
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&a, "k", "ok").unwrap();
    let records = d.records(&out).unwrap();
    assert_eq!(records.len(), 1);
    let names: Vec<&str> = records[0].headers.iter().map(|h| h.name()).collect();
    assert_eq!(names, vec!["vc", "vc-sender", "vc-seq", "origin"]);
    assert!(records[0].causal().is_ok());

    let err = d.pipe(&a, "k", "forge").unwrap_err();
    match &err {
        DriverError::Task(TaskError::ReservedHeader { header, topic, .. }) => {
            assert_eq!((header.as_str(), topic.as_str()), ("vc-seq", "out"));
        }
        other => panic!("expected ReservedHeader, got {other}"),
    }
    assert_eq!(
        d.records(&out).unwrap().len(),
        1,
        "nothing of the failed step was committed, the emission before the bad one included"
    );
}

/// The dead-letter helper: a malformed record goes to the dead-letter
/// topic with the error and its source coordinate in headers.
#[test]
fn a_dead_letter_carries_the_error_and_the_source_coordinate() {
    let raw: Topic<String, Decoded<i64>> =
        Topic::new("amounts", Codec::utf8(), Codec::attempting(Codec::int64()));
    let (totals, dead): (Topic<String, i64>, Topic<String, Vec<u8>>) = (
        Topic::new("totals", Codec::utf8(), Codec::int64()),
        Topic::new("amounts-dlq", Codec::utf8(), Codec::bytes()),
    );
    let mut builder = Stage::named("sum").state(Codec::int64(), || 0);
    let (total, dlq) = (builder.add_sink(&totals), builder.add_sink(&dead));
    let stage = builder
        .fold(&raw, move |sum, m| match m.value() {
            Some(Decoded::Ok(v)) => Step::to(sum + v).emit(total.send(m.key().cloned(), sum + v)),
            Some(Decoded::Malformed { raw, reason }) => Step::keep().emit(
                dlq.send(m.key().cloned(), raw.clone())
                    .dead_letter(m, reason),
            ),
            None => Step::keep(),
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&raw, "k", Decoded::Ok(5)).unwrap();
    let now = d.wall_clock();
    d.append_raw(
        "amounts",
        0,
        Some(b"k".to_vec()),
        Some(b"five".to_vec()),
        now,
        Vec::new(),
    )
    .unwrap();
    d.run().unwrap();
    d.pipe(&raw, "k", Decoded::Ok(2)).unwrap();
    let sums: Vec<i64> = d
        .records(&totals)
        .unwrap()
        .into_iter()
        .filter_map(|r| r.value)
        .collect();
    assert_eq!(sums, vec![5, 7]);
    let dead_letters = d.records(&dead).unwrap();
    assert_eq!(dead_letters.len(), 1);
    let r = &dead_letters[0];
    assert_eq!(r.value.as_deref(), Some(&b"five"[..]));
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.clone())
            .map(|v| String::from_utf8(v).unwrap())
    };
    assert_eq!(header(DEAD_LETTER_TOPIC).as_deref(), Some("amounts"));
    assert_eq!(header(DEAD_LETTER_PARTITION).as_deref(), Some("0"));
    assert_eq!(header(DEAD_LETTER_OFFSET).as_deref(), Some("1"));
    assert!(header(DEAD_LETTER_ERROR).is_some_and(|e| !e.is_empty()));
}

/// A handle's emission equals the one its topic mints, so expected outputs
/// can be written either way.
#[test]
fn handle_and_topic_emissions_compare_equal() {
    let out = topic("out");
    let mut builder = Stage::named("s");
    let sink = builder.add_sink(&out);
    assert_eq!(sink.send("k", "v"), out.send("k", "v"));
    assert_ne!(
        sink.send("k", "v"),
        out.send("k", "v").with_header("h", "1")
    );
    assert_eq!(sink.name(), "out");
}

/// Tick logic reads every key's state through the view (`get` and `iter`,
/// the null key first); a key the view's codec cannot decode fails the
/// task with a state codec error instead of being skipped.
#[test]
fn tick_logic_reads_keyed_state_and_fails_on_an_undecodable_key() {
    use std::time::Duration;
    let orders: Topic<Vec<u8>, i64> = Topic::new("orders", Codec::bytes(), Codec::int64());
    let summaries = topic("summaries");
    let mut builder = Stage::named("counts").state(Codec::int64(), || 0);
    let summary = builder.add_sink(&summaries);
    let stage = builder
        .fold(&orders, |n, m| {
            Step::to(n + m.value().copied().unwrap_or(0))
        })
        .tick_fold_over(
            Duration::from_secs(10),
            Codec::utf8(),
            move |t, _tick, view| {
                let all: Vec<String> = view
                    .iter()
                    .map(|(k, n)| format!("{}={n}", k.unwrap_or_else(|| "-".into())))
                    .collect();
                let bob = view.get(&"bob".to_string());
                Step::to(t + 1).emit(summary.send(
                    None,
                    format!(
                        "{} | bob {bob:?} | null {:?}",
                        all.join(" "),
                        view.get_null()
                    ),
                ))
            },
        )
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&orders, b"bob".to_vec(), 2).unwrap();
    d.pipe(&orders, None, 4).unwrap();
    d.pipe(&orders, b"al".to_vec(), 1).unwrap();
    d.advance_wall_clock(Duration::from_secs(10)).unwrap();
    assert_eq!(
        d.values(&summaries).unwrap(),
        vec!["-=4 al=1 bob=2 | bob Some(2) | null Some(4)".to_string()]
    );
    // A key that is not UTF-8: the tick fails the task, loudly.
    d.pipe(&orders, vec![0xff, 0xfe], 1).unwrap();
    let err = d.advance_wall_clock(Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(err, DriverError::Task(TaskError::StateCodec { .. })),
        "{err}"
    );
    assert_eq!(d.values(&summaries).unwrap().len(), 1, "nothing committed");
}

/// The `vc` of each record a pipeline wrote to `out` and to `last`, and
/// the values on `last`: a stage `fan` reads `a` and writes `out` (with
/// compact clocks or not), a stage `tail` reads `out` (so it decodes and
/// gates on those clocks) and writes `last`.
fn pipeline(compact: bool) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<String>) {
    let (a, out, last) = (topic("a"), topic("out"), topic("last"));
    let copy = out.clone();
    let fan = Stage::named("fan").on(&a, move |m: &Message<String, String>| {
        vec![copy.send(m.key().cloned(), m.value().cloned())]
    });
    let fan = if compact {
        // ANCHOR: compact_clock
        fan.sink(&out) // declared as usual
            .compact_clock(&out) // its outputs' vc in version 2
            .build()
            .unwrap()
        // ANCHOR_END: compact_clock
    } else {
        fan.sink(&out).build().unwrap()
    };
    assert_eq!(fan.writes_compact_clock("out"), compact);
    let mut tail = Stage::named("tail");
    let to_last = tail.add_sink(&last);
    let tail = tail
        .on(&out, move |m| {
            vec![to_last.send(m.key().cloned(), m.value().cloned())]
        })
        .build()
        .unwrap();
    let app = Parsley::named("app", [fan, tail]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    for (k, v) in [("k1", "one"), ("k2", "two"), ("k1", "three")] {
        d.pipe(&a, k, v).unwrap();
    }
    let vc = |t: &T, d: &TestDriver| -> Vec<Vec<u8>> {
        d.records(t)
            .unwrap()
            .into_iter()
            .map(|r| {
                r.headers
                    .iter()
                    .find(|h| h.name() == "vc")
                    .and_then(|h| h.value.clone())
                    .expect("a stamped record")
            })
            .collect()
    };
    let values = d
        .records(&last)
        .unwrap()
        .into_iter()
        .filter_map(|r| r.value)
        .collect();
    (vc(&out, &d), vc(&last, &d), values)
}

/// A sink with compact clocks gets version 2 `vc` headers that say what the
/// version 1 ones say, a stage downstream reads them, and its own sink
/// (left at the default) stays at version 1.
#[test]
fn compact_clock_sinks_carry_version_2_and_are_read_downstream() {
    let (v1_out, v1_last, v1_values) = pipeline(false);
    let (v2_out, v2_last, v2_values) = pipeline(true);
    assert_eq!(v1_out.len(), 3);
    assert!(v1_out.iter().all(|vc| vc[0] == 1));
    assert!(v2_out.iter().all(|vc| vc[0] == 2), "{v2_out:02x?}");
    for (one, two) in v1_out.iter().zip(&v2_out) {
        assert_eq!(
            protocol::VectorClock::decode(one).unwrap(),
            protocol::VectorClock::decode(two).unwrap()
        );
        assert!(two.len() < one.len());
    }
    // Downstream delivered the same records, stamped the same way.
    assert_eq!(v2_values, v1_values);
    assert_eq!(v2_values, vec!["one", "two", "three"]);
    assert_eq!(v2_last, v1_last);
    assert!(v2_last.iter().all(|vc| vc[0] == 1));
}

#[test]
fn compact_clocks_on_a_topic_that_is_not_a_sink_are_refused() {
    let (a, out, other) = (topic("a"), topic("out"), topic("other"));
    let err = Stage::named("s")
        .on(&a, |_m: &Message<String, String>| Vec::<Emission>::new())
        .sink(&out)
        .compact_clock(&other)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        StageError::CompactClockNotASink {
            stage: "s".into(),
            topic: "other".into(),
        }
    );
    assert!(err.to_string().contains(".sink(..)"), "{err}");
}
