//! Request handlers: parse, call the library, render. Each is documented for the OpenAPI spec.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::params::{self, KeyPath, StrictQuery};
use super::problem::{ApiError, Code};
use super::session::{self, SessionToken};
use super::AppState;
use crate::deadline::Deadline;
use crate::fleet::session::SessionFloor;
use crate::key::{Key, Version};
use crate::publish::{PublishReport, PublishStatus, SyncReplicas};
use crate::read::{CopyChoice, ReadAnswer, ReadRequest};
use crate::route::Floors;
use crate::store::now_unix_ms;
use crate::wire;

/// `Hotsplit-Version`, checked at compile time.
const VERSION: HeaderName = HeaderName::from_static(wire::header::VERSION);
/// `Hotsplit-Copy`.
const COPY: HeaderName = HeaderName::from_static(wire::header::COPY);
/// `Hotsplit-Served-By`.
const SERVED_BY: HeaderName = HeaderName::from_static(wire::header::SERVED_BY);
/// `Hotsplit-Route`.
const ROUTE: HeaderName = HeaderName::from_static(wire::header::ROUTE);

/// Query parameters of `PUT` and `DELETE /v1/keys/{key}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteParams {
    /// The edit's version: canonical decimal, 1..=18446744073709551615. Required for `caller`
    /// families, refused for `allocated` ones.
    #[param(
        pattern = r"^(?:[1-9][0-9]{0,18}|1[0-7][0-9]{18}|18[0-3][0-9]{17}|184[0-3][0-9]{16}|1844[0-5][0-9]{15}|18446[0-6][0-9]{14}|184467[0-3][0-9]{13}|1844674[0-3][0-9]{12}|184467440[0-6][0-9]{10}|1844674407[0-2][0-9]{9}|18446744073[0-6][0-9]{8}|1844674407370[0-8][0-9]{6}|18446744073709[0-4][0-9]{5}|184467440737095[0-4][0-9]{4}|18446744073709550[0-9]{3}|18446744073709551[0-5][0-9]{2}|1844674407370955160[0-9]|1844674407370955161[0-4]|18446744073709551615)$"
    )]
    version: Option<String>,
    /// The writer's client id (or `Hotsplit-Client`, which it wins over): its reads of this key
    /// then see at least this version for the family's `pin_window`.
    client: Option<String>,
    /// Wait until this many replicas of each written copy's node acknowledge (`WAIT`), at most
    /// the replicas known for that node. Requires `sync_timeout_ms`.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 64)]
    sync_replicas: Option<String>,
    /// How long to wait for `sync_replicas`, 1..=5000 ms.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 5000)]
    sync_timeout_ms: Option<String>,
}

/// Query parameters of `DELETE /v1/keys/{key}`: those of a write without the replica wait,
/// which an invalidation refuses.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InvalidateParams {
    /// The tombstone's version: canonical decimal, 1..=18446744073709551615. Required for
    /// `caller` families, refused for `allocated` ones.
    #[param(
        pattern = r"^(?:[1-9][0-9]{0,18}|1[0-7][0-9]{18}|18[0-3][0-9]{17}|184[0-3][0-9]{16}|1844[0-5][0-9]{15}|18446[0-6][0-9]{14}|184467[0-3][0-9]{13}|1844674[0-3][0-9]{12}|184467440[0-6][0-9]{10}|1844674407[0-2][0-9]{9}|18446744073[0-6][0-9]{8}|1844674407370[0-8][0-9]{6}|18446744073709[0-4][0-9]{5}|184467440737095[0-4][0-9]{4}|18446744073709550[0-9]{3}|18446744073709551[0-5][0-9]{2}|1844674407370955160[0-9]|1844674407370955161[0-4]|18446744073709551615)$"
    )]
    version: Option<String>,
    /// The writer's client id (or `Hotsplit-Client`, which it wins over).
    client: Option<String>,
    /// Refused: an invalidation does not wait for replicas.
    #[param(ignore)]
    sync_replicas: Option<String>,
    /// Refused, as `sync_replicas`.
    #[param(ignore)]
    sync_timeout_ms: Option<String>,
}

