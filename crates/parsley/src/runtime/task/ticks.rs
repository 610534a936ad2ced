//! A task's tick schedule. Ticks fall due on a fixed grid, the multiples
//! of the interval since the epoch, so a late punctuation does not push
//! the schedule back. The schedule is part of what a transaction commits:
//! an abort resumes it as of the last commit, so the tick of an aborted
//! transaction falls due again.

/// When a ticking task's next tick is due (host wall clock, ms), as of
/// now, as of the transaction in flight, and as of the last commit. All
/// `None` for a stage that does not tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TickSchedule {
    next: Option<i64>,
    in_flight: Option<i64>,
    committed: Option<i64>,
}

impl TickSchedule {
    /// A fresh schedule: the first grid point after `now`, for a stage
    /// ticking every `interval_ms` (none for `None`).
    pub(super) fn starting(now: i64, interval_ms: Option<i64>) -> Self {
        let next = interval_ms.map(|i| next_grid_point(now, i));
        TickSchedule {
            next,
            in_flight: next,
            committed: next,
        }
    }

    /// When the next tick is due.
    pub(super) fn next(&self) -> Option<i64> {
        self.next
    }

    /// Whether a tick is due at `now`.
    pub(super) fn due(&self, now: i64) -> bool {
        self.next.is_some_and(|at| now >= at)
    }

    /// A tick was emitted at `now`: the next falls on the grid point after
    /// it (one tick per call, however many points the clock jumped over).
    pub(super) fn ticked(&mut self, now: i64, interval_ms: i64) {
        self.next = Some(next_grid_point(now, interval_ms));
    }

    /// A transaction was handed over: the schedule as of it.
    pub(super) fn handed_over(&mut self) {
        self.in_flight = self.next;
    }

    /// That transaction committed.
    pub(super) fn committed(&mut self) {
        self.committed = self.in_flight;
    }

    /// The schedule a reset task resumes: as of the last commit, if the
    /// stage ticks; `fresh` (the new task's own) otherwise.
    pub(super) fn resumed(self, fresh: TickSchedule) -> TickSchedule {
        match self.committed {
            Some(at) => TickSchedule {
                next: Some(at),
                in_flight: fresh.in_flight,
                committed: Some(at),
            },
            None => fresh,
        }
    }
}

/// The first multiple of `interval` after `now`: the tick grid.
fn next_grid_point(now: i64, interval: i64) -> i64 {
    let interval = interval.max(1);
    now.div_euclid(interval)
        .saturating_add(1)
        .saturating_mul(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_fall_on_a_grid_and_an_abort_resumes_the_committed_schedule() {
        let mut t = TickSchedule::starting(1_050, Some(100));
        assert_eq!(t.next(), Some(1_100));
        assert!(!t.due(1_099) && t.due(1_100));
        // Late, and over several grid points: one tick, the next on the grid.
        t.ticked(1_370, 100);
        assert_eq!(t.next(), Some(1_400));
        t.handed_over();
        t.ticked(1_400, 100);
        // Committed as of the hand-over (1_400), not the later tick.
        t.committed();
        let reset = t.resumed(TickSchedule::starting(9_999, Some(100)));
        assert_eq!(reset.next(), Some(1_400));
        assert_eq!(TickSchedule::starting(5, None).next(), None);
    }
}
