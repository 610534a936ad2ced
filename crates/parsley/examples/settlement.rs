//! The settlement application: orders and payments fold into a balance per
//! account, and every order emits a settlement. Run it with
//! `cargo run -p parsley --example settlement`.
//!
//! It runs in the broker-less TestDriver and shows the guarantee at work: a
//! payment stamped as caused by an order that has not arrived yet waits at
//! the gate until the order is delivered.

use parsley::{Codec, Input, Message, Parsley, Stage, Step, TestDriver, Topic};

/// An order: its id and total, in cents.
#[derive(Clone, Debug, PartialEq)]
struct Order {
    id: String,
    total: i64,
}

/// A payment, in cents.
#[derive(Clone, Debug, PartialEq)]
struct Payment {
    amount: i64,
}

/// What a settled order leaves behind.
#[derive(Clone, Debug, PartialEq)]
struct Settled {
    order: String,
    balance: i64,
}

/// `total` (8 bytes, big-endian) followed by the id in UTF-8.
fn order_codec() -> Codec<Order> {
    Codec::new(
        |o: &Order| [o.total.to_be_bytes().as_slice(), o.id.as_bytes()].concat(),
        |b: &[u8]| -> Result<Order, String> {
            let (total, id) = b.split_at_checked(8).ok_or("order shorter than 8 bytes")?;
            Ok(Order {
                id: String::from_utf8(id.to_vec()).map_err(|e| e.to_string())?,
                total: Codec::int64().decode(total).map_err(|e| e.to_string())?,
            })
        },
    )
    .named("order")
}

fn payment_codec() -> Codec<Payment> {
    let long = Codec::int64();
    Codec::new(
        |p: &Payment| p.amount.to_be_bytes().to_vec(),
        move |b: &[u8]| long.decode(b).map(|amount| Payment { amount }),
    )
    .named("payment")
}

fn settled_codec() -> Codec<Settled> {
    Codec::new(
        |s: &Settled| [s.balance.to_be_bytes().as_slice(), s.order.as_bytes()].concat(),
        |b: &[u8]| -> Result<Settled, String> {
            let (balance, order) = b
                .split_at_checked(8)
                .ok_or("settlement shorter than 8 bytes")?;
            Ok(Settled {
                order: String::from_utf8(order.to_vec()).map_err(|e| e.to_string())?,
                balance: Codec::int64().decode(balance).map_err(|e| e.to_string())?,
            })
        },
    )
    .named("settled")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let orders: Topic<String, Order> = Topic::new("orders", Codec::utf8(), order_codec());
    let payments: Topic<String, Payment> = Topic::new("payments", Codec::utf8(), payment_codec());
    let settlements: Topic<String, Settled> =
        Topic::new("settlements", Codec::utf8(), settled_codec());

    let out = settlements.clone();
    let settlement = Stage::named("settlement")
        .state(Codec::int64(), || 0)
        .fold(&orders, move |balance: i64, m: &Message<String, Order>| {
            let Some(order) = m.value() else {
                return Step::keep();
            };
            let next = balance - order.total;
            let settled = Settled {
                order: order.id.clone(),
                balance: next,
            };
            Step::to(next).emit(out.send(m.key().cloned(), settled))
        })
        .fold(&payments, |balance: i64, m: &Message<String, Payment>| {
            Step::to(balance + m.value().map_or(0, |p| p.amount))
        })
        .sink(&settlements)
        .build()?;
    let app = Parsley::named("settlements-app", [settlement])?;

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
    let balances: Vec<i64> = driver
        .values(&settlements)?
        .iter()
        .map(|s| s.balance)
        .collect();
    // o-2 settles before the held payment is applied: 10000 - 2500 - 4000.
    assert_eq!(balances, vec![7_500, 3_500]);
    let balance: Option<i64> = driver.fold_state("settlement", &Codec::utf8(), "acct-1")?;
    assert_eq!(balance, Some(7_500));
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
