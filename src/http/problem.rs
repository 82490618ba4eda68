//! Errors at the HTTP edge: `application/problem+json` (RFC 9457) with a stable `code`.
//!
//! Clients branch on `code`; `detail` is a human sentence. Internal details (node addresses,
//! Redis error text) go to the log, never to the client.
//!
//! As in axum's `examples/error-handling`, handlers return `Result<_, ApiError>`: one `From`
//! impl per error source ([`Error`]; the request's own parameters are checked in `params`) and one `IntoResponse`, the only place an
//! error becomes an answer. `Retry-After` is written by [`fill_retry_after`] alone.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{Error, ErrorKind, Refusal};
use crate::key::Version;
use crate::wire;

/// The media type of problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every stable error code the API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// 400: the key failed validation.
    InvalidKey,
    /// 400: the version is missing, forbidden for this family, or not canonical decimal.
    InvalidVersion,
    /// 400: an affine read without a client id.
    MissingClient,
    /// 400: `copy` is out of range.
    InvalidCopy,
    /// 400: another parameter or header does not parse.
    InvalidParameter,
    /// 400: the read names a class that does not exist.
    UnknownClass,
    /// 400: the read names `decides-on-presence` on a split family.
    ClassNotAllowed,
    /// 503: every replica is over the class's staleness budget and its policy is `fail`.
    StalenessBudgetExceeded,
    /// 413: the value is larger than `server.max_value_bytes`.
    ValueTooLarge,
    /// 409: nothing applied; some copy holds a newer version.
    StaleVersion,
    /// 409: some copy holds this version with a different body.
    VersionConflict,
    /// 503: some copy write failed; retrying the same version is safe.
    PublishIncomplete,
    /// 503: no consulted copy reached the reader's version floor.
    BelowVersionFloor,
    /// 404: the key is missing or was invalidated, or the route does not exist.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 503: the store did not answer.
    Unavailable,
    /// 401: no valid bearer token (the answer carries `WWW-Authenticate: Bearer`).
    Unauthorized,
    /// 403: the bearer token lacks the endpoint's scope.
    Forbidden,
    /// 507: the embedded store is at `store.memory_max_bytes`; nothing changed.
    StoreFull,
    /// 503: the request's deadline (`server.request_deadline`) passed before the store answered.
    DeadlineExceeded,
    /// 503: more requests than `server.max_in_flight` were in flight; nothing was read or
    /// written.
    Overloaded,
    /// 414: the query string is longer than `server.max_query_bytes`.
    QueryTooLong,
    /// 503 (`/readyz` only): the startup warm-up runs; replicas that replica-routed reads may
    /// use are not all discovered and measured yet (`server.readiness_warm_up`).
    WarmingUp,
    /// 500: a bug or an unexpected local failure.
    Internal,
}

impl Code {
    /// The code's wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidKey => "invalid_key",
            Code::InvalidVersion => "invalid_version",
            Code::MissingClient => "missing_client",
            Code::InvalidCopy => "invalid_copy",
            Code::InvalidParameter => "invalid_parameter",
            Code::UnknownClass => "unknown_class",
            Code::ClassNotAllowed => "class_not_allowed",
            Code::StalenessBudgetExceeded => "staleness_budget_exceeded",
            Code::ValueTooLarge => "value_too_large",
            Code::StaleVersion => "stale_version",
            Code::VersionConflict => "version_conflict",
            Code::PublishIncomplete => "publish_incomplete",
            Code::BelowVersionFloor => "below_version_floor",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::Unavailable => "unavailable",
            Code::Unauthorized => "unauthorized",
            Code::Forbidden => "forbidden",
            Code::StoreFull => "store_full",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Overloaded => "overloaded",
            Code::QueryTooLong => "query_too_long",
            Code::WarmingUp => "warming_up",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status that goes with the code.
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidKey
            | Code::InvalidVersion
            | Code::MissingClient
            | Code::InvalidCopy
            | Code::InvalidParameter
            | Code::UnknownClass
            | Code::ClassNotAllowed => StatusCode::BAD_REQUEST,
            Code::ValueTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::StaleVersion | Code::VersionConflict => StatusCode::CONFLICT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::QueryTooLong => StatusCode::URI_TOO_LONG,
            Code::PublishIncomplete
            | Code::BelowVersionFloor
            | Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Overloaded
            | Code::WarmingUp
            | Code::StalenessBudgetExceeded => StatusCode::SERVICE_UNAVAILABLE,
            Code::StoreFull => StatusCode::INSUFFICIENT_STORAGE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn title(self) -> &'static str {
        match self {
            Code::InvalidKey => "invalid key",
            Code::InvalidVersion => "invalid version",
            Code::MissingClient => "missing client id",
            Code::InvalidCopy => "invalid copy",
            Code::InvalidParameter => "invalid parameter",
            Code::UnknownClass => "unknown read class",
            Code::ClassNotAllowed => "read class not allowed",
            Code::StalenessBudgetExceeded => "staleness budget exceeded",
            Code::ValueTooLarge => "value too large",
            Code::StaleVersion => "stale version",
            Code::VersionConflict => "version conflict",
            Code::PublishIncomplete => "publish incomplete",
            Code::BelowVersionFloor => "below version floor",
            Code::NotFound => "not found",
            Code::MethodNotAllowed => "method not allowed",
            Code::Unavailable => "unavailable",
            Code::Unauthorized => "unauthorized",
            Code::Forbidden => "forbidden",
            Code::StoreFull => "store full",
            Code::DeadlineExceeded => "deadline exceeded",
            Code::Overloaded => "overloaded",
            Code::QueryTooLong => "query too long",
            Code::WarmingUp => "warming up",
            Code::Internal => "internal error",
        }
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the problem type: `urn:hotsplit:problem:<code>`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// The stable error code.
    pub code: Code,
}

