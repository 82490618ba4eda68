//! The hot-key detector and the automatic split under a moving hotspot (issue 23's proof
//! figures), end to end: a throwaway 3-master/3-replica cluster ([`hotsplit_devcluster`]), two
//! `hotsplit serve` processes (the release binary this bench is built beside) sharing it as one
//! fleet, and a load generator in this process (tokio + reqwest, `GET
//! /v1/keys/KEY?client=ID&class=primary`).
//!
//! Not a criterion bench: one run prints one markdown table on stdout, each figure beside its
//! target and whether it was met. Run with `cargo bench --bench hot_moving` (about 2 minutes:
//! part 1 for `--duration`, part 2 until the split key is spread plus 3 s, at most
//! `--split-hold`), or e.g. `cargo bench --bench hot_moving -- --duration 20s --hot-every 4s
//! --seed 7`. Without `--bench` (as `cargo test --benches` runs it) it exits at once: it needs a
//! cluster and seconds of load, too much for a smoke test.
//!
//! **The load.** `--concurrency` tasks (64) paced to `--rate` reads per second in all (3000; a
//! task that falls behind sends at once, so the achieved rate is printed). Each read is, with
//! probability `--hot-share` (0.99), of the hot key of the moment, else of a key drawn uniformly
//! from `--cold-keys` (100,000) keys `mv:cold:N`. The cold keys are never published: a read of a
//! missing key answers 404, and the detector counts it as a read (`Reader::read` offers a
//! `NotFound` answer like a value), so a 404 counts in every figure below as a 200 does. Each
//! task rotates over 16 client ids of its own (1024 in all, so a split key's reads spread over
//! its copies by the client hash). Every answered read (200 or 404) is logged with its instance,
//! key and completion time (Unix ms): the load generator's own counts, the ground truth.
//!
//! **Part 1, the moving hotspot** (`--duration`, 60 s): the hot key is `mv:hot:M` during move
//! `M`, a new key each move (none hot before: a key seen hot stays hot for `hot_keys.cool_down`
//! after its reads stop, so going back to an earlier key would measure nothing). A move lasts
//! `--hot-every` (4 s) × a factor drawn from 0.75..1.25 (seeded by `--seed`), so the moves fall
//! at every phase of the detector's 1 s windows (a period that is a multiple of the window would
//! measure one latency over and over). Move `M`'s hot reads go to instance `M mod 2`, "the
//! instance that sees it"; cold reads to either at random. Both instances' `GET /v1/hot-keys`
//! (no auth configured, so the admin route answers without a token) are polled every `--poll`
//! (25 ms; every `--interval` in part 2, where the polls' own store reads would count among the
//! masters' `HMGET`s). Figures:
//! - (a) per move, from the move to the first poll of the seeing instance that lists the key
//!   hot: `hot: true` in `instance.keys`, or in `instance.other_hot` (where a key found hot by
//!   its count in the window still open is listed until that window closes); target ≤ 1 s for
//!   every move (the maximum is judged);
//! - (b) per move, to the first poll of the *other* instance whose `fleet.keys` lists the key
//!   with a non-empty `hot_on` (an instance's own figures are live in its fleet view, so the
//!   other one shows what the registry carries); target: (b) − (a) ≤ one registry heartbeat
//!   (`fleet.heartbeat_interval`, default 2 s) for every move, give or take one poll period (a
//!   difference of two polled times is only that exact);
//! - (c) for every closed window (`instance.closed_at_ms`, its length the distance from the
//!   instance's previous window, or `hot_keys.window`) of either instance inside part 1, the
//!   reported keys `R` (`instance.keys`, at most `hot_keys.list` = 10) against the true counts
//!   of the reads that instance answered in the window. *Top-10*: the true top-10 `T` is every
//!   key whose count is at least the 10th highest count (ties at the cut all in); precision =
//!   Σ|R ∩ T| / Σ|R|, recall = Σ|R ∩ T| / Σ min(10, |T|), summed over the windows. With 99 % on one
//!   key and the rest uniform over 100,000 keys, `T` is the hot key and the dozen or so keys read
//!   once each; below `hot_keys.samples_per_s` reads a second the detector counts every read, so
//!   `R` is a true top-10 but for the reads that land in a different window there than here (a
//!   read's completion time here and its count there differ by the answer's flight); above it,
//!   it samples, and then lists only the few keys read once that it sampled. *Above the
//!   threshold*: `H` = keys whose true rate (count ÷ window seconds) is ≥ `hot_keys.threshold`,
//!   `Ĥ` = keys of `R` whose guaranteed rate (`rate − rate_error`, the detector's own test for
//!   hot) is ≥ the threshold; precision = Σ|Ĥ ∩ H| / Σ|Ĥ|, recall = Σ|Ĥ ∩ H| / Σ|H|. Target ≥ 0.9
//!   for both pairs.
//!
//! **Part 2, the split** (right after part 1): the hot key moves to `sp:hot`, of family `sp:`
//! (`copies = 1`, `placement = "spread"`, `split = { mode = "split", max_copies = 16, threshold
//! = hot_keys.threshold, cool_down = "60s" }`), read through instance 0 with the `primary` class.
//! Every `--interval` (250 ms) the bench reads `cmdstat_hmget` from `INFO commandstats` of every
//! master (the command a copy read is), and each interval's per-master deltas give the masters'
//! shares of the reads (cold reads included: 1 % spread evenly). *Spread* is the first interval
//! whose busiest master's share is ≤ 0.45 (against 1.0 unsplit and 1/3 even); the figure is the
//! time from the move to that interval's end. Before: the median busiest share of the intervals
//! between the move and the first poll of instance 0 showing the key's `split_phase` as
//! `reading` (or spread, whichever is first); after: the median busiest share (and the median
//! least share) of the intervals after the spread one. Part 2 ends 3 s after spread, or after
//! `--split-hold` (45 s) without it. The time also depends on `heal.layout_interval`
//! (`--layout-interval`, default the shipped one, 5 s), which paces the split protocol's moves.
//!
//! Both instances run the shipped defaults but for: their ports, spool directories and the
//! cluster URL, `HOTSPLIT_LOG=warn`, the two families, `heal.layout_interval` (as given), and
//! `[scrub] enabled = false` (so every `HMGET` counted is a read). Every process is killed by
//! pid when the bench ends (the instances by their devcluster `Process` guards, the cluster by
//! devcluster), and the work directory is removed; each instance's log is kept there for the
//! run.

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hotsplit::config::{FleetConfig, HealConfig, StoreConfig};
use hotsplit::hot::HotKeysConfig;
use hotsplit_devcluster::{Cluster, ClusterOptions, Process};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

