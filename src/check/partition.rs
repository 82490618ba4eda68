//! `hotsplit check --nemesis partition`: the claims under real network partitions.
//!
//! A Redis Cluster of 3 masters and 3 replicas (`cluster-node-timeout 2000`), each node in its
//! own network namespace, and two `hotsplit serve` processes (this executable), A and B, in
//! namespaces of their own (`hotsplit_devcluster::Topology`); the run's own HTTP clients live
//! in the driver's namespace, which every side of every cut still reaches, so no address of the
//! run is in the machine's own namespace. Cuts are nftables rules (a cut leaves TCP
//! connections open and silent, as a real partition does).
//!
//! The scenarios ([`super::partition_scenarios`]), one row each: an instance cut from one
//! master; a master cut from its replica; the split brain (the master of the key isolated with
//! A while A publishes, the replica promoted, B publishing, the heal) under the rule
//! (`sync_replicas = 1`) and without it; an instance cut from the registry master; flapping
//! cuts. The traffic ([`super::partition_traffic`]) and the figures
//! ([`super::partition_figures`]): monotonic reads of readers with a client id and of readers
//! carrying the session token, read-your-writes, acknowledged publishes lost, availability
//! during the cut, time to converge after the heal.
//!
//! The verdict: a pass needs no monotonic-read and no read-your-writes violation in any row,
//! no acknowledged publish lost in any row but the one without the rule (its losses are the
//! ones the rule prevents: shown, not judged), and every copy converged after every heal.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::partition_figures::{Judged, PartitionRow};
use super::partition_scenarios::{unavailable, Bench, Scenario, PLAIN_FAMILY, RULE_FAMILY};
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit_devcluster::{Host, NetClusterOptions, Process, Topology};

/// The HTTP port of every instance, inside its own namespace.
const HTTP_PORT: u16 = 8080;

/// The shortest cut a scenario makes, whatever `--duration` says.
const SHORTEST_CUT: Duration = Duration::from_millis(1500);

/// How long an instance may take to answer `/readyz`.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How many lines of an instance's log an error quotes.
const LOG_TAIL_LINES: usize = 20;

/// What `--nemesis partition` was asked for.
#[derive(Debug, Clone)]
pub struct PartitionOptions {
    /// The run's length, shared by the scenarios: each cut lasts about a sixth of it.
    pub duration: Duration,
    /// The seed of every choice.
    pub seed: u64,
}

/// The report: one row per scenario.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// The seed.
    pub seed: u64,
    /// `--duration`, ms.
    pub duration_ms: u64,
    /// The base length of each cut, ms.
    pub cut_ms: u64,
    /// The rows, in the order they ran.
    pub rows: Vec<PartitionRow>,
    /// The whole run's wall time, ms.
    pub wall_ms: u64,
}

impl PartitionReport {
    /// The table as markdown, with each row's notes under it.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "## Partitions (seed {}, cuts of about {:.1} s)\n\n| scenario | rule | partition | publishes | reads (served without / with the token) | monotonic-read violations (client id / session token) | read-your-writes violations | acknowledged publishes lost | answered publishes lost | during the cut: reads answered / refused | during the cut: publishes answered / refused | converged after the heal | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.seed,
            self.cut_ms as f64 / 1000.0
        );
        for row in &self.rows {
            out.push_str(&row_line(row));
        }
        out.push('\n');
        for row in &self.rows {
            let refusals: Vec<String> = row
                .cut_refusals
                .iter()
                .map(|(code, count)| format!("{count} {code}"))
                .collect();
            let mut notes = vec![format!("key {}", row.key)];
            if !refusals.is_empty() {
                notes.push(format!(
                    "reads refused during the cut: {}",
                    refusals.join(", ")
                ));
            }
            if !row.note.is_empty() {
                notes.push(row.note.clone());
            }
            out.push_str(&format!("- {}: {}\n", row.scenario, notes.join("; ")));
        }
        out
    }

    /// Why the run fails (empty: it passes).
    pub fn failures(&self) -> Vec<String> {
        self.rows
            .iter()
            .flat_map(|row| {
                row.failures()
                    .into_iter()
                    .map(move |failure| format!("{}: {failure}", row.scenario))
            })
            .collect()
    }
}

