//! `parsley reset`: makes a stopped application reprocess its inputs, the
//! job Kafka Streams' application reset tool does, rewritten for what a
//! causal stage keeps.
//!
//! For every stage and task it:
//!
//! - positions the consumer group on each source partition: at the log
//!   start, at the first offset at or after a time, or at an offset, as
//!   the operator asks. Topics the application itself writes (a source of
//!   one stage that is the sink of another) and tick topics go to their
//!   end instead: what the application wrote before is not read again,
//!   and the reprocessing writes it anew;
//! - rewrites the task's protocol state through its state changelog
//!   ([`parsley::runtime::changelog::reset_records`]): the send sequences
//!   and the delivered past are kept, so receivers that keep running stay
//!   causally ordered, and the rest is deleted; for a position above the
//!   log start, the records below it are read for their senders' sequences
//!   first;
//! - empties the task's fold state (a tombstone for every key in its
//!   changelog);
//! - deletes the records of the control topic (old shutdown requests).
//!
//! Nothing is deleted outright: the changelogs are compacted topics, and
//! appending keeps the topic ids that local state files are checked
//! against. A local state file needs no wiping (at its next start it
//! replays the reset records from its checkpoint like any other records);
//! `--wipe-state-dir` removes this host's copy anyway.
//!
//! It refuses while any instance runs (the check `parsley skip` makes: the
//! group's coordinator lists no member, under either group protocol, and no
//! stream thread reported recently), asks again right before its first
//! write, prints its plan and changes nothing without `--execute`, and is
//! idempotent: a run interrupted half way is finished by running it again,
//! and a second run after a complete one writes nothing.
//!
//! Its first write marks every group position it will move (the commit's
//! metadata, [`RESET_IN_PROGRESS`]); its last commits the new positions,
//! which clears the mark. An instance started while the mark stands (the
//! reset was interrupted) refuses to run, and says to run the reset again.

use crate::connect::Connection;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_executor::block_on;
use parsley::protocol::Channel;
use parsley::protocol::host::RESET_IN_PROGRESS;
use parsley::protocol::reset::ResetPoint;
use parsley::runtime::changelog::{ChangelogRecord, fold_reset_records, reset_records};
use parsley::runtime::host::{ChangelogReader, MetadataError, TopicMetadata};
use parsley::{TaskId, Topology};
use parsley_kafka::KafkaCluster;
use rdkafka::admin::AdminOptions;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Where the sources are read again from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetTo {
    /// Each partition's log start.
    Earliest,
    /// The first offset whose timestamp is at or after this time
    /// (milliseconds since the epoch); the end when there is none.
    Time(i64),
    /// This offset on every source partition, held between the log start
    /// and the end.
    Offset(i64),
}

impl std::fmt::Display for ResetTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetTo::Earliest => f.write_str("the log start"),
            ResetTo::Time(ms) => write!(f, "the first record at or after {ms} ms"),
            ResetTo::Offset(o) => write!(f, "offset {o}"),
        }
    }
}

/// A time for `--to-time`: RFC 3339 (`2026-12-01T00:00:00Z`) or
/// milliseconds since the epoch.
pub fn parse_time(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            format!("{text:?} is not a time: give RFC 3339 (2026-12-01T00:00:00Z) or milliseconds since the epoch ({e})")
        })?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("{text:?} is out of range"))
}

/// One reset to plan, and to apply with `execute`.
#[derive(Clone, Debug)]
pub struct Reset {
    /// Bootstrap servers.
    pub cluster: Connection,
    /// The application, as `parsley_kafka::topology` describes it.
    pub topology: Topology,
    /// Where the sources are read again from.
    pub to: ResetTo,
    /// Apply the plan; without it nothing changes.
    pub execute: bool,
    /// A state directory (the root given as `StreamsOptions::state_dir`)
    /// whose copy of the application's local state to remove.
    pub wipe_state_dir: Option<PathBuf>,
}

/// A consumer position the reset commits.
#[derive(Clone, Debug)]
struct Position {
    topic: String,
    partition: i32,
    committed: Option<i64>,
    to: i64,
    /// Why the position is the partition's end rather than the operator's
    /// choice, if it is.
    at_end: Option<&'static str>,
    /// Records read below `to` for their senders' sequences.
    scanned: u64,
}

