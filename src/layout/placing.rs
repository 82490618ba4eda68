//! Placement changes across instances: which copy names this instance reads and writes while
//! instances on both placements, or on releases before placement, run at once.
//!
//! The family layout record keeps its `copies:max_copies` text (every release parses it, and its
//! compare-and-set refuses anything else), so a family's placement is not in it. Each instance of
//! a release with placement support keeps an entry `<code>:<instance>` in a live set of its own
//! per family, `#hotsplit#live##placement#<family>` (the same `FCALL hotsplit_live` sorted set
//! as the family's live set, under a name no family can have, since a prefix never contains
//! `#`): code 1 for an instance configured `suffix`, 2 for one configured `spread` that still
//! reads `K#i`, 3 for one that reads the tagged names `K#i{t}`. An older release joins the
//! family's live set but not this one, so *more entries in the family's live set than in its
//! placement set* means an instance that knows only `K#i` runs.
//!
//! # The protocol, and why it holds
//! 1. While a family's compatibility window is open (point 4), every instance writes `K#i` (the
//!    names every release reads): a reader of `K#i` is never served a copy that missed an edit,
//!    whatever the others are configured to. An instance also writes the tagged names when it
//!    is configured `spread` or sees a live entry of code 2 or 3 (someone reads or is about to
//!    read them). So an open window's publish writes copy 0 and both names of copies 1..N.
//! 2. An instance configured `spread` starts reading `K#i` and switches to the tagged names
//!    only when every instance of the family's live set is in its placement set (no older
//!    release runs), and either another live instance already reads them (it has kept them
//!    current since its own switch, and every writer writes them while it is live; a starting
//!    instance then re-joins with code 3 before it serves, so no writer takes its startup code
//!    2 for a reader of `K#i`), or, after [`super::Liveness::settle`] since it joined with every
//!    live instance aware of placement (every writer has seen its code 2 by then, and every
//!    publish that had not ended), it has deleted every tagged copy of the family (a tagged
//!    copy that outlived an earlier period without `spread` writers may have missed edits; a
//!    read that finds its copies missing falls back to copy 0, which is `K#0` under both
//!    placements, and read repair refills the copy). Edits after the delete reach the tagged
//!    names from every writer, so a tagged copy it reads is current.
//! 3. An instance that sees a live instance outside the placement set (an older release)
//!    switches back to `K#i` at once and starts over at 2. An instance configured `suffix`
//!    always reads `K#i`, so moving a family back from `spread` to `suffix` is a rolling
//!    restart (point 5 says what a closed window adds).
//! 4. The window closes (`window`) on an instance configured `spread` that reads the tagged
//!    names when every other member of the placement set has code 3 and every instance of the
//!    family's live set is in the placement set (names matched, as for point 2), and one scan
//!    covers the family's copy names: from then on its publishes write copy 0 and the tagged
//!    names only (N names; the same for split copies and the scrub's repairs). Nobody reads
//!    `K#i` then: every live instance is code 3. After the settle time since it closed (every
//!    other writer has seen the same sets and closed, and every publish that still wrote `K#i`
//!    has ended), the instance deletes the family's `K#i` (`i ≥ 1`) in batches, so a later reader
//!    of `K#i` finds it missing (and falls back to copy 0, which every writer writes) rather
//!    than stale. Each instance sweeps after its own close, so the last writer to stop writing
//!    `K#i` also deletes what it wrote. Any other sighting (a code 1 or 2 entry, an older
//!    release) reopens the window at once: `K#i` is written again from the next publish.
//! 5. A reader of `K#i` of this release (configured `suffix`, or `spread` and not switching)
//!    that starts beside an instance of code 3 (whose window may be closed) joins with its code
//!    before it serves, waits the settle time (every writer has seen it and reopened, and every
//!    publish that skipped `K#i` has ended), then refills `K#1..K#N-1` of every key from its
//!    newest copy over `K#0` and the tagged names, through the copies' compare-and-set (a copy
//!    never goes back, and a publish that lands first wins), and only then serves. So no read
//!    answers a `K#i` that missed an edit: each `K#i` it reads holds every edit made before the
//!    refill and is written by every publish after the settle.
//!
//! The deletes of points 2 and 4 scan the family's keys once, up to 100,000 copy names (as the
//! shrink sweep does); a family with more keys stays on `K#i` (logged at every refresh) and
//! keeps its window open (the scan is retried every sweep interval). A one-copy family has only
//! copy 0 and never switches, and its window never closes (its split keys' publishes keep
//! writing both names).
//!
//! Not covered (as for the resize protocol): an older-release instance that starts while a
//! family is read under the tagged names publishes edits the tagged copies miss until the other
//! instances see it, at most one layout interval plus one call; if the window was closed, it
//! does not wait or refill as point 5 does, so within that time its reads find `K#i` missing
//! (and fall back to copy 0, which is current) or re-created by its own read repair while the
//! others still skip `K#i` (which can then miss an edit), and an instance of this release that
//! falls back to `K#i` when it sees the older release can read such a copy too. A retry-queue
//! entry, or a scrub repair decided before a close, for a copy named under a naming no longer
//! written can land after a delete of point 2 or 4: compare-and-set keeps it from moving a copy
//! backwards, but it may recreate a copy the delete removed at an older version (point 5's
//! refill brings a re-created `K#i` up to date before a reader of this release uses it). Tests:
//! `placement::a_rolling_placement_change_serves_no_reader_an_old_value`,
//! `placement::an_older_release_in_the_live_set_keeps_the_family_on_suffix_names`,
//! `placement::an_older_release_starting_against_a_spread_family_reads_its_layout_and_reaches_every_reader`,
//! `placement_window::a_closed_window_writes_n_copies_and_deletes_k_i`,
//! `placement_window::a_suffix_instance_joining_a_closed_window_is_served_no_missed_edit`,
//! `placement_window::a_rolling_change_from_suffix_to_spread_under_load_serves_no_missed_edit`,
//! `layout::window::tests::*`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{LayoutStores, Layouts, Liveness};
use crate::family::{Families, Family};
use crate::key::{Key, Placement};
use crate::store::LiveMember;

