//! The binary's commands, one file each: [`serve`] (and `config check`), [`audit`],
//! [`check`]'s runner, and what they share ([`common`]). `main` only parses the command line
//! and dispatches; `hotsplit spool` is `spool_cmd`, `hotsplit probe` and `openapi` are the
//! library's.

pub(crate) mod audit;
pub(crate) mod check;
pub(crate) mod common;
pub(crate) mod serve;
