//! The invalidation feed: one change, every instance told. Each instance keeps one connection
//! to every primary on which Redis itself pushes the name of every key a write changed there
//! (`CLIENT TRACKING ON BCAST`, [`crate::store::FeedStore`]), whoever wrote it: a publish, an
//! invalidation, a delete, a heal, a repair, a scrub fix, a split's fill or merge made by any
//! instance. A copy key's push invalidates the logical key in this instance's tracking table
//! (the client-side caches it serves, [`crate::tracking`]) and drops the copy's near-cache
//! entry, keeping its floor record.
//!
//! Why Redis's own tracking rather than a channel of our own: it costs a publish nothing (no
//! extra write, no extra round trip), it sees every path that writes a copy, those of older
//! releases and of operators included, and it rides the connection and credentials the store
//! already has (TLS, ACL users: `+hello +client|tracking`).
//!
//! # Liveness, with a number
//! A feed is only trusted while it proves it is current: every `max_silence / 4` the instance
//! writes a heartbeat of its own on every primary (`hotsplit:hb:{tag}:feed/INSTANCE`), and any
//! heartbeat key's push is a proof. A primary's pushes arrive in the order its writes were
//! made, so once a heartbeat written at `t` arrived, every change before `t` did. When a feed's
//! last proof is older than `max_silence` (a paused or partitioned primary, a slow link), when
//! its connection drops or is (re)made, or when it could not keep up with its pushes, the
//! instance invalidates every key every tracking connection holds (one push each, not the null
//! invalidation: `crate::tracking::Tracking::flush_all`), drops its near-cache
//! entries (their floor records stay), says so in `hotsplit_feed_flushes_total{cause}` and a
//! log line, and caps every lease at `max_silence` until every feed is current again
//! (`/readyz` shows `feed_down`, `hotsplit_feed_up` is 0). A primary with no feed open (one
//! being opened, or that cannot be) is not current either: its changes reach nobody here.
//!
//! The delivery bound: a change made elsewhere reaches this instance's clients within
//! `max_silence` plus one heartbeat interval of its write, or every client is flushed. Feeds are
//! opened beside the heartbeat tick, never in it, so a primary that does not answer a connect
//! (a partition drops it silently) delays neither the proofs nor the judging of the others.
//! Tests: `feed::tests`, and on real partitions `feed_partition` (integration).

mod config;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use tokio_util::sync::CancellationToken;

pub use config::FeedConfig;

use crate::error::Result;
use crate::key::CopyKey;
use crate::metrics::{register, register_with_unit, Metrics};
use crate::near::NearCache;
use crate::store::{FeedConnection, FeedEvent, FeedStore, NodeLabel, TopologyStore};
pub use crate::tracking::feed_state::{FeedState, FeedView};
use crate::tracking::Tracking;

/// The prefix of every heartbeat key (`store::redis::topology`): a push of one is a proof.
const HEARTBEAT_PREFIX: &str = "hotsplit:hb:";

/// Why the feed flushed (the `cause` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushCause {
    /// A feed's last proof was older than `max_silence`.
    Silence,
    /// A feed's connection closed.
    Closed,
    /// A feed connection was made (or made again): what changed before it is unknown.
    Connected,
    /// The feed fell behind its pushes (some were lost).
    Lagged,
    /// Redis sent its null invalidation (a `FLUSHALL`).
    Redis,
}

impl FlushCause {
    /// Every cause, in label order.
    const ALL: [FlushCause; 5] = [
        FlushCause::Silence,
        FlushCause::Closed,
        FlushCause::Connected,
        FlushCause::Lagged,
        FlushCause::Redis,
    ];

    /// The `cause` label.
    fn label(self) -> &'static str {
        match self {
            FlushCause::Silence => "silence",
            FlushCause::Closed => "closed",
            FlushCause::Connected => "connected",
            FlushCause::Lagged => "lagged",
            FlushCause::Redis => "redis",
        }
    }
}

/// Labels of the flush counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    /// One of [`FlushCause::label`].
    cause: &'static str,
}

/// The feed's metrics.
#[derive(Debug, Clone)]
struct FeedMetrics {
    /// Flushes, indexed like [`FlushCause::ALL`].
    flushes: Box<[Counter]>,
    /// Feed connections made again to a primary whose feed had closed.
    reconnects: Counter,
    /// Feed connections open.
    connections: Gauge,
    /// 1 while every feed is current, else 0.
    up: Gauge,
    /// From a heartbeat write accepted by a primary to its push read here.
    lag: Histogram,
    /// Keys the feed invalidated.
    keys: Counter,
}

