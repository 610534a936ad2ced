//! What the world asks of a stream thread ([`HostThread`]) and the
//! values that cross between them.

use super::*;

/// What a task did inside a transaction, in order.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TaskAct {
    /// The task delivered a record to its logic.
    Delivered {
        /// The task.
        task: String,
        /// The record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
    },
    /// The task sent an emission to the dead-letter topic instead of its
    /// sink: the next record of the transaction on the dead-letter topic,
    /// unstamped, and no causal send.
    DeadLettered {
        /// The task.
        task: String,
    },
    /// The task sent a record (an emission or a tick): the next record of
    /// the transaction that is not a changelog record.
    Sent {
        /// The task.
        task: String,
        /// The destination topic.
        topic: String,
        /// The destination partition.
        partition: i32,
    },
}

/// What a thread's consumer is asked to do, in order: fetch pauses and
/// resumes, then seeks.
#[derive(Clone, Debug, Default)]
pub struct ConsumerMoves {
    /// Pauses and resumes.
    pub flow: Vec<FlowChange>,
    /// Seeks.
    pub seeks: Vec<Seek>,
}

/// What a thread's producer did with its open transaction before the
/// commit, in order ([`HostThread::take_streamed`]).
#[derive(Clone, Debug)]
pub enum Streamed {
    /// These records were produced into the open transaction (the first
    /// of a transaction opens it).
    Records(Vec<OutgoingRecord>),
    /// The open transaction was aborted by the thread itself.
    Aborted,
}

/// One transaction of a thread.
#[derive(Clone, Debug, Default)]
pub struct HostTransaction {
    /// Every record of the transaction, in order: those streamed into it
    /// before the hand-over (which the world may have appended already)
    /// first, then the rest.
    pub records: Vec<OutgoingRecord>,
    /// Consumed positions to commit.
    pub offsets: Vec<(String, i32, i64)>,
    /// What the tasks did, in order.
    pub acts: Vec<TaskAct>,
}

/// How a transaction ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// Committed.
    Committed,
    /// Aborted.
    Aborted,
    /// Fenced: another member owns the tasks now.
    Fenced,
}

/// A failure the world injects at a thread's client, by class: what the
/// host reports to its core, which decides what follows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimFault {
    /// The producer was fenced: its epoch is stale (its coordinator ended
    /// the transaction at its timeout, or another producer took its
    /// transactional id).
    Fenced,
    /// The client failed for good.
    Fatal,
    /// The transaction must be aborted.
    Abortable,
    /// A commit step failed in a way that may pass on a retry.
    Retriable,
    /// One record of the transaction was refused; `dead_letter` says
    /// whether the host's production handler sends it to the world's
    /// dead-letter topic (else the task fails and restarts).
    RecordRefused {
        /// The record's index in the transaction.
        record: usize,
        /// The production handler's choice.
        dead_letter: bool,
    },
    /// The consumer's poll reported an error.
    Poll {
        /// Whether the client gave up on the consumer.
        fatal: bool,
    },
    /// One record of the transaction could not be written *now* (it timed
    /// out while a leader moved, too few replicas were in sync): the
    /// transaction must be aborted and tried again, and the record is not
    /// refused. The host's production handler would send a refused record
    /// to the dead-letter topic, so a core that took this for a refusal
    /// dead-letters a valid emission, which the world counts.
    Transient {
        /// The record's index in the transaction.
        record: usize,
    },
    /// A call of the transactional producer never returned (a client
    /// defect waiting on a coordinator that went away); the commit had not
    /// happened.
    Hung,
    /// The abort the core asked for failed; `retriable` when the client
    /// says it may succeed if made again (its coordinator unreachable).
    AbortFailed {
        /// Whether the abort may be made again.
        retriable: bool,
    },
}

/// What a thread's core told its host to do about a fault.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimDirective {
    /// Retry the step.
    Retry,
    /// Abort the transaction.
    Abort,
    /// Leave the group and join again as a new member.
    Rejoin,
    /// The thread failed (its replacement joins the group).
    Fail,
    /// Nothing to do.
    Continue,
    /// Make a new producer (its initialisation ends the open transaction),
    /// then report the transaction aborted; the membership stays.
    ReplaceProducer,
}

