//! Reading the committed state of a driver's tasks: fold state by key,
//! tick state, and the causal read that waits for a clock's causes.

use super::*;

/// A state key's bytes (`None` for the null key), encoded with the key
/// codec of `stage`'s store.
fn encode_state_key<K: 'static>(
    stage: &str,
    codec: &Codec<K>,
    key: impl IntoNullable<K>,
) -> Result<Option<Vec<u8>>, DriverError> {
    key.into_nullable()
        .map(|k| codec.encode(&k))
        .transpose()
        .map_err(|source| DriverError::Encode {
            topic: format!("<state key of {stage}>"),
            part: Part::Key,
            cause: source,
        })
}

fn decode_state<S: 'static>(stage: &str, codec: &Codec<S>, bytes: &[u8]) -> Result<S, DriverError> {
    codec
        .decode(bytes)
        .map_err(|source| DriverError::StateDecode {
            stage: stage.to_owned(),
            cause: source,
        })
}

impl TestDriver {
    /// The committed state of `key` in the stage `store` belongs to
    /// (`None` when the key has no state); `store` comes from
    /// [`StageBuilder::store`](crate::StageBuilder::store) and carries the
    /// key codec and state type.
    pub fn state<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: impl IntoNullable<K>,
    ) -> Result<Option<S>, DriverError> {
        self.fold_state(store.stage(), store.key_codec(), key)
    }

    /// The committed tick state of task `partition` of the stage `store`
    /// belongs to.
    pub fn tick_state_of<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        partition: i32,
    ) -> Result<Option<S>, DriverError> {
        self.tick_state(store.stage(), partition)
    }

    /// The committed fold state of `key` in `stage`, decoded with the
    /// stage's state codec (`None` when the key has no state). The key is
    /// encoded with `key_codec`; every task of the stage is searched.
    pub fn fold_state<S: 'static, K: 'static>(
        &self,
        stage: &str,
        key_codec: &Codec<K>,
        key: impl IntoNullable<K>,
    ) -> Result<Option<S>, DriverError> {
        let key = encode_state_key(stage, key_codec, key)?;
        self.slot_state(stage, &FoldKey::for_key(key.as_deref()), None)
    }

    /// The committed state of `key` in the stage `store` belongs to, once
    /// that stage has delivered every record in `after` that is on one of
    /// its inputs: the read a service makes after its own write
    /// (read-your-writes across the pipeline). The driver runs to
    /// quiescence first; a cause still missing then (held behind its own
    /// causes, or never piped) fails with [`DriverError::CausesMissing`],
    /// naming what the task waits for. On Kafka the same query waits, up
    /// to a timeout. A record on a topic that reaches the stage only
    /// through other stages fails with [`DriverError::UpstreamCause`], as
    /// on Kafka: when its effect reaches the stage cannot be told yet.
    ///
    /// ```
    /// use parsley::{Codec, Input, Message, Parsley, Stage, Step, TestDriver, Topic, DriverError};
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let notes: Topic<String, String> = Topic::new("notes", Codec::utf8(), Codec::utf8());
    /// let stage = Stage::named("totals").state(Codec::int64(), || 0);
    /// let totals = stage.store(Codec::utf8());
    /// let stage = stage
    ///     .fold(&orders, |t: i64, m: &Message<String, i64>| Step::to(t + m.value().copied().unwrap_or(0)))
    ///     .fold(&notes, |t: i64, _m: &Message<String, String>| Step::to(t))
    ///     .build()?;
    /// let app = Parsley::named("shop", [stage])?;
    /// let mut driver = TestDriver::new(&app)?;
    /// let written = driver.pipe(&orders, "acct-1", 30)?;
    /// assert_eq!(driver.state_after(&totals, "acct-1", &[written])?, Some(30));
    /// // An order held behind a note that was never written is not in the
    /// // state yet, and the query says what it waits for.
    /// let note = driver.next_coordinate(&notes, "acct-1")?;
    /// let held = driver.pipe_input(&orders, Input::new("acct-1", 12).after(&note))?;
    /// match driver.state_after(&totals, "acct-1", &[held]) {
    ///     Err(DriverError::CausesMissing { waiting_on, .. }) => assert_eq!(waiting_on[0].topic(), "orders"),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state_after<K: 'static, S: 'static>(
        &mut self,
        store: &StateStore<K, S>,
        key: impl IntoNullable<K>,
        after: &[Coordinate],
    ) -> Result<Option<S>, DriverError> {
        self.run()?;
        let stage = store.stage().to_owned();
        if let Some((cause, via)) = self.app.upstream_cause(&stage, after) {
            return Err(DriverError::UpstreamCause {
                stage,
                cause: cause.clone(),
                via,
            });
        }
        let key = encode_state_key(&stage, store.key_codec(), key)?;
        let mut clock = VectorClock::new();
        self.claim_records(&mut clock, after)?;
        let st = self
            .app
            .stage(&stage)
            .ok_or_else(|| DriverError::UnknownStage {
                stage: stage.clone(),
            })?;
        let first_source = st.source_topics().first().map(|t| (*t).to_owned());
        let partitions = match first_source {
            Some(t) => self.topic_log(&t)?.partitions.len() as i32,
            None => 1,
        };
        // A null key's state is kept by whichever task saw it: the one its
        // records were piped to (partition 0 by default).
        let partitioner = st.key_partitioner();
        let partition = partitioner.partition_for(key.as_deref(), 0, partitions);
        if let Some(cause) = st.cause_off_task(partition, after) {
            return Err(DriverError::KeyNotOnPartition {
                stage,
                task_partition: partition,
                cause: cause.clone(),
                partitioner,
            });
        }
        let query = StateQuery {
            task: TaskId {
                stage: stage.clone(),
                partition,
            },
            key: FoldKey::for_key(key.as_deref()),
            after: Some(clock),
            // The driver has run to quiescence: nothing more will come, so
            // the query is answered now, value or what it waits for.
            deadline: i64::MIN,
        };
        self.worker.query(0, query);
        let answer = self.worker.take_query_answers().pop().map(|(_, a)| a);
        match answer {
            Some(QueryAnswer::Value(bytes)) => {
                let codec = self.state_codec::<S>(&stage)?;
                bytes.map(|b| decode_state(&stage, codec, &b)).transpose()
            }
            Some(QueryAnswer::TimedOut(waiting_on)) => {
                Err(DriverError::CausesMissing { stage, waiting_on })
            }
            // Every task runs here, settled after the run: a stage whose
            // task did not start (it failed) answers so.
            other => Err(DriverError::QueryNotAnswered {
                stage,
                answer: format!("{other:?}"),
            }),
        }
    }

    /// The committed tick state of task `partition` of `stage`.
    pub fn tick_state<S: 'static>(
        &self,
        stage: &str,
        partition: i32,
    ) -> Result<Option<S>, DriverError> {
        self.slot_state(stage, &FoldKey::Ticks, Some(partition))
    }

    pub(super) fn slot_state<S: 'static>(
        &self,
        stage: &str,
        slot: &FoldKey,
        partition: Option<i32>,
    ) -> Result<Option<S>, DriverError> {
        let codec = self.state_codec::<S>(stage)?;
        for s in self.slots.iter().filter(|s| s.id.stage == stage) {
            if partition.is_some_and(|p| p != s.id.partition) {
                continue;
            }
            let Some(task) = self.worker.task(&s.id) else {
                continue;
            };
            if let Some(bytes) = task.stores().fold.get(slot) {
                return decode_state(stage, codec, &bytes).map(Some);
            }
        }
        Ok(None)
    }

    /// The state codec of `stage`, typed.
    pub(super) fn state_codec<S: 'static>(&self, stage: &str) -> Result<&Codec<S>, DriverError> {
        let st = self
            .app
            .stage(stage)
            .ok_or_else(|| DriverError::UnknownStage {
                stage: stage.to_owned(),
            })?;
        match &st.def.state {
            None => Err(DriverError::StateType {
                stage: stage.to_owned(),
                expected: std::any::type_name::<S>(),
                found: "no state".to_owned(),
            }),
            Some(decl) => {
                decl.codec
                    .downcast_ref::<Codec<S>>()
                    .ok_or_else(|| DriverError::StateType {
                        stage: stage.to_owned(),
                        expected: std::any::type_name::<S>(),
                        found: format!("state of type {}", decl.type_name),
                    })
            }
        }
    }
}
