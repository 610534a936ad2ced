//! A client of a Confluent-compatible schema registry: the few calls a
//! codec needs, each answer cached so that a schema seen once is never
//! asked for again.
//!
//! The client is blocking (codecs run on the stream thread, which has no
//! async runtime) and every request has a timeout. What it caches never
//! changes on the registry's side: a schema id always names the same
//! schema, and a schema registered under a subject keeps its id. So the
//! caches need no expiry, and after the first record of each schema the
//! hot path makes no call at all.
//!
//! Errors say whether they pass with time ([`SchemaError::is_transient`]):
//! a registry that cannot be reached, times out or answers 5xx is
//! transient, and the task that met it retries the record after its
//! backoff; an id the registry does not know, a schema it refuses, or
//! credentials it does not accept are not, and fail the task for good.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use base64::Engine;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::SchemaError;

/// The kind of a registered schema (the registry's `schemaType`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SchemaType {
    /// Apache Avro (the registry's default, named by no `schemaType`).
    Avro,
    /// JSON Schema.
    Json,
    /// Protocol Buffers.
    Protobuf,
}

impl SchemaType {
    fn wire(self) -> Option<&'static str> {
        match self {
            SchemaType::Avro => None,
            SchemaType::Json => Some("JSON"),
            SchemaType::Protobuf => Some("PROTOBUF"),
        }
    }

    fn from_wire(s: Option<&str>) -> Option<SchemaType> {
        match s {
            None | Some("AVRO") => Some(SchemaType::Avro),
            Some("JSON") => Some(SchemaType::Json),
            Some("PROTOBUF") => Some(SchemaType::Protobuf),
            Some(_) => None,
        }
    }
}

impl fmt::Display for SchemaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchemaType::Avro => "Avro",
            SchemaType::Json => "JSON Schema",
            SchemaType::Protobuf => "Protobuf",
        })
    }
}

/// A schema as the registry holds it under an id.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegisteredSchema {
    /// Its id, as written in every record's frame.
    pub id: u32,
    /// Its kind.
    pub schema_type: SchemaType,
    /// Its text, as registered.
    pub text: String,
    /// The registered schemas it refers to by name (Confluent's schema
    /// references), in the order the registry lists them.
    pub references: Vec<SchemaReference>,
}

/// A schema's reference to a type registered under another subject.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct SchemaReference {
    /// The referenced type's name as the referring schema uses it (for
    /// Avro, the full name of a record, enum or fixed).
    pub name: String,
    /// The subject it is registered under.
    pub subject: String,
    /// The version of that subject.
    pub version: i32,
}

