//! Where Redis is and how long to wait for it: [`RedisTarget`] (a `redis://` or
//! `redis-cluster://` URL), [`RedisOptions`], and the `host:port` parsing and formatting the rest
//! of the store uses.
//!
//! This file uses no fred, so `config` can depend on it without the client.

use std::fmt;
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
    /// Parses `redis://host[:port]` (one server) or `redis-cluster://host[:port][,host[:port]...]`
    /// (cluster seed nodes). The port defaults to 6379. IPv6 hosts go in brackets (`[::1]:6379`).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the scheme is neither `redis://` nor `redis-cluster://`, when the
    /// URL carries credentials, a path, a database or a query, when `redis://` names more than one
    /// server, or when a host or port is empty or malformed. The message names what is wrong.
    pub fn parse(url: &str) -> Result<RedisTarget> {
        let invalid = |why: String| Error::new(ErrorKind::Config, why);
        let url = url.trim();
        if url.is_empty() {
            return Err(invalid("redis url is empty".to_owned()));
        }
        let (cluster, rest) = if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, rest)
        } else if url.starts_with("rediss://") {
            return Err(invalid(format!(
                "redis url {url:?} uses tls (rediss://), which is not supported"
            )));
        } else {
            return Err(invalid(format!(
                "redis url {url:?} must start with redis:// (one server) or redis-cluster:// (cluster seed nodes)"
            )));
        };
        // Checked before anything that echoes the URL, so a password never reaches a log.
        if rest.contains('@') {
            return Err(invalid(
                "credentials (user:password@) in the redis url are not supported".to_owned(),
            ));
        }
        let (authority, trailing) = match rest.find(['/', '?', '#']) {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if !trailing.is_empty() && trailing != "/" {
            return Err(invalid(format!(
                "redis url {url:?} has {trailing:?} after host:port; paths, databases and queries are not supported"
            )));
        }
        let addresses = authority
            .split(',')
            .map(|address| {
                parse_address(address)
                    .map(|(host, port)| format_address(&host, port))
                    .map_err(|why| invalid(format!("redis url {url:?}: {why}")))
            })
            .collect::<Result<Vec<String>>>()?;
        if cluster {
            return Ok(RedisTarget::Cluster(addresses));
        }
        match <[String; 1]>::try_from(addresses) {
            Ok([address]) => Ok(RedisTarget::Standalone(address)),
            Err(addresses) => Err(invalid(format!(
                "redis url {url:?} names {} servers; redis:// takes one host:port, use redis-cluster:// for cluster seed nodes",
                addresses.len()
            ))),
        }
    }

    /// `redis` or `redis-cluster`.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTarget::Standalone(_) => "redis",
            RedisTarget::Cluster(_) => "redis-cluster",
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
}

impl RedisOptions {
    /// The default [`RedisOptions::command_timeout`].
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

    /// The default [`RedisOptions::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    /// Options for `target` with every other field at its default.
    pub fn new(target: RedisTarget) -> RedisOptions {
        RedisOptions {
            target,
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            replicas: Vec::new(),
            version_retention: Duration::from_millis(crate::store::DEFAULT_VERSION_RETENTION_MS),
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
    fn options_have_documented_defaults() {
        let options = RedisOptions::new(standalone("x:1"));
        assert_eq!(options.command_timeout, Duration::from_millis(500));
        assert_eq!(options.connect_timeout, Duration::from_secs(2));
    }
}
