//! The floors a write leaves, on real Redis through HTTP: a `PUT` or `DELETE` that landed on no
//! copy and queued none (every write refused with `NOREPLICAS`, the retry queue full) leaves no
//! floor in the writer's session token, none in the instance's own-write pin and no
//! `Hotsplit-Version`, so once Redis is back and another writer publishes a lower version, the
//! first writer reads it; and an answer never outlives its copy's own expiry: a re-send answered
//! `current` does not give the near cache the re-send's later expiry.

use std::time::{Duration, Instant};

use hotsplit_devcluster::{self as devcluster, Standalone};
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{self, config_from_toml, poll, Edit, Service};

/// `wf:` keys: two copies, a pin window longer than any test, so a pin left by a write that
/// landed nowhere would still hold when the test reads; a retry queue of one entry, so it is
/// full after the first failed copy.
fn config(url: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"wf:\"\ncopies = 2\nttl = \"1h\"\npin_window = \"1h\"\n[heal]\nmax_entries = 1\n",
        timeout = harness::command_timeout_toml()
    ))
}

/// What a key route answered: status, `Hotsplit-Version`, the session token, the body.
struct Answer {
    status: StatusCode,
    version: Option<String>,
    token: Option<String>,
    body: String,
}

/// Sends `request` with `client` and `token`; returns what came back.
async fn send(request: reqwest::RequestBuilder, client: &str, token: Option<&str>) -> Answer {
    let mut request = request.header("hotsplit-client", client);
    if let Some(token) = token {
        request = request.header("hotsplit-session", token);
    }
    let response = request.send().await.expect("send");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let (version, token) = (header("hotsplit-version"), header("hotsplit-session"));
    Answer {
        status: response.status(),
        version,
        token,
        body: response.text().await.unwrap_or_default(),
    }
}

/// The report members of a write's answer (a report, or a problem carrying its members).
fn report(answer: &Answer) -> Value {
    serde_json::from_str(&answer.body)
        .unwrap_or_else(|err| panic!("the answer is JSON: {err}: {}", answer.body))
}

/// Makes every write on `port` fail at once with `NOREPLICAS` (`true`), or heals it.
fn refuse_writes(port: u16, refuse: bool) {
    let wanted = if refuse { "5" } else { "0" };
    devcluster::cli(port, &["CONFIG", "SET", "min-replicas-to-write", wanted])
        .expect("CONFIG SET min-replicas-to-write");
}

