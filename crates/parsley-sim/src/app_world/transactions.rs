//! Polls, commits, aborts, faults and crashes: what becomes of a thread's
//! transaction.

use super::*;

impl AppWorld {
    /// A static member's process dies and a new one takes its place within
    /// the session timeout: same member, same generation, same partitions,
    /// and no rebalance of the others. What the dead process had not
    /// committed is gone (its successor's producer fences it); the new
    /// thread starts every task of the assignment from the committed state.
    pub(super) fn bounce(&mut self, i: usize) -> Result<(), AppFailure> {
        self.stats.bounces += 1;
        // The new process's producer ends what the old one left open.
        self.orphan(i);
        let id = self.members[i].id;
        // The old process first: its disk is free for the new one.
        let old = std::mem::replace(&mut self.members[i].thread, Box::new(Gone));
        drop(old);
        self.members[i].thread = (self.factory)(id);
        let m = &mut self.members[i];
        m.buffer.clear();
        m.positions.clear();
        m.paused.clear();
        let parts = m.assignment.clone();
        let assigned: Vec<AssignedPartition> =
            parts.iter().map(|(t, p)| self.assigned(t, *p)).collect();
        let now = self.now;
        let broker = &self.broker;
        self.members[i]
            .thread
            .assign(assigned, broker, now)
            .map_err(|e| {
                self.fail(format!(
                    "member {id}: assignment refused after a restart: {e}"
                ))
            })?;
        self.apply_seeks(i)
    }

    pub(super) fn crash(&mut self, i: usize) -> Result<(), AppFailure> {
        self.stats.crashes += 1;
        self.orphan(i);
        self.members.remove(i);
        let live = self.members.iter().filter(|m| !m.zombie).count();
        if live == 0 {
            self.add_member();
        }
        self.rebalance(None)
    }

