//! Each topology shape of the guide, with the ordering it promises and,
//! where the guide says so, the ordering it does not promise.
//!
//! Arrival order is controlled in two ways: by piping an effect before its
//! cause into one driver, and by copying one application's log into a
//! second application's driver in an adversarial order
//! ([`TestDriver::append_from`]), the way a second application sharing the
//! cluster could fetch it. Every test checks that the interesting state
//! (a hold) actually happened.

use parsley::protocol::Channel;
use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// A stage forwarding `from` to `to`, appending `tag` to the value.
fn forward(name: &str, from: &T, to: &T, tag: &'static str) -> Stage {
    let out = to.clone();
    Stage::named(name)
        .on(from, move |m: &Message<String, String>| {
            vec![out.send(m.key().cloned(), format!("{}{tag}", value(m)))]
        })
        .sink(to)
        .build()
        .unwrap()
}

fn value(m: &Message<String, String>) -> String {
    m.value().cloned().unwrap_or_default()
}

/// A stateless observer consuming `sources`, emitting nothing.
fn observer(name: &str, sources: &[&T]) -> Stage {
    let mut b = Stage::named(name);
    for s in sources {
        b = b.on(*s, |_m: &Message<String, String>| Vec::<Emission>::new());
    }
    b.build().unwrap()
}

fn coords(d: &TestDriver, stage: &str) -> Vec<String> {
    d.delivered_to(stage)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn held_deliveries(d: &TestDriver, stage: &str) -> Vec<String> {
    d.deliveries()
        .iter()
        .filter(|x| x.task.stage == stage && x.was_held)
        .map(|x| x.coordinate.to_string())
        .collect()
}

fn channel(d: &TestDriver, t: &str) -> Channel {
    d.channel(t, 0).unwrap()
}

// ---------------------------------------------------------------- linear

#[test]
fn linear_claims_carry_across_hops_and_gate_a_reconciler() {
    let (c1, c2, c3) = (topic("c1"), topic("c2"), topic("c3"));
    let pipeline = Parsley::named(
        "pipeline",
        [
            forward("p1", &c1, &c2, "+p1"),
            forward("p2", &c2, &c3, "+p2"),
        ],
    )
    .unwrap();
    let mut a = TestDriver::new(&pipeline).unwrap();
    let m1 = a.pipe(&c1, "k", "m1").unwrap();
    assert_eq!(a.values(&c3).unwrap(), vec!["m1+p1+p2"]);

    // The c3 record claims the c1 record two hops back (transitively).
    let out = &a.records(&c3).unwrap()[0];
    assert_eq!(out.clock().offset(channel(&a, "c1")), Some(m1.offset));

    // A reconciler in another application consumes c1 and c3. It fetches
    // the c3 record first: held until the c1 record arrives.
    let recon = Parsley::named("recon", [observer("recon", &[&c1, &c3])]).unwrap();
    let mut b = TestDriver::new(&recon).unwrap();
    b.append_all_from(&a, "c3").unwrap();
    b.run().unwrap();
    let held = b.held();
    assert_eq!(held.len(), 1, "the effect must wait for its cause");
    assert_eq!(held[0].coordinate.topic, "c3");
    assert_eq!(held[0].waiting_on[0].topic(), "c1");
    assert_eq!(held[0].waiting_on[0].diagnosis(), Diagnosis::NotFetched);
    assert!(coords(&b, "recon").is_empty());

    b.append_all_from(&a, "c1").unwrap();
    b.run().unwrap();
    assert!(b.held().is_empty());
    assert_eq!(coords(&b, "recon"), vec!["c1:0@0", "c3:0@0"]);
    assert_eq!(held_deliveries(&b, "recon"), vec!["c3:0@0"]);
}

// ---------------------------------------------------------------- fan-out

fn fan_out_app(c1: &T, c2: &T, c3: &T) -> Parsley {
    let (o2, o3) = (c2.clone(), c3.clone());
    let p1 = Stage::named("p1")
        .on(c1, move |m: &Message<String, String>| {
            vec![
                o2.send(m.key().cloned(), format!("summary of {}", value(m))),
                o3.send(m.key().cloned(), format!("audit of {}", value(m))),
            ]
        })
        .sink(c2)
        .sink(c3)
        .build()
        .unwrap();
    Parsley::named("fan-out", [p1]).unwrap()
}

#[test]
fn fan_out_emissions_are_claimed_in_send_order() {
    let (c1, c2, c3) = (topic("c1"), topic("c2"), topic("c3"));
    let mut a = TestDriver::new(&fan_out_app(&c1, &c2, &c3)).unwrap();
    a.pipe(&c1, "k", "m1").unwrap();
    a.pipe(&c1, "k", "m4").unwrap();

    // m3 (to c3) claims m2 (to c2): a sequence claim in p1's send space.
    let m2 = &a.records(&c2).unwrap()[0];
    let m3 = &a.records(&c3).unwrap()[0];
    let p1 = a.app().sender_id("p1", 0);
    let m2_seq = m2.causal().unwrap().sender.unwrap().seq;
    assert_eq!(m3.clock().sequence(channel(&a, "c2"), p1), Some(m2_seq));

    // An observer of c2 and c3 fetching c3 first holds the audit until the
    // summary it follows is delivered, for each delivery of p1.
    let obs = Parsley::named("obs", [observer("obs", &[&c2, &c3])]).unwrap();
    let mut b = TestDriver::new(&obs).unwrap();
    b.append_all_from(&a, "c3").unwrap();
    b.run().unwrap();
    let held = b.held();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].queue_depth, 2,
        "the second audit queues behind the first"
    );
    assert_eq!(held[0].waiting_on[0].diagnosis(), Diagnosis::SenderUnseen);
    b.append_all_from(&a, "c2").unwrap();
    b.run().unwrap();
    assert!(b.held().is_empty());
    let order = coords(&b, "obs");
    let pos = |c: &str| order.iter().position(|x| x == c).unwrap();
    // c2 and c3 each hold record, marker, record, marker.
    assert!(pos("c2:0@0") < pos("c3:0@0"));
    assert!(pos("c2:0@2") < pos("c3:0@2"));
    // Across deliveries too: the second audit claims the first summary.
    assert!(pos("c2:0@0") < pos("c3:0@2"));
    assert!(!held_deliveries(&b, "obs").is_empty());
}

