//! The layout watcher: the background task that refreshes this instance's live entries,
//! re-reads the records and runs the shrink sweep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::placing::Sighting;
use super::placing::{join_placement, spread_share, Step};
use super::window::{delete_named_copies, scan_copy_names, WindowStep};
use super::{LayoutStores, Layouts, Liveness};
use crate::family::{Families, Family};
use crate::key::Placement;
use crate::metrics::Metrics;
use crate::store::LayoutWriter;
use crate::store::LiveMember;

/// Refreshes this instance's live entries and re-reads the layout records every
/// `liveness.interval`; sweeps shrunk families every `sweep_interval`.
pub struct LayoutWatcher {
    /// Where the records live, and the copies a sweep deletes.
    pub stores: LayoutStores,
    /// The state to update.
    pub layouts: Arc<Layouts>,
    /// The families to watch.
    pub families: Arc<Families>,
    /// Mismatch gauges.
    pub metrics: Arc<Metrics>,
    /// This instance's live entries. Default interval: 5 s.
    pub liveness: Liveness,
    /// How often to sweep a shrunk family. Default: 1 min.
    pub sweep_interval: Duration,
}

impl LayoutWatcher {
    /// Who wrote `family`'s record; `None` when unknown or unreadable (logged).
    pub(super) async fn read_writer(&self, family: &str) -> Option<LayoutWriter> {
        self.stores
            .layouts
            .read_layout_writer(family)
            .await
            .unwrap_or_else(|err| {
                tracing::debug!(family, error = %err, "cannot read the layout record's writer");
                None
            })
    }

    /// Runs until `shutdown`. The live entries are refreshed in a loop of their own, so a long
    /// sweep never delays them. They are not removed at shutdown: they lapse after
    /// [`Liveness::ttl`], after the last request this instance served.
    pub async fn run(self, shutdown: CancellationToken) {
        tokio::join!(self.refresh_loop(&shutdown), self.sweep_loop(&shutdown));
    }

