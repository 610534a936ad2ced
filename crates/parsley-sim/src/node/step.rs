//! One step of a running node: a transaction of deliveries and sends,
//! finished by a commit, an abort or a crash.

use super::*;

impl<P: DeliveryProtocol> SimNode<P> {
    /// The first transaction of an incarnation: init's writes and whatever
    /// was released, committed or (with `crash`) aborted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_transaction(
        &mut self,
        node: P,
        deliveries: Vec<Delivery>,
        crash: Option<usize>,
        restored_held: usize,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        self.protocol = Some(node);
        self.stats_seen = NodeStats::default();
        oracle.begin(self.actor);
        if self.fault != Some(HostFault::WithholdPositionAdvance) {
            for (&c, &pos) in &self.positions {
                oracle.position(self.actor, c, pos);
            }
        }
        let positions = self.positions.clone();
        let mut report = self.finish_with(
            deliveries,
            Vec::new(),
            positions,
            crash,
            broker,
            oracle,
            topics,
        )?;
        report.restored_held = restored_held;
        Ok(report)
    }

    /// Runs one transactional step. With `crash = Some(k)` the node crashes
    /// before the commit, and before any stamping call beyond the first `k`
    /// of the step (so `Some(0)` crashes before the step's first send, and a
    /// `k` at or above what the step sends crashes after all its work).
    pub fn step(
        &mut self,
        action: NodeAction,
        crash: Option<usize>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let mut positions = self.positions.clone();
        oracle.begin(self.actor);
        let work = match self.work(action, &mut positions, broker, oracle, topics) {
            Ok(w) => w,
            Err(v) => {
                oracle.rollback(self.actor);
                return Err(v);
            }
        };
        let mut report = self.finish_with(
            work.deliveries,
            work.sends,
            positions,
            crash,
            broker,
            oracle,
            topics,
        )?;
        report.truncated = work.truncated;
        report.adjacent_fetch = work.adjacent_fetch;
        report.adjacent_tagged_fetch = work.adjacent_tagged_fetch;
        if crash.is_none()
            && let Some((c, offset)) = work.fetched
            && let Some(id) = oracle.record_at(c, offset)
            && !oracle.is_delivered(self.actor, id)
        {
            report.held_on_prior_incarnation =
                oracle.waits_only_on_prior_incarnation(self.actor, id);
        }
        Ok(report)
    }

    /// The protocol calls of one step: what it delivered, what it sent (a
    /// tick), what a sweep truncated, and what a fetch fetched.
    pub(super) fn work(
        &mut self,
        action: NodeAction,
        positions: &mut BTreeMap<Channel, i64>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> Result<Work, Violation> {
        let name = &self.spec.name;
        let refused = |e: parsley_protocol::ProtocolError| {
            violation(format!("node {name}: protocol refused: {e}"))
        };
        let Some(protocol) = self.protocol.as_mut() else {
            return Err(violation(format!("node {name}: step while down")));
        };
        let mut work = Work {
            deliveries: Vec::new(),
            sends: Vec::new(),
            truncated: 0,
            fetched: None,
            adjacent_fetch: false,
            adjacent_tagged_fetch: false,
        };
        let deliveries = &mut work.deliveries;
        match action {
            NodeAction::Fetch(c) => {
                let from = positions.get(&c).copied().unwrap_or(0);
                let Some((offset, rec)) = broker.fetch(c, from) else {
                    return Ok(work);
                };
                let tagged = rec.causal.sender.is_some();
                if let Some(&(last, last_tagged)) = self.last_fetched.get(&c)
                    && last + 1 == offset
                {
                    work.adjacent_fetch = true;
                    work.adjacent_tagged_fetch = tagged && last_tagged;
                }
                self.last_fetched.insert(c, (offset, tagged));
                work.fetched = Some((c, offset));
                let record = InboundRecord {
                    channel: c,
                    offset,
                    timestamp: rec.timestamp,
                    key: rec.key.clone(),
                    value: rec.value.clone(),
                    headers: rec.headers.clone(),
                    causal: rec.causal.clone(),
                };
                let id = rec.oracle_id;
                positions.insert(c, offset + 1);
                if self.fault == Some(HostFault::EarlyPositionReport) {
                    // The fault: report the end as the position before the
                    // record is handed over.
                    deliveries.extend(
                        protocol
                            .position_advance(c, broker.end_offset(c))
                            .map_err(refused)?,
                    );
                }
                deliveries.extend(protocol.on_record(record).map_err(refused)?);
                oracle.receive(self.actor, id);
                oracle.position(self.actor, c, offset + 1);
            }
            NodeAction::Advance(c) => {
                let from = positions.get(&c).copied().unwrap_or(0);
                if let Some(target) = broker.skip_target(c, from) {
                    positions.insert(c, target);
                    deliveries.extend(protocol.position_advance(c, target).map_err(refused)?);
                    oracle.position(self.actor, c, target);
                }
            }
            NodeAction::Tick => {
                let Some(tick) = &self.spec.tick else {
                    return Err(violation(format!("node {name}: tick without a tick spec")));
                };
                let channel = Channel::new(topics.id(&tick.topic), tick.partition);
                let payload = Payload {
                    key: u64::from(tick.partition as u32),
                    hops: 0,
                };
                let send =
                    Self::send(protocol, oracle, broker, self.actor, name, channel, payload)?;
                work.sends.push(send);
            }
            NodeAction::Sweep => {
                let report = protocol.truncate_to_log_starts(broker).map_err(refused)?;
                work.truncated = report.entries_removed;
            }
        }
        Ok(work)
    }

    /// Processes deliveries (oracle check, behaviour, stamped sends), then
    /// commits or crashes (see [`step`](Self::step) for `crash`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_with(
        &mut self,
        deliveries: Vec<Delivery>,
        mut sends: Vec<Send>,
        positions: BTreeMap<Channel, i64>,
        crash: Option<usize>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let name = self.spec.name.clone();
        let mut report = StepReport::default();
        let tick_channel = self
            .spec
            .tick
            .as_ref()
            .map(|t| Channel::new(topics.id(&t.topic), t.partition));
        let Some(protocol) = self.protocol.as_mut() else {
            oracle.rollback(self.actor);
            return Err(violation(format!("node {name}: step while down")));
        };
        'deliveries: for d in deliveries {
            let c = d.record.channel;
            let Some(id) = oracle.record_at(c, d.record.offset) else {
                oracle.rollback(self.actor);
                return Err(violation(format!(
                    "node {name}: delivered {c}@{} which is not a committed record",
                    d.record.offset
                )));
            };
            if let Err(v) = oracle.deliver(self.actor, id) {
                oracle.rollback(self.actor);
                return Err(v);
            }
            report.delivered += 1;
            if d.record.causal.clock.sequences().iter().any(|claim| {
                claim.sender == self.sender
                    && self
                        .joined_own_seq
                        .get(&claim.channel)
                        .is_some_and(|&s| claim.seq <= s)
            }) {
                report.own_past_claims_delivered += 1;
            }
            if d.was_held {
                report.released_from_hold += 1;
                let shared = |ch: Channel| broker.tagged_senders(ch) >= 2;
                if shared(c)
                    || d.record
                        .causal
                        .clock
                        .sequences()
                        .iter()
                        .any(|s| shared(s.channel))
                {
                    report.multi_sender_holds += 1;
                }
            }
            let payload = Payload::decode(d.record.key.as_deref(), d.record.value.as_deref());
            let emissions: Vec<(Output, Payload)> = match &self.spec.tick {
                Some(t) if Some(c) == tick_channel => {
                    t.outputs.iter().map(|o| (o.clone(), payload)).collect()
                }
                _ => self
                    .spec
                    .behavior
                    .react(payload)
                    .into_iter()
                    .map(|(o, p)| (o.clone(), p))
                    .collect(),
            };
            for (out, next) in emissions {
                let topic = topics.id(&out.topic);
                let parts = broker.partitions(topic).unwrap_or(1).max(1);
                let partition = match out.route {
                    Route::Partition(p) => p,
                    Route::ByKey => (next.key % parts as u64) as i32,
                    Route::RoundRobin => {
                        self.round_robin += 1;
                        (self.round_robin % parts as u64) as i32
                    }
                };
                let channel = Channel::new(topic, partition);
                if crash.is_some_and(|k| sends.len() >= k) {
                    // The crash lands here, before this stamping call.
                    report.cut_sends = true;
                    break 'deliveries;
                }
                match Self::send(protocol, oracle, broker, self.actor, &name, channel, next) {
                    Ok(s) => sends.push(s),
                    Err(v) => {
                        oracle.rollback(self.actor);
                        return Err(v);
                    }
                }
            }
        }
        self.end_step(report, sends, positions, crash, broker, oracle)
    }

    /// Ends a step: a crash aborts its transaction (its records stay as
    /// aborted records, and the node goes down with nothing of the step
    /// committed); otherwise its state, positions and records commit.
    fn end_step(
        &mut self,
        mut report: StepReport,
        sends: Vec<Send>,
        positions: BTreeMap<Channel, i64>,
        crash: Option<usize>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
    ) -> StepResult {
        let Some(protocol) = self.protocol.as_mut() else {
            oracle.rollback(self.actor);
            let name = &self.spec.name;
            return Err(violation(format!("node {name}: step while down")));
        };
        report.sent = sends.len();
        let now = protocol.stats();
        report.replays_skipped =
            (now.replays_skipped_total - self.stats_seen.replays_skipped_total) as usize;
        report.past_skipped =
            (now.past_skipped_total - self.stats_seen.past_skipped_total) as usize;
        self.stats_seen = now;
        let touched: BTreeSet<Channel> = sends.iter().map(|s| s.channel).collect();
        if crash.is_some() {
            // The transaction aborts: its records take offsets as aborted
            // records, each touched partition gets an abort marker, and the
            // node goes down with nothing of the step committed.
            for s in sends {
                broker.append(s.channel, s.record, false);
            }
            for &c in &touched {
                broker.append_marker(c, false);
            }
            if self.fault == Some(HostFault::StepAtomicity) {
                // The fault: state and positions survive the abort.
                let writes = protocol.take_writes();
                self.store.apply(&writes);
                self.positions = positions;
            }
            oracle.rollback(self.actor);
            self.protocol = None;
            return Ok(report);
        }
        let writes = protocol.take_writes();
        report.held_after = protocol.held_count();
        self.store.apply(&writes);
        self.positions = positions;
        report.adjacent_sends = touched
            .iter()
            .filter(|&&c| sends.iter().filter(|s| s.channel == c).count() >= 2)
            .count();
        for s in sends {
            let offset = broker.end_offset(s.channel);
            let id = oracle.register(s.pending, s.channel, offset);
            let mut record = s.record;
            record.oracle_id = id;
            let at = broker.append(s.channel, record, true);
            assert_eq!(at, offset, "sim: append landed at an unexpected offset");
        }
        for &c in &touched {
            broker.append_marker(c, true);
        }
        oracle.commit(self.actor);
        Ok(report)
    }

    /// H4: stamp for the concrete channel, check every offset claim names a
    /// real offset ([`check_offset_claims`]), and stage exactly that record.
    pub(super) fn send(
        protocol: &mut P,
        oracle: &mut Oracle,
        broker: &SimBroker,
        actor: ActorId,
        name: &str,
        channel: Channel,
        payload: Payload,
    ) -> Result<Send, Violation> {
        let causal: CausalHeaders = protocol
            .prepare_send(channel)
            .map_err(|e| violation(format!("node {name}: stamping refused: {e}")))?;
        check_offset_claims(broker, &causal.clock)
            .map_err(|e| violation(format!("node {name}: {e}")))?;
        let pending: PendingSend = oracle.emit(actor);
        Ok(Send {
            channel,
            pending,
            record: StoredRecord {
                key: Some(payload.key_bytes()),
                value: Some(payload.value_bytes()),
                timestamp: 0,
                headers: Vec::new(),
                causal,
                oracle_id: usize::MAX,
                clock_version: parsley_protocol::clock::ClockVersion::V1,
            },
        })
    }
}
