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
//! Copies removed by a shrink are deleted twice over, so a later growth cannot serve a copy that
//! missed the edits made while the family was smaller: a publish deletes copies
//! `copies..max_copies` of its key at once, and the watcher's sweep (every
//! `heal.sweep_interval`, while no mismatch is seen) scans the family's keys and deletes every
//! copy at or beyond `copies`. A sweep that finds nothing left to delete lowers the record's
//! `max_copies` to `copies`, which ends both.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::family::{Families, Family};
use crate::key::{CopyKey, Key, COPY_SEPARATOR};
use crate::metrics::Metrics;
use crate::store::{Layout, LayoutSwap, Store};

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
            let max_copies = record_configured(store, family).await?;
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

/// How often [`record_configured`] retries its compare-and-set after another instance changed
/// the record in between.
const RECORD_ATTEMPTS: u32 = 8;

/// Records `family`'s configured copy count with a compare-and-set, keeping the largest copy
/// count ever recorded (never lowering `max_copies`, whatever another instance wrote meanwhile).
/// Returns the recorded `max_copies`.
async fn record_configured(store: &dyn Store, family: &Family) -> Result<u32> {
    let name = family.name();
    let mut recorded = store.read_layout(name).await?;
    for _ in 0..RECORD_ATTEMPTS {
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
        if recorded == Some(layout) {
            return Ok(max_copies);
        }
        match store.write_layout(name, recorded, layout).await? {
            LayoutSwap::Applied => return Ok(max_copies),
            // Another instance changed the record in between: decide again from what it wrote.
            LayoutSwap::Changed(current) => recorded = current,
        }
    }
    Err(crate::error::Error::new(
        crate::error::ErrorKind::Unavailable,
        format!("the layout record of family {name:?} kept changing: {RECORD_ATTEMPTS} compare-and-set attempts failed"),
    ))
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
    /// How often to sweep a shrunk family. Default: 1 min.
    pub sweep_interval: Duration,
}

/// The most keys one sweep of a family looks at.
const SWEEP_SCAN_LIMIT: usize = 100_000;

/// Escapes Redis glob metacharacters.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl LayoutWatcher {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval.min(self.sweep_interval));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut last_read = tokio::time::Instant::now();
        let mut last_sweep = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    if last_read.elapsed() >= self.interval {
                        last_read = tokio::time::Instant::now();
                        for family in self.families.iter() {
                            match self.store.read_layout(family.name()).await {
                                Ok(recorded) => self.layouts.observe(family.name(), recorded, &self.metrics),
                                Err(err) => tracing::debug!(family = family.name(), error = %err, "cannot read the layout record"),
                            }
                        }
                    }
                    if last_sweep.elapsed() >= self.sweep_interval {
                        last_sweep = tokio::time::Instant::now();
                        for family in self.families.iter() {
                            let sweep = tokio::select! {
                                () = shutdown.cancelled() => return,
                                sweep = self.sweep(family) => sweep,
                            };
                            if let Err(err) = sweep {
                                tracing::warn!(family = family.name(), error = %err, "sweep of removed copies failed");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Deletes the copies a shrink removed from `family`'s keys; lowers the record once none
    /// is left.
    async fn sweep(&self, family: &Family) -> Result<()> {
        let name = family.name();
        let (max_copies, mismatch) = {
            let known = self.layouts.lock();
            match known.get(name) {
                Some(known) => (known.max_copies, known.mismatch),
                None => return Ok(()),
            }
        };
        if max_copies <= family.copies || mismatch {
            return Ok(());
        }
        let pattern = format!("{}*#*", glob_escape(&family.prefix));
        let keys = self.store.scan_keys(&pattern, SWEEP_SCAN_LIMIT).await?;
        let complete = keys.len() < SWEEP_SCAN_LIMIT;
        let removed: Vec<CopyKey> = keys
            .iter()
            .filter_map(|stored| {
                let (base, index) = stored.rsplit_once(COPY_SEPARATOR)?;
                let index: u32 = index.parse().ok()?;
                let key = Key::parse(base).ok()?;
                let ours = self.families.resolve(&key).name() == name;
                (ours && index >= family.copies && key.copy_key(index).as_str() == stored)
                    .then(|| key.copy_key(index))
            })
            .collect();
        let mut deleted = 0;
        for batch in removed.chunks(256) {
            deleted += self.store.delete_copies(batch).await?;
        }
        if deleted > 0 {
            tracing::info!(family = name, deleted, "swept copies removed by a shrink");
        } else if complete {
            // Lowered only from the record this instance expects: a record another instance
            // changed meanwhile (a larger layout rolled out again) is kept.
            let expected = Layout {
                copies: family.copies,
                max_copies,
            };
            let layout = Layout {
                copies: family.copies,
                max_copies: family.copies,
            };
            match self
                .store
                .write_layout(name, Some(expected), layout)
                .await?
            {
                LayoutSwap::Applied => {
                    if let Some(known) = self.layouts.lock().get_mut(name) {
                        known.max_copies = family.copies;
                    }
                    tracing::info!(
                        family = name,
                        copies = family.copies,
                        "no removed copies left: the shrink is complete"
                    );
                }
                LayoutSwap::Changed(current) => {
                    tracing::info!(family = name, recorded = ?current, "the layout record changed during the sweep: kept");
                    self.layouts.observe(name, current, &self.metrics);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn the_sweep_deletes_removed_copies_of_its_family_only() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let text = |copies| {
            format!("[[family]]\nprefix = \"p*\"\ncopies = {copies}\n[[family]]\nprefix = \"p*x\"\ncopies = 8")
        };
        let twelve = Config::from_toml(&text(12)).unwrap().families();
        let four = Arc::new(Config::from_toml(&text(4)).unwrap().families());
        let publisher = crate::publish::Publisher::new(
            store.clone(),
            Arc::new(twelve.clone()),
            metrics.clone(),
        );
        Layouts::reconcile(&*store, &twelve, &metrics)
            .await
            .unwrap();
        for key in ["p*1", "p*x1"] {
            publisher
                .publish(
                    &Key::parse(key).unwrap(),
                    crate::publish::VersionChoice::Given(crate::key::Version::new(1).unwrap()),
                    bytes::Bytes::new(),
                )
                .await
                .unwrap();
        }
        let layouts = Layouts::reconcile(&*store, &four, &metrics).await.unwrap();
        let watcher = LayoutWatcher {
            store: store.clone(),
            layouts: layouts.clone(),
            families: four.clone(),
            metrics,
            interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(1),
        };
        let family = four.resolve(&Key::parse("p*1").unwrap()).clone();
        watcher.sweep(&family).await.unwrap();
        // p*1 keeps copies 0..4; p*x1 (another family, 8 copies) keeps all of its copies.
        assert_eq!(store.len(), 4 + 8);
        assert_eq!(layouts.max_copies("p*", 4), 12);
        watcher.sweep(&family).await.unwrap();
        assert_eq!(layouts.max_copies("p*", 4), 4);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[tokio::test]
    async fn a_resize_is_recorded_and_a_mismatch_seen() {
        let store = MemoryStore::new();
        let metrics = Metrics::new();
        let eight = Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 8")
            .unwrap()
            .families();
        let four = Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 4")
            .unwrap()
            .families();
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
