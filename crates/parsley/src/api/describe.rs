//! A description of a built application: what each stage reads, writes and
//! owns, under the names the runtime will use. For reviews, deploy checks
//! and dashboards: [`Parsley::describe`] gives it, its `Display` is for
//! people and (feature `json`) [`Topology::to_json`] for tools.

use std::fmt;

use crate::Parsley;

/// The version of the description's JSON form this build writes, and the
/// newest it reads. Version 2 added [`Topology::edges`]; a description
/// without a version is version 1.
pub const TOPOLOGY_FORMAT: u32 = 2;

/// An application's topology.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct Topology {
    /// The version of this description's form ([`TOPOLOGY_FORMAT`] when
    /// this build wrote it). Tools that read the JSON refuse a newer one.
    #[cfg_attr(feature = "json", serde(default = "format_v1"))]
    pub format_version: u32,
    /// The application id.
    pub application_id: String,
    /// Its stages, in the order they were composed.
    pub stages: Vec<StageTopology>,
    /// Which stage feeds which: one edge per topic a stage writes and
    /// another reads (Kafka Streams' topology description shows the same
    /// as its processors' predecessors and successors).
    #[cfg_attr(feature = "json", serde(default))]
    pub edges: Vec<Edge>,
    /// Topics a host adds for the application as a whole (on Kafka, the
    /// control and diagnostics topics); empty as the core describes it.
    pub host_topics: Vec<HostTopic>,
}

/// One stage of a [`Topology`].
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct StageTopology {
    /// The stage name.
    pub name: String,
    /// The topics it consumes, sorted by name.
    pub sources: Vec<TopicTopology>,
    /// The topics it may write, sorted by name.
    pub sinks: Vec<SinkTopology>,
    /// Its ticks, if it ticks.
    pub ticks: Option<TickTopology>,
    /// Its per-key state, if it has any.
    pub state: Option<StateTopology>,
    /// The changelog of its protocol state (clocks, holds, positions).
    pub state_changelog: String,
    /// The topics one task reads partition *n* of, together: the sources
    /// and the tick topic, which must therefore have the same number of
    /// partitions (one task per partition number).
    pub co_partitioned: Vec<String>,
    /// Where records with corrupt causal headers go, if the stage opted in.
    pub corrupt_headers_dead_letter: Option<String>,
    /// How long a record may be held before a warning, in milliseconds.
    pub hold_warning_after_ms: Option<u64>,
}

/// A source topic.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct TopicTopology {
    /// The topic.
    pub topic: String,
    /// The key's Rust type.
    pub key_type: String,
    /// The value's Rust type.
    pub value_type: String,
    /// The key codec's name.
    pub key_codec: String,
    /// The value codec's name.
    pub value_codec: String,
}

/// A sink topic.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct SinkTopology {
    /// The topic, its types and codecs.
    #[cfg_attr(feature = "json", serde(flatten))]
    pub topic: TopicTopology,
    /// Whether its records carry the compact clock (`vc` version 2).
    pub compact_clock: bool,
}

/// A stage's ticks.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct TickTopology {
    /// The tick topic the runtime creates.
    pub topic: String,
    /// The interval, in milliseconds.
    pub interval_ms: u64,
}

/// A stage's per-key state.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct StateTopology {
    /// The state's Rust type.
    pub state_type: String,
    /// The store's name.
    pub store: String,
    /// Its changelog topic.
    pub changelog: String,
}

/// One stage feeding another through a topic.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct Edge {
    /// The stage that writes the topic.
    pub from: String,
    /// The topic.
    pub topic: String,
    /// The stage that reads it.
    pub to: String,
}

#[cfg(feature = "json")]
fn format_v1() -> u32 {
    1
}

/// A Rust type's name without its module paths: `Option<String>` for
/// `core::option::Option<alloc::string::String>`.
pub fn short_type_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    let mut path = String::new();
    let flush = |path: &mut String, out: &mut String| {
        out.push_str(path.rsplit("::").next().unwrap_or(path));
        path.clear();
    };
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            path.push(c);
        } else {
            flush(&mut path, &mut out);
            out.push(c);
        }
    }
    flush(&mut path, &mut out);
    out
}

/// A topic a host adds for the whole application.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize, serde::Deserialize))]
pub struct HostTopic {
    /// The topic.
    pub topic: String,
    /// What it carries.
    pub purpose: String,
}

