//! The fleet's config: `[fleet]` (the instance registry's heartbeat and advertised address) and
//! `[session]` (session tokens).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The default `session.high_water_bytes`: the instance-wide per-key high-water's size
/// (`crate::ops::HighWater`).
pub const DEFAULT_HIGH_WATER_BYTES: u64 = 1 << 20;

/// The `[fleet]` settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// How often this instance refreshes its entry in the instance registry; an entry lapses
    /// after three intervals without a refresh (an instance that died without removing it).
    /// Default: `2s`.
    #[serde(with = "crate::duration")]
    pub heartbeat_interval: Duration,
    /// The address the registry gives for this instance's API, for instances behind NAT or a
    /// wildcard listen address (`0.0.0.0:7070`). Default: unset (the bound listen address).
    pub advertise: Option<String>,
    /// How often this instance checks for older releases' Redis function libraries that no
    /// registered instance runs any more, and deletes those that have stayed unused for three
    /// heartbeat intervals (`fleet::retire`). Default: `1m`.
    #[serde(with = "crate::duration")]
    pub retire_interval: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            heartbeat_interval: Duration::from_secs(2),
            advertise: None,
            retire_interval: Duration::from_secs(60),
        }
    }
}

impl FleetConfig {
    /// How long a registry entry lives without a refresh: three heartbeat intervals.
    pub(crate) fn entry_ttl(&self) -> Duration {
        self.heartbeat_interval.saturating_mul(3)
    }

    /// Checks every `fleet.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.heartbeat_interval < Duration::from_millis(100)
            || self.heartbeat_interval > Duration::from_secs(3600)
        {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "fleet.heartbeat_interval: must be in 100ms..=1h, got {}",
                    humantime::format_duration(self.heartbeat_interval)
                ),
            ));
        }
        if self.retire_interval < Duration::from_millis(100)
            || self.retire_interval > Duration::from_secs(3600)
        {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "fleet.retire_interval: must be in 100ms..=1h, got {}",
                    humantime::format_duration(self.retire_interval)
                ),
            ));
        }
        if let Some(advertise) = &self.advertise {
            if advertise.is_empty()
                || advertise.len() > 255
                || advertise.chars().any(|c| !c.is_ascii_graphic())
            {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("fleet.advertise: must be 1..=255 printable ASCII characters without spaces, got {advertise:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// The `[session]` settings: session tokens (`Hotsplit-Session`, `fleet::session`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    /// The most keys a token keeps floors for (the most recently used), 1..=64: at most
    /// 1 + 25 × `max_keys` + 8 bytes, 1,079 characters encoded at 32. Default: 32.
    pub max_keys: usize,
    /// Also send the token as a cookie (`hotsplit_session`, `HttpOnly; Secure;
    /// SameSite=Strict; Path=/v1/keys`) and read it from one when no header comes, for browser
    /// clients. Default: false.
    pub cookie: bool,
    /// The bytes of the instance-wide per-key high-water (`ops::HighWater`): the floor of reads
    /// that name no client (pooled Redis-protocol connections), 0..=1 GiB (a small value is
    /// raised to the smallest, 256 buckets: about 1,000 keys held exactly; fewer bytes hold
    /// fewer keys exactly, and estimate more). Default: 1 MiB.
    pub high_water_bytes: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_keys: 32,
            cookie: false,
            high_water_bytes: DEFAULT_HIGH_WATER_BYTES,
        }
    }
}

impl SessionConfig {
    /// Checks every `session.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=crate::fleet::session::MAX_FLOORS).contains(&self.max_keys) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "session.max_keys: must be in 1..={}, got {}",
                    crate::fleet::session::MAX_FLOORS,
                    self.max_keys
                ),
            ));
        }
        if self.high_water_bytes > MAX_HIGH_WATER_BYTES {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "session.high_water_bytes: must be at most {MAX_HIGH_WATER_BYTES} (1 GiB), got {}",
                    self.high_water_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// The largest `session.high_water_bytes`.
const MAX_HIGH_WATER_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_validate_and_bad_values_name_their_field() {
        FleetConfig::default().validate().unwrap();
        let fast = FleetConfig {
            heartbeat_interval: Duration::from_millis(10),
            ..FleetConfig::default()
        };
        assert!(fast
            .validate()
            .unwrap_err()
            .to_string()
            .contains("fleet.heartbeat_interval"));
        let spaced = FleetConfig {
            advertise: Some("a b".to_owned()),
            ..FleetConfig::default()
        };
        assert!(spaced
            .validate()
            .unwrap_err()
            .to_string()
            .contains("fleet.advertise"));
        assert_eq!(FleetConfig::default().entry_ttl(), Duration::from_secs(6));
        SessionConfig::default().validate().unwrap();
        for max_keys in [0, 65] {
            let config = SessionConfig {
                max_keys,
                ..SessionConfig::default()
            };
            assert!(config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("session.max_keys"));
        }
        let huge = SessionConfig {
            high_water_bytes: (1 << 30) + 1,
            ..SessionConfig::default()
        };
        assert!(huge
            .validate()
            .unwrap_err()
            .to_string()
            .contains("session.high_water_bytes"));
    }
}
