//! The service: builds every part from a validated config, then serves, and owns every
//! background task.
//!
//! Startup is build, then bind, then serve. [`Service::build`] does every step that can fail —
//! validate the config, connect the store, load its function library, reconcile the family
//! layouts, lock and replay the retry spool — and binds nothing, so the binary finds a wrong
//! Redis URL or a spool another process owns before it takes its port. [`Service::serve`] takes
//! a bound listener and a shutdown future, so tests bind `127.0.0.1:0`; it starts the
//! background tasks and the HTTP server. [`run`] is both in one call.
//!
//! Shutdown is decide (the future resolves) → tell (a [`CancellationToken`] reaches every task
//! and the HTTP server stops accepting) → wait (in-flight requests and tracked tasks drain
//! within `server.shutdown_grace`, or a warning names what was cut off). The retry worker keeps
//! draining the retry queue for most of the grace period and logs what it leaves in the spool.

//!
//! # Layout
//! - this file: [`Service`] and [`Service::build`];
//! - `serve`: binding, serving, draining, and [`run`];
//! - `state`: the HTTP state's parts and [`app_state`];
//! - `store`: the connected store and the roles each part gets;
//! - `purger`: the embedded store's purger.
//!
//! The Redis-protocol listener (`[resp] listen`) is bound and started by `serve` beside the
//! HTTP listeners, on the same tracker and cancel token, over the same state
//! ([`crate::resp::Door`]).

mod purger;
mod serve;
mod state;
mod store;

pub use serve::run;
pub use state::{app_state, StateParts};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::door::ServerConfig;
use crate::error::Result;
use crate::fleet::{LibraryRetirer, Registrar, Registry, RetireMetrics};
use crate::heal::{
    HealthProber, NodeHealth, RetryQueue, RetryWorker, ScrubStatus, Scrubber, StoreProbe,
};
use crate::http::listener::tls;
use crate::http::AppState;
use crate::layout::{LayoutStores, LayoutWatcher, Layouts, Liveness};
use crate::logging::LogFilter;
use crate::metrics::Metrics;
use crate::ops::Ops;
use crate::reload::{ConfigSource, Reloader};
use crate::route::{LagMonitor, LagTable};
use crate::status::{Sources, StatusPublisher};
use purger::Purger;
use store::{deployment_session_key, Connected, Roles};

/// A service built from a validated config, with nothing bound and no task started yet.
pub struct Service {
    /// The `[server]` settings: the listeners' timeouts and limits, and how long shutdown waits
    /// for requests and tasks.
    server: ServerConfig,
    /// The handlers' state.
    state: AppState,
    /// The retry queue, kept to close its spool at the end.
    retry_queue: Arc<RetryQueue>,
    /// Every task the service starts; drained at shutdown.
    tracker: TaskTracker,
    /// Cancelled to tell every task to stop.
    cancel: CancellationToken,
    /// The background tasks [`Service::serve`] starts.
    background: Background,
    /// This instance's registry entry; its API address is filled in when it serves.
    registry: Arc<Registry>,
    /// The address the registry gives for the API (`fleet.advertise`); `None`: the bound one.
    advertise: Option<String>,
    /// `[admin] listen`: where the admin routes are served, apart from the data routes.
    admin_listen: Option<SocketAddr>,
    /// `[resp]`: the Redis-protocol listener, served when `resp.listen` is set.
    resp: crate::resp::RespConfig,
    /// The listeners' TLS, from `server.tls_cert_file` and `server.tls_key_file`.
    tls: Option<TlsAcceptor>,
    /// Applies a reloaded config to the running parts (tokens, classes, log filter).
    reloader: Reloader,
    /// Where a SIGHUP reads the new config; `None`: SIGHUP is not handled (embedding, tests).
    config_source: Option<ConfigSource>,
}

/// The bound sockets a service serves on.
pub struct Listeners {
    /// `server.listen`: the data routes, and the admin routes too when `admin` is `None`.
    pub data: TcpListener,
    /// `[admin] listen`: the admin routes only.
    pub admin: Option<TcpListener>,
}

/// The background tasks of a built service, ready to start.
struct Background {
    /// Drops expired copies from the embedded store; `None` with Redis.
    purger: Option<Purger>,
    /// Probes failing nodes and returns them to service; `None` on the embedded store.
    health_prober: Option<HealthProber>,
    /// Probes failing nodes and flushes the retry queue.
    retry_worker: RetryWorker,
    /// Re-reads the layout records and sweeps shrunk families.
    layout_watcher: LayoutWatcher,
    /// Writes and reads heartbeats.
    lag_monitor: LagMonitor,
    /// Keeps this instance's registry entry alive.
    registrar: Registrar,
    /// Deletes older releases' function libraries once no registered instance runs them.
    retirer: LibraryRetirer,
    /// Stores this instance's figures for the other instances' status pages.
    status_publisher: StatusPublisher,
    /// Repairs copies missing or behind while it holds the lease; `None` on the embedded
    /// store or with `scrub.enabled = false`.
    scrubber: Option<Scrubber>,
    /// Refreshes the index of split keys and moves them through the split protocol.
    splitter: crate::layout::Splitter,
}

