//! The scrub's config: `[scrub]` (whether it runs, how often a pass starts, its rate, its
//! lease).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The anti-entropy scrub: a background walk over the split families' keys that repairs any
/// copy missing or behind a sibling. It runs with the Redis store only.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrubConfig {
    /// Whether this instance takes part in the scrub (takes the lease when it is free and then
    /// scrubs). Default: true.
    pub enabled: bool,
    /// How long from the start of one pass to the start of the next, for the lease holder (a
    /// pass that takes longer is followed at once by the next). Default: `5m`.
    #[serde(with = "crate::duration")]
    pub interval: Duration,
    /// The most keys (each one read of every copy) a pass checks per second, over every node
    /// together. Default: 1000.
    pub max_keys_per_second: u32,
    /// How long the lease lasts without a renewal. The holder renews it every third of this;
    /// the other instances try to take it as often, so a holder that died is replaced within
    /// about this long. Default: `30s`.
    #[serde(with = "crate::duration")]
    pub lease_ttl: Duration,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            enabled: true,
            interval: Duration::from_secs(300),
            max_keys_per_second: 1000,
            lease_ttl: Duration::from_secs(30),
        }
    }
}

impl ScrubConfig {
    /// Checks every `scrub.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, why: String| {
            Err(Error::new(
                ErrorKind::Config,
                format!("scrub.{field}: {why}"),
            ))
        };
        if self.interval < Duration::from_millis(100) {
            return invalid(
                "interval",
                format!("must be at least 100ms, got {:?}", self.interval),
            );
        }
        if self.max_keys_per_second == 0 {
            return invalid(
                "max_keys_per_second",
                "must be at least 1, got 0".to_owned(),
            );
        }
        if self.lease_ttl < Duration::from_millis(300) || self.lease_ttl > Duration::from_secs(3600)
        {
            return invalid(
                "lease_ttl",
                format!("must be in 300ms..=1h, got {:?}", self.lease_ttl),
            );
        }
        Ok(())
    }

    /// How often the lease is renewed by its holder and tried by the others.
    pub(crate) fn lease_renewal(&self) -> Duration {
        self.lease_ttl / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        ScrubConfig::default().validate().unwrap();
        let zero_rate = ScrubConfig {
            max_keys_per_second: 0,
            ..ScrubConfig::default()
        };
        assert!(zero_rate
            .validate()
            .unwrap_err()
            .message()
            .starts_with("scrub.max_keys_per_second"));
        let short_lease = ScrubConfig {
            lease_ttl: Duration::from_millis(10),
            ..ScrubConfig::default()
        };
        assert!(short_lease
            .validate()
            .unwrap_err()
            .message()
            .starts_with("scrub.lease_ttl"));
    }
}
