//! The near cache on real Redis: reads answered from memory never go backwards (a copy set back
//! by hand, a lagging replica), an invalidation racing a read in flight, floors and pins that go
//! to Redis, decision reads that never use it, expiry, writes through the instance seen at once,
//! a lossy master restart that shows up as one counted rollback, the cache off on the embedded
//! store, one Redis read for 1,000 concurrent misses (`INFO commandstats`: data reads are
//! `HMGET`), the byte bound under a flood of distinct keys, a reader with no floor never sent
//! back by a lagging replica after a churn evicted its copy's entry and record, and a SIGHUP that lowers a class's
//! budget below its near-cache max age (through the binary).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hotsplit::metrics::Metrics;
use hotsplit_devcluster::{self as devcluster, PrimaryReplica, Standalone};
use serde_json::Value;
use tower::ServiceExt;

use crate::harness::{
    self, config_from_toml, get_json, hgetall, metrics_text, poll, publish_expecting, Binary, Edit,
    Service,
};
use crate::route::{hmget_calls, put, read, Read};

/// A class with a long replica budget and a short near-cache age, so entries age out fast while
/// a paused replica stays within budget.
const LENIENT: &str = "[classes.lenient]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"30s\"\nnear_cache_max_age = \"60ms\"\n";

/// A class whose near-cache entries stay young for a whole test, so what a test asserts about
/// an entry does not depend on how fast a loaded machine sends the next request (`advisory`'s
/// 125 ms max age ran out between two requests of a test at load 19 on 2 cores).
const PATIENT: &str = "[classes.patient]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"60s\"\nnear_cache_max_age = \"60s\"\n";

/// A service config on `url`: family `nc:` of `copies` copies read with class `class`, then
/// `extra`.
fn config(url: &str, copies: u32, class: &str, extra: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"nc:\"\ncopies = {copies}\nttl = \"10m\"\ndefault_class = \"{class}\"\n[[family]]\nprefix = \"claim:\"\ncopies = 1\ndefault_class = \"decides-on-presence\"\n{LENIENT}{extra}",
        timeout = harness::command_timeout_toml()
    ))
}

fn is_near(read: &Read) -> bool {
    read.route.contains(";source=near-cache;age_ms=")
}

