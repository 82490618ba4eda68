//! Automatic split and merge (`[[family]] split = { … }`) on a real Redis: a key read above the
//! threshold gets copies of its own, writers first and readers after the settle time and the
//! fill; its reads spread over them; once it cools readers leave, then writers, then its extra
//! copies are deleted; it splits again when hot again within the TTL. Two instances that learn
//! of each move at different moments never serve a copy that missed an edit, and a publish
//! racing a split or a merge loses nothing; an instance restarted in the middle of a split
//! finishes it. The scrub repairs a split key's copies and `audit` counts them as copies.

use std::collections::BTreeSet;
use std::time::Duration;

use hotsplit_devcluster as devcluster;
use serde_json::Value;

use crate::harness::{
    self, config_from_toml, get, get_json, poll, publish_succeeds, served_version, Service,
};

/// The service: family `<prefix>` (1 copy, primary reads, no near cache) splitting hot keys into
/// 8 copies at 50 reads/s, merging 1 s after the last instance saw it hot; every read sampled in
/// 200 ms windows; layouts refreshed every `layout_interval`.
fn config(url: &str, prefix: &str, mode: &str, layout_interval: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[heal]\nlayout_interval = \"{layout_interval}\"\n[[family]]\nprefix = \"{prefix}\"\ncopies = 1\nttl = \"10m\"\nsplit = {{ mode = \"{mode}\", max_copies = 8, threshold = 50.0, cool_down = \"1s\", max_split_keys = 4, max_splits_per_minute = 10 }}\n[hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\ncool_down = \"400ms\"\n",
        timeout = harness::command_timeout_toml()
    ))
}

