//! Copy placement: how copy `i` of a key is named, and so which cluster slot it lands on.
//!
//! A Redis Cluster key's slot is CRC16 of the key (or of its hash tag, the text between the
//! first `{` and the next `}`) modulo 16384. Under [`Placement::Suffix`] (the only naming of
//! releases before placement) copy `i` of `K` is `K#i`, whose slot is CRC16 of
//! the whole name: names that differ only in their last characters crowd together, so a 16-way
//! split may put 10 of its copies on one of three masters. Under [`Placement::Spread`] (the
//! default of a family with no copies yet, [`PlacementReason`]) copy
//! `i ≥ 1` is `K#i{t}`, where the tag `t` is chosen from [`tag_of_slot`] (one short `[a-z0-9]`
//! tag per slot) so that copy `i`'s slot is `slot_0 + offset(i)` modulo 16384, `slot_0` being
//! the slot of `K#0`. Copy 0 stays `K#0`, untagged, in both placements, so every read path's
//! fallback to copy 0 is the same; a user key never contains `{`, `}` or `#`, so a tagged copy
//! name is recognisable and never equals a user key.
//!
//! The offset is the 14-bit bit-reversal of `i` (the van der Corput sequence scaled to 16384):
//! 0, 8192, 4096, 12288, 2048, … For `N` a power of two the first `N` copies take exactly the
//! slots `slot_0 + j·16384/N` (`j < N`), the even spread; for other `N` every prefix of the
//! sequence is still spread within a factor of two of even. It is used instead of `i·16384/N`
//! because a copy's name must not depend on the copy count: a rolling resize (grow or shrink,
//! `layout`) keeps copies `0..min` under the names every instance already reads, so the
//! resize protocol needs no renaming. Names depend on `(K, i)` only, never on the live slot map,
//! so every instance names every copy the same whatever topology it last saw, and a reshard
//! never renames a copy under its readers. With equal slot ranges this is even; after a reshard
//! leaves unequal ranges, [`spread_report`] says how far from even a family's copies are against
//! the live map (the layout watcher logs it), rather than renaming copies.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// The number of Redis Cluster hash slots.
pub const SLOTS: u16 = 16384;

/// How a family names its copies beyond copy 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Copy `i` is `K#i`: the naming of every release.
    Suffix,
    /// Copy `i ≥ 1` is `K#i{t}`, its tag chosen so the copies' slots spread evenly.
    Spread,
}

impl Placement {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Suffix => "suffix",
            Placement::Spread => "spread",
        }
    }

    /// The placement spelled `raw` (`suffix`, `spread`), `None` for anything else.
    pub fn parse(raw: &str) -> Option<Placement> {
        match raw {
            "suffix" => Some(Placement::Suffix),
            "spread" => Some(Placement::Spread),
            _ => None,
        }
    }
}

/// Why a family runs the placement it runs: its config names one, or it does not and the
/// instance chose at startup (`layout::choose`). The log and `hotsplit config check` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementReason {
    /// The config names the placement (`placement = "…"`): an operator's choice, honoured.
    Configured,
    /// Not configured, and not chosen yet: the family table of a config names such a family
    /// `suffix` (the naming every release reads) until startup chooses
    /// (`layout::choose_placements`); code that builds a family table without starting a
    /// server (tests, `audit`) keeps that.
    Unset,
    /// Not configured, and the family has no copies yet (nor live instances on `K#i`): the
    /// default, `spread`.
    NewFamily,
    /// Not configured, and other live instances of the family already run `spread`, or its
    /// stored copies include tagged names: `spread`, as before.
    SpreadInUse,
    /// Not configured, and the family already has `K#i` copies (`i ≥ 1`) and no tagged ones,
    /// or a live instance reads `K#i` (configured `suffix`, or a release before placement):
    /// kept on `suffix` until an operator moves it (the rolling change of `layout::placing`).
    SuffixCopiesExist,
}

impl PlacementReason {
    /// How the log and `config check` say it.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementReason::Configured => "configured",
            PlacementReason::Unset => "not set (chosen at startup)",
            PlacementReason::NewFamily => "default for a new family",
            PlacementReason::SpreadInUse => "default: the family already runs spread",
            PlacementReason::SuffixCopiesExist => {
                "kept because suffix copies exist (set placement to move it)"
            }
        }
    }
}

/// CRC16 as Redis Cluster computes it (XMODEM: polynomial 0x1021, initial value 0).
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key, honouring a hash tag as Redis does: the text between the first
/// `{` and the first `}` after it, when that text is not empty.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % SLOTS
}

/// The alphabet tags are drawn from.
const TAG_ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// The longest tag the table needs (every slot has one of at most this many characters; the
/// table's test checks it).
const MAX_TAG_LEN: usize = 4;

/// The tag table: for each slot, the shortest `[a-z0-9]` string whose CRC16 falls in it (the
/// first in alphabet order among the shortest), built once on first use.
fn tag_table() -> &'static [String] {
    static TABLE: OnceLock<Vec<String>> = OnceLock::new();
    TABLE.get_or_init(build_tag_table)
}

