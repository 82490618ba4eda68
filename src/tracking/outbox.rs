//! One connection's pushes not yet written: the invalidations the tracking table sent it, kept
//! until its loop writes them between two replies.
//!
//! An outbox never drops a key while its connection goes on: when its pending pushes pass
//! their bound (`resp.tracking_max_push_bytes`) it is marked overflowed, and the connection
//! closes (its client then flushes its cache, as every client does on a disconnect) rather
//! than skip one; the keys after that are not kept, and no reply is written after them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// What a push costs beyond its key's bytes (`>2`, `$10 invalidate`, `*1`, a bulk header).
const PUSH_OVERHEAD: usize = 40;

/// The invalidations one connection has to write.
#[derive(Debug, Default)]
pub struct Outbox {
    /// The pushes, and whether the connection must close.
    pending: Mutex<Pending>,
    /// Set while `pending` holds something to write or a reason to close: the loop's check
    /// between replies is one load when there is nothing.
    ready: AtomicBool,
    /// Wakes the connection's loop while it waits for input.
    notify: Notify,
    /// How many pushes its connection wrote to its socket (`u64::MAX` once it closed).
    written: AtomicU64,
    /// Wakes those waiting for `written` ([`Outbox::written`]).
    wrote: Notify,
    /// A wait for its writes timed out and it has not caught up since: changes do not wait
    /// for it (one client that stops reading must not slow every publish).
    stalled: AtomicBool,
}

/// The pushes of an outbox.
#[derive(Debug, Default)]
struct Pending {
    /// Keys to invalidate, in the order they were invalidated.
    keys: Vec<Arc<str>>,
    /// The bytes `keys` takes as pushes.
    bytes: usize,
    /// Why the connection must close, when it must.
    close: Option<Close>,
    /// How many pushes were ever added.
    pushed: u64,
    /// `pushed` when the connection last drained them.
    drained: u64,
}

/// Why an outbox's connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Its pending pushes passed `resp.tracking_max_push_bytes`: it did not read them.
    Overflow,
    /// The connection its invalidations are redirected to (`REDIRECT id`) closed.
    RedirectGone,
}

