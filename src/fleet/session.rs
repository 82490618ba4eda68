//! Session tokens: the floors of one client, carried by the client (`Hotsplit-Session`), so
//! read-your-writes and monotonic reads hold whichever instance serves its next request.
//!
//! A token holds the client's floors for its most recently used keys: per key, a hash of the
//! key, the version it wrote or was served, whether it wrote it, and when the floor expires
//! (the key's own expiry, so a key that expired and started again at a lower version does not
//! leave the client at 503 until the token is dropped). Every instance treats a token's floors
//! exactly as its own memory of that client: a written floor as an own-write floor, a served
//! one as a seen floor (`route::Plan`).
//!
//! # Format, version 1
//! The header value is the unpadded base64url encoding of:
//!
//! | Bytes | Content |
//! |---|---|
//! | 1 | format version: `1` |
//! | 25 × n | n floors, least recently used first: key hash (8), version (8), expiry in Unix ms (8), kind (1: `0` seen, `1` written), integers big-endian |
//! | 8 | tag: SipHash-2-4 under the deployment's session key of `T` ‖ everything before |
//!
//! n is at most [`MAX_FLOORS`] (64), so a token is at most 1,609 bytes, 2,146 characters
//! encoded; with the default `session.max_keys` of 32 it is at most 809 bytes, 1,079
//! characters.
//!
//! # Keys as hashes, and a tag
//! Key hashes are SipHash-2-4 of `K` ‖ key under a 128-bit key shared by the deployment (kept
//! in the store, `#hotsplit#{fleet}#session-key`, created by the first instance to start; the
//! embedded store draws one per process), truncated to 64 bits. A fixed seed would let anyone
//! holding a token test guesses of key names offline, and xxh3's seed is no secret either: it
//! can be solved from one known (key, hash) pair, which every client of the deployment holds
//! for its own keys. SipHash is a keyed pseudo-random function, so a leaked token says nothing
//! about the key names in it to someone without the deployment's key. The tag makes a forged or
//! altered token fail verification, so it is ignored: it cannot raise or lower another key's
//! floor, and a client can only replay floors hotsplit gave it (which only makes its own reads
//! stricter). A token is never an error: an absent, garbled, oversized, unverified or
//! unknown-version token is ignored (and counted, `hotsplit_session_tokens_total{outcome}`), so
//! a rolling upgrade to a new format never turns into 400s.
//!
//! # Several tokens, merged
//! A request may carry several tokens (several `Hotsplit-Session` lines or comma-separated
//! values; several tokens after `SESSION` on the Redis door), at most [`MAX_TOKENS`]: a client
//! whose calls ran at once holds one answer's token per call. They are merged
//! ([`Session::merge`]) so that a floor only ever rises: per key the highest version (an equal
//! version keeps the later expiry and is written if either was), whichever token held it; each
//! token that cannot be read is ignored (and counted) alone. A full token drops the least
//! recently used keys: beyond `session.max_keys` (32 by default) the merged floors keep the most
//! recently used of every token (their last floors first), and a key dropped has no floor from
//! the token any more (its reads then hold only what the serving instance remembers of the
//! client). Tokens past the [`MAX_TOKENS`]th are ignored, counted as `oversized`.

use std::hash::Hasher;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine;
use bytes::Bytes;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use siphasher::sip::SipHasher24;

use super::SessionConfig;
use crate::key::{Key, Version};
use crate::route::Floors;

/// The format version this release writes and reads.
pub const FORMAT_VERSION: u8 = 1;

/// The most floors a token may hold, whatever `session.max_keys` says: a longer token is
/// ignored as oversized.
pub const MAX_FLOORS: usize = 64;

/// The most tokens one request may carry: more are ignored (counted `oversized`).
pub const MAX_TOKENS: usize = 64;

/// Bytes per floor: key hash, version, expiry, kind.
const FLOOR_BYTES: usize = 25;

/// Bytes of the tag.
const TAG_BYTES: usize = 8;

/// The longest token accepted, in bytes before encoding: [`MAX_FLOORS`] floors.
const MAX_TOKEN_BYTES: usize = 1 + MAX_FLOORS * FLOOR_BYTES + TAG_BYTES;

/// The longest token accepted, encoded: [`MAX_FLOORS`] floors.
pub const MAX_TOKEN_CHARS: usize = encoded_len(MAX_TOKEN_BYTES);

/// The length of `bytes` bytes in unpadded base64.
const fn encoded_len(bytes: usize) -> usize {
    (bytes * 4).div_ceil(3)
}

