//! Composing stages into one application.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use parsley_protocol::SenderId;

use crate::identity;
use crate::stage::{MAX_TOPIC_NAME, Stage, name_problem};
use crate::topic::AnyTopic;

/// The names one stage of an application owns. All of them derive from the
/// application id and the stage name, so both must stay stable across
/// deployments.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OwnedNames {
    /// The stage name.
    pub stage: String,
    /// `<applicationId>-<stage>-ticks`, for a ticking stage.
    pub tick_topic: Option<String>,
    /// `<stage>-state`: the protocol state store.
    pub state_store: String,
    /// `<applicationId>-<stage>-state-changelog`.
    pub state_changelog: String,
    /// `<stage>-fold`: the fold-state store, for a stateful stage.
    pub fold_store: Option<String>,
    /// `<applicationId>-<stage>-fold-changelog`, for a stateful stage.
    pub fold_changelog: Option<String>,
}

/// How one topic is used in an application.
pub(crate) struct TopicUse {
    /// The typed topic; `None` for a tick topic.
    pub(crate) topic: Option<AnyTopic>,
    /// The stage consuming it.
    pub(crate) source_of: Option<usize>,
    /// The stage whose tick topic it is.
    pub(crate) ticks_of: Option<usize>,
}

pub(crate) struct AppDef {
    pub(crate) id: String,
    pub(crate) stages: Vec<Stage>,
    pub(crate) names: Vec<OwnedNames>,
    pub(crate) topics: BTreeMap<String, TopicUse>,
}

/// An application: stages composed under one application id, validated.
///
/// The application id names everything the application owns:
/// `<applicationId>-<stage>-ticks`, `-state-changelog` and `-fold-changelog`,
/// in the convention Kafka Streams uses, so a cluster's topic listing keeps
/// an application's topics together. Cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use parsley::{Codec, Message, Parsley, Stage, Tick, Topic};
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let balances = Stage::named("balances")
///     .state(Codec::int64(), || 0)
///     .fold(&orders, |b: i64, m: &Message<String, i64>| parsley::Step::to(b + m.value().copied().unwrap_or(0)))
///     .ticks(Duration::from_secs(60), |_t: &Tick| vec![])
///     .build()?;
/// let app = Parsley::named("payments", [balances])?;
/// let names = app.owned_names("balances").unwrap();
/// assert_eq!(names.tick_topic.as_deref(), Some("payments-balances-ticks"));
/// assert_eq!(names.state_changelog, "payments-balances-state-changelog");
/// assert_eq!(names.fold_store.as_deref(), Some("balances-fold"));
/// assert_eq!(names.fold_changelog.as_deref(), Some("payments-balances-fold-changelog"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Parsley {
    pub(crate) def: Arc<AppDef>,
}

impl fmt::Debug for Parsley {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parsley")
            .field("application_id", &self.def.id)
            .field("stages", &self.def.stages)
            .finish()
    }
}

/// Why stages cannot be composed. Each message says what to change.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CompositionError {
    /// The application id is unusable.
    #[error(
        "application id {id:?} is invalid: {reason}; it prefixes topic names, so use ASCII letters, digits, '.', '_' or '-'"
    )]
    InvalidApplicationId {
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No stages.
    #[error("application {id:?} has no stages; pass at least one built Stage")]
    NoStages {
        /// The application id.
        id: String,
    },
    /// Two stages share a name.
    #[error(
        "two stages are named {stage:?}; stage names key stores and tick topics, so give each stage its own name"
    )]
    DuplicateStage {
        /// The name.
        stage: String,
    },
    /// A topic is consumed by two stages of one application.
    #[error(
        "topic {topic:?} is a source of both stage {first:?} and stage {second:?}; a topic may feed at most one stage per application, so consume it in one stage or run the other stage as its own application"
    )]
    TopicSourcedTwice {
        /// The topic.
        topic: String,
        /// The first stage consuming it.
        first: String,
        /// The second stage consuming it.
        second: String,
    },
    /// One topic name is declared with different key or value types.
    #[error(
        "topic {topic:?} is declared with key/value types {first} in stage {first_stage:?} but {second} in stage {second_stage:?}; declare the topic once and use the same value on both sides of the hop"
    )]
    ConflictingTopicTypes {
        /// The topic.
        topic: String,
        /// Types where first seen.
        first: String,
        /// Stage where first seen.
        first_stage: String,
        /// Types where seen again.
        second: String,
        /// Stage where seen again.
        second_stage: String,
    },
    /// A declared topic uses a name the application owns.
    #[error(
        "stage {stage:?} declares topic {topic:?}, a name reserved for stage {owner:?}'s ticks; rename the topic"
    )]
    ReservedTopicName {
        /// The topic.
        topic: String,
        /// The stage declaring it.
        stage: String,
        /// The stage owning the name.
        owner: String,
    },
    /// A derived name is too long.
    #[error(
        "derived name {name:?} is {len} characters long, over Kafka's limit of {MAX_TOPIC_NAME}; shorten the application id or the stage name"
    )]
    NameTooLong {
        /// The derived name.
        name: String,
        /// Its length.
        len: usize,
    },
}

