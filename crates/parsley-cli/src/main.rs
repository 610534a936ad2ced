//! `parsley`: command-line tools for Parsley.
//!
//! ```text
//! parsley demo [--records N] [--seed S]   # the guarantee, with and without Parsley
//! parsley demo --bootstrap B              # the same, on a cluster through the runtime
//! parsley clock decode [HEX]              # vc header bytes (hex) -> one line of JSON
//! parsley clock encode                    # that JSON on stdin -> canonical hex
//! parsley inspect --bootstrap B --topic T # a live topic's records and their claims
//! parsley holds --bootstrap B --app APP    # what a running application holds, and why
//! parsley probe --bootstrap B --app FILE   # the cluster contract probes, before a start
//! parsley reset --bootstrap B --app FILE   # reprocess from the start (plan; --execute applies)
//! parsley skip --bootstrap B --app APP --stage S --topic T --partition P --offset O --dead-letter D
//!                                          # step a stopped application past one record
//! ```
//!
//! Failures exit non-zero with one line on stderr and nothing on stdout.
#![deny(unsafe_code)]

mod clock;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Tools for Parsley, causal delivery order for Kafka.
#[derive(Parser)]
#[command(name = "parsley", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The demo's applications, for `parsley describe`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Example {
    /// The ledger: settles payments against the orders they pay.
    Ledger,
    /// The checkout: charges each order.
    Checkout,
}

/// How a command reaches the cluster.
#[derive(clap::Args, Clone)]
struct ClusterArgs {
    /// Bootstrap servers of the cluster.
    #[arg(long)]
    bootstrap: String,
    /// A file of client properties (librdkafka's names, key=value lines),
    /// as Kafka's tools take one: SASL and TLS settings for a secured
    /// cluster.
    #[arg(long, value_name = "FILE")]
    command_config: Option<std::path::PathBuf>,
    /// A client property (librdkafka's name), applied after the file's;
    /// repeat for more.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    property: Vec<String>,
}

