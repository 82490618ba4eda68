//! The load: paced read tasks and the log of every answered read, the ground truth.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::keys::{unix_ms, KeyId, Schedule};
use crate::options::Options;
use crate::IDS_PER_TASK;

/// One answered read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    /// When its answer arrived, Unix ms.
    pub(crate) at_ms: f64,
    /// The instance that answered.
    pub(crate) instance: usize,
    /// The key.
    pub(crate) key: KeyId,
}

/// What one load task did.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Answered reads (200 and 404).
    pub(crate) reads: Vec<Read>,
    /// 200s.
    pub(crate) found: u64,
    /// 404s.
    pub(crate) missing: u64,
    /// Any other status.
    pub(crate) other: u64,
    /// No answer.
    pub(crate) failed: u64,
}

/// What the load tasks share.
pub(crate) struct Load {
    pub(crate) http: reqwest::Client,
    /// The instances' bases.
    pub(crate) bases: Vec<String>,
    pub(crate) schedule: Schedule,
    pub(crate) options: Options,
    /// Set to stop.
    pub(crate) stop: AtomicBool,
}

/// One load task: paced reads until `load.stop`.
pub(crate) async fn load_task(load: Arc<Load>, task: usize) -> Tally {
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