/// How to reach a registry. Built with [`RegistryConfig::new`] and the
/// setters below; each maps to the setting of the same purpose in
/// Confluent's clients.
#[derive(Clone)]
pub struct RegistryConfig {
    urls: Vec<String>,
    auth: Option<Auth>,
    timeout: Duration,
    ca_pem: Option<Vec<u8>>,
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("urls", &self.urls)
            .field(
                "auth",
                &self.auth.as_ref().map(|a| match a {
                    Auth::Header(_) => "(set)",
                    Auth::Provider(_) => "(token provider)",
                }),
            )
            .field("timeout", &self.timeout)
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "(set)"))
            .field("client_pem", &self.client_pem.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl RegistryConfig {
    /// The registry's base URL (`http://registry:8081`; for Apicurio, its
    /// `/apis/ccompat/v7` path). Several URLs separated by commas are
    /// tried in turn, as Confluent's `schema.registry.url` allows.
    ///
    /// Credentials in a URL (`https://user:password@registry:8081`, what
    /// Confluent's clients read with `basic.auth.credentials.source=URL`)
    /// are taken out of it and sent as HTTP basic authentication (the
    /// first URL's, unless [`basic_auth`](Self::basic_auth) or
    /// [`bearer_token`](Self::bearer_token) sets others). The URLs kept,
    /// and so every `Debug` output, log line and error that names one,
    /// carry no credentials.
    pub fn new(url: impl AsRef<str>) -> Self {
        let mut auth = None;
        let urls = url
            .as_ref()
            .split(',')
            .map(|u| {
                let (url, user_info) = without_user_info(u.trim().trim_end_matches('/'));
                if let Some(info) = user_info
                    && auth.is_none()
                {
                    auth = Some(Auth::Header(basic(&info)));
                }
                url
            })
            .filter(|u| !u.is_empty())
            .collect();
        RegistryConfig {
            urls,
            auth,
            timeout: Duration::from_secs(5),
            ca_pem: None,
            client_pem: None,
        }
    }

    /// HTTP basic authentication (Confluent's `basic.auth.user.info`).
    pub fn basic_auth(mut self, user: impl AsRef<str>, password: impl AsRef<str>) -> Self {
        self.auth = Some(Auth::Header(basic(&format!(
            "{}:{}",
            user.as_ref(),
            password.as_ref()
        ))));
        self
    }

    /// A bearer token (Confluent's `bearer.auth.token`), fixed for the
    /// client's life.
    pub fn bearer_token(mut self, token: impl AsRef<str>) -> Self {
        self.auth = Some(Auth::Header(format!("Bearer {}", token.as_ref())));
        self
    }

    /// Bearer tokens from `provider` (an OAuth client, a secrets agent),
    /// for tokens that expire (Confluent's `bearer.auth.credentials.source`
    /// with a custom provider). The client asks the provider for a token
    /// when it first needs one, keeps it, and asks again when it is within
    /// 30 s of its expiry, or when the registry answers 401 (the token was
    /// revoked early; the request is then made once more with the new
    /// token). A provider that fails is a transient failure, as a registry
    /// that cannot be reached: the record is retried.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use parsley_schema::{BearerToken, RegistryConfig};
    /// let config = RegistryConfig::new("https://registry:8081").bearer_token_provider(|| {
    ///     // Ask the identity provider here.
    ///     Ok(BearerToken::new("eyJ...", Some(SystemTime::now() + Duration::from_secs(3600))))
    /// });
    /// ```
    pub fn bearer_token_provider(
        mut self,
        provider: impl Fn() -> Result<BearerToken, String> + Send + Sync + 'static,
    ) -> Self {
        self.auth = Some(Auth::Provider(Arc::new(provider)));
        self
    }

    /// How long one request may take, connection included; 5 s unless
    /// set. A request that runs out fails with a transient error, and the
    /// record is retried.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The certificate authorities (PEM) that sign the registry's
    /// certificate, in place of the built-in web roots.
    pub fn ca_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// A client certificate chain and its private key (both PEM), for a
    /// registry that asks for mutual TLS.
    pub fn client_certificate_pem(
        mut self,
        chain: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_pem = Some((chain.into(), key.into()));
        self
    }

    /// The URLs, in the order they are tried.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    fn agent(&self) -> Result<ureq::Agent, SchemaError> {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
        let bad = |what: &str, e: ureq::Error| SchemaError::Config(format!("{what}: {e}"));
        let mut tls = TlsConfig::builder();
        if let Some(pem) = &self.ca_pem {
            let certs = parse_certs(pem).map_err(|e| bad("the CA certificates", e))?;
            if certs.is_empty() {
                return Err(SchemaError::Config(
                    "the CA certificates hold no PEM certificate".into(),
                ));
            }
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        if let Some((chain, key)) = &self.client_pem {
            let certs: Vec<Certificate<'static>> =
                parse_certs(chain).map_err(|e| bad("the client certificate", e))?;
            let key = PrivateKey::from_pem(key).map_err(|e| bad("the client key", e))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&certs, key)));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .tls_config(tls.build())
            .build();
        Ok(config.into())
    }
}

/// How requests authenticate.
#[derive(Clone)]
enum Auth {
    /// A fixed `Authorization` header.
    Header(String),
    /// Bearer tokens from a provider, renewed as they expire.
    Provider(Arc<TokenProvider>),
}

impl Auth {
    /// The fixed header, if the authentication is one.
    #[cfg(test)]
    fn header(&self) -> Option<&str> {
        match self {
            Auth::Header(h) => Some(h),
            Auth::Provider(_) => None,
        }
    }
}

type TokenProvider = dyn Fn() -> Result<BearerToken, String> + Send + Sync;

/// A bearer token from a [provider](RegistryConfig::bearer_token_provider),
/// and when it stops being valid (`None`: never, as far as the provider
/// knows; it is then renewed only when the registry refuses it).
#[derive(Clone)]
pub struct BearerToken {
    token: String,
    expires_at: Option<SystemTime>,
}

impl BearerToken {
    /// A token, valid until `expires_at`.
    pub fn new(token: impl Into<String>, expires_at: Option<SystemTime>) -> Self {
        BearerToken {
            token: token.into(),
            expires_at,
        }
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerToken")
            .field("token", &"(hidden)")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// How long before its expiry a provider's token is renewed.
const TOKEN_MARGIN: Duration = Duration::from_secs(30);

/// The `Authorization` value of HTTP basic authentication for
/// `user:password`.
fn basic(pair: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// `url` without the user information of its authority
/// (`scheme://user:password@host...`), and that information, its
/// percent-escapes decoded.
fn without_user_info(url: &str) -> (String, Option<String>) {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((info, host)) = authority.rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    let info = percent_encoding::percent_decode_str(info)
        .decode_utf8_lossy()
        .into_owned();
    let url = match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    };
    (url, Some(info))
}

fn parse_certs(pem: &[u8]) -> Result<Vec<ureq::tls::Certificate<'static>>, ureq::Error> {
    let mut out = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        if let ureq::tls::PemItem::Certificate(c) = item? {
            out.push(c);
        }
    }
    Ok(out)
}

