//! Stages: logic wired to topics.

mod error;
mod stateful;

pub use error::StageError;
pub use stateful::StateStore;

use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::{Codec, CodecError};
use crate::fold::{StateSource, StateView};
use crate::logic::{Emissions, FoldOutput, HandlerOutput, LogicError, Next, Step};
use crate::message::{Header, Message, Tick};
use crate::topic::{AnyTopic, Emission, Part, Payload, Sink, Topic, erase};

/// The default hold-warning threshold: 30 seconds.
pub const DEFAULT_HOLD_WARNING_AFTER: Duration = Duration::from_secs(30);

/// The longest topic name Kafka accepts.
pub(crate) const MAX_TOPIC_NAME: usize = 249;

/// Why a name cannot be used, or `None` when it can. Kafka's topic-name
/// rules, which every owned name derived from a stage name must also meet.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".to_owned());
    }
    if name == "." || name == ".." {
        return Some("`.` and `..` are not allowed".to_owned());
    }
    if name.len() > MAX_TOPIC_NAME {
        return Some(format!(
            "it is {} characters long, the limit is {MAX_TOPIC_NAME}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "it contains {c:?}; only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    None
}

/// A delivery's raw parts, as the task runner hands them to stage logic.
pub(crate) struct RawInput<'a> {
    /// Shared, so that a message names its topic without copying it.
    pub(crate) topic: &'a std::sync::Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) timestamp: i64,
    /// The delivered record's bytes and headers, given to the logic: the
    /// codecs that can keep them as the decoded value's buffer do.
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<Header>,
}

/// What logic did to its state slot, in bytes.
#[derive(Debug)]
pub(crate) enum StateWrite {
    Keep,
    Put(parsley_protocol::host::RecordBytes),
    Delete,
}

/// One application of logic: the state write and the emissions.
pub(crate) struct Outcome {
    pub(crate) write: StateWrite,
    pub(crate) emissions: Emissions,
}

/// Why applying logic failed (before any panic handling).
#[derive(Debug)]
pub(crate) enum Failure {
    Decode { part: Part, source: CodecError },
    StateDecode(CodecError),
    StateEncode(CodecError),
    Logic(LogicError),
}

type SourceLogic =
    Arc<dyn Fn(RawInput<'_>, Option<&[u8]>) -> Result<Outcome, Failure> + Send + Sync>;
type TickLogic =
    Arc<dyn Fn(&Tick, Option<&[u8]>, &dyn StateSource) -> Result<Outcome, Failure> + Send + Sync>;

pub(crate) struct SourceDecl {
    pub(crate) topic: AnyTopic,
    pub(crate) logic: SourceLogic,
    pub(crate) uses_state: bool,
}

pub(crate) struct TickDecl {
    pub(crate) interval: Duration,
    pub(crate) logic: TickLogic,
    pub(crate) uses_state: bool,
}

pub(crate) struct StateDecl {
    pub(crate) type_name: &'static str,
    /// A `Codec<S>`, for reading state back typed.
    pub(crate) codec: Arc<dyn Any + Send + Sync>,
}

pub(crate) struct StageDef {
    pub(crate) name: String,
    pub(crate) state: Option<StateDecl>,
    pub(crate) sources: Vec<SourceDecl>,
    pub(crate) sinks: Vec<AnyTopic>,
    /// Sinks whose outputs carry the compact (version 2) `vc`.
    pub(crate) compact_clock_sinks: BTreeSet<String>,
    pub(crate) ticks: Option<TickDecl>,
    pub(crate) hold_warning_after: Option<Duration>,
    pub(crate) corrupt_headers_dead_letter: Option<String>,
}

/// A built stage: a name, its sources with their logic, its sinks, and
/// optionally per-key state and ticks. Immutable and cheap to clone.
///
/// Build one with [`Stage::named`]; compose stages into an application with
/// [`Parsley::named`](crate::Parsley::named).
///
/// ```
/// use parsley::{Codec, Message, Stage, Topic};
/// let c1: Topic<String, String> = Topic::new("c1", Codec::utf8(), Codec::utf8());
/// let c2: Topic<String, String> = Topic::new("c2", Codec::utf8(), Codec::utf8());
/// let out = c2.clone();
/// let upper = Stage::named("upper")
///     .on(&c1, move |m: &Message<String, String>| {
///         vec![out.send(m.key().cloned(), m.value().map(|v| v.to_uppercase()))]
///     })
///     .sink(&c2)
///     .build()?;
/// assert_eq!(upper.name(), "upper");
/// assert_eq!(upper.source_topics(), vec!["c1"]);
/// assert_eq!(upper.sink_topics(), vec!["c2"]);
/// # Ok::<(), parsley::StageError>(())
/// ```
#[derive(Clone)]
pub struct Stage {
    pub(crate) def: Arc<StageDef>,
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("name", &self.def.name)
            .field("sources", &self.source_topics())
            .field("sinks", &self.sink_topics())
            .field("state", &self.def.state.as_ref().map(|s| s.type_name))
            .field("ticks", &self.tick_interval())
            .finish()
    }
}

impl Stage {
    /// Starts building a stage. The name keys the stage's stores, its tick
    /// topic and its sender identity, so keep it stable across deployments.
    #[allow(clippy::new_ret_no_self)]
    pub fn named(name: impl Into<String>) -> StageBuilder<Stateless> {
        StageBuilder {
            name: name.into(),
            sources: Vec::new(),
            sinks: Vec::new(),
            compact_clock_sinks: BTreeSet::new(),
            ticks: Vec::new(),
            hold_warning_after: Some(DEFAULT_HOLD_WARNING_AFTER),
            corrupt_headers_dead_letter: None,
            errors: Vec::new(),
            mode: Stateless,
        }
    }

    /// The stage's state codec, when it keeps state of type `S`.
    pub fn state_codec<S: 'static>(&self) -> Option<&Codec<S>> {
        self.def.state.as_ref()?.codec.downcast_ref::<Codec<S>>()
    }

    /// The stage name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The source topics, in declaration order (the tick topic is not
    /// listed; see [`Parsley::tick_topic`](crate::Parsley::tick_topic)).
    pub fn source_topics(&self) -> Vec<&str> {
        self.def.sources.iter().map(|s| s.topic.name()).collect()
    }

    /// How the stage's inputs place keys on partitions: the partitioner
    /// its stateful sources declare ([`Topic::partitioned_by`](crate::Topic::partitioned_by);
    /// they all declare the same one, or the stage does not build), else
    /// its first source's. A key's state is in the task of the partition
    /// this gives.
    pub fn key_partitioner(&self) -> crate::partition::Partitioner {
        self.def
            .sources
            .iter()
            .find(|s| s.uses_state)
            .or_else(|| self.def.sources.first())
            .map(|s| s.topic.partitioner())
            .unwrap_or_default()
    }

    /// The first of `after` that is on one of the stage's source topics
    /// but not on `partition`: a record the stage's task `partition` never
    /// reads, so a causal query of a key in that task can never be met by
    /// it (its key belongs to another task, or its producer partitions
    /// otherwise than the topic declares).
    pub fn cause_off_task<'a>(
        &self,
        partition: i32,
        after: &'a [crate::Coordinate],
    ) -> Option<&'a crate::Coordinate> {
        after.iter().find(|c| {
            c.partition != partition && self.def.sources.iter().any(|s| s.topic.name() == c.topic)
        })
    }

    /// The declared sink topics, sorted.
    pub fn sink_topics(&self) -> Vec<&str> {
        self.def.sinks.iter().map(|s| s.name()).collect()
    }

    /// The tick interval, if the stage ticks.
    pub fn tick_interval(&self) -> Option<Duration> {
        self.def.ticks.as_ref().map(|t| t.interval)
    }

    /// True when the stage declares per-key state.
    pub fn is_stateful(&self) -> bool {
        self.def.state.is_some()
    }

    /// The hold-warning threshold; `None` when disabled.
    pub fn hold_warning_after(&self) -> Option<Duration> {
        self.def.hold_warning_after
    }

    /// Whether the stage's outputs to `sink` carry the compact (version 2)
    /// `vc` ([`StageBuilder::compact_clock`]).
    pub fn writes_compact_clock(&self, sink: &str) -> bool {
        self.def.compact_clock_sinks.contains(sink)
    }

    /// Where a record with corrupt causal headers goes instead of failing
    /// the task, if the stage opted in
    /// ([`StageBuilder::dead_letter_corrupt_headers`]).
    pub fn corrupt_headers_dead_letter(&self) -> Option<&str> {
        self.def.corrupt_headers_dead_letter.as_deref()
    }
}

