//! Rolling upgrades on real Redis: an instance of the previous release (its function library
//! `hotsplit`, loaded from `tests/fixtures/hotsplit-v1.lua`, the source that release shipped)
//! publishing next to an instance of this release (`hotsplit_v2`) on one cluster, both correct;
//! the previous library deleted only after its instance left the registry; and a layout
//! mismatch between two running instances reported by both, with the instance and release that
//! wrote the record.
//!
//! The previous release's instance is the library's own publish path and registrar over a
//! `RedisStore` that calls the previous library's functions
//! (`RedisStore::connect_with_library`): the previous release differs from this one, as far as
//! Redis sees it, only in those names.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hotsplit::config::Config;
use hotsplit::fleet::{Registrar, Registry};
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::publish::{PublishReport, PublishStatus, Publisher, VersionChoice};
use hotsplit::store::library::{
    source_digest, FunctionLibrary, LEGACY_LIBRARY_NAME, LIBRARY_NAME, RELEASED,
};
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::LibraryStore;
use hotsplit_devcluster::{self as devcluster, Cluster};
use reqwest::StatusCode;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::harness::{
    command_timeout_toml, config_from_toml, copy_on_owner, get, get_json, metrics_text,
    own_cluster, poll, publish_expecting, publish_succeeds, served_version, Edit, Service,
    COMMAND_TIMEOUT,
};

/// The previous release's function library, as that release shipped it.
const PREVIOUS_SOURCE: &str = include_str!("../fixtures/hotsplit-v1.lua");

/// The family both instances serve: four copies.
const PREFIX: &str = "up:";
const COPIES: u32 = 4;

/// The config both instances share; this release's instance checks for unused libraries every
/// 200 ms, with registry entries that live 600 ms.
fn config_text(url: &str) -> String {
    format!(
        "[[family]]\nprefix = \"{PREFIX}\"\ncopies = {COPIES}\nttl = \"10m\"\n\
         [store]\nredis = {url:?}\ncommand_timeout = \"{}\"\n\
         [fleet]\nheartbeat_interval = \"200ms\"\nretire_interval = \"200ms\"\n",
        command_timeout_toml()
    )
}

/// An instance of the previous release: its publisher and its registry entry, over a store
/// that calls `hotsplit_cas` and the other unversioned functions.
pub(crate) struct PreviousInstance {
    /// Its store, which calls the previous library's functions.
    pub(crate) store: Arc<RedisStore>,
    /// Its publish path.
    publisher: Publisher,
    /// Its id in the registry.
    pub(crate) id: String,
    /// Stops its registrar, which then removes its entry.
    stop: CancellationToken,
    /// The registrar task.
    registrar: JoinHandle<()>,
}

impl PreviousInstance {
    pub(crate) async fn start(url: &str, config: &Config) -> PreviousInstance {
        let mut options = RedisOptions::new(RedisTarget::parse(url).expect("parse the url"));
        options.command_timeout = COMMAND_TIMEOUT;
        let metrics = Metrics::new();
        let store = Arc::new(
            RedisStore::connect_with_library(
                options,
                metrics.clone(),
                FunctionLibrary::legacy(PREVIOUS_SOURCE),
            )
            .await
            .expect("connect with the previous library"),
        );
        let id = format!("previous-{:08x}", rand::random::<u32>());
        // Refreshed every 200 ms, its entry lives 5 s: a test on a loaded machine must not see
        // it lapse while the instance runs (it is removed at once when it leaves).
        let registry = Arc::new(Registry::new(
            store.clone(),
            store.library_name(),
            id.clone(),
            Duration::from_secs(5),
        ));
        registry.set_listen("127.0.0.1:1".to_owned());
        let stop = CancellationToken::new();
        let registrar = tokio::spawn(
            Registrar {
                registry,
                interval: Duration::from_millis(200),
            }
            .run(stop.clone()),
        );
        let publisher = Publisher::new(store.clone(), Arc::new(config.families()), metrics);
        PreviousInstance {
            store,
            publisher,
            id,
            stop,
            registrar,
        }
    }

    pub(crate) async fn publish(&self, key: &str, version: u64, value: &str) -> PublishReport {
        self.publisher
            .publish(
                &Key::parse(key).expect("key"),
                VersionChoice::Given(Version::new(version).expect("version")),
                Bytes::from(value.to_owned()),
            )
            .await
            .expect("publish through the previous library")
    }