/// What a connection's loop takes out of its outbox to write.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// The keys, one push each.
    pub keys: Vec<Arc<str>>,
    /// Set when the connection must close after writing them.
    pub close: Option<Close>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Arc<Outbox> {
        Arc::new(Outbox::default())
    }

    /// The pending pushes, locked; a panic elsewhere never stops pushes.
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether something waits to be written (one atomic load).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Adds an invalidation of `key`; false when that passed `max_bytes` and so marked the
    /// outbox to close (once: a push after that is not kept, nor one more overflow).
    pub(super) fn push(&self, key: Arc<str>, max_bytes: usize) -> bool {
        let mut pending = self.lock();
        if pending.close.is_some() {
            // The connection closes after what it holds, with no reply after it: its client
            // then drops its whole cache, so the keys after the close need not be kept (and
            // a connection whose write waits on a client that reads nothing holds no more).
            return true;
        }
        pending.bytes = pending.bytes.saturating_add(key.len() + PUSH_OVERHEAD);
        pending.keys.push(key);
        pending.pushed += 1;
        let overflowed = pending.bytes > max_bytes && pending.close.is_none();
        if overflowed {
            pending.close = Some(Close::Overflow);
        }
        drop(pending);
        self.wake();
        !overflowed
    }

    /// Marks the connection to close after what it has to write.
    pub(super) fn close(&self, why: Close) {
        self.lock().close.get_or_insert(why);
        self.wake();
    }

    /// Wakes the connection's loop.
    fn wake(&self) {
        self.ready.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// Takes everything pending.
    pub fn drain(&self) -> Drained {
        let mut pending = self.lock();
        self.ready.store(false, Ordering::Release);
        let drained = Drained {
            keys: std::mem::take(&mut pending.keys),
            close: pending.close,
        };
        pending.bytes = 0;
        pending.drained = pending.pushed;
        drained
    }

    /// How many pushes were ever added: once [`Outbox::written`] reaches it, every push made
    /// so far is on the connection's socket.
    pub fn pushed(&self) -> u64 {
        self.lock().pushed
    }

    /// The connection wrote everything it drained to its socket.
    pub fn wrote(&self) {
        let (drained, pushed) = {
            let pending = self.lock();
            (pending.drained, pending.pushed)
        };
        self.written.fetch_max(drained, Ordering::AcqRel);
        if drained >= pushed {
            self.stalled.store(false, Ordering::Release);
        }
        self.wrote.notify_waiters();
    }

    /// Whether changes skip waiting for it ([`Outbox::stall_unless_written`]).
    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// After a wait for its first `pushed` pushes timed out: marks it stalled unless they
    /// were written meanwhile.
    pub fn stall_unless_written(&self, pushed: u64) {
        if self.written.load(Ordering::Acquire) < pushed {
            self.stalled.store(true, Ordering::Release);
        }
    }

    /// The connection closed: nothing more will be written, nobody waits for it.
    pub fn gone(&self) {
        self.written.store(u64::MAX, Ordering::Release);
        self.wrote.notify_waiters();
    }

    /// Resolves once the connection wrote its first `pushed` pushes (or closed).
    pub async fn written(&self, pushed: u64) {
        loop {
            let wrote = self.wrote.notified();
            if self.written.load(Ordering::Acquire) >= pushed {
                return;
            }
            wrote.await;
        }
    }

    /// Resolves once something is pushed (or already waits).
    pub async fn ready(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_ready() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_keeps_every_key_in_order_and_closes_past_its_bound() {
        let outbox = Outbox::new();
        assert!(!outbox.is_ready());
        assert!(outbox.push(Arc::from("a"), 1000));
        assert!(outbox.push(Arc::from("b"), 1000));
        assert!(outbox.is_ready());
        let drained = outbox.drain();
        assert_eq!(drained.keys, vec![Arc::from("a"), Arc::from("b")]);
        assert_eq!(drained.close, None);
        assert!(!outbox.is_ready());
        // Past the bound: the key is still kept, and the connection told to close, once; the
        // keys after it are not kept (the connection closes with no reply after them).
        assert!(!outbox.push(Arc::from("c".repeat(100)), 50));
        assert!(outbox.push(Arc::from("d".repeat(100)), 50));
        let drained = outbox.drain();
        assert_eq!(drained.keys.len(), 1);
        assert_eq!(drained.close, Some(Close::Overflow));
        assert!(outbox.push(Arc::from("e".repeat(100)), 50));
        assert!(outbox.drain().keys.is_empty());
    }

    #[tokio::test]
    async fn ready_resolves_for_a_push_made_before_or_while_waiting() {
        let outbox = Outbox::new();
        outbox.push(Arc::from("a"), 1000);
        outbox.ready().await;
        outbox.drain();
        let waiter = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.ready().await })
        };
        tokio::task::yield_now().await;
        outbox.close(Close::RedirectGone);
        waiter.await.unwrap();
        assert_eq!(outbox.drain().close, Some(Close::RedirectGone));
    }

    #[tokio::test]
    async fn written_resolves_once_the_pushes_before_it_are_written_or_the_connection_closed() {
        let outbox = Outbox::new();
        outbox.written(0).await;
        outbox.push(Arc::from("a"), 1000);
        let pushed = outbox.pushed();
        assert_eq!(pushed, 1);
        let waiter = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.written(pushed).await })
        };
        tokio::task::yield_now().await;
        // Written before it was drained: not these pushes.
        outbox.wrote();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        outbox.drain();
        outbox.push(Arc::from("b"), 1000);
        outbox.wrote();
        waiter.await.unwrap();
        // "b" was pushed after the drain: waiting for it waits for the next write, or a close.
        let waiter = {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.written(2).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        outbox.gone();
        waiter.await.unwrap();
    }
}
