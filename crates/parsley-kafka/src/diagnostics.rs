//! The diagnostics topic: each stream thread publishes what its tasks hold
//! (and why) to `<application id>-diagnostics`, so an operator can ask any
//! running application from any machine that reaches the cluster
//! (`parsley holds --bootstrap B --app APP`).
//!
//! The topic is compacted with one partition; the key is
//! `<instance>/<thread>`, the value one JSON document ([`ThreadReport`]).
//! A thread publishes when what it holds or the tasks it runs change, and
//! at least every [`REFRESH`], so a reader can tell a stale entry (an
//! instance that died) by its `at`, and a running one by a fresh `at`
//! (`parsley skip` refuses to write while one is). A thread that leaves
//! the group publishes an empty report marked `left`.

use std::time::Duration;

use parsley::HeldRecord;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// How often a running thread republishes at least.
pub const REFRESH: Duration = Duration::from_secs(5);

/// The diagnostics topic of an application.
pub fn diagnostics_topic(application_id: &str) -> String {
    format!("{application_id}-diagnostics")
}

/// One held head, payload-free.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct HoldReport {
    /// The stage.
    pub stage: String,
    /// The task's partition.
    pub task_partition: i32,
    /// The held record, `topic:partition@offset`.
    pub coordinate: String,
    /// How long it has gated its channel.
    pub held_for_ms: i64,
    /// Records queued behind it, itself included.
    pub queue_depth: usize,
    /// The `vc-hold-*` code of its first unmet claim.
    pub code: String,
    /// The one-line summary (`HeldRecord::summary`).
    pub summary: String,
}

impl From<&HeldRecord> for HoldReport {
    fn from(h: &HeldRecord) -> Self {
        HoldReport {
            stage: h.stage.clone(),
            task_partition: h.task_partition,
            coordinate: h.coordinate.to_string(),
            held_for_ms: h.held_for_ms,
            queue_depth: h.queue_depth,
            code: h
                .waiting_on
                .first()
                .map_or("vc-hold", |w| w.diagnosis().code())
                .to_owned(),
            summary: h.summary(),
        }
    }
}

/// What one stream thread publishes.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ThreadReport {
    /// The instance id.
    pub instance: String,
    /// The stream thread's index.
    pub thread: usize,
    /// When it was sampled (milliseconds since the epoch).
    pub at: i64,
    /// The tasks the thread runs.
    pub tasks: Vec<String>,
    /// Every held head, longest-held first.
    pub holds: Vec<HoldReport>,
    /// Where the instance answers state queries
    /// (`StreamsOptions::application_server`), if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The thread's last report: it left the group (the instance closed or
    /// the thread ended). A running thread may report no tasks for a while
    /// (a rebalance, a failed task waiting to restart) without leaving.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left: bool,
}

impl ThreadReport {
    /// Whether the thread that published this was running at `now_ms`: it
    /// has not left, and it reported within three [`REFRESH`] periods (a
    /// running thread republishes at least every period, so an older
    /// report is from a process that died).
    pub fn is_running(&self, now_ms: i64) -> bool {
        let fresh = 3 * i64::try_from(REFRESH.as_millis()).unwrap_or(5_000);
        !self.left && now_ms - self.at < fresh
    }
}

/// The diagnostics topic could not be read.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ReportsError {
    /// The application has never run on this cluster (or with a Parsley
    /// older than the diagnostics topic).
    #[error(
        "application {0:?} has no diagnostics topic: it has not run on this cluster (or with a Parsley older than this one)"
    )]
    NoTopic(String),
    /// The cluster did not answer, or the topic holds something else.
    #[error("cannot read the diagnostics of {application:?}: {reason}")]
    Failed {
        /// The application id.
        application: String,
        /// Why.
        reason: String,
    },
}

