//! Healing against real faults: a paused master (SIGSTOP and `CLIENT PAUSE WRITE`), coalescing
//! under 1,000 edits, ordering of a late retry, read repair, and the spool's durability across a
//! SIGKILL of the real binary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use hotsplit::client::Client;
use hotsplit::config::HealConfig;
use hotsplit::heal::{FailedCopy, RetryQueue, RetryWorker};
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::store::{now_unix_ms, CasOutcome, CopyStore, CopyWrite, Payload};
use hotsplit_devcluster::{self as devcluster, Cluster, Standalone};
use reqwest::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::harness::{
    self, affinity, config_with_family, copy_on_owner, get, get_json, hgetall, metrics_text,
    owner_port, poll, publish_expecting, publish_succeeds, Binary, Edit, Service,
};

/// The stored version of `key` on `port`, 0 when missing.
pub(crate) fn stored_version(port: u16, key: &str) -> u64 {
    hgetall(port, key)
        .get("ver")
        .and_then(|ver| ver.parse().ok())
        .unwrap_or(0)
}

/// The `/v1/retry-queue` view of the service at `base`, with every entry.
pub(crate) async fn retry_queue(http: &reqwest::Client, base: &str) -> Value {
    get_json(http, &format!("{base}/v1/retry-queue?limit=10000")).await
}

