//! A read for a caller: who the caller is decides the floors it brings (its session token's, and
//! a pooled connection's share of the instance high-water), and what the read found leaves its
//! floors through the after-answer step (`after`).

use super::after::{Left, Pins};
use super::high_water::Mark;
use super::{ClientSession, Ops};
use crate::error::Result;
use crate::near::Now;
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
        let read = self.reader().read(&request, begun.carried).await;
        let read = self.guard_rollback(&request, read, &begun).await?;
        self.end_read(&request, &begun, read, session)
    }

    /// [`Ops::read`] when memory answers it (the near cache, or with one a refusal made before
    /// any store call): the same answer and the same floors left, with no future, decided by
    /// the clock in `clock`: one the caller shares among requests that had all arrived when it
    /// was read, or, when it holds none, one read here (after the request arrived) and left
    /// there. `None`, having
    /// changed nothing, when the read needs the store, or when its answer needs the rollback
    /// guard's second read (a reader naming a client answered from a primary's fill below the
    /// key's exact high-water mark): the caller then runs [`Ops::read`].
    ///
    /// # Errors
    /// As [`Ops::read`].
    pub fn read_now(
        &self,
        request: &ReadRequest,
        session: &mut ClientSession,
        clock: &mut Option<Now>,
    ) -> Option<Result<ReadAnswer>> {
        // Without a near cache only a refusal could be decided from memory, and `Ops::read`
        // decides it the same: the read's start (clock, key hash, floors, high-water) is not
        // done twice for that.
        self.reader().near_cache()?;
        let now = *clock.get_or_insert_with(Now::read);
        let begun = self.begin_read_at(request, session, now.unix_ms);
        let held_to = self.guarded_mark(request, begun.now_ms);
        let read = match self
            .reader()
            .read_now(request, begun.carried, held_to, now)?
        {
            Ok(read) => read,
            Err(err) => return Some(Err(self.name_refusal_cause(request, err, &begun))),
        };
        Some(self.end_read(request, &begun, read, session))
    }

    /// Starts a read of `request` ahead of its turn: a pipelined batch's reads are sent
    /// together and concluded in order ([`Ops::conclude_ahead`]). The floors it carries are
    /// read now, from `session` as the reads before it in the batch have not yet left it.
    pub fn begin_ahead(&self, request: ReadRequest, session: &ClientSession) -> Ahead {
        let begun = self.begin_read(&request, session);
        let mark = self.high_water().floor(&request.key, begun.now_ms);
        Ahead {
            request,
            begun,
            mark,
        }
    }

    /// The part of a read started ahead that waits: the store reads (the near cache may answer
    /// at once) and the rollback guard's second read. Touches no session: every step that
    /// leaves a floor is [`Ops::conclude_ahead`]'s. The caller bounds it by the request's
    /// deadline (a run's reads share one, and are awaited under one timer): the first read
    /// arms no timer of its own.
    ///
    /// # Errors
    /// As [`Ops::read`], but a passed deadline, which the caller's bound gives.
    pub async fn fetch_ahead(&self, ahead: &Ahead) -> Result<Read> {
        let read = self
            .reader()
            .read_under_callers_deadline(&ahead.request, ahead.begun.carried)
            .await;
        self.guard_rollback(&ahead.request, read, &ahead.begun)
            .await
    }

    /// Concludes a read started ahead, in its turn. The first of a run (`after_others`
    /// false) is [`Ops::read`] itself: nothing before it could move its floors. A later one:
    /// when the floors it would carry now (after the reads before it left theirs) are the ones
    /// it was sent with, what it `fetched` is what [`Ops::read`] run now with the same floors
    /// could have answered (a moment earlier, after the command arrived), and the
    /// after-answer step leaves its floors. When any floor moved (a read before it raised the
    /// key's high-water or the session's floor, a floor expired, another connection's read
    /// moved the estimate), the fetched answer is dropped, having left nothing, and the
    /// request is given back: the caller runs [`Ops::read`] with it, in turn.
    ///
    /// The answer's errors are [`Ops::read`]'s.
    pub fn conclude_ahead(
        &self,
        ahead: Ahead,
        fetched: Result<Read>,
        after_others: bool,
        session: &mut ClientSession,
    ) -> Concluded {
        if after_others {
            let now = self.begin_read(&ahead.request, session);
            if now.carried != ahead.begun.carried
                || self.high_water().floor(&ahead.request.key, now.now_ms) != ahead.mark
            {
                return Concluded::Again(Box::new(ahead.request));
            }
        }
        Concluded::Answered(
            fetched.and_then(|read| self.end_read(&ahead.request, &ahead.begun, read, session)),
        )
    }

    /// The floors a read of `request` carries (the session's, a pooled caller's share of the
    /// high-water), read once at its start.
    fn begin_read(&self, request: &ReadRequest, session: &ClientSession) -> Begun {
        self.begin_read_at(request, session, now_unix_ms())
    }

    /// [`Ops::begin_read`] by the wall clock `now_ms`.
    fn begin_read_at(&self, request: &ReadRequest, session: &ClientSession, now_ms: u64) -> Begun {
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

/// A read started ahead of its turn ([`Ops::begin_ahead`]): its request, the floors it was
/// sent with, and the key's high-water mark then.
pub struct Ahead {
    /// The read.
    request: ReadRequest,
    /// Its start: the clock, the key's hash, the floors it carries.
    begun: Begun,
    /// The key's high-water mark at its start (the rollback guard reads it for a reader naming
    /// a client, a pooled reader carries it).
    mark: Option<Mark>,
}

/// How a read started ahead ended in its turn ([`Ops::conclude_ahead`]).
pub enum Concluded {
    /// Its answer, its floors left.
    Answered(Result<ReadAnswer>),
    /// Its floors moved: run [`Ops::read`] with the request, in turn.
    Again(Box<ReadRequest>),
}

/// What a read carries from its start to its after-answer step.
pub(super) struct Begun {
    /// The clock when it started (floors' expiry).
    pub(super) now_ms: u64,
    /// The key's hash in the session's floors.
    key_hash: u64,
    /// The floors it carries.
    pub(super) carried: Carried,
    /// The session's floor, when it is the one that binds.
    pub(super) session_floor: Option<crate::key::Version>,
}
