//! The README's first stage: a balance per account, and a test of it in
//! the broker-less TestDriver. `cargo run -p parsley --example quickstart`.
//! The README shows the part between the ANCHOR lines; a test keeps the
//! two identical.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ANCHOR: readme
    use parsley::{Codec, Input, Parsley, Stage, Step, TestDriver, Topic};

    let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    let balances: Topic<String, i64> = Topic::new("balances", Codec::utf8(), Codec::int64());

    // A stateful stage: a balance per account, emitted on every change.
    let mut ledger = Stage::named("ledger").state(Codec::int64(), || 0);
    let out = ledger.add_sink(&balances);
    let ledger = ledger
        .fold(&payments, move |b, m| {
            let b = b + m.value().copied().unwrap_or(0);
            Step::to(b).emit(out.send(m.key().cloned(), b))
        })
        .fold(&orders, move |b, m| {
            let b = b - m.value().copied().unwrap_or(0);
            Step::to(b).emit(out.send(m.key().cloned(), b))
        })
        .build()?;
    let app = Parsley::named("shop", [ledger])?;

    // Its test: a refund stamped as caused by an order not yet written
    // waits for that order, whatever order they arrive in.
    let mut driver = TestDriver::new(&app)?;
    let order = driver.next_coordinate(&orders, "acct-1")?;
    driver.pipe_input(&payments, Input::new("acct-1", 30).after(&order))?;
    assert_eq!(driver.held().len(), 1); // held: its cause is missing
    driver.pipe(&orders, "acct-1", 30)?;
    assert_eq!(driver.read_values(&balances)?, vec![-30, 0]); // order first
    // ANCHOR_END: readme
    println!("balances: -30 after the order, 0 after the refund");
    Ok(())
}
