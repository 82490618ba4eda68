//! Family layouts: each family's copy count is recorded in the store, so instances can tell
//! when their config disagrees, and copies removed by shrinking a family are deleted.
//!
//! At startup [`Layouts::reconcile`] reads every family's record. A missing record is written;
//! a record with another copy count is logged (WARN) and replaced by this instance's, which is
//! taken to be the new layout being rolled out; the record keeps the largest copy count ever
//! recorded (`max_copies`). [`LayoutWatcher`] re-reads the records periodically; a record that
//! differs from this instance's config is a *mismatch* (another instance runs another layout),
//! shown in `/readyz` and as `hotsplit_layout_mismatch{family}`.
//!
//! The sweep of removed copies is done per key, on publish: when `max_copies` exceeds the
//! configured count, a publish also deletes copies `copies..max_copies` of its key, so a later
//! growth cannot serve a copy that missed the edits made while the family was smaller. Keys
//! not published since the shrink keep their removed copies at their last version (no older
//! than the live copies), until they expire.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Families;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::store::{Layout, Store};

/// What this instance knows of one family's layout.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// The configured copy count.
    configured: u32,
    /// The largest copy count recorded; copies at or above `configured` may exist.
    max_copies: u32,
    /// Whether the last read record disagreed with `configured`.
    mismatch: bool,
}

/// Every family's layout, shared by the publisher, `/readyz` and the watcher.
#[derive(Debug, Default)]
pub struct Layouts {
    /// Family name → what is known.
    families: Mutex<BTreeMap<String, Known>>,
}

impl Layouts {
    /// Layouts that know nothing recorded (every family at its configured count).
    pub fn unrecorded() -> Arc<Layouts> {
        Arc::new(Layouts::default())
    }

    /// Reads every family's record, writes this instance's layout, and logs a resize.
    ///
    /// # Errors
    /// Store errors reading or writing a record.
    pub async fn reconcile(
        store: &dyn Store,
        families: &Families,
        metrics: &Metrics,
    ) -> Result<Arc<Layouts>> {
        let layouts = Layouts::default();
        for family in families.iter() {
            let name = family.name();
            let recorded = store.read_layout(name).await?;
            let max_copies = recorded.map_or(family.copies, |layout| {
                layout.max_copies.max(layout.copies).max(family.copies)
            });
            if let Some(recorded) = recorded {
                if recorded.copies != family.copies {
                    tracing::warn!(
                        family = name,
                        configured = family.copies,
                        recorded = recorded.copies,
                        max_copies,
                        "family layout changed: recording the configured copy count"
                    );
                }
            }
            let layout = Layout {
                copies: family.copies,
                max_copies,
            };
            if recorded != Some(layout) {
                store.write_layout(name, layout).await?;
            }
            metrics.layout_mismatch(name, false);
            layouts.lock().insert(
                name.to_owned(),
                Known {
                    configured: family.copies,
                    max_copies,
                    mismatch: false,
                },
            );
        }
        Ok(Arc::new(layouts))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Known>> {
        self.families.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The largest copy count recorded for `family`, at least `configured`.
    pub fn max_copies(&self, family: &str, configured: u32) -> u32 {
        self.lock()
            .get(family)
            .map_or(configured, |known| known.max_copies.max(configured))
    }

    /// Families whose recorded layout disagrees with this instance's config.
    pub fn mismatches(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, known)| known.mismatch)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn observe(&self, family: &str, recorded: Option<Layout>, metrics: &Metrics) {
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return;
        };
        let mismatch = recorded.is_some_and(|layout| layout.copies != known.configured);
        if mismatch != known.mismatch {
            if mismatch {
                tracing::warn!(family, configured = known.configured, recorded = ?recorded.map(|layout| layout.copies), "layout mismatch: another instance recorded a different copy count");
            } else {
                tracing::info!(family, "layout mismatch resolved");
            }
        }
        known.mismatch = mismatch;
        if let Some(layout) = recorded {
            known.max_copies = known.max_copies.max(layout.max_copies);
        }
        metrics.layout_mismatch(family, mismatch);
    }
}

/// Re-reads the layout records every `interval` and updates the mismatch state.
pub struct LayoutWatcher {
    /// Where the records live.
    pub store: Arc<dyn Store>,
    /// The state to update.
    pub layouts: Arc<Layouts>,
    /// The families to watch.
    pub families: Arc<Families>,
    /// Mismatch gauges.
    pub metrics: Arc<Metrics>,
    /// How often to read. Default: 5 s.
    pub interval: Duration,
}

impl LayoutWatcher {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    for family in self.families.iter() {
                        match self.store.read_layout(family.name()).await {
                            Ok(recorded) => self.layouts.observe(family.name(), recorded, &self.metrics),
                            Err(err) => tracing::debug!(family = family.name(), error = %err, "cannot read the layout record"),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn a_resize_is_recorded_and_a_mismatch_seen() {
        let store = MemoryStore::new();
        let metrics = Metrics::new();
        let eight = Families::from_config(
            &Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 8").unwrap(),
        );
        let four = Families::from_config(
            &Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 4").unwrap(),
        );
        let first = Layouts::reconcile(&store, &eight, &metrics).await.unwrap();
        assert_eq!(first.max_copies("p:", 8), 8);
        let second = Layouts::reconcile(&store, &four, &metrics).await.unwrap();
        assert_eq!(second.max_copies("p:", 4), 8);
        assert_eq!(
            store.read_layout("p:").await.unwrap(),
            Some(Layout {
                copies: 4,
                max_copies: 8
            })
        );
        // The first instance still runs 8 copies: it now sees a mismatch.
        first.observe("p:", store.read_layout("p:").await.unwrap(), &metrics);
        assert_eq!(first.mismatches(), vec!["p:".to_owned()]);
        assert!(second.mismatches().is_empty());
        assert!(metrics
            .render()
            .contains(r#"hotsplit_layout_mismatch{family="p:"} 1"#));
    }
}
