//! The figures of a run, apart from the I/O: what each mode and the presence experiment found
//! ([`ModeResult`], [`PresenceResult`], [`CheckReport`]), how a history is judged into them
//! ([`judge`], [`judge_presence`], pure functions over the recorded events), and the report as
//! markdown.

use std::fmt::Write as _;

use serde::Serialize;

use super::checkers::{self, Percentiles, Scope};
use super::client_cache::CacheBound;
use super::history::{Event, Op, Outcome};

/// How readers pick the copy they read (and `--mode`'s values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
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
    /// Writers and readers on the Redis-protocol door (`[resp] listen`): explicit client ids
    /// and pooled connections without one (see `check::resp`).
    Resp,
    /// Readers with a client-side cache by redis-py's rules (RESP3, `CLIENT TRACKING ON`,
    /// plain `GET`) on instance A's door, writers through instance B and A, the process faults
    /// and feed cuts (see `check::client_cache`). Runs only when named by `--mode`.
    ClientCache,
}

impl Mode {
    /// Every mode, in report order.
    pub const ALL: [Mode; 5] = [
        Mode::RandomSuffix,
        Mode::Affine,
        Mode::Floor,
        Mode::Delete,
        Mode::Resp,
    ];

    /// The mode's name on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::RandomSuffix => "random-suffix",
            Mode::Affine => "affine",
            Mode::Floor => "floor",
            Mode::Delete => "delete",
            Mode::Resp => "resp",
            Mode::ClientCache => "client-cache",
        }
    }
}

/// One mode's results.
#[derive(Debug, Clone, Serialize)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Whether the service under test answered from its near cache (a second service on the
    /// same cluster, `[near_cache] enabled = true`).
    pub near_cache: bool,
    /// Reads that returned a version.
    pub reads: usize,
    /// Reads answered 404 by a tombstone naming its version (`Hotsplit-Version`): the monotonic
    /// checker judges them as reads of that version.
    pub invalidated_reads: usize,
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
    /// The measured staleness of every read that returned a version: how long the version it
    /// returned had been superseded by an acknowledged write when it started (0 when current).
    pub staleness: Percentiles,
    /// The same for the reads the near cache answered (`source=near-cache` in `Hotsplit-Route`),
    /// apart from those Redis served: the age bound the cache claims, measured. Empty (count 0)
    /// in the rows without the near cache.
    pub near_cache_hit_staleness: Percentiles,
    /// The budget of the readers' class (`advisory`), milliseconds: what `staleness` is judged
    /// against.
    pub budget_ms: f64,
    /// Copy reads (`HMGET`) per second Redis served during the phase, every node together
    /// (the direct sampler's reads included, the same in every row).
    pub redis_reads_per_s: f64,
    /// Writers' reads of their own key that returned an older version than they had written.
    pub read_your_writes_violations: usize,
    /// Loads from the source of truth caused by misses.
    pub source_loads: usize,
    /// Time for every copy to reach an acknowledged version.
    pub convergence: Percentiles,
    /// Copies found at an older version than they had held.
    pub copy_rollbacks: usize,
    /// The `client-cache` row's own figures; `None` in the other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cache: Option<ClientCacheFigures>,
}

/// What the `client-cache` row found ([`checkers::client_cache`] over its history).
#[derive(Debug, Clone, Serialize)]
pub struct ClientCacheFigures {
    /// Reads that returned a version, from the readers' caches or the door.
    pub reads: usize,
    /// Of them, answered by the reader's own cache.
    pub cache_hits: usize,
    /// Of them, answered by the door (a `GET` sent).
    pub door_reads: usize,
    /// Key invalidations the readers processed (one per key pushed).
    pub invalidations: usize,
    /// Null invalidations (flush everything) the readers processed: none from hotsplit, whose
    /// flush pushes every tracked key (`tracking::Tracking::flush_all`).
    pub flushes: usize,
    /// Invalidations the readers' instance pushed because it flushed (its
    /// `hotsplit_resp_tracking_invalidations_total{cause="flush"}` over the phase).
    pub flush_pushes: u64,
    /// Flushes of that instance's feed over the phase (`hotsplit_feed_flushes_total`).
    pub feed_flushes: u64,
    /// Caches the readers flushed themselves because a connection dropped.
    pub disconnect_flushes: usize,
    /// Feed cuts applied (`CLIENT KILL` of the feed connections on a master).
    pub feed_cuts: usize,
    /// The staleness of every cached answer, from the run's acknowledged publishes.
    pub cached_staleness: Percentiles,
    /// What a cached answer's staleness is judged against, and its parts.
    pub bound: CacheBound,
    /// `bound`'s total, milliseconds.
    pub bound_ms: f64,
    /// Cached answers staler than the bound.
    pub over_bound: usize,
    /// Readers' reads going back outside loss windows (cache and door together).
    pub monotonic_violations: usize,
    /// The same inside loss windows (reported apart, as in the other modes).
    pub monotonic_violations_in_loss_windows: usize,
}

