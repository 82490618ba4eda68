//! Request limits at the HTTP edge: the query length limit, the in-flight bound with shedding,
//! and the per-request deadline every store call of a read or a publish is bounded by.
//!
//! [`OverloadLayer`] sits inside the request-id layer (so a refused request still gets its
//! request id, its latency recorded and its `Retry-After`) and outside the handlers; an
//! authentication layer goes between the two (request id → auth → shedding → deadline →
//! handler). It decides before the handler runs, so a shed publish has written nothing.
//!
//! A publish (`PUT /v1/keys/{key}`) is admitted in two steps, since its body may arrive slowly:
//! the layer leaves an [`Admission`] in its extensions, the handler counts the body against the
//! receiving bound (`server.max_receiving_bodies`, `server.max_receiving_bytes`) while it
//! arrives, and only then takes the in-flight slot and starts the deadline. Slow uploads thus
//! cannot hold the slots reads need, however often they are restarted.
//!
//! The deadline is not a timeout around the handler: the layer puts a [`Deadline`] in the
//! request's extensions, and the handlers hand it to the read path and the publish path, which
//! bound their own store calls with it. A publish cut from outside could drop copies it had
//! decided to queue; a publish that sees its own deadline queues the copies that did not answer
//! and reports them `queued`. Handlers that make no store call need no deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::extract::Request;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tower::{Layer, Service};

use super::matched_route;
use super::paths::{self, ROUTES};
use super::problem::{ApiError, Code};
use crate::deadline::Deadline;
use crate::door::{InFlight, InFlightBound, RequestLimits};
use crate::metrics::{register, Metrics};

/// The `route` label of a request no template matched, after the templates.
const UNMATCHED: &str = "unmatched";

/// The routes the in-flight bound neither counts nor refuses: a load balancer's probes and the
/// scrape must get through an overloaded instance, or it would look dead rather than busy.
pub(super) const EXEMPT: [&str; 3] = [paths::HEALTHZ, paths::READYZ, paths::METRICS];

/// Labels of the per-route limit counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    /// The matched route template, or `unmatched`.
    route: &'static str,
}

/// Applies [`RequestLimits`] to every request; see the module documentation.
#[derive(Clone)]
pub(super) struct OverloadLayer {
    /// The limits and the counters, shared by every route's service.
    shared: Arc<Shared>,
}

/// What every route's [`OverloadService`] shares.
pub(crate) struct Shared {
    /// The limits.
    limits: RequestLimits,
    /// The in-flight bound, shared with the Redis door (the door core's).
    bound: Arc<InFlightBound>,
    /// Publish bodies being received (counted and refused as `in_flight` is).
    receiving: Gauge<i64, AtomicI64>,
    /// The bytes those bodies reserved.
    receiving_bytes: Gauge<i64, AtomicI64>,
    /// Shed requests, indexed by route (as [`ROUTES`], then unmatched).
    shed: Box<[Counter]>,
    /// Answers `deadline_exceeded`, indexed as `shed`.
    deadline_exceeded: Box<[Counter]>,
}

impl Shared {
    /// Registers the layer's metrics in `metrics` (once per service: the router may be built
    /// more than once from one state).
    pub(crate) fn new(bound: Arc<InFlightBound>, metrics: &Metrics) -> Arc<Shared> {
        let limits = *bound.limits();
        metrics.register_with(|registry| {
            let receiving: Gauge<i64, AtomicI64> = register(
                registry,
                "http_bodies_receiving",
                "Publish bodies being received, before their request takes an in-flight slot (server.max_receiving_bodies)",
            );
            let receiving_bytes: Gauge<i64, AtomicI64> = register(
                registry,
                "http_body_bytes_receiving",
                "Bytes reserved by the publish bodies being received: each its Content-Length, or server.max_value_bytes without one (server.max_receiving_bytes)",
            );
            let shed: Family<RouteLabels, Counter> = register(
                registry,
                "http_requests_shed",
                "HTTP requests refused with 503 overloaded (server.max_in_flight), by route",
            );
            let exceeded: Family<RouteLabels, Counter> = register(
                registry,
                "http_deadline_exceeded",
                "HTTP requests answered 503 deadline_exceeded (server.request_deadline), by route",
            );
            // Each handle is cloned in its own statement: `get_or_create` returns a read guard.
            let by_route = |family: &Family<RouteLabels, Counter>| -> Box<[Counter]> {
                ROUTES
                    .iter()
                    .copied()
                    .chain([UNMATCHED])
                    .map(|route| {
                        let counter = family.get_or_create(&RouteLabels { route }).clone();
                        counter
                    })
                    .collect()
            };
            Arc::new(Shared {
                limits,
                bound,
                receiving,
                receiving_bytes,
                shed: by_route(&shed),
                deadline_exceeded: by_route(&exceeded),
            })
        })
    }
}

