//! `GET /v1/instances`: every instance registered in the store (`crate::fleet`), an admin
//! endpoint.

use axum::extract::State;
use axum::{Extension, Json};

use super::problem::ApiError;
use super::AppState;
use crate::deadline::{self, Deadline};
use crate::fleet::InstancesView;

/// Every registered instance: id, API and admin addresses, release, function library, start
/// time and last heartbeat; and the families whose layout the answering instance sees
/// disagreeing, with who wrote the record.
#[utoipa::path(
    get,
    path = "/v1/instances",
    tag = "operations",
    responses(
        (status = 200, description = "Every instance whose registry entry has not lapsed, by id, the id of the one that answered, and the layout mismatches it sees", body = InstancesView),
        (status = 503, description = "unavailable: the store does not answer; deadline_exceeded: it did not answer within server.request_deadline", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn instances(
    State(state): State<AppState>,
    deadline: Option<Extension<Deadline>>,
) -> Result<Json<InstancesView>, ApiError> {
    let deadline = deadline.map(|Extension(deadline)| deadline);
    let mut view = deadline::within(deadline, state.inner().registry.view()).await?;
    view.layout_mismatches = state.inner().heal.layouts.mismatch_view();
    Ok(Json(view))
}
