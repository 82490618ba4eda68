//! Memory that matches its bounds: the RSS of the real binary on the embedded store, per stored
//! key (issue 10 finding 4: every stored value kept its 8 KiB HTTP read buffer alive). The
//! measurement is `#[ignore]`d (it publishes 200,000 keys); the unit-level check that a stored
//! value does not share the request buffer is
//! `publish::tests::a_stored_value_does_not_share_the_request_buffer`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use reqwest::StatusCode;

use crate::harness::Binary;

/// The resident set size of process `pid`, in bytes, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}

/// Publishes keys `m:<from..to>` (zero-padded to 16 bytes) with 64-byte values, 64 at a time.
async fn publish_range(base: &str, from: u64, to: u64) {
    let next = Arc::new(AtomicU64::new(from));
    let workers: Vec<_> = (0..64)
        .map(|_| {
            let next = next.clone();
            let base = base.to_owned();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= to {
                        return;
                    }
                    let answer = http
                        .put(format!("{base}/v1/keys/m:{n:014}?version=1"))
                        .body(vec![b'v'; 64])
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(answer.status(), StatusCode::OK);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// Run with `cargo test --test integration memory:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: publishes 200,000 keys to the real binary (about a minute)"]
async fn memory_rss_per_stored_key_on_the_embedded_store() {
    const KEYS: u64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let service = Binary::start(dir.path(), "memory", "").await;
    let pid = service.child.id();
    // Warm up allocator arenas and connection buffers before the baseline.
    publish_range(&service.base, 0, 1_000).await;
    let before = rss_bytes(pid);
    publish_range(&service.base, 1_000, 1_000 + KEYS).await;
    let after = rss_bytes(pid);
    let per_key = after.saturating_sub(before) as f64 / KEYS as f64;
    println!(
        "embedded store, 1 copy per key, 16-byte keys, 64-byte values: RSS {before} -> {after} bytes, {per_key:.0} bytes per key"
    );
    assert!(
        per_key <= 1024.0,
        "{per_key:.0} bytes of RSS per stored key"
    );
}
