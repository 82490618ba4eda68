//! `hotsplit check --instances 2`: the claims across two instances behind one cluster.
//!
//! Two `hotsplit serve` processes (this binary, so one can be SIGKILLed for real) run on a
//! throwaway 3-master/3-replica cluster. Each session spreads its requests over both instances
//! round-robin while replicas lag (`faults::lag_replicas`): writers publish, then read back
//! their own key through the *other* instance; readers alternate instances. Two read modes:
//! `random-suffix` (each read names a random copy, `?copy=i`) and `affine` (each session reads
//! with its client id). Each mode runs twice, each time on keys of its own: without and with
//! the session token (`Hotsplit-Session`: every session sends back the last token it
//! received, as any HTTP client can). The figures, per mode and token setting: monotonic-read
//! violations (a session served an older version than it was served before) and
//! read-your-writes violations (a writer served an older version than it just wrote). Without
//! the token the floors live only in the instance that took the request, so the other
//! instance may serve a lagging replica's older copy: the "without" rows show the violations
//! the token removes, and a "with" row that has any fails the run.
//!
//! The convergence scenario: a master refuses `FCALL` (an ACL), so instance A queues the copies
//! it owns; A is SIGKILLed and its spool directory deleted, the master recovers, and the scrub
//! (on instance B, once it takes the lease) must bring every copy level. The report says how
//! long that took.
//!
//! Between the two, the automatic split row ([`super::autosplit`]): keys of one copy split by
//! the instances' hot-key detection and merged once cool, mid-run. Every row also checks that
//! no accepted edit was lost: once it ends, a `primary` read must serve each key's last
//! accepted version.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::fleet_phase::{phase, Fleet, ReadMode, Row, READER_PAUSE_MS};
pub use super::fleet_phase::{FleetFigures, FleetOptions};
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit::wire::query::VERSION;
use hotsplit_devcluster::{Cluster, DevClusterError, Process};

/// One row of the table: a mode and whether sessions carried the session token.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetRow {
    /// The read mode: `random-suffix` or `affine`.
    pub mode: &'static str,
    /// Whether every session sent back the last session token it received.
    pub token: bool,
    /// The counts.
    pub figures: FleetFigures,
}

/// The convergence scenario's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetConvergence {
    /// Keys published through the instance that was killed.
    pub keys: u32,
    /// Copies it reported queued (their master refused the write).
    pub queued: u64,
    /// From the master's recovery (spool already deleted) until every copy of every key held
    /// the published version; `None` when it did not happen within the limit.
    pub level_after_ms: Option<u64>,
    /// The limit waited for.
    pub limit_ms: u64,
    /// Copies the surviving instance's scrub repaired meanwhile
    /// (`hotsplit_scrub_repairs_total`).
    pub scrub_repairs: u64,
}

/// The report of `--instances 2`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetReport {
    /// The table.
    pub rows: Vec<FleetRow>,
    /// The convergence scenario.
    pub convergence: FleetConvergence,
    /// The automatic split and merge row.
    pub split: super::autosplit::SplitRow,
}

