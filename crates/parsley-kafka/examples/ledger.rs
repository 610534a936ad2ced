//! A small ledger application on a Kafka cluster: each order is recorded
//! in fold state and echoed, and each payment settles against its order
//! (or is rejected when its order is unknown).
//!
//! ```text
//! cargo run -p parsley-kafka --example ledger -- BOOTSTRAP APP_ID ORDERS PAYMENTS SETTLED [INSTANCE_ID]
//! ```
//!
//! It prints `running` once its stream thread is up, and closes gracefully
//! (committing its open transaction and leaving the group) when its
//! standard input ends. The broker tests run it as a child process to kill
//! it mid-stream. `LEDGER_LOG=info` (or `debug`) writes the runtime's log
//! to standard error.

use std::io::Read;
use std::time::Duration;

use parsley::{Codec, Message, Parsley, Stage, Step, Topic};
use parsley_kafka::{CausalStreams, StreamsOptions};
use rdkafka::ClientConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(level) = std::env::var_os("LEDGER_LOG") {
        let level = if level == "debug" {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        };
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (bootstrap, app_id, orders, payments, settled, instance) = match args.as_slice() {
        [b, a, o, p, s] => (b, a, o, p, s, None),
        [b, a, o, p, s, i] => (b, a, o, p, s, Some(i.clone())),
        _ => {
            eprintln!("usage: ledger BOOTSTRAP APP_ID ORDERS PAYMENTS SETTLED [INSTANCE_ID]");
            std::process::exit(2);
        }
    };
    let topic = |name: &str| Topic::new(name, Codec::utf8(), Codec::utf8());
    let (orders, payments, settled): (Topic<String, String>, _, _) =
        (topic(orders), topic(payments), topic(settled));
    let (s1, s2) = (settled.clone(), settled.clone());
    let ledger = Stage::named("ledger")
        .state(Codec::utf8(), String::new)
        .fold(&orders, move |_: String, m: &Message<String, String>| {
            let order = m.value().cloned().unwrap_or_default();
            Step::to(order.clone()).emit(s1.send(m.key().cloned(), format!("order {order}")))
        })
        .fold(
            &payments,
            move |order: String, m: &Message<String, String>| {
                let verdict = if order.is_empty() {
                    "rejected"
                } else {
                    "settled"
                };
                Step::to(order.clone())
                    .emit(s2.send(m.key().cloned(), format!("{verdict} {order}")))
            },
        )
        .sink(&settled)
        .build()?;
    let app = Parsley::named(app_id.as_str(), [ledger])?;

    // ANCHOR: streams_config
    let mut config = ClientConfig::new();
    // How soon a crashed or frozen instance leaves the group is the
    // broker's group.consumer.session.timeout.ms under the consumer group
    // protocol (the test broker sets 6 s).
    config.set("bootstrap.servers", bootstrap);
    let mut streams = CausalStreams::new(&app, config)?.with_options(StreamsOptions {
        commit_interval: Duration::from_millis(50),
        instance_id: instance,
        ..StreamsOptions::default()
    });
    // ANCHOR_END: streams_config
    // ANCHOR: streams_lifecycle
    streams.start()?;
    streams.wait_until_running(Duration::from_secs(60))?;
    println!("running");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    streams.close(Duration::from_secs(60))?;
    println!("closed after {} rejoin(s)", streams.rejoins());
    // ANCHOR_END: streams_lifecycle
    Ok(())
}
