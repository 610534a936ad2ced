//! Scope growth and a node's own earlier sends: the constructions behind
//! two review findings.
//!
//! * A redeploy that turns a sink into an input (or adds a kept sink as an
//!   input) must not wedge a record whose only unmet claim is a sequence
//!   claim on the node's own committed sends: what the restart seeded
//!   already covers them.
//! * A joining input must skip everything the node's stamps already claim
//!   as past on it, not only what departed inputs and former sinks left in
//!   carried ancestry; otherwise a cause is delivered after its effect.

mod common;

use common::*;
use parsley_protocol::*;

const ME: u128 = 0x5E1F;
const OTHER: u128 = 0x0BEE;

struct Topics {
    a: Channel,
    t: Channel,
    g: Channel,
}

fn topics() -> Topics {
    Topics {
        a: ch(1, 0),
        t: ch(2, 0),
        g: ch(3, 0),
    }
}

/// The first incarnation of the wedge shape: consumes `A/0` and its
/// self-loop `T/0`, sinks to `G` and `T`. It delivers `A@0`, sends to `G/0`
/// (sequence 1 lands at `G/0@0`, its commit marker at 1), then sends to
/// `T/0`, whose stamp claims `(G/0, me, 1)`. Returns the harness (state
/// committed) and the `T/0` record as it sits in the log at offset 0.
fn first_incarnation() -> (Harness, InboundRecord) {
    let Topics { a, t, g } = topics();
    let me = sender(ME);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 1)
        .with_topic(t.topic, 1, 0)
        .with_topic(g.topic, 1, 0);
    let mut h = Harness::start(config(me, &[a, t], &[g.topic, t.topic]), broker);
    h.advance(a, 0);
    h.advance(t, 0);
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0)]);
    let to_g = h.node.prepare_send(g).unwrap();
    assert_eq!(to_g.sender.unwrap().seq, 1);
    let to_t = h.node.prepare_send(t).unwrap();
    assert_eq!(to_t.clock.sequence(g, me), Some(1));
    h.broker.set_end(g, 2);
    h.broker.set_end(t, 2);
    h.commit();
    let mut tick = rec(t, 0, to_t.clock.clone());
    tick.causal.sender = to_t.sender;
    (h, tick)
}

/// Variant 1: `G` becomes a former sink and a new input. Init folds G's end
/// offset into carried ancestry, seeds `G/0` at 1 and resumes at 2. The
/// record on `T/0` that claims our own sequence 1 on `G/0` must be
/// delivered: that send sits at `G/0@0`, below the seed.
#[test]
fn a_former_sink_that_becomes_an_input_does_not_wedge_own_claims() {
    let (mut h, tick) = first_incarnation();
    let Topics { a, t, g } = topics();
    let me = sender(ME);
    h.restart_with(config(me, &[a, t, g], &[t.topic])).unwrap();
    assert_eq!(h.report.former_sinks_folded, vec![g.topic]);
    assert_eq!(h.node.resume_positions().get(&g), Some(&2));
    // The host reports the positions it resumes from.
    assert!(h.advance(a, 1).is_empty());
    assert!(h.advance(t, 0).is_empty());
    assert!(h.advance(g, 2).is_empty());
    assert_eq!(h.feed(tick), vec![(t, 0)], "{:?}", h.node.held_heads());
    // Later traffic on the new input flows in order.
    assert_eq!(h.feed(rec(g, 2, VectorClock::new())), vec![(g, 2)]);
    assert_eq!(h.node.held_count(), 0);
}

