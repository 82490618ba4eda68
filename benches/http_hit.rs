//! The HTTP read answered from the near cache, without a socket: what hotsplit's listener serves
//! (its request layers, the read handler, the session token, the answer's headers), through the
//! read route's fast path and through the router, beside an axum router that answers the same
//! bytes from memory, each called in a loop as a `tower` service.
//!
//! What `scripts/bench-near.sh` measures end to end (wrk, hyper, the kernel) is mostly the
//! socket's cost, shared by both sides; this bench leaves it out, so what is left is what
//! hotsplit adds per request, in nanoseconds and heap allocations, and a profile of it
//! (`perf record` on this bench) shows hotsplit's code rather than the kernel's. For the same
//! reason it is where the hot-key detector's cost on the hit path is judged (part 7 of
//! `scripts/bench-side-by-side.sh`, `scripts/bench-hot.sh`): the ±15 % spread of wrk's rounds
//! hides a 3 % difference; this bench's paired rounds leave the socket's noise out.
//!
//! The sides, each calling its service for `--requests` requests per round, rotating over 32
//! client ids as the wrk script does:
//! - `static`: `GET /v1/static/{key}` on a router whose one handler returns the value (512
//!   bytes), as `benches/proxy_baseline.rs`'s static route does;
//! - `hotsplit`: `GET /v1/keys/adv:1?client=…` on [`hotsplit::http::app`], as the listener
//!   serves it (the read route's fast path), with the default config (request layers on:
//!   request id, deadline, in-flight bound; `[hot_keys]` at its defaults: every read counted
//!   into the detector's table under its lock up to 4096 a second, one in k above) over a
//!   throwaway `redis-server` ([`hotsplit_devcluster`]); the family `adv:` has 8 copies and the `advisory` class, so
//!   after the first read of each copy every answer is a near-cache hit (checked: the
//!   `Hotsplit-Route` header says `source=near-cache`, and the value's length);
//! - `hotsplit_detect_off`: the same requests on an app of its own state (its own store
//!   connection and metrics, the same `redis-server`) built from the same config plus
//!   `[hot_keys] enabled = false`: what `hotsplit` costs without the detector. Each state runs
//!   the detector's window task as a server does, so the `hotsplit` side samples as a server
//!   at this read rate would (one in `⌈rate ÷ hot_keys.samples_per_s⌉`).
//! - `router`: the same requests on the `hotsplit` state through
//!   [`hotsplit::http::App::router`], the path every read took before the fast path.
//!
//! `--tasks N` (default 1) runs each side as N concurrent tasks, the round's requests split
//! evenly between them, on a multi-thread runtime of N + 1 worker threads: one per task, and one
//! for the near cache's refreshes (see `run`); one task alone never contends for a lock (the
//! detector's table, the near cache's shards, the metrics), N do. Time per request is the
//! round's wall time × N ÷ its requests: what one task spends per request, so with no contention
//! it is the one-task figure, and contention shows as a rise (requests/s are N × 10⁹ ÷ it).
//! Before each timed run a side is read 32 × N times untimed, which refills the entries that
//! aged out (125 ms) while the other sides ran.
//!
//! The sides take turns, round after round: `static`, the detection pair and `router` rotate,
//! and the pair's two sides run back to back, which of them first alternating, so the drift
//! between rounds (a busy machine, frequency changes) is the same for both halves of a round's
//! pair and cancels in its ratio. Each round prints a line on stderr; the output on stdout is one
//! line per side, `http_hit/<side>: <ns> ns/request, <n> allocations/request`, the median over
//! the rounds, then `http_hit/ratio: …` (static ÷ hotsplit time per request) and
//! `http_hit/ratio/detect_on_vs_off: <ratio> (median of the per-round ratios of ns/request,
//! on ÷ off; cost <x.x> %)`, the figure the detector's ≤ 3 % target is judged on (cost =
//! (ratio − 1) × 100). Last, `http_hit/detector_observe: …` times the detector's call alone
//! (`HotKeys::observe` on one key) at one in 1 (every read takes the table's lock, a server's
//! sampling below `samples_per_s` reads a second) by one thread and by N at once (the worst
//! case: every read contends for the lock), and at one in 16 by N, each also as a share of the
//! `hotsplit` side's time per request: what
//! detection can cost a hit, measured without the request around it, whose rounds spread far
//! wider than the 3 % judged. Run with `cargo bench --bench http_hit` or e.g. `cargo bench --bench
//! http_hit -- --rounds 15 --requests 150000 --tasks 2`. Without `--bench` (as `cargo test
//! --benches` runs it) it does one short round of 1,000 requests as a smoke test, which allows
//! 10 % of the answers, not 1 %, to miss the near cache (a debug build is slow enough for
//! entries to age out before their refresh lands).

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

