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
    /// overhead per entry; an eighth more is given to the high-water records of evicted
    /// entries. Default: 33554432 (32 MiB).
    pub max_bytes: u64,
    /// The share of a class's max age after which a hit starts a background refresh of its
    /// entry (refresh-ahead), so a hot copy is re-read before it ages out; `1.0` turns
    /// refresh-ahead off. Must be in 0.5..=1.0. Default: 0.9.
    pub refresh_ahead: f64,
}

impl Default for NearCacheConfig {
    fn default() -> Self {
        NearCacheConfig {
            enabled: true,
            max_bytes: 32 * 1024 * 1024,
            refresh_ahead: 0.9,
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
        if !(0.5..=1.0).contains(&self.refresh_ahead) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "near_cache.refresh_ahead: must be in 0.5..=1.0, got {}",
                    self.refresh_ahead
                ),
            ));
        }
        Ok(())
    }
}
