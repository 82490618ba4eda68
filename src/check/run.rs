//! `hotsplit check`: a self-contained, seeded experiment that reproduces hotsplit's claims.
//! This file holds the options and the orchestration ([`run`]); the phases, faults, recorder
//! and figures are in the sibling files (see `mod.rs`).
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

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::history::Event;
use super::recorder::Recorder;
use super::report::{judge, CheckReport, Mode};
use super::resp::RespDoors;
use hotsplit::config::Config;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit_devcluster::{self as devcluster, Cluster, ClusterOptions, TlsFiles};

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
    /// The bearer token the run's service asks for (`[auth] tokens_file` with this token, every
    /// scope) and every request of the run sends. Default: none, a random one.
    pub token: Option<String>,
    /// TLS end to end: the cluster's nodes serve clients, replication and the bus with these
    /// files only, and the service and every connection of the run's own (samples, faults)
    /// speak TLS with them. Default: none, plain TCP.
    pub tls: Option<TlsFiles>,
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
            token: None,
            tls: None,
        }
    }
}

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
    /// The Redis-protocol doors of the `resp` mode.
    pub(super) resp: Option<Arc<RespDoors>>,
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
    say(if options.tls.is_some() {
        "setup: starting a 3-master/3-replica redis cluster over tls"
    } else {
        "setup: starting a 3-master/3-replica redis cluster"
    });
    let cluster = Arc::new(start_cluster(options.tls.clone()).await?);

    say("setup: starting hotsplit on the cluster");
    // A 2 s command timeout, as `--instances 2` and the integration tests use: at 300 ms, healthy
    // masters timed out on a loaded 2-core machine (load 13-26) and were marked failing, so more
    // than half of a phase's reads were refused `unavailable`, no reader met a lagging replica,
    // and the random-suffix control showed no violation. A stopped master is still found at once
    // by the health probes; the faults still lose writes and stall them.
    let config = Config::from_toml(&format!(
        "[store]\ncommand_timeout = \"2s\"\n[[family]]\nprefix = \"check:\"\ncopies = {}\nttl = \"10m\"\ndefault_class = \"advisory\"\n[[family]]\nprefix = \"claim:\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"advisory\"\n[near_cache]\nenabled = false\n",
        options.copies
    ))?;
    let mut config = config;
    config.store.redis = Some(cluster.url());
    if let Some(tls) = &options.tls {
        config.store.tls_ca_file = Some(tls.ca_file.clone());
        config.store.tls_cert_file = Some(tls.cert_file.clone());
        config.store.tls_key_file = Some(tls.key_file.clone());
    }
    // The run's own spool, removed with the run: never a spool another process owns.
    let spool = std::env::temp_dir().join(format!(
        "hotsplit-check-{}-{}",
        std::process::id(),
        options.seed
    ));
    config.heal.spool_dir = spool.clone();
    // The service asks for a token, so every request of the run passes the token check too.
    let token = options
        .token
        .clone()
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let tokens_file = spool.with_extension("tokens");
    std::fs::write(
        &tokens_file,
        format!(
            "{} read,write,admin  # hotsplit check\n",
            hotsplit::auth::hash_line(&token)
        ),
    )?;
    config.auth.tokens_file = Some(tokens_file.clone());
    // The same service with its near cache on, for the near-cache rows; a spool of its own.
    let mut near_config = config.clone();
    near_config.near_cache.enabled = true;
    let near_spool = spool.with_extension("near");
    near_config.heal.spool_dir = near_spool.clone();
    // Each service's Redis-protocol door, for the `resp` mode, on a port free a moment ago.
    let resp_address = free_address().await?;
    let near_resp_address = free_address().await?;
    config.resp.listen = Some(resp_address);
    near_config.resp.listen = Some(near_resp_address);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let near_listener = TcpListener::bind("127.0.0.1:0").await?;
    let near_base = format!("http://{}", near_listener.local_addr()?);
    let service_stop = CancellationToken::new();
    let mut service = tokio::spawn(hotsplit::server::run(listener, config, {
        let stop = service_stop.clone();
        async move { stop.cancelled().await }
    }));
    let mut near_service = tokio::spawn(hotsplit::server::run(near_listener, near_config, {
        let stop = service_stop.clone();
        async move { stop.cancelled().await }
    }));
    let mut authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Error::new(ErrorKind::Config, "the token must be visible ASCII"))?;
    authorization.set_sensitive(true);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .default_headers(
            [(reqwest::header::AUTHORIZATION, authorization)]
                .into_iter()
                .collect(),
        )
        .build()
        .map_err(|err| Error::new(ErrorKind::Io, format!("http client: {err}")))?;
    wait_ready(&http, &base, &mut service).await?;
    wait_ready(&http, &near_base, &mut near_service).await?;
    say("setup: waiting until hotsplit measures the lag of all three replicas");
    wait_replicas_measured(&http, &base).await?;
    wait_replicas_measured(&http, &near_base).await?;

    let phases = (Mode::ALL.len() + NEAR_CACHE_MODES.len()) as u32 + 1;
    let phase_length = (options.duration / phases).max(Duration::from_secs(2));
    let experiment = Experiment {
        http,
        write_base: base.clone(),
        base,
        cluster,
        recorder: recorder.clone(),
        keys: options.keys,
        readers: options.readers,
        copies: options.copies,
        phase_length,
        shutdown: shutdown.clone(),
        key_tag: "",
        resp: Some(Arc::new(RespDoors {
            read: resp_address.to_string(),
            write: resp_address.to_string(),
            token: token.clone(),
        })),
    };
    let near_experiment = Experiment {
        http: experiment.http.clone(),
        base: near_base,
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
            read: near_resp_address.to_string(),
            write: resp_address.to_string(),
            token: token.clone(),
        })),
    };
    let runs = Mode::ALL.into_iter().map(|mode| (mode, &experiment)).chain(
        NEAR_CACHE_MODES
            .into_iter()
            .map(|mode| (mode, &near_experiment)),
    );
    let mut modes = Vec::new();
    for (index, (mode, experiment)) in runs.enumerate() {
        if shutdown.is_cancelled() {
            break;
        }
        let near_cache = !experiment.key_tag.is_empty();
        let name = format!("{}{}", mode.as_str(), experiment.key_tag);
        say(&name);
        let mut rng = StdRng::seed_from_u64(options.seed.wrapping_add(index as u64));
        let reads_before = copy_reads(&experiment.cluster);
        let phase_started = Instant::now();
        let loss_windows = experiment.run_mode(mode, &mut rng).await;
        // A node restarted by the faults starts its counts again: its reads since the restart.
        let reads: u64 = copy_reads(&experiment.cluster)
            .iter()
            .zip(&reads_before)
            .map(|(after, before)| {
                if after >= before {
                    after - before
                } else {
                    *after
                }
            })
            .sum();
        let reads_per_s = reads as f64 / phase_started.elapsed().as_secs_f64().max(0.001);
        let events = recorder.take();
        write_history(&options, &name, &events)?;
        let mut result = judge(mode, &events, &loss_windows);
        result.near_cache = near_cache;
        result.redis_reads_per_s = reads_per_s;
        modes.push(result);
    }
    drop(near_experiment);
    say("presence");
    let presence = experiment.presence().await;
    write_history(&options, "presence", &recorder.take())?;

    say("report");
    ticker_stop.cancel();
    let _ = ticker.await;
    service_stop.cancel();
    let _ = service.await;
    let _ = near_service.await;
    drop(experiment);
    let _ = std::fs::remove_dir_all(&spool);
    let _ = std::fs::remove_file(&tokens_file);
    let _ = std::fs::remove_dir_all(&near_spool);
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

