//! Where Redis is and how long to wait for it: [`RedisTarget`] (a `redis://` or
//! `redis-cluster://` URL), [`RedisOptions`], and the `host:port` parsing and formatting the rest
//! of the store uses.
//!
//! This file uses no fred, so `config` can depend on it without the client.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// The port used when a URL names none.
const DEFAULT_PORT: u16 = 6379;

/// Where Redis is: one server, or the seed nodes of a Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, as `host:port`.
    Standalone(String),
    /// Seed nodes of a Redis Cluster, each `host:port`; the other nodes are discovered.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses a URL that carries neither TLS nor credentials (see [`RedisUrl::parse`] for the
    /// forms): `redis://host[:port]` or `redis-cluster://host[:port][,host[:port]...]`, or their
    /// `valkey://` synonyms.
    ///
    /// # Errors
    /// As for [`RedisUrl::parse`], and [`ErrorKind::Config`] when the URL asks for TLS or
    /// carries credentials, which a bare target cannot hold.
    pub fn parse(url: &str) -> Result<RedisTarget> {
        let parsed = RedisUrl::parse(url)?;
        if parsed.tls || parsed.username.is_some() || parsed.password.is_some() {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "redis url {:?} asks for tls or carries credentials; this place takes a plain redis:// url",
                    redact_url(url)
                ),
            ));
        }
        Ok(parsed.target)
    }

    /// `redis` or `redis-cluster`.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTarget::Standalone(_) => "redis",
            RedisTarget::Cluster(_) => "redis-cluster",
        }
    }
}

/// A parsed Redis URL: where Redis is, whether to speak TLS, and the credentials it carries.
///
/// The password is a [`Password`], which never prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// The server or the cluster seed nodes.
    pub target: RedisTarget,
    /// `rediss://`, `rediss-cluster://`, `valkeys://` or `valkeys-cluster://`: connect with TLS.
    pub tls: bool,
    /// The ACL user of `user:password@`; `None` for the `default` user.
    pub username: Option<String>,
    /// The password of `user:password@` or `:password@`.
    pub password: Option<Password>,
}

impl RedisUrl {
    /// Parses `SCHEME://[[user]:password@]host[:port][,host[:port]...]`.
    ///
    /// The schemes: `redis://` (one server), `redis-cluster://` (cluster seed nodes),
    /// `rediss://` and `rediss-cluster://` (the same over TLS), and the synonyms `valkey://`,
    /// `valkey-cluster://`, `valkeys://` and `valkeys-cluster://`. The port defaults to 6379;
    /// IPv6 hosts go in brackets (`[::1]:6379`). The user and password are percent-decoded
    /// (`%40` for `@`).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the scheme is unknown, when the URL carries a path, a
    /// database or a query, when a one-server scheme names more than one server, when a host
    /// or port is empty or malformed, or when the credentials are malformed. The message names
    /// what is wrong and shows the URL with its password replaced by `***`.
    pub fn parse(url: &str) -> Result<RedisUrl> {
        let url = url.trim();
        let shown = redact_url(url);
        let invalid = |why: String| Error::new(ErrorKind::Config, why);
        if url.is_empty() {
            return Err(invalid("redis url is empty".to_owned()));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid(format!(
                "redis url {shown:?} must start with redis:// (one server), redis-cluster:// (cluster seed nodes), or rediss:// / rediss-cluster:// for tls"
            )));
        };
        let (cluster, tls) = match scheme {
            "redis" | "valkey" => (false, false),
            "rediss" | "valkeys" => (false, true),
            "redis-cluster" | "valkey-cluster" => (true, false),
            "rediss-cluster" | "valkeys-cluster" => (true, true),
            _ => {
                return Err(invalid(format!(
                    "redis url {shown:?} must start with redis:// (one server), redis-cluster:// (cluster seed nodes), or rediss:// / rediss-cluster:// for tls"
                )))
            }
        };
        // The last '@' ends the credentials, so a password may hold '/', '?' or '#'.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => parse_userinfo(userinfo)
                .map_err(|why| invalid(format!("redis url {shown:?}: {why}")))?,
        };
        let (authority, trailing) = match rest.find(['/', '?', '#']) {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if !trailing.is_empty() && trailing != "/" {
            return Err(invalid(format!(
                "redis url {shown:?} has {:?} after host:port; paths, databases and queries are not supported",
                redact_url(trailing)
            )));
        }
        let addresses = authority
            .split(',')
            .map(|address| {
                parse_address(address)
                    .map(|(host, port)| format_address(&host, port))
                    .map_err(|why| invalid(format!("redis url {shown:?}: {why}")))
            })
            .collect::<Result<Vec<String>>>()?;
        let target = if cluster {
            RedisTarget::Cluster(addresses)
        } else {
            match <[String; 1]>::try_from(addresses) {
                Ok([address]) => RedisTarget::Standalone(address),
                Err(addresses) => {
                    return Err(invalid(format!(
                        "redis url {shown:?} names {} servers; {scheme}:// takes one host:port, use {scheme}-cluster:// for cluster seed nodes",
                        addresses.len()
                    )))
                }
            }
        };
        Ok(RedisUrl {
            target,
            tls,
            username,
            password,
        })
    }
}

