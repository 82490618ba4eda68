//! Bearer tokens and scopes: 401 and 403 on every data and admin endpoint through
//! `Router::oneshot` on the embedded store; the binary's refusal to serve a public address
//! without tokens, or tokens on a public plaintext listener; and a token that never reaches a
//! log line, an answer or `/metrics`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::Router;
use hotsplit::auth::Tokens;
use hotsplit::config::Config;
use hotsplit::metrics::Metrics;
use hotsplit::store::memory::MemoryStore;

use crate::harness;
use crate::http_api::{call, Answer};

/// A token with each single scope, and one with all three.
pub(crate) const READER: &str = "reader-token-0123456789";
pub(crate) const WRITER: &str = "writer-token-0123456789";
pub(crate) const ADMIN: &str = "admin-token-0123456789";
const ALL: &str = "all-scopes-token-0123456789";
/// A well-formed token no entry holds.
const STRANGER: &str = "stranger-token-0123456789";

/// The tokens file of these tests: one hashed entry, the rest plain.
pub(crate) fn tokens_file_text() -> String {
    format!(
        "# test tokens\n{} read  # reader\nplain:{WRITER} write  # writer\nplain:{ADMIN} admin # admin\nplain:{ALL} read,write,admin # all\n",
        hotsplit::auth::hash_line(READER)
    )
}

fn app_with_tokens() -> Router {
    let config = Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 4\n").unwrap();
    config.validate().unwrap();
    let state = hotsplit::server::app_state(&config, Arc::new(MemoryStore::new()), Metrics::new())
        .expect("app state");
    state.tokens().store(Some(
        Tokens::parse(&tokens_file_text()).expect("tokens parse"),
    ));
    hotsplit::http::router(state)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn call_as(app: &Router, method: Method, uri: &str, token: Option<&str>) -> Answer {
    let authorization = token.map(bearer);
    let headers: Vec<(&str, &str)> = authorization
        .as_deref()
        .map(|value| vec![("authorization", value)])
        .unwrap_or_default();
    call(app, method, uri, &headers, b"v").await
}

fn assert_unauthorized(answer: &Answer, error: Option<&str>, what: &str) {
    answer.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    let challenge = answer.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer realm=\"hotsplit\""),
        "{what}: {challenge}"
    );
    match error {
        Some(error) => assert!(
            challenge.contains(&format!("error=\"{error}\"")),
            "{what}: {challenge}"
        ),
        None => assert!(!challenge.contains("error="), "{what}: {challenge}"),
    }
}

