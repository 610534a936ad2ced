//! State queries on a running instance: [`CausalStreams::query`] and
//! [`CausalStreams::query_after`].
//!
//! A query travels to every stream thread of the instance through its
//! inbox. Each thread hands it to its worker between polls (the worker
//! answers from the task's committed store, or keeps a causal query until a
//! commit brings its causes or its deadline passes) and sends the answer
//! back. The thread's cost is the lookup; the querying thread waits.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley::fold::FoldKey;
use parsley::holds::WaitingOn;
use parsley::protocol::{Channel, VectorClock};
use parsley::runtime::host::TopicMetadata;
use parsley::runtime::query::{QueryAnswer, QueryId, StateQuery};
use parsley::{CodecError, Coordinate, StateStore, TaskId};

use super::{CausalStreams, StreamsState, lock, now_ms};
use crate::KafkaCluster;

/// How long a plain (not causal) query waits for a stream thread to take
/// it: one turn of its poll loop, normally a few milliseconds.
const PLAIN_QUERY_WAIT: Duration = Duration::from_secs(5);

/// One query, on its way to a stream thread.
pub(super) struct Request {
    id: QueryId,
    query: StateQuery,
    reply: Sender<QueryAnswer>,
}

/// Each stream thread's queries not yet taken, by thread index.
pub(super) type Inboxes = Arc<Mutex<BTreeMap<usize, Vec<Request>>>>;

/// Hands the queries in thread `index`'s inbox to its worker, and sends
/// the answers its worker has reached. Called between polls.
pub(super) fn serve(
    worker: &mut parsley::runtime::worker::Worker,
    replies: &mut BTreeMap<QueryId, Sender<QueryAnswer>>,
    inboxes: &Inboxes,
    index: usize,
) {
    let taken = lock(inboxes).get_mut(&index).map(std::mem::take);
    for r in taken.into_iter().flatten() {
        replies.insert(r.id, r.reply);
        worker.query(r.id, r.query);
    }
    for (id, answer) in worker.take_query_answers() {
        if let Some(reply) = replies.remove(&id) {
            // A querier that gave up has dropped its end: nothing to do.
            let _ = reply.send(answer);
        }
    }
}

/// Why a state query has no value to give.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The instance is not running (not started, or stopped).
    #[error("the instance is {0:?}; state queries need it running")]
    NotRunning(StreamsState),
    /// The store names no stage of the application, or one without state.
    #[error("the application has no stage {0:?} with state")]
    UnknownStage(String),
    /// The key did not encode with the store's key codec.
    #[error("the key does not encode: {0}")]
    Encode(CodecError),
    /// The committed state did not decode with the stage's state codec.
    #[error("the state of {task} does not decode: {cause}")]
    Decode {
        /// The task.
        task: TaskId,
        /// The codec's error.
        cause: CodecError,
    },
    /// A topic could not be described (its partition count, for the key's
    /// task, or its id, for a cause's channel).
    #[error("cannot describe topic {topic:?}: {reason}")]
    Metadata {
        /// The topic.
        topic: String,
        /// Why.
        reason: String,
    },
    /// The key's task does not run on this instance: ask the instance
    /// that runs it ([`CausalStreams::query_host`] names it and its
    /// endpoint).
    #[error("task {task}, which holds the key's state, does not run on this instance")]
    NotHosted {
        /// The task.
        task: TaskId,
    },
    /// The key's task is assigned here and still restoring (or waiting to
    /// restart after a failure): its state is not known yet.
    #[error("task {task}, which holds the key's state, is restoring; ask again shortly")]
    Restoring {
        /// The task.
        task: TaskId,
    },
    /// The timeout passed with causes the task has not delivered.
    #[error(
        "task {task} has not delivered every cause of the query within {waited:?}: {}",
        waiting_on.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    CausesMissing {
        /// The task.
        task: TaskId,
        /// How long the query waited.
        waited: Duration,
        /// What the task still waits for, as `explain_holds` says it.
        waiting_on: Vec<WaitingOn>,
    },
    /// The query named a record on a partition of the stage's own input
    /// that the key's task does not read: the key's state can never
    /// include it. Its producer placed the key by another partitioner than
    /// the topic declares ([`Topic::partitioned_by`](parsley::Topic::partitioned_by)).
    #[error(
        "record {cause} is on a partition task {task} does not read, so the key's state can never include it: the topic's declared partitioner ({partitioner:?}) places the key in {task}, and the record's producer placed it elsewhere (declare the producer's partitioner with Topic::partitioned_by; librdkafka's default, consistent_random, is Partitioner::Crc32)"
    )]
    KeyNotOnPartition {
        /// The key's task.
        task: TaskId,
        /// The record the query named.
        cause: Coordinate,
        /// The partitioner the stage's sources declare.
        partitioner: parsley::partition::Partitioner,
    },
    /// The query claims a record on a topic that reaches the queried stage
    /// only through other stages. Whether its effect has reached the
    /// stage's state cannot be told yet (the stamps that travel with the
    /// records may claim what their senders have received and not yet
    /// delivered), so the query does not answer rather than answer without
    /// it.
    #[error(
        "task {task}: the query claims {claim}, on a topic that reaches the stage only through {}; this version cannot tell when its effect has reached the stage's state, and does not answer rather than answer without it. Claim only the records the stage consumes, or query the stage that consumes that topic (see the guide's \"Reading your own writes\")",
        via.join(", ")
    )]
    UpstreamCause {
        /// The queried task.
        task: TaskId,
        /// The claim (`topic:partition` and offset).
        claim: String,
        /// The stages of the application that read the topic on the way.
        via: Vec<String>,
    },
    /// No stream thread answered in time (a rebalance moved the task, or
    /// the threads are busy restoring).
    #[error("no stream thread answered the query for {task} within {waited:?}; ask again")]
    NoAnswer {
        /// The task.
        task: TaskId,
        /// How long the query waited.
        waited: Duration,
    },
}

