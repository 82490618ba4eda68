//! The Redis-protocol door over a 3-master/3-replica cluster, through clients nobody here
//! wrote (redis-py, ioredis, `redis-cli`, `redis-benchmark`; see `resp_clients.rs` for how they
//! are found): publish and reads on RESP2 and RESP3, affinity equal to `GET /v1/affinity` with
//! copies on different masters, an `MGET` across masters, `EXISTS`, `TTL`/`PTTL`, `SET`/`DEL`,
//! an advisory read served by a replica, RESP reads seen by the hot-key detector, and a pool
//! that never goes back while the replica of a copy is paused.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use hotsplit_devcluster::Cluster;
use serde_json::{json, Value};

use crate::harness::{self, get_json, owner_and_replica, owner_port, poll};
use crate::resp_clients::{assert_ok, client, redis_cli, scripts, serve, tool};
use crate::route::hmget_calls;

/// The cluster families: `rcc:` split in 4 (primary class), `rco:` one copy deciding on
/// presence, `rca:` allocated, `rcv:` split in 4 read as `advisory` (from replicas).
const CLUSTER_FAMILIES: &str = "[[family]]\nprefix = \"rcc:\"\ncopies = 4\nttl = \"10m\"\n[[family]]\nprefix = \"rco:\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"decides-on-presence\"\n[[family]]\nprefix = \"rca:\"\ncopies = 4\nversioning = \"allocated\"\n[[family]]\nprefix = \"rcv:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"advisory\"\n";

/// The `[store]` section of a service on `cluster`.
pub(crate) fn store(cluster: &Cluster) -> String {
    format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"{}\"\n",
        cluster.url(),
        harness::command_timeout_toml()
    )
}

/// Polls `/v1/lag` until every one of `cluster`'s three replicas has a measured current lag.
pub(crate) async fn wait_for_measured_replicas(http: &reqwest::Client, base: &str) {
    poll(
        "the lag monitor measured the three replicas",
        Duration::from_secs(15),
        || async {
            let lag = get_json(http, &format!("{base}/v1/lag")).await;
            lag.as_array().is_some_and(|lines| {
                lines.len() == 3 && lines.iter().all(|line| line["lag_ms"]["now"].is_number())
            })
        },
    )
    .await;
}

/// The `field` of a `redis-cli` RESP2 `HOTSPLIT.READ` answer (name, value lines).
fn field<'a>(read: &'a str, name: &str) -> Option<&'a str> {
    let lines: Vec<&str> = read.lines().collect();
    let at = lines.iter().position(|line| *line == name)?;
    lines.get(at + 1).copied()
}