/// Splits and percent-decodes `user:password`, `:password` or `user`.
fn parse_userinfo(
    userinfo: &str,
) -> std::result::Result<(Option<String>, Option<Password>), String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let user = percent_decode(user).map_err(|why| format!("the user name {why}"))?;
    let password = password
        .map(|password| percent_decode(password).map_err(|why| format!("the password {why}")))
        .transpose()?;
    if user.is_empty() && password.as_deref().is_none_or(str::is_empty) {
        return Err("the credentials before '@' are empty".to_owned());
    }
    if password.as_deref() == Some("") {
        return Err("the password after ':' is empty".to_owned());
    }
    Ok((
        (!user.is_empty()).then_some(user),
        password.map(Password::new),
    ))
}

/// Decodes `%XX` escapes; the text must decode to UTF-8. Errors never repeat the text.
fn percent_decode(text: &str) -> std::result::Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| "has a '%' not followed by two hex digits".to_owned())?;
            decoded.push(hex);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| "does not decode to utf-8".to_owned())
}

/// `url` as it may be printed (errors, logs): the password of the user information of any
/// scheme (`user:password@` becomes `user:***@`, `:password@` becomes `:***@`), the value of
/// every query parameter (`?password=…` becomes `?password=***`) and any fragment (`#***`).
/// This is the one place a Redis URL is redacted; text that is not a URL passes through.
///
/// It errs on the side of hiding: everything before the last `@` of the part after the scheme
/// is user information, so a password containing `/`, `?`, `#` or `@` is hidden too.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let (user, rest) = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@"),
                None => format!("{userinfo}@"),
            };
            (user, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((before, _)) => (before, "#***"),
        None => (rest, ""),
    };
    let (location, query) = match before_fragment.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (before_fragment, None),
    };
    let mut shown = format!("{scheme}{user}{location}");
    if let Some(query) = query {
        shown.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None => pair.to_owned(),
            })
            .collect();
        shown.push_str(&pairs.join("&"));
    }
    shown.push_str(fragment);
    shown
}

/// A Redis password. It never prints: `Debug` shows `Password(***)` and there is no
/// `Display`; [`Password::expose`] is the one way to the text, for the client's `AUTH`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Password {
        Password(text.into())
    }

    /// The password itself, for the client that sends `AUTH`; never for a message.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// The files of a TLS connection, PEM-encoded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsOptions {
    /// The certificate authorities that sign the servers' certificates. Default: none, which
    /// trusts the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The client certificate (chain) for mutual TLS. Default: none, no client certificate.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key; set with `cert_file`, never alone. Default: none.
    pub key_file: Option<PathBuf>,
}

/// How every connection to Redis proves who it talks to and who it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RedisSecurity {
    /// TLS for every connection; `None` for plain TCP. The server's name (or IP address) is
    /// always verified against its certificate. Default: none.
    pub tls: Option<TlsOptions>,
    /// The ACL user every connection authenticates as; `None` for `default`. Default: none.
    pub username: Option<String>,
    /// The password every connection authenticates with; `None` sends no `AUTH`.
    /// Default: none.
    pub password: Option<Password>,
}