impl ClientCacheFigures {
    /// Judges a `client-cache` history against `bound`.
    pub(super) fn judge(
        events: &[Event],
        loss_windows: &[(u64, u64)],
        bound: CacheBound,
    ) -> ClientCacheFigures {
        let bound_ms = bound.total_ms();
        let verdict = checkers::client_cache(events, loss_windows, (bound_ms * 1000.0) as u64);
        ClientCacheFigures {
            reads: verdict.reads,
            cache_hits: verdict.cache_hits,
            door_reads: verdict.door_reads,
            invalidations: verdict.invalidations,
            flushes: verdict.flushes,
            flush_pushes: 0,
            feed_flushes: 0,
            disconnect_flushes: verdict.disconnect_flushes,
            feed_cuts: events
                .iter()
                .filter(|event| {
                    event.op == Op::Fault
                        && matches!(&event.outcome, Outcome::Error(name)
                            if name.starts_with("feed-cut (") && !name.contains("not applied"))
                })
                .count(),
            cached_staleness: verdict.cached_staleness,
            bound,
            bound_ms,
            over_bound: verdict.over_bound.len(),
            monotonic_violations: verdict.monotonic.len(),
            monotonic_violations_in_loss_windows: verdict.monotonic_in_loss_windows.len(),
        }
    }

    /// Why the row fails: a cached answer over the bound, a reader going back outside loss
    /// windows, or a row that proved nothing (no cache hit, or no key pushed by a flush: the
    /// feed cuts did not reach the readers).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.over_bound > 0 {
            failures.push(format!(
                "client-cache: {} cached answers were staler than the bound of {:.1} ms (max {:.1} ms)",
                self.over_bound, self.bound_ms, self.cached_staleness.max_ms
            ));
        }
        if self.monotonic_violations > 0 {
            failures.push(format!(
                "client-cache: readers went back {} times outside loss windows",
                self.monotonic_violations
            ));
        }
        if self.cache_hits == 0 {
            failures.push(
                "client-cache: no read was answered from a cache: it tested nothing".to_owned(),
            );
        }
        if self.flush_pushes == 0 {
            failures.push(format!(
                "client-cache: no key was pushed by a flush ({} feed flushes): the feed cuts did not reach the readers",
                self.feed_flushes
            ));
        }
        failures
    }
}

impl ModeResult {
    /// Whether this mode claims monotonic reads: every mode but `random-suffix`, whose readers
    /// pick a copy at random with no floor.
    pub fn judges_monotonic_reads(&self) -> bool {
        self.mode != Mode::RandomSuffix
    }

    /// The monotonic-read violations that fail the run: outside loss windows, whichever two
    /// reads they compare; in `floor` mode, inside loss windows too (the reader's own floor
    /// survives a lost write).
    pub fn judged_monotonic_violations(&self) -> usize {
        if !self.judges_monotonic_reads() {
            return 0;
        }
        let outside = self.monotonic_violations
            + self.monotonic_violations_across_copies
            + self.monotonic_violations_across_roles;
        if self.mode == Mode::Floor {
            outside + self.monotonic_violations_in_loss_windows
        } else {
            outside
        }
    }

    /// The mode's name, marked when the near cache answered.
    pub fn label(&self) -> String {
        if self.near_cache {
            format!("{} (near cache)", self.mode.as_str())
        } else {
            self.mode.as_str().to_owned()
        }
    }

