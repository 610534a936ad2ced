//! Avro codecs: in a schema registry's framing ([`AvroCodec`]), or plain,
//! with the schema known to both sides ([`PlainAvro`]).
//!
//! Both come in two shapes: typed, for any `T: Serialize +
//! DeserializeOwned` whose serde layout matches the schema (a struct for a
//! record, `Option` for a union with `null`), and generic, for the Avro
//! crate's own [`Value`]. A schema can be written by hand and parsed with
//! [`Schema::parse_str`], or derived from the type with
//! `#[derive(AvroSchema)]` ([`AvroCodec::value_of`]).
//!
//! Decoding resolves the writer's schema into the reader's (the one the
//! codec was built with), so a record written under an older compatible
//! schema decodes into the current type: a field added with a default is
//! filled in, a removed one skipped. Bytes left over after the datum, a
//! payload the writer schema cannot read, or a value the reader schema
//! cannot hold fail the decoding, as the codec contract asks.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use apache_avro::schema::ResolvedSchema;
use apache_avro::types::Value;
use apache_avro::writer::datum::{GenericDatumWriter, write_avro_datum_ref};
use apache_avro::{AvroSchema, Schema};
use parsley::{Codec, CodecError, Part};
use self_cell::self_cell;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::framing::unframe;
use crate::registry::{SchemaReference, SchemaRegistry, SchemaType};
use crate::resolving::Plan;
use crate::subject::{Registration, SchemaId};
use crate::{SchemaError, SubjectNameStrategy, codec_error};

/// Builds Avro codecs in Confluent's framing: registers (or looks up) the
/// codec's schema under its subject on the first encoding, resolves a
/// record's writer schema by the id in its frame on decoding, and caches
/// both, so the registry is asked once per schema.
///
/// ```no_run
/// use parsley::{Codec, Topic};
/// use parsley_schema::{AvroCodec, SchemaRegistry};
/// use parsley_schema::apache_avro::AvroSchema;
///
/// #[derive(AvroSchema, serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// #[avro(namespace = "shop")]
/// struct Order { id: String, total: i64 }
///
/// let registry = SchemaRegistry::at("http://registry:8081")?;
/// let orders: Topic<String, Order> = Topic::new(
///     "orders",
///     Codec::utf8(),
///     AvroCodec::value_of::<Order>(&registry, "orders").typed()?,
/// );
/// # Ok::<(), parsley_schema::SchemaError>(())
/// ```
#[derive(Clone)]
pub struct AvroCodec {
    registration: Registration,
    schema: Schema,
    /// The schema's text as the user gave it, registered as it is.
    text: Option<String>,
    /// A registered schema to write with instead of the codec's own.
    pin: Option<Pin>,
}

/// A registered schema an encoder writes with, instead of registering or
/// looking up its own.
#[derive(Clone, Copy, Debug)]
enum Pin {
    /// The subject's latest version (`use.latest.version`).
    Latest,
    /// The schema of this id (`use.schema.id`).
    Id(u32),
}

impl fmt::Debug for AvroCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AvroCodec")
            .field("registration", &self.registration)
            .finish_non_exhaustive()
    }
}

impl AvroCodec {
    /// A codec for the values of `topic`, reading and writing `schema`.
    ///
    /// The schema is registered as apache-avro writes it out. When the
    /// same schema is also registered by other clients from a `.avsc`
    /// file, prefer [`value_text`](Self::value_text) with that file's text:
    /// a registry that compares schemas as text (Apicurio's, among others)
    /// then gives both clients one id whichever registers first.
    pub fn value(registry: &SchemaRegistry, topic: &str, schema: Schema) -> Self {
        AvroCodec {
            registration: Registration::new(registry, topic, Part::Value),
            schema,
            text: None,
            pin: None,
        }
    }

