//! The Redis-protocol door through clients nobody here wrote: redis-py (PyPI) and ioredis (npm)
//! scripts in `resp_clients/`, `redis-cli` and `redis-benchmark` (Debian), against a
//! `hotsplit serve` binary on the embedded store with `[resp] listen` set.
//!
//! `scripts/test.sh` installs the pinned clients and points `HOTSPLIT_REDIS_PY` (a python with
//! redis-py) and `HOTSPLIT_IOREDIS_NODE_PATH` (a `node_modules` with ioredis) at them. A test
//! whose client is missing skips, saying so, unless `HOTSPLIT_REQUIRE_RESP_CLIENTS` is set (the
//! script sets it): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{self, Binary};

/// A token with the read scope, and one with read and write.
const READER: &str = "resp-reader-token-0123456789";
const WRITER: &str = "resp-writer-token-0123456789";

/// The families of these tests: `hot:` split in 4, `alloc:` allocated.
const FAMILIES: &str = "[[family]]\nprefix = \"hot:\"\ncopies = 4\nttl = \"10m\"\n[[family]]\nprefix = \"alloc:\"\ncopies = 4\nversioning = \"allocated\"\n";

/// The program a client env var names, or `None` (and a skip message) when it is unset and
/// the clients are not required.
pub(crate) fn client(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ if std::env::var_os("HOTSPLIT_REQUIRE_RESP_CLIENTS").is_some() => {
            panic!("{var} is unset but HOTSPLIT_REQUIRE_RESP_CLIENTS is: {what} must be installed (scripts/test.sh installs it)")
        }
        _ => {
            eprintln!("SKIP: {var} is unset, so {what} is not installed here (scripts/test.sh installs it)");
            None
        }
    }
}

/// A Debian tool on the PATH (redis-cli, redis-benchmark), else as [`client`] says.
pub(crate) fn tool(name: &str) -> Option<PathBuf> {
    let found = Command::new(name).arg("--version").output().is_ok();
    match found {
        true => Some(PathBuf::from(name)),
        false if std::env::var_os("HOTSPLIT_REQUIRE_RESP_CLIENTS").is_some() => {
            panic!("{name} is not on the PATH but HOTSPLIT_REQUIRE_RESP_CLIENTS is set")
        }
        false => {
            eprintln!("SKIP: {name} is not on the PATH");
            None
        }
    }
}

/// The folder of the client scripts.
pub(crate) fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/resp_clients")
}

/// A `hotsplit serve` with the RESP listener on a port of its own, and that port. Its
/// connection bounds are the defaults (10000 HTTP, 4096 RESP): they fit a 20,000 open-file
/// limit, so `--resp-listen` starts as configured out of the box.
pub(crate) async fn serve(dir: &Path, extra: &str) -> (Binary, u16) {
    let port = harness::free_port();
    let spool = harness::spool_dir();
    let config = format!(
        "[resp]\nlisten = \"127.0.0.1:{port}\"\n[heal]\nspool_dir = \"{}\"\n{extra}{FAMILIES}",
        spool.display()
    );
    (Binary::start(dir, "resp", &config).await, port)
}

/// Asserts that `output` succeeded and printed `ok`, else shows everything and the log.
pub(crate) fn assert_ok(output: &Output, what: &str, binary: &Binary) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{what}: {}", stdout.trim_end());
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\nhotsplit log:\n{}",
        output.status,
        binary.log_text()
    );
}

/// `redis-cli -p PORT args…`, its stdout.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(output.status.success(), "redis-cli {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn redis_py_reads_publishes_pipelines_and_pools_on_resp2_and_resp3() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), "").await;
    let output = Command::new(python)
        .arg(scripts().join("pyclient.py"))
        .arg(port.to_string())
        .output()
        .expect("run python");
    assert_ok(&output, "redis-py", &binary);
}

#[tokio::test]
async fn ioredis_passes_its_ready_check_and_reads_on_resp2_and_resp3() {
    let Some(node_path) = client("HOTSPLIT_IOREDIS_NODE_PATH", "ioredis") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), "").await;
    let output = Command::new("node")
        .env("NODE_PATH", node_path)
        .arg(scripts().join("ioclient.js"))
        .arg(port.to_string())
        .output()
        .expect("run node");
    assert_ok(&output, "ioredis", &binary);
}

