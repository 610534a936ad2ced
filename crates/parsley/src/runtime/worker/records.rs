//! What a poll returned: records and positions handed to their tasks, the
//! wall clock, and the fetch pauses that bound what a task holds.

use super::*;

impl Worker {
    /// The task and channel of a partition; `None` for a partition assigned
    /// here whose task is waiting to start.
    fn route(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<(Arc<TaskId>, usize)>, WorkerError> {
        if let Some(r) = self.routes.get(topic, partition) {
            return Ok(Some(r.clone()));
        }
        if self.assigned.contains_key(&(topic.to_owned(), partition)) {
            return Ok(None);
        }
        Err(WorkerError::NotAssigned {
            topic: topic.to_owned(),
            partition,
        })
    }

    /// One record a poll returned, handed to its task now.
    pub fn on_record(&mut self, record: impl RecordView) -> Result<(), WorkerError> {
        let (topic, partition, offset) = (record.topic(), record.partition(), record.offset());
        self.ready_for_work()?;
        self.drained = false;
        self.in_flight.handed_in_one();
        let Some((id, i)) = self.route(topic, partition)? else {
            self.stats.dropped_while_waiting += 1;
            return Ok(());
        };
        let Some(slot) = self.tasks.get_mut(&*id) else {
            return Err(WorkerError::NotAssigned {
                topic: topic.to_owned(),
                partition,
            });
        };
        let c = &mut slot.channels[i];
        if let Some(e) = c.unsought() {
            return self.poison(e);
        }
        if offset < c.position {
            let e = WorkerError::OutOfOrder {
                topic: topic.to_owned(),
                partition,
                offset,
                expected: c.position,
            };
            return self.poison(e);
        }
        let channel = c.channel;
        c.position = offset + 1;
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        task.observe_time(self.now);
        let r = task.on_record(channel, &record);
        if let Err(e) = r {
            return self.fail_task(TaskId::clone(&id), e);
        }
        self.stats.add(slot.meters.count(task));
        self.dirty = true;
        let regulate = slot.throttle.engaged(task, self.config.hold_budget);
        // A position captured earlier may be covered now.
        let c = &mut slot.channels[i];
        if let Some((position, last)) = c.pending
            && last <= offset
        {
            c.pending = None;
            return self.apply_position(&id, i, position);
        }
        if regulate {
            self.regulate(&id);
        }
        Ok(())
    }

    /// The consumer's position on a partition after a poll. A host that
    /// polls records ahead of handing them over passes the highest offset
    /// its polls returned there (`last_returned`), and the position waits
    /// until every record up to it has been handed over; a host that hands
    /// each polled record over before it reports positions (the Kafka
    /// runtime does) passes `None`, since the worker already knows what it
    /// was handed. A position behind what was handed over is refused.
    pub fn on_position(
        &mut self,
        topic: &str,
        partition: i32,
        position: i64,
        last_returned: Option<i64>,
    ) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        let Some((id, i)) = self.route(topic, partition)? else {
            return Ok(());
        };
        let Some(slot) = self.tasks.get_mut(&*id) else {
            return Ok(());
        };
        let c = &mut slot.channels[i];
        if let Some(e) = c.unsought() {
            return self.poison(e);
        }
        if position < c.position {
            let e = WorkerError::PositionBehind {
                topic: topic.to_owned(),
                partition,
                position,
                consumed: c.position,
            };
            return self.poison(e);
        }
        if let Some(last) = last_returned
            && last >= c.position
        {
            // Records up to `last` were polled but not handed over yet: the
            // position would jump the frontier past them.
            c.pending = Some((position, last));
            self.stats.positions_deferred += 1;
            return Ok(());
        }
        self.apply_position(&id, i, position)
    }

    fn apply_position(&mut self, id: &TaskId, i: usize, position: i64) -> Result<(), WorkerError> {
        let Some(slot) = self.tasks.get_mut(id) else {
            return Ok(());
        };
        let c = &mut slot.channels[i];
        let advanced = position > c.position;
        c.position = c.position.max(position);
        let channel = c.channel;
        let Some(task) = slot.task.as_mut() else {
            return Ok(());
        };
        task.observe_time(self.now);
        let r = task.position_advance(channel, position);
        self.stats.add(slot.meters.count(task));
        if let Err(e) = r {
            return self.fail_task(id.clone(), e);
        }
        if advanced || task.has_work() {
            self.dirty = true;
        }
        if slot.throttle.engaged(task, self.config.hold_budget) {
            self.regulate(id);
        }
        Ok(())
    }

