//! The service: wires config, store, library and HTTP together, and owns every background task.
//!
//! [`run`] takes a bound listener and a shutdown future, so tests bind `127.0.0.1:0`. Shutdown is
//! decide (the future resolves) → tell (a [`CancellationToken`] reaches every task and the HTTP
//! server stops accepting) → wait (in-flight requests and tracked tasks drain within
//! `server.shutdown_grace`, or a warning names what was cut off). The retry worker keeps
//! draining the retry queue for most of the grace period and logs what it leaves in the spool.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::heal::{HealHandles, LayoutWatcher, Layouts, Repairer, RetryQueue, RetryWorker};
use crate::http::{router, AppState};
use crate::metrics::Metrics;
use crate::publish::Publisher;
use crate::read::Reader;
use crate::route::{LagMonitor, LagTable, RouteMetrics, Router};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::Store;

/// Connects the store the config names: Redis when `store.redis` is set, else the embedded one.
///
/// # Errors
/// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Unavailable`] when Redis does not answer
/// within `store.connect_timeout`.
pub async fn connect_store(config: &Config, metrics: Arc<Metrics>) -> Result<Arc<dyn Store>> {
    let retention = config.version_retention();
    match config.store.redis_options()? {
        None => Ok(Arc::new(
            MemoryStore::new().with_version_retention(crate::publish::duration_ms(retention)),
        )),
        Some(mut options) => {
            options.version_retention = retention;
            Ok(Arc::new(RedisStore::connect(options, metrics).await?))
        }
    }
}

/// Builds the HTTP state from a validated config and a connected store, with an in-memory
/// retry queue and read repair on a task tracker of its own, and a lag table no monitor feeds
/// (replica-routed reads go to the primary, reason `no-replica`): for tests and embedding.
///
/// # Errors
/// [`ErrorKind::Config`] when a read class or a family's default class is invalid.
pub fn app_state(
    config: &Config,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
) -> Result<AppState> {
    let retry_queue = Arc::new(RetryQueue::in_memory(config.heal.clone(), metrics.clone()));
    let lag = Arc::new(LagTable::new(
        config.route.heartbeat_interval,
        config.route.lag_window,
    ));
    app_state_with(
        config,
        store,
        metrics,
        retry_queue,
        Layouts::unrecorded(),
        TaskTracker::new(),
        lag,
    )
    .map(|(state, _)| state)
}

/// Builds the HTTP state around `retry_queue` and `lag`; read repairs run on `tracker`. Also
/// returns the routing metrics the lag monitor updates.
///
/// # Errors
/// As [`app_state`].
pub fn app_state_with(
    config: &Config,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    retry_queue: Arc<RetryQueue>,
    layouts: Arc<Layouts>,
    tracker: TaskTracker,
    lag: Arc<LagTable>,
) -> Result<(AppState, Arc<RouteMetrics>)> {
    let families = Arc::new(config.families());
    let classes = config.classes()?;
    let route_metrics =
        Arc::new(metrics.register_with(|registry| RouteMetrics::register(registry, &classes)));
    let router = Arc::new(Router::new(
        &config.route,
        classes,
        families.clone(),
        lag,
        route_metrics.clone(),
    )?);
    let publisher = Publisher::new(store.clone(), families.clone(), metrics.clone())
        .with_retry_queue(retry_queue.clone())
        .with_layouts(layouts.clone())
        .with_expiry_jitter(config.heal.expiry_jitter_min, config.heal.expiry_jitter_max);
    let repairer = Repairer::new(
        store.clone(),
        config.heal.repair_concurrency,
        tracker,
        metrics.clone(),
    );
    let reader = Reader::new(
        store.clone(),
        families,
        config.read.clone(),
        metrics.clone(),
        router,
    )
    .with_repairer(repairer);
    let state = AppState::new(
        publisher,
        reader,
        store,
        metrics,
        config.server.max_value_bytes,
        config.read.retry_after,
        HealHandles {
            retry_queue,
            layouts,
        },
    );
    Ok((state, route_metrics))
}

