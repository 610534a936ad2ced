//! The independent violation checker.
//!
//! It knows causality from the workload itself (a payment is caused by the
//! order it pays for) and looks only at the order in which the ledger's
//! logic received records. It reads no clock, no header and nothing of
//! Parsley's: it is the judge, not a party.

use std::collections::BTreeSet;
use std::fmt;

/// One record of the workload.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Event {
    /// Order number `n`.
    Order(u32),
    /// The payment for order number `n`.
    Payment(u32),
}

impl Event {
    /// The event this one was caused by, if any.
    pub fn cause(self) -> Option<Event> {
        match self {
            Event::Order(_) => None,
            Event::Payment(n) => Some(Event::Order(n)),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Order(n) => write!(f, "order {n}"),
            Event::Payment(n) => write!(f, "the payment for order {n}"),
        }
    }
}

/// What the checker found.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Verdict {
    /// Effects processed before their cause.
    pub violations: usize,
    /// The first one, as (effect, cause).
    pub first: Option<(Event, Event)>,
}

/// Counts the records a processor received before their cause, given the
/// order it received them in. Both the order and the payment topics reach
/// the ledger, so every cause must come first; an effect whose cause never
/// arrives at all was also processed before it.
pub fn check(received: &[Event]) -> Verdict {
    let mut seen = BTreeSet::new();
    let mut verdict = Verdict::default();
    for &event in received {
        if let Some(cause) = event.cause()
            && !seen.contains(&cause)
        {
            verdict.violations += 1;
            verdict.first.get_or_insert((event, cause));
        }
        seen.insert(event);
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::Event::{Order, Payment};
    use super::*;

    #[test]
    fn counts_effects_received_before_their_cause() {
        let received = [
            Payment(0),
            Order(0),
            Order(1),
            Payment(2),
            Payment(1),
            Order(2),
        ];
        let verdict = check(&received);
        assert_eq!(verdict.violations, 2);
        assert_eq!(verdict.first, Some((Payment(0), Order(0))));
    }

    #[test]
    fn a_causal_order_has_no_violations() {
        let received = [
            Order(0),
            Order(1),
            Payment(1),
            Order(2),
            Payment(0),
            Payment(2),
        ];
        assert_eq!(check(&received), Verdict::default());
    }

    #[test]
    fn an_effect_whose_cause_never_arrives_is_a_violation() {
        assert_eq!(check(&[Payment(7)]).violations, 1);
    }

    #[test]
    fn nothing_received_nothing_violated() {
        assert_eq!(check(&[]).violations, 0);
    }
}
