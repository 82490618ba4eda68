//! Client-side caching's tracking table: which Redis-protocol connection may hold which
//! logical key in its client's cache, until when, and the invalidations it is owed.
//!
//! - `table`: the table (keys → connections, leases in time order, `BCAST` prefixes,
//!   `REDIRECT` targets), under one lock.
//! - [`outbox`]: one connection's pushes not yet written; its loop writes them between
//!   replies (`resp::conn`).
//! - [`store`]: the copy store every part writes through, which tells the table when a copy
//!   of a key changed here (publish, invalidation, delete, retry-queue heal, read repair, the
//!   scrub, a split's fill and merge). The layout sweeps (copies beyond a shrunk count, the
//!   names a closed placement window no longer writes) delete copies no reader is answered
//!   from, and go around it.
//!
//! # Invariants
//! - **A lease bounds every cached answer.** A read settles its key with the lease the door
//!   computed (the class's `near_cache_max_age` less the answer's own age, at most until its
//!   copy expires) or with none; the lease clock ([`Tracking::run_clock`]) pushes the key's
//!   invalidation when the lease ends. Test: `client_side_caching::…lease…`.
//! - **Tracked before read.** A key is tracked from before its read starts ([`Tracking::begin`]),
//!   so a change while the read runs is pushed before the read's reply, and the client drops
//!   the answer it was about to cache (redis-py's and node-redis's in-flight rule).
//! - **Never a lost push.** An outbox over `resp.tracking_max_push_bytes` closes its
//!   connection; a table over a bound invalidates keys (pushes them) to make room, never
//!   forgets one. Tests: `tracking::tests::…`.
//! - **One-shot.** An invalidated key is tracked again only when read again.
//! - **A flush pushes every tracked key**, never the null invalidation, which node-redis
//!   applies without invalidating its reads in flight (`table::Table::flush_all`). Tests:
//!   `tracking::tests::a_flush_…`, `client_cache::a_flush_while_node_redis_reads_…`.

pub mod feed_state;
pub mod outbox;
mod recent;
pub mod store;
mod table;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::{register, Metrics};

pub use outbox::{Close, Drained, Outbox};

use table::Table;
pub use table::{Refused, Sent};

/// How long a change waits for the connections it pushed to to write the invalidation
/// ([`Told::written`]): an idle connection writes it at once; a busy one between its
/// replies. A connection that writes nothing within it does not hold the change longer.
pub const PUSH_WRITTEN_WITHIN: Duration = Duration::from_millis(100);

tokio::task_local! {
    /// The connection whose command is running (a write's origin, for `NOLOOP`).
    static ORIGIN: u64;
}

/// Runs `future` as connection `id`'s command: a copy change it makes names `id` as its
/// origin, so a `NOLOOP` connection is not pushed its own change.
pub async fn as_origin<F: std::future::Future>(id: u64, future: F) -> F::Output {
    ORIGIN.scope(id, future).await
}

/// The connection whose command is running in this task, if any.
fn origin() -> Option<u64> {
    ORIGIN.try_with(|id| *id).ok()
}

/// A connection's tracking mode, as `CLIENT TRACKING ON …` set it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mode {
    /// `BCAST`: every change under its prefixes is pushed, read or not.
    pub bcast: bool,
    /// `PREFIX p…` (with `BCAST`); none: every key.
    pub prefixes: Vec<Vec<u8>>,
    /// `NOLOOP`: its own changes are not pushed to it.
    pub noloop: bool,
    /// `REDIRECT id`; 0: none.
    pub redirect: u64,
}

impl Mode {
    /// Whether a `BCAST` connection in this mode is told of a change of `key`.
    fn matches(&self, key: &str) -> bool {
        self.prefixes.is_empty()
            || self
                .prefixes
                .iter()
                .any(|prefix| key.as_bytes().starts_with(prefix))
    }
}

/// The bounds of the table (`resp.tracking_*`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `resp.tracking_max_bytes`: the instance's tracked keys.
    pub max_bytes: usize,
    /// `resp.tracking_max_bytes_per_connection`.
    pub max_bytes_per_connection: usize,
    /// `resp.tracking_max_prefixes`: prefixes of one `BCAST` connection.
    pub max_prefixes: usize,
    /// `resp.tracking_max_push_bytes`: one connection's pushes not written yet.
    pub max_push_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: 64 * 1024 * 1024,
            max_bytes_per_connection: 4 * 1024 * 1024,
            max_prefixes: 64,
            max_push_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Why a key's invalidation was pushed (the `cause` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A copy it may be answered from changed.
    Change,
    /// Its lease ended.
    Lease,
    /// A bound needed its room.
    Evicted,
    /// Its answer may not be cached (pushed just before the reply).
    Uncacheable,
    /// A flush: every tracked key pushed (`Tracking::flush_all`).
    Flush,
}

impl Cause {
    /// Every cause, in label order (an index into [`Sent::by_cause`]).
    pub const ALL: [Cause; 5] = [
        Cause::Change,
        Cause::Lease,
        Cause::Evicted,
        Cause::Uncacheable,
        Cause::Flush,
    ];

