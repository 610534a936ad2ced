//! One membership of a stream thread in the consumer group, from
//! [`join`](StreamThread::join) (a producer, a worker, a subscribed
//! consumer) through its [`turn`](Membership::turn)s to
//! [`leave`](Membership::leave). The rebalance callbacks librdkafka makes
//! from inside a poll are in `rebalance.rs`; `StreamThread::session` runs
//! a membership and decides what its errors and failed tasks mean.

use super::thread::{Restorer, Session, StreamThread};
use super::*;
use crate::diagnostics::Publisher;

/// The longest one cluster lookup made on a stream thread may take (a
/// task's start or reset): see `StreamThread::join`.
const STREAM_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a poll waits, at most, while a task restores: a finished
/// restore starts its task within this.
const RESTORE_POLL: Duration = Duration::from_millis(10);

/// How a turn's batch ended.
enum Batch {
    /// The records were handed over; `idle` when the consumer had no more.
    Taken { idle: bool },
    /// The membership ends.
    End(Session),
}

/// A stream thread's membership: what lives from a join to the leave.
pub(super) struct Membership<'t> {
    thread: &'t StreamThread,
    /// The group protocol this membership joined with.
    protocol: GroupProtocol,
    /// Publishes the thread's reports on the diagnostics topic.
    publisher: Option<Publisher>,
    /// When the consumer positions were last reported to the worker.
    last_report: Instant,
    pub(super) consumer: BaseConsumer<ThreadContext>,
    restorer: Restorer,
}

impl Drop for Membership<'_> {
    /// However the membership ends: the group changes the last poll
    /// recorded are acted on, as a turn would, and then `ending` is set
    /// before the consumer is dropped: the revocation the consumer's close
    /// makes changes no state.
    fn drop(&mut self) {
        let mut shared = lock(&self.consumer.context().shared);
        shared.take_group_changes(&self.consumer);
        shared.ending = true;
    }
}

/// Says on the diagnostics topic that the thread left: it holds nothing.
pub(super) fn left(publisher: &mut Option<Publisher>, thread: &StreamThread) {
    if let Some(p) = publisher.as_mut() {
        p.leave(&thread.thread_report(&Published {
            at: now_ms(),
            ..Published::default()
        }));
    }
}