impl FleetReport {
    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::from("## Across two instances (each session round-robin over both)\n\n| mode | session token | writes | reads | monotonic-read violations | read-your-writes violations | lost edits |\n|---|---|---|---|---|---|---|\n");
        for row in &self.rows {
            let f = &row.figures;
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                row.mode,
                if row.token { "with" } else { "without" },
                f.writes,
                f.reads,
                f.monotonic_violations,
                f.read_your_writes_violations,
                f.lost_edits
            ));
        }
        let c = &self.convergence;
        out.push_str(&format!(
            "\nConvergence: {} keys published through instance A while a master refused FCALL ({} copies queued); A SIGKILLed and its spool directory deleted; the master recovered; ",
            c.keys, c.queued
        ));
        match c.level_after_ms {
            Some(ms) => out.push_str(&format!(
                "every copy level after {:.1} s ({} copies repaired by the scrub on instance B, which first waits for A's lease to lapse).\n",
                ms as f64 / 1000.0,
                c.scrub_repairs
            )),
            None => out.push_str(&format!(
                "copies NOT level after {:.1} s.\n",
                c.limit_ms as f64 / 1000.0
            )),
        }
        out.push_str(&self.split.markdown());
        out
    }

    /// What fails the run: a violation with the token, a row with the token that served no
    /// read, a lost edit in any row, copies that never became level, or an automatic split
    /// row that broke a claim or did not split and merge. Violations without the token are the
    /// expected demonstration, not a failure.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for row in self.rows.iter().filter(|row| row.figures.lost_edits > 0) {
            failures.push(format!(
                "{} {} the session token: {} keys lost an accepted edit",
                row.mode,
                if row.token { "with" } else { "without" },
                row.figures.lost_edits
            ));
        }
        failures.extend(self.split.failures());
        for row in self.rows.iter().filter(|row| row.token) {
            let f = &row.figures;
            if f.monotonic_violations + f.read_your_writes_violations > 0 {
                failures.push(format!(
                    "{} with the session token: {} monotonic-read and {} read-your-writes violations",
                    row.mode, f.monotonic_violations, f.read_your_writes_violations
                ));
            }
            if f.reads == 0 {
                failures.push(format!(
                    "{} with the session token: no read was served",
                    row.mode
                ));
            }
        }
        let c = &self.convergence;
        if c.queued == 0 {
            failures.push("the convergence scenario queued no copy: it tested nothing".to_owned());
        }
        if c.level_after_ms.is_none() {
            failures.push(
                "the scrub did not bring every copy level after the spool was lost".to_owned(),
            );
        } else if c.scrub_repairs == 0 {
            failures.push("the copies became level without a scrub repair".to_owned());
        }
        failures
    }
}

/// A `hotsplit serve` child process and where it serves and spools.
struct Instance {
    /// The process (SIGKILLed and reaped when dropped); its stdout and stderr go to its log,
    /// quoted when it does not become ready.
    process: Process,
    /// `http://127.0.0.1:P`.
    base: String,
    /// Its spool directory.
    spool: PathBuf,
}

fn io_error(what: &str, err: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {err}"))
}

/// Starts `hotsplit serve` (this executable) on `cluster` with its own port and spool.
fn spawn_instance(
    dir: &std::path::Path,
    name: &str,
    cluster: &Cluster,
    copies: u32,
) -> Result<Instance> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|err| io_error("cannot find a free port", err))?
        .port();
    let spool = dir.join(format!("{name}-spool"));
    // TOML basic strings: `{:?}` of a path's text escapes what TOML escapes.
    let tls = cluster.tls().map_or_else(String::new, |tls| {
        format!(
            "tls_ca_file = {:?}\ntls_cert_file = {:?}\ntls_key_file = {:?}\n",
            tls.ca_file.display().to_string(),
            tls.cert_file.display().to_string(),
            tls.key_file.display().to_string()
        )
    });
    // The `fleet:` family names `placement = "suffix"`: the row reads its copies on their
    // masters by their `K#i` names (`all_level`).
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nshutdown_grace = \"2s\"\n\
         [store]\nredis = \"{}\"\ncommand_timeout = \"2s\"\n{tls}\
         [heal]\nspool_dir = \"{}\"\nlayout_interval = \"1s\"\n\
         [scrub]\ninterval = \"1s\"\nlease_ttl = \"3s\"\n\
         [[family]]\nprefix = \"fleet:\"\ncopies = {copies}\nttl = \"10m\"\ndefault_class = \"advisory\"\nplacement = \"suffix\"\n\
         {split}",
        cluster.url(),
        spool.display(),
        split = super::autosplit::config(copies),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).map_err(|err| io_error("cannot write a config", err))?;
    let exe =
        std::env::current_exe().map_err(|err| io_error("cannot find this executable", err))?;
    let process = Process::builder(exe)
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_CONFIG")
        .env("HOTSPLIT_LOG", "warn")
        .spawn(dir.join(format!("{name}.log")))
        .map_err(|err| io_error("cannot start hotsplit serve", err))?;
    Ok(Instance {
        process,
        base: format!("http://127.0.0.1:{port}"),
        spool,
    })
}

/// How long an instance may take to answer `/readyz` with a 2xx.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How many lines of an instance's log a readiness error quotes.
const LOG_TAIL_LINES: usize = 20;

