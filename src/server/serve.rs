//! Serving a built [`Service`]: binding its listeners, starting the background tasks on its
//! tracker, serving until the shutdown future resolves, and draining.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::build::Background;
use super::{Listeners, Service};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::http::listener::{ConnectionMetrics, Listener, ListenerMetrics, Role};
use crate::http::{admin_app, app, data_app, AppState};
use crate::reload::{ConfigSource, HangupReloader, Reloader};
use crate::resp::{Door, RespListener};
use crate::route::WarmUpWatch;

impl Service {
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
            resp,
            tls,
            reloader,
            config_source,
        } = self;
        let bound = match Bound::of(listeners, &resp).await {
            Ok(bound) => bound,
            Err(err) => {
                spool_owner.close().await;
                return Err(err);
            }
        };
        let tasks = Tasks { tracker, cancel };
        registry.set_listen(advertise.unwrap_or_else(|| bound.local.to_string()));
        tasks.start_background(background, &state);
        if let Some(source) = config_source {
            tasks.start_hangup(reloader, source);
        }
        let doors = Doors {
            server: &server,
            resp: &resp,
            tls,
        };
        tasks.start_doors(bound, &state, &doors);
        tasks.decide_on(shutdown, state, server.drain_delay);
        tasks.drain(server.shutdown_grace).await;
        // Whatever was not drained is in the spool; sync it and release the directory.
        spool_owner.close().await;
        Ok(())
    }
}

/// Every socket a service serves on, bound, with the addresses it logs.
struct Bound {
    /// The data listener (every route without an admin listener).
    data: TcpListener,
    /// Its local address.
    local: SocketAddr,
    /// The admin listener, and its local address.
    admin: Option<(TcpListener, SocketAddr)>,
    /// The Redis-protocol listener, when `[resp] listen` is set.
    resp: Option<TcpListener>,
}

impl Bound {
    /// Reads the listeners' local addresses and binds the Redis-protocol listener, before any
    /// task starts, so a port that is taken fails the start as a taken HTTP port does.
    async fn of(listeners: Listeners, resp: &crate::resp::RespConfig) -> Result<Bound> {
        let Listeners { data, admin } = listeners;
        let local = data.local_addr()?;
        let admin = match admin {
            Some(admin) => {
                let address = admin.local_addr()?;
                Some((admin, address))
            }
            None => None,
        };
        let resp = match resp.listen {
            Some(address) => Some(bind(address).await?),
            None => None,
        };
        Ok(Bound {
            data,
            local,
            admin,
            resp,
        })
    }
}

/// What the doors are served with.
struct Doors<'a> {
    /// `[server]`: limits, timeouts, the drain.
    server: &'a crate::door::ServerConfig,
    /// `[resp]`.
    resp: &'a crate::resp::RespConfig,
    /// The TLS acceptor of both doors, when `server.tls_*` is set.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// The tracker every task runs on and the token that tells them to stop.
struct Tasks {
    /// Every spawned task, waited for on shutdown.
    tracker: TaskTracker,
    /// Cancelled when the drain delay ends.
    cancel: CancellationToken,
}

impl Tasks {
    /// Starts every background task of `background`, and the ones of the state (the warm-up
    /// watch, the hot-key detector).
    fn start_background(&self, background: Background, state: &AppState) {
        let (tracker, cancel) = (&self.tracker, &self.cancel);
        if let Some(purger) = background.purger {
            tracker.spawn(purger.run(cancel.clone()));
        }
        if let Some(prober) = background.health_prober {
            tracker.spawn(prober.run(cancel.clone()));
        }
        tracker.spawn(background.retry_worker.run(cancel.clone()));
        tracker.spawn(background.layout_watcher.run(cancel.clone()));
        tracker.spawn(background.lag_monitor.run(cancel.clone()));
        let warm_up = state.warm_up().clone();
        tracker.spawn(WarmUpWatch { warm_up }.run(cancel.clone()));
        tracker.spawn(background.registrar.run(cancel.clone()));
        tracker.spawn(background.retirer.run(cancel.clone()));
        tracker.spawn(background.status_publisher.run(cancel.clone()));
        if let Some(hot) = state.ops().reader().hot_keys() {
            tracker.spawn(hot.clone().run(cancel.clone()));
        }
        tracker.spawn(background.splitter.run(cancel.clone()));
        tracker.spawn(state.ops().tracking().clone().run_clock(cancel.clone()));
        if let Some(feed) = background.feed {
            tracker.spawn(feed.run(cancel.clone()));
        }
        if let Some(scrubber) = background.scrubber {
            tracker.spawn(scrubber.run(cancel.clone()));
        }
    }

