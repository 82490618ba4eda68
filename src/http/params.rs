//! What a request says, read exactly: the key in the path and the query parameters with strict
//! percent-decoding, canonical integers, and request headers whose repeated lines are combined
//! the way HTTP defines (one comma-separated list).
//!
//! axum's `Path` and `Query` extractors decode leniently (a malformed escape stays literal,
//! invalid UTF-8 becomes U+FFFD in a query) and answer their own `text/plain` rejections with
//! parser text. Here every failure is an [`ApiError`] whose detail hotsplit writes:
//! - a malformed escape (`%zz`, a lone `%`) or bytes that are not UTF-8 after decoding are
//!   refused, so `a%zzb` and `a%25zzb` are never the same key and `%FF`, `%FE` and `%EF%BF%BD`
//!   are never the same client id;
//! - a query parameter sent twice is refused;
//! - integers are canonical decimal (no sign, no leading zero, no blank).
//!
//! Repeated header lines: floors (`Hotsplit-Min-Version`, `If-None-Match`) combine by maximum
//! over every line and every list member; identities (`Hotsplit-Client`, `Hotsplit-Read-Class`,
//! `Hotsplit-Request`) must be equal as whole lines, never split on commas (an id may contain
//! one); a query parameter that names the same thing wins over the header, as documented.

use std::borrow::Cow;
use std::collections::BTreeMap;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName};
use serde::de::value::{Error as DeError, MapDeserializer};
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use super::paths;
use super::problem::{ApiError, Code};
use crate::key::{Key, Version};
use crate::wire;

/// Why a percent-encoded text did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// A `%` not followed by two hexadecimal digits, at this byte offset of the encoded text.
    MalformedEscape(usize),
    /// The decoded bytes are not UTF-8.
    NotUtf8,
}

impl DecodeError {
    /// The sentence for the client, naming `what` was being decoded.
    fn describe(self, what: &str) -> String {
        match self {
            DecodeError::MalformedEscape(at) => format!(
                "{what} has a malformed percent escape at byte {at}: '%' must be followed by two hexadecimal digits (send '%25' for a literal '%')"
            ),
            DecodeError::NotUtf8 => {
                format!("{what} is not UTF-8 after percent-decoding")
            }
        }
    }
}

/// Decodes `%XX` escapes strictly; with `plus_is_space` (query strings, as in
/// `application/x-www-form-urlencoded`) a `+` is a space.
///
/// # Errors
/// [`DecodeError::MalformedEscape`] for a `%` without two hex digits after it,
/// [`DecodeError::NotUtf8`] when the decoded bytes are not UTF-8.
pub(crate) fn percent_decode(raw: &str, plus_is_space: bool) -> Result<String, DecodeError> {
    percent_decode_cow(raw, plus_is_space).map(Cow::into_owned)
}

/// [`percent_decode`], borrowing `raw` when it has nothing to decode.
///
/// # Errors
/// As [`percent_decode`].
fn percent_decode_cow(raw: &str, plus_is_space: bool) -> Result<Cow<'_, str>, DecodeError> {
    let bytes = raw.as_bytes();
    if !bytes
        .iter()
        .any(|&b| b == b'%' || (plus_is_space && b == b'+'))
    {
        return Ok(Cow::Borrowed(raw));
    }
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let high = bytes.get(at + 1).and_then(|&b| hex_value(b));
                let low = bytes.get(at + 2).and_then(|&b| hex_value(b));
                match (high, low) {
                    (Some(high), Some(low)) => decoded.push(high << 4 | low),
                    _ => return Err(DecodeError::MalformedEscape(at)),
                }
                at += 3;
            }
            b'+' if plus_is_space => {
                decoded.push(b' ');
                at += 1;
            }
            byte => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded)
        .map(Cow::Owned)
        .map_err(|_| DecodeError::NotUtf8)
}

/// The value of one hexadecimal digit.
fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Parses canonical decimal: digits only, no sign, no leading zero (except `0` itself).
///
/// # Errors
/// A sentence naming `name` and what is wrong, for the caller to put in its problem.
pub(crate) fn parse_canonical_u64(raw: &str, name: &str) -> Result<u64, String> {
    if raw.is_empty() {
        return Err(format!("{name} is empty: send canonical decimal digits"));
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{name} {raw:?} is not canonical decimal: only the digits 0-9 are allowed"
        ));
    }
    if raw.len() > 1 && raw.starts_with('0') {
        return Err(format!(
            "{name} {raw:?} is not canonical decimal: it has a leading zero"
        ));
    }
    raw.parse::<u64>()
        .map_err(|_| format!("{name} {raw:?} is larger than {}", u64::MAX))
}