/// Marks a stage builder without per-key state.
#[derive(Debug)]
pub struct Stateless;

/// Marks a stage builder with per-key state of type `S`.
pub struct Stateful<S> {
    codec: Codec<S>,
    init: Arc<dyn Fn() -> S + Send + Sync>,
}

impl<S> fmt::Debug for Stateful<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Stateful<{}>({:?})",
            std::any::type_name::<S>(),
            self.codec
        )
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Stateless {}
    impl<S> Sealed for super::Stateful<S> {}
}

/// The state mode of a [`StageBuilder`]: [`Stateless`] or [`Stateful`].
pub trait StateMode: sealed::Sealed {
    #[doc(hidden)]
    fn state_decl(&self) -> Option<StateDeclHandle>;
}

/// Opaque handle to a stage's state declaration.
#[doc(hidden)]
pub struct StateDeclHandle(StateDecl);

impl StateMode for Stateless {
    fn state_decl(&self) -> Option<StateDeclHandle> {
        None
    }
}

impl<S: 'static> StateMode for Stateful<S> {
    fn state_decl(&self) -> Option<StateDeclHandle> {
        Some(StateDeclHandle(StateDecl {
            type_name: std::any::type_name::<S>(),
            codec: Arc::new(self.codec.clone()),
        }))
    }
}

