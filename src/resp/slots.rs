//! The open connections of the Redis-protocol listener under `resp.max_connections`
//! ([`Connections`], one [`Slot`] per connection, released when it drops) and how the listener
//! tells a connection something ([`Signal`]: shut down, re-check its token, make room). Used by
//! the listener and by each connection; it uses neither.
//!
//! With tokens configured, connections that have not authenticated are counted apart: when a
//! new connection would pass `resp.max_connections`, or `resp.max_unauthenticated` while it is
//! itself unauthenticated, the oldest unauthenticated connection is told to close
//! ([`Signal::evict`]) and the new one takes its place; authenticated connections are never
//! evicted. An evicted connection closes at once, and is not counted against either bound
//! meanwhile (at most `resp.max_connections` of them are closing at any time).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::metrics::RespMetrics;

/// How the listener tells one connection something: set a flag, then wake it.
#[derive(Debug, Default)]
pub(super) struct Signal {
    /// Wakes the connection's task (a permit is kept if it is not waiting).
    notify: Notify,
    /// The listener shuts down.
    pub(super) shut_down: AtomicBool,
    /// The token table changed: check the connection's token before its next command.
    pub(super) recheck: AtomicBool,
    /// The connection was evicted to make room: close it.
    pub(super) evict: AtomicBool,
}

impl Signal {
    /// Resolves when the listener has told the connection something.
    pub(super) async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Whether the listener shuts down.
    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Whether the connection was evicted to make room for a new one.
    pub(super) fn is_evicted(&self) -> bool {
        self.evict.load(Ordering::Acquire)
    }

    /// Whether the token table changed since the last call.
    pub(super) fn take_recheck(&self) -> bool {
        self.recheck.load(Ordering::Relaxed) && self.recheck.swap(false, Ordering::AcqRel)
    }

    /// Sets `flag` and wakes the connection.
    fn raise(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// The open connections and the bound.
#[derive(Debug)]
pub(super) struct Connections {
    /// `resp.max_connections`.
    pub(super) bound: usize,
    /// `resp.max_unauthenticated`.
    unauthenticated_bound: usize,
    /// Each open connection's signal, by slot index.
    table: Mutex<Table>,
    /// The open-connection gauge.
    metrics: RespMetrics,
}

/// One open connection in the table.
#[derive(Debug)]
struct Entry {
    /// How to tell it something.
    signal: Arc<Signal>,
    /// When it was admitted, as an admission count (the oldest is evicted first).
    admitted: u64,
    /// Whether it has authenticated (or needs not).
    authenticated: bool,
    /// Whether it was told to close to make room.
    evicted: bool,
}

/// The connections by slot index.
#[derive(Debug, Default)]
struct Table {
    /// Each slot's connection; `None` when free.
    entries: Vec<Option<Entry>>,
    /// Free slot indexes.
    free: Vec<usize>,
    /// Slots held.
    live: usize,
    /// Slots held by connections that have not authenticated (evicted ones included).
    unauthenticated: usize,
    /// Slots held by evicted connections not yet closed.
    evicted: usize,
    /// Admissions so far.
    admitted: u64,
}

impl Table {
    /// Tells the oldest unauthenticated connection not yet evicted to close; false when there
    /// is none (or too many are closing already).
    fn evict_oldest_unauthenticated(&mut self, bound: usize) -> bool {
        if self.evicted >= bound {
            return false;
        }
        let oldest = self
            .entries
            .iter_mut()
            .flatten()
            .filter(|entry| !entry.authenticated && !entry.evicted)
            .min_by_key(|entry| entry.admitted);
        let Some(oldest) = oldest else {
            return false;
        };
        oldest.evicted = true;
        oldest.signal.raise(&oldest.signal.evict);
        self.evicted += 1;
        true
    }
}

impl Connections {
    /// Room for `bound` connections, at most `unauthenticated_bound` of them not
    /// authenticated, counted in `metrics`' gauge.
    pub(super) fn new(
        bound: usize,
        unauthenticated_bound: usize,
        metrics: RespMetrics,
    ) -> Arc<Connections> {
        Arc::new(Connections {
            bound,
            unauthenticated_bound,
            table: Mutex::new(Table::default()),
            metrics,
        })
    }

    /// A slot for a new connection (`authenticated` false when it must still authenticate),
    /// evicting the oldest unauthenticated connection when a bound is reached; `None` when
    /// there is no room and none to evict.
    pub(super) fn admit(
        self: &Arc<Self>,
        signal: Arc<Signal>,
        authenticated: bool,
    ) -> Option<Slot> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let over_total = table.live - table.evicted >= self.bound;
        let over_unauthenticated =
            !authenticated && table.unauthenticated - table.evicted >= self.unauthenticated_bound;
        if over_total || over_unauthenticated {
            if !table.evict_oldest_unauthenticated(self.bound) {
                return None;
            }
            self.metrics.evicted();
        }
        table.admitted += 1;
        let entry = Entry {
            signal,
            admitted: table.admitted,
            authenticated,
            evicted: false,
        };
        let index = match table.free.pop() {
            Some(index) => {
                table.entries[index] = Some(entry);
                index
            }
            None => {
                table.entries.push(Some(entry));
                table.entries.len() - 1
            }
        };
        table.live += 1;
        if !authenticated {
            table.unauthenticated += 1;
        }
        self.metrics.open().inc();
        Some(Slot {
            connections: self.clone(),
            index,
        })
    }

    /// Raises the flag `pick` chooses on every open connection.
    pub(super) fn tell_all(&self, pick: impl Fn(&Signal) -> &AtomicBool) {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in table.entries.iter().flatten() {
            entry.signal.raise(pick(&entry.signal));
        }
    }
}

/// A connection's place under the bound; released when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    /// The table to release it in.
    connections: Arc<Connections>,
    /// Its index.
    index: usize,
}

impl Slot {
    /// Records whether its connection has authenticated (or needs not): only unauthenticated
    /// connections are evicted, and counted against `resp.max_unauthenticated`.
    pub(super) fn set_authenticated(&self, authenticated: bool) {
        let mut table = self
            .connections
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(Some(entry)) = table.entries.get_mut(self.index) else {
            return;
        };
        if entry.authenticated == authenticated {
            return;
        }
        entry.authenticated = authenticated;
        if authenticated {
            table.unauthenticated -= 1;
        } else {
            table.unauthenticated += 1;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self
            .connections
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = table.entries[self.index].take() {
            if !entry.authenticated {
                table.unauthenticated -= 1;
            }
            if entry.evicted {
                table.evicted -= 1;
            }
        }
        table.free.push(self.index);
        table.live -= 1;
        self.connections.metrics.open().dec();
    }
}
