//! The fleet: what makes several hotsplit instances in front of one Redis one deployment.
//!
//! # Layout
//! - `config`: [`FleetConfig`], the `[fleet]` settings.
//! - `registry`: [`Registry`] (this instance's record, and the list of every registered
//!   instance behind `GET /v1/instances`) and [`Registrar`], the background task that keeps this
//!   instance's entry alive in the store and removes it at shutdown.

pub mod config;
pub mod registry;

pub use config::FleetConfig;
pub use registry::{InstancesView, Registrar, Registry};