impl Topology {
    /// Every topic the application reads, writes or owns, sorted, each
    /// once.
    pub fn topics(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .stages
            .iter()
            .flat_map(|s| {
                s.sources
                    .iter()
                    .map(|t| t.topic.as_str())
                    .chain(s.sinks.iter().map(|t| t.topic.topic.as_str()))
                    .chain(s.ticks.iter().map(|t| t.topic.as_str()))
                    .chain(s.state.iter().map(|t| t.changelog.as_str()))
                    .chain([s.state_changelog.as_str()])
                    .chain(s.corrupt_headers_dead_letter.as_deref())
            })
            .chain(self.host_topics.iter().map(|t| t.topic.as_str()))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The topics the runtime creates and owns (changelogs, tick topics,
    /// the host's), sorted: what a reset deletes.
    pub fn internal_topics(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .stages
            .iter()
            .flat_map(|s| {
                s.ticks
                    .iter()
                    .map(|t| t.topic.as_str())
                    .chain(s.state.iter().map(|t| t.changelog.as_str()))
                    .chain([s.state_changelog.as_str()])
            })
            .chain(self.host_topics.iter().map(|t| t.topic.as_str()))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The description as pretty-printed JSON (feature `json`).
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing it cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "application {}", self.application_id)?;
        for s in &self.stages {
            writeln!(f, "  stage {}", s.name)?;
            for t in &s.sources {
                writeln!(
                    f,
                    "    source {} ({} / {}, codecs {} / {}){}",
                    t.topic,
                    short_type_name(&t.key_type),
                    short_type_name(&t.value_type),
                    t.key_codec,
                    t.value_codec,
                    from_stages(&self.edges, &s.name, &t.topic)
                )?;
            }
            if let Some(t) = &s.ticks {
                writeln!(f, "    ticks  {} every {} ms", t.topic, t.interval_ms)?;
            }
            for t in &s.sinks {
                let t_ = &t.topic;
                writeln!(
                    f,
                    "    sink   {} ({} / {}, codecs {} / {}){}{}",
                    t_.topic,
                    short_type_name(&t_.key_type),
                    short_type_name(&t_.value_type),
                    t_.key_codec,
                    t_.value_codec,
                    if t.compact_clock {
                        ", compact clock"
                    } else {
                        ""
                    },
                    to_stages(&self.edges, &s.name, &t_.topic)
                )?;
            }
            if let Some(st) = &s.state {
                writeln!(
                    f,
                    "    state  {} in store {}, changelog {}",
                    short_type_name(&st.state_type),
                    st.store,
                    st.changelog
                )?;
            }
            writeln!(f, "    protocol changelog {}", s.state_changelog)?;
            writeln!(f, "    co-partitioned: {}", s.co_partitioned.join(", "))?;
            if let Some(d) = &s.corrupt_headers_dead_letter {
                writeln!(f, "    corrupt headers go to {d}")?;
            }
        }
        for t in &self.host_topics {
            writeln!(f, "  {} ({})", t.topic, t.purpose)?;
        }
        Ok(())
    }
}

/// ` <- a, b` naming the stages that write `topic` to `stage`, if any.
fn from_stages(edges: &[Edge], stage: &str, topic: &str) -> String {
    let from: Vec<&str> = edges
        .iter()
        .filter(|e| e.to == stage && e.topic == topic)
        .map(|e| e.from.as_str())
        .collect();
    if from.is_empty() {
        String::new()
    } else {
        format!(" <- {}", from.join(", "))
    }
}

/// ` -> a, b` naming the stages that read `topic` from `stage`, if any.
fn to_stages(edges: &[Edge], stage: &str, topic: &str) -> String {
    let to: Vec<&str> = edges
        .iter()
        .filter(|e| e.from == stage && e.topic == topic)
        .map(|e| e.to.as_str())
        .collect();
    if to.is_empty() {
        String::new()
    } else {
        format!(" -> {}", to.join(", "))
    }
}

impl Parsley {
    /// The application's topology: each stage's sources, sinks, ticks and
    /// state under the names the runtime will use, and which topics must
    /// be co-partitioned.
    ///
    /// ```
    /// use std::time::Duration;
    /// use parsley::{Codec, Message, Parsley, Stage, Step, Topic};
    /// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
    /// let totals: Topic<String, i64> = Topic::new("totals", Codec::utf8(), Codec::int64());
    /// let mut s = Stage::named("totals").state(Codec::int64(), || 0);
    /// let out = s.add_sink(&totals);
    /// let s = s
    ///     .fold(&orders, move |t: i64, m: &Message<String, i64>| {
    ///         let t = t + m.value().copied().unwrap_or(0);
    ///         Step::to(t).emit(out.send(m.key().cloned(), t))
    ///     })
    ///     .build()?;
    /// let app = Parsley::named("shop", [s])?;
    /// let t = app.describe();
    /// assert_eq!(t.stages[0].sources[0].topic, "orders");
    /// assert_eq!(t.stages[0].state.as_ref().unwrap().changelog, "shop-totals-fold-changelog");
    /// assert_eq!(
    ///     t.internal_topics(),
    ///     ["shop-totals-fold-changelog", "shop-totals-state-changelog"]
    /// );
    /// assert!(t.to_string().contains("sink   totals (String / i64, codecs utf8 / int64)"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn describe(&self) -> Topology {
        let stages = self
            .def
            .stages
            .iter()
            .zip(&self.def.names)
            .map(|(stage, names)| {
                let def = &stage.def;
                let topic = |t: &crate::topic::AnyTopic| {
                    let (key_codec, value_codec) = t.codec_names();
                    TopicTopology {
                        topic: t.name().to_owned(),
                        key_type: t.key_type().1.to_owned(),
                        value_type: t.value_type().1.to_owned(),
                        key_codec: key_codec.to_owned(),
                        value_codec: value_codec.to_owned(),
                    }
                };
                let mut sources: Vec<TopicTopology> =
                    def.sources.iter().map(|s| topic(&s.topic)).collect();
                sources.sort_by(|a, b| a.topic.cmp(&b.topic));
                let sinks = def
                    .sinks
                    .iter()
                    .map(|t| SinkTopology {
                        topic: topic(t),
                        compact_clock: def.compact_clock_sinks.contains(t.name()),
                    })
                    .collect();
                let ticks = names
                    .tick_topic
                    .as_ref()
                    .zip(def.ticks.as_ref())
                    .map(|(topic, t)| TickTopology {
                        topic: topic.clone(),
                        interval_ms: u64::try_from(t.interval.as_millis()).unwrap_or(u64::MAX),
                    });
                let state = def
                    .state
                    .as_ref()
                    .zip(names.fold_store.as_ref().zip(names.fold_changelog.as_ref()))
                    .map(|(decl, (store, changelog))| StateTopology {
                        state_type: decl.type_name.to_owned(),
                        store: store.clone(),
                        changelog: changelog.clone(),
                    });
                let co_partitioned = sources
                    .iter()
                    .map(|s| s.topic.clone())
                    .chain(names.tick_topic.clone())
                    .collect();
                StageTopology {
                    name: def.name.clone(),
                    sources,
                    sinks,
                    ticks,
                    state,
                    state_changelog: names.state_changelog.clone(),
                    co_partitioned,
                    corrupt_headers_dead_letter: def.corrupt_headers_dead_letter.clone(),
                    hold_warning_after_ms: def
                        .hold_warning_after
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                }
            })
            .collect();
        let stages: Vec<StageTopology> = stages;
        let mut edges = Vec::new();
        for from in &stages {
            for sink in &from.sinks {
                for to in &stages {
                    if to.sources.iter().any(|s| s.topic == sink.topic.topic) {
                        edges.push(Edge {
                            from: from.name.clone(),
                            topic: sink.topic.topic.clone(),
                            to: to.name.clone(),
                        });
                    }
                }
            }
        }
        edges.sort();
        Topology {
            format_version: TOPOLOGY_FORMAT,
            application_id: self.def.id.clone(),
            stages,
            edges,
            host_topics: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Codec, Message, Parsley, Stage, Step, Tick, Topic};

