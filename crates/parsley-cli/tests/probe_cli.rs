//! `parsley probe` against a live broker (`PARSLEY_BOOTSTRAP`): a broken
//! topic set fails with every finding named; the repaired one passes.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_executor::block_on;
use parsley::task::TopicMetadata;
use parsley_kafka::KafkaCluster;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

fn bootstrap() -> String {
    std::env::var("PARSLEY_BOOTSTRAP").expect("set PARSLEY_BOOTSTRAP to a broker address")
}

fn unique(prefix: &str) -> String {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("pt-{prefix}-{n}")
}

fn create(cluster: &KafkaCluster, topics: &[(&str, i32)]) {
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(n, p)| NewTopic::new(n, *p, TopicReplication::Fixed(1)))
        .collect();
    for r in block_on(cluster.admin().create_topics(&new, &AdminOptions::new())).unwrap() {
        r.unwrap();
    }
    for (n, _) in topics {
        let mut tries = 0;
        while cluster.describe(n).is_err() {
            tries += 1;
            assert!(tries < 100, "{n} did not appear");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn probe(file: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(["probe", "--bootstrap", &bootstrap(), "--app"])
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
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
