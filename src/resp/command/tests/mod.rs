//! [`Door::execute`] over the embedded store: every command and every error text the module
//! doc promises. The helpers live here; each file tests one part of the door.

use bytes::Bytes;

use super::*;
use crate::auth::Tokens;
use crate::key::{Key, Version};
use crate::metrics::Metrics;

mod command_table;
mod conn_commands;
mod parse_edges;
mod reads_writes;
mod transactions;

const READER: &str = "reader-token-0123456789";
const WRITER: &str = "writer-token-0123456789";

/// A door over the embedded store: `p:` caller-versioned with 4 copies, `a:` allocated with 4,
/// `one:` with a single copy.
fn door() -> Door {
    let text = "[[family]]\nprefix = \"p:\"\ncopies = 4\n[[family]]\nprefix = \"a:\"\ncopies = 4\nversioning = \"allocated\"\n[[family]]\nprefix = \"one:\"\ncopies = 1\n";
    crate::resp::fixture::door(text, &crate::door::ServerConfig::default())
}

fn tokens(text: &str) -> Option<Tokens> {
    Some(Tokens::parse(text).unwrap())
}

/// A door whose tokens are a reader and a writer.
fn door_with_tokens() -> Door {
    let door = door();
    door.core().tokens().store(tokens(&format!(
        "plain:{READER} read # reader\nplain:{WRITER} read,write # writer\n"
    )));
    door
}

async fn run(door: &Door, conn: &mut ConnState, parts: &[&str]) -> Reply {
    run_bytes(
        door,
        conn,
        parts.iter().map(|part| part.as_bytes()).collect(),
    )
    .await
}

async fn run_bytes(door: &Door, conn: &mut ConnState, parts: Vec<&[u8]>) -> Reply {
    let args = parts.into_iter().map(Bytes::copy_from_slice).collect();
    door.execute(conn, args, None).await.0
}

fn err(text: &str) -> Reply {
    Reply::Error(text.to_owned())
}

fn bulk(text: &str) -> Reply {
    Reply::bulk(text.to_owned())
}

/// The error text of `reply`, or a panic naming what came instead.
fn error_text(reply: &Reply) -> &str {
    match reply {
        Reply::Error(text) => text,
        other => panic!("not an error: {other:?}"),
    }
}

/// The value of `name` in a map reply.
fn field<'a>(reply: &'a Reply, name: &str) -> &'a Reply {
    let Reply::Map(fields) = reply else {
        panic!("not a map: {reply:?}");
    };
    fields
        .iter()
        .find(|(key, _)| *key == bulk(name))
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("no {name} in {reply:?}"))
}
