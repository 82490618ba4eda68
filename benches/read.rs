//! The library's affine read beside a raw fred `GET` of one key, under the same concurrency.
//!
//! Not a criterion bench: what a read costs shows under load, so each side runs as C concurrent
//! tasks (default 64, the concurrency of the `wrk` and `redis-benchmark` runs) on one
//! multi-threaded tokio runtime, each reading in a loop for a fixed time; the figure is completed
//! reads per second. The sides:
//! - `fred_get`: `GET` of one string key through one fred client, the cheapest read there is;
//! - `fred_hmget`: `HMGET ver val tomb exp` of one copy through one fred client, the command
//!   hotsplit sends, without hotsplit around it;
//! - `hotsplit`: [`Reader::read`] of key `hot:1` (N copies, default 8) for a client id, what a
//!   library user calls: a [`Reader`] over a [`RedisStore`], built as `server::StateParts::wire`
//!   builds it (without read repair, which a read of a current copy never starts). Each task
//!   cycles through 16 client ids of its own, so the reads spread over the copies.
//!
//! All three read the same value (512 bytes by default) from the same throwaway `redis-server`
//! (started with [`hotsplit_devcluster`], killed when the bench ends), and every fred client,
//! the store's included, has the same command timeout (fred arms a timer per command). Every
//! answer is checked (the value's length), so a side cannot win by failing fast.
//!
//! The sides take turns, round after round (the first side rotates), each after a warm-up of its
//! own, so a noisy neighbour hits them alike; each ratio printed is the median of the per-round
//! ratios. Output, one line each on stdout (`scripts/bench-side-by-side.sh` parses it):
//! `read/<side>: <reads/s> reads/s …` and `read/ratio/hotsplit_vs_<side>: <ratio> …`.
//!
//! Beside the throughput, one task then reads each side `ALLOCATION_READS` times in a row with
//! the bench's counting allocator on, and prints the heap allocations per read of each side
//! (the whole process's: fred's connection task and the timers included) as
//! `read/allocations/<side>: …`, and the size of the future one `Reader::read` is as
//! `read/future_bytes/hotsplit: …`, beside fred's own `HMGET` future
//! (`read/future_bytes/fred_hmget: …`). The counter is off during the throughput runs (one relaxed
//! load per allocation).
//!
//! Run with `cargo bench --bench read` (3 rounds of 5 s per side, about a minute), or e.g.
//! `cargo bench --bench read -- --duration 2s --rounds 1 --concurrency 64 --copies 16
//! --value-bytes 512 --warm-up 500ms`. Without `--bench` (as `cargo test --benches` runs it) it
//! does one round of 100 ms per side as a smoke test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::clients::Client;
use fred::interfaces::{ClientLike, HashesInterface, KeysInterface};
use fred::types::config::Config as FredConfig;
use fred::types::{Builder, Value};
use hotsplit::config::Config;
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{Publisher, VersionChoice};
use hotsplit::read::{Caller, Carried, Found, Read, ReadAnswer, ReadRequest, Reader};
use hotsplit::route::{LagTable, RouteMetrics, Router};
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit_devcluster::Standalone;

/// The command timeout of every client: generous, so a busy machine slows the bench down rather
/// than failing it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The fields of a copy, in the order hotsplit's store asks for them.
const COPY_FIELDS: [&str; 4] = ["ver", "val", "tomb", "exp"];

/// How many client ids each task cycles through on the `hotsplit` side.
const CLIENT_IDS_PER_TASK: usize = 16;

/// The key of the `fred_get` side: a plain string.
const PLAIN_KEY: &str = "plain:1";

/// The key of the `hotsplit` side.
const HOT_KEY: &str = "hot:1";

/// How many reads in a row each side makes while its allocations are counted.
const ALLOCATION_READS: usize = 2_000;

/// Whether the counting allocator counts (only while one task reads in a row).
static COUNTING: AtomicBool = AtomicBool::new(false);

/// The allocations (and reallocations) counted while `COUNTING` is on.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations while `COUNTING` is on.
struct CountingAllocator;

// SAFETY: every call is passed on to `System` unchanged; the counter has no effect on memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's guarantees are `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// What one run measures, from the command line.
#[derive(Debug, Clone)]
struct Settings {
    /// How long each side reads per round. Default: 5 s (smoke: 100 ms).
    duration: Duration,
    /// How long each side reads, uncounted, before its turn in a round. Default: 1 s (smoke: 0).
    warm_up: Duration,
    /// How many rounds. Default: 3 (smoke: 1).
    rounds: usize,
    /// How many tasks read at once on each side. Default: 64.
    concurrency: usize,
    /// The copies of `hot:1`. Default: 8.
    copies: u32,
    /// The value's size in bytes. Default: 512.
    value_bytes: usize,
}