impl SimFault {
    /// Whether `d` is a safe answer to this fault: one that never lets a
    /// transaction of unknown fate, or a fenced producer, go on.
    /// `commit_sent`: the fault came after the host asked the coordinator
    /// to commit ([`HostThread::ending`]), so the transaction may have
    /// committed; a new producer in the same membership would roll the
    /// tasks back past it, so only leaving the group (or failing) is safe.
    pub(super) fn allows(self, d: SimDirective, commit_sent: bool) -> bool {
        use SimDirective::*;
        if commit_sent {
            return matches!(d, Rejoin | Fail);
        }
        match self {
            SimFault::Fenced | SimFault::Hung => matches!(d, Rejoin | ReplaceProducer),
            SimFault::Fatal => matches!(d, Fail | Rejoin),
            SimFault::Abortable | SimFault::RecordRefused { .. } | SimFault::Transient { .. } => {
                d == Abort
            }
            SimFault::Retriable => matches!(d, Retry | Rejoin),
            SimFault::Poll { fatal: true } => matches!(d, Fail | Rejoin),
            SimFault::Poll { fatal: false } => d == Continue,
            SimFault::AbortFailed { retriable: true } => {
                matches!(d, Retry | ReplaceProducer | Rejoin)
            }
            SimFault::AbortFailed { retriable: false } => matches!(d, ReplaceProducer | Rejoin),
        }
    }
}

/// A fault of a thread's local store (its state directory), armed just
/// before a committed transaction's outcome reaches the thread, so it
/// strikes the write that outcome makes. A thread without a local store
/// declines it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreFault {
    /// The process dies inside the write, after the write landed (a write
    /// is atomic: all of it or none).
    CrashAfterWrite,
    /// The process dies inside the write, before it landed.
    CrashBeforeWrite,
    /// The write fails (a full disk) and changes nothing; the process
    /// goes on.
    WriteFails,
    /// The store's file is damaged, then the process dies.
    CorruptAndCrash,
}

