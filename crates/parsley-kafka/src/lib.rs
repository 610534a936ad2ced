//! # parsley-kafka: Parsley on a Kafka cluster
//!
//! The production host. [`CausalStreams`] runs a [`parsley::Parsley`]
//! application on a cluster under exactly-once v2: one OS thread per stream
//! thread, each with a consumer in the application's group and a
//! transactional producer, driving the host core
//! ([`parsley::runtime::worker::Worker`]) and making no decisions of its
//! own, so the simulator has judged every one of them.
//!
//! * [`CausalStreams`]: `new(&app, client_config)`, `start()`,
//!   `wait_until_running`, `state()`, `close(timeout)`.
//! * [`KafkaCluster`]: topic ids and partition counts (DescribeTopics),
//!   end offsets (high watermarks) and log starts, changelog replay, with
//!   definitive absence by topic id (a topic recreated under the same name
//!   is another channel).
//! * [`topic_ids`]: the one module with `unsafe` code, binding librdkafka's
//!   DescribeTopics.
//!
//! ## Tests against a broker
//!
//! The broker suite runs against any Kafka-protocol broker named by
//! `PARSLEY_BOOTSTRAP` (the README's test command starts Apache Kafka and
//! sets it). The tests create topics with unique names.
#![deny(unsafe_code)]

mod changelog;
mod cluster;
mod policy;
mod streams;
pub mod topic_ids;

pub use cluster::KafkaCluster;
pub use policy::{ErrorHandler, ErrorResponse};
pub use streams::{CausalStreams, StreamsError, StreamsOptions, StreamsState};
