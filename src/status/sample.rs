//! One instance's own figures for the status page: [`InstanceStatus`], sampled by
//! [`Sources::sample`] from the parts that already keep them (the retry queue, the read
//! router's lag table and capacity bill, the near cache, the family layouts). Sampling takes
//! each part's own view once and holds no lock across parts.

use std::sync::Arc;

use serde::Serialize;

use crate::family::Families;
use crate::heal::queue::RetryQueueView;
use crate::heal::scrub::ScrubView;
use crate::heal::HealHandles;
use crate::hot::HotKeys;
use crate::near::{NearCache, NearCacheView};
use crate::read::Reader;
use crate::route::{ClassRouting, ReplicaLagView, Router};
use crate::status::hot_keys::HotKeysView;
use crate::store::now_unix_ms;

/// How many of the oldest retry-queue entries a sample lists.
const OLDEST_ENTRIES: usize = 5;

/// How many of the hottest near-cache copies a sample lists.
const HOTTEST_COPIES: usize = 5;

/// The most read keys a sample shows.
const HOT_KEYS_SHOWN: usize = 5;

/// What one instance reports about itself to the status page.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct InstanceStatus {
    /// When the figures were taken, Unix milliseconds on the instance's clock.
    pub at_ms: u64,
    /// The retry queue: depth, bytes, age of the oldest entry, nodes with pending entries and
    /// the oldest entries (at most 5).
    pub retry_queue: RetryQueueView,
    /// Every replica's lag (now, p50, p99, p999, max over the window) and whether each replica
    /// class accepts it now.
    pub lag: Vec<ReplicaLagView>,
    /// The read classes and their staleness budgets.
    pub classes: Vec<ClassBudget>,
    /// The capacity bill: per class, reads counted since start, and the primary-served ones by
    /// reason.
    pub routing: Vec<ClassRouting>,
    /// The near cache (the 5 hottest copies).
    pub near_cache: NearCacheView,
    /// The families with their layouts.
    pub families: Vec<FamilyStatus>,
    /// The anti-entropy scrub on this instance (`GET /v1/scrub`'s view): the lease, passes, and
    /// the repairs of the running and the last pass.
    pub scrub: ScrubView,
    /// The hot-key detector's last window (`GET /v1/hot-keys`'s instance view, its 5 most read
    /// keys): the fleet's hot keys are summed from these.
    pub hot_keys: HotKeysView,
}

/// A read class and its budget, as the lag table is judged against it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClassBudget {
    /// The class name.
    pub class: String,
    /// `replica` or `primary`.
    pub route: &'static str,
    /// For replica routes, the staleness budget in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_budget_ms: Option<u64>,
}

/// One key family and its layout, as this instance knows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FamilyStatus {
    /// The family's prefix, or `default`.
    pub family: String,
    /// The copy count this instance is configured with.
    pub copies: u32,
    /// How many copies a publish writes: the configured count, or the largest count of a live
    /// instance when that is larger (a rolling resize).
    pub write_copies: u32,
    /// The largest copy count ever recorded (copies beyond `copies` may remain from a shrink).
    pub max_copies: u32,
    /// How copies beyond copy 0 are named: `suffix` or `spread`.
    pub placement: &'static str,
    /// Why: `configured`, or the default chosen at startup.
    pub placement_reason: &'static str,
    /// The placement compatibility window: `none` (`K#i` only), `open` (`K#i` and the tagged
    /// names, 2N − 1 names a publish), `closed` (copy 0 and the tagged names, N).
    pub placement_window: crate::layout::WindowState,
    /// Whether the recorded layout disagrees with this instance's config.
    pub mismatch: bool,
    /// How long a value lives after it is published, in milliseconds.
    pub ttl_ms: u64,
    /// `caller` or `allocated`.
    pub versioning: &'static str,
    /// The read class of reads that name none.
    pub default_class: String,
}

/// The parts an [`InstanceStatus`] is sampled from, shared by the `/v1/fleet` handler and the
/// [`crate::status::StatusPublisher`].
pub struct Sources {
    /// The read router: lag, classes and the capacity bill.
    router: Arc<Router>,
    /// The near cache, when reads use one.
    near: Option<Arc<NearCache>>,
    /// The hot-key detector, when reads feed one.
    hot: Option<Arc<HotKeys>>,
    /// The key families.
    families: Arc<Families>,
    /// The retry queue and the recorded layouts.
    heal: HealHandles,
}

impl Sources {
    /// The sources of `reader`'s instance, with its retry queue and layouts.
    pub fn new(reader: &Reader, heal: HealHandles) -> Sources {
        Sources {
            router: reader.router().clone(),
            near: reader.near_cache().cloned(),
            hot: reader.hot_keys().cloned(),
            families: reader.families().clone(),
            heal,
        }
    }

