//! The audit's I/O: find copy keys with `SCAN`, choose the sample, read every copy everywhere.
//!
//! **Scan.** Every primary is scanned at once, one `SCAN … MATCH <pattern> COUNT <n> TYPE hash`
//! page per primary per step, so the sample is spread over the primaries. The pattern is
//! `*#*`, or `<prefix>*#*` with the prefix's glob characters escaped. A scanned key is a copy key
//! when it is `K#i` with `K` a valid key and `i` a canonical decimal below 1024; anything else
//! (version counters `K#v`, layout records, foreign keys) is skipped. Copy keys are grouped by
//! `K`; the scan stops once the sample is full or every primary is done.
//!
//! **Copy count.** N comes from the config's families, from `--copies`, or is inferred as the
//! highest index seen + 1. With the config, the split records of each family with a `split`
//! table are read first (one `HGETALL #hotsplit#splits#<family>` on the primary that owns it,
//! [`read_split_layouts`]): a split key's N is its split copies while publishes write them
//! (phases writing, reading, leaving), and no copy within its split count is a stray (while
//! draining those copies wait to be deleted, so they are neither read nor strays); one beyond
//! it is (left by a merge that did not finish). A family whose records cannot be read is
//! audited as if none of its keys were split (logged). An inferred count needs every copy of the key, so then the scan goes
//! on to the end once the sample is full, for the sampled keys only (give `--copies` or
//! `--config` to stop a long scan at the sample size). Keys whose N is 1 are not split and are skipped; copies seen at or beyond N (or, of a split key, its
//! split count) are counted as stray (left by a shrink, deleted by the service's sweep).
//!
//! **Read.** For each sampled key every copy `K#0..K#N-1` is read (`HMGET ver tomb exp`) on the
//! primary that owns its slot and on each of that primary's replicas, all of the key's reads at
//! once, so a copy's primary and replica reads are as close in time as the network allows. A
//! pacer holds the copy reads to `--rate` per second; at most [`KEYS_IN_FLIGHT`] keys are read at
//! a time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};

use super::figures::{CopyObservation, CopyState, KeySample, ReadRole};
use super::{AuditOptions, CopyCount, Phase, Progress};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Families;
use crate::family::MAX_COPIES;
use crate::key::{CopyKey, Key, Placement};
use crate::split::SplitRecord;
use crate::store::redis::ReadOnlyNodes;
use crate::store::NodeLabel;

/// How many keys are read at once (their reads are paced all the same).
pub(crate) const KEYS_IN_FLIGHT: usize = 16;

/// How often progress is reported at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the scan found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sampled {
    /// The sampled keys with their copy count N (at least 2) and the placement their copies
    /// are named by, in the order the scan found them.
    pub(crate) keys: Vec<(Key, u32, Placement)>,
    /// Keys returned by SCAN (copy keys or not, repeats included).
    pub(crate) scanned: u64,
    /// Whether every primary was scanned to the end (the sample holds every split key).
    pub(crate) complete: bool,
    /// Keys skipped because their copy count is 1.
    pub(crate) unsplit_keys: u64,
    /// Copies of sampled keys seen at an index at or beyond N, or under a tagged name in a
    /// `suffix` family.
    pub(crate) stray_copies: u64,
}

/// Splits a stored key into its user key, copy index and the placement its name follows, when
/// it is a copy name ([`CopyKey::parse`]: `K#i`, or `K#i{t}` with the tag `spread` gives it)
/// with an index below the largest copy count.
pub(crate) fn parse_copy_key(raw: &str) -> Option<(Key, u32, Placement)> {
    let (key, copy) = CopyKey::parse(raw)?;
    (copy.index() < MAX_COPIES).then(|| (key, copy.index(), copy.placement()))
}

/// The SCAN pattern of copy keys, of every key or of keys starting with `prefix`.
pub(crate) fn scan_pattern(prefix: Option<&str>) -> String {
    let mut pattern = String::new();
    for c in prefix.unwrap_or_default().chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str("*#*");
    pattern
}

