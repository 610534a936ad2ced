//! Codecs: pure functions between a value and its bytes.
//!
//! A [`Codec<T>`] is the only serialization vocabulary of the functional
//! core. Inbound bytes are decoded with the source topic's codecs when a
//! record is delivered (a held record waits as its original bytes), and an
//! emission is encoded with its topic's codecs at the stamping site, so the
//! stamp travels with exactly the bytes it claims.
//!
//! # The contract
//!
//! * **Never null.** Null keys and values (tombstones) pass the runtime
//!   untouched and never reach a codec, so a codec has no null branch.
//! * **Total and inverse on real data.** `decode` accepts everything
//!   `encode` produces (and everything already on the topic), and
//!   `decode(encode(v)) == v`.
//! * **Failure is loud.** A codec error fails the task: the step aborts and
//!   the retry refetches. A codec must never return a placeholder. For a
//!   topic whose producers you do not control, where malformed bytes are a
//!   fact of the domain, wrap the codec in [`Codec::attempting`] and route
//!   the [`Decoded::Malformed`] case from your handler.
//! * **Key codecs are identity.** Encoded key bytes pick the partition and
//!   key the fold state, so a key codec must be canonical and stable: the
//!   same logical key gives the same bytes everywhere, forever.
//!   [`Codec::utf8`], [`Codec::int64`] and [`Codec::bytes`] all are.

use std::fmt;
use std::sync::Arc;

use parsley_protocol::host::RecordBytes;

/// A boxed error, as user codecs and fallible handlers return them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A codec could not encode or decode a value. Returned by user codecs; the
/// runtime fails the task with it.
///
/// Its message is the underlying cause's own message (when it has one), so
/// [`source`](std::error::Error::source) skips that cause and goes on with
/// the cause's source: a report that walks the chain says each thing once.
///
/// A codec whose failure passes with time (a schema registry that cannot
/// be reached) says so with [`CodecError::transient`]: the task failure it
/// causes reports [`is_transient`](crate::runtime::task::TaskError::is_transient),
/// and a host that is left to decide restarts the task after its backoff
/// instead of stopping. The record is fetched and decoded again; nothing is
/// skipped.
#[derive(Debug)]
pub struct CodecError {
    message: String,
    cause: Option<BoxError>,
    transient: bool,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CodecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_ref().and_then(|c| c.source())
    }
}

impl CodecError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        CodecError {
            message: message.into(),
            cause: None,
            transient: false,
        }
    }

    /// An error wrapping an underlying cause; its message is the cause's.
    /// A cause that is itself a `CodecError` is returned as it is, so a
    /// codec built with [`Codec::try_new`] can return `CodecError`s of its
    /// own (transient ones among them) and keep what they say.
    pub fn from_source(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        match source.downcast::<CodecError>() {
            Ok(own) => *own,
            Err(source) => CodecError {
                message: source.to_string(),
                cause: Some(source),
                transient: false,
            },
        }
    }

    /// An error that passes with time, wrapping its cause: a schema
    /// registry that is down or timed out. The record is not at fault; the
    /// task retries it after its backoff.
    ///
    /// ```
    /// use parsley::CodecError;
    /// let e = CodecError::transient("schema 7: the registry did not answer within 5 s");
    /// assert!(e.is_transient());
    /// assert!(!CodecError::new("not a number").is_transient());
    /// ```
    pub fn transient(source: impl Into<BoxError>) -> Self {
        CodecError {
            transient: true,
            ..CodecError::from_source(source)
        }
    }

    /// Whether the failure passes with time ([`transient`](Self::transient)).
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// The error message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

type EncodeFn<T> = dyn Fn(&T) -> Result<Vec<u8>, CodecError> + Send + Sync;
type DecodeFn<T> = dyn Fn(&[u8]) -> Result<T, CodecError> + Send + Sync;
type IntoBytesFn<T> = dyn Fn(T) -> Result<Vec<u8>, CodecError> + Send + Sync;
type FromBytesFn<T> = dyn Fn(Vec<u8>) -> Result<T, CodecError> + Send + Sync;
type SharedFn<T> = dyn Fn(&T) -> Result<RecordBytes, CodecError> + Send + Sync;

