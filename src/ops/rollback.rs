//! Readers holding a floor never go back across a failover that lost versions.
//!
//! A Redis master cut off with some instances keeps taking writes until `cluster-node-timeout`
//! passes; when the majority has promoted its replica meanwhile, the old master rejoins as a
//! replica of the promoted one and drops what it took alone. Every copy it held is then *set
//! back*: the copies hold less than what this instance already served. Two guards keep a reader
//! with a floor from being served the older version:
//!
//! - **A reader naming a client** (an explicit client id, which reads one copy and relies on a
//!   copy only moving forward): when its answer came from a primary below the instance-wide
//!   high-water's exact mark ([`super::HighWater`], what this instance answered or accepted for
//!   the key; an estimate, which may be another key's version, never refuses), the read runs
//!   again with the mark as its floor (a sibling or the primary may hold it);
//!   if no consulted copy reaches it, the answer is `below_version_floor` naming the cause,
//!   never the older value. An answer from a replica below the high-water is ordinary lag (the
//!   class's budget allows it) and is not touched. The doors' inline path
//!   ([`Ops::read_now`]) answers such a reader from the near cache only with an entry at or
//!   above the mark, or one a replica filled; any other goes through the guard
//!   (`fast_path::a_hit_below_the_instances_high_water_is_not_served_from_memory`).
//!   Within the family's `pin_window` after a read served away from where the reader's next
//!   read goes, the seen floor that read left ([`crate::route::Pins`]) refuses first, before
//!   the guard runs: when the key's exact mark is at least every floor the caller sent itself,
//!   no consulted copy holds what this instance served, and that refusal is named and logged
//!   as the guard's own are.
//! - **A session-token reader** already gets `below_version_floor` from its token's floor; its
//!   refusal here says why and what to do.
//!
//! Both refusals last until a publish above the lost version lands, or the floor expires (the
//! high-water with the copy's expiry, a token's floor with the copy it was served from).

use super::high_water::Mark;
use super::read::Begun;
use super::Ops;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Version;
use crate::read::{Caller, Found, Read, ReadAnswer, ReadRequest};
use crate::store::Role;

/// What a refused reader is told after the floor's figures.
const WHAT_TO_DO: &str = "if a write is still queued for retry it lands within moments, so \
retry; if the refusal lasts, a failover or a restart lost the versions above what the copies \
hold: publish the key again above that version, or read without the floor (a new session, \
`copy=`) to accept the older value";

impl Ops {
    /// The rollback guard of a read naming a client (see the module doc), given what the
    /// reader found (`read`) for the read that `begun` started: `read` itself when its answer
    /// is not below this instance's exact high-water mark for the key or came from a replica;
    /// else the read again (with the same carried floors) with the mark as its floor. A
    /// refusal is given its cause: the session's floor when that bound it
    /// ([`name_session_cause`]), else the set-back when the read names a client and the
    /// key's exact mark is at least every floor the caller sent itself.
    ///
    /// # Errors
    /// [`ErrorKind::BelowVersionFloor`] naming the rollback when no consulted copy reaches the
    /// mark; any error of either read.
    pub(super) async fn guard_rollback(
        &self,
        request: &ReadRequest,
        read: Result<Read>,
        begun: &Begun,
    ) -> Result<Read> {
        let read = read.map_err(|err| self.name_refusal_cause(request, err, begun))?;
        let Some(high_water) = self.guarded_mark(request, begun.now_ms) else {
            return Ok(read);
        };
        let Found::Answer(
            ReadAnswer::Value {
                version, served_by, ..
            }
            | ReadAnswer::NotModified {
                version, served_by, ..
            },
        ) = &read.found
        else {
            return Ok(read);
        };
        if *version >= high_water || served_by.role != Role::Primary {
            return Ok(read);
        }
        let served = *version;
        let mut again = request.clone();
        again.min_version = again.min_version.max(Some(high_water));
        match self.reader().read(&again, begun.carried).await {
            Ok(read) => Ok(read),
            Err(err) if err.kind() == ErrorKind::BelowVersionFloor => {
                Err(set_back(request, &err, Some(served), high_water))
            }
            Err(err) => Err(err),
        }
    }