/// Variant 2: the record on `T/0` was already held (on a cause on `B/0`)
/// when the redeploy happened, and is restored from the store. When its
/// other cause arrives it must follow it out, with nothing left waiting on
/// our own sequence claim.
#[test]
fn a_restored_record_does_not_wedge_on_own_claims_after_the_sink_becomes_an_input() {
    let Topics { a, t, g } = topics();
    let b = ch(4, 0);
    let me = sender(ME);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 2)
        .with_topic(b.topic, 1, 0)
        .with_topic(t.topic, 1, 0)
        .with_topic(g.topic, 1, 0);
    let mut h = Harness::start(config(me, &[a, b, t], &[g.topic, t.topic]), broker);
    for c in [a, b, t] {
        h.advance(c, 0);
    }
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0)]);
    // A@1 claims B@0, which has not arrived: held, and its clock is now in
    // A's advertised clock, so our stamps claim B@0 too.
    assert!(h.feed(rec(a, 1, offsets(&[(b, 0)]))).is_empty());
    h.node.prepare_send(g).unwrap();
    let to_t = h.node.prepare_send(t).unwrap();
    assert_eq!(to_t.clock.offset(b), Some(0));
    assert_eq!(to_t.clock.sequence(g, me), Some(1));
    h.broker.set_end(g, 2);
    h.broker.set_end(t, 2);
    let tick = tagged(rec(t, 0, to_t.clock.clone()), me, 1);
    assert!(h.feed(tick).is_empty(), "held on B@0");
    assert_eq!(h.node.held_count(), 2);
    h.commit();

    h.restart_with(config(me, &[a, b, t, g], &[t.topic]))
        .unwrap();
    assert_eq!(h.report.restored_held, 2);
    for c in [a, b, t] {
        h.advance(c, if c == a { 2 } else { 0 });
    }
    h.advance(g, 2);
    let out = h.feed(rec(b, 0, VectorClock::new()));
    assert_eq!(
        out,
        vec![(b, 0), (a, 1), (t, 0)],
        "{:?}",
        h.node.held_heads()
    );
    assert_eq!(h.node.held_count(), 0);
}

/// Variant 3: `G` stays a sink and is added as an input, the consumer
/// starting at the end. Own outputs claim `G/0@1`, the join seeds there, and
/// the old claim on our sequence 1 is met. A claim on a send of *this*
/// incarnation (sequence 2, beyond what the restart seeded) still waits for
/// that record.
#[test]
fn a_kept_sink_added_as_an_input_meets_old_own_claims_and_waits_for_new_ones() {
    let (mut h, tick) = first_incarnation();
    let Topics { a, t, g } = topics();
    let me = sender(ME);
    h.restart_with(config(me, &[a, t, g], &[g.topic, t.topic]))
        .unwrap();
    assert_eq!(h.node.resume_positions().get(&g), Some(&2));
    h.advance(a, 1);
    h.advance(t, 0);
    h.advance(g, 2);
    // This incarnation sends to G (sequence 2, lands at G/0@2) and then to T.
    let to_g = h.node.prepare_send(g).unwrap();
    assert_eq!(to_g.sender.unwrap().seq, 2);
    assert_eq!(to_g.clock.offset(t), Some(1), "own outputs claim T/0@1");
    let to_t = h.node.prepare_send(t).unwrap();
    assert_eq!(to_t.clock.sequence(g, me), Some(2));
    h.broker.set_end(g, 4);
    h.broker.set_end(t, 4);
    h.commit();
    // The old tick is released at once: its claim names our sequence 1.
    assert_eq!(h.feed(tick), vec![(t, 0)], "{:?}", h.node.held_heads());
    // The new tick waits for sequence 2 on G/0 ...
    let tick2 = tagged(rec(t, 2, to_t.clock.clone()), me, 2);
    assert!(h.feed(tick2).is_empty());
    let unmet = &h.node.held_heads()[0].unmet;
    assert!(
        matches!(unmet.as_slice(), [UnmetClaim::Sequence { seq: 2, .. }]),
        "{unmet:?}"
    );
    // ... and follows it.
    let ours = tagged(rec(g, 2, to_g.clock.clone()), me, 2);
    assert_eq!(h.feed(ours), vec![(g, 2), (t, 2)]);
}

