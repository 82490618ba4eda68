//! `check --instances 2`, the automatic split row: keys that start at one copy are split by
//! the instances' hot-key detection and merged back once they cool, in the middle of the
//! workload, while replicas lag.
//!
//! The instances carry a family `auto:` of one copy, `placement = "spread"`, with
//! `split = { mode = "split", max_copies = <--copies> }` (see [`config`]). The row runs the
//! fleet workload (`fleet_phase::phase`: writers publish through one instance and read their write
//! back through the other; readers carry the session token, read with their client id and
//! alternate instances) on the keys `auto:0..`, in three stretches:
//!
//! 1. **Hot**: readers read as fast as they can; the row waits until every key's split record
//!    (`#hotsplit#splits#auto:`, read on its master) says `reading`: both instances then write
//!    every copy and readers use them. It stays hot [`HOLD`] longer, so reads and publishes run
//!    on the split copies.
//! 2. **Cool**: readers slow to one read per [`COOL_PAUSE_MS`], far below the threshold's
//!    hysteresis; the row waits until every key's record is gone (readers left, writers left,
//!    the extra copies deleted).
//! 3. **After**: [`HOLD`] more on the merged keys, then the row ends and the last accepted
//!    edit of every key must be what a `primary` read serves.
//!
//! The figures are the fleet rows' (monotonic-read and read-your-writes violations, lost
//! edits, copies that served) and how long the split and the merge took. What fails the run:
//! any violation or lost edit, no read served, a split or a merge that did not happen within
//! its limit, or reads that never used a split copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::fleet_phase::{phase, Fleet, FleetFigures, FleetOptions, ReadMode, Row};
use hotsplit_devcluster::Cluster;

/// The split row's family prefix (and name).
const FAMILY: &str = "auto:";

/// How long the row stays hot after every key split, and runs on after every key merged.
const HOLD: Duration = Duration::from_secs(3);

/// A reader's pause between reads while the keys cool.
const COOL_PAUSE_MS: u64 = 250;

/// The longest the row waits for every key to split, and then for every key to merge.
const LIMIT: Duration = Duration::from_secs(60);

/// The detector's threshold (reads per second asked of one instance) and the family's split
/// threshold. The hot stretch reads far above it (eight readers, each about one read per
/// 2–10 ms, over two keys and two instances: 200–500 per key and instance); the cool one far
/// below its hysteresis (half): the readers' 8 per key and instance, and the writer's
/// read-backs, which never slow (a publish after each, about 15–25).
const THRESHOLD: f64 = 100.0;

/// A reader's pause between reads while the keys are hot.
const HOT_PAUSE_MS: u64 = 1;

/// The config the fleet instances add for the split row: the `auto:` family, and the detector
/// sampling every read in 200 ms windows. `copies` is the split's `max_copies` (at least 2).
pub(super) fn config(copies: u32) -> String {
    format!(
        "[[family]]\nprefix = \"{FAMILY}\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"advisory\"\n\
         placement = \"spread\"\n\
         split = {{ mode = \"split\", max_copies = {max}, threshold = {THRESHOLD:.1}, cool_down = \"2s\", max_split_keys = 16, max_splits_per_minute = 100 }}\n\
         [hot_keys]\nsample_every = 1\nthreshold = {THRESHOLD:.1}\nwindow = \"200ms\"\ncool_down = \"1s\"\n",
        max = copies.max(2)
    )
}

/// The split row's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SplitRow {
    /// The keys split and merged.
    pub keys: u32,
    /// The copies each split into.
    pub copies: u32,
    /// The workload's counts over the whole row.
    pub figures: FleetFigures,
    /// From the first hot read until every key's split record said `reading`; `None`: not
    /// within the limit.
    pub split_after_ms: Option<u64>,
    /// From the readers slowing down until every key's record was gone; `None`: not within
    /// the limit (or the keys never split).
    pub merged_after_ms: Option<u64>,
    /// The limit each wait had.
    pub limit_ms: u64,
}

impl SplitRow {
    /// The row as markdown.
    pub fn markdown(&self) -> String {
        let f = &self.figures;
        let took = |ms: Option<u64>| {
            ms.map_or_else(
                || "NOT within the limit".to_owned(),
                |ms| format!("{:.1} s", ms as f64 / 1000.0),
            )
        };
        format!(
            "\n## Automatic split and merge (two instances, session token, replicas lagging)\n\n\
             {} keys of one copy, split by detection into {} copies and merged once cool, mid-run.\n\n\
             | writes | reads | copies that served | monotonic-read violations | read-your-writes violations | lost edits | split after | merged after |\n\
             |---|---|---|---|---|---|---|---|\n\
             | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            self.keys,
            self.copies,
            f.writes,
            f.reads,
            f.copies_served,
            f.monotonic_violations,
            f.read_your_writes_violations,
            f.lost_edits,
            took(self.split_after_ms),
            took(self.merged_after_ms)
        )
    }

