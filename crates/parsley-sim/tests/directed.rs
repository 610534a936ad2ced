//! Directed constructions in the simulated world: interleavings a random
//! schedule reaches only by coincidence, scripted step by step and judged by
//! the same oracle.

use parsley_protocol::{CausalHeaders, CausalNode, Channel, TopicId, VectorClock};
use parsley_sim::*;

/// `k` derives `d` from `c`; `m` consumes `d` (not `c`) and ticks, emitting
/// an audit on `e` per tick; `check` consumes `c`, `e` and `g`, and the
/// observer's records on `c` claim what it read on `g`.
fn world() -> SimWorld<CausalNode> {
    let mut m = NodeSpec::new(
        "m",
        &[("d", 0), ("ticks", 0)],
        &["ticks", "e"],
        Behavior::Sink,
    );
    m.tick = Some(TickSpec {
        topic: "ticks".into(),
        partition: 0,
        outputs: vec![Output::to("e", 0)],
    });
    let mut observer = EdgeSpec::producer("observer", &[("c", 0)]);
    observer.observes = vec![("g".into(), 0)];
    // Creation order picks the ids: `e` gets one with the top bit set, so it
    // sorts before `c` and a release cascade visits it first.
    let config = WorldConfig::new(&[("g", 1), ("e", 1), ("d", 1), ("ticks", 1), ("c", 1)])
        .node(NodeSpec::new(
            "k",
            &[("c", 0)],
            &["d"],
            Behavior::Forward(vec![Output::to("d", 0)]),
        ))
        .node(m)
        .node(NodeSpec::new(
            "check",
            &[("c", 0), ("e", 0), ("g", 0)],
            &[],
            Behavior::Sink,
        ))
        .edge(EdgeSpec::producer("producer", &[("g", 0)]))
        .edge(observer);
    SimWorld::new(config, 0).expect("world")
}

/// Drives the world up to the point where `check` holds `c@0` (waiting for
/// `g@0`) and `m` has received `d@0`, whose clock is `m`'s only claim on
/// `c@0`.
fn hold_c0(w: &mut SimWorld<CausalNode>) {
    let (c, d, e) = (w.channel("c", 0), w.channel("d", 0), w.channel("e", 0));
    w.edge_op("producer"); // g@0
    w.edge_op("observer"); // observes g@0, writes c@0 claiming it
    w.step_node("k", NodeAction::Fetch(c)).unwrap(); // d@0 claims c@0
    let r = w.step_node("check", NodeAction::Fetch(c)).unwrap();
    assert_eq!((r.delivered, r.held_after), (0, 1), "check must hold c@0");
    w.step_node("m", NodeAction::Fetch(d)).unwrap();
    assert_eq!(w.broker.end_offset(e), 0);
}

/// Emits a tick at `m`, delivers it, hands the audit to `check` (it waits:
/// it inherits the claim on `g@0`), then hands `check` the root cause
/// `g@0`, whose arrival releases everything waiting.
fn audit_then_root_cause(w: &mut SimWorld<CausalNode>) -> Result<StepReport, WorldFailure> {
    let (ticks, e, g) = (w.channel("ticks", 0), w.channel("e", 0), w.channel("g", 0));
    w.step_node("m", NodeAction::Tick)?;
    w.step_node("m", NodeAction::Fetch(ticks))?;
    let r = w.step_node("check", NodeAction::Fetch(e))?;
    assert_eq!((r.delivered, r.held_after), (0, 2));
    w.step_node("check", NodeAction::Fetch(g))
}

