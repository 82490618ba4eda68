//! The ceiling for an HTTP read path on this machine: a minimal axum → fred GET proxy.
//!
//! Not a criterion bench: `scripts/bench-side-by-side.sh` starts it with
//! `cargo bench --bench proxy_baseline -- --listen ADDR --redis redis://HOST:PORT` and drives it
//! with the same `wrk` load as hotsplit, so the two are compared in one run. Each request does
//! one `GET` through one shared fred client and nothing else. Run without `--listen` (as
//! `cargo bench` and `cargo test --benches` do) it exits at once.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use fred::prelude::*;

fn argument(name: &str) -> Option<String> {
    let mut args = std::env::args();
    args.position(|arg| arg == name)?;
    args.next()
}

async fn read(State(client): State<Client>, Path(key): Path<String>) -> Response {
    match client.get::<Option<Bytes>, _>(key).await {
        Ok(Some(value)) => value.into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
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
        let app = Router::new()
            .route("/v1/keys/{key}", get(read))
            .with_state(client);
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        axum::serve(listener, app).await?;
        Ok(())
    })
}
