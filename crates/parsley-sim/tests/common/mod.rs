//! Running a scenario over many seeds, and anti-vacuity floors counted in
//! seeds.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::Instant;

use parsley_protocol::{CausalNode, DeliveryProtocol};
use parsley_sim::{SimWorld, WorldConfig, WorldFailure, WorldStats};

/// Seeds per scenario: 100, or `PARSLEY_SIM_SEEDS` for a deeper run.
pub static SEEDS: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
    std::env::var("PARSLEY_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 100)
        .unwrap_or(100)
});

/// The minimum share of seeds in which a targeted state must have occurred:
/// 20 of every 100.
pub fn seed_floor() -> usize {
    (*SEEDS / 5) as usize
}

pub struct Summary {
    pub name: &'static str,
    pub per_seed: Vec<WorldStats>,
    pub totals: WorldStats,
    pub seconds: f64,
}

impl Summary {
    /// Seeds in which `pred` held.
    pub fn seeds_where(&self, pred: impl Fn(&WorldStats) -> bool) -> usize {
        self.per_seed.iter().filter(|s| pred(s)).count()
    }

    // ANCHOR: floor
    /// Asserts that at least `seed_floor()` seeds reached a state.
    pub fn floor(&self, what: &str, pred: impl Fn(&WorldStats) -> bool) -> &Self {
        let n = self.seeds_where(pred);
        assert!(
            n >= seed_floor(),
            "{}: only {n} of {} seeds had {what} (floor {}); the scenario is vacuous",
            self.name,
            self.per_seed.len(),
            seed_floor()
        );
        eprintln!("{}: {what} in {n}/{} seeds", self.name, self.per_seed.len());
        self
    }
    // ANCHOR_END: floor
}

/// Runs `build(seed)` for every seed with the real protocol; any failure
/// fails the test with the seed in the message. `drive` runs the world (the
/// default is `world.run()`); phased scenarios pass their own.
pub fn sweep_with<P: DeliveryProtocol>(
    name: &'static str,
    build: impl Fn(u64) -> WorldConfig,
    drive: impl Fn(&mut SimWorld<P>) -> Result<(), WorldFailure>,
) -> Summary {
    let start = Instant::now();
    let mut per_seed = Vec::new();
    let mut totals = WorldStats::default();
    for seed in 0..*SEEDS {
        let mut world =
            SimWorld::<P>::new(build(seed), seed).unwrap_or_else(|f| panic!("{name}: {f}"));
        drive(&mut world).unwrap_or_else(|f| panic!("{name}: {f}"));
        let stats = world.stats();
        totals.add(&stats);
        per_seed.push(stats);
    }
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "{name}: {} seeds, {} steps ({:.0} steps/s), {} deliveries checked, {} released from hold, \
         {} crashes ({} mid-step, {} while holding), {} restarts, {} position advances, {} ticks, \
         {} edge ops, {} retention moves, {} sweeps removing {} entries, max held {}, {} held records restored",
        *SEEDS,
        totals.steps,
        totals.steps as f64 / seconds.max(1e-9),
        totals.deliveries,
        totals.released_from_hold,
        totals.crashes,
        totals.mid_step_crashes,
        totals.crashes_while_holding,
        totals.restarts,
        totals.position_advances,
        totals.ticks,
        totals.edge_ops,
        totals.retention_moves,
        totals.sweeps,
        totals.truncated_entries,
        totals.max_held,
        totals.restored_held,
    );
    eprintln!(
        "{name}: crash points: {} after init, {} after init releases, {} after start positions, \
         {} in fetches ({} not on the first channel), {} in advances, {} in ticks, {} in sweeps, \
         {} cutting sends; {} sink drops, {} adjacent fetches ({} of node-written records), \
         {} steps with adjacent sends, {} multi-sender holds, {} holds on prior-incarnation sends",
        totals.crashes_after_init,
        totals.crashes_after_init_releases,
        totals.crashes_after_start_positions,
        totals.crashes_in_fetch,
        totals.crashes_in_fetch_not_first,
        totals.crashes_in_advance,
        totals.crashes_in_tick,
        totals.crashes_in_sweep,
        totals.crashes_cutting_sends,
        totals.sink_drops,
        totals.adjacent_fetches,
        totals.adjacent_tagged_fetches,
        totals.steps_with_adjacent_sends,
        totals.multi_sender_holds,
        totals.holds_on_prior_incarnation,
    );
    Summary {
        name,
        per_seed,
        totals,
        seconds,
    }
}

/// `sweep_with` for the real protocol and a plain run to drain.
pub fn sweep(name: &'static str, build: impl Fn(u64) -> WorldConfig) -> Summary {
    sweep_with::<CausalNode>(name, build, |w| w.run().map(|_| ()))
}

/// Runs every seed and returns how each ended, without failing: for the
/// self-tests, which expect failures.
pub fn outcomes<P: DeliveryProtocol>(
    build: impl Fn(u64) -> WorldConfig,
    drive: impl Fn(&mut SimWorld<P>) -> Result<(), WorldFailure>,
) -> Vec<Result<WorldStats, WorldFailure>> {
    (0..*SEEDS)
        .map(|seed| {
            let mut world = SimWorld::<P>::new(build(seed), seed)?;
            drive(&mut world)?;
            Ok(world.stats())
        })
        .collect()
}

/// How many of `results` failed with a message containing `needle`.
pub fn failures(results: &[Result<WorldStats, WorldFailure>], needle: &str) -> usize {
    results
        .iter()
        .filter(|r| matches!(r, Err(f) if f.message.contains(needle)))
        .count()
}

/// For the self-tests: asserts that at least `seed_floor()` of `results`
/// failed with a message containing `needle` (a broken host or protocol
/// the oracle must catch, and catch as what it is).
pub fn assert_flagged(what: &str, results: &[Result<WorldStats, WorldFailure>], needle: &str) {
    let caught = failures(results, needle);
    eprintln!("{what}: flagged in {caught}/{} seeds", *SEEDS);
    assert!(
        caught >= seed_floor(),
        "{what} was flagged in only {caught} seeds"
    );
}

pub fn held_some(s: &WorldStats) -> bool {
    s.released_from_hold > 0
}

pub fn crashed(s: &WorldStats) -> bool {
    s.crashes > 0
}

pub fn crashed_while_holding(s: &WorldStats) -> bool {
    s.crashes_while_holding > 0
}

pub fn advanced(s: &WorldStats) -> bool {
    s.position_advances > 0
}

pub fn restored_held(s: &WorldStats) -> bool {
    s.restored_held > 0
}

pub fn truncated(s: &WorldStats) -> bool {
    s.truncated_entries > 0
}