    /// Stops the registrar, which removes the entry, and waits for it.
    pub(crate) async fn leave(self) -> Publisher {
        self.stop.cancel();
        self.registrar.await.expect("the registrar ends");
        self.publisher
    }
}

/// The libraries `FUNCTION LIST` shows on `port`.
fn libraries_on(port: u16) -> Vec<String> {
    let text = devcluster::cli(port, &["FUNCTION", "LIST"]).expect("FUNCTION LIST");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|pair| pair[0] == "library_name")
        .map(|pair| pair[1].to_owned())
        .collect()
}

/// The ports of the cluster's masters.
fn master_ports(cluster: &Cluster) -> Vec<u16> {
    cluster
        .masters()
        .expect("masters")
        .iter()
        .map(|node| node.port())
        .collect()
}

/// Whether every master holds library `name`.
fn on_every_master(cluster: &Cluster, name: &str) -> bool {
    master_ports(cluster)
        .into_iter()
        .all(|port| libraries_on(port).iter().any(|held| held == name))
}

/// Whether no master holds library `name`.
fn on_no_master(cluster: &Cluster, name: &str) -> bool {
    master_ports(cluster)
        .into_iter()
        .all(|port| !libraries_on(port).iter().any(|held| held == name))
}

/// How many replicas hold library `name` (`FUNCTION LOAD` and `FUNCTION DELETE` replicate).
fn replicas_holding(cluster: &Cluster, name: &str) -> usize {
    cluster
        .replicas()
        .expect("replicas")
        .iter()
        .filter(|node| libraries_on(node.port()).iter().any(|held| held == name))
        .count()
}

