//! The consumer group: members, the range assignment, rebalances (eager
//! or incremental) and the seeks that follow them.

use super::*;

impl AppWorld {
    pub(super) fn add_member(&mut self) {
        let id = self.next_member;
        self.next_member += 1;
        let thread = (self.factory)(id);
        self.members.push(Member {
            id,
            thread,
            generation: 0,
            assignment: Vec::new(),
            positions: BTreeMap::new(),
            buffer: VecDeque::new(),
            zombie: false,
            paused: BTreeSet::new(),
            open: Vec::new(),
            open_txn: None,
        });
    }

    /// The range assignor over the live, non-zombie members (sorted by id):
    /// per topic, contiguous ranges of partitions, the first members taking
    /// one more when the count does not divide.
    pub(super) fn range_assignment(&self) -> BTreeMap<usize, Vec<(String, i32)>> {
        let live: Vec<usize> = self
            .members
            .iter()
            .filter(|m| !m.zombie)
            .map(|m| m.id)
            .collect();
        let mut out: BTreeMap<usize, Vec<(String, i32)>> =
            live.iter().map(|&id| (id, Vec::new())).collect();
        if live.is_empty() {
            return out;
        }
        let mut topics = self.config.subscriptions.clone();
        topics.sort();
        if self.config.assignor == Assignor::RoundRobin {
            // Dealt by partition, the first topic in member order and every
            // other topic in reverse: with two or more members, partition p
            // of the first topic and of any other land on different members.
            for (ti, t) in topics.iter().enumerate() {
                let n = self
                    .config
                    .topics
                    .iter()
                    .find(|(name, _)| name == t)
                    .map_or(0, |(_, n)| *n);
                for p in 0..n {
                    let m = live.len();
                    let k = p as usize % m;
                    let member = live[if ti == 0 { k } else { m - 1 - k }];
                    if let Some(v) = out.get_mut(&member) {
                        v.push((t.clone(), p));
                    }
                }
            }
            return out;
        }
        for t in topics {
            let n = self
                .config
                .topics
                .iter()
                .find(|(name, _)| *name == t)
                .map_or(0, |(_, n)| *n) as usize;
            let m = live.len();
            let (per, extra) = (n / m, n % m);
            let mut p: i32 = 0;
            for (i, &id) in live.iter().enumerate() {
                let take = per + usize::from(i < extra);
                for _ in 0..take {
                    if let Some(v) = out.get_mut(&id) {
                        v.push((t.clone(), p));
                    }
                    p += 1;
                }
            }
        }
        out
    }

    pub(super) fn task_of(&self, topic: &str, partition: i32) -> Option<&TaskSpec> {
        self.config.tasks.iter().find(|t| {
            t.inputs
                .iter()
                .any(|(tt, p)| tt == topic && *p == partition)
        })
    }

    /// A rebalance: every live member that takes part commits or aborts
    /// its open work and gives up its partitions; then the new assignment
    /// goes out. `missing` misses it (it becomes a zombie).
    pub(super) fn rebalance(&mut self, missing: Option<usize>) -> Result<(), AppFailure> {
        self.stats.rebalances += 1;
        let holding = self.holding_tasks();
        if let Some(i) = missing {
            self.members[i].zombie = true;
        }
        if self.config.assignor == Assignor::Incremental {
            self.holding_at_plan = holding;
            self.plan_reconciliation();
            return Ok(());
        }
        for i in 0..self.members.len() {
            if self.members[i].zombie {
                continue;
            }
            self.before_revoke(i)?;
            let revoked = std::mem::take(&mut self.members[i].assignment);
            self.members[i]
                .thread
                .revoke(&revoked)
                .map_err(|e| self.fail(format!("member {i}: revoke refused: {e}")))?;
            self.members[i].buffer.clear();
            self.members[i].positions.clear();
            self.members[i].paused.clear();
        }
        // The revocations ran under the old generation; the assignment is
        // the new one.
        self.generation += 1;
        let assignment = self.range_assignment();
        let mut owners = BTreeMap::new();
        for i in 0..self.members.len() {
            if self.members[i].zombie {
                continue;
            }
            let id = self.members[i].id;
            let parts = assignment.get(&id).cloned().unwrap_or_default();
            for (t, p) in &parts {
                if let Some(task) = self.task_of(t, *p) {
                    owners.insert(task.name.clone(), id);
                }
            }
            let assigned: Vec<AssignedPartition> =
                parts.iter().map(|(t, p)| self.assigned(t, *p)).collect();
            self.members[i].generation = self.generation;
            self.members[i].assignment = parts;
            let now = self.now;
            let broker = &self.broker;
            self.members[i]
                .thread
                .assign(assigned, broker, now)
                .map_err(|e| self.fail(format!("member {id}: assignment refused: {e}")))?;
            self.apply_seeks(i)?;
        }
        for (task, &owner) in &owners {
            if let Some(&old) = self.owners.get(task)
                && old != owner
            {
                self.stats.migrations += 1;
                if holding.contains(task) {
                    self.stats.migrations_while_holding += 1;
                }
            }
        }
        self.owners = owners;
        Ok(())
    }

