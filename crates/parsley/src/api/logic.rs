//! The shapes of user logic: handlers, folds, steps, and the recovering
//! decorators.
//!
//! * A **handler** maps one delivered message to its emissions:
//!   `Fn(&Message<K, V>) -> Vec<Emission>`, or the fallible form
//!   `Fn(&Message<K, V>) -> Result<Vec<Emission>, E>`. It may also return
//!   one `Emission`, an `Option<Emission>` or [`Emissions`]; a handler given
//!   the message by value (`StageBuilder::on_owned`) can move its key and
//!   value into its emissions instead of cloning them.
//! * A **fold** steps per-key state: `Fn(S, &Message<K, V>) -> Step<S>`, or
//!   `-> Result<Step<S>, E>`. The runtime resolves the state for the
//!   message's key (the declared initial value for an unseen key), applies
//!   the fold, and persists the returned state in the same transaction as
//!   the delivery and the emissions.
//! * **Tick logic** is the same with a [`Tick`](crate::Tick) in place of the
//!   message: a tick handler `Fn(&Tick) -> Vec<Emission>`, or a tick fold
//!   over the stage's reserved tick-state slot.
//!
//! An `Err` or a panic fails the task: the step aborts, nothing it did is
//! committed, and the retry redelivers the same records in the same causal
//! order. [`recovering`] and [`recovering_fold`] turn the `Err` of logic
//! whose failures are deterministic domain outcomes into emissions to an
//! error sink instead.

use std::ops::Deref;

use smallvec::SmallVec;

use crate::codec::BoxError;
use crate::message::Message;
use crate::topic::Emission;

/// The emissions of one application of logic, in send order. The first is
/// kept inline, so logic that emits one record per delivery (most logic)
/// allocates no list for it; a second moves them all to the heap.
///
/// ```
/// use parsley::{Codec, Emissions, Topic};
/// let out: Topic<String, i64> = Topic::new("out", Codec::utf8(), Codec::int64());
/// let mut emissions = Emissions::from(out.send("a", 1));
/// emissions.push(out.send("b", 2));
/// assert_eq!(emissions.len(), 2);
/// assert_eq!(emissions, Emissions::from(vec![out.send("a", 1), out.send("b", 2)]));
/// assert!(Emissions::from(None).is_empty());
/// assert_eq!(format!("{:?}", Emissions::new()), "[]");
/// for emission in &emissions {
///     assert_eq!(emission.topic(), "out");
/// }
/// ```
#[derive(Default, PartialEq)]
pub struct Emissions(SmallVec<[Emission; 1]>);

/// Prints as a list.
impl std::fmt::Debug for Emissions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0.as_slice(), f)
    }
}

impl Emissions {
    /// No emissions.
    pub fn new() -> Self {
        Emissions(SmallVec::new())
    }

    /// Appends one emission.
    pub fn push(&mut self, emission: Emission) {
        self.0.push(emission);
    }

    /// The emissions as a list: allocates when it holds one emission
    /// inline, and hands over its heap list otherwise.
    pub fn into_vec(self) -> Vec<Emission> {
        self.0.into_vec()
    }
}

impl Deref for Emissions {
    type Target = [Emission];

    fn deref(&self) -> &[Emission] {
        &self.0
    }
}

impl From<Emission> for Emissions {
    fn from(emission: Emission) -> Self {
        let mut list = SmallVec::new();
        list.push(emission);
        Emissions(list)
    }
}

impl From<Option<Emission>> for Emissions {
    fn from(emission: Option<Emission>) -> Self {
        emission.map_or_else(Emissions::new, Emissions::from)
    }
}

impl From<Vec<Emission>> for Emissions {
    fn from(emissions: Vec<Emission>) -> Self {
        Emissions(SmallVec::from_vec(emissions))
    }
}

impl FromIterator<Emission> for Emissions {
    fn from_iter<I: IntoIterator<Item = Emission>>(iter: I) -> Self {
        Emissions(iter.into_iter().collect())
    }
}

impl Extend<Emission> for Emissions {
    fn extend<I: IntoIterator<Item = Emission>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for Emissions {
    type Item = Emission;
    type IntoIter = EmissionsIntoIter;

    fn into_iter(self) -> EmissionsIntoIter {
        EmissionsIntoIter(self.0.into_iter())
    }
}

/// The emissions of an [`Emissions`], by value, in send order.
pub struct EmissionsIntoIter(smallvec::IntoIter<[Emission; 1]>);

impl Iterator for EmissionsIntoIter {
    type Item = Emission;

