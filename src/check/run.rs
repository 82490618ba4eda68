//! `hotsplit check`: a self-contained, seeded experiment that reproduces hotsplit's claims.
//!
//! It starts a throwaway 3-master/3-replica cluster (`hotsplit_devcluster`) and a hotsplit
//! service on it, then runs the same seeded fault schedule once per [`Mode`] while writers
//! publish increasing versions and reader sessions read. Every operation, direct copy sample and
//! fault is recorded as an [`Event`]; the [`checkers`](super::checkers) then count monotonic-read
//! violations, stale reads, source loads and convergence per mode. A presence experiment asks
//! "is the claim held?" through the `advisory` and `decides-on-presence` read classes while a
//! replica's replication is paused, and counts wrong decisions.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::checkers::{self, Percentiles, Scope};
use super::history::{Event, Op, Outcome};
use hotsplit::config::Config;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit::wire;
use hotsplit::wire::query::{CLASS, CLIENT, COPY, MIN_VERSION, VERSION};
use hotsplit_devcluster::{self as devcluster, Cluster, ClusterOptions};

/// How readers pick the copy they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Each read picks a copy at random (`?copy=i`): the flip-flop hotsplit exists to prevent.
    RandomSuffix,
    /// Client-affine reads, no floor.
    Affine,
    /// Random copies, but the reader sends the highest version it has seen as `min_version`.
    Floor,
    /// Invalidate on edit; readers refill from the source of truth on a miss.
    Delete,
}

impl Mode {
    /// Every mode, in report order.
    pub const ALL: [Mode; 4] = [Mode::RandomSuffix, Mode::Affine, Mode::Floor, Mode::Delete];

    /// The mode's name on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::RandomSuffix => "random-suffix",
            Mode::Affine => "affine",
            Mode::Floor => "floor",
            Mode::Delete => "delete",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Total duration of the workload phases (modes and presence). Default: 60 s.
    pub duration: Duration,
    /// Seed of the fault schedule and the readers' choices. Default: 1.
    pub seed: u64,
    /// Hot keys per mode. Default: 2.
    pub keys: u32,
    /// Reader sessions per mode. Default: 8.
    pub readers: u32,
    /// Copies per hot key. Default: 8.
    pub copies: u32,
    /// Where to write the report, the JSON summary and the histories. Default: none.
    pub out: Option<PathBuf>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            duration: Duration::from_secs(60),
            seed: 1,
            keys: 2,
            readers: 8,
            copies: 8,
            out: None,
        }
    }
}

/// One mode's results.
#[derive(Debug, Clone, Serialize)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Reads that returned a version.
    pub reads: usize,
    /// Monotonic-read violations between two reads of the same copy from the same role (both
    /// primary or both replica), outside windows where a failover or restart lost writes: a
    /// copy went back. This is what the affine claim forbids.
    pub monotonic_violations: usize,
    /// Monotonic-read violations inside such windows (reported apart).
    pub monotonic_violations_in_loss_windows: usize,
    /// Outside loss windows, between reads of different copies (a random suffix, or in affine
    /// mode a fallback to a sibling when the reader's copy could not be read).
    pub monotonic_violations_across_copies: usize,
    /// Outside loss windows, between the same copy read from a replica and from its primary
    /// (a replica behind within its class's staleness budget).
    pub monotonic_violations_across_roles: usize,
    /// Reads older than the newest version acknowledged before they started.
    pub stale_reads: usize,
    /// How long the version a stale read returned had already been superseded.
    pub stale_behind: Percentiles,
    /// Writers' reads of their own key that returned an older version than they had written.
    pub read_your_writes_violations: usize,
    /// Loads from the source of truth caused by misses.
    pub source_loads: usize,
    /// Time for every copy to reach an acknowledged version.
    pub convergence: Percentiles,
    /// Copies found at an older version than they had held.
    pub copy_rollbacks: usize,
}

impl ModeResult {
    /// Every monotonic-read violation, whatever explains it.
    pub fn all_monotonic_violations(&self) -> usize {
        self.monotonic_violations
            + self.monotonic_violations_in_loss_windows
            + self.monotonic_violations_across_copies
            + self.monotonic_violations_across_roles
    }
}

