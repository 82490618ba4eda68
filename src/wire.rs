//! The API's names on the wire: every `Hotsplit-*` header and every query parameter, in one
//! place for the service ([`crate::http`]), its client ([`crate::client`]) and `hotsplit check`.
//!
//! Header names are lowercase, the form `http::HeaderName::from_static` accepts and HTTP/2
//! sends; HTTP/1 header names are case-insensitive, so `Hotsplit-Client` and `hotsplit-client`
//! are the same header. This module depends on nothing else in the crate.
//!
//! The OpenAPI annotations on the handlers spell the same names as literals (an attribute macro
//! cannot read a constant); the checked-in `docs/openapi.json` drift test keeps them honest.

/// Header names.
pub mod header {
    /// Request: the client id, an alternative to `?client=`.
    pub const CLIENT: &str = "hotsplit-client";
    /// Request: the reader's version floor, an alternative to `?min_version=`.
    pub const MIN_VERSION: &str = "hotsplit-min-version";
    /// Request: the read class, an alternative to `?class=`.
    pub const READ_CLASS: &str = "hotsplit-read-class";
    /// Request: a request id; after a write carrying it, reads carrying it go to primaries.
    /// Unrelated to [`REQUEST_ID`]: tracing never reads or sets it.
    pub const REQUEST: &str = "hotsplit-request";
    /// Request and response: the trace id of one request, for logs only. An incoming one is
    /// honoured when it is 1 to 128 visible ASCII characters; the response always carries it.
    pub const REQUEST_ID: &str = "x-request-id";
    /// Request: W3C Trace Context; its trace id is the request id when no valid
    /// [`REQUEST_ID`] came.
    pub const TRACEPARENT: &str = "traceparent";
    /// Response: the version written or served.
    pub const VERSION: &str = "hotsplit-version";
    /// Response: the copy index that served a read.
    pub const COPY: &str = "hotsplit-copy";
    /// Response: `host:port;role=primary|replica`, or `embedded`.
    pub const SERVED_BY: &str = "hotsplit-served-by";
    /// Response: `class=NAME;reason=REASON`.
    pub const ROUTE: &str = "hotsplit-route";
    /// Request and response: the client's session token, its floors (`fleet::session`).
    /// Clients store the last one they received and send it back unchanged.
    pub const SESSION: &str = "hotsplit-session";
    /// Response: the `Vary` value of a read, the request headers the answer depends on (the
    /// client id, the floor, the read class and the session token) in their display spelling.
    pub const READ_VARY: &str =
        "Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session";
}

/// Cookie names.
pub mod cookie {
    /// The session token as a cookie (with `session.cookie`), for browser clients.
    pub const SESSION: &str = "hotsplit_session";
}

/// Query parameter names.
pub mod query {
    /// Reads and writes: the client id (or [`super::header::CLIENT`]).
    pub const CLIENT: &str = "client";
    /// Writes: the edit's version.
    pub const VERSION: &str = "version";
    /// Reads: a version floor (or [`super::header::MIN_VERSION`]).
    pub const MIN_VERSION: &str = "min_version";
    /// Reads: one named copy instead of the affine one.
    pub const COPY: &str = "copy";
    /// Reads: the read class (or [`super::header::READ_CLASS`]).
    pub const CLASS: &str = "class";
    /// `PUT`: how many replicas of each written copy's node must acknowledge.
    pub const SYNC_REPLICAS: &str = "sync_replicas";
    /// `PUT`: how long to wait for [`SYNC_REPLICAS`], in milliseconds.
    pub const SYNC_TIMEOUT_MS: &str = "sync_timeout_ms";
    /// `/v1/affinity`: the key.
    pub const KEY: &str = "key";
    /// `/v1/retry-queue`: how many entries to list.
    pub const LIMIT: &str = "limit";
}

#[cfg(test)]
mod tests {
    use super::header;

    #[test]
    fn the_read_vary_names_the_client_floor_class_and_session_headers() {
        let named: Vec<String> = header::READ_VARY
            .split(", ")
            .map(str::to_ascii_lowercase)
            .collect();
        assert_eq!(
            named,
            [
                header::CLIENT,
                header::MIN_VERSION,
                header::READ_CLASS,
                header::SESSION
            ]
        );
    }
}