/// Builds a [`Stage`]. Start with [`Stage::named`].
///
/// * [`state`](StageBuilder::state) declares per-key state (once, first);
/// * [`on`](StageBuilder::on) adds a source with a handler;
/// * [`fold`](StageBuilder::fold) adds a source with a fold (stateful only);
/// * [`ticks`](StageBuilder::ticks) / [`tick_fold`](StageBuilder::tick_fold)
///   / [`tick_fold_over`](StageBuilder::tick_fold_over) declare ticks (the
///   last one reads every key's state);
/// * [`add_sink`](StageBuilder::add_sink) declares a topic the logic emits
///   to and returns its [`Sink`] handle ([`sink`](StageBuilder::sink)
///   declares one for [`Topic::send`]);
/// * [`build`](StageBuilder::build) validates and freezes the stage.
///
/// # Head-of-line blocking
///
/// Holding is per partition, not per key. A record whose cause has not
/// been delivered yet waits at the head of its partition's queue, and every
/// later record of that partition waits behind it, whatever its key: order
/// within a partition is what lets one offset stand for everything before
/// it. So one slow cause delays its whole partition, not only its own key.
/// For latency this means: a hold lasts as long as its cause takes to
/// arrive (the cause's producer, its commit interval and this consumer's
/// lag on the cause topic), and it adds that delay to every record queued
/// behind it. More partitions spread unrelated keys over more queues; the
/// hold diagnostics ([`TestDriver::held`](crate::TestDriver::held)) show the
/// queue depth behind each head.
///
/// # Ticks
///
/// Ticks fall due on a fixed grid of the interval (multiples of it since
/// the epoch) and are emitted when the host next tells the task the time,
/// so a late punctuation does not shift the grid. When the clock jumps over
/// several grid points (a paused process, a test advancing by an hour), the
/// task emits one tick, not one per missed point: tick logic should read
/// the tick's timestamp rather than count ticks to measure time.
pub struct StageBuilder<M = Stateless> {
    name: String,
    sources: Vec<SourceDecl>,
    sinks: Vec<AnyTopic>,
    compact_clock_sinks: BTreeSet<String>,
    ticks: Vec<TickDecl>,
    hold_warning_after: Option<Duration>,
    corrupt_headers_dead_letter: Option<String>,
    errors: Vec<StageError>,
    mode: M,
}

impl<M> fmt::Debug for StageBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn decode_part<T>(
    codec: &Codec<T>,
    bytes: Option<Vec<u8>>,
    part: Part,
) -> Result<Option<T>, Failure>
where
    T: 'static,
{
    match bytes {
        Some(b) => codec
            .decode_owned(b)
            .map(Some)
            .map_err(|source| Failure::Decode { part, source }),
        None => Ok(None),
    }
}

fn decode_message<K: Payload, V: Payload>(
    topic: &Topic<K, V>,
    input: RawInput<'_>,
) -> Result<Message<K, V>, Failure> {
    let key = decode_part(topic.key_codec(), input.key, Part::Key)?;
    let value = decode_part(topic.value_codec(), input.value, Part::Value)?;
    Ok(Message::from_parts(
        key,
        value,
        input.topic.clone(),
        input.partition,
        input.offset,
        input.timestamp,
        input.headers,
    ))
}