impl FeedMetrics {
    /// Registers the families in `registry`.
    fn register(registry: &mut Registry) -> FeedMetrics {
        let family: Family<CauseLabels, Counter> = register(
            registry,
            "feed_flushes",
            "Null invalidations sent to every tracking connection (and near-cache entries dropped) because a feed could not vouch for its changes, by cause (silence, closed, connected, lagged, redis)",
        );
        let flushes = FlushCause::ALL
            .iter()
            .map(|cause| {
                let counter = family
                    .get_or_create(&CauseLabels {
                        cause: cause.label(),
                    })
                    .clone();
                counter
            })
            .collect();
        FeedMetrics {
            flushes,
            reconnects: register(
                registry,
                "feed_reconnects",
                "Feed connections made again to a primary whose feed had closed",
            ),
            connections: register(registry, "feed_connections", "Feed connections open (one per primary)"),
            up: register(
                registry,
                "feed_up",
                "1 while every primary's feed is current (a proof within feed.max_silence), else 0 (leases are then capped at feed.max_silence)",
            ),
            lag: register_with_unit(
                registry,
                "feed_lag",
                "From this instance's feed heartbeat write to its push read back through the feed: the path every other instance's change takes",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            ),
            keys: register(
                registry,
                "feed_keys",
                "Copy keys the feed told of (each invalidates its logical key's client-side caches and its near-cache entry)",
            ),
        }
    }
}

/// One primary's feed, as its reader and the supervisor share it.
#[derive(Debug)]
struct Link {
    /// When its last proof arrived, in µs since the feed started.
    proof_us: AtomicU64,
    /// When this instance last wrote its feed heartbeat there, in µs since the feed started.
    wrote_us: AtomicU64,
    /// Its connection closed.
    closed: AtomicBool,
    /// A heartbeat write is in flight.
    writing: AtomicBool,
}

/// What the feed tells when a change arrives.
#[derive(Clone)]
struct Sinks {
    /// The client-side caches' table.
    tracking: Arc<Tracking>,
    /// The near cache, when on.
    near: Option<Arc<NearCache>>,
    /// The counters.
    metrics: FeedMetrics,
    /// `feed.max_silence`: the lease cap a flush sets at once.
    max_silence: Duration,
}

impl Sinks {
    /// Every client cache of this instance and its near cache can no longer be vouched for.
    /// Leases are capped first, in the same step: a read answered after the flush (before the
    /// next tick judges the feeds) must not be given a lease the feed cannot vouch for. The
    /// next tick lifts the cap if every feed is current by then.
    fn flush(&self, cause: FlushCause, primary: &NodeLabel) {
        self.tracking.cap_leases(Some(self.max_silence));
        let told = self.tracking.flush_all();
        let dropped = self.near.as_ref().map_or(0, |near| near.drop_all());
        self.metrics.flushes[cause as usize].inc();
        tracing::warn!(
            %primary,
            cause = cause.label(),
            tracking_connections = told,
            near_cache_entries = dropped,
            "the invalidation feed cannot vouch for what it told: every client-side cache of this instance is flushed"
        );
    }

    /// The stored keys `keys` changed.
    fn changed(&self, keys: &[String]) {
        let copies: Vec<(crate::key::Key, CopyKey)> =
            keys.iter().filter_map(|key| CopyKey::parse(key)).collect();
        if copies.is_empty() {
            return;
        }
        self.metrics.keys.inc_by(copies.len() as u64);
        self.tracking
            .changed(copies.iter().map(|(key, _)| key.as_str()));
        if let Some(near) = &self.near {
            for (_, copy) in &copies {
                near.drop_entry(copy.as_str());
            }
        }
    }
}

/// The parts the feed runs with.
pub struct FeedParts {
    /// The feed connections.
    pub store: Arc<dyn FeedStore>,
    /// The primaries, and where the heartbeats are written.
    pub topology: Arc<dyn TopologyStore>,
    /// The client-side caches' table.
    pub tracking: Arc<Tracking>,
    /// The near cache, when on.
    pub near: Option<Arc<NearCache>>,
    /// This instance's name (its heartbeat key).
    pub instance: String,
    /// `feed.max_silence` in force.
    pub max_silence: Duration,
    /// The registry the feed counts into.
    pub metrics: Arc<Metrics>,
    /// What the views read.
    pub state: Arc<FeedState>,
}

/// A feed connection being opened: its primary, and how the attempt ended (`None`: it timed
/// out).
type Opening = BoxFuture<'static, (NodeLabel, Option<Result<FeedConnection>>)>;

