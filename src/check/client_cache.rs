//! The `client-cache` mode's clients: readers with a client-side cache that follow redis-py's
//! rules ([`reader`], [`ReaderCache`]), writers publishing through both instances ([`writer`]),
//! the feed cuts ([`feed_cuts`]), and the bound a cached answer's age is judged against
//! ([`CacheBound`]).
//!
//! The readers read the door of instance A (the run's near-cache service) while the writers
//! publish through instance B (the other service: A hears of those changes only by its
//! invalidation feed) and through A (which pushes before the publish's reply), in turn.
//!
//! **redis-py's rules** (8.1, `CacheProxyConnection`), which a reader follows: one cache shared
//! by the reader's connections ([`READER_CONNECTIONS`], used in turn as a pool hands them out);
//! each connection `HELLO 3` and `CLIENT TRACKING ON`; pushes are read lazily, only when the
//! reader next sends on that connection or answers from its cache: before a command, the
//! pushes already readable on its own socket are processed, and before a cache hit those of the
//! connection that cached the entry too (without waiting for any); an entry is put in flight
//! before its `GET` is sent and is cached only if no invalidation removed it while the read was
//! in flight; a null invalidation flushes the whole cache, entries in flight included; a nil is
//! not cached; entries have no TTL of their own; a dropped connection flushes the whole cache.
//! An entry removed by the pushes read just before a hit is read from the door (redis-py 8.1's
//! `send_command` re-checks the cache after that drain and sends). One departure, where redis-py
//! would hang rather than answer: an error reply drops its in-flight entry (redis-py 8.1 leaves
//! it in flight, and the key's next read then waits for a reply it never asked for).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::checkers::{CACHED_ROUTE, DOOR_ROUTE};
use super::history::{Op, Outcome};
use super::recorder::{event, Answer, Recorder, Span};
use super::resp::{RespClient, RespConn, RespDoors, Value};
use super::resp3::{invalidation, Frame, Resp3Conn};
use hotsplit::config::Config;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit::route::Classes;
use hotsplit_devcluster::Cluster;

/// Connections in a reader's pool, sharing its one cache.
pub(super) const READER_CONNECTIONS: usize = 2;

/// The slack of [`CacheBound`]: what a loaded 2-core machine adds between the instance's
/// deadline (a lease's end, a silence noticed) and the push being readable on the reader's
/// socket: the in-process service's timers and writes share the cores with the run's
/// readers, writers, sampler and faults, and six `redis-server`s.
pub(super) const SLACK: Duration = Duration::from_millis(100);

/// How long the readers' class lets an answer live in a client-side cache, and how late the
/// feed may tell of a change made through another instance: a cached answer must never be
/// older than their sum ([`CacheBound::total`]). A cached answer was current, or its change not
/// yet told to instance A, when the door answered it (the lease starts no later than the
/// delivery bound after the change), and the lease ends it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CacheBound {
    /// The `advisory` class's `near_cache_max_age`: the longest lease.
    pub lease_ms: f64,
    /// `feed.max_silence` in force: the longest the feed may be silent before A flushes.
    pub max_silence_ms: f64,
    /// The feed's heartbeat interval (`max_silence / 4`), which the delivery bound adds.
    pub heartbeat_ms: f64,
    /// [`SLACK`].
    pub slack_ms: f64,
}

impl CacheBound {
    /// The bound of the service configured by `config`, for readers of the `advisory` class.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the classes do not load or `advisory` has no
    /// `near_cache_max_age` (its answers would not be cacheable).
    pub(super) fn of(config: &Config) -> Result<CacheBound> {
        let classes = Classes::from_config(&config.classes)?;
        let lease = classes
            .by_name("advisory")
            .and_then(|class| classes.get(class).near_cache)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    "the advisory class has no near_cache_max_age: nothing is cacheable",
                )
            })?;
        let max_silence = config.feed.silence_bound(&classes);
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        Ok(CacheBound {
            lease_ms: ms(lease),
            max_silence_ms: ms(max_silence),
            heartbeat_ms: ms(max_silence / 4),
            slack_ms: ms(SLACK),
        })
    }

    /// The lease plus the delivery bound (`max_silence` plus one heartbeat) plus the slack.
    pub fn total_ms(&self) -> f64 {
        self.lease_ms + self.max_silence_ms + self.heartbeat_ms + self.slack_ms
    }
}

