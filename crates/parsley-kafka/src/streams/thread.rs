//! One stream thread: its consumer and producer, the poll loop, the restorer
//! beside it, and what a failed task does to the loop.

use super::*;

/// A stream thread's restore thread: it runs the worker's restore jobs
/// (changelog replays) with its own replay consumer, while the stream
/// thread goes on processing the tasks that are ready. It ends when the
/// membership does (after the job it is running).
pub(super) struct Restorer {
    jobs: std::sync::mpsc::Sender<parsley::runtime::worker::RestoreJob>,
    outcomes: std::sync::mpsc::Receiver<parsley::runtime::worker::RestoreOutcome>,
}

pub(super) struct StreamThread {
    pub(super) app: Parsley,
    pub(super) index: usize,
    pub(super) config: ClientConfig,
    pub(super) options: StreamsOptions,
    pub(super) transactional_id: String,
    /// The instance id (the `thread-id` metric label is `<instance>-<index>`).
    pub(super) instance: String,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) rejoins: Arc<AtomicU64>,
    pub(super) reports: Reports,
    pub(super) handler: Option<ErrorHandler>,
    pub(super) replacements: Arc<AtomicU64>,
    pub(super) task_restarts: Arc<AtomicU64>,
    pub(super) production_handler: Option<ProductionHandler>,
    pub(super) dead_lettered: Arc<AtomicU64>,
    /// The first failure that shut the instance down, for every thread to
    /// see.
    pub(super) failure: Arc<Mutex<Option<String>>>,
    /// What this thread is doing.
    pub(super) phase: Phase,
    /// Whether each thread is ready.
    pub(super) readiness: Arc<Readiness>,
    /// The instance's state directory, if it keeps one.
    pub(super) state_dir: Option<Arc<StateDir>>,
    pub(super) restores: Arc<Totals>,
    pub(super) restore_listener: Option<Arc<dyn RestoreListener>>,
    /// The group protocol the threads use, chosen at start and shared with
    /// the instance
    /// ([`CausalStreams::group_protocol`](super::CausalStreams::group_protocol)).
    /// One left to the cluster (`options.group_protocol` is
    /// [`GroupProtocol::Auto`]) falls back to the classic protocol if the
    /// coordinator refuses the consumer one at the join.
    pub(super) protocol: Arc<Mutex<Option<GroupProtocol>>>,
    /// State queries for this thread's worker
    /// ([`CausalStreams::query`](super::CausalStreams::query)).
    pub(super) inboxes: super::queries::Inboxes,
}

/// How one membership of a stream thread ended.
pub(super) enum Session {
    /// The application is closing; the thread left the group.
    Closed,
    /// Fenced: join again as a new member.
    Rejoin,
    /// A failure the error handler already answered (a task's).
    Failed(StreamsError, ErrorResponse),
    /// The group coordinator refused the consumer group protocol that
    /// [`GroupProtocol::Auto`] chose: join again with the classic one.
    Classic,
}

/// librdkafka's message as the worker and its task read it. Its header list is looked up
/// once: librdkafka parses a fetched record's headers on each lookup until
/// it finds one (a record without headers is parsed again every time), and
/// the task reads the list several times per record.
struct Fetched<'a> {
    message: &'a BorrowedMessage<'a>,
    headers: Option<&'a BorrowedHeaders>,
}

impl<'a> Fetched<'a> {
    fn new(message: &'a BorrowedMessage<'a>) -> Self {
        Fetched {
            message,
            headers: message.headers(),
        }
    }
}

impl RecordView for Fetched<'_> {
    fn topic(&self) -> &str {
        self.message.topic()
    }
    fn partition(&self) -> i32 {
        self.message.partition()
    }
    fn offset(&self) -> i64 {
        self.message.offset()
    }
    fn timestamp(&self) -> i64 {
        self.message.timestamp().to_millis().unwrap_or(0)
    }
    fn key(&self) -> Option<&[u8]> {
        self.message.key()
    }
    fn value(&self) -> Option<&[u8]> {
        self.message.payload()
    }
    fn header_count(&self) -> usize {
        self.headers.map_or(0, Headers::count)
    }
    fn header(&self, index: usize) -> Option<(&str, Option<&[u8]>)> {
        let h = self.headers?.try_get(index)?;
        Some((h.key, h.value))
    }
}

