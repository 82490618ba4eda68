//! The HTTP state's parts ([`StateParts`]) and how they are wired: [`app_state`] for tests and
//! embedding, [`super::Service::build`] with the connected store.

use crate::tracking::store::Noticing;
use crate::tracking::Tracking;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::instance_name;
use crate::auth::TokenTable;
use crate::config::Config;
use crate::door::{Core, CoreParts, InFlightBound, RequestLimits};
use crate::error::Result;
use crate::family::Families;
use crate::fleet::session::SessionKey;
use crate::fleet::Registry;
use crate::heal::{HealHandles, NodeHealth, RetryQueue, ScrubStatus, StoreProbe};
use crate::http::{AppParts, AppState};
use crate::layout::Layouts;
use crate::metrics::Metrics;
use crate::ops::wire::{wire, OpsSettings, OpsStores};
use crate::route::{LagTable, RouteMetrics, WarmUp};
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
    /// The family table: the config's, with the placement of each family that names none
    /// chosen at startup (`layout::choose_placements`).
    pub families: Families,
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
    /// Client-side caching's tracking table (`copies` tells it of every change).
    pub tracking: Arc<Tracking>,
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
            families,
            tracker,
            lag,
            registry,
            session_key,
            scrub,
            warm_up,
            tracking,
        } = self;
        let instance: Arc<str> = registry.id().into();
        let wired = wire(
            OpsSettings {
                families,
                classes: config.classes()?,
                route: &config.route,
                read: &config.read,
                near_cache: &config.near_cache,
                heal: &config.heal,
                session: &config.session,
                hot_keys: &config.hot_keys,
                max_value_bytes: config.server.max_value_bytes,
            },
            OpsStores {
                copies,
                topology: probe.topology.clone(),
                metrics: metrics.clone(),
                retry_queue: retry_queue.clone(),
                layouts: layouts.clone(),
                tracker,
                lag: lag.clone(),
                session_key,
                instance: instance.clone(),
                tracking,
            },
        )?;
        let warm_up = Arc::new(match warm_up {
            Some(bound) => WarmUp::new(probe.topology.clone(), lag, bound, wired.replica_routed),
            // No warm-up: one that has already ended and never waits.
            None => WarmUp::new(probe.topology.clone(), lag, Duration::ZERO, false),
        });
        let core = Core::new(CoreParts {
            ops: wired.ops,
            tokens: TokenTable::default(),
            in_flight: InFlightBound::new(RequestLimits::from(&config.server), &metrics),
            metrics,
            instance,
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
        Ok((state, wired.route_metrics))
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
    let tracking = Arc::new(Tracking::default());
    StateParts {
        registry: Arc::new(Registry::new(
            store.clone(),
            store.library_name(),
            instance_name(),
            config.fleet.entry_ttl(),
        )),
        // One instance: a key of its own.
        session_key: SessionKey::random(),
        copies: Arc::new(Noticing::new(store.clone(), tracking.clone())),
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
        families: config.families(),
        tracker: TaskTracker::new(),
        lag: Arc::new(LagTable::new(
            config.route.heartbeat_interval,
            config.route.lag_window,
        )),
        warm_up: None,
        tracking,
    }
    .wire(config)
    .map(|(state, _)| state)
}
