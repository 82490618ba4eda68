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
//!   class's budget allows it) and is not touched.
//! - **A session-token reader** already gets `below_version_floor` from its token's floor; its
//!   refusal here says why and what to do.
//!
//! Both refusals last until a publish above the lost version lands, or the floor expires (the
//! high-water with the copy's expiry, a token's floor with the copy it was served from).

use super::high_water::Mark;
use super::Ops;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Version;
use crate::read::{Caller, Carried, Found, Read, ReadAnswer, ReadRequest};
use crate::store::Role;

/// What a refused reader is told after the floor's figures.
const WHAT_TO_DO: &str = "if a write is still queued for retry it lands within moments, so \
retry; if the refusal lasts, a failover or a restart lost the versions above what the copies \
hold: publish the key again above that version, or read without the floor (a new session, \
`copy=`) to accept the older value";

impl Ops {
    /// The rollback guard of a read naming a client (see the module doc): `read` itself when
    /// its answer is not below this instance's exact high-water mark for the key or came from a
    /// replica; else the read again (with the same carried floors) with the mark as its floor.
    ///
    /// # Errors
    /// [`ErrorKind::BelowVersionFloor`] naming the rollback when no consulted copy reaches the
    /// mark; any error of the second read.
    pub(super) async fn guard_rollback(
        &self,
        request: &ReadRequest,
        read: Read,
        carried: Carried,
        now_ms: u64,
    ) -> Result<Read> {
        let Caller::Client(_) = &request.caller else {
            return Ok(read);
        };
        let Some(Mark::Exact(high_water)) = self.high_water().floor(&request.key, now_ms) else {
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
        match self.reader().read(&again, carried).await {
            Ok(read) => Ok(read),
            Err(err) if err.kind() == ErrorKind::BelowVersionFloor => {
                tracing::warn!(
                    key = %request.key,
                    served = served.get(),
                    high_water = high_water.get(),
                    "a copy went back below a version this instance served (a failover or a restart lost versions): a reader naming a client is refused, not served the older one"
                );
                Err(Error::new(
                    ErrorKind::BelowVersionFloor,
                    format!(
                        "{}: the copies were set back below version {high_water}, which this \
                         instance served or accepted for the key; {WHAT_TO_DO}",
                        err.message()
                    ),
                ))
            }
            Err(err) => Err(err),
        }
    }
}

/// A below-floor refusal of a read whose session token holds `session_floor`, the floor that
/// bound it, with the cause and what to do added; any other error as it was.
pub(super) fn name_session_cause(err: Error, session_floor: Option<Version>) -> Error {
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
