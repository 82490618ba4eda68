//! Hot keys found on the read path (`[hot_keys]`, `GET /v1/hot-keys`) on a real Redis: a key
//! read far above the threshold is listed first and hot within a few windows, its Redis reads
//! apart from what clients asked (the near cache answers most); it cools once reads stop, and
//! goes hot again; metrics count the changes and never name a key; a second instance that never
//! read the key lists it fleet-wide within a heartbeat.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{
    self, config_from_toml, get_json, metrics_text, poll, publish_succeeds, Service,
};

/// The service: family `hk:` (4 copies, advisory, near cache on), every read sampled, hot at
/// 50 reads/s in 200 ms windows, cooled after 400 ms below 25 reads/s.
fn config(url: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"hk:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"advisory\"\n[hot_keys]\nsample_every = 1\nthreshold = 50.0\nwindow = \"200ms\"\ncool_down = \"400ms\"\n",
        timeout = harness::command_timeout_toml()
    ))
}

/// Reads `key` `times` times, 16 at a time, each as its own client.
async fn read_many(http: &reqwest::Client, base: &str, key: &str, times: usize) {
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..times {
        let (http, url) = (
            http.clone(),
            format!("{base}/v1/keys/{key}?client=reader-{}", i % 64),
        );
        reads.spawn(async move {
            let answer = http.get(url).send().await.expect("read");
            assert_eq!(answer.status(), 200);
        });
        if reads.len() >= 16 {
            reads.join_next().await;
        }
    }
    while reads.join_next().await.is_some() {}
}

/// The listed entry of `key` in the instance part of a `/v1/hot-keys` answer, if any.
fn entry<'a>(answer: &'a Value, key: &str) -> Option<&'a Value> {
    answer["instance"]["keys"]
        .as_array()?
        .iter()
        .find(|entry| entry["key"] == key)
}

