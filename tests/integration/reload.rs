//! SIGHUP reload and `hotsplit config check` on the real binary (embedded store): a budget change
//! reaches `/v1/classes`, an invalid file changes nothing and is logged naming the field, a
//! change that needs a restart is reported and not applied, tokens and the log level are
//! re-read; `config check` prints the effective config with secrets redacted.

use std::process::Command;
use std::time::Duration;

use crate::auth::{spawn_with_config, stop_and_read_log, tokens_file_text, ADMIN, READER, WRITER};
use crate::harness;

/// The config of these tests: the `advisory` class's budget and the log filter vary.
fn config(port: u16, budget: &str, log_level: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nlog_level = \"{log_level}\"\n[classes.advisory]\nroute = \"replica\"\nreason = \"shown to people\"\nstaleness_budget = \"{budget}\"\n[[family]]\nprefix = \"p:\"\ncopies = 2\ndefault_class = \"advisory\"\n{extra}"
    )
}

fn hangup(child: &std::process::Child) {
    // SAFETY: sending SIGHUP to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
}

/// The advisory class's budget as `/v1/classes` lists it.
async fn advisory_budget_ms(
    http: &reqwest::Client,
    base: &str,
    token: Option<&str>,
) -> Option<u64> {
    let mut request = http.get(format!("{base}/v1/classes"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let classes: serde_json::Value = request.send().await.ok()?.json().await.ok()?;
    classes
        .as_array()?
        .iter()
        .find(|class| class["name"] == "advisory")?["staleness_budget_ms"]
        .as_u64()
}

/// Polls the log file until it holds `needle` (the log is written as the service runs).
async fn wait_for_log(log: &std::path::Path, needle: &str) {
    harness::poll(
        &format!("the log says {needle:?}"),
        Duration::from_secs(10),
        || async { std::fs::read_to_string(log).is_ok_and(|text| text.contains(needle)) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_budget_refuses_an_invalid_file_and_reports_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let path = dir.path().join("hotsplit.toml");
    let (child, log) =
        spawn_with_config(dir.path(), &config(port, "250ms", "info", ""), port, None).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(advisory_budget_ms(&http, &base, None).await, Some(250));

    // A new budget and a new family default take effect.
    std::fs::write(&path, config(port, "900ms", "info", "")).unwrap();
    hangup(&child);
    harness::poll(
        "the new budget is listed",
        Duration::from_secs(10),
        || async { advisory_budget_ms(&http, &base, None).await == Some(900) },
    )
    .await;
    let metrics = harness::metrics_text(&http, &base).await;
    assert!(
        metrics.contains("hotsplit_class_staleness_budget_seconds{class=\"advisory\"} 0.9"),
        "{metrics}"
    );

    // An invalid file is refused whole: the budget in it is not applied either.
    std::fs::write(
        &path,
        config(
            port,
            "50ms",
            "info",
            "[[family]]\nprefix = \"q:\"\ncopies = 0\n",
        ),
    )
    .unwrap();
    hangup(&child);
    wait_for_log(&log, "config reload refused").await;
    assert_eq!(advisory_budget_ms(&http, &base, None).await, Some(900));

    // A change that needs a restart is named and left out; the rest applies.
    let other_port = harness::free_port();
    std::fs::write(&path, config(other_port, "700ms", "info", "")).unwrap();
    hangup(&child);
    harness::poll(
        "the third budget is listed",
        Duration::from_secs(10),
        || async { advisory_budget_ms(&http, &base, None).await == Some(700) },
    )
    .await;
    let metrics = harness::metrics_text(&http, &base).await;
    assert!(
        metrics.contains("hotsplit_config_reloads_total{result=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hotsplit_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );

    let log = stop_and_read_log(child, &log);
    let refused = log
        .lines()
        .find(|line| line.contains("config reload refused"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(refused.contains("family[1].copies"), "{refused}");
    let restart = log
        .lines()
        .find(|line| line.contains("needs a restart"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        restart.contains("server.listen") && restart.contains("WARN"),
        "{restart}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_tokens_file_and_the_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let auth = format!("[auth]\ntokens_file = {:?}\n", tokens.display().to_string());
    let path = dir.path().join("hotsplit.toml");
    // At `warn` from the file (no HOTSPLIT_LOG, which would win over it).
    let (child, log) = spawn_with_config(
        dir.path(),
        &config(port, "250ms", "warn", &auth),
        port,
        None,
    )
    .await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(
        advisory_budget_ms(&http, &base, Some(ADMIN)).await,
        Some(250)
    );
    assert_eq!(advisory_budget_ms(&http, &base, Some(READER)).await, None);

    // The reader becomes an admin, and the old admin token stops working.
    let new_tokens = format!("plain:{READER} admin # promoted\n");
    std::fs::write(&tokens, new_tokens).unwrap();
    std::fs::write(&path, config(port, "250ms", "info", &auth)).unwrap();
    hangup(&child);
    harness::poll(
        "the new token table is in force",
        Duration::from_secs(10),
        || async { advisory_budget_ms(&http, &base, Some(READER)).await == Some(250) },
    )
    .await;
    let old = http
        .get(format!("{base}/v1/classes"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("send");
    assert_eq!(old.status(), reqwest::StatusCode::UNAUTHORIZED);
    // The reload's own info line shows only because the reload raised the level from warn.
    wait_for_log(&log, "config reloaded").await;

    // A tokens file that does not parse refuses the reload: the promoted token still works.
    std::fs::write(&tokens, "plain:short admin\n").unwrap();
    hangup(&child);
    wait_for_log(&log, "config reload refused").await;
    assert_eq!(
        advisory_budget_ms(&http, &base, Some(READER)).await,
        Some(250)
    );
    let log = stop_and_read_log(child, &log);
    assert!(log.contains("auth.tokens_file"), "{log}");
    assert!(
        !log.contains(READER) && !log.contains(ADMIN),
        "a token in the log: {log}"
    );
}

/// Runs `hotsplit config check` with `args`, and `password` as `HOTSPLIT_REDIS_PASSWORD`.
fn config_check(args: &[&str], password: Option<&str>) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hotsplit"));
    command.args(["config", "check"]).args(args);
    match password {
        Some(password) => command.env("HOTSPLIT_REDIS_PASSWORD", password),
        None => command.env_remove("HOTSPLIT_REDIS_PASSWORD"),
    };
    let output = command
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit config check");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn config_check_prints_the_effective_config_redacted_and_exits_2_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let path = dir.path().join("hotsplit.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nredis = \"redis://app:url-secret-password@10.0.0.1:6379\"\n[[family]]\nprefix = \"p:\"\ncopies = 8\n[auth]\ntokens_file = {:?}\n",
            tokens.display().to_string()
        ),
    )
    .unwrap();
    let path_text = path.display().to_string();
    let (code, stdout, stderr) = config_check(
        &["--config", &path_text, "--listen", "127.0.0.1:7999"],
        None,
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    for secret in ["url-secret-password", READER, ADMIN] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} shown: {stdout}{stderr}"
        );
    }
    // The effective config: the flag over the file, the defaults filled in, the tokens by name.
    assert!(stdout.contains("listen = \"127.0.0.1:7999\""), "{stdout}");
    assert!(stdout.contains("command_timeout = \"500ms\""), "{stdout}");
    assert!(
        stdout.contains("reader (read)") && stdout.contains("all (read,write,admin)"),
        "{stdout}"
    );
    // What it prints is itself a valid config.
    let printed = hotsplit::config::Config::from_toml(&stdout).expect("the output parses");
    printed.validate().expect("the output is valid");
    assert_eq!(printed.families.len(), 1);

    // A password from the environment is named, never shown; --redis overrides the file.
    let (code, stdout, stderr) = config_check(
        &[
            "--config",
            &path_text,
            "--redis",
            "redis://app@10.0.0.2:6379",
        ],
        Some("env-secret-password"),
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("env-secret-password") && !stderr.contains("env-secret-password"));
    assert!(stdout.contains("HOTSPLIT_REDIS_PASSWORD"), "{stdout}");
    assert!(
        stdout.contains("redis = \"redis://app@10.0.0.2:6379\""),
        "{stdout}"
    );

    std::fs::write(&path, "[[family]]\nprefix = \"p:\"\ncopies = 0\n").unwrap();
    let (code, _, stderr) = config_check(&["--config", &path_text], None);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("family[0].copies"), "{stderr}");
    let (code, _, stderr) = config_check(&["--config", "/nonexistent/hotsplit.toml"], None);
    assert_eq!(code, Some(2), "{stderr}");
}

/// The `Hotsplit-Route` class of a read of `key` with `token` (a miss answers one too).
async fn read_class(http: &reqwest::Client, base: &str, key: &str, token: &str) -> String {
    let answer = http
        .get(format!("{base}/v1/keys/{key}?client=reload-test"))
        .bearer_auth(token)
        .send()
        .await
        .expect("send");
    let route = answer
        .headers()
        .get("hotsplit-route")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let status = answer.status();
    let body = answer.text().await.unwrap_or_default();
    route
        .split(';')
        .find_map(|part| part.strip_prefix("class="))
        .unwrap_or_else(|| panic!("no class in {route:?} ({status}: {body})"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_checked_against_the_restart_only_fields_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, tokens_file_text()).unwrap();
    let path = dir.path().join("hotsplit.toml");
    // A public listener, tokens, TLS in front: what startup accepts.
    let public = |listen: &str, auth: bool, family: &str| {
        let auth = if auth {
            format!("[auth]\ntokens_file = {:?}\n", tokens.display().to_string())
        } else {
            String::new()
        };
        format!(
            "[server]\nlisten = \"{listen}:{port}\"\ntls_terminated_upstream = true\n{auth}{family}"
        )
    };
    let split = "[[family]]\nprefix = \"p:\"\ncopies = 2\ndefault_class = \"advisory\"\n";
    let (child, log) =
        spawn_with_config(dir.path(), &public("0.0.0.0", true, split), port, None).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let unauthenticated = |path: &'static str| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.get(format!("{base}{path}"))
                .send()
                .await
                .expect("send")
                .status()
        }
    };
    assert_eq!(
        unauthenticated("/v1/keys/p:a").await,
        reqwest::StatusCode::UNAUTHORIZED
    );
    let published = http
        .put(format!("{base}/v1/keys/p:a?version=1"))
        .bearer_auth(WRITER)
        .body("v1")
        .send()
        .await
        .expect("send");
    assert_eq!(published.status(), reqwest::StatusCode::OK);

    // Loopback and no [auth] is a valid file on its own, but the listener in force stays
    // 0.0.0.0 until a restart: refused whole, tokens still required.
    std::fs::write(&path, public("127.0.0.1", false, split)).unwrap();
    hangup(&child);
    wait_for_log(&log, "config reload refused").await;
    for path in ["/v1/keys/p:a", "/metrics", "/v1/classes"] {
        assert_eq!(
            unauthenticated(path).await,
            reqwest::StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    assert_eq!(read_class(&http, &base, "p:a", READER).await, "advisory");

    // A one-copy family's `decides-on-presence` default class is valid in the file, but the
    // family in force has two copies (copies need a restart): refused.
    let one_copy =
        "[[family]]\nprefix = \"p:\"\ncopies = 1\ndefault_class = \"decides-on-presence\"\n";
    std::fs::write(&path, public("0.0.0.0", true, one_copy)).unwrap();
    hangup(&child);
    harness::poll(
        "the second reload is refused",
        Duration::from_secs(10),
        || async {
            std::fs::read_to_string(&log)
                .is_ok_and(|text| text.matches("config reload refused").count() == 2)
        },
    )
    .await;
    assert_eq!(read_class(&http, &base, "p:a", READER).await, "advisory");
    let metrics = http
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("read /metrics");
    assert!(
        metrics.contains("hotsplit_config_reloads_total{result=\"refused\"} 2"),
        "{metrics}"
    );

    let log = stop_and_read_log(child, &log);
    let refused: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("config reload refused"))
        .collect();
    assert_eq!(refused.len(), 2, "{log}");
    assert!(
        refused[0].contains("server.allow_unauthenticated")
            && refused[0].contains("0.0.0.0")
            && refused[0].contains("server.listen"),
        "{}",
        refused[0]
    );
    assert!(
        refused[1].contains("family[0].default_class") && refused[1].contains("family[0].copies"),
        "{}",
        refused[1]
    );
}