/// What the bench's steps fail with (`Send`, as the tasks' errors cross to the caller).
type BenchError = Box<dyn Error + Send + Sync>;

/// The value's size, as in the wrk runs.
const VALUE_BYTES: usize = 512;

/// The client ids each side rotates over, as `scripts/wrk-affine.lua` does per thread.
const CLIENT_IDS: usize = 32;

/// The family every hotsplit side serves.
const FAMILY_TOML: &str =
    "[[family]]\nprefix = \"adv:\"\ncopies = 8\ndefault_class = \"advisory\"\n";

/// The index of `static` in [`sides`]'s answer and in [`NAMES`].
const STATIC: usize = 0;
/// The index of `hotsplit` (detection on, at its defaults).
const HOTSPLIT: usize = 1;
/// The index of `hotsplit_detect_off`.
const DETECT_OFF: usize = 2;
/// The index of `router`.
const ROUTER: usize = 3;
/// Each side's name, by index.
const NAMES: [&str; 4] = ["static", "hotsplit", "hotsplit_detect_off", "router"];

/// What a side calls; cheap to clone (one clone per task).
#[derive(Clone)]
enum Target {
    /// A router, called as a service.
    Router(Router),
    /// hotsplit's listener service.
    App(App),
}

/// A side's service and the paths it is asked for; cheap to clone (one clone per task).
#[derive(Clone)]
struct Side {
    /// One of [`NAMES`].
    name: &'static str,
    /// The service.
    app: Target,
    /// One path per client id, shared by the side's tasks.
    paths: Arc<[String]>,
    /// Whether an answer must say it came from the near cache.
    near: bool,
}

impl Side {
    /// Calls the service for `count` requests, split evenly over `tasks` concurrent tasks;
    /// returns ns per request (wall time × `tasks` ÷ requests) and allocations per request.
    /// Fails when more than `max_missed` of the answers (a share, 0.0..=1.0) did not come from
    /// the near cache; a warm-up, whose first reads fill it, passes 1.0.
    async fn run(
        &self,
        count: usize,
        tasks: usize,
        max_missed: f64,
    ) -> Result<(f64, f64), BenchError> {
        let per_task = (count / tasks).max(1);
        let count = per_task * tasks;
        let allocations = ALLOCATIONS.load(Ordering::Relaxed);
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                // Each task starts at its own client id, so the tasks do not read the same
                // copy in lockstep.
                let first = task * self.paths.len() / tasks;
                tokio::spawn(requests(self.clone(), first, per_task))
            })
            .collect();
        let mut misses = 0;
        for handle in handles {
            misses += handle.await??;
        }
        let elapsed = started.elapsed().as_nanos() as f64;
        let allocated = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
        if misses as f64 > max_missed * count as f64 {
            return Err(format!(
                "{}: {misses} of {count} answers missed the near cache",
                self.name
            )
            .into());
        }
        Ok((
            elapsed * tasks as f64 / count as f64,
            allocated as f64 / count as f64,
        ))
    }
}

/// One task of `side`: `count` requests in a row, from the client id `first` on; returns how
/// many answers did not come from the near cache (counted only when the side's `near`).
async fn requests(side: Side, first: usize, count: usize) -> Result<usize, BenchError> {
    let Side {
        name,
        mut app,
        paths,
        near,
    } = side;
    let mut misses = 0;
    for turn in 0..count {
        if turn % 64 == 0 {
            // The router's futures answer at once, so this task would never yield: let the
            // near cache's refreshes (spawned tasks) run, as a connection task's socket
            // writes let them in the service.
            tokio::task::yield_now().await;
        }
        let request = Request::get(&paths[(first + turn) % paths.len()]).body(Body::empty())?;
        let response = match &mut app {
            Target::Router(router) => call(router, request).await?,
            Target::App(app) => app.call(request).await?,
        };
        if response.status() != StatusCode::OK {
            return Err(format!("{name}: answered {}", response.status()).into());
        }
        if near
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
            return Err(format!("{name}: {} bytes, not {VALUE_BYTES}", body.len()).into());
        }
    }
    Ok(misses)
}