impl ClusterArgs {
    fn connection(&self) -> Result<parsley_cli::connect::Connection, String> {
        parsley_cli::connect::Connection::from_args(
            &self.bootstrap,
            self.command_config.as_deref(),
            &self.property,
        )
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a causal pipeline twice, through Parsley's gate and in plain
    /// arrival order, and count the causal violations of each.
    #[command(after_help = DEMO_HELP)]
    Demo {
        /// Records the ledger receives (half orders, half payments).
        #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u32).range(20..=2_000_000))]
        records: u32,
        /// Seed of the workload; a random one when absent. The run is
        /// reproducible from the seed it prints.
        #[arg(long)]
        seed: Option<u64>,
        /// Run on this cluster, through the exactly-once runtime, instead
        /// of the built-in broker-less host.
        #[arg(long)]
        bootstrap: Option<String>,
        /// On a cluster: keep the run's topics and consumer groups
        /// (parsley-demo-<millis>-<nonce>-*) instead of deleting them at the end.
        #[arg(long, requires = "bootstrap")]
        keep_topics: bool,
        /// On a cluster: a file of client properties (librdkafka's names,
        /// key=value lines), for a secured cluster.
        #[arg(long, value_name = "FILE", requires = "bootstrap")]
        command_config: Option<std::path::PathBuf>,
        /// On a cluster: a client property (librdkafka's name), applied
        /// after the file's; repeat for more.
        #[arg(short = 'X', value_name = "KEY=VALUE", requires = "bootstrap")]
        property: Vec<String>,
    },
    /// Inspect and build `vc` clock header values.
    #[command(subcommand)]
    Clock(ClockCommand),
    /// Print a live topic's records as a read_committed consumer sees them:
    /// each record's coordinate, sender and sequence, and its clock's
    /// claims with topic names.
    #[command(after_help = INSPECT_HELP)]
    Inspect {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The topic to read.
        #[arg(long)]
        topic: String,
        /// Only this partition.
        #[arg(long)]
        partition: Option<i32>,
        /// Start at each partition's log start (default: the last COUNT
        /// records of each partition).
        #[arg(long, conflicts_with = "offset")]
        from_beginning: bool,
        /// Start at this offset (needs --partition).
        #[arg(long, requires = "partition")]
        offset: Option<i64>,
        /// Records at most.
        #[arg(long, default_value_t = 20)]
        count: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a cluster against an application (described in a JSON file)
    /// before it starts: every topic exists, each stage's sources agree on
    /// partition count, tick topics are as wide as their widest source.
    #[command(after_help = PROBE_HELP)]
    Probe {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The application file (JSON).
        #[arg(long)]
        app: String,
    },
    /// Step a stopped application's task past one record (a poison record
    /// its logic cannot handle): the task sends it to a dead-letter topic
    /// instead of delivering it, when the application next starts.
    #[command(after_help = SKIP_HELP)]
    Skip {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The application id.
        #[arg(long)]
        app: String,
        /// The stage consuming the record.
        #[arg(long)]
        stage: String,
        /// The record's topic.
        #[arg(long)]
        topic: String,
        /// Its partition.
        #[arg(long)]
        partition: i32,
        /// Its offset.
        #[arg(long)]
        offset: i64,
        /// The topic it goes to instead (it must exist).
        #[arg(long)]
        dead_letter: String,
        /// Why, for the dead letter's parsley.dlq.error header.
        #[arg(long, default_value = "stepped past by an operator (parsley skip)")]
        reason: String,
    },
    /// Reset a stopped application so that it reprocesses its sources:
    /// the group's positions, each task's protocol state (send sequences
    /// and the delivered past kept) and fold state, and the control topic.
    /// Prints the plan; changes nothing without --execute.
    #[command(after_help = RESET_HELP)]
    Reset {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The application file (JSON): `parsley describe --json` or
        /// `Topology::to_json` output, or the small file `parsley probe`
        /// reads.
        #[arg(long)]
        app: String,
        /// Read the sources again from the first record at or after this
        /// time (RFC 3339, as 2026-12-01T00:00:00Z, or milliseconds since
        /// the epoch) instead of from their start.
        #[arg(long, conflicts_with = "to_offset")]
        to_time: Option<String>,
        /// Read every source partition again from this offset instead of
        /// from its start.
        #[arg(long)]
        to_offset: Option<i64>,
        /// Apply the plan.
        #[arg(long)]
        execute: bool,
        /// Also remove the application's local state under this state
        /// directory (the root given as StreamsOptions::state_dir) on this
        /// host. Not needed: a local state file replays the reset.
        #[arg(long)]
        wipe_state_dir: Option<std::path::PathBuf>,
    },
    /// Describe an application's topology: each stage's sources, sinks,
    /// ticks and state under the names the runtime uses, the internal
    /// topics, and which topics must be co-partitioned. Describes the
    /// demo's applications; in your own program, print
    /// `parsley_kafka::topology(&app)` (or its `to_json()`).
    #[command(after_help = DESCRIBE_HELP)]
    Describe {
        /// Which application.
        #[arg(value_enum, default_value_t = Example::Ledger)]
        example: Example,
        /// JSON for tools instead of text (`parsley probe --app` reads it).
        #[arg(long)]
        json: bool,
    },
    /// Show what a running application's tasks hold and why, from any
    /// machine that reaches the cluster.
    #[command(after_help = HOLDS_HELP)]
    Holds {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The application id.
        #[arg(long)]
        app: String,
    },
}

const PROBE_HELP: &str = "\
The application file names the application id and, per stage, its sources,
sinks, whether it keeps state and its tick interval:

  {\"application_id\": \"payments-app\", \"stages\": [
    {\"name\": \"settlement\", \"sources\": [\"orders\", \"payments\"],
     \"sinks\": [\"settlements\"], \"stateful\": true, \"ticks_ms\": 60000}]}

Every finding is printed with the clause it checks; the exit status is
non-zero when there is one. Read-only: nothing is created or changed.

Example:
  parsley probe --bootstrap localhost:9092 --app payments-app.json";

const RESET_HELP: &str = "\
After a logic bug, say: stop every instance, run this, deploy the fix and
start again. Each source partition is read again from its start (or the
time or offset given); topics the application writes itself and tick
topics from their end. Each task's fold state is emptied and its protocol
state reset, keeping its send sequences and the causal past it delivered,
so stages downstream that keep running stay ordered (deleting the
changelogs by hand would break that). Everything is written by appending,
so it can be run again: a second run writes nothing.

Refused, with nothing changed, while any instance of the application runs,
when a source topic is missing, or when a task's state does not decode.

Example:
  parsley describe ledger --json > ledger.json
  parsley reset --bootstrap localhost:9092 --app ledger.json
  parsley reset --bootstrap localhost:9092 --app ledger.json --execute";

const SKIP_HELP: &str = "\
For a record that fails its task every time (a logic error, a codec error,
corrupt causal headers): stop every instance of the application, run this,
start it again. The step is written to the task's state changelog, so the
task reads it when it restores; it then sends that record, bytes and
headers unchanged, to the dead-letter topic with parsley.dlq.* headers, and
goes on as if the record had never been written. The record is never
delivered, so what depended on it loses its causal order with it.

Refused, with nothing written, when the application's consumer group has
members, when a topic is missing, when the record is already consumed or
not in the log, or when the task's recorded state does not consume it.

Example:
  parsley skip --bootstrap localhost:9092 --app payments-app --stage ledger \\
    --topic payments --partition 3 --offset 8810 --dead-letter payments-dead";

const DESCRIBE_HELP: &str = "\
The description is what the application declares, with the names the
Kafka runtime derives from the application id: changelogs, tick topics,
and the control and diagnostics topics. A stage's sources and its tick
topic must have the same number of partitions (one task per partition
number); `parsley probe --app FILE` checks that, and that every topic
exists, against a cluster, and reads the JSON this command writes.

Examples:
  parsley describe
  parsley describe checkout --json > checkout.json
  parsley probe --bootstrap localhost:9092 --app checkout.json";

const HOLDS_HELP: &str = "\
Each stream thread of a running application publishes what its tasks hold
to the application's diagnostics topic (<APP>-diagnostics) when it changes
and every few seconds while it holds anything; this command reads the
latest report of every thread, longest-held first. A held record is never
fixed by skipping it: the line names the cause to deliver.

Example:
  parsley holds --bootstrap localhost:9092 --app payments-app";

const INSPECT_HELP: &str = "\
A record whose causal headers are corrupt is reported with its coordinate
(and the command exits non-zero), never skipped. Unstamped records say so:
they claim nothing.

Examples:
  parsley inspect --bootstrap localhost:9092 --topic payments
  parsley inspect --bootstrap localhost:9092 --topic payments --partition 3 --offset 8810 --count 5 --json";

const DEMO_HELP: &str = "\
A checkout service turns orders into payments; a ledger settles each payment
against its order, but its orders feed lags, so payments often arrive first.
The demo runs the same arrivals through Parsley's causal gate and in plain
arrival order, and an independent checker counts payments processed before
their order.

With --bootstrap, both applications run on that cluster through the
exactly-once runtime, under fresh topics named parsley-demo-<millis>-<nonce>-*: the
orders are written one per request, the checkout application pays them in
transactions, and the ledger catches up on the backlog with small fetches,
so its consumer receives payments ahead of their orders. The ledger runs once
through Parsley and once as a plain consumer; the same checker judges both.

Examples:
  parsley demo
  parsley demo --records 20000 --seed 7
  parsley demo --bootstrap localhost:9092 --records 2000";

#[derive(Subcommand)]
enum ClockCommand {
    /// Decode the hex of a `vc` header value into one line of JSON.
    #[command(after_help = "Example:\n  parsley clock decode 010000000000000000")]
    Decode {
        /// The hex bytes; read from stdin when absent.
        hex: Option<String>,
    },
    /// Read the JSON form of a clock on stdin and print its canonical hex.
    #[command(
        after_help = "Example:\n  echo '{\"version\":1,\"offsets\":[],\"sequences\":[]}' | parsley clock encode"
    )]
    Encode,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            records,
            seed,
            bootstrap: None,
            ..
        } => return demo(records, seed),
        Command::Demo {
            records,
            seed,
            bootstrap: Some(bootstrap),
            keep_topics,
            command_config,
            property,
        } => {
            let cluster = ClusterArgs {
                bootstrap,
                command_config,
                property,
            };
            match cluster.connection() {
                Ok(c) => return cluster_demo(records, seed, c, keep_topics),
                Err(e) => Err(e),
            }
        }
        Command::Clock(ClockCommand::Decode { hex }) => clock::decode(hex),
        Command::Clock(ClockCommand::Encode) => clock::encode(),
        Command::Probe { cluster, app } => match cluster.connection() {
            Ok(c) => return probe(&c, &app),
            Err(e) => Err(e),
        },
        Command::Skip {
            cluster,
            app,
            stage,
            topic,
            partition,
            offset,
            dead_letter,
            reason,
        } => cluster.connection().and_then(|cluster| {
            parsley_cli::skip::run(&parsley_cli::skip::Skip {
                cluster,
                app,
                stage,
                topic,
                partition,
                offset,
                dead_letter,
                reason,
            })
        }),
        Command::Reset {
            cluster,
            app,
            to_time,
            to_offset,
            execute,
            wipe_state_dir,
        } => cluster
            .connection()
            .and_then(|cluster| reset(cluster, &app, to_time, to_offset, execute, wipe_state_dir)),
        Command::Describe { example, json } => return describe(example, json),
        Command::Holds { cluster, app } => cluster
            .connection()
            .and_then(|c| parsley_cli::holds::run(&c, &app).map(|lines| lines.join("\n"))),
        Command::Inspect {
            cluster,
            topic,
            partition,
            from_beginning,
            offset,
            count,
            json,
        } => {
            let cluster = match cluster.connection() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            return inspect(parsley_cli::inspect::Inspect {
                cluster,
                topic,
                partition,
                start: match (from_beginning, offset) {
                    (true, _) => parsley_cli::inspect::Start::Beginning,
                    (false, Some(o)) => parsley_cli::inspect::Start::Offset(o),
                    (false, None) => parsley_cli::inspect::Start::Tail,
                },
                count,
                json,
            });
        }
    };
    match result {
        Ok(line) => {
            // The whole answer is built before anything is printed, so a
            // failure never leaves partial output behind.
            let mut out = std::io::stdout().lock();
            match writeln!(out, "{line}").and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn demo(records: u32, seed: Option<u64>) -> ExitCode {
    use parsley_cli::demo::{self, DemoConfig, DriverHost};
    let seed = seed.unwrap_or_else(random_seed);
    let config = DemoConfig {
        orders: records / 2,
        seed,
    };
    println!(
        "Parsley demo: {} records, seed {seed} (parsley demo --records {records} --seed {seed} repeats this run)",
        2 * config.orders
    );
    println!();
    // Two runs, one step per arrival each. Only long runs draw a bar (and
    // only on a terminal).
    let bar = if records >= 20_000 {
        indicatif::ProgressBar::new(2 * u64::from(2 * config.orders))
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} arrivals ({eta} left)")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let result = demo::run(config, &mut DriverHost, &|| bar.inc(1));
    bar.finish_and_clear();
    report_demo(result, "the demo could not run")
}

/// Prints a demo's report; fails when the gated run had a violation (a
/// bug) or the demo could not run.
fn report_demo(
    result: Result<parsley_cli::demo::DemoReport, parsley_cli::demo::DemoError>,
    failed: &str,
) -> ExitCode {
    match result {
        Ok(report) => {
            print!("{report}");
            if report.gated.verdict.violations > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {failed}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cluster_demo(
    records: u32,
    seed: Option<u64>,
    cluster: parsley_cli::connect::Connection,
    keep_topics: bool,
) -> ExitCode {
    use parsley_cli::demo::DemoConfig;
    use parsley_cli::demo::cluster::{self, ClusterDemo, HoldWatch};
    use tracing_subscriber::layer::SubscriberExt;
    let seed = seed.unwrap_or_else(random_seed);
    let demo = ClusterDemo {
        cluster,
        config: DemoConfig {
            orders: records / 2,
            seed,
        },
        keep_topics,
    };
    // The stream threads log from their own threads: the watch that counts
    // holds must be the process's subscriber.
    let watch = HoldWatch::default();
    if tracing::subscriber::set_global_default(tracing_subscriber::registry().with(watch.clone()))
        .is_err()
    {
        eprintln!("error: a tracing subscriber is already installed");
        return ExitCode::FAILURE;
    }
    println!(
        "Parsley demo on {}: {} records, seed {seed} (the seed draws the amounts; the arrival order is the cluster's)",
        demo.cluster.bootstrap,
        2 * demo.config.orders
    );
    println!();
    report_demo(
        cluster::run(&demo, &watch, &|phase| eprintln!("... {phase}")),
        &format!("the demo could not run on {}", demo.cluster.bootstrap),
    )
}

fn describe(example: Example, json: bool) -> ExitCode {
    use parsley_cli::demo::pipeline;
    let app = match example {
        Example::Ledger => pipeline::ledger(),
        Example::Checkout => pipeline::checkout(),
    };
    match app {
        Ok(app) => {
            let topology = parsley_kafka::topology(&app);
            if json {
                println!("{}", topology.to_json());
            } else {
                print!("{topology}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn reset(
    cluster: parsley_cli::connect::Connection,
    app_file: &str,
    to_time: Option<String>,
    to_offset: Option<i64>,
    execute: bool,
    wipe_state_dir: Option<std::path::PathBuf>,
) -> Result<String, String> {
    use parsley_cli::reset::{Reset, ResetTo};
    let text =
        std::fs::read_to_string(app_file).map_err(|e| format!("cannot read {app_file}: {e}"))?;
    let app = parsley_cli::probe::application(&text)?;
    let to = match (to_time, to_offset) {
        (Some(t), _) => ResetTo::Time(parsley_cli::reset::parse_time(&t)?),
        (None, Some(o)) => ResetTo::Offset(o),
        (None, None) => ResetTo::Earliest,
    };
    parsley_cli::reset::run(&Reset {
        cluster,
        topology: parsley_kafka::topology(&app),
        to,
        execute,
        wipe_state_dir,
    })
}

fn probe(cluster: &parsley_cli::connect::Connection, app: &str) -> ExitCode {
    match parsley_cli::probe::run(cluster, app) {
        Ok(report) => {
            print!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn inspect(args: parsley_cli::inspect::Inspect) -> ExitCode {
    match parsley_cli::inspect::run(&args) {
        Ok(report) => {
            let mut out = std::io::stdout().lock();
            for line in &report.lines {
                if writeln!(out, "{line}").is_err() {
                    return ExitCode::FAILURE;
                }
            }
            if report.corrupt > 0 {
                eprintln!(
                    "error: {} record(s) with corrupt causal headers",
                    report.corrupt
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) % 1_000_000
}