    fn next(&mut self) -> Option<Emission> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for EmissionsIntoIter {
    fn next_back(&mut self) -> Option<Emission> {
        self.0.next_back()
    }
}

impl ExactSizeIterator for EmissionsIntoIter {}

impl std::iter::FusedIterator for EmissionsIntoIter {}

impl<'a> IntoIterator for &'a Emissions {
    type Item = &'a Emission;
    type IntoIter = std::slice::Iter<'a, Emission>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::fmt::Debug for EmissionsIntoIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EmissionsIntoIter")
            .field(&self.0.as_slice())
            .finish()
    }
}

/// What a fold does to its state slot.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Next<S> {
    /// Leave the stored state as it is (no write).
    Keep,
    /// Store this state.
    Set(S),
    /// Delete the state; the next message for the key sees the initial value.
    Delete,
}

/// The result of one fold step: the next state and the emissions.
///
/// ```
/// use parsley::{Codec, Step, Topic};
/// let out: Topic<String, i64> = Topic::new("out", Codec::utf8(), Codec::int64());
/// let step = Step::to(5).emit(out.send("k", 5));
/// assert_eq!(step, Step::to(5).emit(out.send("k", 5)));
/// assert_eq!(step.emissions().len(), 1);
/// let gone: Step<i64> = Step::delete();
/// assert_ne!(gone, Step::to(0));
/// ```
#[derive(PartialEq, Debug)]
pub struct Step<S> {
    next: Next<S>,
    emissions: Emissions,
}

impl<S> Step<S> {
    /// Store `state` as the key's next state.
    pub fn to(state: S) -> Self {
        Step {
            next: Next::Set(state),
            emissions: Emissions::new(),
        }
    }

    /// Delete the key's state.
    pub fn delete() -> Self {
        Step {
            next: Next::Delete,
            emissions: Emissions::new(),
        }
    }

    /// Leave the key's state as it is.
    pub fn keep() -> Self {
        Step {
            next: Next::Keep,
            emissions: Emissions::new(),
        }
    }

    /// The same step with one more emission (applied in order).
    pub fn emit(mut self, emission: Emission) -> Self {
        self.emissions.push(emission);
        self
    }

    /// The same step with more emissions (applied in order).
    pub fn emit_all(mut self, emissions: impl IntoIterator<Item = Emission>) -> Self {
        self.emissions.extend(emissions);
        self
    }

    /// What happens to the state.
    pub fn next(&self) -> &Next<S> {
        &self.next
    }

    /// The emissions, in send order.
    pub fn emissions(&self) -> &[Emission] {
        &self.emissions
    }

    /// The next state and the emissions, by value.
    pub fn into_parts(self) -> (Next<S>, Vec<Emission>) {
        (self.next, self.emissions.into_vec())
    }

    /// The next state and the emissions, the first still inline.
    pub(crate) fn into_step_parts(self) -> (Next<S>, Emissions) {
        (self.next, self.emissions)
    }
}

/// An `Err` returned by user logic, as the runtime reports it. It shows
/// the error's message, and its [`source`](std::error::Error::source) is
/// that error's own source, so a chain says each thing once.
#[derive(Debug)]
pub struct LogicError(pub BoxError);

impl std::fmt::Display for LogicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LogicError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// What a handler may return: `Vec<Emission>`, one `Emission`, an
/// `Option<Emission>` or [`Emissions`], or any of them in a `Result<_, E>`
/// for an error convertible to a boxed error (`String`, `&str`, every
/// `std::error::Error`).
#[diagnostic::on_unimplemented(
    message = "a handler returns emissions (`Vec<Emission>`, `Emission`, `Option<Emission>` or `Emissions`, or one of them in a `Result`), not `{Self}`",
    label = "this handler's return type",
    note = "emissions come from `sink.send(key, value)`; build several with `vec![..]`, or name the collection: `.collect::<Vec<_>>()`"
)]
pub trait HandlerOutput {
    /// The emissions, or the logic's error.
    fn into_emissions(self) -> Result<Emissions, LogicError>;
}

macro_rules! handler_output {
    ($($t:ty),*) => {$(
        impl HandlerOutput for $t {
            fn into_emissions(self) -> Result<Emissions, LogicError> {
                Ok(Emissions::from(self))
            }
        }

        impl<E: Into<BoxError>> HandlerOutput for Result<$t, E> {
            fn into_emissions(self) -> Result<Emissions, LogicError> {
                self.map(Emissions::from).map_err(|e| LogicError(e.into()))
            }
        }
    )*};
}

handler_output!(Vec<Emission>, Emission, Option<Emission>, Emissions);