impl RedisSecurity {
    /// The scheme prefix of URLs shown in messages: `rediss` with TLS, `redis` without.
    pub(crate) fn scheme(&self, target: &RedisTarget) -> &'static str {
        match (target, self.tls.is_some()) {
            (RedisTarget::Standalone(_), false) => "redis",
            (RedisTarget::Standalone(_), true) => "rediss",
            (RedisTarget::Cluster(_), false) => "redis-cluster",
            (RedisTarget::Cluster(_), true) => "rediss-cluster",
        }
    }
}

impl fmt::Display for RedisTarget {
    /// The target as a URL, `redis://host:port` or `redis-cluster://host:port,...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Standalone(address) => write!(f, "redis://{address}"),
            RedisTarget::Cluster(addresses) => write!(f, "redis-cluster://{}", addresses.join(",")),
        }
    }
}

/// Splits `host[:port]` or `[ipv6][:port]` into a host (without brackets) and a port.
pub(super) fn parse_address(address: &str) -> std::result::Result<(String, u16), String> {
    if address.is_empty() {
        return Err("a host:port is empty".to_owned());
    }
    let (host, port) = if let Some(bracketed) = address.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(format!("{address:?} opens '[' without a closing ']'"));
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!(
                "{address:?} does not hold an ipv6 address in brackets"
            ));
        }
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => {
                    return Err(format!(
                        "{address:?} has {after:?} after ']'; expected ':port'"
                    ))
                }
            },
        }
    } else {
        let (host, port) = match address.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        };
        if host.is_empty() {
            return Err(format!("the host is empty in {address:?}"));
        }
        if let Some(bad) = host
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(format!(
                "host {host:?} contains {bad:?}; hosts are names or ipv4 addresses (ipv6 goes in brackets)"
            ));
        }
        (host, port)
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => {
                return Err(format!(
                    "port {text:?} in {address:?} is not a number in 1..=65535"
                ))
            }
        },
    };
    Ok((host.to_owned(), port))
}

/// Renders a host and port as `host:port`, bracketing IPv6 hosts.
pub(super) fn format_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// The server or cluster to connect to. Default: none, it is required.
    pub target: RedisTarget,
    /// How long one command may take before it fails with [`ErrorKind::Timeout`]; it bounds
    /// every call on a slow or paused node. Default: 500 ms.
    pub command_timeout: Duration,
    /// How long connecting (TCP, cluster discovery) may take at startup. Default: 2 s.
    pub connect_timeout: Duration,
    /// Replicas of a standalone primary, each `host:port`, read through a client of their
    /// own (fred's centralized `replicas()` reads the primary). Must be empty for a cluster,
    /// whose replicas are discovered. Default: none.
    pub replicas: Vec<String>,
    /// How long a copy's hash outlives its expiry (`exp`), so the compare-and-set refuses older
    /// versions after the value stopped being served. Default: 1 h.
    pub version_retention: Duration,
    /// TLS and credentials, the same for every connection the store or an audit opens.
    /// Default: plain TCP as the `default` user without a password.
    pub security: RedisSecurity,
    /// Send primary copy reads on a pipelined connection of the store's own per primary
    /// (`store::redis::direct`) rather than through fred's per-command path. Default: on.
    pub direct_reads: bool,
}

impl RedisOptions {
    /// The default [`RedisOptions::command_timeout`].
    pub(crate) const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

    /// The default [`RedisOptions::connect_timeout`].
    pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    /// Options for `target` with every other field at its default.
    pub fn new(target: RedisTarget) -> RedisOptions {
        RedisOptions {
            target,
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            replicas: Vec::new(),
            version_retention: Duration::from_millis(crate::store::DEFAULT_VERSION_RETENTION_MS),
            security: RedisSecurity::default(),
            direct_reads: true,
        }
    }