    /// A codec for the values of `topic`, with the schema given as text (an
    /// `.avsc` file's contents, say): the text is parsed, and registered
    /// exactly as given, as Confluent's clients register the text they are
    /// given.
    ///
    /// ```no_run
    /// use parsley_schema::{AvroCodec, SchemaRegistry};
    ///
    /// let registry = SchemaRegistry::at("http://registry:8081")?;
    /// let avsc = r#"{"type": "record", "name": "Order", "namespace": "shop",
    ///     "fields": [{"name": "id", "type": "string"}]}"#;
    /// let codec = AvroCodec::value_text(&registry, "orders", avsc)?.generic()?;
    /// # Ok::<(), parsley_schema::SchemaError>(())
    /// ```
    pub fn value_text(
        registry: &SchemaRegistry,
        topic: &str,
        text: &str,
    ) -> Result<Self, SchemaError> {
        AvroCodec::value(registry, topic, parse_text(text)?).with_text(text)
    }

    /// A codec for the keys of `topic`, with the schema given as text and
    /// registered as given (see [`value_text`](Self::value_text) and
    /// [`key`](Self::key)).
    pub fn key_text(
        registry: &SchemaRegistry,
        topic: &str,
        text: &str,
    ) -> Result<Self, SchemaError> {
        AvroCodec::key(registry, topic, parse_text(text)?).with_text(text)
    }

    /// The codec registering `text` (which its schema was parsed from).
    fn with_text(self, text: &str) -> Result<Self, SchemaError> {
        Ok(AvroCodec {
            text: Some(text.to_owned()),
            ..self
        })
    }

    /// A codec for the values of `topic`, with the schema `T` derives.
    pub fn value_of<T: AvroSchema>(registry: &SchemaRegistry, topic: &str) -> Self {
        AvroCodec::value(registry, topic, T::get_schema())
    }

    /// A codec for the keys of `topic`. A stage refuses it unless the topic
    /// accepts framed keys
    /// ([`Topic::allow_registry_framed_key`](parsley::Topic::allow_registry_framed_key)):
    /// framed key bytes change when the key schema is registered again.
    pub fn key(registry: &SchemaRegistry, topic: &str, schema: Schema) -> Self {
        AvroCodec {
            registration: Registration::new(registry, topic, Part::Key),
            schema,
            text: None,
            pin: None,
        }
    }

    /// The subject naming strategy; [`SubjectNameStrategy::TopicName`]
    /// unless set.
    pub fn subject_names(mut self, strategy: SubjectNameStrategy) -> Self {
        self.registration.strategy = strategy;
        self
    }

    /// Whether the first encoding registers the schema (the default, as
    /// Confluent's `auto.register.schemas`), or only looks up the id a
    /// schema already registered has, failing with
    /// [`SchemaError::NotRegistered`] otherwise: for registries whose
    /// schemas are registered by a deploy pipeline.
    pub fn auto_register(mut self, register: bool) -> Self {
        self.registration.auto_register = register;
        self
    }

    /// Whether the registry is asked to normalize the schema when the codec
    /// registers it (Confluent's `normalize.schemas`); off unless set.
    /// Lookups are always normalized, whatever this says: see
    /// [`SchemaRegistry::lookup`].
    pub fn normalize(mut self, normalize: bool) -> Self {
        self.registration.normalize = normalize;
        self
    }

    /// Encodes with the latest version registered under the subject, and
    /// frames with its id, instead of registering or looking up the codec's
    /// own schema (Confluent's `use.latest.version`): for subjects whose
    /// schemas a Java producer or Kafka Connect registered, with
    /// properties (`avro.java.string`, `connect.*`) or a spelling the
    /// codec's schema cannot reproduce. Values are written by that schema
    /// (a field it adds with a default takes the default). The latest
    /// version is read once, at the first encoding; a codec built after a
    /// new version is registered uses the new one. Decoding is unchanged.
    /// Schemas with references are not supported here.
    pub fn use_latest_version(mut self) -> Self {
        self.pin = Some(Pin::Latest);
        self
    }

    /// Encodes with the schema registered under `id`, and frames with that
    /// id (Confluent's `use.schema.id`); as
    /// [`use_latest_version`](Self::use_latest_version) otherwise.
    pub fn use_schema_id(mut self, id: u32) -> Self {
        self.pin = Some(Pin::Id(id));
        self
    }

    /// The subject the codec registers its schema under.
    pub fn subject(&self) -> Result<String, SchemaError> {
        self.registration.subject(self.record_name().as_deref())
    }

    fn record_name(&self) -> Option<String> {
        self.schema.name().map(|n| n.fullname(None))
    }

