//! What a stream thread is doing, and the application's state that the
//! threads' readiness moves.

use super::*;

/// What a stream thread is doing, for a close that cannot finish to name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Doing {
    Starting,
    Joining,
    Polling,
    Committing,
    StartingTasks,
    RevokingTasks,
    RejoinBackoff,
    TransientBackoff,
    ClosingCommit,
    ClosingLeave,
}

impl std::fmt::Display for Doing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Doing::Starting => "starting",
            Doing::Joining => "joining the group (producer and consumer set-up)",
            Doing::Polling => "polling",
            Doing::Committing => "committing",
            Doing::StartingTasks => "starting tasks (lookups and restores)",
            Doing::RevokingTasks => "revoking tasks",
            Doing::RejoinBackoff => "waiting to join the group again (backoff)",
            Doing::TransientBackoff => "waiting before the next attempt (transient failure)",
            Doing::ClosingCommit => "closing: committing the open transaction",
            Doing::ClosingLeave => "closing: leaving the group",
        })
    }
}

/// Where a stream thread says what it is doing.
pub(super) type Phase = Arc<Mutex<Doing>>;

pub(super) fn set_phase(phase: &Phase, now: Doing) {
    *lock(phase) = now;
}

/// What each stream thread last published (metrics and held heads), by
/// thread index. A thread writes its entry on its sampling punctuation
/// (every 500 ms); readers take the lock only to copy it.
pub(super) type Reports = Arc<Mutex<BTreeMap<usize, Published>>>;

type StateListener = Box<dyn Fn(&StreamsState, &StreamsState) + Send + Sync>;

/// The application's state and who listens to its changes.
pub(super) struct StateCell {
    pub(super) state: Mutex<StreamsState>,
    pub(super) listener: Mutex<Option<StateListener>>,
}

impl Default for StateCell {
    fn default() -> Self {
        StateCell {
            state: Mutex::new(StreamsState::Created),
            listener: Mutex::new(None),
        }
    }
}

impl StateCell {
    pub(super) fn get(&self) -> StreamsState {
        lock(&self.state).clone()
    }

    /// Moves to `new`; a failure is final (a later stop keeps it).
    pub(super) fn set(&self, new: StreamsState) {
        let old = {
            let mut state = lock(&self.state);
            if matches!(*state, StreamsState::Failed(_))
                && matches!(new, StreamsState::Stopping | StreamsState::Stopped)
            {
                return;
            }
            std::mem::replace(&mut *state, new.clone())
        };
        if std::mem::discriminant(&old) != std::mem::discriminant(&new)
            && let Some(listener) = lock(&self.listener).as_ref()
        {
            listener(&old, &new);
        }
    }
}

/// Which stream threads are ready (their assignment taken and every task
/// of it started): all of them make the instance `Running`, any other
/// mix `Rebalancing`. Stopping, stopped and failed states are left alone.
pub(super) struct Readiness {
    threads: Mutex<Vec<bool>>,
    state: Arc<StateCell>,
}

impl Readiness {
    pub(super) fn new(threads: usize, state: Arc<StateCell>) -> Readiness {
        Readiness {
            threads: Mutex::new(vec![false; threads]),
            state,
        }
    }

    /// Thread `index` is ready, or not.
    pub(super) fn set(&self, index: usize, ready: bool) {
        let mut threads = lock(&self.threads);
        let Some(slot) = threads.get_mut(index) else {
            return;
        };
        if *slot == ready {
            return;
        }
        *slot = ready;
        let all = threads.iter().all(|r| *r);
        // Under the lock, so two threads' changes apply in order.
        let now = self.state.get();
        if matches!(now, StreamsState::Running | StreamsState::Rebalancing) {
            self.state.set(if all {
                StreamsState::Running
            } else {
                StreamsState::Rebalancing
            });
        }
    }
}