/// One markdown line of the table.
fn row_line(row: &PartitionRow) -> String {
    let failures = row.failures();
    let acknowledged_lost = match row.judged {
        Judged::Judged => format!("{} of {}", row.acknowledged_lost.len(), row.acknowledged),
        Judged::Shown => format!(
            "{} of {} (shown, not judged: what the rule prevents)",
            row.acknowledged_lost.len(),
            row.acknowledged
        ),
    };
    let verdict = match (failures.is_empty(), row.judged) {
        (true, Judged::Judged) => "pass".to_owned(),
        (true, Judged::Shown) => "pass (losses shown)".to_owned(),
        (false, _) => format!("FAIL: {}", failures.join("; ")),
    };
    let converged = match (row.converge_ms, row.converged_version) {
        (Some(ms), Some(version)) => format!("{:.1} s (v{version})", ms as f64 / 1000.0),
        _ => "not converged".to_owned(),
    };
    format!(
        "| {} | {} | {} | {} | {} ({} / {}) | {} / {} | {} | {} | {} | {} / {} | {} / {} | {} | {} |\n",
        row.scenario,
        if row.rule {
            "sync_replicas = 1"
        } else {
            "none"
        },
        row.partition,
        row.publishes,
        row.reads,
        row.served_client,
        row.served_session,
        row.monotonic_client,
        row.monotonic_session,
        row.read_your_writes,
        acknowledged_lost,
        row.answered_lost.len(),
        row.cut_reads_answered,
        row.cut_reads_refused,
        row.cut_publishes_answered,
        row.cut_publishes_refused,
        converged,
        verdict,
    )
}

/// Runs the partition experiment.
///
/// # Errors
/// [`ErrorKind::Unavailable`] when this machine refuses network namespaces (the message says
/// so), or when the cluster, an instance or a cut cannot be made; [`ErrorKind::Io`] when the
/// work directory cannot be written.
pub fn run(options: &PartitionOptions) -> Result<PartitionReport> {
    hotsplit_devcluster::netns_support().map_err(|err| {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "--nemesis partition needs network namespaces, which this machine refuses (run as root, with iproute2 and nftables installed): {err}"
            ),
        )
    })?;
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "hotsplit-check-partition-{}-{}",
        std::process::id(),
        options.seed
    ));
    std::fs::create_dir_all(&dir).map_err(|err| io_error("cannot make a work directory", err))?;
    eprintln!("hotsplit check --nemesis partition: starting a 3-master/3-replica cluster and two instances in network namespaces");
    let result = run_in(&dir, options, started);
    match &result {
        Ok(report) if report.failures().is_empty() => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => eprintln!(
            "hotsplit check: the instances' logs are kept in {}",
            dir.display()
        ),
    }
    result
}

/// Starts the topology and the instances, and runs every scenario from the driver's namespace.
fn run_in(dir: &Path, options: &PartitionOptions, started: Instant) -> Result<PartitionReport> {
    let topology = Topology::start(3, 2, &NetClusterOptions::default()).map_err(unavailable)?;
    let url = topology.cluster.url();
    let mut instances = Vec::new();
    for host in &topology.instances {
        instances.push(Instance::spawn(host, &url, dir)?);
    }
    let cut = (options.duration / 6).max(SHORTEST_CUT);
    let bases = match instances.as_slice() {
        [a, b] => [a.base.clone(), b.base.clone()],
        _ => return Err(unavailable("the topology has no two instance hosts")),
    };
    let rows = topology.driver.run(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|err| io_error("cannot build the driver's runtime", err))?;
        runtime.block_on(async {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .map_err(|err| io_error("cannot build an HTTP client", err))?;
            for instance in &mut instances {
                instance.wait_ready(&http).await?;
            }
            let bench = Bench {
                topology: &topology,
                bases,
                http,
                seed: options.seed,
                cut,
                started,
            };
            let mut rows = Vec::new();
            for scenario in Scenario::ALL {
                rows.push(bench.run(scenario).await?);
            }
            Ok::<_, Error>(rows)
        })
    });
    let rows = rows.map_err(unavailable)??;
    Ok(PartitionReport {
        seed: options.seed,
        duration_ms: millis(options.duration),
        cut_ms: millis(cut),
        rows,
        wall_ms: millis(started.elapsed()),
    })
}

