//! The route subsystem's config: `[route]` (lag monitor, pins) and `[classes.<name>]` tables.
//!
//! [`ClassConfig`] is what a config file says about a class; [`super::Classes`] turns it, over
//! the built-ins, into the table reads are routed by.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Where a read class sends reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteTarget {
    /// A replica of the node that owns the copy, within the class's staleness budget.
    Replica,
    /// The primary that owns the copy.
    Primary,
}

/// What a replica-routed read does when the replica is over the class's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBreach {
    /// The primary serves (reason `lag-breach`).
    Primary,
    /// The read fails with 503 `staleness_budget_exceeded`.
    Fail,
}

/// One read class (`[classes.<name>]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// `replica` or `primary`. Required.
    pub route: RouteTarget,
    /// One line: why reads of this class may, or may not, be stale. Required, non-empty.
    pub reason: String,
    /// For `replica` routes: the largest replica lag a read accepts. Required for `replica`
    /// routes, refused for `primary` ones.
    #[serde(default, with = "crate::duration::option")]
    pub staleness_budget: Option<Duration>,
    /// For `replica` routes: what happens over budget. Default: `primary`.
    #[serde(default)]
    pub on_breach: Option<OnBreach>,
    /// The largest age bound (the source's lag at fill + the entry's age) at which a read of
    /// this class may be answered from the instance's near cache (`[near_cache]`); `"0s"` turns
    /// the near cache off for the class. Never above `staleness_budget`; refused for `primary`
    /// routes (they read the primary: nothing may be older). Default: half the budget for
    /// `advisory` and `re-derivable`, off for every other class.
    #[serde(default, with = "crate::duration::option")]
    pub near_cache_max_age: Option<Duration>,
}

/// Routing: the lag monitor and read-your-writes pins.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// How often each instance writes its heartbeat on every primary and reads it back on every
    /// replica. A replica's current lag counts all the time since its last read, so a healthy
    /// replica looks up to one interval behind: keep it well under the smallest replica budget
    /// and near-cache max age. Default: `100ms`.
    #[serde(with = "crate::duration")]
    pub heartbeat_interval: Duration,
    /// The sliding window of lag samples reported per replica. Default: `60s`.
    #[serde(with = "crate::duration")]
    pub lag_window: Duration,
    /// How long a request id that wrote pins later reads carrying it to primaries. Default: `5s`.
    #[serde(with = "crate::duration")]
    pub request_pin_window: Duration,
    /// The most (client, key) floors (written and seen) held in memory, and the most request
    /// pins. When the floors are full, expired ones go first, then the least recently used floor
    /// of the client holding the most (of the latest arrival among equals). Client and request
    /// ids are held as 128-bit hashes, so a floor takes about 1 KiB whatever the id's length.
    /// Default: 100000.
    pub max_pins: usize,
    /// The most floors one client id holds; a new one beyond that replaces that client's least
    /// recently used floor. Default: 1024.
    pub max_floors_per_client: usize,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            heartbeat_interval: Duration::from_millis(100),
            lag_window: Duration::from_secs(60),
            request_pin_window: Duration::from_secs(5),
            max_pins: 100_000,
            max_floors_per_client: 1024,
        }
    }
}

impl RouteConfig {
    /// Checks every `route.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, why: &str| {
            Err(Error::new(
                ErrorKind::Config,
                format!("route.{field}: {why}"),
            ))
        };
        if self.heartbeat_interval < Duration::from_millis(1) {
            return invalid("heartbeat_interval", "must be at least 1ms");
        }
        if self.lag_window < self.heartbeat_interval {
            return invalid("lag_window", "must be at least route.heartbeat_interval");
        }
        if self.request_pin_window.is_zero() {
            return invalid("request_pin_window", "must be positive");
        }
        if self.max_pins == 0 {
            return invalid("max_pins", "must be positive");
        }
        if self.max_floors_per_client == 0 {
            return invalid("max_floors_per_client", "must be positive");
        }
        Ok(())
    }
}