fn parse_sync(params: &WriteParams) -> Result<Option<SyncReplicas>, ApiError> {
    let invalid = |why: String| ApiError::new(Code::InvalidParameter, why);
    match (&params.sync_replicas, &params.sync_timeout_ms) {
        (None, None) => Ok(None),
        (Some(replicas), Some(timeout)) => {
            let replicas = params::parse_canonical_u64(replicas, wire::query::SYNC_REPLICAS)
                .map_err(invalid)?;
            let replicas = u32::try_from(replicas).map_err(|_| {
                invalid(format!(
                    "{} {replicas} is larger than any replica count",
                    wire::query::SYNC_REPLICAS
                ))
            })?;
            let timeout_ms = params::parse_canonical_u64(timeout, wire::query::SYNC_TIMEOUT_MS)
                .map_err(invalid)?;
            Ok(Some(SyncReplicas {
                replicas,
                timeout_ms,
            }))
        }
        _ => Err(invalid(format!(
            "send {} and {} together",
            wire::query::SYNC_REPLICAS,
            wire::query::SYNC_TIMEOUT_MS
        ))),
    }
}

/// Query parameters of `GET /v1/keys/{key}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadParams {
    /// The client id whose affine copy to read (or the `Hotsplit-Client` header, which it wins
    /// over). Required unless `copy` is sent.
    #[param(min_length = 1)]
    client: Option<String>,
    /// A version floor: a copy below it is never served. Combined with every
    /// `Hotsplit-Min-Version` value by maximum.
    #[param(
        pattern = r"^(?:[1-9][0-9]{0,18}|1[0-7][0-9]{18}|18[0-3][0-9]{17}|184[0-3][0-9]{16}|1844[0-5][0-9]{15}|18446[0-6][0-9]{14}|184467[0-3][0-9]{13}|1844674[0-3][0-9]{12}|184467440[0-6][0-9]{10}|1844674407[0-2][0-9]{9}|18446744073[0-6][0-9]{8}|1844674407370[0-8][0-9]{6}|18446744073709[0-4][0-9]{5}|184467440737095[0-4][0-9]{4}|18446744073709550[0-9]{3}|18446744073709551[0-5][0-9]{2}|1844674407370955160[0-9]|1844674407370955161[0-4]|18446744073709551615)$"
    )]
    min_version: Option<String>,
    /// Read one named copy instead of the affine one, for operators and tests: canonical
    /// decimal, below the family's copy count (at most 1024 copies).
    #[param(value_type = Option<u32>, minimum = 0, maximum = 1023)]
    copy: Option<String>,
    /// The read class (or `Hotsplit-Read-Class`, which it wins over); default: the family's
    /// `default_class`.
    #[param(min_length = 1)]
    class: Option<String>,
}

/// Query parameters of `GET /v1/affinity`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AffinityParams {
    /// The key: 1..=512 printable ASCII bytes without '{', '}' or '#'.
    #[param(required = true, value_type = String, min_length = 1, max_length = 512, pattern = r##"^[!-"$-z|~]+$"##)]
    key: Option<String>,
    /// The client id.
    #[param(required = true, value_type = String, min_length = 1)]
    client: Option<String>,
}

/// Which copy a client reads.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AffinityBody {
    /// The key.
    key: String,
    /// The copy index the client reads.
    copy: u32,
    /// The copy's stored key, `K#i`.
    copy_key: String,
    /// How many copies the key's family has.
    copies: u32,
    /// The node that owns the copy.
    node: String,
}

/// The request headers a read uses, taken by reference (axum's `HeaderMap` extractor would
/// clone every header of every read).
pub struct ReadHeaders {
    /// `Hotsplit-Client`; its lines agree.
    client: Option<String>,
    /// The highest `Hotsplit-Min-Version` over every line and list member.
    min_version: Option<Version>,
    /// The highest version among the tags of every `If-None-Match` line.
    if_none_match: Option<Version>,
    /// `Hotsplit-Read-Class`; its lines agree.
    read_class: Option<String>,
    /// `Hotsplit-Request`; its lines agree.
    request_id: Option<String>,
    /// The request's deadline, put in its extensions by the overload layer.
    deadline: Option<Deadline>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ReadHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        let headers = &parts.headers;
        Ok(ReadHeaders {
            client: params::one_identity(None, headers, wire::header::CLIENT)?,
            min_version: params::highest_floor(
                None,
                wire::query::MIN_VERSION,
                headers,
                wire::header::MIN_VERSION,
            )?,
            if_none_match: params::if_none_match(headers)?,
            read_class: params::one_identity(None, headers, wire::header::READ_CLASS)?,
            request_id: params::request_id(headers)?,
            deadline: parts.extensions.get::<Deadline>().copied(),
        })
    }
}

