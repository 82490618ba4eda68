//! Choosing a read's answer among the consulted copies, and the repair it leaves.

use super::{Consulted, ReadAnswer, RouteNote};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{Key, Placement, Version};
use crate::route::{ReadClass, RouteReason};
use crate::store::{CopyRecord, CopyWrite, Payload, Role, ServedBy};

/// The write that brings the affine copy up to the newest consulted sibling, when the affine copy
/// answered and is missing or older (a failed read is not repaired: its node is unreachable). A
/// sibling's tombstone at the affine copy's own version is newer than the affine value, so it is
/// spread too.
pub(super) fn repair_of(
    key: &Key,
    affine: u32,
    placement: Placement,
    consulted: &[Consulted],
) -> Option<CopyWrite> {
    let first = consulted.first()?;
    // A replica's copy may only be behind by replication lag: the primary's copy is not known
    // to be stale, so nothing is repaired.
    if first.read.served_by.role == Role::Replica {
        return None;
    }
    let held = match &first.read.record {
        Ok(record) => record.as_ref(),
        Err(_) => return None,
    };
    let mut newest: Option<&CopyRecord> = None;
    for sibling in &consulted[1..] {
        if let Ok(Some(record)) = &sibling.read.record {
            if newest.is_none_or(|newest| record.supersedes(newest)) {
                newest = Some(record);
            }
        }
    }
    let newest = newest?;
    if held.is_some_and(|held| !newest.supersedes(held)) {
        return None;
    }
    Some(CopyWrite {
        copy_key: key.copy_key(affine, placement),
        version: newest.version,
        payload: newest.payload.clone(),
        expire_at_ms: newest.expire_at_ms,
    })
}

/// What the consulted copies decided, short of an error.
pub(super) enum Decision {
    /// A value or "not modified".
    Answer(ReadAnswer),
    /// The newest consulted record is a tombstone at or above every floor: 404, and the
    /// tombstone's version is what the reader was shown.
    Invalidated {
        /// The tombstone's version.
        version: Version,
        /// When the tombstone's copy expires, Unix ms: how long the floor it leaves lasts.
        expire_at_ms: u64,
        /// The copy that held it.
        copy: u32,
        /// The node that served it.
        served_by: ServedBy,
        /// Why that node served.
        reason: RouteReason,
    },
}

/// Chooses the answer from the consulted copies (the affine copy first). The newest record
/// wins, a tombstone over a value at the same version. A value below `min_version`, or a
/// tombstone below `min_version` or the `If-None-Match` version, is never the answer: the read
/// is `BelowVersionFloor` (a tombstone below what the reader holds would say "deleted" to a
/// reader that has seen a later value).
pub(super) fn decide(
    consulted: impl IntoIterator<Item = Consulted>,
    min_version: Option<Version>,
    if_none_match: Option<Version>,
    class: ReadClass,
) -> Result<Decision> {
    let mut best: Option<(u32, ServedBy, CopyRecord, RouteReason)> = None;
    let mut last_error: Option<Error> = None;
    for Consulted { copy, read, reason } in consulted {
        match read.record {
            Ok(Some(record)) => {
                let newer = best
                    .as_ref()
                    .is_none_or(|(_, _, held, _)| record.supersedes(held));
                if newer {
                    best = Some((copy, read.served_by, record, reason));
                }
            }
            Ok(None) => {}
            Err(err) => last_error = Some(err),
        }
    }
    let Some((copy, served_by, record, reason)) = best else {
        return Err(match last_error {
            Some(err) => err,
            None => Error::new(ErrorKind::NotFound, "key not found"),
        });
    };
    let floor = match record.payload {
        Payload::Tombstone => min_version.max(if_none_match),
        Payload::Value(_) => min_version,
    };
    if let Some(floor) = floor {
        if record.version < floor {
            return Err(Error::new(
                ErrorKind::BelowVersionFloor,
                format!(
                    "no consulted copy reached version {floor}; the newest holds {}",
                    record.version
                ),
            ));
        }
    }
    let route = RouteNote {
        class,
        reason,
        near_cache_age: None,
    };
    match record.payload {
        Payload::Tombstone => Ok(Decision::Invalidated {
            version: record.version,
            expire_at_ms: record.expire_at_ms,
            copy,
            served_by,
            reason,
        }),
        Payload::Value(_) if if_none_match.is_some_and(|tag| record.version <= tag) => {
            Ok(Decision::Answer(ReadAnswer::NotModified {
                version: record.version,
                copy,
                served_by,
                route,
                expire_at_ms: record.expire_at_ms,
            }))
        }
        Payload::Value(value) => Ok(Decision::Answer(ReadAnswer::Value {
            value,
            version: record.version,
            copy,
            served_by,
            route,
            expire_at_ms: record.expire_at_ms,
        })),
    }
}
