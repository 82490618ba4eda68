//! Serving a built [`Service`]: binding its listeners, starting the background tasks on its
//! tracker, serving until the shutdown future resolves, and draining.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::{Listeners, Service};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::http::listener::{ConnectionMetrics, Listener, ListenerMetrics, Role};
use crate::http::{admin_app, app, data_app};
use crate::reload::HangupReloader;
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
        // The Redis-protocol listener is bound here, before any task starts, so a port that is
        // taken fails the start as a taken HTTP port does.
        let resp_listener = match resp.listen {
            Some(address) => match bind(address).await {
                Ok(tcp) => Some(tcp),
                Err(err) => {
                    spool_owner.close().await;
                    return Err(err);
                }
            },
            None => None,
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
        if let Some(hot) = state.ops().reader().hot_keys() {
            tracker.spawn(hot.clone().run(cancel.clone()));
        }
        tracker.spawn(background.splitter.run(cancel.clone()));
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
        if let Some(tcp) = resp_listener {
            match tcp.local_addr() {
                Ok(address) => {
                    tracing::info!(listen = %address, tls = tls.is_some(), "serving the Redis protocol")
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the Redis-protocol listener has no local address")
                }
            }
            let listener = RespListener::new(
                tcp,
                Door::new(drain_state.core().clone()),
                &resp,
                &server,
                tls.clone(),
            );
            tracker.spawn(listener.run(cancel.clone(), tracker.clone()));
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
