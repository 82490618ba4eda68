//! What the invalidation feed costs a publish (issue #32): the p50 of a publish to a family of
//! 8 copies on one throwaway 3-master/3-replica cluster, without any feed, then with the feeds of
//! two instances running (`hotsplit::feed::Feed`, each a `CLIENT TRACKING ON BCAST` connection
//! per primary, its heartbeats every `max_silence / 4`, every push parsed and told to a tracking
//! table), in one run.
//!
//! - `publish/no_feed`: [`Publisher::publish`] of a 512-byte value, primaries' acknowledgement;
//! - `publish/one_feed`: the same while one feed runs in the process (an instance's own);
//! - `publish/two_feeds`: the same while two feeds run (Redis then sends each write's key to 2
//!   connections per primary);
//! - `publish/no_feed_after`: the feeds stopped again (how far the figures drift in one run).
//!
//! The target: `two_feeds`' p50 at most 1.05x `no_feed`'s. The medians are
//! `median.point_estimate` in `target/criterion/feed_cost/<name>/new/estimates.json`. Run with
//! `cargo bench --bench feed_cost` on a quiet machine. The cluster is killed by pid at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use hotsplit::config::Config;
use hotsplit::feed::{Feed, FeedParts, FeedState};
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{PublishStatus, Publisher, VersionChoice};
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::tracking::Tracking;
use hotsplit_devcluster::{Cluster, ClusterOptions};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// The family of the measured key.
const CONFIG: &str = "[[family]]\nprefix = \"feed8:\"\ncopies = 8\nttl = \"1h\"\n";

/// Copies of the measured key.
const COPIES: usize = 8;

/// The feeds' silence bound (the built-in classes' smallest lease).
const MAX_SILENCE: Duration = Duration::from_millis(125);

/// Connects a store to `cluster`.
async fn store(cluster: &Cluster) -> Arc<RedisStore> {
    let mut options = RedisOptions::new(RedisTarget::parse(&cluster.url()).expect("store url"));
    options.command_timeout = Duration::from_secs(2);
    Arc::new(
        RedisStore::connect(options, Metrics::new())
            .await
            .expect("connect the redis store"),
    )
}

/// Starts the feed of one instance named `instance` on `cluster`; waits until it has a
/// connection to every primary.
async fn start_feed(cluster: &Cluster, instance: &str, shutdown: &CancellationToken) {
    let store = store(cluster).await;
    let metrics = Metrics::new();
    let state = Arc::new(FeedState::default());
    let feed = Feed::new(FeedParts {
        store: store.clone(),
        topology: store,
        tracking: Arc::new(Tracking::default()),
        near: None,
        instance: instance.to_owned(),
        max_silence: MAX_SILENCE,
        metrics: metrics.clone(),
        state: state.clone(),
    });
    tokio::spawn(feed.run(shutdown.clone()));
    let started = Instant::now();
    while state.view().primaries.len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the feed did not open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One publish of the next version.
async fn publish(publisher: &Publisher, key: &Key, version: &AtomicU64) {
    let value = Bytes::from(vec![b'v'; 512]);
    let version = Version::new(version.fetch_add(1, Ordering::Relaxed)).expect("version");
    let report = publisher
        .publish(key, VersionChoice::Given(version), value)
        .await
        .expect("publish");
    assert!(
        report.status() == PublishStatus::Done && report.outcomes.len() == COPIES,
        "{report:?}"
    );
}

fn feed_cost(c: &mut Criterion) {
    let cluster = match Cluster::start(ClusterOptions::default()) {
        Ok(cluster) => cluster,
        Err(err) => {
            eprintln!("feed_cost: skipped, no 3x3 cluster: {err}");
            return;
        }
    };
    let runtime: Runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    let config = Config::from_toml(CONFIG).expect("parse the bench config");
    let families = Arc::new(config.families());
    let publisher =
        runtime.block_on(async { Publisher::new(store(&cluster).await, families, Metrics::new()) });
    let key = Key::parse("feed8:hot").expect("bench key");
    let version = AtomicU64::new(1);
    let mut group = c.benchmark_group("feed_cost");
    group.bench_function("publish/no_feed", |b| {
        b.to_async(&runtime)
            .iter(|| publish(&publisher, &key, &version));
    });
    let shutdown = CancellationToken::new();
    runtime.block_on(start_feed(&cluster, "bench-a", &shutdown));
    group.bench_function("publish/one_feed", |b| {
        b.to_async(&runtime)
            .iter(|| publish(&publisher, &key, &version));
    });
    runtime.block_on(start_feed(&cluster, "bench-b", &shutdown));
    group.bench_function("publish/two_feeds", |b| {
        b.to_async(&runtime)
            .iter(|| publish(&publisher, &key, &version));
    });
    shutdown.cancel();
    group.bench_function("publish/no_feed_after", |b| {
        b.to_async(&runtime)
            .iter(|| publish(&publisher, &key, &version));
    });
    group.finish();
    drop(publisher);
    runtime.shutdown_timeout(Duration::from_secs(1));
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
    targets = feed_cost
}
criterion_main!(benches);
