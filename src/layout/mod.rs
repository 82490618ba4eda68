//! Where each key's copies are, as the request path sees it: family layouts, per-key split
//! layouts ([`Layouts::splits`]) and the split driver ([`splitter`]), which carries out what
//! [`crate::split::record`]'s state machine decides.
//!
//! Family layouts: each family's copy count is recorded in the store, so instances can tell
//! when their config disagrees; every instance keeps itself in the family's live set, so
//! writers keep writing the copies a larger instance still reads; copies removed by shrinking a
//! family are deleted once no instance reads them.
//!
//! At startup [`Layouts::reconcile`] joins every family's live set, then reads its record. A
//! missing record is written; a record with another copy count is logged (WARN, naming the
//! instance and release that wrote it and whether it still runs) and replaced by this
//! instance's, which is taken to be the new layout being rolled out; the record keeps the
//! largest copy count ever recorded (`max_copies`) and changes only by compare-and-set. The
//! record keeps its `copies:max_copies` format, which every release parses; its writer
//! ([`LayoutWriter`]: instance, release, copies, when) is kept under a key of its own, written
//! after each write of the record. An
//! instance that grows a family past what the live instances write (or past what the last
//! instance recorded, when none is live) waits until every live instance has seen it and every
//! publish that had not finishes, then deletes the copies in the grown range, so it never
//! serves a copy that missed an edit.
//!
//! [`LayoutWatcher`] refreshes this instance's live entries and re-reads the records every
//! `heal.layout_interval`; a record that differs from this instance's config is a *mismatch*
//! (another instance runs another layout; the sweep pauses), and so is another live instance
//! running another copy count (so the instance that wrote the record last reports it too):
//! logged with the record's writer, shown in `/readyz`, in `/v1/instances`
//! ([`Layouts::mismatch_view`]) and as `hotsplit_layout_mismatch{family}`. Writers write copies `0..max(copies, largest live copy
//! count)`.
//!
//! Copies removed by a shrink are deleted twice over, so a later growth cannot serve a copy that
//! missed the edits made while the family was smaller: a publish deletes copies from its write
//! count up to `max_copies` of its key at once, and the watcher's sweep (every
//! `heal.sweep_interval`, while no mismatch is seen and no live instance has more copies) scans
//! the family's keys and deletes every copy at or beyond `copies`. A sweep that finds nothing
//! left to delete lowers the record's `max_copies` to `copies` (by compare-and-set from the
//! value it read), which ends both.
//!
//! # The resize protocol, and why it holds
//!
//! Instances on two copy counts of one family may run at once (a rolling resize). Each instance
//! keeps an entry `<copies>:<instance>` in the family's live set `#hotsplit#live#<family>` (a
//! sorted set scored by when the entry lapses, on the server's clock), refreshed every
//! `heal.layout_interval` (L) and lapsing after 3 L; `FCALL hotsplit_live` drops lapsed entries,
//! refreshes its own and returns the others. The protocol: (1) every publish writes copies
//! `0..max(copies, largest live count it last saw)`, and deletes only from there up to
//! `max_copies`; (2) the sweep does nothing while a live instance has more copies, nor for L + 2 ×
//! the command timeout after the largest live count it sees last changed (a publish that read the
//! larger count, here or on an instance that has not refreshed yet, ends within that time, so no
//! copy beyond the count lands after the sweep that lowers the record; test:
//! `layout::tests::the_sweep_deletes_removed_copies_of_its_family_only`), and lowers the
//! record only by compare-and-set from the value it read (an instance that raised the record
//! meanwhile wins); (3) an instance joins the live set *before* it reads the record and serves; if
//! it joined next to live instances with fewer copies (count `m`), it waits L + 2 × the store
//! command timeout (every live instance re-reads the live set within L plus one call, and a publish
//! that started with the old view ends within one command timeout), then deletes the family's
//! copies `m..copies` before it binds, so a copy that missed an edit while only smaller writers ran
//! is gone (read repair refills it from its newest sibling); with no instance live it deletes
//! copies from the last recorded count up to the recorded `max_copies` (left by an unfinished
//! sweep; no wait, nobody writes). Why it holds: a copy `i` is read only by an instance with more
//! than `i` copies; from the moment that instance's entry is visible to a writer's refresh (at most
//! L + one call after it joined, which its wait covers) until it lapses (3 L after its last
//! refresh, after its last read), every writer writes copy `i`, so an edit copy `i` misses is made
//! before the reader's wait ended, and the copy is deleted after it. Entries are per process, so
//! one instance stopping never hides another with the same count; they are not removed at shutdown
//! but lapse, after the last request was served. Tests:
//! `resize::resize_two_instances_on_different_copy_counts_keep_every_read_copy_current` (12 and 4
//! copies against one Redis, publishing alternately: every copy the larger one reads holds the
//! newest version after each publish; the smaller one's sweep waits until the larger one stops),
//! `resize::resize_shrink_then_grow_within_the_ttl_serves_no_missed_edit`,
//! `resize::a_growing_instance_deletes_the_grown_copies_after_settling`, and
//! `conformance::*` (the live set on the embedded store, standalone Redis and a cluster). Not
//! covered: a failover that loses a fresh live entry (asynchronous replication) hides the instance
//! until its next refresh, one L; a join refused at startup (no `FCALL`) is logged and retried
//! every L, and until it succeeds the instance is not seen by the others (its publishes fail the
//! same way meanwhile); a retry-queue entry for a copy at or beyond every live count can still land
//! after a grow's deletion.
//!
//! Copy placement (`suffix` or `spread`, see [`crate::placement`]) rolls out beside the copy
//! count: each family has a placement set of its own next to its live set, and which copy names
//! an instance reads and writes while instances on both placements (or on releases before
//! placement) run is the `placing` module's protocol, written out there, with the compatibility
//! window (`window`: `K#i` written beside the tagged names until no live instance can read it).
//! A family whose config names no placement gets one at startup ([`choose_placements`]:
//! `spread` when it has no copies yet). The sweeps and the grow cleanup delete copies by index
//! whatever their naming.
//!
//! Readers that carry floors are never served below them; a read whose consulted copies are all
//! missing asks copy 0 (present in every layout) before answering 404, and read repair fills the
//! new copy. Copies removed by a shrink are deleted when their key is published and by the
//! background sweep, while the recorded `max_copies` exceeds the configured count, so growing again
//! cannot serve a copy that missed edits. The sweep pauses while the recorded layout differs from
//! this instance's config or a live instance has more copies (above).

