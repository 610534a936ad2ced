//! Changelog replay on a real cluster: a `read_committed` consumer assigned
//! to one changelog partition from its beginning, read until librdkafka
//! reports the end of the partition (the last stable offset for a
//! `read_committed` consumer, so an open transaction of a zombie is never
//! read).

use std::time::{Duration, Instant};

use parsley::runtime::changelog::ChangelogRecord;
use parsley::task::MetadataError;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Replays one changelog partition; fails (never returns a partial store)
/// when the end is not reached within `timeout`.
pub(crate) fn replay(
    base: &ClientConfig,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<Vec<ChangelogRecord>, MetadataError> {
    let failed = |message: String| MetadataError::Failed {
        topic: topic.to_owned(),
        message,
    };
    let mut config = base.clone();
    config
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("group.id", "parsley-changelog-restore")
        .remove("transactional.id");
    let consumer: BaseConsumer = config.create().map_err(|e| failed(e.to_string()))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(|e| failed(e.to_string()))?;
    consumer.assign(&tpl).map_err(|e| failed(e.to_string()))?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        if Instant::now() > deadline {
            return Err(failed(format!(
                "the changelog's end was not reached within {timeout:?}"
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Ok(m)) => out.push(ChangelogRecord {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
            }),
            Some(Err(KafkaError::PartitionEOF(p))) if p == partition => return Ok(out),
            Some(Err(e)) => return Err(failed(e.to_string())),
        }
    }
}
