//! The near cache's config: `[near_cache]`. Which classes read it, and how old an answer they
//! accept, is per class (`classes.<name>.near_cache_max_age`, in `route::config`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The per-instance near cache of copies (`[near_cache]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NearCacheConfig {
    /// Whether reads of a class with a near-cache max age may be answered from memory. The
    /// cache is always off on the embedded store (it *is* memory). Default: `true`.
    pub enabled: bool,
    /// The most bytes the entries hold, counted over their copy keys and values plus a fixed
    /// overhead per entry (448 bytes, measured: what an entry costs the process); an eighth
    /// more is given to the high-water records of evicted entries, and a thirty-second more
    /// (at least 6 KiB) to the fixed high-water sketch that keeps their floors once the records
    /// are evicted too. Default: 33554432 (32 MiB).
    pub max_bytes: u64,
    /// Refresh-ahead's largest lead, as a share of a class's max age. A hit starts a background
    /// refresh of its entry once the entry is within one fill time of ageing out (the duration
    /// of the Redis read that filled it), so the new entry lands as the old one ages out and a
    /// hot copy's readers do not all wait at expiry; the lead is that fill time capped at this
    /// share. A copy is then re-read at most once per (max age − source lag − lead): over the
    /// bound of one read per (max age − source lag) by the fill time alone, at most this share.
    /// `0.0` turns refresh-ahead off (the first read after expiry waits for the fill). Must be
    /// in 0.0..=0.25. Default: 0.01.
    pub refresh_lead_max: f64,
    /// The previous release's refresh-ahead point (a share of the max age at which a hit
    /// started a refresh), replaced by `refresh_lead_max`. Accepted and ignored, with a WARN at
    /// startup, so that a config file of the previous release still starts during a rolling
    /// upgrade. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_ahead: Option<f64>,
}

impl Default for NearCacheConfig {
    fn default() -> Self {
        NearCacheConfig {
            enabled: true,
            max_bytes: 32 * 1024 * 1024,
            refresh_lead_max: 0.01,
            refresh_ahead: None,
        }
    }
}

impl NearCacheConfig {
    /// Checks every `near_cache.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.max_bytes < 64 * 1024 {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "near_cache.max_bytes: must be at least 65536, got {}",
                    self.max_bytes
                ),
            ));
        }
        if !(0.0..=0.25).contains(&self.refresh_lead_max) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "near_cache.refresh_lead_max: must be in 0.0..=0.25, got {}",
                    self.refresh_lead_max
                ),
            ));
        }
        Ok(())
    }
}