    /// The `cause` label.
    fn label(self) -> &'static str {
        match self {
            Cause::Change => "change",
            Cause::Lease => "lease",
            Cause::Evicted => "evicted",
            Cause::Uncacheable => "uncacheable",
            Cause::Flush => "flush",
        }
    }
}

/// Labels of the invalidation counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    /// One of [`Cause::label`].
    cause: &'static str,
}

/// The table's metrics.
#[derive(Debug, Clone)]
struct TrackingMetrics {
    /// Invalidations pushed, indexed like [`Cause::ALL`].
    invalidations: Box<[Counter]>,
    /// Connections closed because their pushes passed their bound.
    overflows: Counter,
    /// Keys tracked (per connection).
    keys: Gauge,
    /// Bytes they are counted for.
    bytes: Gauge,
    /// Connections tracking.
    connections: Gauge,
}

impl TrackingMetrics {
    /// Registers the families in `registry`.
    fn register(registry: &mut Registry) -> TrackingMetrics {
        let family: Family<CauseLabels, Counter> = register(
            registry,
            "resp_tracking_invalidations",
            "Invalidations pushed to client-side caches, by cause (change, lease, evicted, uncacheable, flush)",
        );
        let invalidations = Cause::ALL
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
        TrackingMetrics {
            invalidations,
            overflows: register(
                registry,
                "resp_tracking_overflows",
                "Connections closed because their pending invalidations passed resp.tracking_max_push_bytes",
            ),
            keys: register(
                registry,
                "resp_tracking_keys",
                "Keys tracked for client-side caches (a key two connections track counts twice)",
            ),
            bytes: register(
                registry,
                "resp_tracking_bytes",
                "Bytes the tracked keys are counted for (bounded by resp.tracking_max_bytes)",
            ),
            connections: register(
                registry,
                "resp_tracking_connections",
                "Connections with CLIENT TRACKING on",
            ),
        }
    }
}

/// The connections a change was pushed to, each with how many pushes its outbox had then.
#[derive(Debug, Default)]
pub struct Told(Vec<(Arc<Outbox>, u64)>);

impl Told {
    /// Whether no connection has to write anything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Resolves once every connection told wrote the push to its socket (or closed), or
    /// after [`PUSH_WRITTEN_WITHIN`]: a change's caller (a publish's reply) goes on once the
    /// invalidation is on its way to every client, so a client that reads its cache on
    /// another connection after the reply finds the invalidation there to read.
    ///
    /// A connection that did not write within that bound is marked stalled, and no change
    /// waits for it again until it has written everything it was given: a client that stops
    /// reading costs one change one bound, not every change.
    pub async fn written(self) {
        let waiting: Vec<(Arc<Outbox>, u64)> = self
            .0
            .into_iter()
            .filter(|(outbox, _)| !outbox.is_stalled())
            .collect();
        if waiting.is_empty() {
            return;
        }
        let written = waiting
            .iter()
            .map(|(outbox, pushed)| outbox.written(*pushed));
        let all = futures_util::future::join_all(written);
        if tokio::time::timeout(PUSH_WRITTEN_WITHIN, all)
            .await
            .is_err()
        {
            for (outbox, pushed) in &waiting {
                outbox.stall_unless_written(*pushed);
            }
        }
    }
}

/// The instance's tracking table. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Tracking {
    /// The table.
    table: Mutex<Table>,
    /// Its bounds.
    limits: Limits,
    /// Wakes the lease clock when an earlier lease was set.
    clock: Notify,
    /// Counters, when registered.
    metrics: Option<TrackingMetrics>,
    /// The most a lease may be, in µs (0: no cap): the feed's silence bound while a feed
    /// cannot vouch for its changes (`crate::feed`).
    lease_cap_us: std::sync::atomic::AtomicU64,
    /// The invalidation feed's state (`crate::feed`), which tells whether changes made through
    /// other instances reach this table.
    feed: Arc<feed_state::FeedState>,
    /// When each key changed lately (here or, by the feed, elsewhere).
    recent: Mutex<recent::Recent>,
}

impl Default for Tracking {
    fn default() -> Tracking {
        Tracking::new(Limits::default(), None)
    }
}

