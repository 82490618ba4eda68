//! Who may call the API: bearer tokens with scopes (`read`, `write`, `admin`), loaded from the
//! file `[auth] tokens_file` names, and compared in constant time.
//!
//! This module owns the vocabulary ([`Scope`], [`Scopes`]), the `[auth]` config
//! ([`AuthConfig`]) and the token table ([`Tokens`], in `tokens`). The HTTP layer that asks
//! every request for a token lives beside the router (`http::auth`); the table it checks is a
//! [`TokenTable`], a pointer that a SIGHUP reload swaps without a lock on the request path.
//!
//! # Layout
//! - `tokens`: the tokens file's format, its parser and [`Tokens::verify`].

mod tokens;

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};

pub use tokens::{hash_line, TokenId, Tokens, Verdict};

/// One permission a token carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Reads: `GET`/`HEAD /v1/keys/{key}`, `/v1/affinity`.
    Read,
    /// Publishes and invalidations: `PUT`/`DELETE /v1/keys/{key}`.
    Write,
    /// The operator endpoints: `/metrics`, `/v1/retry-queue`, `/v1/lag`, `/v1/routing`,
    /// `/v1/classes`, `/v1/instances` and the later admin views.
    Admin,
}

impl Scope {
    /// Every scope, in the order they are printed.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Write, Scope::Admin];

    /// The scope's spelling in the tokens file and in `WWW-Authenticate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Read => 1,
            Scope::Write => 2,
            Scope::Admin => 4,
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Scope, String> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| format!("unknown scope {text:?}; known: read, write, admin"))
    }
}

/// The set of scopes a token carries. Scopes are independent: `admin` grants neither reads
/// nor writes of keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub const ALL: Scopes = Scopes(7);

    /// The set with `scope` added.
    pub fn with(self, scope: Scope) -> Scopes {
        Scopes(self.0 | scope.bit())
    }

    /// Whether the set holds `scope`.
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = Scope::ALL
            .into_iter()
            .filter(|scope| self.contains(*scope))
            .map(Scope::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

/// `[auth]`: API tokens.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A file of bearer tokens, one a line with its scopes (format in the README, "Running in
    /// production"). When set, every endpoint but `/healthz` and `/readyz` needs a token with
    /// the endpoint's scope; it is re-read on SIGHUP. Default: none (no token is asked for,
    /// and `serve` listens only on loopback unless `server.allow_unauthenticated = true`).
    pub tokens_file: Option<PathBuf>,
}

impl AuthConfig {
    /// Loads the tokens file, if one is configured.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Config`] naming `auth.tokens_file`, the file and the line (never the
    /// line's text, which may hold a token).
    pub fn load_tokens(&self) -> crate::Result<Option<Tokens>> {
        self.tokens_file
            .as_deref()
            .map(Tokens::from_file)
            .transpose()
    }
}

/// The token table requests are checked against: `None` when no tokens are configured. Cheap
/// to clone (two shared pointers); a reload stores a new table, and a request in flight keeps
/// the one it loaded. Long-lived connections (the Redis-protocol door's) authenticate once, so
/// each store also bumps a generation they watch ([`TokenTable::changes`]) to check again.
#[derive(Debug, Clone)]
pub struct TokenTable {
    /// The current table; read without a lock (`arc-swap`) on every request.
    current: Arc<ArcSwapOption<Tokens>>,
    /// How many times the table was stored into, for whoever must check again.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for TokenTable {
    fn default() -> TokenTable {
        TokenTable::new(None)
    }
}

impl TokenTable {
    /// A table holding `tokens`.
    pub fn new(tokens: Option<Tokens>) -> TokenTable {
        TokenTable {
            current: Arc::new(ArcSwapOption::new(tokens.map(Arc::new))),
            generation: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Replaces the table; requests that start afterwards are checked against `tokens`, and
    /// every [`TokenTable::changes`] receiver is told.
    pub fn store(&self, tokens: Option<Tokens>) {
        self.current.store(tokens.map(Arc::new));
        self.generation
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// A receiver that sees a change each time the table is stored into (after the new table
    /// is in place).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The current table.
    pub fn load(&self) -> arc_swap::Guard<Option<Arc<Tokens>>> {
        self.current.load()
    }

    /// The current table, as an owned handle to keep and compare with a later one.
    pub fn load_full(&self) -> Option<Arc<Tokens>> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_is_seen_by_each_change_receiver_after_the_new_table_is_in_place() {
        let table = TokenTable::default();
        let clone = table.clone();
        let mut changes = clone.changes();
        assert!(!changes.has_changed().unwrap());
        table.store(None);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert!(!changes.has_changed().unwrap());
        table.store(None);
        assert!(changes.has_changed().unwrap());
        assert!(clone.load().is_none());
    }

    #[test]
    fn scopes_are_independent_and_print_in_order() {
        let scopes = Scopes::default().with(Scope::Admin).with(Scope::Read);
        assert!(scopes.contains(Scope::Read) && scopes.contains(Scope::Admin));
        assert!(!scopes.contains(Scope::Write));
        assert_eq!(scopes.to_string(), "read,admin");
        assert_eq!(Scopes::ALL.to_string(), "read,write,admin");
        assert!("root".parse::<Scope>().is_err());
    }
}
