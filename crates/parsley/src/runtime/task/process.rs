//! The record path in: a fetched record gated, each delivery decoded and
//! handed to the stage's logic under a panic guard, and the wall clock's
//! ticks.

use super::*;

impl Task {
    /// Hands over one record fetched from `channel`. Records of one
    /// channel must come in strictly increasing offset order. The task
    /// copies out of `record` only what it keeps.
    pub fn on_record(
        &mut self,
        channel: Channel,
        record: &dyn RecordView,
    ) -> Result<(), TaskError> {
        self.guarded(|t| t.on_record_inner(channel, record))
    }

    /// Reports the consumer position of a channel: every offset below
    /// `position` has been handed to [`on_record`](Self::on_record) or was
    /// skipped by the consumer (transaction markers, aborted records).
    pub fn position_advance(&mut self, channel: Channel, position: i64) -> Result<(), TaskError> {
        self.guarded(|t| {
            let mut deliveries = t
                .node
                .position_advance(channel, position)
                .map_err(|e| t.protocol(e))?;
            t.release(&mut deliveries)?;
            t.refresh_holds();
            Ok(())
        })
    }

    /// Tells the task the wall-clock time: emits a tick if one is due, and
    /// logs a `vc-hold-*` warning once for each hold older than the stage's
    /// threshold. Ticks fall due on a fixed grid, the multiples of the
    /// interval since the epoch, so a late punctuation does not push the
    /// schedule back; one call emits one tick at most, so a clock that
    /// jumps over several grid points gives one tick, not one per point.
    pub fn punctuate(&mut self, now_ms: i64) -> Result<(), TaskError> {
        self.guarded(|t| {
            t.wall_clock = t.wall_clock.max(now_ms);
            if let Some(interval) = t.stage.tick_interval()
                && t.ticks.due(t.wall_clock)
            {
                t.emit_tick()?;
                t.ticks.ticked(t.wall_clock, ms(interval));
            }
            // Hold heads change in on_record, position_advance, init and
            // a resumed release, and each refreshes the tracking; here
            // only time moves.
            if let Some(threshold) = t.stage.hold_warning_after() {
                let threshold = ms(threshold);
                let due = t.holds.warning_due(t.wall_clock, threshold);
                if !due {
                    return Ok(());
                }
                for (channel, held) in t.held_by_channel() {
                    if held.held_for_ms >= threshold && t.holds.mark_warned(channel) {
                        t.stats.hold_warnings += 1;
                        let code = held
                            .waiting_on
                            .first()
                            .map_or("vc-hold", |w| w.diagnosis().code());
                        warn!(code, task = %t.id, "{}", held.summary());
                    }
                }
            }
            Ok(())
        })
    }

