//! The startup reconcile: joining every family's live set, recording this instance's
//! layout, and deleting the copies a grow makes this instance read that may have missed edits.

use std::sync::Arc;
use std::time::Instant;

use super::placing;
use super::placing::Sighting;
use super::record::record_configured;
use super::sweep::delete_copies_from;
use super::window::refill_suffix_copies;
use super::{Known, LayoutStores, Layouts, Liveness};
use crate::error::Result;
use crate::family::{Families, Family};
use crate::metrics::Metrics;
use crate::store::Layout;
use crate::store::LiveMember;

/// Copies `from..to` of a family may hold versions that missed edits and are deleted before
/// this instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Strays {
    /// The first copy index that may be stray.
    pub(super) from: u32,
    /// One past the last.
    pub(super) to: u32,
    /// Whether a live instance may still be writing fewer copies: wait for it to see this one.
    pub(super) settle: bool,
}

/// The copies a grow makes this instance read that may have missed edits, or `None`.
///
/// `live` is the largest copy count of the other live instances when this one joined, and
/// `recorded` the record before this instance wrote it. Copies below every live instance's
/// count are kept current by the writers (each writes up to the largest live count); with no
/// instance live, nobody writes, and copies below the last recorded count are current, while
/// copies at or beyond the record's `max_copies` do not exist.
pub(super) fn strays(
    configured: u32,
    live: Option<u32>,
    recorded: Option<Layout>,
) -> Option<Strays> {
    let (from, to, settle) = match (live, recorded) {
        (Some(live), _) => (live, configured, true),
        (None, Some(recorded)) => (
            recorded.copies,
            configured.min(recorded.max_copies.max(recorded.copies)),
            false,
        ),
        (None, None) => return None,
    };
    (from < to).then_some(Strays { from, to, settle })
}

impl Layouts {
    /// layout, and logs a resize. A family this instance grows past what the live instances
    /// write is settled first: after [`Liveness::settle`], the copies in the grown range are
    /// deleted (read repair refills them from their newest sibling).
    ///
    /// # Errors
    /// Store errors reading or writing a record or a live set, or deleting grown copies.
    pub async fn reconcile(
        stores: &LayoutStores,
        families: &Families,
        metrics: &Metrics,
        liveness: &Liveness,
    ) -> Result<Arc<Layouts>> {
        let layouts = Layouts {
            reading: placing::Reading::of(families),
            ..Layouts::default()
        };
        let mut grown = Vec::new();
        // Families this instance reads under `K#i` although another live instance reads the
        // tagged names: their window may be closed, so `K#i` is refilled before serving.
        let mut refills = Vec::new();
        let ttl_ms = crate::duration::millis(liveness.ttl());
        for family in families.iter() {
            let name = family.name();
            // Join first: an instance that reads the live set after this call writes this
            // instance's copies; one that read it before is waited for below.
            let members = join_family(stores, family, liveness, ttl_ms).await;
            let others: Vec<u32> = members.iter().map(|member| member.copies).collect();
            let live = others.iter().copied().max();
            // The placement set is joined before this instance serves too, with code 1 or 2
            // (it reads `K#i` until `placing` says otherwise), so every writer that reads the
            // set after this call writes the names it may come to read.
            let placement_codes =
                placing::join_placement(stores, &layouts, family, liveness, ttl_ms).await;
            let recorded = stores.layouts.read_layout(name).await?;
            let (max_copies, writer) = record_configured(stores, family, liveness).await?;
            // Another running instance on another copy count: reported here too, not only by
            // the instance whose record this one replaced.
            let reported = others.iter().any(|&copies| copies != family.copies);
            if reported {
                tracing::warn!(
                    family = name,
                    configured = family.copies,
                    live_copies = ?others,
                    "layout mismatch between running instances: other live instances run another copy count (a rolling resize, or two configs disagreeing)"
                );
            }
            metrics.layout_mismatch(name, reported);
            layouts.lock().insert(
                name.to_owned(),
                Known {
                    configured: family.copies,
                    max_copies,
                    mismatch: false,
                    reported,
                    recorded: Some(Layout {
                        copies: family.copies,
                        max_copies,
                    }),
                    writer,
                    live_others: others.clone(),
                    live_members: members.clone(),
                    live_copies: live.unwrap_or(0),
                    live_changed: Instant::now(),
                    placing: placing::Placing::joined(family.placement, Instant::now()),
                },
            );
            metrics.placement_reads_spread(name, false);
            metrics.placement_window_closed(name, false);
            let placement = StartupPlacement {
                stores,
                liveness,
                metrics,
                ttl_ms,
            };
            if placement
                .observe(&layouts, family, &members, placement_codes)
                .await
            {
                refills.push(family);
            }
            if let Some(strays) = strays(family.copies, live, recorded) {
                grown.push((family, strays));
            }
        }
        if grown.iter().any(|(_, strays)| strays.settle) || !refills.is_empty() {
            let settle = liveness.settle();
            tracing::info!(
                families = ?grown.iter().map(|(family, _)| family.name()).collect::<Vec<_>>(),
                refills = ?refills.iter().map(|family| family.name()).collect::<Vec<_>>(),
                ?settle,
                "growing past the live instances, or reading K#i beside readers of the tagged names: waiting until every writer writes the copies this instance reads"
            );
            tokio::time::sleep(settle).await;
        }
        for family in refills {
            refill_before_serving(stores, families, family).await?;
        }
        for (family, strays) in grown {
            let (deleted, complete) = delete_copies_from(
                stores,
                families,
                layouts.splits(),
                family,
                (strays.from, Some(strays.to)),
            )
            .await?;
            tracing::info!(
                family = family.name(),
                from = strays.from,
                to = strays.to,
                deleted,
                complete,
                "deleted the grown copies that may have missed edits"
            );
        }
        Ok(Arc::new(layouts))
    }
}

