//! A read for a caller: who the caller is decides the floors it brings (its session token's, and
//! a pooled connection's share of the instance high-water), and what the read found leaves its
//! floors through the after-answer step (`after`).

use super::after::{Left, Pins};
use super::high_water::Mark;
use super::{rollback, ClientSession, Ops};
use crate::error::Result;
use crate::read::{Caller, Carried, Read, ReadAnswer, ReadRequest};
use crate::store::now_unix_ms;

impl Ops {
    /// Reads `request.key` for a caller whose session is `session`. The floors it brings: the
    /// session's for the key (a written floor as an own-write floor, a served one as a seen
    /// floor), and for a pooled caller ([`Caller::Pooled`]) the instance's high-water of the
    /// key — exact, a floor never undercut; estimated, only preferred. What the read showed (a
    /// value, a "not modified", a tombstone's 404) is left as a floor everywhere by
    /// [`Ops::leave`]: the session's seen floor until the copy that answered expires, the
    /// high-water, a seen pin when the read was served away from where the next one goes. A
    /// failed read leaves nothing. A read naming a client is never served below an exact mark
    /// of this instance's high-water from a primary whose copy was set back (`rollback.rs`).
    ///
    /// No store call is awaited when the near cache answers.
    ///
    /// # Errors
    /// As [`crate::read::Reader::read`], and [`crate::ErrorKind::NotFound`] for a missing key
    /// or a tombstone ([`crate::Error::invalidated_at`] then names its version).
    pub async fn read(
        &self,
        request: ReadRequest,
        session: &mut ClientSession,
    ) -> Result<ReadAnswer> {
        let begun = self.begin_read(&request, session);
        let read = self
            .reader()
            .read(&request, begun.carried)
            .await
            .map_err(|err| rollback::name_session_cause(err, begun.session_floor))?;
        let read = self
            .guard_rollback(&request, read, begun.carried, begun.now_ms)
            .await?;
        self.end_read(&request, &begun, read, session)
    }

    /// [`Ops::read`] when memory answers it (the near cache, or a refusal made before any
    /// store call): the same answer and the same floors left, with no future. `None`, having
    /// changed nothing, when the read needs the store, or when its answer could need the
    /// rollback guard's second read (a reader naming a client, for a key with an exact
    /// high-water mark): the caller then runs [`Ops::read`].
    ///
    /// # Errors
    /// As [`Ops::read`].
    pub fn read_now(
        &self,
        request: &ReadRequest,
        session: &mut ClientSession,
    ) -> Option<Result<ReadAnswer>> {
        let begun = self.begin_read(request, session);
        if matches!(request.caller, Caller::Client(_))
            && matches!(
                self.high_water().floor(&request.key, begun.now_ms),
                Some(Mark::Exact(_))
            )
        {
            return None;
        }
        let read = match self.reader().read_now(request, begun.carried)? {
            Ok(read) => read,
            Err(err) => return Some(Err(rollback::name_session_cause(err, begun.session_floor))),
        };
        Some(self.end_read(request, &begun, read, session))
    }

    /// The floors a read of `request` carries (the session's, a pooled caller's share of the
    /// high-water), read once at its start.
    fn begin_read(&self, request: &ReadRequest, session: &ClientSession) -> Begun {
        let now_ms = now_unix_ms();
        let key_hash = self.sessions().key_hash(&request.key);
        let mut carried = Carried {
            session: session.floors().floors(key_hash, now_ms),
            ..Carried::default()
        };
        if matches!(request.caller, Caller::Pooled(_)) {
            match self.high_water().floor(&request.key, now_ms) {
                Some(Mark::Exact(version)) => carried.floor = Some(version),
                Some(Mark::Estimate(version)) => carried.estimate = Some(version),
                None => {}
            }
        }
        // The session's floor, when it is the one that binds: a refusal below it says why.
        let session_floor = carried
            .session
            .written
            .max(carried.session.seen)
            .filter(|floor| {
                Some(*floor) >= request.min_version && Some(*floor) >= request.if_none_match
            });
        Begun {
            now_ms,
            key_hash,
            carried,
            session_floor,
        }
    }

    /// The after-answer step of a read that found `read`, then its answer.
    fn end_read(
        &self,
        request: &ReadRequest,
        begun: &Begun,
        read: Read,
        session: &mut ClientSession,
    ) -> Result<ReadAnswer> {
        let Read { found, trail } = read;
        let pins = match (trail.seen, request.caller.client_id()) {
            (Some(version), Some(client)) => Pins::Seen { client, version },
            _ => Pins::None,
        };
        self.leave(
            Left {
                key: &request.key,
                key_hash: begun.key_hash,
                now_ms: begun.now_ms,
                floor: trail.shown,
                written: false,
                pins,
                void_near: trail.void_near,
            },
            session,
        );
        Read {
            found,
            trail: Default::default(),
        }
        .into_answer()
    }
}

/// What a read carries from its start to its after-answer step.
struct Begun {
    /// The clock when it started (floors' expiry).
    now_ms: u64,
    /// The key's hash in the session's floors.
    key_hash: u64,
    /// The floors it carries.
    carried: Carried,
    /// The session's floor, when it is the one that binds.
    session_floor: Option<crate::key::Version>,
}