    /// A new epoch: every live member learns it (its next commit carries
    /// it), and the moves from what each holds to the range assignment are
    /// planned, replacing any left from an earlier epoch.
    pub(super) fn plan_reconciliation(&mut self) {
        self.generation += 1;
        for m in &mut self.members {
            if !m.zombie {
                m.generation = self.generation;
            }
        }
        let target = self.range_assignment();
        self.kept_this_round.clear();
        self.target = target.clone();
        self.count_kept_while_holding();
        let mut pending = Vec::new();
        for m in &self.members {
            if m.zombie {
                continue;
            }
            let want = target.get(&m.id).cloned().unwrap_or_default();
            for p in &m.assignment {
                if !want.contains(p) {
                    pending.push(Move::Revoke(m.id, p.clone()));
                }
            }
            for p in want {
                if !m.assignment.contains(&p) {
                    pending.push(Move::Assign(m.id, p));
                }
            }
        }
        self.pending = pending;
    }

    /// Counts, once per reconciliation, each task that holds records while
    /// its member keeps every partition of it: it runs through the
    /// rebalance with its queues untouched.
    pub(super) fn count_kept_while_holding(&mut self) {
        for name in self.holding_tasks() {
            if self.kept_this_round.contains(&name) {
                continue;
            }
            let Some(task) = self.config.tasks.iter().find(|t| t.name == name) else {
                continue;
            };
            let kept = self.members.iter().any(|m| {
                !m.zombie
                    && task.inputs.iter().all(|p| {
                        m.assignment.contains(p)
                            && self.target.get(&m.id).is_some_and(|t| t.contains(p))
                    })
            });
            if kept {
                self.stats.kept_while_holding += 1;
                self.kept_this_round.insert(name);
            }
        }
    }

