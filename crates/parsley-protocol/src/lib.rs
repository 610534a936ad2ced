//! # parsley-protocol
//!
//! The causal delivery protocol behind Parsley, as a deterministic state
//! machine: no I/O, no threads, no clock, no Kafka client. A host (the
//! simulator, the broker-less test driver, the Kafka runtime) feeds it fetched
//! records and consumer positions, asks it to stamp outgoing records, and
//! commits the state changes it hands back; the node answers with the records
//! that may now reach user logic, in causal order.
//!
//! The guarantee: a record is delivered only after every cause on a channel
//! this node consumes has been delivered here, and per-channel order is FIFO.
//! Nothing is ever skipped, reordered or released on a timeout; a record
//! whose cause has not arrived waits, and a state the node cannot trust is a
//! typed [`ProtocolError`].
//!
//! ## Map
//!
//! * [`ids`]: [`TopicId`], [`Channel`], [`SenderId`] and their canonical order.
//! * [`clock`]: [`VectorClock`] with offset and sequence claims, and its wire form.
//! * [`headers`]: the `vc`, `vc-sender`, `vc-seq` record headers.
//! * [`node`]: [`CausalNode`], the gate, hold queues, stamp and recovery,
//!   and the host contract.
//! * [`store`]: the keyed-bytes persistence seam and its layouts.
//! * [`broker`]: the broker-offset seam (end offsets, log starts).
//!
//! ## A minimal host loop
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use parsley_protocol::*;
//!
//! struct Broker;
//! impl BrokerOffsets for Broker {
//!     fn end_offsets(&self, topics: &BTreeSet<TopicId>)
//!         -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
//!         Ok(topics.iter().map(|&t| (t, TopicOffsets::Present(BTreeMap::from([(0, 0)])))).collect())
//!     }
//!     fn log_starts(&self, topics: &BTreeSet<TopicId>)
//!         -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
//!         self.end_offsets(topics)
//!     }
//! }
//!
//! let input = Channel::new(TopicId::from_u128(1), 0);
//! let output = Channel::new(TopicId::from_u128(2), 0);
//! let config = NodeConfig {
//!     sender: SenderId::from_u128(9),
//!     inputs: BTreeSet::from([input]),
//!     sinks: BTreeSet::from([output.topic]),
//! };
//! let mut store = MemStore::new();
//! let mut node = CausalNode::init(config, &store, &Broker)?.node;
//!
//! // A record with an empty clock is deliverable at once.
//! let record = InboundRecord {
//!     channel: input, offset: 0, timestamp: 0,
//!     key: None, value: Some(b"hello".to_vec()), headers: vec![],
//!     causal: CausalHeaders::default(),
//! };
//! let delivered = node.on_record(record)?;
//! assert_eq!(delivered.len(), 1);
//!
//! // Stamp what the user logic emitted, then commit the step's writes.
//! let stamp = node.prepare_send(output)?;
//! assert_eq!(stamp.clock.offset(input), Some(0));
//! store.apply(&node.take_writes());
//! # Ok::<(), ProtocolError>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod broker;
mod bytes;
pub mod clock;
mod error;
pub mod headers;
pub mod host;
pub mod ids;
pub mod node;
mod protocol;
mod record;
pub mod reset;
mod restore;
pub mod store;

pub use broker::{BrokerOffsets, BrokerOffsetsError, TopicOffsets};
pub use clock::{CorruptClock, OffsetClaim, SequenceClaim, VectorClock};
pub use error::ProtocolError;
pub use headers::{CausalHeaders, CorruptHeader, SenderTag};
pub use ids::{Channel, ParseIdError, SenderId, TopicId};
pub use node::{
    CausalNode, ChannelView, DeliveredMark, HeldHead, InitReport, Initialized, NodeConfig,
    NodeStats, PageKeys, PageRequest, TruncationReport, UnmetClaim,
};
pub use protocol::DeliveryProtocol;
pub use record::{Delivery, Header, InboundRecord};
pub use store::{
    KeyText, MemStore, StateKey, SteppedPast, StoreRead, WriteBatch, WriteBatchIntoIter,
};