/// The log-start truncation drops stamp-side claims below each channel's log
/// start, assuming those records are below every consumer's baseline. A
/// consumer that still *holds* such a record breaks that assumption: once
/// retention passes `c@0` while `check` holds it, `m`'s sweep drops its only
/// claim on `c@0`, and `m`'s next audit overtakes its cause at `check`. The
/// oracle catches it. This is why the world's retention never passes a held
/// record, and why retention on causal topics must cover the longest hold.
#[test]
fn retention_past_a_held_record_lets_an_effect_overtake_its_cause() {
    let mut w = world();
    hold_c0(&mut w);
    let c = w.channel("c", 0);
    // Retention bounded only by consumer positions (both k and check have
    // fetched past c@0).
    assert_eq!(w.position("check", "c", 0), Some(1));
    w.broker.advance_log_start(c, 1);
    let swept = w.step_node("m", NodeAction::Sweep).unwrap();
    assert!(
        swept.truncated > 0,
        "the sweep must drop m's custody claim on c@0"
    );
    let err = audit_then_root_cause(&mut w).expect_err("the oracle must flag the audit");
    assert!(
        err.message.contains("delivering e:0@0")
            && err.message.contains("causal order violated")
            && err.message.contains("c:0@0"),
        "{err}"
    );
}

/// The same interleaving with retention that respects the hold: the log
/// start cannot pass `c@0`, the sweep keeps the claim, and the audit waits
/// for its cause.
#[test]
fn retention_that_respects_holds_keeps_the_claim() {
    let mut w = world();
    hold_c0(&mut w);
    w.retain("c", 0);
    assert_eq!(
        w.broker.log_start(w.channel("c", 0)),
        0,
        "retention passed a held record"
    );
    let swept = w.step_node("m", NodeAction::Sweep).unwrap();
    assert_eq!(swept.truncated, 0);
    // The audit still claims c@0, so the cascade releases c@0 first.
    let r = audit_then_root_cause(&mut w).unwrap();
    assert_eq!(r.delivered, 3);
    w.run().unwrap();
}

/// `gate` consumes `c` and `d`; the observer's records on `c` claim what it
/// read on `d`. `gate` holds `c@0` (waiting for `d@0`), crashes, and its
/// first restart drops `d` from its scope, so init itself releases `c@0`.
fn gate_holding_across_a_shrink() -> SimWorld<CausalNode> {
    let mut gate = NodeSpec::new(
        "gate",
        &[("c", 0), ("d", 0)],
        &["out"],
        Behavior::Forward(vec![Output::to("out", 0)]),
    );
    gate.rescopes = vec![Rescope {
        at_restart: 1,
        inputs: vec![("c".into(), 0)],
        sinks: vec!["out".into()],
        behavior: None,
    }];
    let mut observer = EdgeSpec::producer("observer", &[("c", 0)]);
    observer.observes = vec![("d".into(), 0)];
    let config = WorldConfig::new(&[("c", 1), ("d", 1), ("out", 1)])
        .node(gate)
        .node(NodeSpec::new(
            "check",
            &[("c", 0), ("out", 0)],
            &[],
            Behavior::Sink,
        ))
        .edge(EdgeSpec::producer("producer", &[("d", 0)]))
        .edge(observer);
    let mut w = SimWorld::new(config, 0).expect("world");
    let c = w.channel("c", 0);
    w.edge_op("producer"); // d@0
    w.edge_op("observer"); // c@0, claiming d@0
    let r = w.step_node("gate", NodeAction::Fetch(c)).unwrap();
    assert_eq!((r.delivered, r.held_after), (0, 1), "gate must hold c@0");
    w.crash("gate");
    w
}

/// A crash between init and the starting-position reports, after init's
/// own releases went through user logic: the release and its send abort
/// together (an aborted record and an abort marker on `out`), and the next
/// start releases the same record again, once, and commits.
#[test]
fn a_crash_after_init_releases_aborts_them() {
    let mut w = gate_holding_across_a_shrink();
    let out = w.channel("out", 0);
    let r = w
        .restart_crashing("gate", StartCrash::AfterInitReleases, 10)
        .unwrap();
    assert_eq!((r.delivered, r.sent, r.restored_held), (1, 1, 1), "{r:?}");
    assert!(!r.cut_sends);
    assert!(!w.node("gate").is_up());
    assert_eq!(
        w.broker.end_offset(out),
        2,
        "an aborted record and its marker"
    );
    assert!(w.broker.fetch(out, 0).is_none(), "nothing committed on out");
    assert_eq!(w.oracle.delivered_count(w.node("gate").actor), 0);
    let stats = w.run().unwrap();
    assert_eq!(stats.restarts, 1);
    assert_eq!(w.oracle.delivered_count(w.node("gate").actor), 1);
    assert!(w.broker.fetch(out, 0).is_some_and(|(o, _)| o == 2));
}

