//! The read answer's headers, rendered with as few allocations as their bytes allow.
//!
//! Every read answer carries the same handful of values, and most of them repeat: the route's
//! `class=NAME;reason=REASON` is one of a fixed set for the life of the process (class names
//! cannot change without a restart, `Router::reload_classes`), and the copy index and a
//! near-cache `Age` are small numbers. Those are rendered once, as header values over shared or
//! static bytes, so putting one on an answer takes a reference count, not a buffer. A hot key's
//! answers also repeat its version and the node that served it: those values are remembered
//! per thread (a few slots, by version and by node), so they are rendered once per thread, not
//! per answer. A near-cache entry's `age_ms` changes with every answer and is written into one
//! exactly sized buffer. The bytes are the ones `format!` gave before:
//! `tests/integration/answer_headers.rs` pins them.

use std::cell::RefCell;
use std::fmt::Write as _;

use axum::body::Bytes;
use axum::http::HeaderValue;

use crate::key::Version;
use crate::ops::Ops;
use crate::read::RouteNote;
use crate::route::{ReadClass, RouteReason};
use crate::store::ServedBy;

/// Copy indexes (at most 1024 copies) and `Age` seconds below this are rendered from static
/// bytes.
const SMALL: usize = 1024;

/// The decimal digits of every number below [`SMALL`], one after another, and where each one
/// starts: `SMALL_DIGITS[SMALL_STARTS[n]..SMALL_STARTS[n + 1]]` is `n`.
static SMALL_DIGITS: [u8; small_digits_len()] = small_digits();

/// See [`SMALL_DIGITS`].
static SMALL_STARTS: [u16; SMALL + 1] = small_starts();

/// How many decimal digits `n` has.
const fn digit_count(n: usize) -> usize {
    let mut count = 1;
    let mut rest = n / 10;
    while rest > 0 {
        count += 1;
        rest /= 10;
    }
    count
}

/// The length of [`SMALL_DIGITS`].
const fn small_digits_len() -> usize {
    let mut total = 0;
    let mut n = 0;
    while n < SMALL {
        total += digit_count(n);
        n += 1;
    }
    total
}

/// Builds [`SMALL_DIGITS`].
const fn small_digits() -> [u8; small_digits_len()] {
    let mut digits = [0u8; small_digits_len()];
    let mut at = 0;
    let mut n = 0;
    while n < SMALL {
        let count = digit_count(n);
        let mut rest = n;
        let mut place = count;
        while place > 0 {
            place -= 1;
            digits[at + place] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += count;
        n += 1;
    }
    digits
}

/// Builds [`SMALL_STARTS`].
const fn small_starts() -> [u16; SMALL + 1] {
    let mut starts = [0u16; SMALL + 1];
    let mut n = 0;
    while n < SMALL {
        starts[n + 1] = starts[n] + digit_count(n) as u16;
        n += 1;
    }
    starts
}

/// `n` as a header value: from static bytes below [`SMALL`], else rendered.
pub(super) fn number(n: u64) -> HeaderValue {
    match usize::try_from(n) {
        Ok(small) if small < SMALL => {
            let text = &SMALL_DIGITS
                [usize::from(SMALL_STARTS[small])..usize::from(SMALL_STARTS[small + 1])];
            // Digits are always a valid header value.
            HeaderValue::from_maybe_shared(Bytes::from_static(text))
                .unwrap_or_else(|_| HeaderValue::from(n))
        }
        _ => HeaderValue::from(n),
    }
}

/// Digits of a `u128` in a stack buffer: the `Display` of the number, without a `String`.
struct Decimal {
    /// The digits, right-aligned.
    buffer: [u8; 39],
    /// Where the first digit is.
    start: usize,
}

impl Decimal {
    fn new(mut n: u128) -> Decimal {
        let mut buffer = [0u8; 39];
        let mut start = buffer.len();
        loop {
            start -= 1;
            buffer[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { buffer, start }
    }

    fn digits(&self) -> &[u8] {
        &self.buffer[self.start..]
    }
}

/// A header value of `parts` joined, in one buffer; `None` when the bytes are not a valid
/// header value (the header is then left out, as before).
fn joined(parts: &[&[u8]]) -> Option<HeaderValue> {
    let mut bytes = Vec::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        bytes.extend_from_slice(part);
    }
    HeaderValue::from_maybe_shared(Bytes::from(bytes)).ok()
}

/// Slots of the per-thread memories below, chosen by a hash of what is rendered.
const SLOTS: usize = 32;

/// A version's `ETag` (`None` if it were not a valid header value) and `Hotsplit-Version`.
type VersionValues = (Option<HeaderValue>, HeaderValue);

/// A per-thread memory of rendered values: a slot holds one key and its value.
type Memory<K, V> = RefCell<[Option<(K, V)>; SLOTS]>;

thread_local! {
    /// The `ETag` and `Hotsplit-Version` values this thread rendered lately, by version: a hot
    /// key's answers repeat its version, so its values are rendered once per thread and then
    /// shared (a reference count) rather than rendered per answer.
    static VERSIONS: Memory<Version, VersionValues> =
        const { RefCell::new([const { None }; SLOTS]) };
    /// The `Hotsplit-Served-By` values this thread rendered lately, by node and role.
    static SERVED_BY: Memory<ServedBy, Option<HeaderValue>> =
        const { RefCell::new([const { None }; SLOTS]) };
}

/// Looks `key` up in this thread's `memory` at `slot`, or renders it with `render` and keeps it.
fn remembered<K: PartialEq + Clone, V: Clone>(
    memory: &'static std::thread::LocalKey<Memory<K, V>>,
    slot: usize,
    key: &K,
    render: impl FnOnce() -> V,
) -> V {
    let found = memory.with(|memory| {
        let memory = memory.try_borrow().ok()?;
        match &memory[slot % SLOTS] {
            Some((held, value)) if held == key => Some(value.clone()),
            _ => None,
        }
    });
    if let Some(value) = found {
        return value;
    }
    let value = render();
    memory.with(|memory| {
        if let Ok(mut memory) = memory.try_borrow_mut() {
            memory[slot % SLOTS] = Some((key.clone(), value.clone()));
        }
    });
    value
}

/// `ETag: "V"` (`None` if it were not a valid header value) and `Hotsplit-Version: V`.
pub(super) fn version(version: Version) -> VersionValues {
    remembered(&VERSIONS, version.get() as usize, &version, || {
        let digits = Decimal::new(u128::from(version.get()));
        (
            joined(&[b"\"", digits.digits(), b"\""]),
            HeaderValue::from(version.get()),
        )
    })
}

/// `Hotsplit-Served-By`: `ServedBy`'s `Display` (`None` if it were not a valid header value).
pub(super) fn served_by(served_by: &ServedBy) -> Option<HeaderValue> {
    // FNV-1a over the node's label: a slot, not a security boundary.
    let slot = served_by
        .node
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        }) as usize
        + served_by.role as usize;
    remembered(&SERVED_BY, slot, served_by, || {
        let mut text = String::with_capacity(served_by.node.as_str().len() + ";role=replica".len());
        // Writing into a String does not fail.
        let _ = write!(text, "{served_by}");
        HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
    })
}

