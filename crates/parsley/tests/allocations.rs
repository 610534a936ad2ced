//! What the owned forms save, counted: a handler that takes its message by
//! value and returns its one emission as is allocates, per record, exactly
//! the two clones and the list fewer than one that borrows the message,
//! clones its key and value and returns them in a `vec!`. Counted by a
//! counting allocator around the system one; this file is its own test
//! binary with one test. The count is the process's, and the test
//! harness's own thread allocates now and then (a few allocations in some
//! runs on a loaded machine): each figure is the least of a few runs,
//! which such strays can only raise.

use std::alloc::System;

use parsley::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

/// Allocations made while `records` records go through `stage`, after as
/// many went through it to warm the driver's buffers.
fn allocations(stage: Stage, records: usize) -> usize {
    let orders = topic("orders");
    let mut d = TestDriver::new(&Parsley::named("shop", [stage]).unwrap()).unwrap();
    let keys: Vec<String> = (0..2 * records).map(|i| format!("o-{i}")).collect();
    for k in &keys[..records] {
        d.pipe(&orders, k.as_str(), "two pears").unwrap();
    }
    let region = Region::new(GLOBAL);
    for k in &keys[records..] {
        d.pipe(&orders, k.as_str(), "two pears").unwrap();
    }
    let change = region.change();
    assert_eq!(d.key_values(&topic("audit")).unwrap().len(), 2 * records);
    change.allocations
}

#[test]
fn an_owned_forward_allocates_two_clones_and_a_list_fewer_per_record() {
    const RECORDS: usize = 200;
    let (orders, audit) = (topic("orders"), topic("audit"));

    let mut builder = Stage::named("audit");
    let out = builder.add_sink(&audit);
    let borrowed = builder
        .on(&orders, move |m: &Message<String, String>| {
            vec![out.send(m.key().cloned(), m.value().cloned())]
        })
        .build()
        .unwrap();

    let mut builder = Stage::named("audit");
    let out = builder.add_sink(&audit);
    let owned = builder
        .on_owned(&orders, move |m: Message<String, String>| {
            let (key, value) = m.into_key_value();
            out.send(key, value)
        })
        .build()
        .unwrap();

    let least = |stage: &Stage| {
        (0..3)
            .map(|_| allocations(stage.clone(), RECORDS))
            .min()
            .unwrap_or(usize::MAX)
    };
    let (borrowed, owned) = (least(&borrowed), least(&owned));
    assert_eq!(
        borrowed - owned,
        3 * RECORDS,
        "{borrowed} allocations borrowing, {owned} owning"
    );
}
