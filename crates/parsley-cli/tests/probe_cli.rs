//! `parsley probe` against a live broker (`PARSLEY_BOOTSTRAP`): a broken
//! topic set fails with every finding named; the repaired one passes.

mod common;

use std::time::Duration;

use common::{bootstrap, create, parsley, unique};
use parsley_kafka::KafkaCluster;
use rdkafka::ClientConfig;

fn probe(file: &std::path::Path) -> (bool, String) {
    parsley(&[
        "probe",
        "--bootstrap",
        &bootstrap(),
        "--app",
        &file.to_string_lossy(),
    ])
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn probe_reports_a_broken_deployment_and_passes_a_sound_one() {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    let cluster = KafkaCluster::new(&config, Duration::from_secs(20)).unwrap();
    let (customers, orders, enriched, app) = (
        unique("customers"),
        unique("orders"),
        unique("enriched"),
        unique("app"),
    );
    create(&cluster, &[(&customers, 4), (&orders, 2)]);
    let file = std::env::temp_dir().join(format!("{app}.json"));
    std::fs::write(
        &file,
        format!(
            r#"{{"application_id": "{app}", "stages": [
                {{"name": "join", "sources": ["{customers}", "{orders}"], "sinks": ["{enriched}"],
                  "stateful": true, "ticks_ms": 60000}}]}}"#
        ),
    )
    .unwrap();
    let (ok, text) = probe(&file);
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL [topic-exists]") && text.contains(&enriched),
        "{text}"
    );
    assert!(
        text.contains(&format!("{app}-join-ticks")),
        "the missing tick topic: {text}"
    );
    assert!(
        text.contains("FAIL [co-partitioning]")
            && text.contains(&format!("{customers:?} has 4, {orders:?} has 2")),
        "{text}"
    );

    // The sound deployment: equal counts, the sink and the tick topic.
    let customers2 = unique("customers");
    create(
        &cluster,
        &[
            (&customers2, 2),
            (&enriched, 1),
            (&format!("{app}-join-ticks"), 2),
        ],
    );
    std::fs::write(
        &file,
        format!(
            r#"{{"application_id": "{app}", "stages": [
                {{"name": "join", "sources": ["{customers2}", "{orders}"], "sinks": ["{enriched}"],
                  "stateful": true, "ticks_ms": 60000}}]}}"#
        ),
    )
    .unwrap();
    let (ok, text) = probe(&file);
    assert!(ok, "{text}");
    assert!(text.starts_with("0 finding(s)"), "{text}");

    // A file that is not an application is one clear line.
    std::fs::write(&file, "{}").unwrap();
    let (ok, text) = probe(&file);
    assert!(!ok);
    assert_eq!(text.lines().count(), 1, "{text}");
    let _ = std::fs::remove_file(&file);
}