mod choose;
mod placing;
mod reconcile;
mod record;
pub mod splitter;
mod sweep;
mod watcher;
mod window;

pub use choose::choose_placements;
pub use splitter::{join_split_sets, Splitter, SplitterParts};
pub use watcher::LayoutWatcher;
pub use window::WindowState;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::store::{CopyStore, FleetStore, Layout, LayoutStore, LayoutWriter, LiveMember};
use serde::Serialize;

/// What this instance knows of one family's layout.
#[derive(Debug, Clone)]
struct Known {
    /// The configured copy count.
    configured: u32,
    /// The largest copy count recorded; copies at or above `configured` may exist.
    max_copies: u32,
    /// Whether the last read record disagreed with `configured` (the sweep pauses meanwhile).
    mismatch: bool,
    /// Whether a mismatch is reported: the record disagrees, or another live instance runs
    /// another copy count (then this instance may be the one that wrote the record last).
    reported: bool,
    /// The record as last read (or written) by this instance.
    recorded: Option<Layout>,
    /// Who wrote the record, as last read (`None`: unknown, or a release before writer
    /// records).
    writer: Option<LayoutWriter>,
    /// The copy counts of the other live instances at the last refresh.
    live_others: Vec<u32>,
    /// The other live instances at the last refresh (the split and placement gates match
    /// their names).
    live_members: Vec<LiveMember>,
    /// The largest copy count of the other live instances at the last refresh (0: none).
    live_copies: u32,
    /// When `live_copies` was first read or last changed: the sweep waits [`Liveness::settle`]
    /// after it, for the publishes that read the earlier count.
    live_changed: Instant,
    /// The family's placement across the live instances (`placing`).
    placing: placing::Placing,
}