/// The live-set code of an instance configured `suffix`.
pub(super) const CODE_SUFFIX: u32 = 1;
/// The live-set code of an instance configured `spread` that still reads `K#i`.
pub(super) const CODE_SPREAD_PENDING: u32 = 2;
/// The live-set code of an instance that reads the tagged names.
pub(super) const CODE_SPREAD_READING: u32 = 3;

/// The name of `family`'s placement set, as a family name for the live-set calls.
pub(super) fn placement_set(family: &str) -> String {
    format!("#placement#{family}")
}

/// What this instance knows of one family's placement.
#[derive(Debug, Clone)]
pub(super) struct Placing {
    /// The configured placement.
    pub(super) configured: Placement,
    /// Whether another live instance is configured `spread` (codes 2 and 3).
    pub(super) others_spread: bool,
    /// Whether another live instance reads the tagged names (code 3).
    others_reading: bool,
    /// Since when every instance of the family's live set has been in its placement set
    /// (`None`: an older release is live, or was at the last refresh).
    aware_since: Option<Instant>,
    /// The busiest-node share last reported for the family (logged when it changes).
    pub(super) share: Option<f64>,
    /// The code this instance's entry in the placement set has.
    joined: u32,
    /// The compatibility window: whether publishes still write `K#i` (`window`).
    pub(super) window: Window,
    /// When a scan last found more copy names than one scan covers (the window stays open
    /// meanwhile, and the scan is not repeated at every refresh).
    pub(super) too_many_keys: Option<Instant>,
}

impl Placing {
    /// The state of a family configured `configured`, just joined at `now`.
    pub(super) fn joined(configured: Placement, now: Instant) -> Placing {
        Placing {
            configured,
            others_spread: false,
            others_reading: false,
            aware_since: Some(now),
            share: None,
            // What the startup join used: no family is read under the tagged names yet.
            joined: match configured {
                Placement::Suffix => CODE_SUFFIX,
                Placement::Spread => CODE_SPREAD_PENDING,
            },
            window: Window::Open,
            too_many_keys: None,
        }
    }
}

/// What the watcher does about a family's placement after a refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing.
    Stay,
    /// Read the tagged names now: another live instance already keeps them current.
    Switch,
    /// Delete the family's tagged copies, then read the tagged names.
    CleanThenSwitch,
}

/// Which families this instance reads under the tagged names: one flag per family, read by
/// every read without a lock.
#[derive(Debug, Default)]
pub(super) struct Reading {
    /// Family name → whether it is read under the tagged names.
    spread: HashMap<String, AtomicBool>,
}