/// Who wrote: the client id and request id a write carried.
struct Writer {
    /// `?client=` or `Hotsplit-Client`.
    client: Option<String>,
    /// `Hotsplit-Request`.
    request_id: Option<String>,
}

fn writer(params_client: Option<String>, headers: &HeaderMap) -> Result<Writer, ApiError> {
    let client = params::one_identity(params_client, headers, wire::header::CLIENT)?;
    let request_id = params::request_id(headers)?;
    Ok(Writer { client, request_id })
}

fn publish_response(
    report: PublishReport,
    state: &AppState,
    key: &Key,
    writer: &Writer,
) -> Response {
    let version = report.version;
    let status = report.status();
    let refused = matches!(status, PublishStatus::Stale | PublishStatus::Conflict);
    if !refused {
        // The write reached at least one copy, or is queued for retry: the writer's reads of
        // this key hold this floor, and its request's reads go to primaries.
        state.inner().reader.router().record_write(
            key,
            version,
            writer.client.as_deref(),
            writer.request_id.as_deref(),
        );
    }
    let mut response = publish_status_response(report, status);
    if !refused {
        if let Ok(value) = HeaderValue::from_str(&version.to_string()) {
            response.headers_mut().insert(VERSION, value);
        }
    }
    response
}

fn publish_status_response(report: PublishReport, status: PublishStatus) -> Response {
    let version = report.version;
    match status {
        PublishStatus::Done => (StatusCode::OK, Json(&report)).into_response(),
        PublishStatus::Queued => (StatusCode::ACCEPTED, Json(&report)).into_response(),
        PublishStatus::Stale => ApiError::new(
            Code::StaleVersion,
            format!(
                "no copy applied version {version}: every copy that answered holds a newer version"
            ),
        )
        .with_extension(serde_json::to_value(&report).unwrap_or_default())
        .into_response(),
        PublishStatus::Conflict => ApiError::new(
            Code::VersionConflict,
            format!(
                "{} copies hold version {version} with a different body: publish a new version",
                report.conflict
            ),
        )
        .with_extension(serde_json::to_value(&report).unwrap_or_default())
        .into_response(),
        PublishStatus::Incomplete => ApiError::new(
            Code::PublishIncomplete,
            format!(
                "{} of {} copy writes failed and {} could not be queued; retrying version {version} is safe",
                report.failed, report.copies, report.failed - report.queued
            ),
        )
        .retry_later()
        .with_extension(serde_json::to_value(&report).unwrap_or_default())
        .into_response(),
    }
}