/// Builds the tag table by enumerating tags by length, then in alphabet order.
fn build_tag_table() -> Vec<String> {
    let mut table: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut tag = [0u8; MAX_TAG_LEN];
    for len in 1..=MAX_TAG_LEN {
        let count = TAG_ALPHABET.len().pow(len as u32);
        for mut n in 0..count {
            for at in (0..len).rev() {
                tag[at] = TAG_ALPHABET[n % TAG_ALPHABET.len()];
                n /= TAG_ALPHABET.len();
            }
            let slot = usize::from(crc16(&tag[..len]) % SLOTS);
            if table[slot].is_none() {
                table[slot] = Some(String::from_utf8_lossy(&tag[..len]).into_owned());
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        if missing == 0 {
            break;
        }
    }
    // Every slot is reached by a tag of at most MAX_TAG_LEN characters (a unit test checks it);
    // a slot left empty would only fall back to an untagged name's slot.
    table.into_iter().map(Option::unwrap_or_default).collect()
}

/// The shortest tag (`[a-z0-9]`, at most four characters) whose slot is `slot` (modulo 16384).
pub fn tag_of_slot(slot: u16) -> &'static str {
    &tag_table()[usize::from(slot % SLOTS)]
}

/// How far past copy 0's slot copy `index`'s slot lies under [`Placement::Spread`]: the 14-bit
/// bit-reversal of `index` (see the module doc).
pub fn spread_offset(index: u32) -> u16 {
    // Reverse all 32 bits and keep the top 14: the low 14 bits of `index`, reversed.
    (index.reverse_bits() >> (32 - 14)) as u16
}

/// The slot copy `index` of a key whose copy 0 is in `slot_0` takes under
/// [`Placement::Spread`].
pub fn spread_slot(slot_0: u16, index: u32) -> u16 {
    ((u32::from(slot_0) + u32::from(spread_offset(index))) % u32::from(SLOTS)) as u16
}

/// How evenly a key's copies fall on the masters of a slot map.
#[derive(Debug, Clone, PartialEq)]
pub struct SpreadReport {
    /// Copies per master, in the order of the map's masters.
    pub per_master: Vec<u32>,
    /// The busiest master's share of the copies (0..=1).
    pub busiest_share: f64,
    /// The share an even spread would give the busiest master: `ceil(N / masters) / N`.
    pub even_share: f64,
}

/// Counts which master owns each of `copy_slots` in a slot map given as `(first, last, master)`
/// ranges (inclusive, master an index below `masters`). Slots no range covers are not counted.
pub fn spread_report(
    copy_slots: &[u16],
    ranges: &[(u16, u16, usize)],
    masters: usize,
) -> SpreadReport {
    let mut per_master = vec![0u32; masters];
    for &slot in copy_slots {
        if let Some(&(_, _, master)) = ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
        {
            if let Some(count) = per_master.get_mut(master) {
                *count += 1;
            }
        }
    }
    let copies = copy_slots.len().max(1) as f64;
    let busiest = per_master.iter().copied().max().unwrap_or(0);
    let even = copy_slots.len().div_ceil(masters.max(1));
    SpreadReport {
        per_master,
        busiest_share: f64::from(busiest) / copies,
        even_share: even as f64 / copies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_the_cluster_one() {
        // The check value of CRC16/XMODEM, which the Redis Cluster spec quotes.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of("123456789"), 0x31c3 % SLOTS);
        // Tags: only the first {…} counts; an empty one does not.
        assert_eq!(slot_of("a{user1000}b"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
        // Values fred (the client the store uses) computes for the same keys.
        for key in ["post:9#0", "split16:share#3", "x{ab}", "{}"] {
            assert_eq!(
                slot_of(key),
                fred::util::redis_keyslot(key.as_bytes()),
                "{key}"
            );
        }
    }

    #[test]
    fn every_slot_has_a_short_tag_that_lands_on_it() {
        let mut longest = 0;
        for slot in 0..SLOTS {
            let tag = tag_of_slot(slot);
            assert!(!tag.is_empty(), "slot {slot} has no tag");
            assert!(tag.bytes().all(|b| TAG_ALPHABET.contains(&b)), "{tag}");
            assert_eq!(crc16(tag.as_bytes()) % SLOTS, slot, "tag {tag}");
            longest = longest.max(tag.len());
        }
        assert!(longest <= MAX_TAG_LEN);
        // Shortest first: one-character tags keep their slots.
        assert_eq!(tag_of_slot(crc16(b"a") % SLOTS), "a");
    }

    #[test]
    fn spread_offsets_are_even_for_powers_of_two() {
        assert_eq!(spread_offset(0), 0);
        assert_eq!(spread_offset(1), 8192);
        assert_eq!(spread_offset(2), 4096);
        assert_eq!(spread_offset(3), 12288);
        for n in [2u32, 4, 8, 16, 64, 1024] {
            let mut offsets: Vec<u16> = (0..n).map(spread_offset).collect();
            offsets.sort_unstable();
            let step = u32::from(SLOTS) / n;
            let even: Vec<u16> = (0..n).map(|j| (j * step) as u16).collect();
            assert_eq!(offsets, even, "n = {n}");
        }
        assert_eq!(spread_slot(16000, 1), (16000 + 8192) % SLOTS);
    }

    #[test]
    fn a_spread_of_sixteen_over_three_equal_masters_is_even() {
        let ranges = [(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)];
        for slot_0 in [0u16, 1, 5000, 5461, 12345, 16383] {
            let slots: Vec<u16> = (0..16).map(|i| spread_slot(slot_0, i)).collect();
            let report = spread_report(&slots, &ranges, 3);
            assert_eq!(report.per_master.iter().sum::<u32>(), 16);
            assert!(report.busiest_share <= 0.375, "{slot_0}: {report:?}");
            assert_eq!(report.even_share, 6.0 / 16.0);
        }
    }

    #[test]
    fn placements_are_spelled_as_configured() {
        for placement in [Placement::Suffix, Placement::Spread] {
            assert_eq!(Placement::parse(placement.as_str()), Some(placement));
        }
        assert_eq!(Placement::parse("even"), None);
    }
}
