//! A Redis door over the embedded store for this module's unit tests, wired as the service
//! wires one (`ops::wire`) but without the service, which stands above this door: every
//! sub-config at its default, the families from a config text.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::Door;
use crate::auth::TokenTable;
use crate::door::{Core, CoreParts, InFlightBound, RequestLimits, ServerConfig};
use crate::fleet::session::SessionKey;
use crate::fleet::SessionConfig;
use crate::heal::{HealConfig, RetryQueue};
use crate::hot::HotKeysConfig;
use crate::layout::Layouts;
use crate::metrics::Metrics;
use crate::near::NearCacheConfig;
use crate::ops::wire::{wire, OpsSettings, OpsStores};
use crate::read::ReadConfig;
use crate::route::{Classes, LagTable, RouteConfig};
use crate::store::memory::MemoryStore;
use crate::tracking::store::Noticing;
use crate::tracking::Tracking;

/// A door over a fresh embedded store, with the `[default_family]` and `[[family]]` sections of
/// `families` (a config text) and `server`'s limits.
///
/// # Panics
/// When the fixture's text does not parse: a broken test.
pub(crate) fn door(families: &str, server: &ServerConfig) -> Door {
    let store = Arc::new(MemoryStore::new());
    let metrics = Metrics::new();
    let route = RouteConfig::default();
    let heal = HealConfig::default();
    let instance: Arc<str> = "resp-test".into();
    let tracking = Arc::new(Tracking::default());
    let wired = wire(
        OpsSettings {
            families: crate::family::fixture::families(families),
            classes: Classes::from_config(&BTreeMap::new()).expect("the built-in classes"),
            route: &route,
            read: &ReadConfig::default(),
            near_cache: &NearCacheConfig::default(),
            heal: &heal,
            session: &SessionConfig::default(),
            hot_keys: &HotKeysConfig::default(),
            max_value_bytes: server.max_value_bytes,
        },
        OpsStores {
            copies: Arc::new(Noticing::new(store.clone(), tracking.clone())),
            topology: store,
            metrics: metrics.clone(),
            retry_queue: Arc::new(RetryQueue::in_memory(heal.clone(), metrics.clone())),
            layouts: Layouts::unrecorded(),
            tracker: TaskTracker::new(),
            lag: Arc::new(LagTable::new(route.heartbeat_interval, route.lag_window)),
            session_key: SessionKey::random(),
            instance: instance.clone(),
            tracking,
        },
    )
    .expect("a door over the embedded store");
    Door::new(Core::new(CoreParts {
        ops: wired.ops,
        tokens: TokenTable::default(),
        in_flight: InFlightBound::new(RequestLimits::from(server), &metrics),
        metrics,
        instance,
    }))
}
