//! Hold diagnostics as a user reads them: after a failure, longest-held
//! first, the right diagnosis behind a commit marker, and ages from the
//! moment a record became its queue's head.

use std::time::Duration;

use parsley::*;

mod capture;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn app(failing: bool) -> (Parsley, T, T, T) {
    let (a, b, c) = (topic("a"), topic("b"), topic("c"));
    let stage = Stage::named("s")
        .on(&a, |_m| Vec::<Emission>::new())
        .on(&b, move |m| -> Result<Vec<Emission>, String> {
            if failing && m.value().map(String::as_str) == Some("bad") {
                Err("bad record".into())
            } else {
                Ok(vec![])
            }
        })
        .on(&c, |_m| Vec::<Emission>::new())
        .build()
        .unwrap();
    (Parsley::named("app", [stage]).unwrap(), a, b, c)
}

/// A held record still shows after another record of the same task fails:
/// that is when a user looks.
#[test]
fn held_records_show_after_a_failure_in_the_same_task() {
    let (app, a, b, c) = (app(true).0, topic("a"), topic("b"), topic("c"));
    let mut d = TestDriver::new(&app).unwrap();
    let cause = d.next_coordinate(&c, "k").unwrap();
    d.pipe_input(&a, Input::new("k", "effect").after(&cause))
        .unwrap();
    assert_eq!(d.held().len(), 1);
    assert!(d.pipe(&b, "k", "bad").is_err());
    let held = d.held();
    assert_eq!(
        held.len(),
        1,
        "the hold is still reported after the failure"
    );
    assert_eq!(held[0].coordinate.topic, "a");
}

/// Holds are listed longest-held first, whatever their channel order.
#[test]
fn holds_are_listed_longest_first() {
    let (app, a, b, c) = app(false);
    let mut d = TestDriver::new(&app).unwrap();
    let cause = d.next_coordinate(&c, "k").unwrap();
    // b's record is held first, a's ten seconds later.
    d.pipe_input(&b, Input::new("k", "early").after(&cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(10)).unwrap();
    d.pipe_input(&a, Input::new("k", "late").after(&cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(5)).unwrap();
    let held = d.held();
    let order: Vec<(&str, i64)> = held
        .iter()
        .map(|h| (h.coordinate.topic.as_str(), h.held_for_ms))
        .collect();
    assert_eq!(order, vec![("b", 15_000), ("a", 5_000)]);
}

/// A record queued behind a held head starts gating its channel when it
/// becomes the head (the metric and the warning measure the same): its age
/// counts from then.
#[test]
fn a_new_head_counts_its_age_from_becoming_the_head() {
    let (app, a, _b, c) = app(false);
    let mut d = TestDriver::new(&app).unwrap();
    let first_cause = d.next_coordinate(&c, "k").unwrap();
    d.pipe_input(&a, Input::new("k", "one").after(&first_cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(3)).unwrap();
    // The second record of a waits on a later record of c.
    let second_cause = Coordinate::new("c", 0, first_cause.offset + 1);
    d.pipe_input(&a, Input::new("k", "two").after(&second_cause))
        .unwrap();
    d.advance_wall_clock(Duration::from_secs(4)).unwrap();
    assert_eq!(d.held()[0].held_for_ms, 7_000, "the first head");
    // The first cause arrives: "one" is delivered, "two" is the new head.
    d.pipe(&c, "k", "cause 1").unwrap();
    d.advance_wall_clock(Duration::from_secs(2)).unwrap();
    let held = d.held();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].coordinate.offset, 1);
    assert_eq!(held[0].held_for_ms, 2_000, "since it became the head");
}

/// The same when the held record arrived in the step that failed: the
/// abort rolls the task back, and the driver fetches up to the failing
/// record again, so the hold is there to see.
#[test]
fn a_hold_from_the_failed_step_still_shows() {
    let (app, a, b, c) = (app(true).0, topic("a"), topic("b"), topic("c"));
    let mut d = TestDriver::new(&app).unwrap();
    let cause = d.next_coordinate(&c, "k").unwrap();
    d.append(&a, Input::new("k", "effect").after(&cause))
        .unwrap();
    d.append(&b, Input::new("k", "bad")).unwrap();
    assert!(d.run().is_err());
    let held = d.held();
    assert_eq!(held.len(), 1, "the hold is reported after the failure");
    assert_eq!(held[0].coordinate.topic, "a");
}

/// A claim on a commit marker the consumer has already fetched past is not
/// "not fetched": the gap is the held head before the marker, so it reads
/// "held upstream" and points there.
#[test]
fn a_claim_on_a_fetched_marker_behind_a_held_head_is_held_upstream() {
    let (x, c, a) = (topic("x"), topic("c"), topic("a"));
    let out = c.clone();
    let up = Stage::named("up")
        .on(&x, move |m| vec![out.send(m.key().cloned(), "effect")])
        .sink(&c)
        .build()
        .unwrap();
    let mut upstream = TestDriver::new(&Parsley::named("upstream", [up]).unwrap()).unwrap();
    upstream.pipe(&x, "k", "cause").unwrap();
    assert_eq!(
        upstream.markers("c", 0).unwrap(),
        1,
        "c@0, then a marker at c@1"
    );

    let down = Stage::named("down")
        .on(&c, |_m| Vec::<Emission>::new())
        .on(&x, |_m| Vec::<Emission>::new())
        .on(&a, |_m| Vec::<Emission>::new())
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("downstream", [down]).unwrap()).unwrap();
    // c@0 arrives without its cause x@0, so it is held; the marker after it
    // is fetched too.
    d.append_from(&upstream, "c", 0, 1).unwrap();
    d.run().unwrap();
    d.pipe_input(
        &a,
        Input::new("k", "claims the marker").after(&Coordinate::new("c", 0, 1)),
    )
    .unwrap();
    let held = d.held();
    let on_a = held.iter().find(|h| h.coordinate.topic == "a").unwrap();
    assert_eq!(on_a.waiting_on.len(), 1);
    assert_eq!(
        on_a.waiting_on[0].diagnosis(),
        Diagnosis::HeldUpstream,
        "{on_a}"
    );
    let on_c = held.iter().find(|h| h.coordinate.topic == "c").unwrap();
    assert_eq!(on_c.waiting_on[0].diagnosis(), Diagnosis::NotFetched);
}

