//! Resizing with instances on two copy counts at once, on a real standalone Redis: writers
//! write every copy a live larger instance reads, the smaller instance's sweep waits for the
//! larger one to stop, and growing again never serves a copy that missed an edit. One test runs
//! the layouts and the publisher on the embedded store: a grow past a live smaller instance.

use std::sync::Arc;
use std::time::Duration;

use hotsplit::config::Config;
use hotsplit::metrics::Metrics;
use hotsplit::store::memory::MemoryStore;
use hotsplit::store::{CopyStore, LayoutStore};
use hotsplit_devcluster as devcluster;
use tokio_util::sync::CancellationToken;

use crate::harness::{self, config_with_family, get, hgetall, poll, publish_succeeds, Service};

/// How often the instances refresh their live entries in these tests; an entry lapses after
/// three. At 100 ms, a refresh round (a join, a record read and a writer read per family, one
/// after the other) outlasted the 300 ms lapse with the suite running at load 18 on 2 cores:
/// the 4-copy instance saw no live 12-copy instance, wrote 4 copies and deleted the rest of a
/// key the 12-copy instance was reading.
const LAYOUT_INTERVAL: Duration = Duration::from_secs(1);

/// How often the instances sweep in these tests.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

fn config(url: &str, prefix: &str, copies: u32) -> Config {
    let mut config = config_with_family(Some(url), prefix, copies);
    config.heal.layout_interval = LAYOUT_INTERVAL;
    config.heal.sweep_interval = SWEEP_INTERVAL;
    config
}

/// The version stored in `copy_key` on `port`, or `None` when the copy is missing.
fn stored_version(port: u16, copy_key: &str) -> Option<u64> {
    hgetall(port, copy_key)
        .get("ver")
        .map(|ver| ver.parse().expect("a stored version is a number"))
}

/// An absence cannot be polled: this waits out a sweep's settle time (the layout interval plus
/// twice the command timeout after the live count last changed) and then five sweeps of the
/// instances under test, after which a sweep that was going to delete has deleted.
async fn several_sweeps() {
    tokio::time::sleep(LAYOUT_INTERVAL + harness::COMMAND_TIMEOUT * 2 + SWEEP_INTERVAL * 5).await;
}