fn types(t: &AnyTopic) -> String {
    format!("<{}, {}>", t.key_type().1, t.value_type().1)
}

impl Parsley {
    /// Composes `stages` into the application `application_id`, derives
    /// every owned name, and validates the composition: unique stage names,
    /// at most one consuming stage per topic, one key and value type per
    /// topic name, no declared topic under an owned name, and owned names
    /// within Kafka's limits.
    pub fn named(
        application_id: impl Into<String>,
        stages: impl IntoIterator<Item = Stage>,
    ) -> Result<Parsley, CompositionError> {
        let id = application_id.into();
        if let Some(reason) = name_problem(&id) {
            return Err(CompositionError::InvalidApplicationId { id, reason });
        }
        let stages: Vec<Stage> = stages.into_iter().collect();
        if stages.is_empty() {
            return Err(CompositionError::NoStages { id });
        }
        let mut seen = BTreeSet::new();
        for s in &stages {
            if !seen.insert(s.name()) {
                return Err(CompositionError::DuplicateStage {
                    stage: s.name().to_owned(),
                });
            }
        }
        let names = derive_names(&id, &stages)?;
        let reserved: BTreeMap<&str, usize> = names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.tick_topic.as_deref().map(|t| (t, i)))
            .collect();

        let mut topics = topic_uses(&stages, &reserved)?;
        // A stage's dead-letter topic is used, not consumed or stamped.
        for s in &stages {
            if let Some(t) = s.corrupt_headers_dead_letter() {
                topics.entry(t.to_owned()).or_insert_with(|| TopicUse {
                    topic: None,
                    source_of: None,
                    ticks_of: None,
                });
            }
        }
        for (&tick_topic, &i) in &reserved {
            topics.insert(
                tick_topic.to_owned(),
                TopicUse {
                    topic: None,
                    source_of: Some(i),
                    ticks_of: Some(i),
                },
            );
        }
        tracing::info!(application_id = %id, stages = stages.len(), topics = topics.len(), "application assembled");
        Ok(Parsley {
            def: Arc::new(AppDef {
                id,
                stages,
                names,
                topics,
            }),
        })
    }

    /// The application id.
    pub fn application_id(&self) -> &str {
        &self.def.id
    }

    /// The stages, in the order given.
    pub fn stages(&self) -> &[Stage] {
        &self.def.stages
    }

    /// The stage called `name`.
    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.def.stages.iter().find(|s| s.name() == name)
    }

    /// The topics whose records reach stage `stage` only through other
    /// stages of this application: a chain of stages leads from each to one
    /// of `stage`'s sources, and `stage` does not consume it itself. With
    /// the stages that read it on the way. Empty for a stage the
    /// application does not have.
    pub fn upstream_topics(&self, stage: &str) -> std::collections::BTreeMap<String, Vec<String>> {
        use std::collections::{BTreeMap, BTreeSet};
        let Some(target) = self.stage(stage) else {
            return BTreeMap::new();
        };
        let own: BTreeSet<&str> = target.source_topics().into_iter().collect();
        // Topics that lead into `stage`, found backwards from its sources.
        let mut reach: BTreeSet<&str> = own.clone();
        let mut via: BTreeMap<String, Vec<String>> = BTreeMap::new();
        loop {
            let mut grew = false;
            for s in self.stages() {
                if s.name() == stage || !s.sink_topics().iter().any(|t| reach.contains(t)) {
                    continue;
                }
                for t in s.source_topics() {
                    if own.contains(t) {
                        continue;
                    }
                    let readers = via.entry(t.to_owned()).or_default();
                    if !readers.iter().any(|r| r == s.name()) {
                        readers.push(s.name().to_owned());
                    }
                    grew |= reach.insert(t);
                }
            }
            if !grew {
                break;
            }
        }
        via
    }

    /// The first of `after` on a topic that reaches `stage` only through
    /// other stages ([`upstream_topics`](Self::upstream_topics)), with the
    /// stages on the way: a cause a causal query of `stage` cannot judge.
    pub fn upstream_cause<'a>(
        &self,
        stage: &str,
        after: &'a [crate::Coordinate],
    ) -> Option<(&'a crate::Coordinate, Vec<String>)> {
        let mut upstream = self.upstream_topics(stage);
        after
            .iter()
            .find_map(|c| upstream.remove(&c.topic).map(|via| (c, via)))
    }

    /// How `topic`'s producers place keys, as the stages that read or write
    /// it declare ([`Topic::partitioned_by`](crate::Topic::partitioned_by));
    /// Kafka's default for a topic no stage declares otherwise.
    pub fn topic_partitioner(&self, topic: &str) -> crate::partition::Partitioner {
        self.stages()
            .iter()
            .flat_map(|s| {
                s.def
                    .sources
                    .iter()
                    .map(|src| &src.topic)
                    .chain(&s.def.sinks)
            })
            .find(|t| t.name() == topic)
            .map(|t| t.partitioner())
            .unwrap_or_default()
    }

    pub(crate) fn stage_index(&self, name: &str) -> Option<usize> {
        self.def.stages.iter().position(|s| s.name() == name)
    }

    /// The names stage `stage` owns.
    pub fn owned_names(&self, stage: &str) -> Option<&OwnedNames> {
        self.stage_index(stage).map(|i| &self.def.names[i])
    }

    /// The tick topic of `stage`, if it ticks.
    pub fn tick_topic(&self, stage: &str) -> Option<&str> {
        self.owned_names(stage)?.tick_topic.as_deref()
    }

    /// Every topic the application uses (sources, sinks, tick topics,
    /// dead-letter topics), sorted.
    pub fn topics(&self) -> Vec<&str> {
        self.def.topics.keys().map(String::as_str).collect()
    }

    /// The stage consuming `topic`, if any.
    pub fn consumer_of(&self, topic: &str) -> Option<&Stage> {
        let i = self.def.topics.get(topic)?.source_of?;
        self.def.stages.get(i)
    }

    /// The sender identity of task `partition` of `stage`
    /// (see [`identity::sender_id`]).
    pub fn sender_id(&self, stage: &str, partition: i32) -> SenderId {
        identity::sender_id(&self.def.id, stage, partition)
    }
}

