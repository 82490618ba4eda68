//! Edge inputs of every command's parser, alone and queued in a transaction: the replies
//! (`parse_edges.txt`) are pinned as the door answered them before commands were parsed into
//! structs — error texts, and which error wins when an input breaks two rules.

use super::*;

/// Each input, as sent on one fresh connection after its setup.
const EDGES: &[&[&str]] = &[
    &["GET"],
    &["GET", "a", "b"],
    &["get", "p:\u{1}"],
    &["MGET", "p:{", "p:#"],
    &["EXISTS"],
    &["TTL", "p:1", "x"],
    &["PTTL", "p:{"],
    &["SET", "a:1"],
    &["SET", "p:{", "v", "NX"],
    &["SET", "p:{", "v"],
    &["DEL", "a:1", "p:{"],
    &["UNLINK", "p:1"],
    &["HOTSPLIT.READ", "p:1", "CLASS"],
    &["HOTSPLIT.READ", "p:{", "CLASS", "x", "CLASS", "y"],
    &["HOTSPLIT.READ", "p:{", "MINVERSION", "0"],
    &["HOTSPLIT.READ", "p:{", "MINVERSION", "x", "CLASS", "\u{ff}"],
    &["HOTSPLIT.READ", "p:1", "CLIENT", ""],
    &["HOTSPLIT.READ", "p:{", "session"],
    &[
        "HOTSPLIT.READ",
        "p:1",
        "MinVersion",
        "1",
        "SESSION",
        "x",
        "y",
    ],
    &["HOTSPLIT.PUBLISH", "p:{", "x", "v"],
    &["HOTSPLIT.PUBLISH", "p:1", "x", "v", "SYNC"],
    &["HOTSPLIT.PUBLISH", "p:1", "1", "v", "SYNC", "1"],
    &[
        "HOTSPLIT.PUBLISH",
        "p:1",
        "1",
        "v",
        "SYNC",
        "x",
        "2",
        "extra",
    ],
    &[
        "HOTSPLIT.PUBLISH",
        "p:1",
        "1",
        "v",
        "SYNC",
        "x",
        "2",
        "SESSION",
        "t",
    ],
    &["HOTSPLIT.PUBLISH", "p:1", "1", "v", "SYNC", "1", "SESSION"],
    &[
        "HOTSPLIT.PUBLISH",
        "p:1",
        "1",
        "v",
        "sync",
        "4294967296",
        "1",
    ],
    &[
        "HOTSPLIT.PUBLISH",
        "p:1",
        "1",
        "v",
        "SYNC",
        "1",
        "2",
        "SYNC",
        "1",
        "2",
    ],
    &["HOTSPLIT.PUBLISH", "p:1", "1", "v", "x", "SESSION"],
    &["HOTSPLIT.PUBLISH", "p:1", "1", "v", "SYNC", "-1", "2"],
    &["HOTSPLIT.INVALIDATE", "p:{", "0", "x"],
    &["HOTSPLIT.INVALIDATE", "p:{", "0"],
    &["HOTSPLIT.INVALIDATE", "p:1", "0", "SESSION"],
    &["HOTSPLIT.INVALIDATE", "p:1"],
    &["HELLO", "x", "FOO"],
    &["HELLO", "3", "AUTH", "default"],
    &["HELLO", "3", "SETNAME"],
    &["HELLO", "3", "SETNAME", "a b"],
    &["HELLO", "2", "auth", "default", "x", "setname", "n"],
    &["AUTH"],
    &["AUTH", "a", "b", "c"],
    &["AUTH", "x"],
    &["PING", "a", "b"],
    &["PING", "a"],
    &["ECHO"],
    &["SELECT", "x"],
    &["SELECT", "1"],
    &["SELECT", "0"],
    &["QUIT", "x"],
    &["RESET", "x"],
    &["CLIENT"],
    &["CLIENT", "SETNAME"],
    &["CLIENT", "SETNAME", "a b"],
    &["CLIENT", "SETNAME", ""],
    &["CLIENT", "GETNAME", "x"],
    &["CLIENT", "ID", "x"],
    &["CLIENT", "INFO", "x"],
    &["CLIENT", "SETINFO", "LIB-NAME"],
    &["CLIENT", "SETINFO", "FOO", "a b"],
    &["CLIENT", "SETINFO", "FOO", "ab"],
    &["CLIENT", "setinfo", "lib-ver", "1.0"],
    &["CLIENT", "NO-EVICT"],
    &["CLIENT", "NO-TOUCH", "maybe"],
    &["CLIENT", "no-touch", "on"],
    &["CLIENT", "TRACKING", "on", "x", "y"],
    &["CLIENT", "FOO\r\nBAR"],
    &["COMMAND", "COUNT", "x"],
    &["COMMAND", "LIST", "x"],
    &["COMMAND", "DOCS", "get"],
    &["COMMAND", "INFO", "get", "nope"],
    &["COMMAND", "FOO"],
    &["INFO", "persistence", "REPLICATION"],
    &["CONFIG", "SET", "x", "y"],
    &["CONFIG", "get"],
    &["CONFIG", "GET", "save", "d*"],
    &["CLUSTER", "INFO"],
    &["MULTI", "x"],
    &["EXEC", "x"],
    &["DISCARD", "x"],
    &["UNWATCH", "x"],
    &["UNWATCH"],
    &["HOTSPLIT.CLIENT", "a", "b"],
    &["HOTSPLIT.CLIENT", "a b"],
    &["HOTSPLIT.CLASS", ""],
    &["HOTSPLIT.SESSION", "x", "y"],
    &["WATCH"],
    &["WATCH", "k"],
    &["MONITOR", "x"],
    &["FLUSHALL", "a", "b"],
    &[],
];

#[tokio::test]
async fn every_parser_answers_its_edges_as_it_always_has() {
    let door = door();
    let mut lines = Vec::new();
    for edge in EDGES {
        let mut conn = ConnState::new(1);
        let reply = run(&door, &mut conn, edge).await;
        lines.push(format!("{edge:?} => {reply:?}"));
    }
    // The same inputs queued in a transaction: each is queued or refused, then EXEC.
    for edge in EDGES.iter().filter(|edge| !edge.is_empty()) {
        let mut conn = ConnState::new(1);
        run(&door, &mut conn, &["MULTI"]).await;
        let queued = run(&door, &mut conn, edge).await;
        let exec = run(&door, &mut conn, &["EXEC"]).await;
        lines.push(format!("MULTI {edge:?} => {queued:?} EXEC => {exec:?}"));
    }
    // A session token is random (each door has its own key): only its place is compared.
    let token = mask_tokens(&lines.join("\n"));
    let expected = include_str!("parse_edges.txt");
    for (got, want) in token.lines().zip(expected.lines()) {
        assert_eq!(got, want);
    }
    assert_eq!(token.lines().count(), expected.lines().count());
}

/// `text` with every `session` field's token replaced by `TOKEN`.
fn mask_tokens(text: &str) -> String {
    const FIELD: &str = "(Bulk(b\"session\"), Bulk(b\"";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(FIELD) {
        out.push_str(&rest[..at]);
        out.push_str("(Bulk(b\"session\"), TOKEN)");
        let after = &rest[at + FIELD.len()..];
        let end = after.find("\"))").map_or(after.len(), |end| end + 3);
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}
