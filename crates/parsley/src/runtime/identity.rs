//! Stable identities derived from names.
//!
//! A stage task's sender identity (the `vc-sender` header, and the sender
//! named by its sequence claims) must survive restarts, redeployments and
//! topology changes, so it is derived from names the application keeps
//! stable: a name-based (version 5) UUID of `"<applicationId>/<stage>/<partition>"`
//! under [`SENDER_NAMESPACE`]. Neither the application id nor a stage name
//! can contain `/`, so distinct tasks never share an input string. Every
//! host (the test driver, the Kafka runtime) uses [`sender_id`].

use std::fmt;

use parsley_protocol::{SenderId, TopicId};
use uuid::Uuid;

/// The namespace UUID of sender identities. Fixed forever: changing it
/// changes every task's sender id.
pub const SENDER_NAMESPACE: Uuid = Uuid::from_u128(0x5a1e_7c3b_9f04_4d8e_a6b2_3c91_0e7d_f458);

/// The namespace UUID of the test driver's topic identities.
pub const TEST_TOPIC_NAMESPACE: Uuid = Uuid::from_u128(0x0c6f_2e19_b7a3_4f60_8d15_e2a4_96cb_7d03);

/// The sender identity of task `partition` of `stage` in `application_id`.
///
/// ```
/// use parsley::identity::sender_id;
/// let a = sender_id("payments", "balances", 0);
/// assert_eq!(a, sender_id("payments", "balances", 0));
/// assert_ne!(a, sender_id("payments", "balances", 1));
/// assert_ne!(a, sender_id("payments", "ledger", 0));
/// ```
pub fn sender_id(application_id: &str, stage: &str, partition: i32) -> SenderId {
    let name = format!("{application_id}/{stage}/{partition}");
    SenderId::from(Uuid::new_v5(&SENDER_NAMESPACE, name.as_bytes()))
}

/// The topic identity the test driver gives incarnation `incarnation` of
/// the topic `name`: a version 5 UUID of `"<name>#<incarnation>"` under
/// [`TEST_TOPIC_NAMESPACE`]. A real cluster assigns random ids instead; the
/// driver derives them so that runs are reproducible.
pub fn test_topic_id(name: &str, incarnation: u32) -> TopicId {
    let input = format!("{name}#{incarnation}");
    TopicId::from(Uuid::new_v5(&TEST_TOPIC_NAMESPACE, input.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_ids_are_pinned() {
        // Pinned so that an accidental change of the derivation (namespace,
        // separator, formatting) fails loudly: a changed sender id makes
        // every restarted task a stranger to its own earlier sends.
        assert_eq!(
            sender_id("payments", "balances", 0).to_string(),
            "6701d389-138f-54ef-833c-4bfd3fb9ffd8"
        );
        let id = sender_id("app", "stage", 3);
        assert_eq!(id.to_uuid().get_version_num(), 5);
        assert_eq!(id.to_string(), PINNED_APP_STAGE_3);
    }

    // Computed independently with Python's `uuid.uuid5` from the namespace
    // and input strings above.
    const PINNED_APP_STAGE_3: &str = "a84c6b41-eacf-5ddf-bde6-dbd2648da353";

    #[test]
    fn topic_ids_differ_per_incarnation() {
        assert_ne!(test_topic_id("t", 0), test_topic_id("t", 1));
        assert_eq!(
            test_topic_id("orders", 0).to_string(),
            "617623ee-e6a3-5ddf-b348-9338c5e08323"
        );
        assert_eq!(test_topic_id("t", 0), test_topic_id("t", 0));
    }
}

/// A task: a stage and the partition number it consumes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TaskId {
    /// The stage name.
    pub stage: String,
    /// The partition number.
    pub partition: i32,
}

impl fmt::Display for TaskId {
    /// `stage[partition]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.stage, self.partition)
    }
}
