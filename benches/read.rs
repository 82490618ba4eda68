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
//! Run with `cargo bench --bench read` (3 rounds of 5 s per side, about a minute), or e.g.
//! `cargo bench --bench read -- --duration 2s --rounds 1 --concurrency 64 --copies 16
//! --value-bytes 512 --warm-up 500ms`. Without `--bench` (as `cargo test --benches` runs it) it
//! does one round of 100 ms per side as a smoke test.

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
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
use hotsplit::read::{CopyChoice, ReadAnswer, ReadRequest, Reader};
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
                        copy: CopyChoice::Client(format!("client-{task:04}-{id:02}")),
                        min_version: None,
                        if_none_match: None,
                        class: None,
                        request_id: None,
                        session: hotsplit::route::Floors::default(),
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
            copy_key: key.copy_key(0).as_str().to_owned(),
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
                match self.reader.read(&requests[turn % requests.len()]).await {
                    Ok(ReadAnswer::Value { value, .. }) => Some(value.len()),
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
