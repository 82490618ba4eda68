//! Direct reads (`store::redis::direct`), against real Redis: a primary copy read sent on the
//! store's own pipelined connection answers what fred answers (values, absent copies,
//! tombstones, corrupt copies, binary and large values, many reads at once each with its own
//! reply), sees a write acknowledged on fred's connection, fails within the command timeout
//! on a paused node, comes back after its connection is killed, and follows a `MOVED` from a
//! primary demoted by a failover; a dropped store closes it. The TLS and ACL connections are in `redis_security.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use hotsplit::key::{CopyKey, Key, Placement, Version};
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::{now_unix_ms, CopyRecord, CopyStore, CopyWrite, Payload, Role};
use hotsplit::ErrorKind;
use hotsplit_devcluster::{Cluster, Standalone};

use crate::harness;

/// A store on `url` with `command_timeout`, counting into `metrics`, direct reads as given.
async fn store_on(
    url: &str,
    command_timeout: Duration,
    direct_reads: bool,
    metrics: &Arc<Metrics>,
) -> RedisStore {
    let mut options = RedisOptions::new(RedisTarget::parse(url).expect("url"));
    options.command_timeout = command_timeout;
    options.direct_reads = direct_reads;
    RedisStore::connect(options, Arc::clone(metrics))
        .await
        .expect("connect")
}

/// `hotsplit_store_direct_reads_total{outcome}` in `metrics`.
fn direct(metrics: &Metrics, outcome: &str) -> u64 {
    harness::sample(
        &metrics.render(),
        &format!("hotsplit_store_direct_reads_total{{outcome=\"{outcome}\"}}"),
    )
}

fn copy_key(name: &str, copy: u32) -> CopyKey {
    Key::parse(name)
        .expect("valid key")
        .copy_key(copy, Placement::Suffix)
}

async fn write(store: &RedisStore, copy_key: &CopyKey, version: u64, payload: Payload) {
    let results = store
        .write_copies(&[CopyWrite {
            copy_key: copy_key.clone(),
            version: Version::new(version).expect("version"),
            payload,
            expire_at_ms: now_unix_ms() + 600_000,
        }])
        .await;
    assert!(results[0].outcome.is_ok(), "write {copy_key}: {results:?}");
}

fn value(bytes: impl Into<Bytes>) -> Payload {
    Payload::Value(bytes.into())
}

/// Reads `copy_key` until a read is sent on the direct connection (the first read of a node
/// opens it in the background and goes through the client).
async fn until_direct(store: &RedisStore, metrics: &Metrics, copy_key: &CopyKey) {
    harness::poll(
        &format!("a read of {copy_key} sent on the direct connection"),
        Duration::from_secs(10),
        || async {
            let before = direct(metrics, "sent");
            let read = store.read_copy(copy_key).await;
            read.record.is_ok() && direct(metrics, "sent") > before
        },
    )
    .await;
}

