//! The Prometheus alert rules shipped in `docs/alerts` parse, are complete,
//! and name only series the runtime records (as a Prometheus recorder
//! renders them). `promtool` cannot be installed from the package
//! registries the CI reaches, so this parse is the check.

use std::collections::BTreeSet;
use std::path::PathBuf;

use parsley::runtime::metrics::*;

fn rules_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/alerts/parsley.rules.yml")
}

#[derive(serde::Deserialize)]
struct File {
    groups: Vec<Group>,
}

#[derive(serde::Deserialize)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(serde::Deserialize)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
}

#[test]
fn alert_rules_parse_and_name_recorded_series() {
    let text = std::fs::read_to_string(rules_path()).unwrap();
    let file: File = serde_yaml::from_str(&text).unwrap();
    assert_eq!(file.groups.len(), 1);
    assert_eq!(file.groups[0].name, "parsley");
    let known: BTreeSet<String> = [
        RECORDS_HELD,
        RECORDS_HELD_AGE_MAX_MS,
        RECORDS_DELIVERED_RATE,
        RECORDS_DELIVERED_TOTAL,
        REPLAYS_SKIPPED_TOTAL,
        TRUNCATION_SWEEPS_SKIPPED_TOTAL,
        TICKS_EMITTED_TOTAL,
        STAMP_OFFSET_ENTRIES,
        STAMP_SEQUENCE_ENTRIES,
    ]
    .iter()
    .map(|n| n.replace('-', "_"))
    .collect();
    let mut alerts = BTreeSet::new();
    for rule in &file.groups[0].rules {
        assert!(
            alerts.insert(rule.alert.clone()),
            "duplicate {}",
            rule.alert
        );
        assert!(
            rule.for_.ends_with('m') || rule.for_.ends_with('h'),
            "{}",
            rule.for_
        );
        assert!(rule.labels.contains_key("severity"), "{}", rule.alert);
        assert!(rule.annotations.contains_key("summary"), "{}", rule.alert);
        // Every identifier that looks like one of our series must be one.
        let series: Vec<&str> = rule
            .expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| {
                w.starts_with("records_")
                    || w.starts_with("stamp_")
                    || w.contains("sweeps")
                    || w.starts_with("ticks_")
            })
            .collect();
        assert!(!series.is_empty(), "{} names no series", rule.alert);
        for s in series {
            assert!(known.contains(s), "{} names unknown series {s}", rule.alert);
        }
        // Labels the expressions group by are labels we record.
        for label in ["stage", "task_id"] {
            assert!(
                rule.annotations["summary"].contains(&format!("$labels.{label}")),
                "{}",
                rule.alert
            );
        }
    }
    // The two alerts the operators' guide relies on.
    assert!(alerts.contains("ParsleyHoldTooOld"));
    assert!(alerts.contains("ParsleyTruncationSweepsSkipped"));
    let hold = &file.groups[0].rules[0];
    assert!(hold.expr.contains("records_held_age_max_ms"));
}