    /// Commits (or aborts, or crashes during) a transaction of member `i`,
    /// judging it through the oracle when it commits.
    /// A record of `txn` to refuse: mostly an emission (a record that is
    /// not a changelog record), sometimes any record.
    pub(super) fn refusable(&mut self, txn: &HostTransaction) -> usize {
        let emissions: Vec<usize> = txn
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.topic.ends_with("-changelog"))
            .map(|(i, _)| i)
            .collect();
        if !emissions.is_empty() && self.rng.random_bool(0.75) {
            emissions[self.rng.random_range(0..emissions.len())]
        } else {
            self.rng.random_range(0..txn.records.len().max(1))
        }
    }

    /// Asks member `i`'s thread what to do about `fault`, and checks the
    /// answer is a safe one for its class.
    pub(super) fn answer(&mut self, i: usize, fault: SimFault) -> Result<SimDirective, AppFailure> {
        self.answer_after(i, fault, false)
    }

    /// [`answer`](Self::answer), where `commit_sent` says the host had
    /// asked the coordinator to commit before the fault came.
    fn answer_after(
        &mut self,
        i: usize,
        fault: SimFault,
        commit_sent: bool,
    ) -> Result<SimDirective, AppFailure> {
        let broker = &self.broker;
        let d = self.members[i]
            .thread
            .fault(fault, broker)
            .map_err(|e| self.fail(format!("member {i}: fault {fault:?} refused: {e}")))?;
        if !fault.allows(d, commit_sent) {
            return Err(self.fail(format!(
                "member {i}: {fault:?} answered with {d:?}, which lets an unsafe transaction or client go on"
            )));
        }
        Ok(d)
    }

    /// Member `i` learns from its consumer that the group ended its
    /// session (a zombie, or a member whose heartbeats stopped): its thread
    /// aborts the open work itself (what it streamed ends aborted), and it
    /// joins again as a new member.
    pub(super) fn lost(&mut self, i: usize) -> Result<(), AppFailure> {
        if !self.members[i].zombie {
            self.budget.zombies = self.budget.zombies.saturating_sub(1);
        }
        let broker = &self.broker;
        self.members[i]
            .thread
            .lose_assignment(broker)
            .map_err(|e| self.fail(format!("member {i}: losing its assignment refused: {e}")))?;
        self.stream(i)?;
        if !self.members[i].open.is_empty() {
            return Err(self.fail(format!(
                "member {i} lost its assignment, and its open transaction with {} records in the log was not aborted",
                self.members[i].open.len()
            )));
        }
        self.replace(i)
    }

    /// Member `i`'s thread is gone (it failed, or left to rejoin): a new
    /// member takes its place, and the group rebalances.
    pub(super) fn replace(&mut self, i: usize) -> Result<(), AppFailure> {
        self.orphan(i);
        self.members.remove(i);
        self.add_member();
        self.rebalance(None)
    }

    /// Leaves member `i`'s transaction's records in the log as aborted
    /// records: those it streamed are there already, the rest are
    /// appended, and an abort marker ends it on every partition it wrote.
    pub(super) fn abort_records(
        &mut self,
        i: usize,
        txn: &HostTransaction,
    ) -> Result<(), AppFailure> {
        let streamed = self.members[i].open.len();
        let streamed_on: BTreeSet<Channel> = self.members[i].open.iter().map(|(c, _)| *c).collect();
        let touched: BTreeSet<(String, i32)> = txn
            .records
            .iter()
            .map(|r| (r.topic.to_string(), r.partition))
            .collect();
        for r in txn.records.iter().skip(streamed) {
            let Some(c) = self.channel(&r.topic, r.partition) else {
                return Err(self.fail(format!("produce to unknown topic {}", r.topic)));
            };
            let record = self.stored(r, usize::MAX)?;
            self.broker.append(c, record, false);
        }
        self.stats.aborted_records += txn.records.len() as u64;
        self.abort_open(i);
        for (t, p) in &touched {
            if let Some(c) = self.channel(t, *p)
                && !streamed_on.contains(&c)
            {
                self.broker.append_marker(c, false);
            }
        }
        Ok(())
    }

    /// Appends what member `i`'s producer did with its open transaction
    /// since the world last looked: records produced into it (pending in
    /// the log, their fate decided by its commit or abort), and aborts the
    /// thread made itself.
    pub(super) fn stream(&mut self, i: usize) -> Result<(), AppFailure> {
        for event in self.members[i].thread.take_streamed() {
            match event {
                Streamed::Records(records) => {
                    for r in &records {
                        let Some(c) = self.channel(&r.topic, r.partition) else {
                            return Err(self.fail(format!("produce to unknown topic {}", r.topic)));
                        };
                        let record = self.stored(r, usize::MAX)?;
                        let txn = self.open_txn(i);
                        let offset = self.broker.append_pending(c, record, txn);
                        self.members[i].open.push((c, offset));
                        self.stats.streamed_records += 1;
                        if self.members[i].zombie || self.members[i].generation != self.generation {
                            self.stats.zombie_streamed_records += 1;
                        }
                    }
                }
                Streamed::Aborted => {
                    if !self.members[i].open.is_empty() {
                        self.stats.streamed_self_aborts += 1;
                    }
                    self.abort_open(i);
                }
            }
        }
        Ok(())
    }

    /// The number of member `i`'s open transaction in the log, given it
    /// now if it has none yet (its first record, or its commit).
    pub(super) fn open_txn(&mut self, i: usize) -> u64 {
        *self.members[i].open_txn.get_or_insert_with(|| {
            self.next_txn += 1;
            self.next_txn - 1
        })
    }

    /// Member `i`'s open transaction ends aborted: an abort marker on every
    /// partition its streamed records reached.
    pub(super) fn abort_open(&mut self, i: usize) {
        let m = &mut self.members[i];
        let open = std::mem::take(&mut m.open);
        let Some(txn) = m.open_txn.take() else {
            return;
        };
        self.stats.streamed_aborted += open.len() as u64;
        let touched: BTreeSet<Channel> = open.iter().map(|(c, _)| *c).collect();
        for c in touched {
            self.broker.abort_open(c, txn);
        }
    }

    /// Member `i`'s process is gone: what it streamed and had not taken
    /// yet is lost with it, and its open transaction is aborted (by its
    /// coordinator's timeout, or by the producer that takes its
    /// transactional id over).
    fn orphan(&mut self, i: usize) {
        let _ = self.members[i].thread.take_streamed();
        if !self.members[i].open.is_empty() {
            self.stats.orphans_aborted += 1;
        }
        self.abort_open(i);
    }

    /// A commit of member `i` meets a client fault; the thread's answer is
    /// carried out as a host would.
    pub(super) fn faulted(
        &mut self,
        i: usize,
        txn: HostTransaction,
        fault: SimFault,
    ) -> Result<(), AppFailure> {
        let class = match fault {
            SimFault::Fenced => 0,
            SimFault::Fatal => 1,
            SimFault::Abortable => 2,
            SimFault::Retriable => 3,
            SimFault::RecordRefused {
                dead_letter: false, ..
            } => 4,
            SimFault::RecordRefused { .. } => 5,
            SimFault::Poll { fatal: false } => 6,
            SimFault::Poll { fatal: true } => 7,
            SimFault::Transient { .. } => 8,
            SimFault::AbortFailed { retriable: true } => 9,
            SimFault::AbortFailed { retriable: false } => 10,
            SimFault::Hung => 11,
        };
        let fault = match fault {
            SimFault::RecordRefused { .. } | SimFault::Transient { .. }
                if txn.records.is_empty() =>
            {
                SimFault::Abortable
            }
            other => other,
        };
        if let SimFault::RecordRefused {
            dead_letter: true, ..
        } = fault
        {
            self.dead_letters_allowed += 1;
        }
        self.stats.faults[class] += 1;
        let stale = self.members[i].generation != self.generation || self.members[i].zombie;
        // A producer lost (fenced, hung, failed) may have been lost after
        // its host asked the coordinator to commit, which may then have
        // recorded the commit whatever the client heard.
        let commit_sent = matches!(fault, SimFault::Fenced | SimFault::Hung | SimFault::Fatal)
            && self.rng.random_bool(0.5);
        if commit_sent {
            self.members[i].thread.ending();
        }
        loop {
            match self.answer_after(i, fault, commit_sent)? {
                SimDirective::Retry => {
                    if self.rng.random_bool(0.3) {
                        // The retried step went through.
                        return self.commit(i, txn, CommitFate::Commit);
                    }
                }
                SimDirective::Abort => {
                    // The abort itself may fail: its coordinator
                    // unreachable (it may go through when made again), or
                    // refusing it.
                    while self.budget.faults > 0 && self.rng.random_bool(0.25) {
                        self.budget.faults -= 1;
                        let retriable = self.rng.random_bool(0.5);
                        self.stats.faults[if retriable { 9 } else { 10 }] += 1;
                        match self.answer(i, SimFault::AbortFailed { retriable })? {
                            // Made again: it fails again, or goes through.
                            SimDirective::Retry => continue,
                            // The new producer's initialisation ends the
                            // transaction.
                            SimDirective::ReplaceProducer => {
                                self.stats.producer_replacements += 1;
                                break;
                            }
                            _ => {
                                self.abort_records(i, &txn)?;
                                return self.replace(i);
                            }
                        }
                    }
                    return self.aborted(i, &txn);
                }
                SimDirective::ReplaceProducer => {
                    self.stats.producer_replacements += 1;
                    return self.aborted(i, &txn);
                }
                SimDirective::Rejoin | SimDirective::Fail => {
                    let unknown = fault == SimFault::Retriable || commit_sent;
                    if unknown && !stale && self.rng.random_bool(0.5) {
                        // The commit's fate was unknown to the thread; the
                        // coordinator had recorded it.
                        if commit_sent {
                            self.stats.lost_after_commit_sent[0] += 1;
                        } else {
                            self.stats.unknown_fates[0] += 1;
                        }
                        self.judge(i, &txn)?;
                    } else {
                        if commit_sent {
                            self.stats.lost_after_commit_sent[1] += 1;
                        } else if fault == SimFault::Retriable {
                            self.stats.unknown_fates[1] += 1;
                        }
                        self.abort_records(i, &txn)?;
                    }
                    return self.replace(i);
                }
                SimDirective::Continue => {
                    return Err(self.fail(format!("member {i}: {fault:?} answered Continue")));
                }
            }
        }
    }

    /// Member `i`'s transaction ended aborted (its records stay in the log
    /// as aborted records); the thread hears it and makes its seeks.
    pub(super) fn aborted(&mut self, i: usize, txn: &HostTransaction) -> Result<(), AppFailure> {
        self.abort_records(i, txn)?;
        self.stats.aborts += 1;
        let broker = &self.broker;
        self.members[i]
            .thread
            .outcome(Outcome::Aborted, broker)
            .map_err(|e| self.fail(format!("member {i}: abort refused: {e}")))?;
        self.apply_seeks(i)
    }

    pub(super) fn commit(
        &mut self,
        i: usize,
        txn: HostTransaction,
        fate: CommitFate,
    ) -> Result<(), AppFailure> {
        // An abort the thread made before the hand-over ends that
        // transaction first (what it streamed since is in `txn`).
        self.stream(i)?;
        if let CommitFate::Fault(fault) = fate {
            return self.faulted(i, txn, fault);
        }
        let (fate, store) = match fate {
            CommitFate::Store(f) => (CommitFate::Commit, Some(f)),
            other => (other, None),
        };
        // EOS v2 fences a zombie through the offset commit, which carries
        // the member's group generation: a transaction without offsets is
        // not fenced (a host must never send one).
        let stale = (self.members[i].generation != self.generation || self.members[i].zombie)
            && !txn.offsets.is_empty();
        if fate == CommitFate::Crash && !stale && self.rng.random_bool(0.5) {
            // The coordinator recorded the commit before the crash: it
            // commits, and the member is gone.
            self.commit(i, txn, CommitFate::Commit)?;
            self.stats.crashes += 1;
            return self.crash(i);
        }
        let holding = !self.members[i].thread.held_heads().is_empty();
        if stale || fate != CommitFate::Commit {
            self.abort_records(i, &txn)?;
            let broker = &self.broker;
            if stale {
                self.stats.fenced += 1;
                self.members[i]
                    .thread
                    .outcome(Outcome::Fenced, broker)
                    .map_err(|e| self.fail(format!("member {i}: fencing refused: {e}")))?;
                // The zombie learns it was fenced and rejoins as a new
                // member.
                self.orphan(i);
                self.members.remove(i);
                self.add_member();
                return self.rebalance(None);
            }
            self.stats.aborts += 1;
            if holding {
                self.stats.aborts_while_holding += 1;
            }
            if fate == CommitFate::Crash {
                self.stats.crashes += 1;
                return self.crash(i);
            }
            self.members[i]
                .thread
                .outcome(Outcome::Aborted, broker)
                .map_err(|e| self.fail(format!("member {i}: abort refused: {e}")))?;
            return self.apply_seeks(i);
        }
        self.judge(i, &txn)?;
        let offsets = std::mem::take(&mut self.last_offsets);
        self.members[i].thread.delivered(&offsets, &self.broker);
        let armed = store.filter(|&f| self.members[i].thread.store_fault(f));
        let broker = &self.broker;
        self.members[i]
            .thread
            .outcome(Outcome::Committed, broker)
            .map_err(|e| self.fail(format!("member {i}: commit refused: {e}")))?;
        if let Some(f) = armed {
            self.budget.store_faults -= 1;
            self.stats.store_faults[f as usize] += 1;
            if f != StoreFault::WriteFails {
                self.stats.crashes += 1;
                return self.crash(i);
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum CommitFate {
    Commit,
    /// Commits, with a fault armed for the local store writes that follow.
    Store(StoreFault),
    Abort,
    Crash,
    Fault(SimFault),
}
