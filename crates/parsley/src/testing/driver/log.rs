//! The driver's log: every topic's partitions as in-memory record lists,
//! with transaction markers and aborted records, answering the cluster's
//! questions (metadata, offsets, changelog reads) the way a broker would.

use super::*;

#[derive(Clone, Debug)]
pub(super) struct StoredRecord {
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Option<Vec<u8>>,
    pub(super) timestamp: i64,
    pub(super) headers: Vec<Header>,
    pub(super) producer: Option<TaskId>,
}

#[derive(Clone, Debug)]
pub(super) enum Entry {
    Record {
        seq: u64,
        record: StoredRecord,
    },
    /// A record of an aborted transaction: occupies an offset, never
    /// returned to a `read_committed` consumer.
    Aborted(StoredRecord),
    /// A transaction marker (commit or abort): occupies an offset, never
    /// returned.
    Marker,
}

#[derive(Clone, Debug)]
pub(super) struct TopicLog {
    pub(super) id: TopicId,
    pub(super) partitions: Vec<Vec<Entry>>,
}

/// The in-memory log: topics, partitions, offsets and transaction markers.
#[derive(Clone, Debug, Default)]
pub(super) struct Log {
    pub(super) topics: BTreeMap<String, TopicLog>,
    pub(super) names: BTreeMap<TopicId, String>,
    pub(super) seq: u64,
}

pub(super) enum NextEntry {
    Record(i64),
    OnlyMarkers(i64),
    Nothing,
}

impl Log {
    pub(super) fn create(&mut self, name: &str, partitions: i32) {
        let id = test_topic_id(name, 0);
        self.names.insert(id, name.to_owned());
        self.topics.insert(
            name.to_owned(),
            TopicLog {
                id,
                partitions: (0..partitions).map(|_| Vec::new()).collect(),
            },
        );
    }

    pub(super) fn partition(&self, channel: Channel) -> Option<&Vec<Entry>> {
        let name = self.names.get(&channel.topic)?;
        self.topics
            .get(name)?
            .partitions
            .get(usize::try_from(channel.partition).ok()?)
    }

    pub(super) fn partition_mut(&mut self, topic: &str, partition: i32) -> Option<&mut Vec<Entry>> {
        self.topics
            .get_mut(topic)?
            .partitions
            .get_mut(usize::try_from(partition).ok()?)
    }

    /// What a `read_committed` consumer at `position` sees next.
    pub(super) fn next(&self, channel: Channel, position: i64) -> NextEntry {
        let Some(entries) = self.partition(channel) else {
            return NextEntry::Nothing;
        };
        let end = entries.len() as i64;
        let mut at = position.max(0);
        while at < end {
            if let Entry::Record { .. } = entries[at as usize] {
                return NextEntry::Record(at);
            }
            at += 1;
        }
        if position < end {
            NextEntry::OnlyMarkers(end)
        } else {
            NextEntry::Nothing
        }
    }

    /// The consumer position after reading `offset`: one past it, and past
    /// any markers that follow.
    pub(super) fn position_after(&self, channel: Channel, offset: i64) -> i64 {
        let Some(entries) = self.partition(channel) else {
            return offset + 1;
        };
        let mut at = offset + 1;
        while let Some(Entry::Marker | Entry::Aborted(_)) = entries.get(at as usize) {
            at += 1;
        }
        at
    }

    pub(super) fn append(
        &mut self,
        topic: &str,
        partition: i32,
        record: StoredRecord,
    ) -> Option<i64> {
        self.seq += 1;
        let seq = self.seq;
        let entries = self.partition_mut(topic, partition)?;
        entries.push(Entry::Record { seq, record });
        Some(entries.len() as i64 - 1)
    }

    pub(super) fn append_marker(&mut self, topic: &str, partition: i32) {
        if let Some(entries) = self.partition_mut(topic, partition) {
            entries.push(Entry::Marker);
        }
    }

    pub(super) fn append_aborted(
        &mut self,
        topic: &str,
        partition: i32,
        record: StoredRecord,
    ) -> bool {
        match self.partition_mut(topic, partition) {
            Some(entries) => {
                entries.push(Entry::Aborted(record));
                true
            }
            None => false,
        }
    }

    pub(super) fn offsets(
        &self,
        topics: &BTreeSet<TopicId>,
        end: bool,
    ) -> BTreeMap<TopicId, TopicOffsets> {
        topics
            .iter()
            .map(|id| {
                let answer = match self.names.get(id).and_then(|n| self.topics.get(n)) {
                    Some(t) => TopicOffsets::Present(
                        t.partitions
                            .iter()
                            .enumerate()
                            .map(|(p, e)| (p as i32, if end { e.len() as i64 } else { 0 }))
                            .collect(),
                    ),
                    None => TopicOffsets::Absent,
                };
                (*id, answer)
            })
            .collect()
    }
}

impl TopicMetadata for Log {
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
        self.topics
            .get(topic)
            .map(|t| TopicDescription {
                id: t.id,
                partitions: t.partitions.len() as i32,
            })
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))
    }
}

impl ChangelogReader for Log {
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        // The driver's transactions land whole: every offset is resolved.
        let records = self.records_of(topic, partition)?;
        let end = self.end_of(topic, partition);
        for r in records.into_iter().filter(|r| r.offset >= from) {
            apply(r);
        }
        Ok(end)
    }
}

impl Log {
    fn end_of(&self, topic: &str, partition: i32) -> i64 {
        self.topics
            .get(topic)
            .and_then(|t| t.partitions.get(usize::try_from(partition).ok()?))
            .map_or(0, |entries| {
                i64::try_from(entries.len()).unwrap_or(i64::MAX)
            })
    }

    fn records_of(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ChangelogRecord>, MetadataError> {
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))?;
        let entries = t
            .partitions
            .get(usize::try_from(partition).unwrap_or(usize::MAX))
            .ok_or_else(|| MetadataError::Failed {
                topic: topic.to_owned(),
                message: format!("no partition {partition}"),
            })?;
        Ok(entries
            .iter()
            .enumerate()
            .filter_map(|(offset, e)| match e {
                Entry::Record { record, .. } => Some(ChangelogRecord {
                    offset: i64::try_from(offset).unwrap_or(i64::MAX),
                    key: record.key.clone(),
                    value: record.value.clone(),
                }),
                _ => None,
            })
            .collect())
    }
}

impl BrokerOffsets for Log {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(self.offsets(topics, true))
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(self.offsets(topics, false))
    }
}

/// A produced record as the log keeps it.
pub(super) fn stored(r: OutgoingRecord, producer: Option<TaskId>) -> StoredRecord {
    StoredRecord {
        headers: r.header_list(),
        key: r.key.map(crate::runtime::task::RecordBytes::into_vec),
        value: r.value.map(crate::runtime::task::RecordBytes::into_vec),
        timestamp: r.timestamp,
        producer,
    }
}
