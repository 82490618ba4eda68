//! Retiring other releases' function libraries once no instance runs them.
//!
//! Each release loads a library of its own version (`hotsplit_v2` …, `store::library`), so after
//! a rolling upgrade the previous release's library stays on every primary until something
//! deletes it. [`LibraryRetirer`], a background task of every instance on Redis, does: every
//! `fleet.retire_interval` it lists the hotsplit libraries on the primaries and the registered
//! instances, and deletes (`FUNCTION DELETE` on every primary) a library when
//! - its version is older than this instance's (a newer release's library is never touched, so
//!   a rollback cannot delete the library of the release being rolled out),
//! - no registered instance reports it as its `library`,
//! - and that has been so on every check for at least the registry's entry lifetime
//!   (`fleet.heartbeat_interval` × 3): an instance whose refresh failed for a while, or one
//!   between loading its library and registering, has had the time to appear.
//!
//! A check is skipped (and every waiting library starts waiting again) when the registry cannot
//! be read or does not list this instance itself: an empty or partial registry proves nothing.
//!
//! **What if an instance runs an old library without registering** (a release before the
//! registry, or one whose registry writes keep failing)? Deleting its library costs it one
//! `ERR Function not found` per primary: every release reloads its own library on that node and
//! retries the write once, and a copy that still fails is queued and healed. So the deletion is
//! never a lost write. And the retirer notices: a library it deleted that comes back with no
//! registered instance reporting it is *kept* from then on (a WARN, and
//! `hotsplit_function_libraries_reappeared_total`), so it does not fight that instance.
//! Several instances retire at once harmlessly: a library already gone is skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry as MetricsRegistry;
use tokio_util::sync::CancellationToken;

use super::registry::Registry;
use crate::store::library::LibraryVersion;
use crate::store::{InstanceRecord, LibraryStore};

/// The retirer's counters.
#[derive(Debug, Clone, Default)]
pub struct RetireMetrics {
    /// Checks that read both the libraries and the registry.
    checks: Counter,
    /// Libraries deleted (each library once, however many primaries held it).
    deleted: Counter,
    /// Deleted libraries that came back with no registered instance reporting them.
    reappeared: Counter,
}

impl RetireMetrics {
    /// Registers the counters in `registry`.
    pub fn register(registry: &mut MetricsRegistry) -> RetireMetrics {
        let metrics = RetireMetrics::default();
        registry.register(
            "function_library_checks",
            "Checks of the function libraries on the primaries against the instance registry",
            metrics.checks.clone(),
        );
        registry.register(
            "function_libraries_deleted",
            "Function libraries of older releases deleted because no registered instance runs them",
            metrics.deleted.clone(),
        );
        registry.register(
            "function_libraries_reappeared",
            "Deleted function libraries that were loaded again with no registered instance reporting them (kept from then on)",
            metrics.reappeared.clone(),
        );
        metrics
    }
}

/// What the retirer remembers between checks: a pure state machine, fed the libraries held and
/// the registered instances, that says which libraries to delete now.
#[derive(Debug)]
struct Retirement {
    /// This instance's library version; only older ones are deleted.
    own: LibraryVersion,
    /// How long a library must have been seen unused before it is deleted.
    grace: Duration,
    /// Library → since when every check found no registered instance running it.
    unused_since: BTreeMap<String, Instant>,
    /// Libraries this process deleted.
    deleted: BTreeSet<String>,
    /// Libraries that came back after this process deleted them, with no registered instance
    /// running them: never deleted again by this process.
    kept: BTreeSet<String>,
}

/// What one check decided.
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// The libraries to delete now.
    delete: Vec<String>,
    /// Libraries that came back unregistered at this check.
    reappeared: Vec<String>,
}

impl Retirement {
    fn new(own: LibraryVersion, grace: Duration) -> Retirement {
        Retirement {
            own,
            grace,
            unused_since: BTreeMap::new(),
            deleted: BTreeSet::new(),
            kept: BTreeSet::new(),
        }
    }

