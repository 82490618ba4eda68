//! The cost of routing a read, beside the cheapest read there is.
//!
//! - `decision/*`: [`Router::plan`] plus [`Router::target`] for one read: class resolution,
//!   the write-floor and request-pin lookups, and the lag gate (the replica's current lag against
//!   the class budget). `decision/floor_held` has 10 000 write floors held, one of them the
//!   reader's. Target: under 1 µs.
//! - `read/primary` and `read/advisory`: a whole [`Reader::read`] on the embedded store (no
//!   network, so this is the fastest read path there is and the lag check's share is as large
//!   as it can be), with a class that skips the gate and one that takes it. The difference over
//!   `read/primary` is the per-read cost of the lag check; target: under 2 %.
//!
//! - `gate/lag_check`: [`Router::target`] alone for a planned advisory read: the per-read lag
//!   check (a read lock, one map lookup, two atomic loads and the clock).
//! - `gate/redis_read_copy`: one copy read ([`CopyStore::read_copy`], an `HMGET`) from a throwaway
//!   standalone `redis-server` on loopback: what every served read costs at least. The ratio
//!   `gate/lag_check / gate/redis_read_copy` is the lag check's share of read throughput.
//!
//! Run with `cargo bench --bench route`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use hotsplit::config::Config;
use hotsplit::family::Families;
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{Publisher, VersionChoice};
use hotsplit::read::{Caller, Carried, ReadRequest, Reader};
use hotsplit::route::{LagTable, RouteMetrics, Router};
use hotsplit::store::memory::MemoryStore;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::{CopyStore, NodeLabel, ReplicaSet};
use hotsplit_devcluster::Standalone;

const CONFIG: &str = "[[family]]\nprefix = \"p:\"\ncopies = 8\ndefault_class = \"advisory\"";

/// A router whose lag table knows one fresh replica of the embedded store's only node.
fn setup() -> (Config, Arc<Families>, Arc<Router>, Arc<LagTable>) {
    let config = Config::from_toml(CONFIG).expect("config");
    config.validate().expect("valid config");
    let families = Arc::new(config.families());
    let classes = config.classes().expect("classes");
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(RouteMetrics::register(&mut registry, &classes));
    let lag = Arc::new(LagTable::new(
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ));
    lag.set_topology(&[ReplicaSet {
        primary: NodeLabel::embedded(),
        replicas: vec![NodeLabel::new("127.0.0.1:7001")],
    }]);
    let replica = lag.replicas_of(&NodeLabel::embedded()).expect("replica")[0].clone();
    lag.record(&replica, Some(lag.now_us()));
    let router = Arc::new(
        Router::new(
            &config.route,
            classes,
            families.clone(),
            lag.clone(),
            metrics,
        )
        .expect("router"),
    );
    (config, families, router, lag)
}

fn decision(c: &mut Criterion) {
    let (_, _, router, _) = setup();
    let key = Key::parse("p:hot").expect("key");
    let primary = NodeLabel::embedded();
    let mut group = c.benchmark_group("decision");
    group.bench_function("no_floor", |b| {
        b.iter(|| {
            let plan = router.plan(&key, None, Some("alice"), None).expect("plan");
            std::hint::black_box(router.target(&plan, &primary))
        })
    });
    for n in 0..10_000u64 {
        let other = Key::parse(&format!("p:{n}")).expect("key");
        router.record_write(
            &other,
            Version::new(n + 1).expect("version"),
            Some("bob"),
            None,
        );
    }
    router.record_write(
        &key,
        Version::new(7).expect("version"),
        Some("alice"),
        Some("r1"),
    );
    group.bench_function("floor_held", |b| {
        b.iter(|| {
            let plan = router
                .plan(&key, Some("advisory"), Some("alice"), Some("r2"))
                .expect("plan");
            std::hint::black_box(router.target(&plan, &primary))
        })
    });
    group.finish();
}

fn read(c: &mut Criterion) {
    let (config, families, router, _) = setup();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let store = Arc::new(MemoryStore::new());
    let metrics = Metrics::new();
    let publisher = Publisher::new(store.clone(), families.clone(), metrics.clone());
    let key = Key::parse("p:hot").expect("key");
    runtime
        .block_on(publisher.publish(
            &key,
            VersionChoice::Given(Version::new(1).expect("version")),
            Bytes::from_static(&[7u8; 512]),
        ))
        .expect("publish");
    let reader = Reader::new(store, families, config.read.clone(), metrics, router);
    let mut group = c.benchmark_group("read");
    for class in ["primary", "advisory"] {
        let request = ReadRequest {
            key: key.clone(),
            caller: Caller::Client("alice".to_owned()),
            min_version: None,
            if_none_match: None,
            class: Some(class.to_owned()),
            request_id: None,
            deadline: None,
        };
        group.bench_function(class, |b| {
            b.iter(|| {
                std::hint::black_box(
                    runtime
                        .block_on(reader.read(&request, Carried::default()))
                        .expect("read"),
                )
            })
        });
    }
    group.finish();
}

fn gate(c: &mut Criterion) {
    let (_, _, router, _) = setup();
    let key = Key::parse("p:hot").expect("key");
    let primary = NodeLabel::embedded();
    let plan = router.plan(&key, None, Some("alice"), None).expect("plan");
    let mut group = c.benchmark_group("gate");
    group.bench_function("lag_check", |b| {
        b.iter(|| std::hint::black_box(router.target(&plan, &primary)))
    });
    let server = Standalone::start().expect("start redis-server");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let store = runtime.block_on(async {
        let mut options = RedisOptions::new(RedisTarget::parse(&server.url()).expect("url"));
        options.command_timeout = Duration::from_secs(2);
        RedisStore::connect(options, Metrics::new())
            .await
            .expect("connect")
    });
    let copy_key = key.copy_key(0, hotsplit::key::Placement::Suffix);
    group.bench_function("redis_read_copy", |b| {
        b.iter(|| std::hint::black_box(runtime.block_on(store.read_copy(&copy_key))))
    });
    group.finish();
    drop(store);
    drop(runtime);
    drop(server);
}

criterion_group!(benches, decision, read, gate);
criterion_main!(benches);