    /// The codec for a serde type whose layout matches the schema.
    pub fn typed<T>(self) -> Result<Codec<T>, SchemaError>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let core = Arc::new(self.core()?);
        let name = core.name();
        let enc = core.clone();
        Ok(Codec::try_new(
            move |v: &T| enc.encode_typed(v).map_err(codec_error),
            move |b: &[u8]| from_value(core.decode(b).map_err(codec_error)?),
        )
        .named(name)
        .registry_framed())
    }

    /// The codec for generic Avro values.
    pub fn generic(self) -> Result<Codec<Value>, SchemaError> {
        let core = Arc::new(self.core()?);
        let name = core.name();
        let enc = core.clone();
        Ok(Codec::try_new(
            move |v: &Value| enc.encode(v.clone()).map_err(codec_error),
            move |b: &[u8]| core.decode(b).map_err(codec_error),
        )
        .named(name)
        .registry_framed())
    }

    fn core(self) -> Result<Framed, SchemaError> {
        // The user's text, or the schema as JSON with everything in it
        // (defaults included, which the registry's compatibility checks
        // read), not its canonical form.
        let text = match self.text.clone() {
            Some(text) => text,
            None => serde_json::to_string(&self.schema)
                .map_err(|e| SchemaError::Schema(format!("the schema does not serialize: {e}")))?,
        };
        let record = self.record_name();
        Ok(Framed {
            own: self
                .registration
                .id_of(record.as_deref(), SchemaType::Avro, text)?,
            writes: Writes::of(&self.schema).map_err(SchemaError::Schema)?,
            pin: self.pin,
            pinned: std::sync::OnceLock::new(),
            reader: self.schema,
            writers: RwLock::default(),
        })
    }
}

/// One codec's state: its schema and its id once known, and the writer
/// schemas it has met, each with its reader.
struct Framed {
    own: SchemaId,
    writes: Writes,
    /// A registered schema to write with instead, and once fetched, its id
    /// and writer.
    pin: Option<Pin>,
    pinned: std::sync::OnceLock<(u32, Writes)>,
    reader: Schema,
    writers: RwLock<HashMap<u32, Arc<Reads>>>,
}

/// How deep the client follows schema references (a registry whose
/// references form a cycle would otherwise be followed forever).
const REFERENCE_DEPTH: usize = 32;

impl Framed {
    fn name(&self) -> String {
        format!("avro({})", self.own.subject())
    }

    /// The id to frame with and the schema to write with: the codec's own,
    /// or the pinned registered one, fetched at the first encoding.
    fn writes(&self) -> Result<(u32, &Writes), SchemaError> {
        let Some(pin) = self.pin else {
            return Ok((self.own.get()?, &self.writes));
        };
        if let Some((id, w)) = self.pinned.get() {
            return Ok((*id, w));
        }
        let registry = self.own.registry();
        let registered = match pin {
            Pin::Latest => registry.latest_version(self.own.subject())?,
            Pin::Id(id) => registry.schema(id)?,
        };
        if registered.schema_type != SchemaType::Avro {
            return Err(SchemaError::WrongSchemaType {
                id: registered.id,
                found: registered.schema_type,
                expected: SchemaType::Avro,
            });
        }
        if !registered.references.is_empty() {
            return Err(SchemaError::Schema(format!(
                "schema id {} refers to other subjects' schemas, which encoding with a registered schema ({pin:?}) does not support",
                registered.id
            )));
        }
        let schema = Schema::parse_str(&registered.text).map_err(|e| {
            SchemaError::Schema(format!(
                "schema id {} is not a valid Avro schema: {e}",
                registered.id
            ))
        })?;
        let w = Writes::of(&schema).map_err(SchemaError::Schema)?;
        let (id, w) = self.pinned.get_or_init(|| (registered.id, w));
        Ok((*id, w))
    }

    /// A frame: the header of the schema written with, then what `write`
    /// appends with that schema.
    fn framed(
        &self,
        write: impl FnOnce(&Writes, &mut Vec<u8>) -> Result<(), String>,
    ) -> Result<Vec<u8>, SchemaError> {
        let (id, w) = self.writes()?;
        let mut out = crate::framing::header(id, 64);
        write(w, &mut out).map_err(|message| SchemaError::Avro {
            id: Some(id),
            message,
        })?;
        Ok(out)
    }

