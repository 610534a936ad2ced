//! [`KafkaCluster`]: what the host core asks of a cluster, answered by a
//! real one: topic ids and partition counts (DescribeTopics), end offsets
//! and log starts (one batched ListOffsets round), and changelog replay.
//!
//! End offsets are the high watermark, not the last stable offset: the
//! own-output seed must claim every send a previous incarnation committed,
//! and committed sends can sit above the last stable offset while another
//! producer's transaction is open below them. Claiming offsets of an open
//! transaction is harmless: they commit (and are delivered) or abort (and
//! are skipped), so the claim resolves either way.
//!
//! The protocol names topics by id, so a topic deleted and recreated under
//! the same name is a different channel. An id the cluster no longer
//! serves is answered as definitively absent, never as the name's new
//! incarnation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use parsley::runtime::host::{ChangelogReader, ChangelogRecord};
use parsley::runtime::host::{MetadataError, TopicDescription, TopicMetadata};
use parsley_protocol::{BrokerOffsets, BrokerOffsetsError, TopicId, TopicOffsets};
use rdkafka::admin::AdminClient;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::ClientLogs;
use crate::topic_ids::{self, Described};

/// Cluster access for the host core: topic metadata and broker offsets.
pub struct KafkaCluster {
    config: ClientConfig,
    admin: AdminClient<ClientLogs>,
    timeout: Duration,
    /// Topic names by id, as last described.
    names: Mutex<BTreeMap<TopicId, String>>,
    /// The changelog replay consumer, made at the first replay.
    replayer: Mutex<Option<crate::changelog::Replayer>>,
    /// How long a replay may receive nothing before it fails.
    restore_stall: Duration,
    /// The client for batched offset lookups, made at the first lookup.
    lookup: Mutex<Option<BaseConsumer<ClientLogs>>>,
}

