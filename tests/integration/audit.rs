//! `hotsplit audit` end to end: the real binary against a real cluster with one copy made stale
//! by hand, the proof that it wrote nothing, `--watch` metrics, and its exit statuses.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hotsplit_devcluster::{self as devcluster, Cluster};
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{self, Edit};

/// Commands an audit may send, plus the replication traffic a quiet cluster has anyway
/// (`replconf`: each replica ACKs every second; `ping`: each master pings its replicas), plus
/// `cluster|info`, the read-only check a fred cluster client runs when a connection is set up:
/// once in a loaded run, a node saw one during the audit, after the publishing service had
/// stopped (its source is not yet pinned down; the audit's own clients are centralized and
/// never send it).
const READ_ONLY_COMMANDS: [&str; 11] = [
    "scan",
    "hmget",
    "hgetall",
    "info",
    "cluster|nodes",
    "readonly",
    "ping",
    "client|id",
    "role",
    "replconf",
    "cluster|info",
];

/// What a node has executed: calls per command (`INFO commandstats`) and its dirty counter.
#[derive(Debug, PartialEq, Eq)]
struct NodeStats {
    calls: BTreeMap<String, u64>,
    rdb_changes_since_last_save: u64,
}

fn node_stats(port: u16) -> NodeStats {
    let stats = devcluster::cli(port, &["INFO", "commandstats"]).expect("INFO commandstats");
    let calls = stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect();
    let persistence = devcluster::cli(port, &["INFO", "persistence"]).expect("INFO persistence");
    let rdb_changes_since_last_save = persistence
        .lines()
        .find_map(|line| line.trim().strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|value| value.parse().ok())
        .expect("rdb_changes_since_last_save");
    NodeStats {
        calls,
        rdb_changes_since_last_save,
    }
}

/// An `INFO replication` number of the node on `port`.
fn replication_offset(port: u16, field: &str) -> u64 {
    let info = devcluster::cli(port, &["INFO", "replication"]).expect("INFO replication");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{field} on {port}: {info}"))
}

/// Waits until every replica has applied everything its master had written when this was
/// called (its `slave_repl_offset` reaches the master's `master_repl_offset`).
async fn wait_for_replicas(cluster: &Cluster) {
    let topology = cluster.topology().expect("topology");
    let pairs: Vec<(u16, u16, u64)> = topology
        .iter()
        .filter(|node| node.is_replica())
        .map(|replica| {
            let master = topology
                .iter()
                .find(|node| Some(&node.id) == replica.master_id.as_ref())
                .expect("the replica's master");
            let written = replication_offset(master.port, "master_repl_offset");
            (master.port, replica.port, written)
        })
        .collect();
    harness::poll(
        "the replicas to catch up with their masters",
        Duration::from_secs(10),
        || {
            let caught_up = pairs.iter().all(|&(_, replica, written)| {
                replication_offset(replica, "slave_repl_offset") >= written
            });
            async move { caught_up }
        },
    )
    .await;
}

/// Publishes `keys` at `version` through a hotsplit service on `url`, with the family `prefix`
/// of `copies` copies, and stops the service (so it writes nothing during the audit).
async fn publish(url: &str, prefix: &str, copies: u32, keys: &[&str], version: u64) {
    let service =
        harness::Service::start(harness::config_with_family(Some(url), prefix, copies)).await;
    let http = reqwest::Client::new();
    for key in keys {
        let value = format!("value of {key}");
        harness::publish_expecting(
            &http,
            &service.base,
            Edit::new(key, version, &value),
            StatusCode::OK,
        )
        .await;
    }
    service.stop().await;
}

