//! Starting with what is there: a master that refuses the function library (`NOREPLICAS`)
//! does not stop startup, its copies queue and heal once it accepts the library; a paused seed
//! among several costs one connect timeout, not the startup.

use std::time::Duration;

use hotsplit_devcluster as devcluster;
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{
    self, config_with_family, copy_on_owner, get_json, owner_port, poll, Service,
};
use crate::heal::{retry_queue, wait_drained};

/// The `library_missing` list of `/readyz` (empty when the field is absent).
async fn library_missing(http: &reqwest::Client, base: &str) -> Vec<String> {
    let body = get_json(http, &format!("{base}/readyz")).await;
    body["library_missing"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|node| node.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_a_master_refusing_the_library_starts_queues_its_copies_and_heals() {
    let cluster = tokio::task::spawn_blocking(harness::own_cluster)
        .await
        .unwrap();
    // The victim owns some copies of deg:1 but no family's layout record: startup writes those
    // records, and this test is about the library, not the layout.
    let layout_owners = [
        owner_port(&cluster, "#hotsplit#layout#deg:"),
        owner_port(&cluster, "#hotsplit#layout#alloc:"),
        owner_port(&cluster, "#hotsplit#layout#default"),
    ];
    let victim = (0..16)
        .map(|copy| owner_port(&cluster, &format!("deg:1#{copy}")))
        .find(|port| !layout_owners.contains(port))
        .expect("a master owns copies of deg:1 and no layout record");
    // Every write on the victim, FUNCTION LOAD included, now fails with NOREPLICAS.
    devcluster::cli(victim, &["CONFIG", "SET", "min-replicas-to-write", "5"]).expect("config set");

    let service = Service::start(config_with_family(Some(&cluster.url()), "deg:", 16)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    assert_eq!(
        library_missing(&http, base).await,
        vec![format!("127.0.0.1:{victim}")]
    );

    let answer = http
        .put(format!("{base}/v1/keys/deg:1?version=1"))
        .body("one")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let body: Value = answer.json().await.unwrap();
    let mut queued = 0;
    for line in body["outcomes"].as_array().unwrap() {
        let copy_key = line["copy_key"].as_str().unwrap();
        let on_victim = owner_port(&cluster, copy_key) == victim;
        let expected = if on_victim { "queued" } else { "applied" };
        assert_eq!(line["outcome"], expected, "{copy_key}: {line}");
        queued += u64::from(on_victim);
    }
    assert!(queued > 0, "{body}");
    let view = retry_queue(&http, base).await;
    assert_eq!(view["depth"].as_u64(), Some(queued), "{view}");

    // The victim accepts writes again: the background retry loads the library there, and the
    // queued copies heal.
    devcluster::cli(victim, &["CONFIG", "SET", "min-replicas-to-write", "0"]).expect("config set");
    wait_drained(&http, base).await;
    for copy in 0..16 {
        let copy_key = format!("deg:1#{copy}");
        let fields = copy_on_owner(&cluster, &copy_key);
        assert_eq!(
            fields.get("ver").map(String::as_str),
            Some("1"),
            "{copy_key}: {fields:?}"
        );
    }
    poll(
        "readyz lists no primary without the library",
        Duration::from_secs(10),
        || async { library_missing(&http, base).await.is_empty() },
    )
    .await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_a_paused_seed_among_several_does_not_stop_startup() {
    let cluster = tokio::task::spawn_blocking(harness::own_cluster)
        .await
        .unwrap();
    let replica = cluster.replicas().expect("replicas")[0].port();
    let masters: Vec<u16> = cluster
        .masters()
        .expect("masters")
        .iter()
        .map(|node| node.port())
        .collect();
    cluster
        .node(replica)
        .expect("node")
        .pause()
        .expect("SIGSTOP");
    // fred tries seeds in (host, port) order: `127.0.0.1` sorts before `localhost`, so the
    // paused seed is the first one tried and costs one connect timeout.
    let mut seeds = vec![format!("127.0.0.1:{replica}")];
    seeds.extend(masters.iter().map(|port| format!("localhost:{port}")));
    let url = format!("redis-cluster://{}", seeds.join(","));
    let mut config = config_with_family(Some(&url), "seed:", 4);
    config.store.connect_timeout = Duration::from_millis(1500);

    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let answer = http
        .put(format!("{}/v1/keys/seed:1?version=1", service.base))
        .body("one")
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status(),
        StatusCode::OK,
        "{}",
        answer.text().await.unwrap_or_default()
    );
    cluster
        .node(replica)
        .expect("node")
        .resume()
        .expect("SIGCONT");
    service.stop().await;
}
