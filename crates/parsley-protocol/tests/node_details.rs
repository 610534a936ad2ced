//! Details of the node that no other suite pinned down, each one found by a
//! mutant that survived them (see docs/mutation.md): the held count a
//! departing input reports, what `truncate` returns and that a stamp made
//! after it no longer carries what it removed, and the accessors the host
//! core reads (widths, marks, scope).

mod common;

use common::*;
use parsley_protocol::*;

const ME: u128 = 0xD37A;

#[test]
fn a_departing_input_reports_only_what_it_still_holds() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    // Two records held on b; the first is released, so the queue's head
    // index is 1 and its tail 2: one record still held.
    assert!(h.feed(rec(b, 0, offsets(&[(a, 0)]))).is_empty());
    assert!(h.feed(rec(b, 1, offsets(&[(a, 1)]))).is_empty());
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0), (b, 0)]);
    assert_eq!(h.node.held_count(), 1);
    let err = h.restart_with(config(sender(ME), &[a], &[])).unwrap_err();
    assert!(
        matches!(err, ProtocolError::HeldRecordsOnDepartingInput { channel, held: 1 } if channel == b),
        "{err}"
    );
}

#[test]
fn restored_held_records_give_back_their_room_once_released_while_others_arrive() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let c = ch(3, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b, c], &[]), FakeBroker::default());
    for offset in 0..5_000 {
        assert!(h.feed(rec(b, offset, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    h.restart();
    assert_eq!(h.node.held_count(), 5_000);
    assert!(h.node.held_capacity() >= 5_000);
    // More records queue behind the restored ones, waiting on another cause.
    for offset in 5_000..5_010 {
        assert!(h.feed(rec(b, offset, offsets(&[(c, 0)]))).is_empty());
    }
    // The restored run goes; the queue still holds the ten.
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())).len(), 5_001);
    assert_eq!(h.node.held_count(), 10);
    assert!(
        h.node.held_capacity() <= 2 * 64,
        "room for {} records kept after the restored run was released",
        h.node.held_capacity()
    );
    // And they come out in order after it.
    let out = h.feed(rec(c, 0, VectorClock::new()));
    assert_eq!(out.len(), 11);
    assert_eq!(
        out[1..],
        (5_000..5_010).map(|o| (b, o)).collect::<Vec<_>>()[..]
    );
}

#[test]
fn a_drained_queue_gives_back_the_room_a_long_hold_grew_it_to() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for offset in 0..10_000 {
        assert!(h.feed(rec(b, offset, offsets(&[(a, 0)]))).is_empty());
    }
    assert!(h.node.held_capacity() >= 10_000);
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())).len(), 10_001);
    assert_eq!(h.node.held_count(), 0);
    assert!(
        h.node.held_capacity() <= 2 * 64,
        "room for {} records kept after the queue drained",
        h.node.held_capacity()
    );
}

#[test]
fn every_send_between_two_deliveries_stamps_the_same_base() {
    let a = ch(1, 0);
    let far = ch(5, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[x.topic]), broker);
    h.feed(rec(a, 0, offsets(&[(far, 20)])));
    // The first send computes the base and keeps it, the next two start
    // from the kept one: all three carry the same claims.
    let stamps: Vec<_> = (0..3).map(|_| h.node.prepare_send(x).unwrap()).collect();
    assert_eq!(stamps[0].clock.offset(a), Some(0));
    assert_eq!(stamps[0].clock.offset(far), Some(20));
    for s in &stamps[1..] {
        assert_eq!(s.clock, stamps[0].clock);
    }
    let seqs: Vec<i64> = stamps
        .iter()
        .filter_map(|s| s.sender.map(|t| t.seq))
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    // The next delivery moves the base.
    h.feed(rec(a, 1, offsets(&[(far, 21)])));
    let next = h.node.prepare_send(x).unwrap();
    assert_eq!(next.clock.offset(a), Some(1));
    assert_eq!(next.clock.offset(far), Some(21));
    h.feed(rec(a, 2, VectorClock::new()));
    assert_eq!(h.node.prepare_send(x).unwrap().clock.offset(a), Some(2));
}

#[test]
fn truncate_counts_what_it_removed_and_the_next_stamp_leaves_it_out() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let far = ch(5, 0);
    let other = ch(6, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[x.topic]), broker);
    // Advertised on a: far <= 20 and other <= 4; on b: far <= 30.
    h.feed(rec(a, 0, offsets(&[(far, 20), (other, 4)])));
    h.feed(rec(b, 0, offsets(&[(far, 30)])));
    // Two stamps from the base the node now keeps.
    assert_eq!(h.node.prepare_send(x).unwrap().clock.offset(other), Some(4));
    assert_eq!(h.node.prepare_send(x).unwrap().clock.offset(other), Some(4));
    // Stability covers far up to 25 and other up to 4: the entries far <= 20
    // and other <= 4 go (two), far <= 30 stays.
    let removed = h.node.truncate(&offsets(&[(far, 25), (other, 4)]));
    assert_eq!(removed, 2);
    let stamp = h.node.prepare_send(x).unwrap();
    assert_eq!(stamp.clock.offset(other), None, "the stamp left it out");
    assert_eq!(stamp.clock.offset(far), Some(30));
    // Nothing more to remove.
    assert_eq!(h.node.truncate(&offsets(&[(far, 25), (other, 4)])), 0);
}

