//! Operations: what a read and a publish mean for a caller, whichever door it came through.
//!
//! A door (the HTTP API in [`crate::http`], the Redis protocol in [`crate::resp`]) parses its
//! protocol into the plain types here, calls [`Ops::read`] or [`Ops::publish`], and renders what
//! comes back; it decides nothing a second door would have to decide again. What lives here:
//! - **Session floors in and out** ([`ClientSession`]): a door hands over the token it was
//!   sent ([`Ops::session`] decodes and counts it; a bad token is ignored, never an error);
//!   a read's floors for its key join the instance's own memory of the client; the version a
//!   read served becomes a seen floor until the copy that answered expires; a write leaves a
//!   written floor; [`Ops::session_token`] encodes what to send back, and
//!   [`ClientSession::is_exact`] says when the token that came can be sent back as it came.
//! - **Which floors a write leaves** ([`Ops::floor_left`]), the one rule for every door: a
//!   refused edit (`stale`, `conflict`) or one that landed on no copy and queued none leaves no
//!   floor anywhere (not in the session, not in the instance's own-write or request pin, and
//!   the publisher offered nothing to the near cache); one that landed or queued leaves exactly
//!   its version, until the last copy it applied or queued expires.
//! - **The instance-wide high-water** ([`HighWater`]): the version of every read answer and
//!   of every publish that left a floor is recorded, whichever door called; a door reads it
//!   as the floor of a read that names no client of its own (the Redis door's pooled
//!   connections).
//! - **The publisher call**: a value or a tombstone, with or without a replica wait, with or
//!   without a deadline ([`PublishCall`]).
//! - Identity and class: a read's client id and class name go to the read path as given;
//!   [`crate::route::Router::plan`] resolves them (unknown class, decides-on-presence on a
//!   split family) and [`crate::read::Reader::read`] checks the copy choice.
//!
//! # Deadlines and the in-flight bound
//! An operation takes its deadline as a value ([`crate::deadline::Deadline`]) and bounds every
//! store call it makes with it; it takes no slot of anything. Admission is the door's: the
//! HTTP door gives each request one slot of `server.max_in_flight` and one deadline,
//! `server.request_deadline` after the request arrived (`http::overload`), and one request is
//! one operation.
//!
//! A pipelined batch of commands (the Redis-protocol door) counts **per command**, never per
//! batch: each command takes its own slot when the door starts it and gives it back when its
//! reply is ready, and gets its own deadline from that moment, so a command queued behind
//! others of its connection does not spend its budget waiting, and a batch of any length holds
//! no more slots than the commands it runs at once. A door runs a connection's commands in
//! order (their replies go back in order, written together), so one connection holds at most
//! one slot at a time; a command refused by the bound is answered with the overloaded error
//! and does nothing, and the commands after it are still tried. The session a connection
//! carries is one [`ClientSession`] passed to each of its commands in turn, so a read in a
//! batch sees the floor a write before it left.

mod after;
pub mod high_water;
mod lease;
mod publish;
mod read;
mod rollback;
mod session;
pub mod wire;

use std::sync::Arc;

pub use high_water::{HighWater, Mark};
pub use publish::{Edit, FloorLeft, PublishCall, PublishOutcome, Writer};
pub use read::{Ahead, Concluded};
pub use session::ClientSession;

/// Who a read or a write is for, and the one read type every door builds (the read path's).
pub use crate::read::{Caller, ReadRequest};

use crate::fleet::Sessions;
use crate::publish::Publisher;
use crate::read::Reader;
use crate::route::Router;

/// The operations every door calls. Cheap to clone: a door, a test or a second front end
/// holds its own handle on the same parts.
#[derive(Clone)]
pub struct Ops {
    /// The parts, shared.
    parts: Arc<Parts>,
}

/// What [`Ops`] is made of, by name.
pub struct OpsParts {
    /// Writes edits to every copy.
    pub publisher: Publisher,
    /// Serves affine reads; holds the router whose pins writes leave.
    pub reader: Reader,
    /// Session tokens: decoded on the way in, encoded on the way out.
    pub sessions: Arc<Sessions>,
    /// The instance-wide high-water.
    pub high_water: HighWater,
    /// The largest value a publish may carry (`server.max_value_bytes`).
    pub max_value_bytes: usize,
    /// This instance's name: the first part of a pooled caller's id ([`Ops::pooled`]).
    pub instance: Arc<str>,
    /// Client-side caching's tracking table (the Redis door's).
    pub tracking: Arc<crate::tracking::Tracking>,
}

