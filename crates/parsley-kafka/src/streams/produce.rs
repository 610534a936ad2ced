//! The transaction: records produced into it as the tasks make them
//! (the worker's [`Ready::produce`]), the rest at the commit with the
//! offsets sent with the group's metadata, the commit, and each failed
//! step handed to the worker as a fault whose directive is followed.

use super::classify::{self, RecordClass};
use super::*;
use parsley::runtime::task::OutgoingRecord;

/// One record the producer could not produce: its index in the
/// transaction, what its error says about it, and the client's or the
/// broker's reason.
#[derive(Clone, Debug)]
pub(super) struct RecordFailure {
    record: usize,
    class: RecordClass,
    error: String,
}

/// The transactional producer's context: it keeps the most telling
/// record-level failure its delivery reports carry in the open transaction
/// (each record's opaque is its index in the transaction), for the commit
/// to hand to the worker by its class ([`classify::record_class`]) instead
/// of an abort-and-retry loop on the same record.
#[derive(Default)]
pub(super) struct Deliveries {
    failed: Mutex<Option<RecordFailure>>,
    /// How many records of the open transaction were refused. A broker that
    /// refuses a batch may fail every record of it with the culprit's code
    /// (Kafka 4 does for a null key on a compacted topic), so more than one
    /// does not say which.
    refused: std::sync::atomic::AtomicUsize,
    /// The transaction is retried one record per batch, so that the
    /// broker's refusal names one record; set after an ambiguous refusal,
    /// until a transaction commits.
    isolating: AtomicBool,
    /// The offset each record of the open transaction got (-1 until its
    /// report arrives), for the worker's local store checkpoints.
    offsets: Mutex<Vec<i64>>,
}

impl Deliveries {
    /// Keeps `failure` if it says more than the one kept: fencing, then a
    /// fatal error, then a refused record, then a transient failure (a
    /// refused record among timed-out ones is the one to act on: it fails
    /// the same way on every retry), the first of each class.
    fn record(&self, failure: RecordFailure) {
        if failure.class == RecordClass::Refused {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        let mut kept = lock(&self.failed);
        if kept.as_ref().is_none_or(|k| failure.class > k.class) {
            *kept = Some(failure);
        }
    }

    /// A new transaction begins: whatever failed in an earlier one
    /// (aborted since) is no longer this one's.
    fn begin(&self) {
        *lock(&self.failed) = None;
        self.refused.store(0, Ordering::SeqCst);
        lock(&self.offsets).clear();
    }

    /// Whether records are sent one per batch (each waited for before the
    /// next is sent).
    pub(super) fn isolating(&self) -> bool {
        self.isolating.load(Ordering::SeqCst)
    }

    /// A transaction committed: batches as usual again.
    fn committed(&self) {
        self.isolating.store(false, Ordering::SeqCst);
    }

    /// Room for the offsets of the transaction's records up to `records`
    /// (exclusive), before they are sent.
    fn reserve(&self, records: usize) {
        let mut offsets = lock(&self.offsets);
        if offsets.len() < records {
            offsets.resize(records, -1);
        }
    }

    /// The failure to act on. Several records refused together, outside
    /// an isolating retry, blame none of them: the failure becomes a
    /// transient one, and the retry sends one record per batch.
    fn take(&self) -> Option<RecordFailure> {
        let failure = lock(&self.failed).take()?;
        let refused = self.refused.swap(0, Ordering::SeqCst);
        if failure.class == RecordClass::Refused && refused > 1 && !self.isolating() {
            self.isolating.store(true, Ordering::SeqCst);
            return Some(RecordFailure {
                class: RecordClass::Transient,
                error: format!(
                    "{refused} records were refused together ({}): a batch fails whole, so which one the broker refuses is not known; the transaction is retried with one record per batch",
                    failure.error
                ),
                ..failure
            });
        }
        Some(failure)
    }
}

impl ClientContext for Deliveries {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::logs::client_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        crate::logs::client_error(&error, reason);
    }
}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, record: usize) {
        use rdkafka::types::RDKafkaErrorCode::{PurgeInflight, PurgeQueue};
        match result {
            Ok(m) => {
                if let Some(slot) = lock(&self.offsets).get_mut(record) {
                    *slot = rdkafka::Message::offset(m);
                }
            }
            Err((e, _)) => {
                let code = e.rdkafka_error_code();
                // Records purged because the transaction failed are its
                // consequence, not its cause.
                if matches!(code, Some(PurgeQueue | PurgeInflight)) {
                    return;
                }
                self.record(RecordFailure {
                    record,
                    class: code.map_or(RecordClass::Fatal, classify::record_class),
                    error: e.to_string(),
                });
            }
        }
    }
}

