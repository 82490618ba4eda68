//! The HTTP state's parts ([`StateParts`]) and how they are wired: [`app_state`] for tests and
//! embedding, [`super::Service::build`] with the connected store.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::instance_name;
use crate::auth::TokenTable;
use crate::config::Config;
use crate::door::{Core, CoreParts, InFlightBound, RequestLimits};
use crate::error::Result;
use crate::fleet::session::{SessionKey, SessionMetrics};
use crate::fleet::{Registry, Sessions};
use crate::heal::{HealHandles, NodeHealth, Repairer, RetryQueue, ScrubStatus, StoreProbe};
use crate::hot::HotKeys;
use crate::http::{AppParts, AppState};
use crate::layout::Layouts;
use crate::metrics::Metrics;
use crate::near::{NearCache, NearMetrics};
use crate::ops::{HighWater, Ops, OpsParts};
use crate::publish::Publisher;
use crate::read::Reader;
use crate::route::{LagTable, Route, RouteMetrics, Router, WarmUp};
use crate::store::{CopyStore, FleetStore, LibraryStore, TopologyStore};

/// The parts the HTTP state is wired from, besides the config: [`app_state`] fills them for
/// tests and embedding, [`Service::build`] with the connected store, the spool-backed queue and
/// the recorded layouts.
pub struct StateParts {
    /// The copies (through node health with Redis): what the publisher, the reader and read
    /// repair write and read.
    pub copies: Arc<dyn CopyStore>,
    /// The store as readiness, the warm-up and synced publishes see it.
    pub probe: StoreProbe,
    /// The fleet's records, for `/v1/fleet`.
    pub fleet: Arc<dyn FleetStore>,
    /// The registry every part counts into.
    pub metrics: Arc<Metrics>,
    /// Where failed copy writes wait (spool-backed with Redis, in memory otherwise).
    pub retry_queue: Arc<RetryQueue>,
    /// Each family's recorded copy layout.
    pub layouts: Arc<Layouts>,
    /// Where read repairs run (the service's tracker, so shutdown drains them).
    pub tracker: TaskTracker,
    /// The replica lag reads are routed by (fed by the lag monitor while serving).
    pub lag: Arc<LagTable>,
    /// The instance registry `/v1/instances` lists.
    pub registry: Arc<Registry>,
    /// The deployment's session key (`fleet::session`).
    pub session_key: SessionKey,
    /// The scrub's figures (registered in `metrics`), for `GET /v1/scrub`.
    pub scrub: Arc<ScrubStatus>,
    /// The readiness warm-up's bound (`server.readiness_warm_up`), or `None` for no warm-up
    /// (nothing feeds the lag table).
    pub warm_up: Option<Duration>,
}

