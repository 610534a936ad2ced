//! Records going into the node and deliveries coming out.

use std::borrow::Cow;

use crate::headers::CausalHeaders;
pub use crate::headers::Header;
use crate::ids::Channel;

/// A fetched record as the host hands it to
/// [`CausalNode::on_record`](crate::CausalNode::on_record).
///
/// The host has already split the causal headers out (see
/// [`CausalHeaders::decode`]); `headers` holds only the others. Key and value
/// are the raw bytes; `None` is a Kafka null.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct InboundRecord {
    /// The channel the record was fetched from.
    pub channel: Channel,
    /// The record's offset on that channel.
    pub offset: i64,
    /// The record's timestamp (milliseconds since the epoch).
    pub timestamp: i64,
    /// The key bytes, or `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// The value bytes, or `None` for a null value (a tombstone).
    pub value: Option<Vec<u8>>,
    /// Every header except `vc`, `vc-sender` and `vc-seq`, in record order.
    pub headers: Vec<Header>,
    /// The record's dependency clock and sender tag.
    pub causal: CausalHeaders,
}

impl InboundRecord {
    /// What holding this record costs in memory, in bytes: its key, value
    /// and header bytes, its clock's claims, and the fixed size of the
    /// record itself. It is the measure hold budgets count in: it leaves
    /// out the allocator's own overhead, so a process holding records
    /// pays somewhat more than the sum.
    pub fn held_size(&self) -> usize {
        let bytes = |b: &Option<Vec<u8>>| b.as_ref().map_or(0, Vec::len);
        let headers: usize = self
            .headers
            .iter()
            .map(|h| {
                std::mem::size_of::<Header>()
                    + bytes(&h.value)
                    + match &h.name {
                        Cow::Owned(n) => n.len(),
                        Cow::Borrowed(_) => 0,
                    }
            })
            .sum();
        std::mem::size_of::<InboundRecord>()
            + bytes(&self.key)
            + bytes(&self.value)
            + headers
            + std::mem::size_of_val(self.causal.clock.offsets())
            + std::mem::size_of_val(self.causal.clock.sequences())
    }
}

/// A record released to the user processor, in causal order.
///
/// The record is exactly what was fetched: for a record that waited in a hold
/// queue, its own coordinate, bytes and headers, not those of whatever record
/// released it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Delivery {
    /// The released record.
    pub record: InboundRecord,
    /// True when the record waited in its channel's hold queue (it was not
    /// deliverable the moment it arrived, or it was restored from the store).
    pub was_held: bool,
}
