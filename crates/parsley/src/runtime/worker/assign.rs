//! The group's assignment: partitions grouped into tasks, where each channel
//! starts, the seeks that put it there, and revocation.

use super::*;

impl Worker {
    /// The group assigned these partitions (in addition to what this worker
    /// holds). Starts every task they complete, restoring its stores from
    /// its changelogs, and queues the consumer seeks.
    pub fn assign(
        &mut self,
        partitions: Vec<AssignedPartition>,
        cluster: &dyn Cluster,
        now: i64,
    ) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        self.now = self.now.max(now);
        // Validate the whole assignment before changing anything.
        let mut touched = BTreeSet::new();
        let mut incoming = BTreeSet::new();
        for p in &partitions {
            if p.committed_metadata.as_deref() == Some(parsley_protocol::host::RESET_IN_PROGRESS) {
                return Err(WorkerError::ResetUnfinished {
                    topic: p.topic.clone(),
                    partition: p.partition,
                });
            }
            let Some(id) = self.task_of(&p.topic, p.partition) else {
                return Err(WorkerError::UnknownPartition {
                    application: self.app.application_id().to_owned(),
                    topic: p.topic.clone(),
                    partition: p.partition,
                });
            };
            touched.insert(id);
            incoming.insert((p.topic.clone(), p.partition));
        }
        for id in &touched {
            if self.tasks.contains_key(id)
                || self.waiting.contains_key(id)
                || self.restores.contains(id)
                || self.stops.contains(id)
            {
                continue;
            }
            let needed = self.needed(id);
            let here = |k: &(String, i32)| self.assigned.contains_key(k) || incoming.contains(k);
            if self.config.assignment == Assignment::Complete && !needed.iter().all(here) {
                let fmt =
                    |v: &[&(String, i32)]| v.iter().map(|(t, p)| format!("{t}:{p}")).collect();
                let held: Vec<&(String, i32)> = needed.iter().filter(|k| here(k)).collect();
                return Err(WorkerError::SplitTask {
                    task: id.clone(),
                    needed: fmt(&needed.iter().collect::<Vec<_>>()),
                    assigned: fmt(&held),
                });
            }
        }
        for p in partitions {
            self.assigned.insert((p.topic.clone(), p.partition), p);
        }
        for id in touched {
            if self.tasks.contains_key(&id)
                || self.waiting.contains_key(&id)
                || self.restores.contains(&id)
                || self.stops.contains(&id)
            {
                continue;
            }
            let needed = self.needed(&id);
            if !needed.iter().all(|k| self.assigned.contains_key(k)) {
                // Only under incremental assignment (checked above): wait
                // for the rest, fetching nothing meanwhile.
                self.hold_partial(&id);
                continue;
            }
            if self.partial.remove(&id) {
                debug!(task = %id, "every partition of the task is here; it forms");
                for (topic, partition) in needed {
                    self.out.flow(FlowChange {
                        topic,
                        partition,
                        paused: false,
                    });
                }
            }
            self.try_start(id, cluster)?;
        }
        Ok(())
    }

    /// A task with only some of its partitions here: they are paused (and
    /// their records dropped) until the rest arrive.
    fn hold_partial(&mut self, id: &TaskId) {
        if self.partial.insert(id.clone()) {
            self.stats.partial_tasks += 1;
        }
        let here = self.pause_held(id);
        debug!(task = %id, here, "some of the task's partitions are here; it forms when the rest arrive");
    }

    /// Pauses every partition of the task this worker holds (nothing is
    /// fetched for a task that cannot run); returns how many.
    pub(super) fn pause_held(&mut self, id: &TaskId) -> usize {
        let here: Vec<(String, i32)> = self
            .needed(id)
            .into_iter()
            .filter(|k| self.assigned.contains_key(k))
            .collect();
        let n = here.len();
        for (topic, partition) in here {
            self.out.flow(FlowChange {
                topic,
                partition,
                paused: true,
            });
        }
        n
    }

    /// Tasks waiting for the rest of their partitions
    /// ([`Assignment::Incremental`]).
    pub fn partial_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.partial.iter()
    }

    /// Starts a task; a transient lookup failure leaves it waiting (its
    /// partitions' records are dropped, to be fetched again from its start
    /// position once it runs), to be retried at a punctuation after a
    /// pause ([`WorkerConfig::lookup_retry`]). Any other failure is final.
    pub(super) fn try_start(
        &mut self,
        id: TaskId,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        match self.start_task(&id, cluster) {
            Ok(()) => {
                if let Some(r) = self.waiting.remove(&id) {
                    info!(task = %id, failed_lookups = r.failures, "task started once its lookups went through");
                }
                self.restores.stable(&id);
                Ok(())
            }
            Err(e) if self.waits_on(&id, &e) => {
                self.lookup_failed(id, &e, "task start");
                Ok(())
            }
            Err(e) => self.fail_start(id, e),
        }
    }

    /// Whether a task whose start failed with `e` waits and tries again: a
    /// lookup that may succeed later, and a changelog that reads only up
    /// to below the end the task started against
    /// ([`ChangelogError::Unstable`]), until
    /// [`WorkerConfig::changelog_stable_wait`] has passed since that was
    /// first seen for the task (then the error is the task's).
    pub(super) fn waits_on(&mut self, id: &TaskId, e: &WorkerError) -> bool {
        if !transient(e) {
            return false;
        }
        if matches!(e, WorkerError::Changelog(ChangelogError::Unstable { .. })) {
            self.stats.short_restores += 1;
            let since = self.restores.unstable_since(id, self.now);
            if self.now.saturating_sub(since) >= ms(self.config.changelog_stable_wait) {
                self.restores.stable(id);
                return false;
            }
        }
        true
    }

    /// A task's start (or restore) failed on a lookup that may succeed
    /// later: it waits, and is tried again after its pause. The first
    /// failure in a row is a WARN, and every tenth after it (a task that
    /// keeps waiting shows); the others, DEBUG.
    pub(super) fn lookup_failed(&mut self, id: TaskId, e: &dyn std::fmt::Display, what: &str) {
        self.stats.task_start_retries += 1;
        let failures = self.waiting.get(&id).map_or(0, |r| r.failures);
        let wait = self.config.lookup_retry.step(failures);
        if failures == 0 {
            warn!(task = %id, error = %e, ?wait, "{what} failed on a lookup (a leader or coordinator moving, a broker down?); trying again after a pause");
        } else if (failures + 1).is_multiple_of(10) {
            warn!(task = %id, error = %e, ?wait, failures = failures + 1, "{what} still fails on a lookup; the task keeps waiting");
        } else {
            debug!(task = %id, error = %e, ?wait, failures = failures + 1, "{what} failed on a lookup again");
        }
        // Nothing is fetched for it meanwhile: its records would be
        // dropped, and a fetch from the log start that retention overtakes
        // would stop the consumer on an offset out of range.
        self.pause_held(&id);
        self.waiting.insert(
            id,
            Retrying {
                failures: failures + 1,
                at: self.now.saturating_add(ms(wait)),
            },
        );
    }

    /// Tasks still waiting to start.
    pub fn waiting_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.waiting.keys()
    }

    /// The partitions a task consumes: partition `p` of every source and of
    /// the tick topic.
    pub(super) fn needed(&self, id: &TaskId) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        if let Some(stage) = self.app.stage(&id.stage) {
            for t in stage.source_topics() {
                out.push((t.to_owned(), id.partition));
            }
        }
        if let Some(t) = self.app.tick_topic(&id.stage) {
            out.push((t.to_owned(), id.partition));
        }
        out
    }

    fn task_of(&self, topic: &str, partition: i32) -> Option<TaskId> {
        self.app.stages().iter().find_map(|s| {
            let consumes =
                s.source_topics().contains(&topic) || self.app.tick_topic(s.name()) == Some(topic);
            consumes.then(|| TaskId {
                stage: s.name().to_owned(),
                partition,
            })
        })
    }

    /// The consumer stopped fetching a partition because its fetch offset
    /// is out of range (librdkafka's `auto.offset.reset=error`, which the
    /// Kafka runtime sets): retention or DeleteRecords removed records
    /// this thread had not read yet, or the log was truncated. The worker
    /// looks up the log start of every channel of its running tasks; each
    /// channel whose position lies below its log start has lost records,
    /// and [`WorkerConfig::on_retention_loss`] decides: fail with
    /// [`WorkerError::RetentionLoss`], or go on from the log start (a seek
    /// to ask for, the frontier moved past the loss). When no channel is
    /// below its log start the cause is unknown, and the worker fails with
    /// [`WorkerError::OffsetOutOfRange`] rather than guess.
    ///
    /// A channel below its log start whose records still sit in the
    /// consumer's buffer counts as lost too: what is below the log start
    /// is gone from the cluster, and a restart could not read it again.
    pub fn offset_out_of_range(&mut self, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        let ids: BTreeSet<parsley_protocol::TopicId> = self
            .tasks
            .values()
            .flat_map(|s| s.channels.iter().map(|c| c.channel.topic))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let starts = match cluster.log_starts(&ids) {
            Ok(s) => s,
            // A failed lookup cannot tell a loss from anything else; the
            // consumer stays stopped on that partition, so fail loudly.
            Err(e) => return self.poison(WorkerError::LogStartUnknown(e.to_string())),
        };
        let on_loss = self.config.on_retention_loss;
        let mut lost = 0;
        for (id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            for c in &mut slot.channels {
                let log_start = match starts.get(&c.channel.topic) {
                    Some(parsley_protocol::TopicOffsets::Present(p)) => {
                        p.get(&c.partition).copied().unwrap_or(0)
                    }
                    _ => continue,
                };
                if c.position >= log_start {
                    continue;
                }
                lost += 1;
                let at = c.position;
                match retention_loss(on_loss, &mut self.stats, id, c, at, log_start) {
                    Ok(start) => {
                        c.restart_at(start, &mut self.out);
                        task.position_advance(c.channel, start)?;
                        self.dirty = true;
                    }
                    Err(e) => {
                        self.failing = Some(Failing {
                            task: id.clone(),
                            reason: e.to_string(),
                            refused: None,
                            transient: false,
                        });
                        self.state = State::MustAbort(e.to_string());
                        return Err(e);
                    }
                }
            }
        }
        if lost == 0 {
            // A partition of a task that is not running (waiting, stopped,
            // restoring, not whole yet) is sought to its start when the
            // task runs: nothing of a running task was lost.
            let idle = self
                .assigned
                .keys()
                .any(|(topic, partition)| self.routes.get(topic, *partition).is_none());
            if idle {
                debug!(
                    "an offset out of range on a partition of a task that is not running; it is sought to its start when the task runs"
                );
                return Ok(());
            }
            return self.poison(WorkerError::OffsetOutOfRange);
        }
        Ok(())
    }

    /// The host made a seek the worker asked for ([`Ack::Seeked`]):
    /// records of the partition are accepted again. Until then they are
    /// refused, so a host that forgot a seek fails at once instead of
    /// skipping records.
    pub(super) fn seek_applied(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), WorkerError> {
        let Some((id, i)) = self.routes.get(topic, partition).cloned() else {
            return Ok(());
        };
        if let Some(slot) = self.tasks.get_mut(&*id) {
            let c = &mut slot.channels[i];
            if c.awaiting_seek == Some(offset) {
                c.awaiting_seek = None;
            }
        }
        Ok(())
    }

    /// What the host must do before revoking: commit open work, abort it
    /// when the assignment was lost, or nothing.
    pub fn revoke_plan(&self, lost: bool) -> RevokePlan {
        let failed = matches!(self.state, State::MustAbort(_));
        if failed || (lost && self.dirty) {
            RevokePlan::Abort
        } else if self.dirty {
            RevokePlan::Commit
        } else {
            RevokePlan::Nothing
        }
    }

    /// Settles the open work before a revocation, by
    /// [`revoke_plan`](Self::revoke_plan): when the work is to be
    /// committed, closes the transaction the host commits first (it comes
    /// out in the next [`ready`](Self::ready)), and otherwise aborts it
    /// here. A task that fails while its commit is taken stops
    /// alone and the other tasks roll back; the seeks that put them back at
    /// their committed positions stay queued for the host, like every
    /// other seek, so none of their partitions is left waiting on a seek
    /// that never comes. (A host that streams records into its open
    /// transaction and needs the aborted ones calls `revoke_plan` and
    /// [`abort`](Self::abort) itself.)
    pub fn before_revoke(&mut self, lost: bool, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        match self.revoke_plan(lost) {
            RevokePlan::Nothing => Ok(()),
            RevokePlan::Abort => self.abort(cluster),
            RevokePlan::Commit => match self.flush() {
                Ok(()) => Ok(()),
                Err(_) if self.failing.is_some() => self.abort(cluster),
                Err(e) => Err(e),
            },
        }
    }

    /// The group took these partitions away. The open work must have been
    /// committed or aborted first ([`revoke_plan`](Self::revoke_plan)).
    /// Every task owning one of them is closed; its committed state lives
    /// on in its changelogs.
    pub fn revoke(&mut self, partitions: &[(String, i32)]) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        if self.dirty {
            return Err(WorkerError::OpenTransaction);
        }
        let mut closing = BTreeSet::new();
        self.out.forget(partitions);
        let mut touched = BTreeSet::new();
        for key in partitions {
            self.assigned.remove(key);
            if let Some((id, _)) = self.routes.get(&key.0, key.1) {
                closing.insert(TaskId::clone(id));
            }
            if let Some(id) = self.task_of(&key.0, key.1) {
                self.waiting.remove(&id);
                if self.restores.cancel(&id) {
                    info!(task = %id, "restoring task revoked");
                    self.out.cancel_restore(&id);
                }
                if self.stops.remove(&id) {
                    info!(task = %id, "stopped task revoked");
                }
                self.diversions.remove(&id);
                touched.insert(id);
            }
        }
        for id in closing {
            if let Some(slot) = self.tasks.remove(&id) {
                self.close_local(&id);
                for c in &slot.channels {
                    self.routes.remove(&c.topic, c.partition);
                }
                let left: Vec<String> = slot
                    .channels
                    .iter()
                    .filter(|c| self.assigned.contains_key(&(c.topic.clone(), c.partition)))
                    .map(|c| format!("{}:{}", c.topic, c.partition))
                    .collect();
                info!(task = %id, "task revoked");
                if !left.is_empty() && self.config.assignment == Assignment::Complete {
                    let needed = slot
                        .channels
                        .iter()
                        .map(|c| format!("{}:{}", c.topic, c.partition))
                        .collect();
                    return self.poison(WorkerError::SplitTask {
                        task: id,
                        needed,
                        assigned: left,
                    });
                }
            }
        }
        // What is left of each touched task waits for the task to form
        // again (incremental assignment), or is gone.
        for id in touched {
            if self.tasks.contains_key(&id) {
                continue;
            }
            // Whatever state it left in (restoring, waiting on a lookup,
            // stopped after a failure), its file is let go: another thread
            // of this instance may take the task next, and the store
            // engine refuses a second open of one file in a process.
            self.close_local(&id);
            if self
                .needed(&id)
                .iter()
                .any(|k| self.assigned.contains_key(k))
            {
                self.hold_partial(&id);
            } else {
                self.partial.remove(&id);
            }
        }
        Ok(())
    }
}