/// Soundness of the own-claim rule: only a join turns the node's own
/// earlier sends into skipped past. A node that consumed its own sink all
/// along (no join) still waits for the claimed record itself, even across a
/// restart.
#[test]
fn own_claims_on_an_input_consumed_all_along_wait_for_the_record() {
    let Topics { a, t: _, g } = topics();
    let me = sender(ME);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 0)
        .with_topic(g.topic, 1, 0);
    // Consumes A and G, sinks to G and A.
    let mut h = Harness::start(config(me, &[a, g], &[g.topic, a.topic]), broker);
    h.advance(a, 0);
    h.advance(g, 0);
    // Two sends to G (sequences 1, 2 at offsets 0, 1; marker at 2), then a
    // send to A claiming sequence 2 on G.
    h.node.prepare_send(g).unwrap();
    let g2 = h.node.prepare_send(g).unwrap();
    let to_a = h.node.prepare_send(a).unwrap();
    h.broker.set_end(g, 3);
    h.broker.set_end(a, 2);
    h.commit();
    h.restart();
    h.advance(a, 0);
    h.advance(g, 0);
    let on_a = tagged(rec(a, 0, to_a.clock.clone()), me, 1);
    assert!(h.feed(on_a).is_empty(), "G/0 is not covered yet");
    assert!(
        h.feed(tagged(rec(g, 0, VectorClock::new()), me, 1))
            .eq(&[(g, 0)])
    );
    // Sequence 2 at G/0@1 releases it (by delivery, as before).
    let out = h.feed(tagged(rec(g, 1, g2.clock.clone()), me, 2));
    assert_eq!(out, vec![(g, 1), (a, 0)]);
}

/// The cross-implementation trace: a node consuming only `A/0` delivers
/// `A@0`, whose clock claims `X/0@5`. Redeployed with `X/0` as an input, it
/// must resume `X/0` at 6: `X@3` is a cause of what it already delivered.
#[test]
fn a_joining_input_skips_what_delivered_records_already_claimed() {
    let a = ch(1, 0);
    let x = ch(5, 0);
    let me = sender(ME);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 1)
        .with_topic(x.topic, 1, 8);
    let mut h = Harness::start(config(me, &[a], &[]), broker);
    h.advance(a, 0);
    assert_eq!(h.feed(rec(a, 0, offsets(&[(x, 5)]))), vec![(a, 0)]);
    h.commit();
    h.restart_with(config(me, &[a, x], &[])).unwrap();
    assert_eq!(h.report.grown, vec![x]);
    assert_eq!(h.node.resume_positions().get(&x), Some(&6));
    assert_eq!(h.node.frontier(x), Some(5));
    // A host that re-reads the prefix anyway sees it dropped as a replay.
    assert!(h.feed(rec(x, 3, VectorClock::new())).is_empty());
    assert_eq!(h.feed(rec(x, 6, VectorClock::new())), vec![(x, 6)]);
    assert_eq!(h.node.stats().delivered_total, 1);
}

/// The growth seed takes in own outputs: a kept sink added as an input
/// skips what the node had already written there (and every other
/// producer's records below that end, the usual delay-only over-claim).
#[test]
fn a_kept_sink_added_as_an_input_seeds_at_its_own_outputs() {
    let a = ch(1, 0);
    let g = ch(3, 0);
    let me = sender(ME);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 0)
        .with_topic(g.topic, 1, 7);
    let mut h = Harness::start(config(me, &[a], &[g.topic]), broker);
    h.commit();
    h.restart_with(config(me, &[a, g], &[g.topic])).unwrap();
    assert_eq!(h.node.resume_positions().get(&g), Some(&7));
    assert_eq!(h.report.seeded.get(&g), Some(&6));
}

