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

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::fleet::session::{SessionKey, SessionMetrics};
use crate::fleet::{LibraryRetirer, Registrar, Registry, RetireMetrics, Sessions};
use crate::heal::{
    HealHandles, HealthProber, HealthStore, LayoutStores, LayoutWatcher, Layouts, Liveness,
    NodeHealth, Repairer, RetryQueue, RetryWorker, ScrubStatus, Scrubber, StoreProbe,
};
use crate::http::listener::{tls, ConnectionMetrics, Listener, ListenerMetrics, Role};
use crate::http::{admin_app, app, data_app, AppParts, AppState, RequestLimits, ServerConfig};
use crate::logging::LogFilter;
use crate::metrics::Metrics;
use crate::near::{NearCache, NearMetrics};
use crate::ops::Ops;
use crate::publish::Publisher;
use crate::read::Reader;
use crate::reload::{ConfigSource, HangupReloader, Reloader};
use crate::route::{LagMonitor, LagTable, Route, RouteMetrics, Router, WarmUp, WarmUpWatch};
use crate::status::{Sources, StatusPublisher};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::{CopyStore, FleetStore, LayoutStore, LibraryStore, StoreConfig, TopologyStore};

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
        .with_repairer(repairer);
        if let Some(near) = near {
            publisher = publisher.with_near_cache(near.clone());
            reader = reader.with_near_cache(near);
        }
        let state = AppState::new(AppParts {
            ops: Ops::new(publisher, reader, sessions),
            store: probe,
            fleet,
            metrics,
            max_value_bytes: config.server.max_value_bytes,
            retry_after: config.read.retry_after,
            heal: HealHandles {
                retry_queue,
                layouts,
                scrub,
            },
            registry,
            limits: RequestLimits::from(&config.server),
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

/// The store the config names, connected.
enum Connected {
    /// The embedded store (`store.redis` unset); the service purges its expired copies.
    Memory(Arc<MemoryStore>),
    /// Redis, reachable, its function library loaded.
    Redis(Arc<RedisStore>),
}

impl Connected {
    /// Connects Redis when `store.redis` is set, else makes the embedded store; either keeps
    /// an expired copy's version for `version_retention`.
    async fn connect(
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
    fn roles(&self, health: &Arc<NodeHealth>) -> Roles {
        match self {
            Connected::Memory(memory) => Roles {
                copies: memory.clone(),
                layouts: memory.clone(),
                fleet: memory.clone(),
                topology: memory.clone(),
                library: memory.clone(),
            },
            Connected::Redis(redis) => Roles {
                copies: Arc::new(HealthStore::new(redis.clone(), health.clone())),
                layouts: redis.clone(),
                fleet: redis.clone(),
                topology: redis.clone(),
                library: redis.clone(),
            },
        }
    }
}

/// The store's roles, each part given the ones it uses ([`crate::store::roles`]).
struct Roles {
    /// The copies, through node health with Redis.
    copies: Arc<dyn CopyStore>,
    /// The layout records and live sets.
    layouts: Arc<dyn LayoutStore>,
    /// The registry, the session key and status summaries.
    fleet: Arc<dyn FleetStore>,
    /// Kind, primaries, replicas, heartbeats, pings.
    topology: Arc<dyn TopologyStore>,
    /// The function library.
    library: Arc<dyn LibraryStore>,
}

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
                tracing::warn!(listen = %config.server.listen, "server.allow_unauthenticated: serving without tokens on a non-loopback address: anyone who reaches it can read and write every key")
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
            layouts,
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

    /// Binds `server.listen`, and `[admin] listen` when it is set.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] naming the address that cannot be bound.
    pub async fn bind(&self) -> Result<Listeners> {
        let data = bind(self.server.listen).await?;
        let admin = match self.admin_listen {
            Some(address) => Some(bind(address).await?),
            None => None,
        };
        Ok(Listeners { data, admin })
    }

    /// Starts the background tasks and serves HTTP on `listener` (and on `[admin] listen`,
    /// which it binds, when that is set) until `shutdown` resolves, then drains within
    /// `server.shutdown_grace`.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the admin address cannot be bound or a listener has no local
    /// address.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let admin = match self.admin_listen {
            Some(address) => match bind(address).await {
                Ok(admin) => Some(admin),
                Err(err) => {
                    self.close().await;
                    return Err(err);
                }
            },
            None => None,
        };
        self.serve_on(
            Listeners {
                data: listener,
                admin,
            },
            shutdown,
        )
        .await
    }

    /// Starts the background tasks and serves HTTP on `listeners` until `shutdown` resolves,
    /// then drains within `server.shutdown_grace`. With an admin listener, the data listener
    /// serves the data routes only and the admin listener the admin routes.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when a listener has no local address.
    pub async fn serve_on(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let Service {
            server,
            state,
            retry_queue: spool_owner,
            tracker,
            cancel,
            background,
            registry,
            advertise,
            admin_listen: _,
            tls,
            reloader,
            config_source,
        } = self;
        let Listeners {
            data: listener,
            admin,
        } = listeners;
        let grace = server.shutdown_grace;
        let addresses = listener.local_addr().and_then(|local| {
            let admin_local = admin.as_ref().map(TcpListener::local_addr).transpose()?;
            Ok((local, admin_local))
        });
        let (local, admin_local) = match addresses {
            Ok(addresses) => addresses,
            Err(err) => {
                spool_owner.close().await;
                return Err(err.into());
            }
        };
        if let Some(purger) = background.purger {
            tracker.spawn(purger.run(cancel.clone()));
        }
        if let Some(prober) = background.health_prober {
            tracker.spawn(prober.run(cancel.clone()));
        }
        tracker.spawn(background.retry_worker.run(cancel.clone()));
        tracker.spawn(background.layout_watcher.run(cancel.clone()));
        tracker.spawn(background.lag_monitor.run(cancel.clone()));
        tracker.spawn(
            WarmUpWatch {
                warm_up: state.warm_up().clone(),
            }
            .run(cancel.clone()),
        );
        registry.set_listen(advertise.unwrap_or_else(|| local.to_string()));
        tracker.spawn(background.registrar.run(cancel.clone()));
        tracker.spawn(background.retirer.run(cancel.clone()));
        tracker.spawn(background.status_publisher.run(cancel.clone()));
        if let Some(scrubber) = background.scrubber {
            tracker.spawn(scrubber.run(cancel.clone()));
        }
        if let Some(source) = config_source {
            // Registered here, before the port answers: a SIGHUP that found no handler would
            // end the process (its default action).
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(hangups) => {
                    tracker.spawn(
                        HangupReloader {
                            reloader,
                            source,
                            hangups,
                        }
                        .run(cancel.clone()),
                    );
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for SIGHUP; config reload is off")
                }
            }
        }
        let connection_metrics = state
            .inner()
            .metrics
            .register_with(ConnectionMetrics::register);
        let drain_state = state.clone();
        let data_routes = match &admin {
            Some(_) => data_app(state.clone()),
            None => app(state.clone()),
        };
        let data = Listener::new(
            Role::Data,
            listener,
            data_routes,
            &server,
            ListenerMetrics::for_role(&connection_metrics, Role::Data),
            tls.clone(),
        );
        tracker.spawn(data.run(cancel.clone(), tracker.clone()));
        if let Some(admin) = admin {
            let admin = Listener::new(
                Role::Admin,
                admin,
                admin_app(state),
                &server,
                ListenerMetrics::for_role(&connection_metrics, Role::Admin),
                tls.clone(),
            );
            tracker.spawn(admin.run(cancel.clone(), tracker.clone()));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        match admin_local {
            Some(admin_local) => {
                tracing::info!(listen = %local, admin = %admin_local, scheme, "hotsplit is serving")
            }
            None => tracing::info!(listen = %local, scheme, "hotsplit is serving"),
        }

        // Decide: the caller's shutdown future (signals, or a test's channel) starts the drain:
        // `/readyz` turns 503 at once, the listeners keep serving for `server.drain_delay` so
        // load balancers notice, then the token is cancelled and they close.
        let decide = cancel.clone();
        let drain_delay = server.drain_delay;
        tracker.spawn(async move {
            tokio::select! {
                () = shutdown => {
                    drain_state.start_draining();
                    tracing::info!(drain_delay = ?drain_delay, "draining: /readyz answers 503; the listeners close after the drain delay");
                    tokio::select! {
                        () = tokio::time::sleep(drain_delay) => {}
                        () = decide.cancelled() => {}
                    }
                    decide.cancel();
                }
                () = decide.cancelled() => {}
            }
        });

        cancel.cancelled().await;
        tracing::info!(grace = ?grace, "shutting down: draining requests and background tasks");
        tracker.close();
        let drained = tokio::time::timeout(grace, tracker.wait()).await;
        // Whatever was not drained is in the spool; sync it and release the directory.
        spool_owner.close().await;
        match drained {
            Ok(()) => tracing::info!("shutdown complete"),
            Err(_) => {
                tracing::warn!(grace = ?grace, tasks = tracker.len(), "shutdown grace period ended with work still running");
            }
        }
        Ok(())
    }
}

/// Builds the service from `config` and serves it on `listener` until `shutdown` resolves: a
/// convenience for tests and embedding, which bind before they build.
///
/// # Errors
/// As [`Service::build`] and [`Service::serve`].
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    Service::build(config)
        .await?
        .serve(listener, shutdown)
        .await
}

/// A listening socket on `address`.
async fn bind(address: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .map_err(|err| Error::new(ErrorKind::Io, format!("cannot listen on {address}: {err}")))
}

/// The deployment's session key: the one in the store, or a fresh one stored there. When the
/// store cannot give one (the node that holds it refuses writes or does not answer), a key of
/// this process's own, with a warning: the service still starts, and its tokens are ignored by
/// the other instances (and theirs by it) until it restarts.
async fn deployment_session_key(store: &dyn FleetStore) -> SessionKey {
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
