//! [`Service::build`](super::Service::build)'s phases, in the order it runs them: [`admit`]
//! (the config, the tokens and the TLS files, before anything connects), [`Recorded::connect`]
//! (the store, its roles and each family's recorded layout, before anything else can fail or
//! start), [`Healing::open`] (the retry queue and its spool, the prober, the scrub and the
//! worker), and [`split_driver`] and [`lag_monitor`] (the background parts made from the wired
//! state).

use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsAcceptor;

use super::purger::Purger;
use super::store::{Connected, Roles};
use crate::auth::Tokens;
use crate::config::Config;
use crate::error::Result;
use crate::family::Families;
use crate::feed::{Feed, FeedParts};
use crate::fleet::{LibraryRetirer, Registrar, Registry, RetireMetrics};
use crate::heal::{HealthProber, NodeHealth, RetryQueue, RetryWorker, ScrubStatus, Scrubber};
use crate::http::listener::tls;
use crate::http::AppState;
use crate::layout::{LayoutStores, LayoutWatcher, Layouts, Liveness, Splitter, SplitterParts};
use crate::metrics::Metrics;
use crate::route::{LagMonitor, LagTable, RouteMetrics};
use crate::status::{Sources, StatusPublisher};
use crate::store::{CopyStore, FeedStore, FleetStore, LibraryStore, SplitStore, TopologyStore};
use crate::tracking::store::Noticing;
use crate::tracking::Tracking;

/// Validates `config` and loads what it names before anything connects: the API tokens (and
/// a warning when it serves without them in public) and the HTTP door's TLS acceptor.
///
/// # Errors
/// [`crate::ErrorKind::Config`] for an invalid config; [`crate::ErrorKind::Io`] for a token or
/// TLS file that cannot be read.
pub(super) fn admit(config: &Config) -> Result<(Option<Tokens>, Option<TlsAcceptor>)> {
    config.validate()?;
    let tokens = config.auth.load_tokens()?;
    match &tokens {
        Some(tokens) => tracing::info!(
            tokens = tokens.len(),
            "api tokens loaded: every endpoint but /healthz and /readyz needs a bearer token"
        ),
        None if config.serves_unauthenticated_publicly() => {
            tracing::warn!(listen = %config.server.listen, resp = ?config.resp.listen, "server.allow_unauthenticated: serving without tokens on a non-loopback address: anyone who reaches it can read and write every key")
        }
        None => {}
    }
    let tls = match (&config.server.tls_cert_file, &config.server.tls_key_file) {
        (Some(cert_file), Some(key_file)) => Some(tls::acceptor(cert_file, key_file)?),
        _ => None,
    };
    Ok((tokens, tls))
}

/// The connected store, the roles each part gets, and each family's layout as recorded.
pub(super) struct Recorded {
    /// The store itself (the purger and the scrub need its concrete kind).
    pub(super) connected: Connected,
    /// Which nodes are failing; the copies are seen through it.
    pub(super) health: Arc<NodeHealth>,
    /// The copies, through node health with Redis.
    pub(super) copies: Arc<dyn CopyStore>,
    /// Each family's split records.
    pub(super) splits: Arc<dyn SplitStore>,
    /// The registry, the session key and status summaries.
    pub(super) fleet: Arc<dyn FleetStore>,
    /// Kind, primaries, replicas, heartbeats, pings.
    pub(super) topology: Arc<dyn TopologyStore>,
    /// The function library.
    pub(super) library: Arc<dyn LibraryStore>,
    /// The layout records, the live sets and the copies a sweep deletes.
    pub(super) layout_stores: LayoutStores,
    /// The configured families.
    pub(super) families: Arc<Families>,
    /// This instance in the live sets.
    pub(super) liveness: Liveness,
    /// Each family's recorded layout, and the split index.
    pub(super) layouts: Arc<Layouts>,
    /// Client-side caching's tracking table, told of every copy `copies` changes.
    pub(super) tracking: Arc<Tracking>,
    /// The invalidation feed's connections; `None` on the embedded store.
    pub(super) feed: Option<Arc<dyn FeedStore>>,
}