/// Every family's layout, shared by the publisher, `/readyz` and the watcher.
#[derive(Debug, Default)]
pub struct Layouts {
    /// Family name → what is known.
    families: Mutex<BTreeMap<String, Known>>,
    /// Family name → whether reads use the tagged copy names (`placing`); outside the lock,
    /// since every read asks.
    reading: placing::Reading,
    /// The per-key layouts of split keys (`crate::split`), consulted by every publish and read.
    splits: crate::split::SplitIndex,
}

/// A family whose layout this instance sees disagreeing with its own: what `/v1/instances`
/// lists under `layout_mismatches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LayoutMismatch {
    /// The family (its prefix, or `default`).
    pub family: String,
    /// This instance's configured copy count.
    pub configured: u32,
    /// The copy count in the family's layout record (`None`: no record).
    pub recorded_copies: Option<u32>,
    /// Who wrote the record (`None`: a release before writer records wrote it).
    pub writer: Option<LayoutWriter>,
    /// The copy counts of the other live instances of the family.
    pub live_copies: Vec<u32>,
}

/// How an instance takes part in the families' live sets.
#[derive(Debug, Clone)]
pub struct Liveness {
    /// This process's name in the live sets (`<pid>-<random>`), unique per process.
    pub instance: String,
    /// The release this instance runs, recorded as the writer of the layout records it writes.
    pub release: String,
    /// How often the live entries are refreshed and the records re-read
    /// (`heal.layout_interval`).
    pub interval: Duration,
    /// The store's command timeout: the longest one refresh or one copy write can take.
    pub command_timeout: Duration,
}

/// A live entry lapses after this many refresh intervals without a refresh.
const LIVE_INTERVALS: u32 = 3;

impl Liveness {
    /// How long a live entry lasts without a refresh.
    pub fn ttl(&self) -> Duration {
        self.interval * LIVE_INTERVALS
    }

    /// How long a growing instance waits after joining before it deletes the grown range: every
    /// live instance refreshes its view within one interval (plus one refresh call), and a
    /// publish that started with the old view ends within one command timeout.
    pub fn settle(&self) -> Duration {
        self.interval + self.command_timeout * 2
    }

    /// This instance as the writer of a record of `copies`, now.
    fn writer(&self, copies: u32) -> LayoutWriter {
        LayoutWriter {
            instance: self.instance.clone(),
            release: self.release.clone(),
            copies,
            written_ms: crate::store::now_unix_ms(),
        }
    }
}

impl Layouts {
    /// Layouts that know nothing recorded (every family at its configured count).
    pub fn unrecorded() -> Arc<Layouts> {
        Arc::new(Layouts::default())
    }

    /// The other instances live in `family` at the last refresh.
    pub fn live_members(&self, family: &str) -> Vec<LiveMember> {
        self.lock()
            .get(family)
            .map_or_else(Vec::new, |known| known.live_members.clone())
    }

    /// The per-key layouts of split keys.
    pub fn splits(&self) -> &crate::split::SplitIndex {
        &self.splits
    }

    /// How many copies publishes of `key` (of `family`, `configured` copies) write: the
    /// family's write count, or its split copies when larger.
    pub fn key_write_copies(&self, family: &str, key: &str, configured: u32) -> u32 {
        let family_count = self.write_copies(family, configured);
        self.splits
            .write_copies(family, key)
            .map_or(family_count, |copies| copies.max(family_count))
    }