/// Runs `hotsplit audit` with `args` to completion.
async fn run_audit(args: Vec<String>) -> (Option<i32>, String, String, Duration) {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
            .arg("audit")
            .args(&args)
            .env_remove("HOTSPLIT_REDIS")
            .env_remove("HOTSPLIT_CONFIG")
            .output()
            .expect("run hotsplit audit");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
            started.elapsed(),
        )
    })
    .await
    .expect("audit thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_reports_exactly_the_stale_copy_on_its_primary_and_replica_and_writes_nothing() {
    let cluster = harness::own_cluster().await;
    let url = cluster.url();
    let keys = ["aud:k0", "aud:k1", "aud:k2", "aud:k3", "aud:k4", "aud:k5"];
    publish(&url, "aud:", 4, &keys, 7).await;

    publish_a_tombstone_and_an_allocated_key(&url).await;

    // One copy stale by hand, on its master: version 7 → 4.
    let stale = "aud:k2#1";
    let (master, replica) = harness::owner_and_replica(&cluster, stale);
    devcluster::cli(master, &["HSET", stale, "ver", "4"]).expect("HSET");
    wait_for_replicas(&cluster).await;

    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "[[family]]\nprefix = \"aud:\"\ncopies = 4\n[[family]]\nprefix = \"alloc:\"\ncopies = 4\nversioning = \"allocated\"\n",
    )
    .unwrap();
    let ports: Vec<u16> = cluster.nodes().iter().map(|node| node.port()).collect();
    let before: Vec<NodeStats> = ports.iter().map(|&port| node_stats(port)).collect();

    let (status, stdout, stderr, took) = run_audit(vec![
        "--redis".into(),
        url.clone(),
        "--config".into(),
        config.path().display().to_string(),
        "--json".into(),
    ])
    .await;
    assert_eq!(status, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    eprintln!("audit of the test cluster took {took:?}");
    assert!(
        stderr.contains("scan:") && stderr.contains("read:"),
        "progress: {stderr}"
    );

    // The same audit in markdown with --fail-on-behind: status 3, the key named.
    let (status, markdown, stderr, _) = run_audit(vec![
        "--redis".into(),
        url.clone(),
        "--copies".into(),
        "4".into(),
        "--prefix".into(),
        "aud:".into(),
        "--fail-on-behind".into(),
    ])
    .await;
    assert_eq!(status, Some(3), "stdout:\n{markdown}\nstderr:\n{stderr}");
    assert!(markdown.contains("| `aud:k2` | 4 | 7 | 3 |"), "{markdown}");

    let after: Vec<NodeStats> = ports.iter().map(|&port| node_stats(port)).collect();
    assert_only_reads_ran(&ports, &before, &after);

    let report: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_report_names_the_stale_copy(&report, master, replica);
}