/// An error answer: a problem, optional `Retry-After`, optional extension members.
#[derive(Debug)]
pub struct ApiError {
    /// The stable code; it decides the status.
    code: Code,
    /// The sentence for the client.
    detail: String,
    /// Whether the answer carries `Retry-After` (503 answers a retry can cure). The seconds are
    /// configuration, added on the way out by [`fill_retry_after`].
    retry_later: bool,
    /// Extra members merged into the problem body (the publish report, for example).
    extension: Option<serde_json::Value>,
    /// The version the answer reports as `Hotsplit-Version`: a tombstone's on a 404, so the
    /// reader can hold it as a floor. `None` writes no header.
    version: Option<Version>,
}

impl ApiError {
    /// A problem with `code` and a client-facing `detail`.
    pub fn new(code: Code, detail: impl Into<String>) -> ApiError {
        ApiError {
            code,
            detail: detail.into(),
            retry_later: false,
            extension: None,
            version: None,
        }
    }

    /// Asks the client to retry later: the answer carries `Retry-After` with the configured
    /// seconds.
    pub fn retry_later(mut self) -> ApiError {
        self.retry_later = true;
        self
    }

    /// Merges the members of `extension` (a JSON object) into the body.
    pub fn with_extension(mut self, extension: serde_json::Value) -> ApiError {
        self.extension = Some(extension);
        self
    }

    /// Reports `version` as the answer's `Hotsplit-Version` (the version a `publish_incomplete`
    /// write left as a floor).
    pub fn with_version(mut self, version: Version) -> ApiError {
        self.version = Some(version);
        self
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }
}

/// A publish refused by a rule, in the HTTP door's words (its query parameters).
fn refused(refusal: &Refusal) -> ApiError {
    let version = crate::wire::query::VERSION;
    match refusal {
        Refusal::VersionMissing { family } => ApiError::new(
            Code::InvalidVersion,
            format!("family {family:?} takes versions from the caller: send ?{version}=V"),
        ),
        Refusal::VersionGiven { family } => ApiError::new(
            Code::InvalidVersion,
            format!("family {family:?} allocates versions: do not send ?{version}"),
        ),
        Refusal::ValueTooLarge { limit, .. } => ApiError::new(
            Code::ValueTooLarge,
            format!("the value is larger than {limit} bytes"),
        ),
    }
}