/// What may stand in a subject's path segment as it is.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_');

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// A schema registry client with its caches. Cheap to clone: clones share
/// the connection pool and the caches, so build one per registry and hand
/// it to every codec.
#[derive(Clone)]
pub struct SchemaRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    config: RegistryConfig,
    agent: ureq::Agent,
    by_id: RwLock<HashMap<u32, Arc<RegisteredSchema>>>,
    /// (subject, version) to the schema registered as that version.
    by_version: RwLock<HashMap<(String, i32), Arc<RegisteredSchema>>>,
    /// (subject, kind, text) to the id registered (or found) under it.
    ids: RwLock<HashMap<(String, SchemaType, String), u32>>,
    /// The provider's current token, as an `Authorization` value.
    token: std::sync::Mutex<Option<BearerToken>>,
    /// The URLs that answered at least once: a host name that stops
    /// resolving after that is an outage; one that never resolved is a
    /// typo.
    reached: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaRegistry")
            .field("urls", &self.inner.config.urls)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct SchemaBody<'a> {
    schema: &'a str,
    #[serde(rename = "schemaType", skip_serializing_if = "Option::is_none")]
    schema_type: Option<&'static str>,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    /// Present in answers by subject and version.
    id: Option<u32>,
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<SchemaReference>,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error_code: Option<i64>,
    message: Option<String>,
}

/// An answer that is not a success.
struct Refusal {
    status: u16,
    code: Option<i64>,
    message: String,
}

impl SchemaRegistry {
    /// A client for the registry `config` names. Makes no request.
    pub fn new(config: RegistryConfig) -> Result<Self, SchemaError> {
        if config.urls.is_empty() {
            return Err(SchemaError::Config("no registry URL given".into()));
        }
        let agent = config.agent()?;
        Ok(SchemaRegistry {
            inner: Arc::new(Inner {
                config,
                agent,
                by_id: RwLock::default(),
                by_version: RwLock::default(),
                ids: RwLock::default(),
                token: std::sync::Mutex::default(),
                reached: std::sync::Mutex::default(),
            }),
        })
    }

