//! The topics an application needs: sinks, changelogs and the diagnostics
//! topic checked or created before any thread starts, and a changelog's
//! settings held to what exactly-once replay requires.

use super::*;

impl CausalStreams {
    /// Checks (and creates) the application's topics; returns the smallest
    /// `max.message.bytes` of the topics its transactional producers write
    /// that exist now (sinks, dead-letter and tick topics, changelogs), if
    /// any could be read: the producers' batches are held under it.
    pub(super) fn prepare_topics(
        &self,
        cluster: &KafkaCluster,
    ) -> Result<Option<u64>, StreamsError> {
        let mut creates = Vec::new();
        let mut written: Vec<String> = Vec::new();
        // The control topic carries application-wide shutdown requests.
        let control = policy::control_topic(self.app.application_id());
        match cluster.describe(&control) {
            Ok(_) => {}
            Err(MetadataError::Missing(_)) => creates.push((control, 1)),
            Err(e) => return Err(e.into()),
        }
        // The diagnostics topic carries each thread's holds, for `parsley
        // holds`.
        let diagnostics = diagnostics_topic(self.app.application_id());
        match cluster.describe(&diagnostics) {
            Ok(_) => {}
            Err(MetadataError::Missing(_)) => creates.push((diagnostics, 1)),
            Err(e) => return Err(e.into()),
        }
        for stage in self.app.stages() {
            // Partition p of every source (and of the tick topic) meets in
            // task p: they must agree on the count.
            let mut counts: Vec<(String, i32)> = Vec::new();
            let tick = self.app.tick_topic(stage.name());
            let mut topics: Vec<&str> = stage.source_topics();
            topics.extend(stage.sink_topics());
            topics.extend(tick);
            topics.extend(stage.corrupt_headers_dead_letter());
            written.extend(stage.sink_topics().iter().map(|t| (*t).to_owned()));
            written.extend(tick.map(str::to_owned));
            written.extend(stage.corrupt_headers_dead_letter().map(str::to_owned));
            for t in topics {
                match cluster.describe(t) {
                    Ok(d) => {
                        if stage.source_topics().contains(&t) || tick == Some(t) {
                            counts.push((t.to_owned(), d.partitions));
                        }
                    }
                    Err(MetadataError::Missing(_)) => {
                        return Err(StreamsError::MissingTopic {
                            topic: t.to_owned(),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let tasks = counts.first().map_or(1, |(_, n)| *n);
            if counts.iter().any(|(_, n)| *n != tasks) {
                return Err(StreamsError::PartitionCounts {
                    stage: stage.name().to_owned(),
                    counts,
                });
            }
            let Some(names) = self.app.owned_names(stage.name()) else {
                continue;
            };
            for changelog in std::iter::once(&names.state_changelog).chain(&names.fold_changelog) {
                match cluster.describe(changelog) {
                    Ok(d) => {
                        self.check_changelog(cluster, changelog, d.partitions, tasks)?;
                        written.push(changelog.clone());
                    }
                    Err(MetadataError::Missing(_)) => creates.push((changelog.clone(), tasks)),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let cap = self.smallest_max_message_bytes(cluster, &written);
        if creates.is_empty() {
            return Ok(cap);
        }
        let topics: Vec<NewTopic<'_>> = creates
            .iter()
            .map(|(name, n)| {
                let replication = self.options.replication_factor.map_or(-1, i32::from);
                let t = NewTopic::new(name, *n, TopicReplication::Fixed(replication));
                if name.ends_with("-control") {
                    // Requests matter only to instances running when they
                    // are made; a day of them is plenty.
                    t.set("cleanup.policy", "delete")
                        .set("retention.ms", "86400000")
                } else {
                    CHANGELOG_SETTINGS.iter().fold(t, |t, (k, v)| t.set(k, v))
                }
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(self.options.request_timeout));
        for result in block_on(cluster.admin().create_topics(&topics, &opts))? {
            match result {
                Ok(name) => info!(topic = %name, "topic created"),
                Err((name, code)) => {
                    if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                        return Err(StreamsError::Kafka(KafkaError::AdminOp(code))).inspect_err(
                            |_| {
                                warn!(topic = %name, "changelog topic could not be created");
                            },
                        );
                    }
                }
            }
        }
        // Creation settles asynchronously.
        for (name, _) in &creates {
            let deadline = Instant::now() + self.options.request_timeout;
            while cluster.describe(name).is_err() {
                if Instant::now() > deadline {
                    return Err(StreamsError::MissingTopic {
                        topic: name.clone(),
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(cap)
    }

    /// The smallest `max.message.bytes` among `topics`, as the brokers
    /// report each topic's setting (`None` when none could be read: the
    /// producers then keep their own batch size). librdkafka does not
    /// split a batch the broker refuses as too large: it fails every
    /// record of it, valid ones included, so batches must fit the
    /// smallest topic they may go to.
    fn smallest_max_message_bytes(&self, cluster: &KafkaCluster, topics: &[String]) -> Option<u64> {
        if topics.is_empty() {
            return None;
        }
        let opts = AdminOptions::new().request_timeout(Some(self.options.request_timeout));
        let specs: Vec<ResourceSpecifier<'_>> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let answer = match block_on(cluster.admin().describe_configs(&specs, &opts)) {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "the topics' max.message.bytes could not be read; batches keep the producer's own size");
                return None;
            }
        };
        answer
            .into_iter()
            .filter_map(Result::ok)
            .filter_map(|r| {
                r.get("max.message.bytes")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .min()
    }

    /// An existing changelog must have one partition per task (task `p`
    /// writes partition `p`) and be compacted only: a `delete` policy (also
    /// `compact,delete`) lets retention remove a held record or a fold
    /// entry that a restore needs, which would lose it silently.
    fn check_changelog(
        &self,
        cluster: &KafkaCluster,
        topic: &str,
        partitions: i32,
        tasks: i32,
    ) -> Result<(), StreamsError> {
        if partitions != tasks {
            return Err(StreamsError::Changelog {
                topic: topic.to_owned(),
                reason: format!(
                    "it has {partitions} partition(s) but the stage runs {tasks} task(s); a changelog needs one partition per task"
                ),
            });
        }
        let opts = AdminOptions::new().request_timeout(Some(self.options.request_timeout));
        let resources = block_on(
            cluster
                .admin()
                .describe_configs([&ResourceSpecifier::Topic(topic)], &opts),
        )?;
        let config = resources.into_iter().next().and_then(Result::ok);
        let setting = |name: &str| {
            config
                .as_ref()
                .and_then(|r| r.get(name).and_then(|e| e.value.clone()))
        };
        let policy = setting("cleanup.policy").ok_or_else(|| StreamsError::Changelog {
            topic: topic.to_owned(),
            reason: "its cleanup.policy could not be read".to_owned(),
        })?;
        if let Some(wanted) = self.options.replication_factor {
            let min_isr = setting("min.insync.replicas").and_then(|v| v.parse::<usize>().ok());
            match cluster.replication_factor(topic) {
                Ok(replicas) => {
                    for warning in replication_warnings(wanted, replicas, min_isr) {
                        warn!(%topic, replicas, min_insync_replicas = ?min_isr, asked = wanted, "{warning}");
                    }
                }
                Err(e) => {
                    warn!(%topic, error = %e, "the changelog's replication could not be read");
                }
            }
        }
        let parts: Vec<&str> = policy.split(',').map(str::trim).collect();
        if parts != ["compact"] {
            return Err(StreamsError::Changelog {
                topic: topic.to_owned(),
                reason: format!(
                    "its cleanup.policy is {policy:?}; it must be \"compact\", or retention could delete state a restore needs"
                ),
            });
        }
        Ok(())
    }
}

/// What is wrong, for an operator, with a changelog replicated `replicas`
/// times with `min.insync.replicas` at `min_isr`, when the application asks
/// for `wanted` replicas: fewer replicas than asked, and, at three or more,
/// a write acknowledged by a single replica.
fn replication_warnings(wanted: i16, replicas: usize, min_isr: Option<usize>) -> Vec<String> {
    let mut out = Vec::new();
    let wanted = usize::try_from(wanted).unwrap_or(0);
    if replicas < wanted {
        out.push(format!(
            "the changelog has {replicas} replica(s), fewer than the {wanted} asked (StreamsOptions::replication_factor): a broker lost can take the state it holds with it; raise it with kafka-reassign-partitions"
        ));
    }
    if replicas >= 3 && min_isr.is_some_and(|m| m < 2) {
        out.push(format!(
            "the changelog's min.insync.replicas is {}: with {replicas} replicas, a write can be acknowledged by one broker alone and lost with it; set it to 2",
            min_isr.unwrap_or(1)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::replication_warnings;

    #[test]
    fn a_changelog_replicated_less_than_asked_is_warned_about() {
        assert!(replication_warnings(3, 3, Some(2)).is_empty());
        assert!(replication_warnings(1, 1, Some(1)).is_empty());
        let fewer = replication_warnings(3, 1, Some(1));
        assert_eq!(fewer.len(), 1);
        assert!(
            fewer[0].contains("1 replica(s), fewer than the 3 asked"),
            "{fewer:?}"
        );
        let one_ack = replication_warnings(3, 3, Some(1));
        assert_eq!(one_ack.len(), 1);
        assert!(
            one_ack[0].contains("min.insync.replicas is 1"),
            "{one_ack:?}"
        );
        assert_eq!(replication_warnings(3, 2, Some(1)).len(), 1);
    }
}