impl Settings {
    /// Parses `--duration`, `--warm-up`, `--rounds`, `--concurrency`, `--copies` and
    /// `--value-bytes`; other arguments (cargo's `--bench`, a filter) are ignored.
    fn from_args() -> Result<Settings, Box<dyn Error>> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let smoke = !args.iter().any(|arg| arg == "--bench");
        let mut settings = Settings {
            duration: Duration::from_millis(if smoke { 100 } else { 5_000 }),
            warm_up: Duration::from_millis(if smoke { 0 } else { 1_000 }),
            rounds: if smoke { 1 } else { 3 },
            concurrency: 64,
            copies: 8,
            value_bytes: 512,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--duration" => settings.duration = humantime::parse_duration(value()?)?,
                "--warm-up" => settings.warm_up = humantime::parse_duration(value()?)?,
                "--rounds" => settings.rounds = value()?.parse()?,
                "--concurrency" => settings.concurrency = value()?.parse()?,
                "--copies" => settings.copies = value()?.parse()?,
                "--value-bytes" => settings.value_bytes = value()?.parse()?,
                _ => {}
            }
        }
        if settings.rounds == 0 || settings.concurrency == 0 || settings.duration.is_zero() {
            return Err("--rounds, --concurrency and --duration must be positive".into());
        }
        Ok(settings)
    }
}

/// One side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    FredGet,
    FredHmget,
    Hotsplit,
}

impl Side {
    /// Every side, in the order of the report.
    const ALL: [Side; 3] = [Side::FredGet, Side::FredHmget, Side::Hotsplit];

    fn name(self) -> &'static str {
        match self {
            Side::FredGet => "fred_get",
            Side::FredHmget => "fred_hmget",
            Side::Hotsplit => "hotsplit",
        }
    }
}

/// What the reading tasks share.
struct Fixture {
    /// The plain fred client of the `fred_*` sides.
    client: Client,
    /// The library's reader of the `hotsplit` side.
    reader: Reader,
    /// The copy the `fred_hmget` side reads.
    copy_key: String,
    /// The requests of the `hotsplit` side: one list per task, each a few client ids.
    requests: Vec<Vec<ReadRequest>>,
    /// The value's size, to check every answer.
    value_bytes: usize,
}

impl Fixture {
    /// Publishes the value to `hot:1`, sets it at `plain:1`, and builds the reader and the
    /// requests.
    async fn new(server: &Standalone, settings: &Settings) -> Result<Fixture, Box<dyn Error>> {
        let config = Config::from_toml(&format!(
            "[[family]]\nprefix = \"hot:\"\ncopies = {}\n",
            settings.copies
        ))?;
        config.validate()?;
        let families = Arc::new(config.families());
        let metrics = Metrics::new();
        let mut options = RedisOptions::new(RedisTarget::parse(&server.url())?);
        options.command_timeout = COMMAND_TIMEOUT;
        let store = Arc::new(RedisStore::connect(options, metrics.clone()).await?);

        let value = Bytes::from(vec![b'v'; settings.value_bytes]);
        let key = Key::parse(HOT_KEY)?;
        let publisher = Publisher::new(store.clone(), families.clone(), metrics.clone());
        let report = publisher
            .publish(&key, VersionChoice::Given(Version::new(1)?), value.clone())
            .await?;
        if report.applied != settings.copies {
            return Err(format!("publish of {key} did not apply to every copy: {report:?}").into());
        }

        let classes = config.classes()?;
        let route_metrics =
            Arc::new(metrics.register_with(|registry| RouteMetrics::register(registry, &classes)));
        let lag = Arc::new(LagTable::new(
            config.route.heartbeat_interval,
            config.route.lag_window,
        ));
        let router = Arc::new(Router::new(
            &config.route,
            classes,
            families.clone(),
            lag,
            route_metrics,
        )?);
        let reader = Reader::new(store, families, config.read.clone(), metrics, router);
        let requests = (0..settings.concurrency)
            .map(|task| {
                (0..CLIENT_IDS_PER_TASK)
                    .map(|id| ReadRequest {
                        key: key.clone(),
                        caller: Caller::Client(format!("client-{task:04}-{id:02}")),
                        min_version: None,
                        if_none_match: None,
                        class: None,
                        request_id: None,
                        deadline: None,
                    })
                    .collect()
            })
            .collect();

        let client = Builder::from_config(FredConfig::from_url(&server.url())?)
            .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
            .build()?;
        client.init().await?;
        client
            .set::<(), _, _>(PLAIN_KEY, value, None, None, false)
            .await?;
        Ok(Fixture {
            client,
            reader,
            copy_key: key
                .copy_key(0, hotsplit::key::Placement::Suffix)
                .as_str()
                .to_owned(),
            requests,
            value_bytes: settings.value_bytes,
        })
    }