impl Shared {
    /// Hands one polled record to the worker as a view of librdkafka's
    /// message: the task copies out of it what it keeps.
    pub(super) fn on_message(&mut self, m: &BorrowedMessage<'_>) -> Result<(), StreamsError> {
        self.worker.on_record(Fetched::new(m))?;
        Ok(())
    }

    /// Reports the consumer's positions. The loop hands every record a poll
    /// returns to the worker before it polls again, so no record below a
    /// position is still on its way: there is nothing polled and not handed
    /// over to name, and the worker's own record of what it was handed is
    /// the whole story.
    pub(super) fn report_positions(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        let positions = consumer.position()?;
        for e in positions.elements() {
            if let Offset::Offset(p) = e.offset() {
                self.worker.on_position(e.topic(), e.partition(), p, None)?;
            }
        }
        Ok(())
    }

    /// A failure inside a turn of the poll loop. A task's error aborts the
    /// open work: the worker rolls back, stopping that task, the records
    /// already streamed into the producer's transaction are aborted with
    /// it (the next ready says so), and the loop goes on. Any other
    /// failure ends the membership.
    fn recover(
        &mut self,
        consumer: &BaseConsumer<ThreadContext>,
        e: StreamsError,
    ) -> Result<(), StreamsError> {
        if self.worker.failing_task().is_none() || self.worker.in_flight() {
            return Err(e);
        }
        debug!(error = %e, "a task failed; the open work rolls back");
        self.worker.abort(&self.cluster)?;
        self.act_on_worker(consumer)
    }
}

