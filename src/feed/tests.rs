//! The feed's supervisor without Redis: two primaries, `a:1` that answers and `b:1` whose
//! connect hangs until it is "healed" (a partition drops a connect silently), each feed a
//! channel the test's fake store pushes heartbeat keys into.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::error::Result;
use crate::store::{FeedConnection, ReplicaSet};
use crate::tracking::{Mode, Outbox};

/// `feed.max_silence` of these tests (a heartbeat interval of 25 ms).
const SILENCE: Duration = Duration::from_millis(100);

/// Two primaries; what the feed writes and opens through.
struct Fake {
    /// Whether `b:1` can be connected to: its connect hangs until this is `true`.
    b_reachable: watch::Sender<bool>,
    /// The open feeds, by primary: a heartbeat written there is pushed on it.
    feeds: Mutex<HashMap<NodeLabel, mpsc::Sender<FeedEvent>>>,
    /// Primaries whose heartbeat writes are lost (their feeds fall silent).
    silent: Mutex<HashSet<NodeLabel>>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake {
            b_reachable: watch::channel(false).0,
            feeds: Mutex::new(HashMap::new()),
            silent: Mutex::new(HashSet::new()),
        })
    }
}

impl FeedStore for Fake {
    fn open_feed<'a>(&'a self, primary: &'a NodeLabel) -> BoxFuture<'a, Result<FeedConnection>> {
        Box::pin(async move {
            if primary.as_str() == "b:1" {
                let mut reachable = self.b_reachable.subscribe();
                let _ = reachable.wait_for(|reachable| *reachable).await;
            }
            let (events, receiver) = mpsc::channel(64);
            self.feeds.lock().unwrap().insert(primary.clone(), events);
            Ok(FeedConnection {
                events: receiver,
                guard: Box::new(()),
            })
        })
    }
}

impl TopologyStore for Fake {
    fn kind(&self) -> &'static str {
        "redis-cluster"
    }
    fn topology(&self) -> Vec<ReplicaSet> {
        Vec::new()
    }
    fn primaries(&self) -> Vec<NodeLabel> {
        vec![NodeLabel::new("a:1"), NodeLabel::new("b:1")]
    }
    fn refresh_topology(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn write_heartbeat<'a>(
        &'a self,
        primary: &'a NodeLabel,
        instance: &'a str,
        _stamp_us: u64,
    ) -> BoxFuture<'a, Result<()>> {
        if !self.silent.lock().unwrap().contains(primary) {
            if let Some(feed) = self.feeds.lock().unwrap().get(primary) {
                let key = format!("{HEARTBEAT_PREFIX}{{{primary}}}:{instance}");
                let _ = feed.try_send(FeedEvent::Keys(vec![key]));
            }
        }
        Box::pin(async { Ok(()) })
    }
    fn read_heartbeat<'a>(
        &'a self,
        _replica: &'a NodeLabel,
        _instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async { Ok(None) })
    }
    fn replication_offset<'a>(&'a self, _node: &'a NodeLabel) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async { Ok(0) })
    }
    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn ping_node<'a>(
        &'a self,
        _node: &'a NodeLabel,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// Starts a feed over `fake` (`max_silence` [`SILENCE`]) with a tracking table holding one
/// tracking connection (its outbox); stops when the token is cancelled.
fn start(fake: &Arc<Fake>) -> (Arc<Tracking>, Arc<Outbox>, CancellationToken) {
    start_with(fake, SILENCE)
}

