//! The HTTP API: router, handlers, problem+json errors. No business logic lives here: handlers
//! parse requests into the crate's types, call [`crate::publish`] or [`crate::read`], and render.
//!
//! [`router`] builds the [`Router`] apart from serving, so handlers are tested with
//! `Router::oneshot` and no socket.

pub mod handlers;
pub mod openapi;
pub mod problem;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

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
                .put(handlers::publish_key)
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
        .route_layer(middleware::from_fn_with_state(metrics, record_latency))
        .fallback(handlers::no_route)
        .method_not_allowed_fallback(handlers::wrong_method)
        .layer(DefaultBodyLimit::max(max_value_bytes))
        .with_state(state)
}

/// Records each request's latency by method, route template and status class.
async fn record_latency(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    // Labels are static strings, so recording allocates nothing.
    let method = match *request.method() {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|path| ROUTES.iter().find(|route| **route == path.as_str()))
        .copied()
        .unwrap_or("unmatched");
    let response = next.run(request).await;
    let status = match response.status().as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics.request(
        &RequestLabels {
            method,
            route,
            status,
        },
        started.elapsed().as_secs_f64(),
    );
    response
}