/// Two pure functions between a `T` and its bytes. Cheap to clone.
///
/// ```
/// use parsley::Codec;
///
/// // A fixed-layout value: sensor id and reading, 16 bytes.
/// #[derive(Debug, PartialEq)]
/// struct Reading { sensor: i64, value: f64 }
///
/// let reading: Codec<Reading> = Codec::new(
///     |r: &Reading| [r.sensor.to_be_bytes(), r.value.to_be_bytes()].concat(),
///     |b: &[u8]| -> Result<Reading, String> {
///         let b: [u8; 16] = b.try_into().map_err(|_| format!("expected 16 bytes, got {}", b.len()))?;
///         let (s, v) = b.split_at(8);
///         Ok(Reading {
///             sensor: i64::from_be_bytes(s.try_into().unwrap()),
///             value: f64::from_be_bytes(v.try_into().unwrap()),
///         })
///     },
/// );
/// let r = Reading { sensor: 7, value: 1.5 };
/// let bytes = reading.encode(&r)?;
/// assert_eq!(reading.decode(&bytes)?, r);
/// assert!(reading.decode(b"short").is_err());
/// # Ok::<(), parsley::CodecError>(())
/// ```
pub struct Codec<T> {
    name: Arc<str>,
    encode: Arc<EncodeFn<T>>,
    decode: Arc<DecodeFn<T>>,
    /// The encoder for a value given away, where the bytes can be the
    /// value's own buffer (`utf8`, `bytes`): the stamping site encodes the
    /// emissions it consumes with it and copies nothing. It must write the
    /// same bytes as `encode`.
    into_bytes: Option<Arc<IntoBytesFn<T>>>,
    /// The decoder for bytes given away, where the value can keep them as
    /// its buffer (`utf8`, `bytes`): a delivered record's key and value are
    /// decoded with it. It must agree with `decode`.
    from_bytes: Option<Arc<FromBytesFn<T>>>,
    /// The encoder straight into the shared form, where the codec can
    /// write it without an intermediate buffer (`int64`, `utf8`, `bytes`):
    /// a fold state's value is encoded with it, and its one allocation
    /// (none for a short value) is what the changelog record and the
    /// stores share. It must write the same bytes as `encode`.
    shared: Option<Arc<SharedFn<T>>>,
    /// Whether the bytes carry a schema registry's framing (a schema id
    /// before the payload): such bytes are not a canonical key.
    registry_framed: bool,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        Codec {
            name: self.name.clone(),
            encode: self.encode.clone(),
            decode: self.decode.clone(),
            into_bytes: self.into_bytes.clone(),
            from_bytes: self.from_bytes.clone(),
            shared: self.shared.clone(),
            registry_framed: self.registry_framed,
        }
    }
}

impl<T> fmt::Debug for Codec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Codec({})", self.name)
    }
}