/// The feed's supervisor: keeps a connection per primary, writes the proofs, judges them.
pub struct Feed {
    /// Its parts.
    parts: FeedParts,
    /// What a change and a flush reach.
    sinks: Sinks,
    /// When the feed started (the links' clock).
    started: Instant,
    /// The open feeds, by primary, with what closes each.
    links: HashMap<NodeLabel, (Arc<Link>, Box<dyn Send + Sync>)>,
    /// Primaries whose silence was already flushed (one flush per silence).
    silent: HashSet<NodeLabel>,
    /// Primaries whose feed was open once (a new one is a reconnect).
    ever: HashSet<NodeLabel>,
    /// Feed connections being opened, polled beside the tick rather than awaited in it: a
    /// connect to a partitioned primary waits out its timeout (seconds) while the other
    /// feeds' proofs must still be written and judged every tick.
    opening: FuturesUnordered<Opening>,
    /// The primaries in `opening` (one attempt each at a time).
    pending: HashSet<NodeLabel>,
}

impl Feed {
    /// A feed over `parts`, registering its metrics.
    pub fn new(parts: FeedParts) -> Feed {
        let metrics = parts.metrics.register_with(FeedMetrics::register);
        let sinks = Sinks {
            tracking: parts.tracking.clone(),
            near: parts.near.clone(),
            metrics,
            max_silence: parts.max_silence,
        };
        Feed {
            parts,
            sinks,
            started: Instant::now(),
            links: HashMap::new(),
            silent: HashSet::new(),
            ever: HashSet::new(),
            opening: FuturesUnordered::new(),
            pending: HashSet::new(),
        }
    }

