//! The request id: one trace id per request, taken from the request when it is safe to log and
//! echo, generated otherwise.
//!
//! An incoming `X-Request-Id` is used when it is 1 to [`MAX_LEN`] visible ASCII characters
//! (`!` to `~`: no space, no control character, nothing a log line or a header could be split
//! on); else the trace id of a well-formed W3C `traceparent`; else 32 random hex digits (the
//! shape of a W3C trace id). It has nothing to do with `Hotsplit-Request`, which pins reads to
//! primaries and which this module never reads or writes.

use axum::http::{HeaderMap, HeaderValue};

use crate::wire;

/// The longest incoming request id honoured.
pub(crate) const MAX_LEN: usize = 128;

/// The request id for a request with `headers`.
pub(crate) fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(value) = headers.get(wire::header::REQUEST_ID) {
        if acceptable(value.as_bytes()) {
            return value.clone();
        }
    }
    if let Some(trace_id) = headers
        .get(wire::header::TRACEPARENT)
        .and_then(|value| trace_id(value.as_bytes()))
    {
        if let Ok(value) = HeaderValue::from_bytes(trace_id) {
            return value;
        }
    }
    generate()
}

/// Whether `id` is 1 to [`MAX_LEN`] visible ASCII characters.
fn acceptable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(|byte| byte.is_ascii_graphic())
}

/// The trace id of a `traceparent` (`VERSION-TRACEID-PARENTID-FLAGS`, lowercase hex of 2, 32,
/// 16 and 2 digits; version `ff` and an all-zero trace id are invalid), if it is well formed.
fn trace_id(traceparent: &[u8]) -> Option<&[u8]> {
    let mut parts = traceparent.split(|byte| *byte == b'-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let parent_id = parts.next()?;
    let flags = parts.next()?;
    let hex = |part: &[u8], len: usize| {
        part.len() == len
            && part
                .iter()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(byte))
    };
    // Version 00 has exactly four parts; a later version may append more.
    let well_formed = hex(version, 2)
        && version != b"ff"
        && (version != b"00" || parts.next().is_none())
        && hex(trace_id, 32)
        && hex(parent_id, 16)
        && hex(flags, 2)
        && trace_id.iter().any(|byte| *byte != b'0');
    well_formed.then_some(trace_id)
}

/// 32 random lowercase hex digits.
fn generate() -> HeaderValue {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    let mut text = [0u8; 32];
    for (at, digit) in text.iter_mut().enumerate() {
        let nibble = (bits >> (4 * (31 - at))) & 0xf;
        *digit = DIGITS[nibble as usize];
    }
    // 32 hex digits are a valid header value; the fallback is never taken.
    HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    fn generated(id: &HeaderValue) -> bool {
        id.len() == 32
            && id
                .as_bytes()
                .iter()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(byte))
    }

    #[test]
    fn a_valid_incoming_id_is_kept() {
        let id = "a".repeat(MAX_LEN);
        assert_eq!(
            request_id(&with(&[("x-request-id", id.as_bytes())])),
            id.as_str()
        );
        assert_eq!(
            request_id(&with(&[("x-request-id", b"req-1/~!")])),
            "req-1/~!"
        );
    }

    #[test]
    fn an_unfit_incoming_id_is_replaced() {
        let long = "a".repeat(MAX_LEN + 1);
        for bad in [
            long.as_bytes(),
            b"has space",
            b"tab\there",
            b"caf\xc3\xa9",
            b"",
        ] {
            let id = request_id(&with(&[("x-request-id", bad)]));
            assert!(generated(&id), "{bad:?} gave {id:?}");
        }
        assert!(generated(&request_id(&HeaderMap::new())));
        assert_ne!(request_id(&HeaderMap::new()), request_id(&HeaderMap::new()));
    }

    #[test]
    fn a_traceparent_gives_its_trace_id_unless_an_id_came() {
        let traceparent: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            request_id(&with(&[("traceparent", traceparent)])),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            request_id(&with(&[
                ("traceparent", traceparent),
                ("x-request-id", b"mine")
            ])),
            "mine"
        );
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6-00f067aa0ba902b7-01",
        ] {
            assert!(generated(&request_id(&with(&[("traceparent", bad)]))));
        }
    }
}
