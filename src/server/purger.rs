//! The embedded store's purger: drops expired copies every second.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::memory::MemoryStore;

/// Drops expired copies from the embedded store periodically.
pub(super) struct Purger {
    /// The store to purge.
    pub(super) store: Arc<MemoryStore>,
    /// How often to purge.
    pub(super) interval: Duration,
}

impl Purger {
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    let removed = self.store.purge_expired();
                    if removed > 0 {
                        tracing::debug!(removed, "purged expired copies");
                    }
                }
            }
        }
    }
}
