//! A stage with state: its [`StateStore`] handles and the fold handlers of
//! [`StageBuilder<Stateful<S>>`].

use super::*;

/// A typed handle on a stateful stage's per-key state, for reading it back
/// in tests ([`TestDriver::state`](crate::TestDriver::state)) without
/// repeating the stage name, the key codec or the state type. Get one from
/// [`StageBuilder::store`].
pub struct StateStore<K, S> {
    stage: String,
    keys: Codec<K>,
    state: PhantomData<fn() -> S>,
}

impl<K, S> Clone for StateStore<K, S> {
    fn clone(&self) -> Self {
        StateStore {
            stage: self.stage.clone(),
            keys: self.keys.clone(),
            state: PhantomData,
        }
    }
}

impl<K, S> fmt::Debug for StateStore<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StateStore({}: {:?} -> {})",
            self.stage,
            self.keys,
            std::any::type_name::<S>()
        )
    }
}

impl<K, S> StateStore<K, S> {
    /// The stage the state belongs to.
    pub fn stage(&self) -> &str {
        &self.stage
    }

    /// The codec its keys are encoded with.
    pub fn key_codec(&self) -> &Codec<K> {
        &self.keys
    }
}

impl<S: 'static> StageBuilder<Stateful<S>> {
    /// A typed handle on this stage's per-key state, keyed by values that
    /// `keys` encodes (the key codec of the sources that fold into it).
    ///
    /// ```
    /// use parsley::{Codec, Parsley, Stage, Step, TestDriver, Topic};
    /// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    /// let builder = Stage::named("balances").state(Codec::int64(), || 0);
    /// let balances = builder.store(Codec::utf8());
    /// let stage = builder
    ///     .fold(&payments, |b, m| Step::to(b + m.value().copied().unwrap_or(0)))
    ///     .build()?;
    /// let mut driver = TestDriver::new(&Parsley::named("bank", [stage])?)?;
    /// driver.pipe(&payments, "acct-1", 40)?;
    /// assert_eq!(driver.state(&balances, "acct-1")?, Some(40));
    /// assert_eq!(driver.state(&balances, "acct-2")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store<K: 'static>(&self, keys: Codec<K>) -> StateStore<K, S> {
        StateStore {
            stage: self.name.clone(),
            keys,
            state: PhantomData,
        }
    }

    /// Adds `topic` as a source folded over the key's state: `fold` gets the
    /// current state (the initial value for an unseen key) and the message,
    /// and returns a [`Step`] (or `Result<Step<S>, E>`).
    pub fn fold<K, V, F, R>(self, topic: &Topic<K, V>, fold: F) -> Self
    where
        K: Payload,
        V: Payload,
        F: Fn(S, &Message<K, V>) -> R + Send + Sync + 'static,
        R: FoldOutput<S>,
    {
        self.fold_owned(topic, move |s, m: Message<K, V>| fold(s, &m))
    }

    /// [`fold`](Self::fold) with a fold that takes the message by value, so
    /// it can move the key and the value into what it emits
    /// ([`Message::into_key_value`]) instead of cloning them. The key's state slot is found from the
    /// record's key bytes, not from the message, so moving the key out
    /// changes nothing.
    ///
    /// ```
    /// use parsley::{Codec, Parsley, Stage, Step, TestDriver, Topic};
    /// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    /// let balances: Topic<String, i64> = Topic::new("balances", Codec::utf8(), Codec::int64());
    /// let mut builder = Stage::named("balances").state(Codec::int64(), || 0);
    /// let out = builder.add_sink(&balances);
    /// let stage = builder
    ///     .fold_owned(&payments, move |balance, m| {
    ///         let (account, amount) = m.into_key_value();
    ///         let next = balance + amount.unwrap_or(0);
    ///         Step::to(next).emit(out.send(account, next))
    ///     })
    ///     .build()?;
    /// let mut driver = TestDriver::new(&Parsley::named("bank", [stage])?)?;
    /// driver.pipe(&payments, "acct-1", 40)?;
    /// driver.pipe(&payments, "acct-1", 2)?;
    /// let account = Some("acct-1".to_string());
    /// assert_eq!(driver.key_values(&balances)?, vec![(account.clone(), Some(40)), (account, Some(42))]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fold_owned<K, V, F, R>(mut self, topic: &Topic<K, V>, fold: F) -> Self
    where
        K: Payload,
        V: Payload,
        F: Fn(S, Message<K, V>) -> R + Send + Sync + 'static,
        R: FoldOutput<S>,
    {
        let t = topic.clone();
        let codec = self.mode.codec.clone();
        let init = self.mode.init.clone();
        let logic: SourceLogic = Arc::new(move |input, state| {
            let m = decode_message(&t, input)?;
            let s = resolve_state(&codec, init.as_ref(), state)?;
            let step = fold(s, m).into_step().map_err(Failure::Logic)?;
            step_outcome(&codec, step)
        });
        self.add_source(erase(topic), logic, true);
        self
    }

    /// [`fold`](Self::fold) with a fallible fold whose `Err` keeps the key's
    /// state and carries the emissions `recover` returns (see
    /// [`recovering_fold`]); the closures' argument types come from the
    /// state and `topic`, so they need no annotations.
    ///
    /// ```
    /// use parsley::{Codec, Stage, Step, Topic};
    /// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    /// let rejects: Topic<String, String> = Topic::new("rejects", Codec::utf8(), Codec::utf8());
    /// let mut builder = Stage::named("accounts").state(Codec::int64(), || 0);
    /// let reject = builder.add_sink(&rejects);
    /// let stage = builder
    ///     .fold_recovering(
    ///         &payments,
    ///         |balance, m| {
    ///             let next = balance + m.value().copied().unwrap_or(0);
    ///             if next < 0 { Err(format!("overdraft by {}", -next)) } else { Ok(Step::to(next)) }
    ///         },
    ///         move |m, e| vec![reject.send(m.key().cloned(), e.clone())],
    ///     )
    ///     .build()?;
    /// # Ok::<(), parsley::StageError>(())
    /// ```
    ///
    /// [`recovering_fold`]: crate::recovering_fold
    pub fn fold_recovering<K, V, E, F, R>(self, topic: &Topic<K, V>, fold: F, recover: R) -> Self
    where
        K: Payload,
        V: Payload,
        E: 'static,
        F: Fn(S, &Message<K, V>) -> Result<Step<S>, E> + Send + Sync + 'static,
        R: Fn(&Message<K, V>, &E) -> Vec<Emission> + Send + Sync + 'static,
    {
        self.fold(topic, crate::logic::recovering_fold(fold, recover))
    }

    /// Declares ticks with a tick fold over the stage's tick-state slot: one
    /// reserved slot per task, distinct from every key's (the null key's
    /// included), starting from the initial value.
    pub fn tick_fold<F, R>(mut self, interval: Duration, fold: F) -> Self
    where
        F: Fn(S, &Tick) -> R + Send + Sync + 'static,
        R: FoldOutput<S>,
    {
        let codec = self.mode.codec.clone();
        let init = self.mode.init.clone();
        let logic: TickLogic = Arc::new(move |tick, state, _keyed| {
            let s = resolve_state(&codec, init.as_ref(), state)?;
            let step = fold(s, tick).into_step().map_err(Failure::Logic)?;
            step_outcome(&codec, step)
        });
        self.ticks.push(TickDecl {
            interval,
            logic,
            uses_state: true,
        });
        self
    }

    /// Declares ticks with a tick fold that also reads the per-key state
    /// of the task, the way a Kafka Streams punctuator iterates a store:
    /// `fold` gets the tick-state slot, the tick, and a [`StateView`] of
    /// every key's state (keys decoded with `keys`), in encoded-key order.
    /// The view is read-only; the step writes the tick slot and its
    /// emissions commit in the same transaction as any other step.
    ///
    /// ```
    /// use std::time::Duration;
    /// use parsley::{Codec, Parsley, Stage, Step, TestDriver, Topic};
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let summaries: Topic<String, String> = Topic::new("summaries", Codec::utf8(), Codec::utf8());
    /// let mut builder = Stage::named("counts").state(Codec::int64(), || 0);
    /// let summary = builder.add_sink(&summaries);
    /// let stage = builder
    ///     .fold(&orders, |n, _m| Step::to(n + 1))
    ///     .tick_fold_over(Duration::from_secs(60), Codec::utf8(), move |ticks, _tick, counts| {
    ///         let line: Vec<String> = counts
    ///             .iter()
    ///             .map(|(customer, n)| format!("{}={n}", customer.unwrap_or_default()))
    ///             .collect();
    ///         Step::to(ticks + 1).emit(summary.send(None, line.join(" ")))
    ///     })
    ///     .build()?;
    /// let app = Parsley::named("shop", [stage])?;
    /// let mut driver = TestDriver::new(&app)?;
    /// driver.pipe(&orders, "bob", 5)?;
    /// driver.pipe(&orders, "ann", 7)?;
    /// driver.pipe(&orders, "bob", 1)?;
    /// driver.advance_wall_clock(Duration::from_secs(60))?;
    /// assert_eq!(driver.values(&summaries)?, vec!["ann=1 bob=2".to_string()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tick_fold_over<K, F, R>(mut self, interval: Duration, keys: Codec<K>, fold: F) -> Self
    where
        K: 'static,
        F: Fn(S, &Tick, &StateView<'_, K, S>) -> R + Send + Sync + 'static,
        R: FoldOutput<S>,
    {
        let codec = self.mode.codec.clone();
        let init = self.mode.init.clone();
        let logic: TickLogic = Arc::new(move |tick, state, keyed| {
            let s = resolve_state(&codec, init.as_ref(), state)?;
            let error = RefCell::new(None);
            let view = StateView::new(keyed, &keys, &codec, &error);
            let out = fold(s, tick, &view).into_step();
            if let Some(e) = error.into_inner() {
                return Err(Failure::StateDecode(e));
            }
            step_outcome(&codec, out.map_err(Failure::Logic)?)
        });
        self.ticks.push(TickDecl {
            interval,
            logic,
            uses_state: true,
        });
        self
    }
}
