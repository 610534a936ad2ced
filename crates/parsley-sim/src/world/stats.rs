//! What a world counts: [`WorldStats`], the evidence that a scenario
//! reached the states it targets.

/// What a world did: the counts the anti-vacuity floors are built on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorldStats {
    /// Scheduler steps taken.
    pub steps: u64,
    /// Deliveries checked by the oracle.
    pub deliveries: u64,
    /// Deliveries of records that had waited in a hold queue.
    pub released_from_hold: u64,
    /// Records appended by nodes (committed or aborted).
    pub sends: u64,
    /// Crashes injected (idle, mid-step and mid-start).
    pub crashes: u64,
    /// Of those, crashes inside a transaction (a step or a start).
    pub mid_step_crashes: u64,
    /// Crashes inside a restart, right after init.
    pub crashes_after_init: u64,
    /// Crashes inside a restart, after init's own releases went through
    /// user logic.
    pub crashes_after_init_releases: u64,
    /// Crashes inside a restart, after the starting positions were
    /// reported.
    pub crashes_after_start_positions: u64,
    /// Crashes inside a fetch step.
    pub crashes_in_fetch: u64,
    /// Of those, fetches on a channel other than the node's first fetchable
    /// one.
    pub crashes_in_fetch_not_first: u64,
    /// Crashes inside a position-advance step.
    pub crashes_in_advance: u64,
    /// Crashes inside a tick step.
    pub crashes_in_tick: u64,
    /// Crashes inside a truncation-sweep step.
    pub crashes_in_sweep: u64,
    /// Crashes that cut a step or start short before a send its user logic
    /// still had to make.
    pub crashes_cutting_sends: u64,
    /// Crashes of a node that was holding records at the time.
    pub crashes_while_holding: u64,
    /// Restarts.
    pub restarts: u64,
    /// Position advances reported.
    pub position_advances: u64,
    /// Ticks emitted.
    pub ticks: u64,
    /// Edge-producer operations.
    pub edge_ops: u64,
    /// Log-start advances.
    pub retention_moves: u64,
    /// Truncation sweeps run.
    pub sweeps: u64,
    /// Stamp-side entries those sweeps removed.
    pub truncated_entries: u64,
    /// The most records any node held at once.
    pub max_held: u64,
    /// Held records restored by restarts (the hold-queue restore path).
    pub restored_held: u64,
    /// Replays the protocol dropped at or below a frontier.
    pub replays_skipped: u64,
    /// Records on joined inputs skipped as already in the node's past.
    pub past_skipped: u64,
    /// Inputs added by redeploys.
    pub joined_inputs: u64,
    /// Operator resets applied.
    pub resets: u64,
    /// Skip marks those resets wrote for records below a reset position.
    pub reset_skip_marks: u64,
    /// Of those, inputs the protocol resumed past a seed.
    pub seeded_inputs: u64,
    /// Inputs removed by redeploys.
    pub left_inputs: u64,
    /// Redeploys refused because a departing input held records.
    pub refused_shrinks: u64,
    /// Deliveries of records claiming a node's own pre-join sends on a
    /// channel that joined its inputs.
    pub own_past_claims_delivered: u64,
    /// Restarts whose rescope removed at least one sink.
    pub sink_drops: u64,
    /// Fetches of a record at the offset right after the one the node
    /// fetched before on that channel (no marker between them).
    pub adjacent_fetches: u64,
    /// Of those, fetches where both records carried sender tags (both were
    /// written by node steps).
    pub adjacent_tagged_fetches: u64,
    /// Committed node steps that appended two or more records to one
    /// partition.
    pub steps_with_adjacent_sends: u64,
    /// Releases of held records that sat on, or carried a sequence claim
    /// on, a channel written by two or more tagged senders.
    pub multi_sender_holds: u64,
    /// Records held that, in ground truth, waited only for their own
    /// sender's sends from an earlier incarnation.
    pub holds_on_prior_incarnation: u64,
}

impl WorldStats {
    /// Adds another world's counts (for per-scenario totals).
    pub fn add(&mut self, o: &WorldStats) {
        self.steps += o.steps;
        self.deliveries += o.deliveries;
        self.released_from_hold += o.released_from_hold;
        self.sends += o.sends;
        self.crashes += o.crashes;
        self.mid_step_crashes += o.mid_step_crashes;
        self.crashes_after_init += o.crashes_after_init;
        self.crashes_after_init_releases += o.crashes_after_init_releases;
        self.crashes_after_start_positions += o.crashes_after_start_positions;
        self.crashes_in_fetch += o.crashes_in_fetch;
        self.crashes_in_fetch_not_first += o.crashes_in_fetch_not_first;
        self.crashes_in_advance += o.crashes_in_advance;
        self.crashes_in_tick += o.crashes_in_tick;
        self.crashes_in_sweep += o.crashes_in_sweep;
        self.crashes_cutting_sends += o.crashes_cutting_sends;
        self.crashes_while_holding += o.crashes_while_holding;
        self.restarts += o.restarts;
        self.position_advances += o.position_advances;
        self.ticks += o.ticks;
        self.edge_ops += o.edge_ops;
        self.retention_moves += o.retention_moves;
        self.sweeps += o.sweeps;
        self.truncated_entries += o.truncated_entries;
        self.max_held = self.max_held.max(o.max_held);
        self.restored_held += o.restored_held;
        self.replays_skipped += o.replays_skipped;
        self.past_skipped += o.past_skipped;
        self.joined_inputs += o.joined_inputs;
        self.resets += o.resets;
        self.reset_skip_marks += o.reset_skip_marks;
        self.seeded_inputs += o.seeded_inputs;
        self.left_inputs += o.left_inputs;
        self.refused_shrinks += o.refused_shrinks;
        self.own_past_claims_delivered += o.own_past_claims_delivered;
        self.sink_drops += o.sink_drops;
        self.adjacent_fetches += o.adjacent_fetches;
        self.adjacent_tagged_fetches += o.adjacent_tagged_fetches;
        self.steps_with_adjacent_sends += o.steps_with_adjacent_sends;
        self.multi_sender_holds += o.multi_sender_holds;
        self.holds_on_prior_incarnation += o.holds_on_prior_incarnation;
    }
}