impl OverloadLayer {
    pub(super) fn new(shared: Arc<Shared>) -> OverloadLayer {
        OverloadLayer { shared }
    }
}

impl<S> Layer<S> for OverloadLayer {
    type Service = OverloadService<S>;

    fn layer(&self, inner: S) -> OverloadService<S> {
        OverloadService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// A route's service wrapped by [`OverloadLayer`].
#[derive(Clone)]
pub(super) struct OverloadService<S> {
    /// The route's service.
    inner: S,
    /// The limits and counters.
    shared: Arc<Shared>,
}

impl<S> Service<Request> for OverloadService<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = S::Error;
    type Future = OverloadFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = matched_route(&request);
        let inner = &mut self.inner;
        wrap(&self.shared, request, route, |request| inner.call(request))
    }
}

impl OverloadLayer {
    /// The layer around one request already known to be on `route` (a template of [`ROUTES`],
    /// `None` when no route matched), whose next step is `call`: what [`OverloadService`] does,
    /// without a service per route (the fast path of `GET /v1/keys/{key}`, `super::key_read`).
    pub(super) fn wrap<F>(
        &self,
        request: Request,
        route: Option<&'static str>,
        call: impl FnOnce(Request) -> F,
    ) -> OverloadFuture<F> {
        wrap(&self.shared, request, route, call)
    }
}

/// Applies the limits to `request` on `route`; calls `call` unless one refuses it.
fn wrap<F>(
    shared: &Arc<Shared>,
    mut request: Request,
    route_path: Option<&'static str>,
    call: impl FnOnce(Request) -> F,
) -> OverloadFuture<F> {
    let limits = &shared.limits;
    let route = route_path
        .and_then(|path| ROUTES.iter().position(|route| *route == path))
        .unwrap_or(ROUTES.len());
    let query_bytes = request.uri().query().map_or(0, str::len);
    if query_bytes > limits.max_query_bytes {
        return OverloadFuture::answered(ApiError::new(
            Code::QueryTooLong,
            format!(
                "the query is {query_bytes} bytes long, over the limit of {} (server.max_query_bytes)",
                limits.max_query_bytes
            ),
        ));
    }
    if route_path == Some(paths::KEY) && request.method() == Method::PUT {
        // A publish takes its slot and starts its deadline once its body has arrived.
        request.extensions_mut().insert(Admission {
            shared: shared.clone(),
            route,
        });
        return OverloadFuture::Routed {
            inner: call(request),
            shared: shared.clone(),
            route,
            in_flight: None,
        };
    }
    let exempt = route_path.is_some_and(|path| EXEMPT.contains(&path));
    let in_flight = if exempt {
        None
    } else {
        match take_slot(shared, route) {
            Ok(slot) => slot,
            Err(refused) => return OverloadFuture::answered(refused),
        }
    };
    if let Some(budget) = limits.request_deadline {
        request.extensions_mut().insert(Deadline::after(budget));
    }
    OverloadFuture::Routed {
        inner: call(request),
        shared: shared.clone(),
        route,
        in_flight,
    }
}

/// Takes an in-flight slot for a request on `route` (an index of [`ROUTES`]), or refuses it
/// `overloaded` when `server.max_in_flight` are in flight; `None` when there is no bound.
fn take_slot(shared: &Arc<Shared>, route: usize) -> Result<Option<InFlight>, ApiError> {
    shared.bound.enter().map_err(|bound| {
        if let Some(counter) = shared.shed.get(route) {
            counter.inc();
        }
        ApiError::new(
            Code::Overloaded,
            format!(
                "{bound} requests are in flight (server.max_in_flight); nothing was read or written, retry later"
            ),
        )
        .retry_later()
    })
}

/// A publish's admission, put off until its body has arrived: the layer leaves it in the
/// request's extensions instead of taking the in-flight slot and starting the deadline.
#[derive(Clone)]
pub(crate) struct Admission {
    /// The limits and counters.
    shared: Arc<Shared>,
    /// The route's index in [`ROUTES`], for the shed counter.
    route: usize,
}

/// A publish body being received, counted against the receiving bound until dropped.
pub(crate) struct Receiving {
    /// The counters it is counted in.
    shared: Arc<Shared>,
    /// The bytes it reserved.
    bytes: i64,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.shared.receiving.dec();
        self.shared.receiving_bytes.dec_by(self.bytes);
    }
}

