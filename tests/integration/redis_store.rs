//! The Redis store against real servers: what lands in Redis, the compare-and-set in Lua, the
//! per-node fan-out, the function-library reload and a paused master.
//!
//! Copies are checked by reading Redis directly (`devcluster::cli` on the node that owns the
//! key), not through the store under test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::store::library::{ALLOC_FUNCTION, CAS_FUNCTION, LAYOUT_FUNCTION};
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::{
    now_unix_ms, CasOutcome, CopyRecord, CopyStore, CopyWrite, Payload, Role, TopologyStore,
};
use hotsplit::ErrorKind;
use hotsplit_devcluster::{self as devcluster, Cluster, Standalone};
use rand::Rng;

use crate::harness;

/// The command timeout of every store in this module (the harness's: a healthy node answers
/// within it on a loaded machine).
const COMMAND_TIMEOUT: Duration = harness::COMMAND_TIMEOUT;

/// A Redis deployment a test runs against, and how to reach the node that owns a key.
enum Deployment<'a> {
    /// One server.
    Standalone(&'a Standalone),
    /// A cluster.
    Cluster(&'a Cluster),
}

impl Deployment<'static> {
    fn shared_standalone() -> Deployment<'static> {
        Deployment::Standalone(harness::shared_standalone())
    }

    fn shared_cluster() -> Deployment<'static> {
        Deployment::Cluster(harness::shared_cluster())
    }
}

impl Deployment<'_> {
    fn url(&self) -> String {
        match self {
            Deployment::Standalone(server) => server.url(),
            Deployment::Cluster(cluster) => cluster.url(),
        }
    }

    /// A store on this deployment with [`COMMAND_TIMEOUT`].
    async fn store(&self) -> Arc<RedisStore> {
        harness::redis_store(&self.url(), COMMAND_TIMEOUT).await
    }

    /// The port of the primary that owns `key`, from the servers themselves (`CLUSTER NODES`).
    fn owner_port(&self, key: &str) -> u16 {
        match self {
            Deployment::Standalone(server) => server.node.port(),
            Deployment::Cluster(cluster) => harness::owner_port(cluster, key),
        }
    }

    /// Sends a command about `key` to the node that owns it.
    fn cli(&self, key: &str, args: &[&str]) -> Result<String, devcluster::DevClusterError> {
        devcluster::cli(self.owner_port(key), args)
    }
}

fn key(name: &str) -> Key {
    Key::parse(name).expect("valid key")
}

fn version(n: u64) -> Version {
    Version::new(n).expect("valid version")
}

fn value(text: &str) -> Payload {
    Payload::Value(Bytes::copy_from_slice(text.as_bytes()))
}

/// One write per copy `0..copies` of `key`.
fn writes(key: &Key, copies: u32, n: u64, payload: &Payload, expire_at_ms: u64) -> Vec<CopyWrite> {
    (0..copies)
        .map(|copy| CopyWrite {
            copy_key: key.copy_key(copy, hotsplit::key::Placement::Suffix),
            version: version(n),
            payload: payload.clone(),
            expire_at_ms,
        })
        .collect()
}

/// Writes every copy and returns the outcomes, panicking on any failed write.
async fn write_all(store: &dyn CopyStore, writes: &[CopyWrite]) -> Vec<CasOutcome> {
    store
        .write_copies(writes)
        .await
        .into_iter()
        .zip(writes)
        .map(|(result, write)| match result.outcome {
            Ok(outcome) => outcome,
            Err(err) => panic!("write of {} failed: {err}", write.copy_key),
        })
        .collect()
}

/// A copy's hash as Redis holds it (`HGETALL` on the owning node).
fn raw_copy(deployment: &Deployment<'_>, copy_key: &str) -> BTreeMap<String, String> {
    harness::hgetall(deployment.owner_port(copy_key), copy_key)
}

/// `PEXPIRETIME` of a key on the owning node.
fn pexpiretime(deployment: &Deployment<'_>, key: &str) -> i64 {
    let text = deployment
        .cli(key, &["PEXPIRETIME", key])
        .expect("PEXPIRETIME");
    text.parse().expect("PEXPIRETIME is an integer")
}

// ---------------------------------------------------------------------------------------------
// What lands in Redis
// ---------------------------------------------------------------------------------------------

