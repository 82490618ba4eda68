//! The anti-entropy scrub on a real Redis Cluster of each test's own (the scrub's lease is
//! cluster-wide, so the shared cluster's other services must not hold it): a copy set behind by
//! hand and a copy deleted by hand are repaired within the scrub's period, a tombstoned key
//! stays deleted, no copy's expiry grows, keys that are not copies are untouched; one holder at
//! a time, replaced when it stops; two scrubbers at once converge and never roll a copy back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotsplit::config::Config;
use hotsplit::heal::{NodeHealth, ScrubStatus, Scrubber};
use hotsplit::layout::Layouts;
use hotsplit::metrics::Metrics;
use hotsplit_devcluster::{self as devcluster, Cluster};
use reqwest::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::harness::{
    self, config_from_toml, copy_on_owner, get, get_json, metrics_text, owner_port, poll,
    publish_succeeds, Service,
};

/// A config on `url` with the split family `prefix` of `copies` copies, the scrub every
/// `interval` with a short lease.
fn scrub_config(url: &str, prefix: &str, copies: u32, interval: &str, enabled: bool) -> Config {
    let mut config = config_from_toml(&format!(
        "[[family]]\nprefix = \"{prefix}\"\ncopies = {copies}\nttl = \"10m\"\n\
         [store]\ncommand_timeout = \"2s\"\n\
         [scrub]\nenabled = {enabled}\ninterval = \"{interval}\"\nlease_ttl = \"3s\"\nmax_keys_per_second = 5000\n"
    ));
    config.store.redis = Some(url.to_owned());
    config
}

/// Runs one command on the master that owns `key`; panics naming it when it fails.
fn on_owner(cluster: &Cluster, key: &str, args: &[&str]) -> String {
    let port = owner_port(cluster, key);
    devcluster::cli(port, args)
        .unwrap_or_else(|err| panic!("{args:?} on the owner of {key} (127.0.0.1:{port}): {err}"))
}

/// `PEXPIRETIME copy_key` on its owner.
fn pexpiretime(cluster: &Cluster, copy_key: &str) -> i64 {
    on_owner(cluster, copy_key, &["PEXPIRETIME", copy_key])
        .trim()
        .parse()
        .expect("PEXPIRETIME answers an integer")
}

/// The stored version of `copy_key`, `None` when the copy is missing.
fn version_of(cluster: &Cluster, copy_key: &str) -> Option<u64> {
    copy_on_owner(cluster, copy_key)
        .get("ver")
        .map(|ver| ver.parse().expect("a stored version is a number"))
}

/// The scrub view of `base`.
async fn scrub_view(http: &reqwest::Client, base: &str) -> Value {
    get_json(http, &format!("{base}/v1/scrub")).await
}

