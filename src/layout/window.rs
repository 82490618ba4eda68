//! The compatibility window of a `spread` family: while it is open, publishes write `K#i`
//! beside the tagged names, for readers of `K#i` (a `suffix` instance, a `spread` one still
//! reading `K#i`, an older release); once no live instance can read `K#i`, it closes, publishes
//! write copy 0 and the tagged names only (N names, not 2N − 1), and the `K#i` copies are
//! deleted. The protocol, and why it holds, is point 4 of the `placing` module doc; this file
//! is its state, the sweep that deletes `K#i`, and the refill a reader of `K#i` runs before it
//! serves a family whose window may have been closed.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::placing::{Sighting, Window, CODE_SPREAD_READING};
use super::{glob_escape, LayoutStores, Layouts};
use crate::error::{Error, ErrorKind, Result};
use crate::family::{Families, Family};
use crate::key::{CopyKey, Key, Placement};
use crate::store::{CopyRecord, CopyWrite};

/// The most copy names one scan of a family looks at (as the shrink sweep's).
pub(super) const SCAN_LIMIT: usize = 100_000;

/// How many keys the refill works on at once.
const REFILL_CONCURRENCY: usize = 32;

/// The window as `/v1/fleet`, the status page and the metric show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowState {
    /// The family writes `K#i` only (`suffix`): there is no window.
    None,
    /// The family writes the tagged names and `K#i` (2N − 1 names a publish).
    Open,
    /// The family writes copy 0 and the tagged names only (N names a publish).
    Closed,
}

/// What the watcher does about a family's window after a refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WindowStep {
    /// Nothing.
    Stay,
    /// Every live instance reads the tagged names: close the window when one scan covers the
    /// family's copy names.
    Close,
    /// The window has been closed for the settle time: delete the `K#i` copies.
    Sweep,
}

impl Layouts {
    /// The namings a publish of `family` writes (`K#0` is written once whatever the list):
    /// `K#i` only; `K#i` and the tagged names while this instance or another live one is
    /// configured `spread` (the window is open); the tagged names only once it closed.
    pub fn write_placements(&self, family: &Family) -> &'static [Placement] {
        let families = self.lock();
        let known = families.get(family.name());
        if known.is_some_and(|known| matches!(known.placing.window, Window::Closed { .. })) {
            return &[Placement::Spread];
        }
        let spread = family.placement == Placement::Spread
            || known.is_some_and(|known| known.placing.others_spread);
        if spread {
            &[Placement::Suffix, Placement::Spread]
        } else {
            &[Placement::Suffix]
        }
    }

    /// Where `family`'s compatibility window stands on this instance.
    pub fn window_state(&self, family: &Family) -> WindowState {
        match self.write_placements(family) {
            [Placement::Spread] => WindowState::Closed,
            [Placement::Suffix] => WindowState::None,
            _ => WindowState::Open,
        }
    }

    /// Whether `family`'s window may close or is due a sweep, after a refresh saw `seen`; an
    /// open condition reopens a closed window at once (this instance writes `K#i` from its next
    /// publish). The window may close when this instance is configured `spread` and reads the
    /// tagged names, the family has more than one copy, every instance of its live set is in
    /// its placement set, and every other member of the placement set reads the tagged names.
    pub(super) fn observe_window(
        &self,
        family: &str,
        seen: Sighting<'_>,
        settle: Duration,
        metrics: &crate::metrics::Metrics,
    ) -> WindowStep {
        let reading = self.reading.get(family) == Some(Placement::Spread);
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return WindowStep::Stay;
        };
        let closable = known.placing.configured == Placement::Spread
            && known.configured >= 2
            && reading
            && seen.missing.is_empty()
            && seen.codes.iter().all(|&code| code == CODE_SPREAD_READING);
        match (closable, known.placing.window) {
            (false, Window::Closed { .. }) => {
                known.placing.window = Window::Open;
                metrics.placement_window_closed(family, false);
                tracing::warn!(
                    family,
                    missing = ?seen.missing,
                    codes = ?seen.codes,
                    "the placement compatibility window reopened: a live instance reads K#i, so publishes write K#i again"
                );
                WindowStep::Stay
            }
            (true, Window::Open) => WindowStep::Close,
            (
                true,
                Window::Closed {
                    since,
                    swept: false,
                },
            ) if seen.at.saturating_duration_since(since) >= settle => WindowStep::Sweep,
            _ => WindowStep::Stay,
        }
    }

    /// Closes `family`'s window at `now`: its publishes stop writing `K#i`.
    pub(super) fn close_window(
        &self,
        family: &str,
        now: Instant,
        metrics: &crate::metrics::Metrics,
    ) {
        if let Some(known) = self.lock().get_mut(family) {
            known.placing.window = Window::Closed {
                since: now,
                swept: false,
            };
            metrics.placement_window_closed(family, true);
            tracing::info!(
                family,
                copies = known.configured,
                "the placement compatibility window closed: every live instance reads the tagged names, so publishes write N copies; K#i is deleted after the settle time"
            );
        }
    }

    /// Records that `family`'s `K#i` copies were deleted while its window was closed.
    pub(super) fn mark_swept(&self, family: &str) {
        if let Some(known) = self.lock().get_mut(family) {
            if let Window::Closed { since, .. } = known.placing.window {
                known.placing.window = Window::Closed { since, swept: true };
            }
        }
    }

    /// Whether `family`'s copy names were seen to be more than one scan covers within the last
    /// `every` (at `now`), so the window stays open without scanning again; records `now` when
    /// `too_many` says so.
    pub(super) fn window_scan_refused(
        &self,
        family: &str,
        now: Instant,
        every: Duration,
        too_many: Option<bool>,
    ) -> bool {
        let mut families = self.lock();
        let Some(known) = families.get_mut(family) else {
            return true;
        };
        if let Some(too_many) = too_many {
            known.placing.too_many_keys = too_many.then_some(now);
        }
        known
            .placing
            .too_many_keys
            .is_some_and(|at| now.saturating_duration_since(at) < every)
    }
}

