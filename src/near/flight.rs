//! Single-flight fills: concurrent misses on one copy from one source share one Redis read.
//!
//! The first miss starts the fill as a task on the service's [`TaskTracker`], so it completes
//! (and fills the cache) even when the request that started it is cancelled; every later miss
//! of the same copy and source awaits the same task. A fill offers what it read to the cache
//! and then removes itself from the table (under the table's lock), so the next miss after it
//! starts a new one — unless the fill's entry is there: a miss asks the cache again under that
//! lock before it starts a fill, so a miss whose lookup ran before a fill ended and whose join
//! came after it is answered by the fill's entry, not by a second Redis read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio_util::task::TaskTracker;

use crate::route::RouteReason;
use crate::store::{CopyRead, NodeLabel};

/// What a fill read, shared by every read that waited for it.
#[derive(Debug)]
pub struct Filled {
    /// The copy read, from the node that answered.
    pub read: CopyRead,
    /// Why that node served.
    pub reason: RouteReason,
}

/// A fill in flight: awaiting it gives its result, `None` when its task panicked.
pub type Filling = Shared<BoxFuture<'static, Option<Arc<Filled>>>>;

/// The fills in flight, by copy key and source node.
type Table = HashMap<(String, NodeLabel), (u64, Filling)>;

/// The table of fills in flight, and where they run.
#[derive(Debug, Clone)]
pub(crate) struct Flights {
    /// (copy key, source) → (fill id, the fill). A std mutex: held for one map operation, never
    /// across an await.
    table: Arc<Mutex<Table>>,
    /// Where fills run, so they outlive the request that started them and shutdown drains them.
    tracker: TaskTracker,
}

/// What a miss found in the table of fills.
pub enum Flight<L> {
    /// A fill in flight, joined.
    Joined(Filling),
    /// No fill in flight and nothing landed: a new fill, started.
    Started(Filling),
    /// No fill in flight, and the cache holds what one brought: no fill started.
    Landed(L),
}

impl Flights {
    /// No fills yet; they will run on `tracker`.
    pub(crate) fn new(tracker: TaskTracker) -> Flights {
        Flights {
            table: Arc::default(),
            tracker,
        }
    }

    /// The fill of `copy_key` from `source` in flight, or what `landed` finds in the cache when
    /// none is, or else a new fill made by `start` and spawned on the tracker. `landed` is asked
    /// under the table's lock, which a fill takes to leave the table after it offered its read.
    pub(crate) fn join_or_start<L>(
        &self,
        copy_key: &str,
        source: &NodeLabel,
        landed: impl FnOnce() -> Option<L>,
        start: impl FnOnce() -> BoxFuture<'static, Filled>,
    ) -> Flight<L> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (copy_key.to_owned(), source.clone());
        if let Some((_, filling)) = table.get(&key) {
            return Flight::Joined(filling.clone());
        }
        if let Some(found) = landed() {
            return Flight::Landed(found);
        }
        let id = rand::random::<u64>();
        let flights = self.table.clone();
        let done_key = key.clone();
        let fill = start();
        let handle = self.tracker.spawn(async move {
            let filled = Arc::new(fill.await);
            let mut table = flights.lock().unwrap_or_else(PoisonError::into_inner);
            if table.get(&done_key).is_some_and(|(held, _)| *held == id) {
                table.remove(&done_key);
            }
            filled
        });
        let filling = handle.map(Result::ok).boxed().shared();
        table.insert(key, (id, filling.clone()));
        Flight::Started(filling)
    }

    /// Whether a fill of `copy_key` from `source` is in flight.
    pub(crate) fn in_flight(&self, copy_key: &str, source: &NodeLabel) -> bool {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&(copy_key.to_owned(), source.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::store::ServedBy;

    #[tokio::test]
    async fn concurrent_misses_share_one_fill_that_outlives_its_starter() {
        let tracker = TaskTracker::new();
        let flights = Flights::new(tracker.clone());
        let started = Arc::new(AtomicUsize::new(0));
        let source = NodeLabel::new("p:1");
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let make = |started: Arc<AtomicUsize>, wait: tokio::sync::oneshot::Receiver<()>| {
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                async move {
                    let _ = wait.await;
                    Filled {
                        read: CopyRead {
                            served_by: ServedBy::embedded(),
                            record: Ok(None),
                        },
                        reason: RouteReason::Class,
                    }
                }
                .boxed()
            }
        };
        let none = || None::<()>;
        let Flight::Started(first) =
            flights.join_or_start("k#0", &source, none, make(started.clone(), wait))
        else {
            panic!("the first miss starts the fill");
        };
        let (_, unused) = tokio::sync::oneshot::channel::<()>();
        let landed = || -> Option<()> { panic!("asked with a fill in flight") };
        let Flight::Joined(second) =
            flights.join_or_start("k#0", &source, landed, make(started.clone(), unused))
        else {
            panic!("the second miss joins it");
        };
        // The starter goes away; the fill still completes for the one who waits.
        drop(first);
        assert!(flights.in_flight("k#0", &source));
        let _ = release.send(());
        let filled = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap();
        assert!(filled.is_some());
        assert_eq!(started.load(Ordering::SeqCst), 1);
        tracker.close();
        tracker.wait().await;
        assert!(!flights.in_flight("k#0", &source), "a done fill leaves");
    }
}