    fn app() -> Parsley {
        let a: Topic<String, String> = Topic::new("a", Codec::utf8(), Codec::utf8());
        let b: Topic<String, i64> = Topic::new("b", Codec::utf8(), Codec::int64());
        let out: Topic<String, i64> = Topic::new("out", Codec::utf8(), Codec::int64());
        let ticking = Stage::named("sum")
            .state(Codec::int64(), || 0)
            .fold(&b, |n: i64, _m: &Message<String, i64>| Step::to(n + 1))
            .fold(&a, |n: i64, _m: &Message<String, String>| Step::to(n))
            .tick_fold(Duration::from_secs(5), |n: i64, _t: &Tick| Step::to(n))
            .sink(&out)
            .compact_clock(&out)
            .dead_letter_corrupt_headers("bad")
            .build()
            .unwrap();
        let plain = Stage::named("echo")
            .on(&out, |_m: &Message<String, i64>| vec![])
            .build()
            .unwrap();
        Parsley::named("app", [ticking, plain]).unwrap()
    }

    #[test]
    fn each_stage_is_described_with_the_names_the_runtime_uses() {
        // ANCHOR: describe
        let t = app().describe();
        let sum = &t.stages[0];
        assert_eq!(sum.co_partitioned, ["a", "b", "app-sum-ticks"]);
        assert_eq!(
            sum.state.as_ref().unwrap().changelog,
            "app-sum-fold-changelog"
        );
        assert_eq!(
            t.to_string(),
            "\
application app
  stage sum
    source a (String / String, codecs utf8 / utf8)
    source b (String / i64, codecs utf8 / int64)
    ticks  app-sum-ticks every 5000 ms
    sink   out (String / i64, codecs utf8 / int64), compact clock -> echo
    state  i64 in store sum-fold, changelog app-sum-fold-changelog
    protocol changelog app-sum-state-changelog
    co-partitioned: a, b, app-sum-ticks
    corrupt headers go to bad
  stage echo
    source out (String / i64, codecs utf8 / int64) <- sum
    protocol changelog app-echo-state-changelog
    co-partitioned: out
"
        );
        // ANCHOR_END: describe
        assert_eq!(
            t.edges,
            [super::Edge {
                from: "sum".into(),
                topic: "out".into(),
                to: "echo".into()
            }]
        );
        assert_eq!(t.format_version, super::TOPOLOGY_FORMAT);
        assert_eq!(t.application_id, "app");
        let sum = &t.stages[0];
        assert_eq!(sum.name, "sum");
        let sources: Vec<&str> = sum.sources.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(sources, ["a", "b"], "sorted by name");
        assert_eq!(sum.sources[1].value_codec, "int64");
        assert!(sum.sinks[0].compact_clock);
        let ticks = sum.ticks.as_ref().unwrap();
        assert_eq!(
            (ticks.topic.as_str(), ticks.interval_ms),
            ("app-sum-ticks", 5_000)
        );
        let state = sum.state.as_ref().unwrap();
        assert_eq!(state.state_type, "i64");
        assert_eq!(state.store, "sum-fold");
        assert_eq!(state.changelog, "app-sum-fold-changelog");
        assert_eq!(sum.state_changelog, "app-sum-state-changelog");
        assert_eq!(sum.co_partitioned, ["a", "b", "app-sum-ticks"]);
        assert_eq!(sum.corrupt_headers_dead_letter.as_deref(), Some("bad"));
        let echo = &t.stages[1];
        assert!(echo.state.is_none() && echo.ticks.is_none() && echo.sinks.is_empty());
        assert!(!t.stages[0].sinks.is_empty());
        assert_eq!(
            t.topics(),
            [
                "a",
                "app-echo-state-changelog",
                "app-sum-fold-changelog",
                "app-sum-state-changelog",
                "app-sum-ticks",
                "b",
                "bad",
                "out"
            ]
        );
        assert_eq!(
            t.internal_topics(),
            [
                "app-echo-state-changelog",
                "app-sum-fold-changelog",
                "app-sum-state-changelog",
                "app-sum-ticks"
            ]
        );
        let text = t.to_string();
        assert!(
            text.contains("    ticks  app-sum-ticks every 5000 ms\n"),
            "{text}"
        );
        assert!(text.contains(", compact clock -> echo\n"), "{text}");
        assert!(text.contains("    corrupt headers go to bad\n"), "{text}");
    }