    /// Backpressure for one running task: pauses or resumes fetching on
    /// its partitions by what it holds against the budget (see the [module
    /// documentation](self)).
    pub(super) fn regulate(&mut self, id: &TaskId) {
        let Some(budget) = self.config.hold_budget else {
            return;
        };
        let Some(slot) = self.tasks.get_mut(id) else {
            return;
        };
        let Some(task) = slot.task.as_mut() else {
            return;
        };
        if !slot.throttle.engaged(task, Some(budget)) {
            return;
        }
        let held = task.node().held_bytes();
        let throttle = &mut slot.throttle;
        let arrivals = task.take_arrival_claims();
        let node = task.node();
        let same_heads = node.head_offsets().eq(throttle.heads.iter().copied());
        let relieved = held <= budget / 2;
        let over = held > budget;
        if same_heads && arrivals.is_empty() && !relieved && over == throttle.over {
            // Nothing to change: the same heads are held (their claims can
            // only have been met since), no arriving record claimed a
            // paused partition, and the holds are on the same side of the
            // budget.
            return;
        }
        throttle.over = over;
        throttle.heads.clear();
        throttle.heads.extend(node.head_offsets());
        let heads: BTreeMap<Channel, i64> = throttle.heads.iter().copied().collect();
        for c in arrivals {
            if let Some(&head) = heads.get(&c) {
                throttle.exempt.insert(c, head);
            }
        }
        // An exemption lasts while the head it was made under is held.
        throttle.exempt.retain(|c, head| heads.get(c) == Some(head));
        let holding: BTreeSet<Channel> = heads.keys().copied().collect();
        let mut claimed = node.claimed_by_heads();
        claimed.extend(throttle.exempt.keys().copied());
        let mut resumed = Vec::new();
        for &i in &throttle.paused {
            let c = slot.channels[i].channel;
            let why = if !holding.contains(&c) {
                &mut self.stats.hold_resumes_drained
            } else if claimed.contains(&c) {
                &mut self.stats.hold_resumes_claimed
            } else if relieved {
                &mut self.stats.hold_resumes_relieved
            } else {
                continue;
            };
            *why += 1;
            resumed.push(i);
        }
        for i in resumed {
            throttle.paused.remove(&i);
            let c = &slot.channels[i];
            debug!(task = %id, topic = %c.topic, partition = c.partition, held, budget, "fetching resumed");
            self.out.flow(FlowChange {
                topic: c.topic.clone(),
                partition: c.partition,
                paused: false,
            });
        }
        let mut paused = 0;
        for (i, c) in slot.channels.iter().enumerate() {
            if !over || !holding.contains(&c.channel) {
                continue;
            }
            if claimed.contains(&c.channel) {
                if !throttle.paused.contains(&i) {
                    self.stats.hold_pauses_withheld += 1;
                }
                continue;
            }
            if throttle.paused.insert(i) {
                paused += 1;
                debug!(task = %id, topic = %c.topic, partition = c.partition, held, budget, "holds passed the budget; fetching paused");
                self.out.flow(FlowChange {
                    topic: c.topic.clone(),
                    partition: c.partition,
                    paused: true,
                });
            }
        }
        if paused > 0 {
            self.stats.hold_pauses += paused as u64;
            slot.meters.paused(paused);
        }
        task.watch(throttle.paused.iter().map(|&i| slot.channels[i].channel));
    }

    /// The wall clock: ticks and hold warnings in every task, and the
    /// truncation sweep of every task whose interval has passed.
    pub fn punctuate(&mut self, now: i64, cluster: &dyn Cluster) -> Result<(), WorkerError> {
        self.ready_for_work()?;
        self.now = self.now.max(now);
        let now = self.now;
        let due: Vec<TaskId> = self
            .waiting
            .iter()
            .filter(|(_, r)| r.at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            // Paused while it waited; a start made here (not a deferred
            // restore, which resumes them once done) fetches them again.
            if self.config.restores == RestoreMode::Inline {
                for (topic, partition) in self.needed(&id) {
                    if self.assigned.contains_key(&(topic.clone(), partition)) {
                        self.out.flow(FlowChange {
                            topic,
                            partition,
                            paused: false,
                        });
                    }
                }
            }
            self.try_start(id, cluster)?;
        }
        self.restart_due(cluster)?;
        self.resume_releases()?;
        self.answer_waiting_queries();
        let interval = ms(self.config.truncation_interval);
        let mut failed = None;
        for (id, slot) in &mut self.tasks {
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let r = task.punctuate(now);
            // What a lagging file took in since the last commit (held
            // records, fold entries over the cache) leaves memory now, not
            // at the next commit: an idle task lets go too.
            task.evict_local();
            self.stats.add(slot.meters.count(task));
            if let Err(e) = r {
                failed = Some((id.clone(), e));
                break;
            }
            if task.has_work() {
                self.dirty = true;
            }
            if now >= slot.next_sweep_at {
                slot.next_sweep_at = now.saturating_add(interval);
                match task.sweep(cluster) {
                    Ok(report) => {
                        self.stats.sweeps += 1;
                        self.stats.truncated_entries += report.entries_removed as u64;
                        if report.entries_removed > 0 {
                            self.dirty = true;
                        }
                    }
                    Err(e) => {
                        self.stats.truncation_sweeps_skipped += 1;
                        slot.meters.sweep_skipped();
                        warn!(task = %id, error = %e, "truncation sweep skipped; it runs again next interval");
                    }
                }
            }
        }
        if let Some((id, e)) = failed {
            return self.fail_task(id, e);
        }
        if now >= self.next_sample_at {
            self.next_sample_at = now.saturating_add(ms(SAMPLE_INTERVAL));
            self.sample();
        }
        Ok(())
    }
}