    async fn refresh_loop(&self, shutdown: &CancellationToken) {
        let mut ticker = tokio::time::interval(self.liveness.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => self.refresh().await,
            }
        }
    }

    /// Refreshes this instance's live entries and re-reads the records, once.
    pub(super) async fn refresh(&self) {
        let ttl_ms = crate::duration::millis(self.liveness.ttl());
        for family in self.families.iter() {
            let name = family.name();
            match self
                .stores
                .layouts
                .join_live(name, family.copies, &self.liveness.instance, ttl_ms)
                .await
            {
                Ok(others) => {
                    self.layouts.observe_live(name, &others);
                    self.refresh_placement(family, &others, ttl_ms).await;
                }
                // The last view is kept: it can only make publishes write more copies.
                Err(err) => {
                    tracing::warn!(family = name, error = %err, "cannot refresh this instance's live entry")
                }
            }
            match self.stores.layouts.read_layout(name).await {
                Ok(recorded) => {
                    let writer = self.read_writer(name).await;
                    self.layouts.observe(name, recorded, writer, &self.metrics)
                }
                Err(err) => {
                    tracing::debug!(family = name, error = %err, "cannot read the layout record")
                }
            }
        }
    }

    /// Refreshes this instance's entry in `family`'s placement set, switches its reads as
    /// `placing` says (deleting the tagged copies first when no other instance reads them),
    /// opens or closes the family's compatibility window (`window`), and reports how evenly the
    /// names it reads fall on the live slot map.
    async fn refresh_placement(&self, family: &Family, live: &[LiveMember], ttl_ms: u64) {
        let name = family.name();
        let Some(members) =
            join_placement(&self.stores, &self.layouts, family, &self.liveness, ttl_ms).await
        else {
            return;
        };
        let codes: Vec<u32> = members.iter().map(|member| member.copies).collect();
        let missing = LiveMember::missing_from(live, &members);
        let seen = Sighting {
            missing: &missing,
            codes: &codes,
            at: Instant::now(),
        };
        let settle = self.liveness.settle();
        match self
            .layouts
            .observe_placement(name, seen, settle, &self.metrics)
        {
            Step::Stay => {}
            Step::Switch => self.layouts.start_reading_spread(name, &self.metrics),
            Step::CleanThenSwitch => self.clean_then_switch(family).await,
        }
        match self
            .layouts
            .observe_window(name, seen, settle, &self.metrics)
        {
            WindowStep::Stay => {}
            WindowStep::Close => self.close_window(family).await,
            WindowStep::Sweep => self.sweep_suffix_copies(family).await,
        }
        self.report_spread(family);
    }

    /// Deletes `family`'s tagged copies, then reads them (`placing`, point 2).
    async fn clean_then_switch(&self, family: &Family) {
        let name = family.name();
        match delete_named_copies(&self.stores, &self.families, family, Placement::Spread).await {
            Ok((deleted, true)) => {
                tracing::info!(
                    family = name,
                    deleted,
                    "deleted the tagged copies that may have missed edits"
                );
                self.layouts.start_reading_spread(name, &self.metrics);
            }
            Ok((deleted, false)) => tracing::warn!(
                family = name,
                deleted,
                "the family has more keys than one scan of tagged copies covers: reading K#i still; retried at the next refresh"
            ),
            Err(err) => tracing::warn!(
                family = name,
                error = %err,
                "cannot delete the family's tagged copies: reading K#i still; retried at the next refresh"
            ),
        }
    }

    /// Closes `family`'s compatibility window when one scan covers its copy names (so the
    /// sweep of `K#i` can see every key); otherwise it stays open, and the scan is tried again
    /// after a sweep interval.
    async fn close_window(&self, family: &Family) {
        let name = family.name();
        let now = Instant::now();
        if self
            .layouts
            .window_scan_refused(name, now, self.sweep_interval, None)
        {
            return;
        }
        match scan_copy_names(&self.stores, family).await {
            Ok((_, true)) => {
                self.layouts
                    .window_scan_refused(name, now, self.sweep_interval, Some(false));
                self.layouts
                    .close_window(name, Instant::now(), &self.metrics);
            }
            Ok((_, false)) => {
                self.layouts
                    .window_scan_refused(name, now, self.sweep_interval, Some(true));
                tracing::warn!(
                    family = name,
                    "the family has more copies than one scan covers: publishes keep writing K#i (the compatibility window stays open)"
                );
            }
            Err(err) => tracing::warn!(
                family = name,
                error = %err,
                "cannot scan the family's copies: the compatibility window stays open; retried at the next refresh"
            ),
        }
    }

    /// Deletes `family`'s `K#i` copies, which its publishes no longer write.
    async fn sweep_suffix_copies(&self, family: &Family) {
        let name = family.name();
        match delete_named_copies(&self.stores, &self.families, family, Placement::Suffix).await {
            Ok((deleted, true)) => {
                self.layouts.mark_swept(name);
                tracing::info!(
                    family = name,
                    deleted,
                    "deleted the K#i copies no live instance reads or writes"
                );
            }
            Ok((deleted, false)) => tracing::warn!(
                family = name,
                deleted,
                "the family has more copies than one scan covers: K#i copies remain; retried at the next refresh"
            ),
            Err(err) => tracing::warn!(
                family = name,
                error = %err,
                "cannot delete the family's K#i copies: retried at the next refresh"
            ),
        }
    }

    /// Sets the placement gauge of `family` and logs how far from even its copies are when
    /// that changed since the last report.
    fn report_spread(&self, family: &Family) {
        let placement = self
            .layouts
            .read_placement(family.name())
            .unwrap_or(family.placement);
        let Some((share, even)) = spread_share(&self.stores, family, placement) else {
            return;
        };
        self.metrics.placement_busiest_share(family.name(), share);
        if self.layouts.report_share(family.name(), share) {
            tracing::info!(
                family = family.name(),
                placement = placement.as_str(),
                copies = family.copies,
                busiest_share = share,
                even_share = even,
                "copy placement on the live slot map: the busiest node holds this share of a key's copies (worst over a sample of keys)"
            );
        }
    }

    async fn sweep_loop(&self, shutdown: &CancellationToken) {
        let mut ticker = tokio::time::interval(self.sweep_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    for family in self.families.iter() {
                        let sweep = tokio::select! {
                            () = shutdown.cancelled() => return,
                            sweep = self.sweep(family, Instant::now()) => sweep,
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
