//! The load balancers' probes: `/healthz` (the process is alive) and `/readyz` (send it
//! traffic: not draining, the store answers, the startup warm-up has ended).
//!
//! `/readyz` needs no token and is not counted by the in-flight bound, so it must cost the
//! store nothing per caller: one store `PING` ([`ReadyPing`]) answers every caller for
//! `heal.probe_interval`, however many ask. Its node lists (`host:port`s) are shown only on the
//! admin listener, or (without one) to a token with the `admin` scope, or to anyone when no
//! tokens are configured (the admin views are open then too).

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use super::problem::{ApiError, Code};
use super::AppState;
use crate::auth::Scope;
use crate::deadline::{self, Deadline};
use crate::error::Result;
use crate::heal::StoreProbe;
use crate::route::{Readiness, WarmUpPending};
use crate::store::NodeLabel;

/// Which routes the listener a request came in on serves: who may see node names in `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listening {
    /// Every route (no `[admin] listen`).
    Both,
    /// The data routes (an admin listener is set).
    Data,
    /// The admin routes (`[admin] listen`).
    Admin,
}

/// The last store `PING` of `/readyz`: one answers every caller for `heal.probe_interval`.
pub(crate) struct ReadyPing {
    /// How long a `PING`'s answer stands (`heal.probe_interval`).
    interval: Duration,
    /// When the last `PING` started, and how it ended. Held across the `PING`, so callers that
    /// arrive meanwhile wait for its answer instead of sending their own.
    last: tokio::sync::Mutex<Option<(Instant, Result<()>)>>,
}

impl ReadyPing {
    /// No `PING` made yet; each answer stands for `interval`.
    pub(crate) fn new(interval: Duration) -> ReadyPing {
        ReadyPing {
            interval,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The answer of a `PING` of `store` started less than the interval ago, or of a new one.
    async fn check(&self, store: &StoreProbe) -> Result<()> {
        let mut last = self.last.lock().await;
        if let Some((started, answer)) = last.as_ref() {
            if started.elapsed() < self.interval {
                return answer.clone();
            }
        }
        let started = Instant::now();
        let answer = store.ping().await;
        *last = Some((started, answer.clone()));
        answer
    }
}

/// The answer of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusBody {
    /// `ok` or `ready`.
    status: &'static str,
    /// The store kind: `embedded`, `redis` or `redis-cluster`.
    store: &'static str,
    /// `/readyz` only: families whose layout recorded in Redis differs from this instance's
    /// config, or that another live instance runs with another copy count
    /// (`/v1/instances` names who wrote the record). Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    layout_mismatches: Vec<String>,
    /// `/readyz` only: primaries (`host:port`) that lack the function library (they refused
    /// `FUNCTION LOAD` or did not answer); their copies queue until a background retry loads
    /// it. Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    library_missing: Vec<String>,
    /// `/readyz` only: nodes (`host:port`) known to be failing, or back but with queued copies
    /// not yet flushed: their copy writes are queued at once (`node_failing`) while failing, and
    /// reads of their copies go to sibling copies until they are flushed. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes_avoided: Vec<String>,
    /// `/readyz` only: what replica-routed reads cannot use yet, when the startup warm-up
    /// (`server.readiness_warm_up`) ended at its bound with replicas still pending, or a
    /// replica appeared since. Absent when nothing is pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_up_pending: Option<WarmUpPending>,
    /// `/readyz` only: `true` while the invalidation feed of a primary is not current (no
    /// proof through it within `feed.max_silence`, or its connection is down): changes made
    /// through other instances may not reach this instance's client-side caches, so their
    /// leases are capped at `feed.max_silence`. Absent while every feed is current or the feed
    /// does not run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    feed_down: bool,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Alive", body = StatusBody)))]
pub async fn healthz(State(state): State<AppState>) -> Response {
    Json(StatusBody {
        status: "ok",
        store: state.inner().store.kind(),
        layout_mismatches: Vec::new(),
        library_missing: Vec::new(),
        nodes_avoided: Vec::new(),
        warm_up_pending: None,
        feed_down: false,
    })
    .into_response()
}

/// Ready: not draining, the store answers, and the startup warm-up has ended.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = StatusBody),
        (status = 503, description = "unavailable: the instance is draining (`reason` `draining`: it is shutting down) or the store does not answer; warming_up: the startup warm-up runs (for at most server.readiness_warm_up; the member `warm_up_pending` names the replicas not yet discovered or measured); deadline_exceeded: it did not answer within server.request_deadline", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(
    State(state): State<AppState>,
    deadline: Option<Extension<Deadline>>,
    listening: Option<Extension<Listening>>,
    headers: HeaderMap,
) -> std::result::Result<Json<StatusBody>, ApiError> {
    let shows_nodes = match listening.map(|Extension(listening)| listening) {
        Some(Listening::Admin) => true,
        listening => state
            .inner()
            .auth
            .grants(&headers, Scope::Admin)
            .unwrap_or(listening != Some(Listening::Data)),
    };
    if state.is_draining() {
        return Err(ApiError::new(
            Code::Unavailable,
            "this instance is shutting down; retry on another",
        )
        .retry_later()
        .with_extension(serde_json::json!({ "reason": "draining" })));
    }
    let deadline = deadline.map(|Extension(deadline)| deadline);
    let inner = state.inner();
    deadline::within(deadline, inner.ready_ping.check(&inner.store)).await?;
    let warm_up_pending = match state.warm_up().readiness() {
        Readiness::WarmingUp(pending) => {
            let warming_up = ApiError::new(
                Code::WarmingUp,
                "warming up: replicas that replica-routed reads may use are not all discovered and measured yet",
            )
            .retry_later();
            return Err(if shows_nodes {
                warming_up.with_extension(serde_json::json!({
                    "warm_up_pending": pending,
                }))
            } else {
                warming_up
            });
        }
        Readiness::Ready(pending) => (shows_nodes && !pending.is_empty()).then_some(pending),
    };
    let nodes = |nodes: Vec<NodeLabel>| -> Vec<String> {
        if shows_nodes {
            nodes.iter().map(NodeLabel::to_string).collect()
        } else {
            Vec::new()
        }
    };
    Ok(Json(StatusBody {
        status: "ready",
        store: state.inner().store.kind(),
        layout_mismatches: state.inner().heal.layouts.mismatches(),
        library_missing: nodes(inner.store.library_missing()),
        nodes_avoided: nodes(inner.store.avoided_nodes()),
        warm_up_pending,
        feed_down: {
            let feed = state.ops().tracking().feed().view();
            feed.enabled && !feed.up
        },
    }))
}
