//! The invalidation feed's config: `[feed]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::route::Classes;

/// The shortest `feed.max_silence`: the feed writes its own proof four times within it.
pub const MIN_SILENCE: Duration = Duration::from_millis(20);

/// `[feed]`: how each instance hears of the changes the others make.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeedConfig {
    /// Turns the feed off (`false`): other instances' changes then reach this instance's
    /// client-side caches and near cache only when their leases and ages end. Default: on
    /// (with Redis; the embedded store has one instance).
    pub disabled: bool,
    /// How long the feed of a primary may stay silent (no proof of life through it) before
    /// the instance stops trusting it: it then sends every tracking connection the null
    /// invalidation, drops its near-cache entries, and caps leases at this bound until every
    /// feed is current again. At most the smallest lease a read class gives (its
    /// `near_cache_max_age`), at least 20 ms. Default: that smallest lease.
    #[serde(with = "crate::duration::option")]
    pub max_silence: Option<Duration>,
}

impl FeedConfig {
    /// The silence bound in force with `classes`: `max_silence`, or the smallest
    /// `near_cache_max_age` of the classes (1 s when none has one), never under
    /// [`MIN_SILENCE`].
    pub fn silence_bound(&self, classes: &Classes) -> Duration {
        self.max_silence
            .unwrap_or_else(|| smallest_lease(classes).unwrap_or(Duration::from_secs(1)))
            .max(MIN_SILENCE)
    }

    /// Checks `max_silence` against the classes' leases.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self, classes: &Classes) -> Result<()> {
        let Some(silence) = self.max_silence else {
            return Ok(());
        };
        if silence < MIN_SILENCE {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "feed.max_silence: must be at least {} ms, got {} ms",
                    MIN_SILENCE.as_millis(),
                    silence.as_millis()
                ),
            ));
        }
        match smallest_lease(classes) {
            Some(lease) if silence > lease => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "feed.max_silence: must be at most the smallest near_cache_max_age of the read classes ({} ms), got {} ms",
                    lease.as_millis(),
                    silence.as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The smallest near-cache age bound (a lease's most) of `classes`.
fn smallest_lease(classes: &Classes) -> Option<Duration> {
    classes.iter().filter_map(|(_, def)| def.near_cache).min()
}
