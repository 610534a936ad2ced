//! Paging is invisible: for random operation sequences, a node that keeps
//! only a window of each hold queue in memory (and is served its page
//! requests from the committed store after every call) delivers the same
//! records at the same steps, in the same order per channel, holds the
//! same records and stamps the same clocks as a node that keeps everything.

mod common;

use common::*;
use parsley_protocol::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;

#[derive(Clone, Debug)]
enum Op {
    /// Channel index, offset gap, offset claims (channel index, offset
    /// relative to that channel's next offset), sender tag index.
    Record(usize, i64, Vec<(usize, i64)>, Option<usize>),
    Advance(usize, i64),
    Send,
    Commit,
    /// Commit, then start again from the store (with the run's window set
    /// from the start).
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (
            0..3usize,
            0..2i64,
            prop::collection::vec((0..3usize, -2..4i64), 0..3),
            proptest::option::of(0..2usize),
        )
            .prop_map(|(c, g, o, t)| Op::Record(c, g, o, t)),
        1 => (0..3usize, 0..3i64).prop_map(|(c, g)| Op::Advance(c, g)),
        1 => Just(Op::Send),
        3 => Just(Op::Commit),
        1 => Just(Op::Restart),
    ]
}

const ME: SenderId = SenderId::from_halves(0x22, 0x22);

/// A node over three input channels and one sink, driven one [`Op`] at a
/// time.
struct World {
    h: Harness,
    chans: [Channel; 3],
    sink: Channel,
    senders: [SenderId; 2],
    next: [i64; 3],
    seqs: [i64; 2],
    window: Option<usize>,
}

impl World {
    fn new(window: Option<usize>) -> World {
        let chans = [ch(1, 0), ch(2, 0), ch(3, 1)];
        let sink = ch(9, 0);
        let broker = FakeBroker::default().with_topic(sink.topic, 1, 0);
        let mut h = Harness::start(config(ME, &chans, &[sink.topic]), broker);
        h.node.set_resident_window(window);
        World {
            h,
            chans,
            sink,
            senders: [sender(0xA), sender(0xB)],
            next: [0; 3],
            seqs: [0; 2],
            window,
        }
    }

    /// Applies `op`, appending what it delivers to `out`; returns the
    /// stamp a send made.
    fn apply(&mut self, op: &Op, out: &mut Vec<Delivery>) -> Option<String> {
        let h = &mut self.h;
        match op {
            Op::Record(c, gap, claims, tag) => {
                self.next[*c] += gap;
                let offset = self.next[*c];
                self.next[*c] += 1;
                let mut clock = VectorClock::new();
                for &(k, rel) in claims {
                    if k != *c {
                        clock.claim_offset(self.chans[k], (self.next[k] + rel).max(0));
                    }
                }
                let mut r = rec(self.chans[*c], offset, clock);
                if let Some(s) = tag {
                    self.seqs[*s] += 1;
                    r = tagged(r, self.senders[*s], self.seqs[*s]);
                }
                h.node.on_record_into(r, out).unwrap();
            }
            Op::Advance(c, gap) => {
                self.next[*c] += gap;
                out.extend(
                    h.node
                        .position_advance(self.chans[*c], self.next[*c])
                        .unwrap(),
                );
            }
            Op::Send => {
                let stamp = h.node.prepare_send(self.sink).unwrap();
                return Some(format!("{stamp:?}"));
            }
            Op::Commit => {
                h.commit();
            }
            Op::Restart => {
                h.restart_windowed(self.window);
                out.append(&mut h.init_deliveries);
                // The consumer resumes where it was and reports its
                // positions again, as a host does after a restart (the
                // node does not keep them).
                for (c, &position) in self.chans.iter().zip(&self.next) {
                    out.extend(h.node.position_advance(*c, position).unwrap());
                }
            }
        }
        None
    }

    /// Appends each delivery's offset to its channel's list.
    fn record(&self, out: &[Delivery], per_channel: &mut [Vec<i64>]) {
        for d in out {
            let i = self
                .chans
                .iter()
                .position(|c| *c == d.record.channel)
                .unwrap();
            per_channel[i].push(d.record.offset);
        }
    }
}

