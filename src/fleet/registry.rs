//! The instance registry: every instance keeps an entry about itself in the store (id, API and
//! admin addresses, release, function library, start time, heartbeat), so instances and
//! operators see the whole deployment (`GET /v1/instances`).
//!
//! [`Registrar`] writes this instance's entry when the service starts serving and refreshes it
//! every `fleet.heartbeat_interval`; the entry lives three intervals (`FleetConfig::entry_ttl`),
//! so an instance that dies without cleaning up drops out within three intervals, and one that
//! stops normally removes its entry at shutdown. A failed refresh is logged and retried at the
//! next tick; it never stops the service. Where the entries are kept: `store::registry`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::layout::LayoutMismatch;
use crate::store::{now_unix_ms, FleetStore, InstanceRecord};

/// The release this binary runs: the package version.
pub(crate) const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// This instance's registry record and the store the registry lives in, shared by the
/// registrar and the `/v1/instances` handler.
pub struct Registry {
    /// Where the entries live.
    store: Arc<dyn FleetStore>,
    /// This instance's record; the addresses are filled in when the service binds. A std
    /// mutex: it is held only to copy or update the record, never across an await.
    own: Mutex<InstanceRecord>,
    /// How long an entry lives without a refresh.
    entry_ttl: Duration,
}

/// What `GET /v1/instances` answers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct InstancesView {
    /// The id of the instance that answered.
    pub this: String,
    /// Every registered instance whose entry has not lapsed, by id.
    pub instances: Vec<InstanceRecord>,
    /// The families whose layout the answering instance sees disagreeing with its own config
    /// (the recorded copy count differs, or another live instance runs another count), each
    /// with the instance and release that wrote the record. Empty when every running instance
    /// agrees.
    pub layout_mismatches: Vec<LayoutMismatch>,
}

impl Registry {
    /// The registry of instance `id` over `store`, started now, with entries that live
    /// `entry_ttl` without a refresh, recording that this instance calls the function library
    /// `library` ([`crate::store::LibraryStore::library_name`]). Its API address is unknown
    /// until [`Registry::set_listen`].
    pub fn new(
        store: Arc<dyn FleetStore>,
        library: Option<&str>,
        id: String,
        entry_ttl: Duration,
    ) -> Registry {
        let now_ms = now_unix_ms();
        let own = InstanceRecord {
            id,
            listen: String::new(),
            admin: None,
            release: RELEASE.to_owned(),
            library: library.map(str::to_owned),
            started_ms: now_ms,
            heartbeat_ms: now_ms,
        };
        Registry {
            store,
            own: Mutex::new(own),
            entry_ttl,
        }
    }

    /// Records the address this instance's API is reached at.
    pub fn set_listen(&self, listen: String) {
        self.own().listen = listen;
    }

    /// Records the address of this instance's admin listener.
    pub fn set_admin(&self, admin: Option<String>) {
        self.own().admin = admin;
    }

    /// This instance's id.
    pub fn id(&self) -> String {
        self.own().id.clone()
    }

    /// How often the registrar refreshes the entry (`fleet.heartbeat_interval`): the entry
    /// lives three intervals (`FleetConfig::entry_ttl`).
    pub fn heartbeat_interval(&self) -> Duration {
        self.entry_ttl / 3
    }

    /// This instance's record as it would register now.
    pub fn record(&self) -> InstanceRecord {
        self.own().clone()
    }

    /// Writes (or refreshes) this instance's entry with a heartbeat of now.
    ///
    /// # Errors
    /// As [`FleetStore::register_instance`].
    pub(crate) async fn refresh(&self) -> Result<()> {
        let record = {
            let mut own = self.own();
            own.heartbeat_ms = now_unix_ms();
            own.clone()
        };
        self.store
            .register_instance(&record, crate::duration::millis(self.entry_ttl))
            .await
    }

    /// Removes this instance's entry.
    ///
    /// # Errors
    /// As [`FleetStore::deregister_instance`].
    pub async fn leave(&self) -> Result<()> {
        let id = self.id();
        self.store.deregister_instance(&id).await
    }

    /// Every registered instance, as `GET /v1/instances` shows them (the handler adds the
    /// layout mismatches, which the registry does not know).
    ///
    /// # Errors
    /// As [`FleetStore::instances`].
    pub async fn view(&self) -> Result<InstancesView> {
        Ok(InstancesView {
            this: self.id(),
            instances: self.store.instances().await?,
            layout_mismatches: Vec::new(),
        })
    }

    fn own(&self) -> std::sync::MutexGuard<'_, InstanceRecord> {
        // Every critical section is one field assignment or a clone.
        self.own.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps this instance's registry entry alive: registers at once, refreshes every interval,
/// removes the entry at shutdown.
pub struct Registrar {
    /// The registry to keep this instance in.
    pub registry: Arc<Registry>,
    /// How often to refresh (`fleet.heartbeat_interval`).
    pub interval: Duration,
}

impl Registrar {
    /// Registers, refreshes every interval until `shutdown`, then removes the entry.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Logged once per run of failures, not on every tick of an outage.
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => match self.registry.refresh().await {
                    Ok(()) => {
                        if failing {
                            tracing::info!("instance registry entry refreshed again");
                        }
                        failing = false;
                    }
                    Err(err) => {
                        if !failing {
                            tracing::warn!(error = %err, "could not refresh this instance's registry entry; retrying every heartbeat interval");
                        }
                        failing = true;
                    }
                },
            }
        }
        match self.registry.leave().await {
            Ok(()) => tracing::debug!("left the instance registry"),
            Err(err) => {
                tracing::warn!(error = %err, "could not remove this instance's registry entry; it lapses after three heartbeat intervals")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn the_registrar_registers_refreshes_and_leaves() {
        let store: Arc<dyn FleetStore> = Arc::new(MemoryStore::new());
        let registry = Arc::new(Registry::new(
            store.clone(),
            None,
            "1-a".to_owned(),
            Duration::from_secs(60),
        ));
        registry.set_listen("127.0.0.1:1".to_owned());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            Registrar {
                registry: registry.clone(),
                interval: Duration::from_millis(10),
            }
            .run(shutdown.clone()),
        );
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let view = registry.view().await.unwrap();
            if let Some(own) = view.instances.first() {
                assert_eq!(
                    (own.id.as_str(), own.listen.as_str()),
                    ("1-a", "127.0.0.1:1")
                );
                assert_eq!(own.release, RELEASE);
                if seen.last() != Some(&own.heartbeat_ms) {
                    seen.push(own.heartbeat_ms);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
        assert!(registry.view().await.unwrap().instances.is_empty());
    }

    #[tokio::test]
    async fn an_entry_not_refreshed_lapses() {
        let store: Arc<dyn FleetStore> = Arc::new(MemoryStore::new());
        let registry = Registry::new(store, None, "1-a".to_owned(), Duration::from_millis(1));
        registry.refresh().await.unwrap();
        let mut lapsed = false;
        for _ in 0..1000 {
            if registry.view().await.unwrap().instances.is_empty() {
                lapsed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(lapsed);
    }
}
