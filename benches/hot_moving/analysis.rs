//! Analysis: figures (a), (b), (c) and the split's, from the load log, the polls and the
//! masters' samples.

use std::collections::{HashMap, HashSet};

use hotsplit::hot::HotKeysConfig;

use crate::keys::{KeyId, Schedule};
use crate::load::{Read, Tally};
use crate::observe::{Listed, MasterSample, Observed, Poll};
use crate::SPREAD_SHARE;

/// Everything the report prints that the run measured.
pub(crate) struct Measured {
    /// Part 1's moves, (a) and (b) of each.
    pub(crate) moved: Vec<MoveFigures>,
    /// (c), the top-10 sums.
    pub(crate) top: Quality,
    /// (c), the above-the-threshold sums.
    pub(crate) above: Quality,
    /// The closed windows (c) compared, both instances together.
    pub(crate) windows: usize,
    /// Part 2's figures.
    pub(crate) split: SplitFigures,
    /// The load's counts (and its log).
    pub(crate) tally: Tally,
    /// Polls that failed.
    pub(crate) poll_failures: u64,
    /// Reads answered in part 1.
    pub(crate) part1_reads: usize,
    /// Reads answered in part 2.
    pub(crate) part2_reads: usize,
    /// Part 2's length, from the move to the load's end, in seconds.
    pub(crate) part2_seconds: f64,
    /// The detectors' `sample_every` seen in part 1: one value, or "low to high".
    pub(crate) sampling_seen: String,
    /// How many masters the cluster has.
    pub(crate) masters: usize,
}

impl Measured {
    /// The figures of a run on `schedule` whose load logged `tally` until `load_ended_ms`,
    /// whose observers saw `observed`, on a cluster of `masters` masters.
    pub(crate) fn of(
        schedule: &Schedule,
        tally: Tally,
        observed: Observed,
        load_ended_ms: f64,
        masters: usize,
    ) -> Measured {
        let Observed {
            polls,
            poll_failures,
            samples,
        } = observed;
        let part1_end = schedule.part2_ms();
        let (top, above, windows) = window_quality(
            schedule.start_ms,
            part1_end,
            &polls,
            &tally.reads,
            HotKeysConfig::default().list,
        );
        let part1_reads = tally
            .reads
            .iter()
            .filter(|read| read.at_ms <= part1_end)
            .count();
        Measured {
            moved: detection(schedule, schedule.moves.len(), &polls),
            top,
            above,
            windows,
            split: split_figures(schedule.part2_ms(), &samples, &polls[0]),
            part2_reads: tally.reads.len() - part1_reads,
            part1_reads,
            tally,
            poll_failures,
            part2_seconds: (load_ended_ms - part1_end) / 1000.0,
            sampling_seen: sampling_seen(&polls, part1_end),
            masters,
        }
    }

    /// (a) of every move seen, ms.
    pub(crate) fn instance_ms(&self) -> Vec<f64> {
        self.moved.iter().filter_map(|m| m.instance_ms).collect()
    }

    /// (b) of every move seen, ms.
    pub(crate) fn fleet_ms(&self) -> Vec<f64> {
        self.moved.iter().filter_map(|m| m.fleet_ms).collect()
    }

    /// (b) − (a) of every move seen both ways, ms.
    pub(crate) fn fleet_lag_ms(&self) -> Vec<f64> {
        self.moved
            .iter()
            .filter_map(|m| Some(m.fleet_ms? - m.instance_ms?))
            .collect()
    }
}

/// The detectors' `sample_every` in the polls of part 1 (until `part1_end`): one value, or
/// "low to high", or "–" without a poll.
fn sampling_seen(polls: &[Vec<Poll>], part1_end: f64) -> String {
    let sampling: Vec<u64> = polls
        .iter()
        .flatten()
        .filter(|poll| poll.at_ms <= part1_end)
        .map(|poll| poll.sample_every)
        .collect();
    match (sampling.iter().min(), sampling.iter().max()) {
        (Some(low), Some(high)) if low == high => low.to_string(),
        (Some(low), Some(high)) => format!("{low} to {high}"),
        _ => "–".to_owned(),
    }
}

/// The median of `values` (NaN when empty).
pub(crate) fn median(values: &[f64]) -> f64 {
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

pub(crate) fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// One move's detection times, ms after the move.
#[derive(Debug)]
pub(crate) struct MoveFigures {
    pub(crate) key: String,
    /// (a): listed hot by the instance that sees it.
    pub(crate) instance_ms: Option<f64>,
    /// (b): listed hot in the other instance's fleet view.
    pub(crate) fleet_ms: Option<f64>,
}

/// Per move of part 1, when it was seen (see the module documentation).
pub(crate) fn detection(
    schedule: &Schedule,
    moves: usize,
    polls: &[Vec<Poll>],
) -> Vec<MoveFigures> {
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
pub(crate) struct Quality {
    pub(crate) hits: usize,
    pub(crate) reported: usize,
    pub(crate) truth: usize,
}

impl Quality {
    pub(crate) fn precision(&self) -> f64 {
        if self.reported == 0 {
            f64::NAN
        } else {
            self.hits as f64 / self.reported as f64
        }
    }

    pub(crate) fn recall(&self) -> f64 {
        if self.truth == 0 {
            f64::NAN
        } else {
            self.hits as f64 / self.truth as f64
        }
    }
}

/// The windows' figures (c): (top-10, above the threshold, windows compared).
pub(crate) fn window_quality(
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
pub(crate) struct SplitFigures {
    /// Each interval: (end, ms after the move; busiest share; least share).
    pub(crate) intervals: Vec<(f64, f64, f64)>,
    /// The first poll of instance 0 showing `writing`, ms after the move.
    pub(crate) writing_ms: Option<f64>,
    /// The first showing `reading`.
    pub(crate) reading_ms: Option<f64>,
    /// The end of the first spread interval, ms after the move.
    pub(crate) spread_ms: Option<f64>,
    pub(crate) before: f64,
    pub(crate) after_busiest: f64,
    pub(crate) after_least: f64,
}

pub(crate) fn split_figures(moved: f64, samples: &[MasterSample], polls: &[Poll]) -> SplitFigures {
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