/// [`start`] with `max_silence`.
fn start_with(
    fake: &Arc<Fake>,
    max_silence: Duration,
) -> (Arc<Tracking>, Arc<Outbox>, CancellationToken) {
    let tracking = Arc::new(Tracking::default());
    let outbox = Outbox::new();
    tracking.open(1, &outbox);
    tracking.start(1, &outbox, Mode::default()).unwrap();
    let feed = Feed::new(FeedParts {
        store: fake.clone(),
        topology: fake.clone(),
        tracking: tracking.clone(),
        near: None,
        instance: "i".to_owned(),
        max_silence,
        metrics: Metrics::new(),
        state: tracking.feed().clone(),
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(feed.run(shutdown.clone()));
    (tracking, outbox, shutdown)
}

/// The key the test's connection tracks with a long lease ([`watch`]): a flush pushes it.
const WATCHED: &str = "watched";

/// Tracks [`WATCHED`] on the test's connection for an hour.
fn watch(tracking: &Tracking) {
    let seq = tracking.begin(1, WATCHED).unwrap();
    tracking.settle(1, WATCHED, seq, Some(Duration::from_secs(3600)));
}

/// Whether the outbox holds [`WATCHED`]'s push (a flush), draining it.
fn flushed(outbox: &Outbox) -> bool {
    outbox.drain().keys.iter().any(|key| &**key == WATCHED)
}

/// Waits (real time: the feed's clock is `std::time::Instant`) until `check` holds; panics
/// naming `what` after `within`.
async fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// The proof age the view shows for `primary`, in ms (`None`: no feed).
fn age_ms(tracking: &Tracking, primary: &str) -> Option<u64> {
    tracking
        .feed()
        .view()
        .primaries
        .into_iter()
        .find(|(node, _)| node == primary)
        .and_then(|(_, age)| age)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_feed_cannot_be_opened_keeps_the_feed_down_and_leases_capped() {
    let fake = Fake::new();
    let (tracking, _outbox, shutdown) = start(&fake);
    // Judged from the first tick, though b's connect hangs (its timeout is 2 s).
    until("a view while b's connect hangs", SILENCE * 5, || {
        tracking.feed().view().enabled && age_ms(&tracking, "a:1").is_some()
    })
    .await;
    let sampled = Instant::now();
    while sampled.elapsed() < SILENCE * 3 {
        let view = tracking.feed().view();
        assert!(!view.up, "up without a feed of b:1: {view:?}");
        assert_eq!(
            tracking.capped(Duration::from_secs(10)),
            SILENCE,
            "a lease uncapped without a feed of b:1: {view:?}"
        );
        assert!(
            view.primaries.contains(&("b:1".to_owned(), None)),
            "{view:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Healed: b's connect goes through, its heartbeats prove it, the cap is lifted.
    fake.b_reachable.send_replace(true);
    until("every feed current after the heal", SILENCE * 10, || {
        tracking.feed().view().up
    })
    .await;
    assert_eq!(
        tracking.capped(Duration::from_secs(10)),
        Duration::from_secs(10)
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_feed_is_flushed_in_time_while_another_primary_s_connect_hangs() {
    let fake = Fake::new();
    let (tracking, outbox, shutdown) = start(&fake);
    until("a's feed current", SILENCE * 5, || {
        age_ms(&tracking, "a:1").is_some_and(|age| age < 50)
    })
    .await;
    let _ = outbox.drain();
    watch(&tracking);
    fake.silent.lock().unwrap().insert(NodeLabel::new("a:1"));
    // Its last proof is at most one heartbeat interval old now: flushed within max_silence
    // plus two intervals (one for the last proof's age, one for the tick that judges it), and
    // some room for a loaded machine; long before b's connect times out (2 s).
    let flushed = until("a's silence flushed", SILENCE * 5, || flushed(&outbox)).await;
    assert!(
        flushed <= SILENCE * 3,
        "a's silence was flushed {flushed:?} after it began"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_feed_caps_leases_from_its_flush_on() {
    // A long heartbeat interval (100 ms): a lease given between the flush and the next tick
    // would show.
    let silence = Duration::from_millis(400);
    let fake = Fake::new();
    fake.b_reachable.send_replace(true);
    let (tracking, outbox, shutdown) = start_with(&fake, silence);
    until("every feed current", silence * 5, || {
        tracking.feed().view().up
    })
    .await;
    let _ = outbox.drain();
    watch(&tracking);
    // b's feed closes, and b cannot be reached again.
    fake.b_reachable.send_replace(false);
    let closed = fake.feeds.lock().unwrap().remove(&NodeLabel::new("b:1"));
    drop(closed);
    let started = Instant::now();
    while !flushed(&outbox) {
        assert!(
            started.elapsed() < silence,
            "no flush after b's feed closed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        tracking.capped(Duration::from_secs(10)),
        silence,
        "a lease given right after the flush is not capped"
    );
    // And capped for as long as b's feed cannot be reopened; the view (refreshed every
    // tick) says so from the next tick on.
    let sampled = Instant::now();
    while sampled.elapsed() < silence * 2 {
        assert_eq!(tracking.capped(Duration::from_secs(10)), silence);
        let view = tracking.feed().view();
        assert!(
            !view.up || sampled.elapsed() < silence / 2,
            "up without a feed of b:1: {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
}
