//! # parsley-kafka: Parsley on a Kafka cluster
//!
//! This crate is the production host: it drives the host core
//! ([`parsley::runtime::worker::Worker`]) through rdkafka, and makes no
//! decisions of its own. What is here so far is its cluster access, which
//! the worker reads through the same traits the TestDriver and the
//! simulator implement:
//!
//! * [`KafkaCluster`]: topic ids and partition counts (DescribeTopics),
//!   end offsets and log starts (watermarks), with definitive absence by
//!   topic id (a topic recreated under the same name is another channel).
//!
//! The exactly-once stream threads come next.
//!
//! ## Tests against a broker
//!
//! The broker suite runs against any Kafka-protocol broker named by
//! `PARSLEY_BOOTSTRAP` (the README's test command starts a local Apache
//! Kafka and sets it). The tests create topics with unique names and
//! delete them afterwards.
#![deny(unsafe_code)]

mod changelog;
mod cluster;
mod streams;
pub mod topic_ids;

pub use cluster::KafkaCluster;
pub use streams::{CausalStreams, StreamsError, StreamsOptions, StreamsState};