/// The presence experiment's results per class.
#[derive(Debug, Clone, Serialize)]
pub struct PresenceResult {
    /// The read class.
    pub class: String,
    /// Decisions made (reads with an unambiguous truth).
    pub decisions: usize,
    /// Decisions that disagreed with the truth.
    pub wrong: usize,
}

/// Everything a run found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The seed used.
    pub seed: u64,
    /// Per-mode results.
    pub modes: Vec<ModeResult>,
    /// Presence results, `advisory` first.
    pub presence: Vec<PresenceResult>,
}

impl CheckReport {
    /// The reasons this run fails, empty when it passes: any `floor` violation, any `affine`
    /// violation outside a loss window, any wrong `decides-on-presence` decision.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for mode in &self.modes {
            if mode.mode == Mode::Floor && mode.all_monotonic_violations() > 0 {
                failures.push(format!(
                    "floor mode broke monotonic reads {} times",
                    mode.all_monotonic_violations()
                ));
            }
            if mode.mode == Mode::Affine && mode.monotonic_violations > 0 {
                failures.push(format!(
                    "affine mode read a copy going back {} times outside loss windows",
                    mode.monotonic_violations
                ));
            }
        }
        for presence in &self.presence {
            if presence.class == "decides-on-presence" && presence.wrong > 0 {
                failures.push(format!(
                    "{} decides-on-presence decisions were wrong",
                    presence.wrong
                ));
            }
        }
        failures
    }

    /// The markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Modes (seed {})\n", self.seed);
        let _ = writeln!(out, "| mode | reads | monotonic-read violations | same copy | across copies | replica/primary | in loss windows | read-your-writes violations | stale reads | stale by, p99 (ms) | extra source loads | convergence p99 (ms) | copy rollbacks |");
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for mode in &self.modes {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.1} | {} |",
                mode.mode.as_str(),
                mode.reads,
                mode.all_monotonic_violations(),
                mode.monotonic_violations,
                mode.monotonic_violations_across_copies,
                mode.monotonic_violations_across_roles,
                mode.monotonic_violations_in_loss_windows,
                mode.read_your_writes_violations,
                mode.stale_reads,
                mode.stale_behind.p99_ms,
                mode.source_loads,
                mode.convergence.p99_ms,
                mode.copy_rollbacks
            );
        }
        let _ = writeln!(out, "\n## Presence\n");
        let _ = writeln!(out, "| class | decisions | wrong decisions |");
        let _ = writeln!(out, "|---|---|---|");
        for presence in &self.presence {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                presence.class, presence.decisions, presence.wrong
            );
        }
        out
    }
}

/// A shared, append-only history with a monotonic clock.
#[derive(Clone)]
struct Recorder {
    /// The run's time origin.
    origin: Instant,
    /// Every event so far.
    events: Arc<Mutex<Vec<Event>>>,
    /// Operations recorded, for progress.
    count: Arc<AtomicU64>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            origin: Instant::now(),
            events: Arc::new(Mutex::new(Vec::new())),
            count: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn push(&self, event: Event) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    /// Records a read through hotsplit that started at `start_us` and just ended with `answer`.
    fn push_read(&self, session: &str, key: &str, start_us: u64, answer: &Answer) {
        let mut read = event(
            session,
            Op::Read,
            key,
            start_us,
            self.now_us(),
            outcome_of(answer),
        );
        read.version = answer.version;
        read.copy = answer.copy;
        read.served_by = answer.served_by.clone();
        read.route = answer.route.clone();
        self.push(read);
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn event(session: &str, op: Op, key: &str, start_us: u64, end_us: u64, outcome: Outcome) -> Event {
    Event {
        session: session.to_owned(),
        op,
        key: key.to_owned(),
        version: None,
        copy: None,
        served_by: None,
        route: None,
        start_us,
        end_us,
        outcome,
    }
}

/// A response reduced to what the history needs.
struct Answer {
    status: u16,
    version: Option<u64>,
    copy: Option<u32>,
    served_by: Option<String>,
    route: Option<String>,
    code: Option<String>,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    match request.send().await {
        Ok(response) => {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
            };
            let status = response.status().as_u16();
            let version = header(wire::header::VERSION).and_then(|text| text.parse().ok());
            let copy = header(wire::header::COPY).and_then(|text| text.parse().ok());
            let served_by = header(wire::header::SERVED_BY);
            let route = header(wire::header::ROUTE);
            let code = if status >= 400 {
                response
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|body| body["code"].as_str().map(str::to_owned))
            } else {
                None
            };
            Answer {
                status,
                version,
                copy,
                served_by,
                route,
                code,
            }
        }
        Err(_) => Answer {
            status: 0,
            version: None,
            copy: None,
            served_by: None,
            route: None,
            code: Some("transport".into()),
        },
    }
}