/// The pending (copy key → version) entries of the service at `base`.
pub(crate) async fn pending(http: &reqwest::Client, base: &str) -> HashMap<String, u64> {
    retry_queue(http, base).await["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["copy_key"].as_str().unwrap().to_owned(),
                entry["version"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Asserts that the publish answer `body` reports exactly the copies owned by the master on
/// `victim` as `queued` and every other copy `applied`, naming `what`; returns how many were
/// queued (at least one).
pub(crate) fn queued_exactly_on(cluster: &Cluster, victim: u16, body: &Value, what: &str) -> u64 {
    let mut queued = 0;
    for line in body["outcomes"].as_array().expect("outcomes") {
        let copy_key = line["copy_key"].as_str().expect("copy_key");
        let on_victim = owner_port(cluster, copy_key) == victim;
        let expected = if on_victim { "queued" } else { "applied" };
        assert_eq!(line["outcome"], expected, "{what} {copy_key}: {line}");
        queued += u64::from(on_victim);
    }
    assert!(queued > 0, "{what}: no copy on the victim: {body}");
    queued
}

/// Polls until the retry queue of the service at `base` is empty (for up to 20 s).
pub(crate) async fn wait_drained(http: &reqwest::Client, base: &str) {
    poll(
        "the retry queue drains",
        Duration::from_secs(20),
        || async { retry_queue(http, base).await["depth"].as_u64() == Some(0) },
    )
    .await;
}

/// How a test stalls one master's writes.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGSTOP / SIGCONT.
    Stop,
    /// `CLIENT PAUSE <ms> WRITE` / `CLIENT UNPAUSE`.
    ClientPause,
}

impl Fault {
    fn inject(self, cluster: &Cluster, port: u16) {
        match self {
            Fault::Stop => cluster.node(port).expect("node").pause().expect("SIGSTOP"),
            Fault::ClientPause => {
                devcluster::cli(port, &["CLIENT", "PAUSE", "30000", "WRITE"]).expect("pause");
            }
        }
    }

    fn heal(self, cluster: &Cluster, port: u16) {
        match self {
            Fault::Stop => cluster.node(port).expect("node").resume().expect("SIGCONT"),
            Fault::ClientPause => {
                devcluster::cli(port, &["CLIENT", "UNPAUSE"]).expect("unpause");
            }
        }
    }
}

/// Publishes during a fault on one master: exactly that master's copies are `queued` (202);
/// after the fault ends the queue drains and every copy holds the new version in Redis. The
/// stalled master is never replaced meanwhile, so its copies come back on the same node.
async fn queued_then_drained(fault: Fault) {
    let cluster = harness::own_cluster_without_failover().await;
    let service = Service::start(config_with_family(Some(&cluster.url()), "pause:", 16)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("pause:1", 1, "one"), StatusCode::OK).await;

    let victim = owner_port(&cluster, "pause:1#0");
    fault.inject(&cluster, victim);
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        http.put(format!("{base}/v1/keys/pause:1?version=2"))
            .body("two")
            .send(),
    )
    .await
    .expect("the publish answers instead of hanging")
    .unwrap();
    assert_eq!(answer.status(), StatusCode::ACCEPTED, "{fault:?}");
    let body: Value = answer.json().await.unwrap();
    let queued = queued_exactly_on(&cluster, victim, &body, &format!("{fault:?}"));
    assert_eq!(body["queued"].as_u64(), Some(queued), "{body}");
    assert_eq!(body["dropped"].as_u64(), Some(0), "{body}");

    // The queue shows exactly those entries, on the victim.
    let view = retry_queue(&http, base).await;
    assert_eq!(view["depth"].as_u64(), Some(queued), "{view}");
    let nodes = view["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{view}");
    assert_eq!(nodes[0]["node"], format!("127.0.0.1:{victim}"));
    assert_eq!(nodes[0]["entries"].as_u64(), Some(queued));
    assert!(view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|entry| entry["version"] == 2));

    fault.heal(&cluster, victim);
    wait_drained(&http, base).await;
    for copy in 0..16 {
        let copy_key = format!("pause:1#{copy}");
        let fields = copy_on_owner(&cluster, &copy_key);
        assert_eq!(
            fields.get("ver").map(String::as_str),
            Some("2"),
            "{fault:?} {copy_key}: {fields:?}"
        );
        assert_eq!(fields.get("val").map(String::as_str), Some("two"));
    }
    let metrics = metrics_text(&http, base).await;
    assert!(
        metrics.contains("hotsplit_retry_queue_depth 0"),
        "{metrics}"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_stopped_master_queues_its_copies_and_drains_after_sigcont() {
    queued_then_drained(Fault::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_client_paused_master_queues_its_copies_and_drains_after_unpause() {
    queued_then_drained(Fault::ClientPause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_thousand_edits_while_paused_leave_one_entry_per_copy() {
    let cluster = harness::own_cluster().await;
    let service = Service::start(config_with_family(Some(&cluster.url()), "hot:", 8)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let victim = owner_port(&cluster, "hot:1#0");
    let on_victim: Vec<String> = (0..8)
        .map(|copy| format!("hot:1#{copy}"))
        .filter(|copy_key| owner_port(&cluster, copy_key) == victim)
        .collect();

    // CLIENT PAUSE WRITE stalls the master's writes without a failover, however long it lasts.
    Fault::ClientPause.inject(&cluster, victim);
    let tasks: Vec<_> = (0..100u64)
        .map(|task| {
            let http = http.clone();
            let base = base.clone();
            tokio::spawn(async move {
                for step in 1..=10u64 {
                    let version = task * 10 + step;
                    publish_expecting(
                        &http,
                        &base,
                        Edit::new("hot:1", version, &format!("v{version}")),
                        StatusCode::ACCEPTED,
                    )
                    .await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let view = retry_queue(&http, &base).await;
    assert_eq!(
        view["depth"].as_u64(),
        Some(on_victim.len() as u64),
        "exactly one entry per copy on the paused master: {view}"
    );
    let mut listed: Vec<String> = view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            assert_eq!(entry["version"], 1000, "{entry}");
            entry["copy_key"].as_str().unwrap().to_owned()
        })
        .collect();
    listed.sort();
    assert_eq!(listed, on_victim);

    Fault::ClientPause.heal(&cluster, victim);
    wait_drained(&http, &base).await;
    for copy in 0..8 {
        let copy_key = format!("hot:1#{copy}");
        assert_eq!(
            stored_version(owner_port(&cluster, &copy_key), &copy_key),
            1000,
            "{copy_key}"
        );
    }
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_late_retry_of_an_older_version_never_overwrites_a_newer_one() {
    let cluster = harness::shared_cluster();
    let store = harness::redis_store(&cluster.url(), harness::COMMAND_TIMEOUT).await;
    let metrics = Metrics::new();
    let queue = Arc::new(RetryQueue::in_memory(
        HealConfig::default(),
        metrics.clone(),
    ));
    let key = Key::parse("order:late").unwrap();
    let copy_key = key.copy_key(0, hotsplit::key::Placement::Suffix);
    let expire_at_ms = now_unix_ms() + 60_000;

    // Version 1's write to copy 0 failed and was queued...
    let old = Payload::Value(Bytes::from_static(b"old"));
    let admissions = queue.enqueue(
        &key,
        Version::new(1).unwrap(),
        &old,
        vec![FailedCopy {
            copy_key: copy_key.clone(),
            node: store.node_of(&copy_key),
            expire_at_ms,
            error: "timeout".into(),
        }],
    );
    assert_eq!(admissions.await, vec![hotsplit::heal::Admission::Queued]);
    // ...then version 2 lands first (written by another instance, so this queue is not told).
    let newer = CopyWrite {
        copy_key: copy_key.clone(),
        version: Version::new(2).unwrap(),
        payload: Payload::Value(Bytes::from_static(b"new")),
        expire_at_ms,
    };
    let landed = store.write_copies(std::slice::from_ref(&newer)).await;
    assert!(matches!(landed[0].outcome, Ok(CasOutcome::Applied)));

    // Now the late retry of version 1 runs: it is `stale`, completes, and changes nothing.
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(
        RetryWorker::new(
            queue.clone(),
            store.clone(),
            metrics.clone(),
            256,
            Duration::from_secs(1),
        )
        .run(cancel.clone()),
    );
    poll("the late retry completes", Duration::from_secs(10), || {
        let queue = queue.clone();
        async move { queue.depth() == 0 }
    })
    .await;
    cancel.cancel();
    worker.await.unwrap();
    let record = store.read_copy(&copy_key).await.record.unwrap().unwrap();
    assert_eq!(record.version.get(), 2);
    assert_eq!(record.payload, Payload::Value(Bytes::from_static(b"new")));
    let text = metrics.render();
    assert!(
        text.contains(r#"hotsplit_retry_attempts_total{result="stale"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_read_repair_fixes_a_stale_or_missing_affine_copy() {
    let server = harness::shared_standalone();
    let port = server.node.port();
    let service = Service::start(config_with_family(Some(&server.url()), "rr:", 8)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_succeeds(&http, base, "rr:1", 5, "five").await;
    let affinity = affinity(&http, base, "rr:1", "alice").await;
    let copy_key = affinity["copy_key"].as_str().unwrap().to_owned();

    // Stale: roll the copy back behind hotsplit's back; one floored read falls back and repairs.
    devcluster::cli(port, &["HSET", &copy_key, "ver", "4", "val", "four"]).unwrap();
    let read = get(
        &http,
        &format!("{base}/v1/keys/rr:1?client=alice&min_version=5"),
        &[],
    )
    .await;
    assert_eq!(read.headers()["hotsplit-version"], "5");
    poll(
        "the stale copy is repaired",
        Duration::from_secs(5),
        || async { stored_version(port, &copy_key) == 5 },
    )
    .await;
    let fields = hgetall(port, &copy_key);
    assert_eq!(fields["val"], "five");
    let pexpiretime: u64 = devcluster::cli(port, &["PEXPIRETIME", &copy_key])
        .unwrap()
        .parse()
        .unwrap();
    // The key lives the version retention past the copy's expiry, and a write never moves that
    // earlier (the rolled-back copy's own, jittered, expiry may have been the later one).
    let exp: u64 = fields["exp"].parse().unwrap();
    assert!(
        pexpiretime >= exp + 3_600_000,
        "a repair applies the sibling's absolute expiry, kept the version retention longer: {pexpiretime} < {exp} + 1 h"
    );

    // Missing: delete the copy; a read without a floor falls back and repairs it.
    devcluster::cli(port, &["DEL", &copy_key]).unwrap();
    let read = get(&http, &format!("{base}/v1/keys/rr:1?client=alice"), &[]).await;
    assert_eq!(read.status(), StatusCode::OK);
    poll(
        "the missing copy is repaired",
        Duration::from_secs(5),
        || async { stored_version(port, &copy_key) == 5 },
    )
    .await;
    // The repair task counts after its write returns: poll, the stored version can come first.
    poll(
        "both repairs are counted",
        Duration::from_secs(5),
        || async {
            metrics_text(&http, base)
                .await
                .contains(r#"hotsplit_read_repairs_total{result="applied"} 2"#)
        },
    )
    .await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_sigkill_mid_publish_loses_no_queued_entry() {
    let cluster = harness::own_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"{}\"\n[heal]\nspool_dir = \"{}\"\n\
         [[family]]\nprefix = \"kill:\"\ncopies = 8\nttl = \"10m\"\n",
        cluster.url(),
        harness::command_timeout_toml(),
        dir.path().join("spool").display()
    );
    let mut first = Binary::start(dir.path(), "first", &config).await;

    // The fault: the victim master refuses FCALL (an ACL), so its copy writes fail fast and
    // deterministically, while startup (FUNCTION LOAD, PING) still works.
    let victim = owner_port(&cluster, "kill:0#0");
    devcluster::cli(victim, &["ACL", "SETUSER", "default", "-fcall"]).unwrap();

    // Eight writers publish increasing versions until hotsplit dies under them.
    let queued: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let answers = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let http = reqwest::Client::new();
            let base = first.base.clone();
            let queued = queued.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                for version in 1u64.. {
                    let Ok(answer) = http
                        .put(format!("{base}/v1/keys/kill:{writer}?version={version}"))
                        .body(format!("v{version}"))
                        .send()
                        .await
                    else {
                        return;
                    };
                    let Ok(body) = answer.json::<Value>().await else {
                        return;
                    };
                    let mut queued = queued.lock().unwrap();
                    for line in body["outcomes"].as_array().into_iter().flatten() {
                        if line["outcome"] == "queued" {
                            let copy_key = line["copy_key"].as_str().unwrap().to_owned();
                            queued.insert(copy_key, version);
                        }
                    }
                    answers.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    poll(
        "publishes are being queued",
        Duration::from_secs(10),
        || {
            let queued = queued.clone();
            async move { queued.lock().unwrap().len() >= 8 }
        },
    )
    .await;
    // Let the writers run on for a while, then kill hotsplit under them.
    let seen = answers.load(Ordering::Relaxed);
    poll("more publishes answer", Duration::from_secs(10), || {
        let answers = answers.clone();
        async move { answers.load(Ordering::Relaxed) >= seen + 200 }
    })
    .await;
    first.sigkill();
    for writer in writers {
        writer.await.unwrap();
    }
    let queued = queued.lock().unwrap().clone();
    assert!(!queued.is_empty());

    // Restart: the spool replays. The fault is still on, so nothing can have drained yet.
    let second = Binary::start(dir.path(), "second", &config).await;
    let http = reqwest::Client::new();
    let pending = pending(&http, &second.base).await;
    for (copy_key, version) in &queued {
        let held = pending.get(copy_key).copied().unwrap_or(0);
        assert!(
            held >= *version,
            "{copy_key} was reported queued at version {version}; after the restart the queue holds {held}"
        );
    }
    assert!(second.log_text().contains("replayed the retry spool"));

    // The fault ends: every copy heals to at least the version reported queued.
    devcluster::cli(victim, &["ACL", "SETUSER", "default", "+fcall"]).unwrap();
    wait_drained(&http, &second.base).await;
    for (copy_key, version) in &queued {
        let stored = stored_version(victim, copy_key);
        assert!(stored >= *version, "{copy_key}: {stored} < {version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_the_binary_drops_a_torn_spool_tail_and_refuses_a_shared_one() {
    let server = harness::shared_standalone();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    std::fs::write(
        spool.join("spool.log"),
        [0u8, 0, 0, 50, 1, 2, 3, 0xde, 0xad],
    )
    .unwrap();
    let config = format!(
        "[store]\nredis = \"{}\"\n[heal]\nspool_dir = \"{}\"\n",
        server.url(),
        spool.display()
    );
    let mut owner = Binary::start(dir.path(), "owner", &config).await;
    assert!(
        owner.log_text().contains("ends in a torn frame"),
        "{}",
        owner.log_text()
    );
    // The torn frame was never acknowledged: the file is rewritten as an empty format-1 spool
    // (its 32-byte header), not kept aside.
    assert_eq!(
        std::fs::metadata(spool.join("spool.log")).unwrap().len(),
        32
    );
    assert_eq!(
        std::fs::read_dir(&spool).unwrap().count(),
        2,
        "spool.log and LOCK only"
    );

    let mut intruder = Binary::spawn(dir.path(), "intruder", &config);
    let mut status = None;
    poll(
        "a second process on the spool exits",
        Duration::from_secs(15),
        || {
            status = intruder.try_wait();
            std::future::ready(status.is_some())
        },
    )
    .await;
    assert!(!status.unwrap().success());
    assert!(
        intruder.log_text().contains("locked by another process"),
        "{}",
        intruder.log_text()
    );
    // The owner is unaffected.
    owner.wait_ready().await;
}

/// A standalone server whose `default` user may not `FCALL`, and a config of the family `sd:`
/// (4 copies) on it with a long retry backoff (only a shutdown drain, which ignores it, retries
/// within a test) and a 3 s grace: a publish there is queued, and no retry succeeds until the
/// test gives `FCALL` back. The layout records (changed only through `FCALL hotsplit_layout`)
/// are written first, as an earlier start would have left them, so startup needs no `FCALL`.
async fn refusing_fcall() -> (Standalone, hotsplit::config::Config) {
    let server = tokio::task::spawn_blocking(|| Standalone::start().unwrap())
        .await
        .unwrap();
    let port = server.node.port();
    let mut config = config_with_family(Some(&server.url()), "sd:", 4);
    config.heal.backoff_initial = Duration::from_secs(30);
    config.heal.backoff_cap = Duration::from_secs(30);
    config.server.shutdown_grace = Duration::from_secs(3);
    for (family, layout) in [("sd:", "4:4"), ("alloc:", "4:4"), ("default", "1:1")] {
        let record = hotsplit::store::layout_key(family);
        devcluster::cli(port, &["SET", &record, layout]).unwrap();
    }
    devcluster::cli(port, &["ACL", "SETUSER", "default", "-fcall"]).unwrap();
    (server, config)
}

/// Publishes `sd:1` v1 through the service at `base` on a store that refuses `FCALL`
/// ([`refusing_fcall`]): every copy is queued (202).
async fn publish_queued(http: &reqwest::Client, base: &str) {
    publish_expecting(
        http,
        base,
        Edit::new("sd:1", 1, "one"),
        StatusCode::ACCEPTED,
    )
    .await;
}

/// Asserts that every copy of `sd:1` on `port` holds version 1.
fn assert_every_copy_holds_v1(port: u16) {
    for copy in 0..4 {
        assert_eq!(
            stored_version(port, &format!("sd:1#{copy}")),
            1,
            "copy {copy}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_shutdown_drains_what_it_can_and_spools_the_rest() {
    let (server, config) = refusing_fcall().await;
    let port = server.node.port();
    let http = reqwest::Client::new();

    // The store refuses FCALL: the publish is queued, and shutdown cannot drain it.
    let service = Service::start(config.clone()).await;
    publish_queued(&http, &service.base).await;
    service.stop().await;

    // A new process on the same spool finds the entries; this time shutdown drains them.
    let service = Service::start(config).await;
    assert_eq!(
        retry_queue(&http, &service.base).await["depth"].as_u64(),
        Some(4)
    );
    devcluster::cli(port, &["ACL", "SETUSER", "default", "+fcall"]).unwrap();
    service.stop().await;
    assert_every_copy_holds_v1(port);
}

/// A node the health table marked failing (a read timed out on it) that answers again by the
/// time of shutdown is drained there: the final drain sends its queued copies whatever the
/// table last saw, as it ignores the backoff. (Under load, missed health probes mark a node
/// failing just as well, and the prober stops at shutdown.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_shutdown_drains_a_node_marked_failing_that_answers_again() {
    let (server, mut config) = refusing_fcall().await;
    let port = server.node.port();
    // No health probe after the first round: once marked failing, the node stays so until
    // shutdown. A short command timeout marks it failing quickly.
    config.heal.probe_interval = Duration::from_secs(120);
    config.store.command_timeout = Duration::from_millis(300);
    let http = reqwest::Client::new();
    let service = Service::start(config).await;
    publish_queued(&http, &service.base).await;

    server.node.pause().expect("SIGSTOP");
    let read = get(
        &http,
        &format!("{}/v1/keys/sd:1?client=reader", service.base),
        &[],
    )
    .await;
    assert!(read.status().is_server_error(), "{}", read.status());
    assert_eq!(
        crate::degraded::nodes_avoided(&http, &service.base).await,
        vec![format!("127.0.0.1:{port}")]
    );
    server.node.resume().expect("SIGCONT");
    devcluster::cli(port, &["ACL", "SETUSER", "default", "+fcall"]).unwrap();
    service.stop().await;
    assert_every_copy_holds_v1(port);
}

/// `SHUTDOWN NOSAVE` of a master during a publish, then a restart from its `nodes.conf`: back
/// within the node timeout (it returns empty) or after its replica was promoted. Either way the
/// queued copies heal, and no reader (each carrying its floor) is served an older version than
/// one it already read. Without a failover, the cluster's node timeout is long enough that the
/// restart always comes within it, however long the publish waited for the dead master.
async fn restart_cycle(wait_for_failover: bool) {
    let cluster = if wait_for_failover {
        harness::own_cluster().await
    } else {
        harness::own_cluster_without_failover().await
    };
    // Advisory reads: the lag monitor and the replica clients live through the failover too
    // (fred's replica routing once spun its router task here; see store::redis).
    let mut config = config_with_family(Some(&cluster.url()), "ns:", 16);
    config.families[0].default_class = "advisory".into();
    let service = Service::start(config).await;
    let base = service.base.clone();
    let http = reqwest::Client::new();
    publish_expecting(&http, &base, Edit::new("ns:1", 1, "one"), StatusCode::OK).await;

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..20)
        .map(|reader| {
            let stop = stop.clone();
            let base = base.clone();
            tokio::spawn(async move {
                let client = Client::new(&base, &format!("reader-{reader}")).unwrap();
                let mut last = 0;
                let mut reads = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(read)) = client.read("ns:1").await {
                        let version = read.version.get();
                        assert!(
                            version >= last,
                            "reader-{reader} went back from {last} to {version}"
                        );
                        last = version;
                        reads += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await; // Pacing, not a wait.
                }
                reads
            })
        })
        .collect();

    let victim = owner_port(&cluster, "ns:1#0");
    let slot = fred::util::redis_keyslot(b"ns:1#0");
    let node = cluster.node(victim).unwrap();
    tokio::task::block_in_place(|| node.shutdown_nosave()).unwrap();
    let answer = publish_expecting(
        &http,
        &base,
        Edit::new("ns:1", 2, "two"),
        StatusCode::ACCEPTED,
    )
    .await;
    let report: Value = answer.json().await.unwrap();
    assert!(report["queued"].as_u64().unwrap() > 0, "{report}");

    if wait_for_failover {
        poll("the replica is promoted", Duration::from_secs(20), || {
            let promoted = cluster
                .master_for_slot(slot)
                .ok()
                .flatten()
                .is_some_and(|owner| owner.port != victim && !owner.is_failed());
            std::future::ready(promoted)
        })
        .await;
    }
    tokio::task::block_in_place(|| node.restart()).unwrap();
    wait_drained(&http, &base).await;
    for copy in 0..16 {
        let copy_key = format!("ns:1#{copy}");
        let mut owner = 0;
        poll("the copy's owner is known", Duration::from_secs(10), || {
            owner = cluster
                .master_for_key(copy_key.as_bytes())
                .ok()
                .flatten()
                .map_or(0, |info| info.port);
            std::future::ready(owner != 0)
        })
        .await;
        assert_eq!(stored_version(owner, &copy_key), 2, "{copy_key}");
    }
    stop.store(true, Ordering::Relaxed);
    let mut reads = 0;
    for reader in readers {
        reads += reader.await.unwrap();
    }
    assert!(reads > 0);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_master_restarted_empty_within_the_node_timeout_heals() {
    restart_cycle(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_a_master_replaced_by_its_replica_heals() {
    restart_cycle(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_resizing_a_family_keeps_reads_monotonic_and_found() {
    let cluster = harness::shared_cluster();
    let url = cluster.url();
    let config = |copies| {
        let mut config = config_with_family(Some(&url), "resize:", copies);
        // Live entries lapse after three layout intervals: at 100 ms a refresh round on a
        // loaded machine outlasted the lapse (`resize::` failed so at load 18), and a smaller
        // instance stopped writing the copies a live larger one reads.
        config.heal.layout_interval = Duration::from_secs(1);
        config.heal.sweep_interval = Duration::from_millis(200);
        config
    };
    let exists = |copy_key: &str| {
        devcluster::cli(owner_port(cluster, copy_key), &["EXISTS", copy_key]).unwrap() == "1"
    };
    let mut service = Service::start(config(8)).await;
    let http = reqwest::Client::new();
    publish_expecting(
        &http,
        &service.base,
        Edit::new("resize:1", 1, "v1"),
        StatusCode::OK,
    )
    .await;
    let base = Arc::new(RwLock::new(service.base.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let published = Arc::new(AtomicUsize::new(1));

    // 100 readers carrying floors: never a lower version, never a 404.
    let readers: Vec<_> = (0..100)
        .map(|reader| {
            tokio::spawn(read_with_floors(
                reader,
                base.clone(),
                stop.clone(),
                reads.clone(),
            ))
        })
        .collect();
    // One writer keeps publishing newer versions through the current instance.
    let writer = tokio::spawn(publish_newer_versions(
        base.clone(),
        stop.clone(),
        published.clone(),
    ));

    for copies in [12, 4, 8] {
        // A rolling resize: the new instance starts (recording its layout), takes the
        // traffic, and the old one stops.
        let next = Service::start(config(copies)).await;
        *base.write().unwrap() = next.base.clone();
        std::mem::replace(&mut service, next).stop().await;
        match copies {
            // A key that is never published again after the shrink.
            12 => {
                publish_succeeds(&http, &service.base, "resize:idle", 1, "idle").await;
            }
            // The sweep deletes its copies 4..11; nothing else would.
            4 => {
                poll(
                    "the sweep deletes removed copies",
                    Duration::from_secs(30),
                    || {
                        std::future::ready(
                            (4..12).all(|copy| !exists(&format!("resize:idle#{copy}"))),
                        )
                    },
                )
                .await;
                assert!(exists("resize:idle#0"));
            }
            _ => {}
        }
        wait_for_reads_and_publishes(&reads, &published).await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    for reader in readers {
        reader.await.unwrap();
    }

    // The layout is recorded, nothing mismatches once the stopped 4-copy instance's live entry
    // has lapsed (it is not removed at shutdown: three layout intervals, then one refresh), and
    // the copies removed by the shrink (and not grown back) were deleted by the publishes.
    let ready_url = format!("{}/readyz", service.base);
    poll(
        "no layout mismatch once the stopped instance's live entry lapsed",
        Duration::from_secs(30),
        || async {
            get_json(&http, &ready_url)
                .await
                .get("layout_mismatches")
                .is_none()
        },
    )
    .await;
    let record_port = owner_port(cluster, "#hotsplit#layout#resize:");
    let record = devcluster::cli(record_port, &["GET", "#hotsplit#layout#resize:"]).unwrap();
    assert!(record.starts_with("8:"), "{record}");
    for copy in 8..12 {
        for key in ["resize:1", "resize:idle"] {
            let copy_key = format!("{key}#{copy}");
            assert!(
                !exists(&copy_key),
                "{copy_key} was removed by the shrink and must be gone"
            );
        }
    }
    service.stop().await;
}

/// Reader `reader` of `resize:1` through the instance at `base`, carrying its floor: never a
/// lower version, never a 404; counts its reads in `reads` until `stop`.
async fn read_with_floors(
    reader: usize,
    base: Arc<RwLock<String>>,
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::new();
    let mut floor = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let base = base.read().unwrap().clone();
        let mut request = http.get(format!("{base}/v1/keys/resize:1?client=reader-{reader}"));
        if floor > 0 {
            request = request.header("hotsplit-min-version", floor.to_string());
        }
        if let Ok(answer) = request.send().await {
            assert_ne!(
                answer.status(),
                StatusCode::NOT_FOUND,
                "reader-{reader}: 404 for a key that exists"
            );
            harness::record_monotonic_read(
                &format!("reader-{reader}"),
                &answer,
                &mut floor,
                &reads,
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await; // Pacing, not a wait.
    }
}

/// Publishes ever newer versions of `resize:1` through the instance at `base`, recording the
/// last one accepted in `published`, until `stop`.
async fn publish_newer_versions(
    base: Arc<RwLock<String>>,
    stop: Arc<AtomicBool>,
    published: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::new();
    let mut version = 1;
    while !stop.load(Ordering::Relaxed) {
        version += 1;
        let base = base.read().unwrap().clone();
        let sent = http
            .put(format!("{base}/v1/keys/resize:1?version={version}"))
            .body(format!("v{version}"))
            .send()
            .await;
        if sent.is_ok_and(|answer| answer.status().is_success()) {
            published.store(version, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(10)).await; // Pacing, not a wait.
    }
}

/// Waits until 1000 more reads and 5 more publishes than now have gone through.
async fn wait_for_reads_and_publishes(reads: &AtomicUsize, published: &AtomicUsize) {
    let (seen_reads, seen_published) = (
        reads.load(Ordering::Relaxed),
        published.load(Ordering::Relaxed),
    );
    poll(
        "reads and publishes go on after the resize",
        Duration::from_secs(20),
        || {
            let ok = reads.load(Ordering::Relaxed) >= seen_reads + 1000
                && published.load(Ordering::Relaxed) >= seen_published + 5;
            std::future::ready(ok)
        },
    )
    .await;
}
