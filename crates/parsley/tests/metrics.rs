//! Task metrics through the `metrics` facade: a recording stub recorder
//! sees the hold gauges move as a record is held and released, the
//! counters move at their events, and every series carries its labels.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use parsley::runtime::metrics::*;
use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// Every series' value at one moment. The stub's snapshot reports counters
/// as their increase since the previous snapshot, so take one per check.
type Series = Vec<(String, Vec<(String, String)>, f64)>;

fn read(snap: &Snapshotter) -> Series {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, v)| {
            let k = key.key();
            let labels = k
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let v = match v {
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Counter(c) => c as f64,
                DebugValue::Histogram(_) => f64::NAN,
            };
            (k.name().to_owned(), labels, v)
        })
        .collect()
}

/// The value of `name` for the series whose labels include `labels` (and
/// no `topic` label unless one is asked for).
fn value(series: &Series, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wants_topic = labels.iter().any(|(n, _)| *n == "topic");
    series.iter().find_map(|(n, ls, v)| {
        let has = |k: &str, val: &str| ls.iter().any(|(a, b)| a == k && b == val);
        let ok = n == name
            && labels.iter().all(|(k, val)| has(k, val))
            && (wants_topic || !ls.iter().any(|(a, _)| a == "topic"));
        ok.then_some(*v)
    })
}

#[test]
fn hold_gauges_and_counters_move_with_the_records() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let (a, c, out) = (topic("a"), topic("c"), topic("out"));
        let mut builder = Stage::named("s");
        let sink = builder.add_sink(&out);
        let stage = builder
            .on(&a, move |m| vec![sink.send(m.key().cloned(), "seen")])
            .on(&c, |_m| Vec::<Emission>::new())
            .ticks(Duration::from_secs(60), |_t| Vec::<Emission>::new())
            .build()
            .unwrap();
        let app = Parsley::named("app", [stage]).unwrap();
        let mut d = TestDriver::new(&app).unwrap();
        let task = [("task-id", "s[0]"), ("stage", "s"), ("thread-id", "0")];

        // ANCHOR: held-metrics
        // A record of `a` waits on c@0.
        let cause = d.next_coordinate(&c, "k").unwrap();
        d.pipe_input(&a, Input::new("k", "effect").after(&cause))
            .unwrap();
        d.advance_wall_clock(Duration::from_secs(2)).unwrap();
        let m = d.metrics();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].records_held, 1);
        assert_eq!(m[0].records_held_age_max_ms, 2_000);
        // ANCHOR_END: held-metrics
        // Every series is described to the recorder (unit and help text,
        // which the Prometheus exporter prints as `# HELP`).
        let described = snap.snapshot().into_vec();
        for name in [
            RECORDS_HELD,
            RECORDS_HELD_AGE_MAX_MS,
            RECORDS_DELIVERED_TOTAL,
        ] {
            let (_, unit, help, _) = described
                .iter()
                .find(|(k, ..)| k.key().name() == name)
                .unwrap_or_else(|| panic!("no series {name}"));
            assert!(unit.is_some(), "{name} has no unit");
            assert!(
                help.as_ref().is_some_and(|h| !h.is_empty()),
                "{name} has no help text"
            );
        }
        // The stub's snapshot drains what it reports: sample again.
        d.metrics();
        let now = read(&snap);
        assert_eq!(value(&now, RECORDS_HELD, &task), Some(1.0));
        assert_eq!(value(&now, RECORDS_HELD_AGE_MAX_MS, &task), Some(2_000.0));
        let on_a = [("task-id", "s[0]"), ("topic", "a")];
        let on_c = [("task-id", "s[0]"), ("topic", "c")];
        assert_eq!(value(&now, RECORDS_HELD, &on_a), Some(1.0));
        assert_eq!(value(&now, RECORDS_HELD, &on_c), Some(0.0));

        // The cause arrives: both are delivered and nothing is held.
        d.pipe(&c, "k", "cause").unwrap();
        let m = d.metrics();
        assert_eq!(m[0].records_held, 0);
        assert_eq!(m[0].records_held_age_max_ms, 0);
        assert_eq!(m[0].records_delivered_total, 2);
        let now = read(&snap);
        assert_eq!(value(&now, RECORDS_HELD, &task), Some(0.0));
        assert_eq!(value(&now, RECORDS_DELIVERED_TOTAL, &task), Some(2.0));
        assert_eq!(value(&now, RECORDS_HELD, &on_a), Some(0.0));

        // A tick: emitted, counted, and delivered back through the gate.
        d.advance_wall_clock(Duration::from_secs(60)).unwrap();
        let m = d.metrics();
        assert_eq!(m[0].ticks_emitted_total, 1);
        let now = read(&snap);
        assert_eq!(value(&now, TICKS_EMITTED_TOTAL, &task), Some(1.0));
        // The stub reports a counter's increase since its last snapshot.
        assert_eq!(value(&now, RECORDS_DELIVERED_TOTAL, &task), Some(1.0));
        assert_eq!(m[0].records_delivered_total, 3);
        // Stamps claim what was delivered.
        assert!(m[0].stamp_offset_entries >= 2, "{m:?}");
    });
}