impl Reading {
    /// A flag per family of `families`, all reading `K#i`.
    pub(super) fn of(families: &Families) -> Reading {
        Reading {
            spread: families
                .iter()
                .map(|family| (family.name().to_owned(), AtomicBool::new(false)))
                .collect(),
        }
    }

    /// The placement `family` is read under; `None` for a family it does not know.
    pub(super) fn get(&self, family: &str) -> Option<Placement> {
        self.spread.get(family).map(|spread| {
            if spread.load(Ordering::Acquire) {
                Placement::Spread
            } else {
                Placement::Suffix
            }
        })
    }

    /// Sets the placement `family` is read under.
    pub(super) fn set(&self, family: &str, placement: Placement) {
        if let Some(spread) = self.spread.get(family) {
            spread.store(placement == Placement::Spread, Ordering::Release);
        }
    }
}

/// Where a family's compatibility window stands on this instance (`window.rs` moves it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Window {
    /// Publishes write `K#i` (the state every instance starts in).
    Open,
    /// Publishes write copy 0 and the tagged names only, since `since`; `swept` once this
    /// instance has deleted the family's `K#i` copies.
    Closed {
        /// When this instance stopped writing `K#i`.
        since: Instant,
        /// Whether its sweep of `K#i` has seen every key.
        swept: bool,
    },
}

/// What one look at a family's sets found: the instances of its live set missing from its
/// placement set (older releases, by name), and the codes of the placement set's members.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sighting<'a> {
    /// Live instances missing from the placement set.
    pub(super) missing: &'a [String],
    /// The placement set's members' codes.
    pub(super) codes: &'a [u32],
    /// When the sets were read.
    pub(super) at: Instant,
}

impl Layouts {
    /// The placement reads of `family` use now (see the module doc); `None` for a family these
    /// layouts do not know (then its configured placement).
    pub fn read_placement(&self, family: &str) -> Option<Placement> {
        self.reading.get(family)
    }

    /// The code this instance keeps in `family`'s placement set.
    pub(super) fn placement_code(&self, family: &Family) -> u32 {
        match (family.placement, self.reading.get(family.name())) {
            (Placement::Suffix, _) => CODE_SUFFIX,
            (Placement::Spread, Some(Placement::Spread)) => CODE_SPREAD_READING,
            (Placement::Spread, _) => CODE_SPREAD_PENDING,
        }
    }

    /// Records the codes of the other instances in `family`'s placement set and the instances
    /// of its live set missing from the placement set (matched by name), as `seen`; falls back
    /// to `K#i` when one is (an older release), and says whether to switch to the tagged names
    /// (`settle`: see the module doc).
    pub(super) fn observe_placement(
        &self,
        family: &str,
        seen: Sighting<'_>,
        settle: Duration,
        metrics: &crate::metrics::Metrics,
    ) -> Step {
        let Sighting {
            missing,
            codes,
            at: now,
        } = seen;
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return Step::Stay;
        };
        let copies = known.configured;
        let placing = &mut known.placing;
        placing.others_spread = codes
            .iter()
            .any(|&code| code == CODE_SPREAD_PENDING || code == CODE_SPREAD_READING);
        placing.others_reading = codes.contains(&CODE_SPREAD_READING);
        // Names, not counts: a member of the placement set whose live entry lapsed first must
        // not stand in for an older release in the live set.
        let aware = missing.is_empty();
        if !aware {
            if placing.aware_since.take().is_some() {
                tracing::warn!(
                    family,
                    ?missing,
                    with_placement = codes.len(),
                    "an instance of a release without copy placement is live: reading and keeping the untagged copy names K#i"
                );
            }
            if self.reading.get(family) == Some(Placement::Spread) {
                self.reading.set(family, Placement::Suffix);
                metrics.placement_reads_spread(family, false);
            }
            return Step::Stay;
        }
        let since = *placing.aware_since.get_or_insert(now);
        // A one-copy family has only copy 0, `K#0` under both namings: nothing to switch.
        if placing.configured != Placement::Spread
            || copies < 2
            || self.reading.get(family) == Some(Placement::Spread)
        {
            return Step::Stay;
        }
        if placing.others_reading {
            Step::Switch
        } else if now.saturating_duration_since(since) >= settle {
            Step::CleanThenSwitch
        } else {
            Step::Stay
        }
    }

    /// The code of this instance's entry in `family`'s placement set.
    fn placement_joined(&self, family: &str) -> Option<u32> {
        self.lock().get(family).map(|known| known.placing.joined)
    }

    /// Records that this instance's entry in `family`'s placement set has `code` now.
    fn set_placement_joined(&self, family: &str, code: u32) {
        if let Some(known) = self.lock().get_mut(family) {
            known.placing.joined = code;
        }
    }

    /// Records `share` as `family`'s last reported busiest-node share; whether it changed by
    /// more than 0.01 since the last report (or is the first).
    pub(super) fn report_share(&self, family: &str, share: f64) -> bool {
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return false;
        };
        let changed = known
            .placing
            .share
            .is_none_or(|last| (last - share).abs() > 0.01);
        if changed {
            known.placing.share = Some(share);
        }
        changed
    }

    /// Reads `family` under the tagged names from now on.
    pub(super) fn start_reading_spread(&self, family: &str, metrics: &crate::metrics::Metrics) {
        self.reading.set(family, Placement::Spread);
        metrics.placement_reads_spread(family, true);
        tracing::info!(
            family,
            "reading the family's copies under their spread (tagged) names"
        );
    }
}

