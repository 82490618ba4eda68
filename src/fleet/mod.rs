//! The fleet: what makes several hotsplit instances in front of one Redis one deployment.
//!
//! # Layout
//! - `config`: [`FleetConfig`] and [`SessionConfig`], the `[fleet]` and `[session]` settings.
//! - `registry`: [`Registry`] (this instance's record, and the list of every registered
//!   instance behind `GET /v1/instances`) and [`Registrar`], the background task that keeps this
//!   instance's entry alive in the store and removes it at shutdown.
//! - `retire`: [`LibraryRetirer`], the background task that deletes an older release's Redis
//!   function library once no registered instance runs it.
//! - `session`: session tokens, the floors a client carries from instance to instance
//!   ([`session::Session`], its format and [`session::SessionKey`]), and [`Sessions`], what the
//!   HTTP layer reads and writes them with.

pub mod config;
pub mod registry;
pub mod retire;
pub mod session;

pub use config::{FleetConfig, SessionConfig};
pub use registry::{InstancesView, Registrar, Registry};
pub use retire::{LibraryRetirer, RetireMetrics};
pub use session::Sessions;
