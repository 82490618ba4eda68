//! The Redis-protocol door's connections over raw TCP: protocol errors close only their own
//! connection, a pipelined batch arrives split anywhere and is answered in order, the
//! connection bound, 10,000 idle connections, the metrics, and the drain.
//!
//! These tests judge the connection loop, not the commands: a reply is read as any RESP value
//! (the skeleton answers `-ERR not yet` to everything; the commands answer for real once they
//! land), and an order check uses `ECHO` only when it is answered.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::harness::{self, Binary};

/// How long a test waits for one reply.
pub(crate) const REPLY_WITHIN: Duration = Duration::from_secs(10);

/// A service serving `[resp]` on a free port, with `resp` added to that section; and the
/// Redis-protocol address.
async fn start(resp: &str) -> (harness::Service, SocketAddr) {
    let port = harness::free_port();
    let config =
        harness::config_from_toml(&format!("[resp]\nlisten = \"127.0.0.1:{port}\"\n{resp}\n"));
    let service = harness::Service::start(config).await;
    (service, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// One RESP value as the server sent it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `+…`.
    Simple(String),
    /// `-…`.
    Error(String),
    /// `:…`.
    Int(i64),
    /// `$…`, `=…`; `None` for a null.
    Bulk(Option<Vec<u8>>),
    /// `*…`, `%…` (flattened), `_`.
    Array(Vec<Value>),
    /// `_`.
    Null,
}

/// A connection with what it has read and not yet parsed.
pub(crate) struct Client {
    /// The socket.
    pub(crate) stream: TcpStream,
    /// Bytes read, not yet taken by a reply.
    buf: Vec<u8>,
}

impl Client {
    pub(crate) async fn connect(address: SocketAddr) -> Client {
        let stream = TcpStream::connect(address).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// [`Client::connect`] with a receive buffer of `bytes` (set before the connect, so the
    /// window it offers stays that small): a client that reads nothing makes the server's
    /// writes wait after a few KiB instead of the megabytes a loopback socket takes.
    pub(crate) async fn connect_receiving(address: SocketAddr, bytes: u32) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let stream = socket.connect(address).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// Reads more bytes; false at the end of the stream (or a reset).
    pub(crate) async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(REPLY_WITHIN, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(read)) => {
                self.buf.extend_from_slice(&chunk[..read]);
                true
            }
            Err(_) => panic!(
                "no reply within {REPLY_WITHIN:?}; read so far {:?}",
                self.text()
            ),
        }
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }

    /// The next reply.
    pub(crate) async fn reply(&mut self) -> Value {
        loop {
            if let Some((value, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return value;
            }
            assert!(
                self.fill().await,
                "closed before a whole reply: {:?}",
                self.text()
            );
        }
    }

    /// Asserts the server closes the connection with nothing more to read.
    pub(crate) async fn closed(&mut self) {
        while self.fill().await {}
        assert!(
            self.buf.is_empty(),
            "unexpected bytes before the close: {:?}",
            self.text()
        );
    }
}

/// Parses one RESP value at the start of `buf`: the value and the bytes it took, or `None` if
/// it is not all there.
fn parse(buf: &[u8]) -> Option<(Value, usize)> {
    let end = buf.windows(2).position(|pair| pair == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..end]).expect("a header line is text");
    let after = end + 2;
    let (kind, _) = buf.split_first()?;
    let value = match kind {
        b'+' => (Value::Simple(line.to_owned()), after),
        b'-' => (Value::Error(line.to_owned()), after),
        b':' => (Value::Int(line.parse().expect("an integer")), after),
        b'_' => (Value::Null, after),
        b'$' | b'=' => {
            let len: i64 = line.parse().expect("a length");
            if len < 0 {
                return Some((Value::Bulk(None), after));
            }
            let len = usize::try_from(len).ok()?;
            if buf.len() < after + len + 2 {
                return None;
            }
            (
                Value::Bulk(Some(buf[after..after + len].to_vec())),
                after + len + 2,
            )
        }
        b'*' | b'%' => {
            let mut count: usize = line.parse().expect("a count");
            if *kind == b'%' {
                count *= 2;
            }
            let mut items = Vec::new();
            let mut at = after;
            for _ in 0..count {
                let (item, used) = parse(&buf[at..])?;
                items.push(item);
                at += used;
            }
            (Value::Array(items), at)
        }
        other => panic!("not a RESP reply: {:?}", char::from(*other)),
    };
    Some(value)
}

