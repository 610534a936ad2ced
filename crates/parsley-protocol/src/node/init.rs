//! Starting a node from committed state, in four phases: read what was
//! persisted ([`Persisted::read`]); reconcile the recorded scope with the
//! configured one ([`Reconcile`]: departing inputs, former sinks, joining
//! inputs); seed own outputs from the sinks' end offsets; and assemble the
//! node, releasing whatever the reconciliation made deliverable.

use super::*;

impl CausalNode {
    /// Starts a node from committed state: restores everything persisted,
    /// reconciles the recorded scope with `config` (shrink, growth, former
    /// sinks), seeds own outputs from every declared sink's end offset, and
    /// releases whatever the reconciliation made deliverable.
    ///
    /// The writes init makes are idempotent and are returned by the first
    /// [`take_writes`](Self::take_writes), to be committed with the first
    /// step.
    pub fn init(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
    ) -> Result<Initialized, ProtocolError> {
        Self::init_windowed(config, store, broker, None)
    }

    /// [`init`](Self::init) with a resident window set from the start (see
    /// [`set_resident_window`](Self::set_resident_window)): held records
    /// beyond it are checked as they are read and kept only as offset and
    /// size, so a node restored with many records held never has them all
    /// in memory. The host serves the node's
    /// [`page_requests`](Self::page_requests), as after any call.
    pub fn init_windowed(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
        window: Option<usize>,
    ) -> Result<Initialized, ProtocolError> {
        let window = window.map(|w| w.max(1));
        if let Some(c) = config.inputs.iter().find(|c| c.partition < 0) {
            return Err(ProtocolError::InvalidConfig(format!(
                "input {c} has a negative partition"
            )));
        }
        // Phase 1: what was committed.
        let p = Persisted::read(store, window)?;
        // Phase 2: the recorded scope against the configured one.
        let mut r = Reconcile::new(&config, p);
        r.shrink(&config)?;
        let answers = r.query_ends(&config, broker)?;
        // Phase 3: own outputs, then what they and the rest of the past
        // seed on joining inputs.
        let own_outputs = seed_own_outputs(&config, &answers)?;
        r.fold_former_sinks(&answers)?;
        r.grow(&config, &own_outputs, &answers);
        // Phase 4: the node itself.
        r.assemble(config, own_outputs, window)
    }
}

/// The reconciliation of a node's recorded scope with its configured one,
/// as it goes: what was read, the carried ancestry it builds, the writes it
/// makes, and the report the host gets.
struct Reconcile {
    p: Persisted,
    report: InitReport,
    recorded_inputs: BTreeSet<Channel>,
    persisted_carried: VectorClock,
    carried: VectorClock,
    pending: WriteBatch,
    /// Sinks recorded but no longer configured.
    former: BTreeSet<TopicId>,
    /// Inputs configured but not recorded.
    grown: Vec<Channel>,
    /// Where each seeded joining input resumes, and its seed.
    resume: BTreeMap<Channel, i64>,
    seeded: BTreeMap<Channel, i64>,
    /// Skip marks made for joining inputs.
    skips: BTreeMap<Channel, BTreeMap<SenderId, SkipMark>>,
}

impl Reconcile {
    fn new(config: &NodeConfig, p: Persisted) -> Self {
        let report = InitReport {
            fresh: p.scope.is_none(),
            ..InitReport::default()
        };
        let (recorded_inputs, recorded_sinks) = match &p.scope {
            Some((s, _)) => (
                s.inputs.iter().copied().collect::<BTreeSet<_>>(),
                s.sinks.iter().copied().collect::<BTreeSet<_>>(),
            ),
            None => (BTreeSet::new(), BTreeSet::new()),
        };
        let persisted_carried = p.carried.clone().unwrap_or_default();
        let former = recorded_sinks.difference(&config.sinks).copied().collect();
        let grown = config
            .inputs
            .difference(&recorded_inputs)
            .copied()
            .collect();
        Reconcile {
            carried: persisted_carried.clone(),
            persisted_carried,
            p,
            report,
            recorded_inputs,
            pending: WriteBatch::new(),
            former,
            grown,
            resume: BTreeMap::new(),
            seeded: BTreeMap::new(),
            skips: BTreeMap::new(),
        }
    }

