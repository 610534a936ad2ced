//! [`Oracle`]: ground truth about causality, kept entirely outside the
//! protocol.
//!
//! The oracle never reads a protocol clock. It tracks real happened-before
//! between *actors* (nodes, edge producers, observers): an actor's causal
//! past is everything it has delivered or observed, its own earlier sends,
//! and transitively their pasts. Because each actor's sends are totally
//! ordered (one process), the part of a past that falls on one actor's sends
//! is always a prefix of them, so a past is exactly a vector of counts, one
//! per actor. Each record stores the past of its sender at the moment it was
//! sent.
//!
//! A node's past is staged while its step runs and either committed with the
//! step or rolled back with it, mirroring the node's transaction, so an
//! aborted step teaches the oracle nothing.
//!
//! On every delivery the oracle checks that the record was not delivered
//! before at that node, that the channel's offsets strictly increase
//! (FIFO), and that every real ancestor on a channel the node consumes, at
//! or above the node's baseline there, has already been delivered. At drain
//! it checks completeness: every committed record at or above the baseline
//! of every consumed channel was delivered.
//!
//! Two more checks judge what a node may skip and may not re-enter. A record
//! already in a node's causal past (a cause of something it delivered while
//! it did not consume that channel) must never be delivered there later:
//! that would put a cause after its effect. And when a redeploy adds an
//! input, the node may skip that channel's history only as far as the
//! *claim envelope* reaches: the over-approximation of everything a sound
//! stamp may claim, which the oracle keeps by itself from the same events a
//! protocol sees (records delivered or merely received, consumer positions,
//! and each node's sink end offsets at every start), never from a clock.
//! The baseline of a joining input is where the host's own start policy
//! would fetch, not where the protocol under test asked it to resume; every
//! record above the envelope and the baseline must be delivered.
//!
//! Deliveries are judged by coordinate only; which bytes a node hands its
//! user at a coordinate is outside the oracle's view (the protocol's
//! persistence tests pin that).

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::fmt;

use parsley_protocol::Channel;

use crate::broker::SimBroker;
use crate::trace::Trace;

/// Index of an actor (node, edge producer, observer).
pub type ActorId = usize;

/// The oracle's handle on a committed record.
pub type RecordId = usize;

/// A violated obligation, with everything needed to find it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// What went wrong, naming the node, the record and (for causal
    /// violations) the missing ancestor.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Violation {}

/// One actor's committed sends to one channel: (send index, offset, record).
type SendLog = Vec<(u32, i64, RecordId)>;

struct RecordMeta {
    channel: Channel,
    offset: i64,
    actor: ActorId,
    send_index: u32,
    /// The sender's incarnation when it sent the record.
    incarnation: u32,
    past: Vec<u32>,
    envelope: Envelope,
}

/// What a sound stamp may claim, over-approximated: a past in actor counts
/// (what was delivered *or received*, transitively) and per-channel offsets
/// that over-claims may reach (consumer positions, sink end offsets).
#[derive(Clone, Debug, Default)]
struct Envelope {
    past: Vec<u32>,
    offsets: BTreeMap<Channel, i64>,
}

impl Envelope {
    fn new(actors: usize) -> Self {
        Envelope {
            past: vec![0; actors],
            offsets: BTreeMap::new(),
        }
    }

    fn claim(&mut self, c: Channel, offset: i64) {
        let e = self.offsets.entry(c).or_insert(offset);
        *e = (*e).max(offset);
    }

    /// Folds in a record: its own envelope, and the record itself.
    fn fold(&mut self, m: &RecordMeta) {
        for (mine, theirs) in self.past.iter_mut().zip(&m.envelope.past) {
            *mine = (*mine).max(*theirs);
        }
        self.past[m.actor] = self.past[m.actor].max(m.send_index);
        for (&c, &o) in &m.envelope.offsets {
            self.claim(c, o);
        }
        self.claim(m.channel, m.offset);
    }
}

#[derive(Default)]
struct ActorState {
    name: String,
    /// Bumped at every (re)start of a node; edge producers stay at 0.
    incarnation: u32,
    past: Vec<u32>,
    staged: Option<Staged>,
    delivered: FxHashSet<RecordId>,
    last: BTreeMap<Channel, i64>,
    baselines: BTreeMap<Channel, i64>,
    consumes: Vec<Channel>,
    envelope: Envelope,
    /// Inputs that joined by a redeploy: records at or below this offset
    /// may be skipped (they were within the claim envelope at the join).
    skippable: BTreeMap<Channel, i64>,
    /// The actor's past when an operator last reset it: records within it
    /// may be delivered again (the reset reprocesses them), although they
    /// stay in the past its sends carry.
    reset_past: Vec<u32>,
}