impl From<Error> for ApiError {
    /// Maps a library error by its kind, hiding internals of store failures from the client
    /// (they go to the log).
    fn from(err: Error) -> ApiError {
        if let Some(refusal) = err.refusal() {
            return refused(refusal);
        }
        let code = match err.kind() {
            ErrorKind::InvalidKey => Code::InvalidKey,
            ErrorKind::InvalidVersion => Code::InvalidVersion,
            ErrorKind::MissingClient => Code::MissingClient,
            ErrorKind::InvalidCopy => Code::InvalidCopy,
            ErrorKind::InvalidParameter => Code::InvalidParameter,
            ErrorKind::ValueTooLarge => Code::ValueTooLarge,
            ErrorKind::NotFound => {
                return ApiError {
                    version: err
                        .invalidated_at()
                        .and_then(|version| Version::new(version).ok()),
                    ..ApiError::new(Code::NotFound, err.message())
                }
            }
            ErrorKind::UnknownClass => Code::UnknownClass,
            ErrorKind::StoreFull => {
                return ApiError::new(
                    Code::StoreFull,
                    "the embedded store is full (store.memory_max_bytes): nothing changed; invalidate keys or wait for copies to expire",
                )
            }
            ErrorKind::ClassNotAllowed => Code::ClassNotAllowed,
            ErrorKind::Unauthorized => Code::Unauthorized,
            ErrorKind::Forbidden => Code::Forbidden,
            ErrorKind::StalenessBudgetExceeded => {
                return ApiError::new(Code::StalenessBudgetExceeded, err.message()).retry_later()
            }
            ErrorKind::BelowVersionFloor => {
                return ApiError::new(Code::BelowVersionFloor, err.message()).retry_later()
            }
            ErrorKind::DeadlineExceeded => {
                return ApiError::new(
                    Code::DeadlineExceeded,
                    "the request deadline passed before the store answered; retry later",
                )
                .retry_later()
            }
            ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::NodeFailing => {
                tracing::warn!(error = %err, "store unavailable");
                return ApiError::new(Code::Unavailable, "the store did not answer; retry later")
                    .retry_later();
            }
            _ => {
                tracing::error!(error = %err, "internal error");
                return ApiError::new(Code::Internal, "internal error");
            }
        };
        ApiError::new(code, err.message())
    }
}

/// Marks an answer that should carry `Retry-After`; [`fill_retry_after`] replaces it with the
/// header.
#[derive(Debug, Clone, Copy)]
struct RetryLater;

/// Gives a retry-later answer its `Retry-After: seconds` header: the one place the header is
/// written. Called on every routed answer by the latency layer, which knows the configured
/// seconds.
pub(crate) fn fill_retry_after(response: &mut Response, seconds: u64) {
    if response.extensions_mut().remove::<RetryLater>().is_some() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let problem = Problem {
            type_uri: format!("urn:hotsplit:problem:{}", self.code.as_str()),
            title: self.code.title().to_owned(),
            status: status.as_u16(),
            detail: self.detail,
            code: self.code,
        };
        let mut body = serde_json::to_value(&problem).unwrap_or_default();
        if let (Some(serde_json::Value::Object(extra)), serde_json::Value::Object(members)) =
            (self.extension, &mut body)
        {
            for (name, value) in extra {
                members.entry(name).or_insert(value);
            }
        }
        let mut response = (status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(version) = self.version {
            headers.insert(wire::header::VERSION, HeaderValue::from(version.get()));
        }
        if self.retry_later {
            response.extensions_mut().insert(RetryLater);
        }
        // The layers count some codes by route (`deadline_exceeded`); only error answers pay for
        // the extension.
        response.extensions_mut().insert(self.code);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_written_on_the_way_out_only_for_retry_later_answers() {
        let mut later = ApiError::new(Code::Unavailable, "down")
            .retry_later()
            .into_response();
        assert!(later.headers().get(header::RETRY_AFTER).is_none());
        fill_retry_after(&mut later, 7);
        assert_eq!(
            later.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from(7u64))
        );
        // The marker is consumed: a second pass writes nothing new.
        assert!(later.extensions().get::<RetryLater>().is_none());

        let mut final_answer = ApiError::new(Code::InvalidKey, "bad").into_response();
        fill_retry_after(&mut final_answer, 7);
        assert!(final_answer.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_tombstones_404_names_its_version_and_a_missing_keys_does_not() {
        let invalidated = ApiError::from(Error::invalidated(5)).into_response();
        assert_eq!(invalidated.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            invalidated.headers().get(wire::header::VERSION),
            Some(&HeaderValue::from(5u64))
        );
        let missing =
            ApiError::from(Error::new(ErrorKind::NotFound, "key not found")).into_response();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert!(missing.headers().get(wire::header::VERSION).is_none());
    }

    #[test]
    fn store_failures_retry_later_and_hide_their_text() {
        let err = Error::new(
            ErrorKind::Unavailable,
            "10.0.0.7:6379 refused the connection",
        );
        let api = ApiError::from(err);
        assert_eq!(api.code(), Code::Unavailable);
        assert!(api.retry_later);
        assert!(!api.detail.contains("10.0.0.7"), "{}", api.detail);

        let floor = ApiError::from(Error::new(ErrorKind::BelowVersionFloor, "behind"));
        assert!(floor.retry_later);
        let key = ApiError::from(Error::new(ErrorKind::InvalidKey, "key is empty"));
        assert_eq!((key.code(), key.retry_later), (Code::InvalidKey, false));
        assert_eq!(key.detail, "key is empty");
    }
}
