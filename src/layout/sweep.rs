//! The shrink sweep: deleting the copies a shrink removed (and the grown range at startup),
//! and lowering the record once none is left.

use std::time::Instant;

use super::record::record_writer;
use super::watcher::LayoutWatcher;
use super::{glob_escape, LayoutStores};
use crate::error::Result;
use crate::family::{Families, Family};
use crate::key::CopyKey;
use crate::store::{Layout, LayoutSwap};

/// The most keys one sweep of a family looks at.
const SWEEP_SCAN_LIMIT: usize = 100_000;

/// Deletes every stored copy of `family`'s keys with an index in `from..to` (`to: None`: no
/// upper bound), except the copies of keys `splits` knows as split (their copies of their own
/// are `crate::split`'s to delete). Returns how many existed, and whether the scan saw every key.
pub(super) async fn delete_copies_from(
    stores: &LayoutStores,
    families: &Families,
    splits: &crate::split::SplitIndex,
    family: &Family,
    (from, to): (u32, Option<u32>),
) -> Result<(u64, bool)> {
    let name = family.name();
    let pattern = format!("{}*#*", glob_escape(&family.prefix));
    let keys = stores.layouts.scan_keys(&pattern, SWEEP_SCAN_LIMIT).await?;
    let complete = keys.len() < SWEEP_SCAN_LIMIT;
    let removed: Vec<CopyKey> = keys
        .iter()
        .filter_map(|stored| {
            let (key, copy_key) = CopyKey::parse(stored)?;
            let index = copy_key.index();
            let ours = families.resolve(&key).name() == name
                && splits.record(name, key.as_str()).is_none();
            let in_range = index >= from && to.is_none_or(|to| index < to);
            (ours && in_range).then_some(copy_key)
        })
        .collect();
    let mut deleted = 0;
    for batch in removed.chunks(256) {
        deleted += stores.copies.delete_copies(batch).await?;
    }
    Ok((deleted, complete))
}

impl LayoutWatcher {
    /// Deletes the copies a shrink removed from `family`'s keys; lowers the record once none
    /// is left. Does nothing while another live instance has more copies: its readers read
    /// them, and every writer keeps them current. Nor until [`Liveness::settle`] has passed
    /// (at `now`) since the largest live count last changed: a publish that read the larger
    /// count may still be writing copies beyond this instance's count, here or on an instance
    /// that has not refreshed yet, and a copy landing after the last sweep would outlive the
    /// shrink.
    pub(super) async fn sweep(&self, family: &Family, now: Instant) -> Result<()> {
        let name = family.name();
        let (max_copies, mismatch, live_copies, live_changed) = {
            let known = self.layouts.lock();
            match known.get(name) {
                Some(known) => (
                    known.max_copies,
                    known.mismatch,
                    known.live_copies,
                    known.live_changed,
                ),
                None => return Ok(()),
            }
        };
        if max_copies <= family.copies || mismatch {
            return Ok(());
        }
        if live_copies > family.copies {
            tracing::debug!(
                family = name,
                live_copies,
                "sweep skipped: a live instance reads more copies"
            );
            return Ok(());
        }
        if now.saturating_duration_since(live_changed) < self.liveness.settle() {
            tracing::debug!(
                family = name,
                "sweep deferred: publishes that read a larger live copy count may still be writing"
            );
            return Ok(());
        }
        let (deleted, complete) = delete_copies_from(
            &self.stores,
            &self.families,
            self.layouts.splits(),
            family,
            (family.copies, None),
        )
        .await?;
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
                .stores
                .layouts
                .write_layout(name, Some(expected), layout)
                .await?
            {
                LayoutSwap::Applied => {
                    let writer =
                        record_writer(&*self.stores.layouts, name, &self.liveness, family.copies)
                            .await;
                    if let Some(known) = self.layouts.lock().get_mut(name) {
                        known.max_copies = family.copies;
                        known.recorded = Some(layout);
                        known.writer = writer;
                    }
                    tracing::info!(
                        family = name,
                        copies = family.copies,
                        "no removed copies left: the shrink is complete"
                    );
                }
                LayoutSwap::Changed(current) => {
                    tracing::info!(family = name, recorded = ?current, "the layout record changed during the sweep: kept");
                    let writer = self.read_writer(name).await;
                    self.layouts.observe(name, current, writer, &self.metrics);
                }
            }
        }
        Ok(())
    }
}
