//! Read-your-writes and monotonic reads in process: per-(client, key) floors and request-scoped
//! pins.
//!
//! A write that carries a client id records a floor (the version written) for that client and
//! key, held for the family's `pin_window`. A read served from somewhere other than where the
//! reader's next read would go (a primary while replicas exist, or a sibling instead of its own
//! copy) records the version it returned the same way, so that the reader's next read, back on
//! a replica that may still be behind, or on its own copy that missed a write, cannot go back.
//! A write that carries a request id pins every later read with that id to primaries for
//! `request_pin_window`.
//!
//! # Bounds
//! Floors are bounded per client and in total, so that one client (or one caller sending many
//! client ids) cannot push out another client's floors:
//! - a client holds at most `route.max_floors_per_client` floors; a new one beyond that replaces
//!   that client's least recently used floor;
//! - the table holds at most `route.max_pins` floors; when it is full, expired floors go first,
//!   then the least recently used floor of the client holding the most, and among clients
//!   holding equally many, of the client that arrived last. A flood of new client ids therefore
//!   evicts its own floors, never those of a client that held one before the flood.
//!
//! Client ids and request ids are held as 128-bit keyed hashes (SipHash-2-4 under a key drawn
//! per process), not as the ids: an entry's size is bounded by the key's (at most 512 bytes)
//! whatever the length of the id, so the table's bytes are bounded by `route.max_pins` entries.
//!
//! Reading a floor refreshes its recency. Evicting a floor whose window is still open is counted
//! (`hotsplit_route_floor_evictions_total`). Request pins live in a bounded map that, when full,
//! drops expired pins first, then the one nearest its expiry.
//!
//! Every locked access first removes every expired entry (the expiry index is ordered, so this
//! costs one comparison when none has expired): the count that lets a read skip the lock when
//! nothing is held falls back to zero once the last window ends, instead of staying above zero
//! until each expired entry happens to be looked up again.
//!
//! No pin store in Redis is offered: checking one would cost a round trip to a primary on every
//! read, as much as reading the copy from the primary, which is what the pin avoids. A client
//! that needs read-your-writes through any instance echoes its session token
//! (`crate::fleet::session`), whose floors enter the plan like these, or sends the
//! `Hotsplit-Version` of its write back as `min_version`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

use crate::key::{Key, Version};