/// The versions `base` serves for `key` to 64 different clients (so every copy is read).
async fn served_versions(http: &reqwest::Client, base: &str, key: &str) -> Vec<(String, u64)> {
    let mut served = Vec::new();
    for client in 0..64 {
        let client = format!("reader-{client}");
        let answer = get(http, &format!("{base}/v1/keys/{key}?client={client}"), &[]).await;
        assert!(
            answer.status().is_success(),
            "{client}: {key} answered {}",
            answer.status()
        );
        let version = answer.headers()["hotsplit-version"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        served.push((client, version));
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_two_instances_on_different_copy_counts_keep_every_read_copy_current() {
    let server = harness::shared_standalone();
    let (url, port) = (server.url(), server.node.port());
    let http = reqwest::Client::new();
    let big = Service::start(config(&url, "rz-alt:", 12)).await;
    let small = Service::start(config(&url, "rz-alt:", 4)).await;

    // Publishing alternately through both: after each publish, every copy the larger instance
    // reads holds the newest version (none missed the smaller instance's edits).
    for version in 1..=20u64 {
        let base = if version % 2 == 1 {
            &big.base
        } else {
            &small.base
        };
        publish_succeeds(&http, base, "rz-alt:1", version, &format!("v{version}")).await;
        for copy in 0..12 {
            assert_eq!(
                stored_version(port, &format!("rz-alt:1#{copy}")),
                Some(version),
                "copy {copy} after version {version}, published through the {} instance",
                if version % 2 == 1 {
                    "12-copy"
                } else {
                    "4-copy"
                }
            );
        }
        for (client, served) in served_versions(&http, &big.base, "rz-alt:1").await {
            assert_eq!(served, version, "{client} of the 12-copy instance");
        }
    }

    // The smaller instance's sweep leaves the copies alone while the larger one is live...
    publish_succeeds(&http, &big.base, "rz-alt:idle", 1, "idle").await;
    several_sweeps().await;
    for copy in 0..12 {
        assert_eq!(
            stored_version(port, &format!("rz-alt:idle#{copy}")),
            Some(1),
            "copy {copy} was swept while the 12-copy instance was live"
        );
    }
    // ...and deletes them once it has stopped (its live entry lapses), then lowers the record.
    big.stop().await;
    poll(
        "the sweep deletes copies 4..12 after the larger instance stopped",
        Duration::from_secs(30),
        || {
            std::future::ready(
                (4..12).all(|copy| stored_version(port, &format!("rz-alt:idle#{copy}")).is_none()),
            )
        },
    )
    .await;
    assert_eq!(stored_version(port, "rz-alt:idle#0"), Some(1));
    poll(
        "the sweep lowers the layout record",
        Duration::from_secs(30),
        || {
            let record = devcluster::cli(port, &["GET", "#hotsplit#layout#rz-alt:"]).unwrap();
            std::future::ready(record == "4:4")
        },
    )
    .await;
    small.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_shrink_then_grow_within_the_ttl_serves_no_missed_edit() {
    let server = harness::shared_standalone();
    let (url, port) = (server.url(), server.node.port());
    let http = reqwest::Client::new();
    // A rolling shrink from 12 to 4 copies: both run for a while, then the larger one stops.
    let big = Service::start(config(&url, "rz-grow:", 12)).await;
    let small = Service::start(config(&url, "rz-grow:", 4)).await;
    publish_succeeds(&http, &big.base, "rz-grow:1", 1, "v1").await;
    // Long enough for the smaller instance to sweep, had it swept while the larger one reads.
    several_sweeps().await;
    publish_succeeds(&http, &big.base, "rz-grow:1", 2, "v2").await;
    big.stop().await;
    publish_succeeds(&http, &small.base, "rz-grow:1", 3, "v3").await;

    // Growing back to 12 within the TTL: no copy holds an edit older than the newest, and
    // every reader of the grown instance is served the newest version.
    let grown = Service::start(config(&url, "rz-grow:", 12)).await;
    for copy in 0..12 {
        let stored = stored_version(port, &format!("rz-grow:1#{copy}"));
        assert!(
            stored.is_none_or(|version| version == 3),
            "copy {copy} holds version {stored:?}, which missed version 3"
        );
    }
    for (client, served) in served_versions(&http, &grown.base, "rz-grow:1").await {
        assert_eq!(served, 3, "{client} of the grown instance");
    }
    // The grown layout is recorded, and the smaller instance's sweep keeps its hands off it
    // while the grown instance is live.
    several_sweeps().await;
    let record = devcluster::cli(port, &["GET", "#hotsplit#layout#rz-grow:"]).unwrap();
    assert_eq!(record, "12:12");
    publish_succeeds(&http, &small.base, "rz-grow:1", 4, "v4").await;
    for (client, served) in served_versions(&http, &grown.base, "rz-grow:1").await {
        assert_eq!(served, 4, "{client} of the grown instance");
    }
    grown.stop().await;
    small.stop().await;
}

/// This instance's live entries, refreshed every `interval`.
fn liveness(instance: &str, interval: Duration) -> hotsplit::layout::Liveness {
    hotsplit::layout::Liveness {
        instance: instance.to_owned(),
        release: "0.1.0".to_owned(),
        interval,
        command_timeout: Duration::from_millis(1),
    }
}

/// On the embedded store: an instance that grows a family past a live smaller instance deletes
/// the grown copies after settling (a stale copy 7 left by a shrink is gone), and both then
/// write every copy the larger one reads.
#[tokio::test]
async fn a_growing_instance_deletes_the_grown_copies_after_settling() {
    let store = Arc::new(MemoryStore::new());
    let metrics = Metrics::new();
    let families = |copies| {
        Config::from_toml(&format!("[[family]]\nprefix = \"g:\"\ncopies = {copies}"))
            .unwrap()
            .families()
    };
    let (four, twelve) = (families(4), families(12));
    hotsplit::layout::Layouts::reconcile(
        &hotsplit::layout::LayoutStores::of(&store),
        &twelve,
        &metrics,
        &liveness("old", Duration::from_secs(1)),
    )
    .await
    .unwrap();
    publish_g1(
        &store,
        &metrics,
        &twelve,
        hotsplit::layout::Layouts::unrecorded(),
        1,
    )
    .await;
    // The twelve-copy writer is gone; a four-copy instance shrinks, and a stale copy 7
    // survives (as after a failed delete).
    store.leave_layout("g:", 12, "old").await.unwrap();
    let small = hotsplit::layout::Layouts::reconcile(
        &hotsplit::layout::LayoutStores::of(&store),
        &four,
        &metrics,
        &liveness("small", Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let report = publish_g1(&store, &metrics, &four, small.clone(), 2).await;
    assert_eq!(report.copies, 4);
    write_a_stale_copy_7(&store).await;
    // A twelve-copy instance starts while the small one is live: copies 4..12 are deleted.
    let quick = liveness("new", Duration::from_millis(10));
    let grown = hotsplit::layout::Layouts::reconcile(
        &hotsplit::layout::LayoutStores::of(&store),
        &twelve,
        &metrics,
        &quick,
    )
    .await
    .unwrap();
    let copy = |index| read_g1_copy(&store, index);
    for index in 4..12 {
        assert!(
            copy(index).await.record.unwrap().is_none(),
            "copy {index} survived the grow"
        );
    }
    assert!(copy(0).await.record.unwrap().is_some());
    // Both now write twelve copies, once the small instance's watcher has seen the grown one
    // live (its entry kept by a watcher of its own, which refreshes it every second).
    // The grown instance's entry as its watcher keeps it (every second, lapsing after three).
    store.join_layout("g:", 12, "new", 3_000).await.unwrap();
    let shutdown = CancellationToken::new();
    let watcher = |layouts, families: &hotsplit::family::Families, liveness| {
        tokio::spawn(
            hotsplit::layout::LayoutWatcher {
                stores: hotsplit::layout::LayoutStores::of(&store),
                layouts,
                families: Arc::new(families.clone()),
                metrics: metrics.clone(),
                liveness,
                sweep_interval: Duration::from_secs(600),
            }
            .run(shutdown.clone()),
        )
    };
    let watchers = [
        watcher(
            grown.clone(),
            &twelve,
            liveness("new", Duration::from_secs(1)),
        ),
        watcher(
            small.clone(),
            &four,
            liveness("small", Duration::from_millis(10)),
        ),
    ];
    poll(
        "the small instance sees the grown one live",
        Duration::from_secs(10),
        || {
            let small = small.clone();
            async move { small.write_copies("g:", 4) == 12 }
        },
    )
    .await;
    assert_eq!(
        publish_g1(&store, &metrics, &four, small, 3).await.copies,
        12
    );
    assert_eq!(grown.write_copies("g:", 12), 12);
    shutdown.cancel();
    for watcher in watchers {
        watcher.await.unwrap();
    }
}

/// Publishes `version` of `g:1` into `store` with `families` and `layouts`; returns the report.
async fn publish_g1(
    store: &Arc<MemoryStore>,
    metrics: &Arc<Metrics>,
    families: &hotsplit::family::Families,
    layouts: Arc<hotsplit::layout::Layouts>,
    version: u64,
) -> hotsplit::publish::PublishReport {
    let publisher = hotsplit::publish::Publisher::new(
        store.clone(),
        Arc::new(families.clone()),
        metrics.clone(),
    )
    .with_layouts(layouts);
    publisher
        .publish(
            &hotsplit::key::Key::parse("g:1").unwrap(),
            hotsplit::publish::VersionChoice::Given(hotsplit::key::Version::new(version).unwrap()),
            bytes::Bytes::from(format!("v{version}")),
        )
        .await
        .unwrap()
}

/// A stale copy 7 of `g:1` at version 1 in `store` (as after a failed delete).
async fn write_a_stale_copy_7(store: &MemoryStore) {
    store
        .write_copies(&[hotsplit::store::CopyWrite {
            copy_key: hotsplit::key::Key::parse("g:1")
                .unwrap()
                .copy_key(7, hotsplit::key::Placement::Suffix),
            version: hotsplit::key::Version::new(1).unwrap(),
            payload: hotsplit::store::Payload::Value(bytes::Bytes::from("v1")),
            expire_at_ms: hotsplit::store::now_unix_ms() + 60_000,
        }])
        .await;
}

/// Copy `index` of `g:1` as `store` reads it.
async fn read_g1_copy(store: &MemoryStore, index: u32) -> hotsplit::store::CopyRead {
    store
        .read_copy(
            &hotsplit::key::Key::parse("g:1")
                .unwrap()
                .copy_key(index, hotsplit::key::Placement::Suffix),
        )
        .await
}
