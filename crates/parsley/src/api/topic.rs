//! Typed topics and the emissions they mint.

use std::any::{Any, TypeId};
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use crate::codec::{Codec, CodecError};
use crate::partition::Partitioner;
use parsley_protocol::Header;

/// What a key or value type must be to travel in an [`Emission`]: comparable
/// and printable (so emissions are testable with `assert_eq!`), and safe to
/// hand between threads. Implemented for every such type.
pub trait Payload: PartialEq + fmt::Debug + Send + Sync + 'static {}

impl<T: PartialEq + fmt::Debug + Send + Sync + 'static> Payload for T {}

/// A key or value that may be null. Lets [`Topic::send`] take either a plain
/// value (`"k"`, `42`) or an `Option` (`None` is Kafka's null: a null key, or
/// a tombstone value).
pub trait IntoNullable<T> {
    /// The value, or `None` for null.
    fn into_nullable(self) -> Option<T>;
}

impl<T> IntoNullable<T> for T {
    fn into_nullable(self) -> Option<T> {
        Some(self)
    }
}

impl<T> IntoNullable<T> for Option<T> {
    fn into_nullable(self) -> Option<T> {
        self
    }
}

impl IntoNullable<String> for &str {
    fn into_nullable(self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl IntoNullable<String> for &String {
    fn into_nullable(self) -> Option<String> {
        Some(self.clone())
    }
}

impl IntoNullable<Vec<u8>> for &[u8] {
    fn into_nullable(self) -> Option<Vec<u8>> {
        Some(self.to_vec())
    }
}

struct TopicInner<K, V> {
    name: Arc<str>,
    key: Codec<K>,
    value: Codec<V>,
    /// The user accepted a registry-framed key codec
    /// ([`Topic::allow_registry_framed_key`]).
    framed_key_allowed: bool,
    /// How the topic's producers place keys ([`Topic::partitioned_by`]).
    partitioner: Partitioner,
}

/// A typed topic: its name and its key and value codecs, declared once.
///
/// A pipeline hop is the same `Topic` value used as one stage's sink and
/// another's source, so the codecs on both sides of the hop agree by
/// construction. Cheap to clone.
///
/// ```
/// use parsley::{Codec, Topic};
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let e = orders.send("o-1", 250);
/// assert_eq!(e, orders.send("o-1".to_string(), 250));
/// assert_ne!(e, orders.send("o-1", 251));
/// assert_eq!(format!("{e:?}"), r#"Emission { topic: "orders", key: Some("o-1"), value: Some(250), timestamp: None }"#);
/// ```
pub struct Topic<K, V> {
    inner: Arc<TopicInner<K, V>>,
}

impl<K, V> Clone for Topic<K, V> {
    fn clone(&self) -> Self {
        Topic {
            inner: self.inner.clone(),
        }
    }
}

impl<K, V> fmt::Debug for Topic<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topic")
            .field("name", &self.inner.name)
            .field("key", &self.inner.key)
            .field("value", &self.inner.value)
            .finish()
    }
}

impl<K: Payload, V: Payload> Topic<K, V> {
    /// Declares a topic. The name is checked when a stage using it is built
    /// (Kafka's rules: 1 to 249 characters of `[A-Za-z0-9._-]`, not `.` or
    /// `..`).
    pub fn new(name: impl Into<String>, key: Codec<K>, value: Codec<V>) -> Self {
        Topic {
            inner: Arc::new(TopicInner {
                name: Arc::from(name.into()),
                key,
                value,
                framed_key_allowed: false,
                partitioner: Partitioner::Murmur2,
            }),
        }
    }

