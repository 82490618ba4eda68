//! Copy placement on a real 3-master/3-replica cluster: how a key's reads spread over the
//! masters under `placement = "suffix"` and `"spread"` (measured black-box, from each master's
//! `INFO commandstats` `HMGET` count), and that the paths that name copies (the retry spool,
//! `audit`, the scrub) use the tagged names of a `spread` family.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use hotsplit_devcluster::Cluster;

use crate::harness::{self, affinity, config_from_toml, own_cluster, poll, Service};
use crate::route::{hmget_calls, NEAR_CACHE_OFF};

/// The ten key names whose reads are measured (the first three are the examples).
const NAMES: [&str; 10] = [
    "split16:share",
    "post:9",
    "split16:pub",
    "feed:home",
    "user:42:profile",
    "cfg:flags",
    "price:eur",
    "timeline:7",
    "banner",
    "hot:0",
];

/// Copies per key in the measured family.
const COPIES: u32 = 16;

/// Reads per copy of each key (every copy gets the same number of clients, so the measured
/// share is the placement's, not the client hash's sampling noise).
const CLIENTS_PER_COPY: usize = 8;

/// A service config on `url` whose default family has 16 copies named under `placement`, read
/// with the `primary` class, with the near cache and the scrub off (every read reaches Redis,
/// and only reads are counted).
fn config(url: &str, placement: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[default_family]\ncopies = {COPIES}\nttl = \"10m\"\nplacement = \"{placement}\"\n[heal]\nlayout_interval = \"200ms\"\n[scrub]\nenabled = false\n{NEAR_CACHE_OFF}",
        timeout = harness::command_timeout_toml()
    ))
}

/// Client ids chosen so that each copy of a 16-copy key is read by `CLIENTS_PER_COPY` of them.
fn clients() -> Vec<String> {
    let mut per_copy = vec![0usize; COPIES as usize];
    let mut chosen = Vec::new();
    let mut n = 0u64;
    while chosen.len() < COPIES as usize * CLIENTS_PER_COPY {
        let client = format!("reader-{n}");
        n += 1;
        let copy = hotsplit::affinity::copy_index(&client, COPIES) as usize;
        if per_copy[copy] < CLIENTS_PER_COPY {
            per_copy[copy] += 1;
            chosen.push(client);
        }
    }
    chosen
}

/// The `HMGET` count of every master of `cluster`.
fn master_reads(cluster: &Cluster) -> Vec<u64> {
    cluster
        .masters()
        .expect("the cluster's masters")
        .iter()
        .map(|master| hmget_calls(master.port()))
        .collect()
}

/// Publishes `version` of `key` through `base`, has every client of `clients` read it once with the
/// `primary` class, and returns the busiest master's share of the `HMGET`s the masters served
/// meanwhile.
async fn busiest_share(
    http: &reqwest::Client,
    cluster: &Cluster,
    base: &str,
    key: &str,
    version: u64,
    clients: &[String],
) -> f64 {
    harness::publish_succeeds(http, base, key, version, "v").await;
    let before = master_reads(cluster);
    let reads = stream::iter(clients)
        .map(|client| {
            let url = format!("{base}/v1/keys/{key}?client={client}");
            async move { harness::get(http, &url, &[]).await.status() }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(
        reads.iter().all(|status| status.is_success()),
        "every read of {key} answers 200"
    );
    let after = master_reads(cluster);
    let served: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: u64 = served.iter().sum();
    assert!(
        total >= clients.len() as u64,
        "{key}: the masters served {total} reads of {} sent",
        clients.len()
    );
    *served.iter().max().unwrap() as f64 / total as f64
}

/// Waits until `base` reads copy 1 of `key` under its tagged name (a `spread` family switches
/// its reads once the rolling-change settle time has passed).
async fn wait_reading_spread(http: &reqwest::Client, base: &str, key: &str) {
    let client = clients()
        .into_iter()
        .find(|client| hotsplit::affinity::copy_index(client, COPIES) == 1)
        .unwrap();
    poll(
        "the spread family reads its tagged copies",
        Duration::from_secs(30),
        || async {
            let answer = affinity(http, base, key, &client).await;
            answer["copy_key"]
                .as_str()
                .is_some_and(|name| name.ends_with('}'))
        },
    )
    .await;
}

/// The proof: with `placement = "spread"`, N = 16, the `primary` class and many clients
/// reading one key, the busiest master serves at most 0.40 of that key's reads, for ten key
/// names. The same names under `suffix` are measured first, for the figures (printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_copies_share_a_keys_reads_evenly_over_the_masters() {
    let cluster = own_cluster().await;
    let http = reqwest::Client::new();
    let clients = clients();
    let mut figures = Vec::new();
    for (version, placement) in [(1, "suffix"), (2, "spread")] {
        let service = Service::start(config(&cluster.url(), placement)).await;
        if placement == "spread" {
            wait_reading_spread(&http, &service.base, NAMES[0]).await;
        }
        for name in NAMES {
            let share =
                busiest_share(&http, &cluster, &service.base, name, version, &clients).await;
            figures.push((placement, name, share));
        }
        service.stop().await;
    }
    for (placement, name, share) in &figures {
        println!("busiest master's share of reads: {placement:>6} {name:<16} {share:.3}");
    }
    for (placement, name, share) in &figures {
        if *placement == "spread" {
            assert!(
                *share <= 0.40,
                "{name}: the busiest master served {share:.3} of the reads (want at most 0.40)"
            );
        }
    }
}