fn outcome_of(answer: &Answer) -> Outcome {
    match answer.status {
        200 | 202 => Outcome::Ok,
        304 => Outcome::NotModified,
        404 => Outcome::NotFound,
        _ => Outcome::Error(
            answer
                .code
                .clone()
                .unwrap_or_else(|| format!("http {}", answer.status)),
        ),
    }
}

/// Progress of a run, reported to the caller's callback.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The phase: `setup`, a mode's name, `presence`, `report`.
    pub phase: String,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Operations recorded so far.
    pub operations: u64,
}

/// Runs the experiment.
///
/// # Errors
/// [`ErrorKind::Io`] when `redis-server` is missing or a server cannot start (the message says
/// how to install it); [`ErrorKind::Unavailable`] when the service cannot start on the cluster.
pub async fn run(
    options: CheckOptions,
    shutdown: CancellationToken,
    progress: impl Fn(Progress) + Send + Sync + 'static,
) -> Result<CheckReport> {
    let started = Instant::now();
    let progress = Arc::new(progress);
    let recorder = Recorder::new();
    let phase = Arc::new(Mutex::new(String::from("setup")));
    let say = {
        let progress = progress.clone();
        let recorder = recorder.clone();
        let phase = phase.clone();
        move |name: &str| {
            *phase.lock().unwrap_or_else(PoisonError::into_inner) = name.to_owned();
            progress(Progress {
                phase: name.to_owned(),
                elapsed: started.elapsed(),
                operations: recorder.count.load(Ordering::Relaxed),
            })
        }
    };
    // Progress every 2 s while a phase runs.
    let ticker_stop = CancellationToken::new();
    let ticker = {
        let (progress, recorder, phase, stop) = (
            progress.clone(),
            recorder.clone(),
            phase.clone(),
            ticker_stop.clone(),
        );
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_secs(2));
            interval.tick().await;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = interval.tick() => progress(Progress {
                        phase: phase.lock().unwrap_or_else(PoisonError::into_inner).clone(),
                        elapsed: started.elapsed(),
                        operations: recorder.count.load(Ordering::Relaxed),
                    }),
                }
            }
        })
    };
    say("setup: starting a 3-master/3-replica redis cluster");
    devcluster::redis_server_path().map_err(|err| Error::new(ErrorKind::Io, err.to_string()))?;
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start(ClusterOptions {
            extra_args: vec!["--cluster-require-full-coverage".into(), "no".into()],
            ..ClusterOptions::default()
        })
    })
    .await
    .map_err(|err| Error::new(ErrorKind::Io, format!("cluster start task failed: {err}")))?
    .map_err(|err| {
        Error::new(
            ErrorKind::Io,
            format!("cannot start the redis cluster: {err}"),
        )
    })?;
    let cluster = Arc::new(cluster);

    say("setup: starting hotsplit on the cluster");
    let config = Config::from_toml(&format!(
        "[store]\ncommand_timeout = \"300ms\"\n[[family]]\nprefix = \"check:\"\ncopies = {}\nttl = \"10m\"\ndefault_class = \"advisory\"\n[[family]]\nprefix = \"claim:\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"advisory\"\n",
        options.copies
    ))?;
    let mut config = config;
    config.store.redis = Some(cluster.url());
    // The run's own spool, removed with the run: never a spool another process owns.
    let spool = std::env::temp_dir().join(format!(
        "hotsplit-check-{}-{}",
        std::process::id(),
        options.seed
    ));
    config.heal.spool_dir = spool.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let service_stop = CancellationToken::new();
    let service = tokio::spawn(hotsplit::server::run(listener, config, {
        let stop = service_stop.clone();
        async move { stop.cancelled().await }
    }));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|err| Error::new(ErrorKind::Io, format!("http client: {err}")))?;
    wait_ready(&http, &base).await?;
    say("setup: waiting until hotsplit measures the lag of all three replicas");
    wait_replicas_measured(&http, &base).await?;

    let phases = Mode::ALL.len() as u32 + 1;
    let phase_length = (options.duration / phases).max(Duration::from_secs(2));
    let mut modes = Vec::new();
    for (index, mode) in Mode::ALL.into_iter().enumerate() {
        if shutdown.is_cancelled() {
            break;
        }
        say(mode.as_str());
        let mut rng = StdRng::seed_from_u64(options.seed.wrapping_add(index as u64));
        let loss_windows = run_mode(
            mode,
            &options,
            phase_length,
            &http,
            &base,
            &cluster,
            &recorder,
            &mut rng,
            &shutdown,
        )
        .await;
        let events = recorder.take();
        write_history(&options, mode.as_str(), &events)?;
        modes.push(judge(mode, &events, &loss_windows));
    }
    say("presence");
    let presence =
        presence_experiment(phase_length, &http, &base, &cluster, &recorder, &shutdown).await;
    write_history(&options, "presence", &recorder.take())?;

    say("report");
    ticker_stop.cancel();
    let _ = ticker.await;
    service_stop.cancel();
    let _ = service.await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&spool);
    let report = CheckReport {
        seed: options.seed,
        modes,
        presence,
    };
    if let Some(dir) = &options.out {
        std::fs::write(dir.join("report.md"), report.markdown())?;
        let summary = serde_json::to_string_pretty(&report)
            .map_err(|err| Error::new(ErrorKind::Io, err.to_string()))?;
        std::fs::write(dir.join("summary.json"), summary)?;
    }
    Ok(report)
}

