//! Session tokens at the HTTP edge (`crate::fleet::session`): [`SessionToken`] reads the
//! request's `Hotsplit-Session` (or, with `session.cookie`, the `hotsplit_session` cookie when
//! no header came) and never rejects a request; [`attach`] puts the answer's token on the
//! response, with `Cache-Control: private` and `Vary: Hotsplit-Session`, and the cookie when
//! configured.

use std::convert::Infallible;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;

use super::AppState;
use crate::fleet::session::{Session, SessionFloor};
use crate::fleet::Sessions;
use crate::store::now_unix_ms;
use crate::wire;

/// `Hotsplit-Session`.
const SESSION: HeaderName = HeaderName::from_static(wire::header::SESSION);

/// The incoming session of a request to a key route.
pub struct SessionToken {
    /// The floors the request's token carried (empty when none came or it was ignored).
    pub session: Session,
    /// Whether a token came at all: the answer then carries one back even when it is empty,
    /// so a client drops an ignored or expired token.
    pub sent: bool,
    /// The `Hotsplit-Session` line as sent, while `session` holds exactly its floors (a valid
    /// token, none expired, nothing recorded since that changed it): the answer carries it back
    /// as it came (a token has one spelling) instead of encoding the same token again.
    as_sent: Option<HeaderValue>,
}

impl SessionToken {
    /// Records `floor` in the session (see [`Sessions::record`]).
    pub fn record(&mut self, sessions: &Sessions, floor: SessionFloor, now_ms: u64) {
        if sessions.record(&mut self.session, floor, now_ms) {
            self.as_sent = None;
        }
    }
}

impl axum::extract::FromRequestParts<AppState> for SessionToken {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Infallible> {
        let sessions = &state.inner().sessions;
        let mut values = parts.headers.get_all(&SESSION).iter();
        // One line is the usual case; more are garbled, and the decoder says so.
        let (first, second) = (values.next(), values.next());
        if first.is_none() && !sessions.cookie() {
            return Ok(SessionToken {
                session: Session::default(),
                sent: false,
                as_sent: None,
            });
        }
        let mut lines: Vec<&[u8]> = first
            .into_iter()
            .chain(second)
            .chain(values)
            .map(HeaderValue::as_bytes)
            .collect();
        if lines.is_empty() && sessions.cookie() {
            lines.extend(cookie_token(&parts.headers));
        }
        let (session, exact) = sessions.incoming_exact(&lines, now_unix_ms());
        Ok(SessionToken {
            sent: !lines.is_empty(),
            session,
            as_sent: first.filter(|_| exact && second.is_none()).cloned(),
        })
    }
}

/// The value of the first `hotsplit_session` cookie in the request's `Cookie` lines.
fn cookie_token(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|line| line.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            pair.trim_ascii()
                .strip_prefix(wire::cookie::SESSION.as_bytes())
                .and_then(|rest| rest.strip_prefix(b"="))
        })
}

/// Puts the session's token on `response` when it holds a floor or a token came (`sent`), with
/// `Cache-Control: private` and `Vary: Hotsplit-Session` (and `Cookie`, and a `Set-Cookie`,
/// when the token travels as a cookie).
pub fn attach(response: &mut Response, sessions: &Sessions, token: &SessionToken) {
    let SessionToken {
        session,
        sent,
        as_sent,
    } = token;
    if session.is_empty() && !sent {
        return;
    }
    let value = match as_sent {
        Some(value) => value.clone(),
        // The alphabet of a token is base64url: always a valid header value.
        None => match HeaderValue::from_maybe_shared(sessions.encode_bytes(session)) {
            Ok(value) => value,
            Err(_) => return,
        },
    };
    let cookie = sessions.cookie().then(|| {
        format!(
            "{}={}; Path=/v1/keys; HttpOnly; Secure; SameSite=Strict",
            wire::cookie::SESSION,
            value.to_str().unwrap_or_default()
        )
    });
    let headers = response.headers_mut();
    headers.insert(SESSION, value);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
    let varies = headers.get_all(header::VARY).iter().any(|line| {
        line.to_str()
            .is_ok_and(|text| text.contains("Hotsplit-Session"))
    });
    if !varies {
        headers.append(header::VARY, HeaderValue::from_static("Hotsplit-Session"));
    }
    if let Some(cookie) = cookie {
        headers.append(header::VARY, HeaderValue::from_static("Cookie"));
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            headers.append(header::SET_COOKIE, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; b=2"));
        assert_eq!(cookie_token(&headers), None);
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("x=y;hotsplit_session=AQx; hotsplit_session=other"),
        );
        assert_eq!(cookie_token(&headers), Some(&b"AQx"[..]));
        let mut prefixed = HeaderMap::new();
        prefixed.append(
            header::COOKIE,
            HeaderValue::from_static("hotsplit_session_old=AQ"),
        );
        assert_eq!(cookie_token(&prefixed), None);
    }
}
