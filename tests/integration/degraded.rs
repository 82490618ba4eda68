//! Starting with what is there: a master that refuses the function library (`NOREPLICAS`)
//! does not stop startup, its copies queue and heal once it accepts the library; a paused seed
//! among several costs one connect timeout, not the startup. A stopped master is failed fast
//! around: its copies queue at once (`node_failing`), its reads go to siblings, and no reader
//! goes back in time across the outage and the recovery. A stopped standalone primary is probed
//! and failed fast around the same way.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotsplit::store::{NodeLabel, TopologyStore};
use hotsplit_devcluster as devcluster;
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{
    self, affinity, config_with_family, copy_on_owner, get, get_json, owner_port, poll,
    publish_expecting, Edit, Service,
};
use crate::heal::{queued_exactly_on, retry_queue, wait_drained};

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
    let cluster = harness::own_cluster().await;
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
    let queued = queued_exactly_on(&cluster, victim, &body, "a master refusing the library");
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
    let cluster = harness::own_cluster().await;
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

/// The nodes `/readyz` lists as failing or recovering (empty when the field is absent).
pub(crate) async fn nodes_avoided(http: &reqwest::Client, base: &str) -> Vec<String> {
    let body = get_json(http, &format!("{base}/readyz")).await;
    body["nodes_avoided"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|node| node.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Resumes the stopped master `victim` and waits until it takes reads back (its queued copies
/// are flushed) and the retry queue is empty.
async fn resume_and_recover(
    cluster: &devcluster::Cluster,
    victim: u16,
    http: &reqwest::Client,
    base: &str,
) {
    cluster
        .node(victim)
        .expect("node")
        .resume()
        .expect("SIGCONT");
    poll(
        "the victim takes reads back once its queued copies are flushed",
        Duration::from_secs(30),
        || async { nodes_avoided(http, base).await.is_empty() },
    )
    .await;
    wait_drained(http, base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sick_a_stopped_master_fails_fast_and_no_reader_goes_back_in_time() {
    // A long node timeout: the paused master is never replaced during the test, so its copies
    // come back on the same node.
    let cluster = harness::own_cluster_without_failover().await;
    let mut config = config_with_family(Some(&cluster.url()), "sick:", 16);
    config.store.command_timeout = Duration::from_millis(1000);
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_expecting(&http, &base, Edit::new("sick:1", 1, "v1"), StatusCode::OK).await;
    let victim = owner_port(&cluster, "sick:1#0");
    let victim_label = format!("127.0.0.1:{victim}");

    // Readers: eight client ids, half of them carrying the highest version they saw as a floor.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..8)
        .map(|reader| {
            tokio::spawn(read_sick_key(
                reader,
                base.clone(),
                stop.clone(),
                reads.clone(),
            ))
        })
        .collect();

    cluster
        .node(victim)
        .expect("node")
        .pause()
        .expect("SIGSTOP");
    // The first publish waits for the command timeout on the victim, which marks it failing;
    // from then on its copies are queued at once with the error `node_failing`.
    let mut version = 1;
    let mut fast = None;
    for _ in 0..20 {
        version += 1;
        let answer = publish_expecting(
            &http,
            &base,
            Edit::new("sick:1", version, "v"),
            StatusCode::ACCEPTED,
        )
        .await;
        let body: Value = answer.json().await.unwrap();
        let victim_lines: Vec<&Value> = body["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|line| line["node"] == victim_label.as_str())
            .collect();
        assert!(!victim_lines.is_empty(), "{body}");
        for line in &victim_lines {
            assert_eq!(line["outcome"], "queued", "{line}");
        }
        if victim_lines
            .iter()
            .all(|line| line["error"] == "node_failing")
        {
            fast = Some(body);
            break;
        }
    }
    let fast = fast.expect("a publish reports the victim's copies queued with node_failing");
    assert_eq!(fast["dropped"].as_u64(), Some(0), "{fast}");
    assert_eq!(
        nodes_avoided(&http, &base).await,
        vec![victim_label.clone()]
    );

    // A read whose affine copy is on the victim is served by a sibling at the newest version.
    assert_a_sibling_serves_the_victims_readers(&http, &base, &victim_label, version).await;

    resume_and_recover(&cluster, victim, &http, &base).await;
    // Readers keep reading after the recovery, through the victim again.
    let after = reads.load(Ordering::Relaxed);
    poll(
        "readers read after the recovery",
        Duration::from_secs(10),
        || {
            let reads = reads.clone();
            async move { reads.load(Ordering::Relaxed) > after + 50 }
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.expect("no reader went back in time");
    }
    for copy in 0..16 {
        let copy_key = format!("sick:1#{copy}");
        let fields = copy_on_owner(&cluster, &copy_key);
        assert_eq!(
            fields.get("ver").map(String::as_str),
            Some(version.to_string().as_str()),
            "{copy_key}: {fields:?}"
        );
    }
    service.stop().await;
}

/// Reader `reader` of `sick:1` through `base`: even readers carry the highest version they saw
/// as a floor; each read must not go back in time; counts reads in `reads` until `stop`.
async fn read_sick_key(reader: i32, base: String, stop: Arc<AtomicBool>, reads: Arc<AtomicUsize>) {
    let http = reqwest::Client::new();
    let mut seen = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut request = http.get(format!("{base}/v1/keys/sick:1?client=reader-{reader}"));
        if reader % 2 == 0 && seen > 0 {
            request = request.header("hotsplit-min-version", seen.to_string());
        }
        if let Ok(answer) = request.send().await {
            harness::record_monotonic_read(&format!("reader-{reader}"), &answer, &mut seen, &reads);
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // Pacing, not a wait.
    }
}

/// Every client whose affine copy of `sick:1` is on the victim (`victim_label`) is served by a
/// sibling at `version`.
async fn assert_a_sibling_serves_the_victims_readers(
    http: &reqwest::Client,
    base: &str,
    victim_label: &str,
    version: u64,
) {
    let mut checked = 0;
    for client in 0..64 {
        let client = format!("probe-{client}");
        let route = affinity(http, base, "sick:1", &client).await;
        if route["node"] != victim_label {
            continue;
        }
        let answer = get(http, &format!("{base}/v1/keys/sick:1?client={client}"), &[]).await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(harness::served_version(&answer), version, "{client}");
        let served_by = answer.headers()["hotsplit-served-by"].to_str().unwrap();
        assert!(
            !served_by.starts_with(victim_label),
            "{client}: {served_by}"
        );
        checked += 1;
    }
    assert!(checked > 0, "some client reads a copy on the victim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sick_an_allocation_whose_counter_is_on_a_stopped_master_answers_503_at_once() {
    let cluster = harness::own_cluster_without_failover().await;
    let mut config = config_with_family(Some(&cluster.url()), "sick:", 16);
    // A command on the stopped master would wait 30 s: only the health probes can mark it
    // failing within this test's few-second bounds.
    config.store.command_timeout = Duration::from_secs(30);
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    // `alloc:` is an allocated family (harness): `alloc:K`'s counter is the key `alloc:K#v`.
    let victim = owner_port(&cluster, "alloc:0#v");
    let victim_label = format!("127.0.0.1:{victim}");
    let elsewhere = (1..64)
        .map(|k| format!("alloc:{k}"))
        .find(|key| owner_port(&cluster, &format!("{key}#v")) != victim)
        .expect("a counter on another master");
    let put = |key: &str, body: &'static str| {
        let request = http.put(format!("{base}/v1/keys/{key}")).body(body).send();
        // Far below the command timeout: an answer that waited on the stopped master fails here.
        tokio::time::timeout(Duration::from_secs(5), request)
    };
    let first = put("alloc:0", "one").await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);

    cluster
        .node(victim)
        .expect("node")
        .pause()
        .expect("SIGSTOP");
    // Until it is marked, /readyz's own PING of the stopped master would wait out the command
    // timeout too: each look is cut short (once it is marked, /readyz pings only the others).
    poll(
        "the stopped master misses its health probes and is marked failing",
        Duration::from_secs(20),
        || async {
            let avoided = tokio::time::timeout(Duration::from_secs(2), nodes_avoided(&http, &base));
            avoided.await.ok() == Some(vec![victim_label.clone()])
        },
    )
    .await;

    // The allocation is not sent to the stopped master: 503 unavailable at once.
    let refused = put("alloc:0", "two")
        .await
        .expect("the allocation answers without waiting out the command timeout")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert!(refused.headers().contains_key("retry-after"));
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "unavailable", "{problem}");

    // A counter on a healthy master allocates; any copy on the stopped one is queued at once.
    let answer = put(&elsewhere, "three")
        .await
        .expect("a publish around the stopped master answers at once")
        .unwrap();
    assert!(
        matches!(answer.status(), StatusCode::OK | StatusCode::ACCEPTED),
        "{}",
        answer.status()
    );
    let report: Value = answer.json().await.unwrap();
    for line in report["outcomes"].as_array().unwrap() {
        if line["node"] == victim_label.as_str() {
            assert_eq!(line["outcome"], "queued", "{line}");
            assert_eq!(line["error"], "node_failing", "{line}");
        }
    }

    resume_and_recover(&cluster, victim, &http, &base).await;
    let again = put("alloc:0", "four").await.unwrap().unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        harness::served_version(&again),
        2,
        "the counter continues after the outage"
    );
    service.stop().await;
}

/// A standalone primary without replicas is probed like a cluster's masters: stopped, it is
/// marked failing after its missed probes although no command waits out the 30 s command
/// timeout; a publish then queues every copy at once (`node_failing`), an allocation and a
/// read answer 503 at once, and after SIGCONT the queued copies heal and it takes reads back.
/// Fails if the prober skips a lone primary (nothing marks it within the test's bounds), or if
/// the lone primary's probe rounds never count (no other primary answers beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sick_a_stopped_standalone_primary_is_probed_and_failed_fast_around() {
    let server = tokio::task::spawn_blocking(|| devcluster::Standalone::start().unwrap())
        .await
        .unwrap();
    let port = server.node.port();
    let mut config = config_with_family(Some(&server.url()), "lone:", 4);
    config.store.command_timeout = Duration::from_secs(30);
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_expecting(&http, &base, Edit::new("lone:1", 1, "one"), StatusCode::OK).await;

    server.node.pause().expect("SIGSTOP");
    // Until it is marked, /readyz's own PING of the stopped server waits out the command
    // timeout (each look is cut short); once it is marked, with no other primary to ping,
    // /readyz answers 503 at once.
    poll(
        "the stopped standalone primary misses its probes and is marked failing",
        Duration::from_secs(20),
        || async {
            let url = format!("{base}/readyz");
            let answer = tokio::time::timeout(Duration::from_secs(2), get(&http, &url, &[])).await;
            answer.is_ok_and(|answer| answer.status() == StatusCode::SERVICE_UNAVAILABLE)
        },
    )
    .await;

    // Far below the command timeout: an answer that waited on the stopped server fails here.
    let at_once = Duration::from_secs(5);
    let put = |path: &str, body: &'static str| {
        let request = http.put(format!("{base}/v1/keys/{path}")).body(body).send();
        tokio::time::timeout(at_once, request)
    };
    let answer = put("lone:1?version=2", "two")
        .await
        .expect("a publish answers without waiting out the command timeout")
        .unwrap();
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let report: Value = answer.json().await.unwrap();
    let lines = report["outcomes"].as_array().unwrap();
    assert_eq!(lines.len(), 4, "{report}");
    for line in lines {
        assert_eq!(line["outcome"], "queued", "{line}");
        assert_eq!(line["error"], "node_failing", "{line}");
    }
    let refused = put("alloc:0", "one")
        .await
        .expect("an allocation answers without waiting out the command timeout")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let read = tokio::time::timeout(
        at_once,
        get(&http, &format!("{base}/v1/keys/lone:1?client=t"), &[]),
    )
    .await
    .expect("a read answers without waiting out the command timeout");
    assert_eq!(read.status(), StatusCode::SERVICE_UNAVAILABLE);

    server.node.resume().expect("SIGCONT");
    // While every primary is failing /readyz is a 503 without `nodes_avoided`: ready again
    // with none avoided means the server answered the probes and its queue was flushed.
    poll(
        "the server takes reads back once its queued copies are flushed",
        Duration::from_secs(30),
        || async {
            let ready = get(&http, &format!("{base}/readyz"), &[]).await;
            ready.status() == StatusCode::OK
                && ready.json::<Value>().await.unwrap()["nodes_avoided"].is_null()
        },
    )
    .await;
    wait_drained(&http, &base).await;
    for copy in 0..4 {
        assert_eq!(
            crate::heal::stored_version(port, &format!("lone:1#{copy}")),
            2,
            "copy {copy}"
        );
    }
    let read = get(&http, &format!("{base}/v1/keys/lone:1?client=t"), &[]).await;
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(harness::served_version(&read), 2);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_a_master_stopped_right_after_connect_leaves_the_others_probed() {
    // The node probes and `/readyz`'s pings go through the lag monitor's own client. When it
    // was connected on first use, a master stopped before that first use failed the whole
    // connection (the stopped node never answers the handshake), and with it every ping of the
    // healthy primaries while the master stayed stopped: `/readyz` answered 503 around a
    // failing node it is meant to serve around. `connect` now connects it while every primary
    // answers.
    let cluster = harness::own_cluster_without_failover().await;
    let store = harness::redis_store(&cluster.url(), harness::COMMAND_TIMEOUT).await;
    let masters: Vec<u16> = cluster
        .masters()
        .expect("masters")
        .iter()
        .map(|node| node.port())
        .collect();
    let (victim, healthy) = masters.split_first().expect("three masters");
    cluster
        .node(*victim)
        .expect("node")
        .pause()
        .expect("SIGSTOP");
    for port in healthy {
        let node = NodeLabel::new(format!("127.0.0.1:{port}"));
        let answer = store.ping_node(&node, Duration::from_secs(1)).await;
        assert!(answer.is_ok(), "{node}: {answer:?}");
    }
    let stopped = NodeLabel::new(format!("127.0.0.1:{victim}"));
    assert!(store
        .ping_node(&stopped, Duration::from_millis(200))
        .await
        .is_err());
    cluster
        .node(*victim)
        .expect("node")
        .resume()
        .expect("SIGCONT");
}
