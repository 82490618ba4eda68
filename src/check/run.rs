//! `hotsplit check`: a self-contained, seeded experiment that reproduces hotsplit's claims.
//! This file holds the orchestration ([`run`]: progress, the cluster, the
//! modes, presence, the report); the services under test, the phases, faults, recorder and
//! figures are in the sibling files (see `mod.rs`).
//!
//! It starts a throwaway 3-master/3-replica cluster (`hotsplit_devcluster`) and a hotsplit
//! service on it, then runs the same seeded fault schedule once per [`Mode`] while writers
//! publish increasing versions and reader sessions read. Every operation, direct copy sample and
//! fault is recorded as an [`Event`]; the [`checkers`](super::checkers) then count monotonic-read
//! violations, stale reads, source loads and convergence per mode. A presence experiment asks
//! "is the claim held?" through the `advisory` and `decides-on-presence` read classes while a
//! replica's replication is paused, and counts wrong decisions.
//!
//! The `affine` and `floor` modes run twice: against the service with its near cache off, and
//! against a second service on the same cluster with it on (the rows marked "near cache"), each
//! row with the measured staleness of every read against the readers' class budget and the copy
//! reads per second Redis served. In the near-cache rows the writers publish (and read their
//! own writes back) through the first service, so the readers' instance learns of each write
//! only from Redis, within its near-cache max age: the rows measure that bound, not the writes
//! through the instance that it would see at once. The presence experiment runs with the cache off: it measures
//! replica lag, which a cache answering writes through the instance would hide.
//!
//! `--mode` names the modes to run (then without the presence experiment); `client-cache`
//! runs only when named, against the near-cache service's door with writers through both
//! services (see `client_cache.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio_util::sync::CancellationToken;

pub use super::options::CheckOptions;

use super::client_cache::{self, CacheBound};
use super::history::Event;
use super::recorder::Recorder;
use super::report::{judge, CheckReport, ClientCacheFigures, Mode, ModeResult};
use super::resp::RespDoors;
use super::services::Services;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit_devcluster::{self as devcluster, Cluster, ClusterOptions, TlsFiles};

/// What every phase of a run works with: the service under test and its cluster, the shared
/// recorder, the workload's shape and the phase length. The phases are its methods
/// ([`Experiment::run_mode`] in `workload.rs`, [`Experiment::presence`] in `presence.rs`).
pub(super) struct Experiment {
    /// The HTTP client of the service under test.
    pub(super) http: reqwest::Client,
    /// The service's base URL, `http://127.0.0.1:<port>`.
    pub(super) base: String,
    /// Where the writers publish and read their own writes back: `base`, or in the near-cache
    /// rows the service with its near cache off (another instance, as far as readers know).
    pub(super) write_base: String,
    /// The throwaway cluster the service runs on; dropping it kills the servers.
    pub(super) cluster: Arc<Cluster>,
    /// The history every task of a phase appends to.
    pub(super) recorder: Recorder,
    /// Hot keys per mode.
    pub(super) keys: u32,
    /// Reader sessions per mode.
    pub(super) readers: u32,
    /// Copies per hot key.
    pub(super) copies: u32,
    /// How long each phase runs.
    pub(super) phase_length: Duration,
    /// Appended to each mode's key names, so the near-cache rows write keys of their own.
    pub(super) key_tag: &'static str,
    /// Cancelled on ctrl-c or SIGTERM: a phase then stops early.
    pub(super) shutdown: CancellationToken,
    /// The Redis-protocol doors of the `resp` and `client-cache` modes.
    pub(super) resp: Option<Arc<RespDoors>>,
    /// What the `client-cache` mode judges cached answers against: set on the experiment
    /// whose readers read one service and whose writers publish through the other.
    pub(super) cache_bound: Option<CacheBound>,
}