/// `"127.0.0.1:PORT"`, as hotsplit labels a node.
fn label(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_on_a_cluster_reads_the_affine_copy_across_masters_and_a_replica() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let cluster = harness::shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), &format!("{}{CLUSTER_FAMILIES}", store(cluster))).await;
    let http = reqwest::Client::new();

    // The general script (RESP2 and RESP3, pipelines with and without MULTI, a pool) first.
    let output = Command::new(&python)
        .arg(scripts().join("pyclient.py"))
        .arg(port.to_string())
        .output()
        .expect("run python");
    assert_ok(&output, "redis-py on the cluster", &binary);

    // Client ids whose affine copies of `rcc:aff` live on each of the three masters.
    let mut affinity = Vec::new();
    let mut nodes = BTreeSet::new();
    for n in 0..200 {
        let client = format!("client-{n}");
        let named = harness::affinity(&http, &binary.base, "rcc:aff", &client).await;
        let node = named["node"].as_str().expect("a node").to_owned();
        let copy_key = named["copy_key"].as_str().expect("a copy key");
        assert_eq!(node, label(owner_port(cluster, copy_key)), "{named}");
        if nodes.insert(node.clone()) || affinity.len() < 6 {
            affinity.push(
                json!({"client": client, "key": "rcc:aff", "copy": named["copy"], "node": node}),
            );
        }
        if nodes.len() == 3 && affinity.len() >= 6 {
            break;
        }
    }
    assert!(
        nodes.len() >= 2,
        "the copies of rcc:aff on one master: {affinity:?}"
    );
    eprintln!(
        "affine copies of rcc:aff on {} masters: {nodes:?}",
        nodes.len()
    );
    // One-copy keys on three different masters, for one MGET.
    let mut spanning = Vec::new();
    let mut masters = BTreeSet::new();
    for n in 0..200 {
        let key = format!("rco:k{n}");
        let named = harness::affinity(&http, &binary.base, &key, "any").await;
        if masters.insert(named["node"].as_str().expect("a node").to_owned()) {
            spanning.push(key);
        }
        if masters.len() == 3 {
            break;
        }
    }
    assert_eq!(masters.len(), 3, "{spanning:?}");
    let spec = json!({
        "affinity": affinity,
        "spanning": spanning,
        "split": "rcc:ttl",
        "allocated": "rca:setdel",
        "pool": "rcc:pool",
    });
    let output = Command::new(&python)
        .arg(scripts().join("pycluster.py"))
        .arg(port.to_string())
        .arg(spec.to_string())
        .output()
        .expect("run python");
    assert_ok(&output, "redis-py cluster script", &binary);

    // An advisory read is answered by a replica once the lag monitor measured them.
    wait_for_measured_replicas(&http, &binary.base).await;
    let published = redis_cli(port, &["HOTSPLIT.PUBLISH", "rcv:adv", "4", "four"]);
    assert!(published.contains("done"), "{published}");
    let replicas: BTreeSet<String> = cluster
        .replicas()
        .expect("the replicas")
        .iter()
        .map(|node| label(node.port()))
        .collect();
    let mut last = String::new();
    poll(
        "an advisory HOTSPLIT.READ served by a replica",
        Duration::from_secs(15),
        || {
            last = redis_cli(port, &["HOTSPLIT.READ", "rcv:adv"]);
            let served = field(&last, "served_by").unwrap_or_default().to_owned();
            let replica_served = served
                .strip_suffix(";role=replica")
                .is_some_and(|node| replicas.contains(node));
            let value = field(&last, "value") == Some("four");
            async move { replica_served && value }
        },
    )
    .await;
    assert_eq!(field(&last, "version"), Some("4"), "{last}");
    assert!(
        field(&last, "route").is_some_and(|route| route.starts_with("class=advisory")),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ioredis_on_a_cluster_passes_its_ready_check_reads_and_pipelines() {
    let Some(node_path) = client("HOTSPLIT_IOREDIS_NODE_PATH", "ioredis") else {
        return;
    };
    let cluster = harness::shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), &store(cluster)).await;
    let output = Command::new("node")
        .env("NODE_PATH", node_path)
        .arg(scripts().join("ioclient.js"))
        .arg(port.to_string())
        .output()
        .expect("run node");
    assert_ok(&output, "ioredis on the cluster", &binary);
}