    /// Shrink: a departing input's past moves into carried ancestry, and
    /// its state is deleted. An input still holding records cannot depart.
    fn shrink(&mut self, config: &NodeConfig) -> Result<(), ProtocolError> {
        let p = &mut self.p;
        for &ch in self.recorded_inputs.difference(&config.inputs) {
            let (head, tail) = p.queue_meta.get(&ch).copied().unwrap_or((0, 0));
            if tail > head {
                return Err(ProtocolError::HeldRecordsOnDepartingInput {
                    channel: ch,
                    held: tail.saturating_sub(head),
                });
            }
            if let Some(f) = p.frontiers.remove(&ch) {
                self.carried.claim_offset(ch, f);
                self.pending.delete(StateKey::Frontier(ch));
            }
            if let Some(cc) = p.advertised.remove(&ch) {
                self.carried.merge(&cc);
                self.pending.delete(StateKey::ChannelClock(ch));
            }
            if p.queue_meta.remove(&ch).is_some() {
                self.pending.delete(StateKey::QueueMeta(ch));
            }
            for sender in p.skips.remove(&ch).unwrap_or_default().into_keys() {
                self.pending.delete(StateKey::SkipMark(ch, sender));
            }
            for offset in p.stepped.remove(&ch).unwrap_or_default().into_keys() {
                self.pending.delete(StateKey::Stepped(ch, offset));
            }
            self.report.shrunk.push(ch);
        }
        Ok(())
    }

