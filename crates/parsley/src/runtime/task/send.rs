//! The record path out: an emission partitioned, stamped for its concrete
//! channel and encoded, or diverted to a dead-letter topic.

use super::*;

impl Task {
    /// The topic's name, shared (a reference count, no copy).
    pub(super) fn shared_topic_name(&self, topic: TopicId) -> std::sync::Arc<str> {
        self.names
            .get(&topic)
            .cloned()
            .unwrap_or_else(|| topic.to_string().into())
    }

    pub(super) fn topic_name(&self, topic: TopicId) -> String {
        self.names
            .get(&topic)
            .map_or_else(|| topic.to_string(), |name| name.to_string())
    }

    /// The single stamping site: check the sink, encode, partition, stamp.
    /// The emission is consumed: its key, value and headers become the
    /// record's, copied only where a codec must write new bytes.
    pub(super) fn send(
        &mut self,
        emission: Emission,
        default_timestamp: i64,
        origin: EmissionOrigin,
    ) -> Result<(), TaskError> {
        let at = (origin.channel, origin.offset);
        // `sinks` holds exactly the stage's declared sinks (the tick topic
        // is routed separately).
        let sink = match self.sinks.get(emission.topic()) {
            Some(s) => s.clone(),
            None => {
                return Err(TaskError::UndeclaredSink {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    topic: emission.topic().to_owned(),
                });
            }
        };
        // Read before the emission is given to the encoder, reported after
        // it (an encoding failure is the one reported when there are both).
        let reserved = emission
            .headers()
            .iter()
            .find(|h| is_causal_header(&h.name))
            .map(|h| h.name.to_string());
        // The sink's name is the emission's (the sinks are found by it).
        let topic = sink.topic.name();
        // Encoded with the declared sink's codecs, under the panic guard
        // like every other call into user code.
        let encoded = match catch_unwind(AssertUnwindSafe(|| sink.topic.encode_emission(emission)))
        {
            Err(payload) => {
                return Err(TaskError::Panic {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    message: format!(
                        "while encoding an emission to {topic:?}: {}",
                        panic_message(payload)
                    ),
                });
            }
            Ok(None) => {
                let (key, value) = (sink.topic.key_type().1, sink.topic.value_type().1);
                return Err(TaskError::SinkTypes {
                    task: self.id.clone(),
                    coordinate: self.coordinate(at),
                    topic: topic.to_owned(),
                    declared: format!("Topic<{key}, {value}>"),
                });
            }
            Ok(Some(r)) => r.map_err(|(part, source)| TaskError::Encode {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                part,
                cause: source,
            })?,
        };
        if let Some(header) = reserved {
            return Err(TaskError::ReservedHeader {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                header,
            });
        }
        let timestamp = encoded.timestamp.unwrap_or(default_timestamp);
        if timestamp < 0 {
            return Err(TaskError::NegativeTimestamp {
                task: self.id.clone(),
                coordinate: self.coordinate(at),
                topic: topic.to_owned(),
                timestamp,
            });
        }
        if let Some(d) = self.stores.diverted.get(&origin).cloned() {
            self.divert(topic, encoded, timestamp, origin, &d);
            return Ok(());
        }
        let partition = sink.topic.partitioner().partition_for(
            encoded.key.as_deref(),
            self.id.partition,
            sink.partitions,
        );
        let stamp = self
            .stamps
            .stamp(&mut self.node, Channel::new(sink.id, partition), sink.clock)
            .map_err(|e| self.protocol(e))?;
        self.stats.emitted += 1;
        if self.record_events {
            self.events.push(TaskEvent::Sent {
                topic: topic.to_owned(),
                partition,
                tick: false,
            });
        }
        self.outgoing.push(OutgoingRecord {
            // The sink's name as the task holds it, shared.
            topic: self
                .names
                .get(&sink.id)
                .cloned()
                .unwrap_or_else(|| topic.into()),
            partition,
            key: encoded.key.map(RecordBytes::from),
            value: encoded.value.map(RecordBytes::from),
            timestamp,
            stamp: Some(stamp),
            headers: encoded.headers,
            origin: Some(origin),
        });
        Ok(())
    }

    /// Sends an emission the sink refused to its dead-letter topic instead:
    /// unstamped (it takes no send sequence, so no record's claims wait for
    /// it), with the emission's own headers and where it came from and why.
    fn divert(
        &mut self,
        sink: &str,
        encoded: crate::topic::EncodedEmission,
        timestamp: i64,
        origin: EmissionOrigin,
        d: &Diversion,
    ) {
        let coordinate = self.coordinate((origin.channel, origin.offset));
        let sink = sink.to_owned();
        let partition = partition_for(encoded.key.as_deref(), self.id.partition, d.partitions);
        warn!(task = %self.id, %coordinate, %sink, dead_letter = %d.topic, reason = %d.reason,
            "an emission the sink refused goes to the dead-letter topic instead");
        self.stats.diverted += 1;
        let mut headers: Vec<Header> = encoded.headers;
        for (name, value) in [
            (crate::topic::DEAD_LETTER_ERROR, d.reason.clone()),
            (crate::topic::DEAD_LETTER_TOPIC, coordinate.topic.clone()),
            (
                crate::topic::DEAD_LETTER_PARTITION,
                coordinate.partition.to_string(),
            ),
            (
                crate::topic::DEAD_LETTER_OFFSET,
                coordinate.offset.to_string(),
            ),
            (DEAD_LETTER_SINK, sink.clone()),
        ] {
            headers.push(Header::new(name, value.into_bytes()));
        }
        if self.record_events {
            self.events.push(TaskEvent::Diverted {
                topic: d.topic.clone(),
                partition,
                sink,
            });
        }
        self.outgoing.push(OutgoingRecord {
            topic: d.topic.as_str().into(),
            partition,
            key: encoded.key.map(RecordBytes::from),
            value: encoded.value.map(RecordBytes::from),
            timestamp,
            stamp: None,
            headers,
            origin: Some(origin),
        });
    }
}