/// The stored copy names of `family`'s keys (every naming), up to [`SCAN_LIMIT`], and whether
/// the scan saw them all.
pub(super) async fn scan_copy_names(
    stores: &LayoutStores,
    family: &Family,
) -> Result<(Vec<String>, bool)> {
    let pattern = format!("{}*#*", glob_escape(&family.prefix));
    let keys = stores.layouts.scan_keys(&pattern, SCAN_LIMIT).await?;
    let complete = keys.len() < SCAN_LIMIT;
    Ok((keys, complete))
}

/// Deletes every copy of `family`'s keys named under `placement` with an index of at least 1
/// (the tagged copies before a switch to them, `K#i` once the window closed), in batches as
/// the shrink sweep does. Returns how many existed and whether the scan saw every key.
pub(super) async fn delete_named_copies(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
    placement: Placement,
) -> Result<(u64, bool)> {
    let (keys, complete) = scan_copy_names(stores, family).await?;
    let named: Vec<CopyKey> = keys
        .iter()
        .filter_map(|stored| {
            let (key, copy_key) = CopyKey::parse(stored)?;
            let ours = families.resolve(&key).name() == family.name();
            (ours && copy_key.index() >= 1 && copy_key.placement() == placement).then_some(copy_key)
        })
        .collect();
    let mut deleted = 0;
    for batch in named.chunks(256) {
        deleted += stores.copies.delete_copies(batch).await?;
    }
    Ok((deleted, complete))
}

/// Writes the newest record of each of `family`'s keys (over `K#0` and its tagged copies) to
/// its `K#1..K#N-1` by the copies' compare-and-set, which keeps every version: a copy that
/// missed edits, or was deleted, while the window was closed is brought up to date, and a
/// newer publish that lands first is never moved back. Run by an instance that will read `K#i`
/// before it serves, after every writer has seen it (`reconcile`). Returns how many keys were
/// refilled and whether the scan saw every key.
///
/// # Errors
/// Store errors of the scan, a read or a write.
pub(super) async fn refill_suffix_copies(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
) -> Result<(u64, bool)> {
    let pattern = format!("{}*#0", glob_escape(&family.prefix));
    let names = stores.layouts.scan_keys(&pattern, SCAN_LIMIT).await?;
    let complete = names.len() < SCAN_LIMIT;
    let keys: Vec<Key> = names
        .iter()
        .filter_map(|stored| {
            let (key, copy_key) = CopyKey::parse(stored)?;
            (copy_key.index() == 0 && families.resolve(&key).name() == family.name()).then_some(key)
        })
        .collect();
    let mut refilled = 0;
    for batch in keys.chunks(REFILL_CONCURRENCY) {
        let batch = batch.iter().map(|key| refill_key(stores, family, key));
        for result in futures_util::future::join_all(batch).await {
            refilled += u64::from(result?);
        }
    }
    Ok((refilled, complete))
}

