//! The `spread` default of a new family and the placement compatibility window
//! (`layout::placing`, point 4): a family whose config names no placement runs `spread` on a
//! 3-master cluster, and its copies share a key's reads evenly over 1,000 key names; once every
//! live instance reads the tagged names a publish writes N copies and `K#i` is deleted; a
//! `suffix` instance that joins after that reads no copy that missed an edit.

use std::time::Duration;

use hotsplit::key::{Key, Placement};
use hotsplit::placement::slot_of;
use hotsplit_devcluster::Standalone;

use crate::harness::{
    self, affinity, config_from_toml, config_from_toml_as_written, poll, shared_cluster, Service,
};
use crate::route::NEAR_CACHE_OFF;

/// How often the instances of these tests refresh their live entries.
const LAYOUT_INTERVAL: &str = "200ms";

/// The command timeout of these tests' services: the settle time is the layout interval plus
/// twice this, and every step of the window waits it once.
const COMMAND_TIMEOUT: &str = "1s";

/// A config on `url` with family `prefix` of `copies` copies and `placement` (`None`: not set,
/// the default), read with the `primary` class, the near cache and the scrub off.
fn config(
    url: &str,
    prefix: &str,
    copies: u32,
    placement: Option<&str>,
) -> hotsplit::config::Config {
    let placement = placement.map_or_else(String::new, |placement| {
        format!("placement = \"{placement}\"\n")
    });
    config_from_toml_as_written(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{COMMAND_TIMEOUT}\"\n[[family]]\nprefix = \"{prefix}\"\ncopies = {copies}\nttl = \"10m\"\n{placement}[heal]\nlayout_interval = \"{LAYOUT_INTERVAL}\"\n[scrub]\nenabled = false\n{NEAR_CACHE_OFF}"
    ))
}

/// One client id per copy of a `copies`-copy key (the client whose affine copy it is).
fn client_per_copy(copies: u32) -> Vec<String> {
    (0..copies)
        .map(|copy| harness::client_of_copy("c", copy, copies))
        .collect()
}

/// The value of the gauge `line_prefix` (a metric name with its labels) on `base`.
async fn gauge(http: &reqwest::Client, base: &str, line_prefix: &str) -> Option<f64> {
    harness::metrics_text(http, base)
        .await
        .lines()
        .find_map(|line| line.strip_prefix(line_prefix)?.trim().parse().ok())
}

/// Waits until `base` says `family`'s window is `closed` (1) or open (0).
pub(crate) async fn wait_window(http: &reqwest::Client, base: &str, family: &str, closed: bool) {
    let line = format!("hotsplit_placement_window_closed{{family=\"{family}\"}} ");
    let want = if closed { 1.0 } else { 0.0 };
    poll(
        &format!("{family}'s window closed = {closed}"),
        Duration::from_secs(30),
        || async { gauge(http, base, &line).await == Some(want) },
    )
    .await;
}

/// Whether the untagged `K#i` of `key` exists, for any `i` in `1..copies`.
fn any_untagged(server: &Standalone, key: &str, copies: u32) -> bool {
    (1..copies).any(|index| {
        let name = format!("{key}#{index}");
        server.node.cli(&["EXISTS", &name]).expect("EXISTS").trim() == "1"
    })
}

/// The stored version of `copy_key` on the standalone server (`None`: missing).
fn stored_version(server: &Standalone, copy_key: &str) -> Option<u64> {
    let text = server
        .node
        .cli(&["HGET", copy_key, "ver"])
        .expect("HGET the version");
    text.trim().parse().ok()
}

/// The version `base` serves `key` to `client`.
async fn served(http: &reqwest::Client, base: &str, key: &str, client: &str) -> u64 {
    let answer = harness::get(http, &format!("{base}/v1/keys/{key}?client={client}"), &[]).await;
    assert!(
        answer.status().is_success(),
        "{client}: {key} answered {}",
        answer.status()
    );
    harness::served_version(&answer)
}