    /// One check at `now`: `held` are the hotsplit libraries on the primaries, `registered` the
    /// instances the registry lists (`None`: it could not be read, or does not list this
    /// instance, `own_id`).
    fn check(
        &mut self,
        now: Instant,
        held: &[String],
        registered: Option<&[InstanceRecord]>,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        let Some(registered) = registered else {
            // Nothing is known to be unused: every waiting library starts waiting again.
            self.unused_since.clear();
            return verdict;
        };
        let in_use: BTreeSet<&str> = registered
            .iter()
            .filter_map(|record| record.library.as_deref())
            .collect();
        self.unused_since.retain(|name, _| held.contains(name));
        for name in held {
            let older = LibraryVersion::of(name).is_some_and(|version| version < self.own);
            if !older || self.kept.contains(name) {
                continue;
            }
            let used = in_use.contains(name.as_str());
            if self.deleted.remove(name) && !used {
                // Loaded again since this process deleted it, by an instance the registry does
                // not list: leave it to that instance.
                self.kept.insert(name.clone());
                self.unused_since.remove(name);
                verdict.reappeared.push(name.clone());
                continue;
            }
            if used {
                self.unused_since.remove(name);
                continue;
            }
            let since = *self.unused_since.entry(name.clone()).or_insert(now);
            if now.duration_since(since) >= self.grace {
                verdict.delete.push(name.clone());
            }
        }
        verdict
    }

    /// Records that `name` was deleted.
    fn deleted(&mut self, name: &str) {
        self.unused_since.remove(name);
        self.deleted.insert(name.to_owned());
    }
}

/// Deletes older releases' function libraries once no registered instance runs them (see the
/// module documentation for the rule).
pub struct LibraryRetirer {
    /// Where the libraries and the registry live.
    pub store: Arc<dyn LibraryStore>,
    /// This instance's registry: its id, and the list of registered instances.
    pub registry: Arc<Registry>,
    /// How often to check (`fleet.retire_interval`).
    pub interval: Duration,
    /// How long a library must be seen unused before it is deleted: the registry's entry
    /// lifetime.
    pub grace: Duration,
    /// The counters.
    pub metrics: RetireMetrics,
}

