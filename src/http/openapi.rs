//! The OpenAPI document, generated from the handlers' annotations.
//!
//! `docs/openapi.json` is a checked-in copy; a test fails when the two drift. Regenerate it with
//! `cargo run -- openapi > docs/openapi.json`. The route that serves it, [`serve`], lives here
//! too, so that `handlers` never imports this module (which imports `handlers`).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::handlers;
use super::instances;
use super::openapi_edge::Edge;
use super::problem::{Code, Problem};
use super::status_page;
use crate::heal::queue::{EntryView, NodeState, NodeView, RetryQueueView};
use crate::publish::{CopyOutcome, CopyReport, PublishReport};

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "hotsplit",
        description = "Split copies of hot Redis values with versioned publish and client-affine, monotonic reads. Every route is served on `server.listen` unless `[admin] listen` is set: then /healthz, /readyz, /metrics, /v1/classes, /v1/lag, /v1/routing, /v1/retry-queue, /v1/instances, /v1/near-cache, /v1/hot-keys, /v1/fleet and the status page (/status, /status/status.js, /status/status.css, /status/favicon.svg) are served on the admin address only (404 on `server.listen`), and the keys, /v1/affinity and this document on `server.listen` only. With `server.tls_cert_file` both listeners speak HTTPS only."
    ),
    paths(
        handlers::publish_key,
        handlers::invalidate_key,
        handlers::read_key,
        handlers::affinity,
        handlers::classes,
        handlers::lag,
        handlers::routing,
        handlers::retry_queue,
        instances::instances,
        handlers::near_cache,
        handlers::hot_keys,
        status_page::fleet,
        status_page::page,
        status_page::script,
        status_page::style,
        status_page::icon,
        super::scrub::scrub,
        super::probes::healthz,
        super::probes::readyz,
        handlers::metrics,
        serve,
    ),
    components(schemas(PublishReport, CopyReport, CopyOutcome, Problem, Code, handlers::AffinityBody, super::probes::StatusBody, crate::route::WarmUpPending, crate::route::ClassView, crate::route::ReplicaLagView, crate::route::LagFigures, crate::route::ClassRouting, RetryQueueView, NodeView, EntryView, NodeState, crate::fleet::InstancesView, crate::store::InstanceRecord, crate::layout::LayoutMismatch, crate::store::LayoutWriter, crate::near::NearCacheView, crate::near::HotCopy, crate::status::FleetView, crate::status::FleetMember, crate::status::InstanceStatus, crate::status::ClassBudget, crate::status::FamilyStatus, crate::heal::scrub::ScrubView, crate::heal::scrub::PassFigures)),
    // The request limits' answers first, so the edge gives them their headers too.
    modifiers(&RequestLimitAnswers, &Edge),
    tags(
        (name = "keys", description = "Publish, invalidate and read split keys"),
        (name = "routing", description = "Read classes, replica lag and where reads were served"),
        (name = "operations", description = "Health, readiness, metrics, the retry queue, the near cache, the instances, the status page, the scrub and this document")
    )
)]
pub struct ApiDoc;

/// Adds the answers of the request limits (`http::overload`) to every operation: 414
/// `query_too_long` everywhere, and 503 `overloaded` on every route the in-flight bound counts.
/// Written once here rather than on each handler, so a route added later states them too.
struct RequestLimitAnswers;

impl Modify for RequestLimitAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        const OVERLOADED: &str = "overloaded: server.max_in_flight requests were in flight (or, for a publish, server.max_receiving_bodies bodies or server.max_receiving_bytes were arriving); nothing was read or written, with Retry-After";
        for (path, item) in openapi.paths.paths.iter_mut() {
            let exempt = super::overload::EXEMPT.contains(&path.as_str());
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.delete,
                &mut item.head,
                &mut item.post,
            ];
            for operation in operations.into_iter().flatten() {
                add_problem(
                    operation,
                    "414",
                    "query_too_long: the query string is longer than server.max_query_bytes",
                );
                if !exempt {
                    add_problem(operation, "503", OVERLOADED);
                }
            }
        }
    }
}

/// Adds a problem+json answer with `status` to `operation`, or appends `description` to the one
/// it has.
fn add_problem(operation: &mut Operation, status: &str, description: &str) {
    let responses = &mut operation.responses.responses;
    if let Some(RefOr::T(response)) = responses.get_mut(status) {
        response.description = format!("{}; or {description}", response.description);
        return;
    }
    let problem = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .build();
    responses.insert(
        status.to_owned(),
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(super::problem::PROBLEM_JSON, problem)
                .build(),
        ),
    );
}

/// The OpenAPI document as pretty JSON, with a trailing newline.
pub fn openapi_json() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|err| format!("{{\"error\": \"{err}\"}}"));
    text.push('\n');
    text
}

/// This API's OpenAPI document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", operation_id = "openapi_json", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn serve() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}
