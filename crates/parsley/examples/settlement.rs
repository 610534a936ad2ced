//! The settlement application: orders and payments fold into a balance per
//! account, and every order emits a settlement. Run it with
//! `cargo run -p parsley --example settlement`.
//!
//! It runs in the broker-less TestDriver and shows the guarantee at work: a
//! payment stamped as caused by an order that has not arrived yet waits at
//! the gate until the order is delivered.

#[path = "shared/settlement_app.rs"]
mod settlement_app;

use parsley::{Codec, Input, TestDriver};
use settlement_app::{Order, Payment, Settlement, settlement_app};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Settlement {
        app,
        orders,
        payments,
        settlements,
    } = settlement_app("settlements-app", "")?;

    // ANCHOR: pipe
    let mut driver = TestDriver::new(&app)?;
    driver.pipe(&payments, "acct-1", Payment { amount: 10_000 })?;
    driver.pipe(
        &orders,
        "acct-1",
        Order {
            id: "o-1".into(),
            total: 2_500,
        },
    )?;
    // ANCHOR_END: pipe

    // ANCHOR: held
    // A payment whose producer stamped it as caused by an order not yet
    // written: it is held until that order is delivered.
    let refund_for = driver.next_coordinate(&orders, "acct-1")?;
    driver.pipe_input(
        &payments,
        Input::new("acct-1", Payment { amount: 4_000 }).after(&refund_for),
    )?;
    for held in driver.held() {
        println!("held: {held}");
    }
    assert_eq!(driver.held().len(), 1);

    driver.pipe(
        &orders,
        "acct-1",
        Order {
            id: "o-2".into(),
            total: 4_000,
        },
    )?;
    assert!(driver.held().is_empty());
    // ANCHOR_END: held

    // ANCHOR: records
    for r in driver.records(&settlements)? {
        let causal = r.causal()?;
        println!(
            "{} {:?} -> {:?} (claims {} offset(s), sender seq {:?})",
            r.coordinate,
            r.key,
            r.value,
            causal.clock.offsets().len(),
            causal.sender.map(|s| s.seq)
        );
    }
    // ANCHOR_END: records
    // ANCHOR: state
    let balances: Vec<i64> = driver
        .values(&settlements)?
        .iter()
        .map(|s| s.balance)
        .collect();
    // o-2 settles before the held payment is applied: 10000 - 2500 - 4000.
    assert_eq!(balances, vec![7_500, 3_500]);
    let balance: Option<i64> = driver.fold_state("settlement", &Codec::utf8(), "acct-1")?;
    assert_eq!(balance, Some(7_500));
    // ANCHOR_END: state
    println!("final balance of acct-1: {balance:?}");
    println!(
        "delivery order: {:?}",
        driver
            .delivered_to("settlement")
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    Ok(())
}
