//! A family's automatic split policy: `[[family]] split = { … }`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::key::MAX_COPIES;

/// What a family does with a key its instances find hot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// Detect and report what would be split (`/v1/hot-keys` shows `would_split`); never split.
    #[default]
    Observe,
    /// Split hot keys into `max_copies` copies, and merge them back once they cool.
    Split,
}

impl SplitMode {
    /// The config spelling, as `/v1/hot-keys` reports it under `policy`.
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMode::Observe => "observe",
            SplitMode::Split => "split",
        }
    }
}

/// How far and how often a family's hot keys split (`[[family]] split = { … }`). Absent: no
/// automatic split.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplitConfig {
    /// `split` or `observe`. Default: `observe`.
    #[serde(default)]
    pub mode: SplitMode,
    /// The copies a split key has, more than the family's `copies`, at most 1024. Required.
    pub max_copies: u32,
    /// The read rate (reads per second asked of one instance, as the detector estimates it) at
    /// which a hot key splits; at least `hot_keys.threshold`, since only keys the detector
    /// calls hot are offered. Default: `hot_keys.threshold` (`0.0` here).
    #[serde(default)]
    pub threshold: f64,
    /// How long a split key stays split after no instance sees it hot any more, before it
    /// merges. Default: `60s`.
    #[serde(with = "crate::duration", default = "default_cool_down")]
    pub cool_down: Duration,
    /// The most keys of the family split at once (the bound of every instance's in-memory
    /// index of split keys), 1..=4096. Default: `64`.
    #[serde(default = "default_max_split_keys")]
    pub max_split_keys: usize,
    /// The most splits one instance starts per minute, 1..=10000. Default: `10`.
    #[serde(default = "default_max_splits_per_minute")]
    pub max_splits_per_minute: u32,
}

fn default_cool_down() -> Duration {
    Duration::from_secs(60)
}

fn default_max_split_keys() -> usize {
    64
}

fn default_max_splits_per_minute() -> u32 {
    10
}

/// The largest `max_split_keys`: the index is read whole every layout interval.
pub const MAX_SPLIT_KEYS: usize = 4096;

impl SplitConfig {
    /// Checks every field; `field` is the table's config path (`family[0].split`), `copies` the
    /// family's copy count.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self, field: &str, copies: u32) -> Result<()> {
        let fail = |why: String| Err(Error::new(ErrorKind::Config, format!("{field}.{why}")));
        if self.max_copies <= copies || self.max_copies > MAX_COPIES {
            return fail(format!(
                "max_copies: must be more than the family's copies ({copies}) and at most {MAX_COPIES}, got {}",
                self.max_copies
            ));
        }
        if !(self.threshold.is_finite() && self.threshold >= 0.0) {
            return fail(format!(
                "threshold: must be a non-negative number of reads per second, got {}",
                self.threshold
            ));
        }
        if self.cool_down.is_zero() {
            return fail("cool_down: must be positive".into());
        }
        if !(1..=MAX_SPLIT_KEYS).contains(&self.max_split_keys) {
            return fail(format!(
                "max_split_keys: must be in 1..={MAX_SPLIT_KEYS}, got {}",
                self.max_split_keys
            ));
        }
        if !(1..=10_000).contains(&self.max_splits_per_minute) {
            return fail(format!(
                "max_splits_per_minute: must be in 1..=10000, got {}",
                self.max_splits_per_minute
            ));
        }
        Ok(())
    }
}
