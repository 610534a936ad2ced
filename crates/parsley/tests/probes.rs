//! Contract probes: a sound application passes with notes, and each kind
//! of violation is reported, all at once, under its own probe.

use std::time::Duration;

use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

// ANCHOR: sound
#[test]
fn a_sound_application_passes_with_notes() {
    let (orders, payments, settled, audits) = (
        topic("orders"),
        topic("payments"),
        topic("settled"),
        topic("audits"),
    );
    let s = settled.clone();
    let a = audits.clone();
    let stage = Stage::named("settlement")
        .state(Codec::int64(), || 0)
        .fold(&orders, move |n: i64, m: &Message<String, String>| {
            Step::to(n + 1).emit(s.send(m.key().cloned(), m.value().cloned()))
        })
        .fold(&payments, |n: i64, _m: &Message<String, String>| {
            Step::to(n)
        })
        .tick_fold(Duration::from_secs(60), move |n: i64, t: &Tick| {
            Step::to(n + 1).emit(a.send(None, t.timestamp().to_string()))
        })
        .sink(&settled)
        .sink(&audits)
        .build()
        .unwrap();
    let app = Parsley::named("shop", [stage]).unwrap();
    let report = probe(&app, &Samples::new().on(&orders, "o-1", "x"));
    report.assert_ok();
    let kinds: Vec<NoteKind> = report.notes.iter().map(|n| n.kind).collect();
    assert!(kinds.contains(&NoteKind::UnsampledSource), "{report}");
    assert!(kinds.contains(&NoteKind::TickTopic), "{report}");
    assert!(kinds.contains(&NoteKind::StoreNames), "{report}");
    assert!(report.notes.iter().any(|n| n.text.contains("\"payments\"")));
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.text.contains("shop-settlement-ticks"))
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.text.contains("shop-settlement-fold-changelog"))
    );
    // The tick reached the audit sink, so it is not noted as unreached.
    assert!(
        !report
            .notes
            .iter()
            .any(|n| n.kind == NoteKind::UnreachedSink),
        "{report}"
    );
}
// ANCHOR_END: sound

#[test]
fn every_violation_is_reported_at_once() {
    let (c1, c2, c3, undeclared, out, nobody) = (
        topic("c1"),
        topic("c2"),
        topic("c3"),
        topic("undeclared"),
        topic("out"),
        topic("nobody"),
    );
    // A key codec that is not canonical: decode-then-encode changes bytes.
    let lossy: T = Topic::new(
        "c4",
        Codec::new(
            |s: &String| s.as_bytes().to_vec(),
            |b: &[u8]| Ok::<_, CodecError>(String::from_utf8_lossy(b).to_uppercase()),
        ),
        Codec::utf8(),
    );
    // An output codec that cannot read what it writes.
    let broken: T = Topic::new(
        "broken",
        Codec::utf8(),
        Codec::new(
            |s: &String| s.as_bytes().to_vec(),
            |_b: &[u8]| Err::<String, _>("unreadable"),
        ),
    );
    let u = undeclared.clone();
    let b = broken.clone();
    let o = out.clone();
    let leaky = Stage::named("leaky")
        .on(&c1, move |m: &Message<String, String>| {
            vec![u.send(m.key().cloned(), "x")]
        })
        .on(
            &c2,
            |_m: &Message<String, String>| -> Result<Vec<Emission>, String> {
                Err("cannot handle".into())
            },
        )
        .on(&c3, move |m: &Message<String, String>| {
            vec![b.send(m.key().cloned(), "y")]
        })
        .on(&lossy, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), "z")]
        })
        .sink(&broken)
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [leaky]).unwrap();
    let samples = Samples::new()
        .on(&c1, "k", "v")
        .on(&c2, "k", "v")
        .on(&c3, "k", "v")
        .on(&lossy, "key", "v")
        .on(&nobody, "k", "v");
    let report = probe(&app, &samples);
    assert!(!report.passed());
    for p in [
        Probe::DeclaredSinks,
        Probe::Logic,
        Probe::SinkDecode,
        Probe::KeyCodec,
        Probe::Samples,
    ] {
        let found = report.findings_of(p);
        assert_eq!(found.len(), 1, "{p}: {report}");
        assert_eq!(found[0].clause, p.clause());
    }
    assert!(report.findings_of(Probe::Stamps).is_empty());
    assert!(
        report.findings_of(Probe::DeclaredSinks)[0]
            .observed
            .contains("undeclared")
    );
    assert!(
        report.findings_of(Probe::Samples)[0]
            .observed
            .contains("nobody")
    );
    let failure = report.clone().into_result().unwrap_err();
    assert!(failure.to_string().contains("[declared-sinks]"));
    let panic = std::panic::catch_unwind(|| report.assert_ok()).unwrap_err();
    let text = panic.downcast_ref::<String>().unwrap();
    assert!(
        text.contains("[logic]") && text.contains("[key-codec]"),
        "{text}"
    );
}

/// A sink codec that panics while encoding is reported as a finding of the
/// sample that reached it, not a panic out of `probe`.
#[test]
fn a_panicking_sink_codec_is_a_finding() {
    let c1 = topic("c1");
    let panicky = Codec::new(
        |_: &String| -> Vec<u8> { panic!("encoder exploded") },
        |b: &[u8]| String::from_utf8(b.to_vec()),
    );
    let out: T = Topic::new("out", Codec::utf8(), panicky);
    let o = out.clone();
    let stage = Stage::named("s")
        .on(&c1, move |m: &Message<String, String>| {
            vec![o.send(m.key().cloned(), "x")]
        })
        .sink(&out)
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let report = probe(&app, &Samples::new().on(&c1, "k", "v"));
    assert!(!report.findings.is_empty(), "{report}");
    assert!(report.to_string().contains("encoder exploded"), "{report}");
}

// ANCHOR: co-partitioning
/// The co-partitioning probe: with the cluster's partition counts given,
/// a stage whose sources disagree is reported, naming each count.
#[test]
fn sources_with_different_partition_counts_are_a_finding() {
    let (customers, orders) = (topic("customers"), topic("orders"));
    let stage = Stage::named("join")
        .state(Codec::int64(), || 0)
        .fold(&customers, |n: i64, _m: &Message<String, String>| {
            Step::to(n + 1)
        })
        .fold(&orders, |n: i64, _m: &Message<String, String>| {
            Step::to(n + 1)
        })
        .build()
        .unwrap();
    let app = Parsley::named("shop", [stage]).unwrap();
    let samples = || Samples::new().on(&orders, "c-1", "o");
    let report = probe(
        &app,
        &samples().partitions("customers", 4).partitions("orders", 2),
    );
    let found = report.findings_of(Probe::CoPartitioning);
    assert_eq!(found.len(), 1, "{report}");
    assert!(
        found[0]
            .observed
            .contains(r#""customers" has 4, "orders" has 2"#),
        "{report}"
    );
    let report = probe(&app, &samples().partitions("orders", 0));
    assert_eq!(
        report.findings_of(Probe::CoPartitioning).len(),
        1,
        "{report}"
    );
    probe(
        &app,
        &samples().partitions("customers", 4).partitions("orders", 4),
    )
    .assert_ok();
}
// ANCHOR_END: co-partitioning