impl StreamThread {
    /// Joins the group as a new member: a producer (fencing the previous
    /// one of this thread's id), a worker, and a consumer subscribed to
    /// every source and tick topic.
    pub(super) fn join(&self) -> Result<Membership<'_>, StreamsError> {
        // Set at start, before any thread runs; classic is what every
        // broker serves.
        let protocol = lock(&self.protocol).unwrap_or(GroupProtocol::Classic);
        set_phase(&self.phase, Doing::Joining);
        let timeout = self.options.request_timeout;
        // The lookups a task's start or reset makes run on the stream
        // thread: one sent to a broker that just died waits its whole
        // timeout (librdkafka does not send it elsewhere), and every task of
        // the thread waits with it. They give up sooner, and the worker
        // tries again after a pause, with the leaders looked up afresh.
        let cluster = KafkaCluster::new(&self.config, timeout.min(STREAM_LOOKUP_TIMEOUT))?
            .with_restore_stall(self.options.restore_stall_timeout);
        let restorer = self.restorer()?;
        let (producer, producer_config, txn_timeout) = self.producer(timeout)?;
        let worker = self.worker(protocol, txn_timeout);
        let context = ThreadContext {
            shared: Mutex::new(Shared {
                worker,
                start_policy: self.options.start_policy,
                producer: Arc::new(producer),
                producer_config,
                open: produce::OpenTxn::default(),
                cluster,
                timeout,
                txn_timeout,
                error: None,
                stop: self.stop.clone(),
                phase: self.phase.clone(),
                rejoin: None,
                assigned: false,
                ending: false,
                incremental: protocol == GroupProtocol::Consumer,
                index: self.index,
                reports: self.reports.clone(),
                readiness: self.readiness.clone(),
                replies: std::collections::BTreeMap::new(),
                restores: self.restores.clone(),
                seen: parsley::runtime::worker::WorkerStats::default(),
                later: Ready::default(),
                group_changes: Vec::new(),
            }),
        };
        let consumer_config = self.consumer_config(protocol);
        let consumer: BaseConsumer<ThreadContext> = consumer_config.create_with_context(context)?;
        let mut topics: Vec<&str> = Vec::new();
        for stage in self.app.stages() {
            topics.extend(stage.source_topics());
            if let Some(t) = self.app.tick_topic(stage.name()) {
                topics.push(t);
            }
        }
        consumer.subscribe(&topics)?;
        info!(thread = self.index, transactional_id = %self.transactional_id, "stream thread started");
        set_phase(&self.phase, Doing::Polling);
        Ok(Membership {
            thread: self,
            protocol,
            publisher: Publisher::new(
                &self.config,
                self.app.application_id(),
                &self.instance,
                self.index,
            ),
            last_report: Instant::now(),
            consumer,
            restorer,
        })
    }

    /// The membership's transactional producer, initialised: fences any
    /// earlier producer of this thread's id and aborts what it left open.
    /// Returns it with its configuration and transaction timeout.
    fn producer(
        &self,
        timeout: Duration,
    ) -> Result<(TxnProducer, ClientConfig, Duration), StreamsError> {
        let mut producer_config = settings::for_producer(&self.config);
        producer_config.set("transactional.id", &self.transactional_id);
        let txn_timeout = producer_defaults(&mut producer_config);
        let producer: TxnProducer = producer_config.create_with_context(Deliveries::default())?;
        // Fences any earlier producer of this thread's id (this thread's own
        // previous membership among them) and aborts what it left open.
        producer.init_transactions(timeout)?;
        Ok((producer, producer_config, txn_timeout))
    }

    /// The membership's worker, configured from the instance's options.
    fn worker(&self, protocol: GroupProtocol, txn_timeout: Duration) -> Worker {
        let thread_id = format!("{}-{}", self.instance, self.index);
        let config = self.options.worker_config(protocol, txn_timeout, thread_id);
        let mut worker = Worker::new(&self.app, config);
        if let Some(dir) = &self.state_dir {
            worker = worker.with_local_store(Box::new(dir.stores()));
        }
        if let Some(listener) = &self.restore_listener {
            worker = worker.with_restore_listener(listener.clone());
        }
        worker
    }

    /// The membership's consumer settings: the user's, with the ones the
    /// runtime owns and those the group protocol asks for.
    fn consumer_config(&self, protocol: GroupProtocol) -> ClientConfig {
        let mut consumer_config = settings::for_consumer(&self.config);
        for (k, v) in OWNED {
            consumer_config.set(*k, *v);
        }
        set_prefetch_defaults(&mut consumer_config);
        match protocol {
            GroupProtocol::Classic | GroupProtocol::Auto => {
                consumer_config.set("partition.assignment.strategy", "range");
            }
            GroupProtocol::Consumer => {
                for setting in [
                    "session.timeout.ms",
                    "heartbeat.interval.ms",
                    "partition.assignment.strategy",
                    "group.protocol.type",
                ] {
                    if consumer_config.get(setting).is_some() {
                        if self.index == 0 {
                            warn!(
                                setting,
                                "ignored under the consumer group protocol (KIP-848): the broker sets it (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms), and assigns with its range assignor"
                            );
                        }
                        consumer_config.remove(setting);
                    }
                }
                consumer_config
                    .set("group.protocol", "consumer")
                    .set("group.remote.assignor", "range");
            }
        }
        if self.options.static_membership {
            consumer_config.set("group.instance.id", &self.transactional_id);
        }
        consumer_config
            .set("group.id", self.app.application_id())
            // A fetch offset out of range (retention passed what this
            // thread had not read) stops the partition and reports an
            // error, which the worker judges; never a silent reset.
            .set("auto.offset.reset", "error");
        consumer_config
    }
}

