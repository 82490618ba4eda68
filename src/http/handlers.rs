//! Request handlers: parse, call the library, render. Each is documented for the OpenAPI spec.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::problem::{ApiError, Code};
use super::AppState;
use crate::key::{Key, Version};
use crate::publish::{PublishReport, PublishStatus, SyncReplicas};
use crate::read::{CopyChoice, ReadAnswer, ReadRequest};
use crate::store::NodeLabel;
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
    version: Option<String>,
    /// The writer's client id (or `Hotsplit-Client`): its reads of this key then see at least
    /// this version for the family's `pin_window`.
    client: Option<String>,
    /// `PUT` only: wait until this many replicas of each written copy's node acknowledge
    /// (`WAIT`), at most the replicas known for that node. Requires `sync_timeout_ms`.
    sync_replicas: Option<String>,
    /// `PUT` only: how long to wait for `sync_replicas`, 1..=5000 ms.
    sync_timeout_ms: Option<String>,
}

fn parse_sync(params: &WriteParams) -> Result<Option<SyncReplicas>, ApiError> {
    let invalid = |why: String| ApiError::new(Code::InvalidParameter, why);
    match (&params.sync_replicas, &params.sync_timeout_ms) {
        (None, None) => Ok(None),
        (Some(replicas), Some(timeout)) => {
            let replicas = replicas.parse::<u32>().map_err(|_| {
                invalid(format!(
                    "{} {replicas:?} is not a replica count",
                    wire::query::SYNC_REPLICAS
                ))
            })?;
            let timeout_ms = timeout.parse::<u64>().map_err(|_| {
                invalid(format!(
                    "{} {timeout:?} is not a number of milliseconds",
                    wire::query::SYNC_TIMEOUT_MS
                ))
            })?;
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
    /// The client id whose affine copy to read (or the `Hotsplit-Client` header).
    client: Option<String>,
    /// A version floor: a copy below it is never served (or `Hotsplit-Min-Version`).
    min_version: Option<String>,
    /// Read one named copy instead of the affine one, for operators and tests.
    copy: Option<String>,
    /// The read class (or `Hotsplit-Read-Class`); default: the family's `default_class`.
    class: Option<String>,
}

/// Query parameters of `GET /v1/affinity`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AffinityParams {
    /// The key.
    key: Option<String>,
    /// The client id.
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

/// The answer of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusBody {
    /// `ok` or `ready`.
    status: &'static str,
    /// The store kind: `embedded`, `redis` or `redis-cluster`.
    store: &'static str,
    /// `/readyz` only: families whose layout recorded in Redis differs from this instance's
    /// config (another instance runs another copy count). Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    layout_mismatches: Vec<String>,
    /// `/readyz` only: primaries (`host:port`) that lack the function library (they refused
    /// `FUNCTION LOAD` or did not answer); their copies queue until a background retry loads
    /// it. Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    library_missing: Vec<String>,
    /// `/readyz` only: nodes (`host:port`) known to be failing, or back but with queued copies
    /// not yet flushed: their copy writes are queued at once (`node_failing`) while failing, and
    /// reads of their copies go to sibling copies until they are flushed. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes_avoided: Vec<String>,
}

fn parse_version(raw: &str, name: &str) -> Result<Version, ApiError> {
    raw.parse::<Version>()
        .map_err(|err| ApiError::new(Code::InvalidVersion, format!("{name}: {}", err.message())))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value.to_str().map(Some).map_err(|_| {
            ApiError::new(
                Code::InvalidParameter,
                format!("header {name} is not visible ascii"),
            )
        }),
    }
}

/// Parses `If-None-Match` into the highest version among its entity tags.
///
/// Weak tags (`W/"5"`) and lists (`"5", "7"`) are accepted; tags that are not versions (another
/// server's ETags, `*`) are ignored, which only means the full body is sent.
pub fn parse_if_none_match(value: &str) -> Option<Version> {
    value
        .split(',')
        .filter_map(|tag| {
            let tag = tag.trim();
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            tag.strip_prefix('"')?
                .strip_suffix('"')?
                .parse::<Version>()
                .ok()
        })
        .max()
}