/// The deployment's session key: hashes key names and tags tokens.
#[derive(Clone)]
pub struct SessionKey {
    /// The two SipHash key words.
    words: (u64, u64),
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    /// A key from its stored text form, 32 lowercase hex digits; `None` when it is not that.
    pub fn from_hex(text: &str) -> Option<SessionKey> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let k0 = u64::from_str_radix(&text[..16], 16).ok()?;
        let k1 = u64::from_str_radix(&text[16..], 16).ok()?;
        Some(SessionKey { words: (k0, k1) })
    }

    /// A fresh random key.
    pub fn random() -> SessionKey {
        SessionKey {
            words: (rand::random::<u64>(), rand::random::<u64>()),
        }
    }

    /// The stored text form: 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        format!("{:016x}{:016x}", self.words.0, self.words.1)
    }

    /// Keyed SipHash-2-4 (the `siphasher` crate: the same output as std's deprecated
    /// `SipHasher`, so tokens and key hashes of earlier releases stay valid), domain-separated.
    fn hasher(&self, domain: u8) -> SipHasher24 {
        let mut hasher = SipHasher24::new_with_keys(self.words.0, self.words.1);
        hasher.write(&[domain]);
        hasher
    }

    /// The hash a token stores for `key`.
    pub fn key_hash(&self, key: &Key) -> u64 {
        let mut hasher = self.hasher(b'K');
        hasher.write(key.as_str().as_bytes());
        hasher.finish()
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG_BYTES] {
        let mut hasher = self.hasher(b'T');
        hasher.write(body);
        hasher.finish().to_be_bytes()
    }
}

/// One floor of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionFloor {
    /// The key's hash ([`SessionKey::key_hash`]).
    pub key_hash: u64,
    /// The floor.
    pub version: Version,
    /// When it expires, Unix ms: the key's expiry.
    pub expire_at_ms: u64,
    /// Whether the client wrote this version (an own-write floor) rather than was served it.
    pub written: bool,
}

impl SessionFloor {
    /// The higher of two floors of one key: the higher version (with its expiry and kind); of
    /// equal versions, the later expiry, written if either was.
    fn higher(held: SessionFloor, floor: SessionFloor) -> SessionFloor {
        match held.version.cmp(&floor.version) {
            std::cmp::Ordering::Less => floor,
            std::cmp::Ordering::Greater => held,
            std::cmp::Ordering::Equal => SessionFloor {
                expire_at_ms: held.expire_at_ms.max(floor.expire_at_ms),
                written: held.written || floor.written,
                ..held
            },
        }
    }
}

/// A client's floors, least recently used first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// The floors, least recently used first; at most one per key hash.
    floors: Vec<SessionFloor>,
}

/// What an incoming token turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// No token was sent.
    Absent,
    /// A valid token (its expired floors already dropped).
    Valid(Session),
    /// A token of another format version: ignored.
    UnknownVersion,
    /// Not base64url, a wrong length, a repeated header, or a floor that makes no sense.
    Garbled,
    /// Longer than [`MAX_TOKEN_CHARS`].
    Oversized,
    /// Well formed, but its tag does not verify (forged, altered, or from another deployment).
    Unverified,
}

impl Decoded {
    /// The `outcome` label it is counted under; `None` for an absent token.
    fn outcome(&self) -> Option<&'static str> {
        match self {
            Decoded::Absent => None,
            Decoded::Valid(_) => Some("valid"),
            Decoded::UnknownVersion => Some("unknown_version"),
            Decoded::Garbled => Some("garbled"),
            Decoded::Oversized => Some("oversized"),
            Decoded::Unverified => Some("unverified"),
        }
    }

    /// The session to continue: the token's, or an empty one when it was ignored.
    pub fn into_session(self) -> Session {
        match self {
            Decoded::Valid(session) => session,
            _ => Session::default(),
        }
    }
}

impl Session {
    /// The floors held for `key_hash` that have not expired at `now_ms`.
    pub fn floors(&self, key_hash: u64, now_ms: u64) -> Floors {
        let mut floors = Floors::default();
        for floor in &self.floors {
            if floor.key_hash == key_hash && floor.expire_at_ms > now_ms {
                if floor.written {
                    floors.written = floors.written.max(Some(floor.version));
                } else {
                    floors.seen = floors.seen.max(Some(floor.version));
                }
            }
        }
        floors
    }

    /// Records `floor` as the key's most recent use: a higher version replaces the held one
    /// (with its expiry and kind), an equal one keeps the later expiry and either kind's
    /// "written", a lower one keeps the held floor. Expired floors go first; then the least
    /// recently used beyond `max_floors`.
    ///
    /// Returns whether the floors changed (in content or order): when they did not, the token
    /// the client sent is still this session's token, byte for byte.
    pub fn record(&mut self, floor: SessionFloor, now_ms: u64, max_floors: usize) -> bool {
        let before = self.floors.len();
        self.floors.retain(|held| held.expire_at_ms > now_ms);
        let mut changed = self.floors.len() != before;
        let (merged, held) = match self
            .floors
            .iter()
            .position(|held| held.key_hash == floor.key_hash)
        {
            None => (floor, None),
            Some(at) => {
                let held = self.floors.remove(at);
                // It was not the most recently used: it moves to the end.
                changed |= at != self.floors.len();
                (SessionFloor::higher(held, floor), Some(held))
            }
        };
        if merged.expire_at_ms > now_ms {
            self.floors.push(merged);
            changed |= held != Some(merged);
        } else {
            changed |= held.is_some();
        }
        let max_floors = max_floors.clamp(1, MAX_FLOORS);
        if self.floors.len() > max_floors {
            let excess = self.floors.len() - max_floors;
            self.floors.drain(..excess);
            changed = true;
        }
        changed
    }

