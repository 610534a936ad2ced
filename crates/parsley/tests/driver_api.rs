//! The TestDriver's reading side: output cursors, typed state handles, and
//! clocks shown with topic names.

use parsley::*;

fn topics() -> (Topic<String, i64>, Topic<String, i64>, Topic<String, i64>) {
    (
        Topic::new("orders", Codec::utf8(), Codec::int64()),
        Topic::new("payments", Codec::utf8(), Codec::int64()),
        Topic::new("balances", Codec::utf8(), Codec::int64()),
    )
}

// ANCHOR: app
fn app() -> (Parsley, StateStore<String, i64>) {
    let (orders, payments, balances) = topics();
    let mut builder = Stage::named("ledger").state(Codec::int64(), || 0);
    let out = builder.add_sink(&balances);
    let store = builder.store(Codec::utf8());
    let stage = builder
        .fold(&orders, move |b, m| {
            let next = b - m.value().copied().unwrap_or(0);
            Step::to(next).emit(out.send(m.key().cloned(), next))
        })
        .fold(&payments, move |b, m| {
            let next = b + m.value().copied().unwrap_or(0);
            Step::to(next).emit(out.send(m.key().cloned(), next))
        })
        .build()
        .unwrap();
    (Parsley::named("bank", [stage]).unwrap(), store)
}
// ANCHOR_END: app

// ANCHOR: cursors
/// Cursors hand out each committed record once, in order; `is_empty` says
/// when everything was read; the full history stays available.
#[test]
fn output_cursors_read_each_record_once() {
    let (orders, payments, balances) = topics();
    let (app, _) = app();
    let mut d = TestDriver::new(&app).unwrap();
    assert!(d.is_empty(&balances).unwrap());
    d.pipe(&payments, "a", 10).unwrap();
    d.pipe(&orders, "a", 3).unwrap();
    assert!(!d.is_empty(&balances).unwrap());
    assert_eq!(d.read_value(&balances).unwrap(), Some(Some(10)));
    assert_eq!(
        d.read_key_value(&balances).unwrap(),
        Some((Some("a".to_string()), Some(7)))
    );
    assert_eq!(d.read_value(&balances).unwrap(), None);
    assert!(d.is_empty(&balances).unwrap());
    d.pipe(&payments, "b", 1).unwrap();
    d.pipe(&payments, "a", 1).unwrap();
    let rest = d.read_all(&balances).unwrap();
    let keys: Vec<_> = rest.iter().map(|r| r.key.clone().unwrap()).collect();
    assert_eq!(keys, vec!["b", "a"]);
    assert!(d.read_values(&balances).unwrap().is_empty());
    assert_eq!(d.values(&balances).unwrap(), vec![10, 7, 1, 8], "history");
    // Cursors are per topic.
    assert_eq!(d.read_value(&payments).unwrap(), Some(Some(10)));
}
// ANCHOR_END: cursors

// ANCHOR: state-handle
/// The state handle reads state typed, without the stage name or the key
/// codec at the call site.
#[test]
fn a_state_handle_reads_typed_state() {
    let (orders, payments, _) = topics();
    let (app, store) = app();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&payments, "a", 10).unwrap();
    d.pipe(&orders, "a", 4).unwrap();
    assert_eq!(d.state(&store, "a").unwrap(), Some(6));
    assert_eq!(d.state(&store, "nobody").unwrap(), None);
    assert_eq!(store.stage(), "ledger");
}
// ANCHOR_END: state-handle

/// A record's clock shows topic names and producing tasks, not ids.
#[test]
fn clocks_are_described_with_topic_and_task_names() {
    let (orders, payments, balances) = topics();
    let (app, _) = app();
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&payments, "a", 10).unwrap();
    d.pipe(&orders, "a", 4).unwrap();
    let records = d.records(&balances).unwrap();
    let last = records.last().unwrap();
    let text = last.describe_clock();
    assert!(text.contains("orders:0 <= 0"), "{text}");
    assert!(text.contains("payments:0 <= 0"), "{text}");
    let debug = format!("{last:?}");
    assert!(debug.contains("orders:0 <= 0"), "{debug}");
    let orders_id = d.channel("orders", 0).unwrap().topic.to_string();
    assert!(!debug.contains(&orders_id), "no topic ids: {debug}");
    let piped = &d.records(&payments).unwrap()[0];
    assert_eq!(piped.describe_clock(), "unstamped");
    assert_eq!(d.describe(&last.clock()), text);
}

/// A codec failure reads once: walking the error chain (as `anyhow`'s
/// `{:#}` or an `eyre` report do) does not repeat the codec's message.
#[test]
fn a_codec_error_chain_says_each_thing_once() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Profile {
        name: String,
    }
    let profiles: Topic<String, Profile> = Topic::new("profiles", Codec::utf8(), Codec::json());
    let stage = Stage::named("s")
        .on(&profiles, |_m| Vec::<Emission>::new())
        .build()
        .unwrap();
    let app = Parsley::named("app", [stage]).unwrap();
    let mut d = TestDriver::new(&app).unwrap();
    let now = d.wall_clock();
    d.append_raw(
        "profiles",
        0,
        None,
        Some(b"{oops".to_vec()),
        now,
        Vec::new(),
    )
    .unwrap();
    let err = d.run().unwrap_err();
    let mut chain = vec![err.to_string()];
    let mut next = std::error::Error::source(&err);
    while let Some(e) = next {
        chain.push(e.to_string());
        next = e.source();
    }
    let report = chain.join(": ");
    let serde_message = serde_json::from_slice::<Profile>(b"{oops")
        .unwrap_err()
        .to_string();
    assert_eq!(
        report.matches(&serde_message).count(),
        1,
        "said once: {report}"
    );
}
