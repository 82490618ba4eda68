//! `GET /v1/instances`: every instance registered in the store (`crate::fleet`), an admin
//! endpoint.

use axum::extract::State;
use axum::Json;

use super::problem::ApiError;
use super::AppState;
use crate::fleet::InstancesView;

/// Every registered instance: id, API and admin addresses, release, function library, start
/// time and last heartbeat.
#[utoipa::path(
    get,
    path = "/v1/instances",
    tag = "operations",
    responses(
        (status = 200, description = "Every instance whose registry entry has not lapsed, by id, and the id of the one that answered", body = InstancesView),
        (status = 503, description = "unavailable: the store does not answer", body = super::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn instances(State(state): State<AppState>) -> Result<Json<InstancesView>, ApiError> {
    Ok(Json(state.inner().registry.view().await?))
}