    /// A client for the registry at `url`, with the defaults.
    pub fn at(url: impl AsRef<str>) -> Result<Self, SchemaError> {
        SchemaRegistry::new(RegistryConfig::new(url))
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    /// The schema registered under `id`: from the cache, or asked once.
    pub fn schema(&self, id: u32) -> Result<Arc<RegisteredSchema>, SchemaError> {
        if let Some(s) = read(&self.inner.by_id).get(&id) {
            return Ok(s.clone());
        }
        let what = || format!("fetching schema id {id}");
        let body = match self.call("GET", &format!("/schemas/ids/{id}"), None, &what)? {
            Ok(body) => body,
            Err(r) if r.status == 404 => return Err(SchemaError::UnknownSchemaId { id }),
            Err(r) => return Err(refused(what(), r)),
        };
        let schema = Arc::new(registered(id, parse(&body, &what)?, &what)?);
        debug!(id, schema_type = %schema.schema_type, "schema fetched from the registry");
        write(&self.inner.by_id).insert(id, schema.clone());
        Ok(schema)
    }

    /// The latest version registered under `subject`, asked each time
    /// (it changes when a version is added): for an encoder that writes
    /// with it ([`AvroCodec::use_latest_version`](crate::AvroCodec::use_latest_version),
    /// which asks once).
    pub fn latest_version(&self, subject: &str) -> Result<Arc<RegisteredSchema>, SchemaError> {
        let what = || format!("fetching the latest version of subject {subject:?}");
        self.fetch_version(subject, "latest", &what, |r| SchemaError::NotRegistered {
            subject: subject.to_owned(),
            message: r.message,
        })
        .map(Arc::new)
    }

    /// `GET /subjects/{subject}/versions/{version}`: the schema, or
    /// `missing`'s error for a 404.
    fn fetch_version(
        &self,
        subject: &str,
        version: &str,
        what: &dyn Fn() -> String,
        missing: impl FnOnce(Refusal) -> SchemaError,
    ) -> Result<RegisteredSchema, SchemaError> {
        let path = format!(
            "/subjects/{}/versions/{version}",
            utf8_percent_encode(subject, SEGMENT)
        );
        let body = match self.call("GET", &path, None, what)? {
            Ok(body) => body,
            Err(r) if r.status == 404 => return Err(missing(r)),
            Err(r) => return Err(refused(what(), r)),
        };
        let answer: SchemaAnswer = parse(&body, what)?;
        let id = answer
            .id
            .ok_or_else(|| SchemaError::Protocol(format!("{}: the answer has no id", what())))?;
        registered(id, answer, what)
    }

    /// The schema registered as `version` of `subject` (what a schema
    /// reference names): from the cache, or asked once.
    pub fn schema_version(
        &self,
        subject: &str,
        version: i32,
    ) -> Result<Arc<RegisteredSchema>, SchemaError> {
        let key = (subject.to_owned(), version);
        if let Some(s) = read(&self.inner.by_version).get(&key) {
            return Ok(s.clone());
        }
        let what = || format!("fetching version {version} of subject {subject:?}");
        let schema = Arc::new(
            self.fetch_version(subject, &version.to_string(), &what, |_| {
                SchemaError::UnknownVersion {
                    subject: subject.to_owned(),
                    version,
                }
            })?,
        );
        write(&self.inner.by_version).insert(key, schema.clone());
        Ok(schema)
    }

    /// The id of `text` under `subject`, registering it if the subject
    /// does not hold it yet; cached, so each schema is asked for once per
    /// client. The subject is first asked, normalized, whether it holds
    /// the schema in any spelling ([`lookup`](Self::lookup)): a schema
    /// another client registered as different text (keys in another
    /// order, other white space) keeps its id, also on registries that
    /// compare text when registering. Only a schema the subject does not
    /// hold is registered, as `text`. The registry refuses a schema that
    /// breaks the subject's compatibility rule
    /// ([`SchemaError::Incompatible`]).
    pub fn register(
        &self,
        subject: &str,
        schema_type: SchemaType,
        text: &str,
    ) -> Result<u32, SchemaError> {
        self.id_for(
            subject,
            schema_type,
            text,
            Ask::Register { normalize: false },
        )
    }

    /// As [`register`](Self::register), asking the registry to normalize
    /// the schema it registers (Confluent's `normalize.schemas`).
    pub fn register_normalized(
        &self,
        subject: &str,
        schema_type: SchemaType,
        text: &str,
    ) -> Result<u32, SchemaError> {
        self.id_for(
            subject,
            schema_type,
            text,
            Ask::Register { normalize: true },
        )
    }

    /// The id under which `subject` already holds `text`, without
    /// registering anything (Confluent's serializers with
    /// `auto.register.schemas=false`); cached like
    /// [`register`](Self::register). The lookup asks the registry to
    /// normalize (`normalize=true`), so it finds the schema however the
    /// client that registered it spelled it: a Java producer's
    /// `Schema.toString()`, a Python client's file text, or ours.
    pub fn lookup(
        &self,
        subject: &str,
        schema_type: SchemaType,
        text: &str,
    ) -> Result<u32, SchemaError> {
        self.id_for(subject, schema_type, text, Ask::Lookup)
    }

    fn id_for(
        &self,
        subject: &str,
        schema_type: SchemaType,
        text: &str,
        ask: Ask,
    ) -> Result<u32, SchemaError> {
        let key = (subject.to_owned(), schema_type, text.to_owned());
        if let Some(id) = read(&self.inner.ids).get(&key) {
            return Ok(*id);
        }
        let id = match ask {
            Ask::Lookup => self.ask(subject, schema_type, text, Ask::Lookup)?,
            Ask::Register { .. } => match self.ask(subject, schema_type, text, Ask::Lookup) {
                Ok(id) => id,
                Err(SchemaError::NotRegistered { .. }) => {
                    self.ask(subject, schema_type, text, ask)?
                }
                Err(e) => return Err(e),
            },
        };
        write(&self.inner.ids).insert(key, id);
        Ok(id)
    }

    /// One request: a normalized lookup, or a registration.
    fn ask(
        &self,
        subject: &str,
        schema_type: SchemaType,
        text: &str,
        ask: Ask,
    ) -> Result<u32, SchemaError> {
        let segment = utf8_percent_encode(subject, SEGMENT).to_string();
        let register = matches!(ask, Ask::Register { .. });
        let (path, what) = match ask {
            Ask::Register { normalize } => (
                format!(
                    "/subjects/{segment}/versions{}",
                    if normalize { "?normalize=true" } else { "" }
                ),
                format!("registering a {schema_type} schema under subject {subject:?}"),
            ),
            Ask::Lookup => (
                format!("/subjects/{segment}?normalize=true"),
                format!("looking up a {schema_type} schema under subject {subject:?}"),
            ),
        };
        let body = serde_json::to_vec(&SchemaBody {
            schema: text,
            schema_type: schema_type.wire(),
        })
        .map_err(|e| SchemaError::Protocol(e.to_string()))?;
        let answer = match self.call("POST", &path, Some(&body), &|| what.clone())? {
            Ok(answer) => answer,
            Err(r) if r.status == 409 => {
                return Err(SchemaError::Incompatible {
                    subject: subject.to_owned(),
                    message: r.message,
                });
            }
            Err(r) if !register && r.status == 404 => {
                return Err(SchemaError::NotRegistered {
                    subject: subject.to_owned(),
                    message: r.message,
                });
            }
            Err(r) => return Err(refused(what, r)),
        };
        let IdAnswer { id } = parse(&answer, &|| what.clone())?;
        debug!(subject, id, register, "schema id from the registry");
        Ok(id)
    }

    /// Sets the compatibility rule of `subject` (or the registry's
    /// default, for `None`): `BACKWARD`, `FORWARD`, `FULL`, `NONE` and
    /// their `_TRANSITIVE` forms. For tests and tooling; codecs never call
    /// it.
    pub fn set_compatibility(&self, subject: Option<&str>, level: &str) -> Result<(), SchemaError> {
        let path = match subject {
            Some(s) => format!("/config/{}", utf8_percent_encode(s, SEGMENT)),
            None => "/config".to_owned(),
        };
        let what = || format!("setting compatibility {level} on {subject:?}");
        let body = serde_json::to_vec(&serde_json::json!({ "compatibility": level }))
            .map_err(|e| SchemaError::Protocol(e.to_string()))?;
        match self.call("PUT", &path, Some(&body), &what)? {
            Ok(_) => Ok(()),
            Err(r) => Err(refused(what(), r)),
        }
    }

    /// The `Authorization` value for the next request: the fixed one, or
    /// the provider's token, asked for anew when there is none, when it is
    /// about to expire, or when `renew` says the registry refused it.
    fn authorization(&self, renew: bool) -> Result<Option<String>, SchemaError> {
        let provider = match &self.inner.config.auth {
            None => return Ok(None),
            Some(Auth::Header(h)) => return Ok(Some(h.clone())),
            Some(Auth::Provider(p)) => p,
        };
        let mut current = self
            .inner
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let fresh = |t: &BearerToken| {
            t.expires_at
                .is_none_or(|at| SystemTime::now() + TOKEN_MARGIN < at)
        };
        match current.as_ref() {
            Some(t) if !renew && fresh(t) => {}
            _ => {
                let t = provider().map_err(|reason| SchemaError::Unavailable {
                    what: "getting a bearer token for the schema registry".to_owned(),
                    reason,
                })?;
                debug!(expires_at = ?t.expires_at, "a bearer token from the provider");
                *current = Some(t);
            }
        }
        Ok(current.as_ref().map(|t| format!("Bearer {}", t.token)))
    }

    /// Makes one request, trying each URL in turn while the registry
    /// cannot be reached. `Ok(Err(..))` is an answer that is not a
    /// success; `Err` is a transport failure on every URL, or a 5xx.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        what: &dyn Fn() -> String,
    ) -> Result<Result<Vec<u8>, Refusal>, SchemaError> {
        let mut last = None;
        let mut auth = self.authorization(false)?;
        let mut renewed = false;
        for base in &self.inner.config.urls {
            let url = format!("{base}{path}");
            let mut answer = self.once(method, &url, body, auth.as_deref());
            if matches!(answer, Ok((401, _)))
                && !renewed
                && matches!(self.inner.config.auth, Some(Auth::Provider(_)))
            {
                // Revoked before its expiry: one more try with a new one.
                renewed = true;
                auth = self.authorization(true)?;
                answer = self.once(method, &url, body, auth.as_deref());
            }
            if answer.is_ok() {
                self.inner
                    .reached
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(base.clone());
            }
            match answer {
                Ok((status, bytes)) if (200..300).contains(&status) => return Ok(Ok(bytes)),
                Ok((status, bytes)) => {
                    let refusal = refusal(status, &bytes);
                    // 501 and 505: the registry does not serve this at all,
                    // which waiting does not change.
                    if (status >= 500 && status != 501 && status != 505)
                        || status == 429
                        || status == 408
                    {
                        warn!(%url, status, message = %refusal.message, "the schema registry is not serving; trying the next URL, if any");
                        last = Some(SchemaError::Unavailable {
                            what: what(),
                            reason: format!("{url} answered {status}: {}", refusal.message),
                        });
                        continue;
                    }
                    return Ok(Err(refusal));
                }
                Err(ureq::Error::HostNotFound | ureq::Error::Io(_))
                    if !self
                        .inner
                        .reached
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .contains(base)
                        && !resolves(&url) =>
                {
                    // Never reached, and its name does not resolve: a typo
                    // (or a name this host cannot see), not an outage.
                    return Err(SchemaError::Config(format!(
                        "{}: the host name of {url} does not resolve, and this client never reached it: check the registry URL",
                        what()
                    )));
                }
                Err(e) if transport_is_transient(&e) => {
                    warn!(%url, error = %e, "the schema registry cannot be reached; trying the next URL, if any");
                    last = Some(SchemaError::Unavailable {
                        what: what(),
                        reason: format!("{url}: {e}"),
                    });
                }
                Err(e) => {
                    return Err(SchemaError::Config(format!("{}: {url}: {e}", what())));
                }
            }
        }
        Err(last.unwrap_or_else(|| SchemaError::Config("no registry URL given".into())))
    }