/// Publishes a value to every copy of a key.
#[utoipa::path(
    put,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "1..=512 printable ASCII bytes without '{', '}' or '#', percent-encoded (malformed escapes and invalid UTF-8 are refused)", min_length = 1, max_length = 512, pattern = r##"^[!-"$-z|~]+$"##),
        WriteParams,
        ("Hotsplit-Client" = Option<String>, Header, nullable = false, description = "The writer's client id, instead of ?client= (which wins): its reads of this key see at least this version for pin_window. Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Request" = Option<String>, Header, nullable = false, description = "A request id: later reads carrying it go to primaries for route.request_pin_window. Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The raw value"),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current; Hotsplit-Version carries the version written (send it back as min_version for read-your-writes through any instance)", body = PublishReport),
        (status = 202, description = "Some copy writes failed and every one of them was durably queued for retry (outcome `queued`, count in `queued`)", body = PublishReport),
        (status = 400, description = "invalid_key (also a malformed percent escape or invalid UTF-8), invalid_version (missing for a caller family, sent to an allocated one) or invalid_parameter (a malformed or repeated parameter, disagreeing header lines, sync_replicas above the replicas known)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version: nothing applied, a copy holds a newer version; version_conflict: a copy holds this version with a different body (body also carries the report)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "value_too_large: the body, or its declared Content-Length (checked before `100 Continue`), is over server.max_value_bytes", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete: some copy failed and was not queued (outcome `dropped`), retry the same version (body also carries the report); unavailable; or deadline_exceeded: server.request_deadline passed before any copy write was sent (copies sent but unanswered at the deadline are reported queued instead)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 507, description = "store_full: the embedded store would pass store.memory_max_bytes; the publish was refused whole and no copy changed (invalidations are still taken)", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn publish_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    StrictQuery(params): StrictQuery<WriteParams>,
    token: SessionToken,
    request: Request,
) -> Response {
    let deadline = request.extensions().get::<Deadline>().copied();
    let publish = async {
        let writer = writer(params.client.clone(), request.headers())?;
        let version = write_version(params.version.as_deref())?;
        let sync = parse_sync(&params)?;
        let body = read_value(request, &state).await?;
        let publisher = &state.inner().publisher;
        let report = match (deadline, sync) {
            (Some(deadline), sync) => {
                publisher
                    .publish_within(&key, version.into(), body, sync, deadline)
                    .await?
            }
            (None, None) => publisher.publish(&key, version.into(), body).await?,
            (None, Some(sync)) => {
                publisher
                    .publish_synced(&key, version.into(), body, sync)
                    .await?
            }
        };
        Ok::<_, ApiError>((report, writer))
    };
    let answer = publish.await;
    write_answer(answer, &state, &key, token)
}

/// Renders a write's answer (or its error) with the writer's session token, which holds the
/// version written as an own-write floor when the write was not refused.
fn write_answer(
    answer: Result<(PublishReport, Writer), ApiError>,
    state: &AppState,
    key: &Key,
    token: SessionToken,
) -> Response {
    let SessionToken { mut session, sent } = token;
    let sessions = &state.inner().sessions;
    let mut response = match answer {
        Ok((report, writer)) => {
            if !matches!(
                report.status(),
                PublishStatus::Stale | PublishStatus::Conflict
            ) {
                // A written floor lasts as long as the edit can: the family's TTL from now
                // bounds every copy's expiry, jittered or a tombstone.
                let now_ms = now_unix_ms();
                let ttl = state.inner().reader.families().resolve(key).ttl;
                let floor = SessionFloor {
                    key_hash: sessions.key_hash(key),
                    version: report.version,
                    expire_at_ms: now_ms.saturating_add(crate::duration::millis(ttl)),
                    written: true,
                };
                sessions.record(&mut session, floor, now_ms);
            }
            publish_response(report, state, key, &writer)
        }
        Err(err) => err.into_response(),
    };
    session::attach(&mut response, sessions, &session, sent);
    response
}

/// The `?version=` of a write, when it carries one.
fn write_version(raw: Option<&str>) -> Result<Option<Version>, ApiError> {
    raw.map(|raw| params::parse_version(raw, wire::query::VERSION))
        .transpose()
}

/// Reads the value of a publish, refusing one larger than `server.max_value_bytes`.
///
/// A declared `Content-Length` over the limit is refused before the body is polled: hyper
/// answers `Expect: 100-continue` with `100 Continue` only when the body is first read, so a
/// client that waits for it gets the 413 instead and never sends the value.
async fn read_value(request: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let max = state.inner().max_value_bytes;
    let too_large = || {
        ApiError::new(
            Code::ValueTooLarge,
            format!("the value is larger than {max} bytes"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        return Err(too_large());
    }
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::new(
                    Code::InvalidParameter,
                    "the body could not be read to its end",
                )
            }
        })
}