    /// Accepts a key codec that writes a schema registry's framing
    /// ([`Codec::registry_framed`]), which a stage otherwise refuses.
    ///
    /// Framed key bytes begin with the schema's id, so registering the key
    /// schema again (a new version, a registry rebuilt from scratch)
    /// changes every key's bytes: keys move to other partitions and no
    /// longer find their fold state. Opt in only when the topic's
    /// producers already frame their keys and you cannot change them, and
    /// never register a new key schema while the application runs.
    ///
    /// ```
    /// use parsley::{Codec, Message, Stage, StageError, Topic};
    /// let framed = || Codec::bytes().registry_framed();
    /// let refused: Topic<Vec<u8>, String> = Topic::new("t", framed(), Codec::utf8());
    /// let e = Stage::named("s")
    ///     .on(&refused, |_m: &Message<Vec<u8>, String>| vec![])
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(e, StageError::RegistryFramedKey { .. }));
    /// let accepted = Topic::new("t", framed(), Codec::utf8()).allow_registry_framed_key();
    /// let stage = Stage::named("s").on(&accepted, |_m: &Message<Vec<u8>, String>| vec![]);
    /// assert!(stage.build().is_ok());
    /// ```
    pub fn allow_registry_framed_key(self) -> Self {
        Topic {
            inner: Arc::new(TopicInner {
                name: self.inner.name.clone(),
                key: self.inner.key.clone(),
                value: self.inner.value.clone(),
                framed_key_allowed: true,
                partitioner: self.inner.partitioner,
            }),
        }
    }

    /// Declares how the topic's producers map keys to partitions, when not
    /// as Kafka's Java producer does ([`Partitioner::Murmur2`], the
    /// default). A topic written by a librdkafka client on its defaults
    /// (rdkafka for Rust, confluent-kafka for Python, Go, .NET) is
    /// [`Partitioner::Crc32`].
    ///
    /// The declaration is used everywhere a key's partition matters: a
    /// stage writes its emissions to this topic with the same partitioner,
    /// so its records and the other producers' land together; a query
    /// looks for a key's state in the task of the partition this
    /// partitioner gives; and a stateful stage counts, and warns about,
    /// records whose key this partitioner places elsewhere than the
    /// partition they arrived on (a producer that does not use it).
    ///
    /// ```
    /// use parsley::partition::Partitioner;
    /// use parsley::{Codec, Topic};
    /// let deposits: Topic<String, i64> = Topic::new("deposits", Codec::utf8(), Codec::int64())
    ///     .partitioned_by(Partitioner::Crc32);
    /// assert_eq!(deposits.partitioner(), Partitioner::Crc32);
    /// ```
    pub fn partitioned_by(self, partitioner: Partitioner) -> Self {
        Topic {
            inner: Arc::new(TopicInner {
                name: self.inner.name.clone(),
                key: self.inner.key.clone(),
                value: self.inner.value.clone(),
                framed_key_allowed: self.inner.framed_key_allowed,
                partitioner,
            }),
        }
    }

    /// How the topic's producers map keys to partitions
    /// ([`partitioned_by`](Self::partitioned_by)).
    pub fn partitioner(&self) -> Partitioner {
        self.inner.partitioner
    }

    /// The topic name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The key codec.
    pub fn key_codec(&self) -> &Codec<K> {
        &self.inner.key
    }

    /// The value codec.
    pub fn value_codec(&self) -> &Codec<V> {
        &self.inner.value
    }

    /// An emission of `key` and `value` to this topic. It inherits the
    /// timestamp of the message being handled (or the tick). Pass `None` for
    /// a null key or a tombstone value.
    ///
    /// ```
    /// use parsley::{Codec, Topic};
    /// let audits: Topic<String, String> = Topic::new("audits", Codec::utf8(), Codec::utf8());
    /// let keyless = audits.send(None, "cut");
    /// let tombstone = audits.send("k", None);
    /// assert_eq!(keyless.key::<String>(), Some(None));
    /// assert_eq!(tombstone.value::<String>(), Some(None));
    /// ```
    pub fn send(&self, key: impl IntoNullable<K>, value: impl IntoNullable<V>) -> Emission {
        Emission::typed(EmissionTarget::Shared(self.inner.name.clone()), key, value)
    }

    /// An emission with its own timestamp (milliseconds since the epoch)
    /// instead of the handled message's.
    pub fn send_at(
        &self,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
        timestamp: i64,
    ) -> Emission {
        self.send(key, value).at(timestamp)
    }
}

