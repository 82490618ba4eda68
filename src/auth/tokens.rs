//! The tokens file and the check of a presented token.
//!
//! One token a line: `CREDENTIAL SCOPES [# NAME]`, where `CREDENTIAL` is `sha256:<64 hex>` (the
//! SHA-256 of the token: the file holds no secret) or `plain:<token>` (the token itself: the
//! file is then a secret, readable by the service's user only), `SCOPES` is a comma-separated
//! list of `read`, `write` and `admin`, and `NAME` (after `#`) is what logs say about the
//! token. Blank lines and lines starting with `#` are ignored.
//!
//! ```text
//! sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 read,write  # publisher
//! plain:0f1e2d3c4b5a69788796a5b4c3d2e1f0 admin  # prometheus
//! ```
//!
//! A presented token is hashed with SHA-256 and the digest compared with every entry's digest
//! in constant time (`subtle`): the comparison runs over a digest the caller cannot steer
//! byte by byte, touches every entry whatever matches, and takes no early exit. Nothing here
//! prints a token or a line of the file; errors name the line by its number.

use std::path::Path;

use ring::digest::{digest, SHA256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use super::{Scope, Scopes};
use crate::error::{Error, ErrorKind, Result};

/// The shortest plain token accepted: 16 characters of the token alphabet, about 96 bits when
/// drawn at random.
const MIN_PLAIN_LEN: usize = 16;

/// One configured token.
#[derive(Clone, PartialEq, Eq)]
struct Entry {
    /// SHA-256 of the token.
    digest: [u8; 32],
    /// What it may do.
    scopes: Scopes,
    /// What logs call it (`# name` in the file, else `line N`).
    name: String,
}

/// A token's name and scopes, as the check found them; never the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId<'a> {
    /// The name from the tokens file.
    pub name: &'a str,
    /// Its scopes.
    pub scopes: Scopes,
}

/// What a presented token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// No configured token matches.
    Unknown,
    /// This configured token.
    Known(TokenId<'a>),
}

/// Every configured token.
#[derive(Clone, Default)]
pub struct Tokens {
    /// The entries, in file order; no two share a digest.
    entries: Vec<Entry>,
    /// How many entries the file gave as `plain:` tokens.
    plain: usize,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names and scopes only: a digest of a weak token could be guessed offline.
        f.debug_list()
            .entries(
                self.entries
                    .iter()
                    .map(|entry| format!("{} ({})", entry.name, entry.scopes)),
            )
            .finish()
    }
}

impl Tokens {
    /// Reads and parses a tokens file.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming `auth.tokens_file`, the path and, for a bad line, its number.
    pub fn from_file(path: &Path) -> Result<Tokens> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("auth.tokens_file: cannot read {}: {err}", path.display()),
            )
        })?;
        let tokens = Tokens::parse(&text).map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("auth.tokens_file: {}: {}", path.display(), err.message()),
            )
        })?;
        if tokens.plain > 0 {
            warn_if_shared(path);
        }
        Ok(tokens)
    }

    /// Parses the text of a tokens file.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the first bad line by number, without its text: a
    /// malformed credential, an unknown or missing scope, a plain token that is too short or
    /// outside the bearer-token alphabet, a token listed twice, or a file with no token.
    pub fn parse(text: &str) -> Result<Tokens> {
        let mut tokens = Tokens::default();
        for (at, line) in text.lines().enumerate() {
            let number = at + 1;
            let bad = |why: &str| Error::new(ErrorKind::Config, format!("line {number}: {why}"));
            let (body, name) = match line.split_once('#') {
                Some((body, name)) => (body.trim(), name.trim()),
                None => (line.trim(), ""),
            };
            if body.is_empty() {
                continue;
            }
            let mut fields = body.split_whitespace();
            let (Some(credential), Some(scope_list), None) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad(
                    "expected `sha256:<hex> SCOPES` or `plain:<token> SCOPES`, then `# name`",
                ));
            };
            let (digest, plain) = if let Some(hex) = credential.strip_prefix("sha256:") {
                (
                    parse_hex_digest(hex)
                        .ok_or_else(|| bad("sha256: needs 64 hexadecimal digits"))?,
                    false,
                )
            } else if let Some(token) = credential.strip_prefix("plain:") {
                if !is_bearer_token(token) {
                    return Err(bad(
                        "a plain token must be letters, digits and -._~+/ (then = padding)",
                    ));
                }
                if token.len() < MIN_PLAIN_LEN {
                    return Err(bad(&format!(
                        "a plain token must be at least {MIN_PLAIN_LEN} characters"
                    )));
                }
                (sha256(token.as_bytes()), true)
            } else {
                return Err(bad("the credential must start with sha256: or plain:"));
            };
            let mut scopes = Scopes::default();
            for scope in scope_list.split(',').filter(|scope| !scope.is_empty()) {
                scopes = scopes.with(scope.parse::<Scope>().map_err(|why| bad(&why))?);
            }
            if scopes.is_empty() {
                return Err(bad("no scope; give read, write and/or admin"));
            }
            if let Some(first) = tokens
                .entries
                .iter()
                .position(|entry| entry.digest == digest)
            {
                return Err(bad(&format!(
                    "the same token as entry {:?}",
                    tokens.entries[first].name
                )));
            }
            let name = if name.is_empty() {
                format!("line {number}")
            } else {
                name.to_owned()
            };
            tokens.plain += usize::from(plain);
            tokens.entries.push(Entry {
                digest,
                scopes,
                name,
            });
        }
        if tokens.entries.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                "no token in the file (an empty file would lock every caller out)",
            ));
        }
        Ok(tokens)
    }

    /// The token `presented` is, found by its SHA-256 in constant time over every entry.
    pub fn verify(&self, presented: &[u8]) -> Verdict<'_> {
        let digest = sha256(presented);
        // 0 = no match; i + 1 = entry i. Every entry is compared, whatever matched before.
        let mut matched = 0u32;
        for (at, entry) in self.entries.iter().enumerate() {
            let index = u32::try_from(at + 1).unwrap_or(u32::MAX);
            matched = u32::conditional_select(&matched, &index, entry.digest.ct_eq(&digest));
        }
        match matched
            .checked_sub(1)
            .and_then(|at| self.entries.get(at as usize))
        {
            Some(entry) => Verdict::Known(TokenId {
                name: &entry.name,
                scopes: entry.scopes,
            }),
            None => Verdict::Unknown,
        }
    }

    /// Whether `other` holds the same tokens with the same scopes and names.
    pub fn same_as(&self, other: &Tokens) -> bool {
        self.entries == other.entries
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each token's name and scopes, in file order (what `config check` prints).
    pub fn ids(&self) -> impl Iterator<Item = TokenId<'_>> {
        self.entries.iter().map(|entry| TokenId {
            name: &entry.name,
            scopes: entry.scopes,
        })
    }
}