type BoxError = Box<dyn Error + Send + Sync>;

/// The busiest master's share at or under which a split key's reads count as spread.
const SPREAD_SHARE: f64 = 0.45;
/// How long part 2 keeps going once the key is spread (the "after" intervals).
const AFTER_SPREAD: Duration = Duration::from_secs(3);
/// Client ids per load task.
const IDS_PER_TASK: usize = 16;
/// The split key.
const SPLIT_KEY: &str = "sp:hot";
/// The split family's `max_copies`.
const SPLIT_COPIES: u32 = 16;
/// The detector's target: (a) at most this long.
const DETECT_TARGET: Duration = Duration::from_secs(1);
/// The precision and recall target.
const QUALITY_TARGET: f64 = 0.9;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// The command line.
#[derive(Debug, Clone)]
struct Options {
    /// Part 1's length.
    duration: Duration,
    /// How often the hotspot moves in part 1.
    hot_every: Duration,
    /// Seeds the load tasks' generators.
    seed: u64,
    /// Reads per second the load aims at, all tasks together.
    rate: f64,
    /// Load tasks.
    concurrency: usize,
    /// Cold keys (`mv:cold:0..N`).
    cold_keys: u32,
    /// The hot key's share of the reads.
    hot_share: f64,
    /// The longest part 2 waits for the split key to spread.
    split_hold: Duration,
    /// `heal.layout_interval` of both instances.
    layout_interval: Duration,
    /// How often `/v1/hot-keys` is polled.
    poll: Duration,
    /// How often the masters' `INFO commandstats` is read in part 2.
    interval: Duration,
}

impl Options {
    /// The command line after the program name; `None` without `--bench` (a smoke run: do
    /// nothing).
    fn parse(args: &[String]) -> Result<Option<Options>, BoxError> {
        let mut options = Options {
            duration: Duration::from_secs(60),
            hot_every: Duration::from_secs(4),
            seed: 1,
            rate: 3000.0,
            concurrency: 64,
            cold_keys: 100_000,
            hot_share: 0.99,
            split_hold: Duration::from_secs(45),
            layout_interval: HealConfig::default().layout_interval,
            poll: Duration::from_millis(25),
            interval: Duration::from_millis(250),
        };
        let mut bench = false;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            if arg == "--bench" {
                bench = true;
                continue;
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{arg} needs a value"))?
                .as_str();
            let duration =
                || humantime::parse_duration(value).map_err(|err| format!("{arg}: {err}"));
            match arg.as_str() {
                "--duration" => options.duration = duration()?,
                "--hot-every" => options.hot_every = duration()?,
                "--split-hold" => options.split_hold = duration()?,
                "--layout-interval" => options.layout_interval = duration()?,
                "--poll" => options.poll = duration()?,
                "--interval" => options.interval = duration()?,
                "--seed" => options.seed = value.parse()?,
                "--rate" => options.rate = value.parse()?,
                "--concurrency" => options.concurrency = value.parse()?,
                "--cold-keys" => options.cold_keys = value.parse()?,
                "--hot-share" => options.hot_share = value.parse()?,
                _ => return Err(format!("unknown option {arg}").into()),
            }
        }
        if options.hot_every.is_zero() || options.duration < options.hot_every {
            return Err("--hot-every must be positive and at most --duration".into());
        }
        if !(options.rate.is_finite() && options.rate >= 1.0)
            || options.concurrency == 0
            || options.cold_keys == 0
        {
            return Err("--rate must be at least 1, --concurrency and --cold-keys positive".into());
        }
        if !(0.0..=1.0).contains(&options.hot_share) {
            return Err("--hot-share must be in 0..=1".into());
        }
        Ok(bench.then_some(options))
    }

