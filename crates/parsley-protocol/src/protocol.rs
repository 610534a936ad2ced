//! The host-facing surface, as a trait.
//!
//! [`CausalNode`] is the implementation every real host uses. The trait
//! exists so that a host can be written once and driven with another
//! implementation: the conformance kit's reference host runs a deliberately
//! broken protocol through exactly the same calls, to prove that its oracle
//! catches it.

use std::collections::BTreeMap;

use crate::broker::BrokerOffsets;
use crate::error::ProtocolError;
use crate::headers::CausalHeaders;
use crate::ids::Channel;
use crate::node::{CausalNode, Initialized, NodeConfig, NodeStats, TruncationReport};
use crate::record::{Delivery, InboundRecord};
use crate::store::{StoreRead, WriteBatch};

/// What a host calls. See [`CausalNode`] for the meaning of each call and
/// for the duties a host owes in return.
pub trait DeliveryProtocol: Sized {
    /// Starts from committed state.
    fn init(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
    ) -> Result<Initialized<Self>, ProtocolError>;

    /// Receives one fetched record; returns what became deliverable.
    fn on_record(&mut self, record: InboundRecord) -> Result<Vec<Delivery>, ProtocolError>;

    /// Reports the consumer position on a channel.
    fn position_advance(
        &mut self,
        channel: Channel,
        position: i64,
    ) -> Result<Vec<Delivery>, ProtocolError>;

    /// Stamps one outgoing record for its destination channel.
    fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError>;

    /// The state changes to commit with the current step.
    fn take_writes(&mut self) -> WriteBatch;

    /// Where to resume channels that joined the scope.
    fn resume_positions(&self) -> BTreeMap<Channel, i64>;

    /// The truncation sweep.
    fn truncate_to_log_starts(
        &mut self,
        broker: &dyn BrokerOffsets,
    ) -> Result<TruncationReport, ProtocolError>;

    /// Records currently held.
    fn held_count(&self) -> usize;

    /// Counters since init (an implementation without them reports zeros).
    fn stats(&self) -> NodeStats {
        NodeStats::default()
    }
}

impl DeliveryProtocol for CausalNode {
    fn init(
        config: NodeConfig,
        store: &dyn StoreRead,
        broker: &dyn BrokerOffsets,
    ) -> Result<Initialized<Self>, ProtocolError> {
        CausalNode::init(config, store, broker)
    }

    fn on_record(&mut self, record: InboundRecord) -> Result<Vec<Delivery>, ProtocolError> {
        CausalNode::on_record(self, record)
    }

    fn position_advance(
        &mut self,
        channel: Channel,
        position: i64,
    ) -> Result<Vec<Delivery>, ProtocolError> {
        CausalNode::position_advance(self, channel, position)
    }

    fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError> {
        CausalNode::prepare_send(self, destination)
    }

    fn take_writes(&mut self) -> WriteBatch {
        CausalNode::take_writes(self)
    }

    fn resume_positions(&self) -> BTreeMap<Channel, i64> {
        CausalNode::resume_positions(self).clone()
    }

    fn truncate_to_log_starts(
        &mut self,
        broker: &dyn BrokerOffsets,
    ) -> Result<TruncationReport, ProtocolError> {
        CausalNode::truncate_to_log_starts(self, broker)
    }

    fn held_count(&self) -> usize {
        CausalNode::held_count(self)
    }

    fn stats(&self) -> NodeStats {
        CausalNode::stats(self)
    }
}
