//! `GET /v1/scrub`: what the anti-entropy scrub has done (an admin view).

use axum::extract::State;
use axum::Json;

use super::AppState;
use crate::heal::scrub::ScrubView;

/// The anti-entropy scrub: whether this instance takes part and holds the lease, the pass
/// running now and the last finished one (keys scanned and checked, copies repaired by cause,
/// failures, duration), and the families it skips for a layout mismatch.
#[utoipa::path(
    get,
    path = "/v1/scrub",
    tag = "operations",
    responses((status = 200, description = "The scrub's state on this instance", body = ScrubView))
)]
pub async fn scrub(State(state): State<AppState>) -> Json<ScrubView> {
    Json(state.inner().heal.scrub.view())
}