/// Records the reset appends to one changelog partition.
#[derive(Clone, Debug)]
struct Writes {
    topic: String,
    partition: i32,
    records: Vec<ChangelogRecord>,
}

/// What a reset changes.
#[derive(Clone, Debug, Default)]
struct Plan {
    positions: Vec<Position>,
    state: Vec<Writes>,
    fold: Vec<Writes>,
    /// Stages whose state changelog does not exist (they never ran), with
    /// that changelog.
    absent: Vec<(String, String)>,
    /// The control topic, with its partitions that hold records to delete.
    control: Option<(String, Vec<Span>)>,
}

/// A partition's records: its number, log start and end.
type Span = (i32, i64, i64);

/// Why a reset refuses a running application.
const RUNNING: &str = "a running instance would go on from where it is, and overwrite the reset";

/// Plans the reset and, with `execute`, applies it; returns what to print.
pub fn run(r: &Reset) -> Result<String, String> {
    let app = r.topology.application_id.as_str();
    let config = r.cluster.client_config();
    let cluster = KafkaCluster::new(&config, TIMEOUT)
        .map_err(|e| format!("cannot reach {}: {e}", r.cluster.bootstrap))?;
    let mut group = config.clone();
    group
        .set("group.id", app)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = group
        .create()
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    crate::stopped::ensure_stopped(&cluster, &r.cluster, app, RUNNING)?;
    let plan = plan(r, &cluster, &consumer)?;
    let mut out = render(r, &plan);
    if !r.execute {
        out.push_str("\nNothing was changed. Run the same command with --execute to apply it.");
        return Ok(out);
    }
    apply(r, &plan, &config, &cluster, &consumer)?;
    out.push_str("\nDone: the application reprocesses from these positions when it starts.");
    Ok(out)
}

fn plan(r: &Reset, cluster: &KafkaCluster, consumer: &BaseConsumer) -> Result<Plan, String> {
    let t = &r.topology;
    let mut plan = Plan::default();
    // Topics the application writes: read again only from their end.
    let written: Vec<&str> = t
        .stages
        .iter()
        .flat_map(|s| s.sinks.iter().map(|k| k.topic.topic.as_str()))
        .collect();
    for stage in &t.stages {
        let points = plan_positions(r, stage, &written, cluster, consumer, &mut plan)?;
        plan_changelogs(stage, &points, cluster, &mut plan)?;
    }
    plan.control = plan_control(t, cluster, consumer)?;
    Ok(plan)
}

/// Where each input of `stage` goes (its positions join the plan), and
/// the skip marks each task's reset writes, by partition.
fn plan_positions(
    r: &Reset,
    stage: &parsley::describe::StageTopology,
    written: &[&str],
    cluster: &KafkaCluster,
    consumer: &BaseConsumer,
    plan: &mut Plan,
) -> Result<BTreeMap<i32, BTreeMap<Channel, ResetPoint>>, String> {
    // Each input, with why it goes to its end instead, if it does.
    let mut inputs: Vec<(&str, Option<&'static str>)> = stage
        .sources
        .iter()
        .map(|s| {
            let own = written.contains(&s.topic.as_str());
            let why = own.then_some("its end: the application writes this topic");
            (s.topic.as_str(), why)
        })
        .collect();
    if let Some(ticks) = &stage.ticks {
        inputs.push((
            ticks.topic.as_str(),
            Some("its end: old ticks are not replayed"),
        ));
    }
    let mut points: BTreeMap<i32, BTreeMap<Channel, ResetPoint>> = BTreeMap::new();
    for (topic, at_end) in inputs {
        let d = cluster.describe(topic).map_err(|e| match e {
            MetadataError::Missing(_) => format!(
                "source topic {topic:?} of stage {:?} does not exist",
                stage.name
            ),
            e => format!("topic {topic:?}: {e}"),
        })?;
        let committed = committed(consumer, topic, d.partitions)?;
        for p in 0..d.partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, TIMEOUT)
                .map_err(|e| format!("cannot read the offsets of {topic}:{p}: {e}"))?;
            let to = match at_end {
                None => target(consumer, topic, p, r.to, low, high)?,
                Some(_) => high,
            };
            let tags = if to > low {
                senders_below(&r.cluster, topic, p, low, to)?
            } else {
                Vec::new()
            };
            plan.positions.push(Position {
                topic: topic.to_owned(),
                partition: p,
                committed: committed.get(&p).copied(),
                to,
                at_end,
                scanned: tags.len() as u64,
            });
            points
                .entry(p)
                .or_default()
                .insert(Channel::new(d.id, p), ResetPoint::scan(to, tags));
        }
    }
    Ok(points)
}

