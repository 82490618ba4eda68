//! MULTI, EXEC, DISCARD and WATCH, and the getters, listings and QUIT inside a transaction.

use super::*;

#[tokio::test]
async fn multi_queues_exec_runs_in_order_and_a_bad_queued_command_aborts() {
    let door = door();
    let mut conn = ConnState::new(1);
    assert_eq!(
        run(&door, &mut conn, &["EXEC"]).await,
        err("ERR EXEC without MULTI")
    );
    assert_eq!(
        run(&door, &mut conn, &["DISCARD"]).await,
        err("ERR DISCARD without MULTI")
    );
    assert_eq!(run(&door, &mut conn, &["MULTI"]).await, Reply::OK);
    assert_eq!(
        run(&door, &mut conn, &["MULTI"]).await,
        err("ERR MULTI calls can not be nested")
    );
    let queued = Reply::Simple("QUEUED");
    assert_eq!(run(&door, &mut conn, &["SET", "a:1", "x"]).await, queued);
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, queued);
    assert_eq!(run(&door, &mut conn, &["GET", "p:{"]).await, queued);
    let exec = run(&door, &mut conn, &["EXEC"]).await;
    let Reply::Array(replies) = exec else {
        panic!("EXEC answers an array: {exec:?}");
    };
    assert_eq!(replies[..2], [Reply::OK, bulk("x")]);
    assert!(error_text(&replies[2]).starts_with("ERR invalid key"));
    assert!(!conn.in_transaction());
    let abort = err("EXECABORT Transaction discarded because of previous errors.");
    for bad in [&["FOO"][..], &["GET"], &["WATCH", "k"]] {
        run(&door, &mut conn, &["MULTI"]).await;
        assert_eq!(run(&door, &mut conn, &["SET", "a:1", "y"]).await, queued);
        assert!(matches!(run(&door, &mut conn, bad).await, Reply::Error(_)));
        assert_eq!(run(&door, &mut conn, &["EXEC"]).await, abort);
    }
    assert_eq!(
        run(&door, &mut conn, &["GET", "a:1"]).await,
        bulk("x"),
        "nothing ran"
    );
    run(&door, &mut conn, &["MULTI"]).await;
    run(&door, &mut conn, &["SET", "a:1", "z"]).await;
    assert_eq!(run(&door, &mut conn, &["DISCARD"]).await, Reply::OK);
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, bulk("x"));
    assert_eq!(run(&door, &mut conn, &["UNWATCH"]).await, Reply::OK);
}

#[tokio::test]
async fn getters_listings_and_quit_inside_a_transaction() {
    let door = door();
    let mut conn = ConnState::new(1);
    assert_eq!(run(&door, &mut conn, &["HOTSPLIT.CLASS"]).await, Reply::Nil);
    run(&door, &mut conn, &["HOTSPLIT.CLASS", "primary"]).await;
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLASS"]).await,
        bulk("primary")
    );
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLIENT"]).await,
        Reply::Nil
    );
    assert!(
        error_text(&run(&door, &mut conn, &["HOTSPLIT.CLIENT", "a b"]).await)
            .starts_with("ERR a client id must be")
    );
    let Reply::Array(names) = run(&door, &mut conn, &["COMMAND", "LIST"]).await else {
        panic!("COMMAND LIST is an array");
    };
    assert!(names.contains(&bulk("hotsplit.read")) && names.contains(&bulk("get")));
    assert_eq!(
        run(&door, &mut conn, &["COMMAND", "NOPE"]).await,
        err("ERR unknown subcommand 'NOPE'. Try COMMAND HELP.")
    );
    assert_eq!(
        run(&door, &mut conn, &["ECHO"]).await,
        err("ERR wrong number of arguments for 'echo' command")
    );
    run(&door, &mut conn, &["MULTI"]).await;
    let quit = door
        .execute(&mut conn, vec![Bytes::from("QUIT")], None)
        .await;
    assert_eq!(quit, (Reply::OK, After::Close), "QUIT is not queued");
}

#[tokio::test]
async fn exec_stops_at_a_revoked_token() {
    let door = door_with_tokens();
    let mut conn = ConnState::new(1);
    assert_eq!(run(&door, &mut conn, &["AUTH", WRITER]).await, Reply::OK);
    assert_eq!(run(&door, &mut conn, &["MULTI"]).await, Reply::OK);
    let queued = Reply::Simple("QUEUED");
    assert_eq!(run(&door, &mut conn, &["SET", "a:rev", "x"]).await, queued);
    // A reload drops the writer's token before EXEC runs.
    door.core()
        .tokens()
        .store(tokens(&format!("plain:{READER} read # reader\n")));
    let args = ["EXEC"].iter().map(|part| Bytes::from(*part)).collect();
    let (reply, after) = door.execute(&mut conn, args, None).await;
    assert!(
        error_text(&reply).contains("EXEC stopped before queued command 1 of 1"),
        "{reply:?}"
    );
    assert_eq!(after, After::Close);
    let mut reader = ConnState::new(2);
    assert_eq!(run(&door, &mut reader, &["AUTH", READER]).await, Reply::OK);
    assert_eq!(run(&door, &mut reader, &["GET", "a:rev"]).await, Reply::Nil);
}

#[tokio::test]
async fn a_queue_over_its_bytes_is_dropped_and_an_exec_over_its_reply_bound_fails_whole() {
    let budgets = Budgets {
        max_reply_bytes: 700,
        max_queued_bytes: 1000,
    };
    let metrics = crate::resp::metrics::RespMetrics::register(&Metrics::new());
    let door = door().with_budgets(budgets, metrics);
    let mut conn = ConnState::new(1);
    let big = "v".repeat(400);
    assert_eq!(run(&door, &mut conn, &["MULTI"]).await, Reply::OK);
    let queued = Reply::Simple("QUEUED");
    assert_eq!(run(&door, &mut conn, &["ECHO", &big]).await, queued);
    assert_eq!(run(&door, &mut conn, &["ECHO", &big]).await, queued);
    let over = run(&door, &mut conn, &["ECHO", &big]).await;
    assert!(
        error_text(&over).contains("resp.max_queued_bytes"),
        "{over:?}"
    );
    assert_eq!(
        run(&door, &mut conn, &["EXEC"]).await,
        err("EXECABORT Transaction discarded because of previous errors.")
    );
    let small = "v".repeat(250);
    run(&door, &mut conn, &["MULTI"]).await;
    for _ in 0..3 {
        assert_eq!(run(&door, &mut conn, &["ECHO", &small]).await, queued);
    }
    let exec = run(&door, &mut conn, &["EXEC"]).await;
    assert!(
        error_text(&exec).starts_with("ERR EXEC stopped after queued command 3 of 3"),
        "{exec:?}"
    );
}