pub(super) type TxnProducer = BaseProducer<Deliveries>;

/// Where one record of the open transaction went, and what made it: what a
/// refusal of the record names, after the record itself is gone.
struct Place {
    topic: Arc<str>,
    partition: i32,
    origin: Option<parsley::task::EmissionOrigin>,
}

/// The producer's open transaction, as this host keeps it.
#[derive(Default)]
pub(super) struct OpenTxn {
    /// The producer's transaction began (at its first record, or at the
    /// commit of one with none streamed).
    begun: bool,
    /// Each record's place, by its index in the transaction.
    places: Vec<Place>,
}

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
                debug!(txn = txn.id, "transaction aborts; the tasks roll back");
                self.abort_open()
            }
            Err(d) => self.follow_directive(d),
        }
    }

    /// Produces records the worker streams into the open transaction
    /// ([`Ready::produce`]), beginning it with its first. A record the
    /// client refuses at once is kept as the transaction's failure and
    /// closes the transaction, so its commit meets the failure and the
    /// worker's answer to it is followed there, as for a delivery report.
    pub(super) fn stream(
        &mut self,
        first: usize,
        records: &[OutgoingRecord],
    ) -> Result<(), StreamsError> {
        // The worker never streams beside a transaction it hands over, so
        // nothing is in flight here.
        match self.send_records(first, records) {
            Ok(()) => Ok(()),
            // The refusal has not reached the worker yet: the commit hands
            // it over.
            Err(Sent::Refused) => Ok(self.worker.flush()?),
            Err(Sent::Answered(d)) => self.follow_open(d),
        }
    }

    /// Follows the worker's answer to a fault met outside a commit (a
    /// transaction that would not begin): an abort or a new producer ends
    /// the open work, which the worker rolls back.
    fn follow_open(&mut self, d: Directive) -> Result<(), StreamsError> {
        match d {
            Directive::Abort => Ok(self.worker.abort(&self.cluster)?),
            Directive::ReplaceProducer => {
                self.replace_producer()?;
                Ok(self.worker.abort(&self.cluster)?)
            }
            d => self.follow_directive(d),
        }
    }

    /// The worker aborted an open transaction that records were streamed
    /// into ([`Ready::abort_streamed`]): it is aborted on the producer too.
    pub(super) fn abort_streamed(&mut self) -> Result<(), StreamsError> {
        if !self.open.begun {
            return Ok(());
        }
        self.abort_producer().map(|_| ())
    }

    /// Follows a directive that ends the transaction without an abort.
    pub(super) fn follow_directive(&mut self, d: Directive) -> Result<(), StreamsError> {
        match d {
            Directive::Rejoin => {
                self.rejoin = Some("the worker dropped every task".to_owned());
                Ok(())
            }
            Directive::Fail(e) => Err((*e).into()),
            Directive::ReplaceProducer => self.replace_producer(),
            // Handled where they arise.
            Directive::Abort | Directive::Retry { .. } | Directive::Continue => Ok(()),
        }
    }

    /// Replaces the producer with a new one of the same transactional id
    /// (its initialisation ends what the old one left open), then tells
    /// the worker the transaction in flight, if one was, aborted: the
    /// tasks go on from their committed state in the same membership. A
    /// failed initialisation is the worker's to judge like any other step.
    fn replace_producer(&mut self) -> Result<(), StreamsError> {
        self.open = OpenTxn::default();
        use rdkafka::producer::PurgeConfig;
        // Nothing of the old producer's is wanted any more: purged, its
        // drop waits for nothing.
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
        loop {
            let producer: TxnProducer = self
                .producer_config
                .create_with_context(Deliveries::default())?;
            match producer.init_transactions(self.timeout) {
                Ok(()) => {
                    self.producer = Arc::new(producer);
                    break;
                }
                Err(e) => match self.worker.on_fault(classify::step_fault(&e)) {
                    Directive::Retry { after } => std::thread::sleep(after),
                    // Counted by the worker: another attempt, or a
                    // directive to give the membership up.
                    Directive::ReplaceProducer => {}
                    d => return self.follow_directive(d),
                },
            }
        }
        info!("producer replaced; the tasks go on from their committed state");
        if self.worker.in_flight() {
            self.worker
                .advance(Ack::Committed(CommitOutcome::Aborted), &self.cluster)?;
        }
        self.count_restores();
        Ok(())
    }

    /// Aborts the transaction in flight and tells the worker, which rolls
    /// back.
    fn abort_open(&mut self) -> Result<(), StreamsError> {
        if self.abort_producer()? {
            self.worker
                .advance(Ack::Committed(CommitOutcome::Aborted), &self.cluster)?;
        }
        Ok(())
    }

    /// Aborts the producer's open transaction; true when it did. An abort
    /// that fails is the worker's to judge ([`Fault::AbortFailed`], by
    /// [`classify::abort_fault`]): one that could not reach its
    /// coordinator (unreachable, moving to another broker) is made again
    /// after a pause; one the coordinator refused, or that keeps failing,
    /// has the producer replaced (the new one's initialisation ends
    /// whatever state this one left its transaction in, and the worker
    /// hears of the abort from there), and false is returned then, as it
    /// is when the answer ends the membership.
    fn abort_producer(&mut self) -> Result<bool, StreamsError> {
        // librdkafka aborts only once the delivery reports of the records
        // already sent have been served.
        // An abort that cannot finish in a few seconds is better replaced
        // by a new producer (the worker's call) than waited for.
        let timeout = self.txn_timeout.min(ABORT_TIMEOUT);
        let _ = await_deliveries(&self.producer, timeout);
        loop {
            match self.producer.abort_transaction(timeout) {
                Ok(()) => {
                    self.open = OpenTxn::default();
                    // The next attempt is sent where the leaders are now:
                    // records that timed out on a leader that died were
                    // waiting for it, and librdkafka does not always look
                    // again by itself before the next attempt times out too.
                    if let Err(e) = self.producer.client().fetch_metadata(None, ABORT_TIMEOUT) {
                        debug!(error = %e, "the producer's metadata refresh after an abort failed");
                    }
                    return Ok(true);
                }
                Err(abort) => {
                    debug!(error = %abort, "the abort failed");
                    match self.worker.on_fault(classify::abort_fault(&abort)) {
                        Directive::Retry { after } => std::thread::sleep(after),
                        d => return self.follow_directive(d).map(|()| false),
                    }
                }
            }
        }
    }

    /// The fault a failed step of the open transaction is: the most
    /// telling record failure its delivery reports carried, by that
    /// record's class (a step fails *because* a record did); else the
    /// step's own error.
    fn fault_of(&self, e: &KafkaError) -> Fault {
        match self.producer.context().take() {
            Some(f) => self.record_fault(f),
            None => self.unless_state_lost(classify::step_fault(e)),
        }
    }

    /// The fault one record's failure is, naming where the record went.
    fn record_fault(&self, f: RecordFailure) -> Fault {
        let place = self
            .open
            .places
            .get(f.record)
            .map(|p| (&*p.topic, p.partition, p.origin));
        self.unless_state_lost(classify::record_fault(f.class, f.record, place, f.error))
    }

    /// A fatal fault, unless the producer's own fatal error says it only
    /// lost its state (then a new producer goes on: see
    /// [`classify::fatal_producer_fault`]).
    fn unless_state_lost(&self, fault: Fault) -> Fault {
        if !matches!(fault, Fault::Fatal(_)) {
            return fault;
        }
        match self.producer.client().fatal_error() {
            Some((code, reason)) => classify::fatal_producer_fault(code, &reason, fault),
            None => fault,
        }
    }

    /// Runs one step of a commit, retrying it as long as the worker says.
    pub(super) fn step(
        &mut self,
        mut f: impl FnMut(&TxnProducer) -> Result<(), KafkaError>,
    ) -> Result<(), Directive> {
        loop {
            let Err(e) = f(&self.producer) else {
                return Ok(());
            };
            let fault = self.fault_of(&e);
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
        match self.send_records(txn.streamed, &txn.records) {
            Ok(()) => {}
            Err(Sent::Answered(d)) => return Err(d),
            Err(Sent::Refused) => {
                // Handed over below: a record refused at once was kept,
                // and the delivery reports are served first, so a record
                // whose failure ended the transaction is the one named.
                let _ = await_deliveries(&self.producer, self.txn_timeout);
            }
        }
        if let Some(f) = self.producer.context().take() {
            // A record already failed (refused at once, or reported): the
            // transaction cannot commit, and that record says why.
            let fault = self.record_fault(f);
            return Err(self.worker.on_fault(fault));
        }
        let mut offsets = TopicPartitionList::new();
        for o in &txn.offsets {
            if let Err(e) =
                offsets.add_partition_offset(&o.topic, o.partition, Offset::Offset(o.offset))
            {
                return Err(self.worker.on_fault(classify::step_fault(&e)));
            }
        }
        let Some(metadata) = consumer.group_metadata() else {
            // The group, not the producer: another member has the tasks.
            return Err(self.worker.on_fault(Fault::Fenced(
                "the consumer has no group metadata: it is not a member of the group".to_owned(),
            )));
        };
        // No step of a transaction waits longer than the transaction may
        // live: past it, its coordinator aborts it whatever the client
        // does.
        let timeout = self.txn_timeout;
        let metadata = Arc::new(metadata);
        let offsets = Arc::new(offsets);
        loop {
            let call = {
                let (offsets, metadata) = (offsets.clone(), metadata.clone());
                move |p: &TxnProducer| p.send_offsets_to_transaction(&offsets, &metadata, timeout)
            };
            let fault = match guarded(&self.producer, timeout, call) {
                Ok(()) => break,
                Err(Guarded::Failed(e)) => self.fault_of(&e),
                Err(Guarded::Hung) => Fault::ClientHung(format!(
                    "sending the consumed offsets to the transaction did not return within {:?}",
                    timeout + HUNG_MARGIN
                )),
            };
            match self.worker.on_fault(fault) {
                Directive::Retry { after } => std::thread::sleep(after),
                d => return Err(d),
            }
        }
        debug!(txn = txn.id, "transaction offsets sent");
        self.step(|p| await_deliveries(p, timeout))?;
        debug!(txn = txn.id, "transaction ending");
        // From here the coordinator may record the commit whatever the
        // client reports: the worker treats a lost producer as a commit of
        // unknown fate, not as an abort.
        self.worker.ending();
        self.step(|p| p.commit_transaction(timeout))?;
        self.producer.context().committed();
        self.open = OpenTxn::default();
        Ok(())
    }

    /// Sends records `first..` of the open transaction to the producer,
    /// beginning the transaction if it has not begun. A record the client
    /// refuses at once is kept with the delivery reports' failures (its
    /// class decides, as theirs do) and the rest are not sent: the
    /// transaction cannot commit any more.
    fn send_records(&mut self, first: usize, records: &[OutgoingRecord]) -> Result<(), Sent> {
        if !self.open.begun {
            self.step(|p| p.begin_transaction())
                .map_err(Sent::Answered)?;
            self.producer.context().begin();
            self.open.begun = true;
            self.open.places.clear();
        }
        if self.open.places.len() != first {
            // The worker's count and this host's differ: nothing it would
            // blame on a record could be trusted.
            return Err(Sent::Answered(self.worker.on_fault(Fault::Fatal(format!(
                "records from index {first} handed over, but the open transaction has {}",
                self.open.places.len()
            )))));
        }
        self.producer.context().reserve(first + records.len());
        // Every record's place first: those after a refused one are the
        // transaction's too, sent or not.
        self.open.places.extend(records.iter().map(|r| Place {
            topic: r.topic.clone(),
            partition: r.partition,
            origin: r.origin,
        }));
        let isolating = self.producer.context().isolating();
        for (i, r) in (first..).zip(records) {
            match self.send_one(i, r) {
                Ok(()) if isolating => {
                    // Alone in its batch: its own report before the next.
                    let _ = await_deliveries(&self.producer, self.txn_timeout);
                    if lock(&self.producer.context().failed).is_some() {
                        return Err(Sent::Refused);
                    }
                }
                Ok(()) => {}
                Err(Some(failure)) => {
                    self.producer.context().record(failure);
                    return Err(Sent::Refused);
                }
                // The transaction failed already: its cause is a record's
                // failure, which its delivery report carries.
                Err(None) => return Err(Sent::Refused),
            }
        }
        Ok(())
    }

    /// Hands one record to the producer (waiting while its queue is full);
    /// the client's refusal of it at once, if it refused it, or `None` when
    /// the producer's transaction no longer takes records because an
    /// earlier record of it failed (a consequence, not a cause: streamed
    /// records can meet it, where the failed record's delivery report came
    /// first).
    fn send_one(&self, i: usize, r: &OutgoingRecord) -> Result<(), Option<RecordFailure>> {
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&r.topic, i)
            .partition(r.partition)
            .timestamp(r.timestamp);
        // No header list for a record without headers (a changelog
        // write): librdkafka allocates one per list.
        let count = r.header_count();
        if count > 0 {
            // The stamp, encoded when the record was emitted, is written
            // straight into librdkafka's list (which copies each value).
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
                Ok(()) => return Ok(()),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    self.producer.poll(Duration::from_millis(10));
                    record = back;
                }
                Err((e, _)) => {
                    let code = e.rdkafka_error_code();
                    if code == Some(rdkafka::types::RDKafkaErrorCode::State) {
                        return Err(None);
                    }
                    // The client refused the record at once: for what it is
                    // (larger than its message.max.bytes, say), or for the
                    // producer's own state.
                    let class = code.map_or(RecordClass::Fatal, classify::record_class);
                    return Err(Some(RecordFailure {
                        record: i,
                        class,
                        error: e.to_string(),
                    }));
                }
            }
        }
    }
}