/// Header naming why a dead-lettered record failed (see
/// [`Emission::dead_letter`]).
pub const DEAD_LETTER_ERROR: &str = "parsley.dlq.error";
/// Header naming a dead-lettered record's source topic.
pub const DEAD_LETTER_TOPIC: &str = "parsley.dlq.topic";
/// Header naming a dead-lettered record's source partition (decimal).
pub const DEAD_LETTER_PARTITION: &str = "parsley.dlq.partition";
/// Header naming a dead-lettered record's source offset (decimal).
pub const DEAD_LETTER_OFFSET: &str = "parsley.dlq.offset";

/// What a stage emits to one of its declared sinks: returned by
/// [`StageBuilder::add_sink`](crate::StageBuilder::add_sink), so holding one
/// means the sink is declared. It is `Copy`: a `move` closure takes its own
/// copy, with no clone per closure.
///
/// ```
/// use parsley::{Codec, Message, Stage, Topic};
/// let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
/// let doubled: Topic<String, i64> = Topic::new("doubled", Codec::utf8(), Codec::int64());
/// let mut builder = Stage::named("double");
/// let out = builder.add_sink(&doubled);
/// let stage = builder
///     .on(&orders, move |m: &Message<String, i64>| {
///         vec![out.send(m.key().cloned(), m.value().map(|v| v * 2))]
///     })
///     .build()?;
/// assert_eq!(stage.sink_topics(), vec!["doubled"]);
/// // The same emission a `Topic` mints.
/// assert_eq!(out.send("k", 2), doubled.send("k", 2));
/// # Ok::<(), parsley::StageError>(())
/// ```
pub struct Sink<K, V> {
    name: &'static str,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for Sink<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for Sink<K, V> {}

impl<K, V> fmt::Debug for Sink<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sink({})", self.name)
    }
}

impl<K: Payload, V: Payload> Sink<K, V> {
    pub(crate) fn of(topic: &Topic<K, V>) -> Self {
        Sink {
            name: intern(topic.name()),
            types: PhantomData,
        }
    }

    /// The sink topic's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// An emission of `key` and `value` to this sink, encoded with the
    /// declared topic's codecs when it is sent.
    pub fn send(&self, key: impl IntoNullable<K>, value: impl IntoNullable<V>) -> Emission {
        Emission::typed(EmissionTarget::Interned(self.name), key, value)
    }

    /// [`send`](Self::send) with a timestamp of its own.
    pub fn send_at(
        &self,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
        timestamp: i64,
    ) -> Emission {
        self.send(key, value).at(timestamp)
    }
}

/// One `'static` copy per distinct topic name, so sink handles can be
/// `Copy`. Topic names are few and long-lived; each is kept once.
fn intern(name: &str) -> &'static str {
    static NAMES: LazyLock<Mutex<BTreeSet<&'static str>>> =
        LazyLock::new(|| Mutex::new(BTreeSet::new()));
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = names.get(name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(n);
    n
}

/// The bytes of an encoded emission, ready to partition and stamp.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct EncodedEmission {
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) timestamp: Option<i64>,
    /// The emission's own headers, moved over.
    pub(crate) headers: Vec<Header>,
}

/// Which half of a record a codec failed on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Part {
    /// The key.
    Key,
    /// The value.
    Value,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Key => "key",
            Part::Value => "value",
        })
    }
}

/// A key or value of an emission with its type erased. The payload types
/// most topics carry (text, bytes, a 64-bit integer) are kept inline; any
/// other is boxed. Which type it was is kept in the emission.
enum Erased {
    Null,
    Text(String),
    Bytes(Vec<u8>),
    Int(i64),
    Other(Box<dyn AnyPayload>),
}

/// An emission's key and value: each erased on its own, or both in one box
/// when neither is null nor of a type kept inline (so an emission boxes at
/// most once).
enum Parts {
    Split(Erased, Erased),
    Pair(Box<dyn AnyPair>),
}

