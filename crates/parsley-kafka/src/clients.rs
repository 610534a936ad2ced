//! Plain Kafka clients in a causal topology: [`CausalClock`] gives an
//! rdkafka producer the same stamps a stage writes, and [`read_causal`]
//! reads the causal headers of any consumed record.
//!
//! This module needs no stage runtime: build `parsley-kafka` with
//! `default-features = false` and an application that runs no stage links
//! only the protocol core and rdkafka.
//!
//! A plain consumer needs nothing to read a causal topology: the causal
//! headers are ordinary headers it may ignore. A consumer that wants
//! causal *delivery order* is a stage; run it as one.

use std::collections::BTreeMap;
use std::time::Duration;

use parsley_protocol::headers::{CLOCK_HEADER, CausalHeaders, CorruptHeader};
use parsley_protocol::{Channel, TopicId, VectorClock};
use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

pub use parsley_protocol::headers::{
    SENDER_HEADER, SEQ_HEADER, SenderTag, decode_sender, decode_seq,
};

use crate::topic_ids::{self, Described};

/// Why a clock operation failed. Nothing is folded when one does.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    /// A consumed record's causal headers are corrupt: folding it as "no
    /// claim" would let its effects overtake its causes.
    #[error("record {topic}:{partition}@{offset} has corrupt causal headers: {cause}")]
    Corrupt {
        /// The record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// What is wrong.
        cause: CorruptHeader,
    },
    /// A topic's id could not be resolved.
    #[error("topic {topic:?} could not be resolved to its id: {message}")]
    TopicId {
        /// The topic.
        topic: String,
        /// Why.
        message: String,
    },
    /// The headers to stamp already carry a `vc`.
    #[error("the headers already carry a `vc` header; stamp a record once")]
    AlreadyStamped,
    /// The admin client could not be created.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// Reads a consumed record's causal headers strictly: the clock (empty when
/// the record carries no `vc`) and the sender tag of a stage's output.
pub fn read_causal<M: Message>(message: &M) -> Result<CausalHeaders, CorruptHeader> {
    let headers = message.headers();
    CausalHeaders::decode(
        headers
            .into_iter()
            .flat_map(|h| h.iter())
            .map(|h| (h.key, h.value)),
    )
}

/// A running view of one producing thread's causal past: fold what it
/// consumed ([`observe`](Self::observe)) and what it produced
/// ([`record_produced`](Self::record_produced)), and
/// [`stamp`](Self::stamp) the next record with it.
///
/// ```no_run
/// use std::time::Duration;
/// use parsley_kafka::clients::CausalClock;
/// use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
/// use rdkafka::message::OwnedHeaders;
/// use rdkafka::ClientConfig;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut config = ClientConfig::new();
/// config.set("bootstrap.servers", "localhost:9092");
/// let mut clock = CausalClock::new(&config)?;
/// let producer: BaseProducer = config.create()?;
/// // for each consumed record `m` this one depends on: clock.observe(&m)?;
/// let headers = clock.stamp(OwnedHeaders::new())?;
/// producer.send(BaseRecord::to("orders").key("o-1").payload("...").headers(headers))
///     .map_err(|(e, _)| e)?;
/// producer.flush(Duration::from_secs(10))?;
/// // Sequential producer: fold the acknowledgement (from the delivery
/// // report) so the next send claims this one.
/// clock.record_produced("orders", 0, 41)?;
/// # Ok(()) }
/// ```
///
/// The sequential pattern (send, wait for the acknowledgement, fold it) is
/// what orders a producer's own sends across topics. A producer that does
/// not fold its acknowledgements still writes valid stamps; they just do
/// not claim its own earlier sends. A producer that stamps nothing claims
/// nothing: its records are delivered at once everywhere.
pub struct CausalClock {
    admin: AdminClient<crate::ClientLogs>,
    clock: VectorClock,
    ids: BTreeMap<String, TopicId>,
    timeout: Duration,
}