/// The split keys of the config's families, with their records.
pub(crate) type SplitLayouts = HashMap<Key, SplitRecord>;

/// Reads the split records of every family of `families` with a `split` table. A family whose
/// records cannot be read is left out, with a warning: its split keys' extra copies then count
/// as strays, as they did before audits knew of splits.
pub(crate) async fn read_split_layouts(nodes: &ReadOnlyNodes, families: &Families) -> SplitLayouts {
    let mut layouts = SplitLayouts::new();
    for family in families.iter().filter(|family| family.split.is_some()) {
        let name = family.name();
        match nodes.read_split_records(name).await {
            Ok(fields) => layouts.extend(split_layouts_of(families, name, fields)),
            Err(err) => tracing::warn!(
                family = name,
                error = %err,
                "cannot read the split records: this family's split copies count as strays"
            ),
        }
    }
    layouts
}

/// The split keys of `family` in its records `fields` (key, record text): those that parse,
/// are valid keys and belong to `family`.
fn split_layouts_of(
    families: &Families,
    family: &str,
    fields: Vec<(String, String)>,
) -> Vec<(Key, SplitRecord)> {
    fields
        .into_iter()
        .filter_map(|(key, text)| {
            let key = Key::parse(&key).ok()?;
            let record = SplitRecord::decode(&text)?;
            (families.resolve(&key).name() == family).then_some((key, record))
        })
        .collect()
}

/// A key seen by the scan.
#[derive(Debug)]
struct Candidate {
    /// The copy indexes seen, in scan order (repeats possible), with the placement each name
    /// follows.
    indexes: Vec<(u32, Placement)>,
    /// Its copy count, when known from the config or the flag.
    copies: Option<u32>,
    /// The first index that is a stray, when above `copies`: the split count of a split key.
    strays_from: Option<u32>,
    /// Its family's placement, when known from the config.
    placement: Option<Placement>,
}

/// Keys found so far, in the order they were first seen.
#[derive(Debug, Default)]
struct Candidates {
    /// Keys in the order they were first seen (known unsplit keys left out).
    order: Vec<Key>,
    /// What was seen of each key.
    by_key: HashMap<Key, Candidate>,
    /// Keys skipped because their known copy count is 1.
    unsplit: u64,
    /// Once set, only keys already seen are updated: the scan goes on only to find more copy
    /// indexes of them (inferred copy counts).
    frozen: bool,
}

impl Candidates {
    /// Records the copy `index` of `key`, named under `placement`; `splits` are the split keys
    /// (with a config's copy counts only).
    fn add(
        &mut self,
        key: Key,
        (index, placement): (u32, Placement),
        copies: &CopyCount,
        splits: &SplitLayouts,
    ) {
        if let Some(candidate) = self.by_key.get_mut(&key) {
            candidate.indexes.push((index, placement));
            return;
        }
        if self.frozen {
            return;
        }
        let (known, known_placement, strays_from) = match copies {
            CopyCount::Config(families) => {
                let family = families.resolve(&key);
                let split = splits.get(&key);
                let written = split
                    .filter(|record| record.phase.writes())
                    .map_or(family.copies, |record| record.copies.max(family.copies));
                let layout = split.map_or(written, |record| record.copies.max(written));
                // A family whose config names no placement was given one at its instances'
                // startup: inferred from the names seen, as without a config.
                let placement = (family.placement_reason
                    == crate::placement::PlacementReason::Configured)
                    .then_some(family.placement);
                (Some(written), placement, Some(layout))
            }
            CopyCount::Fixed(copies) => (Some(*copies), None, None),
            CopyCount::Inferred => (None, None, None),
        };
        if known == Some(1) {
            self.unsplit += 1;
            // Remember it (with no indexes) so it is counted once.
            self.by_key.insert(
                key,
                Candidate {
                    indexes: Vec::new(),
                    copies: known,
                    strays_from,
                    placement: known_placement,
                },
            );
            return;
        }
        self.order.push(key.clone());
        self.by_key.insert(
            key,
            Candidate {
                indexes: vec![(index, placement)],
                copies: known,
                strays_from,
                placement: known_placement,
            },
        );
    }

