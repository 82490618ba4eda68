//! HELLO, AUTH and tokens, the connection commands, unknown commands, COMMAND and CONFIG, RESET.

use super::*;

#[tokio::test]
async fn hello_switches_the_protocol_and_answers_what_redis_answers() {
    let door = door();
    let mut conn = ConnState::new(7);
    let hello = run(&door, &mut conn, &["HELLO", "3"]).await;
    assert_eq!(conn.proto, Proto::Resp3);
    assert_eq!(field(&hello, "server"), &bulk("redis"));
    assert_eq!(field(&hello, "version"), &bulk("7.4.0"));
    assert_eq!(field(&hello, "proto"), &Reply::Int(3));
    assert_eq!(field(&hello, "id"), &Reply::Int(7));
    assert_eq!(field(&hello, "mode"), &bulk("standalone"));
    assert_eq!(field(&hello, "role"), &bulk("master"));
    assert_eq!(field(&hello, "modules"), &Reply::Array(vec![]));
    assert_eq!(
        run(&door, &mut conn, &["hello", "4"]).await,
        err("NOPROTO unsupported protocol version")
    );
    assert_eq!(
        run(&door, &mut conn, &["hello", "x"]).await,
        err("ERR Protocol version is not an integer or out of range")
    );
    assert_eq!(
        run(&door, &mut conn, &["hello", "3", "FOO"]).await,
        err("ERR Syntax error in HELLO option 'FOO'")
    );
    assert_eq!(conn.proto, Proto::Resp3, "a refused HELLO changes nothing");
    run(
        &door,
        &mut conn,
        &["HELLO", "2", "AUTH", "default", "any", "SETNAME", "svc"],
    )
    .await;
    assert_eq!(
        (conn.proto, conn.name.as_deref()),
        (Proto::Resp2, Some("svc"))
    );
    let again = run(&door, &mut conn, &["HELLO"]).await;
    assert_eq!(field(&again, "proto"), &Reply::Int(2));
}

#[tokio::test]
async fn tokens_are_asked_for_checked_and_scoped_per_command() {
    let door = door_with_tokens();
    let mut conn = ConnState::new(1);
    let noauth = err("NOAUTH Authentication required.");
    assert_eq!(run(&door, &mut conn, &["GET", "p:1"]).await, noauth);
    assert_eq!(run(&door, &mut conn, &["PING"]).await, noauth);
    assert!(error_text(&run(&door, &mut conn, &["HELLO", "3"]).await)
        .starts_with("NOAUTH HELLO must be called with the client already authenticated"));
    let wrongpass = err("WRONGPASS invalid username-password pair or user is disabled.");
    assert_eq!(
        run(&door, &mut conn, &["HELLO", "3", "AUTH", "default", "nope"]).await,
        wrongpass
    );
    assert_eq!(conn.proto, Proto::Resp2);
    assert_eq!(
        run(&door, &mut conn, &["AUTH", "bob", READER]).await,
        wrongpass
    );
    let hello = run(&door, &mut conn, &["HELLO", "3", "AUTH", "default", READER]).await;
    assert_eq!(field(&hello, "proto"), &Reply::Int(3));
    assert_eq!(run(&door, &mut conn, &["GET", "p:1"]).await, Reply::Nil);
    assert_eq!(
        run(&door, &mut conn, &["SET", "a:1", "v"]).await,
        err("NOPERM User reader has no permissions to run the 'set' command (the token lacks the write scope)")
    );
    assert!(door.still_authorized(&conn));
    let mut writer = ConnState::new(2);
    assert_eq!(run(&door, &mut writer, &["AUTH", WRITER]).await, Reply::OK);
    assert_eq!(
        run(&door, &mut writer, &["SET", "a:1", "v"]).await,
        Reply::OK
    );
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, bulk("v"));
    // A reload drops the writer's token and changes nothing of the reader's.
    door.core()
        .tokens()
        .store(tokens(&format!("plain:{READER} read # reader\n")));
    assert!(door.still_authorized(&conn));
    assert!(!door.still_authorized(&writer));
    // Another reload gives the reader's token another scope: it must authenticate again.
    door.core()
        .tokens()
        .store(tokens(&format!("plain:{READER} read,write # reader\n")));
    assert!(!door.still_authorized(&conn));
    // QUIT needs no token.
    let mut stranger = ConnState::new(3);
    let quit = door
        .execute(&mut stranger, vec![Bytes::from("QUIT")], None)
        .await;
    assert_eq!(quit, (Reply::OK, After::Close));
}

