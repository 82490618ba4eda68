//! Reads and writes through the door: values, nils and error prefixes, affine and pooled reads, SET and DEL.

use super::*;

#[tokio::test]
async fn reads_answer_values_nil_for_missing_and_errors_with_their_prefixes() {
    let door = door();
    let mut conn = ConnState::new(1);
    let report = run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "5", "hello"]).await;
    assert_eq!(field(&report, "status"), &bulk("done"));
    assert_eq!(field(&report, "http_status"), &Reply::Int(200));
    assert_eq!(field(&report, "applied"), &Reply::Int(4));
    assert_eq!(field(&report, "version"), &Reply::Int(5));
    assert_eq!(run(&door, &mut conn, &["GET", "p:1"]).await, bulk("hello"));
    assert_eq!(run(&door, &mut conn, &["GET", "p:none"]).await, Reply::Nil);
    assert_eq!(
        run(&door, &mut conn, &["MGET", "p:1", "p:none"]).await,
        Reply::Array(vec![bulk("hello"), Reply::Nil])
    );
    let braces = run(&door, &mut conn, &["MGET", "p:1", "p:{x}"]).await;
    assert!(
        error_text(&braces).starts_with("ERR invalid key: key contains '{' at byte 2"),
        "an MGET fails whole: {braces:?}"
    );
    let hash = run(&door, &mut conn, &["GET", "p:#1"]).await;
    assert!(error_text(&hash).starts_with("ERR invalid key: key contains '#'"));
    let bytes = run_bytes(&door, &mut conn, vec![b"GET", b"p:\xff"]).await;
    assert_eq!(
        bytes,
        err("ERR invalid key: key contains a non-printable or non-ascii byte 0xff at byte 2")
    );
    let read = run(&door, &mut conn, &["HOTSPLIT.READ", "p:1"]).await;
    assert_eq!(field(&read, "value"), &bulk("hello"));
    assert_eq!(field(&read, "version"), &Reply::Int(5));
    assert_eq!(field(&read, "served_by"), &bulk("embedded"));
    let Reply::Bulk(route) = field(&read, "route") else {
        panic!("route is text");
    };
    assert!(route.starts_with(b"class="), "{route:?}");
    let floor = run(
        &door,
        &mut conn,
        &["HOTSPLIT.READ", "p:1", "MINVERSION", "9"],
    )
    .await;
    assert!(error_text(&floor).starts_with("FLOOR "), "{floor:?}");
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.READ", "p:1", "COLOUR", "red"]).await,
        err("ERR syntax error")
    );
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.READ", "p:none"]).await,
        Reply::Nil
    );
    // EXISTS decides on presence: refused where copies can disagree, answered on one copy.
    let split = run(&door, &mut conn, &["EXISTS", "p:1"]).await;
    assert!(
        error_text(&split).contains("can disagree on presence"),
        "{split:?}"
    );
    run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "one:1", "1", "x"]).await;
    assert_eq!(
        run(&door, &mut conn, &["EXISTS", "one:1", "one:2", "one:1"]).await,
        Reply::Int(2)
    );
    let Reply::Int(pttl) = run(&door, &mut conn, &["PTTL", "p:1"]).await else {
        panic!("PTTL is an integer");
    };
    let Reply::Int(ttl) = run(&door, &mut conn, &["TTL", "p:1"]).await else {
        panic!("TTL is an integer");
    };
    assert!(
        pttl > 0 && ttl > 0 && (ttl - pttl / 1000).abs() <= 1,
        "{ttl} {pttl}"
    );
    assert_eq!(
        run(&door, &mut conn, &["TTL", "p:none"]).await,
        Reply::Int(-2)
    );
    let gone = run(&door, &mut conn, &["HOTSPLIT.INVALIDATE", "p:1", "6"]).await;
    assert_eq!(field(&gone, "status"), &bulk("done"));
    assert_eq!(
        run(&door, &mut conn, &["GET", "p:1"]).await,
        Reply::Nil,
        "a tombstone is nil"
    );
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLASS", "nope"]).await,
        Reply::OK
    );
    let unknown = run(&door, &mut conn, &["GET", "p:1"]).await;
    assert!(
        error_text(&unknown).starts_with("ERR unknown read class"),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn an_explicit_client_reads_its_affine_copy_and_a_pooled_one_the_high_water() {
    let door = door();
    let mut conn = ConnState::new(1);
    run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "5", "v"]).await;
    let key = Key::parse("p:1").unwrap();
    let ops = door.core().ops();
    assert_eq!(
        ops.high_water().floor(&key, crate::store::now_unix_ms()),
        Version::new(5).ok().map(crate::ops::Mark::Exact)
    );
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLIENT", "alice"]).await,
        Reply::OK
    );
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLIENT"]).await,
        bulk("alice")
    );
    let read = run(&door, &mut conn, &["HOTSPLIT.READ", "p:1"]).await;
    let affine = ops.reader().affinity(&key, "alice").copy;
    assert_eq!(field(&read, "copy"), &Reply::Int(i64::from(affine)));
    let bob = run(&door, &mut conn, &["HOTSPLIT.READ", "p:1", "CLIENT", "bob"]).await;
    let affine = ops.reader().affinity(&key, "bob").copy;
    assert_eq!(field(&bob, "copy"), &Reply::Int(i64::from(affine)));
    // The instance has (over-)stated a higher version than any copy holds: a pooled
    // connection's read refuses to go below it, an explicit client's does not use it.
    let now = crate::store::now_unix_ms();
    ops.high_water()
        .record(&key, Version::new(99).unwrap(), now + 60_000, now);
    let mut pooled = ConnState::new(2);
    let below = run(&door, &mut pooled, &["GET", "p:1"]).await;
    assert!(error_text(&below).starts_with("FLOOR "), "{below:?}");
    assert_eq!(run(&door, &mut conn, &["GET", "p:1"]).await, bulk("v"));
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.CLIENT", ""]).await,
        Reply::OK
    );
    assert!(error_text(&run(&door, &mut conn, &["GET", "p:1"]).await).starts_with("FLOOR "));
}