/// A loopback address no socket was bound to a moment ago (the service binds it next).
async fn free_address() -> Result<std::net::SocketAddr> {
    let probe = TcpListener::bind("127.0.0.1:0").await?;
    Ok(probe.local_addr()?)
}

/// The modes that run a second time against the service with its near cache on.
const NEAR_CACHE_MODES: [Mode; 3] = [Mode::Affine, Mode::Floor, Mode::Resp];

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

/// Polls `base`'s `/readyz` until it answers 2xx; fails at once, with its error, when the
/// service at `base` (`service`) stops first, e.g. because it could not connect to the cluster,
/// and after 20 s with the last answer (or why there was none).
async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    service: &mut tokio::task::JoinHandle<Result<()>>,
) -> Result<()> {
    let last = Mutex::new(String::from("no answer yet"));
    let waited = wait_for(
        "hotsplit did not become ready on the cluster",
        Duration::from_secs(20),
        || async {
            if service.is_finished() {
                return true;
            }
            let seen = match http.get(format!("{base}/readyz")).send().await {
                Ok(answer) if answer.status().is_success() => return true,
                Ok(answer) => {
                    let status = answer.status();
                    format!("{status}: {}", answer.text().await.unwrap_or_default())
                }
                Err(err) => err.to_string(),
            };
            *last.lock().unwrap_or_else(PoisonError::into_inner) = seen;
            false
        },
    )
    .await;
    if let Err(err) = waited {
        let last = last.into_inner().unwrap_or_else(PoisonError::into_inner);
        return Err(Error::new(
            err.kind(),
            format!("{}; the last /readyz: {last}", err.message()),
        ));
    }
    if !service.is_finished() {
        return Ok(());
    }
    let why = match service.await {
        Ok(Ok(())) => "it stopped without an error".to_owned(),
        Ok(Err(err)) => err.to_string(),
        Err(err) => format!("its task failed: {err}"),
    };
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("hotsplit could not start on the cluster: {why}"),
    ))
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