/// Runs the service on `listener` until `shutdown` resolves.
///
/// # Errors
/// [`ErrorKind::Config`] when the config is invalid (checked before anything else);
/// store connection errors; [`ErrorKind::Io`] when serving fails.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    config.validate()?;
    let metrics = Metrics::new();
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();

    let store: Arc<dyn Store> = match &config.store.redis {
        None => {
            let memory = Arc::new(
                MemoryStore::new().with_version_retention(crate::publish::duration_ms(
                    config.version_retention(),
                )),
            );
            tracing::warn!("running on the embedded in-memory store: values live in this process only; set store.redis (or --redis) to use Redis");
            tracker.spawn(
                Purger {
                    store: memory.clone(),
                    interval: Duration::from_secs(1),
                }
                .run(cancel.clone()),
            );
            memory
        }
        Some(url) => {
            let store = connect_store(&config, metrics.clone()).await?;
            tracing::info!(url = %url, kind = store.kind(), "connected to redis");
            store
        }
    };

    // Record each family's layout before anything else can fail or start.
    let families = Arc::new(config.families());
    let layouts = Layouts::reconcile(&*store, &families, &metrics).await?;
    let retry_queue = match &config.store.redis {
        // The embedded store never fails a copy write: nothing to spool.
        None => Arc::new(RetryQueue::in_memory(config.heal.clone(), metrics.clone())),
        Some(_) => {
            let placement = store.clone();
            let queue = RetryQueue::open(
                config.heal.clone(),
                config.server.max_value_bytes,
                metrics.clone(),
                move |copy_key| placement.node_of(copy_key),
            )?;
            tracing::info!(spool = %config.heal.spool_dir.display(), entries = queue.depth(), "retry spool opened");
            Arc::new(queue)
        }
    };
    // The worker's final drain ends before the grace period does, so its leftovers are logged.
    let drain_for = config.server.shutdown_grace.mul_f64(0.8);
    tracker.spawn(
        RetryWorker::new(
            retry_queue.clone(),
            store.clone(),
            metrics.clone(),
            config.heal.flush_batch,
            drain_for,
        )
        .run(cancel.clone()),
    );
    tracker.spawn(
        LayoutWatcher {
            store: store.clone(),
            layouts: layouts.clone(),
            families,
            metrics: metrics.clone(),
            interval: config.heal.layout_interval,
            sweep_interval: config.heal.sweep_interval,
        }
        .run(cancel.clone()),
    );
    let spool_owner = retry_queue.clone();
    let lag = Arc::new(LagTable::new(
        config.route.heartbeat_interval,
        config.route.lag_window,
    ));
    let (state, route_metrics) = app_state_with(
        &config,
        store.clone(),
        metrics,
        retry_queue,
        layouts,
        tracker.clone(),
        lag.clone(),
    )?;
    // The lag monitor always runs: a read may name a replica class on any family, and the lag
    // it finds must be measured, not missing. With no replicas (embedded store, a standalone
    // Redis without configured replicas) it has nothing to do on each tick.
    tracker.spawn(
        LagMonitor {
            store,
            table: lag,
            instance: instance_name(),
            offset_every: 10,
            metrics: route_metrics,
        }
        .run(cancel.clone()),
    );
    let app = router(state);
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, "hotsplit is serving");

    // Decide: the caller's shutdown future (signals, or a test's channel) cancels the token; so
    // does the HTTP server stopping on its own (an accept loop error).
    let decide = cancel.clone();
    tracker.spawn(async move {
        tokio::select! {
            () = shutdown => decide.cancel(),
            () = decide.cancelled() => {}
        }
    });
    let http_cancel = cancel.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { http_cancel.cancelled().await });
    let grace = config.server.shutdown_grace;
    let server_done = cancel.clone();
    let serving = tracker.spawn(async move {
        let served = server.await;
        server_done.cancel();
        served
    });

    cancel.cancelled().await;
    tracing::info!(grace = ?grace, "shutting down: draining requests and background tasks");
    tracker.close();
    let drained = tokio::time::timeout(grace, async {
        let served = serving.await;
        tracker.wait().await;
        served
    })
    .await;
    // Whatever was not drained is in the spool; sync it and release the directory.
    spool_owner.close().await;
    match drained {
        Ok(Ok(Ok(()))) => {
            tracing::info!("shutdown complete");
            Ok(())
        }
        Ok(Ok(Err(err))) => Err(Error::new(
            ErrorKind::Io,
            format!("http server failed: {err}"),
        )),
        Ok(Err(join)) => Err(Error::new(
            ErrorKind::Io,
            format!("http server task failed: {join}"),
        )),
        Err(_) => {
            tracing::warn!(grace = ?grace, tasks = tracker.len(), "shutdown grace period ended with work still running");
            Ok(())
        }
    }
}

/// A name unique to this process, for its heartbeat keys: pid and a random suffix.
fn instance_name() -> String {
    format!("{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// Drops expired copies from the embedded store periodically.
struct Purger {
    /// The store to purge.
    store: Arc<MemoryStore>,
    /// How often to purge.
    interval: Duration,
}

impl Purger {
    async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {
                    let removed = self.store.purge_expired();
                    if removed > 0 {
                        tracing::debug!(removed, "purged expired copies");
                    }
                }
            }
        }
    }
}
