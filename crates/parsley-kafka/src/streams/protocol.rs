//! Which consumer group protocol the stream threads use, when the user
//! left it to the cluster ([`GroupProtocol::Auto`]), and the check that an
//! explicit [`GroupProtocol::Consumer`] is something the cluster offers.
//!
//! The question goes to the brokers' own configuration: each broker lists
//! the group protocols its coordinator serves in
//! `group.coordinator.rebalance.protocols` (Kafka 3.7 added the setting,
//! with `classic` alone by default; 4.0 and later list `consumer` too).
//! A member that asks a coordinator for a protocol it does not serve never
//! gets an assignment: the instance would wait in `Rebalancing` with no
//! word of why, which is what this check replaces.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_executor::block_on;
use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use tracing::{info, warn};

use super::GroupProtocol;
use crate::KafkaCluster;
use crate::error::StreamsError;

/// The broker setting that lists the group protocols a coordinator serves.
pub(crate) const PROTOCOLS_SETTING: &str = "group.coordinator.rebalance.protocols";

/// What the cluster's brokers say about the group protocols they serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Offered {
    /// Every broker answered: the protocols all of them list (a broker
    /// mid-upgrade that lacks one makes it missing here).
    Listed(BTreeSet<String>),
    /// A broker answered without the setting: Kafka before 3.7, whose
    /// coordinators serve the classic protocol only.
    NotReported,
    /// The brokers could not be asked (authorization, a timeout): why.
    Unknown(String),
}

