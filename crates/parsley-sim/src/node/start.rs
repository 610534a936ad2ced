//! A node's start: its crash points, the resets applied while it was
//! down, and the protocol's recovery from its store.

use super::*;

impl<P: DeliveryProtocol> SimNode<P> {
    /// Starts (first join or restart) from committed state through the full
    /// init path; processes whatever init releases as the first step.
    pub fn start(
        &mut self,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        self.start_crashing(None, broker, oracle, topics)
    }

    /// [`start`](Self::start), crashing at the given point when `crash` is
    /// set, after at most the given number of stamped sends (see
    /// [`step`](Self::step)). The node ends up down, with nothing of the
    /// start committed.
    pub fn start_crashing(
        &mut self,
        crash: Option<(StartCrash, usize)>,
        broker: &mut SimBroker,
        oracle: &mut Oracle,
        topics: &dyn Topics,
    ) -> StepResult {
        let first_start = !self.joined;
        if self.joined {
            self.restarts += 1;
        }
        self.joined = true;
        let (resets, reset_skip_marks) = self.apply_reset(broker, oracle)?;
        let old_inputs = self.inputs.clone();
        let old_sinks = self.sinks.clone();
        let old_behavior = self.spec.behavior.clone();
        let (init, refused_shrink) =
            self.init_scoped(&old_inputs, &old_sinks, old_behavior, broker, topics)?;
        let mut left_inputs = 0;
        for c in old_inputs.difference(&self.inputs) {
            oracle.stop_consuming(self.actor, *c);
            self.positions.remove(c);
            left_inputs += 1;
        }
        let resume = init.node.resume_positions();
        // The oracle's claim envelope takes in the sink end offsets this
        // start's own outputs (and former sinks' folding) claim.
        for &topic in self.sinks.union(&old_sinks) {
            for p in 0..broker.partitions(topic).unwrap_or(0) {
                let c = Channel::new(topic, p);
                oracle.own_output(self.actor, c, broker.end_offset(c));
            }
        }
        let (joined_inputs, seeded_inputs) =
            self.position_inputs(first_start, &old_inputs, &resume, broker, oracle)?;
        // What this start did, on the report of whichever transaction ends it.
        let counted = |mut report: StepReport| {
            report.joined_inputs = joined_inputs;
            report.resets = resets;
            report.reset_skip_marks = reset_skip_marks;
            report.seeded_inputs = seeded_inputs;
            report.left_inputs = left_inputs;
            report.refused_shrinks = refused_shrink;
            report
        };
        let restored_held = init.report.restored_held;
        let mut node = init.node;
        let mut deliveries = init.deliveries;
        if let Some((point, cut)) = crash
            && point != StartCrash::AfterStartPositions
        {
            if point == StartCrash::AfterInit {
                deliveries.clear();
            }
            let report = self.start_transaction(
                node,
                deliveries,
                Some(cut),
                restored_held,
                broker,
                oracle,
                topics,
            )?;
            return Ok(counted(report));
        }
        // H2 at start: the consumer's starting position is a position like
        // any other (a real consumer reports it at its first poll). Every
        // record below it went through `on_record` in an earlier
        // incarnation. Without this, a trailing marker skipped before a
        // crash could never be covered again.
        for (&c, &pos) in &self.positions {
            if self.fault == Some(HostFault::WithholdPositionAdvance) {
                break;
            }
            match node.position_advance(c, pos) {
                Ok(d) => deliveries.extend(d),
                Err(e) => {
                    return Err(violation(format!(
                        "node {}: protocol refused the starting position: {e}",
                        self.spec.name
                    )));
                }
            }
        }
        let cut = crash.map(|(_, cut)| cut);
        let report =
            self.start_transaction(node, deliveries, cut, restored_held, broker, oracle, topics)?;
        Ok(counted(report))
    }

    /// Initialises the protocol from the node's store, with the next
    /// pending scope change once its restart has come. The protocol
    /// refuses to drop an input that still holds records: the node then
    /// starts with its old scope, and the change waits for the next
    /// restart, as an operator redeploys again later. Returns the
    /// initialised protocol and whether a change was refused (0 or 1).
    fn init_scoped(
        &mut self,
        old_inputs: &BTreeSet<Channel>,
        old_sinks: &BTreeSet<TopicId>,
        old_behavior: Behavior,
        broker: &SimBroker,
        topics: &dyn Topics,
    ) -> Result<(parsley_protocol::Initialized<P>, usize), Violation> {
        // The next pending scope change, once its restart has come.
        let pending = self
            .spec
            .rescopes
            .get(self.rescopes_applied)
            .filter(|r| r.at_restart <= self.restarts)
            .cloned();
        if let Some(r) = &pending {
            self.inputs = r
                .inputs
                .iter()
                .map(|(t, p)| Channel::new(topics.id(t), *p))
                .collect();
            self.sinks = r.sinks.iter().map(|t| topics.id(t)).collect();
            if let Some(b) = &r.behavior {
                self.spec.behavior = b.clone();
            }
        }
        let config = |inputs: &BTreeSet<Channel>, sinks: &BTreeSet<TopicId>| NodeConfig {
            sender: self.sender,
            inputs: inputs.clone(),
            sinks: sinks.clone(),
        };
        Ok(
            match P::init(config(&self.inputs, &self.sinks), &self.store, broker) {
                Ok(init) => {
                    if pending.is_some() {
                        self.rescopes_applied += 1;
                    }
                    (init, 0)
                }
                // The protocol refuses to drop an input that still holds
                // records. An operator redeclares the input and tries the
                // redeploy again later: so does the kit, at the next restart.
                Err(ProtocolError::HeldRecordsOnDepartingInput { .. }) if pending.is_some() => {
                    self.inputs = old_inputs.clone();
                    self.sinks = old_sinks.clone();
                    self.spec.behavior = old_behavior;
                    let init = P::init(config(&self.inputs, &self.sinks), &self.store, broker)
                        .map_err(|e| {
                            violation(format!("node {}: init refused: {e}", self.spec.name))
                        })?;
                    (init, 1)
                }
                Err(e) => {
                    return Err(violation(format!(
                        "node {}: init refused: {e}",
                        self.spec.name
                    )));
                }
            },
        )
    }

