//! The hot-key detector's config: `[hot_keys]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The thinnest sampling: one read in this many.
pub const MAX_SAMPLE_EVERY: u32 = 65_536;

/// How each instance finds its hot keys (`[hot_keys]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HotKeysConfig {
    /// Whether reads are sampled at all. Default: `true`.
    pub enabled: bool,
    /// One read in at least this many is counted (1: every read, while the rate allows). A
    /// sampled read takes the table's lock; the others cost a thread-local random number.
    /// Default: `1`.
    pub sample_every: u32,
    /// About how many reads a second are sampled, at most: above `samples_per_s ×
    /// sample_every` reads a second the detector samples more thinly (one in
    /// `⌈rate ÷ samples_per_s⌉`, chosen at each window's close, and doubled within a window
    /// once it has sampled twice its share), so the table's lock is taken about this often
    /// whatever the read rate, and below it every read counts. `0`: always one in
    /// `sample_every`. Default: `4096`.
    pub samples_per_s: u32,
    /// Counters in the top-K table (Space-Saving): every key with more than a
    /// `1 / capacity` share of a window's sampled reads holds one. Default: `256`.
    pub capacity: usize,
    /// How long each window counts before its rates are taken. Default: `1s`.
    #[serde(with = "crate::duration")]
    pub window: Duration,
    /// The read rate (reads per second asked of this instance, estimated from the samples) at
    /// which a key is hot. Default: `1000.0`.
    pub threshold: f64,
    /// A hot key cools once its rate has stayed below `threshold × cool_ratio` for
    /// `cool_down` (hysteresis: a key at the threshold does not flap). Must be in `0.0..=1.0`.
    /// Default: `0.5`.
    pub cool_ratio: f64,
    /// See `cool_ratio`. Default: `30s`.
    #[serde(with = "crate::duration")]
    pub cool_down: Duration,
    /// Keys listed by `GET /v1/hot-keys`, most read first. Default: `10`.
    pub list: usize,
}

impl Default for HotKeysConfig {
    fn default() -> Self {
        HotKeysConfig {
            enabled: true,
            sample_every: 1,
            samples_per_s: 4096,
            capacity: 256,
            window: Duration::from_secs(1),
            threshold: 1000.0,
            cool_ratio: 0.5,
            cool_down: Duration::from_secs(30),
            list: 10,
        }
    }
}

impl HotKeysConfig {
    /// Checks every `hot_keys.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let fail = |why: String| Err(Error::new(ErrorKind::Config, why));
        if !(1..=MAX_SAMPLE_EVERY).contains(&self.sample_every) {
            return fail(format!(
                "hot_keys.sample_every: must be in 1..={MAX_SAMPLE_EVERY}, got {}",
                self.sample_every
            ));
        }
        if !(1..=65_536).contains(&self.capacity) {
            return fail(format!(
                "hot_keys.capacity: must be in 1..=65536, got {}",
                self.capacity
            ));
        }
        if self.window < Duration::from_millis(100) || self.window > Duration::from_secs(60) {
            return fail("hot_keys.window: must be between 100ms and 60s".into());
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return fail(format!(
                "hot_keys.threshold: must be a positive number of reads per second, got {}",
                self.threshold
            ));
        }
        if !(0.0..=1.0).contains(&self.cool_ratio) {
            return fail(format!(
                "hot_keys.cool_ratio: must be in 0.0..=1.0, got {}",
                self.cool_ratio
            ));
        }
        if self.list == 0 || self.list > self.capacity {
            return fail(format!(
                "hot_keys.list: must be in 1..=hot_keys.capacity ({}), got {}",
                self.capacity, self.list
            ));
        }
        Ok(())
    }
}
