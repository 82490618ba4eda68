//! The Redis-protocol door: a second listener (`[resp] listen`) speaking RESP2 and RESP3, so
//! existing Redis clients read and publish through the same operations layer as HTTP
//! ([`crate::ops`]); it parses and renders, and decides nothing a read or a publish means.
//!
//! - [`codec`]: the bounded request parser (multibulk and inline) and the reply encoder.
//! - `conn`: one connection's loop: read, parse every complete command, run them in order,
//!   write their replies together.
//! - `listener`: the accept loop: the connection bound, TLS, drain.
//! - [`command`]: what each command does for a connection ([`command::Door::execute`]).
//! - [`reply`]: the replies, independent of the protocol version.

pub mod codec;
pub mod command;
pub mod reply;

pub use command::{After, ConnState, Door};
pub use reply::{Proto, Reply};
