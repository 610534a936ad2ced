//! One transaction over every task: when it is due, what it carries, and
//! what its outcome does to the tasks and their local stores.

use super::*;

/// Where the floor of [`WorkerConfig::commit_when_idle`] counts from: the
/// end of the previous commit, taken as the first commit point after its
/// outcome, so that a commit slower than the floor still leaves the floor
/// of processing before the next one (counted from the hand-over, commits
/// would follow each other back to back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IdleFloor {
    /// No commit ended yet: the floor counts from the last hand-over.
    Unset,
    /// A commit ended; the next commit point starts the floor.
    Ended,
    /// Counting from this time.
    At(i64),
}

impl Worker {
    /// The transaction's delivery reports ([`Ack::Delivered`]).
    pub(super) fn delivered(&mut self, offsets: &[i64]) {
        if self.local.is_none() {
            self.in_flight.forget_reached();
            return;
        }
        self.in_flight.delivered(offsets);
    }

    /// Samples every task's gauges now and publishes them with every held
    /// head ([`published`](Self::published), and in the next
    /// [`Ready::published`]). [`punctuate`](Self::punctuate) does this every
    /// [`SAMPLE_INTERVAL`]; a host (or a test) that wants a fresh reading
    /// can call it any time.
    pub fn sample(&mut self) -> &Published {
        let now = self.now;
        let mut metrics = Vec::with_capacity(self.tasks.len());
        let mut holds = Vec::new();
        for slot in self.tasks.values_mut() {
            let Some(task) = slot.task.as_ref() else {
                continue;
            };
            metrics.push(slot.meters.sample(
                now,
                task,
                slot.throttle.paused.len(),
                self.config.hold_budget.unwrap_or(0),
            ));
            holds.extend(task.held());
        }
        crate::holds::sort_longest_first(&mut holds);
        self.published = Published {
            at: now,
            metrics,
            holds,
        };
        self.out.sampled();
        &self.published
    }

    /// The last sample: every task's metrics and every held head, longest
    /// held first (`explain_holds`). It lists only tasks this worker runs.
    pub fn published(&self) -> &Published {
        &self.published
    }

    /// The open transaction, once it has been open for the commit interval
    /// (and holds anything): a [`Ready`] offered a commit point.
    pub(super) fn poll_transaction(
        &mut self,
        now: i64,
    ) -> Result<Option<Transaction>, WorkerError> {
        self.ready_for_work()?;
        self.now = self.now.max(now);
        if self.idle_floor == IdleFloor::Ended {
            self.idle_floor = IdleFloor::At(self.now);
        }
        if self.commit_due_in(self.now) == Some(Duration::ZERO) {
            let interval = ms(self.config.commit_interval);
            if self
                .last_handed
                .is_some_and(|last| self.now < last.saturating_add(interval))
                && self.drained
                && !self.releases_waiting()
            {
                // Due before the interval: because the fetch drained.
                self.stats.idle_commits += 1;
            }
            self.take_transaction().map(Some)
        } else {
            Ok(None)
        }
    }

    /// How long from `now` (the host's clock) until a
    /// [`ready`](Self::ready) offered a commit point hands a transaction
    /// over: zero when one is due, `None` while no work is open. A host
    /// that waits for records waits no longer than this, so a due commit
    /// is not held back by an idle poll.
    ///
    /// The interval runs from the previous hand-over, so a steady stream
    /// commits every interval (a record waits half of one on average) and
    /// a record after a quiet spell longer than the interval commits at
    /// once; either way there is at most one transaction per interval.
    pub fn commit_due_in(&self, now: i64) -> Option<Duration> {
        if !self.dirty {
            return None;
        }
        // A release waiting for this transaction to go out: at once.
        if self.releases_waiting() {
            return Some(Duration::ZERO);
        }
        let Some(last) = self.last_handed else {
            return Some(Duration::ZERO);
        };
        let mut due = last.saturating_add(ms(self.config.commit_interval));
        if let (Some(streaming), Some(since)) =
            (self.config.stream_records, self.in_flight.streaming_since())
        {
            let limit = streaming.limit;
            // Records went out: the transaction ends well before its
            // coordinator would end it.
            due = due.min(since.saturating_add(ms(limit)));
        }
        if let Some(floor) = self.config.commit_when_idle.filter(|_| self.drained) {
            // Nothing more to hand over: the floor of processing since the
            // previous commit ended is enough.
            let from = match self.idle_floor {
                IdleFloor::Unset => last,
                IdleFloor::Ended => now.max(self.now),
                IdleFloor::At(at) => at,
            };
            due = due.min(from.saturating_add(ms(floor)));
        }
        Some(Duration::from_millis(
            u64::try_from(due.saturating_sub(now.max(self.now))).unwrap_or(0),
        ))
    }