/// Polls `ready` every 50 ms until it holds; after `limit`, an error saying `what` did not happen.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut ready: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !ready().await {
        if Instant::now() > deadline {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{what} within {} s", limit.as_secs()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn wait_ready(http: &reqwest::Client, base: &str) -> Result<()> {
    wait_for(
        "hotsplit did not become ready on the cluster",
        Duration::from_secs(20),
        || async {
            let answer = http.get(format!("{base}/readyz")).send().await;
            answer.is_ok_and(|answer| answer.status().is_success())
        },
    )
    .await
}

/// Waits until `/v1/lag` lists three replicas with a measured lag within the advisory budget,
/// so the first mode does not run while replicas are still being discovered.
async fn wait_replicas_measured(http: &reqwest::Client, base: &str) -> Result<()> {
    wait_for(
        "hotsplit did not measure the lag of three replicas",
        Duration::from_secs(30),
        || async {
            let Ok(answer) = http.get(format!("{base}/v1/lag")).send().await else {
                return false;
            };
            let Ok(serde_json::Value::Array(replicas)) = answer.json::<serde_json::Value>().await
            else {
                return false;
            };
            let measured = replicas
                .iter()
                .filter(|replica| replica["within_budget"]["advisory"] == true)
                .count();
            measured >= 3
        },
    )
    .await
}

fn write_history(options: &CheckOptions, name: &str, events: &[Event]) -> Result<()> {
    let Some(dir) = &options.out else {
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(
        dir.join(format!("history-{name}.jsonl")),
    )?);
    super::history::write_jsonl(&mut file, events)?;
    std::io::Write::flush(&mut file)?;
    Ok(())
}

fn judge(mode: Mode, events: &[Event], loss_windows: &[(u64, u64)]) -> ModeResult {
    let (inside, outside) =
        checkers::split_by_windows(checkers::monotonic_reads(events), loss_windows);
    let in_scope = |scope| {
        outside
            .iter()
            .filter(|violation| violation.scope() == scope)
            .count()
    };
    let staleness = checkers::staleness(events);
    ModeResult {
        mode,
        reads: staleness.reads,
        monotonic_violations: in_scope(Scope::SameCopy),
        monotonic_violations_in_loss_windows: inside.len(),
        monotonic_violations_across_copies: in_scope(Scope::AcrossCopies),
        monotonic_violations_across_roles: in_scope(Scope::AcrossRoles),
        stale_reads: staleness.stale,
        stale_behind: staleness.behind,
        read_your_writes_violations: checkers::read_your_writes(events).len(),
        source_loads: events
            .iter()
            .filter(|event| event.op == Op::SourceLoad)
            .count(),
        convergence: checkers::convergence(events).time_to_converge,
        copy_rollbacks: checkers::copy_regressions(events)
            .iter()
            .filter(|found| found.is_rollback())
            .count(),
    }
}