/// Reads `copy_key` once, asserting that the read was sent on the direct connection.
async fn read_direct(
    store: &RedisStore,
    metrics: &Metrics,
    copy_key: &CopyKey,
) -> hotsplit::Result<Option<CopyRecord>> {
    let before = direct(metrics, "sent");
    let read = store.read_copy(copy_key).await;
    assert_eq!(
        direct(metrics, "sent"),
        before + 1,
        "the read of {copy_key} went on the direct connection"
    );
    assert_eq!(read.served_by.role, Role::Primary, "{:?}", read.served_by);
    read.record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_read_answers_what_the_client_answers() {
    let server = harness::shared_standalone();
    let metrics = Metrics::new();
    let store = store_on(&server.url(), harness::COMMAND_TIMEOUT, true, &metrics).await;
    let plain = store_on(
        &server.url(),
        harness::COMMAND_TIMEOUT,
        false,
        &Metrics::new(),
    )
    .await;
    let key = copy_key("dr:values", 0);
    write(&store, &key, 1, value("one")).await;
    until_direct(&store, &metrics, &key).await;

    // A write acknowledged on fred's connection is seen by the next direct read.
    write(&store, &key, 2, value("two")).await;
    let record = read_direct(&store, &metrics, &key)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(record.version.get(), 2);
    assert_eq!(record.payload, value("two"));

    // Binary bytes (CRLF, NUL, invalid UTF-8) and a 1 MiB value that arrives in many reads.
    let binary = Bytes::from_static(b"\r\n\0\xff$-1\r\n*4\r\n");
    let large = Bytes::from(vec![b'x'; 1 << 20]);
    for (version, bytes) in [(3, binary), (4, large)] {
        write(&store, &key, version, value(bytes.clone())).await;
        let record = read_direct(&store, &metrics, &key)
            .await
            .expect("read")
            .expect("present");
        assert_eq!(record.payload, value(bytes), "version {version}");
    }

    // A tombstone, an absent copy and a corrupt copy read as through the client.
    write(&store, &key, 5, Payload::Tombstone).await;
    let tomb = read_direct(&store, &metrics, &key).await.expect("read");
    assert_eq!(tomb, plain.read_copy(&key).await.record.expect("read"));
    assert_eq!(tomb.expect("a tombstone").payload, Payload::Tombstone);
    let absent = copy_key("dr:values-absent", 0);
    assert_eq!(
        read_direct(&store, &metrics, &absent).await.expect("read"),
        None
    );
    let corrupt = copy_key("dr:values-corrupt", 0);
    server
        .node
        .cli(&harness::corrupt_copy_command(corrupt.as_str()))
        .expect("HSET");
    let err = read_direct(&store, &metrics, &corrupt)
        .await
        .expect_err("a corrupt copy is an error");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.message().contains("corrupt"), "{err}");

    // Many reads at once share the connection; each gets its own copy's reply.
    let keys: Vec<CopyKey> = (0..400)
        .map(|at| copy_key(&format!("dr:many{at}"), 0))
        .collect();
    for (at, key) in keys.iter().enumerate() {
        write(&store, key, 1, value(format!("value {at}"))).await;
    }
    let before = direct(&metrics, "sent");
    let reads = join_all(keys.iter().map(|key| store.read_copy(key))).await;
    for (at, read) in reads.into_iter().enumerate() {
        let record = read.record.expect("read").expect("present");
        assert_eq!(record.payload, value(format!("value {at}")), "copy {at}");
    }
    assert_eq!(direct(&metrics, "sent"), before + 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_direct_reads_off_no_read_goes_direct() {
    let server = harness::shared_standalone();
    let metrics = Metrics::new();
    let store = store_on(&server.url(), harness::COMMAND_TIMEOUT, false, &metrics).await;
    let key = copy_key("dr:off", 0);
    write(&store, &key, 1, value("one")).await;
    for _ in 0..20 {
        let record = store.read_copy(&key).await.record.expect("read");
        assert_eq!(record.expect("present").payload, value("one"));
    }
    assert_eq!(
        (direct(&metrics, "sent"), direct(&metrics, "passed")),
        (0, 0)
    );
}

struct ResumeOnDrop<'a>(&'a Standalone);

impl Drop for ResumeOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.node.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_fails_direct_reads_with_timeout_and_a_killed_connection_comes_back() {
    let server = Standalone::start().expect("start a standalone redis-server");
    let metrics = Metrics::new();
    let timeout = Duration::from_millis(500);
    let store = store_on(&server.url(), timeout, true, &metrics).await;
    let key = copy_key("dr:paused", 0);
    write(&store, &key, 1, value("one")).await;
    until_direct(&store, &metrics, &key).await;

    server.node.pause().expect("SIGSTOP");
    let resume = ResumeOnDrop(&server);
    let reads = join_all((0..3).map(|_| store.read_copy(&key)));
    let reads = tokio::time::timeout(timeout * 10, reads)
        .await
        .expect("direct reads of a paused node return");
    drop(resume);
    for read in reads {
        let err = read.record.expect_err("a paused node's read fails");
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(
            err.message().contains(key.as_str())
                && err.message().contains(&server.node.port().to_string()),
            "{err}"
        );
    }
    assert_eq!(
        harness::sample(
            &metrics.render(),
            r#"hotsplit_store_errors_total{kind="timeout"}"#
        ),
        3
    );
    // Resumed, the node's reads go direct again (the timed-out connection was closed: its
    // late replies would answer the wrong reads).
    until_direct(&store, &metrics, &key).await;

    // Every client connection killed: the direct connection is opened again.
    server
        .node
        .cli(&["CLIENT", "KILL", "TYPE", "normal"])
        .expect("CLIENT KILL");
    harness::poll(
        "reads answer again after the connections were killed",
        Duration::from_secs(10),
        || async { store.read_copy(&key).await.record.is_ok() },
    )
    .await;
    until_direct(&store, &metrics, &key).await;
    let record = read_direct(&store, &metrics, &key)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(record.payload, value("one"));

    // A dropped store closes its direct connection with its client's.
    drop(store);
    harness::poll(
        "the dropped store's connections are closed",
        Duration::from_secs(10),
        || async {
            let info = server.node.cli(&["INFO", "clients"]).unwrap_or_default();
            // The one left is the INFO command's own.
            info.lines()
                .any(|line| line.trim() == "connected_clients:1")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_by_a_failover_answers_moved_and_the_read_follows_it() {
    let cluster: Cluster = harness::own_cluster().await;
    let metrics = Metrics::new();
    let store = store_on(&cluster.url(), harness::COMMAND_TIMEOUT, true, &metrics).await;
    let key = copy_key("dr:failover", 0);
    write(&store, &key, 1, value("one")).await;
    until_direct(&store, &metrics, &key).await;

    let (old, new) = harness::owner_and_replica(&cluster, key.as_str());
    cluster
        .cli(new, &["CLUSTER", "FAILOVER"])
        .expect("CLUSTER FAILOVER");
    harness::poll(
        "the replica is the key's master",
        Duration::from_secs(20),
        || async { harness::owner_port(&cluster, key.as_str()) == new },
    )
    .await;
    assert_ne!(old, new);

    // The direct connection still reaches the old master, now a replica, which answers
    // MOVED: the read goes again through the client, which follows it.
    let refused = direct(&metrics, "refused");
    let record = store
        .read_copy(&key)
        .await
        .record
        .expect("read after the failover")
        .expect("present");
    assert_eq!(record.payload, value("one"));
    assert_eq!(direct(&metrics, "refused"), refused + 1);

    // The client's slot map moved: a new write lands on the new master, and reads go direct
    // to it once its connection is open.
    write(&store, &key, 2, value("two")).await;
    until_direct(&store, &metrics, &key).await;
    let read = store.read_copy(&key).await;
    assert!(
        read.served_by.node.as_str().ends_with(&format!(":{new}")),
        "{:?}",
        read.served_by
    );
    assert_eq!(
        read.record.expect("read").expect("present").payload,
        value("two")
    );
}
