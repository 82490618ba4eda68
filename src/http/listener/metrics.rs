//! The connection metrics of a listener: open connections, refusals over the bound, and
//! connections closed by a timeout. Each listener resolves its label once, at startup, so
//! counting is one atomic add.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Role;
use crate::metrics::register;

/// Labels of the open-connection gauge and the refusal counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    /// `data` or `admin`.
    listener: &'static str,
}

/// Labels of the closed-by-timeout counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TimeoutLabels {
    /// `data` or `admin`.
    listener: &'static str,
    /// Which timeout: see [`Timeout`].
    timeout: &'static str,
}

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timeout {
    /// `server.header_read_timeout`: a request head did not arrive in time.
    Header,
    /// `server.idle_timeout`: nothing happened on the connection for too long.
    Idle,
    /// `server.body_read_timeout`: a request body did not arrive in time.
    Body,
    /// `server.header_read_timeout` again, for the TLS handshake.
    Handshake,
}

impl Timeout {
    /// Every timeout, in counter order.
    const ALL: [Timeout; 4] = [
        Timeout::Header,
        Timeout::Idle,
        Timeout::Body,
        Timeout::Handshake,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Timeout::Header => "header",
            Timeout::Idle => "idle",
            Timeout::Body => "body",
            Timeout::Handshake => "handshake",
        }
    }
}

/// The metric families every listener counts into; [`ListenerMetrics::for_role`] resolves one
/// listener's handles.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    /// Open connections by listener.
    open: Family<ListenerLabels, Gauge>,
    /// Connections refused over the bound, by listener.
    refused: Family<ListenerLabels, Counter>,
    /// Idle connections closed to make room for new ones, by listener.
    evicted: Family<ListenerLabels, Counter>,
    /// Connections closed by a timeout, by listener and timeout.
    timed_out: Family<TimeoutLabels, Counter>,
}

impl ConnectionMetrics {
    /// Creates the families and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> ConnectionMetrics {
        ConnectionMetrics {
            open: register(
                registry,
                "http_connections",
                "Open HTTP connections by listener (data, admin)",
            ),
            refused: register(
                registry,
                "http_connections_refused",
                "HTTP connections answered 503 and closed because the listener held its most connections (server.max_connections), none of them idle",
            ),
            evicted: register(
                registry,
                "http_connections_evicted",
                "Idle HTTP connections closed to make room for a new one when the listener held its most connections",
            ),
            timed_out: register(
                registry,
                "http_connections_timed_out",
                "HTTP connections closed by a timeout: header (server.header_read_timeout), idle (server.idle_timeout), body (server.body_read_timeout), handshake (TLS, server.header_read_timeout)",
            ),
        }
    }
}

/// One listener's connection metrics, resolved.
#[derive(Debug, Clone)]
pub struct ListenerMetrics {
    /// Open connections.
    pub(crate) open: Gauge,
    /// Refusals over the bound.
    pub(crate) refused: Counter,
    /// Idle connections evicted at the bound.
    pub(crate) evicted: Counter,
    /// Closes by timeout, indexed like [`Timeout::ALL`].
    timed_out: [Counter; 4],
}

impl ListenerMetrics {
    /// `families`' handles for the listener `role`.
    pub fn for_role(families: &ConnectionMetrics, role: Role) -> ListenerMetrics {
        let listener = role.as_str();
        let labels = ListenerLabels { listener };
        ListenerMetrics {
            open: families.open.get_or_create(&labels).clone(),
            refused: families.refused.get_or_create(&labels).clone(),
            evicted: families.evicted.get_or_create(&labels).clone(),
            timed_out: Timeout::ALL.map(|timeout| {
                families
                    .timed_out
                    .get_or_create(&TimeoutLabels {
                        listener,
                        timeout: timeout.as_str(),
                    })
                    .clone()
            }),
        }
    }

    /// Counts a connection closed by `timeout`.
    pub(crate) fn timed_out(&self, timeout: Timeout) {
        // The variants are declared in `Timeout::ALL`'s order.
        self.timed_out[timeout as usize].inc();
    }
}
