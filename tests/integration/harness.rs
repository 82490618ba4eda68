//! Shared Redis servers and helpers for the integration tests: Redis servers and stores, an
//! in-process service, the real binary (start, wait until ready, SIGTERM, SIGKILL), polling,
//! Redis read directly, and HTTP calls that name what they expected.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hotsplit::config::Config;
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use hotsplit_devcluster::{
    self as devcluster, Cluster, ClusterOptions, NodeInfo, Process, ProcessBuilder, Standalone,
};
use reqwest::{Response, StatusCode};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A standalone server shared by every test that does not inject faults.
pub fn shared_standalone() -> &'static Standalone {
    static SERVER: OnceLock<Standalone> = OnceLock::new();
    SERVER.get_or_init(|| Standalone::start().expect("start the shared standalone redis-server"))
}

/// A 3-master/3-replica cluster shared by every test that does not inject faults.
pub fn shared_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(ClusterOptions::default()).expect("start the shared redis cluster")
    })
}

/// A cluster of the test's own, for fault injection.
pub async fn own_cluster() -> Cluster {
    start_cluster(ClusterOptions::default()).await
}

/// A cluster of the test's own whose masters are never replaced during a test (a 60 s node
/// timeout), for a test that stalls a master for longer than [`COMMAND_TIMEOUT`] and expects its
/// copies to come back on the same node.
pub async fn own_cluster_without_failover() -> Cluster {
    start_cluster(ClusterOptions {
        node_timeout_ms: 60_000,
        ..ClusterOptions::default()
    })
    .await
}

/// Starts a cluster with `options` on a blocking thread (it takes seconds).
async fn start_cluster(options: ClusterOptions) -> Cluster {
    tokio::task::spawn_blocking(move || Cluster::start(options).expect("start a redis cluster"))
        .await
        .expect("join the cluster start")
}

/// The command timeout of the stores and services of every test that is not about the timeout
/// itself. A healthy node must answer within it on a loaded 2-core machine: 300 ms timed out on
/// healthy masters at load 13 and above, which marked them failing and queued their copies.
/// A test that stalls a node waits this long once per stall.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// [`COMMAND_TIMEOUT`] as a config value, for `command_timeout = "…"`.
pub fn command_timeout_toml() -> String {
    format!("{}ms", COMMAND_TIMEOUT.as_millis())
}

/// The `valkey-server` binary named by `HOTSPLIT_VALKEY_SERVER` (`scripts/test.sh` installs
/// one and sets it), or `None`, after printing that the Valkey test is skipped.
pub fn valkey_server() -> Option<std::path::PathBuf> {
    match std::env::var_os("HOTSPLIT_VALKEY_SERVER") {
        Some(path) if std::path::Path::new(&path).is_file() => Some(path.into()),
        _ => {
            println!(
                "skipped: HOTSPLIT_VALKEY_SERVER names no valkey-server binary (scripts/test.sh installs one)"
            );
            None
        }
    }
}

/// A standalone Valkey server shared by the conformance tests, if a binary is present.
pub fn shared_valkey_standalone() -> Option<&'static Standalone> {
    static SERVER: OnceLock<Standalone> = OnceLock::new();
    let program = valkey_server()?;
    Some(SERVER.get_or_init(|| {
        Standalone::start_with_options(&devcluster::ServerOptions {
            program: Some(program),
            ..devcluster::ServerOptions::default()
        })
        .expect("start the shared valkey-server")
    }))
}

/// A 3-master/3-replica Valkey cluster for the conformance test, if a binary is present.
pub fn valkey_cluster() -> Option<Cluster> {
    let program = valkey_server()?;
    Some(
        Cluster::start(ClusterOptions {
            program: Some(program),
            ..ClusterOptions::default()
        })
        .expect("start a valkey cluster"),
    )
}

/// Connects a Redis store to `url` with `command_timeout` (usually [`COMMAND_TIMEOUT`]).
pub async fn redis_store(url: &str, command_timeout: Duration) -> Arc<RedisStore> {
    let mut options = RedisOptions::new(RedisTarget::parse(url).expect("parse the redis url"));
    options.command_timeout = command_timeout;
    Arc::new(
        RedisStore::connect(options, Metrics::new())
            .await
            .expect("connect to redis"),
    )
}

/// How long a starting service or binary may take to answer `/readyz`: a limit against a hang,
/// not a speed check (10 s was exceeded by a growing service at load 22 on 2 cores).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A hotsplit service running on a real socket.
pub struct Service {
    /// `http://127.0.0.1:P`.
    pub base: String,
    /// Resolving it starts graceful shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The server task.
    task: Option<JoinHandle<hotsplit::Result<()>>>,
}