impl Tracking {
    /// An empty table with `limits`, counting into `metrics` when given.
    pub fn new(limits: Limits, metrics: Option<&Metrics>) -> Tracking {
        Tracking {
            table: Mutex::new(Table::new(limits)),
            limits,
            clock: Notify::new(),
            metrics: metrics.map(|metrics| metrics.register_with(TrackingMetrics::register)),
            lease_cap_us: std::sync::atomic::AtomicU64::new(0),
            feed: Arc::default(),
            recent: Mutex::new(recent::Recent::default()),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The invalidation feed's state.
    pub fn feed(&self) -> &Arc<feed_state::FeedState> {
        &self.feed
    }

    /// Caps every lease given from now on at `cap` (`None`: no cap).
    pub fn cap_leases(&self, cap: Option<Duration>) {
        let us = cap.map_or(0, |cap| {
            u64::try_from(cap.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        self.lease_cap_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// `lease`, within the cap in force.
    pub fn capped(&self, lease: Duration) -> Duration {
        match self.lease_cap_us.load(std::sync::atomic::Ordering::Relaxed) {
            0 => lease,
            cap => lease.min(Duration::from_micros(cap)),
        }
    }

    /// The table, locked; a panic elsewhere never stops invalidations.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts what `table` pushed and updates the gauges from it.
    fn count(&self, table: &mut Table) {
        let sent = table.take_sent();
        let Some(metrics) = &self.metrics else {
            return;
        };
        for (counter, count) in metrics.invalidations.iter().zip(sent.by_cause) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if sent.overflowed > 0 {
            metrics.overflows.inc_by(sent.overflowed);
        }
        metrics.keys.set(gauge(table.tracked()));
        metrics.bytes.set(gauge(table.bytes()));
        metrics.connections.set(gauge(table.connections()));
    }

    /// Connection `id` opened, with `outbox` for its pushes.
    pub fn open(&self, id: u64, outbox: &Arc<Outbox>) {
        self.lock().open(id, outbox);
    }

    /// Connection `id` closed.
    pub fn close(&self, id: u64) {
        let mut table = self.lock();
        table.close(id);
        self.count(&mut table);
    }

    /// Starts (or changes) tracking for connection `id` (its own outbox `own`) in `mode`.
    ///
    /// # Errors
    /// [`Refused`] when the mode names no open connection or too many prefixes.
    pub fn start(&self, id: u64, own: &Arc<Outbox>, mode: Mode) -> Result<(), Refused> {
        let mut table = self.lock();
        let started = table.start(id, own, mode);
        self.count(&mut table);
        started
    }

    /// Ends tracking for connection `id`.
    pub fn stop(&self, id: u64) {
        let mut table = self.lock();
        table.stop(id);
        self.count(&mut table);
    }

    /// Whether connection `id` tracks.
    pub fn is_tracking(&self, id: u64) -> bool {
        self.lock().is_tracking(id)
    }

    /// Tracks `key` for connection `id` from now until [`Tracking::settle`]; answers the
    /// entry's number (`None` when `id` does not track).
    pub fn begin(&self, id: u64, key: &str) -> Option<u64> {
        let mut table = self.lock();
        let seq = table.begin(id, key);
        self.count(&mut table);
        seq
    }

    /// Settles the read of `key` numbered `seq`: tracked for `lease`, or invalidated now when
    /// `lease` is `None` or zero.
    pub fn settle(&self, id: u64, key: &str, seq: u64, lease: Option<Duration>) {
        let mut table = self.lock();
        let before = table.next_deadline();
        table.settle(id, key, seq, lease);
        let after = table.next_deadline();
        self.count(&mut table);
        drop(table);
        if after.is_some() && (before.is_none() || after < before) {
            self.clock.notify_one();
        }
    }

    /// `keys` changed on this instance: every connection tracking one, and every `BCAST`
    /// connection with a matching prefix, is pushed its invalidation. The answer waits until
    /// those connections wrote it ([`Told::written`]).
    pub fn changed<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Told {
        let origin = origin();
        let now = tokio::time::Instant::now();
        let mut told: Vec<Arc<Outbox>> = Vec::new();
        let mut table = self.lock();
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for key in keys {
            told.extend(table.changed(key, origin));
            recent.changed(key, now);
        }
        drop(recent);
        self.count(&mut table);
        // The connection whose command made the change writes its pushes before that
        // command's reply: nothing to wait for (it could not write them while it waits).
        let own = origin.and_then(|id| table.own_outbox(id));
        drop(table);
        told.retain(|outbox| !own.as_ref().is_some_and(|own| Arc::ptr_eq(own, outbox)));
        told.sort_by_key(Arc::as_ptr);
        told.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Told(
            told.into_iter()
                .map(|outbox| {
                    let pushed = outbox.pushed();
                    (outbox, pushed)
                })
                .collect(),
        )
    }

    /// Whether `key` may have changed after `as_of` (the moment an answer was current): such
    /// an answer is not cached, since the change it missed was already told.
    pub fn changed_after(&self, key: &str, as_of: tokio::time::Instant) -> bool {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .changed_after(key, as_of)
    }

    /// Every key under `prefix` changed (the copy names its family is read under did).
    pub fn changed_prefix(&self, prefix: &str) {
        let mut table = self.lock();
        table.changed_prefix(prefix);
        self.count(&mut table);
    }

    /// Invalidates every tracked key of every connection (one push each: see
    /// `table::Table::flush_all` for why not the null invalidation); answers how many
    /// connections were pushed to.
    pub fn flush_all(&self) -> u64 {
        let mut table = self.lock();
        let told = table.flush_all();
        self.count(&mut table);
        told
    }

    /// The lease clock: pushes each lease's invalidation when it ends, until `shutdown`.
    pub async fn run_clock(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let next = {
                let mut table = self.lock();
                table.expire(tokio::time::Instant::now());
                self.count(&mut table);
                table.next_deadline()
            };
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.clock.notified() => {}
                () = sleep => {}
            }
        }
    }
}

/// A count as a gauge's value.
fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
