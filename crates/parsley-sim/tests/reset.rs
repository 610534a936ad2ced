//! Operator resets (`parsley reset`) under the oracle: a node is reset
//! while it is down, once to the log start and twice half way along its
//! inputs, while the node downstream of it keeps running. The reset must
//! keep the node's send sequences (else the downstream node takes new
//! records for ones it delivered before the reset), keep claiming the past
//! the node delivered, and leave skip marks for what lies below a reset
//! position (else sequence claims on it wait for ever). The self-tests at
//! the end run the same world with a reset that breaks each rule and check
//! that the oracle notices.

mod common;

use common::*;
use parsley_protocol::CausalNode;
use parsley_sim::*;

/// `src` forwards each record to `x` and then `y`, so its records on `y`
/// claim its sends to `x` by sequence. `up` consumes both and writes to
/// `t1` and then `t2` (the same shape one stage further), and is reset
/// three times; `down` consumes `t1` and `t2` throughout. With its first
/// reset `up` is redeployed with a third sink, `t3` (a fix that adds an
/// output, say), and `side` joins then, reading `x` from its start and
/// `t3`: what `up` sends to `t3`
/// comes after everything it sent before the reset, so it must still claim
/// the records of `x` behind those sends, although nothing on `t3` does.
fn world(fault: Option<HostFault>) -> impl Fn(u64) -> WorldConfig {
    move |_| {
        let mut up = NodeSpec::new(
            "up",
            &[("x", 0), ("y", 0)],
            &["t1", "t2"],
            Behavior::Forward(vec![Output::to("t1", 0), Output::to("t2", 0)]),
        );
        up.rescopes = vec![Rescope {
            at_restart: 1,
            inputs: vec![("x".to_owned(), 0), ("y".to_owned(), 0)],
            sinks: vec!["t1".to_owned(), "t2".to_owned(), "t3".to_owned()],
            behavior: Some(Behavior::Forward(vec![
                Output::to("t1", 0),
                Output::to("t2", 0),
                Output::to("t3", 0),
            ])),
        }];
        up.resets = vec![
            Reset {
                at_restart: 1,
                to: ResetTo::Earliest,
            },
            Reset {
                at_restart: 2,
                to: ResetTo::Middle,
            },
            Reset {
                at_restart: 3,
                to: ResetTo::Middle,
            },
        ];
        let mut c = WorldConfig::new(&[
            ("e", 1),
            ("x", 1),
            ("y", 1),
            ("t1", 1),
            ("t2", 1),
            ("t3", 1),
        ])
        .node(NodeSpec::new(
            "src",
            &[("e", 0)],
            &["x", "y"],
            Behavior::Forward(vec![Output::to("x", 0), Output::to("y", 0)]),
        ))
        .node(up)
        .node(NodeSpec::new(
            "down",
            &[("t1", 0), ("t2", 0)],
            &[],
            Behavior::Sink,
        ))
        .node_joining(
            NodeSpec::new("side", &[("x", 0), ("t3", 0)], &[], Behavior::Sink),
            Join::AfterRestarts("up".to_owned(), 1),
        )
        .edge(EdgeSpec::producer("source", &[("e", 0)]));
        c.budget = Budget {
            edge_ops: 20,
            crashes: 2,
            ..Budget::default()
        };
        c.fault = fault.map(|f| ("up".to_owned(), f));
        c
    }
}

/// Runs the world, then takes `up` down for each reset it declares and
/// runs again, with more input and crashes each time.
fn phased(w: &mut SimWorld<CausalNode>) -> Result<(), WorldFailure> {
    w.run()?;
    while w.node("up").resets_pending() > 0 {
        w.crash("up");
        w.budget_mut().edge_ops += 20;
        w.budget_mut().crashes += 1;
        w.run()?;
    }
    Ok(())
}

#[test]
fn a_reset_node_reprocesses_while_its_receivers_keep_running() {
    let s = sweep_with::<CausalNode>("reset", world(None), phased);
    s.floor("three resets", |s| s.resets == 3)
        .floor("skip marks for records below a reset position", |s| {
            s.reset_skip_marks > 0
        })
        .floor("records held at the gate", held_some)
        .floor("a crash besides the resets", |s| s.crashes > 3);
}

/// A reset that deletes the state, as Kafka Streams' reset deletes its
/// changelogs, restarts the send sequences: the node downstream takes a
/// new record's claim on a sibling as met by the sibling's old namesake
/// and delivers the effect first.
#[test]
fn kit_flags_a_reset_that_deletes_the_state() {
    let results = outcomes::<CausalNode>(world(Some(HostFault::ResetDeletesState)), phased);
    assert_flagged(
        "a reset that deletes the state",
        &results,
        "causal order violated",
    );
}

/// A reset half way along an input with no skip marks leaves sequence
/// claims on the records below the position unmet for ever.
#[test]
fn kit_flags_a_reset_without_skip_marks() {
    let results = outcomes::<CausalNode>(world(Some(HostFault::ResetWithoutSkipMarks)), phased);
    assert_flagged("a reset without skip marks", &results, "never delivered");
}

/// A reset that forgets the past the node delivered: what it sends after
/// the reset to its new sink no longer claims the records of `x` behind
/// what it sent before, and `side`, lagging on `x`, delivers the effect
/// first.
#[test]
fn kit_flags_a_reset_that_forgets_the_delivered_past() {
    let results = outcomes::<CausalNode>(world(Some(HostFault::ResetForgetsPast)), phased);
    assert_flagged(
        "a reset that forgets the delivered past",
        &results,
        "causal order violated",
    );
}