/// Invalidates a key: writes a versioned tombstone to every copy.
#[utoipa::path(
    delete,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "1..=512 printable ASCII bytes without '{', '}' or '#', percent-encoded", min_length = 1, max_length = 512, pattern = r##"^[!-"$-z|~]+$"##),
        InvalidateParams,
        ("Hotsplit-Client" = Option<String>, Header, nullable = false, description = "The writer's client id, instead of ?client= (which wins). Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Request" = Option<String>, Header, nullable = false, description = "A request id: later reads carrying it go to primaries. Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current", body = PublishReport),
        (status = 202, description = "Some copy writes failed and every one of them was durably queued for retry (outcome `queued`, count in `queued`)", body = PublishReport),
        (status = 400, description = "invalid_key, invalid_version or invalid_parameter (including sync_replicas or sync_timeout_ms, which an invalidation refuses)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version or version_conflict", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete, unavailable, or deadline_exceeded (nothing was sent before server.request_deadline)", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn invalidate_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    StrictQuery(params): StrictQuery<InvalidateParams>,
    token: SessionToken,
    deadline: Option<Extension<Deadline>>,
    headers: HeaderMap,
) -> Response {
    let invalidate = async {
        if params.sync_replicas.is_some() || params.sync_timeout_ms.is_some() {
            return Err(ApiError::new(
                Code::InvalidParameter,
                format!(
                    "{} and {} are supported on PUT only",
                    wire::query::SYNC_REPLICAS,
                    wire::query::SYNC_TIMEOUT_MS
                ),
            ));
        }
        let writer = writer(params.client.clone(), &headers)?;
        let version = write_version(params.version.as_deref())?;
        let publisher = &state.inner().publisher;
        let report = match deadline {
            Some(Extension(deadline)) => {
                publisher
                    .invalidate_within(&key, version.into(), deadline)
                    .await?
            }
            None => publisher.invalidate(&key, version.into()).await?,
        };
        Ok((report, writer))
    };
    let answer = invalidate.await;
    write_answer(answer, &state, &key, token)
}

