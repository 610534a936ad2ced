//! Restores as jobs: the changelog replay of a starting task, cut out of
//! the worker so a host can run it away from its processing path.
//!
//! The worker decides everything about a restore (which local store to
//! trust, from which offsets to replay, what the rebuilt stores mean) and
//! keeps the task out of processing until it is done; only the replay
//! itself, which waits on the network, is a [`RestoreJob`]. Under
//! [`RestoreMode::Inline`] the worker runs each job at once, inside the
//! call that started the task. Under [`RestoreMode::Deferred`] it queues
//! them ([`Ready::restores`](crate::runtime::worker::Ready::restores));
//! the host runs them where it likes (the Kafka runtime: on a restore
//! thread) with its own changelog reader, and hands each
//! [`RestoreOutcome`] back
//! ([`Ack::Restored`](crate::runtime::worker::Ack::Restored)),
//! while the tasks that are ready go on processing. The restoring task's
//! partitions are paused meanwhile. An outcome for a task that left in
//! between (revoked, fenced) is ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::runtime::changelog::{
    self, ChangelogError, Changelogs, FoldSpill, Progress, RestoreListener, RestoreStart, Restored,
};

use crate::runtime::host::ChangelogReader;
use crate::runtime::host::TopicMetadata;
use crate::runtime::local::{LocalSnapshot, WipeReason};
use crate::runtime::metrics::TaskMeters;
use crate::runtime::task::TaskId;

/// Where a worker runs its tasks' changelog replays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestoreMode {
    /// Inside the call that starts the task: the task runs as soon as the
    /// call returns (the test driver, and hosts without threads).
    #[default]
    Inline,
    /// As jobs the host takes and runs elsewhere; the task starts when the
    /// host hands the outcome back, and the ready tasks are not held up.
    Deferred,
}

/// One task's changelog replay, ready to run.
pub struct RestoreJob {
    pub(crate) id: u64,
    pub(crate) task: TaskId,
    pub(crate) state: String,
    pub(crate) fold: Option<String>,
    pub(crate) tasks: i32,
    /// The local store's content to start from (checked against the
    /// changelogs already); turned into stores here, off the stream
    /// thread.
    pub(crate) start: Option<LocalSnapshot>,
    pub(crate) from_local: bool,
    /// Each changelog's (log start, end), for what remains.
    pub(crate) bounds: BTreeMap<String, (i64, i64)>,
    pub(crate) listener: Option<Arc<dyn RestoreListener>>,
    pub(crate) thread_id: String,
    /// Where a bounded task's fold state goes while it is replayed.
    pub(crate) spill: Option<FoldSpill>,
    /// Set by the worker once it no longer waits for this job.
    pub(crate) cancelled: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for RestoreJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreJob")
            .field("id", &self.id)
            .field("task", &self.task)
            .field("from_local_store", &self.start.is_some())
            .finish_non_exhaustive()
    }
}

impl RestoreJob {
    /// The task it restores.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// Whether the worker stopped waiting for this job (its task left):
    /// [`run`](Self::run) then returns at once, reading and writing
    /// nothing.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Replays the task's changelogs through `reader` (from the local
    /// store's checkpoint, or from the beginning), reporting progress to
    /// the restore metrics and listener as it goes. A job the worker no
    /// longer waits for ([`is_cancelled`](Self::is_cancelled)) is not run:
    /// its outcome is [`ChangelogError::Cancelled`].
    pub fn run(self, metadata: &dyn TopicMetadata, reader: &dyn ChangelogReader) -> RestoreOutcome {
        if self.is_cancelled() {
            return RestoreOutcome {
                job: self.id,
                result: Err(ChangelogError::Cancelled {
                    task: self.task.clone(),
                }),
                task: self.task,
                unusable: None,
            };
        }
        let RestoreJob {
            id,
            task,
            state,
            fold,
            tasks,
            start,
            from_local: _,
            bounds,
            listener,
            thread_id,
            mut spill,
            cancelled: _,
        } = self;
        let ends: BTreeMap<String, i64> = bounds
            .iter()
            .map(|(topic, &(_, end))| (topic.clone(), end))
            .collect();
        let changelogs = Changelogs {
            state: &state,
            fold: fold.as_deref(),
            tasks,
            ends: Some(&ends),
        };
        let (restored_total, remaining) = TaskMeters::restore(&thread_id, &task);
        let mut last = 0u64;
        let mut progress = |p: Progress<'_>| {
            let end = bounds.get(p.topic).map_or(p.next, |b| b.1);
            let left = u64::try_from(end.saturating_sub(p.next)).unwrap_or(0);
            if p.restored < last {
                // The task's next changelog.
                last = 0;
            }
            restored_total.increment(p.restored - last);
            last = p.restored;
            remaining.set(if p.done { 0.0 } else { left as f64 });
            let Some(l) = &listener else {
                return;
            };
            if p.done {
                l.on_restore_end(&task, p.topic, task.partition, p.restored);
            } else if p.restored == 0 {
                l.on_restore_start(&task, p.topic, task.partition, p.next, end);
            } else {
                l.on_batch_restored(&task, p.topic, task.partition, p.restored, left);
            }
        };
        // Building the stores from a large snapshot takes a while (about
        // 70 ms for 167k keys): here, not in the rebalance.
        let (start, unusable) = match start.map(start_from) {
            Some(Ok(start)) => (Some(start), None),
            Some(Err(reason)) => (None, Some(reason)),
            None => (None, None),
        };
        let result = changelog::restore_from(
            &task,
            &changelogs,
            metadata,
            reader,
            start,
            spill.as_mut(),
            &mut progress,
        );
        RestoreOutcome {
            job: id,
            task,
            result,
            unusable,
        }
    }
}

/// What a restore job came to, for the worker.
#[derive(Debug)]
pub struct RestoreOutcome {
    pub(crate) job: u64,
    pub(crate) task: TaskId,
    pub(crate) result: Result<Restored, ChangelogError>,
    /// Why the local store's entries could not be used, when they could
    /// not (the whole changelog was replayed instead).
    pub(crate) unusable: Option<WipeReason>,
}

impl RestoreOutcome {
    /// The task it restored.
    pub fn task(&self) -> &TaskId {
        &self.task
    }
}

/// The stores a usable snapshot holds, as a restore's start; a protocol
/// key that is not UTF-8 or a fold key that names no slot makes the store
/// unusable.
pub(crate) fn start_from(snapshot: LocalSnapshot) -> Result<RestoreStart, WipeReason> {
    let mut stores = crate::runtime::task::TaskStores::default();
    for (key, value) in snapshot.protocol {
        let key = String::from_utf8(key).map_err(|_| {
            WipeReason::Unreadable("a protocol store key that is not UTF-8".to_owned())
        })?;
        stores.protocol.insert_raw(&key, value);
    }
    for (key, value) in snapshot.fold {
        if crate::fold::FoldKey::from_bytes(&key).is_none() {
            return Err(WipeReason::Unreadable(
                "a fold store key that names no slot".to_owned(),
            ));
        }
        stores.fold.put_bytes(key, value);
    }
    Ok(RestoreStart {
        stores,
        from: snapshot.checkpoint,
    })
}