    fn once(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        auth: Option<&str>,
    ) -> Result<(u16, Vec<u8>), ureq::Error> {
        let agent = &self.inner.agent;
        let response = match (method, body) {
            ("GET", _) => with_auth(agent.get(url), auth)
                .header("Accept", CONTENT_TYPE)
                .call()?,
            ("PUT", Some(b)) => with_auth(agent.put(url), auth)
                .header("Accept", CONTENT_TYPE)
                .header("Content-Type", CONTENT_TYPE)
                .send(b)?,
            (_, b) => with_auth(agent.post(url), auth)
                .header("Accept", CONTENT_TYPE)
                .header("Content-Type", CONTENT_TYPE)
                .send(b.unwrap_or_default())?,
        };
        let status = response.status().as_u16();
        let mut bytes = Vec::new();
        response
            .into_body()
            .into_reader()
            .take(16 << 20)
            .read_to_end(&mut bytes)?;
        Ok((status, bytes))
    }
}

fn with_auth<B>(r: ureq::RequestBuilder<B>, auth: Option<&str>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(a) => r.header("Authorization", a),
        None => r,
    }
}

/// Whether the host name of `url` resolves to an address (a name that does
/// not, on a URL never reached, is a typo).
fn resolves(url: &str) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(uri) = url.parse::<ureq::http::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .is_ok_and(|mut a| a.next().is_some())
}