/// The names the runtime derives for each stage (its tick topic, stores
/// and changelogs), each checked against Kafka's topic name limit.
fn derive_names(id: &str, stages: &[Stage]) -> Result<Vec<OwnedNames>, CompositionError> {
    let mut names = Vec::with_capacity(stages.len());
    for s in stages {
        let stage = s.name();
        let prefixed = |suffix: &str| format!("{id}-{stage}-{suffix}");
        let n = OwnedNames {
            stage: stage.to_owned(),
            tick_topic: s.tick_interval().map(|_| prefixed("ticks")),
            state_store: format!("{stage}-state"),
            state_changelog: prefixed("state-changelog"),
            fold_store: s.is_stateful().then(|| format!("{stage}-fold")),
            fold_changelog: s.is_stateful().then(|| prefixed("fold-changelog")),
        };
        for name in [
            Some(&n.state_changelog),
            n.fold_changelog.as_ref(),
            n.tick_topic.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            if name.len() > MAX_TOPIC_NAME {
                return Err(CompositionError::NameTooLong {
                    name: name.clone(),
                    len: name.len(),
                });
            }
        }
        names.push(n);
    }
    Ok(names)
}

/// Every topic the stages declare, with the stage that consumes it: one
/// consumer per topic, one pair of types per topic, and no stage's topic
/// named like another stage's tick topic (`reserved`, by stage index).
fn topic_uses(
    stages: &[Stage],
    reserved: &BTreeMap<&str, usize>,
) -> Result<BTreeMap<String, TopicUse>, CompositionError> {
    let mut topics: BTreeMap<String, TopicUse> = BTreeMap::new();
    let mut first_seen: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for (i, s) in stages.iter().enumerate() {
        let declared = s
            .def
            .sources
            .iter()
            .map(|src| (&src.topic, true))
            .chain(s.def.sinks.iter().map(|t| (t, false)));
        for (t, is_source) in declared {
            let name = t.name();
            if let Some(&owner) = reserved.get(name) {
                return Err(CompositionError::ReservedTopicName {
                    topic: name.to_owned(),
                    stage: s.name().to_owned(),
                    owner: stages[owner].name().to_owned(),
                });
            }
            match first_seen.get(name) {
                Some((first, at)) if *first != types(t) => {
                    return Err(CompositionError::ConflictingTopicTypes {
                        topic: name.to_owned(),
                        first: first.clone(),
                        first_stage: stages[*at].name().to_owned(),
                        second: types(t),
                        second_stage: s.name().to_owned(),
                    });
                }
                Some(_) => {}
                None => {
                    first_seen.insert(name.to_owned(), (types(t), i));
                }
            }
            let entry = topics.entry(name.to_owned()).or_insert_with(|| TopicUse {
                topic: Some(t.clone()),
                source_of: None,
                ticks_of: None,
            });
            if is_source {
                if let Some(first) = entry.source_of {
                    return Err(CompositionError::TopicSourcedTwice {
                        topic: name.to_owned(),
                        first: stages[first].name().to_owned(),
                        second: s.name().to_owned(),
                    });
                }
                entry.source_of = Some(i);
            }
        }
    }
    Ok(topics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Codec, Message, Tick, Topic};
    use std::time::Duration;

    fn t(name: &str) -> Topic<String, String> {
        Topic::new(name, Codec::utf8(), Codec::utf8())
    }

    fn pass(name: &str, from: &Topic<String, String>, to: &Topic<String, String>) -> Stage {
        let out = to.clone();
        Stage::named(name)
            .on(from, move |m: &Message<String, String>| {
                vec![out.send(m.key().cloned(), m.value().cloned())]
            })
            .sink(to)
            .build()
            .unwrap()
    }

    #[test]
    fn rejects_bad_compositions() {
        let (a, b, c) = (t("a"), t("b"), t("c"));
        assert!(matches!(
            Parsley::named("bad id", [pass("p", &a, &b)]),
            Err(CompositionError::InvalidApplicationId { .. })
        ));
        assert!(matches!(
            Parsley::named("app", Vec::<Stage>::new()),
            Err(CompositionError::NoStages { .. })
        ));
        assert!(matches!(
            Parsley::named("app", [pass("p", &a, &b), pass("p", &b, &c)]),
            Err(CompositionError::DuplicateStage { .. })
        ));
        let e = Parsley::named("app", [pass("p1", &a, &b), pass("p2", &a, &c)]).unwrap_err();
        assert_eq!(
            e,
            CompositionError::TopicSourcedTwice {
                topic: "a".into(),
                first: "p1".into(),
                second: "p2".into()
            }
        );
        let b_long: Topic<String, i64> = Topic::new("b", Codec::utf8(), Codec::int64());
        let p2 = Stage::named("p2")
            .on(&b_long, |_m: &Message<String, i64>| vec![])
            .build()
            .unwrap();
        assert!(matches!(
            Parsley::named("app", [pass("p1", &a, &b), p2]),
            Err(CompositionError::ConflictingTopicTypes { .. })
        ));
        let ticker = Stage::named("tk")
            .ticks(Duration::from_secs(1), |_t: &Tick| vec![])
            .build()
            .unwrap();
        let squat = pass("p", &a, &t("app-tk-ticks"));
        assert!(matches!(
            Parsley::named("app", [ticker, squat]),
            Err(CompositionError::ReservedTopicName { .. })
        ));
        let long = "x".repeat(240);
        let e = Parsley::named(long, [pass("p", &a, &b)]).unwrap_err();
        assert!(matches!(e, CompositionError::NameTooLong { .. }), "{e}");
    }

    #[test]
    fn derives_names_and_topics() {
        let (a, b, c) = (t("a"), t("b"), t("c"));
        let app = Parsley::named("app", [pass("p1", &a, &b), pass("p2", &b, &c)]).unwrap();
        assert_eq!(app.topics(), vec!["a", "b", "c"]);
        assert_eq!(app.consumer_of("b").map(Stage::name), Some("p2"));
        assert_eq!(app.owned_names("p1").unwrap().fold_store, None);
        assert_eq!(app.owned_names("p1").unwrap().state_store, "p1-state");
        assert_eq!(app.tick_topic("p1"), None);
        assert_ne!(app.sender_id("p1", 0), app.sender_id("p2", 0));
    }
}
