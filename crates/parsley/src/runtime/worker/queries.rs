//! State queries: a read of a task's committed fold state, answered at
//! once when the task's state is its committed state and covers the
//! query's causes, or kept until a commit makes it so or its deadline
//! passes (see [`crate::runtime::query`]).

use std::collections::BTreeMap;

use super::*;
use crate::runtime::query::{QueryAnswer, QueryId, StateQuery};

/// The queries waiting for their causes, and the answers not yet taken.
#[derive(Default)]
pub(super) struct Queries {
    waiting: BTreeMap<QueryId, StateQuery>,
    answers: Vec<(QueryId, QueryAnswer)>,
}

impl Worker {
    /// Asks for `query`'s answer. It is answered now when it can be, or
    /// kept: a commit that brings its causes, or its deadline, answers it.
    /// Take the answers with [`take_query_answers`](Self::take_query_answers).
    pub fn query(&mut self, id: QueryId, query: StateQuery) {
        match self.resolve(&query) {
            Some(answer) => self.queries.answers.push((id, answer)),
            None => {
                self.queries.waiting.insert(id, query);
            }
        }
    }

    /// The answers reached so far, in the order they were reached.
    pub fn take_query_answers(&mut self) -> Vec<(QueryId, QueryAnswer)> {
        std::mem::take(&mut self.queries.answers)
    }

    /// Whether any query waits for its causes (a host that sleeps until
    /// the next deadline should wake for them).
    pub fn queries_waiting(&self) -> bool {
        !self.queries.waiting.is_empty()
    }

    /// When the earliest waiting query's deadline passes (on the worker's
    /// clock, ms), if one waits: it is answered then, by punctuation.
    pub(super) fn next_query_deadline(&self) -> Option<i64> {
        self.queries.waiting.values().map(|q| q.deadline).min()
    }

    /// Answers the waiting queries that can be answered now, and those
    /// whose deadline passed.
    pub(super) fn answer_waiting_queries(&mut self) {
        if self.queries.waiting.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.queries.waiting);
        for (id, query) in waiting {
            match self.resolve(&query) {
                Some(answer) => self.queries.answers.push((id, answer)),
                None => {
                    self.queries.waiting.insert(id, query);
                }
            }
        }
    }

    /// The answer to `query` now: its value, or what it still waits for
    /// once its deadline has passed; `None` while it may still wait.
    fn resolve(&self, query: &StateQuery) -> Option<QueryAnswer> {
        if let Some(answer) = self.answer(query) {
            return Some(answer);
        }
        (query.deadline <= self.now).then(|| {
            QueryAnswer::TimedOut(
                self.running(&query.task)
                    .map(|t| t.unmet_causes(query.after.as_ref()))
                    .unwrap_or_default(),
            )
        })
    }

    fn running(&self, id: &TaskId) -> Option<&Task> {
        self.tasks.get(id).and_then(|s| s.task.as_ref())
    }

    /// The answer to `query` now, or `None` while a causal query must
    /// wait: its task has not delivered every cause, or has delivered work
    /// not yet committed (then its store is behind its frontier).
    fn answer(&self, query: &StateQuery) -> Option<QueryAnswer> {
        let Some(task) = self.running(&query.task) else {
            let here = self.tasks.contains_key(&query.task)
                || self.waiting.contains_key(&query.task)
                || self.restores.contains(&query.task)
                || self.stops.contains(&query.task);
            return Some(if here {
                QueryAnswer::Restoring
            } else {
                QueryAnswer::NotHosted
            });
        };
        // The store is committed state whatever the task is doing; a
        // causal query also needs the frontier it checks to be committed:
        // nothing delivered since the last commit, none in flight.
        if let Some(clock) = &query.after {
            let settled = !task.has_work() && !matches!(self.state, State::InFlight);
            if !settled || !task.node().unmet(clock).is_empty() {
                return None;
            }
        }
        Some(QueryAnswer::Value(
            task.committed_state(&query.key).map(|v| v.into_owned()),
        ))
    }
}
