//! Failures: a task's error rolls the open work back and stops that task; a
//! client's fault gets a directive; fencing drops every task.

use super::*;

impl Worker {
    pub(super) fn ready_for_work(&self) -> Result<(), WorkerError> {
        match &self.state {
            State::Open => Ok(()),
            State::InFlight => Err(WorkerError::CommitInFlight),
            State::MustAbort(reason) => Err(WorkerError::AbortRequired {
                reason: reason.clone(),
            }),
        }
    }

    pub(super) fn poison<T>(&mut self, e: impl Into<WorkerError>) -> Result<T, WorkerError> {
        let e = e.into();
        self.state = State::MustAbort(e.to_string());
        Err(e)
    }

    /// A task's own error: it poisons the open transaction like any other,
    /// and the abort that follows stops that task alone.
    pub(super) fn fail_task<T>(
        &mut self,
        id: TaskId,
        e: impl Into<WorkerError>,
    ) -> Result<T, WorkerError> {
        let e = e.into();
        if let WorkerError::Task(task_error) = &e
            && wipe_unreadable(self.local.as_mut(), &id, task_error)
            && let Some(slot) = self.tasks.get_mut(&id)
        {
            slot.local = Local::Stale;
        }
        let transient = matches!(&e, WorkerError::Task(t) if t.is_transient());
        self.failing = Some(Failing {
            task: id,
            reason: e.to_string(),
            refused: None,
            transient,
        });
        self.poison(e)
    }

    /// The task whose error the open transaction must be aborted for, if
    /// a task's error poisoned it (the abort stops that task).
    pub fn failing_task(&self) -> Option<&TaskId> {
        self.failing.as_ref().map(|f| &f.task)
    }