impl std::fmt::Debug for KafkaCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaCluster")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaCluster {
    /// Connects with `config` (bootstrap servers and security settings pass
    /// through as given); each lookup waits at most `timeout`.
    pub fn new(config: &ClientConfig, timeout: Duration) -> Result<KafkaCluster, KafkaError> {
        // Watermark lookups follow the client's isolation level, and
        // librdkafka's default is read_committed, which would answer the
        // last stable offset: the end offsets here must be the high
        // watermark.
        let mut admin = crate::settings::for_producer(config);
        admin.set("isolation.level", "read_uncommitted");
        Ok(KafkaCluster {
            config: config.clone(),
            admin: admin.create_with_context(ClientLogs)?,
            timeout,
            names: Mutex::new(BTreeMap::new()),
            replayer: Mutex::new(None),
            restore_stall: timeout.saturating_mul(3),
            lookup: Mutex::new(None),
        })
    }

    /// How long a changelog replay may receive nothing, while its
    /// partition's end lies ahead, before it fails (three lookup timeouts
    /// unless set). A replay that makes progress never times out.
    pub fn with_restore_stall(mut self, stall: Duration) -> KafkaCluster {
        self.restore_stall = stall;
        self
    }

    /// Creates the changelog replay consumer now and connects it to the
    /// cluster (a metadata request for `topics`), so the first restore does
    /// not pay for the client's set-up (about a second on a local broker):
    /// a stream thread calls it before it joins its group.
    pub fn warm_replayer(&self, topics: &[&str]) {
        let mut replayer = self.replayer.lock().unwrap_or_else(|p| p.into_inner());
        if replayer.is_none() {
            match crate::changelog::Replayer::new(&self.config) {
                Ok(r) => *replayer = Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, "the replay consumer could not be made yet");
                    return;
                }
            }
        }
        if let Some(r) = replayer.as_ref() {
            r.warm(topics, self.timeout);
        }
    }

    /// The admin client (for tests and tools that create or delete topics).
    pub fn admin(&self) -> &AdminClient<ClientLogs> {
        &self.admin
    }

    /// Consumer group `group` as its coordinator describes it, under either
    /// group protocol: its state and members. A group that does not exist
    /// comes back `Dead`, without members.
    pub fn describe_group(&self, group: &str) -> Result<topic_ids::GroupDescription, String> {
        topic_ids::describe_group(self.admin.inner(), group, self.timeout)
            .map_err(|e| e.to_string())
    }

    /// How many replicas each partition of `topic` has (the fewest of any
    /// partition), from the cluster's metadata.
    pub fn replication_factor(&self, topic: &str) -> Result<usize, MetadataError> {
        let failed = |message: String| MetadataError::Failed {
            topic: topic.to_owned(),
            message,
        };
        let md = self
            .with_lookup(|client| client.fetch_metadata(Some(topic), self.timeout))
            .map_err(failed)?
            .map_err(|e| failed(e.to_string()))?;
        md.topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.partitions().iter().map(|p| p.replicas().len()).min())
            .ok_or_else(|| MetadataError::Missing(topic.to_owned()))
    }

    /// Describes topics by name.
    pub fn describe_topics(&self, names: &[&str]) -> Result<BTreeMap<String, Described>, String> {
        let answer = topic_ids::describe(self.admin.inner(), names, self.timeout).map_err(|e| {
            // librdkafka sends DescribeTopics to the controller it last
            // heard of, and waits for it while it is down: a metadata
            // answer from a broker that is up names a live one.
            if let Err(refresh) = self.admin.inner().fetch_metadata(None, self.timeout) {
                tracing::debug!(error = %refresh, "the admin client's metadata refresh failed");
            }
            e.to_string()
        })?;
        let mut cache = self.names.lock().unwrap_or_else(|p| p.into_inner());
        for (name, d) in &answer {
            if let Described::Present { id, .. } = d {
                if id.to_u128() == 0 {
                    return Err(format!(
                        "topic {name:?} has no topic id; Parsley needs brokers that serve topic ids"
                    ));
                }
                cache.insert(*id, name.clone());
            }
        }
        Ok(answer)
    }

    /// Every topic name in the cluster.
    fn all_names(&self) -> Result<Vec<String>, String> {
        let md = self
            .admin
            .inner()
            .fetch_metadata(None, self.timeout)
            .map_err(|e| e.to_string())?;
        Ok(md.topics().iter().map(|t| t.name().to_owned()).collect())
    }

    /// The current description of each id: present (with its name and
    /// partition count) only if its name still carries that id.
    fn resolve(
        &self,
        ids: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, Option<(String, i32)>>, String> {
        let known = |ids: &BTreeSet<TopicId>| -> BTreeMap<TopicId, String> {
            let cache = self.names.lock().unwrap_or_else(|p| p.into_inner());
            ids.iter()
                .filter_map(|id| cache.get(id).map(|n| (*id, n.clone())))
                .collect()
        };
        let mut names = known(ids);
        if names.len() < ids.len() {
            // Unknown ids: learn every topic's id once.
            let all = self.all_names()?;
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            self.describe_topics(&refs)?;
            names = known(ids);
        }
        let wanted: BTreeSet<&str> = names.values().map(String::as_str).collect();
        let wanted: Vec<&str> = wanted.into_iter().collect();
        let current = self.describe_topics(&wanted)?;
        Ok(ids
            .iter()
            .map(|id| {
                let answer = names.get(id).and_then(|name| match current.get(name) {
                    Some(Described::Present {
                        id: now,
                        partitions,
                    }) if now == id => Some((name.clone(), *partitions)),
                    _ => None,
                });
                (*id, answer)
            })
            .collect())
    }

    fn offsets(
        &self,
        topics: &BTreeSet<TopicId>,
        end: bool,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        let resolved = self.resolve(topics).map_err(BrokerOffsetsError::new)?;
        let mut out = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        let at = if end { Offset::End } else { Offset::Beginning };
        for (id, answer) in &resolved {
            match answer {
                None => {
                    out.insert(*id, TopicOffsets::Absent);
                }
                Some((name, partitions)) => {
                    for p in 0..*partitions {
                        tpl.add_partition_offset(name, p, at)
                            .map_err(|e| BrokerOffsetsError::new(format!("{name}:{p}: {e}")))?;
                    }
                }
            }
        }
        if tpl.count() == 0 {
            return Ok(out);
        }
        let listed = self
            .list_offsets(tpl.clone())
            .inspect_err(|_| self.refresh_leaders(&tpl))?;
        if listed.elements().iter().any(|e| e.error().is_err()) {
            self.refresh_leaders(&tpl);
        }
        for (id, answer) in resolved {
            let Some((name, partitions)) = answer else {
                continue;
            };
            let mut per = BTreeMap::new();
            for p in 0..partitions {
                let e = listed.find_partition(&name, p).ok_or_else(|| {
                    BrokerOffsetsError::new(format!("{name}:{p}: no offset in the answer"))
                })?;
                if let Err(err) = e.error() {
                    return Err(BrokerOffsetsError::new(format!("{name}:{p}: {err}")));
                }
                match e.offset() {
                    Offset::Offset(o) => {
                        per.insert(p, o);
                    }
                    other => {
                        return Err(BrokerOffsetsError::new(format!(
                            "{name}:{p}: the broker answered {other:?}"
                        )));
                    }
                }
            }
            out.insert(id, TopicOffsets::Present(per));
        }
        Ok(out)
    }

    /// Refreshes the lookup client's view of the leaders of `tpl`'s topics
    /// after a lookup failed. librdkafka does not refresh its metadata
    /// when a ListOffsets answer says a leader is not available, and
    /// refreshes it by itself only every few minutes: after a leader
    /// moved, every lookup of that partition failed until then (seen on
    /// a three-broker cluster as a task that never restarted after its
    /// partition's leader came back).
    fn refresh_leaders(&self, tpl: &TopicPartitionList) {
        let lookup = self.lookup.lock().unwrap_or_else(|p| p.into_inner());
        let Some(consumer) = lookup.as_ref() else {
            return;
        };
        let topics: BTreeSet<String> = tpl
            .elements()
            .iter()
            .map(|e| e.topic().to_owned())
            .collect();
        for topic in topics {
            if let Err(e) = consumer.fetch_metadata(Some(&topic), self.timeout) {
                tracing::debug!(%topic, error = %e, "the lookup client's metadata refresh failed");
            }
        }
    }

    /// One ListOffsets round for every partition of `tpl` (its offsets say
    /// which: `Offset::End`, the high watermark, or `Offset::Beginning`, the
    /// log start): librdkafka sends one request per partition leader, where
    /// a watermark lookup per partition cost two requests each.
    fn list_offsets(
        &self,
        tpl: TopicPartitionList,
    ) -> Result<TopicPartitionList, BrokerOffsetsError> {
        self.with_lookup(|consumer| consumer.offsets_for_times(tpl, self.timeout))
            .map_err(BrokerOffsetsError::new)?
            .map_err(|e| BrokerOffsetsError::new(e.to_string()))
    }

    /// Runs `f` with the lookup client (offsets and metadata), made at
    /// the first lookup.
    fn with_lookup<T>(&self, f: impl FnOnce(&BaseConsumer<ClientLogs>) -> T) -> Result<T, String> {
        let mut lookup = self.lookup.lock().unwrap_or_else(|p| p.into_inner());
        let consumer = match &mut *lookup {
            Some(c) => c,
            slot @ None => {
                let mut config = crate::settings::for_consumer(&self.config);
                // The high watermark, not the last stable offset (see the
                // module documentation).
                config
                    .set("isolation.level", "read_uncommitted")
                    .set("group.id", "parsley-offset-lookups")
                    .set("enable.auto.commit", "false")
                    .remove("transactional.id");
                slot.insert(
                    config
                        .create_with_context(ClientLogs)
                        .map_err(|e: KafkaError| format!("cannot create the lookup client: {e}"))?,
                )
            }
        };
        Ok(f(consumer))
    }
}