impl StateParts {
    /// Wires the publisher, the reader and its router around these parts. Also returns the
    /// routing metrics the lag monitor updates.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when a read class or a family's default class is invalid.
    pub fn wire(self, config: &Config) -> Result<(AppState, Arc<RouteMetrics>)> {
        let StateParts {
            copies,
            probe,
            fleet,
            metrics,
            retry_queue,
            layouts,
            tracker,
            lag,
            registry,
            session_key,
            scrub,
            warm_up,
        } = self;
        let session_metrics = metrics.register_with(SessionMetrics::register);
        let sessions = Arc::new(Sessions::new(session_key, &config.session, session_metrics));
        let families = Arc::new(config.families());
        let classes = config.classes()?;
        let route_metrics =
            Arc::new(metrics.register_with(|registry| RouteMetrics::register(registry, &classes)));
        let replica_routed = classes
            .iter()
            .any(|(_, def)| matches!(def.route, Route::Replica { .. }));
        let warm_up = Arc::new(match warm_up {
            Some(bound) => WarmUp::new(probe.topology.clone(), lag.clone(), bound, replica_routed),
            // No warm-up: one that has already ended and never waits.
            None => WarmUp::new(probe.topology.clone(), lag.clone(), Duration::ZERO, false),
        });
        let router = Arc::new(Router::new(
            &config.route,
            classes,
            families.clone(),
            lag,
            route_metrics.clone(),
        )?);
        // The near cache is off on the embedded store: its copies are in this process already.
        let near = (config.near_cache.enabled && probe.kind() != "embedded").then(|| {
            let near_metrics = metrics
                .register_with(|registry| NearMetrics::register(registry, &router.classes()));
            Arc::new(NearCache::new(
                &config.near_cache,
                near_metrics,
                tracker.clone(),
            ))
        });
        let mut publisher = Publisher::new(copies.clone(), families.clone(), metrics.clone())
            .with_topology(probe.topology.clone())
            .with_retry_queue(retry_queue.clone())
            .with_layouts(layouts.clone())
            .with_expiry_jitter(config.heal.expiry_jitter_min, config.heal.expiry_jitter_max);
        let repairer = Repairer::new(
            copies.clone(),
            config.heal.repair_concurrency,
            tracker,
            metrics.clone(),
        );
        let mut reader = Reader::new(
            copies,
            families,
            config.read.clone(),
            metrics.clone(),
            router,
        )
        .with_repairer(repairer)
        .with_layouts(layouts.clone())
        .with_hot_keys(HotKeys::new(config.hot_keys.clone(), &metrics));
        if let Some(near) = near {
            publisher = publisher.with_near_cache(near.clone());
            reader = reader.with_near_cache(near);
        }
        let core = Core::new(CoreParts {
            ops: Ops::from_parts(OpsParts {
                publisher,
                reader,
                sessions,
                high_water: HighWater::with_bytes(config.session.high_water_bytes),
                max_value_bytes: config.server.max_value_bytes,
                instance: registry.id().into(),
            }),
            tokens: TokenTable::default(),
            in_flight: InFlightBound::new(RequestLimits::from(&config.server), &metrics),
            metrics,
            instance: registry.id().into(),
        });
        let state = AppState::new(AppParts {
            core,
            store: probe,
            fleet,
            retry_after: config.read.retry_after,
            heal: HealHandles {
                retry_queue,
                layouts,
                scrub,
            },
            registry,
            warm_up,
            ready_ping_interval: config.heal.probe_interval,
        });
        Ok((state, route_metrics))
    }
}

/// Builds the HTTP state from a validated config and a connected store (every role from it,
/// without node health), with an in-memory retry queue and read repair on a task tracker of
/// its own, and a lag table no monitor feeds (replica-routed reads go to the primary, reason
/// `no-replica`): for tests and embedding.
///
/// # Errors
/// [`ErrorKind::Config`] when a read class or a family's default class is invalid.
pub fn app_state<S>(config: &Config, store: Arc<S>, metrics: Arc<Metrics>) -> Result<AppState>
where
    S: CopyStore + TopologyStore + LibraryStore + FleetStore,
{
    StateParts {
        registry: Arc::new(Registry::new(
            store.clone(),
            store.library_name(),
            instance_name(),
            config.fleet.entry_ttl(),
        )),
        // One instance: a key of its own.
        session_key: SessionKey::random(),
        copies: store.clone(),
        probe: StoreProbe {
            topology: store.clone(),
            library: store.clone(),
            health: NodeHealth::new(),
        },
        fleet: store,
        retry_queue: Arc::new(RetryQueue::in_memory(config.heal.clone(), metrics.clone())),
        scrub: Arc::new(ScrubStatus::new(&metrics, false, "")),
        metrics,
        layouts: Layouts::unrecorded(),
        tracker: TaskTracker::new(),
        lag: Arc::new(LagTable::new(
            config.route.heartbeat_interval,
            config.route.lag_window,
        )),
        warm_up: None,
    }
    .wire(config)
    .map(|(state, _)| state)
}
