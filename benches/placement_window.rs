//! Publish to a `spread` family of 16 copies with its compatibility window open and closed,
//! beside 16 direct `FCALL`s, in one run on one throwaway 3-master/3-replica cluster.
//!
//! - `window_open/16`: [`Publisher::publish`] of a 512-byte value to `spread16:hot` while the
//!   window is open (`layout::placing`): copy 0 and both names of copies 1..16, 31 writes;
//! - `window_closed/16`: the same through a second publisher whose layouts saw the window
//!   close (every live instance reads the tagged names): copy 0 and the tagged names, 16 writes;
//! - `fcall_join_all/16`: 16 `FCALL hotsplit_cas_v2` on the same 16 names sent directly through
//!   a plain fred client, awaited with `join_all`.
//!
//! Every side waits for the primaries' answers only (no `WAIT`: `sync_replicas` is 0), so all
//! three are at the same acknowledgement level. The target (issue #34): `window_closed/16`'s
//! p50 at most 1.05x `fcall_join_all/16`'s. Criterion prints a confidence interval of the mean;
//! the median (the p50 to compare) of each is `median.point_estimate` (nanoseconds) in
//! `target/criterion/placement_window/<name>/16/new/estimates.json`. Run with
//! `cargo bench --bench placement_window` (on a quiet machine: a figure from a loaded one is not
//! a figure); criterion's `--warm-up-time`, `--measurement-time` and `--sample-size` override
//! the defaults below. The cluster is killed by pid when the run ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fred::clients::Client;
use fred::interfaces::{ClientLike, FunctionInterface};
use fred::types::config::Config as FredConfig;
use fred::types::Builder;
use futures_util::future::join_all;
use hotsplit::config::Config;
use hotsplit::family::Families;
use hotsplit::key::{Key, Placement, Version};
use hotsplit::layout::{LayoutStores, LayoutWatcher, Layouts, Liveness, WindowState};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{PublishStatus, Publisher, VersionChoice};
use hotsplit::store::library::CAS_FUNCTION;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit_devcluster::{Cluster, ClusterOptions};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// The published value's size, as `benches/publish.rs`.
const VALUE_BYTES: usize = 512;

/// Copies of the measured key.
const COPIES: u32 = 16;

/// The store's command timeout: generous, so a busy machine slows the bench rather than
/// failing it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the closed side's layout watcher refreshes (its settle time is this plus twice the
/// command timeout).
const LAYOUT_INTERVAL: Duration = Duration::from_millis(200);

/// The family of the measured key, named `spread` explicitly.
const CONFIG: &str =
    "[[family]]\nprefix = \"spread16:\"\ncopies = 16\nttl = \"1h\"\nplacement = \"spread\"\n";

/// What the bench measures against: a publisher per side and the plain client.
struct Sides {
    /// The runtime every future runs on.
    runtime: Runtime,
    /// Publishes with the window open.
    open: Publisher,
    /// Publishes with the window closed.
    closed: Publisher,
    /// The plain client of the `FCALL` baseline.
    client: Client,
    /// Stops the closed side's watcher.
    shutdown: CancellationToken,
}

/// This process in the live sets, as `instance`.
fn liveness(instance: &str) -> Liveness {
    Liveness {
        instance: instance.to_owned(),
        release: "bench".to_owned(),
        interval: LAYOUT_INTERVAL,
        command_timeout: COMMAND_TIMEOUT,
    }
}

/// Connects a store to `cluster`.
async fn store(cluster: &Cluster, metrics: &Arc<Metrics>) -> Arc<RedisStore> {
    let mut options = RedisOptions::new(RedisTarget::parse(&cluster.url()).expect("store url"));
    options.command_timeout = COMMAND_TIMEOUT;
    Arc::new(
        RedisStore::connect(options, metrics.clone())
            .await
            .expect("connect the redis store"),
    )
}

/// The open side: layouts reconciled once and never refreshed, so its window stays open (its
/// live entries lapse after three intervals, so they do not hold the closed side's open).
async fn open_side(cluster: &Cluster, families: &Arc<Families>) -> Publisher {
    let metrics = Metrics::new();
    let store = store(cluster, &metrics).await;
    let stores = LayoutStores::of(&store);
    let layouts = Layouts::reconcile(&stores, families, &metrics, &liveness("bench-open"))
        .await
        .expect("reconcile the open side");
    Publisher::new(store, families.clone(), metrics).with_layouts(layouts)
}