    /// The copy count of a candidate: known, or the highest index seen + 1.
    fn copies(candidate: &Candidate) -> u32 {
        candidate.copies.unwrap_or_else(|| {
            candidate
                .indexes
                .iter()
                .map(|(index, _)| *index)
                .max()
                .map_or(0, |highest| highest + 1)
        })
    }

    /// The placement a candidate's copies are named by: its family's, or `spread` when a
    /// tagged copy was seen (no config), else `suffix`.
    fn placement(candidate: &Candidate) -> Placement {
        candidate.placement.unwrap_or_else(|| {
            if candidate
                .indexes
                .iter()
                .any(|(_, placement)| *placement == Placement::Spread)
            {
                Placement::Spread
            } else {
                Placement::Suffix
            }
        })
    }

    /// The copies of a candidate that are strays: at or beyond its copy count (beyond its split
    /// count, for a split key), or a tagged name in a `suffix` family, each name once.
    fn strays(candidate: &Candidate) -> u64 {
        let copies = Self::copies(candidate);
        let strays_from = candidate.strays_from.unwrap_or(copies).max(copies);
        let placement = Self::placement(candidate);
        let mut strays: Vec<(u32, Placement)> = candidate
            .indexes
            .iter()
            .copied()
            // A `spread` family's publishes write `K#i` as well as the tagged names: only a
            // tagged name in a `suffix` family is named under the other placement.
            .filter(|&(index, named)| {
                index >= strays_from
                    || (named == Placement::Spread && placement == Placement::Suffix)
            })
            .collect();
        strays.sort_unstable();
        strays.dedup();
        strays.len() as u64
    }

    /// Keys not split: skipped at once (a known count of 1), or inferred to have one copy.
    fn unsplit(&self) -> u64 {
        let inferred_single = self
            .order
            .iter()
            .filter_map(|key| self.by_key.get(key))
            .filter(|candidate| Self::copies(candidate) <= 1)
            .count();
        self.unsplit + inferred_single as u64
    }

    /// The split keys found so far, in order.
    fn split(&self) -> impl Iterator<Item = (&Key, &Candidate)> {
        self.order.iter().filter_map(|key| {
            let candidate = self.by_key.get(key)?;
            (Self::copies(candidate) > 1).then_some((key, candidate))
        })
    }
}