/// What a fold may return: `Step<S>`, or `Result<Step<S>, E>`.
#[diagnostic::on_unimplemented(
    message = "a fold returns `Step<S>` or `Result<Step<S>, E>` for the stage's state type, not `{Self}`",
    label = "this fold's return type",
    note = "return `Step::to(next_state)`, `Step::keep()` or `Step::delete()`, with `.emit(..)` for emissions"
)]
pub trait FoldOutput<S> {
    /// The step, or the logic's error.
    fn into_step(self) -> Result<Step<S>, LogicError>;
}

impl<S> FoldOutput<S> for Step<S> {
    fn into_step(self) -> Result<Step<S>, LogicError> {
        Ok(self)
    }
}

impl<S, E: Into<BoxError>> FoldOutput<S> for Result<Step<S>, E> {
    fn into_step(self) -> Result<Step<S>, LogicError> {
        self.map_err(|e| LogicError(e.into()))
    }
}

/// Decorates a fallible handler: an `Err` becomes the emissions `recover`
/// returns for it (typically to a declared error sink), committed in the same
/// transaction as the delivery, exactly once.
///
/// Wrap only logic whose errors are deterministic in the message: a
/// transient failure caught here routes a good record to the error sink for
/// good, where the undecorated handler's abort-and-retry would have
/// delivered it. A panic is not recovered; it still fails the task.
///
/// ```
/// use parsley::{recovering, Codec, Emission, Message, Topic};
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let shipments: Topic<String, i64> = Topic::new("shipments", Codec::utf8(), Codec::int64());
/// let rejects: Topic<String, String> = Topic::new("rejects", Codec::utf8(), Codec::utf8());
///
/// let (s, r) = (shipments.clone(), rejects.clone());
/// let handler = recovering(
///     move |m: &Message<String, i64>| -> Result<Vec<Emission>, String> {
///         match m.value() {
///             Some(&qty) if qty > 0 => Ok(vec![s.send(m.key().cloned(), qty)]),
///             _ => Err("quantity must be positive".to_string()),
///         }
///     },
///     move |m: &Message<String, i64>, e: &String| vec![r.send(m.key().cloned(), e.clone())],
/// );
/// assert_eq!(handler(&Message::new(&orders, "o-1", 3)), vec![shipments.send("o-1", 3)]);
/// assert_eq!(
///     handler(&Message::new(&orders, "o-2", 0)),
///     vec![rejects.send("o-2", "quantity must be positive")]
/// );
/// ```
pub fn recovering<K, V, E, F, R>(handler: F, recover: R) -> impl Fn(&Message<K, V>) -> Vec<Emission>
where
    F: Fn(&Message<K, V>) -> Result<Vec<Emission>, E>,
    R: Fn(&Message<K, V>, &E) -> Vec<Emission>,
{
    move |m| match handler(m) {
        Ok(emissions) => emissions,
        Err(e) => recover(m, &e),
    }
}

/// Decorates a fallible fold: an `Err` keeps the key's prior state and
/// carries the emissions `recover` returns. The same caveats as
/// [`recovering`] apply.
///
/// ```
/// use parsley::{recovering_fold, Codec, Message, Step, Topic};
/// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
/// let rejects: Topic<String, String> = Topic::new("rejects", Codec::utf8(), Codec::utf8());
/// let r = rejects.clone();
/// let fold = recovering_fold(
///     |balance: i64, m: &Message<String, i64>| -> Result<Step<i64>, String> {
///         let amount = m.value().copied().unwrap_or(0);
///         if balance + amount < 0 { Err(format!("overdraft by {}", -(balance + amount))) }
///         else { Ok(Step::to(balance + amount)) }
///     },
///     move |m: &Message<String, i64>, e: &String| vec![r.send(m.key().cloned(), e.clone())],
/// );
/// assert_eq!(fold(10, &Message::new(&payments, "a", -3)), Step::to(7));
/// assert_eq!(
///     fold(10, &Message::new(&payments, "a", -13)),
///     Step::keep().emit(rejects.send("a", "overdraft by 3"))
/// );
/// ```
pub fn recovering_fold<S, K, V, E, F, R>(
    fold: F,
    recover: R,
) -> impl Fn(S, &Message<K, V>) -> Step<S>
where
    F: Fn(S, &Message<K, V>) -> Result<Step<S>, E>,
    R: Fn(&Message<K, V>, &E) -> Vec<Emission>,
{
    move |state, m| match fold(state, m) {
        Ok(step) => step,
        Err(e) => Step::keep().emit_all(recover(m, &e)),
    }
}
