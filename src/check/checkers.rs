//! Checkers over a history: each counts one kind of anomaly the hotsplit claims forbid.
//!
//! Every checker is a pure function of the events, so it can be shown, on a hand-written history,
//! to catch exactly what it claims. Times are the run's monotonic microseconds; "before" means a
//! real-time order (one operation ended before the other started).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::history::{Event, Op, Outcome};

mod client_cache;
pub use client_cache::{client_cache, CACHED_ROUTE, DOOR_ROUTE};

/// A session's read returned an older version than one it had already read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MonotonicViolation {
    /// The session.
    pub session: String,
    /// The key.
    pub key: String,
    /// When the offending read started.
    pub at_us: u64,
    /// The highest version the session had read before.
    pub seen: u64,
    /// The older version it then read.
    pub then: u64,
    /// Whether `seen` was a tombstone's version (a 404 naming it) rather than a value's.
    pub seen_invalidated: bool,
    /// Whether `then` was a tombstone's version (a 404 naming it) rather than a value's.
    pub then_invalidated: bool,
    /// Where the read that showed `seen` was served.
    pub seen_via: Via,
    /// Where the offending read was served.
    pub then_via: Via,
}

/// Where a read was served: the copy and the role of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Via {
    /// The copy, when the history knows it.
    pub copy: Option<u32>,
    /// Whether a replica served it (`Hotsplit-Served-By: …;role=replica`).
    pub replica: bool,
}

impl Via {
    fn of(event: &Event) -> Via {
        Via {
            copy: event.copy,
            replica: event
                .served_by
                .as_deref()
                .is_some_and(|served_by| served_by.contains("role=replica")),
        }
    }
}

/// Why a monotonic-read violation falls outside the affine claim, which covers one copy read
/// from one place: a copy only moves forward, so two reads of it cannot go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The two reads were served by different copies (in affine mode, a fallback to a sibling
    /// when the reader's copy could not be read). A tombstone's 404 names no copy, so a
    /// violation between it and a read that names one counts here.
    AcrossCopies,
    /// The same copy, once from a replica and once from its primary: the replica was behind by
    /// up to its class's staleness budget.
    AcrossRoles,
    /// The same copy from the same role: a copy went back, which only lost writes explain.
    SameCopy,
}

impl MonotonicViolation {
    /// Which reads this violation compared; see [`Scope`].
    pub fn scope(&self) -> Scope {
        if self.seen_via.copy != self.then_via.copy {
            Scope::AcrossCopies
        } else if self.seen_via.replica != self.then_via.replica {
            Scope::AcrossRoles
        } else {
            Scope::SameCopy
        }
    }
}

/// Monotonic reads per session and key: once a session has read version `v` of a key, no read
/// it starts later returns an older version. A tombstone's 404 (one naming its version) is a
/// read of that version: after a tombstone at `t`, a value or a tombstone below `t` is a
/// violation, and so is a tombstone below a value already read. Reads that found no record are
/// not judged here (absence is not a version); [`read_your_writes`] judges those for writers.
pub fn monotonic_reads(events: &[Event]) -> Vec<MonotonicViolation> {
    let mut reads: Vec<&Event> = events
        .iter()
        .filter(|event| event.observed_version().is_some())
        .collect();
    reads.sort_by_key(|event| (event.start_us, event.end_us));
    // (session, key) -> completed reads as (end, version, whether a tombstone, where served).
    type Done = Vec<(u64, u64, bool, Via)>;
    let mut state: HashMap<(&str, &str), Done> = HashMap::new();
    let mut violations = Vec::new();
    for read in reads {
        let Some(version) = read.observed_version() else {
            continue;
        };
        let done = state
            .entry((read.session.as_str(), read.key.as_str()))
            .or_default();
        let seen = done
            .iter()
            .filter(|(end, _, _, _)| *end <= read.start_us)
            .max_by_key(|(_, version, _, _)| *version)
            .copied();
        if let Some((_, seen, seen_invalidated, seen_via)) = seen {
            if version < seen {
                violations.push(MonotonicViolation {
                    session: read.session.clone(),
                    key: read.key.clone(),
                    at_us: read.start_us,
                    seen,
                    then: version,
                    seen_invalidated,
                    then_invalidated: read.invalidated_read(),
                    seen_via,
                    then_via: Via::of(read),
                });
            }
        }
        // Keep only the running maximum among finished reads plus the ones still overlapping.
        done.push((read.end_us, version, read.invalidated_read(), Via::of(read)));
        if done.len() > 64 {
            let horizon = read.start_us;
            let best = done
                .iter()
                .filter(|(end, _, _, _)| *end <= horizon)
                .max_by_key(|(_, version, _, _)| *version)
                .copied();
            done.retain(|(end, _, _, _)| *end > horizon);
            if let Some((_, version, invalidated, via)) = best {
                done.push((horizon, version, invalidated, via));
            }
        }
    }
    violations
}

