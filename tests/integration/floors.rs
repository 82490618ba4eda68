//! Readers never go back in time, over real Redis: every read served away from where the
//! reader's next read goes leaves a floor (moves caused by a floor, a `no-replica` move, a class
//! switch, a tombstone's 404), a replica that has not received a key is not its absence under a
//! floor, `If-None-Match` is a floor for tombstones, and a flood of client ids does not evict
//! another client's floor.
//!
//! A "lagging source" is a replica copy set back by hand (`replica-read-only no`, then `HSET`)
//! while the replica's measured lag is within budget: what a replica behind by less than its
//! budget serves.

use std::time::Duration;

use hotsplit_devcluster::{self as devcluster, PrimaryReplica};
use reqwest::StatusCode;

use crate::harness::{
    self, config_with_family, metrics_text, poll, problem, publish_expecting, shared_standalone,
    Edit, Service,
};
use crate::route::{put, read, standalone_config, wait_for_lag, wait_for_read, Read};

/// Families with a long pin window, so a floor outlives the test's steps: `flo:` reads
/// replicas under the 30 s `lenient` budget, `del:` under the 250 ms `advisory` budget.
const LONG_WINDOWS: &str = "[[family]]\nprefix = \"flo:\"\ncopies = 4\ndefault_class = \"lenient\"\npin_window = \"30s\"\n\n[[family]]\nprefix = \"del:\"\ncopies = 4\ndefault_class = \"advisory\"\npin_window = \"30s\"\n";

/// The copy of `key` (of 4 copies) that `client` reads.
fn copy_key(key: &str, client: &str) -> String {
    format!("{key}#{}", hotsplit::affinity::copy_index(client, 4))
}

/// A client other than `client` that reads the same copy of a 4-copy key.
fn same_copy_as(client: &str, prefix: &str) -> String {
    harness::client_of_copy(prefix, hotsplit::affinity::copy_index(client, 4), 4)
}

/// Sets the replica's copy `copy_key` back to `version` with `body` (a value), by hand.
fn set_replica_copy(port: u16, copy_key: &str, version: &str, body: &str) {
    devcluster::cli(port, &["CONFIG", "SET", "replica-read-only", "no"]).expect("CONFIG SET");
    devcluster::cli(
        port,
        &["HSET", copy_key, "ver", version, "val", body, "tomb", "0"],
    )
    .expect("HSET on the replica");
}

/// Polls until the replica's copy `copy_key` holds `version`.
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

