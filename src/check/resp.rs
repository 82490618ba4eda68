//! The `resp` mode's clients: writers and readers on the service's Redis-protocol door
//! (`[resp] listen`), recorded in the same history as the HTTP modes, so the same checkers judge
//! them.
//!
//! - **Writers** hold one connection each with an explicit client id (`HOTSPLIT.CLIENT
//!   writer-i`), publish with `HOTSPLIT.PUBLISH key version value` and read their own key back
//!   with `HOTSPLIT.READ key CLASS advisory`: read-your-writes through the door.
//! - **Explicit readers** (even reader numbers) hold one connection with `HOTSPLIT.CLIENT
//!   reader-i` and read with `HOTSPLIT.READ`: the affine claim, per connection.
//! - **Pooled readers** (odd reader numbers) read with plain `GET` over a pool of
//!   [`POOL_CONNECTIONS`] connections that set no client id (`HOTSPLIT.CLASS advisory` only),
//!   each read on the next connection, as an application's connection pool does: every
//!   connection has an affine copy of its own, so only the instance's per-key high-water keeps
//!   the reader's versions from going back. The value is `v<version>`, so a `GET` tells the
//!   version it read.
//!
//! The client is a minimal RESP2 one written for the check (a command out, one reply in); the
//! door's conformance to the clients applications use is tested with those clients
//! (`tests/integration/resp_clients.rs`), not here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::history::Op;
use super::recorder::{event, outcome_of, Answer, Recorder};

/// Connections in a pooled reader's pool.
pub(super) const POOL_CONNECTIONS: usize = 4;

/// How long one command may take before the connection is dropped (and reopened for the next).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the `resp` mode's clients connect.
#[derive(Debug, Clone)]
pub(super) struct RespDoors {
    /// The RESP address of the service the readers read (`host:port`).
    pub(super) read: String,
    /// The RESP address writers publish through: `read`, or in the near-cache row the other
    /// service's.
    pub(super) write: String,
    /// The run's token (read and write scopes), sent with `AUTH`.
    pub(super) token: String,
}

/// What every `resp` client task of a phase holds: where to connect, the history and when to
/// stop. Cheap to clone: each task takes its own copy.
#[derive(Clone)]
pub(super) struct RespClient {
    /// Where the readers and writers connect, and the token they authenticate with.
    pub(super) doors: Arc<RespDoors>,
    /// The history the client's operations go to.
    pub(super) recorder: Recorder,
    /// Cancelled when the phase ends.
    pub(super) stop: CancellationToken,
}