impl Membership<'_> {
    /// One turn: a batch of records, then the per-batch work. `Some` when
    /// the membership ends.
    pub(super) fn turn(&mut self) -> Result<Option<Session>, StreamsError> {
        let wait = self.poll_wait()?;
        match self.take_batch(wait)? {
            Batch::End(session) => Ok(Some(session)),
            Batch::Taken { idle } => {
                self.after_batch(idle)?;
                Ok(None)
            }
        }
    }

    /// How long the first poll of a turn may wait: no longer than the
    /// worker's next wake-up, and briefly while a task restores (its
    /// restore thread's answer is this host's own event). Hands the restores the rebalance queued to the
    /// restore thread first, and starts the tasks whose restore finished.
    fn poll_wait(&mut self) -> Result<Duration, StreamsError> {
        let mut shared = lock(&self.consumer.context().shared);
        self.restorer.pass_restores(&mut shared, &self.consumer)?;
        let now = now_ms();
        let restoring = shared.worker.restoring_tasks().next().map(|_| RESTORE_POLL);
        Ok([shared.worker.next_wake(now), restoring]
            .into_iter()
            .flatten()
            .fold(POLL_WAIT, Duration::min))
    }

    /// Takes a batch of what the consumer has buffered: the first poll
    /// waits up to `wait`, the rest take only what is already fetched.
    /// Each record is handed over (and any seek it asks for made) before
    /// the next poll, as position reports require. Every poll is followed
    /// by the error and rejoin checks.
    fn take_batch(&mut self, wait: Duration) -> Result<Batch, StreamsError> {
        let mut polled = self.consumer.poll(wait);
        let mut batch = 0;
        loop {
            let mut shared = lock(&self.consumer.context().shared);
            // What the poll said of the group first: a record it returned
            // meets the assignment as it is after those changes.
            shared.take_group_changes(&self.consumer);
            if let Some(e) = shared.error.take() {
                return Err(e);
            }
            if let Some(e) = shared.rejoin.take() {
                warn!(thread = self.thread.index, error = %e, "fenced; leaving the group to join again");
                drop(shared);
                left(&mut self.publisher, self.thread);
                return Ok(Batch::End(Session::Rejoin));
            }
            match polled {
                None => return Ok(Batch::Taken { idle: true }),
                Some(Ok(m)) => {
                    shared.on_message(&m)?;
                    shared.act_on_worker(&self.consumer)?;
                }
                Some(Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                ))) => {
                    let Shared {
                        worker, cluster, ..
                    } = &mut *shared;
                    worker.offset_out_of_range(cluster)?;
                    shared.act_on_worker(&self.consumer)?;
                    return Ok(Batch::Taken { idle: true });
                }
                Some(Err(e))
                    if self.thread.options.group_protocol == GroupProtocol::Auto
                        && self.protocol == GroupProtocol::Consumer
                        && e.rdkafka_error_code()
                            == Some(rdkafka::types::RDKafkaErrorCode::UnsupportedVersion) =>
                {
                    // The brokers list the consumer protocol, yet the
                    // coordinator refuses its heartbeat: a cluster
                    // whose group.version feature is not finalized
                    // (one upgraded from 3.x, say).
                    warn!(thread = self.thread.index, error = %e, "the group coordinator refused the consumer group protocol the cluster's configuration lists (is its group.version feature finalized?); joining with the classic protocol");
                    drop(shared);
                    left(&mut self.publisher, self.thread);
                    return Ok(Batch::End(Session::Classic));
                }
                Some(Err(e)) => {
                    // The client says whether it gives up on the
                    // consumer; the worker decides what follows.
                    let fault = Fault::Poll {
                        fatal: consumer_error_is_fatal(&e),
                        message: e.to_string(),
                    };
                    let d = shared.worker.on_fault(fault);
                    shared.follow_directive(d)?;
                    return Ok(Batch::Taken { idle: true });
                }
            }
            batch += 1;
            if batch == POLL_BATCH {
                return Ok(Batch::Taken { idle: false });
            }
            drop(shared);
            polled = self.consumer.poll(Duration::ZERO);
        }
    }

    /// The per-batch work, paid once per batch instead of once per record:
    /// the consumer positions (after an idle poll, or every 50 ms), the
    /// clock, a commit point, the state queries and the diagnostics.
    fn after_batch(&mut self, idle: bool) -> Result<(), StreamsError> {
        let mut shared = lock(&self.consumer.context().shared);
        let now = now_ms();
        if idle {
            shared.worker.fetch_drained();
        }
        if idle || self.last_report.elapsed() > Duration::from_millis(50) {
            shared.report_positions(&self.consumer)?;
            self.last_report = Instant::now();
        }
        {
            let Shared {
                worker, cluster, ..
            } = &mut *shared;
            worker.punctuate(now, cluster)?;
        }
        // A commit point: what the clock brought, and the open
        // transaction if it is due.
        let ready = shared.worker.ready(Some(now))?;
        shared.act_on_ready(&self.consumer, ready)?;
        // State queries: new ones to the worker, answers back.
        {
            let Shared {
                worker, replies, ..
            } = &mut *shared;
            super::queries::serve(worker, replies, &self.thread.inboxes, self.thread.index);
        }
        if let Some(published) = shared.later.published.take() {
            if let Some(p) = self.publisher.as_mut() {
                p.publish(&self.thread.thread_report(&published));
            }
            lock(&self.thread.reports).insert(self.thread.index, published);
            shared.count_restores();
        }
        // A task whose start waited on a lookup may have started.
        shared.refresh_ready();
        Ok(())
    }

    /// Leaves the group after committing what is open.
    pub(super) fn leave(mut self) -> Result<Session, StreamsError> {
        {
            set_phase(&self.thread.phase, Doing::ClosingCommit);
            let mut shared = lock(&self.consumer.context().shared);
            shared.report_positions(&self.consumer)?;
            shared.worker.flush()?;
            shared.act_on_worker(&self.consumer)?;
        }
        set_phase(&self.thread.phase, Doing::ClosingLeave);
        self.consumer.unsubscribe();
        // Serve the revocation the unsubscribe triggers.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self
                .consumer
                .assignment()
                .map(|a| a.count() > 0)
                .unwrap_or(false)
        {
            let _ = self.consumer.poll(Duration::from_millis(50));
            lock(&self.consumer.context().shared).take_group_changes(&self.consumer);
        }
        left(&mut self.publisher, self.thread);
        info!(thread = self.thread.index, "stream thread stopped");
        Ok(Session::Closed)
    }

    /// Says on the diagnostics topic that the thread left.
    pub(super) fn say_left(&mut self) {
        left(&mut self.publisher, self.thread);
    }
}