impl Service {
    /// Starts `hotsplit::server::run` on a port-0 listener with `config` and waits until it
    /// answers `/readyz` with 200.
    ///
    /// # Panics
    /// When it does not answer within [`READY_WITHIN`], showing the last `/readyz` answer, or
    /// when the server stops first, showing how it ended (a start that failed says why).
    pub async fn start(config: Config) -> Service {
        let mut service = Service::spawn(config).await;
        let client = reqwest::Client::new();
        let url = format!("{}/readyz", service.base);
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        let mut last;
        loop {
            match client.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => return service,
                Ok(answer) => {
                    let status = answer.status();
                    last = format!("{status} {}", answer.text().await.unwrap_or_default());
                }
                Err(err) => last = err.to_string(),
            }
            if service.task.as_ref().is_some_and(JoinHandle::is_finished) {
                let ended = service.task.take().expect("the server task").await;
                panic!("the service stopped before it answered /readyz: {ended:?}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the service did not answer /readyz with 200 within {READY_WITHIN:?}; the last answer: {last}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `hotsplit::server::run` on a port-0 listener with `config`, without waiting for
    /// anything: for tests of what it answers while it starts.
    pub async fn spawn(mut config: Config) -> Service {
        // No drain delay: nothing balances load in front of a test's service, and every stop
        // would wait it out (`listener::on_sigterm_…` tests the delay on the binary).
        config.server.drain_delay = Duration::ZERO;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hotsplit::server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        Service {
            base,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the service and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `check` every 20 ms until it returns true; panics naming `what` after `limit`.
pub async fn poll<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client id whose affine copy of a `copies`-copy key is `copy`: the first of `{prefix}0`,
/// `{prefix}1`, … that reads it.
pub fn client_of_copy(prefix: &str, copy: u32, copies: u32) -> String {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .find(|client| hotsplit::affinity::copy_index(client, copies) == copy)
        .expect("some id reads every copy")
}

/// A config for a service on `redis_url` with one split family `prefix` of `copies` copies.
pub fn config_with_family(redis_url: Option<&str>, prefix: &str, copies: u32) -> Config {
    let mut text = format!("[[family]]\nprefix = \"{prefix}\"\ncopies = {copies}\nttl = \"10m\"\n");
    text.push_str("[[family]]\nprefix = \"alloc:\"\ncopies = 4\nversioning = \"allocated\"\n");
    text.push_str(&format!(
        "[store]\ncommand_timeout = \"{}\"\n",
        command_timeout_toml()
    ));
    let mut config = Config::from_toml(&text).expect("test config parses");
    config.store.redis = redis_url.map(str::to_owned);
    config.heal.spool_dir = spool_dir();
    keep_suffix_naming(&mut config);
    config.validate().expect("test config is valid");
    config
}

/// The config `text` with a spool directory of its own, every family that names no placement
/// on `suffix` ([`keep_suffix_naming`]); asserts that it parses and is valid.
pub fn config_from_toml(text: &str) -> Config {
    let mut config = config_from_toml_as_written(text);
    keep_suffix_naming(&mut config);
    config
}

/// The tests written against the `K#i` copy names (which read, write or delete copies by name)
/// predate the `spread` default of a new family: their families keep `suffix` unless the test
/// names a placement. The tests of the default itself use [`config_from_toml_as_written`].
pub fn keep_suffix_naming(config: &mut Config) {
    use hotsplit::placement::Placement;
    config
        .default_family
        .placement
        .get_or_insert(Placement::Suffix);
    for family in &mut config.families {
        family.placement.get_or_insert(Placement::Suffix);
    }
}

/// The config `text` as written (an unset placement is chosen at startup) with a spool
/// directory of its own; asserts that it parses and is valid.
pub fn config_from_toml_as_written(text: &str) -> Config {
    let mut config =
        Config::from_toml(text).unwrap_or_else(|err| panic!("test config parses: {err}\n{text}"));
    // Every service gets a spool of its own: the retry spool is locked by one process.
    config.heal.spool_dir = spool_dir();
    config
        .validate()
        .unwrap_or_else(|err| panic!("test config is valid: {err}\n{text}"));
    config
}

/// A fresh spool directory under the system temp dir, kept after the test (a service may still
/// be flushing it when the test ends; the OS temp cleaner removes it).
pub fn spool_dir() -> std::path::PathBuf {
    tempfile::Builder::new()
        .prefix("hotsplit-spool-")
        .tempdir()
        .expect("create a spool dir")
        .keep()
}

/// A port on 127.0.0.1 that was free a moment ago (bound, then released); asserts nothing.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free port")
        .port()
}

// ---------------------------------------------------------------------------------------------
// Redis, read directly (not through hotsplit)
// ---------------------------------------------------------------------------------------------

/// The master of `cluster` that serves `key`'s slot; panics naming the key if there is none.
fn owner(cluster: &Cluster, key: &str) -> NodeInfo {
    cluster
        .master_for_key(key.as_bytes())
        .unwrap_or_else(|err| panic!("read the cluster topology for {key}: {err}"))
        .unwrap_or_else(|| panic!("a master serves the slot of {key}"))
}

/// The port of the master that serves `key`'s slot; panics naming the key if none does.
pub fn owner_port(cluster: &Cluster, key: &str) -> u16 {
    owner(cluster, key).port
}

/// The ports of the master that serves `key`'s slot and of its replica; asserts it has exactly one.
pub fn owner_and_replica(cluster: &Cluster, key: &str) -> (u16, u16) {
    let master = owner(cluster, key);
    let replicas = cluster
        .replicas_of(&master.id)
        .unwrap_or_else(|err| panic!("read the replicas of {key}'s master: {err}"));
    assert_eq!(replicas.len(), 1, "one replica per master ({key})");
    (master.port, replicas[0].port)
}

/// The `HSET` that makes `copy_key` a corrupt copy: its version is not a number.
pub fn corrupt_copy_command(copy_key: &str) -> [&str; 10] {
    [
        "HSET", copy_key, "ver", "x1", "val", "v", "tomb", "0", "exp", "5",
    ]
}

/// `HGETALL key` on `port` as a field → value map; panics naming the key and port if it fails.
pub fn hgetall(port: u16, key: &str) -> BTreeMap<String, String> {
    let text = devcluster::cli(port, &["HGETALL", key])
        .unwrap_or_else(|err| panic!("HGETALL {key} on 127.0.0.1:{port}: {err}"));
    let lines: Vec<&str> = text.split('\n').collect();
    lines
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| (pair[0].to_owned(), pair[1].to_owned()))
        .collect()
}

/// The `HGETALL` of `copy_key` on the master of `cluster` that owns it (see [`hgetall`]).
pub fn copy_on_owner(cluster: &Cluster, copy_key: &str) -> BTreeMap<String, String> {
    hgetall(owner_port(cluster, copy_key), copy_key)
}

// ---------------------------------------------------------------------------------------------
// HTTP against a running service
// ---------------------------------------------------------------------------------------------

/// Sends a GET of `url` with `headers`; panics naming the URL if it cannot be sent, checks no more.
pub async fn get(http: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Response {
    let mut request = http.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .send()
        .await
        .unwrap_or_else(|err| panic!("GET {url}: {err}"))
}

/// The body of a GET of `url` as JSON; panics naming the URL if it cannot be sent or is not JSON.
pub async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    get(http, url, &[])
        .await
        .json()
        .await
        .unwrap_or_else(|err| panic!("GET {url}: the body is not JSON: {err}"))
}

/// The body of a GET of `url`; asserts a 200, naming the URL and showing the body otherwise.
async fn ok_body(http: &reqwest::Client, url: &str) -> String {
    let answer = get(http, url, &[]).await;
    let status = answer.status();
    let text = answer
        .text()
        .await
        .unwrap_or_else(|err| panic!("GET {url}: read the body: {err}"));
    assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
    text
}

/// The `Hotsplit-Version` of `answer`; panics if it has none or it is not a number.
pub fn served_version(answer: &Response) -> u64 {
    answer
        .headers()
        .get("hotsplit-version")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| panic!("no numeric Hotsplit-Version: {:?}", answer.headers()))
}

/// For a 200 `answer` to `reader`: asserts that its version is not below `floor` (the reader
/// never goes back in time), raises `floor` to it and counts the read in `reads`. Any other
/// answer changes nothing.
pub fn record_monotonic_read(
    reader: &str,
    answer: &Response,
    floor: &mut u64,
    reads: &AtomicUsize,
) {
    if answer.status() != StatusCode::OK {
        return;
    }
    let version = served_version(answer);
    assert!(
        version >= *floor,
        "{reader} went back from {floor} to {version}"
    );
    *floor = version;
    reads.fetch_add(1, Ordering::Relaxed);
}

/// The `/v1/affinity` answer for `key` and `client`; asserts a 200 with a JSON body.
pub async fn affinity(http: &reqwest::Client, base: &str, key: &str, client: &str) -> Value {
    let url = format!("{base}/v1/affinity?key={key}&client={client}");
    let text = ok_body(http, &url).await;
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("GET {url}: the body is not JSON: {err}: {text}"))
}

/// The text of `/metrics` at `base`; asserts a 200.
pub async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    ok_body(http, &format!("{base}/metrics")).await
}

/// The value of the sample `line` (a name with its labels) in `metrics`; 0 when absent.
pub fn sample(metrics: &str, line: &str) -> u64 {
    metrics
        .lines()
        .find_map(|text| {
            text.strip_prefix(line)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |value| value as u64)
}

/// The problem+json body of `answer`; asserts its `status` and `code`, naming `what`.
pub async fn problem(answer: Response, status: StatusCode, code: &str, what: &str) -> Value {
    let answered = answer.status();
    let text = answer
        .text()
        .await
        .unwrap_or_else(|err| panic!("{what}: read the body: {err}"));
    assert_eq!(answered, status, "{what}: {text}");
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{what}: the body is not JSON: {err}: {text}"));
    assert_eq!(body["code"], code, "{what}: {body}");
    body
}

/// One edit to publish: `body` as `version` of `key`.
#[derive(Clone, Copy, Debug)]
pub struct Edit<'a> {
    /// The key the edit writes.
    pub key: &'a str,
    /// The version the edit claims (`?version=`).
    pub version: u64,
    /// The value the edit writes.
    pub body: &'a str,
}

impl<'a> Edit<'a> {
    /// `body` as `version` of `key`.
    pub fn new(key: &'a str, version: u64, body: &'a str) -> Self {
        Self { key, version, body }
    }
}

/// Publishes `edit` through `base`; asserts `accepts(status)`, naming the key, the version and
/// the `wanted` status, and showing the answer's body otherwise.
async fn publish_checked(
    http: &reqwest::Client,
    base: &str,
    edit: Edit<'_>,
    accepts: impl Fn(StatusCode) -> bool,
    wanted: &str,
) -> Response {
    let Edit { key, version, body } = edit;
    let answer = http
        .put(format!("{base}/v1/keys/{key}?version={version}"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|err| panic!("publish {key} version {version}: {err}"));
    let status = answer.status();
    if !accepts(status) {
        let text = answer.text().await.unwrap_or_default();
        panic!("publish {key} version {version}: expected {wanted}, got {status}: {text}");
    }
    answer
}

/// Publishes `edit`; asserts the status is `expected`, naming both.
pub async fn publish_expecting(
    http: &reqwest::Client,
    base: &str,
    edit: Edit<'_>,
    expected: StatusCode,
) -> Response {
    let wanted = expected.to_string();
    publish_checked(http, base, edit, |status| status == expected, &wanted).await
}

/// Publishes `body` as `version` of `key`; asserts a 2xx (applied or queued), naming both.
pub async fn publish_succeeds(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    version: u64,
    body: &str,
) -> Response {
    publish_checked(
        http,
        base,
        Edit::new(key, version, body),
        |status| status.is_success(),
        "a 2xx",
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// The real binary
// ---------------------------------------------------------------------------------------------

/// The variables of the shell that runs the tests that a `hotsplit serve` of theirs must not
/// inherit.
const NOT_INHERITED: [&str; 4] = [
    "HOTSPLIT_REDIS",
    "HOTSPLIT_LISTEN",
    "HOTSPLIT_CONFIG",
    "HOTSPLIT_LOG_FORMAT",
];

/// `hotsplit serve` with nothing inherited from the shell that runs the tests
/// ([`NOT_INHERITED`] removed): the test adds its arguments, environment and stdio.
pub fn serve_command() -> Command {
    let mut command = Command::new(serve_binary());
    command.arg("serve");
    for name in NOT_INHERITED {
        command.env_remove(name);
    }
    command
}

/// The `hotsplit` binary the tests run: this build's, or the one `HOTSPLIT_TEST_SERVE_BINARY`
/// names (to show a test failing on an earlier build: build that commit's binary, point this
/// at it, run the test).
fn serve_binary() -> std::ffi::OsString {
    std::env::var_os("HOTSPLIT_TEST_SERVE_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hotsplit").into())
}

/// [`serve_command`] as a [`ProcessBuilder`], for a [`Binary`].
fn serve_process() -> ProcessBuilder {
    let mut process = Process::builder(serve_binary()).arg("serve");
    for name in NOT_INHERITED {
        process = process.env_remove(name);
    }
    process
}

/// Starts `command` (a [`serve_command`] listening on `port`) and waits until it is ready
/// ([`wait_ready`]).
pub async fn spawn_serve(mut command: Command, port: u16) -> Child {
    let mut child = command.spawn().expect("start hotsplit");
    wait_ready(&mut child, &format!("http://127.0.0.1:{port}"), String::new).await;
    child
}

/// Polls `{base}/readyz` until it answers 2xx (within [`READY_WITHIN`]); panics with the exit
/// status and `log()` if `child` exits first.
pub async fn wait_ready(child: &mut Child, base: &str, log: impl Fn() -> String) {
    let http = reqwest::Client::new();
    let url = format!("{base}/readyz");
    poll("hotsplit serves /readyz", READY_WITHIN, || {
        let exited = child.try_wait().ok().flatten();
        assert!(
            exited.is_none(),
            "hotsplit exited ({exited:?}) before it was ready: {}",
            log()
        );
        let answer = http.get(&url).send();
        async move {
            answer
                .await
                .is_ok_and(|answer| answer.status().is_success())
        }
    })
    .await;
}

/// Sends SIGTERM to `child` and waits for it to exit; returns its exit status and what it wrote
/// to the stdout and stderr pipes the test did not take.
pub async fn sigterm_and_wait(mut child: Child) -> (ExitStatus, String) {
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    tokio::task::spawn_blocking(move || {
        let status = child.wait().expect("wait for hotsplit");
        let mut output = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut output);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut output);
        }
        (status, output)
    })
    .await
    .expect("join the wait for hotsplit")
}

