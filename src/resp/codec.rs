//! The bounded request parser and the reply encoder of the Redis-protocol door.
//!
//! [`Parser`] reads commands out of a connection's input buffer, as Redis's
//! `processMultibulkBuffer` and `processInlineBuffer` do:
//! - a buffer starting with `*` is a multibulk request (`*N\r\n` then N `$L\r\n<L bytes>\r\n`);
//!   `*0` and negative counts are empty requests, skipped;
//! - anything else is an inline command: one line up to `\n` (a `\r` before it dropped), split
//!   into arguments as Redis's `sdssplitargs` does (double quotes with `\n \r \t \b \a \xHH`
//!   escapes, single quotes with `\'`, a closing quote followed by a space or the line's end);
//!   empty lines are skipped.
//!
//! # Invariants
//! - **Incremental.** Each element is taken out of the buffer as soon as it is whole (a bulk
//!   argument is split off as a [`Bytes`] slice of the read buffer: no copy), and a line end is
//!   searched only in bytes not searched before: a command arriving one byte at a time costs
//!   what it costs in one read, never a re-parse from the start.
//! - **Bounded before buffered.** A declared length is checked before its bytes are awaited:
//!   an argument count over [`Limits::max_args`] is `invalid multibulk length`, a bulk length
//!   over [`Limits::max_bulk`] is `invalid bulk length`, a length line or an inline line longer
//!   than [`Limits::max_inline`] is `too big mbulk count string` / `too big bulk count string` /
//!   `too big inline request`. Before a connection authenticates (tokens configured), Redis's
//!   own tighter bounds apply: 10 arguments, 16 KiB a bulk (`unauthenticated multibulk
//!   length`, `unauthenticated bulk length`). The declared count does not size an allocation (at most 16
//!   argument slots are reserved up front). The connection bounds the whole of a command held
//!   with [`Parser::pending`], which counts a bulk argument's declared
//!   length from its length line on.
//! - **Redis's texts.** Every [`ProtocolError`] displays as Redis's own reply text after
//!   `Protocol error: `; the connection answers `-ERR Protocol error: …` and closes, as Redis
//!   does. One stricter rule: the two bytes after a bulk argument must be `\r\n` (Redis skips
//!   them unread), since a wrong length would otherwise make a value's bytes run as commands.
//!
//! [`encode`] writes a [`Reply`] in RESP2 or RESP3: a map is `%` in RESP3 and a flat array in
//! RESP2, a null `_` or `$-1`, a verbatim string `=N\r\ntxt:…` or a bulk string; simple strings
//! and errors have any CR or LF replaced by a space (as Redis's `addReplyErrorLength` does).
//!
//! # Why not the `redis-protocol` crate
//! `redis-protocol` 6.0 is already in the tree (under fred), but it is a client's codec: its
//! decoder takes a declared bulk or array length as it comes (a `*99999999999` or a
//! `$99999999999` makes it wait for, and buffer, whatever follows, with no bound to check before
//! buffering), it decodes from the start of the buffer on every call, so a large argument
//! arriving in many reads is re-parsed on each, and it has no inline commands, which
//! `redis-cli`, `telnet` and health checks send. The request side of the protocol is small
//! enough that a parser with these bounds costs less than wrapping one without them.

use bytes::{Buf, Bytes, BytesMut};

use super::reply::{Proto, Reply};

/// How many argument slots a multibulk header reserves at most before its arguments arrive.
const RESERVED_ARGS: usize = 16;

/// The most arguments of a command from a connection that must still authenticate (Redis's own
/// bound: `HELLO 3 AUTH default <token> SETNAME <name>` is 7).
pub const UNAUTHENTICATED_MAX_ARGS: usize = 10;

/// The longest bulk argument from a connection that must still authenticate (Redis's own).
pub const UNAUTHENTICATED_MAX_BULK: usize = 16 * 1024;

/// The bounds a [`Parser`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest bulk argument, in bytes.
    pub max_bulk: usize,
    /// The most arguments of one command, its name included.
    pub max_args: usize,
    /// The longest inline line or length line, in bytes.
    pub max_inline: usize,
}