impl ChangelogReader for KafkaCluster {
    fn replay_changelog_from(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        apply: &mut dyn FnMut(ChangelogRecord),
    ) -> Result<i64, MetadataError> {
        let mut replayer = self.replayer.lock().unwrap_or_else(|p| p.into_inner());
        let r = match &mut *replayer {
            Some(r) => r,
            slot @ None => {
                slot.insert(crate::changelog::Replayer::new(&self.config).map_err(|e| {
                    MetadataError::Failed {
                        topic: topic.to_owned(),
                        message: e.to_string(),
                    }
                })?)
            }
        };
        let started = std::time::Instant::now();
        let (records, reached) = r.replay(topic, partition, from, self.restore_stall, apply)?;
        tracing::debug!(%topic, partition, from, records, reached, elapsed = ?started.elapsed(), "changelog partition replayed");
        Ok(reached)
    }
}

impl TopicMetadata for KafkaCluster {
    fn describe(&self, topic: &str) -> Result<TopicDescription, MetadataError> {
        let answer = self
            .describe_topics(&[topic])
            .map_err(|message| MetadataError::Failed {
                topic: topic.to_owned(),
                message,
            })?;
        match answer.get(topic) {
            Some(Described::Present { id, partitions }) => Ok(TopicDescription {
                id: *id,
                partitions: *partitions,
            }),
            _ => Err(MetadataError::Missing(topic.to_owned())),
        }
    }
}

impl BrokerOffsets for KafkaCluster {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.offsets(topics, true)
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.offsets(topics, false)
    }
}
