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

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use options::Options;

mod analysis;
mod fleet;
mod keys;
mod load;
mod observe;
mod options;
mod report;
mod run;

/// Any error of the run, reported on stderr.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// The busiest master's share at or under which a split key's reads count as spread.
pub(crate) const SPREAD_SHARE: f64 = 0.45;
/// How long part 2 keeps going once the key is spread (the "after" intervals).
pub(crate) const AFTER_SPREAD: Duration = Duration::from_secs(3);
/// Client ids per load task.
pub(crate) const IDS_PER_TASK: usize = 16;
/// The split key.
pub(crate) const SPLIT_KEY: &str = "sp:hot";
/// The split family's `max_copies`.
pub(crate) const SPLIT_COPIES: u32 = 16;
/// The detector's target: (a) at most this long.
pub(crate) const DETECT_TARGET: Duration = Duration::from_secs(1);
/// The precision and recall target.
pub(crate) const QUALITY_TARGET: f64 = 0.9;

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
    match runtime.block_on(run::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hot_moving: {err}");
            ExitCode::FAILURE
        }
    }
}
