//! The transaction in flight, as the worker keeps it from its first record
//! handed out (streamed, or at the hand-over) to its outcome: which task
//! made which of its records (to pin a refused record on its task), where
//! each task's changelog records lie and the checkpoints they reach once
//! delivered (for the local stores), and the commit's and the abort's
//! retries so far.

use super::*;

/// A run of one task's changelog records on one topic in the transaction
/// in flight.
#[derive(Debug)]
struct Span {
    task: TaskId,
    topic: Arc<str>,
    end: usize,
}

/// What the worker knows of the transaction in flight.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Per task, the end (exclusive) of its records.
    owners: Vec<(usize, TaskId)>,
    /// Where each task's changelog records lie.
    spans: Vec<Span>,
    /// The checkpoint each task's changelog records reach, once the host
    /// reported the transaction's offsets ([`Ack::Delivered`]).
    reached: BTreeMap<TaskId, BTreeMap<String, i64>>,
    /// Retries of the commit so far.
    commit_retries: u32,
    /// Retries of the abort so far.
    abort_retries: u32,
    /// Records of the open transaction already handed out
    /// ([`Ready::produce`]), and when the first of them was, while any
    /// was.
    streamed: Option<(usize, i64)>,
    /// What the tasks did up to the records streamed, in the order those
    /// went out.
    events: Vec<WorkerEvent>,
    /// Records handed in since what the tasks made last went out (or the
    /// transaction was handed over).
    handed_in: usize,
    /// The host asked the coordinator to commit the transaction in flight
    /// ([`Worker::ending`]): its fate is the coordinator's from then on.
    ending: bool,
}

impl InFlight {
    /// The open transaction is handed over: nothing of the last one stays
    /// (what this one streamed aside). Returns how many records it
    /// streamed, the index of the hand-over's first record.
    pub(super) fn begin(&mut self) -> usize {
        let streamed = self.streamed();
        if streamed == 0 {
            self.clear();
        }
        self.handed_in = 0;
        self.commit_retries = 0;
        self.abort_retries = 0;
        self.ending = false;
        streamed
    }

    /// The host asked the coordinator to commit ([`Worker::ending`]).
    pub(super) fn ending(&mut self) {
        self.ending = true;
    }

    /// Whether the host asked the coordinator to commit the transaction in
    /// flight: a fault now leaves its fate unknown.
    pub(super) fn commit_sent(&self) -> bool {
        self.ending
    }

    fn clear(&mut self) {
        self.ending = false;
        self.events.clear();
        self.owners.clear();
        self.spans.clear();
        self.reached.clear();
    }

    /// How many records of the open transaction went out before its
    /// hand-over.
    pub(super) fn streamed(&self) -> usize {
        self.streamed.map_or(0, |(n, _)| n)
    }

    /// A record was handed in ([`Worker::on_record`]).
    pub(super) fn handed_in_one(&mut self) {
        self.handed_in = self.handed_in.saturating_add(1);
    }

    /// Records handed in since what the tasks made last went out.
    pub(super) fn handed_in(&self) -> usize {
        self.handed_in
    }

    /// What the tasks made goes out now: the count starts again.
    pub(super) fn handing_out(&mut self) {
        self.handed_in = 0;
    }

    /// When the open transaction's first record went out, if one did.
    pub(super) fn streaming_since(&self) -> Option<i64> {
        self.streamed.map(|(_, at)| at)
    }

    /// `count` records of `task` go out now, at `now`, into the open
    /// transaction (the first of them opens it), after what it did up to
    /// them (`events`). Returns the index of the first.
    pub(super) fn stream(
        &mut self,
        task: &TaskId,
        count: usize,
        now: i64,
        events: Vec<TaskEvent>,
    ) -> usize {
        let first = match self.streamed {
            Some((n, _)) => n,
            None => {
                self.clear();
                self.streamed = Some((0, now));
                0
            }
        };
        let end = first + count;
        if let Some((n, _)) = &mut self.streamed {
            *n = end;
        }
        // A task's records that follow its own last ones extend its run
        // (one entry, and no copy of its id, per run rather than per
        // hand-out).
        match self.owners.last_mut() {
            Some((last, owner)) if owner == task => *last = end,
            _ => self.owners.push((end, task.clone())),
        }
        self.events
            .extend(events.into_iter().map(|event| WorkerEvent {
                task: task.clone(),
                event,
            }));
        first
    }

