//! The replicated cluster the broker-failure suite runs on: its address,
//! the command that stops and starts its nodes, and which node leads a
//! partition or coordinates a group or a transactional id.
//!
//! `PARSLEY_CLUSTER_BOOTSTRAP` names the cluster (the test command starts
//! three local nodes with `scripts/kafka/cluster` and sets it).
//! `PARSLEY_CLUSTER_CONTROL` names the command that acts on one node
//! (`term|kill|pause|resume|restart NODE_ID`); it defaults to that script,
//! so pointing the suite at another cluster means giving a command of the
//! same shape for it.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The cluster under test: `PARSLEY_CLUSTER_BOOTSTRAP`.
pub fn bootstrap() -> String {
    std::env::var("PARSLEY_CLUSTER_BOOTSTRAP").expect(
        "set PARSLEY_CLUSTER_BOOTSTRAP to a replicated cluster's bootstrap list (the test command starts one with scripts/kafka/cluster)",
    )
}

/// A client configuration for the cluster under test.
pub fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap());
    c
}

fn control_command() -> PathBuf {
    std::env::var_os("PARSLEY_CLUSTER_CONTROL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka/cluster")
        })
}

/// What can be done to one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// A clean shutdown (SIGTERM), waited for.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGSTOP: frozen, connections open.
    Pause,
    /// SIGCONT.
    Resume,
    /// Started again on its data, waited for until it accepts connections.
    Restart,
}

impl NodeAction {
    fn verb(self) -> &'static str {
        match self {
            NodeAction::Term => "term",
            NodeAction::Kill => "kill",
            NodeAction::Pause => "pause",
            NodeAction::Resume => "resume",
            NodeAction::Restart => "restart",
        }
    }
}

/// Acts on node `id` through the control command; panics if it fails.
pub fn node(action: NodeAction, id: i32) {
    if let Err(e) = try_node(action, id) {
        panic!("{e}");
    }
}

/// Acts on node `id` through the control command.
pub fn try_node(action: NodeAction, id: i32) -> Result<(), String> {
    let out = Command::new(control_command())
        .args([action.verb(), &id.to_string()])
        .output()
        .map_err(|e| format!("the cluster control command did not run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {id} failed: {}",
            action.verb(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Asks the control command a question (`leader`, `group-coordinator`,
/// `txn-coordinator`); its answer, trimmed.
pub fn ask(args: &[&str]) -> String {
    let out = Command::new(control_command())
        .args(args)
        .output()
        .expect("the cluster control command runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn metadata_client() -> BaseConsumer {
    config().create().expect("a metadata client")
}

/// The node that leads `topic`:`partition` now (retried while the
/// partition has no leader, for up to 30 s).
pub fn leader(topic: &str, partition: i32) -> i32 {
    let client = metadata_client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = client.fetch_metadata(Some(topic), Duration::from_secs(10))
            && let Some(t) = md.topics().iter().find(|t| t.name() == topic)
            && let Some(p) = t.partitions().iter().find(|p| p.id() == partition)
            && p.leader() >= 0
        {
            return p.leader();
        }
        assert!(
            Instant::now() < deadline,
            "{topic}:{partition} has no leader"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Java's `String.hashCode`, which Kafka uses to place a group or a
/// transactional id on a partition of its internal log.
pub fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The leader of the partition of `log` (an internal topic) that `id`
/// hashes to: the coordinator Kafka picks for it.
fn coordinator(log: &str, id: &str) -> i32 {
    let client = metadata_client();
    let md = client
        .fetch_metadata(Some(log), Duration::from_secs(10))
        .expect("metadata of the internal log");
    let count = md
        .topics()
        .iter()
        .find(|t| t.name() == log)
        .map_or(0, |t| t.partitions().len());
    assert!(count > 0, "{log} has no partitions yet");
    // Kafka's Utils.abs: the absolute value, with i32::MIN taken as 0.
    let hash = java_hash(id);
    let partition = if hash == i32::MIN { 0 } else { hash.abs() } % i32::try_from(count).unwrap();
    leader(log, partition)
}

/// The node coordinating consumer group `group`.
pub fn group_coordinator(group: &str) -> i32 {
    coordinator("__consumer_offsets", group)
}

/// The node coordinating transactional id `id`.
pub fn txn_coordinator(id: &str) -> i32 {
    coordinator("__transaction_state", id)
}

/// The node ids of the cluster's brokers.
pub fn nodes() -> Vec<i32> {
    let md = metadata_client()
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("cluster metadata");
    let mut ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
    ids.sort_unstable();
    ids
}

/// Waits until every node's metadata knows `topics` (a topic just created
/// is known to one broker before the others, and an application started
/// at once may ask one that does not know it yet).
pub fn await_known_everywhere(topics: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    for address in bootstrap().split(',') {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", address);
        let client: BaseConsumer = c.create().expect("a metadata client");
        for topic in topics {
            loop {
                let known = client
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .ok()
                    .and_then(|md| {
                        md.topics()
                            .iter()
                            .find(|t| t.name() == *topic)
                            .map(|t| t.error().is_none() && !t.partitions().is_empty())
                    })
                    .unwrap_or(false);
                if known {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{topic} unknown to {address} after {within:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Waits until every partition of `topics` has its whole replica set in
/// sync again (after a node came back), for up to `within`.
pub fn await_in_sync(topics: &[&str], within: Duration) {
    let client = metadata_client();
    let deadline = Instant::now() + within;
    loop {
        let synced = topics.iter().all(|topic| {
            client
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .ok()
                .and_then(|md| {
                    md.topics().iter().find(|t| t.name() == *topic).map(|t| {
                        t.partitions()
                            .iter()
                            .all(|p| p.leader() >= 0 && p.isr().len() == p.replicas().len())
                    })
                })
                .unwrap_or(false)
        });
        if synced {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas of {topics:?} not back in sync within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::java_hash;

    #[test]
    fn java_hash_matches_javas() {
        // "hello".hashCode() and "".hashCode() in Java.
        assert_eq!(java_hash("hello"), 99_162_322);
        assert_eq!(java_hash(""), 0);
        // Overflowing: "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(java_hash("polygenelubricants"), i32::MIN);
    }
}
