//! How a command's arguments become its struct: [`Args`], a cursor over the arguments after the
//! name (mini-redis's `Parse`), and the traits a command's struct implements ([`Parse`], then
//! [`Local`] or [`Store`]) so the table can run it ([`Run`]).
//!
//! # Invariants
//! - **Parsed once, before it runs.** A command's handler is given its struct, never the
//!   arguments: every argument is taken through the cursor, and [`Args::finish`] refuses what is
//!   left (`ERR wrong number of arguments for 'NAME' command`) once the struct is made.
//! - **Redis's words.** A missing argument answers the arity error with the command's name, a
//!   number that does not parse `ERR value is not an integer or out of range`
//!   ([`RespError::not_integer`]), an option the command does not take `ERR syntax error`
//!   ([`RespError::syntax`]); a command whose own texts differ says so where it parses.
//! - **No copies.** The cursor moves each argument out of the frame: an argument is a slice of
//!   the read buffer, so taking one neither allocates nor copies (what keeps one past its reply
//!   must copy it; see `resp::conn`).

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;

use bytes::Bytes;

use super::errors::RespError;
use super::{ConnState, Door};
use crate::deadline::Deadline;
use crate::resp::reply::Reply;

/// The arguments of one command after its name, taken in order.
#[derive(Debug)]
pub(crate) struct Args {
    /// The command's name as the table spells it (lowercase): the arity error names it.
    name: &'static str,
    /// The arguments not taken yet.
    rest: std::vec::IntoIter<Bytes>,
}

impl Args {
    /// The cursor over `args` (`args[0]` the name, as sent) of the command `name`.
    pub(crate) fn new(name: &'static str, args: Vec<Bytes>) -> Args {
        let mut rest = args.into_iter();
        rest.next();
        Args { name, rest }
    }

    /// The command's name, lowercase.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The next argument; when there is none, the arity error.
    pub(crate) fn next_bytes(&mut self) -> Result<Bytes, RespError> {
        self.rest.next().ok_or_else(|| RespError::arity(self.name))
    }

    /// The next argument, if there is one (an optional argument).
    pub(crate) fn next_optional(&mut self) -> Option<Bytes> {
        self.rest.next()
    }

    /// The next argument as an integer of type `T`.
    pub(crate) fn next_int<T: FromStr>(&mut self) -> Result<T, RespError> {
        integer(&self.next_bytes()?)
    }

    /// The next argument as an option's name, upper-cased (`None` when there is none).
    pub(crate) fn next_option(&mut self) -> Option<Vec<u8>> {
        self.rest.next().map(|arg| arg.to_ascii_uppercase())
    }

    /// Whether an argument is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.rest.len() == 0
    }

    /// How many arguments are left.
    pub(crate) fn len(&self) -> usize {
        self.rest.len()
    }

    /// Every argument left, taken (a variadic tail: `MGET key…`, `SESSION token…`).
    pub(crate) fn rest(&mut self) -> std::vec::IntoIter<Bytes> {
        std::mem::take(&mut self.rest)
    }

    /// Every argument left, dropped (the few commands that ignore what follows, as they always
    /// have: `COMMAND COUNT x`, `CLUSTER …`).
    pub(crate) fn ignore_rest(&mut self) {
        self.rest = Default::default();
    }

    /// Nothing may be left: the arity error otherwise.
    pub(crate) fn finish(&self) -> Result<(), RespError> {
        match self.is_empty() {
            true => Ok(()),
            false => Err(RespError::arity(self.name)),
        }
    }
}

/// `arg` as text, or an `ERR` naming `what` when it is not UTF-8.
pub(crate) fn text(arg: &[u8], what: &str) -> Result<String, RespError> {
    std::str::from_utf8(arg)
        .map(str::to_owned)
        .map_err(|_| RespError::err(format!("{what} is not valid UTF-8")))
}

/// `arg` as an integer of type `T`, or `ERR value is not an integer or out of range`.
pub(crate) fn integer<T: FromStr>(arg: &[u8]) -> Result<T, RespError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(RespError::not_integer)
}

/// A command's struct, made from its arguments (mini-redis's `parse_frames`). The table's runner
/// calls [`Args::finish`] after it, so a parser takes what it needs and refuses what it must.
pub(crate) trait Parse: Sized + Send + 'static {
    /// The command from `args`, or the error reply its arguments deserve.
    fn parse(args: &mut Args) -> Result<Self, RespError>;
}