/// How many sample keys the spread report names.
const REPORT_SAMPLE: u32 = 64;

/// How far from even `family`'s copies fall on the live slot map under `placement`: the largest
/// share of one key's copies on one node over a sample of the family's keys (named through
/// [`CopyKey::new`], placed by the store's `node_of`), with the share an even spread over the
/// nodes seen would give (`ceil(N / nodes) / N`); `None` for a one-copy family. The names never
/// depend on the map (see [`crate::placement`]): after a reshard leaves unequal slot ranges,
/// this is what says so.
pub(super) fn spread_share(
    stores: &LayoutStores,
    family: &Family,
    placement: Placement,
) -> Option<(f64, f64)> {
    if family.copies < 2 {
        return None;
    }
    let mut nodes: HashMap<String, u32> = HashMap::new();
    let mut worst: f64 = 0.0;
    for n in 0..REPORT_SAMPLE {
        let key = Key::parse(&format!("{}placement-probe-{n}", family.prefix)).ok()?;
        let mut per_node: HashMap<String, u32> = HashMap::new();
        for index in 0..family.copies {
            let node = stores.copies.node_of(&key.copy_key(index, placement));
            *per_node.entry(node.to_string()).or_default() += 1;
        }
        let busiest = per_node.values().copied().max().unwrap_or(0);
        let share = f64::from(busiest) / f64::from(family.copies);
        worst = worst.max(share);
        for (node, count) in per_node {
            *nodes.entry(node).or_default() += count;
        }
    }
    let masters = nodes.len().max(1) as u32;
    let even = f64::from(family.copies.div_ceil(masters)) / f64::from(family.copies);
    Some((worst, even))
}