/// A sequence claim in custody on the joining channel names records whose
/// offsets the node cannot know. They are in its past all the same, so they
/// are skipped when they arrive (only below the end offset at the join, and
/// only the claimed sender's records); another sender's records and later
/// records are delivered.
#[test]
fn a_joining_input_skips_sequence_claimed_records_of_its_past() {
    let a = ch(1, 0);
    let x = ch(5, 0);
    let me = sender(ME);
    let p = sender(OTHER);
    let q = sender(0xC0DE);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 1)
        .with_topic(x.topic, 1, 6);
    let mut h = Harness::start(config(me, &[a], &[]), broker);
    h.advance(a, 0);
    // A@0 was sent by P after its own sends 1..=2 to X/0.
    let on_a = tagged(rec(a, 0, seqs(&[(x, p, 2)])), p, 1);
    assert_eq!(h.feed(on_a), vec![(a, 0)]);
    h.commit();
    h.restart_with(config(me, &[a, x], &[])).unwrap();
    assert_eq!(h.node.resume_positions().get(&x), None, "no offset to seed");
    h.advance(x, 0);
    // X/0: Q@0, P seq 1 @1, marker 2, P seq 2 @3, Q@4, P seq 3 @6 (after the
    // join's end offset 6).
    assert_eq!(
        h.feed(tagged(rec(x, 0, VectorClock::new()), q, 1)),
        vec![(x, 0)]
    );
    assert!(
        h.feed(tagged(rec(x, 1, VectorClock::new()), p, 1))
            .is_empty()
    );
    assert!(
        h.feed(tagged(rec(x, 3, VectorClock::new()), p, 2))
            .is_empty()
    );
    assert_eq!(h.node.frontier(x), Some(3));
    assert_eq!(
        h.feed(tagged(rec(x, 4, VectorClock::new()), q, 2)),
        vec![(x, 4)]
    );
    assert_eq!(
        h.feed(tagged(rec(x, 6, VectorClock::new()), p, 3)),
        vec![(x, 6)]
    );
    assert_eq!(h.node.stats().past_skipped_total, 2);
    assert_eq!(h.node.stats().delivered_total, 3, "since the restart");
    // The skip mark is committed (it must outlive a restart) ...
    let w = h.commit();
    let key = StateKey::SkipMark(x, p);
    assert!(w.iter().any(|(k, v)| k == key && v.is_some()), "{w:?}");
    // ... and it meets claims on the skipped records, which will never be
    // delivered here: a later record claiming P's sequence 2 on X/0 flows.
    assert_eq!(
        h.feed(tagged(rec(a, 1, seqs(&[(x, p, 2)])), p, 4)),
        vec![(a, 1)]
    );
    // A claim beyond the skipped range still waits for its record.
    assert!(
        h.feed(tagged(rec(a, 2, seqs(&[(x, p, 4)])), p, 5))
            .is_empty()
    );
    let out = h.feed(tagged(rec(x, 7, VectorClock::new()), p, 4));
    assert_eq!(out, vec![(x, 7), (a, 2)]);
}

/// The skip marks survive a restart before the skipped records arrive.
#[test]
fn sequence_skip_marks_survive_a_restart() {
    let a = ch(1, 0);
    let x = ch(5, 0);
    let me = sender(ME);
    let p = sender(OTHER);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 1)
        .with_topic(x.topic, 1, 3);
    let mut h = Harness::start(config(me, &[a], &[]), broker);
    h.advance(a, 0);
    h.feed(tagged(rec(a, 0, seqs(&[(x, p, 1)])), p, 2));
    h.commit();
    h.restart_with(config(me, &[a, x], &[])).unwrap();
    h.commit();
    h.restart();
    h.advance(x, 0);
    assert!(
        h.feed(tagged(rec(x, 1, VectorClock::new()), p, 1))
            .is_empty()
    );
    assert_eq!(h.feed(rec(x, 3, VectorClock::new())), vec![(x, 3)]);
}

/// A marker behind a held head: the frontier folds up to just below the
/// head once the records before it are delivered, so a claim naming the
/// marker's offset is met (spec/03's bridging), and the chain drains.
#[test]
fn a_marker_behind_a_held_head_is_folded_in() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let c = ch(3, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b, c], &[]), FakeBroker::default());
    assert!(h.feed(rec(a, 0, offsets(&[(c, 0)]))).is_empty());
    // A@1 is a transaction marker: never fetched.
    assert!(h.feed(rec(a, 2, offsets(&[(b, 0)]))).is_empty());
    assert!(h.feed(rec(b, 0, offsets(&[(a, 1)]))).is_empty());
    let out = h.feed(rec(c, 0, VectorClock::new()));
    assert_eq!(out, vec![(c, 0), (a, 0), (b, 0), (a, 2)]);
    assert_eq!(h.node.held_count(), 0);
}

