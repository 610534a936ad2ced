//! A cycle `c1 -> p1 -> c2 -> p2 -> c1` that converges: p2 re-emits only
//! while the counter is below a limit. The gate never deadlocks on a cycle;
//! termination is the logic's job.

use parsley::{Codec, Message, Parsley, Stage, TestDriver, Topic};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ANCHOR: cycle
    let c1: Topic<String, i64> = Topic::new("c1", Codec::utf8(), Codec::int64());
    let c2: Topic<String, i64> = Topic::new("c2", Codec::utf8(), Codec::int64());
    let (to2, to1) = (c2.clone(), c1.clone());
    let p1 = Stage::named("p1")
        .on(&c1, move |m: &Message<String, i64>| {
            vec![to2.send(m.key().cloned(), m.value().map(|n| n + 1))]
        })
        .sink(&c2)
        .build()?;
    let p2 = Stage::named("p2")
        .on(&c2, move |m: &Message<String, i64>| match m.value() {
            Some(&n) if n < 6 => vec![to1.send(m.key().cloned(), n + 1)],
            _ => vec![],
        })
        .sink(&c1)
        .build()?;
    let mut d = TestDriver::new(&Parsley::named("cycle-app", [p1, p2])?)?;
    d.pipe(&c1, "k", 0)?;
    println!("c1: {:?}", d.values(&c1)?);
    println!("c2: {:?}", d.values(&c2)?);
    assert_eq!(d.values(&c2)?, vec![1, 3, 5, 7]);
    assert!(d.held().is_empty());
    // ANCHOR_END: cycle
    Ok(())
}