/// What `base`'s `/metrics` says its flushes did so far: the invalidations pushed because of
/// them (`hotsplit_resp_tracking_invalidations_total{cause="flush"}`) and the feed's flushes
/// (`hotsplit_feed_flushes_total`, every cause); zeros when it cannot be read.
pub(super) async fn flush_counts(http: &reqwest::Client, base: &str) -> (u64, u64) {
    let Ok(answer) = http.get(format!("{base}/metrics")).send().await else {
        return (0, 0);
    };
    let text = answer.text().await.unwrap_or_default();
    let sum = |prefix: &str| {
        text.lines()
            .filter(|line| line.starts_with(prefix))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    (
        sum("hotsplit_resp_tracking_invalidations_total{cause=\"flush\"}"),
        sum("hotsplit_feed_flushes_total"),
    )
}

/// A cache entry: in flight (its `GET` sent on `conn`, no reply yet) or valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// The `GET` is in flight on connection `conn`.
    InFlight { conn: usize },
    /// Cached from connection `conn`'s reply, at `version`.
    Valid { conn: usize, version: u64 },
}

impl Entry {
    fn conn(self) -> usize {
        match self {
            Entry::InFlight { conn } | Entry::Valid { conn, .. } => conn,
        }
    }
}

/// A reader's cache, shared by its connections, by redis-py's rules (see the module doc).
#[derive(Debug, Default)]
pub(super) struct ReaderCache {
    /// Key → entry; no TTL: an entry lives until invalidated or flushed.
    entries: HashMap<String, Entry>,
}

impl ReaderCache {
    /// Applies an invalidation: `Some(keys)` removes them, `None` (the null one) flushes all.
    fn invalidate(&mut self, keys: Option<&[String]>) {
        match keys {
            Some(keys) => keys.iter().for_each(|key| {
                self.entries.remove(key);
            }),
            None => self.entries.clear(),
        }
    }

    /// The connection that cached `key` (or has it in flight).
    fn owner(&self, key: &str) -> Option<usize> {
        self.entries.get(key).map(|entry| entry.conn())
    }

    /// The cached version of `key`, when valid.
    fn hit(&self, key: &str) -> Option<u64> {
        match self.entries.get(key) {
            Some(Entry::Valid { version, .. }) => Some(*version),
            _ => None,
        }
    }

    /// Puts `key` in flight on `conn`, before its `GET` is sent.
    fn begin(&mut self, key: &str, conn: usize) {
        self.entries
            .insert(key.to_owned(), Entry::InFlight { conn });
    }

    /// The reply of `key`'s read came: `Some(version)` caches it if the entry is still in
    /// flight (no invalidation removed it meanwhile); `None` (a nil, an error) drops it.
    fn complete(&mut self, key: &str, version: Option<u64>) {
        match (version, self.entries.get(key).copied()) {
            (Some(version), Some(Entry::InFlight { conn })) => {
                self.entries
                    .insert(key.to_owned(), Entry::Valid { conn, version });
            }
            (Some(_), _) => {}
            (None, _) => {
                self.entries.remove(key);
            }
        }
    }

    /// Drops everything (a connection dropped).
    fn flush(&mut self) {
        self.entries.clear();
    }
}

/// One reader with its pool and cache, on a blocking thread (redis-py's connections are
/// blocking sockets).
struct Reader {
    /// `cache-reader-<n>`.
    session: String,
    /// The history.
    recorder: Recorder,
    /// Where to connect (instance A's door) and the token.
    doors: Arc<RespDoors>,
    /// The pool; `None` until opened, and after a drop.
    conns: Vec<Option<Resp3Conn>>,
    /// The cache the connections share.
    cache: ReaderCache,
}