/// A request that breaks the protocol; the connection answers it and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A multibulk count that is not a number, or over [`Limits::max_args`].
    #[error("invalid multibulk length")]
    InvalidMultibulkLength,
    /// A bulk length that is not a number, negative, over [`Limits::max_bulk`], or not
    /// followed by its bytes and `\r\n`.
    #[error("invalid bulk length")]
    InvalidBulkLength,
    /// An argument of a multibulk request that does not start with `$`.
    #[error("expected '$', got '{}'", shown(*.0))]
    ExpectedDollar(u8),
    /// A multibulk count line longer than [`Limits::max_inline`].
    #[error("too big mbulk count string")]
    TooBigMultibulkCount,
    /// A bulk length line longer than [`Limits::max_inline`].
    #[error("too big bulk count string")]
    TooBigBulkCount,
    /// An inline line longer than [`Limits::max_inline`].
    #[error("too big inline request")]
    TooBigInline,
    /// An inline line whose quotes do not close, or close before a non-space.
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A multibulk count over [`UNAUTHENTICATED_MAX_ARGS`] before authentication.
    #[error("unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// A bulk length over [`UNAUTHENTICATED_MAX_BULK`] before authentication.
    #[error("unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    /// A command that holds more than `resp.max_pending_bytes` (the connection's check).
    #[error("too big request")]
    TooBigRequest,
    /// The commands every connection is receiving hold more than `resp.max_receiving_bytes`
    /// (the connection's check).
    #[error("commands being received hold resp.max_receiving_bytes")]
    ReceivingBudget,
    /// A command did not all arrive within `resp.receive_timeout` of its first byte (the
    /// connection's check).
    #[error("command not received within resp.receive_timeout")]
    ReceiveTimeout,
}

impl ProtocolError {
    /// The error reply's text: `ERR Protocol error: …`.
    pub fn reply_text(&self) -> String {
        format!("ERR Protocol error: {self}")
    }
}

/// A byte as an error text shows it: printable ASCII as itself, anything else as `\xHH`.
fn shown(byte: u8) -> String {
    if byte.is_ascii_graphic() || byte == b' ' {
        char::from(byte).to_string()
    } else {
        format!("\\x{byte:02x}")
    }
}

/// The multibulk request being read.
#[derive(Debug)]
struct Multibulk {
    /// The arguments read so far.
    args: Vec<Bytes>,
    /// How many it declared.
    expected: usize,
    /// The length of the bulk argument whose bytes are awaited (its `$L` line read).
    bulk_len: Option<usize>,
    /// The bytes of `args`.
    held: usize,
}

/// An incremental request parser for one connection; see the module documentation.
#[derive(Debug)]
pub struct Parser {
    /// The bounds.
    limits: Limits,
    /// The multibulk request in progress, if any.
    multibulk: Option<Multibulk>,
    /// How many bytes at the buffer's start were already searched for the current line's end.
    scanned: usize,
    /// Whether the connection must still authenticate: Redis's tighter bounds apply.
    unauthenticated: bool,
    /// An answered command's argument vector, emptied, for the next command ([`Parser::recycle`]).
    spare: Vec<Bytes>,
}

impl Parser {
    /// A parser checking `limits`.
    pub fn new(limits: Limits) -> Parser {
        Parser {
            limits,
            multibulk: None,
            scanned: 0,
            unauthenticated: false,
            spare: Vec::new(),
        }
    }

    /// Gives back a command's arguments once it is answered: the next command is parsed into
    /// the same vector (a pipelined batch of hits allocates none), unless it grew past
    /// [`RESERVED_ARGS`].
    pub fn recycle(&mut self, mut args: Vec<Bytes>) {
        if args.capacity() <= RESERVED_ARGS {
            args.clear();
            self.spare = args;
        }
    }

    /// Whether the connection must still authenticate (tokens are configured and it has not
    /// sent a good `AUTH`): from the next command on, a multibulk count over
    /// [`UNAUTHENTICATED_MAX_ARGS`] or a bulk length over [`UNAUTHENTICATED_MAX_BULK`] is a
    /// protocol error, as on Redis with `requirepass`: a client without a token cannot make a
    /// connection hold more than a few kilobytes.
    pub fn set_unauthenticated(&mut self, unauthenticated: bool) {
        self.unauthenticated = unauthenticated;
    }

