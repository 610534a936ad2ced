//! What building a stage can refuse: [`StageError`].

/// Why a stage cannot be built. Each message says what to change.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum StageError {
    /// The stage name is unusable.
    #[error(
        "stage name {name:?} is invalid: {reason}; the name becomes part of topic names, so use 1 to 249 ASCII letters, digits, '.', '_' or '-'"
    )]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A topic name the stage uses is unusable.
    #[error("stage {stage:?} uses topic {topic:?}, whose name is invalid: {reason}")]
    InvalidTopicName {
        /// The stage.
        stage: String,
        /// The topic name.
        topic: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The stage has nothing to consume.
    #[error(
        "stage {stage:?} has no source; add a handler with .on(..) or a fold with .fold(..), or declare ticks"
    )]
    NoSources {
        /// The stage.
        stage: String,
    },
    /// One topic has two handlers or folds in one stage.
    #[error(
        "stage {stage:?} declares topic {topic:?} as a source twice; give each topic one handler or fold and branch inside it"
    )]
    DuplicateSource {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
    },
    /// Two different topic types share one sink name.
    #[error(
        "stage {stage:?} declares sink {topic:?} twice with different key or value types; declare each topic once and reuse the value"
    )]
    ConflictingSink {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
    },
    /// A compact clock asked for on a topic that is not one of the
    /// stage's sinks.
    #[error(
        "stage {stage:?} asks for compact clocks on {topic:?}, which is not one of its sinks; declare it with .sink(..) or .add_sink(..) as well"
    )]
    CompactClockNotASink {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
    },
    /// Ticks declared more than once.
    #[error(
        "stage {stage:?} declares ticks more than once; keep a single .ticks(..) or .tick_fold(..)"
    )]
    DuplicateTicks {
        /// The stage.
        stage: String,
    },
    /// A source or sink whose key codec writes a schema registry's
    /// framing, which is not a canonical key encoding.
    #[error(
        "stage {stage:?}: the key codec {codec:?} of topic {topic:?} writes a schema registry's framing (a schema id before the payload); key bytes pick the partition and key the fold state, and registering the key schema again would change every key's bytes, re-partitioning the topic and orphaning its state. Give keys a canonical codec (Codec::utf8, Codec::int64, Codec::bytes, or plain Avro without a registry), or accept the risk with Topic::allow_registry_framed_key"
    )]
    RegistryFramedKey {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
        /// The key codec's name.
        codec: String,
    },
    /// Two sources whose records fold into the stage's state declare
    /// different partitioners: one key would reach different tasks from
    /// each, and its state would split between them.
    #[error(
        "stage {stage:?}: its stateful sources place keys with different partitioners ({}); a key's records from each would reach different tasks and split its state. Declare the same Topic::partitioned_by on every stateful source (and have their producers use it)",
        topics.iter().map(|(t, p)| format!("{t}: {p:?}")).collect::<Vec<_>>().join(", ")
    )]
    PartitionersDiffer {
        /// The stage.
        stage: String,
        /// Each stateful source with its partitioner.
        topics: Vec<(String, crate::partition::Partitioner)>,
    },
    /// A tick interval of zero.
    #[error("stage {stage:?} declares a tick interval of zero; use a positive interval")]
    ZeroTickInterval {
        /// The stage.
        stage: String,
    },
}
