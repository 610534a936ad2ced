//! Test-time contract probes: the mechanically checkable clauses of the
//! contract, run against your application's own topology in a
//! [`TestDriver`], with samples you supply.
//!
//! ```
//! use parsley::{probe, Codec, Message, Parsley, Samples, Stage, Topic};
//! let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
//! let totals: Topic<String, i64> = Topic::new("totals", Codec::utf8(), Codec::int64());
//! let out = totals.clone();
//! let stage = Stage::named("double")
//!     .on(&orders, move |m: &Message<String, i64>| {
//!         vec![out.send(m.key().cloned(), m.value().map(|v| v * 2))]
//!     })
//!     .sink(&totals)
//!     .build()?;
//! let app = Parsley::named("shop", [stage])?;
//! let report = probe(&app, &Samples::new().on(&orders, "o-1", 21));
//! report.assert_ok();
//! assert!(report.findings.is_empty());
//! // Notes are not failures: the store names this stage pins, for instance.
//! assert!(report.notes.iter().any(|n| n.text.contains("shop-double-state-changelog")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Probes see only the topology's own behaviour on the samples. They cannot
//! check that related keys co-partition across producers, that plain
//! producers outside the topology stamp, that logic is pure, or the causal
//! guarantee itself (the protocol's own verification covers that).

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use parsley_protocol::headers::CLOCK_HEADER;

use crate::app::Parsley;
use crate::driver::{DriverError, TestDriver};
use crate::runtime::host::{MetadataError, TopicMetadata};
use crate::runtime::task::{TaskError, causal_headers};
use crate::topic::{AnyTopic, IntoNullable, Payload, Topic, erase};

/// The probes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Probe {
    /// Key codecs are deterministic and canonical on the samples.
    KeyCodec,
    /// Every record a stage produced carries parseable `vc`, `vc-sender`
    /// and `vc-seq` headers.
    Stamps,
    /// Every record a stage produced decodes with its topic's own codecs.
    SinkDecode,
    /// No logic path emits to an undeclared sink.
    DeclaredSinks,
    /// Handlers and folds do not fail on the samples.
    Logic,
    /// Every sample names a topic some stage consumes.
    Samples,
    /// The topics of each stage share one partition count (given with
    /// [`Samples::partitions`], or read from the cluster by
    /// [`probe_cluster`]).
    CoPartitioning,
    /// Every declared source, sink and tick topic exists on the cluster
    /// ([`probe_cluster`]).
    TopicExists,
    /// A stage's tick topic has exactly as many partitions as its widest
    /// source ([`probe_cluster`]).
    TickTopic,
}

impl Probe {
    /// The probe's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Probe::KeyCodec => "key-codec",
            Probe::Stamps => "stamps",
            Probe::SinkDecode => "sink-decode",
            Probe::DeclaredSinks => "declared-sinks",
            Probe::Logic => "logic",
            Probe::Samples => "samples",
            Probe::CoPartitioning => "co-partitioning",
            Probe::TopicExists => "topic-exists",
            Probe::TickTopic => "tick-topic",
        }
    }

    /// The contract clause the probe checks, and the item whose
    /// documentation states it.
    pub fn clause(self) -> &'static str {
        match self {
            Probe::KeyCodec => {
                "key codecs are identity: encoded key bytes pick the partition and key the fold state, so they must be canonical and stable (parsley::codec)"
            }
            Probe::Stamps => {
                "every stage output carries the vc, vc-sender and vc-seq headers (parsley::protocol::headers)"
            }
            Probe::SinkDecode => {
                "a record decodes with its topic's own codecs, as the next hop will decode it (parsley::Codec)"
            }
            Probe::DeclaredSinks => {
                "emissions name declared sinks only (parsley::StageBuilder::sink)"
            }
            Probe::Logic => {
                "handlers and folds return emissions; an error or panic fails the task, so domain failures belong in emissions (parsley::recovering)"
            }
            Probe::Samples => {
                "each sample names a topic a stage of the application consumes, so the probe run exercises something (parsley::probe)"
            }
            Probe::CoPartitioning => {
                "a stage's source topics (and its tick topic) have the same partition count, so partition p of each meets in one task (parsley::TestDriverBuilder::partitions)"
            }
            Probe::TopicExists => {
                "every topic the application declares (sources, sinks, tick topics) exists before it starts; the runtime creates only its changelogs (parsley::Parsley::topics)"
            }
            Probe::TickTopic => {
                "a stage's tick topic has exactly as many partitions as its widest source, one per task (parsley::StageBuilder::ticks)"
            }
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A contract violation a probe observed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Finding {
    /// The probe.
    pub probe: Probe,
    /// The clause it checks.
    pub clause: &'static str,
    /// What it observed.
    pub observed: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} (clause: {})",
            self.probe, self.observed, self.clause
        )
    }
}