fn resolve_state<S>(
    codec: &Codec<S>,
    init: &(dyn Fn() -> S + Send + Sync),
    bytes: Option<&[u8]>,
) -> Result<S, Failure>
where
    S: 'static,
{
    match bytes {
        Some(b) => codec.decode(b).map_err(Failure::StateDecode),
        None => Ok(init()),
    }
}

fn step_outcome<S: 'static>(codec: &Codec<S>, step: Step<S>) -> Result<Outcome, Failure> {
    let (next, emissions) = step.into_step_parts();
    let write = match next {
        Next::Keep => StateWrite::Keep,
        Next::Delete => StateWrite::Delete,
        Next::Set(s) => StateWrite::Put(codec.encode_record(&s).map_err(Failure::StateEncode)?),
    };
    Ok(Outcome { write, emissions })
}

impl<M: StateMode> StageBuilder<M> {
    /// Adds `topic` as a source, handled by `handler`: a function from the
    /// delivered message to its emissions, returning any
    /// [`HandlerOutput`]: `Vec<Emission>`, one `Emission`, an
    /// `Option<Emission>`, [`Emissions`], or one of them in a
    /// `Result<_, E>`. On a stateful
    /// stage a handler leaves the state untouched.
    pub fn on<K, V, F, R>(self, topic: &Topic<K, V>, handler: F) -> Self
    where
        K: Payload,
        V: Payload,
        F: Fn(&Message<K, V>) -> R + Send + Sync + 'static,
        R: HandlerOutput,
    {
        self.on_owned(topic, move |m: Message<K, V>| handler(&m))
    }

    /// [`on`](Self::on) with a handler that takes the message by value, so
    /// it can move the key and the value into what it emits
    /// ([`Message::into_key_value`]) instead of cloning them: the message is the delivered record's own
    /// copy, and nothing else reads it after the handler.
    ///
    /// ```
    /// use parsley::{Codec, Parsley, Stage, TestDriver, Topic};
    /// let orders: Topic<String, String> = Topic::new("orders", Codec::utf8(), Codec::utf8());
    /// let audit: Topic<String, String> = Topic::new("audit", Codec::utf8(), Codec::utf8());
    /// let mut builder = Stage::named("audit");
    /// let out = builder.add_sink(&audit);
    /// let stage = builder
    ///     .on_owned(&orders, move |m| {
    ///         let (key, value) = m.into_key_value();
    ///         out.send(key, value)
    ///     })
    ///     .build()?;
    /// let mut driver = TestDriver::new(&Parsley::named("shop", [stage])?)?;
    /// driver.pipe(&orders, "o-1", "two pears")?;
    /// let audited = driver.key_values(&audit)?;
    /// assert_eq!(audited, vec![(Some("o-1".to_string()), Some("two pears".to_string()))]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_owned<K, V, F, R>(mut self, topic: &Topic<K, V>, handler: F) -> Self
    where
        K: Payload,
        V: Payload,
        F: Fn(Message<K, V>) -> R + Send + Sync + 'static,
        R: HandlerOutput,
    {
        let t = topic.clone();
        let logic: SourceLogic = Arc::new(move |input, _state| {
            let m = decode_message(&t, input)?;
            let emissions = handler(m).into_emissions().map_err(Failure::Logic)?;
            Ok(Outcome {
                write: StateWrite::Keep,
                emissions,
            })
        });
        self.add_source(erase(topic), logic, false);
        self
    }