/// A publish admitted once its body arrived: its in-flight slot, held until the answer is
/// ready, and the deadline that started then.
pub(crate) struct Admitted {
    /// The in-flight slot, if the bound is on.
    _slot: Option<InFlight>,
    /// `server.request_deadline` from the admission, if set.
    pub(crate) deadline: Option<Deadline>,
}

impl Admitted {
    /// A publish that no [`OverloadLayer`] admitted (a handler called without it): no slot,
    /// and the deadline the request carries, if any.
    pub(crate) fn unlimited(deadline: Option<Deadline>) -> Admitted {
        Admitted {
            _slot: None,
            deadline,
        }
    }
}

impl Admission {
    /// Counts a body that reserves `bytes` (its declared length, or the value limit) while it
    /// arrives.
    ///
    /// # Errors
    /// 503 `overloaded` when `server.max_receiving_bodies` bodies are arriving, or when
    /// `bytes` more would pass `server.max_receiving_bytes`; nothing was read.
    pub(crate) fn receive(&self, bytes: u64) -> Result<Receiving, ApiError> {
        let shared = &self.shared;
        let reserved = i64::try_from(bytes).unwrap_or(i64::MAX);
        let before = shared.receiving.inc();
        let held_bytes = shared.receiving_bytes.inc_by(reserved);
        let receiving = Receiving {
            shared: shared.clone(),
            bytes: reserved,
        };
        let over_count = shared
            .limits
            .max_receiving_bodies
            .filter(|bound| usize::try_from(before).is_ok_and(|before| before >= *bound));
        let over_bytes = shared.limits.max_receiving_bytes.filter(|bound| {
            u64::try_from(held_bytes.saturating_add(reserved)).is_ok_and(|held| held > *bound)
        });
        let detail = match (over_count, over_bytes) {
            (Some(bound), _) => format!(
                "{bound} publish bodies are being received (server.max_receiving_bodies); nothing was read or written, retry later"
            ),
            (None, Some(bound)) => format!(
                "publish bodies being received hold {held_bytes} of {bound} bytes (server.max_receiving_bytes), and this one declares {bytes}; nothing was read or written, retry later"
            ),
            (None, None) => return Ok(receiving),
        };
        drop(receiving);
        if let Some(counter) = shared.shed.get(self.route) {
            counter.inc();
        }
        Err(ApiError::new(Code::Overloaded, detail).retry_later())
    }

    /// Takes the in-flight slot and starts the deadline, the body having arrived.
    ///
    /// # Errors
    /// 503 `overloaded` when `server.max_in_flight` requests are in flight; nothing was written.
    pub(crate) fn admit(self) -> Result<Admitted, ApiError> {
        let slot = take_slot(&self.shared, self.route)?;
        Ok(Admitted {
            _slot: slot,
            deadline: self.shared.limits.request_deadline.map(Deadline::after),
        })
    }
}

/// The route's future, or an answer given without calling the route.
pub(super) enum OverloadFuture<F> {
    /// A refusal, given at once (taken when polled).
    Answered(Option<Response>),
    /// The route was called.
    Routed {
        /// The route's future (axum's route futures are `Unpin`, so no pin projection).
        inner: F,
        /// The counters.
        shared: Arc<Shared>,
        /// The route's index in [`ROUTES`], or `ROUTES.len()`.
        route: usize,
        /// The request's in-flight slot, held until the answer is ready.
        in_flight: Option<InFlight>,
    },
}

impl<F> OverloadFuture<F> {
    fn answered(error: ApiError) -> OverloadFuture<F> {
        OverloadFuture::Answered(Some(error.into_response()))
    }
}

impl<F, E> Future for OverloadFuture<F>
where
    F: Future<Output = Result<Response, E>> + Unpin,
{
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            OverloadFuture::Answered(answer) => {
                Poll::Ready(Ok(answer.take().unwrap_or_else(|| {
                    ApiError::new(Code::Internal, "polled after completion").into_response()
                })))
            }
            OverloadFuture::Routed {
                inner,
                shared,
                route,
                in_flight,
            } => {
                let result = ready!(Pin::new(inner).poll(cx));
                if let Ok(response) = &result {
                    if response.extensions().get::<Code>() == Some(&Code::DeadlineExceeded) {
                        if let Some(counter) = shared.deadline_exceeded.get(*route) {
                            counter.inc();
                        }
                    }
                }
                // The slot is given back with the answer, not when the body has been sent.
                *in_flight = None;
                Poll::Ready(result)
            }
        }
    }
}
