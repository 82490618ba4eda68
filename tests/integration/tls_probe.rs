//! `hotsplit probe` against an `https://` listener (`server.tls_cert_file`): the certificate is
//! verified against `--ca-file`, by IP address and by host name; an untrusted certificate, and
//! a draining instance's 503 from `/readyz`, are unhealthy (exit 1) with a clear message.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::{self, Binary};
use crate::tls_pki::pki;

/// Runs `hotsplit probe ARGS…`; returns its exit status code and stdout.
async fn probe(args: Vec<String>) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hotsplit"));
    command.arg("probe").args(args);
    let output = tokio::task::spawn_blocking(move || command.output().expect("run hotsplit probe"))
        .await
        .expect("join hotsplit probe");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// The arguments of a probe of `url` trusting `ca_file`, with a timeout a loaded machine
/// cannot reach (no assertion here is about time).
fn with_ca(url: &str, ca_file: &Path) -> Vec<String> {
    vec![
        "--timeout".to_owned(),
        "20s".to_owned(),
        "--ca-file".to_owned(),
        ca_file.display().to_string(),
        url.to_owned(),
    ]
}

/// Fails if the probe cannot speak TLS (the https URL is unhealthy), skips verification (the
/// unrelated CA or no CA file is healthy), checks the wrong name, or treats the draining
/// instance's 503 as healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_verifies_an_https_listener_and_fails_on_an_untrusted_ca_or_a_503() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let files = &pki().files;
    // A long drain delay keeps /readyz at 503 after SIGTERM for as long as the test needs it.
    let config = format!(
        "tls_cert_file = {:?}\ntls_key_file = {:?}\ndrain_delay = \"60s\"\n",
        files.cert_file.display().to_string(),
        files.key_file.display().to_string()
    );
    let mut instance = Binary::spawn(dir.path(), "https", &config);
    let port = instance
        .base
        .rsplit(':')
        .next()
        .expect("a port in the base URL")
        .to_owned();
    let ready = format!("https://127.0.0.1:{port}/readyz");
    harness::poll(
        "the https listener answers /readyz",
        Duration::from_secs(30),
        || {
            let ready = ready.clone();
            async move {
                hotsplit::probe::probe(&ready, Duration::from_secs(5), Some(&pki().files.ca_file))
                    .await
                    .healthy
            }
        },
    )
    .await;

    let (code, out) = probe(with_ca(&ready, &files.ca_file)).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("healthy: ") && out.contains("200 OK"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    // The certificate's DNS name verifies too.
    let by_name = format!("https://localhost:{port}/readyz");
    let (code, out) = probe(with_ca(&by_name, &files.ca_file)).await;
    assert_eq!(code, Some(0), "{out}");

    // A CA that did not sign the certificate: the handshake fails, and the message says so.
    let (code, out) = probe(with_ca(&ready, &pki().other_ca)).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("unhealthy: ") && out.contains("TLS handshake failed"),
        "{out}"
    );
    assert!(out.contains("certificate"), "{out}");
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    // Without --ca-file the system's roots are trusted, and none of them signed it.
    let (code, out) = probe(vec!["--timeout".into(), "20s".into(), ready.clone()]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("unhealthy: "), "{out}");
    // Plain HTTP to the TLS port is answered 400, which is unhealthy.
    let plain = format!("http://127.0.0.1:{port}/readyz");
    let (code, out) = probe(vec!["--timeout".into(), "20s".into(), plain]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("400"), "{out}");

    // SIGTERM starts the drain: /readyz answers 503 over TLS, and the probe fails on it.
    instance.signal(libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let last = loop {
        let (code, out) = probe(with_ca(&ready, &files.ca_file)).await;
        if code == Some(1) {
            break out;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the probe still passes 30 s after SIGTERM: {out}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        last.starts_with("unhealthy: ") && last.contains("503"),
        "{last}"
    );
    assert!(last.contains("draining"), "the body says why: {last}");
    instance.sigkill();
}