    /// [`on`](Self::on) with a fallible handler whose `Err` becomes the
    /// emissions `recover` returns for it (see [`recovering`]): the closures'
    /// argument types come from `topic`, so they need no annotations.
    ///
    /// ```
    /// use parsley::{Codec, Stage, Topic};
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let shipments: Topic<String, i64> = Topic::new("shipments", Codec::utf8(), Codec::int64());
    /// let rejects: Topic<String, String> = Topic::new("rejects", Codec::utf8(), Codec::utf8());
    /// let mut builder = Stage::named("ship");
    /// let (ship, reject) = (builder.add_sink(&shipments), builder.add_sink(&rejects));
    /// let stage = builder
    ///     .on_recovering(
    ///         &orders,
    ///         move |m| match m.value() {
    ///             Some(&qty) if qty > 0 => Ok(vec![ship.send(m.key().cloned(), qty)]),
    ///             _ => Err("quantity must be positive".to_string()),
    ///         },
    ///         move |m, e| vec![reject.send(m.key().cloned(), e.clone()).dead_letter(m, e)],
    ///     )
    ///     .build()?;
    /// # Ok::<(), parsley::StageError>(())
    /// ```
    ///
    /// [`recovering`]: crate::recovering
    pub fn on_recovering<K, V, E, F, R>(self, topic: &Topic<K, V>, handler: F, recover: R) -> Self
    where
        K: Payload,
        V: Payload,
        E: 'static,
        F: Fn(&Message<K, V>) -> Result<Vec<Emission>, E> + Send + Sync + 'static,
        R: Fn(&Message<K, V>, &E) -> Vec<Emission> + Send + Sync + 'static,
    {
        self.on(topic, crate::logic::recovering(handler, recover))
    }

    /// Declares ticks with a tick handler: every `interval` of wall-clock
    /// time, each task of the stage emits a tick to the stage's tick topic,
    /// consumes it back through the gate, and calls `handler` with it. A
    /// clock that jumps over several intervals gives one tick (see
    /// [Ticks](StageBuilder#ticks)).
    pub fn ticks<F, R>(mut self, interval: Duration, handler: F) -> Self
    where
        F: Fn(&Tick) -> R + Send + Sync + 'static,
        R: HandlerOutput,
    {
        let logic: TickLogic = Arc::new(move |tick, _state, _keyed| {
            let emissions = handler(tick).into_emissions().map_err(Failure::Logic)?;
            Ok(Outcome {
                write: StateWrite::Keep,
                emissions,
            })
        });
        self.ticks.push(TickDecl {
            interval,
            logic,
            uses_state: false,
        });
        self
    }

    /// Declares `topic` as a sink and returns the [`Sink`] handle the
    /// stage's logic emits through: the handle exists only for a declared
    /// sink, and it is `Copy`, so every `move` closure takes its own.
    ///
    /// ```
    /// use parsley::{Codec, Message, Stage, Step, Topic};
    /// let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
    /// let balances: Topic<String, i64> = Topic::new("balances", Codec::utf8(), Codec::int64());
    /// let mut builder = Stage::named("balances").state(Codec::int64(), || 0);
    /// let out = builder.add_sink(&balances);
    /// let stage = builder
    ///     .fold(&payments, move |balance, m| {
    ///         let next = balance + m.value().copied().unwrap_or(0);
    ///         Step::to(next).emit(out.send(m.key().cloned(), next))
    ///     })
    ///     .build()?;
    /// # Ok::<(), parsley::StageError>(())
    /// ```
    pub fn add_sink<K: Payload, V: Payload>(&mut self, topic: &Topic<K, V>) -> Sink<K, V> {
        self.declare_sink(topic);
        Sink::of(topic)
    }

    /// Declares `topic` as a sink the stage's logic may emit to with
    /// [`Topic::send`]. An emission to any other topic fails the task at
    /// the stamping site. Prefer [`add_sink`](Self::add_sink), whose handle
    /// cannot name an undeclared sink.
    pub fn sink<K: Payload, V: Payload>(mut self, topic: &Topic<K, V>) -> Self {
        self.declare_sink(topic);
        self
    }

    /// Writes the `vc` of the stage's outputs to `topic` in the compact
    /// version 2 of the clock: each topic once, partitions and offsets as
    /// varint differences (about a seventh of version 1 at 100 sink
    /// partitions; see the guide's wire-format page). `topic` must also be
    /// declared as a sink ([`sink`](Self::sink) or
    /// [`add_sink`](Self::add_sink)), or [`build`](Self::build) refuses
    /// the stage ([`StageError::CompactClockNotASink`]). Every stage of
    /// this library reads version 2; the Java library reads only version
    /// 1, so leave a topic a Java stage consumes at the default.
    ///
    /// ```
    /// use parsley::{Codec, Message, Stage, Topic};
    /// let orders: Topic<String, String> = Topic::new("orders", Codec::utf8(), Codec::utf8());
    /// let wide: Topic<String, String> = Topic::new("wide", Codec::utf8(), Codec::utf8());
    /// let out = wide.clone();
    /// let stage = Stage::named("fan-out")
    ///     .on(&orders, move |m: &Message<String, String>| {
    ///         vec![out.send(m.key().cloned(), m.value().cloned())]
    ///     })
    ///     .sink(&wide)
    ///     .compact_clock(&wide)
    ///     .build()?;
    /// assert!(stage.writes_compact_clock("wide"));
    /// assert!(!stage.writes_compact_clock("orders"));
    /// # Ok::<(), parsley::StageError>(())
    /// ```
    pub fn compact_clock<K: Payload, V: Payload>(mut self, topic: &Topic<K, V>) -> Self {
        self.compact_clock_sinks.insert(topic.name().to_owned());
        self
    }

