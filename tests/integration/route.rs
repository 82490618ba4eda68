//! Read classes over real replicas: replica reads, the lag gate, decision reads, own writes and
//! request pins. Each test that injects a fault starts Redis of its own. Where a test asserts
//! which node served, it also reads the evidence from Redis: data reads are `HMGET`, heartbeat
//! reads are `GET`, so `INFO commandstats` on a replica tells them apart.

use std::time::Duration;

use hotsplit::config::Config;
use hotsplit::devcluster::{self, key_slot, Cluster, ClusterOptions, PrimaryReplica};
use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::harness::{poll, Service};

/// How many `HMGET`s `port` has served.
fn hmget_calls(port: u16) -> u64 {
    let stats = devcluster::cli(port, &["INFO", "commandstats"]).expect("INFO commandstats");
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_hmget:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

fn header(response: &Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// `(status, body, Hotsplit-Served-By, Hotsplit-Route)` of a GET.
async fn get(
    http: &reqwest::Client,
    url: String,
    headers: &[(&str, &str)],
) -> (StatusCode, String, String, String) {
    let mut request = http.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("GET");
    let served_by = header(&response, "hotsplit-served-by");
    let route = header(&response, "hotsplit-route");
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    (status, body, served_by, route)
}

async fn put(
    http: &reqwest::Client,
    url: String,
    body: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut request = http.put(url).body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("PUT")
}

/// The current lag of `replica` in `/v1/lag`, if reported.
async fn lag_now(http: &reqwest::Client, base: &str, replica: &str) -> Option<f64> {
    let lines: Value = http
        .get(format!("{base}/v1/lag"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    lines
        .as_array()?
        .iter()
        .find(|line| line["replica"] == replica)?["lag_ms"]["now"]
        .as_f64()
}

const CLASSES: &str = r#"
[classes.strict]
route = "replica"
reason = "test class that fails over budget"
staleness_budget = "250ms"
on_breach = "fail"

[classes.lenient]
route = "replica"
reason = "test class with a long budget"
staleness_budget = "30s"
"#;

fn standalone_config(group: &PrimaryReplica, extra: &str) -> Config {
    let text = format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"300ms\"\n\n[[family]]\nprefix = \"adv:\"\ncopies = 4\ndefault_class = \"advisory\"\n\n[[family]]\nprefix = \"own:\"\ncopies = 4\ndefault_class = \"lenient\"\npin_window = \"700ms\"\n{CLASSES}\n{extra}",
        group.url(),
        group.replicas[0].url()
    );
    let mut config = Config::from_toml(&text).expect("config parses");
    // Every service gets a spool of its own: the retry spool is locked by one process.
    config.heal.spool_dir = crate::harness::spool_dir();
    config.validate().expect("config is valid");
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_disallowed_classes_are_refused_and_classes_are_listed() {
    let config = Config::from_toml(
        "[[family]]\nprefix = \"s:\"\ncopies = 4\ndefault_class = \"advisory\"\n[default_family]\ndefault_class = \"decides-on-presence\"",
    )
    .unwrap();
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    assert_eq!(
        put(&http, format!("{base}/v1/keys/s:1?version=1"), "x", &[])
            .await
            .status(),
        StatusCode::OK
    );
    let response = http
        .get(format!("{base}/v1/keys/s:1?client=a&class=nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "unknown_class");
    let response = http
        .get(format!("{base}/v1/keys/s:1?client=a"))
        .header("hotsplit-read-class", "decides-on-presence")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "class_not_allowed");
    // The embedded store has no replicas: advisory reads are served by the primary.
    let (status, _, served_by, route) =
        get(&http, format!("{base}/v1/keys/s:1?client=a"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served_by, "embedded");
    assert_eq!(route, "class=advisory;reason=no-replica");

    let classes: Value = http
        .get(format!("{base}/v1/classes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let find = |name: &str| {
        classes
            .as_array()
            .unwrap()
            .iter()
            .find(|class| class["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(find("advisory")["families"], serde_json::json!(["s:"]));
    assert_eq!(find("advisory")["staleness_budget_ms"], 250);
    assert_eq!(
        find("decides-on-presence")["families"],
        serde_json::json!(["default"])
    );
    assert!(
        find("decides-on-presence")["reason"]
            .as_str()
            .unwrap()
            .len()
            > 10
    );
    let routing: Value = http
        .get(format!("{base}/v1/routing"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let advisory = routing
        .as_array()
        .unwrap()
        .iter()
        .find(|line| line["class"] == "advisory")
        .unwrap();
    assert_eq!(advisory["primary_by_reason"]["no-replica"], 1);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_standalone_replica_breaches_the_budget_and_recovers() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let replica_label = replica.addr();
    let service = Service::start(standalone_config(&group, "")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    assert_eq!(
        put(&http, format!("{base}/v1/keys/adv:1?version=1"), "one", &[])
            .await
            .status(),
        StatusCode::OK
    );
    // Once the replica has the value and its lag is known, advisory reads are the replica's.
    poll(
        "an advisory read served by the replica",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (status, body, served_by, route) =
                    get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
                status == StatusCode::OK
                    && body == "one"
                    && served_by.ends_with("role=replica")
                    && route == "class=advisory;reason=class"
            }
        },
    )
    .await;
    let before = hmget_calls(replica.port());
    let (_, _, served_by, _) = get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
    assert_eq!(served_by, format!("{replica_label};role=replica"));
    assert_eq!(
        hmget_calls(replica.port()),
        before + 1,
        "the replica served the data read"
    );

    // Hold back replication: the replica still answers, its lag rises past every budget.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    poll(
        "the replica's lag passes 250 ms",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            let replica_label = replica_label.clone();
            async move {
                lag_now(&http, &base, &replica_label)
                    .await
                    .is_some_and(|lag| lag > 300.0)
            }
        },
    )
    .await;
    let before = hmget_calls(replica.port());
    let (status, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "one"));
    assert_eq!(served_by, format!("{};role=primary", group.primary.addr()));
    assert_eq!(route, "class=advisory;reason=lag-breach");
    let response = http
        .get(format!("{base}/v1/keys/adv:1?client=a&class=strict"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().get("retry-after").is_some());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "staleness_budget_exceeded");
    assert_eq!(
        hmget_calls(replica.port()),
        before,
        "no data read reached the lagging replica"
    );
    let lag: Value = http
        .get(format!("{base}/v1/lag"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(lag[0]["within_budget"]["advisory"], false);
    assert_eq!(lag[0]["within_budget"]["lenient"], true);
    assert!(lag[0]["offset_gap_bytes"].is_u64(), "{lag}");

    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    poll(
        "advisory reads return to the replica",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (_, _, served_by, route) =
                    get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
                served_by.ends_with("role=replica") && route == "class=advisory;reason=class"
            }
        },
    )
    .await;
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let breaches: u64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(r#"hotsplit_route_reads_total{class="advisory",served_by="primary",reason="lag-breach"} "#)
        })
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(breaches >= 1, "{metrics}");
    assert!(
        metrics.contains("hotsplit_replica_lag_milliseconds{"),
        "{metrics}"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_and_request_pins_read_through_a_paused_replica() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let service = Service::start(standalone_config(&group, "")).await;
    let other = Service::start(standalone_config(&group, "")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    for key in ["own:1", "own:other"] {
        assert_eq!(
            put(&http, format!("{base}/v1/keys/{key}?version=1"), "one", &[])
                .await
                .status(),
            StatusCode::OK
        );
    }
    for instance in [&service.base, &other.base] {
        poll(
            "the replica serves version 1",
            Duration::from_secs(10),
            || {
                let http = http.clone();
                let url = format!("{instance}/v1/keys/own:1?client=bob");
                async move {
                    let (_, body, served_by, _) = get(&http, url, &[]).await;
                    body == "one" && served_by.ends_with("role=replica")
                }
            },
        )
        .await;
    }

    // sync_replicas: WAIT on the written node, through a dedicated connection.
    let acked = |report: &Value| -> Vec<u64> {
        report["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|line| line["replicas_acked"].as_u64().unwrap_or(u64::MAX))
            .collect()
    };
    let synced = put(
        &http,
        format!("{base}/v1/keys/own:sync?version=1&sync_replicas=1&sync_timeout_ms=2000"),
        "s",
        &[],
    )
    .await;
    assert_eq!(synced.status(), StatusCode::OK);
    let report: Value = synced.json().await.unwrap();
    assert_eq!(acked(&report), vec![1, 1, 1, 1], "{report}");
    for query in [
        "sync_replicas=2&sync_timeout_ms=100",
        "sync_replicas=0&sync_timeout_ms=100",
        "sync_replicas=1&sync_timeout_ms=0",
        "sync_replicas=1&sync_timeout_ms=5001",
        "sync_replicas=1",
        "sync_replicas=x&sync_timeout_ms=100",
    ] {
        let refused = put(
            &http,
            format!("{base}/v1/keys/own:sync?version=9&{query}"),
            "s",
            &[],
        )
        .await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "invalid_parameter", "{query}");
    }

    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    // A paused replica does not acknowledge: WAIT times out with 0.
    let synced = put(
        &http,
        format!("{base}/v1/keys/own:sync?version=2&sync_replicas=1&sync_timeout_ms=100"),
        "s",
        &[],
    )
    .await;
    assert_eq!(synced.status(), StatusCode::OK);
    let report: Value = synced.json().await.unwrap();
    assert_eq!(acked(&report), vec![0, 0, 0, 0], "{report}");
    let written = put(
        &http,
        format!("{base}/v1/keys/own:1?version=2&client=alice"),
        "two",
        &[("hotsplit-request", "req-1")],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    assert_eq!(header(&written, "hotsplit-version"), "2");

    // The writer reads its own write at once, from the primary; the replica is still behind.
    let (status, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/own:1?client=alice"), &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "two"));
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    assert_eq!(route, "class=lenient;reason=own-write");
    // Another client in the same window is served by the replica (the old value).
    let before = hmget_calls(replica.port());
    let (_, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/own:1?client=bob"), &[]).await;
    assert_eq!(body, "one");
    assert!(served_by.ends_with("role=replica"), "{served_by}");
    assert_eq!(route, "class=lenient;reason=class");
    assert_eq!(hmget_calls(replica.port()), before + 1);
    // The request that wrote pins its reads of any key to primaries; other requests are not.
    let (_, _, served_by, route) = get(
        &http,
        format!("{base}/v1/keys/own:other?client=carol"),
        &[("hotsplit-request", "req-1")],
    )
    .await;
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    assert_eq!(route, "class=lenient;reason=request-pin");
    let (_, _, served_by, _) = get(
        &http,
        format!("{base}/v1/keys/own:1?client=carol"),
        &[("hotsplit-request", "req-2")],
    )
    .await;
    assert!(served_by.ends_with("role=replica"), "{served_by}");
    // A client that sends its floor back gets the new version through another instance.
    let (status, body, served_by, route) = get(
        &http,
        format!("{}/v1/keys/own:1?client=alice&min_version=2", other.base),
        &[],
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "two"));
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    assert_eq!(route, "class=lenient;reason=version-floor");
    // After the pin window (700 ms) the writer reads the replica again.
    poll(
        "the writer reads the replica again",
        Duration::from_secs(5),
        || {
            let http = http.clone();
            let url = format!("{base}/v1/keys/own:1?client=alice");
            async move {
                let (_, body, served_by, _) = get(&http, url, &[]).await;
                body == "one" && served_by.ends_with("role=replica")
            }
        },
    )
    .await;
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    service.stop().await;
    other.stop().await;
}

/// The port of the master that owns `key`, and of its replica.
fn owner_and_replica(cluster: &Cluster, key: &str) -> (u16, u16) {
    let master = cluster
        .master_for_slot(key_slot(key.as_bytes()))
        .expect("topology")
        .expect("slot owner");
    let replicas = cluster.replicas_of(&master.id).expect("replicas");
    (master.port, replicas[0].port)
}

fn cluster_config(cluster: &Cluster) -> Config {
    let text = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"300ms\"\n\n[[family]]\nprefix = \"adv:\"\ncopies = 6\ndefault_class = \"advisory\"\n\n[[family]]\nprefix = \"claim:\"\ncopies = 1\ndefault_class = \"decides-on-presence\"\n",
        cluster.url()
    );
    let mut config = Config::from_toml(&text).expect("config parses");
    // Every service gets a spool of its own: the retry spool is locked by one process.
    config.heal.spool_dir = crate::harness::spool_dir();
    config.validate().expect("config is valid");
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replicas_serve_advisory_reads_never_decisions_and_a_stopped_replica_is_skipped() {
    let cluster = Cluster::start(ClusterOptions::default()).expect("cluster");
    let service = Service::start(cluster_config(&cluster)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let replica_ports: Vec<u16> = cluster
        .replicas()
        .expect("replicas")
        .iter()
        .map(|node| node.port())
        .collect();
    let total_hmget = || {
        replica_ports
            .iter()
            .map(|port| hmget_calls(*port))
            .sum::<u64>()
    };

    // Decision reads never touch a replica, even with every replica healthy.
    assert_eq!(
        put(
            &http,
            format!("{base}/v1/keys/claim:1?version=1"),
            "held",
            &[]
        )
        .await
        .status(),
        StatusCode::OK
    );
    poll(
        "every replica's lag is known",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let lines: Value = match http.get(format!("{base}/v1/lag")).send().await {
                    Ok(response) => response.json().await.unwrap_or_default(),
                    Err(_) => return false,
                };
                lines.as_array().is_some_and(|lines| {
                    lines.len() == 3
                        && lines
                            .iter()
                            .all(|line| line["within_budget"]["advisory"] == true)
                })
            }
        },
    )
    .await;
    let before = total_hmget();
    for _ in 0..20 {
        let (status, body, served_by, route) =
            get(&http, format!("{base}/v1/keys/claim:1?client=a"), &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "held"));
        assert!(served_by.ends_with("role=primary"), "{served_by}");
        assert_eq!(route, "class=decides-on-presence;reason=class");
    }
    assert_eq!(total_hmget(), before, "no decision read reached a replica");

    // Advisory reads of a split key are served by the replica of the copy's owner.
    assert_eq!(
        put(&http, format!("{base}/v1/keys/adv:1?version=1"), "one", &[])
            .await
            .status(),
        StatusCode::OK
    );
    let affinity: Value = http
        .get(format!("{base}/v1/affinity?key=adv:1&client=a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let copy_key = affinity["copy_key"].as_str().unwrap().to_owned();
    let (_, replica_port) = owner_and_replica(&cluster, &copy_key);
    poll(
        "the advisory read is served by the owner's replica",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (_, body, served_by, _) =
                    get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
                body == "one" && served_by == format!("127.0.0.1:{replica_port};role=replica")
            }
        },
    )
    .await;
    let before = hmget_calls(replica_port);
    get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
    assert_eq!(
        hmget_calls(replica_port),
        before + 1,
        "the owner's replica served it"
    );

    // sync_replicas in Cluster mode: each copy's owner WAITs for its one replica.
    let synced = put(
        &http,
        format!("{base}/v1/keys/adv:sync?version=1&sync_replicas=1&sync_timeout_ms=2000"),
        "s",
        &[],
    )
    .await;
    assert_eq!(synced.status(), StatusCode::OK);
    let report: Value = synced.json().await.unwrap();
    for line in report["outcomes"].as_array().unwrap() {
        assert_eq!(line["replicas_acked"], 1, "{report}");
    }

    // SIGSTOP the replica: its lag rises, and reads of copies it serves go to the primary.
    let replica = cluster.node(replica_port).expect("replica node");
    replica.pause().expect("SIGSTOP");
    let label = format!("127.0.0.1:{replica_port}");
    poll(
        "the stopped replica's lag passes the budget",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            let label = label.clone();
            async move {
                lag_now(&http, &base, &label)
                    .await
                    .is_some_and(|lag| lag > 300.0)
            }
        },
    )
    .await;
    let (status, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "one"));
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    assert_eq!(route, "class=advisory;reason=lag-breach");
    replica.resume().expect("SIGCONT");
    poll(
        "reads return to the resumed replica",
        Duration::from_secs(15),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (_, _, served_by, _) =
                    get(&http, format!("{base}/v1/keys/adv:1?client=a"), &[]).await;
                served_by == format!("127.0.0.1:{replica_port};role=replica")
            }
        },
    )
    .await;
    service.stop().await;
}

/// A measurement, not a timed test (run with `--ignored --nocapture`): replication of a replica
/// is held back for a known time with `CLIENT PAUSE <ms> WRITE`, and the lag maximum reported
/// by `/v1/lag` is compared with it. Target: within one heartbeat interval plus 20 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn measured_lag_max_tracks_a_known_pause() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let label = replica.addr();
    let interval_ms = 100.0;
    let service = Service::start(standalone_config(&group, "")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    for pause_ms in [500u64, 1000, 2000] {
        // A fresh window per round: wait until the lag is back to its baseline first.
        poll(
            "the lag is at its baseline",
            Duration::from_secs(10),
            || {
                let http = http.clone();
                let base = base.clone();
                let label = label.clone();
                async move {
                    lag_now(&http, &base, &label)
                        .await
                        .is_some_and(|lag| lag < 20.0)
                }
            },
        )
        .await;
        let before: Value = http
            .get(format!("{base}/v1/lag"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let max_before = before[0]["lag_ms"]["max"].as_f64().unwrap_or(0.0);
        devcluster::cli(
            replica.port(),
            &["CLIENT", "PAUSE", &pause_ms.to_string(), "WRITE"],
        )
        .expect("CLIENT PAUSE");
        poll("the lag rises", Duration::from_secs(10), || {
            let http = http.clone();
            let base = base.clone();
            let label = label.clone();
            async move {
                lag_now(&http, &base, &label)
                    .await
                    .is_some_and(|lag| lag > 100.0)
            }
        })
        .await;
        poll(
            "the lag falls back after the pause",
            Duration::from_secs(10),
            || {
                let http = http.clone();
                let base = base.clone();
                let label = label.clone();
                async move {
                    lag_now(&http, &base, &label)
                        .await
                        .is_some_and(|lag| lag < 20.0)
                }
            },
        )
        .await;
        let after: Value = http
            .get(format!("{base}/v1/lag"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let figures = &after[0]["lag_ms"];
        let max = figures["max"].as_f64().unwrap();
        let error = max - pause_ms as f64;
        println!(
            "pause {pause_ms} ms: reported max {max:.1} ms (error {error:+.1} ms; bound ±{:.0} ms), p50 {:.1}, p99 {:.1}, p999 {:.1}, previous max {max_before:.1}",
            interval_ms + 20.0,
            figures["p50"].as_f64().unwrap_or(f64::NAN),
            figures["p99"].as_f64().unwrap_or(f64::NAN),
            figures["p999"].as_f64().unwrap_or(f64::NAN),
        );
        assert!(
            error.abs() <= interval_ms + 20.0,
            "max {max} for a {pause_ms} ms pause"
        );
    }
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_replica_is_confined_to_its_own_reads() {
    let cluster = Cluster::start(ClusterOptions::default()).expect("cluster");
    let service = Service::start(cluster_config(&cluster)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    assert_eq!(
        put(&http, format!("{base}/v1/keys/adv:k?version=1"), "one", &[])
            .await
            .status(),
        StatusCode::OK
    );
    let affinity: Value = http
        .get(format!("{base}/v1/affinity?key=adv:k&client=a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (_, replica_port) = owner_and_replica(&cluster, affinity["copy_key"].as_str().unwrap());
    poll(
        "the advisory read is served by the owner's replica",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (_, _, served_by, _) =
                    get(&http, format!("{base}/v1/keys/adv:k?client=a"), &[]).await;
                served_by == format!("127.0.0.1:{replica_port};role=replica")
            }
        },
    )
    .await;
    cluster
        .node(replica_port)
        .expect("replica node")
        .kill()
        .expect("kill the replica");
    // Its reads go to the primary, with a reason; writes and every other node are unaffected.
    poll(
        "reads of the dead replica's copies go to the primary",
        Duration::from_secs(10),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let (status, body, served_by, route) =
                    get(&http, format!("{base}/v1/keys/adv:k?client=a"), &[]).await;
                status == StatusCode::OK
                    && body == "one"
                    && served_by.ends_with("role=primary")
                    && (route.ends_with("reason=lag-breach")
                        || route.ends_with("reason=no-replica"))
            }
        },
    )
    .await;
    for version in 2..=6 {
        let written = put(
            &http,
            format!("{base}/v1/keys/adv:k?version={version}"),
            "again",
            &[],
        )
        .await;
        assert_eq!(written.status(), StatusCode::OK, "write {version}");
        let (status, _, served_by, _) =
            get(&http, format!("{base}/v1/keys/adv:k?client=a"), &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert!(served_by.ends_with("role=primary"), "{served_by}");
    }
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_replica_that_is_down_does_not_stop_startup() {
    let primary = crate::harness::shared_standalone();
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let text = format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"redis://127.0.0.1:{dead_port}\"]\ncommand_timeout = \"300ms\"\nconnect_timeout = \"500ms\"\n\n[[family]]\nprefix = \"down:\"\ncopies = 2\ndefault_class = \"advisory\"\n",
        primary.url()
    );
    let mut config = Config::from_toml(&text).expect("config parses");
    // Every service gets a spool of its own: the retry spool is locked by one process.
    config.heal.spool_dir = crate::harness::spool_dir();
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    assert_eq!(
        put(
            &http,
            format!("{base}/v1/keys/down:1?version=1"),
            "one",
            &[]
        )
        .await
        .status(),
        StatusCode::OK
    );
    let (status, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/down:1?client=a"), &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "one"));
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    assert_eq!(route, "class=advisory;reason=lag-breach");
    let lag: Value = http
        .get(format!("{base}/v1/lag"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(lag[0]["replica"], format!("127.0.0.1:{dead_port}"));
    assert!(lag[0]["lag_ms"]["now"].is_null(), "{lag}");
    assert_eq!(lag[0]["within_budget"]["advisory"], false);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_moved_to_the_primary_by_a_lag_breach_does_not_go_back_on_the_replica() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let replica_label = replica.addr();
    let service = Service::start(standalone_config(&group, "")).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    // Two readers of the same copy: `a` will be moved to the primary, `b` never is.
    let copy = hotsplit::affinity::copy_index("a", 4);
    let b = (0..1000)
        .map(|n| format!("b{n}"))
        .find(|client| hotsplit::affinity::copy_index(client, 4) == copy)
        .expect("a client of the same copy");
    let copy_key = format!("adv:9#{copy}");
    assert_eq!(
        put(&http, format!("{base}/v1/keys/adv:9?version=1"), "one", &[])
            .await
            .status(),
        StatusCode::OK
    );
    poll("the replica serves 1", Duration::from_secs(10), || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let (_, body, served_by, _) =
                get(&http, format!("{base}/v1/keys/adv:9?client=a"), &[]).await;
            body == "one" && served_by.ends_with("role=replica")
        }
    })
    .await;

    // Replication held back, version 2 written: the lag breach sends `a` to the primary.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    assert_eq!(
        put(&http, format!("{base}/v1/keys/adv:9?version=2"), "two", &[])
            .await
            .status(),
        StatusCode::OK
    );
    poll(
        "the replica's lag passes 300 ms",
        Duration::from_secs(10),
        || {
            let (http, base, replica_label) = (http.clone(), base.clone(), replica_label.clone());
            async move {
                lag_now(&http, &base, &replica_label)
                    .await
                    .is_some_and(|lag| lag > 300.0)
            }
        },
    )
    .await;
    let (_, body, _, route) = get(&http, format!("{base}/v1/keys/adv:9?client=a"), &[]).await;
    assert_eq!(
        (body.as_str(), route.as_str()),
        ("two", "class=advisory;reason=lag-breach")
    );

    // The replica resumes and catches up; then its copy is set back by hand: a replica behind
    // while its measured lag is within the budget.
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    poll(
        "the replica applies version 2",
        Duration::from_secs(10),
        || {
            let held =
                devcluster::cli(replica.port(), &["HGET", &copy_key, "ver"]).unwrap_or_default();
            std::future::ready(held == "2")
        },
    )
    .await;
    devcluster::cli(
        replica.port(),
        &["CONFIG", "SET", "replica-read-only", "no"],
    )
    .unwrap();
    devcluster::cli(
        replica.port(),
        &["HSET", &copy_key, "ver", "1", "val", "one"],
    )
    .unwrap();
    poll(
        "the replica is back within the budget",
        Duration::from_secs(10),
        || {
            let (http, base, replica_label) = (http.clone(), base.clone(), replica_label.clone());
            async move {
                lag_now(&http, &base, &replica_label)
                    .await
                    .is_some_and(|lag| lag < 200.0)
            }
        },
    )
    .await;

    // `b` never left the replica: it gets the old value there. `a` had been shown 2 by the
    // primary, so this instance does not let it go back to 1.
    let (_, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/adv:9?client={b}"), &[]).await;
    assert_eq!(
        (body.as_str(), served_by.as_str(), route.as_str()),
        (
            "one",
            format!("{replica_label};role=replica").as_str(),
            "class=advisory;reason=class"
        )
    );
    let (_, body, served_by, route) =
        get(&http, format!("{base}/v1/keys/adv:9?client=a"), &[]).await;
    assert_eq!(
        (body.as_str(), served_by.as_str(), route.as_str()),
        (
            "two",
            format!("{};role=primary", group.primary.addr()).as_str(),
            "class=advisory;reason=version-floor"
        )
    );
    service.stop().await;
}
