//! Resets (`parsley_protocol::reset`) leave a state the node starts from:
//! a node that never committed gets nothing written, and a reset naming a
//! channel the recorded state does not consume is refused before anything
//! is written. Either way, a reset can never leave a task that does not
//! start again.

mod common;

use std::collections::BTreeMap;

use common::*;
use parsley_protocol::reset::{ResetError, ResetPoint, reset_writes};
use parsley_protocol::*;

const ME: u128 = 0xBEEF;
/// The stage upstream, whose tagged records lie below the reset position.
const UP: u128 = 0x5E17;

fn below(position: i64, seq: i64) -> ResetPoint {
    ResetPoint {
        position,
        below: BTreeMap::from([(sender(UP), seq)]),
    }
}

fn entries(store: &MemStore) -> usize {
    let mut n = 0;
    store.for_each_state(&mut |_, _| n += 1);
    n
}

#[test]
fn a_node_that_never_committed_gets_nothing_and_starts_at_its_position() {
    let a = ch(1, 0);
    // It started and failed on its first record: nothing was committed,
    // so its store holds no scope (nor anything else).
    let h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    assert_eq!(entries(&h.store), 0);

    let points = BTreeMap::from([(a, below(3, 3))]);
    let batch = reset_writes(&h.store, &points).unwrap();
    assert!(batch.is_empty(), "{batch:?}");
    // A second run has nothing to write either.
    assert!(reset_writes(&h.store, &points).unwrap().is_empty());

    // The node starts (a skip mark without a scope would be refused here),
    // and the first record at the position seeds the channel: it and the
    // next are delivered, the next claiming the upstream's record below.
    let mut h = Harness::start_from(h.config.clone(), FakeBroker::default(), h.store.clone());
    let first = tagged(rec(a, 3, VectorClock::new()), sender(UP), 4);
    assert_eq!(h.feed(first), vec![(a, 3)]);
    let next = tagged(rec(a, 4, seqs(&[(a, sender(UP), 3)])), sender(UP), 5);
    assert_eq!(h.feed(next), vec![(a, 4)]);
    h.restart();
}

#[test]
fn a_point_on_a_channel_outside_the_recorded_scope_is_refused() {
    let a = ch(1, 0);
    let added = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    h.feed(rec(a, 0, VectorClock::new()));
    h.commit();
    // A description from a build that added an input names a channel the
    // state was not written for.
    let points = BTreeMap::from([(a, below(1, 1)), (added, below(5, 2))]);
    let err = reset_writes(&h.store, &points).unwrap_err();
    assert!(
        matches!(err, ResetError::NotAnInput { channel, .. } if channel == added),
        "{err}"
    );
    assert!(err.to_string().contains(&added.to_string()), "{err}");
    // Even with nothing below its position, the point is refused: the
    // state cannot say where that input would start.
    let points = BTreeMap::from([(added, ResetPoint::default())]);
    assert!(matches!(
        reset_writes(&h.store, &points),
        Err(ResetError::NotAnInput { .. })
    ));
}

#[test]
fn skip_marks_written_into_a_recorded_scope_restore() {
    let a = ch(1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    h.feed(tagged(rec(a, 0, VectorClock::new()), sender(UP), 1));
    h.commit();
    let batch = reset_writes(&h.store, &BTreeMap::from([(a, below(9, 7))])).unwrap();
    h.store.apply(&batch);
    assert_eq!(
        h.store.get_state(StateKey::SkipMark(a, sender(UP))),
        Some(&store::encode_pair(7, 9)[..])
    );
    let mut h = Harness::start_from(h.config.clone(), FakeBroker::default(), h.store.clone());
    // A claim on the upstream's sequence 7, below the position, is met by
    // the mark; the record at the position is delivered.
    let at = tagged(rec(a, 9, seqs(&[(a, sender(UP), 7)])), sender(UP), 8);
    assert_eq!(h.feed(at), vec![(a, 9)]);
}
