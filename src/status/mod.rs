//! The deployment's live status: what each instance says about itself for the status page
//! (`GET /status` on the admin routes, `http::status_page`) and how the page sees every
//! instance from any one of them.
//!
//! Each instance samples its own figures into an [`InstanceStatus`] ([`Sources::sample`]): its
//! retry queue (depth, oldest entry age, nodes, the oldest entries), each replica's lag against
//! every class budget, the capacity bill (reads the primaries served, by class and reason),
//! the near cache and its families with their layouts. [`StatusPublisher`] writes that sample
//! as JSON into the store every `fleet.heartbeat_interval`, beside the instance's registry
//! entry and with the same time to live (`store::registry::status_key`). `GET /v1/fleet`
//! ([`fleet_view`]) lists the registry and joins each instance's stored sample, taking this
//! instance's own figures live; so any instance answers for the whole deployment with two
//! store round trips, and no instance has to reach another's admin address (which may be bound
//! to loopback, behind TLS or behind a token).
//!
//! The figures are point-in-time samples and cumulative counters; the history "over the last
//! minutes" is kept by the page in the browser, from one poll to the next: nothing is stored
//! for it on the server, and the Prometheus metrics remain the long-term record.
//!
//! # Layout
//! - `sample`: [`InstanceStatus`] and [`Sources`], the local figures.
//! - `fleet`: [`FleetView`] and [`fleet_view`], every instance's figures.
//! - `publisher`: [`StatusPublisher`], the background task that stores the local figures.

mod fleet;
pub mod hot_keys;
mod publisher;
mod sample;

pub(crate) use fleet::fleet_view;
pub use fleet::{FleetMember, FleetView};
pub use publisher::StatusPublisher;
pub use sample::{ClassBudget, FamilyStatus, InstanceStatus, Sources};
