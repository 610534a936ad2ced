//! The group's assignment as the consumer sees it: what the worker is told on
//! an assignment and a revocation, and the seeks, pauses and re-assignments it
//! asks for in return.

use super::*;

impl ClientContext for ThreadContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::logs::client_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // An out-of-range fetch also reaches the poll loop, where the
        // worker decides whether it is a loss to fail on; the event itself
        // is not the failure.
        if matches!(
            error,
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AutoOffsetReset)
        ) {
            warn!(%error, reason, "a fetch offset is out of range");
        } else {
            crate::logs::client_error(&error, reason);
        }
    }
}

impl ConsumerContext for ThreadContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka_sys::rd_kafka_resp_err_t,
        tpl: &mut TopicPartitionList,
    ) {
        let mut shared = lock(&self.shared);
        let assigning =
            err == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        if shared.error.is_some() || shared.rejoin.is_some() {
            // The membership is ending: take nothing up.
            let _ = if assigning {
                shared.leave_untaken(consumer, tpl)
            } else {
                shared.give_up(consumer, tpl).map_err(StreamsError::from)
            };
            return;
        }
        if assigning && shared.stop.load(Ordering::SeqCst) {
            // Closing: the partitions wait for this member to leave, and
            // no task starts (or restores) only to be dropped.
            let _ = shared.leave_untaken(consumer, tpl);
            return;
        }
        // Rebalancing until the new assignment's tasks have started (not
        // when the consumer's own close revokes what it held: the thread's
        // state is then its failure's, or the instance's close).
        let ending = shared.ending;
        if !ending {
            shared.assigned = false;
            shared.refresh_ready();
        }
        let r = if assigning {
            info!(partitions = tpl.count(), "assignment taken");
            set_phase(&shared.phase, Doing::StartingTasks);
            let r = shared.on_assign(consumer, tpl);
            shared.assigned = r.is_ok();
            r
        } else {
            set_phase(&shared.phase, Doing::RevokingTasks);
            shared.on_revoke(consumer, tpl)
        };
        if !ending {
            shared.republish();
        }
        set_phase(&shared.phase, Doing::Polling);
        if let Err(e) = r {
            warn!(error = %e, "rebalance failed; the stream thread stops");
            let _ = shared.give_up(consumer, tpl);
            shared.error = Some(e);
        }
    }

    // The default post-rebalance hook would log only.
    fn post_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
}

