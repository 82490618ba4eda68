//! Healing targets, measured (not a timed test): drain rate of 10,000 queued entries once a
//! paused master resumes, memory overhead per queued entry, and spool appends per second with
//! group commit.
//!
//! Run with `cargo bench --bench heal`. It starts its own `redis-server` (standalone) and prints
//! one line per figure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use hotsplit::config::HealConfig;
use hotsplit::heal::{FailedCopy, RetryQueue, RetryWorker};
use hotsplit::key::{Key, Version};
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit::store::{now_unix_ms, CopyStore, NodeLabel, Payload};
use hotsplit_devcluster::Standalone;
use tokio_util::sync::CancellationToken;

/// Counts live heap bytes, to measure the queue's overhead per entry.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ENTRIES: u64 = 10_000;

fn failed(key: &Key, node: &NodeLabel) -> Vec<FailedCopy> {
    vec![FailedCopy {
        copy_key: key.copy_key(0, hotsplit::key::Placement::Suffix),
        node: node.clone(),
        expire_at_ms: now_unix_ms() + 600_000,
        error: "timeout".into(),
    }]
}

fn config() -> HealConfig {
    HealConfig {
        max_entries: 1_000_000,
        max_bytes: usize::MAX / 2,
        ..HealConfig::default()
    }
}

/// Queues `ENTRIES` entries for one node, then measures how fast the worker drains them.
async fn drain(store: Arc<RedisStore>, server: &Standalone, paused: bool) -> (f64, Duration) {
    let metrics = Metrics::new();
    let mut config = config();
    config.backoff_cap = Duration::from_millis(50);
    let queue = Arc::new(RetryQueue::in_memory(config, metrics.clone()));
    let value = Payload::Value(Bytes::from(vec![b'v'; 100]));
    let node = store.node_of(
        &Key::parse("x")
            .unwrap()
            .copy_key(0, hotsplit::key::Placement::Suffix),
    );
    if paused {
        server.node.pause().unwrap();
    }
    for n in 0..ENTRIES {
        let key = Key::parse(&format!("drain:{paused}:{n}")).unwrap();
        queue
            .enqueue(&key, Version::new(1).unwrap(), &value, failed(&key, &node))
            .await;
    }
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(
        RetryWorker::new(
            queue.clone(),
            store.clone() as Arc<dyn CopyStore>,
            metrics,
            256,
            Duration::from_secs(1),
        )
        .run(cancel.clone()),
    );
    if paused {
        // Let a few probes fail against the stopped server first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.node.resume().unwrap();
    }
    let started = Instant::now();
    while queue.depth() > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    cancel.cancel();
    let _ = worker.await;
    (ENTRIES as f64 / took.as_secs_f64(), took)
}

fn overhead_per_entry() -> f64 {
    let queue = RetryQueue::in_memory(config(), Metrics::new());
    let value = Payload::Value(Bytes::from(vec![b'v'; 100]));
    let node = NodeLabel::new("127.0.0.1:7000");
    let keys: Vec<Key> = (0..100_000)
        .map(|n| Key::parse(&format!("mem:{n:06}")).unwrap())
        .collect();
    let offers: Vec<Vec<FailedCopy>> = keys.iter().map(|key| failed(key, &node)).collect();
    let before = LIVE.load(Ordering::Relaxed);
    for (key, offer) in keys.iter().zip(offers) {
        // An in-memory queue answers at once.
        let _ = queue
            .enqueue(key, Version::new(1).unwrap(), &value, offer)
            .now_or_never();
    }
    let after = LIVE.load(Ordering::Relaxed);
    assert_eq!(queue.depth(), 100_000);
    // The one shared value was allocated before `before`, so the delta is pure overhead.
    (after - before) as f64 / 100_000.0
}

async fn spool_rate() -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let config = HealConfig {
        spool_dir: dir.path().to_owned(),
        ..config()
    };
    let queue = Arc::new(
        RetryQueue::open(config, 1 << 20, Metrics::new(), |_| NodeLabel::new("n")).unwrap(),
    );
    let value = Payload::Value(Bytes::from(vec![b'v'; 100]));
    let node = NodeLabel::new("n");
    let writers = 128u64;
    let per_writer = 800u64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let queue = queue.clone();
            let value = value.clone();
            let node = node.clone();
            tokio::spawn(async move {
                for n in 0..per_writer {
                    let key = Key::parse(&format!("spool:{writer}:{n}")).unwrap();
                    let admissions = queue
                        .enqueue(&key, Version::new(1).unwrap(), &value, failed(&key, &node))
                        .await;
                    assert_eq!(admissions, vec![hotsplit::heal::Admission::Queued]);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (writers * per_writer) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Standalone::start().unwrap();
        let mut options = RedisOptions::new(RedisTarget::parse(&server.url()).unwrap());
        options.command_timeout = Duration::from_millis(300);
        let store = Arc::new(RedisStore::connect(options, Metrics::new()).await.unwrap());

        let (rate, took) = drain(store.clone(), &server, false).await;
        println!("heal/drain_flush: {ENTRIES} entries drained in {took:?} = {rate:.0} entries/s (node up, first probe to empty)");
        let (rate, took) = drain(store.clone(), &server, true).await;
        println!("heal/drain_after_resume: {ENTRIES} entries drained in {took:?} = {rate:.0} entries/s (SIGCONT to empty, backoff cap 50 ms)");
        println!(
            "heal/overhead_per_entry: {:.0} bytes of heap per queued entry beyond its value (accounted: {} + 4 x copy key)",
            overhead_per_entry(),
            hotsplit::heal::queue::ENTRY_OVERHEAD_BYTES
        );
        println!(
            "heal/spool_appends: {:.0} durable records/s (128 writers, group commit, fdatasync per batch)",
            spool_rate().await
        );
    });
}
