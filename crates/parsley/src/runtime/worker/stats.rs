//! What a worker counts: [`WorkerStats`].

/// Counters since the worker was created.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct WorkerStats {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions aborted.
    pub aborts: u64,
    /// Times the worker was fenced.
    pub fenced: u64,
    /// Tasks started (assignment).
    pub tasks_started: u64,
    /// Tasks restored with held records.
    pub restored_with_held: u64,
    /// Of those, tasks whose held records were read from their local store
    /// (not kept in memory at the start).
    pub restored_with_held_on_disk: u64,
    /// Tasks rebuilt after an abort while they held records their local
    /// store kept for them.
    pub resets_with_held_on_disk: u64,
    /// Truncation sweeps run (per task).
    pub sweeps: u64,
    /// Stamp-side entries the sweeps removed.
    pub truncated_entries: u64,
    /// Sweeps skipped because the log-start lookup failed.
    pub truncation_sweeps_skipped: u64,
    /// Positions deferred because polled records below them were not yet
    /// handed over.
    pub positions_deferred: u64,
    /// Task starts that failed on a transient lookup and were retried.
    pub task_start_retries: u64,
    /// Records dropped because their task was waiting to start (they are
    /// fetched again from the task's start position).
    pub dropped_while_waiting: u64,
    /// Channels that went on from their log start past records retention
    /// removed before the stage read them
    /// ([`OnRetentionLoss::ResumeAtLogStart`](super::OnRetentionLoss::ResumeAtLogStart)).
    pub retention_losses: u64,
    /// Tasks that failed and were stopped.
    pub task_failures: u64,
    /// Stopped tasks restarted.
    pub task_restarts: u64,
    /// Faults the host reported ([`Worker::on_fault`](super::Worker::on_fault)).
    pub faults: u64,
    /// Commit steps retried after a retriable fault.
    pub commit_retries: u64,
    /// Transactions aborted for a transient fault
    /// ([`Fault::Transient`](super::Fault::Transient), [`Fault::Abortable`](super::Fault::Abortable)), each followed by a
    /// backoff.
    pub transient_aborts: u64,
    /// Producers replaced with the membership kept
    /// ([`Directive::ReplaceProducer`](super::Directive::ReplaceProducer)).
    pub producer_replacements: u64,
    /// Task restores that read a changelog only up to below the end the
    /// task started against ([`ChangelogError::Unstable`](crate::runtime::changelog::ChangelogError::Unstable)) and waited.
    pub short_restores: u64,
    /// Times a task was left partial: some of its partitions here, the
    /// rest not yet ([`Assignment::Incremental`](super::Assignment::Incremental)).
    pub partial_tasks: u64,
    /// Changelog records replayed by task starts.
    pub changelog_records_replayed: u64,
    /// Tasks started from their local store (replaying only the changelog
    /// after its checkpoint).
    pub local_store_starts: u64,
    /// Local stores wiped and rebuilt from the whole changelog (missing
    /// ones are not counted).
    pub local_store_rebuilds: u64,
    /// Local store writes that failed or could not be checkpointed (the
    /// store was wiped).
    pub local_store_write_failures: u64,
    /// Partitions paused because their task's holds passed the hold
    /// budget.
    pub hold_pauses: u64,
    /// Of those, resumed because their queue drained.
    pub hold_resumes_drained: u64,
    /// Of those, resumed because a held head or an arriving record claimed
    /// records on them.
    pub hold_resumes_claimed: u64,
    /// Of those, resumed because the task's holds fell to half the budget.
    pub hold_resumes_relieved: u64,
    /// Times a partition with a held head was left fetching past the
    /// budget because a held head (or an arriving record) waited for its
    /// records.
    pub hold_pauses_withheld: u64,
    /// Held records read back from a task's committed store as the gate
    /// reached them (see [`WorkerConfig::hold_window`](super::WorkerConfig::hold_window)).
    pub records_paged_in: u64,
    /// Fold state entries read from a task's local store because they had
    /// left memory (see [`WorkerConfig::fold_cache`](super::WorkerConfig::fold_cache)).
    pub fold_store_reads: u64,
    /// Fold state entries that left memory for the local store.
    pub fold_cache_evictions: u64,
    /// Times an entry over the fold cache stayed in memory because the
    /// local store did not hold its latest write yet.
    pub fold_evictions_withheld: u64,
    /// Held records whose in-memory copy was dropped once the task's
    /// local store held them.
    pub held_records_evicted: u64,
    /// Held records read back from a task's local store (as the gate
    /// reached them, or when the task started or was rebuilt).
    pub held_records_read_from_disk: u64,
    /// Releases that went on in a later transaction after stopping at
    /// [`WorkerConfig::release_per_transaction`](super::WorkerConfig::release_per_transaction).
    pub releases_resumed: u64,
    /// Transactions handed over before the commit interval because the
    /// host's fetch was drained ([`WorkerConfig::commit_when_idle`](super::WorkerConfig::commit_when_idle)).
    pub idle_commits: u64,
    /// Readies between commit points that kept what the tasks made back
    /// for a later batch, because fewer than
    /// [`Streaming::every`](super::Streaming::every) records had been
    /// handed in since the last hand-out.
    pub streams_held_for_batch: u64,
}

impl WorkerStats {
    pub(super) fn add(&mut self, c: crate::runtime::metrics::Counted) {
        self.records_paged_in += c.paged_in;
        self.fold_store_reads += c.fold.reads;
        self.fold_cache_evictions += c.fold.evicted;
        self.fold_evictions_withheld += c.fold.withheld;
        self.held_records_evicted += c.held_evicted;
        self.held_records_read_from_disk += c.held_disk_reads;
    }
}
