//! `parsley skip`: steps a stopped application's task past one named input
//! record. The step is written to the task's state changelog as a protocol
//! store entry, so the task reads it when it restores and sends that record
//! to a dead-letter topic instead of delivering it.
//!
//! Everything is checked before anything is written: no stream thread of
//! the application runs (the group's coordinator lists no member, under
//! either group protocol, and no thread reported on the diagnostics topic
//! in the last 15 s: a running task would not read the entry until its next
//! restore, and could race it; asked again right before the write), the
//! topics exist, the
//! record is not consumed yet, and the task's recorded scope consumes the
//! channel (else its restore would refuse the entry).

use crate::connect::Connection;
use std::time::Duration;

use parsley::TaskId;
use parsley::protocol::{Channel, SteppedPast};
use parsley::runtime::changelog::step_past_record;
use parsley::runtime::host::ChangelogReader;
use parsley::runtime::host::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(20);

/// One record to step past.
#[derive(Clone, Debug)]
pub struct Skip {
    /// Bootstrap servers.
    pub cluster: Connection,
    /// The application id.
    pub app: String,
    /// The stage consuming the record.
    pub stage: String,
    /// The record's topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Where it goes instead.
    pub dead_letter: String,
    /// Why (the `parsley.dlq.error` header of the dead letter).
    pub reason: String,
}

/// Why a skip refuses a running application.
const RUNNING: &str = "a running task reads the step only when it restores";

/// Checks and records the step; returns the line to print.
pub fn run(s: &Skip) -> Result<String, String> {
    let config = s.cluster.client_config();
    let cluster = KafkaCluster::new(&config, TIMEOUT)
        .map_err(|e| format!("cannot reach {}: {e}", s.cluster.bootstrap))?;
    let mut group = config.clone();
    group
        .set("group.id", &s.app)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = group
        .create()
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    crate::stopped::ensure_stopped(&cluster, &s.cluster, &s.app, RUNNING)?;
    let describe = |topic: &str| {
        cluster
            .describe(topic)
            .map_err(|e| format!("topic {topic:?}: {e}"))
    };
    let source = describe(&s.topic)?;
    if s.partition < 0 || s.partition >= source.partitions {
        return Err(format!(
            "{} has {} partition(s); there is no partition {}",
            s.topic, source.partitions, s.partition
        ));
    }
    describe(&s.dead_letter).map_err(|e| format!("the dead-letter {e}; create it first"))?;
    let (low, high) = consumer
        .fetch_watermarks(&s.topic, s.partition, TIMEOUT)
        .map_err(|e| {
            format!(
                "cannot read the offsets of {}:{}: {e}",
                s.topic, s.partition
            )
        })?;
    if s.offset < low || s.offset >= high {
        return Err(format!(
            "{}:{}@{} is not in the log, which holds offsets {low} to {}",
            s.topic,
            s.partition,
            s.offset,
            high - 1
        ));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&s.topic, s.partition);
    let committed = consumer
        .committed_offsets(tpl, TIMEOUT)
        .map_err(|e| format!("cannot read the committed offsets of {:?}: {e}", s.app))?;
    if let Some(e) = committed.find_partition(&s.topic, s.partition)
        && let Offset::Offset(c) = e.offset()
        && c > s.offset
    {
        return Err(format!(
            "{}:{}@{} is already consumed (the application's committed position there is {c}): there is nothing to step past",
            s.topic, s.partition, s.offset
        ));
    }
    let names = format!("{}-{}-state-changelog", s.app, s.stage);
    let task = TaskId {
        stage: s.stage.clone(),
        partition: s.partition,
    };
    if cluster.describe(&names).is_err() {
        return Err(format!(
            "application {:?} has no state changelog {names:?} for stage {:?}: no such stage, or it never ran",
            s.app, s.stage
        ));
    }
    let current = cluster
        .read_changelog(&names, s.partition)
        .map_err(|e| format!("cannot read {names}: {e}"))?;
    let stepped = SteppedPast {
        dead_letter: s.dead_letter.clone(),
        reason: s.reason.clone(),
    };
    let channel = Channel::new(source.id, s.partition);
    let record =
        step_past_record(&task, current, channel, s.offset, &stepped).map_err(|e| e.to_string())?;
    // Asked again right before the write: an instance that started while
    // the checks above ran must not have its state written under it.
    crate::stopped::ensure_stopped(&cluster, &s.cluster, &s.app, RUNNING)?;
    let mut producer_config = config.clone();
    producer_config
        .set("enable.idempotence", "true")
        .set("acks", "all");
    let producer: BaseProducer = producer_config
        .create()
        .map_err(|e| format!("cannot create a producer: {e}"))?;
    let mut out = BaseRecord::<[u8], [u8]>::to(&names).partition(s.partition);
    if let Some(k) = &record.key {
        out = out.key(k.as_slice());
    }
    if let Some(v) = &record.value {
        out = out.payload(v.as_slice());
    }
    producer
        .send(out)
        .map_err(|(e, _)| format!("cannot write to {names}: {e}"))?;
    producer
        .flush(TIMEOUT)
        .map_err(|e| format!("cannot write to {names}: {e}"))?;
    Ok(format!(
        "task {task} will step past {}:{}@{} when the application starts: the record goes to {} instead of its logic (recorded in {names}:{})",
        s.topic, s.partition, s.offset, s.dead_letter, s.partition
    ))
}
