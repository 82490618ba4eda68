//! Wiring an [`Ops`] from its settings and its stores ([`wire`]): the router, the near cache,
//! the publisher, the reader (with read repair and the hot-key detector) and the sessions.
//! `server` wires the running instance through it; a door's unit tests wire one over the
//! embedded store the same way, without the service above them.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::{HighWater, Ops, OpsParts};
use crate::error::Result;
use crate::family::Families;
use crate::fleet::session::{SessionKey, SessionMetrics};
use crate::fleet::{SessionConfig, Sessions};
use crate::heal::{HealConfig, Repairer, RetryQueue};
use crate::hot::{HotKeys, HotKeysConfig};
use crate::layout::Layouts;
use crate::metrics::Metrics;
use crate::near::{NearCache, NearCacheConfig, NearMetrics};
use crate::publish::Publisher;
use crate::read::{ReadConfig, Reader};
use crate::route::{Classes, LagTable, Route, RouteConfig, RouteMetrics, Router};
use crate::store::{CopyStore, TopologyStore};
use crate::tracking::Tracking;

/// The settings an [`Ops`] is wired from: the families, the read classes and the sub-configs
/// of the parts it holds.
pub struct OpsSettings<'a> {
    /// The key families.
    pub families: Families,
    /// The read classes.
    pub classes: Classes,
    /// `[route]`.
    pub route: &'a RouteConfig,
    /// `[read]`.
    pub read: &'a ReadConfig,
    /// `[near_cache]`.
    pub near_cache: &'a NearCacheConfig,
    /// `[heal]`: read repair's concurrency and the expiry jitter.
    pub heal: &'a HealConfig,
    /// `[session]`: the tokens and the high-water's size.
    pub session: &'a SessionConfig,
    /// `[hot_keys]`.
    pub hot_keys: &'a HotKeysConfig,
    /// `server.max_value_bytes`.
    pub max_value_bytes: usize,
}

/// The stores and shared parts an [`Ops`] is wired over.
pub struct OpsStores {
    /// The copies (through node health with Redis).
    pub copies: Arc<dyn CopyStore>,
    /// The store's shape: replicas for synced publishes.
    pub topology: Arc<dyn TopologyStore>,
    /// The registry every part counts into.
    pub metrics: Arc<Metrics>,
    /// Where failed copy writes wait.
    pub retry_queue: Arc<RetryQueue>,
    /// Each family's recorded copy layout, and the split index.
    pub layouts: Arc<Layouts>,
    /// Where read repairs and near-cache refreshes run.
    pub tracker: TaskTracker,
    /// The replica lag reads are routed by.
    pub lag: Arc<LagTable>,
    /// The deployment's session key.
    pub session_key: SessionKey,
    /// This instance's name.
    pub instance: Arc<str>,
    /// Client-side caching's tracking table.
    pub tracking: Arc<Tracking>,
}

/// A wired [`Ops`], with what the service around it needs of the wiring.
pub struct Wired {
    /// The operations.
    pub ops: Ops,
    /// The routing metrics, which the lag monitor updates.
    pub route_metrics: Arc<RouteMetrics>,
    /// Whether any read class reads replicas (the readiness warm-up waits for lag only then).
    pub replica_routed: bool,
}

/// Wires an [`Ops`]. The near cache is off on the embedded store: its copies are in this
/// process already.
///
/// # Errors
/// [`crate::ErrorKind::Config`] when a read class or a family's default class is invalid.
pub fn wire(settings: OpsSettings<'_>, stores: OpsStores) -> Result<Wired> {
    let OpsSettings {
        families,
        classes,
        route,
        read,
        near_cache,
        heal,
        session,
        hot_keys,
        max_value_bytes,
    } = settings;
    let metrics = &stores.metrics;
    let families = Arc::new(families);
    let route_metrics =
        Arc::new(metrics.register_with(|registry| RouteMetrics::register(registry, &classes)));
    let replica_routed = classes
        .iter()
        .any(|(_, def)| matches!(def.route, Route::Replica { .. }));
    let router = Arc::new(Router::new(
        route,
        classes,
        families.clone(),
        stores.lag.clone(),
        route_metrics.clone(),
    )?);
    let near = (near_cache.enabled && stores.topology.kind() != "embedded").then(|| {
        let near_metrics =
            metrics.register_with(|registry| NearMetrics::register(registry, &router.classes()));
        Arc::new(NearCache::new(
            near_cache,
            near_metrics,
            stores.tracker.clone(),
        ))
    });
    let mut publisher = Publisher::new(stores.copies.clone(), families.clone(), metrics.clone())
        .with_topology(stores.topology.clone())
        .with_retry_queue(stores.retry_queue.clone())
        .with_layouts(stores.layouts.clone())
        .with_expiry_jitter(heal.expiry_jitter_min, heal.expiry_jitter_max);
    let repairer = Repairer::new(
        stores.copies.clone(),
        heal.repair_concurrency,
        stores.tracker.clone(),
        metrics.clone(),
    );
    let mut reader = Reader::new(
        stores.copies.clone(),
        families,
        read.clone(),
        metrics.clone(),
        router,
    )
    .with_repairer(repairer)
    .with_layouts(stores.layouts.clone())
    .with_hot_keys(HotKeys::new(hot_keys.clone(), metrics));
    if let Some(near) = near {
        publisher = publisher.with_near_cache(near.clone());
        reader = reader.with_near_cache(near);
    }
    let session_metrics = metrics.register_with(SessionMetrics::register);
    let sessions = Arc::new(Sessions::new(stores.session_key, session, session_metrics));
    let ops = Ops::from_parts(OpsParts {
        publisher,
        reader,
        sessions,
        high_water: HighWater::with_bytes(session.high_water_bytes),
        max_value_bytes,
        instance: stores.instance,
        tracking: stores.tracking,
    });
    Ok(Wired {
        ops,
        route_metrics,
        replica_routed,
    })
}
