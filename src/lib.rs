//! hotsplit keeps hot values in Redis readable at scale without readers seeing time go backwards.
//!
//! # Layout
//! - [`key`] and [`affinity`]: the vocabulary (keys, copy keys, versions) and which copy a client
//!   reads.
//! - [`placement`]: how copies are named (`suffix`, `spread`): the CRC16 slot tag table that spreads
//!   a key's copies over the slot space.
//! - [`family`]: key families (copies, TTL, versioning) and the longest-prefix resolver.
//! - [`config`]: the composition root: one `Config` of the sub-configs each subsystem owns,
//!   layered from file, flags and environment, validated before anything binds.
//! - [`store`]: the compare-and-set store: embedded ([`store::memory`]) or Redis
//!   ([`store::redis`], the only module that talks to Redis).
//! - [`ops`]: what a read and a publish mean for a caller, whichever door it came through:
//!   session floors in and out, the floors a write leaves, the publisher call; the HTTP API
//!   only parses into its types and renders what it returns.
//! - [`publish`]: fan-out of one edit to every copy, with per-copy outcomes.
//! - [`read`]: the affine read path: class → route → copy choice, version floor, sibling
//!   fallback.
//! - [`route`]: read classes, replica choice under a measured staleness budget (the lag
//!   monitor), read-your-writes pins, routing counters.
//! - [`fleet`]: what makes instances one deployment: the instance registry
//!   (`GET /v1/instances`).
//! - [`near`]: the per-instance near cache of copies, served within each read class's age
//!   bound, with single-flight fills and high-water records that keep readers monotonic.
//! - [`sketch`]: [`sketch::MaxSketch`], per-key version maxima in fixed memory, exact or
//!   estimated: the near cache's floors and the instance high-water.
//! - [`deadline`]: the per-request deadline that bounds every store call a request makes.
//! - [`heal`]: the durable retry queue of failed copy writes, read repair and expiry jitter.
//! - [`auth`]: API bearer tokens with scopes, and the `[auth]` config.
//! - [`door`]: the door core both doors stand on: the state they share ([`door::Core`]), the
//!   `[server]` settings, the in-flight bound over both, accept-loop helpers.
//! - [`http`]: the HTTP API (router, handlers, problem+json errors); no business logic.
//! - [`resp`]: the Redis protocol (RESP2/3) door; no business logic, never importing [`http`].
//! - [`server`]: `run(listener, config, shutdown)` wires everything together.
//! - [`status`]: the deployment's live status: each instance's figures, published into the
//!   store, gathered by `GET /v1/fleet` for the status page (`GET /status`).
//! - [`reload`]: SIGHUP: what a new config changes live (classes, default classes, tokens, the
//!   log filter of [`logging`]) and what needs a restart.
//! - [`wire`]: the API's header and query-parameter names, shared by `http`, `client` and `check`.
//! - [`client`]: a small HTTP client that reads through the affine copy and remembers floors.
//! - [`audit`]: `hotsplit audit`, read-only measurement of the skew between live copies.
//! - [`probe`]: `hotsplit probe URL`, the container's health check (no curl in the image).
//! - [`tls`]: the rustls client configuration of every TLS client (Redis connections, `probe`).
//!
//! Not in the library: `hotsplit check` (`src/check/`, a module of the binary, `mod check` in
//! `main.rs`) and the throwaway `redis-server` processes of the tests, the benches and `check`
//! (the `hotsplit-devcluster` workspace crate in `devcluster/`). Nothing `serve` runs can reach
//! the process-spawning code, and the library has no `unsafe` code.

#![forbid(unsafe_code)]

/// Boxes and pins a future, writing it straight into its allocation: the allocation comes
/// first and the future is made into it, where `Box::pin(future)` makes the future on the
/// stack and then copies all of it, every state's room included, into the box. A store
/// read's future holds fred's command future, about 8 KB: that copy was 3.5 % of a decision
/// read's CPU (docs/PERFORMANCE.md). Write the future's expression as the argument (an
/// `async` block or a call): a future made earlier and passed in is copied all the same.
macro_rules! box_in_place {
    ($future:expr) => {{
        let slot = ::std::boxed::Box::new_uninit();
        let boxed = ::std::boxed::Box::write(slot, $future);
        ::std::boxed::Box::into_pin(boxed)
    }};
}

pub mod affinity;
pub mod audit;
pub mod auth;
pub mod client;
pub mod config;
pub mod deadline;
pub mod door;
mod duration;
pub mod error;
pub mod family;
pub mod feed;
pub mod fleet;
pub mod heal;
pub mod hot;
pub mod http;
pub mod key;
pub mod layout;
pub mod logging;
pub mod metrics;
pub mod near;
pub mod ops;
pub mod placement;
pub mod probe;
pub mod publish;
pub mod read;
pub mod reload;
pub mod resp;
pub mod route;
pub mod server;
pub mod sketch;
pub mod split;
pub mod status;
pub mod store;
pub mod tls;
pub mod tracking;
pub mod wire;

pub use error::{Error, ErrorKind, Result};