/// A `hotsplit serve` child process with a config file and a log file of its own, SIGKILLed
/// and reaped when dropped.
pub struct Binary {
    /// The process; its stdout and stderr go to `<dir>/<name>.log`.
    process: Process,
    /// `http://127.0.0.1:P`.
    pub base: String,
}

impl Binary {
    /// Starts `hotsplit serve --config <dir>/<name>.toml` with `config` (its `listen` is
    /// filled in); stdout and stderr go to `<dir>/<name>.log`. Does not wait for it.
    pub fn spawn(dir: &Path, name: &str, config: &str) -> Binary {
        let port = free_port();
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!("[server]\nlisten = \"127.0.0.1:{port}\"\nshutdown_grace = \"2s\"\n{config}"),
        )
        .unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        let process = serve_process()
            .arg("--config")
            .arg(&path)
            .env("HOTSPLIT_LOG", "info")
            .spawn(dir.join(format!("{name}.log")))
            .unwrap_or_else(|err| panic!("start hotsplit: {err}"));
        Binary {
            process,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// [`Binary::spawn`], then [`Binary::wait_ready`].
    pub async fn start(dir: &Path, name: &str, config: &str) -> Binary {
        let mut binary = Binary::spawn(dir, name, config);
        binary.wait_ready().await;
        binary
    }

    /// Polls `/readyz` every 20 ms until it answers 2xx (within [`READY_WITHIN`]); panics
    /// with the tail of its log if it exits first or the time is up.
    pub async fn wait_ready(&mut self) {
        let http = reqwest::Client::new();
        let url = format!("{}/readyz", self.base);
        let mut readiness = self
            .process
            .readiness("hotsplit serves /readyz", READY_WITHIN);
        loop {
            let last = match http.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => return,
                Ok(answer) => answer.status().to_string(),
                Err(err) => format!("no answer: {err}"),
            };
            if let Err(failure) = readiness.not_yet(&last) {
                panic!("{failure}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends it `signal` (e.g. `libc::SIGHUP`); panics if it has already been reaped.
    pub fn signal(&self, signal: libc::c_int) {
        self.process
            .signal(signal)
            .unwrap_or_else(|err| panic!("signal hotsplit: {err}"));
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.process
            .try_wait()
            .unwrap_or_else(|err| panic!("poll hotsplit: {err}"))
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// SIGKILLs it (a crash) and reaps it.
    pub fn sigkill(&mut self) {
        self.process
            .kill()
            .unwrap_or_else(|err| panic!("SIGKILL hotsplit: {err}"));
    }
}

/// Runs `hotsplit audit --json` with `args`; asserts it exits 0 and returns its report.
pub async fn audit_json(args: Vec<String>) -> Value {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hotsplit"))
            .arg("audit")
            .args(&args)
            .arg("--json")
            .env_remove("HOTSPLIT_REDIS")
            .env_remove("HOTSPLIT_CONFIG")
            .output()
            .expect("run hotsplit audit")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).expect("a JSON report")
}
