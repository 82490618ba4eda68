//! The `client-cache` mode's RESP3 connection ([`Resp3Conn`]): a blocking socket, as redis-py's
//! own is, that sends a command, reads frames one at a time (pushes and replies in the order
//! the door wrote them), and tells what is already readable without waiting
//! ([`Resp3Conn::readable_frames`], redis-py's `can_read()` loop). The frame parser
//! ([`parse`]) is incremental and pure.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long one read or write may block before the connection is dropped (and reopened).
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A RESP3 frame, reduced to what the check reads.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Frame {
    /// `_`, `$-1` or `*-1`.
    Null,
    /// `:n`.
    Int(i64),
    /// `$n`, `+text`, `=n` (verbatim), `,` (double), `#` (boolean), `(` (big number).
    Bulk(Vec<u8>),
    /// `-text` or `!n`.
    Error(String),
    /// `*n`, `~n` (set), or `%n` (map, flattened to its keys and values in turn).
    Array(Vec<Frame>),
    /// `>n`: a push (an invalidation), never a reply.
    Push(Vec<Frame>),
}

/// Parses one frame from the start of `input`: the frame and the bytes it took, `None` when
/// `input` holds only part of one. Attributes (`|n`) are read and dropped.
///
/// # Errors
/// A message when the input is not RESP3.
pub(super) fn parse(input: &[u8]) -> Result<Option<(Frame, usize)>, String> {
    let Some(line_end) = input.windows(2).position(|pair| pair == b"\r\n") else {
        return Ok(None);
    };
    let Some(&kind) = input.first() else {
        return Ok(None);
    };
    let body = std::str::from_utf8(&input[1..line_end]).map_err(|err| err.to_string())?;
    let after = line_end + 2;
    let number = || {
        body.parse::<i64>()
            .map_err(|_| format!("bad length or number {body:?}"))
    };
    let text = |bytes: &[u8]| Frame::Bulk(bytes.to_vec());
    match kind {
        b'+' | b',' | b'#' | b'(' => Ok(Some((text(body.as_bytes()), after))),
        b'-' => Ok(Some((Frame::Error(body.to_owned()), after))),
        b':' => Ok(Some((Frame::Int(number()?), after))),
        b'_' => Ok(Some((Frame::Null, after))),
        b'$' | b'=' | b'!' => {
            let Ok(len) = usize::try_from(number()?) else {
                return Ok(Some((Frame::Null, after)));
            };
            if input.len() < after + len + 2 {
                return Ok(None);
            }
            let bytes = &input[after..after + len];
            let frame = match kind {
                b'!' => Frame::Error(String::from_utf8_lossy(bytes).into_owned()),
                b'=' => text(bytes.get(4..).unwrap_or_default()),
                _ => text(bytes),
            };
            Ok(Some((frame, after + len + 2)))
        }
        b'*' | b'~' | b'%' | b'>' | b'|' => {
            let Ok(count) = usize::try_from(number()?) else {
                return Ok(Some((Frame::Null, after)));
            };
            let count = if matches!(kind, b'%' | b'|') {
                count * 2
            } else {
                count
            };
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = after;
            for _ in 0..count {
                let Some((item, used)) = parse(&input[at..])? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            match kind {
                b'>' => Ok(Some((Frame::Push(items), at))),
                // An attribute describes the frame after it: read that one instead.
                b'|' => Ok(parse(&input[at..])?.map(|(frame, used)| (frame, at + used))),
                _ => Ok(Some((Frame::Array(items), at))),
            }
        }
        other => Err(format!("unexpected frame type {:?}", other as char)),
    }
}

/// An invalidation push: the keys it names, or none for the null invalidation (`_`: drop
/// everything). `None` for a push that is not an invalidation.
pub(super) fn invalidation(push: &[Frame]) -> Option<Option<Vec<String>>> {
    let [Frame::Bulk(kind), keys] = push else {
        return None;
    };
    if kind.as_slice() != b"invalidate" {
        return None;
    }
    Some(match keys {
        Frame::Array(keys) => Some(
            keys.iter()
                .filter_map(|key| match key {
                    Frame::Bulk(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    })
}

/// One RESP3 connection to the door with tracking on.
pub(super) struct Resp3Conn {
    /// The socket, blocking with [`IO_TIMEOUT`].
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    pending: Vec<u8>,
}

impl Resp3Conn {
    /// Connects to `address`, authenticates with `token`, then `HELLO 3` and `CLIENT TRACKING
    /// ON`, as redis-py does when it is given a `cache_config`.
    ///
    /// # Errors
    /// I/O errors, and an error reply to any of the three commands.
    pub(super) fn open(address: &str, token: &str) -> std::io::Result<Resp3Conn> {
        let address: std::net::SocketAddr = address.parse().map_err(std::io::Error::other)?;
        let stream = TcpStream::connect_timeout(&address, IO_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        let mut conn = Resp3Conn {
            stream,
            pending: Vec::new(),
        };
        let setup: [&[&[u8]]; 3] = [
            &[b"AUTH", token.as_bytes()],
            &[b"HELLO", b"3"],
            &[b"CLIENT", b"TRACKING", b"ON"],
        ];
        for command in setup {
            conn.send(command)?;
            // No key is tracked yet: the first frame is the reply.
            if let Frame::Error(text) = conn.read_frame()? {
                return Err(std::io::Error::other(format!(
                    "{}: {text}",
                    String::from_utf8_lossy(command[0])
                )));
            }
        }
        Ok(conn)
    }

    /// Writes one command.
    ///
    /// # Errors
    /// I/O errors.
    pub(super) fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&out)
    }

    /// Reads the next frame, waiting for it (at most [`IO_TIMEOUT`] per read).
    ///
    /// # Errors
    /// I/O errors, a timeout, a closed connection, or bytes that are not RESP3.
    pub(super) fn read_frame(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some((frame, used)) = parse(&self.pending).map_err(std::io::Error::other)? {
                self.pending.drain(..used);
                return Ok(frame);
            }
            let mut buf = [0u8; 16 * 1024];
            let read = self.stream.read(&mut buf)?;
            if read == 0 {
                return Err(std::io::Error::new(
                    IoKind::UnexpectedEof,
                    "the door closed the connection",
                ));
            }
            self.pending.extend_from_slice(&buf[..read]);
        }
    }

    /// The frames already readable, without waiting for any: what redis-py's
    /// `while self.can_read(): read_response(push_request=True)` reads. A frame partly arrived
    /// is read whole (waiting for its rest), as redis-py's `read_response` does.
    ///
    /// # Errors
    /// As [`Resp3Conn::read_frame`]; a closed connection too.
    pub(super) fn readable_frames(&mut self) -> std::io::Result<Vec<Frame>> {
        self.stream.set_nonblocking(true)?;
        let filled = self.fill_without_waiting();
        self.stream.set_nonblocking(false)?;
        filled?;
        let mut frames = Vec::new();
        while !self.pending.is_empty() {
            frames.push(self.read_frame()?);
        }
        Ok(frames)
    }

    /// Reads whatever the socket holds now into `pending` (the socket is non-blocking).
    fn fill_without_waiting(&mut self) -> std::io::Result<()> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        IoKind::UnexpectedEof,
                        "the door closed the connection",
                    ))
                }
                Ok(read) => self.pending.extend_from_slice(&buf[..read]),
                Err(err) if err.kind() == IoKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == IoKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_whole_or_not_at_all() {
        let push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nk:1\r\n$2\r\nv7\r\n";
        let (frame, used) = parse(push).unwrap().unwrap();
        let Frame::Push(items) = frame else {
            panic!("{frame:?}")
        };
        assert_eq!(invalidation(&items), Some(Some(vec!["k:1".to_owned()])));
        assert_eq!(
            parse(&push[used..]).unwrap().unwrap().0,
            Frame::Bulk(b"v7".to_vec())
        );
        for cut in 1..used {
            assert_eq!(parse(&push[..cut]).unwrap(), None, "cut at {cut}");
        }
        let flush = b">2\r\n$10\r\ninvalidate\r\n_\r\n";
        let (Frame::Push(items), _) = parse(flush).unwrap().unwrap() else {
            panic!()
        };
        assert_eq!(invalidation(&items), Some(None));
        let hello = b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n";
        assert!(
            matches!(parse(hello).unwrap().unwrap().0, Frame::Array(items) if items.len() == 4)
        );
        assert_eq!(parse(b"_\r\n").unwrap().unwrap().0, Frame::Null);
        assert!(matches!(
            parse(b"-FLOOR no copy\r\n").unwrap().unwrap().0,
            Frame::Error(_)
        ));
        assert!(parse(b"?x\r\n").is_err());
    }
}
