//! The read route, `GET /v1/keys/{key}`: its query, its headers, and the answer's headers.

use std::future::Future;
use std::pin::Pin;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{answer, COPY, ROUTE, SERVED_BY, VERSION};
use crate::deadline::Deadline;
use crate::http::params::{self, KeyPath};
use crate::http::problem::{ApiError, Code};
use crate::http::session::{SessionToken, WithSession};
use crate::http::AppState;
use crate::key::{Key, Version};
use crate::ops::{Caller, ClientSession, ReadRequest};
use crate::read::ReadAnswer;
use crate::wire;

/// The headers a read answer carries: its own eight at most, the session's two
/// (`Hotsplit-Session`, `Cache-Control`; a second `Vary` line is kept apart and does not count)
/// and the request layers' `X-Request-Id`, with one to spare.
const ANSWER_HEADERS: usize = 12;

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

impl ReadParams {
    /// Reads `query` as [`StrictQuery`] would (the same checks and sentences), by hand: the
    /// four fields are matched by name, with no deserializer in between.
    ///
    /// # Errors
    /// `invalid_parameter` for a malformed escape, text that is not UTF-8, or a repeated name.
    fn from_query(query: &str) -> Result<ReadParams, ApiError> {
        let mut params = ReadParams {
            client: None,
            min_version: None,
            copy: None,
            class: None,
        };
        params::query_pairs(query, |name, value| {
            let field = match name {
                wire::query::CLIENT => &mut params.client,
                wire::query::MIN_VERSION => &mut params.min_version,
                wire::query::COPY => &mut params.copy,
                wire::query::CLASS => &mut params.class,
                // Unknown parameters are ignored, as the other routes' are.
                _ => return,
            };
            *field = Some(value.into_owned());
        })?;
        Ok(params)
    }
}

/// The query of `GET /v1/keys/{key}`, strictly decoded ([`ReadParams::from_query`]).
pub struct ReadQuery(ReadParams);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ReadQuery {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        ReadParams::from_query(parts.uri.query().unwrap_or_default()).map(ReadQuery)
    }
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
        ReadHeaders::of(&parts.headers, &parts.extensions)
    }
}

impl ReadHeaders {
    /// The read's headers among `headers`, and the deadline in `extensions`.
    ///
    /// # Errors
    /// `invalid_parameter` or `invalid_version` for a header that breaks its rule.
    fn of(headers: &HeaderMap, extensions: &Extensions) -> Result<ReadHeaders, ApiError> {
        Ok(ReadHeaders {
            client: params::one_identity(None, headers, &params::CLIENT)?,
            min_version: params::highest_floor(
                None,
                wire::query::MIN_VERSION,
                headers,
                &params::MIN_VERSION,
            )?,
            if_none_match: params::if_none_match(headers)?,
            read_class: params::one_identity(None, headers, &params::READ_CLASS)?,
            request_id: params::request_id(headers)?,
            deadline: extensions.get::<Deadline>().copied(),
        })
    }
}

/// A read's answer on the read route's fast path ([`read_key_fast`]).
pub(crate) enum FastRead {
    /// Decided from memory, with no future.
    Now(Response),
    /// The read still to run: its parts were read, and memory did not answer it.
    Later(Pin<Box<dyn Future<Output = Response> + Send>>),
}