/// A command answered from the connection and the door alone (no store call).
pub(crate) trait Local: Parse {
    /// Runs the command for `conn`.
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError>;
}

/// A command that reads or writes through the store, bounded by the command's deadline.
pub(crate) trait Store: Parse {
    /// Runs the command for `conn`.
    fn apply<'a>(
        self,
        door: &'a Door,
        conn: &'a mut ConnState,
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Reply, RespError>> + Send + 'a;
}

/// A store command running: boxed, so a connection's task holds a pointer, not the largest
/// command's future, while it waits for the next command.
pub(crate) type Pending<'a> = Pin<Box<dyn Future<Output = Result<Reply, RespError>> + Send + 'a>>;

/// Parses and runs a [`Local`] command (what [`Run::Local`] points at).
type LocalFn = fn(&Door, &mut ConnState, Args) -> Result<Reply, RespError>;

/// Parses a [`Store`] command and starts it (what [`Run::Store`] points at): a command its
/// arguments refuse is answered without a future.
type StoreFn = for<'a> fn(
    &'a Door,
    &'a mut ConnState,
    Args,
    Option<Deadline>,
) -> Result<Pending<'a>, RespError>;

/// How the door runs a command of the table.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Run {
    /// Parsed into its struct, then answered at once ([`Local`]).
    Local(LocalFn),
    /// Parsed into its struct, then answered through the store ([`Store`]).
    Store(StoreFn),
    /// `QUIT`: `+OK`, then the connection closes (it runs at once inside a transaction).
    Quit,
    /// `RESET`: the connection as new (it runs at once inside a transaction).
    Reset,
    /// `MULTI`: opens a transaction.
    Multi,
    /// `EXEC`: runs the transaction's queue.
    Exec,
    /// `DISCARD`: drops the transaction's queue.
    Discard,
    /// Known to Redis, refused here (never queued) with the reason.
    Refused(&'static str),
}

impl Run {
    /// How a [`Local`] command `C` runs.
    pub(crate) const fn local<C: Local>() -> Run {
        Run::Local(run_local::<C>)
    }

    /// How a [`Store`] command `C` runs.
    pub(crate) const fn store<C: Store>() -> Run {
        Run::Store(run_store::<C>)
    }
}

/// Parses `C` from `args` (refusing what is left), then runs it.
fn run_local<C: Local>(
    door: &Door,
    conn: &mut ConnState,
    mut args: Args,
) -> Result<Reply, RespError> {
    let command = C::parse(&mut args)?;
    args.finish()?;
    command.apply(door, conn)
}

/// Parses `C` from `args` (refusing what is left), then starts it.
fn run_store<'a, C: Store>(
    door: &'a Door,
    conn: &'a mut ConnState,
    mut args: Args,
    deadline: Option<Deadline>,
) -> Result<Pending<'a>, RespError> {
    let command = C::parse(&mut args)?;
    args.finish()?;
    Ok(box_in_place!(command.apply(door, conn, deadline)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(parts: &[&'static str]) -> Args {
        Args::new(
            "get",
            parts
                .iter()
                .map(|part| Bytes::from_static(part.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn the_cursor_takes_arguments_in_order_and_answers_in_redis_words() {
        let mut cursor = args(&["GET", "k", "12", "x", "opt", "a", "b"]);
        assert_eq!(cursor.name(), "get");
        assert_eq!(cursor.next_bytes().unwrap(), "k");
        assert_eq!(cursor.next_int::<u32>().unwrap(), 12);
        assert_eq!(
            cursor.next_int::<u32>().unwrap_err().line(),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(cursor.next_option().unwrap(), b"OPT");
        assert_eq!(cursor.len(), 2);
        assert_eq!(
            cursor.finish().unwrap_err().line(),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(cursor.rest().collect::<Vec<_>>(), ["a", "b"]);
        assert!(cursor.is_empty() && cursor.finish().is_ok());
        assert_eq!(cursor.next_optional(), None);
        assert_eq!(
            cursor.next_bytes().unwrap_err().line(),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            text(b"\xff", "a class name").unwrap_err().line(),
            "ERR a class name is not valid UTF-8"
        );
    }
}
