//! Client-side caching through the Redis door, end to end through clients nobody here wrote:
//! redis-py (`CacheConfig`) and node-redis (`BasicClientSideCache`), both on RESP3, running the
//! scripts `resp_clients/pycache.py` and `resp_clients/nodecache.js` (found as `resp_clients.rs`
//! says) against a `hotsplit serve` on the embedded store and on a 3-master/3-replica cluster.
//!
//! What the door sees is counted from `/metrics` (`hotsplit_resp_commands_total{command="get"}`):
//! cached reads do not reach it, a cached answer is read again once per lease, a publish
//! (through the reading connection or another) is seen by its very next read, a `primary` read is never
//! cached; and readers never go back while their key is healed by the retry queue,
//! read-repaired, split and merged.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hotsplit_devcluster::{self as devcluster, Cluster};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::harness::{self, get, metrics_text, owner_port, poll, publish_expecting, Binary, Edit};
use crate::heal::wait_drained;
use crate::resp_clients::{assert_ok, client, redis_cli, scripts, serve};
use crate::resp_cluster::{store, wait_for_measured_replicas};

/// The classes: `cached` (replica reads, a 1 s lease), `cached10` (a 10 s lease).
const CLASSES: &str = "[classes.cached]\nroute = \"replica\"\nreason = \"client-side caching tests\"\nstaleness_budget = \"10s\"\nnear_cache_max_age = \"1s\"\n[classes.cached10]\nroute = \"replica\"\nreason = \"client-side caching tests, long leases\"\nstaleness_budget = \"30s\"\nnear_cache_max_age = \"10s\"\n";

/// The families (`csl:` named `suffix`: a new family's spread placement switches its reads to
/// the tagged names once, a read repair refills them, and that write invalidates the key once,
/// which the ten-second lease test counts): `csc:` read as `cached`, `csl:` as `cached10`, `csp:` as `primary` (the
/// default class).
const CACHE_FAMILIES: &str = "[[family]]\nprefix = \"csc:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"cached\"\n[[family]]\nprefix = \"csl:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"cached10\"\nplacement = \"suffix\"\n[[family]]\nprefix = \"csp:\"\ncopies = 4\nttl = \"10m\"\n";

/// A client library with client-side caching.
#[derive(Debug, Clone, Copy)]
enum Lib {
    /// redis-py 8.1, `CacheConfig()`.
    Py,
    /// node-redis 5, `BasicClientSideCache`.
    Node,
}

impl Lib {
    /// Its name in messages.
    fn name(self) -> &'static str {
        match self {
            Lib::Py => "redis-py",
            Lib::Node => "node-redis",
        }
    }

    /// The command that runs its script, or `None` (a skip) when it is not installed.
    fn command(self) -> Option<Command> {
        match self {
            Lib::Py => {
                let python = client("HOTSPLIT_REDIS_PY", "redis-py")?;
                let mut command = Command::new(python);
                command.arg(scripts().join("pycache.py"));
                Some(command)
            }
            Lib::Node => {
                let node_path = client("HOTSPLIT_IOREDIS_NODE_PATH", "node-redis")?;
                let found = node_path.join("redis/package.json").exists();
                if !found && std::env::var_os("HOTSPLIT_REQUIRE_RESP_CLIENTS").is_some() {
                    panic!(
                        "node-redis (npm `redis`) is not in {}: scripts/test.sh installs it",
                        node_path.display()
                    );
                }
                if !found {
                    eprintln!(
                        "SKIP: node-redis is not installed in {}",
                        node_path.display()
                    );
                    return None;
                }
                let mut command = Command::new("node");
                command
                    .env("NODE_PATH", node_path)
                    .arg(scripts().join("nodecache.js"));
                Some(command)
            }
        }
    }
}

/// A door under test: the service, its RESP port, the HTTP client and its folder.
struct Door {
    binary: Binary,
    port: u16,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

impl Door {
    /// A door on the embedded store, or on `cluster` (once its replicas' lag is measured: a
    /// replica answer of unknown lag has no lease). `extra` comes first: it may go on with
    /// `[heal]`'s settings.
    async fn start(cluster: Option<&Cluster>, extra: &str) -> Door {
        let dir = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let store = cluster.map(store).unwrap_or_default();
        let config = format!("{extra}{store}{CLASSES}{CACHE_FAMILIES}");
        let (binary, port) = serve(dir.path(), &config).await;
        if cluster.is_some() {
            wait_for_measured_replicas(&http, &binary.base).await;
        }
        Door {
            binary,
            port,
            http,
            dir,
        }
    }

