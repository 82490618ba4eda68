//! The state every handler shares: the operations, the store and the numbers the answers carry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::auth::AuthLayer;
use super::handlers::RouteTexts;
use super::overload;
use crate::auth::TokenTable;
use crate::door::Core;
use crate::fleet::Registry;
use crate::heal::{HealHandles, StoreProbe};
use crate::metrics::Metrics;
use crate::ops::Ops;
use crate::route::WarmUp;
use crate::store::FleetStore;

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The parts, shared.
    inner: Arc<Inner>,
}

/// The parts of [`AppState`].
pub(crate) struct Inner {
    /// What both doors share: the operations, the token table, the metrics, the in-flight
    /// bound.
    pub(crate) core: Core,
    /// What a read and a publish mean (the core's, held here too for the handlers' one hop).
    pub(crate) ops: Ops,
    /// The store as readiness checks see it.
    pub(crate) store: StoreProbe,
    /// The fleet's records, for `/v1/fleet`.
    pub(crate) fleet: Arc<dyn FleetStore>,
    /// Metrics to render and to count into.
    pub(crate) metrics: Arc<Metrics>,
    /// `Retry-After` seconds for 503 answers.
    pub(crate) retry_after_secs: u64,
    /// The retry queue and recorded layouts, for `/v1/retry-queue`, `/metrics` and `/readyz`.
    pub(crate) heal: HealHandles,
    /// The instance registry, for `/v1/instances`.
    pub(crate) registry: Arc<Registry>,
    /// Set when shutdown has begun: `/readyz` answers 503 (reason `draining`) from then on.
    pub(crate) draining: Arc<AtomicBool>,
    /// The token check in front of every route, with the table a reload swaps (empty until
    /// [`AppState::tokens`] is given tokens).
    pub(crate) auth: AuthLayer,
    /// The request limits and their counters, for the overload layer.
    pub(crate) limits: Arc<overload::Shared>,
    /// The startup warm-up `/readyz` waits for.
    pub(crate) warm_up: Arc<WarmUp>,
    /// The read answers' `Hotsplit-Route` texts per class and reason, rendered once.
    pub(crate) route_texts: RouteTexts,
    /// The last store `PING` of `/readyz`, which every caller shares for a probe interval.
    pub(crate) ready_ping: super::probes::ReadyPing,
}

/// The parts an [`AppState`] is made of, by name.
pub struct AppParts {
    /// What both doors share (the Redis door holds the same [`Core`]).
    pub core: Core,
    /// The store as readiness checks see it.
    pub store: StoreProbe,
    /// The fleet's records, for `/v1/fleet`.
    pub fleet: Arc<dyn FleetStore>,
    /// How long a client should wait before retrying a 503; sent as `Retry-After` in whole
    /// seconds, rounded up, at least 1.
    pub retry_after: Duration,
    /// The retry queue and recorded layouts, for `/v1/retry-queue`, `/metrics` and `/readyz`.
    pub heal: HealHandles,
    /// The instance registry, for `/v1/instances`.
    pub registry: Arc<Registry>,
    /// The startup warm-up `/readyz` waits for (replicas discovered and measured).
    pub warm_up: Arc<WarmUp>,
    /// How long one store `PING` answers every `/readyz` (`heal.probe_interval`).
    pub ready_ping_interval: Duration,
}

impl AppState {
    /// Bundles the parts the handlers use, and registers the request limits' metrics.
    pub fn new(parts: AppParts) -> AppState {
        let AppParts {
            core,
            store,
            fleet,
            retry_after,
            heal,
            registry,
            warm_up,
            ready_ping_interval,
        } = parts;
        let retry_after_secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        let ops = core.ops().clone();
        let metrics = core.metrics().clone();
        let auth = AuthLayer::new(core.tokens().clone(), &metrics);
        let limits = overload::Shared::new(core.in_flight().clone(), &metrics);
        let route_texts = RouteTexts::new(&ops);
        AppState {
            inner: Arc::new(Inner {
                core,
                ops,
                store,
                fleet,
                metrics,
                retry_after_secs,
                heal,
                registry,
                auth,
                draining: Arc::new(AtomicBool::new(false)),
                warm_up,
                limits,
                route_texts,
                ready_ping: super::probes::ReadyPing::new(ready_ping_interval),
            }),
        }
    }

    /// The token table every request is checked against: empty (no check) until tokens are
    /// stored into it, at startup or by a reload.
    pub fn tokens(&self) -> &TokenTable {
        self.inner.auth.tokens()
    }

    /// The status layer's view of this instance: what the admin views show.
    pub fn sources(&self) -> crate::status::Sources {
        crate::status::Sources::new(self.inner.ops.reader(), self.inner.heal.clone())
    }

    /// What both doors share: hand it to the Redis door.
    pub fn core(&self) -> &Core {
        &self.inner.core
    }

    /// The operations the key routes call.
    pub fn ops(&self) -> &Ops {
        &self.inner.ops
    }

    /// The metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// Marks the instance draining: `/readyz` answers 503 with reason `draining` from now on,
    /// while every other route still answers (the drain delay before the listeners close).
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// The startup warm-up `/readyz` waits for.
    pub fn warm_up(&self) -> &Arc<WarmUp> {
        &self.inner.warm_up
    }

    /// Whether [`AppState::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
}