/// The entry of `key` in the fleet part of a `/v1/hot-keys` answer, if any.
fn fleet_entry<'a>(answer: &'a Value, key: &str) -> Option<&'a Value> {
    answer["fleet"]["keys"]
        .as_array()?
        .iter()
        .find(|entry| entry["key"] == key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_above_the_threshold_is_found_hot_cools_and_goes_hot_again() {
    let server = harness::shared_standalone();
    let service = Service::start(config(&server.url())).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_succeeds(&http, &base, "hk:hot", 1, "hot").await;
    publish_succeeds(&http, &base, "hk:cold", 1, "cold").await;

    for round in 0..2 {
        // Reads until a window shows the key hot: each burst is far above 50 reads/s.
        let started = std::time::Instant::now();
        let view = loop {
            read_many(&http, &base, "hk:hot", 200).await;
            read_many(&http, &base, "hk:cold", 2).await;
            let view = get_json(&http, &format!("{base}/v1/hot-keys")).await;
            if entry(&view, "hk:hot").is_some_and(|e| e["hot"] == true) {
                break view;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "round {round}: hk:hot never found hot: {view}"
            );
        };
        let hot = entry(&view, "hk:hot").expect("listed");
        assert_eq!(
            view["instance"]["keys"][0]["key"], "hk:hot",
            "most read first: {view}"
        );
        assert_eq!(hot["family"], "hk:");
        assert_eq!(hot["copies"], 4);
        assert_eq!(hot["policy"], "observe");
        assert!(hot["hot_since_ms"].as_u64().is_some());
        let (rate, store_rate) = (
            hot["rate"].as_f64().expect("rate"),
            hot["store_rate"].as_f64().expect("store rate"),
        );
        assert!(rate >= 50.0, "{hot}");
        assert!(
            store_rate < rate,
            "the near cache answers most reads, so fewer reach Redis: {hot}"
        );
        if let Some(cold) = entry(&view, "hk:cold") {
            assert_eq!(cold["hot"], false, "{view}");
        }

        // No reads: the key cools once 400 ms passed below the cooling rate.
        poll(
            "hk:hot cools once it is no longer read",
            Duration::from_secs(30),
            || {
                let (http, url) = (http.clone(), format!("{base}/v1/hot-keys"));
                async move {
                    let view = get_json(&http, &url).await;
                    entry(&view, "hk:hot").is_none_or(|e| e["hot"] == false)
                        && !view["instance"]["other_hot"]
                            .as_array()
                            .is_some_and(|keys| keys.iter().any(|k| k == "hk:hot"))
                }
            },
        )
        .await;
    }

    let metrics = metrics_text(&http, &base).await;
    let count = |change: &str| -> u64 {
        metrics
            .lines()
            .find(|line| {
                line.starts_with("hotsplit_hot_key_changes_total")
                    && line.contains(&format!("change=\"{change}\""))
            })
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("hot") >= 2, "went hot twice: {metrics}");
    assert!(count("cooled") >= 2, "cooled twice");
    assert!(
        !metrics.contains("hk:hot"),
        "metric labels never carry key names"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_lists_a_key_hot_on_one_instance_fleet_wide() {
    let server = harness::shared_standalone();
    let mut reading = config(&server.url());
    reading.heal.spool_dir = harness::spool_dir();
    let mut other = config(&server.url());
    other.heal.spool_dir = harness::spool_dir();
    let reading = Service::start(reading).await;
    let other = Service::start(other).await;
    let http = reqwest::Client::new();
    publish_succeeds(&http, &reading.base, "hk:fleet", 1, "x").await;
    let reading_id = get_json(&http, &format!("{}/v1/instances", reading.base)).await["this"]
        .as_str()
        .expect("instance id")
        .to_owned();
    let started = std::time::Instant::now();
    loop {
        read_many(&http, &reading.base, "hk:fleet", 200).await;
        let answer = get_json(&http, &format!("{}/v1/hot-keys", other.base)).await;
        if let Some(entry) = fleet_entry(&answer, "hk:fleet") {
            assert!(
                entry["instances"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|id| id == reading_id.as_str())),
                "{answer}"
            );
            assert!(entry["rate"].as_f64().unwrap_or(0.0) > 0.0, "{answer}");
            assert!(
                entry_never_read_here(&answer),
                "the other instance never read it itself: {answer}"
            );
            assert!(
                answer["fleet"]["reporting"].as_u64().unwrap_or(0) >= 2,
                "{answer}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the other instance never listed hk:fleet fleet-wide: {answer}"
        );
    }
    other.stop().await;
    reading.stop().await;
}

/// Whether the instance part of `answer` does not list `hk:fleet`.
fn entry_never_read_here(answer: &Value) -> bool {
    entry(answer, "hk:fleet").is_none()
}

/// A key is hot at the read that proves the threshold over the window, not when the window
/// closes: with 60 s windows and 5 reads/s, the 300th read of a key in the first window makes
/// it hot (the 299th does not), listed at once in `other_hot` while no window has closed yet,
/// and another instance lists it hot fleet-wide within a heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_found_hot_by_the_read_that_proves_it_before_its_window_closes() {
    let server = harness::shared_standalone();
    let config = |url: &str| {
        let mut config = config_from_toml(&format!(
            "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"hk:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"advisory\"\n[hot_keys]\nthreshold = 5.0\nwindow = \"60s\"\n",
            timeout = harness::command_timeout_toml()
        ));
        config.heal.spool_dir = harness::spool_dir();
        config
    };
    let reading = Service::start(config(&server.url())).await;
    let other = Service::start(config(&server.url())).await;
    let http = reqwest::Client::new();
    let key = "hk:early";
    publish_succeeds(&http, &reading.base, key, 1, "x").await;
    let reading_id = get_json(&http, &format!("{}/v1/instances", reading.base)).await["this"]
        .as_str()
        .expect("instance id")
        .to_owned();
    let other_hot = |answer: &Value| {
        answer["instance"]["other_hot"]
            .as_array()
            .is_some_and(|keys| keys.iter().any(|listed| listed == key))
    };
    read_many(&http, &reading.base, key, 299).await;
    let answer = get_json(&http, &format!("{}/v1/hot-keys", reading.base)).await;
    assert!(!other_hot(&answer), "hot one read early: {answer}");
    read_many(&http, &reading.base, key, 1).await;
    let answer = get_json(&http, &format!("{}/v1/hot-keys", reading.base)).await;
    assert!(other_hot(&answer), "not hot at the 300th read: {answer}");
    assert_eq!(
        answer["instance"]["closed_at_ms"], 0,
        "a window closed: {answer}"
    );
    assert_eq!(answer["instance"]["sample_every"], 1, "{answer}");
    poll(
        "the other instance lists the key hot fleet-wide",
        Duration::from_secs(30),
        || async {
            let answer = get_json(&http, &format!("{}/v1/hot-keys", other.base)).await;
            fleet_entry(&answer, key).is_some_and(|entry| {
                entry["hot_on"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|id| id == reading_id.as_str()))
            })
        },
    )
    .await;
    other.stop().await;
    reading.stop().await;
}