/// Asserts a read's status, and for a 200 its body, serving role and route (an error carries
/// no `Hotsplit-Served-By` nor `Hotsplit-Route`).
fn assert_read(read: &Read, status: StatusCode, body: &str, role: &str, route: &str) {
    assert_eq!(read.status, status, "{} {}", read.body, read.route);
    if status != StatusCode::OK {
        return;
    }
    assert_eq!(read.body, body);
    assert!(
        read.served_by.ends_with(&format!("role={role}")),
        "{} (route {})",
        read.served_by,
        read.route
    );
    assert_eq!(read.route, route);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_below_if_none_match_is_never_a_404() {
    let config = config_with_family(Some(&shared_standalone().url()), "inm:", 4);
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    let port = shared_standalone().node.port();
    publish_expecting(&http, base, Edit::new("inm:1", 7, "seven"), StatusCode::OK).await;
    // A late invalidate at 3 tombstoned every copy (as when copies expired early): set by hand.
    for copy in 0..4 {
        devcluster::cli(
            port,
            &[
                "HSET",
                &format!("inm:1#{copy}"),
                "ver",
                "3",
                "val",
                "",
                "tomb",
                "1",
            ],
        )
        .expect("HSET");
    }
    let url = format!("{base}/v1/keys/inm:1?client=alice");
    // A reader holding 7 is not told the key was deleted at 3: If-None-Match is its floor, as
    // min_version is.
    let answer = harness::get(&http, &url, &[("if-none-match", "\"7\"")]).await;
    problem(
        answer,
        StatusCode::SERVICE_UNAVAILABLE,
        "below_version_floor",
        &url,
    )
    .await;
    let floored = format!("{url}&min_version=7");
    let answer = harness::get(&http, &floored, &[]).await;
    problem(
        answer,
        StatusCode::SERVICE_UNAVAILABLE,
        "below_version_floor",
        &floored,
    )
    .await;
    // A reader without a floor gets the tombstone's 404.
    let answer = harness::get(&http, &url, &[]).await;
    problem(answer, StatusCode::NOT_FOUND, "not_found", &url).await;
    // With the siblings back at 7, the reader holding 7 gets "not modified" from them.
    let own = copy_key("inm:1", "alice");
    for copy in (0..4).map(|copy| format!("inm:1#{copy}")) {
        if copy != own {
            devcluster::cli(
                port,
                &["HSET", &copy, "ver", "7", "val", "seven", "tomb", "0"],
            )
            .expect("HSET");
        }
    }
    let answer = harness::get(&http, &url, &[("if-none-match", "\"7\"")]).await;
    assert_eq!(answer.status(), StatusCode::NOT_MODIFIED);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_write_reads_through_a_replica_that_has_not_received_it() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let service = Service::start(standalone_config(&group, LONG_WINDOWS)).await;
    let other = Service::start(standalone_config(&group, LONG_WINDOWS)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_expecting(
        &http,
        &base,
        Edit::new("flo:ready", 1, "one"),
        StatusCode::OK,
    )
    .await;
    for instance in [&service.base, &other.base] {
        wait_for_read(
            &http,
            &format!("{instance}/v1/keys/flo:ready?client=bob"),
            "the replica serves",
            Duration::from_secs(10),
            |read| read.body == "one" && read.served_by.ends_with("role=replica"),
        )
        .await;
    }
    // The replica holds back replication (within the 30 s budget); a new key is written.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    let written = put(
        &http,
        format!("{base}/v1/keys/flo:new?version=1&client=alice"),
        "new",
        &[],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    // The writer reads its write, not a 404 from the replica that has not received it.
    let answer = read(&http, &format!("{base}/v1/keys/flo:new?client=alice"), &[]).await;
    assert_read(
        &answer,
        StatusCode::OK,
        "new",
        "primary",
        "class=lenient;reason=own-write",
    );
    // A reader with a floor, through another instance, gets it too.
    let answer = read(
        &http,
        &format!("{}/v1/keys/flo:new?client=bob&min_version=1", other.base),
        &[],
    )
    .await;
    assert_read(
        &answer,
        StatusCode::OK,
        "new",
        "primary",
        "class=lenient;reason=version-floor",
    );
    // A reader without a floor is served by its replica as it is.
    let answer = read(
        &http,
        &format!("{}/v1/keys/flo:new?client=carol", other.base),
        &[],
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    service.stop().await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_caused_by_floors_classes_and_tombstones_leave_floors_against_a_lagging_source() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let service = Service::start(standalone_config(&group, LONG_WINDOWS)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let alice = format!("{base}/v1/keys/flo:1?client=alice");
    let bob_id = same_copy_as("alice", "bob");
    let bob = format!("{base}/v1/keys/flo:1?client={bob_id}");
    let carol = format!("{base}/v1/keys/del:1?client=carol");
    publish_expecting(&http, &base, Edit::new("flo:1", 1, "one"), StatusCode::OK).await;
    publish_expecting(&http, &base, Edit::new("del:1", 1, "one"), StatusCode::OK).await;
    for url in [&alice, &carol] {
        wait_for_read(
            &http,
            url,
            "the replica serves 1",
            Duration::from_secs(10),
            |read| read.body == "one" && read.served_by.ends_with("role=replica"),
        )
        .await;
    }

    // Replication held back. Alice writes 2, someone else 3; carol's key is deleted at 2.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    alice_writes_2_someone_3_and_carols_key_is_deleted(&http, &base).await;
    // Alice's own floor (2) moves her read to the primary, which serves 3.
    assert_read(
        &read(&http, &alice, &[]).await,
        StatusCode::OK,
        "three",
        "primary",
        "class=lenient;reason=own-write",
    );
    // A lag breach moves carol's read to the primary, which answers the tombstone's 404.
    wait_for_lag(
        &http,
        &base,
        &replica.addr(),
        "the replica's lag passes 300 ms",
        |lag| lag > 300.0,
    )
    .await;
    assert_read(
        &read(&http, &carol, &[]).await,
        StatusCode::NOT_FOUND,
        "",
        "primary",
        "class=advisory;reason=lag-breach",
    );

    // The replica catches up; bob reads through the primary class once.
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    wait_replica_holds(replica.port(), &copy_key("flo:1", "alice"), "3").await;
    wait_replica_holds(replica.port(), &copy_key("del:1", "carol"), "2").await;
    assert_read(
        &read(&http, &format!("{bob}&class=primary"), &[]).await,
        StatusCode::OK,
        "three",
        "primary",
        "class=primary;reason=class",
    );
    // Then the replica's copies go back (a source behind within its budget): alice's and bob's
    // to 2, carol's to the value 1 below the tombstone.
    set_replica_copy(replica.port(), &copy_key("flo:1", "alice"), "2", "two");
    set_replica_copy(replica.port(), &copy_key("del:1", "carol"), "1", "one");
    wait_for_lag(
        &http,
        &base,
        &replica.addr(),
        "the replica is back within the budget",
        |lag| lag < 200.0,
    )
    .await;
    // None of them goes back: each was shown a version the replica no longer holds.
    for url in [&alice, &bob] {
        assert_read(
            &read(&http, url, &[]).await,
            StatusCode::OK,
            "three",
            "primary",
            "class=lenient;reason=version-floor",
        );
    }
    assert_read(
        &read(&http, &carol, &[]).await,
        StatusCode::NOT_FOUND,
        "",
        "primary",
        "class=advisory;reason=version-floor",
    );
    // A reader that never left the replica is served there, as it is.
    let dave = same_copy_as("alice", "dave");
    let answer = read(&http, &format!("{base}/v1/keys/flo:1?client={dave}"), &[]).await;
    assert_read(
        &answer,
        StatusCode::OK,
        "two",
        "replica",
        "class=lenient;reason=class",
    );
    service.stop().await;
}

/// Alice writes 2 of `flo:1`, someone else 3, and `del:1` is deleted at 2, through `base`.
async fn alice_writes_2_someone_3_and_carols_key_is_deleted(http: &reqwest::Client, base: &str) {
    let written = put(
        http,
        format!("{base}/v1/keys/flo:1?version=2&client=alice"),
        "two",
        &[],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    publish_expecting(http, base, Edit::new("flo:1", 3, "three"), StatusCode::OK).await;
    let deleted = http
        .delete(format!("{base}/v1/keys/del:1?version=2"))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(deleted.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_moved_by_a_failed_replica_leaves_a_floor() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let service = Service::start(standalone_config(&group, LONG_WINDOWS)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let erin = format!("{base}/v1/keys/flo:2?client=erin");
    publish_expecting(&http, &base, Edit::new("flo:2", 1, "one"), StatusCode::OK).await;
    publish_expecting(&http, &base, Edit::new("flo:2", 2, "two"), StatusCode::OK).await;
    wait_for_read(
        &http,
        &erin,
        "the replica serves 2",
        Duration::from_secs(10),
        |read| read.body == "two" && read.served_by.ends_with("role=replica"),
    )
    .await;
    // The replica refuses copy reads (heartbeat reads still work, so its lag stays measured):
    // the primary serves with reason `no-replica`.
    devcluster::cli(replica.port(), &["ACL", "SETUSER", "default", "-hmget"]).expect("ACL");
    assert_read(
        &read(&http, &erin, &[]).await,
        StatusCode::OK,
        "two",
        "primary",
        "class=lenient;reason=no-replica",
    );
    devcluster::cli(replica.port(), &["ACL", "SETUSER", "default", "+hmget"]).expect("ACL");
    set_replica_copy(replica.port(), &copy_key("flo:2", "erin"), "1", "one");
    assert_read(
        &read(&http, &erin, &[]).await,
        StatusCode::OK,
        "two",
        "primary",
        "class=lenient;reason=version-floor",
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_client_ids_does_not_evict_another_clients_floor() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let extra = format!("{LONG_WINDOWS}\n[route]\nmax_pins = 64\n");
    let service = Service::start(standalone_config(&group, &extra)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let alice = format!("{base}/v1/keys/flo:3?client=alice");
    publish_expecting(&http, &base, Edit::new("flo:3", 1, "one"), StatusCode::OK).await;
    wait_for_read(
        &http,
        &alice,
        "the replica serves 1",
        Duration::from_secs(10),
        |read| read.body == "one" && read.served_by.ends_with("role=replica"),
    )
    .await;
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"]).expect("CLIENT PAUSE");
    let written = put(
        &http,
        format!("{base}/v1/keys/flo:3?version=2&client=alice"),
        "two",
        &[],
    )
    .await;
    assert_eq!(written.status(), StatusCode::OK);
    // One caller re-sends the current version under 300 random client ids: each would hold a
    // floor, in a table of 64.
    for n in 0..300 {
        let flood = put(
            &http,
            format!("{base}/v1/keys/flo:3?version=2&client=flood-{n}"),
            "two",
            &[],
        )
        .await;
        assert_eq!(flood.status(), StatusCode::OK);
    }
    // Alice still reads her own write, not the replica's 1.
    assert_read(
        &read(&http, &alice, &[]).await,
        StatusCode::OK,
        "two",
        "primary",
        "class=lenient;reason=own-write",
    );
    let metrics = metrics_text(&http, &base).await;
    let evicted: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("hotsplit_route_floor_evictions_total "))
        .and_then(|count| count.trim().parse().ok())
        .expect("the eviction counter is exported");
    assert!(evicted >= 300 - 63, "{evicted}");
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    service.stop().await;
}

/// The warning `ops::rollback` logs for each refusal of a reader naming a client whose copies
/// were set back.
const SET_BACK_WARNING: &str = "a copy went back below a version this instance served";

/// A primary's copy set back by hand below what this instance served a reader naming a client,
/// inside the family's pin window: the seen floor that read left refuses the next one before
/// the rollback guard runs, and that refusal too names the set-back and is logged, as the
/// guard's own are (a split brain healed within the window did this). A floor the caller sent
/// above everything this instance served is the caller's own: refused without that cause. A
/// publish above what was lost serves the reader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_set_back_inside_a_readers_pin_window_is_refused_with_its_cause_and_logged() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let dir = tempfile::tempdir().expect("a temp dir");
    // A long pin window, so the floor alice's read leaves outlives every step below.
    let config = format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"{}\"\n[heal]\nspool_dir = {:?}\n[[family]]\nprefix = \"rb:\"\ncopies = 1\nttl = \"10m\"\npin_window = \"60s\"\n{}",
        group.url(),
        group.replicas[0].url(),
        harness::command_timeout_toml(),
        dir.path().join("spool").display().to_string(),
        crate::route::NEAR_CACHE_OFF,
    );
    let binary = harness::Binary::start(dir.path(), "rb", &config).await;
    let base = binary.base.clone();
    let http = reqwest::Client::new();
    publish_expecting(&http, &base, Edit::new("rb:k", 5, "five"), StatusCode::OK).await;
    let alice = format!("{base}/v1/keys/rb:k?client=alice");
    // Served by the primary while the instance knows a replica: the read leaves alice a seen
    // floor of 5 (`read::path`'s `remember`).
    let served = read(&http, &alice, &[]).await;
    assert_eq!(
        (served.status, served.body.as_str()),
        (StatusCode::OK, "five")
    );
    assert!(
        served.served_by.ends_with("role=primary"),
        "{}",
        served.served_by
    );
    // The failover's loss, by hand: the one copy on the primary goes back to 4.
    devcluster::cli(
        group.primary.port(),
        &["HSET", "rb:k#0", "ver", "4", "val", "four", "tomb", "0"],
    )
    .expect("HSET on the primary");
    crate::route::assert_refused_as_set_back(&read(&http, &alice, &[]).await, 5);
    poll("the refusal is logged", Duration::from_secs(10), || async {
        binary.log_text().matches(SET_BACK_WARNING).count() == 1
    })
    .await;
    // A floor of alice's own above what this instance served: refused for that floor only.
    let own = read(&http, &format!("{alice}&min_version=9"), &[]).await;
    assert_eq!(own.status, StatusCode::SERVICE_UNAVAILABLE, "{}", own.body);
    assert!(
        own.body.contains("below_version_floor") && !own.body.contains("set back"),
        "{}",
        own.body
    );
    // A reader naming no floor reads what the copy holds.
    let plain = read(&http, &format!("{base}/v1/keys/rb:k?copy=0"), &[]).await;
    assert_eq!(
        (plain.status, plain.body.as_str()),
        (StatusCode::OK, "four")
    );
    publish_expecting(&http, &base, Edit::new("rb:k", 6, "six"), StatusCode::OK).await;
    let again = read(&http, &alice, &[]).await;
    assert_eq!((again.status, again.body.as_str()), (StatusCode::OK, "six"));
    assert_eq!(
        binary.log_text().matches(SET_BACK_WARNING).count(),
        1,
        "one warning for the one refusal: {}",
        binary.log_text()
    );
}
