//! One key's check, as pure functions: which patterns a pass walks, which scanned keys it
//! checks, and which repairs the copies it read call for ([`repairs`]).

use crate::family::{Families, Family};
use crate::key::{CopyKey, Key, Placement};
use crate::split::SplitMode;
use crate::store::{CopyRecord, CopyWrite};

use super::status::RepairCause;
use crate::layout::glob_escape;

/// The `SCAN MATCH` patterns a pass walks: every copy key (`*#*`) when the default family has
/// more than one copy, else the prefix of each family that has. A one-copy family's keys have
/// more copies only while split, and those are walked from the split index ([`indexed`]).
pub(super) fn patterns(families: &Families) -> Vec<String> {
    let scanned: Vec<&Family> = families.iter().filter(|family| family.copies > 1).collect();
    if scanned.iter().any(|family| family.prefix.is_empty()) {
        return vec!["*#*".to_owned()];
    }
    scanned
        .iter()
        .map(|family| format!("{}*#*", glob_escape(&family.prefix)))
        .collect()
}

/// The one-copy families whose split keys a pass walks from the split index instead of a
/// scan: those whose `split` table is in mode `split`, and those the index holds split keys of
/// (`has_split_keys`: split by an instance whose config splits the family). A one-copy family
/// whose keys never split has nothing to repair.
pub(super) fn indexed(families: &Families, has_split_keys: impl Fn(&str) -> bool) -> Vec<&Family> {
    families
        .iter()
        .filter(|family| {
            family.copies == 1
                && (family.split == Some(SplitMode::Split) || has_split_keys(family.name()))
        })
        .collect()
}

/// How many copies of a key of `family` the scrub compares: the family's, or the key's split
/// copies while publishes write them (`split`, from the index).
pub(super) fn copy_count(family: &Family, split: Option<u32>) -> u32 {
    split.map_or(family.copies, |copies| copies.max(family.copies))
}

/// The key a scanned key is a copy of, with its family, when the scrub checks it: a copy of a
/// valid key named as its family's publishes name copies (`K#i` always, and `K#i{t}` in a
/// `spread` family, see `layout::placing`; copy 0 is `K#0` in both), of a family not in
/// `paused`, with `i` below the key's [`copy_count`] (`split_copies` gives a key's split copies,
/// `None` when publishes write none), which is more than one. Anything else (`foo#bar`, `K#v`,
/// `K#99` beyond N, a key of a one-copy family that is not split, a split copy beyond the split
/// count, a tagged name in a `suffix` family) is left alone. A `spread` family's key is checked
/// under both namings.
pub(super) fn checked_key<'f>(
    stored: &str,
    families: &'f Families,
    paused: &[String],
    split_copies: impl Fn(&Family, &Key) -> Option<u32>,
) -> Option<(Key, &'f Family)> {
    let (key, copy_key) = CopyKey::parse(stored)?;
    let family = families.resolve(&key);
    if paused.iter().any(|name| name == family.name())
        || !(copy_key.placement() == Placement::Suffix || family.placement == Placement::Spread)
    {
        return None;
    }
    // The index is consulted last: most scanned keys of a split family are not split.
    let copies = copy_count(family, split_copies(family, &key));
    (copies > 1 && copy_key.index() < copies).then_some((key, family))
}

