//! Telemetry by convention: `/metrics` is OpenMetrics under its own content type, every measured
//! quantity is in a base unit, `hotsplit_build_info` names the version, and each request gets a
//! request id that is echoed, logged on every line of the request (JSON logs of the real binary)
//! and never mistaken for the read-pinning `Hotsplit-Request`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::Router;
use hotsplit::config::Config;
use hotsplit::metrics::Metrics;
use hotsplit::store::memory::MemoryStore;
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::harness;

/// The router on the embedded store, with a 4-copy family `p:`.
fn app() -> Router {
    let config = Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 4").unwrap();
    config.validate().unwrap();
    let state = hotsplit::server::app_state(&config, Arc::new(MemoryStore::new()), Metrics::new())
        .expect("app state");
    hotsplit::http::router(state)
}

/// One request through `app`; the answer's status, headers and body text.
async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, HeaderValue)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, value.clone());
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// The `X-Request-Id` of an answer.
fn request_id(headers: &axum::http::HeaderMap) -> &str {
    headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .expect("every answer carries X-Request-Id")
}

/// Whether `id` has the shape of a generated id: 32 lowercase hex digits.
fn generated(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[tokio::test]
async fn metrics_are_openmetrics_under_their_content_type_with_build_info() {
    let app = app();
    let (status, headers, body) = call(&app, Method::GET, "/metrics", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(body.ends_with("# EOF\n"), "an OpenMetrics body: {body}");
    assert!(body.contains("# TYPE hotsplit_build info\n"), "{body}");
    let line = format!(
        "hotsplit_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(body.contains(&line), "{line} in {body}");
}

/// The unit-like words a metric name must not carry: anything but a base unit.
const NON_BASE_UNITS: [&str; 12] = [
    "milliseconds",
    "millis",
    "ms",
    "microseconds",
    "micros",
    "us",
    "nanoseconds",
    "ns",
    "minutes",
    "hours",
    "kilobytes",
    "percent",
];

/// Checks the `# TYPE` and `# UNIT` lines of an exposition: every declared unit is a base unit
/// that ends its family's name; every family named in seconds or bytes declares that unit; no
/// family names a non-base unit. Returns the families with their type.
fn check_units(exposition: &str) -> BTreeMap<String, String> {
    let mut types = BTreeMap::new();
    let mut units = BTreeMap::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(family), Some(kind)) => {
                types.insert(family.to_owned(), kind.to_owned());
            }
            (Some("#"), Some("UNIT"), Some(family), Some(unit)) => {
                units.insert(family.to_owned(), unit.to_owned());
            }
            _ => {}
        }
    }
    assert!(types.len() >= 10, "families declared: {types:?}");
    for (family, unit) in &units {
        assert!(
            ["seconds", "bytes"].contains(&unit.as_str()),
            "{family} declares the unit {unit}, not a base unit"
        );
        assert!(
            family.ends_with(&format!("_{unit}")),
            "{family} declares {unit} but its name does not end in it"
        );
        assert!(
            types.contains_key(family),
            "{family} has a UNIT but no TYPE"
        );
    }
    for family in types.keys() {
        for word in family.split('_') {
            assert!(
                !NON_BASE_UNITS.contains(&word),
                "{family} names a non-base unit ({word})"
            );
        }
        for unit in ["seconds", "bytes"] {
            if family.ends_with(&format!("_{unit}")) {
                assert_eq!(
                    units.get(family).map(String::as_str),
                    Some(unit),
                    "{family} is in {unit} and declares it with # UNIT"
                );
            }
        }
    }
    types
}

