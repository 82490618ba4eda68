//! A minimal synchronous RESP2 client: send a command to a node (on 127.0.0.1, or at an address
//! inside a network namespace: [`cli_at`]) and read the reply as text ([`cli`],
//! [`cli_with_timeout`], [`ping`]), or pipeline a few commands for the probes of the node and
//! cluster polls. It speaks plain TCP, or TLS (rustls) to a TLS node
//! ([`RedisNode::cli`](crate::RedisNode::cli)).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::error::{DevClusterError, Result};
use crate::DEFAULT_COMMAND_TIMEOUT;

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nfoo`.
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`.
    Nil,
    /// `*2 ...`.
    Array(Vec<Reply>),
}

/// Encodes one command as a RESP array of bulk strings.
fn encode_command(args: &[&str], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one CRLF-terminated line without the terminator.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Parses a length or integer field of a RESP header.
fn parse_number(text: &str) -> io::Result<i64> {
    text.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad RESP number {text:?}"),
        )
    })
}

/// Reads one RESP2 reply.
fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(parse_number(rest)?)),
        "$" => {
            let Ok(len) = usize::try_from(parse_number(rest)?) else {
                return Ok(Reply::Nil);
            };
            let mut data = vec![0; len + 2];
            reader.read_exact(&mut data)?;
            data.truncate(len);
            Ok(Reply::Bulk(data))
        }
        "*" => {
            let Ok(len) = usize::try_from(parse_number(rest)?) else {
                return Ok(Reply::Nil);
            };
            (0..len)
                .map(|_| read_reply(reader))
                .collect::<io::Result<_>>()
                .map(Reply::Array)
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected RESP line {line:?}"),
        )),
    }
}

/// Where a node listens (127.0.0.1, or its address inside a network namespace), and how to
/// speak to it.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    /// The address: 127.0.0.1, or a namespace address reachable only from a thread that has
    /// joined one of that network's namespaces ([`Host::run`](crate::Host::run)).
    pub(crate) ip: Ipv4Addr,
    /// The client port (the TLS port of a TLS node).
    pub(crate) port: u16,
    /// The TLS client configuration of a TLS node; `None` for plain TCP.
    pub(crate) tls: Option<Arc<ClientConfig>>,
}

impl Endpoint {
    /// A plain-TCP node on `port`.
    pub(crate) fn plain(port: u16) -> Endpoint {
        Endpoint::at(Ipv4Addr::LOCALHOST, port)
    }

    /// A plain-TCP node on `ip:port`.
    pub(crate) fn at(ip: Ipv4Addr, port: u16) -> Endpoint {
        Endpoint {
            ip,
            port,
            tls: None,
        }
    }
}

/// Sends `commands` pipelined over one fresh connection and reads one reply per command.
///
/// `timeout` bounds the connect and every single socket read and write. A TLS endpoint's
/// certificate is verified against its CA and the name `127.0.0.1`.
pub(crate) fn round_trip(
    endpoint: &Endpoint,
    commands: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<Reply>> {
    let address = SocketAddr::from((endpoint.ip, endpoint.port));
    let stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut request = Vec::new();
    for command in commands {
        encode_command(command, &mut request);
    }
    let Some(config) = &endpoint.tls else {
        (&stream).write_all(&request)?;
        let mut reader = BufReader::new(&stream);
        return commands.iter().map(|_| read_reply(&mut reader)).collect();
    };
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
    let connection = ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
    let mut tls = StreamOwned::new(connection, stream);
    tls.write_all(&request)?;
    tls.flush()?;
    let mut reader = BufReader::new(tls);
    commands.iter().map(|_| read_reply(&mut reader)).collect()
}

/// Appends the text form of `reply` (see [`cli`]) to `out`.
pub(crate) fn write_reply_text(reply: &Reply, out: &mut String) {
    match reply {
        Reply::Simple(text) | Reply::Error(text) => out.push_str(text),
        Reply::Integer(value) => out.push_str(&value.to_string()),
        Reply::Bulk(data) => out.push_str(&String::from_utf8_lossy(data)),
        Reply::Nil => {}
        Reply::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push('\n');
                }
                write_reply_text(item, out);
            }
        }
    }
}