/// Reads a key through the client's affine copy.
#[utoipa::path(
    get,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "1..=512 printable ASCII bytes without '{', '}' or '#', percent-encoded", min_length = 1, max_length = 512, pattern = r##"^[!-"$-z|~]+$"##),
        ReadParams,
        ("Hotsplit-Client" = Option<String>, Header, nullable = false, description = "The client id, instead of ?client= (which wins). Repeated lines must be equal, compared whole (an id may contain commas)", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Min-Version" = Option<String>, Header, nullable = false, description = "A version floor. Every line and list member (\"3, 7\") and ?min_version= combine by maximum", pattern = r"^[ \t,]*(?:[1-9][0-9]{0,18}|1[0-7][0-9]{18}|18[0-3][0-9]{17}|184[0-3][0-9]{16}|1844[0-5][0-9]{15}|18446[0-6][0-9]{14}|184467[0-3][0-9]{13}|1844674[0-3][0-9]{12}|184467440[0-6][0-9]{10}|1844674407[0-2][0-9]{9}|18446744073[0-6][0-9]{8}|1844674407370[0-8][0-9]{6}|18446744073709[0-4][0-9]{5}|184467440737095[0-4][0-9]{4}|18446744073709550[0-9]{3}|18446744073709551[0-5][0-9]{2}|1844674407370955160[0-9]|1844674407370955161[0-4]|18446744073709551615)(?:[ \t]*,[ \t,]*(?:[1-9][0-9]{0,18}|1[0-7][0-9]{18}|18[0-3][0-9]{17}|184[0-3][0-9]{16}|1844[0-5][0-9]{15}|18446[0-6][0-9]{14}|184467[0-3][0-9]{13}|1844674[0-3][0-9]{12}|184467440[0-6][0-9]{10}|1844674407[0-2][0-9]{9}|18446744073[0-6][0-9]{8}|1844674407370[0-8][0-9]{6}|18446744073709[0-4][0-9]{5}|184467440737095[0-4][0-9]{4}|18446744073709550[0-9]{3}|18446744073709551[0-5][0-9]{2}|1844674407370955160[0-9]|1844674407370955161[0-4]|18446744073709551615))*[ \t,]*$"),
        ("If-None-Match" = Option<String>, Header, nullable = false, pattern = r"^[\t -~]*$", description = "Entity tags (\"V\", W/\"V\", lists, several lines: the highest counts); a floor too: 304 when no consulted copy is newer"),
        ("Hotsplit-Read-Class" = Option<String>, Header, nullable = false, description = "The read class, instead of ?class= (which wins). Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Request" = Option<String>, Header, nullable = false, description = "A request id: after a write carrying it, reads carrying it go to primaries for route.request_pin_window. Repeated lines must be equal", pattern = r"^[\t -~]*[!-~][\t -~]*$"),
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    responses(
        (status = 200, description = "The raw value; headers ETag, Hotsplit-Version, Hotsplit-Copy, Hotsplit-Served-By (host:port;role=primary|replica: for a near-cache answer, the node that filled the entry), Hotsplit-Route (class=NAME;reason=class|own-write|request-pin|lag-breach|no-replica|version-floor|lag-unmeasured, then ;source=near-cache;age_ms=N when answered from the instance's near cache, N the entry's age bound: the source's lag at fill plus its age), Age (near-cache answers only: the age bound in whole seconds), Vary", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 304, description = "Not modified: no consulted copy is newer than the If-None-Match version"),
        (status = 400, description = "invalid_key, missing_client, invalid_copy, invalid_version, invalid_parameter, unknown_class, or class_not_allowed (decides-on-presence on a split family)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "not_found: missing, expired or invalidated; an invalidated key's answer carries Hotsplit-Version (the tombstone's version), a key with no record none", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "below_version_floor, staleness_budget_exceeded (every replica over the class's budget, on_breach = fail), unavailable, or deadline_exceeded (the store did not answer within server.request_deadline), with Retry-After", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    StrictQuery(params): StrictQuery<ReadParams>,
    headers: ReadHeaders,
    token: SessionToken,
) -> Response {
    let SessionToken { mut session, sent } = token;
    let sessions = &state.inner().sessions;
    let now_ms = now_unix_ms();
    let key_hash = sessions.key_hash(&key);
    let floors = session.floors(key_hash, now_ms);
    let answer = match read_request(key, params, headers) {
        Ok(mut request) => {
            request.session = floors;
            state
                .inner()
                .reader
                .read(&request)
                .await
                .map_err(ApiError::from)
        }
        Err(err) => Err(err),
    };
    let mut response = match answer {
        Ok(answer) => {
            // Every version served becomes a floor of the session until the copy expires:
            // the client's next read, through any instance, does not go below it.
            let (ReadAnswer::Value {
                version,
                expire_at_ms,
                ..
            }
            | ReadAnswer::NotModified {
                version,
                expire_at_ms,
                ..
            }) = &answer;
            let floor = SessionFloor {
                key_hash,
                version: *version,
                expire_at_ms: *expire_at_ms,
                written: false,
            };
            sessions.record(&mut session, floor, now_ms);
            read_response(answer, &state)
        }
        Err(err) => err.into_response(),
    };
    session::attach(&mut response, sessions, &session, sent);
    response
}

/// Puts a read's path, query and headers together: the query's client and class win over the
/// headers'; floors combine by maximum.
fn read_request(
    key: Key,
    params: ReadParams,
    headers: ReadHeaders,
) -> Result<ReadRequest, ApiError> {
    // The client id is moved into the request, not copied.
    let client = params.client.or(headers.client);
    let copy = match (&params.copy, client) {
        (Some(raw), _) => {
            let index = params::parse_canonical_u64(raw, wire::query::COPY)
                .and_then(|index| {
                    u32::try_from(index).map_err(|_| {
                        format!("{} {index} is larger than any copy index", wire::query::COPY)
                    })
                })
                .map_err(|why| ApiError::new(Code::InvalidCopy, why))?;
            CopyChoice::Named(index)
        }
        (None, Some(client)) if !client.is_empty() => CopyChoice::Client(client),
        _ => {
            return Err(ApiError::new(
                Code::MissingClient,
                "send ?client=ID or the Hotsplit-Client header: reads without a client id would flip between copies",
            ))
        }
    };
    let query_floor = params
        .min_version
        .as_deref()
        .map(|raw| params::parse_version(raw, wire::query::MIN_VERSION))
        .transpose()?;
    let min_version = query_floor.max(headers.min_version);
    Ok(ReadRequest {
        key,
        copy,
        min_version,
        if_none_match: headers.if_none_match,
        class: params.class.or(headers.read_class),
        request_id: headers.request_id,
        session: Floors::default(),
        deadline: headers.deadline,
    })
}

fn read_response(answer: ReadAnswer, state: &AppState) -> Response {
    let (status, body, version, copy, served_by, route) = match answer {
        ReadAnswer::Value {
            value,
            version,
            copy,
            served_by,
            route,
            ..
        } => (
            StatusCode::OK,
            Body::from(value),
            version,
            copy,
            served_by,
            route,
        ),
        ReadAnswer::NotModified {
            version,
            copy,
            served_by,
            route,
            ..
        } => (
            StatusCode::NOT_MODIFIED,
            Body::empty(),
            version,
            copy,
            served_by,
            route,
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let version_text = version.to_string();
    if status == StatusCode::OK {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    if let Ok(value) = HeaderValue::from_str(&format!("\"{version_text}\"")) {
        headers.insert(header::ETAG, value);
    }
    if let Ok(value) = HeaderValue::from_str(&version_text) {
        headers.insert(VERSION, value);
    }
    headers.insert(COPY, HeaderValue::from(copy));
    if let Ok(value) = HeaderValue::from_str(&served_by.to_string()) {
        headers.insert(SERVED_BY, value);
    }
    let classes = state.inner().reader.router().classes();
    let class = &classes.get(route.class).name;
    let route_text = match route.near_cache_age {
        None => format!("class={class};reason={}", route.reason.as_str()),
        Some(age) => format!(
            "class={class};reason={};source=near-cache;age_ms={}",
            route.reason.as_str(),
            age.as_millis()
        ),
    };
    if let Ok(value) = HeaderValue::from_str(&route_text) {
        headers.insert(ROUTE, value);
    }
    if let Some(age) = route.near_cache_age {
        // RFC 9111's Age: whole seconds the answer may have spent in a cache, the bound rounded
        // down.
        headers.insert(header::AGE, HeaderValue::from(age.as_secs()));
    }
    // The answer depends on the client id, the floor and the read class, so a shared cache
    // must key on all three.
    headers.insert(
        header::VARY,
        HeaderValue::from_static(wire::header::READ_VARY),
    );
    response
}

/// The read classes, their reasons, and the families that use each by default.
#[utoipa::path(
    get,
    path = "/v1/classes",
    tag = "routing",
    responses((status = 200, description = "Every read class", body = Vec<crate::route::ClassView>))
)]
pub async fn classes(State(state): State<AppState>) -> Response {
    Json(state.inner().reader.router().classes_view()).into_response()
}

/// Replica lag per replica: now, p50, p99, p999, max over the window, offset gap, and whether
/// each replica class accepts it now.
#[utoipa::path(
    get,
    path = "/v1/lag",
    tag = "routing",
    responses((status = 200, description = "One line per replica", body = Vec<crate::route::ReplicaLagView>))
)]
pub async fn lag(State(state): State<AppState>) -> Response {
    Json(state.inner().reader.router().lag_view()).into_response()
}

/// Per class: how many reads the primary served, and why.
#[utoipa::path(
    get,
    path = "/v1/routing",
    tag = "routing",
    responses((status = 200, description = "One line per class", body = Vec<crate::route::ClassRouting>))
)]
pub async fn routing(State(state): State<AppState>) -> Response {
    Json(state.inner().reader.router().metrics().summary()).into_response()
}

