//! The open connections of the Redis-protocol listener under `resp.max_connections`
//! ([`Connections`], one [`Slot`] per connection, released when it drops) and how the listener
//! tells a connection something ([`Signal`]: shut down, re-check its token). Used by the
//! listener and by each connection; it uses neither.

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
    /// Each open connection's signal, by slot index.
    table: Mutex<Table>,
    /// The open-connection gauge.
    metrics: RespMetrics,
}

/// The connections by slot index.
#[derive(Debug, Default)]
struct Table {
    /// Each slot's connection; `None` when free.
    entries: Vec<Option<Arc<Signal>>>,
    /// Free slot indexes.
    free: Vec<usize>,
    /// Slots held.
    live: usize,
}

impl Connections {
    /// Room for `bound` connections, counted in `metrics`' gauge.
    pub(super) fn new(bound: usize, metrics: RespMetrics) -> Arc<Connections> {
        Arc::new(Connections {
            bound,
            table: Mutex::new(Table::default()),
            metrics,
        })
    }

    /// A slot for a new connection, or `None` at the bound.
    pub(super) fn admit(self: &Arc<Self>, signal: Arc<Signal>) -> Option<Slot> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if table.live >= self.bound {
            return None;
        }
        let index = match table.free.pop() {
            Some(index) => {
                table.entries[index] = Some(signal);
                index
            }
            None => {
                table.entries.push(Some(signal));
                table.entries.len() - 1
            }
        };
        table.live += 1;
        self.metrics.open().inc();
        Some(Slot {
            connections: self.clone(),
            index,
        })
    }

    /// Raises the flag `pick` chooses on every open connection.
    pub(super) fn tell_all(&self, pick: impl Fn(&Signal) -> &AtomicBool) {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in table.entries.iter().flatten() {
            signal.raise(pick(signal));
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

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self
            .connections
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        table.entries[self.index] = None;
        table.free.push(self.index);
        table.live -= 1;
        self.connections.metrics.open().dec();
    }
}
