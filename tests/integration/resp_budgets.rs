//! The Redis-protocol door's byte budgets and its bounds before `AUTH`, on the real binary
//! (`hotsplit serve`, so its resident set is the server's alone): each budget is configured
//! below the flood a client sends, and the server's RSS must stay within the budget plus 10 %.
//!
//! - a `MULTI` queue bounded in bytes (`resp.max_queued_bytes`), not in commands;
//! - commands still being received bounded instance-wide (`resp.max_receiving_bytes`) and in
//!   time (`resp.receive_timeout`);
//! - a reply bounded (`resp.max_reply_bytes`): an `MGET` or an `EXEC` over it fails whole;
//!   `resp.max_args` for inline commands too;
//! - before `AUTH`: `NOAUTH` before any command lookup, a small output bound, a deadline to
//!   authenticate (`resp.auth_timeout`), unauthenticated connections evicted first, and
//!   refused `AUTH`s slowed and counted.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

use crate::harness::{self, Binary};
use crate::resp_conn::{command, rss_kib, Client, Value};

/// A MiB.
const MIB: u64 = 1024 * 1024;

/// The read-write token of the tests that configure tokens.
const TOKEN: &str = "resp-budgets-token-0123456789abcdef";

/// How long RSS may take to settle within a bound (a CI machine running four suites at once
/// took more than 3 s to give a flood's freed pages back).
const SETTLE: Duration = Duration::from_secs(10);

/// `/metrics`, with `token` when the instance has tokens.
async fn metrics(base: &str, token: Option<&str>) -> String {
    let mut request = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.expect("GET /metrics");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.text().await.expect("a metrics body")
}