/// Refills `K#1..K#N-1` of `key` from its newest copy; whether there was one to copy.
async fn refill_key(stores: &LayoutStores, family: &Family, key: &Key) -> Result<bool> {
    let mut newest: Option<CopyRecord> = None;
    for index in 0..family.copies {
        let copy_key = key.copy_key(index, Placement::Spread);
        if let Some(record) = stores.copies.read_copy_stored(&copy_key).await? {
            if newest.as_ref().is_none_or(|held| record.supersedes(held)) {
                newest = Some(record);
            }
        }
    }
    // Nothing served: a reader of `K#i` falls back to copy 0, which says the same.
    let Some(newest) = newest.filter(|record| record.expire_at_ms > crate::store::now_unix_ms())
    else {
        return Ok(false);
    };
    let writes: Vec<CopyWrite> = (1..family.copies)
        .map(|index| CopyWrite {
            copy_key: key.copy_key(index, Placement::Suffix),
            version: newest.version,
            payload: newest.payload.clone(),
            expire_at_ms: newest.expire_at_ms,
        })
        .collect();
    let results = stores.copies.write_copies(&writes).await;
    let failed: Vec<CopyKey> = writes
        .iter()
        .zip(&results)
        .filter(|(_, result)| result.outcome.is_err())
        .map(|(write, _)| write.copy_key.clone())
        .collect();
    if failed.is_empty() {
        return Ok(true);
    }
    // A copy the refill cannot write (a corrupt record, say) is deleted instead: a reader that
    // finds it missing falls back to copy 0, which is current.
    tracing::warn!(%key, copies = failed.len(), "cannot refill K#i copies: deleting them");
    stores.copies.delete_copies(&failed).await.map_err(|err| {
        Error::new(
            ErrorKind::Unavailable,
            format!("refill of {key}'s K#i copies: neither written nor deleted: {err}"),
        )
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::placing::{CODE_SPREAD_PENDING, CODE_SUFFIX};
    use super::super::Liveness;
    use super::*;
    use crate::family::fixture;
    use crate::metrics::Metrics;
    use crate::store::memory::MemoryStore;
    use crate::store::{CopyStore, Payload};

    const CONFIG: &str =
        "[[family]]\nprefix = \"s:\"\ncopies = 4\nplacement = \"spread\"\n[[family]]\nprefix = \"x:\"\ncopies = 4\nplacement = \"suffix\"\n";

    async fn layouts(store: &Arc<MemoryStore>) -> Arc<Layouts> {
        let liveness = Liveness {
            instance: "a".to_owned(),
            release: "0.1.0".to_owned(),
            interval: Duration::from_secs(1),
            command_timeout: Duration::from_millis(1),
        };
        Layouts::reconcile(
            &LayoutStores::of(store),
            &fixture::families(CONFIG),
            &Metrics::new(),
            &liveness,
        )
        .await
        .unwrap()
    }

    fn family(name: &str) -> Family {
        fixture::families(CONFIG)
            .resolve(&Key::parse(&format!("{name}1")).unwrap())
            .clone()
    }

    fn write(copy_key: CopyKey, version: u64) -> CopyWrite {
        CopyWrite {
            copy_key,
            version: crate::key::Version::new(version).unwrap(),
            payload: Payload::Value(bytes::Bytes::from(format!("v{version}"))),
            expire_at_ms: crate::store::now_unix_ms() + 60_000,
        }
    }

    #[tokio::test]
    async fn the_window_closes_only_when_every_live_instance_reads_tagged_names_and_reopens_at_once(
    ) {
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let layouts = layouts(&store).await;
        let settle = Duration::from_secs(10);
        let now = Instant::now();
        let spread = family("s:");
        let step = |missing: &[String], codes: &[u32], at: Instant| {
            layouts.observe_window("s:", Sighting { missing, codes, at }, settle, &metrics)
        };
        // Still reading K#i: the window stays open, K#i and the tagged names are written.
        assert_eq!(step(&[], &[], now), WindowStep::Stay);
        assert_eq!(
            layouts.write_placements(&spread),
            &[Placement::Suffix, Placement::Spread]
        );
        assert_eq!(layouts.window_state(&spread), WindowState::Open);
        layouts.start_reading_spread("s:", &metrics);
        // Another instance that reads K#i, or an older release: open.
        let older = ["older".to_owned()];
        for codes in [&[CODE_SUFFIX][..], &[CODE_SPREAD_PENDING], &[3, 2]] {
            assert_eq!(step(&[], codes, now), WindowStep::Stay, "{codes:?}");
        }
        assert_eq!(step(&older, &[3], now), WindowStep::Stay);
        // Alone, or beside readers of the tagged names only: it may close.
        assert_eq!(step(&[], &[3, 3], now), WindowStep::Close);
        layouts.close_window("s:", now, &metrics);
        assert_eq!(layouts.write_placements(&spread), &[Placement::Spread]);
        assert_eq!(layouts.window_state(&spread), WindowState::Closed);
        assert!(metrics
            .render()
            .contains(r#"hotsplit_placement_window_closed{family="s:"} 1"#));
        // The sweep waits the settle time after the close, and runs once.
        assert_eq!(step(&[], &[3], now), WindowStep::Stay);
        assert_eq!(step(&[], &[3], now + settle), WindowStep::Sweep);
        layouts.mark_swept("s:");
        assert_eq!(step(&[], &[3], now + settle), WindowStep::Stay);
        // A suffix instance joins: K#i is written again from the next publish.
        assert_eq!(step(&[], &[3, CODE_SUFFIX], now + settle), WindowStep::Stay);
        assert_eq!(
            layouts.write_placements(&spread),
            &[Placement::Suffix, Placement::Spread]
        );
        assert!(metrics
            .render()
            .contains(r#"hotsplit_placement_window_closed{family="s:"} 0"#));
        // A suffix family has no window.
        let suffix = family("x:");
        assert_eq!(layouts.window_state(&suffix), WindowState::None);
        let step_x = layouts.observe_window(
            "x:",
            Sighting {
                missing: &[],
                codes: &[],
                at: now,
            },
            settle,
            &metrics,
        );
        assert_eq!(step_x, WindowStep::Stay);
    }

    #[tokio::test]
    async fn the_sweep_deletes_k_i_and_the_refill_brings_it_back_without_moving_a_copy_back() {
        let store = Arc::new(MemoryStore::new());
        let stores = LayoutStores::of(&store);
        let families = fixture::families(CONFIG);
        let spread = family("s:");
        let key = Key::parse("s:1").unwrap();
        let other = Key::parse("x:1").unwrap();
        let mut writes = Vec::new();
        for index in 0..4 {
            writes.push(write(key.copy_key(index, Placement::Suffix), 1));
            writes.push(write(key.copy_key(index, Placement::Spread), 1));
            writes.push(write(other.copy_key(index, Placement::Suffix), 1));
        }
        store.write_copies(&writes).await;
        let (deleted, complete) =
            delete_named_copies(&stores, &families, &spread, Placement::Suffix)
                .await
                .unwrap();
        assert_eq!((deleted, complete), (3, true));
        let version = |copy_key: CopyKey| {
            let store = store.clone();
            async move {
                store
                    .read_copy_stored(&copy_key)
                    .await
                    .unwrap()
                    .map(|record| record.version.get())
            }
        };
        assert_eq!(version(key.copy_key(1, Placement::Suffix)).await, None);
        assert_eq!(version(key.copy_key(0, Placement::Suffix)).await, Some(1));
        assert_eq!(version(other.copy_key(1, Placement::Suffix)).await, Some(1));
        // Edits while closed reach copy 0 and the tagged names; one stale K#2 came back (a
        // late retry), and K#3 already holds a newer version (a publish after the reopen).
        let mut later: Vec<CopyWrite> = (0..4)
            .map(|index| write(key.copy_key(index, Placement::Spread), 5))
            .collect();
        later.push(write(key.copy_key(2, Placement::Suffix), 2));
        later.push(write(key.copy_key(3, Placement::Suffix), 6));
        store.write_copies(&later).await;
        let (refilled, complete) = refill_suffix_copies(&stores, &families, &spread)
            .await
            .unwrap();
        assert_eq!((refilled, complete), (1, true));
        for (index, want) in [(1, 5), (2, 5), (3, 6)] {
            assert_eq!(
                version(key.copy_key(index, Placement::Suffix)).await,
                Some(want),
                "K#{index}"
            );
        }
    }

    #[tokio::test]
    async fn the_delete_removes_tagged_copies_of_its_family_only() {
        let store = Arc::new(MemoryStore::new());
        let families = fixture::families(CONFIG);
        let write = |name: CopyKey| CopyWrite {
            copy_key: name,
            version: crate::key::Version::new(1).unwrap(),
            payload: Payload::Value(bytes::Bytes::new()),
            expire_at_ms: crate::store::now_unix_ms() + 60_000,
        };
        let mut writes = Vec::new();
        for key in ["s:1", "x:1"] {
            let key = Key::parse(key).unwrap();
            for index in 0..4 {
                writes.push(write(key.copy_key(index, Placement::Suffix)));
                writes.push(write(key.copy_key(index, Placement::Spread)));
            }
        }
        store.write_copies(&writes).await;
        let family = families.resolve(&Key::parse("s:1").unwrap()).clone();
        let (deleted, complete) = delete_named_copies(
            &LayoutStores::of(&store),
            &families,
            &family,
            Placement::Spread,
        )
        .await
        .unwrap();
        assert_eq!((deleted, complete), (3, true));
        for write in &writes {
            let present = store
                .read_copy(&write.copy_key)
                .await
                .record
                .unwrap()
                .is_some();
            let gone =
                write.copy_key.base() == "s:1" && write.copy_key.placement() == Placement::Spread;
            assert_eq!(present, !gone, "{}", write.copy_key);
        }
    }
}