/// The value of the sample `name` (no labels) in the metrics text.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_is_seen_at_once_and_reads_are_answered_from_memory_with_their_age() {
    let server = harness::shared_standalone();
    // Entries that stay young for the whole test: with `advisory`'s 125 ms, the entry a
    // publish leaves could age out on a loaded machine before the next request read it.
    let service = Service::start(config(&server.url(), 4, "patient", PATIENT)).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:seen", 1, "one"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/nc:seen?client=alice");
    let first = harness::get(&http, &url, &[]).await;
    let header = |name: &str| {
        first
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let (age, route) = (header("age"), header("hotsplit-route").unwrap_or_default());
    let age_ms = route
        .split_once(";source=near-cache;age_ms=")
        .and_then(|(_, age_ms)| age_ms.split(';').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the first read is answered from memory: {route}"));
    assert_eq!(
        age,
        Some((age_ms / 1000).to_string()),
        "the standard Age header, whole seconds of the age bound: {route}"
    );
    let answer = read(&http, &url, &[]).await;
    assert_eq!(answer.body, "one");
    assert!(is_near(&answer), "{}", answer.route);
    publish_expecting(&http, base, Edit::new("nc:seen", 2, "two"), StatusCode::OK).await;
    let answer = read(&http, &url, &[]).await;
    assert_eq!(
        answer.body, "two",
        "a publish through the instance is seen at once"
    );
    assert!(is_near(&answer), "{}", answer.route);
    let view = get_json(&http, &format!("{base}/v1/near-cache")).await;
    assert_eq!(view["enabled"], true);
    assert!(view["hits"].as_u64().unwrap() >= 2, "{view}");
    assert!(
        view["hottest"]
            .as_array()
            .unwrap()
            .iter()
            .any(|hot| hot["copy_key"].as_str().unwrap().starts_with("nc:seen#")),
        "{view}"
    );
    let metrics = metrics_text(&http, base).await;
    assert!(sample(&metrics, "hotsplit_near_cache_hits_total") >= 2.0);
    assert!(metrics.contains("hotsplit_near_cache_served_age_seconds_bucket{"));
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_above_the_entry_pins_and_decisions_go_to_redis() {
    let server = Standalone::start().expect("redis-server");
    let port = server.node.port();
    // Entries that stay young: with `advisory`'s 125 ms, a loaded machine let this instance's
    // entry age out and refill at 2 before the floor read, which the entry then answered.
    // Without the invalidation feed: the other instance's publish must leave this instance's
    // entry stale (the feed would drop it at once, `feed::`), so the floor rule is what serves 2.
    let unfed = || {
        let mut config = config(&server.url(), 4, "patient", PATIENT);
        config.feed.disabled = true;
        config
    };
    let service = Service::start(unfed()).await;
    let other = Service::start(unfed()).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:floor", 1, "one"), StatusCode::OK).await;
    // Another instance publishes 2: this one's entry still holds 1, within its age.
    publish_expecting(
        &http,
        &other.base,
        Edit::new("nc:floor", 2, "two"),
        StatusCode::OK,
    )
    .await;
    let url = format!("{base}/v1/keys/nc:floor?client=alice");
    let before = hmget_calls(port);
    let cached = read(&http, &url, &[]).await;
    assert_eq!(
        (cached.body.as_str(), is_near(&cached)),
        ("one", true),
        "{}",
        cached.route
    );
    // A floor above the entry goes to Redis.
    let floored = read(&http, &format!("{url}&min_version=2"), &[]).await;
    assert_eq!(
        (floored.status, floored.body.as_str()),
        (StatusCode::OK, "two")
    );
    assert!(!is_near(&floored), "{}", floored.route);
    assert!(hmget_calls(port) > before, "the floor read reached Redis");
    // A read under a request pin goes to Redis, whatever the entry holds.
    let pinned_put = put(
        &http,
        format!("{base}/v1/keys/nc:floor?version=3"),
        "three",
        &[("hotsplit-request", "req-9")],
    )
    .await;
    assert_eq!(pinned_put.status(), StatusCode::OK);
    let before = hmget_calls(port);
    let pinned = read(&http, &url, &[("hotsplit-request", "req-9")]).await;
    assert_eq!(pinned.body, "three");
    assert!(
        pinned.route.contains("reason=request-pin"),
        "{}",
        pinned.route
    );
    assert!(!is_near(&pinned));
    assert!(hmget_calls(port) > before);
    // decides-on-presence never reads the near cache: every read is a Redis read.
    publish_expecting(&http, base, Edit::new("claim:1", 1, "mine"), StatusCode::OK).await;
    let before = hmget_calls(port);
    for _ in 0..5 {
        let decision = read(&http, &format!("{base}/v1/keys/claim:1?client=alice"), &[]).await;
        assert_eq!(decision.body, "mine");
        assert!(!is_near(&decision), "{}", decision.route);
    }
    assert_eq!(hmget_calls(port) - before, 5);
    service.stop().await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_set_back_by_hand_after_its_entry_aged_out_is_not_served() {
    let server = Standalone::start().expect("redis-server");
    let port = server.node.port();
    let service = Service::start(config(&server.url(), 4, "lenient", "")).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:back", 5, "five"), StatusCode::OK).await;
    let copy = harness::affinity(&http, base, "nc:back", "alice").await["copy"]
        .as_u64()
        .unwrap();
    let url = format!("{base}/v1/keys/nc:back?client=alice");
    // Alice's reads are answered from memory at 5. Polled: on a loaded machine the entry the
    // publish left can age out (60 ms) before the first read, which then refills it.
    poll(
        "alice's read answered from memory",
        Duration::from_secs(10),
        || async {
            let seen = read(&http, &url, &[]).await;
            assert_eq!(seen.body, "five", "{}", seen.route);
            is_near(&seen)
        },
    )
    .await;
    // Alice's copy goes back to 4 in Redis, behind the compare-and-set, three times (read
    // repair writes 5 back after each). Each time her entry ages out (60 ms) and refills, the
    // refill finds 4 and is not served: her reads stay at 5, from a sibling. A repair still in
    // flight from the round before can land after the copy was set back and before any refill
    // read it; the copy is then set back again, so each round ends with a refill that found 4.
    let copy_key = format!("nc:back#{copy}");
    for round in 1..=3 {
        poll(
            "a refill below the high-water version",
            Duration::from_secs(10),
            || async {
                if hgetall(port, &copy_key)["ver"] != "4" {
                    devcluster::cli(port, &["HSET", &copy_key, "ver", "4", "val", "four"])
                        .expect("HSET");
                }
                let answer = read(&http, &url, &[]).await;
                assert_eq!(answer.body, "five", "went back: {}", answer.route);
                let metrics = metrics_text(&http, base).await;
                sample(&metrics, "hotsplit_near_cache_fills_below_high_water_total")
                    >= f64::from(round)
            },
        )
        .await;
    }
    // Another reader of the same copy, with no floor of its own, is not sent back either.
    let bob = harness::client_of_copy("reader-", copy as u32, 4);
    let answer = read(&http, &format!("{base}/v1/keys/nc:back?client={bob}"), &[]).await;
    assert_eq!(answer.body, "five");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_never_sends_a_cached_reader_back() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let mut config = config(&group.url(), 2, "lenient", "");
    config.store.replicas = vec![replica.url()];
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:lag", 1, "one"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/nc:lag?client=alice");
    // The replica serves once it holds 1 and its lag is measured.
    poll(
        "a replica fill of version 1",
        Duration::from_secs(10),
        || async {
            let answer = read(&http, &url, &[]).await;
            answer.body == "one" && answer.served_by.ends_with("role=replica")
        },
    )
    .await;
    // The replica stops applying the replication stream; within the 30 s budget it stays the
    // class's source, holding 1.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "3000", "WRITE"]).expect("CLIENT PAUSE");
    publish_expecting(&http, base, Edit::new("nc:lag", 2, "two"), StatusCode::OK).await;
    // For a second, every read says 2: from the entry the publish left, then, after it ages
    // out, from fills that found 1 on the replica and re-read the primary.
    let until = std::time::Instant::now() + Duration::from_secs(1);
    let mut reads = 0;
    while std::time::Instant::now() < until {
        let answer = read(&http, &url, &[]).await;
        assert_eq!(
            answer.body, "two",
            "went back: {} {}",
            answer.served_by, answer.route
        );
        reads += 1;
    }
    let metrics = metrics_text(&http, base).await;
    assert!(
        sample(&metrics, "hotsplit_near_cache_fills_below_high_water_total") >= 1.0,
        "no fill met the lagging replica in {reads} reads"
    );
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_racing_a_read_in_flight_wins() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    // Entries that stay young for the whole test: with `lenient`'s 60 ms, the value the raced
    // fill offers is already too old to serve when it lands, so a cache that let it replace
    // the invalidation's tombstone went unnoticed (tried: the test passed with that bug).
    let mut config = config(&group.url(), 2, "patient", PATIENT);
    config.store.replicas = vec![replica.url()];
    // The fill waits on a stopped replica until the test resumes it: a command timeout longer
    // than the test needs, so the fill is never sent to the primary instead.
    config.store.command_timeout = Duration::from_secs(15);
    config.server.request_deadline = Duration::from_secs(15);
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    // Written by another instance: this one holds no entry.
    let other_config = {
        let mut other = self::config(&group.url(), 2, "patient", PATIENT);
        other.store.replicas = vec![replica.url()];
        other
    };
    let other = Service::start(other_config).await;
    poll(
        "the replica's lag is measured",
        Duration::from_secs(10),
        || async {
            let lag = get_json(&http, &format!("{base}/v1/lag")).await;
            lag[0]["lag_ms"]["now"].is_number()
        },
    )
    .await;
    // A resumed replica may apply the invalidation's replication before it answers the read
    // queued first (its event loop takes both sockets at once, and a loaded machine may send
    // the read's HMGET after the replication stream arrived): then nothing raced, and the
    // attempt is run again on a fresh key. Every attempt checks what is served after the
    // invalidation; at least one must have raced.
    let mut raced_once = false;
    for attempt in 0..RACE_ATTEMPTS {
        let key = format!("nc:race{attempt}");
        if race_an_invalidation(&http, &base, &other.base, replica, &key).await {
            raced_once = true;
            break;
        }
    }
    assert!(
        raced_once,
        "in {RACE_ATTEMPTS} attempts the replica never answered the raced read before applying the invalidation"
    );
    service.stop().await;
    other.stop().await;
}

/// Attempts of [`an_invalidation_racing_a_read_in_flight_wins`] before it fails for want of a race.
const RACE_ATTEMPTS: usize = 5;

/// One attempt of [`an_invalidation_racing_a_read_in_flight_wins`] on `key`: published (v1)
/// through `other_base`, read through `base` while the replica is stopped, invalidated (v2)
/// through `base` while that read waits; then every read is a 404 at v2. Returns whether the
/// race ran: the waiting read answered v1 from the replica (else it answered the invalidation,
/// which the replica applied first).
async fn race_an_invalidation(
    http: &reqwest::Client,
    base: &str,
    other_base: &str,
    replica: &devcluster::RedisNode,
    key: &str,
) -> bool {
    publish_expecting(http, other_base, Edit::new(key, 1, "one"), StatusCode::OK).await;
    let copies = [format!("{key}#0"), format!("{key}#1")];
    poll(
        "the replica holds version 1",
        Duration::from_secs(10),
        || async {
            copies.iter().all(|copy| {
                hgetall(replica.port(), copy).get("ver").map(String::as_str) == Some("1")
            })
        },
    )
    .await;
    let misses = sample(
        &metrics_text(http, base).await,
        "hotsplit_near_cache_misses_total",
    );
    // The replica is stopped (SIGSTOP) until the test resumes it: the read's fill waits there...
    // (`CLIENT PAUSE ... ALL` cannot be ended early: Redis 7.0 held the `CLIENT UNPAUSE` of
    // another connection until the pause ran out.)
    replica.pause().expect("SIGSTOP the replica");
    let url = format!("{base}/v1/keys/{key}?client=alice");
    let in_flight = tokio::spawn({
        let http = http.clone();
        let url = url.clone();
        async move { read(&http, &url, &[]).await }
    });
    poll("the fill started", Duration::from_secs(5), || async {
        sample(
            &metrics_text(http, base).await,
            "hotsplit_near_cache_misses_total",
        ) > misses
    })
    .await;
    // ...while an invalidation through this instance lands on the primaries.
    let deleted = http
        .delete(format!("{base}/v1/keys/{key}?version=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    // The invalidation answered while the read still waited for its fill, whose answer from
    // the replica can only come after the replica resumes below. (With a 250 ms `CLIENT
    // PAUSE`, a loaded machine could answer the read before the invalidation, and the test
    // passed without racing anything.)
    assert!(
        !in_flight.is_finished(),
        "the read answered before the invalidation: nothing raced"
    );
    replica.resume().expect("SIGCONT the replica");
    let raced = in_flight.await.unwrap();
    // The read that began first answers what the copy held when the replica answered it, from
    // the replica: v1 when it answered before applying the invalidation (its fill then landed
    // after the invalidation's tombstone entry, the race), else the invalidation itself.
    assert!(
        raced.served_by.ends_with("role=replica") || raced.status == StatusCode::NOT_FOUND,
        "{} {}",
        raced.served_by,
        raced.route
    );
    let ran = match (raced.status, raced.body.as_str()) {
        (StatusCode::OK, "one") => true,
        (StatusCode::NOT_FOUND, body) if body.contains("invalidated") => false,
        (status, body) => panic!("the raced read answered {status} {body}"),
    };
    // Every read after the invalidation answered is a 404 at version 2, never the older value.
    for _ in 0..20 {
        let answer = harness::get(http, &url, &[]).await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            answer
                .headers()
                .get("hotsplit-version")
                .unwrap()
                .to_str()
                .unwrap(),
            "2"
        );
    }
    ran
}

/// A restart of the master that lost the copies' writes, hidden while the entries are young,
/// shows up once they age out: the reader gets what Redis holds now (nothing: a 404, never a
/// value other than the one it saw), the rollback is counted once, and the copy's entry and
/// high-water record are dropped, so the key's versions may start lower again and are cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restart_that_lost_writes_shows_up_as_one_counted_rollback() {
    let server = Standalone::start().expect("redis-server");
    let service = Service::start(config(&server.url(), 4, "lenient", "")).await;
    let other = Service::start(config(&server.url(), 4, "lenient", "")).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:lost", 5, "five"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/nc:lost?client=alice");
    poll(
        "alice's read answered from memory",
        Duration::from_secs(10),
        || async {
            let seen = read(&http, &url, &[]).await;
            assert_eq!(seen.body, "five", "{}", seen.route);
            is_near(&seen)
        },
    )
    .await;
    // The master restarts with an empty dataset: the write of 5 is lost.
    tokio::task::block_in_place(|| {
        server.node.shutdown_nosave().expect("SHUTDOWN NOSAVE");
        server.node.restart().expect("restart");
    });
    // While the entry is young alice is still answered five; once it ages out, the loss shows.
    wait_for_the_lost_write_to_show(&http, &url).await;
    let rollbacks = || async {
        sample(
            &metrics_text(&http, base).await,
            "hotsplit_near_cache_rollbacks_total",
        )
    };
    assert_eq!(rollbacks().await, 1.0, "the rollback is counted");
    // The key starts again at a lower version, written through the other instance once it has
    // reconnected too.
    let other_url = format!("{}/v1/keys/nc:lost?client=alice", other.base);
    poll(
        "the other instance reconnected",
        Duration::from_secs(30),
        || async { read(&http, &other_url, &[]).await.status == StatusCode::NOT_FOUND },
    )
    .await;
    publish_expecting(
        &http,
        &other.base,
        Edit::new("nc:lost", 2, "two"),
        StatusCode::OK,
    )
    .await;
    // This instance answered five: alice, naming a client, is refused the set-back two (a
    // reader with a floor never goes back; `ops::rollback`), with the cause named.
    crate::route::assert_refused_as_set_back(&read(&http, &url, &[]).await, 5);
    // A publish above what was lost serves alice again, from memory.
    publish_expecting(
        &http,
        &other.base,
        Edit::new("nc:lost", 6, "six"),
        StatusCode::OK,
    )
    .await;
    poll(
        "six answered from memory",
        Duration::from_secs(10),
        || async {
            let answer = read(&http, &url, &[]).await;
            if answer.status == StatusCode::SERVICE_UNAVAILABLE {
                // The near cache may still hold two for up to its max age.
                return false;
            }
            assert_eq!(
                (answer.status, answer.body.as_str()),
                (StatusCode::OK, "six"),
                "{}",
                answer.route
            );
            is_near(&answer)
        },
    )
    .await;
    assert_eq!(
        rollbacks().await,
        1.0,
        "a fill below the dropped record is cached, not counted again"
    );
    service.stop().await;
    other.stop().await;
}

/// Waits until `url` answers the lost write's 404; until then it answers five (or a server
/// error while the service reconnects), nothing else.
async fn wait_for_the_lost_write_to_show(http: &reqwest::Client, url: &str) {
    poll(
        "the lost write shows up as a 404",
        Duration::from_secs(30),
        || async {
            let answer = read(http, url, &[]).await;
            match answer.status {
                StatusCode::OK => {
                    assert_eq!(answer.body, "five", "{}", answer.route);
                    false
                }
                StatusCode::NOT_FOUND => true,
                // The service reconnecting to the restarted server.
                status if status.is_server_error() => false,
                status => panic!("{status}: {} {}", answer.body, answer.route),
            }
        },
    )
    .await;
}

/// The embedded store is memory already: its reads never use the near cache, though
/// `[near_cache] enabled` is on by default and the class has a near-cache max age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_near_cache_is_off_on_the_embedded_store() {
    let service = Service::start(config_from_toml(&format!(
        "[[family]]\nprefix = \"nc:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"patient\"\n{PATIENT}"
    )))
    .await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:mem", 1, "one"), StatusCode::OK).await;
    for _ in 0..3 {
        let answer = read(&http, &format!("{base}/v1/keys/nc:mem?client=alice"), &[]).await;
        assert_eq!(answer.body, "one");
        assert!(!is_near(&answer), "{}", answer.route);
        assert!(
            answer.served_by.contains("embedded"),
            "{}",
            answer.served_by
        );
    }
    let view = get_json(&http, &format!("{base}/v1/near-cache")).await;
    assert_eq!(view["enabled"], false, "{view}");
    assert_eq!(view["entries"], 0, "{view}");
    assert_eq!(view["hits"], 0, "{view}");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_past_its_exp_is_not_served() {
    let server = harness::shared_standalone();
    let config = config_from_toml(&format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"{}\"\n[[family]]\nprefix = \"ncx:\"\ncopies = 2\nttl = \"700ms\"\ndefault_class = \"lenient\"\n[classes.lenient]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"30s\"\nnear_cache_max_age = \"30s\"\n",
        server.url(),
        harness::command_timeout_toml()
    ));
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("ncx:gone", 1, "one"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/ncx:gone?client=alice");
    let answer = read(&http, &url, &[]).await;
    assert_eq!((answer.body.as_str(), is_near(&answer)), ("one", true));
    let exp: u64 = (0..2)
        .map(|copy| {
            hgetall(server.node.port(), &format!("ncx:gone#{copy}"))["exp"]
                .parse::<u64>()
                .unwrap()
        })
        .max()
        .unwrap();
    // Past every copy's exp, with the class accepting 30 s old entries: not served.
    poll("the clock passes exp", Duration::from_secs(5), || async {
        hotsplit::store::now_unix_ms() > exp
    })
    .await;
    let answer = read(&http, &url, &[]).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.route);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_misses_on_one_copy_make_one_redis_read() {
    let server = Standalone::start().expect("redis-server");
    let port = server.node.port();
    // An entry that stays young for the whole burst: every read after the fill is a hit, so
    // any second Redis read would be a second fill.
    let config = config(&server.url(), 4, "patient", PATIENT);
    let store = harness::redis_store(&server.url(), Duration::from_secs(2)).await;
    // The writer is another instance: the reader's cache holds nothing for the key.
    let writer =
        hotsplit::server::app_state(&config, store.clone(), Metrics::new()).expect("writer");
    let writer = hotsplit::http::router(writer);
    let written = writer
        .oneshot(
            Request::put("/v1/keys/nc:herd?version=1")
                .body(Body::from("herd"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(written.status(), StatusCode::OK);
    let reader = hotsplit::http::router(
        hotsplit::server::app_state(&config, store, Metrics::new()).expect("reader"),
    );
    let before = hmget_calls(port);
    let reads = (0..1000).map(|_| {
        let reader = reader.clone();
        async move {
            let answer = reader
                .oneshot(
                    Request::get("/v1/keys/nc:herd?client=alice")
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            answer.status()
        }
    });
    let statuses = futures_util::future::join_all(reads).await;
    let redis_reads = hmget_calls(port) - before;
    let view: Value = {
        let answer = reader
            .oneshot(Request::get("/v1/near-cache").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let bytes = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    };
    let (misses, coalesced, hits) = (
        view["misses"].as_u64().unwrap(),
        view["coalesced"].as_u64().unwrap(),
        view["hits"].as_u64().unwrap(),
    );
    let refused: Vec<_> = statuses
        .iter()
        .filter(|status| **status != StatusCode::OK)
        .collect();
    assert!(
        refused.is_empty(),
        "{} not answered: {refused:?}; {view}",
        refused.len()
    );
    assert_eq!(redis_reads, 1, "one Redis read for 1,000 misses: {view}");
    assert_eq!((misses, misses + coalesced + hits), (1, 1000), "{view}");
}

/// Fails if the copy's floor lives only in its entry and exact high-water record: a churn of
/// distinct keys through a tiny cache evicts both, and the next fill, from a replica within
/// budget but paused at version 1, answers 1 to a reader with no floor after this instance
/// served it 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_goes_back_after_churn_evicts_the_entry_and_its_record() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let mut config = config(
        &group.url(),
        1,
        "lenient",
        "[near_cache]\nmax_bytes = 65536\n",
    );
    config.store.replicas = vec![replica.url()];
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("nc:hot", 1, "one"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/nc:hot?client=alice");
    poll(
        "a replica fill of version 1",
        Duration::from_secs(10),
        || async {
            let answer = read(&http, &url, &[]).await;
            answer.body == "one" && answer.served_by.ends_with("role=replica")
        },
    )
    .await;
    // The replica stops applying the replication stream and keeps 1; within the 30 s budget it
    // stays the class's source.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "60000", "WRITE"]).expect("CLIENT PAUSE");
    publish_expecting(&http, base, Edit::new("nc:hot", 2, "two"), StatusCode::OK).await;
    let answer = read(&http, &url, &[]).await;
    assert_eq!(answer.body, "two", "{} {}", answer.served_by, answer.route);
    // A churn of distinct keys through a cache of about 140 entries and 100 records, each key
    // written three times (each later write replaces its entry, which leaves a record) and read
    // twice, so that its entry and record are as hot as the hot copy's (filled twice, written
    // twice, read). Which entries the cache lets go is its own (hashed) choice, so the churn
    // goes on in rounds, the hot key read after each, until a read's floor came from the
    // sketch: both the entry and the record had gone. No read may ever answer 1.
    let churn_started = std::time::Instant::now();
    let mut sketch_floors = 0;
    for round in 0..16 {
        for n in 0..250 {
            let key = format!("nc:churn-{round}-{n}");
            for version in 1..=3 {
                publish_expecting(&http, base, Edit::new(&key, version, "c"), StatusCode::OK).await;
            }
            for _ in 0..2 {
                read(&http, &format!("{base}/v1/keys/{key}?client=alice"), &[]).await;
            }
        }
        assert!(
            churn_started.elapsed() < Duration::from_secs(50),
            "the churn outlasted the replica's pause: {:?}",
            churn_started.elapsed()
        );
        let answer = read(&http, &url, &[]).await;
        assert_ne!(
            answer.body, "one",
            "went back: {} {}",
            answer.served_by, answer.route
        );
        assert_eq!(answer.body, "two", "{} {}", answer.served_by, answer.route);
        let view = get_json(&http, &format!("{base}/v1/near-cache")).await;
        sketch_floors = view["high_water_sketch_floors"].as_u64().unwrap();
        if sketch_floors >= 1 {
            break;
        }
    }
    assert!(
        sketch_floors >= 1,
        "no read found the entry and the record gone"
    );
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_bound_holds_under_a_flood_of_distinct_keys() {
    let server = harness::shared_standalone();
    let max_bytes = 65_536;
    let config = config(
        &server.url(),
        2,
        "advisory",
        &format!("[near_cache]\nmax_bytes = {max_bytes}\n"),
    );
    let store = harness::redis_store(&server.url(), Duration::from_secs(2)).await;
    let app = hotsplit::http::router(
        hotsplit::server::app_state(&config, store, Metrics::new()).expect("state"),
    );
    let value = "v".repeat(64);
    let view = |app: axum::Router| async move {
        let answer = app
            .oneshot(Request::get("/v1/near-cache").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let bytes = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .unwrap()
            .to_bytes();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    };
    for n in 0..1500 {
        let written = app
            .clone()
            .oneshot(
                Request::put(format!("/v1/keys/nc:flood-{n}?version=1"))
                    .body(Body::from(value.clone()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(written.status(), StatusCode::OK);
        let read = app
            .clone()
            .oneshot(
                Request::get(format!("/v1/keys/nc:flood-{n}?client=c"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(read.status(), StatusCode::OK);
        if n % 100 == 99 {
            let view = view(app.clone()).await;
            assert!(view["bytes"].as_u64().unwrap() <= max_bytes, "{view}");
        }
    }
    let view = view(app.clone()).await;
    assert!(view["entries"].as_u64().unwrap() > 0, "{view}");
    assert!(view["bytes"].as_u64().unwrap() <= max_bytes, "{view}");
    assert!(view["high_water_records"].as_u64().unwrap() > 0, "{view}");
}

/// The `advisory` class's near-cache max age as `/v1/classes` lists it (`None` when off or
/// unreadable).
async fn advisory_near_max_age_ms(http: &reqwest::Client, base: &str) -> Option<u64> {
    let classes = get_json(http, &format!("{base}/v1/classes")).await;
    classes
        .as_array()?
        .iter()
        .find(|class| class["name"] == "advisory")?["near_cache_max_age_ms"]
        .as_u64()
}

/// The age bound of a near-cache answer (`;age_ms=N` of `Hotsplit-Route`), `None` for an answer
/// from Redis.
fn near_age_ms(read: &Read) -> Option<u64> {
    read.route
        .split_once(";source=near-cache;age_ms=")?
        .1
        .split(';')
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lowers_the_budget_keeps_every_cached_answer_within_the_new_max_age() {
    let server = harness::shared_standalone();
    let dir = tempfile::tempdir().unwrap();
    // The advisory class with `budget`, its near-cache max age left to the default (half the
    // budget) or set to `max_age`.
    let config = |budget: &str, max_age: Option<&str>| {
        let max_age = max_age
            .map(|age| format!("near_cache_max_age = \"{age}\"\n"))
            .unwrap_or_default();
        format!(
            "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[classes.advisory]\nroute = \"replica\"\nreason = \"shown to people\"\nstaleness_budget = \"{budget}\"\n{max_age}[[family]]\nprefix = \"nr:\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"advisory\"\n",
            url = server.url(),
            timeout = harness::command_timeout_toml()
        )
    };
    let binary = Binary::start(dir.path(), "near-reload", &config("4s", None)).await;
    let base = binary.base.clone();
    let path = dir.path().join("near-reload.toml");
    // `Binary::spawn` wrote its `[server]` section (listen, grace) before the config; a reload
    // keeps it.
    let written = std::fs::read_to_string(&path).unwrap();
    let server_section = &written[..written.find("[store]").unwrap()];
    let reload = |budget: &str, max_age: Option<&str>| {
        let text = format!("{server_section}{}", config(budget, max_age));
        std::fs::write(&path, text).unwrap();
        binary.signal(libc::SIGHUP);
    };
    let http = reqwest::Client::new();
    assert_eq!(advisory_near_max_age_ms(&http, &base).await, Some(2_000));
    publish_expecting(&http, &base, Edit::new("nr:k", 1, "one"), StatusCode::OK).await;
    let url = format!("{base}/v1/keys/nr:k?client=alice");

    // The entry ages past what the lower budget will allow, still served under the 2 s max age.
    poll(
        "a near-cache answer 300 ms old",
        Duration::from_secs(10),
        || async { near_age_ms(&read(&http, &url, &[]).await).is_some_and(|age| age >= 300) },
    )
    .await;

    // A budget of 200 ms: the default max age follows it down to 100 ms, and from the reload on
    // no answer from the cache is older than that, the entry filled under the old one included.
    reload("200ms", None);
    poll(
        "the new max age is listed",
        Duration::from_secs(10),
        || async { advisory_near_max_age_ms(&http, &base).await == Some(100) },
    )
    .await;
    let mut from_cache = 0;
    for _ in 0..200 {
        let answer = read(&http, &url, &[]).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::OK, "one")
        );
        if let Some(age) = near_age_ms(&answer) {
            assert!(
                age <= 100,
                "served {age} ms old after the reload: {}",
                answer.route
            );
            from_cache += 1;
        }
    }
    assert!(from_cache > 0, "the cache stays on at the new max age");

    // A max age set above the new budget is a config error: the file is refused whole and the
    // 100 ms max age stays.
    reload("100ms", Some("150ms"));
    let log = dir.path().join("near-reload.log");
    poll("the reload is refused", Duration::from_secs(10), || async {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("config reload refused"))
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let refused = text
        .lines()
        .find(|line| line.contains("config reload refused"))
        .unwrap();
    assert!(
        refused.contains("classes.advisory.near_cache_max_age"),
        "{refused}"
    );
    assert_eq!(advisory_near_max_age_ms(&http, &base).await, Some(100));
    for _ in 0..50 {
        let answer = read(&http, &url, &[]).await;
        assert!(
            near_age_ms(&answer).is_none_or(|age| age <= 100),
            "{}",
            answer.route
        );
    }
}
