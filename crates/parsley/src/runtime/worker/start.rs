//! A task's life: started from its stores (restored from the changelogs, or
//! read from the local store), stopped on a failure, and restarted after its
//! backoff.

use super::*;

impl Worker {
    /// Takes a failed task out of the running set after the abort its
    /// error required: its records are dropped (and fetched again from its
    /// committed position when it restarts) and the failure is queued for
    /// the host.
    pub(super) fn stop_task(&mut self, slot: TaskSlot, failing: Failing) {
        let Failing {
            task: id,
            reason,
            refused,
            transient,
        } = failing;
        // Opened again when it restarts; until then, free for whichever
        // thread of this instance takes the task if its partitions move.
        self.close_local(&id);
        for c in &slot.channels {
            self.routes.remove(&c.topic, c.partition);
            // Nothing reads them until the task restarts.
            self.out.flow(FlowChange {
                topic: c.topic.clone(),
                partition: c.partition,
                paused: true,
            });
        }
        self.stopped_for(id, reason, refused, transient, false);
    }

    /// Counts a stopped task's failure, keeps it stopped until its backoff
    /// restarts it, and queues the failure for the host's error handler.
    fn stopped_for(
        &mut self,
        id: TaskId,
        reason: String,
        refused: Option<RefusedRecord>,
        transient: bool,
        starting: bool,
    ) {
        let earlier = self.stops.stop(&id, self.now, &self.config.task_backoff);
        self.stats.task_failures += 1;
        if starting {
            warn!(task = %id, error = %reason, failures_in_a_row = earlier + 1,
                "task could not start and stopped; the thread's other tasks go on");
        } else {
            warn!(task = %id, error = %reason, failures_in_a_row = earlier + 1,
                "task failed and stopped; nothing past the failing record is committed for it, and the thread's other tasks go on");
        }
        self.out.fail(TaskFailure {
            task: id,
            error: reason,
            earlier_in_a_row: earlier,
            refused,
            transient,
        });
    }

    /// A task that could not start (or start again after a reset) for a
    /// reason of its own: it stops alone, as a task that failed while
    /// running does, and the host's error handler hears of it; the
    /// thread's other tasks go on. Anything else (a misuse of the worker)
    /// fails the worker's open work, as before.
    pub(super) fn fail_start(&mut self, id: TaskId, e: WorkerError) -> Result<(), WorkerError> {
        if !self.config.stop_tasks_that_cannot_start
            || !matches!(
                e,
                WorkerError::Task(_)
                    | WorkerError::Changelog(_)
                    | WorkerError::RetentionLoss { .. }
                    | WorkerError::EndUnknown { .. }
            )
        {
            return self.poison(e);
        }
        self.waiting.remove(&id);
        self.restores.stable(&id);
        self.close_local(&id);
        // Nothing reads them until the task restarts.
        self.pause_held(&id);
        self.stopped_for(id, e.to_string(), None, false, true);
        Ok(())
    }

