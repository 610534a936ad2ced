//! A causal query that claims a record upstream of the queried stage (on
//! a topic it reaches only through other stages) is refused, never
//! answered without it; claims on topics no chain of stages leads from
//! are not the stage's causes.

use parsley::*;

type T = Topic<String, i64>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::int64())
}

/// orders -> relay -> mid -> double -> mid2 -> total (a fold); total writes
/// totals.
fn app() -> (Parsley, StateStore<String, i64>) {
    let (orders, mid, mid2, totals) = (
        topic("orders"),
        topic("mid"),
        topic("mid2"),
        topic("totals"),
    );
    let mut relay = Stage::named("relay");
    let to_mid = relay.add_sink(&mid);
    let relay = relay
        .on(&orders, move |m: &Message<String, i64>| {
            vec![to_mid.send(m.key().cloned(), m.value().copied())]
        })
        .build()
        .unwrap();
    let mut double = Stage::named("double");
    let to_mid2 = double.add_sink(&mid2);
    let double = double
        .on(&mid, move |m: &Message<String, i64>| {
            vec![to_mid2.send(m.key().cloned(), m.value().map(|v| v * 2))]
        })
        .build()
        .unwrap();
    let total = Stage::named("total").state(Codec::int64(), || 0);
    let store = total.store(Codec::utf8());
    let mut total = total;
    let out = total.add_sink(&totals);
    let total = total
        .fold(&mid2, move |t: i64, m: &Message<String, i64>| {
            let t = t + m.value().copied().unwrap_or(0);
            Step::to(t).emit(out.send(m.key().cloned(), t))
        })
        .build()
        .unwrap();
    (
        Parsley::named("chain", [relay, double, total]).unwrap(),
        store,
    )
}

#[test]
fn the_topics_upstream_of_a_stage_are_found_through_the_chain() {
    let (app, _) = app();
    let up = app.upstream_topics("total");
    assert_eq!(
        up.into_iter().collect::<Vec<_>>(),
        [
            ("mid".to_owned(), vec!["double".to_owned()]),
            ("orders".to_owned(), vec!["relay".to_owned()]),
        ]
    );
    assert!(app.upstream_topics("relay").is_empty());
    assert!(app.upstream_topics("nothing").is_empty());
}

#[test]
fn a_causal_query_claiming_an_upstream_record_is_refused_not_answered() {
    let (app, store) = app();
    let mut d = TestDriver::new(&app).unwrap();
    let order = d.pipe(&topic("orders"), "acct", 5).unwrap();
    d.run().unwrap();
    // The state does include the order by now; the query is refused all
    // the same, because on a cluster nothing could tell when it does.
    match d.state_after(&store, "acct", std::slice::from_ref(&order)) {
        Err(DriverError::UpstreamCause { stage, cause, via }) => {
            assert_eq!(stage, "total");
            assert_eq!(cause, order);
            assert_eq!(via, ["relay"]);
        }
        other => panic!("{other:?}"),
    }
    // Claiming the record the stage consumes answers, with it.
    let consumed = d.records(&topic("mid2")).unwrap()[0].coordinate.clone();
    assert_eq!(
        d.state_after(&store, "acct", std::slice::from_ref(&consumed))
            .unwrap(),
        Some(10)
    );
    // A claim on a topic no chain leads from (the stage's own output) is
    // not a cause of its state, and does not stand in the way.
    let written = d.records(&topic("totals")).unwrap()[0].coordinate.clone();
    assert_eq!(
        d.state_after(&store, "acct", &[consumed, written]).unwrap(),
        Some(10)
    );
}
