//! What each command does for a connection (to be written): the handshake, reads and writes
//! through [`crate::ops`], transactions, and the refusals.

use bytes::Bytes;

use super::reply::{Proto, Reply};
use crate::deadline::Deadline;
use crate::http::AppState;
use crate::ops::ClientSession;

/// What the door shares across connections: the operations, the token table, the metrics, the
/// limits. Cheap to clone.
#[derive(Clone)]
pub struct Door {
    /// The HTTP door's state: its operations, tokens, metrics and limits are this door's too.
    state: AppState,
}

impl Door {
    /// The door over the service's `state`.
    pub fn new(state: AppState) -> Door {
        Door { state }
    }

    /// The service state.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Runs one command (`args[0]` its name, as sent) for the connection `conn`, bounded by
    /// `deadline` where it calls the store; says whether the connection goes on.
    pub async fn execute(
        &self,
        conn: &mut ConnState,
        args: Vec<Bytes>,
        deadline: Option<Deadline>,
    ) -> (Reply, After) {
        let _ = (conn, args, deadline);
        (Reply::error("ERR not yet"), After::Continue)
    }

    /// Whether `conn` may still run commands: false once a reload revoked the token it
    /// authenticated with (the connection loop then closes it).
    pub fn still_authorized(&self, conn: &ConnState) -> bool {
        let _ = conn;
        true
    }
}

/// What a connection goes on with after a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Read the next command.
    Continue,
    /// Write the reply, then close (`QUIT`, a revoked token).
    Close,
}

/// One connection's state, carried from command to command.
#[derive(Debug, Default)]
pub struct ConnState {
    /// The connection's id (`CLIENT ID`, logs).
    pub id: u64,
    /// The protocol it speaks.
    pub proto: Proto,
    /// The session floors it carries (one per connection).
    pub session: ClientSession,
}