    /// One end-offset query: current and former sinks (own outputs and
    /// their folding), and joining inputs (the bound of what the node's
    /// past can name there).
    fn query_ends(
        &self,
        config: &NodeConfig,
        broker: &dyn BrokerOffsets,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, ProtocolError> {
        let mut query: BTreeSet<TopicId> = config.sinks.union(&self.former).copied().collect();
        query.extend(self.grown.iter().map(|c| c.topic));
        if query.is_empty() {
            return Ok(BTreeMap::new());
        }
        Ok(broker.end_offsets(&query)?)
    }

    /// A former sink's writes stay in the node's past: they fold into
    /// carried ancestry. A former sink that no longer exists is reported.
    fn fold_former_sinks(
        &mut self,
        answers: &BTreeMap<TopicId, TopicOffsets>,
    ) -> Result<(), ProtocolError> {
        for &topic in &self.former {
            match answer_for(answers, topic)? {
                TopicOffsets::Absent => self.report.former_sinks_absent.push(topic),
                TopicOffsets::Present(ends) => {
                    for (&partition, &end) in ends {
                        self.carried
                            .claim_offset(Channel::new(topic, partition), end - 1);
                    }
                    self.report.former_sinks_folded.push(topic);
                }
            }
        }
        Ok(())
    }

    /// Growth: a joining input skips everything the node's stamps already
    /// claim as past on it, so that history is never re-entered after the
    /// effects the node delivered. That past is what a stamp would carry:
    /// carried ancestry (departed inputs, former sinks), own outputs, and
    /// the advertised clocks of the inputs it keeps, with sequence claims
    /// it can resolve turned into offsets. Sequence claims it cannot
    /// resolve name records whose offsets are unknown here; they become
    /// skip marks, applied as those records arrive. The node's own
    /// committed sends to the channel (it was a sink) are in its past by
    /// definition: they become a skip mark too, which is what meets claims
    /// on them that come back through custody (they sit below the seed, so
    /// they will never be delivered here).
    ///
    /// A fresh node has no past: its own outputs at a first start are an
    /// over-claim on whatever others wrote to its sinks, not history it
    /// ignored, so they seed nothing and the host's start policy decides.
    fn grow(
        &mut self,
        config: &NodeConfig,
        own_outputs: &VectorClock,
        answers: &BTreeMap<TopicId, TopicOffsets>,
    ) {
        let end_of = |c: Channel| match answers.get(&c.topic) {
            Some(TopicOffsets::Present(ends)) => ends.get(&c.partition).copied(),
            _ => None,
        };
        let p = &self.p;
        let mut past = self.carried.clone();
        if !self.report.fresh {
            past.merge(own_outputs);
        }
        for (c, cc) in &p.advertised {
            if config.inputs.contains(c) {
                past.merge(cc);
            }
        }
        for &ch in &self.grown {
            self.report.grown.push(ch);
            let mut seed = past.offset(ch);
            let marks = p.delivered.get(&ch);
            if let (Some(&seq), Some(bound)) = (p.send_seq.get(&ch), end_of(ch)) {
                self.skips
                    .entry(ch)
                    .or_default()
                    .insert(config.sender, SkipMark { seq, bound });
            }
            for claim in past.sequences().iter().filter(|c| c.channel == ch) {
                if claim.sender == config.sender {
                    // Our own committed sends: the own-claim rule covers them.
                    continue;
                }
                match marks.and_then(|m| m.get(&claim.sender)) {
                    Some(m) if m.seq >= claim.seq => {
                        seed = Some(seed.map_or(m.offset, |s| s.max(m.offset)));
                    }
                    _ => {
                        if let Some(bound) = end_of(ch) {
                            self.skips.entry(ch).or_default().insert(
                                claim.sender,
                                SkipMark {
                                    seq: claim.seq,
                                    bound,
                                },
                            );
                        }
                    }
                }
            }
            if let Some(n) = seed {
                self.seeded.insert(ch, n);
                self.resume.insert(ch, n + 1);
            }
        }
        self.report.seeded = self.seeded.clone();
        self.report.skip_marks = self.skips.clone();
    }

    /// The configured inputs' channel states, from what was read and what
    /// growth seeded.
    fn channels(&mut self, config: &NodeConfig) -> Vec<ChannelState> {
        let p = &mut self.p;
        let mut channels = Vec::with_capacity(config.inputs.len());
        for &ch in &config.inputs {
            let mut st = ChannelState::new(ch);
            if let Some(&f) = p.frontiers.get(&ch) {
                st.frontier = f;
            }
            if let Some(&n) = self.seeded.get(&ch)
                && n > st.frontier
            {
                st.frontier = n;
                st.frontier_dirty = true;
            }
            if let Some(cc) = p.advertised.remove(&ch) {
                st.advertised = cc;
            }
            if let Some(&(head, tail)) = p.queue_meta.get(&ch) {
                st.head_index = head;
                st.committed_head = head;
                st.committed_tail = tail;
            }
            let restored = p.queues.remove(&ch).unwrap_or_default();
            st.restored = VecDeque::from(restored.resident);
            st.paged = restored.paged;
            st.stored = restored.stored;
            if let Some(marks) = p.delivered.remove(&ch) {
                st.delivered = marks;
            }
            if let Some(marks) = p.skips.remove(&ch) {
                st.skip = marks;
            }
            if let Some(marks) = self.skips.remove(&ch) {
                st.skip = marks;
                st.skip_dirty = true;
            }
            channels.push(st);
        }
        channels
    }

    /// Builds the node, records the configured scope if it changed, and
    /// releases what the restored holds allow (gated lazily, head first,
    /// against the reconciled scope).
    fn assemble(
        mut self,
        config: NodeConfig,
        own_outputs: VectorClock,
        window: Option<usize>,
    ) -> Result<Initialized, ProtocolError> {
        let channels = self.channels(&config);
        let scope = ScopeRecord {
            inputs: config.inputs.iter().copied().collect(),
            sinks: config.sinks.iter().copied().collect(),
        }
        .encode();
        let mut p = self.p;
        if p.scope.as_ref().map(|(_, bytes)| bytes.as_slice()) != Some(scope.as_slice()) {
            self.pending.put(StateKey::Scope, scope);
        }
        let mut report = self.report;
        let mut node = CausalNode {
            sender: config.sender,
            sinks: config.sinks,
            channels,
            carried_dirty: self.carried != self.persisted_carried,
            carried: self.carried,
            // What is left: the delivered marks of channels not consumed
            // any more.
            carried_delivered: std::mem::take(&mut p.delivered),
            own_outputs,
            prior_send_seq: p.send_seq.clone(),
            send_seq: p.send_seq,
            self_claims: BTreeMap::new(),
            send_seq_dirty: BTreeSet::new(),
            pending: self.pending,
            resume: self.resume,
            held: 0,
            held_bytes: 0,
            stamp_base: StampBase::default(),
            stepped: std::mem::take(&mut p.stepped),
            stats: NodeStats::default(),
            window,
        };
        node.stats.paged_out_total = node.channels.iter().map(|c| c.paged.len() as u64).sum();
        node.held = node.channels.iter().map(ChannelState::len).sum();
        node.held_bytes = node.channels.iter().map(ChannelState::held_bytes).sum();
        report.restored_held = node.held;
        let mut deliveries = Vec::new();
        node.cascade(&mut deliveries)?;
        info!(
            sender = %node.sender,
            inputs = node.channels.len(),
            sinks = node.sinks.len(),
            restored_held = report.restored_held,
            released_at_init = deliveries.len(),
            shrunk = ?report.shrunk,
            grown = ?report.grown,
            former_sinks_absent = ?report.former_sinks_absent,
            "causal node initialised"
        );
        Ok(Initialized {
            node,
            deliveries,
            report,
        })
    }
}

/// Own outputs: every partition of every declared sink up to its end, so
/// the node's stamps claim everything already written there. A declared
/// sink that does not exist fails the start.
fn seed_own_outputs(
    config: &NodeConfig,
    answers: &BTreeMap<TopicId, TopicOffsets>,
) -> Result<VectorClock, ProtocolError> {
    let mut own_outputs = VectorClock::new();
    for &topic in &config.sinks {
        match answer_for(answers, topic)? {
            TopicOffsets::Absent => return Err(ProtocolError::MissingSink { topic }),
            TopicOffsets::Present(ends) => {
                for (&partition, &end) in ends {
                    own_outputs.claim_offset(Channel::new(topic, partition), end - 1);
                }
            }
        }
    }
    Ok(own_outputs)
}