/// The entry of `key` in the instance part of a `/v1/hot-keys` answer, if any.
fn hot_entry<'a>(answer: &'a Value, key: &str) -> Option<&'a Value> {
    answer["instance"]["keys"]
        .as_array()?
        .iter()
        .find(|entry| entry["key"] == key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_reads_are_seen_by_the_hot_key_detector() {
    let (Some(_), Some(_)) = (tool("redis-cli"), tool("redis-benchmark")) else {
        return;
    };
    let cluster = harness::shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{}[hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\ncool_down = \"400ms\"\n{CLUSTER_FAMILIES}",
        store(cluster)
    );
    let (binary, port) = serve(dir.path(), &extra).await;
    let http = reqwest::Client::new();
    let published = redis_cli(port, &["HOTSPLIT.PUBLISH", "rcv:hot", "1", "hot"]);
    assert!(published.contains("done"), "{published}");
    let started = std::time::Instant::now();
    let view = loop {
        let output = Command::new("redis-benchmark")
            .args(["-p", &port.to_string(), "-n", "5000", "-c", "8", "-q"])
            .args(["GET", "rcv:hot"])
            .output()
            .expect("run redis-benchmark");
        assert!(
            output.status.success(),
            "redis-benchmark: {output:?}\n{}",
            binary.log_text()
        );
        let view = get_json(&http, &format!("{}/v1/hot-keys", binary.base)).await;
        if hot_entry(&view, "rcv:hot").is_some_and(|entry| entry["hot"] == true) {
            break view;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "rcv:hot read through RESP never found hot: {view}"
        );
    };
    let hot = hot_entry(&view, "rcv:hot").expect("listed");
    assert_eq!(hot["family"], "rcv:", "{hot}");
    assert_eq!(hot["copies"], 4, "{hot}");
    assert!(
        hot["rate"].as_f64().is_some_and(|rate| rate >= 50.0),
        "{hot}"
    );
}

/// A long-budget replica class (`lenient`, 30 s) and its family `rcl:`: the paused replica stays
/// within budget, so only the instance's high-water keeps its old copies from being answered.
const LENIENT: &str = "[classes.lenient]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"30s\"\n[[family]]\nprefix = \"rcl:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"lenient\"\n";

/// Monotonic reads and read-your-writes through redis-py pools of 8 connections (no client
/// id) on a cluster, near cache off (every read reaches Redis), of an `advisory` key and a
/// `lenient` key with a copy on the same master, while that master's replica holds back
/// replication (`CLIENT PAUSE WRITE`: it answers reads with what it had), then is stopped
/// (SIGSTOP). Every pooled GET after a publish answers that version, never an older one.
/// Without the instance's high-water as each read's floor the held-back phase fails (tried:
/// "published 6, a pooled read answered 5" on the lenient key); in the runs tried the paused
/// replica served reads in that phase (its `HMGET` count grew, printed), so the floor kept them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_on_a_cluster_never_goes_back_while_a_replica_is_paused() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let cluster = harness::own_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{}[near_cache]\nenabled = false\n{LENIENT}{CLUSTER_FAMILIES}",
        store(&cluster)
    );
    let (binary, port) = serve(dir.path(), &extra).await;
    let http = reqwest::Client::new();
    wait_for_measured_replicas(&http, &binary.base).await;
    let copy_key = |named: Value| named["copy_key"].as_str().expect("a copy key").to_owned();
    let advisory = copy_key(harness::affinity(&http, &binary.base, "rcv:pool", "x").await);
    let (master_port, replica_port) = owner_and_replica(&cluster, &advisory);
    // A lenient key whose copy read by client "x" lives on the same master.
    let mut lenient = None;
    for n in 0..200 {
        let key = format!("rcl:pool{n}");
        let named = copy_key(harness::affinity(&http, &binary.base, &key, "x").await);
        if owner_port(&cluster, &named) == master_port {
            lenient = Some(key);
            break;
        }
    }
    let lenient = lenient.expect("a lenient key with a copy on the paused replica's master");
    let keys = ["rcv:pool", lenient.as_str()];
    let replica = cluster.node(replica_port).expect("the replica's node");
    let pools = |first: u32, last: u32| {
        keys.map(|key| {
            Command::new(&python)
                .arg(scripts().join("pypool.py"))
                .args([port.to_string(), key.to_owned()])
                .args([first.to_string(), last.to_string()])
                .output()
                .expect("run python")
        })
    };
    let start = hmget_calls(replica_port);
    let running = pools(1, 5);
    for output in &running {
        assert_ok(output, "a pool with the replicas running", &binary);
    }
    let before = hmget_calls(replica_port);
    // The replica answers reads but applies no replication: the copies it holds stay at 5.
    replica
        .cli(&["CLIENT", "PAUSE", "20000", "WRITE"])
        .expect("CLIENT PAUSE");
    let held_back = pools(6, 15);
    let during = hmget_calls(replica_port);
    replica.pause().expect("SIGSTOP the replica");
    let stopped = pools(16, 20);
    replica.resume().expect("SIGCONT the replica");
    replica.cli(&["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    eprintln!(
        "reads served by the paused replica: {} while running, {} while held back",
        before - start,
        during - before
    );
    for output in held_back.iter().chain(&stopped) {
        assert_ok(
            output,
            "a pool with the replica held back or stopped",
            &binary,
        );
    }
}