/// Scans every primary for copy keys until `options.sample` split keys are found or every
/// primary is done, reporting progress at most once a second.
///
/// # Errors
/// The first SCAN that fails: without one primary's keys the sample would be biased.
pub(crate) async fn sample_keys(
    nodes: &ReadOnlyNodes,
    options: &AuditOptions,
    started: Instant,
    progress: &mut impl FnMut(&Progress),
) -> Result<Sampled> {
    let pattern = scan_pattern(options.prefix.as_deref());
    let primaries: Vec<NodeLabel> = nodes
        .shards()
        .iter()
        .map(|shard| shard.primary.clone())
        .collect();
    let mut cursors: Vec<Option<String>> = primaries.iter().map(|_| Some("0".to_owned())).collect();
    let splits = match &options.copies {
        CopyCount::Config(families) => read_split_layouts(nodes, families).await,
        _ => SplitLayouts::new(),
    };
    let mut candidates = Candidates::default();
    let mut scanned = 0u64;
    let mut last_progress = Instant::now();
    loop {
        let active: Vec<usize> = (0..primaries.len())
            .filter(|&at| cursors[at].is_some())
            .collect();
        if active.is_empty() {
            break;
        }
        if !candidates.frozen && candidates.split().count() >= options.sample {
            match options.copies {
                // An inferred count needs every copy the scan can find: scan on, for the
                // sampled keys only.
                CopyCount::Inferred => candidates.frozen = true,
                _ => break,
            }
        }
        let pages = join_all(active.iter().map(|&at| {
            let cursor = cursors[at].clone().unwrap_or_default();
            let node = &primaries[at];
            let pattern = &pattern;
            async move {
                nodes
                    .scan_page(node, &cursor, pattern, options.scan_count)
                    .await
            }
        }))
        .await;
        for (&at, page) in active.iter().zip(pages) {
            let page = page?;
            cursors[at] = page.next;
            for raw in page.keys {
                scanned += 1;
                if let Some((key, index, placement)) = parse_copy_key(&raw) {
                    candidates.add(key, (index, placement), &options.copies, &splits);
                }
            }
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            progress(&Progress {
                phase: Phase::Scan,
                elapsed: started.elapsed(),
                scanned_keys: scanned,
                sampled_keys: if candidates.frozen {
                    options.sample
                } else {
                    candidates.split().count().min(options.sample)
                },
                read_keys: 0,
                copy_reads: 0,
            });
        }
    }
    let complete = cursors.iter().all(Option::is_none);
    let mut sampled = Sampled {
        scanned,
        complete,
        unsplit_keys: candidates.unsplit(),
        ..Sampled::default()
    };
    for (key, candidate) in candidates.split().take(options.sample) {
        let copies = Candidates::copies(candidate);
        let placement = Candidates::placement(candidate);
        sampled.stray_copies += Candidates::strays(candidate);
        sampled.keys.push((key.clone(), copies, placement));
    }
    progress(&Progress {
        phase: Phase::Scan,
        elapsed: started.elapsed(),
        scanned_keys: scanned,
        sampled_keys: sampled.keys.len(),
        read_keys: 0,
        copy_reads: 0,
    });
    Ok(sampled)
}

/// Holds copy reads to a rate: each batch waits for its turn, then moves the next turn by the
/// batch's share of a second.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// The time one copy read is worth.
    per_read: Duration,
    /// When the next batch may start.
    next: tokio::time::Instant,
}

impl Pacer {
    /// A pacer of `rate` reads per second (at least 1).
    pub(crate) fn new(rate: u32) -> Pacer {
        Pacer {
            per_read: Duration::from_secs(1) / rate.max(1),
            next: tokio::time::Instant::now(),
        }
    }

    /// Waits until a batch of `reads` may start.
    pub(crate) async fn admit(&mut self, reads: u32) {
        let start = self.schedule(tokio::time::Instant::now(), reads);
        tokio::time::sleep_until(start).await;
    }

    /// When a batch of `reads` asked for at `now` may start; the next batch's turn moves by
    /// this batch's share of a second.
    fn schedule(&mut self, now: tokio::time::Instant, reads: u32) -> tokio::time::Instant {
        let start = self.next.max(now);
        self.next = start + self.per_read * reads;
        start
    }
}

/// Reads every copy of every key in `keys` on its primary and on the primary's replicas, paced
/// at `options.rate` copy reads per second, reporting progress at most once a second.
pub(crate) async fn read_keys(
    nodes: &ReadOnlyNodes,
    keys: &[(Key, u32, Placement)],
    options: &AuditOptions,
    started: Instant,
    progress: &mut impl FnMut(&Progress),
) -> Vec<KeySample> {
    let pacer = tokio::sync::Mutex::new(Pacer::new(options.rate));
    let mut reads = stream::iter(keys)
        .map(|(key, copies, placement)| read_key(nodes, key, *copies, *placement, &pacer))
        .buffer_unordered(KEYS_IN_FLIGHT);
    let mut samples = Vec::with_capacity(keys.len());
    let mut copy_reads = 0u64;
    let mut last_progress = Instant::now();
    let report = |samples: &Vec<KeySample>, copy_reads, progress: &mut dyn FnMut(&Progress)| {
        progress(&Progress {
            phase: Phase::Read,
            elapsed: started.elapsed(),
            scanned_keys: 0,
            sampled_keys: keys.len(),
            read_keys: samples.len(),
            copy_reads,
        });
    };
    while let Some(sample) = reads.next().await {
        copy_reads += sample.reads.len() as u64;
        samples.push(sample);
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            report(&samples, copy_reads, progress);
        }
    }
    report(&samples, copy_reads, progress);
    // Keys finish out of order; report them in scan order.
    let position: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(at, (key, _, _))| (key.as_str(), at))
        .collect();
    samples.sort_by_key(|sample| position.get(sample.key.as_str()).copied());
    samples
}

