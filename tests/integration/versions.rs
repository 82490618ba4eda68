//! Allocated versions stay unique and usable when the counter falls behind the copies: after a
//! failover that lost increments (the counter set back by hand on the primary), and after the
//! counter expired before the copies it versioned (deleted by hand). Real Redis, through the
//! service's HTTP API.

use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{self, config_with_family, hgetall, Service};

/// Publishes `body` to the allocated-family key `key` (no `?version`): the status and the report.
async fn publish_allocated(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
) -> (StatusCode, Value) {
    let answer = http
        .put(format!("{base}/v1/keys/{key}"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|err| panic!("PUT {key}: {err}"));
    let status = answer.status();
    let report = answer.json().await.expect("a JSON report");
    (status, report)
}

/// The version and body of every copy of `key` (4 copies, the harness's `alloc:` family).
fn copies(port: u16, key: &str) -> Vec<(String, String)> {
    (0..4)
        .map(|copy| {
            let fields = hgetall(port, &format!("{key}#{copy}"));
            (fields["ver"].clone(), fields["val"].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_lost_increments_never_issues_a_version_with_another_body() {
    let server = harness::shared_standalone();
    let port = server.node.port();
    let service = Service::start(config_with_family(Some(&server.url()), "v:", 2)).await;
    let http = reqwest::Client::new();
    let key = "alloc:lost-increments";
    for n in 1..=3 {
        let (status, report) =
            publish_allocated(&http, &service.base, key, &format!("body {n}")).await;
        assert_eq!(
            (status, report["version"].as_u64()),
            (StatusCode::OK, Some(n))
        );
    }
    // A failover lost the last increment: the counter is back at 2 (its TTL kept), so it would
    // issue 3 again, a version whose body is "body 3" on every copy.
    let counter = format!("{key}#v");
    devcluster_cli(port, &["SET", &counter, "2", "KEEPTTL"]);
    let (status, report) = publish_allocated(&http, &service.base, key, "body 4").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        report["version"].as_u64(),
        Some(4),
        "the reissued version 3 conflicts; the publish allocates above it: {report}"
    );
    // One body per version: version 3 was never written with "body 4", and every copy holds the
    // reported version with the published body.
    assert_eq!(
        copies(port, key),
        vec![("4".to_owned(), "body 4".to_owned()); 4]
    );
    // The counter caught up: the next publish gets 5.
    let (_, report) = publish_allocated(&http, &service.base, key, "body 5").await;
    assert_eq!(report["version"].as_u64(), Some(5), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_expired_before_the_copies_does_not_refuse_later_publishes() {
    let server = harness::shared_standalone();
    let port = server.node.port();
    let service = Service::start(config_with_family(Some(&server.url()), "v:", 2)).await;
    let http = reqwest::Client::new();
    let key = "alloc:expired-counter";
    for n in 1..=3 {
        let (status, _) = publish_allocated(&http, &service.base, key, &format!("body {n}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    // The counter expires before the copies (another instance's shorter TTL): it restarts at 1,
    // below the version 3 every copy holds.
    let counter = format!("{key}#v");
    devcluster_cli(port, &["DEL", &counter]);
    let (status, report) = publish_allocated(&http, &service.base, key, "after expiry").await;
    assert_eq!(
        (status, report["version"].as_u64()),
        (StatusCode::OK, Some(4)),
        "a publish after the counter expired lands above the copies' version: {report}"
    );
    assert_eq!(
        copies(port, key),
        vec![("4".to_owned(), "after expiry".to_owned()); 4]
    );
}

/// `redis-cli` against the shared standalone server; panics naming the command on failure.
fn devcluster_cli(port: u16, args: &[&str]) {
    hotsplit_devcluster::cli(port, args)
        .unwrap_or_else(|err| panic!("{args:?} on 127.0.0.1:{port}: {err}"));
}
