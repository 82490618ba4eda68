//! A small HTTP client for a hotsplit service.
//!
//! It publishes and invalidates, reads through the client's affine copy, and remembers the
//! highest version it has seen per key (a tombstone's 404 included), sending it as the
//! `min_version` floor on the next read. It also carries the service's session token
//! (`Hotsplit-Session`): it sends every token it holds (one, unless calls ran at once) and, when
//! an answer comes, keeps the token it carries in place of the ones that call sent, so the
//! service merges answers that arrived out of order and no floor is lost. Together that gives
//! monotonic reads and read-your-writes through any hotsplit instance.
//!
//! ```no_run
//! # async fn demo() -> hotsplit::Result<()> {
//! let client = hotsplit::client::Client::new("http://127.0.0.1:7070", "session-42")?;
//! client.publish("post:9", Some(3), b"hello".to_vec()).await?;
//! let read = client.read("post:9").await?;
//! assert!(read.is_some());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};
use crate::key::Version;
use crate::wire;

/// A value read through hotsplit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The value bytes.
    pub value: Bytes,
    /// Its version.
    pub version: Version,
    /// The copy that served it.
    pub copy: u32,
}

/// The parts of a publish answer the client reports.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Published {
    /// The version written.
    pub version: u64,
    /// Copies that now hold it.
    pub applied: u32,
    /// Copies that already held it.
    pub current: u32,
    /// Copies that hold a newer version.
    pub stale: u32,
    /// Copies whose write failed.
    pub failed: u32,
    /// Failed copies durably queued for retry (the answer was 202). Default: 0 from older
    /// servers.
    #[serde(default)]
    pub queued: u32,
}

/// A problem answer's stable code and detail.
#[derive(Debug, Deserialize)]
struct Problem {
    code: String,
    detail: String,
}

/// A client bound to one service and one client id.
pub struct Client {
    /// `http://host:port`, without a trailing slash.
    base: String,
    /// This client's id; decides its affine copy.
    client_id: String,
    /// The HTTP connection pool.
    http: reqwest::Client,
    /// The highest version seen per key: the floor sent with every read.
    floors: Mutex<HashMap<String, Version>>,
    /// The bearer token sent with every request, if the service asks for one.
    token: Option<String>,
    /// The session tokens held, all sent with every request: one, or one per call that
    /// answered since the last call that sent them all (calls that ran at once).
    session: Mutex<Vec<reqwest::header::HeaderValue>>,
}

