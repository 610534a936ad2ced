//! How the driver runs its worker: the assignment, one step of a task (a
//! record or a position, then a commit), and the worker's act loop.

use super::*;

impl TestDriver {
    /// Hands the worker every partition of every task (one stream thread
    /// owns the whole application), with the group's committed offsets,
    /// then makes the seeks and commits the first transaction.
    pub(super) fn start_worker(&mut self) -> Result<(), DriverError> {
        let mut partitions = Vec::new();
        for slot in &self.slots {
            for (topic, p) in &slot.partitions {
                // A partition that does not exist is the task's to report
                // (with every topic's count), not the driver's.
                let end = self
                    .log
                    .topics
                    .get(topic)
                    .and_then(|t| t.partitions.get(usize::try_from(*p).ok()?))
                    .map_or(0, |e| e.len() as i64);
                partitions.push(AssignedPartition {
                    topic: topic.clone(),
                    partition: *p,
                    committed: self.group_offsets.get(&(topic.clone(), *p)).copied(),
                    log_start: 0,
                    end: Some(end),
                    committed_metadata: None,
                });
            }
        }
        let now = self.wall_clock;
        if let Err(e) = self.worker.assign(partitions, &self.log, now) {
            self.aborts += 1;
            return Err(e.into());
        }
        if let Err(e) = self.seek() {
            return Err(self.abort(e));
        }
        // Records released at init belong to the first transaction.
        self.commit()
    }

    /// Acts on what the worker has for the driver, through the worker's one
    /// act loop ([`act_on`]; [`Driving`] says what the driver does with
    /// each part), and returns the transaction, if one was closed.
    pub(super) fn take_ready(&mut self) -> Result<Option<Transaction>, WorkerError> {
        let ready = self.worker.ready(None)?;
        let mut host = Driving {
            driver: self,
            closed: None,
            refused: None,
        };
        let acted = act_on(&mut host, ready);
        let closed = host.closed;
        match (acted, host.refused) {
            (Err(e), _) | (Ok(()), Some(e)) => {
                if closed.is_some() {
                    // Never committed now: the worker hears it aborted, so
                    // the abort that follows the error finds nothing in
                    // flight.
                    self.worker
                        .advance(Ack::Committed(CommitOutcome::Aborted), &self.log)?;
                }
                Err(e)
            }
            (Ok(()), None) => Ok(closed),
        }
    }

    /// The records of an aborted open transaction, as the broker keeps
    /// them: aborted records and a marker on each partition they reached.
    pub(super) fn log_aborted(&mut self, abandoned: Vec<OutgoingRecord>) {
        let mut touched = BTreeSet::new();
        for r in abandoned {
            let producer = self.producer_of(&r);
            touched.insert((r.topic.clone(), r.partition));
            let (topic, partition) = (r.topic.clone(), r.partition);
            self.log
                .append_aborted(&topic, partition, stored(r, producer));
        }
        for (topic, partition) in touched {
            self.log.append_marker(&topic, partition);
        }
    }

    /// [`take_ready`](Self::take_ready) where no transaction was closed
    /// (only [`commit`](Self::commit) closes one). Should one come out, it
    /// is reported aborted rather than left in flight.
    pub(super) fn seek(&mut self) -> Result<(), WorkerError> {
        if self.take_ready()?.is_some() {
            debug_assert!(false, "only a commit closes a transaction");
            let aborted = Ack::Committed(CommitOutcome::Aborted);
            self.worker.advance(aborted, &self.log)?;
        }
        Ok(())
    }

