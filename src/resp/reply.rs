//! A reply, as a command answers it; [`super::codec`] writes it in RESP2 or RESP3.

use bytes::Bytes;

/// The protocol version a connection speaks (`HELLO 2|3`); RESP2 until a `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proto {
    /// RESP2: maps are written as flat arrays, nulls as `$-1`.
    #[default]
    Resp2,
    /// RESP3: maps, nulls `_`, verbatim strings.
    Resp3,
}

/// One reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A simple string (`+OK`).
    Simple(&'static str),
    /// A simple string built at run time (no CR or LF).
    Status(String),
    /// An error: the whole text, its prefix first (`ERR …`, `NOAUTH …`, `HOTSPLIT_FLOOR …`).
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Bytes),
    /// A null (RESP2 `$-1`, RESP3 `_`).
    Nil,
    /// An array.
    Array(Vec<Reply>),
    /// Out-of-band data (RESP3 `>`, RESP2 an array): a pub/sub confirmation or message.
    Push(Vec<Reply>),
    /// A map: RESP3 `%`, RESP2 a flat array of name, value pairs (as `HGETALL` answers).
    Map(Vec<(Reply, Reply)>),
    /// A verbatim string (RESP3 `=` with format `txt`; RESP2 a bulk string), as `INFO`
    /// answers.
    Verbatim(String),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Simple("OK");

    /// An error reply with `text` (which starts with its prefix).
    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    /// A bulk string of `text`.
    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    /// About the bytes the reply takes encoded (at least as many; headers counted at their
    /// longest): what `resp.max_reply_bytes` is checked against.
    pub fn size(&self) -> usize {
        /// A type byte, a length of up to 20 digits, CR LF, and the CR LF after a payload.
        const HEADER: usize = 25;
        match self {
            Reply::Simple(text) => HEADER + text.len(),
            Reply::Status(text) | Reply::Error(text) | Reply::Verbatim(text) => {
                HEADER + 4 + text.len()
            }
            Reply::Int(_) | Reply::Nil => HEADER,
            Reply::Bulk(bytes) => HEADER + bytes.len(),
            Reply::Array(items) | Reply::Push(items) => {
                items.iter().fold(HEADER, |sum, item| sum + item.size())
            }
            Reply::Map(pairs) => pairs.iter().fold(HEADER, |sum, (name, value)| {
                sum + name.size() + value.size()
            }),
        }
    }
}
