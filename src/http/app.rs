//! What a listener serves: [`App`], the router and, on a listener that serves the data routes,
//! the fast path of `GET /v1/keys/{key}` in front of it (`key_read`), with the request
//! layers of both shared.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::Router;
use tower::Service;

use super::key_read::{KeyRead, KeyReadFuture};

/// The routes a listener serves, as one service: a read of a key (`GET` or `HEAD`
/// `/v1/keys/{key}`) goes the fast path when the routes include it, every other request to the
/// router. Both answer a read alike (see `key_read`). Cheap to clone.
#[derive(Clone)]
pub struct App {
    /// Every route.
    router: Router,
    /// The read route's fast path; `None` on a listener without the data routes.
    key_read: Option<Arc<KeyRead>>,
}

impl App {
    /// `router` alone, with no fast path.
    pub(super) fn new(router: Router) -> App {
        App {
            router,
            key_read: None,
        }
    }

    /// `router` with the read route's fast path in front of it.
    pub(super) fn with_key_read(router: Router, key_read: KeyRead) -> App {
        App {
            router,
            key_read: Some(Arc::new(key_read)),
        }
    }

    /// The router, which serves every request the fast path does not take (and, asked
    /// directly, those it does: what the fast path's answers are compared with).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Whether `request` goes the fast path (for the tests that compare both paths).
    #[cfg(any(test, feature = "test-util"))]
    pub fn takes_fast_path<B>(&self, request: &Request<B>) -> bool {
        self.key_read.is_some() && KeyRead::takes(request.method(), request.uri().path())
    }

    /// Serves `request`.
    pub fn call(&self, request: Request<Body>) -> AppFuture {
        match &self.key_read {
            Some(key_read) if KeyRead::takes(request.method(), request.uri().path()) => {
                AppFuture(Answer::KeyRead(key_read.call(request)))
            }
            // A clone of the router is a reference count; its `call` wants it mutable.
            _ => AppFuture(Answer::Router(self.router.clone().call(request))),
        }
    }
}

impl Service<Request<Body>> for App {
    type Response = Response;
    type Error = Infallible;
    type Future = AppFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> AppFuture {
        App::call(self, request)
    }
}

/// The answer to one request of an [`App`].
pub struct AppFuture(Answer);

/// Who answers.
enum Answer {
    /// The router.
    Router(RouteFuture<Infallible>),
    /// The read route's fast path.
    KeyRead(KeyReadFuture),
}

impl Future for AppFuture {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Answer::Router(future) => Pin::new(future).poll(cx),
            Answer::KeyRead(future) => Pin::new(future).poll(cx).map(Ok),
        }
    }
}
