//! A seed determines its run, and the run digest sees what happened: the
//! order of deliveries and the bytes of every append, not only counts.

use parsley_protocol::{CausalHeaders, CausalNode, Channel, SenderId, SenderTag, VectorClock};
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
    assert_eq!(hashes.len(), 20, "two seeds of 20 produced the same trace");
}

/// Two producers, one record each, and a checker of both channels: the two
/// runs below append the same records and differ only in which one the
/// checker fetches (and so delivers) first.
fn two_channels() -> SimWorld<CausalNode> {
    let config = WorldConfig::new(&[("c1", 1), ("c2", 1)])
        .node(NodeSpec::new(
            "check",
            &[("c1", 0), ("c2", 0)],
            &[],
            Behavior::Sink,
        ))
        .edge(EdgeSpec::producer("p1", &[("c1", 0)]))
        .edge(EdgeSpec::producer("p2", &[("c2", 0)]));
    SimWorld::new(config, 0).expect("world")
}

fn deliver_in_order(first: &str, second: &str) -> SimWorld<CausalNode> {
    let mut w = two_channels();
    w.edge_op("p1");
    w.edge_op("p2");
    for topic in [first, second] {
        let c = w.channel(topic, 0);
        let r = w.step_node("check", NodeAction::Fetch(c)).expect("fetch");
        assert_eq!(r.delivered, 1);
    }
    w
}

#[test]
fn delivery_order_alone_changes_the_trace() {
    let a = deliver_in_order("c1", "c2");
    let b = deliver_in_order("c2", "c1");
    // Same appends, same counts: only the order of the deliveries differs.
    assert_eq!(a.broker.trace(), b.broker.trace());
    assert_eq!(a.stats(), b.stats());
    assert_eq!(a.oracle.deliveries_checked(), b.oracle.deliveries_checked());
    assert_ne!(a.oracle.trace(), b.oracle.trace());
    assert_ne!(a.trace_hash(), b.trace_hash());
    assert_eq!(a.trace_hash(), deliver_in_order("c1", "c2").trace_hash());
}

/// The broker's digest changes with every byte and coordinate of an append.
#[test]
fn append_bytes_change_the_trace() {
    let record = |value: u8, clock_offset: i64, seq: i64, c: Channel| StoredRecord {
        key: Some(vec![1, 2]),
        value: Some(vec![value]),
        timestamp: 0,
        headers: Vec::new(),
        causal: CausalHeaders {
            clock: {
                let mut clock = VectorClock::new();
                clock.claim_offset(c, clock_offset);
                clock
            },
            sender: Some(SenderTag {
                sender: SenderId::from_u128(5),
                seq,
            }),
        },
        oracle_id: 0,
        clock_version: parsley_protocol::clock::ClockVersion::V1,
    };
    let digest = |value: u8, clock_offset: i64, seq: i64, committed: bool, marker: bool| {
        let mut b = SimBroker::new();
        let t = b.create_topic("t", 2);
        let c = Channel::new(t, 0);
        b.append(
            c,
            record(value, clock_offset, seq, Channel::new(t, 1)),
            committed,
        );
        if marker {
            b.append_marker(c, committed);
        }
        b.trace()
    };
    let base = digest(7, 3, 1, true, true);
    assert_eq!(base, digest(7, 3, 1, true, true));
    assert_ne!(base, digest(8, 3, 1, true, true), "value bytes");
    assert_ne!(base, digest(7, 4, 1, true, true), "clock bytes");
    assert_ne!(base, digest(7, 3, 2, true, true), "sequence");
    assert_ne!(base, digest(7, 3, 1, false, true), "aborted");
    assert_ne!(base, digest(7, 3, 1, true, false), "marker");
}