    /// The tasks stopped after a failure.
    pub fn stopped_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.stops.tasks()
    }

    /// Restarts a stopped task after one step of
    /// [`WorkerConfig::task_backoff`] (for its failures in a row), from its
    /// changelogs and committed positions; at once when the step is zero.
    /// Returns the wait, or `None` when the task is not stopped here (its
    /// partitions were revoked meanwhile).
    pub fn restart_task(
        &mut self,
        id: &TaskId,
        cluster: &dyn Cluster,
    ) -> Result<Option<Duration>, WorkerError> {
        let Some(wait) = self
            .stops
            .restart_after(id, self.now, &self.config.task_backoff)
        else {
            return Ok(None);
        };
        info!(task = %id, ?wait, "the stopped task restarts after its backoff");
        if wait.is_zero() {
            self.restart_due(cluster)?;
        }
        Ok(Some(wait))
    }

    /// How long from `now` until a stopped task is due to restart, or a
    /// task waiting on a failed lookup is due to try its start again, if
    /// one is. A host that waits for records waits no longer than this.
    pub fn restart_due_in(&self, now: i64) -> Option<Duration> {
        self.stops
            .next_restart()
            .into_iter()
            .chain(self.waiting.values().map(|r| r.at))
            .min()
            .map(|at| Duration::from_millis(u64::try_from(at - now.max(self.now)).unwrap_or(0)))
    }

    /// Starts every stopped task whose restart is due.
    pub(super) fn restart_due(&mut self, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        if !matches!(self.state, State::Open) {
            // A transaction in flight, or one to abort: the next
            // punctuation restarts it.
            return Ok(());
        }
        let now = self.now;
        for id in self.stops.due(now) {
            self.stops.begin_restart(&id, now);
            self.stats.task_restarts += 1;
            info!(task = %id, "stopped task restarting");
            // A deferred restore keeps them paused until it is done
            // (`restored` resumes them).
            let resume = self.config.restores == RestoreMode::Inline;
            for (topic, partition) in self.needed(&id).into_iter().filter(|_| resume) {
                self.out.flow(FlowChange {
                    topic,
                    partition,
                    paused: false,
                });
            }
            self.try_start(id.clone(), cluster)?;
            self.stops.restart_started(&id);
        }
        Ok(())
    }

    pub(super) fn start_task(
        &mut self,
        id: &TaskId,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        let Some(names) = self.app.owned_names(&id.stage).cloned() else {
            return Err(WorkerError::UnknownPartition {
                application: self.app.application_id().to_owned(),
                topic: id.stage.clone(),
                partition: id.partition,
            });
        };
        let needed = self.needed(id);
        let tasks = match needed.first() {
            Some((t, _)) => {
                cluster
                    .describe(t)
                    .map_err(|source| TaskError::Metadata {
                        task: id.clone(),
                        cause: source,
                    })?
                    .partitions
            }
            None => 0,
        };
        // The ends a replay must reach are looked up with the job (its
        // bounds), so a start that never replays checks nothing here.
        let changelogs = Changelogs {
            state: &names.state_changelog,
            fold: names.fold_changelog.as_deref(),
            tasks,
            ends: None,
        };
        let (prepared, job) = self.prepare(id, &changelogs, cluster)?;
        match self.config.restores {
            RestoreMode::Inline => {
                let RestoreOutcome {
                    result, unusable, ..
                } = job.run(cluster, cluster);
                self.complete_start(id, prepared, result?, unusable, cluster)
            }
            RestoreMode::Deferred => {
                // Nothing is fetched for the task until it runs.
                for (topic, partition) in self.needed(id) {
                    self.out.flow(FlowChange {
                        topic,
                        partition,
                        paused: true,
                    });
                }
                debug!(task = %id, job = job.id, from_local_store = job.from_local, "task restore queued");
                let restart = self.stops.restart_started(id);
                self.restores.started(
                    id.clone(),
                    restores::Restoring {
                        job: job.id,
                        prepared,
                        restart,
                        cancelled: Arc::clone(&job.cancelled),
                    },
                );
                self.out.restore(job);
                Ok(())
            }
        }
    }

    /// Starts a restored task: its node and fold state from the stores,
    /// its channels, and its start positions (the seeks).
    fn complete_start(
        &mut self,
        id: &TaskId,
        mut prepared: Prepared,
        restored: changelog::Restored,
        unusable: Option<WipeReason>,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        if let Some(reason) = unusable {
            // The job found the store's entries unusable and replayed the
            // whole changelog instead; the rewrite below replaces the file.
            self.stats.local_store_rebuilds += 1;
            warn!(task = %id, %reason, "the local store is wiped and rebuilt from the changelog");
            prepared.from_local = false;
        }
        let (mut stores, local) = self.finish_restore(id, prepared, restored)?;
        if let Some(diversions) = self.diversions.get_mut(id) {
            for d in diversions.values_mut() {
                d.partitions = cluster
                    .describe(&d.topic)
                    .map_err(|cause| TaskError::Metadata {
                        task: id.clone(),
                        cause,
                    })?
                    .partitions;
            }
            stores.diverted = diversions.clone();
        }
        // The start's own release keeps to the cap too.
        stores.release_cap = self.config.release_per_transaction;
        let started = Task::init(
            &self.app,
            &id.stage,
            id.partition,
            stores,
            cluster,
            cluster,
            self.now,
        );
        let mut task = match started {
            Ok(task) => task,
            Err(e) => {
                // It could not read back the held records it left in the
                // file: the next start rebuilds the file instead.
                wipe_unreadable(self.local.as_mut(), id, &e);
                return Err(e.into());
            }
        };
        task.set_record_events(self.config.events);
        task.set_hold_budget(self.config.hold_budget);
        task.set_hold_window(self.config.hold_window);
        if task.node().held_count() > 0 {
            self.stats.restored_with_held += 1;
            if task.stores().held.is_attached() {
                self.stats.restored_with_held_on_disk += 1;
            }
        }
        self.stats.tasks_started += 1;
        let mut channels = Vec::new();
        for input in task.inputs() {
            let key = (input.topic.clone(), input.channel.partition);
            let Some(assigned) = self.assigned.get(&key).cloned() else {
                return Err(WorkerError::NotAssigned {
                    topic: key.0,
                    partition: key.1,
                });
            };
            channels.push(ChannelSlot {
                topic: input.topic.clone(),
                partition: input.channel.partition,
                channel: input.channel,
                position: 0,
                committed: assigned.committed.unwrap_or(-1),
                pending: None,
                awaiting_seek: None,
                assigned,
            });
        }
        let shared = Arc::new(id.clone());
        for (i, c) in channels.iter().enumerate() {
            self.routes.insert(&c.topic, c.partition, &shared, i);
        }
        info!(task = %id, channels = channels.len(), "task started");
        let next_sweep_at = self.now.saturating_add(ms(self.config.truncation_interval));
        let meters = TaskMeters::new(&self.config.thread_id, &task);
        self.tasks.insert(
            id.clone(),
            TaskSlot {
                task: Some(task),
                meters,
                channels,
                next_sweep_at,
                local,
                throttle: Throttle::default(),
            },
        );
        // A new task's init writes (its scope, at least) go into the next
        // transaction.
        self.begin_task(id, true)
    }

    /// The store's identity: the application, the task, and the id of
    /// each of its changelog topics.
    fn store_identity(
        &self,
        id: &TaskId,
        changelogs: &Changelogs<'_>,
        cluster: &dyn Cluster,
    ) -> Result<StoreIdentity, WorkerError> {
        let mut ids = BTreeMap::new();
        for topic in std::iter::once(changelogs.state).chain(changelogs.fold) {
            let d = cluster
                .describe(topic)
                .map_err(|cause| ChangelogError::Unavailable {
                    task: id.clone(),
                    topic: topic.to_owned(),
                    cause,
                })?;
            ids.insert(topic.to_owned(), d.id);
        }
        Ok(StoreIdentity {
            application: self.app.application_id().to_owned(),
            task: id.clone(),
            changelogs: ids,
        })
    }

    /// The local store's snapshot if it can be used: one that fails its
    /// check against the changelogs, or cannot be read, is wiped (and
    /// counted as a rebuild). A disk that refuses to open the store leaves
    /// it alone and runs the task without it. Returns the snapshot and
    /// whether the task runs without a local store.
    fn usable_snapshot(
        &mut self,
        id: &TaskId,
        opened: Option<Result<Option<local::LocalSnapshot>, local::LocalStoreError>>,
        identity: &StoreIdentity,
        bounds: &BTreeMap<String, (i64, i64)>,
    ) -> (Option<local::LocalSnapshot>, bool) {
        let mut local_off = self.local.is_none();
        let start = match (opened, self.local.as_mut()) {
            (Some(Ok(Some(snapshot))), Some(store)) => {
                let usable = local::check(
                    &snapshot,
                    identity,
                    bounds,
                    self.now,
                    ms(self.config.local_store_max_age),
                )
                .map(|()| snapshot);
                match usable {
                    Ok(snapshot) => Some(snapshot),
                    Err(reason) => {
                        self.stats.local_store_rebuilds += 1;
                        wipe(store.as_mut(), id, &reason);
                        None
                    }
                }
            }
            (Some(Err(e @ local::LocalStoreError::Io { .. })), _) => {
                // The disk refused (not a damaged store): leave the store
                // as it is, at its older checkpoint, and run this task
                // without it.
                warn!(task = %id, error = %e, "the local store cannot be opened; the task restores from its changelogs and runs without it");
                local_off = true;
                None
            }
            (Some(Err(e)), Some(store)) => {
                self.stats.local_store_rebuilds += 1;
                wipe(store.as_mut(), id, &WipeReason::Unreadable(e.to_string()));
                None
            }
            _ => None,
        };
        (start, local_off)
    }

    /// Prepares a task's restore: reads its local store and checks it
    /// against the changelogs (wiping it, with a WARN that says why, when
    /// it cannot be used), and makes the replay job: from the store's
    /// checkpoint, or from the beginning.
    fn prepare(
        &mut self,
        id: &TaskId,
        changelogs: &Changelogs<'_>,
        cluster: &dyn Cluster,
    ) -> Result<(Prepared, RestoreJob), WorkerError> {
        let identity = self.store_identity(id, changelogs, cluster)?;
        // A stateful task whose fold state can read through its local
        // store starts without loading the store's fold entries.
        // Every task whose store can be read while it runs leaves its held
        // records there: they are read back as the gate reaches them.
        let held_on_disk = self.local.as_ref().is_some_and(|s| s.reads_while_running());
        let bounded = self.config.fold_cache.is_some() && changelogs.fold.is_some() && held_on_disk;
        let leave = local::LeaveOnDisk {
            fold: bounded,
            held: held_on_disk,
        };
        let opened = self
            .local
            .as_mut()
            .map(|store| store.open_leaving(id, leave));
        // Log starts only to check a store; ends for progress, always.
        let with_starts = matches!(opened, Some(Ok(Some(_))));
        let bounds = changelog_bounds(&identity, id.partition, cluster, with_starts).map_err(
            |(topic, message)| ChangelogError::Unavailable {
                task: id.clone(),
                topic: topic.clone(),
                cause: crate::runtime::task::MetadataError::Failed { topic, message },
            },
        )?;
        let (start, local_off) = self.usable_snapshot(id, opened, &identity, &bounds);
        // A bounded task's replay writes its fold state out in parts as it
        // goes, holding no more than the cache in memory.
        if let Some(total) = self.config.fold_cache {
            // This task's replay takes its share at once.
            let n = self.tasks.len() + self.restores.len() + 1;
            self.restores
                .fold_share()
                .store(total / n, Ordering::Relaxed);
        }
        // A tail's parts leave the store's age as it was: they do not move
        // its checkpoint, so they must not make it look fresher either.
        let written_at = start
            .as_ref()
            .and_then(|s| s.written_at)
            .unwrap_or(self.now);
        let cancelled: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let spill = match ((bounded || held_on_disk) && !local_off, self.local.as_mut()) {
            (true, Some(store)) => store.writer().map(|w| {
                changelog::FoldSpill::new(w, self.restores.fold_share().clone(), written_at)
                    .with_parts(bounded, held_on_disk)
                    .stopping_when(cancelled.clone())
            }),
            _ => None,
        };
        let job = RestoreJob {
            spill,
            id: self.restores.next_job(),
            task: id.clone(),
            state: changelogs.state.to_owned(),
            fold: changelogs.fold.map(str::to_owned),
            tasks: changelogs.tasks,
            from_local: start.is_some(),
            start,
            bounds,
            listener: self.restore_listener.clone(),
            thread_id: self.config.thread_id.clone(),
            cancelled,
        };
        let prepared = Prepared {
            identity,
            from_local: job.from_local,
            bounded: bounded && !local_off,
            held_on_disk: held_on_disk && !local_off,
            local_off,
        };
        Ok((prepared, job))
    }

    /// What a finished replay leaves: the stores, and the local store
    /// brought up to the changelog's end (rewritten whole after a rebuild).
    fn finish_restore(
        &mut self,
        id: &TaskId,
        prepared: Prepared,
        restored: changelog::Restored,
    ) -> Result<(crate::runtime::task::TaskStores, Local), TaskError> {
        let Prepared {
            identity,
            from_local,
            local_off,
            bounded,
            held_on_disk,
        } = prepared;
        self.stats.changelog_records_replayed += restored.replayed;
        if from_local {
            self.stats.local_store_starts += 1;
        }
        let Some(store) = self.local.as_mut().filter(|_| !local_off) else {
            info!(task = %id, replayed = restored.replayed, "task restored");
            return Ok((restored.stores, Local::Off));
        };
        let spilled = restored.spilled;
        if let Some(cause) = restored.spill_failed {
            // Part of the fold state went to a store that then failed:
            // neither holds it whole. Start again from the changelog.
            self.stats.local_store_write_failures += 1;
            let _ = store.wipe(id);
            return Err(TaskError::LocalStore {
                task: id.clone(),
                cause,
            });
        }
        let write = LocalWrite {
            identity: Some(identity.clone()),
            checkpoint: restored.next.clone(),
            replace: !from_local && !spilled,
            written_at: self.now,
            seq: 0,
            entries: if from_local {
                changelog::tail_entries(restored.tail)
            } else {
                let mut entries = all_entries(&restored.stores);
                entries.extend(restored.pending);
                entries
            },
        };
        info!(
            task = %id,
            replayed = restored.replayed,
            from_local_store = from_local,
            fold_keys_in_memory = restored.stores.fold.len(),
            "task restored"
        );
        let mut stores = restored.stores;
        let written = store.write(id, write);
        // Once the write is in the store, the fold state can read through
        // it (the reader waits for the write).
        let reader = match &written {
            Ok(()) if bounded || held_on_disk => store.reader(id),
            _ => Ok(None),
        };
        // What the start left in the store is only there now.
        let needs_reader = (bounded || held_on_disk) && (from_local || spilled);
        match (written, reader) {
            (Ok(()), Ok(Some(reader))) => {
                if bounded {
                    stores.fold.attach(
                        reader.clone(),
                        self.restores.fold_share().load(Ordering::Relaxed),
                    );
                }
                if held_on_disk {
                    let crate::runtime::task::TaskStores { held, protocol, .. } = &mut stores;
                    held.attach(reader, self.config.hold_window, protocol);
                }
                Ok((
                    stores,
                    Local::Writing {
                        identity,
                        checkpoint: restored.next,
                    },
                ))
            }
            (Ok(()), Ok(None)) if !needs_reader => Ok((
                stores,
                Local::Writing {
                    identity,
                    checkpoint: restored.next,
                },
            )),
            (Err(e), _) if !needs_reader => {
                self.stats.local_store_write_failures += 1;
                warn!(task = %id, error = %e, "the local store could not be written; the task runs without it, its whole fold state in memory, until it starts again");
                let _ = store.wipe(id);
                Ok((stores, Local::Stale))
            }
            (written, reader) => {
                // The store's fold entries were not loaded and cannot be
                // read: start again from the whole changelog.
                self.stats.local_store_write_failures += 1;
                let cause = match (written, reader) {
                    (Err(e), _) | (_, Err(e)) => e,
                    _ => local::LocalStoreError::Io {
                        task: id.clone(),
                        message: "the store gives no reader".to_owned(),
                    },
                };
                let _ = store.wipe(id);
                Err(TaskError::LocalStore {
                    task: id.clone(),
                    cause,
                })
            }
        }
    }

    /// Tasks whose restore job has not come back yet.
    pub fn restoring_tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.restores.tasks()
    }

    /// Tasks of the assignment still restoring (not counting failed tasks
    /// restarting in place): while there are any, the thread is not ready.
    pub fn assignment_restoring(&self) -> impl Iterator<Item = &TaskId> {
        self.restores.of_assignment()
    }

    /// A restore job's outcome: its task starts (its partitions resume and
    /// its seeks are queued). An outcome for a task that is no longer
    /// restoring here (revoked, fenced, restarted since) is ignored. A
    /// failed replay leaves the task waiting when it was a lookup (retried
    /// at the next punctuation), and fails the worker's open work
    /// otherwise, as a failed start does.
    pub(super) fn restored(
        &mut self,
        outcome: RestoreOutcome,
        cluster: &dyn Cluster,
    ) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        let RestoreOutcome {
            job,
            task,
            result,
            unusable,
        } = outcome;
        let Some(pending) = self.restores.finish(&task, job) else {
            debug!(task = %task, job, "a restore outcome for a task that is not restoring here; ignored");
            return Ok(());
        };
        for (topic, partition) in self.needed(&task) {
            if self.assigned.contains_key(&(topic.clone(), partition)) {
                self.out.flow(FlowChange {
                    topic,
                    partition,
                    paused: false,
                });
            }
        }
        let r = result.map_err(WorkerError::from).and_then(|restored| {
            self.complete_start(&task, pending.prepared, restored, unusable, cluster)
        });
        match r {
            Ok(()) => {
                self.restores.stable(&task);
                Ok(())
            }
            Err(e) if self.waits_on(&task, &e) => {
                self.lookup_failed(task, &e, "task restore");
                Ok(())
            }
            Err(e) => self.fail_start(task, e),
        }
    }

    /// The task left this worker: its local store is made durable and
    /// released (it stays on disk for the task's return).
    pub(super) fn close_local(&mut self, id: &TaskId) {
        if let Some(store) = self.local.as_mut()
            && let Err(e) = store.close(id)
        {
            warn!(task = %id, error = %e, "the local store could not be closed");
        }
    }

    /// Chooses each channel's start, queues the seeks, and reports the
    /// starting positions to the task (the node does not persist what it
    /// was told about positions). Records are refused on each channel until
    /// the host confirms its seek.
    pub(super) fn begin_task(&mut self, id: &TaskId, new_work: bool) -> Result<(), WorkerError> {
        let policy = self.config.start_policy;
        let on_loss = self.config.on_retention_loss;
        let Some(slot) = self.tasks.get_mut(id) else {
            return Ok(());
        };
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        let resume = task.resume_positions().clone();
        for c in &mut slot.channels {
            let a = &c.assigned;
            // Where the stage's own history says to go on, if it has one.
            let consumed = match (resume.get(&c.channel), c.committed) {
                (Some(&r), _) => Some(r),
                (None, committed) if committed >= 0 => Some(committed),
                _ => None,
            };
            let start = match consumed {
                Some(at) if at < a.log_start => {
                    retention_loss(on_loss, &mut self.stats, id, c, at, a.log_start)?
                }
                Some(at) => at,
                None => match (policy, a.end) {
                    (StartPolicy::Earliest, _) => a.log_start,
                    (StartPolicy::Latest, Some(end)) => end,
                    (StartPolicy::Latest, None) => {
                        return Err(WorkerError::EndUnknown {
                            task: id.clone(),
                            topic: c.topic.clone(),
                            partition: c.partition,
                        });
                    }
                },
            };
            // H6: never below the log start.
            let start = start.max(a.log_start);
            c.restart_at(start, &mut self.out);
            debug!(task = %id, topic = %c.topic, partition = c.partition, start, "channel starts");
        }
        for c in &slot.channels {
            task.position_advance(c.channel, c.position)?;
        }
        if new_work || task.has_work() {
            self.dirty = true;
        }
        Ok(())
    }
}