/// The latest report of every stream thread of `application_id`, by
/// `<instance>/<thread>`, read from its diagnostics topic with `config`'s
/// bootstrap servers and security settings (each lookup bounded by
/// `timeout`, the read by twice that). An instance that died leaves its
/// last report: tell a live thread by a recent `at` (it republishes at
/// least every [`REFRESH`]).
pub fn latest_reports(
    config: &ClientConfig,
    application_id: &str,
    timeout: Duration,
) -> Result<std::collections::BTreeMap<String, ThreadReport>, ReportsError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};
    let topic = diagnostics_topic(application_id);
    let failed = |reason: String| ReportsError::Failed {
        application: application_id.to_owned(),
        reason,
    };
    let mut config = config.clone();
    config
        .set("enable.auto.commit", "false")
        .set("group.id", "parsley-diagnostics-reader");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| failed(format!("cannot create a consumer: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(&topic), timeout)
        .map_err(|e| failed(e.to_string()))?;
    if metadata
        .topics()
        .first()
        .is_none_or(|t| t.error().is_some() || t.partitions().is_empty())
    {
        return Err(ReportsError::NoTopic(application_id.to_owned()));
    }
    let (low, high) = consumer
        .fetch_watermarks(&topic, 0, timeout)
        .map_err(|e| failed(e.to_string()))?;
    let mut latest = std::collections::BTreeMap::new();
    if high <= low {
        return Ok(latest);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(low))
        .map_err(|e| failed(e.to_string()))?;
    consumer.assign(&tpl).map_err(|e| failed(e.to_string()))?;
    let deadline = std::time::Instant::now() + timeout.saturating_mul(2);
    loop {
        if std::time::Instant::now() > deadline {
            return Err(failed(format!("timed out reading {topic}")));
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.map_err(|e| failed(e.to_string()))?;
        let key = m
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .unwrap_or_default();
        match m.payload() {
            Some(p) => match serde_json::from_slice::<ThreadReport>(p) {
                Ok(r) => {
                    latest.insert(key, r);
                }
                Err(e) => {
                    return Err(failed(format!(
                        "record {topic}:0@{} is not a diagnostics report: {e}",
                        m.offset()
                    )));
                }
            },
            None => {
                latest.remove(&key);
            }
        }
        if m.offset() + 1 >= high {
            return Ok(latest);
        }
    }
}

/// What a held head is, for telling whether what a thread holds changed.
type Shape = Vec<(String, i64)>;

/// Whether a thread publishes now: its first report, a change in what it
/// holds, or [`REFRESH`] passed since the last one while it holds anything
/// (a thread holding nothing stays quiet until that changes).
fn due(last: Option<&(i64, Shape)>, now: i64, shape: &Shape) -> bool {
    match last {
        None => true,
        Some((at, last)) => {
            last != shape || now - at >= i64::try_from(REFRESH.as_millis()).unwrap_or(i64::MAX)
        }
    }
}

/// A stream thread's publisher.
pub(crate) struct Publisher {
    producer: BaseProducer<crate::ClientLogs>,
    topic: String,
    key: String,
    last: Option<(i64, Shape)>,
}

impl Publisher {
    pub(crate) fn new(
        config: &ClientConfig,
        application_id: &str,
        instance: &str,
        thread: usize,
    ) -> Option<Publisher> {
        match crate::settings::for_producer(config).create_with_context(crate::ClientLogs) {
            Ok(producer) => Some(Publisher {
                producer,
                topic: diagnostics_topic(application_id),
                key: format!("{instance}/{thread}"),
                last: None,
            }),
            Err(e) => {
                warn!(error = %e, "no diagnostics producer; `parsley holds` will not see this thread");
                None
            }
        }
    }

    /// Publishes `report` if what it holds changed, or if it holds anything
    /// and the last publication is older than [`REFRESH`].
    pub(crate) fn publish(&mut self, report: &ThreadReport) {
        // What it holds, and which tasks it runs (a rebalance changes them).
        let shape: Shape = report
            .holds
            .iter()
            .map(|h| (h.coordinate.clone(), i64::from(h.task_partition)))
            .chain(report.tasks.iter().map(|t| (t.clone(), -1)))
            .collect();
        if !due(self.last.as_ref(), report.at, &shape) {
            self.producer.poll(Duration::ZERO);
            return;
        }
        let Ok(value) = serde_json::to_vec(report) else {
            return;
        };
        match self.producer.send(
            BaseRecord::to(&self.topic)
                .partition(0)
                .key(&self.key)
                .payload(&value),
        ) {
            Ok(()) => self.last = Some((report.at, shape)),
            Err((e, _)) => warn!(error = %e, "diagnostics not published"),
        }
        self.producer.poll(Duration::ZERO);
    }

    /// Publishes the thread's last report (`left`) and waits briefly for
    /// it.
    pub(crate) fn leave(&mut self, report: &ThreadReport) {
        self.last = None;
        let mut report = report.clone();
        report.left = true;
        self.publish(&report);
        let _ = self.producer.flush(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_publishes_on_change_and_refreshes_every_interval() {
        let held: Shape = vec![("a:0@3".to_owned(), 0)];
        let none: Shape = Vec::new();
        assert!(due(None, 0, &none), "the first report");
        let last = (1_000, held.clone());
        assert!(!due(Some(&last), 2_000, &held), "unchanged, fresh");
        assert!(
            due(Some(&last), 6_000, &held),
            "unchanged, refreshed after 5 s"
        );
        assert!(due(Some(&last), 2_000, &none), "changed");
        let quiet = (1_000, none.clone());
        assert!(!due(Some(&quiet), 2_000, &none), "quiet and fresh");
        assert!(
            due(Some(&quiet), 6_000, &none),
            "holding nothing still refreshes: a fresh report says the thread runs"
        );
    }
}