// ---------------------------------------------------------------- fan-in

fn join_app(c1: &T, c2: &T, c4: &T) -> Parsley {
    let (l, r) = (c4.clone(), c4.clone());
    let p3 = Stage::named("p3")
        .state(Codec::utf8(), String::new)
        .fold(c1, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}[L {}]", value(m));
            Step::to(next.clone()).emit(l.send(m.key().cloned(), next))
        })
        .fold(c2, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}[R {}]", value(m));
            Step::to(next.clone()).emit(r.send(m.key().cloned(), next))
        })
        .sink(c4)
        .build()
        .unwrap();
    Parsley::named("join", [p3]).unwrap()
}

#[test]
fn fan_in_delivers_a_cause_before_its_effect_across_sources() {
    let (c1, c2, c4) = (topic("c1"), topic("c2"), topic("c4"));
    let mut d = TestDriver::new(&join_app(&c1, &c2, &c4)).unwrap();
    // The c2 record claims the c1 record, which is piped only afterwards.
    let cause = d.next_coordinate(&c1, "k").unwrap();
    d.pipe_input(&c2, Input::new("k", "effect").after(&cause))
        .unwrap();
    assert_eq!(d.held().len(), 1, "the effect must be held");
    assert!(d.values(&c4).unwrap().is_empty());
    assert_eq!(
        d.fold_state::<String, _>("p3", &Codec::utf8(), "k")
            .unwrap(),
        None
    );

    d.pipe(&c1, "k", "cause").unwrap();
    assert!(d.held().is_empty());
    assert_eq!(coords(&d, "p3"), vec!["c1:0@0", "c2:0@0"]);
    assert_eq!(held_deliveries(&d, "p3"), vec!["c2:0@0"]);
    // The fold never saw the effect before the cause.
    assert_eq!(
        d.fold_state::<String, _>("p3", &Codec::utf8(), "k")
            .unwrap(),
        Some("[L cause][R effect]".to_string())
    );
}