    /// The hot-key detector's last window, its `shown` most read keys (a detector that is off
    /// when reads feed none).
    pub fn hot_keys(&self, shown: usize) -> HotKeysView {
        let mut view = match &self.hot {
            Some(hot) => HotKeysView::of(hot, &self.families, Some(&self.heal.layouts)),
            None => HotKeysView::off(),
        };
        view.keys.truncate(shown);
        view
    }

    /// Every read class, its reason and the families that use it by default (`/v1/classes`).
    pub fn classes(&self) -> Vec<crate::route::ClassView> {
        self.router.classes_view()
    }

    /// Replica lag per replica (`/v1/lag`).
    pub fn lag(&self) -> Vec<crate::route::ReplicaLagView> {
        self.router.lag_view()
    }

    /// Per class: the reads primaries served, and why (`/v1/routing`).
    pub fn routing(&self) -> Vec<crate::route::ClassRouting> {
        self.router.metrics().summary()
    }

    /// This instance's figures now.
    pub fn sample(&self) -> InstanceStatus {
        let class_views = self.router.classes_view();
        let classes = class_views
            .iter()
            .map(|class| ClassBudget {
                class: class.name.clone(),
                route: class.route,
                staleness_budget_ms: class.staleness_budget_ms,
            })
            .collect();
        let mismatches = self.heal.layouts.mismatches();
        let families = self
            .families
            .iter()
            .map(|family| {
                let name = family.name();
                FamilyStatus {
                    family: name.to_owned(),
                    copies: family.copies,
                    write_copies: self.heal.layouts.write_copies(name, family.copies),
                    max_copies: self.heal.layouts.max_copies(name, family.copies),
                    placement: family.placement.as_str(),
                    placement_reason: family.placement_reason.as_str(),
                    placement_window: self.heal.layouts.window_state(family),
                    mismatch: mismatches.iter().any(|mismatch| mismatch == name),
                    ttl_ms: crate::duration::millis(family.ttl),
                    versioning: family.versioning.as_str(),
                    // The class table in force (a reload may have changed it), else the config.
                    default_class: class_views
                        .iter()
                        .find(|class| class.families.iter().any(|used| used == name))
                        .map_or_else(|| family.default_class.clone(), |class| class.name.clone()),
                }
            })
            .collect();
        InstanceStatus {
            at_ms: now_unix_ms(),
            retry_queue: self.heal.retry_queue.view(OLDEST_ENTRIES),
            lag: self.router.lag_view(),
            classes,
            routing: self.router.metrics().summary(),
            near_cache: self
                .near
                .as_ref()
                .map_or_else(NearCacheView::off, |near| near.view(HOTTEST_COPIES)),
            families,
            scrub: self.heal.scrub.view(),
            hot_keys: self.hot_keys(HOT_KEYS_SHOWN),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::family::fixture;
    use crate::heal::{HealConfig, HealHandles, RetryQueue, ScrubStatus};
    use crate::layout::Layouts;
    use crate::metrics::Metrics;
    use crate::read::{ReadConfig, Reader};
    use crate::route::{RouteConfig, Router};
    use crate::store::memory::MemoryStore;

    #[test]
    fn a_sample_lists_every_family_and_class_of_the_config() {
        // The parts `server::app_state` wires from a config with this one family and every
        // other section at its default (the built-in classes, no near cache).
        let families = Arc::new(fixture::families(
            "[[family]]\nprefix = \"<svg/onload=alert(1)>\"\ncopies = 4\n",
        ));
        let metrics = Metrics::new();
        let router = Arc::new(Router::for_tests(
            &RouteConfig::default(),
            &std::collections::BTreeMap::new(),
            families.clone(),
        ));
        let reader = Reader::new(
            Arc::new(MemoryStore::new()),
            families,
            ReadConfig::default(),
            metrics.clone(),
            router,
        );
        let heal = HealHandles {
            retry_queue: Arc::new(RetryQueue::in_memory(
                HealConfig::default(),
                metrics.clone(),
            )),
            layouts: Layouts::unrecorded(),
            scrub: Arc::new(ScrubStatus::new(&metrics, false, "")),
        };
        let sources = super::Sources::new(&reader, heal);
        let sample = sources.sample();
        let families: Vec<(&str, u32, u32)> = sample
            .families
            .iter()
            .map(|family| (family.family.as_str(), family.copies, family.max_copies))
            .collect();
        assert_eq!(
            families,
            [("<svg/onload=alert(1)>", 4, 4), ("default", 1, 1)]
        );
        let advisory = sample
            .classes
            .iter()
            .find(|class| class.class == "advisory")
            .unwrap();
        assert_eq!(
            (advisory.route, advisory.staleness_budget_ms),
            ("replica", Some(250))
        );
        assert_eq!(sample.retry_queue.depth, 0);
        assert!(!sample.near_cache.enabled);
    }
}