#[test]
fn stamp_side_width_counts_the_union_of_the_stamp_side_clocks() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let far = ch(5, 0);
    let near = ch(6, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    assert_eq!(h.node.stamp_side_width(), (0, 0));
    h.feed(rec(a, 0, offsets(&[(far, 20), (near, 1)])));
    // The same channel advertised on another input counts once.
    h.feed(rec(b, 0, offsets(&[(far, 30)])));
    h.feed(rec(b, 1, seqs(&[(near, sender(7), 2)])));
    assert_eq!(h.node.stamp_side_width(), (2, 1));
}

#[test]
fn the_delivered_mark_is_the_last_delivered_sequence_and_its_offset() {
    let a = ch(1, 0);
    let s = sender(0xB0B);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    assert_eq!(h.node.delivered_mark(a, s), None);
    h.feed(tagged(rec(a, 0, VectorClock::new()), s, 1));
    h.feed(tagged(rec(a, 3, VectorClock::new()), s, 2));
    assert_eq!(
        h.node.delivered_mark(a, s),
        Some(DeliveredMark { seq: 2, offset: 3 })
    );
    assert_eq!(h.node.delivered_mark(a, sender(0xC0C)), None);
}

#[test]
fn the_scope_accessors_report_inputs_sinks_carried_ancestry_and_own_outputs() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 2, 7);
    let mut h = Harness::start(config(sender(ME), &[b, a], &[x.topic]), broker);
    assert_eq!(h.node.inputs().collect::<Vec<_>>(), vec![a, b]);
    assert_eq!(
        h.node.sinks().iter().copied().collect::<Vec<_>>(),
        vec![x.topic]
    );
    assert_eq!(
        h.node.own_outputs().offset(Channel::new(x.topic, 1)),
        Some(6)
    );
    assert!(h.node.carried_ancestry().offsets().is_empty());
    // b departs with its delivered past: that moves into carried ancestry.
    h.feed(rec(b, 4, VectorClock::new()));
    h.restart_with(config(sender(ME), &[a], &[x.topic]))
        .unwrap();
    assert_eq!(h.node.inputs().collect::<Vec<_>>(), vec![a]);
    assert_eq!(h.node.carried_ancestry().offset(b), Some(4));
}

/// A store that hands its entries over in reverse key order (the trait
/// promises no order).
struct Reversed(MemStore);

impl StoreRead for Reversed {
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, &[u8])) {
        let entries: Vec<(String, &[u8])> = self.0.iter().collect();
        for (k, v) in entries.into_iter().rev() {
            f(&k, v);
        }
    }
}

#[test]
fn restore_puts_held_records_back_in_order_whatever_order_the_store_reads_in() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for offset in 0..3 {
        assert!(h.feed(rec(b, offset, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    let init = CausalNode::init(h.config.clone(), &Reversed(h.store.clone()), &h.broker).unwrap();
    assert_eq!(init.report.restored_held, 3);
    let mut node = init.node;
    let released = coords(&node.on_record(rec(a, 0, VectorClock::new())).unwrap());
    assert_eq!(released, vec![(a, 0), (b, 0), (b, 1), (b, 2)]);
}

#[test]
fn a_held_entry_below_the_queue_head_is_corrupt() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    assert!(h.feed(rec(b, 0, offsets(&[(a, 0)]))).is_empty());
    assert!(h.feed(rec(b, 1, offsets(&[(a, 1)]))).is_empty());
    h.feed(rec(a, 0, VectorClock::new()));
    h.commit();
    // The queue's window is 1..2 now; an entry at index 0 is not ours (in
    // the one-entry-per-record layout; pages have their own test in
    // `fail_closed.rs`).
    let mut store = entry_layout(&h.store);
    let kept = store
        .get(&StateKey::QueueEntry(b, 1).to_string())
        .unwrap()
        .to_vec();
    let stray = StateKey::QueueEntry(b, 0).to_string();
    store.insert_raw(&stray, kept);
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::CorruptState(ref c) if c.key == stray),
        "{err}"
    );
    // Without it, the store starts.
    assert!(CausalNode::init(h.config.clone(), &h.store, &h.broker).is_ok());
}

/// Only the node's own claims are dropped from a stamp (on the destination,
/// and echoes of an earlier incarnation's sends): another sender's
/// sequence claim on the same channel travels on, even to that channel.
#[test]
fn a_stamp_keeps_other_senders_claims_on_channels_the_node_writes() {
    let a = ch(1, 0);
    let x = ch(9, 0);
    let q = sender(0x0ACE);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 0)
        .with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[x.topic]), broker);
    // A first incarnation sends twice to X/0.
    h.node.prepare_send(x).unwrap();
    h.node.prepare_send(x).unwrap();
    h.broker.set_end(x, 3);
    h.restart();
    // Q's first send to X/0 is a cause of A@0.
    assert_eq!(h.feed(rec(a, 0, seqs(&[(x, q, 1)]))), vec![(a, 0)]);
    let stamp = h.node.prepare_send(x).unwrap();
    assert_eq!(stamp.clock.sequence(x, q), Some(1), "{:?}", stamp.clock);
    assert_eq!(stamp.clock.sequence(x, sender(ME)), None);
}
