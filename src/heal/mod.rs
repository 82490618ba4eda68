//! Healing: copies whose write failed, or that a read found behind their siblings, are brought
//! forward without ever moving a copy backwards.
//!
//! - [`queue`]: the retry queue: one pending entry per copy (the highest version), grouped per
//!   node, bounded by entries and bytes, mirrored to the spool.
//! - [`spool`]: the durable, group-committed append-only file behind the queue (the only user
//!   of bincode), replayed at startup.
//! - [`worker`]: the background task that probes failing nodes with backoff and flushes their
//!   entries through the same compare-and-set as a publish.
//! - [`health`]: which nodes are failing (fed by store timeouts, cleared by probes once their
//!   queued entries are flushed), read by the publisher and the reader through [`HealthStore`];
//!   pending retry versions as read floors.
//! - [`drain`]: `hotsplit spool drain DIR`, the replay of a dead instance's spool into the
//!   store.
//! - [`repair`]: read repair of a stale or missing affine copy, off the request path.
//! - [`scrub`]: anti-entropy: a background walk over the split families' keys that repairs
//!   copies missing or behind a sibling (one instance at a time, through a lease).
//! - [`jitter`]: per-copy expiry jitter, so the copies of a hot key do not expire together.

pub mod config;
pub mod drain;
pub mod health;
pub mod queue;
pub mod repair;
pub mod scrub;
pub mod spool;
pub mod worker;

pub use config::HealConfig;
pub use drain::{drain_spool, DrainProgress, DrainSummary};
pub use health::{HealthProber, HealthStore, NodeHealth, StoreProbe};
pub use queue::{Admission, DropReason, FailedCopy, RetryQueue, RetryQueueView};
pub use repair::Repairer;
pub use scrub::{ScrubConfig, ScrubStatus, Scrubber};
pub use worker::RetryWorker;

/// The healing state the HTTP layer shows: the retry queue, the recorded layouts and the
/// scrub.
#[derive(Debug, Clone)]
pub struct HealHandles {
    /// The retry queue, for `GET /v1/retry-queue` and its gauges.
    pub retry_queue: std::sync::Arc<RetryQueue>,
    /// Recorded family layouts, for the mismatches `/readyz` lists.
    pub layouts: std::sync::Arc<crate::layout::Layouts>,
    /// The scrub's figures, for `GET /v1/scrub`.
    pub scrub: std::sync::Arc<ScrubStatus>,
}

/// Per-copy expiry jitter.
pub mod jitter {
    use rand::Rng;

    /// The expiry of one value copy: `now + ttl × (1 + j)` with `j` uniform in `min..=max`
    /// (both in `-0.5..=0`, so no copy outlives the family TTL).
    pub fn expire_at_ms(now_ms: u64, ttl_ms: u64, min: f64, max: f64) -> u64 {
        let fraction = if max > min {
            rand::rng().random_range(min..=max)
        } else {
            min
        };
        let lifetime = (ttl_ms as f64 * (1.0 + fraction)).round().max(1.0);
        // A lifetime above 2^53 ms (285,000 years) loses precision harmlessly.
        now_ms.saturating_add(lifetime as u64)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn jitter_stays_within_the_ttl() {
            for _ in 0..1000 {
                let at = super::expire_at_ms(1_000, 10_000, -0.1, 0.0);
                assert!((10_000..=11_000).contains(&at), "{at}");
            }
            assert_eq!(super::expire_at_ms(0, 10_000, 0.0, 0.0), 10_000);
        }
    }
}