/// Waits until `base` has finished `more` passes after the `passes` it had.
async fn passes_after(http: &reqwest::Client, base: &str, passes: u64, more: u64) {
    poll(
        "the scrub finishes more passes",
        Duration::from_secs(20),
        || async move {
            scrub_view(http, base).await["passes"].as_u64().unwrap_or(0) >= passes + more
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_repairs_a_behind_and_a_deleted_copy_keeps_tombstones_and_expiries_and_skips_non_copies(
) {
    let cluster = harness::own_cluster().await;
    let http = reqwest::Client::new();
    let service = Service::start(scrub_config(&cluster.url(), "sc:", 4, "300ms", true)).await;
    let base = &service.base;
    publish_succeeds(&http, base, "sc:a", 1, "one").await;
    publish_succeeds(&http, base, "sc:a", 2, "two").await;
    publish_succeeds(&http, base, "sc:gone", 1, "soon gone").await;
    let deleted = http
        .delete(format!("{base}/v1/keys/sc:gone?version=2"))
        .send()
        .await
        .expect("send the delete");
    assert_eq!(deleted.status(), StatusCode::OK);

    let copies = |key: &str| (0..4).map(|i| format!("{key}#{i}")).collect::<Vec<_>>();
    let before: BTreeMap<String, (BTreeMap<String, String>, i64)> = copies("sc:a")
        .into_iter()
        .chain(copies("sc:gone"))
        .map(|copy| {
            let held = (copy_on_owner(&cluster, &copy), pexpiretime(&cluster, &copy));
            (copy, held)
        })
        .collect();
    let latest_expiry = before.values().map(|(_, at)| *at).max().unwrap();

    // By hand: copy 1 behind (version 1), copy 2 deleted, one tombstone copy deleted, and keys
    // the scrub must never touch: not copies, and a copy beyond N.
    let strangers = ["sc:a#9", "sc:x#bar", "sc:a#07"];
    break_copies_by_hand(&cluster, &strangers);
    let passes = scrub_view(&http, base).await["passes"]
        .as_u64()
        .unwrap_or(0);

    poll(
        "the scrub repairs sc:a#1, sc:a#2 and sc:gone#3",
        Duration::from_secs(20),
        || async {
            version_of(&cluster, "sc:a#1") == Some(2)
                && version_of(&cluster, "sc:a#2") == Some(2)
                && copy_on_owner(&cluster, "sc:gone#3")
                    .get("tomb")
                    .map(String::as_str)
                    == Some("1")
        },
    )
    .await;
    // Two more passes: anything the scrub was going to do to the other keys is done.
    passes_after(&http, base, passes, 2).await;

    // The repaired copies hold the newest record with its own expiry: the value or the
    // tombstone of version 2, an `exp` a sibling had, and a key expiry no later than before.
    let siblings_exp = |key: &str| -> Vec<String> {
        copies(key)
            .iter()
            .map(|copy| before[copy].0["exp"].clone())
            .collect()
    };
    for (copy, key) in [
        ("sc:a#1", "sc:a"),
        ("sc:a#2", "sc:a"),
        ("sc:gone#3", "sc:gone"),
    ] {
        let now = copy_on_owner(&cluster, copy);
        assert_eq!(now["ver"], "2", "{copy}: {now:?}");
        assert!(siblings_exp(key).contains(&now["exp"]), "{copy}: {now:?}");
        assert!(pexpiretime(&cluster, copy) <= latest_expiry, "{copy}");
    }
    assert_eq!(copy_on_owner(&cluster, "sc:a#2")["val"], "two");
    // The copies nobody broke are as they were, expiry included.
    for copy in ["sc:a#0", "sc:a#3", "sc:gone#0", "sc:gone#1", "sc:gone#2"] {
        assert_eq!(copy_on_owner(&cluster, copy), before[copy].0, "{copy}");
        assert_eq!(pexpiretime(&cluster, copy), before[copy].1, "{copy}");
    }
    // The tombstoned key stays deleted for every reader.
    for client in 0..16 {
        let answer = get(
            &http,
            &format!("{base}/v1/keys/sc:gone?client=c{client}"),
            &[],
        )
        .await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "client c{client}");
    }
    for stranger in strangers {
        let held = copy_on_owner(&cluster, stranger);
        assert_eq!(held["ver"], "1", "{stranger}: {held:?}");
        assert_eq!(held["val"], "old", "{stranger}: {held:?}");
    }

    let view = scrub_view(&http, base).await;
    assert_eq!(view["enabled"], true, "{view}");
    assert_eq!(view["holds_lease"], true, "{view}");
    assert_eq!(view["lease_holder"], view["instance"], "{view}");
    let metrics = metrics_text(&http, base).await;
    for line in [
        "hotsplit_scrub_repairs_total{cause=\"missing\"} 2",
        "hotsplit_scrub_repairs_total{cause=\"behind\"} 1",
        "hotsplit_scrub_lease_held 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("hotsplit_scrub_passes_total{result=\"complete\"}"));
    service.stop().await;
}

/// Sets `sc:a#1` behind (version 1), deletes `sc:a#2` and the tombstone copy `sc:gone#3`, and
/// writes the `strangers`, keys the scrub must never touch.
fn break_copies_by_hand(cluster: &Cluster, strangers: &[&str]) {
    on_owner(
        cluster,
        "sc:a#1",
        &["HSET", "sc:a#1", "ver", "1", "val", "one"],
    );
    on_owner(cluster, "sc:a#2", &["DEL", "sc:a#2"]);
    on_owner(cluster, "sc:gone#3", &["DEL", "sc:gone#3"]);
    for &stranger in strangers {
        on_owner(
            cluster,
            stranger,
            &[
                "HSET", stranger, "ver", "1", "val", "old", "tomb", "0", "exp", "1",
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_lease_has_one_holder_at_a_time_and_passes_on_when_it_stops() {
    let cluster = harness::own_cluster().await;
    let http = reqwest::Client::new();
    let first = Service::start(scrub_config(&cluster.url(), "sl:", 3, "200ms", true)).await;
    let second = Service::start(scrub_config(&cluster.url(), "sl:", 3, "200ms", true)).await;
    publish_succeeds(&http, &first.base, "sl:k", 1, "one").await;

    poll(
        "one instance holds the lease",
        Duration::from_secs(10),
        || async {
            let (a, b) = (
                scrub_view(&http, &first.base).await,
                scrub_view(&http, &second.base).await,
            );
            a["holds_lease"] != b["holds_lease"] && a["lease_holder"] == b["lease_holder"]
        },
    )
    .await;
    let (holder, other) = if scrub_view(&http, &first.base).await["holds_lease"] == true {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(scrub_view(&http, &other.base).await["passes"], 0);
    holder.stop().await;

    // The holder released the lease as it stopped: the other takes over and repairs.
    on_owner(&cluster, "sl:k#2", &["DEL", "sl:k#2"]);
    poll(
        "the remaining instance takes the lease and repairs sl:k#2",
        Duration::from_secs(10),
        || async {
            scrub_view(&http, &other.base).await["holds_lease"] == true
                && version_of(&cluster, "sl:k#2") == Some(1)
        },
    )
    .await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scrubbers_at_once_converge_and_never_roll_a_copy_back() {
    let cluster = Arc::new(harness::own_cluster().await);
    let http = reqwest::Client::new();
    let config = scrub_config(&cluster.url(), "s2:", 4, "10m", false);
    let service = Service::start(config.clone()).await;
    let base = service.base.clone();
    let keys: Vec<String> = (0..12).map(|i| format!("s2:{i}")).collect();
    for key in &keys {
        publish_succeeds(&http, &base, key, 1, "one").await;
        publish_succeeds(&http, &base, key, 2, "two").await;
    }
    // Break every key: one copy deleted, one set back to version 1.
    for (at, key) in keys.iter().enumerate() {
        let (gone, behind) = (
            format!("{key}#{}", at % 4),
            format!("{key}#{}", (at + 1) % 4),
        );
        on_owner(&cluster, &gone, &["DEL", &gone]);
        on_owner(
            &cluster,
            &behind,
            &["HSET", &behind, "ver", "1", "val", "one"],
        );
    }

    // Two scrubbers, each with a store of its own, run passes back to back with no lease,
    // while the even keys keep being published and a sampler watches every copy.
    let scrubbers = [
        scrubber(&config, &cluster.url(), "one").await,
        scrubber(&config, &cluster.url(), "two").await,
    ];
    let stop = CancellationToken::new();
    let writing = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (cluster, keys, writing) = (cluster.clone(), keys.clone(), writing.clone());
        tokio::task::spawn_blocking(move || watch_copies_never_go_back(&cluster, &keys, &writing))
    };
    let writer = async {
        for version in 3..=12u64 {
            for key in keys.iter().step_by(2) {
                publish_succeeds(&http, &base, key, version, &format!("v{version}")).await;
            }
        }
    };
    // The token is never cancelled: the loop stops between rounds, so every pass completes.
    let done = AtomicBool::new(false);
    let passes = async {
        let mut rounds = 0;
        while !done.load(Ordering::Acquire) {
            let (a, b) = tokio::join!(scrubbers[0].pass(&stop), scrubbers[1].pass(&stop));
            assert!(a.complete && b.complete, "{a:?} {b:?}");
            rounds += 1;
        }
        rounds
    };
    let ((), rounds) = tokio::join!(
        async {
            writer.await;
            // Two more rounds after the last write, then stop.
            let seen = scrubbers[0].status.view().passes;
            poll("two more passes", Duration::from_secs(20), || async {
                scrubbers[0].status.view().passes >= seen + 2
            })
            .await;
            done.store(true, Ordering::Release);
        },
        passes
    );
    assert!(rounds >= 2, "{rounds} rounds");
    writing.store(false, Ordering::Release);
    sampler.await.expect("the sampler saw no copy go back");

    for (at, key) in keys.iter().enumerate() {
        let newest = if at % 2 == 0 { 12 } else { 2 };
        for copy in 0..4 {
            let copy_key = format!("{key}#{copy}");
            assert_eq!(version_of(&cluster, &copy_key), Some(newest), "{copy_key}");
        }
    }
    let repaired: u64 = scrubbers
        .iter()
        .filter_map(|scrubber| scrubber.status.view().last)
        .map(|pass| pass.repaired_missing + pass.repaired_behind)
        .sum();
    assert_eq!(repaired, 0, "the last passes found nothing left to repair");
    service.stop().await;
}

/// A scrubber named `instance` with a store of its own on `url`, scrubbing under `config`.
async fn scrubber(config: &Config, url: &str, instance: &str) -> Scrubber {
    let instance = instance.to_owned();
    let store = harness::redis_store(url, Duration::from_secs(2)).await;
    Scrubber {
        copies: store.clone(),
        scan: store,
        health: NodeHealth::new(),
        families: Arc::new(config.families()),
        layouts: Layouts::unrecorded(),
        status: Arc::new(ScrubStatus::new(&Metrics::new(), true, &instance)),
        config: config.scrub.clone(),
        instance,
        split_index_max_age: Duration::from_secs(1),
    }
}

/// Reads every copy of `keys` round after round while `writing`, and two rounds more: no copy
/// goes back to a lower version, nor vanishes once seen.
fn watch_copies_never_go_back(cluster: &Cluster, keys: &[String], writing: &AtomicBool) {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut rounds = 0;
    while writing.load(Ordering::Acquire) || rounds < 2 {
        if !writing.load(Ordering::Acquire) {
            rounds += 1;
        }
        for key in keys {
            for copy in 0..4 {
                let copy_key = format!("{key}#{copy}");
                let Some(now) = version_of(cluster, &copy_key) else {
                    assert!(!seen.contains_key(&copy_key), "{copy_key} vanished");
                    continue;
                };
                let last = seen.entry(copy_key.clone()).or_insert(now);
                assert!(now >= *last, "{copy_key} went back from {last} to {now}");
                *last = now;
            }
        }
    }
}

#[tokio::test]
async fn scrub_is_off_on_the_embedded_store() {
    let mut config = scrub_config("redis://unused", "se:", 2, "1s", true);
    config.store.redis = None;
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let view = scrub_view(&http, &service.base).await;
    assert_eq!(view["enabled"], false, "{view}");
    assert_eq!(view["passes"], 0, "{view}");
    service.stop().await;
}