/// Why records could not all be sent.
enum Sent {
    /// One was refused at once; it is kept as the transaction's failure.
    Refused,
    /// A step failed, and this is the worker's answer (a retry aside).
    Answered(Directive),
}

/// The longest one abort (and the wait for the delivery reports before it)
/// takes before it counts as failed.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// How much longer than its own timeout a guarded call may take before it
/// counts as hung.
const HUNG_MARGIN: Duration = Duration::from_secs(2);

/// How a guarded call ended, when it did not succeed.
pub(super) enum Guarded {
    /// It returned this error.
    Failed(KafkaError),
    /// It did not return within its timeout and [`HUNG_MARGIN`].
    Hung,
}

/// Runs `call` on the producer on a helper thread and waits for it at
/// most `timeout` plus [`HUNG_MARGIN`]. librdkafka's
/// `send_offsets_to_transaction` can wait forever, whatever its timeout,
/// for a group coordinator that went away (librdkafka issues 5456 and
/// 5511, open in the 2.12 this crate builds): a stream thread that waited
/// with it would stop for good, its tasks with it. A call that hangs keeps
/// its helper thread and the old producer until it returns; the stream
/// thread goes on with a new producer ([`Directive::ReplaceProducer`]).
pub(super) fn guarded(
    producer: &Arc<TxnProducer>,
    timeout: Duration,
    call: impl FnOnce(&TxnProducer) -> Result<(), KafkaError> + Send + 'static,
) -> Result<(), Guarded> {
    let (done, wait) = std::sync::mpsc::channel();
    let p = producer.clone();
    let call = std::sync::Arc::new(Mutex::new(Some(call)));
    let on_helper = call.clone();
    let spawned = std::thread::Builder::new()
        .name("parsley-txn-call".to_owned())
        .spawn(move || {
            if let Some(call) = lock(&on_helper).take() {
                let _ = done.send(call(&p));
            }
        });
    if let Err(e) = spawned {
        // No thread to spare: the call is made here, unguarded.
        warn!(error = %e, "no helper thread for a transactional call; making it unguarded");
        return match lock(&call).take() {
            Some(call) => call(producer).map_err(Guarded::Failed),
            None => Err(Guarded::Hung),
        };
    }
    match wait.recv_timeout(timeout + HUNG_MARGIN) {
        Ok(r) => r.map_err(Guarded::Failed),
        Err(_) => {
            warn!(
                ?timeout,
                "a transactional call of the producer did not return (a librdkafka defect with a coordinator that went away); giving that producer up"
            );
            Err(Guarded::Hung)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(record: usize, class: RecordClass) -> RecordFailure {
        RecordFailure {
            record,
            class,
            error: format!("{class:?}"),
        }
    }

    /// A failure left from a transaction that was aborted is not blamed on
    /// record `j` of the next one (another record, often another task's).
    #[test]
    fn a_new_transaction_forgets_the_failures_of_the_last() {
        let d = Deliveries::default();
        d.record(failure(3, RecordClass::Refused));
        lock(&d.offsets).push(7);
        d.begin();
        assert!(d.take().is_none());
        assert!(lock(&d.offsets).is_empty());
        // Room is made as records are streamed, never shrunk.
        d.reserve(3);
        d.reserve(2);
        assert_eq!(*lock(&d.offsets), vec![-1; 3]);
    }

    /// Two records refused together, outside an isolating retry, blame
    /// neither: the failure is transient and the next attempt isolates;
    /// during it, a refusal names its record; a commit ends the isolation.
    #[test]
    fn records_refused_together_are_retried_one_per_batch() {
        let d = Deliveries::default();
        d.record(failure(0, RecordClass::Refused));
        d.record(failure(1, RecordClass::Refused));
        let f = d.take().unwrap();
        assert_eq!(f.class, RecordClass::Transient);
        assert!(f.error.contains("one record per batch"), "{}", f.error);
        assert!(d.isolating());
        d.begin();
        d.record(failure(1, RecordClass::Refused));
        let f = d.take().unwrap();
        assert_eq!((f.record, f.class), (1, RecordClass::Refused));
        // Still isolating (nothing committed), and two refused records are
        // each taken as refused now.
        d.record(failure(2, RecordClass::Refused));
        d.record(failure(3, RecordClass::Refused));
        assert_eq!(d.take().unwrap().class, RecordClass::Refused);
        d.committed();
        assert!(!d.isolating());
        // One refused record alone is blamed at once.
        d.record(failure(4, RecordClass::Refused));
        assert_eq!(d.take().unwrap().class, RecordClass::Refused);
    }

    /// Of several failed records, the one that says the most is acted on: a
    /// refused record among timed-out ones (it fails the same way on every
    /// retry), and fencing over everything.
    #[test]
    fn the_most_telling_record_failure_is_kept() {
        let d = Deliveries::default();
        d.record(failure(1, RecordClass::Transient));
        d.record(failure(2, RecordClass::Refused));
        d.record(failure(3, RecordClass::Transient));
        let kept = d.take().unwrap();
        assert_eq!((kept.record, kept.class), (2, RecordClass::Refused));
        d.record(failure(1, RecordClass::Refused));
        d.record(failure(5, RecordClass::Fenced));
        d.record(failure(6, RecordClass::Fatal));
        assert_eq!(d.take().unwrap().class, RecordClass::Fenced);
    }
}
