//! Request handlers: parse, call the library, render. Each is documented for the OpenAPI spec.
//!
//! # Layout
//! - `read`: `GET /v1/keys/{key}`.
//! - `write`: `PUT` and `DELETE /v1/keys/{key}`.
//! - `admin`: the operations and routing routes, and the fallbacks.
//! - `answer`: the read answer's header values, pre-rendered where they repeat.

mod admin;
mod answer;
mod read;
mod write;

use axum::http::HeaderName;

use crate::wire;

pub use admin::*;
pub(crate) use answer::RouteTexts;
pub use read::*;
pub use write::*;

/// `Hotsplit-Version`, checked at compile time.
const VERSION: HeaderName = HeaderName::from_static(wire::header::VERSION);
/// `Hotsplit-Copy`.
const COPY: HeaderName = HeaderName::from_static(wire::header::COPY);
/// `Hotsplit-Served-By`.
const SERVED_BY: HeaderName = HeaderName::from_static(wire::header::SERVED_BY);
/// `Hotsplit-Route`.
const ROUTE: HeaderName = HeaderName::from_static(wire::header::ROUTE);

/// Deserializes `query` into `T` as the routes' [`StrictQuery`](super::params::StrictQuery)
/// extractor does.
#[cfg(test)]
fn query<T: serde::de::DeserializeOwned>(query: &str) -> T {
    use super::params;
    params::from_pairs(params::decode_query(query).unwrap()).unwrap()
}