/// The settings the runtime gives its transactional producers unless the
/// configuration sets them; returns the transaction timeout.
pub(super) fn producer_defaults(producer_config: &mut ClientConfig) -> Duration {
    // A transaction left open by a frozen or dead instance holds back
    // every read_committed reader (a restoring task among them) until it
    // times out: keep that short unless the user chose otherwise.
    if producer_config.get("transaction.timeout.ms").is_none() {
        producer_config.set("transaction.timeout.ms", "10000");
    }
    if producer_config.get("linger.ms").is_none() {
        producer_config.set("linger.ms", PRODUCER_LINGER_MS);
    }
    // A produce request to a broker that froze (a long pause, a network
    // partition) is given up after 5 s and sent again to the partition's
    // leader as the metadata then names it, not after librdkafka's 30 s,
    // which outlived the transaction it belonged to.
    if producer_config.get("request.timeout.ms").is_none() {
        producer_config.set("request.timeout.ms", "5000");
    }
    producer_config
        .get("transaction.timeout.ms")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The producers linger a little (records go to them a poll's worth at
    /// a time while the transaction is open, and a request per handful
    /// cost librdkafka's threads twice the CPU per record), and a user's
    /// own settings win.
    #[test]
    fn producers_linger_two_milliseconds_unless_configured() {
        let mut c = ClientConfig::new();
        assert_eq!(producer_defaults(&mut c), Duration::from_secs(10));
        assert_eq!(c.get("linger.ms"), Some("2"));
        assert_eq!(c.get("request.timeout.ms"), Some("5000"));
        let mut mine = ClientConfig::new();
        mine.set("linger.ms", "0")
            .set("transaction.timeout.ms", "30000");
        assert_eq!(producer_defaults(&mut mine), Duration::from_secs(30));
        assert_eq!(mine.get("linger.ms"), Some("0"));
    }
}