    /// Reloads on SIGHUP. Registered before the port answers: a SIGHUP that found no handler
    /// would end the process (its default action).
    fn start_hangup(&self, reloader: Reloader, source: ConfigSource) {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangups) => {
                let reload = HangupReloader {
                    reloader,
                    source,
                    hangups,
                };
                self.tracker.spawn(reload.run(self.cancel.clone()));
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGHUP; config reload is off")
            }
        }
    }

    /// Serves HTTP on the data listener (the data routes only when there is an admin listener,
    /// which serves the admin routes) and the Redis protocol on its listener.
    fn start_doors(&self, bound: Bound, state: &AppState, doors: &Doors<'_>) {
        let connection_metrics = state
            .inner()
            .metrics
            .register_with(ConnectionMetrics::register);
        let data_routes = match &bound.admin {
            Some(_) => data_app(state.clone()),
            None => app(state.clone()),
        };
        let listen = |role, tcp, routes| {
            let metrics = ListenerMetrics::for_role(&connection_metrics, role);
            let listener =
                Listener::new(role, tcp, routes, doors.server, metrics).with_tls(doors.tls.clone());
            self.tracker
                .spawn(listener.run(self.cancel.clone(), self.tracker.clone()));
        };
        let admin_address = bound.admin.as_ref().map(|(_, address)| *address);
        listen(Role::Data, bound.data, data_routes);
        if let Some((admin, _)) = bound.admin {
            listen(Role::Admin, admin, admin_app(state.clone()));
        }
        if let Some(tcp) = bound.resp {
            self.start_resp(tcp, state, doors);
        }
        let scheme = if doors.tls.is_some() { "https" } else { "http" };
        let local = bound.local;
        // The runtime's workers (`server.worker_threads`, or one per CPU).
        let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
        match admin_address {
            Some(admin) => {
                tracing::info!(listen = %local, admin = %admin, scheme, worker_threads, "hotsplit is serving")
            }
            None => tracing::info!(listen = %local, scheme, worker_threads, "hotsplit is serving"),
        }
    }

    /// Serves the Redis protocol on `tcp`.
    fn start_resp(&self, tcp: TcpListener, state: &AppState, doors: &Doors<'_>) {
        let tls = doors.tls.clone();
        match tcp.local_addr() {
            Ok(address) => {
                tracing::info!(listen = %address, tls = tls.is_some(), "serving the Redis protocol")
            }
            Err(err) => {
                tracing::warn!(error = %err, "the Redis-protocol listener has no local address")
            }
        }
        let door = Door::new(state.core().clone());
        let listener = RespListener::new(tcp, door, doors.resp, doors.server, tls);
        self.tracker
            .spawn(listener.run(self.cancel.clone(), self.tracker.clone()));
    }

    /// Decide: the caller's shutdown future (signals, or a test's channel) starts the drain:
    /// `/readyz` turns 503 at once, the listeners keep serving for `drain_delay` so load
    /// balancers notice, then the token is cancelled and they close.
    fn decide_on(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        state: AppState,
        drain_delay: std::time::Duration,
    ) {
        let decide = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = shutdown => {
                    state.start_draining();
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
    }

    /// Tell and wait: once the token is cancelled, in-flight requests and every task drain
    /// within `grace`, or a warning says how many were cut off.
    async fn drain(self, grace: std::time::Duration) {
        self.cancel.cancelled().await;
        tracing::info!(grace = ?grace, "shutting down: draining requests and background tasks");
        self.tracker.close();
        let drained = tokio::time::timeout(grace, self.tracker.wait()).await;
        match drained {
            Ok(()) => tracing::info!("shutdown complete"),
            Err(_) => {
                tracing::warn!(grace = ?grace, tasks = self.tracker.len(), "shutdown grace period ended with work still running");
            }
        }
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