    fn on_record_inner(
        &mut self,
        channel: Channel,
        record: &dyn RecordView,
    ) -> Result<(), TaskError> {
        let offset = record.offset();
        if let Some(stepped) = self.node.stepped_past(channel, offset).cloned() {
            // Stepped past before (an operator's skip, or a step an aborted
            // transaction made and this one repeats from the store).
            return self.dead_letter_input(channel, record, &stepped);
        }
        // The stamp is decoded where it lies; only the other headers are
        // copied, and only if there are any.
        let causal = match CausalHeaders::decode(record.headers()) {
            Ok(c) => c,
            Err(source) => {
                let coordinate =
                    Coordinate::new(self.topic_name(channel.topic), channel.partition, offset);
                let Some(topic) = self.stage.corrupt_headers_dead_letter() else {
                    return Err(TaskError::CorruptHeaders {
                        task: self.id.clone(),
                        coordinate,
                        cause: source,
                    });
                };
                let stepped = SteppedPast {
                    dead_letter: topic.to_owned(),
                    reason: format!("corrupt causal headers: {source}"),
                };
                self.node
                    .step_past(channel, offset, stepped.clone())
                    .map_err(|e| self.protocol(e))?;
                return self.dead_letter_input(channel, record, &stepped);
            }
        };
        let headers: Vec<Header> = record
            .headers()
            .filter(|(name, _)| !is_causal_header(name))
            .map(|(name, value)| Header::named(name, value.map(<[u8]>::to_vec)))
            .collect();
        let inbound = InboundRecord {
            channel,
            offset,
            timestamp: record.timestamp(),
            key: record.key().map(<[u8]>::to_vec),
            value: record.value().map(<[u8]>::to_vec),
            headers,
            causal,
        };
        let (channel, offset) = (inbound.channel, inbound.offset);
        // What a DEBUG line about a hold shows: the record's claims by
        // topic name and its sender tag, never payload bytes. Built only
        // when that level is on.
        let described = tracing::enabled!(tracing::Level::DEBUG).then(|| {
            (
                self.describe_clock(&inbound.causal.clock),
                inbound
                    .causal
                    .sender
                    .map(|t| format!("{} seq {}", t.sender, t.seq)),
            )
        });
        let node = &self.node;
        self.holds
            .note_claims(|w| node.claims_unmet_on(&inbound.causal.clock, w));
        let held_before = self.node.held_count();
        let mut deliveries = std::mem::take(&mut self.deliveries);
        deliveries.clear();
        if let Err(e) = self.node.on_record_into(inbound, &mut deliveries) {
            return Err(self.protocol(e));
        }
        // Whether the arriving record joined a queue (held now, or held
        // and released by what arrived): known before any page is served.
        let released = deliveries.iter().filter(|d| d.was_held).count();
        if self.node.held_count() + released > held_before {
            // Only the arriving record can join a queue in one call; its
            // coordinate is named only then, off the common path.
            self.acted = true;
            let coordinate = self.coordinate((channel, offset));
            if let Some(budget) = self.holds.budget()
                && let Some(size) = self.node.last_held_size(channel)
                && size > budget
            {
                return Err(TaskError::HoldBudget {
                    task: self.id.clone(),
                    coordinate,
                    size,
                    budget,
                });
            }
            if let Some((clock, sender)) = &described {
                debug!(task = %self.id, %coordinate, %clock, sender = sender.as_deref().unwrap_or("none"), "record held");
            }
            if self.record_events {
                self.events.push(TaskEvent::Held { coordinate });
            }
        }
        self.release(&mut deliveries)?;
        // The buffer is kept for the next record, unless the release of a
        // long hold grew it (100k released records leave about 20 MiB of
        // room behind otherwise).
        if deliveries.capacity() <= KEPT_DELIVERY_ROOM {
            self.deliveries = deliveries;
        }
        self.refresh_holds();
        Ok(())
    }

    /// How many deliveries the buffer the task reuses between records has
    /// room for: a few hundred at most, whatever the largest release was.
    pub fn delivery_room(&self) -> usize {
        self.deliveries.capacity()
    }