    /// Whether it holds no floor.
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
    }

    /// How many floors it holds.
    pub fn len(&self) -> usize {
        self.floors.len()
    }

    /// The sessions of several tokens as one, so that no floor goes down: per key the higher
    /// floor ([`SessionFloor::higher`]), whichever token held it. The merged floors are ordered
    /// by recency within their tokens, each token's most recently used last (a key in several
    /// tokens takes its most recent place), and beyond `max_floors` the least recently used
    /// are dropped. One session is kept as it is.
    pub fn merge(sessions: Vec<Session>, max_floors: usize) -> Session {
        if sessions.len() <= 1 {
            return sessions.into_iter().next().unwrap_or_default();
        }
        // Per floor: its recency (higher: more recent; each token's last floor has the same
        // recency, MAX_FLOORS) and the floor; per key hash, where it is.
        let mut merged: Vec<(usize, SessionFloor)> = Vec::new();
        let mut at_key: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        for session in sessions {
            let held = session.floors.len();
            for (at, floor) in session.floors.into_iter().enumerate() {
                let recency = MAX_FLOORS.saturating_sub(held - at);
                match at_key.get(&floor.key_hash) {
                    Some(&index) => {
                        let (kept_recency, kept) = &mut merged[index];
                        *kept = SessionFloor::higher(*kept, floor);
                        *kept_recency = (*kept_recency).max(recency);
                    }
                    None => {
                        at_key.insert(floor.key_hash, merged.len());
                        merged.push((recency, floor));
                    }
                }
            }
        }
        // Stable: floors of equal recency stay in token order.
        merged.sort_by_key(|(recency, _)| *recency);
        let excess = merged.len().saturating_sub(max_floors.clamp(1, MAX_FLOORS));
        Session {
            floors: merged
                .into_iter()
                .skip(excess)
                .map(|(_, floor)| floor)
                .collect(),
        }
    }

    /// The token text: the unpadded base64url encoding of the format above.
    pub fn encode(&self, key: &SessionKey) -> String {
        // The alphabet is ASCII, so the bytes are always text.
        String::from_utf8(self.encode_vec(key)).unwrap_or_default()
    }

    /// [`Session::encode`] as shared bytes: what an answer's header takes without copying. A
    /// one-floor session (a client that sent no token and read one key) is looked up first
    /// among the one-floor tokens this thread encoded lately: a hot key's answers to such
    /// clients all carry the same token.
    pub fn encode_bytes(&self, key: &SessionKey) -> Bytes {
        match self.floors.as_slice() {
            [floor] => single_floor::token(key, *floor, || Bytes::from(self.encode_vec(key))),
            _ => Bytes::from(self.encode_vec(key)),
        }
    }

    /// The token's text as bytes, in one exactly sized allocation.
    fn encode_vec(&self, key: &SessionKey) -> Vec<u8> {
        let mut text = vec![0; encoded_len(self.raw_len())];
        // The buffer is exactly the encoded length, so the encoding always fits.
        let length = self.with_raw(key, |raw| BASE64URL.encode_slice(raw, &mut text));
        text.truncate(length.unwrap_or(0));
        text
    }

    /// The length of the token's bytes before encoding.
    fn raw_len(&self) -> usize {
        1 + self.floors.len() * FLOOR_BYTES + TAG_BYTES
    }

    /// Calls `f` with the token's bytes (the format above, tagged), built on the stack when the
    /// session holds at most [`MAX_FLOORS`] floors (it always does: `record` keeps it so).
    fn with_raw<R>(&self, key: &SessionKey, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut stack = [0u8; MAX_TOKEN_BYTES];
        let mut heap = Vec::new();
        let buffer: &mut [u8] = match stack.get_mut(..self.raw_len()) {
            Some(buffer) => buffer,
            None => {
                heap.resize(self.raw_len(), 0);
                &mut heap
            }
        };
        buffer[0] = FORMAT_VERSION;
        for (floor, slot) in self
            .floors
            .iter()
            .zip(buffer[1..].chunks_exact_mut(FLOOR_BYTES))
        {
            slot[..8].copy_from_slice(&floor.key_hash.to_be_bytes());
            slot[8..16].copy_from_slice(&floor.version.get().to_be_bytes());
            slot[16..24].copy_from_slice(&floor.expire_at_ms.to_be_bytes());
            slot[24] = u8::from(floor.written);
        }
        let body = buffer.len() - TAG_BYTES;
        let tag = key.tag(&buffer[..body]);
        buffer[body..].copy_from_slice(&tag);
        f(buffer)
    }

    /// Reads one token (one of the values [`tokens`] splits a request's lines into). Floors
    /// expired at `now_ms` are dropped.
    pub fn decode(text: &[u8], key: &SessionKey, now_ms: u64) -> Decoded {
        if text.len() > MAX_TOKEN_CHARS {
            return Decoded::Oversized;
        }
        let mut buffer = [0u8; MAX_TOKEN_BYTES];
        let Ok(length) = BASE64URL.decode_slice(text, &mut buffer) else {
            return Decoded::Garbled;
        };
        let bytes = &buffer[..length];
        match bytes.first() {
            None => return Decoded::Garbled,
            Some(&FORMAT_VERSION) => {}
            Some(_) => return Decoded::UnknownVersion,
        }
        if bytes.len() < 1 + TAG_BYTES || !(bytes.len() - 1 - TAG_BYTES).is_multiple_of(FLOOR_BYTES)
        {
            return Decoded::Garbled;
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG_BYTES);
        // Not a timing side channel worth closing: the tag is checked once per request and
        // an attacker learns at most that a guess was wrong, as the ignored token says anyway.
        if key.tag(body) != tag {
            return Decoded::Unverified;
        }
        let mut session = Session::default();
        for chunk in body[1..].chunks_exact(FLOOR_BYTES) {
            let word = |at: usize| {
                let mut word = [0u8; 8];
                word.copy_from_slice(&chunk[at..at + 8]);
                u64::from_be_bytes(word)
            };
            let (Ok(version), kind) = (Version::new(word(8)), chunk[24]) else {
                return Decoded::Garbled;
            };
            if kind > 1 || session.floors.iter().any(|held| held.key_hash == word(0)) {
                return Decoded::Garbled;
            }
            let floor = SessionFloor {
                key_hash: word(0),
                version,
                expire_at_ms: word(16),
                written: kind == 1,
            };
            if floor.expire_at_ms > now_ms {
                session.floors.push(floor);
            }
        }
        Decoded::Valid(session)
    }
}

