//! The group's assignment as the consumer sees it: what the worker is told on
//! an assignment and a revocation, and the seeks, pauses and re-assignments it
//! asks for in return.

use super::*;
use parsley::runtime::task::OutgoingRecord;
use parsley::runtime::worker::{FlowChange, Host, RestoreJob, Seek, WorkerError, act_on};

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

/// What librdkafka said in one rebalance callback, kept for the turn that
/// follows the poll it came from.
pub(super) struct GroupChange {
    /// Partitions arrive (else they leave).
    assigning: bool,
    partitions: TopicPartitionList,
}

impl ConsumerContext for ThreadContext {
    /// Only records what librdkafka said: the membership's turn acts on it
    /// once the poll returns ([`Shared::take_group_changes`]). librdkafka
    /// waits for the assignment call, which need not come from inside the
    /// callback, as long as it comes within the session timeout. When the
    /// consumer closes (the membership's drop), no turn follows, so the
    /// callback acts itself.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka_sys::rd_kafka_resp_err_t,
        tpl: &mut TopicPartitionList,
    ) {
        let change = GroupChange {
            assigning: err
                == rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS,
            partitions: tpl.clone(),
        };
        let mut shared = lock(&self.shared);
        if shared.ending {
            shared.on_group_change(consumer, change);
        } else {
            shared.group_changes.push(change);
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
    /// Acts on the group changes the last poll recorded, in order.
    pub(super) fn take_group_changes(&mut self, consumer: &BaseConsumer<ThreadContext>) {
        for change in std::mem::take(&mut self.group_changes) {
            self.on_group_change(consumer, change);
        }
    }

    /// Takes up or gives up the partitions of one group change. A failure
    /// gives the change's partitions up and is kept for the turn to stop
    /// the thread on.
    fn on_group_change(&mut self, consumer: &BaseConsumer<ThreadContext>, change: GroupChange) {
        let GroupChange {
            assigning,
            partitions: tpl,
        } = change;
        if self.error.is_some() || self.rejoin.is_some() {
            // The membership is ending: take nothing up.
            let _ = if assigning {
                self.leave_untaken(consumer, &tpl)
            } else {
                self.give_up(consumer, &tpl).map_err(StreamsError::from)
            };
            return;
        }
        if assigning && self.stop.load(Ordering::SeqCst) {
            // Closing: the partitions wait for this member to leave, and
            // no task starts (or restores) only to be dropped.
            let _ = self.leave_untaken(consumer, &tpl);
            return;
        }
        // Rebalancing until the new assignment's tasks have started (not
        // when the consumer's own close revokes what it held: the thread's
        // state is then its failure's, or the instance's close).
        let ending = self.ending;
        if !ending {
            self.assigned = false;
            self.refresh_ready();
        }
        let r = if assigning {
            info!(partitions = tpl.count(), "assignment taken");
            set_phase(&self.phase, Doing::StartingTasks);
            let r = self.on_assign(consumer, &tpl);
            self.assigned = r.is_ok();
            r
        } else {
            set_phase(&self.phase, Doing::RevokingTasks);
            self.on_revoke(consumer, &tpl)
        };
        if !ending {
            self.republish();
        }
        set_phase(&self.phase, Doing::Polling);
        if let Err(e) = r {
            warn!(error = %e, "rebalance failed; the stream thread stops");
            let _ = self.give_up(consumer, &tpl);
            self.error = Some(e);
        }
    }

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
        let Some(parts) = self.look_up(consumer, tpl)? else {
            // The instance began to close during the lookups: start nothing.
            return self.leave_untaken(consumer, tpl);
        };
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
        self.act_on_ready(consumer, ready)?;
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
        let earlier = Ready {
            seeks: earlier,
            ..Ready::default()
        };
        self.act_on_ready(consumer, earlier)?;
        info!(partitions = tpl.count(), tasks = self.worker.tasks().count(), elapsed = ?began.elapsed(), "partitions assigned");
        Ok(())
    }

    /// What the worker needs of each assigned partition: the group's
    /// committed offset, the log start and, for a late joiner, the last
    /// stable offset. `None` when the instance began to close meanwhile.
    fn look_up(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        tpl: &TopicPartitionList,
    ) -> Result<Option<Vec<AssignedPartition>>, StreamsError> {
        // The group's committed offsets are unstable while a transaction
        // that sent offsets is still open (a frozen or dead member's):
        // the broker answers once it commits or aborts, which the
        // transaction timeout bounds. Keep asking until then.
        let deadline = Instant::now() + self.timeout.saturating_mul(4);
        let committed = loop {
            match consumer.committed_offsets(tpl.clone(), self.timeout) {
                Ok(c) => break c,
                Err(_) if self.stop.load(Ordering::SeqCst) => {
                    return Ok(None);
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
                _ if self.stop.load(Ordering::SeqCst) => return Ok(None),
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
            let entry = committed.find_partition(&topic, p);
            let committed_metadata = entry
                .as_ref()
                .map(|e| e.metadata().to_owned())
                .filter(|m| !m.is_empty());
            let committed = match entry.map(|e| e.offset()) {
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
                committed_metadata,
            });
        }
        if self.stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        Ok(Some(parts))
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
        self.act_on_worker(consumer)?;
        self.worker.revoke(&partitions(tpl))?;
        self.give_up(consumer, tpl)?;
        self.act_on_worker(consumer)?;
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
    pub(super) fn act_on_worker(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        let ready = self.worker.ready(None)?;
        self.act_on_ready(consumer, ready)
    }

    /// Acts on one [`Ready`] and on what acting on it brought, through the
    /// worker's one act loop ([`act_on`]): the failures, the restore jobs
    /// and the sample wait for the poll loop ([`Shared::later`]); pauses,
    /// resumes and seeks are made now; a transaction is committed now.
    pub(super) fn act_on_ready(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        ready: Ready,
    ) -> Result<(), StreamsError> {
        act_on(
            &mut Acting {
                shared: self,
                consumer,
            },
            ready,
        )
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

/// The Kafka host as the worker's act loop sees it: the stream thread's
/// state and its consumer, for the length of one [`Shared::act_on_ready`].
struct Acting<'a> {
    shared: &'a mut Shared,
    consumer: &'a BaseConsumer<ThreadContext>,
}

impl Host for Acting<'_> {
    type Error = StreamsError;

    fn ready(&mut self) -> Result<Ready, WorkerError> {
        self.shared.worker.ready(None)
    }

    fn advance(&mut self, ack: Ack<'_>) -> Result<(), WorkerError> {
        self.shared.worker.advance(ack, &self.shared.cluster)
    }

    fn abandoned(&mut self, _records: Vec<OutgoingRecord>) {
        // The worker streams records to this host while the transaction
        // is open, so it never hands any back from an abort.
    }

    fn abort_streamed(&mut self) -> Result<(), StreamsError> {
        self.shared.abort_streamed()
    }

    fn produce(&mut self, first: usize, records: Vec<OutgoingRecord>) -> Result<(), StreamsError> {
        self.shared.stream(first, &records)
    }

    fn failures(&mut self, failures: Vec<TaskFailure>) -> Result<(), StreamsError> {
        self.shared.later.failures.extend(failures);
        Ok(())
    }

    fn restores(&mut self, jobs: Vec<RestoreJob>) {
        self.shared.later.restores.extend(jobs);
    }

    fn published(&mut self, sample: Published) {
        self.shared.later.published = Some(sample);
    }

    fn backoff(&mut self, pause: Duration) {
        let kept = &mut self.shared.later.backoff;
        *kept = (*kept).max(Some(pause));
    }

    fn flow(&mut self, f: FlowChange) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&f.topic, f.partition);
        let r = if f.paused {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            debug!(topic = %f.topic, partition = f.partition, paused = f.paused, error = %e, "fetch pause or resume refused");
        }
    }

    fn seek(&mut self, s: &Seek) -> Result<(), StreamsError> {
        let at = Offset::Offset(s.offset);
        if let Err(e) = self
            .consumer
            .seek(&s.topic, s.partition, at, self.shared.timeout)
        {
            // A partition the consumer stopped (an out-of-range fetch,
            // under auto.offset.reset=error) refuses a seek; assigning it
            // again at the offset restarts its fetch.
            debug!(topic = %s.topic, partition = s.partition, error = %e, "seek refused; assigning the partition again");
            self.shared
                .restart_fetch(self.consumer, &s.topic, s.partition, s.offset)?;
        }
        Ok(())
    }

    fn transaction(&mut self, txn: Transaction) -> Result<(), StreamsError> {
        // A commit of the poll loop's says so; one made while revoking or
        // closing keeps saying that.
        let phase = *lock(&self.shared.phase);
        let polling = phase == Doing::Polling;
        if polling {
            set_phase(&self.shared.phase, Doing::Committing);
        }
        let r = self.shared.commit(self.consumer, txn);
        if polling {
            set_phase(&self.shared.phase, phase);
        }
        r
    }
}
