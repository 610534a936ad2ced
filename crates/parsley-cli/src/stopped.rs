//! Whether an application is stopped, for the commands that change its
//! state behind its back (`parsley skip`, `parsley reset`): a running task
//! would not read what they write until its next restore, and could race
//! it.

use parsley_kafka::KafkaCluster;

/// Refuses unless no stream thread of `app` runs. The broker's word comes
/// first: the group's coordinator describes it (ConsumerGroupDescribe for a
/// group of the consumer protocol, DescribeGroups for a classic one), and a
/// group with members, or in the middle of a rebalance, is running. Then
/// the threads' own reports: none that has not left may have reported on
/// the diagnostics topic within three refresh periods (a thread between
/// two sessions of its group, which the coordinator no longer lists, still
/// reports). `why` ends the refusal.
pub(crate) fn ensure_stopped(
    kafka: &KafkaCluster,
    cluster: &crate::connect::Connection,
    app: &str,
    why: &str,
) -> Result<(), String> {
    let group = kafka
        .describe_group(app)
        .map_err(|e| format!("cannot describe consumer group {app:?}: {e}"))?;
    if group.is_active() {
        return Err(format!(
            "application {app:?} is running: its consumer group ({} protocol) is {} with {} member(s){}; stop every instance first ({why})",
            group.protocol,
            group.state,
            group.members.len(),
            if group.members.is_empty() {
                String::new()
            } else {
                format!(" ({})", group.members.join(", "))
            }
        ));
    }
    match crate::holds::latest_reports(cluster, app) {
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