#[tokio::test]
async fn every_data_and_admin_endpoint_needs_its_scope() {
    let app = app_with_tokens();
    // Something to read, invalidate and list.
    let put = call_as(&app, Method::PUT, "/v1/keys/p:1?version=1", Some(WRITER)).await;
    assert_eq!(put.status, StatusCode::OK);
    let endpoints = [
        (Method::GET, "/v1/keys/p:1?client=c", "read"),
        (Method::HEAD, "/v1/keys/p:1?client=c", "read"),
        (Method::PUT, "/v1/keys/p:1?version=2", "write"),
        (Method::DELETE, "/v1/keys/p:1?version=3", "write"),
        (Method::GET, "/v1/affinity?key=p:1&client=c", "read"),
        (Method::GET, "/metrics", "admin"),
        (Method::GET, "/v1/classes", "admin"),
        (Method::GET, "/v1/lag", "admin"),
        (Method::GET, "/v1/routing", "admin"),
        (Method::GET, "/v1/retry-queue", "admin"),
        (Method::GET, "/v1/instances", "admin"),
    ];
    let single = [("read", READER), ("write", WRITER), ("admin", ADMIN)];
    for (method, uri, scope) in endpoints {
        let what = format!("{method} {uri}");
        let none = call_as(&app, method.clone(), uri, None).await;
        if method == Method::HEAD {
            assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{what}");
        } else {
            assert_unauthorized(&none, None, &what);
            let unknown = call_as(&app, method.clone(), uri, Some(STRANGER)).await;
            assert_unauthorized(&unknown, Some("invalid_token"), &what);
        }
        for (held, token) in single {
            let answer = call_as(&app, method.clone(), uri, Some(token)).await;
            if held == scope {
                assert!(
                    answer.status.is_success(),
                    "{what} with a {held} token: {} {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
            } else if method == Method::HEAD {
                assert_eq!(answer.status, StatusCode::FORBIDDEN, "{what} as {held}");
            } else {
                answer.assert_problem(StatusCode::FORBIDDEN, "forbidden");
                let challenge = answer.header("www-authenticate").unwrap_or_default();
                assert!(
                    challenge.contains("error=\"insufficient_scope\"")
                        && challenge.contains(&format!("scope=\"{scope}\"")),
                    "{what} as {held}: {challenge}"
                );
            }
        }
        let all = call_as(&app, method.clone(), uri, Some(ALL)).await;
        assert!(
            all.status.is_success(),
            "{what} with every scope: {}",
            all.status
        );
    }
}

#[tokio::test]
async fn probes_need_no_token_and_unknown_paths_need_one() {
    let app = app_with_tokens();
    for uri in ["/healthz", "/readyz", "/openapi.json"] {
        let answer = call_as(&app, Method::GET, uri, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}");
        // A bad token on a probe changes nothing either: probes ignore credentials.
        let answer = call_as(&app, Method::GET, uri, Some(STRANGER)).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}");
    }
    // An unknown path says 404 only to a caller with a valid token, whatever its scope.
    let answer = call_as(&app, Method::GET, "/v1/nothing-here", None).await;
    assert_unauthorized(&answer, None, "unknown path");
    let answer = call_as(&app, Method::GET, "/v1/nothing-here", Some(ADMIN)).await;
    answer.assert_problem(StatusCode::NOT_FOUND, "not_found");
    // Malformed credentials are the same as none: another scheme, two lines, an empty token.
    for headers in [
        vec![("authorization", "Basic cmVhZGVyOng=")],
        vec![("authorization", "Bearer")],
        vec![("authorization", "Bearer   ")],
    ] {
        let answer = call(&app, Method::GET, "/v1/classes", &headers, b"").await;
        assert_unauthorized(&answer, None, &format!("{headers:?}"));
    }
    let two = [("authorization", "Bearer x"), ("authorization", "Bearer y")];
    let answer = call(&app, Method::GET, "/v1/classes", &two, b"").await;
    assert_unauthorized(&answer, None, "two lines");
    // The scheme is case-insensitive.
    let lower = format!("bearer {ADMIN}");
    let answer = call(
        &app,
        Method::GET,
        "/v1/classes",
        &[("authorization", &lower)],
        b"",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
}

#[tokio::test]
async fn refusals_do_not_tell_whether_a_key_exists() {
    let app = app_with_tokens();
    let put = call_as(&app, Method::PUT, "/v1/keys/p:here?version=1", Some(WRITER)).await;
    assert_eq!(put.status, StatusCode::OK);
    for (method, token) in [
        (Method::GET, None),
        (Method::GET, Some(STRANGER)),
        (Method::GET, Some(WRITER)),
        (Method::DELETE, Some(READER)),
        (Method::PUT, Some(READER)),
    ] {
        let present = call_as(
            &app,
            method.clone(),
            "/v1/keys/p:here?client=c&version=9",
            token,
        )
        .await;
        let absent = call_as(
            &app,
            method.clone(),
            "/v1/keys/p:gone?client=c&version=9",
            token,
        )
        .await;
        assert_eq!(present.status, absent.status, "{method} {token:?}");
        assert!(
            present.status == StatusCode::UNAUTHORIZED || present.status == StatusCode::FORBIDDEN
        );
        assert_eq!(present.body, absent.body, "{method} {token:?}");
        assert!(present.header("hotsplit-version").is_none());
        assert!(present.header("etag").is_none());
    }
}

/// Runs `hotsplit serve` with `config` (a TOML text) and returns its exit status and stderr;
/// for configs that must be refused before anything binds.
fn serve_refused(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hotsplit.toml");
    std::fs::write(&path, config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn serve_refuses_a_public_address_without_tokens_and_tokens_in_clear() {
    let port = harness::free_port();
    let (code, stderr) = serve_refused(&format!("[server]\nlisten = \"0.0.0.0:{port}\"\n"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("server.allow_unauthenticated"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let (code, stderr) = serve_refused(&format!(
        "[server]\nlisten = \"0.0.0.0:{port}\"\n[auth]\ntokens_file = {:?}\n",
        tokens.display().to_string()
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("server.tls_terminated_upstream"),
        "{stderr}"
    );

    // A bad line names the field and the line, never the line's text.
    std::fs::write(&tokens, format!("plain:{STRANGER} sudo\n")).unwrap();
    let (code, stderr) = serve_refused(&format!(
        "[auth]\ntokens_file = {:?}\n",
        tokens.display().to_string()
    ));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("auth.tokens_file") && stderr.contains("line 1"),
        "{stderr}"
    );
    assert!(!stderr.contains(STRANGER), "{stderr}");
}

/// Starts the binary with `config` on `port` (stdout and stderr into one log file), waits for
/// `/readyz`, and returns the child and the log's path. `log` is `HOTSPLIT_LOG`, if any.
pub(crate) async fn spawn_with_config(
    dir: &std::path::Path,
    config: &str,
    port: u16,
    log: Option<&str>,
) -> (std::process::Child, std::path::PathBuf) {
    let path = dir.join("hotsplit.toml");
    std::fs::write(&path, config).unwrap();
    let log_path = dir.join("log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    let mut command = harness::serve_command();
    command.arg("--config").arg(&path);
    match log {
        Some(filter) => command.env("HOTSPLIT_LOG", filter),
        None => command.env_remove("HOTSPLIT_LOG"),
    };
    let mut child = command
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("start hotsplit");
    harness::wait_ready(&mut child, &format!("http://127.0.0.1:{port}"), || {
        std::fs::read_to_string(&log_path).unwrap_or_default()
    })
    .await;
    (child, log_path)
}

/// SIGTERMs `child`, waits for it, and returns its log.
pub(crate) fn stop_and_read_log(mut child: std::process::Child, log: &std::path::Path) -> String {
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert!(status.success(), "exit status {status:?}");
    let mut text = String::new();
    std::fs::File::open(log)
        .and_then(|mut file| file.read_to_string(&mut text))
        .expect("read the log");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_never_appears_in_logs_answers_or_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let port = harness::free_port();
    let (child, log) = spawn_with_config(
        dir.path(),
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[auth]\ntokens_file = {:?}\n",
            tokens.display().to_string()
        ),
        port,
        Some("debug"),
    )
    .await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let mut answers = String::new();
    let attempts = [
        (Method::PUT, "/v1/keys/k?version=1", WRITER),
        (Method::PUT, "/v1/keys/k?version=2", READER),
        (Method::GET, "/v1/keys/k?client=c", READER),
        (Method::GET, "/v1/keys/k?client=c", STRANGER),
        (Method::GET, "/v1/classes", WRITER),
        (Method::GET, "/v1/nowhere", STRANGER),
    ];
    for (method, path, token) in attempts {
        let answer = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(token)
            .body("v")
            .send()
            .await
            .expect("send");
        answers.push_str(&format!("{:?}\n", answer.headers()));
        answers.push_str(&answer.text().await.expect("body"));
    }
    let metrics = http
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    assert!(
        metrics.contains("hotsplit_auth_refused_total{reason=\"scope\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hotsplit_auth_refused_total{reason=\"invalid\"} 2"),
        "{metrics}"
    );
    let log = stop_and_read_log(child, &log);
    assert!(log.contains("api tokens loaded"), "{log}");
    assert!(
        log.contains("token=\"writer\"") || log.contains("token=writer"),
        "the refusal names the token by name: {log}"
    );
    for token in [READER, WRITER, ADMIN, ALL, STRANGER] {
        for (what, text) in [("log", &log), ("answers", &answers), ("metrics", &metrics)] {
            assert!(!text.contains(token), "{what} shows a token: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_when_it_answers_everyone_on_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let (child, log) = spawn_with_config(
        dir.path(),
        &format!("[server]\nlisten = \"0.0.0.0:{port}\"\nallow_unauthenticated = true\n"),
        port,
        Some("debug"),
    )
    .await;
    let log = stop_and_read_log(child, &log);
    let warning = log
        .lines()
        .find(|line| line.contains("server.allow_unauthenticated"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("WARN"), "{warning}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_sends_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let service = harness::Service::start(harness::config_from_toml(&format!(
        "[[family]]\nprefix = \"c:\"\ncopies = 4\n[auth]\ntokens_file = {:?}\n",
        tokens.display().to_string()
    )))
    .await;
    let client = |token: Option<&str>| {
        let client = hotsplit::client::Client::new(&service.base, "session").expect("client");
        match token {
            Some(token) => client.with_token(token),
            None => client,
        }
    };
    let err = client(None).publish("c:1", Some(1), "v").await.unwrap_err();
    assert_eq!(err.kind(), hotsplit::ErrorKind::Unauthorized, "{err}");
    let err = client(Some(READER))
        .publish("c:1", Some(1), "v")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), hotsplit::ErrorKind::Forbidden, "{err}");
    let writer = client(Some(ALL));
    writer.publish("c:1", Some(1), "v").await.expect("publish");
    let read = client(Some(READER)).read("c:1").await.expect("read");
    assert_eq!(read.map(|read| read.value), Some(bytes::Bytes::from("v")));
    let err = client(Some(WRITER)).read("c:1").await.unwrap_err();
    assert_eq!(err.kind(), hotsplit::ErrorKind::Forbidden, "{err}");
    service.stop().await;
}

/// `cmdstat_ping` calls on the server at `port`.
fn ping_calls(port: u16) -> u64 {
    let stats = hotsplit_devcluster::cli(port, &["INFO", "commandstats"]).expect("INFO");
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_ping:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Finding 9 of issue 21 on the binary: `/readyz` needs no token and is not counted by the
/// in-flight bound, and it sent every primary a `PING` per request and listed Redis
/// `host:port`s to anyone on the data port. Now 200 concurrent probes cost at most one `PING`
/// per `heal.probe_interval` (the prober's own sweep is off: `heal.probe_misses = 0`), and a
/// pending replica's address is shown only to an admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_shares_one_ping_per_probe_interval_and_shows_nodes_to_admins_only() {
    let redis = tokio::task::spawn_blocking(hotsplit_devcluster::Standalone::start)
        .await
        .unwrap()
        .expect("start redis");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let port = harness::free_port();
    // A replica nobody listens on: once the warm-up bound passes, /readyz lists it as pending.
    let absent = harness::free_port();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nreadiness_warm_up = \"200ms\"\n[store]\nredis = \"{}\"\nreplicas = [\"redis://127.0.0.1:{absent}\"]\n[heal]\nspool_dir = {:?}\nprobe_misses = 0\nprobe_interval = \"100ms\"\n[auth]\ntokens_file = {:?}\n",
        redis.url(),
        dir.path().join("spool").display().to_string(),
        tokens.display().to_string()
    );
    let (child, log) = spawn_with_config(dir.path(), &config, port, None).await;
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/readyz");
    let body = |token: Option<&'static str>| {
        let mut request = http.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move {
            let answer = request.send().await.expect("send");
            assert_eq!(answer.status(), reqwest::StatusCode::OK);
            answer.text().await.expect("body")
        }
    };
    let pending = format!("127.0.0.1:{absent}");
    assert!(body(Some(ADMIN)).await.contains(&pending));
    for token in [None, Some(READER), Some(WRITER)] {
        let text = body(token).await;
        assert!(!text.contains(&pending), "{token:?}: {text}");
        assert!(!text.contains("127.0.0.1"), "{token:?}: {text}");
    }

    let before = ping_calls(redis.node.port());
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let probes: Vec<_> = (0..20).map(|_| body(None)).collect();
        futures_util::future::join_all(probes).await;
    }
    let elapsed = started.elapsed();
    let pings = ping_calls(redis.node.port()) - before;
    // One per started interval, and one more for an interval begun just before.
    let bound = elapsed.as_millis() as u64 / 100 + 2;
    assert!(
        pings <= bound,
        "{pings} PINGs for 200 probes in {elapsed:?} (at most {bound})"
    );
    stop_and_read_log(child, &log);
}