/// What every task of one phase holds: the service's client and base URL, the cluster, the
/// history, and the phase's stop token. Cheap to clone: each task takes its own copy.
#[derive(Clone)]
pub(super) struct Phase {
    /// The HTTP client of the service under test.
    pub(super) http: reqwest::Client,
    /// The service's base URL.
    pub(super) base: String,
    /// Where the phase's writers publish (see [`Experiment::write_base`]).
    pub(super) write_base: String,
    /// The throwaway cluster.
    pub(super) cluster: Arc<Cluster>,
    /// The history the phase's tasks append to.
    pub(super) recorder: Recorder,
    /// Cancelled when the phase ends; a child of the run's shutdown, so ctrl-c ends it too.
    pub(super) stop: CancellationToken,
}

impl Phase {
    /// What a task that talks to the service takes: its own client, base URL, recorder and stop
    /// token.
    pub(super) fn service_handles(&self) -> (reqwest::Client, String, Recorder, CancellationToken) {
        (
            self.http.clone(),
            self.base.clone(),
            self.recorder.clone(),
            self.stop.clone(),
        )
    }
}

impl Experiment {
    /// The handles of a new phase, with a stop token of its own.
    pub(super) fn phase(&self) -> Phase {
        Phase {
            http: self.http.clone(),
            base: self.base.clone(),
            write_base: self.write_base.clone(),
            cluster: self.cluster.clone(),
            recorder: self.recorder.clone(),
            stop: self.shutdown.child_token(),
        }
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
    let recorder = Recorder::new();
    let reporter = Reporter::start(Arc::new(progress), recorder.clone());
    reporter.say(if options.tls.is_some() {
        "setup: starting a 3-master/3-replica redis cluster over tls"
    } else {
        "setup: starting a 3-master/3-replica redis cluster"
    });
    let cluster = Arc::new(start_cluster(options.tls.clone()).await?);

    reporter.say("setup: starting hotsplit on the cluster");
    let services = Services::start(&options, &cluster).await?;
    reporter.say("setup: waiting until hotsplit measures the lag of all three replicas");
    services.wait_replicas_measured().await?;

    let (experiment, near_experiment) =
        experiments(&services, &options, cluster, &recorder, &shutdown);
    let modes = run_modes(&experiment, &near_experiment, &options, &reporter).await?;
    drop(near_experiment);
    let presence = if options.modes.is_empty() {
        reporter.say("presence");
        let presence = experiment.presence().await;
        write_history(&options, "presence", &recorder.take())?;
        presence
    } else {
        Vec::new()
    };

    reporter.say("report");
    reporter.stop().await;
    let files = services.stop().await;
    drop(experiment);
    files.remove();
    let report = CheckReport {
        seed: options.seed,
        modes,
        presence,
    };
    write_report(&options, &report)?;
    Ok(report)
}

/// The caller's progress callback: called at each phase's start ([`Reporter::say`]) and every
/// 2 s while a phase runs, by a ticker task, until [`Reporter::stop`].
struct Reporter {
    /// The caller's callback.
    progress: Arc<dyn Fn(Progress) + Send + Sync>,
    /// The run's history, whose count of operations each report carries.
    recorder: Recorder,
    /// The phase running now, as last said.
    phase: Arc<Mutex<String>>,
    /// When the run started.
    started: Instant,
    /// Cancelled to stop the ticker.
    ticker_stop: CancellationToken,
    /// The ticker task.
    ticker: tokio::task::JoinHandle<()>,
}

impl Reporter {
    /// Starts the ticker, in the `setup` phase.
    fn start(progress: Arc<dyn Fn(Progress) + Send + Sync>, recorder: Recorder) -> Reporter {
        let started = Instant::now();
        let phase = Arc::new(Mutex::new(String::from("setup")));
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
        Reporter {
            progress,
            recorder,
            phase,
            started,
            ticker_stop,
            ticker,
        }
    }

    /// Enters the phase `name` and reports it at once.
    fn say(&self, name: &str) {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = name.to_owned();
        (self.progress)(Progress {
            phase: name.to_owned(),
            elapsed: self.started.elapsed(),
            operations: self.recorder.count.load(Ordering::Relaxed),
        });
    }

