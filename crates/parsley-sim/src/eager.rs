//! [`EagerProtocol`]: a deliberately broken protocol for the oracle's
//! self-test. It delivers every record the moment it arrives, ignoring every
//! claim, and stamps nothing. A kit that cannot tell it from the real one
//! proves nothing.

use std::collections::BTreeMap;

use parsley_protocol::{
    BrokerOffsets, CausalHeaders, Channel, Delivery, DeliveryProtocol, InboundRecord, InitReport,
    Initialized, NodeConfig, ProtocolError, SenderTag, StoreRead, TruncationReport, WriteBatch,
};

/// Delivers on arrival; keeps only a send counter.
#[derive(Debug)]
pub struct EagerProtocol {
    config: NodeConfig,
    seq: BTreeMap<Channel, i64>,
}

impl DeliveryProtocol for EagerProtocol {
    fn init(
        config: NodeConfig,
        _store: &dyn StoreRead,
        _broker: &dyn BrokerOffsets,
    ) -> Result<Initialized<Self>, ProtocolError> {
        Ok(Initialized {
            node: EagerProtocol {
                config,
                seq: BTreeMap::new(),
            },
            deliveries: Vec::new(),
            report: InitReport::default(),
        })
    }

    fn on_record(&mut self, record: InboundRecord) -> Result<Vec<Delivery>, ProtocolError> {
        Ok(vec![Delivery {
            record,
            was_held: false,
        }])
    }

    fn position_advance(
        &mut self,
        _channel: Channel,
        _position: i64,
    ) -> Result<Vec<Delivery>, ProtocolError> {
        Ok(Vec::new())
    }

    fn prepare_send(&mut self, destination: Channel) -> Result<CausalHeaders, ProtocolError> {
        let seq = self.seq.entry(destination).or_insert(0);
        *seq += 1;
        Ok(CausalHeaders {
            clock: Default::default(),
            sender: Some(SenderTag {
                sender: self.config.sender,
                seq: *seq,
            }),
        })
    }

    fn take_writes(&mut self) -> WriteBatch {
        WriteBatch::new()
    }

    fn resume_positions(&self) -> BTreeMap<Channel, i64> {
        BTreeMap::new()
    }

    fn truncate_to_log_starts(
        &mut self,
        _broker: &dyn BrokerOffsets,
    ) -> Result<TruncationReport, ProtocolError> {
        Ok(TruncationReport::default())
    }

    fn held_count(&self) -> usize {
        0
    }
}
