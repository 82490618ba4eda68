//! Space-Saving (Metwally, Agrawal, El Abbadi, ICDT 2005): the top of a stream of keys in a
//! fixed number of counters.
//!
//! A table of at most `capacity` counters. A key with a counter adds to it; a new key takes a
//! free counter, or replaces the key whose count is smallest and starts from that count plus
//! its own (the inherited part is its `error`). So every count over-states its key's true count
//! by at most its `error`, never under-states it, and every key whose true count is above
//! `total / capacity` holds a counter: the heavy hitters are never missed.
//!
//! Two counts ride on each counter: what clients asked (the ranking) and what reached Redis
//! (carried along, with the same eviction). A read is offered with a weight, the reads it stands
//! for (the sampler's one-in-k), so counts are estimated reads. The table is replaced each
//! window ([`super::HotKeys`]), so counts are per window.

use std::collections::HashMap;

/// One counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// The key.
    pub key: Box<str>,
    /// Reads asked for it this window, weighted (with the inherited error).
    pub asked: u64,
    /// Of its reads, those that reached Redis, weighted.
    pub store: u64,
    /// What `asked` inherited from the key it replaced: the most it over-states.
    pub error: u64,
    /// Whether its count already proved it hot this window ([`super::HotKeys`] sets it, so a
    /// key is reported once a window).
    pub found_hot: bool,
}

impl Counter {
    /// Its count less the inherited error: at most its true count.
    pub fn guaranteed(&self) -> u64 {
        self.asked - self.error
    }
}

/// A Space-Saving table.
#[derive(Debug)]
pub struct TopK {
    /// The counters, at most `capacity`.
    counters: Vec<Counter>,
    /// Each key's counter index.
    index: HashMap<Box<str>, usize>,
    /// The most counters.
    capacity: usize,
    /// Reads offered this window, weighted.
    total: u64,
}

impl TopK {
    /// An empty table of `capacity` counters (at least 1).
    pub fn new(capacity: usize) -> TopK {
        let capacity = capacity.max(1);
        TopK {
            counters: Vec::with_capacity(capacity),
            index: HashMap::with_capacity(capacity),
            capacity,
            total: 0,
        }
    }

    /// Counts a sampled read of `key` that stands for `weight` reads; `store` when it reached
    /// Redis. Returns the key's counter.
    pub fn offer(&mut self, key: &str, store: bool, weight: u64) -> &mut Counter {
        self.total += weight;
        let store = if store { weight } else { 0 };
        if let Some(&at) = self.index.get(key) {
            let counter = &mut self.counters[at];
            counter.asked += weight;
            counter.store += store;
            return counter;
        }
        if self.counters.len() < self.capacity {
            let at = self.counters.len();
            self.index.insert(key.into(), at);
            self.counters.push(Counter {
                key: key.into(),
                asked: weight,
                store,
                error: 0,
                found_hot: false,
            });
            return &mut self.counters[at];
        }
        // Replace the smallest counter. A linear scan: tables are small (hundreds) and only
        // sampled reads reach here.
        let (at, smallest) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, counter)| counter.asked)
            .map(|(at, counter)| (at, counter.asked))
            .unwrap_or((0, 0));
        let old = std::mem::replace(
            &mut self.counters[at],
            Counter {
                key: key.into(),
                asked: smallest + weight,
                store,
                error: smallest,
                found_hot: false,
            },
        );
        self.index.remove(&old.key);
        self.index.insert(key.into(), at);
        &mut self.counters[at]
    }

    /// Reads offered since the table was made, weighted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The counters, most asked first.
    pub fn into_ranked(self) -> Vec<Counter> {
        let mut counters = self.counters;
        counters.sort_by(|a, b| b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key)));
        counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heavy_hitter_always_holds_a_counter_and_is_never_under_counted() {
        // 16 counters: a key with more than a sixteenth of the reads always holds one.
        let mut table = TopK::new(16);
        // 1,000 reads of "hot" spread among 9,000 reads of 3,000 other keys.
        for i in 0..10_000u64 {
            if i % 10 == 0 {
                table.offer("hot", i % 20 == 0, 1);
            } else {
                table.offer(&format!("cold:{}", i % 3000), false, 1);
            }
        }
        assert_eq!(table.total(), 10_000);
        let ranked = table.into_ranked();
        let hot = ranked.iter().find(|c| &*c.key == "hot").expect("hot kept");
        assert!(hot.asked >= 1000, "never under-states: {hot:?}");
        assert!(
            hot.asked - hot.error <= 1000,
            "the error bounds the over-statement"
        );
        assert_eq!(hot.store, 500);
        assert_eq!(&*ranked[0].key, "hot");
    }

    #[test]
    fn counts_are_exact_while_every_key_has_a_counter() {
        let mut table = TopK::new(4);
        for (key, times) in [("a", 5), ("b", 3), ("c", 1)] {
            for _ in 0..times {
                table.offer(key, true, 1);
            }
        }
        let ranked = table.into_ranked();
        let counts: Vec<(&str, u64, u64)> =
            ranked.iter().map(|c| (&*c.key, c.asked, c.error)).collect();
        assert_eq!(counts, vec![("a", 5, 0), ("b", 3, 0), ("c", 1, 0)]);
    }

    #[test]
    fn a_weighted_read_counts_as_the_reads_it_stands_for() {
        let mut table = TopK::new(2);
        table.offer("a", true, 4);
        table.offer("a", false, 4);
        table.offer("b", false, 2);
        // "c" replaces the smallest ("b", 2) and inherits its count as its error.
        let c = table.offer("c", true, 3);
        assert_eq!((c.asked, c.store, c.error, c.guaranteed()), (5, 3, 2, 3));
        assert_eq!(table.total(), 13);
        let ranked = table.into_ranked();
        assert_eq!(
            (&*ranked[0].key, ranked[0].asked, ranked[0].store),
            ("a", 8, 4)
        );
    }
}