/// Joins `family`'s placement set with this instance's code; the other instances' codes, or
/// `None` when the join failed (logged; the watcher retries every layout interval, and until
/// then this instance reads `K#i`, which every writer writes).
///
/// An entry is `<code>:<instance>`, so when this instance's code changed since its last join
/// its entry under the old code is still in the set, and would read, to this instance and to
/// the others, as another instance's until it lapsed (three intervals): a `3` left behind
/// after falling back to `K#i` made this instance take itself for another reader of the tagged
/// names and switch back to them without deleting the copies an older release's edits missed.
/// So the new entry is added first (the set never lacks this instance: no other instance takes
/// it for an older release), the old one removed, and the set read again by a second join.
pub(super) async fn join_placement(
    stores: &LayoutStores,
    layouts: &Layouts,
    family: &Family,
    liveness: &Liveness,
    ttl_ms: u64,
) -> Option<Vec<LiveMember>> {
    let set = placement_set(family.name());
    let code = layouts.placement_code(family);
    let fail = |err: crate::error::Error| {
        tracing::warn!(family = family.name(), error = %err, "cannot join the family's placement set: retried every layout interval");
    };
    let join = || {
        stores
            .layouts
            .join_live(&set, code, &liveness.instance, ttl_ms)
    };
    let codes = join().await.map_err(fail).ok()?;
    let Some(old) = layouts
        .placement_joined(family.name())
        .filter(|&old| old != code)
    else {
        return Some(codes);
    };
    stores
        .layouts
        .leave_layout(&set, old, &liveness.instance)
        .await
        .map_err(fail)
        .ok()?;
    layouts.set_placement_joined(family.name(), code);
    join().await.map_err(fail).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::family::fixture;
    use crate::layout::Liveness;
    use crate::metrics::Metrics;
    use crate::store::memory::MemoryStore;
    use crate::store::LayoutStore;

    const CONFIG: &str =
        "[[family]]\nprefix = \"s:\"\ncopies = 4\nplacement = \"spread\"\n[[family]]\nprefix = \"x:\"\ncopies = 4\nplacement = \"suffix\"\n";

    fn liveness(instance: &str) -> Liveness {
        Liveness {
            instance: instance.to_owned(),
            release: "0.1.0".to_owned(),
            interval: Duration::from_secs(1),
            command_timeout: Duration::from_millis(1),
        }
    }

    async fn layouts(store: &Arc<MemoryStore>, instance: &str) -> Arc<Layouts> {
        Layouts::reconcile(
            &LayoutStores::of(store),
            &fixture::families(CONFIG),
            &Metrics::new(),
            &liveness(instance),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_spread_family_reads_tagged_names_only_after_the_settle_or_beside_a_reader() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let layouts = layouts(&store, "a").await;
        let settle = Duration::from_secs(10);
        let now = Instant::now();
        // Alone, just joined: K#i until the settle time has passed, then delete and switch.
        assert_eq!(layouts.read_placement("s:"), Some(Placement::Suffix));
        assert_eq!(layouts.read_placement("x:"), Some(Placement::Suffix));
        let step = |missing: &[String], codes: &[u32], at: Instant| {
            layouts.observe_placement("s:", Sighting { missing, codes, at }, settle, &metrics)
        };
        let older = ["older-release".to_owned()];
        assert_eq!(step(&[], &[], now), Step::Stay);
        assert_eq!(step(&[], &[], now + settle), Step::CleanThenSwitch);
        // Another instance already reads the tagged names: at once.
        assert_eq!(step(&[], &[CODE_SPREAD_READING], now), Step::Switch);
        layouts.start_reading_spread("s:", &metrics);
        assert_eq!(layouts.read_placement("s:"), Some(Placement::Spread));
        assert_eq!(
            layouts.placement_code(
                &fixture::families(CONFIG)
                    .resolve(&Key::parse("s:1").unwrap())
                    .clone()
            ),
            CODE_SPREAD_READING
        );
        // An instance in the live set but not in the placement set (an older release): back to
        // K#i at once, and the settle starts over once it has gone.
        assert_eq!(
            step(&older, &[CODE_SPREAD_READING], now + settle),
            Step::Stay
        );
        assert_eq!(layouts.read_placement("s:"), Some(Placement::Suffix));
        let later = now + settle * 2;
        assert_eq!(step(&[], &[], later), Step::Stay);
        assert_eq!(step(&[], &[], later + settle), Step::CleanThenSwitch);
        // A suffix family never switches.
        assert_eq!(
            layouts.observe_placement(
                "x:",
                Sighting {
                    missing: &[],
                    codes: &[],
                    at: later + settle
                },
                settle,
                &metrics
            ),
            Step::Stay
        );
    }

    #[tokio::test]
    async fn a_changed_code_replaces_this_instances_entry_and_is_never_taken_for_another_reader() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let stores = LayoutStores::of(&store);
        let layouts = layouts(&store, "a").await;
        let spread = fixture::families(CONFIG)
            .resolve(&Key::parse("s:1").unwrap())
            .clone();
        let placement = placement_set("s:");
        let seen_by_b = || store.join_layout(&placement, CODE_SUFFIX, "b", 60_000);
        assert_eq!(seen_by_b().await.unwrap(), vec![CODE_SPREAD_PENDING]);
        // "a" reads the tagged names (code 3), then falls back to K#i (code 2).
        layouts.start_reading_spread("s:", &metrics);
        let codes = join_placement(&stores, &layouts, &spread, &liveness("a"), 60_000).await;
        assert_eq!(
            codes,
            Some(vec![LiveMember {
                copies: CODE_SUFFIX,
                instance: "b".to_owned()
            }]),
            "only b's entry is another's"
        );
        assert_eq!(seen_by_b().await.unwrap(), vec![CODE_SPREAD_READING]);
        let settle = Duration::from_secs(10);
        let now = Instant::now();
        let older = ["older-release".to_owned()];
        layouts.observe_placement(
            "s:",
            Sighting {
                missing: &older,
                codes: &[CODE_SUFFIX],
                at: now,
            },
            settle,
            &metrics,
        );
        assert_eq!(layouts.read_placement("s:"), Some(Placement::Suffix));
        let codes: Vec<u32> = join_placement(&stores, &layouts, &spread, &liveness("a"), 60_000)
            .await
            .unwrap()
            .into_iter()
            .map(|member| member.copies)
            .collect();
        // Its old `3` is gone: "a" sees no reader of the tagged names, so it deletes them after
        // the settle time before it reads them again.
        assert_eq!(codes, vec![CODE_SUFFIX]);
        assert_eq!(seen_by_b().await.unwrap(), vec![CODE_SPREAD_PENDING]);
        assert_eq!(
            layouts.observe_placement(
                "s:",
                Sighting {
                    missing: &[],
                    codes: &codes,
                    at: now
                },
                settle,
                &metrics
            ),
            Step::Stay
        );
    }

    #[tokio::test]
    async fn the_gate_matches_names_when_the_sets_lapse_at_different_moments() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let layouts = layouts(&store, "a").await;
        // "older" (a release without placement) is live in the family; "gone" is still in the
        // placement set, its live entry already lapsed: one other each.
        store.join_layout("s:", 4, "older", 60_000).await.unwrap();
        store
            .join_layout(&placement_set("s:"), CODE_SUFFIX, "gone", 60_000)
            .await
            .unwrap();
        let live = store.join_live("s:", 4, "a", 60_000).await.unwrap();
        let placed = store
            .join_live(&placement_set("s:"), CODE_SPREAD_PENDING, "a", 60_000)
            .await
            .unwrap();
        assert_eq!((live.len(), placed.len()), (1, 1));
        let missing = LiveMember::missing_from(&live, &placed);
        assert_eq!(missing, vec!["older".to_owned()]);
        let settle = Duration::from_secs(10);
        let now = Instant::now();
        for at in [now, now + settle, now + settle * 2] {
            assert_eq!(
                layouts.observe_placement(
                    "s:",
                    Sighting {
                        missing: &missing,
                        codes: &[CODE_SUFFIX],
                        at
                    },
                    settle,
                    &metrics
                ),
                Step::Stay,
                "an older release is live: K#i"
            );
        }
    }

    #[tokio::test]
    async fn writers_write_tagged_names_while_any_live_instance_is_configured_spread() {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let families = fixture::families(CONFIG);
        let layouts = layouts(&store, "a").await;
        let suffix = families.resolve(&Key::parse("x:1").unwrap()).clone();
        let spread = families.resolve(&Key::parse("s:1").unwrap()).clone();
        assert!(layouts
            .write_placements(&spread)
            .contains(&Placement::Spread));
        assert!(!layouts
            .write_placements(&suffix)
            .contains(&Placement::Spread));
        let settle = Duration::from_secs(10);
        layouts.observe_placement(
            "x:",
            Sighting {
                missing: &[],
                codes: &[CODE_SPREAD_PENDING],
                at: Instant::now(),
            },
            settle,
            &metrics,
        );
        assert!(layouts
            .write_placements(&suffix)
            .contains(&Placement::Spread));
        layouts.observe_placement(
            "x:",
            Sighting {
                missing: &[],
                codes: &[CODE_SUFFIX],
                at: Instant::now(),
            },
            settle,
            &metrics,
        );
        assert!(!layouts
            .write_placements(&suffix)
            .contains(&Placement::Spread));
        // The placement set is a live set of its own, beside the family's.
        let others = store
            .join_layout(&placement_set("s:"), CODE_SUFFIX, "b", 60_000)
            .await
            .unwrap();
        assert_eq!(others, vec![CODE_SPREAD_PENDING]);
    }

    #[test]
    fn the_placement_set_is_no_familys_live_set() {
        // A prefix never contains '#', so no family is named like a placement set.
        assert_eq!(placement_set("post:"), "#placement#post:");
        assert!(Key::parse(&placement_set("post:")).is_err());
    }
}