    /// What in the row fails the run.
    pub fn failures(&self) -> Vec<String> {
        let f = &self.figures;
        let mut failures = Vec::new();
        if f.monotonic_violations + f.read_your_writes_violations + f.lost_edits > 0 {
            failures.push(format!(
                "automatic split: {} monotonic-read and {} read-your-writes violations, {} keys lost an edit",
                f.monotonic_violations, f.read_your_writes_violations, f.lost_edits
            ));
        }
        if f.reads == 0 || f.writes == 0 {
            failures.push("automatic split: no read or no write was served".to_owned());
        }
        if self.split_after_ms.is_none() {
            failures.push("automatic split: the hot keys did not split".to_owned());
        } else if f.copies_served < 2 {
            failures.push("automatic split: no read used a split copy".to_owned());
        }
        if self.merged_after_ms.is_none() {
            failures.push("automatic split: the split keys did not merge once cool".to_owned());
        }
        failures
    }
}

/// Runs the split row.
pub(super) async fn run(
    http: &reqwest::Client,
    bases: &[String],
    cluster: &Arc<Cluster>,
    options: &FleetOptions,
    shutdown: &CancellationToken,
) -> SplitRow {
    let copies = options.copies.max(2);
    let row = Row {
        mode: ReadMode::Affine,
        token: true,
        prefix: FAMILY.to_owned(),
        reader_pause: Arc::new(AtomicU64::new(HOT_PAUSE_MS)),
    };
    let keys: Vec<String> = (0..options.keys).map(|k| format!("{FAMILY}{k}")).collect();
    let stop = shutdown.child_token();
    let drive = async {
        let started = Instant::now();
        let split_after_ms = wait_for(cluster, &keys, &stop, |record| {
            record.is_some_and(|text| text.starts_with(&format!("{copies}:r:")))
        })
        .await
        .map(|()| millis(started.elapsed()));
        pause(HOLD, &stop).await;
        row.reader_pause.store(COOL_PAUSE_MS, Ordering::Relaxed);
        let cooling = Instant::now();
        let merged_after_ms = match split_after_ms {
            Some(_) => wait_for(cluster, &keys, &stop, |record| record.is_none())
                .await
                .map(|()| millis(cooling.elapsed())),
            None => None,
        };
        pause(HOLD, &stop).await;
        stop.cancel();
        (split_after_ms, merged_after_ms)
    };
    let fleet = Fleet {
        http,
        bases,
        cluster,
    };
    let (figures, (split_after_ms, merged_after_ms)) =
        tokio::join!(phase(&fleet, options, &row, stop.clone()), drive);
    SplitRow {
        keys: options.keys,
        copies,
        figures,
        split_after_ms,
        merged_after_ms,
        limit_ms: millis(LIMIT),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Waits `duration`, or less when `stop` is cancelled: a stretch of the workload.
async fn pause(duration: Duration, stop: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        () = stop.cancelled() => {}
    }
}

/// Polls every key's split record until `done` holds for all of them; `None` after
/// [`LIMIT`] or when `stop` is cancelled.
async fn wait_for(
    cluster: &Arc<Cluster>,
    keys: &[String],
    stop: &CancellationToken,
    done: impl Fn(Option<&str>) -> bool,
) -> Option<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let records = {
            let (cluster, keys) = (cluster.clone(), keys.to_vec());
            tokio::task::spawn_blocking(move || records(&cluster, &keys))
                .await
                .ok()
                .flatten()
        };
        if records.is_some_and(|records| records.iter().all(|record| done(record.as_deref()))) {
            return Some(());
        }
        if Instant::now() > deadline || stop.is_cancelled() {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each key's split record as stored on its master (`None`: unsplit); `None` when the cluster
/// cannot be read.
fn records(cluster: &Cluster, keys: &[String]) -> Option<Vec<Option<String>>> {
    let hash = format!("#hotsplit#splits#{FAMILY}");
    let owner = cluster.master_for_key(hash.as_bytes()).ok()??;
    keys.iter()
        .map(|key| {
            let text = cluster.cli(owner.port, &["HGET", &hash, key]).ok()?;
            let text = text.trim();
            Some((!text.is_empty()).then(|| text.to_owned()))
        })
        .collect()
}
