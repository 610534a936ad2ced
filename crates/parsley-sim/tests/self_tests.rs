//! V8 and V9: the kit must fail a broken protocol and a broken host. If
//! either ever passes its broken subject, every green result means nothing.

mod common;

use std::cell::Cell;
use std::collections::BTreeMap;

use common::*;
use parsley_protocol::{
    BrokerOffsets, CausalHeaders, CausalNode, Channel, Delivery, DeliveryProtocol, InboundRecord,
    Initialized, NodeConfig, ProtocolError, StoreRead, TruncationReport, WriteBatch,
};
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

thread_local! {
    /// The offset claim [`OverClaim`] adds to every stamp.
    static EXTRA_CLAIM: Cell<Option<(Channel, i64)>> = const { Cell::new(None) };
}

/// The real protocol, with one extra offset claim stamped onto every send:
/// a stand-in for a protocol (or host) that names offsets of its own
/// invention.
struct OverClaim(CausalNode);

impl DeliveryProtocol for OverClaim {
    fn init(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
    ) -> Result<Initialized<Self>, ProtocolError> {
        let i = CausalNode::init(config, store, broker)?;
        Ok(Initialized {
            node: OverClaim(i.node),
            deliveries: i.deliveries,
            report: i.report,
        })
    }
    fn on_record(&mut self, record: InboundRecord) -> Result<Vec<Delivery>, ProtocolError> {
        self.0.on_record(record)
    }
    fn position_advance(&mut self, c: Channel, p: i64) -> Result<Vec<Delivery>, ProtocolError> {
        self.0.position_advance(c, p)
    }
    fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError> {
        let mut h = self.0.prepare_send(destination)?;
        if let Some((c, o)) = EXTRA_CLAIM.get() {
            h.clock.claim_offset(c, o);
        }
        Ok(h)
    }
    fn take_writes(&mut self) -> WriteBatch {
        self.0.take_writes()
    }
    fn resume_positions(&self) -> BTreeMap<Channel, i64> {
        self.0.resume_positions().clone()
    }
    fn truncate_to_log_starts(
        &mut self,
        broker: &dyn BrokerOffsets,
    ) -> Result<TruncationReport, ProtocolError> {
        self.0.truncate_to_log_starts(broker)
    }
    fn held_count(&self) -> usize {
        self.0.held_count()
    }
}

/// A stage whose stamps carry one extra claim on `gone:0`, which had three
/// offsets (two records and a marker) before it was deleted.
fn over_claiming(offset: i64) -> Result<WorldStats, WorldFailure> {
    let config = WorldConfig::new(&[("in", 1), ("out", 1), ("gone", 1)])
        .node(NodeSpec::new(
            "stage",
            &[("in", 0)],
            &["out"],
            Behavior::Forward(vec![Output::to("out", 0)]),
        ))
        .node(NodeSpec::new("check", &[("out", 0)], &[], Behavior::Sink))
        .edge(EdgeSpec::producer("source", &[("in", 0)]));
    let mut w = SimWorld::<OverClaim>::new(config, 0)?;
    let gone = w.channel("gone", 0);
    for _ in 0..2 {
        let record = StoredRecord {
            key: None,
            value: None,
            timestamp: 0,
            headers: Vec::new(),
            causal: CausalHeaders::default(),
            oracle_id: usize::MAX,
            clock_version: parsley_protocol::clock::ClockVersion::V1,
        };
        w.broker.append(gone, record, true);
    }
    w.broker.append_marker(gone, true);
    w.broker.destroy_topic(gone.topic);
    EXTRA_CLAIM.set(Some((gone, offset)));
    w.budget_mut().edge_ops = 5;
    let r = w.run();
    EXTRA_CLAIM.set(None);
    r
}

/// V9 for H4: the reference host refuses to append a stamp that claims an
/// offset its topic never had, including on a deleted topic, and accepts
/// one that names real history of a deleted topic (harmless: nobody can
/// resolve it, and a sweep drops it).
#[test]
fn kit_flags_claims_on_offsets_that_never_existed() {
    let stats = over_claiming(2).expect("a claim on a deleted topic's real history is fine");
    assert!(stats.sends >= 5, "{stats:?}");
    let err = over_claiming(3).expect_err("a claim past the deleted topic's end");
    assert!(
        err.message.contains("node stage: stamp claims") && err.message.contains("ended at 3"),
        "{err}"
    );
}