    /// What the tasks did up to the records streamed, taken for the
    /// transaction's hand-over.
    pub(super) fn take_events(&mut self) -> Vec<WorkerEvent> {
        std::mem::take(&mut self.events)
    }

    /// The transaction ended (committed, aborted, or its tasks dropped):
    /// the next record opens another.
    pub(super) fn close(&mut self) {
        self.streamed = None;
        self.handed_in = 0;
        self.events.clear();
    }

    /// A task's part joined the transaction: its changelog records, whose
    /// topics are `changelog`, start at `at`, and its records end
    /// (exclusive) at `end`.
    pub(super) fn add<'a>(
        &mut self,
        task: &TaskId,
        at: usize,
        changelog: impl IntoIterator<Item = &'a Arc<str>>,
        end: usize,
    ) {
        let mut run: Option<Span> = None;
        for (at, topic) in (at..).zip(changelog) {
            match &mut run {
                Some(span) if span.topic == *topic => span.end = at + 1,
                _ => {
                    self.spans.extend(run.take());
                    run = Some(Span {
                        task: task.clone(),
                        topic: topic.clone(),
                        end: at + 1,
                    });
                }
            }
        }
        self.spans.extend(run);
        self.owners.push((end, task.clone()));
    }

    /// The transaction's delivery reports: each task's checkpoint per
    /// changelog topic. A task with a record that got no offset reaches
    /// none.
    pub(super) fn delivered(&mut self, offsets: &[i64]) {
        self.reached.clear();
        let mut broken = BTreeSet::new();
        for span in &self.spans {
            // A partition's records get increasing offsets: the last one
            // is the furthest.
            match span.end.checked_sub(1).and_then(|i| offsets.get(i)) {
                Some(&offset) if offset >= 0 => {
                    let next = self
                        .reached
                        .entry(span.task.clone())
                        .or_default()
                        .entry(span.topic.to_string())
                        .or_insert(0);
                    *next = (*next).max(offset.saturating_add(1));
                }
                _ => {
                    broken.insert(span.task.clone());
                }
            }
        }
        for task in broken {
            self.reached.remove(&task);
        }
    }

    /// Forgets the delivery reports only (a worker without local stores
    /// does not keep them).
    pub(super) fn forget_reached(&mut self) {
        self.reached.clear();
    }

    /// The transaction committed: the tasks with changelog records in it,
    /// and the checkpoints their records reached, taken (the records'
    /// places no longer matter).
    pub(super) fn take_committed(
        &mut self,
    ) -> (BTreeSet<TaskId>, BTreeMap<TaskId, BTreeMap<String, i64>>) {
        self.close();
        let written = self.spans.drain(..).map(|s| s.task).collect();
        (written, std::mem::take(&mut self.reached))
    }

    /// The tasks were dropped: nothing of the transaction is theirs now.
    pub(super) fn forget_tasks(&mut self) {
        self.clear();
        self.close();
    }

    /// The task that made record `record` of the transaction.
    pub(super) fn owner_of(&self, record: usize) -> Option<TaskId> {
        self.owners
            .iter()
            .find(|(end, _)| record < *end)
            .map(|(_, id)| id.clone())
    }

    /// The next retry of the commit, if `max` allows one: its wait
    /// (doubling from `first`) and its number.
    pub(super) fn retry(&mut self, max: u32, first: Duration) -> Option<(Duration, u32)> {
        next_retry(&mut self.commit_retries, max, first)
    }

    /// The next retry of the abort, as [`retry`](Self::retry) is the
    /// commit's.
    pub(super) fn retry_abort(&mut self, max: u32, first: Duration) -> Option<(Duration, u32)> {
        next_retry(&mut self.abort_retries, max, first)
    }
}

/// One more retry after `done`, if `max` allows it: its wait, doubling
/// from `first`, and its number.
fn next_retry(done: &mut u32, max: u32, first: Duration) -> Option<(Duration, u32)> {
    if *done >= max {
        return None;
    }
    let after = first.saturating_mul(1 << (*done).min(16));
    *done += 1;
    Some((after, *done))
}