/// A multibulk command.
pub(crate) fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n{arg}\r\n", arg.len()).bytes());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_is_answered_with_redis_protocol_errors_and_closes_that_connection_only() {
    let (service, address) = start("").await;
    let mut bystander = Client::connect(address).await;
    bystander.send(&command(&["PING"])).await;
    bystander.reply().await;
    let too_long = vec![b'a'; 70 * 1024];
    let cases: [(&[u8], &str); 5] = [
        (b"*99999999999\r\n", "invalid multibulk length"),
        (b"*1\r\n$99999999999\r\n", "invalid bulk length"),
        (b"*1\r\n$abc\r\n", "invalid bulk length"),
        (b"*1\r\nGET\r\n", "expected '$', got 'G'"),
        (&too_long, "too big inline request"),
    ];
    for (junk, text) in cases {
        let mut client = Client::connect(address).await;
        client.send(&command(&["PING"])).await;
        client.send(junk).await;
        client.reply().await;
        assert_eq!(
            client.reply().await,
            Value::Error(format!("ERR Protocol error: {text}")),
            "{text}"
        );
        client.closed().await;
        bystander.send(b"PING\r\n").await;
        bystander.reply().await;
    }
    let http = reqwest::Client::new();
    let metrics = harness::metrics_text(&http, &service.base).await;
    assert!(
        metrics.contains("hotsplit_resp_protocol_errors_total 5"),
        "{metrics}"
    );
    assert!(metrics.contains("hotsplit_resp_connections 1"), "{metrics}");
    assert!(
        metrics.contains(r#"hotsplit_resp_commands_total{command="ping"} 11"#),
        "{metrics}"
    );
    service.stop().await;
}

/// A pipeline of multibulk and inline commands, an empty line and an empty multibulk among
/// them: 6 commands.
fn pipeline() -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend(command(&["ECHO", "0"]));
    bytes.extend(b"ECHO 1\r\n\r\n");
    bytes.extend(b"*0\r\n");
    bytes.extend(command(&["ECHO", "2"]));
    bytes.extend(b"ECHO \"3\"\n");
    bytes.extend(command(&["ECHO", "4"]));
    bytes.extend(b"ECHO '5'\r\n");
    bytes
}

