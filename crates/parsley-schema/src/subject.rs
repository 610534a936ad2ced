//! Which registry subject a schema is registered (or looked up) under, and
//! the id it gets there.

use std::sync::{PoisonError, RwLock};

use parsley::Part;

use crate::{SchemaError, SchemaRegistry, SchemaType};

/// How a codec names the subject it registers its schema under, as
/// Confluent's serializers do (their `key.subject.name.strategy` and
/// `value.subject.name.strategy`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum SubjectNameStrategy {
    /// `<topic>-key` or `<topic>-value`: one schema line per topic and
    /// side. Confluent's default.
    #[default]
    TopicName,
    /// The record's full name (`shop.Order`): one schema line per record
    /// type, shared by every topic that carries it.
    RecordName,
    /// `<topic>-<full name>`: one line per record type on each topic, for
    /// topics that carry several record types.
    TopicRecordName,
}

impl SubjectNameStrategy {
    /// The subject for a schema named `record` (its full name, when it has
    /// one) on `part` of `topic`; `None` when the strategy needs a record
    /// name and the schema has none.
    ///
    /// ```
    /// use parsley::Part;
    /// use parsley_schema::SubjectNameStrategy::*;
    /// assert_eq!(TopicName.subject("orders", Part::Value, Some("shop.Order")).as_deref(), Some("orders-value"));
    /// assert_eq!(TopicName.subject("orders", Part::Key, None).as_deref(), Some("orders-key"));
    /// assert_eq!(RecordName.subject("orders", Part::Value, Some("shop.Order")).as_deref(), Some("shop.Order"));
    /// assert_eq!(TopicRecordName.subject("orders", Part::Value, Some("shop.Order")).as_deref(), Some("orders-shop.Order"));
    /// assert_eq!(RecordName.subject("orders", Part::Value, None), None);
    /// ```
    pub fn subject(self, topic: &str, part: Part, record: Option<&str>) -> Option<String> {
        match self {
            SubjectNameStrategy::TopicName => Some(match part {
                Part::Key => format!("{topic}-key"),
                Part::Value => format!("{topic}-value"),
            }),
            SubjectNameStrategy::RecordName => record.map(str::to_owned),
            SubjectNameStrategy::TopicRecordName => record.map(|r| format!("{topic}-{r}")),
        }
    }
}

/// Where and how a codec's schema is registered: the part of the
/// builders of [`AvroCodec`](crate::AvroCodec) and
/// [`JsonSchemaCodec`](crate::JsonSchemaCodec) that is the same for both.
#[derive(Clone, Debug)]
pub(crate) struct Registration {
    pub(crate) registry: SchemaRegistry,
    pub(crate) topic: String,
    pub(crate) part: Part,
    pub(crate) strategy: SubjectNameStrategy,
    pub(crate) auto_register: bool,
    pub(crate) normalize: bool,
}

impl Registration {
    pub(crate) fn new(registry: &SchemaRegistry, topic: &str, part: Part) -> Self {
        Registration {
            registry: registry.clone(),
            topic: topic.to_owned(),
            part,
            strategy: SubjectNameStrategy::TopicName,
            auto_register: true,
            normalize: false,
        }
    }

    /// The subject for a schema named `record`.
    pub(crate) fn subject(&self, record: Option<&str>) -> Result<String, SchemaError> {
        self.strategy
            .subject(&self.topic, self.part, record)
            .ok_or(SchemaError::NoRecordName {
                strategy: self.strategy,
            })
    }

    /// The id of `text` under the subject for `record`, found once.
    pub(crate) fn id_of(
        self,
        record: Option<&str>,
        schema_type: SchemaType,
        text: String,
    ) -> Result<SchemaId, SchemaError> {
        Ok(SchemaId {
            subject: self.subject(record)?,
            registry: self.registry,
            schema_type,
            text,
            auto_register: self.auto_register,
            normalize: self.normalize,
            id: RwLock::new(None),
        })
    }
}

/// A codec's own schema and its id, registered (or looked up) on first
/// use and then kept.
pub(crate) struct SchemaId {
    registry: SchemaRegistry,
    subject: String,
    schema_type: SchemaType,
    text: String,
    auto_register: bool,
    normalize: bool,
    id: RwLock<Option<u32>>,
}

impl SchemaId {
    pub(crate) fn subject(&self) -> &str {
        &self.subject
    }

    pub(crate) fn registry(&self) -> &SchemaRegistry {
        &self.registry
    }

    /// The id, asked of the registry the first time.
    pub(crate) fn get(&self) -> Result<u32, SchemaError> {
        if let Some(id) = *self.id.read().unwrap_or_else(PoisonError::into_inner) {
            return Ok(id);
        }
        let (subject, kind, text) = (&self.subject, self.schema_type, &self.text);
        let id = if self.auto_register && self.normalize {
            self.registry.register_normalized(subject, kind, text)?
        } else if self.auto_register {
            self.registry.register(subject, kind, text)?
        } else {
            self.registry.lookup(subject, kind, text)?
        };
        *self.id.write().unwrap_or_else(PoisonError::into_inner) = Some(id);
        Ok(id)
    }

    /// Frames what `write` appends after the header of this schema's id
    /// (which it is given, for its errors).
    pub(crate) fn frame(
        &self,
        write: impl FnOnce(u32, &mut Vec<u8>) -> Result<(), SchemaError>,
    ) -> Result<Vec<u8>, SchemaError> {
        let id = self.get()?;
        let mut out = crate::framing::header(id, 64);
        write(id, &mut out)?;
        Ok(out)
    }
}
