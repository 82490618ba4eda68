//! Secured Redis: TLS (a standalone server with a CA file only, a 3-master/3-replica cluster
//! with mutual TLS), ACL users (full, the README's least-privilege `serve` user, the read-only
//! `audit` user, users missing one permission), a wrong password and an untrusted CA, and the
//! same ACL tests on Valkey 8 (`HOTSPLIT_VALKEY_SERVER`, which `scripts/test.sh` provides).
//!
//! Certificates come from `tls_pki` (rcgen, in-process): a CA, and one node certificate for
//! `127.0.0.1` (IP SAN) that the servers serve and present on the cluster bus and that clients
//! present for mutual TLS; a second, unrelated CA is the untrusted one. Hostname verification
//! is never turned off.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hotsplit::config::Config;
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{Password, RedisOptions, RedisStore, RedisUrl};
use hotsplit::store::{now_unix_ms, CopyStore, CopyWrite, Lease, Payload, ScrubStore};
use hotsplit_devcluster::{
    Cluster, ClusterOptions, PrimaryReplica, RedisNode, ServerOptions, Standalone,
};
use reqwest::StatusCode;

use crate::harness::{self, config_from_toml, poll, publish_expecting, Edit, Service};
use crate::tls_pki::pki;

// ---------------------------------------------------------------------------------------------
// The ACLs the README documents, verbatim (the README quotes these lines).
// ---------------------------------------------------------------------------------------------

/// The least-privilege user of `hotsplit serve`, without its password (`>...` is appended).
const SERVE_ACL: &str = "on resetkeys ~*#* ~hotsplit:hb:* resetchannels -@all +fcall +function|load +function|list +function|delete +hmget +hget +hset +hdel +hgetall +eval +pexpireat +pexpire +pttl +incr +get +set +zadd +zrem +zrange +zremrangebyscore +time +del +scan +wait +ping +info +client|id +client|tracking +hello +cluster|info +cluster|slots +cluster|nodes +readonly";

/// The read-only user of `hotsplit audit`, without its password.
const AUDIT_ACL: &str =
    "on resetkeys %R~*#* resetchannels -@all +scan +hmget +hgetall +ping +info +client|id +cluster|info +cluster|nodes +readonly";

/// Every user's password in these tests (never printed by hotsplit, which a test checks).
const PASSWORD: &str = "s3cret-Pa55word";

/// A standalone TLS server that accepts clients without a certificate (CA file only).
fn tls_standalone() -> &'static Standalone {
    static SERVER: OnceLock<Standalone> = OnceLock::new();
    SERVER.get_or_init(|| {
        Standalone::start_with_options(&ServerOptions {
            tls: Some(pki().files.clone()),
            extra_args: vec!["--tls-auth-clients".into(), "optional".into()],
            ..ServerOptions::default()
        })
        .expect("start a tls redis-server")
    })
}

/// A 3-master/3-replica TLS cluster that requires client certificates (mutual TLS).
fn tls_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(ClusterOptions {
            tls: Some(pki().files.clone()),
            ..ClusterOptions::default()
        })
        .expect("start a tls redis cluster")
    })
}

/// The `[store]` lines of the TLS files; `client_cert` adds the certificate and key.
fn tls_store_lines(ca_file: &Path, client_cert: bool) -> String {
    let mut lines = format!("tls_ca_file = {:?}\n", ca_file.display().to_string());
    if client_cert {
        let files = &pki().files;
        lines.push_str(&format!(
            "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
            files.cert_file.display().to_string(),
            files.key_file.display().to_string()
        ));
    }
    lines
}

/// The previous release's function library (`hotsplit`, version 1).
const PREVIOUS_LIBRARY: &str = include_str!("../fixtures/hotsplit-v1.lua");

/// Families for the tests: `sec:` reads primaries (for repair), `secr:` reads replicas,
/// `seca:` has allocated versions (the counter function).
const FAMILIES: &str = "[[family]]\nprefix = \"sec:\"\ncopies = 4\n\n[[family]]\nprefix = \"secr:\"\ncopies = 4\ndefault_class = \"advisory\"\n\n[[family]]\nprefix = \"seca:\"\ncopies = 2\nversioning = \"allocated\"\n";