    fn declare_sink<K: Payload, V: Payload>(&mut self, topic: &Topic<K, V>) {
        let t = erase(topic);
        match self.sinks.iter().find(|s| s.name() == t.name()) {
            Some(existing) => {
                if existing.key_type().0 != t.key_type().0
                    || existing.value_type().0 != t.value_type().0
                {
                    self.errors.push(StageError::ConflictingSink {
                        stage: self.name.clone(),
                        topic: t.name().to_owned(),
                    });
                }
            }
            None => self.sinks.push(t),
        }
    }

    /// How long a record may gate its channel before the stage logs a
    /// `vc-hold-*` warning (once per hold). Default 30 seconds;
    /// `Duration::ZERO` disables the warning.
    pub fn hold_warning_after(mut self, after: Duration) -> Self {
        self.hold_warning_after = if after.is_zero() { None } else { Some(after) };
        self
    }

    /// Steps past a record whose causal headers (`vc`, `vc-sender`,
    /// `vc-seq`) are corrupt instead of failing the task: the record goes,
    /// bytes and headers unchanged, to the dead-letter topic `topic`, with
    /// `parsley.dlq.error`, `parsley.dlq.topic`, `parsley.dlq.partition`
    /// and `parsley.dlq.offset` headers saying why and where it came from;
    /// the stage logs a WARN naming the coordinate, counts it, and goes on
    /// as if the record had never been written (a claim on its offset is
    /// met once the channel passes it). The step is recorded in the
    /// protocol store with the transaction, so a restore steps past it
    /// again.
    ///
    /// Off by default: a corrupt clock fails the task, since nothing can
    /// say what the record depended on. Opting in trades that record's
    /// causal order (it is never delivered) for the channel's progress.
    /// The topic must exist; it is not a sink (nothing is stamped there).
    pub fn dead_letter_corrupt_headers(mut self, topic: impl Into<String>) -> Self {
        self.corrupt_headers_dead_letter = Some(topic.into());
        self
    }

    /// Validates the stage and freezes it.
    pub fn build(self) -> Result<Stage, StageError> {
        if let Some(reason) = name_problem(&self.name) {
            return Err(StageError::InvalidName {
                name: self.name,
                reason,
            });
        }
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        if let Some((topic, codec)) = self
            .sources
            .iter()
            .map(|s| &s.topic)
            .chain(&self.sinks)
            .find_map(|t| t.refused_key_codec().map(|c| (t.name(), c)))
        {
            return Err(StageError::RegistryFramedKey {
                stage: self.name.clone(),
                topic: topic.to_owned(),
                codec: codec.to_owned(),
            });
        }
        let stateful: Vec<(String, crate::partition::Partitioner)> = self
            .sources
            .iter()
            .filter(|s| s.uses_state)
            .map(|s| (s.topic.name().to_owned(), s.topic.partitioner()))
            .collect();
        if stateful.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(StageError::PartitionersDiffer {
                stage: self.name.clone(),
                topics: stateful,
            });
        }
        let mut seen = BTreeSet::new();
        for s in &self.sources {
            let topic = s.topic.name();
            if let Some(reason) = name_problem(topic) {
                return Err(StageError::InvalidTopicName {
                    stage: self.name,
                    topic: topic.to_owned(),
                    reason,
                });
            }
            if !seen.insert(topic.to_owned()) {
                return Err(StageError::DuplicateSource {
                    stage: self.name,
                    topic: topic.to_owned(),
                });
            }
        }
        for s in &self.sinks {
            if let Some(reason) = name_problem(s.name()) {
                return Err(StageError::InvalidTopicName {
                    stage: self.name,
                    topic: s.name().to_owned(),
                    reason,
                });
            }
        }
        if let Some(topic) = &self.corrupt_headers_dead_letter
            && let Some(reason) = name_problem(topic)
        {
            return Err(StageError::InvalidTopicName {
                stage: self.name,
                topic: topic.clone(),
                reason,
            });
        }
        if self.ticks.len() > 1 {
            return Err(StageError::DuplicateTicks { stage: self.name });
        }
        if self.ticks.iter().any(|t| t.interval.is_zero()) {
            return Err(StageError::ZeroTickInterval { stage: self.name });
        }
        if self.sources.is_empty() && self.ticks.is_empty() {
            return Err(StageError::NoSources { stage: self.name });
        }
        if let Some(topic) = self
            .compact_clock_sinks
            .iter()
            .find(|t| !self.sinks.iter().any(|s| s.name() == t.as_str()))
        {
            return Err(StageError::CompactClockNotASink {
                stage: self.name,
                topic: topic.clone(),
            });
        }
        let mut sinks = self.sinks;
        sinks.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(Stage {
            def: Arc::new(StageDef {
                name: self.name,
                state: self.mode.state_decl().map(|h| h.0),
                sources: self.sources,
                sinks,
                compact_clock_sinks: self.compact_clock_sinks,
                ticks: self.ticks.into_iter().next(),
                hold_warning_after: self.hold_warning_after,
                corrupt_headers_dead_letter: self.corrupt_headers_dead_letter,
            }),
        })
    }

    fn add_source(&mut self, topic: AnyTopic, logic: SourceLogic, uses_state: bool) {
        self.sources.push(SourceDecl {
            topic,
            logic,
            uses_state,
        });
    }
}

