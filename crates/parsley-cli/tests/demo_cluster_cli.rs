//! `parsley demo --bootstrap` against a live broker (`PARSLEY_BOOTSTRAP`):
//! both applications run through the exactly-once runtime, the race really
//! happens on the cluster, the gated ledger has no violation, and the run
//! cleans up after itself unless asked to keep its topics.

mod common;

use std::time::Duration;

use common::{bootstrap, config, parsley};
use parsley_kafka::KafkaCluster;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The counts on a report line: (delivered, held, violations, rejected).
fn counts(line: &str) -> (u64, u64, u64, u64) {
    let number_before = |marker: &str| -> u64 {
        let head = line
            .split(marker)
            .next()
            .unwrap_or_else(|| panic!("{marker:?} in {line}"));
        head.rsplit([',', ' ', ':'])
            .find(|w| !w.is_empty())
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("a number before {marker:?} in {line}"))
    };
    (
        number_before(" of "),
        number_before(" held"),
        number_before(" causal violations"),
        number_before(" payments rejected"),
    )
}

fn report_line<'a>(out: &'a str, start: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no {start:?} line in {out}"))
}

/// The run's topic prefix, from its progress lines.
fn prefix(out: &str) -> String {
    let at = out.find("parsley-demo-").expect("a run prefix");
    let rest = &out[at..];
    let end = rest.find("orders").expect("the orders topic");
    rest[..end].to_owned()
}

fn topics_with(prefix: &str) -> Vec<String> {
    let consumer: BaseConsumer = config().create().unwrap();
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(20))
        .unwrap();
    metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn on_a_cluster_the_gated_ledger_has_no_violation_while_the_plain_one_has_many() {
    let (ok, out) = parsley(&[
        "demo",
        "--bootstrap",
        &bootstrap(),
        "--records",
        "1000",
        "--seed",
        "11",
        "--keep-topics",
    ]);
    assert!(ok, "{out}");
    let gated = counts(report_line(&out, "with Parsley"));
    let plain = counts(report_line(&out, "without Parsley"));
    // Everything was delivered both ways.
    assert_eq!((gated.0, plain.0), (1000, 1000), "{out}");
    // The race happened on the cluster: the plain ledger processed payments
    // before their order, and rejected exactly those.
    assert!(plain.2 > 0, "no payment overtook its order: {out}");
    assert_eq!(plain.3, plain.2, "{out}");
    // The gate held records and let nothing through early.
    assert!(gated.1 > 0, "the gated run held nothing: {out}");
    assert_eq!((gated.2, gated.3), (0, 0), "{out}");
    assert!(out.contains("0 causal violations"), "{out}");

    // Kept: the settlements the gated ledger committed, one per payment,
    // all settled.
    let prefix = prefix(&out);
    let settlements = format!("{prefix}settlements");
    let (ok, lines) = parsley(&[
        "inspect",
        "--bootstrap",
        &bootstrap(),
        "--topic",
        &settlements,
        "--from-beginning",
        "--count",
        "1000",
    ]);
    assert!(ok, "{lines}");
    assert_eq!(
        lines.lines().filter(|l| l.contains(&settlements)).count(),
        500,
        "{lines}"
    );
    // Clean up what this test kept.
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let kept = topics_with(&prefix);
    assert!(kept.len() >= 3, "{kept:?}");
    let kept: Vec<&str> = kept.iter().map(String::as_str).collect();
    futures_executor::block_on(
        cluster
            .admin()
            .delete_topics(&kept, &rdkafka::admin::AdminOptions::new()),
    )
    .unwrap();
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn the_cluster_demo_deletes_its_topics_at_the_end() {
    let (ok, out) = parsley(&[
        "demo",
        "--bootstrap",
        &bootstrap(),
        "--records",
        "200",
        "--seed",
        "5",
    ]);
    assert!(ok, "{out}");
    assert_eq!(counts(report_line(&out, "with Parsley")).2, 0, "{out}");
    let prefix = prefix(&out);
    // The runtime made its own topics too (changelogs, control, diagnostics).
    let mut left = topics_with(&prefix);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        left = topics_with(&prefix);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}