/// The `Hotsplit-Route` values `class=NAME;reason=REASON` of every class and reason, rendered
/// once: class names and their order are fixed for the life of the process.
pub(crate) struct RouteTexts {
    /// By class index, then by reason in [`RouteReason::ALL`] order; `None` where the text is
    /// not a valid header value (the header is then left out, as before).
    by_class: Vec<[Option<HeaderValue>; RouteReason::ALL.len()]>,
}

impl RouteTexts {
    /// The texts of the classes `ops` reads with.
    pub(crate) fn new(ops: &Ops) -> RouteTexts {
        let classes = ops.classes();
        let by_class = classes
            .iter()
            .map(|(_, def)| {
                RouteReason::ALL.map(|reason| {
                    let text = RouteNote::prefix(&def.name, reason);
                    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
                })
            })
            .collect();
        RouteTexts { by_class }
    }

    /// `class=NAME;reason=REASON`, then `;source=near-cache;age_ms=N` for an answer from the
    /// near cache whose age bound is `near_cache_age`.
    pub(super) fn route(
        &self,
        ops: &Ops,
        class: ReadClass,
        reason: RouteReason,
        near_cache_age: Option<std::time::Duration>,
    ) -> Option<HeaderValue> {
        let at = RouteReason::ALL.iter().position(|known| *known == reason)?;
        let Some(prefix) = self.by_class.get(class.0).map(|texts| &texts[at]) else {
            // A class the table does not know (it cannot happen: classes are fixed at
            // startup): render it in full.
            let classes = ops.classes();
            let note = RouteNote {
                class,
                reason,
                near_cache_age,
            };
            let text = note.text(&classes.get(class).name);
            return HeaderValue::from_maybe_shared(Bytes::from(text)).ok();
        };
        let prefix = prefix.as_ref()?;
        match near_cache_age {
            None => Some(prefix.clone()),
            Some(age) => joined(&[
                prefix.as_bytes(),
                RouteNote::NEAR_CACHE.as_bytes(),
                Decimal::new(age.as_millis()).digits(),
            ]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_numbers_render_as_their_display() {
        for n in (0..1100).chain([u64::from(u32::MAX), u64::MAX]) {
            assert_eq!(number(n).as_bytes(), n.to_string().as_bytes(), "{n}");
        }
        for n in [0u128, 9, 10, 12_345, u128::from(u64::MAX), u128::MAX] {
            assert_eq!(Decimal::new(n).digits(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn versions_render_as_an_etag_and_a_number_remembered_or_not() {
        // 33 and 1 share a slot: each replaces the other and is rendered anew.
        for _ in 0..2 {
            for n in [1, 7, 10, 33, 1, 1_234_567_890_123, u64::MAX] {
                let v = Version::new(n).unwrap();
                let (etag, number) = version(v);
                assert_eq!(etag.unwrap().as_bytes(), format!("\"{v}\"").as_bytes());
                assert_eq!(number.as_bytes(), v.to_string().as_bytes());
            }
        }
    }

    #[test]
    fn served_by_renders_as_its_display_remembered_or_not() {
        use crate::store::NodeLabel;
        let nodes = [
            ServedBy::primary(NodeLabel::new("10.0.0.1:6379")),
            ServedBy::replica(NodeLabel::new("10.0.0.1:6379")),
            ServedBy::primary(NodeLabel::new("10.0.0.2:6379")),
            ServedBy::embedded(),
        ];
        for _ in 0..2 {
            for node in &nodes {
                assert_eq!(
                    served_by(node).unwrap().as_bytes(),
                    node.to_string().as_bytes()
                );
            }
        }
    }
}
