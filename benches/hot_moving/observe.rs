//! Observers: `/v1/hot-keys` polls and the masters' read counts.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::fleet::Fleet;
use crate::keys::{unix_ms, Schedule};
use crate::options::Options;
use crate::{BoxError, SPLIT_KEY};

/// The running observers: one poller per instance and the masters' sampler.
pub(crate) struct Observers {
    /// Set once the load has stopped: every observer stops.
    stop: Arc<AtomicBool>,
    /// Per instance, its `/v1/hot-keys` poller.
    pollers: Vec<JoinHandle<(Vec<Poll>, u64)>>,
    /// The sampler of the masters' `HMGET` counts, every `--interval`.
    sampler: JoinHandle<()>,
    /// The sampler's samples so far (part 2 watches them for the spread).
    samples: Arc<Mutex<Vec<MasterSample>>>,
}

/// What the observers saw, once stopped.
pub(crate) struct Observed {
    /// Per instance, its polls.
    pub(crate) polls: Vec<Vec<Poll>>,
    /// Polls that failed, both instances together.
    pub(crate) poll_failures: u64,
    /// The masters' samples.
    pub(crate) samples: Vec<MasterSample>,
}

impl Observers {
    /// Starts polling every instance of `fleet` (every `--poll` in part 1, every `--interval`
    /// after) and sampling its masters every `--interval`.
    pub(crate) fn start(
        http: &reqwest::Client,
        fleet: &Fleet,
        schedule: &Schedule,
        options: &Options,
    ) -> Observers {
        let stop = Arc::new(AtomicBool::new(false));
        let pollers = fleet
            .bases
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
                    stop.clone(),
                ))
            })
            .collect();
        let samples: Arc<Mutex<Vec<MasterSample>>> = Arc::default();
        let sampler = tokio::spawn(sample_task(
            fleet.masters.clone(),
            options.interval,
            samples.clone(),
            stop.clone(),
        ));
        Observers {
            stop,
            pollers,
            sampler,
            samples,
        }
    }

    /// `look` at the samples so far.
    pub(crate) fn with_samples<T>(&self, look: impl FnOnce(&[MasterSample]) -> T) -> T {
        look(&self.samples.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Stops every observer and waits for it; returns what they saw.
    pub(crate) async fn stop(self) -> Result<Observed, BoxError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut polls = Vec::new();
        let mut poll_failures = 0;
        for poller in self.pollers {
            let (part, failed) = poller.await?;
            polls.push(part);
            poll_failures += failed;
        }
        self.sampler.await?;
        let samples =
            std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner));
        Ok(Observed {
            polls,
            poll_failures,
            samples,
        })
    }
}

/// Samples the `HMGET` counts of `masters` every `every` into `samples`, until `stop`.
async fn sample_task(
    masters: Vec<u16>,
    every: Duration,
    samples: Arc<Mutex<Vec<MasterSample>>>,
    stop: Arc<AtomicBool>,
) {
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
}

/// One listed key of `instance.keys`.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub(crate) key: String,
    pub(crate) hot: bool,
    pub(crate) rate: f64,
    pub(crate) rate_error: f64,
}

/// One `/v1/hot-keys` answer.
#[derive(Debug, Clone)]
pub(crate) struct Poll {
    /// When it arrived, Unix ms.
    pub(crate) at_ms: f64,
    /// `instance.closed_at_ms`.
    pub(crate) closed_at_ms: f64,
    /// `instance.window_ms`.
    pub(crate) window_ms: f64,
    /// `instance.threshold`.
    pub(crate) threshold: f64,
    /// `instance.sample_every`.
    pub(crate) sample_every: u64,
    /// `instance.keys`.
    pub(crate) keys: Vec<Listed>,
    /// `instance.other_hot`: hot, not among `keys` (found hot in the open window, or cooling).
    pub(crate) other_hot: HashSet<String>,
    /// `fleet.keys` with a non-empty `hot_on`.
    pub(crate) fleet_hot: HashSet<String>,
    /// `split_phase` of [`SPLIT_KEY`], when listed.
    pub(crate) split_phase: Option<String>,
}

impl Poll {
    pub(crate) fn of(at_ms: f64, view: &Value) -> Poll {
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

    pub(crate) fn lists_hot(&self, key: &str) -> bool {
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
pub(crate) struct MasterSample {
    pub(crate) at_ms: f64,
    pub(crate) calls: Vec<u64>,
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
