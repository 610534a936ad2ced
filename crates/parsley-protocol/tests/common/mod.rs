//! Shared fixtures for the protocol's integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};

use parsley_protocol::*;

pub fn topic(n: u128) -> TopicId {
    TopicId::from_u128(n)
}

pub fn ch(t: u128, p: i32) -> Channel {
    Channel::new(topic(t), p)
}

pub fn sender(n: u128) -> SenderId {
    SenderId::from_u128(n)
}

/// An offset-only clock.
pub fn offsets(claims: &[(Channel, i64)]) -> VectorClock {
    VectorClock::from_claims(
        claims
            .iter()
            .map(|&(channel, offset)| OffsetClaim { channel, offset }),
        [],
    )
}

/// A sequence-only clock.
pub fn seqs(claims: &[(Channel, SenderId, i64)]) -> VectorClock {
    VectorClock::from_claims(
        [],
        claims.iter().map(|&(channel, sender, seq)| SequenceClaim {
            channel,
            sender,
            seq,
        }),
    )
}

pub fn rec(channel: Channel, offset: i64, clock: VectorClock) -> InboundRecord {
    InboundRecord {
        channel,
        offset,
        timestamp: 1_000 + offset,
        key: Some(format!("k{offset}").into_bytes()),
        value: Some(format!("v{offset}").into_bytes()),
        headers: vec![],
        causal: CausalHeaders {
            clock,
            sender: None,
        },
    }
}

pub fn tagged(mut r: InboundRecord, s: SenderId, seq: i64) -> InboundRecord {
    r.causal.sender = Some(SenderTag { sender: s, seq });
    r
}

/// `(channel, offset)` of each delivery, in order.
pub fn coords(ds: &[Delivery]) -> Vec<(Channel, i64)> {
    ds.iter()
        .map(|d| (d.record.channel, d.record.offset))
        .collect()
}

/// A broker double: topics present with per-partition end offsets and log
/// starts; any other topic is definitively absent. Can be told to fail.
#[derive(Default)]
pub struct FakeBroker {
    pub ends: RefCell<BTreeMap<TopicId, BTreeMap<i32, i64>>>,
    pub starts: RefCell<BTreeMap<TopicId, BTreeMap<i32, i64>>>,
    pub fail: Cell<bool>,
}

impl FakeBroker {
    pub fn with_topic(self, t: TopicId, partitions: i32, end: i64) -> Self {
        self.ends
            .borrow_mut()
            .insert(t, (0..partitions).map(|p| (p, end)).collect());
        self.starts
            .borrow_mut()
            .insert(t, (0..partitions).map(|p| (p, 0)).collect());
        self
    }

    pub fn set_end(&self, c: Channel, end: i64) {
        self.ends
            .borrow_mut()
            .entry(c.topic)
            .or_default()
            .insert(c.partition, end);
    }

    pub fn set_start(&self, c: Channel, start: i64) {
        self.starts
            .borrow_mut()
            .entry(c.topic)
            .or_default()
            .insert(c.partition, start);
    }

    pub fn delete_topic(&self, t: TopicId) {
        self.ends.borrow_mut().remove(&t);
        self.starts.borrow_mut().remove(&t);
    }

    fn answer(
        &self,
        map: &BTreeMap<TopicId, BTreeMap<i32, i64>>,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        if self.fail.get() {
            return Err(BrokerOffsetsError::new("broker unreachable (test)"));
        }
        Ok(topics
            .iter()
            .map(|t| {
                let a = match map.get(t) {
                    Some(parts) => TopicOffsets::Present(parts.clone()),
                    None => TopicOffsets::Absent,
                };
                (*t, a)
            })
            .collect())
    }
}

impl BrokerOffsets for FakeBroker {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.answer(&self.ends.borrow(), topics)
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.answer(&self.starts.borrow(), topics)
    }
}

pub fn config(me: SenderId, inputs: &[Channel], sinks: &[TopicId]) -> NodeConfig {
    NodeConfig {
        sender: me,
        inputs: inputs.iter().copied().collect(),
        sinks: sinks.iter().copied().collect(),
    }
}

/// A node with its committed store, restartable from that store.
pub struct Harness {
    pub config: NodeConfig,
    pub store: MemStore,
    pub broker: FakeBroker,
    pub node: CausalNode,
    pub init_deliveries: Vec<Delivery>,
    pub report: InitReport,
}