impl Recorded {
    /// Connects the store and records each family's layout before anything else can fail or
    /// start: this instance joins every split set, then every family's live set.
    ///
    /// # Errors
    /// As [`Connected::connect`] and [`Layouts::reconcile`].
    pub(super) async fn connect(
        config: &Config,
        metrics: &Arc<Metrics>,
        instance: &str,
    ) -> Result<Recorded> {
        let connected =
            Connected::connect(&config.store, config.version_retention(), metrics).await?;
        // With Redis, the copies are seen through node health: a node known to be failing
        // costs no command timeout (`heal::health`).
        let health = NodeHealth::new();
        let Roles {
            copies,
            layouts: layout_records,
            splits,
            fleet,
            topology,
            library,
            feed,
        } = connected.roles(&health);
        // Every part writes copies through the tracking table's notice: a change made here
        // invalidates the client-side caches that may hold the key, whichever path made it.
        let tracking = Arc::new(Tracking::new(config.resp.tracking_limits(), Some(metrics)));
        let unnoticed = copies.clone();
        let copies: Arc<dyn CopyStore> = Arc::new(Noticing::new(copies, tracking.clone()));
        // The layout sweeps delete copies no reader is answered from (beyond a shrunk count,
        // the names a closed placement window no longer writes): not a change of any key.
        let layout_stores = LayoutStores {
            layouts: layout_records,
            copies: unnoticed,
            fleet: fleet.clone(),
        };
        let liveness = Liveness {
            instance: instance.to_owned(),
            release: crate::fleet::registry::RELEASE.to_owned(),
            interval: config.heal.layout_interval,
            command_timeout: config.store.command_timeout,
        };
        // A family whose config names no placement gets one before anything joins or serves.
        let families = Arc::new(
            crate::layout::choose_placements(&layout_stores, config.families(), &liveness).await?,
        );
        // Before the family live sets: an instance live in a family is in its split set too.
        crate::layout::join_split_sets(
            &*layout_stores.layouts,
            &families,
            &liveness.instance,
            liveness.interval,
        )
        .await;
        let layouts = Layouts::reconcile(&layout_stores, &families, metrics, &liveness).await?;
        Ok(Recorded {
            connected,
            health,
            copies,
            splits,
            fleet,
            topology,
            library,
            layout_stores,
            families,
            liveness,
            layouts,
            tracking,
            feed,
        })
    }
}

/// The healing parts: the retry queue (with its spool on Redis), the purger or the prober, the
/// scrub and the retry worker.
pub(super) struct Healing {
    /// The retry queue, replayed from its spool with Redis.
    pub(super) retry_queue: Arc<RetryQueue>,
    /// The embedded store's purger; `None` with Redis.
    pub(super) purger: Option<Purger>,
    /// The prober of failing nodes; `None` on the embedded store.
    pub(super) health_prober: Option<HealthProber>,
    /// The scrub; `None` on the embedded store or with `scrub.enabled = false`.
    pub(super) scrubber: Option<Scrubber>,
    /// The scrub's figures, shown whether or not it runs.
    pub(super) scrub_status: Arc<ScrubStatus>,
    /// Flushes the retry queue.
    pub(super) retry_worker: RetryWorker,
}

