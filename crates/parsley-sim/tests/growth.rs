//! Scope growth under the oracle: redeploys that add inputs, turn a sink
//! into an input, add a kept sink as an input, and drop inputs again, with
//! crashes in between. The oracle's baseline for a joining input is the
//! host's own start position (never the protocol's resume answer), every
//! record the node's past already covers must stay undelivered (re-entry),
//! and everything beyond the claim envelope must be delivered.

mod common;

use common::*;
use parsley_protocol::CausalNode;
use parsley_sim::*;

fn rescope(at: u32, inputs: &[(&str, i32)], sinks: &[&str], behavior: Option<Behavior>) -> Rescope {
    Rescope {
        at_restart: at,
        inputs: inputs.iter().map(|&(t, p)| (t.to_owned(), p)).collect(),
        sinks: sinks.iter().map(|&t| t.to_owned()).collect(),
        behavior,
    }
}

/// Runs the world in phases, crashing `node` after each, until every scope
/// change it declares has been applied (a redeploy that drops an input
/// holding records is refused and retried), with the random crashes of the
/// budget in between.
fn phased(node: &'static str) -> impl Fn(&mut SimWorld<CausalNode>) -> Result<(), WorldFailure> {
    move |w| {
        w.run()?;
        let mut phases = 0;
        while w.node(node).rescopes_pending() > 0 {
            phases += 1;
            assert!(
                phases < 50,
                "{node}: scope changes still pending after 50 restarts"
            );
            w.crash(node);
            w.budget_mut().edge_ops += 15;
            w.budget_mut().crashes += 1;
            w.run()?;
        }
        Ok(())
    }
}

fn joined(s: &WorldStats) -> bool {
    s.joined_inputs > 0
}

/// An input joins whose history the node's past already claims by offset:
/// a plain producer writes `x` and `a` in turn, each send claiming the ones
/// before, and the node consumes only `a` at first. When `x` joins, the
/// records of `x` that are causes of what it delivered on `a` must be
/// skipped (the cross-implementation growth trace); later ones delivered.
/// The input is then dropped and added again. One variant's host does not
/// seek to the resume position and re-reads the prefix, which the replay
/// guard must drop.
#[test]
fn an_input_joins_whose_past_is_claimed_by_offset() {
    let build = |seek: bool| {
        move |_| {
            let mut n = NodeSpec::new(
                "n",
                &[("a", 0)],
                &["out"],
                Behavior::Forward(vec![Output::to("out", 0)]),
            );
            n.seek_resume = seek;
            n.rescopes = vec![
                rescope(1, &[("a", 0), ("x", 0)], &["out"], None),
                rescope(2, &[("a", 0)], &["out"], None),
                rescope(3, &[("a", 0), ("x", 0)], &["out"], None),
            ];
            let mut c = WorldConfig::new(&[("a", 1), ("x", 1), ("out", 1)])
                .node(n)
                .node(NodeSpec::new(
                    "check",
                    &[("x", 0), ("out", 0)],
                    &[],
                    Behavior::Sink,
                ))
                .edge(EdgeSpec::producer("source", &[("x", 0), ("a", 0)]));
            c.budget = Budget {
                edge_ops: 30,
                crashes: 2,
                ..Budget::default()
            };
            c
        }
    };
    let s = sweep_with::<CausalNode>("growth by offset claims", build(true), phased("n"));
    s.floor("an input joined by a redeploy", joined)
        .floor("a joined input seeded past its history", |s| {
            s.seeded_inputs > 0
        })
        .floor("an input left again", |s| s.left_inputs > 0)
        .floor(
            "a redeploy refused while the departing input held records",
            |s| s.refused_shrinks > 0,
        )
        .floor("records held at the gate", held_some);
    let s = sweep_with::<CausalNode>(
        "growth, host re-reads the prefix",
        build(false),
        phased("n"),
    );
    s.floor("an input joined by a redeploy", joined)
        .floor("replays dropped by the guard", |s| s.replays_skipped > 0);
}