/// Which copy a client reads for a key, and where it lives.
#[utoipa::path(
    get,
    path = "/v1/affinity",
    tag = "keys",
    params(AffinityParams),
    responses(
        (status = 200, description = "The affine copy", body = AffinityBody),
        (status = 400, description = "invalid_key, missing_client or invalid_parameter (a malformed or repeated parameter)", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn affinity(
    State(state): State<AppState>,
    StrictQuery(params): StrictQuery<AffinityParams>,
) -> Result<Json<AffinityBody>, ApiError> {
    let key = Key::parse(params.key.as_deref().unwrap_or_default())?;
    let client = params
        .client
        .filter(|client| !client.is_empty())
        .ok_or_else(|| ApiError::new(Code::MissingClient, "send ?client=ID"))?;
    let affinity = state.inner().reader.affinity(&key, &client);
    Ok(Json(AffinityBody {
        key: key.to_string(),
        copy: affinity.copy,
        copy_key: affinity.copy_key.to_string(),
        copies: affinity.copies,
        node: affinity.node,
    }))
}

/// Prometheus metrics in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "OpenMetrics text", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], {
        state.inner().heal.retry_queue.refresh_gauges();
        state.inner().metrics.render()
    })
        .into_response()
}

/// Query parameters of `GET /v1/retry-queue`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetryQueueParams {
    /// How many entries to list, oldest first: canonical decimal, 0..=10000. Default: 100.
    #[param(value_type = Option<u32>, minimum = 0, maximum = 10000)]
    limit: Option<String>,
}

