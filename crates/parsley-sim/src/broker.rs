//! [`SimBroker`]: partitions with real offset occupancy.
//!
//! Every append takes an offset: business records, transaction commit and
//! abort markers, and records of aborted transactions alike. A
//! `read_committed` fetch returns only committed business records, so the
//! consumer sees holes wherever a marker or an aborted record sits, exactly
//! as a Kafka consumer does. Retention is modelled by a log start per
//! partition; topics can be destroyed, after which they are definitively
//! absent, though the broker remembers how far each partition had been
//! written (a claim on a destroyed topic is harmless, but it must still name
//! an offset that once existed).
//!
//! Every append also feeds the broker's [`Trace`], so the digest of a run
//! covers the exact bytes of every record and marker, where it landed, and
//! whether its transaction committed.

use std::collections::{BTreeMap, BTreeSet};

use parsley_protocol::{
    BrokerOffsets, BrokerOffsetsError, CausalHeaders, Channel, Header, SenderId, TopicId,
    TopicOffsets,
};

use crate::trace::Trace;

/// A business record as stored in a partition.
#[derive(Clone, Debug)]
pub struct StoredRecord {
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Timestamp.
    pub timestamp: i64,
    /// Non-causal headers.
    pub headers: Vec<Header>,
    /// The causal headers exactly as sent.
    pub causal: CausalHeaders,
    /// The oracle's handle on this record (its index in the oracle's table).
    pub oracle_id: usize,
    /// The version its `vc` was sent in; a fetch serves it back in the
    /// same version, so a stage reads what the sender wrote.
    pub clock_version: parsley_protocol::clock::ClockVersion,
}

/// One offset of a partition.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A business record; `committed` is false for a record of an aborted
    /// transaction.
    Record {
        /// The record.
        record: StoredRecord,
        /// Whether its transaction committed (or it was sent outside one).
        committed: bool,
    },
    /// A transaction marker (commit or abort).
    Marker {
        /// True for a commit marker.
        commit: bool,
    },
}

#[derive(Clone, Debug, Default)]
struct Partition {
    entries: Vec<Entry>,
    log_start: i64,
    /// The sender tags of the committed records written here.
    senders: BTreeSet<SenderId>,
    /// Transactions that committed but whose commit marker on this
    /// partition is not written yet, with the offset of their first record
    /// here: a `read_committed` consumer stops below the lowest of them
    /// (the last stable offset), as it does on Kafka, where a
    /// transaction's markers land on each partition separately.
    open: BTreeMap<u64, i64>,
}

impl Partition {
    /// The last stable offset: the first offset of a transaction still
    /// unresolved here, or the end.
    fn last_stable(&self) -> i64 {
        self.open
            .values()
            .copied()
            .min()
            .unwrap_or(self.entries.len() as i64)
    }

    /// The committed business records a `read_committed` consumer can
    /// fetch from `from` on: at or after the log start, below the last
    /// stable offset.
    fn readable(&self, from: i64) -> impl Iterator<Item = (i64, &StoredRecord)> {
        let stable = self.last_stable();
        self.entries
            .iter()
            .enumerate()
            .skip(from.max(self.log_start).max(0) as usize)
            .take_while(move |(i, _)| (*i as i64) < stable)
            .filter_map(|(i, e)| match e {
                Entry::Record {
                    record,
                    committed: true,
                } => Some((i as i64, record)),
                _ => None,
            })
    }
}

#[derive(Clone, Debug)]
struct Topic {
    name: String,
    partitions: Vec<Partition>,
    /// Once destroyed: each partition's end offset at that moment.
    destroyed_at: Option<Vec<i64>>,
}

impl Topic {
    fn destroyed(&self) -> bool {
        self.destroyed_at.is_some()
    }
}

/// The simulated broker.
#[derive(Clone, Debug, Default)]
pub struct SimBroker {
    topics: BTreeMap<TopicId, Topic>,
    next_id: u128,
    trace: Trace,
    /// Log-start lookups still to fail (a transient outage).
    failing_log_starts: std::cell::Cell<u32>,
    /// Other lookups (end offsets, and whatever a host routes through
    /// [`SimBroker::lookup_outage`]) still to fail.
    failing_lookups: std::cell::Cell<u32>,
}