impl<T: 'static> Codec<T> {
    /// A codec from an infallible encoder and a fallible decoder. The
    /// decoder's error becomes a [`CodecError`], which fails the task.
    pub fn new<E>(
        encode: impl Fn(&T) -> Vec<u8> + Send + Sync + 'static,
        decode: impl Fn(&[u8]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Self
    where
        E: Into<BoxError>,
    {
        Codec {
            name: Arc::from("custom"),
            encode: Arc::new(move |v| Ok(encode(v))),
            decode: Arc::new(move |b| decode(b).map_err(CodecError::from_source)),
            into_bytes: None,
            from_bytes: None,
            shared: None,
            registry_framed: false,
        }
    }

    /// A codec whose encoder can fail too (a JSON mapper, a schema lookup).
    pub fn try_new<E1, E2>(
        encode: impl Fn(&T) -> Result<Vec<u8>, E1> + Send + Sync + 'static,
        decode: impl Fn(&[u8]) -> Result<T, E2> + Send + Sync + 'static,
    ) -> Self
    where
        E1: Into<BoxError>,
        E2: Into<BoxError>,
    {
        Codec {
            name: Arc::from("custom"),
            encode: Arc::new(move |v| encode(v).map_err(CodecError::from_source)),
            decode: Arc::new(move |b| decode(b).map_err(CodecError::from_source)),
            into_bytes: None,
            from_bytes: None,
            shared: None,
            registry_framed: false,
        }
    }

    /// The same codec under a name, shown by `{:?}` and in error messages.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Arc::from(name.into());
        self
    }

    /// The same codec, marked as writing a schema registry's framing: a
    /// schema id before the payload. Such bytes change when the schema is
    /// registered again, so a stage refuses a marked codec on a key unless
    /// the topic opts in with
    /// [`Topic::allow_registry_framed_key`](crate::Topic::allow_registry_framed_key).
    /// The codecs of `parsley-schema` mark themselves; mark your own
    /// registry codecs too.
    pub fn registry_framed(mut self) -> Self {
        self.registry_framed = true;
        self
    }

    /// Whether the codec writes a schema registry's framing
    /// ([`registry_framed`](Self::registry_framed)).
    pub fn is_registry_framed(&self) -> bool {
        self.registry_framed
    }

    /// The codec's name (`utf8`, `int64`, `bytes`, `json`, or the one given
    /// with [`named`](Self::named); `custom` otherwise).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Encodes a value.
    pub fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        (self.encode)(value)
    }

    /// Decodes bytes.
    pub fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        (self.decode)(bytes)
    }

    /// Encodes a value given away: the same bytes as
    /// [`encode`](Self::encode), without a copy where the codec can hand
    /// over the value's own buffer.
    pub(crate) fn encode_owned(&self, value: T) -> Result<Vec<u8>, CodecError> {
        match &self.into_bytes {
            Some(into_bytes) => into_bytes(value),
            None => (self.encode)(&value),
        }
    }

    /// Encodes a fold state's value: in a shared allocation where the
    /// codec writes one, else its bytes as [`encode`](Self::encode) gives
    /// them (shared at the commit).
    pub(crate) fn encode_record(&self, value: &T) -> Result<RecordBytes, CodecError> {
        match &self.shared {
            Some(shared) => shared(value),
            None => (self.encode)(value).map(RecordBytes::from),
        }
    }

    /// Decodes bytes given away: the same value as
    /// [`decode`](Self::decode), keeping the bytes as its buffer where the
    /// codec can.
    pub(crate) fn decode_owned(&self, bytes: Vec<u8>) -> Result<T, CodecError> {
        match &self.from_bytes {
            Some(from_bytes) => from_bytes(bytes),
            None => (self.decode)(&bytes),
        }
    }

    fn with_from_bytes(
        mut self,
        from_bytes: impl Fn(Vec<u8>) -> Result<T, CodecError> + Send + Sync + 'static,
    ) -> Self {
        self.from_bytes = Some(Arc::new(from_bytes));
        self
    }

    fn with_shared(
        mut self,
        shared: impl Fn(&T) -> Result<RecordBytes, CodecError> + Send + Sync + 'static,
    ) -> Self {
        self.shared = Some(Arc::new(shared));
        self
    }

    fn with_into_bytes(
        mut self,
        into_bytes: impl Fn(T) -> Result<Vec<u8>, CodecError> + Send + Sync + 'static,
    ) -> Self {
        self.into_bytes = Some(Arc::new(into_bytes));
        self
    }
}

impl Codec<String> {
    /// UTF-8 strings. Decoding bytes that are not UTF-8 fails.
    ///
    /// ```
    /// use parsley::Codec;
    /// let c = Codec::utf8();
    /// assert_eq!(c.encode(&"hé".to_string())?, "hé".as_bytes());
    /// assert!(c.decode(&[0xff]).is_err());
    /// # Ok::<(), parsley::CodecError>(())
    /// ```
    pub fn utf8() -> Self {
        Codec::new(
            |s: &String| s.as_bytes().to_vec(),
            |b: &[u8]| String::from_utf8(b.to_vec()).map_err(CodecError::from_source),
        )
        .with_into_bytes(|s: String| Ok(s.into_bytes()))
        .with_from_bytes(|b: Vec<u8>| String::from_utf8(b).map_err(CodecError::from_source))
        .with_shared(|s: &String| Ok(RecordBytes::copy_from_slice(s.as_bytes())))
        .named("utf8")
    }
}