/// Starts the binary with `[resp] listen` on a free port and `resp` added to that section,
/// after `before` (sections of its own); returns it and the Redis-protocol address.
async fn start(dir: &Path, name: &str, before: &str, resp: &str) -> (Binary, SocketAddr) {
    let port = harness::free_port();
    let config = format!("{before}\n[resp]\nlisten = \"127.0.0.1:{port}\"\n{resp}\n");
    let binary = Binary::start(dir, name, &config).await;
    (binary, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Asserts the server's RSS growth over `before` KiB is within `bound` bytes plus 10 %,
/// within [`SETTLE`]: the allocator gives freed pages back to the system after a short delay,
/// so what a connection no longer holds can still count for a moment.
async fn assert_rss_within(pid: u32, before: u64, bound: u64, what: &str) {
    let first = rss_kib(pid);
    let give_up = tokio::time::Instant::now() + SETTLE;
    let mut after = first;
    while after.saturating_sub(before) * 1024 > bound + bound / 10
        && tokio::time::Instant::now() < give_up
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = rss_kib(pid);
    }
    let grew = after.saturating_sub(before) * 1024;
    eprintln!(
        "{what}: RSS {before} KiB -> {first} KiB at once, {after} KiB settled (+{} KiB), bound {} KiB + 10 %",
        grew / 1024,
        bound / 1024
    );
    assert!(
        grew <= bound + bound / 10,
        "{what}: RSS grew {} KiB, over the bound {} KiB + 10 %",
        grew / 1024,
        bound / 1024
    );
}

/// One connection's warm-up: a `PING` answered, so the listener's first allocations are made
/// before RSS is measured.
async fn warm(address: SocketAddr) -> Client {
    let mut client = Client::connect(address).await;
    client.send(b"PING\r\n").await;
    client.reply().await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_queue_is_bounded_in_bytes_not_in_commands() {
    const QUEUED: u64 = 64 * MIB;
    const PENDING: u64 = 2 * MIB;
    let dir = tempfile::tempdir().expect("temp dir");
    let (binary, address) = start(
        dir.path(),
        "queued",
        "",
        &format!("max_queued_bytes = {QUEUED}\nmax_pending_bytes = {PENDING}"),
    )
    .await;
    let pid = binary.pid();
    let _warm = warm(address).await;
    let before = rss_kib(pid);
    let mut client = Client::connect(address).await;
    client.send(&command(&["MULTI"])).await;
    assert_eq!(client.reply().await, Value::Simple("OK".into()));
    let value = "v".repeat(1024 * 1024);
    let echo = command(&["ECHO", &value]);
    let mut queued = 0;
    let mut refused = Vec::new();
    for _ in 0..300 {
        client.send(&echo).await;
        match client.reply().await {
            Value::Simple(text) if text == "QUEUED" => queued += 1,
            Value::Error(text) => refused.push(text),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert_rss_within(pid, before, QUEUED + PENDING, "300 x ECHO 1 MiB queued").await;
    assert!(queued < 300, "all 300 commands were queued");
    assert!(
        refused
            .first()
            .is_some_and(|text| text.starts_with("ERR ") && text.contains("resp.max_queued_bytes")),
        "{refused:?}"
    );
    client.send(&command(&["EXEC"])).await;
    assert_eq!(
        client.reply().await,
        Value::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    let metrics = metrics(&binary.base, None).await;
    assert!(
        metrics.contains(r#"hotsplit_resp_budget_exceeded_total{budget="max_queued_bytes"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_commands_are_bounded_instance_wide_and_in_time() {
    const RECEIVING: u64 = 24 * MIB;
    let dir = tempfile::tempdir().expect("temp dir");
    let (binary, address) = start(
        dir.path(),
        "receiving",
        &format!("max_value_bytes = {}", 16 * MIB),
        &format!(
            "max_pending_bytes = {big}\nmax_queued_bytes = {big}\nmax_reply_bytes = {big}\nmax_receiving_bytes = {RECEIVING}\nreceive_timeout = \"2s\"",
            big = 17 * MIB
        ),
    )
    .await;
    let pid = binary.pid();
    let _warm = warm(address).await;
    let before = rss_kib(pid);
    // 8 connections each send 15 MiB of a 16 MB argument, and never the rest: 120 MiB.
    let started = tokio::time::Instant::now();
    let mut clients = JoinSet::new();
    for _ in 0..8 {
        clients.spawn(async move {
            let mut client = Client::connect(address).await;
            let mut head = b"*2\r\n$4\r\nECHO\r\n$16000000\r\n".to_vec();
            head.extend(std::iter::repeat_n(b'x', 15 * 1024 * 1024));
            // The server may close the connection while this is sent.
            let _ = client.stream.write_all(&head).await;
            let mut replies = Vec::new();
            while client.fill().await {}
            replies.push(client.text());
            replies
        });
    }
    let mut peak = 0;
    let mut answers = Vec::new();
    loop {
        peak = peak.max(rss_kib(pid));
        tokio::select! {
            done = clients.join_next() => match done {
                Some(done) => answers.extend(done.expect("a client task")),
                None => break,
            },
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    let took = started.elapsed();
    eprintln!("8 half-sent commands: every connection closed after {took:?}; {answers:?}");
    assert!(
        took < Duration::from_secs(10),
        "half-sent commands were held {took:?}"
    );
    for answer in &answers {
        assert!(
            answer
                == "-ERR Protocol error: commands being received hold resp.max_receiving_bytes\r\n"
                || answer
                    == "-ERR Protocol error: command not received within resp.receive_timeout\r\n",
            "{answer:?}"
        );
    }
    assert!(answers
        .iter()
        .any(|answer| answer.contains("resp.receive_timeout")));
    assert!(answers
        .iter()
        .any(|answer| answer.contains("resp.max_receiving_bytes")));
    let grew = peak.saturating_sub(before) * 1024;
    eprintln!(
        "8 x 15 MiB half-sent: peak RSS +{} KiB, bound {} KiB + 10 %",
        grew / 1024,
        RECEIVING / 1024
    );
    assert!(
        grew <= RECEIVING + RECEIVING / 10,
        "RSS grew {} KiB while commands were received",
        grew / 1024
    );
    let metrics = metrics(&binary.base, None).await;
    assert!(
        metrics.contains("hotsplit_resp_receiving_bytes 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_over_its_bound_fails_whole_and_inline_commands_have_max_args() {
    const REPLY: u64 = 8 * MIB;
    let dir = tempfile::tempdir().expect("temp dir");
    let (binary, address) = start(
        dir.path(),
        "reply",
        "[[family]]\nprefix = \"big:\"\ncopies = 1\nttl = \"10m\"\n",
        &format!("max_reply_bytes = {REPLY}\nmax_args = 100"),
    )
    .await;
    let pid = binary.pid();
    let mut client = warm(address).await;
    let value = "v".repeat(1024 * 1024);
    client
        .send(&command(&["HOTSPLIT.PUBLISH", "big:one", "1", &value]))
        .await;
    let published = client.reply().await;
    assert!(!matches!(published, Value::Error(_)), "{published:?}");
    client.send(&command(&["GET", "big:one"])).await;
    assert_eq!(client.reply().await, Value::Bulk(Some(value.into_bytes())));
    let before = rss_kib(pid);
    let mut mget = vec!["MGET"];
    mget.extend(std::iter::repeat_n("big:one", 99));
    client.send(&command(&mget)).await;
    match client.reply().await {
        Value::Error(text) => assert!(
            text.starts_with("ERR ") && text.contains("resp.max_reply_bytes"),
            "{text}"
        ),
        other => panic!("an MGET of 99 MiB answered {:?}", short(&other)),
    }
    client.send(&command(&["MULTI"])).await;
    client.reply().await;
    for _ in 0..50 {
        client.send(&command(&["GET", "big:one"])).await;
        client.reply().await;
    }
    client.send(&command(&["EXEC"])).await;
    match client.reply().await {
        Value::Error(text) => assert!(
            text.starts_with("ERR EXEC stopped") && text.contains("resp.max_reply_bytes"),
            "{text}"
        ),
        other => panic!("an EXEC of 50 MiB answered {:?}", short(&other)),
    }
    assert_rss_within(pid, before, REPLY, "MGET and EXEC of 1 MiB values").await;
    // The connection is still usable.
    client.send(b"PING\r\n").await;
    assert_eq!(client.reply().await, Value::Simple("PONG".into()));
    let metrics = metrics(&binary.base, None).await;
    assert!(
        metrics.contains(r#"hotsplit_resp_budget_exceeded_total{budget="max_reply_bytes"} 2"#),
        "{metrics}"
    );
    // An inline MGET of 150 keys is refused as its multibulk form is.
    let mut inline = Client::connect(address).await;
    inline
        .send(format!("MGET{}\r\n", " k".repeat(150)).as_bytes())
        .await;
    assert_eq!(
        inline.reply().await,
        Value::Error("ERR Protocol error: invalid multibulk length".into())
    );
    inline.closed().await;
}

/// A reply shortened for a failure message.
fn short(value: &Value) -> String {
    let text = format!("{value:?}");
    text.chars().take(200).collect()
}

/// The token that reads `/metrics`.
const ADMIN: &str = "resp-budgets-admin-0123456789abcdef";

/// A tokens file in `dir` with one read-write token and [`ADMIN`]; its `[auth]` section.
fn tokens(dir: &Path, token: &str) -> String {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!("plain:{token} read,write # budgets\nplain:{ADMIN} admin # metrics\n"),
    )
    .expect("tokens");
    format!("[auth]\ntokens_file = {:?}\n", path.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_auth_a_client_that_reads_nothing_holds_at_most_16_kib_of_replies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (binary, address) = start(
        dir.path(),
        "unread",
        &tokens(dir.path(), TOKEN),
        "auth_timeout = \"30s\"",
    )
    .await;
    // Two clients send 300 KB of 2-byte unknown commands each (5 MB of NOAUTH replies) and
    // read nothing, through a 4 KiB receive window: once the sockets' buffers (about 4 MB) are
    // full, the service's writes wait, holding what it has not written. The sends run beside
    // the test: the service stops reading them when its writes wait.
    let flood = std::sync::Arc::new(b"a\n".repeat(150 * 1024));
    let mut senders = JoinSet::new();
    for _ in 0..2 {
        let mut client = Client::connect_receiving(address, 4096).await;
        let flood = flood.clone();
        senders.spawn(async move {
            let _ = client.stream.write_all(&flood).await;
            std::future::pending::<()>().await;
            drop(client);
        });
    }
    let writing = || async {
        harness::sample(
            &metrics(&binary.base, Some(ADMIN)).await,
            "hotsplit_resp_writing_bytes",
        )
    };
    harness::poll(
        "the service's writes wait for the flooding clients",
        Duration::from_secs(30),
        || async { writing().await > 0 },
    )
    .await;
    // Each connection holds at most 16 KiB and one reply more, in a buffer grown by doubling
    // (32 KiB and a little); without the bound it would hold the megabytes the sockets refuse.
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(writing().await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    eprintln!("two unread floods: replies held {held:?}");
    assert!(
        held.iter().all(|&bytes| bytes <= 2 * 64 * 1024),
        "two unread floods held {held:?} bytes of replies"
    );
    senders.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_auth_a_client_gets_noauth_a_deadline_and_no_slot_a_token_needs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (binary, address) = start(
        dir.path(),
        "noauth",
        &tokens(dir.path(), TOKEN),
        "max_connections = 16\nmax_unauthenticated = 16\nauth_timeout = \"2s\"",
    )
    .await;
    let pid = binary.pid();
    // An unknown command before AUTH is answered NOAUTH, not with its arguments echoed.
    let mut probe = Client::connect(address).await;
    probe.send(b"NOSUCH aaaaaaaaaaaaaaaaaaaa\r\n").await;
    assert_eq!(
        probe.reply().await,
        Value::Error("NOAUTH Authentication required.".into())
    );
    drop(probe);
    // 16 silent connections hold every slot; a client with a token still gets in.
    let mut silent = Vec::new();
    for _ in 0..16 {
        silent.push(Client::connect(address).await);
    }
    // Every silent connection is accepted before the client with a token comes.
    harness::poll("16 connections open", Duration::from_secs(10), || async {
        metrics(&binary.base, Some(ADMIN))
            .await
            .contains("hotsplit_resp_connections 16")
    })
    .await;
    let mut with_token = Client::connect(address).await;
    with_token.send(&command(&["AUTH", TOKEN])).await;
    assert_eq!(with_token.reply().await, Value::Simple("OK".into()));
    // The silent ones are closed within resp.auth_timeout (one of them to make room).
    let started = tokio::time::Instant::now();
    for client in &mut silent {
        while client.fill().await {}
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "silent connections held {took:?}"
    );
    with_token.send(b"PING\r\n").await;
    assert_eq!(with_token.reply().await, Value::Simple("PONG".into()));
    // 15 connections flood 180 KB of 2-byte unknown commands each and read nothing: what the
    // service reads before AUTH is bounded. (Their 3 MB of replies each fit in the sockets'
    // buffers; the reply bound is `before_auth_a_client_that_reads_nothing_holds_at_most_…`.)
    let before = rss_kib(pid);
    let mut flooders = Vec::new();
    let flood = b"a\n".repeat(90 * 1024);
    for _ in 0..15 {
        let mut client = Client::connect(address).await;
        let _ = client.stream.write_all(&flood).await;
        flooders.push(client);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Bound: 15 connections, each 16 KiB of output and 64 KiB of read room, and 8 MiB for the
    // allocator's per-thread pages: how the two workers share the floods decides which of
    // them touch new pages (+6.2 MiB seen on a quiet machine, +6.6 MiB in a clean CI run,
    // against 3.2 MiB when this allowed 2 MiB). Reading the floods whole would be 2.6 MB more,
    // their replies unbounded 46 MB.
    assert_rss_within(
        pid,
        before,
        15 * 80 * 1024 + 8 * MIB,
        "15 unauthenticated floods",
    )
    .await;
    // Refused AUTHs are counted, and slowed.
    let mut guesser = Client::connect(address).await;
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        guesser.send(&command(&["AUTH", "wrong-token"])).await;
        let reply = guesser.reply().await;
        assert!(
            matches!(&reply, Value::Error(text) if text.starts_with("WRONGPASS")),
            "{reply:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "3 refused AUTHs answered in {took:?}"
    );
    let metrics = metrics(&binary.base, Some(ADMIN)).await;
    assert!(
        metrics.contains("hotsplit_resp_auth_failures_total 3"),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"hotsplit_resp_budget_exceeded_total{budget="auth_timeout"} 0"#),
        "{metrics}"
    );
    drop(flooders);
}

/// Runs `hotsplit config check --config <dir>/check.toml` with `config`: its exit code and
/// stderr.
fn config_check(dir: &Path, config: &str) -> (Option<i32>, String) {
    let path = dir.join("check.toml");
    std::fs::write(&path, config).expect("write the config");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["config", "check", "--config"])
        .arg(&path)
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_CONFIG")
        .output()
        .expect("run hotsplit config check");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_redis_port_needs_its_own_flag_for_tls_that_ends_upstream() {
    let dir = tempfile::tempdir().expect("temp dir");
    let auth = tokens(dir.path(), TOKEN);
    // The HTTP proxy's flag does not cover a public Redis port with tokens and no TLS.
    let relying = format!(
        "[server]\nlisten = \"127.0.0.1:7070\"\ntls_terminated_upstream = true\n{auth}[resp]\nlisten = \"0.0.0.0:6380\"\n"
    );
    let (code, stderr) = config_check(dir.path(), &relying);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("resp.tls_terminated_upstream: resp.listen 0.0.0.0:6380"),
        "{stderr}"
    );
    // Its own flag does.
    let own = format!(
        "[server]\nlisten = \"127.0.0.1:7070\"\n{auth}[resp]\nlisten = \"0.0.0.0:6380\"\ntls_terminated_upstream = true\n"
    );
    let (code, stderr) = config_check(dir.path(), &own);
    assert_eq!(code, Some(0), "{stderr}");
}