/// Polls `instance`'s `/readyz` until it answers 2xx, for at most 30 s. The run's work
/// directory (and the instance's log in it) is removed when the run ends, so the error says why:
/// the exit status and the log's last lines when the process exited first, else the last
/// `/readyz` answer and the log's last lines.
async fn wait_ready(http: &reqwest::Client, instance: &mut Instance) -> Result<()> {
    let base = instance.base.clone();
    let mut readiness = instance
        .process
        .readiness(format!("{base}/readyz to answer 2xx"), READY_WITHIN);
    let (failure, last) = loop {
        let last = match http.get(format!("{base}/readyz")).send().await {
            Ok(answer) if answer.status().is_success() => return Ok(()),
            Ok(answer) => {
                let status = answer.status();
                format!("{status}: {}", answer.text().await.unwrap_or_default())
            }
            Err(err) => format!("no answer: {err}"),
        };
        if let Err(failure) = readiness.not_yet(&last) {
            break (failure, last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log_tail = instance.process.log_tail(LOG_TAIL_LINES);
    Err(match failure {
        DevClusterError::ExitedBeforeReady { status, .. } => Error::new(
            ErrorKind::Unavailable,
            format!("{base} exited ({status}) before it was ready; its log ends:\n{log_tail}"),
        ),
        DevClusterError::NotReady { .. } => Error::new(
            ErrorKind::Unavailable,
            format!(
                "{base} did not become ready within 30 s (last /readyz: {last}); its log ends:\n{log_tail}"
            ),
        ),
        other => io_error("cannot check an instance", other),
    })
}

/// Runs the fleet experiment.
///
/// # Errors
/// [`ErrorKind::Io`] when a server or an instance cannot start; [`ErrorKind::Unavailable`]
/// when an instance does not become ready.
pub async fn run(options: FleetOptions, shutdown: CancellationToken) -> Result<FleetReport> {
    let cluster = Arc::new(super::run::start_cluster(options.tls.clone()).await?);
    // The run's own directory (configs, logs, spools), removed at the end.
    let dir = std::env::temp_dir().join(format!(
        "hotsplit-check-fleet-{}-{}",
        std::process::id(),
        options.seed
    ));
    std::fs::create_dir_all(&dir).map_err(|err| io_error("cannot make a work directory", err))?;
    let result = run_in(&dir, &cluster, options, shutdown).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_in(
    dir: &std::path::Path,
    cluster: &Arc<Cluster>,
    options: FleetOptions,
    shutdown: CancellationToken,
) -> Result<FleetReport> {
    let mut instances = vec![
        spawn_instance(dir, "a", cluster, options.copies)?,
        spawn_instance(dir, "b", cluster, options.copies)?,
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|err| io_error("http client", err))?;
    for instance in &mut instances {
        wait_ready(&http, instance).await?;
    }
    let bases: Vec<String> = instances.iter().map(|i| i.base.clone()).collect();
    let rows_planned = [
        (ReadMode::RandomSuffix, false),
        (ReadMode::RandomSuffix, true),
        (ReadMode::Affine, false),
        (ReadMode::Affine, true),
    ];
    let mut rows = Vec::with_capacity(rows_planned.len());
    for (number, (mode, token)) in rows_planned.into_iter().enumerate() {
        let row = Row {
            mode,
            token,
            // Keys of its own: each row's versions start again at 1.
            prefix: format!("fleet:{number}:"),
            reader_pause: Arc::new(AtomicU64::new(READER_PAUSE_MS)),
        };
        eprintln!(
            "hotsplit check --instances 2: {} {} the session token",
            mode.as_str(),
            if token { "with" } else { "without" }
        );
        let stop = shutdown.child_token();
        let timer = tokio::spawn(cancel_after(options.duration / 4, stop.clone()));
        let fleet = Fleet {
            http: &http,
            bases: &bases,
            cluster,
        };
        let figures = phase(&fleet, &options, &row, stop).await;
        timer.abort();
        rows.push(FleetRow {
            mode: mode.as_str(),
            token,
            figures,
        });
        if shutdown.is_cancelled() {
            break;
        }
    }
    eprintln!("hotsplit check --instances 2: automatic split and merge");
    let split = super::autosplit::run(&http, &bases, cluster, &options, &shutdown).await;
    let convergence = converge(&http, cluster, &mut instances, options.copies).await?;
    Ok(FleetReport {
        rows,
        convergence,
        split,
    })
}

/// Cancels `stop` after `duration`.
async fn cancel_after(duration: Duration, stop: CancellationToken) {
    tokio::time::sleep(duration).await;
    stop.cancel();
}

/// The longest the convergence scenario waits for the copies to become level.
const CONVERGENCE_LIMIT: Duration = Duration::from_secs(60);

/// Queues copies on instance A, SIGKILLs it and deletes its spool, then times how long until
/// every copy holds the published version.
async fn converge(
    http: &reqwest::Client,
    cluster: &Arc<Cluster>,
    instances: &mut [Instance],
    copies: u32,
) -> Result<FleetConvergence> {
    const KEYS: u32 = 32;
    let victim = cluster
        .master_for_key(b"fleet:conv:0#0")
        .map_err(|err| io_error("cannot read the cluster topology", err))?
        .ok_or_else(|| Error::new(ErrorKind::Unavailable, "no master owns fleet:conv:0#0"))?
        .port;
    let acl = |rule: &str| {
        cluster
            .cli(victim, &["ACL", "SETUSER", "default", rule])
            .map_err(|err| io_error("cannot change the victim's ACL", err))
    };
    acl("-fcall")?;
    let mut queued = 0;
    for key in 0..KEYS {
        let answer = http
            .put(format!(
                "{}/v1/keys/fleet:conv:{key}?{VERSION}=1",
                instances[0].base
            ))
            .body("converged")
            .send()
            .await
            .map_err(|err| io_error("publish", err))?;
        let body: serde_json::Value = answer.json().await.unwrap_or_default();
        queued += body["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|line| line["outcome"] == "queued")
            .count() as u64;
    }
    let survivor = instances[1].base.clone();
    let repairs_before = scrub_repairs(http, &survivor).await;
    let killed = &mut instances[0];
    let _ = killed.process.kill();
    std::fs::remove_dir_all(&killed.spool)
        .map_err(|err| io_error("cannot delete the spool", err))?;
    acl("+fcall")?;
    let started = Instant::now();
    let cluster_for_poll = cluster.clone();
    let level_after_ms = loop {
        let cluster = cluster_for_poll.clone();
        let level = tokio::task::spawn_blocking(move || all_level(&cluster, KEYS, copies))
            .await
            .unwrap_or(false);
        if level {
            break Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        }
        if started.elapsed() > CONVERGENCE_LIMIT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let repairs_after = scrub_repairs(http, &survivor).await;
    Ok(FleetConvergence {
        keys: KEYS,
        queued,
        level_after_ms,
        limit_ms: u64::try_from(CONVERGENCE_LIMIT.as_millis()).unwrap_or(u64::MAX),
        scrub_repairs: repairs_after.saturating_sub(repairs_before),
    })
}

/// The sum of `hotsplit_scrub_repairs_total` (every cause) in `base`'s `/metrics`; 0 when it
/// cannot be read.
async fn scrub_repairs(http: &reqwest::Client, base: &str) -> u64 {
    let Ok(answer) = http.get(format!("{base}/metrics")).send().await else {
        return 0;
    };
    let text = answer.text().await.unwrap_or_default();
    text.lines()
        .filter(|line| line.starts_with("hotsplit_scrub_repairs_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Whether every copy of `fleet:conv:0..keys` holds version 1 on its master.
fn all_level(cluster: &Cluster, keys: u32, copies: u32) -> bool {
    (0..keys).all(|key| {
        (0..copies).all(|copy| {
            // The check's families keep the default naming, `K#i`.
            let Ok(parsed) = hotsplit::key::Key::parse(&format!("fleet:conv:{key}")) else {
                return false;
            };
            let copy_key = parsed
                .copy_key(copy, hotsplit::key::Placement::Suffix)
                .to_string();
            let Ok(Some(owner)) = cluster.master_for_key(copy_key.as_bytes()) else {
                return false;
            };
            cluster
                .cli(owner.port, &["HGET", &copy_key, "ver"])
                .is_ok_and(|ver| ver.trim() == "1")
        })
    })
}