impl Healing {
    /// Opens the retry queue (locking and replaying its spool with Redis) and makes the parts
    /// that heal around it.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Io`] when the spool cannot be opened or another process holds its
    /// lock.
    pub(super) fn open(
        config: &Config,
        metrics: &Arc<Metrics>,
        recorded: &Recorded,
    ) -> Result<Healing> {
        // The scrub runs with Redis only: the embedded store never fails a copy write, so its
        // copies never fall behind one another.
        let scan = match &recorded.connected {
            Connected::Redis(redis) if config.scrub.enabled => Some(redis.clone()),
            _ => None,
        };
        let instance = &recorded.liveness.instance;
        let scrub_status = Arc::new(ScrubStatus::new(metrics, scan.is_some(), instance));
        let scrubber = scan.map(|scan| Scrubber {
            copies: recorded.copies.clone(),
            scan,
            health: recorded.health.clone(),
            families: recorded.families.clone(),
            layouts: recorded.layouts.clone(),
            status: scrub_status.clone(),
            config: config.scrub.clone(),
            instance: instance.clone(),
            split_index_max_age: recorded.liveness.interval + recorded.liveness.command_timeout,
        });
        let (retry_queue, purger, health_prober) = queue_and_helpers(config, metrics, recorded)?;
        // The worker's final drain ends before the grace period does, so its leftovers are
        // logged.
        let drain_for = config.server.shutdown_grace.mul_f64(0.8);
        let retry_worker = RetryWorker::new(
            retry_queue.clone(),
            recorded.copies.clone(),
            metrics.clone(),
            config.heal.flush_batch,
            drain_for,
        )
        .with_health(recorded.health.clone());
        Ok(Healing {
            retry_queue,
            purger,
            health_prober,
            scrubber,
            scrub_status,
            retry_worker,
        })
    }
}

/// The retry queue and what runs beside it: the purger on the embedded store, the prober of
/// failing nodes with Redis.
fn queue_and_helpers(
    config: &Config,
    metrics: &Arc<Metrics>,
    recorded: &Recorded,
) -> Result<(Arc<RetryQueue>, Option<Purger>, Option<HealthProber>)> {
    match &recorded.connected {
        // The embedded store never fails a single copy write (a publish past its memory bound
        // is refused whole, before any copy changes): nothing to spool.
        Connected::Memory(memory) => Ok((
            Arc::new(RetryQueue::in_memory(config.heal.clone(), metrics.clone())),
            Some(Purger {
                store: memory.clone(),
                interval: Duration::from_secs(1),
            }),
            None,
        )),
        Connected::Redis(redis) => {
            let placement = recorded.copies.clone();
            let queue = RetryQueue::open(
                config.heal.clone(),
                config.server.max_value_bytes,
                metrics.clone(),
                move |copy_key| placement.node_of(copy_key),
            )?;
            tracing::info!(spool = %config.heal.spool_dir.display(), entries = queue.depth(), "retry spool opened");
            let queue = Arc::new(queue);
            recorded.health.attach_queue(queue.clone());
            let prober = HealthProber {
                health: recorded.health.clone(),
                store: redis.clone(),
                queue: queue.clone(),
                interval: config.heal.probe_interval,
                timeout: config.heal.probe_timeout,
                misses_to_fail: config.heal.probe_misses,
            };
            Ok((queue, None, Some(prober)))
        }
    }
}

/// The background tasks of a built service, ready to start.
pub(super) struct Background {
    /// Drops expired copies from the embedded store; `None` with Redis.
    pub(super) purger: Option<Purger>,
    /// Probes failing nodes and returns them to service; `None` on the embedded store.
    pub(super) health_prober: Option<HealthProber>,
    /// Probes failing nodes and flushes the retry queue.
    pub(super) retry_worker: RetryWorker,
    /// Re-reads the layout records and sweeps shrunk families.
    pub(super) layout_watcher: LayoutWatcher,
    /// Writes and reads heartbeats.
    pub(super) lag_monitor: LagMonitor,
    /// Keeps this instance's registry entry alive.
    pub(super) registrar: Registrar,
    /// Deletes older releases' function libraries once no registered instance runs them.
    pub(super) retirer: LibraryRetirer,
    /// Stores this instance's figures for the other instances' status pages.
    pub(super) status_publisher: StatusPublisher,
    /// Repairs copies missing or behind while it holds the lease; `None` on the embedded
    /// store or with `scrub.enabled = false`.
    pub(super) scrubber: Option<Scrubber>,
    /// Refreshes the index of split keys and moves them through the split protocol.
    pub(super) splitter: Splitter,
    /// The invalidation feed; `None` on the embedded store or with `feed.disabled`.
    pub(super) feed: Option<Feed>,
}

/// What [`background`] takes from the wired state.
pub(super) struct Wired<'a> {
    /// The state both doors serve.
    pub(super) state: &'a AppState,
    /// This instance's registry entry.
    pub(super) registry: &'a Arc<Registry>,
    /// The lag monitor, made with the route metrics the wiring registered.
    pub(super) lag_monitor: LagMonitor,
}

