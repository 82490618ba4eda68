//! The HTTP API: router, handlers, problem+json errors. No business logic lives here: handlers
//! parse requests into the crate's types, call [`crate::publish`] or [`crate::read`], and render.
//!
//! [`router`] builds the [`Router`] apart from serving, so handlers are tested with
//! `Router::oneshot` and no socket.

pub mod config;
pub mod handlers;
pub mod openapi;
pub mod problem;

pub use config::ServerConfig;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::handler::Handler;
use axum::http::Method;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use prometheus_client::metrics::histogram::Histogram;
use tower::{Layer, Service};

use crate::heal::HealHandles;
use crate::metrics::{Metrics, RequestLabels};
use crate::publish::Publisher;
use crate::read::Reader;
use crate::store::Store;

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The parts, shared.
    inner: Arc<Inner>,
}

/// The parts of [`AppState`].
pub(crate) struct Inner {
    /// Writes edits to every copy.
    pub(crate) publisher: Publisher,
    /// Serves affine reads.
    pub(crate) reader: Reader,
    /// The store, for readiness checks.
    pub(crate) store: Arc<dyn Store>,
    /// Metrics to render and to count into.
    pub(crate) metrics: Arc<Metrics>,
    /// The body limit, in bytes, reported in `value_too_large` answers.
    pub(crate) max_value_bytes: usize,
    /// `Retry-After` seconds for 503 answers.
    pub(crate) retry_after_secs: u64,
    /// The retry queue and recorded layouts, for `/v1/retry-queue`, `/metrics` and `/readyz`.
    pub(crate) heal: HealHandles,
}

impl AppState {
    /// Bundles the parts the handlers use.
    pub fn new(
        publisher: Publisher,
        reader: Reader,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        max_value_bytes: usize,
        retry_after: std::time::Duration,
        heal: HealHandles,
    ) -> AppState {
        let retry_after_secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
        AppState {
            inner: Arc::new(Inner {
                publisher,
                reader,
                store,
                metrics,
                max_value_bytes,
                retry_after_secs,
                heal,
            }),
        }
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
}

/// Every route template, used as the `route` label of the latency histogram.
const ROUTES: [&str; 10] = [
    "/v1/keys/{key}",
    "/v1/affinity",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/v1/classes",
    "/v1/lag",
    "/v1/routing",
    "/v1/retry-queue",
];

/// The full API router.
pub fn router(state: AppState) -> Router {
    let metrics = state.inner.metrics.clone();
    let max_value_bytes = state.inner.max_value_bytes;
    Router::new()
        .route(
            ROUTES[0],
            get(handlers::read_key)
                // Only a publish reads a body, so only it carries the limit: a layer on the
                // whole router would wrap every route in one more boxed, cloned service per
                // request.
                .put(handlers::publish_key.layer(DefaultBodyLimit::max(max_value_bytes)))
                .delete(handlers::invalidate_key),
        )
        .route(ROUTES[1], get(handlers::affinity))
        .route(ROUTES[2], get(handlers::healthz))
        .route(ROUTES[3], get(handlers::readyz))
        .route(ROUTES[4], get(handlers::metrics))
        .route(ROUTES[5], get(handlers::openapi_json))
        .route(ROUTES[6], get(handlers::classes))
        .route(ROUTES[7], get(handlers::lag))
        .route(ROUTES[8], get(handlers::routing))
        .route(ROUTES[9], get(handlers::retry_queue))
        .route_layer(LatencyLayer {
            table: Arc::new(LatencyTable::new(metrics)),
        })
        .fallback(handlers::no_route)
        .method_not_allowed_fallback(handlers::wrong_method)
        .with_state(state)
}

/// The `method` label values, in [`LatencyLayer`]'s table order.
const METHODS: [&str; 5] = ["GET", "PUT", "DELETE", "HEAD", "OTHER"];
/// The `status` label values, in [`LatencyLayer`]'s table order.
const STATUSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];
/// The `route` label of a request no template matched, after the templates in the table.
const UNMATCHED: &str = "unmatched";

