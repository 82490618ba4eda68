//! The session a caller carries: the floors of its token as one request (or one connection)
//! goes, what the operations add to it, and whether the token that came is still its token.

use bytes::Bytes;

use super::Ops;
use crate::fleet::session::{Session, SessionFloor};
use crate::fleet::Sessions;

/// The floors one client carries in its session token (`crate::fleet::session`), as an
/// operation found them and left them.
///
/// A door decodes the token it was sent into one ([`Ops::session`]), hands it to every
/// operation of the request (or of the connection: a Redis-protocol door keeps one per
/// connection), and sends back [`Ops::session_token`] when [`ClientSession::carries_token`].
#[derive(Debug, Clone, Default)]
pub struct ClientSession {
    /// The floors: the token's (its expired floors dropped), then what the operations added.
    floors: Session,
    /// Whether a token came at all: the answer then carries one back even when it is empty, so
    /// a client drops an ignored or expired token.
    sent: bool,
    /// Whether `floors` is exactly the token that came (a valid token, none of its floors
    /// expired, nothing recorded since that changed it): a door may then send back the token's
    /// own text instead of encoding the same token again (a token has one spelling).
    exact: bool,
}

impl ClientSession {
    /// The session of a caller that sent no token.
    pub fn none() -> ClientSession {
        ClientSession::default()
    }

    /// The session of a caller that asked for one but holds no token yet (the Redis door's
    /// `SESSION` with no token): empty, and its answer carries a token.
    pub fn started() -> ClientSession {
        ClientSession {
            sent: true,
            ..ClientSession::default()
        }
    }

    /// The floors held.
    pub fn floors(&self) -> &Session {
        &self.floors
    }

    /// Whether a token came with the request.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// Whether the floors are still exactly the token that came, byte for byte: a door that
    /// kept the token's text may send it back as it came.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// Whether the answer carries a token: when the session holds a floor, or a token came (an
    /// ignored or emptied token is then replaced by the empty one).
    pub fn carries_token(&self) -> bool {
        !self.floors.is_empty() || self.sent
    }

    /// Records `floor` (see [`Sessions::record`]); the session stops being exact when that
    /// changed it.
    pub(super) fn record(&mut self, sessions: &Sessions, floor: SessionFloor, now_ms: u64) {
        if sessions.record(&mut self.floors, floor, now_ms) {
            self.exact = false;
        }
    }
}

impl Ops {
    /// The session the tokens `lines` carry (every line as sent, each one or several
    /// comma-separated tokens; none when no token came), counted by outcome. Several tokens are
    /// merged so that a floor only ever rises ([`crate::fleet::session::Session::merge`]): a
    /// client whose calls ran at once sends every token it holds and keeps the one answered. A
    /// token is never an error: an unknown, garbled, oversized or forged token is ignored (alone
    /// it starts an empty session), and the answer carries a fresh token in its place.
    pub fn session(&self, lines: &[&[u8]], now_ms: u64) -> ClientSession {
        if lines.is_empty() {
            return ClientSession::none();
        }
        let (floors, exact) = self.sessions().incoming_exact(lines, now_ms);
        ClientSession {
            floors,
            sent: true,
            exact,
        }
    }

    /// The token text of `session`, as shared bytes (base64url: always a valid header value or
    /// bulk string).
    pub fn session_token(&self, session: &ClientSession) -> Bytes {
        self.sessions().encode_bytes(&session.floors)
    }
}
