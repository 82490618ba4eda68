//! When each key last changed, lately: an answer current before a change this instance was
//! already told of (a replica that had not replayed it yet, a near-cache entry filled before
//! it) must not be cached, or the client would keep the value the change replaced for a whole
//! lease. Bounded: past [`MAX_KEYS`] the oldest are forgotten, and every answer current before
//! the moment of the newest one forgotten counts as possibly changed.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The most changes remembered (at most this many names of up to 512 bytes: about 10 MiB).
const MAX_KEYS: usize = 16_384;

/// How long a change is remembered: longer than any answer's age (a replica's lag is bounded
/// by its class's budget; a near-cache entry's by its max age).
const HORIZON: Duration = Duration::from_secs(60);

/// The recent changes.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// Key → when it last changed.
    at: HashMap<Arc<str>, Instant>,
    /// The changes in time order (a key may appear more than once; only its latest counts).
    order: VecDeque<(Instant, Arc<str>)>,
    /// Answers current before this may have missed a change that was forgotten.
    forgotten: Option<Instant>,
}

impl Recent {
    /// `key` changed at `now`.
    pub(super) fn changed(&mut self, key: &str, now: Instant) {
        // A key changed again keeps its one allocation: a hot key changing fast costs an
        // entry in the order, not a copy of its name each time.
        let key: Arc<str> = match self.at.get_key_value(key) {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(key),
        };
        self.at.insert(key.clone(), now);
        self.order.push_back((now, key));
        while self.order.len() > MAX_KEYS
            || self
                .order
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > HORIZON)
        {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.at.get(&key) == Some(&at) {
                self.at.remove(&key);
                if now.duration_since(at) <= HORIZON {
                    self.forgotten = Some(self.forgotten.map_or(at, |before| before.max(at)));
                }
            }
        }
    }

    /// Whether `key` may have changed after `as_of`.
    pub(super) fn changed_after(&self, key: &str, as_of: Instant) -> bool {
        self.at.get(key).is_some_and(|at| *at > as_of)
            || self.forgotten.is_some_and(|at| at > as_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_current_before_a_known_change_is_suspect_and_one_after_it_is_not() {
        let mut recent = Recent::default();
        let start = Instant::now();
        let change = start + Duration::from_millis(10);
        recent.changed("k", change);
        assert!(recent.changed_after("k", start));
        assert!(!recent.changed_after("k", change + Duration::from_millis(1)));
        assert!(!recent.changed_after("other", start));
    }

    #[test]
    fn a_forgotten_change_makes_every_older_answer_suspect() {
        let mut recent = Recent::default();
        let start = Instant::now();
        for n in 0..=MAX_KEYS {
            recent.changed(&format!("k{n}"), start + Duration::from_micros(n as u64));
        }
        // k0 was forgotten: an answer of any key current before its change is suspect.
        assert!(recent.changed_after("never-changed", start - Duration::from_micros(1)));
        assert!(!recent.changed_after("never-changed", start + Duration::from_micros(1)));
        assert!(recent.at.len() <= MAX_KEYS);
    }
}
