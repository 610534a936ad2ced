//! The transaction: records produced, offsets sent with the group's metadata,
//! the commit, and each failed step handed to the worker as a fault whose
//! directive is followed.

use super::*;

/// One record the producer could not produce: its index in the
/// transaction, and the client's or the broker's reason.
#[derive(Clone, Debug)]
pub(super) struct RecordFailure {
    record: usize,
    error: String,
}

/// The transactional producer's context: it keeps the first record-level
/// failure its delivery reports carry (each record's opaque is its index in
/// the transaction), for the commit to hand to the worker as
/// [`Fault::RecordRefused`] instead of an abort-and-retry loop on the same
/// record.
#[derive(Default)]
pub(super) struct Deliveries {
    failed: Mutex<Option<RecordFailure>>,
    /// The offset each record of the open transaction got (-1 until its
    /// report arrives), for the worker's local store checkpoints.
    offsets: Mutex<Vec<i64>>,
}

impl Deliveries {
    fn record(&self, failure: RecordFailure) {
        lock(&self.failed).get_or_insert(failure);
    }

    /// A new transaction of `records` records begins.
    fn begin(&self, records: usize) {
        let mut offsets = lock(&self.offsets);
        offsets.clear();
        offsets.resize(records, -1);
    }

    fn take(&self) -> Option<RecordFailure> {
        lock(&self.failed).take()
    }
}

impl ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, record: usize) {
        use rdkafka::types::RDKafkaErrorCode::{PurgeInflight, PurgeQueue};
        if let Ok(m) = result {
            if let Some(slot) = lock(&self.offsets).get_mut(record) {
                *slot = rdkafka::Message::offset(m);
            }
            return;
        }
        if let Err((e, _)) = result {
            // Records purged because the transaction failed are its
            // consequence, not its cause.
            if matches!(e.rdkafka_error_code(), Some(PurgeQueue | PurgeInflight)) {
                return;
            }
            self.record(RecordFailure {
                record,
                error: e.to_string(),
            });
        }
    }
}

pub(super) type TxnProducer = BaseProducer<Deliveries>;

/// How long one wait for delivery reports lasts before the count of
/// unacknowledged records is read again.
const DELIVERY_POLL: Duration = Duration::from_millis(1);

impl Shared {
    /// Produces the transaction's records, sends its offsets with the
    /// consumer's group metadata, and commits. A step that fails is handed
    /// to the worker as a [`Fault`] of the client's own class, and the
    /// worker's [`Directive`] is followed: retry the step, abort (the worker
    /// rolls back and asks for seeks; a refused record stops its task),
    /// rejoin the group, or fail the thread.
    pub(super) fn commit(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        txn: Transaction,
    ) -> Result<(), StreamsError> {
        match self.try_commit(consumer, &txn) {
            Ok(()) => {
                if self.worker.has_local_store() {
                    let offsets = lock(&self.producer.context().offsets);
                    self.worker
                        .advance(Ack::Delivered(&offsets), &self.cluster)?;
                }
                self.worker
                    .advance(Ack::Committed(CommitOutcome::Committed), &self.cluster)?;
                debug!(
                    txn = txn.id,
                    records = txn.records.len(),
                    "transaction committed"
                );
                Ok(())
            }
            Err(Directive::Abort) => {
                warn!(txn = txn.id, "transaction aborted; the tasks roll back");
                self.abort_open(&txn)
            }
            Err(d) => self.follow(d),
        }
    }

    /// Follows a directive that ends the transaction without an abort.
    pub(super) fn follow(&mut self, d: Directive) -> Result<(), StreamsError> {
        match d {
            Directive::Rejoin => {
                self.rejoin = Some("the worker dropped every task".to_owned());
                Ok(())
            }
            Directive::Fail(e) => Err((*e).into()),
            // Handled where they arise.
            Directive::Abort | Directive::Retry { .. } | Directive::Continue => Ok(()),
        }
    }

    /// Aborts the open transaction and tells the worker, which rolls back.
    /// When the abort fails, the coordinator may already have ended the
    /// transaction (a member that froze past its transaction timeout):
    /// the worker hears [`Fault::AbortFailed`], and a new producer fences
    /// whatever state this one is in.
    fn abort_open(&mut self, txn: &Transaction) -> Result<(), StreamsError> {
        // librdkafka aborts only once the delivery reports of the records
        // already sent have been served.
        let _ = await_deliveries(&self.producer, self.timeout);
        match self.producer.abort_transaction(self.timeout) {
            Ok(()) => {
                self.worker
                    .advance(Ack::Committed(CommitOutcome::Aborted), &self.cluster)?;
                Ok(())
            }
            Err(abort) => {
                warn!(txn = txn.id, error = %abort, "the abort failed");
                let d = self.worker.on_fault(Fault::AbortFailed(abort.to_string()));
                self.follow(d)
            }
        }
    }

    /// The fault a failed step of `txn` is: a record the delivery reports
    /// refused, if one was; else the error's own class.
    fn fault_of(&self, txn: &Transaction, e: &KafkaError) -> Fault {
        if let Some(f) = self.producer.context().take()
            && let Some(r) = txn.records.get(f.record)
        {
            return Fault::RecordRefused {
                record: f.record,
                topic: r.topic.to_string(),
                partition: r.partition,
                origin: r.origin,
                reason: f.error,
            };
        }
        classify(e)
    }