/// Reads `key` as `client` through `base`; asserts a 200 with `body` and returns
/// `Hotsplit-Served-By`.
async fn read_value(http: &reqwest::Client, base: &str, key: &str, client: &str) -> String {
    let url = format!("{base}/v1/keys/{key}?client={client}");
    let answer = harness::get(http, &url, &[]).await;
    let status = answer.status();
    let served_by = answer
        .headers()
        .get("hotsplit-served-by")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = answer.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
    assert_eq!(text, "v1", "GET {url}");
    served_by
}

/// Polls advisory reads of `key` until a replica serves one.
async fn wait_for_replica_read(http: &reqwest::Client, base: &str, key: &str) {
    poll(
        &format!("an advisory read of {key} served by a replica"),
        Duration::from_secs(15),
        || async {
            let url = format!("{base}/v1/keys/{key}?client=r");
            let answer = harness::get(http, &url, &[]).await;
            answer
                .headers()
                .get("hotsplit-served-by")
                .and_then(|value| value.to_str().ok())
                .is_some_and(|served| served.ends_with("role=replica"))
                && answer.status() == StatusCode::OK
        },
    )
    .await;
}

/// Reads `key` (a primary-class key holding `v1`) until one read is sent on the store's direct
/// connection (`store::redis::direct`), which is opened with the same TLS and user as the
/// client's: a refused handshake or `AUTH` would keep every read on the client.
async fn wait_for_direct_read(http: &reqwest::Client, base: &str, key: &str) {
    poll(
        &format!("a read of {key} sent on the direct connection"),
        Duration::from_secs(15),
        || async {
            read_value(http, base, key, "d").await;
            let metrics = harness::metrics_text(http, base).await;
            harness::sample(
                &metrics,
                r#"hotsplit_store_direct_reads_total{outcome="sent"}"#,
            ) > 0
        },
    )
    .await;
}

