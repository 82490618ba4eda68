//! The HTTP API: router, handlers, problem+json errors. No business logic lives here: handlers
//! parse requests into the crate's types, call [`crate::publish`] or [`crate::read`], and render.
//!
//! [`router`] builds the [`Router`] apart from serving, so handlers are tested with
//! `Router::oneshot` and no socket; [`data_router`] and [`admin_router`] split it between the
//! data and the admin listener when `[admin] listen` is set. The admin routes are one list,
//! `admin_routes`. Handlers return `Result<_, ApiError>` and use `?`; the one
//! place an error becomes an answer is [`problem::ApiError`]'s `IntoResponse`.
//!
//! # Layout
//! - `app`: [`App`], what a listener serves: the router, and the read route's fast path in
//!   front of it ([`app`], [`data_app`], [`admin_app`]).
//! - `key_read`: the fast path of `GET /v1/keys/{key}`: the request layers and the read handler
//!   without the router, answering byte for byte what the router answers.
//! - `handlers`: one function per route, documented for the OpenAPI document.
//! - `params`: the key, query and headers of a request, decoded strictly; repeated header
//!   lines combined.
//! - `problem`: [`problem::ApiError`], the problem+json answer, and the error-kind → code map.
//! - `scrub`: `GET /v1/scrub`, the anti-entropy scrub's view.
//! - `state`: [`AppState`], what the handlers share.
//! - `auth`: the bearer-token check in front of every route (401, 403), by the route's scope.
//! - `latency`: the layer around every request: request id and span, latency, `Retry-After`.
//! - `session`: session tokens (`Hotsplit-Session`) read from requests and put on answers.
//! - `overload`: the request limits: query length, in-flight bound (shedding), deadline.
//! - `probes`: `/healthz` and `/readyz`, and the startup warm-up `/readyz` waits for.
//! - `request_id`: how a request's id is chosen (`X-Request-Id`, `traceparent`, or random).
//! - `request_log`: the request id on every log line of its request ([`RequestIdFormat`]).
//! - `instances`: `GET /v1/instances`, the instance registry.
//! - `status_page`: the live status page (`GET /status`, its script and stylesheet, under a
//!   strict Content-Security-Policy) and `GET /v1/fleet`, the figures it polls.
//! - `openapi`: the OpenAPI document and the route that serves it; `openapi_edge` adds the
//!   security scheme, each operation's scope, the 401/403 answers and the response headers.
//! - [`paths`]: the route templates.
//! - `config`: `AdminConfig`, the `[admin]` settings (`[server]` is the door core's,
//!   [`crate::door::ServerConfig`]).
//! - [`listener`]: the accept loop and connections: timeouts, the connection bound, the header
//!   size limit, graceful shutdown.

mod app;
mod auth;
pub mod config;
pub mod handlers;
pub mod instances;
mod key_read;
mod latency;
pub mod listener;
pub mod openapi;
mod openapi_edge;
pub(crate) mod overload;
mod params;
pub mod probes;
pub mod problem;
mod request_id;
mod request_log;
pub mod scrub;
mod session;
mod state;
pub mod status_page;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::handler::Handler;
use axum::routing::get;
use axum::{Extension, Router};

pub use crate::door::ServerConfig;
pub use app::{App, AppFuture};
use auth::AuthLayer;
use key_read::KeyRead;
use latency::LatencyLayer;
use overload::OverloadLayer;
pub use request_log::RequestIdFormat;
pub use state::{AppParts, AppState};

/// The route templates, also the `route` label of the latency histogram.
pub mod paths {
    /// Publish, read and invalidate a key.
    pub const KEY: &str = "/v1/keys/{key}";
    /// [`KEY`] up to its one segment, the key, which `params` decodes from the raw path.
    pub(crate) const KEY_PREFIX: &str = "/v1/keys/";
    /// Which copy a client reads.
    pub const AFFINITY: &str = "/v1/affinity";
    /// Liveness.
    pub const HEALTHZ: &str = "/healthz";
    /// Readiness.
    pub const READYZ: &str = "/readyz";
    /// Prometheus metrics.
    pub const METRICS: &str = "/metrics";
    /// The OpenAPI document.
    pub const OPENAPI: &str = "/openapi.json";
    /// The read classes.
    pub const CLASSES: &str = "/v1/classes";
    /// Replica lag.
    pub const LAG: &str = "/v1/lag";
    /// Reads the primary served, per class and reason.
    pub const ROUTING: &str = "/v1/routing";
    /// The retry queue.
    pub const RETRY_QUEUE: &str = "/v1/retry-queue";
    /// The registered instances.
    pub const INSTANCES: &str = "/v1/instances";
    /// The near cache.
    pub const NEAR_CACHE: &str = "/v1/near-cache";
    /// The hot-key detector's last window.
    pub const HOT_KEYS: &str = "/v1/hot-keys";
    /// Every instance with its figures, for the status page.
    pub const FLEET: &str = "/v1/fleet";
    /// The live status page.
    pub const STATUS_PAGE: &str = "/status";
    /// The status page's script.
    pub const STATUS_SCRIPT: &str = "/status/status.js";
    /// The status page's stylesheet.
    pub const STATUS_STYLE: &str = "/status/status.css";
    /// The status page's icon.
    pub const STATUS_ICON: &str = "/status/favicon.svg";

