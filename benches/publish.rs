//! Publish fan-out against real Redis, beside the cheapest possible baseline.
//!
//! Each group starts its own throwaway servers with [`hotsplit_devcluster`] (a standalone
//! server, then a 3-master/3-replica cluster), connects a [`RedisStore`] and a plain fred client
//! to the same target, and measures:
//! - `hotsplit/N`: one [`Publisher::publish`] of a 512-byte value to a key with N copies, each
//!   iteration with the next version, so every copy write is an applied compare-and-set
//!   (`FCALL hotsplit_cas_v2`, `store::library::CAS_FUNCTION`: a version check, `HSET` and `PEXPIREAT`);
//! - `fcall_join_all/N`: the same N `FCALL hotsplit_cas_v2` sent directly through the plain client,
//!   awaited with `join_all`: what the compare-and-set costs without hotsplit around it;
//! - `set_join_all/N`: N concurrent `SET`s of the same copy keys and value through one fred
//!   client, awaited with `join_all`: the floor a fan-out of N writes cannot beat.
//!
//! N is 1, 8, 16 and 32 in both groups. The target is a publish p50 at N = 16 on the cluster of at
//! most 1.5x the 16 concurrent `SET`s. Run with `cargo bench --bench publish`;
//! `cargo bench --bench publish -- cluster` runs only the cluster group. The defaults (2 s
//! warm-up, 5 s measurement, 50 samples) yield to criterion's `--warm-up-time`,
//! `--measurement-time` and `--sample-size`. Servers are killed by pid when a group ends (and by
//! devcluster's `atexit` handler if the bench dies).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use fred::clients::Client;
use fred::interfaces::{ClientLike, FunctionInterface, KeysInterface};
use fred::types::config::Config as FredConfig;
use fred::types::Builder;
use futures_util::future::join_all;
use hotsplit::config::Config;
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{PublishStatus, Publisher, VersionChoice};
use hotsplit::store::library::CAS_FUNCTION;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::CopyStore;
use hotsplit_devcluster::{Cluster, ClusterOptions, Standalone};
use tokio::runtime::Runtime;

/// The size of the published value, in bytes (the load script uses the same size).
const VALUE_BYTES: usize = 512;

/// How long criterion measures each benchmark.
const MEASUREMENT_TIME: Duration = Duration::from_secs(5);

/// How long criterion warms each benchmark up.
const WARM_UP_TIME: Duration = Duration::from_secs(2);

/// Samples per benchmark.
const SAMPLE_SIZE: usize = 50;

/// The command timeout of both clients: generous, so a busy machine slows a bench down rather
/// than failing it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything one group measures against: a publisher and a plain client on the same target.
struct Target {
    /// The runtime every future of the group runs on; fred's connection tasks live here.
    runtime: Runtime,
    /// hotsplit's publisher over a [`RedisStore`].
    publisher: Publisher,
    /// The store behind `publisher`, to say where copies live.
    store: Arc<dyn CopyStore>,
    /// A plain fred client for the `SET` baseline and for cleaning keys up.
    client: Client,
}

impl Target {
    /// Connects the store to `store_url` (hotsplit's `redis://` or `redis-cluster://` form) and the
    /// plain client to `fred_url` (fred's form of the same target), with one family per copy
    /// count: key `nN:hot` has N copies.
    fn connect(store_url: &str, fred_url: &str, copy_counts: &[u32]) -> Target {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("build the tokio runtime");
        let toml: String = copy_counts
            .iter()
            .map(|n| format!("[[family]]\nprefix = \"n{n}:\"\ncopies = {n}\n"))
            .collect();
        let config = Config::from_toml(&toml).expect("parse the bench config");
        config.validate().expect("validate the bench config");
        let metrics = Metrics::new();
        let (store, client) = runtime.block_on(async {
            let mut options = RedisOptions::new(RedisTarget::parse(store_url).expect("store url"));
            options.command_timeout = COMMAND_TIMEOUT;
            let store: Arc<dyn CopyStore> = Arc::new(
                RedisStore::connect(options, metrics.clone())
                    .await
                    .expect("connect the redis store"),
            );
            let client = Builder::from_config(FredConfig::from_url(fred_url).expect("fred url"))
                .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
                .build()
                .expect("build the fred client");
            client.init().await.expect("connect the fred client");
            (store, client)
        });
        let publisher = Publisher::new(store.clone(), Arc::new(config.families()), metrics);
        Target {
            runtime,
            publisher,
            store,
            client,
        }
    }

    /// Deletes the copies of `key` (one `DEL` per copy, so it works across cluster slots).
    fn delete_copies(&self, key: &Key, copies: u32) {
        self.runtime.block_on(async {
            let deletes = (0..copies).map(|i| {
                self.client.del::<i64, _>(
                    key.copy_key(i, hotsplit::key::Placement::Suffix)
                        .as_str()
                        .to_owned(),
                )
            });
            for result in join_all(deletes).await {
                result.expect("delete a copy");
            }
        });
    }