    /// What this mode's line contributes to the run's verdict.
    pub fn verdict(&self) -> &'static str {
        let client_cache_failed = self
            .client_cache
            .as_ref()
            .is_some_and(|figures| !figures.failures().is_empty());
        if self.judged_monotonic_violations() > 0
            || self.read_your_writes_violations > 0
            || client_cache_failed
        {
            "FAIL"
        } else if self.judges_monotonic_reads() {
            "pass"
        } else {
            "pass (read-your-writes only)"
        }
    }

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
    /// The reasons this run fails, empty when it passes: in the `affine`, `floor` and `delete`
    /// modes any monotonic-read violation outside a loss window, whichever two reads it compares
    /// (the same copy, two copies, or a replica and its primary), and in `floor` mode inside loss
    /// windows too; in every mode any read-your-writes violation; any wrong
    /// `decides-on-presence` decision.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for mode in &self.modes {
            let judged = mode.judged_monotonic_violations();
            if judged > 0 {
                failures.push(format!(
                    "{} mode broke monotonic reads {judged} times{} ({} same copy, {} across copies, {} replica/primary)",
                    mode.label(),
                    if mode.mode == Mode::Floor {
                        ""
                    } else {
                        " outside loss windows"
                    },
                    mode.monotonic_violations,
                    mode.monotonic_violations_across_copies,
                    mode.monotonic_violations_across_roles
                ));
            }
            if let Some(figures) = &mode.client_cache {
                failures.extend(figures.failures());
            }
            if mode.read_your_writes_violations > 0 {
                failures.push(format!(
                    "{} mode broke read-your-writes {} times",
                    mode.label(),
                    mode.read_your_writes_violations
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
        let _ = writeln!(out, "| mode | verdict | reads | monotonic-read violations | same copy | across copies | replica/primary | in loss windows | read-your-writes violations | stale reads | stale by, p99 (ms) | staleness of every read p50 / p99 / max (ms) | of near-cache hits (ms) | class budget (ms) | Redis copy reads/s | extra source loads | convergence p99 (ms) | copy rollbacks |");
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for mode in &self.modes {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} / {:.1} / {:.1} | {} | {:.0} | {:.0} | {} | {:.1} | {} |",
                mode.label(),
                mode.verdict(),
                mode.reads,
                mode.all_monotonic_violations(),
                mode.monotonic_violations,
                mode.monotonic_violations_across_copies,
                mode.monotonic_violations_across_roles,
                mode.monotonic_violations_in_loss_windows,
                mode.read_your_writes_violations,
                mode.stale_reads,
                mode.stale_behind.p99_ms,
                mode.staleness.p50_ms,
                mode.staleness.p99_ms,
                mode.staleness.max_ms,
                if mode.near_cache_hit_staleness.count == 0 {
                    "–".to_owned()
                } else {
                    let hits = &mode.near_cache_hit_staleness;
                    format!("{:.1} / {:.1} / {:.1}", hits.p50_ms, hits.p99_ms, hits.max_ms)
                },
                mode.budget_ms,
                mode.redis_reads_per_s,
                mode.source_loads,
                mode.convergence.p99_ms,
                mode.copy_rollbacks
            );
        }
        self.client_cache_markdown(&mut out);
        if self.presence.is_empty() {
            return out;
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

impl CheckReport {
    /// The `client-cache` rows' table, when there is one.
    fn client_cache_markdown(&self, out: &mut String) {
        let rows: Vec<(&ModeResult, &ClientCacheFigures)> = self
            .modes
            .iter()
            .filter_map(|mode| Some((mode, mode.client_cache.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "\n## Client-side caching\n");
        let _ = writeln!(out, "| mode | verdict | reads | cache hits | door reads | invalidations seen | null invalidations seen | keys pushed by flushes (feed flushes) | disconnect flushes | feed cuts | cached staleness p50 / p99 / max (ms) | bound (ms) = lease + max_silence + heartbeat + slack | over the bound | monotonic-read violations (in loss windows) |");
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for (mode, f) in rows {
            let b = &f.bound;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {:.1} / {:.1} / {:.1} | {:.1} = {:.0} + {:.0} + {:.2} + {:.0} | {} | {} ({}) |",
                mode.label(),
                if f.failures().is_empty() { "pass" } else { "FAIL" },
                f.reads,
                f.cache_hits,
                f.door_reads,
                f.invalidations,
                f.flushes,
                f.flush_pushes,
                f.feed_flushes,
                f.disconnect_flushes,
                f.feed_cuts,
                f.cached_staleness.p50_ms,
                f.cached_staleness.p99_ms,
                f.cached_staleness.max_ms,
                f.bound_ms,
                b.lease_ms,
                b.max_silence_ms,
                b.heartbeat_ms,
                b.slack_ms,
                f.over_bound,
                f.monotonic_violations,
                f.monotonic_violations_in_loss_windows
            );
        }
    }
}

/// Judges one mode's history: monotonic-read violations inside and outside the loss windows,
/// by scope, staleness, read-your-writes, source loads, convergence and copy rollbacks.
pub(super) fn judge(mode: Mode, events: &[Event], loss_windows: &[(u64, u64)]) -> ModeResult {
    let (inside, outside) =
        checkers::split_by_windows(checkers::monotonic_reads(events), loss_windows);
    let in_scope = |scope| {
        outside
            .iter()
            .filter(|violation| violation.scope() == scope)
            .count()
    };
    let staleness = checkers::staleness(events);
    // The writes, and only the reads the near cache answered.
    let hits: Vec<Event> = events
        .iter()
        .filter(|event| {
            event.op != Op::Read
                || event
                    .route
                    .as_deref()
                    .is_some_and(|route| route.contains(";source=near-cache"))
        })
        .cloned()
        .collect();
    ModeResult {
        mode,
        near_cache: false,
        staleness: staleness.every,
        near_cache_hit_staleness: checkers::staleness(&hits).every,
        budget_ms: 250.0,
        redis_reads_per_s: 0.0,
        reads: staleness.reads,
        invalidated_reads: events
            .iter()
            .filter(|event| event.invalidated_read())
            .count(),
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
        client_cache: None,
    }
}

/// Counts wrong "is it held?" decisions of one class against the claimer's acknowledged history.
/// A read overlapping any claim operation has no single truth and is not judged.
pub(super) fn judge_presence(class: &str, events: &[Event]) -> PresenceResult {
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
