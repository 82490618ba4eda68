//! The command line: [`Options`] and part 1's moves drawn from it.

use std::time::Duration;

use hotsplit::config::HealConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::BoxError;

/// The command line.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Part 1's length.
    pub(crate) duration: Duration,
    /// How often the hotspot moves in part 1.
    pub(crate) hot_every: Duration,
    /// Seeds the load tasks' generators.
    pub(crate) seed: u64,
    /// Reads per second the load aims at, all tasks together.
    pub(crate) rate: f64,
    /// Load tasks.
    pub(crate) concurrency: usize,
    /// Cold keys (`mv:cold:0..N`).
    pub(crate) cold_keys: u32,
    /// The hot key's share of the reads.
    pub(crate) hot_share: f64,
    /// The longest part 2 waits for the split key to spread.
    pub(crate) split_hold: Duration,
    /// `heal.layout_interval` of both instances.
    pub(crate) layout_interval: Duration,
    /// How often `/v1/hot-keys` is polled.
    pub(crate) poll: Duration,
    /// How often the masters' `INFO commandstats` is read in part 2.
    pub(crate) interval: Duration,
}

impl Options {
    /// The command line after the program name; `None` without `--bench` (a smoke run: do
    /// nothing).
    pub(crate) fn parse(args: &[String]) -> Result<Option<Options>, BoxError> {
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
    pub(crate) fn move_offsets(&self) -> Vec<Duration> {
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