/// The records that reset `stage`'s changelogs, given the skip marks of
/// its new positions.
fn plan_changelogs(
    stage: &parsley::describe::StageTopology,
    points: &BTreeMap<i32, BTreeMap<Channel, ResetPoint>>,
    cluster: &KafkaCluster,
    plan: &mut Plan,
) -> Result<(), String> {
    let state = &stage.state_changelog;
    match cluster.describe(state) {
        Err(MetadataError::Missing(_)) => plan.absent.push((stage.name.clone(), state.clone())),
        Err(e) => return Err(format!("topic {state:?}: {e}")),
        Ok(d) => {
            for p in 0..d.partitions {
                let task = TaskId {
                    stage: stage.name.clone(),
                    partition: p,
                };
                let current = cluster
                    .read_changelog(state, p)
                    .map_err(|e| format!("cannot read {state}:{p}: {e}"))?;
                let none = BTreeMap::new();
                let records = reset_records(&task, current, points.get(&p).unwrap_or(&none))
                    .map_err(|e| e.to_string())?;
                plan.state.push(Writes {
                    topic: state.clone(),
                    partition: p,
                    records,
                });
            }
        }
    }
    if let Some(fold) = stage.state.as_ref().map(|s| &s.changelog) {
        match cluster.describe(fold) {
            // Created with the state changelog: a stage that never ran has
            // neither, and is named once.
            Err(MetadataError::Missing(_)) => {
                if !plan.absent.iter().any(|(s, _)| *s == stage.name) {
                    plan.absent.push((stage.name.clone(), fold.clone()));
                }
            }
            Err(e) => return Err(format!("topic {fold:?}: {e}")),
            Ok(d) => {
                for p in 0..d.partitions {
                    let current = cluster
                        .read_changelog(fold, p)
                        .map_err(|e| format!("cannot read {fold}:{p}: {e}"))?;
                    plan.fold.push(Writes {
                        topic: fold.clone(),
                        partition: p,
                        records: fold_reset_records(current),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The control topic's partitions that hold requests, with their offsets.
fn plan_control(
    t: &Topology,
    cluster: &KafkaCluster,
    consumer: &BaseConsumer,
) -> Result<Option<(String, Vec<Span>)>, String> {
    let diagnostics = parsley_kafka::diagnostics::diagnostics_topic(&t.application_id);
    if let Some(control) = t.host_topics.iter().find(|h| h.topic != diagnostics) {
        let topic = control.topic.as_str();
        match cluster.describe(topic) {
            Err(MetadataError::Missing(_)) => {}
            Err(e) => return Err(format!("topic {topic:?}: {e}")),
            Ok(d) => {
                let mut parts = Vec::new();
                for p in 0..d.partitions {
                    let (low, high) = consumer
                        .fetch_watermarks(topic, p, TIMEOUT)
                        .map_err(|e| format!("cannot read the offsets of {topic}:{p}: {e}"))?;
                    if high > low {
                        parts.push((p, low, high));
                    }
                }
                return Ok(Some((topic.to_owned(), parts)));
            }
        }
    }
    Ok(None)
}

/// The group's committed offsets on a topic, by partition.
fn committed(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i64>, String> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let answer = consumer
        .committed_offsets(tpl, TIMEOUT)
        .map_err(|e| format!("cannot read the committed offsets on {topic}: {e}"))?;
    Ok(answer
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// Where a source partition is read again from. `high` is the last stable
/// offset (the consumer reads committed), so everything below the answer
/// is decided when it is scanned.
fn target(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    to: ResetTo,
    low: i64,
    high: i64,
) -> Result<i64, String> {
    let at = match to {
        ResetTo::Earliest => low,
        ResetTo::Offset(o) => o,
        ResetTo::Time(ms) => {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(ms))
                .map_err(|e| e.to_string())?;
            let answer = consumer
                .offsets_for_times(tpl, TIMEOUT)
                .map_err(|e| format!("cannot look up {topic}:{partition} by time: {e}"))?;
            match answer.find_partition(topic, partition).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                // No record at or after the time.
                _ => high,
            }
        }
    };
    Ok(at.clamp(low, high))
}

/// The sender tags of the committed records of `topic`:`partition` from
/// `low` up to (not including) `to`, for the skip marks of a reset above
/// the log start. A record with corrupt causal headers fails the reset: its
/// sender's sequences could not be accounted for.
fn senders_below(
    cluster: &Connection,
    topic: &str,
    partition: i32,
    low: i64,
    to: i64,
) -> Result<Vec<(i64, Option<parsley::protocol::SenderTag>)>, String> {
    let mut config = cluster.client_config();
    config
        .set("group.id", "parsley-reset-scan")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .map_err(|e| e.to_string())?;
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read {topic}:{partition}: {e}"))?;
    let mut tags = Vec::new();
    let mut progress = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if m.offset() >= to {
                    break;
                }
                progress = Instant::now();
                let causal = parsley_kafka::clients::read_causal(&m).map_err(|e| {
                    format!(
                        "{topic}:{partition}@{} has corrupt causal headers ({e}): its sender's sequences cannot be accounted for; reset to a position above it",
                        m.offset()
                    )
                })?;
                tags.push((m.offset(), causal.sender));
                if m.offset() + 1 >= to {
                    break;
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(format!("cannot read {topic}:{partition}: {e}")),
            None => {
                let reached = consumer
                    .position()
                    .ok()
                    .and_then(|p| p.find_partition(topic, partition).map(|e| e.offset()));
                if matches!(reached, Some(Offset::Offset(o)) if o >= to) {
                    break;
                }
                if progress.elapsed() > TIMEOUT {
                    return Err(format!(
                        "reading {topic}:{partition} below offset {to} made no progress for {} s",
                        TIMEOUT.as_secs()
                    ));
                }
            }
        }
    }
    Ok(tags)
}

fn render(r: &Reset, plan: &Plan) -> String {
    let t = &r.topology;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Reset of application {:?}: sources read again from {}.",
        t.application_id, r.to
    );
    let _ = writeln!(out, "Consumer group {:?} positions:", t.application_id);
    for p in &plan.positions {
        let from = p
            .committed
            .map_or_else(|| "none".to_owned(), |c| c.to_string());
        let scanned = if p.scanned > 0 {
            format!(
                "; {} record(s) below read for their senders' sequences",
                p.scanned
            )
        } else {
            String::new()
        };
        let why = p.at_end.map_or_else(String::new, |why| format!(" ({why})"));
        let _ = writeln!(
            out,
            "  {}:{}  committed {from} -> {}{why}{scanned}",
            p.topic, p.partition, p.to
        );
    }
    let count = |w: &[Writes]| w.iter().map(|w| w.records.len()).sum::<usize>();
    let _ = writeln!(
        out,
        "Protocol state: {} record(s) to append over {} task(s) (send sequences and the delivered past kept, the rest deleted).",
        count(&plan.state),
        plan.state.len()
    );
    if !plan.fold.is_empty() {
        let _ = writeln!(
            out,
            "Fold state: {} key(s) to delete over {} task(s).",
            count(&plan.fold),
            plan.fold.len()
        );
    }
    for (stage, topic) in &plan.absent {
        let _ = writeln!(
            out,
            "Stage {stage:?} never ran ({topic} does not exist): only its group positions above are written; its first run starts at them and takes the records below them as its past."
        );
    }
    if let Some((topic, parts)) = &plan.control {
        let n: i64 = parts.iter().map(|(_, low, high)| high - low).sum();
        let _ = writeln!(out, "Control topic {topic}: {n} old request(s) to delete.");
    }
    match &r.wipe_state_dir {
        Some(root) => {
            let _ = writeln!(
                out,
                "Local state: {} to remove.",
                parsley_kafka::state_dir::application_dir(root, &t.application_id).display()
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Local state files need no wiping: each replays the reset from its checkpoint when its task starts (--wipe-state-dir removes this host's copy)."
            );
        }
    }
    out
}

/// Remembers the first failed delivery.
#[derive(Default)]
struct Deliveries(Mutex<Option<String>>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| format!("{}:{}: {e}", m.topic(), m.partition()));
        }
    }
}

fn apply(
    r: &Reset,
    plan: &Plan,
    config: &ClientConfig,
    cluster: &KafkaCluster,
    consumer: &BaseConsumer,
) -> Result<(), String> {
    // Asked again right before the first write: an instance started
    // while the plan was read (the scans can take a while) must not have
    // its state rewritten under it.
    crate::stopped::ensure_stopped(cluster, &r.cluster, &r.topology.application_id, RUNNING)?;
    // The mark first: every position the reset moves carries it until the
    // new positions are committed, the last step, so an instance started
    // on a reset that stopped half way refuses to run (the worker checks
    // it at assignment) instead of running on half-reset state.
    let mut marked = TopicPartitionList::new();
    for p in &plan.positions {
        let mut e = marked
            .add_partition_offset(
                &p.topic,
                p.partition,
                Offset::Offset(p.committed.unwrap_or(p.to)),
            )
            .map_err(|e| e.to_string())
            .and_then(|()| {
                marked
                    .find_partition(&p.topic, p.partition)
                    .ok_or_else(|| "the marked position went missing".to_owned())
            })?;
        e.set_metadata(RESET_IN_PROGRESS);
    }
    if marked.count() > 0 {
        consumer
            .commit(&marked, CommitMode::Sync)
            .map_err(|e| format!("cannot mark the group's positions for the reset: {e}"))?;
    }
    // The state next: a run stopped after this is finished by running it
    // again (this part then writes nothing).
    let mut producer_config = config.clone();
    producer_config
        .set("enable.idempotence", "true")
        .set("acks", "all");
    let producer: BaseProducer<Deliveries> = producer_config
        .create_with_context(Deliveries::default())
        .map_err(|e| format!("cannot create a producer: {e}"))?;
    for w in plan.state.iter().chain(&plan.fold) {
        for record in &w.records {
            let mut out = BaseRecord::<[u8], [u8]>::to(&w.topic).partition(w.partition);
            if let Some(k) = &record.key {
                out = out.key(k.as_slice());
            }
            if let Some(v) = &record.value {
                out = out.payload(v.as_slice());
            }
            let mut pending = out;
            loop {
                match producer.send(pending) {
                    Ok(()) => break,
                    Err((
                        KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        back,
                    )) => {
                        producer.poll(Duration::from_millis(100));
                        pending = back;
                    }
                    Err((e, _)) => return Err(format!("cannot write to {}: {e}", w.topic)),
                }
            }
        }
    }
    producer
        .flush(TIMEOUT.saturating_mul(3))
        .map_err(|e| format!("cannot write the reset state: {e}"))?;
    if let Some(e) = producer
        .context()
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        return Err(format!("cannot write the reset state: {e}"));
    }
    if let Some((topic, parts)) = &plan.control
        && !parts.is_empty()
    {
        let mut tpl = TopicPartitionList::new();
        for &(p, _, high) in parts {
            tpl.add_partition_offset(topic, p, Offset::Offset(high))
                .map_err(|e| e.to_string())?;
        }
        let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
        let answer = block_on(cluster.admin().delete_records(&tpl, &opts))
            .map_err(|e| format!("cannot delete the records of {topic}: {e}"))?;
        if let Some(e) = answer.elements().iter().find_map(|e| e.error().err()) {
            return Err(format!("cannot delete the records of {topic}: {e}"));
        }
    }
    if let Some(root) = &r.wipe_state_dir {
        let dir = parsley_kafka::state_dir::application_dir(root, &r.topology.application_id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", dir.display())),
        }
    }
    // Last: the new positions, without the mark (the commit replaces it).
    let mut tpl = TopicPartitionList::new();
    for p in &plan.positions {
        tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.to))
            .map_err(|e| e.to_string())?;
    }
    if tpl.count() > 0 {
        consumer
            .commit(&tpl, CommitMode::Sync)
            .map_err(|e| format!("cannot commit the group's positions: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_epoch_milliseconds() {
        assert_eq!(parse_time("1764547200000"), Ok(1_764_547_200_000));
        assert_eq!(parse_time("2025-12-01T00:00:00Z"), Ok(1_764_547_200_000));
        assert_eq!(
            parse_time("2025-12-01T01:00:00+01:00"),
            Ok(1_764_547_200_000)
        );
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
    }
}