/// A duration in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An [`ErrorKind::Io`] error saying `what`.
fn io_error(what: &str, err: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {err}"))
}

/// A `hotsplit serve` (this executable) in an instance host's namespace.
struct Instance {
    /// The process, SIGKILLed when dropped.
    process: Process,
    /// `http://<ip>:8080`.
    base: String,
}

impl Instance {
    /// Writes its config under `dir` and starts it on the cluster at `redis_url`; does not
    /// wait. The families: `pr:` publishes under the rule (`sync_replicas = 1`, `WAIT` bounded
    /// to 100 ms), `pn:` without it; one copy each.
    fn spawn(host: &Host, redis_url: &str, dir: &Path) -> Result<Instance> {
        let name = host.name();
        let spool: PathBuf = dir.join(format!("{name}-spool"));
        let config = format!(
            "[server]\nlisten = \"{ip}:{HTTP_PORT}\"\nshutdown_grace = \"1s\"\nallow_unauthenticated = true\n\
             [store]\nredis = \"{redis_url}\"\ncommand_timeout = \"2s\"\n\
             [heal]\nspool_dir = {spool:?}\n\
             [fleet]\nheartbeat_interval = \"1s\"\n\
             [[family]]\nprefix = \"{RULE_FAMILY}\"\ncopies = 1\nttl = \"10m\"\nsync_replicas = 1\nsync_timeout = \"100ms\"\n\
             [[family]]\nprefix = \"{PLAIN_FAMILY}\"\ncopies = 1\nttl = \"10m\"\n",
            ip = host.ip(),
            spool = spool.display().to_string(),
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).map_err(|err| io_error("cannot write a config", err))?;
        let exe =
            std::env::current_exe().map_err(|err| io_error("cannot find this executable", err))?;
        let process = host
            .command(exe)
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("HOTSPLIT_REDIS")
            .env_remove("HOTSPLIT_LISTEN")
            .env_remove("HOTSPLIT_CONFIG")
            .env_remove("HOTSPLIT_LOG_FORMAT")
            .env_remove("HOTSPLIT_TOKEN")
            .env("HOTSPLIT_LOG", "warn")
            .spawn(dir.join(format!("{name}.log")))
            .map_err(|err| io_error("cannot start hotsplit serve", err))?;
        Ok(Instance {
            process,
            base: format!("http://{}:{HTTP_PORT}", host.ip()),
        })
    }

    /// Polls `/readyz` (from the driver's namespace) until it answers 2xx.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] with the last answer and the log's tail.
    async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<()> {
        let url = format!("{}/readyz", self.base);
        let mut readiness = self
            .process
            .readiness(format!("{url} to answer 2xx"), READY_WITHIN);
        let failure = loop {
            let last = match http.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => return Ok(()),
                Ok(answer) => answer.status().to_string(),
                Err(err) => format!("no answer: {err}"),
            };
            if let Err(failure) = readiness.not_yet(&last) {
                break failure;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        drop(readiness);
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "{failure}; its log ends:\n{}",
                self.process.log_tail(LOG_TAIL_LINES)
            ),
        ))
    }
}
