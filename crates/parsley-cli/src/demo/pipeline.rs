//! The demo's application, in one screen.
//!
//! A checkout service turns every order into a payment. A ledger settles
//! each payment against the order it pays for. The ledger's orders feed
//! lags its payments feed, so payments routinely reach it first: exactly the
//! race where an effect is processed before its cause. A payment the ledger
//! processes before its order finds no order, and is rejected.

use std::sync::Arc;

use parsley::{Codec, Message, Parsley, Stage, Step, Topic};

/// Errors building the demo applications.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// Called with the key of every record the ledger's logic receives, and
/// whether it is an order (`true`) or a payment.
pub type Observer = Arc<dyn Fn(Option<&str>, bool) + Send + Sync>;

/// The demo's three topics, under one name prefix (empty for the
/// broker-less run; a per-run prefix on a cluster).
#[derive(Clone)]
pub struct Topics {
    /// order id -> amount due, in cents.
    pub orders: Topic<String, i64>,
    /// order id -> amount paid, in cents.
    pub payments: Topic<String, i64>,
    /// order id -> what the ledger did with the payment.
    pub settlements: Topic<String, String>,
}

impl Topics {
    /// `<prefix>orders`, `<prefix>payments` and `<prefix>settlements`.
    pub fn prefixed(prefix: &str) -> Topics {
        Topics {
            orders: Topic::new(format!("{prefix}orders"), Codec::utf8(), Codec::int64()),
            payments: Topic::new(format!("{prefix}payments"), Codec::utf8(), Codec::int64()),
            settlements: Topic::new(format!("{prefix}settlements"), Codec::utf8(), Codec::utf8()),
        }
    }
}

/// `orders`: order id -> amount due, in cents.
pub fn orders() -> Topic<String, i64> {
    Topics::prefixed("").orders
}

/// `payments`: order id -> amount paid, in cents.
pub fn payments() -> Topic<String, i64> {
    Topics::prefixed("").payments
}

/// `settlements`: order id -> what the ledger did with the payment.
pub fn settlements() -> Topic<String, String> {
    Topics::prefixed("").settlements
}

/// Upstream: the payment service charges every order. Parsley stamps each
/// payment as caused by the order it was charged for.
pub fn checkout() -> Result<Parsley, BuildError> {
    checkout_on(&Topics::prefixed(""), "checkout")
}

/// [`checkout`] on `topics`, as application `app_id`.
pub fn checkout_on(topics: &Topics, app_id: &str) -> Result<Parsley, BuildError> {
    let payments = topics.payments.clone();
    let charge = Stage::named("payment-service")
        .on(&topics.orders, {
            let payments = payments.clone();
            move |order: &Message<String, i64>| {
                vec![payments.send(order.key().cloned(), order.value().copied())]
            }
        })
        .sink(&payments)
        .build()?;
    Ok(Parsley::named(app_id, [charge])?)
}

/// Downstream: the ledger remembers what each order is due and settles its
/// payment against it. A payment for an order it has not seen is rejected.
pub fn ledger() -> Result<Parsley, BuildError> {
    ledger_on(&Topics::prefixed(""), "ledger", Arc::new(|_, _| {}))
}

/// [`ledger`] on `topics`, as application `app_id`, telling `observer`
/// about every record its logic receives (the cluster run's checker reads
/// the delivery order from it).
pub fn ledger_on(topics: &Topics, app_id: &str, observer: Observer) -> Result<Parsley, BuildError> {
    let settlements = topics.settlements.clone();
    let seen = observer.clone();
    let settle = Stage::named("settlement")
        // Per order id: the amount due, 0 while no order has been seen.
        .state(Codec::int64(), || 0)
        .fold(
            &topics.orders,
            move |_due: i64, order: &Message<String, i64>| {
                seen(order.key().map(String::as_str), true);
                Step::to(order.value().copied().unwrap_or(0))
            },
        )
        .fold(&topics.payments, {
            let settlements = settlements.clone();
            move |due: i64, payment: &Message<String, i64>| {
                observer(payment.key().map(String::as_str), false);
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
    Ok(Parsley::named(app_id, [settle])?)
}

/// What the ledger says about a payment whose order it has not seen.
pub const REJECTED: &str = "rejected: payment for an unknown order";