/// Each changelog's (log start, end) for the task's partition: one lookup
/// of each kind for all of the task's changelogs (the log starts only when
/// `with_starts`; else they read as 0). The error names the topic
/// and what the lookup said.
fn changelog_bounds(
    identity: &StoreIdentity,
    partition: i32,
    cluster: &dyn Cluster,
    with_starts: bool,
) -> Result<BTreeMap<String, (i64, i64)>, (String, String)> {
    let ids: BTreeSet<parsley_protocol::TopicId> = identity.changelogs.values().copied().collect();
    let first = identity
        .changelogs
        .keys()
        .next()
        .cloned()
        .unwrap_or_default();
    let starts = if with_starts {
        cluster
            .log_starts(&ids)
            .map_err(|e| (first.clone(), e.to_string()))?
    } else {
        // Not looked up: every partition's start reads as 0.
        ids.iter()
            .map(|&id| {
                (
                    id,
                    parsley_protocol::TopicOffsets::Present(
                        (0..=partition).map(|p| (p, 0)).collect(),
                    ),
                )
            })
            .collect()
    };
    let ends = cluster
        .end_offsets(&ids)
        .map_err(|e| (first.clone(), e.to_string()))?;
    let mut out = BTreeMap::new();
    for (topic, tid) in &identity.changelogs {
        let at = |answers: &BTreeMap<parsley_protocol::TopicId, parsley_protocol::TopicOffsets>| {
            match answers.get(tid) {
                Some(parsley_protocol::TopicOffsets::Present(by_partition)) => {
                    by_partition.get(&partition).copied()
                }
                _ => None,
            }
        };
        match (at(&starts), at(&ends)) {
            (Some(start), Some(end)) => {
                out.insert(topic.clone(), (start, end));
            }
            _ => {
                return Err((
                    topic.clone(),
                    format!("no offsets for partition {partition}"),
                ));
            }
        }
    }
    Ok(out)
}

/// Every entry of both stores, as puts (a rebuild's write).
fn all_entries(
    stores: &crate::runtime::task::TaskStores,
) -> Vec<crate::runtime::local::LocalEntry> {
    let mut out = Vec::with_capacity(stores.protocol.len() + stores.fold.len());
    for (key, value) in stores.protocol.iter() {
        out.push((
            StoreKind::Protocol,
            key.into_bytes().into(),
            Some(value.into()),
        ));
    }
    for (key, value) in stores.fold.iter() {
        out.push((StoreKind::Fold, key.into(), Some(value.into())));
    }
    out
}