/// Transport failures that pass with time: the registry is down, slow or
/// unreachable. A malformed URL or a TLS configuration the registry
/// refuses does not pass.
fn transport_is_transient(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
    )
}

/// What [`SchemaRegistry::id_for`] asks of the registry.
#[derive(Clone, Copy)]
enum Ask {
    Lookup,
    Register { normalize: bool },
}

fn registered(
    id: u32,
    answer: SchemaAnswer,
    what: &dyn Fn() -> String,
) -> Result<RegisteredSchema, SchemaError> {
    let schema_type = SchemaType::from_wire(answer.schema_type.as_deref()).ok_or_else(|| {
        SchemaError::Protocol(format!(
            "{}: unknown schemaType {:?}",
            what(),
            answer.schema_type
        ))
    })?;
    Ok(RegisteredSchema {
        id,
        schema_type,
        text: answer.schema,
        references: answer.references,
    })
}

fn refusal(status: u16, body: &[u8]) -> Refusal {
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(e) => Refusal {
            status,
            code: e.error_code,
            message: e
                .message
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
        },
        Err(_) => Refusal {
            status,
            code: None,
            message: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}

fn refused(what: String, r: Refusal) -> SchemaError {
    match r.status {
        401 | 403 => SchemaError::Unauthorized {
            what,
            status: r.status,
            message: r.message,
        },
        _ => SchemaError::Refused {
            what,
            status: r.status,
            code: r.code,
            message: r.message,
        },
    }
}

fn parse<'a, T: Deserialize<'a>>(
    body: &'a [u8],
    what: &dyn Fn() -> String,
) -> Result<T, SchemaError> {
    serde_json::from_slice(body).map_err(|e| {
        SchemaError::Protocol(format!(
            "{}: the registry's answer is not what the Confluent API returns: {e}",
            what()
        ))
    })
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_registry_that_is_not_there_is_transient_and_names_the_id() {
        // A port that was free a moment ago: nothing listens on it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let r = SchemaRegistry::new(
            RegistryConfig::new(format!("http://127.0.0.1:{port}")).timeout(Duration::from_secs(2)),
        )
        .unwrap();
        let e = r.schema(42).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("schema id 42"), "{e}");
        let e = r
            .register("orders-value", SchemaType::Avro, "\"long\"")
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("orders-value"), "{e}");
    }

    /// Serves one connection: reads the request head, hands it to
    /// `answer`, and writes what it returns (or nothing, for `None`, and
    /// keeps the connection open for `hold`).
    fn serve_once(
        answer: impl FnOnce(&str) -> Option<String> + Send + 'static,
        hold: Duration,
    ) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            match answer(&head) {
                Some(body) => {
                    let mut stream = stream;
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                }
                None => std::thread::sleep(hold),
            }
            head
        });
        (url, handle)
    }

    #[test]
    fn credentials_and_the_media_type_go_with_every_request() {
        let (url, server) = serve_once(
            |_| Some(r#"{"schema": "\"long\""}"#.to_owned()),
            Duration::ZERO,
        );
        let r = SchemaRegistry::new(RegistryConfig::new(url).basic_auth("ada", "s3cret")).unwrap();
        let s = r.schema(5).unwrap();
        assert_eq!(
            (s.id, s.schema_type, s.text.as_str()),
            (5, SchemaType::Avro, "\"long\"")
        );
        let head = server.join().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /schemas/ids/5 "), "{head}");
        assert!(
            head.contains("authorization: basic ywrhonmzy3jlda=="),
            "{head}"
        );
        assert!(
            head.contains("accept: application/vnd.schemaregistry.v1+json"),
            "{head}"
        );
        // Cached: a second ask makes no request (the server is gone).
        assert_eq!(r.schema(5).unwrap().text, "\"long\"");

        let (url, server) = serve_once(|_| Some(r#"{"id": 9}"#.to_owned()), Duration::ZERO);
        let r = SchemaRegistry::new(RegistryConfig::new(url).bearer_token("tok")).unwrap();
        assert_eq!(r.register("a b/c", SchemaType::Json, "{}").unwrap(), 9);
        let head = server.join().unwrap().to_ascii_lowercase();
        // The subject held the schema: found by the normalized lookup,
        // nothing registered.
        assert!(
            head.starts_with("post /subjects/a%20b%2fc?normalize=true "),
            "{head}"
        );
        assert!(head.contains("authorization: bearer tok"), "{head}");
        assert_eq!(r.register("a b/c", SchemaType::Json, "{}").unwrap(), 9);
    }

    /// A registry answering each request in turn with a status and a body,
    /// one connection per request; the heads of the requests come back.
    fn serve_in_turn(
        answers: Vec<(u16, &'static str)>,
    ) -> (String, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for (status, body) in answers {
                let (mut stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    head.push_str(&line);
                }
                head.push_str("\r\n");
                let mut sent = vec![0; length];
                reader.read_exact(&mut sent).unwrap();
                head.push_str(&String::from_utf8_lossy(&sent));
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                heads.push(head);
            }
            heads
        });
        (url, handle)
    }

    /// A provider's token is asked for once, kept while it is valid,
    /// renewed when it is about to expire, and renewed (with the request
    /// made again) when the registry answers 401.
    #[test]
    fn a_providers_token_is_renewed_when_it_expires_or_is_refused() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        // Token 1 is about to expire (within the margin); tokens 2 and on
        // are valid for an hour.
        let provider = move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let expires = if n == 1 {
                SystemTime::now() + Duration::from_secs(5)
            } else {
                SystemTime::now() + Duration::from_secs(3600)
            };
            Ok(BearerToken::new(format!("t{n}"), Some(expires)))
        };
        let (url, server) = serve_in_turn(vec![
            (200, r#"{"schema": "\"long\""}"#),
            (200, r#"{"schema": "\"int\""}"#),
            (200, r#"{"schema": "\"string\""}"#),
            (401, r#"{"error_code": 40101, "message": "token revoked"}"#),
            (200, r#"{"schema": "\"bytes\""}"#),
        ]);
        let r =
            SchemaRegistry::new(RegistryConfig::new(url).bearer_token_provider(provider)).unwrap();
        for id in 1..=4 {
            r.schema(id).unwrap();
        }
        let heads: Vec<String> = server
            .join()
            .unwrap()
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let bearer = |h: &String| {
            h.lines()
                .find_map(|l| l.strip_prefix("authorization: bearer "))
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        // t1 was within the margin when first used, so it was used once:
        // the next request renewed it.
        assert_eq!(
            heads.iter().map(bearer).collect::<Vec<_>>(),
            ["t1", "t2", "t2", "t2", "t3"]
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // The token never reaches Debug.
        assert!(!format!("{:?}", BearerToken::new("secret-token", None)).contains("secret"));
    }

    /// A 501 (the registry does not implement the request) is a refusal for
    /// good, not an outage to wait out; a host name that never resolved is
    /// a configuration error.
    #[test]
    fn not_implemented_and_a_host_name_that_never_resolved_are_not_retried() {
        let (url, server) = serve_in_turn(vec![(
            501,
            r#"{"error_code": 501, "message": "not implemented"}"#,
        )]);
        let r = SchemaRegistry::at(url).unwrap();
        let e = r.schema(7).unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert_eq!(server.join().unwrap().len(), 1);

        let r = SchemaRegistry::at("http://parsley-no-such-host.invalid:8081").unwrap();
        let e = r.schema(7).unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert!(e.to_string().contains("does not resolve"), "{e}");
    }

    #[test]
    fn a_schema_the_subject_lacks_is_registered_as_given_after_the_normalized_lookup() {
        let text = r#"{"type":"record","name":"A","namespace":"x","fields":[]}"#;
        for (normalize, path) in [
            (false, "post /subjects/s/versions "),
            (true, "post /subjects/s/versions?normalize=true "),
        ] {
            let (url, server) = serve_in_turn(vec![
                (
                    404,
                    r#"{"error_code": 40401, "message": "Subject 's' not found."}"#,
                ),
                (200, r#"{"id": 12}"#),
            ]);
            let r = SchemaRegistry::at(url).unwrap();
            let id = if normalize {
                r.register_normalized("s", SchemaType::Avro, text)
            } else {
                r.register("s", SchemaType::Avro, text)
            };
            assert_eq!(id.unwrap(), 12);
            let heads = server.join().unwrap();
            let lower: Vec<String> = heads.iter().map(|h| h.to_ascii_lowercase()).collect();
            assert!(
                lower[0].starts_with("post /subjects/s?normalize=true "),
                "{}",
                heads[0]
            );
            assert!(lower[1].starts_with(path), "{}", heads[1]);
            // The text itself, not a re-serialisation of it.
            let sent = &heads[1][heads[1].find("\r\n\r\n").unwrap() + 4..];
            let body: serde_json::Value = serde_json::from_str(sent).unwrap();
            assert_eq!(body["schema"], text, "{sent}");
        }
    }

    #[test]
    fn credentials_in_a_url_are_sent_as_basic_auth_and_never_shown() {
        let (url, server) = serve_once(
            |_| Some(r#"{"schema": "\"long\""}"#.to_owned()),
            Duration::ZERO,
        );
        let secret_url = url.replacen("http://", "http://ada:s3cr%40t@", 1);
        let config = RegistryConfig::new(format!("{secret_url}/, http://bob:other@127.0.0.1:9"));
        assert_eq!(config.urls(), [url.as_str(), "http://127.0.0.1:9"]);
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr") && !shown.contains("ada"), "{shown}");
        let r = SchemaRegistry::new(config).unwrap();
        assert!(!format!("{r:?}").contains("s3cr"));
        r.schema(3).unwrap();
        let head = server.join().unwrap().to_ascii_lowercase();
        // ada:s3cr@t, the first URL's, in base64.
        assert!(
            head.contains("authorization: basic ywrhonmzy3jada=="),
            "{head}"
        );
        // An error that names the URL names it without the credentials.
        let e = r.schema(4).unwrap_err().to_string();
        assert!(!e.contains("s3cr") && !e.contains("other"), "{e}");
        // Credentials set apart win over the URL's.
        let r = RegistryConfig::new(&secret_url).bearer_token("tok");
        assert_eq!(r.auth.as_ref().and_then(Auth::header), Some("Bearer tok"));
        // A URL without them is kept as it is.
        assert_eq!(
            without_user_info("https://registry:8081/apis/ccompat/v7"),
            ("https://registry:8081/apis/ccompat/v7".to_owned(), None)
        );
        assert_eq!(
            without_user_info("https://registry:8081/a@b"),
            ("https://registry:8081/a@b".to_owned(), None)
        );
    }

    #[test]
    fn a_registry_that_does_not_answer_times_out_as_transient() {
        let (url, _server) = serve_once(|_| None, Duration::from_secs(20));
        let r = SchemaRegistry::new(RegistryConfig::new(url).timeout(Duration::from_millis(300)))
            .unwrap();
        let started = std::time::Instant::now();
        let e = r.schema(11).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("schema id 11"), "{e}");
        // The server holds the connection for 20 s; the timeout ended the
        // wait long before (a closed connection would say so instead).
        assert!(e.to_string().contains("timeout"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the timeout bounded the wait"
        );
    }

    #[test]
    fn a_malformed_url_is_not_transient() {
        let r = SchemaRegistry::at("not a url").unwrap();
        let e = r.schema(1).unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert!(matches!(
            SchemaRegistry::new(RegistryConfig::new(" , ")),
            Err(SchemaError::Config(_))
        ));
    }

    #[test]
    fn urls_split_on_commas_and_credentials_stay_out_of_debug() {
        let c = RegistryConfig::new("http://a:8081/, http://b:8081").basic_auth("user", "secret");
        assert_eq!(c.urls(), ["http://a:8081", "http://b:8081"]);
        assert_eq!(
            c.auth.as_ref().and_then(Auth::header),
            Some("Basic dXNlcjpzZWNyZXQ=")
        );
        assert!(!format!("{c:?}").contains("dXNlcjpzZWNyZXQ"));
        let bad_ca = RegistryConfig::new("https://a").ca_certificates_pem("nothing here");
        assert!(matches!(
            SchemaRegistry::new(bad_ca),
            Err(SchemaError::Config(_))
        ));
    }

    #[test]
    fn subjects_are_escaped_as_path_segments() {
        assert_eq!(
            utf8_percent_encode("shop.Order-value", SEGMENT).to_string(),
            "shop.Order-value"
        );
        assert_eq!(
            utf8_percent_encode("a/b c", SEGMENT).to_string(),
            "a%2Fb%20c"
        );
    }
}