    /// The file whose existence stops the `monotonic` readers.
    fn stop_file(&self) -> std::path::PathBuf {
        self.dir.path().join("stop")
    }

    /// The GETs the door has answered.
    async fn gets(&self) -> u64 {
        counter(
            &metrics_text(&self.http, &self.binary.base).await,
            r#"hotsplit_resp_commands_total{command="get"}"#,
        )
    }

    /// The invalidations pushed when a lease ended.
    async fn lease_pushes(&self) -> u64 {
        counter(
            &metrics_text(&self.http, &self.binary.base).await,
            r#"hotsplit_resp_tracking_invalidations_total{cause="lease"}"#,
        )
    }

    /// `HOTSPLIT.PUBLISH key version value` through `redis-cli`.
    fn publish(&self, key: &str, version: u64, value: &str) {
        let answer = redis_cli(
            self.port,
            &["HOTSPLIT.PUBLISH", key, &version.to_string(), value],
        );
        assert!(answer.contains("done"), "publish {key} {version}: {answer}");
    }

    /// Starts `lib`'s script with `args` after the port; its output when joined.
    fn spawn(&self, mut command: Command, args: &[&str]) -> JoinHandle<Output> {
        command.arg(self.port.to_string()).args(args);
        tokio::task::spawn_blocking(move || command.output().expect("run the client script"))
    }

    /// Joins a script, asserts it printed `ok`, and answers its JSON line.
    async fn finish(&self, lib: Lib, run: JoinHandle<Output>, what: &str) -> Value {
        let output = run.await.expect("join the client script");
        assert_ok(&output, &format!("{} {what}", lib.name()), &self.binary);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout.lines().next().unwrap_or_default();
        serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("{what}: not JSON ({err}): {stdout}"))
    }

    /// Runs `lib`'s script with `args` to its end; its JSON line.
    async fn run(&self, lib: Lib, command: Command, args: &[&str]) -> Value {
        let run = self.spawn(command, args);
        self.finish(lib, run, &args.join(" ")).await
    }
}

impl Drop for Door {
    /// On a failure: shows the service's log, and writes the stop file of the `monotonic`
    /// readers (they would otherwise read on, and the test never end while it waits for them).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::fs::write(self.stop_file(), "");
            eprintln!("hotsplit log:\n{}", self.binary.log_text());
        }
    }
}

/// The value of the sample `name` in a Prometheus text, 0 when absent.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// (a) and (b): ~3.6 s of reads of a hot key with a 1 s lease reach the door fewer than once
/// per twenty reads, yet the first read and at least three re-reads (one after each lease)
/// do: the cache is used, and bounded by the lease without any publish.
async fn cached_reads_stay_off_the_door_and_end_with_their_lease(lib: Lib, on_cluster: bool) {
    let Some(command) = lib.command() else {
        return;
    };
    let door = Door::start(on_cluster.then(harness::shared_cluster), "").await;
    // Keys named after the port: the shared cluster outlives a run.
    let key = format!("csc:hot-{}", door.port);
    door.publish(&key, 1, "v1");
    let before = door.gets().await;
    let done = door.run(lib, command, &["loop", &key, "3.6"]).await;
    let gets = door.gets().await - before;
    let reads = done["reads"].as_u64().expect("reads");
    eprintln!("{}: {reads} reads, {gets} GETs at the door", lib.name());
    assert_eq!(done["value"], "v1", "{done}");
    assert!(
        gets * 20 < reads,
        "{}: {gets} of {reads} reads reached the door (the cache answers the others)\n{}",
        lib.name(),
        door.binary.log_text()
    );
    assert!(
        gets >= 4,
        "{}: {gets} GETs at the door in 3.6 s of reads: the first and one after each 1 s lease expected\n{}",
        lib.name(),
        door.binary.log_text()
    );
}

