//! The `hotsplit` binary itself: startup on the embedded store, config errors, SIGTERM, the
//! runtime's threads (`server.worker_threads`), and `hotsplit probe` (the container's health
//! check) against a live and a closed port.

use std::process::{Command, Stdio};

use crate::harness;

/// Starts `hotsplit serve` on the embedded store at `port` (stdout piped for its log) and waits
/// until `/readyz` answers 2xx.
async fn spawn_serve(port: u16) -> std::process::Child {
    let mut command = harness::serve_command();
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("HOTSPLIT_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    harness::spawn_serve(command, port).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_the_embedded_store_and_stops_on_sigterm() {
    let port = harness::free_port();
    let child = spawn_serve(port).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    harness::publish_succeeds(&http, &base, "k1", 1, "v").await;
    let get = harness::get(&http, &format!("{base}/v1/keys/k1?client=c"), &[]).await;
    assert_eq!(get.headers()["hotsplit-served-by"], "embedded");

    let status = harness::sigterm_and_wait(child).await;
    assert!(status.0.success(), "exit status {:?}", status.0);
    assert!(
        status.1.contains("embedded in-memory store"),
        "startup says it is embedded: {}",
        status.1
    );
    assert!(status.1.contains("SIGTERM received"), "{}", status.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_sets_how_many_threads_run_the_service() {
    let dir = tempfile::tempdir().expect("temp dir");
    // One per CPU by default; 1 and 3 whatever this machine has.
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    for (name, setting, expected) in [
        ("default", "", cpus),
        ("one", "worker_threads = 1\n", 1),
        ("three", "worker_threads = 3\n", 3),
    ] {
        let config = format!(
            "{setting}[heal]\nspool_dir = {:?}\n",
            dir.path().join(name).display().to_string()
        );
        let binary = harness::Binary::start(dir.path(), name, &config).await;
        let http = reqwest::Client::new();
        harness::publish_succeeds(&http, &binary.base, "k1", 1, "v").await;
        // The startup line names the runtime's workers, counted by the runtime itself.
        let log = binary.log_text();
        let serving = log
            .lines()
            .find(|line| line.contains("hotsplit is serving"))
            .unwrap_or_else(|| panic!("{name}: no startup line in {log}"));
        assert!(
            serving.contains(&format!("worker_threads={expected}")),
            "{name}: {serving}"
        );
    }
}

#[test]
fn an_invalid_config_stops_startup_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[family]]\nprefix = \"post:\"\ncopies = 0\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .expect("run hotsplit");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("family[0].copies"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--redis", "http://nope"])
        .output()
        .expect("run hotsplit");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("store.redis"));

    // Read classes: a budget that does not parse, and a presence decision on a split family.
    for (text, field) in [
        (
            "[classes.advisory]\nroute = \"replica\"\nreason = \"r\"\nstaleness_budget = \"soonish\"\n",
            "staleness_budget",
        ),
        (
            "[[family]]\nprefix = \"post:\"\ncopies = 8\ndefault_class = \"decides-on-presence\"\n",
            "family[0].default_class",
        ),
        ("[route]\nlag_window = \"a while\"\n", "lag_window"),
    ] {
        std::fs::write(&path, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .expect("run hotsplit");
        assert_eq!(output.status.code(), Some(2), "{text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{text}: {stderr}");
    }
}

/// Runs `hotsplit probe ARGS…` and returns its exit status code and stdout.
async fn probe(args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hotsplit"));
    command.arg("probe").args(args);
    let output = tokio::task::spawn_blocking(move || command.output().expect("run hotsplit probe"))
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_on_a_ready_instance_and_1_on_a_refusal_a_closed_port_or_no_answer() {
    let port = harness::free_port();
    let child = spawn_serve(port).await;
    let ready = format!("http://127.0.0.1:{port}/readyz");
    let (code, out) = probe(&[&ready]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("healthy: ") && out.contains("200 OK"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "one line: {out}");

    // A non-2xx answer is unhealthy, and the message repeats the answer.
    let missing = format!("http://127.0.0.1:{port}/nowhere");
    let (code, out) = probe(&[&missing]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("unhealthy: ") && out.contains("404"),
        "{out}"
    );

    harness::sigterm_and_wait(child).await;

    // The instance is gone: its port is closed.
    let (code, out) = probe(&[&ready]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("unhealthy: "), "{out}");
    assert!(out.to_lowercase().contains("refused"), "{out}");
    assert_eq!(out.lines().count(), 1, "one line: {out}");

    // A listener that accepts connections (the kernel's backlog) but never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}/readyz", silent.local_addr().unwrap());
    let (code, out) = probe(&["--timeout", "300ms", &silent_url]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no answer within 300ms"), "{out}");
    drop(silent);
}

/// Every Redis URL form that carries a secret, each with the password `hunter2`.
const SECRET_URLS: [&str; 5] = [
    "rediss://user:hunter2@127.0.0.1:6380",
    "redis://user:hunter2@127.0.0.1:1",
    "redis://127.0.0.1:1?password=hunter2",
    "http://user:hunter2@127.0.0.1:1",
    "redis-cluster://:hunter2@127.0.0.1:1,127.0.0.1:2",
];

#[test]
fn help_never_shows_an_environment_secret() {
    for command in ["serve", "audit"] {
        for url in SECRET_URLS {
            let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
                .args([command, "--help"])
                .env("HOTSPLIT_REDIS", url)
                .env("HOTSPLIT_CONFIG", "/etc/hunter2.toml")
                .env("HOTSPLIT_LISTEN", "127.0.0.1:1")
                .output()
                .expect("run hotsplit");
            assert!(output.status.success(), "{command} --help");
            let text = String::from_utf8_lossy(&output.stdout);
            assert!(text.contains("HOTSPLIT_REDIS"), "{command}: {text}");
            assert!(!text.contains("hunter2"), "{command} with {url}: {text}");
        }
    }
}

#[test]
fn startup_errors_never_show_a_redis_password() {
    for url in SECRET_URLS {
        // The flag, the environment, and `audit`'s flag all print only the redacted URL.
        let runs = [
            (vec!["serve", "--redis", url], None),
            (vec!["serve"], Some(url)),
            (vec!["audit", "--redis", url, "--copies", "2"], None),
        ];
        for (args, env) in runs {
            let mut command = Command::new(env!("CARGO_BIN_EXE_hotsplit"));
            command
                .args(&args)
                .env_remove("HOTSPLIT_REDIS")
                .env_remove("HOTSPLIT_CONFIG")
                .env("HOTSPLIT_LOG", "debug");
            if let Some(url) = env {
                command.env("HOTSPLIT_REDIS", url);
            }
            let output = command.output().expect("run hotsplit");
            assert!(!output.status.success(), "{args:?} {env:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(!stderr.is_empty(), "{args:?} {env:?}: says why it stops");
            assert!(
                !stderr.contains("hunter2") && !stdout.contains("hunter2"),
                "{args:?} {env:?}: {stderr}{stdout}"
            );
        }
    }
}

#[test]
fn a_refused_connection_is_told_in_words_not_rust_debug() {
    let url = format!("redis://127.0.0.1:{}", harness::free_port());
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--redis", &url, "--listen", "127.0.0.1:0"])
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert!(
        !stderr.contains("Os {") && !stderr.contains("kind:"),
        "{stderr}"
    );
}