#[tokio::test]
async fn without_tokens_no_command_needs_one_and_auth_says_ok() {
    let door = door();
    let mut conn = ConnState::new(1);
    assert_eq!(
        run(&door, &mut conn, &["AUTH", "whatever"]).await,
        Reply::OK
    );
    assert_eq!(
        run(&door, &mut conn, &["AUTH", "default", "x"]).await,
        Reply::OK
    );
    assert_eq!(run(&door, &mut conn, &["GET", "p:1"]).await, Reply::Nil);
    assert!(door.still_authorized(&conn));
}

#[tokio::test]
async fn connection_commands_answer_as_redis_does() {
    let door = door();
    let mut conn = ConnState::new(9);
    assert_eq!(
        run(&door, &mut conn, &["PING"]).await,
        Reply::Simple("PONG")
    );
    assert_eq!(run(&door, &mut conn, &["ping", "hi"]).await, bulk("hi"));
    assert_eq!(run(&door, &mut conn, &["ECHO", "x y"]).await, bulk("x y"));
    assert_eq!(run(&door, &mut conn, &["SELECT", "0"]).await, Reply::OK);
    assert_eq!(
        run(&door, &mut conn, &["SELECT", "1"]).await,
        err("ERR DB index is out of range")
    );
    assert_eq!(
        run(&door, &mut conn, &["SELECT", "x"]).await,
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "SETNAME", "svc"]).await,
        Reply::OK
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "GETNAME"]).await,
        bulk("svc")
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "SETNAME", "a b"]).await,
        err("ERR Client names cannot contain spaces, newlines or special characters.")
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "ID"]).await,
        Reply::Int(9)
    );
    for setinfo in [["LIB-NAME", "redis-py"], ["lib-ver", "5.0.1"]] {
        let reply = run(
            &door,
            &mut conn,
            &["CLIENT", "SETINFO", setinfo[0], setinfo[1]],
        )
        .await;
        assert_eq!(reply, Reply::OK);
    }
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "SETINFO", "colour", "x"]).await,
        err("ERR Unrecognized option 'colour'")
    );
    let Reply::Verbatim(info) = run(&door, &mut conn, &["CLIENT", "INFO"]).await else {
        panic!("CLIENT INFO is a verbatim string");
    };
    assert!(info.starts_with("id=9 name=svc db=0"), "{info}");
    assert!(
        info.contains("lib-name=redis-py lib-ver=5.0.1 resp=2"),
        "{info}"
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "NO-EVICT", "on"]).await,
        Reply::OK
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "NO-TOUCH", "off"]).await,
        Reply::OK
    );
    // RESP2 cannot be pushed to: tracking needs HELLO 3 or a REDIRECT target.
    let refused = run(&door, &mut conn, &["CLIENT", "TRACKING", "on"]).await;
    assert!(
        error_text(&refused).contains("HELLO 3") && error_text(&refused).contains("REDIRECT"),
        "{refused:?}"
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "KILL", "x"]).await,
        err("ERR unknown subcommand 'KILL'. Try CLIENT HELP.")
    );
    assert_eq!(
        run(&door, &mut conn, &["CLIENT", "SETNAME"]).await,
        err("ERR wrong number of arguments for 'client|setname' command")
    );
    assert_eq!(
        run(&door, &mut conn, &["CLUSTER", "SLOTS"]).await,
        err("ERR This instance has cluster support disabled")
    );
    for refused in [
        &["SUBSCRIBE", "c"][..],
        &["PSUBSCRIBE", "c*"],
        &["SSUBSCRIBE", "c"],
        &["MONITOR"],
        &["WATCH", "k"],
    ] {
        let reply = run(&door, &mut conn, refused).await;
        assert!(
            error_text(&reply).contains("not supported by hotsplit"),
            "{reply:?}"
        );
    }
}

#[tokio::test]
async fn an_unknown_command_is_worded_as_redis_words_it_and_the_connection_goes_on() {
    let door = door();
    let mut conn = ConnState::new(1);
    let (reply, after) = door
        .execute(
            &mut conn,
            vec![Bytes::from("FOO"), Bytes::from("a"), Bytes::from("b")],
            None,
        )
        .await;
    assert_eq!(
        (reply, after),
        (
            err("ERR unknown command 'FOO', with args beginning with: 'a' 'b' "),
            After::Continue
        )
    );
    assert_eq!(
        run(&door, &mut conn, &["nope"]).await,
        err("ERR unknown command 'nope', with args beginning with: ")
    );
    let long = "x".repeat(300);
    let text = error_text(&run(&door, &mut conn, &["FOO", &long, "next"]).await).to_owned();
    assert!(text.ends_with(&format!("'{}' ", "x".repeat(128))), "{text}");
    assert_eq!(
        run(&door, &mut conn, &["GET"]).await,
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        run(&door, &mut conn, &["get", "a", "b"]).await,
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        run(&door, &mut conn, &["PING"]).await,
        Reply::Simple("PONG")
    );
}

