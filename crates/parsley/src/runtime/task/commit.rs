//! The commit: what a task hands its host, what it does once the host
//! committed, and its stores across a reset.

use super::*;

impl Task {
    /// Takes everything this transaction produced: the records to append
    /// and the changelog records of both stores. The host appends them and
    /// commits them with the consumed positions, atomically, then reports
    /// the outcome: [`commit_done`](Self::commit_done) once committed, or
    /// [`reset`](Self::reset) after an abort.
    pub fn take_commit(&mut self) -> Result<TaskCommit, TaskError> {
        if self.poisoned {
            return Err(TaskError::Poisoned {
                task: self.id.clone(),
            });
        }
        if self.in_flight.is_some() {
            return Err(TaskError::InFlight {
                task: self.id.clone(),
            });
        }
        self.ticks.handed_over();
        self.holds.handed_over();
        let protocol = self.node.take_writes();
        let mut fold = std::mem::take(&mut self.pending_fold);
        // One allocation per value from here on, shared by the changelog
        // record, the committed store and the local store's entry.
        fold.share();
        let mut changelog = Vec::with_capacity(protocol.len() + fold.len());
        let names = self.app.owned_names(&self.id.stage);
        if !protocol.is_empty() {
            let Some(topic) =
                names.map(|n| std::sync::Arc::<str>::from(n.state_changelog.as_str()))
            else {
                return Err(TaskError::Config {
                    task: self.id.clone(),
                    message: "the stage has no state changelog name".to_owned(),
                });
            };
            for (key, value) in protocol.iter() {
                changelog.push(self.changelog_record(
                    &topic,
                    key.text().as_bytes().into(),
                    value.map(RecordBytes::from),
                ));
            }
        }
        if !fold.is_empty() {
            let Some(topic) =
                names.and_then(|n| n.fold_changelog.as_deref().map(std::sync::Arc::<str>::from))
            else {
                return Err(TaskError::Config {
                    task: self.id.clone(),
                    message: "fold state written by a stage without a fold store".to_owned(),
                });
            };
            for (key, value) in fold.iter_shared() {
                changelog.push(self.changelog_record(&topic, key, value));
            }
        }
        self.in_flight = Some(InFlight { protocol, fold });
        self.acted = false;
        // The next transaction's list starts with room for about as many
        // records as this one took (up to a bound), so that it does not
        // grow again from nothing, copying every record at each doubling.
        let room = self.outgoing.len().min(KEPT_OUTGOING_ROOM);
        self.stamps.release();
        Ok(TaskCommit {
            records: std::mem::replace(&mut self.outgoing, Vec::with_capacity(room)),
            changelog,
            events: std::mem::take(&mut self.events),
        })
    }

    fn changelog_record(
        &self,
        topic: &std::sync::Arc<str>,
        key: RecordBytes,
        value: Option<RecordBytes>,
    ) -> OutgoingRecord {
        OutgoingRecord {
            topic: std::sync::Arc::clone(topic),
            partition: self.id.partition,
            key: Some(key),
            value,
            timestamp: self.wall_clock,
            stamp: None,
            headers: Vec::new(),
            origin: None,
        }
    }

    /// Moves the records emitted since they were last taken into `out`,
    /// for a host that produces them into its open transaction as they are
    /// made (they are that transaction's: its commit or abort decides
    /// them). Returns how many there were. The task's list keeps its room.
    pub fn take_emitted_into(&mut self, out: &mut Vec<OutgoingRecord>) -> usize {
        let n = self.outgoing.len();
        out.append(&mut self.outgoing);
        n
    }

    /// What the task did since this was last taken (or the last commit),
    /// taken: a host that streams records takes them with the records, so
    /// that the transaction lists them in the order its records went out.
    pub fn take_events(&mut self) -> Vec<TaskEvent> {
        std::mem::take(&mut self.events)
    }

    /// The records emitted since the last commit, taken without committing
    /// anything (an abort: a host that streams records into its open
    /// transaction has produced them, and they end up aborted).
    pub fn take_abandoned(&mut self) -> Vec<OutgoingRecord> {
        self.stamps.release();
        std::mem::take(&mut self.outgoing)
    }

    /// The transaction taken last was committed: its writes join the
    /// committed stores.
    pub fn commit_done(&mut self) {
        self.commit_done_into(None);
    }