/// The owning master's port of `key`, from a cached topology.
fn owner_port(topology: &[devcluster::NodeInfo], key: &str) -> Option<u16> {
    let slot = fred::util::redis_keyslot(key.as_bytes());
    topology
        .iter()
        .find(|node| node.is_master() && !node.is_failed() && node.serves_slot(slot))
        .map(|node| node.port)
}

/// Reads every copy of `keys` directly from their masters, recording a sample per copy.
async fn sample_copies(cluster: &Arc<Cluster>, keys: &[String], copies: u32, recorder: &Recorder) {
    let cluster = cluster.clone();
    let keys = keys.to_vec();
    let recorder = recorder.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(topology) = cluster.topology() else {
            return;
        };
        for key in &keys {
            for copy in 0..copies {
                let copy_key = format!("{key}#{copy}");
                let Some(port) = owner_port(&topology, &copy_key) else {
                    continue;
                };
                let start = recorder.now_us();
                let Ok(text) = devcluster::cli_with_timeout(
                    port,
                    &["HGET", &copy_key, "ver"],
                    Duration::from_millis(200),
                ) else {
                    continue;
                };
                let mut sample = event(
                    "sampler",
                    Op::Sample,
                    key,
                    start,
                    recorder.now_us(),
                    Outcome::Ok,
                );
                sample.copy = Some(copy);
                sample.version = text.parse().ok();
                if sample.version.is_none() {
                    sample.outcome = Outcome::NotFound;
                }
                sample.served_by = Some(format!("127.0.0.1:{port}"));
                recorder.push(sample);
            }
        }
    })
    .await;
}

/// A fault applied to one master, on a blocking thread.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `CLIENT PAUSE <ms> WRITE` on the master: its copies stay readable at their old version
    /// while writes to them stall; nothing fails over.
    StallWrites(Duration),
    /// SIGSTOP for this long, shorter than the node timeout, then SIGCONT.
    ShortPause(Duration),
    /// SIGSTOP long enough for its replica to be promoted, then SIGCONT.
    Failover(Duration),
    /// `SHUTDOWN NOSAVE` and an immediate restart: it returns empty within the node timeout.
    RestartEmpty,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::StallWrites(_) => "client-pause-write",
            Fault::ShortPause(_) => "sigstop-short",
            Fault::Failover(_) => "sigstop-failover",
            Fault::RestartEmpty => "shutdown-nosave-restart",
        }
    }

    fn loses_writes(self) -> bool {
        matches!(self, Fault::Failover(_) | Fault::RestartEmpty)
    }
}

/// Applies `fault` to a master chosen by `pick`, records it, and returns its loss window.
async fn inject(
    fault: Fault,
    pick: usize,
    cluster: &Arc<Cluster>,
    recorder: &Recorder,
) -> Option<(u64, u64)> {
    let cluster = cluster.clone();
    let recorder = recorder.clone();
    tokio::task::spawn_blocking(move || {
        let masters = cluster.masters().ok()?;
        let port = masters.get(pick % masters.len().max(1))?.port();
        let node = cluster.node(port)?;
        let start = recorder.now_us();
        let applied = match fault {
            Fault::StallWrites(hold) => {
                let millis = hold.as_millis().to_string();
                devcluster::cli(port, &["CLIENT", "PAUSE", &millis, "WRITE"]).is_ok() && {
                    std::thread::sleep(hold);
                    true
                }
            }
            Fault::ShortPause(hold) | Fault::Failover(hold) => {
                node.pause().is_ok() && {
                    std::thread::sleep(hold);
                    node.resume().is_ok()
                }
            }
            Fault::RestartEmpty => node.shutdown_nosave().is_ok() && node.restart().is_ok(),
        };
        let _ = cluster.wait_healthy(Duration::from_secs(30));
        let end = recorder.now_us();
        let mut record = event(
            "faults",
            Op::Fault,
            "",
            start,
            end,
            Outcome::Error(fault.name().to_owned()),
        );
        record.served_by = Some(format!("127.0.0.1:{port}"));
        if !applied {
            record.outcome = Outcome::Error(format!("{} (not applied)", fault.name()));
        }
        recorder.push(record);
        // Reads just after the cluster healed may still see the loss: widen the window by 1 s.
        (applied && fault.loses_writes()).then_some((start, end + 1_000_000))
    })
    .await
    .ok()
    .flatten()
}