impl Harness {
    pub fn start(config: NodeConfig, broker: FakeBroker) -> Harness {
        Self::start_from(config, broker, MemStore::new())
    }

    pub fn start_from(config: NodeConfig, broker: FakeBroker, store: MemStore) -> Harness {
        let init = CausalNode::init(config.clone(), &store, &broker).expect("init");
        Harness {
            config,
            store,
            broker,
            node: init.node,
            init_deliveries: init.deliveries,
            report: init.report,
        }
    }

    /// Commits the node's pending writes to the store.
    pub fn commit(&mut self) -> WriteBatch {
        let w = self.node.take_writes();
        self.store.apply(&w);
        w
    }

    /// Commits, then restarts from the store (optionally with a new config).
    pub fn restart_with(&mut self, config: NodeConfig) -> Result<(), ProtocolError> {
        self.commit();
        let init = CausalNode::init(config.clone(), &self.store, &self.broker)?;
        self.config = config;
        self.node = init.node;
        self.init_deliveries = init.deliveries;
        self.report = init.report;
        Ok(())
    }

    pub fn restart(&mut self) {
        let c = self.config.clone();
        self.restart_with(c).expect("restart");
    }

    /// Commits, then restarts from the store with a resident window set
    /// from the start ([`CausalNode::init_windowed`]).
    pub fn restart_windowed(&mut self, window: Option<usize>) {
        self.commit();
        let init =
            CausalNode::init_windowed(self.config.clone(), &self.store, &self.broker, window)
                .expect("restart");
        self.node = init.node;
        self.init_deliveries = init.deliveries;
        self.report = init.report;
    }

    /// Serves every page request from the committed store, as a host
    /// would, appending what the page-ins release to `out`; returns how
    /// many requests there were.
    pub fn serve_pages(&mut self, out: &mut Vec<Delivery>) -> usize {
        self.serve_at_most(usize::MAX, out)
    }

    /// [`serve_pages`](Self::serve_pages), stopping after `limit` requests
    /// (a host that bounds what one transaction releases leaves the rest
    /// for later).
    pub fn serve_at_most(&mut self, limit: usize, out: &mut Vec<Delivery>) -> usize {
        let mut served = 0;
        loop {
            let requests = self.node.page_requests();
            if requests.is_empty() || served >= limit {
                return served;
            }
            for r in requests.into_iter().take(limit - served) {
                let mut records = Vec::with_capacity(r.count);
                for key in r.keys() {
                    let bytes = self
                        .store
                        .get_state(key)
                        .expect("a paged record is in the committed store");
                    r.decode(key, bytes, &mut records).expect("decodes");
                }
                self.node.page_in(r.channel, records, out).expect("page in");
                served += 1;
            }
        }
    }

    pub fn feed(&mut self, r: InboundRecord) -> Vec<(Channel, i64)> {
        coords(&self.node.on_record(r).expect("on_record"))
    }

    pub fn advance(&mut self, c: Channel, position: i64) -> Vec<(Channel, i64)> {
        coords(
            &self
                .node
                .position_advance(c, position)
                .expect("position_advance"),
        )
    }
}

/// Parses hand-written hex (whitespace and `_` ignored).
pub fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'_')
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd hex length");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// `store` in the layout before pages (the Java library's): every held
/// record under its own `q/<channel>/e/<index>` key, the records of a page
/// below its queue's head left out (that layout deletes a record with its
/// release).
pub fn entry_layout(store: &MemStore) -> MemStore {
    use parsley_protocol::store::{PageEntries, decode_pair};
    let mut heads = BTreeMap::new();
    store.for_each_state(&mut |key, value| {
        if let Ok(StateKey::QueueMeta(c)) = key {
            heads.insert(c, decode_pair(value).expect("queue meta").0);
        }
    });
    let mut out = MemStore::new();
    for (key, value) in store.iter() {
        match key.parse::<StateKey>() {
            Ok(StateKey::QueuePage(c, first)) => {
                let head = heads.get(&c).copied().unwrap_or(0);
                for (index, entry) in (first..).zip(PageEntries::new(value).expect("a page")) {
                    if index >= head {
                        out.insert_raw(&StateKey::QueueEntry(c, index).to_string(), entry.to_vec());
                    }
                }
            }
            _ => {
                out.insert_raw(&key, value.to_vec());
            }
        }
    }
    out
}
