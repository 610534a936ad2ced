//! The host these tests play: the worker behind its one door, with each
//! part of a `Ready` kept until the test asks for it by name. The tests
//! take seeks, pauses, failures and transactions at moments of their own
//! choosing, one part at a time; this keeps what the other parts of the
//! same `Ready` held, in order, as a host that acts on them later would.

// The worker's own error type, as the library returns it.
#![allow(clippy::result_large_err)]

use std::ops::{Deref, DerefMut};

use parsley::Parsley;
use parsley::runtime::changelog::RestoreListener;
use parsley::runtime::local::LocalStore;
use parsley::runtime::worker::{
    Ack, CommitOutcome, FlowChange, Ready, RestoreJob, RestoreOutcome, Seek, TaskFailure,
    Transaction, WorkerConfig, WorkerError,
};
use parsley::task::OutgoingRecord;

use super::Cluster;

pub(crate) struct Worker {
    core: parsley::runtime::worker::Worker,
    pending: Ready,
}

impl Deref for Worker {
    type Target = parsley::runtime::worker::Worker;
    fn deref(&self) -> &Self::Target {
        &self.core
    }
}

impl DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.core
    }
}

impl Worker {
    pub(crate) fn new(app: &Parsley, config: WorkerConfig) -> Worker {
        Worker {
            core: parsley::runtime::worker::Worker::new(app, config),
            pending: Ready::default(),
        }
    }

    pub(crate) fn with_local_store(self, store: Box<dyn LocalStore>) -> Worker {
        Worker {
            core: self.core.with_local_store(store),
            pending: self.pending,
        }
    }

    pub(crate) fn with_restore_listener(
        self,
        listener: std::sync::Arc<dyn RestoreListener>,
    ) -> Worker {
        Worker {
            core: self.core.with_restore_listener(listener),
            pending: self.pending,
        }
    }

    /// What the worker handed over outside a commit point, kept.
    fn fill(&mut self) {
        let ready = self
            .core
            .ready(None)
            .expect("a ready without a commit point never fails");
        self.keep(ready);
    }

    fn keep(&mut self, ready: Ready) {
        if let Some(closed) = self.pending.append(ready) {
            assert!(
                self.pending.transaction.is_none(),
                "two transactions closed at once"
            );
            self.pending.transaction = Some(closed);
        }
    }

    pub(crate) fn take_seeks(&mut self) -> Vec<Seek> {
        self.fill();
        std::mem::take(&mut self.pending.seeks)
    }

    pub(crate) fn take_flow_changes(&mut self) -> Vec<FlowChange> {
        self.fill();
        std::mem::take(&mut self.pending.flow)
    }

    pub(crate) fn take_task_failures(&mut self) -> Vec<TaskFailure> {
        self.fill();
        std::mem::take(&mut self.pending.failures)
    }

    pub(crate) fn take_backoff(&mut self) -> Option<std::time::Duration> {
        self.fill();
        self.pending.backoff.take()
    }

    /// The records streamed since they were last taken, with the index in
    /// the open transaction of the first.
    pub(crate) fn take_produced(&mut self) -> (usize, Vec<OutgoingRecord>) {
        self.fill();
        (
            self.pending.produce_at,
            std::mem::take(&mut self.pending.produce),
        )
    }

    /// Whether the worker aborted a transaction records were streamed
    /// into since this was last asked.
    pub(crate) fn take_abort_streamed(&mut self) -> bool {
        self.fill();
        std::mem::take(&mut self.pending.abort_streamed)
    }

    pub(crate) fn take_restore_jobs(&mut self) -> Vec<RestoreJob> {
        self.fill();
        std::mem::take(&mut self.pending.restores)
    }

    /// A commit point: the transaction, if one is due.
    pub(crate) fn poll_transaction(
        &mut self,
        now: i64,
    ) -> Result<Option<Transaction>, WorkerError> {
        let mut ready = self.core.ready(Some(now))?;
        let txn = ready.transaction.take();
        self.keep(ready);
        Ok(txn)
    }

    /// Closes the open transaction and takes it.
    pub(crate) fn flush(&mut self) -> Result<Option<Transaction>, WorkerError> {
        self.core.flush()?;
        self.fill();
        Ok(self.pending.transaction.take())
    }

    /// Settles the open work before a revocation; the transaction to commit
    /// first, if there is one.
    pub(crate) fn before_revoke(
        &mut self,
        lost: bool,
        cluster: &Cluster,
    ) -> Result<Option<Transaction>, WorkerError> {
        self.core.before_revoke(lost, cluster)?;
        self.fill();
        Ok(self.pending.transaction.take())
    }

    /// The revocation; what was kept for the partitions that go, goes too
    /// (the worker drops what it still queues for them).
    pub(crate) fn revoke(&mut self, partitions: &[(String, i32)]) -> Result<(), WorkerError> {
        self.core.revoke(partitions)?;
        self.pending.forget(partitions);
        Ok(())
    }

    pub(crate) fn seek_applied(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), WorkerError> {
        let ack = Ack::Seeked {
            topic,
            partition,
            offset,
        };
        self.core.advance(ack, &Cluster::default())
    }

    pub(crate) fn delivered(&mut self, offsets: &[i64]) {
        self.core
            .advance(Ack::Delivered(offsets), &Cluster::default())
            .expect("delivery reports are always taken");
    }

    pub(crate) fn commit_outcome(
        &mut self,
        outcome: CommitOutcome,
        cluster: &Cluster,
    ) -> Result<(), WorkerError> {
        self.core.advance(Ack::Committed(outcome), cluster)
    }

    pub(crate) fn restored(
        &mut self,
        outcome: RestoreOutcome,
        cluster: &Cluster,
    ) -> Result<(), WorkerError> {
        self.core.advance(Ack::Restored(outcome), cluster)
    }
}
