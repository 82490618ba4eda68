//! End-to-end: the service on a real socket over real Redis, including injected faults.

use std::collections::BTreeSet;

use hotsplit::store::now_unix_ms;
use hotsplit_devcluster::{self as devcluster, Standalone};
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{
    self, affinity, config_with_family, copy_on_owner, get, hgetall, owner_port, problem,
    publish_expecting, publish_succeeds, Edit, Service,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_on_a_cluster_writes_every_copy_with_an_absolute_expiry() {
    let cluster = harness::shared_cluster();
    let service = Service::start(config_with_family(Some(&cluster.url()), "e2e:", 16)).await;
    let http = reqwest::Client::new();
    let before = now_unix_ms();
    let answer = publish_expecting(
        &http,
        &service.base,
        Edit::new("e2e:spread", 42, "hello"),
        StatusCode::OK,
    )
    .await;
    let report: Value = answer.json().await.unwrap();
    assert_eq!(report["applied"].as_u64(), Some(16));

    let mut masters = BTreeSet::new();
    for line in report["outcomes"].as_array().unwrap() {
        let copy_key = line["copy_key"].as_str().unwrap();
        let port = owner_port(cluster, copy_key);
        assert_eq!(
            line["node"],
            format!("127.0.0.1:{port}"),
            "{copy_key} is reported on its owner"
        );
        masters.insert(port);
        // Read directly from Redis on the owning master.
        let fields = hgetall(port, copy_key);
        assert_eq!(
            fields.get("ver").map(String::as_str),
            Some("42"),
            "{copy_key}: {fields:?}"
        );
        assert_eq!(fields.get("val").map(String::as_str), Some("hello"));
        assert_eq!(fields.get("tomb").map(String::as_str), Some("0"));
        let expire_at: u64 = fields["exp"].parse().unwrap();
        // Each copy's lifetime is jittered by -10%..0 of the TTL (heal.expiry_jitter_*).
        assert!(
            expire_at >= before + 540_000 && expire_at <= now_unix_ms() + 600_000,
            "{expire_at}"
        );
        let pexpiretime: u64 = devcluster::cli(port, &["PEXPIRETIME", copy_key])
            .unwrap()
            .parse()
            .unwrap();
        // The key outlives the copy's expiry by the version retention: the longest family
        // TTL (1 h, the default family's), so older versions stay refused after it expired.
        assert_eq!(
            pexpiretime,
            expire_at + 3_600_000,
            "{copy_key}: Redis expiry is the absolute publish-time expiry plus the retention"
        );
    }
    assert_eq!(masters.len(), 3, "16 copies spread over all three masters");

    // Re-publishing the same version is current everywhere and does not extend the expiry.
    let first_expiry = copy_on_owner(cluster, "e2e:spread#0")["exp"].clone();
    let again: Value = publish_expecting(
        &http,
        &service.base,
        Edit::new("e2e:spread", 42, "hello"),
        StatusCode::OK,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(again["current"].as_u64(), Some(16));
    assert_eq!(copy_on_owner(cluster, "e2e:spread#0")["exp"], first_expiry);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floors_skip_a_copy_made_stale_directly_in_redis() {
    let server = harness::shared_standalone();
    let port = server.node.port();
    let service = Service::start(config_with_family(Some(&server.url()), "floor:", 8)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_succeeds(&http, base, "floor:1", 5, "new").await;

    // Roll alice's affine copy back to version 4 behind hotsplit's back.
    let affinity = affinity(&http, base, "floor:1", "alice").await;
    let copy_key = affinity["copy_key"].as_str().unwrap().to_owned();
    devcluster::cli(port, &["HSET", &copy_key, "ver", "4", "val", "old"]).unwrap();

    // A read of the copy by name carries no floor: it serves what the copy has (best effort,
    // documented). (Alice herself is not served 4 on this instance, which accepted 5: a copy
    // set back below that is never served to a reader naming a client, `ops::rollback`.)
    let plain = get(
        &http,
        &format!("{base}/v1/keys/floor:1?copy={}", affinity["copy"]),
        &[],
    )
    .await;
    assert_eq!(plain.headers()["hotsplit-version"], "4");

    // min_version never returns the older body; the sibling's newer version serves (and read
    // repair then brings the affine copy forward, so later reads may be served by it).
    for round in 0..20 {
        let floored = get(
            &http,
            &format!("{base}/v1/keys/floor:1?client=alice&min_version=5"),
            &[],
        )
        .await;
        assert_eq!(floored.status(), StatusCode::OK);
        assert_eq!(floored.headers()["hotsplit-version"], "5");
        if round == 0 {
            assert_ne!(
                floored.headers()["hotsplit-copy"].to_str().unwrap(),
                affinity["copy"].to_string()
            );
        }
        assert_eq!(floored.text().await.unwrap(), "new");

        let cached = get(
            &http,
            &format!("{base}/v1/keys/floor:1?client=alice"),
            &[("if-none-match", "\"5\"")],
        )
        .await;
        assert_eq!(cached.status(), StatusCode::NOT_MODIFIED);
        assert!(cached.bytes().await.unwrap().is_empty());
    }

    // Roll the copy back again so the next check meets a stale affine copy.
    devcluster::cli(port, &["HSET", &copy_key, "ver", "4", "val", "old"]).unwrap();
    // A floor no copy reached: 503 with Retry-After, never an older body.
    let ahead = get(
        &http,
        &format!("{base}/v1/keys/floor:1?client=alice"),
        &[("hotsplit-min-version", "6")],
    )
    .await;
    assert!(ahead.headers().contains_key("retry-after"));
    problem(
        ahead,
        StatusCode::SERVICE_UNAVAILABLE,
        "below_version_floor",
        "a floor no copy reached",
    )
    .await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_answers_unavailable() {
    let server = tokio::task::spawn_blocking(|| Standalone::start().unwrap())
        .await
        .unwrap();
    let service = Service::start(config_with_family(Some(&server.url()), "dead:", 4)).await;
    let http = reqwest::Client::new();
    publish_succeeds(&http, &service.base, "dead:1", 1, "x").await;
    server.node.kill().unwrap();

    let read = get(
        &http,
        &format!("{}/v1/keys/dead:1?client=c", service.base),
        &[],
    )
    .await;
    assert!(read.headers().contains_key("retry-after"));
    let problem = problem(
        read,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "a read of a dead store",
    )
    .await;
    assert!(
        !problem["detail"].as_str().unwrap().contains("127.0.0.1"),
        "no internals in the answer: {problem}"
    );

    let ready = get(&http, &format!("{}/readyz", service.base), &[]).await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    // A publish to a dead store is durably queued for retry: 202, every copy `queued`.
    let write = publish_expecting(
        &http,
        &service.base,
        Edit::new("dead:1", 2, "y"),
        StatusCode::ACCEPTED,
    )
    .await;
    let report: Value = write.json().await.unwrap();
    assert_eq!(report["queued"].as_u64(), Some(4), "{report}");
    // An allocated family cannot even get a version: 503.
    let write = http
        .put(format!("{}/v1/keys/alloc:1", service.base))
        .body("y")
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), StatusCode::SERVICE_UNAVAILABLE);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_body_limit_gets_413_without_100() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let service = Service::start(config_with_family(None, "big:", 2)).await;
    let address = service.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    // 100 MiB declared, nothing sent: a server that answers `100 Continue` waits for a body
    // this client never sends.
    let head = "PUT /v1/keys/big:1?version=1 HTTP/1.1\r\nHost: hotsplit\r\nContent-Length: 104857600\r\nExpect: 100-continue\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|window| window == b"\r\n\r\n") {
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buffer))
                .await
                .expect("the server answers without the body")
                .unwrap();
        assert!(
            read > 0,
            "closed early: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 413"), "{text}");
    assert!(!text.contains("100 continue"), "{text}");
    assert!(
        text.contains("content-type: application/problem+json"),
        "{text}"
    );
}
