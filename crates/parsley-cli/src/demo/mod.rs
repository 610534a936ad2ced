//! `parsley demo`: the guarantee at work, with and without Parsley.
//!
//! The workload: a checkout application turns every order into a payment
//! (see [`pipeline`]); a ledger application consumes both `orders` and
//! `payments` and settles each payment against its order. The ledger's
//! orders feed lags, so payments routinely arrive first.
//!
//! The same arrival schedule runs twice through the ledger:
//!
//! * **gated**: the records arrive as they are on the wire, stamps and all,
//!   and Parsley's gate decides when the ledger's logic sees each one;
//! * **plain**: the same records, without their stamps, reach the logic in
//!   arrival order, as with any consumer that does not order by causality.
//!
//! An independent [`checker`] that knows only the workload's causality
//! (a payment is caused by its order) counts the payments the ledger's logic
//! saw before their order. Both runs use the broker-less
//! [`TestDriver`] as their host. [`cluster`] runs the same applications
//! through the exactly-once runtime on a live cluster, judged by the same
//! checker.

pub mod checker;
pub mod cluster;
pub mod pipeline;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use parsley::protocol::headers::is_causal_header;
use parsley::{Coordinate, TestDriver};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use checker::{Event, Verdict};

/// Partitions of `orders` and `payments` (co-partitioned by order id).
pub const PARTITIONS: i32 = 3;

/// Demo failures (a driver or build error).
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemoConfig {
    /// Orders in the workload (each is paid once, so the ledger receives
    /// twice as many records).
    pub orders: u32,
    /// The seed of the amounts and the arrival schedule.
    pub seed: u64,
}

/// One record reaching the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Simulated milliseconds since the start.
    pub at_ms: i64,
    /// Where the record sits in the upstream log.
    pub coordinate: Coordinate,
    /// What the record is.
    pub event: Event,
}

/// The workload: the upstream log, produced by the real checkout
/// application, and the order in which its records reach the ledger.
pub struct Workload {
    /// The checkout application's committed log.
    pub upstream: TestDriver,
    /// Every order and payment, in arrival order at the ledger.
    pub arrivals: Vec<Arrival>,
}

impl Workload {
    /// Runs the checkout application over `orders` orders and draws the
    /// arrival schedule: order `n` is placed at `10n` ms; its payment is
    /// ready 2-30 ms later and reaches the ledger within 20 ms of that; the
    /// order itself reaches the ledger up to 90 ms after it was placed. A
    /// partition never overtakes itself.
    pub fn generate(config: DemoConfig) -> Result<Workload, DemoError> {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut upstream = TestDriver::builder(&pipeline::checkout()?)
            .partitions("orders", PARTITIONS)
            .partitions("payments", PARTITIONS)
            .build()?;
        let orders = pipeline::orders();
        let mut arrivals = Vec::with_capacity(2 * config.orders as usize);
        let mut placed = BTreeMap::new();
        for n in 0..config.orders {
            let amount = rng.random_range(100..=50_000i64);
            let at = upstream.pipe(&orders, order_id(n), amount)?;
            let placed_at = 10 * i64::from(n);
            placed.insert(order_id(n), (n, placed_at));
            arrivals.push(Arrival {
                at_ms: placed_at + rng.random_range(0..=90),
                coordinate: at,
                event: Event::Order(n),
            });
        }
        for payment in upstream.records(&pipeline::payments())? {
            let Some(&(n, placed_at)) = payment.key.as_ref().and_then(|k| placed.get(k)) else {
                return Err(format!("payment {} names no order", payment.coordinate).into());
            };
            arrivals.push(Arrival {
                at_ms: placed_at + rng.random_range(2..=30) + rng.random_range(0..=20),
                coordinate: payment.coordinate,
                event: Event::Payment(n),
            });
        }
        // A partition is delivered in offset order: nothing arrives before
        // an earlier record of its own partition.
        let mut by_partition: BTreeMap<(String, i32), Vec<usize>> = BTreeMap::new();
        for (i, a) in arrivals.iter().enumerate() {
            by_partition
                .entry((a.coordinate.topic.clone(), a.coordinate.partition))
                .or_default()
                .push(i);
        }
        for indices in by_partition.values_mut() {
            indices.sort_by_key(|&i| arrivals[i].coordinate.offset);
            let mut floor = 0;
            for &i in indices.iter() {
                floor = arrivals[i].at_ms.max(floor);
                arrivals[i].at_ms = floor;
            }
        }
        arrivals.sort_by(|a, b| {
            (
                a.at_ms,
                &a.coordinate.topic,
                a.coordinate.partition,
                a.coordinate.offset,
            )
                .cmp(&(
                    b.at_ms,
                    &b.coordinate.topic,
                    b.coordinate.partition,
                    b.coordinate.offset,
                ))
        });
        Ok(Workload { upstream, arrivals })
    }
}

