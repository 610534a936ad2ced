//! Whether an application is stopped, for the commands that change its
//! state behind its back (`parsley skip`, `parsley reset`): a running task
//! would not read what they write until its next restore, and could race
//! it.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Refuses unless no stream thread of `app` runs: its consumer group has no
/// members under the classic protocol, and no thread that has not left
/// reported on the diagnostics topic within three refresh periods (under the
/// consumer group protocol the classic description sees no members, and
/// the threads' own reports are what says). `why` ends the refusal.
pub(crate) fn ensure_stopped(
    consumer: &BaseConsumer,
    bootstrap: &str,
    app: &str,
    why: &str,
) -> Result<(), String> {
    let groups = consumer
        .fetch_group_list(Some(app), TIMEOUT)
        .map_err(|e| format!("cannot describe consumer group {app:?}: {e}"))?;
    if let Some(g) = groups.groups().iter().find(|g| g.name() == app)
        && !g.members().is_empty()
    {
        return Err(format!(
            "application {app:?} is running: its consumer group has {} member(s); stop every instance first ({why})",
            g.members().len()
        ));
    }
    match crate::holds::latest_reports(bootstrap, app) {
        Ok(latest) => {
            let now = crate::holds::now_ms();
            let running: Vec<String> = latest
                .values()
                // A thread with no task for now (a failed task waiting to
                // restart, a rebalance) is still running; one that left
                // said so in its last report.
                .filter(|r| r.is_running(now))
                .map(|r| format!("{}/{}", r.instance, r.thread))
                .collect();
            if !running.is_empty() {
                return Err(format!(
                    "application {app:?} is running: stream thread(s) {} reported recently and have not left; stop every instance first ({why})",
                    running.join(", ")
                ));
            }
            Ok(())
        }
        Err(parsley_kafka::diagnostics::ReportsError::NoTopic(_)) => Ok(()),
        Err(e) => Err(format!("cannot tell whether {app:?} is running: {e}")),
    }
}