    /// Runs one step of a commit, retrying it as long as the worker says.
    pub(super) fn step(
        &mut self,
        txn: &Transaction,
        mut f: impl FnMut(&TxnProducer) -> Result<(), KafkaError>,
    ) -> Result<(), Directive> {
        loop {
            let Err(e) = f(&self.producer) else {
                return Ok(());
            };
            let fault = self.fault_of(txn, &e);
            match self.worker.on_fault(fault) {
                Directive::Retry { after } => std::thread::sleep(after),
                d => return Err(d),
            }
        }
    }

    fn try_commit(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        txn: &Transaction,
    ) -> Result<(), Directive> {
        // The commit's steps are DEBUG events, so a latency breakdown (the
        // throughput example's) can time them with a tracing layer.
        debug!(
            txn = txn.id,
            records = txn.records.len(),
            "transaction producing"
        );
        self.step(txn, |p| p.begin_transaction())?;
        if self.worker.has_local_store() {
            self.producer.context().begin(txn.records.len());
        }
        for (i, r) in txn.records.iter().enumerate() {
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&r.topic, i)
                .partition(r.partition)
                .timestamp(r.timestamp);
            // No header list for a record without headers (a changelog
            // write): librdkafka allocates one per list.
            let count = r.header_count();
            if count > 0 {
                // The stamp, encoded when the record was emitted, is
                // written straight into librdkafka's list (which copies
                // each value).
                let mut headers = Some(OwnedHeaders::new_with_capacity(count));
                r.write_headers(|key, value| {
                    headers = headers
                        .take()
                        .map(|hs| hs.insert(rdkafka::message::Header { key, value }));
                });
                if let Some(headers) = headers {
                    record = record.headers(headers);
                }
            }
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                record = record.payload(v.as_slice());
            }
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((
                        KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        back,
                    )) => {
                        self.producer.poll(Duration::from_millis(10));
                        record = back;
                    }
                    Err((e, _)) => {
                        // The client refused the record itself (larger than
                        // its message.max.bytes, say).
                        return Err(self.worker.on_fault(Fault::RecordRefused {
                            record: i,
                            topic: r.topic.to_string(),
                            partition: r.partition,
                            origin: r.origin,
                            reason: e.to_string(),
                        }));
                    }
                }
            }
        }
        let mut offsets = TopicPartitionList::new();
        for o in &txn.offsets {
            if let Err(e) =
                offsets.add_partition_offset(&o.topic, o.partition, Offset::Offset(o.offset))
            {
                return Err(self.worker.on_fault(classify(&e)));
            }
        }
        let Some(metadata) = consumer.group_metadata() else {
            return Err(self.worker.on_fault(Fault::Fenced(
                "the consumer has no group metadata: it is not a member of the group".to_owned(),
            )));
        };
        let timeout = self.timeout;
        self.step(txn, |p| {
            p.send_offsets_to_transaction(&offsets, &metadata, timeout)
        })?;
        self.step(txn, |p| await_deliveries(p, timeout))?;
        debug!(txn = txn.id, "transaction ending");
        self.step(txn, |p| p.commit_transaction(timeout))
    }
}

/// Sorts a client error into the worker's fault classes by the client's
/// own flags and codes, and nothing more: fencing codes, then librdkafka's
/// fatal, abortable and retriable flags. A transaction error with none of
/// them (a call in the wrong state) counts as fatal; the delivery wait
/// running out is abortable (the abort purges what is in flight).
fn classify(e: &KafkaError) -> Fault {
    use rdkafka::types::RDKafkaErrorCode::{
        Fenced, InvalidProducerEpoch, OperationTimedOut, ProducerFenced,
    };
    let message = e.to_string();
    if matches!(
        e.rdkafka_error_code(),
        Some(Fenced | ProducerFenced | InvalidProducerEpoch)
    ) {
        return Fault::Fenced(message);
    }
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => Fault::Fatal(message),
        KafkaError::Transaction(t) if t.txn_requires_abort() => Fault::Abortable(message),
        KafkaError::Transaction(t) if t.is_retriable() => Fault::Retriable(message),
        KafkaError::Flush(OperationTimedOut) => Fault::Abortable(message),
        _ => Fault::Fatal(message),
    }
}

/// Serves the producer's delivery reports until every record it was given
/// is acknowledged (or `timeout` passes), in waits of [`DELIVERY_POLL`].
///
/// Committing needs every record of the transaction acknowledged first.
/// rdkafka's `commit_transaction` does that by flushing, and its flush
/// waits in polls of 100 ms that run to their end even when the last
/// acknowledgement came a millisecond in: every commit with records in it
/// then took at least 100 ms (measured: median 103 ms, minimum 101.7 ms,
/// for an EndTxn round trip of about 3 ms). With nothing left in flight,
/// the flush inside `commit_transaction` returns at once.
fn await_deliveries(producer: &TxnProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(KafkaError::Flush(
                rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
            ));
        }
        producer.poll(DELIVERY_POLL);
    }
    Ok(())
}