/// Reader `number` over `keys` until `stop`: every 2 ms a `GET` of a random key on the next
/// connection of its pool, answered from its cache by redis-py's rules when it can.
pub(super) fn reader(client: RespClient, number: u32, keys: Vec<String>, mut rng: StdRng) {
    let RespClient {
        doors,
        recorder,
        stop,
    } = client;
    let mut reader = Reader {
        session: format!("cache-reader-{number}"),
        recorder,
        doors,
        conns: (0..READER_CONNECTIONS).map(|_| None).collect(),
        cache: ReaderCache::default(),
    };
    let mut next = 0;
    while !stop.is_cancelled() {
        let conn = next % READER_CONNECTIONS;
        next += 1;
        let key = &keys[rng.random_range(0..keys.len())];
        reader.read(conn, key);
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Reader {
    /// One `GET key` on connection `conn`, as redis-py's `send_command` and `read_response`
    /// make it.
    fn read(&mut self, conn: usize, key: &str) {
        if self.conns[conn].is_none() {
            match Resp3Conn::open(&self.doors.read, &self.doors.token) {
                Ok(open) => self.conns[conn] = Some(open),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            }
        }
        // send_command: first the pushes already readable on this connection.
        if !self.drain(conn) {
            return;
        }
        if let Some(owner) = self.cache.owner(key) {
            // A hit cached by another connection: that one's readable pushes first.
            if owner != conn && !self.drain(owner) {
                return;
            }
            if let Some(version) = self.cache.hit(key) {
                let start = self.recorder.now_us();
                let answer = answer(200, Some(version), CACHED_ROUTE, None);
                self.recorder.push_read(&self.session, key, start, &answer);
                return;
            }
        }
        self.cache.begin(key, conn);
        let start = self.recorder.now_us();
        let reply = self.door_get(conn, key);
        let answer = match reply {
            Ok(Frame::Bulk(bytes)) => {
                let version = std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|text| text.strip_prefix('v'))
                    .and_then(|text| text.parse().ok());
                self.cache.complete(key, version);
                match version {
                    Some(version) => answer(200, Some(version), DOOR_ROUTE, None),
                    None => answer(
                        0,
                        None,
                        DOOR_ROUTE,
                        Some("resp: a value not written by the check".into()),
                    ),
                }
            }
            Ok(Frame::Null) => {
                self.cache.complete(key, None);
                answer(404, None, DOOR_ROUTE, None)
            }
            Ok(other) => {
                self.cache.complete(key, None);
                let code = match other {
                    Frame::Error(text) => {
                        let prefix = text.split(' ').next().unwrap_or_default();
                        format!("resp {}", prefix.to_ascii_lowercase())
                    }
                    other => format!("resp: unexpected reply {other:?}"),
                };
                answer(503, None, DOOR_ROUTE, Some(code))
            }
            Err(err) => {
                self.disconnect(conn);
                answer(0, None, DOOR_ROUTE, Some(format!("transport: {err}")))
            }
        };
        self.recorder.push_read(&self.session, key, start, &answer);
    }

    /// Sends `GET key` on `conn` and reads frames until its reply, processing the pushes that
    /// come first.
    fn door_get(&mut self, conn: usize, key: &str) -> std::io::Result<Frame> {
        let open = self.conns[conn]
            .as_mut()
            .ok_or_else(|| std::io::Error::other("not connected"))?;
        open.send(&[b"GET", key.as_bytes()])?;
        loop {
            let frame = self.conns[conn]
                .as_mut()
                .ok_or_else(|| std::io::Error::other("not connected"))?
                .read_frame()?;
            match frame {
                Frame::Push(items) => self.on_push(&items),
                reply => return Ok(reply),
            }
        }
    }

    /// Processes the pushes already readable on `conn` (none when it is not open); on an error
    /// drops it (flushing the cache) and says so with `false`.
    fn drain(&mut self, conn: usize) -> bool {
        let Some(open) = self.conns[conn].as_mut() else {
            return true;
        };
        match open.readable_frames() {
            Ok(frames) => {
                for frame in frames {
                    if let Frame::Push(items) = frame {
                        self.on_push(&items);
                    }
                }
                true
            }
            Err(_) => {
                self.disconnect(conn);
                false
            }
        }
    }

    /// Applies an invalidation push to the cache and records it.
    fn on_push(&mut self, items: &[Frame]) {
        let Some(keys) = invalidation(items) else {
            return;
        };
        self.cache.invalidate(keys.as_deref());
        let now = self.recorder.now_us();
        let span = Span {
            start_us: now,
            end_us: now,
        };
        match keys {
            Some(keys) => keys.iter().for_each(|key| {
                let push = event(&self.session, Op::Invalidation, key, span, Outcome::Ok);
                self.recorder.push(push);
            }),
            None => {
                let push = event(&self.session, Op::Invalidation, "", span, Outcome::Ok);
                self.recorder.push(push);
            }
        }
    }

    /// Drops connection `conn` and, as redis-py's `disconnect` does, flushes the whole cache.
    fn disconnect(&mut self, conn: usize) {
        self.conns[conn] = None;
        self.cache.flush();
        let now = self.recorder.now_us();
        let span = Span {
            start_us: now,
            end_us: now,
        };
        let flush = Outcome::Error("disconnect".into());
        self.recorder
            .push(event(&self.session, Op::Invalidation, "", span, flush));
    }
}

/// A read's answer as the history records it.
fn answer(status: u16, version: Option<u64>, route: &str, code: Option<String>) -> Answer {
    Answer {
        status,
        version,
        copy: None,
        served_by: None,
        route: Some(route.to_owned()),
        code,
        session: None,
    }
}

/// Key `index`'s writer until `stop`: publishes its next version every 50 ms, in turn through
/// instance B (`doors.write`: A hears of it by its feed) and through A (`doors.read`). A
/// publish is acknowledged (outcome `Ok`) only when every copy took it (none `queued`,
/// `failed` or `dropped`): a copy left for the retry queue changes later, and the door may
/// answer its old version meanwhile, which says nothing about the client's cache.
pub(super) async fn writer(
    client: RespClient,
    index: usize,
    key: String,
    source: Arc<Vec<AtomicU64>>,
) {
    let RespClient {
        doors,
        recorder,
        stop,
    } = client;
    let session = format!("writer-{index}");
    let mut conns: [Option<RespConn>; 2] = [None, None];
    let mut turn = 0usize;
    while !stop.is_cancelled() {
        let (slot, address, label) = match turn % 2 {
            0 => (0, &doors.write, "door-b"),
            _ => (1, &doors.read, "door-a"),
        };
        turn += 1;
        if conns[slot].is_none() {
            match RespConn::open(address, &doors.token, &[]).await {
                Ok(open) => conns[slot] = Some(open),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(open) = conns[slot].as_mut() else {
            continue;
        };
        let version = source[index].fetch_add(1, Ordering::SeqCst) + 1;
        let (version_text, value) = (version.to_string(), format!("v{version}"));
        let start = recorder.now_us();
        let reply = open
            .call(&[
                b"HOTSPLIT.PUBLISH",
                key.as_bytes(),
                version_text.as_bytes(),
                value.as_bytes(),
            ])
            .await;
        let outcome = match reply {
            Ok(reply) => publish_outcome(&reply),
            Err(err) => {
                conns[slot] = None;
                Outcome::Error(format!("transport: {err}"))
            }
        };
        let mut record = event(&session, Op::Write, &key, recorder.since(start), outcome);
        record.version = Some(version);
        record.served_by = Some(label.to_owned());
        recorder.push(record);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// A publish report (a flat array of names and values in RESP2): `Ok` when no copy was
/// `queued`, `failed` or `dropped`; else an error naming the counts.
fn publish_outcome(reply: &Value) -> Outcome {
    let Value::Array(items) = reply else {
        return match reply {
            Value::Error(text) => Outcome::Error(format!(
                "resp {}",
                text.split(' ')
                    .next()
                    .unwrap_or_default()
                    .to_ascii_lowercase()
            )),
            other => Outcome::Error(format!("resp: unexpected reply {other:?}")),
        };
    };
    let mut left = Vec::new();
    for pair in items.chunks(2) {
        let [Value::Bulk(name), Value::Int(count)] = pair else {
            continue;
        };
        let name = String::from_utf8_lossy(name);
        if matches!(name.as_ref(), "queued" | "failed" | "dropped") && *count > 0 {
            left.push(format!("{count} {name}"));
        }
    }
    if left.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Error(format!("not on every copy: {}", left.join(", ")))
    }
}

/// The feed cuts of a phase, at 30 % and 85 % of `phase_length` (between the scheduled
/// faults): on a master picked by `rng`, every connection whose last command was
/// `CLIENT TRACKING` (the instances' invalidation feeds) is killed with `CLIENT KILL ID`, as
/// `tests/integration/feed.rs` does; each cut is recorded as a fault (`feed-cut`, or
/// `feed-cut (not applied)` when it found none). Ends early at `stop`.
pub(super) async fn feed_cuts(
    cluster: Arc<Cluster>,
    recorder: Recorder,
    stop: CancellationToken,
    phase_length: Duration,
    mut rng: StdRng,
) {
    let started = tokio::time::Instant::now();
    for fraction in [0.30, 0.85] {
        let at = started + phase_length.mul_f64(fraction);
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = stop.cancelled() => return,
        }
        let pick = rng.random_range(0..3usize);
        let (cluster, recorder) = (cluster.clone(), recorder.clone());
        let _ = tokio::task::spawn_blocking(move || cut_feeds(&cluster, &recorder, pick)).await;
    }
}

/// Kills the feed connections on master `pick` (modulo the masters) and records the cut.
fn cut_feeds(cluster: &Cluster, recorder: &Recorder, pick: usize) -> Option<()> {
    let masters = cluster.masters().ok()?;
    let port = masters.get(pick % masters.len().max(1))?.port();
    let start = recorder.now_us();
    let clients = cluster.cli(port, &["CLIENT", "LIST"]).ok()?;
    let killed = clients
        .lines()
        .filter(|line| line.contains("cmd=client|tracking"))
        .filter_map(|line| line.split(' ').next()?.strip_prefix("id="))
        .filter(|id| cluster.cli(port, &["CLIENT", "KILL", "ID", id]).is_ok())
        .count();
    let name = if killed > 0 {
        format!("feed-cut ({killed} connections)")
    } else {
        "feed-cut (not applied)".to_owned()
    };
    let mut record = event(
        "faults",
        Op::Fault,
        "",
        recorder.since(start),
        Outcome::Error(name),
    );
    record.served_by = Some(format!("127.0.0.1:{port}"));
    recorder.push(record);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_follows_redis_py_s_rules() {
        let mut cache = ReaderCache::default();
        // A read in flight whose key is invalidated meanwhile is not cached.
        cache.begin("a", 0);
        cache.invalidate(Some(&["a".to_owned()]));
        cache.complete("a", Some(3));
        assert_eq!(cache.hit("a"), None);
        // A null invalidation drops entries in flight too.
        cache.begin("a", 0);
        cache.invalidate(None);
        cache.complete("a", Some(3));
        assert_eq!(cache.hit("a"), None);
        // Otherwise cached, with no TTL, until invalidated; owned by the connection that read it.
        cache.begin("a", 1);
        cache.complete("a", Some(4));
        assert_eq!((cache.hit("a"), cache.owner("a")), (Some(4), Some(1)));
        cache.invalidate(Some(&["b".to_owned()]));
        assert_eq!(cache.hit("a"), Some(4));
        // A nil is not cached; a dropped connection flushes everything.
        cache.begin("b", 0);
        cache.complete("b", None);
        assert_eq!(cache.owner("b"), None);
        cache.flush();
        assert_eq!(cache.hit("a"), None);
    }

    #[test]
    fn a_publish_is_acknowledged_only_on_every_copy() {
        let bulk = |text: &str| Value::Bulk(text.as_bytes().to_vec());
        let report = |queued| {
            Value::Array(vec![
                bulk("applied"),
                Value::Int(8 - queued),
                bulk("queued"),
                Value::Int(queued),
                bulk("failed"),
                Value::Int(0),
            ])
        };
        assert_eq!(publish_outcome(&report(0)), Outcome::Ok);
        assert_eq!(
            publish_outcome(&report(2)),
            Outcome::Error("not on every copy: 2 queued".into())
        );
        assert!(matches!(
            publish_outcome(&Value::Error("UNAVAILABLE x".into())),
            Outcome::Error(text) if text == "resp unavailable"
        ));
    }
}
