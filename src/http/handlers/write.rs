//! The write routes: `PUT` (publish) and `DELETE` (invalidate) `/v1/keys/{key}`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::VERSION;
use crate::deadline::Deadline;
use crate::error::{Error, Refusal};
use crate::http::overload::{Admission, Admitted};
use crate::http::params::{self, KeyPath, StrictQuery};
use crate::http::problem::{ApiError, Code};
use crate::http::session::{SessionToken, WithSession};
use crate::http::AppState;
use crate::key::{Key, Version};
use crate::ops::{Caller, ClientSession, Edit, PublishCall, PublishOutcome, Writer};
use crate::publish::{PublishReport, PublishStatus, SyncReplicas};
use crate::wire;

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

/// Who wrote: the client id (`?client=` or `Hotsplit-Client`) and the request id
/// (`Hotsplit-Request`) a write carried.
fn writer(params_client: Option<String>, headers: &HeaderMap) -> Result<Writer, ApiError> {
    let client = params::one_identity(params_client, headers, &params::CLIENT)?;
    let request_id = params::request_id(headers)?;
    Ok(Writer {
        caller: client.map(Caller::Client),
        request_id,
    })
}

/// Renders what a write did: the report with 200 or 202, or the problem of a refused or
/// incomplete write (the report's members included), with `Hotsplit-Version` when it left a
/// floor.
fn write_response(outcome: PublishOutcome) -> Result<Response, ApiError> {
    let PublishOutcome {
        report,
        status,
        floor,
    } = outcome;
    let version = report.version;
    let refused = |code: Code, detail: String| {
        ApiError::new(code, detail)
            .with_extension(serde_json::to_value(&report).unwrap_or_default())
    };
    let mut response = match status {
        PublishStatus::Done => (StatusCode::OK, Json(&report)).into_response(),
        PublishStatus::Queued => (StatusCode::ACCEPTED, Json(&report)).into_response(),
        PublishStatus::Stale => {
            return Err(refused(
                Code::StaleVersion,
                report.shortfall().unwrap_or_default(),
            ))
        }
        PublishStatus::Conflict => {
            return Err(refused(
                Code::VersionConflict,
                format!(
                    "{}: publish a new version",
                    report.shortfall().unwrap_or_default()
                ),
            ))
        }
        PublishStatus::Incomplete => {
            let incomplete = refused(
                Code::PublishIncomplete,
                format!(
                    "{}; retrying version {version} is safe",
                    report.shortfall().unwrap_or_default()
                ),
            )
            .retry_later();
            return Err(match floor {
                Some(floor) => incomplete.with_version(floor.version),
                None => incomplete,
            });
        }
    };
    if let Some(floor) = floor {
        response
            .headers_mut()
            .insert(VERSION, HeaderValue::from(floor.version.get()));
    }
    Ok(response)
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
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. With calls at once, send every token held (several lines, or comma-separated): they are merged, a floor only ever rising. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The raw value"),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current; Hotsplit-Version carries the version written (send it back as min_version for read-your-writes through any instance)", body = PublishReport),
        (status = 202, description = "Some copy writes failed and every one of them was durably queued for retry (outcome `queued`, count in `queued`)", body = PublishReport),
        (status = 400, description = "invalid_key (also a malformed percent escape or invalid UTF-8), invalid_version (missing for a caller family, sent to an allocated one) or invalid_parameter (a malformed or repeated parameter, disagreeing header lines, sync_replicas above the replicas known)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version: nothing applied, a copy holds a newer version; version_conflict: a copy holds this version with a different body (body also carries the report)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "value_too_large: the body, or its declared Content-Length (checked before `100 Continue`), is over server.max_value_bytes", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete: some copy failed and was not queued (outcome `dropped`), retry the same version (body also carries the report); unavailable; or deadline_exceeded: server.request_deadline passed before any copy write was sent (copies sent but unanswered at the deadline are reported queued instead)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 507, description = "store_full: the embedded store would pass store.memory_max_bytes; the publish was refused whole and no copy changed (invalidations are still taken)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn publish_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    StrictQuery(params): StrictQuery<WriteParams>,
    mut token: SessionToken,
    request: Request,
) -> WithSession<Result<Response, ApiError>> {
    let answer = publish(&state, key, params, request, &mut token.session).await;
    token.answer(answer, &state)
}

