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

mod build;
mod purger;
mod serve;
mod state;
mod store;

pub use serve::run;
pub use state::{app_state, StateParts};

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::door::ServerConfig;
use crate::error::Result;
use crate::fleet::Registry;
use crate::heal::{RetryQueue, StoreProbe};
use crate::http::AppState;
use crate::logging::LogFilter;
use crate::metrics::Metrics;
use crate::ops::Ops;
use crate::reload::{ConfigSource, Reloader};
use crate::route::LagTable;
use build::Background;
use store::deployment_session_key;

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
        let (tokens, tls) = build::admit(&config)?;
        let metrics = Metrics::new();
        let tracker = TaskTracker::new();
        // One name for this process in every shared record: live sets, heartbeats, registry.
        let instance = instance_name();
        let recorded = build::Recorded::connect(&config, &metrics, &instance).await?;
        let healing = build::Healing::open(&config, &metrics, &recorded)?;
        let lag = Arc::new(LagTable::new(
            config.route.heartbeat_interval,
            config.route.lag_window,
        ));
        let registry = Arc::new(Registry::new(
            recorded.fleet.clone(),
            recorded.library.library_name(),
            instance.clone(),
            config.fleet.entry_ttl(),
        ));
        let probe = StoreProbe {
            topology: recorded.topology.clone(),
            library: recorded.library.clone(),
            health: recorded.health.clone(),
        };
        let wired = StateParts {
            session_key: deployment_session_key(&*recorded.fleet).await,
            registry: registry.clone(),
            copies: recorded.copies.clone(),
            probe: probe.clone(),
            fleet: recorded.fleet.clone(),
            metrics: metrics.clone(),
            retry_queue: healing.retry_queue.clone(),
            layouts: recorded.layouts.clone(),
            families: (*recorded.families).clone(),
            tracker: tracker.clone(),
            lag: lag.clone(),
            scrub: healing.scrub_status.clone(),
            warm_up: Some(config.server.readiness_warm_up),
            tracking: recorded.tracking.clone(),
        }
        .wire(&config);
        let (state, route_metrics) = match wired {
            Ok(wired) => wired,
            Err(err) => {
                healing.retry_queue.close().await;
                return Err(err);
            }
        };
        state.tokens().store(tokens);
        let wired = build::Wired {
            state: &state,
            registry: &registry,
            lag_monitor: build::lag_monitor(&config, probe, lag, instance, route_metrics),
        };
        let background = build::background(&config, recorded, healing, wired).await;
        let reloader = Reloader::new(
            config.clone(),
            state.tokens().clone(),
            state.ops().router().clone(),
            &state.metrics(),
        );
        Ok(Service {
            admin_listen: config.admin.listen,
            resp: config.resp.clone(),
            tls,
            server: config.server.clone(),
            retry_queue: state.inner().heal.retry_queue.clone(),
            state,
            tracker,
            cancel: CancellationToken::new(),
            background,
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
