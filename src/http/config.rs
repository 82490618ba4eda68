//! The HTTP door's own config, `[admin]` (the admin listener). The listeners' shared settings,
//! `[server]`, are the door core's ([`crate::door::ServerConfig`]).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The admin listener: `[admin]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// A second address serving the admin routes (`/metrics`, `/healthz`, `/readyz`,
    /// `/v1/retry-queue`, `/v1/lag`, `/v1/routing`, `/v1/classes`, `/v1/instances`, `/v1/near-cache`); when set,
    /// the data listener (`server.listen`) answers 404 on them. It has the server's timeouts,
    /// TLS, and a bound of its own of 128 connections. Default: unset (every route on
    /// `server.listen`).
    pub listen: Option<SocketAddr>,
}