    /// Part 1's moves, as offsets from its start: each lasts `hot_every` × a factor drawn
    /// uniformly from 0.75..1.25 (seeded by `seed`), so the moves fall at every phase of the
    /// detector's windows rather than at one (a period that is a multiple of the window would
    /// measure one latency over and over); the last lasts until `duration`, at least 0.75 ×
    /// `hot_every`.
    fn move_offsets(&self) -> Vec<Duration> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let shortest = self.hot_every.mul_f64(0.75);
        let mut offsets = vec![Duration::ZERO];
        let mut at = Duration::ZERO;
        loop {
            at += self.hot_every.mul_f64(rng.random_range(0.75..1.25));
            if at + shortest > self.duration {
                return offsets;
            }
            offsets.push(at);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clocks and keys
// ---------------------------------------------------------------------------------------------

/// Now, Unix ms (the clock `/v1/hot-keys` speaks).
fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

/// A key as the load log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum KeyId {
    /// `mv:cold:N`.
    Cold(u32),
    /// Part 1's `mv:hot:M`.
    Hot(u32),
    /// Part 2's [`SPLIT_KEY`].
    Split,
}

impl KeyId {
    fn name(self) -> String {
        match self {
            KeyId::Cold(n) => format!("mv:cold:{n}"),
            KeyId::Hot(m) => format!("mv:hot:{m}"),
            KeyId::Split => SPLIT_KEY.to_owned(),
        }
    }
}

/// When the hotspot is where: part 1 from `start` for `part1`, moving at `moves`; then part 2.
#[derive(Debug, Clone)]
struct Schedule {
    /// Part 1's start.
    start: Instant,
    /// The same moment, Unix ms.
    start_ms: f64,
    /// Part 1's length.
    part1: Duration,
    /// Each move's offset from `start` (the first is zero), [`Options::move_offsets`].
    moves: Vec<Duration>,
}

impl Schedule {
    /// The hot key at `now` and the instance its hot reads go to.
    fn hot_at(&self, now: Instant) -> (KeyId, usize) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= self.part1 {
            return (KeyId::Split, 0);
        }
        let m = self
            .moves
            .partition_point(|offset| *offset <= elapsed)
            .saturating_sub(1);
        (KeyId::Hot(m as u32), m % 2)
    }

    /// Move `m`'s time, Unix ms.
    fn move_ms(&self, m: usize) -> f64 {
        self.start_ms + self.moves[m].as_secs_f64() * 1000.0
    }

    /// Part 2's start (the move to [`SPLIT_KEY`]), Unix ms.
    fn part2_ms(&self) -> f64 {
        self.start_ms + self.part1.as_secs_f64() * 1000.0
    }
}

// ---------------------------------------------------------------------------------------------
// The fleet: a cluster and two `hotsplit serve` processes
// ---------------------------------------------------------------------------------------------

/// A running `hotsplit serve`.
struct Instance {
    /// `http://127.0.0.1:P`.
    base: String,
    /// The process (SIGKILLed and reaped when dropped); its stdout and stderr go to its log.
    process: Process,
}

/// How long an instance may take to answer `/readyz` with a 2xx.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A loopback port no socket was bound to a moment ago.
fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The config both instances share but for `port` and `spool`.
fn instance_config(url: &str, port: u16, spool: &Path, options: &Options) -> String {
    let hot = HotKeysConfig::default();
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nshutdown_grace = \"1s\"\n\
         [store]\nredis = \"{url}\"\n\
         [heal]\nspool_dir = {spool:?}\nlayout_interval = \"{layout}\"\n\
         [scrub]\nenabled = false\n\
         [[family]]\nprefix = \"mv:\"\ncopies = 1\nttl = \"10m\"\n\
         [[family]]\nprefix = \"sp:\"\ncopies = 1\nttl = \"10m\"\nplacement = \"spread\"\n\
         split = {{ mode = \"split\", max_copies = {SPLIT_COPIES}, threshold = {threshold:?}, cool_down = \"60s\" }}\n",
        spool = spool.display().to_string(),
        layout = humantime::format_duration(options.layout_interval),
        threshold = hot.threshold,
    )
}

/// Starts `hotsplit serve` named `name` in `dir` on the cluster at `cluster_url`.
fn spawn_instance(
    dir: &Path,
    name: &str,
    cluster_url: &str,
    options: &Options,
) -> Result<Instance, BoxError> {
    let port = free_port()?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        instance_config(
            cluster_url,
            port,
            &dir.join(format!("{name}-spool")),
            options,
        ),
    )?;
    let process = Process::builder(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_CONFIG")
        .env("HOTSPLIT_LOG", "warn")
        .spawn(dir.join(format!("{name}.log")))?;
    Ok(Instance {
        base: format!("http://127.0.0.1:{port}"),
        process,
    })
}

/// Starts both instances, then waits until each answers `/readyz` with a 2xx (polled every
/// 50 ms, for at most [`READY_WITHIN`]; the error quotes the tail of its log). Blocks.
fn start_instances(
    dir: &Path,
    cluster_url: &str,
    options: &Options,
) -> Result<Vec<Instance>, BoxError> {
    let mut instances = vec![
        spawn_instance(dir, "hotsplit-0", cluster_url, options)?,
        spawn_instance(dir, "hotsplit-1", cluster_url, options)?,
    ];
    for instance in &mut instances {
        instance.process.wait_for_http(
            &format!("{}/readyz", instance.base),
            READY_WITHIN,
            Duration::from_millis(50),
        )?;
    }
    Ok(instances)
}

