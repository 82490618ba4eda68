//! A read for a caller: the session's floors for the key go in, and the version served comes
//! out as a floor of the session.

use super::{rollback, ClientSession, Ops};
use crate::deadline::Deadline;
use crate::error::Result;
use crate::fleet::session::SessionFloor;
use crate::key::{Key, Version};
use crate::read::{CopyChoice, ReadAnswer, ReadRequest};
use crate::store::now_unix_ms;

/// One read, as a door parsed it.
#[derive(Debug, Clone)]
pub struct ReadCall {
    /// The key to read.
    pub key: Key,
    /// The client's affine copy, or one named copy.
    pub copy: CopyChoice,
    /// A version floor the caller sent itself: a copy below it is never served.
    pub min_version: Option<Version>,
    /// The highest version among the caller's entity tags: a floor too, and the answer is "not
    /// modified" when no consulted copy is newer.
    pub if_none_match: Option<Version>,
    /// The read class the caller named; `None` uses the family's default class.
    pub class: Option<String>,
    /// The caller's request id: pinned to primaries after that request wrote.
    pub request_id: Option<String>,
    /// When the read must be answered (see the module doc); `None`: only the store's own
    /// command timeout bounds each call.
    pub deadline: Option<Deadline>,
}

impl Ops {
    /// Reads `call.key` for a caller whose session is `session`: the session's floors for the
    /// key hold as this instance's own memory of the client (a written floor as an own-write
    /// floor, a served one as a seen floor), and the version served (or found not modified)
    /// becomes a seen floor of the session until the copy that answered expires, so the
    /// client's next read, through any instance, does not go below it. A failed read leaves the
    /// session as it was. A read naming a client is never served below this instance's
    /// high-water from a primary whose copy was set back (`rollback.rs`).
    ///
    /// No store call is awaited when the near cache answers.
    ///
    /// # Errors
    /// As [`crate::read::Reader::read`].
    pub async fn read(&self, call: ReadCall, session: &mut ClientSession) -> Result<ReadAnswer> {
        let sessions = self.sessions();
        let now_ms = now_unix_ms();
        let key_hash = sessions.key_hash(&call.key);
        let request = ReadRequest {
            session: session.floors().floors(key_hash, now_ms),
            key: call.key,
            copy: call.copy,
            min_version: call.min_version,
            if_none_match: call.if_none_match,
            class: call.class,
            request_id: call.request_id,
            deadline: call.deadline,
        };
        // The session's floor, when it is the one that binds: a refusal below it says why.
        let session_floor = request
            .session
            .written
            .max(request.session.seen)
            .filter(|floor| {
                Some(*floor) >= request.min_version && Some(*floor) >= request.if_none_match
            });
        let answer = self
            .reader()
            .read(&request)
            .await
            .map_err(|err| rollback::name_session_cause(err, session_floor))?;
        let answer = self.guard_rollback(&request, answer, now_ms).await?;
        let (ReadAnswer::Value {
            version,
            expire_at_ms,
            ..
        }
        | ReadAnswer::NotModified {
            version,
            expire_at_ms,
            ..
        }) = &answer;
        let floor = SessionFloor {
            key_hash,
            version: *version,
            expire_at_ms: *expire_at_ms,
            written: false,
        };
        session.record(sessions, floor, now_ms);
        self.high_water()
            .record(&request.key, *version, *expire_at_ms, now_ms);
        Ok(answer)
    }
}
