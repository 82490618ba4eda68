//! The `client-cache` mode's checker ([`client_cache`]): over a history of reads recorded by
//! readers with a client-side cache (each read marked [`CACHED_ROUTE`] when the reader's own
//! cache answered it, [`DOOR_ROUTE`] when the door did), the invalidations they received, and
//! the acknowledged publishes, it judges the two things client-side caching must not break:
//! a reader never goes back, and a cached answer is never older than the bound.

use std::collections::HashMap;

use serde::Serialize;

use super::{monotonic_reads, split_by_windows, MonotonicViolation, Percentiles};
use crate::check::history::{Event, Op, Outcome};

/// The `route` of a read the reader's own cache answered (no command was sent).
pub const CACHED_ROUTE: &str = "source=client-cache";

/// The `route` of a read the door answered (a `GET` sent).
pub const DOOR_ROUTE: &str = "source=door";

/// A cached answer older than the bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleCachedRead {
    /// The reader.
    pub session: String,
    /// The key.
    pub key: String,
    /// When the cache answered.
    pub at_us: u64,
    /// The version it answered.
    pub version: u64,
    /// How long before `at_us` a newer version had been acknowledged.
    pub stale_by_us: u64,
}

/// What [`client_cache`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientCacheVerdict {
    /// Reads that returned a version, from the cache or the door.
    pub reads: usize,
    /// Of them, answered by the reader's own cache.
    pub cache_hits: usize,
    /// Of them, answered by the door.
    pub door_reads: usize,
    /// Invalidation pushes naming keys the readers processed (one per key).
    pub invalidations: usize,
    /// Null invalidations (`>2 invalidate _`, flush everything) the readers processed.
    pub flushes: usize,
    /// Caches flushed because a connection dropped (the client's own flush, not a push).
    pub disconnect_flushes: usize,
    /// How stale every cached answer was (0 when current), from the acknowledged publishes.
    pub cached_staleness: Percentiles,
    /// The cached answers older than the bound.
    pub over_bound: Vec<StaleCachedRead>,
    /// Readers' reads going back, outside the loss windows.
    pub monotonic: Vec<MonotonicViolation>,
    /// The same inside loss windows (a failover lost acknowledged publishes).
    pub monotonic_in_loss_windows: Vec<MonotonicViolation>,
}

/// Judges a `client-cache` history against `bound_us`.
///
/// A cached answer of version `v` of key `k` at time `t` is stale by `t − a`, where `a` is the
/// earliest acknowledgement (the end of a write event with outcome `Ok`) of a publish of `k`
/// at a version above `v`, when that is positive; it fails when over `bound_us`. The
/// acknowledgements come from the run's own history, never from what the server says of its
/// answers. Monotonic reads are judged per reader and key over cached and door reads together
/// ([`monotonic_reads`]), split by `loss_windows`.
pub fn client_cache(
    events: &[Event],
    loss_windows: &[(u64, u64)],
    bound_us: u64,
) -> ClientCacheVerdict {
    let acks = Acks::of(events);
    let reads: Vec<&Event> = events
        .iter()
        .filter(|event| event.op == Op::Read && event.read_version().is_some())
        .collect();
    let cached = |event: &Event| event.route.as_deref() == Some(CACHED_ROUTE);
    let mut staleness = Vec::new();
    let mut over_bound = Vec::new();
    for read in reads.iter().filter(|read| cached(read)) {
        let Some(version) = read.read_version() else {
            continue;
        };
        let stale_by_us = acks
            .first_above(&read.key, version)
            .map_or(0, |ack| read.start_us.saturating_sub(ack));
        staleness.push(stale_by_us);
        if stale_by_us > bound_us {
            over_bound.push(StaleCachedRead {
                session: read.session.clone(),
                key: read.key.clone(),
                at_us: read.start_us,
                version,
                stale_by_us,
            });
        }
    }
    let read_events: Vec<Event> = reads.iter().map(|read| (*read).clone()).collect();
    let (inside, outside) = split_by_windows(monotonic_reads(&read_events), loss_windows);
    let pushes = |outcome: &Outcome, named: bool| {
        events
            .iter()
            .filter(|event| {
                event.op == Op::Invalidation
                    && &event.outcome == outcome
                    && event.key.is_empty() != named
            })
            .count()
    };
    ClientCacheVerdict {
        reads: reads.len(),
        cache_hits: reads.iter().filter(|read| cached(read)).count(),
        door_reads: reads
            .iter()
            .filter(|read| read.route.as_deref() == Some(DOOR_ROUTE))
            .count(),
        invalidations: pushes(&Outcome::Ok, true),
        flushes: pushes(&Outcome::Ok, false),
        disconnect_flushes: events
            .iter()
            .filter(|event| event.op == Op::Invalidation && event.outcome != Outcome::Ok)
            .count(),
        cached_staleness: Percentiles::of(staleness),
        over_bound,
        monotonic: outside,
        monotonic_in_loss_windows: inside,
    }
}

/// The acknowledged publishes per key: versions ascending, each with the earliest
/// acknowledgement of it or of any version above it.
struct Acks<'a> {
    /// Key → (version, earliest ack at this version or above), versions ascending.
    by_key: HashMap<&'a str, Vec<(u64, u64)>>,
}