/// The split record of `key` in family `family`, as stored (`None`: unsplit).
fn record(server: &devcluster::Standalone, family: &str, key: &str) -> Option<String> {
    let text = server
        .node
        .cli(&["HGET", &format!("#hotsplit#splits#{family}"), key])
        .expect("HGET the split record");
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// Whether `copy_key` exists.
fn exists(server: &devcluster::Standalone, copy_key: &str) -> bool {
    server
        .node
        .cli(&["EXISTS", copy_key])
        .expect("EXISTS")
        .trim()
        == "1"
}

/// Reads `key` once as each of `clients` clients through `base`; returns the copies that served
/// and asserts every read served `version`.
async fn read_all(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    clients: usize,
    version: u64,
) -> BTreeSet<String> {
    let mut copies = BTreeSet::new();
    for client in 0..clients {
        let url = format!("{base}/v1/keys/{key}?client=c{client}");
        let answer = get(http, &url, &[]).await;
        assert_eq!(answer.status(), 200, "{url}");
        assert_eq!(
            served_version(&answer),
            version,
            "{url}: a reader was served a copy that missed an edit"
        );
        if let Some(copy) = answer.headers().get("hotsplit-copy") {
            copies.insert(copy.to_str().unwrap_or_default().to_owned());
        }
    }
    copies
}

/// The `/v1/hot-keys` entry of `key`, if listed.
async fn hot_entry(http: &reqwest::Client, base: &str, key: &str) -> Option<Value> {
    let view = get_json(http, &format!("{base}/v1/hot-keys")).await;
    view["instance"]["keys"]
        .as_array()?
        .iter()
        .find(|entry| entry["key"] == key)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_splits_spreads_its_reads_then_cools_merges_and_splits_again() {
    let server = harness::shared_standalone();
    let service = Service::start(config(&server.url(), "sp1:", "split", "200ms")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_succeeds(&http, &base, "sp1:hot", 1, "one").await;

    for round in 0..2u64 {
        let version = round + 1;
        // Read hard until readers use the split copies.
        let started = std::time::Instant::now();
        loop {
            let copies = read_all(&http, &base, "sp1:hot", 64, version).await;
            if copies.len() > 1 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "round {round}: sp1:hot never split: {:?}",
                record(server, "sp1:", "sp1:hot")
            );
        }
        let stored = record(server, "sp1:", "sp1:hot").expect("a split record");
        assert!(stored.starts_with("8:r:"), "{stored}");
        for index in 1..8 {
            assert!(
                exists(server, &format!("sp1:hot#{index}")),
                "copy {index} filled"
            );
        }
        let entry = hot_entry(&http, &base, "sp1:hot").await.expect("listed");
        assert_eq!(entry["policy"], "split", "{entry}");
        assert_eq!(entry["copies"], 8, "{entry}");
        assert_eq!(entry["split_phase"], "reading", "{entry}");
        // A publish while split reaches every copy.
        publish_succeeds(&http, &base, "sp1:hot", version + 1, "next").await;
        for index in 0..8 {
            let answer = get(&http, &format!("{base}/v1/keys/sp1:hot?copy={index}"), &[]).await;
            assert_eq!(answer.status(), 200);
            assert_eq!(served_version(&answer), version + 1, "copy {index}");
        }

        // No reads: it cools, merges, and its extra copies go.
        poll(
            "sp1:hot merges once cool",
            Duration::from_secs(30),
            || async { record(server, "sp1:", "sp1:hot").is_none() },
        )
        .await;
        for index in 1..8 {
            assert!(
                !exists(server, &format!("sp1:hot#{index}")),
                "copy {index} deleted"
            );
        }
        let copies = read_all(&http, &base, "sp1:hot", 16, version + 1).await;
        assert_eq!(
            copies,
            BTreeSet::from(["0".to_owned()]),
            "merged reads use copy 0"
        );
    }
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_learning_of_a_split_and_a_merge_at_different_moments_serve_no_missed_edit() {
    let server = harness::shared_standalone();
    // The splitting instance, and one that never splits (observe) but writes and reads what
    // the records say, refreshed on its own clock five times as seldom: it learns of each move
    // up to 1.5 s after the splitter made it (still within the splitter's settle time of
    // 300 ms + 2 × the 2 s command timeout). A split that admitted readers before the settle
    // time would serve them copies the late instance's publishes missed.
    let splitter = Service::start(config(&server.url(), "sp2:", "split", "300ms")).await;
    let other = Service::start(config(&server.url(), "sp2:", "observe", "1500ms")).await;
    let http = reqwest::Client::new();
    let bases = [splitter.base.clone(), other.base.clone()];
    let mut version = 0u64;
    let mut saw = BTreeSet::new();
    let started = std::time::Instant::now();
    // Publishes alternate between the instances while both read hard: the key splits.
    loop {
        version += 1;
        publish_succeeds(&http, &bases[(version % 2) as usize], "sp2:k", version, "v").await;
        for base in &bases {
            read_all(&http, base, "sp2:k", 24, version).await;
        }
        if let Some(stored) = record(server, "sp2:", "sp2:k") {
            saw.insert(stored[2..3].to_owned());
        }
        if saw.contains("r") && version >= 8 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "sp2:k never split: saw {saw:?}"
        );
    }
    // Reads slow to a trickle while publishes go on: the key cools and merges under them.
    let started = std::time::Instant::now();
    while record(server, "sp2:", "sp2:k").is_some() {
        version += 1;
        publish_succeeds(&http, &bases[(version % 2) as usize], "sp2:k", version, "v").await;
        for base in &bases {
            read_all(&http, base, "sp2:k", 1, version).await;
        }
        // Pacing, not waiting for a condition: below the cooling rate.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "sp2:k never merged: {:?}",
            record(server, "sp2:", "sp2:k")
        );
    }
    for base in &bases {
        read_all(&http, base, "sp2:k", 24, version).await;
    }
    splitter.stop().await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_restarted_in_the_middle_of_a_split_finishes_it() {
    let server = harness::shared_standalone();
    // A long layout interval: the split stays in its writing phase for over a second.
    let service = Service::start(config(&server.url(), "sp3:", "split", "1s")).await;
    let http = reqwest::Client::new();
    publish_succeeds(&http, &service.base, "sp3:k", 1, "one").await;
    let started = std::time::Instant::now();
    while record(server, "sp3:", "sp3:k").is_none() {
        read_all(&http, &service.base, "sp3:k", 32, 1).await;
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "sp3:k never split"
        );
    }
    let stored = record(server, "sp3:", "sp3:k").expect("recorded");
    assert!(stored.starts_with("8:w:"), "still writing: {stored}");
    service.stop().await;

    // The restarted instance loads the record, writes the new copies, fills them after the
    // settle time and admits readers, then (no reads: cool) merges.
    let service = Service::start(config(&server.url(), "sp3:", "split", "1s")).await;
    publish_succeeds(&http, &service.base, "sp3:k", 2, "two").await;
    assert!(
        exists(server, "sp3:k#5"),
        "a publish writes the copies of a known split"
    );
    let mut phases = BTreeSet::new();
    poll(
        "the split finishes, then merges",
        Duration::from_secs(40),
        || {
            let stored = record(server, "sp3:", "sp3:k");
            if let Some(stored) = &stored {
                phases.insert(stored[2..3].to_owned());
            }
            async move { stored.is_none() }
        },
    )
    .await;
    assert!(phases.contains("r"), "readers were admitted: {phases:?}");
    assert!(!exists(server, "sp3:k#5"), "the extra copies are deleted");
    read_all(&http, &service.base, "sp3:k", 16, 2).await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_split_spreads_one_keys_reads_over_every_master() {
    let cluster = harness::shared_cluster();
    let text = format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[heal]\nlayout_interval = \"200ms\"\n[[family]]\nprefix = \"sc:\"\ncopies = 1\nttl = \"10m\"\nplacement = \"spread\"\nsplit = {{ mode = \"split\", max_copies = 6, threshold = 50.0, cool_down = \"30s\" }}\n[hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\n",
        url = cluster.url(),
        timeout = harness::command_timeout_toml()
    );
    let service = Service::start(config_from_toml(&text)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_succeeds(&http, &base, "sc:hot", 1, "one").await;
    let masters = |served: &BTreeSet<String>| served.len();
    let mut served = BTreeSet::new();
    let started = std::time::Instant::now();
    // Before the split every read is served by copy 0's master; after it, by every master.
    while masters(&served) < 3 {
        served.clear();
        for client in 0..48 {
            let url = format!("{base}/v1/keys/sc:hot?client=c{client}");
            let answer = get(&http, &url, &[]).await;
            assert_eq!(answer.status(), 200, "{url}");
            assert_eq!(served_version(&answer), 1, "{url}");
            if let Some(node) = answer.headers().get("hotsplit-served-by") {
                served.insert(node.to_str().unwrap_or_default().to_owned());
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "sc:hot's reads never reached every master: {served:?}"
        );
    }
    let port = harness::owner_port(cluster, "#hotsplit#splits#sc:");
    let stored = cluster
        .cli(port, &["HGET", "#hotsplit#splits#sc:", "sc:hot"])
        .expect("HGET the split record");
    assert!(stored.trim().starts_with("6:r:"), "{stored}");
    // A publish while split reaches every copy, wherever it lives.
    publish_succeeds(&http, &base, "sc:hot", 2, "two").await;
    for index in 0..6 {
        let answer = get(&http, &format!("{base}/v1/keys/sc:hot?copy={index}"), &[]).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(served_version(&answer), 2, "copy {index}");
    }
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_splits_while_a_live_instance_does_not_know_of_splits() {
    let server = harness::shared_standalone();
    // An older release's live entry: in the family's live set, not in its split set (it would
    // write only copy 0).
    let lapse_ms = hotsplit::store::now_unix_ms() + 600_000;
    server
        .node
        .cli(&[
            "ZADD",
            "#hotsplit#live#sp5:",
            &lapse_ms.to_string(),
            "1:older-release",
        ])
        .expect("ZADD an older live entry");
    let service = Service::start(config(&server.url(), "sp5:", "split", "200ms")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_succeeds(&http, &base, "sp5:k", 1, "one").await;
    // Hot for well over the settle time (200 ms + 2 × 2 s): no split starts.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        let copies = read_all(&http, &base, "sp5:k", 32, 1).await;
        assert_eq!(
            copies,
            BTreeSet::from(["0".to_owned()]),
            "readers stay on copy 0"
        );
    }
    assert_eq!(
        record(server, "sp5:", "sp5:k"),
        None,
        "no split while it is live"
    );
    // The older instance goes: the key splits, and readers are admitted after the settle time.
    server
        .node
        .cli(&["ZREM", "#hotsplit#live#sp5:", "1:older-release"])
        .expect("ZREM");
    let started = std::time::Instant::now();
    while read_all(&http, &base, "sp5:k", 32, 1).await.len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "sp5:k never admitted readers: {:?}",
            record(server, "sp5:", "sp5:k")
        );
    }
    service.stop().await;
}

/// `redis-cli -p port -r times GET key` (one connection, so one client), its output lines.
async fn resp_gets(port: u16, key: &str, times: usize) -> Vec<String> {
    let args = vec![
        "-p".to_owned(),
        port.to_string(),
        "-r".to_owned(),
        times.to_string(),
        "GET".to_owned(),
        key.to_owned(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(args)
            .output()
            .expect("run redis-cli")
    })
    .await
    .expect("join redis-cli");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_the_redis_protocol_split_a_key_and_stay_current_across_it() {
    let server = harness::shared_standalone();
    let port = harness::free_port();
    let mut config = config(&server.url(), "sp6:", "split", "200ms");
    config.resp = config_from_toml(&format!("[resp]\nlisten = \"127.0.0.1:{port}\"\n")).resp;
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    publish_succeeds(&http, &service.base, "sp6:k", 1, "one").await;
    let started = std::time::Instant::now();
    // RESP reads alone make it hot (the detector counts both doors), and it splits.
    while !record(server, "sp6:", "sp6:k").is_some_and(|stored| stored.starts_with("8:r:")) {
        let lines = resp_gets(port, "sp6:k", 300).await;
        assert_eq!(lines.len(), 300, "{lines:?}");
        assert!(lines.iter().all(|line| line == "one"), "{lines:?}");
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "sp6:k never split: {:?}",
            record(server, "sp6:", "sp6:k")
        );
    }
    // An edit while split reaches every copy a RESP reader may use.
    publish_succeeds(&http, &service.base, "sp6:k", 2, "two").await;
    for _ in 0..4 {
        let lines = resp_gets(port, "sp6:k", 50).await;
        assert!(lines.iter().all(|line| line == "two"), "{lines:?}");
    }
    service.stop().await;
}

/// The stored version of `copy_key` on the master that owns it, `None` when it is missing.
fn version_on_owner(cluster: &devcluster::Cluster, copy_key: &str) -> Option<u64> {
    harness::copy_on_owner(cluster, copy_key)
        .get("ver")
        .map(|ver| ver.parse().expect("a stored version is a number"))
}

/// Runs one command on the master that owns `key`.
fn on_owner(cluster: &devcluster::Cluster, key: &str, args: &[&str]) {
    let port = harness::owner_port(cluster, key);
    cluster
        .cli(port, args)
        .unwrap_or_else(|err| panic!("{args:?} on the owner of {key}: {err}"));
}

/// A split key of a one-copy family (split by reading it hard) whose copy 3 is set behind and
/// copy 5 deleted by hand is repaired by the scrub, which leaves a copy beyond the split count
/// alone; `audit --config` reads the key's 8 copies and counts none of them as strays, and the
/// copy beyond the split count (as a merge that crashed would leave it) as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_keys_copies_are_scrubbed_and_audited_up_to_its_split_count() {
    // A cluster of its own: the scrub's lease is cluster-wide.
    let cluster = harness::own_cluster().await;
    let url = cluster.url();
    let family = "[[family]]\nprefix = \"sps:\"\ncopies = 1\nttl = \"10m\"\nsplit = { mode = \"split\", max_copies = 8, threshold = 50.0, cool_down = \"60s\" }\n";
    let service = Service::start(config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[heal]\nlayout_interval = \"200ms\"\n{family}\
         [hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\n\
         [scrub]\nenabled = true\ninterval = \"300ms\"\nlease_ttl = \"3s\"\nmax_keys_per_second = 5000\n",
        timeout = harness::command_timeout_toml()
    )))
    .await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_succeeds(&http, &base, "sps:hot", 1, "one").await;
    let started = std::time::Instant::now();
    while read_all(&http, &base, "sps:hot", 64, 1).await.len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "sps:hot never split"
        );
    }
    publish_succeeds(&http, &base, "sps:hot", 2, "two").await;
    for index in 0..8 {
        assert_eq!(
            version_on_owner(&cluster, &format!("sps:hot#{index}")),
            Some(2),
            "copy {index}"
        );
    }

    // Behind hotsplit's back: copy 3 set back to version 1, copy 5 deleted, and a copy beyond
    // the split count left at version 1.
    on_owner(
        &cluster,
        "sps:hot#3",
        &["HSET", "sps:hot#3", "ver", "1", "val", "one"],
    );
    on_owner(&cluster, "sps:hot#5", &["DEL", "sps:hot#5"]);
    on_owner(
        &cluster,
        "sps:hot#9",
        &[
            "HSET",
            "sps:hot#9",
            "ver",
            "1",
            "val",
            "old",
            "tomb",
            "0",
            "exp",
            "99999999999999",
        ],
    );
    poll(
        "the scrub repairs the split copies",
        Duration::from_secs(20),
        || {
            std::future::ready(
                version_on_owner(&cluster, "sps:hot#3") == Some(2)
                    && version_on_owner(&cluster, "sps:hot#5") == Some(2),
            )
        },
    )
    .await;
    // Two more passes: the copy beyond the split count is still untouched, none is created.
    let passes = get_json(&http, &format!("{base}/v1/scrub")).await["passes"]
        .as_u64()
        .unwrap_or(0);
    poll("two more scrub passes", Duration::from_secs(20), || async {
        get_json(&http, &format!("{base}/v1/scrub")).await["passes"]
            .as_u64()
            .unwrap_or(0)
            >= passes + 2
    })
    .await;
    assert_eq!(version_on_owner(&cluster, "sps:hot#9"), Some(1));
    assert_eq!(version_on_owner(&cluster, "sps:hot#8"), None);
    let view = get_json(&http, &format!("{base}/v1/scrub")).await;
    assert!(
        view["last"]["keys_checked"].as_u64().unwrap_or(0) >= 1,
        "{view}"
    );
    service.stop().await;

    // The record stays (the key is still split): the audit reads it.
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), family).unwrap();
    let audit = || {
        harness::audit_json(vec![
            "--redis".into(),
            url.clone(),
            "--config".into(),
            config.path().display().to_string(),
        ])
    };
    let report = audit().await;
    assert_eq!(report["keys"], 1, "{report}");
    assert_eq!(report["stray_copies"], 1, "sps:hot#9 only: {report}");
    assert_eq!(report["primary"]["copy_reads"], 8, "{report}");
    assert_eq!(report["primary"]["copies_behind"], 0, "{report}");
    on_owner(&cluster, "sps:hot#9", &["DEL", "sps:hot#9"]);
    let report = audit().await;
    assert_eq!(report["stray_copies"], 0, "{report}");
    assert_eq!(report["primary"]["copy_reads"], 8, "{report}");
}
