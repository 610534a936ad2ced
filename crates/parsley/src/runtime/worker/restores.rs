//! The restores out: each task whose changelog replay runs as a job, when
//! its restore first stopped short of a stable end, the fold cache's share
//! the replays write out with, and the job numbers.

use super::*;

/// A task whose restore job is out, and what its start needs once the job
/// comes back.
#[derive(Debug)]
pub(super) struct Restoring {
    pub(super) job: u64,
    pub(super) prepared: Prepared,
    /// A failed task restarting in place, not a task of a new assignment.
    pub(super) restart: bool,
    /// The job's flag: set when the worker stops waiting for it, so a host
    /// that has not started it yet never does.
    pub(super) cancelled: Arc<std::sync::atomic::AtomicBool>,
}

impl Restoring {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }
}

/// The worker's restores ([`RestoreMode::Deferred`]), with private state:
/// a job is started, finished or cancelled only through these methods.
#[derive(Debug, Default)]
pub(super) struct Restores {
    out: BTreeMap<TaskId, Restoring>,
    /// When each task's restore first stopped below its changelog's end
    /// ([`ChangelogError::Unstable`]), by the host's clock.
    unstable_since: BTreeMap<TaskId, i64>,
    /// Each stateful task's share of the fold cache, read by restore jobs
    /// as they write their fold state out (see [`WorkerConfig::fold_cache`]).
    fold_share: Arc<AtomicUsize>,
    next_job: u64,
}

impl Restores {
    /// No restores yet; each stateful task's share of the fold cache starts
    /// at `fold_cache` (the whole cache) until tasks divide it.
    pub(super) fn new(fold_cache: usize) -> Restores {
        Restores {
            fold_share: Arc::new(AtomicUsize::new(fold_cache)),
            ..Restores::default()
        }
    }

    /// Whether `task`'s restore job is out.
    pub(super) fn contains(&self, task: &TaskId) -> bool {
        self.out.contains_key(task)
    }

    /// How many restore jobs are out.
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    /// The tasks whose restore job is out.
    pub(super) fn tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.out.keys()
    }

    /// The tasks of an assignment restoring (failed tasks restarting in
    /// place left out).
    pub(super) fn of_assignment(&self) -> impl Iterator<Item = &TaskId> {
        self.out
            .iter()
            .filter(|(_, r)| !r.restart)
            .map(|(id, _)| id)
    }

    /// The next job's number.
    pub(super) fn next_job(&mut self) -> u64 {
        self.next_job += 1;
        self.next_job
    }

    /// A job for `task` went out.
    pub(super) fn started(&mut self, task: TaskId, restoring: Restoring) {
        self.out.insert(task, restoring);
    }

    /// The restore of `task` that job `job` finished, if that job is the
    /// one out for it (an outcome of an earlier job is stale).
    pub(super) fn finish(&mut self, task: &TaskId, job: u64) -> Option<Restoring> {
        if self.out.get(task).map(|r| r.job) != Some(job) {
            return None;
        }
        self.out.remove(task)
    }

    /// Stops waiting for `task`'s job, if one is out (its flag tells a
    /// host that has not run it yet to skip it); forgets its unstable
    /// restores either way. Whether a job was out.
    pub(super) fn cancel(&mut self, task: &TaskId) -> bool {
        self.unstable_since.remove(task);
        match self.out.remove(task) {
            Some(r) => {
                r.cancel();
                true
            }
            None => false,
        }
    }

    /// Every task was dropped: every job out is cancelled.
    pub(super) fn cancel_all(&mut self) {
        for restoring in std::mem::take(&mut self.out).into_values() {
            restoring.cancel();
        }
        self.unstable_since.clear();
    }

    /// When `task`'s restore first stopped short of a stable end (now, if
    /// this is the first time).
    pub(super) fn unstable_since(&mut self, task: &TaskId, now: i64) -> i64 {
        *self.unstable_since.entry(task.clone()).or_insert(now)
    }

    /// `task`'s restore is no longer waiting on an unstable end.
    pub(super) fn stable(&mut self, task: &TaskId) {
        self.unstable_since.remove(task);
    }

    /// The fold cache's share of each stateful task, shared with the jobs.
    pub(super) fn fold_share(&self) -> &Arc<AtomicUsize> {
        &self.fold_share
    }
}
