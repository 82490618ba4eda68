//! Session tokens at the HTTP edge (`crate::fleet::session`, carried through the operations as
//! [`ClientSession`]): [`SessionToken`] reads the request's `Hotsplit-Session` lines (several
//! lines or comma-separated tokens are merged, a floor only ever rising; or, with
//! `session.cookie`, the `hotsplit_session` cookie when no header came) and never rejects a
//! request; [`WithSession`] puts the answer's token on the response, errors included, with
//! `Cache-Control: private` and `Vary: Hotsplit-Session`, and the cookie when configured.

use std::convert::Infallible;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::ops::{ClientSession, Ops};
use crate::store::now_unix_ms;
use crate::wire;

/// `Hotsplit-Session`.
const SESSION: HeaderName = HeaderName::from_static(wire::header::SESSION);

/// The incoming session of a request to a key route.
pub struct SessionToken {
    /// The floors the request's token carried (empty when none came or it was ignored), as the
    /// operations leave them.
    pub session: ClientSession,
    /// The `Hotsplit-Session` line as sent, when it was the only one: while `session` is
    /// exactly its floors ([`ClientSession::is_exact`]) the answer carries it back as it came
    /// (a token has one spelling) instead of encoding the same token again.
    as_sent: Option<HeaderValue>,
}

impl axum::extract::FromRequestParts<AppState> for SessionToken {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Infallible> {
        Ok(SessionToken::of(&parts.headers, state))
    }
}

impl SessionToken {
    /// The session the request headers `headers` carry (counted by outcome, once per call).
    pub(crate) fn of(headers: &HeaderMap, state: &AppState) -> SessionToken {
        let ops = state.ops();
        let mut values = headers.get_all(&SESSION).iter();
        // One line is the usual case; several lines (or comma-separated tokens) are merged.
        let (first, second) = (values.next(), values.next());
        if first.is_none() && !ops.sessions().cookie() {
            return SessionToken {
                session: ClientSession::none(),
                as_sent: None,
            };
        }
        let mut lines: Vec<&[u8]> = first
            .into_iter()
            .chain(second)
            .chain(values)
            .map(HeaderValue::as_bytes)
            .collect();
        if lines.is_empty() && ops.sessions().cookie() {
            lines.extend(cookie_token(headers));
        }
        let session = ops.session(&lines, now_unix_ms());
        SessionToken {
            as_sent: first
                .filter(|_| session.is_exact() && second.is_none())
                .cloned(),
            session,
        }
    }

    /// `answer` with this session's token ([`attach`]): the key routes' answers, errors
    /// included, carry the token the operations left.
    pub fn answer<T>(self, answer: T, state: &AppState) -> WithSession<T> {
        WithSession {
            answer,
            token: SessionReply::of(self, state.ops()),
        }
    }
}

/// An answer of a key route with the session token to send back: attached to an error answer
/// as to a success.
pub struct WithSession<T> {
    /// The answer.
    answer: T,
    /// The token and how it travels.
    token: SessionReply,
}

impl<T: IntoResponse> IntoResponse for WithSession<T> {
    fn into_response(self) -> Response {
        let mut response = self.answer.into_response();
        attach(&mut response, self.token);
        response
    }
}

/// The session token an answer carries: its value, and whether it also travels as a cookie.
struct SessionReply {
    /// The `Hotsplit-Session` value; `None` when the answer carries no token.
    value: Option<HeaderValue>,
    /// Whether the token also travels as a cookie (`session.cookie`).
    cookie: bool,
}

impl SessionReply {
    /// The token `token`'s session sends back: the line as it came while the session is exactly
    /// it, else the session encoded; none when the session holds no floor and no token came.
    fn of(token: SessionToken, ops: &Ops) -> SessionReply {
        let SessionToken { session, as_sent } = token;
        let cookie = ops.sessions().cookie();
        if !session.carries_token() {
            return SessionReply {
                value: None,
                cookie,
            };
        }
        let value = match as_sent.filter(|_| session.is_exact()) {
            Some(value) => Some(value),
            // The alphabet of a token is base64url: always a valid header value.
            None => HeaderValue::from_maybe_shared(ops.session_token(&session)).ok(),
        };
        SessionReply { value, cookie }
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

/// Puts the session's token on `response`, with `Cache-Control: private` and
/// `Vary: Hotsplit-Session` (and `Cookie`, and a `Set-Cookie`, when the token travels as a
/// cookie).
fn attach(response: &mut Response, token: SessionReply) {
    let SessionReply {
        value: Some(value),
        cookie,
    } = token
    else {
        return;
    };
    let cookie = cookie.then(|| {
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
