//! The fast path of `GET /v1/keys/{key}` on real Redis: every read request is sent to the
//! router (`App::router`, through `oneshot`) and to the listener's service (`App::call`, which
//! takes the fast path for the read route), and the two whole answers (status, every header in
//! order, body) must be equal: hits from the near cache, reads from Redis, misses, `HEAD`, every
//! refusal and error (invalid key, unknown class, missing client, a duplicate parameter, a floor
//! above the copy, 401 and 403, a shed 503, a deadline 503, a query too long), and the paths the
//! fast path must leave to the router (a trailing slash, an empty key, two segments).
//!
//! What may legitimately differ is left out of the comparison: the request id when the request
//! sent none (a random one), and the digits of an entry's age (`age_ms=` in `Hotsplit-Route`,
//! `Age`), which grow between the two reads.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use hotsplit::auth::Tokens;
use hotsplit::http::App;
use hotsplit::metrics::Metrics;
use hotsplit_devcluster::Standalone;
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::harness::{self, config_from_toml};

/// A near-cache class whose entries stay young for the whole test.
const PATIENT: &str = "[classes.patient]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"60s\"\nnear_cache_max_age = \"60s\"\n";

/// The tokens of the token case: one reader, one writer.
const READER: &str = "fast-path-reader-0123456789";
const WRITER: &str = "fast-path-writer-0123456789";

/// A service config on `url` with `server` settings: family `fp:` read from the near cache,
/// family `pp:` read from the primary (no near cache).
fn config(url: &str, server: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[server]\n{server}\n[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"fp:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"patient\"\n[[family]]\nprefix = \"pp:\"\ncopies = 2\nttl = \"10m\"\ndefault_class = \"primary\"\n{PATIENT}",
        timeout = harness::command_timeout_toml()
    ))
}

/// The app of `config` over Redis at `url`, with `tokens` when given.
async fn app(url: &str, config: &hotsplit::config::Config, tokens: Option<&str>) -> App {
    let store = harness::redis_store(url, Duration::from_secs(2)).await;
    let state = hotsplit::server::app_state(config, store, Metrics::new()).expect("app state");
    if let Some(tokens) = tokens {
        state
            .tokens()
            .store(Some(Tokens::parse(tokens).expect("tokens parse")));
    }
    hotsplit::http::app(state)
}

/// A whole answer, as compared.
#[derive(Debug, PartialEq, Eq)]
struct Whole {
    status: StatusCode,
    /// Every header line, in order.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Publishes `body` with `PUT uri` through `app`'s router; it must answer 200.
async fn publish(app: &App, uri: &str, body: &'static str) {
    let written = app
        .router()
        .clone()
        .oneshot(Request::put(uri).body(Body::from(body)).unwrap())
        .await
        .unwrap();
    assert_eq!(written.status(), StatusCode::OK, "{uri}");
}

/// A request of the comparison.
fn request(method: &Method, uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::builder().method(method.clone()).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).expect("a request")
}

/// `answer` read whole; the request id dropped when `random_id` (the request sent none), an
/// age's digits replaced.
async fn whole(
    answer: impl Future<Output = Result<axum::response::Response, Infallible>>,
    random_id: bool,
) -> Whole {
    let response = answer.await.unwrap_or_else(|never| match never {});
    let status = response.status();
    let headers = response
        .headers()
        .iter()
        .filter(|(name, _)| !(random_id && name.as_str() == "x-request-id"))
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            let value = match name.as_str() {
                "age" => "N".to_owned(),
                "hotsplit-route" => without_age_digits(&value),
                _ => value,
            };
            (name.as_str().to_owned(), value)
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes()
        .to_vec();
    Whole {
        status,
        headers,
        body,
    }
}

/// `route` with the digits after `age_ms=` replaced by `N`.
fn without_age_digits(route: &str) -> String {
    match route.split_once("age_ms=") {
        Some((before, after)) => {
            let rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{before}age_ms=N{rest}")
        }
        None => route.to_owned(),
    }
}

/// Sends `method uri` with `headers` to the router and to the app; asserts that the app takes
/// the fast path exactly when `fast` and that both answers are equal; returns the answer.
async fn same_answer(
    app: &App,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    fast: bool,
) -> Whole {
    let random_id = !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("x-request-id"));
    let sent = request(&method, uri, headers);
    assert_eq!(app.takes_fast_path(&sent), fast, "{method} {uri}: dispatch");
    let routed = whole(
        app.router().clone().oneshot(request(&method, uri, headers)),
        random_id,
    )
    .await;
    let fast_answer = whole(app.call(sent), random_id).await;
    assert_eq!(
        fast_answer,
        routed,
        "{method} {uri} {headers:?}: the app's answer (left) is not the router's (right); body {}",
        String::from_utf8_lossy(&routed.body)
    );
    routed
}

/// A request of the comparison: method, URI, headers, and whether it goes the fast path.
type Case<'a> = (Method, String, Vec<(&'a str, &'a str)>, bool);