async fn every_copy_holds_all_fields(deployment: Deployment<'_>, name: &str) {
    let store = deployment.store().await;
    let key = key(name);
    let expire_at_ms = now_unix_ms() + 600_000;
    let batch = writes(&key, 8, 42, &value("hello"), expire_at_ms);
    assert_eq!(
        write_all(&*store, &batch).await,
        vec![CasOutcome::Applied; 8]
    );

    for write in &batch {
        let copy_key = write.copy_key.as_str();
        let hash = raw_copy(&deployment, copy_key);
        let expected: BTreeMap<String, String> = [
            ("ver", "42".to_owned()),
            ("val", "hello".to_owned()),
            ("tomb", "0".to_owned()),
            ("exp", expire_at_ms.to_string()),
        ]
        .into_iter()
        .map(|(field, text)| (field.to_owned(), text))
        .collect();
        assert_eq!(hash, expected, "{copy_key}");
        // The hash outlives the copy's expiry by the version retention (default 1 h), so the
        // compare-and-set still refuses older versions after the copy stopped being served.
        let retention = hotsplit::store::DEFAULT_VERSION_RETENTION_MS;
        assert_eq!(
            pexpiretime(&deployment, copy_key),
            (expire_at_ms + retention) as i64,
            "{copy_key}"
        );
        let pttl: i64 = deployment
            .cli(copy_key, &["PTTL", copy_key])
            .expect("PTTL")
            .parse()
            .expect("PTTL is an integer");
        let ttl = 600_000 + retention as i64;
        assert!(
            pttl > ttl - 10_000 && pttl <= ttl,
            "{copy_key}: pttl {pttl}"
        );

        // The store reads back what Redis holds, from the owning primary.
        let read = store.read_copy(&write.copy_key).await;
        assert_eq!(read.served_by.role, Role::Primary);
        assert_eq!(
            read.served_by.node.as_str(),
            format!("127.0.0.1:{}", deployment.owner_port(copy_key))
        );
        assert_eq!(
            read.record.expect("read succeeds"),
            Some(CopyRecord {
                version: version(42),
                payload: value("hello"),
                expire_at_ms,
            })
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_every_copy_holds_all_fields() {
    every_copy_holds_all_fields(
        Deployment::shared_standalone(),
        "rs:standalone_every_copy_holds_all_fields",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_every_copy_holds_all_fields() {
    every_copy_holds_all_fields(
        Deployment::shared_cluster(),
        "rs:cluster_every_copy_holds_all_fields",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Compare-and-set rules
// ---------------------------------------------------------------------------------------------

async fn compare_and_set_rules(deployment: Deployment<'_>, name: &str) {
    let store = deployment.store().await;
    let later = now_unix_ms() + 600_000;

    an_older_version_never_overwrites(&deployment, &store, name, later).await;
    a_repeated_write_keeps_its_expiry(&deployment, &store, name, later).await;
    a_tombstone_blocks_an_older_write(&deployment, &store, name, later).await;
    equal_versions_end_as_the_tombstone(&deployment, &store, name, later).await;
    versions_above_2_53_compare_exactly(&deployment, &store, name, later).await;
    // A missing copy reads as None.
    let missing = key(&format!("{name}:missing")).copy_key(0, hotsplit::key::Placement::Suffix);
    assert_eq!(
        store
            .read_copy(&missing)
            .await
            .record
            .expect("read succeeds"),
        None
    );
}

/// An older version never overwrites a newer one, on any copy.
async fn an_older_version_never_overwrites(
    deployment: &Deployment<'_>,
    store: &RedisStore,
    name: &str,
    later: u64,
) {
    // An older version never overwrites a newer one.
    let key_a = key(&format!("{name}:older"));
    assert_eq!(
        write_all(store, &writes(&key_a, 4, 5, &value("five"), later)).await,
        vec![CasOutcome::Applied; 4]
    );
    assert_eq!(
        write_all(store, &writes(&key_a, 4, 3, &value("three"), later)).await,
        vec![CasOutcome::Stale { stored: version(5) }; 4]
    );
    for copy in 0..4 {
        let copy_key = key_a.copy_key(copy, hotsplit::key::Placement::Suffix);
        let hash = raw_copy(deployment, copy_key.as_str());
        assert_eq!(
            (hash["ver"].as_str(), hash["val"].as_str()),
            ("5", "five"),
            "{copy_key}"
        );
    }
}

/// A repeated write is current and does not move the absolute expiry.
async fn a_repeated_write_keeps_its_expiry(
    deployment: &Deployment<'_>,
    store: &RedisStore,
    name: &str,
    later: u64,
) {
    // A repeated write is current and does not move the absolute expiry.
    let key_b = key(&format!("{name}:repeat"));
    let batch = writes(&key_b, 2, 7, &value("seven"), later);
    assert_eq!(write_all(store, &batch).await, vec![CasOutcome::Applied; 2]);
    let retry = writes(&key_b, 2, 7, &value("seven"), later + 3_600_000);
    assert_eq!(write_all(store, &retry).await, vec![CasOutcome::Current; 2]);
    for write in &batch {
        assert_eq!(
            pexpiretime(deployment, write.copy_key.as_str()),
            (later + hotsplit::store::DEFAULT_VERSION_RETENTION_MS) as i64
        );
    }
}

/// A tombstone blocks an older write, and reads as a tombstone.
async fn a_tombstone_blocks_an_older_write(
    deployment: &Deployment<'_>,
    store: &RedisStore,
    name: &str,
    later: u64,
) {
    // A tombstone blocks an older write.
    let key_c = key(&format!("{name}:tombstone"));
    assert_eq!(
        write_all(store, &writes(&key_c, 2, 9, &value("nine"), later)).await,
        vec![CasOutcome::Applied; 2]
    );
    assert_eq!(
        write_all(store, &writes(&key_c, 2, 10, &Payload::Tombstone, later)).await,
        vec![CasOutcome::Applied; 2]
    );
    assert_eq!(
        write_all(store, &writes(&key_c, 2, 8, &value("eight"), later)).await,
        vec![
            CasOutcome::Stale {
                stored: version(10)
            };
            2
        ]
    );
    for copy in 0..2 {
        let copy_key = key_c.copy_key(copy, hotsplit::key::Placement::Suffix);
        let hash = raw_copy(deployment, copy_key.as_str());
        assert_eq!(
            (
                hash["ver"].as_str(),
                hash["val"].as_str(),
                hash["tomb"].as_str()
            ),
            ("10", "", "1")
        );
        let record = store
            .read_copy(&copy_key)
            .await
            .record
            .expect("read succeeds")
            .expect("copy exists");
        assert_eq!(
            (record.version, record.payload),
            (version(10), Payload::Tombstone)
        );
    }
}

/// At an equal version a tombstone replaces a value and a value never replaces a tombstone.
async fn equal_versions_end_as_the_tombstone(
    deployment: &Deployment<'_>,
    store: &RedisStore,
    name: &str,
    later: u64,
) {
    // At an equal version a tombstone replaces a value and a value never replaces a tombstone.
    let key_e = key(&format!("{name}:equal"));
    let single = |payload: &Payload| writes(&key_e, 1, 11, payload, later);
    assert_eq!(
        write_all(store, &single(&value("eleven"))).await,
        vec![CasOutcome::Applied]
    );
    assert_eq!(
        write_all(store, &single(&Payload::Tombstone)).await,
        vec![CasOutcome::Applied]
    );
    assert_eq!(
        write_all(store, &single(&value("eleven"))).await,
        vec![CasOutcome::Stale {
            stored: version(11)
        }]
    );
    assert_eq!(
        write_all(store, &single(&Payload::Tombstone)).await,
        vec![CasOutcome::Current]
    );
    let hash = raw_copy(
        deployment,
        key_e.copy_key(0, hotsplit::key::Placement::Suffix).as_str(),
    );
    assert_eq!((hash["ver"].as_str(), hash["tomb"].as_str()), ("11", "1"));
}

/// Versions above 2^53 compare exactly (a double cannot tell 2^53 + 1 from 2^53).
async fn versions_above_2_53_compare_exactly(
    deployment: &Deployment<'_>,
    store: &RedisStore,
    name: &str,
    later: u64,
) {
    // Versions above 2^53 compare exactly (a double cannot tell 2^53 + 1 from 2^53).
    let key_d = key(&format!("{name}:big"));
    let above = (1u64 << 53) + 1;
    assert_eq!(
        write_all(store, &writes(&key_d, 2, above, &value("a"), later)).await,
        vec![CasOutcome::Applied; 2]
    );
    assert_eq!(
        write_all(store, &writes(&key_d, 2, 1 << 53, &value("b"), later)).await,
        vec![
            CasOutcome::Stale {
                stored: version(above)
            };
            2
        ]
    );
    assert_eq!(
        write_all(store, &writes(&key_d, 2, u64::MAX - 1, &value("c"), later)).await,
        vec![CasOutcome::Applied; 2]
    );
    assert_eq!(
        write_all(store, &writes(&key_d, 2, u64::MAX, &value("d"), later)).await,
        vec![CasOutcome::Applied; 2]
    );
    assert_eq!(
        write_all(store, &writes(&key_d, 2, u64::MAX - 1, &value("c"), later)).await,
        vec![
            CasOutcome::Stale {
                stored: version(u64::MAX)
            };
            2
        ]
    );
    assert_eq!(
        write_all(store, &writes(&key_d, 2, u64::MAX, &value("d"), later)).await,
        vec![CasOutcome::Current; 2]
    );
    let copy_key = key_d.copy_key(1, hotsplit::key::Placement::Suffix);
    assert_eq!(
        raw_copy(deployment, copy_key.as_str())["ver"],
        "18446744073709551615"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_compare_and_set_rules() {
    compare_and_set_rules(
        Deployment::shared_standalone(),
        "rs:standalone_compare_and_set_rules",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_compare_and_set_rules() {
    compare_and_set_rules(
        Deployment::shared_cluster(),
        "rs:cluster_compare_and_set_rules",
    )
    .await;
}

async fn racing_writers_end_at_the_maximum(deployment: Deployment<'_>, name: &str) {
    let store = deployment.store().await;
    let key = key(name);
    let later = now_unix_ms() + 600_000;
    let versions: Vec<u64> = {
        let mut rng = rand::rng();
        (0..50)
            .map(|_| rng.random_range(1..=1_000_000_000u64))
            .collect()
    };
    let max = versions.iter().copied().max().expect("50 versions");

    let tasks: Vec<_> = versions
        .iter()
        .map(|&n| {
            let store = Arc::clone(&store);
            let batch = writes(&key, 8, n, &value(&format!("v{n}")), later);
            tokio::spawn(async move { write_all(&*store, &batch).await })
        })
        .collect();
    for (task, n) in tasks.into_iter().zip(&versions) {
        for outcome in task.await.expect("writer task") {
            match outcome {
                CasOutcome::Applied | CasOutcome::Current => {}
                CasOutcome::Stale { stored } => {
                    assert!(stored.get() > *n, "stale {n} against {stored}")
                }
                CasOutcome::Conflict { stored } => {
                    panic!("conflict at {stored}: one body per version")
                }
            }
        }
    }

    for copy in 0..8 {
        let copy_key = key.copy_key(copy, hotsplit::key::Placement::Suffix);
        let hash = raw_copy(&deployment, copy_key.as_str());
        assert_eq!(hash["ver"], max.to_string(), "{copy_key}");
        assert_eq!(hash["val"], format!("v{max}"), "{copy_key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_racing_writers_end_at_the_maximum() {
    racing_writers_end_at_the_maximum(
        Deployment::shared_standalone(),
        "rs:standalone_racing_writers",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_racing_writers_end_at_the_maximum() {
    racing_writers_end_at_the_maximum(Deployment::shared_cluster(), "rs:cluster_racing_writers")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_routine_rejects_non_canonical_arguments() {
    let deployment = Deployment::shared_standalone();
    let _store = deployment.store().await; // connecting loads the library
    let copy_key = "rs:the_lua_routine_rejects_non_canonical_arguments#0";
    let later = (now_unix_ms() + 600_000).to_string();
    let retain = (now_unix_ms() + 4_200_000).to_string();
    let now = now_unix_ms().to_string();
    non_canonical_versions_are_refused(&deployment, copy_key, [&later, &retain, &now]);
    malformed_calls_are_refused(&deployment, copy_key, [&later, &retain, &now]);
    // Nothing was written by any refused call.
    assert_eq!(
        deployment
            .cli(copy_key, &["EXISTS", copy_key])
            .expect("EXISTS"),
        "0"
    );
}

/// `FCALL`s of the compare-and-set with a version that is not canonical are refused.
fn non_canonical_versions_are_refused(
    deployment: &Deployment<'_>,
    copy_key: &str,
    [later, retain, now]: [&str; 3],
) {
    let bad_versions = [
        "01",
        "0",
        "",
        "-1",
        "+1",
        "1.5",
        "1e3",
        " 1",
        "abc",
        "18446744073709551616",
        "99999999999999999999",
    ];
    for bad in bad_versions {
        let reply = deployment.cli(
            copy_key,
            &[
                "FCALL",
                CAS_FUNCTION,
                "1",
                copy_key,
                bad,
                "v",
                "0",
                later,
                retain,
                now,
            ],
        );
        let err = reply.expect_err(&format!("version {bad:?} must be refused"));
        assert!(err.to_string().contains("not canonical"), "{bad:?}: {err}");
    }
}

/// `FCALL`s with a bad or missing argument after the version are refused.
fn malformed_calls_are_refused(
    deployment: &Deployment<'_>,
    copy_key: &str,
    [later, retain, now]: [&str; 3],
) {
    let bad_calls: [&[&str]; 11] = [
        &[
            "FCALL",
            CAS_FUNCTION,
            "1",
            copy_key,
            "1",
            "v",
            "2",
            later,
            retain,
            now,
        ],
        &[
            "FCALL",
            CAS_FUNCTION,
            "1",
            copy_key,
            "1",
            "v",
            "0",
            "-5",
            retain,
            now,
        ],
        &[
            "FCALL",
            CAS_FUNCTION,
            "1",
            copy_key,
            "1",
            "v",
            "0",
            later,
            "x",
            now,
        ],
        &[
            "FCALL",
            CAS_FUNCTION,
            "1",
            copy_key,
            "1",
            "v",
            "0",
            later,
            retain,
            "01",
        ],
        &[
            "FCALL",
            CAS_FUNCTION,
            "1",
            copy_key,
            "1",
            "v",
            "0",
            later,
            retain,
        ],
        &["FCALL", CAS_FUNCTION, "1", copy_key, "1", "v", "0"],
        &["FCALL", ALLOC_FUNCTION, "1", copy_key, "ten", "0"],
        &["FCALL", ALLOC_FUNCTION, "1", copy_key, "1000", "-1"],
        &[
            "FCALL",
            ALLOC_FUNCTION,
            "1",
            copy_key,
            "1000",
            "9223372036854775807",
        ],
        &["FCALL", ALLOC_FUNCTION, "1", copy_key, "1000"],
        &["FCALL", LAYOUT_FUNCTION, "1", copy_key, "", "4"],
    ];
    for args in bad_calls {
        assert!(
            deployment.cli(copy_key, args).is_err(),
            "{args:?} must be refused"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Function library reload
// ---------------------------------------------------------------------------------------------

/// A store on `server` counting into `metrics`.
async fn store_on(server: &Standalone, metrics: Arc<Metrics>) -> RedisStore {
    let mut options = RedisOptions::new(RedisTarget::parse(&server.url()).expect("url"));
    options.command_timeout = COMMAND_TIMEOUT;
    RedisStore::connect(options, metrics)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_function_library_is_reloaded_and_the_write_retried() {
    let server = Standalone::start().expect("start a standalone redis-server");
    let deployment = Deployment::Standalone(&server);
    let metrics = Metrics::new();
    let store = store_on(&server, Arc::clone(&metrics)).await;
    let key = key("rs:flushed");
    let later = now_unix_ms() + 600_000;
    assert_eq!(
        write_all(&store, &writes(&key, 8, 1, &value("one"), later)).await,
        vec![CasOutcome::Applied; 8]
    );

    devcluster::cli(server.node.port(), &["FUNCTION", "FLUSH"]).expect("FUNCTION FLUSH");
    assert_eq!(
        write_all(&store, &writes(&key, 8, 2, &value("two"), later)).await,
        vec![CasOutcome::Applied; 8]
    );
    for copy in 0..8 {
        assert_eq!(
            raw_copy(
                &deployment,
                key.copy_key(copy, hotsplit::key::Placement::Suffix)
                    .as_str()
            )["ver"],
            "2"
        );
    }
    let text = metrics.render();
    assert!(
        text.contains(r#"hotsplit_store_errors_total{kind="function_missing"} 8"#),
        "{text}"
    );

    // The version counter goes through the library too.
    devcluster::cli(server.node.port(), &["FUNCTION", "FLUSH"]).expect("FUNCTION FLUSH");
    let counter = Key::parse("rs:flushed-counter").expect("valid key");
    assert_eq!(
        store
            .allocate_version(&counter, 60_000, 0)
            .await
            .expect("allocate"),
        version(1)
    );
    let text = metrics.render();
    assert!(
        text.contains(r#"hotsplit_store_errors_total{kind="function_missing"} 9"#),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Placement and the paused master
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_copies_spread_over_every_master_and_name_their_owner() {
    let cluster = harness::shared_cluster();
    let store = harness::redis_store(&cluster.url(), COMMAND_TIMEOUT).await;
    let key = key("rs:cluster_copies_spread");
    let batch = writes(&key, 16, 1, &value("x"), now_unix_ms() + 600_000);
    let results = store.write_copies(&batch).await;

    let masters: BTreeSet<String> = cluster
        .masters()
        .expect("masters")
        .iter()
        .map(|node| node.addr())
        .collect();
    assert_eq!(masters.len(), 3);
    let mut used = BTreeSet::new();
    for (result, write) in results.iter().zip(&batch) {
        let copy_key = write.copy_key.as_str();
        assert_eq!(
            result.outcome.as_ref().ok(),
            Some(&CasOutcome::Applied),
            "{copy_key}"
        );
        let owner = format!("127.0.0.1:{}", harness::owner_port(cluster, copy_key));
        assert_eq!(result.node.as_str(), owner, "{copy_key}");
        assert_eq!(store.node_of(&write.copy_key).as_str(), owner, "{copy_key}");
        used.insert(owner);
    }
    assert_eq!(used, masters, "16 copies land on every master");

    let primaries: BTreeSet<String> = store
        .primaries()
        .iter()
        .map(|node| node.as_str().to_owned())
        .collect();
    assert_eq!(primaries, masters);
    assert_eq!(store.kind(), "redis-cluster");
    store.ping().await.expect("every primary answers PING");
}

/// Resumes a paused node when dropped, so a failing assertion never leaves it stopped.
struct ResumeOnDrop<'a>(&'a devcluster::RedisNode);

impl Drop for ResumeOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_fails_only_its_own_copies_with_timeout() {
    // The paused master outlives the command timeout; it must not be replaced meanwhile.
    let cluster = harness::own_cluster_without_failover().await;
    let store = harness::redis_store(&cluster.url(), COMMAND_TIMEOUT).await;
    let key = key("rs:paused_master");
    let later = now_unix_ms() + 600_000;
    let batch = writes(&key, 16, 1, &value("one"), later);
    assert_eq!(
        write_all(&*store, &batch).await,
        vec![CasOutcome::Applied; 16]
    );

    let paused_port = harness::owner_port(
        &cluster,
        key.copy_key(0, hotsplit::key::Placement::Suffix).as_str(),
    );
    let paused_addr = format!("127.0.0.1:{paused_port}");
    let owned_by_paused = batch
        .iter()
        .filter(|write| harness::owner_port(&cluster, write.copy_key.as_str()) == paused_port)
        .count();
    assert!(
        owned_by_paused > 0 && owned_by_paused < 16,
        "{owned_by_paused} of 16 copies on one master"
    );
    let node = cluster
        .node(paused_port)
        .expect("the paused master is ours");

    node.pause().expect("SIGSTOP the master");
    let resume = ResumeOnDrop(node);
    let batch = writes(&key, 16, 2, &value("two"), later);
    let results = tokio::time::timeout(COMMAND_TIMEOUT * 5, store.write_copies(&batch))
        .await
        .expect("write_copies returns although a master is paused");
    drop(resume);

    for (result, write) in results.iter().zip(&batch) {
        let copy_key = write.copy_key.as_str();
        if result.node.as_str() == paused_addr {
            let err = result.outcome.as_ref().expect_err(copy_key);
            assert_eq!(err.kind(), ErrorKind::Timeout, "{copy_key}: {err}");
            assert!(
                err.message().contains(copy_key) && err.message().contains(&paused_addr),
                "{err}"
            );
        } else {
            assert_eq!(
                result.outcome.as_ref().ok(),
                Some(&CasOutcome::Applied),
                "{copy_key}"
            );
        }
    }
    assert_eq!(
        results
            .iter()
            .filter(|result| result.outcome.is_err())
            .count(),
        owned_by_paused
    );

    // Once resumed, the same writes complete everywhere.
    let store_for_poll = Arc::clone(&store);
    harness::poll(
        "every copy accepts version 2 after resume",
        Duration::from_secs(10),
        || {
            let store = Arc::clone(&store_for_poll);
            let batch = batch.clone();
            async move {
                store
                    .write_copies(&batch)
                    .await
                    .iter()
                    .all(|result| result.outcome.is_ok())
            }
        },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Version counters, corrupt copies, connection failures
// ---------------------------------------------------------------------------------------------

async fn allocate_version_counts_up_with_a_ttl(deployment: Deployment<'_>, name: &str) {
    let store = deployment.store().await;
    let key = key(name);
    for expected in 1..=3 {
        assert_eq!(
            store
                .allocate_version(&key, 60_000, 0)
                .await
                .expect("allocate"),
            version(expected)
        );
    }
    let counter = key.counter_key();
    let pttl: i64 = deployment
        .cli(&counter, &["PTTL", &counter])
        .expect("PTTL")
        .parse()
        .expect("integer");
    assert!(pttl > 0 && pttl <= 60_000, "pttl {pttl}");

    // A shorter time to live never shortens the counter's (another instance's shorter family
    // TTL must not let it expire before the copies it versioned).
    assert_eq!(
        store
            .allocate_version(&key, 1_000, 0)
            .await
            .expect("allocate"),
        version(4)
    );
    let pttl: i64 = deployment
        .cli(&counter, &["PTTL", &counter])
        .expect("PTTL")
        .parse()
        .expect("integer");
    assert!(
        pttl > 1_000,
        "a 1 s allocation shortened the counter's TTL to {pttl} ms"
    );

    // A floor above the counter (the copies hold a version the counter lost) moves it past the
    // floor; a floor below it changes nothing.
    assert_eq!(
        store
            .allocate_version(&key, 60_000, 40)
            .await
            .expect("allocate"),
        version(41)
    );
    assert_eq!(
        store
            .allocate_version(&key, 60_000, 7)
            .await
            .expect("allocate"),
        version(42)
    );

    // The counter crosses 2^53 exactly.
    deployment
        .cli(&counter, &["SET", &counter, "9007199254740993"])
        .expect("SET");
    assert_eq!(
        store
            .allocate_version(&key, 60_000, 0)
            .await
            .expect("allocate"),
        version(9_007_199_254_740_994)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_allocate_version_counts_up_with_a_ttl() {
    allocate_version_counts_up_with_a_ttl(
        Deployment::shared_standalone(),
        "rs:standalone_allocate",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_allocate_version_counts_up_with_a_ttl() {
    allocate_version_counts_up_with_a_ttl(Deployment::shared_cluster(), "rs:cluster_allocate")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_copy_reads_as_unavailable() {
    let deployment = Deployment::shared_standalone();
    let metrics = Metrics::new();
    let store = store_on(harness::shared_standalone(), Arc::clone(&metrics)).await;
    let copy_key = key("rs:a_corrupt_copy").copy_key(0, hotsplit::key::Placement::Suffix);
    deployment
        .cli(
            copy_key.as_str(),
            &harness::corrupt_copy_command(copy_key.as_str()),
        )
        .expect("HSET");
    let err = store
        .read_copy(&copy_key)
        .await
        .record
        .expect_err("a corrupt copy is an error");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(
        err.message().contains("corrupt") && err.message().contains(copy_key.as_str()),
        "{err}"
    );

    // The compare-and-set refuses to treat a corrupt version as absent.
    let results = store
        .write_copies(&[CopyWrite {
            copy_key: copy_key.clone(),
            version: version(1),
            payload: value("v"),
            expire_at_ms: now_unix_ms() + 60_000,
        }])
        .await;
    let err = results[0]
        .outcome
        .as_ref()
        .expect_err("a corrupt stored version is refused");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        metrics
            .render()
            .contains(r#"hotsplit_store_errors_total{kind="other"} 2"#),
        "{}",
        metrics.render()
    );
    assert_eq!(store.kind(), "redis");
    store.ping().await.expect("PING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_is_unavailable_and_names_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let url = format!("redis://127.0.0.1:{port}");
    let mut options = RedisOptions::new(RedisTarget::parse(&url).expect("url"));
    options.connect_timeout = Duration::from_secs(1);
    let err = RedisStore::connect(options, Metrics::new())
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.message().contains(&url), "{err}");
}
