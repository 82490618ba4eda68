//! The tracking table itself: which connection tracks which key until when, the `BCAST`
//! connections and their prefixes, the connections invalidations may be redirected to. Every
//! method runs under the one lock of [`super::Tracking`] and touches no socket: an
//! invalidation is a key appended to an [`Outbox`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::outbox::{Close, Outbox};
use super::{Cause, Limits, Mode};

/// What one tracked key of one connection is counted for beyond the key's bytes: what its
/// entries take when no other connection tracks the key. A slot of the connection's map and
/// one of the key index (41 bytes each; ~90 at the half load a map may have after it grew or
/// shrank), the index's list of connections (32), the key's shared header (16) and its lease
/// entry (48 bytes in a B-tree node at least half full: ~100). The 160 counted before was
/// about half of that, so the table could take twice `resp.tracking_max_bytes`.
pub(super) const ENTRY_OVERHEAD: usize = 384;

/// A map is shrunk once it is less than a quarter full, to twice what it holds: a connection
/// that once tracked many keys does not keep their room after they were invalidated (the
/// bounds count entries, not the room maps keep).
const SHRINK_BELOW: usize = 4;

/// Maps of at most this many entries are never shrunk.
const SMALL_MAP: usize = 64;

/// Shrinks `map` when it is less than a quarter full (see [`SHRINK_BELOW`]).
fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > SMALL_MAP && map.len() * SHRINK_BELOW < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// How long a key read but not answered yet stays tracked at most: the read settles it
/// ([`Table::settle`]) long before.
const PENDING_HOLD: Duration = Duration::from_secs(3600);

/// One tracking connection.
#[derive(Debug)]
struct Tracker {
    /// Where its invalidations go: its own outbox, or its `REDIRECT` target's.
    dest: Arc<Outbox>,
    /// Its mode.
    mode: Mode,
    /// The keys it tracks: until when, and the sequence number of that entry.
    tracked: HashMap<Arc<str>, (Instant, u64)>,
    /// The bytes `tracked` is counted for.
    bytes: usize,
}

/// How many invalidations one call sent, by cause, and how many outboxes overflowed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Invalidations appended to an outbox, by [`Cause`] (its index).
    pub by_cause: [u64; Cause::ALL.len()],
    /// Outboxes that passed their bound (their connections close).
    pub overflowed: u64,
}

impl Sent {
    /// Adds `other`.
    pub fn add(&mut self, other: Sent) {
        for (mine, theirs) in self.by_cause.iter_mut().zip(other.by_cause) {
            *mine += theirs;
        }
        self.overflowed += other.overflowed;
    }
}

/// Why a connection could not start tracking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `REDIRECT id` names no open connection of this instance.
    NoSuchClient,
    /// It asked for more prefixes than `resp.tracking_max_prefixes`.
    TooManyPrefixes(usize),
}

/// The table.
#[derive(Debug, Default)]
pub(super) struct Table {
    /// Its bounds.
    limits: Limits,
    /// What was pushed since [`Table::take_sent`] last took it.
    sent: Sent,
    /// Key → the connections tracking it.
    keys: HashMap<Arc<str>, Vec<u64>>,
    /// The tracking connections.
    conns: HashMap<u64, Tracker>,
    /// Every tracked key's lease end, earliest first: what the clock pushes, and what is
    /// invalidated first to make room.
    leases: BTreeMap<(Instant, u64), (u64, Arc<str>)>,
    /// The last sequence number given to an entry.
    seq: u64,
    /// The bytes every tracked key is counted for.
    bytes: usize,
    /// The connections in `BCAST` mode.
    bcast: Vec<u64>,
    /// Every open connection (a `REDIRECT` target is named by its id).
    open: HashMap<u64, Weak<Outbox>>,
    /// Target → the connections redirecting to it.
    redirected: HashMap<u64, Vec<u64>>,
}

impl Table {
    /// An empty table with `limits`.
    pub(super) fn new(limits: Limits) -> Table {
        Table {
            limits,
            ..Table::default()
        }
    }

