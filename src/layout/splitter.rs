//! The split driver: the background task that refreshes the index of split keys every layout
//! interval and moves each key through the protocol of [`crate::split`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Layouts;
use crate::error::{Error, ErrorKind, Result};
use crate::family::{Families, Family};
use crate::hot::HotKeys;
use crate::key::{CopyKey, Key};
use crate::placement::Placement;
use crate::split::record::{decide, Facts, Phase, SplitRecord, Step};
use crate::split::{SplitConfig, SplitMode};
use crate::store::{
    now_unix_ms, CopyRecord, CopyStore, CopyWrite, LayoutStore, LiveMember, SplitStore,
};

/// A stage of one key (copies, phase, since) and when this instance first saw it.
type Stage = ((u32, Phase, u64), Instant);

/// What the driver remembers between ticks.
#[derive(Default)]
struct Memory {
    /// (family, key) → the stage last seen and since when: the settle time counts from it.
    stages: HashMap<(String, String), Stage>,
    /// Family → when this instance started its recent splits (the last minute's).
    started: HashMap<String, VecDeque<Instant>>,
}

/// Moves split keys through the protocol; see the module documentation of [`crate::split`].
pub struct Splitter {
    /// The split records.
    store: Arc<dyn SplitStore>,
    /// The live sets: this instance keeps itself in each family's *split set* (the live set
    /// named `#split#<family>`), so the others can tell whether every live instance knows of
    /// per-key layouts.
    live: Arc<dyn LayoutStore>,
    /// This process's name in the live sets.
    instance: String,
    /// The copies filled and deleted.
    copies: Arc<dyn CopyStore>,
    /// The index (in [`Layouts::splits`]) and the copy names of each family.
    layouts: Arc<Layouts>,
    /// The families.
    families: Arc<Families>,
    /// Family name → its `split` table (families without one never start a split, but move
    /// the records others made).
    policies: BTreeMap<String, SplitConfig>,
    /// The detector; `None`: nothing is ever hot here.
    hot: Option<Arc<HotKeys>>,
    /// How often the records are re-read (`heal.layout_interval`).
    interval: Duration,
    /// The resize protocol's settle time (`heal::Liveness::settle`).
    settle: Duration,
    /// Between ticks.
    memory: Mutex<Memory>,
}

/// What [`decide`] chose for one key, and the record it chose from.
#[derive(Debug, Clone, Copy)]
struct Decision {
    /// The record read this tick; `None`: the key is not split.
    record: Option<SplitRecord>,
    /// The move to carry out.
    step: Step,
}

/// The name of `family`'s split set among the live sets.
fn split_set(family: &str) -> String {
    format!("#split#{family}")
}

/// Keeps `instance` in `family`'s split set for 3 × `interval` (like a live entry) and returns
/// the other members.
async fn join_split_set(
    live: &dyn LayoutStore,
    family: &str,
    instance: &str,
    interval: Duration,
) -> Result<Vec<LiveMember>> {
    let ttl_ms = crate::duration::millis(interval * 3);
    live.join_live(&split_set(family), 1, instance, ttl_ms)
        .await
}

/// Joins every family's split set: called at startup *before* the family live sets are joined,
/// so no other instance ever sees this one live in a family without knowing it splits.
pub async fn join_split_sets(
    live: &dyn LayoutStore,
    families: &Families,
    instance: &str,
    interval: Duration,
) {
    for family in families.iter() {
        if let Err(err) = join_split_set(live, family.name(), instance, interval).await {
            tracing::warn!(family = family.name(), error = %err, "cannot join the split set; retried every layout interval");
        }
    }
}

/// The cool-down of families with no `split` table, for records another instance made.
const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(60);

/// What a [`Splitter`] is made of (see its fields).
pub struct SplitterParts {
    /// The split records.
    pub store: Arc<dyn SplitStore>,
    /// The live sets (the split sets among them).
    pub live: Arc<dyn LayoutStore>,
    /// This process's name in the live sets.
    pub instance: String,
    /// The copies filled and deleted.
    pub copies: Arc<dyn CopyStore>,
    /// The index and the copy names of each family.
    pub layouts: Arc<Layouts>,
    /// The families.
    pub families: Arc<Families>,
    /// Family name → its `split` table.
    pub policies: BTreeMap<String, SplitConfig>,
    /// The detector; `None`: nothing is ever hot here.
    pub hot: Option<Arc<HotKeys>>,
    /// How often the records are re-read (`heal.layout_interval`).
    pub interval: Duration,
    /// The resize protocol's settle time (`Liveness::settle`).
    pub settle: Duration,
}