/// An input joins whose history the node's past claims only by sequence: a
/// stage writes to `x` and then to `a`, so its records on `a` carry
/// sequence claims on its own sends to `x`, whose offsets the node cannot
/// know. Those records must be skipped as they arrive, and nothing else.
#[test]
fn an_input_joins_whose_past_is_claimed_by_sequence() {
    let s = sweep_with::<CausalNode>(
        "growth by sequence claims",
        |_| {
            let p = NodeSpec::new(
                "p",
                &[("src", 0)],
                &["x", "a"],
                Behavior::Forward(vec![Output::to("x", 0), Output::to("a", 0)]),
            );
            let mut n = NodeSpec::new(
                "n",
                &[("a", 0)],
                &["out"],
                Behavior::Forward(vec![Output::to("out", 0)]),
            );
            n.rescopes = vec![
                rescope(1, &[("a", 0), ("x", 0)], &["out"], None),
                rescope(2, &[("a", 0)], &["out"], None),
                rescope(3, &[("a", 0), ("x", 0)], &["out"], None),
            ];
            let mut c = WorldConfig::new(&[("src", 1), ("a", 1), ("x", 1), ("out", 1)])
                .node(p)
                .node(n)
                .node(NodeSpec::new(
                    "check",
                    &[("x", 0), ("out", 0)],
                    &[],
                    Behavior::Sink,
                ))
                .edge(EdgeSpec::producer("source", &[("src", 0)]));
            c.budget = Budget {
                edge_ops: 30,
                crashes: 3,
                ..Budget::default()
            };
            c
        },
        phased("n"),
    );
    s.floor("an input joined by a redeploy", joined)
        .floor("records of the past skipped by sequence", |s| {
            s.past_skipped > 0
        })
        .floor("records held at the gate", held_some);
}

/// The wedge: a stage consumes `a` and its own feedback loop `t`, and sinks
/// to `g` and `t`; each delivery sends to `g`, then to `t`, whose stamp
/// claims the stage's own send to `g` by sequence. A redeploy turns `g`
/// into an input (dropping it as a sink, or keeping it), so records on `t`
/// carry claims on the stage's own earlier sends that now sit below its
/// seed on `g`. They must be released, not held for good; a later redeploy
/// drops `g` again.
#[test]
fn a_sink_becomes_an_input() {
    let build = |keep_sink: bool| {
        move |_| {
            let loop_both = Behavior::Feedback(vec![Output::to("g", 0), Output::to("t", 0)]);
            let loop_t = Behavior::Feedback(vec![Output::to("t", 0)]);
            let mut s = NodeSpec::new("s", &[("a", 0), ("t", 0)], &["g", "t"], loop_both.clone());
            let (grown_sinks, grown_behavior): (&[&str], _) = if keep_sink {
                (&["g", "t"], loop_both.clone())
            } else {
                (&["t"], loop_t)
            };
            s.rescopes = vec![
                rescope(
                    1,
                    &[("a", 0), ("t", 0), ("g", 0)],
                    grown_sinks,
                    Some(grown_behavior),
                ),
                rescope(2, &[("a", 0), ("t", 0)], &["g", "t"], Some(loop_both)),
            ];
            let mut c = WorldConfig::new(&[("a", 1), ("t", 1), ("g", 1)])
                .node(s)
                .node(NodeSpec::new(
                    "check",
                    &[("g", 0), ("t", 0)],
                    &[],
                    Behavior::Sink,
                ))
                .edge(EdgeSpec::producer("source", &[("a", 0)]));
            c.hops = 2;
            c.budget = Budget {
                edge_ops: 30,
                crashes: 6,
                ..Budget::default()
            };
            c
        }
    };
    for (name, keep) in [
        ("a former sink becomes an input", false),
        ("a kept sink is added as an input", true),
    ] {
        let s = sweep_with::<CausalNode>(name, build(keep), phased("s"));
        s.floor("an input joined by a redeploy", joined)
            .floor(
                "records claiming the node's own pre-join sends delivered",
                |s| s.own_past_claims_delivered > 0,
            )
            .floor("an input left again", |s| s.left_inputs > 0)
            .floor("records held at the gate", held_some)
            .floor("held records restored at restart", restored_held);
    }
}