/// The key of a `/v1/keys/{key}` request, decoded strictly from the raw path.
pub struct KeyPath(pub Key);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        KeyPath::of(&parts.uri)
    }
}

impl KeyPath {
    /// The key of `uri`, a request the read or write route matched.
    ///
    /// # Errors
    /// `invalid_key` for a malformed escape or a key that breaks a rule.
    pub(crate) fn of(uri: &axum::http::Uri) -> Result<KeyPath, ApiError> {
        // The route matched, so the raw path is the prefix and one segment; the segment is read
        // here rather than from axum's lenient decoding.
        let raw = uri
            .path()
            .strip_prefix(paths::KEY_PREFIX)
            .unwrap_or_default();
        let decoded = percent_decode(raw, false)
            .map_err(|err| ApiError::new(Code::InvalidKey, err.describe("the key")))?;
        Ok(KeyPath(Key::parse_owned(decoded)?))
    }
}

/// The query string, decoded strictly into `T` (whose fields are all `Option<String>`).
pub struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let parsed = if pairs_of(query).nth(FEW_PAIRS).is_none() {
            check_few_pairs(query)?;
            from_checked_pairs(query)
        } else {
            from_pairs(decode_query(query)?)
        };
        parsed.map(StrictQuery).map_err(|_| {
            // Every field is an optional string and duplicates were refused above, so this
            // does not happen; serde's text is not shown either way.
            ApiError::new(
                Code::InvalidParameter,
                "the query string does not fit this route's parameters",
            )
        })
    }
}

