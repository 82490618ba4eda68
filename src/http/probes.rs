//! The load balancers' probes: `/healthz` (the process is alive) and `/readyz` (send it
//! traffic: not draining, the store answers, the startup warm-up has ended).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use super::problem::{ApiError, Code};
use super::AppState;
use crate::deadline::{self, Deadline};
use crate::route::{Readiness, WarmUpPending};
use crate::store::NodeLabel;

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
) -> Result<Json<StatusBody>, ApiError> {
    if state.is_draining() {
        return Err(ApiError::new(
            Code::Unavailable,
            "this instance is shutting down; retry on another",
        )
        .retry_later()
        .with_extension(serde_json::json!({ "reason": "draining" })));
    }
    let deadline = deadline.map(|Extension(deadline)| deadline);
    deadline::within(deadline, state.inner().store.ping()).await?;
    let warm_up_pending = match state.warm_up().readiness() {
        Readiness::WarmingUp(pending) => {
            return Err(ApiError::new(
                Code::WarmingUp,
                "warming up: replicas that replica-routed reads may use are not all discovered and measured yet",
            )
            .retry_later()
            .with_extension(serde_json::json!({
                "warm_up_pending": pending,
            })));
        }
        Readiness::Ready(pending) => (!pending.is_empty()).then_some(pending),
    };
    Ok(Json(StatusBody {
        status: "ready",
        store: state.inner().store.kind(),
        layout_mismatches: state.inner().heal.layouts.mismatches(),
        library_missing: state
            .inner()
            .store
            .library_missing()
            .iter()
            .map(NodeLabel::to_string)
            .collect(),
        nodes_avoided: state
            .inner()
            .store
            .avoided_nodes()
            .iter()
            .map(NodeLabel::to_string)
            .collect(),
        warm_up_pending,
    }))
}