/// The SHA-256 of `bytes`: how a token is stored and compared.
fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// The `sha256:` line for `token`, as the tokens file takes it.
pub fn hash_line(token: &str) -> String {
    sha256(token.as_bytes())
        .iter()
        .fold(String::from("sha256:"), |mut out, byte| {
            out.push_str(&format!("{byte:02x}"));
            out
        })
}

fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (at, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(at * 2..at * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Whether `token` is an RFC 6750 `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" /
/// "+" / "/" ) *"="`.
pub(crate) fn is_bearer_token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    !body.is_empty()
        && body.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// Warns when a file holding plain tokens can be read by other users.
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                mode = format_args!("{:o}", mode & 0o777),
                "auth.tokens_file holds plain tokens and is readable by other users; chmod 600 it or store sha256: hashes"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-token";

    #[test]
    fn hashed_and_plain_tokens_are_found_with_their_scopes_and_names() {
        let text = format!(
            "# the team's tokens\n\n{} read,write  # publisher\nplain:{TOKEN}x admin\n",
            hash_line(TOKEN)
        );
        let tokens = Tokens::parse(&text).unwrap();
        assert_eq!(tokens.len(), 2);
        let Verdict::Known(publisher) = tokens.verify(TOKEN.as_bytes()) else {
            panic!("the hashed token is not found");
        };
        assert_eq!(publisher.name, "publisher");
        assert!(
            publisher.scopes.contains(Scope::Write) && !publisher.scopes.contains(Scope::Admin)
        );
        let Verdict::Known(admin) = tokens.verify(format!("{TOKEN}x").as_bytes()) else {
            panic!("the plain token is not found");
        };
        assert_eq!(
            (admin.name, admin.scopes.to_string().as_str()),
            ("line 4", "admin")
        );
        assert_eq!(tokens.verify(b"0123456789abcdef-toke"), Verdict::Unknown);
        assert_eq!(tokens.verify(b""), Verdict::Unknown);
    }

    #[test]
    fn bad_lines_are_named_by_number_and_never_echoed() {
        let secret = "plain:zzzzzzzzzzzzzzzzzzzz-secret";
        let cases = [
            (format!("{secret}\n"), "line 1"),
            (format!("\n{secret} root\n"), "line 2"),
            (format!("{secret} read extra\n"), "line 1"),
            ("plain:short read\n".to_owned(), "at least 16"),
            (
                "plain:has\"quote-and-more-chars read\n".to_owned(),
                "line 1",
            ),
            ("sha256:abcd read\n".to_owned(), "64 hexadecimal"),
            ("token read\n".to_owned(), "sha256: or plain:"),
            (format!("{secret} ,\n"), "no scope"),
            (
                format!("{secret} read # a\n{secret} write\n"),
                "line 2: the same token as entry \"a\"",
            ),
            ("# nothing\n".to_owned(), "no token"),
        ];
        for (text, expected) in cases {
            let err = Tokens::parse(&text).unwrap_err();
            assert!(err.message().contains(expected), "{text:?}: {err}");
            assert!(!err.message().contains("secret"), "{text:?} echoed: {err}");
        }
    }

    #[test]
    fn debug_shows_names_and_scopes_only() {
        let tokens = Tokens::parse(&format!("plain:{TOKEN} read # dash\n")).unwrap();
        let debug = format!("{tokens:?}");
        assert_eq!(debug, "[\"dash (read)\"]");
    }
}
