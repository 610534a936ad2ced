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
    let specs: Vec<ResourceSpecifier<'_>> = brokers
        .iter()
        .map(|id| ResourceSpecifier::Broker(*id))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let answers = match block_on(admin.describe_configs(specs.iter(), &opts)) {
        Ok(answers) => answers,
        Err(e) => return Offered::Unknown(e.to_string()),
    };
    let mut common: Option<BTreeSet<String>> = None;
    for answer in answers {
        let resource = match answer {
            Ok(resource) => resource,
            Err(code) => return Offered::Unknown(format!("DescribeConfigs: {code}")),
        };
        let Some(listed) = resource
            .get(PROTOCOLS_SETTING)
            .and_then(|entry| entry.value.clone())
        else {
            return Offered::NotReported;
        };
        let set = parse_list(&listed);
        common = Some(match common {
            None => set,
            Some(before) => before.intersection(&set).cloned().collect(),
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

/// The protocol the stream threads use, and why, from what the user asked
/// for and what the cluster offers. An explicit choice is kept, except a
/// consumer protocol the brokers say they do not serve, which is refused
/// with [`StreamsError::GroupProtocolUnsupported`]. Left to the cluster,
/// the consumer protocol is taken where every broker serves it, and the
/// classic one otherwise (it works on every broker).
pub(crate) fn choose(
    asked: GroupProtocol,
    offered: &Offered,
) -> Result<(GroupProtocol, String), StreamsError> {
    match (asked, offered.consumer()) {
        (GroupProtocol::Classic, _) => Ok((
            GroupProtocol::Classic,
            "StreamsOptions::group_protocol asks for it".to_owned(),
        )),
        (GroupProtocol::Consumer, Some(false)) => Err(StreamsError::GroupProtocolUnsupported {
            offered: offered.describe(),
        }),
        (GroupProtocol::Consumer, _) => Ok((
            GroupProtocol::Consumer,
            format!(
                "StreamsOptions::group_protocol asks for it; {}",
                offered.describe()
            ),
        )),
        (GroupProtocol::Auto, Some(true)) => Ok((
            GroupProtocol::Consumer,
            format!("chosen by the cluster: {}", offered.describe()),
        )),
        (GroupProtocol::Auto, Some(false)) => Ok((
            GroupProtocol::Classic,
            format!(
                "chosen by the cluster: {}, without the consumer protocol (Kafka 4.0 and later serve it)",
                offered.describe()
            ),
        )),
        (GroupProtocol::Auto, None) => Ok((
            GroupProtocol::Classic,
            format!(
                "{}: the classic protocol, which every broker serves",
                offered.describe()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(s: &str) -> Offered {
        Offered::Listed(parse_list(s))
    }

    #[test]
    fn left_to_the_cluster_the_consumer_protocol_is_taken_where_every_broker_serves_it() {
        let chosen = |o: &Offered| choose(GroupProtocol::Auto, o).unwrap().0;
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
            match choose(GroupProtocol::Consumer, &offered) {
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
                choose(GroupProtocol::Consumer, &offered).unwrap().0,
                GroupProtocol::Consumer
            );
        }
    }

    #[test]
    fn an_explicit_classic_protocol_is_kept_whatever_the_cluster_serves() {
        for offered in [
            listed("classic,consumer"),
            listed("classic"),
            Offered::NotReported,
            Offered::Unknown("x".to_owned()),
        ] {
            assert_eq!(
                choose(GroupProtocol::Classic, &offered).unwrap().0,
                GroupProtocol::Classic
            );
        }
    }
}