/// The background tasks, from the recorded store, the healing parts and the wired state.
pub(super) async fn background(
    config: &Config,
    recorded: Recorded,
    healing: Healing,
    wired: Wired<'_>,
) -> Background {
    let Wired {
        state,
        registry,
        lag_monitor,
    } = wired;
    let metrics = state.metrics();
    let splitter = split_driver(config, &recorded, state).await;
    let feed = feed(config, &recorded, state, &registry.id());
    let status_publisher = StatusPublisher {
        sources: Arc::new(Sources::new(
            state.ops().reader(),
            state.inner().heal.clone(),
        )),
        store: state.inner().fleet.clone(),
        id: registry.id(),
        interval: config.fleet.heartbeat_interval,
        ttl: config.fleet.entry_ttl(),
    };
    Background {
        purger: healing.purger,
        health_prober: healing.health_prober,
        retry_worker: healing.retry_worker,
        layout_watcher: LayoutWatcher {
            stores: recorded.layout_stores,
            layouts: recorded.layouts,
            families: recorded.families,
            metrics: metrics.clone(),
            liveness: recorded.liveness,
            sweep_interval: config.heal.sweep_interval,
        },
        lag_monitor,
        registrar: Registrar {
            registry: registry.clone(),
            interval: config.fleet.heartbeat_interval,
        },
        retirer: LibraryRetirer {
            store: recorded.library,
            registry: registry.clone(),
            interval: config.fleet.retire_interval,
            grace: config.fleet.entry_ttl(),
            metrics: metrics.register_with(RetireMetrics::register),
        },
        status_publisher,
        scrubber: healing.scrubber,
        splitter,
        feed,
    }
}

/// The invalidation feed, with Redis and unless `feed.disabled`.
fn feed(config: &Config, recorded: &Recorded, state: &AppState, instance: &str) -> Option<Feed> {
    let store = recorded.feed.clone().filter(|_| !config.feed.disabled)?;
    let classes = state.ops().router().classes();
    Some(Feed::new(FeedParts {
        store,
        topology: recorded.topology.clone(),
        tracking: recorded.tracking.clone(),
        near: state.ops().reader().near_cache().cloned(),
        instance: instance.to_owned(),
        max_silence: config.feed.silence_bound(&classes),
        metrics: state.metrics(),
        state: recorded.tracking.feed().clone(),
    }))
}

/// The split driver over the wired state's hot-key detector, its records read once before the
/// instance serves (so every publish writes the copies another instance's readers use).
async fn split_driver(config: &Config, recorded: &Recorded, state: &AppState) -> Splitter {
    let splitter = Splitter::new(SplitterParts {
        store: recorded.splits.clone(),
        live: recorded.layout_stores.layouts.clone(),
        instance: recorded.liveness.instance.clone(),
        copies: recorded.copies.clone(),
        layouts: recorded.layouts.clone(),
        families: recorded.families.clone(),
        policies: config.split_policies(),
        hot: state.ops().reader().hot_keys().cloned(),
        interval: recorded.liveness.interval,
        settle: recorded.liveness.settle(),
    });
    if let Err(err) = splitter.load().await {
        tracing::warn!(error = %err, "cannot read the split records at startup; retried every layout interval");
    }
    splitter
}

/// The lag monitor. It always runs: a read may name a replica class on any family, and the lag
/// it finds must be measured, not missing. With no replicas (embedded store, a standalone Redis
/// without configured replicas) it has nothing to do on each tick.
pub(super) fn lag_monitor(
    config: &Config,
    probe: crate::heal::StoreProbe,
    table: Arc<LagTable>,
    instance: String,
    metrics: Arc<RouteMetrics>,
) -> LagMonitor {
    LagMonitor {
        probe,
        table,
        instance,
        // About once a second, whatever the interval.
        offset_every: u32::try_from(
            Duration::from_secs(1).as_micros() / config.route.heartbeat_interval.as_micros().max(1),
        )
        .unwrap_or(u32::MAX)
        .max(1),
        metrics,
    }
}