    /// A failure the host's client reported, by class; the answer is what
    /// the host does next:
    ///
    /// | fault | what the worker does | directive |
    /// |-------|----------------------|-----------|
    /// | [`Fault::Fenced`] | drops every task | [`Directive::Rejoin`] |
    /// | [`Fault::ProducerFenced`], [`Fault::ClientHung`], [`Fault::AbortFailed`], after the host asked the coordinator to commit ([`Worker::ending`]) | the commit's fate is unknown: drops every task | [`Directive::Rejoin`] |
    /// | [`Fault::ProducerFenced`], [`Fault::ClientHung`], [`Fault::AbortFailed`] not retriable | counts the replacement | [`Directive::ReplaceProducer`]; report the abort once the new producer is ready. After [`MAX_PRODUCER_REPLACEMENTS`] in a row without a commit: drops every task, [`Directive::Rejoin`] |
    /// | [`Fault::AbortFailed`], retriable | counts the retry | [`Directive::Retry`] (call the abort again), [`ABORT_RETRIES`] time; then as a failed abort that is not retriable |
    /// | [`Fault::Fatal`] | drops every task | [`Directive::Fail`] (the error handler decides) |
    /// | [`Fault::Abortable`], [`Fault::Transient`] | counts the abort | [`Directive::Abort`]; report the abort as usual. The [`Ready`] after it asks the host to wait ([`Ready::backoff`]: [`WorkerConfig::transient_backoff`], doubling with each such abort before a commit goes through) |
    /// | [`Fault::Retriable`] in a commit | counts the retry | [`Directive::Retry`], up to [`WorkerConfig::commit_retries`] times; then the commit's fate is unknown: drops every task, [`Directive::Rejoin`] |
    /// | [`Fault::RecordRefused`] | marks the task that made the record | [`Directive::Abort`]; the abort stops that task, and its [`TaskFailure::refused`] names the record |
    /// | [`Fault::Poll`], not fatal | nothing (the client retries) | [`Directive::Continue`] |
    /// | [`Fault::Poll`], fatal | drops every task | [`Directive::Fail`] |
    // Longer than 100 lines on purpose: one arm per row of the table
    // above, so the table and the code read side by side.
    pub fn on_fault(&mut self, fault: Fault) -> Directive {
        self.stats.faults += 1;
        let class = fault.class();
        let commit_sent = matches!(self.state, State::InFlight) && self.in_flight.commit_sent();
        match fault {
            Fault::ProducerFenced(message)
            | Fault::ClientHung(message)
            | Fault::AbortFailed { message, .. }
                if commit_sent =>
            {
                warn!(class, error = %message, "the producer failed after it asked its coordinator to commit, which may have recorded the commit: the commit's fate is unknown; dropping every task and rejoining");
                self.fenced();
                Directive::Rejoin
            }
            Fault::Poll {
                fatal: false,
                message,
            } => {
                warn!(class, error = %message, "consumer error; the client retries it");
                Directive::Continue
            }
            Fault::Fenced(message) => {
                warn!(class, error = %message, "this member is no longer in the group: another owner has the tasks now; dropping every task and joining the group again");
                self.fenced();
                Directive::Rejoin
            }
            Fault::ProducerFenced(message) => self.replace_producer(
                class,
                &message,
                "the producer was fenced: its transaction coordinator ended the open transaction (one that ran past transaction.timeout.ms, as a broker failover can make it), or another producer took its transactional id",
            ),
            Fault::ClientHung(message) => self.replace_producer(
                class,
                &message,
                "a call of the producer never returned",
            ),
            Fault::AbortFailed { retriable, message } => {
                let retry = if retriable && matches!(self.state, State::InFlight) {
                    self.in_flight.retry_abort(ABORT_RETRIES, COMMIT_RETRY)
                } else {
                    None
                };
                if let Some((after, attempt)) = retry {
                    warn!(class, error = %message, attempt, ?after, "the abort did not reach the transaction coordinator (unreachable or moving); trying it again");
                    return Directive::Retry { after };
                }
                let why = if retriable {
                    "the abort never reached the transaction coordinator"
                } else {
                    "the transaction coordinator refused the abort"
                };
                self.replace_producer(class, &message, why)
            }
            Fault::Fatal(message)
            | Fault::Poll {
                fatal: true,
                message,
            } => {
                self.fenced();
                Directive::Fail(Box::new(WorkerError::Client { class, message }))
            }
            Fault::Abortable(message) | Fault::Transient(message) => {
                let (wait, aborts_in_a_row) = self
                    .since_commit
                    .transient_abort(&self.config.transient_backoff);
                self.stats.transient_aborts += 1;
                warn!(class, error = %message, aborts_in_a_row, ?wait, "the transaction could not be written now; it aborts, and is tried again after a pause");
                Directive::Abort
            }
            Fault::Retriable(message) => {
                let in_flight = matches!(self.state, State::InFlight);
                let retry = if in_flight {
                    self.in_flight
                        .retry(self.config.commit_retries, COMMIT_RETRY)
                } else {
                    None
                };
                if let Some((after, attempt)) = retry {
                    self.stats.commit_retries += 1;
                    warn!(class, error = %message, attempt, ?after, "a commit step failed in a way that may pass on a retry; retrying it");
                    Directive::Retry { after }
                } else {
                    warn!(class, error = %message, "the commit's fate is unknown after its retries; dropping every task and rejoining");
                    self.fenced();
                    Directive::Rejoin
                }
            }
            Fault::RecordRefused {
                record,
                topic,
                partition,
                origin,
                reason,
            } => {
                let owner = self.in_flight.owner_of(record);
                let Some(task) = owner else {
                    // Not a record of the transaction in flight: nothing to
                    // pin it on, so nothing is safe to keep.
                    self.fenced();
                    return Directive::Fail(Box::new(WorkerError::Client {
                        class,
                        message: format!(
                            "record {record} for {topic}:{partition} was refused ({reason}), but the transaction in flight has no such record"
                        ),
                    }));
                };
                let diverted = origin.is_some_and(|o| {
                    self.diversions
                        .get(&task)
                        .is_some_and(|d| d.contains_key(&o))
                });
                let why = if diverted {
                    format!(
                        "the dead-letter topic {topic:?} refused the emission sent there instead of its sink: {reason}"
                    )
                } else {
                    format!("a record for {topic}:{partition} could not be produced: {reason}")
                };
                self.failing = Some(Failing {
                    task,
                    reason: why,
                    // A dead-letter record refused in turn is not sent
                    // anywhere else: the task fails.
                    refused: (!diverted).then_some(RefusedRecord {
                        topic,
                        partition,
                        reason,
                        origin,
                    }),
                    transient: false,
                });
                Directive::Abort
            }
        }
    }

    /// The producer can go no further (`why`): a new one with the same
    /// transactional id ends what it left open, and the tasks go back to
    /// their committed state as for an abort, keeping the membership. A
    /// producer replaced [`MAX_PRODUCER_REPLACEMENTS`] times without a
    /// commit in between (two members taking one transactional id from
    /// each other, a coordinator that keeps refusing) is given up with the
    /// membership instead.
    fn replace_producer(&mut self, class: &'static str, message: &str, why: &str) -> Directive {
        if let Err(replacements) = self
            .since_commit
            .replace_producer(MAX_PRODUCER_REPLACEMENTS)
        {
            warn!(class, error = %message, replacements, "{why}, again, with no commit since the producer was last replaced: dropping every task and joining the group again");
            self.fenced();
            return Directive::Rejoin;
        }
        self.stats.producer_replacements += 1;
        warn!(class, error = %message, "{why}: replacing the producer (its open transaction ends with it) and going on from the committed state, keeping the group membership");
        Directive::ReplaceProducer
    }