    /// The target as a URL for messages, with `rediss` schemes under TLS and never a password.
    pub fn url(&self) -> String {
        match &self.target {
            RedisTarget::Standalone(address) => {
                format!("{}://{address}", self.security.scheme(&self.target))
            }
            RedisTarget::Cluster(addresses) => format!(
                "{}://{}",
                self.security.scheme(&self.target),
                addresses.join(",")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standalone(address: &str) -> RedisTarget {
        RedisTarget::Standalone(address.to_owned())
    }

    #[test]
    fn parses_standalone_urls() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:7000").unwrap(),
            standalone("127.0.0.1:7000")
        );
        assert_eq!(
            RedisTarget::parse("redis://cache.internal").unwrap(),
            standalone("cache.internal:6379")
        );
        assert_eq!(
            RedisTarget::parse("redis://localhost:6380/").unwrap(),
            standalone("localhost:6380")
        );
        assert_eq!(
            RedisTarget::parse(" redis://h:1 ").unwrap(),
            standalone("h:1")
        );
        assert_eq!(
            RedisTarget::parse("redis://[::1]").unwrap(),
            standalone("[::1]:6379")
        );
        assert_eq!(
            RedisTarget::parse("redis://[::1]:7001").unwrap(),
            standalone("[::1]:7001")
        );
    }

    #[test]
    fn parses_cluster_urls() {
        assert_eq!(
            RedisTarget::parse("redis-cluster://10.0.0.1:7000,10.0.0.2,node-3:7002").unwrap(),
            RedisTarget::Cluster(vec![
                "10.0.0.1:7000".to_owned(),
                "10.0.0.2:6379".to_owned(),
                "node-3:7002".to_owned(),
            ])
        );
        assert_eq!(
            RedisTarget::parse("redis-cluster://seed").unwrap(),
            RedisTarget::Cluster(vec!["seed:6379".to_owned()])
        );
    }

    #[test]
    fn rejects_bad_urls_with_a_message_naming_the_problem() {
        let cases = [
            ("", "empty"),
            ("http://x:1", "must start with redis://"),
            ("127.0.0.1:6379", "must start with redis://"),
            ("rediss://x:1", "tls"),
            ("redis://user:secret@x:1", "credentials"),
            ("redis://x:1/0", "databases"),
            ("redis://x:1?timeout=1", "queries"),
            ("redis://", "empty"),
            ("redis://:6379", "host is empty"),
            ("redis://x:", "port \"\""),
            ("redis://x:0", "1..=65535"),
            ("redis://x:65536", "1..=65535"),
            ("redis://x:+1", "1..=65535"),
            ("redis://x:1:2", "1..=65535"),
            ("redis://a b:1", "contains ' '"),
            ("redis://::1", "host is empty"),
            ("redis://[::1", "closing ']'"),
            ("redis://[::1]x", "expected ':port'"),
            ("redis://[zz]:1", "ipv6"),
            ("redis://a:1,b:2", "use redis-cluster://"),
            ("redis-cluster://a:1,", "empty"),
            ("redis-cluster://a:1,b:x", "port \"x\""),
        ];
        for (url, expected) in cases {
            let err = RedisTarget::parse(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url:?}");
            assert!(
                err.message().contains(expected),
                "{url:?}: {}",
                err.message()
            );
            let first = err.message().chars().next().unwrap();
            assert!(!first.is_uppercase(), "{url:?}: {}", err.message());
        }
        // The password never shows up in the message.
        let err = RedisTarget::parse("redis://user:hunter2@x:1").unwrap_err();
        assert!(!err.message().contains("hunter2"), "{}", err.message());
    }

    #[test]
    fn targets_render_as_urls() {
        let urls = ["redis://127.0.0.1:7000", "redis-cluster://a:1,b:2"];
        for url in urls {
            assert_eq!(RedisTarget::parse(url).unwrap().to_string(), url);
        }
        assert_eq!(standalone("x:1").kind(), "redis");
        assert_eq!(RedisTarget::Cluster(vec![]).kind(), "redis-cluster");
    }

    #[test]
    fn tls_schemes_credentials_and_valkey_synonyms_parse() {
        let url = RedisUrl::parse("rediss://app:s%40cret@cache:6380").unwrap();
        assert_eq!(url.target, standalone("cache:6380"));
        assert!(url.tls);
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password, Some(Password::new("s@cret")));

        let url = RedisUrl::parse("rediss-cluster://:pw/with?odd#chars@a:1,b:2").unwrap();
        assert_eq!(
            url.target,
            RedisTarget::Cluster(vec!["a:1".to_owned(), "b:2".to_owned()])
        );
        assert!(url.tls);
        assert_eq!(url.username, None);
        assert_eq!(url.password, Some(Password::new("pw/with?odd#chars")));

        let url = RedisUrl::parse("redis://reader@h").unwrap();
        assert_eq!((url.tls, url.username.as_deref()), (false, Some("reader")));
        assert_eq!(url.password, None);

        for (synonym, tls, cluster) in [
            ("valkey://h:1", false, false),
            ("valkeys://h:1", true, false),
            ("valkey-cluster://h:1", false, true),
            ("valkeys-cluster://h:1", true, true),
        ] {
            let url = RedisUrl::parse(synonym).unwrap();
            assert_eq!(url.tls, tls, "{synonym}");
            assert_eq!(
                matches!(url.target, RedisTarget::Cluster(_)),
                cluster,
                "{synonym}"
            );
        }
        assert_eq!(
            RedisTarget::parse("valkey://h:1").unwrap(),
            standalone("h:1")
        );
    }