/// A boxed payload of any type, comparable and printable behind the box.
trait AnyPayload: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    fn eq_any(&self, other: &dyn Any) -> bool;
    fn fmt_any(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: Payload> AnyPayload for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn eq_any(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }

    fn fmt_any(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A key and a value boxed together.
trait AnyPair: Send + Sync {
    fn key(&self) -> &dyn AnyPayload;
    fn value(&self) -> &dyn AnyPayload;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<K: Payload, V: Payload> AnyPair for (K, V) {
    fn key(&self) -> &dyn AnyPayload {
        &self.0
    }

    fn value(&self) -> &dyn AnyPayload {
        &self.1
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Takes the value out of `slot` if it holds a `U` (a downcast by value,
/// with no box).
fn take_as<T: 'static, U: 'static>(slot: &mut Option<T>) -> Option<U> {
    (slot as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

impl Erased {
    /// The slot for `value` if it needs no box: null, or a type kept
    /// inline; otherwise the value back.
    fn inline<T: Payload>(value: Option<T>) -> Result<Erased, T> {
        let mut value = value;
        if let Some(s) = take_as::<T, String>(&mut value) {
            return Ok(Erased::Text(s));
        }
        if let Some(b) = take_as::<T, Vec<u8>>(&mut value) {
            return Ok(Erased::Bytes(b));
        }
        if let Some(i) = take_as::<T, i64>(&mut value) {
            return Ok(Erased::Int(i));
        }
        value.map_or(Ok(Erased::Null), Err)
    }

    /// The value as a `T`: `Ok(None)` for null, `Err` when it is not a `T`.
    fn into_typed<T: 'static>(self) -> Result<Option<T>, ()> {
        fn back<U: 'static, T: 'static>(u: U) -> Result<Option<T>, ()> {
            take_as::<U, T>(&mut Some(u)).map(Some).ok_or(())
        }
        match self {
            Erased::Null => Ok(None),
            Erased::Text(s) => back(s),
            Erased::Bytes(b) => back(b),
            Erased::Int(i) => back(i),
            Erased::Other(b) => b
                .into_any()
                .downcast::<T>()
                .map(|t| Some(*t))
                .map_err(|_| ()),
        }
    }

    fn as_any(&self) -> Option<&dyn Any> {
        match self {
            Erased::Null => None,
            Erased::Text(s) => Some(s),
            Erased::Bytes(b) => Some(b),
            Erased::Int(i) => Some(i),
            Erased::Other(b) => Some(b.as_any()),
        }
    }
}

impl PartialEq for Erased {
    fn eq(&self, other: &Erased) -> bool {
        match (self, other) {
            (Erased::Null, Erased::Null) => true,
            (Erased::Text(a), Erased::Text(b)) => a == b,
            (Erased::Bytes(a), Erased::Bytes(b)) => a == b,
            (Erased::Int(a), Erased::Int(b)) => a == b,
            (Erased::Other(a), Erased::Other(b)) => a.eq_any(b.as_any()),
            _ => false,
        }
    }
}

impl Parts {
    fn new<K: Payload, V: Payload>(key: Option<K>, value: Option<V>) -> Parts {
        match (Erased::inline(key), Erased::inline(value)) {
            (Ok(k), Ok(v)) => Parts::Split(k, v),
            (Ok(k), Err(v)) => Parts::Split(k, Erased::Other(Box::new(v))),
            (Err(k), Ok(v)) => Parts::Split(Erased::Other(Box::new(k)), v),
            (Err(k), Err(v)) => Parts::Pair(Box::new((k, v))),
        }
    }

    /// The key or the value, borrowed.
    fn part(&self, part: Part) -> PartRef<'_> {
        match (self, part) {
            (Parts::Split(k, _), Part::Key) => PartRef::Erased(k),
            (Parts::Split(_, v), Part::Value) => PartRef::Erased(v),
            (Parts::Pair(p), Part::Key) => PartRef::Boxed(p.key()),
            (Parts::Pair(p), Part::Value) => PartRef::Boxed(p.value()),
        }
    }

    /// The key and value as `K` and `V`; `None` when they are not.
    fn into_typed<K: 'static, V: 'static>(self) -> Option<(Option<K>, Option<V>)> {
        match self {
            Parts::Split(k, v) => Some((k.into_typed().ok()?, v.into_typed().ok()?)),
            Parts::Pair(p) => {
                let (k, v) = *p.into_any().downcast::<(K, V)>().ok()?;
                Some((Some(k), Some(v)))
            }
        }
    }
}

impl PartialEq for Parts {
    fn eq(&self, other: &Parts) -> bool {
        match (self, other) {
            (Parts::Split(a, b), Parts::Split(c, d)) => a == c && b == d,
            (Parts::Pair(p), Parts::Pair(q)) => {
                p.key().eq_any(q.key().as_any()) && p.value().eq_any(q.value().as_any())
            }
            _ => false,
        }
    }
}

/// One part of an emission, borrowed: a slot, or a side of a boxed pair.
enum PartRef<'a> {
    Erased(&'a Erased),
    Boxed(&'a dyn AnyPayload),
}

impl<'a> PartRef<'a> {
    /// The value; `None` for null.
    fn as_any(&self) -> Option<&'a dyn Any> {
        match *self {
            PartRef::Erased(s) => s.as_any(),
            PartRef::Boxed(b) => Some(b.as_any()),
        }
    }
}

impl fmt::Debug for dyn AnyPayload + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_any(f)
    }
}

/// Prints as the typed `Option` would.
impl fmt::Debug for PartRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: &dyn fmt::Debug = match *self {
            PartRef::Erased(Erased::Null) => return f.write_str("None"),
            PartRef::Erased(Erased::Text(s)) => s,
            PartRef::Erased(Erased::Bytes(b)) => b,
            PartRef::Erased(Erased::Int(i)) => i,
            PartRef::Erased(Erased::Other(b)) => b,
            PartRef::Boxed(ref b) => b,
        };
        f.debug_tuple("Some").field(value).finish()
    }
}

/// The key and value types of an emission, as a function (one pointer in
/// the emission instead of two type ids).
fn type_ids<K: 'static, V: 'static>() -> (TypeId, TypeId) {
    (TypeId::of::<K>(), TypeId::of::<V>())
}

enum EmissionTarget {
    Shared(Arc<str>),
    Interned(&'static str),
}

impl EmissionTarget {
    fn name(&self) -> &str {
        match self {
            EmissionTarget::Shared(n) => n,
            EmissionTarget::Interned(n) => n,
        }
    }
}

/// An output as a value: a key and value bound for one topic, minted by
/// [`Topic::send`].
///
/// Emissions compare with `==` (same topic, key, value and timestamp) and
/// print with `{:?}`, so handlers and folds are tested with plain
/// `assert_eq!`. The typed key and value are kept as they are and encoded
/// with the topic's codecs only at the stamping site, where a codec error
/// fails the task.
pub struct Emission {
    /// The destination's name: a topic's shared name, or a sink handle's
    /// interned one.
    topic: EmissionTarget,
    parts: Parts,
    /// The key's and value's types (a null part does not say).
    types: fn() -> (TypeId, TypeId),
    timestamp: Option<i64>,
    headers: Vec<Header>,
}

impl Emission {
    fn typed<K: Payload, V: Payload>(
        topic: EmissionTarget,
        key: impl IntoNullable<K>,
        value: impl IntoNullable<V>,
    ) -> Self {
        Emission {
            topic,
            parts: Parts::new::<K, V>(key.into_nullable(), value.into_nullable()),
            types: type_ids::<K, V>,
            timestamp: None,
            headers: Vec::new(),
        }
    }

    /// The destination topic's name.
    pub fn topic(&self) -> &str {
        self.topic.name()
    }

    /// The timestamp set with [`Topic::send_at`] or [`at`](Self::at);
    /// `None` inherits the handled message's timestamp.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// The same emission with its own timestamp.
    pub fn at(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// The same emission with one more header (Kafka allows repeated
    /// names). The causal headers `vc`, `vc-sender` and `vc-seq` are the
    /// runtime's: an emission that sets one fails the task with
    /// [`TaskError::ReservedHeader`](crate::TaskError::ReservedHeader).
    ///
    /// ```
    /// use parsley::{Codec, Topic};
    /// let audit: Topic<String, String> = Topic::new("audit", Codec::utf8(), Codec::utf8());
    /// let e = audit.send("k", "v").with_header("origin", "billing");
    /// assert_eq!(e.header("origin"), Some(&b"billing"[..]));
    /// ```
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers
            .push(Header::new(Into::<String>::into(name), value));
        self
    }

    /// The emission's headers, in the order they were added.
    pub fn headers(&self) -> &[Header] {
        &self.headers
    }

    /// The value of the first header named `name` (`None` when absent or
    /// null).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
    }

    /// The key, if the emission's key type is `K`: `Some(None)` for a null
    /// key, `None` when `K` is the wrong type.
    pub fn key<K: 'static>(&self) -> Option<Option<&K>> {
        if (self.types)().0 != TypeId::of::<K>() {
            return None;
        }
        Some(
            self.parts
                .part(Part::Key)
                .as_any()
                .and_then(|k| k.downcast_ref::<K>()),
        )
    }

    /// The value, if the emission's value type is `V`: `Some(None)` for a
    /// tombstone, `None` when `V` is the wrong type.
    pub fn value<V: 'static>(&self) -> Option<Option<&V>> {
        if (self.types)().1 != TypeId::of::<V>() {
            return None;
        }
        Some(
            self.parts
                .part(Part::Value)
                .as_any()
                .and_then(|v| v.downcast_ref::<V>()),
        )
    }
}