#[tokio::test]
async fn redis_cli_and_redis_benchmark_speak_to_the_door() {
    let (Some(_), Some(_)) = (tool("redis-cli"), tool("redis-benchmark")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), "").await;
    assert_eq!(redis_cli(port, &["PING"]).trim(), "PONG");
    let published = redis_cli(port, &["HOTSPLIT.PUBLISH", "hot:cli", "2", "two"]);
    assert!(published.contains("done"), "{published}");
    assert_eq!(redis_cli(port, &["GET", "hot:cli"]).trim(), "two");
    assert_eq!(redis_cli(port, &["-3", "GET", "hot:cli"]).trim(), "two");
    let unknown = redis_cli(port, &["FOO", "a"]);
    assert!(
        unknown.contains("unknown command 'FOO', with args beginning with: 'a'"),
        "{unknown}"
    );
    let output = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-n",
            "2000",
            "-c",
            "8",
            "-P",
            "4",
            "-t",
            "get",
            "-q",
        ])
        .output()
        .expect("run redis-benchmark");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains("GET"),
        "redis-benchmark: {output:?}\n{}",
        binary.log_text()
    );
}

#[tokio::test]
async fn an_explicit_client_id_reads_the_copy_http_affinity_names() {
    let Some(_) = tool("redis-cli") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (binary, port) = serve(dir.path(), "").await;
    redis_cli(port, &["HOTSPLIT.PUBLISH", "hot:aff", "1", "v"]);
    let http = reqwest::Client::new();
    for client in ["alice", "bob", "carol", "dave", "erin"] {
        let affinity = harness::affinity(&http, &binary.base, "hot:aff", client).await;
        let read = redis_cli(port, &["HOTSPLIT.READ", "hot:aff", "CLIENT", client]);
        let lines: Vec<&str> = read.lines().collect();
        let copy = lines
            .iter()
            .position(|line| *line == "copy")
            .map(|at| lines[at + 1])
            .unwrap_or_else(|| panic!("no copy in {read}"));
        assert_eq!(copy, affinity["copy"].to_string(), "{client}: {read}");
    }
}

#[tokio::test]
async fn auth_and_hello_auth_are_required_and_scoped() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("plain:{READER} read # reader\nplain:{WRITER} read,write # writer\n"),
    )
    .unwrap();
    let extra = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    let (binary, port) = serve(dir.path(), &extra).await;
    let script = format!(
        r#"
import redis
port = {port}
for proto in (2, 3):
    try:
        redis.Redis(port=port, protocol=proto).get("hot:a")
    except redis.AuthenticationError as error:
        assert "Authentication required" in str(error) or "authenticated" in str(error), str(error)
    else:
        raise AssertionError("no token, yet an answer")
    try:
        redis.Redis(port=port, protocol=proto, password="wrong-token-0123456789").get("hot:a")
    except redis.AuthenticationError as error:
        assert "invalid username-password pair" in str(error), str(error)
    else:
        raise AssertionError("a wrong token, yet an answer")
    writer = redis.Redis(port=port, protocol=proto, password="{WRITER}")
    assert writer.execute_command("HOTSPLIT.PUBLISH", "hot:a", 1 + proto, "x") is not None
    reader = redis.Redis(port=port, protocol=proto, username="default", password="{READER}")
    assert reader.get("hot:a") == b"x"
    try:
        reader.set("alloc:a", "y")
    except redis.exceptions.NoPermissionError as error:
        assert "write scope" in str(error), str(error)
    else:
        raise AssertionError("a reader wrote")
print("ok")
"#
    );
    let output = Command::new(python)
        .arg("-c")
        .arg(script)
        .output()
        .expect("run python");
    assert_ok(&output, "redis-py with tokens", &binary);
}

/// Monotonic reads and read-your-writes through a redis-py pool of 8 connections (no client
/// id: the instance's high-water is each read's floor) on a primary and a replica that reads
/// go to (`lenient`: 30 s staleness budget, no near cache): with the replica holding back
/// replication (`CLIENT PAUSE WRITE`: it answers reads, with what it had), then stopped
/// (SIGSTOP). Without the high-water the paused phase fails (tried: a pooled read answered the
/// version before the one just published).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_reads_its_writes_and_never_goes_back_while_the_replica_is_paused() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let group = hotsplit_devcluster::PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"{}\"\n[near_cache]\nenabled = false\n[classes.lenient]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"30s\"\n[[family]]\nprefix = \"len:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"lenient\"\n",
        group.url(),
        replica.url(),
        harness::command_timeout_toml()
    );
    let (binary, port) = serve(dir.path(), &extra).await;
    let pool = |first: u32, last: u32| {
        Command::new(&python)
            .arg(scripts().join("pypool.py"))
            .args([port.to_string(), "len:pool".to_owned()])
            .args([first.to_string(), last.to_string()])
            .output()
            .expect("run python")
    };
    assert_ok(&pool(1, 5), "the pool with the replica running", &binary);
    // The replica answers reads but applies no replication: every copy it holds stays at 5.
    hotsplit_devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "20000", "WRITE"])
        .expect("CLIENT PAUSE");
    let held_back = pool(6, 15);
    replica.pause().expect("SIGSTOP the replica");
    let stopped = pool(16, 20);
    replica.resume().expect("SIGCONT the replica");
    hotsplit_devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    assert_ok(&held_back, "the pool with replication held back", &binary);
    assert_ok(&stopped, "the pool with the replica stopped", &binary);
}