struct Staged {
    past: Vec<u32>,
    delivered: Vec<RecordId>,
    last: BTreeMap<Channel, i64>,
    envelope: Envelope,
}

/// A send whose record is not appended yet: its sender's past at the moment
/// of sending.
#[derive(Clone, Debug)]
pub struct PendingSend {
    actor: ActorId,
    send_index: u32,
    incarnation: u32,
    past: Vec<u32>,
    envelope: Envelope,
}

/// Ground-truth causality for one simulated world.
pub struct Oracle {
    actors: Vec<ActorState>,
    records: Vec<RecordMeta>,
    by_coordinate: FxHashMap<(Channel, i64), RecordId>,
    /// Per actor, per channel: the actor's committed sends to that channel
    /// as (send index, offset, record), in send order.
    sends: Vec<BTreeMap<Channel, SendLog>>,
    names: BTreeMap<Channel, String>,
    deliveries_checked: u64,
    trace: Trace,
}

impl Oracle {
    /// An oracle for the given actors (indices are positions in the list).
    pub fn new(actor_names: &[String]) -> Self {
        let n = actor_names.len();
        Oracle {
            actors: actor_names
                .iter()
                .map(|name| ActorState {
                    name: name.clone(),
                    past: vec![0; n],
                    envelope: Envelope::new(n),
                    ..ActorState::default()
                })
                .collect(),
            records: Vec::new(),
            by_coordinate: FxHashMap::default(),
            sends: vec![BTreeMap::new(); n],
            names: BTreeMap::new(),
            deliveries_checked: 0,
            trace: Trace::new(),
        }
    }

    /// Gives a channel a readable name for messages.
    pub fn name_channel(&mut self, c: Channel, name: String) {
        self.names.insert(c, name);
    }

    fn channel_name(&self, c: Channel) -> String {
        self.names.get(&c).cloned().unwrap_or_else(|| c.to_string())
    }

    fn coordinate(&self, r: RecordId) -> String {
        let m = &self.records[r];
        format!("{}@{}", self.channel_name(m.channel), m.offset)
    }

    /// Deliveries checked so far.
    pub fn deliveries_checked(&self) -> u64 {
        self.deliveries_checked
    }

    /// The digest of every delivery checked so far, in order: node, channel
    /// and offset of each (see [`Trace`]). Deliveries of a step that later
    /// aborted count too: they reached the node's user logic.
    pub fn trace(&self) -> u64 {
        self.trace.value()
    }

    /// Starts a new incarnation of `actor` (a node's start or restart):
    /// what it sends from now on is told apart from what it sent before.
    pub fn begin_incarnation(&mut self, actor: ActorId) {
        self.actors[actor].incarnation += 1;
    }

    /// An operator reset `actor` (`parsley reset`) while it was down: it
    /// reads its inputs again from new positions, so what it delivered is
    /// forgotten (its inputs get new baselines through
    /// [`consume`](Self::consume)) and anything already in its past may be
    /// delivered once more. Its past itself stays: what it sends after the
    /// reset comes after everything it sent before, and so after their
    /// causes, which its stamps must go on claiming.
    pub fn reset(&mut self, actor: ActorId) {
        let a = &mut self.actors[actor];
        assert!(a.staged.is_none(), "oracle: reset inside a step");
        a.delivered.clear();
        a.last.clear();
        a.baselines.clear();
        a.skippable.clear();
        a.reset_past = a.past.clone();
    }

    /// The actor's name.
    pub fn actor_name(&self, a: ActorId) -> &str {
        &self.actors[a].name
    }

    /// Declares that `actor` consumes `channel` from now on, with the given
    /// baseline (its consumer's first position there). A baseline is set
    /// once; later calls keep the first.
    pub fn consume(&mut self, actor: ActorId, channel: Channel, baseline: i64) {
        let a = &mut self.actors[actor];
        a.baselines.entry(channel).or_insert(baseline);
        if !a.consumes.contains(&channel) {
            a.consumes.push(channel);
            a.consumes.sort();
        }
    }

