//! The door core: what both doors — the HTTP API ([`crate::http`]) and the Redis protocol
//! ([`crate::resp`]) — stand on, so that neither imports the other.
//!
//! A door parses its protocol, calls the operations layer ([`crate::ops`]) and renders what comes
//! back; everything it needs besides its own protocol lives here, once:
//! - [`Core`]: the operations, the token table a reload swaps, the metrics registry, the
//!   in-flight bound, the value bound and this instance's name — the state both doors share;
//! - [`ServerConfig`] (`config`): the `[server]` settings (listening, TLS, timeouts, limits,
//!   drain), which both listeners read;
//! - [`InFlightBound`] (`in_flight`): `server.max_in_flight` over both doors, and each request's
//!   deadline;
//! - `accept`: which accept errors concern one connection ([`is_connection_error`]), and the
//!   [`Throttle`] for warnings that repeat.
//!
//! **Architecture Invariant:** nothing here knows a protocol: no HTTP status, header or RESP
//! prefix. `http` and `resp` import this module and never each other
//! (`python3 scripts/module-cycles.py --edges` shows no edge between them).

mod accept;
pub mod config;
mod in_flight;

use std::sync::Arc;

pub use accept::{is_connection_error, Throttle, WARNING_INTERVAL};
pub use config::{LogFormat, ServerConfig};
pub use in_flight::{InFlight, InFlightBound, RequestLimits};

use crate::auth::TokenTable;
use crate::metrics::Metrics;
use crate::ops::Ops;

/// The state both doors share. Cheap to clone.
#[derive(Clone)]
pub struct Core {
    /// The parts, shared.
    parts: Arc<CoreParts>,
}

/// The parts of a [`Core`], by name.
pub struct CoreParts {
    /// What a read and a publish mean, whichever door called.
    pub ops: Ops,
    /// The API tokens every request and command is checked against (empty: no check); a
    /// reload stores a new table into it, and both doors see it at once.
    pub tokens: TokenTable,
    /// The metrics registry every part counts into.
    pub metrics: Arc<Metrics>,
    /// `server.max_in_flight` over both doors, and the request deadline.
    pub in_flight: Arc<InFlightBound>,
    /// This instance's name (the registry's id): the first part of a pooled connection's id.
    pub instance: Arc<str>,
}

impl Core {
    /// The core over `parts`.
    pub fn new(parts: CoreParts) -> Core {
        Core {
            parts: Arc::new(parts),
        }
    }

    /// The operations.
    pub fn ops(&self) -> &Ops {
        &self.parts.ops
    }

    /// The token table (empty until tokens are stored into it, at startup or by a reload).
    pub fn tokens(&self) -> &TokenTable {
        &self.parts.tokens
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.parts.metrics
    }

    /// The in-flight bound over both doors.
    pub fn in_flight(&self) -> &Arc<InFlightBound> {
        &self.parts.in_flight
    }

    /// This instance's name.
    pub fn instance(&self) -> &Arc<str> {
        &self.parts.instance
    }
}