impl Codec<i64> {
    /// Big-endian 64-bit integers: the eight-byte layout of Kafka's
    /// `LongSerializer`. Decoding anything but exactly eight bytes fails.
    ///
    /// ```
    /// use parsley::Codec;
    /// let c = Codec::int64();
    /// assert_eq!(c.encode(&-2)?, vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
    /// assert_eq!(c.decode(&[0, 0, 0, 0, 0, 0, 1, 0])?, 256);
    /// assert!(c.decode(&[1, 2, 3]).is_err());
    /// # Ok::<(), parsley::CodecError>(())
    /// ```
    pub fn int64() -> Self {
        Codec::new(
            |v: &i64| v.to_be_bytes().to_vec(),
            |b: &[u8]| -> Result<i64, CodecError> {
                let a: [u8; 8] = b.try_into().map_err(|_| {
                    CodecError::new(format!("int64 needs exactly 8 bytes, got {}", b.len()))
                })?;
                Ok(i64::from_be_bytes(a))
            },
        )
        .with_shared(|v: &i64| Ok(RecordBytes::copy_from_slice(&v.to_be_bytes())))
        .named("int64")
    }
}

impl Codec<Vec<u8>> {
    /// Raw bytes, unchanged both ways.
    pub fn bytes() -> Self {
        Codec::new(
            |v: &Vec<u8>| v.clone(),
            |b: &[u8]| Ok::<_, CodecError>(b.to_vec()),
        )
        .with_into_bytes(Ok)
        .with_from_bytes(Ok)
        .with_shared(|v: &Vec<u8>| Ok(RecordBytes::copy_from_slice(v)))
        .named("bytes")
    }
}

#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
impl Codec<()> {
    /// JSON through serde (feature `json`). Fine for values; keep it off
    /// keys unless your serializer's output is canonical (field order and
    /// spacing fixed forever), because key bytes are identity.
    ///
    /// ```
    /// # #[cfg(feature = "json")] {
    /// use parsley::Codec;
    /// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    /// struct Order { id: String, total: i64 }
    /// let c: Codec<Order> = Codec::json();
    /// let o = Order { id: "o-1".into(), total: 12 };
    /// assert_eq!(c.decode(&c.encode(&o).unwrap()).unwrap(), o);
    /// // The serde habit works too.
    /// let same = Codec::json::<Order>();
    /// assert_eq!(same.encode(&o).unwrap(), c.encode(&o).unwrap());
    /// # }
    /// ```
    pub fn json<T>() -> Codec<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + 'static,
    {
        Codec::try_new(
            |v: &T| serde_json::to_vec(v),
            |b: &[u8]| serde_json::from_slice(b),
        )
        .named("json")
    }
}

/// The result of a decoding that is allowed to fail as data: the value, or
/// the raw bytes with the reason they did not decode.
///
/// Build codecs of this type with [`Codec::attempting`] for source topics
/// whose producers you do not control; route the malformed case to an error
/// sink from your handler.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Decoded<T> {
    /// The bytes decoded.
    Ok(T),
    /// The bytes did not decode.
    Malformed {
        /// The bytes as they were on the topic.
        raw: Vec<u8>,
        /// Why the inner codec refused them.
        reason: String,
    },
}

impl<T> Decoded<T> {
    /// The value, if it decoded.
    pub fn ok(self) -> Option<T> {
        match self {
            Decoded::Ok(v) => Some(v),
            Decoded::Malformed { .. } => None,
        }
    }

    /// True for the malformed case.
    pub fn is_malformed(&self) -> bool {
        matches!(self, Decoded::Malformed { .. })
    }
}

