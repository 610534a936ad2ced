//! [`EdgeProducer`]: plain clients at the edge of the topology.
//!
//! An edge producer is a sequential plain producer: it sends one record,
//! waits for the acknowledgement, and folds the acknowledged coordinate into
//! its clock, so each send claims all of its earlier ones, across topics and
//! partitions. One operation sends a batch of one or more records, all to
//! the same target or spread over the targets in turn; a transactional
//! producer commits the batch as one transaction, with one commit marker on
//! each partition it wrote, so the records of a batch that share a partition
//! sit at adjacent offsets with no marker between them. An observer additionally consumes records from some channels
//! (as a plain consumer, without any gate) and folds each one's coordinate
//! and clock before producing, so what it produces claims what it read.
//! Edge records carry a `vc` header but no sender tag, like records from a
//! plain client stamping with a causal clock.

use std::collections::BTreeSet;

use parsley_protocol::{CausalHeaders, Channel, VectorClock};

use crate::behavior::Payload;
use crate::broker::{SimBroker, StoredRecord};
use crate::oracle::{ActorId, Oracle};

/// Everything that defines an edge producer.
#[derive(Clone, Debug)]
pub struct EdgeSpec {
    /// A readable name.
    pub name: String,
    /// Where it produces, as (topic, partition); used in turn.
    pub targets: Vec<(String, i32)>,
    /// Channels it observes before producing (empty: a pure producer).
    pub observes: Vec<(String, i32)>,
    /// Whether each operation's batch is one committed transaction (leaving
    /// a commit marker after it on each partition it wrote) rather than
    /// plain sends.
    pub transactional: bool,
    /// Records per operation (at least one).
    pub batch: usize,
    /// Whether a batch goes to the targets in turn (one transaction over
    /// several partitions) rather than all to one target.
    pub spread: bool,
}

impl EdgeSpec {
    /// A stamping, non-transactional producer over the given targets.
    pub fn producer(name: &str, targets: &[(&str, i32)]) -> EdgeSpec {
        EdgeSpec {
            name: name.to_owned(),
            targets: targets.iter().map(|&(t, p)| (t.to_owned(), p)).collect(),
            observes: Vec::new(),
            transactional: false,
            batch: 1,
            spread: false,
        }
    }

    /// A transactional producer committing `batch` records per operation,
    /// all to one target (the targets are used in turn, one per
    /// transaction).
    pub fn batched(name: &str, targets: &[(&str, i32)], batch: usize) -> EdgeSpec {
        EdgeSpec {
            transactional: true,
            batch,
            ..EdgeSpec::producer(name, targets)
        }
    }
}

/// A running edge producer.
pub struct EdgeProducer {
    /// Its definition.
    pub spec: EdgeSpec,
    /// Its oracle actor.
    pub actor: ActorId,
    targets: Vec<Channel>,
    observes: Vec<(Channel, i64)>,
    clock: VectorClock,
    next_target: usize,
    next_key: u64,
    sent: u64,
}

impl EdgeProducer {
    /// A producer with resolved channels.
    pub fn new(
        spec: EdgeSpec,
        actor: ActorId,
        targets: Vec<Channel>,
        observes: Vec<Channel>,
    ) -> Self {
        EdgeProducer {
            spec,
            actor,
            targets,
            observes: observes.into_iter().map(|c| (c, 0)).collect(),
            clock: VectorClock::new(),
            next_target: 0,
            next_key: 0,
            sent: 0,
        }
    }

    /// Records sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// One operation: observe what is available on the observed channels,
    /// then send a batch to the next target (or targets). `key` picks the
    /// entity key and `hops` the feedback budget of what it sends.
    pub fn op(&mut self, broker: &mut SimBroker, oracle: &mut Oracle, key: u64, hops: u32) {
        oracle.begin(self.actor);
        for (c, pos) in &mut self.observes {
            while let Some((offset, rec)) = broker.fetch(*c, *pos) {
                *pos = offset + 1;
                self.clock.merge(&rec.causal.clock);
                self.clock.claim_offset(*c, offset);
                oracle.observe(self.actor, rec.oracle_id);
            }
        }
        if self.targets.is_empty() {
            oracle.commit(self.actor);
            return;
        }
        let mut touched = BTreeSet::new();
        for i in 0..self.spec.batch.max(1) {
            if i == 0 || self.spec.spread {
                self.next_target += 1;
            }
            let channel = self.targets[(self.next_target - 1) % self.targets.len()];
            self.next_key += 1;
            let payload = Payload {
                key: key.wrapping_add(self.next_key),
                hops,
            };
            let pending = oracle.emit(self.actor);
            let offset = broker.end_offset(channel);
            let id = oracle.register(pending, channel, offset);
            let causal = CausalHeaders {
                clock: self.clock.clone(),
                sender: None,
            };
            let at = broker.append(
                channel,
                StoredRecord {
                    key: Some(payload.key_bytes()),
                    value: Some(payload.value_bytes()),
                    timestamp: 0,
                    headers: Vec::new(),
                    causal,
                    oracle_id: id,
                    clock_version: parsley_protocol::clock::ClockVersion::V1,
                },
                true,
            );
            assert_eq!(at, offset);
            touched.insert(channel);
            // The acknowledgement (a transactional send is acknowledged
            // before its commit too): the next send claims this one.
            self.clock.claim_offset(channel, at);
            self.sent += 1;
        }
        if self.spec.transactional {
            for &c in &touched {
                broker.append_marker(c, true);
            }
        }
        oracle.commit(self.actor);
    }
}
