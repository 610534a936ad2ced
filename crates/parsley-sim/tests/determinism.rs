//! A seed determines its run.

use parsley_protocol::CausalNode;
use parsley_sim::*;

fn world() -> WorldConfig {
    let mut ticker = NodeSpec::new(
        "ticker",
        &[("in", 0), ("ticks", 0)],
        &["ticks", "out"],
        Behavior::Forward(vec![Output::round_robin("out")]),
    );
    ticker.tick = Some(TickSpec {
        topic: "ticks".into(),
        partition: 0,
        outputs: vec![Output::to("out", 1)],
    });
    let mut c = WorldConfig::new(&[("in", 1), ("ticks", 1), ("out", 2)])
        .node(ticker)
        .node(NodeSpec::new(
            "check",
            &[("in", 0), ("out", 0), ("out", 1)],
            &[],
            Behavior::Sink,
        ))
        .edge(EdgeSpec::producer("source", &[("in", 0)]));
    c.budget = Budget {
        edge_ops: 40,
        ticks: 10,
        crashes: 5,
        retention: 5,
        sweeps: 5,
        ..Budget::default()
    };
    c
}

fn run(seed: u64) -> (u64, WorldStats) {
    let mut w = SimWorld::<CausalNode>::new(world(), seed).expect("world");
    let stats = w.run().expect("run");
    (w.trace_hash(), stats)
}

#[test]
fn same_seed_same_trace() {
    for seed in [0, 1, 42, 1_000_003] {
        assert_eq!(run(seed), run(seed), "seed {seed} is not deterministic");
    }
}

#[test]
fn different_seeds_different_traces() {
    let hashes: std::collections::BTreeSet<u64> = (0..20).map(|s| run(s).0).collect();
    assert!(
        hashes.len() >= 18,
        "only {} distinct traces over 20 seeds",
        hashes.len()
    );
}