impl<T: 'static> Codec<Decoded<T>> {
    /// Makes `inner` total: bytes it cannot decode become
    /// [`Decoded::Malformed`] instead of failing the task. Encoding a
    /// `Malformed` value writes its raw bytes back unchanged.
    ///
    /// A [transient](CodecError::is_transient) failure (a schema registry
    /// that is down) says nothing about the bytes, so it stays an error:
    /// the task retries the record instead of routing good bytes away as
    /// malformed.
    ///
    /// ```
    /// use parsley::{Codec, Decoded};
    /// let c = Codec::attempting(Codec::int64());
    /// assert_eq!(c.decode(&7i64.to_be_bytes())?, Decoded::Ok(7));
    /// let bad = c.decode(b"seven")?;
    /// assert!(bad.is_malformed());
    /// assert_eq!(c.encode(&bad)?, b"seven");
    /// # Ok::<(), parsley::CodecError>(())
    /// ```
    pub fn attempting(inner: Codec<T>) -> Self {
        let name = format!("attempting({})", inner.name());
        let enc = inner.clone();
        let owned = inner.clone();
        Codec {
            name: Arc::from(name),
            registry_framed: inner.registry_framed,
            encode: Arc::new(move |d: &Decoded<T>| match d {
                Decoded::Ok(v) => enc.encode(v),
                Decoded::Malformed { raw, .. } => Ok(raw.clone()),
            }),
            into_bytes: Some(Arc::new(move |d: Decoded<T>| match d {
                Decoded::Ok(v) => owned.encode_owned(v),
                Decoded::Malformed { raw, .. } => Ok(raw),
            })),
            shared: None,
            // Decoded through the borrowed bytes, so that malformed ones
            // are kept whole; they are moved, not copied, into the value.
            from_bytes: Some(Arc::new({
                let inner = inner.clone();
                move |b: Vec<u8>| {
                    Ok(match inner.decode(&b) {
                        Ok(v) => Decoded::Ok(v),
                        Err(e) if e.is_transient() => return Err(e),
                        Err(e) => Decoded::Malformed {
                            raw: b,
                            reason: e.to_string(),
                        },
                    })
                }
            })),
            decode: Arc::new(move |b: &[u8]| {
                Ok(match inner.decode(b) {
                    Ok(v) => Decoded::Ok(v),
                    Err(e) if e.is_transient() => return Err(e),
                    Err(e) => Decoded::Malformed {
                        raw: b.to_vec(),
                        reason: e.to_string(),
                    },
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoders into the shared form write what `encode` writes.
    #[test]
    fn shared_encoders_write_the_same_bytes() {
        let int = Codec::int64();
        for v in [0, -2, i64::MAX] {
            assert_eq!(int.encode_record(&v).unwrap(), int.encode(&v).unwrap());
            assert!(int.encode_record(&v).unwrap().is_shared());
        }
        let text = Codec::utf8();
        for s in ["", "hé", "a string longer than the inline bytes"] {
            let s = s.to_owned();
            assert_eq!(text.encode_record(&s).unwrap(), text.encode(&s).unwrap());
        }
        let raw = Codec::bytes();
        let v = vec![9u8; 40];
        assert_eq!(raw.encode_record(&v).unwrap(), v);
        // A codec without one gives its own bytes, shared at the commit.
        let custom = Codec::new(|v: &u8| vec![*v], |b: &[u8]| Ok::<_, CodecError>(b[0]));
        let r = custom.encode_record(&3).unwrap();
        assert_eq!((r.as_slice(), r.is_shared()), (&[3u8][..], false));
    }

    #[test]
    fn a_value_given_away_encodes_to_the_same_bytes() {
        let s = Codec::utf8();
        assert!(s.into_bytes.is_some());
        assert_eq!(
            s.encode_owned("hé".into()).unwrap(),
            s.encode(&"hé".into()).unwrap()
        );
        let b = Codec::bytes();
        assert!(b.into_bytes.is_some());
        assert_eq!(b.encode_owned(vec![1, 2]).unwrap(), vec![1, 2]);
        let l = Codec::int64();
        assert_eq!(l.encode_owned(-2).unwrap(), l.encode(&-2).unwrap());
        let a = Codec::attempting(Codec::utf8());
        assert_eq!(a.encode_owned(Decoded::Ok("x".into())).unwrap(), b"x");
        let raw = Decoded::Malformed {
            raw: vec![0xff],
            reason: "not utf-8".into(),
        };
        assert_eq!(a.encode_owned(raw).unwrap(), vec![0xff]);
    }

    #[test]
    fn bytes_given_away_decode_to_the_same_value() {
        let s = Codec::utf8();
        assert!(s.from_bytes.is_some());
        assert_eq!(s.decode_owned("hé".into()).unwrap(), "hé");
        let err = s.decode_owned(vec![0xff]).unwrap_err();
        assert_eq!(err.to_string(), s.decode(&[0xff]).unwrap_err().to_string());
        let b = Codec::bytes();
        assert!(b.from_bytes.is_some());
        assert_eq!(b.decode_owned(vec![1, 2]).unwrap(), vec![1, 2]);
        let l = Codec::int64();
        assert_eq!(l.decode_owned(vec![0; 8]).unwrap(), 0);
        assert!(l.decode_owned(vec![1]).is_err());
        let a = Codec::attempting(Codec::utf8());
        assert_eq!(
            a.decode_owned(b"x".to_vec()).unwrap(),
            Decoded::Ok("x".into())
        );
        assert_eq!(
            a.decode_owned(vec![0xff]).unwrap(),
            a.decode(&[0xff]).unwrap()
        );
    }

    #[test]
    fn builtins_round_trip() {
        let s = Codec::utf8();
        assert_eq!(s.decode(&s.encode(&"abc".into()).unwrap()).unwrap(), "abc");
        let l = Codec::int64();
        for v in [0, 1, -1, i64::MIN, i64::MAX] {
            assert_eq!(l.decode(&l.encode(&v).unwrap()).unwrap(), v);
        }
        let b = Codec::bytes();
        assert_eq!(b.decode(&[1, 2]).unwrap(), vec![1, 2]);
        assert_eq!(format!("{l:?}"), "Codec(int64)");
    }

    #[test]
    fn int64_is_kafka_long_layout() {
        assert_eq!(
            Codec::int64().encode(&0x0102_0304_0506_0708).unwrap(),
            vec![1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert!(Codec::int64().decode(&[0; 9]).is_err());
    }

    #[test]
    fn a_transient_failure_is_not_taken_for_malformed_bytes() {
        let flaky: Codec<i64> = Codec::try_new(
            |v: &i64| Ok::<_, CodecError>(v.to_be_bytes().to_vec()),
            |b: &[u8]| {
                if b.first() == Some(&0xfe) {
                    Err(CodecError::transient("the registry is down"))
                } else {
                    Codec::int64().decode(b)
                }
            },
        );
        // try_new keeps a CodecError the decoder returned, flag included.
        let e = flaky.decode(&[0xfe]).unwrap_err();
        assert!(e.is_transient());
        assert_eq!(e.message(), "the registry is down");
        let a = Codec::attempting(flaky);
        assert!(a.decode(&[0xfe]).unwrap_err().is_transient());
        assert!(a.decode_owned(vec![0xfe]).unwrap_err().is_transient());
        assert!(a.decode(&[1]).unwrap().is_malformed());
        assert!(a.decode_owned(vec![1]).unwrap().is_malformed());
    }

    #[test]
    fn the_registry_framing_mark_survives_clones_and_attempting() {
        let plain = Codec::bytes();
        assert!(!plain.is_registry_framed());
        let framed = Codec::bytes().registry_framed();
        assert!(framed.is_registry_framed());
        assert!(framed.clone().named("x").is_registry_framed());
        assert!(Codec::attempting(framed).is_registry_framed());
    }

    #[test]
    fn try_new_propagates_encode_errors() {
        let c: Codec<i64> = Codec::try_new(
            |v: &i64| {
                if *v < 0 {
                    Err("negative")
                } else {
                    Ok(v.to_be_bytes().to_vec())
                }
            },
            |_b: &[u8]| Ok::<_, CodecError>(0),
        );
        assert_eq!(c.encode(&-1).unwrap_err().message(), "negative");
    }
}