    /// Declares that `actor` starts consuming `channel` because a redeploy
    /// added it, fetching from `baseline` by the host's own start policy.
    /// Records on the channel up to the claim envelope (everything the
    /// actor's committed past may claim there) may be skipped; the rest
    /// above the baseline must be delivered, after their causes.
    pub fn consume_joining(&mut self, actor: ActorId, channel: Channel, baseline: i64) {
        let reach = self.envelope_reach(actor, channel);
        let a = &mut self.actors[actor];
        a.baselines.insert(channel, baseline);
        match reach {
            Some(r) => a.skippable.insert(channel, r),
            None => a.skippable.remove(&channel),
        };
        if !a.consumes.contains(&channel) {
            a.consumes.push(channel);
            a.consumes.sort();
        }
    }

    /// The highest offset on `channel` the actor's committed claim envelope
    /// reaches: its offset bounds, and the latest send to the channel of
    /// every actor inside its envelope past.
    fn envelope_reach(&self, actor: ActorId, channel: Channel) -> Option<i64> {
        let env = &self.actors[actor].envelope;
        let mut reach = env.offsets.get(&channel).copied();
        for (x, &count) in env.past.iter().enumerate() {
            let Some(list) = self.sends[x].get(&channel) else {
                continue;
            };
            let i = list.partition_point(|&(idx, _, _)| idx <= count);
            if i > 0 {
                let offset = list[i - 1].1;
                reach = Some(reach.map_or(offset, |r| r.max(offset)));
            }
        }
        reach
    }

    /// Extends an actor's claim envelope with a sink's end offset at one of
    /// its starts (own outputs over-claim everything appended there).
    pub fn own_output(&mut self, actor: ActorId, channel: Channel, end: i64) {
        if end > 0 {
            self.actors[actor].envelope.claim(channel, end - 1);
        }
    }

    /// A record fetched inside the actor's step, delivered or not: what it
    /// claims may reach the actor's stamps from now on.
    pub fn receive(&mut self, actor: ActorId, record: RecordId) {
        let m = &self.records[record];
        let staged = self.actors[actor]
            .staged
            .as_mut()
            .expect("oracle: receive outside a step");
        staged.envelope.fold(m);
    }

    /// A consumer position reported inside the actor's step: the frontier
    /// (and so a stamp) may reach one below it.
    pub fn position(&mut self, actor: ActorId, channel: Channel, position: i64) {
        let staged = self.actors[actor]
            .staged
            .as_mut()
            .expect("oracle: position outside a step");
        staged.envelope.claim(channel, position - 1);
    }

    /// Declares that `actor` no longer consumes `channel` (a scope shrink).
    pub fn stop_consuming(&mut self, actor: ActorId, channel: Channel) {
        self.actors[actor].consumes.retain(|c| *c != channel);
    }

    /// The baseline of an actor on a channel, if it ever consumed it.
    pub fn baseline(&self, actor: ActorId, channel: Channel) -> Option<i64> {
        self.actors[actor].baselines.get(&channel).copied()
    }

    /// Starts a step (a transaction) of `actor`.
    pub fn begin(&mut self, actor: ActorId) {
        let a = &mut self.actors[actor];
        assert!(a.staged.is_none(), "oracle: nested step for {}", a.name);
        a.staged = Some(Staged {
            past: a.past.clone(),
            delivered: Vec::new(),
            last: BTreeMap::new(),
            envelope: a.envelope.clone(),
        });
    }

    /// The record at a coordinate, if one was committed there.
    pub fn record_at(&self, c: Channel, offset: i64) -> Option<RecordId> {
        self.by_coordinate.get(&(c, offset)).copied()
    }