    /// One step of a task: one record (and the position after it) or one
    /// position advance past markers, then the commit.
    pub(super) fn step(&mut self, i: usize) -> Result<bool, DriverError> {
        let n = self.slots[i].partitions.len();
        if n == 0 || self.worker.task(&self.slots[i].id).is_none() {
            return Ok(false);
        }
        let start = self.slots[i].cursor % n;
        for k in 0..n {
            let (topic, partition) = self.slots[i].partitions[(start + k) % n].clone();
            let Ok(t) = self.topic_log(&topic) else {
                continue;
            };
            let c = Channel::new(t.id, partition);
            let key = (topic.clone(), partition);
            let pos = self.positions.get(&key).copied().unwrap_or(0);
            let r = match self.log.next(c, pos) {
                NextEntry::Nothing => continue,
                NextEntry::Record(offset) => self.feed(&topic, partition, c, offset),
                NextEntry::OnlyMarkers(end) => {
                    self.positions.insert(key, end);
                    self.worker.on_position(&topic, partition, end, None)
                }
            };
            if let Err(e) = r {
                return Err(self.abort(e));
            }
            self.slots[i].cursor = (start + k + 1) % n;
            self.commit()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Polls one record: hands it to the worker, then the consumer's
    /// position after it (past any markers that follow).
    pub(super) fn feed(
        &mut self,
        topic: &str,
        partition: i32,
        c: Channel,
        offset: i64,
    ) -> Result<(), WorkerError> {
        let Some(Entry::Record { record, .. }) = self
            .log
            .partition(c)
            .and_then(|e| e.get(offset as usize))
            .cloned()
        else {
            return Ok(());
        };
        let after = self.log.position_after(c, offset);
        self.positions.insert((topic.to_owned(), partition), after);
        self.worker.on_record(PolledRecord {
            topic: topic.to_owned(),
            partition,
            offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers: record.headers,
        })?;
        self.worker
            .on_position(topic, partition, after, Some(offset))
    }

    /// Commits the open transaction: records, then a commit marker on every
    /// partition written, then the consumed positions.
    pub(super) fn commit(&mut self) -> Result<(), DriverError> {
        let txn = match self.worker.flush().and_then(|()| self.take_ready()) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok(()),
            Err(e) => return Err(self.abort(e)),
        };
        let Transaction {
            records,
            offsets,
            events,
            ..
        } = txn;
        // All or nothing: a record for a partition the log lacks aborts the
        // whole transaction.
        if let Some(r) = records
            .iter()
            .find(|r| self.log.partition_mut(&r.topic, r.partition).is_none())
        {
            let topic = r.topic.clone();
            self.aborts += 1;
            self.worker
                .advance(Ack::Committed(CommitOutcome::Aborted), &self.log)
                .map_err(DriverError::from)?;
            self.seek()?;
            return Err(DriverError::UnknownTopic {
                topic: topic.to_string(),
            });
        }
        let mut touched = BTreeSet::new();
        for r in records {
            let producer = self.producer_of(&r);
            touched.insert((r.topic.clone(), r.partition));
            let (topic, partition) = (r.topic.clone(), r.partition);
            self.log.append(&topic, partition, stored(r, producer));
        }
        for (topic, partition) in touched {
            self.log.append_marker(&topic, partition);
        }
        if let Err(e) = self
            .worker
            .advance(Ack::Committed(CommitOutcome::Committed), &self.log)
        {
            return Err(e.into());
        }
        for o in offsets {
            self.group_offsets.insert((o.topic, o.partition), o.offset);
        }
        for e in events {
            if let TaskEvent::Delivered(d) = e.event {
                self.deliveries.push(StageDelivery {
                    task: e.task,
                    coordinate: d.coordinate,
                    timestamp: d.timestamp,
                    was_held: d.was_held,
                    tick: d.tick,
                });
            }
        }
        Ok(())
    }

    /// Which task produced a record: the driver tags records with their
    /// producing task for tests, by the sender of the stamp the task wrote.
    /// Unstamped records (changelog records, dead letters, which carry an
    /// input's headers as they were) name none.
    pub(super) fn producer_of(&self, r: &OutgoingRecord) -> Option<TaskId> {
        let sender = r.stamp.as_ref()?.sender.sender;
        self.senders.get(&sender).cloned()
    }

    /// Aborts the open transaction: what it had emitted stays in the log as
    /// aborted records, every task goes back to its committed state, and
    /// the consumer seeks back.
    pub(super) fn abort(&mut self, error: WorkerError) -> DriverError {
        tracing::debug!(%error, "step aborted; the tasks return to their committed state");
        self.aborts += 1;
        if let Err(e) = self.worker.abort(&self.log) {
            return e.into();
        }
        // What the transaction had produced is logged aborted, and the
        // failed task restarts from its committed state at once: the next
        // run retries the step that failed.
        if let Err(e) = self.seek() {
            return e.into();
        }
        error.into()
    }
}

/// The driver as the worker's act loop sees it. A failed task restarts
/// from its committed state at once (the next run retries the step that
/// failed); a restore job runs at once; each seek is made at once (the
/// driver's consumer is a map entry: it cannot fail); a closed transaction
/// is kept for [`TestDriver::commit`], which commits it next. Fetch pauses
/// are not needed: the driver fetches one record at a time from its log,
/// never ahead of the task. Nothing waits between polls, so a backoff and
/// a metrics sample (read on demand) are dropped.
struct Driving<'a> {
    driver: &'a mut TestDriver,
    closed: Option<Transaction>,
    /// A restore outcome the worker refused (the driver restores inline,
    /// so none comes out in practice).
    refused: Option<WorkerError>,
}

impl Host for Driving<'_> {
    type Error = WorkerError;

    fn ready(&mut self) -> Result<Ready, WorkerError> {
        self.driver.worker.ready(None)
    }

    fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError> {
        self.driver.worker.advance(ack, &self.driver.log)
    }

    fn abandoned(&mut self, records: Vec<OutgoingRecord>) {
        self.driver.log_aborted(records);
    }

    fn abort_streamed(&mut self) -> Result<(), WorkerError> {
        // The driver's worker does not stream: nothing went out.
        Ok(())
    }

    fn produce(&mut self, _first: usize, records: Vec<OutgoingRecord>) -> Result<(), WorkerError> {
        // Its configuration never streams; should records come out, they
        // are refused loudly rather than lost.
        Err(WorkerError::Client {
            class: "host",
            message: format!(
                "the test driver produces at commit, and was handed {} records to stream",
                records.len()
            ),
        })
    }

    fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), WorkerError> {
        for failure in failures {
            let d = &mut *self.driver;
            d.worker.restart_task(&failure.task, &d.log)?;
        }
        Ok(())
    }

    fn restores(&mut self, jobs: Vec<RestoreJob>) {
        for job in jobs {
            let d = &mut *self.driver;
            let outcome = job.run(&d.log, &d.log);
            if let Err(e) = d.worker.advance(Ack::Restored(outcome), &d.log) {
                self.refused.get_or_insert(e);
            }
        }
    }

    fn published(&mut self, _sample: crate::runtime::metrics::Published) {}

    fn backoff(&mut self, _pause: Duration) {}

    fn flow(&mut self, _change: crate::runtime::host::FlowChange) {}

    fn seek(&mut self, s: &Seek) -> Result<(), WorkerError> {
        self.driver
            .positions
            .insert((s.topic.clone(), s.partition), s.offset);
        Ok(())
    }

    fn transaction(&mut self, txn: Transaction) -> Result<(), WorkerError> {
        debug_assert!(self.closed.is_none(), "one transaction closes at a time");
        self.closed.get_or_insert(txn);
        Ok(())
    }
}
