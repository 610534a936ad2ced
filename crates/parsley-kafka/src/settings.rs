//! Each client gets only the settings that are its own.
//!
//! An application hands the runtime one client configuration, and the
//! runtime builds consumers, producers and an admin client from it.
//! librdkafka warns at every start about a setting its client kind does not
//! read ("is a consumer property and will be ignored by this producer
//! instance"), so the guide's recommended `session.timeout.ms` would make
//! every producer complain. The lists are librdkafka's own (the `C` and `P`
//! rows of its CONFIGURATION.md, 2.12).

use rdkafka::ClientConfig;

/// Settings only a consumer reads.
const CONSUMER_ONLY: &[&str] = &[
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "check.crcs",
    "consume.callback.max.messages",
    "coordinator.query.interval.ms",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "fetch.error.backoff.ms",
    "fetch.max.bytes",
    "fetch.message.max.bytes",
    "fetch.min.bytes",
    "fetch.queue.backoff.ms",
    "fetch.wait.max.ms",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.protocol.type",
    "group.remote.assignor",
    "heartbeat.interval.ms",
    "isolation.level",
    "max.partition.fetch.bytes",
    "max.poll.interval.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "partition.assignment.strategy",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "session.timeout.ms",
];

/// Settings only a producer reads.
const PRODUCER_ONLY: &[&str] = &[
    "acks",
    "batch.num.messages",
    "batch.size",
    "compression.codec",
    "compression.level",
    "compression.type",
    "delivery.report.only.error",
    "delivery.timeout.ms",
    "enable.gapless.guarantee",
    "enable.idempotence",
    "linger.ms",
    "message.send.max.retries",
    "message.timeout.ms",
    "partitioner",
    "produce.offset.report",
    "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "queue.buffering.max.ms",
    "queuing.strategy",
    "request.required.acks",
    "request.timeout.ms",
    "retries",
    "sticky.partitioning.linger.ms",
    "transaction.timeout.ms",
    "transactional.id",
];

/// How often the runtime's clients refresh the cluster's metadata (topic
/// leaders, the controller) unless the configuration says otherwise.
/// librdkafka's own default is five minutes, and it does not always look
/// again when a broker it was never connected to is down: a client made
/// after a broker died (a restore's consumer, a lookup) kept sending to
/// the dead leader, or waiting for it as the controller, until the broker
/// came back (seen on a three-broker cluster as tasks that could not start
/// for as long as the broker was down).
pub(crate) const METADATA_REFRESH: &str = "5000";

fn without(config: &ClientConfig, keys: &[&str]) -> ClientConfig {
    let mut c = config.clone();
    for k in keys {
        c.remove(k);
    }
    if c.get("topic.metadata.refresh.interval.ms").is_none() {
        c.set("topic.metadata.refresh.interval.ms", METADATA_REFRESH);
    }
    c
}

/// `config` for a producer (or an admin client, which librdkafka runs as
/// one): consumer settings left out.
pub(crate) fn for_producer(config: &ClientConfig) -> ClientConfig {
    without(config, CONSUMER_ONLY)
}

/// `config` for a consumer: producer settings left out.
pub(crate) fn for_consumer(config: &ClientConfig) -> ClientConfig {
    without(config, PRODUCER_ONLY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_kind_keeps_its_own_settings_and_the_shared_ones() {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "127.0.0.1:1")
            .set("security.protocol", "plaintext")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set("linger.ms", "2")
            .set("transaction.timeout.ms", "10000");
        let p = for_producer(&c);
        assert_eq!(p.get("session.timeout.ms"), None);
        assert_eq!(p.get("heartbeat.interval.ms"), None);
        assert_eq!(p.get("linger.ms"), Some("2"));
        assert_eq!(p.get("transaction.timeout.ms"), Some("10000"));
        assert_eq!(p.get("bootstrap.servers"), Some("127.0.0.1:1"));
        assert_eq!(p.get("security.protocol"), Some("plaintext"));
        let k = for_consumer(&c);
        assert_eq!(k.get("session.timeout.ms"), Some("10000"));
        assert_eq!(k.get("linger.ms"), None);
        assert_eq!(k.get("transaction.timeout.ms"), None);
        assert_eq!(k.get("bootstrap.servers"), Some("127.0.0.1:1"));
        // Leaders are looked up again every few seconds, unless the user
        // chose otherwise.
        assert_eq!(
            k.get("topic.metadata.refresh.interval.ms"),
            Some(METADATA_REFRESH)
        );
        c.set("topic.metadata.refresh.interval.ms", "60000");
        assert_eq!(
            for_producer(&c).get("topic.metadata.refresh.interval.ms"),
            Some("60000")
        );
    }

    #[test]
    fn no_setting_is_on_both_lists() {
        for k in CONSUMER_ONLY {
            assert!(!PRODUCER_ONLY.contains(k), "{k} is on both lists");
        }
    }
}
