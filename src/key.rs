//! Keys, copy keys and versions: the crate's own vocabulary for what is stored.
//!
//! A [`Key`] is a validated user key. Copy `i` of key `K` is stored at the [`CopyKey`] that
//! [`CopyKey::new`] names, the one naming function: `K#i` under [`Placement::Suffix`], `K#i{t}`
//! for `i ≥ 1` under [`Placement::Spread`] (the tag `t` spreads the copies' slots, see
//! [`crate::placement`]); copy 0 is `K#0` under both. Because a valid key never contains `#`, `{`
//! or `}`, copy keys never collide with user keys, a tag is always the copy name's own, and
//! [`CopyKey::parse`] reads any copy name back to its key, index and placement. A [`Version`] is an
//! unsigned 64-bit edit counter, at least 1, written in canonical decimal.

use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

use crate::error::{Error, ErrorKind, Result};
pub use crate::placement::Placement;
use crate::placement::{slot_of, spread_slot, tag_of_slot};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// The character that separates a key from its copy index.
pub const COPY_SEPARATOR: char = '#';

/// The largest number of copies a family may have.
pub const MAX_COPIES: u32 = 1024;

/// A validated user key: 1..=512 printable ASCII bytes without `{`, `}` or `#`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Validates `raw` as a key.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] when the key is empty, longer than 512 bytes, contains a byte
    /// outside printable ASCII (`0x21..=0x7e`), or contains `{`, `}` or `#`.
    pub fn parse(raw: &str) -> Result<Key> {
        Key::check(raw)?;
        Ok(Key(raw.to_owned()))
    }

    /// Validates `raw` as a key and keeps its buffer, where [`Key::parse`] copies it (the HTTP
    /// layer already owns the decoded path segment).
    ///
    /// # Errors
    /// As [`Key::parse`].
    pub fn parse_owned(raw: String) -> Result<Key> {
        Key::check(&raw)?;
        Ok(Key(raw))
    }

    /// The checks of [`Key::parse`].
    fn check(raw: &str) -> Result<()> {
        if raw.is_empty() {
            return Err(Error::new(ErrorKind::InvalidKey, "key is empty"));
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!("key is {} bytes, longer than {MAX_KEY_LEN}", raw.len()),
            ));
        }
        for (at, byte) in raw.bytes().enumerate() {
            match byte {
                b'{' | b'}' => {
                    return Err(Error::new(
                        ErrorKind::InvalidKey,
                        format!("key contains '{}' at byte {at}: hash tags would pin every copy to one slot", byte as char),
                    ))
                }
                b'#' => {
                    return Err(Error::new(
                        ErrorKind::InvalidKey,
                        format!("key contains '#' at byte {at}: '#' separates a key from its copy index"),
                    ))
                }
                0x21..=0x7e => {}
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidKey,
                        format!("key contains a non-printable or non-ascii byte 0x{byte:02x} at byte {at}"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of copy `index` under `placement` ([`CopyKey::new`]).
    pub fn copy_key(&self, index: u32, placement: Placement) -> CopyKey {
        CopyKey::new(self, index, placement)
    }

    /// Calls `f` with the text of copy `index`'s key (as [`Key::copy_key`] names it) built on
    /// the stack: a near-cache hit looks its entry up by it, and needs no owned [`CopyKey`]
    /// (nor, for a spread copy, the copy 0 name its tag is hashed from).
    pub fn with_copy_key_text<R>(
        &self,
        index: u32,
        placement: Placement,
        f: impl FnOnce(&str) -> R,
    ) -> R {
        // The key, the separator, up to 10 digits and a tag of up to 4 characters with braces.
        let mut buffer = [0u8; MAX_KEY_LEN + 17];
        let key = self.0.as_bytes();
        let Some(slot) = buffer.get_mut(..key.len()) else {
            // Not a validated key's length: the owned copy key says the same.
            return f(self.copy_key(index, placement).as_str());
        };
        slot.copy_from_slice(key);
        let mut at = key.len();
        buffer[at] = COPY_SEPARATOR as u8;
        at += 1;
        let tag = (placement == Placement::Spread && index > 0).then(|| {
            // Copy 0's name, `K#0`, is what the tag is hashed from.
            buffer[at] = b'0';
            let slot_0 = std::str::from_utf8(&buffer[..=at]).map_or(0, slot_of);
            tag_of_slot(spread_slot(slot_0, index))
        });
        let mut digits = [0u8; 10];
        let mut count = 0;
        let mut rest = index;
        loop {
            digits[count] = b'0' + (rest % 10) as u8;
            count += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        for digit in digits[..count].iter().rev() {
            buffer[at] = *digit;
            at += 1;
        }
        if let Some(tag) = tag {
            let tagged = 2 + tag.len();
            let Some(slot) = buffer.get_mut(at..at + tagged) else {
                return f(self.copy_key(index, placement).as_str());
            };
            slot[0] = b'{';
            slot[1..=tag.len()].copy_from_slice(tag.as_bytes());
            slot[tagged - 1] = b'}';
            at += tagged;
        }
        match std::str::from_utf8(&buffer[..at]) {
            Ok(text) => f(text),
            // A key is ASCII, so this does not happen; the owned copy key says the same.
            Err(_) => f(self.copy_key(index, placement).as_str()),
        }
    }

    /// The key of the per-key version counter used by `versioning = "allocated"` families.
    ///
    /// It ends in `#v`, which no copy key (`#` followed by digits) and no user key can equal.
    pub fn counter_key(&self) -> String {
        format!("{}{COPY_SEPARATOR}v", self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The Redis key of one copy: `K#i`, or `K#i{t}` for a spread copy `i ≥ 1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyKey {
    /// The full stored key, `K#i` or `K#i{t}`.
    full: String,
    /// The copy index `i`, kept so callers need not parse it back.
    index: u32,
}

impl CopyKey {
    /// The name of copy `index` of `key` under `placement`: the one function every path that
    /// names a copy goes through (publish, reads, read repair, the retry spool, sweeps, the
    /// scrub, `audit`). Copy 0 is `K#0` under every placement.
    pub fn new(key: &Key, index: u32, placement: Placement) -> CopyKey {
        // Every read builds one, so the buffer is sized once (`format!` would guess a
        // capacity and grow it): the key, the separator, up to 10 digits and a tag of up to 4
        // characters with its braces.
        let mut full = String::with_capacity(key.0.len() + 17);
        full.push_str(&key.0);
        full.push(COPY_SEPARATOR);
        let _ = write!(full, "{index}");
        if placement == Placement::Spread && index > 0 {
            // Copy 0's name, `K#0`, is what the tag is hashed from.
            let slot_0 = key.with_copy_key_text(0, Placement::Suffix, slot_of);
            full.push('{');
            full.push_str(tag_of_slot(spread_slot(slot_0, index)));
            full.push('}');
        }
        CopyKey { full, index }
    }

    /// A stored key read back as a copy: a valid user key, `#`, a canonical decimal index and,
    /// for a spread copy `i ≥ 1`, exactly the tag [`CopyKey::new`] gives it (`K#i` or
    /// `K#i{t}`). `None` for anything else: a counter `K#v`, `foo#bar`, `K#01`, `K#3{zz}` with
    /// another tag, `K#0{t}`, a layout record.
    pub fn parse(stored: &str) -> Option<(Key, CopyKey)> {
        let (untagged, placement) = match stored.strip_suffix('}') {
            Some(rest) => (rest.rsplit_once('{')?.0, Placement::Spread),
            None => (stored, Placement::Suffix),
        };
        let (base, index) = untagged.rsplit_once(COPY_SEPARATOR)?;
        let index: u32 = index.parse().ok()?;
        let key = Key::parse(base).ok()?;
        let copy_key = key.copy_key(index, placement);
        (copy_key.as_str() == stored).then_some((key, copy_key))
    }

    /// The placement this name follows: [`Placement::Spread`] for a tagged name, otherwise
    /// [`Placement::Suffix`] (copy 0 is the same under both, and says `Suffix`).
    pub fn placement(&self) -> Placement {
        if self.full.ends_with('}') {
            Placement::Spread
        } else {
            Placement::Suffix
        }
    }

    /// The stored key, `K#i`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The copy index `i`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The user key `K` this copy belongs to.
    pub fn base(&self) -> &str {
        match self.full.rfind(COPY_SEPARATOR) {
            Some(at) => &self.full[..at],
            None => &self.full,
        }
    }
}

impl fmt::Display for CopyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

/// An edit counter from the source of truth: an unsigned 64-bit integer, at least 1.
///
/// Its text form is canonical decimal (no sign, no leading zeros), which is what the store
/// compares: length first, then bytes, so the comparison is exact over the whole `u64` range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version(u64);

impl Version {
    /// The smallest valid version.
    pub const MIN: Version = Version(1);

    /// Wraps `value`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidVersion`] when `value` is 0.
    pub fn new(value: u64) -> Result<Version> {
        if value == 0 {
            return Err(Error::new(
                ErrorKind::InvalidVersion,
                "version must be at least 1",
            ));
        }
        Ok(Version(value))
    }

    /// The version as an integer.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Version {
    type Err = Error;

    /// Parses canonical decimal: `1..=18446744073709551615`, digits only, no leading zero.
    fn from_str(raw: &str) -> Result<Version> {
        let invalid = |why: &str| {
            Error::new(
                ErrorKind::InvalidVersion,
                format!("version {raw:?} is not canonical decimal: {why}"),
            )
        };
        if raw.is_empty() {
            return Err(invalid("it is empty"));
        }
        if !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("only the digits 0-9 are allowed"));
        }
        if raw.len() > 1 && raw.starts_with('0') {
            return Err(invalid("leading zeros are not allowed"));
        }
        let value: u64 = raw
            .parse()
            .map_err(|_| invalid("it is larger than 18446744073709551615"))?;
        Version::new(value)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(Key::parse("post:9").is_ok());
        assert!(Key::parse(&"k".repeat(512)).is_ok());
        for bad in ["", "a{b", "a}b", "a#b", "a b", "é", "a\nb", "a\u{7f}"] {
            let err = Key::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{bad:?}");
        }
        assert_eq!(
            Key::parse(&"k".repeat(513)).unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
    }

    #[test]
    fn copy_keys_use_the_separator() {
        let key = Key::parse("post:9").unwrap();
        let copy = key.copy_key(7, Placement::Suffix);
        assert_eq!(copy.as_str(), "post:9#7");
        assert_eq!(copy.index(), 7);
        assert_eq!(copy.base(), "post:9");
        assert_eq!(copy.placement(), Placement::Suffix);
        assert_eq!(key.counter_key(), "post:9#v");
    }

    #[test]
    fn spread_copies_are_tagged_onto_their_slots() {
        let key = Key::parse("split16:share").unwrap();
        let zero = key.copy_key(0, Placement::Spread);
        assert_eq!(zero, key.copy_key(0, Placement::Suffix));
        assert_eq!(zero.as_str(), "split16:share#0");
        let slot_0 = slot_of(zero.as_str());
        for index in 1..16 {
            let copy = key.copy_key(index, Placement::Spread);
            let (untagged, tag) = copy.as_str().split_once('{').unwrap();
            assert_eq!(untagged, format!("split16:share#{index}"));
            assert!(tag.ends_with('}') && tag.len() <= 5, "{copy}");
            assert_eq!(slot_of(copy.as_str()), spread_slot(slot_0, index), "{copy}");
            assert_eq!(copy.base(), "split16:share");
            assert_eq!(copy.index(), index);
            assert_eq!(copy.placement(), Placement::Spread);
        }
        // The name the format-2 spool fixture keeps: the naming must never change.
        assert_eq!(
            key.copy_key(5, Placement::Spread).as_str(),
            "split16:share#5{cg7}"
        );
    }

    #[test]
    fn copy_names_parse_back_to_key_index_and_placement() {
        let key = Key::parse("post:9").unwrap();
        for placement in [Placement::Suffix, Placement::Spread] {
            for index in [0, 1, 7, 15, 1023] {
                let copy = key.copy_key(index, placement);
                let (parsed_key, parsed) = CopyKey::parse(copy.as_str()).unwrap();
                assert_eq!(parsed_key, key);
                assert_eq!(parsed, copy);
                assert_eq!(parsed.index(), index);
            }
        }
        let tagged = key.copy_key(3, Placement::Spread);
        let (_, tag) = tagged.as_str().split_once('{').unwrap();
        for not_a_copy in [
            "post:9#v".to_owned(),
            "post:9#01".to_owned(),
            format!("post:9#0{{{tag}"),
            format!("post:9#4{{{tag}"),
            "post:9#3{}".to_owned(),
            "post:9#3{zzzz}".to_owned(),
            format!("post{{x}}:9#3{{{tag}"),
            "post:9#3}".to_owned(),
        ] {
            assert!(CopyKey::parse(&not_a_copy).is_none(), "{not_a_copy}");
        }
    }

    #[test]
    fn the_copy_key_text_on_the_stack_is_the_copy_keys() {
        for key in ["post:9", &"k".repeat(MAX_KEY_LEN)] {
            let key = Key::parse(key).unwrap();
            for placement in [Placement::Suffix, Placement::Spread] {
                for index in [0, 7, 9, 10, 99, 1023, 4_294_967_295] {
                    let owned = key.copy_key(index, placement);
                    key.with_copy_key_text(index, placement, |text| {
                        assert_eq!(text, owned.as_str())
                    });
                }
            }
        }
    }

    #[test]
    fn versions_are_canonical_decimal() {
        assert_eq!("1".parse::<Version>().unwrap().get(), 1);
        assert_eq!(
            "18446744073709551615".parse::<Version>().unwrap().get(),
            u64::MAX
        );
        for bad in [
            "",
            "0",
            "01",
            "+1",
            "-1",
            "1.0",
            " 1",
            "18446744073709551616",
            "1e3",
        ] {
            let err = bad.parse::<Version>().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidVersion, "{bad:?}");
        }
    }

    #[test]
    fn version_text_orders_like_the_integer() {
        // The store compares canonical text by length, then bytes; that must agree with u64 order.
        let samples = [
            1u64,
            9,
            10,
            99,
            100,
            1 << 53,
            (1 << 53) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for a in samples {
            for b in samples {
                let (ta, tb) = (a.to_string(), b.to_string());
                let text_order = ta.len().cmp(&tb.len()).then(ta.cmp(&tb));
                assert_eq!(text_order, a.cmp(&b), "{a} vs {b}");
            }
        }
    }
}