/// Calls `f` with every decoded `(name, value)` pair of `query` once it passed
/// [`decode_query`]'s checks: for a route that reads its few parameters by hand. Names are
/// unique; their order is the query's for a short query, sorted for a long one.
///
/// # Errors
/// As [`decode_query`], with the same sentences.
pub(crate) fn query_pairs(
    query: &str,
    mut f: impl FnMut(&str, Cow<'_, str>),
) -> Result<(), ApiError> {
    if pairs_of(query).nth(FEW_PAIRS).is_some() {
        for (name, value) in decode_query(query)? {
            f(&name, Cow::Owned(value));
        }
        return Ok(());
    }
    check_few_pairs(query)?;
    for (name, value) in pairs_of(query) {
        // Both decoded without error in the check.
        let name = percent_decode_cow(name, true).unwrap_or_default();
        f(&name, percent_decode_cow(value, true).unwrap_or_default());
    }
    Ok(())
}

/// Up to this many pairs, a query is checked pair by pair in place (names compared with every
/// earlier one) and read without collecting anything; a longer one goes through
/// [`decode_query`]'s map, which keeps the check linear.
const FEW_PAIRS: usize = 8;

/// The raw `(name, value)` pairs of a query string, as [`decode_query`] splits them.
fn pairs_of(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// [`decode_query`]'s checks, in its order, on a query of at most [`FEW_PAIRS`] pairs,
/// allocating nothing unless a pair is percent-encoded.
///
/// # Errors
/// As [`decode_query`], with the same sentences.
fn check_few_pairs(query: &str) -> Result<(), ApiError> {
    let invalid = |why: String| ApiError::new(Code::InvalidParameter, why);
    for (at, (raw_name, raw_value)) in pairs_of(query).enumerate() {
        let name = percent_decode_cow(raw_name, true)
            .map_err(|err| invalid(err.describe("a query parameter name")))?;
        percent_decode_cow(raw_value, true)
            .map_err(|err| invalid(err.describe(&format!("query parameter {name:?}"))))?;
        // Every earlier name decoded without error, or this pair would not be reached.
        let repeated = pairs_of(query).take(at).any(|(earlier, _)| {
            percent_decode_cow(earlier, true).is_ok_and(|earlier| earlier == name)
        });
        if repeated {
            return Err(invalid(format!(
                "query parameter {name:?} is sent more than once; send it once"
            )));
        }
    }
    Ok(())
}

/// Builds `T` from a query [`check_few_pairs`] accepted; names are borrowed when they have
/// nothing to decode, and each value is owned once, by the field it fills.
///
/// # Errors
/// serde's error, which callers replace with their own sentence.
fn from_checked_pairs<T: DeserializeOwned>(query: &str) -> Result<T, DeError> {
    T::deserialize(MapDeserializer::<_, DeError>::new(pairs_of(query).map(
        |(name, value)| {
            // Both decoded without error in the check.
            let name = percent_decode_cow(name, true).unwrap_or_default();
            let value = percent_decode_cow(value, true).unwrap_or_default();
            (Name(name), Text(value.into_owned()))
        },
    )))
}

/// A query parameter's decoded name: borrowed from the query when it had nothing to decode.
struct Name<'a>(Cow<'a, str>);

impl<'de> IntoDeserializer<'de, DeError> for Name<'_> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Name<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Cow::Borrowed(name) => visitor.visit_str(name),
            Cow::Owned(name) => visitor.visit_string(name),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// Builds `T` (whose fields are all `Option<String>`) from decoded pairs.
///
/// # Errors
/// serde's error, which callers replace with their own sentence.
pub(crate) fn from_pairs<T: DeserializeOwned>(
    pairs: BTreeMap<String, String>,
) -> Result<T, DeError> {
    T::deserialize(MapDeserializer::<_, DeError>::new(
        pairs.into_iter().map(|(name, value)| (name, Text(value))),
    ))
}

/// A decoded query value: a string that also fills an `Option<String>` field (serde's own
/// `StringDeserializer` does not).
struct Text(String);

impl<'de> IntoDeserializer<'de, DeError> for Text {
    type Deserializer = Text;

    fn into_deserializer(self) -> Text {
        self
    }
}

impl<'de> Deserializer<'de> for Text {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_string(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_some(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// Splits and decodes a query string: `name=value` pairs separated by `&`, each name at most
/// once. Empty pairs (`a=1&&b=2`) are skipped; a name without `=` has the empty value.
///
/// # Errors
/// `invalid_parameter` for a malformed escape, text that is not UTF-8, or a repeated name.
pub(crate) fn decode_query(query: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let invalid = |why: String| ApiError::new(Code::InvalidParameter, why);
    let mut pairs = BTreeMap::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(raw_name, true)
            .map_err(|err| invalid(err.describe("a query parameter name")))?;
        let value = percent_decode(raw_value, true)
            .map_err(|err| invalid(err.describe(&format!("query parameter {name:?}"))))?;
        if pairs.contains_key(&name) {
            return Err(invalid(format!(
                "query parameter {name:?} is sent more than once; send it once"
            )));
        }
        pairs.insert(name, value);
    }
    Ok(pairs)
}

/// `Hotsplit-Client`.
pub(crate) const CLIENT: HeaderName = HeaderName::from_static(wire::header::CLIENT);
/// `Hotsplit-Min-Version`.
pub(crate) const MIN_VERSION: HeaderName = HeaderName::from_static(wire::header::MIN_VERSION);
/// `Hotsplit-Read-Class`.
pub(crate) const READ_CLASS: HeaderName = HeaderName::from_static(wire::header::READ_CLASS);
/// `Hotsplit-Request`.
const REQUEST: HeaderName = HeaderName::from_static(wire::header::REQUEST);

/// Every line of header `name`, as text, once each has been checked (nothing is collected).
/// Names are `HeaderName`s, not text, so a lookup does not parse the name again.
///
/// # Errors
/// `invalid_parameter` when a line is not visible ASCII.
fn header_lines<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<impl Iterator<Item = &'a str>, ApiError> {
    let lines = headers.get_all(name);
    if lines.iter().any(|value| value.to_str().is_err()) {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("header {name} is not visible ascii"),
        ));
    }
    Ok(lines
        .into_iter()
        .map(|value| value.to_str().unwrap_or_default()))
}