/// Splits violations into those inside any of `windows` (start, end in µs) and those outside.
/// `hotsplit check` passes the windows in which a failover lost acknowledged writes.
pub fn split_by_windows(
    violations: Vec<MonotonicViolation>,
    windows: &[(u64, u64)],
) -> (Vec<MonotonicViolation>, Vec<MonotonicViolation>) {
    violations.into_iter().partition(|violation| {
        windows
            .iter()
            .any(|(start, end)| (*start..=*end).contains(&violation.at_us))
    })
}

/// A writer read an older version (or nothing) after its own write was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadYourWritesViolation {
    /// The session that wrote and then read.
    pub session: String,
    /// The key.
    pub key: String,
    /// When the read started.
    pub at_us: u64,
    /// The version the session had written.
    pub written: u64,
    /// What the read returned: a version, or `None` for "not found".
    pub read: Option<u64>,
}

/// Read-your-writes: a read a session starts after its own write of version `w` was acknowledged
/// returns `w` or newer. "Not found" counts as a violation unless a delete at a newer version was
/// acknowledged (by anyone) before the read started.
pub fn read_your_writes(events: &[Event]) -> Vec<ReadYourWritesViolation> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|event| event.start_us);
    // Each session's acknowledged writes per key, and everyone's acknowledged deletes per key,
    // by acknowledgement time with the highest version so far: one search per read, not a scan
    // of the history (a client-cache phase records tens of thousands of reads).
    let mut writes: HashMap<(&str, &str), Vec<(u64, u64)>> = HashMap::new();
    let mut deletes: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for event in events {
        let Some(version) = event.acknowledged_version() else {
            continue;
        };
        match event.op {
            Op::Write => writes
                .entry((event.session.as_str(), event.key.as_str()))
                .or_default()
                .push((event.end_us, version)),
            Op::Delete => deletes
                .entry(event.key.as_str())
                .or_default()
                .push((event.end_us, version)),
            _ => {}
        }
    }
    for list in writes.values_mut().chain(deletes.values_mut()) {
        running_max_by_time(list);
    }
    let mut violations = Vec::new();
    for read in sorted.iter().filter(|event| event.op == Op::Read) {
        let written = writes
            .get(&(read.session.as_str(), read.key.as_str()))
            .and_then(|list| highest_by(list, read.start_us));
        let Some(written) = written else { continue };
        let result = match &read.outcome {
            Outcome::Ok | Outcome::NotModified => read.version,
            Outcome::NotFound => None,
            Outcome::Error(_) => continue,
        };
        let ok = match result {
            Some(version) => version >= written,
            None => deletes
                .get(read.key.as_str())
                .and_then(|list| highest_by(list, read.start_us))
                .is_some_and(|deleted| deleted >= written),
        };
        if !ok {
            violations.push(ReadYourWritesViolation {
                session: read.session.clone(),
                key: read.key.clone(),
                at_us: read.start_us,
                written,
                read: result,
            });
        }
    }
    violations
}

/// Sorts `(time, version)` pairs by time and makes each version the highest up to its time.
fn running_max_by_time(list: &mut [(u64, u64)]) {
    list.sort_unstable();
    let mut highest = 0;
    for (_, version) in list.iter_mut() {
        highest = highest.max(*version);
        *version = highest;
    }
}

/// The highest version of a [`running_max_by_time`] list at or before `at_us`.
fn highest_by(list: &[(u64, u64)], at_us: u64) -> Option<u64> {
    let until = list.partition_point(|(time, _)| *time <= at_us);
    until.checked_sub(1).map(|last| list[last].1)
}

