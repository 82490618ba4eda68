//! A connection's authentication (with tokens configured): whether it must still
//! authenticate and until when, the delay before a refused `AUTH`'s reply, the answer at
//! `resp.auth_timeout`, and the end of a connection whose token a reload revoked (the rules are
//! the `Before AUTH` and `Closing` invariants of the connection's module doc).

use std::time::Duration;

use bytes::BytesMut;
use tokio::time::Instant;

use super::super::codec::encode;
use super::super::metrics::Budget;
use super::super::{ConnState, Proto, Reply};
use super::{Connection, End};

/// How much longer each refused `AUTH` on a connection waits before its reply than the one
/// before it.
const AUTH_FAILURE_DELAY: Duration = Duration::from_millis(100);

/// The longest wait before a refused `AUTH`'s reply.
const MAX_AUTH_FAILURE_DELAY: Duration = Duration::from_secs(2);

/// The reply to a connection that did not authenticate within `resp.auth_timeout`.
const AUTH_TIMEOUT: &str =
    "NOAUTH Authentication required within resp.auth_timeout: closing the connection";

impl Connection {
    /// Whether `state` has authenticated (or needs not), updating the connection's slot when
    /// that changed since `before`, and `auth_deadline`: set (`resp.auth_timeout` from now)
    /// when it must authenticate and had no deadline, cleared once it need not.
    pub(super) fn authentication(
        &self,
        state: &ConnState,
        auth_deadline: &mut Option<Instant>,
        before: bool,
    ) -> bool {
        let authenticated = !self.must_authenticate(state);
        if authenticated {
            *auth_deadline = None;
        } else if auth_deadline.is_none() {
            *auth_deadline = Some(Instant::now() + self.settings.auth_timeout);
        }
        if authenticated != before {
            self.slot.set_authenticated(authenticated);
        }
        authenticated
    }

    /// Counts a refused `AUTH` and waits before its reply: [`AUTH_FAILURE_DELAY`] times the
    /// connection's failures so far (at most [`MAX_AUTH_FAILURE_DELAY`]), or until
    /// `auth_deadline`.
    pub(super) async fn auth_failed(&self, failures: u32, auth_deadline: Option<Instant>) {
        self.metrics.auth_failure();
        let delay = AUTH_FAILURE_DELAY
            .saturating_mul(failures)
            .min(MAX_AUTH_FAILURE_DELAY);
        let until = Instant::now() + delay;
        tokio::time::sleep_until(auth_deadline.map_or(until, |at| at.min(until))).await;
    }

    /// Answers a connection that did not authenticate within `resp.auth_timeout`, and ends it.
    pub(super) fn auth_timeout(&self, output: &mut BytesMut) -> End {
        tracing::debug!("not authenticated within resp.auth_timeout: closing the connection");
        self.metrics.exceeded(Budget::AuthTimeout);
        self.metrics.error(AUTH_TIMEOUT);
        encode(&Reply::error(AUTH_TIMEOUT), Proto::Resp2, output);
        End::AuthTimeout
    }

    /// Whether `state` must still authenticate: tokens are configured and it has none.
    pub(super) fn must_authenticate(&self, state: &ConnState) -> bool {
        state.auth.is_none() && self.door.core().tokens().load().is_some()
    }

    /// Ends a connection whose token a reload revoked.
    pub(super) fn revoked(&self) -> End {
        tracing::info!("the token this connection authenticated with was revoked: closing it");
        self.metrics.revoked();
        End::Revoked
    }
}