    /// Takes the next whole command out of `buf`: `Ok(None)` when `buf` holds no whole
    /// command yet (what it holds is kept, in `buf` or in the parser, for the next call).
    ///
    /// # Errors
    /// A [`ProtocolError`] when the input breaks the protocol or a bound; the parser is then
    /// unusable (the connection closes).
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            let Some(multibulk) = &mut self.multibulk else {
                let Some(&first) = buf.first() else {
                    return Ok(None);
                };
                if first != b'*' {
                    match self.inline(buf)? {
                        Some(args) if args.is_empty() => continue,
                        found => return Ok(found),
                    }
                }
                let Some(end) = self.line_end(buf, ProtocolError::TooBigMultibulkCount)? else {
                    return Ok(None);
                };
                let count = parse_int(&buf[1..end]).ok_or(ProtocolError::InvalidMultibulkLength)?;
                buf.advance(end + 2);
                if count <= 0 {
                    continue;
                }
                let expected = usize::try_from(count)
                    .ok()
                    .filter(|count| *count <= self.limits.max_args)
                    .ok_or(ProtocolError::InvalidMultibulkLength)?;
                if self.unauthenticated && expected > UNAUTHENTICATED_MAX_ARGS {
                    return Err(ProtocolError::UnauthenticatedMultibulkLength);
                }
                self.multibulk = Some(Multibulk {
                    args: {
                        let mut args = std::mem::take(&mut self.spare);
                        args.reserve(expected.min(RESERVED_ARGS));
                        args
                    },
                    expected,
                    bulk_len: None,
                    held: 0,
                });
                continue;
            };
            match multibulk.bulk_len {
                None => {
                    let Some(&first) = buf.first() else {
                        return Ok(None);
                    };
                    if first != b'$' {
                        return Err(ProtocolError::ExpectedDollar(first));
                    }
                    let limits = self.limits;
                    let end = match line_end(buf, &mut self.scanned, limits.max_inline) {
                        Some(Some(end)) => end,
                        Some(None) => return Ok(None),
                        None => return Err(ProtocolError::TooBigBulkCount),
                    };
                    let len = parse_int(&buf[1..end])
                        .and_then(|len| usize::try_from(len).ok())
                        .filter(|len| *len <= limits.max_bulk)
                        .ok_or(ProtocolError::InvalidBulkLength)?;
                    if self.unauthenticated && len > UNAUTHENTICATED_MAX_BULK {
                        return Err(ProtocolError::UnauthenticatedBulkLength);
                    }
                    buf.advance(end + 2);
                    multibulk.bulk_len = Some(len);
                }
                Some(len) => {
                    if buf.len() < len + 2 {
                        return Ok(None);
                    }
                    if &buf[len..len + 2] != b"\r\n" {
                        return Err(ProtocolError::InvalidBulkLength);
                    }
                    let arg = buf.split_to(len).freeze();
                    buf.advance(2);
                    multibulk.held += len;
                    multibulk.args.push(arg);
                    multibulk.bulk_len = None;
                    if multibulk.args.len() == multibulk.expected {
                        let done = self.multibulk.take().map(|done| done.args);
                        return Ok(done);
                    }
                }
            }
        }
    }

    /// The bytes the command being received holds or declared: its arguments already read,
    /// `buf`, and the rest of the bulk argument whose length line was read.
    pub fn pending(&self, buf: &BytesMut) -> usize {
        self.multibulk
            .as_ref()
            .map_or(0, |multibulk| multibulk.held)
            .saturating_add(buf.len())
            .saturating_add(self.wanted(buf))
    }

    /// How many more bytes `buf` needs before the awaited bulk argument is whole (0 when none
    /// is awaited): what the connection reserves before its next read.
    pub fn wanted(&self, buf: &BytesMut) -> usize {
        match self
            .multibulk
            .as_ref()
            .and_then(|multibulk| multibulk.bulk_len)
        {
            Some(len) => (len + 2).saturating_sub(buf.len()),
            None => 0,
        }
    }

    /// The end of the `\r\n`-terminated line at the start of `buf` (the index of its `\r`),
    /// `None` if it has not all arrived; `too_big` when it is over the bound.
    fn line_end(
        &mut self,
        buf: &BytesMut,
        too_big: ProtocolError,
    ) -> Result<Option<usize>, ProtocolError> {
        line_end(buf, &mut self.scanned, self.limits.max_inline).ok_or(too_big)
    }

    /// Takes the inline command at the start of `buf`: `Ok(None)` when its line has not all
    /// arrived, `Ok(Some(empty))` for an empty line.
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let from = self.scanned;
        let Some(newline) = buf[from..].iter().position(|byte| *byte == b'\n') else {
            if buf.len() > self.limits.max_inline {
                return Err(ProtocolError::TooBigInline);
            }
            self.scanned = buf.len();
            return Ok(None);
        };
        let newline = from + newline;
        self.scanned = 0;
        if newline > self.limits.max_inline {
            return Err(ProtocolError::TooBigInline);
        }
        let mut line = buf.split_to(newline + 1).freeze();
        line.truncate(newline);
        if line.last() == Some(&b'\r') {
            line.truncate(newline - 1);
        }
        let args = split_args(&line)?;
        if args.len() > self.limits.max_args {
            return Err(ProtocolError::InvalidMultibulkLength);
        }
        if self.unauthenticated && args.len() > UNAUTHENTICATED_MAX_ARGS {
            return Err(ProtocolError::UnauthenticatedMultibulkLength);
        }
        Ok(Some(args))
    }
}