impl Service {
    /// Does every startup step that can fail, and binds nothing: validates `config`, connects
    /// the store (and loads its function library), reconciles each family's layout record,
    /// and, with Redis, locks and replays the retry spool.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the config is invalid; [`ErrorKind::Unavailable`] or
    /// [`ErrorKind::Timeout`] when Redis cannot be reached or the library not loaded (the
    /// message names the URL); [`ErrorKind::Io`] when the spool cannot be opened or another
    /// process holds its lock (the message names the spool).
    pub async fn build(config: Config) -> Result<Service> {
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
        let metrics = Metrics::new();
        let tracker = TaskTracker::new();
        let cancel = CancellationToken::new();
        // One name for this process in every shared record: live sets, heartbeats, registry.
        let instance = instance_name();

        let connected =
            Connected::connect(&config.store, config.version_retention(), &metrics).await?;
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
        } = connected.roles(&health);
        let layout_stores = LayoutStores {
            layouts: layout_records,
            copies: copies.clone(),
            fleet: fleet.clone(),
        };
        // Record each family's layout before anything else can fail or start.
        let families = Arc::new(config.families());
        let liveness = Liveness {
            instance: instance.clone(),
            release: crate::fleet::registry::RELEASE.to_owned(),
            interval: config.heal.layout_interval,
            command_timeout: config.store.command_timeout,
        };
        // Before the family live sets: an instance live in a family is in its split set too.
        crate::layout::join_split_sets(
            &*layout_stores.layouts,
            &families,
            &liveness.instance,
            liveness.interval,
        )
        .await;
        let layouts = Layouts::reconcile(&layout_stores, &families, &metrics, &liveness).await?;
        // The scrub runs with Redis only: the embedded store never fails a copy write, so its
        // copies never fall behind one another.
        let scan = match &connected {
            Connected::Redis(redis) if config.scrub.enabled => Some(redis.clone()),
            _ => None,
        };
        let scrub_status = Arc::new(ScrubStatus::new(&metrics, scan.is_some(), &instance));
        let scrubber = scan.map(|scan| Scrubber {
            copies: copies.clone(),
            scan,
            health: health.clone(),
            families: families.clone(),
            layouts: layouts.clone(),
            status: scrub_status.clone(),
            config: config.scrub.clone(),
            instance: liveness.instance.clone(),
            split_index_max_age: liveness.interval + liveness.command_timeout,
        });
        let (retry_queue, purger, health_prober) = match connected {
            // The embedded store never fails a single copy write (a publish past its memory bound
            // is refused whole, before any copy changes): nothing to spool.
            Connected::Memory(memory) => (
                Arc::new(RetryQueue::in_memory(config.heal.clone(), metrics.clone())),
                Some(Purger {
                    store: memory,
                    interval: Duration::from_secs(1),
                }),
                None,
            ),
            Connected::Redis(redis) => {
                let placement = copies.clone();
                let queue = RetryQueue::open(
                    config.heal.clone(),
                    config.server.max_value_bytes,
                    metrics.clone(),
                    move |copy_key| placement.node_of(copy_key),
                )?;
                tracing::info!(spool = %config.heal.spool_dir.display(), entries = queue.depth(), "retry spool opened");
                let queue = Arc::new(queue);
                health.attach_queue(queue.clone());
                let prober = HealthProber {
                    health: health.clone(),
                    store: redis,
                    queue: queue.clone(),
                    interval: config.heal.probe_interval,
                    timeout: config.heal.probe_timeout,
                    misses_to_fail: config.heal.probe_misses,
                };
                (queue, None, Some(prober))
            }
        };
        // The worker's final drain ends before the grace period does, so its leftovers are
        // logged.
        let drain_for = config.server.shutdown_grace.mul_f64(0.8);
        let retry_worker = RetryWorker::new(
            retry_queue.clone(),
            copies.clone(),
            metrics.clone(),
            config.heal.flush_batch,
            drain_for,
        );
        let split_families = families.clone();
        let split_live = layout_stores.layouts.clone();
        let split_copies = copies.clone();
        let split_interval = liveness.interval;
        let split_settle = liveness.settle();
        let layout_watcher = LayoutWatcher {
            stores: layout_stores,
            layouts: layouts.clone(),
            families,
            metrics: metrics.clone(),
            liveness,
            sweep_interval: config.heal.sweep_interval,
        };
        let lag = Arc::new(LagTable::new(
            config.route.heartbeat_interval,
            config.route.lag_window,
        ));
        let registry = Arc::new(Registry::new(
            fleet.clone(),
            library.library_name(),
            instance.clone(),
            config.fleet.entry_ttl(),
        ));
        let session_key = deployment_session_key(&*fleet).await;
        let retire_store = library.clone();
        let probe = StoreProbe {
            topology,
            library,
            health,
        };
        let retire_metrics = metrics.register_with(RetireMetrics::register);
        let wired = StateParts {
            session_key,
            registry: registry.clone(),
            copies,
            probe: probe.clone(),
            fleet,
            metrics,
            retry_queue: retry_queue.clone(),
            layouts: layouts.clone(),
            tracker: tracker.clone(),
            lag: lag.clone(),
            scrub: scrub_status,
            warm_up: Some(config.server.readiness_warm_up),
        }
        .wire(&config);
        let (state, route_metrics) = match wired {
            Ok(wired) => wired,
            Err(err) => {
                retry_queue.close().await;
                return Err(err);
            }
        };
        state.tokens().store(tokens);
        let splitter = crate::layout::Splitter::new(
            splits,
            split_live,
            instance.clone(),
            split_copies,
            layouts,
            split_families,
            config.split_policies(),
            state.ops().reader().hot_keys().cloned(),
            split_interval,
            split_settle,
        );
        // Before serving: every publish writes the copies another instance's readers use.
        if let Err(err) = splitter.load().await {
            tracing::warn!(error = %err, "cannot read the split records at startup; retried every layout interval");
        }
        let reloader = Reloader::new(
            config.clone(),
            state.tokens().clone(),
            state.router().clone(),
            &state.metrics(),
        );
        // The lag monitor always runs: a read may name a replica class on any family, and the
        // lag it finds must be measured, not missing. With no replicas (embedded store, a
        // standalone Redis without configured replicas) it has nothing to do on each tick.
        let lag_monitor = LagMonitor {
            probe,
            table: lag,
            instance,
            // About once a second, whatever the interval.
            offset_every: u32::try_from(
                Duration::from_secs(1).as_micros()
                    / config.route.heartbeat_interval.as_micros().max(1),
            )
            .unwrap_or(u32::MAX)
            .max(1),
            metrics: route_metrics,
        };
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
        Ok(Service {
            admin_listen: config.admin.listen,
            resp: config.resp.clone(),
            tls,
            server: config.server.clone(),
            state,
            retry_queue,
            tracker,
            cancel,
            background: Background {
                purger,
                health_prober,
                retry_worker,
                layout_watcher,
                lag_monitor,
                registrar: Registrar {
                    registry: registry.clone(),
                    interval: config.fleet.heartbeat_interval,
                },
                retirer: LibraryRetirer {
                    store: retire_store,
                    registry: registry.clone(),
                    interval: config.fleet.retire_interval,
                    grace: config.fleet.entry_ttl(),
                    metrics: retire_metrics,
                },
                status_publisher,
                scrubber,
                splitter,
            },
            registry,
            advertise: config.fleet.advertise.clone(),
            reloader,
            config_source: None,
        })
    }

    /// Reloads on SIGHUP once serving: `source` loads the new config (the binary's loader, with
    /// its flags and environment), and the reload also sets `log_filter` from
    /// `server.log_level` unless `log_overridden` (a flag or environment variable chose the
    /// filter). See [`crate::reload`] for what applies live.
    pub fn reload_on_hangup(
        mut self,
        source: ConfigSource,
        log_filter: Option<LogFilter>,
        log_overridden: bool,
    ) -> Service {
        if let Some(filter) = log_filter {
            self.reloader = self.reloader.with_log_filter(filter, log_overridden);
        }
        self.config_source = Some(source);
        self
    }

    /// Releases what a built service holds (syncs and unlocks the spool) without serving: for
    /// a caller whose bind failed after the build.
    pub async fn close(self) {
        self.retry_queue.close().await;
    }

    /// The operations the service's doors call, for a second door or a test beside HTTP.
    pub fn ops(&self) -> Ops {
        self.state.ops().clone()
    }
}

/// A name unique to this process, for its heartbeat keys: pid and a random suffix.
pub(super) fn instance_name() -> String {
    format!("{}-{:08x}", std::process::id(), rand::random::<u32>())
}