/// Publishes version 1 of `key` through `base`.
async fn publish(http: &reqwest::Client, base: &str, key: &str) -> Result<(), BoxError> {
    let answer = http
        .put(format!("{base}/v1/keys/{key}?version=1"))
        .body("v".repeat(64))
        .send()
        .await?;
    if !answer.status().is_success() {
        let status = answer.status();
        return Err(format!("publish {key}: {status}: {}", answer.text().await?).into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------------------------

/// One answered read.
#[derive(Debug, Clone, Copy)]
struct Read {
    /// When its answer arrived, Unix ms.
    at_ms: f64,
    /// The instance that answered.
    instance: usize,
    /// The key.
    key: KeyId,
}

/// What one load task did.
#[derive(Debug, Default)]
struct Tally {
    /// Answered reads (200 and 404).
    reads: Vec<Read>,
    /// 200s.
    found: u64,
    /// 404s.
    missing: u64,
    /// Any other status.
    other: u64,
    /// No answer.
    failed: u64,
}

/// What the load tasks share.
struct Load {
    http: reqwest::Client,
    /// The instances' bases.
    bases: Vec<String>,
    schedule: Schedule,
    options: Options,
    /// Set to stop.
    stop: AtomicBool,
}

/// One load task: paced reads until `load.stop`.
async fn load_task(load: Arc<Load>, task: usize) -> Tally {
    let mut rng = StdRng::seed_from_u64(
        load.options.seed ^ (task as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let period = Duration::from_secs_f64(load.options.concurrency as f64 / load.options.rate);
    // Spread the tasks' first reads over one period.
    let mut next = Instant::now() + period.mul_f64(task as f64 / load.options.concurrency as f64);
    let mut tally = Tally::default();
    let mut turn = 0usize;
    while !load.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            tokio::time::sleep_until(next.into()).await;
        } else if now - next > Duration::from_millis(100) {
            // Behind: send at once, without bursting to catch up.
            next = now;
        }
        next += period;
        let (hot, hot_instance) = load.schedule.hot_at(Instant::now());
        let (key, instance) = if rng.random_bool(load.options.hot_share) {
            (hot, hot_instance)
        } else {
            (
                KeyId::Cold(rng.random_range(0..load.options.cold_keys)),
                rng.random_range(0..load.bases.len()),
            )
        };
        turn += 1;
        let url = format!(
            "{}/v1/keys/{}?client=c{task}-{}&class=primary",
            load.bases[instance],
            key.name(),
            turn % IDS_PER_TASK
        );
        match load.http.get(url).send().await {
            Ok(answer) => {
                let status = answer.status().as_u16();
                let _ = answer.bytes().await;
                match status {
                    200 => tally.found += 1,
                    404 => tally.missing += 1,
                    _ => {
                        tally.other += 1;
                        continue;
                    }
                }
                tally.reads.push(Read {
                    at_ms: unix_ms(),
                    instance,
                    key,
                });
            }
            Err(_) => tally.failed += 1,
        }
    }
    tally
}

// ---------------------------------------------------------------------------------------------
// Observers: `/v1/hot-keys` polls and the masters' read counts
// ---------------------------------------------------------------------------------------------

/// One listed key of `instance.keys`.
#[derive(Debug, Clone)]
struct Listed {
    key: String,
    hot: bool,
    rate: f64,
    rate_error: f64,
}

/// One `/v1/hot-keys` answer.
#[derive(Debug, Clone)]
struct Poll {
    /// When it arrived, Unix ms.
    at_ms: f64,
    /// `instance.closed_at_ms`.
    closed_at_ms: f64,
    /// `instance.window_ms`.
    window_ms: f64,
    /// `instance.threshold`.
    threshold: f64,
    /// `instance.sample_every`.
    sample_every: u64,
    /// `instance.keys`.
    keys: Vec<Listed>,
    /// `instance.other_hot`: hot, not among `keys` (found hot in the open window, or cooling).
    other_hot: HashSet<String>,
    /// `fleet.keys` with a non-empty `hot_on`.
    fleet_hot: HashSet<String>,
    /// `split_phase` of [`SPLIT_KEY`], when listed.
    split_phase: Option<String>,
}

impl Poll {
    fn of(at_ms: f64, view: &Value) -> Poll {
        let instance = &view["instance"];
        let number = |value: &Value| value.as_f64().unwrap_or(0.0);
        let listed = instance["keys"].as_array().cloned().unwrap_or_default();
        let split_phase = listed
            .iter()
            .find(|entry| entry["key"] == SPLIT_KEY)
            .and_then(|entry| entry["split_phase"].as_str().map(str::to_owned));
        Poll {
            at_ms,
            closed_at_ms: number(&instance["closed_at_ms"]),
            window_ms: number(&instance["window_ms"]),
            threshold: number(&instance["threshold"]),
            sample_every: instance["sample_every"].as_u64().unwrap_or(0),
            keys: listed
                .iter()
                .map(|entry| Listed {
                    key: entry["key"].as_str().unwrap_or_default().to_owned(),
                    hot: entry["hot"].as_bool() == Some(true),
                    rate: number(&entry["rate"]),
                    rate_error: number(&entry["rate_error"]),
                })
                .collect(),
            other_hot: instance["other_hot"]
                .as_array()
                .map(|keys| {
                    keys.iter()
                        .filter_map(|key| key.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            fleet_hot: view["fleet"]["keys"]
                .as_array()
                .map(|keys| {
                    keys.iter()
                        .filter(|entry| entry["hot_on"].as_array().is_some_and(|on| !on.is_empty()))
                        .filter_map(|entry| entry["key"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            split_phase,
        }
    }

    fn lists_hot(&self, key: &str) -> bool {
        self.other_hot.contains(key)
            || self
                .keys
                .iter()
                .any(|listed| listed.hot && listed.key == key)
    }
}

/// Polls `base`'s `/v1/hot-keys` every `every` until `part2`, then every `then` (each poll's
/// fleet view reads the registry through the store, and those reads would count among part 2's
/// `HMGET`s), until `stop`; returns the polls and how many failed.
async fn poll_task(
    http: reqwest::Client,
    base: String,
    (every, part2, then): (Duration, Instant, Duration),
    stop: Arc<AtomicBool>,
) -> (Vec<Poll>, u64) {
    let mut polls = Vec::new();
    let mut failed = 0;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += if next < part2 { every } else { then };
        tokio::time::sleep_until(next.max(Instant::now()).into()).await;
        let answer = match http.get(format!("{base}/v1/hot-keys")).send().await {
            Ok(answer) if answer.status().is_success() => answer.json::<Value>().await,
            _ => {
                failed += 1;
                continue;
            }
        };
        match answer {
            Ok(view) => polls.push(Poll::of(unix_ms(), &view)),
            Err(_) => failed += 1,
        }
    }
    (polls, failed)
}

/// The masters' `HMGET` counts at one moment.
#[derive(Debug, Clone)]
struct MasterSample {
    at_ms: f64,
    calls: Vec<u64>,
}

/// `cmdstat_hmget` calls of the node on `port` (0 when it does not answer).
fn hmget_calls(port: u16) -> u64 {
    hotsplit_devcluster::cli(port, &["INFO", "commandstats"])
        .ok()
        .and_then(|stats| {
            stats.lines().find_map(|line| {
                line.strip_prefix("cmdstat_hmget:calls=")
                    .and_then(|rest| rest.split(',').next())
                    .and_then(|calls| calls.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Analysis
// ---------------------------------------------------------------------------------------------

/// The median of `values` (NaN when empty).
fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// One move's detection times, ms after the move.
#[derive(Debug)]
struct MoveFigures {
    key: String,
    /// (a): listed hot by the instance that sees it.
    instance_ms: Option<f64>,
    /// (b): listed hot in the other instance's fleet view.
    fleet_ms: Option<f64>,
}

/// Per move of part 1, when it was seen (see the module documentation).
fn detection(schedule: &Schedule, moves: usize, polls: &[Vec<Poll>]) -> Vec<MoveFigures> {
    (0..moves)
        .map(|m| {
            let key = KeyId::Hot(m as u32).name();
            let moved = schedule.move_ms(m);
            let first = |polls: &[Poll], seen: &dyn Fn(&Poll) -> bool| {
                polls
                    .iter()
                    .find(|poll| poll.at_ms >= moved && seen(poll))
                    .map(|poll| poll.at_ms - moved)
            };
            let seer = m % 2;
            MoveFigures {
                instance_ms: first(&polls[seer], &|poll| poll.lists_hot(&key)),
                fleet_ms: first(&polls[1 - seer], &|poll| poll.fleet_hot.contains(&key)),
                key,
            }
        })
        .collect()
}

/// Precision and recall sums over windows: (hits, reported, true).
#[derive(Debug, Default, Clone, Copy)]
struct Quality {
    hits: usize,
    reported: usize,
    truth: usize,
}

impl Quality {
    fn precision(&self) -> f64 {
        if self.reported == 0 {
            f64::NAN
        } else {
            self.hits as f64 / self.reported as f64
        }
    }

    fn recall(&self) -> f64 {
        if self.truth == 0 {
            f64::NAN
        } else {
            self.hits as f64 / self.truth as f64
        }
    }
}

/// The windows' figures (c): (top-10, above the threshold, windows compared).
fn window_quality(
    from_ms: f64,
    until_ms: f64,
    polls: &[Vec<Poll>],
    reads: &[Read],
    list: usize,
) -> (Quality, Quality, usize) {
    let mut top = Quality::default();
    let mut above = Quality::default();
    let mut windows = 0;
    for (instance, polls) in polls.iter().enumerate() {
        let mut answered: Vec<&Read> = reads
            .iter()
            .filter(|read| read.instance == instance)
            .collect();
        answered.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        let mut previous_close: Option<f64> = None;
        let mut seen = HashSet::new();
        for poll in polls {
            if poll.closed_at_ms <= 0.0 || !seen.insert(poll.closed_at_ms.to_bits()) {
                continue;
            }
            let length = match previous_close {
                Some(close) if poll.closed_at_ms - close < 2.0 * poll.window_ms => {
                    poll.closed_at_ms - close
                }
                _ => poll.window_ms,
            };
            previous_close = Some(poll.closed_at_ms);
            let opened = poll.closed_at_ms - length;
            if opened < from_ms || poll.closed_at_ms > until_ms || length <= 0.0 {
                continue;
            }
            windows += 1;
            let start = answered.partition_point(|read| read.at_ms <= opened);
            let end = answered.partition_point(|read| read.at_ms <= poll.closed_at_ms);
            let mut counts: HashMap<KeyId, u64> = HashMap::new();
            for read in &answered[start..end] {
                *counts.entry(read.key).or_default() += 1;
            }
            let mut ranked: Vec<(String, u64)> = counts
                .into_iter()
                .map(|(key, count)| (key.name(), count))
                .collect();
            ranked.sort_by_key(|entry| std::cmp::Reverse(entry.1));
            let cut = ranked
                .get(list.min(ranked.len()).saturating_sub(1))
                .map_or(u64::MAX, |entry| entry.1);
            let truth_top: HashSet<&str> = ranked
                .iter()
                .filter(|(_, count)| *count >= cut)
                .map(|(key, _)| key.as_str())
                .collect();
            let seconds = length / 1000.0;
            let truth_above: HashSet<&str> = ranked
                .iter()
                .filter(|(_, count)| *count as f64 / seconds >= poll.threshold)
                .map(|(key, _)| key.as_str())
                .collect();
            top.reported += poll.keys.len();
            top.truth += truth_top.len().min(list);
            top.hits += poll
                .keys
                .iter()
                .filter(|listed| truth_top.contains(listed.key.as_str()))
                .count();
            let reported_above: Vec<&Listed> = poll
                .keys
                .iter()
                .filter(|listed| listed.rate - listed.rate_error >= poll.threshold)
                .collect();
            above.reported += reported_above.len();
            above.truth += truth_above.len();
            above.hits += reported_above
                .iter()
                .filter(|listed| truth_above.contains(listed.key.as_str()))
                .count();
        }
    }
    (top, above, windows)
}

/// Part 2's figures.
#[derive(Debug)]
struct SplitFigures {
    /// Each interval: (end, ms after the move; busiest share; least share).
    intervals: Vec<(f64, f64, f64)>,
    /// The first poll of instance 0 showing `writing`, ms after the move.
    writing_ms: Option<f64>,
    /// The first showing `reading`.
    reading_ms: Option<f64>,
    /// The end of the first spread interval, ms after the move.
    spread_ms: Option<f64>,
    before: f64,
    after_busiest: f64,
    after_least: f64,
}

fn split_figures(moved: f64, samples: &[MasterSample], polls: &[Poll]) -> SplitFigures {
    let phase_ms = |phase: &str| {
        polls
            .iter()
            .find(|poll| poll.at_ms >= moved && poll.split_phase.as_deref() == Some(phase))
            .map(|poll| poll.at_ms - moved)
    };
    let intervals: Vec<(f64, f64, f64)> = samples
        .windows(2)
        .filter(|pair| pair[0].at_ms >= moved)
        .filter_map(|pair| {
            let deltas: Vec<u64> = pair[1]
                .calls
                .iter()
                .zip(&pair[0].calls)
                .map(|(after, before)| after.saturating_sub(*before))
                .collect();
            let total: u64 = deltas.iter().sum();
            (total > 0).then(|| {
                let share = |value: u64| value as f64 / total as f64;
                (
                    pair[1].at_ms - moved,
                    share(deltas.iter().copied().max().unwrap_or(0)),
                    share(deltas.iter().copied().min().unwrap_or(0)),
                )
            })
        })
        .collect();
    let spread_ms = intervals
        .iter()
        .find(|(_, busiest, _)| *busiest <= SPREAD_SHARE)
        .map(|(end, _, _)| *end);
    let reading_ms = phase_ms("reading");
    let before_until = match (reading_ms, spread_ms) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(f64::INFINITY),
    };
    let before: Vec<f64> = intervals
        .iter()
        .filter(|(end, _, _)| *end <= before_until)
        .map(|(_, busiest, _)| *busiest)
        .collect();
    let after: Vec<&(f64, f64, f64)> = intervals
        .iter()
        .filter(|(end, _, _)| spread_ms.is_some_and(|spread| *end > spread))
        .collect();
    SplitFigures {
        writing_ms: phase_ms("writing"),
        reading_ms,
        spread_ms,
        before: median(&before),
        after_busiest: median(&after.iter().map(|entry| entry.1).collect::<Vec<_>>()),
        after_least: median(&after.iter().map(|entry| entry.2).collect::<Vec<_>>()),
        intervals,
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

fn seconds(ms: f64) -> String {
    if ms.is_nan() {
        "–".into()
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

fn ratio(value: f64) -> String {
    if value.is_nan() {
        "–".into()
    } else {
        format!("{value:.3}")
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured",
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

async fn run(options: Options) -> Result<(), BoxError> {
    let load_before = load_average();
    let started = Instant::now();
    eprintln!("hot_moving: starting a 3x3 cluster");
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start(ClusterOptions {
            extra_args: vec!["--cluster-require-full-coverage".into(), "no".into()],
            ..ClusterOptions::default()
        })
    })
    .await??;
    let masters: Vec<u16> = cluster.masters()?.iter().map(|node| node.port()).collect();
    let dir = tempfile::tempdir()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(options.concurrency + 8)
        .timeout(Duration::from_secs(5))
        .build()?;
    let instances = {
        let (dir, cluster_url, options) = (dir.path().to_owned(), cluster.url(), options.clone());
        tokio::task::spawn_blocking(move || start_instances(&dir, &cluster_url, &options)).await??
    };
    let bases: Vec<String> = instances
        .iter()
        .map(|instance| instance.base.clone())
        .collect();
    let offsets = options.move_offsets();
    let moves = offsets.len();
    eprintln!("hot_moving: instances ready; publishing {moves} hot keys and {SPLIT_KEY}");
    for m in 0..moves {
        publish(&http, &bases[0], &KeyId::Hot(m as u32).name()).await?;
    }
    publish(&http, &bases[0], SPLIT_KEY).await?;

    // Observers first, then the load.
    let schedule = Schedule {
        start: Instant::now(),
        start_ms: unix_ms(),
        part1: options.duration,
        moves: offsets,
    };
    let observing = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = bases
        .iter()
        .map(|base| {
            tokio::spawn(poll_task(
                http.clone(),
                base.clone(),
                (
                    options.poll,
                    schedule.start + options.duration,
                    options.interval,
                ),
                observing.clone(),
            ))
        })
        .collect();
    let samples: Arc<Mutex<Vec<MasterSample>>> = Arc::default();
    let sampler = {
        let samples = samples.clone();
        let stop = observing.clone();
        let every = options.interval;
        let masters = masters.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let masters = masters.clone();
                let sample = tokio::task::spawn_blocking(move || MasterSample {
                    calls: masters.iter().map(|port| hmget_calls(*port)).collect(),
                    at_ms: unix_ms(),
                })
                .await;
                if let Ok(sample) = sample {
                    samples
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(sample);
                }
            }
        })
    };
    let load = Arc::new(Load {
        http: http.clone(),
        bases: bases.clone(),
        schedule: schedule.clone(),
        options: options.clone(),
        stop: AtomicBool::new(false),
    });
    let tasks: Vec<_> = (0..options.concurrency)
        .map(|task| tokio::spawn(load_task(load.clone(), task)))
        .collect();
    eprintln!(
        "hot_moving: part 1, {moves} moves about every {} for {}",
        humantime::format_duration(options.hot_every),
        humantime::format_duration(options.duration)
    );
    tokio::time::sleep_until((schedule.start + options.duration).into()).await;
    eprintln!("hot_moving: part 2, the hotspot on {SPLIT_KEY} (split family)");
    let moved = schedule.part2_ms();
    let part2_until = Instant::now() + options.split_hold;
    let mut spread_at: Option<Instant> = None;
    loop {
        tokio::time::sleep(options.interval).await;
        let now = Instant::now();
        if spread_at.is_some_and(|at| now >= at + AFTER_SPREAD) || now >= part2_until {
            break;
        }
        if spread_at.is_none() {
            let samples = samples.lock().unwrap_or_else(PoisonError::into_inner);
            if split_figures(moved, &samples, &[]).spread_ms.is_some() {
                spread_at = Some(now);
            }
        }
    }
    load.stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for task in tasks {
        let part = task.await?;
        tally.reads.extend(part.reads);
        tally.found += part.found;
        tally.missing += part.missing;
        tally.other += part.other;
        tally.failed += part.failed;
    }
    let load_ended_ms = unix_ms();
    observing.store(true, Ordering::Relaxed);
    let mut polls = Vec::new();
    let mut poll_failures = 0;
    for poller in pollers {
        let (part, failed) = poller.await?;
        polls.push(part);
        poll_failures += failed;
    }
    sampler.await?;
    drop(instances);
    drop(cluster);

    // Figures.
    let hot_defaults = HotKeysConfig::default();
    let heartbeat = FleetConfig::default().heartbeat_interval;
    let part1_end = schedule.part2_ms();
    let moved_figures = detection(&schedule, moves, &polls);
    let instance_ms: Vec<f64> = moved_figures.iter().filter_map(|m| m.instance_ms).collect();
    let fleet_ms: Vec<f64> = moved_figures.iter().filter_map(|m| m.fleet_ms).collect();
    let fleet_lag_ms: Vec<f64> = moved_figures
        .iter()
        .filter_map(|m| Some(m.fleet_ms? - m.instance_ms?))
        .collect();
    let all_seen = instance_ms.len() == moves;
    let all_fleet = fleet_lag_ms.len() == moves;
    let (top, above, windows) = window_quality(
        schedule.start_ms,
        part1_end,
        &polls,
        &tally.reads,
        hot_defaults.list,
    );
    let split = split_figures(
        moved,
        &samples.lock().unwrap_or_else(PoisonError::into_inner),
        &polls[0],
    );
    let part1_reads = tally
        .reads
        .iter()
        .filter(|read| read.at_ms <= part1_end)
        .count();
    let part2_reads = tally.reads.len() - part1_reads;
    let part2_seconds = (load_ended_ms - part1_end) / 1000.0;
    let sampling: Vec<u64> = polls
        .iter()
        .flatten()
        .filter(|poll| poll.at_ms <= part1_end)
        .map(|poll| poll.sample_every)
        .collect();
    let sampling_seen = match (sampling.iter().min(), sampling.iter().max()) {
        (Some(low), Some(high)) if low == high => low.to_string(),
        (Some(low), Some(high)) => format!("{low} to {high}"),
        _ => "–".to_owned(),
    };

    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    let mut out = String::new();
    out.push_str("## hot_moving — the detector and the split under a moving hotspot\n\n");
    out.push_str(&format!(
        "Command: `cargo bench --bench hot_moving --{}{}`\n\n",
        if args.is_empty() { "" } else { " " },
        args.join(" ")
    ));
    out.push_str(&format!(
        "Cores: {}; load average before: {load_before}, after: {}; took {:.0} s. A 3x3 cluster, two `hotsplit serve` (release) with the shipped defaults but `heal.layout_interval = {}` and the scrub off; `[hot_keys]`: at least one read in {} sampled, about {} a second at most (seen: one in {}), window {}, threshold {} reads/s, cool-down {}; `fleet.heartbeat_interval` {}.\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average(),
        started.elapsed().as_secs_f64(),
        humantime::format_duration(options.layout_interval),
        hot_defaults.sample_every,
        hot_defaults.samples_per_s,
        sampling_seen,
        humantime::format_duration(hot_defaults.window),
        hot_defaults.threshold,
        humantime::format_duration(hot_defaults.cool_down),
        humantime::format_duration(heartbeat),
    ));
    out.push_str(&format!(
        "Load: {} tasks aiming at {:.0} reads/s, {:.0} % on the hot key, the rest uniform over {} cold keys (never published: 404s, counted as reads); achieved {:.0} reads/s in part 1 ({} s) and {:.0} in part 2 ({:.1} s). Answers: {} × 200, {} × 404, {} other, {} without an answer; {} failed polls.\n\n",
        options.concurrency,
        options.rate,
        options.hot_share * 100.0,
        options.cold_keys,
        part1_reads as f64 / options.duration.as_secs_f64(),
        options.duration.as_secs(),
        part2_reads as f64 / part2_seconds.max(0.001),
        part2_seconds,
        tally.found,
        tally.missing,
        tally.other,
        tally.failed,
        poll_failures,
    ));
    out.push_str("| Figure | Measured | Target | Verdict |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| (a) move → listed hot by the instance that sees it (`instance.keys[].hot` or `instance.other_hot`, polled every {}), {moves} moves | median {}, max {}{} | ≤ {} every move | {} |\n",
        humantime::format_duration(options.poll),
        seconds(median(&instance_ms)),
        seconds(max(&instance_ms)),
        if all_seen { String::new() } else { format!(", {} of {moves} never seen", moves - instance_ms.len()) },
        humantime::format_duration(DETECT_TARGET),
        verdict((!instance_ms.is_empty()).then(|| all_seen && max(&instance_ms) <= DETECT_TARGET.as_secs_f64() * 1000.0)),
    ));
    out.push_str(&format!(
        "| (b) move → listed hot fleet-wide (the other instance's `fleet.keys[].hot_on`) | median {}, max {}; after (a): median {}, max {}{} | (b) − (a) ≤ one heartbeat ({}) every move, give or take one poll ({}: both ends are polls) | {} |\n",
        seconds(median(&fleet_ms)),
        seconds(max(&fleet_ms)),
        seconds(median(&fleet_lag_ms)),
        seconds(max(&fleet_lag_ms)),
        if all_fleet { String::new() } else { format!(", {} of {moves} not seen both ways", moves - fleet_lag_ms.len()) },
        humantime::format_duration(heartbeat),
        humantime::format_duration(options.poll),
        verdict((!fleet_lag_ms.is_empty()).then(|| all_fleet && max(&fleet_lag_ms) <= (heartbeat + options.poll).as_secs_f64() * 1000.0)),
    ));
    let quality = |value: f64| (!value.is_nan()).then_some(value >= QUALITY_TARGET);
    out.push_str(&format!(
        "| (c) top-10 precision, tie-aware (Σ\\|R∩T\\| / Σ\\|R\\|; {windows} windows of both instances) | {} ({} of {}) | ≥ {QUALITY_TARGET} | {} |\n",
        ratio(top.precision()), top.hits, top.reported, verdict(quality(top.precision())),
    ));
    out.push_str(&format!(
        "| (c) top-10 recall, tie-aware (Σ\\|R∩T\\| / Σ min(10, \\|T\\|)) | {} ({} of {}) | ≥ {QUALITY_TARGET} | {} |\n",
        ratio(top.recall()), top.hits, top.truth, verdict(quality(top.recall())),
    ));
    out.push_str(&format!(
        "| (c) precision above the threshold (reported `rate − rate_error` ≥ {} vs true rate ≥ {}) | {} ({} of {}) | ≥ {QUALITY_TARGET} | {} |\n",
        hot_defaults.threshold, hot_defaults.threshold,
        ratio(above.precision()), above.hits, above.reported, verdict(quality(above.precision())),
    ));
    out.push_str(&format!(
        "| (c) recall above the threshold | {} ({} of {}) | ≥ {QUALITY_TARGET} | {} |\n",
        ratio(above.recall()),
        above.hits,
        above.truth,
        verdict(quality(above.recall())),
    ));
    out.push_str(&format!(
        "| Split: busiest master's share of `HMGET`s before the split (`{SPLIT_KEY}`, 1 copy; median of the {} intervals) | {} | — (the unsplit baseline, ≈ 1.0) | — |\n",
        humantime::format_duration(options.interval),
        ratio(split.before),
    ));
    out.push_str(&format!(
        "| Split: busiest master's share after it is spread (median; least share {}) | {} | ≤ {SPREAD_SHARE} (even: {:.3}) | {} |\n",
        ratio(split.after_least),
        ratio(split.after_busiest),
        1.0 / masters.len() as f64,
        verdict((!split.after_busiest.is_nan()).then_some(split.after_busiest <= SPREAD_SHARE)),
    ));
    out.push_str(&format!(
        "| Split: move → spread (first interval whose busiest share ≤ {SPREAD_SHARE}); `writing` seen at {}, `reading` at {} | {} | none set; readers wait the settle time `heal.layout_interval` + 2 × `store.command_timeout` = {} after `writing`, moves happen on ticks every {} | {} |\n",
        split.writing_ms.map_or("–".into(), seconds),
        split.reading_ms.map_or("–".into(), seconds),
        split.spread_ms.map_or(format!("not within {}", humantime::format_duration(options.split_hold)), seconds),
        humantime::format_duration(options.layout_interval + 2 * StoreConfig::default().command_timeout),
        humantime::format_duration(options.layout_interval),
        if split.spread_ms.is_some() { "spread" } else { "missed" },
    ));
    out.push_str("\nPer move, (a) and (b) in seconds after the move:\n\n| Key | Instance | (a) | (b) |\n|---|---|---|---|\n");
    for (m, figures) in moved_figures.iter().enumerate() {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            figures.key,
            m % 2,
            figures.instance_ms.map_or("–".into(), seconds),
            figures.fleet_ms.map_or("–".into(), seconds),
        ));
    }
    out.push_str("\nPart 2, the busiest master's share per interval (end, seconds after the move: share):\n\n");
    let line: Vec<String> = split
        .intervals
        .iter()
        .map(|(end, busiest, _)| format!("{:.2}: {busiest:.2}", end / 1000.0))
        .collect();
    out.push_str(&line.join(", "));
    out.push('\n');
    print!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(Some(options)) => options,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hot_moving: {err}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("hot_moving: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hot_moving: {err}");
            ExitCode::FAILURE
        }
    }
}