/// The retry queue: depth, bytes, per-node backoff state and the oldest entries.
#[utoipa::path(
    get,
    path = "/v1/retry-queue",
    tag = "operations",
    params(RetryQueueParams),
    responses(
        (status = 200, description = "The retry queue", body = crate::heal::RetryQueueView),
        (status = 400, description = "invalid_parameter: limit is not canonical decimal in 0..=10000, or a parameter is malformed or repeated", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry_queue(
    State(state): State<AppState>,
    StrictQuery(params): StrictQuery<RetryQueueParams>,
) -> Result<Json<crate::heal::RetryQueueView>, ApiError> {
    let limit = match params.limit.as_deref() {
        None => 100,
        Some(raw) => params::parse_canonical_u64(raw, wire::query::LIMIT)
            .map_err(|why| ApiError::new(Code::InvalidParameter, why))?,
    };
    if limit > 10_000 {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("{} must be at most 10000, got {limit}", wire::query::LIMIT),
        ));
    }
    let limit = usize::try_from(limit).unwrap_or(10_000);
    Ok(Json(state.inner().heal.retry_queue.view(limit)))
}

/// The near cache: entries, bytes, hit ratio and the hottest copies by hits.
#[utoipa::path(
    get,
    path = "/v1/near-cache",
    tag = "operations",
    responses(
        (status = 200, description = "The near cache; `enabled` is false (and every figure 0) on the embedded store or with near_cache.enabled = false", body = crate::near::NearCacheView),
    )
)]
pub async fn near_cache(State(state): State<AppState>) -> Json<crate::near::NearCacheView> {
    Json(
        state
            .inner()
            .reader
            .near_cache()
            .map_or_else(crate::near::NearCacheView::off, |near| near.view(20)),
    )
}

/// Unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::new(Code::NotFound, "no such route")
}

/// Known routes with an unsupported method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not support that method",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deserializes `query` into `T` as the route's [`StrictQuery`] extractor does.
    fn query<T: serde::de::DeserializeOwned>(query: &str) -> T {
        params::from_pairs(params::decode_query(query).unwrap()).unwrap()
    }
    #[test]
    fn the_parameter_structs_read_the_wire_names() {
        use wire::query;
        let read: ReadParams = query(&format!(
            "{}=a&{}=2&{}=1&{}=advisory",
            query::CLIENT,
            query::MIN_VERSION,
            query::COPY,
            query::CLASS
        ));
        assert_eq!(
            (read.client, read.min_version, read.copy, read.class),
            (
                Some("a".to_owned()),
                Some("2".to_owned()),
                Some("1".to_owned()),
                Some("advisory".to_owned())
            )
        );
        let write: WriteParams = query(&format!(
            "{}=3&{}=a&{}=1&{}=50",
            query::VERSION,
            query::CLIENT,
            query::SYNC_REPLICAS,
            query::SYNC_TIMEOUT_MS
        ));
        assert_eq!(
            (
                write.version,
                write.client,
                write.sync_replicas,
                write.sync_timeout_ms
            ),
            (
                Some("3".to_owned()),
                Some("a".to_owned()),
                Some("1".to_owned()),
                Some("50".to_owned())
            )
        );
        let affinity: AffinityParams = query(&format!("{}=p:1&{}=a", query::KEY, query::CLIENT));
        assert_eq!(
            (affinity.key, affinity.client),
            (Some("p:1".to_owned()), Some("a".to_owned()))
        );
        let retry: RetryQueueParams = query(&format!("{}=5", query::LIMIT));
        assert_eq!(retry.limit.as_deref(), Some("5"));
    }
}