    /// Where each input starts, by the host's policy or, for an input that
    /// joined, the protocol's resume position; never below the log start.
    /// Tells the oracle what the node consumes from where. Returns the
    /// inputs that joined and how many of them the protocol seeded.
    fn position_inputs(
        &mut self,
        first_start: bool,
        old_inputs: &BTreeSet<Channel>,
        resume: &BTreeMap<Channel, i64>,
        broker: &SimBroker,
        oracle: &mut Oracle,
    ) -> Result<(usize, usize), Violation> {
        let mut joined_inputs = 0;
        let mut seeded_inputs = 0;
        let inputs: Vec<Channel> = self.inputs.iter().copied().collect();
        for c in inputs {
            let start = broker.log_start(c);
            // Where the host's own policy starts: the committed position,
            // else the start policy. This, not the protocol's answer, is the
            // oracle's baseline.
            let own = match self.positions.get(&c) {
                Some(&p) => p,
                None => match self.spec.start {
                    StartPolicy::Earliest => start,
                    StartPolicy::Latest => broker.end_offset(c),
                },
            };
            // H5: a joining input resumes where the protocol says.
            let pos = match resume.get(&c) {
                Some(&r) if self.spec.seek_resume => r,
                _ => own,
            };
            // H6: never start below the log start.
            let (pos, own) = (pos.max(start), own.max(start));
            self.positions.insert(c, pos);
            if !first_start && !old_inputs.contains(&c) {
                joined_inputs += 1;
                if resume.contains_key(&c) {
                    seeded_inputs += 1;
                }
                oracle.consume_joining(self.actor, c, own);
                // The node's own committed sends to the joining channel (it
                // was a sink): records claiming them are what used to wedge.
                match self.store.get_state(StateKey::SendSeq(c)) {
                    Some(v) => {
                        let seq = v.try_into().map(i64::from_be_bytes).map_err(|_| {
                            violation(format!("node {}: corrupt sq/ value", self.spec.name))
                        })?;
                        self.joined_own_seq.insert(c, seq);
                    }
                    None => {
                        self.joined_own_seq.remove(&c);
                    }
                }
            } else {
                oracle.consume(self.actor, c, pos);
            }
        }
        Ok((joined_inputs, seeded_inputs))
    }

    /// The operator reset due before this restart, if one is: the node's
    /// store is rewritten as `parsley reset` rewrites a task's state
    /// changelog, its inputs are positioned where the reset says, and the
    /// oracle forgets what the node delivered. Like the operator's tool, it
    /// runs while the node is down and is committed whatever the start
    /// then does. Returns the resets applied and the skip marks written.
    pub(super) fn apply_reset(
        &mut self,
        broker: &SimBroker,
        oracle: &mut Oracle,
    ) -> Result<(usize, usize), Violation> {
        let Some(reset) = self
            .spec
            .resets
            .get(self.resets_applied)
            .filter(|r| r.at_restart <= self.restarts)
            .copied()
        else {
            return Ok((0, 0));
        };
        self.resets_applied += 1;
        let mut points = BTreeMap::new();
        for &c in &self.inputs {
            let start = broker.log_start(c);
            // Never above the last stable offset: a record below the
            // position must be decided (committed or aborted) when the
            // scan reads it.
            let position = match reset.to {
                ResetTo::Earliest => start,
                ResetTo::Middle => start + (broker.last_stable(c) - start).max(0) / 2,
            };
            let records = broker
                .committed_from_start(c)
                .into_iter()
                .map(|(offset, r)| (offset, r.causal.sender));
            let mut point = ResetPoint::scan(position, records);
            if self.fault == Some(HostFault::ResetWithoutSkipMarks) {
                point.below.clear();
            }
            points.insert(c, point);
        }
        let batch = if self.fault == Some(HostFault::ResetDeletesState) {
            let mut batch = WriteBatch::new();
            self.store.for_each_state(&mut |k, _| {
                if let Ok(k) = k {
                    batch.delete(k);
                }
            });
            batch
        } else {
            let mut batch = reset_writes(&self.store, &points)
                .map_err(|e| violation(format!("node {}: reset refused: {e}", self.spec.name)))?;
            if self.fault == Some(HostFault::ResetForgetsPast) {
                match self.store.get_state(StateKey::CarriedAncestry) {
                    Some(before) => batch.put(StateKey::CarriedAncestry, before.to_vec()),
                    None => batch.delete(StateKey::CarriedAncestry),
                }
            }
            batch
        };
        let skip_marks = batch
            .iter()
            .filter(|(k, v)| matches!(k, StateKey::SkipMark(..)) && v.is_some())
            .count();
        self.store.apply(&batch);
        oracle.reset(self.actor);
        for (c, point) in points {
            self.positions.insert(c, point.position);
        }
        Ok((1, skip_marks))
    }
}