    /// How many copies reads of `key` choose among: the family's, or its split copies once
    /// readers may use them.
    pub fn key_read_copies(&self, family: &str, key: &str, configured: u32) -> u32 {
        self.splits
            .read_copies(family, key)
            .map_or(configured, |copies| copies.max(configured))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Known>> {
        self.families.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The largest copy count recorded for `family`, at least `configured`.
    pub fn max_copies(&self, family: &str, configured: u32) -> u32 {
        self.lock()
            .get(family)
            .map_or(configured, |known| known.max_copies.max(configured))
    }

    /// How many copies a publish of `family` writes: the configured count, or the largest
    /// count of a live instance when that is larger (its readers read those copies).
    pub fn write_copies(&self, family: &str, configured: u32) -> u32 {
        self.lock()
            .get(family)
            .map_or(configured, |known| known.live_copies.max(configured))
    }

    /// Records the other live instances of `family` and their copy counts.
    fn observe_live(&self, family: &str, members: &[LiveMember]) {
        let others: Vec<u32> = members.iter().map(|member| member.copies).collect();
        let live_copies = others.iter().copied().max().unwrap_or(0);
        if let Some(known) = self.lock().get_mut(family) {
            known.live_others = others;
            known.live_members = members.to_vec();
            if known.live_copies != live_copies {
                tracing::info!(
                    family,
                    configured = known.configured,
                    before = known.live_copies,
                    live_copies,
                    "the largest live copy count changed"
                );
                known.live_changed = Instant::now();
            }
            known.live_copies = live_copies;
        }
    }

    /// Families whose layout this instance sees disagreeing with its config: the recorded
    /// layout differs, or another live instance runs another copy count.
    pub fn mismatches(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, known)| known.reported)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The families of [`Layouts::mismatches`], each with the record, its writer and the other
    /// live instances' copy counts.
    pub fn mismatch_view(&self) -> Vec<LayoutMismatch> {
        self.lock()
            .iter()
            .filter(|(_, known)| known.reported)
            .map(|(name, known)| LayoutMismatch {
                family: name.clone(),
                configured: known.configured,
                recorded_copies: known.recorded.map(|layout| layout.copies),
                writer: known.writer.clone(),
                live_copies: known.live_others.clone(),
            })
            .collect()
    }

    /// Records the layout record of `family` as read, with its writer, and reports a mismatch
    /// (log on a change, the gauge always).
    fn observe(
        &self,
        family: &str,
        recorded: Option<Layout>,
        writer: Option<LayoutWriter>,
        metrics: &Metrics,
    ) {
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return;
        };
        let mismatch = recorded.is_some_and(|layout| layout.copies != known.configured);
        let reported = mismatch
            || known
                .live_others
                .iter()
                .any(|&copies| copies != known.configured);
        if reported != known.reported {
            if reported {
                tracing::warn!(
                    family,
                    configured = known.configured,
                    recorded = ?recorded.map(|layout| layout.copies),
                    writer = writer.as_ref().map_or("unknown", |writer| writer.instance.as_str()),
                    writer_release = writer.as_ref().map_or("unknown", |writer| writer.release.as_str()),
                    live_copies = ?known.live_others,
                    "layout mismatch between running instances: another instance recorded or runs a different copy count"
                );
            } else {
                tracing::info!(family, "layout mismatch resolved");
            }
        }
        known.mismatch = mismatch;
        known.reported = reported;
        known.recorded = recorded;
        known.writer = writer;
        if let Some(layout) = recorded {
            known.max_copies = known.max_copies.max(layout.max_copies);
        }
        metrics.layout_mismatch(family, reported);
    }
}