    /// After a refused record stopped its task ([`TaskFailure::refused`]),
    /// sends that emission to `topic`, a dead-letter topic, instead of its
    /// sink, and restarts the task at once (no backoff: this is a fix, not
    /// a retry). The emission goes there unstamped, with its own headers
    /// and the `parsley.dlq.*` headers naming the delivery that made it,
    /// the sink and the reason. Returns false when the task is not stopped
    /// here (revoked meanwhile).
    pub fn divert(
        &mut self,
        task: &TaskId,
        refused: &RefusedRecord,
        topic: &str,
        cluster: &dyn Cluster,
    ) -> Result<bool, WorkerError> {
        let Some(origin) = refused.origin else {
            return Err(WorkerError::NotAnEmission {
                task: task.clone(),
                topic: refused.topic.clone(),
                reason: refused.reason.clone(),
            });
        };
        if !self.stops.contains(task) {
            return Ok(false);
        }
        // The topic's partition count is looked up when the task starts,
        // where a failed lookup is retried.
        self.diversions.entry(task.clone()).or_default().insert(
            origin,
            Diversion {
                topic: topic.to_owned(),
                partitions: 0,
                reason: refused.reason.clone(),
            },
        );
        self.stops.restart_now(task, self.now);
        self.restart_due(cluster)?;
        Ok(true)
    }

    /// Drops the diversions whose delivery is committed (it will not be
    /// handled again).
    pub(super) fn prune_diversions(&mut self) {
        let tasks = &self.tasks;
        self.diversions.retain(|id, d| {
            let Some(slot) = tasks.get(id) else {
                // Stopped (or waiting): kept for its restart.
                return true;
            };
            d.retain(|o, _| {
                slot.channels
                    .iter()
                    .find(|c| c.channel == o.channel)
                    .is_none_or(|c| o.offset >= c.committed)
            });
            !d.is_empty()
        });
    }

    /// Drops every task and the whole assignment: the producer or the group
    /// membership was fenced (also outside a commit), or a commit's fate is
    /// unknown. The host rejoins the group; nothing here is committed.
    pub fn fenced(&mut self) {
        self.stats.fenced += 1;
        warn!("fenced or commit fate unknown: dropping every task; rejoin the group");
        // Every task this worker had, in whatever state, lets its file go.
        let ids: BTreeSet<TaskId> = self
            .tasks
            .keys()
            .chain(self.stops.tasks())
            .chain(self.waiting.keys())
            .chain(self.restores.tasks())
            .cloned()
            .collect();
        for id in &ids {
            self.close_local(id);
        }
        self.tasks.clear();
        // A transaction a flush closed and the host has not taken yet is
        // the dropped tasks' too, as are their restore jobs, pauses and
        // seeks.
        self.out.forget_tasks();
        self.in_flight.forget_tasks();
        self.restores.cancel_all();
        self.waiting.clear();
        self.failing = None;
        self.stops.clear();
        self.partial.clear();
        self.diversions.clear();
        self.since_commit.forget();
        self.routes = Routes::default();
        self.assigned.clear();
        self.state = State::Open;
        self.dirty = false;
    }

    /// The host aborted the open transaction (a task failed, or the
    /// assignment was lost). Every task returns to its committed state and
    /// every channel is sought back to its committed position. The records
    /// the open transaction had produced so far come out in the next
    /// [`Ready::abandoned`], for a host that streams records into the open
    /// transaction.
    pub fn abort(&mut self, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        if matches!(self.state, State::InFlight) {
            return Err(WorkerError::CommitInFlight);
        }
        self.state = State::Open;
        let streamed = self.in_flight.streamed() > 0;
        let abandoned = self.rollback(cluster)?;
        if self.config.stream_records.is_some() {
            // The host has what went out; the rest never does.
            if streamed {
                self.out.abort_streamed();
            }
        } else {
            self.out.abandon(abandoned);
        }
        Ok(())
    }

