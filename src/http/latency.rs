//! Gives each request its request id (on every log line of the request), records each request's latency, and
//! fills `Retry-After` on the answers that ask for it: the one hook every answer passes on its
//! way out.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderName, Method};
use axum::response::Response;
use prometheus_client::metrics::histogram::Histogram;
use tower::{Layer, Service};

use super::matched_route;
use super::paths::ROUTES;
use super::problem::fill_retry_after;
use super::request_id::request_id;
use super::request_log::{Id, Scope};
use crate::metrics::{Metrics, RequestLabels};
use crate::wire;

/// The `method` label values, in [`LatencyLayer`]'s table order.
const METHODS: [&str; 5] = ["GET", "PUT", "DELETE", "HEAD", "OTHER"];
/// The `status` label values, in [`LatencyLayer`]'s table order.
const STATUSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];
/// The `route` label of a request no template matched, after the templates in the table.
const UNMATCHED: &str = "unmatched";

/// Gives each request a request id (see [`super::request_id`]), echoed as `X-Request-Id` and
/// current on the thread while the handler's future is polled ([`super::request_log`]), so
/// every log line of the request names it;
/// records each routed request's latency by method, route template and status class (a request
/// no route matched is not recorded); and sets `Retry-After` on answers an
/// [`super::problem::ApiError`] marked retry-later (the seconds are configuration, which an
/// error converted by `?` does not know).
///
/// It is a hand-written layer rather than `middleware::from_fn` because it runs on every
/// request: `from_fn` clones the inner service and boxes a future per request, and the
/// histogram family hashes the three labels under a lock per request. Here the inner future is
/// wrapped in place, and each label combination's histogram is looked up in the family once
/// (on first use, so `/metrics` shows the same series as before) and then indexed. The id is
/// made current by copying it into a thread-local for each poll, not by a tracing span (a span
/// per request cost about 8 % of the read throughput; see `request_log`).
#[derive(Clone)]
pub(super) struct LatencyLayer {
    /// The histograms, shared by every route's service.
    table: Arc<LatencyTable>,
}

impl LatencyLayer {
    /// Records into `metrics`; retry-later answers get `Retry-After: retry_after_secs`.
    pub(super) fn new(metrics: Arc<Metrics>, retry_after_secs: u64) -> LatencyLayer {
        LatencyLayer {
            table: Arc::new(LatencyTable::new(metrics, retry_after_secs)),
        }
    }
}

/// One lazily resolved histogram per (method, route, status) label combination.
struct LatencyTable {
    /// The family the histograms belong to.
    metrics: Arc<Metrics>,
    /// Indexed by [`LatencyTable::slot`].
    slots: Box<[OnceLock<Histogram>]>,
    /// The `Retry-After` seconds of retry-later answers.
    retry_after_secs: u64,
}

impl LatencyTable {
    fn new(metrics: Arc<Metrics>, retry_after_secs: u64) -> LatencyTable {
        let count = METHODS.len() * (ROUTES.len() + 1) * STATUSES.len();
        LatencyTable {
            metrics,
            slots: (0..count).map(|_| OnceLock::new()).collect(),
            retry_after_secs,
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
pub(super) struct LatencyService<S> {
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
        let route = matched_route(&request);
        let inner = &mut self.inner;
        start(&self.table, request, route, |request| inner.call(request))
    }
}

impl LatencyLayer {
    /// The layer around one request already known to be on `route` (a template of [`ROUTES`]),
    /// whose next step is `call`: what [`LatencyService`] does, without a service per route
    /// (the fast path of `GET /v1/keys/{key}`, `super::key_read`).
    pub(super) fn wrap<F>(
        &self,
        request: Request,
        route: Option<&'static str>,
        call: impl FnOnce(Request) -> F,
    ) -> LatencyFuture<F> {
        start(&self.table, request, route, call)
    }
}

/// Gives `request` its id, calls `call` with the id current, and wraps the future it returns.
fn start<F>(
    table: &Arc<LatencyTable>,
    request: Request,
    route: Option<&'static str>,
    call: impl FnOnce(Request) -> F,
) -> LatencyFuture<F> {
    let started = Instant::now();
    let request_id = request_id(request.headers());
    let id = Id::new(&request_id);
    let method = match *request.method() {
        Method::GET => 0,
        Method::PUT => 1,
        Method::DELETE => 2,
        Method::HEAD => 3,
        _ => 4,
    };
    let route = route
        .and_then(|path| ROUTES.iter().position(|route| *route == path))
        .unwrap_or(ROUTES.len());
    let inner = {
        let _current = Scope::enter(&id);
        call(request)
    };
    LatencyFuture {
        inner,
        table: table.clone(),
        started,
        method,
        route,
        request_id,
        id,
    }
}

/// The route's future; records the latency when it completes.
pub(super) struct LatencyFuture<F> {
    /// The route's future (axum's route futures are `Unpin`, so no pin projection is needed).
    inner: F,
    /// Where to record.
    table: Arc<LatencyTable>,
    /// When the request reached the route.
    started: Instant,
    /// The method's index in [`METHODS`].
    method: usize,
    /// The route's index in [`ROUTES`], or `ROUTES.len()` (not recorded).
    route: usize,
    /// Echoed in the answer's `X-Request-Id`.
    request_id: axum::http::HeaderValue,
    /// The same id, current on the thread while the route's future is polled.
    id: Id,
}

impl<F, E> Future for LatencyFuture<F>
where
    F: Future<Output = Result<Response, E>> + Unpin,
{
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut result = {
            let _current = Scope::enter(&this.id);
            ready!(Pin::new(&mut this.inner).poll(cx))
        };
        if let Ok(response) = &mut result {
            fill_retry_after(response, this.table.retry_after_secs);
            response.headers_mut().insert(
                HeaderName::from_static(wire::header::REQUEST_ID),
                this.request_id.clone(),
            );
            if this.route < ROUTES.len() {
                let status = match response.status().as_u16() {
                    200..=299 => 0,
                    300..=399 => 1,
                    400..=499 => 2,
                    _ => 3,
                };
                this.table.observe(
                    this.method,
                    this.route,
                    status,
                    this.started.elapsed().as_secs_f64(),
                );
            }
        }
        Poll::Ready(result)
    }
}
