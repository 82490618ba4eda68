//! Read-your-writes and monotonic reads in process: per-(client, key) floors and request-scoped
//! pins.
//!
//! A write that carries a client id records a floor (the version written) for that client and
//! key, held for the family's `pin_window`. A read whose answer came from somewhere other than
//! the reader's usual place (the primary instead of a replica, or a sibling instead of its own
//! copy) records the version it returned the same way, so that the reader's next read, back on
//! a replica that may still be behind, or on its own copy that missed a write, cannot go back.
//! A write that carries a request id pins every later read with that id to primaries for
//! `request_pin_window`. Floors and pins live in bounded LRU maps: the least recently used entry
//! goes first when `route.max_pins` is reached.
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

/// The floors one client holds for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floors {
    /// The version the client wrote, while its window is open.
    pub written: Option<Version>,
    /// The highest version a moved read returned to the client, while its window is open.
    pub seen: Option<Version>,
}

/// One entry of the floor map: each floor with the end of its own window.
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
    fn until(&self) -> Instant {
        let ends = [self.written, self.seen];
        ends.iter()
            .flatten()
            .map(|(_, until)| *until)
            .max()
            .unwrap_or_else(Instant::now)
    }
}

/// Client floors and request pins.
#[derive(Debug)]
pub struct Pins {
    /// `client \0 key` → the floors that client holds for that key.
    floors: Mutex<Lru<String, Held>>,
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
        let now = Instant::now();
        let entry = floor_key(client, key);
        let mut floors = lock(&self.floors);
        let mut held = floors.get(entry.as_str(), now).unwrap_or_default();
        update(&mut held, now + window, now);
        let until = held.until();
        floors.insert(entry, held, until);
        self.floor_count.store(floors.len(), Ordering::Relaxed);
    }

    /// The floors `client` holds for `key` whose windows are still open.
    pub fn floors(&self, client: &str, key: &Key) -> Floors {
        if self.floor_count.load(Ordering::Relaxed) == 0 {
            return Floors::default();
        }
        let entry = floor_key(client, key);
        let now = Instant::now();
        let mut floors = lock(&self.floors);
        let found = floors.get(entry.as_str(), now);
        self.floor_count.store(floors.len(), Ordering::Relaxed);
        found.map_or_else(Floors::default, |held| Floors {
            written: Held::open(held.written, now),
            seen: Held::open(held.seen, now),
        })
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
        let floor = |client| pins.floors(client, &key).written;
        assert_eq!(floor("a"), None);
        pins.record_write("a", &key, v(5), Duration::from_secs(60));
        pins.record_write("a", &key, v(3), Duration::from_secs(60));
        assert_eq!(floor("a"), Some(v(5)));
        assert_eq!(floor("b"), None);
        pins.record_write("b", &key, v(1), Duration::from_millis(0));
        assert_eq!(floor("b"), None, "an expired floor is gone");
        pins.record_write("c", &key, v(1), Duration::from_secs(60));
        pins.record_write("d", &key, v(1), Duration::from_secs(60));
        assert_eq!(
            floor("a"),
            None,
            "the least recently used floor was dropped"
        );
        assert_eq!(floor("d"), Some(v(1)));
    }

    #[test]
    fn seen_floors_are_held_apart_from_written_ones_each_with_its_window() {
        let pins = Pins::new(10, Duration::from_secs(5));
        let key = Key::parse("k").unwrap();
        pins.record_write("a", &key, v(4), Duration::from_secs(60));
        pins.record_seen("a", &key, v(6), Duration::from_secs(60));
        pins.record_seen("a", &key, v(5), Duration::from_secs(60));
        assert_eq!(
            pins.floors("a", &key),
            Floors {
                written: Some(v(4)),
                seen: Some(v(6))
            }
        );
        // A seen floor whose window ended leaves the written one in place.
        pins.record_write("b", &key, v(2), Duration::from_secs(60));
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

    #[test]
    fn request_pins() {
        let pins = Pins::new(10, Duration::from_secs(5));
        assert!(!pins.request_pinned("r1"));
        pins.record_request("r1");
        assert!(pins.request_pinned("r1"));
        assert!(!pins.request_pinned("r2"));
    }
}
