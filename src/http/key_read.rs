//! The fast path of `GET /v1/keys/{key}` (and `HEAD`): the read handler behind the same request
//! layers as on the router, called without the router.
//!
//! On the router a read passes axum's path matching (which puts a `MatchedPath` and the path
//! parameters in the request's extensions, three allocations), then the route's layered
//! service, which axum boxes and clones per request (the router's `.layer()` wraps every
//! route), each layer reading the matched path back; then the handler's own boxed service,
//! cloned again. [`KeyRead`] is that chain written out for the one route: the latency, token
//! and request-limit layers' own code (`LatencyLayer::wrap`, `AuthLayer::wrap`,
//! `OverloadLayer::wrap`, the same functions their services call) applied to a request whose
//! route is known to be [`paths::KEY`], in one future whose type is named. Inside them,
//! `handlers::read_key_fast` does the handler's work without axum's handler: its extractors'
//! reads done in place, then the read answered at once when memory answers it (a near-cache
//! hit: no future is built or boxed, `Ops::read_now`), else one boxed future for the read
//! through the store; a request an extractor refuses goes to `handlers::read_key` through
//! axum's [`Handler`] trait, which refuses it. The answer is then finished as the router
//! finishes it (`Content-Length` from an exact body size, the body dropped for `HEAD`).
//!
//! **Invariant:** a request the fast path takes gets the router's answer, byte for byte (status,
//! headers, body), for every outcome: hits, misses, every refusal and error
//! (`fast_path::the_fast_path_answers_what_the_router_answers`). So [`KeyRead::takes`] takes
//! exactly the requests the router gives the read route (`GET` or `HEAD`, the prefix and one
//! non-empty segment), and the read handler may read nothing the router puts in a request that
//! the fast path does not: no `MatchedPath`, no axum `Path` (its key comes from the raw path,
//! `params::KeyPath`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::Request;
use axum::handler::Handler;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use hyper::body::Body as _;

use super::auth::{AuthFuture, AuthLayer};
use super::handlers;
use super::latency::{LatencyFuture, LatencyLayer};
use super::overload::{OverloadFuture, OverloadLayer};
use super::paths;
use super::state::AppState;

/// The read route's request layers and the state its handler is called with.
pub(super) struct KeyRead {
    /// Request id, span, latency and `Retry-After` (the router's instance).
    latency: LatencyLayer,
    /// The token check (the router's instance: a reload's table is seen by both).
    auth: AuthLayer,
    /// Query length, in-flight bound, deadline (the router's instance: one in-flight count).
    overload: OverloadLayer,
    /// The handler's state.
    state: AppState,
}

/// The read handler's future: axum boxes an async function's future.
type Handled = Pin<Box<dyn Future<Output = Response> + Send>>;

/// The read's answer as the layers take it: a result that is never an error.
pub(super) enum Infallibly {
    /// Decided already ([`handlers::FastRead::Now`]); taken by the first poll.
    Now(Option<Response>),
    /// To be awaited: the handler's future, or the read's ([`handlers::FastRead::Later`]).
    Later(Handled),
}

impl Future for Infallibly {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Infallibly::Now(answer) => match answer.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after it answered: a caller's bug, answered as such.
                None => Poll::Ready(Ok(super::problem::ApiError::new(
                    super::problem::Code::Internal,
                    "the fast path's answer was taken twice",
                )
                .into_response())),
            },
            Infallibly::Later(future) => future.as_mut().poll(cx).map(Ok),
        }
    }
}

impl KeyRead {
    /// The read route behind `latency`, `auth` and `overload`, which must be the instances the
    /// router's routes are layered with.
    pub(super) fn new(
        latency: LatencyLayer,
        auth: AuthLayer,
        overload: OverloadLayer,
        state: AppState,
    ) -> KeyRead {
        KeyRead {
            latency,
            auth,
            overload,
            state,
        }
    }

    /// Whether the router would give a request for `method` and `path` to the read route:
    /// `GET` or `HEAD` (axum serves `HEAD` with the `GET` handler), and a path that is
    /// [`paths::KEY_PREFIX`] and one non-empty segment (what the route's `{key}` matches).
    pub(super) fn takes(method: &Method, path: &str) -> bool {
        (*method == Method::GET || *method == Method::HEAD)
            && path
                .strip_prefix(paths::KEY_PREFIX)
                .is_some_and(|key| !key.is_empty() && !key.contains('/'))
    }

    /// Serves `request`, which [`KeyRead::takes`].
    pub(super) fn call(&self, request: Request) -> KeyReadFuture {
        let head = request.method() == Method::HEAD;
        let route = Some(paths::KEY);
        let inner = self.latency.wrap(request, route, |request| {
            self.auth.wrap(request, route, |request| {
                self.overload.wrap(request, route, |request| {
                    match handlers::read_key_fast(&self.state, &request) {
                        Some(handlers::FastRead::Now(response)) => Infallibly::Now(Some(response)),
                        Some(handlers::FastRead::Later(future)) => Infallibly::Later(future),
                        // A request an extractor refuses: the handler refuses it.
                        None => Infallibly::Later(Handler::call(
                            handlers::read_key,
                            request,
                            self.state.clone(),
                        )),
                    }
                })
            })
        });
        KeyReadFuture { inner, head }
    }
}

/// The layered future of one read.
type Layered = LatencyFuture<AuthFuture<OverloadFuture<Infallibly>>>;

/// One read on the fast path; its answer is finished as axum's router finishes a route's.
pub(super) struct KeyReadFuture {
    /// The layers and the handler.
    inner: Layered,
    /// Whether the request was a `HEAD`, whose answer has no body.
    head: bool,
}

impl Future for KeyReadFuture {
    type Output = Response;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let Ok(mut response) = ready!(Pin::new(&mut self.inner).poll(cx));
        // What axum's top-level route future does to every answer of a matched route: a
        // `Content-Length` from an exact body size, set before a `HEAD` answer's body is
        // dropped.
        if !response.headers().contains_key(header::CONTENT_LENGTH) {
            if let Some(size) = response.body().size_hint().exact() {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            }
        }
        if self.head {
            *response.body_mut() = axum::body::Body::empty();
        }
        Poll::Ready(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_path_takes_what_the_read_route_matches_and_nothing_else() {
        for (method, path, takes) in [
            (Method::GET, "/v1/keys/k", true),
            (Method::HEAD, "/v1/keys/k", true),
            (Method::GET, "/v1/keys/a%2Fb", true),
            (Method::GET, "/v1/keys/%zz", true),
            (Method::PUT, "/v1/keys/k", false),
            (Method::DELETE, "/v1/keys/k", false),
            (Method::POST, "/v1/keys/k", false),
            (Method::GET, "/v1/keys/", false),
            (Method::GET, "/v1/keys", false),
            (Method::GET, "/v1/keys/k/", false),
            (Method::GET, "/v1/keys/a/b", false),
            (Method::GET, "/v1/keysk", false),
            (Method::GET, "/v1/affinity", false),
        ] {
            assert_eq!(KeyRead::takes(&method, path), takes, "{method} {path}");
        }
    }
}