    /// The anti-entropy scrub.
    pub const SCRUB: &str = "/v1/scrub";

    /// The operator views: served to tokens with the `admin` scope (when tokens are
    /// configured). Add a new admin endpoint here.
    pub(crate) const ADMIN: [&str; 14] = [
        METRICS,
        CLASSES,
        LAG,
        ROUTING,
        RETRY_QUEUE,
        INSTANCES,
        NEAR_CACHE,
        HOT_KEYS,
        FLEET,
        STATUS_PAGE,
        STATUS_SCRIPT,
        STATUS_STYLE,
        STATUS_ICON,
        SCRUB,
    ];

    /// The load balancers' probes and the API's own description, which never need a token.
    pub(crate) const OPEN: [&str; 3] = [HEALTHZ, READYZ, OPENAPI];

    /// The load balancers' probes: open to everyone, and served on the admin listener when it is
    /// set (what [`ADMIN_LISTENER`] lists first).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) const PROBES: [&str; 2] = [HEALTHZ, READYZ];

    /// The routes the admin listener serves when `[admin] listen` is set (the data listener
    /// then answers 404 on them): the load balancers' probes, then the operator views. They are
    /// what [`super::admin_routes`] registers. Built from [`PROBES`] and [`ADMIN`], so a new
    /// admin endpoint is listed once.
    #[cfg(any(test, feature = "test-util"))]
    pub const ADMIN_LISTENER: [&str; PROBES.len() + ADMIN.len()] = {
        let mut all = [""; PROBES.len() + ADMIN.len()];
        let mut i = 0;
        while i < PROBES.len() {
            all[i] = PROBES[i];
            i += 1;
        }
        let mut j = 0;
        while j < ADMIN.len() {
            all[PROBES.len() + j] = ADMIN[j];
            j += 1;
        }
        all
    };

    /// Every template, in the latency table's order.
    pub const ROUTES: [&str; 19] = [
        KEY,
        AFFINITY,
        HEALTHZ,
        READYZ,
        METRICS,
        OPENAPI,
        CLASSES,
        LAG,
        ROUTING,
        RETRY_QUEUE,
        INSTANCES,
        NEAR_CACHE,
        HOT_KEYS,
        FLEET,
        STATUS_PAGE,
        STATUS_SCRIPT,
        STATUS_STYLE,
        STATUS_ICON,
        SCRUB,
    ];
}

/// Every route on one listener: the data routes and the admin routes (no `[admin] listen`).
pub fn router(state: AppState) -> Router {
    let layers = Layers::new(&state);
    finish(data_routes(&state).merge(admin_routes()), state, &layers)
        .layer(Extension(probes::Listening::Both))
}

/// The data listener's routes when an admin listener is set: the admin routes answer 404 here.
pub fn data_router(state: AppState) -> Router {
    let layers = Layers::new(&state);
    finish(data_routes(&state), state, &layers).layer(Extension(probes::Listening::Data))
}

/// The admin listener's routes (`[admin] listen`): the admin routes only.
pub fn admin_router(state: AppState) -> Router {
    let layers = Layers::new(&state);
    finish(admin_routes(), state, &layers).layer(Extension(probes::Listening::Admin))
}

/// What a listener serving every route (no `[admin] listen`) serves: [`router`] with the read
/// route's fast path in front of it.
pub fn app(state: AppState) -> App {
    with_key_read(data_routes(&state).merge(admin_routes()), state)
}

/// What the data listener serves when an admin listener is set: [`data_router`] with the read
/// route's fast path in front of it.
pub fn data_app(state: AppState) -> App {
    with_key_read(data_routes(&state), state)
}

/// What the admin listener serves: [`admin_router`] (it has no read route, so no fast path).
pub fn admin_app(state: AppState) -> App {
    App::new(admin_router(state))
}