/// [`read_key`] for `request` without axum's handler: the same extractors' work, in the same
/// order, read synchronously, then the read answered at once when memory answers it
/// ([`crate::ops::Ops::read_now`]: a near-cache hit, or a refusal made before any store call)
/// and by [`crate::ops::Ops::read`] otherwise, with the same answer as [`read_key`] either
/// way. `None`, having read nothing that counts, when an extractor before the session token's
/// would refuse the request: the caller runs [`read_key`], which refuses it.
pub(crate) fn read_key_fast(state: &AppState, request: &Request) -> Option<FastRead> {
    let parts = (|| {
        let KeyPath(key) = KeyPath::of(request.uri())?;
        let params = ReadParams::from_query(request.uri().query().unwrap_or_default())?;
        let headers = ReadHeaders::of(request.headers(), request.extensions())?;
        Ok::<_, ApiError>((key, params, headers))
    })();
    let (key, params, headers) = parts.ok()?;
    // The session token is read last, as the handler's last extractor: it counts the token.
    let mut token = SessionToken::of(request.headers(), state);
    let call = match read_call(key, params, headers) {
        Ok(call) => call,
        Err(err) => {
            return Some(FastRead::Now(
                token.answer(Err::<Response, _>(err), state).into_response(),
            ))
        }
    };
    if let Some(answer) = state.ops().read_now(&call, &mut token.session, &mut None) {
        let answer = answer
            .map(|answer| read_response(answer, state))
            .map_err(ApiError::from);
        return Some(FastRead::Now(token.answer(answer, state).into_response()));
    }
    let state = state.clone();
    Some(FastRead::Later(box_in_place!(async move {
        let answer = read_call_answer(&state, call, &mut token.session).await;
        token.answer(answer, &state).into_response()
    })))
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
        ("Hotsplit-Session" = Option<String>, Header, nullable = false, description = "The session token of the last answer this client received (send it back unchanged): its floors hold on any instance. With calls at once, send every token held (several lines, or comma-separated): they are merged, a floor only ever rising. An unknown version, a garbled, oversized or forged token is ignored, never refused"),
    ),
    responses(
        (status = 200, description = "The raw value; headers ETag, Hotsplit-Version, Hotsplit-Copy, Hotsplit-Served-By (host:port;role=primary|replica: for a near-cache answer, the node that filled the entry), Hotsplit-Route (class=NAME;reason=class|own-write|request-pin|lag-breach|no-replica|version-floor|lag-unmeasured, then ;source=near-cache;age_ms=N when answered from the instance's near cache, N the entry's age bound: the source's lag at fill plus its age), Age (near-cache answers only: the age bound in whole seconds), Vary", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 304, description = "Not modified: no consulted copy is newer than the If-None-Match version"),
        (status = 400, description = "invalid_key, missing_client, invalid_copy, invalid_version, invalid_parameter, unknown_class, or class_not_allowed (decides-on-presence on a split family)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "not_found: missing, expired or invalidated; an invalidated key's answer carries Hotsplit-Version (the tombstone's version), a key with no record none", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 500, description = "internal: a bug or an unexpected local failure", body = crate::http::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "below_version_floor, staleness_budget_exceeded (every replica over the class's budget, on_breach = fail), unavailable, or deadline_exceeded (the store did not answer within server.request_deadline), with Retry-After", body = crate::http::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read_key(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    ReadQuery(params): ReadQuery,
    headers: ReadHeaders,
    mut token: SessionToken,
) -> WithSession<Result<Response, ApiError>> {
    let answer = read(&state, key, params, headers, &mut token.session).await;
    token.answer(answer, &state)
}

/// The read of [`read_key`]: parsed, read through the operations, rendered.
async fn read(
    state: &AppState,
    key: Key,
    params: ReadParams,
    headers: ReadHeaders,
    session: &mut ClientSession,
) -> Result<Response, ApiError> {
    let call = read_call(key, params, headers)?;
    read_call_answer(state, call, session).await
}

/// The read `call`, read through the operations and rendered.
async fn read_call_answer(
    state: &AppState,
    call: ReadRequest,
    session: &mut ClientSession,
) -> Result<Response, ApiError> {
    let answer = state.ops().read(call, session).await?;
    Ok(read_response(answer, state))
}

/// Puts a read's path, query and headers together: the query's client and class win over the
/// headers'; floors combine by maximum.
fn read_call(key: Key, params: ReadParams, headers: ReadHeaders) -> Result<ReadRequest, ApiError> {
    // The client id is moved into the call, not copied.
    let client = params.client.or(headers.client);
    let caller = match (&params.copy, client) {
        (Some(raw), _) => {
            let index = params::parse_canonical_u64(raw, wire::query::COPY)
                .and_then(|index| {
                    u32::try_from(index).map_err(|_| {
                        format!("{} {index} is larger than any copy index", wire::query::COPY)
                    })
                })
                .map_err(|why| ApiError::new(Code::InvalidCopy, why))?;
            Caller::Named(index)
        }
        (None, Some(client)) if !client.is_empty() => Caller::Client(client),
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
        caller,
        min_version,
        if_none_match: headers.if_none_match,
        class: params.class.or(headers.read_class),
        request_id: headers.request_id,
        deadline: headers.deadline,
    })
}

/// The read answer: the value (or nothing for a 304) and its headers, in this order (the
/// session layer adds its own after them).
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
    // Room for these headers, the session's and the request layers', so the map never grows.
    *response.headers_mut() = HeaderMap::with_capacity(ANSWER_HEADERS);
    let headers = response.headers_mut();
    if status == StatusCode::OK {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    let (etag, version) = answer::version(version);
    if let Some(value) = etag {
        headers.insert(header::ETAG, value);
    }
    headers.insert(VERSION, version);
    headers.insert(COPY, answer::number(u64::from(copy)));
    if let Some(value) = answer::served_by(&served_by) {
        headers.insert(SERVED_BY, value);
    }
    let inner = state.inner();
    if let Some(value) =
        inner
            .route_texts
            .route(&inner.ops, route.class, route.reason, route.near_cache_age)
    {
        headers.insert(ROUTE, value);
    }
    if let Some(age) = route.near_cache_age {
        // RFC 9111's Age: whole seconds the answer may have spent in a cache, the bound rounded
        // down.
        headers.insert(header::AGE, answer::number(age.as_secs()));
    }
    // The answer depends on the client id, the floor and the read class, so a shared cache
    // must key on all three.
    headers.insert(
        header::VARY,
        HeaderValue::from_static(wire::header::READ_VARY),
    );
    response
}

#[cfg(test)]
mod tests {
    use axum::extract::FromRequestParts;

    use super::*;
    use crate::http::handlers::query;

    #[tokio::test]
    async fn the_read_query_read_by_hand_is_the_strict_querys() {
        for raw in [
            "",
            "client=a&min_version=2&copy=1&class=advisory",
            "class=x&client=a%2Cb&flag&client2=c",
            "client=a&client=b",
            "client=a&%63lient=b",
            "client=%zz",
            "client=%FF",
            "copy=1&a1&a2&a3&a4&a5&a6&a7&a8&client=z",
            "copy=1&a1&a2&a3&a4&a5&a6&a7&a8&copy=2",
        ] {
            let (mut parts, ()) = axum::http::Request::builder()
                .uri(format!("/v1/keys/k?{raw}"))
                .body(())
                .unwrap()
                .into_parts();
            let strict =
                crate::http::params::StrictQuery::<ReadParams>::from_request_parts(&mut parts, &())
                    .await
                    .map(|crate::http::params::StrictQuery(params)| params);
            let by_hand = ReadParams::from_query(raw);
            assert_eq!(format!("{by_hand:?}"), format!("{strict:?}"), "{raw:?}");
        }
    }

    #[test]
    fn the_read_parameters_read_the_wire_names() {
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
    }
}