    /// As [`commit_done`](Self::commit_done), also listing the committed
    /// writes in `out` (for a local store): puts and deletes of both
    /// stores, protocol store first, each in key order.
    pub fn commit_done_into(
        &mut self,
        mut out: Option<&mut Vec<crate::runtime::local::LocalEntry>>,
    ) {
        use crate::runtime::local::StoreKind;
        if let Some(done) = self.in_flight.take() {
            if let Some(out) = out.as_deref_mut() {
                // Sized once: a transaction's worth of entries (thousands)
                // would otherwise be copied at every doubling.
                out.reserve(done.protocol.len() + done.fold.len());
                for (key, value) in done.protocol.iter() {
                    out.push((
                        StoreKind::Protocol,
                        key.text().as_bytes().into(),
                        value.map(RecordBytes::from),
                    ));
                }
            }
            self.stores.held.committed(&done.protocol);
            self.stores.protocol.apply_owned(done.protocol);
            self.stores.fold.apply(&done.fold);
            // The committed store shares what it keeps with the writes: the
            // local store's entries take the writes themselves.
            if let Some(out) = out {
                out.extend(
                    done.fold
                        .into_entries()
                        .map(|(key, value)| (StoreKind::Fold, key, value)),
                );
            }
            self.ticks.committed();
        }
    }

    /// Whether the task has anything for the next transaction.
    pub fn has_work(&self) -> bool {
        // Every event stands for work one of these already shows: a
        // delivery or a hold sets `acted`, a send fills `outgoing`.
        !self.outgoing.is_empty() || self.acted || !self.pending_fold.is_empty()
    }

    /// Lets the committed entries the local store now holds leave memory:
    /// fold entries over the cache's budget (see [`FoldStore::evict`]) and
    /// held records (see [`HeldPages`](crate::runtime::paging::HeldPages)).
    pub fn evict_local(&mut self) {
        self.stores.fold.evict();
        let TaskStores { held, protocol, .. } = &mut self.stores;
        held.evict(protocol);
    }

    /// Gives the committed fold store a new cache budget (see
    /// [`FoldStore::set_budget`]).
    pub fn set_fold_budget(&mut self, budget: usize) {
        self.stores.fold.set_budget(budget);
    }

    /// The committed stores (what an abort returns to).
    pub fn stores(&self) -> &TaskStores {
        &self.stores
    }

    /// Rebuilds the task from its committed stores, dropping everything not
    /// committed (an abort): a new node restored from the committed protocol
    /// store, the committed fold state, and the tick schedule as of the last
    /// commit (a tick the aborted transaction carried falls due again).
    /// Nothing is copied: the stores move into the new task.
    pub fn reset(
        self,
        metadata: &dyn TopicMetadata,
        broker: &dyn BrokerOffsets,
        now_ms: i64,
    ) -> Result<Task, TaskError> {
        let window = self.node.resident_window();
        let Task {
            app,
            id,
            stores,
            ticks,
            record_events,
            holds,
            ..
        } = self;
        let mut task = Task::init(
            &app,
            &id.stage,
            id.partition,
            stores,
            metadata,
            broker,
            now_ms,
        )?;
        task.record_events = record_events;
        task.set_hold_budget(holds.budget());
        task.set_hold_window(window);
        // A tick of the aborted transaction is due again: resume the
        // schedule as it was committed, not a fresh one from now.
        task.ticks = ticks.resumed(task.ticks);
        Ok(task)
    }

    /// Gives up the task, keeping only its committed stores.
    pub fn into_stores(self) -> TaskStores {
        self.stores
    }

    /// The truncation sweep: drops stamp-side claims below each claimed
    /// channel's log start. A failed lookup changes nothing and is returned
    /// for the host to count and skip; it never poisons the task.
    pub fn sweep(&mut self, broker: &dyn BrokerOffsets) -> Result<TruncationReport, ProtocolError> {
        self.node.truncate_to_log_starts(broker)
    }

    /// The state bytes in a fold slot, as this task sees them (including
    /// writes not yet committed).
    pub fn fold_state(&self, slot: &FoldKey) -> Option<Cow<'_, [u8]>> {
        self.fold_get(&slot.to_bytes())
    }

    pub(super) fn fold_get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        if let Some(v) = self.pending_fold.get(key) {
            return v.map(Cow::Borrowed);
        }
        if let Some(v) = self.in_flight.as_ref().and_then(|f| f.fold.get(key)) {
            return v.map(Cow::Borrowed);
        }
        self.stores.fold.get_bytes(key)
    }
}
