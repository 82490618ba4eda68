//! The audit's figures, computed from what was read: pure functions over hand-made inputs.
//!
//! The input is one [`KeySample`] per audited key: every copy `K#0..K#N-1`, read on the primary
//! that owns it and on each of that primary's replicas. For each key the *newest* version is the
//! highest version any read returned (a tombstone counts with its version). Then, separately for
//! reads served by primaries and by replicas:
//!
//! - a copy read is **behind** when it returned an older version than the newest, or no copy at
//!   all while some copy of the key exists;
//! - a copy read is **inconsistent** when it disagrees with the newest: behind, or at the newest
//!   version but a value where the newest is a tombstone (or the reverse). Inconsistency per
//!   million is inconsistent reads × 10⁶ / copy reads;
//! - a key's **skew** is the newest version minus the oldest version among the present copies
//!   read in that role. For primaries that is max − min among the copies; for replicas it also
//!   shows replicas that are all equally behind. A missing copy has no version, so it shows in
//!   the behind count, not in the skew.
//!
//! Failed reads count apart and are in no denominator. A key whose copies are all missing
//! everywhere (it expired or was deleted between the scan and the read) is *vanished*: its reads
//! count, and none of them is behind.

use std::cmp::Reverse;

use serde::Serialize;

use crate::store::{CopyStamp, NodeLabel};

/// How many keys [`Figures::worst_keys`] lists.
pub(crate) const WORST_KEYS: usize = 10;

/// The role of the node a copy was read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadRole {
    /// The primary that owns the copy.
    Primary,
    /// A replica of that primary.
    Replica,
}

impl ReadRole {
    /// Both roles, in report order.
    pub const ALL: [ReadRole; 2] = [ReadRole::Primary, ReadRole::Replica];

    /// `primary` or `replica`: the label value and the report's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadRole::Primary => "primary",
            ReadRole::Replica => "replica",
        }
    }
}

/// What one read of one copy returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// The copy does not exist on that node.
    Missing,
    /// The copy's version and kind.
    Present(CopyStamp),
    /// The read failed (timeout, connection, corrupt fields); it counts apart.
    Failed,
}

/// One read of one copy on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyObservation {
    /// The copy index `i` of `K#i`.
    pub copy: u32,
    /// The node that was asked, `host:port`.
    pub node: NodeLabel,
    /// Whether that node is the copy's primary or one of its replicas.
    pub role: ReadRole,
    /// What it returned.
    pub state: CopyState,
}

/// Every read of one key's copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySample {
    /// The user key `K`.
    pub key: String,
    /// Its copy count N.
    pub copies: u32,
    /// One observation per copy and node.
    pub reads: Vec<CopyObservation>,
}

/// The distribution of per-key skew in one role, in versions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SkewStats {
    /// Every key's skew, ascending: what `audit --watch` observes into its skew histogram. Not
    /// in the report (the percentiles below summarise it).
    #[serde(skip)]
    pub sorted: Vec<u64>,
    /// Keys with at least one present copy read in this role.
    pub keys: usize,
    /// The median skew (nearest rank).
    pub p50: u64,
    /// The 99th percentile skew (nearest rank).
    pub p99: u64,
    /// The largest skew.
    pub max: u64,
}

/// The figures of the reads served in one role.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoleFigures {
    /// Copy reads that answered (present or missing).
    pub copy_reads: u64,
    /// Copy reads that failed; in no denominator.
    pub failed_reads: u64,
    /// Copy reads behind the key's newest version, missing copies included.
    pub copies_behind: u64,
    /// Of those, copies missing while another copy of the key exists.
    pub missing_copies: u64,
    /// `copies_behind / copy_reads` (0 without reads).
    pub share_behind: f64,
    /// Copy reads that disagree with the key's newest version (behind, or the other kind at
    /// the newest version).
    pub inconsistent_reads: u64,
    /// `inconsistent_reads × 10⁶ / copy_reads` (0 without reads).
    pub inconsistency_per_million: f64,
    /// Per-key skew in this role.
    pub skew: SkewStats,
}