/// What the HTTP layer reads and writes session tokens with: the deployment's key, the bound
/// on floors, whether a cookie carries the token too, and the counters. Cheap to share.
#[derive(Debug)]
pub struct Sessions {
    /// The deployment's key.
    key: SessionKey,
    /// The most floors a token keeps (`session.max_keys`).
    max_keys: usize,
    /// Whether the token also travels as a cookie (`session.cookie`).
    cookie: bool,
    /// Incoming tokens by outcome.
    metrics: SessionMetrics,
}

impl Sessions {
    /// Tokens under `key`, with `config`'s bound and cookie setting, counted into `metrics`.
    pub fn new(key: SessionKey, config: &SessionConfig, metrics: SessionMetrics) -> Sessions {
        Sessions {
            key,
            max_keys: config.max_keys,
            cookie: config.cookie,
            metrics,
        }
    }

    /// The session an incoming token carries (see [`Session::decode`]), counted; an ignored
    /// token starts an empty session.
    pub fn incoming(&self, lines: &[&[u8]], now_ms: u64) -> Session {
        self.incoming_exact(lines, now_ms).0
    }

    /// [`Sessions::incoming`], and whether the session is exactly the token sent: one valid
    /// token none of whose floors expired, so [`Sessions::encode`] of the session unchanged
    /// would give back the token's own text. Several tokens are merged ([`Session::merge`],
    /// within `session.max_keys`), each counted by its own outcome.
    pub fn incoming_exact(&self, lines: &[&[u8]], now_ms: u64) -> (Session, bool) {
        let mut texts = tokens(lines);
        let mut sessions = Vec::new();
        let mut count = 0;
        let mut exact = false;
        for text in texts.by_ref().take(MAX_TOKENS) {
            count += 1;
            let decoded = Session::decode(text, &self.key, now_ms);
            self.metrics.count(&decoded);
            if let Decoded::Valid(session) = decoded {
                // A valid token is 1 + 25 n + 8 bytes, so its length tells how many floors it
                // held before the expired ones were dropped.
                let bytes = text.len() * 3 / 4;
                exact = bytes
                    .checked_sub(1 + TAG_BYTES)
                    .map(|body| body / FLOOR_BYTES)
                    == Some(session.len());
                sessions.push(session);
            }
        }
        for _ in texts {
            self.metrics.count(&Decoded::Oversized);
            count += 1;
        }
        (Session::merge(sessions, self.max_keys), exact && count == 1)
    }

    /// The hash `key` has in tokens.
    pub fn key_hash(&self, key: &Key) -> u64 {
        self.key.key_hash(key)
    }

    /// Records a floor in `session` (see [`Session::record`]) within `session.max_keys`;
    /// returns whether the session changed.
    pub fn record(&self, session: &mut Session, floor: SessionFloor, now_ms: u64) -> bool {
        session.record(floor, now_ms, self.max_keys)
    }

