//! One conformance suite for every store: the embedded one, Redis 7 (standalone and Cluster),
//! and Valkey 8 (standalone and Cluster, when `HOTSPLIT_VALKEY_SERVER` names a binary).
//!
//! The same compare-and-set, expiry and tombstone rules must hold whichever store runs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hotsplit::key::{Key, Version};
use hotsplit::store::memory::MemoryStore;
use hotsplit::store::{
    now_unix_ms, CasOutcome, CopyStore, CopyWrite, LayoutStore, Payload, TopologyStore,
};

use crate::harness;

fn version(n: u64) -> Version {
    Version::new(n).unwrap()
}

fn write(key: &Key, copy: u32, n: u64, payload: Payload, expire_at_ms: u64) -> CopyWrite {
    CopyWrite {
        copy_key: key.copy_key(copy, hotsplit::key::Placement::Suffix),
        version: version(n),
        payload,
        expire_at_ms,
    }
}

fn value(text: &str) -> Payload {
    Payload::Value(Bytes::copy_from_slice(text.as_bytes()))
}

async fn write_one(store: &dyn CopyStore, write: CopyWrite) -> CasOutcome {
    let results = store.write_copies(std::slice::from_ref(&write)).await;
    assert_eq!(results.len(), 1);
    results
        .into_iter()
        .next()
        .unwrap()
        .outcome
        .expect("write succeeds")
}

async fn read_one(
    store: &dyn CopyStore,
    key: &Key,
    copy: u32,
) -> Option<hotsplit::store::CopyRecord> {
    store
        .read_copy(&key.copy_key(copy, hotsplit::key::Placement::Suffix))
        .await
        .record
        .expect("read succeeds")
}

/// Runs every conformance check against `store`, with keys under `prefix`.
async fn suite<S: CopyStore + LayoutStore + TopologyStore>(store: Arc<S>, prefix: &str) {
    let later = now_unix_ms() + 600_000;
    compare_and_set_rules(store.clone(), prefix, later).await;
    versions_compare_exactly(store.clone(), prefix, later).await;
    expired_copies_are_gone(store.clone(), prefix).await;
    expiry_never_brings_an_older_version_back(store.clone(), prefix, later).await;
    each_copy_of_a_call_has_its_outcome(store.clone(), prefix, later).await;
    racing_writers_end_at_the_maximum(store.clone(), prefix, later).await;
    allocated_versions_count_up(store.clone(), prefix).await;
    live_sets_show_the_other_instances(store.clone(), prefix).await;
    store.ping().await.expect("ping");
}