/// Records each request's latency by method, route template and status class.
///
/// It is a hand-written layer rather than `middleware::from_fn` because it runs on every
/// request: `from_fn` clones the inner service and boxes a future per request, and the
/// histogram family hashes the three labels under a lock per request. Here the inner future is
/// wrapped in place, and each label combination's histogram is looked up in the family once
/// (on first use, so `/metrics` shows the same series as before) and then indexed.
#[derive(Clone)]
struct LatencyLayer {
    /// The histograms, shared by every route's service.
    table: Arc<LatencyTable>,
}

/// One lazily resolved histogram per (method, route, status) label combination.
struct LatencyTable {
    /// The family the histograms belong to.
    metrics: Arc<Metrics>,
    /// Indexed by [`LatencyTable::slot`].
    slots: Box<[OnceLock<Histogram>]>,
}

impl LatencyTable {
    fn new(metrics: Arc<Metrics>) -> LatencyTable {
        let count = METHODS.len() * (ROUTES.len() + 1) * STATUSES.len();
        LatencyTable {
            metrics,
            slots: (0..count).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Records one request of `method` (an index into [`METHODS`]) on `route` (an index into
    /// [`ROUTES`], or `ROUTES.len()` for unmatched) that ended with `status` (into [`STATUSES`]).
    fn observe(&self, method: usize, route: usize, status: usize, seconds: f64) {
        let slot = (method * (ROUTES.len() + 1) + route) * STATUSES.len() + status;
        let Some(cell) = self.slots.get(slot) else {
            return;
        };
        let histogram = cell.get_or_init(|| {
            self.metrics.request_histogram(&RequestLabels {
                method: METHODS[method],
                route: ROUTES.get(route).copied().unwrap_or(UNMATCHED),
                status: STATUSES[status],
            })
        });
        histogram.observe(seconds);
    }
}

impl<S> Layer<S> for LatencyLayer {
    type Service = LatencyService<S>;

    fn layer(&self, inner: S) -> LatencyService<S> {
        LatencyService {
            inner,
            table: self.table.clone(),
        }
    }
}

/// A route's service wrapped by [`LatencyLayer`].
#[derive(Clone)]
struct LatencyService<S> {
    /// The route's service.
    inner: S,
    /// Where to record.
    table: Arc<LatencyTable>,
}

impl<S> Service<Request> for LatencyService<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = S::Error;
    type Future = LatencyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let started = Instant::now();
        let method = match *request.method() {
            Method::GET => 0,
            Method::PUT => 1,
            Method::DELETE => 2,
            Method::HEAD => 3,
            _ => 4,
        };
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .and_then(|path| ROUTES.iter().position(|route| *route == path.as_str()))
            .unwrap_or(ROUTES.len());
        LatencyFuture {
            inner: self.inner.call(request),
            table: self.table.clone(),
            started,
            method,
            route,
        }
    }
}

/// The route's future; records the latency when it completes.
struct LatencyFuture<F> {
    /// The route's future (axum's route futures are `Unpin`, so no pin projection is needed).
    inner: F,
    /// Where to record.
    table: Arc<LatencyTable>,
    /// When the request reached the route.
    started: Instant,
    /// The method's index in [`METHODS`].
    method: usize,
    /// The route's index in [`ROUTES`], or `ROUTES.len()`.
    route: usize,
}

impl<F, E> Future for LatencyFuture<F>
where
    F: Future<Output = Result<Response, E>> + Unpin,
{
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(Pin::new(&mut self.inner).poll(cx));
        if let Ok(response) = &result {
            let status = match response.status().as_u16() {
                200..=299 => 0,
                300..=399 => 1,
                400..=499 => 2,
                _ => 3,
            };
            self.table.observe(
                self.method,
                self.route,
                status,
                self.started.elapsed().as_secs_f64(),
            );
        }
        Poll::Ready(result)
    }
}