/// The index of the `\r` of the first `\r\n` in `buf`, searching from `*scanned` (bytes before
/// it were searched by an earlier call): `Some(None)` when there is none yet (and `*scanned`
/// moves on), `None` when the line is already longer than `max` bytes.
fn line_end(buf: &[u8], scanned: &mut usize, max: usize) -> Option<Option<usize>> {
    // A `\r` at the end of the searched part may be followed by the `\n` that just arrived.
    let from = scanned.saturating_sub(1);
    match buf[from..].windows(2).position(|pair| pair == b"\r\n") {
        Some(at) => {
            *scanned = 0;
            let end = from + at;
            (end <= max).then_some(Some(end))
        }
        None if buf.len() > max => None,
        None => {
            *scanned = buf.len();
            Some(None)
        }
    }
}

/// A length: an optional `-` and decimal digits with no leading zero (Redis's `string2ll`).
fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    match digits {
        [] => return None,
        [b'0'] if !negative => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut value: i64 = 0;
    for digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(i64::from(digit - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

/// C's `isspace`, as `sdssplitargs` uses it.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The value of a hex digit.
fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// Splits an inline line into arguments as Redis's `sdssplitargs` does; an argument without
/// quotes is a slice of `line`. The line ends at a NUL byte, as the C string does there.
fn split_args(line: &Bytes) -> Result<Vec<Bytes>, ProtocolError> {
    let len = line
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(line.len());
    let text = &line[..len];
    let mut args = Vec::new();
    let mut at = 0;
    loop {
        while at < len && is_space(text[at]) {
            at += 1;
        }
        if at == len {
            return Ok(args);
        }
        let start = at;
        // `Some` once the argument has a quoted part: its bytes so far.
        let mut built: Option<Vec<u8>> = None;
        let mut in_double = false;
        let mut in_single = false;
        loop {
            if in_double {
                let bytes = built.get_or_insert_with(Vec::new);
                let byte = *text.get(at).ok_or(ProtocolError::UnbalancedQuotes)?;
                let escaped_hex = (byte == b'\\' && text.get(at + 1) == Some(&b'x'))
                    .then(|| {
                        let high = hex_value(*text.get(at + 2)?)?;
                        let low = hex_value(*text.get(at + 3)?)?;
                        Some(high * 16 + low)
                    })
                    .flatten();
                if let Some(value) = escaped_hex {
                    bytes.push(value);
                    at += 3;
                } else if byte == b'\\' && at + 1 < len {
                    at += 1;
                    bytes.push(match text[at] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                } else if byte == b'"' {
                    if text.get(at + 1).is_some_and(|next| !is_space(*next)) {
                        return Err(ProtocolError::UnbalancedQuotes);
                    }
                    at += 1;
                    break;
                } else {
                    bytes.push(byte);
                }
            } else if in_single {
                let bytes = built.get_or_insert_with(Vec::new);
                let byte = *text.get(at).ok_or(ProtocolError::UnbalancedQuotes)?;
                if byte == b'\\' && text.get(at + 1) == Some(&b'\'') {
                    bytes.push(b'\'');
                    at += 1;
                } else if byte == b'\'' {
                    if text.get(at + 1).is_some_and(|next| !is_space(*next)) {
                        return Err(ProtocolError::UnbalancedQuotes);
                    }
                    at += 1;
                    break;
                } else {
                    bytes.push(byte);
                }
            } else {
                let Some(&byte) = text.get(at) else { break };
                match byte {
                    b' ' | b'\n' | b'\r' | b'\t' => break,
                    b'"' | b'\'' => {
                        // The unquoted bytes before the quote start the argument's copy.
                        built
                            .get_or_insert_with(Vec::new)
                            .extend_from_slice(&text[start..at]);
                        in_double = byte == b'"';
                        in_single = byte == b'\'';
                    }
                    _ => {
                        if let Some(bytes) = &mut built {
                            bytes.push(byte);
                        }
                    }
                }
            }
            at += 1;
        }
        args.push(match built {
            Some(bytes) => Bytes::from(bytes),
            None => line.slice(start..at),
        });
    }
}

/// Appends `reply` to `out` in `proto`.
pub fn encode(reply: &Reply, proto: Proto, out: &mut BytesMut) {
    match reply {
        Reply::Simple(text) => line(out, b'+', text.as_bytes()),
        Reply::Status(text) => line(out, b'+', text.as_bytes()),
        Reply::Error(text) => line(out, b'-', text.as_bytes()),
        Reply::Int(value) => header(out, b':', *value),
        Reply::Bulk(bytes) => bulk(out, b'$', &[], bytes),
        Reply::Nil => match proto {
            Proto::Resp2 => out.extend_from_slice(b"$-1\r\n"),
            Proto::Resp3 => out.extend_from_slice(b"_\r\n"),
        },
        Reply::Array(items) => {
            header(out, b'*', count(items.len()));
            for item in items {
                encode(item, proto, out);
            }
        }
        Reply::Push(items) => {
            let kind = match proto {
                Proto::Resp2 => b'*',
                Proto::Resp3 => b'>',
            };
            header(out, kind, count(items.len()));
            for item in items {
                encode(item, proto, out);
            }
        }
        Reply::Map(pairs) => {
            match proto {
                Proto::Resp2 => header(out, b'*', count(pairs.len()).saturating_mul(2)),
                Proto::Resp3 => header(out, b'%', count(pairs.len())),
            }
            for (name, value) in pairs {
                encode(name, proto, out);
                encode(value, proto, out);
            }
        }
        Reply::Verbatim(text) => match proto {
            Proto::Resp2 => bulk(out, b'$', &[], text.as_bytes()),
            Proto::Resp3 => bulk(out, b'=', b"txt:", text.as_bytes()),
        },
    }
}

/// The channel a `REDIRECT` target subscribes to: its invalidations come as its messages.
pub const INVALIDATE_CHANNEL: &str = "__redis__:invalidate";

/// How a connection is given its invalidations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushForm {
    /// RESP3: `>2 invalidate [key]`, a null for every key.
    Push,
    /// A RESP2 connection subscribed to [`INVALIDATE_CHANNEL`]: `message __redis__:invalidate
    /// [key]`, `$-1` for every key.
    Message,
}

/// Encodes one invalidation, as Redis writes it: of `key`, or of every key (`None`).
pub fn encode_invalidation(key: Option<&str>, form: PushForm, out: &mut BytesMut) {
    match form {
        PushForm::Push => out.extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n"),
        PushForm::Message => {
            out.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n")
        }
    }
    match (key, form) {
        (Some(key), _) => {
            out.extend_from_slice(b"*1\r\n");
            bulk(out, b'$', &[], key.as_bytes());
        }
        (None, PushForm::Push) => out.extend_from_slice(b"_\r\n"),
        (None, PushForm::Message) => out.extend_from_slice(b"$-1\r\n"),
    }
}

/// A length as a RESP header carries it.
fn count(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

/// `kind`, `text` with CR and LF replaced by spaces, `\r\n`.
fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.extend_from_slice(&[kind]);
    if text.iter().any(|byte| matches!(byte, b'\r' | b'\n')) {
        out.extend(text.iter().map(|byte| match byte {
            b'\r' | b'\n' => b' ',
            other => *other,
        }));
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

/// `kind`, `value` in decimal, `\r\n`.
fn header(out: &mut BytesMut, kind: u8, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        // The remainder is below 10.
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.reserve(digits.len() - at + 4);
    out.extend_from_slice(&[kind]);
    if value < 0 {
        out.extend_from_slice(b"-");
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// A length-prefixed string of `kind` whose content is `prefix` then `body`.
fn bulk(out: &mut BytesMut, kind: u8, prefix: &[u8], body: &[u8]) {
    header(out, kind, count(prefix.len() + body.len()));
    out.reserve(prefix.len() + body.len() + 2);
    out.extend_from_slice(prefix);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