/// The request headers a read uses, taken by reference (axum's `HeaderMap` extractor would
/// clone every header of every read).
pub struct ReadHeaders {
    /// `Hotsplit-Client`.
    client: Option<String>,
    /// `Hotsplit-Min-Version`, unparsed.
    min_version: Option<String>,
    /// The highest version among the `If-None-Match` tags.
    if_none_match: Option<Version>,
    /// `Hotsplit-Read-Class`.
    read_class: Option<String>,
    /// `Hotsplit-Request`.
    request_id: Option<String>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ReadHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        let headers = &parts.headers;
        Ok(ReadHeaders {
            client: header_text(headers, wire::header::CLIENT)?.map(str::to_owned),
            min_version: header_text(headers, wire::header::MIN_VERSION)?.map(str::to_owned),
            if_none_match: header_text(headers, header::IF_NONE_MATCH.as_str())?
                .and_then(parse_if_none_match),
            read_class: header_text(headers, wire::header::READ_CLASS)?.map(str::to_owned),
            request_id: header_text(headers, wire::header::REQUEST)?.map(str::to_owned),
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
    let client = match params_client {
        Some(client) => Some(client),
        None => header_text(headers, wire::header::CLIENT)?.map(str::to_owned),
    };
    let request_id = header_text(headers, wire::header::REQUEST)?.map(str::to_owned);
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
        ("key" = String, Path, description = "1..=512 printable ASCII bytes without '{', '}' or '#'"),
        WriteParams,
        ("Hotsplit-Client" = Option<String>, Header, description = "The writer's client id, instead of ?client=: its reads of this key see at least this version for pin_window"),
        ("Hotsplit-Request" = Option<String>, Header, description = "A request id: later reads carrying it go to primaries for route.request_pin_window"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The raw value"),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current; Hotsplit-Version carries the version written (send it back as min_version for read-your-writes through any instance)", body = PublishReport),
        (status = 202, description = "Some copy writes failed and every one of them was durably queued for retry (outcome `queued`, count in `queued`)", body = PublishReport),
        (status = 400, description = "invalid_key, invalid_version or invalid_parameter", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version: nothing applied, a copy holds a newer version; version_conflict: a copy holds this version with a different body (body also carries the report)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "value_too_large", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete: some copy failed and was not queued (outcome `dropped`), retry the same version (body also carries the report); or unavailable", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn publish_key(
    State(state): State<AppState>,
    Path(raw_key): Path<String>,
    params: Result<Query<WriteParams>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = Key::parse(&raw_key)?;
    let Query(params) = params?;
    let writer = writer(params.client.clone(), &headers)?;
    let version = write_version(&params)?;
    let sync = parse_sync(&params)?;
    let body = body.map_err(|rejection| body_error(&rejection, &state))?;
    let publisher = &state.inner().publisher;
    let report = match sync {
        None => publisher.publish(&key, version.into(), body).await?,
        Some(sync) => {
            publisher
                .publish_synced(&key, version.into(), body, sync)
                .await?
        }
    };
    Ok(publish_response(report, &state, &key, &writer))
}

/// The `?version=` of a write, when it carries one.
fn write_version(params: &WriteParams) -> Result<Option<Version>, ApiError> {
    params
        .version
        .as_deref()
        .map(|raw| parse_version(raw, wire::query::VERSION))
        .transpose()
}

fn body_error(rejection: &BytesRejection, state: &AppState) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            Code::ValueTooLarge,
            format!(
                "the value is larger than {} bytes",
                state.inner().max_value_bytes
            ),
        )
    } else {
        ApiError::new(
            Code::InvalidParameter,
            format!("the body could not be read: {}", rejection.body_text()),
        )
    }
}

