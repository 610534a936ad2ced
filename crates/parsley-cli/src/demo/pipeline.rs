//! The demo's application, in one screen.
//!
//! A checkout service turns every order into a payment. A ledger settles
//! each payment against the order it pays for. The ledger's orders feed
//! lags its payments feed, so payments routinely reach it first: exactly the
//! race where an effect is processed before its cause. A payment the ledger
//! processes before its order finds no order, and is rejected.

use parsley::{Codec, Message, Parsley, Stage, Step, Topic};

/// Errors building the demo applications.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// `orders`: order id -> amount due, in cents.
pub fn orders() -> Topic<String, i64> {
    Topic::new("orders", Codec::utf8(), Codec::int64())
}

/// `payments`: order id -> amount paid, in cents.
pub fn payments() -> Topic<String, i64> {
    Topic::new("payments", Codec::utf8(), Codec::int64())
}

/// `settlements`: order id -> what the ledger did with the payment.
pub fn settlements() -> Topic<String, String> {
    Topic::new("settlements", Codec::utf8(), Codec::utf8())
}

/// Upstream: the payment service charges every order. Parsley stamps each
/// payment as caused by the order it was charged for.
pub fn checkout() -> Result<Parsley, BuildError> {
    let payments = payments();
    let charge = Stage::named("payment-service")
        .on(&orders(), {
            let payments = payments.clone();
            move |order: &Message<String, i64>| {
                vec![payments.send(order.key().cloned(), order.value().copied())]
            }
        })
        .sink(&payments)
        .build()?;
    Ok(Parsley::named("checkout", [charge])?)
}

/// Downstream: the ledger remembers what each order is due and settles its
/// payment against it. A payment for an order it has not seen is rejected.
pub fn ledger() -> Result<Parsley, BuildError> {
    let settlements = settlements();
    let settle = Stage::named("settlement")
        // Per order id: the amount due, 0 while no order has been seen.
        .state(Codec::int64(), || 0)
        .fold(&orders(), |_due: i64, order: &Message<String, i64>| {
            Step::to(order.value().copied().unwrap_or(0))
        })
        .fold(&payments(), {
            let settlements = settlements.clone();
            move |due: i64, payment: &Message<String, i64>| {
                let id = payment.key().cloned();
                if due > 0 {
                    let paid = payment.value().copied().unwrap_or(0);
                    Step::delete().emit(settlements.send(id, format!("settled {paid} of {due}")))
                } else {
                    Step::keep().emit(settlements.send(id, REJECTED.to_owned()))
                }
            }
        })
        .sink(&settlements)
        .build()?;
    Ok(Parsley::named("ledger", [settle])?)
}

/// What the ledger says about a payment whose order it has not seen.
pub const REJECTED: &str = "rejected: payment for an unknown order";