/// The order id of order number `n`.
pub fn order_id(n: u32) -> String {
    format!("order-{n:06}")
}

/// How the ledger receives the upstream records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// As they are on the wire, through Parsley's gate.
    Gated,
    /// Without their stamps: the logic sees them in arrival order.
    Plain,
}

/// What the ledger's logic received, and when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Every record delivered to the logic, in order, with the simulated
    /// time it arrived and the time it was delivered.
    pub delivered: Vec<(Event, i64, i64)>,
    /// Settlements the ledger rejected (payment for an unknown order).
    pub rejected: usize,
}

/// A place the ledger application runs: the broker-less driver here, a
/// cluster later. It receives the arrivals in order and reports what the
/// ledger's logic saw.
pub trait LedgerHost {
    /// Runs the ledger over the workload's arrivals; `progress` is called
    /// once per arrival.
    fn run(
        &mut self,
        workload: &Workload,
        mode: Mode,
        progress: &dyn Fn(),
    ) -> Result<Observed, DemoError>;
}

/// Runs the ledger in a [`TestDriver`].
#[derive(Debug, Default)]
pub struct DriverHost;

impl LedgerHost for DriverHost {
    fn run(
        &mut self,
        workload: &Workload,
        mode: Mode,
        progress: &dyn Fn(),
    ) -> Result<Observed, DemoError> {
        let mut ledger = TestDriver::builder(&pipeline::ledger()?)
            .partitions("orders", PARTITIONS)
            .partitions("payments", PARTITIONS)
            .build()?;
        let mut raw: BTreeMap<Coordinate, parsley::RawRecord> = BTreeMap::new();
        for topic in ["orders", "payments"] {
            for r in workload.upstream.raw_records(topic)? {
                raw.insert(r.coordinate.clone(), r);
            }
        }
        // What each ledger coordinate is, and when it arrived.
        let mut events: BTreeMap<Coordinate, (Event, i64)> = BTreeMap::new();
        let mut observed = Observed::default();
        let mut seen = 0;
        for arrival in &workload.arrivals {
            let now = ledger.wall_clock();
            if arrival.at_ms > now {
                let by = Duration::from_millis(u64::try_from(arrival.at_ms - now).unwrap_or(0));
                ledger.advance_wall_clock(by)?;
            }
            let c = &arrival.coordinate;
            let landed = match mode {
                Mode::Gated => {
                    // Byte for byte, markers included: the stamps keep naming
                    // the right records.
                    ledger.append_from(&workload.upstream, &c.topic, c.partition, c.offset)?;
                    c.clone()
                }
                Mode::Plain => {
                    let r = raw
                        .get(c)
                        .ok_or_else(|| format!("no upstream record at {c}"))?;
                    let headers = r
                        .headers
                        .iter()
                        .filter(|h| !is_causal_header(&h.name))
                        .cloned()
                        .collect();
                    ledger.append_raw(
                        &c.topic,
                        c.partition,
                        r.key.clone(),
                        r.value.clone(),
                        r.timestamp,
                        headers,
                    )?
                }
            };
            events.insert(landed, (arrival.event, arrival.at_ms));
            ledger.run()?;
            // Only what was delivered since the previous arrival.
            let all = ledger.deliveries();
            for d in all[seen..].iter().filter(|d| d.task.stage == "settlement") {
                let &(event, arrived) = events.get(&d.coordinate).ok_or_else(|| {
                    format!("the ledger delivered {}, which never arrived", d.coordinate)
                })?;
                observed
                    .delivered
                    .push((event, arrived, ledger.wall_clock()));
            }
            seen = all.len();
            progress();
        }
        observed.rejected = ledger
            .values(&pipeline::settlements())?
            .iter()
            .filter(|v| *v == pipeline::REJECTED)
            .count();
        Ok(observed)
    }
}

/// One run's figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// Records the ledger's logic received.
    pub delivered: usize,
    /// Records that waited after arriving (at least one arrival later).
    pub held: usize,
    /// The longest wait, in simulated milliseconds.
    pub longest_hold_ms: i64,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Payments the ledger rejected.
    pub rejected: usize,
}

impl RunReport {
    fn from(observed: &Observed) -> RunReport {
        let received: Vec<Event> = observed.delivered.iter().map(|(e, _, _)| *e).collect();
        RunReport {
            delivered: observed.delivered.len(),
            held: observed.delivered.iter().filter(|(_, a, d)| d > a).count(),
            longest_hold_ms: observed
                .delivered
                .iter()
                .map(|(_, a, d)| d - a)
                .max()
                .unwrap_or(0),
            verdict: checker::check(&received),
            rejected: observed.rejected,
        }
    }
}