#[test]
fn fan_in_does_not_order_concurrent_records() {
    // Unrelated records are delivered in arrival order, whichever comes
    // first: no total order is invented.
    let (c1, c2, c4) = (topic("c1"), topic("c2"), topic("c4"));
    for c2_first in [true, false] {
        let mut d = TestDriver::new(&join_app(&c1, &c2, &c4)).unwrap();
        if c2_first {
            d.pipe(&c2, "k", "r").unwrap();
            d.pipe(&c1, "k", "l").unwrap();
        } else {
            d.pipe(&c1, "k", "l").unwrap();
            d.pipe(&c2, "k", "r").unwrap();
        }
        assert!(held_deliveries(&d, "p3").is_empty(), "nothing to wait for");
        let want = if c2_first { "[R r][L l]" } else { "[L l][R r]" };
        assert_eq!(
            d.fold_state::<String, _>("p3", &Codec::utf8(), "k")
                .unwrap()
                .as_deref(),
            Some(want)
        );
    }
}

// ---------------------------------------------------------------- diamond

#[test]
fn diamond_branches_are_concurrent_at_the_join() {
    let (c1, c2, c3, c4, c5, c6) = (
        topic("c1"),
        topic("c2"),
        topic("c3"),
        topic("c4"),
        topic("c5"),
        topic("c6"),
    );
    // p1 feeds both branches from one delivery: the c3 copy claims the c2
    // copy (fan-out order), but the join does not consume c2 or c3.
    let (o2, o3) = (c2.clone(), c3.clone());
    let p1 = Stage::named("p1")
        .on(&c1, move |m: &Message<String, String>| {
            vec![
                o2.send(m.key().cloned(), value(m)),
                o3.send(m.key().cloned(), value(m)),
            ]
        })
        .sink(&c2)
        .sink(&c3)
        .build()
        .unwrap();
    let branches = Parsley::named(
        "branches",
        [
            p1,
            forward("p2", &c2, &c4, "+left"),
            forward("p3", &c3, &c5, "+right"),
        ],
    )
    .unwrap();
    let mut a = TestDriver::new(&branches).unwrap();
    a.pipe(&c1, "k", "base").unwrap();
    // Both branch outputs claim the common input.
    for t in [&c4, &c5] {
        let r = &a.records(t).unwrap()[0];
        assert!(r.clock().offset(channel(&a, "c1")).is_some());
    }

    // The join may receive either side first; neither is held for the other.
    for left_first in [true, false] {
        let (l, r) = (c6.clone(), c6.clone());
        let p4 = Stage::named("p4")
            .state(Codec::utf8(), String::new)
            .fold(&c4, move |s: String, m: &Message<String, String>| {
                let next = format!("{s}{};", value(m));
                Step::to(next.clone()).emit(l.send(m.key().cloned(), next))
            })
            .fold(&c5, move |s: String, m: &Message<String, String>| {
                let next = format!("{s}{};", value(m));
                Step::to(next.clone()).emit(r.send(m.key().cloned(), next))
            })
            .sink(&c6)
            .build()
            .unwrap();
        let join = Parsley::named("join", [p4]).unwrap();
        let mut b = TestDriver::new(&join).unwrap();
        let order = if left_first {
            ["c4", "c5"]
        } else {
            ["c5", "c4"]
        };
        for t in order {
            b.append_all_from(&a, t).unwrap();
            b.run().unwrap();
            assert!(b.held().is_empty(), "branch outputs are concurrent");
        }
        let want = if left_first {
            "base+left;base+right;"
        } else {
            "base+right;base+left;"
        };
        assert_eq!(
            b.fold_state::<String, _>("p4", &Codec::utf8(), "k")
                .unwrap()
                .as_deref(),
            Some(want)
        );
    }
}