/// Compare-and-set on one copy: applied, current, stale, and tombstones against values.
async fn compare_and_set_rules<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
    later: u64,
) {
    let key = Key::parse(&format!("{prefix}:basic")).unwrap();

    // A write applies; the copy holds value, version and the absolute expiry.
    assert_eq!(
        write_one(&*store, write(&key, 0, 5, value("five"), later)).await,
        CasOutcome::Applied
    );
    let record = read_one(&*store, &key, 0).await.expect("copy exists");
    assert_eq!(
        (record.version, record.payload.clone(), record.expire_at_ms),
        (version(5), value("five"), later)
    );

    // The same version again is current and does not move the expiry.
    assert_eq!(
        write_one(&*store, write(&key, 0, 5, value("five"), later + 60_000)).await,
        CasOutcome::Current
    );
    assert_eq!(
        read_one(&*store, &key, 0).await.unwrap().expire_at_ms,
        later
    );

    // An older version is stale and changes nothing.
    assert_eq!(
        write_one(&*store, write(&key, 0, 4, value("four"), later)).await,
        CasOutcome::Stale { stored: version(5) }
    );
    assert_eq!(
        read_one(&*store, &key, 0).await.unwrap().payload,
        value("five")
    );

    // A tombstone applies and blocks every older or equal write.
    assert_eq!(
        write_one(&*store, write(&key, 0, 7, Payload::Tombstone, later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        read_one(&*store, &key, 0).await.unwrap().payload,
        Payload::Tombstone
    );
    assert_eq!(
        write_one(&*store, write(&key, 0, 6, value("six"), later)).await,
        CasOutcome::Stale { stored: version(7) }
    );
    // Equal versions: a value never replaces its own version's tombstone, a tombstone replaces
    // its own version's value, so either arrival order ends as the tombstone.
    assert_eq!(
        write_one(&*store, write(&key, 0, 7, value("seven"), later)).await,
        CasOutcome::Stale { stored: version(7) }
    );
    assert_eq!(
        write_one(&*store, write(&key, 0, 7, Payload::Tombstone, later)).await,
        CasOutcome::Current
    );
    assert_eq!(
        write_one(&*store, write(&key, 0, 8, value("eight"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        write_one(&*store, write(&key, 0, 8, Payload::Tombstone, later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        read_one(&*store, &key, 0).await.unwrap().payload,
        Payload::Tombstone
    );
    assert_eq!(
        write_one(&*store, write(&key, 0, 9, value("nine"), later)).await,
        CasOutcome::Applied
    );
}

/// Versions compare as numbers: above 2^53 exactly, and by length before bytes.
async fn versions_compare_exactly<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
    later: u64,
) {
    // Versions above 2^53 compare exactly.
    let big = Key::parse(&format!("{prefix}:big")).unwrap();
    let two53 = 1u64 << 53;
    assert_eq!(
        write_one(&*store, write(&big, 0, two53 + 1, value("a"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        write_one(&*store, write(&big, 0, two53, value("b"), later)).await,
        CasOutcome::Stale {
            stored: version(two53 + 1)
        }
    );
    assert_eq!(
        write_one(&*store, write(&big, 0, u64::MAX - 1, value("c"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        write_one(&*store, write(&big, 0, u64::MAX, value("d"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        read_one(&*store, &big, 0).await.unwrap().version,
        version(u64::MAX)
    );
    // 10 has more digits than 9: length decides before bytes.
    let digits = Key::parse(&format!("{prefix}:digits")).unwrap();
    assert_eq!(
        write_one(&*store, write(&digits, 0, 10, value("ten"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        write_one(&*store, write(&digits, 0, 9, value("nine"), later)).await,
        CasOutcome::Stale {
            stored: version(10)
        }
    );
}

/// A copy past its expiry is gone: written already expired, or expiring soon after.
async fn expired_copies_are_gone<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
) {
    // A write whose expiry has passed leaves nothing behind.
    let gone = Key::parse(&format!("{prefix}:expired")).unwrap();
    write_one(
        &*store,
        write(&gone, 0, 1, value("x"), now_unix_ms() - 1_000),
    )
    .await;
    assert!(read_one(&*store, &gone, 0).await.is_none());

    // A short expiry really expires.
    let short = Key::parse(&format!("{prefix}:short")).unwrap();
    write_one(
        &*store,
        write(&short, 0, 1, value("x"), now_unix_ms() + 150),
    )
    .await;
    harness::poll(
        "a copy with a 150 ms expiry to disappear",
        Duration::from_secs(5),
        || {
            let store = store.clone();
            let short = short.clone();
            async move { read_one(&*store, &short, 0).await.is_none() }
        },
    )
    .await;
}

/// Copies past their expiry still keep an older version out, and their own version's rules.
async fn expiry_never_brings_an_older_version_back<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
    later: u64,
) {
    // Expiry never brings an older version back. Version 7 is on 8 copies; copies 1 and 4 expire
    // early (the jitter window). A late write of version 1 is stale on every copy, the copies past
    // their expiry included, and no read returns version 1.
    let jitter = Key::parse(&format!("{prefix}:jitter")).unwrap();
    let early = now_unix_ms() + 150;
    let writes: Vec<CopyWrite> = (0..8)
        .map(|copy| {
            let expire_at_ms = if copy == 1 || copy == 4 { early } else { later };
            write(&jitter, copy, 7, value("seven"), expire_at_ms)
        })
        .collect();
    for result in store.write_copies(&writes).await {
        assert_eq!(result.outcome.unwrap(), CasOutcome::Applied);
    }
    harness::poll(
        "copies 1 and 4 to stop being served",
        Duration::from_secs(5),
        || {
            let store = store.clone();
            let jitter = jitter.clone();
            async move {
                read_one(&*store, &jitter, 1).await.is_none()
                    && read_one(&*store, &jitter, 4).await.is_none()
            }
        },
    )
    .await;
    let late: Vec<CopyWrite> = (0..8)
        .map(|copy| write(&jitter, copy, 1, value("one"), later))
        .collect();
    for (copy, result) in store.write_copies(&late).await.into_iter().enumerate() {
        assert_eq!(
            result.outcome.unwrap(),
            CasOutcome::Stale { stored: version(7) },
            "copy {copy}: a late older write must be stale while the version is retained"
        );
    }
    for copy in 0..8 {
        let served = read_one(&*store, &jitter, copy)
            .await
            .map(|record| record.version);
        let expected = (copy != 1 && copy != 4).then(|| version(7));
        assert_eq!(served, expected, "copy {copy}");
    }
    // The same edit refills a copy past its expiry; another body under that version is a
    // conflict, on a served copy and on one past its expiry alike.
    assert_eq!(
        write_one(&*store, write(&jitter, 1, 7, value("seven"), later)).await,
        CasOutcome::Applied
    );
    assert_eq!(
        read_one(&*store, &jitter, 1)
            .await
            .map(|record| (record.version, record.payload)),
        Some((version(7), value("seven")))
    );
    for copy in [0, 4] {
        assert_eq!(
            write_one(&*store, write(&jitter, copy, 7, value("other"), later)).await,
            CasOutcome::Conflict { stored: version(7) },
            "copy {copy}"
        );
    }
    assert!(read_one(&*store, &jitter, 4).await.is_none());
    // A tombstone of version 7 still replaces its value, past the expiry too.
    assert_eq!(
        write_one(&*store, write(&jitter, 4, 7, Payload::Tombstone, later)).await,
        CasOutcome::Applied
    );
}

/// One call writing several copies answers each copy's own outcome, in order.
async fn each_copy_of_a_call_has_its_outcome<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
    later: u64,
) {
    // Several copies in one call, each with its own outcome, in order.
    let multi = Key::parse(&format!("{prefix}:multi")).unwrap();
    write_one(&*store, write(&multi, 2, 9, value("nine"), later)).await;
    let writes: Vec<CopyWrite> = (0..8)
        .map(|copy| write(&multi, copy, 5, value("five"), later))
        .collect();
    let results = store.write_copies(&writes).await;
    for (copy, result) in results.iter().enumerate() {
        let expected = if copy == 2 {
            CasOutcome::Stale { stored: version(9) }
        } else {
            CasOutcome::Applied
        };
        assert_eq!(result.outcome.clone().unwrap(), expected, "copy {copy}");
    }
}

/// Concurrent writers of random versions leave every copy at the highest.
async fn racing_writers_end_at_the_maximum<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
    later: u64,
) {
    // 50 concurrent writers racing random versions: every copy ends at the maximum.
    let race = Key::parse(&format!("{prefix}:race")).unwrap();
    let mut tasks = Vec::new();
    let mut max = 0;
    for writer in 0..50u64 {
        let n = 1 + (writer * 7919 + 13) % 1000;
        max = max.max(n);
        let store = store.clone();
        let race = race.clone();
        tasks.push(tokio::spawn(async move {
            let writes: Vec<CopyWrite> = (0..8)
                .map(|copy| write(&race, copy, n, value(&n.to_string()), later))
                .collect();
            for result in store.write_copies(&writes).await {
                result.outcome.expect("racing write succeeds");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for copy in 0..8 {
        let record = read_one(&*store, &race, copy).await.unwrap();
        assert_eq!(record.version, version(max), "copy {copy}");
        assert_eq!(record.payload, value(&max.to_string()), "copy {copy}");
    }
}

/// Allocated versions count up from 1 and jump past a higher floor.
async fn allocated_versions_count_up<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
) {
    // Allocated versions count up from 1.
    let counted = Key::parse(&format!("{prefix}:counted")).unwrap();
    for expected in 1..=3 {
        assert_eq!(
            store.allocate_version(&counted, 60_000, 0).await.unwrap(),
            version(expected)
        );
    }
    // A floor above the counter moves it past the floor; one below changes nothing.
    assert_eq!(
        store.allocate_version(&counted, 60_000, 9).await.unwrap(),
        version(10)
    );
    assert_eq!(
        store.allocate_version(&counted, 60_000, 2).await.unwrap(),
        version(11)
    );
}

/// Live sets: each instance sees the others' copy counts, and entries lapse.
async fn live_sets_show_the_other_instances<S: CopyStore + LayoutStore + TopologyStore>(
    store: Arc<S>,
    prefix: &str,
) {
    // Live sets: each instance sees the others' copy counts, never its own; one leaving hides
    // no other with the same count; an entry lapses when not refreshed.
    let family = format!("{prefix}:live");
    assert!(store
        .join_layout(&family, 12, "big-1", 60_000)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store
            .join_layout(&family, 4, "small", 60_000)
            .await
            .unwrap(),
        vec![12]
    );
    let mut others = store
        .join_layout(&family, 12, "big-2", 60_000)
        .await
        .unwrap();
    others.sort_unstable();
    assert_eq!(others, vec![4, 12]);
    store.leave_layout(&family, 12, "big-1").await.unwrap();
    assert_eq!(
        store
            .join_layout(&family, 4, "small", 60_000)
            .await
            .unwrap(),
        vec![12]
    );
    store.leave_layout(&family, 12, "big-2").await.unwrap();
    assert!(store
        .join_layout(&family, 4, "small", 60_000)
        .await
        .unwrap()
        .is_empty());
    store.join_layout(&family, 8, "brief", 1).await.unwrap();
    harness::poll("a live entry lapses", Duration::from_secs(5), || async {
        store
            .join_layout(&family, 4, "small", 60_000)
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    // An instance name outside the allowed characters is refused, not stored.
    assert!(store.join_layout(&family, 4, "a b", 60_000).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_embedded() {
    suite(Arc::new(MemoryStore::new()), "conf-embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_redis_standalone() {
    let store =
        harness::redis_store(&harness::shared_standalone().url(), Duration::from_secs(2)).await;
    suite(store, "conf-standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_redis_cluster() {
    let store =
        harness::redis_store(&harness::shared_cluster().url(), Duration::from_secs(2)).await;
    suite(store, "conf-cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_valkey_standalone() {
    let Some(server) = harness::shared_valkey_standalone() else {
        return;
    };
    let url = server.url().replacen("redis://", "valkey://", 1);
    let store = harness::redis_store(&url, Duration::from_secs(2)).await;
    suite(store, "conf-valkey-standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_valkey_cluster() {
    let Some(cluster) = harness::valkey_cluster() else {
        return;
    };
    let url = cluster
        .url()
        .replacen("redis-cluster://", "valkey-cluster://", 1);
    let store = harness::redis_store(&url, Duration::from_secs(2)).await;
    suite(store, "conf-valkey-cluster").await;
}