    fn encode(&self, value: Value) -> Result<Vec<u8>, SchemaError> {
        self.framed(|w, out| w.value(value, out))
    }

    fn encode_typed<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, SchemaError> {
        self.framed(|w, out| w.typed(value, out))
    }

    fn writer(&self, id: u32) -> Result<Arc<Reads>, SchemaError> {
        if let Some(s) = self
            .writers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            return Ok(s.clone());
        }
        let registered = self.own.registry().schema(id)?;
        if registered.schema_type != SchemaType::Avro {
            return Err(SchemaError::WrongSchemaType {
                id,
                found: registered.schema_type,
                expected: SchemaType::Avro,
            });
        }
        let mut referenced = Vec::new();
        let mut seen = HashSet::new();
        self.referenced(id, &registered.references, 0, &mut seen, &mut referenced)?;
        let (schema, named) =
            Schema::parse_str_with_list(&registered.text, &referenced).map_err(|e| {
                SchemaError::Schema(format!("schema id {id} is not a valid Avro schema: {e}"))
            })?;
        // A writer that is the reader's own schema needs no resolution.
        let reader = (!named.is_empty() || schema != self.reader).then(|| self.reader.clone());
        let writer = Arc::new(
            Reads::of(schema, named, reader)
                .map_err(|e| SchemaError::Schema(format!("schema id {id}: {e}")))?,
        );
        self.writers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, writer.clone());
        Ok(writer)
    }

    /// The texts of the schemas `references` name, each after the ones it
    /// refers to in turn, each once.
    fn referenced(
        &self,
        id: u32,
        references: &[SchemaReference],
        depth: usize,
        seen: &mut HashSet<(String, i32)>,
        out: &mut Vec<String>,
    ) -> Result<(), SchemaError> {
        if references.is_empty() {
            return Ok(());
        }
        if depth >= REFERENCE_DEPTH {
            return Err(SchemaError::References {
                id,
                limit: REFERENCE_DEPTH,
            });
        }
        for r in references {
            if !seen.insert((r.subject.clone(), r.version)) {
                continue;
            }
            let s = self.own.registry().schema_version(&r.subject, r.version)?;
            self.referenced(id, &s.references, depth + 1, seen, out)?;
            out.push(s.text.clone());
        }
        Ok(())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Value, SchemaError> {
        let frame = unframe(bytes)?;
        self.writer(frame.id)?
            .read(frame.payload)
            .map_err(|message| SchemaError::Avro {
                id: Some(frame.id),
                message,
            })
    }
}

/// Avro without a registry: the datum alone, no framing, with the schema
/// known to both sides. For teams that run no registry and fix the schema
/// in code.
///
/// ```
/// use parsley_schema::PlainAvro;
/// use parsley_schema::apache_avro::Schema;
///
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Reading { sensor: i64, value: f64 }
///
/// let schema = Schema::parse_str(r#"{"type": "record", "name": "Reading",
///     "fields": [{"name": "sensor", "type": "long"}, {"name": "value", "type": "double"}]}"#)?;
/// let codec = PlainAvro::new(schema).typed::<Reading>();
/// let r = Reading { sensor: 7, value: 1.5 };
/// let bytes = codec.encode(&r)?;
/// assert_eq!(bytes[0], 14); // 7, zigzag-encoded
/// assert_eq!(codec.decode(&bytes)?, r);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PlainAvro {
    writer: Arc<Schema>,
    /// The reader's schema, when it differs from the writer's.
    reader: Option<Arc<Schema>>,
}

impl fmt::Debug for PlainAvro {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainAvro")
            .field("evolving", &self.reader.is_some())
            .finish_non_exhaustive()
    }
}

impl PlainAvro {
    /// Reads and writes `schema`.
    pub fn new(schema: Schema) -> Self {
        PlainAvro {
            writer: Arc::new(schema),
            reader: None,
        }
    }