/// Order within one call: the arriving record first (when it is deliverable
/// at once), then sweeps over the channels in sorted order, each channel
/// drained as far as it goes, repeated until a sweep releases nothing.
#[test]
fn release_order_within_one_call_is_arrival_then_sorted_sweeps() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let c = ch(3, 0);
    let d = ch(4, 0);
    let mut h = Harness::start(
        config(sender(ME), &[a, b, c, d], &[]),
        FakeBroker::default(),
    );
    // A@0 waits on B@0; B@0 waits on D@0; C@0 waits on D@0.
    assert!(h.feed(rec(a, 0, offsets(&[(b, 0)]))).is_empty());
    assert!(h.feed(rec(b, 0, offsets(&[(d, 0)]))).is_empty());
    assert!(h.feed(rec(c, 0, offsets(&[(d, 0)]))).is_empty());
    // D@0 arrives: D first, then the first sweep finds A blocked, releases
    // B and C; the second sweep releases A.
    let out = h.feed(rec(d, 0, VectorClock::new()));
    assert_eq!(out, vec![(d, 0), (b, 0), (c, 0), (a, 0)]);
}

/// A stamp never carries a claim by its own sender on its destination
/// channel, whether the claim is this incarnation's send echoed back
/// through custody or an earlier incarnation's.
#[test]
fn a_stamp_never_self_claims_its_destination() {
    let (mut h, tick) = first_incarnation();
    let Topics { a, t, g } = topics();
    let me = sender(ME);
    // Same incarnation: the echo of sequence 1 on G/0 comes back on T/0.
    assert_eq!(h.feed(tick.clone()), vec![(t, 0)]);
    let again = h.node.prepare_send(g).unwrap();
    assert_eq!(again.sender.unwrap().seq, 2);
    assert_eq!(again.clock.sequence(g, me), None, "{:?}", again.clock);
    // To another channel, the claim on G/0 stays (sequence 2 now).
    let to_t = h.node.prepare_send(t).unwrap();
    assert_eq!(to_t.clock.sequence(g, me), Some(2));
    h.broker.set_end(g, 4);
    h.broker.set_end(t, 4);
    h.commit();
    // Next incarnation: the echo of an earlier incarnation's send.
    h.restart();
    h.advance(a, 1);
    h.advance(t, 1);
    let echo = tagged(rec(t, 2, to_t.clock.clone()), me, 2);
    assert_eq!(h.feed(echo), vec![(t, 2)]);
    let stamp = h.node.prepare_send(g).unwrap();
    assert_eq!(stamp.clock.sequence(g, me), None, "{:?}", stamp.clock);
    assert_eq!(stamp.sender.unwrap().seq, 3);
}

/// A first start is not growth: a fresh node that consumes one of its own
/// sinks is not seeded at that sink's end (those records were written by
/// others before it existed, not ignored by it); the host's start policy
/// decides where it begins.
#[test]
fn a_fresh_node_is_not_seeded_at_its_own_outputs() {
    let t = ch(2, 0);
    let me = sender(ME);
    let broker = FakeBroker::default().with_topic(t.topic, 1, 5);
    let mut h = Harness::start(config(me, &[t], &[t.topic]), broker);
    assert!(h.report.fresh);
    assert!(h.node.resume_positions().is_empty());
    assert_eq!(h.node.frontier(t), Some(-1));
    h.advance(t, 0);
    assert_eq!(h.feed(rec(t, 0, VectorClock::new())), vec![(t, 0)]);
}