#[test]
fn base_and_derived_triangle_delivers_the_base_first() {
    let (c1, c2) = (topic("base"), topic("derived"));
    let deriver = Parsley::named("deriver", [forward("p2", &c1, &c2, " (enriched)")]).unwrap();
    let mut a = TestDriver::new(&deriver).unwrap();
    a.pipe(&c1, "k", "record").unwrap();
    a.pipe(&c1, "k", "second").unwrap();

    // p4 consumes both; the derivation is fetched first, whatever the lag.
    let p4 = Parsley::named("projection", [observer("p4", &[&c1, &c2])]).unwrap();
    let mut b = TestDriver::new(&p4).unwrap();
    b.append_all_from(&a, "derived").unwrap();
    b.run().unwrap();
    assert_eq!(b.held().len(), 1);
    assert_eq!(b.held()[0].queue_depth, 2);
    b.append_all_from(&a, "base").unwrap();
    b.run().unwrap();
    assert!(b.held().is_empty());
    let order = coords(&b, "p4");
    let pos = |c: &str| order.iter().position(|x| x == c).unwrap();
    assert!(pos("base:0@0") < pos("derived:0@0"));
    assert!(pos("base:0@1") < pos("derived:0@2"));
}

// ---------------------------------------------------------------- request/reply

#[test]
fn request_reply_delivers_the_effect_before_the_reply() {
    let (commands, requests, replies, effects) = (
        topic("commands"),
        topic("requests"),
        topic("replies"),
        topic("effects"),
    );
    // The responder (its own application) writes the effect, then the reply.
    let (fx, rp) = (effects.clone(), replies.clone());
    let p2 = Stage::named("p2")
        .on(&requests, move |m: &Message<String, String>| {
            vec![
                fx.send(m.key().cloned(), format!("effect of {}", value(m))),
                rp.send(m.key().cloned(), format!("ack {}", value(m))),
            ]
        })
        .sink(&effects)
        .sink(&replies)
        .build()
        .unwrap();
    let responder = Parsley::named("responder", [p2]).unwrap();

    // The requester sends requests and consumes both replies and effects.
    let rq = requests.clone();
    let p1 = Stage::named("p1")
        .state(Codec::utf8(), String::new)
        .fold(&commands, move |s: String, m: &Message<String, String>| {
            Step::to(s).emit(rq.send(m.key().cloned(), value(m)))
        })
        .fold(&effects, |s: String, m: &Message<String, String>| {
            Step::to(format!("{s}seen {};", value(m)))
        })
        .fold(
            &replies,
            |s: String, m: &Message<String, String>| -> Result<Step<String>, String> {
                // Read-your-writes: the effect being acknowledged is visible.
                let wanted = value(m).replace("ack ", "seen effect of ");
                if s.contains(&wanted) {
                    Ok(Step::to(format!("{s}acked;")))
                } else {
                    Err(format!("reply before its effect: {s}"))
                }
            },
        )
        .sink(&requests)
        .build()
        .unwrap();
    let requester = Parsley::named("requester", [p1]).unwrap();

    let mut req = TestDriver::new(&requester).unwrap();
    let mut resp = TestDriver::new(&responder).unwrap();
    req.pipe(&commands, "k", "pay").unwrap();
    resp.append_all_from(&req, "requests").unwrap();
    resp.run().unwrap();
    assert_eq!(resp.values(&replies).unwrap(), vec!["ack pay"]);

    // The reply reaches the requester first: held on the effect.
    req.append_all_from(&resp, "replies").unwrap();
    req.run().unwrap();
    let held = req.held();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].coordinate.topic, "replies");
    assert_eq!(held[0].waiting_on[0].topic(), "effects");
    req.append_all_from(&resp, "effects").unwrap();
    req.run().unwrap();
    assert!(req.held().is_empty());
    assert_eq!(
        req.fold_state::<String, _>("p1", &Codec::utf8(), "k")
            .unwrap()
            .as_deref(),
        Some("seen effect of pay;acked;")
    );
}

// ---------------------------------------------------------------- event flows

