//! The HTTP read answered from the near cache, without a socket: what hotsplit's listener serves
//! (its request layers, the read handler, the session token, the answer's headers), through the
//! read route's fast path and through the router, beside an axum router that answers the same
//! bytes from memory, each called in a loop as a `tower` service.
//!
//! What `scripts/bench-near.sh` measures end to end (wrk, hyper, the kernel) is mostly the
//! socket's cost, shared by both sides; this bench leaves it out, so what is left is what
//! hotsplit adds per request, in nanoseconds and heap allocations, and a profile of it
//! (`perf record` on this bench) shows hotsplit's code rather than the kernel's.
//!
//! The sides, each one task calling its router for `--requests` requests in a row, rotating
//! over 32 client ids as the wrk script does:
//! - `static`: `GET /v1/static/{key}` on a router whose one handler returns the value (512
//!   bytes), as `benches/proxy_baseline.rs`'s static route does;
//! - `hotsplit`: `GET /v1/keys/adv:1?client=…` on [`hotsplit::http::app`], as the listener
//!   serves it (the read route's fast path), with the default config (request layers on:
//!   request id, deadline, in-flight bound) over a throwaway `redis-server`
//!   ([`hotsplit_devcluster`]); the family `adv:` has 8 copies and the `advisory` class, so
//!   after the first read of each copy every answer is a near-cache hit (checked: the
//!   `Hotsplit-Route` header says `source=near-cache`, and the value's length);
//! - `router`: the same requests on the same state through [`hotsplit::http::App::router`],
//!   the path every read took before the fast path.
//!
//! The sides take turns, round after round; the output is one line per side on stdout:
//! `http_hit/<side>: <ns> ns/request, <n> allocations/request`, the median over the rounds, and
//! `http_hit/ratio: …` (static ÷ hotsplit time per request). Run with
//! `cargo bench --bench http_hit` or e.g. `cargo bench --bench http_hit -- --rounds 5
//! --requests 200000`. Without `--bench` (as `cargo test --benches` runs it) it does one short
//! round as a smoke test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hotsplit::config::Config;
use hotsplit::http::App;
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit_devcluster::Standalone;
use tower::{Service, ServiceExt};

/// Heap allocations (and reallocations) since the start.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations.
struct CountingAllocator;

// SAFETY: every call is passed on to `System` unchanged; the counter has no effect on memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// The value's size, as in the wrk runs.
const VALUE_BYTES: usize = 512;

/// The client ids each side rotates over, as `scripts/wrk-affine.lua` does per thread.
const CLIENT_IDS: usize = 32;

/// What a side calls.
enum Target {
    /// A router, called as a service.
    Router(Router),
    /// hotsplit's listener service.
    App(App),
}

/// A side's service and the paths it is asked for.
struct Side {
    /// `static`, `hotsplit` or `router`.
    name: &'static str,
    /// The service.
    app: Target,
    /// One path per client id.
    paths: Vec<String>,
    /// Whether an answer must say it came from the near cache.
    near: bool,
}

impl Side {
    /// Calls the router for `count` requests in a row; returns ns and allocations per request.
    /// With `warm_up`, an answer need not come from the near cache (the first reads fill it).
    async fn run(&mut self, count: usize, warm_up: bool) -> Result<(f64, f64), Box<dyn Error>> {
        let allocations = ALLOCATIONS.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut misses = 0;
        for turn in 0..count {
            if turn % 64 == 0 {
                // The router's futures answer at once, so this task would never yield: let the
                // near cache's refreshes (spawned tasks) run, as a connection task's socket
                // writes let them in the service.
                tokio::task::yield_now().await;
            }
            let request = Request::get(&self.paths[turn % self.paths.len()]).body(Body::empty())?;
            let response = match &mut self.app {
                Target::Router(router) => call(router, request).await?,
                Target::App(app) => app.call(request).await?,
            };
            if response.status() != StatusCode::OK {
                return Err(format!("{}: answered {}", self.name, response.status()).into());
            }
            if self.near
                && !response
                    .headers()
                    .get("hotsplit-route")
                    .and_then(|value| value.to_str().ok())
                    .is_some_and(|route| route.contains("source=near-cache"))
            {
                misses += 1;
            }
            let body = axum::body::to_bytes(response.into_body(), VALUE_BYTES * 2).await?;
            if body.len() != VALUE_BYTES {
                return Err(
                    format!("{}: {} bytes, not {VALUE_BYTES}", self.name, body.len()).into(),
                );
            }
        }
        let elapsed = started.elapsed().as_nanos() as f64;
        let allocated = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
        if !warm_up && misses * 100 > count {
            return Err(format!(
                "{}: {misses} of {count} answers missed the near cache",
                self.name
            )
            .into());
        }
        Ok((elapsed / count as f64, allocated as f64 / count as f64))
    }
}