/// The closed side: layouts kept by a running watcher, returned once its window has closed.
async fn closed_side(
    cluster: &Cluster,
    families: &Arc<Families>,
    shutdown: &CancellationToken,
) -> Publisher {
    let metrics = Metrics::new();
    let store = store(cluster, &metrics).await;
    let stores = LayoutStores::of(&store);
    let liveness = liveness("bench-closed");
    let layouts = Layouts::reconcile(&stores, families, &metrics, &liveness)
        .await
        .expect("reconcile the closed side");
    let watcher = LayoutWatcher {
        stores,
        layouts: layouts.clone(),
        families: families.clone(),
        metrics: metrics.clone(),
        liveness,
        sweep_interval: Duration::from_secs(60),
    };
    tokio::spawn(watcher.run(shutdown.clone()));
    let family = families
        .resolve(&Key::parse("spread16:hot").expect("bench key"))
        .clone();
    let started = Instant::now();
    while layouts.window_state(&family) != WindowState::Closed {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the window did not close within 60 s"
        );
        tokio::time::sleep(LAYOUT_INTERVAL).await;
    }
    Publisher::new(store, families.clone(), metrics).with_layouts(layouts)
}

impl Sides {
    /// Both publishers and the plain client on `cluster`.
    fn connect(cluster: &Cluster) -> Sides {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("build the tokio runtime");
        let config = Config::from_toml(CONFIG).expect("parse the bench config");
        config.validate().expect("validate the bench config");
        let families = Arc::new(config.families());
        let shutdown = CancellationToken::new();
        let (open, closed, client) = runtime.block_on(async {
            let open = open_side(cluster, &families).await;
            let closed = closed_side(cluster, &families, &shutdown).await;
            let client =
                Builder::from_config(FredConfig::from_url(&cluster.fred_url()).expect("fred url"))
                    .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
                    .build()
                    .expect("build the fred client");
            client.init().await.expect("connect the fred client");
            (open, closed, client)
        });
        Sides {
            runtime,
            open,
            closed,
            client,
            shutdown,
        }
    }

    /// Stops the watcher, closes the client and the runtime.
    fn close(self) {
        self.shutdown.cancel();
        drop(self.open);
        drop(self.closed);
        self.runtime.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.client.quit()).await;
        });
        self.runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

/// One publish of the next version through `publisher`, asserting it applied `writes` copy
/// names.
async fn publish(publisher: &Publisher, key: &Key, version: &AtomicU64, writes: usize) {
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let version = Version::new(version.fetch_add(1, Ordering::Relaxed)).expect("version");
    let report = publisher
        .publish(key, VersionChoice::Given(version), value)
        .await
        .expect("publish");
    assert!(
        report.status() == PublishStatus::Done && report.outcomes.len() == writes,
        "publish of {key} v{} wrote {} names, expected {writes}: {report:?}",
        version.get(),
        report.outcomes.len()
    );
}

fn window(c: &mut Criterion) {
    let cluster = match Cluster::start(ClusterOptions::default()) {
        Ok(cluster) => cluster,
        Err(err) => {
            eprintln!("placement_window: skipped, no 3x3 cluster: {err}");
            return;
        }
    };
    let sides = Sides::connect(&cluster);
    let key = Key::parse("spread16:hot").expect("bench key");
    let names: Vec<String> = (0..COPIES)
        .map(|index| key.copy_key(index, Placement::Spread).to_string())
        .collect();
    // One version sequence for both publishers (the compare-and-set refuses an older one).
    let version = AtomicU64::new(1);
    let mut group = c.benchmark_group("placement_window");
    group.throughput(Throughput::Elements(u64::from(COPIES)));
    group.bench_function(BenchmarkId::new("window_open", COPIES), |b| {
        b.to_async(&sides.runtime)
            .iter(|| publish(&sides.open, &key, &version, 2 * COPIES as usize - 1));
    });
    group.bench_function(BenchmarkId::new("window_closed", COPIES), |b| {
        b.to_async(&sides.runtime)
            .iter(|| publish(&sides.closed, &key, &version, COPIES as usize));
    });
    let fcall_version = AtomicU64::new(1 << 40);
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let expire_at = (hotsplit::store::now_unix_ms() + 3_600_000).to_string();
    let retain_until = (hotsplit::store::now_unix_ms() + 2 * 3_600_000).to_string();
    group.bench_function(BenchmarkId::new("fcall_join_all", COPIES), |b| {
        b.to_async(&sides.runtime).iter(|| async {
            let version = fcall_version.fetch_add(1, Ordering::Relaxed).to_string();
            let calls = names.iter().map(|name| {
                sides.client.fcall::<fred::types::Value, _, _, _>(
                    CAS_FUNCTION,
                    vec![name.as_str()],
                    vec![
                        version.as_str().into(),
                        fred::types::Value::Bytes(value.clone()),
                        "0".into(),
                        expire_at.as_str().into(),
                        retain_until.as_str().into(),
                        hotsplit::store::now_unix_ms().to_string().into(),
                    ],
                )
            });
            for result in join_all(calls).await {
                result.expect("FCALL of the compare-and-set");
            }
        });
    });
    group.finish();
    sides.close();
    drop(cluster);
}

/// Criterion's defaults for this bench, which its command line overrides.
fn defaults() -> Criterion {
    Criterion::default()
        .sample_size(50)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = defaults();
    targets = window
}
criterion_main!(benches);
