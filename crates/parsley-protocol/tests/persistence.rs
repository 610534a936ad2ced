//! Restarts pinned to each persisted fact.
//!
//! Each test runs one script twice: straight through, and with a commit and
//! a restart from the committed store at the point where exactly one fact is
//! what carries the behaviour across. Both runs must produce the same
//! deliveries and the same stamps (sinks' end offsets do not move between
//! the two inits, so own outputs are equal in both runs).

mod common;

use common::*;
use parsley_protocol::*;

const ME: u128 = 0xA11CE;

#[derive(Clone)]
enum Step {
    Feed(InboundRecord),
    Advance(Channel, i64),
    /// Stamp a send and record the stamp's clock and tag.
    Send(Channel),
    Restart,
}

#[derive(Debug, PartialEq)]
enum Seen {
    Delivered(Vec<(Channel, i64)>),
    Stamp(CausalHeaders),
}

fn run(
    cfg: &NodeConfig,
    broker: impl Fn() -> FakeBroker,
    steps: &[Step],
    restarts: bool,
) -> Vec<Seen> {
    let mut h = Harness::start(cfg.clone(), broker());
    let mut seen = Vec::new();
    for step in steps {
        match step.clone() {
            Step::Feed(r) => seen.push(Seen::Delivered(h.feed(r))),
            Step::Advance(c, p) => seen.push(Seen::Delivered(h.advance(c, p))),
            Step::Send(c) => seen.push(Seen::Stamp(h.node.prepare_send(c).unwrap())),
            Step::Restart if restarts => {
                h.restart();
                assert!(h.init_deliveries.is_empty());
            }
            Step::Restart => {
                h.commit();
            }
        }
    }
    seen
}

fn same_with_and_without_restart(
    cfg: &NodeConfig,
    broker: impl Fn() -> FakeBroker,
    steps: &[Step],
) -> Vec<Seen> {
    let straight = run(cfg, &broker, steps, false);
    let restarted = run(cfg, &broker, steps, true);
    assert_eq!(straight, restarted);
    straight
}

#[test]
fn frontier_survives_restart() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let cfg = config(sender(ME), &[a, b], &[]);
    let seen = same_with_and_without_restart(
        &cfg,
        FakeBroker::default,
        &[
            Step::Feed(rec(a, 3, VectorClock::new())),
            Step::Feed(rec(a, 5, VectorClock::new())),
            Step::Restart,
            // Replay of a delivered offset: dropped. (Only the frontier
            // knows it was delivered.)
            Step::Feed(rec(a, 5, VectorClock::new())),
            // A claim on A@5 is met at once.
            Step::Feed(rec(b, 0, offsets(&[(a, 5)]))),
            // A claim on A@6 waits.
            Step::Feed(rec(b, 1, offsets(&[(a, 6)]))),
            Step::Feed(rec(a, 6, VectorClock::new())),
        ],
    );
    assert_eq!(
        seen,
        vec![
            Seen::Delivered(vec![(a, 3)]),
            Seen::Delivered(vec![(a, 5)]),
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![(b, 0)]),
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![(a, 6), (b, 1)]),
        ]
    );
}

#[test]
fn hold_queue_survives_restart() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let cfg = config(sender(ME), &[a, b], &[]);
    let seen = same_with_and_without_restart(
        &cfg,
        FakeBroker::default,
        &[
            Step::Feed(rec(a, 0, offsets(&[(b, 2)]))),
            Step::Feed(rec(a, 1, VectorClock::new())),
            Step::Feed(rec(a, 4, offsets(&[(b, 3)]))),
            Step::Restart,
            Step::Feed(rec(b, 2, VectorClock::new())),
            Step::Advance(b, 4),
        ],
    );
    assert_eq!(
        seen,
        vec![
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![(b, 2), (a, 0), (a, 1)]),
            Seen::Delivered(vec![(a, 4)]),
        ]
    );
}

#[test]
fn send_sequences_survive_restart() {
    let a = ch(1, 0);
    let x = ch(9, 0);
    let cfg = config(sender(ME), &[a], &[x.topic]);
    let broker = || FakeBroker::default().with_topic(x.topic, 1, 0);
    let straight = run(
        &cfg,
        broker,
        &[Step::Send(x), Step::Send(x), Step::Restart, Step::Send(x)],
        false,
    );
    let restarted = run(
        &cfg,
        broker,
        &[Step::Send(x), Step::Send(x), Step::Restart, Step::Send(x)],
        true,
    );
    let seqs = |seen: &[Seen]| -> Vec<i64> {
        seen.iter()
            .filter_map(|s| match s {
                Seen::Stamp(h) => h.sender.map(|t| t.seq),
                Seen::Delivered(_) => None,
            })
            .collect()
    };
    assert_eq!(seqs(&straight), vec![1, 2, 3]);
    assert_eq!(seqs(&restarted), seqs(&straight));
}