/// The value of the unlabelled counter `name` in `/metrics` of `base`.
async fn counter(http: &reqwest::Client, base: &str, name: &str) -> u64 {
    let text = metrics_text(http, base).await;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

/// Asserts that every copy of `key` holds `version` with `value` on its master.
fn every_copy_holds(cluster: &Cluster, key: &str, version: u64, value: &str) {
    for index in 0..COPIES {
        let copy_key = format!("{key}#{index}");
        let copy = copy_on_owner(cluster, &copy_key);
        assert_eq!(
            (
                copy.get("ver").map(String::as_str),
                copy.get("val").map(String::as_str)
            ),
            (Some(version.to_string().as_str()), Some(value)),
            "{copy_key}: {copy:?}"
        );
    }
}

#[test]
fn the_previous_library_fixture_is_the_released_version_1() {
    assert_eq!(
        RELEASED
            .first()
            .map(|(version, digest)| (*version, *digest)),
        Some((1, source_digest(PREVIOUS_SOURCE).as_str())),
        "tests/fixtures/hotsplit-v1.lua is the library the previous release shipped"
    );
    assert!(PREVIOUS_SOURCE.starts_with(&format!("#!lua name={LEGACY_LIBRARY_NAME}\n")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_two_library_versions_publish_side_by_side_and_the_old_one_goes_after_its_instance()
{
    let cluster = own_cluster().await;
    let url = cluster.url();
    let config = config_from_toml(&config_text(&url));
    let http = reqwest::Client::new();

    // The previous release runs first; then this release starts beside it.
    let previous = PreviousInstance::start(&url, &config).await;
    assert!(on_every_master(&cluster, LEGACY_LIBRARY_NAME));
    let current = Service::start(config.clone()).await;
    assert!(on_every_master(&cluster, LIBRARY_NAME));
    assert!(
        on_every_master(&cluster, LEGACY_LIBRARY_NAME),
        "loading this release's library left the previous one in place"
    );
    // A previous-release instance that restarts now reloads its library with REPLACE: this
    // release's functions stay.
    for port in master_ports(&cluster) {
        devcluster::cli(port, &["FUNCTION", "LOAD", "REPLACE", PREVIOUS_SOURCE])
            .expect("reload the previous library");
    }
    assert!(on_every_master(&cluster, LIBRARY_NAME));

    let key = "up:side-by-side";
    alternate_publishes_never_roll_back(&cluster, &http, &current, &previous, key).await;

    racing_publishes_end_at_the_highest(&cluster, &http, &current, &previous).await;

    the_previous_library_stays_while_registered(&cluster, &http, &current, &previous).await;

    let previous_publisher =
        the_previous_library_goes_after_its_instance(&cluster, &http, &current, previous, key)
            .await;

    an_unregistered_previous_publisher_keeps_its_library(
        &cluster,
        &http,
        &current,
        &previous_publisher,
        key,
    )
    .await;
    current.stop().await;
}

/// Alternate publishes of `key` from both releases: neither rolls back a copy the other moved
/// forward.
async fn alternate_publishes_never_roll_back(
    cluster: &Cluster,
    http: &reqwest::Client,
    current: &Service,
    previous: &PreviousInstance,
    key: &str,
) {
    // Alternate publishes: neither rolls back a copy the other moved forward.
    let report = previous.publish(key, 1, "previous-1").await;
    assert_eq!(report.status(), PublishStatus::Done, "{report:?}");
    publish_succeeds(http, &current.base, key, 2, "current-2").await;
    every_copy_holds(cluster, key, 2, "current-2");
    let report = previous.publish(key, 1, "previous-1").await;
    assert_eq!(report.status(), PublishStatus::Stale, "{report:?}");
    every_copy_holds(cluster, key, 2, "current-2");
    let report = previous.publish(key, 3, "previous-3").await;
    assert_eq!(report.status(), PublishStatus::Done, "{report:?}");
    publish_expecting(
        http,
        &current.base,
        Edit::new(key, 2, "current-2"),
        StatusCode::CONFLICT,
    )
    .await;
    every_copy_holds(cluster, key, 3, "previous-3");
    let answer = get(
        http,
        &format!("{}/v1/keys/{key}?client=reader", current.base),
        &[],
    )
    .await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(served_version(&answer), 3);
    assert_eq!(answer.text().await.expect("body"), "previous-3");
}

/// Racing publishes from both releases: every copy ends at the highest version.
async fn racing_publishes_end_at_the_highest(
    cluster: &Cluster,
    http: &reqwest::Client,
    current: &Service,
    previous: &PreviousInstance,
) {
    // Racing publishes: the previous release publishes odd versions, this one even ones, at
    // once; every copy ends at the highest.
    let raced = "up:raced";
    for round in 0..20u64 {
        let odd = 2 * round + 1;
        let even = 2 * round + 2;
        let odd_value = format!("v{odd}");
        let (report, _) = tokio::join!(
            previous.publish(raced, odd, &odd_value),
            publish_succeeds_or_stale(http, &current.base, raced, even),
        );
        assert!(
            matches!(report.status(), PublishStatus::Done | PublishStatus::Stale),
            "{report:?}"
        );
    }
    every_copy_holds(cluster, raced, 40, "v40");
}

/// The previous library is on the replicas too, and stays while its instance is registered.
async fn the_previous_library_stays_while_registered(
    cluster: &Cluster,
    http: &reqwest::Client,
    current: &Service,
    previous: &PreviousInstance,
) {
    // The replicas hold the previous library too (FUNCTION LOAD replicates).
    let replicas = cluster.replicas().expect("replicas").len();
    poll(
        "the replicas hold the previous library",
        Duration::from_secs(30),
        || async { replicas_holding(cluster, LEGACY_LIBRARY_NAME) == replicas },
    )
    .await;

    // While the previous instance is registered its library stays, check after check.
    let instances = get_json(http, &format!("{}/v1/instances", current.base)).await;
    let listed = instances["instances"].as_array().expect("instances");
    assert!(
        listed
            .iter()
            .any(|entry| entry["id"] == previous.id.as_str()
                && entry["library"] == LEGACY_LIBRARY_NAME),
        "{instances}"
    );
    let checks = counter(
        http,
        &current.base,
        "hotsplit_function_library_checks_total",
    )
    .await;
    poll(
        "five more checks (more than the 600 ms grace)",
        Duration::from_secs(30),
        || async {
            counter(
                http,
                &current.base,
                "hotsplit_function_library_checks_total",
            )
            .await
                >= checks + 5
        },
    )
    .await;
    assert!(on_every_master(cluster, LEGACY_LIBRARY_NAME));
    assert_eq!(
        counter(
            http,
            &current.base,
            "hotsplit_function_libraries_deleted_total"
        )
        .await,
        0
    );
}

/// The previous instance leaves: its library is deleted everywhere, this one's stays, and
/// publishing `key` goes on; returns the previous instance's publisher, now unregistered.
async fn the_previous_library_goes_after_its_instance(
    cluster: &Cluster,
    http: &reqwest::Client,
    current: &Service,
    previous: PreviousInstance,
    key: &str,
) -> Publisher {
    // The previous instance leaves: its library is deleted from every primary, this one's
    // stays, and publishing goes on.
    let previous_publisher = previous.leave().await;
    poll(
        "the previous library is deleted everywhere",
        Duration::from_secs(30),
        || async { on_no_master(cluster, LEGACY_LIBRARY_NAME) },
    )
    .await;
    assert!(on_every_master(cluster, LIBRARY_NAME));
    poll(
        "the deletion reaches the replicas",
        Duration::from_secs(30),
        || async { replicas_holding(cluster, LEGACY_LIBRARY_NAME) == 0 },
    )
    .await;
    assert_eq!(
        counter(
            http,
            &current.base,
            "hotsplit_function_libraries_deleted_total"
        )
        .await,
        1
    );
    publish_succeeds(http, &current.base, key, 4, "current-4").await;
    every_copy_holds(cluster, key, 4, "current-4");
    previous_publisher
}

/// An unregistered previous-release publisher reloads its library to publish `key`; the
/// retirer keeps the library that came back.
async fn an_unregistered_previous_publisher_keeps_its_library(
    cluster: &Cluster,
    http: &reqwest::Client,
    current: &Service,
    previous_publisher: &Publisher,
    key: &str,
) {
    // An instance of the previous release that never registered still publishes: its write
    // meets `Function not found`, it reloads its library and retries. The retirer sees the
    // library back with no registered instance running it, and keeps it.
    let report = previous_publisher
        .publish(
            &Key::parse(key).expect("key"),
            VersionChoice::Given(Version::new(5).expect("version")),
            Bytes::from_static(b"unregistered-5"),
        )
        .await
        .expect("publish");
    assert_eq!(report.status(), PublishStatus::Done, "{report:?}");
    every_copy_holds(cluster, key, 5, "unregistered-5");
    poll(
        "the retirer sees the library come back",
        Duration::from_secs(30),
        || async {
            counter(
                http,
                &current.base,
                "hotsplit_function_libraries_reappeared_total",
            )
            .await
                >= 1
        },
    )
    .await;
    // The primaries its writes reached hold it again, and keep it check after check.
    let holders: Vec<u16> = master_ports(cluster)
        .into_iter()
        .filter(|&port| {
            libraries_on(port)
                .iter()
                .any(|held| held == LEGACY_LIBRARY_NAME)
        })
        .collect();
    assert!(!holders.is_empty());
    let checks = counter(
        http,
        &current.base,
        "hotsplit_function_library_checks_total",
    )
    .await;
    poll("five more checks", Duration::from_secs(30), || async {
        counter(
            http,
            &current.base,
            "hotsplit_function_library_checks_total",
        )
        .await
            >= checks + 5
    })
    .await;
    for port in holders {
        assert!(
            libraries_on(port)
                .iter()
                .any(|held| held == LEGACY_LIBRARY_NAME),
            "the library that came back is kept on {port}"
        );
    }
    assert_eq!(
        counter(
            http,
            &current.base,
            "hotsplit_function_libraries_deleted_total"
        )
        .await,
        1
    );
}

/// Publishes `v<version>` through `base`: applied (2xx), or refused as older than a copy the
/// other instance already moved forward (409 `stale_version`).
async fn publish_succeeds_or_stale(http: &reqwest::Client, base: &str, key: &str, version: u64) {
    let answer = http
        .put(format!("{base}/v1/keys/{key}?version={version}"))
        .body(format!("v{version}"))
        .send()
        .await
        .expect("publish");
    let status = answer.status();
    assert!(
        status.is_success() || status == StatusCode::CONFLICT,
        "publish {key} v{version}: {status}: {}",
        answer.text().await.unwrap_or_default()
    );
}

/// The config of an instance running `copies` copies of family `prefix` on `url`, refreshing
/// its live entries and re-reading the records every second (an entry lives 3 s: long enough
/// not to lapse under load while its instance runs).
fn layout_config(url: &str, prefix: &str, copies: u32) -> Config {
    config_from_toml(&format!(
        "[[family]]\nprefix = \"{prefix}\"\ncopies = {copies}\nttl = \"10m\"\n\
         [store]\nredis = {url:?}\ncommand_timeout = \"{}\"\n\
         [heal]\nlayout_interval = \"1s\"\n\
         [fleet]\nheartbeat_interval = \"200ms\"\n",
        command_timeout_toml()
    ))
}

/// `GET /v1/instances` of `base`: the answering id and its layout mismatches.
async fn layout_mismatches(http: &reqwest::Client, base: &str) -> (String, Vec<serde_json::Value>) {
    let view = get_json(http, &format!("{base}/v1/instances")).await;
    let this = view["this"].as_str().expect("this").to_owned();
    let mismatches = view["layout_mismatches"]
        .as_array()
        .unwrap_or_else(|| panic!("layout_mismatches in {view}"))
        .clone();
    (this, mismatches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_a_layout_mismatch_between_running_instances_is_reported_with_its_writer() {
    let cluster = crate::harness::shared_cluster();
    let url = cluster.url();
    let prefix = format!("lm{:08x}:", rand::random::<u32>());
    let http = reqwest::Client::new();
    let gauge = format!("hotsplit_layout_mismatch{{family=\"{prefix}\"}}");

    // A runs 8 copies; B starts with 4 while A runs and records its layout.
    let a = Service::start(layout_config(&url, &prefix, 8)).await;
    let b = Service::start(layout_config(&url, &prefix, 4)).await;
    let (a_id, _) = layout_mismatches(&http, &a.base).await;
    let (b_id, from_b) = layout_mismatches(&http, &b.base).await;

    // The record keeps the format the previous release parses; its writer is kept apart.
    let record_key = hotsplit::store::layout_key(&prefix);
    let record = devcluster::cli(
        crate::harness::owner_port(cluster, &record_key),
        &["GET", &record_key],
    )
    .expect("GET the layout record");
    assert_eq!(record, "4:8");
    let writer_key = hotsplit::store::layout_writer_key(&prefix);
    let writer = crate::harness::hgetall(
        crate::harness::owner_port(cluster, &writer_key),
        &writer_key,
    );
    assert_eq!(writer.get("instance"), Some(&b_id), "{writer:?}");
    assert_eq!(
        writer.get("release").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(writer.get("copies").map(String::as_str), Some("4"));

    // B, the last to start, reports the running instance it disagrees with.
    let entry = from_b
        .iter()
        .find(|entry| entry["family"] == prefix.as_str())
        .unwrap_or_else(|| panic!("B reports {prefix}: {from_b:?}"));
    assert_eq!(entry["configured"], 4);
    assert_eq!(entry["recorded_copies"], 4);
    assert_eq!(entry["live_copies"], serde_json::json!([8]));
    assert_eq!(entry["writer"]["instance"], b_id.as_str());
    // A sees the record B wrote, with B's instance and release.
    poll(
        "A reports the mismatch",
        Duration::from_secs(30),
        || async {
            let (_, from_a) = layout_mismatches(&http, &a.base).await;
            from_a.iter().any(|entry| {
                entry["family"] == prefix.as_str()
                    && entry["configured"] == 8
                    && entry["recorded_copies"] == 4
                    && entry["writer"]["instance"] == b_id.as_str()
                    && entry["writer"]["release"] == env!("CARGO_PKG_VERSION")
            })
        },
    )
    .await;
    for service in [&a, &b] {
        let metrics = metrics_text(&http, &service.base).await;
        assert!(
            metrics.lines().any(|line| line == format!("{gauge} 1")),
            "{gauge} 1 on {}",
            service.base
        );
    }
    assert_ne!(a_id, b_id);

    // A stops: once its live entry lapses, B runs alone on the recorded layout and its report
    // ends.
    a.stop().await;
    poll("B's report ends", Duration::from_secs(30), || async {
        let (_, from_b) = layout_mismatches(&http, &b.base).await;
        !from_b
            .iter()
            .any(|entry| entry["family"] == prefix.as_str())
    })
    .await;
    let metrics = metrics_text(&http, &b.base).await;
    assert!(
        metrics.lines().any(|line| line == format!("{gauge} 0")),
        "{gauge} 0"
    );
    b.stop().await;
}