    /// Stops the ticker and waits for it.
    async fn stop(self) {
        self.ticker_stop.cancel();
        let _ = self.ticker.await;
    }
}

/// The experiment against the service with its near cache off, and the one whose readers
/// read the service with it on (its writers still publish through the first); each phase
/// lasts an equal share of `options.duration` (at least 2 s).
fn experiments(
    services: &Services,
    options: &CheckOptions,
    cluster: Arc<Cluster>,
    recorder: &Recorder,
    shutdown: &CancellationToken,
) -> (Experiment, Experiment) {
    let presence = u32::from(options.modes.is_empty());
    let phases = (plan(options).len() as u32 + presence).max(1);
    let phase_length = (options.duration / phases).max(Duration::from_secs(2));
    let experiment = Experiment {
        http: services.http.clone(),
        write_base: services.base.clone(),
        base: services.base.clone(),
        cluster,
        recorder: recorder.clone(),
        keys: options.keys,
        readers: options.readers,
        copies: options.copies,
        phase_length,
        shutdown: shutdown.clone(),
        key_tag: "",
        resp: Some(Arc::new(RespDoors {
            read: services.resp_address.to_string(),
            write: services.resp_address.to_string(),
            token: services.token.clone(),
        })),
        cache_bound: None,
    };
    let near_experiment = Experiment {
        http: experiment.http.clone(),
        base: services.near_base.clone(),
        write_base: experiment.base.clone(),
        cluster: experiment.cluster.clone(),
        recorder: recorder.clone(),
        keys: options.keys,
        readers: options.readers,
        copies: options.copies,
        phase_length,
        shutdown: shutdown.clone(),
        key_tag: "-near",
        resp: Some(Arc::new(RespDoors {
            read: services.near_resp_address.to_string(),
            write: services.resp_address.to_string(),
            token: services.token.clone(),
        })),
        cache_bound: Some(services.cache_bound),
    };
    (experiment, near_experiment)
}

/// Runs every mode against `experiment`, then the near-cache modes against `near_experiment`,
/// each seeded with the run's seed plus its index, until the run's shutdown; writes each mode's
/// history and gives each judged row.
///
/// # Errors
/// I/O errors writing a history.
async fn run_modes(
    experiment: &Experiment,
    near_experiment: &Experiment,
    options: &CheckOptions,
    reporter: &Reporter,
) -> Result<Vec<ModeResult>> {
    let runs = plan(options).into_iter().map(|(mode, near)| {
        if near {
            (mode, near_experiment)
        } else {
            (mode, experiment)
        }
    });
    let mut modes = Vec::new();
    for (index, (mode, experiment)) in runs.enumerate() {
        if experiment.shutdown.is_cancelled() {
            break;
        }
        let name = format!("{}{}", mode.as_str(), experiment.key_tag);
        reporter.say(&name);
        let mut rng = StdRng::seed_from_u64(options.seed.wrapping_add(index as u64));
        let reads_before = copy_reads(&experiment.cluster);
        let flushes_before = client_cache::flush_counts(&experiment.http, &experiment.base).await;
        let phase_started = Instant::now();
        let loss_windows = experiment.run_mode(mode, &mut rng).await;
        let flushes_after = client_cache::flush_counts(&experiment.http, &experiment.base).await;
        let reads = copy_reads_since(&experiment.cluster, &reads_before);
        let reads_per_s = reads as f64 / phase_started.elapsed().as_secs_f64().max(0.001);
        let events = experiment.recorder.take();
        write_history(options, &name, &events)?;
        let mut result = judge(mode, &events, &loss_windows);
        if let (Mode::ClientCache, Some(bound)) = (mode, experiment.cache_bound) {
            let mut figures = ClientCacheFigures::judge(&events, &loss_windows, bound);
            figures.flush_pushes = flushes_after.0.saturating_sub(flushes_before.0);
            figures.feed_flushes = flushes_after.1.saturating_sub(flushes_before.1);
            result.client_cache = Some(figures);
        }
        result.near_cache = !experiment.key_tag.is_empty();
        result.redis_reads_per_s = reads_per_s;
        modes.push(result);
    }
    Ok(modes)
}

/// Copy reads `cluster` served since `before` (from [`copy_reads`]), summed over its nodes.
fn copy_reads_since(cluster: &Cluster, before: &[u64]) -> u64 {
    // A node restarted by the faults starts its counts again: its reads since the restart.
    copy_reads(cluster)
        .iter()
        .zip(before)
        .map(|(after, before)| {
            if after >= before {
                after - before
            } else {
                *after
            }
        })
        .sum()
}

/// Writes the report (`report.md`) and its JSON summary (`summary.json`) into `options.out`,
/// when set.
///
/// # Errors
/// I/O errors writing either file.
fn write_report(options: &CheckOptions, report: &CheckReport) -> Result<()> {
    if let Some(dir) = &options.out {
        std::fs::write(dir.join("report.md"), report.markdown())?;
        let summary = serde_json::to_string_pretty(report)
            .map_err(|err| Error::new(ErrorKind::Io, err.to_string()))?;
        std::fs::write(dir.join("summary.json"), summary)?;
    }
    Ok(())
}

/// Starts the run's throwaway 3-master/3-replica cluster (`cluster-require-full-coverage no`),
/// with TLS only when `tls` is given; shared with `--instances 2`.
///
/// # Errors
/// [`ErrorKind::Io`] when `redis-server` is missing (the message says how to install it) or
/// the cluster does not start (a TLS file that does not serve included).
pub(super) async fn start_cluster(tls: Option<TlsFiles>) -> Result<Cluster> {
    devcluster::redis_server_path().map_err(|err| Error::new(ErrorKind::Io, err.to_string()))?;
    tokio::task::spawn_blocking(|| {
        Cluster::start(ClusterOptions {
            extra_args: vec!["--cluster-require-full-coverage".into(), "no".into()],
            tls,
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
    })
}

/// The modes that run a second time against the service with its near cache on.
const NEAR_CACHE_MODES: [Mode; 3] = [Mode::Affine, Mode::Floor, Mode::Resp];

/// The phases `options` asks for, in order, each as its mode and whether it runs against the
/// near-cache experiment: without `--mode`, every mode of [`Mode::ALL`] then the near-cache
/// modes; with it, only the named ones, in that same order. `client-cache` runs only against the
/// near-cache experiment, whose readers and writers reach different services (the feed
/// carries the writes between them), and only when named: it adds feed cuts to the faults
/// and wants a phase of its own length.
fn plan(options: &CheckOptions) -> Vec<(Mode, bool)> {
    let named = |mode: &Mode| options.modes.is_empty() || options.modes.contains(mode);
    let plain = Mode::ALL
        .into_iter()
        .filter(named)
        .map(|mode| (mode, false));
    let near = NEAR_CACHE_MODES
        .into_iter()
        .filter(named)
        .chain(
            options
                .modes
                .contains(&Mode::ClientCache)
                .then_some(Mode::ClientCache),
        )
        .map(|mode| (mode, true));
    plain.chain(near).collect()
}

/// Copy reads (`HMGET` calls) each node of `cluster` has served so far, in node order; a node
/// that does not answer counts 0.
fn copy_reads(cluster: &Cluster) -> Vec<u64> {
    cluster
        .nodes()
        .iter()
        .map(|node| {
            node.cli(&["INFO", "commandstats"])
                .ok()
                .and_then(|stats| {
                    stats
                        .lines()
                        .find_map(|line| line.strip_prefix("cmdstat_hmget:calls="))
                        .and_then(|rest| rest.split(',').next())
                        .and_then(|calls| calls.parse::<u64>().ok())
                })
                .unwrap_or(0)
        })
        .collect()
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