impl LibraryRetirer {
    /// Checks every interval until `shutdown`. Does nothing on a store without a function
    /// library (the embedded store).
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(own) = self.store.library_name().and_then(LibraryVersion::of) else {
            return;
        };
        let mut retirement = Retirement::new(own, self.grace);
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => self.check(&mut retirement).await,
            }
        }
    }

    /// One check: read, decide, delete.
    async fn check(&self, retirement: &mut Retirement) {
        let held = match self.store.function_libraries().await {
            Ok(held) => held.into_iter().map(|(name, _)| name).collect::<Vec<_>>(),
            Err(err) => {
                tracing::debug!(error = %err, "cannot list the function libraries; retried at the next check");
                return;
            }
        };
        let own_id = self.registry.id();
        let registered = match self.registry.view().await {
            Ok(view) if view.instances.iter().any(|record| record.id == own_id) => {
                Some(view.instances)
            }
            Ok(_) => None,
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the instance registry; no library is retired meanwhile");
                None
            }
        };
        self.metrics.checks.inc();
        let verdict = retirement.check(Instant::now(), &held, registered.as_deref());
        for name in verdict.reappeared {
            self.metrics.reappeared.inc();
            tracing::warn!(library = %name, "a function library this instance deleted was loaded again, and no registered instance runs it: an instance that does not register (an older release, or one whose registry writes fail) uses it; it is kept");
        }
        for name in verdict.delete {
            match self.store.delete_function_library(&name).await {
                Ok(primaries) => {
                    retirement.deleted(&name);
                    self.metrics.deleted.inc();
                    tracing::info!(library = %name, primaries, "deleted an older release's function library: no registered instance runs it");
                }
                Err(err) => {
                    tracing::warn!(library = %name, error = %err, "could not delete an older release's function library; retried at the next check")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, library: Option<&str>) -> InstanceRecord {
        InstanceRecord {
            id: id.to_owned(),
            listen: "127.0.0.1:1".to_owned(),
            admin: None,
            release: "0.1.0".to_owned(),
            library: library.map(str::to_owned),
            started_ms: 1,
            heartbeat_ms: 1,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    const GRACE: Duration = Duration::from_secs(6);

    #[test]
    fn an_older_library_is_deleted_only_after_a_grace_with_no_registered_user() {
        let mut retirement = Retirement::new(LibraryVersion(3), GRACE);
        let start = Instant::now();
        let held = names(&["hotsplit", "hotsplit_v2", "hotsplit_v3", "hotsplit_v4"]);
        let old = instance("old", Some("hotsplit_v2"));
        let me = instance("me", Some("hotsplit_v3"));
        let newer = instance("new", Some("hotsplit_v4"));
        let all = [old.clone(), me.clone(), newer.clone()];
        // v2 is in use; version 1 is unused but waits out the grace; v3 is ours, v4 newer.
        assert_eq!(
            retirement.check(start, &held, Some(&all)),
            Verdict::default()
        );
        assert_eq!(
            retirement.check(start + GRACE, &held, Some(&all)).delete,
            names(&["hotsplit"])
        );
        retirement.deleted("hotsplit");
        // The v2 instance leaves: v2 waits its own grace from the first check that missed it.
        let without_old = [me.clone(), newer.clone()];
        let held = names(&["hotsplit_v2", "hotsplit_v3", "hotsplit_v4"]);
        let left = start + GRACE * 2;
        assert!(retirement
            .check(left, &held, Some(&without_old))
            .delete
            .is_empty());
        assert!(retirement
            .check(left + GRACE / 2, &held, Some(&without_old))
            .delete
            .is_empty());
        assert_eq!(
            retirement
                .check(left + GRACE, &held, Some(&without_old))
                .delete,
            names(&["hotsplit_v2"])
        );
        // A newer release's library is never deleted, even unused.
        assert!(retirement
            .check(left + GRACE * 10, &names(&["hotsplit_v4"]), Some(&[me]))
            .delete
            .is_empty());
    }

    #[test]
    fn an_unreadable_registry_or_one_without_this_instance_resets_the_wait() {
        let mut retirement = Retirement::new(LibraryVersion(2), GRACE);
        let start = Instant::now();
        let held = names(&["hotsplit", "hotsplit_v2"]);
        let me = [instance("me", Some("hotsplit_v2"))];
        assert!(retirement.check(start, &held, Some(&me)).delete.is_empty());
        // A check that cannot trust the registry starts the wait again.
        assert!(retirement
            .check(start + GRACE, &held, None)
            .delete
            .is_empty());
        assert!(retirement
            .check(start + GRACE + GRACE / 2, &held, Some(&me))
            .delete
            .is_empty());
        assert_eq!(
            retirement.check(start + GRACE * 3, &held, Some(&me)).delete,
            names(&["hotsplit"])
        );
    }

    #[test]
    fn a_deleted_library_that_comes_back_unregistered_is_kept() {
        let mut retirement = Retirement::new(LibraryVersion(2), Duration::ZERO);
        let start = Instant::now();
        let me = [instance("me", Some("hotsplit_v2"))];
        let held = names(&["hotsplit", "hotsplit_v2"]);
        assert_eq!(
            retirement.check(start, &held, Some(&me)).delete,
            names(&["hotsplit"])
        );
        retirement.deleted("hotsplit");
        // An unregistered instance reloaded it after its write met `Function not found`.
        let verdict = retirement.check(start, &held, Some(&me));
        assert_eq!(verdict.reappeared, names(&["hotsplit"]));
        assert!(verdict.delete.is_empty());
        assert_eq!(
            retirement.check(start + GRACE, &held, Some(&me)),
            Verdict::default()
        );
    }

    #[test]
    fn a_deleted_library_brought_back_by_a_registered_instance_is_retired_again() {
        let mut retirement = Retirement::new(LibraryVersion(2), Duration::ZERO);
        let start = Instant::now();
        let held = names(&["hotsplit", "hotsplit_v2"]);
        let me = instance("me", Some("hotsplit_v2"));
        retirement.deleted("hotsplit");
        // A rollback: an old instance registers and loads its library again.
        let with_old = [me.clone(), instance("old", Some("hotsplit"))];
        assert_eq!(
            retirement.check(start, &held, Some(&with_old)),
            Verdict::default()
        );
        // It leaves again: its library is deleted again.
        assert_eq!(
            retirement.check(start, &held, Some(&[me])).delete,
            names(&["hotsplit"])
        );
    }
}