    /// Checks and records a delivery of `record` at `actor` inside its
    /// current step.
    pub fn deliver(&mut self, actor: ActorId, record: RecordId) -> Result<(), Violation> {
        self.deliveries_checked += 1;
        let m = &self.records[record];
        self.trace.delivery(actor, m.channel, m.offset);
        let a = &self.actors[actor];
        let staged = a.staged.as_ref().expect("oracle: delivery outside a step");
        let what = || format!("node {} delivering {}", a.name, self.coordinate(record));
        if a.delivered.contains(&record) || staged.delivered.contains(&record) {
            return Err(Violation {
                message: format!("{}: duplicate delivery", what()),
            });
        }
        let last = staged
            .last
            .get(&m.channel)
            .or_else(|| a.last.get(&m.channel))
            .copied();
        // Re-entry: a record already in this node's causal past (it is a
        // cause of something delivered here while its channel was not
        // consumed) can only come after its effect now.
        let reprocessed = a
            .reset_past
            .get(m.actor)
            .is_some_and(|&r| m.send_index <= r);
        if m.actor != actor && staged.past[m.actor] >= m.send_index && !reprocessed {
            return Err(Violation {
                message: format!(
                    "{}: causal order violated, that record (sent by {}) is already in the node's causal past, so a cause would follow its effect",
                    what(),
                    self.actors[m.actor].name
                ),
            });
        }
        if let Some(last) = last
            && m.offset <= last
        {
            return Err(Violation {
                message: format!(
                    "{}: FIFO violated, offset {} already delivered on that channel",
                    what(),
                    last
                ),
            });
        }
        // Causal order: for every actor X and consumed channel c, the
        // latest of X's sends to c inside m's past must be delivered here
        // (FIFO and completeness cover the earlier ones).
        for (x, &count) in m.past.iter().enumerate() {
            if count == 0 {
                continue;
            }
            for &c in &a.consumes {
                let Some(list) = self.sends[x].get(&c) else {
                    continue;
                };
                let i = list.partition_point(|&(idx, _, _)| idx <= count);
                if i == 0 {
                    continue;
                }
                let (_, offset, ancestor) = list[i - 1];
                let baseline = a.baselines.get(&c).copied().unwrap_or(0);
                if offset < baseline {
                    continue;
                }
                // Skippable on a joined input: if it was skipped, fine; if it
                // is delivered later, the re-entry check above catches it.
                if a.skippable.get(&c).is_some_and(|&r| offset <= r) {
                    continue;
                }
                if !a.delivered.contains(&ancestor) && !staged.delivered.contains(&ancestor) {
                    return Err(Violation {
                        message: format!(
                            "{}: causal order violated, its ancestor {} (sent by {}) has not been delivered there",
                            what(),
                            self.coordinate(ancestor),
                            self.actors[x].name
                        ),
                    });
                }
            }
        }
        let (channel, offset, sender, send_index) = (m.channel, m.offset, m.actor, m.send_index);
        let past = m.past.clone();
        let staged = self.actors[actor].staged.as_mut().expect("checked above");
        staged.envelope.fold(&self.records[record]);
        for (mine, theirs) in staged.past.iter_mut().zip(&past) {
            *mine = (*mine).max(*theirs);
        }
        staged.past[sender] = staged.past[sender].max(send_index);
        staged.delivered.push(record);
        staged.last.insert(channel, offset);
        Ok(())
    }

    /// Folds a consumed record into an observer's past without judging it
    /// (plain consumers have no gate).
    pub fn observe(&mut self, actor: ActorId, record: RecordId) {
        let m = &self.records[record];
        let (sender, send_index) = (m.actor, m.send_index);
        let past = m.past.clone();
        let staged = self.actors[actor]
            .staged
            .as_mut()
            .expect("oracle: observation outside a step");
        staged.envelope.fold(m);
        for (mine, theirs) in staged.past.iter_mut().zip(&past) {
            *mine = (*mine).max(*theirs);
        }
        staged.past[sender] = staged.past[sender].max(send_index);
    }

    /// Takes a send inside the current step: snapshots the sender's past.
    pub fn emit(&mut self, actor: ActorId) -> PendingSend {
        let incarnation = self.actors[actor].incarnation;
        let staged = self.actors[actor]
            .staged
            .as_mut()
            .expect("oracle: send outside a step");
        let past = staged.past.clone();
        staged.past[actor] += 1;
        let mut envelope = staged.envelope.clone();
        for (e, p) in envelope.past.iter_mut().zip(&past) {
            *e = (*e).max(*p);
        }
        staged.envelope.past[actor] = staged.past[actor];
        PendingSend {
            actor,
            send_index: staged.past[actor],
            incarnation,
            past,
            envelope,
        }
    }