    /// One move of the reconciliation, chosen at random among those the
    /// protocol allows now (an assignment only once no live member holds
    /// the partition).
    pub(super) fn reconcile(&mut self) -> Result<(), AppFailure> {
        let index = |world: &AppWorld, id: usize| world.members.iter().position(|m| m.id == id);
        self.pending.retain(|m| {
            let id = match m {
                Move::Revoke(id, _) | Move::Assign(id, _) => *id,
            };
            self.members.iter().any(|x| x.id == id && !x.zombie)
        });
        let allowed: Vec<usize> = (0..self.pending.len())
            .filter(|&k| match &self.pending[k] {
                Move::Revoke(..) => true,
                Move::Assign(_, p) => !self
                    .members
                    .iter()
                    .any(|m| !m.zombie && m.assignment.contains(p)),
            })
            .collect();
        if allowed.is_empty() {
            self.pending.clear();
            return Ok(());
        }
        self.count_kept_while_holding();
        let pick = allowed[self.rng.random_range(0..allowed.len())];
        let step = self.pending.remove(pick);
        self.stats.reconcile_steps += 1;
        match step {
            Move::Revoke(id, p) => {
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                self.before_revoke(i)?;
                // The commit may have found it a zombie and replaced it.
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                if !self.members[i].assignment.contains(&p) {
                    return Ok(());
                }
                self.members[i]
                    .thread
                    .revoke(std::slice::from_ref(&p))
                    .map_err(|e| self.fail(format!("member {id}: revoke refused: {e}")))?;
                let m = &mut self.members[i];
                m.assignment.retain(|x| *x != p);
                m.buffer.retain(|f| !(f.topic == p.0 && f.partition == p.1));
                m.positions.remove(&p);
                m.paused.remove(&p);
                self.apply_seeks(i)
            }
            Move::Assign(id, p) => {
                let Some(i) = index(self, id) else {
                    return Ok(());
                };
                let assigned = self.assigned(&p.0, p.1);
                let now = self.now;
                let broker = &self.broker;
                self.members[i]
                    .thread
                    .assign(vec![assigned], broker, now)
                    .map_err(|e| self.fail(format!("member {id}: assignment refused: {e}")))?;
                self.members[i].assignment.push(p.clone());
                if let Some(task) = self.task_of(&p.0, p.1).cloned() {
                    let held = task
                        .inputs
                        .iter()
                        .filter(|x| self.members[i].assignment.contains(x))
                        .count();
                    if held < task.inputs.len() {
                        self.stats.partial_holds += 1;
                    } else {
                        if let Some(&old) = self.owners.get(&task.name)
                            && old != id
                        {
                            self.stats.migrations += 1;
                            if self.holding_at_plan.contains(&task.name) {
                                self.stats.migrations_while_holding += 1;
                            }
                        }
                        self.owners.insert(task.name.clone(), id);
                    }
                }
                self.apply_seeks(i)
            }
        }
    }

    /// A partition as an assignment hands it to a member: the group's
    /// committed position, and the broker's log start and end now.
    pub(super) fn assigned(&self, topic: &str, partition: i32) -> AssignedPartition {
        let c = self.channel(topic, partition);
        AssignedPartition {
            topic: topic.to_owned(),
            partition,
            committed: self
                .group_offsets
                .get(&(topic.to_owned(), partition))
                .copied(),
            log_start: c.map_or(0, |c| self.broker.log_start(c)),
            end: Some(c.map_or(0, |c| self.broker.last_stable(c))),
            committed_metadata: None,
        }
    }

    /// What member `i` does with its open work before a revocation.
    pub(super) fn before_revoke(&mut self, i: usize) -> Result<(), AppFailure> {
        let broker = &self.broker;
        let txn = self.members[i].thread.before_revoke(broker).map_err(|e| {
            self.fail(format!(
                "member {i}: settling before a revocation refused: {e}"
            ))
        })?;
        match txn {
            Some(txn) => self.commit(i, txn, CommitFate::Commit),
            None => Ok(()),
        }
    }

    pub(super) fn holding_tasks(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for m in &self.members {
            for (t, p, _) in m.thread.held_heads() {
                if let Some(task) = self.task_of(&t, p) {
                    out.insert(task.name.clone());
                }
            }
        }
        out
    }

    pub(super) fn apply_seeks(&mut self, i: usize) -> Result<(), AppFailure> {
        let ConsumerMoves { flow, seeks } = self.members[i].thread.take_moves(&self.broker);
        for f in flow {
            if f.paused {
                self.members[i].paused.insert((f.topic, f.partition));
            } else {
                self.members[i].paused.remove(&(f.topic, f.partition));
            }
        }
        for Seek {
            topic: t,
            partition: p,
            offset,
        } in seeks
        {
            let Some(c) = self.channel(&t, p) else {
                return Err(self.fail(format!("seek to unknown topic {t}")));
            };
            if let Some(task) = self.task_of(&t, p)
                && let Some(&actor) = self.task_actor.get(&task.name)
            {
                self.oracle.consume(actor, c, offset);
            }
            self.members[i]
                .buffer
                .retain(|f| !(f.topic == t && f.partition == p));
            self.members[i].positions.insert((t, p), offset);
        }
        Ok(())
    }
}