/// Sends one command to `127.0.0.1:port` and returns the reply as text, like `redis-cli` does
/// when its output is not a terminal, but without the trailing newline.
///
/// The text format: a status or bulk string is returned verbatim (bulk strings decoded as lossy
/// UTF-8; `INFO` and `CLUSTER INFO` keep their `\r\n` line ends, which [`str::lines`] strips); an
/// integer in decimal; a nil as the empty string; an array as its elements' texts joined with
/// `\n`, nested arrays flattened (so `HGETALL` gives `field\nvalue\nfield\nvalue`). An error
/// nested in an array appears as its message. Arguments are sent as binary-safe bulk strings, so
/// no quoting is needed. Uses a 10 s socket timeout; see [`cli_with_timeout`].
///
/// # Errors
/// [`DevClusterError::Command`] when the reply is an error;
/// [`DevClusterError::Io`] when the node cannot be reached or does not answer in time.
pub fn cli(port: u16, args: &[&str]) -> Result<String> {
    cli_with_timeout(port, args, DEFAULT_COMMAND_TIMEOUT)
}

/// Like [`cli`], with `timeout` bounding the connect and every socket read and write.
///
/// A short timeout is how a test tells that a paused (SIGSTOPped) node does not answer.
///
/// # Errors
/// As for [`cli`]; a timeout is a [`DevClusterError::Io`] whose source has kind `TimedOut`.
pub fn cli_with_timeout(port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    endpoint_cli(&Endpoint::plain(port), args, timeout)
}

/// Like [`cli_with_timeout`], to `ip:port`: for a node in a network namespace, called from a
/// thread inside one of that network's namespaces ([`Host::run`](crate::Host::run)).
///
/// # Errors
/// As for [`cli_with_timeout`].
pub fn cli_at(ip: Ipv4Addr, port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    endpoint_cli(&Endpoint::at(ip, port), args, timeout)
}

/// Like [`cli_with_timeout`], to `endpoint` (plain or TLS).
pub(crate) fn endpoint_cli(
    endpoint: &Endpoint,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let port = endpoint.port;
    let command_line = args.join(" ");
    let replies = round_trip(endpoint, &[args], timeout).map_err(|source| DevClusterError::Io {
        context: format!("sending `{command_line}` to {}:{port}", endpoint.ip),
        source: name_timeout(source, timeout),
    })?;
    let mut text = String::new();
    for reply in &replies {
        if let Reply::Error(message) = reply {
            return Err(DevClusterError::Command {
                port,
                command: command_line,
                message: message.clone(),
            });
        }
        write_reply_text(reply, &mut text);
    }
    Ok(text)
}

/// Replaces the opaque "Resource temporarily unavailable" of a socket timeout with a message
/// that says what happened; other errors pass through.
fn name_timeout(error: io::Error, timeout: Duration) -> io::Error {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        ),
        _ => error,
    }
}

/// Sends `PING` to `127.0.0.1:port` and checks for `PONG`, waiting at most `timeout` per step.
///
/// # Errors
/// As for [`cli_with_timeout`], plus [`DevClusterError::Command`] for any reply but `PONG`.
pub fn ping(port: u16, timeout: Duration) -> Result<()> {
    let reply = cli_with_timeout(port, &["PING"], timeout)?;
    if reply == "PONG" {
        Ok(())
    } else {
        Err(DevClusterError::Command {
            port,
            command: "PING".to_owned(),
            message: format!("unexpected reply {reply:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_render_like_redis_cli_raw_output() {
        let reply = Reply::Array(vec![
            Reply::Bulk(b"f".to_vec()),
            Reply::Integer(7),
            Reply::Nil,
            Reply::Array(vec![Reply::Simple("OK".into())]),
        ]);
        let mut text = String::new();
        write_reply_text(&reply, &mut text);
        assert_eq!(text, "f\n7\n\nOK");
    }

    #[test]
    fn resp_replies_parse() {
        let wire = b"*3\r\n$3\r\nfoo\r\n$-1\r\n:12\r\n-ERR bad\r\n+PONG\r\n";
        let mut reader = &wire[..];
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Array(vec![
                Reply::Bulk(b"foo".to_vec()),
                Reply::Nil,
                Reply::Integer(12)
            ])
        );
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Error("ERR bad".into())
        );
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Simple("PONG".into())
        );
    }
}
