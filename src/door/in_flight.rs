//! The in-flight bound both doors share: `server.max_in_flight` requests or commands at once,
//! whichever door they came through, and the deadline each starts with
//! (`server.request_deadline`).
//!
//! A slot is an [`InFlight`] guard: taking one is one atomic add on the gauge that is also the
//! bound's counter (`inc` returns the previous value), giving it back one subtract. Unlike a
//! `tokio::sync::Semaphore`, whose release takes its waiters' lock, nothing here ever waits: a
//! request over the bound is refused at once, and each door words and counts its own refusal.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

use super::ServerConfig;
use crate::metrics::{register, Metrics};

/// The request limits of `[server]`, as the doors apply them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// `server.request_deadline`; `None` when it is `0s`.
    pub request_deadline: Option<Duration>,
    /// `server.max_in_flight`; `None` when it is `0`.
    pub max_in_flight: Option<usize>,
    /// `server.max_query_bytes` (the HTTP door's).
    pub max_query_bytes: usize,
    /// `server.max_receiving_bodies` (the HTTP door's); `None` when it is `0`.
    pub max_receiving_bodies: Option<usize>,
    /// `server.max_receiving_bytes` (the HTTP door's); `None` when it is `0`.
    pub max_receiving_bytes: Option<u64>,
}

impl From<&ServerConfig> for RequestLimits {
    fn from(server: &ServerConfig) -> RequestLimits {
        RequestLimits {
            request_deadline: Some(server.request_deadline).filter(|budget| !budget.is_zero()),
            max_in_flight: Some(server.max_in_flight).filter(|bound| *bound > 0),
            max_query_bytes: server.max_query_bytes,
            max_receiving_bodies: Some(server.max_receiving_bodies).filter(|bound| *bound > 0),
            max_receiving_bytes: Some(server.max_receiving_bytes).filter(|bound| *bound > 0),
        }
    }
}

impl Default for RequestLimits {
    fn default() -> RequestLimits {
        RequestLimits::from(&ServerConfig::default())
    }
}

/// `server.max_in_flight` over both doors; see the module documentation.
#[derive(Debug)]
pub struct InFlightBound {
    /// The limits it applies (`max_in_flight`, `request_deadline`), and the HTTP door's others.
    limits: RequestLimits,
    /// Requests and commands in flight on counted routes: the bound's counter and the gauge.
    in_flight: Gauge<i64, AtomicI64>,
}

impl InFlightBound {
    /// The bound over `limits`, its gauge registered in `metrics` (once per service).
    pub fn new(limits: RequestLimits, metrics: &Metrics) -> Arc<InFlightBound> {
        metrics.register_with(|registry| {
            // The name predates the Redis door, whose commands it counts too; dashboards use it.
            let in_flight: Gauge<i64, AtomicI64> = register(
                registry,
                "http_requests_in_flight",
                "Requests (HTTP, on routes the in-flight bound counts: all but /healthz, /readyz and /metrics) and Redis-door commands being handled; 0 when server.max_in_flight is 0",
            );
            Arc::new(InFlightBound { limits, in_flight })
        })
    }

    /// Takes a slot: `Ok(None)` when there is no bound; `Err(bound)` when it is reached
    /// (nothing was counted; the caller counts and words its own refusal).
    pub fn enter(self: &Arc<Self>) -> Result<Option<InFlight>, usize> {
        self.enter_below(|bound| bound)
    }

    /// Takes a slot for a command started ahead of its turn (a pipelined batch's reads sent
    /// together): only while at most half the bound is taken, so one deep pipeline leaves
    /// the other half to the commands that come one at a time. `Err` as [`Self::enter`].
    pub fn enter_ahead(self: &Arc<Self>) -> Result<Option<InFlight>, usize> {
        self.enter_below(|bound| bound / 2)
    }

    /// Takes a slot while fewer than `limit(bound)` are taken; `Err(bound)` otherwise.
    fn enter_below(
        self: &Arc<Self>,
        limit: impl Fn(usize) -> usize,
    ) -> Result<Option<InFlight>, usize> {
        let Some(bound) = self.limits.max_in_flight else {
            return Ok(None);
        };
        let before = self.in_flight.inc();
        let slot = InFlight(self.clone());
        if usize::try_from(before).is_ok_and(|before| before >= limit(bound)) {
            return Err(bound);
        }
        Ok(Some(slot))
    }

    /// `server.request_deadline`; `None` when it is `0s`.
    pub fn request_deadline(&self) -> Option<Duration> {
        self.limits.request_deadline
    }

    /// The limits it was made with.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }
}

/// One counted request or command in flight; dropping it (the answer is ready, or the client
/// went away) gives the slot back.
#[derive(Debug)]
pub struct InFlight(Arc<InFlightBound>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}