/// The copy names a publish of `version` of `key` through `base` wrote.
async fn published_names(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    version: u64,
) -> Vec<String> {
    let answer = harness::publish_succeeds(http, base, key, version, &format!("v{version}")).await;
    let report: serde_json::Value = answer.json().await.unwrap();
    report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| line["copy_key"].as_str().unwrap().to_owned())
        .collect()
}

/// The proof of the default: a family whose config names no placement, with no copies
/// yet, runs `spread` (the service reads the tagged names, and says why), and over 1,000 key
/// names of 16 copies the busiest master's share of a key's copies on the cluster's slot map
/// (with the `primary` class and clients spread evenly over the copies, its share of the
/// key's reads) is at most 0.39 on average and 0.45 at worst; `suffix`'s figures on the same
/// map are printed beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_placement_of_a_new_family_spreads_a_thousand_keys_evenly() {
    const COPIES: u32 = 16;
    let cluster = shared_cluster();
    let http = reqwest::Client::new();
    let service = Service::start(config(&cluster.url(), "even:", COPIES, None)).await;
    // The service runs `spread` by default, and names its copies as `CopyKey::new` does.
    let clients = client_per_copy(COPIES);
    poll(
        "the new family reads its tagged names",
        Duration::from_secs(30),
        || async {
            affinity(&http, &service.base, "even:0", &clients[1]).await["copy_key"]
                .as_str()
                .is_some_and(|name| name.ends_with('}'))
        },
    )
    .await;
    let key = Key::parse("even:0").unwrap();
    for (copy, client) in clients.iter().enumerate() {
        let named = affinity(&http, &service.base, "even:0", client).await;
        assert_eq!(
            named["copy_key"].as_str().unwrap(),
            key.copy_key(copy as u32, Placement::Spread).as_str()
        );
    }
    let fleet = harness::get_json(&http, &format!("{}/v1/fleet", service.base)).await;
    assert!(
        fleet
            .to_string()
            .contains("\"placement_reason\":\"default for a new family\""),
        "{fleet}"
    );
    service.stop().await;

    let masters: Vec<Vec<(u16, u16)>> = cluster
        .topology()
        .expect("the cluster's topology")
        .into_iter()
        .filter(|node| node.is_master() && !node.slots.is_empty())
        .map(|node| node.slots)
        .collect();
    assert_eq!(masters.len(), 3);
    let master_of = |name: &str| {
        let slot = slot_of(name);
        masters
            .iter()
            .position(|ranges| {
                ranges
                    .iter()
                    .any(|&(first, last)| (first..=last).contains(&slot))
            })
            .expect("every slot is served")
    };
    let busiest_share = |key: &Key, placement: Placement| {
        let mut per_master = [0u32; 3];
        for index in 0..COPIES {
            per_master[master_of(key.copy_key(index, placement).as_str())] += 1;
        }
        f64::from(*per_master.iter().max().unwrap()) / f64::from(COPIES)
    };
    let mut figures = Vec::new();
    for placement in [Placement::Suffix, Placement::Spread] {
        let shares: Vec<f64> = (0..1000)
            .map(|n| busiest_share(&Key::parse(&format!("even:{n}")).unwrap(), placement))
            .collect();
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        let worst = shares.iter().copied().fold(0.0, f64::max);
        println!(
            "busiest master's share of a key's reads, 1,000 keys, N = 16: {:>6} mean {mean:.3} worst {worst:.3} (even 0.375)",
            placement.as_str()
        );
        figures.push((placement, mean, worst));
    }
    let (_, mean, worst) = figures[1];
    assert!(
        mean <= 0.39,
        "spread: mean busiest share {mean:.3} (want at most 0.39)"
    );
    assert!(
        worst <= 0.45,
        "spread: worst busiest share {worst:.3} (want at most 0.45)"
    );
}

