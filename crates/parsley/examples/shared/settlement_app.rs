//! The settlement application, shared by the TestDriver example
//! (`crates/parsley/examples/settlement.rs`) and the Kafka one
//! (`crates/parsley-kafka/examples/kafka_settlement.rs`): orders and payments fold
//! into a balance per account, and every order emits a settlement.
#![allow(dead_code, unreachable_pub)]

use parsley::{Codec, Message, Parsley, Stage, Step, Topic};

/// An order: its id and total, in cents.
#[derive(Clone, Debug, PartialEq)]
pub struct Order {
    pub id: String,
    pub total: i64,
}

/// A payment, in cents.
#[derive(Clone, Debug, PartialEq)]
pub struct Payment {
    pub amount: i64,
}

/// What a settled order leaves behind.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    pub order: String,
    pub balance: i64,
}

// ANCHOR: order-codec
/// `total` (8 bytes, big-endian) followed by the id in UTF-8.
pub fn order_codec() -> Codec<Order> {
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
// ANCHOR_END: order-codec

pub fn payment_codec() -> Codec<Payment> {
    let long = Codec::int64();
    Codec::new(
        |p: &Payment| p.amount.to_be_bytes().to_vec(),
        move |b: &[u8]| long.decode(b).map(|amount| Payment { amount }),
    )
    .named("payment")
}

pub fn settled_codec() -> Codec<Settled> {
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

/// The application and its three topics, named with `prefix` (so a run on
/// a shared cluster can use fresh topics).
pub struct Settlement {
    pub app: Parsley,
    pub orders: Topic<String, Order>,
    pub payments: Topic<String, Payment>,
    pub settlements: Topic<String, Settled>,
}

pub fn settlement_app(
    app_id: &str,
    prefix: &str,
) -> Result<Settlement, Box<dyn std::error::Error>> {
    let orders: Topic<String, Order> =
        Topic::new(format!("{prefix}orders"), Codec::utf8(), order_codec());
    let payments: Topic<String, Payment> =
        Topic::new(format!("{prefix}payments"), Codec::utf8(), payment_codec());
    let settlements: Topic<String, Settled> = Topic::new(
        format!("{prefix}settlements"),
        Codec::utf8(),
        settled_codec(),
    );

    // ANCHOR: stage
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
    // ANCHOR_END: stage
    let app = Parsley::named(app_id, [settlement])?;

    Ok(Settlement {
        app,
        orders,
        payments,
        settlements,
    })
}
