//! `parsley holds`: what a running application's tasks hold and why, read
//! from its diagnostics topic (each stream thread publishes there; see
//! `parsley_kafka::diagnostics`), so it works from any machine that
//! reaches the cluster.

use crate::connect::Connection;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parsley_kafka::diagnostics::{ReportsError, ThreadReport};

/// Reports older than this are from threads that stopped publishing (a
/// thread holding records republishes every few seconds).
const STALE_AFTER_MS: i64 = 60_000;

/// Reads the latest report of every stream thread and describes them.
pub fn run(cluster: &Connection, app: &str) -> Result<Vec<String>, String> {
    let latest = latest_reports(cluster, app).map_err(|e| e.to_string())?;
    describe(app, &latest)
}

/// The latest report of every stream thread of `app` on its diagnostics
/// topic, by `<instance>/<thread>`.
pub fn latest_reports(
    cluster: &Connection,
    app: &str,
) -> Result<BTreeMap<String, ThreadReport>, ReportsError> {
    let config = cluster.client_config();
    parsley_kafka::diagnostics::latest_reports(&config, app, Duration::from_secs(20))
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