/// Once every live instance reads the tagged names the window closes: a publish writes copy 0
/// and the tagged names only (N names, not 2N − 1), the `K#i` copies are deleted (checked on
/// the server), reads answer the newest version, and the gauge and `/v1/fleet` say `closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_window_writes_n_copies_and_deletes_k_i() {
    let server = harness::shared_standalone();
    let http = reqwest::Client::new();
    let (family, key) = ("winc:", "winc:1");
    let service = Service::start(config(&server.url(), family, 4, None)).await;
    // While the window is open: copy 0 and both names of copies 1..4.
    assert_eq!(published_names(&http, &service.base, key, 1).await.len(), 7);
    wait_window(&http, &service.base, family, true).await;
    let fleet = harness::get_json(&http, &format!("{}/v1/fleet", service.base)).await;
    assert!(
        fleet
            .to_string()
            .contains("\"placement_window\":\"closed\""),
        "{fleet}"
    );
    poll(
        "the K#i copies are deleted",
        Duration::from_secs(30),
        || async { !any_untagged(server, key, 4) },
    )
    .await;
    let parsed = Key::parse(key).unwrap();
    let names = published_names(&http, &service.base, key, 2).await;
    let mut want: Vec<String> = (0..4)
        .map(|index| parsed.copy_key(index, Placement::Spread).to_string())
        .collect();
    let mut got = names.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "a publish after the close writes N names");
    assert!(!any_untagged(server, key, 4), "no K#i is written");
    for name in &want {
        assert_eq!(stored_version(server, name), Some(2), "{name}");
    }
    for client in client_per_copy(4) {
        assert_eq!(served(&http, &service.base, key, &client).await, 2);
    }
    service.stop().await;
}

/// The rollback: a `spread` family's window closed and its `K#i` deleted; more edits are
/// published, one `K#i` is put back at an old version (as a late retry could) and another is
/// corrupt, and a `suffix` instance joins. Before it serves, the writers have reopened the window and it has refilled
/// `K#i` from the newest copies: every client of both instances is served the newest version
/// at once and after every later publish through either instance (none reads a copy that missed
/// an edit), and the window stays open while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suffix_instance_joining_a_closed_window_is_served_no_missed_edit() {
    let server = harness::shared_standalone();
    let http = reqwest::Client::new();
    let (family, key) = ("winr:", "winr:1");
    let spread = Service::start(config(&server.url(), family, 4, None)).await;
    harness::publish_succeeds(&http, &spread.base, key, 1, "v1").await;
    wait_window(&http, &spread.base, family, true).await;
    poll(
        "the K#i copies are deleted",
        Duration::from_secs(30),
        || async { !any_untagged(server, key, 4) },
    )
    .await;
    for version in 2..=4 {
        harness::publish_succeeds(&http, &spread.base, key, version, &format!("v{version}")).await;
    }
    // A K#1 re-created at version 1 after the sweep (a late retry-queue entry could do that).
    let exp = (hotsplit::store::now_unix_ms() + 600_000).to_string();
    server
        .node
        .cli(&[
            "HSET",
            &format!("{key}#1"),
            "ver",
            "1",
            "val",
            "v1",
            "tomb",
            "0",
            "exp",
            &exp,
        ])
        .expect("set K#1 back");
    // And a K#2 the refill cannot write (a corrupt record, no `tomb`): it is deleted instead,
    // and its reader falls back to copy 0.
    server
        .node
        .cli(&["HSET", &format!("{key}#2"), "ver", "1", "val", "v1"])
        .expect("set a corrupt K#2");
    let suffix = Service::start(config(&server.url(), family, 4, Some("suffix"))).await;
    let clients = client_per_copy(4);
    for client in &clients {
        let name = affinity(&http, &suffix.base, key, client).await["copy_key"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!name.ends_with('}'), "the suffix instance reads {name}");
        assert_eq!(
            served(&http, &suffix.base, key, client).await,
            4,
            "{client} of the suffix instance right after it started"
        );
    }
    assert_eq!(
        stored_version(server, &format!("{key}#1")),
        Some(4),
        "K#1 refilled"
    );
    assert_ne!(
        stored_version(server, &format!("{key}#2")),
        Some(1),
        "K#2 not served as stale"
    );
    wait_window(&http, &spread.base, family, false).await;
    for version in 5..=10 {
        let base = if version % 2 == 1 {
            &suffix.base
        } else {
            &spread.base
        };
        harness::publish_succeeds(&http, base, key, version, &format!("v{version}")).await;
        for client in &clients {
            for (name, base) in [("suffix", &suffix.base), ("spread", &spread.base)] {
                assert_eq!(
                    served(&http, base, key, client).await,
                    version,
                    "{client} of the {name} instance after version {version}"
                );
            }
        }
    }
    assert_eq!(
        gauge(
            &http,
            &spread.base,
            &format!("hotsplit_placement_window_closed{{family=\"{family}\"}} ")
        )
        .await,
        Some(0.0),
        "the window stays open while a suffix instance runs"
    );
    suffix.stop().await;
    spread.stop().await;
}