/// A copy read that disagrees with its key's newest version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaggingCopy {
    /// The copy index.
    pub copy: u32,
    /// The node it was read on.
    pub node: String,
    /// The node's role.
    pub role: ReadRole,
    /// The version read; `None` for a missing copy.
    pub version: Option<u64>,
    /// Whether the copy read holds a tombstone.
    pub tombstone: bool,
    /// Whether it is behind (older or missing), rather than the other kind at the newest
    /// version.
    pub behind: bool,
}

/// A key with at least one copy read that disagrees with its newest version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorstKey {
    /// The user key.
    pub key: String,
    /// Its copy count N.
    pub copies: u32,
    /// The newest version read.
    pub newest: u64,
    /// Whether the newest version is a tombstone.
    pub newest_tombstone: bool,
    /// The newest version minus the oldest present copy read, either role.
    pub skew: u64,
    /// The disagreeing copy reads, by copy then role then node.
    pub lagging: Vec<LaggingCopy>,
}

/// Everything an audit round reports about the keys it read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Keys read.
    pub keys: usize,
    /// Keys whose copies were all missing on every node that answered.
    pub vanished_keys: usize,
    /// Keys with at least one disagreeing copy read.
    pub inconsistent_keys: usize,
    /// Reads served by primaries.
    pub primary: RoleFigures,
    /// Reads served by replicas.
    pub replica: RoleFigures,
    /// Up to [`WORST_KEYS`] inconsistent keys, largest skew first (then most disagreeing
    /// reads, then key).
    pub worst_keys: Vec<WorstKey>,
}

impl Figures {
    /// The figures of `role`.
    pub fn role(&self, role: ReadRole) -> &RoleFigures {
        match role {
            ReadRole::Primary => &self.primary,
            ReadRole::Replica => &self.replica,
        }
    }
}

/// Counters of one role while the keys are walked.
#[derive(Debug, Default)]
struct RoleTally {
    copy_reads: u64,
    failed_reads: u64,
    copies_behind: u64,
    missing_copies: u64,
    inconsistent_reads: u64,
    skews: Vec<u64>,
}

impl RoleTally {
    fn finish(mut self) -> RoleFigures {
        let ratio = |count: u64| {
            if self.copy_reads == 0 {
                0.0
            } else {
                count as f64 / self.copy_reads as f64
            }
        };
        self.skews.sort_unstable();
        RoleFigures {
            copy_reads: self.copy_reads,
            failed_reads: self.failed_reads,
            copies_behind: self.copies_behind,
            missing_copies: self.missing_copies,
            share_behind: ratio(self.copies_behind),
            inconsistent_reads: self.inconsistent_reads,
            inconsistency_per_million: ratio(self.inconsistent_reads) * 1e6,
            skew: SkewStats {
                keys: self.skews.len(),
                p50: nearest_rank(&self.skews, 0.50),
                p99: nearest_rank(&self.skews, 0.99),
                max: self.skews.last().copied().unwrap_or(0),
                sorted: self.skews,
            },
        }
    }
}