/// The `Hotsplit-Route` of an answer.
fn route_of(answer: &Whole) -> &str {
    answer
        .headers
        .iter()
        .find(|(name, _)| name == "hotsplit-route")
        .map_or("", |(_, value)| value.as_str())
}

/// The `Hotsplit-Session` of an answer.
fn session_of(answer: &Whole) -> Option<String> {
    answer
        .headers
        .iter()
        .find(|(name, _)| name == "hotsplit-session")
        .map(|(_, value)| value.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_answers_what_the_router_answers() {
    let server = harness::shared_standalone();
    let config = config(&server.url(), "max_query_bytes = 256");
    let app = app(&server.url(), &config, None).await;
    for uri in ["/v1/keys/fp:k?version=3", "/v1/keys/pp:k?version=3"] {
        publish(&app, uri, "three").await;
    }
    // The first read of the copy fills its entry; the compared reads are hits.
    let warm = same_answer(&app, Method::GET, "/v1/keys/fp:k?client=alice", &[], true).await;
    assert_eq!(warm.status, StatusCode::OK);
    let hit = same_answer(&app, Method::GET, "/v1/keys/fp:k?client=alice", &[], true).await;
    assert!(
        route_of(&hit).contains(";source=near-cache;age_ms=N"),
        "a hit: {}",
        route_of(&hit)
    );
    assert_eq!(hit.body, b"three");
    let session = session_of(&hit).expect("a read answer carries a session token");
    let id = [("x-request-id", "fast-path-7")];
    let cases: Vec<Case> = [
        near_cache_hit_cases(&id, &session),
        redis_and_refusal_cases(),
        unmatched_route_cases(),
    ]
    .concat();
    let mut statuses = Vec::new();
    for (method, uri, headers, fast) in &cases {
        let answer = same_answer(&app, method.clone(), uri, headers, *fast).await;
        statuses.push(answer.status.as_u16());
    }
    // The cases cover what they say: hits, a 304, Redis reads, 404s, refusals.
    for status in [200, 304, 400, 404, 405, 414, 503] {
        assert!(
            statuses.contains(&status),
            "no case answered {status}: {statuses:?}"
        );
    }
}

/// Reads the near cache answers: plain, `HEAD`, a client header with a trace, percent-encoded,
/// conditional, with a floor, with a session token (`session`) and a garbled one; the first
/// carries the request id `id`.
fn near_cache_hit_cases<'a>(id: &[(&'a str, &'a str)], session: &'a str) -> Vec<Case<'a>> {
    vec![
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice".into(),
            id.to_vec(),
            true,
        ),
        (
            Method::HEAD,
            "/v1/keys/fp:k?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k".into(),
            vec![
                ("hotsplit-client", "bob"),
                (
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                ),
            ],
            true,
        ),
        // Percent-encoded: the same key.
        (
            Method::GET,
            "/v1/keys/fp%3Ak?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice".into(),
            vec![("if-none-match", "\"3\"")],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice&min_version=2".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice".into(),
            vec![("hotsplit-session", session)],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice".into(),
            vec![("hotsplit-session", "garbled!")],
            true,
        ),
    ]
}

/// Reads from Redis (a class without the near cache, a missing key) and refused reads.
fn redis_and_refusal_cases() -> Vec<Case<'static>> {
    vec![
        // From Redis: a class without the near cache, a missing key.
        (
            Method::GET,
            "/v1/keys/pp:k?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::HEAD,
            "/v1/keys/pp:k?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:absent?client=alice".into(),
            vec![],
            true,
        ),
        // Errors.
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice&min_version=9".into(),
            vec![],
            true,
        ),
        (Method::GET, "/v1/keys/fp:k".into(), vec![], true),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice&class=nope".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=a&client=b".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/fp:k?client=alice&copy=x".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/a%zzb?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            "/v1/keys/a%7Bb?client=alice".into(),
            vec![],
            true,
        ),
        (
            Method::GET,
            format!("/v1/keys/{}?client=alice", "k".repeat(513)),
            vec![],
            true,
        ),
        (
            Method::GET,
            format!("/v1/keys/fp:k?client={}", "c".repeat(300)),
            vec![],
            true,
        ),
    ]
}