/// Kinds of notes: gaps rather than violations.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum NoteKind {
    /// A source topic had no sample; its logic went unexercised.
    UnsampledSource,
    /// A declared sink that no sample reached.
    UnreachedSink,
    /// A tick topic the deployment must create.
    TickTopic,
    /// The store names a stage pins (keep stage names and the application
    /// id stable).
    StoreNames,
}

/// A stated blind spot or a deployment reminder.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Note {
    /// The kind.
    pub kind: NoteKind,
    /// What to know.
    pub text: String,
}

/// Every finding and note of a probe run. Passed when there are no
/// findings; notes never fail a report.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ProbeReport {
    /// Violations.
    pub findings: Vec<Finding>,
    /// Gaps and reminders.
    pub notes: Vec<Note>,
}

/// A probe report with findings, as an error.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProbeFailure(pub ProbeReport);

impl ProbeReport {
    /// True when no probe found a violation.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    /// The findings of one probe.
    pub fn findings_of(&self, probe: Probe) -> Vec<&Finding> {
        self.findings.iter().filter(|f| f.probe == probe).collect()
    }

    /// `Ok` when passed; the whole report as the error otherwise.
    pub fn into_result(self) -> Result<ProbeReport, ProbeFailure> {
        if self.passed() {
            Ok(self)
        } else {
            Err(ProbeFailure(self))
        }
    }

    /// Panics with every finding at once unless the report passed. Meant
    /// for tests.
    #[track_caller]
    #[allow(clippy::panic)]
    pub fn assert_ok(&self) {
        if !self.passed() {
            panic!("contract probes failed:\n{self}");
        }
    }

    fn fail(&mut self, probe: Probe, observed: String) {
        let f = Finding {
            probe,
            clause: probe.clause(),
            observed,
        };
        if !self.findings.contains(&f) {
            self.findings.push(f);
        }
    }

    fn note(&mut self, kind: NoteKind, text: String) {
        let n = Note { kind, text };
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} finding(s), {} note(s)",
            self.findings.len(),
            self.notes.len()
        )?;
        for finding in &self.findings {
            writeln!(f, "  FAIL {finding}")?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {}", note.text)?;
        }
        Ok(())
    }
}

struct Sample {
    /// Samples of one group run in one driver, in order.
    group: usize,
    topic: AnyTopic,
    key: Result<Option<Vec<u8>>, String>,
    key_again: Result<Option<Vec<u8>>, String>,
    value: Result<Option<Vec<u8>>, String>,
}

/// Sample records for [`probe`]: at least one per source topic.
#[derive(Default)]
pub struct Samples {
    samples: Vec<Sample>,
    partitions: Vec<(String, i32)>,
}

impl fmt::Debug for Samples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.samples.iter().map(|s| s.topic.name()))
            .finish()
    }
}

impl Samples {
    /// No samples.
    pub fn new() -> Self {
        Samples::default()
    }

    /// Runs the probes with `topic` at `partitions` partitions (default 1),
    /// as on the cluster: the co-partitioning probe then checks each
    /// stage's topics agree.
    pub fn partitions(mut self, topic: impl AsRef<str>, partitions: i32) -> Self {
        self.partitions
            .push((topic.as_ref().to_owned(), partitions));
        self
    }

