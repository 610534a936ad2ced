//! Judging a committed transaction: its deliveries and sends replayed
//! through the oracle, in order, before its records are appended.

use super::*;

impl AppWorld {
    /// Judges a committed transaction through the oracle,
    /// then appends it and commits its offsets.
    // Longer than 100 lines on purpose: one pass over the transaction's
    // acts in order, with the oracle's staged actors, the sends pending
    // and the deliveries seen shared by every step of it.
    pub(super) fn judge(&mut self, i: usize, txn: &HostTransaction) -> Result<(), AppFailure> {
        let touched: BTreeSet<(String, i32)> = txn
            .records
            .iter()
            .map(|r| (r.topic.to_string(), r.partition))
            .collect();
        let mut staged: BTreeSet<ActorId> = BTreeSet::new();
        let mut pending: VecDeque<(ActorId, PendingSend, String, i32)> = VecDeque::new();
        let mut delivered: Vec<(String, (String, i32, i64))> = Vec::new();
        let mut result = Ok(());
        self.last_offsets.clear();
        for act in &txn.acts {
            let task = match act {
                TaskAct::Delivered { task, .. } | TaskAct::Sent { task, .. } => task,
                TaskAct::DeadLettered { .. } => continue,
            };
            let Some(&actor) = self.task_actor.get(task) else {
                result = Err(format!("unknown task {task}"));
                break;
            };
            if staged.insert(actor) {
                self.oracle.begin(actor);
            }
            match act {
                TaskAct::Delivered {
                    task,
                    topic,
                    partition,
                    offset,
                } => {
                    let Some(c) = self.channel(topic, *partition) else {
                        result = Err(format!("delivery on unknown topic {topic}"));
                        break;
                    };
                    let Some(id) = self.oracle.record_at(c, *offset) else {
                        result = Err(format!(
                            "task {task} delivered {topic}:{partition}@{offset}, which is not a committed record"
                        ));
                        break;
                    };
                    // Never a half task: the member holds every partition
                    // of the task whose delivery it commits.
                    if let Some(spec) = self.config.tasks.iter().find(|t| t.name == *task)
                        && let Some(p) = spec
                            .inputs
                            .iter()
                            .find(|p| !self.members[i].assignment.contains(p))
                    {
                        result = Err(format!(
                            "task {task} delivered {topic}:{partition}@{offset} on a member that does not hold its partition {}:{}",
                            p.0, p.1
                        ));
                        break;
                    }
                    if let Err(v) = self.oracle.deliver(actor, id) {
                        result = Err(v.message);
                        break;
                    }
                    delivered.push((task.clone(), (topic.clone(), *partition, *offset)));
                }
                TaskAct::Sent {
                    topic, partition, ..
                } => {
                    let p = self.oracle.emit(actor);
                    pending.push_back((actor, p, topic.clone(), *partition));
                }
                TaskAct::DeadLettered { .. } => {}
            }
        }
        if let Err(message) = result {
            for a in staged {
                self.oracle.rollback(a);
            }
            return Err(self.fail(message));
        }
        let changelog = |t: &str| t.ends_with("-changelog");
        // The records streamed before the hand-over are in the log already
        // (pending), under the number their transaction opened with.
        let txn_no = self.open_txn(i);
        self.members[i].open_txn = None;
        let open = std::mem::take(&mut self.members[i].open);
        if !open.is_empty() {
            self.stats.streamed_commits += 1;
        }
        let streamed_on: BTreeSet<Channel> = open.iter().map(|(c, _)| *c).collect();
        // Which partitions' markers land late (chosen before the records
        // go in: their records wait behind the marker).
        let mut late: BTreeSet<(String, i32)> = BTreeSet::new();
        for key in &touched {
            if self.budget.late_markers > 0 && self.rng.random_bool(0.4) {
                self.budget.late_markers -= 1;
                late.insert(key.clone());
            }
        }
        for (k, r) in txn.records.iter().enumerate() {
            let Some(c) = self.channel(&r.topic, r.partition) else {
                return Err(self.fail(format!("produce to unknown topic {}", r.topic)));
            };
            let streamed = open.get(k).copied();
            if let Some((at, offset)) = streamed
                && at != c
            {
                return Err(self.fail(format!(
                    "record {k} of the transaction went to {at}@{offset} when it was streamed, but the transaction says {}:{}",
                    r.topic, r.partition
                )));
            }
            let mut oracle_id = usize::MAX;
            if self.config.dead_letter_topic.as_deref() == Some(&*r.topic) {
                // Unstamped, and no causal send: the oracle never hears of
                // it, and nothing waits for it.
                if r.header_list().iter().any(|h| h.name() == CLOCK_HEADER) {
                    return Err(self.fail(format!(
                        "a dead letter on {}:{} carries a clock",
                        r.topic, r.partition
                    )));
                }
                self.stats.dead_letters += 1;
                if self.stats.dead_letters > self.dead_letters_allowed {
                    return Err(self.fail(format!(
                        "{} dead letters committed, but only {} records were refused with the dead-letter topic as their handler's choice: a record that was not refused (a transient failure?) went there",
                        self.stats.dead_letters, self.dead_letters_allowed
                    )));
                }
            } else if !changelog(&r.topic) {
                let Some((_, p, t, part)) = pending.pop_front() else {
                    return Err(self.fail(format!(
                        "a record to {}:{} with no task send behind it",
                        r.topic, r.partition
                    )));
                };
                if *t != *r.topic || part != r.partition {
                    return Err(self.fail(format!(
                        "send order mismatch: the task sent to {t}:{part}, the transaction holds {}:{}",
                        r.topic, r.partition
                    )));
                }
                let offset = streamed.map_or_else(|| self.broker.end_offset(c), |(_, o)| o);
                oracle_id = self.oracle.register(p, c, offset);
            }
            if let Some((_, offset)) = streamed {
                self.broker.resolve(c, offset, oracle_id);
                self.last_offsets.push(offset);
                continue;
            }
            let record = self.stored(r, oracle_id)?;
            let offset = if late.contains(&(r.topic.to_string(), r.partition)) {
                self.broker.append_open(c, record, txn_no)
            } else {
                // Where records were streamed, behind them: they hold the
                // partition open until the marker.
                self.broker.append(c, record, true)
            };
            self.last_offsets.push(offset);
        }
        if open.len() > txn.records.len() {
            return Err(self.fail(format!(
                "{} records were streamed into the transaction, which has only {}",
                open.len(),
                txn.records.len()
            )));
        }
        if !pending.is_empty() {
            return Err(self.fail("a task send with no record in the transaction"));
        }
        for (t, p) in &touched {
            if let Some(c) = self.channel(t, *p) {
                if late.contains(&(t.clone(), *p)) {
                    self.stats.late_markers += 1;
                    self.late.push((c, txn_no));
                } else if streamed_on.contains(&c) {
                    self.broker.land_marker(c, txn_no);
                } else {
                    self.broker.append_marker(c, true);
                }
            }
        }
        for (t, p, o) in &txn.offsets {
            self.group_offsets.insert((t.clone(), *p), *o);
        }
        let tasks: BTreeSet<&String> = delivered.iter().map(|(t, _)| t).collect();
        if tasks.len() > 1 {
            self.stats.multi_task_commits += 1;
        }
        let reconciling = !self.pending.is_empty();
        let restoring = self.members[i].thread.restoring();
        for (task, d) in delivered {
            if restoring {
                self.stats.deliveries_while_restoring += 1;
            }
            self.committed_deliveries.entry(task).or_default().push(d);
            self.stats.deliveries += 1;
            if reconciling {
                self.stats.deliveries_while_reconciling += 1;
            }
        }
        for a in staged {
            self.oracle.commit(a);
        }
        self.stats.commits += 1;
        Ok(())
    }

    /// The record as the broker stores it, from the headers as the host
    /// writes them: the stamp is read back from its wire form, so a stamp
    /// that does not decode fails the world.
    pub(super) fn stored(
        &self,
        r: &OutgoingRecord,
        oracle_id: usize,
    ) -> Result<StoredRecord, AppFailure> {
        let headers = r.header_list();
        let causal = CausalHeaders::decode(headers.iter().map(|h| (h.name(), h.value.as_deref())))
            .map_err(|e| self.fail(format!("a produced record has corrupt causal headers: {e}")))?;
        let clock_version = headers
            .iter()
            .find(|h| h.name() == CLOCK_HEADER)
            .and_then(|h| ClockVersion::of(h.value.as_deref()?))
            .unwrap_or_default();
        Ok(StoredRecord {
            key: r.key.as_deref().map(<[u8]>::to_vec),
            value: r.value.as_deref().map(<[u8]>::to_vec),
            timestamp: r.timestamp,
            headers: headers
                .into_iter()
                .filter(|h| !parsley_protocol::headers::is_causal_header(&h.name))
                .collect(),
            causal,
            oracle_id,
            clock_version,
        })
    }
}
