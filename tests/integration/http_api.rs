//! HTTP handlers through `Router::oneshot` on the embedded store: statuses, headers, and every
//! error code that does not need a failing Redis (those are in `http_e2e`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use hotsplit::config::Config;
use hotsplit::metrics::Metrics;
use hotsplit::store::memory::MemoryStore;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

fn app() -> Router {
    let config = Config::from_toml(
        "[server]\nmax_value_bytes = 64\n[[family]]\nprefix = \"p:\"\ncopies = 8\n[[family]]\nprefix = \"a:\"\ncopies = 2\nversioning = \"allocated\"",
    )
    .unwrap();
    config.validate().unwrap();
    let metrics = Metrics::new();
    let state = hotsplit::server::app_state(&config, Arc::new(MemoryStore::new()), metrics)
        .expect("app state");
    hotsplit::http::router(state)
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: axum::http::HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// Asserts a problem+json answer with `status` and `code`.
    pub(crate) fn assert_problem(&self, status: StatusCode, code: &str) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let body = self.json();
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["status"], status.as_u16());
        assert!(body["detail"]
            .as_str()
            .is_some_and(|detail| !detail.is_empty()));
    }
}

pub(crate) async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_vec())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

#[tokio::test]
async fn publish_then_read_through_the_affine_copy() {
    let app = app();
    let put = call(&app, Method::PUT, "/v1/keys/p:1?version=3", &[], b"hello").await;
    assert_eq!(put.status, StatusCode::OK);
    assert_eq!(put.header("hotsplit-version"), Some("3"));
    let report = put.json();
    assert_eq!(
        (
            report["key"].as_str(),
            report["version"].as_u64(),
            report["copies"].as_u64()
        ),
        (Some("p:1"), Some(3), Some(8))
    );
    assert_eq!(
        (report["applied"].as_u64(), report["failed"].as_u64()),
        (Some(8), Some(0))
    );
    let outcomes = report["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 8);
    for (index, line) in outcomes.iter().enumerate() {
        assert_eq!(line["copy"].as_u64(), Some(index as u64));
        assert_eq!(line["copy_key"], format!("p:1#{index}"));
        assert_eq!(line["outcome"], "applied");
        assert_eq!(line["node"], "embedded");
    }

    let expected_copy = hotsplit::affinity::copy_index("alice", 8).to_string();
    for (uri, headers) in [
        ("/v1/keys/p:1?client=alice", vec![]),
        ("/v1/keys/p:1", vec![("hotsplit-client", "alice")]),
    ] {
        let get = call(&app, Method::GET, uri, &headers, b"").await;
        assert_eq!(get.status, StatusCode::OK);
        assert_eq!(get.body, b"hello");
        assert_eq!(get.header("etag"), Some("\"3\""));
        assert_eq!(get.header("hotsplit-version"), Some("3"));
        assert_eq!(get.header("hotsplit-copy"), Some(expected_copy.as_str()));
        assert_eq!(get.header("hotsplit-served-by"), Some("embedded"));
        assert_eq!(
            get.header("vary"),
            Some("Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session")
        );
        assert_eq!(
            get.header("hotsplit-route"),
            Some("class=primary;reason=class")
        );
        // The answer carries the reader's session token, so no shared cache may keep it.
        assert!(get
            .header("hotsplit-session")
            .is_some_and(|token| !token.is_empty()));
        assert_eq!(get.header("cache-control"), Some("private"));
    }

    // If-None-Match with the current version: 304, no body; with an older one: the body.
    let not_modified = call(
        &app,
        Method::GET,
        "/v1/keys/p:1?client=alice",
        &[("if-none-match", "W/\"3\"")],
        b"",
    )
    .await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    assert!(not_modified.body.is_empty());
    let newer = call(
        &app,
        Method::GET,
        "/v1/keys/p:1?client=alice",
        &[("if-none-match", "\"1\", \"2\"")],
        b"",
    )
    .await;
    assert_eq!(newer.status, StatusCode::OK);

    // The affinity helper agrees with the read.
    let affinity = call(
        &app,
        Method::GET,
        "/v1/affinity?key=p:1&client=alice",
        &[],
        b"",
    )
    .await;
    assert_eq!(affinity.status, StatusCode::OK);
    let body = affinity.json();
    assert_eq!(
        body["copy"].as_u64().map(|copy| copy.to_string()),
        Some(expected_copy.clone())
    );
    assert_eq!(body["copy_key"], format!("p:1#{expected_copy}"));
    assert_eq!(
        (body["copies"].as_u64(), body["node"].as_str()),
        (Some(8), Some("embedded"))
    );

    // A named copy.
    let named = call(&app, Method::GET, "/v1/keys/p:1?copy=7", &[], b"").await;
    assert_eq!(
        (named.status, named.header("hotsplit-copy")),
        (StatusCode::OK, Some("7"))
    );
}

#[tokio::test]
async fn invalidate_answers_not_found_and_blocks_older_publishes() {
    let app = app();
    assert_eq!(
        call(&app, Method::PUT, "/v1/keys/p:2?version=5", &[], b"v5")
            .await
            .status,
        StatusCode::OK
    );
    let delete = call(&app, Method::DELETE, "/v1/keys/p:2?version=6", &[], b"").await;
    assert_eq!(delete.status, StatusCode::OK);
    assert_eq!(delete.json()["applied"].as_u64(), Some(8));
    call(
        &app,
        Method::GET,
        "/v1/keys/p:2?client=c",
        &[("if-none-match", "\"6\"")],
        b"",
    )
    .await
    .assert_problem(StatusCode::NOT_FOUND, "not_found");
    let late = call(&app, Method::PUT, "/v1/keys/p:2?version=6", &[], b"late").await;
    late.assert_problem(StatusCode::CONFLICT, "stale_version");
    assert_eq!(
        late.json()["stale"].as_u64(),
        Some(8),
        "the 409 body carries the report"
    );
    assert_eq!(
        call(&app, Method::PUT, "/v1/keys/p:2?version=7", &[], b"v7")
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn repeated_publish_is_current() {
    let app = app();
    call(&app, Method::PUT, "/v1/keys/p:3?version=5", &[], b"x").await;
    let again = call(&app, Method::PUT, "/v1/keys/p:3?version=5", &[], b"x").await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(
        (
            again.json()["current"].as_u64(),
            again.json()["applied"].as_u64()
        ),
        (Some(8), Some(0))
    );
}

#[tokio::test]
async fn allocated_families_return_the_version() {
    let app = app();
    let first = call(&app, Method::PUT, "/v1/keys/a:1", &[], b"x").await;
    let second = call(&app, Method::PUT, "/v1/keys/a:1", &[], b"y").await;
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(
        (
            first.json()["version"].as_u64(),
            second.json()["version"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(second.header("hotsplit-version"), Some("2"));
}

/// One bad request: method, URI, headers, body, expected status and code.
type Case = (
    Method,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<u8>,
    StatusCode,
    &'static str,
);

#[tokio::test]
async fn every_client_error_code_is_produced() {
    let app = app();
    call(&app, Method::PUT, "/v1/keys/p:4?version=2", &[], b"x").await;
    let cases: Vec<Case> = [
        bad_key_and_version_cases(),
        bad_read_parameter_cases(),
        refused_by_state_cases(),
    ]
    .concat();
    for (method, uri, headers, body, status, code) in cases {
        let answer = call(&app, method.clone(), uri, &headers, &body).await;
        println!(
            "{method} {uri} -> {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        answer.assert_problem(status, code);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(answer.header("retry-after"), Some("1"), "{uri}");
        }
    }
    // The value that was refused as too large did not change the stored one.
    let get = call(&app, Method::GET, "/v1/keys/p:4?client=c", &[], b"").await;
    assert_eq!(
        (get.status, get.body.as_slice()),
        (StatusCode::OK, b"x".as_slice())
    );
}

/// The refusals of a bad key or a bad version.
fn bad_key_and_version_cases() -> Vec<Case> {
    vec![
        (
            Method::PUT,
            "/v1/keys/bad%7Bkey?version=1",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            Method::PUT,
            "/v1/keys/bad%23key?version=1",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            Method::GET,
            "/v1/keys/bad%20key?client=c",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4?version=01",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4?version=0",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4?version=18446744073709551616",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::PUT,
            "/v1/keys/a:4?version=3",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::DELETE,
            "/v1/keys/p:4?version=-1",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
    ]
}

/// The refusals of a read's bad parameters: floors, clients, copies, repeats.
fn bad_read_parameter_cases() -> Vec<Case> {
    vec![
        (
            Method::GET,
            "/v1/keys/p:4?client=c&min_version=x",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::GET,
            "/v1/keys/p:4",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "missing_client",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?client=",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "missing_client",
        ),
        (
            Method::GET,
            "/v1/affinity?key=p:4",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "missing_client",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?copy=8",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_copy",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?copy=one",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_copy",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?client=c",
            vec![("hotsplit-min-version", "abc")],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_version",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?client=a&client=b",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
        ),
    ]
}

/// The refusals of a repeated write parameter, and of what the stored state or the route table forbids.
fn refused_by_state_cases() -> Vec<Case> {
    vec![
        (
            Method::PUT,
            "/v1/keys/p:4?version=3&version=4",
            vec![],
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4?version=3",
            vec![],
            vec![b'x'; 65],
            StatusCode::PAYLOAD_TOO_LARGE,
            "value_too_large",
        ),
        (
            Method::PUT,
            "/v1/keys/p:4?version=1",
            vec![],
            vec![],
            StatusCode::CONFLICT,
            "stale_version",
        ),
        (
            Method::GET,
            "/v1/keys/p:5?client=c",
            vec![],
            vec![],
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/no/such/route",
            vec![],
            vec![],
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/keys/p:4",
            vec![],
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::GET,
            "/v1/keys/p:4?client=c&min_version=3",
            vec![],
            vec![],
            StatusCode::SERVICE_UNAVAILABLE,
            "below_version_floor",
        ),
    ]
}

#[tokio::test]
async fn operations_endpoints_answer() {
    let app = app();
    let health = call(&app, Method::GET, "/healthz", &[], b"").await;
    assert_eq!(
        (health.status, health.json()["store"].as_str()),
        (StatusCode::OK, Some("embedded"))
    );
    let ready = call(&app, Method::GET, "/readyz", &[], b"").await;
    assert_eq!(ready.status, StatusCode::OK);

    call(&app, Method::PUT, "/v1/keys/p:6?version=1", &[], b"x").await;
    call(&app, Method::GET, "/v1/keys/p:6?client=c", &[], b"").await;
    let metrics = call(&app, Method::GET, "/metrics", &[], b"").await;
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains(r#"hotsplit_publish_copy_outcomes_total{op="publish",outcome="applied"} 8"#),
        "{text}"
    );
    assert!(
        text.contains(r#"hotsplit_reads_total{outcome="affine"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"hotsplit_http_request_duration_seconds_count{method="GET",route="/v1/keys/{key}",status="2xx"} 1"#), "{text}");

    let openapi = call(&app, Method::GET, "/openapi.json", &[], b"").await;
    assert_eq!(
        openapi.header(header::CONTENT_TYPE.as_str()),
        Some("application/json")
    );
    assert!(openapi.json()["paths"]["/v1/keys/{key}"]["put"].is_object());
}

#[test]
fn the_checked_in_openapi_document_matches_the_code() {
    let generated = hotsplit::http::openapi::openapi_json();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        generated == checked_in,
        "docs/openapi.json is out of date: regenerate it with `cargo run -- openapi > docs/openapi.json`"
    );
}

#[tokio::test]
async fn repeated_header_lines_combine_floors_by_maximum() {
    let app = app();
    call(&app, Method::PUT, "/v1/keys/p:rep?version=5", &[], b"v5").await;

    // Two If-None-Match lines: the second one's "5" is the highest tag, so the read is not
    // modified; reading only the first line ("1") would answer 200 with the value.
    let tags = [("if-none-match", "\"1\""), ("if-none-match", "\"5\"")];
    let answer = call(&app, Method::GET, "/v1/keys/p:rep?client=c", &tags, b"").await;
    assert_eq!(answer.status, StatusCode::NOT_MODIFIED);

    // Two Hotsplit-Min-Version lines: the floor is 9, above every copy.
    let floors = [("hotsplit-min-version", "1"), ("hotsplit-min-version", "9")];
    let answer = call(&app, Method::GET, "/v1/keys/p:rep?client=c", &floors, b"").await;
    answer.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "below_version_floor");
    // A list on one line counts the same, and so does the query's floor beside a lower header.
    let listed = [("hotsplit-min-version", "1, 9")];
    let answer = call(&app, Method::GET, "/v1/keys/p:rep?client=c", &listed, b"").await;
    answer.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "below_version_floor");
    let low_header = [("hotsplit-min-version", "1")];
    let answer = call(
        &app,
        Method::GET,
        "/v1/keys/p:rep?client=c&min_version=9",
        &low_header,
        b"",
    )
    .await;
    answer.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "below_version_floor");
    // The query's floor does not hide a higher header.
    let high_header = [("hotsplit-min-version", "9")];
    let answer = call(
        &app,
        Method::GET,
        "/v1/keys/p:rep?client=c&min_version=1",
        &high_header,
        b"",
    )
    .await;
    answer.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "below_version_floor");
    // Floors at or below the stored version serve it.
    let met = [("hotsplit-min-version", "2"), ("hotsplit-min-version", "5")];
    let answer = call(&app, Method::GET, "/v1/keys/p:rep?client=c", &met, b"").await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (StatusCode::OK, b"v5".as_slice())
    );
}

#[tokio::test]
async fn repeated_identity_lines_must_agree_as_whole_lines() {
    let app = app();
    call(&app, Method::PUT, "/v1/keys/p:id?version=1", &[], b"x").await;
    // A comma inside an id is part of the id: two equal lines are one id, not a list.
    let same = [
        ("hotsplit-client", "tenant,7"),
        ("hotsplit-client", "tenant,7"),
    ];
    let answer = call(&app, Method::GET, "/v1/keys/p:id", &same, b"").await;
    assert_eq!(answer.status, StatusCode::OK);
    let single = [("hotsplit-client", "tenant,7")];
    let alone = call(&app, Method::GET, "/v1/keys/p:id", &single, b"").await;
    assert_eq!(
        answer.header("hotsplit-copy"),
        alone.header("hotsplit-copy")
    );

    let cases: [(&str, [(&str, &str); 2]); 4] = [
        (
            "/v1/keys/p:id",
            [
                ("hotsplit-client", "tenant,7"),
                ("hotsplit-client", "tenant"),
            ],
        ),
        (
            "/v1/keys/p:id?client=c",
            [
                ("hotsplit-read-class", "advisory"),
                ("hotsplit-read-class", "primary"),
            ],
        ),
        (
            "/v1/keys/p:id?client=c",
            [("hotsplit-request", "r1"), ("hotsplit-request", "r2")],
        ),
        // The query wins over the header, but the header's own lines still must agree.
        (
            "/v1/keys/p:id?client=c",
            [("hotsplit-client", "a"), ("hotsplit-client", "b")],
        ),
    ];
    for (uri, lines) in cases {
        let answer = call(&app, Method::GET, uri, &lines, b"").await;
        answer.assert_problem(StatusCode::BAD_REQUEST, "invalid_parameter");
    }
    let write = [("hotsplit-client", "w,1"), ("hotsplit-client", "w,2")];
    let answer = call(&app, Method::PUT, "/v1/keys/p:id?version=2", &write, b"y").await;
    answer.assert_problem(StatusCode::BAD_REQUEST, "invalid_parameter");
}

#[tokio::test]
async fn percent_decoding_is_strict_and_answers_problem_json() {
    let app = app();
    let cases = [
        (Method::PUT, "/v1/keys/a%FFb?version=1", "invalid_key"),
        (Method::GET, "/v1/keys/a%FFb?client=c", "invalid_key"),
        (Method::PUT, "/v1/keys/a%zzb?version=1", "invalid_key"),
        (Method::DELETE, "/v1/keys/a%zzb?version=1", "invalid_key"),
        (Method::PUT, "/v1/keys/p:1%?version=1", "invalid_key"),
        (Method::GET, "/v1/keys/p:1?client=%FF", "invalid_parameter"),
        (Method::GET, "/v1/keys/p:1?client=%FE", "invalid_parameter"),
        (Method::GET, "/v1/keys/p:1?client=a%zz", "invalid_parameter"),
        (
            Method::GET,
            "/v1/affinity?key=p:1&client=%FF",
            "invalid_parameter",
        ),
        (Method::GET, "/v1/retry-queue?limit=%", "invalid_parameter"),
    ];
    for (method, uri, code) in cases {
        let answer = call(&app, method.clone(), uri, &[], b"x").await;
        answer.assert_problem(StatusCode::BAD_REQUEST, code);
    }
    // `%25` is a literal '%': `a%25zzb` is the key `a%zzb`, which `a%zzb` no longer reaches.
    let put = call(&app, Method::PUT, "/v1/keys/a%25zzb?version=1", &[], b"pct").await;
    assert_eq!(put.status, StatusCode::OK);
    let get = call(&app, Method::GET, "/v1/keys/a%25zzb?client=c", &[], b"").await;
    assert_eq!(
        (get.status, get.body.as_slice()),
        (StatusCode::OK, b"pct".as_slice())
    );

    // U+FFFD sent as valid UTF-8 is its own client id, and `%FF` is not folded into it.
    let replacement = call(
        &app,
        Method::GET,
        "/v1/affinity?key=p:1&client=%EF%BF%BD",
        &[],
        b"",
    )
    .await;
    assert_eq!(replacement.status, StatusCode::OK);
}

#[tokio::test]
async fn integers_are_canonical_and_details_are_hotsplits_own() {
    let app = app();
    call(&app, Method::PUT, "/v1/keys/p:int?version=1", &[], b"x").await;
    let cases = [
        (Method::GET, "/v1/keys/p:int?copy=00", "invalid_copy"),
        (Method::GET, "/v1/keys/p:int?copy=01", "invalid_copy"),
        (Method::GET, "/v1/keys/p:int?copy=+1", "invalid_copy"),
        (Method::GET, "/v1/keys/p:int?copy=", "invalid_copy"),
        (Method::PUT, "/v1/keys/p:int?version=+1", "invalid_version"),
        (Method::PUT, "/v1/keys/p:int?version=", "invalid_version"),
        (
            Method::GET,
            "/v1/keys/p:int?client=c&min_version=01",
            "invalid_version",
        ),
        (Method::GET, "/v1/retry-queue?limit=01", "invalid_parameter"),
        (Method::GET, "/v1/retry-queue?limit=x1", "invalid_parameter"),
        (
            Method::GET,
            "/v1/retry-queue?limit=123684",
            "invalid_parameter",
        ),
        (
            Method::GET,
            "/v1/retry-queue?limit=1&limit=2",
            "invalid_parameter",
        ),
        (
            Method::PUT,
            "/v1/keys/p:int?version=2&sync_replicas=01&sync_timeout_ms=5",
            "invalid_parameter",
        ),
        (
            Method::DELETE,
            "/v1/keys/p:int?version=2&sync_replicas=1&sync_timeout_ms=5",
            "invalid_parameter",
        ),
    ];
    for (method, uri, code) in cases {
        let answer = call(&app, method.clone(), uri, &[], b"x").await;
        answer.assert_problem(StatusCode::BAD_REQUEST, code);
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for parser_text in [
            "deserialize",
            "invalid digit",
            "duplicate field",
            "Failed to",
        ] {
            assert!(!detail.contains(parser_text), "{uri}: {detail}");
        }
    }
    // `copy=0` is canonical and reads copy 0.
    let zero = call(&app, Method::GET, "/v1/keys/p:int?copy=0", &[], b"").await;
    assert_eq!(
        (zero.status, zero.header("hotsplit-copy")),
        (StatusCode::OK, Some("0"))
    );
    let limit = call(&app, Method::GET, "/v1/retry-queue?limit=x1", &[], b"").await;
    assert_eq!(
        limit.json()["detail"],
        "limit \"x1\" is not canonical decimal: only the digits 0-9 are allowed"
    );
}

#[tokio::test]
async fn a_query_over_max_query_bytes_gets_414_query_too_long_on_every_route() {
    let app = app();
    // `client=` and 4089 bytes: exactly the default limit of 4096 is accepted.
    let at_limit = format!("client={}", "a".repeat(4096 - "client=".len()));
    let read = call(
        &app,
        Method::GET,
        &format!("/v1/keys/p:9?{at_limit}"),
        &[],
        b"",
    )
    .await;
    read.assert_problem(StatusCode::NOT_FOUND, "not_found");
    let over = format!("{at_limit}a");
    for (method, path) in [
        (Method::GET, "/v1/keys/p:9"),
        (Method::PUT, "/v1/keys/p:9"),
        (Method::GET, "/healthz"),
        (Method::GET, "/no/such/route"),
    ] {
        let answer = call(&app, method.clone(), &format!("{path}?{over}"), &[], b"x").await;
        answer.assert_problem(StatusCode::URI_TOO_LONG, "query_too_long");
        assert!(answer.header("x-request-id").is_some(), "{method} {path}");
    }
}

/// Every route is served by the listener it belongs to (admin or data) and by the combined
/// router, and by no other.
#[tokio::test]
async fn the_admin_routes_are_served_on_one_listener_and_the_data_routes_on_the_other() {
    let config = Config::default();
    let store = Arc::new(MemoryStore::new());
    let state = hotsplit::server::app_state(&config, store, Metrics::new()).expect("a test state");
    for path in hotsplit::http::paths::ROUTES {
        let uri = path.replace("{key}", "k");
        let admin = hotsplit::http::paths::ADMIN_LISTENER.contains(&path);
        for (router, serves) in [
            (hotsplit::http::data_router(state.clone()), !admin),
            (hotsplit::http::admin_router(state.clone()), admin),
            (hotsplit::http::router(state.clone()), true),
        ] {
            let request = Request::get(&uri).body(axum::body::Body::empty()).unwrap();
            let status = router.oneshot(request).await.unwrap().status();
            assert_eq!(
                status != StatusCode::NOT_FOUND,
                serves,
                "{uri}: {status} (admin route: {admin})"
            );
        }
    }
}
