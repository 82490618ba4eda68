//! Network partitions, for real: a Redis Cluster (3 masters, 3 replicas, `cluster-node-timeout
//! 2000`) and two `hotsplit serve` instances, A and B, each in its own network namespace
//! (`hotsplit_devcluster::Topology`), cut with nftables. The test's own clients run in the
//! driver's namespace, which both sides of every cut still reach (clients at the edge).
//!
//! The split brain: the master owning a one-copy key is isolated together with A while A
//! publishes, the majority promotes its replica, the partition heals and the old master
//! rejoins as a replica of the promoted one, dropping what it took alone. Measured: publishes
//! acknowledged and lost (without the rule, and under it: the family's `sync_replicas = 1`, an
//! answer whose every line says `replicas_acked >= 1`), monotonic reads of a reader with an explicit client
//! id and of a session-token reader, convergence, and the partition in `/v1/lag`.
//!
//! Further scenarios: an instance cut from one master, a master cut from its replica, flapping
//! cuts, the split brain on a 4-copy family, and an instance cut from the master holding the
//! registry records.
//!
//! Needs root (namespaces): skipped with a message elsewhere, failed (never skipped) when `CI`
//! is set.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hotsplit_devcluster::{
    namespaces_or_skip, Host, NetCluster, NetClusterOptions, NetNode, Partition, Process, Topology,
};
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{command_timeout_toml, spool_dir};

/// The key of the one-copy family `sb:` the split brain publishes to (`sp:` has 4 copies).
const KEY: &str = "sb:post";

/// The HTTP port of every instance, in its own namespace.
pub(crate) const HTTP_PORT: u16 = 8080;

/// How long A publishes while it and the key's master are cut off.
const CUT_PUBLISHING: Duration = Duration::from_millis(1500);

/// `WAIT`'s bound in a synced family (`sync_timeout`).
const SYNC_TIMEOUT_MS: u64 = 100;

/// A `hotsplit serve` in `host`'s namespace on the cluster at `redis_url`.
pub(crate) struct Instance {
    /// The process (SIGKILLed when dropped).
    process: Process,
    /// `http://<ip>:8080`.
    pub(crate) base: String,
}

impl Instance {
    /// Starts it, with its config and log under `dir` (with `synced`, the family's publishes
    /// wait for a replica: `sync_replicas = 1`); does not wait.
    fn spawn(host: &Host, redis_url: &str, dir: &Path, synced: bool) -> Instance {
        let config = format!(
            "[server]\nlisten = \"{ip}:{HTTP_PORT}\"\nshutdown_grace = \"1s\"\nallow_unauthenticated = true\n\
             [store]\nredis = \"{redis_url}\"\ncommand_timeout = \"{timeout}\"\n\
             [heal]\nspool_dir = \"{spool}\"\n\
             [fleet]\nheartbeat_interval = \"1s\"\n\
             [[family]]\nprefix = \"sb:\"\ncopies = 1\nttl = \"10m\"\n{sync}\
             [[family]]\nprefix = \"sp:\"\ncopies = 4\nttl = \"10m\"\n{sync}",
            sync = if synced {
                format!("sync_replicas = 1\nsync_timeout = \"{SYNC_TIMEOUT_MS}ms\"\n")
            } else {
                String::new()
            },
            ip = host.ip(),
            timeout = command_timeout_toml(),
            spool = spool_dir().display(),
        );
        Instance::with_config(host, dir, &config)
    }