/// One stream thread's host core, as the world drives it. Errors are the
/// host's refusals; the world reports them as failures (a correct host in a
/// correct world never refuses).
pub trait HostThread {
    /// Partitions assigned (after a rebalance).
    fn assign(
        &mut self,
        parts: Vec<AssignedPartition>,
        broker: &SimBroker,
        now: i64,
    ) -> Result<(), String>;
    /// Settles the open work before partitions are revoked, as the host
    /// core decides: the transaction to commit first, if any (otherwise
    /// there was nothing open, or the core aborted it).
    fn before_revoke(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String>;
    /// Partitions revoked.
    fn revoke(&mut self, parts: &[(String, i32)]) -> Result<(), String>;
    /// One polled record handed over. A task's failure is the host's to
    /// handle (abort, and its error handler), not a refusal.
    fn on_record(&mut self, record: PolledRecord, broker: &SimBroker) -> Result<(), String>;
    /// The consumer position after a poll, with the highest offset the
    /// polls returned there.
    fn on_position(
        &mut self,
        topic: &str,
        partition: i32,
        position: i64,
        last_returned: Option<i64>,
        broker: &SimBroker,
    ) -> Result<(), String>;
    /// The wall clock.
    fn punctuate(&mut self, now: i64, broker: &SimBroker) -> Result<(), String>;
    /// The open transaction if it is due; `drained` when the thread's
    /// consumer has nothing fetched that it has not handed over.
    fn poll_transaction(
        &mut self,
        now: i64,
        drained: bool,
        broker: &SimBroker,
    ) -> Result<Option<HostTransaction>, String>;
    /// The open transaction now, if any.
    fn flush(&mut self, broker: &SimBroker) -> Result<Option<HostTransaction>, String>;
    /// How the transaction handed over last ended.
    fn outcome(&mut self, outcome: Outcome, broker: &SimBroker) -> Result<(), String>;
    /// The host asks the coordinator to commit the transaction handed over
    /// last (the client's end of the transaction): a fault from here may
    /// follow a commit the coordinator recorded.
    fn ending(&mut self) {}
    /// The host aborted the open (not handed over) work.
    fn abort(&mut self, broker: &SimBroker) -> Result<(), String>;
    /// The fetch pauses and resumes, then the consumer seeks, the core
    /// asks for now (the seeks acknowledged as made: the world makes every
    /// seek it is handed, at once).
    fn take_moves(&mut self, broker: &SimBroker) -> ConsumerMoves;
    /// Whether there is open work.
    fn has_open_work(&self) -> bool;
    /// The offset of every held queue head, as (topic, partition, offset).
    fn held_heads(&self) -> Vec<(String, i32, i64)>;
    /// Whether the thread has work to retry at its next punctuation (a task
    /// whose start failed on a lookup). A real poll loop punctuates on every
    /// turn; the world offers a punctuation without moving the clock.
    fn needs_punctuation(&self) -> bool {
        false
    }
    /// A fault at the thread's client; the answer is what the host does.
    /// Commit faults come while the transaction handed over last is in
    /// flight. A host whose answer stops a task (a refused record) also
    /// handles that task's failure, as its error handlers would.
    fn fault(&mut self, fault: SimFault, broker: &SimBroker) -> Result<SimDirective, String>;
    /// How long from `now` until the thread has timed work (a stopped
    /// task's restart), if any: the world lets that much time pass.
    fn wake_in(&self, _now: i64) -> Option<i64> {
        None
    }
    /// The offset each record of the transaction handed over last got,
    /// before its committed outcome (a producer's delivery reports).
    fn delivered(&mut self, _offsets: &[i64], _broker: &SimBroker) {}
    /// Arms a local store fault for the next outcome's writes; false when
    /// the thread keeps no local store.
    fn store_fault(&mut self, _fault: StoreFault) -> bool {
        false
    }
    /// Whether the thread has a task restore to run (restores that run
    /// apart from processing).
    fn restoring(&self) -> bool {
        false
    }
    /// Runs one task restore against the broker as it is now, and hands
    /// its outcome to the core.
    fn restore_step(&mut self, _broker: &SimBroker) -> Result<(), String> {
        Ok(())
    }
    /// The thread's consumer learns its assignment was lost (a zombie whose
    /// session the group ended): it aborts its open work as a host does
    /// for a lost assignment, and gives its partitions up.
    fn lose_assignment(&mut self, _broker: &SimBroker) -> Result<(), String> {
        Ok(())
    }
    /// Whether the thread produced records into its open transaction (or
    /// aborted one) that the world has not taken yet.
    fn has_streamed(&self) -> bool {
        false
    }
    /// What the thread's producer did with its open transaction since this
    /// was last asked, in order. Records produced but not taken when the
    /// transaction is handed over are in the [`HostTransaction`] instead
    /// (a commit flushes them), and are not listed again.
    fn take_streamed(&mut self) -> Vec<Streamed> {
        Vec::new()
    }
}

/// Makes stream threads: one per member incarnation.
pub type ThreadFactory = Box<dyn Fn(usize) -> Box<dyn HostThread>>;

/// The place of a member's thread between its process's death and its
/// successor's start; never driven.
pub(super) struct Gone;

impl HostThread for Gone {
    fn assign(&mut self, _: Vec<AssignedPartition>, _: &SimBroker, _: i64) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn before_revoke(&mut self, _: &SimBroker) -> Result<Option<HostTransaction>, String> {
        Ok(None)
    }
    fn revoke(&mut self, _: &[(String, i32)]) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn on_record(&mut self, _: PolledRecord, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn on_position(
        &mut self,
        _: &str,
        _: i32,
        _: i64,
        _: Option<i64>,
        _: &SimBroker,
    ) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn punctuate(&mut self, _: i64, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn poll_transaction(
        &mut self,
        _: i64,
        _: bool,
        _: &SimBroker,
    ) -> Result<Option<HostTransaction>, String> {
        Err("the process is gone".into())
    }
    fn flush(&mut self, _: &SimBroker) -> Result<Option<HostTransaction>, String> {
        Err("the process is gone".into())
    }
    fn outcome(&mut self, _: Outcome, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn abort(&mut self, _: &SimBroker) -> Result<(), String> {
        Err("the process is gone".into())
    }
    fn take_moves(&mut self, _: &SimBroker) -> ConsumerMoves {
        ConsumerMoves::default()
    }
    fn has_open_work(&self) -> bool {
        false
    }
    fn held_heads(&self) -> Vec<(String, i32, i64)> {
        Vec::new()
    }
    fn fault(&mut self, _: SimFault, _: &SimBroker) -> Result<SimDirective, String> {
        Err("the process is gone".into())
    }
}
