//! Session tokens (`Hotsplit-Session`) over real Redis: two instances on one primary and its
//! replica, a client alternating between them. With the token, read-your-writes and monotonic
//! reads hold on the instance that never saw the client; without it, they break (a replica copy
//! behind within its budget, set back by hand, is what the other instance serves). Tokens of an
//! unknown version, garbled, oversized or forged are ignored and counted, never refused; a floor
//! expires with its key.

use std::time::Duration;

use hotsplit_devcluster::{self as devcluster, PrimaryReplica};
use reqwest::StatusCode;

use crate::harness::{
    self, config_from_toml, metrics_text, poll, publish_expecting, shared_standalone, Edit, Service,
};
use crate::route::{put, standalone_config, wait_for_read};

/// `ses:` reads the replica under the 30 s `lenient` budget; floors in memory last 30 s, so
/// only the instance that took a request knows its floor for the whole test.
const FAMILY: &str = "[[family]]\nprefix = \"ses:\"\ncopies = 4\ndefault_class = \"lenient\"\npin_window = \"30s\"\n";

/// The copy of `key` (of 4) that `client` reads.
fn copy_key(key: &str, client: &str) -> String {
    format!("{key}#{}", hotsplit::affinity::copy_index(client, 4))
}

/// What a GET answered: status, body, `Hotsplit-Served-By`, `Hotsplit-Route` and the token.
struct Answer {
    status: StatusCode,
    body: String,
    served_by: String,
    route: String,
    token: Option<String>,
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Reads `key` for `client` through `base`, sending `token` when given.
async fn read(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    client: &str,
    token: Option<&str>,
) -> Answer {
    let mut headers = vec![("hotsplit-client", client)];
    if let Some(token) = token {
        headers.push(("hotsplit-session", token));
    }
    let response = harness::get(http, &format!("{base}/v1/keys/{key}"), &headers).await;
    let token = response
        .headers()
        .get("hotsplit-session")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    Answer {
        status: response.status(),
        served_by: header(&response, "hotsplit-served-by"),
        route: header(&response, "hotsplit-route"),
        token,
        body: response.text().await.unwrap_or_default(),
    }
}

/// Polls until the replica's `copy_key` holds `version`.
async fn wait_replica_holds(port: u16, copy_key: &str, version: &str) {
    poll(
        &format!("the replica's {copy_key} holds {version}"),
        Duration::from_secs(10),
        || {
            let held = devcluster::cli(port, &["HGET", copy_key, "ver"]).unwrap_or_default();
            std::future::ready(held == version)
        },
    )
    .await;
}

/// Sets the replica's `copy_key` back to `version` with `body`: a replica behind within its
/// budget, deterministically.
fn set_replica_copy(port: u16, copy_key: &str, version: &str, body: &str) {
    devcluster::cli(port, &["CONFIG", "SET", "replica-read-only", "no"]).expect("CONFIG SET");
    devcluster::cli(
        port,
        &["HSET", copy_key, "ver", version, "val", body, "tomb", "0"],
    )
    .expect("HSET on the replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_floors_travel_between_two_instances_and_break_without_the_token() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = group.replicas[0].port();
    let a = Service::start(standalone_config(&group, FAMILY)).await;
    let b = Service::start(standalone_config(&group, FAMILY)).await;
    let http = reqwest::Client::new();
    publish_expecting(&http, &a.base, Edit::new("ses:1", 1, "one"), StatusCode::OK).await;
    for service in [&a, &b] {
        wait_for_read(
            &http,
            &format!("{}/v1/keys/ses:1?client=alice", service.base),
            "a replica read serves 1",
            Duration::from_secs(10),
            |read| read.body == "one" && read.served_by.ends_with("role=replica"),
        )
        .await;
    }

    // Alice writes 2 through A; her copy on the replica then goes back to 1.
    let written = put(
        &http,
        format!("{}/v1/keys/ses:1?version=2", a.base),
        "two",
        &[("hotsplit-client", "alice")],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    assert_eq!(header(&written, "cache-control"), "private");
    assert!(header(&written, "vary").contains("Hotsplit-Session"));
    let token = header(&written, "hotsplit-session");
    assert!(!token.is_empty(), "a write answer carries a token");
    wait_replica_holds(replica, &copy_key("ses:1", "alice"), "2").await;
    set_replica_copy(replica, &copy_key("ses:1", "alice"), "1", "one");

    // Without the token, only A knows alice's write: B serves her the replica's 1.
    let on_a = read(&http, &a.base, "ses:1", "alice", None).await;
    assert_eq!((on_a.status, on_a.body.as_str()), (StatusCode::OK, "two"));
    assert_eq!(on_a.route, "class=lenient;reason=own-write");
    let on_b = read(&http, &b.base, "ses:1", "alice", None).await;
    assert_eq!(
        (on_b.status, on_b.body.as_str()),
        (StatusCode::OK, "one"),
        "without the token, read-your-writes breaks on the other instance"
    );
    assert!(on_b.served_by.ends_with("role=replica"));

    // With the token, B honours alice's write as its own memory would.
    let on_b = read(&http, &b.base, "ses:1", "alice", Some(&token)).await;
    assert_eq!((on_b.status, on_b.body.as_str()), (StatusCode::OK, "two"));
    assert_eq!(on_b.route, "class=lenient;reason=own-write");

    // Monotonic reads: bob is served 2 by A's primary, then reads through B, whose replica
    // holds 1 for him. A client alternating instances keeps the last token it received.
    let bob_copy = copy_key("ses:1", "bob");
    if bob_copy != copy_key("ses:1", "alice") {
        wait_replica_holds(replica, &bob_copy, "2").await;
        set_replica_copy(replica, &bob_copy, "1", "one");
    }
    let first = read(&http, &a.base, "ses:1?class=primary", "bob", None).await;
    assert_eq!((first.status, first.body.as_str()), (StatusCode::OK, "two"));
    let without = read(&http, &b.base, "ses:1", "bob", None).await;
    assert_eq!(
        (without.status, without.body.as_str()),
        (StatusCode::OK, "one"),
        "without the token, bob goes back in time on the other instance"
    );
    let mut token = first.token.expect("a read answer carries a token");
    let mut last = 2;
    for round in 0..6 {
        let base = if round % 2 == 0 { &b.base } else { &a.base };
        let answer = read(&http, base, "ses:1", "bob", Some(&token)).await;
        assert_eq!(answer.status, StatusCode::OK, "round {round}");
        let version = if answer.body == "two" { 2 } else { 1 };
        assert!(version >= last, "round {round}: went back to {version}");
        last = version;
        token = answer.token.expect("every read answer carries a token");
    }
    a.stop().await;
    b.stop().await;
}

/// `hotsplit_session_tokens_total{outcome="OUTCOME"}` of the service at `base`.
async fn tokens_counted(http: &reqwest::Client, base: &str, outcome: &str) -> u64 {
    let prefix = format!("hotsplit_session_tokens_total{{outcome=\"{outcome}\"}} ");
    metrics_text(http, base)
        .await
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_of_unknown_version_garbled_oversized_or_forged_are_ignored_and_counted() {
    let server = shared_standalone();
    let text = format!(
        "[store]\nredis = {:?}\n[[family]]\nprefix = \"ses:\"\ncopies = 4\n",
        server.url()
    );
    let service = Service::start(config_from_toml(&text)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("ses:ign", 1, "one"), StatusCode::OK).await;
    let good = read(&http, base, "ses:ign", "erin", None)
        .await
        .token
        .expect("a token");
    // A forged token: a valid one with a raised byte in its floor's version (character 20 of
    // the text is inside the first floor's version). It would hold erin at 503 if honoured.
    let mut forged: Vec<u8> = good.clone().into_bytes();
    forged[20] = if forged[20] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).expect("ascii");
    let oversized = "A".repeat(3_000);
    for (token, outcome) in [
        ("Ag", "unknown_version"),
        (
            "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "unknown_version",
        ),
        ("!!not base64!!", "garbled"),
        ("", "garbled"),
        (oversized.as_str(), "oversized"),
        (forged.as_str(), "unverified"),
    ] {
        let before = tokens_counted(&http, base, outcome).await;
        let answer = read(&http, base, "ses:ign", "erin", Some(token)).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::OK, "one"),
            "{outcome}: {token:.40}"
        );
        // The answer carries a fresh, valid token in place of the ignored one.
        let fresh = answer.token.expect("a fresh token");
        assert_ne!(fresh, token);
        assert_eq!(
            tokens_counted(&http, base, outcome).await,
            before + 1,
            "{outcome}"
        );
        let again = read(&http, base, "ses:ign", "erin", Some(&fresh)).await;
        assert_eq!(again.status, StatusCode::OK);
    }
    // Two token lines are two tokens, merged: each counted; a garbled one beside a good one is
    // ignored alone, and a write never refuses a token either.
    let (valid, garbled) = (
        tokens_counted(&http, base, "valid").await,
        tokens_counted(&http, base, "garbled").await,
    );
    let answer = http
        .put(format!("{base}/v1/keys/ses:ign?version=2"))
        .header("hotsplit-session", good.as_str())
        .header("hotsplit-session", format!("{good}, !!"))
        .body("two")
        .send()
        .await
        .expect("PUT");
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(tokens_counted(&http, base, "valid").await, valid + 2);
    assert_eq!(tokens_counted(&http, base, "garbled").await, garbled + 1);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_a_floor_expires_with_its_key_so_a_restarted_key_is_served() {
    let server = shared_standalone();
    // Keys live 1 s and their versions 200 ms more: a key can expire and start again low.
    let text = format!(
        "[store]\nredis = {:?}\nversion_retention = \"200ms\"\n[default_family]\nttl = \"1s\"\n",
        server.url()
    );
    let service = Service::start(config_from_toml(&text)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    let key = format!("sexp:{:08x}", rand::random::<u32>());
    let written = put(
        &http,
        format!("{base}/v1/keys/{key}?version=5"),
        "five",
        &[],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    let token = header(&written, "hotsplit-session");
    // While the key lives, the token's floor holds: a lower version is never served.
    let answer = read(&http, base, &key, "frank", Some(&token)).await;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (StatusCode::OK, "five")
    );
    // The key expires, its version is forgotten, and it starts again at 1.
    poll(
        "the key restarts at version 1",
        Duration::from_secs(10),
        || async {
            http.put(format!("{base}/v1/keys/{key}?version=1"))
                .body("one")
                .send()
                .await
                .is_ok_and(|answer| answer.status() == StatusCode::OK)
        },
    )
    .await;
    // The floor of 5 expired with the key: the token does not hold frank at 503.
    let answer = read(&http, base, &key, "frank", Some(&token)).await;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (StatusCode::OK, "one")
    );
    service.stop().await;
}
