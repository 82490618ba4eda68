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
fn client(var: &str, what: &str) -> Option<PathBuf> {
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
fn tool(name: &str) -> Option<PathBuf> {
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
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/resp_clients")
}

/// A `hotsplit serve` with the RESP listener on a port of its own, and that port.
async fn serve(dir: &Path, extra: &str) -> (Binary, u16) {
    let port = harness::free_port();
    let spool = harness::spool_dir();
    let config = format!(
        "[resp]\nlisten = \"127.0.0.1:{port}\"\n[heal]\nspool_dir = \"{}\"\n{extra}{FAMILIES}",
        spool.display()
    );
    (Binary::start(dir, "resp", &config).await, port)
}

/// Asserts that `output` succeeded and printed `ok`, else shows everything and the log.
fn assert_ok(output: &Output, what: &str, binary: &Binary) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\nhotsplit log:\n{}",
        output.status,
        binary.log_text()
    );
}

/// `redis-cli -p PORT args…`, its stdout.
fn redis_cli(port: u16, args: &[&str]) -> String {
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
        .args(["-p", &port.to_string(), "-n", "2000", "-c", "8", "-P", "4", "-t", "get", "-q"])
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_reads_its_writes_and_never_goes_back_while_the_replica_is_paused() {
    let Some(python) = client("HOTSPLIT_REDIS_PY", "redis-py") else {
        return;
    };
    let group = hotsplit_devcluster::PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let dir = tempfile::tempdir().unwrap();
    // Replica-routed reads (`advisory`), no near cache: every read reaches a copy in Redis.
    let extra = format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"{}\"\n[near_cache]\nenabled = false\n[[family]]\nprefix = \"adv:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"advisory\"\n",
        group.url(),
        replica.url(),
        harness::command_timeout_toml()
    );
    let (binary, port) = serve(dir.path(), &extra).await;
    let pool = |first: u32, last: u32| {
        Command::new(&python)
            .arg(scripts().join("pypool.py"))
            .args([port.to_string(), "adv:pool".to_owned()])
            .args([first.to_string(), last.to_string()])
            .output()
            .expect("run python")
    };
    assert_ok(&pool(1, 5), "the pool with the replica running", &binary);
    replica.pause().expect("SIGSTOP the replica");
    let paused = pool(6, 15);
    replica.resume().expect("SIGCONT the replica");
    assert_ok(&paused, "the pool with the replica paused", &binary);
}
