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
//! the group publishes an empty report.

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

    /// Publishes an empty report (the thread left) and waits briefly for it.
    pub(crate) fn leave(&mut self, report: &ThreadReport) {
        self.last = None;
        self.publish(report);
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