/// Percentiles of a list of durations, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    /// How many values.
    pub count: usize,
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// The largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values_us` (microseconds).
    pub fn of(mut values_us: Vec<u64>) -> Percentiles {
        if values_us.is_empty() {
            return Percentiles::default();
        }
        values_us.sort_unstable();
        let rank = |p: f64| {
            let at = ((p * values_us.len() as f64).ceil() as usize).clamp(1, values_us.len()) - 1;
            values_us[at] as f64 / 1000.0
        };
        Percentiles {
            count: values_us.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: values_us[values_us.len() - 1] as f64 / 1000.0,
        }
    }
}

/// How quickly copies caught up with acknowledged writes, from direct samples of each copy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Convergence {
    /// Time from a write's acknowledgement until every sampled copy of its key held it or newer.
    pub time_to_converge: Percentiles,
    /// Acknowledged writes that some copy never reached within the samples.
    pub unconverged: Vec<(String, u64)>,
    /// Copies whose last sample is below the highest acknowledged version of their key.
    pub lagging_at_end: Vec<(String, u32, Option<u64>, u64)>,
}

/// Convergence: for each acknowledged write, the first sample time at which the latest sample of
/// every copy of its key was at that version or newer. Copies are the ones that were sampled.
pub fn convergence(events: &[Event]) -> Convergence {
    let mut samples: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for event in events
        .iter()
        .filter(|event| event.op == Op::Sample && event.copy.is_some())
    {
        samples.entry(event.key.as_str()).or_default().push(event);
    }
    for list in samples.values_mut() {
        list.sort_by_key(|event| event.end_us);
    }
    let mut durations = Vec::new();
    let mut unconverged = Vec::new();
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    for write in events
        .iter()
        .filter(|event| event.op == Op::Write || event.op == Op::Delete)
    {
        let Some(version) = write.acknowledged_version() else {
            continue;
        };
        let top = highest.entry(write.key.as_str()).or_insert(version);
        *top = (*top).max(version);
        let Some(list) = samples.get(write.key.as_str()) else {
            continue;
        };
        let copies: std::collections::BTreeSet<u32> =
            list.iter().filter_map(|event| event.copy).collect();
        let mut latest: HashMap<u32, u64> = HashMap::new();
        let mut reached = None;
        for sample in list {
            if let Some(copy) = sample.copy {
                latest.insert(copy, sample.version.unwrap_or(0));
            }
            if sample.end_us >= write.end_us
                && copies
                    .iter()
                    .all(|copy| latest.get(copy).is_some_and(|held| *held >= version))
            {
                reached = Some(sample.end_us);
                break;
            }
        }
        match reached {
            Some(at) => durations.push(at.saturating_sub(write.end_us)),
            None => unconverged.push((write.key.clone(), version)),
        }
    }
    let mut lagging_at_end = Vec::new();
    for (key, list) in &samples {
        let Some(target) = highest.get(key) else {
            continue;
        };
        let mut last: BTreeMap<u32, Option<u64>> = BTreeMap::new();
        for sample in list {
            if let Some(copy) = sample.copy {
                last.insert(copy, sample.version);
            }
        }
        for (copy, version) in last {
            if version.is_none_or(|held| held < *target) {
                lagging_at_end.push(((*key).to_owned(), copy, version, *target));
            }
        }
    }
    Convergence {
        time_to_converge: Percentiles::of(durations),
        unconverged,
        lagging_at_end,
    }
}

/// A copy's sampled version went down, or a copy that held a version was found empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CopyRegression {
    /// The key.
    pub key: String,
    /// The copy.
    pub copy: u32,
    /// When the sample was taken.
    pub at_us: u64,
    /// The highest version sampled before.
    pub before: u64,
    /// What the sample found: an older version, or `None` (the copy was empty).
    pub now: Option<u64>,
}