/// Asserts that the service at `base` counted no store error of kind `other`, which is where
/// a `NOPERM` refusal lands: a background task (lag monitor, topology refresh) refused by the
/// ACL shows up here, not in an answer.
async fn assert_no_refused_commands(http: &reqwest::Client, base: &str) {
    let metrics = harness::metrics_text(http, base).await;
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("hotsplit_store_errors_total{kind=\"other\"}"))
        .filter(|line| !line.ends_with(" 0"))
        .collect();
    assert!(refused.is_empty(), "store errors: {refused:?}");
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_standalone_with_a_ca_file_publishes_and_reads() {
    let server = tls_standalone();
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let text = format!(
        "[store]\nredis = {:?}\n{}command_timeout = \"1s\"\n{FAMILIES}",
        server.url(),
        tls_store_lines(&pki().files.ca_file, false)
    );
    let service = Service::start(config_from_toml(&text)).await;
    let http = reqwest::Client::new();
    publish_expecting(
        &http,
        &service.base,
        Edit::new("sec:tls1", 1, "v1"),
        StatusCode::OK,
    )
    .await;
    let served_by = read_value(&http, &service.base, "sec:tls1", "a").await;
    assert!(served_by.ends_with("role=primary"), "{served_by}");
    wait_for_direct_read(&http, &service.base, "sec:tls1").await;
    // The copy really is on the TLS server (whose only port speaks TLS).
    let stored = server
        .node
        .cli(&["HGET", "sec:tls1#0", "val"])
        .expect("HGET");
    assert_eq!(stored, "v1");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_with_client_certificates_publishes_reads_replicas_waits_and_audits() {
    let cluster = tls_cluster();
    assert!(cluster.url().starts_with("rediss-cluster://"));
    // As the least-privilege user, so the cluster's own commands (CLUSTER SLOTS, READONLY, …)
    // are checked against the README's ACL too.
    create_users(&cluster.nodes().iter().collect::<Vec<_>>());
    let url = cluster.url().replacen(
        "rediss-cluster://",
        &format!("rediss-cluster://hotsplit:{PASSWORD}@"),
        1,
    );
    let text = format!(
        "[store]\nredis = {url:?}\n{}command_timeout = \"1s\"\n{FAMILIES}",
        tls_store_lines(&pki().files.ca_file, true)
    );
    let service = Service::start(config_from_toml(&text)).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    // Nodes discovered with CLUSTER SLOTS and the data client; the per-replica clients and the lag monitor: an advisory read served by a replica.
    publish_expecting(
        &http,
        &base,
        Edit::new("secr:tlsc", 1, "v1"),
        StatusCode::OK,
    )
    .await;
    wait_for_replica_read(&http, &base, "secr:tlsc").await;
    // The WAIT connection, once every replica is known and measured.
    poll(
        "every replica's lag is known",
        Duration::from_secs(15),
        || async {
            let lines: serde_json::Value = match http.get(format!("{base}/v1/lag")).send().await {
                Ok(answer) => answer.json().await.unwrap_or_default(),
                Err(_) => return false,
            };
            lines.as_array().is_some_and(|lines| {
                lines.len() == 3 && lines.iter().all(|line| line["lag_ms"]["now"].is_number())
            })
        },
    )
    .await;
    let synced = http
        .put(format!(
            "{base}/v1/keys/sec:tlsc?version=1&sync_replicas=1&sync_timeout_ms=2000"
        ))
        .body("v1")
        .send()
        .await
        .expect("PUT");
    let status = synced.status();
    let report: serde_json::Value = synced.json().await.expect("report");
    assert_eq!(status, StatusCode::OK, "{report}");
    for line in report["outcomes"].as_array().expect("outcomes") {
        assert_eq!(line["replicas_acked"], 1, "{report}");
    }
    for client in ["a", "b", "c"] {
        let served_by = read_value(&http, &base, "sec:tlsc", client).await;
        assert!(served_by.ends_with("role=primary"), "{served_by}");
    }
    wait_for_direct_read(&http, &base, "sec:tlsc").await;
    assert_no_refused_commands(&http, &base).await;
    service.stop().await;

    // audit's read-only clients, one per node, over TLS with the client certificate, as the
    // README's read-only user.
    let url = RedisUrl::parse(&cluster.url()).expect("url");
    let mut options = hotsplit::audit::AuditOptions::new(url.target);
    options.security.tls = Some(hotsplit::store::redis::TlsOptions {
        ca_file: Some(pki().files.ca_file.clone()),
        cert_file: Some(pki().files.cert_file.clone()),
        key_file: Some(pki().files.key_file.clone()),
    });
    options.security.username = Some("audit".to_owned());
    options.security.password = Some(Password::new(PASSWORD));
    options.prefix = Some("sec:".to_owned());
    let report = hotsplit::audit::audit(&options, &mut |_| {})
        .await
        .expect("audit over tls as the read-only user");
    assert_eq!((report.primaries, report.replicas), (3, 3));
    assert!(report.unreachable_replicas.is_empty(), "{report:?}");
    assert!(report.figures.replica.copy_reads > 0, "{report:?}");
}

#[test]
fn an_untrusted_ca_stops_startup_with_exit_1_and_a_clear_message() {
    let server = tls_standalone();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("untrusted.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nredis = {:?}\n{}",
            server.url(),
            tls_store_lines(&pki().other_ca, false)
        ),
    )
    .expect("write config");
    let (code, output, took) = run_serve(&["--config", &config.display().to_string()], &[]);
    assert_eq!(code, Some(1), "{output}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {output}");
    assert!(
        output.contains("could not connect to redis at rediss://127.0.0.1:"),
        "{output}"
    );
    assert!(
        output.contains("certificate was not accepted") && output.contains("UnknownIssuer"),
        "the message says why: {output}"
    );
}

// ---------------------------------------------------------------------------------------------
// ACL users, on Redis 7 and Valkey 8
// ---------------------------------------------------------------------------------------------