    /// The key's exact high-water mark when `request` names a client: the version the guard
    /// holds such a read to (see the module doc). `None` for any other caller, and when the
    /// mark is an estimate (it may be another key's version) or there is none.
    pub(super) fn guarded_mark(&self, request: &ReadRequest, now_ms: u64) -> Option<Version> {
        let Caller::Client(_) = &request.caller else {
            return None;
        };
        match self.high_water().floor(&request.key, now_ms) {
            Some(Mark::Exact(mark)) => Some(mark),
            _ => None,
        }
    }

    /// `err`, a refusal of the read `begun` started, with its cause named: the session's floor
    /// when that bound it; the set-back (logged) when the read names a client, the key has an
    /// exact high-water mark and no floor the caller sent itself is above it, so the floor
    /// that refused it is one this instance left (a seen floor: what it served) and no
    /// consulted copy holds what it served. Any other error as it was.
    pub(super) fn name_refusal_cause(
        &self,
        request: &ReadRequest,
        err: Error,
        begun: &Begun,
    ) -> Error {
        if begun.session_floor.is_some() || err.kind() != ErrorKind::BelowVersionFloor {
            return name_session_cause(err, begun.session_floor);
        }
        let Some(high_water) = self.guarded_mark(request, begun.now_ms) else {
            return err;
        };
        let sent = request.min_version.max(request.if_none_match);
        if sent.is_some_and(|floor| floor > high_water) {
            return err;
        }
        set_back(request, &err, None, high_water)
    }
}

/// The refusal of a reader naming a client whose copies were set back below `high_water` (the
/// key's exact mark), `err` the reader's refusal and `served` the older version a primary
/// answered, when one did; logged at WARN.
fn set_back(
    request: &ReadRequest,
    err: &Error,
    served: Option<Version>,
    high_water: Version,
) -> Error {
    tracing::warn!(
        key = %request.key,
        served = served.map(Version::get),
        high_water = high_water.get(),
        "a copy went back below a version this instance served (a failover or a restart lost versions): a reader naming a client is refused, not served the older one"
    );
    Error::new(
        ErrorKind::BelowVersionFloor,
        format!(
            "{}: the copies were set back below version {high_water}, which this instance \
             served or accepted for the key; {WHAT_TO_DO}",
            err.message()
        ),
    )
}

/// A below-floor refusal of a read whose session token holds `session_floor`, the floor that
/// bound it, with the cause and what to do added; any other error as it was.
fn name_session_cause(err: Error, session_floor: Option<Version>) -> Error {
    match session_floor {
        Some(floor) if err.kind() == ErrorKind::BelowVersionFloor => Error::new(
            ErrorKind::BelowVersionFloor,
            format!(
                "{}: this session's token holds version {floor} of the key (served or written \
                 earlier) and no copy holds it now; {WHAT_TO_DO}",
                err.message()
            ),
        ),
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_readers_below_floor_refusal_names_its_floor_and_what_to_do() {
        let refusal = Error::new(
            ErrorKind::BelowVersionFloor,
            "no consulted copy reached version 9; the newest holds 1",
        );
        let named = name_session_cause(refusal, Version::new(9).ok());
        assert_eq!(named.kind(), ErrorKind::BelowVersionFloor);
        assert!(
            named
                .message()
                .starts_with("no consulted copy reached version 9")
                && named
                    .message()
                    .contains("this session's token holds version 9")
                && named
                    .message()
                    .contains("publish the key again above that version"),
            "{}",
            named.message()
        );
        // Another error, or a refusal no session floor bound, is left as it was.
        let missing = name_session_cause(
            Error::new(ErrorKind::NotFound, "gone"),
            Version::new(9).ok(),
        );
        assert_eq!(missing.message(), "gone");
        let unbound = name_session_cause(Error::new(ErrorKind::BelowVersionFloor, "below"), None);
        assert_eq!(unbound.message(), "below");
    }
}