    /// Reads bytes written with `writer` into `reader` (an evolved schema
    /// compatible with it), and writes `reader`.
    pub fn evolving(writer: Schema, reader: Schema) -> Self {
        let reader = (reader != writer).then(|| Arc::new(reader));
        PlainAvro {
            writer: Arc::new(writer),
            reader,
        }
    }

    fn writes(&self) -> Result<Writes, String> {
        Writes::of(self.reader.as_deref().unwrap_or(&self.writer))
    }

    fn reads(&self) -> Result<Reads, String> {
        Reads::of(
            Schema::clone(&self.writer),
            Vec::new(),
            self.reader.as_deref().cloned(),
        )
    }

    /// The codec for a serde type whose layout matches the schema.
    pub fn typed<T>(self) -> Codec<T>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let (writes, reads) = (self.writes(), self.reads());
        Codec::try_new(
            move |v: &T| {
                let mut out = Vec::with_capacity(64);
                writes
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|w| w.typed(v, &mut out))
                    .map_err(plain_error)?;
                Ok::<_, CodecError>(out)
            },
            move |b: &[u8]| {
                from_value(
                    reads
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|r| r.read(b))
                        .map_err(plain_error)?,
                )
            },
        )
        .named("avro")
    }

    /// The codec for generic Avro values.
    pub fn generic(self) -> Codec<Value> {
        let (writes, reads) = (self.writes(), self.reads());
        Codec::try_new(
            move |v: &Value| {
                let mut out = Vec::with_capacity(64);
                writes
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|w| w.value(v.clone(), &mut out))
                    .map_err(plain_error)?;
                Ok::<_, CodecError>(out)
            },
            move |b: &[u8]| {
                reads
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|r| r.read(b))
                    .map_err(plain_error)
            },
        )
        .named("avro")
    }
}

fn parse_text(text: &str) -> Result<Schema, SchemaError> {
    Schema::parse_str(text)
        .map_err(|e| SchemaError::Schema(format!("the text is not a valid Avro schema: {e}")))
}

fn plain_error(message: String) -> CodecError {
    codec_error(SchemaError::Avro { id: None, message })
}

self_cell!(
    /// The schema values are written with, its named types indexed once
    /// instead of per record.
    struct Writes {
        owner: Schema,
        #[covariant]
        dependent: ResolvedSchema,
    }
);

impl Writes {
    fn of(schema: &Schema) -> Result<Self, String> {
        Writes::try_new(schema.clone(), |s| ResolvedSchema::new(s))
            .map_err(|e| format!("the schema's named types do not resolve: {e}"))
    }

    /// Writes a serde value as a datum after `out`'s bytes, serialized
    /// straight into the schema's layout. A value whose serde shape is
    /// not the schema's own, but resolves to it, is written through Avro's
    /// generic value and its resolution instead: a `Vec<u8>` serializes as
    /// a sequence of numbers, which the direct path cannot write as
    /// `bytes` or `fixed`.
    fn typed<T: Serialize>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        let start = out.len();
        let direct = write_avro_datum_ref(
            self.borrow_owner(),
            self.borrow_dependent().get_names(),
            value,
            out,
        );
        let Err(direct) = direct else {
            return Ok(());
        };
        out.truncate(start);
        let resolved = apache_avro::to_value(value)
            .map_err(|e| e.to_string())
            .and_then(|v| write_datum(self.borrow_owner(), v, out));
        if resolved.is_err() {
            out.truncate(start);
            return Err(format!("the value does not fit the schema: {direct}"));
        }
        Ok(())
    }

    /// Writes a generic value as a datum after `out`'s bytes.
    fn value(&self, value: Value, out: &mut Vec<u8>) -> Result<(), String> {
        write_datum(self.borrow_owner(), value, out)
    }
}

/// A reader of one writer schema's datums into the reader's schema: the
/// two are matched once, when the writer schema is first met
/// ([`crate::resolving`]), not per record.
struct Reads(Plan);

impl Reads {
    fn of(writer: Schema, named: Vec<Schema>, reader: Option<Schema>) -> Result<Self, String> {
        Plan::new(&writer, &named, reader.as_ref())
            .map(Reads)
            .map_err(|e| format!("the schemas do not resolve: {e}"))
    }