    #[test]
    fn bad_credentials_are_refused_without_echoing_the_password() {
        let cases = [
            ("redis://@h:1", "empty"),
            ("redis://:@h:1", "empty"),
            ("redis://u:@h:1", "password after ':' is empty"),
            ("redis://u:pass%zzword@h:1", "two hex digits"),
            ("rediss://u:hunter2@a:1,b:2", "use rediss-cluster://"),
            ("rediss://u:hunter2@h:1/0", "databases"),
        ];
        for (url, expected) in cases {
            let err = RedisUrl::parse(url).unwrap_err();
            assert!(
                err.message().contains(expected),
                "{url:?}: {}",
                err.message()
            );
            assert!(!err.message().contains("hunter2"), "{}", err.message());
            assert!(!err.message().contains("zzword"), "{}", err.message());
        }
        let parsed = RedisUrl::parse("redis://u:hunter2@h:1").unwrap();
        assert!(!format!("{parsed:?}").contains("hunter2"));
        assert_eq!(redact_url("rediss://u:hunter2@h:1"), "rediss://u:***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://u@h:1"), "redis://u@h:1");
    }

    #[test]
    fn every_url_form_is_redacted() {
        let cases = [
            ("redis://user:hunter2@x:1", "redis://user:***@x:1"),
            ("redis://:hunter2@x:1", "redis://:***@x:1"),
            (
                "rediss://user:hunter2@host:6380",
                "rediss://user:***@host:6380",
            ),
            (
                "redis-cluster://u:hunter2@a:1,b:2",
                "redis-cluster://u:***@a:1,b:2",
            ),
            ("http://user:hunter2@host/path", "http://user:***@host/path"),
            ("redis://x:1?password=hunter2", "redis://x:1?password=***"),
            (
                "rediss://x:1/0?user=u&password=hunter2&tls",
                "rediss://x:1/0?user=***&password=***&tls",
            ),
            ("redis://u:hun/ter@2@x:1", "redis://u:***@x:1"),
            ("redis://x:1#hunter2", "redis://x:1#***"),
            ("user:hunter2@x:1", "user:***@x:1"),
            ("redis://u@h:1", "redis://u@h:1"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis-cluster://a:1,b:2", "redis-cluster://a:1,b:2"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn parse_errors_never_show_a_secret() {
        let secrets = [
            "rediss://user:hunter2@host:6380/x",
            "redis://x:1?password=hunter2",
            "http://user:hunter2@host",
            "redis-cluster://a:1,b:x?password=hunter2",
            "redis://u:hunter2@a:1,b:2",
            "user:hunter2@x:1",
        ];
        for url in secrets {
            for err in [
                RedisTarget::parse(url).map(|_| ()).unwrap_err(),
                RedisUrl::parse(url).map(|_| ()).unwrap_err(),
            ] {
                assert!(
                    !err.message().contains("hunter2"),
                    "{url}: {}",
                    err.message()
                );
            }
        }
    }

    #[test]
    fn option_urls_name_tls_and_never_the_password() {
        let mut options = RedisOptions::new(RedisTarget::Cluster(vec!["a:1".to_owned()]));
        assert_eq!(options.url(), "redis-cluster://a:1");
        options.security.tls = Some(TlsOptions::default());
        options.security.password = Some(Password::new("hunter2"));
        assert_eq!(options.url(), "rediss-cluster://a:1");
        assert!(!format!("{options:?}").contains("hunter2"));
    }

    #[test]
    fn options_have_documented_defaults() {
        let options = RedisOptions::new(standalone("x:1"));
        assert_eq!(options.command_timeout, Duration::from_millis(500));
        assert_eq!(options.connect_timeout, Duration::from_secs(2));
    }
}