/// Publishes `version` of `key` as `client` through `base` until it answers 200: after Redis
/// healed, the node is back in service once a probe has seen it answer.
async fn publish_once_healed(http: &reqwest::Client, base: &str, key: &str, version: u64) {
    poll(
        &format!("another writer publishes {key} version {version}"),
        Duration::from_secs(20),
        || async {
            let put = http
                .put(format!("{base}/v1/keys/{key}?version={version}"))
                .body(format!("value {version}"));
            send(put, "writer-2", None).await.status == StatusCode::OK
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_landed_nowhere_leaves_no_floor_and_one_that_queued_leaves_its_own() {
    let server = Standalone::start().expect("redis-server");
    let port = server.node.port();
    let service = Service::start(config(&server.url())).await;
    let other = Service::start(config(&server.url())).await;
    let http = reqwest::Client::new();
    let base = &service.base;

    // writer-1 holds a token before Redis fails (it read a key), and sends it with every write.
    harness::publish_expecting(&http, base, Edit::new("wf:seen", 1, "one"), StatusCode::OK).await;
    let seen = send(
        http.get(format!("{base}/v1/keys/wf:seen")),
        "writer-1",
        None,
    )
    .await;
    assert_eq!(seen.status, StatusCode::OK);
    let token = seen.token.expect("a read answer carries a token");

    refuse_writes(port, true);
    // The first failed copy fills the queue: its write queued one copy and left a floor.
    let filler = send(
        http.put(format!("{base}/v1/keys/wf:filler?version=7"))
            .body("seven"),
        "writer-1",
        Some(&token),
    )
    .await;
    let filled = report(&filler);
    assert_eq!(filler.status, StatusCode::SERVICE_UNAVAILABLE, "{filled}");
    assert_eq!(
        (filled["queued"].as_u64(), filled["applied"].as_u64()),
        (Some(1), Some(0)),
        "{filled}"
    );
    assert_eq!(
        filler.version.as_deref(),
        Some("7"),
        "a queued copy leaves its floor"
    );
    assert_ne!(
        filler.token.as_deref(),
        Some(token.as_str()),
        "the queued write's floor is in the token"
    );

    // Nothing lands and nothing can be queued: no floor anywhere.
    for (method, key) in [("PUT", "wf:put"), ("DELETE", "wf:delete")] {
        let url = format!("{base}/v1/keys/{key}?version=100");
        let request = match method {
            "PUT" => http.put(url).body("hundred"),
            _ => http.delete(url),
        };
        let nowhere = send(request, "writer-1", Some(&token)).await;
        let members = report(&nowhere);
        assert_eq!(
            nowhere.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method}: {members}"
        );
        assert_eq!(members["code"], "publish_incomplete", "{method}: {members}");
        assert_eq!(
            (
                members["applied"].as_u64(),
                members["current"].as_u64(),
                members["queued"].as_u64(),
                members["dropped"].as_u64()
            ),
            (Some(0), Some(0), Some(0), Some(2)),
            "{method}: {members}"
        );
        assert_eq!(
            nowhere.version, None,
            "{method}: no Hotsplit-Version for a write that landed nowhere"
        );
        assert_eq!(
            nowhere.token.as_deref(),
            Some(token.as_str()),
            "{method}: the token comes back unchanged, byte for byte"
        );
    }

    refuse_writes(port, false);
    for key in ["wf:put", "wf:delete"] {
        publish_once_healed(&http, base, key, 3).await;
        // On this instance: writer-1's own-write pin (an hour long) would hold 100.
        let pinned = send(http.get(format!("{base}/v1/keys/{key}")), "writer-1", None).await;
        assert_eq!(
            (pinned.status, pinned.body.as_str()),
            (StatusCode::OK, "value 3"),
            "{key}: no own-write pin for a write that landed nowhere"
        );
        // Through the other instance, with the token: its floors would hold 100.
        for instance in [base, &other.base] {
            let carried = send(
                http.get(format!("{instance}/v1/keys/{key}")),
                "writer-1",
                Some(&token),
            )
            .await;
            assert_eq!(
                (carried.status, carried.body.as_str()),
                (StatusCode::OK, "value 3"),
                "{key} through {instance}: no session floor for a write that landed nowhere"
            );
        }
    }
    service.stop().await;
    other.stop().await;
}

/// `wfnear:` keys expire 2 s after a publish (no jitter) and are read through a near cache whose
/// entries may be 5 s old: only the copy's own expiry ends an entry early.
fn expiring_config(url: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"wfnear:\"\ncopies = 2\nttl = \"2s\"\ndefault_class = \"remembered\"\n[classes.remembered]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"60s\"\nnear_cache_max_age = \"5s\"\n[heal]\nexpiry_jitter_min = 0.0\nexpiry_jitter_max = 0.0\n",
        timeout = harness::command_timeout_toml()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_answered_current_does_not_outlive_the_copy_in_the_near_cache() {
    let server = harness::shared_standalone();
    let service = Service::start(expiring_config(&server.url())).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    // The scenario decides only when the read after the copy's expiry comes before the
    // re-send's expiry; on a machine too loaded for that it is tried again with a new key.
    for attempt in 0..3 {
        let key = format!("wfnear:resend-{attempt}");
        let url = format!("{base}/v1/keys/{key}?version=1");
        let first = Instant::now();
        let put = send(http.put(&url).body("one"), "writer", None).await;
        assert_eq!(put.status, StatusCode::OK, "{}", put.body);
        let expires = Instant::now() + Duration::from_secs(2);
        tokio::time::sleep(Duration::from_millis(1_200).saturating_sub(first.elapsed())).await;
        let resend = Instant::now();
        let again = send(http.put(&url).body("one"), "writer", None).await;
        let members = report(&again);
        assert_eq!(again.status, StatusCode::OK, "{members}");
        assert_eq!(
            members["current"].as_u64(),
            Some(2),
            "the re-send is current: {members}"
        );
        // Past the copy's own expiry (2 s after the first publish answered), before the
        // expiry the re-send would have given (2 s after it began).
        tokio::time::sleep(
            (expires + Duration::from_millis(100)).saturating_duration_since(Instant::now()),
        )
        .await;
        let read = send(http.get(format!("{base}/v1/keys/{key}")), "reader", None).await;
        if resend.elapsed() >= Duration::from_millis(1_950) {
            continue;
        }
        assert_eq!(
            read.status,
            StatusCode::NOT_FOUND,
            "the copy expired: the near cache must not answer it ({})",
            read.body
        );
        service.stop().await;
        return;
    }
    panic!("the machine was too slow to read between the copy's expiry and the re-send's");
}