/// An explicit `placement = "suffix"` is honoured for a new family, and a family whose config
/// names none but which already has `K#i` copies keeps `suffix` (and says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_with_suffix_copies_keeps_suffix_and_a_configured_placement_is_honoured() {
    let server = harness::shared_standalone();
    let http = reqwest::Client::new();
    // An earlier deployment's copies of `kept:1`, under `K#i`.
    for index in 0..4 {
        server
            .node
            .cli(&["HSET", &format!("kept:1#{index}"), "ver", "1", "val", "old"])
            .expect("write an old copy");
    }
    let kept = Service::start(config(&server.url(), "kept:", 4, None)).await;
    let fleet = harness::get_json(&http, &format!("{}/v1/fleet", kept.base)).await;
    assert!(
        fleet.to_string().contains(
            "\"placement\":\"suffix\",\"placement_reason\":\"kept because suffix copies exist"
        ),
        "{fleet}"
    );
    kept.stop().await;
    let configured = Service::start(config_from_toml(&format!(
        "[store]\nredis = \"{}\"\n[[family]]\nprefix = \"chosen:\"\ncopies = 4\nplacement = \"suffix\"\n",
        server.url()
    )))
    .await;
    let name = affinity(&http, &configured.base, "chosen:1", "c1").await["copy_key"].clone();
    assert!(!name.as_str().unwrap().ends_with('}'), "{name}");
    configured.stop().await;
}

/// The instances the load of the rolling-change test uses, and what it saw.
#[derive(Default)]
struct Load {
    /// The base URLs requests go to (an instance is removed before it stops).
    bases: std::sync::Mutex<Vec<String>>,
    /// Per key, the highest version a publish was answered 200 for (every copy took it; a 202
    /// says a copy was queued, and until it heals an affine reader of that copy is served the
    /// version before, which is no missed edit of a reader that never saw the newer one).
    acked: [std::sync::atomic::AtomicU64; 4],
    /// Publishes answered 202 (a copy queued).
    queued: std::sync::atomic::AtomicU64,
    /// Reads answered.
    reads: std::sync::atomic::AtomicU64,
    /// Reads served a version below what had been acknowledged before they started.
    missed: std::sync::Mutex<Vec<String>>,
}

impl Load {
    /// One of the live bases, chosen by `n`.
    fn base(&self, n: u64) -> String {
        let bases = self.bases.lock().unwrap();
        bases[n as usize % bases.len()].clone()
    }

    fn set_bases(&self, bases: &[&str]) {
        *self.bases.lock().unwrap() = bases.iter().map(|base| (*base).to_owned()).collect();
    }