/// One identity (a client id, a read class, a request id) from the query value and every line
/// of header `name`. The header's lines must be equal, compared as whole lines (never split on
/// commas: an id may contain one), and not empty; the query's value, when sent, wins over the
/// header, as documented for every such pair.
///
/// # Errors
/// `invalid_parameter` when two lines disagree, a line is empty, or a line is not visible
/// ASCII.
pub(crate) fn one_identity(
    query: Option<String>,
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<String>, ApiError> {
    let mut lines = header_lines(headers, name)?;
    let first = lines.next();
    if first.is_some_and(|line| line.trim().is_empty()) {
        return Err(ApiError::new(
            Code::InvalidParameter,
            format!("header {name} is empty: send a value or leave the header out"),
        ));
    }
    if let Some(first) = first {
        if lines.any(|line| line != first) {
            return Err(ApiError::new(
                Code::InvalidParameter,
                format!(
                    "header {name} is sent on more than one line with different values; send one value"
                ),
            ));
        }
    }
    Ok(query.or_else(|| first.map(str::to_owned)))
}

/// The highest version among the query's floor and every member of every line of header
/// `name` (`Hotsplit-Min-Version`): HTTP joins repeated lines into one comma-separated list.
///
/// # Errors
/// `invalid_version` when a member is not a canonical version, or a header has no member.
pub(crate) fn highest_floor(
    query: Option<&str>,
    query_name: &str,
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<Version>, ApiError> {
    let mut floor = query
        .map(|raw| parse_version(raw, query_name))
        .transpose()?;
    let mut lines = header_lines(headers, name)?.peekable();
    if lines.peek().is_none() {
        return Ok(floor);
    }
    let mut members = lines
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|member| !member.is_empty())
        .peekable();
    if members.peek().is_none() {
        return Err(ApiError::new(
            Code::InvalidVersion,
            format!("header {name} is empty: send a version"),
        ));
    }
    for member in members {
        let version = parse_version(member, name.as_str())?;
        floor = floor.max(Some(version));
    }
    Ok(floor)
}

/// The highest version among the entity tags of every `If-None-Match` line.
///
/// Weak tags (`W/"5"`) and lists (`"5", "7"`) are accepted; tags that are not versions (another
/// server's ETags, `*`) are ignored, which only means the full body is sent.
///
/// # Errors
/// `invalid_parameter` when a line is not visible ASCII.
pub(crate) fn if_none_match(headers: &HeaderMap) -> Result<Option<Version>, ApiError> {
    Ok(header_lines(headers, &header::IF_NONE_MATCH)?
        .filter_map(parse_if_none_match)
        .max())
}

/// Parses one `If-None-Match` line into the highest version among its entity tags.
pub fn parse_if_none_match(value: &str) -> Option<Version> {
    value
        .split(',')
        .filter_map(|tag| {
            let tag = tag.trim();
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            tag.strip_prefix('"')?
                .strip_suffix('"')?
                .parse::<Version>()
                .ok()
        })
        .max()
}

/// Parses a version named `name` (a query parameter or a header).
///
/// # Errors
/// `invalid_version` with the version's own sentence.
pub(crate) fn parse_version(raw: &str, name: &str) -> Result<Version, ApiError> {
    raw.parse::<Version>()
        .map_err(|err| ApiError::new(Code::InvalidVersion, format!("{name}: {}", err.message())))
}

/// The request id (`Hotsplit-Request`); repeated lines must agree.
///
/// # Errors
/// As [`one_identity`].
pub(crate) fn request_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    one_identity(None, headers, &REQUEST)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(percent_decode("p:1", false).unwrap(), "p:1");
        assert_eq!(percent_decode("a%25zzb", false).unwrap(), "a%zzb");
        assert_eq!(percent_decode("a%2fb", false).unwrap(), "a/b");
        assert_eq!(percent_decode("a+b", false).unwrap(), "a+b");
        assert_eq!(percent_decode("a+b", true).unwrap(), "a b");
        assert_eq!(percent_decode("%EF%BF%BD", true).unwrap(), "\u{fffd}");
        assert_eq!(
            percent_decode("a%zzb", false),
            Err(DecodeError::MalformedEscape(1))
        );
        assert_eq!(
            percent_decode("a%", false),
            Err(DecodeError::MalformedEscape(1))
        );
        assert_eq!(
            percent_decode("a%4", false),
            Err(DecodeError::MalformedEscape(1))
        );
        assert_eq!(percent_decode("%FF", true), Err(DecodeError::NotUtf8));
        assert_eq!(percent_decode("%FE", true), Err(DecodeError::NotUtf8));
        assert_eq!(percent_decode("a%FFb", false), Err(DecodeError::NotUtf8));
    }

    #[test]
    fn canonical_integers_only() {
        assert_eq!(parse_canonical_u64("0", "copy"), Ok(0));
        assert_eq!(parse_canonical_u64("17", "copy"), Ok(17));
        for bad in [
            "",
            "00",
            "01",
            "+1",
            "-1",
            " 1",
            "1 ",
            "1e3",
            "0x1",
            "18446744073709551616",
        ] {
            let why = parse_canonical_u64(bad, "copy").unwrap_err();
            assert!(why.starts_with("copy"), "{bad:?}: {why}");
        }
    }

    #[test]
    fn queries_decode_strictly_and_refuse_repeated_names() {
        let pairs = decode_query("client=a%2Cb&&min_version=3&flag").unwrap();
        assert_eq!(pairs["client"], "a,b");
        assert_eq!(pairs["min_version"], "3");
        assert_eq!(pairs["flag"], "");
        for bad in ["client=%FF", "client=a%zz", "client=a&client=a", "%FF=1"] {
            let err = decode_query(bad).err().unwrap();
            assert_eq!(err.code(), Code::InvalidParameter, "{bad}");
        }
    }

    /// A route's parameters, for [`StrictQuery`]'s two ways of reading a query.
    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Probe {
        a: Option<String>,
        b: Option<String>,
    }

    #[tokio::test]
    async fn a_short_query_read_in_place_answers_as_the_map_does() {
        let nine = "a=1&c1&c2&c3&c4&c5&c6&c7&c8";
        let nine_repeated = "a=1&c1&c2&c3&c4&c5&c6&c7&a=2";
        for query in [
            "",
            "a=1",
            "a=1&b=2",
            "b=&a",
            "&&a=1&&b=x+y&&",
            "a=1&a=2",
            "a=1&%61=2",
            "+a=1&%20a=2",
            "%61=%62",
            "%E2%82%AC=1&a=%E2%82%AC",
            "a%zz=1",
            "a=%zz",
            "a=%FF",
            "%FF=1",
            "a=1&b=%zz&a=2",
            "a=1&a=2&b=%zz",
            "c=1&d&c",
            nine,
            nine_repeated,
        ] {
            let (mut parts, ()) = axum::http::Request::builder()
                .uri(format!("/p?{query}"))
                .body(())
                .unwrap()
                .into_parts();
            let in_place = StrictQuery::<Probe>::from_request_parts(&mut parts, &())
                .await
                .map(|StrictQuery(probe)| probe);
            let by_map = decode_query(query).map(|pairs| from_pairs::<Probe>(pairs).unwrap());
            assert_eq!(format!("{in_place:?}"), format!("{by_map:?}"), "{query:?}");
        }
    }

    fn headers(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn floors_combine_by_maximum_over_query_lines_and_members() {
        let text = wire::header::MIN_VERSION;
        let name = &MIN_VERSION;
        let two_lines = headers(&[(text, "1"), (text, "7, 3")]);
        let floor = highest_floor(Some("5"), "min_version", &two_lines, name).unwrap();
        assert_eq!(floor.map(Version::get), Some(7));
        let floor = highest_floor(Some("9"), "min_version", &two_lines, name).unwrap();
        assert_eq!(floor.map(Version::get), Some(9));
        let none = highest_floor(None, "min_version", &HeaderMap::new(), name).unwrap();
        assert_eq!(none, None);
        let bad = headers(&[(text, "1"), (text, "01")]);
        let err = highest_floor(None, "min_version", &bad, name)
            .err()
            .unwrap();
        assert_eq!(err.code(), Code::InvalidVersion);

        let tags = headers(&[("if-none-match", "\"1\""), ("if-none-match", "W/\"7\", *")]);
        assert_eq!(if_none_match(&tags).unwrap().map(Version::get), Some(7));
    }

    #[test]
    fn identities_must_agree_as_whole_lines() {
        let text = wire::header::CLIENT;
        let name = &CLIENT;
        let same = headers(&[(text, "a,b"), (text, "a,b")]);
        assert_eq!(
            one_identity(None, &same, name).unwrap(),
            Some("a,b".to_owned())
        );
        let differ = headers(&[(text, "a,b"), (text, "a")]);
        let err = one_identity(None, &differ, name).err().unwrap();
        assert_eq!(err.code(), Code::InvalidParameter);
        // Even when the query names the client, the header's lines must agree.
        let err = one_identity(Some("q".to_owned()), &differ, name)
            .err()
            .unwrap();
        assert_eq!(err.code(), Code::InvalidParameter);
        let empty = headers(&[(text, "")]);
        let err = one_identity(None, &empty, name).err().unwrap();
        assert_eq!(err.code(), Code::InvalidParameter);
        let one = headers(&[(text, "a")]);
        assert_eq!(
            one_identity(Some("q".to_owned()), &one, name).unwrap(),
            Some("q".to_owned())
        );
    }

    #[test]
    fn if_none_match_takes_the_highest_version_tag() {
        assert_eq!(parse_if_none_match("\"5\"").map(Version::get), Some(5));
        assert_eq!(parse_if_none_match("W/\"5\"").map(Version::get), Some(5));
        assert_eq!(
            parse_if_none_match("\"5\", W/\"9\" , \"7\"").map(Version::get),
            Some(9)
        );
        assert_eq!(parse_if_none_match("*"), None);
        assert_eq!(parse_if_none_match("\"abc\""), None);
        assert_eq!(parse_if_none_match("\"05\""), None);
    }
}
