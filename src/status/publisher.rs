//! [`StatusPublisher`]: the background task that stores this instance's figures for the other
//! instances' status pages, every `fleet.heartbeat_interval`, living as long as a registry
//! entry (three intervals), so a stopped instance's figures lapse with its entry.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Sources;
use crate::store::FleetStore;

/// Publishes this instance's [`super::InstanceStatus`] into the store on a timer.
pub struct StatusPublisher {
    /// Where the figures come from.
    pub sources: Arc<Sources>,
    /// Where they are stored (`FleetStore::publish_status`).
    pub store: Arc<dyn FleetStore>,
    /// This instance's registry id.
    pub id: String,
    /// How often (`fleet.heartbeat_interval`).
    pub interval: Duration,
    /// How long a stored sample lives (`FleetConfig::entry_ttl`).
    pub ttl: Duration,
}

impl StatusPublisher {
    /// Publishes at once, then every interval until `shutdown`. A failed write is logged once
    /// per run of failures and retried at the next tick; it never stops the service.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ttl_ms = crate::duration::millis(self.ttl);
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {
                    let summary = match serde_json::to_string(&self.sources.sample()) {
                        Ok(summary) => summary,
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot encode this instance's status figures");
                            continue;
                        }
                    };
                    match self.store.publish_status(&self.id, &summary, ttl_ms).await {
                        Ok(()) => {
                            if failing {
                                tracing::info!("status figures published again");
                            }
                            failing = false;
                        }
                        Err(err) => {
                            if !failing {
                                tracing::warn!(error = %err, "could not publish this instance's status figures; the other instances' status pages show it without them until a write succeeds");
                            }
                            failing = true;
                        }
                    }
                }
            }
        }
    }
}