impl Offered {
    fn consumer(&self) -> Option<bool> {
        match self {
            Offered::Listed(set) => Some(set.contains("consumer")),
            Offered::NotReported => Some(false),
            Offered::Unknown(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Offered::Listed(set) => format!(
                "its brokers list {PROTOCOLS_SETTING}={}",
                set.iter().cloned().collect::<Vec<_>>().join(",")
            ),
            Offered::NotReported => {
                format!("its brokers do not report {PROTOCOLS_SETTING} (Kafka before 3.7)")
            }
            Offered::Unknown(why) => {
                format!("its brokers' {PROTOCOLS_SETTING} could not be read ({why})")
            }
        }
    }
}

/// Asks every broker of the cluster which group protocols it serves.
pub(crate) fn offered(cluster: &KafkaCluster, timeout: Duration) -> Offered {
    let admin = cluster.admin();
    let brokers: Vec<i32> = match admin.inner().fetch_metadata(None, timeout) {
        Ok(md) => md.brokers().iter().map(|b| b.id()).collect(),
        Err(e) => return Offered::Unknown(format!("metadata: {e}")),
    };
    if brokers.is_empty() {
        return Offered::Unknown("the metadata names no broker".to_owned());
    }
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let mut answers = Vec::with_capacity(brokers.len());
    for request in requests(&brokers) {
        match block_on(admin.describe_configs(request.iter(), &opts)) {
            Ok(answer) => answers.extend(answer),
            Err(e) => return Offered::Unknown(e.to_string()),
        }
    }
    combine(answers.into_iter().map(|answer| {
        answer
            .map(|resource| {
                resource
                    .get(PROTOCOLS_SETTING)
                    .and_then(|entry| entry.value.clone())
            })
            .map_err(|code| format!("DescribeConfigs: {code}"))
    }))
}

/// The DescribeConfigs requests that ask `brokers` for their settings: one
/// per broker, because librdkafka refuses a request that names more than
/// one broker resource (`ERR__CONFLICT`, "Conflicting use"), which made
/// every cluster of two or more brokers fall back to the classic protocol.
fn requests(brokers: &[i32]) -> Vec<[ResourceSpecifier<'static>; 1]> {
    brokers
        .iter()
        .map(|id| [ResourceSpecifier::Broker(*id)])
        .collect()
}

/// What the brokers serve together, from each broker's answer: its
/// setting's value (`None`: the broker does not report it), or why it
/// could not answer. A protocol counts only if every broker lists it,
/// since any of them may coordinate the group.
fn combine(answers: impl IntoIterator<Item = Result<Option<String>, String>>) -> Offered {
    let mut common: Option<BTreeSet<String>> = None;
    for answer in answers {
        let listed = match answer {
            Ok(Some(listed)) => parse_list(&listed),
            Ok(None) => return Offered::NotReported,
            Err(why) => return Offered::Unknown(why),
        };
        common = Some(match common {
            None => listed,
            Some(before) => before.intersection(&listed).cloned().collect(),
        });
    }
    common.map_or_else(
        || Offered::Unknown("no broker answered".to_owned()),
        Offered::Listed,
    )
}

fn parse_list(value: &str) -> BTreeSet<String> {
    value
        .split(',')
        .map(|p| p.trim().to_ascii_lowercase())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The protocol the stream threads use, and why.
#[derive(Debug)]
pub(crate) struct Choice {
    /// Never [`GroupProtocol::Auto`].
    pub(crate) protocol: GroupProtocol,
    reason: String,
    /// Left to the cluster, which could not be asked.
    blind: bool,
}

impl Choice {
    /// Says which protocol was taken and why, once: at INFO, or at WARN
    /// when the cluster could not be asked (a 4.x cluster would have served
    /// the consumer protocol).
    pub(crate) fn log(&self) {
        let group_protocol = self.protocol.name().unwrap_or("classic");
        let reason = &self.reason;
        if self.blind {
            warn!(group_protocol, %reason, "consumer group protocol chosen without the brokers' answer; StreamsOptions::group_protocol names one explicitly");
        } else {
            info!(group_protocol, %reason, "consumer group protocol");
        }
    }
}

/// The protocol the stream threads use, from what the user asked for and
/// what the cluster offers (asked only when that matters: not for an
/// explicit classic protocol). An explicit choice is kept, except a
/// consumer protocol the brokers say they do not serve, which is refused
/// with [`StreamsError::GroupProtocolUnsupported`]. Left to the cluster,
/// the consumer protocol is taken where every broker serves it, and the
/// classic one otherwise (it works on every broker).
pub(crate) fn choose(
    asked: GroupProtocol,
    offered: impl FnOnce() -> Offered,
) -> Result<Choice, StreamsError> {
    let choice = |protocol, reason| Choice {
        protocol,
        reason,
        blind: false,
    };
    if asked == GroupProtocol::Classic {
        return Ok(choice(
            GroupProtocol::Classic,
            "StreamsOptions::group_protocol asks for it".to_owned(),
        ));
    }
    let offered = offered();
    Ok(match (asked, offered.consumer()) {
        (GroupProtocol::Consumer, Some(false)) => {
            return Err(StreamsError::GroupProtocolUnsupported {
                offered: offered.describe(),
            });
        }
        (GroupProtocol::Consumer, _) => choice(
            GroupProtocol::Consumer,
            format!(
                "StreamsOptions::group_protocol asks for it; {}",
                offered.describe()
            ),
        ),
        (_, Some(true)) => choice(
            GroupProtocol::Consumer,
            format!("chosen by the cluster: {}", offered.describe()),
        ),
        (_, Some(false)) => choice(
            GroupProtocol::Classic,
            format!(
                "chosen by the cluster: {}, without the consumer protocol (Kafka 4.0 and later serve it)",
                offered.describe()
            ),
        ),
        (_, None) => Choice {
            protocol: GroupProtocol::Classic,
            reason: format!(
                "{}: the classic protocol, which every broker serves",
                offered.describe()
            ),
            blind: true,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_broker_is_asked_in_a_request_of_its_own() {
        let asked = requests(&[3, 1, 2]);
        assert_eq!(asked.len(), 3);
        for (request, id) in asked.iter().zip([3, 1, 2]) {
            assert!(
                matches!(request, [ResourceSpecifier::Broker(b)] if *b == id),
                "{request:?}"
            );
        }
        assert!(requests(&[]).is_empty());
    }

    fn listed(s: &str) -> Offered {
        Offered::Listed(parse_list(s))
    }

    #[test]
    fn left_to_the_cluster_the_consumer_protocol_is_taken_where_every_broker_serves_it() {
        let chosen = |o: &Offered| choose(GroupProtocol::Auto, || o.clone()).unwrap().protocol;
        assert_eq!(
            chosen(&listed("classic,consumer,streams")),
            GroupProtocol::Consumer
        );
        assert_eq!(
            chosen(&listed(" Classic , CONSUMER")),
            GroupProtocol::Consumer
        );
        // Kafka 3.7 to 3.9 list the classic protocol alone by default.
        assert_eq!(chosen(&listed("classic")), GroupProtocol::Classic);
        assert_eq!(chosen(&Offered::NotReported), GroupProtocol::Classic);
        // Brokers that could not be asked: the protocol every one serves.
        assert_eq!(
            chosen(&Offered::Unknown("denied".to_owned())),
            GroupProtocol::Classic
        );
    }

    #[test]
    fn an_explicit_consumer_protocol_the_cluster_does_not_serve_is_refused_with_its_reason() {
        for offered in [listed("classic"), Offered::NotReported] {
            match choose(GroupProtocol::Consumer, || offered.clone()) {
                Err(e @ StreamsError::GroupProtocolUnsupported { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("4.0"), "{text}");
                    assert!(text.contains("GroupProtocol::Classic"), "{text}");
                    assert!(text.contains(PROTOCOLS_SETTING), "{text}");
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // Served, or not known either way: the user's choice stands.
        for offered in [
            listed("classic,consumer"),
            Offered::Unknown("timed out".to_owned()),
        ] {
            assert_eq!(
                choose(GroupProtocol::Consumer, || offered)
                    .unwrap()
                    .protocol,
                GroupProtocol::Consumer
            );
        }
    }

    #[test]
    fn a_protocol_counts_only_when_every_broker_lists_it() {
        let some = |v: &str| Ok(Some(v.to_owned()));
        // Mid-upgrade: one broker without the consumer protocol.
        assert_eq!(
            combine([some("classic,consumer"), some("classic")]),
            listed("classic")
        );
        assert_eq!(
            combine([some("classic,consumer,streams"), some("consumer,classic")]),
            listed("classic,consumer")
        );
        assert_eq!(
            combine([some("classic,consumer"), Ok(None)]),
            Offered::NotReported
        );
        assert!(matches!(
            combine([some("classic,consumer"), Err("denied".to_owned())]),
            Offered::Unknown(_)
        ));
        assert!(matches!(combine([]), Offered::Unknown(_)));
    }

    #[test]
    fn an_explicit_classic_protocol_is_kept_without_asking_the_cluster() {
        let c = choose(GroupProtocol::Classic, || {
            panic!("the brokers are not asked for an explicit classic protocol")
        })
        .unwrap();
        assert_eq!(c.protocol, GroupProtocol::Classic);
        assert!(!c.blind);
    }

    #[test]
    fn only_a_choice_left_to_a_cluster_that_could_not_be_asked_is_blind() {
        let blind = |asked, o: Offered| choose(asked, || o).unwrap().blind;
        assert!(blind(
            GroupProtocol::Auto,
            Offered::Unknown("denied".to_owned())
        ));
        assert!(!blind(GroupProtocol::Auto, listed("classic")));
        assert!(!blind(GroupProtocol::Auto, Offered::NotReported));
        assert!(!blind(
            GroupProtocol::Consumer,
            Offered::Unknown("denied".to_owned())
        ));
    }
}