impl<'a> Acks<'a> {
    fn of(events: &'a [Event]) -> Acks<'a> {
        let mut by_key: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for event in events.iter().filter(|event| event.op == Op::Write) {
            if let Some(version) = event.acknowledged_version() {
                by_key
                    .entry(event.key.as_str())
                    .or_default()
                    .push((version, event.end_us));
            }
        }
        for acks in by_key.values_mut() {
            acks.sort_unstable();
            let mut earliest = u64::MAX;
            for (_, ack) in acks.iter_mut().rev() {
                earliest = earliest.min(*ack);
                *ack = earliest;
            }
        }
        Acks { by_key }
    }

    /// The earliest acknowledgement of a publish of `key` above `version`.
    fn first_above(&self, key: &str, version: u64) -> Option<u64> {
        let acks = self.by_key.get(key)?;
        let at = acks.partition_point(|(acked, _)| *acked <= version);
        acks.get(at).map(|(_, ack)| *ack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event of `session` on key `k`.
    fn event(session: &str, op: Op, version: Option<u64>, at: (u64, u64)) -> Event {
        Event {
            session: session.into(),
            op,
            key: "k".into(),
            version,
            copy: None,
            served_by: None,
            route: None,
            start_us: at.0,
            end_us: at.1,
            outcome: Outcome::Ok,
        }
    }

    fn write(version: u64, acked_at: u64) -> Event {
        event(
            "writer-0",
            Op::Write,
            Some(version),
            (acked_at - 500, acked_at),
        )
    }

    fn read(route: &str, version: u64, at: u64) -> Event {
        let mut read = event("cache-reader-0", Op::Read, Some(version), (at, at + 100));
        read.route = Some(route.into());
        read
    }

    fn push(key: &str, at: u64) -> Event {
        let mut push = event("cache-reader-0", Op::Invalidation, None, (at, at));
        push.key = key.into();
        push
    }

    /// Bound of the tests: 300 ms.
    const BOUND_US: u64 = 300_000;

    /// Publishes every 100 ms, a door read of each, cache hits within the bound, an
    /// invalidation, a flush: nothing to report.
    fn good_history() -> Vec<Event> {
        vec![
            write(1, 1_000),
            read(DOOR_ROUTE, 1, 2_000),
            read(CACHED_ROUTE, 1, 50_000),
            write(2, 100_000),
            // Stale by 200 ms: within the bound.
            read(CACHED_ROUTE, 1, 300_000),
            push("k", 310_000),
            read(DOOR_ROUTE, 2, 320_000),
            push("", 400_000),
            read(DOOR_ROUTE, 2, 410_000),
            read(CACHED_ROUTE, 2, 420_000),
        ]
    }

    #[test]
    fn a_good_history_passes_and_is_counted() {
        let verdict = client_cache(&good_history(), &[], BOUND_US);
        assert!(verdict.over_bound.is_empty(), "{verdict:?}");
        assert!(verdict.monotonic.is_empty(), "{verdict:?}");
        assert_eq!(
            (verdict.reads, verdict.cache_hits, verdict.door_reads),
            (6, 3, 3)
        );
        assert_eq!((verdict.invalidations, verdict.flushes), (1, 1));
        assert_eq!(verdict.cached_staleness.max_ms, 200.0);
    }

    #[test]
    fn a_cached_answer_older_than_the_bound_fires() {
        let mut history = good_history();
        // Version 1 from the cache 350 ms after version 2 was acknowledged at 100 ms.
        history.push(read(CACHED_ROUTE, 1, 450_000));
        let verdict = client_cache(&history, &[], BOUND_US);
        assert_eq!(verdict.over_bound.len(), 1, "{verdict:?}");
        assert_eq!(verdict.over_bound[0].stale_by_us, 350_000);
        // It also went back from version 2.
        assert_eq!(verdict.monotonic.len(), 1);
    }

    #[test]
    fn a_door_answer_is_not_judged_for_staleness_and_a_later_ack_does_not_count() {
        let history = vec![
            write(2, 100_000),
            write(1, 200_000),
            // Door reads are the server's business (judged by the other modes).
            read(DOOR_ROUTE, 1, 900_000),
            // The earliest acknowledgement above version 1 is version 2's, at 100 ms.
            read(CACHED_ROUTE, 1, 350_000),
        ];
        let verdict = client_cache(&history, &[], BOUND_US);
        assert!(verdict.over_bound.is_empty(), "{verdict:?}");
        assert_eq!(verdict.cached_staleness.max_ms, 250.0);
    }

    #[test]
    fn a_read_going_back_fires_inside_or_outside_a_loss_window() {
        let history = vec![
            read(DOOR_ROUTE, 5, 1_000),
            read(CACHED_ROUTE, 4, 10_000),
            read(DOOR_ROUTE, 5, 20_000),
            read(DOOR_ROUTE, 3, 500_000),
        ];
        let verdict = client_cache(&history, &[(400_000, 600_000)], BOUND_US);
        assert_eq!(verdict.monotonic.len(), 1, "{verdict:?}");
        assert_eq!(verdict.monotonic[0].then, 4);
        assert_eq!(verdict.monotonic_in_loss_windows.len(), 1);
        // No acknowledged publish: nothing is stale.
        assert!(verdict.over_bound.is_empty());
    }

    #[test]
    fn an_unacknowledged_publish_does_not_make_a_cached_answer_stale() {
        let mut refused = write(2, 100_000);
        refused.outcome = Outcome::Error("partial: 1 queued".into());
        let mut disconnect = push("", 50_000);
        disconnect.outcome = Outcome::Error("disconnect".into());
        let history = vec![
            refused,
            disconnect,
            read(DOOR_ROUTE, 1, 1_000),
            read(CACHED_ROUTE, 1, 900_000),
        ];
        let verdict = client_cache(&history, &[], BOUND_US);
        assert!(verdict.over_bound.is_empty(), "{verdict:?}");
        assert_eq!((verdict.flushes, verdict.disconnect_flushes), (0, 1));
    }
}