/// The nearest-rank percentile `p` (0..=1) of ascending `sorted`; 0 when it is empty.
pub(crate) fn nearest_rank(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Counts the reads of a key present nowhere: every answer agrees (missing), nothing is
/// behind. Returns whether any copy answered (the key vanished rather than being unreadable).
fn tally_vanished(sample: &KeySample, primary: &mut RoleTally, replica: &mut RoleTally) -> bool {
    let mut answered = false;
    for read in &sample.reads {
        let tally = match read.role {
            ReadRole::Primary => &mut *primary,
            ReadRole::Replica => &mut *replica,
        };
        match read.state {
            CopyState::Failed => tally.failed_reads += 1,
            _ => {
                tally.copy_reads += 1;
                answered = true;
            }
        }
    }
    answered
}

/// Computes the figures of `samples` (see the module documentation for the definitions).
pub(crate) fn compute(samples: &[KeySample]) -> Figures {
    let mut primary = RoleTally::default();
    let mut replica = RoleTally::default();
    let mut figures = Figures {
        keys: samples.len(),
        ..Figures::default()
    };
    let mut worst = Vec::new();
    for sample in samples {
        let newest = sample
            .reads
            .iter()
            .filter_map(|read| match read.state {
                CopyState::Present(stamp) => Some(stamp.version),
                _ => None,
            })
            .max();
        let Some(newest) = newest else {
            if tally_vanished(sample, &mut primary, &mut replica) {
                figures.vanished_keys += 1;
            }
            continue;
        };
        // At an equal version a tombstone wins, so the newest is a tombstone when any copy
        // holds one at that version.
        let newest_tombstone = sample.reads.iter().any(|read| {
            matches!(read.state, CopyState::Present(stamp) if stamp.version == newest && stamp.tombstone)
        });
        let mut oldest = [None::<u64>; 2];
        let mut lagging = Vec::new();
        for read in &sample.reads {
            let (tally, slot) = match read.role {
                ReadRole::Primary => (&mut primary, 0),
                ReadRole::Replica => (&mut replica, 1),
            };
            let (behind, inconsistent, version, tombstone) = match read.state {
                CopyState::Failed => {
                    tally.failed_reads += 1;
                    continue;
                }
                CopyState::Missing => {
                    tally.missing_copies += 1;
                    (true, true, None, false)
                }
                CopyState::Present(stamp) => {
                    let version = stamp.version.get();
                    oldest[slot] = Some(oldest[slot].map_or(version, |seen| seen.min(version)));
                    let behind = stamp.version < newest;
                    let other_kind = !behind && stamp.tombstone != newest_tombstone;
                    (behind, behind || other_kind, Some(version), stamp.tombstone)
                }
            };
            tally.copy_reads += 1;
            if behind {
                tally.copies_behind += 1;
            }
            if inconsistent {
                tally.inconsistent_reads += 1;
                lagging.push(LaggingCopy {
                    copy: read.copy,
                    node: read.node.to_string(),
                    role: read.role,
                    version,
                    tombstone,
                    behind,
                });
            }
        }
        let newest = newest.get();
        if let Some(oldest) = oldest[0] {
            primary.skews.push(newest - oldest);
        }
        if let Some(oldest) = oldest[1] {
            replica.skews.push(newest - oldest);
        }
        if !lagging.is_empty() {
            lagging.sort_by(|a, b| (a.copy, a.role, &a.node).cmp(&(b.copy, b.role, &b.node)));
            let oldest_any = oldest.iter().flatten().min().copied().unwrap_or(newest);
            worst.push(WorstKey {
                key: sample.key.clone(),
                copies: sample.copies,
                newest,
                newest_tombstone,
                skew: newest - oldest_any,
                lagging,
            });
        }
    }
    figures.inconsistent_keys = worst.len();
    worst.sort_by(|a, b| {
        (Reverse(a.skew), Reverse(a.lagging.len()), &a.key).cmp(&(
            Reverse(b.skew),
            Reverse(b.lagging.len()),
            &b.key,
        ))
    });
    worst.truncate(WORST_KEYS);
    figures.worst_keys = worst;
    figures.primary = primary.finish();
    figures.replica = replica.finish();
    figures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Version;

    fn stamp(version: u64) -> CopyState {
        CopyState::Present(CopyStamp {
            version: Version::new(version).unwrap(),
            tombstone: false,
        })
    }

    fn tombstone(version: u64) -> CopyState {
        CopyState::Present(CopyStamp {
            version: Version::new(version).unwrap(),
            tombstone: true,
        })
    }

    /// A key of `states.len()` copies, copy `i` on primary `p{i % 3}` with `states[i].0` and on
    /// its replica `r{i % 3}` with `states[i].1`.
    fn key(name: &str, states: &[(CopyState, CopyState)]) -> KeySample {
        let mut reads = Vec::new();
        for (copy, (on_primary, on_replica)) in states.iter().enumerate() {
            let copy = u32::try_from(copy).unwrap();
            reads.push(CopyObservation {
                copy,
                node: NodeLabel::new(format!("p{}", copy % 3)),
                role: ReadRole::Primary,
                state: *on_primary,
            });
            reads.push(CopyObservation {
                copy,
                node: NodeLabel::new(format!("r{}", copy % 3)),
                role: ReadRole::Replica,
                state: *on_replica,
            });
        }
        KeySample {
            key: name.to_owned(),
            copies: u32::try_from(states.len()).unwrap(),
            reads,
        }
    }

    fn consistent(name: &str, version: u64, copies: usize) -> KeySample {
        key(name, &vec![(stamp(version), stamp(version)); copies])
    }

    #[test]
    fn consistent_keys_have_no_skew_and_nothing_behind() {
        let samples = [consistent("a", 7, 4), consistent("b", 3, 4)];
        let figures = compute(&samples);
        assert_eq!(figures.keys, 2);
        assert_eq!(figures.inconsistent_keys, 0);
        assert!(figures.worst_keys.is_empty());
        for role in ReadRole::ALL {
            let role = figures.role(role);
            assert_eq!(role.copy_reads, 8);
            assert_eq!(role.copies_behind, 0);
            assert_eq!(role.inconsistent_reads, 0);
            assert_eq!(role.share_behind, 0.0);
            assert_eq!(role.inconsistency_per_million, 0.0);
            assert_eq!(
                role.skew,
                SkewStats {
                    keys: 2,
                    p50: 0,
                    p99: 0,
                    max: 0,
                    sorted: vec![0, 0],
                }
            );
        }
    }

    #[test]
    fn a_stale_primary_copy_is_behind_on_the_primary_and_its_replica() {
        let mut states = vec![(stamp(9), stamp(9)); 4];
        states[2] = (stamp(5), stamp(5));
        let samples = [key("hot", &states), consistent("calm", 3, 4)];
        let figures = compute(&samples);
        assert_eq!(figures.inconsistent_keys, 1);
        for role in ReadRole::ALL {
            let role = figures.role(role);
            assert_eq!(role.copy_reads, 8);
            assert_eq!(role.copies_behind, 1);
            assert_eq!(role.missing_copies, 0);
            assert_eq!(role.inconsistent_reads, 1);
            assert_eq!(role.share_behind, 1.0 / 8.0);
            assert_eq!(role.inconsistency_per_million, 125_000.0);
            assert_eq!(
                role.skew,
                SkewStats {
                    keys: 2,
                    p50: 0,
                    p99: 4,
                    max: 4,
                    sorted: vec![0, 4],
                }
            );
        }
        let [worst] = figures.worst_keys.as_slice() else {
            panic!("one worst key: {:?}", figures.worst_keys)
        };
        assert_eq!(
            (worst.key.as_str(), worst.copies, worst.newest, worst.skew),
            ("hot", 4, 9, 4)
        );
        let lagging: Vec<(u32, &str, ReadRole, Option<u64>)> = worst
            .lagging
            .iter()
            .map(|copy| (copy.copy, copy.node.as_str(), copy.role, copy.version))
            .collect();
        assert_eq!(
            lagging,
            [
                (2, "p2", ReadRole::Primary, Some(5)),
                (2, "r2", ReadRole::Replica, Some(5))
            ]
        );
    }

    #[test]
    fn replica_lag_shows_only_in_the_replica_figures() {
        // Every replica is one version behind: max - min among replica copies is 0, but each is
        // behind the newest.
        let samples = [key("k", &[(stamp(4), stamp(3)), (stamp(4), stamp(3))])];
        let figures = compute(&samples);
        assert_eq!(figures.primary.copies_behind, 0);
        assert_eq!(figures.primary.skew.max, 0);
        assert_eq!(figures.replica.copies_behind, 2);
        assert_eq!(figures.replica.share_behind, 1.0);
        assert_eq!(figures.replica.inconsistency_per_million, 1e6);
        assert_eq!(figures.replica.skew.max, 1);
        assert_eq!(figures.worst_keys[0].skew, 1);
    }

    #[test]
    fn a_missing_copy_is_behind_but_has_no_skew() {
        let samples = [key(
            "k",
            &[
                (stamp(6), stamp(6)),
                (CopyState::Missing, CopyState::Missing),
                (stamp(6), stamp(6)),
            ],
        )];
        let figures = compute(&samples);
        for role in ReadRole::ALL {
            let role = figures.role(role);
            assert_eq!(
                (role.copy_reads, role.copies_behind, role.missing_copies),
                (3, 1, 1)
            );
            assert_eq!(role.skew.max, 0);
        }
        let worst = &figures.worst_keys[0];
        assert_eq!(worst.skew, 0);
        assert_eq!(worst.lagging.len(), 2);
        assert!(worst
            .lagging
            .iter()
            .all(|copy| copy.version.is_none() && copy.behind));
    }

    #[test]
    fn tombstones_count_with_their_version_and_win_ties() {
        // A tombstone at 8 beside values at 8: the values disagree but are not behind.
        let samples = [key(
            "k",
            &[
                (tombstone(8), tombstone(8)),
                (stamp(8), stamp(8)),
                (tombstone(7), stamp(7)),
            ],
        )];
        let figures = compute(&samples);
        let worst = &figures.worst_keys[0];
        assert!(worst.newest_tombstone);
        assert_eq!((worst.newest, worst.skew), (8, 1));
        for role in ReadRole::ALL {
            let role = figures.role(role);
            assert_eq!(role.copies_behind, 1, "{role:?}");
            assert_eq!(role.inconsistent_reads, 2, "{role:?}");
        }
        // All tombstones at one version: consistent.
        let figures = compute(&[key("t", &[(tombstone(3), tombstone(3)); 3])]);
        assert_eq!(figures.inconsistent_keys, 0);
    }

    #[test]
    fn failed_reads_and_vanished_keys_count_apart() {
        let samples = [
            key(
                "k",
                &[(stamp(2), CopyState::Failed), (stamp(2), CopyState::Failed)],
            ),
            key("gone", &[(CopyState::Missing, CopyState::Missing); 2]),
            key("dark", &[(CopyState::Failed, CopyState::Failed); 2]),
        ];
        let figures = compute(&samples);
        assert_eq!(figures.vanished_keys, 1);
        assert_eq!(figures.inconsistent_keys, 0);
        assert_eq!(
            (figures.primary.copy_reads, figures.primary.failed_reads),
            (4, 2)
        );
        assert_eq!(
            (figures.replica.copy_reads, figures.replica.failed_reads),
            (2, 4)
        );
        assert_eq!(figures.replica.skew.keys, 0);
        assert_eq!(
            figures.primary.copies_behind + figures.replica.copies_behind,
            0
        );
    }

    #[test]
    fn worst_keys_are_ordered_by_skew_and_capped() {
        let samples: Vec<KeySample> = (0..15u64)
            .map(|n| {
                key(
                    &format!("k{n:02}"),
                    &[(stamp(100), stamp(100)), (stamp(100 - n - 1), stamp(100))],
                )
            })
            .collect();
        let figures = compute(&samples);
        assert_eq!(figures.inconsistent_keys, 15);
        assert_eq!(figures.worst_keys.len(), WORST_KEYS);
        let skews: Vec<u64> = figures.worst_keys.iter().map(|key| key.skew).collect();
        assert_eq!(skews, [15, 14, 13, 12, 11, 10, 9, 8, 7, 6]);
        assert_eq!(figures.primary.skew.max, 15);
        assert_eq!(figures.primary.skew.p50, 8);
        assert_eq!(figures.replica.skew.max, 0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(nearest_rank(&[], 0.5), 0);
        assert_eq!(nearest_rank(&[4], 0.99), 4);
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&values, 0.5), 50);
        assert_eq!(nearest_rank(&values, 0.99), 99);
        assert_eq!(nearest_rank(&values, 1.0), 100);
        assert_eq!(nearest_rank(&values, 0.0), 1);
    }
}