    /// Closes the fred client and stops the runtime (which drops the store's connection task).
    fn close(self) {
        let Target {
            runtime,
            publisher,
            store,
            client,
        } = self;
        drop(publisher);
        drop(store);
        runtime.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

/// Adds `hotsplit/N`, `fcall_join_all/N` and `set_join_all/N` to `group` for each N.
fn bench_fan_out(group: &mut BenchmarkGroup<'_, WallTime>, target: &Target, copy_counts: &[u32]) {
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    for &copies in copy_counts {
        let key = Key::parse(&format!("n{copies}:hot")).expect("bench key");
        let copy_keys: Vec<String> = (0..copies)
            .map(|i| {
                key.copy_key(i, hotsplit::key::Placement::Suffix)
                    .as_str()
                    .to_owned()
            })
            .collect();
        group.throughput(Throughput::Elements(u64::from(copies)));

        // A baseline run leaves plain strings behind, which the compare-and-set refuses to
        // overwrite: start every publish bench from missing copies.
        target.delete_copies(&key, copies);
        let next_version = AtomicU64::new(1);
        group.bench_with_input(
            BenchmarkId::new("hotsplit", copies),
            &copies,
            |b, &copies| {
                b.to_async(&target.runtime).iter(|| async {
                    let version = Version::new(next_version.fetch_add(1, Ordering::Relaxed))
                        .expect("version");
                    let report = target
                        .publisher
                        .publish(&key, VersionChoice::Given(version), value.clone())
                        .await
                        .expect("publish");
                    assert!(
                        report.status() == PublishStatus::Done && report.applied == copies,
                        "publish of {key} v{} did not apply to every copy: {report:?}",
                        version.get()
                    );
                });
            },
        );

        // The same compare-and-set, called directly through the plain client: what the script
        // costs by itself, without hotsplit's planning and reporting around it.
        let fcall_version = AtomicU64::new(1 << 40);
        let expire_at = (hotsplit::store::now_unix_ms() + 3_600_000).to_string();
        // Versions are kept one TTL (an hour) past the expiry, as `store.version_retention`
        // does by default for a family with this TTL.
        let retain_until = (hotsplit::store::now_unix_ms() + 2 * 3_600_000).to_string();
        group.bench_with_input(
            BenchmarkId::new("fcall_join_all", copies),
            &copies,
            |b, _| {
                b.to_async(&target.runtime).iter(|| async {
                    let version = fcall_version.fetch_add(1, Ordering::Relaxed).to_string();
                    let calls = copy_keys.iter().map(|copy_key| {
                        target.client.fcall::<fred::types::Value, _, _, _>(
                            CAS_FUNCTION,
                            vec![copy_key.as_str()],
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
            },
        );

        group.bench_with_input(BenchmarkId::new("set_join_all", copies), &copies, |b, _| {
            b.to_async(&target.runtime).iter(|| async {
                let sets = copy_keys.iter().map(|copy_key| {
                    target.client.set::<(), _, _>(
                        copy_key.as_str(),
                        value.clone(),
                        None,
                        None,
                        false,
                    )
                });
                for result in join_all(sets).await {
                    result.expect("SET");
                }
            });
        });
    }
}

fn standalone(c: &mut Criterion) {
    let server = match Standalone::start() {
        Ok(server) => server,
        Err(err) => {
            eprintln!("publish_standalone: skipped, no redis-server: {err}");
            return;
        }
    };
    let copy_counts = [1, 8, 16, 32];
    let target = Target::connect(&server.url(), &server.url(), &copy_counts);
    let mut group = c.benchmark_group("publish_standalone");
    bench_fan_out(&mut group, &target, &copy_counts);
    group.finish();
    target.close();
    drop(server);
}

fn cluster(c: &mut Criterion) {
    let cluster = match Cluster::start(ClusterOptions::default()) {
        Ok(cluster) => cluster,
        Err(err) => {
            eprintln!("publish_cluster: skipped, no 3x3 cluster: {err}");
            return;
        }
    };
    let copy_counts = [1, 8, 16, 32];
    let target = Target::connect(&cluster.url(), &cluster.fred_url(), &copy_counts);
    print_spread(&cluster, &target, 16);
    let mut group = c.benchmark_group("publish_cluster");
    bench_fan_out(&mut group, &target, &copy_counts);
    group.finish();
    target.close();
    drop(cluster);
}

/// Prints (to stderr) how the copies of `n16:hot` spread over the masters, checked two ways:
/// the cluster's own view of the slot owners, and the store's (fred's slot map).
fn print_spread(cluster: &Cluster, target: &Target, copies: u32) {
    let key = Key::parse(&format!("n{copies}:hot")).expect("bench key");
    let mut by_master: Vec<(String, u32)> = Vec::new();
    for i in 0..copies {
        let copy_key = key.copy_key(i, hotsplit::key::Placement::Suffix);
        let owner = match cluster.master_for_key(copy_key.as_str().as_bytes()) {
            Ok(Some(info)) => info.addr(),
            Ok(None) | Err(_) => "unknown".to_owned(),
        };
        let seen_by_store = target.store.node_of(&copy_key).to_string();
        if seen_by_store != owner {
            eprintln!("note: {copy_key} is on {owner} but the store routes it to {seen_by_store}");
        }
        match by_master.iter_mut().find(|(addr, _)| *addr == owner) {
            Some((_, count)) => *count += 1,
            None => by_master.push((owner, 1)),
        }
    }
    by_master.sort();
    let spread: Vec<String> = by_master
        .iter()
        .map(|(addr, count)| format!("{addr} -> {count}"))
        .collect();
    eprintln!(
        "publish_cluster: the {copies} copies of {key} spread over masters as: {}",
        spread.join(", ")
    );
}

/// The modest defaults that keep `cargo bench --bench publish` to a few minutes. They are set on
/// the `Criterion` rather than on each group so that criterion's command line overrides them
/// (`--warm-up-time`, `--measurement-time`, `--sample-size`: the load script's quick mode).
fn defaults() -> Criterion {
    Criterion::default()
        .sample_size(SAMPLE_SIZE)
        .measurement_time(MEASUREMENT_TIME)
        .warm_up_time(WARM_UP_TIME)
}

criterion_group! {
    name = benches;
    config = defaults();
    targets = standalone, cluster
}
criterion_main!(benches);