/// Reads the `copies` copies of `key` (named under `placement`) on every node that holds them,
/// all at once, after the pacer admits them.
async fn read_key(
    nodes: &ReadOnlyNodes,
    key: &Key,
    copies: u32,
    placement: Placement,
    pacer: &tokio::sync::Mutex<Pacer>,
) -> KeySample {
    let mut by_shard: HashMap<usize, Vec<CopyKey>> = HashMap::new();
    let mut reads = Vec::new();
    for index in 0..copies {
        let copy = key.copy_key(index, placement);
        match nodes.shard_of(copy.as_str()) {
            Some(shard) => by_shard.entry(shard).or_default().push(copy),
            // No primary serves the slot (a cluster being resharded or down): a failed read.
            None => reads.push(CopyObservation {
                copy: index,
                node: NodeLabel::new("unknown"),
                role: ReadRole::Primary,
                state: CopyState::Failed,
            }),
        }
    }
    let shards = nodes.shards();
    let mut batches = Vec::new();
    for (shard, copies) in &by_shard {
        let shard = &shards[*shard];
        batches.push((&shard.primary, ReadRole::Primary, copies));
        for replica in &shard.replicas {
            batches.push((replica, ReadRole::Replica, copies));
        }
    }
    let count: usize = batches.iter().map(|(_, _, copies)| copies.len()).sum();
    pacer
        .lock()
        .await
        .admit(u32::try_from(count).unwrap_or(u32::MAX))
        .await;
    let answers = join_all(
        batches
            .iter()
            .map(|(node, _, copies)| nodes.read_stamps(node, copies)),
    )
    .await;
    for ((node, role, copies), answers) in batches.iter().zip(answers) {
        for (copy, answer) in copies.iter().zip(answers) {
            let state = match answer {
                Ok(None) => CopyState::Missing,
                Ok(Some(stamp)) => CopyState::Present(stamp),
                Err(err) => {
                    tracing::debug!(copy = %copy, node = %node, error = %err, "copy read failed");
                    CopyState::Failed
                }
            };
            reads.push(CopyObservation {
                copy: copy.index(),
                node: (*node).clone(),
                role: *role,
                state,
            });
        }
    }
    reads.sort_by(|a, b| (a.copy, a.role, &a.node).cmp(&(b.copy, b.role, &b.node)));
    KeySample {
        key: key.as_str().to_owned(),
        copies,
        reads,
    }
}

