//! What librdkafka says, at levels an operator can act on.
//!
//! librdkafka reports a broker it cannot reach twice, as a log line and as
//! an error event, both at ERROR through rdkafka's default context, and
//! again every time it retries: a broker restart in a healthy cluster
//! filled the logs with ERROR lines for faults the client recovered from
//! by itself. Every client this crate makes goes through the rules here
//! instead:
//!
//! * an error event the client retries by itself (a broker unreachable,
//!   all brokers down, a name that does not resolve, a timeout) is a WARN,
//!   and the same event from the same broker is logged at most once per
//!   [`QUIET`], with a count of the ones left out;
//! * an error event the runtime meets again as a failed call (fencing, a
//!   fatal producer) is a WARN too: the runtime's own line says what it
//!   does about it;
//! * anything else the client reports as an error (authentication, TLS,
//!   a configuration the cluster refuses) is an ERROR, also at most once
//!   per [`QUIET`];
//! * librdkafka's own log lines are at most WARN (at most once per
//!   [`QUIET`] per kind), and the connection-failure line that accompanies
//!   each such error event is DEBUG, so one event makes one line.
//!
//! [`ClientLogs`] is the client context that does this for clients with
//! nothing else to do (administration, lookups); the runtime's own
//! contexts call `client_log` and `client_error`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, error, info, warn};

/// The shortest time between two lines about the same kind of event.
pub const QUIET: Duration = Duration::from_secs(10);

/// A client context that logs librdkafka's events by the rules of this
/// module, for clients that need no other context (the admin and lookup
/// clients of [`KafkaCluster`](crate::KafkaCluster)).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientLogs;

impl ClientContext for ClientLogs {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        client_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client_error(&error, reason);
    }
}

impl ConsumerContext for ClientLogs {}

impl rdkafka::producer::ProducerContext for ClientLogs {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// How an error event reads to an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventClass {
    /// The client retries it by itself; the cluster recovers from it.
    Retried,
    /// The runtime meets it again as a failed call and says what it does.
    Surfaced,
    /// Nothing retries it: someone has to act.
    Actionable,
}

/// Sorts a librdkafka error event.
pub(crate) fn event_class(code: Option<RDKafkaErrorCode>) -> EventClass {
    use RDKafkaErrorCode as C;
    match code {
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::OperationTimedOut
            | C::TimedOutQueue
            | C::MessageTimedOut
            | C::RequestTimedOut
            | C::NetworkException
            | C::BrokerNotAvailable
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::CoordinatorNotAvailable
            | C::CoordinatorLoadInProgress
            | C::NotCoordinator
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::KafkaStorageError
            | C::ConcurrentTransactions
            | C::PartitionEOF
            | C::AutoOffsetReset,
        ) => EventClass::Retried,
        Some(
            C::Fatal
            | C::Fenced
            | C::ProducerFenced
            | C::InvalidProducerEpoch
            | C::State
            | C::FencedInstanceId
            | C::UnknownMemberId
            | C::FencedMemberEpoch
            | C::StaleMemberEpoch
            | C::IllegalGeneration
            | C::RebalanceInProgress
            | C::UnreleasedInstanceId
            | C::PurgeQueue
            | C::PurgeInflight,
        ) => EventClass::Surfaced,
        _ => EventClass::Actionable,
    }
}

/// The broker an event's reason names (librdkafka starts it with
/// `host:port/id: ` or `GroupCoordinator: ...`), so events from different
/// brokers are limited apart.
fn source(reason: &str) -> &str {
    reason.split(": ").next().unwrap_or("")
}

/// Logs librdkafka's error event `error` (with its `reason`) by the rules
/// of the module.
pub(crate) fn client_error(error: &KafkaError, reason: &str) {
    let code = error.rdkafka_error_code();
    let class = event_class(code);
    let key = format!("error {code:?} {}", source(reason));
    limited(&key, |left_out| match class {
        EventClass::Retried => {
            warn!(%error, reason, left_out, "Kafka client: a broker is unreachable, moving or busy; the client retries by itself");
        }
        EventClass::Surfaced => {
            warn!(%error, reason, left_out, "Kafka client error event (the runtime meets it as a failed call and handles it there)");
        }
        EventClass::Actionable => {
            error!(%error, reason, left_out, "Kafka client error");
        }
    });
}

/// Logs one of librdkafka's own log lines by the rules of the module.
pub(crate) fn client_log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    use RDKafkaLogLevel as L;
    match level {
        // The line that goes with a connection's error event: the event
        // is the one logged.
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning if fac == "FAIL" => {
            debug!(fac, message, "librdkafka");
        }
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
            limited(&format!("log {fac}"), |left_out| {
                warn!(fac, message, left_out, "librdkafka");
            });
        }
        L::Notice => info!(fac, message, "librdkafka"),
        L::Info | L::Debug => debug!(fac, message, "librdkafka"),
    }
}

/// Calls `emit` with the number of lines left out since the last one, or
/// leaves this one out if the last line for `key` was less than [`QUIET`]
/// ago.
fn limited(key: &str, emit: impl FnOnce(u64)) {
    static LAST: OnceLock<Mutex<HashMap<String, (Instant, u64)>>> = OnceLock::new();
    let now = Instant::now();
    let left_out = {
        let mut last = LAST
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match last.get_mut(key) {
            Some((at, skipped)) if now.duration_since(*at) < QUIET => {
                *skipped += 1;
                return;
            }
            Some(entry) => std::mem::replace(entry, (now, 0)).1,
            None => {
                last.insert(key.to_owned(), (now, 0));
                0
            }
        }
    };
    emit(left_out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    #[test]
    fn events_the_client_retries_are_never_actionable() {
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::Resolve,
            C::OperationTimedOut,
            C::CoordinatorNotAvailable,
            C::NotCoordinator,
        ] {
            assert_eq!(event_class(Some(code)), EventClass::Retried, "{code:?}");
        }
        for code in [C::Fatal, C::Fenced, C::ProducerFenced] {
            assert_eq!(event_class(Some(code)), EventClass::Surfaced, "{code:?}");
        }
        for code in [
            C::Authentication,
            C::SSL,
            C::TopicAuthorizationFailed,
            C::GroupAuthorizationFailed,
        ] {
            assert_eq!(event_class(Some(code)), EventClass::Actionable, "{code:?}");
        }
    }

    #[test]
    fn one_line_per_kind_of_event_per_quiet_period() {
        let key = "test key one_line_per_kind";
        let mut lines = Vec::new();
        for _ in 0..5 {
            limited(key, |left_out| lines.push(left_out));
        }
        assert_eq!(lines, [0], "the first is logged, the others left out");
        limited("test key another kind", |left_out| lines.push(left_out));
        assert_eq!(lines, [0, 0], "another kind is logged");
    }

    #[test]
    fn the_source_of_an_event_is_its_broker() {
        assert_eq!(
            source("127.0.0.1:49100/1: Connect to ipv4#127.0.0.1:49100 failed"),
            "127.0.0.1:49100/1"
        );
        assert_eq!(
            source("GroupCoordinator: 127.0.0.1:49100: Connect"),
            "GroupCoordinator"
        );
    }
}