    /// [`Sessions::encode`] as shared bytes, in one allocation.
    pub fn encode_bytes(&self, session: &Session) -> Bytes {
        session.encode_bytes(&self.key)
    }

    /// The token text of `session`.
    pub fn encode(&self, session: &Session) -> String {
        session.encode(&self.key)
    }

    /// Whether the token also travels as a cookie.
    pub fn cookie(&self) -> bool {
        self.cookie
    }
}

/// The tokens a request's lines carry: each line split at commas (a token's base64url alphabet
/// has none), each value trimmed of spaces and tabs, empty values between commas skipped; a line
/// that holds nothing else is one empty (garbled) token.
pub fn tokens<'a>(lines: &'a [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> + 'a {
    lines.iter().flat_map(|line| {
        let whole = line.trim_ascii();
        let values = whole
            .split(|&byte| byte == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|value| !value.is_empty());
        std::iter::once(whole)
            .filter(|whole| whole.is_empty())
            .chain(values)
    })
}

/// The label of [`SessionMetrics::tokens`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The `outcome` labels of `hotsplit_session_tokens_total`, in [`SessionMetrics`] order.
const OUTCOMES: [&str; 5] = [
    "valid",
    "unknown_version",
    "garbled",
    "oversized",
    "unverified",
];

/// What happened to incoming session tokens: `hotsplit_session_tokens_total{outcome}`, one
/// counter per outcome resolved at startup (no label lookup per request).
#[derive(Debug, Clone)]
pub struct SessionMetrics {
    /// One counter per entry of [`OUTCOMES`].
    tokens: [Counter; 5],
}

impl SessionMetrics {
    /// Registers the counters in `registry`.
    pub fn register(registry: &mut Registry) -> SessionMetrics {
        let family = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "session_tokens",
            "Incoming Hotsplit-Session tokens by outcome: valid, or ignored as unknown_version, garbled, oversized or unverified",
            family.clone(),
        );
        SessionMetrics {
            tokens: OUTCOMES.map(|outcome| family.get_or_create(&OutcomeLabel { outcome }).clone()),
        }
    }

    /// Counts one incoming token.
    pub fn count(&self, decoded: &Decoded) {
        if let Some(outcome) = decoded.outcome() {
            if let Some(at) = OUTCOMES.iter().position(|known| *known == outcome) {
                self.tokens[at].inc();
            }
        }
    }
}

/// The one-floor tokens a thread encoded lately: a client that sends no token and reads one key
/// gets a one-floor token, and every such client of a hot key's copy gets the same one (same
/// key, version and copy expiry), so it is encoded once per thread, not per answer. The copies
/// of one key have the same key hash but their own (jittered) expiries, so entries are placed by
/// a hash of the whole floor, in sets of a few ways: the copies of a hot key do not push each
/// other out. An entry holds the deployment key's words too: two services in one process
/// (tests) have different keys.
mod single_floor {
    use std::cell::RefCell;

    use bytes::Bytes;

    use super::{SessionFloor, SessionKey};

    /// Entries per set.
    const WAYS: usize = 4;

    /// Sets, chosen by the floor's hash.
    const SETS: usize = 16;

    /// One remembered token: the key's words, the floor, the token.
    type Slot = Option<((u64, u64), SessionFloor, Bytes)>;

    thread_local! {
        static TOKENS: RefCell<[[Slot; WAYS]; SETS]> =
            const { RefCell::new([const { [const { None }; WAYS] }; SETS]) };
    }

    /// A hash of `floor` that spreads the copies of one key (same key hash, other expiries).
    fn mix(floor: &SessionFloor) -> u64 {
        let mixed = floor.key_hash
            ^ floor.expire_at_ms.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ floor.version.get().rotate_left(29);
        mixed.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (mixed >> 31)
    }

