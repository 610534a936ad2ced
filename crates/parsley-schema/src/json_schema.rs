//! JSON Schema in Confluent's framing: the value as JSON through serde,
//! after the frame of the schema registered for it.
//!
//! Like Confluent's own JSON Schema serializer with its defaults, the codec
//! does not validate values against the schema: the schema is registered
//! (so the registry's compatibility rules apply to it) and its id written
//! in the frame, and decoding checks that the id names a JSON schema the
//! registry knows. Validation would need a JSON Schema validator, a large
//! dependency for a check the producer's type already makes.

use std::fmt;
use std::sync::Arc;

use parsley::{Codec, Part};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::framing::unframe;
use crate::registry::{SchemaRegistry, SchemaType};
use crate::subject::Registration;
use crate::{SchemaError, SubjectNameStrategy, codec_error};

/// Builds JSON Schema codecs in Confluent's framing.
///
/// ```no_run
/// use parsley::{Codec, Topic};
/// use parsley_schema::{JsonSchemaCodec, SchemaRegistry};
///
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: String, total: i64 }
///
/// let schema = serde_json::json!({
///     "$schema": "http://json-schema.org/draft-07/schema#",
///     "title": "Order",
///     "type": "object",
///     "properties": {"id": {"type": "string"}, "total": {"type": "integer"}}
/// });
/// let registry = SchemaRegistry::at("http://registry:8081")?;
/// let orders: Topic<String, Order> = Topic::new(
///     "orders",
///     Codec::utf8(),
///     JsonSchemaCodec::value(&registry, "orders", schema).typed()?,
/// );
/// # Ok::<(), parsley_schema::SchemaError>(())
/// ```
#[derive(Clone)]
pub struct JsonSchemaCodec {
    registration: Registration,
    schema: serde_json::Value,
}

impl fmt::Debug for JsonSchemaCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonSchemaCodec")
            .field("registration", &self.registration)
            .finish_non_exhaustive()
    }
}

impl JsonSchemaCodec {
    /// A codec for the values of `topic` under `schema`.
    pub fn value(registry: &SchemaRegistry, topic: &str, schema: serde_json::Value) -> Self {
        JsonSchemaCodec {
            registration: Registration::new(registry, topic, Part::Value),
            schema,
        }
    }

    /// A codec for the keys of `topic`; refused by a stage unless the
    /// topic accepts framed keys, as [`AvroCodec::key`](crate::AvroCodec::key).
    pub fn key(registry: &SchemaRegistry, topic: &str, schema: serde_json::Value) -> Self {
        JsonSchemaCodec {
            registration: Registration::new(registry, topic, Part::Key),
            schema,
        }
    }

    /// The subject naming strategy; the record name is the schema's
    /// `title`, as in Confluent's JSON Schema serializer.
    pub fn subject_names(mut self, strategy: SubjectNameStrategy) -> Self {
        self.registration.strategy = strategy;
        self
    }

    /// Whether the first encoding registers the schema (the default) or
    /// only looks it up, as [`AvroCodec::auto_register`](crate::AvroCodec::auto_register).
    pub fn auto_register(mut self, register: bool) -> Self {
        self.registration.auto_register = register;
        self
    }

    /// The subject the codec registers its schema under.
    pub fn subject(&self) -> Result<String, SchemaError> {
        self.registration.subject(self.title())
    }

    fn title(&self) -> Option<&str> {
        self.schema.get("title").and_then(|t| t.as_str())
    }

    /// The codec for a serde type.
    pub fn typed<T>(self) -> Result<Codec<T>, SchemaError>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let title = self.title().map(str::to_owned);
        let own = Arc::new(self.registration.id_of(
            title.as_deref(),
            SchemaType::Json,
            self.schema.to_string(),
        )?);
        let name = format!("json-schema({})", own.subject());
        let enc = own.clone();
        Ok(Codec::try_new(
            move |v: &T| {
                enc.frame(|id, out| {
                    serde_json::to_writer(out, v).map_err(|e| SchemaError::Json {
                        id: Some(id),
                        message: e.to_string(),
                    })
                })
                .map_err(codec_error)
            },
            move |b: &[u8]| {
                let frame = unframe(b).map_err(|e| codec_error(e.into()))?;
                let registered = own.registry().schema(frame.id).map_err(codec_error)?;
                if registered.schema_type != SchemaType::Json {
                    return Err(codec_error(SchemaError::WrongSchemaType {
                        id: frame.id,
                        found: registered.schema_type,
                        expected: SchemaType::Json,
                    }));
                }
                serde_json::from_slice(frame.payload).map_err(|e| {
                    codec_error(SchemaError::Json {
                        id: Some(frame.id),
                        message: e.to_string(),
                    })
                })
            },
        )
        .named(name)
        .registry_framed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_strategy_and_the_schemas_title() {
        let r = SchemaRegistry::at("http://127.0.0.1:9").unwrap();
        let titled = serde_json::json!({"title": "shop.Order", "type": "object"});
        let untitled = serde_json::json!({"type": "object"});
        let subject = |schema: &serde_json::Value, s| {
            JsonSchemaCodec::value(&r, "orders", schema.clone())
                .subject_names(s)
                .subject()
        };
        use SubjectNameStrategy::*;
        assert_eq!(subject(&titled, TopicName).unwrap(), "orders-value");
        assert_eq!(subject(&titled, RecordName).unwrap(), "shop.Order");
        assert_eq!(
            subject(&titled, TopicRecordName).unwrap(),
            "orders-shop.Order"
        );
        assert!(matches!(
            subject(&untitled, RecordName),
            Err(SchemaError::NoRecordName { .. })
        ));
        assert_eq!(
            JsonSchemaCodec::key(&r, "orders", untitled)
                .subject()
                .unwrap(),
            "orders-key"
        );
        // Framed, so refused on keys unless accepted.
        let codec: Codec<i64> = JsonSchemaCodec::value(&r, "t", titled).typed().unwrap();
        assert!(codec.is_registry_framed());
        assert_eq!(codec.name(), "json-schema(t-value)");
    }
}
