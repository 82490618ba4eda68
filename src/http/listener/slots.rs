//! The connection bound of a listener, and what happens at it.
//!
//! Every open connection holds a [`Slot`] in its listener's [`Slots`]. A connection that
//! arrives when all are taken first tries to *evict* an idle one (no request in progress):
//! idle connections cost a file descriptor and nothing else, so a flood of them must not lock
//! out a client with a request to send (nginx reuses keep-alive connections the same way).
//! The victim is the longest idle of a small sample ([`SAMPLE`] connections from a rotating
//! cursor, as Redis samples keys for LRU eviction), so finding one costs the same at 100 open
//! connections as at 100,000, and a fresh connection whose request is on its way is the least
//! likely to go. Only when every sampled connection is busy is the newcomer refused.
//!
//! An evicted connection is told through its [`Activity`] and closes at once; until its task
//! has ended the listener holds one connection over its bound (the file descriptors kept in
//! reserve cover that).

use std::sync::{Arc, Mutex, PoisonError};

use super::activity::Activity;

/// How many connections are looked at to choose a victim.
const SAMPLE: usize = 16;

/// How many slab entries a victim search visits at most (empty entries included), so a
/// sparse slab does not make one search long.
const MAX_VISITS: usize = 4 * SAMPLE;

/// The open connections of one listener and its bound.
#[derive(Debug)]
pub(super) struct Slots {
    /// The most connections held, evicted ones not counted.
    bound: usize,
    /// The table, locked for a registration, a release or a victim search.
    table: Mutex<Table>,
}

/// The connections, by slot index.
#[derive(Debug, Default)]
struct Table {
    /// Each slot's connection; `None` when free.
    entries: Vec<Option<Arc<Activity>>>,
    /// Free slot indexes.
    free: Vec<usize>,
    /// Connections held and not evicted.
    live: usize,
    /// Where the next victim search starts.
    cursor: usize,
}

/// What [`Slots::admit`] decided for a new connection.
pub(super) enum Admission {
    /// Serve it; it holds this slot.
    Admitted(Slot),
    /// Serve it; an idle connection was told to close to make room.
    Evicted(Slot),
    /// Every sampled connection is busy: refuse it.
    Refused,
}

impl Slots {
    /// Room for `bound` connections.
    pub(super) fn new(bound: usize) -> Arc<Slots> {
        Arc::new(Slots {
            bound,
            table: Mutex::new(Table::default()),
        })
    }

    /// Admits the connection whose activity is `activity`, evicting an idle one if the bound is
    /// reached.
    pub(super) fn admit(self: &Arc<Self>, activity: Arc<Activity>) -> Admission {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let evicted = if table.live >= self.bound {
            match table.evict_one() {
                Some(victim) => {
                    victim.evict();
                    true
                }
                None => return Admission::Refused,
            }
        } else {
            false
        };
        let index = match table.free.pop() {
            Some(index) => {
                table.entries[index] = Some(activity.clone());
                index
            }
            None => {
                table.entries.push(Some(activity.clone()));
                table.entries.len() - 1
            }
        };
        table.live += 1;
        let slot = Slot {
            slots: self.clone(),
            index,
            activity,
        };
        if evicted {
            Admission::Evicted(slot)
        } else {
            Admission::Admitted(slot)
        }
    }
}

impl Slots {
    /// Tells every connection held that the listener shuts down.
    pub(super) fn shut_down_all(&self) {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for activity in table.entries.iter().flatten() {
            activity.shut_down();
        }
    }
}

impl Table {
    /// Marks the longest idle of a sample of connections evicted and returns it; `None` when
    /// every sampled connection has a request in progress.
    fn evict_one(&mut self) -> Option<Arc<Activity>> {
        let len = self.entries.len();
        if len == 0 {
            return None;
        }
        let mut best: Option<(usize, tokio::time::Instant)> = None;
        let mut seen = 0;
        for visit in 0..MAX_VISITS.min(len) {
            let index = (self.cursor + visit) % len;
            let Some(activity) = &self.entries[index] else {
                continue;
            };
            if let Some(idle_since) = activity.evictable_since() {
                if best.is_none_or(|(_, held)| idle_since < held) {
                    best = Some((index, idle_since));
                }
            }
            seen += 1;
            if seen == SAMPLE {
                self.cursor = (index + 1) % len;
                break;
            }
        }
        if seen < SAMPLE {
            self.cursor = (self.cursor + MAX_VISITS.min(len)) % len;
        }
        let (index, _) = best?;
        let victim = self.entries[index].clone()?;
        if !victim.mark_evicted() {
            return None;
        }
        self.live -= 1;
        Some(victim)
    }
}

/// A connection's place in its listener's [`Slots`]; released when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    /// The table to release it in.
    slots: Arc<Slots>,
    /// Its index.
    index: usize,
    /// Its connection's activity (to tell whether it was evicted).
    activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self
            .slots
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        table.entries[self.index] = None;
        table.free.push(self.index);
        if !self.activity.was_evicted() {
            table.live -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_listener_evicts_its_longest_idle_connection_and_refuses_when_all_are_busy() {
        let slots = Slots::new(2);
        let old = Arc::new(Activity::new());
        let young = Arc::new(Activity::new());
        let Admission::Admitted(_old_slot) = slots.admit(old.clone()) else {
            panic!("room for the first")
        };
        let Admission::Admitted(young_slot) = slots.admit(young.clone()) else {
            panic!("room for the second")
        };
        young.request_started();
        young.request_ended_at(young.opened() + std::time::Duration::from_secs(5));
        let third = Arc::new(Activity::new());
        let Admission::Evicted(third_slot) = slots.admit(third.clone()) else {
            panic!("the third evicts")
        };
        assert!(old.was_evicted(), "the longest idle goes");
        assert!(!young.was_evicted());
        // The young one and the third are busy: a fourth finds no victim.
        young.request_started();
        third.request_started();
        assert!(matches!(
            slots.admit(Arc::new(Activity::new())),
            Admission::Refused
        ));
        // A closed connection frees its slot.
        drop(young_slot);
        assert!(matches!(
            slots.admit(Arc::new(Activity::new())),
            Admission::Admitted(_)
        ));
        drop(third_slot);
    }
}