    /// Reads one datum from the whole of `payload`: no byte missing, none
    /// left over.
    fn read(&self, payload: &[u8]) -> Result<Value, String> {
        self.0
            .read(payload)
            .map_err(|e| format!("the payload does not decode with the writer's schema: {e}"))
    }
}

fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, CodecError> {
    apache_avro::from_value(&v)
        .or_else(|e| {
            // A `Vec<u8>` (or `[u8; N]`) deserializes as a sequence, which
            // apache-avro does not make of `bytes` or `fixed`: read them as
            // sequences of numbers instead, as they were written.
            if holds_bytes(&v) {
                apache_avro::from_value(&bytes_as_numbers(v)).map_err(|_| e)
            } else {
                Err(e)
            }
        })
        .map_err(|e| {
            codec_error(SchemaError::Avro {
                id: None,
                message: format!("the decoded record does not fit the type: {e}"),
            })
        })
}

/// Whether a value holds `bytes` or `fixed` anywhere.
fn holds_bytes(v: &Value) -> bool {
    match v {
        Value::Bytes(_) | Value::Fixed(..) => true,
        Value::Union(_, inner) => holds_bytes(inner),
        Value::Array(items) => items.iter().any(holds_bytes),
        Value::Map(entries) => entries.values().any(holds_bytes),
        Value::Record(fields) => fields.iter().any(|(_, f)| holds_bytes(f)),
        _ => false,
    }
}

/// The value with every `bytes` and `fixed` as an array of its bytes.
fn bytes_as_numbers(v: Value) -> Value {
    let numbers = |b: Vec<u8>| Value::Array(b.into_iter().map(|x| Value::Int(x.into())).collect());
    match v {
        Value::Bytes(b) | Value::Fixed(_, b) => numbers(b),
        Value::Union(i, inner) => Value::Union(i, Box::new(bytes_as_numbers(*inner))),
        Value::Array(items) => Value::Array(items.into_iter().map(bytes_as_numbers).collect()),
        Value::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, f)| (k, bytes_as_numbers(f)))
                .collect(),
        ),
        Value::Record(fields) => Value::Record(
            fields
                .into_iter()
                .map(|(k, f)| (k, bytes_as_numbers(f)))
                .collect(),
        ),
        other => other,
    }
}