#[tokio::test]
async fn every_exported_metric_with_a_unit_ends_in_a_base_unit() {
    let app = app();
    // A read and a publish, so the latency histogram has series too.
    call(&app, Method::PUT, "/v1/keys/p:1?version=1", &[], "x").await;
    call(&app, Method::GET, "/v1/keys/p:1?client=c", &[], "").await;
    let (_, _, body) = call(&app, Method::GET, "/metrics", &[], "").await;
    let types = check_units(&body);
    for (family, kind) in [
        ("hotsplit_http_request_duration_seconds", "histogram"),
        ("hotsplit_replica_lag_seconds", "histogram"),
        ("hotsplit_class_staleness_budget_seconds", "gauge"),
        ("hotsplit_retry_queue_oldest_age_seconds", "gauge"),
        ("hotsplit_retry_queue_bytes", "gauge"),
        ("hotsplit_spool_bytes", "gauge"),
        ("hotsplit_replica_offset_gap_bytes", "gauge"),
        ("hotsplit_store_up", "gauge"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(kind),
            "{family} in {body}"
        );
    }
    // The built-in replica classes' budgets, in seconds.
    for line in [
        "hotsplit_class_staleness_budget_seconds{class=\"advisory\"} 0.25\n",
        "hotsplit_class_staleness_budget_seconds{class=\"re-derivable\"} 2.0\n",
    ] {
        assert!(body.contains(line), "{line} in {body}");
    }

    // `hotsplit audit --watch` follows the same conventions, under the same content type.
    let audit = Arc::new(hotsplit::audit::metrics::AuditMetrics::new());
    let response = hotsplit::audit::metrics::router(audit.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let audit_types = check_units(&audit.render());
    assert_eq!(
        audit_types
            .get("hotsplit_audit_round_duration_seconds")
            .map(String::as_str),
        Some("gauge")
    );
}

#[tokio::test]
async fn a_fit_request_id_is_echoed_and_an_unfit_one_replaced() {
    let app = app();
    let fit = "a".repeat(128);
    let (_, headers, _) = call(
        &app,
        Method::GET,
        "/v1/keys/p:1?client=c",
        &[("x-request-id", HeaderValue::from_str(&fit).unwrap())],
        "",
    )
    .await;
    assert_eq!(request_id(&headers), fit);

    let long = "a".repeat(129);
    for unfit in [
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static("two words"),
        HeaderValue::from_bytes(b"tab\there").unwrap(),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
    ] {
        let (_, headers, _) = call(
            &app,
            Method::GET,
            "/healthz",
            &[("x-request-id", unfit.clone())],
            "",
        )
        .await;
        let id = request_id(&headers);
        assert!(
            generated(id),
            "{unfit:?} was replaced by a generated id, got {id:?}"
        );
    }

    // A traceparent's trace id serves when no X-Request-Id came; each request without either
    // gets an id of its own, unknown routes included.
    let traceparent =
        HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let (_, headers, _) = call(
        &app,
        Method::GET,
        "/healthz",
        &[("traceparent", traceparent)],
        "",
    )
    .await;
    assert_eq!(request_id(&headers), "4bf92f3577b34da6a3ce929d0e0e4736");
    let (status, first, _) = call(&app, Method::GET, "/no/such/route", &[], "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, second, _) = call(&app, Method::GET, "/no/such/route", &[], "").await;
    assert!(generated(request_id(&first)));
    assert_ne!(request_id(&first), request_id(&second));
}

#[tokio::test]
async fn the_request_id_never_sets_or_stands_in_for_hotsplit_request() {
    let app = app();
    let pin = |name: &'static str, value: &'static str| [(name, HeaderValue::from_static(value))];
    // Control: a write carrying Hotsplit-Request pins the reads carrying it to primaries.
    call(
        &app,
        Method::PUT,
        "/v1/keys/p:1?version=1",
        &pin("hotsplit-request", "r0"),
        "x",
    )
    .await;
    let (_, headers, _) = call(
        &app,
        Method::GET,
        "/v1/keys/p:1?client=c&class=advisory",
        &pin("hotsplit-request", "r0"),
        "",
    )
    .await;
    assert_eq!(
        headers["hotsplit-route"],
        "class=advisory;reason=request-pin"
    );

    // The same with X-Request-Id: no pin, and no Hotsplit-Request in any answer.
    let (_, put, _) = call(
        &app,
        Method::PUT,
        "/v1/keys/p:2?version=1",
        &pin("x-request-id", "r1"),
        "x",
    )
    .await;
    let (_, get, _) = call(
        &app,
        Method::GET,
        "/v1/keys/p:2?client=c&class=advisory",
        &pin("x-request-id", "r1"),
        "",
    )
    .await;
    assert_eq!(get["hotsplit-route"], "class=advisory;reason=no-replica");
    for headers in [&put, &get] {
        assert_eq!(request_id(headers), "r1");
        assert!(headers.get("hotsplit-request").is_none(), "{headers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_request_id_on_the_requests_lines() {
    let port = harness::free_port();
    let mut command = harness::serve_command();
    command
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
        ])
        // `read served` is a debug line of the read path, inside the request's span.
        .env("HOTSPLIT_LOG", "info,hotsplit=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().expect("start hotsplit");
    let stdout = child.stdout.take().expect("piped stdout");
    // Lines are read on a thread of their own, so a quiet log never blocks the test.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    harness::wait_ready(&mut child, &base, String::new).await;
    harness::publish_succeeds(&http, &base, "k1", 1, "v").await;
    let answer = harness::get(
        &http,
        &format!("{base}/v1/keys/k1?client=c"),
        &[("x-request-id", "trace-me-42")],
    )
    .await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.headers()["x-request-id"], "trace-me-42");

    let found = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = Vec::new();
        while let Some(line) = lines.recv().await {
            let parsed: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| panic!("a log line is not JSON ({err}): {line}"));
            if parsed["span"]["request_id"] == "trace-me-42" {
                return Ok(parsed);
            }
            seen.push(line);
        }
        Err(seen)
    })
    .await;
    harness::sigterm_and_wait(child).await;
    let line = match found {
        Ok(Ok(line)) => line,
        Ok(Err(seen)) => panic!("no log line carries the request id; lines: {seen:#?}"),
        Err(_) => panic!("no log line carried the request id within 20 s"),
    };
    assert_eq!(line["span"]["name"], "request", "{line}");
    assert_eq!(line["fields"]["message"], "read served", "{line}");
}
