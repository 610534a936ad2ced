//! V8 and V9: the kit must fail a broken protocol and a broken host. If
//! either ever passes its broken subject, every green result means nothing.

mod common;

use common::*;
use parsley_protocol::CausalNode;
use parsley_sim::*;

/// A base topic written transactionally (a commit marker after every
/// record), a stage deriving from it, and a filtering relay that consumes
/// both, so its stamps claim the base's markers; a checker consumes all
/// three.
fn race(fault: Option<(&'static str, HostFault)>) -> impl Fn(u64) -> WorldConfig {
    move |_| {
        let mut c = WorldConfig::new(&[("base", 1), ("derived", 1), ("final", 1)])
            .node(NodeSpec::new(
                "enrich",
                &[("base", 0)],
                &["derived"],
                Behavior::Forward(vec![Output::to("derived", 0)]),
            ))
            .node(NodeSpec::new(
                "relay",
                &[("derived", 0), ("base", 0)],
                &["final"],
                Behavior::Filter {
                    keep_one_in: 3,
                    outputs: vec![Output::to("final", 0)],
                },
            ))
            .node(NodeSpec::new(
                "check",
                &[("base", 0), ("derived", 0), ("final", 0)],
                &[],
                Behavior::Sink,
            ))
            .edge(EdgeSpec {
                transactional: true,
                ..EdgeSpec::producer("source", &[("base", 0)])
            });
        c.budget = Budget {
            edge_ops: 30,
            crashes: 10,
            ..Budget::default()
        };
        c.fault = fault.map(|(node, f)| (node.to_owned(), f));
        c
    }
}

fn run_to_drain<P: parsley_protocol::DeliveryProtocol>(
    w: &mut SimWorld<P>,
) -> Result<(), WorldFailure> {
    w.run().map(|_| ())
}

fn failures(results: &[Result<WorldStats, WorldFailure>], needle: &str) -> usize {
    results
        .iter()
        .filter(|r| matches!(r, Err(f) if f.message.contains(needle)))
        .count()
}

/// V8: a protocol that delivers on arrival, ignoring claims, is caught, and
/// caught as what it is: a causal-order violation.
#[test]
fn oracle_flags_the_eager_protocol() {
    let results = outcomes::<EagerProtocol>(race(None), run_to_drain);
    let caught = failures(&results, "causal order violated");
    eprintln!(
        "eager protocol: causal violation flagged in {caught}/{} seeds",
        *SEEDS
    );
    assert!(
        caught >= seed_floor(),
        "the oracle flagged the eager protocol in only {caught} seeds"
    );
    // The same worlds with the real protocol are clean.
    let clean = outcomes::<CausalNode>(race(None), run_to_drain);
    assert!(
        clean.iter().all(Result::is_ok),
        "{:?}",
        clean.iter().find(|r| r.is_err())
    );
}

/// V9: a host that commits state and positions while its sends abort is
/// caught.
#[test]
fn kit_flags_broken_step_atomicity() {
    let results = outcomes::<CausalNode>(
        race(Some(("relay", HostFault::StepAtomicity))),
        run_to_drain,
    );
    // Records delivered in the aborted step are skipped for good: either a
    // later record from the same producer arrives without its predecessor
    // (causal order) or the skipped record is missing at drain.
    let caught =
        failures(&results, "causal order violated") + failures(&results, "never delivered");
    eprintln!("step-atomicity fault: flagged in {caught}/{} seeds", *SEEDS);
    assert!(
        caught >= seed_floor(),
        "a non-atomic host was flagged in only {caught} seeds"
    );
}

/// V9: a host that never reports the consumer position is caught: claims on
/// trailing markers can never be covered, so records stay held.
#[test]
fn kit_flags_withheld_position_advances() {
    let results = outcomes::<CausalNode>(
        race(Some(("check", HostFault::WithholdPositionAdvance))),
        run_to_drain,
    );
    let caught = failures(&results, "never delivered");
    eprintln!(
        "withheld position advances: flagged in {caught}/{} seeds",
        *SEEDS
    );
    assert!(
        caught >= seed_floor(),
        "withheld position advances flagged in only {caught} seeds"
    );
}

/// V9: a host that reports a position before handing over the records below
/// it is caught (the protocol takes them for replays and drops them).
#[test]
fn kit_flags_early_position_reports() {
    let results = outcomes::<CausalNode>(
        race(Some(("check", HostFault::EarlyPositionReport))),
        run_to_drain,
    );
    let caught = failures(&results, "never delivered") + failures(&results, "refused");
    eprintln!(
        "early position reports: flagged in {caught}/{} seeds",
        *SEEDS
    );
    assert!(
        caught >= seed_floor(),
        "early position reports flagged in only {caught} seeds"
    );
}