    /// µs since the feed started.
    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Runs until `shutdown`: every `max_silence / 4`, starts opening the feeds it lacks,
    /// writes the proofs, and judges every primary's feed; a feed whose opening ends between
    /// ticks is added then.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let tick = (self.parts.max_silence / 4).max(Duration::from_millis(5));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                Some((primary, opened)) = self.opening.next(), if !self.opening.is_empty() => {
                    self.opened(primary, opened);
                    continue;
                }
                _ = interval.tick() => {}
            }
            let primaries = self.parts.topology.primaries();
            self.open_missing(&primaries);
            self.write_proofs();
            self.judge(&primaries);
        }
    }

    /// Drops the feeds of nodes no longer primaries, and closed ones, and starts opening a
    /// feed to every primary of `primaries` that has none and none being opened.
    fn open_missing(&mut self, primaries: &[NodeLabel]) {
        self.links.retain(|node, (link, _)| {
            primaries.contains(node) && !link.closed.load(Ordering::Acquire)
        });
        self.sinks.metrics.connections.set(gauge(self.links.len()));
        let within = self.parts.max_silence.max(Duration::from_secs(2));
        for primary in primaries {
            if self.links.contains_key(primary) || !self.pending.insert(primary.clone()) {
                continue;
            }
            let store = self.parts.store.clone();
            let primary = primary.clone();
            self.opening.push(Box::pin(async move {
                let opened = tokio::time::timeout(within, store.open_feed(&primary))
                    .await
                    .ok();
                (primary, opened)
            }));
        }
    }

    /// The opening of `primary`'s feed ended: the feed is added (and flushed: what changed
    /// before it was not told), or the next tick tries again.
    fn opened(&mut self, primary: NodeLabel, opened: Option<Result<FeedConnection>>) {
        self.pending.remove(&primary);
        match opened {
            Some(Ok(connection)) => {
                self.add(primary, connection);
                self.sinks.metrics.connections.set(gauge(self.links.len()));
            }
            Some(Err(err)) => {
                tracing::warn!(%primary, error = %err, "could not open the invalidation feed; retrying");
            }
            None => {
                tracing::warn!(%primary, "opening the invalidation feed timed out; retrying");
            }
        }
    }

    /// Starts reading the feed `connection` of `primary`, and flushes: what changed before it
    /// was not told.
    fn add(&mut self, primary: NodeLabel, connection: FeedConnection) {
        let link = Arc::new(Link {
            proof_us: AtomicU64::new(self.now_us()),
            wrote_us: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            writing: AtomicBool::new(false),
        });
        let reader = Reader {
            primary: primary.clone(),
            link: link.clone(),
            sinks: self.sinks.clone(),
            started: self.started,
            own_suffix: format!("feed/{}", self.parts.instance),
        };
        tokio::spawn(reader.run(connection.events));
        self.links.insert(primary.clone(), (link, connection.guard));
        self.sinks.flush(FlushCause::Connected, &primary);
        self.silent.remove(&primary);
        if !self.ever.insert(primary) {
            self.sinks.metrics.reconnects.inc();
        }
    }

    /// Writes this instance's feed heartbeat on every primary with a feed (one write in flight
    /// per primary at most).
    fn write_proofs(&self) {
        let instance = format!("feed/{}", self.parts.instance);
        for (primary, (link, _)) in &self.links {
            if link.writing.swap(true, Ordering::AcqRel) {
                continue;
            }
            let topology = self.parts.topology.clone();
            let (primary, link, instance) = (primary.clone(), link.clone(), instance.clone());
            let started = self.started;
            tokio::spawn(async move {
                let now_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                link.wrote_us.store(now_us, Ordering::Release);
                let stamp = crate::store::now_unix_ms().saturating_mul(1000);
                if let Err(err) = topology.write_heartbeat(&primary, &instance, stamp).await {
                    tracing::debug!(%primary, error = %err, "feed heartbeat write failed");
                }
                link.writing.store(false, Ordering::Release);
            });
        }
    }

    /// Flushes once for each feed whose last proof is older than `max_silence`, caps leases
    /// while any of `primaries` has no current feed (a silent one, a closed one, or none open:
    /// one being opened, or that cannot be), and publishes the view.
    fn judge(&mut self, primaries: &[NodeLabel]) {
        let now = self.now_us();
        let bound_us = u64::try_from(self.parts.max_silence.as_micros()).unwrap_or(u64::MAX);
        let mut views = Vec::new();
        let mut all_current = !primaries.is_empty();
        for primary in primaries {
            let Some((link, _)) = self.links.get(primary) else {
                // No feed: a change made there reaches no client of this instance. Its close
                // (or its start: no client held anything yet) was flushed; its opening flushes
                // again.
                all_current = false;
                views.push((primary.to_string(), None));
                continue;
            };
            let age_us = now.saturating_sub(link.proof_us.load(Ordering::Acquire));
            let closed = link.closed.load(Ordering::Acquire);
            let current = !closed && age_us <= bound_us;
            all_current &= current;
            if !current && self.silent.insert(primary.clone()) && !closed {
                self.sinks.flush(FlushCause::Silence, primary);
            }
            if current {
                self.silent.remove(primary);
            }
            views.push((primary.to_string(), (!closed).then_some(age_us / 1000)));
        }
        views.sort();
        let cap = (!all_current).then_some(self.parts.max_silence);
        self.parts.tracking.cap_leases(cap);
        self.sinks.metrics.up.set(i64::from(all_current));
        self.parts.state.set(FeedView {
            enabled: true,
            up: all_current,
            max_silence_ms: crate::duration::millis(self.parts.max_silence),
            primaries: views,
        });
    }
}

/// Reads one primary's feed.
struct Reader {
    /// The primary.
    primary: NodeLabel,
    /// Its link.
    link: Arc<Link>,
    /// What its changes reach.
    sinks: Sinks,
    /// The links' clock.
    started: Instant,
    /// The end of this instance's own feed heartbeat key.
    own_suffix: String,
}

impl Reader {
    /// Reads events until the connection closes.
    async fn run(self, mut events: tokio::sync::mpsc::Receiver<FeedEvent>) {
        while let Some(event) = events.recv().await {
            match event {
                FeedEvent::Keys(keys) => self.keys(&keys),
                FeedEvent::Flush => self.sinks.flush(FlushCause::Lagged, &self.primary),
                FeedEvent::Closed => break,
            }
        }
        self.link.closed.store(true, Ordering::Release);
        self.sinks.flush(FlushCause::Closed, &self.primary);
    }

    /// A push of `keys`: heartbeats are proofs, copy keys changes.
    fn keys(&self, keys: &[String]) {
        let now_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut proof = false;
        for key in keys.iter().filter(|key| key.starts_with(HEARTBEAT_PREFIX)) {
            proof = true;
            if key.ends_with(&self.own_suffix) {
                let wrote = self.link.wrote_us.load(Ordering::Acquire);
                if wrote > 0 && now_us >= wrote {
                    let lag = Duration::from_micros(now_us - wrote);
                    self.sinks.metrics.lag.observe(lag.as_secs_f64());
                }
            }
        }
        if proof {
            self.link.proof_us.fetch_max(now_us, Ordering::AcqRel);
        }
        self.sinks.changed(keys);
    }
}

/// A count as a gauge's value.
fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