/// Refuses a sample that read nothing because every primary failed: an error, not a report.
///
/// # Errors
/// [`ErrorKind::Unavailable`] when keys were sampled but not one primary read answered.
pub(crate) fn check_primaries_answered(samples: &[KeySample]) -> Result<()> {
    let primary_reads = samples
        .iter()
        .flat_map(|sample| &sample.reads)
        .filter(|read| read.role == ReadRole::Primary);
    let (mut answered, mut failed) = (0u64, 0u64);
    for read in primary_reads {
        match read.state {
            CopyState::Failed => failed += 1,
            _ => answered += 1,
        }
    }
    if answered == 0 && failed > 0 {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("all {failed} copy reads on primaries failed"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::fixture;

    #[test]
    fn copy_keys_are_recognised() {
        let parsed =
            |raw: &str| parse_copy_key(raw).map(|(key, index, _)| (key.to_string(), index));
        assert_eq!(parsed("post:9#7"), Some(("post:9".to_owned(), 7)));
        assert_eq!(parsed("a#0"), Some(("a".to_owned(), 0)));
        assert_eq!(parsed("a#1023"), Some(("a".to_owned(), 1023)));
        for not_a_copy in [
            "post:9#v",
            "#hotsplit#layout#post:",
            "a#",
            "a#01",
            "a#1024",
            "a#-1",
            "a{x}#1",
            "#3",
            "plain",
            "hotsplit:hb:{hb1}:x",
            "a#1{zzzz}",
            "a#0{a}",
        ] {
            assert_eq!(
                parse_copy_key(not_a_copy).map(|(_, i, _)| i),
                None,
                "{not_a_copy}"
            );
        }
    }

    #[test]
    fn tagged_copies_are_their_keys_and_no_strays() {
        let key = Key::parse("post:9").unwrap();
        let tagged = key.copy_key(5, Placement::Spread);
        assert_eq!(
            parse_copy_key(tagged.as_str()),
            Some((key.clone(), 5, Placement::Spread))
        );
        let names: Vec<String> = (0..4)
            .map(|index| key.copy_key(index, Placement::Spread).to_string())
            .collect();
        let mut candidates = Candidates::default();
        let raw: Vec<&str> = names.iter().map(String::as_str).collect();
        add_all(&mut candidates, &raw, &CopyCount::Inferred);
        let (_, candidate) = candidates.split().next().unwrap();
        assert_eq!(Candidates::copies(candidate), 4);
        assert_eq!(Candidates::placement(candidate), Placement::Spread);
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(scan_pattern(None), "*#*");
        assert_eq!(scan_pattern(Some("post:")), "post:*#*");
        assert_eq!(scan_pattern(Some("a*b?[c]\\")), "a\\*b\\?\\[c\\]\\\\*#*");
    }

    fn add_all(candidates: &mut Candidates, raw: &[&str], copies: &CopyCount) {
        for raw in raw {
            let (key, index, placement) = parse_copy_key(raw).unwrap();
            candidates.add(key, (index, placement), copies, &SplitLayouts::new());
        }
    }

    #[test]
    fn copy_counts_are_inferred_from_the_highest_index() {
        let mut candidates = Candidates::default();
        add_all(
            &mut candidates,
            &["a#0", "b#0", "a#3", "c#1", "a#1", "b#0"],
            &CopyCount::Inferred,
        );
        let split: Vec<(String, u32)> = candidates
            .split()
            .map(|(key, candidate)| (key.to_string(), Candidates::copies(candidate)))
            .collect();
        // b showed only copy 0: one copy, not split (yet).
        assert_eq!(split, [("a".to_owned(), 4), ("c".to_owned(), 2)]);
        assert_eq!(candidates.unsplit(), 1);
    }

    #[test]
    fn a_frozen_sample_only_learns_more_copies_of_its_keys() {
        let mut candidates = Candidates::default();
        add_all(&mut candidates, &["a#0", "a#1"], &CopyCount::Inferred);
        candidates.frozen = true;
        add_all(
            &mut candidates,
            &["b#0", "b#5", "a#7"],
            &CopyCount::Inferred,
        );
        let split: Vec<(String, u32)> = candidates
            .split()
            .map(|(key, candidate)| (key.to_string(), Candidates::copies(candidate)))
            .collect();
        assert_eq!(split, [("a".to_owned(), 8)]);
    }

    #[test]
    fn copy_counts_come_from_the_config_families() {
        let copies = CopyCount::Config(fixture::families(
            "[[family]]\nprefix = \"post:\"\ncopies = 4\n[[family]]\nprefix = \"one:\"\ncopies = 1\n",
        ));
        let mut candidates = Candidates::default();
        add_all(
            &mut candidates,
            &["post:1#0", "one:1#0", "user:1#0", "post:1#6", "one:1#0"],
            &copies,
        );
        let split: Vec<(String, u32)> = candidates
            .split()
            .map(|(key, candidate)| (key.to_string(), Candidates::copies(candidate)))
            .collect();
        assert_eq!(split, [("post:1".to_owned(), 4)]);
        // one:1 and user:1 (default family, 1 copy) are unsplit, each counted once.
        assert_eq!(candidates.unsplit(), 2);
    }

    #[test]
    fn split_keys_are_read_to_their_split_count_and_only_copies_beyond_it_are_strays() {
        let families = fixture::families(
            "[[family]]\nprefix = \"one:\"\ncopies = 1\nsplit = { mode = \"split\", max_copies = 8 }\n\
             [[family]]\nprefix = \"four:\"\ncopies = 4\nsplit = { mode = \"split\", max_copies = 8 }\n",
        );
        let fields = |rows: &[(&str, &str)]| {
            rows.iter()
                .map(|(key, text)| ((*key).to_owned(), (*text).to_owned()))
                .collect::<Vec<_>>()
        };
        let mut splits = SplitLayouts::new();
        splits.extend(split_layouts_of(
            &families,
            "one:",
            fields(&[
                ("one:s", "8:r:1:1"),
                ("one:d", "8:d:1:1"),
                ("one:bad", "8:x:1:1"),
                ("four:elsewhere", "8:r:1:1"),
                ("no#key", "8:r:1:1"),
            ]),
        ));
        splits.extend(split_layouts_of(
            &families,
            "four:",
            fields(&[("four:s", "8:m:1:1"), ("four:d", "8:d:1:1")]),
        ));
        let mut names: Vec<&str> = splits.keys().map(Key::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["four:d", "four:s", "one:d", "one:s"]);

        let copies = CopyCount::Config(families);
        let mut candidates = Candidates::default();
        let mut raw = Vec::new();
        for key in ["one:s", "one:d", "four:s", "four:d", "one:plain"] {
            for index in [0, 1, 5, 7, 9] {
                raw.push(format!("{key}#{index}"));
            }
        }
        for raw in &raw {
            let (key, index, placement) = parse_copy_key(raw).unwrap();
            candidates.add(key, (index, placement), &copies, &splits);
        }
        let found: Vec<(String, u32, u64)> = candidates
            .split()
            .map(|(key, candidate)| {
                (
                    key.to_string(),
                    Candidates::copies(candidate),
                    Candidates::strays(candidate),
                )
            })
            .collect();
        // Written split copies are read and only #9 is a stray; a draining key is read at its
        // family's copies, and its split copies wait for deletion (not strays either).
        assert_eq!(
            found,
            [
                ("one:s".to_owned(), 8, 1),
                ("four:s".to_owned(), 8, 1),
                ("four:d".to_owned(), 4, 1),
            ]
        );
        // one:d (draining) and one:plain have one copy: not split.
        assert_eq!(candidates.unsplit(), 2);
    }

    #[test]
    fn the_pacer_holds_the_rate() {
        let mut pacer = Pacer::new(100);
        let t0 = pacer.next;
        let ms = Duration::from_millis;
        assert_eq!(pacer.schedule(t0, 10), t0, "the first batch starts at once");
        assert_eq!(pacer.schedule(t0, 10), t0 + ms(100));
        assert_eq!(pacer.schedule(t0 + ms(50), 50), t0 + ms(200));
        assert_eq!(pacer.schedule(t0 + ms(10), 1), t0 + ms(700));
        // After an idle spell the next batch starts at once; no burst is saved up.
        assert_eq!(pacer.schedule(t0 + ms(5000), 1), t0 + ms(5000));
        assert_eq!(pacer.schedule(t0 + ms(5000), 1), t0 + ms(5010));
    }
}