/// Invalidates a key: writes a versioned tombstone to every copy.
#[utoipa::path(
    delete,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "The key"),
        WriteParams,
        ("Hotsplit-Client" = Option<String>, Header, description = "The writer's client id, instead of ?client="),
        ("Hotsplit-Request" = Option<String>, Header, description = "A request id: later reads carrying it go to primaries"),
    ),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current", body = PublishReport),
        (status = 400, description = "invalid_key, invalid_version or invalid_parameter", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version or version_conflict", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete or unavailable", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn invalidate_key(
    State(state): State<AppState>,
    Path(raw_key): Path<String>,
    params: Result<Query<WriteParams>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = Key::parse(&raw_key)?;
    let Query(params) = params?;
    if params.sync_replicas.is_some() || params.sync_timeout_ms.is_some() {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("{} is supported on PUT only", wire::query::SYNC_REPLICAS),
        ));
    }
    let writer = writer(params.client.clone(), &headers)?;
    let version = write_version(&params)?;
    let report = state
        .inner()
        .publisher
        .invalidate(&key, version.into())
        .await?;
    Ok(publish_response(report, &state, &key, &writer))
}

/// Reads a key through the client's affine copy.
#[utoipa::path(
    get,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "The key"),
        ReadParams,
        ("Hotsplit-Client" = Option<String>, Header, description = "The client id, instead of ?client="),
        ("Hotsplit-Min-Version" = Option<String>, Header, description = "A version floor, instead of ?min_version="),
        ("If-None-Match" = Option<String>, Header, description = "Entity tags (\"V\", W/\"V\", lists); a floor too: 304 when no consulted copy is newer"),
        ("Hotsplit-Read-Class" = Option<String>, Header, description = "The read class, instead of ?class="),
        ("Hotsplit-Request" = Option<String>, Header, description = "A request id: after a write carrying it, reads carrying it go to primaries for route.request_pin_window"),
    ),
    responses(
        (status = 200, description = "The raw value; headers ETag, Hotsplit-Version, Hotsplit-Copy, Hotsplit-Served-By (host:port;role=primary|replica), Hotsplit-Route (class=NAME;reason=class|own-write|request-pin|lag-breach|no-replica|version-floor), Vary", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 304, description = "Not modified: no consulted copy is newer than the If-None-Match version"),
        (status = 400, description = "invalid_key, missing_client, invalid_copy, invalid_version, invalid_parameter, unknown_class, or class_not_allowed (decides-on-presence on a split family)", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "not_found: missing, expired or invalidated; an invalidated key's answer carries Hotsplit-Version (the tombstone's version), a key with no record none", body = super::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "below_version_floor, staleness_budget_exceeded (every replica over the class's budget, on_breach = fail) or unavailable, with Retry-After", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read_key(
    State(state): State<AppState>,
    Path(raw_key): Path<String>,
    params: Result<Query<ReadParams>, QueryRejection>,
    headers: ReadHeaders,
) -> Result<Response, ApiError> {
    let request = read_request(raw_key, params?.0, headers)?;
    let answer = state.inner().reader.read(&request).await?;
    Ok(read_response(answer, &state))
}

/// Puts a read's path, query and headers together; the query wins over a header.
fn read_request(
    raw_key: String,
    params: ReadParams,
    headers: ReadHeaders,
) -> Result<ReadRequest, ApiError> {
    // The path segment and the client id are moved into the request, not copied.
    let key = Key::parse_owned(raw_key)?;
    let client = params.client.or(headers.client);
    let copy = match (&params.copy, client) {
        (Some(raw), _) => CopyChoice::Named(raw.parse::<u32>().map_err(|_| {
            ApiError::new(
                Code::InvalidCopy,
                format!("{} {raw:?} is not a copy index", wire::query::COPY),
            )
        })?),
        (None, Some(client)) if !client.is_empty() => CopyChoice::Client(client),
        _ => {
            return Err(ApiError::new(
                Code::MissingClient,
                "send ?client=ID or the Hotsplit-Client header: reads without a client id would flip between copies",
            ))
        }
    };
    let min_version = match (&params.min_version, headers.min_version.as_deref()) {
        (Some(raw), _) => Some(parse_version(raw, wire::query::MIN_VERSION)?),
        (None, Some(raw)) => Some(parse_version(raw, "Hotsplit-Min-Version")?),
        (None, None) => None,
    };
    Ok(ReadRequest {
        key,
        copy,
        min_version,
        if_none_match: headers.if_none_match,
        class: params.class.or(headers.read_class),
        request_id: headers.request_id,
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
    let class = &state
        .inner()
        .reader
        .router()
        .classes()
        .get(route.class)
        .name;
    if let Ok(value) =
        HeaderValue::from_str(&format!("class={class};reason={}", route.reason.as_str()))
    {
        headers.insert(ROUTE, value);
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
        (status = 400, description = "invalid_key or missing_client", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn affinity(
    State(state): State<AppState>,
    params: Result<Query<AffinityParams>, QueryRejection>,
) -> Result<Json<AffinityBody>, ApiError> {
    let Query(params) = params?;
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

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Alive", body = StatusBody)))]
pub async fn healthz(State(state): State<AppState>) -> Response {
    Json(StatusBody {
        status: "ok",
        store: state.inner().store.kind(),
        layout_mismatches: Vec::new(),
        library_missing: Vec::new(),
        nodes_avoided: Vec::new(),
    })
    .into_response()
}

/// The store answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = StatusBody),
        (status = 503, description = "unavailable: the store does not answer", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<StatusBody>, ApiError> {
    state.inner().store.ping().await?;
    Ok(Json(StatusBody {
        status: "ready",
        store: state.inner().store.kind(),
        layout_mismatches: state.inner().heal.layouts.mismatches(),
        library_missing: state
            .inner()
            .store
            .library_missing()
            .iter()
            .map(NodeLabel::to_string)
            .collect(),
        nodes_avoided: state
            .inner()
            .store
            .avoided_nodes()
            .iter()
            .map(NodeLabel::to_string)
            .collect(),
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
    /// How many entries to list, oldest first, 0..=10000. Default: 100.
    limit: Option<usize>,
}

/// The retry queue: depth, bytes, per-node backoff state and the oldest entries.
#[utoipa::path(
    get,
    path = "/v1/retry-queue",
    tag = "operations",
    params(RetryQueueParams),
    responses(
        (status = 200, description = "The retry queue", body = crate::heal::RetryQueueView),
        (status = 400, description = "invalid_parameter", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry_queue(
    State(state): State<AppState>,
    params: Result<Query<RetryQueueParams>, QueryRejection>,
) -> Result<Json<crate::heal::RetryQueueView>, ApiError> {
    let limit = params?.0.limit.unwrap_or(100);
    if limit > 10_000 {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("{} must be at most 10000, got {limit}", wire::query::LIMIT),
        ));
    }
    Ok(Json(state.inner().heal.retry_queue.view(limit)))
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
    use axum::http::Uri;

    /// Deserializes `query` into `T` as the route's `Query` extractor does.
    fn query<T: serde::de::DeserializeOwned>(query: &str) -> T {
        let uri: Uri = format!("/x?{query}").parse().unwrap();
        Query::<T>::try_from_uri(&uri).unwrap().0
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
        assert_eq!(retry.limit, Some(5));
    }

    #[test]
    fn if_none_match_takes_the_highest_version_tag() {
        assert_eq!(parse_if_none_match("\"5\"").map(Version::get), Some(5));
        assert_eq!(parse_if_none_match("W/\"5\"").map(Version::get), Some(5));
        assert_eq!(
            parse_if_none_match("\"5\", W/\"9\" , \"7\"").map(Version::get),
            Some(9)
        );
        assert_eq!(parse_if_none_match("*"), None);
        assert_eq!(parse_if_none_match("\"abc\""), None);
        assert_eq!(parse_if_none_match("\"05\""), None);
    }
}