/// The publish of [`publish_key`]: parsed (the body read last), published through the
/// operations, rendered.
async fn publish(
    state: &AppState,
    key: Key,
    params: WriteParams,
    request: Request,
    session: &mut ClientSession,
) -> Result<Response, ApiError> {
    let writer = writer(params.client.clone(), request.headers())?;
    let version = write_version(params.version.as_deref())?;
    let sync = parse_sync(&params)?;
    // Held until the publish returns: its in-flight slot, taken once the body arrived.
    let (value, admitted) = read_value(request, state).await?;
    let call = PublishCall {
        key,
        version,
        edit: Edit::Value(value),
        writer,
        sync,
        deadline: admitted.deadline,
    };
    let outcome = state.ops().publish(call, session).await;
    drop(admitted);
    write_response(outcome?)
}

/// The `?version=` of a write, when it carries one.
fn write_version(raw: Option<&str>) -> Result<Option<Version>, ApiError> {
    raw.map(|raw| params::parse_version(raw, wire::query::VERSION))
        .transpose()
}

/// Reads the value of a publish, refusing one larger than `server.max_value_bytes`, then
/// admits the publish (its in-flight slot and its deadline start once the body has arrived).
///
/// A declared `Content-Length` over the limit is refused before the body is polled: hyper
/// answers `Expect: 100-continue` with `100 Continue` only when the body is first read, so a
/// client that waits for it gets the 413 instead and never sends the value. While it arrives
/// the body counts against the receiving bound, which may refuse it (503 `overloaded`) first.
async fn read_value(mut request: Request, state: &AppState) -> Result<(Bytes, Admitted), ApiError> {
    let max = state.ops().max_value_bytes();
    // The same refusal the operations layer makes of a value over the bound, worded once.
    let too_large = || {
        ApiError::from(Error::refused(Refusal::ValueTooLarge {
            bytes: max.saturating_add(1),
            limit: max,
        }))
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        return Err(too_large());
    }
    let admission = request.extensions_mut().remove::<Admission>();
    let deadline = request.extensions().get::<Deadline>().copied();
    let receiving = admission
        .as_ref()
        .map(|admission| admission.receive(declared.unwrap_or(max as u64)))
        .transpose()?;
    let body = Bytes::from_request(request, state)
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
        })?;
    drop(receiving);
    let admitted = match admission {
        Some(admission) => admission.admit()?,
        None => Admitted::unlimited(deadline),
    };
    Ok((body, admitted))
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
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. With calls at once, send every token held (several lines, or comma-separated): they are merged, a floor only ever rising. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    responses(
        (status = 200, description = "No copy failed; at least one applied or all are current", body = PublishReport),
        (status = 202, description = "Some copy writes failed and every one of them was durably queued for retry (outcome `queued`, count in `queued`)", body = PublishReport),
        (status = 400, description = "invalid_key, invalid_version or invalid_parameter (including sync_replicas or sync_timeout_ms, which an invalidation refuses)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "stale_version or version_conflict", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "publish_incomplete, unavailable, or deadline_exceeded (nothing was sent before server.request_deadline)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn invalidate_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    StrictQuery(params): StrictQuery<InvalidateParams>,
    mut token: SessionToken,
    request: Request,
) -> WithSession<Result<Response, ApiError>> {
    let (parts, _) = request.into_parts();
    let answer = invalidate(&state, key, params, &parts, &mut token.session).await;
    token.answer(answer, &state)
}

/// The invalidation of [`invalidate_key`]: parsed, written through the operations, rendered.
async fn invalidate(
    state: &AppState,
    key: Key,
    params: InvalidateParams,
    request: &axum::http::request::Parts,
    session: &mut ClientSession,
) -> Result<Response, ApiError> {
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
    let call = PublishCall {
        writer: writer(params.client, &request.headers)?,
        version: write_version(params.version.as_deref())?,
        key,
        edit: Edit::Tombstone,
        sync: None,
        deadline: request.extensions.get::<Deadline>().copied(),
    };
    write_response(state.ops().publish(call, session).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::handlers::query;

    #[test]
    fn the_write_parameters_read_the_wire_names() {
        use wire::query;
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
    }
}