    /// Starts it with `config` (whose `[server] listen` must be `<ip>:8080`), its config file
    /// and log under `dir`; does not wait.
    pub(crate) fn with_config(host: &Host, dir: &Path, config: &str) -> Instance {
        let name = host.name();
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config)
            .unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        let process = host
            .command(env!("CARGO_BIN_EXE_hotsplit"))
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .env_remove("HOTSPLIT_REDIS")
            .env_remove("HOTSPLIT_LISTEN")
            .env_remove("HOTSPLIT_CONFIG")
            .env_remove("HOTSPLIT_LOG_FORMAT")
            .env("HOTSPLIT_LOG", "info")
            .spawn(dir.join(format!("{name}.log")))
            .unwrap_or_else(|err| panic!("start hotsplit in {name}: {err}"));
        Instance {
            process,
            base: format!("http://{}:{HTTP_PORT}", host.ip()),
        }
    }

    /// Its log so far, for a failure message.
    pub(crate) fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// Polls `/readyz` (from the driver's namespace) until it answers 2xx.
    pub(crate) async fn wait_ready(&mut self, http: &reqwest::Client) {
        let url = format!("{}/readyz", self.base);
        let mut readiness = self
            .process
            .readiness("hotsplit serves /readyz", Duration::from_secs(30));
        loop {
            let last = match http.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => return,
                Ok(answer) => answer.status().to_string(),
                Err(err) => format!("no answer: {err}"),
            };
            if let Err(failure) = readiness.not_yet(&last) {
                panic!("{failure}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One publish during the cut: its version, status and whether every line had a replica ack.
#[derive(Debug)]
struct Published {
    /// The version sent.
    version: u64,
    /// The HTTP status.
    status: u16,
    /// Every outcome line says `replicas_acked >= 1` (only with `sync_replicas`).
    replica_acked: bool,
}

/// A reader that must never go back: the highest version it was served, and what went wrong.
#[derive(Debug, Default)]
struct Reader {
    /// The highest version served so far.
    floor: u64,
    /// Reads answered 200.
    served: usize,
    /// Reads refused (503 or other non-200).
    refused: usize,
    /// Each time a 200 carried a version below `floor`.
    violations: Vec<String>,
    /// The last session token, for a session reader.
    token: Option<String>,
    /// The last refusal's body.
    last_refusal: Option<(u16, String)>,
}

impl Reader {
    /// Records one answer.
    async fn record(&mut self, answer: reqwest::Response) {
        if let Some(token) = answer.headers().get("hotsplit-session") {
            self.token = token.to_str().ok().map(str::to_owned);
        }
        let status = answer.status();
        if status != StatusCode::OK {
            self.refused += 1;
            let body = answer.text().await.unwrap_or_default();
            self.last_refusal = Some((status.as_u16(), body));
            return;
        }
        let version: u64 = answer
            .headers()
            .get("hotsplit-version")
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("no Hotsplit-Version: {:?}", answer.headers()));
        self.served += 1;
        if version < self.floor {
            self.violations
                .push(format!("served v{version} after v{}", self.floor));
        }
        self.floor = self.floor.max(version);
    }
}

/// What one split-brain run measured.
#[derive(Debug)]
struct SplitBrain {
    /// The publish of version 1, before the cut.
    before_cut: Published,
    /// Every publish A answered during the cut.
    published: Vec<Published>,
    /// The version every copy holds once converged after the heal.
    converged: u64,
    /// The explicit-client reader of A.
    client_reader: Reader,
    /// The session-token reader of A.
    session_reader: Reader,
    /// The highest `now` lag A reported for the isolated master's replica during the cut, ms.
    cut_lag_ms: f64,
    /// How long the majority took to promote the replica.
    failover: Duration,
    /// From the heal to every copy converged (and A reading it).
    converge: Duration,
}

impl SplitBrain {
    /// Publishes A answered 2xx whose version is above what survived: (acknowledged under the
    /// rule, answered 2xx).
    fn lost(&self) -> (Vec<u64>, Vec<u64>) {
        let lost = |acknowledged: &dyn Fn(&Published) -> bool| {
            self.published
                .iter()
                .filter(|p| acknowledged(p) && p.version > self.converged)
                .map(|p| p.version)
                .collect::<Vec<_>>()
        };
        (
            lost(&|p| p.status == 200 && p.replica_acked),
            lost(&|p| (200..300).contains(&p.status)),
        )
    }
}

/// The last lines of a log, for a failure message.
fn a_log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// PUT `version` of the key through `base` (a synced family waits for its replica itself).
async fn publish(http: &reqwest::Client, base: &str, version: u64) -> Published {
    let url = format!("{base}/v1/keys/{KEY}?version={version}");
    let answer = http
        .put(&url)
        .body(format!("v{version}"))
        .send()
        .await
        .unwrap_or_else(|err| panic!("PUT {url}: {err}"));
    let status = answer.status().as_u16();
    let report: Value = answer.json().await.unwrap_or(Value::Null);
    let replica_acked = report["outcomes"].as_array().is_some_and(|lines| {
        !lines.is_empty()
            && lines
                .iter()
                .all(|line| line["replicas_acked"].as_u64().is_some_and(|n| n >= 1))
    });
    Published {
        version,
        status,
        replica_acked,
    }
}

/// Reads the key through `base` as the explicit client `r1`.
async fn client_read(http: &reqwest::Client, base: &str, reader: &mut Reader) {
    let url = format!("{base}/v1/keys/{KEY}?client=r1");
    match http.get(&url).send().await {
        Ok(answer) => reader.record(answer).await,
        Err(_) => reader.refused += 1,
    }
}

/// Reads the key through `base` carrying the session reader's token.
async fn session_read(http: &reqwest::Client, base: &str, reader: &mut Reader) {
    let mut request = http.get(format!("{base}/v1/keys/{KEY}?client=s1"));
    if let Some(token) = &reader.token {
        request = request.header("hotsplit-session", token);
    }
    match request.send().await {
        Ok(answer) => reader.record(answer).await,
        Err(_) => reader.refused += 1,
    }
}

/// The version a read of copy 0 of the key through `base` is served (no floor), or why not.
async fn read_version(http: &reqwest::Client, base: &str) -> Result<u64, String> {
    let answer = http
        .get(format!("{base}/v1/keys/{KEY}?copy=0"))
        .send()
        .await
        .map_err(|err| err.to_string())?;
    let version = answer
        .headers()
        .get("hotsplit-version")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok());
    match version {
        Some(version) => Ok(version),
        None => Err(format!(
            "{}: {}",
            answer.status(),
            answer.text().await.unwrap_or_default()
        )),
    }
}

/// The highest `lag_ms.now` `base` reports for `replica` (`ip:port`), 0 when not listed.
async fn lag_now_ms(http: &reqwest::Client, base: &str, replica: &str) -> f64 {
    let Ok(answer) = http.get(format!("{base}/v1/lag")).send().await else {
        return 0.0;
    };
    let lines: Value = answer.json().await.unwrap_or(Value::Null);
    lines
        .as_array()
        .into_iter()
        .flatten()
        .filter(|line| line["replica"] == replica)
        .filter_map(|line| line["lag_ms"]["now"].as_f64())
        .fold(0.0, f64::max)
}

/// Runs the split brain once; `synced`: the family waits for a replica (`sync_replicas = 1`).
fn split_brain(synced: bool) -> SplitBrain {
    let options = NetClusterOptions::default();
    let topology = Topology::start(3, 2, &options).expect("start the namespaced cluster");
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = topology.cluster.url();
    let mut a = Instance::spawn(&topology.instances[0], &url, dir.path(), synced);
    let mut b = Instance::spawn(&topology.instances[1], &url, dir.path(), synced);
    let runtime = runtime();
    let outcome = topology.driver.run(|| {
        runtime.block_on(async {
            let http = http_client();
            a.wait_ready(&http).await;
            b.wait_ready(&http).await;
            let cluster = &topology.cluster;
            // The copy key of a one-copy family is `K#0`; its slot decides the master.
            let master = cluster
                .master_for_key(format!("{KEY}#0").as_bytes())
                .expect("the key's master");
            let replica = cluster.replicas_of(master).expect("its replica")[0];
            let replica_addr = replica.addr();
            let replica_ip = replica.host().ip().to_string();

            let first = publish(&http, &a.base, 1).await;
            assert_eq!(first.status, 200, "{first:?}");
            let mut client_reader = Reader::default();
            let mut session_reader = Reader::default();
            client_read(&http, &a.base, &mut client_reader).await;
            session_read(&http, &a.base, &mut session_reader).await;
            assert_eq!((client_reader.floor, session_reader.floor), (1, 1));

            // Cut the master and A from every other node and instance; the driver reaches all.
            let network = &topology.network;
            let cut = isolating(&topology, master);
            network.apply(&cut).expect("apply the cut");
            let cut_at = Instant::now();
            let mut published = Vec::new();
            let mut version = 2;
            let mut cut_lag_ms: f64 = 0.0;
            while cut_at.elapsed() < CUT_PUBLISHING {
                published.push(publish(&http, &a.base, version).await);
                version += 1;
                client_read(&http, &a.base, &mut client_reader).await;
                session_read(&http, &a.base, &mut session_reader).await;
            }
            cut_lag_ms = cut_lag_ms.max(lag_now_ms(&http, &a.base, &replica_addr).await);
            let promoted = cluster.wait_until(
                Duration::from_secs(30),
                "the replica to be promoted",
                |view| {
                    view.iter().any(|info| {
                        info.host == replica_ip && info.is_master() && !info.slots.is_empty()
                    })
                },
            );
            let failover = cut_at.elapsed();
            cut_lag_ms = cut_lag_ms.max(lag_now_ms(&http, &a.base, &replica_addr).await);
            network.heal().expect("heal");
            promoted.expect("the majority promotes the isolated master's replica");
            let healed_at = Instant::now();
            cluster
                .wait_healthy(Duration::from_secs(60))
                .expect("the cluster heals");
            // Converged: the promoted master and its replica (the old master) hold one version,
            // A's retry queue is empty, and B reads that version.
            let converged = wait_converged(
                &http,
                &topology,
                (master, replica),
                [&a.base, &b.base],
                healed_at,
            )
            .await;
            let converge = healed_at.elapsed();
            // After the heal: the readers of A read again, a few times each.
            for _ in 0..5 {
                client_read(&http, &a.base, &mut client_reader).await;
                session_read(&http, &a.base, &mut session_reader).await;
            }
            SplitBrain {
                before_cut: first,
                published,
                converged,
                client_reader,
                session_reader,
                cut_lag_ms,
                failover,
                converge,
            }
        })
    });
    let outcome = outcome.expect("join the driver's namespace");
    let log_a = a.process.log_text();
    drop((a, b));
    print_split_brain(synced, &outcome);
    assert_refusals_name_the_rollback(&outcome, &log_a);
    outcome
}

/// Whenever the readers of a split brain were served more than the copies hold after the heal,
/// their refusals name the cause (whether the client reader's seen floor, still inside the
/// family's pin window, or the rollback guard refused it), and A's log (`log_a`) names the
/// rollback.
fn assert_refusals_name_the_rollback(outcome: &SplitBrain, log_a: &str) {
    if outcome.converged < outcome.client_reader.floor {
        assert!(
            log_a.contains("a copy went back below a version this instance served"),
            "A refused no reader for the rollback, or did not log it: {}",
            a_log_tail(log_a)
        );
    }
    let readers = [
        (
            "client",
            &outcome.client_reader,
            "the copies were set back below version",
        ),
        (
            "session",
            &outcome.session_reader,
            "this session's token holds version",
        ),
    ];
    for (name, reader, cause) in readers {
        if outcome.converged < reader.floor {
            assert!(
                reader
                    .last_refusal
                    .as_ref()
                    .is_some_and(|(_, body)| body.contains(cause)),
                "the {name} reader's last refusal does not say {cause:?}: {reader:?}"
            );
        }
    }
}

/// Prints the figures of one split-brain run (`synced`: the family waits for a replica).
fn print_split_brain(synced: bool, outcome: &SplitBrain) {
    eprintln!(
        "split brain (synced: {synced}): {} publishes during the cut, converged at v{}, failover after {:?}, converged {:?} after the heal, lag seen {:.0} ms; lost (acknowledged, answered): {:?}; client reader {:?}; session reader {:?}",
        outcome.published.len(),
        outcome.converged,
        outcome.failover,
        outcome.converge,
        outcome.cut_lag_ms,
        outcome.lost(),
        outcome.client_reader,
        outcome.session_reader,
    );
}

/// The cut that isolates `master` and instance A from every other node and instance; the
/// driver reaches all.
fn isolating(topology: &Topology, master: &NetNode) -> Partition {
    let inside = [master.host(), &topology.instances[0]];
    let mut cut = Partition::default();
    for host in topology.network.hosts() {
        if inside.contains(&host) || host == &topology.driver {
            continue;
        }
        for member in inside {
            cut = cut.and(Partition::cut(member, host));
        }
    }
    cut
}

/// Waits until the promoted master (`replica`) and its replica (the old `master`) hold one
/// version, A's retry queue is empty, and both instances (`bases`: A, B) read that version;
/// returns it.
async fn wait_converged(
    http: &reqwest::Client,
    topology: &Topology,
    (master, replica): (&NetNode, &NetNode),
    bases: [&str; 2],
    healed_at: Instant,
) -> u64 {
    let cluster = &topology.cluster;
    loop {
        let copy_key = format!("{KEY}#0");
        let on_new = cluster.cli(replica, &["HGET", &copy_key, "ver"]);
        let old_link = cluster.cli(master, &["INFO", "replication"]);
        let old_synced = old_link.as_ref().is_ok_and(|info| {
            info.contains("role:slave") && info.contains("master_link_status:up")
        });
        let queue: Value = match http
            .get(format!("{}/v1/retry-queue", bases[0]))
            .send()
            .await
        {
            Ok(answer) => answer.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let queued = queue["depth"].as_u64().unwrap_or(1);
        let via_b = read_version(http, bases[1]).await;
        let via_a = read_version(http, bases[0]).await;
        let held = on_new
            .as_ref()
            .ok()
            .and_then(|text| text.parse::<u64>().ok());
        if old_synced
            && queued == 0
            && held.is_some()
            && held == via_b.as_ref().ok().copied()
            && held == via_a.as_ref().ok().copied()
        {
            return held.unwrap_or(0);
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(60),
            "no convergence: new master holds {on_new:?}, old master synced {old_synced}, B reads {via_b:?}, A reads {via_a:?}, A's queue {queue}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The current-thread runtime a test drives its clients with, inside the driver's namespace.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The HTTP client of a test's driver: every request bounded, so a cut shows as an error.
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// Three masters with a replica each, and `instances` hotsplit hosts, in namespaces.
pub(crate) fn topology(instances: usize) -> Topology {
    Topology::start(3, instances, &NetClusterOptions::default())
        .expect("start the namespaced cluster")
}

#[test]
fn partition_split_brain_without_the_rule_loses_answered_publishes_but_no_reader_goes_back() {
    if !namespaces_or_skip("partition_split_brain_without_the_rule") {
        return;
    }
    let run = split_brain(false);
    let (_, answered_lost) = run.lost();
    assert!(
        !answered_lost.is_empty(),
        "without the rule the split brain should lose publishes A answered: {run:?}"
    );
    assert!(
        run.cut_lag_ms > 1000.0,
        "the cut is not visible in A's /v1/lag: {run:?}"
    );
    for reader in [&run.client_reader, &run.session_reader] {
        assert!(
            reader.violations.is_empty(),
            "a reader went back: {reader:?}"
        );
    }
}

#[test]
fn partition_split_brain_under_the_rule_loses_no_acknowledged_publish() {
    if !namespaces_or_skip("partition_split_brain_under_the_rule") {
        return;
    }
    let run = split_brain(true);
    let (acknowledged_lost, answered_lost) = run.lost();
    assert!(
        acknowledged_lost.is_empty(),
        "acknowledged publishes lost: {acknowledged_lost:?}"
    );
    // The caller tells the two apart: before the cut the replica acknowledged; during it, A
    // answered with `replicas_acked: 0`, and those are the publishes the failover dropped.
    assert!(run.before_cut.replica_acked, "{:?}", run.before_cut);
    assert!(
        !answered_lost.is_empty(),
        "the cut lost nothing, so it proved nothing: {run:?}"
    );
    assert!(
        run.cut_lag_ms > 1000.0,
        "the cut is not visible in A's /v1/lag: {run:?}"
    );
    for reader in [&run.client_reader, &run.session_reader] {
        assert!(
            reader.violations.is_empty(),
            "a reader went back: {reader:?}"
        );
    }
}

/// An instance cut from the master of a one-copy key (both ways; the master stays in the
/// majority, so nothing fails over) while it publishes and reads the key, then healed.
#[test]
fn partition_an_instance_cut_from_one_master_queues_and_converges_with_nothing_lost() {
    if !namespaces_or_skip("partition_an_instance_cut_from_one_master") {
        return;
    }
    let topology = topology(1);
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut a = Instance::spawn(
        &topology.instances[0],
        &topology.cluster.url(),
        dir.path(),
        false,
    );
    let runtime = runtime();
    let (published, reader, converged, converge) = topology
        .driver
        .run(|| {
            runtime.block_on(async {
                let http = http_client();
                a.wait_ready(&http).await;
                let master = topology
                    .cluster
                    .master_for_key(format!("{KEY}#0").as_bytes())
                    .expect("the key's master");
                assert_eq!(publish(&http, &a.base, 1).await.status, 200);
                let mut reader = Reader::default();
                client_read(&http, &a.base, &mut reader).await;
                topology
                    .network
                    .apply(&Partition::cut(&topology.instances[0], master.host()))
                    .expect("cut");
                let cut_at = Instant::now();
                let mut published = Vec::new();
                let mut version = 2;
                while cut_at.elapsed() < Duration::from_secs(3) {
                    published.push(publish(&http, &a.base, version).await);
                    version += 1;
                    client_read(&http, &a.base, &mut reader).await;
                }
                topology.network.heal().expect("heal");
                let healed_at = Instant::now();
                let last = version - 1;
                let converged = loop {
                    let queue: Value =
                        match http.get(format!("{}/v1/retry-queue", a.base)).send().await {
                            Ok(answer) => answer.json().await.unwrap_or(Value::Null),
                            Err(_) => Value::Null,
                        };
                    let held = read_version(&http, &a.base).await;
                    if queue["depth"].as_u64() == Some(0) && held == Ok(last) {
                        break last;
                    }
                    assert!(
                        healed_at.elapsed() < Duration::from_secs(30),
                        "no convergence to v{last}: A reads {held:?}, its queue {queue}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                let converge = healed_at.elapsed();
                for _ in 0..3 {
                    client_read(&http, &a.base, &mut reader).await;
                }
                (published, reader, converged, converge)
            })
        })
        .expect("join the driver's namespace");
    let answered = published
        .iter()
        .filter(|p| (200..300).contains(&p.status))
        .count();
    let queued = published.iter().filter(|p| p.status == 202).count();
    eprintln!(
        "instance cut from one master: {} publishes during the cut ({answered} answered 2xx, {queued} queued), reads {} served / {} refused, converged at v{converged} {converge:?} after the heal",
        published.len(),
        reader.served,
        reader.refused,
    );
    assert!(
        queued > 0,
        "no publish was queued, so the cut did nothing: {published:?}"
    );
    // Every publish answered 2xx survives: the queued ones land once the cut heals.
    let lost: Vec<u64> = published
        .iter()
        .filter(|p| (200..300).contains(&p.status) && p.version > converged)
        .map(|p| p.version)
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(reader.violations.is_empty(), "{reader:?}");
    assert!(
        reader.floor >= converged,
        "the reader reads the converged version: {reader:?}"
    );
}

/// The `master_repl_offset` a node reports, if it answers.
fn repl_offset(
    cluster: &hotsplit_devcluster::NetCluster,
    node: &hotsplit_devcluster::NetNode,
) -> Option<u64> {
    let info = cluster.cli(node, &["INFO", "replication"]).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("master_repl_offset:"))
        .and_then(|offset| offset.trim().parse().ok())
}

/// A master cut from its replica (the majority still reaches both, so nothing fails over) while
/// a synced family publishes: the answers say `replicas_acked: 0` during the cut, 1 before and
/// after, nothing answered is lost, and the replica catches up after the heal.
#[test]
fn partition_a_master_cut_from_its_replica_answers_unacknowledged_and_catches_up() {
    if !namespaces_or_skip("partition_a_master_cut_from_its_replica") {
        return;
    }
    let topology = topology(1);
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut a = Instance::spawn(
        &topology.instances[0],
        &topology.cluster.url(),
        dir.path(),
        true,
    );
    let runtime = runtime();
    topology
        .driver
        .run(|| {
            runtime.block_on(async {
                let http = http_client();
                a.wait_ready(&http).await;
                let cluster = &topology.cluster;
                let master = cluster
                    .master_for_key(format!("{KEY}#0").as_bytes())
                    .expect("the key's master");
                let replica = cluster.replicas_of(master).expect("its replica")[0];
                let before = publish(&http, &a.base, 1).await;
                assert!(before.status == 200 && before.replica_acked, "{before:?}");
                topology
                    .network
                    .apply(&Partition::cut(master.host(), replica.host()))
                    .expect("cut");
                let cut_at = Instant::now();
                let mut during = Vec::new();
                let mut version = 2;
                let mut reader = Reader::default();
                // Shorter than cluster-node-timeout (2 s): the replica never starts a failover.
                while cut_at.elapsed() < Duration::from_millis(1200) {
                    during.push(publish(&http, &a.base, version).await);
                    version += 1;
                    client_read(&http, &a.base, &mut reader).await;
                }
                topology.network.heal().expect("heal");
                let healed_at = Instant::now();
                loop {
                    let (on_master, on_replica) =
                        (repl_offset(cluster, master), repl_offset(cluster, replica));
                    if on_master.is_some() && on_master == on_replica {
                        break;
                    }
                    assert!(
                        healed_at.elapsed() < Duration::from_secs(30),
                        "the replica never caught up: master {on_master:?}, replica {on_replica:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // TCP retransmits what the cut dropped with backoff: acknowledgements resume
                // within a few seconds of the heal.
                let after = loop {
                    let after = publish(&http, &a.base, version).await;
                    if after.replica_acked || healed_at.elapsed() > Duration::from_secs(10) {
                        break after;
                    }
                    version += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                let held = read_version(&http, &a.base).await;
                client_read(&http, &a.base, &mut reader).await;
                eprintln!(
                    "master cut from its replica: {} publishes during the cut, {} acknowledged; acknowledging again {:?} after the heal; reads {} served / {} refused",
                    during.len(),
                    during.iter().filter(|p| p.replica_acked).count(),
                    healed_at.elapsed(),
                    reader.served,
                    reader.refused,
                );
                assert!(!during.is_empty());
                assert!(
                    during.iter().all(|p| p.status == 200),
                    "the master kept taking writes: {during:?}"
                );
                // WAIT cannot reach the cut replica, so no answer during the cut claims it.
                assert!(
                    during.iter().all(|p| !p.replica_acked),
                    "acknowledged across the cut: {during:?}"
                );
                assert!(after.status == 200 && after.replica_acked, "{after:?}");
                assert_eq!(held, Ok(version), "nothing answered was lost");
                assert!(reader.violations.is_empty(), "{reader:?}");
            })
        })
        .expect("join the driver's namespace");
}

/// Flapping: an instance cut from the key's master and healed every 250 ms for 3 s while it
/// publishes and reads; afterwards every answered publish is readable and no reader went back.
#[test]
fn partition_flapping_cuts_lose_nothing_answered_and_no_reader_goes_back() {
    if !namespaces_or_skip("partition_flapping_cuts") {
        return;
    }
    let topology = topology(1);
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut a = Instance::spawn(
        &topology.instances[0],
        &topology.cluster.url(),
        dir.path(),
        false,
    );
    let runtime = runtime();
    topology
        .driver
        .run(|| {
            runtime.block_on(async {
                let http = http_client();
                a.wait_ready(&http).await;
                let master = topology
                    .cluster
                    .master_for_key(format!("{KEY}#0").as_bytes())
                    .expect("the key's master");
                let cut = Partition::cut(&topology.instances[0], master.host());
                let mut reader = Reader::default();
                let mut published = Vec::new();
                let mut version = 1;
                // The flapping runs beside the publishes, on its own schedule, whatever they
                // wait for (a cut publish waits up to the command timeout).
                let done = AtomicBool::new(false);
                let flipper = async {
                    let started = Instant::now();
                    let mut flips = 0;
                    while started.elapsed() < Duration::from_secs(3) {
                        if flips % 2 == 0 {
                            topology.network.apply(&cut).expect("cut");
                        } else {
                            topology.network.heal().expect("heal");
                        }
                        flips += 1;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    done.store(true, Ordering::SeqCst);
                    flips
                };
                let traffic = async {
                    while !done.load(Ordering::SeqCst) {
                        published.push(publish(&http, &a.base, version).await);
                        version += 1;
                        client_read(&http, &a.base, &mut reader).await;
                    }
                };
                let (flips, ()) = tokio::join!(flipper, traffic);
                topology.network.heal().expect("heal");
                let healed_at = Instant::now();
                let answered: Vec<u64> = published
                    .iter()
                    .filter(|p| (200..300).contains(&p.status))
                    .map(|p| p.version)
                    .collect();
                let highest = answered.iter().copied().max().unwrap_or(0);
                loop {
                    let queue: Value =
                        match http.get(format!("{}/v1/retry-queue", a.base)).send().await {
                            Ok(answer) => answer.json().await.unwrap_or(Value::Null),
                            Err(_) => Value::Null,
                        };
                    let held = read_version(&http, &a.base).await;
                    if queue["depth"].as_u64() == Some(0) && held == Ok(highest) {
                        break;
                    }
                    assert!(
                        healed_at.elapsed() < Duration::from_secs(30),
                        "no convergence to v{highest}: A reads {held:?}, its queue {queue}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                client_read(&http, &a.base, &mut reader).await;
                eprintln!(
                    "flapping: {flips} flips, {} publishes ({} answered 2xx, {} queued), reads {} served / {} refused, converged at v{highest} {:?} after the last heal",
                    published.len(),
                    answered.len(),
                    published.iter().filter(|p| p.status == 202).count(),
                    reader.served,
                    reader.refused,
                    healed_at.elapsed(),
                );
                assert!(flips >= 4, "{flips} flips");
                assert!(reader.violations.is_empty(), "{reader:?}");
                assert_eq!(reader.floor, highest, "{reader:?}");
            })
        })
        .expect("join the driver's namespace");
}

/// The split family's key in the split-brain test.
const SPLIT_KEY: &str = "sp:post";

/// The split brain on a split family (4 copies on several masters): the master of copy 0 is
/// isolated with A while A publishes; the other copies' writes are queued, the majority
/// promotes copy 0's replica, and after the heal every version A answered is readable from the
/// siblings, while copy 0 alone was set back.
#[test]
fn partition_split_brain_on_a_split_family_keeps_every_answered_version_in_the_siblings() {
    if !namespaces_or_skip("partition_split_brain_on_a_split_family") {
        return;
    }
    let topology = topology(2);
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = topology.cluster.url();
    let mut a = Instance::spawn(&topology.instances[0], &url, dir.path(), false);
    let mut b = Instance::spawn(&topology.instances[1], &url, dir.path(), false);
    let runtime = runtime();
    topology
        .driver
        .run(|| {
            runtime.block_on(async {
                let http = http_client();
                a.wait_ready(&http).await;
                b.wait_ready(&http).await;
                let cluster = &topology.cluster;
                let master = cluster
                    .master_for_key(format!("{SPLIT_KEY}#0").as_bytes())
                    .expect("copy 0's master");
                let replica = cluster.replicas_of(master).expect("its replica")[0];
                let replica_ip = replica.host().ip().to_string();
                let put = |version: u64| {
                    let url = format!("{}/v1/keys/{SPLIT_KEY}?version={version}", a.base);
                    let http = &http;
                    async move {
                        http.put(&url)
                            .body(format!("v{version}"))
                            .send()
                            .await
                            .map_or(0, |answer| answer.status().as_u16())
                    }
                };
                let read_a = |reader: &'static str| {
                    let url = format!("{}/v1/keys/{SPLIT_KEY}?client={reader}", a.base);
                    let http = &http;
                    async move { http.get(&url).send().await }
                };
                assert_eq!(put(1).await, 200);
                let mut reader = Reader::default();
                if let Ok(answer) = read_a("r1").await {
                    reader.record(answer).await;
                }
                let cut = isolating(&topology, master);
                topology.network.apply(&cut).expect("apply the cut");
                let cut_at = Instant::now();
                let mut answered = Vec::new();
                let mut version = 2;
                // Longer than the one-copy case: the first publish waits out the command
                // timeout on the masters it cannot reach; later ones are queued at once.
                while cut_at.elapsed() < Duration::from_secs(3) {
                    let status = put(version).await;
                    if (200..300).contains(&status) {
                        answered.push((version, status));
                    }
                    version += 1;
                    if let Ok(answer) = read_a("r1").await {
                        reader.record(answer).await;
                    }
                }
                let promoted = cluster.wait_until(
                    Duration::from_secs(30),
                    "copy 0's replica to be promoted",
                    |view| {
                        view.iter().any(|info| {
                            info.host == replica_ip && info.is_master() && !info.slots.is_empty()
                        })
                    },
                );
                topology.network.heal().expect("heal");
                promoted.expect("the majority promotes the isolated master's replica");
                let healed_at = Instant::now();
                cluster
                    .wait_healthy(Duration::from_secs(60))
                    .expect("the cluster heals");
                let highest = answered.iter().map(|(v, _)| *v).max().unwrap_or(1);
                // Every answered version is readable: through B, with the highest as the floor,
                // a sibling serves it once A's queued copies have landed.
                let served = wait_served_through(&http, &b.base, highest, healed_at).await;
                for _ in 0..3 {
                    if let Ok(answer) = read_a("r1").await {
                        reader.record(answer).await;
                    }
                }
                // Every copy converges: A's queued copy writes land, and the copy the failover
                // set back is written again (its queued write, or read repair).
                let at_heal = copy_versions(cluster);
                let copies = wait_copies_at(cluster, highest, healed_at).await;
                let converge = healed_at.elapsed();
                eprintln!(
                    "split brain on a split family: {} publishes answered 2xx during the cut ({} queued), highest v{highest}, served v{served} through B; copies held {at_heal:?} when B served it, all {copies:?} {converge:?} after the heal; reader of A {reader:?}",
                    answered.len(),
                    answered.iter().filter(|(_, status)| *status == 202).count(),
                );
                assert!(served >= highest, "an answered version was lost: v{served} < v{highest}");
                assert!(reader.violations.is_empty(), "{reader:?}");
            })
        })
        .expect("join the driver's namespace");
}

/// Waits until the instance at `b_base` serves the split key with `highest` as the floor (a
/// sibling serves it once A's queued copies have landed); returns the version it served.
async fn wait_served_through(
    http: &reqwest::Client,
    b_base: &str,
    highest: u64,
    healed_at: Instant,
) -> u64 {
    loop {
        let url = format!(
            "{}/v1/keys/{SPLIT_KEY}?client=r2&min_version={highest}",
            b_base
        );
        let answer = http.get(&url).send().await.ok();
        let version = answer.as_ref().and_then(|answer| {
            answer
                .headers()
                .get("hotsplit-version")?
                .to_str()
                .ok()?
                .parse::<u64>()
                .ok()
        });
        if let Some(version) = version {
            return version;
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(60),
            "v{highest} never became readable through B: {:?}",
            answer.map(|answer| answer.status())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The version each of the split key's 4 copies holds on its master (or the error reading it).
fn copy_versions(cluster: &NetCluster) -> Vec<String> {
    (0..4)
        .map(|copy| {
            let copy_key = format!("{SPLIT_KEY}#{copy}");
            cluster
                .master_for_key(copy_key.as_bytes())
                .and_then(|node| cluster.cli(node, &["HGET", &copy_key, "ver"]))
                .unwrap_or_else(|err| err.to_string())
        })
        .collect()
}

/// Waits until every copy of the split key holds `highest`; returns what they hold.
async fn wait_copies_at(cluster: &NetCluster, highest: u64, healed_at: Instant) -> Vec<String> {
    loop {
        let copies = copy_versions(cluster);
        if copies.iter().all(|held| *held == highest.to_string()) {
            return copies;
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(60),
            "the copies never converged to v{highest}: {copies:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ids `base`'s `/v1/instances` lists, and its own id.
async fn listed_instances(http: &reqwest::Client, base: &str) -> Option<(String, Vec<String>)> {
    let view: Value = http
        .get(format!("{base}/v1/instances"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let this = view["this"].as_str()?.to_owned();
    let ids = view["instances"]
        .as_array()?
        .iter()
        .filter_map(|entry| entry["id"].as_str().map(str::to_owned))
        .collect();
    Some((this, ids))
}

/// An instance cut from the master that holds the registry records (`#hotsplit#{fleet}#…`;
/// instances see each other only through Redis): the other instance stops listing it within
/// three heartbeats and lists it again after the heal, while its publishes of a key on another
/// master go on being answered.
#[test]
fn partition_an_instance_cut_from_the_registry_master_drops_out_and_returns() {
    if !namespaces_or_skip("partition_an_instance_cut_from_the_registry_master") {
        return;
    }
    let topology = topology(2);
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = topology.cluster.url();
    let mut a = Instance::spawn(&topology.instances[0], &url, dir.path(), false);
    let mut b = Instance::spawn(&topology.instances[1], &url, dir.path(), false);
    let runtime = runtime();
    topology
        .driver
        .run(|| {
            runtime.block_on(async {
                let http = http_client();
                a.wait_ready(&http).await;
                b.wait_ready(&http).await;
                let cluster = &topology.cluster;
                let registry = cluster
                    .master_for_key(b"#hotsplit#{fleet}#instances")
                    .expect("the registry's master");
                // A one-copy key whose copy lives on another master.
                let key = (0..1000)
                    .map(|n| format!("sb:k{n}"))
                    .find(|key| {
                        cluster
                            .master_for_key(format!("{key}#0").as_bytes())
                            .is_ok_and(|node| node.addr() != registry.addr())
                    })
                    .expect("a key on another master");
                let (a_id, _) = listed_instances(&http, &a.base).await.expect("A's id");
                let listed_by_b = || async {
                    listed_instances(&http, &b.base)
                        .await
                        .is_some_and(|(_, ids)| ids.contains(&a_id))
                };
                let started = Instant::now();
                while !listed_by_b().await {
                    assert!(started.elapsed() < Duration::from_secs(15), "B never listed A");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                topology
                    .network
                    .apply(&Partition::cut(&topology.instances[0], registry.host()))
                    .expect("cut");
                let cut_at = Instant::now();
                let mut statuses = Vec::new();
                let mut version = 1;
                let mut dropped_after = None;
                while cut_at.elapsed() < Duration::from_millis(4500) {
                    let url = format!("{}/v1/keys/{key}?version={version}", a.base);
                    let status = http
                        .put(&url)
                        .body("x")
                        .send()
                        .await
                        .map_or(0, |answer| answer.status().as_u16());
                    statuses.push(status);
                    version += 1;
                    if dropped_after.is_none() && !listed_by_b().await {
                        dropped_after = Some(cut_at.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                topology.network.heal().expect("heal");
                let healed_at = Instant::now();
                while !listed_by_b().await {
                    assert!(
                        healed_at.elapsed() < Duration::from_secs(15),
                        "B never listed A again after the heal"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let returned_after = healed_at.elapsed();
                let answered = statuses.iter().filter(|s| **s == 200).count();
                eprintln!(
                    "instance cut from the registry master: B stopped listing A after {dropped_after:?}, listed it again {returned_after:?} after the heal; {answered} of {} publishes of a key on another master answered 200 during the cut",
                    statuses.len()
                );
                assert!(dropped_after.is_some(), "B kept listing A through a 4.5 s cut");
                assert_eq!(answered, statuses.len(), "publishes elsewhere failed: {statuses:?}");
            })
        })
        .expect("join the driver's namespace");
}
