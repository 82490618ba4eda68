//! The placement of a family whose config names none, chosen at startup before anything
//! serves: `spread` for a family with no copies yet, and `suffix` kept for a family that
//! already has `K#i` copies or live readers of them, until an operator moves it with the
//! rolling change (`placing`). An explicit `placement` is an operator's choice and is never
//! changed here.
//!
//! How a family is told apart, first match wins:
//! 1. Another live instance of the family runs `spread` (code 2 or 3 in its placement set):
//!    `spread`, as the fleet runs it.
//! 2. A live instance reads `K#i`: one configured `suffix` (code 1), or a release before
//!    placement (in the family's live set, not in its placement set): `suffix`.
//! 3. No instance is live: a scan of the family's copy names. A tagged copy (`K#i{t}`) means
//!    the family ran `spread` (its `K#i` may be gone with a closed window): `spread`. Else a
//!    `K#i` with `i ≥ 1` means it has `suffix` copies: `suffix`. Else it has no copies beyond
//!    copy 0, which is `K#0` under both: `spread`. Copy 1 is what the scan looks for: every key
//!    of more than one copy has one.

use super::placing::{placement_set, CODE_SPREAD_PENDING, CODE_SPREAD_READING, CODE_SUFFIX};
use super::{glob_escape, LayoutStores, Liveness};
use crate::error::Result;
use crate::family::{Families, Family};
use crate::key::{CopyKey, Placement};
use crate::placement::PlacementReason;
use crate::store::LiveMember;

/// How many matching names one scan of step 3 looks at: one copy of the family is enough, and
/// the pattern matches only copy names of its prefix.
const SCAN_LIMIT: usize = 1000;

/// `families` with a placement chosen for each family whose config names none (see the
/// module doc), each family's placement and reason logged.
///
/// # Errors
/// Store errors of the scan of step 3.
pub async fn choose_placements(
    stores: &LayoutStores,
    mut families: Families,
    liveness: &Liveness,
) -> Result<Families> {
    let unset: Vec<Family> = families
        .iter()
        .filter(|family| family.placement_reason == PlacementReason::Unset)
        .cloned()
        .collect();
    for family in &unset {
        let (placement, reason) = choose(stores, &families, family, liveness).await?;
        families.choose_placement(family.name(), placement, reason);
    }
    for family in families.iter() {
        tracing::info!(
            family = family.name(),
            copies = family.copies,
            placement = family.placement.as_str(),
            reason = family.placement_reason.as_str(),
            "copy placement"
        );
    }
    Ok(families)
}

/// The placement of `family` (not configured) and why.
async fn choose(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
    liveness: &Liveness,
) -> Result<(Placement, PlacementReason)> {
    let name = family.name();
    let ttl_ms = crate::duration::millis(liveness.ttl());
    let instance = &liveness.instance;
    // Joined as the startup join does (the family's live set with its copy count, the
    // placement set with code 2, which reads nothing yet); left below when it chooses
    // `suffix`, so the startup join's code 1 is its only entry.
    let live = stores
        .layouts
        .join_live(name, family.copies, instance, ttl_ms)
        .await;
    let set = placement_set(name);
    let placed = stores
        .layouts
        .join_live(&set, CODE_SPREAD_PENDING, instance, ttl_ms)
        .await;
    let chosen = match (live, placed) {
        (Ok(live), Ok(placed)) => from_live(&live, &placed),
        (Err(err), _) | (_, Err(err)) => {
            tracing::warn!(family = name, error = %err, "cannot read the family's live sets: choosing its placement from its stored copies");
            None
        }
    };
    let chosen = match chosen {
        Some(chosen) => chosen,
        None => from_copies(stores, families, family).await?,
    };
    if chosen.0 == Placement::Suffix {
        if let Err(err) = stores
            .layouts
            .leave_layout(&set, CODE_SPREAD_PENDING, instance)
            .await
        {
            tracing::debug!(family = name, error = %err, "cannot leave the placement set: the entry lapses");
        }
    }
    Ok(chosen)
}

/// Steps 1 and 2 of the module doc: from the other live instances, `None` when none is live.
fn from_live(live: &[LiveMember], placed: &[LiveMember]) -> Option<(Placement, PlacementReason)> {
    if placed
        .iter()
        .any(|member| matches!(member.copies, CODE_SPREAD_PENDING | CODE_SPREAD_READING))
    {
        return Some((Placement::Spread, PlacementReason::SpreadInUse));
    }
    let older = !LiveMember::missing_from(live, placed).is_empty();
    if older || placed.iter().any(|member| member.copies == CODE_SUFFIX) {
        return Some((Placement::Suffix, PlacementReason::SuffixCopiesExist));
    }
    None
}

