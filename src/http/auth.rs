//! The bearer-token check in front of every route: which scope a route needs, and the 401 and
//! 403 answers.
//!
//! [`AuthLayer`] wraps each route after routing (it reads the [`MatchedPath`]) and before the
//! handler, so a caller without the scope learns nothing from the handler: not whether a key
//! exists, not a node address. `/healthz`, `/readyz` and `/openapi.json` need no token; a data read needs
//! `read`, a publish or invalidation `write`, an admin view ([`super::paths::ADMIN`]) `admin`;
//! a path no route matches needs a valid token of any scope before it is told 404. With no
//! tokens configured every request passes, as before tokens existed.
//!
//! Like the latency layer it is written by hand: the check runs on every request, so it wraps
//! the route's future in place instead of boxing one. The token table is loaded with one
//! lock-free read (`arc-swap`); a SIGHUP reload swaps it.
//!
//! Nothing here logs or echoes a token: a log line names the token by the name the tokens file
//! gives it, and an answer says only what was missing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{Layer, Service};

use super::matched_route;
use super::paths;
use super::problem::{ApiError, Code};
use crate::auth::{Scope, TokenTable, Verdict};
use crate::metrics::Metrics;

/// What a route asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: `/healthz`, `/readyz`.
    Nothing,
    /// A valid token of any scope (a path no route matches, a method no route has).
    AnyToken,
    /// A token carrying this scope.
    Scope(Scope),
}

/// What a request to `route` (a template, `None` when no route matched) with `method` needs.
pub(crate) fn need(route: Option<&str>, method: &Method) -> Need {
    let Some(route) = route else {
        return Need::AnyToken;
    };
    if route == paths::KEY {
        return match *method {
            Method::GET | Method::HEAD => Need::Scope(Scope::Read),
            Method::PUT | Method::DELETE => Need::Scope(Scope::Write),
            _ => Need::AnyToken,
        };
    }
    if paths::OPEN.contains(&route) {
        Need::Nothing
    } else if paths::ADMIN.contains(&route) {
        Need::Scope(Scope::Admin)
    } else if route == paths::AFFINITY {
        Need::Scope(Scope::Read)
    } else {
        Need::AnyToken
    }
}

/// Why a request was refused: the `reason` label of `hotsplit_auth_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    /// `missing` (no usable `Authorization: Bearer`), `invalid` (no such token) or `scope`.
    reason: &'static str,
}

/// The refusal counters, resolved once.
#[derive(Clone)]
struct Refusals {
    /// No credentials, or not a bearer token.
    missing: Counter,
    /// A token no entry matches.
    invalid: Counter,
    /// A known token without the route's scope.
    scope: Counter,
}

/// Checks every request's bearer token against the route's scope.
#[derive(Clone)]
pub(crate) struct AuthLayer {
    /// The tokens; empty (`None`) lets every request through.
    tokens: TokenTable,
    /// Counted refusals.
    refusals: Refusals,
}

impl AuthLayer {
    /// Checks against `tokens`; refusals are counted in `metrics`.
    pub(crate) fn new(tokens: TokenTable, metrics: &Metrics) -> AuthLayer {
        let family = metrics.register_with(|registry| {
            let family = Family::<RefusedLabels, Counter>::default();
            registry.register(
                "auth_refused",
                "Requests refused by the token check, by reason (missing, invalid, scope)",
                family.clone(),
            );
            family
        });
        let counter = |reason| family.get_or_create(&RefusedLabels { reason }).clone();
        AuthLayer {
            tokens,
            refusals: Refusals {
                missing: counter("missing"),
                invalid: counter("invalid"),
                scope: counter("scope"),
            },
        }
    }
}