/// Asserts `replies` are the pipeline's, in order (when `ECHO` is answered).
fn assert_in_order(replies: &[Value], what: &str) {
    assert_eq!(replies.len(), 6, "{what}");
    if replies.iter().all(|reply| matches!(reply, Value::Error(_))) {
        return;
    }
    for (at, reply) in replies.iter().enumerate() {
        assert_eq!(
            *reply,
            Value::Bulk(Some(at.to_string().into_bytes())),
            "{what}: reply {at}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_batch_split_anywhere_is_answered_in_order() {
    let (service, address) = start("").await;
    let bytes = pipeline();
    for cut in 0..=bytes.len() {
        let mut client = Client::connect(address).await;
        client.send(&bytes[..cut]).await;
        tokio::task::yield_now().await;
        client.send(&bytes[cut..]).await;
        let mut replies = Vec::new();
        for _ in 0..6 {
            replies.push(client.reply().await);
        }
        assert_in_order(&replies, &format!("cut at {cut}"));
    }
    let mut client = Client::connect(address).await;
    for byte in &bytes {
        client.send(&[*byte]).await;
    }
    let mut replies = Vec::new();
    for _ in 0..6 {
        replies.push(client.reply().await);
    }
    assert_in_order(&replies, "one byte at a time");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_bound_a_new_connection_is_told_and_closed() {
    let (service, address) = start("max_connections = 2").await;
    let mut first = Client::connect(address).await;
    let mut second = Client::connect(address).await;
    for client in [&mut first, &mut second] {
        client.send(b"PING\r\n").await;
        client.reply().await;
    }
    let mut third = Client::connect(address).await;
    assert_eq!(
        third.reply().await,
        Value::Error("ERR max number of clients reached".into())
    );
    third.closed().await;
    first.send(b"PING\r\n").await;
    first.reply().await;
    drop(second);
    // The slot is free once the server has seen the close.
    harness::poll("a slot frees", REPLY_WITHIN, || async {
        let mut client = Client::connect(address).await;
        client.send(b"PING\r\n").await;
        client.reply().await != Value::Error("ERR max number of clients reached".into())
    })
    .await;
    let http = reqwest::Client::new();
    let metrics = harness::metrics_text(&http, &service.base).await;
    assert!(
        !metrics.contains("hotsplit_resp_connections_refused_total 0"),
        "{metrics}"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_shutdown_an_idle_connection_is_closed_and_the_service_stops() {
    let (service, address) = start("").await;
    let mut client = Client::connect(address).await;
    client.send(b"PING\r\n").await;
    client.reply().await;
    tokio::time::timeout(REPLY_WITHIN, service.stop())
        .await
        .expect("the service stops with an idle Redis-protocol connection open");
    client.closed().await;
}

/// The resident set of process `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_stay_open_and_each_still_answers() {
    const IDLE: usize = 10_000;
    // The server is a process of its own, so this one holds only the client ends: 10,000
    // descriptors under the usual 20,000 limit. Its HTTP bound is lowered so both bounds fit
    // its open-file check.
    let dir = tempfile::tempdir().expect("temp dir");
    let port = harness::free_port();
    let config = format!(
        "max_connections = 1000\n[resp]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = {}\n",
        IDLE + 10
    );
    let binary = Binary::start(dir.path(), "idle", &config).await;
    let pid = binary.pid();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    // One connection first, so the listener's own first allocations are not counted.
    let mut first = Client::connect(address).await;
    first.send(b"PING\r\n").await;
    first.reply().await;
    let before = rss_kib(pid);
    let mut clients = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        clients.push(Client::connect(address).await);
    }
    // Every connection answers once, so each is surely accepted and has run its loop.
    let mut tasks = JoinSet::new();
    for mut client in clients {
        tasks.spawn(async move {
            client.send(b"PING\r\n").await;
            client.reply().await;
            client
        });
    }
    let mut clients = Vec::with_capacity(IDLE);
    while let Some(client) = tasks.join_next().await {
        clients.push(client.expect("a client task"));
    }
    let after = rss_kib(pid);
    let per_connection = after.saturating_sub(before) * 1024 / IDLE as u64;
    eprintln!(
        "resp idle connections: RSS {before} KiB -> {after} KiB with {IDLE} more connections: {per_connection} bytes each"
    );
    assert!(
        per_connection <= 64 * 1024,
        "{per_connection} bytes of RSS per idle connection"
    );
    // Idle, then asked again: every one still answers.
    let mut tasks = JoinSet::new();
    for mut client in clients {
        tasks.spawn(async move {
            client.send(&command(&["PING"])).await;
            client.reply().await;
            client
        });
    }
    let mut clients = Vec::with_capacity(IDLE);
    while let Some(client) = tasks.join_next().await {
        clients.push(client.expect("a client task"));
    }
    assert_eq!(clients.len(), IDLE);
    let http = reqwest::Client::new();
    let metrics = harness::metrics_text(&http, &binary.base).await;
    assert!(
        metrics.contains(&format!("hotsplit_resp_connections {}", IDLE + 1)),
        "{}",
        metrics
            .lines()
            .filter(|line| line.contains("resp_connections"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Runs `redis-cli ARGS…` and returns its stdout and stderr together.
async fn redis_cli(args: Vec<String>) -> String {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(args)
            .output()
            .expect("run redis-cli")
    })
    .await
    .expect("join redis-cli");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_listener_tls_the_redis_port_speaks_tls_to_redis_cli() {
    let files = &crate::tls_pki::pki().files;
    let port = harness::free_port();
    let mut config = harness::config_from_toml(&format!(
        "[server]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n[resp]\nlisten = \"127.0.0.1:{port}\"\n",
        files.cert_file.display().to_string(),
        files.key_file.display().to_string()
    ));
    config.server.drain_delay = Duration::ZERO;
    // Not `Service::start`: its readiness poll speaks plain HTTP.
    let service = harness::Service::spawn(config).await;
    let tls_args = |command: &str| {
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            files.ca_file.display().to_string(),
            "-h".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            port.to_string(),
            command.to_owned(),
        ]
    };
    // A command's reply (PONG, or the skeleton's ERR not yet), never a connection error.
    let answer = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    harness::poll("redis-cli --tls gets a reply", REPLY_WITHIN, || {
        let args = tls_args("PING");
        let answer = answer.clone();
        async move {
            let text = redis_cli(args).await;
            let replied = text.contains("PONG") || text.contains("ERR not yet");
            *answer.lock().unwrap() = text;
            replied
        }
    })
    .await;
    let answer = answer.lock().unwrap().clone();
    assert!(!answer.contains("Could not connect"), "{answer}");
    // In clear, the client is told, in clear, to use TLS.
    let plain = redis_cli(vec![
        "-h".to_owned(),
        "127.0.0.1".to_owned(),
        "-p".to_owned(),
        port.to_string(),
        "PING".to_owned(),
    ])
    .await;
    assert!(plain.contains("this port speaks TLS"), "{plain}");
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_connection_over_the_bound_is_told_over_tls() {
    let files = &crate::tls_pki::pki().files;
    let port = harness::free_port();
    let mut config = harness::config_from_toml(&format!(
        "[server]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n[resp]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = 1\n",
        files.cert_file.display().to_string(),
        files.key_file.display().to_string()
    ));
    config.server.drain_delay = Duration::ZERO;
    let service = harness::Service::spawn(config).await;
    let client = hotsplit::tls::client_config(Some(&files.ca_file), None).expect("a tls client");
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let connect = || {
        let connector = connector.clone();
        async move {
            let tcp = TcpStream::connect(address).await.ok()?;
            let name =
                rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
            connector.connect(name, tcp).await.ok()
        }
    };
    /// The bytes a TLS connection reads until the server closes it or `bytes` arrived.
    async fn read_some(
        stream: &mut tokio_rustls::client::TlsStream<TcpStream>,
        until: &[u8],
    ) -> Vec<u8> {
        let mut got = Vec::new();
        let mut chunk = [0u8; 512];
        while !got.ends_with(until) {
            match tokio::time::timeout(REPLY_WITHIN, stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(read)) => got.extend_from_slice(&chunk[..read]),
                Err(_) => panic!("nothing within {REPLY_WITHIN:?}: {got:?}"),
            }
        }
        got
    }
    // The first connection holds the one slot once it has an answer (polled: the service
    // is still starting).
    let give_up = tokio::time::Instant::now() + REPLY_WITHIN;
    let held = loop {
        if let Some(mut stream) = connect().await {
            if stream.write_all(b"PING\r\n").await.is_ok()
                && !read_some(&mut stream, b"\r\n").await.is_empty()
            {
                break stream;
            }
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the TLS Redis port never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut refused = connect().await.expect("a TLS handshake over the bound");
    let reply = read_some(&mut refused, b"\r\n").await;
    assert_eq!(reply, b"-ERR max number of clients reached\r\n");
    drop(held);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_auth_redis_tighter_input_bounds_apply_and_after_it_the_configured_ones() {
    const TOKEN: &str = "resp-conn-token-0123456789abcdef";
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("plain:{TOKEN} read,write # conn\n")).expect("tokens");
    let (service, address) = start(&format!(
        "[auth]\ntokens_file = {:?}\n",
        tokens.display().to_string()
    ))
    .await;
    let big = "x".repeat(20 * 1024);
    for (junk, text) in [
        (
            command(&["MGET", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]),
            "unauthenticated multibulk length",
        ),
        (command(&["ECHO", &big]), "unauthenticated bulk length"),
    ] {
        let mut client = Client::connect(address).await;
        client.send(&junk).await;
        assert_eq!(
            client.reply().await,
            Value::Error(format!("ERR Protocol error: {text}"))
        );
        client.closed().await;
    }
    let mut client = Client::connect(address).await;
    client.send(&command(&["AUTH", TOKEN])).await;
    assert_eq!(client.reply().await, Value::Simple("OK".into()));
    client.send(&command(&["ECHO", &big])).await;
    assert_eq!(client.reply().await, Value::Bulk(Some(big.into_bytes())));
    service.stop().await;
}