#[test]
fn event_notification_never_dangles() {
    let (input, data, events) = (topic("input"), topic("data"), topic("events"));
    let (d_out, e_out) = (data.clone(), events.clone());
    let writer = Stage::named("writer")
        .on(&input, move |m: &Message<String, String>| {
            vec![
                d_out.send(m.key().cloned(), value(m)),
                e_out.send(m.key().cloned(), "updated".to_string()),
            ]
        })
        .sink(&data)
        .sink(&events)
        .build()
        .unwrap();
    let mut a = TestDriver::new(&Parsley::named("writer", [writer]).unwrap()).unwrap();
    a.pipe(&input, "doc-1", "v1").unwrap();

    // The notification handler looks the data up in its own fold state.
    let reader = Stage::named("reader")
        .state(Codec::utf8(), String::new)
        .fold(&data, |_s: String, m: &Message<String, String>| {
            Step::to(value(m))
        })
        .fold(
            &events,
            |s: String, _m: &Message<String, String>| -> Result<Step<String>, String> {
                if s.is_empty() {
                    Err("dangling notification".into())
                } else {
                    Ok(Step::keep())
                }
            },
        )
        .build()
        .unwrap();
    let app = Parsley::named("reader", [reader]).unwrap();
    let mut b = TestDriver::new(&app).unwrap();
    b.append_all_from(&a, "events").unwrap();
    b.run().unwrap();
    assert_eq!(b.held().len(), 1, "the notification waits for its data");
    b.append_all_from(&a, "data").unwrap();
    b.run().unwrap();
    assert_eq!(coords(&b, "reader"), vec!["data:0@0", "events:0@0"]);

    // An unstamped producer claims nothing: its event is delivered at once
    // and unordered, even before the data it announces.
    let mut c = TestDriver::new(&app).unwrap();
    let err = c.pipe(&events, "doc-2", "updated").unwrap_err();
    // The logic saw the event itself, unheld, and failed on the missing
    // data.
    assert!(
        matches!(
            &err,
            DriverError::Task(TaskError::Logic { coordinate, .. })
                if *coordinate == Coordinate::new("events", 0, 0)
        ),
        "{err}"
    );
}

// ---------------------------------------------------------------- cycles

fn cycle_app(limit: i64) -> (Parsley, Topic<String, i64>, Topic<String, i64>) {
    let c1: Topic<String, i64> = Topic::new("c1", Codec::utf8(), Codec::int64());
    let c2: Topic<String, i64> = Topic::new("c2", Codec::utf8(), Codec::int64());
    let (to2, to1) = (c2.clone(), c1.clone());
    let p1 = Stage::named("p1")
        .on(&c1, move |m: &Message<String, i64>| {
            vec![to2.send(m.key().cloned(), m.value().copied().unwrap_or(0) + 1)]
        })
        .sink(&c2)
        .build()
        .unwrap();
    // p2 converges: it re-emits only below the limit.
    let p2 = Stage::named("p2")
        .on(&c2, move |m: &Message<String, i64>| {
            let n = m.value().copied().unwrap_or(0);
            if n < limit {
                vec![to1.send(m.key().cloned(), n + 1)]
            } else {
                vec![]
            }
        })
        .sink(&c1)
        .build()
        .unwrap();
    (Parsley::named("cycle", [p1, p2]).unwrap(), c1, c2)
}

#[test]
fn cycles_that_converge_settle_without_deadlock() {
    let (app, c1, c2) = cycle_app(10);
    let mut d = TestDriver::new(&app).unwrap();
    d.pipe(&c1, "k", 0).unwrap();
    assert_eq!(d.values(&c1).unwrap(), vec![0, 2, 4, 6, 8, 10]);
    assert_eq!(d.values(&c2).unwrap(), vec![1, 3, 5, 7, 9, 11]);
    assert!(d.held().is_empty());
    // Each lap claims the previous one: the last c1 record claims the
    // c2 record that caused it.
    let last = d.records(&c1).unwrap().pop().unwrap();
    let c2_ch = d.channel("c2", 0).unwrap();
    assert!(
        last.clock().offset(c2_ch).is_some()
            || last.clock().sequences().iter().any(|s| s.channel == c2_ch)
    );
}

#[test]
fn cycles_that_never_converge_are_reported() {
    let (app, c1, _) = cycle_app(i64::MAX);
    let mut d = TestDriver::builder(&app).step_budget(200).build().unwrap();
    let err = d.pipe(&c1, "k", 0).unwrap_err();
    assert!(matches!(err, DriverError::NoQuiescence { .. }), "{err}");
}