impl AuthLayer {
    /// The table requests are checked against.
    pub(crate) fn tokens(&self) -> &TokenTable {
        &self.tokens
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A route's service behind the token check.
#[derive(Clone)]
pub(crate) struct AuthService<S> {
    /// The route's service.
    inner: S,
    /// The tokens and counters.
    layer: AuthLayer,
}

impl AuthLayer {
    /// The layer around one request already known to be on `route` (a template, `None` when
    /// no route matched), whose next step is `call`: what [`AuthService`] does, without a
    /// service per route (the fast path of `GET /v1/keys/{key}`, `super::key_read`).
    pub(super) fn wrap<F>(
        &self,
        request: Request,
        route: Option<&str>,
        call: impl FnOnce(Request) -> F,
    ) -> AuthFuture<F> {
        match self.refusal(&request, route) {
            Some(refusal) => AuthFuture::Refused(Some(refusal)),
            None => AuthFuture::Inner(call(request)),
        }
    }

    /// `None` when `request` to `route` may pass, else the refusal.
    fn refusal(&self, request: &Request, route: Option<&str>) -> Option<Response> {
        let tokens = self.tokens.load();
        let tokens = tokens.as_deref()?;
        let need = need(route, request.method());
        if need == Need::Nothing {
            return None;
        }
        let Some(presented) = bearer(request) else {
            self.refusals.missing.inc();
            return Some(unauthorized(
                "send Authorization: Bearer TOKEN",
                "Bearer realm=\"hotsplit\"",
            ));
        };
        let Verdict::Known(token) = tokens.verify(presented) else {
            self.refusals.invalid.inc();
            tracing::debug!("refused: the bearer token matches no configured token");
            return Some(unauthorized(
                "the bearer token is not valid",
                "Bearer realm=\"hotsplit\", error=\"invalid_token\"",
            ));
        };
        match need {
            Need::Scope(scope) if !token.scopes.contains(scope) => {
                self.refusals.scope.inc();
                tracing::debug!(
                    token = token.name,
                    scope = scope.as_str(),
                    "refused: the token lacks the scope"
                );
                Some(forbidden(scope))
            }
            _ => None,
        }
    }
}

impl AuthLayer {
    /// Whether `headers` carry a valid token with `scope`; `None` when no tokens are
    /// configured (every caller passes every check then). For a route that needs no token but
    /// shows more to some callers (`/readyz`).
    pub(crate) fn grants(&self, headers: &axum::http::HeaderMap, scope: Scope) -> Option<bool> {
        let tokens = self.tokens.load();
        let tokens = tokens.as_deref()?;
        Some(bearer_in(headers).is_some_and(|presented| {
            matches!(tokens.verify(presented), Verdict::Known(token) if token.scopes.contains(scope))
        }))
    }
}

/// The token of the request's one `Authorization: Bearer` line, if it has exactly one such
/// line with a non-empty token (the scheme is case-insensitive).
fn bearer(request: &Request) -> Option<&[u8]> {
    bearer_in(request.headers())
}

/// [`bearer`] of a request's headers.
fn bearer_in(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let mut lines = headers.get_all(header::AUTHORIZATION).iter();
    let line = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    let bytes = line.as_bytes();
    let (scheme, rest) = bytes.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn unauthorized(detail: &str, challenge: &'static str) -> Response {
    let mut response = ApiError::new(Code::Unauthorized, detail).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

fn forbidden(scope: Scope) -> Response {
    let mut response = ApiError::new(
        Code::Forbidden,
        format!("this token lacks the {} scope", scope.as_str()),
    )
    .into_response();
    let challenge = format!(
        "Bearer realm=\"hotsplit\", error=\"insufficient_scope\", scope=\"{}\"",
        scope.as_str()
    );
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

impl<S> Service<Request> for AuthService<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = S::Error;
    type Future = AuthFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = matched_route(&request);
        let inner = &mut self.inner;
        self.layer
            .wrap(request, route, |request| inner.call(request))
    }
}

/// The route's future, or a refusal ready at once.
pub(crate) enum AuthFuture<F> {
    /// The request passed; the route answers.
    Inner(F),
    /// The refusal, taken on the first poll.
    Refused(Option<Response>),
}

impl<F, E> Future for AuthFuture<F>
where
    F: Future<Output = Result<Response, E>> + Unpin,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            AuthFuture::Inner(inner) => Pin::new(inner).poll(cx),
            AuthFuture::Refused(refusal) => Poll::Ready(Ok(refusal.take().unwrap_or_else(|| {
                ApiError::new(Code::Internal, "internal error").into_response()
            }))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_needs_its_scope_and_probes_need_none() {
        assert_eq!(
            need(Some(paths::KEY), &Method::GET),
            Need::Scope(Scope::Read)
        );
        assert_eq!(
            need(Some(paths::KEY), &Method::HEAD),
            Need::Scope(Scope::Read)
        );
        assert_eq!(
            need(Some(paths::KEY), &Method::PUT),
            Need::Scope(Scope::Write)
        );
        assert_eq!(
            need(Some(paths::KEY), &Method::DELETE),
            Need::Scope(Scope::Write)
        );
        assert_eq!(need(Some(paths::KEY), &Method::POST), Need::AnyToken);
        assert_eq!(need(Some(paths::HEALTHZ), &Method::GET), Need::Nothing);
        assert_eq!(need(Some(paths::READYZ), &Method::GET), Need::Nothing);
        for admin in paths::ADMIN {
            assert_eq!(
                need(Some(admin), &Method::GET),
                Need::Scope(Scope::Admin),
                "{admin}"
            );
        }
        assert_eq!(
            need(Some(paths::AFFINITY), &Method::GET),
            Need::Scope(Scope::Read)
        );
        assert_eq!(need(None, &Method::GET), Need::AnyToken);
        // Every route is classified on purpose: none falls to "any token" by accident.
        for route in paths::ROUTES {
            assert_ne!(need(Some(route), &Method::GET), Need::AnyToken, "{route}");
        }
    }
}