    /// How long from `now` until the worker must be called again with no
    /// record to hand over (a [`punctuate`](Self::punctuate) and a
    /// [`ready`](Self::ready)): the earliest of a due commit
    /// ([`commit_due_in`](Self::commit_due_in)), a restart or a retried
    /// start ([`restart_due_in`](Self::restart_due_in)), a release that
    /// can go on ([`release_due_in`](Self::release_due_in)) and a waiting
    /// state query's deadline. `None`: nothing is due, wait for records.
    /// A host that waits for records waits no longer than this; a restore
    /// job's end is the host's own event, outside it.
    pub fn next_wake(&self, now: i64) -> Option<Duration> {
        let query = self
            .next_query_deadline()
            .map(|at| Duration::from_millis(u64::try_from(at - now.max(self.now)).unwrap_or(0)));
        [
            self.commit_due_in(now),
            self.restart_due_in(now),
            self.release_due_in(),
            query,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The host's fetch is drained: its last poll returned no record (or
    /// none beyond what it handed over). With
    /// [`WorkerConfig::commit_when_idle`], open work is then due after the
    /// floor rather than the whole interval; a record handed over
    /// afterwards ([`on_record`](Self::on_record)) undoes this.
    pub fn fetch_drained(&mut self) {
        self.drained = true;
    }

    /// Whether a task's release stopped at
    /// [`WorkerConfig::release_per_transaction`] and waits for the open
    /// transaction to be handed over.
    pub fn releases_waiting(&self) -> bool {
        self.config.release_per_transaction.is_some()
            && self
                .tasks
                .values()
                .any(|s| s.task.as_ref().is_some_and(Task::release_waiting))
    }

    /// `Some(ZERO)` when a release that stopped at the cap can go on now
    /// (the transaction it filled was handed over): the host punctuates
    /// without waiting, as it does for a due restart.
    pub fn release_due_in(&self) -> Option<Duration> {
        let resumable = matches!(self.state, State::Open)
            && self.config.release_per_transaction.is_some()
            && self
                .tasks
                .values()
                .any(|s| s.task.as_ref().is_some_and(Task::release_resumable));
        resumable.then_some(Duration::ZERO)
    }

    /// Goes on with the releases that stopped at the cap (after the
    /// transaction they filled was handed over).
    pub(super) fn resume_releases(&mut self) -> Result<(), WorkerError> {
        if self.config.release_per_transaction.is_none() {
            return Ok(());
        }
        let ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, s)| s.task.as_ref().is_some_and(Task::release_resumable))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(slot) = self.tasks.get_mut(&id) else {
                continue;
            };
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let r = task.resume_release();
            self.stats.add(slot.meters.count(task));
            match r {
                Err(e) => return self.fail_task(id, e),
                Ok(true) => self.stats.releases_resumed += 1,
                Ok(false) => continue,
            }
            if task.has_work() {
                self.dirty = true;
            }
            let regulate = slot.throttle.engaged(task, self.config.hold_budget);
            if regulate {
                self.regulate(&id);
            }
        }
        Ok(())
    }

    /// Closes the open transaction now, whatever its age (before a
    /// revocation or a shutdown): it comes out in the next
    /// [`ready`](Self::ready). Nothing happens when nothing is open.
    pub fn flush(&mut self) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        if self.dirty {
            let txn = self.take_transaction()?;
            self.out.close(txn);
        }
        Ok(())
    }

    /// Splits the fold cache evenly over the tasks whose fold state reads
    /// through it (their number changes as tasks start and leave).
    fn share_fold_cache(&mut self) {
        let Some(total) = self.config.fold_cache else {
            return;
        };
        let bounded = |slot: &TaskSlot| {
            slot.task
                .as_ref()
                .is_some_and(|t| t.stores().fold.is_bounded())
        };
        // Tasks restoring count too: their replays hold fold state as well.
        let n = self.tasks.values().filter(|s| bounded(s)).count() + self.restores.len();
        let Some(share) = total.checked_div(n) else {
            return;
        };
        self.restores.fold_share().store(share, Ordering::Relaxed);
        for slot in self.tasks.values_mut() {
            if let Some(task) = slot.task.as_mut() {
                task.set_fold_budget(share);
            }
        }
    }

    /// With [`WorkerConfig::stream_records`], what the tasks made since
    /// the last hand-out, for a [`Ready::produce`], with the open
    /// transaction's index of the first; each task's records are counted
    /// as its own in the transaction. At a commit point everything goes;
    /// between them only once [`Streaming::every`] records were handed in
    /// since the last hand-out, so records go out in batches.
    pub(super) fn stream_emitted(&mut self, commit_point: bool) -> (usize, Vec<OutgoingRecord>) {
        let Some(streaming) = self.config.stream_records else {
            return (0, Vec::new());
        };
        if !self.dirty || !matches!(self.state, State::Open) {
            return (0, Vec::new());
        }
        let handed_in = self.in_flight.handed_in();
        if !commit_point && handed_in < streaming.every {
            if handed_in > 0 {
                self.stats.streams_held_for_batch += 1;
            }
            return (0, Vec::new());
        }
        self.in_flight.handing_out();
        let first = self.in_flight.streamed();
        let mut out = Vec::new();
        for (id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let n = task.take_emitted_into(&mut out);
            if n > 0 {
                let events = if self.config.events {
                    task.take_events()
                } else {
                    Vec::new()
                };
                self.in_flight.stream(id, n, self.now, events);
            }
        }
        (if out.is_empty() { 0 } else { first }, out)
    }

    fn take_transaction(&mut self) -> Result<Transaction, WorkerError> {
        let id = self.next_txn;
        let streamed = self.in_flight.begin();
        let mut txn = Transaction {
            id,
            streamed,
            // What the tasks did up to the records streamed, in the order
            // those went out; each task's later acts follow.
            events: self.in_flight.take_events(),
            ..Transaction::default()
        };
        self.share_fold_cache();
        let mut failed = None;
        for (task_id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            if let Local::Lost(reason) = &slot.local {
                // Its fold state beyond the cache is gone with the store.
                failed = Some((
                    task_id.clone(),
                    TaskError::LocalStore {
                        task: task_id.clone(),
                        cause: local::LocalStoreError::Io {
                            task: task_id.clone(),
                            message: reason.clone(),
                        },
                    },
                ));
                break;
            }
            match task.take_commit() {
                Ok(commit) => {
                    // The first task's records move over whole (no copy of
                    // a transaction's worth of records on one task).
                    if txn.records.is_empty() {
                        txn.records = commit.records;
                    } else {
                        txn.records.extend(commit.records);
                    }
                    let at = streamed + txn.records.len();
                    let end = at + commit.changelog.len();
                    self.in_flight
                        .add(task_id, at, commit.changelog.iter().map(|r| &r.topic), end);
                    txn.records.extend(commit.changelog);
                    txn.events
                        .extend(commit.events.into_iter().map(|event| WorkerEvent {
                            task: task_id.clone(),
                            event,
                        }));
                }
                Err(e) => {
                    failed = Some((task_id.clone(), e));
                    break;
                }
            }
            // Every channel's position, moved or not: the offset commit is
            // what carries the group generation, so it is what fences a
            // zombie (EOS v2), even for a transaction of ticks alone.
            for c in &slot.channels {
                {
                    txn.offsets.push(ConsumedOffset {
                        topic: c.topic.clone(),
                        partition: c.partition,
                        offset: c.position,
                    });
                }
            }
        }
        if let Some((id, e)) = failed {
            return self.fail_task(id, e);
        }
        self.next_txn += 1;
        self.state = State::InFlight;
        self.last_handed = Some(self.now);
        Ok(txn)
    }

    /// How the transaction handed over last ended ([`Ack::Committed`]).
    pub(super) fn commit_outcome(
        &mut self,
        outcome: CommitOutcome,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        if !matches!(self.state, State::InFlight) {
            return Err(WorkerError::NoTransaction);
        }
        self.idle_floor = IdleFloor::Ended;
        match outcome {
            CommitOutcome::Committed => {
                // What the transaction wrote, taken: its places are done with.
                let (written, mut reached) = self.in_flight.take_committed();
                for (id, slot) in &mut self.tasks {
                    if let Some(task) = slot.task.as_mut() {
                        match (&mut self.local, &mut slot.local) {
                            (Some(store), Local::Writing { .. }) if written.contains(id) => {
                                let mut entries = Vec::new();
                                task.commit_done_into(Some(&mut entries));
                                let seq = task.stores().local_seq();
                                let reached = reached.remove(id);
                                if write_committed(
                                    store.as_mut(),
                                    self.now,
                                    id,
                                    slot,
                                    (entries, seq),
                                    reached,
                                ) {
                                    // A store that applied the write at once
                                    // lets this commit's entries go now.
                                    if let Some(task) = slot.task.as_mut() {
                                        task.evict_local();
                                    }
                                } else {
                                    self.stats.local_store_write_failures += 1;
                                }
                            }
                            _ => task.commit_done(),
                        }
                    }
                    for c in &mut slot.channels {
                        c.committed = c.position;
                        // A task that restarts later (after a failed reset)
                        // starts from here, not from the assignment's offset.
                        if let Some(a) = self.assigned.get_mut(&(c.topic.clone(), c.partition)) {
                            a.committed = Some(c.position);
                        }
                    }
                }
                self.stats.commits += 1;
                self.since_commit.committed();
                self.state = State::Open;
                self.dirty = false;
                self.prune_diversions();
                // The tasks' state is their committed state now: queries
                // whose causes this commit brought are answered.
                self.answer_waiting_queries();
                Ok(())
            }
            CommitOutcome::Aborted => {
                self.state = State::Open;
                self.rollback(cluster).map(|_| ())
            }
            CommitOutcome::Fenced | CommitOutcome::Unknown => {
                self.fenced();
                Ok(())
            }
        }
    }
}