    #[test]
    fn type_names_lose_their_module_paths_only() {
        use super::short_type_name as short;
        assert_eq!(short("alloc::string::String"), "String");
        assert_eq!(
            short("core::option::Option<alloc::vec::Vec<u8>>"),
            "Option<Vec<u8>>"
        );
        assert_eq!(
            short("(i64, std::collections::hash::map::HashMap<alloc::string::String, [u8; 4]>)"),
            "(i64, HashMap<String, [u8; 4]>)"
        );
        assert_eq!(short("my_crate::Order"), "Order");
        assert_eq!(short("i64"), "i64");
    }

    #[cfg(feature = "json")]
    #[test]
    fn a_description_without_a_version_is_version_one() {
        let mut v: serde_json::Value = serde_json::from_str(&app().describe().to_json()).unwrap();
        let map = v.as_object_mut().unwrap();
        map.remove("format_version");
        map.remove("edges");
        let old: super::Topology = serde_json::from_value(v).unwrap();
        assert_eq!(old.format_version, 1);
        assert!(old.edges.is_empty());
    }

    #[cfg(feature = "json")]
    #[test]
    fn the_json_reads_back_as_the_same_description() {
        let t = app().describe();
        let back: super::Topology = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!(back, t);
        let v: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
        // A sink's topic fields sit beside its compact-clock flag.
        assert_eq!(v["stages"][0]["sinks"][0]["topic"], "out");
        assert_eq!(v["stages"][0]["sinks"][0]["compact_clock"], true);
    }
}
