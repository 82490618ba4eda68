//! The store the config names, connected ([`Connected`]), and the roles each part of the
//! service is handed ([`Roles`]); the deployment's session key kept in it.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::fleet::session::SessionKey;
use crate::heal::{HealthStore, NodeHealth};
use crate::metrics::Metrics;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::{
    CopyStore, FeedStore, FleetStore, LayoutStore, LibraryStore, StoreConfig, TopologyStore,
};

/// The store the config names, connected.
pub(super) enum Connected {
    /// The embedded store (`store.redis` unset); the service purges its expired copies.
    Memory(Arc<MemoryStore>),
    /// Redis, reachable, its function library loaded.
    Redis(Arc<RedisStore>),
}

impl Connected {
    /// Connects Redis when `store.redis` is set, else makes the embedded store; either keeps
    /// an expired copy's version for `version_retention`.
    pub(super) async fn connect(
        config: &StoreConfig,
        version_retention: Duration,
        metrics: &Arc<Metrics>,
    ) -> Result<Connected> {
        match config.redis_options()? {
            None => {
                tracing::warn!("running on the embedded in-memory store: values live in this process only; set store.redis (or --redis) to use Redis");
                Ok(Connected::Memory(Arc::new(
                    MemoryStore::new()
                        .with_version_retention(crate::duration::millis(version_retention))
                        .with_memory_bound(config.memory_max_bytes())
                        .with_metrics(metrics),
                )))
            }
            Some(mut options) => {
                options.version_retention = version_retention;
                let url = options.target.to_string();
                let store = RedisStore::connect(options, metrics.clone()).await?;
                tracing::info!(url = %url, kind = store.kind(), "connected to redis");
                Ok(Connected::Redis(Arc::new(store)))
            }
        }
    }

    /// The roles of the store as the rest of the service uses them: with Redis, the copies
    /// through node health (`heal::health`), so a node known to be failing costs no command
    /// timeout.
    pub(super) fn roles(&self, health: &Arc<NodeHealth>) -> Roles {
        match self {
            Connected::Memory(memory) => Roles {
                copies: memory.clone(),
                layouts: memory.clone(),
                splits: memory.clone(),
                fleet: memory.clone(),
                topology: memory.clone(),
                library: memory.clone(),
                feed: None,
            },
            Connected::Redis(redis) => Roles {
                copies: Arc::new(HealthStore::new(redis.clone(), health.clone())),
                layouts: redis.clone(),
                splits: redis.clone(),
                fleet: redis.clone(),
                topology: redis.clone(),
                library: redis.clone(),
                feed: Some(redis.clone()),
            },
        }
    }
}

/// The store's roles, each part given the ones it uses ([`crate::store::roles`]).
pub(super) struct Roles {
    /// The copies, through node health with Redis.
    pub(super) copies: Arc<dyn CopyStore>,
    /// The layout records and live sets.
    pub(super) layouts: Arc<dyn LayoutStore>,
    /// Each family's split records (`crate::split`).
    pub(super) splits: Arc<dyn crate::store::SplitStore>,
    /// The registry, the session key and status summaries.
    pub(super) fleet: Arc<dyn FleetStore>,
    /// Kind, primaries, replicas, heartbeats, pings.
    pub(super) topology: Arc<dyn TopologyStore>,
    /// The function library.
    pub(super) library: Arc<dyn LibraryStore>,
    /// The invalidation feed's connections; `None` on the embedded store (one instance).
    pub(super) feed: Option<Arc<dyn FeedStore>>,
}

/// The deployment's session key: the one in the store, or a fresh one stored there. When the
/// store cannot give one (the node that holds it refuses writes or does not answer), a key of
/// this process's own, with a warning: the service still starts, and its tokens are ignored by
/// the other instances (and theirs by it) until it restarts.
pub(super) async fn deployment_session_key(store: &dyn FleetStore) -> SessionKey {
    let own = SessionKey::random();
    let shared = match store.session_key(&own.to_hex()).await {
        Ok(text) => SessionKey::from_hex(&text).ok_or_else(|| {
            format!(
                "the stored session key {} is not 32 hex digits; delete it and restart",
                crate::store::registry::SESSION_KEY_KEY
            )
        }),
        Err(err) => Err(err.to_string()),
    };
    shared.unwrap_or_else(|why| {
        tracing::warn!(error = %why, "no shared session key: this instance's session tokens are ignored by the others until it restarts");
        own
    })
}