/// A tombstone and an allocated key (whose version counter `alloc:a#v` is no copy), through a
/// service on `url`.
async fn publish_a_tombstone_and_an_allocated_key(url: &str) {
    let service = harness::Service::start(harness::config_with_family(Some(url), "aud:", 4)).await;
    let http = reqwest::Client::new();
    let answer = http
        .delete(format!("{}/v1/keys/aud:gone?version=9", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer = http
        .put(format!("{}/v1/keys/alloc:a", service.base))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    service.stop().await;
}

/// Nothing was written: no node's dirty counter moved, and every command any node ran
/// meanwhile is a read (the stats reads of this test included); one `HMGET` per copy per node.
fn assert_only_reads_ran(ports: &[u16], before: &[NodeStats], after: &[NodeStats]) {
    for ((port, before), after) in ports.iter().zip(before).zip(after) {
        assert_eq!(
            before.rdb_changes_since_last_save, after.rdb_changes_since_last_save,
            "node {port} changed data"
        );
        for (command, calls) in &after.calls {
            let earlier = before.calls.get(command).copied().unwrap_or(0);
            if *calls > earlier {
                assert!(
                    READ_ONLY_COMMANDS.contains(&command.as_str()),
                    "node {port} ran {command} {} times during the audit",
                    calls - earlier
                );
            }
        }
    }
    let hmget_calls: u64 = after
        .iter()
        .zip(before)
        .map(|(after, before)| {
            after.calls.get("hmget").copied().unwrap_or(0)
                - before.calls.get("hmget").copied().unwrap_or(0)
        })
        .sum();
    // 8 keys × 4 copies on a primary and a replica, then the 7 `aud:` keys again.
    assert_eq!(
        hmget_calls,
        (32 + 32) + (28 + 28),
        "one HMGET per copy per node"
    );
}

/// The JSON report counts the cluster's keys and copies and names the one stale copy, on its
/// primary (`master`) and its `replica`.
fn assert_report_names_the_stale_copy(report: &Value, master: u16, replica: u16) {
    assert_eq!(report["cluster"], true);
    assert_eq!(report["primaries"], 3);
    assert_eq!(report["replicas"], 3);
    assert_eq!(report["unreachable_replicas"], serde_json::json!([]));
    assert_eq!(report["copy_counts"], "config");
    assert_eq!(report["scan_complete"], true);
    assert_eq!(report["keys"], 8, "{report}");
    assert_eq!(report["vanished_keys"], 0);
    assert_eq!(report["inconsistent_keys"], 1);
    for role in ["primary", "replica"] {
        let figures = &report[role];
        assert_eq!(figures["copy_reads"], 32, "{role}: {figures}");
        assert_eq!(figures["failed_reads"], 0, "{role}: {figures}");
        assert_eq!(figures["copies_behind"], 1, "{role}: {figures}");
        assert_eq!(figures["missing_copies"], 0, "{role}: {figures}");
        assert_eq!(figures["inconsistent_reads"], 1, "{role}: {figures}");
        assert_eq!(figures["inconsistency_per_million"], 31_250.0, "{role}");
        assert_eq!(figures["share_behind"], 1.0 / 32.0, "{role}");
        assert_eq!(figures["skew"]["max"], 3, "{role}: {figures}");
        assert_eq!(figures["skew"]["p50"], 0, "{role}: {figures}");
        assert_eq!(figures["skew"]["keys"], 8, "{role}: {figures}");
    }
    let worst = report["worst_keys"].as_array().unwrap();
    assert_eq!(worst.len(), 1, "only the stale key: {worst:?}");
    assert_eq!(worst[0]["key"], "aud:k2");
    assert_eq!(worst[0]["newest"], 7);
    assert_eq!(worst[0]["skew"], 3);
    let lagging: Vec<(u64, String, String, u64)> = worst[0]["lagging"]
        .as_array()
        .unwrap()
        .iter()
        .map(|copy| {
            (
                copy["copy"].as_u64().unwrap(),
                copy["node"].as_str().unwrap().to_owned(),
                copy["role"].as_str().unwrap().to_owned(),
                copy["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lagging,
        [
            (1, format!("127.0.0.1:{master}"), "primary".to_owned(), 4),
            (1, format!("127.0.0.1:{replica}"), "replica".to_owned(), 4),
        ]
    );
}

/// Starts `hotsplit audit --watch`, returns the child, the metrics URL, and the threads
/// draining its stdout and stderr.
struct Watcher {
    child: std::process::Child,
    metrics_url: String,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

fn start_watch(args: &[&str]) -> Watcher {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .arg("audit")
        .args(args)
        .args(["--watch", "200ms", "--metrics-addr", "127.0.0.1:0"])
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hotsplit audit --watch");
    let mut stdout_pipe = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout_pipe.read_to_string(&mut text);
        text
    });
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    let stderr_pipe = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("hotsplit audit: metrics at ") {
                let url = rest.split(',').next().unwrap_or_default().to_owned();
                let _ = address_tx.send(url);
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let metrics_url = address_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the watcher names its metrics address");
    Watcher {
        child,
        metrics_url,
        stdout,
        stderr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_watch_exports_the_stale_copy_as_metrics_and_stops_on_sigterm() {
    let cluster = harness::shared_cluster();
    let url = cluster.url();
    let keys = ["audw:a", "audw:b"];
    publish(&url, "audw:", 3, &keys, 5).await;
    let stale = "audw:b#2";
    let (master, _) = harness::owner_and_replica(cluster, stale);
    devcluster::cli(master, &["HSET", stale, "ver", "2"]).expect("HSET");

    let watcher = start_watch(&["--redis", &url, "--prefix", "audw:", "--json"]);
    let http = reqwest::Client::new();
    let wanted = [
        r#"hotsplit_audit_round_copies_behind{role="primary"} 1"#,
        r#"hotsplit_audit_round_copies_behind{role="replica"} 1"#,
        r#"hotsplit_audit_version_skew_max{role="primary"} 3"#,
        r#"hotsplit_audit_version_skew_max{role="replica"} 3"#,
        r#"hotsplit_audit_copies_behind_ratio{role="primary"} 0.1666"#,
        "hotsplit_audit_inconsistent_keys 1",
        "hotsplit_audit_keys 2",
    ];
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(answer) = http.get(&watcher.metrics_url).send().await {
            last = answer.text().await.unwrap_or_default();
            if wanted.iter().all(|line| last.contains(line)) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never showed the stale copy; last:\n{last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        last.contains(r#"hotsplit_audit_rounds_total{result="ok"}"#),
        "{last}"
    );
    assert!(
        last.contains(r#"hotsplit_audit_copies_behind_total{role="primary"}"#),
        "{last}"
    );

    let Watcher {
        mut child,
        stdout,
        stderr,
        ..
    } = watcher;
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the watcher did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(stderr.contains("round 1:"), "{stderr}");
    let first: Value = serde_json::from_str(stdout.lines().next().expect("a JSON line per round"))
        .expect("JSON line");
    assert_eq!(first["keys"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_exit_statuses_tell_usage_errors_from_connection_failures() {
    let free_port = harness::free_port();
    let (status, _, stderr, took) = run_audit(vec![
        "--redis".into(),
        format!("redis://127.0.0.1:{free_port}"),
    ])
    .await;
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("could not connect to 127.0.0.1:{free_port}")),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(5), "bounded: {took:?}");

    for (args, names) in [
        (vec!["--redis", "http://x"], "--redis"),
        (
            vec!["--redis", "redis://127.0.0.1:1", "--copies", "1"],
            "--copies",
        ),
        (
            vec!["--redis", "redis://127.0.0.1:1", "--prefix", "a{b"],
            "--prefix",
        ),
        (vec!["--copies", "4"], "--redis"),
        (
            vec!["--redis", "redis://127.0.0.1:1", "--watch", "soon"],
            "--watch",
        ),
    ] {
        let (status, _, stderr, _) =
            run_audit(args.iter().map(|arg| (*arg).to_owned()).collect()).await;
        assert_eq!(status, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}