#[allow(clippy::too_many_arguments)]
async fn run_mode(
    mode: Mode,
    options: &CheckOptions,
    phase_length: Duration,
    http: &reqwest::Client,
    base: &str,
    cluster: &Arc<Cluster>,
    recorder: &Recorder,
    rng: &mut StdRng,
    shutdown: &CancellationToken,
) -> Vec<(u64, u64)> {
    let stop = shutdown.child_token();
    let keys: Vec<String> = (0..options.keys)
        .map(|k| format!("check:{}:{k}", mode.as_str()))
        .collect();
    // The source of truth: each key's current version.
    let source: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let mut tasks = tokio::task::JoinSet::new();

    for (index, key) in keys.iter().enumerate() {
        let (http, base, key, source, recorder, stop) = (
            http.clone(),
            base.to_owned(),
            key.clone(),
            source.clone(),
            recorder.clone(),
            stop.clone(),
        );
        tasks.spawn(async move {
            let session = format!("writer-{index}");
            while !stop.is_cancelled() {
                let start = recorder.now_us();
                let (op, version, answer) = if mode == Mode::Delete {
                    // Values are even versions; an edit invalidates at the odd version below, and
                    // readers refill the value at the even one.
                    let value_version = source[index].fetch_add(2, Ordering::SeqCst) + 2;
                    let answer = send(http.delete(format!(
                        "{base}/v1/keys/{key}?{VERSION}={}",
                        value_version - 1
                    )))
                    .await;
                    (Op::Delete, value_version - 1, answer)
                } else {
                    let version = source[index].fetch_add(1, Ordering::SeqCst) + 1;
                    let answer = send(
                        http.put(format!(
                            "{base}/v1/keys/{key}?{VERSION}={version}&{CLIENT}={session}"
                        ))
                        .body(format!("v{version}")),
                    )
                    .await;
                    (Op::Write, version, answer)
                };
                let mut record = event(
                    &session,
                    op,
                    &key,
                    start,
                    recorder.now_us(),
                    outcome_of(&answer),
                );
                record.version = Some(version);
                recorder.push(record);
                if mode != Mode::Delete {
                    // The writer reads its own key back, as `advisory`: its own-write floor
                    // must keep it from reading an older version from a lagging replica.
                    let start = recorder.now_us();
                    let answer = send(http.get(format!(
                        "{base}/v1/keys/{key}?{CLIENT}={session}&{CLASS}=advisory"
                    )))
                    .await;
                    recorder.push_read(&session, &key, start, &answer);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    for reader in 0..options.readers {
        let (http, base, keys, source, recorder, stop) = (
            http.clone(),
            base.to_owned(),
            keys.clone(),
            source.clone(),
            recorder.clone(),
            stop.clone(),
        );
        let mut rng = StdRng::seed_from_u64(rng.random());
        let copies = options.copies;
        tasks.spawn(async move {
            let session = format!("reader-{reader}");
            let mut floors: BTreeMap<usize, u64> = BTreeMap::new();
            while !stop.is_cancelled() {
                let index = rng.random_range(0..keys.len());
                let key = &keys[index];
                let copy = rng.random_range(0..copies);
                // Reads are `advisory`: replicas may serve them within the staleness budget,
                // which is where lagging copies become visible.
                let url = match mode {
                    Mode::RandomSuffix => format!("{base}/v1/keys/{key}?{COPY}={copy}&{CLASS}=advisory"),
                    Mode::Affine | Mode::Delete => format!("{base}/v1/keys/{key}?{CLIENT}={session}&{CLASS}=advisory"),
                    Mode::Floor => match floors.get(&index) {
                        Some(floor) => {
                            format!("{base}/v1/keys/{key}?{COPY}={copy}&{MIN_VERSION}={floor}&{CLASS}=advisory")
                        }
                        None => format!("{base}/v1/keys/{key}?{COPY}={copy}&{CLASS}=advisory"),
                    },
                };
                let start = recorder.now_us();
                let answer = send(http.get(url)).await;
                recorder.push_read(&session, key, start, &answer);
                if let Some(version) = answer.version.filter(|_| answer.status == 200) {
                    let floor = floors.entry(index).or_insert(version);
                    *floor = (*floor).max(version);
                }
                if mode == Mode::Delete && answer.status == 404 {
                    // A miss: load from the source of truth and refill the cache at its version.
                    let start = recorder.now_us();
                    let version = source[index].load(Ordering::SeqCst);
                    if version > 0 {
                        let refill = send(
                            http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                                .body(format!("v{version}")),
                        )
                        .await;
                        let mut load = event(
                            &session,
                            Op::SourceLoad,
                            key,
                            start,
                            recorder.now_us(),
                            outcome_of(&refill),
                        );
                        load.version = Some(version);
                        recorder.push(load);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }

    {
        let (cluster, keys, recorder, stop) = (
            cluster.clone(),
            keys.clone(),
            recorder.clone(),
            stop.clone(),
        );
        let copies = options.copies;
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                sample_copies(&cluster, &keys, copies, &recorder).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }

    // Replication lag throughout the phase: a seeded replica at a time has its replication
    // paused for 200 ms (within the 250 ms advisory budget), so its copies stay readable and old.
    {
        let (cluster, stop, recorder) = (cluster.clone(), stop.clone(), recorder.clone());
        let mut rng = StdRng::seed_from_u64(rng.random());
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                let pick = rng.random_range(0..1024usize);
                let cluster = cluster.clone();
                let recorder = recorder.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let replicas = cluster.replicas().ok()?;
                    let port = replicas.get(pick % replicas.len().max(1))?.port();
                    let start = recorder.now_us();
                    devcluster::cli_with_timeout(
                        port,
                        &["CLIENT", "PAUSE", "200", "WRITE"],
                        Duration::from_millis(200),
                    )
                    .ok()?;
                    let mut record = event(
                        "faults",
                        Op::Fault,
                        "",
                        start,
                        start + 200_000,
                        Outcome::Error("replica-replication-pause".into()),
                    );
                    record.served_by = Some(format!("127.0.0.1:{port}"));
                    recorder.push(record);
                    Some(())
                })
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
    }

    // The seeded fault schedule, at fixed fractions of the phase.
    let phase_start = Instant::now();
    let mut schedule = vec![
        (
            0.10,
            Fault::StallWrites(Duration::from_millis(1500).min(phase_length / 3)),
        ),
        (
            0.45,
            Fault::ShortPause(Duration::from_millis(800).min(phase_length / 6)),
        ),
        (0.60, Fault::RestartEmpty),
    ];
    if phase_length >= Duration::from_secs(10) {
        schedule.push((0.75, Fault::Failover(Duration::from_secs(5))));
    }
    let mut loss_windows = Vec::new();
    for (fraction, fault) in schedule {
        let at = phase_length.mul_f64(fraction);
        tokio::select! {
            () = tokio::time::sleep(at.saturating_sub(phase_start.elapsed())) => {}
            () = stop.cancelled() => break,
        }
        let pick = rng.random_range(0..3);
        if let Some(window) = inject(fault, pick, cluster, recorder).await {
            loss_windows.push(window);
        }
    }
    tokio::select! {
        () = tokio::time::sleep(phase_length.saturating_sub(phase_start.elapsed())) => {}
        () = stop.cancelled() => {}
    }
    stop.cancel();
    while tasks.join_next().await.is_some() {}

    // Heal: once the cluster is healthy, re-send each key's last version (always safe) and
    // sample until every copy holds it.
    let healthy = cluster.clone();
    let _ =
        tokio::task::spawn_blocking(move || healthy.wait_healthy(Duration::from_secs(30))).await;
    for (index, key) in keys.iter().enumerate() {
        let version = source[index].load(Ordering::SeqCst);
        let request = if mode == Mode::Delete {
            http.delete(format!("{base}/v1/keys/{key}?{VERSION}={}", version - 1))
        } else {
            http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                .body(format!("v{version}"))
        };
        let _ = send(request).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !shutdown.is_cancelled() {
        sample_copies(cluster, &keys, options.copies, recorder).await;
        let converged = checkers::convergence(
            &recorder
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .lagging_at_end
        .is_empty();
        if converged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    loss_windows
}

/// Asks "is the claim held?" through `advisory` and `decides-on-presence` while the claim's
/// replica has its replication paused for less than the advisory budget.
async fn presence_experiment(
    phase_length: Duration,
    http: &reqwest::Client,
    base: &str,
    cluster: &Arc<Cluster>,
    recorder: &Recorder,
    shutdown: &CancellationToken,
) -> Vec<PresenceResult> {
    let key = "claim:1";
    let stop = shutdown.child_token();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (http, base, recorder, stop) = (
            http.clone(),
            base.to_owned(),
            recorder.clone(),
            stop.clone(),
        );
        tasks.spawn(async move {
            let mut version = 0u64;
            while !stop.is_cancelled() {
                version += 1;
                let start = recorder.now_us();
                let (op, request) = if version % 2 == 1 {
                    (
                        Op::Write,
                        http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                            .body("held"),
                    )
                } else {
                    (
                        Op::Delete,
                        http.delete(format!("{base}/v1/keys/{key}?{VERSION}={version}")),
                    )
                };
                let answer = send(request).await;
                let mut record = event(
                    "claimer",
                    op,
                    key,
                    start,
                    recorder.now_us(),
                    outcome_of(&answer),
                );
                record.version = Some(version);
                recorder.push(record);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        });
    }
    {
        // Pause the claim's replica's replication for 150 ms every 300 ms: within the 250 ms
        // advisory budget, so the budget never sends those reads to the primary.
        let (cluster, stop) = (cluster.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                let cluster = cluster.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let topology = cluster.topology().ok()?;
                    let master = owner_port(&topology, key)?;
                    let master_id = topology.iter().find(|node| node.port == master)?.id.clone();
                    for replica in cluster.replicas_of(&master_id).ok()? {
                        let _ = devcluster::cli_with_timeout(
                            replica.port,
                            &["CLIENT", "PAUSE", "150", "WRITE"],
                            Duration::from_millis(200),
                        );
                    }
                    Some(())
                })
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
    }
    for class in ["advisory", "decides-on-presence"] {
        let (http, base, recorder, stop) = (
            http.clone(),
            base.to_owned(),
            recorder.clone(),
            stop.clone(),
        );
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                let start = recorder.now_us();
                let answer = send(http.get(format!(
                    "{base}/v1/keys/{key}?{CLIENT}=asker&{CLASS}={class}"
                )))
                .await;
                recorder.push_read(class, key, start, &answer);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        });
    }
    tokio::select! {
        () = tokio::time::sleep(phase_length) => {}
        () = stop.cancelled() => {}
    }
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    let events = recorder
        .events
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    ["advisory", "decides-on-presence"]
        .iter()
        .map(|class| judge_presence(class, &events))
        .collect()
}

/// Counts wrong "is it held?" decisions of one class against the claimer's acknowledged history.
/// A read overlapping any claim operation has no single truth and is not judged.
fn judge_presence(class: &str, events: &[Event]) -> PresenceResult {
    let ops: Vec<&Event> = events
        .iter()
        .filter(|event| event.session == "claimer")
        .collect();
    let mut decisions = 0;
    let mut wrong = 0;
    for read in events
        .iter()
        .filter(|event| event.session == class && event.op == Op::Read)
    {
        let held = match read.outcome {
            Outcome::Ok => true,
            Outcome::NotFound => false,
            _ => continue,
        };
        if ops
            .iter()
            .any(|op| op.start_us < read.end_us && op.end_us > read.start_us)
        {
            continue;
        }
        let Some(last) = ops
            .iter()
            .filter(|op| op.end_us <= read.start_us && op.outcome == Outcome::Ok)
            .max_by_key(|op| op.end_us)
        else {
            continue;
        };
        // A failed claim operation before the read leaves the truth unknown.
        if ops
            .iter()
            .any(|op| op.end_us <= read.start_us && op.start_us > last.start_us)
        {
            continue;
        }
        decisions += 1;
        if held != (last.op == Op::Write) {
            wrong += 1;
        }
    }
    PresenceResult {
        class: class.to_owned(),
        decisions,
        wrong,
    }
}
