//! Stamping allocates nothing once the node's room has grown to the
//! stamps' width: the base and the stamp are put together in clocks the
//! node keeps, and `prepare_send_into` writes into the caller's buffer.
//! Counted by a counting allocator around the system one (this file is its
//! own test binary, with this one test, so nothing else allocates while it
//! counts).

mod common;

use std::alloc::System;

use common::*;
use parsley_protocol::clock::ClockVersion;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn stamping_after_each_delivery_allocates_nothing_once_warm() {
    let (a, far) = (ch(1, 0), ch(5, 0));
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(0xA110), &[a], &[x.topic]), broker);
    let mut out = Vec::with_capacity(4096);
    let mut counted = 0;
    for offset in 0..200 {
        // Each delivery moves the state, so every send recomputes the base.
        h.feed(rec(a, offset, offsets(&[(far, 10 + offset)])));
        out.clear();
        let region = Region::new(GLOBAL);
        h.node
            .prepare_send_into(x, ClockVersion::V1, &mut out)
            .unwrap();
        h.node
            .prepare_send_into(x, ClockVersion::Compact, &mut out)
            .unwrap();
        let allocations = region.change().allocations + region.change().reallocations;
        if offset >= 2 {
            counted += allocations;
        }
    }
    assert_eq!(counted, 0, "allocations in 396 warm stamps");
    // The reused room still follows the deliveries.
    let stamp = h.node.prepare_send(x).unwrap();
    assert_eq!(stamp.clock.offset(far), Some(209));
    assert_eq!(stamp.clock.offset(a), Some(199));
}
