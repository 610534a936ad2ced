//! Tasks that failed and stopped alone: their failures in a row, their
//! restarts after a backoff, and the ones restarting now.

use super::*;

/// The worker's stopped tasks, with private state: a task stops, is given
/// its restart time, and restarts only through these methods.
#[derive(Debug, Default)]
pub(super) struct Stops {
    /// Tasks that failed and stopped; their partitions stay assigned here.
    stopped: BTreeMap<TaskId, Stopped>,
    /// Each task's failures in a row, kept across its restarts.
    streaks: BTreeMap<TaskId, Streak>,
    /// Failed tasks whose restart in place is starting now.
    restarting: BTreeSet<TaskId>,
}

impl Stops {
    /// Whether `task` is stopped.
    pub(super) fn contains(&self, task: &TaskId) -> bool {
        self.stopped.contains_key(task)
    }

    /// The stopped tasks.
    pub(super) fn tasks(&self) -> impl Iterator<Item = &TaskId> {
        self.stopped.keys()
    }

    /// `task` failed at `now` and stops, with no restart asked for yet;
    /// returns its failures in a row before this one.
    pub(super) fn stop(&mut self, task: &TaskId, now: i64, backoff: &Backoff) -> u32 {
        let earlier = self
            .streaks
            .entry(task.clone())
            .or_default()
            .fail(now, backoff);
        self.stopped
            .insert(task.clone(), Stopped { restart_at: None });
        earlier
    }

    /// Asks for `task`'s restart one step of `backoff` after `now` (the
    /// step of its failures in a row); the wait, or `None` when the task
    /// is not stopped here.
    pub(super) fn restart_after(
        &mut self,
        task: &TaskId,
        now: i64,
        backoff: &Backoff,
    ) -> Option<Duration> {
        let earlier = self
            .streaks
            .get(task)
            .map_or(0, |s| s.failures.saturating_sub(1));
        let wait = backoff.step(earlier);
        let stopped = self.stopped.get_mut(task)?;
        stopped.restart_at = Some(now.saturating_add(ms(wait)));
        Some(wait)
    }

    /// Asks for `task`'s restart at `now`, if it is stopped.
    pub(super) fn restart_now(&mut self, task: &TaskId, now: i64) {
        if let Some(s) = self.stopped.get_mut(task) {
            s.restart_at = Some(now);
        }
    }

    /// The earliest restart asked for, by the host's clock.
    pub(super) fn next_restart(&self) -> Option<i64> {
        self.stopped.values().filter_map(|s| s.restart_at).min()
    }

    /// The tasks whose restart is due at `now`.
    pub(super) fn due(&self, now: i64) -> Vec<TaskId> {
        self.stopped
            .iter()
            .filter(|(_, s)| s.restart_at.is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// `task` restarts at `now`: it is no longer stopped, and is
    /// restarting until [`restart_started`](Self::restart_started).
    pub(super) fn begin_restart(&mut self, task: &TaskId, now: i64) {
        self.stopped.remove(task);
        self.streaks.entry(task.clone()).or_default().restarted_at = Some(now);
        self.restarting.insert(task.clone());
    }

    /// `task`'s restart is no longer starting; whether it was.
    pub(super) fn restart_started(&mut self, task: &TaskId) -> bool {
        self.restarting.remove(task)
    }

    /// `task` left (its partitions were revoked); whether it was stopped.
    pub(super) fn remove(&mut self, task: &TaskId) -> bool {
        self.stopped.remove(task).is_some()
    }

    /// Every task was dropped: none is stopped any more (their failures in
    /// a row are kept, for when the tasks come back).
    pub(super) fn clear(&mut self) {
        self.stopped.clear();
    }
}