/// One request through `app`, as hyper would make it.
async fn call(app: &mut Router, request: Request<Body>) -> Result<Response, Box<dyn Error>> {
    let service = ServiceExt::<Request<Body>>::ready(app).await?;
    Ok(service.call(request).await?)
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// `--name value` from the command line.
fn argument(name: &str) -> Option<String> {
    let mut args = std::env::args();
    args.position(|arg| arg == name)?;
    args.next()
}

/// Builds both sides over `server`.
async fn sides(server: &Standalone) -> Result<[Side; 3], Box<dyn Error>> {
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let paths = |prefix: &str| -> Vec<String> {
        (0..CLIENT_IDS)
            .map(|id| format!("{prefix}?client=client-00-{id:011}"))
            .collect()
    };
    let static_value = value.clone();
    let static_app = Router::new().route(
        "/v1/static/{key}",
        get(move || {
            let value = static_value.clone();
            async move { value }
        }),
    );

    let config = Config::from_toml(
        "[[family]]\nprefix = \"adv:\"\ncopies = 8\ndefault_class = \"advisory\"\n",
    )?;
    config.validate()?;
    let metrics = Metrics::new();
    let store = Arc::new(
        RedisStore::connect(
            RedisOptions::new(RedisTarget::parse(&server.url())?),
            metrics.clone(),
        )
        .await?,
    );
    let state = hotsplit::server::app_state(&config, store, metrics)?;
    let app = hotsplit::http::app(state);
    let mut router = app.router().clone();
    let publish = Request::put("/v1/keys/adv:1?version=1").body(Body::from(value))?;
    let published = call(&mut router, publish).await?;
    if !published.status().is_success() {
        return Err(format!("publish answered {}", published.status()).into());
    }
    Ok([
        Side {
            name: "static",
            app: Target::Router(static_app),
            paths: paths("/v1/static/static:1"),
            near: false,
        },
        Side {
            name: "hotsplit",
            app: Target::App(app),
            paths: paths("/v1/keys/adv:1"),
            near: true,
        },
        Side {
            name: "router",
            app: Target::Router(router),
            paths: paths("/v1/keys/adv:1"),
            near: true,
        },
    ])
}

fn run() -> Result<(), Box<dyn Error>> {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let rounds: usize =
        argument("--rounds").map_or(Ok(if bench { 5 } else { 1 }), |r| r.parse())?;
    let requests: usize =
        argument("--requests").map_or(Ok(if bench { 100_000 } else { 1_000 }), |r| r.parse())?;
    let server = Standalone::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut figures: [Vec<(f64, f64)>; 3] = Default::default();
    runtime.block_on(async {
        let mut sides = sides(&server).await?;
        for side in &mut sides {
            // A warm-up, which also fills the near cache's entries.
            side.run(requests / 10 + CLIENT_IDS, true).await?;
        }
        for round in 0..rounds {
            let mut line = format!("http_hit: round {}/{rounds}:", round + 1);
            for turn in 0..sides.len() {
                let index = (round + turn) % sides.len();
                let side = &mut sides[index];
                let (ns, allocations) = side.run(requests, false).await?;
                line.push_str(&format!(
                    " {} {ns:.0} ns ({allocations:.1} allocations)",
                    side.name
                ));
                figures[index].push((ns, allocations));
            }
            eprintln!("{line}");
        }
        Ok::<(), Box<dyn Error>>(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(server);
    let mut medians = Vec::new();
    for (name, rows) in ["static", "hotsplit", "router"].iter().zip(&figures) {
        let ns = median(rows.iter().map(|row| row.0).collect());
        let allocations = median(rows.iter().map(|row| row.1).collect());
        println!(
            "http_hit/{name}: {ns:.0} ns/request, {allocations:.1} allocations/request (median of {rounds} rounds of {requests})"
        );
        medians.push(ns);
    }
    println!(
        "http_hit/ratio: {:.2} (static ÷ hotsplit time per request; hotsplit adds {:.0} ns; through the router {:.2}, adding {:.0} ns)",
        medians[0] / medians[1],
        medians[1] - medians[0],
        medians[0] / medians[2],
        medians[2] - medians[0]
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("http_hit bench: {err}");
            ExitCode::FAILURE
        }
    }
}