    /// Sends an input record, bytes and headers unchanged, to the
    /// dead-letter topic it is stepped past to, with the `parsley.dlq.*`
    /// headers saying where it came from and why; it never reaches the
    /// node, so to the gate its offset is like a transaction marker's.
    fn dead_letter_input(
        &mut self,
        channel: Channel,
        record: &dyn RecordView,
        stepped: &SteppedPast,
    ) -> Result<(), TaskError> {
        let coordinate = self.coordinate((channel, record.offset()));
        let Some(&partitions) = self.dead_letters.get(&stepped.dead_letter) else {
            return Err(TaskError::Config {
                task: self.id.clone(),
                message: format!(
                    "record {coordinate} is to be stepped past to {:?}, a topic this task did not look up",
                    stepped.dead_letter
                ),
            });
        };
        warn!(task = %self.id, %coordinate, dead_letter = %stepped.dead_letter, reason = %stepped.reason,
            "record stepped past: sent to the dead-letter topic instead of delivered");
        let partition = partition_for(record.key(), self.id.partition, partitions);
        // Every header as it came, the stamp's included.
        let mut headers: Vec<Header> = record
            .headers()
            .map(|(name, value)| Header::named(name, value.map(<[u8]>::to_vec)))
            .collect();
        for (name, value) in [
            (crate::topic::DEAD_LETTER_ERROR, stepped.reason.clone()),
            (crate::topic::DEAD_LETTER_TOPIC, coordinate.topic.clone()),
            (
                crate::topic::DEAD_LETTER_PARTITION,
                coordinate.partition.to_string(),
            ),
            (
                crate::topic::DEAD_LETTER_OFFSET,
                coordinate.offset.to_string(),
            ),
        ] {
            headers.push(Header::new(name, value.into_bytes()));
        }
        self.stats.stepped_past += 1;
        self.acted = true;
        if self.record_events {
            self.events.push(TaskEvent::SteppedPast {
                coordinate,
                topic: stepped.dead_letter.clone(),
                partition,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic: stepped.dead_letter.as_str().into(),
            partition,
            key: record.key().map(RecordBytes::from),
            value: record.value().map(RecordBytes::from),
            timestamp: record.timestamp(),
            stamp: None,
            headers,
            origin: None,
        });
        Ok(())
    }

    /// Runs the stage's tick logic on a tick record, with the tick state
    /// if the stage keeps one; returns what the logic made (or its panic)
    /// and whether it used state.
    fn tick_logic(
        &mut self,
        stage: &Stage,
        record: &InboundRecord,
    ) -> Result<(std::thread::Result<Result<Outcome, Failure>>, bool), TaskError> {
        let Some(decl) = stage.def.ticks.as_ref() else {
            return Err(TaskError::Config {
                task: self.id.clone(),
                message: "tick delivered to a stage without ticks".to_owned(),
            });
        };
        let tick = Tick::new(record.timestamp).on_partition(record.channel.partition);
        let state = if decl.uses_state {
            FoldKey::Ticks.write_bytes(&mut self.key_scratch);
            self.fold_get(&self.key_scratch)
        } else {
            None
        };
        let keyed = TaskState {
            pending: &self.pending_fold,
            in_flight: self.in_flight.as_ref().map(|f| &f.fold),
            committed: &self.stores.fold,
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            (decl.logic)(&tick, state.as_deref(), &keyed)
        }));
        Ok((r, decl.uses_state))
    }

    /// The DEBUG event of a record going to the logic.
    /// A record folded into state whose key the topic's declared
    /// partitioner puts on another partition: counted, and logged at the
    /// first and then at every power of ten, so a producer on another
    /// partitioner is never silent and never floods the log.
    #[cold]
    fn misplaced_key(&mut self, topic: &str, key: &[u8], at: (Channel, i64)) {
        self.stats.misplaced_keys += 1;
        let n = self.stats.misplaced_keys;
        let mut m = n;
        while m.is_multiple_of(10) {
            m /= 10;
        }
        if m == 1 {
            let partitioner = self.stage.key_partitioner();
            warn!(
                task = %self.id,
                coordinate = %self.coordinate(at),
                misplaced = n,
                expected_partition = partitioner.partition(key, self.partitions),
                ?partitioner,
                "{topic} holds a record whose key the topic's partitioner ({partitioner:?}) places on another partition: its producer partitions otherwise. The state is kept, but a query for the key looks in another task. Declare the producers' partitioner with Topic::partitioned_by (librdkafka's default, consistent_random, is Partitioner::Crc32), or set theirs to {}",
                partitioner.librdkafka_name()
            );
        }
    }

    fn trace_delivery(&self, record: &InboundRecord, at: (Channel, i64), was_held: bool) {
        let sender = record
            .causal
            .sender
            .map(|t| format!("{} seq {}", t.sender, t.seq));
        debug!(
            task = %self.id,
            coordinate = %self.coordinate(at),
            was_held,
            clock = %self.describe_clock(&record.causal.clock),
            sender = sender.as_deref().unwrap_or("none"),
            "delivering to logic"
        );
    }

    pub(super) fn process(&mut self, delivery: Delivery) -> Result<(), TaskError> {
        let Delivery {
            mut record,
            was_held,
        } = delivery;
        // The record's coordinate names its topic: built only where it is
        // kept (an event, an error), never per record on the common path.
        let at = (record.channel, record.offset);
        let Some(&slot) = self.slots.get(&record.channel.topic) else {
            return Err(TaskError::Config {
                task: self.id.clone(),
                message: format!(
                    "delivered record {} is on no source of the stage",
                    self.coordinate(at)
                ),
            });
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            self.trace_delivery(&record, at, was_held);
        }
        let stage = self.stage.clone();
        let (outcome, uses_state) = match slot {
            SourceSlot::Ticks => self.tick_logic(&stage, &record)?,
            SourceSlot::User(i) => {
                let src = &stage.def.sources[i];
                // The state key is built in the task's reused buffer: the
                // pending writes copy it only for a key new to the
                // transaction.
                let state = if src.uses_state {
                    if let Some(key) = record.key.as_deref()
                        && src.topic.partitioner().partition(key, self.partitions)
                            != record.channel.partition
                    {
                        self.misplaced_key(src.topic.name(), key, at);
                    }
                    FoldKey::write_key_bytes(record.key.as_deref(), &mut self.key_scratch);
                    self.fold_get(&self.key_scratch)
                } else {
                    None
                };
                let topic = self.shared_topic_name(record.channel.topic);
                // The record's bytes go to the logic: the record itself is
                // not read again past this point but for its position and
                // timestamp.
                let input = RawInput {
                    topic: &topic,
                    partition: record.channel.partition,
                    offset: record.offset,
                    timestamp: record.timestamp,
                    key: record.key.take(),
                    value: record.value.take(),
                    headers: std::mem::take(&mut record.headers),
                };
                let r = catch_unwind(AssertUnwindSafe(|| (src.logic)(input, state.as_deref())));
                (r, src.uses_state)
            }
        };
        // A state read from the local store that failed read as absent:
        // whatever the logic made of it (a result, an error, a panic) must
        // not be kept, and the failure is the store's.
        if let Some(cause) = self.stores.fold.take_failure() {
            return Err(TaskError::LocalStore {
                task: self.id.clone(),
                cause,
            });
        }
        let outcome = match outcome {
            Err(payload) => {
                return Err(TaskError::Panic {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    message: panic_message(payload),
                });
            }
            Ok(Err(failure)) => return Err(self.failure(failure, self.coordinate(at))),
            Ok(Ok(o)) => o,
        };
        self.stats.delivered += 1;
        if was_held {
            self.stats.delivered_after_hold += 1;
        }
        self.acted = true;
        if self.record_events {
            self.events.push(TaskEvent::Delivered(DeliveredRecord {
                coordinate: self.coordinate(at),
                timestamp: record.timestamp,
                was_held,
                tick: matches!(slot, SourceSlot::Ticks),
            }));
        }
        self.apply(outcome, uses_state, record.timestamp, at)
    }

    pub(super) fn failure(&self, failure: Failure, coordinate: Coordinate) -> TaskError {
        let task = self.id.clone();
        match failure {
            Failure::Decode { part, source } => TaskError::Decode {
                task,
                coordinate,
                part,
                cause: source,
            },
            Failure::StateDecode(source) | Failure::StateEncode(source) => TaskError::StateCodec {
                task,
                coordinate,
                cause: source,
            },
            Failure::Logic(source) => TaskError::Logic {
                task,
                coordinate,
                cause: source,
            },
        }
    }

    pub(super) fn apply(
        &mut self,
        outcome: Outcome,
        uses_state: bool,
        timestamp: i64,
        at: (Channel, i64),
    ) -> Result<(), TaskError> {
        // The delivery's state key is still in `key_scratch`.
        if uses_state {
            match outcome.write {
                StateWrite::Keep => {}
                StateWrite::Put(bytes) => self.pending_fold.put(&self.key_scratch, bytes),
                StateWrite::Delete => self.pending_fold.delete(&self.key_scratch),
            }
        }
        for (ordinal, emission) in outcome.emissions.into_iter().enumerate() {
            let origin = EmissionOrigin {
                channel: at.0,
                offset: at.1,
                ordinal: u32::try_from(ordinal).unwrap_or(u32::MAX),
            };
            self.send(emission, timestamp, origin)?;
        }
        Ok(())
    }

    pub(super) fn guarded(
        &mut self,
        f: impl FnOnce(&mut Task) -> Result<(), TaskError>,
    ) -> Result<(), TaskError> {
        if self.poisoned {
            return Err(TaskError::Poisoned {
                task: self.id.clone(),
            });
        }
        let r = f(self);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    pub(super) fn protocol(&self, source: ProtocolError) -> TaskError {
        TaskError::Protocol {
            task: self.id.clone(),
            cause: source,
        }
    }

    /// A clock with the task's topic names in place of ids.
    fn describe_clock(&self, clock: &VectorClock) -> String {
        crate::holds::describe_clock(clock, |t| self.topic_name(t), |s| s.to_string())
    }

    pub(super) fn coordinate(&self, (channel, offset): (Channel, i64)) -> Coordinate {
        Coordinate::new(self.topic_name(channel.topic), channel.partition, offset)
    }

    fn emit_tick(&mut self) -> Result<(), TaskError> {
        let Some((topic, channel)) = self.tick_route.clone() else {
            return Ok(());
        };
        // Ticks go to the tick topic, always in version 1.
        let stamp = self
            .stamps
            .stamp(&mut self.node, channel, ClockVersion::V1)
            .map_err(|e| self.protocol(e))?;
        self.stats.emitted += 1;
        self.stats.ticks_emitted += 1;
        debug!(task = %self.id, timestamp = self.wall_clock, "tick emitted");
        if self.record_events {
            self.events.push(TaskEvent::Sent {
                topic: topic.to_string(),
                partition: channel.partition,
                tick: true,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic,
            partition: channel.partition,
            key: Some(RecordBytes::copy_from_slice(
                &channel.partition.to_be_bytes(),
            )),
            value: None,
            timestamp: self.wall_clock,
            stamp: Some(stamp),
            headers: Vec::new(),
            origin: None,
        });
        Ok(())
    }
}