/// The repairs of `key` given what each copy holds as stored (`copies[i]`: `None` when copy
/// `i` does not exist, `Err(())` when its read failed): every copy that is missing or ordered
/// before the newest record still served at `now_ms` gets that record, with its own version,
/// payload and `exp`. A copy past its own `exp` that holds the newest version is left to
/// expire (the jitter spreads the copies' expiries on purpose), and a copy holding something
/// newer than every served record is never written. With no served record there is nothing to
/// copy.
pub(super) fn repairs(
    key: &Key,
    placement: Placement,
    copies: &[Result<Option<CopyRecord>, ()>],
    now_ms: u64,
) -> Vec<(CopyWrite, RepairCause)> {
    let newest = copies
        .iter()
        .filter_map(|read| read.as_ref().ok()?.as_ref())
        .filter(|record| record.expire_at_ms > now_ms)
        .fold(None::<&CopyRecord>, |newest, record| match newest {
            Some(newest) if !record.supersedes(newest) => Some(newest),
            _ => Some(record),
        });
    let Some(newest) = newest else {
        return Vec::new();
    };
    copies
        .iter()
        .zip(0u32..)
        .filter_map(|(read, index)| {
            let cause = match read {
                Ok(None) => RepairCause::Missing,
                Ok(Some(held)) if newest.supersedes(held) => RepairCause::Behind,
                Ok(Some(_)) | Err(()) => return None,
            };
            let write = CopyWrite {
                copy_key: key.copy_key(index, placement),
                version: newest.version,
                payload: newest.payload.clone(),
                expire_at_ms: newest.expire_at_ms,
            };
            Some((write, cause))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::fixture;
    use crate::key::Version;
    use crate::store::Payload;

    fn record(version: u64, tombstone: bool, exp: u64) -> Option<CopyRecord> {
        Some(CopyRecord {
            version: Version::new(version).unwrap(),
            payload: if tombstone {
                Payload::Tombstone
            } else {
                Payload::Value(bytes::Bytes::from(format!("v{version}")))
            },
            expire_at_ms: exp,
        })
    }

    fn planned(copies: &[Result<Option<CopyRecord>, ()>]) -> Vec<(u32, u64, bool, u64, &str)> {
        let key = Key::parse("hot").unwrap();
        repairs(&key, Placement::Suffix, copies, 1_000)
            .into_iter()
            .map(|(write, cause)| {
                (
                    write.copy_key.index(),
                    write.version.get(),
                    write.payload == Payload::Tombstone,
                    write.expire_at_ms,
                    cause.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn a_missing_and_a_behind_copy_get_the_newest_record_with_its_own_expiry() {
        let copies = [
            Ok(record(5, false, 2_000)),
            Ok(None),
            Ok(record(3, false, 9_000)),
            Err(()),
        ];
        assert_eq!(
            planned(&copies),
            vec![
                (1, 5, false, 2_000, "missing"),
                (2, 5, false, 2_000, "behind")
            ]
        );
    }

    #[test]
    fn a_tombstone_stays_a_tombstone_and_beats_a_value_of_its_version() {
        let copies = [
            Ok(record(5, true, 2_000)),
            Ok(record(5, false, 3_000)),
            Ok(None),
        ];
        assert_eq!(
            planned(&copies),
            vec![
                (1, 5, true, 2_000, "behind"),
                (2, 5, true, 2_000, "missing")
            ]
        );
    }

    #[test]
    fn an_expired_copy_of_the_newest_version_is_left_to_expire() {
        // Copy 1 expired on its own jitter: it is neither refilled nor given a longer life.
        let copies = [Ok(record(5, false, 2_000)), Ok(record(5, false, 900))];
        assert!(planned(&copies).is_empty());
        // An expired copy of an older version missed an edit: it is brought forward.
        let copies = [Ok(record(5, false, 2_000)), Ok(record(4, false, 900))];
        assert_eq!(planned(&copies), vec![(1, 5, false, 2_000, "behind")]);
    }

    #[test]
    fn nothing_is_copied_when_no_record_is_served_or_a_newer_one_expired() {
        assert!(planned(&[Ok(record(5, false, 900)), Ok(None)]).is_empty());
        assert!(planned(&[Ok(None), Err(())]).is_empty());
        // Copy 0 holds a newer, expired version: the served older record never overwrites it.
        let copies = [Ok(record(7, false, 900)), Ok(record(5, false, 2_000))];
        assert!(planned(&copies).is_empty());
    }

    fn families() -> Families {
        fixture::families(
            "[default_family]\ncopies = 1\n[[family]]\nprefix = \"hot:\"\ncopies = 4\nplacement = \"suffix\"\n[[family]]\nprefix = \"paused:\"\ncopies = 4\n[[family]]\nprefix = \"spread:\"\ncopies = 4\nplacement = \"spread\"\n\
             [[family]]\nprefix = \"one:\"\ncopies = 1\nplacement = \"suffix\"\nsplit = { mode = \"split\", max_copies = 8 }\n\
             [[family]]\nprefix = \"watched:\"\ncopies = 1\nsplit = { mode = \"observe\", max_copies = 8 }\n",
        )
    }

    /// The checked key and its copy count of `stored`, with `split` the split copies of
    /// `one:split` and `hot:split` (every other key is not split).
    fn checked(
        families: &Families,
        paused: &[String],
        stored: &str,
        split: Option<u32>,
    ) -> Option<(String, u32, Placement)> {
        let split_copies =
            |_: &Family, key: &Key| split.filter(|_| key.as_str().ends_with(":split"));
        checked_key(stored, families, paused, split_copies).map(|(key, family)| {
            let copies = copy_count(family, split_copies(family, &key));
            (key.as_str().to_owned(), copies, family.placement)
        })
    }

    #[test]
    fn only_copies_below_n_of_split_unpaused_families_are_checked() {
        let families = families();
        let paused = vec!["paused:".to_owned()];
        let check = |stored: &str| checked(&families, &paused, stored, None);
        assert_eq!(
            check("hot:a#3"),
            Some(("hot:a".to_owned(), 4, Placement::Suffix))
        );
        let spread = Key::parse("spread:a").unwrap();
        let expected = Some(("spread:a".to_owned(), 4, Placement::Spread));
        for index in 0..4 {
            let name = spread.copy_key(index, Placement::Spread);
            assert_eq!(check(name.as_str()), expected, "{name}");
        }
        assert_eq!(
            check(spread.copy_key(2, Placement::Suffix).as_str()),
            expected
        );
        for ignored in [
            spread.copy_key(4, Placement::Spread),
            Key::parse("hot:a").unwrap().copy_key(2, Placement::Spread),
        ] {
            assert_eq!(check(ignored.as_str()), None, "{ignored}");
        }
        for ignored in [
            "hot:a#4",
            "hot:a#99",
            "hot:a#v",
            "hot:a#01",
            "foo#bar",
            "cold#0",
            "paused:a#0",
            "#hotsplit#layout#hot:",
            "one:a#0",
        ] {
            assert_eq!(check(ignored), None, "{ignored}");
        }
        assert_eq!(
            patterns(&families),
            vec!["paused:*#*", "spread:*#*", "hot:*#*"]
        );
    }

    #[test]
    fn a_split_key_is_checked_up_to_its_split_copies_and_no_further() {
        let families = families();
        let check = |stored: &str, split| checked(&families, &[], stored, split);
        // A key of a one-copy family is checked while split, with every copy below the split
        // count, and under its family's copies alone (not at all here) once publishes stop
        // writing the split copies.
        for index in 0..8 {
            assert_eq!(
                check(&format!("one:split#{index}"), Some(8)),
                Some(("one:split".to_owned(), 8, Placement::Suffix)),
                "one:split#{index}"
            );
        }
        for (stored, split) in [
            ("one:split#8", Some(8)),
            ("one:split#0", None),
            ("one:split#3", None),
            ("one:other#1", Some(8)),
        ] {
            assert_eq!(check(stored, split), None, "{stored} with {split:?}");
        }
        // A key of a family of several copies: its split count when larger, the family's
        // copies after.
        assert_eq!(
            check("hot:split#6", Some(8)),
            Some(("hot:split".to_owned(), 8, Placement::Suffix))
        );
        assert_eq!(check("hot:split#6", None), None);
        assert_eq!(
            check("hot:split#3", None),
            Some(("hot:split".to_owned(), 4, Placement::Suffix))
        );
        let family = families.resolve(&Key::parse("hot:x").unwrap());
        assert_eq!(copy_count(family, Some(2)), 4, "never below the family's");
        // Scanned: families of several copies. Walked from the index: one-copy families that
        // split, and those whose keys another instance split (an `observe` family here); not a
        // one-copy family otherwise.
        let none = Families::new(&Default::default(), &[]);
        assert!(patterns(&none).is_empty());
        assert!(indexed(&none, |_| false).is_empty());
        assert_eq!(
            indexed(&none, |_| true).len(),
            1,
            "the default family, whose keys another instance split"
        );
        let names = |walked: Vec<&Family>| -> Vec<String> {
            walked
                .iter()
                .map(|family| family.name().to_owned())
                .collect()
        };
        assert_eq!(names(indexed(&families, |_| false)), vec!["one:"]);
        assert_eq!(
            names(indexed(&families, |name| name == "watched:")),
            vec!["watched:", "one:"]
        );
    }
}