/// What queries learn about topics once: partition counts and ids; and
/// the thread reports [`CausalStreams::query_host`] reads, with when.
#[derive(Default)]
pub(super) struct QueryTopics {
    cluster: Option<KafkaCluster>,
    known: BTreeMap<String, parsley::runtime::host::TopicDescription>,
    hosts: Option<(Instant, HostReports)>,
}

type HostReports = Arc<BTreeMap<String, crate::diagnostics::ThreadReport>>;

/// How long [`CausalStreams::query_host`] reuses the reports it read.
const HOSTS_FRESH: Duration = Duration::from_secs(1);

/// Where a key's state lives ([`CausalStreams::query_host`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KeyHost {
    /// The task that holds the key's state.
    pub task: TaskId,
    /// The instance that runs it.
    pub instance: String,
    /// The endpoint that instance announced, if it did.
    pub endpoint: Option<String>,
    /// Whether that is this instance.
    pub here: bool,
}

impl CausalStreams {
    /// The committed state of `key` in the stage `store` belongs to
    /// ([`StageBuilder::store`](parsley::StageBuilder::store)), read from
    /// the task of this instance that holds it. Never an uncommitted value:
    /// a step's writes join the task's store when its transaction commits.
    ///
    /// The stream thread answers between two polls, at the cost of one
    /// lookup; the calling thread waits for that. A key whose task runs on
    /// another instance, or is restoring, is a typed error, never an empty
    /// value.
    pub fn query<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
    ) -> Result<Option<S>, QueryError> {
        self.read_state(store, key, None, PLAIN_QUERY_WAIT)
    }

    /// As [`query`](Self::query), once the task has delivered, and
    /// committed, every record `after` claims on a channel its stage
    /// consumes: read-your-writes across the pipeline. `after` is what a
    /// [`CausalClock`](crate::CausalClock) holds after recording a send
    /// (`clock.clock()`), or a received record's clock. Claims on channels
    /// the stage does not consume are not waited for.
    ///
    /// Waits up to `timeout`; then fails with
    /// [`QueryError::CausesMissing`], naming what the task waits for.
    ///
    /// A claim on a topic that reaches the stage only through other stages
    /// of the application fails the query at once with
    /// [`QueryError::UpstreamCause`] (never a stale answer); claims on
    /// topics no stage chain leads from are not the stage's causes and are
    /// not waited for.
    pub fn query_after<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
        after: &VectorClock,
        timeout: Duration,
    ) -> Result<Option<S>, QueryError> {
        let upstream = self.app.upstream_topics(store.stage());
        if !upstream.is_empty() {
            let (task, _) = self.task_of(store, key)?;
            for (topic, via) in &upstream {
                let id = self.describe_for_query(topic)?.id;
                let claim = after
                    .offsets()
                    .iter()
                    .find(|c| c.channel.topic == id)
                    .map(|c| format!("{topic}:{} up to offset {}", c.channel.partition, c.offset))
                    .or_else(|| {
                        after
                            .sequences()
                            .iter()
                            .find(|c| c.channel.topic == id)
                            .map(|c| {
                                format!(
                                    "{topic}:{} up to send sequence {}",
                                    c.channel.partition, c.seq
                                )
                            })
                    });
                if let Some(claim) = claim {
                    return Err(QueryError::UpstreamCause {
                        task,
                        claim,
                        via: via.clone(),
                    });
                }
            }
        }
        self.read_state(store, key, Some(after.clone()), timeout)
    }

    /// As [`query_after`](Self::query_after), with the causes named by
    /// their coordinates (what a producer's delivery report gives).
    ///
    /// A coordinate on one of the stage's own input topics but on another
    /// partition than the key's task reads fails at once with
    /// [`QueryError::KeyNotOnPartition`]: the record's producer placed the
    /// key by another partitioner than the topic declares, and waiting
    /// would never see it.
    pub fn query_after_records<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
        after: &[Coordinate],
        timeout: Duration,
    ) -> Result<Option<S>, QueryError> {
        let (task, _) = self.task_of(store, key)?;
        if let Some(stage) = self.app.stage(store.stage())
            && let Some(cause) = stage.cause_off_task(task.partition, after)
        {
            return Err(QueryError::KeyNotOnPartition {
                task,
                cause: cause.clone(),
                partitioner: stage.key_partitioner(),
            });
        }
        if let Some((cause, via)) = self.app.upstream_cause(store.stage(), after) {
            return Err(QueryError::UpstreamCause {
                task,
                claim: cause.to_string(),
                via,
            });
        }
        let mut clock = VectorClock::new();
        for c in after {
            let t = self.describe_for_query(&c.topic)?;
            clock.claim_offset(Channel::new(t.id, c.partition), c.offset);
        }
        self.read_state(store, key, Some(clock), timeout)
    }

    fn describe_for_query(
        &self,
        topic: &str,
    ) -> Result<parsley::runtime::host::TopicDescription, QueryError> {
        let mut known = lock(&self.query_topics);
        if let Some(d) = known.known.get(topic) {
            return Ok(*d);
        }
        let metadata = |reason: String| QueryError::Metadata {
            topic: topic.to_owned(),
            reason,
        };
        if known.cluster.is_none() {
            let cluster = KafkaCluster::new(&self.config, self.options.request_timeout)
                .map_err(|e| metadata(e.to_string()))?;
            known.cluster = Some(cluster);
        }
        let cluster = known
            .cluster
            .as_ref()
            .ok_or_else(|| metadata("no client".into()))?;
        let d = cluster
            .describe(topic)
            .map_err(|e| metadata(e.to_string()))?;
        known.known.insert(topic.to_owned(), d);
        Ok(d)
    }

    /// The task whose state holds `key`, and the key's encoded bytes.
    fn task_of<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
    ) -> Result<(TaskId, Vec<u8>), QueryError> {
        let unknown = || QueryError::UnknownStage(store.stage().to_owned());
        let stage = self
            .app
            .stage(store.stage())
            .filter(|s| s.is_stateful())
            .ok_or_else(unknown)?;
        let bytes = store.key_codec().encode(key).map_err(QueryError::Encode)?;
        let source = stage
            .source_topics()
            .first()
            .map(|t| (*t).to_owned())
            .ok_or_else(unknown)?;
        let partitions = self.describe_for_query(&source)?.partitions;
        let task = TaskId {
            stage: store.stage().to_owned(),
            partition: stage.key_partitioner().partition(&bytes, partitions),
        };
        Ok((task, bytes))
    }

    /// Which instance runs the task that holds `key`'s state, and the
    /// endpoint it announced (`StreamsOptions::application_server`), as
    /// Kafka Streams' `queryMetadataForKey`: route a query there when
    /// [`query`](Self::query) says [`QueryError::NotHosted`]. `None` when
    /// no running instance reports the task (a rebalance is moving it, or
    /// the application is down).
    ///
    /// The answer comes from the reports every stream thread publishes on
    /// the application's diagnostics topic (at least every five seconds,
    /// and at once when its tasks change), read again at most once a
    /// second: right within a few seconds of a rebalance, and a caller
    /// whose routed query finds the task gone asks again. This instance
    /// need not be running.
    pub fn query_host<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
    ) -> Result<Option<KeyHost>, QueryError> {
        let (task, _) = self.task_of(store, key)?;
        let reports = self.host_reports()?;
        let name = task.to_string();
        let now = now_ms();
        let host = reports
            .values()
            .filter(|r| r.is_running(now) && r.tasks.contains(&name))
            .max_by_key(|r| r.at)
            .map(|r| KeyHost {
                task: task.clone(),
                here: r.instance == self.instance,
                instance: r.instance.clone(),
                endpoint: r.endpoint.clone(),
            });
        Ok(host)
    }

    /// The latest thread reports, read at most once a second.
    fn host_reports(
        &self,
    ) -> Result<Arc<BTreeMap<String, crate::diagnostics::ThreadReport>>, QueryError> {
        let mut known = lock(&self.query_topics);
        if let Some((at, reports)) = &known.hosts
            && at.elapsed() < HOSTS_FRESH
        {
            return Ok(Arc::clone(reports));
        }
        let topic = crate::diagnostics::diagnostics_topic(self.app.application_id());
        let reports = match crate::diagnostics::latest_reports(
            &self.config,
            self.app.application_id(),
            self.options.request_timeout,
        ) {
            Ok(r) => Arc::new(r),
            Err(crate::diagnostics::ReportsError::NoTopic(_)) => Arc::new(BTreeMap::new()),
            Err(e) => {
                return Err(QueryError::Metadata {
                    topic,
                    reason: e.to_string(),
                });
            }
        };
        known.hosts = Some((Instant::now(), Arc::clone(&reports)));
        Ok(reports)
    }

    fn read_state<K: 'static, S: 'static>(
        &self,
        store: &StateStore<K, S>,
        key: &K,
        after: Option<VectorClock>,
        timeout: Duration,
    ) -> Result<Option<S>, QueryError> {
        let state = self.state();
        if !matches!(state, StreamsState::Running | StreamsState::Rebalancing) {
            return Err(QueryError::NotRunning(state));
        }
        let stage = self
            .app
            .stage(store.stage())
            .filter(|s| s.is_stateful())
            .ok_or_else(|| QueryError::UnknownStage(store.stage().to_owned()))?;
        let codec = stage
            .state_codec::<S>()
            .ok_or_else(|| QueryError::UnknownStage(store.stage().to_owned()))?;
        let (task, bytes) = self.task_of(store, key)?;
        let started = Instant::now();
        let query = StateQuery {
            task: task.clone(),
            key: FoldKey::Key(bytes),
            after,
            deadline: now_ms()
                .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        };
        let threads = self.options.threads.max(1);
        let (tx, rx) = mpsc::channel();
        {
            let mut inboxes = lock(&self.inboxes);
            for index in 0..threads {
                let id = self
                    .next_query
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                inboxes.entry(index).or_default().push(Request {
                    id,
                    query: query.clone(),
                    reply: tx.clone(),
                });
            }
        }
        drop(tx);
        // The worker answers a timed-out causal query itself at its
        // deadline; the margin covers the thread's turn.
        let until = started + timeout + Duration::from_secs(1);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(QueryAnswer::Value(value)) => {
                    return value
                        .map(|b| codec.decode(&b))
                        .transpose()
                        .map_err(|cause| QueryError::Decode { task, cause });
                }
                // Every cause delivered, the commit not reported yet.
                Ok(QueryAnswer::TimedOut(waiting_on)) if waiting_on.is_empty() => {
                    return Err(QueryError::NoAnswer {
                        task,
                        waited: started.elapsed(),
                    });
                }
                Ok(QueryAnswer::TimedOut(waiting_on)) => {
                    return Err(QueryError::CausesMissing {
                        task,
                        waited: started.elapsed(),
                        waiting_on,
                    });
                }
                Ok(QueryAnswer::Restoring) => return Err(QueryError::Restoring { task }),
                // Another thread may run it: wait for the others.
                Ok(QueryAnswer::NotHosted) => {}
                // Every thread answered "not here" or dropped the query (its
                // membership ended): the task is not here now.
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(QueryError::NotHosted { task });
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(QueryError::NoAnswer {
                        task,
                        waited: started.elapsed(),
                    });
                }
            }
        }
    }
}