/// Creates the tests' users on every node of `nodes` (ACLs are per node, never replicated).
fn create_users(nodes: &[&RedisNode]) {
    let users = [
        ("full", "on resetkeys ~* &* +@all".to_owned()),
        ("hotsplit", SERVE_ACL.to_owned()),
        ("audit", AUDIT_ACL.to_owned()),
        ("nofcall", format!("{SERVE_ACL} -fcall")),
        ("noload", format!("{SERVE_ACL} -function|load")),
    ];
    for node in nodes {
        for (user, rules) in &users {
            let mut args = vec!["ACL", "SETUSER", user];
            args.extend(rules.split(' '));
            let password = format!(">{PASSWORD}");
            args.push(&password);
            node.cli(&args)
                .unwrap_or_else(|err| panic!("ACL SETUSER {user} on {}: {err}", node.port()));
        }
    }
}

/// A store of `url` authenticated as `user`.
async fn connect_as(url: &str, user: &str) -> hotsplit::Result<RedisStore> {
    let parsed = RedisUrl::parse(url).expect("url");
    let mut options = RedisOptions::new(parsed.target);
    options.command_timeout = Duration::from_secs(1);
    options.security.username = Some(user.to_owned());
    options.security.password = Some(Password::new(PASSWORD));
    RedisStore::connect(options, Metrics::new()).await
}

/// The ACL checks on a primary with one replica started by `options` (Redis or Valkey).
async fn acl_suite(options: ServerOptions, prefix: &str) {
    let group = PrimaryReplica::start_with_options(1, &options).expect("primary and replica");
    let replica = &group.replicas[0];
    create_users(&[&group.primary, replica]);
    let http = reqwest::Client::new();
    let primary = group.url();

    the_full_user_from_the_url(&http, &primary, prefix).await;

    the_least_privilege_user_runs_the_service(&http, &group, prefix).await;

    the_scrubs_commands_as_the_least_privilege_user(&primary, prefix).await;

    the_audit_user_reads_every_copy_and_cannot_write(&primary, prefix).await;

    missing_permissions_are_named(&primary, prefix).await;
}

/// The full user, from the URL: publish and read.
async fn the_full_user_from_the_url(http: &reqwest::Client, primary: &str, prefix: &str) {
    // The full user, from the URL.
    let url = primary.replacen("redis://", &format!("redis://full:{PASSWORD}@"), 1);
    let text = format!("[store]\nredis = {url:?}\n{FAMILIES}");
    let service = Service::start(config_from_toml(&text)).await;
    let key = format!("sec:{prefix}full");
    publish_expecting(
        http,
        &service.base,
        Edit::new(&key, 1, "v1"),
        StatusCode::OK,
    )
    .await;
    read_value(http, &service.base, &key, "a").await;
    service.stop().await;
}

/// The least-privilege user, from store.username and a password file: publish, read, replica
/// read, synced write (WAIT), read repair, the registry and retiring a library.
async fn the_least_privilege_user_runs_the_service(
    http: &reqwest::Client,
    group: &PrimaryReplica,
    prefix: &str,
) {
    let primary = group.url();
    let replica_url = group.replicas[0].url();
    // The least-privilege user, from store.username and a password file: publish, read,
    // replica read, synced write (WAIT), read repair.
    let dir = tempfile::tempdir().expect("dir");
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("password file");
    // The previous release's function library is on the primary, and nobody runs it: the
    // service deletes it (FUNCTION LIST, FUNCTION DELETE) after three 100 ms heartbeats.
    group
        .primary
        .cli(&["FUNCTION", "LOAD", "REPLACE", PREVIOUS_LIBRARY])
        .expect("load the previous library");
    let text = format!(
        "[store]\nredis = {primary:?}\nreplicas = [{replica_url:?}]\nusername = \"hotsplit\"\npassword_file = {:?}\n{FAMILIES}\n[fleet]\nheartbeat_interval = \"100ms\"\nretire_interval = \"100ms\"\n",
        password_file.display().to_string()
    );
    let mut config: Config = config_from_toml(&text);
    config.store.command_timeout = Duration::from_secs(1);
    let service = Service::start(config).await;
    let base = service.base.clone();
    let key = format!("sec:{prefix}least");
    writes_and_reads_need_no_more(http, &base, &key, prefix).await;
    repair_registry_and_retiring_need_no_more(http, group, &base, &key).await;
    assert_no_refused_commands(http, &base).await;
    service.stop().await;
}