/// Copies never regress: per copy, sampled versions never go down. A copy found empty after
/// holding a version is reported with `now: None` (data lost by a restart, or expiry), apart from
/// true regressions, which [`CopyRegression::is_rollback`] tells.
pub fn copy_regressions(events: &[Event]) -> Vec<CopyRegression> {
    let mut samples: Vec<&Event> = events
        .iter()
        .filter(|event| event.op == Op::Sample && event.copy.is_some())
        .collect();
    samples.sort_by_key(|event| event.end_us);
    let mut highest: HashMap<(&str, u32), u64> = HashMap::new();
    let mut found = Vec::new();
    for sample in samples {
        let Some(copy) = sample.copy else { continue };
        let slot = (sample.key.as_str(), copy);
        if let Some(before) = highest.get(&slot).copied() {
            if sample.version.is_none_or(|now| now < before) {
                found.push(CopyRegression {
                    key: sample.key.clone(),
                    copy,
                    at_us: sample.end_us,
                    before,
                    now: sample.version,
                });
            }
        }
        if let Some(version) = sample.version {
            let top = highest.entry(slot).or_insert(version);
            *top = (*top).max(version);
        }
    }
    found
}

impl CopyRegression {
    /// Whether the copy held an older version (a rollback), rather than nothing.
    pub fn is_rollback(&self) -> bool {
        self.now.is_some()
    }
}

/// How far behind the newest acknowledged write the reads were.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Staleness {
    /// Reads judged (reads that returned a version).
    pub reads: usize,
    /// Reads that returned a version older than the newest one acknowledged before they started.
    pub stale: usize,
    /// For stale reads: how long the returned version had already been superseded.
    pub behind: Percentiles,
    /// For every read: how long the returned version had already been superseded when the read
    /// started (0 for a read of the newest acknowledged version).
    pub every: Percentiles,
}

