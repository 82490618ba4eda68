//! The ceilings for an HTTP read path on this machine: a minimal axum → fred GET proxy, and the
//! same axum server answering the same bytes from memory.
//!
//! Not a criterion bench: `scripts/bench-side-by-side.sh` starts it with
//! `cargo bench --bench proxy_baseline -- --listen ADDR --redis redis://HOST:PORT --static-key KEY`
//! and drives it with the same `wrk` load as hotsplit, so they are compared in one run. On
//! `/v1/keys/{key}` each request does one `GET` through one shared fred client and nothing else:
//! the cheapest HTTP read that reaches Redis. On `/v1/static/{key}` each request answers the value
//! that `KEY` held at startup (read once, then held as `Bytes`) without touching Redis: the most
//! any HTTP read can do on these cores, and the ceiling of a read answered from the near cache.
//! Both routes are served by one `axum::serve` on one runtime, so only the handler differs. Run
//! without `--listen` (as `cargo bench` and `cargo test --benches` do) it exits at once.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use fred::prelude::*;

/// What the handlers share.
#[derive(Clone)]
struct Baseline {
    /// The one fred client every proxied `GET` goes through.
    client: Client,
    /// The bytes the static route answers: `--static-key`'s value at startup (empty without it).
    static_value: Bytes,
}

fn argument(name: &str) -> Option<String> {
    let mut args = std::env::args();
    args.position(|arg| arg == name)?;
    args.next()
}

async fn read(State(baseline): State<Baseline>, Path(key): Path<String>) -> Response {
    match baseline.client.get::<Option<Bytes>, _>(key).await {
        Ok(Some(value)) => value.into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Answers the held bytes. The key is extracted as the proxy's is, so the two routes differ only
/// in where the value comes from.
async fn read_static(State(baseline): State<Baseline>, Path(_key): Path<String>) -> Response {
    baseline.static_value.clone().into_response()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (Some(listen), Some(redis)) = (argument("--listen"), argument("--redis")) else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = Builder::from_config(Config::from_url(&redis)?).build()?;
        client.init().await?;
        let static_value = match argument("--static-key") {
            Some(key) => client
                .get::<Option<Bytes>, _>(key.as_str())
                .await?
                .ok_or_else(|| format!("--static-key {key}: no such key"))?,
            None => Bytes::new(),
        };
        let app = Router::new()
            .route("/v1/keys/{key}", get(read))
            .route("/v1/static/{key}", get(read_static))
            .with_state(Baseline {
                client,
                static_value,
            });
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        axum::serve(listener, app).await?;
        Ok(())
    })
}