    /// What was pushed since the last call.
    pub(super) fn take_sent(&mut self) -> Sent {
        std::mem::take(&mut self.sent)
    }

    /// How many keys are tracked (per connection: a key two connections track counts twice).
    pub(super) fn tracked(&self) -> usize {
        self.leases.len()
    }

    /// The bytes they are counted for.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The entries the table's maps have room for (the key index and every connection's).
    #[cfg(test)]
    pub(super) fn room(&self) -> usize {
        self.keys.capacity()
            + self
                .conns
                .values()
                .map(|tracker| tracker.tracked.capacity())
                .sum::<usize>()
    }

    /// How many connections track.
    pub(super) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The earliest lease end.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.leases.keys().next().map(|(at, _)| *at)
    }

    /// A connection opened.
    pub(super) fn open(&mut self, id: u64, outbox: &Arc<Outbox>) {
        self.open.insert(id, Arc::downgrade(outbox));
    }

    /// The outbox of open connection `id`.
    pub(super) fn own_outbox(&self, id: u64) -> Option<Arc<Outbox>> {
        self.open.get(&id)?.upgrade()
    }

    /// A connection closed: it tracks nothing more, and the connections redirecting to it are
    /// told to close.
    pub(super) fn close(&mut self, id: u64) {
        self.stop(id);
        self.open.remove(&id);
        for source in self.redirected.remove(&id).unwrap_or_default() {
            // Its pushes would go to the closed connection: it tracks nothing more, and its
            // own loop closes it.
            self.stop(source);
            if let Some(own) = self.open.get(&source).and_then(Weak::upgrade) {
                own.close(Close::RedirectGone);
            }
        }
    }

    /// Starts (or changes) tracking for connection `id`, whose own outbox is `own`.
    pub(super) fn start(&mut self, id: u64, own: &Arc<Outbox>, mode: Mode) -> Result<(), Refused> {
        let most = self.limits.max_prefixes;
        if mode.prefixes.len() > most {
            return Err(Refused::TooManyPrefixes(most));
        }
        let dest = match mode.redirect {
            0 => own.clone(),
            target => self
                .open
                .get(&target)
                .and_then(Weak::upgrade)
                .ok_or(Refused::NoSuchClient)?,
        };
        self.unlink(id);
        if mode.redirect != 0 {
            self.redirected.entry(mode.redirect).or_default().push(id);
        }
        if mode.bcast {
            self.bcast.push(id);
        }
        match self.conns.get_mut(&id) {
            Some(tracker) => {
                tracker.dest = dest;
                tracker.mode = mode;
            }
            None => {
                let tracker = Tracker {
                    dest,
                    mode,
                    tracked: HashMap::new(),
                    bytes: 0,
                };
                self.conns.insert(id, tracker);
            }
        }
        Ok(())
    }

    /// Removes `id` from the `BCAST` list and its target's list.
    fn unlink(&mut self, id: u64) {
        self.bcast.retain(|other| *other != id);
        let Some(tracker) = self.conns.get(&id) else {
            return;
        };
        let target = tracker.mode.redirect;
        if let Some(sources) = self.redirected.get_mut(&target) {
            sources.retain(|source| *source != id);
            if sources.is_empty() {
                self.redirected.remove(&target);
            }
        }
    }

    /// Ends tracking for `id` (`TRACKING OFF`, `RESET`, a closed connection): its keys are
    /// forgotten without a push, as Redis does.
    pub(super) fn stop(&mut self, id: u64) {
        self.unlink(id);
        let Some(tracker) = self.conns.remove(&id) else {
            return;
        };
        for (key, (until, seq)) in tracker.tracked {
            self.leases.remove(&(until, seq));
            self.unindex(&key, id);
        }
        self.bytes = self.bytes.saturating_sub(tracker.bytes);
    }

    /// Removes `id` from `key`'s entry in the index.
    fn unindex(&mut self, key: &Arc<str>, id: u64) {
        if let Some(ids) = self.keys.get_mut(key) {
            ids.retain(|other| *other != id);
            if ids.is_empty() {
                self.keys.remove(key);
                shrink(&mut self.keys);
            }
        }
    }

    /// Whether `id` tracks.
    pub(super) fn is_tracking(&self, id: u64) -> bool {
        self.conns.contains_key(&id)
    }

    /// Tracks `key` for `id` from now until the read answering it settles: a change meanwhile
    /// is pushed before the read's reply (so the client drops what it receives). Answers the
    /// entry's sequence number (`None` when `id` does not track); keys are invalidated to make
    /// room when a bound is passed.
    pub(super) fn begin(&mut self, id: u64, key: &str) -> Option<u64> {
        let tracker = self.conns.get(&id)?;
        let key: Arc<str> = match self.keys.get_key_value(key) {
            Some((shared, _)) => shared.clone(),
            None => tracker
                .tracked
                .get_key_value(key)
                .map_or_else(|| Arc::from(key), |(shared, _)| shared.clone()),
        };
        self.seq += 1;
        let seq = self.seq;
        let until = Instant::now() + PENDING_HOLD;
        self.set(id, &key, until, seq);
        self.make_room(id, &key);
        Some(seq)
    }

    /// Sets `id`'s entry for `key` to end at `until` (its number `seq`), counting it.
    fn set(&mut self, id: u64, key: &Arc<str>, until: Instant, seq: u64) {
        let Some(tracker) = self.conns.get_mut(&id) else {
            return;
        };
        match tracker.tracked.insert(key.clone(), (until, seq)) {
            Some(before) => {
                self.leases.remove(&before);
            }
            None => {
                let cost = key.len() + ENTRY_OVERHEAD;
                tracker.bytes += cost;
                self.bytes += cost;
                self.keys.entry(key.clone()).or_default().push(id);
            }
        }
        self.leases.insert((until, seq), (id, key.clone()));
    }

    /// Invalidates keys until `id` and the instance are within their bounds (never `keep`,
    /// the key just tracked): first `id`'s own, then the instance's earliest leases.
    fn make_room(&mut self, id: u64, keep: &Arc<str>) {
        loop {
            let Some(tracker) = self.conns.get(&id) else {
                return;
            };
            if tracker.bytes <= self.limits.max_bytes_per_connection {
                break;
            }
            let Some(victim) = tracker.tracked.keys().find(|key| *key != keep).cloned() else {
                break;
            };
            self.invalidate_one(id, &victim, Cause::Evicted);
        }
        while self.bytes > self.limits.max_bytes {
            let victim = self
                .leases
                .values()
                .find(|(owner, key)| !(*owner == id && key == keep))
                .cloned();
            let Some((owner, key)) = victim else {
                break;
            };
            self.invalidate_one(owner, &key, Cause::Evicted);
        }
    }

    /// Settles the read of `key` that [`Table::begin`] numbered `seq`: with a lease, the key
    /// stays tracked until it ends; without one (an answer that must not be cached), it is
    /// invalidated now, before the reply. Nothing when the entry was invalidated meanwhile.
    pub(super) fn settle(&mut self, id: u64, key: &str, seq: u64, lease: Option<Duration>) {
        let Some(tracker) = self.conns.get(&id) else {
            return;
        };
        let Some((shared, (_, current))) = tracker.tracked.get_key_value(key) else {
            return;
        };
        if *current != seq {
            return;
        }
        let shared = shared.clone();
        match lease.filter(|lease| !lease.is_zero()) {
            Some(lease) => self.set(id, &shared, Instant::now() + lease, seq),
            None => self.invalidate_one(id, &shared, Cause::Uncacheable),
        }
    }

    /// Untracks `key` for `id` and pushes its invalidation.
    fn invalidate_one(&mut self, id: u64, key: &Arc<str>, cause: Cause) {
        let Some(tracker) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(entry) = tracker.tracked.remove(key) else {
            return;
        };
        shrink(&mut tracker.tracked);
        let cost = key.len() + ENTRY_OVERHEAD;
        tracker.bytes = tracker.bytes.saturating_sub(cost);
        self.bytes = self.bytes.saturating_sub(cost);
        self.leases.remove(&entry);
        let dest = tracker.dest.clone();
        self.unindex(key, id);
        self.push(&dest, key, cause);
    }

    /// `key` changed (through `origin`, the connection whose command changed it, if any):
    /// every connection tracking it is pushed its invalidation and tracks it no more, and
    /// every `BCAST` connection with a matching prefix is pushed it; a `NOLOOP` connection is
    /// pushed nothing for its own change.
    /// Answers the outboxes it pushed to.
    pub(super) fn changed(&mut self, key: &str, origin: Option<u64>) -> Vec<Arc<Outbox>> {
        let mut told: Vec<u64> = Vec::new();
        let mut pushes: Vec<(Arc<Outbox>, Arc<str>)> = Vec::new();
        if let Some((shared, ids)) = self.keys.remove_entry(key) {
            shrink(&mut self.keys);
            for id in ids {
                let Some(tracker) = self.conns.get_mut(&id) else {
                    continue;
                };
                let Some(entry) = tracker.tracked.remove(key) else {
                    continue;
                };
                shrink(&mut tracker.tracked);
                let cost = shared.len() + ENTRY_OVERHEAD;
                tracker.bytes = tracker.bytes.saturating_sub(cost);
                self.bytes = self.bytes.saturating_sub(cost);
                self.leases.remove(&entry);
                told.push(id);
                if tracker.mode.noloop && origin == Some(id) {
                    continue;
                }
                pushes.push((tracker.dest.clone(), shared.clone()));
            }
        }
        for id in &self.bcast {
            if told.contains(id) {
                continue;
            }
            let Some(tracker) = self.conns.get(id) else {
                continue;
            };
            if tracker.mode.noloop && origin == Some(*id) {
                continue;
            }
            if tracker.mode.matches(key) {
                pushes.push((tracker.dest.clone(), Arc::from(key)));
            }
        }
        for (dest, key) in &pushes {
            self.push(dest, key, Cause::Change);
        }
        pushes.into_iter().map(|(dest, _)| dest).collect()
    }

    /// Every tracked key of a connection whose key starts with `prefix` is invalidated (a
    /// family's copy names changed), and every `BCAST` connection is pushed those keys.
    pub(super) fn changed_prefix(&mut self, prefix: &str) {
        let keys: Vec<Arc<str>> = self
            .keys
            .keys()
            .filter(|key| key.starts_with(prefix))
            .cloned()
            .collect();
        for key in keys {
            let _told = self.changed(&key, None);
        }
    }

    /// Pushes every lease that ended by `now`.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.leases.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (id, key) = entry.get().clone();
            self.invalidate_one(id, &key, Cause::Lease);
        }
    }

    /// Appends `key`'s invalidation to `dest`, counting it.
    fn push(&mut self, dest: &Arc<Outbox>, key: &Arc<str>, cause: Cause) {
        self.sent.by_cause[cause as usize] += 1;
        if !dest.push(key.clone(), self.limits.max_push_bytes) {
            self.sent.overflowed += 1;
        }
    }

    /// Invalidates every key every connection tracks, one push each, and answers how many
    /// connections were pushed to. Not the null invalidation (`>2 invalidate _`): node-redis 5
    /// answers it by emptying its cache's indexes (`BasicClientSideCache.clear`) without
    /// invalidating the reads it has in flight, so a read sent before it arrived is cached with
    /// no expiry when its reply comes, and the push of that key before the reply (a change, an
    /// answer that may not be cached) no longer finds it. A key's own push reaches such a read
    /// in every client; and every entry a client holds from this instance is a key tracked here
    /// (from before its read until its push).
    pub(super) fn flush_all(&mut self) -> u64 {
        let entries: Vec<(u64, Arc<str>)> = self
            .leases
            .values()
            .map(|(id, key)| (*id, key.clone()))
            .collect();
        let mut told: Vec<u64> = entries.iter().map(|(id, _)| *id).collect();
        told.sort_unstable();
        told.dedup();
        for (id, key) in entries {
            self.invalidate_one(id, &key, Cause::Flush);
        }
        told.len() as u64
    }
}
