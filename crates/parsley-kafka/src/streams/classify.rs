//! What a failed record, or a failed step of a transaction, means: a pure
//! sorting of librdkafka's error codes and flags into the worker's fault
//! classes. Nothing here decides what follows; the worker does
//! ([`Worker::on_fault`]).
//!
//! The one distinction that matters most is between a record the cluster
//! refuses for what it *is* (too large, invalid, against a policy), which
//! fails the same way on every retry and goes to the production error
//! handler, and a record that could not be written *now* (a leader moving,
//! a broker down, too few in-sync replicas, a timeout while any of these
//! lasted), which is written by retrying the transaction. Taking the
//! second for the first sends a valid emission to a dead-letter topic for
//! good, or stops a task over a broker hiccup.

use super::*;
use parsley::task::EmissionOrigin;
use rdkafka::types::RDKafkaErrorCode;

/// What one record's failure says about the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum RecordClass {
    /// It could not be written now; a retry of the transaction writes it.
    Transient,
    /// The cluster refuses the record itself; a retry fails the same way.
    Refused,
    /// The client cannot go on (authorization, an unsupported request, a
    /// fatal producer state).
    Fatal,
    /// The producer was fenced: its epoch is stale.
    Fenced,
}

/// Sorts one record's error code (a delivery report's, or the one a send
/// returned at once).
///
/// Codes this list does not name count as [`RecordClass::Fatal`]: an
/// error nobody foresaw fails loudly, and never sends a record to a
/// dead-letter topic on a guess.
pub(super) fn record_class(code: RDKafkaErrorCode) -> RecordClass {
    use RDKafkaErrorCode as C;
    match code {
        // The record itself.
        C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::MessageBatchTooLarge
        | C::InvalidRecord
        | C::InvalidTimestamp
        | C::PolicyViolation
        | C::UnsupportedForMessageFormat
        | C::KeySerialization
        | C::ValueSerialization => RecordClass::Refused,
        // A batch-mate of a record the broker refused (KIP-467): this one
        // is valid, and is written when the transaction is retried without
        // the refused one.
        C::InvalidDifferentRecord => RecordClass::Transient,
        // Now, not the record: leaders and coordinators moving, brokers
        // down or slow, replicas out of sync, and the local timeout that
        // any of these ends in.
        C::MessageTimedOut
        | C::OperationTimedOut
        | C::TimedOutQueue
        | C::RequestTimedOut
        | C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::NetworkException
        | C::BrokerNotAvailable
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::ReplicaNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::EligibleLeadersNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::ISRInsufficient
        | C::KafkaStorageError
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::ConcurrentTransactions
        | C::ThrottlingQuotaExceeded
        | C::QueueFull
        | C::InvalidMessage
        // librdkafka's idempotence bookkeeping after a lost response: the
        // transaction must be aborted, and its retry writes the records.
        | C::OutOfOrderSequenceNumber
        | C::DuplicateSequenceNumber
        | C::UnknownProducerId
        // A topic or partition the metadata has not caught up with yet
        // (a sink exists: the runtime checks every sink before it starts).
        | C::UnknownTopicOrPartition
        | C::UnknownTopicId
        | C::UnknownPartition
        | C::UnknownTopic => RecordClass::Transient,
        C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch | C::TransactionCoordinatorFenced => {
            RecordClass::Fenced
        }
        _ => RecordClass::Fatal,
    }
}

/// The fault a record failure is, for the worker. `record` is its index in
/// the transaction; `place` where it went (topic, partition) and the
/// delivery that made it, when known.
pub(super) fn record_fault(
    class: RecordClass,
    record: usize,
    place: Option<(&str, i32, Option<EmissionOrigin>)>,
    reason: String,
) -> Fault {
    let at = place.map_or_else(String::new, |(t, p, _)| format!("{t}:{p}"));
    match (class, place) {
        (RecordClass::Refused, Some((topic, partition, origin))) => Fault::RecordRefused {
            record,
            topic: topic.to_owned(),
            partition,
            origin,
            reason,
        },
        (RecordClass::Refused | RecordClass::Fatal, _) => {
            Fault::Fatal(format!("record {record} for {at}: {reason}"))
        }
        (RecordClass::Transient, _) => Fault::Transient(format!(
            "record {record} for {at} could not be written now: {reason}"
        )),
        (RecordClass::Fenced, _) => Fault::ProducerFenced(reason),
    }
}

