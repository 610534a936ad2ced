//! `parsley holds`: what a running application's tasks hold and why, read
//! from its diagnostics topic (each stream thread publishes there; see
//! `parsley_kafka::diagnostics`), so it works from any machine that
//! reaches the cluster.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley_kafka::diagnostics::{ThreadReport, diagnostics_topic};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Reports older than this are from threads that stopped publishing (a
/// thread holding records republishes every few seconds).
const STALE_AFTER_MS: i64 = 60_000;

/// Reads the latest report of every stream thread and describes them.
pub fn run(bootstrap: &str, app: &str) -> Result<Vec<String>, String> {
    let latest = latest_reports(bootstrap, app)?;
    describe(app, &latest)
}

/// The latest report of every stream thread of `app` on its diagnostics
/// topic, by `<instance>/<thread>`.
pub fn latest_reports(
    bootstrap: &str,
    app: &str,
) -> Result<BTreeMap<String, ThreadReport>, String> {
    let topic = diagnostics_topic(app);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("enable.auto.commit", "false")
        .set("group.id", "parsley-holds");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(&topic), Duration::from_secs(20))
        .map_err(|e| format!("cannot reach {bootstrap}: {e}"))?;
    if metadata
        .topics()
        .first()
        .is_none_or(|t| t.error().is_some() || t.partitions().is_empty())
    {
        return Err(format!(
            "application {app:?} has no diagnostics topic {topic:?}: it has not run on this cluster (or with a Parsley older than this command)"
        ));
    }
    let (low, high) = consumer
        .fetch_watermarks(&topic, 0, Duration::from_secs(20))
        .map_err(|e| format!("cannot read {topic}: {e}"))?;
    let mut latest: BTreeMap<String, ThreadReport> = BTreeMap::new();
    if high > low {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(low))
            .map_err(|e| e.to_string())?;
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if Instant::now() > deadline {
                return Err(format!("timed out reading {topic}"));
            }
            let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = m.map_err(|e| format!("read failed: {e}"))?;
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
                        return Err(format!(
                            "record {topic}:0@{} is not a diagnostics report: {e}",
                            m.offset()
                        ));
                    }
                },
                None => {
                    latest.remove(&key);
                }
            }
            if m.offset() + 1 >= high {
                break;
            }
        }
    }
    Ok(latest)
}

/// The wall clock in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn describe(app: &str, latest: &BTreeMap<String, ThreadReport>) -> Result<Vec<String>, String> {
    let now = now_ms();
    let live: Vec<&ThreadReport> = latest
        .values()
        .filter(|r| now - r.at < STALE_AFTER_MS && !r.tasks.is_empty())
        .collect();
    let mut lines = Vec::new();
    if live.is_empty() {
        lines.push(format!(
            "no running instance of {app:?} has reported in the last {}s",
            STALE_AFTER_MS / 1000
        ));
        return Ok(lines);
    }
    let mut holds: Vec<(&ThreadReport, &parsley_kafka::diagnostics::HoldReport)> = live
        .iter()
        .flat_map(|r| r.holds.iter().map(move |h| (*r, h)))
        .collect();
    holds.sort_by_key(|h| std::cmp::Reverse(h.1.held_for_ms));
    let tasks: usize = live.iter().map(|r| r.tasks.len()).sum();
    lines.push(format!(
        "{app}: {} stream thread(s), {tasks} task(s), {} held record(s) gating a channel",
        live.len(),
        holds.len()
    ));
    for (r, h) in holds {
        lines.push(format!(
            "[{}/{} as of {}s ago] {}",
            r.instance,
            r.thread,
            (now - r.at).max(0) / 1000,
            h.summary
        ));
    }
    Ok(lines)
}