    /// Registers the record a pending send became, once it has its offset.
    pub fn register(&mut self, send: PendingSend, channel: Channel, offset: i64) -> RecordId {
        let id = self.records.len();
        self.sends[send.actor]
            .entry(channel)
            .or_default()
            .push((send.send_index, offset, id));
        self.records.push(RecordMeta {
            channel,
            offset,
            actor: send.actor,
            send_index: send.send_index,
            incarnation: send.incarnation,
            past: send.past,
            envelope: send.envelope,
        });
        self.by_coordinate.insert((channel, offset), id);
        id
    }

    /// The oracle id a pending send will get when registered next (so the
    /// host can put it in the record before appending).
    pub fn next_record_id(&self) -> RecordId {
        self.records.len()
    }

    /// Commits the actor's step.
    pub fn commit(&mut self, actor: ActorId) {
        let a = &mut self.actors[actor];
        let staged = a.staged.take().expect("oracle: commit outside a step");
        a.past = staged.past;
        a.envelope = staged.envelope;
        a.delivered.extend(staged.delivered);
        a.last.extend(staged.last);
    }

    /// Rolls the actor's step back: it never happened.
    pub fn rollback(&mut self, actor: ActorId) {
        self.actors[actor].staged = None;
    }

    /// Records delivered (committed) at an actor.
    pub fn delivered_count(&self, actor: ActorId) -> usize {
        self.actors[actor].delivered.len()
    }

    /// Whether `actor` has delivered `record` (committed, or in its open
    /// step).
    pub fn is_delivered(&self, actor: ActorId, record: RecordId) -> bool {
        let a = &self.actors[actor];
        a.delivered.contains(&record)
            || a.staged
                .as_ref()
                .is_some_and(|s| s.delivered.contains(&record))
    }

    /// For a record `actor` holds: whether what it waits for, in ground
    /// truth, is only its own sender's sends from an earlier incarnation.
    /// That is, at least one real ancestor on another channel `actor`
    /// consumes (at or above the baseline there) is not delivered yet, and
    /// every such ancestor was sent by the record's sender before the
    /// restart that began the record's incarnation. Ancestors on the
    /// record's own channel are left out: FIFO orders those, not a claim.
    ///
    /// Such a hold can only be resolved by the claim a restarted node makes
    /// on its own earlier outputs (the end-offset seed), which is what the
    /// restart scenario needs to see happen.
    pub fn waits_only_on_prior_incarnation(&self, actor: ActorId, record: RecordId) -> bool {
        let m = &self.records[record];
        let a = &self.actors[actor];
        let mut waits = false;
        for (x, &count) in m.past.iter().enumerate() {
            if count == 0 {
                continue;
            }
            for &c in &a.consumes {
                if c == m.channel {
                    continue;
                }
                let Some(list) = self.sends[x].get(&c) else {
                    continue;
                };
                let i = list.partition_point(|&(idx, _, _)| idx <= count);
                if i == 0 {
                    continue;
                }
                // The latest such send decides: if it is delivered, so is
                // everything before it on that channel; if it is from an
                // earlier incarnation, so is everything before it.
                let (_, offset, ancestor) = list[i - 1];
                if offset < a.baselines.get(&c).copied().unwrap_or(0)
                    || self.is_delivered(actor, ancestor)
                {
                    continue;
                }
                if x != m.actor || self.records[ancestor].incarnation >= m.incarnation {
                    return false;
                }
                waits = true;
            }
        }
        waits
    }

    /// Completeness at drain: every committed record at or above the
    /// baseline of every channel each actor consumes was delivered there.
    pub fn check_complete(&self, broker: &SimBroker) -> Result<(), Violation> {
        for a in &self.actors {
            assert!(a.staged.is_none(), "oracle: drain with an open step");
            for &c in &a.consumes {
                let baseline = a.baselines.get(&c).copied().unwrap_or(0);
                let skippable = a.skippable.get(&c).copied().unwrap_or(-1);
                let missing: Vec<RecordId> = broker
                    .committed_records(c, baseline)
                    .into_iter()
                    .filter(|&(offset, _)| offset > skippable)
                    .map(|(_, id)| id)
                    .filter(|id| !a.delivered.contains(id))
                    .collect();
                if let Some(&first) = missing.first() {
                    return Err(Violation {
                        message: format!(
                            "node {}: incomplete at drain, {} record(s) on {} never delivered, first {}",
                            a.name,
                            missing.len(),
                            self.channel_name(c),
                            self.coordinate(first)
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