/// Mixes one appended record into a digest: where it landed, whether its
/// transaction committed, and its bytes, the causal headers in their wire
/// encoding (clock bytes, sender, sequence).
fn mix_record(t: &mut Trace, c: Channel, offset: i64, record: &StoredRecord, committed: bool) {
    t.word(0xA1);
    t.channel(c);
    t.word(offset as u64);
    t.word(u64::from(committed));
    t.opt_bytes(record.key.as_deref());
    t.opt_bytes(record.value.as_deref());
    t.word(record.timestamp as u64);
    t.word(record.headers.len() as u64);
    for h in &record.headers {
        t.bytes(h.name.as_bytes());
        t.opt_bytes(h.value.as_deref());
    }
    let causal = record.causal.encode();
    t.word(causal.len() as u64);
    for (name, value) in &causal {
        t.bytes(name.as_bytes());
        t.bytes(value);
    }
}

impl SimBroker {
    /// An empty broker.
    pub fn new() -> Self {
        SimBroker::default()
    }

    /// Creates a topic and returns its id. Ids are deterministic (a counter
    /// spread over the id space, with the top bit set on every other id so
    /// the signed canonical order is exercised).
    pub fn create_topic(&mut self, name: &str, partitions: i32) -> TopicId {
        self.next_id += 1;
        let n = self.next_id;
        let high = if n.is_multiple_of(2) { 1u128 << 127 } else { 0 };
        let id = TopicId::from_u128(high | (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) << 32) | n);
        self.topics.insert(
            id,
            Topic {
                name: name.to_owned(),
                partitions: (0..partitions.max(0))
                    .map(|_| Partition::default())
                    .collect(),
                destroyed_at: None,
            },
        );
        id
    }

    /// Deletes a topic: it answers as definitively absent from now on. The
    /// end offset each partition had is kept (see
    /// [`claimable_end`](Self::claimable_end)).
    pub fn destroy_topic(&mut self, topic: TopicId) {
        if let Some(t) = self.topics.get_mut(&topic)
            && t.destroyed_at.is_none()
        {
            t.destroyed_at = Some(
                t.partitions
                    .iter()
                    .map(|p| p.entries.len() as i64)
                    .collect(),
            );
        }
    }

    /// One past the highest offset a claim on `c` may name: the end offset
    /// of a live partition, or the end offset a destroyed one had when its
    /// topic was destroyed; 0 for a channel that never existed.
    pub fn claimable_end(&self, c: Channel) -> i64 {
        let Some(t) = self.topics.get(&c.topic) else {
            return 0;
        };
        let Ok(i) = usize::try_from(c.partition) else {
            return 0;
        };
        match &t.destroyed_at {
            Some(ends) => ends.get(i).copied().unwrap_or(0),
            None => t.partitions.get(i).map_or(0, |p| p.entries.len() as i64),
        }
    }

    /// How many distinct sender tags the committed records of a live
    /// partition carry.
    pub fn tagged_senders(&self, c: Channel) -> usize {
        self.partition(c).map_or(0, |p| p.senders.len())
    }

    /// The digest of every append so far (see [`Trace`]).
    pub fn trace(&self) -> u64 {
        self.trace.value()
    }

    /// The id of a live topic by name.
    pub fn topic_id(&self, name: &str) -> Option<TopicId> {
        self.topics
            .iter()
            .find(|(_, t)| t.name == name && !t.destroyed())
            .map(|(&id, _)| id)
    }

    /// Makes the next `n` log-start lookups fail (a transient outage of
    /// offset lookups).
    pub fn fail_log_starts(&self, n: u32) {
        self.failing_log_starts.set(n);
    }

    /// Makes the next `n` other lookups fail: end offsets, and what a host
    /// bridge checks with [`lookup_outage`](Self::lookup_outage) (topic
    /// metadata, changelog reads).
    pub fn fail_lookups(&self, n: u32) {
        self.failing_lookups.set(n);
    }

    /// Whether this lookup fails (consumes one failure of an outage).
    pub fn lookup_outage(&self) -> bool {
        let n = self.failing_lookups.get();
        if n > 0 {
            self.failing_lookups.set(n - 1);
        }
        n > 0
    }

    /// Every committed business record of a live partition from its log
    /// start, in offset order (a `read_committed` replay).
    pub fn committed_from_start(&self, c: Channel) -> Vec<(i64, &StoredRecord)> {
        let Some(p) = self.partition(c) else {
            return Vec::new();
        };
        p.entries
            .iter()
            .enumerate()
            .skip(p.log_start.max(0) as usize)
            .filter_map(|(i, e)| match e {
                Entry::Record {
                    record,
                    committed: true,
                } => Some((i as i64, record)),
                _ => None,
            })
            .collect()
    }

    /// A topic's name.
    pub fn topic_name(&self, topic: TopicId) -> Option<&str> {
        self.topics.get(&topic).map(|t| t.name.as_str())
    }

    /// The number of partitions of a live topic.
    pub fn partitions(&self, topic: TopicId) -> Option<i32> {
        self.topics
            .get(&topic)
            .filter(|t| !t.destroyed())
            .map(|t| t.partitions.len() as i32)
    }

    fn partition(&self, c: Channel) -> Option<&Partition> {
        self.topics
            .get(&c.topic)
            .filter(|t| !t.destroyed())?
            .partitions
            .get(usize::try_from(c.partition).ok()?)
    }

    fn partition_mut(&mut self, c: Channel) -> &mut Partition {
        let t = self
            .topics
            .get_mut(&c.topic)
            .unwrap_or_else(|| panic!("sim: append to unknown topic {}", c.topic));
        assert!(!t.destroyed(), "sim: append to destroyed topic {}", c.topic);
        t.partitions
            .get_mut(c.partition as usize)
            .unwrap_or_else(|| panic!("sim: append to unknown partition {c}"))
    }

    /// Appends a business record; returns its offset.
    pub fn append(&mut self, c: Channel, record: StoredRecord, committed: bool) -> i64 {
        let mut trace = self.trace;
        let p = self.partition_mut(c);
        let offset = p.entries.len() as i64;
        mix_record(&mut trace, c, offset, &record, committed);
        if committed && let Some(tag) = record.causal.sender {
            p.senders.insert(tag.sender);
        }
        p.entries.push(Entry::Record { record, committed });
        self.trace = trace;
        offset
    }

    /// Appends a business record of committed transaction `txn` whose
    /// commit marker on this partition is not written yet: it is
    /// committed, but no `read_committed` fetch or replay passes it until
    /// [`land_marker`](Self::land_marker). Returns its offset.
    pub fn append_open(&mut self, c: Channel, record: StoredRecord, txn: u64) -> i64 {
        let offset = self.append(c, record, true);
        self.partition_mut(c).open.entry(txn).or_insert(offset);
        offset
    }

    /// Appends a record of open transaction `txn`, produced before the
    /// transaction's fate is known: no `read_committed` fetch or replay
    /// passes it while the transaction is open here, and it counts as
    /// aborted until [`resolve`](Self::resolve) says it committed. Returns
    /// its offset.
    pub fn append_pending(&mut self, c: Channel, record: StoredRecord, txn: u64) -> i64 {
        let offset = self.append(c, record, false);
        self.partition_mut(c).open.entry(txn).or_insert(offset);
        offset
    }

    /// The transaction of the pending record at `offset` committed: the
    /// record is committed (readable once the transaction's marker is
    /// written here), with the oracle's handle `oracle_id`.
    pub fn resolve(&mut self, c: Channel, offset: i64, oracle_id: usize) {
        self.trace.word(0xA3);
        self.trace.channel(c);
        self.trace.word(offset as u64);
        let p = self.partition_mut(c);
        let Some(Entry::Record { record, committed }) = usize::try_from(offset)
            .ok()
            .and_then(|i| p.entries.get_mut(i))
        else {
            panic!("sim: no pending record at {c}@{offset}");
        };
        *committed = true;
        record.oracle_id = oracle_id;
        if let Some(tag) = record.causal.sender {
            p.senders.insert(tag.sender);
        }
    }

    /// Writes transaction `txn`'s abort marker on this partition: its
    /// pending records here stay aborted, and no longer hold back the last
    /// stable offset. Returns the marker's offset.
    pub fn abort_open(&mut self, c: Channel, txn: u64) -> i64 {
        self.partition_mut(c).open.remove(&txn);
        self.append_marker(c, false)
    }

    /// Writes transaction `txn`'s commit marker on this partition at last:
    /// its records here become readable. Returns the marker's offset.
    pub fn land_marker(&mut self, c: Channel, txn: u64) -> i64 {
        self.partition_mut(c).open.remove(&txn);
        self.append_marker(c, true)
    }

    /// The last stable offset: a `read_committed` consumer reads, and
    /// moves its position, no further (the first offset of a transaction
    /// whose marker is not written here yet, or the end).
    pub fn last_stable(&self, c: Channel) -> i64 {
        self.partition(c).map_or(0, Partition::last_stable)
    }

    /// Every committed business record of a live partition from its log
    /// start up to its last stable offset, and that offset: a
    /// `read_committed` replay, and where it stopped.
    pub fn stable_from_start(&self, c: Channel) -> (Vec<(i64, &StoredRecord)>, i64) {
        let Some(p) = self.partition(c) else {
            return (Vec::new(), 0);
        };
        let records = p.readable(p.log_start).collect();
        (records, p.last_stable().max(p.log_start))
    }

    /// Appends a transaction marker; returns its offset.
    pub fn append_marker(&mut self, c: Channel, commit: bool) -> i64 {
        let p = self.partition_mut(c);
        p.entries.push(Entry::Marker { commit });
        let offset = p.entries.len() as i64 - 1;
        self.trace.word(0xA2);
        self.trace.channel(c);
        self.trace.word(offset as u64);
        self.trace.word(u64::from(commit));
        offset
    }

    /// The next offset to be written.
    pub fn end_offset(&self, c: Channel) -> i64 {
        self.partition(c).map_or(0, |p| p.entries.len() as i64)
    }

    /// The first offset retention still keeps.
    pub fn log_start(&self, c: Channel) -> i64 {
        self.partition(c).map_or(0, |p| p.log_start)
    }

    /// The first committed business record at or after `from` (and at or
    /// after the log start) and below the last stable offset, as a
    /// `read_committed` consumer would fetch it.
    pub fn fetch(&self, c: Channel, from: i64) -> Option<(i64, &StoredRecord)> {
        self.partition(c)?.readable(from).next()
    }

    /// Where a consumer at `from` can move its position without fetching
    /// anything: to the next committed business record, or to the last
    /// stable offset. `None` when there is nothing to skip.
    pub fn skip_target(&self, c: Channel, from: i64) -> Option<i64> {
        let target = match self.fetch(c, from) {
            Some((o, _)) => o,
            None => self.last_stable(c),
        };
        (target > from).then_some(target)
    }

    /// The entry at an offset (ignoring retention), for the oracle.
    pub fn entry(&self, c: Channel, offset: i64) -> Option<&Entry> {
        self.topics
            .get(&c.topic)?
            .partitions
            .get(usize::try_from(c.partition).ok()?)?
            .entries
            .get(usize::try_from(offset).ok()?)
    }

    /// Every committed business record of a partition at or above `from`,
    /// ignoring retention (the oracle's completeness check reads history
    /// that retention has since deleted, because the consumer fetched it).
    pub fn committed_records(&self, c: Channel, from: i64) -> Vec<(i64, usize)> {
        let Some(t) = self.topics.get(&c.topic) else {
            return Vec::new();
        };
        let Some(p) = t.partitions.get(c.partition as usize) else {
            return Vec::new();
        };
        p.entries
            .iter()
            .enumerate()
            .skip(from.max(0) as usize)
            .filter_map(|(i, e)| match e {
                Entry::Record {
                    record,
                    committed: true,
                } => Some((i as i64, record.oracle_id)),
                _ => None,
            })
            .collect()
    }

    /// Moves a partition's log start forward (never backward, never past
    /// the end).
    pub fn advance_log_start(&mut self, c: Channel, to: i64) {
        let end = self.end_offset(c);
        let p = self.partition_mut(c);
        p.log_start = p.log_start.max(to.min(end));
    }

    /// Every channel of every live topic.
    pub fn channels(&self) -> Vec<Channel> {
        self.topics
            .iter()
            .filter(|(_, t)| !t.destroyed())
            .flat_map(|(&id, t)| (0..t.partitions.len() as i32).map(move |p| Channel::new(id, p)))
            .collect()
    }

    fn answer(
        &self,
        topics: &BTreeSet<TopicId>,
        f: impl Fn(&Partition) -> i64,
    ) -> BTreeMap<TopicId, TopicOffsets> {
        topics
            .iter()
            .map(|&id| {
                let answer = match self.topics.get(&id) {
                    Some(t) if !t.destroyed() => TopicOffsets::Present(
                        t.partitions
                            .iter()
                            .enumerate()
                            .map(|(i, p)| (i as i32, f(p)))
                            .collect(),
                    ),
                    _ => TopicOffsets::Absent,
                };
                (id, answer)
            })
            .collect()
    }
}

impl BrokerOffsets for SimBroker {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        if self.lookup_outage() {
            return Err(BrokerOffsetsError::new(
                "end-offset lookup failed (simulated)",
            ));
        }
        Ok(self.answer(topics, |p| p.entries.len() as i64))
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        let failing = self.failing_log_starts.get();
        if failing > 0 {
            self.failing_log_starts.set(failing - 1);
            return Err(BrokerOffsetsError::new(
                "log-start lookup failed (simulated)",
            ));
        }
        Ok(self.answer(topics, |p| p.log_start))
    }
}