/// One writer: publishes `key` at the next version of `source[index]` through its own
/// connection (client id `writer-<index>`), then reads it back, until the client's `stop`.
pub(super) async fn writer(
    client: RespClient,
    index: usize,
    key: String,
    source: Arc<Vec<AtomicU64>>,
) {
    let RespClient {
        doors,
        recorder,
        stop,
    } = client;
    let session = format!("writer-{index}");
    let mut conn: Option<RespConn> = None;
    while !stop.is_cancelled() {
        let setup = ["HOTSPLIT.CLIENT", session.as_str()];
        let Some(open) = connected(&mut conn, &doors.write, &doors.token, &setup, &stop).await
        else {
            continue;
        };
        let version = source[index].fetch_add(1, Ordering::SeqCst) + 1;
        let (version_text, value) = (version.to_string(), format!("v{version}"));
        let start = recorder.now_us();
        let reply = open
            .call(&[
                b"HOTSPLIT.PUBLISH",
                key.as_bytes(),
                version_text.as_bytes(),
                value.as_bytes(),
            ])
            .await;
        let failed = reply.is_err();
        let answer = publish_answer(reply);
        let mut record = event(
            &session,
            Op::Write,
            &key,
            recorder.since(start),
            outcome_of(&answer),
        );
        record.version = Some(version);
        recorder.push(record);
        if failed {
            conn = None;
            continue;
        }
        // The writer reads its own key back, as `advisory`: its own-write floor must keep it
        // from an older version on a lagging replica.
        let start = recorder.now_us();
        let reply = open
            .call(&[b"HOTSPLIT.READ", key.as_bytes(), b"CLASS", b"advisory"])
            .await;
        if reply.is_err() {
            conn = None;
        }
        recorder.push_read(&session, &key, start, &read_answer(reply));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One reader session over `keys`: explicit (`HOTSPLIT.CLIENT reader-<n>`, `HOTSPLIT.READ`) for
/// even `reader`, pooled (plain `GET` over [`POOL_CONNECTIONS`] connections with no client id)
/// for odd, until the client's `stop`.
pub(super) async fn reader(client: RespClient, reader: u32, keys: Vec<String>, mut rng: StdRng) {
    let RespClient {
        doors,
        recorder,
        stop,
    } = client;
    let explicit = reader.is_multiple_of(2);
    let session = if explicit {
        format!("reader-{reader}")
    } else {
        format!("pool-{reader}")
    };
    let slots = if explicit { 1 } else { POOL_CONNECTIONS };
    let mut pool: Vec<Option<RespConn>> = (0..slots).map(|_| None).collect();
    let mut next = 0;
    while !stop.is_cancelled() {
        let slot = &mut pool[next % slots];
        next += 1;
        // An explicit reader names its client id; a pooled connection only its class.
        let setup = if explicit {
            ["HOTSPLIT.CLIENT", session.as_str()]
        } else {
            ["HOTSPLIT.CLASS", "advisory"]
        };
        let Some(open) = connected(slot, &doors.read, &doors.token, &setup, &stop).await else {
            continue;
        };
        let key = &keys[rng.random_range(0..keys.len())];
        let start = recorder.now_us();
        let answer = if explicit {
            let reply = open
                .call(&[b"HOTSPLIT.READ", key.as_bytes(), b"CLASS", b"advisory"])
                .await;
            if reply.is_err() {
                *slot = None;
            }
            read_answer(reply)
        } else {
            let reply = open.call(&[b"GET", key.as_bytes()]).await;
            if reply.is_err() {
                *slot = None;
            }
            get_answer(reply)
        };
        recorder.push_read(&session, key, start, &answer);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The open connection in `slot`, opening one with `setup` when there is none; `None` (after a
/// short pause) when the door does not answer.
async fn connected<'a>(
    slot: &'a mut Option<RespConn>,
    address: &str,
    token: &str,
    setup: &[&str],
    stop: &CancellationToken,
) -> Option<&'a mut RespConn> {
    if slot.is_none() {
        *slot = open_or_pause(address, token, &[setup], stop).await;
    }
    slot.as_mut()
}

/// Opens a connection, or pauses 50 ms (or until `stop`) and gives none.
async fn open_or_pause(
    address: &str,
    token: &str,
    setup: &[&[&str]],
    stop: &CancellationToken,
) -> Option<RespConn> {
    match RespConn::open(address, token, setup).await {
        Ok(conn) => Some(conn),
        Err(_) => {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                () = stop.cancelled() => {}
            }
            None
        }
    }
}

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    /// `$-1` or `*-1`.
    Nil,
    /// `:n`.
    Int(i64),
    /// `$n` or `+text`.
    Bulk(Vec<u8>),
    /// `-text`.
    Error(String),
    /// `*n`.
    Array(Vec<Value>),
}

impl Value {
    /// The text of a bulk or simple string, or of an integer.
    fn text(&self) -> Option<String> {
        match self {
            Value::Bulk(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Value::Int(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// One connection to the door.
pub(super) struct RespConn {
    /// The stream, buffered for reading replies.
    stream: BufReader<TcpStream>,
}

impl RespConn {
    /// Connects to `address`, authenticates with `token` and sends `setup` commands (each must
    /// not answer an error).
    pub(super) async fn open(
        address: &str,
        token: &str,
        setup: &[&[&str]],
    ) -> std::io::Result<RespConn> {
        let stream = tokio::time::timeout(CALL_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))??;
        stream.set_nodelay(true)?;
        let mut conn = RespConn {
            stream: BufReader::new(stream),
        };
        let auth = ["AUTH", token];
        let mut commands: Vec<&[&str]> = vec![&auth];
        commands.extend_from_slice(setup);
        for command in commands {
            let args: Vec<&[u8]> = command.iter().map(|arg| arg.as_bytes()).collect();
            if let Value::Error(text) = conn.call(&args).await? {
                return Err(std::io::Error::other(format!("{}: {text}", command[0])));
            }
        }
        Ok(conn)
    }

    /// Sends one command and reads its reply.
    pub(super) async fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Value> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        tokio::time::timeout(CALL_TIMEOUT, async {
            self.stream.get_mut().write_all(&out).await?;
            read_value(&mut self.stream).await
        })
        .await
        .map_err(|_| std::io::Error::other("command timed out"))?
    }
}

/// Reads one reply.
async fn read_value(stream: &mut BufReader<TcpStream>) -> std::io::Result<Value> {
    // Replies nest only in arrays; an explicit stack keeps the future's size fixed.
    let mut stack: Vec<(usize, Vec<Value>)> = Vec::new();
    loop {
        let mut line = Vec::new();
        stream.read_until(b'\n', &mut line).await?;
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err(std::io::Error::other("connection closed or bad reply line"));
        }
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let number = || {
            body.parse::<i64>()
                .map_err(|_| std::io::Error::other(format!("bad length {body:?}")))
        };
        let value = match line[0] {
            b'+' => Value::Bulk(body.into_bytes()),
            b'-' => Value::Error(body),
            b':' => Value::Int(number()?),
            b'$' => match number()? {
                -1 => Value::Nil,
                len => {
                    let len = usize::try_from(len)
                        .map_err(|_| std::io::Error::other("negative bulk length"))?;
                    let mut bytes = vec![0; len + 2];
                    stream.read_exact(&mut bytes).await?;
                    bytes.truncate(len);
                    Value::Bulk(bytes)
                }
            },
            b'*' => match number()? {
                -1 => Value::Nil,
                0 => Value::Array(Vec::new()),
                len => {
                    let len = usize::try_from(len)
                        .map_err(|_| std::io::Error::other("negative array length"))?;
                    stack.push((len, Vec::with_capacity(len)));
                    continue;
                }
            },
            other => {
                return Err(std::io::Error::other(format!(
                    "unexpected reply type {:?}",
                    other as char
                )))
            }
        };
        let mut value = value;
        loop {
            match stack.last_mut() {
                None => return Ok(value),
                Some((len, items)) => {
                    items.push(value);
                    if items.len() < *len {
                        break;
                    }
                    let (_, items) = stack.pop().unwrap_or_default();
                    value = Value::Array(items);
                }
            }
        }
    }
}

/// An answer that came (status 200) and told nothing yet: each reply fills in what it says.
fn answered() -> Answer {
    Answer {
        status: 200,
        version: None,
        copy: None,
        served_by: None,
        route: None,
        code: None,
        session: None,
    }
}

/// The fields of a `HOTSPLIT.READ` answer (a flat array of name, value pairs in RESP2) as an
/// HTTP read's [`Answer`]; nil as a 404, an error as its prefix.
pub(super) fn read_answer(reply: std::io::Result<Value>) -> Answer {
    let mut answer = answered();
    match reply {
        Ok(Value::Array(items)) => {
            for pair in items.chunks(2) {
                let [name, value] = pair else { continue };
                let Some(name) = name.text() else { continue };
                let text = value.text();
                match name.as_str() {
                    "version" => answer.version = text.and_then(|t| t.parse().ok()),
                    "copy" => answer.copy = text.and_then(|t| t.parse().ok()),
                    "served_by" => answer.served_by = text,
                    "route" => answer.route = text,
                    _ => {}
                }
            }
            if answer.version.is_none() {
                answer.status = 0;
                answer.code = Some("resp: a read answer without a version".into());
            }
        }
        other => apply_plain(&mut answer, other, None),
    }
    answer
}

/// A plain `GET`'s answer: the value `v<version>` tells the version.
pub(super) fn get_answer(reply: std::io::Result<Value>) -> Answer {
    let mut answer = answered();
    apply_plain(&mut answer, reply, Some(()));
    answer
}

/// A publish's answer: any reply but an error is an acknowledged edit (the report says how
/// many copies applied or queued it; a publish that landed nowhere answers an error).
pub(super) fn publish_answer(reply: std::io::Result<Value>) -> Answer {
    let mut answer = answered();
    match reply {
        Ok(Value::Error(text)) => error_answer(&mut answer, &text),
        Ok(_) => {}
        Err(err) => transport(&mut answer, &err),
    }
    answer
}

/// Nil, an error, a transport failure, or (for a `GET`) a value naming its version.
fn apply_plain(answer: &mut Answer, reply: std::io::Result<Value>, get: Option<()>) {
    match reply {
        Ok(Value::Nil) => answer.status = 404,
        Ok(Value::Error(text)) => error_answer(answer, &text),
        Ok(Value::Bulk(bytes)) if get.is_some() => {
            answer.version = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.strip_prefix('v'))
                .and_then(|text| text.parse().ok());
            if answer.version.is_none() {
                answer.status = 0;
                answer.code = Some("resp: a value not written by the check".into());
            }
        }
        Ok(other) => {
            answer.status = 0;
            answer.code = Some(format!("resp: unexpected reply {other:?}"));
        }
        Err(err) => transport(answer, &err),
    }
}

/// An error reply: its prefix is the outcome's code.
fn error_answer(answer: &mut Answer, text: &str) {
    answer.status = 503;
    let prefix = text.split(' ').next().unwrap_or(text);
    answer.code = Some(format!("resp {}", prefix.to_ascii_lowercase()));
}

/// The connection failed: the caller drops it and opens another.
fn transport(answer: &mut Answer, err: &std::io::Error) {
    answer.status = 0;
    answer.code = Some(format!("transport: {err}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_answer_is_read_from_its_pairs() {
        let bulk = |text: &str| Value::Bulk(text.as_bytes().to_vec());
        let answer = read_answer(Ok(Value::Array(vec![
            bulk("value"),
            bulk("v7"),
            bulk("version"),
            Value::Int(7),
            bulk("copy"),
            Value::Int(2),
            bulk("served_by"),
            bulk("127.0.0.1:7000;role=replica"),
            bulk("route"),
            bulk("class=advisory;reason=class"),
        ])));
        assert_eq!(answer.status, 200);
        assert_eq!(answer.version, Some(7));
        assert_eq!(answer.copy, Some(2));
        assert_eq!(
            answer.served_by.as_deref(),
            Some("127.0.0.1:7000;role=replica")
        );
        let missing = read_answer(Ok(Value::Nil));
        assert_eq!(missing.status, 404);
        let refused = read_answer(Ok(Value::Error("FLOOR no copy reached 9".into())));
        assert_eq!(
            (refused.status, refused.code.as_deref()),
            (503, Some("resp floor"))
        );
    }

    #[test]
    fn a_get_tells_its_version_by_its_value() {
        assert_eq!(
            get_answer(Ok(Value::Bulk(b"v12".to_vec()))).version,
            Some(12)
        );
        assert_eq!(get_answer(Ok(Value::Bulk(b"x".to_vec()))).status, 0);
        assert_eq!(get_answer(Ok(Value::Nil)).status, 404);
    }
}
