//! The live status page on the admin routes: `GET /status` (the HTML), its script, its
//! stylesheet and its icon (embedded in the binary with `include_str!`: no build step, no CDN), and
//! `GET /v1/fleet`, the JSON the page polls (every instance's figures, `crate::status`).
//!
//! Every page answer carries [`CONTENT_SECURITY_POLICY`]: scripts, styles and fetches from
//! this origin only, and nothing inline, so even a value that reached the DOM as markup could
//! run nothing. The script renders every datum with `textContent`, never as HTML.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::AppState;
use crate::status::{fleet_view, FleetView};

/// The page's policy: its own script and stylesheet, fetches to its own origin, no inline
/// script or style, no frames, no forms, no `<base>`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page.
const PAGE: &str = include_str!("status_page/index.html");
/// Its script.
const SCRIPT: &str = include_str!("status_page/status.js");
/// Its stylesheet.
const STYLE: &str = include_str!("status_page/status.css");
/// Its icon (without one, browsers ask for `/favicon.ico` and log the 404 as an error).
const ICON: &str = include_str!("status_page/favicon.svg");

/// `body` as `content_type` with the page's security headers.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The assets change only with the binary, but an upgrade must not leave an old script
    // against a new JSON shape: revalidate every time (they are small).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The live status page of the deployment (HTML; it polls `/v1/fleet`).
#[utoipa::path(
    get,
    path = "/status",
    tag = "operations",
    responses((status = 200, description = "The status page, under a Content-Security-Policy that allows only its own script, stylesheet and fetches", body = String, content_type = "text/html; charset=utf-8"))
)]
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// The status page's script.
#[utoipa::path(
    get,
    path = "/status/status.js",
    tag = "operations",
    responses((status = 200, description = "The status page's script", body = String, content_type = "text/javascript; charset=utf-8"))
)]
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The status page's stylesheet.
#[utoipa::path(
    get,
    path = "/status/status.css",
    tag = "operations",
    responses((status = 200, description = "The status page's stylesheet", body = String, content_type = "text/css; charset=utf-8"))
)]
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The status page's icon.
#[utoipa::path(
    get,
    path = "/status/favicon.svg",
    tag = "operations",
    responses((status = 200, description = "The status page's icon", body = String, content_type = "image/svg+xml"))
)]
pub async fn icon() -> Response {
    asset("image/svg+xml", ICON)
}

/// Every registered instance with its figures: retry queue, replica lag against the class
/// budgets, reads served by primaries by reason, near cache, families and layouts. This
/// instance's figures are live; the others' are the last each published into the store (every
/// `fleet.heartbeat_interval`).
#[utoipa::path(
    get,
    path = "/v1/fleet",
    tag = "operations",
    responses((status = 200, description = "Every instance the registry lists (this one always, also when the registry cannot be read: then `registry_error` says why), each with its figures when it published any", body = FleetView))
)]
pub async fn fleet(State(state): State<AppState>) -> Json<FleetView> {
    let inner = state.inner();
    let sources = state.sources();
    let interval_ms = crate::duration::millis(inner.registry.heartbeat_interval());
    Json(fleet_view(&inner.registry, &*inner.fleet, &sources, interval_ms).await)
}

#[cfg(test)]
mod tests {
    /// The page loads nothing from elsewhere and runs nothing inline: its one script and one
    /// stylesheet are the page's own routes, and no element carries an event handler or a
    /// style attribute (which the policy would refuse, as a console error).
    #[test]
    fn the_page_names_only_its_own_assets_and_has_nothing_inline() {
        let page = super::PAGE;
        assert!(page.contains(r#"<script src="status/status.js" defer></script>"#));
        assert!(page.contains(r#"<link rel="stylesheet" href="status/status.css">"#));
        assert!(page.contains(r#"<link rel="icon" href="status/favicon.svg""#));
        assert_eq!(page.matches("<script").count(), 1);
        assert!(!page.contains("<style") && !page.contains("javascript:"));
        assert!(!page.contains("http:") && !page.contains("https:"));
        // Every attribute of every tag: none is an event handler or a style.
        for tag in page.split('<').skip(1) {
            let tag = tag.split('>').next().unwrap_or_default();
            for attribute in tag.split_whitespace().skip(1) {
                let name = attribute.split('=').next().unwrap_or_default();
                assert!(
                    !name.starts_with("on") && name != "style",
                    "<{tag}> has {name}"
                );
            }
        }
        assert!(!super::SCRIPT.contains("innerHTML") && !super::SCRIPT.contains("outerHTML"));
        assert!(!super::SCRIPT.contains("insertAdjacentHTML") && !super::SCRIPT.contains("eval("));
    }
}
