//! The Redis-protocol door: a second listener (`[resp] listen`) speaking RESP2 and RESP3, so
//! existing Redis clients read and publish through the same operations layer as HTTP
//! ([`crate::ops`]); it parses and renders, and decides nothing a read or a publish means.
//!
//! - [`config`]: the `[resp]` section.
//! - [`codec`]: the bounded request parser (multibulk and inline) and the reply encoder.
//! - `conn`: one connection's loop: read, parse every complete command, run them in order,
//!   write their replies together.
//! - [`listener`]: the accept loop: the connection bound, TLS, token revocation, drain.
//! - [`metrics`]: the `hotsplit_resp_*` metrics.
//! - [`command`]: what each command does for a connection ([`command::Door::execute`]): the
//!   table lists each command once, and each is parsed once into its own struct for its handler.
//! - [`reply`]: the replies, independent of the protocol version.

pub mod codec;
pub mod command;
pub mod config;
mod conn;
#[cfg(test)]
pub(crate) mod fixture;
pub mod listener;
pub mod metrics;
pub mod reply;
mod slots;

pub use command::{After, ConnState, Door};
pub use config::RespConfig;
pub use listener::RespListener;
pub use reply::{Proto, Reply};