    /// The token of the one-floor session `floor` under `key`: remembered, or `encode`d and
    /// remembered.
    pub(super) fn token(
        key: &SessionKey,
        floor: SessionFloor,
        encode: impl FnOnce() -> Bytes,
    ) -> Bytes {
        let hash = mix(&floor);
        let set = (hash >> 32) as usize % SETS;
        let found = TOKENS.with(|tokens| {
            let tokens = tokens.try_borrow().ok()?;
            tokens[set].iter().find_map(|slot| match slot {
                Some((words, held, token)) if *words == key.words && *held == floor => {
                    Some(token.clone())
                }
                _ => None,
            })
        });
        if let Some(token) = found {
            return token;
        }
        let token = encode();
        TOKENS.with(|tokens| {
            if let Ok(mut tokens) = tokens.try_borrow_mut() {
                let ways = &mut tokens[set];
                // An empty way first, else one chosen by the hash's low bits.
                let way = ways
                    .iter()
                    .position(Option::is_none)
                    .unwrap_or(hash as usize % WAYS);
                ways[way] = Some((key.words, floor, token.clone()));
            }
        });
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token's text encoding, as whole strings and vectors.
    mod base64url {
        use super::{Engine, BASE64URL};

        pub(super) fn encode(bytes: &[u8]) -> String {
            BASE64URL.encode(bytes)
        }

        pub(super) fn decode(text: &[u8]) -> Option<Vec<u8>> {
            BASE64URL.decode(text).ok()
        }
    }

    fn key() -> SessionKey {
        SessionKey::from_hex("000102030405060708090a0b0c0d0e0f").unwrap()
    }

    fn floor(hash: u64, version: u64, expire_at_ms: u64, written: bool) -> SessionFloor {
        SessionFloor {
            key_hash: hash,
            version: Version::new(version).unwrap(),
            expire_at_ms,
            written,
        }
    }

    fn decode(text: &str, now_ms: u64) -> Decoded {
        Session::decode(text.as_bytes(), &key(), now_ms)
    }

    #[test]
    fn base64url_round_trips_and_has_one_spelling() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|n| (n * 37 + 11) as u8).collect();
            let text = base64url::encode(&bytes);
            assert_eq!(text.len(), encoded_len(len));
            assert_eq!(base64url::decode(text.as_bytes()), Some(bytes));
        }
        assert_eq!(base64url::encode(b"\xfb\xff"), "-_8");
        // "-_9" has a non-zero unused bit; "A" is one character short of a byte; "+" and "="
        // are standard base64, not base64url.
        for bad in ["-_9", "A", "+w", "AA==", "A A"] {
            assert_eq!(base64url::decode(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_token_round_trips_and_drops_expired_floors() {
        let mut session = Session::default();
        session.record(floor(1, 5, 2_000, true), 1_000, 32);
        session.record(floor(2, 7, 1_500, false), 1_000, 32);
        let text = session.encode(&key());
        assert_eq!(decode(&text, 1_000), Decoded::Valid(session.clone()));
        let Decoded::Valid(later) = decode(&text, 1_500) else {
            panic!("valid")
        };
        assert_eq!(later.len(), 1);
        assert_eq!(
            later.floors(1, 1_500),
            Floors {
                written: Version::new(5).ok(),
                seen: None
            }
        );
        assert_eq!(later.floors(2, 1_500), Floors::default());
    }

    #[test]
    fn recording_keeps_the_highest_floor_and_the_most_recent_keys() {
        let mut session = Session::default();
        session.record(floor(1, 5, 9_000, false), 0, 2);
        session.record(floor(1, 3, 9_000, false), 0, 2);
        assert_eq!(session.floors(1, 0).seen, Version::new(5).ok());
        session.record(floor(1, 5, 9_500, true), 0, 2);
        assert_eq!(
            session.floors(1, 0),
            Floors {
                written: Version::new(5).ok(),
                seen: None
            }
        );
        session.record(floor(2, 1, 9_000, false), 0, 2);
        session.record(floor(1, 6, 9_000, false), 0, 2);
        // Key 2 is now the least recently used: a third key pushes it out.
        session.record(floor(3, 1, 9_000, false), 0, 2);
        assert_eq!(session.len(), 2);
        assert_eq!(session.floors(2, 0), Floors::default());
        assert_eq!(session.floors(1, 0).seen, Version::new(6).ok());
    }

    #[test]
    fn recording_says_exactly_when_the_token_changes() {
        // A fixed pseudo-random walk over few keys, versions and expiries, with a small bound:
        // new keys, equal and lower floors, reorders, expiries and evictions all occur.
        let mut session = Session::default();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let (mut changed_seen, mut unchanged_seen) = (0, 0);
        for step in 0..5_000u64 {
            let now_ms = step / 10;
            let recorded = floor(next(4), 1 + next(3), now_ms + 1 + next(40), next(2) == 0);
            let before = session.encode(&key());
            let changed = session.record(recorded, now_ms, 3);
            let after = session.encode(&key());
            assert_eq!(changed, before != after, "step {step}: {recorded:?}");
            if changed {
                changed_seen += 1;
            } else {
                unchanged_seen += 1;
            }
        }
        assert!(changed_seen > 100 && unchanged_seen > 100);
    }

    #[test]
    fn an_incoming_token_is_exact_until_a_floor_of_it_expires() {
        let mut registry = prometheus_client::registry::Registry::default();
        let sessions = Sessions::new(
            key(),
            &SessionConfig::default(),
            SessionMetrics::register(&mut registry),
        );
        let mut session = Session::default();
        session.record(floor(1, 5, 2_000, false), 0, 32);
        session.record(floor(2, 7, 3_000, true), 0, 32);
        let text = sessions.encode(&session);
        assert_eq!(
            sessions.encode_bytes(&session).as_ref(),
            text.as_bytes(),
            "one encoding, as text or as shared bytes"
        );
        // One-floor tokens are remembered per thread, under their deployment key: the same
        // floor under another key is another token, and each stays its own encoding.
        let other_key = SessionKey::from_hex("ffffffffffffffffffffffffffffffff").unwrap();
        let mut single = Session::default();
        single.record(floor(3, 9, 9_000, false), 0, 32);
        for _ in 0..2 {
            for key in [key(), other_key.clone()] {
                assert_eq!(
                    single.encode_bytes(&key).as_ref(),
                    single.encode(&key).as_bytes()
                );
            }
        }
        assert_ne!(single.encode(&key()), single.encode(&other_key));
        // Many floors of one key (copies: other expiries), more than a set holds, each stay
        // their own token whether remembered, pushed out or encoded anew.
        for _ in 0..2 {
            for expiry in 9_000..9_200 {
                let mut copy = Session::default();
                copy.record(floor(3, 9, expiry, false), 0, 32);
                assert_eq!(
                    copy.encode_bytes(&key()).as_ref(),
                    copy.encode(&key()).as_bytes()
                );
            }
        }
        assert_eq!(
            sessions.incoming_exact(&[text.as_bytes()], 1_000),
            (session.clone(), true)
        );
        let (later, exact) = sessions.incoming_exact(&[text.as_bytes()], 2_000);
        assert_eq!((later.len(), exact), (1, false), "a floor expired");
        assert!(!sessions.incoming_exact(&[], 0).1, "no token");
        assert!(!sessions.incoming_exact(&[b"!!"], 0).1, "a garbled token");
        assert_eq!(
            sessions.incoming_exact(&[text.as_bytes(), text.as_bytes()], 1_000),
            (session.clone(), false),
            "two lines of one token: its floors, merged, never exact"
        );
    }

    #[test]
    fn ignored_tokens_say_why() {
        let mut session = Session::default();
        session.record(floor(1, 5, 2_000, false), 0, 32);
        let text = session.encode(&key());
        // Another version byte ("Ag" is byte 2), however long.
        assert_eq!(decode("Ag", 0), Decoded::UnknownVersion);
        let mut other = base64url::decode(text.as_bytes()).unwrap();
        other[0] = 2;
        assert_eq!(
            decode(&base64url::encode(&other), 0),
            Decoded::UnknownVersion
        );
        // Garbled: not base64url, empty, a truncated floor.
        for bad in ["!!", "", "AQ", &text[..text.len() - 2]] {
            assert_eq!(decode(bad, 0), Decoded::Garbled, "{bad:?}");
        }
        // A raised floor (a forgery) or another deployment's key fails the tag.
        let mut forged = base64url::decode(text.as_bytes()).unwrap();
        forged[16] ^= 1;
        assert_eq!(decode(&base64url::encode(&forged), 0), Decoded::Unverified);
        let other_key = SessionKey::from_hex("ffffffffffffffffffffffffffffffff").unwrap();
        assert_eq!(
            Session::decode(text.as_bytes(), &other_key, 0),
            Decoded::Unverified
        );
        // Oversized, before any decoding.
        let long = "A".repeat(MAX_TOKEN_CHARS + 1);
        assert_eq!(decode(&long, 0), Decoded::Oversized);
    }

    #[test]
    fn the_largest_token_fits_the_stated_bound() {
        let mut session = Session::default();
        for hash in 0..100 {
            session.record(floor(hash, u64::MAX, u64::MAX, true), 0, MAX_FLOORS);
        }
        assert_eq!(session.len(), MAX_FLOORS);
        let text = session.encode(&key());
        assert_eq!(text.len(), MAX_TOKEN_CHARS);
        assert_eq!(MAX_TOKEN_CHARS, 2_146);
        assert_eq!(decode(&text, 0), Decoded::Valid(session));
    }

    #[test]
    fn key_hashes_depend_on_the_deployment_key() {
        let name = Key::parse("user:1").unwrap();
        let other = SessionKey::from_hex("ffffffffffffffffffffffffffffffff").unwrap();
        assert_ne!(key().key_hash(&name), other.key_hash(&name));
        assert_eq!(key().key_hash(&name), key().key_hash(&name));
        assert!(SessionKey::from_hex("xyz").is_none());
        let random = SessionKey::random();
        let parsed = SessionKey::from_hex(&random.to_hex()).unwrap();
        assert_eq!(parsed.key_hash(&name), random.key_hash(&name));
    }

    /// `tests/fixtures/session-token.txt` was encoded by the release before the SipHash and
    /// base64 crates replaced hotsplit's own code (21c9641), with the key of these tests: this
    /// build reads the same floors from it and encodes them to the same text, so tokens that
    /// clients hold stay valid across the upgrade.
    #[test]
    fn a_token_written_by_the_earlier_release_reads_back_and_encodes_the_same() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/session-token.txt"
        );
        let golden = std::fs::read_to_string(path).unwrap();
        let golden = golden.trim_end();
        let hash = key().key_hash(&Key::parse("post:9").unwrap());
        let mut session = Session::default();
        session.record(floor(hash, 7, 4_102_444_800_000, true), 1_000, 32);
        session.record(
            floor(
                hash ^ 1,
                18_446_744_073_709_551_615,
                4_102_444_800_001,
                false,
            ),
            1_000,
            32,
        );
        session.record(floor(3, 1, 4_102_444_800_002, false), 1_000, 32);
        assert_eq!(decode(golden, 1_000), Decoded::Valid(session.clone()));
        assert_eq!(session.encode(&key()), golden);
    }

    fn sessions(max_keys: usize) -> Sessions {
        let mut registry = prometheus_client::registry::Registry::default();
        Sessions::new(
            key(),
            &SessionConfig {
                max_keys,
                ..SessionConfig::default()
            },
            SessionMetrics::register(&mut registry),
        )
    }

    #[test]
    fn lines_split_at_commas_into_tokens() {
        let lines: [&[u8]; 3] = [b"aa, bb,,cc ", b"", b" dd"];
        let split: Vec<&[u8]> = tokens(&lines).collect();
        assert_eq!(split, [&b"aa"[..], b"bb", b"cc", b"", b"dd"]);
    }

    #[test]
    fn merged_tokens_keep_every_key_at_its_highest_floor() {
        let sessions = sessions(32);
        // Two answers that came back out of order, from one older token: each added a key,
        // and they disagree on key 1 (5 written against 7 seen) and key 2 (equal versions).
        let mut first = Session::default();
        first.record(floor(1, 5, 9_000, true), 0, 32);
        first.record(floor(2, 3, 8_000, true), 0, 32);
        first.record(floor(10, 1, 9_000, false), 0, 32);
        let mut second = Session::default();
        second.record(floor(1, 7, 9_500, false), 0, 32);
        second.record(floor(2, 3, 8_500, false), 0, 32);
        second.record(floor(11, 1, 9_000, true), 0, 32);
        let (a, b) = (sessions.encode(&first), sessions.encode(&second));
        for lines in [
            vec![a.as_bytes(), b.as_bytes()],
            vec![b.as_bytes(), a.as_bytes()],
        ] {
            let (merged, exact) = sessions.incoming_exact(&lines, 1_000);
            assert!(!exact);
            assert_eq!(merged.len(), 4);
            assert_eq!(merged.floors(1, 1_000).seen, Version::new(7).ok());
            assert_eq!(
                merged.floors(1, 1_000).written,
                None,
                "7 seen is above 5 written"
            );
            assert_eq!(merged.floors(2, 1_000).written, Version::new(3).ok());
            assert_eq!(
                merged.floors(2, 8_200).written,
                Version::new(3).ok(),
                "later expiry"
            );
            assert_eq!(merged.floors(10, 1_000).seen, Version::new(1).ok());
            assert_eq!(merged.floors(11, 1_000).written, Version::new(1).ok());
        }
        // One line, comma-separated, is the same merge; a bad token beside them is ignored.
        let joined = format!("{a}, !!,{b}");
        let (merged, _) = sessions.incoming_exact(&[joined.as_bytes()], 1_000);
        assert_eq!(merged.floors(1, 1_000).seen, Version::new(7).ok());
        assert_eq!(merged.len(), 4);
        // Merging never lowers: whichever order, against every single token.
        for one in [&first, &second] {
            for hash in [1, 2, 10, 11] {
                let own = one.floors(hash, 1_000);
                let all = merged.floors(hash, 1_000);
                assert!(all.written.max(all.seen) >= own.written.max(own.seen));
            }
        }
    }

    #[test]
    fn a_full_merge_drops_the_least_recently_used_of_every_token() {
        let sessions = sessions(4);
        let mut first = Session::default();
        let mut second = Session::default();
        for hash in 0..4 {
            first.record(floor(hash, 1, 9_000, false), 0, 4);
            second.record(floor(100 + hash, 1, 9_000, false), 0, 4);
        }
        let (a, b) = (sessions.encode(&first), sessions.encode(&second));
        let (merged, _) = sessions.incoming_exact(&[a.as_bytes(), b.as_bytes()], 0);
        assert_eq!(merged.len(), 4);
        // The two most recent keys of each token stay.
        for hash in [2, 3, 102, 103] {
            assert!(merged.floors(hash, 0).seen.is_some(), "{hash}");
        }
        for hash in [0, 1, 100, 101] {
            assert!(merged.floors(hash, 0).seen.is_none(), "{hash}");
        }
    }

    #[test]
    fn tokens_beyond_the_bound_are_ignored() {
        let sessions = sessions(MAX_FLOORS);
        let mut texts = Vec::new();
        for hash in 0..(MAX_TOKENS as u64 + 2) {
            let mut one = Session::default();
            one.record(floor(hash, 1, 9_000, false), 0, 32);
            texts.push(sessions.encode(&one));
        }
        let lines: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
        let (merged, _) = sessions.incoming_exact(&lines, 0);
        assert_eq!(merged.len(), MAX_TOKENS);
        assert!(merged.floors(0, 0).seen.is_some());
        assert!(merged.floors(MAX_TOKENS as u64, 0).seen.is_none());
    }
}