impl Splitter {
    /// A driver over `parts.families`, each with its `split` table in `parts.policies` (by
    /// family name).
    pub fn new(parts: SplitterParts) -> Splitter {
        let SplitterParts {
            store,
            live,
            instance,
            copies,
            layouts,
            families,
            policies,
            hot,
            interval,
            settle,
        } = parts;
        layouts.splits().set_policies(policies.clone());
        // Until its records are read, a publish to a family is refused: it could miss the
        // split copies other instances read (`SplitIndex::ensure_read`).
        layouts
            .splits()
            .expect(families.iter().map(|family| family.name()));
        Splitter {
            store,
            live,
            instance,
            copies,
            layouts,
            families,
            policies,
            hot,
            interval,
            settle,
            memory: Mutex::default(),
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads every family's records into the index, once. Called at startup before the
    /// instance serves, and on every tick.
    ///
    /// # Errors
    /// The first family whose records cannot be read (the others are still read; the index of
    /// that family keeps what it had).
    pub async fn load(&self) -> Result<()> {
        let mut failed = None;
        for family in self.families.iter() {
            let name = family.name();
            let read_at = Instant::now();
            match self.store.read_splits(name).await {
                Ok(fields) => {
                    let mut records = HashMap::with_capacity(fields.len());
                    for (key, text) in fields {
                        match SplitRecord::decode(&text) {
                            Some(record) => {
                                records.insert(key, record);
                            }
                            None => tracing::warn!(
                                family = name,
                                key = %key,
                                text = %text,
                                "a split record is corrupt; ignored"
                            ),
                        }
                    }
                    self.layouts.splits().load(name, records, read_at);
                }
                Err(err) => {
                    tracing::warn!(family = name, error = %err, "cannot read the split records; keeping the last ones");
                    failed.get_or_insert(err);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Runs until `shutdown`, one tick every layout interval.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => self.tick(Instant::now()).await,
            }
        }
    }

    /// Re-reads the records, then moves every key that has a record or is hot here, once.
    pub async fn tick(&self, now: Instant) {
        if self.load().await.is_err() {
            // Moves wait for a fresh view: a move from a stale one would fail its
            // compare-and-set anyway.
            return;
        }
        let (rates, other_hot) = match &self.hot {
            Some(hot) => {
                let window = hot.last_window();
                let rates: HashMap<String, f64> = window
                    .keys
                    .iter()
                    .filter(|rate| rate.hot)
                    .map(|rate| (rate.key.clone(), rate.rate))
                    .collect();
                (rates, window.other_hot.into_iter().collect::<HashSet<_>>())
            }
            None => (HashMap::new(), HashSet::new()),
        };
        let mut seen_stages = HashSet::new();
        for family in self.families.iter() {
            let name = family.name().to_owned();
            let aware = self.every_live_instance_splits(&name).await;
            let policy = self.policies.get(&name).filter(|_| aware);
            let records = self.layouts.splits().family(&name);
            let mut keys: Vec<String> = records.keys().cloned().collect();
            if policy.is_some_and(|policy| policy.mode == SplitMode::Split) {
                for key in rates.keys().chain(other_hot.iter()) {
                    if !records.contains_key(key) && self.family_of(key) == Some(name.as_str()) {
                        keys.push(key.clone());
                    }
                }
            }
            keys.sort();
            keys.dedup();
            for key in keys {
                let hot = self.hot_here(policy, &key, &rates, &other_hot);
                let record = records.get(&key).copied();
                // Kept past this tick: the stage of the record, or of the one this tick writes.
                seen_stages.insert((name.clone(), key.clone()));
                if let Some(record) = &record {
                    self.note_stage(&name, &key, record, now);
                }
                let split_keys = self.layouts.splits().count(&name);
                let facts = Facts {
                    hot,
                    may_start: self.may_start(&name, policy, split_keys, now),
                    settled: record.is_some_and(|record| self.settled(&name, &key, &record, now)),
                    all_aware: aware,
                    now_ms: now_unix_ms(),
                    cool_down: policy.map_or(DEFAULT_COOL_DOWN, |policy| policy.cool_down),
                    max_copies: policy.map_or(0, |policy| policy.max_copies),
                };
                let step = decide(record.as_ref(), &facts);
                let decision = Decision { record, step };
                if let Err(err) = self.apply(family, &key, decision, now).await {
                    tracing::warn!(family = %name, key = %key, error = %err, "a split move failed; retried on the next tick");
                }
            }
        }
        let mut memory = self.memory();
        memory.stages.retain(|id, _| seen_stages.contains(id));
    }

    /// Refreshes this instance in `family`'s split set and tells whether every other live
    /// instance of the family is in it too (runs a release that knows of per-key layouts).
    /// `false` when the refresh fails: no split starts or admits readers on a view it cannot
    /// check.
    async fn every_live_instance_splits(&self, family: &str) -> bool {
        match join_split_set(&*self.live, family, &self.instance, self.interval).await {
            Ok(others) => {
                // Names, not counts: a member of the split set whose live entry lapsed first
                // must not stand in for an older release in the live set.
                let missing = LiveMember::missing_from(&self.layouts.live_members(family), &others);
                if !missing.is_empty() {
                    tracing::debug!(
                        family,
                        ?missing,
                        "a live instance does not know of per-key layouts: no split admits readers"
                    );
                }
                missing.is_empty()
            }
            Err(err) => {
                tracing::debug!(family, error = %err, "cannot refresh the split set");
                false
            }
        }
    }

    /// The family name of `raw`, when it is a valid key.
    fn family_of(&self, raw: &str) -> Option<&str> {
        let key = Key::parse(raw).ok()?;
        Some(self.families.resolve(&key).name())
    }

    /// Whether `key` is hot here at its family's split threshold, in a family that splits.
    fn hot_here(
        &self,
        policy: Option<&SplitConfig>,
        key: &str,
        rates: &HashMap<String, f64>,
        other_hot: &HashSet<String>,
    ) -> bool {
        let Some(policy) = policy.filter(|policy| policy.mode == SplitMode::Split) else {
            return false;
        };
        match rates.get(key) {
            Some(&rate) => rate >= policy.threshold,
            None => other_hot.contains(key),
        }
    }

    /// Whether a new split of `family` may start now.
    fn may_start(
        &self,
        family: &str,
        policy: Option<&SplitConfig>,
        split_keys: usize,
        now: Instant,
    ) -> bool {
        let Some(policy) = policy else {
            return false;
        };
        if split_keys >= policy.max_split_keys {
            return false;
        }
        let mut memory = self.memory();
        let started = memory.started.entry(family.to_owned()).or_default();
        while started
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= Duration::from_secs(60))
        {
            started.pop_front();
        }
        started.len() < policy.max_splits_per_minute as usize
    }

    /// Remembers when this instance first saw `record`'s stage.
    fn note_stage(&self, family: &str, key: &str, record: &SplitRecord, now: Instant) {
        let mut memory = self.memory();
        let entry = memory
            .stages
            .entry((family.to_owned(), key.to_owned()))
            .or_insert((record.stage(), now));
        if entry.0 != record.stage() {
            *entry = (record.stage(), now);
        }
    }

    /// Whether this instance has seen `record`'s stage for the settle time.
    fn settled(&self, family: &str, key: &str, record: &SplitRecord, now: Instant) -> bool {
        self.memory()
            .stages
            .get(&(family.to_owned(), key.to_owned()))
            .is_some_and(|(stage, since)| {
                *stage == record.stage() && now.saturating_duration_since(*since) >= self.settle
            })
    }

    /// Carries out `decision.step` for `key` (whose record was `decision.record`).
    async fn apply(
        &self,
        family: &Family,
        key: &str,
        decision: Decision,
        now: Instant,
    ) -> Result<()> {
        let Decision { record, step } = decision;
        let name = family.name();
        let expected = record.map(|record| record.encode());
        match step {
            Step::Stay => Ok(()),
            Step::Record(next) => {
                if self
                    .swap(name, key, expected.as_deref(), Some(next))
                    .await?
                {
                    if record.is_none() {
                        self.memory()
                            .started
                            .entry(name.to_owned())
                            .or_default()
                            .push_back(now);
                    }
                    if record.map(|record| record.stage()) != Some(next.stage()) {
                        tracing::info!(
                            family = name,
                            key,
                            copies = next.copies,
                            phase = next.phase.as_str(),
                            "split key moved"
                        );
                    }
                }
                Ok(())
            }
            Step::FillThenRecord(next) => {
                let key_parsed = Key::parse(key)?;
                self.fill(family, &key_parsed, next.copies).await?;
                if self
                    .swap(name, key, expected.as_deref(), Some(next))
                    .await?
                {
                    tracing::info!(
                        family = name,
                        key,
                        copies = next.copies,
                        "split key filled; reads now use its copies"
                    );
                }
                Ok(())
            }
            Step::DeleteThenRemove => {
                let Some(record) = record else {
                    return Ok(());
                };
                let key_parsed = Key::parse(key)?;
                let mut removed: Vec<CopyKey> = Vec::new();
                for index in family.copies.max(1)..record.copies {
                    for placement in [Placement::Suffix, Placement::Spread] {
                        removed.push(key_parsed.copy_key(index, placement));
                    }
                }
                self.copies.delete_copies(&removed).await?;
                if self.swap(name, key, expected.as_deref(), None).await? {
                    tracing::info!(
                        family = name,
                        key,
                        "split key merged; its extra copies are deleted"
                    );
                }
                Ok(())
            }
        }
    }

    /// The compare-and-set of `key`'s record, and the index and stage after it.
    async fn swap(
        &self,
        family: &str,
        key: &str,
        expected: Option<&str>,
        next: Option<SplitRecord>,
    ) -> Result<bool> {
        let text = next.map(|record| record.encode());
        let applied = self
            .store
            .swap_split(family, key, expected, text.as_deref())
            .await?;
        if applied {
            self.layouts.splits().set(family, key, next);
            let id = (family.to_owned(), key.to_owned());
            // The settle time of the stage written counts from now, once the write has landed.
            let landed = Instant::now();
            let mut memory = self.memory();
            match next {
                Some(record) => {
                    let entry = memory.stages.entry(id).or_insert((record.stage(), landed));
                    if entry.0 != record.stage() {
                        *entry = (record.stage(), landed);
                    }
                }
                None => {
                    memory.stages.remove(&id);
                }
            }
        }
        Ok(applied)
    }

    /// Writes the newest of the family's copies of `key` (read from their primaries) to the
    /// copies `family.copies..copies`, by the copies' compare-and-set.
    async fn fill(&self, family: &Family, key: &Key, copies: u32) -> Result<()> {
        let read_placement = self
            .layouts
            .read_placement(family.name())
            .unwrap_or(family.placement);
        let mut newest: Option<CopyRecord> = None;
        for index in 0..family.copies {
            let copy_key = key.copy_key(index, read_placement);
            if let Some(record) = self.copies.read_copy_stored(&copy_key).await? {
                if newest.as_ref().is_none_or(|held| record.supersedes(held)) {
                    newest = Some(record);
                }
            }
        }
        let Some(newest) = newest else {
            // Nothing stored: nothing to fill (a read of a missing copy asks copy 0).
            return Ok(());
        };
        let placements = self.layouts.write_placements(family);
        let mut writes: Vec<CopyWrite> = Vec::new();
        for index in family.copies.max(1)..copies {
            for &placement in placements {
                writes.push(CopyWrite {
                    copy_key: key.copy_key(index, placement),
                    version: newest.version,
                    payload: newest.payload.clone(),
                    expire_at_ms: newest.expire_at_ms,
                });
            }
        }
        for result in self.copies.write_copies(&writes).await {
            if let Err(err) = result.outcome {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("fill of {key}'s split copies on {}: {err}", result.node),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;

    use super::{Splitter, SplitterParts};
    use crate::family::fixture;
    use crate::key::{Key, Version};
    use crate::layout::Layouts;
    use crate::placement::Placement;
    use crate::split::{Phase, SplitRecord};
    use crate::store::memory::MemoryStore;
    use crate::store::{CopyStore, CopyWrite, Payload, SplitStore};

    fn splitter(store: &Arc<MemoryStore>, layouts: &Arc<Layouts>) -> Splitter {
        Splitter::new(SplitterParts {
            store: store.clone(),
            live: store.clone(),
            instance: "test-instance".to_owned(),
            copies: store.clone(),
            layouts: layouts.clone(),
            families: Arc::new(fixture::families("[[family]]\nprefix = \"p:\"\ncopies = 1")),
            policies: BTreeMap::new(),
            hot: None,
            interval: Duration::from_secs(1),
            settle: Duration::ZERO,
        })
    }

    async fn version_of(store: &MemoryStore, key: &Key, index: u32) -> Option<u64> {
        store
            .read_copy_stored(&key.copy_key(index, Placement::Suffix))
            .await
            .unwrap()
            .map(|record| record.version.get())
    }

    #[tokio::test]
    async fn a_settled_split_is_filled_before_readers_come_and_a_drained_one_is_deleted() {
        let store = Arc::new(MemoryStore::new());
        let layouts = Layouts::unrecorded();
        let key = Key::parse("p:k").unwrap();
        let write = CopyWrite {
            copy_key: key.copy_key(0, Placement::Suffix),
            version: Version::new(5).unwrap(),
            payload: Payload::Value(Bytes::from_static(b"five")),
            expire_at_ms: crate::store::now_unix_ms() + 60_000,
        };
        assert!(store.write_copies(&[write]).await[0].outcome.is_ok());
        let writing = SplitRecord {
            copies: 4,
            phase: Phase::Writing,
            since_ms: 1,
            seen_ms: crate::store::now_unix_ms(),
        };
        assert!(store
            .swap_split("p:", "p:k", None, Some(&writing.encode()))
            .await
            .unwrap());
        let splitter = splitter(&store, &layouts);
        splitter.tick(Instant::now()).await;
        // Settled (no settle time here): filled at the current version, then readers admitted.
        for index in 1..4 {
            assert_eq!(
                version_of(&store, &key, index).await,
                Some(5),
                "copy {index}"
            );
        }
        assert_eq!(layouts.splits().read_copies("p:", "p:k"), Some(4));
        assert_eq!(layouts.key_read_copies("p:", "p:k", 1), 4);
        assert_eq!(layouts.key_write_copies("p:", "p:k", 1), 4);
        let stored = store.read_splits("p:").await.unwrap();
        assert!(stored[0].1.starts_with("4:r:"), "{stored:?}");

        let draining = SplitRecord {
            phase: Phase::Draining,
            since_ms: 10,
            ..writing
        };
        assert!(store
            .swap_split("p:", "p:k", Some(&stored[0].1), Some(&draining.encode()))
            .await
            .unwrap());
        // Settled at once (no settle time here): the extra copies go, then the record.
        splitter.tick(Instant::now()).await;
        splitter.tick(Instant::now()).await;
        for index in 1..4 {
            assert_eq!(version_of(&store, &key, index).await, None, "copy {index}");
        }
        assert_eq!(version_of(&store, &key, 0).await, Some(5), "copy 0 stays");
        assert!(store.read_splits("p:").await.unwrap().is_empty());
        assert_eq!(layouts.key_write_copies("p:", "p:k", 1), 1);
    }

    #[tokio::test]
    async fn a_lost_compare_and_set_changes_nothing() {
        let store = Arc::new(MemoryStore::new());
        let record = "4:w:1:1";
        assert!(store
            .swap_split("p:", "p:k", None, Some(record))
            .await
            .unwrap());
        assert!(!store
            .swap_split("p:", "p:k", None, Some("4:r:2:2"))
            .await
            .unwrap());
        assert!(!store
            .swap_split("p:", "p:k", Some("4:m:1:1"), None)
            .await
            .unwrap());
        assert_eq!(
            store.read_splits("p:").await.unwrap(),
            vec![("p:k".to_owned(), record.to_owned())]
        );
    }
}