/// Staleness: for each read that returned version `v` and started at `s`, the newest version
/// acknowledged before `s`; if it is newer than `v`, the read was stale by the time since the
/// first acknowledged write newer than `v`.
pub fn staleness(events: &[Event]) -> Staleness {
    let mut acks: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for event in events {
        if let Some(version) = event.acknowledged_version() {
            acks.entry(event.key.as_str())
                .or_default()
                .push((event.end_us, version));
        }
    }
    let mut reads = 0;
    let mut behind = Vec::new();
    let mut every = Vec::new();
    for read in events {
        let Some(version) = read.read_version() else {
            continue;
        };
        reads += 1;
        let Some(list) = acks.get(read.key.as_str()) else {
            every.push(0);
            continue;
        };
        let superseded_at = list
            .iter()
            .filter(|(end, newer)| *end <= read.start_us && *newer > version)
            .map(|(end, _)| *end)
            .min();
        match superseded_at {
            Some(since) => {
                behind.push(read.start_us - since);
                every.push(read.start_us - since);
            }
            None => every.push(0),
        }
    }
    Staleness {
        reads,
        stale: behind.len(),
        behind: Percentiles::of(behind),
        every: Percentiles::of(every),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event on key `k` that names no copy (a read or sample sets `copy` on it).
    fn event(
        session: &str,
        op: Op,
        version: Option<u64>,
        (start_us, end_us): (u64, u64),
        outcome: Outcome,
    ) -> Event {
        Event {
            session: session.into(),
            op,
            key: "k".into(),
            version,
            copy: None,
            served_by: None,
            route: None,
            start_us,
            end_us,
            outcome,
        }
    }

    fn read(session: &str, version: Option<u64>, start_us: u64) -> Event {
        let outcome = if version.is_some() {
            Outcome::Ok
        } else {
            Outcome::NotFound
        };
        Event {
            copy: Some(0),
            ..event(
                session,
                Op::Read,
                version,
                (start_us, start_us + 5),
                outcome,
            )
        }
    }

    /// A read answered 404 by a tombstone at `version` (the answer names it, and no copy).
    fn tombstone(session: &str, version: u64, start_us: u64) -> Event {
        event(
            session,
            Op::Read,
            Some(version),
            (start_us, start_us + 5),
            Outcome::NotFound,
        )
    }

    fn write(session: &str, version: u64, start_us: u64) -> Event {
        event(
            session,
            Op::Write,
            Some(version),
            (start_us, start_us + 5),
            Outcome::Ok,
        )
    }

    fn sample(copy: u32, version: Option<u64>, at_us: u64) -> Event {
        let outcome = if version.is_some() {
            Outcome::Ok
        } else {
            Outcome::NotFound
        };
        Event {
            copy: Some(copy),
            ..event("sampler", Op::Sample, version, (at_us, at_us), outcome)
        }
    }

    #[test]
    fn monotonic_reads_catches_new_old_new() {
        let clean = vec![
            read("a", Some(1), 0),
            read("a", Some(2), 10),
            read("a", Some(2), 20),
            read("b", Some(1), 30),
        ];
        assert!(monotonic_reads(&clean).is_empty());
        let flip = vec![
            read("a", Some(1), 0),
            read("a", Some(3), 10),
            read("a", Some(2), 20),
            read("a", Some(3), 30),
        ];
        let violations = monotonic_reads(&flip);
        assert_eq!(violations.len(), 1);
        assert_eq!(
            (violations[0].seen, violations[0].then, violations[0].at_us),
            (3, 2, 20)
        );
        // Overlapping reads are concurrent: no order, no violation.
        let overlapping = vec![
            event("a", Op::Read, Some(3), (0, 100), Outcome::Ok),
            event("a", Op::Read, Some(2), (50, 60), Outcome::Ok),
        ];
        assert!(monotonic_reads(&overlapping).is_empty());
        // Another session's newer read does not bind this one.
        assert!(monotonic_reads(&[read("a", Some(3), 0), read("b", Some(2), 10)]).is_empty());
    }

    #[test]
    fn a_value_below_a_tombstone_already_read_is_a_violation() {
        let history = vec![tombstone("a", 5, 0), read("a", Some(3), 10)];
        let violations = monotonic_reads(&history);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let found = &violations[0];
        assert_eq!((found.seen, found.then, found.at_us), (5, 3, 10));
        assert!(found.seen_invalidated && !found.then_invalidated);
        // The 404 names no copy, so the two reads are not known to be of one copy.
        assert_eq!(found.scope(), Scope::AcrossCopies);
        // A loss window explains it like any other violation.
        let (inside, outside) = split_by_windows(violations, &[(0, 20)]);
        assert_eq!((inside.len(), outside.len()), (1, 0));
    }

    #[test]
    fn a_tombstone_below_one_already_read_is_a_violation() {
        let violations = monotonic_reads(&[tombstone("a", 5, 0), tombstone("a", 3, 10)]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!((violations[0].seen, violations[0].then), (5, 3));
        assert!(violations[0].seen_invalidated && violations[0].then_invalidated);
        // A tombstone below a value already read goes back too.
        let violations = monotonic_reads(&[read("a", Some(6), 0), tombstone("a", 5, 10)]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(!violations[0].seen_invalidated && violations[0].then_invalidated);
    }

    #[test]
    fn tombstones_that_move_forward_and_versionless_404s_are_not_violations() {
        let forward = vec![
            read("a", Some(2), 0),
            tombstone("a", 3, 10),
            read("a", Some(4), 20),
            tombstone("a", 5, 30),
            // A 404 for a key with no record names no version: absence is not judged.
            read("a", None, 40),
            read("a", Some(6), 50),
        ];
        assert!(monotonic_reads(&forward).is_empty());
        // Another session's tombstone does not bind this one.
        assert!(monotonic_reads(&[tombstone("b", 5, 0), read("a", Some(3), 10)]).is_empty());
        // A tombstone read overlapping the older read is concurrent with it.
        let overlapping = vec![
            event("a", Op::Read, Some(5), (0, 100), Outcome::NotFound),
            read("a", Some(3), 50),
        ];
        assert!(monotonic_reads(&overlapping).is_empty());
    }

    #[test]
    fn violations_say_which_reads_they_compared() {
        let served = |version, copy, role: &str, start_us| {
            let mut read = read("a", Some(version), start_us);
            read.copy = Some(copy);
            read.served_by = Some(format!("127.0.0.1:7000;role={role}"));
            read
        };
        let history = vec![
            served(3, 1, "primary", 0),
            served(2, 2, "primary", 10), // a sibling, older
            served(4, 1, "primary", 20),
            served(3, 1, "replica", 30), // the same copy's lagging replica
            served(5, 1, "replica", 40),
            served(4, 1, "replica", 50), // the same copy went back
        ];
        let scopes: Vec<Scope> = monotonic_reads(&history)
            .iter()
            .map(MonotonicViolation::scope)
            .collect();
        assert_eq!(
            scopes,
            vec![Scope::AcrossCopies, Scope::AcrossRoles, Scope::SameCopy]
        );
    }

    #[test]
    fn violations_split_by_loss_windows() {
        let flip = vec![
            read("a", Some(3), 0),
            read("a", Some(2), 20),
            read("a", Some(1), 100),
        ];
        let (inside, outside) = split_by_windows(monotonic_reads(&flip), &[(10, 50)]);
        assert_eq!((inside.len(), outside.len()), (1, 1));
        assert_eq!(outside[0].at_us, 100);
    }

    #[test]
    fn read_your_writes_catches_an_older_read_after_an_acknowledged_write() {
        let good = vec![
            write("w", 5, 0),
            read("w", Some(5), 10),
            read("w", Some(6), 20),
        ];
        assert!(read_your_writes(&good).is_empty());
        let bad = vec![write("w", 5, 0), read("w", Some(4), 10)];
        assert_eq!(read_your_writes(&bad)[0].read, Some(4));
        let missing = vec![write("w", 5, 0), read("w", None, 10)];
        assert_eq!(read_your_writes(&missing)[0].read, None);
        let deleted = vec![
            write("w", 5, 0),
            event("x", Op::Delete, Some(6), (6, 8), Outcome::Ok),
            read("w", None, 10),
        ];
        assert!(read_your_writes(&deleted).is_empty());
        // A read that started before the write was acknowledged is not bound by it.
        let early = vec![
            event("w", Op::Write, Some(5), (0, 50), Outcome::Ok),
            read("w", Some(4), 10),
        ];
        assert!(read_your_writes(&early).is_empty());
        // Another session's read is not bound by this session's write.
        assert!(read_your_writes(&[write("w", 5, 0), read("r", Some(4), 10)]).is_empty());
    }

    #[test]
    fn convergence_measures_time_until_every_copy_caught_up() {
        let events = vec![
            write("w", 1, 0), // acknowledged at 5
            sample(0, Some(1), 10),
            sample(1, None, 10),
            sample(1, Some(1), 40),
            write("w", 2, 100), // acknowledged at 105
            sample(0, Some(2), 110),
            sample(1, Some(1), 110),
        ];
        let report = convergence(&events);
        assert_eq!(report.time_to_converge.count, 1);
        assert_eq!(report.time_to_converge.max_ms, 0.035);
        assert_eq!(report.unconverged, vec![("k".to_owned(), 2)]);
        assert_eq!(report.lagging_at_end, vec![("k".to_owned(), 1, Some(1), 2)]);
    }

    #[test]
    fn copy_regressions_tell_rollbacks_from_losses() {
        let fine = vec![
            sample(0, Some(1), 0),
            sample(0, Some(2), 10),
            sample(0, Some(2), 20),
        ];
        assert!(copy_regressions(&fine).is_empty());
        let events = vec![
            sample(0, Some(3), 0),
            sample(0, Some(2), 10),
            sample(1, Some(3), 0),
            sample(1, None, 10),
        ];
        let found = copy_regressions(&events);
        assert_eq!(found.len(), 2);
        let rollback = found.iter().find(|r| r.copy == 0).unwrap();
        assert!(rollback.is_rollback());
        assert_eq!((rollback.before, rollback.now), (3, Some(2)));
        assert!(!found.iter().find(|r| r.copy == 1).unwrap().is_rollback());
    }

    #[test]
    fn staleness_counts_reads_behind_acknowledged_writes() {
        let events = vec![
            write("w", 1, 0),
            write("w", 2, 100),
            read("r", Some(2), 200),
            read("r", Some(1), 300),
            read("r", Some(1), 50),
        ];
        let report = staleness(&events);
        assert_eq!((report.reads, report.stale), (3, 1));
        // Version 2 was acknowledged at 105; the read at 300 was 195 µs behind.
        assert_eq!(report.behind.max_ms, 0.195);
        // Every read counts in `every`: the two fresh ones at 0.
        assert_eq!((report.every.count, report.every.p50_ms), (3, 0.0));
        assert_eq!(report.every.max_ms, 0.195);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|ms| ms * 1000).collect());
        assert_eq!(
            (p.count, p.p50_ms, p.p99_ms, p.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        assert_eq!(Percentiles::of(Vec::new()).count, 0);
    }
}