    /// Publishes ever newer versions of `roll34:0..4` until `stop`.
    async fn write(&self, http: &reqwest::Client, stop: &tokio_util::sync::CancellationToken) {
        use std::sync::atomic::Ordering;
        let mut version = 0u64;
        while !stop.is_cancelled() {
            version += 1;
            let key = (version % 4) as usize;
            let url = format!(
                "{}/v1/keys/roll34:{key}?version={version}",
                self.base(version)
            );
            let answered = http.put(url).body(format!("v{version}")).send().await;
            match answered.map(|answer| answer.status()) {
                Ok(reqwest::StatusCode::OK) => {
                    self.acked[key].fetch_max(version, Ordering::SeqCst);
                }
                Ok(reqwest::StatusCode::ACCEPTED) => {
                    self.queued.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Reads `roll34:0..4` as `reader` until `stop`; a read served below the version
    /// acknowledged before it started is recorded.
    async fn read(
        &self,
        http: &reqwest::Client,
        reader: u64,
        stop: &tokio_util::sync::CancellationToken,
    ) {
        use std::sync::atomic::Ordering;
        let mut n = reader;
        while !stop.is_cancelled() {
            n += 7;
            let key = (n % 4) as usize;
            let floor = self.acked[key].load(Ordering::SeqCst);
            let base = self.base(n / 4);
            let url = format!("{base}/v1/keys/roll34:{key}?client=r{reader}-{}", n % 16);
            let Ok(answer) = http.get(url).send().await else {
                continue;
            };
            if floor == 0 || !answer.status().is_success() {
                continue;
            }
            let served = harness::served_version(&answer);
            self.reads.fetch_add(1, Ordering::Relaxed);
            if served < floor {
                self.missed.lock().unwrap().push(format!(
                    "roll34:{key} from {base}: served {served}, acknowledged {floor}"
                ));
            }
        }
    }
}

/// A rolling change from `suffix` to `spread` under load (a writer and four readers through
/// whichever instances run): two `suffix` instances are replaced one at a time by `spread` ones,
/// the family's window closes once both read the tagged names, and no read is served a version
/// below one acknowledged before it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_change_from_suffix_to_spread_under_load_serves_no_missed_edit() {
    let server = harness::shared_standalone();
    let http = reqwest::Client::new();
    let url = server.url();
    let family = "roll34:";
    let suffix_a = Service::start(config(&url, family, 4, Some("suffix"))).await;
    let suffix_b = Service::start(config(&url, family, 4, Some("suffix"))).await;
    let load = std::sync::Arc::new(Load::default());
    load.set_bases(&[&suffix_a.base, &suffix_b.base]);
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (load, http, stop) = (load.clone(), http.clone(), stop.clone());
        tasks.spawn(async move { load.write(&http, &stop).await });
    }
    for reader in 0..4 {
        let (load, http, stop) = (load.clone(), http.clone(), stop.clone());
        tasks.spawn(async move { load.read(&http, reader, &stop).await });
    }
    let settle = Duration::from_millis(300);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One instance at a time: out of the load, stopped, replaced by a `spread` one.
    load.set_bases(&[&suffix_a.base]);
    tokio::time::sleep(settle).await;
    suffix_b.stop().await;
    let spread_b = Service::start(config(&url, family, 4, Some("spread"))).await;
    load.set_bases(&[&suffix_a.base, &spread_b.base]);
    poll(
        "the spread instance reads the tagged names",
        Duration::from_secs(30),
        || async {
            affinity(&http, &spread_b.base, "roll34:1", "c1").await["copy_key"]
                .as_str()
                .is_some_and(|name| name.ends_with('}'))
        },
    )
    .await;
    load.set_bases(&[&spread_b.base]);
    tokio::time::sleep(settle).await;
    suffix_a.stop().await;
    let spread_a = Service::start(config(&url, family, 4, Some("spread"))).await;
    load.set_bases(&[&spread_a.base, &spread_b.base]);
    wait_window(&http, &spread_a.base, family, true).await;
    wait_window(&http, &spread_b.base, family, true).await;
    poll(
        "the K#i copies are deleted",
        Duration::from_secs(30),
        || async { (0..4).all(|key| !any_untagged(server, &format!("roll34:{key}"), 4)) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    let reads = load.reads.load(std::sync::atomic::Ordering::Relaxed);
    let missed = load.missed.lock().unwrap().clone();
    println!(
        "rolling change under load: {reads} reads judged, {} served a missed edit, {} publishes queued a copy",
        missed.len(),
        load.queued.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(reads > 100, "only {reads} reads were judged");
    assert!(missed.is_empty(), "{missed:#?}");
    spread_a.stop().await;
    spread_b.stop().await;
}