/// (c) and (d): each of 50 publishes, every other one through the reading connection (its
/// invalidation comes before the publish's reply) and the others through another connection
/// (the publish is answered once the reading connection wrote the invalidation), is answered
/// by the reader's very next reads from its cache; and every read of a key of the `primary`
/// class reaches the door.
async fn publishes_are_seen_at_once_and_primary_reads_never_cached(lib: Lib, on_cluster: bool) {
    let Some(command) = lib.command() else {
        return;
    };
    let door = Door::start(on_cluster.then(harness::shared_cluster), "").await;
    // Keys named after the port: the shared cluster outlives a run.
    let (key, primary) = (
        format!("csc:pub-{}", door.port),
        format!("csp:primary-{}", door.port),
    );
    let done = door.run(lib, command, &["publish", &key, "50"]).await;
    assert_eq!(done["published"], 50, "{done}");

    let Some(command) = lib.command() else {
        return;
    };
    door.publish(&primary, 1, "v1");
    let before = door.gets().await;
    let done = door.run(lib, command, &["loop", &primary, "1"]).await;
    let gets = door.gets().await - before;
    assert_eq!(done["value"], "v1", "{done}");
    assert_eq!(
        Some(gets),
        done["reads"].as_u64(),
        "{}: every read of a primary-class key reaches the door",
        lib.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_cached_reads_stay_off_the_door_and_end_with_their_lease() {
    cached_reads_stay_off_the_door_and_end_with_their_lease(Lib::Py, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redis_cached_reads_stay_off_the_door_and_end_with_their_lease() {
    cached_reads_stay_off_the_door_and_end_with_their_lease(Lib::Node, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_sees_each_publish_at_once_and_never_caches_a_primary_read() {
    publishes_are_seen_at_once_and_primary_reads_never_cached(Lib::Py, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redis_sees_each_publish_at_once_and_never_caches_a_primary_read() {
    publishes_are_seen_at_once_and_primary_reads_never_cached(Lib::Node, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_redis_py_cached_reads_stay_off_the_door_and_end_with_their_lease() {
    cached_reads_stay_off_the_door_and_end_with_their_lease(Lib::Py, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_node_redis_cached_reads_stay_off_the_door_and_end_with_their_lease() {
    cached_reads_stay_off_the_door_and_end_with_their_lease(Lib::Node, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_redis_py_sees_each_publish_at_once_and_never_caches_a_primary_read() {
    publishes_are_seen_at_once_and_primary_reads_never_cached(Lib::Py, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_node_redis_sees_each_publish_at_once_and_never_caches_a_primary_read() {
    publishes_are_seen_at_once_and_primary_reads_never_cached(Lib::Node, true).await;
}

/// (b), long leases: both clients read a key with a 10 s lease for 11.5 s at once. Neither
/// reads it again before its lease ends (the first two lease pushes come at least 9 s after
/// both first reads were seen), and each reads it again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_second_lease_is_read_again_only_when_it_ends() {
    let (Some(py), Some(node)) = (Lib::Py.command(), Lib::Node.command()) else {
        return;
    };
    let door = Door::start(None, "").await;
    door.publish("csl:py", 1, "v1");
    door.publish("csl:node", 1, "v1");
    let (gets, leases) = (door.gets().await, door.lease_pushes().await);
    let py_run = door.spawn(py, &["loop", "csl:py", "11.5"]);
    let node_run = door.spawn(node, &["loop", "csl:node", "11.5"]);
    poll(
        "both clients read once",
        Duration::from_secs(10),
        || async { door.gets().await - gets >= 2 },
    )
    .await;
    let first_reads = Instant::now();
    assert_eq!(
        door.gets().await - gets,
        2,
        "a re-read before any lease ended"
    );
    poll("both leases end", Duration::from_secs(15), || async {
        door.lease_pushes().await - leases >= 2
    })
    .await;
    let lived = first_reads.elapsed();
    assert!(
        lived >= Duration::from_secs(9),
        "the 10 s leases ended {lived:?} after the first reads"
    );
    let py_done = door.finish(Lib::Py, py_run, "loop csl:py").await;
    let node_done = door.finish(Lib::Node, node_run, "loop csl:node").await;
    let gets = door.gets().await - gets;
    eprintln!("10 s lease: {py_done} {node_done}, {gets} GETs at the door");
    assert_eq!(
        gets, 4,
        "each client read its key once, then once after its lease"
    );
}

/// The family whose key moves while it is read: `cse:`, 4 copies read as `cached`, split into 8
/// at 50 reads/s and merged 1 s after it cools; layouts refreshed every 200 ms (`[heal]`).
const MOVING: &str = "layout_interval = \"200ms\"\n[hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\ncool_down = \"400ms\"\n[[family]]\nprefix = \"cse:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"cached\"\nsplit = { mode = \"split\", max_copies = 8, threshold = 50.0, cool_down = \"1s\", max_split_keys = 4, max_splits_per_minute = 10 }\n";

/// A flush (here: the feed's connections killed) while node-redis's read is in flight. Had the
/// flush been the null invalidation, node-redis would empty its cache but keep that read,
/// unindexed, and cache its answer with no expiry where no later push reaches it (one CI run of
/// the heal, repair, split and merge test below, whose feed flushed on silence under load, read
/// `v1` for good that way). The flush pushes the key being read instead: the answer is not
/// kept, the next read reaches the door, and a publish after it is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_while_node_redis_reads_leaves_no_answer_cached_beyond_the_door_s_reach() {
    let Some(node) = Lib::Node.command() else {
        return;
    };
    let cluster = harness::own_cluster_without_failover().await;
    // No near cache: the read waits on its (paused) replica. Feed silences of a loaded machine
    // are not this test's subject (the flush is made by killing the feed's connections): the
    // bound is the `cached` class's lease, the built-in classes' leases raised to allow it.
    let extra = format!(
        "{}[near_cache]\nenabled = false\n[feed]\nmax_silence = \"1s\"\n",
        crate::feed::PATIENT_CLASSES
    );
    let door = Door::start(Some(&cluster), &extra).await;
    crate::feed::wait_feed_up(&door.binary.base).await;
    let key = "csc:inflight";
    door.publish(key, 1, "v1");
    let go = door.dir.path().join("go");
    let go_arg = go.to_str().expect("a UTF-8 path");
    let node_run = door.spawn(node, &["inflight", key, go_arg]);
    poll("node-redis tracks", Duration::from_secs(10), || async {
        counter(
            &metrics_text(&door.http, &door.binary.base).await,
            "hotsplit_resp_tracking_connections",
        ) >= 1
    })
    .await;

    // Every replica holds its clients 1.8 s (under the 2 s command timeout): the read waits.
    // (The door counts a GET when it is answered: the script says when it sent it.)
    let (gets, flushed_before) = (door.gets().await, flushes(&door).await);
    let replicas = cluster.replicas().unwrap();
    for replica in &replicas {
        replica.cli(&["CLIENT", "PAUSE", "1800", "ALL"]).unwrap();
    }
    let paused = Instant::now();
    std::fs::write(&go, "").unwrap();
    let reading = door.dir.path().join("go.reading");
    poll("node-redis reads", Duration::from_secs(5), || async {
        reading.exists()
    })
    .await;
    eprintln!(
        "node-redis sent its read {:?} into the pause",
        paused.elapsed()
    );
    for master in cluster.masters().unwrap() {
        crate::feed::kill_feed_connections(master);
    }
    let killed = paused.elapsed();
    assert!(
        killed < Duration::from_millis(1500),
        "the feed's connections were killed {killed:?} into the pause: too late to be sure the read waits"
    );
    poll("the flush is pushed", Duration::from_secs(5), || async {
        flushes(&door).await > flushed_before
    })
    .await;
    poll(
        "node-redis reads at the door again (it did not keep the answer read across the flush)",
        Duration::from_secs(10),
        || async { door.gets().await > gets + 1 },
    )
    .await;
    door.publish(key, 2, "v2");
    let done = door.finish(Lib::Node, node_run, "inflight").await;
    eprintln!("node-redis across a flush: {done} (the feed killed {killed:?} into the pause)");
    assert_eq!(done["last"].as_u64(), Some(2), "node-redis kept v1: {done}");
}

/// The null invalidations the door pushed.
async fn flushes(door: &Door) -> u64 {
    counter(
        &metrics_text(&door.http, &door.binary.base).await,
        r#"hotsplit_resp_tracking_invalidations_total{cause="flush"}"#,
    )
}

/// The key that moves.
const MOVING_KEY: &str = "cse:k";

/// (e): redis-py and node-redis read `cse:k` (values `v<version>`) from their caches while it
/// is published, healed by the retry queue after a master held its writes, read-repaired
/// after a copy was rolled back behind hotsplit's back, split and merged; neither ever reads
/// a version older than one it read before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_go_back_while_their_key_heals_repairs_splits_and_merges() {
    let (Some(py), Some(node)) = (Lib::Py.command(), Lib::Node.command()) else {
        return;
    };
    let cluster = harness::own_cluster_without_failover().await;
    let door = Door::start(Some(&cluster), MOVING).await;
    // The new family's placement window closes first: closing it deletes the tagged copies that
    // may have missed edits, and had it closed during the repair below (as it did in one CI run,
    // its scan held up by the paused master), the only copy left to read was the rolled-back
    // copy 0, and the floored reads were rightly refused (503). The window is
    // `placement_window`'s subject, not this test's.
    crate::placement_window::wait_window(&door.http, &door.binary.base, "cse:", true).await;
    door.publish(MOVING_KEY, 1, "v1");
    let stop = door.stop_file();
    let stop_arg = stop.to_str().expect("a UTF-8 path");
    let before = door.gets().await;
    let py_run = door.spawn(py, &["monotonic", MOVING_KEY, stop_arg]);
    let node_run = door.spawn(node, &["monotonic", MOVING_KEY, stop_arg]);
    poll("both clients read", Duration::from_secs(10), || async {
        door.gets().await - before >= 2
    })
    .await;

    let version = heal(&door, &cluster, 2).await;
    let version = repair(&door, &cluster, version).await;
    let version = split_and_merge(&door, &cluster, version).await;

    std::fs::write(&stop, "").unwrap();
    for (lib, run) in [(Lib::Py, py_run), (Lib::Node, node_run)] {
        let done = door.finish(lib, run, "monotonic cse:k").await;
        // Error answers (a store node that did not answer while its master held its writes)
        // are counted by the scripts and shown, not failed: they are not reads that went back.
        eprintln!("{}: {done}", lib.name());
        let (last, versions) = (done["last"].as_u64(), done["versions"].as_u64());
        assert!(
            last.is_some_and(|last| last <= version) && versions >= Some(2),
            "{}: read up to v{last:?} ({versions:?} versions) of v1..v{version}",
            lib.name()
        );
    }
}

/// Publishes `version` while the master of `cse:k#0` holds its writes (`CLIENT PAUSE WRITE`):
/// its copies are queued; once it takes writes again the retry queue writes them. Answers the
/// version published last.
async fn heal(door: &Door, cluster: &Cluster, version: u64) -> u64 {
    let victim = owner_port(cluster, &format!("{MOVING_KEY}#0"));
    devcluster::cli(victim, &["CLIENT", "PAUSE", "30000", "WRITE"]).expect("pause");
    let body = format!("v{version}");
    let answer = publish_expecting(
        &door.http,
        &door.binary.base,
        Edit::new(MOVING_KEY, version, &body),
        StatusCode::ACCEPTED,
    )
    .await;
    let answer: Value = answer.json().await.unwrap();
    assert!(answer["queued"].as_u64() >= Some(1), "{answer}");
    devcluster::cli(victim, &["CLIENT", "UNPAUSE"]).expect("unpause");
    wait_drained(&door.http, &door.binary.base).await;
    version
}

/// Rolls `cse:k#0` back to `v1` on its master, behind hotsplit's back, then reads with a floor
/// until a read falls back and repairs it. Answers the version published last.
async fn repair(door: &Door, cluster: &Cluster, version: u64) -> u64 {
    let copy_key = format!("{MOVING_KEY}#0");
    let owner = owner_port(cluster, &copy_key);
    devcluster::cli(owner, &["HSET", &copy_key, "ver", "1", "val", "v1"]).unwrap();
    let base = &door.binary.base;
    poll(
        "a floored read repairs the rolled-back copy",
        Duration::from_secs(10),
        || async {
            for client in 0..16 {
                let url =
                    format!("{base}/v1/keys/{MOVING_KEY}?client=c{client}&min_version={version}");
                assert_eq!(
                    get(&door.http, &url, &[]).await.status(),
                    StatusCode::OK,
                    "{url}"
                );
            }
            let text = metrics_text(&door.http, base).await;
            counter(&text, r#"hotsplit_read_repairs_total{result="applied"}"#) >= 1
        },
    )
    .await;
    version
}

/// Reads `cse:k` hard over HTTP (the cached readers alone do not make it hot: their reads
/// stay off the door) until it is split into 8 copies, publishes while it is split, then
/// stops until it merges, and publishes again. Answers the version published last.
async fn split_and_merge(door: &Door, cluster: &Cluster, version: u64) -> u64 {
    let (http, base) = (&door.http, &door.binary.base);
    let splits = "#hotsplit#splits#cse:";
    let record = || {
        let text = cluster
            .cli(owner_port(cluster, splits), &["HGET", splits, MOVING_KEY])
            .expect("HGET the split record");
        text.trim().to_owned()
    };
    let started = Instant::now();
    while !record().starts_with("8:r:") {
        for client in 0..64 {
            let url = format!("{base}/v1/keys/{MOVING_KEY}?client=c{client}");
            assert_eq!(get(http, &url, &[]).await.status(), StatusCode::OK, "{url}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{MOVING_KEY} never split: {}\n{}",
            record(),
            door.binary.log_text()
        );
    }
    let split = version + 1;
    door.publish(MOVING_KEY, split, &format!("v{split}"));
    poll(
        "cse:k merges once cool",
        Duration::from_secs(30),
        || async { record().is_empty() },
    )
    .await;
    let merged = split + 1;
    door.publish(MOVING_KEY, merged, &format!("v{merged}"));
    merged
}