    /// Adds a sample record for `topic` (`None` for a null key or value).
    /// Each `on` runs in a driver of its own.
    pub fn on<K: Payload, V: Payload>(
        self,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Self {
        let group = self.samples.last().map_or(0, |s| s.group + 1);
        self.push(group, topic, key, value)
    }

    /// Adds a sample record that runs after the previous one in the same
    /// driver, so a sequence across sources (a profile, then an order that
    /// joins it) exercises the logic that needs both.
    ///
    /// ```
    /// use parsley::{probe, Codec, Parsley, Samples, Stage, Step, Topic};
    /// let customers: Topic<String, String> = Topic::new("customers", Codec::utf8(), Codec::utf8());
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let enriched: Topic<String, String> = Topic::new("enriched", Codec::utf8(), Codec::utf8());
    /// let mut builder = Stage::named("join").state(Codec::utf8(), String::new);
    /// let out = builder.add_sink(&enriched);
    /// let stage = builder
    ///     .fold(&customers, |_, m| Step::to(m.value().cloned().unwrap_or_default()))
    ///     .fold(&orders, move |name, m| match name.as_str() {
    ///         "" => Step::keep(),
    ///         _ => Step::keep().emit(out.send(m.key().cloned(), format!("{name}: {:?}", m.value()))),
    ///     })
    ///     .build()?;
    /// let app = Parsley::named("shop", [stage])?;
    /// let report = probe(&app, &Samples::new().on(&customers, "c-1", "Ann").then(&orders, "c-1", 12));
    /// report.assert_ok();
    /// // The join emitted, so its sink is not noted as unreached.
    /// assert!(report.notes.iter().all(|n| !n.text.contains("\"enriched\"")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn then<K: Payload, V: Payload>(
        self,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Self {
        let group = self.samples.last().map_or(0, |s| s.group);
        self.push(group, topic, key, value)
    }

    fn push<K: Payload, V: Payload>(
        mut self,
        group: usize,
        topic: &Topic<K, V>,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Self {
        let key = key.into_nullable();
        let enc = |k: &Option<K>| match k {
            Some(k) => topic
                .key_codec()
                .encode(k)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        };
        let value = match value.into_nullable() {
            Some(v) => topic
                .value_codec()
                .encode(&v)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        };
        self.samples.push(Sample {
            group,
            topic: erase(topic),
            key: enc(&key),
            key_again: enc(&key),
            value,
        });
        self
    }
}

impl Samples {
    fn driver(&self, app: &Parsley) -> Result<TestDriver, DriverError> {
        let mut builder = TestDriver::builder(app);
        for (topic, n) in &self.partitions {
            builder = builder.partitions(topic, *n);
        }
        builder.build()
    }
}

fn probe_of(error: &TaskError) -> Probe {
    match error {
        TaskError::UndeclaredSink { .. } => Probe::DeclaredSinks,
        TaskError::Decode { .. } | TaskError::Encode { .. } => Probe::SinkDecode,
        TaskError::CorruptHeaders { .. } => Probe::Stamps,
        TaskError::PartitionCounts { .. } => Probe::CoPartitioning,
        _ => Probe::Logic,
    }
}

/// Runs the application's own topology in a fresh [`TestDriver`] per
/// sample and reports every finding at once (see the [module
/// documentation](self)). Ticking stages tick: after each sample the wall
/// clock advances past the widest tick interval.
pub fn probe(app: &Parsley, samples: &Samples) -> ProbeReport {
    let mut report = ProbeReport::default();
    let widest_tick = app.stages().iter().filter_map(|s| s.tick_interval()).max();
    let mut sampled = BTreeSet::new();
    let mut reached = BTreeSet::new();
    // The topology itself first: a stage whose topics disagree on partition
    // count fails here, samples or not.
    if let Err(e) = samples.driver(app) {
        record_error(&mut report, &e);
        return report;
    }

    // Each group of samples (one `on` and the `then`s after it) runs in a
    // driver of its own, its records piped in order.
    let mut groups: Vec<Vec<&Sample>> = Vec::new();
    for s in &samples.samples {
        match groups.last_mut() {
            Some(g) if g.first().is_some_and(|f| f.group == s.group) => g.push(s),
            _ => groups.push(vec![s]),
        }
    }
    for group in groups {
        let mut records = Vec::new();
        for s in group {
            let topic = s.topic.name();
            check_key(&mut report, s);
            if app.consumer_of(topic).is_none() {
                report.fail(
                    Probe::Samples,
                    format!("a sample names {topic:?}, which no stage of the application consumes"),
                );
                continue;
            }
            sampled.insert(topic.to_owned());
            match (&s.key, &s.value) {
                (Ok(k), Ok(v)) => records.push((topic, k.clone(), v.clone())),
                (_, Err(e)) => report.fail(
                    Probe::Samples,
                    format!("the sample value for {topic:?} does not encode: {e}"),
                ),
                _ => {}
            }
        }
        if records.is_empty() {
            continue;
        }
        let mut driver = match samples.driver(app) {
            Ok(d) => d,
            Err(e) => {
                record_error(&mut report, &e);
                continue;
            }
        };
        let mut outcome = Ok(());
        for (topic, key, value) in records {
            let partitions = driver.partitions(topic).unwrap_or(1);
            let partition =
                app.topic_partitioner(topic)
                    .partition_for(key.as_deref(), 0, partitions);
            let now = driver.wall_clock();
            outcome = driver
                .append_raw(topic, partition, key, value, now, Vec::new())
                .and_then(|_| driver.run());
            if outcome.is_err() {
                break;
            }
        }
        let outcome = outcome.and_then(|()| match widest_tick {
            Some(interval) => driver.advance_wall_clock(interval + Duration::from_millis(1)),
            None => Ok(()),
        });
        if let Err(e) = &outcome {
            record_error(&mut report, e);
        }
        inspect_outputs(app, &driver, &mut report, &mut reached);
    }

    note_coverage(app, &sampled, &reached, &mut report);
    report
}

/// Notes what the samples left out (sources without a sample, sinks no
/// sample reached) and the topics and stores the operator creates.
fn note_coverage(
    app: &Parsley,
    sampled: &BTreeSet<String>,
    reached: &BTreeSet<String>,
    report: &mut ProbeReport,
) {
    for stage in app.stages() {
        for source in stage.source_topics() {
            if !sampled.contains(source) {
                report.note(
                    NoteKind::UnsampledSource,
                    format!(
                        "source {source:?} of stage {:?} has no sample; its logic went unexercised",
                        stage.name()
                    ),
                );
            }
        }
        for sink in stage.sink_topics() {
            if !reached.contains(sink) {
                report.note(
                    NoteKind::UnreachedSink,
                    format!(
                        "sink {sink:?} of stage {:?} was not reached by any sample",
                        stage.name()
                    ),
                );
            }
        }
        if let Some(names) = app.owned_names(stage.name()) {
            if let Some(tick_topic) = &names.tick_topic {
                report.note(
                    NoteKind::TickTopic,
                    format!(
                        "create tick topic {tick_topic:?} with exactly as many partitions as the widest source of stage {:?} ({})",
                        stage.name(),
                        stage.source_topics().join(", ")
                    ),
                );
            }
            note_store_names(report, stage.name(), names);
        }
    }
}

/// The cluster probes: read-only checks of a live cluster (through any
/// [`TopicMetadata`], such as `parsley_kafka::KafkaCluster`) against the
/// application, without starting it. Every finding at once, each naming
/// its clause:
///
/// * `topic-exists`: every declared source, sink and tick topic exists (a
///   lookup that fails is reported as such, never taken for absence);
/// * `co-partitioning`: each stage's sources agree on partition count;
/// * `tick-topic`: each tick topic has exactly the widest source's count.
///
/// Notes list the store names each stage pins. Run it from a deploy
/// pipeline: it checks what a start would refuse, before the start.
///
/// ```
/// use parsley::{probe_cluster, Codec, Parsley, Probe, Stage, Topic};
/// use parsley::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
/// use parsley::protocol::TopicId;
/// struct Cluster;
/// impl TopicMetadata for Cluster {
///     fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
///         match topic {
///             "orders" => Ok(TopicDescription { id: TopicId::from_u128(1), partitions: 4 }),
///             _ => Err(MetadataError::Missing(topic.to_owned())),
///         }
///     }
/// }
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let totals: Topic<String, i64> = Topic::new("totals", Codec::utf8(), Codec::int64());
/// let mut builder = Stage::named("sum");
/// let out = builder.add_sink(&totals);
/// let stage = builder.on(&orders, move |m| vec![out.send(m.key().cloned(), m.value().copied())]).build()?;
/// let report = probe_cluster(&Parsley::named("shop", [stage])?, &Cluster);
/// let missing = report.findings_of(Probe::TopicExists);
/// assert_eq!(missing.len(), 1);
/// assert!(missing[0].observed.contains("\"totals\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn probe_cluster(app: &Parsley, cluster: &dyn TopicMetadata) -> ProbeReport {
    let mut report = ProbeReport::default();
    for stage in app.stages() {
        let name = stage.name();
        let mut describe = |topic: &str, role: &str| match cluster.describe(topic) {
            Ok(d) => Some(d.partitions),
            Err(MetadataError::Missing(_)) => {
                report.fail(
                    Probe::TopicExists,
                    format!("topic {topic:?} ({role} of stage {name:?}) does not exist"),
                );
                None
            }
            Err(e) => {
                report.fail(
                    Probe::TopicExists,
                    format!("topic {topic:?} ({role} of stage {name:?}) could not be checked: {e}"),
                );
                None
            }
        };
        let sources: Vec<(String, i32)> = stage
            .source_topics()
            .into_iter()
            .filter_map(|t| describe(t, "source").map(|n| (t.to_owned(), n)))
            .collect();
        for t in stage.sink_topics() {
            describe(t, "sink");
        }
        let tick = app
            .tick_topic(name)
            .and_then(|t| describe(t, "tick topic").map(|n| (t.to_owned(), n)));
        if sources.iter().any(|(_, n)| *n != sources[0].1) {
            let counts: Vec<String> = sources
                .iter()
                .map(|(t, n)| format!("{t:?} has {n}"))
                .collect();
            report.fail(
                Probe::CoPartitioning,
                format!(
                    "the sources of stage {name:?} disagree on partition count: {}",
                    counts.join(", ")
                ),
            );
        }
        if let (Some((t, n)), Some(widest)) = (&tick, sources.iter().map(|(_, n)| *n).max())
            && *n != widest
        {
            report.fail(
                Probe::TickTopic,
                format!("tick topic {t:?} of stage {name:?} has {n} partition(s); its widest source has {widest}"),
            );
        }
        if let Some(names) = app.owned_names(name) {
            note_store_names(&mut report, name, names);
        }
    }
    report
}

/// The note naming the stores a stage pins.
fn note_store_names(report: &mut ProbeReport, stage: &str, names: &crate::OwnedNames) {
    let mut pinned = vec![names.state_store.clone(), names.state_changelog.clone()];
    pinned.extend(names.fold_store.clone());
    pinned.extend(names.fold_changelog.clone());
    report.note(
        NoteKind::StoreNames,
        format!(
            "stage {stage:?} pins {}; keep the stage name and the application id stable across deployments",
            pinned.join(", ")
        ),
    );
}

/// key-codec: deterministic and canonical on the sample.
fn check_key(report: &mut ProbeReport, s: &Sample) {
    let topic = s.topic.name();
    match (&s.key, &s.key_again) {
        (Err(e), _) => report.fail(
            Probe::KeyCodec,
            format!("the sample key for {topic:?} does not encode: {e}"),
        ),
        (Ok(a), Ok(b)) if a != b => report.fail(
            Probe::KeyCodec,
            format!("encoding the same key for {topic:?} twice gave different bytes"),
        ),
        (Ok(Some(bytes)), _) => match s.topic.reencode_key(bytes) {
            Ok(again) if &again != bytes => report.fail(
                Probe::KeyCodec,
                format!("a key of {topic:?} does not survive decode-then-encode unchanged"),
            ),
            Err(e) => report.fail(
                Probe::KeyCodec,
                format!("the key codec of {topic:?} cannot decode its own output: {e}"),
            ),
            Ok(_) => {}
        },
        _ => {}
    }
}

fn record_error(report: &mut ProbeReport, error: &DriverError) {
    match error {
        DriverError::Task(e) => report.fail(probe_of(e), e.to_string()),
        DriverError::PartitionCount { .. } => report.fail(Probe::CoPartitioning, error.to_string()),
        other => report.fail(Probe::Logic, other.to_string()),
    }
}

fn inspect_outputs(
    app: &Parsley,
    driver: &TestDriver,
    report: &mut ProbeReport,
    reached: &mut BTreeSet<String>,
) {
    for name in app.topics() {
        let Ok(records) = driver.raw_records(name) else {
            continue;
        };
        let typed = app.def.topics.get(name).and_then(|u| u.topic.clone());
        for r in records.iter().filter(|r| r.producer.is_some()) {
            reached.insert(name.to_owned());
            let causal = causal_headers(&r.headers);
            let has_vc = r.headers.iter().any(|h| h.name == CLOCK_HEADER);
            match causal {
                Err(e) => report.fail(
                    Probe::Stamps,
                    format!(
                        "output {} has unparseable causal headers: {e}",
                        r.coordinate
                    ),
                ),
                Ok(c) if c.sender.is_none() || !has_vc => report.fail(
                    Probe::Stamps,
                    format!(
                        "output {} lacks a vc, vc-sender or vc-seq header",
                        r.coordinate
                    ),
                ),
                Ok(_) => {}
            }
            if let Some(t) = &typed
                && let Err((part, e)) = t.check_decodes(r.key.as_deref(), r.value.as_deref())
            {
                report.fail(
                    Probe::SinkDecode,
                    format!(
                        "the {part} of output {} does not decode with {name:?}'s codecs: {e}",
                        r.coordinate
                    ),
                );
            }
        }
    }
}
