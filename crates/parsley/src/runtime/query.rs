//! Reading a stage's committed fold state from outside its logic, and
//! waiting for causes first.
//!
//! A [`StateQuery`] names a task, a slot of its fold store and, for a causal
//! query, a clock: the causes the answer must include. The worker answers
//! from the task's committed store (a transaction's writes join it only
//! when the commit is reported, so an uncommitted value is never seen), and
//! only once the task has delivered every claim the clock makes on a
//! channel it consumes and committed what it delivered. A query whose
//! causes are still missing at its deadline is answered with what it
//! waits for, in the words `explain_holds` uses.

use parsley_protocol::VectorClock;

use crate::fold::FoldKey;
use crate::holds::WaitingOn;
use crate::runtime::task::TaskId;

/// The host's name for a query, echoed with its answer.
pub type QueryId = u64;

/// A read of one slot of a task's committed fold state.
#[derive(Clone, Debug)]
pub struct StateQuery {
    /// The task whose state holds the key (the key's partition).
    pub task: TaskId,
    /// The slot.
    pub key: FoldKey,
    /// For a causal query, the causes the answer must include: every claim
    /// on a channel the task consumes.
    pub after: Option<VectorClock>,
    /// When to stop waiting for the causes, on the worker's clock (ms).
    pub deadline: i64,
}

/// The answer to a [`StateQuery`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum QueryAnswer {
    /// The committed state's bytes (`None`: the key has no state).
    Value(Option<Vec<u8>>),
    /// The task does not run here.
    NotHosted,
    /// The task is assigned here and is still restoring or starting.
    Restoring,
    /// The deadline passed with causes still missing.
    TimedOut(Vec<WaitingOn>),
}
