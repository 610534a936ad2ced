//! `parsley probe`: the cluster contract probes for an application
//! described in a small JSON file, read-only, before it starts.
//!
//! ```json
//! {
//!   "application_id": "payments-app",
//!   "stages": [
//!     { "name": "settlement", "sources": ["orders", "payments"],
//!       "sinks": ["settlements"], "stateful": true, "ticks_ms": 60000 }
//!   ]
//! }
//! ```
//!
//! A full topology description, as `parsley describe --json` or
//! `Topology::to_json` writes it, is read as well.
//!
//! Only names matter to the probes (which topics exist, how many
//! partitions each has), so the stages are built with byte topics and
//! logic that does nothing.

use crate::connect::Connection;
use std::time::Duration;

use parsley::{Codec, Emission, Parsley, ProbeReport, Stage, Step, Topic, Topology, probe_cluster};
use parsley_kafka::KafkaCluster;

use serde::Deserialize;

/// The application, as the file describes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppFile {
    /// The application id.
    pub application_id: String,
    /// Its stages.
    pub stages: Vec<StageFile>,
}

/// One stage.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageFile {
    /// The stage name.
    pub name: String,
    /// Source topics.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Sink topics.
    #[serde(default)]
    pub sinks: Vec<String>,
    /// Whether it keeps per-key state.
    #[serde(default)]
    pub stateful: bool,
    /// Its tick interval in milliseconds, if it ticks.
    #[serde(default)]
    pub ticks_ms: Option<u64>,
}

type Bytes = Topic<Vec<u8>, Vec<u8>>;

fn topic(name: &str) -> Bytes {
    Topic::new(name, Codec::bytes(), Codec::bytes())
}

fn stage(s: &StageFile) -> Result<Stage, String> {
    let ticks = s.ticks_ms.map(Duration::from_millis);
    let built = if s.stateful {
        let mut b = Stage::named(s.name.as_str()).state(Codec::bytes(), Vec::new);
        for t in &s.sinks {
            b = b.sink(&topic(t));
        }
        for t in &s.sources {
            b = b.fold(&topic(t), |_, _| Step::keep());
        }
        if let Some(i) = ticks {
            b = b.tick_fold(i, |_, _| Step::keep());
        }
        b.build()
    } else {
        let mut b = Stage::named(s.name.as_str());
        for t in &s.sinks {
            b = b.sink(&topic(t));
        }
        for t in &s.sources {
            b = b.on(&topic(t), |_| Vec::<Emission>::new());
        }
        if let Some(i) = ticks {
            b = b.ticks(i, |_| Vec::<Emission>::new());
        }
        b.build()
    };
    built.map_err(|e| e.to_string())
}

impl From<&Topology> for AppFile {
    /// The names the probes need from a full description (what
    /// `parsley describe --json` and `Topology::to_json` write).
    fn from(t: &Topology) -> Self {
        AppFile {
            application_id: t.application_id.clone(),
            stages: t
                .stages
                .iter()
                .map(|s| StageFile {
                    name: s.name.clone(),
                    sources: s.sources.iter().map(|t| t.topic.clone()).collect(),
                    sinks: s.sinks.iter().map(|t| t.topic.topic.clone()).collect(),
                    stateful: s.state.is_some(),
                    ticks_ms: s.ticks.as_ref().map(|t| t.interval_ms),
                })
                .collect(),
        }
    }
}

/// Builds the described application, from the small file above or from a
/// full topology description.
pub fn application(text: &str) -> Result<Parsley, String> {
    // A description written by a newer build may say what this one cannot
    // read: refuse it rather than act on part of it.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
        && let Some(version) = v.get("format_version").and_then(serde_json::Value::as_u64)
        && version > u64::from(parsley::describe::TOPOLOGY_FORMAT)
    {
        return Err(format!(
            "the application file is in format {version}, written by a newer parsley; this one reads up to format {}: use the parsley that wrote it",
            parsley::describe::TOPOLOGY_FORMAT
        ));
    }
    let file: AppFile = match serde_json::from_str(text) {
        Ok(file) => file,
        Err(small) => match serde_json::from_str::<Topology>(text) {
            Ok(topology) => AppFile::from(&topology),
            Err(_) => return Err(format!("the application file is not valid: {small}")),
        },
    };
    let stages = file
        .stages
        .iter()
        .map(stage)
        .collect::<Result<Vec<_>, _>>()?;
    Parsley::named(file.application_id.as_str(), stages).map_err(|e| e.to_string())
}

/// Runs the cluster probes; the report lists every finding and note.
pub fn run(cluster: &Connection, app_file: &str) -> Result<ProbeReport, String> {
    let text =
        std::fs::read_to_string(app_file).map_err(|e| format!("cannot read {app_file}: {e}"))?;
    let app = application(&text)?;
    let config = cluster.client_config();
    let bootstrap = &cluster.bootstrap;
    let cluster = KafkaCluster::new(&config, Duration::from_secs(20))
        .map_err(|e| format!("cannot reach {bootstrap}: {e}"))?;
    Ok(probe_cluster(&app, &cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_from_a_newer_format_is_refused() {
        let app = parsley::Parsley::named(
            "shop",
            [parsley::Stage::named("s")
                .on(
                    &parsley::Topic::new("a", parsley::Codec::utf8(), parsley::Codec::utf8()),
                    |_m: &parsley::Message<String, String>| vec![],
                )
                .build()
                .unwrap()],
        )
        .unwrap();
        let json = app.describe().to_json();
        assert!(application(&json).is_ok());
        let newer = json.replacen(
            &format!("\"format_version\": {}", parsley::describe::TOPOLOGY_FORMAT),
            &format!(
                "\"format_version\": {}",
                parsley::describe::TOPOLOGY_FORMAT + 1
            ),
            1,
        );
        assert_ne!(newer, json);
        let e = application(&newer).unwrap_err();
        assert!(e.contains("newer parsley"), "{e}");
    }

    #[test]
    fn a_described_application_has_the_declared_topics() {
        let app = application(
            r#"{"application_id": "shop", "stages": [
                {"name": "join", "sources": ["customers", "orders"], "sinks": ["enriched"],
                 "stateful": true, "ticks_ms": 1000},
                {"name": "echo", "sources": ["enriched"]}]}"#,
        )
        .unwrap();
        assert_eq!(app.tick_topic("join"), Some("shop-join-ticks"));
        assert_eq!(
            app.topics(),
            vec!["customers", "enriched", "orders", "shop-join-ticks"]
        );
        assert!(
            application(r#"{"application_id": "x", "stages": [{"name": "s"}]}"#)
                .unwrap_err()
                .contains("no source")
        );
        assert!(application(r#"{"application_id": "x"}"#).is_err());
    }

    #[test]
    fn a_topology_description_is_read_as_its_application() {
        let app = crate::demo::pipeline::ledger().unwrap();
        let json = parsley_kafka::topology(&app).to_json();
        let read = application(&json).unwrap();
        assert_eq!(read.application_id(), app.application_id());
        assert_eq!(read.topics(), app.topics());
        let shape = |a: &Parsley| {
            a.stage("settlement").map(|s| {
                (
                    s.source_topics().join(","),
                    s.sink_topics().join(","),
                    s.is_stateful(),
                    s.tick_interval(),
                )
            })
        };
        assert_eq!(shape(&read), shape(&app));
        assert!(shape(&read).is_some());
        // Something that is neither says what the small format wants.
        let e = application(r#"{"application_id": "x", "stages": 3}"#).unwrap_err();
        assert!(e.contains("not valid"), "{e}");
    }
}
