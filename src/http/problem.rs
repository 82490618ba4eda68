//! Errors at the HTTP edge: `application/problem+json` (RFC 9457) with a stable `code`.
//!
//! Clients branch on `code`; `detail` is a human sentence. Internal details (node addresses,
//! Redis error text) go to the log, never to the client.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{Error, ErrorKind};

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
            Code::PublishIncomplete => "publish_incomplete",
            Code::BelowVersionFloor => "below_version_floor",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::Unavailable => "unavailable",
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
            Code::StaleVersion => StatusCode::CONFLICT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::PublishIncomplete
            | Code::BelowVersionFloor
            | Code::Unavailable
            | Code::StalenessBudgetExceeded => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(self) -> &'static str {
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
            Code::PublishIncomplete => "publish incomplete",
            Code::BelowVersionFloor => "below version floor",
            Code::NotFound => "not found",
            Code::MethodNotAllowed => "method not allowed",
            Code::Unavailable => "unavailable",
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
    /// Seconds for `Retry-After`, on 503 answers.
    retry_after: Option<u64>,
    /// Extra members merged into the problem body (the publish report, for example).
    extension: Option<serde_json::Value>,
}

impl ApiError {
    /// A problem with `code` and a client-facing `detail`.
    pub fn new(code: Code, detail: impl Into<String>) -> ApiError {
        ApiError {
            code,
            detail: detail.into(),
            retry_after: None,
            extension: None,
        }
    }

    /// Adds `Retry-After: seconds`.
    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// Merges the members of `extension` (a JSON object) into the body.
    pub fn with_extension(mut self, extension: serde_json::Value) -> ApiError {
        self.extension = Some(extension);
        self
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// Maps a library error, hiding internals of store failures from the client.
    pub fn from_error(err: &Error, retry_after_secs: u64) -> ApiError {
        let code = match err.kind() {
            ErrorKind::InvalidKey => Code::InvalidKey,
            ErrorKind::InvalidVersion => Code::InvalidVersion,
            ErrorKind::MissingClient => Code::MissingClient,
            ErrorKind::InvalidCopy => Code::InvalidCopy,
            ErrorKind::InvalidParameter => Code::InvalidParameter,
            ErrorKind::ValueTooLarge => Code::ValueTooLarge,
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::UnknownClass => Code::UnknownClass,
            ErrorKind::ClassNotAllowed => Code::ClassNotAllowed,
            ErrorKind::StalenessBudgetExceeded => {
                return ApiError::new(Code::StalenessBudgetExceeded, err.message())
                    .retry_after(retry_after_secs)
            }
            ErrorKind::BelowVersionFloor => {
                return ApiError::new(Code::BelowVersionFloor, err.message())
                    .retry_after(retry_after_secs)
            }
            ErrorKind::Unavailable | ErrorKind::Timeout => {
                tracing::warn!(error = %err, "store unavailable");
                return ApiError::new(Code::Unavailable, "the store did not answer; retry later")
                    .retry_after(retry_after_secs);
            }
            _ => {
                tracing::error!(error = %err, "internal error");
                return ApiError::new(Code::Internal, "internal error");
            }
        };
        ApiError::new(code, err.message())
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
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