/// The two sequence diagnoses: a claim on a sender never delivered on the
/// channel reads `sender-unseen`; a claim ahead of what that sender has
/// delivered reads `sender-behind`, with the delivered sequence shown.
#[test]
fn sequence_claims_read_sender_unseen_and_sender_behind() {
    let (x, c, a) = (topic("x"), topic("c"), topic("a"));
    let out = c.clone();
    let up = Stage::named("up")
        .on(&x, move |m| vec![out.send(m.key().cloned(), "effect")])
        .sink(&c)
        .build()
        .unwrap();
    let upstream_app = Parsley::named("upstream", [up]).unwrap();
    let mut upstream = TestDriver::new(&upstream_app).unwrap();
    upstream.pipe(&x, "k", "one").unwrap();
    let down = Stage::named("down")
        .on(&c, |_m| Vec::<Emission>::new())
        .on(&a, |_m| Vec::<Emission>::new())
        .build()
        .unwrap();
    let mut d = TestDriver::new(&Parsley::named("downstream", [down]).unwrap()).unwrap();
    let c0 = d.channel("c", 0).unwrap();
    let sender = upstream_app.sender_id("up", 0);

    // Nothing from the sender delivered on c yet.
    let mut clock = parsley::protocol::VectorClock::new();
    clock.claim_sequence(c0, sender, 1);
    d.pipe_input(&a, Input::new("k", "waits").clock(&clock))
        .unwrap();
    let held = d.held();
    assert_eq!(held.len(), 1);
    let w = &held[0].waiting_on[0];
    assert_eq!(w.diagnosis(), Diagnosis::SenderUnseen, "{}", held[0]);
    assert!(held[0].summary().contains("vc-hold-sender-unseen"));
    // The summary says what to do about it, and the record prints as its
    // summary.
    assert!(
        held[0]
            .summary()
            .contains("nothing from that sender has been delivered on the channel yet"),
        "{}",
        held[0].summary()
    );
    assert_eq!(held[0].to_string(), held[0].summary());

    // The sender's first record arrives (seq 1): that claim is met. A
    // claim on its seq 2 reads sender-behind, delivered 1.
    d.append_from(&upstream, "c", 0, 1).unwrap();
    d.run().unwrap();
    assert!(d.held().is_empty());
    let mut clock = parsley::protocol::VectorClock::new();
    clock.claim_sequence(c0, sender, 2);
    d.pipe_input(&a, Input::new("k", "waits more").clock(&clock))
        .unwrap();
    let held = d.held();
    assert_eq!(held.len(), 1);
    match &held[0].waiting_on[0] {
        WaitingOn::Sequence {
            diagnosis,
            delivered_seq,
            seq,
            ..
        } => {
            assert_eq!(*diagnosis, Diagnosis::SenderBehind);
            assert_eq!((*delivered_seq, *seq), (Some(1), 2));
        }
        other => panic!("expected a sequence claim, got {other:?}"),
    }
    assert!(held[0].summary().contains("vc-hold-sender-behind"));
    assert!(
        held[0]
            .summary()
            .contains("that sender's later records are in flight or their transaction is open"),
        "{}",
        held[0].summary()
    );
}

/// A hold that outlives the stage's threshold is logged once at WARN with
/// its `vc-hold-*` code and summary, however many punctuations follow; a
/// new head on the same channel is a new hold and warns again.
#[test]
fn a_hold_warns_once_with_its_code() {
    let text = capture::logs(tracing::Level::WARN, || {
        let (a, c) = (topic("a"), topic("c"));
        let stage = Stage::named("s")
            .on(&a, |_m| Vec::<Emission>::new())
            .on(&c, |_m| Vec::<Emission>::new())
            .hold_warning_after(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut d = TestDriver::new(&Parsley::named("app", [stage]).unwrap()).unwrap();
        let first = d.next_coordinate(&c, "k").unwrap();
        d.pipe_input(&a, Input::new("k", "one").after(&first))
            .unwrap();
        d.pipe_input(
            &a,
            Input::new("k", "two").after(&Coordinate::new("c", 0, first.offset + 1)),
        )
        .unwrap();
        for _ in 0..4 {
            d.advance_wall_clock(Duration::from_secs(3)).unwrap();
        }
        // The first cause arrives; "two" becomes the head and waits on.
        d.pipe(&c, "k", "cause").unwrap();
        for _ in 0..4 {
            d.advance_wall_clock(Duration::from_secs(3)).unwrap();
        }
    });
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("vc-hold-not-fetched"))
        .collect();
    assert_eq!(warnings.len(), 2, "once per hold:\n{text}");
    assert!(warnings.iter().all(|l| l.contains("WARN")), "{text}");
    assert!(
        warnings[0].contains("a:0@0") && warnings[0].contains("c:0 offset 0"),
        "{text}"
    );
    assert!(
        warnings[1].contains("a:0@1") && warnings[1].contains("c:0 offset 1"),
        "{text}"
    );
    assert!(
        warnings[0].contains("for 6000ms"),
        "the age at the warning: {text}"
    );
}
