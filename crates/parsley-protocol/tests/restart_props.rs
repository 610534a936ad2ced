//! A restart at any point behaves as no restart: for random operation
//! sequences, committing and restarting from the store at a random step
//! yields the same deliveries, the same send sequences and the same stamps
//! (minus this node's own sequence claims, which a restart deliberately
//! converts into offset claims through own outputs).

mod common;

use common::*;
use parsley_protocol::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Channel index, offset gap, offset claims (channel index, offset
    /// relative to that channel's next offset), sequence claims (channel,
    /// sender index, seq), sender tag index.
    Record(
        usize,
        i64,
        Vec<(usize, i64)>,
        Vec<(usize, usize, i64)>,
        Option<usize>,
    ),
    Advance(usize, i64),
    Send(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0..3usize,
            0..3i64,
            prop::collection::vec((0..4usize, -3..3i64), 0..3),
            prop::collection::vec((0..3usize, 0..2usize, 1..4i64), 0..2),
            proptest::option::of(0..2usize),
        )
            .prop_map(|(c, g, o, s, t)| Op::Record(c, g, o, s, t)),
        2 => (0..3usize, 0..3i64).prop_map(|(c, g)| Op::Advance(c, g)),
        2 => (0..2usize).prop_map(Op::Send),
    ]
}

const ME: SenderId = SenderId::from_halves(0x11, 0x11);

fn run(ops: &[Op], restart_at: Option<usize>) -> Vec<String> {
    run_from(ops, restart_at, false)
}

/// [`run`], restarting (with `older_layout`) from the store rewritten one
/// key per held record, as the Java library (and this one before pages)
/// writes it.
fn run_from(ops: &[Op], restart_at: Option<usize>, older_layout: bool) -> Vec<String> {
    // Three consumed channels and one far channel, with top-bit ids.
    let chans = [ch(1 << 127, 0), ch(2, 0), ch(3, 1), ch(0xFF << 100, 0)];
    let sinks = [ch(9, 0), ch(9, 1)];
    let senders = [sender(0xA), sender(u128::MAX)];
    let broker = FakeBroker::default().with_topic(sinks[0].topic, 2, 4);
    let mut h = Harness::start(config(ME, &chans[..3], &[sinks[0].topic]), broker);
    let mut next = [0i64; 4];
    let mut seq_of = std::collections::BTreeMap::new();
    let mut log = Vec::new();
    let mut positions = std::collections::BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if restart_at == Some(i) {
            if older_layout {
                h.commit();
                h.store = entry_layout(&h.store);
            }
            h.restart();
            let mut released = coords(&h.init_deliveries);
            // A host re-reports consumer positions after a restart (they are
            // deliberately not persisted): its consumer resumes at the
            // committed position, which is at least the last one reported.
            for (&c, &p) in &positions {
                released.extend(h.advance(chans[c], p));
            }
            log.push(format!("init {released:?}"));
        }
        match op {
            Op::Record(c, gap, oc, sc, tag) => {
                next[*c] += gap;
                let offset = next[*c];
                next[*c] += 1;
                let mut clock = VectorClock::new();
                for &(k, rel) in oc {
                    clock.claim_offset(chans[k], next[k] + rel);
                }
                for &(k, s, q) in sc {
                    clock.claim_sequence(chans[k], senders[s], q);
                }
                let mut r = rec(chans[*c], offset, clock);
                if let Some(s) = tag {
                    let q = seq_of.entry((*c, *s)).or_insert(0i64);
                    *q += 1;
                    r = tagged(r, senders[*s], *q);
                }
                log.push(format!("{:?}", h.feed(r)));
            }
            Op::Advance(c, gap) => {
                next[*c] += gap;
                positions.insert(*c, next[*c]);
                log.push(format!("{:?}", h.advance(chans[*c], next[*c])));
            }
            Op::Send(s) => {
                let mut stamp = h.node.prepare_send(sinks[*s]).unwrap();
                stamp.clock.retain_sequences(|c| c.sender != ME);
                log.push(format!("{stamp:?}"));
            }
        }
        h.commit();
    }
    log.push(format!("held {}", h.node.held_count()));
    // What the store holds is what the node holds: a start from it
    // restores exactly the held records, and an empty queue leaves no
    // held-record key behind (pages and older entries alike are deleted).
    let again = CausalNode::init(h.config.clone(), &h.store, &h.broker).expect("restart");
    assert_eq!(again.report.restored_held, h.node.held_count());
    if h.node.held_count() == 0 {
        let mut held_keys = 0;
        h.store.for_each_state(&mut |key, _| {
            if key.is_ok_and(|k| k.is_held()) {
                held_keys += 1;
            }
        });
        assert_eq!(held_keys, 0);
    }
    log
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn restart_anywhere_is_invisible(ops in prop::collection::vec(op(), 1..40), at in any::<prop::sample::Index>()) {
        let restart_at = at.index(ops.len());
        let straight = run(&ops, None);
        let mut restarted = run(&ops, Some(restart_at));
        // The restarted run logs one extra line: what init released, which
        // must be nothing (state was committed after the last cascade).
        let init_line = restarted.remove(restart_at);
        prop_assert_eq!(init_line, "init []");
        prop_assert_eq!(straight, restarted);
    }

    /// The same from state in the one-key-per-record layout: restored,
    /// released and deleted as if it had been written in pages.
    #[test]
    fn restart_from_the_older_layout_is_invisible(ops in prop::collection::vec(op(), 1..40), at in any::<prop::sample::Index>()) {
        let restart_at = at.index(ops.len());
        let straight = run(&ops, None);
        let mut restarted = run_from(&ops, Some(restart_at), true);
        let init_line = restarted.remove(restart_at);
        prop_assert_eq!(init_line, "init []");
        prop_assert_eq!(straight, restarted);
    }
}