pub(super) fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e: &TopicPartitionListElem<'_>| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl Shared {
    fn on_assign(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        let began = Instant::now();
        if tpl.count() == 0 {
            // An incremental step that adds nothing: acknowledge it.
            return self.take(consumer, tpl).map_err(StreamsError::from);
        }
        // The group's committed offsets are unstable while a transaction
        // that sent offsets is still open (a frozen or dead member's):
        // the broker answers once it commits or aborts, which the
        // transaction timeout bounds. Keep asking until then.
        let deadline = Instant::now() + self.timeout.saturating_mul(4);
        let committed = loop {
            match consumer.committed_offsets(tpl.clone(), self.timeout) {
                Ok(c) => break c,
                Err(_) if self.stop.load(Ordering::SeqCst) => {
                    return self.leave_untaken(consumer, tpl);
                }
                Err(e) if Instant::now() < deadline => {
                    warn!(error = %e, "committed offsets not available yet; retrying");
                    std::thread::sleep(LOOKUP_RETRY);
                }
                Err(e) => return Err(e.into()),
            }
        };
        // A late joiner starts at the last stable offset, never the high
        // watermark: records of a transaction still open at the join sit
        // between the two, and they (and the claims on them) must be
        // delivered once it commits. The consumer is read_committed, so its
        // "latest" offset lookup answers the last stable offset.
        let mut stable = BTreeMap::new();
        if self.start_policy == StartPolicy::Latest {
            let mut latest = TopicPartitionList::new();
            for (topic, p) in partitions(tpl) {
                latest.add_partition_offset(&topic, p, Offset::End)?;
            }
            for e in consumer.offsets_for_times(latest, self.timeout)?.elements() {
                if let Offset::Offset(o) = e.offset() {
                    stable.insert((e.topic().to_owned(), e.partition()), o);
                }
            }
        }
        // Every partition's log start in one ListOffsets round (one request
        // per leader), not a watermark lookup per partition. A partition
        // may have no leader for a moment (just created, or a leader
        // moving): ask again within the same bound.
        let mut earliest = TopicPartitionList::new();
        for (topic, p) in partitions(tpl) {
            earliest.add_partition_offset(&topic, p, Offset::Beginning)?;
        }
        let starts = loop {
            let answer = consumer.offsets_for_times(earliest.clone(), self.timeout);
            let missing = answer.as_ref().map_or(true, |a| {
                a.elements()
                    .iter()
                    .any(|e| e.error().is_err() || !matches!(e.offset(), Offset::Offset(_)))
            });
            match answer {
                Ok(a) if !missing => break a,
                _ if self.stop.load(Ordering::SeqCst) => return self.leave_untaken(consumer, tpl),
                r if Instant::now() < deadline => {
                    let error = r.map_or_else(
                        |e| e.to_string(),
                        |_| "a partition without an answer".to_owned(),
                    );
                    warn!(%error, "log starts not available yet; retrying");
                    std::thread::sleep(LOOKUP_RETRY);
                }
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    return Err(StreamsError::Metadata(MetadataError::Failed {
                        topic: "(log starts)".to_owned(),
                        message: "a partition's log start had no answer".to_owned(),
                    }));
                }
            }
        };
        let mut parts = Vec::new();
        for (topic, p) in partitions(tpl) {
            let committed = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            let log_start = match starts.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            // The last stable offset, when the policy asks for it (the
            // worker refuses to start a late joiner without it); nothing
            // reads the end under the other policy.
            let end = if self.start_policy == StartPolicy::Latest {
                stable.get(&(topic.clone(), p)).copied()
            } else {
                None
            };
            parts.push(AssignedPartition {
                topic,
                partition: p,
                committed,
                log_start,
                end,
            });
        }
        if self.stop.load(Ordering::SeqCst) {
            // The instance began to close during the lookups: start nothing.
            return self.leave_untaken(consumer, tpl);
        }
        self.worker.assign(parts, &self.cluster, now_ms())?;
        // Assign with the worker's starts instead of seeking afterwards.
        let mut starts = TopicPartitionList::new();
        let mut ready = self.worker.ready(None)?;
        let seeks = std::mem::take(&mut ready.seeks);
        for (topic, p) in partitions(tpl) {
            // A started task's position is its seek; the others start
            // at an absolute offset (Worker::fetch_start says why).
            let offset = Offset::Offset(self.worker.fetch_start(&topic, p));
            starts.add_partition_offset(&topic, p, offset)?;
        }
        self.take(consumer, &starts)?;
        // Pauses of partial tasks and resumes of tasks that formed, on the
        // assignment as it is now, and the rest of what the worker handed
        // over.
        self.act(consumer, ready)?;
        let mut earlier = Vec::new();
        for s in seeks {
            if starts.find_partition(&s.topic, s.partition).is_some() {
                let ack = Ack::Seeked {
                    topic: &s.topic,
                    partition: s.partition,
                    offset: s.offset,
                };
                self.worker.advance(ack, &self.cluster)?;
            } else {
                // A partition assigned before, of a task that formed now.
                earlier.push(s);
            }
        }
        self.seek_to(consumer, earlier)?;
        self.settle(consumer)?;
        info!(partitions = tpl.count(), tasks = self.worker.tasks().count(), elapsed = ?began.elapsed(), "partitions assigned");
        Ok(())
    }

    fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        // The worker settles the open work: a transaction to commit (it
        // comes out in the next ready), or an abort it already made. The
        // seeks an abort asks for are made before the partitions go, the
        // revoked ones' included: harmless, as they are given up next.
        let Shared {
            worker, cluster, ..
        } = &mut *self;
        worker.before_revoke(consumer.assignment_lost(), cluster)?;
        self.settle(consumer)?;
        self.worker.revoke(&partitions(tpl))?;
        self.give_up(consumer, tpl)?;
        self.settle(consumer)?;
        info!(
            partitions = tpl.count(),
            tasks = self.worker.tasks().count(),
            "partitions revoked"
        );
        Ok(())
    }

    /// Takes partitions into the consumer's assignment, at `starts`.
    pub(super) fn take(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        starts: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if self.incremental {
            consumer.incremental_assign(starts)
        } else {
            consumer.assign(starts)
        }
    }

    /// Gives partitions up (under the eager protocol, the whole assignment).
    fn give_up(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if self.incremental {
            consumer.incremental_unassign(tpl)
        } else {
            consumer.unassign()
        }
    }

    /// Leaves an assignment that arrived while the instance closes untaken:
    /// its partitions wait for this member to leave the group. (The
    /// incremental protocol wants every assignment acknowledged, so there
    /// they are taken and paused.)
    fn leave_untaken(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<(), StreamsError> {
        info!("closing: the assignment is left untaken");
        if self.incremental {
            consumer.incremental_assign(tpl)?;
            consumer.pause(tpl)?;
        } else {
            consumer.unassign()?;
        }
        Ok(())
    }

    /// Acts on whatever the worker has for the host now, outside a commit
    /// point (a transaction comes out only if a flush or a revocation
    /// closed one).
    pub(super) fn settle(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        let ready = self.worker.ready(None)?;
        self.act(consumer, ready)
    }

    /// Acts on one [`Ready`], in its order, and on what acting on it
    /// brought (a commit's outcome may ask for seeks): the failures, the
    /// restore jobs and the sample wait for the poll loop; pauses, resumes
    /// and seeks are made now; a transaction is committed now.
    pub(super) fn act(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        ready: Ready,
    ) -> Result<(), StreamsError> {
        let mut ready = ready;
        while !ready.is_empty() {
            let transaction = self.kept.append(ready);
            // This host produces a transaction's records at commit: an
            // aborted open transaction never sent any.
            self.kept.abandoned.clear();
            let flow = std::mem::take(&mut self.kept.flow);
            let seeks = std::mem::take(&mut self.kept.seeks);
            self.apply_flow(consumer, flow);
            if let Err(e) = self.seek_to(consumer, seeks) {
                if transaction.is_some() {
                    // Never begun on the producer: the worker hears it
                    // aborted, so the recovery that follows finds nothing
                    // in flight.
                    let aborted = Ack::Committed(CommitOutcome::Aborted);
                    self.worker.advance(aborted, &self.cluster)?;
                }
                return Err(e);
            }
            if let Some(txn) = transaction {
                // A commit of the poll loop's says so; one made while
                // revoking or closing keeps saying that.
                let phase = *lock(&self.phase);
                let polling = phase == Doing::Polling;
                if polling {
                    set_phase(&self.phase, Doing::Committing);
                }
                let r = self.commit(consumer, txn);
                if polling {
                    set_phase(&self.phase, phase);
                }
                r?;
            }
            ready = self.worker.ready(None)?;
        }
        Ok(())
    }

    /// Makes the fetch pauses and resumes the worker asks for.
    fn apply_flow(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        flow: Vec<parsley::runtime::worker::FlowChange>,
    ) {
        for f in flow {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&f.topic, f.partition);
            // A partition no longer assigned refuses; nothing to do then.
            let r = if f.paused {
                consumer.pause(&tpl)
            } else {
                consumer.resume(&tpl)
            };
            if let Err(e) = r {
                debug!(topic = %f.topic, partition = f.partition, paused = f.paused, error = %e, "fetch pause or resume refused");
            }
        }
    }

    /// Makes `seeks` and confirms each to the worker.
    fn seek_to(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        seeks: Vec<parsley::runtime::worker::Seek>,
    ) -> Result<(), StreamsError> {
        for s in seeks {
            if let Err(e) = consumer.seek(
                &s.topic,
                s.partition,
                Offset::Offset(s.offset),
                self.timeout,
            ) {
                // A partition the consumer stopped (an out-of-range fetch,
                // under auto.offset.reset=error) refuses a seek; assigning
                // it again at the offset restarts its fetch.
                debug!(topic = %s.topic, partition = s.partition, error = %e, "seek refused; assigning the partition again");
                self.restart_fetch(consumer, &s.topic, s.partition, s.offset)?;
            }
            let ack = Ack::Seeked {
                topic: &s.topic,
                partition: s.partition,
                offset: s.offset,
            };
            self.worker.advance(ack, &self.cluster)?;
        }
        Ok(())
    }

    /// Assigns the consumer's whole assignment again: `topic:partition` at
    /// `offset`, every other partition at the next offset the worker
    /// expects (a task still waiting to start: anywhere in range, its
    /// records are dropped until it seeks). Their buffered records are
    /// fetched again, so none is fed twice or skipped.
    fn restart_fetch(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), StreamsError> {
        if self.incremental {
            // Only this partition: the others keep their fetch positions.
            let mut one = TopicPartitionList::new();
            one.add_partition(topic, partition);
            consumer.incremental_unassign(&one)?;
            let mut at = TopicPartitionList::new();
            at.add_partition_offset(topic, partition, Offset::Offset(offset))?;
            consumer.incremental_assign(&at)?;
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in partitions(&consumer.assignment()?) {
            let at = if t == topic && p == partition {
                Offset::Offset(offset)
            } else {
                Offset::Offset(self.worker.fetch_start(&t, p))
            };
            tpl.add_partition_offset(&t, p, at)?;
        }
        consumer.assign(&tpl)?;
        Ok(())
    }
}