/// The same crash landing after init but before anything it released
/// reached user logic, and one cut short before the release's send: neither
/// leaves anything on `out`, or just the abort of what was stamped.
#[test]
fn crashes_right_after_init_or_before_a_send() {
    let mut w = gate_holding_across_a_shrink();
    let out = w.channel("out", 0);
    let r = w
        .restart_crashing("gate", StartCrash::AfterInit, 10)
        .unwrap();
    assert_eq!((r.delivered, r.sent, r.restored_held), (0, 0, 1), "{r:?}");
    assert_eq!(w.broker.end_offset(out), 0);
    let r = w
        .restart_crashing("gate", StartCrash::AfterStartPositions, 0)
        .unwrap();
    assert_eq!((r.delivered, r.sent), (1, 0), "{r:?}");
    assert!(r.cut_sends, "the crash must land before the send");
    assert_eq!(w.broker.end_offset(out), 0);
    w.run().unwrap();
    assert_eq!(w.oracle.delivered_count(w.node("gate").actor), 1);
    assert!(w.broker.fetch(out, 0).is_some_and(|(o, _)| o == 0));
}

fn claim(c: Channel, offset: i64) -> VectorClock {
    let mut clock = VectorClock::new();
    clock.claim_offset(c, offset);
    clock
}

fn plain_record() -> StoredRecord {
    StoredRecord {
        key: None,
        value: None,
        timestamp: 0,
        headers: Vec::new(),
        causal: CausalHeaders::default(),
        oracle_id: usize::MAX,
        clock_version: parsley_protocol::clock::ClockVersion::V1,
    }
}

/// H4's offset-claim check, on its own: a claim must name an offset below
/// the channel's end, and on a deleted topic below the end it had when it
/// was deleted. A claim on a deleted topic is harmless, but not a claim on
/// history that never existed.
#[test]
fn the_offset_claim_check_follows_a_deleted_topic_to_its_last_end() {
    let mut b = SimBroker::new();
    let live = b.create_topic("live", 1);
    let gone = b.create_topic("gone", 2);
    let (l0, g0, g1) = (
        Channel::new(live, 0),
        Channel::new(gone, 0),
        Channel::new(gone, 1),
    );
    b.append(l0, plain_record(), true);
    b.append(g0, plain_record(), true);
    b.append_marker(g0, true);
    b.append(g0, plain_record(), false);
    b.append(g1, plain_record(), true);
    let ok = |b: &SimBroker, c, o| check_offset_claims(b, &claim(c, o)).is_ok();
    assert!(ok(&b, g0, 2) && !ok(&b, g0, 3));
    b.destroy_topic(gone);
    assert_eq!(b.end_offset(g0), 0, "a deleted topic answers as absent");
    // Accepted: offsets g0 and g1 really had (a marker and an aborted
    // record occupy offsets too).
    assert!(ok(&b, g0, 0) && ok(&b, g0, 1) && ok(&b, g0, 2) && ok(&b, g1, 0));
    // Flagged: offsets at or past where each partition ended.
    let err = check_offset_claims(&b, &claim(g0, 3)).unwrap_err();
    assert!(err.contains("ended at 3"), "{err}");
    assert!(!ok(&b, g1, 1));
    // A live channel: below its end only.
    assert!(ok(&b, l0, 0) && !ok(&b, l0, 1));
    // A topic that never existed: nothing.
    assert!(!ok(&b, Channel::new(TopicId::from_u128(99), 0), 0));
    // A clock with several claims is judged on each.
    let mut both = claim(l0, 0);
    both.claim_offset(g1, 5);
    assert!(check_offset_claims(&b, &both).is_err());
}