/// Sorts a failed step of the transaction (begin, send offsets, the
/// delivery wait, commit) by librdkafka's own flags: fencing codes first,
/// then fatal, abortable and retriable. A transaction error with none of
/// them (a call in the wrong state) counts as fatal. The delivery wait
/// running out (records still unacknowledged after the request timeout)
/// is transient: the abort purges them, and the retry writes them.
pub(super) fn step_fault(e: &KafkaError) -> Fault {
    use RDKafkaErrorCode::{
        Fenced, InvalidProducerEpoch, OperationTimedOut, ProducerFenced,
        TransactionCoordinatorFenced,
    };
    let message = e.to_string();
    if matches!(
        e.rdkafka_error_code(),
        Some(Fenced | ProducerFenced | InvalidProducerEpoch | TransactionCoordinatorFenced)
    ) {
        return Fault::ProducerFenced(message);
    }
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => Fault::Fatal(message),
        KafkaError::Transaction(t) if t.txn_requires_abort() => Fault::Abortable(message),
        KafkaError::Transaction(t) if t.is_retriable() => Fault::Retriable(message),
        KafkaError::Flush(OperationTimedOut) => Fault::Transient(message),
        _ => Fault::Fatal(message),
    }
}

/// What a producer that reports a fatal error (`rd_kafka_fatal_error`) has
/// lost. Its idempotence state (sequence numbers out of step with a
/// broker after requests timed out on a leader that failed, a producer id
/// the broker no longer knows) or its epoch is gone for good in this
/// producer, but not in a new one with the same transactional id: its
/// initialisation bumps the epoch and aborts whatever was open, so the
/// records in doubt are aborted, never written twice. Those are answered
/// as a fenced producer is (the producer replaced, the membership kept).
/// Anything else fatal (authorization, an unsupported request) stays
/// fatal: a new producer would meet it again.
pub(super) fn fatal_producer_fault(
    code: RDKafkaErrorCode,
    reason: &str,
    otherwise: Fault,
) -> Fault {
    use RDKafkaErrorCode as C;
    match code {
        C::OutOfOrderSequenceNumber
        | C::DuplicateSequenceNumber
        | C::UnknownProducerId
        | C::InvalidProducerIdMapping
        | C::GaplessGuarantee
        | C::InvalidProducerEpoch
        | C::ProducerFenced
        | C::Fenced => Fault::ProducerFenced(format!(
            "the producer's state is lost ({code:?}: {reason}); a new producer starts afresh"
        )),
        _ => otherwise,
    }
}