/// Implemented by nothing: the bound that makes `.fold(..)` and
/// `.tick_fold(..)` on a builder without state fail to compile with a message
/// that says what to do ("`.fold(..)` and `.tick_fold(..)` need per-key
/// state: call `.state(codec, initial)` before them").
///
/// ```compile_fail,E0277
/// use parsley::{Codec, Stage, Step, Topic};
/// let t: Topic<String, i64> = Topic::new("t", Codec::utf8(), Codec::int64());
/// let s = Stage::named("s").fold(&t, |n: i64, _m| Step::to(n + 1));
/// ```
///
/// With the state declared first, it compiles:
///
/// ```
/// use parsley::{Codec, Stage, Step, Topic};
/// let t: Topic<String, i64> = Topic::new("t", Codec::utf8(), Codec::int64());
/// let s = Stage::named("s").state(Codec::int64(), || 0).fold(&t, |n, _m| Step::to(n + 1));
/// ```
///
/// A handler returning anything but emissions is refused with a message
/// naming what it may return:
///
/// ```compile_fail,E0277
/// use parsley::{Codec, Stage, Topic};
/// let t: Topic<String, i64> = Topic::new("t", Codec::utf8(), Codec::int64());
/// let s = Stage::named("s").on(&t, |m| m.value().copied());
/// ```
#[diagnostic::on_unimplemented(
    message = "`.fold(..)` and `.tick_fold(..)` need per-key state: call `.state(codec, initial)` before them",
    label = "this fold is given to a stage builder that has no state yet",
    note = "for example: Stage::named(\"counts\").state(Codec::int64(), || 0).fold(&topic, |n, _m| Step::to(n + 1))"
)]
pub trait StateDeclaredFirst {}

impl StageBuilder<Stateless> {
    #[doc(hidden)]
    /// Not callable: see [`StateDeclaredFirst`].
    pub fn fold<K, V, F>(self, _topic: &Topic<K, V>, _fold: F) -> Self
    where
        F: StateDeclaredFirst,
    {
        self
    }

    #[doc(hidden)]
    /// Not callable: see [`StateDeclaredFirst`].
    pub fn tick_fold<F>(self, _interval: Duration, _fold: F) -> Self
    where
        F: StateDeclaredFirst,
    {
        self
    }

