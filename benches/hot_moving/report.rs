//! The report: one markdown section on stdout, each figure beside its target and whether it was
//! met.

use std::time::Instant;

use hotsplit::config::{FleetConfig, StoreConfig};
use hotsplit::hot::HotKeysConfig;

use crate::analysis::{max, median, Measured};
use crate::options::Options;
use crate::{DETECT_TARGET, QUALITY_TARGET, SPLIT_KEY, SPREAD_SHARE};

/// What the report says of the run beside its figures.
pub(crate) struct Context {
    /// The load average before the run, from `/proc/loadavg`.
    pub(crate) load_before: String,
    /// When the run started.
    pub(crate) started: Instant,
    /// The command line.
    pub(crate) options: Options,
}

/// The whole report: the command, the setup, the load, the table of figures, the per-move
/// figures and part 2's intervals.
pub(crate) fn render(context: &Context, measured: &Measured) -> String {
    let options = &context.options;
    let mut out = String::new();
    out.push_str("## hot_moving — the detector and the split under a moving hotspot\n\n");
    out.push_str(&command_line());
    out.push_str(&setup(context, measured));
    out.push_str(&load(options, measured));
    out.push_str("| Figure | Measured | Target | Verdict |\n|---|---|---|---|\n");
    out.push_str(&detection_rows(options, measured));
    out.push_str(&quality_rows(measured));
    out.push_str(&split_rows(options, measured));
    out.push_str(&per_move(measured));
    out
}

/// The command line the run was given.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    format!(
        "Command: `cargo bench --bench hot_moving --{}{}`\n\n",
        if args.is_empty() { "" } else { " " },
        args.join(" ")
    )
}

pub(crate) fn seconds(ms: f64) -> String {
    if ms.is_nan() {
        "–".into()
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

pub(crate) fn ratio(value: f64) -> String {
    if value.is_nan() {
        "–".into()
    } else {
        format!("{value:.3}")
    }
}

pub(crate) fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured",
    }
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// The setup paragraph: cores, load average, how long the run took, the instances' config.
fn setup(context: &Context, measured: &Measured) -> String {
    let hot_defaults = HotKeysConfig::default();
    let heartbeat = FleetConfig::default().heartbeat_interval;
    format!(
        "Cores: {}; load average before: {}, after: {}; took {:.0} s. A 3x3 cluster, two `hotsplit serve` (release) with the shipped defaults but `heal.layout_interval = {}` and the scrub off; `[hot_keys]`: at least one read in {} sampled, about {} a second at most (seen: one in {}), window {}, threshold {} reads/s, cool-down {}; `fleet.heartbeat_interval` {}.\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        context.load_before,
        load_average(),
        context.started.elapsed().as_secs_f64(),
        humantime::format_duration(context.options.layout_interval),
        hot_defaults.sample_every,
        hot_defaults.samples_per_s,
        measured.sampling_seen,
        humantime::format_duration(hot_defaults.window),
        hot_defaults.threshold,
        humantime::format_duration(hot_defaults.cool_down),
        humantime::format_duration(heartbeat),
    )
}

/// The load paragraph: what it aimed at, what it achieved, how the reads were answered.
fn load(options: &Options, measured: &Measured) -> String {
    let tally = &measured.tally;
    format!(
        "Load: {} tasks aiming at {:.0} reads/s, {:.0} % on the hot key, the rest uniform over {} cold keys (never published: 404s, counted as reads); achieved {:.0} reads/s in part 1 ({} s) and {:.0} in part 2 ({:.1} s). Answers: {} × 200, {} × 404, {} other, {} without an answer; {} failed polls.\n\n",
        options.concurrency,
        options.rate,
        options.hot_share * 100.0,
        options.cold_keys,
        measured.part1_reads as f64 / options.duration.as_secs_f64(),
        options.duration.as_secs(),
        measured.part2_reads as f64 / measured.part2_seconds.max(0.001),
        measured.part2_seconds,
        tally.found,
        tally.missing,
        tally.other,
        tally.failed,
        measured.poll_failures,
    )
}

/// The rows of figures (a) and (b).
fn detection_rows(options: &Options, measured: &Measured) -> String {
    let heartbeat = FleetConfig::default().heartbeat_interval;
    let moves = measured.moved.len();
    let instance_ms = measured.instance_ms();
    let fleet_ms = measured.fleet_ms();
    let fleet_lag_ms = measured.fleet_lag_ms();
    let all_seen = instance_ms.len() == moves;
    let all_fleet = fleet_lag_ms.len() == moves;
    let mut out = format!(
        "| (a) move → listed hot by the instance that sees it (`instance.keys[].hot` or `instance.other_hot`, polled every {}), {moves} moves | median {}, max {}{} | ≤ {} every move | {} |\n",
        humantime::format_duration(options.poll),
        seconds(median(&instance_ms)),
        seconds(max(&instance_ms)),
        if all_seen { String::new() } else { format!(", {} of {moves} never seen", moves - instance_ms.len()) },
        humantime::format_duration(DETECT_TARGET),
        verdict((!instance_ms.is_empty()).then(|| all_seen && max(&instance_ms) <= DETECT_TARGET.as_secs_f64() * 1000.0)),
    );
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
    out
}

/// The rows of figure (c): top-10 and above-the-threshold precision and recall.
fn quality_rows(measured: &Measured) -> String {
    let hot_defaults = HotKeysConfig::default();
    let (top, above, windows) = (measured.top, measured.above, measured.windows);
    let quality = |value: f64| (!value.is_nan()).then_some(value >= QUALITY_TARGET);
    let mut out = format!(
        "| (c) top-10 precision, tie-aware (Σ\\|R∩T\\| / Σ\\|R\\|; {windows} windows of both instances) | {} ({} of {}) | ≥ {QUALITY_TARGET} | {} |\n",
        ratio(top.precision()), top.hits, top.reported, verdict(quality(top.precision())),
    );
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
    out
}

/// The rows of part 2, the split: the busiest share before and after, and the time to spread.
fn split_rows(options: &Options, measured: &Measured) -> String {
    let split = &measured.split;
    let mut out = format!(
        "| Split: busiest master's share of `HMGET`s before the split (`{SPLIT_KEY}`, 1 copy; median of the {} intervals) | {} | — (the unsplit baseline, ≈ 1.0) | — |\n",
        humantime::format_duration(options.interval),
        ratio(split.before),
    );
    out.push_str(&format!(
        "| Split: busiest master's share after it is spread (median; least share {}) | {} | ≤ {SPREAD_SHARE} (even: {:.3}) | {} |\n",
        ratio(split.after_least),
        ratio(split.after_busiest),
        1.0 / measured.masters as f64,
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
    out
}

/// (a) and (b) per move, then part 2's busiest share per interval.
fn per_move(measured: &Measured) -> String {
    let mut out = String::from("\nPer move, (a) and (b) in seconds after the move:\n\n| Key | Instance | (a) | (b) |\n|---|---|---|---|\n");
    for (m, figures) in measured.moved.iter().enumerate() {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            figures.key,
            m % 2,
            figures.instance_ms.map_or("–".into(), seconds),
            figures.fleet_ms.map_or("–".into(), seconds),
        ));
    }
    out.push_str("\nPart 2, the busiest master's share per interval (end, seconds after the move: share):\n\n");
    let line: Vec<String> = measured
        .split
        .intervals
        .iter()
        .map(|(end, busiest, _)| format!("{:.2}: {busiest:.2}", end / 1000.0))
        .collect();
    out.push_str(&line.join(", "));
    out.push('\n');
    out
}