/// The fault a failed abort is: retriable when librdkafka says the call
/// may succeed if made again (its coordinator unreachable or moving, a
/// timeout), fenced when the coordinator already moved past this
/// producer's epoch.
pub(super) fn abort_fault(e: &KafkaError) -> Fault {
    let message = e.to_string();
    match step_fault(e) {
        Fault::ProducerFenced(m) => Fault::ProducerFenced(m),
        _ => Fault::AbortFailed {
            retriable: matches!(e, KafkaError::Transaction(t) if t.is_retriable() && !t.is_fatal()),
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    /// One assertion per code a delivery report or a send is seen to
    /// carry: a broker that is down, moving or short of replicas never
    /// refuses a record, and a record the cluster refuses for itself is
    /// never retried as if it were the broker's moment.
    #[test]
    fn each_record_error_code_has_its_class() {
        let refused = [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::MessageBatchTooLarge,
            C::InvalidRecord,
            C::InvalidTimestamp,
            C::PolicyViolation,
            C::UnsupportedForMessageFormat,
            C::KeySerialization,
            C::ValueSerialization,
        ];
        let transient = [
            C::InvalidDifferentRecord,
            C::MessageTimedOut,
            C::OperationTimedOut,
            C::TimedOutQueue,
            C::RequestTimedOut,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::Resolve,
            C::NetworkException,
            C::BrokerNotAvailable,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::ReplicaNotAvailable,
            C::PreferredLeaderNotAvailable,
            C::EligibleLeadersNotAvailable,
            C::FencedLeaderEpoch,
            C::UnknownLeaderEpoch,
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::ISRInsufficient,
            C::KafkaStorageError,
            C::CoordinatorLoadInProgress,
            C::CoordinatorNotAvailable,
            C::NotCoordinator,
            C::ConcurrentTransactions,
            C::ThrottlingQuotaExceeded,
            C::QueueFull,
            C::InvalidMessage,
            C::OutOfOrderSequenceNumber,
            C::DuplicateSequenceNumber,
            C::UnknownProducerId,
            C::UnknownTopicOrPartition,
            C::UnknownTopicId,
            C::UnknownPartition,
            C::UnknownTopic,
        ];
        let fenced = [
            C::Fenced,
            C::ProducerFenced,
            C::InvalidProducerEpoch,
            C::TransactionCoordinatorFenced,
        ];
        let fatal = [
            C::Fatal,
            C::State,
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::TransactionalIdAuthorizationFailed,
            C::UnsupportedVersion,
            C::InvalidTopic,
            C::InvalidRequiredAcks,
            C::InvalidTransactionalState,
            C::SaslAuthenticationFailed,
            C::Authentication,
            C::Unknown,
            C::InvalidArgument,
        ];
        for (codes, class) in [
            (&refused[..], RecordClass::Refused),
            (&transient[..], RecordClass::Transient),
            (&fenced[..], RecordClass::Fenced),
            (&fatal[..], RecordClass::Fatal),
        ] {
            for &code in codes {
                assert_eq!(record_class(code), class, "{code:?}");
            }
        }
    }

    fn outgoing() -> (&'static str, i32, Option<EmissionOrigin>) {
        ("sink", 2, None)
    }

    /// Only a refused record of the transaction reaches the worker as a
    /// refused record (and so the production error handler); a timed-out
    /// one is a transient fault that names it.
    #[test]
    fn only_a_refused_record_is_reported_as_refused() {
        let r = outgoing();
        match record_fault(RecordClass::Refused, 3, Some(r), "too large".into()) {
            Fault::RecordRefused {
                record,
                topic,
                partition,
                ..
            } => assert_eq!((record, topic.as_str(), partition), (3, "sink", 2)),
            other => panic!("{other:?}"),
        }
        match record_fault(
            RecordClass::Transient,
            3,
            Some(r),
            "Message production error: MessageTimedOut".into(),
        ) {
            Fault::Transient(m) => {
                assert!(m.contains("sink:2") && m.contains("MessageTimedOut"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            record_fault(RecordClass::Fenced, 0, Some(r), "fenced".into()),
            Fault::ProducerFenced(_)
        ));
        assert!(matches!(
            record_fault(RecordClass::Fatal, 0, Some(r), "denied".into()),
            Fault::Fatal(_)
        ));
        // A refusal no record of the transaction can be blamed for.
        assert!(matches!(
            record_fault(RecordClass::Refused, 9, None, "too large".into()),
            Fault::Fatal(_)
        ));
    }

    /// A producer whose sequence state or id is lost (what a broker that
    /// died with requests in flight leaves behind) is replaced; one that
    /// is not allowed to write stays fatal.
    #[test]
    fn a_producer_that_lost_its_state_is_replaced_and_a_refused_one_fails() {
        let fatal = || Fault::Fatal("fatal".into());
        for code in [
            C::OutOfOrderSequenceNumber,
            C::DuplicateSequenceNumber,
            C::UnknownProducerId,
            C::InvalidProducerIdMapping,
            C::GaplessGuarantee,
            C::InvalidProducerEpoch,
            C::ProducerFenced,
            C::Fenced,
        ] {
            assert!(
                matches!(
                    fatal_producer_fault(code, "x", fatal()),
                    Fault::ProducerFenced(_)
                ),
                "{code:?}"
            );
        }
        for code in [
            C::TransactionalIdAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::TopicAuthorizationFailed,
            C::UnsupportedVersion,
            C::InvalidTransactionTimeout,
            C::Fatal,
        ] {
            assert!(
                matches!(fatal_producer_fault(code, "x", fatal()), Fault::Fatal(_)),
                "{code:?}"
            );
        }
    }

    #[test]
    fn a_delivery_wait_that_runs_out_is_transient_and_fencing_is_fencing() {
        assert!(matches!(
            step_fault(&KafkaError::Flush(C::OperationTimedOut)),
            Fault::Transient(_)
        ));
        assert!(matches!(
            step_fault(&KafkaError::MessageProduction(C::ProducerFenced)),
            Fault::ProducerFenced(_)
        ));
        assert!(matches!(
            abort_fault(&KafkaError::MessageProduction(C::InvalidProducerEpoch)),
            Fault::ProducerFenced(_)
        ));
        assert!(matches!(
            abort_fault(&KafkaError::Flush(C::OperationTimedOut)),
            Fault::AbortFailed {
                retriable: false,
                ..
            }
        ));
    }
}
