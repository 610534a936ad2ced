//! What a state query costs the thread that answers it: the worker's
//! lookup in a task's committed fold state, plain and causal (the cause
//! already delivered), for a stage holding 10,000 keys.
//! `cargo bench -p parsley --bench query`.
//!
//! Measured through the TestDriver, whose `state_after` first checks that
//! nothing is left to run (one pass over the tasks) and then makes the
//! same worker call a Kafka stream thread makes between two polls.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use parsley::{Codec, Message, Parsley, Stage, Step, TestDriver, Topic};

fn queries(c: &mut Criterion) {
    let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    let stage = Stage::named("totals").state(Codec::int64(), || 0);
    let store = stage.store(Codec::utf8());
    let stage = stage
        .fold(&orders, |t: i64, m: &Message<String, i64>| {
            Step::to(t + m.value().copied().unwrap_or(0))
        })
        .build()
        .unwrap();
    let app = Parsley::named("shop", [stage]).unwrap();
    let mut driver = TestDriver::builder(&app)
        .partitions("orders", 4)
        .build()
        .unwrap();
    let mut last = None;
    for i in 0..10_000 {
        last = Some(driver.pipe(&orders, format!("acct-{i}"), 1).unwrap());
    }
    let cause = [last.unwrap()];
    let key = "acct-9999".to_owned();
    assert_eq!(driver.state(&store, key.clone()).unwrap(), Some(1));
    assert_eq!(
        driver.state_after(&store, key.clone(), &cause).unwrap(),
        Some(1)
    );
    c.bench_function("query/state_after, the cause delivered", |b| {
        b.iter(|| {
            driver
                .state_after(&store, black_box(key.clone()), black_box(&cause))
                .unwrap()
        })
    });
    c.bench_function("query/state_after, no cause", |b| {
        b.iter(|| {
            driver
                .state_after(&store, black_box(key.clone()), &[])
                .unwrap()
        })
    });
}

criterion_group!(benches, queries);
criterion_main!(benches);
