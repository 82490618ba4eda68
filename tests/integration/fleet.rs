//! The fleet over real Redis: the instance registry (two instances see each other on a cluster,
//! heartbeats advance, an instance that stops leaves at once, an entry nobody refreshes lapses
//! and leaves the index) and the one-instance registry of the embedded store.

use std::time::Duration;

use hotsplit::store::library::LIBRARY_NAME;
use hotsplit::store::registry::{instance_key, INSTANCES_KEY};
use hotsplit::store::{now_unix_ms, FleetStore, InstanceRecord};
use hotsplit_devcluster as devcluster;
use serde_json::Value;

use crate::harness::{
    config_from_toml, get_json, owner_port, poll, redis_store, shared_cluster, Service,
};

/// A service on `redis` (`None`: the embedded store) refreshing its registry entry every
/// second. The entry lives three intervals: at 200 ms, a heartbeat delayed past 600 ms on a
/// loaded machine would drop a running instance from the list these tests read.
async fn start(redis: Option<&str>) -> Service {
    let store = redis.map_or_else(String::new, |url| format!("[store]\nredis = {url:?}\n"));
    Service::start(config_from_toml(&format!(
        "{store}[fleet]\nheartbeat_interval = \"1s\"\n"
    )))
    .await
}

/// `GET /v1/instances` of `service`: the answering id and the listed instances by id.
async fn instances(http: &reqwest::Client, service: &Service) -> (String, Vec<Value>) {
    let view = get_json(http, &format!("{}/v1/instances", service.base)).await;
    let this = view["this"].as_str().expect("this").to_owned();
    let listed = view["instances"].as_array().expect("instances").clone();
    (this, listed)
}

fn find<'a>(listed: &'a [Value], id: &str) -> Option<&'a Value> {
    listed.iter().find(|instance| instance["id"] == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_two_instances_on_a_cluster_see_each_other_and_a_stopped_one_leaves() {
    let cluster = shared_cluster();
    let url = cluster.url();
    let http = reqwest::Client::new();
    let a = start(Some(&url)).await;
    let b = start(Some(&url)).await;
    let (a_id, _) = instances(&http, &a).await;
    let (b_id, _) = instances(&http, &b).await;
    assert_ne!(a_id, b_id);

    // Each lists both, with the address it serves on, this release and its library.
    for service in [&a, &b] {
        let (_, listed) = instances(&http, service).await;
        for (id, base) in [(&a_id, &a.base), (&b_id, &b.base)] {
            let entry = find(&listed, id).unwrap_or_else(|| panic!("{id} listed: {listed:?}"));
            assert_eq!(entry["listen"], base.trim_start_matches("http://"));
            assert_eq!(entry["release"], env!("CARGO_PKG_VERSION"));
            assert_eq!(entry["library"], LIBRARY_NAME);
            assert!(entry["started_ms"].as_u64() <= entry["heartbeat_ms"].as_u64());
        }
    }

    // B's heartbeat advances while it runs.
    let (_, listed) = instances(&http, &a).await;
    let first = find(&listed, &b_id).expect("b listed")["heartbeat_ms"]
        .as_u64()
        .expect("heartbeat_ms");
    poll(
        "b's heartbeat advances",
        Duration::from_secs(10),
        || async {
            let (_, listed) = instances(&http, &a).await;
            find(&listed, &b_id)
                .and_then(|entry| entry["heartbeat_ms"].as_u64())
                .is_some_and(|heartbeat| heartbeat > first)
        },
    )
    .await;

    // B stops: its entry is removed at shutdown, not left to lapse.
    b.stop().await;
    let (_, listed) = instances(&http, &a).await;
    assert!(find(&listed, &b_id).is_none(), "{listed:?}");
    assert!(find(&listed, &a_id).is_some());
    let index_port = owner_port(cluster, INSTANCES_KEY);
    let score = devcluster::cli(index_port, &["ZSCORE", INSTANCES_KEY, &b_id]).expect("ZSCORE");
    assert_eq!(score, "", "b left the index");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_an_entry_nobody_refreshes_lapses_and_leaves_the_index() {
    let cluster = shared_cluster();
    let store = redis_store(&cluster.url(), Duration::from_secs(1)).await;
    let id = format!("lapse-{:08x}", rand::random::<u32>());
    let record = InstanceRecord {
        id: id.clone(),
        listen: "10.0.0.1:7070".to_owned(),
        admin: Some("10.0.0.1:7071".to_owned()),
        release: "0.0.1".to_owned(),
        library: Some("hotsplit".to_owned()),
        started_ms: now_unix_ms(),
        heartbeat_ms: now_unix_ms(),
    };
    store
        .register_instance(&record, 400)
        .await
        .expect("register");
    let listed = store.instances().await.expect("list");
    assert_eq!(listed.iter().find(|r| r.id == id), Some(&record));
    // The hash lives in the index's slot, with a time to live.
    let port = owner_port(cluster, INSTANCES_KEY);
    assert_eq!(port, owner_port(cluster, &instance_key(&id)));
    let ttl: i64 = devcluster::cli(port, &["PTTL", &instance_key(&id)])
        .expect("PTTL")
        .parse()
        .expect("a number");
    assert!((1..=400).contains(&ttl), "{ttl}");
    poll("the entry lapses", Duration::from_secs(10), || async {
        let listed = store.instances().await.expect("list");
        !listed.iter().any(|r| r.id == id)
    })
    .await;
    // Listing dropped the lapsed id from the index.
    let score = devcluster::cli(port, &["ZSCORE", INSTANCES_KEY, &id]).expect("ZSCORE");
    assert_eq!(score, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_on_the_embedded_store_lists_the_one_instance() {
    let http = reqwest::Client::new();
    let service = start(None).await;
    let (this, listed) = instances(&http, &service).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], this.as_str());
    assert_eq!(listed[0]["library"], Value::Null);
    assert_eq!(
        listed[0]["listen"],
        service.base.trim_start_matches("http://")
    );
    service.stop().await;
}