/// The store roles the layout records and the sweeps use.
#[derive(Clone)]
pub struct LayoutStores {
    /// The layout records, their writers, the live sets, and the scan a sweep starts from.
    pub layouts: Arc<dyn LayoutStore>,
    /// The copies a sweep deletes.
    pub copies: Arc<dyn CopyStore>,
    /// The registry: whether the writer of a record this instance replaces still runs.
    pub fleet: Arc<dyn FleetStore>,
}

impl LayoutStores {
    /// Every role from one store.
    pub fn of<S: LayoutStore + CopyStore + FleetStore>(store: &Arc<S>) -> LayoutStores {
        LayoutStores {
            layouts: store.clone(),
            copies: store.clone(),
            fleet: store.clone(),
        }
    }
}

/// Escapes Redis glob metacharacters.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::reconcile::{strays, Strays};
    use super::*;
    use crate::family::fixture;
    use crate::key::Key;
    use crate::store::memory::MemoryStore;
    use crate::store::CopyWrite;

    fn liveness(instance: &str) -> Liveness {
        Liveness {
            instance: instance.to_owned(),
            release: "0.1.0".to_owned(),
            interval: Duration::from_secs(1),
            command_timeout: Duration::from_millis(1),
        }
    }

    #[tokio::test]
    async fn the_sweep_deletes_removed_copies_of_its_family_only() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let text = |copies| {
            format!("[[family]]\nprefix = \"p*\"\ncopies = {copies}\n[[family]]\nprefix = \"p*x\"\ncopies = 8")
        };
        let twelve = fixture::families(&text(12));
        let four = Arc::new(fixture::families(&text(4)));
        Layouts::reconcile(
            &LayoutStores::of(&store),
            &twelve,
            &metrics,
            &liveness("twelve"),
        )
        .await
        .unwrap();
        // Version 1 of a key of each family, on every copy its twelve-copy layout writes.
        for key in ["p*1", "p*x1"] {
            let key = Key::parse(key).unwrap();
            let writes: Vec<CopyWrite> = (0..twelve.resolve(&key).copies)
                .map(|index| CopyWrite {
                    copy_key: key.copy_key(index, crate::key::Placement::Suffix),
                    version: crate::key::Version::new(1).unwrap(),
                    payload: crate::store::Payload::Value(bytes::Bytes::new()),
                    expire_at_ms: crate::store::now_unix_ms() + 60_000,
                })
                .collect();
            store.write_copies(&writes).await;
        }
        let layouts = Layouts::reconcile(
            &LayoutStores::of(&store),
            &four,
            &metrics,
            &liveness("four"),
        )
        .await
        .unwrap();
        // A settle time no test run outlasts: a sweep "now" is deferred, one at `settled` is not.
        let watcher = LayoutWatcher {
            stores: LayoutStores::of(&store),
            layouts: layouts.clone(),
            families: four.clone(),
            metrics,
            liveness: Liveness {
                interval: Duration::from_secs(600),
                ..liveness("four")
            },
            sweep_interval: Duration::from_secs(1),
        };
        let family = four.resolve(&Key::parse("p*1").unwrap()).clone();
        // The twelve-copy instance is live: its readers read copies 4..12, which are kept and
        // written by this instance's publishes too.
        assert_eq!(layouts.write_copies("p*", 4), 12);
        let settled = Instant::now() + watcher.liveness.settle();
        watcher.sweep(&family, settled).await.unwrap();
        assert_eq!(store.len(), 12 + 8);
        // It stops; once its entry is gone, and the publishes that read its count have had the
        // settle time to end, the sweep deletes.
        store.leave_layout("p*", 12, "twelve").await.unwrap();
        watcher.refresh().await;
        assert_eq!(layouts.write_copies("p*", 4), 4);
        watcher.sweep(&family, Instant::now()).await.unwrap();
        assert_eq!(store.len(), 12 + 8, "the sweep waits the settle time");
        let settled = Instant::now() + watcher.liveness.settle();
        watcher.sweep(&family, settled).await.unwrap();
        // p*1 keeps copies 0..4; p*x1 (another family, 8 copies) keeps all of its copies.
        assert_eq!(store.len(), 4 + 8);
        assert_eq!(layouts.max_copies("p*", 4), 12);
        watcher.sweep(&family, settled).await.unwrap();
        assert_eq!(layouts.max_copies("p*", 4), 4);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[tokio::test]
    async fn a_resize_is_recorded_and_a_mismatch_seen() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let eight = fixture::families("[[family]]\nprefix = \"p:\"\ncopies = 8");
        let four = fixture::families("[[family]]\nprefix = \"p:\"\ncopies = 4");
        let first = Layouts::reconcile(&LayoutStores::of(&store), &eight, &metrics, &liveness("a"))
            .await
            .unwrap();
        assert_eq!(first.max_copies("p:", 8), 8);
        let second = Layouts::reconcile(&LayoutStores::of(&store), &four, &metrics, &liveness("b"))
            .await
            .unwrap();
        assert_eq!(second.max_copies("p:", 4), 8);
        assert_eq!(
            store.read_layout("p:").await.unwrap(),
            Some(Layout {
                copies: 4,
                max_copies: 8
            })
        );
        // The first instance still runs 8 copies: it now sees a mismatch.
        let writer = store.read_layout_writer("p:").await.unwrap();
        assert_eq!(
            writer
                .as_ref()
                .map(|writer| (writer.instance.as_str(), writer.copies)),
            Some(("b", 4)),
            "the record names the instance that wrote it"
        );
        first.observe(
            "p:",
            store.read_layout("p:").await.unwrap(),
            writer,
            &metrics,
        );
        assert_eq!(first.mismatches(), vec!["p:".to_owned()]);
        let view = first.mismatch_view();
        assert_eq!(view.len(), 1);
        assert_eq!(
            (
                view[0].configured,
                view[0].recorded_copies,
                view[0].writer.as_ref().map(|w| w.instance.as_str())
            ),
            (8, Some(4), Some("b"))
        );
        // The second instance, which replaced the record, reports it too: the first is live
        // on 8 copies.
        assert_eq!(second.mismatches(), vec!["p:".to_owned()]);
        assert_eq!(second.mismatch_view()[0].live_copies, vec![8]);
        assert!(metrics
            .render()
            .contains(r#"hotsplit_layout_mismatch{family="p:"} 1"#));
        // The first stops (its live entry goes): the second's report ends at its next refresh.
        store.leave_layout("p:", 8, "a").await.unwrap();
        second.observe_live("p:", &[]);
        second.observe("p:", store.read_layout("p:").await.unwrap(), None, &metrics);
        assert!(second.mismatches().is_empty());
    }

    #[test]
    fn a_grow_deletes_only_the_copies_nobody_kept_current() {
        let record = |copies, max_copies| Some(Layout { copies, max_copies });
        // Nobody live, nothing recorded: no copy exists.
        assert_eq!(strays(8, None, None), None);
        // A restart on the recorded count, alone: every copy is current.
        assert_eq!(strays(8, None, record(8, 8)), None);
        // Alone after a shrink to 4 that had not finished sweeping: 4..8 may have missed edits.
        assert_eq!(
            strays(8, None, record(4, 12)),
            Some(Strays {
                from: 4,
                to: 8,
                settle: false
            })
        );
        // Alone after a completed shrink: copies 4.. do not exist.
        assert_eq!(strays(8, None, record(4, 4)), None);
        // A live instance writes 4 copies: wait for it to see this one, then delete 4..12.
        assert_eq!(
            strays(12, Some(4), record(4, 4)),
            Some(Strays {
                from: 4,
                to: 12,
                settle: true
            })
        );
        // A live instance already writes at least as many copies.
        assert_eq!(strays(8, Some(12), record(12, 12)), None);
        assert_eq!(strays(8, Some(8), None), None);
    }
}