/// The run's log, how many records were paged in, and how many restarts
/// left records paged.
fn run(ops: &[Op], window: Option<usize>) -> (Vec<String>, u64, u64) {
    let mut restarts_paged = 0;
    // Node statistics start again at a restart.
    let mut paged_in_before = 0;
    let mut w = World::new(window);
    let mut log = Vec::new();
    let mut per_channel: Vec<Vec<i64>> = vec![Vec::new(); 3];
    for op in ops {
        let mut out = Vec::new();
        if matches!(op, Op::Restart) {
            paged_in_before += w.h.node.stats().paged_in_total;
        }
        if let Some(stamp) = w.apply(op, &mut out) {
            log.push(stamp);
        }
        if matches!(op, Op::Restart) {
            restarts_paged += w.h.node.paged_count() as u64;
        }
        w.h.serve_pages(&mut out);
        w.record(&out, &mut per_channel);
        let mut step = coords(&out);
        step.sort();
        log.push(format!(
            "{step:?} held {} ({} bytes)",
            w.h.node.held_count(),
            w.h.node.held_bytes()
        ));
    }
    log.push(format!("per channel {per_channel:?}"));
    (
        log,
        paged_in_before + w.h.node.stats().paged_in_total,
        restarts_paged,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn paging_is_invisible(ops in prop::collection::vec(op(), 1..80), window in 1..4usize) {
        let (all, _, _) = run(&ops, None);
        let (paged, _, _) = run(&ops, Some(window));
        prop_assert_eq!(all, paged);
    }
}

/// The property is not vacuous: over the same kind of runs, paging
/// happened and records were paged back in.
#[test]
fn the_property_pages_records_in() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(op(), 1..80);
    let mut paged_in = 0;
    let mut runs_with_paging = 0;
    let mut runs_restarted_paged = 0;
    for _ in 0..200 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let (_, n, restarted) = run(&ops, Some(1));
        paged_in += n;
        runs_with_paging += u64::from(n > 0);
        runs_restarted_paged += u64::from(restarted > 0);
    }
    eprintln!(
        "{runs_with_paging} of 200 runs paged records in ({paged_in} records); {runs_restarted_paged} restarted with records paged from the start"
    );
    assert!(
        runs_with_paging >= 40,
        "only {runs_with_paging} of 200 runs paged a record in ({paged_in} records)"
    );
    assert!(
        runs_restarted_paged >= 20,
        "only {runs_restarted_paged} of 200 runs restarted with records paged from the start"
    );
}

/// A host may leave page requests pending (it bounds what one transaction
/// releases) and hand the node more meanwhile: the stalled queues only
/// wait. After every request is finally served, each channel has delivered
/// the same records in the same order as under a host that serves at
/// once, and the same records are held.
fn lazy_run(ops: &[Op], window: usize, per_step: usize) -> (Vec<Vec<i64>>, usize, u64) {
    let mut w = World::new(Some(window));
    let mut per_channel: Vec<Vec<i64>> = vec![Vec::new(); 3];
    let mut left_pending = 0u64;
    let mut out = Vec::new();
    for op in ops {
        w.apply(op, &mut out);
        w.h.serve_at_most(per_step, &mut out);
        if !w.h.node.page_requests().is_empty() {
            left_pending += 1;
        }
        w.record(&out, &mut per_channel);
        out.clear();
    }
    w.h.serve_pages(&mut out);
    w.record(&out, &mut per_channel);
    (per_channel, w.h.node.held_count(), left_pending)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn requests_left_pending_only_delay(
        ops in prop::collection::vec(op(), 1..80),
        window in 1..3usize,
        per_step in 0..2usize,
    ) {
        let (eager, eager_held, _) = lazy_run(&ops, window, usize::MAX);
        let (lazy, lazy_held, _) = lazy_run(&ops, window, per_step);
        prop_assert_eq!(eager, lazy);
        prop_assert_eq!(eager_held, lazy_held);
    }
}

/// The lazy property is not vacuous: requests were left pending while the
/// node was handed more.
#[test]
fn the_lazy_property_leaves_requests_pending() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(op(), 1..80);
    let mut runs = 0;
    for _ in 0..200 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let (_, _, pending) = lazy_run(&ops, 1, 0);
        runs += u64::from(pending > 1);
    }
    eprintln!("{runs} of 200 runs left requests pending over several steps");
    assert!(runs >= 40, "only {runs} of 200 runs left requests pending");
}