/// Through `base`: a synced publish, a read, a conflict, an allocated version and a replica
/// read of `key` and its siblings.
async fn writes_and_reads_need_no_more(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    prefix: &str,
) {
    let synced = http
        .put(format!(
            "{base}/v1/keys/{key}?version=1&sync_replicas=1&sync_timeout_ms=2000"
        ))
        .body("v1")
        .send()
        .await
        .expect("PUT");
    assert_eq!(synced.status(), StatusCode::OK, "synced publish");
    read_value(http, base, key, "a").await;
    // The same version with another value: the conflict check inside the function (HGET).
    let conflict = http
        .put(format!("{base}/v1/keys/{key}?version=1"))
        .body("other")
        .send()
        .await
        .expect("PUT");
    harness::problem(
        conflict,
        StatusCode::CONFLICT,
        "version_conflict",
        "a reissued version",
    )
    .await;
    // An allocated version: the counter function (GET, SET, INCR, PTTL, PEXPIRE).
    let allocated = http
        .put(format!("{base}/v1/keys/seca:{prefix}least"))
        .body("v1")
        .send()
        .await
        .expect("PUT");
    assert_eq!(allocated.status(), StatusCode::OK, "allocated publish");
    let replica_key = format!("secr:{prefix}least");
    publish_expecting(http, base, Edit::new(&replica_key, 1, "v1"), StatusCode::OK).await;
    wait_for_replica_read(http, base, &replica_key).await;
}

/// Through `base`: a read repair of `key`, the instance registry, and retiring the previous
/// library.
async fn repair_registry_and_retiring_need_no_more(
    http: &reqwest::Client,
    group: &PrimaryReplica,
    base: &str,
    key: &str,
) {
    // Read repair: the affine copy is deleted behind hotsplit's back; a read writes it again.
    let affinity = harness::affinity(http, base, key, "a").await;
    let copy = affinity["copy_key"].as_str().expect("copy_key").to_owned();
    group.primary.cli(&["DEL", &copy]).expect("DEL");
    read_value(http, base, key, "a").await;
    poll("the read repaired the copy", Duration::from_secs(5), || {
        let copy = copy.clone();
        let primary = &group.primary;
        async move {
            primary
                .cli(&["HGET", &copy, "val"])
                .is_ok_and(|v| v == "v1")
        }
    })
    .await;
    // The instance registry (HSET, PEXPIRE, ZADD, ZRANGE, HMGET on `#hotsplit#{fleet}#...`).
    poll(
        "the service lists itself",
        Duration::from_secs(5),
        || async {
            let view = harness::get_json(http, &format!("{base}/v1/instances")).await;
            view["instances"]
                .as_array()
                .is_some_and(|listed| listed.iter().any(|entry| entry["id"] == view["this"]))
        },
    )
    .await;
    // Retiring the previous release's library (FUNCTION LIST and FUNCTION DELETE).
    poll(
        "the unused previous library is deleted",
        Duration::from_secs(10),
        || async {
            let listed = group
                .primary
                .cli(&["FUNCTION", "LIST", "LIBRARYNAME", "hotsplit"])
                .expect("FUNCTION LIST");
            !listed.lines().any(|line| line == "hotsplit")
        },
    )
    .await;
}

/// The scrub's commands as the least-privilege user.
async fn the_scrubs_commands_as_the_least_privilege_user(primary: &str, prefix: &str) {
    let key = format!("sec:{prefix}least");
    // The scrub's commands as the least-privilege user: the lease (FCALL hotsplit_lease_v2: GET,
    // SET, DEL), a SCAN page and a copy read as stored.
    let store = connect_as(primary, "hotsplit")
        .await
        .expect("least-privilege store");
    for ttl_ms in [1000, 0] {
        let lease = store.hold_lease("scrub", "acl-test", ttl_ms).await;
        assert_eq!(lease.expect("lease call"), Lease::Held, "ttl {ttl_ms}");
    }
    let node = store.scan_nodes().remove(0);
    let page = store
        .scan_page(&node, 0, &format!("sec:{prefix}least#*"), 100)
        .await
        .expect("scan as the least-privilege user");
    assert!(!page.keys.is_empty(), "{page:?}");
    let copy_key = Key::parse(&key)
        .expect("key")
        .copy_key(0, hotsplit::key::Placement::Suffix);
    let stored = store.read_copy_stored(&copy_key).await;
    assert!(stored.expect("read as stored").is_some(), "{copy_key}");
}

