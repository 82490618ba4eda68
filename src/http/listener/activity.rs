//! What a connection's timeouts are judged by: [`Activity`], which the connection's socket, its
//! request service and its response bodies update, and the watchdog's [`Verdict`].
//!
//! A connection is *busy* while a request is in progress (from its parsed head until its
//! response body has been handed to the socket), else *idle*. An idle connection is closed
//! when no byte has arrived for `server.idle_timeout`, or when the first byte of a request head
//! arrived more than `server.header_read_timeout` ago and the head is still incomplete (a
//! slowloris client). Times are kept as milliseconds since the connection opened, in atomics:
//! reading and writing cost an atomic load or two.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::Timeout;
use super::Settings;

/// What the watchdog decides when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Close the connection: this timeout passed.
    Close(Timeout),
    /// Look again at this instant.
    CheckAt(Instant),
}

/// What a connection's timeouts are judged by. Times are milliseconds since the connection
/// opened; the IO wrapper, the request service and the response body update it.
#[derive(Debug)]
pub(super) struct Activity {
    /// When the connection opened.
    opened: Instant,
    /// Requests whose head was parsed and whose response body was not yet handed over.
    pub(super) in_flight: AtomicU32,
    /// When the connection last became idle (opened, or a response finished).
    idle_since_ms: AtomicU64,
    /// When the first byte after becoming idle arrived, plus one; 0 while none has.
    pub(super) head_started_ms: AtomicU64,
    /// Set when a request body was cut off by `server.body_read_timeout`.
    pub(super) body_timed_out: AtomicBool,
    /// Set when the listener chose this connection to make room for a new one.
    evicted: AtomicBool,
    /// Set when the listener shuts down (its token was cancelled).
    shut_down: AtomicBool,
    /// Wakes the connection's task when it is evicted or the listener shuts down (the flags say
    /// which). It is the connection's own, so the task's wake-ups take no lock another
    /// connection takes: a shared token's `cancelled()`, polled on every wake-up of every
    /// connection, locked two mutexes all of them share.
    pub(super) signal: Notify,
}

impl Activity {
    /// A connection that opened now, idle.
    pub(super) fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicU32::new(0),
            idle_since_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            body_timed_out: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            signal: Notify::new(),
        }
    }

    /// When the connection opened.
    #[cfg(test)]
    pub(super) fn opened(&self) -> Instant {
        self.opened
    }

    /// When an evictable connection (no request in progress, not evicted yet) became idle;
    /// `None` when it may not be evicted.
    pub(super) fn evictable_since(&self) -> Option<Instant> {
        let idle =
            self.in_flight.load(Ordering::Relaxed) == 0 && !self.evicted.load(Ordering::Relaxed);
        idle.then(|| self.at_ms(self.idle_since_ms.load(Ordering::Relaxed)))
    }

    /// Marks the connection evicted; false if it already was.
    pub(super) fn mark_evicted(&self) -> bool {
        !self.evicted.swap(true, Ordering::Relaxed)
    }

    /// Whether the connection was evicted.
    pub(super) fn was_evicted(&self) -> bool {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Tells the connection's task it was evicted.
    pub(super) fn evict(&self) {
        self.signal.notify_one();
    }

    /// Tells the connection's task that the listener shuts down: an idle connection closes, a
    /// request in progress is answered first.
    pub(super) fn shut_down(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.signal.notify_one();
    }

    /// Whether the listener shut down.
    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Milliseconds from the connection's opening to `at`.
    fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.opened).as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived: on an idle connection the first of them starts the header timeout.
    pub(super) fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started_ms.load(Ordering::Relaxed) == 0
        {
            self.head_started_at(Instant::now());
        }
    }

    /// A request head started arriving at `at`.
    pub(super) fn head_started_at(&self, at: Instant) {
        self.head_started_ms
            .store(self.ms_at(at) + 1, Ordering::Relaxed);
    }

    /// A request head was parsed: the connection is busy.
    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
    }

    /// A response was handed over (or its request abandoned).
    pub(super) fn request_ended(&self) {
        self.request_ended_at(Instant::now());
    }

    /// A response was handed over at `at`.
    pub(super) fn request_ended_at(&self, at: Instant) {
        self.idle_since_ms.store(self.ms_at(at), Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the connection has outlived a timeout at `now`, or when to look again.
    pub(super) fn verdict(&self, now: Instant, settings: &Settings) -> Verdict {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            // Busy: the body timeout and the request's own limits govern it.
            return Verdict::CheckAt(now + settings.idle_timeout);
        }
        let (timeout, deadline) = match self.head_started_ms.load(Ordering::Relaxed) {
            0 => (
                Timeout::Idle,
                self.at_ms(self.idle_since_ms.load(Ordering::Relaxed)) + settings.idle_timeout,
            ),
            started => (
                Timeout::Header,
                self.at_ms(started - 1) + settings.header_read_timeout,
            ),
        };
        if now >= deadline {
            Verdict::Close(timeout)
        } else {
            Verdict::CheckAt(deadline)
        }
    }

    /// The instant `ms` milliseconds after the connection opened.
    pub(super) fn at_ms(&self, ms: u64) -> Instant {
        self.opened + Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::door::ServerConfig;

    fn settings() -> Settings {
        let config = ServerConfig {
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(10),
            ..ServerConfig::default()
        };
        Settings::new(&config)
    }

    #[test]
    fn an_idle_connection_closes_after_the_idle_timeout() {
        let settings = settings();
        let activity = Activity::new();
        let opened = activity.opened;
        assert_eq!(
            activity.verdict(opened, &settings),
            Verdict::CheckAt(opened + Duration::from_secs(10))
        );
        assert_eq!(
            activity.verdict(opened + Duration::from_secs(10), &settings),
            Verdict::Close(Timeout::Idle)
        );
    }

    #[test]
    fn a_started_head_must_end_within_the_header_timeout() {
        let settings = settings();
        let activity = Activity::new();
        let started = activity.opened + Duration::from_secs(5);
        activity.head_started_at(started);
        // More bytes do not move the deadline: a slowloris client trickles them.
        activity.bytes_read();
        assert_eq!(
            activity.verdict(started + Duration::from_secs(1), &settings),
            Verdict::CheckAt(started + Duration::from_secs(2))
        );
        assert_eq!(
            activity.verdict(started + Duration::from_secs(2), &settings),
            Verdict::Close(Timeout::Header)
        );
    }

    #[test]
    fn a_busy_connection_is_not_closed_and_idles_again_after_its_answer() {
        let settings = settings();
        let activity = Activity::new();
        activity.bytes_read();
        activity.request_started();
        // Body bytes of a request in progress start no header timeout.
        activity.bytes_read();
        let later = activity.opened + Duration::from_secs(60);
        assert_eq!(
            activity.verdict(later, &settings),
            Verdict::CheckAt(later + Duration::from_secs(10))
        );
        activity.request_ended_at(later);
        assert_eq!(
            activity.verdict(later, &settings),
            Verdict::CheckAt(later + Duration::from_secs(10))
        );
        assert_eq!(
            activity.verdict(later + Duration::from_secs(10), &settings),
            Verdict::Close(Timeout::Idle)
        );
    }
}
