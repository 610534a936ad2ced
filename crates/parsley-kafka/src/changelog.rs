//! Changelog replay on a real cluster: a `read_committed` consumer assigned
//! to one changelog partition from its beginning, read until librdkafka
//! reports the end of the partition (the last stable offset for a
//! `read_committed` consumer, so an open transaction of a zombie is never
//! read).

use std::time::{Duration, Instant};

use parsley::runtime::host::ChangelogRecord;
use parsley::runtime::host::MetadataError;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::debug;

/// The replay consumer's context. librdkafka reports the end of a
/// partition as an error event, and rdkafka's default context logs every
/// error event at ERROR; for a replay the end is the expected way out, so
/// it is logged at DEBUG, and anything else at WARN (the replay itself
/// returns the error that matters).
struct ReplayContext;

impl ClientContext for ReplayContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::logs::client_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error,
            KafkaError::Global(RDKafkaErrorCode::PartitionEOF) | KafkaError::PartitionEOF(_)
        ) {
            debug!(reason, "changelog replay reached the end of its partition");
        } else {
            crate::logs::client_error(&error, reason);
        }
    }
}

impl ConsumerContext for ReplayContext {}

/// A replay consumer, made once and reused for every changelog partition a
/// stream thread restores: a new client per partition cost about 0.6 s of
/// set-up (connections, metadata) even for an empty partition.
pub(crate) struct Replayer {
    consumer: BaseConsumer<ReplayContext>,
}

impl Replayer {
    pub(crate) fn new(base: &ClientConfig) -> Result<Replayer, KafkaError> {
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
            // A replay from a local store's checkpoint that lies below the
            // log start (records deleted since the check) must fail, never
            // jump to the end and skip what it had to read.
            .set("auto.offset.reset", "error")
            .remove("transactional.id");
        Ok(Replayer {
            consumer: config.create_with_context(ReplayContext)?,
        })
    }

    /// Connects to the cluster and learns `topics`' leaders ahead of the
    /// first replay. Failures are left for the replay to meet.
    pub(crate) fn warm(&self, topics: &[&str], timeout: Duration) {
        for topic in topics {
            if let Err(e) = self.consumer.fetch_metadata(Some(topic), timeout) {
                debug!(error = %e, %topic, "replay consumer warm-up failed");
            }
        }
    }

    /// Replays one changelog partition from offset `from` (its log start
    /// when that is below it) to its end (the last stable offset), handing
    /// each record to `apply`; returns how many it read and where it
    /// stopped (the consumer's position at the end: the last stable
    /// offset). A replay that keeps making progress never times out;
    /// one that receives nothing for `stall` while the end lies ahead fails
    /// with [`MetadataError::Stalled`], naming where it stood. It never
    /// returns a partial store as complete.
    pub(crate) fn replay(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        stall: Duration,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<(u64, i64), MetadataError> {
        let failed = |message: String| MetadataError::Failed {
            topic: topic.to_owned(),
            message,
        };
        let mut tpl = TopicPartitionList::new();
        let start = if from > 0 {
            Offset::Offset(from)
        } else {
            Offset::Beginning
        };
        tpl.add_partition_offset(topic, partition, start)
            .map_err(|e| failed(e.to_string()))?;
        self.consumer
            .assign(&tpl)
            .map_err(|e| failed(e.to_string()))?;
        let r = self.read(topic, partition, from, stall, apply);
        // Whatever happened, the next replay starts from a clean slate.
        let _ = self.consumer.unassign();
        r
    }

    fn read(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        stall: Duration,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<(u64, i64), MetadataError> {
        let mut progress = Instant::now();
        let mut read = 0u64;
        let mut next = -1;
        loop {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    progress = Instant::now();
                    read += 1;
                    next = m.offset() + 1;
                    apply(ChangelogRecord {
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                    });
                    continue;
                }
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => {
                    if let Some(at) = self.stopped_at(topic, partition, from, next) {
                        return Ok((read, at));
                    }
                    // An end reported before this replay read anything
                    // while there is something to read: not this
                    // assignment's end. Read on.
                    continue;
                }
                Some(Err(e))
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OffsetOutOfRange) =>
                {
                    return Err(MetadataError::Failed {
                        topic: topic.to_owned(),
                        message: format!(
                            "partition {partition}: the replay's start is out of range (the changelog was truncated since it was checked): {e}"
                        ),
                    });
                }
                Some(Err(e)) if crate::error::consumer_error_is_fatal(&e) => {
                    return Err(MetadataError::Failed {
                        topic: topic.to_owned(),
                        message: e.to_string(),
                    });
                }
                // librdkafka retries the others itself (a broker
                // connection, a leader moving); they count towards the
                // stall.
                Some(Err(e)) => {
                    debug!(error = %e, %topic, partition, "changelog replay: a consumer error the client retries");
                }
                None => {}
            }
            if progress.elapsed() > stall {
                let end = self
                    .consumer
                    .fetch_watermarks(topic, partition, Duration::from_secs(2))
                    .map_or(-1, |(_, high)| high);
                return Err(MetadataError::Stalled {
                    topic: topic.to_owned(),
                    partition,
                    at: next,
                    end,
                    stalled_for: stall,
                });
            }
        }
    }
}

impl Replayer {
    /// Where a replay that reached the end of its partition stopped, if it
    /// did. librdkafka moves the consumer's position past the transaction
    /// markers and aborted records it skips, so after the end it is the
    /// last stable offset. A replay that consumed and skipped nothing has
    /// no position; it stopped at its start (`from`, or the log start when
    /// above) only if the last stable offset is not above that start: an
    /// end reported then with records to read is a stale one (the same
    /// partition's end from an earlier replay of this reused consumer),
    /// and `None` says to read on.
    fn stopped_at(&self, topic: &str, partition: i32, from: i64, next: i64) -> Option<i64> {
        let position = self.consumer.position().ok().and_then(|tpl| {
            match tpl.find_partition(topic, partition)?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            }
        });
        if let Some(p) = position {
            return Some(p.max(next));
        }
        if next >= 0 {
            return Some(next);
        }
        let timeout = Duration::from_secs(5);
        let low = self
            .consumer
            .fetch_watermarks(topic, partition, timeout)
            .ok()?
            .0;
        let mut end = TopicPartitionList::new();
        end.add_partition_offset(topic, partition, Offset::End)
            .ok()?;
        // The consumer is read_committed: its "latest" is the last stable
        // offset.
        let stable = match self
            .consumer
            .offsets_for_times(end, timeout)
            .ok()?
            .find_partition(topic, partition)?
            .offset()
        {
            Offset::Offset(o) => o,
            _ => return None,
        };
        let start = from.max(low);
        (stable <= start).then_some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay that receives nothing (here: no broker listens at the
    /// address) fails once `stall` has passed without progress, naming the
    /// partition, instead of waiting forever or returning an empty store.
    #[test]
    fn a_replay_without_progress_fails_after_the_stall_time_naming_the_partition() {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("log_level", "0");
        let replayer = Replayer::new(&config).unwrap();
        let started = Instant::now();
        let mut applied = 0;
        let err = replayer
            .replay(
                "app-s-state-changelog",
                3,
                0,
                Duration::from_millis(300),
                &mut |_| applied += 1,
            )
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(applied, 0);
        match &err {
            MetadataError::Stalled {
                topic, partition, ..
            } => assert_eq!((topic.as_str(), *partition), ("app-s-state-changelog", 3)),
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("made no progress"), "{err}");
    }
}