/// The skip mark of a joined input covers exactly the claimed past: the
/// claimed sender's records up to the claimed sequence and below the join's
/// end offset. A later send of that sender below the end offset is not in
/// the past (delivered), nor is anything at or past the end offset, whatever
/// its sequence says. Skipping a record of the past moves the frontier, and
/// releases what waited on it in the same call.
#[test]
fn a_skip_mark_covers_exactly_the_claimed_past_and_releases_what_waited_on_it() {
    let a = ch(1, 0);
    let x = ch(5, 0);
    let me = sender(ME);
    let p = sender(OTHER);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 1)
        .with_topic(x.topic, 1, 6);
    let mut h = Harness::start(config(me, &[a], &[]), broker);
    h.advance(a, 0);
    assert_eq!(
        h.feed(tagged(rec(a, 0, seqs(&[(x, p, 2)])), p, 1)),
        vec![(a, 0)]
    );
    h.commit();
    h.restart_with(config(me, &[a, x], &[])).unwrap();
    assert_eq!(
        h.report.skip_marks.get(&x).and_then(|m| m.get(&p)),
        Some(&parsley_protocol::node::SkipMark { seq: 2, bound: 6 })
    );
    h.advance(x, 0);
    // A@1 waits for X/0 up to offset 3.
    assert!(h.feed(rec(a, 1, offsets(&[(x, 3)]))).is_empty());
    // P's sequence 1 at X/0@1: past, skipped; A@1 still waits.
    assert!(
        h.feed(tagged(rec(x, 1, VectorClock::new()), p, 1))
            .is_empty()
    );
    // P's sequence 2 at X/0@3: past, skipped, and the frontier it moves
    // releases A@1 at once.
    assert_eq!(
        h.feed(tagged(rec(x, 3, VectorClock::new()), p, 2)),
        vec![(a, 1)]
    );
    // P's sequence 3 at X/0@5, below the end offset but beyond the claim:
    // not past.
    assert_eq!(
        h.feed(tagged(rec(x, 5, VectorClock::new()), p, 3)),
        vec![(x, 5)]
    );
    // At the end offset, even a sequence the mark covers is not past (a
    // sender reusing its id after a reset, say): delivered, never dropped.
    assert_eq!(
        h.feed(tagged(rec(x, 6, VectorClock::new()), p, 1)),
        vec![(x, 6)]
    );
    assert_eq!(h.node.stats().past_skipped_total, 2);
}

/// A channel that leaves and comes back: its delivery marks outlive its
/// absence. A sequence claim picked up meanwhile that goes beyond what was
/// delivered there becomes a skip mark (the claimed records are past, their
/// offsets unknown); one the marks already cover needs none.
#[test]
fn a_returning_input_skips_claimed_sends_beyond_what_it_delivered_before() {
    let a = ch(1, 0);
    let x = ch(5, 0);
    let me = sender(ME);
    let p = sender(OTHER);
    let broker = FakeBroker::default()
        .with_topic(a.topic, 1, 2)
        .with_topic(x.topic, 1, 2);
    let mut h = Harness::start(config(me, &[a, x], &[]), broker);
    h.advance(a, 0);
    h.advance(x, 0);
    // P's sequence 1 at X/0@0 is delivered, then X leaves.
    assert_eq!(
        h.feed(tagged(rec(x, 0, VectorClock::new()), p, 1)),
        vec![(x, 0)]
    );
    h.restart_with(config(me, &[a], &[])).unwrap();
    h.advance(a, 0);
    // Meanwhile A@0 claims P's sequences up to 1 (covered by the marks) and
    // A@1 up to 3 (P's sequences 2 and 3 landed at X/0@2 and @3).
    assert_eq!(
        h.feed(tagged(rec(a, 0, seqs(&[(x, p, 1)])), p, 10)),
        vec![(a, 0)]
    );
    h.broker.set_end(x, 5);
    assert_eq!(
        h.feed(tagged(rec(a, 1, seqs(&[(x, p, 3)])), p, 11)),
        vec![(a, 1)]
    );
    h.restart_with(config(me, &[a, x], &[])).unwrap();
    assert_eq!(
        h.report.skip_marks.get(&x).and_then(|m| m.get(&p)),
        Some(&parsley_protocol::node::SkipMark { seq: 3, bound: 5 })
    );
    h.advance(x, 1);
    // Sequences 2 and 3 are past: skipped, not delivered after A@1.
    assert!(
        h.feed(tagged(rec(x, 2, VectorClock::new()), p, 2))
            .is_empty()
    );
    assert!(
        h.feed(tagged(rec(x, 3, VectorClock::new()), p, 3))
            .is_empty()
    );
    assert_eq!(
        h.feed(tagged(rec(x, 5, VectorClock::new()), p, 4)),
        vec![(x, 5)]
    );
}