/// One request through `app`, as hyper would make it.
async fn call(app: &mut Router, request: Request<Body>) -> Result<Response, BenchError> {
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

/// The order of the sides in round `round`: `static`, the detection pair and `router` rotate,
/// and the pair's two sides run back to back, which of them first alternating from round to
/// round.
fn order(round: usize) -> Vec<usize> {
    let pair = if round.is_multiple_of(2) {
        [HOTSPLIT, DETECT_OFF]
    } else {
        [DETECT_OFF, HOTSPLIT]
    };
    let units: [&[usize]; 3] = [&[STATIC], &pair, &[ROUTER]];
    (0..units.len())
        .flat_map(|turn| units[(round + turn) % units.len()].iter().copied())
        .collect()
}

/// hotsplit's listener service over its own state (store connection, metrics) on `server`,
/// built from `toml`.
async fn hotsplit_app(server: &Standalone, toml: &str) -> Result<App, BenchError> {
    let config = Config::from_toml(toml)?;
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
    // The detector's windows close as in a server (the task ends with the runtime), so its
    // sampling follows this bench's read rate.
    if let Some(hot) = state.ops().reader().hot_keys() {
        tokio::spawn(hot.clone().run(tokio_util::sync::CancellationToken::new()));
    }
    Ok(hotsplit::http::app(state))
}

/// Builds the sides over `server`, in the order of [`NAMES`].
async fn sides(server: &Standalone) -> Result<[Side; 4], BenchError> {
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let paths = |prefix: &str| -> Arc<[String]> {
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

    // The copies are written through a state of their own, so the two measured states differ
    // only in `[hot_keys]` (neither has published).
    let publisher = hotsplit_app(server, FAMILY_TOML).await?;
    let publish = Request::put("/v1/keys/adv:1?version=1").body(Body::from(value))?;
    let published = call(&mut publisher.router().clone(), publish).await?;
    if !published.status().is_success() {
        return Err(format!("publish answered {}", published.status()).into());
    }
    let app = hotsplit_app(server, FAMILY_TOML).await?;
    let detect_off = hotsplit_app(
        server,
        &format!("{FAMILY_TOML}[hot_keys]\nenabled = false\n"),
    )
    .await?;
    let router = app.router().clone();
    let side = |index: usize, app: Target, prefix: &str| Side {
        name: NAMES[index],
        app,
        paths: paths(prefix),
        near: index != STATIC,
    };
    Ok([
        side(STATIC, Target::Router(static_app), "/v1/static/static:1"),
        side(HOTSPLIT, Target::App(app), "/v1/keys/adv:1"),
        side(DETECT_OFF, Target::App(detect_off), "/v1/keys/adv:1"),
        side(ROUTER, Target::Router(router), "/v1/keys/adv:1"),
    ])
}

fn run() -> Result<(), BenchError> {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let rounds: usize =
        argument("--rounds").map_or(Ok(if bench { 5 } else { 1 }), |r| r.parse())?;
    let requests: usize =
        argument("--requests").map_or(Ok(if bench { 100_000 } else { 1_000 }), |r| r.parse())?;
    let tasks: usize = argument("--tasks").map_or(Ok(1), |t| t.parse())?;
    // An entry lives 125 ms and is refreshed one fill time before it ages out. The release
    // build's requests leave a refresh time to land (a few misses in 100,000); the debug build
    // a smoke test runs is 30–50 times slower, on a busy machine more, and a late refresh costs
    // each copy a miss or two per 125 ms: a share the check must allow and the figures ignore.
    let max_missed = if bench { 0.01 } else { 0.1 };
    if rounds == 0 || requests == 0 || tasks == 0 {
        return Err("--rounds, --requests and --tasks must be at least 1".into());
    }
    let server = Standalone::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // One worker per task, and one more: the near cache's refreshes (spawned tasks) and
        // the Redis answers they wait for are handled at once, as in a server whose connection
        // tasks give way at every socket read. On the tasks' own workers alone they would wait
        // for a `yield_now` (every 64 requests) and tokio's I/O poll (every 61 scheduler ticks),
        // and the entries age out before they are refreshed.
        .worker_threads(tasks + 1)
        .enable_all()
        .build()?;
    let mut figures: [Vec<(f64, f64)>; 4] = Default::default();
    runtime.block_on(async {
        let sides = sides(&server).await?;
        for side in &sides {
            // A warm-up, which also fills the near cache's entries.
            side.run(requests / 10 + CLIENT_IDS * tasks, tasks, 1.0)
                .await?;
        }
        for round in 0..rounds {
            let mut line = format!("http_hit: round {}/{rounds}:", round + 1);
            for index in order(round) {
                let side = &sides[index];
                // The copies' entries age out (125 ms) while the other sides run: refill them,
                // untimed, so the timed requests are all hits.
                side.run(CLIENT_IDS * tasks, tasks, 1.0).await?;
                let (ns, allocations) = side.run(requests, tasks, max_missed).await?;
                line.push_str(&format!(
                    " {} {ns:.0} ns ({allocations:.1} allocations)",
                    side.name
                ));
                figures[index].push((ns, allocations));
            }
            let on_vs_off = figures[HOTSPLIT][round].0 / figures[DETECT_OFF][round].0;
            eprintln!("{line}; detection on ÷ off {on_vs_off:.3}");
        }
        Ok::<(), BenchError>(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(server);
    let mut medians = Vec::new();
    for (name, rows) in NAMES.iter().zip(&figures) {
        let ns = median(rows.iter().map(|row| row.0).collect());
        let allocations = median(rows.iter().map(|row| row.1).collect());
        println!(
            "http_hit/{name}: {ns:.0} ns/request, {allocations:.1} allocations/request (median of {rounds} rounds of {requests} over {tasks} task(s))"
        );
        medians.push(ns);
    }
    println!(
        "http_hit/ratio: {:.2} (static ÷ hotsplit time per request; hotsplit adds {:.0} ns; through the router {:.2}, adding {:.0} ns)",
        medians[STATIC] / medians[HOTSPLIT],
        medians[HOTSPLIT] - medians[STATIC],
        medians[STATIC] / medians[ROUTER],
        medians[ROUTER] - medians[STATIC]
    );
    // Each round's on ÷ off, both halves of it taken back to back: the drift between rounds
    // cancels, which the ratio of the two medians would not do.
    let on_vs_off = median(
        figures[HOTSPLIT]
            .iter()
            .zip(&figures[DETECT_OFF])
            .map(|(on, off)| on.0 / off.0)
            .collect(),
    );
    println!(
        "http_hit/ratio/detect_on_vs_off: {on_vs_off:.3} (median of the per-round ratios of ns/request, on ÷ off; cost {:.1} %)",
        (on_vs_off - 1.0) * 100.0
    );
    // What detection adds to a read, measured alone: the call the read path makes, by as many
    // threads at once, at one in 1 (every read takes the table's lock: the worst case, the
    // sampling below `samples_per_s`) and one in 16.
    let reads = if bench { 2_000_000 } else { 20_000 };
    let alone = median((0..5).map(|_| observe_ns(1, 1, reads)).collect());
    let every_read = median((0..5).map(|_| observe_ns(tasks, 1, reads)).collect());
    let one_in_16 = median((0..5).map(|_| observe_ns(tasks, 16, reads)).collect());
    let share = |ns: f64| 100.0 * ns / medians[HOTSPLIT];
    println!(
        "http_hit/detector_observe: one in 1 by 1 thread {alone:.1} ns/read ({:.2} %), by {tasks} at once {every_read:.1} ns/read ({:.2} %); one in 16 by {tasks} at once {one_in_16:.1} ns/read ({:.2} %) (median of 5 runs of {reads} reads each; % of the hotsplit side's {:.0} ns/request)",
        share(alone),
        share(every_read),
        share(one_in_16),
        medians[HOTSPLIT]
    );
    Ok(())
}

/// Time per call of [`hotsplit::hot::HotKeys::observe`] on one key (the bench's `adv:1`) by
/// `threads` threads at once, `reads` calls each, sampling one read in `every` (fixed: no
/// window closes here): wall time × threads ÷ calls, as the sides' time per request.
fn observe_ns(threads: usize, every: u32, reads: usize) -> f64 {
    let hot = hotsplit::hot::HotKeys::new(
        hotsplit::hot::HotKeysConfig {
            sample_every: every,
            samples_per_s: 0,
            ..hotsplit::hot::HotKeysConfig::default()
        },
        &Metrics::new(),
    );
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let hot = &hot;
            scope.spawn(move || {
                for _ in 0..reads {
                    hot.observe(std::hint::black_box("adv:1"), false);
                }
            });
        }
    });
    started.elapsed().as_nanos() as f64 / reads as f64
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
