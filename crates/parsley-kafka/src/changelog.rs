//! Changelog replay on a real cluster: a `read_committed` consumer assigned
//! to one changelog partition from its beginning, read until librdkafka
//! reports the end of the partition (the last stable offset for a
//! `read_committed` consumer, so an open transaction of a zombie is never
//! read).

use std::time::{Duration, Instant};

use parsley::runtime::changelog::ChangelogRecord;
use parsley::task::MetadataError;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, warn};

/// The replay consumer's context. librdkafka reports the end of a
/// partition as an error event, and rdkafka's default context logs every
/// error event at ERROR; for a replay the end is the expected way out, so
/// it is logged at DEBUG, and anything else at WARN (the replay itself
/// returns the error that matters).
struct ReplayContext;

impl ClientContext for ReplayContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error,
            KafkaError::Global(RDKafkaErrorCode::PartitionEOF) | KafkaError::PartitionEOF(_)
        ) {
            debug!(reason, "changelog replay reached the end of its partition");
        } else {
            warn!(%error, reason, "changelog replay consumer error");
        }
    }
}

impl ConsumerContext for ReplayContext {}

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
    let mut config = crate::settings::for_consumer(base);
    config
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("group.id", "parsley-changelog-restore")
        // A replay reads to the end as fast as the broker serves it:
        // librdkafka's defaults make the broker hold an empty fetch for
        // 500 ms and the fetcher pause 1 s whenever its queue is full.
        .set("fetch.wait.max.ms", "10")
        .set("fetch.queue.backoff.ms", "1")
        .remove("transactional.id");
    let consumer: BaseConsumer<ReplayContext> = config
        .create_with_context(ReplayContext)
        .map_err(|e| failed(e.to_string()))?;
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