#[tokio::test]
async fn set_and_del_work_on_allocated_families_and_name_publish_on_caller_ones() {
    let door = door();
    let mut conn = ConnState::new(1);
    assert_eq!(
        run(&door, &mut conn, &["SET", "a:1", "one"]).await,
        Reply::OK
    );
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, bulk("one"));
    assert_eq!(
        run(&door, &mut conn, &["set", "a:1", "two"]).await,
        Reply::OK
    );
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, bulk("two"));
    assert!(
        error_text(&run(&door, &mut conn, &["SET", "a:1", "x", "EX", "10"]).await)
            .starts_with("ERR SET option 'EX' is not supported by hotsplit")
    );
    let caller = run(&door, &mut conn, &["SET", "p:1", "x"]).await;
    assert!(
        error_text(&caller).contains("HOTSPLIT.PUBLISH"),
        "{caller:?}"
    );
    let del = run(&door, &mut conn, &["DEL", "p:1"]).await;
    assert!(error_text(&del).contains("HOTSPLIT.INVALIDATE"), "{del:?}");
    run(&door, &mut conn, &["SET", "a:2", "x"]).await;
    assert_eq!(
        run(&door, &mut conn, &["DEL", "a:1", "a:2"]).await,
        Reply::Int(2)
    );
    assert_eq!(run(&door, &mut conn, &["GET", "a:1"]).await, Reply::Nil);
    assert_eq!(
        run(&door, &mut conn, &["UNLINK", "a:2"]).await,
        Reply::Int(1)
    );
    let allocated = run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "a:3", "*", "x"]).await;
    assert_eq!(field(&allocated, "status"), &bulk("done"));
    assert!(
        error_text(&run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "a:3", "4", "x"]).await)
            .contains("send * as the version")
    );
    assert!(
        error_text(&run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "*", "x"]).await)
            .contains("send the version")
    );
    assert!(
        error_text(&run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "0", "x"]).await)
            .starts_with("ERR invalid version '0'")
    );
    assert_eq!(
        run(
            &door,
            &mut conn,
            &["HOTSPLIT.PUBLISH", "p:1", "1", "x", "SYNC", "1"]
        )
        .await,
        err("ERR syntax error")
    );
    run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "5", "x"]).await;
    let stale = run(&door, &mut conn, &["HOTSPLIT.PUBLISH", "p:1", "4", "y"]).await;
    assert_eq!(
        (field(&stale, "status"), field(&stale, "http_status")),
        (&bulk("stale"), &Reply::Int(409))
    );
}