#[test]
fn delivered_sequences_survive_restart() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let s = sender(0x5E);
    let cfg = config(sender(ME), &[a, b], &[]);
    let seen = same_with_and_without_restart(
        &cfg,
        FakeBroker::default,
        &[
            Step::Feed(tagged(rec(b, 10, VectorClock::new()), s, 5)),
            Step::Restart,
            // Met by the restored mark alone.
            Step::Feed(rec(a, 0, seqs(&[(b, s, 5)]))),
            Step::Feed(rec(a, 1, seqs(&[(b, s, 6)]))),
            Step::Feed(tagged(rec(b, 12, VectorClock::new()), s, 6)),
        ],
    );
    assert_eq!(
        seen,
        vec![
            Seen::Delivered(vec![(b, 10)]),
            Seen::Delivered(vec![(a, 0)]),
            Seen::Delivered(vec![]),
            Seen::Delivered(vec![(b, 12), (a, 1)]),
        ]
    );
}

#[test]
fn advertised_clocks_survive_restart() {
    let a = ch(1, 0);
    let far = ch(5, 0);
    let x = ch(9, 0);
    let s = sender(0x5E);
    let cfg = config(sender(ME), &[a], &[x.topic]);
    let broker = || FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut far_claims = offsets(&[(far, 9)]);
    far_claims.claim_sequence(far, s, 4);
    let seen = same_with_and_without_restart(
        &cfg,
        broker,
        &[
            Step::Feed(rec(a, 0, far_claims.clone())),
            Step::Restart,
            Step::Send(x),
        ],
    );
    let Seen::Stamp(stamp) = &seen[1] else {
        panic!("expected a stamp")
    };
    assert_eq!(stamp.clock.offset(far), Some(9));
    assert_eq!(stamp.clock.sequence(far, s), Some(4));
}

#[test]
fn carried_ancestry_survives_restart() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[x.topic]), broker);
    h.feed(rec(b, 4, offsets(&[(ch(5, 0), 2)])));
    // Shrink: B leaves; its frontier and advertised clock become carried.
    h.restart_with(config(sender(ME), &[a], &[x.topic]))
        .unwrap();
    assert_eq!(h.report.shrunk, vec![b]);
    let before = h.node.prepare_send(x).unwrap().clock;
    assert_eq!(before.offset(b), Some(4));
    assert_eq!(before.offset(ch(5, 0)), Some(2));
    // A second restart without scope change: only `ca` carries it now.
    h.restart();
    assert!(h.report.shrunk.is_empty());
    let after = h.node.prepare_send(x).unwrap().clock;
    assert_eq!(after.offset(b), Some(4));
    assert_eq!(after.offset(ch(5, 0)), Some(2));
    assert!(h.store.get("ca").is_some());
}

/// V10: what a restart restores is the record that was fetched: key bytes,
/// value bytes, timestamp, sender tag, clock and other headers, exactly.
#[test]
fn held_record_payload_survives_restart_exactly() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let s = sender(0x5E);
    let originals = vec![
        InboundRecord {
            channel: a,
            offset: 3,
            timestamp: -5,
            key: Some(vec![0, 1, 2, 255]),
            value: Some(b"payload \x00 with zero".to_vec()),
            headers: vec![
                Header::new("trace", b"abc".to_vec()),
                Header {
                    name: "n".into(),
                    value: None,
                },
            ],
            causal: CausalHeaders {
                clock: offsets(&[(b, 0)]),
                sender: Some(SenderTag { sender: s, seq: 8 }),
            },
        },
        InboundRecord {
            channel: a,
            offset: 4,
            timestamp: i64::MAX,
            key: None,
            value: None,
            headers: vec![],
            causal: CausalHeaders::default(),
        },
        InboundRecord {
            channel: a,
            offset: 9,
            timestamp: 0,
            key: Some(vec![]),
            value: Some(vec![]),
            headers: vec![Header::new("h", vec![]), Header::new("h", vec![1])],
            causal: CausalHeaders {
                clock: seqs(&[(b, s, 1)]),
                sender: None,
            },
        },
    ];
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for r in &originals {
        assert!(h.node.on_record(r.clone()).unwrap().is_empty());
    }
    h.restart();
    assert_eq!(h.report.restored_held, 3);
    let out = h
        .node
        .on_record(tagged(rec(b, 0, VectorClock::new()), s, 1))
        .unwrap();
    let released: Vec<Delivery> = out.into_iter().filter(|d| d.record.channel == a).collect();
    assert!(released.iter().all(|d| d.was_held));
    assert_eq!(
        released.into_iter().map(|d| d.record).collect::<Vec<_>>(),
        originals
    );
}