impl StreamThread {
    /// Starts this membership's restore thread, its replay consumer
    /// connecting while the stream thread joins its group.
    pub(super) fn restorer(&self) -> Result<Restorer, StreamsError> {
        let cluster = KafkaCluster::new(&self.config, self.options.request_timeout)?
            .with_restore_stall(self.options.restore_stall_timeout);
        let changelogs: Vec<String> = self
            .app
            .stages()
            .iter()
            .filter_map(|s| self.app.owned_names(s.name()))
            .flat_map(|n| {
                std::iter::once(n.state_changelog.clone()).chain(n.fold_changelog.clone())
            })
            .collect();
        let (jobs, job_rx) = std::sync::mpsc::channel::<parsley::runtime::worker::RestoreJob>();
        let (outcome_tx, outcomes) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!(
                "parsley-restore-{}-{}-{}",
                self.app.application_id(),
                self.instance,
                self.index
            ))
            .spawn(move || {
                let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
                cluster.warm_replayer(&names);
                for job in job_rx {
                    let outcome = job.run(&cluster, &cluster);
                    if outcome_tx.send(outcome).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| StreamsError::Thread {
                thread: self.index,
                message: format!("its restore thread could not start: {e}"),
            })?;
        Ok(Restorer { jobs, outcomes })
    }

    /// Runs memberships until the application closes: a fenced member
    /// (a zombie that woke after the group moved on, or a commit whose fate
    /// is unknown) has already dropped its tasks, and joins again with a new
    /// producer and consumer. Any other failure stops the thread.
    pub(super) fn run(self) -> Result<(), StreamsError> {
        let backoff = self.options.rejoin_backoff;
        // Failures and rejoins in a row, for the backoff.
        let mut in_a_row = 0;
        loop {
            let began = Instant::now();
            let session = self.session();
            // A thread that left the group runs no tasks until it joins again.
            lock(&self.reports).remove(&self.index);
            if began.elapsed() > backoff.max {
                // It ran long enough that this is not the same failure again.
                in_a_row = 0;
            }
            let e = match session {
                Ok(Session::Closed) => return Ok(()),
                Ok(Session::Rejoin) => {
                    // Out of the group until it joins again.
                    self.readiness.set(self.index, false);
                    self.rejoins.fetch_add(1, Ordering::SeqCst);
                    let wait = backoff.step(in_a_row);
                    in_a_row += 1;
                    info!(
                        thread = self.index,
                        ?wait,
                        "stream thread rejoins the group"
                    );
                    if !self.pause(wait) {
                        return Ok(());
                    }
                    continue;
                }
                Ok(Session::Classic) => {
                    self.readiness.set(self.index, false);
                    *lock(&self.protocol) = Some(GroupProtocol::Classic);
                    continue;
                }
                Ok(Session::Failed(e, response)) => (e, Some(response)),
                Err(e) => (e, None),
            };
            let (e, decided) = e;
            if self.stop.load(Ordering::SeqCst) {
                // Already shutting down (another thread's failure, or close).
                return Err(e);
            }
            let response =
                decided.unwrap_or_else(|| policy::decide(self.handler.as_ref(), self.index, &e));
            match response {
                ErrorResponse::ReplaceThread => {
                    self.readiness.set(self.index, false);
                    self.replacements.fetch_add(1, Ordering::SeqCst);
                    // A failure that recurs at once is reported once per
                    // step of the backoff, and joins the group once per
                    // step: never a rebalance loop.
                    let wait = backoff.step(in_a_row);
                    in_a_row += 1;
                    warn!(thread = self.index, error = %e, ?wait, failures_in_a_row = in_a_row, "stream thread failed; replacing it after a pause");
                    if !self.pause(wait) {
                        return Ok(());
                    }
                }
                ErrorResponse::ShutdownClient => {
                    error!(thread = self.index, error = %e, "stream thread failed; shutting the instance down");
                    lock(&self.failure).get_or_insert_with(|| e.to_string());
                    self.stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
                ErrorResponse::ShutdownApplication => {
                    error!(thread = self.index, error = %e, "stream thread failed; shutting the application down");
                    let reason = format!("instance {} thread {}: {e}", self.instance, self.index);
                    if let Err(r) = policy::request_shutdown(
                        &self.config,
                        &policy::control_topic(self.app.application_id()),
                        &reason,
                        self.options.request_timeout,
                    ) {
                        error!(error = %r, "the shutdown request could not be written; only this instance stops");
                    }
                    lock(&self.failure).get_or_insert_with(|| e.to_string());
                    self.stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            }
        }
    }

    /// A task failed and stopped (the worker aborted for it). The error
    /// handler hears of it once: `ReplaceThread` restarts the task in place
    /// after its backoff step, with no rebalance; the other responses end
    /// the membership, already decided.
    fn task_failed(
        &self,
        consumer: &BaseConsumer<ThreadContext>,
        failure: TaskFailure,
    ) -> Option<Session> {
        if let Some(refused) = &failure.refused
            && let ProductionResponse::DeadLetter(topic) =
                policy::decide_production(self.production_handler.as_ref(), refused)
        {
            let mut shared = lock(&consumer.context().shared);
            let Shared {
                worker, cluster, ..
            } = &mut *shared;
            let r = worker.divert(&failure.task, refused, &topic, cluster);
            let r = r.map_err(StreamsError::from).and_then(|diverted| {
                // The task restarted at once: its seeks go out now.
                shared.act_on_worker(consumer).map(|()| diverted)
            });
            match r {
                Ok(diverted) => {
                    // Not diverted: the task was revoked meanwhile, and its
                    // new owner meets the refusal on its own.
                    if diverted {
                        self.dead_lettered.fetch_add(1, Ordering::SeqCst);
                    }
                    return None;
                }
                Err(e) => {
                    drop(shared);
                    let response = policy::decide(self.handler.as_ref(), self.index, &e);
                    return Some(Session::Failed(e, response));
                }
            }
        }
        let e = StreamsError::Task {
            task: failure.task.clone(),
            error: failure.error,
            earlier_in_a_row: failure.earlier_in_a_row,
            transient: failure.transient,
        };
        let response = policy::decide(self.handler.as_ref(), self.index, &e);
        if response != ErrorResponse::ReplaceThread {
            return Some(Session::Failed(e, response));
        }
        let mut shared = lock(&consumer.context().shared);
        let Shared {
            worker, cluster, ..
        } = &mut *shared;
        let r = worker.restart_task(&failure.task, cluster);
        // A restart without a wait happened now: its seeks go out now.
        let r = r
            .map_err(StreamsError::from)
            .and_then(|wait| shared.act_on_worker(consumer).map(|()| wait));
        match r {
            Ok(Some(wait)) => {
                self.task_restarts.fetch_add(1, Ordering::SeqCst);
                warn!(thread = self.index, error = %e, ?wait, "task failed; restarting it in place after a pause");
                None
            }
            // Revoked meanwhile: whoever owns it now starts it.
            Ok(None) => None,
            Err(restart) => Some(Session::Failed(restart, ErrorResponse::ShutdownClient)),
        }
    }

    /// Waits `wait` before joining the group again, or less if the
    /// application closes meanwhile; says whether to go on.
    pub(super) fn pause(&self, wait: Duration) -> bool {
        self.wait_out(wait, Doing::RejoinBackoff)
    }

    /// Waits `wait`, doing `phase`, or less if the application closes
    /// meanwhile; says whether to go on.
    fn wait_out(&self, wait: Duration, phase: Doing) -> bool {
        set_phase(&self.phase, phase);
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(20)),
            );
        }
        !self.stop.load(Ordering::SeqCst)
    }