#[tokio::test]
async fn command_info_and_config_answer_what_clients_probe() {
    let door = door();
    let mut conn = ConnState::new(1);
    assert_eq!(
        run(&door, &mut conn, &["COMMAND", "COUNT"]).await,
        Reply::Int(table::TABLE.len() as i64)
    );
    assert_eq!(
        run(&door, &mut conn, &["COMMAND", "DOCS"]).await,
        Reply::Map(vec![])
    );
    let Reply::Array(all) = run(&door, &mut conn, &["COMMAND"]).await else {
        panic!("COMMAND is an array");
    };
    assert_eq!(all.len(), table::TABLE.len());
    let Reply::Array(info) = run(&door, &mut conn, &["COMMAND", "INFO", "get", "nope"]).await
    else {
        panic!("COMMAND INFO is an array");
    };
    let Reply::Array(get) = &info[0] else {
        panic!("an entry is an array");
    };
    assert_eq!(
        (&get[0], &get[1], get.len()),
        (&bulk("get"), &Reply::Int(2), 10)
    );
    assert_eq!(info[1], Reply::Nil);
    let Reply::Verbatim(text) = run(&door, &mut conn, &["INFO"]).await else {
        panic!("INFO is a verbatim string");
    };
    for line in [
        "# Server\r\n",
        "redis_version:7.4.0\r\n",
        "hotsplit_version:",
        "# Clients\r\n",
        "loading:0\r\n",
        "# Stats\r\n",
        "# Hotsplit\r\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let Reply::Verbatim(server) = run(&door, &mut conn, &["INFO", "server"]).await else {
        panic!("INFO is a verbatim string");
    };
    assert!(server.contains("redis_version") && !server.contains("# Stats"));
    assert_eq!(
        run(&door, &mut conn, &["CONFIG", "GET", "save"]).await,
        Reply::Map(vec![(bulk("save"), bulk(""))])
    );
    assert_eq!(
        run(&door, &mut conn, &["CONFIG", "GET", "appendonly"]).await,
        Reply::Map(vec![(bulk("appendonly"), bulk("no"))])
    );
    assert_eq!(
        run(&door, &mut conn, &["CONFIG", "GET", "maxmemory"]).await,
        Reply::Map(vec![])
    );
    let Reply::Map(every) = run(&door, &mut conn, &["CONFIG", "GET", "*"]).await else {
        panic!("CONFIG GET is a map");
    };
    assert_eq!(every.len(), 3);
    assert!(
        error_text(&run(&door, &mut conn, &["CONFIG", "SET", "save", ""]).await)
            .starts_with("ERR CONFIG SET is not supported")
    );
}

#[tokio::test]
async fn reset_forgets_everything_but_the_id_and_sessions_move_between_connections() {
    let door = door_with_tokens();
    let mut conn = ConnState::new(4);
    run(
        &door,
        &mut conn,
        &["HELLO", "3", "AUTH", "default", WRITER, "SETNAME", "n"],
    )
    .await;
    run(&door, &mut conn, &["HOTSPLIT.CLIENT", "alice"]).await;
    run(&door, &mut conn, &["HOTSPLIT.CLASS", "primary"]).await;
    run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "3", "v"]).await;
    let Reply::Bulk(token) = run(&door, &mut conn, &["HOTSPLIT.SESSION"]).await else {
        panic!("the session token is a bulk string");
    };
    assert!(!conn.session.floors().is_empty());
    run(&door, &mut conn, &["MULTI"]).await;
    assert_eq!(
        run(&door, &mut conn, &["RESET"]).await,
        Reply::Simple("RESET")
    );
    assert_eq!(conn.id, 4);
    assert_eq!(conn.proto, Proto::Resp2);
    assert!(conn.auth.is_none() && conn.name.is_none() && conn.client.is_none());
    assert!(conn.class.is_none() && !conn.in_transaction());
    assert!(conn.session.floors().is_empty());
    assert_eq!(
        run(&door, &mut conn, &["GET", "p:1"]).await,
        err("NOAUTH Authentication required.")
    );
    let mut other = ConnState::new(5);
    run(&door, &mut other, &["AUTH", READER]).await;
    let token = String::from_utf8(token.to_vec()).unwrap();
    assert_eq!(
        run(&door, &mut other, &["HOTSPLIT.SESSION", &token]).await,
        Reply::OK
    );
    assert_eq!(other.session.floors().len(), 1);
    assert_eq!(
        run(&door, &mut other, &["HOTSPLIT.SESSION", "garbage"]).await,
        Reply::OK
    );
    assert!(other.session.floors().is_empty());
}