/// Writes one committed transaction's writes of a task to its local store,
/// with the checkpoint they reach. Without a checkpoint (the host did not
/// report the offsets), or when the write fails, the store is wiped and the
/// task writes no more to it. Returns false then.
fn write_committed(
    store: &mut dyn LocalStore,
    now: i64,
    id: &TaskId,
    slot: &mut TaskSlot,
    (entries, seq): (Vec<crate::runtime::local::LocalEntry>, u64),
    reached: Option<BTreeMap<String, i64>>,
) -> bool {
    let Local::Writing {
        identity,
        checkpoint,
    } = &mut slot.local
    else {
        return true;
    };
    let failure = match reached {
        None => "the commit's changelog offsets were not reported".to_owned(),
        Some(reached) => {
            let mut next = checkpoint.clone();
            next.extend(reached);
            let write = LocalWrite {
                identity: Some(identity.clone()),
                checkpoint: next.clone(),
                replace: false,
                written_at: now,
                entries,
                seq,
            };
            match store.write(id, write) {
                Ok(()) => {
                    *checkpoint = next;
                    return true;
                }
                Err(e) => e.to_string(),
            }
        }
    };
    warn!(task = %id, reason = %failure, "the local store missed a commit: it is wiped, and rebuilt when the task starts again");
    if let Err(e) = store.wipe(id) {
        warn!(task = %id, error = %e, "the local store could not be wiped");
    }
    let bounded = slot
        .task
        .as_ref()
        .is_some_and(|t| t.stores().reads_through_local());
    if !bounded && let Some(task) = slot.task.as_mut() {
        // Every held record is still in memory: keep them there.
        task.detach_held();
    }
    slot.local = if bounded {
        Local::Lost(failure)
    } else {
        Local::Stale
    };
    false
}