/// The text of a bulk reply.
fn bulk_text(reply: &Reply) -> String {
    match reply {
        Reply::Bulk(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
        other => panic!("not a bulk string: {other:?}"),
    }
}

/// How many floors a token holds, from its length (1 + 25 n + 8 bytes, base64url).
fn floors_in(token: &str) -> usize {
    (token.len() * 3 / 4 - 9) / 25
}

#[tokio::test]
async fn a_per_call_session_merges_its_tokens_answers_its_own_and_leaves_the_connections_alone() {
    let door = door();
    let mut conn = ConnState::new(1);
    let before = run(&door, &mut conn, &["HOTSPLIT.SESSION"]).await;
    // Two writes that each start from no token, as two concurrent calls of one scope.
    let first = run(
        &door,
        &mut conn,
        &["HOTSPLIT.PUBLISH", "p:s1", "3", "x", "SESSION"],
    )
    .await;
    assert_eq!(field(&first, "status"), &bulk("done"));
    let first = bulk_text(field(&first, "session"));
    let second = run(
        &door,
        &mut conn,
        &["HOTSPLIT.PUBLISH", "p:s2", "4", "y", "session"],
    )
    .await;
    // SESSION may follow SYNC (the embedded store has no replica to wait for).
    let synced = run(
        &door,
        &mut conn,
        &[
            "HOTSPLIT.PUBLISH",
            "p:s2",
            "4",
            "y",
            "SYNC",
            "0",
            "10",
            "SESSION",
        ],
    )
    .await;
    assert!(error_text(&synced).contains("sync_replicas"), "{synced:?}");
    let second = bulk_text(field(&second, "session"));
    assert_eq!((floors_in(&first), floors_in(&second)), (1, 1));
    // The connection's own session saw none of it.
    assert_eq!(run(&door, &mut conn, &["HOTSPLIT.SESSION"]).await, before);
    // A read sending both keeps both floors and adds its own; a miss still answers the token.
    let read = run(
        &door,
        &mut conn,
        &[
            "HOTSPLIT.READ",
            "p:s3",
            "CLIENT",
            "c1",
            "SESSION",
            &first,
            &second,
        ],
    )
    .await;
    assert_eq!(field(&read, "value"), &Reply::Nil);
    let merged = bulk_text(field(&read, "session"));
    assert_eq!(floors_in(&merged), 2);
    let read = run(
        &door,
        &mut conn,
        &["HOTSPLIT.READ", "p:s1", "SESSION", &merged],
    )
    .await;
    assert_eq!(field(&read, "value"), &bulk("x"));
    assert_eq!(floors_in(&bulk_text(field(&read, "session"))), 2);
    // An invalidation takes one too; a garbled token beside a good one is ignored alone.
    let gone = run(
        &door,
        &mut conn,
        &["HOTSPLIT.INVALIDATE", "p:s9", "1", "SESSION", "!!", &merged],
    )
    .await;
    assert_eq!(floors_in(&bulk_text(field(&gone, "session"))), 3);
    // Without SESSION the answers keep their shape.
    let read = run(&door, &mut conn, &["HOTSPLIT.READ", "p:s1"]).await;
    let Reply::Map(fields) = &read else {
        panic!("a map: {read:?}");
    };
    assert!(fields.iter().all(|(name, _)| *name != bulk("session")));
    assert_eq!(
        run(&door, &mut conn, &["HOTSPLIT.READ", "p:none"]).await,
        Reply::Nil
    );
}

#[tokio::test]
async fn session_is_an_option_only_where_an_option_name_may_stand() {
    let door = door();
    let mut conn = ConnState::new(1);
    // A value named SESSION is a value.
    let report = run(
        &door,
        &mut conn,
        &["HOTSPLIT.PUBLISH", "p:s4", "1", "SESSION"],
    )
    .await;
    assert_eq!(field(&report, "status"), &bulk("done"));
    let read = run(
        &door,
        &mut conn,
        &["HOTSPLIT.READ", "p:s4", "CLIENT", "SESSION"],
    )
    .await;
    assert_eq!(field(&read, "value"), &bulk("SESSION"));
    for bad in [
        &["HOTSPLIT.INVALIDATE", "p:s4", "2", "EXTRA"][..],
        &["HOTSPLIT.READ", "p:s4", "CLASS", "SESSION", "x"][..],
    ] {
        assert_eq!(
            run(&door, &mut conn, bad).await,
            err("ERR syntax error"),
            "{bad:?}"
        );
    }
}
