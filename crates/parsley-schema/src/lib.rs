//! Schema-registry codecs for Parsley.
//!
//! Records in Confluent's wire format carry a zero byte and a 4-byte schema
//! id before their payload ([`framing`]). This crate gives Parsley
//! [`Codec`](parsley::Codec)s for them, with the registry client and its caching:
//!
//! * [`AvroCodec`]: Avro in the registry's framing, typed through serde or
//!   generic ([`apache_avro::types::Value`]). Encoding registers (or looks
//!   up) the codec's schema under a subject ([`SubjectNameStrategy`]);
//!   decoding reads the writer's schema by the frame's id and resolves it
//!   into the codec's, so records written under an older compatible schema
//!   decode into the current type.
//! * [`JsonSchemaCodec`]: JSON through serde in the same framing.
//! * [`PlainAvro`]: Avro without a registry or framing, the schema known to
//!   both sides.
//! * [`SchemaRegistry`]: the client, blocking, with a timeout on every
//!   request, basic or bearer authentication and TLS settings; schema ids
//!   and registrations are cached, so the registry is asked once per
//!   schema and never again on the hot path.
//!
//! # Failure
//!
//! Decoding happens when a record is delivered, so a registry that cannot
//! be reached fails that delivery with a *transient* codec error naming the
//! schema id ([`parsley::CodecError::is_transient`]). The step aborts and
//! nothing is skipped: the task retries the record after its backoff (on
//! Kafka, without an error handler of your own, it restarts in place as
//! often as needed). An id the registry does not know, a payload that does
//! not match its schema, or framing that is not the registry's fail the
//! task for good, through the same path as any codec error.
//!
//! # Keys
//!
//! Framed bytes begin with the schema id, so registering the key schema
//! again changes every key's bytes. Every codec of this crate is marked
//! [`Codec::registry_framed`](parsley::Codec::registry_framed), and a stage refuses one on a key unless the
//! topic accepts it with
//! [`Topic::allow_registry_framed_key`](parsley::Topic::allow_registry_framed_key).
//! Give keys a canonical codec (`Codec::utf8`, `Codec::int64`,
//! [`PlainAvro`]) instead.
//!
//! # Protobuf
//!
//! Not provided: a Protobuf codec needs the `.proto` source to register
//! and a runtime descriptor to read the message indexes the framing adds,
//! which the common Rust Protobuf crates do not give together. See the
//! project's decisions log.

#![deny(unsafe_code)]

pub mod avro;
pub mod framing;
pub mod json_schema;
pub mod registry;
mod resolving;
mod subject;

pub use apache_avro;
pub use avro::{AvroCodec, PlainAvro};
pub use framing::FramingError;
pub use json_schema::JsonSchemaCodec;
pub use registry::{
    BearerToken, RegisteredSchema, RegistryConfig, SchemaReference, SchemaRegistry, SchemaType,
};
pub use subject::SubjectNameStrategy;

use parsley::CodecError;

/// Why a registry codec or the registry client failed. Each says whether
/// it passes with time ([`is_transient`](Self::is_transient)).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The registry could not be reached, timed out, or answered that it
    /// cannot serve now (5xx, 429). Transient.
    #[error(
        "{what}: the schema registry is unavailable ({reason}); the record is retried, not skipped"
    )]
    Unavailable {
        /// The request (it names the schema id or subject).
        what: String,
        /// What the transport or the registry said.
        reason: String,
    },
    /// A frame names a schema id the registry does not hold: the record was
    /// written against another registry, or its schema was deleted.
    #[error(
        "schema id {id} is not known to the registry: the record was written against another registry, or the schema was deleted"
    )]
    UnknownSchemaId {
        /// The id in the frame.
        id: u32,
    },
    /// Looking up a schema (with registration off) found none under the
    /// subject.
    #[error(
        "subject {subject:?} does not hold this schema and the codec does not register schemas ({message}); register it, or build the codec with auto_register(true)"
    )]
    NotRegistered {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
    /// The registry refused the schema under the subject's compatibility
    /// rule.
    #[error(
        "the registry refused the schema under subject {subject:?} as incompatible with the versions it holds: {message}"
    )]
    Incompatible {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
    /// The registry refused the credentials.
    #[error("{what}: the registry refused the credentials ({status}): {message}")]
    Unauthorized {
        /// The request.
        what: String,
        /// 401 or 403.
        status: u16,
        /// The registry's message.
        message: String,
    },
    /// Any other refusal.
    #[error("{what}: the registry answered {status}{}: {message}", .code.map(|c| format!(" (error code {c})")).unwrap_or_default())]
    Refused {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The registry's error code, if it gave one.
        code: Option<i64>,
        /// The registry's message.
        message: String,
    },
    /// The registry's answer was not what the Confluent API returns.
    #[error("{0}")]
    Protocol(String),
    /// The client's configuration cannot be used (a malformed URL, a
    /// certificate that does not parse).
    #[error("schema registry configuration: {0}")]
    Config(String),
    /// The bytes are not a registry frame.
    #[error(transparent)]
    Framing(#[from] FramingError),
    /// The id names a schema of another kind than the codec reads.
    #[error("schema id {id} is a {found} schema; this codec reads {expected}")]
    WrongSchemaType {
        /// The id.
        id: u32,
        /// What the registry holds under it.
        found: SchemaType,
        /// What the codec reads.
        expected: SchemaType,
    },
    /// A schema reference names a subject version the registry does not
    /// hold.
    #[error("version {version} of subject {subject:?} is not known to the registry")]
    UnknownVersion {
        /// The subject.
        subject: String,
        /// The version.
        version: i32,
    },
    /// Schema references that go deeper than the client follows (a cycle
    /// among registered schemas, most likely).
    #[error(
        "schema id {id}: its references nest deeper than {limit} levels; check them for a cycle"
    )]
    References {
        /// The id.
        id: u32,
        /// How deep the client follows them.
        limit: usize,
    },
    /// A schema is not valid.
    #[error("{0}")]
    Schema(String),
    /// The subject strategy needs a record name and the schema has none.
    #[error(
        "the subject strategy {strategy:?} needs a named schema (an Avro record, enum or fixed; a JSON schema's title); use SubjectNameStrategy::TopicName"
    )]
    NoRecordName {
        /// The strategy.
        strategy: SubjectNameStrategy,
    },
    /// An Avro payload or value did not match its schema.
    #[error("{}{message}", .id.map(|i| format!("schema id {i}: ")).unwrap_or_default())]
    Avro {
        /// The schema id, for framed records.
        id: Option<u32>,
        /// What went wrong.
        message: String,
    },
    /// A JSON payload or value did not (de)serialize.
    #[error("{}JSON: {message}", .id.map(|i| format!("schema id {i}: ")).unwrap_or_default())]
    Json {
        /// The schema id.
        id: Option<u32>,
        /// What went wrong.
        message: String,
    },
}

impl SchemaError {
    /// Whether the failure passes with time: only a registry that is
    /// unavailable. A task that meets one retries its record.
    pub fn is_transient(&self) -> bool {
        matches!(self, SchemaError::Unavailable { .. })
    }
}

/// The codec error for `e`, transient when `e` is.
pub(crate) fn codec_error(e: SchemaError) -> CodecError {
    if e.is_transient() {
        CodecError::transient(e)
    } else {
        CodecError::from_source(e)
    }
}