/// The read-only audit user reads every copy on the primary and the replica, and cannot write.
async fn the_audit_user_reads_every_copy_and_cannot_write(primary: &str, prefix: &str) {
    // The read-only audit user reads every copy on the primary and the replica.
    let url = primary.replacen("redis://", &format!("redis://audit:{PASSWORD}@"), 1);
    let parsed = RedisUrl::parse(&url).expect("url");
    let mut options = hotsplit::audit::AuditOptions::new(parsed.target);
    options.security.username = parsed.username;
    options.security.password = parsed.password;
    options.prefix = Some(format!("sec:{prefix}"));
    let report = hotsplit::audit::audit(&options, &mut |_| {})
        .await
        .expect("audit as the read-only user");
    assert_eq!((report.primaries, report.replicas), (1, 1), "{report:?}");
    assert!(report.figures.primary.copy_reads >= 4, "{report:?}");
    assert!(report.figures.replica.copy_reads >= 4, "{report:?}");
    assert_eq!(report.figures.primary.failed_reads, 0, "{report:?}");
    // ...and cannot write.
    let denied = connect_as(primary, "audit")
        .await
        .expect_err("audit cannot load");
    assert!(denied.message().contains("NOPERM"), "{denied}");
}

/// Users without a permission hotsplit needs: the message names it.
async fn missing_permissions_are_named(primary: &str, prefix: &str) {
    // A user without FUNCTION LOAD cannot start; the message names the permission.
    let err = connect_as(primary, "noload")
        .await
        .expect_err("noload cannot start");
    assert!(err.message().contains("'function|load'"), "{err}");
    // A user without FCALL starts, and its writes fail naming the permission.
    let store: Arc<dyn CopyStore> =
        Arc::new(connect_as(primary, "nofcall").await.expect("nofcall"));
    let key = Key::parse(&format!("sec:{prefix}nofcall")).expect("key");
    let write = CopyWrite {
        copy_key: key.copy_key(0, hotsplit::key::Placement::Suffix),
        version: Version::new(1).expect("version"),
        payload: Payload::Value(bytes::Bytes::from_static(b"v1")),
        expire_at_ms: now_unix_ms() + 60_000,
    };
    let result = store.write_copies(std::slice::from_ref(&write)).await;
    let err = result[0].outcome.as_ref().expect_err("fcall is refused");
    assert!(err.message().contains("'fcall'"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_on_redis_full_least_privilege_audit_and_missing_permissions() {
    acl_suite(ServerOptions::default(), "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_on_valkey_full_least_privilege_audit_and_missing_permissions() {
    let Some(program) = harness::valkey_server() else {
        return;
    };
    acl_suite(
        ServerOptions {
            program: Some(program),
            ..ServerOptions::default()
        },
        "valkey",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The binary: wrong credentials, and secrets kept out of everything it shows
// ---------------------------------------------------------------------------------------------

/// Runs `hotsplit serve` with `args` and `env` until it exits (at most 20 s); returns its exit
/// code, stdout and stderr together, and how long it ran.
fn run_serve(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = harness::serve_command()
        .args(["--listen", &format!("127.0.0.1:{}", harness::free_port())])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hotsplit");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    (status.code(), output, started.elapsed())
}

#[test]
fn a_wrong_password_stops_startup_with_exit_1_and_never_shows_the_password() {
    let server = harness::shared_standalone();
    server
        .node
        .cli(&[
            "ACL",
            "SETUSER",
            "wrongpass",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "+@all",
        ])
        .expect("ACL SETUSER");
    let wrong = "not-the-Pa55word";
    let url = server
        .url()
        .replacen("redis://", &format!("redis://wrongpass:{wrong}@"), 1);
    let (code, output, took) = run_serve(&["--redis", &url], &[]);
    assert_eq!(code, Some(1), "{output}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {output}");
    assert!(
        output.contains("WRONGPASS"),
        "the message says why: {output}"
    );
    assert!(!output.contains(wrong), "the password leaked: {output}");

    // The same through HOTSPLIT_REDIS_PASSWORD.
    let url = server.url().replacen("redis://", "redis://wrongpass@", 1);
    let (code, output, _) = run_serve(&["--redis", &url], &[("HOTSPLIT_REDIS_PASSWORD", wrong)]);
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("WRONGPASS"), "{output}");
    assert!(!output.contains(wrong), "the password leaked: {output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_shows_in_logs_endpoints_metrics_or_help() {
    let server = harness::shared_standalone();
    server
        .node
        .cli(&[
            "ACL",
            "SETUSER",
            "leakcheck",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "+@all",
        ])
        .expect("ACL SETUSER");
    let port = harness::free_port();
    let url = server.url().replacen("redis://", "redis://leakcheck@", 1);
    let mut command = harness::serve_command();
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis", &url])
        .env("HOTSPLIT_REDIS_PASSWORD", PASSWORD)
        .env("HOTSPLIT_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = harness::spawn_serve(command, port).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    publish_expecting(&http, &base, Edit::new("sec:leak", 1, "v1"), StatusCode::OK).await;
    let mut shown = String::new();
    for path in [
        "/v1/keys/sec:leak?client=a",
        "/v1/affinity?key=sec:leak&client=a",
        "/v1/retry-queue",
        "/v1/instances",
        "/v1/lag",
        "/v1/routing",
        "/v1/classes",
        "/metrics",
        "/openapi.json",
    ] {
        let answer = harness::get(&http, &format!("{base}{path}"), &[]).await;
        shown.push_str(&answer.text().await.unwrap_or_default());
    }
    let (_, log) = harness::sigterm_and_wait(child).await;
    assert!(log.contains("SIGTERM received"), "{log}");
    // --help shows HOTSPLIT_REDIS's value unless hidden: put the password in that URL.
    let url_with_password =
        server
            .url()
            .replacen("redis://", &format!("redis://leakcheck:{PASSWORD}@"), 1);
    for help in [["serve", "--help"], ["audit", "--help"]] {
        let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
            .args(help)
            .env("HOTSPLIT_REDIS_PASSWORD", PASSWORD)
            .env("HOTSPLIT_REDIS", &url_with_password)
            .output()
            .expect("help");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("HOTSPLIT_REDIS_PASSWORD"), "{text}");
        shown.push_str(&text);
    }
    assert!(!shown.contains(PASSWORD), "the password shows: {shown}");
    assert!(!log.contains(PASSWORD), "the password is logged: {log}");
}

#[test]
fn the_readme_quotes_the_tested_acl_lines() {
    let readme = include_str!("../../README.md");
    for (user, rules) in [("hotsplit", SERVE_ACL), ("audit", AUDIT_ACL)] {
        let line = format!("ACL SETUSER {user} {rules} >THE-PASSWORD");
        assert!(readme.contains(&line), "README.md lacks: {line}");
    }
}

#[test]
fn audit_over_tls_as_the_read_only_user_from_its_flags() {
    let server = tls_standalone();
    create_users(&[&server.node]);
    let url = server.url().replacen("rediss://", "rediss://audit@", 1);
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["audit", "--redis", &url, "--json", "--copies", "4"])
        .arg("--tls-ca-file")
        .arg(&pki().files.ca_file)
        .env("HOTSPLIT_REDIS_PASSWORD", PASSWORD)
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit audit");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json report");
    assert_eq!(report["primaries"], 1, "{report}");
    assert!(
        report["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("rediss://")),
        "{report}"
    );
    assert!(!stdout.contains(PASSWORD) && !stderr.contains(PASSWORD));

    // Without the CA the same audit stops with exit 1, saying the certificate was refused.
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["audit", "--redis", &url, "--copies", "4"])
        .env("HOTSPLIT_REDIS_PASSWORD", PASSWORD)
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit audit");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("certificate was not accepted"), "{stderr}");
}