impl PartialEq for Emission {
    fn eq(&self, other: &Self) -> bool {
        (self.types)() == (other.types)()
            && self.topic.name() == other.topic.name()
            && self.parts == other.parts
            && self.timestamp == other.timestamp
            && self.headers == other.headers
    }
}

impl fmt::Debug for Emission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Emission");
        d.field("topic", &self.topic.name())
            .field("key", &self.parts.part(Part::Key))
            .field("value", &self.parts.part(Part::Value))
            .field("timestamp", &self.timestamp);
        if !self.headers.is_empty() {
            d.field("headers", &self.headers);
        }
        d.finish()
    }
}

/// A topic with its types erased, as stages and the runtime hold it.
pub(crate) trait ErasedTopic: Send + Sync {
    fn name(&self) -> &str;
    fn key_type(&self) -> (TypeId, &'static str);
    fn value_type(&self) -> (TypeId, &'static str);
    /// Checks that a record decodes with the topic's codecs (for probes).
    fn check_decodes(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), (Part, CodecError)>;
    /// The key codec's name when it writes a registry's framing and the
    /// topic did not accept that.
    fn refused_key_codec(&self) -> Option<&str>;
    /// The key and value codecs' names.
    fn codec_names(&self) -> (&str, &str);
    /// How the topic's producers place keys.
    fn partitioner(&self) -> Partitioner;
    /// Decodes a key and encodes it again.
    fn reencode_key(&self, key: &[u8]) -> Result<Vec<u8>, CodecError>;
    /// Encodes an emission's key and value with this topic's codecs (the
    /// declared sink's, whatever `Topic` value minted the emission),
    /// consuming it: a codec that can hand over a value's own buffer copies
    /// nothing. `None` when the emission's types are not this topic's.
    fn encode_emission(
        &self,
        emission: Emission,
    ) -> Option<Result<EncodedEmission, (Part, CodecError)>>;
}

impl<K: Payload, V: Payload> ErasedTopic for Topic<K, V> {
    fn name(&self) -> &str {
        Topic::name(self)
    }

    fn key_type(&self) -> (TypeId, &'static str) {
        (TypeId::of::<K>(), std::any::type_name::<K>())
    }

    fn value_type(&self) -> (TypeId, &'static str) {
        (TypeId::of::<V>(), std::any::type_name::<V>())
    }

    fn check_decodes(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(), (Part, CodecError)> {
        if let Some(b) = key {
            self.key_codec().decode(b).map_err(|e| (Part::Key, e))?;
        }
        if let Some(b) = value {
            self.value_codec().decode(b).map_err(|e| (Part::Value, e))?;
        }
        Ok(())
    }

    fn codec_names(&self) -> (&str, &str) {
        (self.key_codec().name(), self.value_codec().name())
    }

    fn partitioner(&self) -> Partitioner {
        Topic::partitioner(self)
    }

    fn refused_key_codec(&self) -> Option<&str> {
        let key = self.key_codec();
        (key.is_registry_framed() && !self.inner.framed_key_allowed).then(|| key.name())
    }

    fn reencode_key(&self, key: &[u8]) -> Result<Vec<u8>, CodecError> {
        let k = self.key_codec().decode(key)?;
        self.key_codec().encode(&k)
    }

    fn encode_emission(
        &self,
        emission: Emission,
    ) -> Option<Result<EncodedEmission, (Part, CodecError)>> {
        if (emission.types)() != type_ids::<K, V>() {
            return None;
        }
        let Emission {
            parts,
            timestamp,
            headers,
            ..
        } = emission;
        let (key, value) = parts.into_typed::<K, V>()?;
        let encode = || {
            let key = match key {
                Some(k) => Some(
                    self.key_codec()
                        .encode_owned(k)
                        .map_err(|e| (Part::Key, e))?,
                ),
                None => None,
            };
            let value = match value {
                Some(v) => Some(
                    self.value_codec()
                        .encode_owned(v)
                        .map_err(|e| (Part::Value, e))?,
                ),
                None => None,
            };
            Ok(EncodedEmission {
                key,
                value,
                timestamp,
                headers,
            })
        };
        Some(encode())
    }
}

pub(crate) type AnyTopic = Arc<dyn ErasedTopic>;

pub(crate) fn erase<K: Payload, V: Payload>(topic: &Topic<K, V>) -> AnyTopic {
    Arc::new(topic.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Topic<String, i64> {
        Topic::new("t", Codec::utf8(), Codec::int64())
    }

    #[test]
    fn emissions_compare_by_topic_key_value_timestamp() {
        let a: Topic<String, i64> = t();
        let b: Topic<String, i64> = Topic::new("u", Codec::utf8(), Codec::int64());
        assert_eq!(a.send("k", 1), a.send("k", 1));
        assert_ne!(a.send("k", 1), b.send("k", 1));
        assert_ne!(a.send("k", 1), a.send("k", 1).at(5));
        assert_eq!(a.send_at("k", 1, 5), a.send("k", 1).at(5));
        assert_ne!(a.send("k", 1), a.send(None, 1));
        // Same name, different types: not equal.
        let c: Topic<String, String> = Topic::new("t", Codec::utf8(), Codec::utf8());
        assert_ne!(a.send("k", 1), c.send("k", "1"));
    }

    fn encoded<K: Payload, V: Payload>(topic: &Topic<K, V>, e: Emission) -> EncodedEmission {
        let sink = erase(topic);
        sink.encode_emission(e)
            .expect("same types")
            .expect("the codecs encode")
    }

    /// Text, bytes and 64-bit integers ride inline, any other type boxed:
    /// each comes back out as itself, compares by value and type, and
    /// prints as the typed `Option` would.
    #[test]
    fn every_kind_of_payload_round_trips_through_the_sink() {
        #[derive(PartialEq, Debug)]
        struct Point(i32, i32);
        let bytes: Topic<Vec<u8>, i64> = Topic::new("b", Codec::bytes(), Codec::int64());
        let points: Topic<String, Point> = Topic::new(
            "p",
            Codec::utf8(),
            Codec::new(
                |p: &Point| format!("{},{}", p.0, p.1).into_bytes(),
                |_: &[u8]| Ok::<_, String>(Point(0, 0)),
            ),
        );
        let e = bytes.send(vec![1u8, 2], 7);
        assert!(matches!(
            e.parts,
            Parts::Split(Erased::Bytes(_), Erased::Int(_))
        ));
        assert_eq!(e.key::<Vec<u8>>(), Some(Some(&vec![1u8, 2])));
        assert_eq!(
            format!("{e:?}"),
            r#"Emission { topic: "b", key: Some([1, 2]), value: Some(7), timestamp: None }"#
        );
        let enc = encoded(&bytes, e);
        assert_eq!(
            (enc.key, enc.value),
            (Some(vec![1, 2]), Some(7i64.to_be_bytes().to_vec()))
        );

        let e = points.send("here", Point(3, 4));
        assert!(matches!(
            e.parts,
            Parts::Split(Erased::Text(_), Erased::Other(_))
        ));
        assert_eq!(e.value::<Point>(), Some(Some(&Point(3, 4))));
        assert_eq!(e, points.send("here", Point(3, 4)));
        assert_ne!(e, points.send("here", Point(3, 5)));
        assert_eq!(
            format!("{e:?}"),
            r#"Emission { topic: "p", key: Some("here"), value: Some(Point(3, 4)), timestamp: None }"#
        );
        let enc = encoded(&points, e);
        assert_eq!(enc.value, Some(b"3,4".to_vec()));

        // Neither side inline: one box for both, compared and printed
        // part by part, and handed back whole.
        let pairs: Topic<Point, Point> = Topic::new(
            "q",
            points.value_codec().clone(),
            points.value_codec().clone(),
        );
        let e = pairs.send(Point(1, 2), Point(3, 4));
        assert!(matches!(e.parts, Parts::Pair(_)));
        assert_eq!(e.key::<Point>(), Some(Some(&Point(1, 2))));
        assert_eq!(e, pairs.send(Point(1, 2), Point(3, 4)));
        assert_ne!(e, pairs.send(Point(1, 2), Point(3, 5)));
        assert_ne!(e, pairs.send(Point(1, 2), None));
        assert_eq!(
            format!("{e:?}"),
            r#"Emission { topic: "q", key: Some(Point(1, 2)), value: Some(Point(3, 4)), timestamp: None }"#
        );
        let enc = encoded(&pairs, e);
        assert_eq!(
            (enc.key, enc.value),
            (Some(b"1,2".to_vec()), Some(b"3,4".to_vec()))
        );
        let e = pairs.send(None, Point(5, 6));
        assert!(matches!(
            e.parts,
            Parts::Split(Erased::Null, Erased::Other(_))
        ));
        assert_eq!(
            format!("{e:?}"),
            r#"Emission { topic: "q", key: None, value: Some(Point(5, 6)), timestamp: None }"#
        );
        let enc = encoded(&pairs, e);
        assert_eq!((enc.key, enc.value), (None, Some(b"5,6".to_vec())));

        // A sink of other types refuses the emission, nulls included.
        assert!(
            erase(&t())
                .encode_emission(bytes.send(None, None))
                .is_none()
        );
        let wide: Topic<String, i32> = Topic::new(
            "t",
            Codec::utf8(),
            Codec::new(
                |v: &i32| v.to_be_bytes().to_vec(),
                |_: &[u8]| Ok::<_, String>(0),
            ),
        );
        assert!(erase(&t()).encode_emission(wide.send("k", 1)).is_none());
        assert_ne!(wide.send(None, None), t().send(None, None));
    }

    /// An emission is moved a few times per delivery (out of the logic,
    /// through `Emissions`, to the stamping site), so its size is a cost:
    /// inline parts made it 136 bytes on 64-bit targets (the target, two
    /// slots, the types' pointer, the timestamp, the headers). A guard, so
    /// that growing it is a decision.
    #[test]
    fn an_emission_is_at_most_seventeen_words() {
        let size = std::mem::size_of::<Emission>();
        assert!(size <= 17 * std::mem::size_of::<usize>(), "{size} bytes");
    }

    #[test]
    fn typed_access() {
        let e = t().send("k", 9);
        assert_eq!(e.key::<String>(), Some(Some(&"k".to_string())));
        assert_eq!(e.value::<i64>(), Some(Some(&9)));
        assert_eq!(e.value::<String>(), None);
        assert_eq!(e.topic(), "t");
    }

    #[test]
    fn nulls_never_reach_codecs() {
        let failing: Topic<String, i64> = Topic::new(
            "t",
            Codec::try_new(
                |_: &String| Err::<Vec<u8>, _>("no"),
                |_: &[u8]| Err::<String, _>("no"),
            ),
            Codec::try_new(
                |_: &i64| Err::<Vec<u8>, _>("no"),
                |_: &[u8]| Err::<i64, _>("no"),
            ),
        );
        let sink = erase(&failing);
        let encode = |e: Emission| sink.encode_emission(e).expect("same types");
        let enc = encode(failing.send(None, None)).unwrap();
        assert_eq!(enc.key, None);
        assert_eq!(enc.value, None);
        let (part, _) = encode(failing.send("k", None)).unwrap_err();
        assert_eq!(part, Part::Key);
        let (part, _) = encode(failing.send(None, 1)).unwrap_err();
        assert_eq!(part, Part::Value);
    }
}
