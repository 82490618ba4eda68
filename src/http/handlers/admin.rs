//! The operations and routing routes: affinity, classes, lag, routing, metrics, the retry
//! queue and the near cache.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::http::params::{self, StrictQuery};
use crate::http::problem::{ApiError, Code};
use crate::http::AppState;
use crate::key::Key;
use crate::wire;

/// Query parameters of `GET /v1/affinity`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AffinityParams {
    /// The key: 1..=512 printable ASCII bytes without '{', '}' or '#'.
    #[param(required = true, value_type = String, min_length = 1, max_length = 512, pattern = r##"^[!-"$-z|~]+$"##)]
    key: Option<String>,
    /// The client id.
    #[param(required = true, value_type = String, min_length = 1)]
    client: Option<String>,
}

/// Which copy a client reads.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AffinityBody {
    /// The key.
    key: String,
    /// The copy index the client reads.
    copy: u32,
    /// The copy's stored key, `K#i`.
    copy_key: String,
    /// How many copies the key's family has.
    copies: u32,
    /// The node that owns the copy.
    node: String,
}

/// The read classes, their reasons, and the families that use each by default.
#[utoipa::path(
    get,
    path = "/v1/classes",
    tag = "routing",
    responses((status = 200, description = "Every read class", body = Vec<crate::route::ClassView>))
)]
pub async fn classes(State(state): State<AppState>) -> Response {
    Json(state.sources().classes()).into_response()
}

/// Replica lag per replica: now, p50, p99, p999, max over the window, offset gap, and whether
/// each replica class accepts it now.
#[utoipa::path(
    get,
    path = "/v1/lag",
    tag = "routing",
    responses((status = 200, description = "One line per replica", body = Vec<crate::route::ReplicaLagView>))
)]
pub async fn lag(State(state): State<AppState>) -> Response {
    Json(state.sources().lag()).into_response()
}

/// Per class: how many reads the primary served, and why.
#[utoipa::path(
    get,
    path = "/v1/routing",
    tag = "routing",
    responses((status = 200, description = "One line per class", body = Vec<crate::route::ClassRouting>))
)]
pub async fn routing(State(state): State<AppState>) -> Response {
    Json(state.sources().routing()).into_response()
}

/// Which copy a client reads for a key, and where it lives.
#[utoipa::path(
    get,
    path = "/v1/affinity",
    tag = "keys",
    params(AffinityParams),
    responses(
        (status = 200, description = "The affine copy", body = AffinityBody),
        (status = 400, description = "invalid_key, missing_client or invalid_parameter (a malformed or repeated parameter)", body = crate::http::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn affinity(
    State(state): State<AppState>,
    StrictQuery(params): StrictQuery<AffinityParams>,
) -> Result<Json<AffinityBody>, ApiError> {
    let key = Key::parse(params.key.as_deref().unwrap_or_default())?;
    let client = params
        .client
        .filter(|client| !client.is_empty())
        .ok_or_else(|| ApiError::new(Code::MissingClient, "send ?client=ID"))?;
    let affinity = state.ops().reader().affinity(&key, &client);
    Ok(Json(AffinityBody {
        key: key.to_string(),
        copy: affinity.copy,
        copy_key: affinity.copy_key.to_string(),
        copies: affinity.copies,
        node: affinity.node,
    }))
}

/// Prometheus metrics in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "OpenMetrics text", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], {
        state.inner().heal.retry_queue.refresh_gauges();
        state.inner().metrics.render()
    })
        .into_response()
}

/// Query parameters of `GET /v1/retry-queue`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetryQueueParams {
    /// How many entries to list, oldest first: canonical decimal, 0..=10000. Default: 100.
    #[param(value_type = Option<u32>, minimum = 0, maximum = 10000)]
    limit: Option<String>,
}

/// The retry queue: depth, bytes, per-node backoff state and the oldest entries.
#[utoipa::path(
    get,
    path = "/v1/retry-queue",
    tag = "operations",
    params(RetryQueueParams),
    responses(
        (status = 200, description = "The retry queue", body = crate::heal::RetryQueueView),
        (status = 400, description = "invalid_parameter: limit is not canonical decimal in 0..=10000, or a parameter is malformed or repeated", body = crate::http::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry_queue(
    State(state): State<AppState>,
    StrictQuery(params): StrictQuery<RetryQueueParams>,
) -> Result<Json<crate::heal::RetryQueueView>, ApiError> {
    let limit = match params.limit.as_deref() {
        None => 100,
        Some(raw) => params::parse_canonical_u64(raw, wire::query::LIMIT)
            .map_err(|why| ApiError::new(Code::InvalidParameter, why))?,
    };
    if limit > 10_000 {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("{} must be at most 10000, got {limit}", wire::query::LIMIT),
        ));
    }
    let limit = usize::try_from(limit).unwrap_or(10_000);
    Ok(Json(state.inner().heal.retry_queue.view(limit)))
}

/// The near cache: entries, bytes, hit ratio and the hottest copies by hits.
#[utoipa::path(
    get,
    path = "/v1/near-cache",
    tag = "operations",
    responses(
        (status = 200, description = "The near cache; `enabled` is false (and every figure 0) on the embedded store or with near_cache.enabled = false", body = crate::near::NearCacheView),
    )
)]
pub async fn near_cache(State(state): State<AppState>) -> Json<crate::near::NearCacheView> {
    Json(
        state
            .ops()
            .reader()
            .near_cache()
            .map_or_else(crate::near::NearCacheView::off, |near| near.view(20)),
    )
}

/// The hot keys: this instance's last window, live, and the fleet's, summed from every
/// instance's published figures.
#[utoipa::path(
    get,
    path = "/v1/hot-keys",
    tag = "operations",
    responses(
        (status = 200, description = "This instance's hot-key detector ([hot_keys]: keys empty until a window closed, or with hot_keys.enabled = false) and the fleet's most read keys, summed over the instances that publish them", body = crate::status::hot_keys::HotKeysAnswer),
    )
)]
pub async fn hot_keys(
    State(state): State<AppState>,
) -> Json<crate::status::hot_keys::HotKeysAnswer> {
    let inner = state.inner();
    let sources = state.sources();
    let list = inner
        .ops
        .reader()
        .hot_keys()
        .map_or(10, |hot| hot.config().list);
    let interval_ms = crate::duration::millis(inner.registry.heartbeat_interval());
    let fleet =
        crate::status::fleet_view(&inner.registry, &*inner.fleet, &sources, interval_ms).await;
    Json(crate::status::hot_keys::HotKeysAnswer {
        instance: sources.hot_keys(list),
        fleet: crate::status::hot_keys::FleetHotKeys::of(&fleet, list),
    })
}

/// Unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::new(Code::NotFound, "no such route")
}

/// Known routes with an unsupported method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not support that method",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::handlers::query;

    #[test]
    fn the_affinity_and_retry_queue_parameters_read_the_wire_names() {
        use wire::query;
        let affinity: AffinityParams = query(&format!("{}=p:1&{}=a", query::KEY, query::CLIENT));
        assert_eq!(
            (affinity.key, affinity.client),
            (Some("p:1".to_owned()), Some("a".to_owned()))
        );
        let retry: RetryQueueParams = query(&format!("{}=5", query::LIMIT));
        assert_eq!(retry.limit.as_deref(), Some("5"));
    }
}