/// Requests the read route does not match: the router answers both sides.
fn unmatched_route_cases() -> Vec<Case<'static>> {
    vec![
        // What the read route does not match: the router answers both.
        (
            Method::GET,
            "/v1/keys/fp:k/?client=alice".into(),
            vec![],
            false,
        ),
        (Method::GET, "/v1/keys/?client=alice".into(), vec![], false),
        (
            Method::GET,
            "/v1/keys/fp:k/more?client=alice".into(),
            vec![],
            false,
        ),
        (
            Method::POST,
            "/v1/keys/fp:k?client=alice".into(),
            vec![],
            false,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_refuses_tokens_and_sheds_as_the_router_does() {
    let server = harness::shared_standalone();
    let tokens = format!("plain:{READER} read\nplain:{WRITER} write\n");
    let config = config(&server.url(), "max_in_flight = 1");
    let app = app(&server.url(), &config, Some(&tokens)).await;
    let reader = format!("Bearer {READER}");
    let writer = format!("Bearer {WRITER}");
    let uri = "/v1/keys/fp:absent?client=alice";
    let cases: [(Vec<(&str, &str)>, u16); 4] = [
        (vec![], 401),
        (vec![("authorization", "Bearer stranger-0123456789")], 401),
        (vec![("authorization", writer.as_str())], 403),
        (vec![("authorization", reader.as_str())], 404),
    ];
    for (headers, status) in &cases {
        let answer = same_answer(&app, Method::GET, uri, headers, true).await;
        assert_eq!(answer.status.as_u16(), *status, "{headers:?}");
    }
    // One read in flight (its future holds the bound's one slot until it is dropped): the
    // next, on either path, is shed.
    let held = app.call(request(
        &Method::GET,
        uri,
        &[("authorization", reader.as_str())],
    ));
    let shed = same_answer(
        &app,
        Method::GET,
        uri,
        &[("authorization", reader.as_str())],
        true,
    )
    .await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        shed.headers.iter().any(|(name, _)| name == "retry-after"),
        "{shed:?}"
    );
    drop(held);
    let after = same_answer(
        &app,
        Method::GET,
        uri,
        &[("authorization", reader.as_str())],
        true,
    )
    .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_misses_its_deadline_as_the_router_does() {
    // A server of its own: the test stops it.
    let server = Standalone::start().expect("redis-server");
    let config = config(&server.url(), "request_deadline = \"200ms\"");
    let app = app(&server.url(), &config, None).await;
    server.node.pause().expect("SIGSTOP the server");
    let answer = same_answer(&app, Method::GET, "/v1/keys/pp:k?client=alice", &[], true).await;
    server.node.resume().expect("SIGCONT the server");
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        String::from_utf8_lossy(&answer.body).contains("deadline_exceeded"),
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// The body and the `Hotsplit-Version` of a read of `uri` through the listener's service.
async fn read_through(app: &App, uri: &str) -> Whole {
    let sent = request(&Method::GET, uri, &[]);
    assert!(app.takes_fast_path(&sent), "{uri}: the fast path");
    whole(app.call(sent), true).await
}

/// The value of header `name` in `answer`.
fn header_of<'a>(answer: &'a Whole, name: &str) -> &'a str {
    answer
        .headers
        .iter()
        .find(|(held, _)| held == name)
        .map_or("", |(_, value)| value.as_str())
}

/// A reader naming a client is answered from memory only at or above what this instance
/// already served of the key: an entry a primary filled below the key's exact high-water mark
/// is not served from memory on the fast path (the rollback guard reads again, and a sibling
/// holds the newer version), while a hit at the mark is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_below_the_instances_high_water_is_not_served_from_memory() {
    let server = harness::shared_standalone();
    let config = config(&server.url(), "");
    let app = app(&server.url(), &config, None).await;
    publish(&app, "/v1/keys/fp:hw?version=2", "two").await;
    let reader_of = |copy| harness::client_of_copy("reader-", copy, 4);
    let (zero, one) = (reader_of(0), reader_of(1));
    // Copy 1's entry holds 2, filled by the primary; a second read is a hit.
    let one_uri = format!("/v1/keys/fp:hw?client={one}");
    read_through(&app, &one_uri).await;
    let hit = read_through(&app, &one_uri).await;
    assert!(route_of(&hit).contains("source=near-cache"), "{hit:?}");
    assert_eq!(
        (hit.body.as_slice(), header_of(&hit, "hotsplit-version")),
        (&b"two"[..], "2")
    );
    // Copy 0 moves to 3 behind the instance; a primary-class read (no near cache) serves it,
    // which raises the key's high-water to an exact 3.
    server
        .node
        .cli(&["HSET", "fp:hw#0", "ver", "3", "val", "three"])
        .expect("HSET");
    let raised = read_through(&app, &format!("/v1/keys/fp:hw?client={zero}&class=primary")).await;
    assert_eq!(raised.body, b"three", "{raised:?}");
    // Copy 1's entry still holds 2 and is young, but below the mark: it is not served. The
    // guard's second read, held to 3, finds it on a sibling or refuses naming the floor.
    let held = read_through(&app, &one_uri).await;
    let body = String::from_utf8_lossy(&held.body);
    assert!(body != "two", "went back below the high-water: {held:?}");
    match held.status {
        StatusCode::OK => assert_eq!(
            (body.as_ref(), header_of(&held, "hotsplit-version")),
            ("three", "3"),
            "{held:?}"
        ),
        StatusCode::SERVICE_UNAVAILABLE => assert!(
            body.contains("below_version_floor") && body.contains("version 3"),
            "{body}"
        ),
        other => panic!("answered {other}: {body}"),
    }
}