    pub(super) fn rollback(
        &mut self,
        cluster: &dyn Cluster,
    ) -> Result<Vec<OutgoingRecord>, WorkerError> {
        self.stats.aborts += 1;
        self.dirty = false;
        self.out.drop_seeks();
        // Whatever was streamed into it is aborted with it.
        self.in_flight.close();
        let mut abandoned = Vec::new();
        if let Some(failing) = self.failing.take()
            && let Some(mut slot) = self.tasks.remove(&failing.task)
        {
            if let Some(old) = slot.task.as_mut() {
                abandoned.extend(old.take_abandoned());
            }
            self.stop_task(slot, failing);
        }
        let ids: Vec<TaskId> = self.tasks.keys().cloned().collect();
        let mut failed = None;
        for id in &ids {
            let Some(slot) = self.tasks.get_mut(id) else {
                continue;
            };
            let Some(mut old) = slot.task.take() else {
                continue;
            };
            abandoned.extend(old.take_abandoned());
            for c in &mut slot.channels {
                c.position = c.committed;
                c.pending = None;
            }
            self.stats.add(slot.meters.count(&old));
            slot.meters.rebase();
            match old.reset(cluster, cluster, self.now) {
                Ok(mut task) => {
                    if task.node().held_count() > 0 && task.stores().held.is_attached() {
                        self.stats.resets_with_held_on_disk += 1;
                    }
                    // The rebuilt task keeps its hold window itself.
                    task.set_hold_budget(self.config.hold_budget);
                    slot.task = Some(task);
                    // What it holds starts again from the committed state.
                    let paused = std::mem::take(&mut slot.throttle.paused);
                    slot.throttle = Throttle::default();
                    for i in paused {
                        let c = &slot.channels[i];
                        self.out.flow(FlowChange {
                            topic: c.topic.clone(),
                            partition: c.partition,
                            paused: false,
                        });
                    }
                }
                Err(e) => {
                    // The committed state is in the changelogs: the task
                    // restarts from there, now or at the next punctuation.
                    warn!(task = %id, error = %e, "task reset failed; it restarts from its changelogs");
                    // A store that cannot read back what it holds would
                    // fail the restart too: it is rebuilt.
                    wipe_unreadable(self.local.as_mut(), id, &e);
                    if let Some(slot) = self.tasks.remove(id) {
                        for c in &slot.channels {
                            self.routes.remove(&c.topic, c.partition);
                        }
                        // Its next start fetches them again.
                        for &i in &slot.throttle.paused {
                            let c = &slot.channels[i];
                            self.out.flow(FlowChange {
                                topic: c.topic.clone(),
                                partition: c.partition,
                                paused: false,
                            });
                        }
                    }
                    if transient_task(&e) {
                        self.lookup_failed(id.clone(), &e, "task reset");
                    } else {
                        // Its own failure: it stops alone, and the error
                        // handler hears of it.
                        self.fail_start(id.clone(), WorkerError::Task(e))?;
                    }
                }
            }
        }
        for id in &ids {
            if !self.tasks.contains_key(id) {
                continue;
            }
            if let Err(e) = self.begin_task(id, false) {
                failed.get_or_insert(match e {
                    WorkerError::Task(t) => t,
                    other => return self.poison(other),
                });
            }
        }
        if let Some(e) = failed {
            return self.poison(e);
        }
        debug!(
            tasks = ids.len(),
            "transaction aborted; tasks back at their committed state"
        );
        Ok(abandoned)
    }
}

/// Transient faults since the last commit: transactions aborted for one
/// (each pause longer than the last), producers replaced (a limit, then
/// the membership goes), and the pause the host has not taken yet.
#[derive(Debug, Default)]
pub(super) struct SinceCommit {
    aborts_in_a_row: u32,
    producer_replacements: u32,
    /// How long the host waits before it polls again, not yet handed over
    /// ([`Ready::backoff`]).
    backoff: Option<Duration>,
}

impl SinceCommit {
    /// A transaction aborts for a transient fault: the pause before the
    /// next attempt (the longest asked for, if the host has not taken one
    /// yet), and how many aborted in a row.
    fn transient_abort(&mut self, steps: &Backoff) -> (Duration, u32) {
        let wait = steps.step(self.aborts_in_a_row);
        self.aborts_in_a_row = self.aborts_in_a_row.saturating_add(1);
        self.backoff = Some(self.backoff.map_or(wait, |b| b.max(wait)));
        (wait, self.aborts_in_a_row)
    }

    /// A producer is to be replaced: `Ok` with the replacements so far, or
    /// `Err` with them when `max` were made with no commit in between.
    fn replace_producer(&mut self, max: u32) -> Result<u32, u32> {
        if self.producer_replacements >= max {
            return Err(self.producer_replacements);
        }
        self.producer_replacements += 1;
        Ok(self.producer_replacements)
    }

    /// A transaction committed: the faults in a row start again.
    pub(super) fn committed(&mut self) {
        self.aborts_in_a_row = 0;
        self.producer_replacements = 0;
    }

    /// Every task was dropped: no pause is owed, and the next producer
    /// starts a new count.
    fn forget(&mut self) {
        self.backoff = None;
        self.producer_replacements = 0;
    }

    /// The pause the host owes, taken.
    pub(super) fn take_backoff(&mut self) -> Option<Duration> {
        self.backoff.take()
    }
}