/// Writes `value` as a datum of `schema` after `out`'s bytes.
fn write_datum(schema: &Schema, value: Value, out: &mut Vec<u8>) -> Result<(), String> {
    // A value already in the schema's shape is written as it is. Others are
    // resolved first, which turns serde's shapes into the schema's: a `None`
    // into its union branch, a string into an enum symbol. (Resolving a
    // value that is already right is not harmless: apache-avro 0.22 refuses
    // a `bytes` decimal with fewer bytes than its precision could fill,
    // which is every small value.)
    let value = if value.validate(schema) {
        value
    } else {
        value
            .resolve(schema)
            .map_err(|e| format!("the value does not fit the schema: {e}"))?
    };
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_ref(out, &value))
        .map_err(|e| format!("the value does not encode: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &str) -> Schema {
        Schema::parse_str(&format!(
            r#"{{"type": "record", "name": "Order", "namespace": "shop", "fields": [{fields}]}}"#
        ))
        .unwrap()
    }

    fn v1() -> Schema {
        schema(r#"{"name": "id", "type": "string"}, {"name": "total", "type": "long"}"#)
    }

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
    struct Order {
        id: String,
        total: i64,
    }

    #[test]
    fn subjects_follow_the_strategy_and_the_record_name() {
        let r = SchemaRegistry::at("http://127.0.0.1:9").unwrap();
        use SubjectNameStrategy::*;
        let subject = |part_key: bool, schema: Schema, s| {
            let b = if part_key {
                AvroCodec::key(&r, "orders", schema)
            } else {
                AvroCodec::value(&r, "orders", schema)
            };
            b.subject_names(s).subject()
        };
        assert_eq!(subject(true, v1(), TopicName).unwrap(), "orders-key");
        assert_eq!(subject(false, v1(), TopicName).unwrap(), "orders-value");
        assert_eq!(subject(true, v1(), RecordName).unwrap(), "shop.Order");
        assert_eq!(
            subject(false, v1(), TopicRecordName).unwrap(),
            "orders-shop.Order"
        );
        // A primitive schema has no name to go by.
        assert!(matches!(
            subject(false, Schema::Long, RecordName),
            Err(SchemaError::NoRecordName { .. })
        ));
        let key: Codec<i64> = AvroCodec::key(&r, "orders", Schema::Long).typed().unwrap();
        assert!(key.is_registry_framed());
        assert_eq!(key.name(), "avro(orders-key)");
    }

    #[test]
    fn a_frame_written_by_confluents_serializer_decodes() {
        // confluent-kafka 2.16.2's AvroSerializer wrote these bytes for
        // {"id": "o-1", "total": 12} under schema id 3 (the schema above):
        // the zero byte, the id, then the datum.
        let fixture = [0x00, 0x00, 0x00, 0x00, 0x03, 0x06, b'o', b'-', b'1', 0x18];
        let f = crate::framing::unframe(&fixture).unwrap();
        assert_eq!(f.id, 3);
        let codec = PlainAvro::new(v1()).typed::<Order>();
        let order = Order {
            id: "o-1".into(),
            total: 12,
        };
        assert_eq!(codec.decode(f.payload).unwrap(), order);
        assert_eq!(
            crate::framing::frame(3, &codec.encode(&order).unwrap()),
            fixture
        );
    }

    #[test]
    fn the_datum_follows_the_avro_specification_byte_for_byte() {
        // Written by hand from the specification's binary encoding: longs
        // as zigzag varints, strings as a length then UTF-8, a union as
        // the branch's index then the value, fields in schema order.
        let s = schema(
            r#"{"name": "id", "type": "string"}, {"name": "total", "type": "long"},
               {"name": "note", "type": ["null", "string"]}"#,
        );
        #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Noted {
            id: String,
            total: i64,
            note: Option<String>,
        }
        let codec = PlainAvro::new(s).typed::<Noted>();
        let cases = [
            (
                Noted {
                    id: "".into(),
                    total: -1,
                    note: None,
                },
                vec![0x00, 0x01, 0x00],
            ),
            (
                Noted {
                    id: "é".into(),
                    total: 150,
                    note: Some("x".into()),
                },
                vec![0x04, 0xc3, 0xa9, 0xac, 0x02, 0x02, 0x02, b'x'],
            ),
        ];
        for (value, bytes) in cases {
            assert_eq!(codec.encode(&value).unwrap(), bytes, "{value:?}");
            assert_eq!(codec.decode(&bytes).unwrap(), value);
        }
    }

    #[test]
    fn plain_avro_resolves_an_old_writer_into_a_new_reader() {
        let v2 = schema(
            r#"{"name": "id", "type": "string"}, {"name": "total", "type": "long"},
               {"name": "currency", "type": "string", "default": "EUR"}"#,
        );
        #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
        struct OrderV2 {
            id: String,
            total: i64,
            currency: String,
        }
        let old = PlainAvro::new(v1())
            .typed::<Order>()
            .encode(&Order {
                id: "a".into(),
                total: 2,
            })
            .unwrap();
        let codec = PlainAvro::evolving(v1(), v2).typed::<OrderV2>();
        assert_eq!(
            codec.decode(&old).unwrap(),
            OrderV2 {
                id: "a".into(),
                total: 2,
                currency: "EUR".into()
            }
        );
    }

    #[test]
    fn payloads_that_do_not_match_the_schema_fail_loudly() {
        let codec = PlainAvro::new(v1()).typed::<Order>();
        let good = codec
            .encode(&Order {
                id: "a".into(),
                total: 1,
            })
            .unwrap();
        // Cut short, with a byte too many, or a string longer than the rest.
        for bad in [
            &good[..good.len() - 1],
            &[&good[..], &[0]].concat(),
            &[0x40, b'a'],
        ] {
            let e = codec.decode(bad).unwrap_err();
            assert!(!e.is_transient(), "{e}");
        }
        assert!(
            codec
                .decode(&[&good[..], &[0]].concat())
                .unwrap_err()
                .to_string()
                .contains("1 byte(s) left")
        );
        let generic = PlainAvro::new(v1()).generic();
        assert!(generic.encode(&Value::Long(1)).is_err());
        assert!(!generic.is_registry_framed());
    }

    /// A decimal is its unscaled value in as few bytes as it needs, which
    /// is fewer than its precision could fill: 1.00 at precision 10 is the
    /// one byte 100. Both ways work.
    #[test]
    fn a_small_decimal_is_written_and_read_in_its_own_bytes() {
        let s = Schema::parse_str(
            r#"{"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}"#,
        )
        .unwrap();
        let codec = PlainAvro::new(s).generic();
        let one = Value::Decimal(apache_avro::Decimal::from(vec![100u8]));
        let bytes = codec.encode(&one).unwrap();
        assert_eq!(bytes, [2, 100]);
        assert_eq!(codec.decode(&bytes).unwrap(), one);
    }

    #[test]
    fn a_vec_of_bytes_is_written_as_avro_bytes() {
        #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Blob {
            id: String,
            data: Vec<u8>,
        }
        let s = schema(r#"{"name": "id", "type": "string"}, {"name": "data", "type": "bytes"}"#);
        let codec = PlainAvro::new(s).typed::<Blob>();
        let blob = Blob {
            id: "b".into(),
            data: vec![0, 1, 0xff],
        };
        let bytes = codec.encode(&blob).unwrap();
        // The string, then the bytes: a length of 3 (zigzag 6) and the three.
        assert_eq!(bytes, [0x02, b'b', 0x06, 0, 1, 0xff]);
        assert_eq!(codec.decode(&bytes).unwrap(), blob);
        let whole = PlainAvro::new(Schema::Bytes).typed::<Vec<u8>>();
        assert_eq!(whole.encode(&vec![7, 8]).unwrap(), [0x04, 7, 8]);
        assert_eq!(whole.decode(&[0x04, 7, 8]).unwrap(), vec![7, 8]);
        // What fits neither way is still refused, with the direct path's
        // reason.
        let e = PlainAvro::new(Schema::Long)
            .typed::<Vec<u8>>()
            .encode(&vec![1])
            .unwrap_err();
        assert!(e.to_string().contains("does not fit the schema"), "{e}");
    }

    /// A schema whose datums end in an optional field, and the datum of one
    /// value with that field empty: its last byte is the union's index.
    fn memo_schema() -> Schema {
        Schema::parse_str(
            r#"{"type": "record", "name": "Payment", "namespace": "bank", "fields": [
                {"name": "version", "type": "int"},
                {"name": "account", "type": "string"},
                {"name": "amount", "type": "long"},
                {"name": "memo", "type": ["null", "string"]}]}"#,
        )
        .unwrap()
    }

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
    struct Payment {
        version: i32,
        account: String,
        amount: i64,
        memo: Option<String>,
    }

    #[test]
    fn a_datum_cut_short_is_refused_wherever_it_ends() {
        let codec = PlainAvro::new(memo_schema()).typed::<Payment>();
        let payment = Payment {
            version: 1,
            account: "acct-1".into(),
            amount: 1250,
            memo: None,
        };
        let datum = codec.encode(&payment).unwrap();
        // The frame issue 57 quoted (Confluent's serializer, schema id 1)
        // with the last byte it had lost: the version, the account, the
        // amount, then the union index 0 for the empty memo.
        assert_eq!(
            datum,
            crate::framing::unframe(&hex("0000000001020c616363742d31c41300"))
                .unwrap()
                .payload
        );
        assert_eq!(codec.decode(&datum).unwrap(), payment);
        let generic = PlainAvro::new(memo_schema()).generic();
        // Every proper prefix, the empty one included, and the one the
        // decoder alone read as a record with no memo (all but the union's
        // index), through the typed and the generic reader and resolving
        // into a reader schema.
        let evolving = PlainAvro::evolving(memo_schema(), memo_schema()).typed::<Payment>();
        for end in 0..datum.len() {
            let cut = &datum[..end];
            for e in [
                codec.decode(cut).unwrap_err(),
                generic.decode(cut).unwrap_err(),
                evolving.decode(cut).unwrap_err(),
            ] {
                assert!(!e.is_transient(), "{end}: {e}");
            }
        }
        let e = codec.decode(&datum[..datum.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("ends before its datum does"), "{e}");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