impl Client {
    /// A client for the service at `base_url` reading as `client_id`.
    ///
    /// # Errors
    /// [`ErrorKind::MissingClient`] for an empty client id; [`ErrorKind::InvalidParameter`] for a
    /// URL that is not `http://` (the client is built without TLS); [`ErrorKind::Config`] if the
    /// HTTP client cannot be built.
    pub fn new(base_url: &str, client_id: &str) -> Result<Client> {
        if client_id.is_empty() {
            return Err(Error::new(ErrorKind::MissingClient, "client id is empty"));
        }
        if !base_url.starts_with("http://") {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("base url {base_url:?} must start with http:// (this client has no TLS)"),
            ));
        }
        Ok(Client {
            base: base_url.trim_end_matches('/').to_owned(),
            client_id: client_id.to_owned(),
            http: http_client(DEFAULT_TIMEOUT)?,
            floors: Mutex::new(HashMap::new()),
            token: None,
            session: Mutex::new(Vec::new()),
        })
    }

    /// The same client sending `Authorization: Bearer token` with every request (a service
    /// with `[auth] tokens_file`; reads need the `read` scope, publishes and invalidations
    /// `write`). The token is never printed.
    pub fn with_token(mut self, token: impl Into<String>) -> Client {
        self.token = Some(token.into());
        self
    }

    /// `request` with this client's token, if it has one.
    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// The same client with every request bounded by `timeout` (from sending to the last byte
    /// of the answer) instead of the default 10 s.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] if the HTTP client cannot be built.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Client> {
        self.http = http_client(timeout)?;
        Ok(self)
    }

    /// The floor this client holds for `key`, if it has seen a version.
    pub fn floor(&self, key: &str) -> Option<Version> {
        self.floors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
    }

    /// The session token this client sends, if the service gave it one: several tokens
    /// (answers to calls that ran at once) comma-separated, as one `Hotsplit-Session` value the
    /// service merges.
    pub fn session_token(&self) -> Option<String> {
        let held = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        let texts: Vec<&str> = held
            .iter()
            .filter_map(|value| value.to_str().ok())
            .collect();
        (!texts.is_empty()).then(|| texts.join(", "))
    }

    /// Adds every session token held to `request`, one `Hotsplit-Session` line each; returns
    /// what was sent, for [`Client::keep_session`].
    fn with_session(
        &self,
        mut request: reqwest::RequestBuilder,
    ) -> (reqwest::RequestBuilder, Vec<reqwest::header::HeaderValue>) {
        let sent = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for token in &sent {
            request = request.header(wire::header::SESSION, token.clone());
        }
        (request, sent)
    }

    /// Keeps the session token of `response`, when it carries one, in place of the tokens its
    /// request `sent` (it merged them); tokens other calls brought back meanwhile stay.
    fn keep_session(&self, response: &reqwest::Response, sent: &[reqwest::header::HeaderValue]) {
        if let Some(token) = response.headers().get(wire::header::SESSION) {
            let mut held = self.session.lock().unwrap_or_else(PoisonError::into_inner);
            held.retain(|kept| !sent.contains(kept) && kept != token);
            held.push(token.clone());
        }
    }

    fn raise_floor(&self, key: &str, version: Version) {
        let mut floors = self.floors.lock().unwrap_or_else(PoisonError::into_inner);
        let floor = floors.entry(key.to_owned()).or_insert(version);
        *floor = (*floor).max(version);
    }

    /// Publishes `value` at `version` (`None` for `allocated` families) and raises this
    /// client's floor to the version written, so its next read sees its own write.
    ///
    /// # Errors
    /// The service's problem, mapped to an [`ErrorKind`] by its code; [`ErrorKind::Unavailable`]
    /// when the service cannot be reached.
    pub async fn publish(
        &self,
        key: &str,
        version: Option<u64>,
        value: impl Into<Bytes>,
    ) -> Result<Published> {
        let mut request = self.http.put(self.key_url(key)).body(value.into());
        if let Some(version) = version {
            request = request.query(&[(wire::query::VERSION, version.to_string())]);
        }
        self.write(key, request).await
    }

    /// Invalidates `key` at `version` (`None` for `allocated` families).
    ///
    /// # Errors
    /// As [`Client::publish`].
    pub async fn invalidate(&self, key: &str, version: Option<u64>) -> Result<Published> {
        let mut request = self.http.delete(self.key_url(key));
        if let Some(version) = version {
            request = request.query(&[(wire::query::VERSION, version.to_string())]);
        }
        self.write(key, request).await
    }

    async fn write(&self, key: &str, request: reqwest::RequestBuilder) -> Result<Published> {
        let (request, sent) = self.with_session(request);
        let response = self.authorized(request).send().await.map_err(unreachable)?;
        self.keep_session(&response, &sent);
        if !response.status().is_success() {
            return Err(problem(response).await);
        }
        let published: Published = response.json().await.map_err(unreachable)?;
        if let Ok(version) = Version::new(published.version) {
            self.raise_floor(key, version);
        }
        Ok(published)
    }

    /// Reads `key` through this client's affine copy, never older than the floor it holds.
    /// `Ok(None)` when the key is missing or invalidated; an invalidation's version (the 404's
    /// `Hotsplit-Version`) raises this client's floor like a value's.
    ///
    /// # Errors
    /// [`ErrorKind::BelowVersionFloor`] when no copy has caught up with this client's floor yet
    /// (retry later); other problems mapped by their code.
    pub async fn read(&self, key: &str) -> Result<Option<Read>> {
        let mut request = self
            .http
            .get(self.key_url(key))
            .header(wire::header::CLIENT, &self.client_id);
        if let Some(floor) = self.floor(key) {
            request = request.header(wire::header::MIN_VERSION, floor.to_string());
        }
        let (request, sent) = self.with_session(request);
        let response = self.authorized(request).send().await.map_err(unreachable)?;
        self.keep_session(&response, &sent);
        match response.status() {
            reqwest::StatusCode::OK => {}
            reqwest::StatusCode::NOT_FOUND => {
                // A tombstone's 404 names its version: holding it as the floor keeps this
                // client from reading an older value (or an older tombstone) next.
                let invalidated_at = response
                    .headers()
                    .get(wire::header::VERSION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|text| text.parse::<Version>().ok());
                if let Some(version) = invalidated_at {
                    self.raise_floor(key, version);
                }
                return Ok(None);
            }
            _ => return Err(problem(response).await),
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let version: Version = header(wire::header::VERSION)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("the answer has no {} header", wire::header::VERSION),
                )
            })?
            .parse()?;
        let copy = header(wire::header::COPY)
            .and_then(|copy| copy.parse().ok())
            .unwrap_or(0);
        let value = response.bytes().await.map_err(unreachable)?;
        self.raise_floor(key, version);
        Ok(Some(Read {
            value,
            version,
            copy,
        }))
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}/v1/keys/{key}", self.base)
    }
}

/// How long a request may take, unless [`Client::with_timeout`] says otherwise: a service that
/// never answers must not hang its caller.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

fn http_client(timeout: Duration) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("building the HTTP client: {err}"),
            )
        })
}

fn unreachable(err: reqwest::Error) -> Error {
    if err.is_timeout() {
        return Error::new(
            ErrorKind::Timeout,
            format!("hotsplit service did not answer in time: {err}"),
        );
    }
    Error::new(
        ErrorKind::Unavailable,
        format!("hotsplit service unreachable: {err}"),
    )
}

/// Maps a problem answer back to an [`Error`] by its stable code.
async fn problem(response: reqwest::Response) -> Error {
    let status = response.status();
    let Ok(problem) = response.json::<Problem>().await else {
        return Error::new(
            ErrorKind::Unavailable,
            format!("hotsplit answered {status}"),
        );
    };
    let kind = match problem.code.as_str() {
        "invalid_key" => ErrorKind::InvalidKey,
        "invalid_version" | "stale_version" | "version_conflict" => ErrorKind::InvalidVersion,
        "missing_client" => ErrorKind::MissingClient,
        "invalid_copy" => ErrorKind::InvalidCopy,
        "invalid_parameter" => ErrorKind::InvalidParameter,
        "value_too_large" => ErrorKind::ValueTooLarge,
        "not_found" => ErrorKind::NotFound,
        "below_version_floor" => ErrorKind::BelowVersionFloor,
        "unauthorized" => ErrorKind::Unauthorized,
        "forbidden" => ErrorKind::Forbidden,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("{}: {}", problem.code, problem.detail))
}