/// The parts of [`Ops`]: what it was made of.
type Parts = OpsParts;

/// The default of `server.max_value_bytes`: 1 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1024 * 1024;

impl Ops {
    /// The operations over `publisher`, `reader` and `sessions`, with a high-water of
    /// [`high_water::DEFAULT_BYTES`] and values up to [`DEFAULT_MAX_VALUE_BYTES`].
    pub fn new(publisher: Publisher, reader: Reader, sessions: Arc<Sessions>) -> Ops {
        Ops::from_parts(OpsParts {
            publisher,
            reader,
            sessions,
            high_water: HighWater::default(),
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            instance: Arc::from("local"),
            tracking: Arc::default(),
        })
    }

    /// The operations over `parts`.
    pub fn from_parts(parts: OpsParts) -> Ops {
        Ops {
            parts: Arc::new(parts),
        }
    }

    /// The caller a pooled connection `connection` of a door reads and writes as, when it named
    /// no client: `INSTANCE/resp/CONNECTION` (stable for the connection's life), floored by the
    /// instance's high-water ([`Caller::Pooled`]). Made once per connection.
    pub fn pooled(&self, connection: u64) -> Caller {
        Caller::Pooled(format!("{}/resp/{connection}", self.parts.instance).into())
    }

    /// The largest value a publish may carry.
    pub fn max_value_bytes(&self) -> usize {
        self.parts.max_value_bytes
    }

    /// The instance-wide per-key high-water ([`HighWater`]): every read answer and every
    /// publish that left a floor is recorded into it.
    pub fn high_water(&self) -> &HighWater {
        &self.parts.high_water
    }

    /// The publisher.
    pub fn publisher(&self) -> &Publisher {
        &self.parts.publisher
    }

    /// The reader.
    pub fn reader(&self) -> &Reader {
        &self.parts.reader
    }

    /// The read router (classes, lag, pins).
    pub fn router(&self) -> &Arc<Router> {
        self.parts.reader.router()
    }

    /// The read classes in force (what a door names in its answers and class lists).
    pub fn classes(&self) -> crate::route::ClassesGuard {
        self.router().classes()
    }

    /// Session tokens.
    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.parts.sessions
    }

    /// Client-side caching's tracking table.
    pub fn tracking(&self) -> &Arc<crate::tracking::Tracking> {
        &self.parts.tracking
    }
}

#[cfg(test)]
pub(crate) mod fixture {
    //! Operations over an embedded store for unit tests, wired as `server::app_state` wires
    //! them (without the server).

    use std::sync::Arc;

    use super::Ops;
    use crate::fleet::session::{SessionKey, SessionMetrics};
    use crate::fleet::{SessionConfig, Sessions};
    use crate::metrics::Metrics;
    use crate::publish::Publisher;
    use crate::read::{ReadConfig, Reader};
    use crate::route::Router;
    use crate::store::memory::MemoryStore;

    /// Operations over an embedded store with the families, route and classes of the config
    /// `text`, and no expiry jitter.
    pub(crate) fn ops(text: &str) -> (Ops, Arc<MemoryStore>) {
        let families = Arc::new(crate::family::fixture::families(text));
        let sections = crate::route::fixture::sections(text);
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let router = Arc::new(Router::for_tests(
            &sections.route,
            &sections.classes,
            families.clone(),
        ));
        let publisher = Publisher::new(store.clone(), families.clone(), metrics.clone())
            .with_expiry_jitter(0.0, 0.0);
        let reader = Reader::new(
            store.clone(),
            families,
            ReadConfig::default(),
            metrics,
            router,
        );
        let session_metrics =
            SessionMetrics::register(&mut prometheus_client::registry::Registry::default());
        let sessions = Arc::new(Sessions::new(
            SessionKey::random(),
            &SessionConfig::default(),
            session_metrics,
        ));
        (Ops::new(publisher, reader, sessions), store)
    }
}