    /// One read of `side` by `task`, its `turn`-th; checks the answer.
    async fn read_once(&self, side: Side, task: usize, turn: usize) -> Result<(), String> {
        let length = match side {
            Side::FredGet => self
                .client
                .get::<Option<Bytes>, _>(PLAIN_KEY)
                .await
                .map_err(|err| err.to_string())?
                .map(|value| value.len()),
            Side::FredHmget => {
                match self
                    .client
                    .hmget::<Value, _, _>(self.copy_key.as_str(), COPY_FIELDS.to_vec())
                    .await
                    .map_err(|err| err.to_string())?
                {
                    Value::Array(fields) => {
                        fields.get(1).and_then(Value::as_bytes).map(<[u8]>::len)
                    }
                    _ => None,
                }
            }
            Side::Hotsplit => {
                let requests = &self.requests[task];
                let request = &requests[turn % requests.len()];
                match self.reader.read(request, Carried::default()).await {
                    Ok(Read {
                        found: Found::Answer(ReadAnswer::Value { value, .. }),
                        ..
                    }) => Some(value.len()),
                    Ok(other) => return Err(format!("unexpected answer {other:?}")),
                    Err(err) => return Err(err.to_string()),
                }
            }
        };
        match length {
            Some(length) if length == self.value_bytes => Ok(()),
            other => Err(format!(
                "{} read {other:?} bytes, not {}",
                side.name(),
                self.value_bytes
            )),
        }
    }
}

/// Runs `concurrency` tasks of `side` for `duration`; returns the completed reads per second
/// (reads still in flight at the end count, and so does the time they take).
async fn throughput(
    fixture: &Arc<Fixture>,
    side: Side,
    concurrency: usize,
    duration: Duration,
) -> Result<f64, Box<dyn Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let fixture = fixture.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut reads = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    fixture.read_once(side, task, reads).await?;
                    reads += 1;
                }
                Ok::<usize, String>(reads)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut reads = 0;
    for task in tasks {
        reads += task.await??;
    }
    Ok(reads as f64 / started.elapsed().as_secs_f64())
}

/// The heap allocations per read of `side`: one task reads `ALLOCATION_READS` times in a row
/// (after as many uncounted reads) with the counter on.
async fn allocations_per_read(fixture: &Fixture, side: Side) -> Result<f64, Box<dyn Error>> {
    for turn in 0..ALLOCATION_READS {
        fixture.read_once(side, 0, turn).await?;
    }
    ALLOCATIONS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    let mut result = Ok(());
    for turn in 0..ALLOCATION_READS {
        result = fixture.read_once(side, 0, turn).await;
        if result.is_err() {
            break;
        }
    }
    COUNTING.store(false, Ordering::Relaxed);
    result?;
    Ok(ALLOCATIONS.load(Ordering::Relaxed) as f64 / ALLOCATION_READS as f64)
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let settings = Settings::from_args()?;
    let server = Standalone::start()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Reads per second of each side, one entry per round, in `Side::ALL` order.
    let mut rates: [Vec<f64>; 3] = Default::default();
    runtime.block_on(async {
        let fixture = Arc::new(Fixture::new(&server, &settings).await?);
        for round in 0..settings.rounds {
            let mut line = format!("read: round {}/{}:", round + 1, settings.rounds);
            for turn in 0..Side::ALL.len() {
                let index = (round + turn) % Side::ALL.len();
                let side = Side::ALL[index];
                if !settings.warm_up.is_zero() {
                    throughput(&fixture, side, settings.concurrency, settings.warm_up).await?;
                }
                let rate =
                    throughput(&fixture, side, settings.concurrency, settings.duration).await?;
                line.push_str(&format!(" {} {rate:.0}/s", side.name()));
                rates[index].push(rate);
            }
            eprintln!("{line}");
        }
        for side in Side::ALL {
            let allocations = allocations_per_read(&fixture, side).await?;
            println!(
                "read/allocations/{}: {allocations:.1} per read (one task, {ALLOCATION_READS} reads in a row, the whole process)",
                side.name()
            );
        }
        let read = fixture
            .reader
            .read(&fixture.requests[0][0], Carried::default());
        println!(
            "read/future_bytes/hotsplit: {} bytes (the future of one Reader::read)",
            std::mem::size_of_val(&read)
        );
        drop(read);
        let hmget = fixture
            .client
            .hmget::<Value, _, _>(fixture.copy_key.as_str(), COPY_FIELDS.to_vec());
        println!(
            "read/future_bytes/fred_hmget: {} bytes (the future of one fred HMGET)",
            std::mem::size_of_val(&hmget)
        );
        drop(hmget);
        Ok::<(), Box<dyn Error>>(())
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    drop(server);

    let about = format!(
        "{} tasks, median of {} rounds of {:?}",
        settings.concurrency, settings.rounds, settings.duration
    );
    for (side, rates) in Side::ALL.iter().zip(&rates) {
        let rate = median(rates.clone());
        println!(
            "read/{}: {rate:.0} reads/s ({about}; mean latency {:.3} ms)",
            side.name(),
            settings.concurrency as f64 / rate * 1e3
        );
    }
    let hotsplit = &rates[2];
    for (side, rates) in Side::ALL[..2].iter().zip(&rates) {
        let ratios = hotsplit.iter().zip(rates).map(|(h, b)| h / b).collect();
        println!(
            "read/ratio/hotsplit_vs_{}: {:.2} (median of the per-round ratios)",
            side.name(),
            median(ratios)
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("read bench: {err}");
            ExitCode::FAILURE
        }
    }
}