/// What the startup placement step needs of the store and this instance.
struct StartupPlacement<'a> {
    /// The live sets and the copies.
    stores: &'a LayoutStores,
    /// This instance in the live sets.
    liveness: &'a Liveness,
    /// The placement gauges.
    metrics: &'a Metrics,
    /// How long a live entry lasts.
    ttl_ms: u64,
}

impl StartupPlacement<'_> {
    /// Reads `family` under the tagged names from the first request when another live
    /// instance already reads them (`placing`, point 2), re-joining the placement set with
    /// code 3 at once, so no writer takes this instance's startup code 2 for a reader of
    /// `K#i` and reopens the family's window. Returns whether this instance reads `K#i` while
    /// another live instance reads the tagged names: then that family's window may be closed
    /// (`window`), and its `K#i` is refilled before this instance serves.
    async fn observe(
        &self,
        layouts: &Layouts,
        family: &Family,
        members: &[LiveMember],
        placed: Option<Vec<LiveMember>>,
    ) -> bool {
        let name = family.name();
        let Some(placed) = placed else {
            return false;
        };
        let codes: Vec<u32> = placed.iter().map(|member| member.copies).collect();
        let step = layouts.observe_placement(
            name,
            Sighting {
                missing: &LiveMember::missing_from(members, &placed),
                codes: &codes,
                at: Instant::now(),
            },
            self.liveness.settle(),
            self.metrics,
        );
        if step == placing::Step::Switch {
            layouts.start_reading_spread(name, self.metrics);
            placing::join_placement(self.stores, layouts, family, self.liveness, self.ttl_ms).await;
            return false;
        }
        family.copies >= 2
            && layouts.read_placement(name) != Some(crate::key::Placement::Spread)
            && codes.contains(&placing::CODE_SPREAD_READING)
    }
}

/// Refills `family`'s `K#i` from its newest copies before this instance serves it: the
/// writers have seen this instance (the settle time has passed), so they write `K#i` again,
/// and any `K#i` their closed window left behind is brought up to date (`window`).
///
/// # Errors
/// Store errors of the refill: a reader of `K#i` must not serve copies that missed edits.
async fn refill_before_serving(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
) -> Result<()> {
    let (refilled, complete) = refill_suffix_copies(stores, families, family).await?;
    if complete {
        tracing::info!(
            family = family.name(),
            refilled,
            "refilled K#i from the tagged copies before reading K#i"
        );
    } else {
        tracing::warn!(
            family = family.name(),
            refilled,
            "the family has more keys than one scan covers: K#i refilled for the first of them only; reads of the others may fall back to copy 0"
        );
    }
    Ok(())
}

/// Joins `family`'s live set and returns its members. A join that fails (the store refuses
/// FCALL) does not stop startup: publishes fail the same way then, and the watcher retries the
/// join every interval.
async fn join_family(
    stores: &LayoutStores,
    family: &crate::family::Family,
    liveness: &Liveness,
    ttl_ms: u64,
) -> Vec<LiveMember> {
    let name = family.name();
    match stores
        .layouts
        .join_live(name, family.copies, &liveness.instance, ttl_ms)
        .await
    {
        Ok(members) => members,
        Err(err) => {
            tracing::warn!(family = name, error = %err, "cannot join the family's live set: retried every layout interval");
            Vec::new()
        }
    }
}