    pub(super) fn thread_report(&self, published: &Published) -> ThreadReport {
        ThreadReport {
            instance: self.instance.clone(),
            thread: self.index,
            at: published.at,
            tasks: published
                .metrics
                .iter()
                .map(|m| m.task.to_string())
                .collect(),
            holds: published.holds.iter().map(HoldReport::from).collect(),
            endpoint: self.options.application_server.clone(),
            left: false,
        }
    }

    /// One membership, from its join to its end: turns until the
    /// application closes, the membership ends (fenced, or a failure the
    /// error handler answered), or an error stops the thread.
    fn session(&self) -> Result<Session, StreamsError> {
        let mut m = self.join()?;
        while !self.stop.load(Ordering::SeqCst) {
            // A transaction aborted for a transient fault (a broker down or
            // moving): the worker asks for a pause before the next attempt,
            // with nothing fetched meanwhile.
            let backoff = lock(&m.consumer.context().shared).later.backoff.take();
            if let Some(wait) = backoff {
                debug!(
                    thread = self.index,
                    ?wait,
                    "pausing before the next attempt"
                );
                self.wait_out(wait, Doing::TransientBackoff);
                set_phase(&self.phase, Doing::Polling);
                continue;
            }
            match m.turn() {
                Ok(Some(session)) => return Ok(session),
                Ok(None) => {}
                Err(e) => {
                    let mut shared = lock(&m.consumer.context().shared);
                    if let Some(why) = shared.rejoin.take() {
                        // The membership was already ending, its tasks
                        // dropped, and its producer goes with it: an error
                        // of theirs (a dying producer's fatal state, seen
                        // on the way out) does not outlive them. A cause
                        // that is not theirs meets the next membership.
                        warn!(thread = self.index, error = %e, rejoin = %why, "an error while leaving the group to join again; joining again");
                        drop(shared);
                        m.say_left();
                        return Ok(Session::Rejoin);
                    }
                    match shared.recover(&m.consumer, e) {
                        Ok(()) => {}
                        Err(fatal) => {
                            // The thread stops: say so, or the reports keep
                            // it "running" (and `parsley reset` refusing)
                            // until they go stale.
                            drop(shared);
                            m.say_left();
                            return Err(fatal);
                        }
                    }
                }
            }
            // A task that failed stopped alone; the handler decides what
            // follows.
            let failures = std::mem::take(&mut lock(&m.consumer.context().shared).later.failures);
            for failure in failures {
                if let Some(session) = self.task_failed(&m.consumer, failure) {
                    m.say_left();
                    return Ok(session);
                }
            }
        }
        m.leave()
    }
}

impl Restorer {
    /// Sends the worker's new jobs, and hands it the finished ones (each
    /// starts its task: resumes, seeks and readiness follow).
    pub(super) fn pass_restores(
        &self,
        shared: &mut Shared,
        consumer: &BaseConsumer<ThreadContext>,
    ) -> Result<(), StreamsError> {
        shared.act_on_worker(consumer)?;
        for job in std::mem::take(&mut shared.later.restores) {
            if self.jobs.send(job).is_err() {
                return Err(StreamsError::Thread {
                    thread: shared.index,
                    message: "its restore thread is gone".to_owned(),
                });
            }
        }
        let mut started = false;
        while let Ok(outcome) = self.outcomes.try_recv() {
            let Shared {
                worker, cluster, ..
            } = &mut *shared;
            worker.advance(Ack::Restored(outcome), cluster)?;
            started = true;
        }
        if started {
            shared.act_on_worker(consumer)?;
            shared.republish();
        }
        Ok(())
    }
}