/// Sends `command` (already RESP-encoded) on `stream` and reads what comes back, `None` when
/// the connection was closed.
fn roundtrip(stream: &mut std::net::TcpStream, command: &[u8]) -> Option<String> {
    use std::io::{Read, Write};
    stream.write_all(command).ok()?;
    let mut buf = [0u8; 512];
    match stream.read(&mut buf) {
        Ok(0) | Err(_) => None,
        Ok(read) => Some(String::from_utf8_lossy(&buf[..read]).into_owned()),
    }
}

#[tokio::test]
async fn a_token_revoked_by_a_reload_closes_the_connections_authenticated_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let both = format!("plain:{READER} read # reader\nplain:{WRITER} read,write # writer\n");
    std::fs::write(&tokens, &both).unwrap();
    let extra = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    let (binary, port) = serve(dir.path(), &extra).await;
    let connect = |token: &str| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let auth = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{token}\r\n", token.len());
        assert_eq!(
            roundtrip(&mut stream, auth.as_bytes()).as_deref(),
            Some("+OK\r\n")
        );
        stream
    };
    let mut writer = connect(WRITER);
    let mut reader = connect(READER);
    std::fs::write(&tokens, format!("plain:{READER} read # reader\n")).unwrap();
    binary.signal(libc::SIGHUP);
    let ping = b"*1\r\n$4\r\nPING\r\n";
    harness::poll(
        "the writer's connection is closed",
        std::time::Duration::from_secs(10),
        || {
            let closed = roundtrip(&mut writer, ping).is_none();
            async move { closed }
        },
    )
    .await;
    assert_eq!(roundtrip(&mut reader, ping).as_deref(), Some("+PONG\r\n"));
}

/// The value of the sample `name` (no labels) in a metrics text, 0 when absent.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_gets_of_a_hot_key_are_near_cache_hits_despite_the_high_water_floor() {
    let Some(_) = tool("redis-cli") else {
        return;
    };
    let server = harness::shared_standalone();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"{}\"\n[classes.patient]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"30s\"\nnear_cache_max_age = \"30s\"\n[[family]]\nprefix = \"nch:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"patient\"\n",
        server.url(),
        harness::command_timeout_toml()
    );
    let (binary, port) = serve(dir.path(), &extra).await;
    redis_cli(port, &["HOTSPLIT.PUBLISH", "nch:hot", "3", "three"]);
    let http = reqwest::Client::new();
    let before = harness::metrics_text(&http, &binary.base).await;
    // Each redis-cli is a connection of its own, as a pool's are: none names a client id, so
    // each read carries the instance's high-water (3) as its floor, which the entry meets.
    for _ in 0..20 {
        assert_eq!(redis_cli(port, &["GET", "nch:hot"]).trim(), "three");
    }
    let after = harness::metrics_text(&http, &binary.base).await;
    let delta = |name: &str| sample(&after, name) - sample(&before, name);
    assert!(
        delta("hotsplit_near_cache_hits_total") >= 16.0,
        "hits: {}\n{after}",
        delta("hotsplit_near_cache_hits_total")
    );
    assert_eq!(delta("hotsplit_near_cache_floor_reads_total"), 0.0);
    // Every hit was answered inline (no slot, deadline or timer): counted, and not timed.
    let gets = r#"hotsplit_resp_commands_total{command="get"}"#;
    let timed = r#"hotsplit_resp_command_duration_seconds_count{command="get"}"#;
    assert_eq!(delta(gets), 20.0, "{after}");
    assert_eq!(
        delta(timed),
        20.0 - delta("hotsplit_near_cache_hits_total"),
        "{after}"
    );
}