impl std::fmt::Debug for CausalClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalClock")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl CausalClock {
    /// An empty clock that resolves topic ids through an admin client made
    /// from `config` (bootstrap and security settings).
    pub fn new(config: &ClientConfig) -> Result<CausalClock, ClockError> {
        Ok(CausalClock {
            admin: config.create_with_context(crate::ClientLogs)?,
            clock: VectorClock::new(),
            ids: BTreeMap::new(),
            timeout: Duration::from_secs(30),
        })
    }

    /// The dependency clock so far.
    pub fn clock(&self) -> &VectorClock {
        &self.clock
    }

    fn topic_id(&mut self, topic: &str) -> Result<TopicId, ClockError> {
        if let Some(id) = self.ids.get(topic) {
            return Ok(*id);
        }
        let answer =
            topic_ids::describe(self.admin.inner(), &[topic], self.timeout).map_err(|e| {
                ClockError::TopicId {
                    topic: topic.to_owned(),
                    message: e.to_string(),
                }
            })?;
        match answer.get(topic) {
            Some(Described::Present { id, .. }) => {
                self.ids.insert(topic.to_owned(), *id);
                Ok(*id)
            }
            Some(Described::Absent) => Err(ClockError::TopicId {
                topic: topic.to_owned(),
                message: "the topic does not exist".to_owned(),
            }),
            None => Err(ClockError::TopicId {
                topic: topic.to_owned(),
                message: "no answer for it".to_owned(),
            }),
        }
    }

    /// Folds a consumed record: a claim on the record itself and every
    /// claim its `vc` carries. A corrupt causal header is an error and
    /// folds nothing.
    pub fn observe<M: Message>(&mut self, message: &M) -> Result<(), ClockError> {
        let causal = read_causal(message).map_err(|cause| ClockError::Corrupt {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            cause,
        })?;
        let id = self.topic_id(message.topic())?;
        self.clock.merge(&causal.clock);
        self.clock
            .claim_offset(Channel::new(id, message.partition()), message.offset());
        Ok(())
    }

    /// Folds an acknowledged send (the partition and offset of its delivery
    /// report), so the next stamp claims it.
    pub fn record_produced(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), ClockError> {
        let id = self.topic_id(topic)?;
        self.clock.claim_offset(Channel::new(id, partition), offset);
        Ok(())
    }

    /// `headers` with the dependency clock attached as `vc`. Refuses
    /// headers that carry one already.
    pub fn stamp(&self, headers: OwnedHeaders) -> Result<OwnedHeaders, ClockError> {
        if headers.iter().any(|h| h.key == CLOCK_HEADER) {
            return Err(ClockError::AlreadyStamped);
        }
        Ok(headers.insert(Header {
            key: CLOCK_HEADER,
            value: Some(&self.clock.encode()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    fn message(headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"k".to_vec()),
            "orders".to_owned(),
            Timestamp::NotAvailable,
            0,
            7,
            Some(headers),
        )
    }

    fn clock() -> CausalClock {
        // Nothing connects until a topic id is looked up.
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1");
        CausalClock::new(&config).unwrap()
    }

    #[test]
    fn a_corrupt_vc_is_an_error_and_folds_nothing() {
        let mut c = clock();
        let bad = message(OwnedHeaders::new().insert(Header {
            key: CLOCK_HEADER,
            value: Some(&[0xde, 0xad][..]),
        }));
        let err = c.observe(&bad).unwrap_err();
        assert!(
            matches!(&err, ClockError::Corrupt { topic, offset: 7, .. } if topic == "orders"),
            "{err}"
        );
        assert!(c.clock().is_empty());
        let half = message(OwnedHeaders::new().insert(Header {
            key: SENDER_HEADER,
            value: Some(&[0u8; 16][..]),
        }));
        assert!(matches!(c.observe(&half), Err(ClockError::Corrupt { .. })));
    }

    #[test]
    fn stamping_writes_the_clock_once() {
        let c = clock();
        let stamped = c.stamp(OwnedHeaders::new()).unwrap();
        let read = read_causal(&message(stamped.clone())).unwrap();
        assert_eq!(&read.clock, c.clock());
        assert!(matches!(c.stamp(stamped), Err(ClockError::AlreadyStamped)));
    }
}
