//! Which registry subject a schema is registered (or looked up) under.

use parsley::Part;

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
