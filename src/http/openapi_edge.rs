//! What the OpenAPI document says about the edge, added to the generated document in one place
//! rather than on every handler: the bearer security scheme and each operation's scope (from
//! [`super::auth::need`], the function the token check itself uses, so the two cannot
//! disagree), the 401 and 403 answers of protected operations, and the response headers the
//! API sends (`X-Request-Id` on every answer, `Retry-After` on every 503, `WWW-Authenticate`
//! on 401 and 403, and the read's and publish's `ETag`, `Hotsplit-*` and `Vary`).

use axum::http::Method;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::Response;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, Content, HeaderBuilder, OpenApi, RefOr};
use utoipa::Modify;

use super::auth::{need, Need};
use super::paths;

/// The security scheme's name in the document.
const BEARER: &str = "bearer";

/// Adds the edge to the generated document (`#[openapi(modifiers(&Edge))]`).
pub(super) struct Edge;

impl Modify for Edge {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc
            .components
            .get_or_insert_with(|| ComponentsBuilder::new().build());
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token of [auth] tokens_file. Scopes (the role names of each operation's requirement): read, write, admin. Without tokens configured no operation asks for one.",
                    ))
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let operations = [
                (Method::GET, item.get.as_mut()),
                (Method::HEAD, item.head.as_mut()),
                (Method::PUT, item.put.as_mut()),
                (Method::DELETE, item.delete.as_mut()),
            ];
            for (method, operation) in operations {
                if let Some(operation) = operation {
                    describe(path, &method, operation);
                }
            }
        }
    }
}

/// Adds the security requirement, the refusals and the response headers of one operation.
fn describe(path: &str, method: &Method, operation: &mut Operation) {
    if let Need::Scope(scope) = need(Some(path), method) {
        operation.security = Some(vec![SecurityRequirement::new(BEARER, [scope.as_str()])]);
        let refusals = [
            (
                "401",
                "unauthorized: no bearer token, or not a valid one (WWW-Authenticate says which)",
            ),
            ("403", "forbidden: the token lacks this operation's scope"),
        ];
        for (status, description) in refusals {
            let mut response = Response::new(description);
            response.content.insert(
                super::problem::PROBLEM_JSON.to_owned(),
                Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    "Problem",
                )))),
            );
            header(&mut response, "WWW-Authenticate", "The bearer challenge (RFC 6750): realm, and error=\"invalid_token\" or error=\"insufficient_scope\" with the scope needed", None);
            operation
                .responses
                .responses
                .insert(status.to_owned(), RefOr::T(response));
        }
    }
    for (status, response) in operation.responses.responses.iter_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        header(
            response,
            "X-Request-Id",
            "This request's trace id: the incoming X-Request-Id when it is 1 to 128 visible ASCII characters, else the traceparent's trace id, else 32 random hex digits",
            Some("^[!-~]{1,128}$"),
        );
        if status == "503" {
            header(
                response,
                "Retry-After",
                "Seconds to wait before retrying (read.retry_after)",
                Some("^[1-9][0-9]*$"),
            );
        }
        for (name, description, pattern) in data_headers(path, method, status) {
            header(response, name, description, pattern);
        }
    }
}

/// `Hotsplit-Session`, the session token a key operation's answer carries.
const SESSION_HEADER: (&str, &str, Option<&str>) = (
    "Hotsplit-Session",
    "The session token holding this client's floors, this answer's included, and those of the tokens the request sent, merged: keep it in place of the tokens the request sent and send every token held on the next request, to any instance",
    Some("^[A-Za-z0-9_-]+$"),
);

/// `Cache-Control` of an answer that carries a session token.
const CACHE_CONTROL_HEADER: (&str, &str, Option<&str>) = (
    "Cache-Control",
    "private: the answer carries a session token",
    None,
);

/// The `Hotsplit-*`, `ETag`, `Vary` and `Cache-Control` headers of the key operations' answers.
fn data_headers(
    path: &str,
    method: &Method,
    status: &str,
) -> Vec<(&'static str, &'static str, Option<&'static str>)> {
    const VERSION: &str = "^[1-9][0-9]{0,19}$";
    if path != paths::KEY {
        return Vec::new();
    }
    match (method, status) {
        (&Method::GET, "200" | "304") => vec![
            (
                "ETag",
                "The served version as a strong entity tag, \"V\"",
                None,
            ),
            ("Hotsplit-Version", "The served version", Some(VERSION)),
            (
                "Hotsplit-Copy",
                "The copy index that served",
                Some("^[0-9]+$"),
            ),
            (
                "Hotsplit-Served-By",
                "host:port;role=primary|replica, or embedded",
                None,
            ),
            (
                "Hotsplit-Route",
                "class=NAME;reason=class|own-write|request-pin|lag-breach|no-replica|version-floor|lag-unmeasured, then ;source=near-cache;age_ms=N for an answer from the instance's near cache",
                None,
            ),
            (
                "Age",
                "Near-cache answers only: the entry's age bound in whole seconds",
                Some("^[0-9]+$"),
            ),
            (
                "Vary",
                "Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session",
                None,
            ),
            SESSION_HEADER,
            CACHE_CONTROL_HEADER,
        ],
        (&Method::GET, "404") => vec![(
            "Hotsplit-Version",
            "An invalidated key's tombstone version (absent for a key with no record)",
            Some(VERSION),
        )],
        (&Method::PUT | &Method::DELETE, "200" | "202") => vec![
            (
                "Hotsplit-Version",
                "The version written; send it back as min_version for read-your-writes",
                Some(VERSION),
            ),
            SESSION_HEADER,
            CACHE_CONTROL_HEADER,
            ("Vary", "Hotsplit-Session", None),
        ],
        _ => Vec::new(),
    }
}

/// Declares a string header on `response` (never required: an answer may omit it).
fn header(response: &mut Response, name: &str, description: &str, pattern: Option<&str>) {
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(pattern.map(str::to_owned));
    response.headers.insert(
        name.to_owned(),
        HeaderBuilder::new()
            .schema(schema)
            .description(Some(description))
            .build(),
    );
}