    /// Declares per-key state: its codec and the initial value an unseen key
    /// starts from. State is keyed by the message key's encoded bytes and
    /// scoped to the stage; a reserved slot beside the keys holds the tick
    /// state.
    pub fn state<S: 'static>(
        self,
        codec: Codec<S>,
        initial: impl Fn() -> S + Send + Sync + 'static,
    ) -> StageBuilder<Stateful<S>> {
        StageBuilder {
            name: self.name,
            sources: self.sources,
            sinks: self.sinks,
            compact_clock_sinks: self.compact_clock_sinks,
            ticks: self.ticks,
            hold_warning_after: self.hold_warning_after,
            corrupt_headers_dead_letter: self.corrupt_headers_dead_letter,
            errors: self.errors,
            mode: Stateful {
                codec,
                init: Arc::new(initial),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> Topic<String, String> {
        Topic::new(name, Codec::utf8(), Codec::utf8())
    }

    #[test]
    fn names_are_checked() {
        assert!(name_problem("ok.name_-1").is_none());
        assert!(name_problem("").is_some());
        assert!(name_problem("..").is_some());
        assert!(name_problem("a b").is_some());
        assert!(name_problem(&"x".repeat(250)).is_some());
        let e = Stage::named("bad name")
            .on(&topic("a"), |_m: &Message<String, String>| vec![])
            .build()
            .unwrap_err();
        assert!(matches!(e, StageError::InvalidName { .. }), "{e}");
    }

    #[test]
    fn duplicate_sources_and_ticks_are_rejected() {
        let a = topic("a");
        let e = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .on(&a, |_m: &Message<String, String>| vec![])
            .build()
            .unwrap_err();
        assert_eq!(
            e,
            StageError::DuplicateSource {
                stage: "s".into(),
                topic: "a".into()
            }
        );
        let e = Stage::named("s")
            .ticks(Duration::from_secs(1), |_t: &Tick| vec![])
            .ticks(Duration::from_secs(2), |_t: &Tick| vec![])
            .build()
            .unwrap_err();
        assert!(matches!(e, StageError::DuplicateTicks { .. }));
        let e = Stage::named("s")
            .ticks(Duration::ZERO, |_t: &Tick| vec![])
            .build()
            .unwrap_err();
        assert!(matches!(e, StageError::ZeroTickInterval { .. }));
        let e = Stage::named("s").build().unwrap_err();
        assert!(matches!(e, StageError::NoSources { .. }));
    }

    #[test]
    fn conflicting_sinks_are_rejected() {
        let a = topic("a");
        let b: Topic<String, i64> = Topic::new("b", Codec::utf8(), Codec::int64());
        let b2: Topic<String, String> = topic("b");
        let e = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .sink(&b)
            .sink(&b2)
            .build()
            .unwrap_err();
        assert!(matches!(e, StageError::ConflictingSink { .. }));
        // The same topic twice is fine.
        let s = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .sink(&b)
            .sink(&b)
            .build()
            .unwrap();
        assert_eq!(s.sink_topics(), vec!["b"]);
    }

    #[test]
    fn a_registry_framed_key_is_refused_on_sources_and_sinks_unless_accepted() {
        let a = topic("a");
        let framed = || Codec::bytes().registry_framed().named("avro-key");
        let sink: Topic<Vec<u8>, String> = Topic::new("out", framed(), Codec::utf8());
        let e = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .sink(&sink)
            .build()
            .unwrap_err();
        assert_eq!(
            e,
            StageError::RegistryFramedKey {
                stage: "s".into(),
                topic: "out".into(),
                codec: "avro-key".into(),
            }
        );
        assert!(e.to_string().contains("Topic::allow_registry_framed_key"));
        // The value side may be framed; so may an accepted key.
        let framed_value: Topic<String, Vec<u8>> =
            Topic::new("v", Codec::utf8(), Codec::bytes().registry_framed());
        Stage::named("s")
            .on(&framed_value, |_m: &Message<String, Vec<u8>>| vec![])
            .sink(&sink.clone().allow_registry_framed_key())
            .build()
            .unwrap();
        // Accepting on one Topic value does not accept on the others.
        assert!(
            Stage::named("s")
                .on(&a, |_m: &Message<String, String>| vec![])
                .sink(&sink)
                .build()
                .is_err()
        );
    }

    #[test]
    fn hold_warning_default_and_disable() {
        let a = topic("a");
        let s = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .build()
            .unwrap();
        assert_eq!(s.hold_warning_after(), Some(DEFAULT_HOLD_WARNING_AFTER));
        let s = Stage::named("s")
            .on(&a, |_m: &Message<String, String>| vec![])
            .hold_warning_after(Duration::ZERO)
            .build()
            .unwrap();
        assert_eq!(s.hold_warning_after(), None);
    }
}
