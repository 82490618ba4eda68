//! The heal subsystem's config: `[heal]` (retry queue, spool, read repair, expiry jitter,
//! layout watching, node health probes).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Healing of copies whose write failed: the retry queue, its spool, read repair, expiry jitter.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealConfig {
    /// The directory of the retry spool (created if missing; one process owns it, through a lock
    /// file). Used with the Redis store only: the embedded store never fails a copy write.
    /// Default: `hotsplit-data/spool`, relative to the working directory.
    pub spool_dir: PathBuf,
    /// The most entries the retry queue holds; a failed copy beyond it is `dropped`.
    /// Default: 100000.
    pub max_entries: usize,
    /// The most bytes (values counted once per key and version, plus per-entry overhead) the
    /// retry queue holds; a failed copy beyond it is `dropped`. Default: 268435456 (256 MiB).
    pub max_bytes: usize,
    /// The first wait before probing a failing node again. Default: `50ms`.
    #[serde(with = "crate::duration")]
    pub backoff_initial: Duration,
    /// The longest wait between probes of a failing node (exponential, full jitter).
    /// Default: `5s`.
    #[serde(with = "crate::duration")]
    pub backoff_cap: Duration,
    /// How many entries one flush command batch carries once a node answers again. Default: 256.
    pub flush_batch: usize,
    /// The lower bound of each value copy's expiry jitter, as a fraction of the family TTL in
    /// -0.5..=0. Default: -0.1.
    pub expiry_jitter_min: f64,
    /// The upper bound of each value copy's expiry jitter, in `expiry_jitter_min..=0`, so no
    /// copy outlives the family TTL. Default: 0.
    pub expiry_jitter_max: f64,
    /// How many read repairs may run at once; a repair beyond it is skipped (and counted).
    /// Default: 16.
    pub repair_concurrency: usize,
    /// How often each family's layout record is re-read to detect a mismatch and this
    /// instance's live entry refreshed (it lapses after three intervals). Default: `5s`.
    #[serde(with = "crate::duration")]
    pub layout_interval: Duration,
    /// How often, after a family shrank, its keys are scanned and copies beyond its copy count
    /// deleted. Default: `1m`.
    #[serde(with = "crate::duration")]
    pub sweep_interval: Duration,
    /// How often a health probe (`PING`) goes to every node known to be failing, to see it back,
    /// and to every healthy primary, to see it fail before a command waits out
    /// `store.command_timeout` on it. Redis store only. Default: `100ms`.
    #[serde(with = "crate::duration")]
    pub probe_interval: Duration,
    /// How long a health probe may take before it counts as missed: a failing node that answers
    /// slower stays failing. At most `heal.probe_interval` × 10. Default: `200ms`, well above a
    /// loopback or LAN round trip, so a loaded host does not take a slow answer for a dead node.
    #[serde(with = "crate::duration")]
    pub probe_timeout: Duration,
    /// How many health probes in a row a healthy primary may miss, in rounds where another
    /// primary answered (a round nobody answers is taken for a stall of this process; a
    /// standalone server's round counts unless this process stalled), before
    /// it is marked failing (its copy writes queue at once, its reads go to sibling copies, an allocation whose
    /// counter it holds answers 503 at once). 0 probes no healthy primary: only a command
    /// timeout marks a node failing. Default: 3, so one slow answer is not an outage.
    pub probe_misses: u32,
}

impl Default for HealConfig {
    fn default() -> Self {
        HealConfig {
            spool_dir: PathBuf::from("hotsplit-data/spool"),
            max_entries: 100_000,
            max_bytes: 256 * 1024 * 1024,
            backoff_initial: Duration::from_millis(50),
            backoff_cap: Duration::from_secs(5),
            flush_batch: 256,
            expiry_jitter_min: -0.1,
            expiry_jitter_max: 0.0,
            repair_concurrency: 16,
            layout_interval: Duration::from_secs(5),
            sweep_interval: Duration::from_secs(60),
            probe_interval: Duration::from_millis(100),
            probe_timeout: Duration::from_millis(200),
            probe_misses: 3,
        }
    }
}

impl HealConfig {
    /// Checks every `heal.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, why: String| {
            Err(Error::new(
                ErrorKind::Config,
                format!("heal.{field}: {why}"),
            ))
        };
        if self.spool_dir.as_os_str().is_empty() {
            return invalid("spool_dir", "must not be empty".into());
        }
        if self.max_entries == 0 {
            return invalid("max_entries", "must be positive".into());
        }
        if self.max_bytes == 0 {
            return invalid("max_bytes", "must be positive".into());
        }
        if self.backoff_initial.is_zero() {
            return invalid("backoff_initial", "must be positive".into());
        }
        if self.backoff_cap < self.backoff_initial {
            return invalid(
                "backoff_cap",
                "must be at least heal.backoff_initial".into(),
            );
        }
        if self.flush_batch == 0 {
            return invalid("flush_batch", "must be positive".into());
        }
        if !(-0.5..=0.0).contains(&self.expiry_jitter_min) {
            return invalid(
                "expiry_jitter_min",
                format!("must be in -0.5..=0, got {}", self.expiry_jitter_min),
            );
        }
        if !(self.expiry_jitter_min..=0.0).contains(&self.expiry_jitter_max) {
            return invalid(
                "expiry_jitter_max",
                format!(
                    "must be in heal.expiry_jitter_min..=0, got {}",
                    self.expiry_jitter_max
                ),
            );
        }
        if self.repair_concurrency == 0 {
            return invalid("repair_concurrency", "must be positive".into());
        }
        if self.layout_interval.is_zero() {
            return invalid("layout_interval", "must be positive".into());
        }
        if self.sweep_interval.is_zero() {
            return invalid("sweep_interval", "must be positive".into());
        }
        if self.probe_interval.is_zero() {
            return invalid("probe_interval", "must be positive".into());
        }
        if self.probe_timeout.is_zero() || self.probe_timeout > self.probe_interval * 10 {
            return invalid(
                "probe_timeout",
                "must be positive and at most heal.probe_interval × 10".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_settings_are_checked() {
        HealConfig::default().validate().unwrap();
        let cases = [
            (
                HealConfig {
                    probe_interval: Duration::ZERO,
                    ..HealConfig::default()
                },
                "heal.probe_interval: must be positive",
            ),
            (
                HealConfig {
                    probe_timeout: Duration::ZERO,
                    ..HealConfig::default()
                },
                "heal.probe_timeout: must be positive",
            ),
            (
                HealConfig {
                    probe_timeout: Duration::from_millis(1001),
                    ..HealConfig::default()
                },
                "heal.probe_timeout: must be positive and at most",
            ),
        ];
        for (config, expected) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.message().starts_with(expected), "{err}");
        }
        let off = HealConfig {
            probe_misses: 0,
            ..HealConfig::default()
        };
        off.validate().unwrap();
    }
}