/// Where a demo ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    /// In the broker-less driver, over a drawn arrival schedule (times in
    /// simulated milliseconds).
    Driver,
    /// On a live cluster, through the exactly-once runtime (times in real
    /// milliseconds).
    Cluster {
        /// Bootstrap servers of the cluster.
        bootstrap: String,
    },
}

/// Both runs over one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoReport {
    /// What ran.
    pub config: DemoConfig,
    /// Where it ran.
    pub setting: Setting,
    /// Payments that reached the ledger before their order.
    pub overtaken: usize,
    /// Through Parsley's gate.
    pub gated: RunReport,
    /// In arrival order.
    pub plain: RunReport,
}

/// Generates the workload and runs it through `host` both ways.
pub fn run(
    config: DemoConfig,
    host: &mut dyn LedgerHost,
    progress: &dyn Fn(),
) -> Result<DemoReport, DemoError> {
    let workload = Workload::generate(config)?;
    let arrived: Vec<Event> = workload.arrivals.iter().map(|a| a.event).collect();
    let overtaken = checker::check(&arrived).violations;
    let gated = RunReport::from(&host.run(&workload, Mode::Gated, progress)?);
    let plain = RunReport::from(&host.run(&workload, Mode::Plain, progress)?);
    Ok(DemoReport {
        config,
        setting: Setting::Driver,
        overtaken,
        gated,
        plain,
    })
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let records = 2 * self.config.orders;
        match &self.setting {
            Setting::Driver => writeln!(
                f,
                "A ledger settles {} payments against their orders; its orders feed lags, so {} payments reached it before their order.",
                self.config.orders, self.overtaken
            )?,
            Setting::Cluster { bootstrap } => writeln!(
                f,
                "On {bootstrap}, a ledger catching up on a backlog settles {} payments against their orders; its consumer's fetches brought {} payments before their order.",
                self.config.orders, self.overtaken
            )?,
        }
        writeln!(f)?;
        let line = |f: &mut fmt::Formatter<'_>, name: &str, r: &RunReport| {
            writeln!(
                f,
                "{name:<32} {:>6} of {records} records delivered, {:>5} held (longest hold {} ms), {:>5} causal violations, {:>5} payments rejected",
                r.delivered, r.held, r.longest_hold_ms, r.verdict.violations, r.rejected
            )
        };
        line(f, "with Parsley (causal gate):", &self.gated)?;
        line(f, "without Parsley (arrival order):", &self.plain)?;
        if let Some((effect, cause)) = self.plain.verdict.first {
            writeln!(f)?;
            writeln!(
                f,
                "For example, without Parsley the ledger processed {effect} before {cause}."
            )?;
        }
        writeln!(f)?;
        let sentence = match (self.gated.verdict.violations, self.plain.verdict.violations) {
            (0, 0) => "Neither run had a causal violation: no payment happened to overtake its order with this seed; try more records.".to_owned(),
            (0, n) => format!(
                "Parsley processed every payment after its order (0 causal violations) by holding {} records until their cause arrived, while arrival order processed {n} payments before their order.",
                self.gated.held
            ),
            (g, _) => format!(
                "Parsley's run had {g} causal violations: that is a bug, please report it with seed {}.",
                self.config.seed
            ),
        };
        writeln!(f, "{sentence}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo(orders: u32, seed: u64) -> DemoReport {
        run(DemoConfig { orders, seed }, &mut DriverHost, &|| {}).unwrap()
    }

    #[test]
    fn gated_has_no_violations_and_plain_has_some_on_every_seed() {
        for seed in 0..40 {
            let r = demo(60, seed);
            assert_eq!(r.gated.verdict.violations, 0, "seed {seed}: {r}");
            assert!(r.plain.verdict.violations > 0, "seed {seed}: {r}");
            // The race really happened, and the gate really held records.
            assert!(r.overtaken > 0 && r.gated.held > 0, "seed {seed}: {r}");
            // Everything was delivered both ways.
            assert_eq!((r.gated.delivered, r.plain.delivered), (120, 120));
            // The checker and the ledger's own outcome agree.
            assert_eq!(r.plain.rejected, r.plain.verdict.violations, "seed {seed}");
            assert_eq!(r.gated.rejected, 0);
        }
    }

    #[test]
    fn a_seed_reproduces_its_run() {
        assert_eq!(demo(50, 7), demo(50, 7));
        assert_ne!(demo(50, 7), demo(50, 8));
    }

    #[test]
    fn the_report_names_violations_on_each_count_line() {
        let text = demo(30, 3).to_string();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("violations")).collect();
        assert!(lines.len() >= 2, "{text}");
        assert!(lines[0].contains(" 0 causal violations"), "{text}");
    }
}