/// `routes`, which include the read route, finished, with the fast path in front of them
/// sharing their layers.
fn with_key_read(routes: Router<AppState>, state: AppState) -> App {
    let layers = Layers::new(&state);
    let key_read = KeyRead::new(
        layers.latency.clone(),
        layers.auth.clone(),
        layers.overload.clone(),
        state.clone(),
    );
    App::with_key_read(finish(routes, state, &layers), key_read)
}

/// The data routes: keys, affinity, and the OpenAPI document.
fn data_routes(state: &AppState) -> Router<AppState> {
    let max_value_bytes = state.ops().max_value_bytes();
    Router::new()
        .route(
            paths::KEY,
            get(handlers::read_key)
                // Only a publish reads a body, so only it carries the limit: a layer on the
                // whole router would wrap every route in one more boxed, cloned service per
                // request.
                .put(handlers::publish_key.layer(DefaultBodyLimit::max(max_value_bytes)))
                .delete(handlers::invalidate_key),
        )
        .route(paths::AFFINITY, get(handlers::affinity))
        .route(paths::OPENAPI, get(openapi::serve))
}

/// The admin routes: the one list of them. With `[admin] listen` set they are served on the
/// admin listener only; without it, beside the data routes. A new operator endpoint is added
/// here and to [`paths::ADMIN`] (which gives it its token scope and its listener); a test
/// checks that the two agree.
fn admin_routes() -> Router<AppState> {
    Router::new()
        .route(paths::HEALTHZ, get(probes::healthz))
        .route(paths::READYZ, get(probes::readyz))
        .route(paths::METRICS, get(handlers::metrics))
        .route(paths::CLASSES, get(handlers::classes))
        .route(paths::LAG, get(handlers::lag))
        .route(paths::ROUTING, get(handlers::routing))
        .route(paths::RETRY_QUEUE, get(handlers::retry_queue))
        .route(paths::INSTANCES, get(instances::instances))
        .route(paths::NEAR_CACHE, get(handlers::near_cache))
        .route(paths::HOT_KEYS, get(handlers::hot_keys))
        .route(paths::FLEET, get(status_page::fleet))
        .route(paths::STATUS_PAGE, get(status_page::page))
        .route(paths::STATUS_SCRIPT, get(status_page::script))
        .route(paths::STATUS_STYLE, get(status_page::style))
        .route(paths::STATUS_ICON, get(status_page::icon))
        .route(paths::SCRUB, get(scrub::scrub))
}

/// The request layers around every route, built once per listener: the router's routes and
/// the read route's fast path share them.
struct Layers {
    /// Request id, span, latency, `Retry-After`.
    latency: LatencyLayer,
    /// The token check.
    auth: AuthLayer,
    /// Query length, in-flight bound, deadline.
    overload: OverloadLayer,
}

impl Layers {
    fn new(state: &AppState) -> Layers {
        let inner = state.inner();
        Layers {
            latency: LatencyLayer::new(inner.metrics.clone(), inner.retry_after_secs),
            auth: inner.auth.clone(),
            overload: OverloadLayer::new(inner.limits.clone()),
        }
    }
}

/// The fallbacks, the request layers and the state around `routes`.
fn finish(routes: Router<AppState>, state: AppState, layers: &Layers) -> Router {
    routes
        .fallback(handlers::no_route)
        .method_not_allowed_fallback(handlers::wrong_method)
        // Layers run outside in, the last added first: request id and latency, then the token
        // check, then the request limits (query length, in-flight bound, deadline), then the
        // handler. `layer`, not `route_layer`: unknown paths and wrong methods get a request id,
        // need a token and count against the in-flight bound too (latency is recorded for
        // matched routes only). The read route's fast path (`key_read`) applies the same layers
        // in the same order.
        .layer(layers.overload.clone())
        .layer(layers.auth.clone())
        .layer(layers.latency.clone())
        .with_state(state)
}

/// The template of the route `request` matched (one of [`paths::ROUTES`]), from axum's
/// [`MatchedPath`]; `None` when no route matched.
fn matched_route(request: &Request) -> Option<&'static str> {
    let matched = request.extensions().get::<MatchedPath>()?;
    paths::ROUTES
        .iter()
        .copied()
        .find(|route| *route == matched.as_str())
}

#[cfg(test)]
mod tests {
    use super::paths;

    #[test]
    fn the_key_prefix_is_the_key_route_before_its_segment() {
        assert_eq!(format!("{}{{key}}", paths::KEY_PREFIX), paths::KEY);
    }
}