/// A crash between init and the first commit re-runs the same
/// reconciliation: init writes are idempotent.
#[test]
fn init_is_idempotent() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 3);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[x.topic]), broker);
    h.feed(rec(b, 4, VectorClock::new()));
    h.commit();
    let committed = h.store.clone();
    let shrink = config(sender(ME), &[a], &[x.topic]);
    let first = CausalNode::init(shrink.clone(), &committed, &h.broker)
        .unwrap()
        .node
        .take_writes();
    let second = CausalNode::init(shrink, &committed, &h.broker)
        .unwrap()
        .node
        .take_writes();
    assert_eq!(first, second);
    assert!(!first.is_empty());
}

/// Scope growth: a joining input seeds at what is carried for it, and the
/// host is told to resume one past the seed; replays below are dropped.
#[test]
fn growth_seeds_from_carried_ancestry() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let fresh = ch(3, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.feed(rec(b, 7, VectorClock::new()));
    h.restart_with(config(sender(ME), &[a], &[])).unwrap();
    h.restart_with(config(sender(ME), &[a, b, fresh], &[]))
        .unwrap();
    assert_eq!(h.report.grown, vec![b, fresh]);
    assert_eq!(
        h.node.resume_positions().clone(),
        [(b, 8)].into_iter().collect()
    );
    assert_eq!(h.node.frontier(b), Some(7));
    assert_eq!(h.node.frontier(fresh), Some(-1));
    assert!(h.feed(rec(b, 6, VectorClock::new())).is_empty());
    assert_eq!(h.node.stats().replays_skipped_total, 1);
    assert_eq!(h.feed(rec(b, 8, VectorClock::new())), vec![(b, 8)]);
}

/// A rescope that removes the only unmet claim of a restored record releases
/// it at init, as an init delivery.
#[test]
fn shrink_can_release_restored_records_at_init() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    assert!(h.feed(rec(a, 0, offsets(&[(b, 5)]))).is_empty());
    h.restart_with(config(sender(ME), &[a], &[])).unwrap();
    assert_eq!(coords(&h.init_deliveries), vec![(a, 0)]);
    assert!(h.init_deliveries[0].was_held);
}

mod key_text {
    use parsley_protocol::{Channel, SenderId, StateKey, TopicId};
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = StateKey> {
        let channel =
            (any::<u128>(), any::<i32>()).prop_map(|(t, p)| Channel::new(TopicId::from_u128(t), p));
        let sender = any::<u128>().prop_map(SenderId::from_u128);
        prop_oneof![
            Just(StateKey::Scope),
            Just(StateKey::CarriedAncestry),
            channel.clone().prop_map(StateKey::Frontier),
            channel.clone().prop_map(StateKey::ChannelClock),
            channel.clone().prop_map(StateKey::QueueMeta),
            (channel.clone(), any::<i64>()).prop_map(|(c, i)| StateKey::QueueEntry(c, i)),
            (channel.clone(), any::<i64>()).prop_map(|(c, i)| StateKey::QueuePage(c, i)),
            channel.clone().prop_map(StateKey::SendSeq),
            (channel.clone(), sender.clone()).prop_map(|(c, s)| StateKey::DeliveredSeq(c, s)),
            (channel, sender).prop_map(|(c, s)| StateKey::SkipMark(c, s)),
        ]
    }

    proptest! {
        /// The hand-built key text the write path uses is exactly the
        /// `Display` spelling (the one spelling restore accepts).
        #[test]
        fn the_fast_key_text_is_the_display_text(k in key()) {
            prop_assert_eq!(k.to_key(), k.to_string());
        }
    }

    #[test]
    fn a_queue_index_in_upper_case_is_not_a_key() {
        let c = Channel::new(TopicId::from_u128(0xab), 0);
        let lower = StateKey::QueueEntry(c, 0xab).to_string();
        assert!(lower.parse::<StateKey>().is_ok());
        let upper = lower.replace("/e/00000000000000ab", "/e/00000000000000AB");
        assert_ne!(upper, lower);
        assert!(upper.parse::<StateKey>().is_err(), "{upper}");
    }

    #[test]
    fn edge_values_spell_the_same() {
        for p in [0, 9, 10, i32::MAX, i32::MIN, -1] {
            for t in [0u128, u128::MAX, 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef] {
                let c = Channel::new(TopicId::from_u128(t), p);
                for k in [
                    StateKey::Frontier(c),
                    StateKey::QueueEntry(c, -1),
                    StateKey::QueueEntry(c, 0),
                    StateKey::QueuePage(c, -1),
                    StateKey::QueuePage(c, i64::MAX),
                ] {
                    assert_eq!(k.to_key(), k.to_string());
                }
            }
        }
    }
}
