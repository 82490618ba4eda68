//! Issue 30's hardening findings outside the Redis-protocol door, on the real binary: a node
//! that answers again is readable as soon as it is writable.

use std::time::Duration;

use hotsplit_devcluster as devcluster;
use reqwest::StatusCode;

use crate::harness::{self, get, poll, publish_expecting, Binary, Edit};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_answers_again_is_readable_as_soon_as_it_is_writable() {
    let server = tokio::task::spawn_blocking(|| devcluster::Standalone::start().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().expect("temp dir");
    // A slow probe: a node that answers again stays recovering (writable, its queue flushed)
    // for up to a probe interval before the prober calls it healthy. One missed probe fails
    // it; the command timeout is long, so only the probe does.
    let config = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"30s\"\n[heal]\nspool_dir = {:?}\nprobe_interval = \"3s\"\nprobe_misses = 1\n[[family]]\nprefix = \"back:\"\ncopies = 1\nttl = \"10m\"\n",
        server.url(),
        dir.path().join("spool").display().to_string()
    );
    let binary = Binary::start(dir.path(), "back", &config).await;
    let base = binary.base.clone();
    let http = reqwest::Client::new();
    publish_expecting(&http, &base, Edit::new("back:1", 1, "one"), StatusCode::OK).await;

    server.node.pause().expect("SIGSTOP");
    poll(
        "the stopped primary misses its probe and is marked failing",
        Duration::from_secs(20),
        || async {
            let url = format!("{base}/readyz");
            let answer = tokio::time::timeout(Duration::from_secs(2), get(&http, &url, &[])).await;
            answer.is_ok_and(|answer| answer.status() == StatusCode::SERVICE_UNAVAILABLE)
        },
    )
    .await;
    publish_expecting(
        &http,
        &base,
        Edit::new("back:1", 2, "two"),
        StatusCode::ACCEPTED,
    )
    .await;

    server.node.resume().expect("SIGCONT");
    poll(
        "the primary answers again: ready",
        Duration::from_secs(20),
        || async { get(&http, &format!("{base}/readyz"), &[]).await.status() == StatusCode::OK },
    )
    .await;
    // The publish lands on it, and the read right after is answered.
    publish_expecting(
        &http,
        &base,
        Edit::new("back:1", 3, "three"),
        StatusCode::OK,
    )
    .await;
    let read = get(&http, &format!("{base}/v1/keys/back:1?client=t"), &[]).await;
    let status = read.status();
    let body = read.text().await.unwrap_or_default();
    assert_eq!(
        status,
        StatusCode::OK,
        "a read right after a publish that landed: {body}"
    );
    assert_eq!(body, "three");
    let read = get(&http, &format!("{base}/v1/keys/back:1?client=u"), &[]).await;
    assert_eq!(harness::served_version(&read), 3);
}

/// Runs `redis-cli -p PORT ARGS…`; returns its output.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_read_the_split_index_refuses_publishes_until_it_can() {
    let server = tokio::task::spawn_blocking(|| devcluster::Standalone::start().unwrap())
        .await
        .unwrap();
    let port = server.node.port();
    // The family's split records are not a hash: every read of them fails (WRONGTYPE), from
    // startup on, while the copies work.
    redis_cli(port, &["SET", "#hotsplit#splits#idx:", "not-a-hash"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = format!(
        "[store]\nredis = \"{}\"\n[heal]\nspool_dir = {:?}\nlayout_interval = \"1s\"\n[[family]]\nprefix = \"idx:\"\ncopies = 2\nttl = \"10m\"\n[family.split]\nmax_copies = 8\n",
        server.url(),
        dir.path().join("spool").display().to_string()
    );
    let binary = Binary::start(dir.path(), "index", &config).await;
    let base = binary.base.clone();
    let http = reqwest::Client::new();
    let refused = publish_expecting(
        &http,
        &base,
        Edit::new("idx:1", 1, "one"),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let problem = refused.text().await.unwrap_or_default();
    assert!(problem.contains("\"code\":\"unavailable\""), "{problem}");
    assert!(
        redis_cli(port, &["EXISTS", "idx:1#0"]).trim() == "0",
        "a refused publish wrote a copy"
    );
    // Once the records can be read, publishes go.
    redis_cli(port, &["DEL", "#hotsplit#splits#idx:"]);
    poll(
        "publishes go once the index is read",
        Duration::from_secs(20),
        || async {
            let answer = http
                .put(format!("{base}/v1/keys/idx:1?version=1"))
                .body("one")
                .send()
                .await;
            answer.is_ok_and(|answer| answer.status() == StatusCode::OK)
        },
    )
    .await;
}

/// Unix milliseconds now.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_gate_matches_instance_names_not_counts() {
    let server = tokio::task::spawn_blocking(|| devcluster::Standalone::start().unwrap())
        .await
        .unwrap();
    let port = server.node.port();
    let until = (now_ms() + 600_000).to_string();
    // The sets lapse at different moments: "older" (a release without per-key layouts) is live
    // in the family but not in its split set; "gone" is still in the split set, its live entry
    // already lapsed. One each: counts match, names do not.
    redis_cli(port, &["ZADD", "#hotsplit#live#g7:", &until, "2:older"]);
    redis_cli(
        port,
        &["ZADD", "#hotsplit#live##split#g7:", &until, "1:gone"],
    );
    let stamp = now_ms().to_string();
    let record = format!("4:w:{stamp}:{stamp}");
    redis_cli(port, &["HSET", "#hotsplit#splits#g7:", "g7:hot", &record]);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"100ms\"\n[heal]\nspool_dir = {:?}\nlayout_interval = \"500ms\"\n[[family]]\nprefix = \"g7:\"\ncopies = 2\nttl = \"10m\"\n[family.split]\nmax_copies = 4\n",
        server.url(),
        dir.path().join("spool").display().to_string()
    );
    let _binary = Binary::start(dir.path(), "gate", &config).await;
    let phase = || {
        redis_cli(port, &["HGET", "#hotsplit#splits#g7:", "g7:hot"])
            .trim()
            .split(':')
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    // Several settle times (L + 2 x the command timeout = 0.7 s): an instance that took "gone"
    // for "older" admits readers of the split copies by then.
    let watch_until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < watch_until {
        assert_eq!(
            phase(),
            "w",
            "a split admitted readers while an instance without per-key layouts is live"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once the older release is gone, the same split admits readers.
    redis_cli(port, &["ZREM", "#hotsplit#live#g7:", "2:older"]);
    poll(
        "the split admits readers",
        Duration::from_secs(20),
        || async { phase() == "r" },
    )
    .await;
}
