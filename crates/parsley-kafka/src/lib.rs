//! # parsley-kafka: Parsley on a Kafka cluster
//!
//! The production host. [`CausalStreams`] runs a [`parsley::Parsley`]
//! application on a cluster under exactly-once v2: one OS thread per stream
//! thread, each with a consumer in the application's group and a
//! transactional producer, driving the host core
//! ([`parsley::runtime::worker::Worker`]) and making almost no decisions
//! of its own, so the simulator has judged them. It sorts each client
//! error by librdkafka's own flags and codes into a
//! [`Fault`](parsley::runtime::worker::Fault) and does what the worker
//! answers; what a task's failure leads to is the error handlers' call
//! ([`CausalStreams::set_uncaught_error_handler`],
//! [`CausalStreams::set_production_error_handler`]). Two decisions still
//! sit here: a closing thread leaves an assignment that arrives meanwhile
//! untaken (and abandons the lookups of one it was starting), and without
//! a handler of the user's a task's *transient* failure (a codec that could
//! not reach its schema registry, [`StreamsError::is_transient`]) restarts
//! the task in place after its backoff instead of shutting the client down.
//!
//! * [`CausalStreams`]: `new(&app, client_config)`, `start()`,
//!   `wait_until_running`, `state()`, `close(timeout)`.
//! * [`KafkaCluster`]: topic ids and partition counts (DescribeTopics),
//!   end offsets (high watermarks) and log starts, changelog replay, with
//!   definitive absence by topic id (a topic recreated under the same name
//!   is another channel).
//! * [`topic_ids`]: the one module with `unsafe` code, binding librdkafka's
//!   DescribeTopics.
//! * [`clients`]: [`CausalClock`] for plain rdkafka producers, and
//!   `read_causal` for any consumed record. They need no stage runtime:
//!   with `default-features = false` (no `streams` feature) the crate
//!   builds without `parsley` itself.
//! * [`probe_cluster`]: the cluster contract probes (topics exist, sources
//!   co-partitioned, tick topics as wide as their widest source), read-only.
//! * Operating it: [`CausalStreams::metrics`], [`CausalStreams::explain_holds`],
//!   [`CausalStreams::set_uncaught_error_handler`] and
//!   [`CausalStreams::set_production_error_handler`].
//! * Querying it: [`CausalStreams::query`] reads a key's committed fold
//!   state from this instance, and [`CausalStreams::query_after`] first
//!   waits for the causes a clock claims (read-your-writes);
//!   [`topology()`] describes the application with the runtime's topics.
//!
//! ## Tests against a broker
//!
//! The broker suite runs against any Kafka-protocol broker named by
//! `PARSLEY_BOOTSTRAP` (the README's test command starts Apache Kafka and
//! sets it). The tests create topics with unique names.
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "streams")]
mod changelog;
pub mod clients;
#[cfg(feature = "streams")]
mod cluster;
#[cfg(feature = "streams")]
pub mod diagnostics;
#[cfg(feature = "streams")]
mod error;
pub mod logs;
#[cfg(feature = "streams")]
mod policy;
#[cfg(feature = "streams")]
mod settings;
#[cfg(feature = "streams")]
pub mod state_dir;
#[cfg(feature = "streams")]
mod streams;
pub mod topic_ids;
#[cfg(feature = "streams")]
mod topology;

pub use clients::{CausalClock, ClockError};
#[cfg(feature = "streams")]
pub use cluster::KafkaCluster;
pub use logs::ClientLogs;
#[cfg(feature = "streams")]
pub use parsley::{HeldRecord, probe_cluster};
#[cfg(feature = "streams")]
pub use policy::{
    ErrorHandler, ErrorResponse, ProductionHandler, ProductionResponse, RefusedRecord,
};
#[cfg(feature = "streams")]
pub use state_dir::StateDirError;
#[cfg(feature = "streams")]
pub use streams::{
    Backoff, CausalStreams, DEFAULT_COMMIT_WHEN_IDLE, GroupProtocol, KeyHost, QueryError,
    RestoreListener, Restores, StreamsError, StreamsOptions, StreamsState,
};
#[cfg(feature = "streams")]
pub use topology::topology;