/// A bounded map of entries that expire: expired entries are removed on every access, and when
/// full the entry nearest its expiry goes.
#[derive(Debug)]
struct Expiring<K, V> {
    /// Entry → (value, expiry, id).
    entries: HashMap<K, (V, Instant, u64)>,
    /// (expiry, id) → entry, soonest first.
    expiry: BTreeMap<(Instant, u64), K>,
    /// The next id.
    tick: u64,
    /// The most entries held.
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Copy> Expiring<K, V> {
    fn new(capacity: usize) -> Expiring<K, V> {
        Expiring {
            entries: HashMap::new(),
            expiry: BTreeMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    /// Removes every entry whose expiry is not after `now`.
    fn purge(&mut self, now: Instant) {
        while let Some(entry) = self.expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.entries.remove(&key);
        }
    }

    fn insert(&mut self, key: K, value: V, until: Instant, now: Instant) {
        self.purge(now);
        self.tick += 1;
        if let Some((_, old_until, id)) =
            self.entries.insert(key.clone(), (value, until, self.tick))
        {
            self.expiry.remove(&(old_until, id));
        }
        self.expiry.insert((until, self.tick), key);
        while self.entries.len() > self.capacity {
            let Some((_, nearest)) = self.expiry.pop_first() else {
                break;
            };
            self.entries.remove(&nearest);
        }
    }

    /// The value held for `key` while it has not expired.
    fn get<Q>(&mut self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.purge(now);
        self.entries.get(key).map(|(value, _, _)| *value)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map operations that cannot leave the maps half-updated.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The floors one client holds for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floors {
    /// The version the client wrote, while its window is open.
    pub written: Option<Version>,
    /// The highest version a moved read returned to the client, while its window is open.
    pub seen: Option<Version>,
}

/// One entry of the floor table: each floor with the end of its own window.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    written: Option<(Version, Instant)>,
    seen: Option<(Version, Instant)>,
}

impl Held {
    fn raise(
        slot: &mut Option<(Version, Instant)>,
        version: Version,
        until: Instant,
        now: Instant,
    ) {
        *slot = match *slot {
            Some((held, held_until)) if held_until > now && held > version => {
                Some((held, held_until))
            }
            Some((held, held_until)) if held_until > now && held == version => {
                Some((held, held_until.max(until)))
            }
            _ => Some((version, until)),
        };
    }

    fn open(slot: Option<(Version, Instant)>, now: Instant) -> Option<Version> {
        slot.filter(|(_, until)| *until > now)
            .map(|(version, _)| version)
    }

    /// When the entry can go: when both windows have ended.
    fn until(&self, now: Instant) -> Instant {
        [self.written, self.seen]
            .iter()
            .flatten()
            .map(|(_, until)| *until)
            .max()
            .unwrap_or(now)
    }
}

/// One (client, key) floor entry.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The floors.
    held: Held,
    /// When both windows end: the entry's key in [`FloorTable::expiry`].
    until: Instant,
    /// Its id in [`FloorTable::expiry`], fixed when the entry is (re)written.
    id: u64,
    /// Its recency stamp in [`ClientFloors::recency`], refreshed by every use.
    used: u64,
}

/// Every floor one client holds.
#[derive(Debug)]
struct ClientFloors {
    /// When the client arrived (a table-wide sequence number): among clients holding equally
    /// many floors, the one that arrived last gives one up first.
    arrival: u64,
    /// Key → its floors.
    floors: HashMap<Arc<str>, Slot>,
    /// Use stamp → key, least recently used first.
    recency: BTreeMap<u64, Arc<str>>,
}

/// A client id or a request id as the tables hold it: a 128-bit keyed hash of the id, so an
/// entry's size does not depend on the id's length (an id may be as long as the header limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct IdHash(u128);

/// The key of [`IdHash`]: drawn at random per process, so nobody can choose ids that collide.
#[derive(Debug)]
struct IdHasher {
    /// Two SipHash-2-4 keys, one for each half of the hash.
    keys: [(u64, u64); 2],
}

impl IdHasher {
    fn random() -> IdHasher {
        IdHasher {
            keys: [
                (rand::random(), rand::random()),
                (rand::random(), rand::random()),
            ],
        }
    }

    /// Keyed SipHash-2-4 (the `siphasher` crate, as the session key and the spool use) of
    /// `domain` then `id`, twice with independent keys.
    fn hash(&self, domain: u8, id: &str) -> IdHash {
        use std::hash::Hasher;
        let half = |(k0, k1): (u64, u64)| {
            let mut hasher = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
            hasher.write_u8(domain);
            hasher.write(id.as_bytes());
            hasher.finish()
        };
        IdHash((u128::from(half(self.keys[0])) << 64) | u128::from(half(self.keys[1])))
    }
}

/// The floors of every client, bounded per client and in total.
#[derive(Debug)]
struct FloorTable {
    /// Client (its id's hash) → its floors.
    clients: HashMap<IdHash, ClientFloors>,
    /// (floors held, arrival, client): the largest holder, latest arrival last.
    by_size: BTreeSet<(usize, u64, IdHash)>,
    /// (end of the windows, id) → (client, key): expired entries first.
    expiry: BTreeMap<(Instant, u64), (IdHash, Arc<str>)>,
    /// Floors held in total.
    total: usize,
    /// The next stamp (arrivals, ids and recency share one sequence).
    tick: u64,
    /// The most floors one client holds.
    per_client: usize,
    /// The most floors held in total.
    capacity: usize,
}

impl FloorTable {
    fn new(capacity: usize, per_client: usize) -> FloorTable {
        FloorTable {
            clients: HashMap::new(),
            by_size: BTreeSet::new(),
            expiry: BTreeMap::new(),
            total: 0,
            tick: 0,
            per_client: per_client.max(1),
            capacity: capacity.max(1),
        }
    }

    fn next(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Removes every entry whose windows have all ended.
    fn purge(&mut self, now: Instant) {
        while let Some((&(until, _), _)) = self.expiry.first_key_value() {
            if until > now {
                break;
            }
            if let Some((_, (client, key))) = self.expiry.pop_first() {
                self.remove(client, &key);
            }
        }
    }

    /// The live floors of (`client`, `key`), refreshing the entry's recency.
    fn get(&mut self, client: IdHash, key: &str, now: Instant) -> Option<Held> {
        let slot = *self.clients.get(&client)?.floors.get(key)?;
        if slot.until <= now {
            self.remove(client, key);
            return None;
        }
        let used = self.next();
        let entry = self.clients.get_mut(&client)?;
        if let Some(name) = entry.recency.remove(&slot.used) {
            entry.recency.insert(used, name);
        }
        if let Some(held) = entry.floors.get_mut(key) {
            held.used = used;
        }
        Some(slot.held)
    }

    /// Writes the floors of (`client`, `key`), then evicts within the bounds. Returns how many
    /// floors whose windows were still open had to go.
    fn insert(&mut self, client: IdHash, key: &str, held: Held, now: Instant) -> u64 {
        let until = held.until(now);
        let (id, used) = (self.next(), self.next());
        let arrival = self.tick;
        if !self.clients.contains_key(&client) {
            self.by_size.insert((0, arrival, client));
            self.clients.insert(
                client,
                ClientFloors {
                    arrival,
                    floors: HashMap::new(),
                    recency: BTreeMap::new(),
                },
            );
        }
        let Some(entry) = self.clients.get_mut(&client) else {
            return 0;
        };
        let old_size = entry.floors.len();
        let key: Arc<str> = match entry.floors.get_key_value(key) {
            Some((name, _)) => name.clone(),
            None => Arc::from(key),
        };
        let slot = Slot {
            held,
            until,
            id,
            used,
        };
        if let Some(old) = entry.floors.insert(key.clone(), slot) {
            entry.recency.remove(&old.used);
            self.expiry.remove(&(old.until, old.id));
        } else {
            self.total += 1;
        }
        entry.recency.insert(used, key.clone());
        let (arrival, new_size) = (entry.arrival, entry.floors.len());
        self.expiry.insert((until, id), (client, key));
        self.resize(client, arrival, old_size, new_size);

        let mut evicted_live = 0;
        while self
            .clients
            .get(&client)
            .is_some_and(|entry| entry.floors.len() > self.per_client)
        {
            evicted_live += u64::from(self.evict_from(client, now));
        }
        while self.total > self.capacity {
            if let Some((&(until, _), _)) = self.expiry.first_key_value() {
                if until <= now {
                    if let Some((_, (client, key))) = self.expiry.pop_first() {
                        self.remove(client, &key);
                    }
                    continue;
                }
            }
            let Some(&(_, _, largest)) = self.by_size.last() else {
                break;
            };
            evicted_live += u64::from(self.evict_from(largest, now));
        }
        evicted_live
    }

    /// Drops `client`'s least recently used floor; whether its window was still open.
    fn evict_from(&mut self, client: IdHash, now: Instant) -> bool {
        let Some(key) = self
            .clients
            .get(&client)
            .and_then(|entry| entry.recency.first_key_value())
            .map(|(_, key)| key.clone())
        else {
            return false;
        };
        self.remove(client, &key)
            .is_some_and(|slot| slot.until > now)
    }

    /// Removes the entry (`client`, `key`) from every index.
    fn remove(&mut self, client: IdHash, key: &str) -> Option<Slot> {
        let entry = self.clients.get_mut(&client)?;
        let slot = entry.floors.remove(key)?;
        entry.recency.remove(&slot.used);
        let (arrival, new_size) = (entry.arrival, entry.floors.len());
        self.expiry.remove(&(slot.until, slot.id));
        self.total -= 1;
        self.resize(client, arrival, new_size + 1, new_size);
        if new_size == 0 {
            self.by_size.remove(&(0, arrival, client));
            self.clients.remove(&client);
        }
        Some(slot)
    }

    /// Moves `client` in the size order.
    fn resize(&mut self, client: IdHash, arrival: u64, old: usize, new: usize) {
        if old != new {
            self.by_size.remove(&(old, arrival, client));
            self.by_size.insert((new, arrival, client));
        }
    }
}

/// Client floors and request pins.
#[derive(Debug)]
pub struct Pins {
    /// Every client's floors.
    floors: Mutex<FloorTable>,
    /// Request id (its hash) → pinned.
    requests: Mutex<Expiring<IdHash, ()>>,
    /// Hashes client and request ids, so an entry's size does not depend on the id's length.
    ids: IdHasher,
    /// How many floors are held, so reads skip the lock when there are none.
    floor_count: AtomicUsize,
    /// How many request pins are held.
    request_count: AtomicUsize,
    /// How long a request id pins reads.
    request_pin_window: Duration,
    /// Floors evicted while their window was still open.
    live_evictions: Counter,
}

impl Pins {
    /// Empty tables: at most `capacity` floors in total and `per_client` per client, at most
    /// `capacity` request pins. Evictions of live floors are counted in `live_evictions`.
    pub fn new(
        capacity: usize,
        per_client: usize,
        request_pin_window: Duration,
        live_evictions: Counter,
    ) -> Pins {
        Pins {
            floors: Mutex::new(FloorTable::new(capacity, per_client)),
            requests: Mutex::new(Expiring::new(capacity)),
            ids: IdHasher::random(),
            floor_count: AtomicUsize::new(0),
            request_count: AtomicUsize::new(0),
            request_pin_window,
            live_evictions,
        }
    }

    /// Records that `client` wrote `version` of `key`, for `window`. A lower version never
    /// replaces a higher one still held.
    pub fn record_write(&self, client: &str, key: &Key, version: Version, window: Duration) {
        self.record(client, key, window, |held, until, now| {
            Held::raise(&mut held.written, version, until, now);
        });
    }

    /// Records that a read moved off the reader's usual place returned `version` of `key` to
    /// `client`, for `window`. A lower version never replaces a higher one still held.
    pub fn record_seen(&self, client: &str, key: &Key, version: Version, window: Duration) {
        self.record(client, key, window, |held, until, now| {
            Held::raise(&mut held.seen, version, until, now);
        });
    }

    fn record(
        &self,
        client: &str,
        key: &Key,
        window: Duration,
        update: impl FnOnce(&mut Held, Instant, Instant),
    ) {
        let client = self.ids.hash(b'C', client);
        let now = Instant::now();
        let mut floors = lock(&self.floors);
        floors.purge(now);
        let mut held = floors.get(client, key.as_str(), now).unwrap_or_default();
        update(&mut held, now + window, now);
        let evicted = floors.insert(client, key.as_str(), held, now);
        self.floor_count.store(floors.total, Ordering::Relaxed);
        drop(floors);
        if evicted > 0 {
            self.live_evictions.inc_by(evicted);
        }
    }

    /// The floors `client` holds for `key` whose windows are still open.
    pub fn floors(&self, client: &str, key: &Key) -> Floors {
        if self.floor_count.load(Ordering::Relaxed) == 0 {
            return Floors::default();
        }
        let client = self.ids.hash(b'C', client);
        let now = Instant::now();
        let mut floors = lock(&self.floors);
        floors.purge(now);
        let found = floors.get(client, key.as_str(), now);
        self.floor_count.store(floors.total, Ordering::Relaxed);
        found.map_or_else(Floors::default, |held| Floors {
            written: Held::open(held.written, now),
            seen: Held::open(held.seen, now),
        })
    }

    /// Records that request `id` wrote: its later reads go to primaries.
    pub fn record_request(&self, id: &str) {
        let id = self.ids.hash(b'R', id);
        let mut requests = lock(&self.requests);
        let now = Instant::now();
        requests.insert(id, (), now + self.request_pin_window, now);
        self.request_count.store(requests.len(), Ordering::Relaxed);
    }

    /// Whether request `id` is pinned to primaries.
    pub fn request_pinned(&self, id: &str) -> bool {
        if self.request_count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let id = self.ids.hash(b'R', id);
        let mut requests = lock(&self.requests);
        let found = requests.get(&id, Instant::now()).is_some();
        self.request_count.store(requests.len(), Ordering::Relaxed);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    fn pins(capacity: usize, per_client: usize) -> (Pins, Counter) {
        let evictions = Counter::default();
        (
            Pins::new(
                capacity,
                per_client,
                Duration::from_secs(5),
                evictions.clone(),
            ),
            evictions,
        )
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn floors_expire_keep_the_highest_and_are_bounded() {
        let (pins, evictions) = pins(2, 10);
        let key = Key::parse("k").unwrap();
        let floor = |client| pins.floors(client, &key).written;
        assert_eq!(floor("a"), None);
        pins.record_write("a", &key, v(5), MINUTE);
        pins.record_write("a", &key, v(3), MINUTE);
        assert_eq!(floor("a"), Some(v(5)));
        assert_eq!(floor("b"), None);
        pins.record_write("b", &key, v(1), Duration::from_millis(0));
        assert_eq!(floor("b"), None, "an expired floor is gone");
        pins.record_write("c", &key, v(1), MINUTE);
        assert_eq!(evictions.get(), 0, "the table had room");
        // Full: a newcomer among equal holders gives up its own floor, counted.
        pins.record_write("d", &key, v(1), MINUTE);
        assert_eq!(floor("a"), Some(v(5)), "an established floor stays");
        assert_eq!(floor("c"), Some(v(1)));
        assert_eq!(floor("d"), None);
        assert_eq!(evictions.get(), 1);
    }

    #[test]
    fn expired_floors_make_room_before_live_ones_go() {
        let (pins, evictions) = pins(2, 10);
        let key = Key::parse("k").unwrap();
        pins.record_write("a", &key, v(1), MINUTE);
        pins.record_write("b", &key, v(1), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        pins.record_write("c", &key, v(1), MINUTE);
        assert_eq!(pins.floors("a", &key).written, Some(v(1)));
        assert_eq!(pins.floors("c", &key).written, Some(v(1)));
        assert_eq!(
            evictions.get(),
            0,
            "an expired floor is not a live eviction"
        );
    }

    #[test]
    fn a_client_over_its_share_gives_up_its_least_recently_used_floor() {
        let (pins, evictions) = pins(100, 2);
        let keys: Vec<Key> = (0..3)
            .map(|n| Key::parse(&format!("k{n}")).unwrap())
            .collect();
        pins.record_write("a", &keys[0], v(1), MINUTE);
        pins.record_write("a", &keys[1], v(1), MINUTE);
        // Reading k0 makes k1 the least recently used.
        assert_eq!(pins.floors("a", &keys[0]).written, Some(v(1)));
        pins.record_write("a", &keys[2], v(1), MINUTE);
        assert_eq!(pins.floors("a", &keys[0]).written, Some(v(1)));
        assert_eq!(pins.floors("a", &keys[1]).written, None);
        assert_eq!(pins.floors("a", &keys[2]).written, Some(v(1)));
        assert_eq!(evictions.get(), 1);
    }

    #[test]
    fn a_flood_of_client_ids_never_evicts_an_established_floor() {
        let (pins, evictions) = pins(64, 8);
        let key = Key::parse("k").unwrap();
        pins.record_write("victim", &key, v(7), MINUTE);
        for n in 0..10_000 {
            pins.record_seen(&format!("flood-{n}"), &key, v(1), MINUTE);
        }
        assert_eq!(pins.floors("victim", &key).written, Some(v(7)));
        assert!(evictions.get() >= 10_000 - 63, "{}", evictions.get());
        // The largest holder gives up first: a client holding many floors loses one of them
        // rather than a client holding one.
        let (pins, _) = pins_pair();
        let other = Key::parse("other").unwrap();
        assert_eq!(pins.floors("one", &other).written, Some(v(1)));
    }

    /// A full table where `many` holds three floors and `one` holds one; then a newcomer.
    fn pins_pair() -> (Pins, Counter) {
        let (pins, evictions) = pins(4, 8);
        for n in 0..3 {
            pins.record_write("many", &Key::parse(&format!("m{n}")).unwrap(), v(1), MINUTE);
        }
        pins.record_write("one", &Key::parse("other").unwrap(), v(1), MINUTE);
        pins.record_write("new", &Key::parse("x").unwrap(), v(1), MINUTE);
        assert_eq!(
            pins.floors("new", &Key::parse("x").unwrap()).written,
            Some(v(1))
        );
        assert_eq!(evictions.get(), 1);
        (pins, evictions)
    }

    #[test]
    fn seen_floors_are_held_apart_from_written_ones_each_with_its_window() {
        let (pins, _) = pins(10, 10);
        let key = Key::parse("k").unwrap();
        pins.record_write("a", &key, v(4), MINUTE);
        pins.record_seen("a", &key, v(6), MINUTE);
        pins.record_seen("a", &key, v(5), MINUTE);
        assert_eq!(
            pins.floors("a", &key),
            Floors {
                written: Some(v(4)),
                seen: Some(v(6))
            }
        );
        // A seen floor whose window ended leaves the written one in place.
        pins.record_write("b", &key, v(2), MINUTE);
        pins.record_seen("b", &key, v(3), Duration::from_millis(0));
        assert_eq!(
            pins.floors("b", &key),
            Floors {
                written: Some(v(2)),
                seen: None
            }
        );
        assert_eq!(pins.floors("c", &key), Floors::default());
    }

    /// Polls `done` for up to ten seconds.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn expired_entries_leave_so_reads_skip_the_lock_again() {
        let (pins, _) = pins(10, 10);
        let key = Key::parse("k").unwrap();
        pins.record_write("a", &key, v(1), Duration::from_millis(2));
        pins.record_seen("b", &key, v(1), Duration::from_millis(2));
        pins.record_request("r1");
        assert_eq!(pins.floor_count.load(Ordering::Relaxed), 2);
        // A lookup by a third client, which holds nothing, removes every expired floor: the
        // count that lets reads skip the mutex is back to zero.
        assert!(eventually(|| {
            let _ = pins.floors("c", &key);
            pins.floor_count.load(Ordering::Relaxed) == 0
        }));
        assert_eq!(lock(&pins.floors).expiry.len(), 0);
        assert!(lock(&pins.floors).clients.is_empty());
    }

    #[test]
    fn a_full_request_table_drops_expired_pins_then_the_nearest_expiry() {
        let mut table: Expiring<&str, ()> = Expiring::new(2);
        let now = Instant::now();
        table.insert("soon", (), now + Duration::from_secs(1), now);
        table.insert("late", (), now + Duration::from_secs(60), now);
        table.insert("new", (), now + Duration::from_secs(30), now);
        assert_eq!(table.get("soon", now), None, "nearest its expiry");
        assert_eq!(table.get("late", now), Some(()));
        assert_eq!(table.get("new", now), Some(()));
        // Past "new"'s expiry, any access removes it.
        let later = now + Duration::from_secs(31);
        assert_eq!(table.get("late", later), Some(()));
        assert_eq!(table.len(), 1);
        assert_eq!(table.expiry.len(), 1);
    }

    #[test]
    fn request_pins() {
        let (pins, _) = pins(10, 10);
        assert!(!pins.request_pinned("r1"));
        pins.record_request("r1");
        assert!(pins.request_pinned("r1"));
        assert!(!pins.request_pinned("r2"));
    }
}