/// Step 3 of the module doc: from the family's stored copy names.
async fn from_copies(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
) -> Result<(Placement, PlacementReason)> {
    // Copy 1 is written whenever a key has more than one copy (a split key's too), so it is
    // the one looked for, under each naming (patterns without classes, which every store's
    // scan matches).
    let prefix = glob_escape(&family.prefix);
    let tagged = format!("{prefix}*#1{{*}}");
    if has_copies(stores, families, family, (&tagged, Placement::Spread)).await? {
        return Ok((Placement::Spread, PlacementReason::SpreadInUse));
    }
    let untagged = format!("{prefix}*#1");
    if has_copies(stores, families, family, (&untagged, Placement::Suffix)).await? {
        return Ok((Placement::Suffix, PlacementReason::SuffixCopiesExist));
    }
    Ok((Placement::Spread, PlacementReason::NewFamily))
}

/// Whether a scan of `pattern` finds a copy of `family`'s keys with an index of at least 1
/// named under `placement`.
async fn has_copies(
    stores: &LayoutStores,
    families: &Families,
    family: &Family,
    (pattern, placement): (&str, Placement),
) -> Result<bool> {
    let names = stores.layouts.scan_keys(pattern, SCAN_LIMIT).await?;
    Ok(names.iter().any(|stored| {
        CopyKey::parse(stored).is_some_and(|(key, copy_key)| {
            copy_key.index() >= 1
                && copy_key.placement() == placement
                && families.resolve(&key).name() == family.name()
        })
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::family::fixture;
    use crate::key::Key;
    use crate::store::memory::MemoryStore;
    use crate::store::{CopyStore, CopyWrite, LayoutStore, Payload};

    const CONFIG: &str = "[[family]]\nprefix = \"new:\"\ncopies = 4\n[[family]]\nprefix = \"old:\"\ncopies = 4\n[[family]]\nprefix = \"was:\"\ncopies = 4\n[[family]]\nprefix = \"set:\"\ncopies = 4\nplacement = \"suffix\"\n[[family]]\nprefix = \"live:\"\ncopies = 4\n";

    fn liveness(instance: &str) -> Liveness {
        Liveness {
            instance: instance.to_owned(),
            release: "0.1.0".to_owned(),
            interval: Duration::from_secs(1),
            command_timeout: Duration::from_millis(1),
        }
    }

    #[tokio::test]
    async fn a_new_family_is_spread_and_one_with_suffix_copies_or_readers_keeps_suffix() {
        let store = Arc::new(MemoryStore::new());
        let copy = |key: &str, index, placement| CopyWrite {
            copy_key: Key::parse(key).unwrap().copy_key(index, placement),
            version: crate::key::Version::new(1).unwrap(),
            payload: Payload::Value(bytes::Bytes::new()),
            expire_at_ms: crate::store::now_unix_ms() + 60_000,
        };
        store
            .write_copies(&[
                copy("new:1", 0, Placement::Suffix),
                copy("old:1", 1, Placement::Suffix),
                copy("was:1", 1, Placement::Spread),
                copy("set:1", 0, Placement::Suffix),
            ])
            .await;
        // A live instance configured `suffix` in `live:`.
        store
            .join_live(&placement_set("live:"), CODE_SUFFIX, "b", 60_000)
            .await
            .unwrap();
        let families = choose_placements(
            &LayoutStores::of(&store),
            fixture::families(CONFIG),
            &liveness("a"),
        )
        .await
        .unwrap();
        let of = |key: &str| {
            let family = families.resolve(&Key::parse(key).unwrap());
            (family.placement, family.placement_reason)
        };
        assert_eq!(of("new:1"), (Placement::Spread, PlacementReason::NewFamily));
        assert_eq!(
            of("old:1"),
            (Placement::Suffix, PlacementReason::SuffixCopiesExist)
        );
        assert_eq!(
            of("was:1"),
            (Placement::Spread, PlacementReason::SpreadInUse)
        );
        assert_eq!(
            of("set:1"),
            (Placement::Suffix, PlacementReason::Configured)
        );
        assert_eq!(
            of("live:1"),
            (Placement::Suffix, PlacementReason::SuffixCopiesExist)
        );
        // The default family has one copy and no copies stored: spread.
        assert_eq!(of("other"), (Placement::Spread, PlacementReason::NewFamily));
        // The choice of `suffix` left no code-2 entry of this instance behind.
        let seen_by_c = store
            .join_live(&placement_set("live:"), CODE_SUFFIX, "c", 60_000)
            .await
            .unwrap();
        assert!(
            seen_by_c.iter().all(|member| member.instance != "a"),
            "{seen_by_c:?}"
        );
        // A second instance of an unconfigured family joins the first one's choice.
        let again = choose_placements(
            &LayoutStores::of(&store),
            fixture::families(CONFIG),
            &liveness("d"),
        )
        .await
        .unwrap();
        let new = again.resolve(&Key::parse("new:1").unwrap());
        assert_eq!(
            (new.placement, new.placement_reason),
            (Placement::Spread, PlacementReason::SpreadInUse)
        );
    }
}
