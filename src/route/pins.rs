//! Read-your-writes in process: per-(client, key) write floors and request-scoped pins.
//!
//! A write that carries a client id records a floor (the version written) for that client and
//! key, held for the family's `pin_window`; a write that carries a request id pins every later
//! read with that id to primaries for `request_pin_window`. Both live in bounded LRU maps: the
//! least recently used entry goes first when `route.max_pins` is reached.
//!
//! No pin store in Redis is offered: checking one would cost a round trip to a primary on every
//! read, as much as reading the copy from the primary, which is what the pin avoids. A client
//! that needs read-your-writes through any instance sends the `Hotsplit-Version` of its write
//! back as `min_version` instead.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::key::{Key, Version};

/// A bounded map that drops the least recently used entry and ignores expired ones.
#[derive(Debug)]
struct Lru<K, V> {
    /// Entry → (value, expiry, use stamp).
    entries: HashMap<K, (V, Instant, u64)>,
    /// Use stamp → entry, oldest first.
    order: BTreeMap<u64, K>,
    /// The next use stamp.
    tick: u64,
    /// The most entries held.
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Copy> Lru<K, V> {
    fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    fn insert(&mut self, key: K, value: V, until: Instant) {
        self.tick += 1;
        if let Some((_, _, stamp)) = self.entries.insert(key.clone(), (value, until, self.tick)) {
            self.order.remove(&stamp);
        }
        self.order.insert(self.tick, key);
        while self.entries.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }

    fn get<Q>(&mut self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (value, until, stamp) = *self.entries.get(key)?;
        if until <= now {
            if let Some((found, _)) = self.entries.remove_entry(key) {
                self.order.remove(&stamp);
                drop(found);
            }
            return None;
        }
        Some(value)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map operations that cannot leave the map half-updated.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Write floors and request pins.
#[derive(Debug)]
pub struct Pins {
    /// `client \0 key` → the version the client wrote.
    floors: Mutex<Lru<String, Version>>,
    /// Request id → pinned.
    requests: Mutex<Lru<String, ()>>,
    /// How many floors are held, so reads skip the lock when there are none.
    floor_count: AtomicUsize,
    /// How many request pins are held.
    request_count: AtomicUsize,
    /// How long a request id pins reads.
    request_pin_window: Duration,
}

fn floor_key(client: &str, key: &Key) -> String {
    let mut text = String::with_capacity(client.len() + key.as_str().len() + 1);
    text.push_str(client);
    text.push('\0');
    text.push_str(key.as_str());
    text
}

impl Pins {
    /// Empty maps of at most `capacity` entries each.
    pub fn new(capacity: usize, request_pin_window: Duration) -> Pins {
        Pins {
            floors: Mutex::new(Lru::new(capacity)),
            requests: Mutex::new(Lru::new(capacity)),
            floor_count: AtomicUsize::new(0),
            request_count: AtomicUsize::new(0),
            request_pin_window,
        }
    }

    /// Records that `client` wrote `version` of `key`, for `window`. A lower version never
    /// replaces a higher one still held.
    pub fn record_write(&self, client: &str, key: &Key, version: Version, window: Duration) {
        let now = Instant::now();
        let entry = floor_key(client, key);
        let mut floors = lock(&self.floors);
        let version = match floors.get(entry.as_str(), now) {
            Some(held) if held > version => held,
            _ => version,
        };
        floors.insert(entry, version, now + window);
        self.floor_count.store(floors.len(), Ordering::Relaxed);
    }

    /// The floor `client` holds for `key`, if its window is still open.
    pub fn floor(&self, client: &str, key: &Key) -> Option<Version> {
        if self.floor_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let entry = floor_key(client, key);
        let mut floors = lock(&self.floors);
        let found = floors.get(entry.as_str(), Instant::now());
        self.floor_count.store(floors.len(), Ordering::Relaxed);
        found
    }

    /// Records that request `id` wrote: its later reads go to primaries.
    pub fn record_request(&self, id: &str) {
        let mut requests = lock(&self.requests);
        requests.insert(id.to_owned(), (), Instant::now() + self.request_pin_window);
        self.request_count.store(requests.len(), Ordering::Relaxed);
    }

    /// Whether request `id` is pinned to primaries.
    pub fn request_pinned(&self, id: &str) -> bool {
        if self.request_count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut requests = lock(&self.requests);
        let found = requests.get(id, Instant::now()).is_some();
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

    #[test]
    fn floors_expire_keep_the_highest_and_are_bounded() {
        let pins = Pins::new(2, Duration::from_secs(5));
        let key = Key::parse("k").unwrap();
        assert_eq!(pins.floor("a", &key), None);
        pins.record_write("a", &key, v(5), Duration::from_secs(60));
        pins.record_write("a", &key, v(3), Duration::from_secs(60));
        assert_eq!(pins.floor("a", &key), Some(v(5)));
        assert_eq!(pins.floor("b", &key), None);
        pins.record_write("b", &key, v(1), Duration::from_millis(0));
        assert_eq!(pins.floor("b", &key), None, "an expired floor is gone");
        pins.record_write("c", &key, v(1), Duration::from_secs(60));
        pins.record_write("d", &key, v(1), Duration::from_secs(60));
        assert_eq!(
            pins.floor("a", &key),
            None,
            "the least recently used floor was dropped"
        );
        assert_eq!(pins.floor("d", &key), Some(v(1)));
    }

    #[test]
    fn request_pins() {
        let pins = Pins::new(10, Duration::from_secs(5));
        assert!(!pins.request_pinned("r1"));
        pins.record_request("r1");
        assert!(pins.request_pinned("r1"));
        assert!(!pins.request_pinned("r2"));
    }
}
