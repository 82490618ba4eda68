//! Throwaway `redis-server` processes on loopback: standalone, primary with replicas, and cluster.
//!
//! This module owns starting, signalling and stopping real Redis servers for the integration
//! tests, the criterion benches and `hotsplit check`. It is test and experiment tooling, not the
//! product path: the service talks to Redis only through `store::redis` and fred, and nothing in
//! the service depends on this module. Everything here is synchronous std code (no tokio).
//!
//! # What it provides
//! - [`Standalone`], [`PrimaryReplica`] and [`Cluster`]: started, waited for until usable, and
//!   killed (with their temporary directories removed) when dropped.
//! - [`RedisNode`]: one server process, with fault injection (`pause`, `resume`, `kill`,
//!   `shutdown_nosave`, `restart`).
//! - [`cli`], [`cli_with_timeout`] and [`ping`]: a minimal RESP client for sending a command to a
//!   node and reading the reply as text.
//! - [`key_slot`] and [`NodeInfo`]: slot arithmetic and the parsed `CLUSTER NODES` view.
//!
//! # Invariants
//! - Every server is spawned by one long-lived "spawner" thread with `PR_SET_PDEATHSIG` set to
//!   `SIGKILL`. Linux delivers that signal when the *thread* that forked the child exits, and test
//!   threads exit after every test, so no other thread ever spawns a server. The spawner thread
//!   never exits, so servers die exactly when the test process dies, however it dies.
//! - Every live server pid is in a process-wide registry, and an `atexit` handler sends `SIGKILL`
//!   to every pid still registered when the process exits normally (statics are never dropped).
//! - A signal is only ever sent to a pid that has not been reaped yet, so a recycled pid is never
//!   hit by mistake.
//! - Ports come from `20000..=50000` (never the developer's Redis on 6379), and a port is only
//!   used if both it and its cluster bus port (port + 10000) can be bound on 127.0.0.1.
//! - Nothing is printed to stdout; progress goes to `tracing::debug!`.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, Once, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// The lowest client port this module hands out.
const PORT_MIN: u16 = 20_000;
/// The highest client port this module hands out (its bus port is 60000).
const PORT_MAX: u16 = 50_000;
/// Redis Cluster listens for its bus on the client port plus this offset.
const BUS_PORT_OFFSET: u16 = 10_000;
/// How many candidate ports one allocation tries before giving up.
const PORT_CANDIDATES: usize = 2_000;
/// How many times a start is retried with fresh ports when a port is taken under our feet.
const START_ATTEMPTS: usize = 6;
/// How many times `restart` retries when its (fixed) port is briefly taken by someone else.
const RESTART_ATTEMPTS: usize = 10;
/// How long a freshly spawned server has to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica has to report `master_link_status:up`.
const REPLICA_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `shutdown_nosave` waits for the process to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `redis-cli --cluster create` may run.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// The step of the readiness and health polls.
const POLL_STEP: Duration = Duration::from_millis(20);
/// The step of the cluster-wide polls, which open one connection per node per step.
const CLUSTER_POLL_STEP: Duration = Duration::from_millis(50);
/// The socket timeout of the probes used by polls; a paused node must not stall a poll for long.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The socket timeout of [`cli`].
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How many log lines a start failure carries.
const LOG_TAIL_LINES: usize = 25;
/// The number of hash slots in Redis Cluster.
const CLUSTER_SLOTS: u16 = 16_384;
/// The text Redis logs when it cannot bind a port. Redis gives no structured signal for this, so
/// the log is the only place to learn it.
const ADDR_IN_USE: &str = "Address already in use";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Everything that can go wrong while starting, driving or stopping throwaway servers.
#[derive(Debug, thiserror::Error)]
pub enum DevClusterError {
    /// A required binary is not on `PATH`.
    #[error("{binary} not found on PATH; install it with: apt-get install -y {package}")]
    MissingBinary {
        /// The binary that was looked for, e.g. `redis-server`.
        binary: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// A server exited, or someone else answered on its port, while it was starting.
    #[error(
        "redis-server on port {port} failed to start: {reason}; log tail of {log}:\n{log_tail}"
    )]
    StartFailed {
        /// The client port the server was meant to listen on.
        port: u16,
        /// What went wrong, e.g. the exit status.
        reason: String,
        /// The path of the node's log file.
        log: String,
        /// The last lines the server wrote (log file and stderr) during this start.
        log_tail: String,
    },
    /// A condition did not become true in time.
    #[error("timed out after {waited:?} waiting for {condition}; last seen: {last_seen}")]
    Timeout {
        /// What was waited for, e.g. "cluster on ports [..] to be healthy".
        condition: String,
        /// How long was waited.
        waited: Duration,
        /// Why the condition was still false at the last check.
        last_seen: String,
    },
    /// A server answered a command with an error, or a helper command failed.
    #[error("command `{command}` on port {port} failed: {message}")]
    Command {
        /// The port of the node the command was sent to.
        port: u16,
        /// The command line.
        command: String,
        /// The error reply or the helper's output.
        message: String,
    },
    /// A process operation was asked of a node whose process is not running.
    #[error("redis-server on port {port} is not running")]
    NotRunning {
        /// The node's client port.
        port: u16,
    },
    /// The options cannot describe a working deployment.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// An I/O operation failed (file system, socket, process).
    #[error("io error while {context}: {source}")]
    Io {
        /// What was being done, e.g. "sending `PING` to 127.0.0.1:20001".
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// This module's result type.
type Result<T, E = DevClusterError> = std::result::Result<T, E>;

/// Wraps an [`io::Error`] with what was being done.
fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> DevClusterError {
    let context = context.into();
    move |source| DevClusterError::Io { context, source }
}

/// The outcome of one start attempt that did not produce a usable server.
#[derive(Debug)]
enum Attempt {
    /// The port was taken by someone else; trying again with other ports may succeed.
    PortTaken(DevClusterError),
    /// Anything else; retrying would fail the same way.
    Fatal(DevClusterError),
}

impl From<DevClusterError> for Attempt {
    fn from(error: DevClusterError) -> Self {
        Attempt::Fatal(error)
    }
}

impl Attempt {
    /// The underlying error, whatever the kind of failure.
    fn into_error(self) -> DevClusterError {
        match self {
            Attempt::PortTaken(error) | Attempt::Fatal(error) => error,
        }
    }
}

/// Runs `attempt` until it succeeds, fails fatally, or ports were taken [`START_ATTEMPTS`] times.
fn with_port_retries<T>(what: &str, mut attempt: impl FnMut() -> Result<T, Attempt>) -> Result<T> {
    let mut last = None;
    for round in 1..=START_ATTEMPTS {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(Attempt::Fatal(error)) => return Err(error),
            Err(Attempt::PortTaken(error)) => {
                tracing::debug!(%error, round, "{what}: a port was taken, retrying with new ports");
                last = Some(error);
            }
        }
    }
    Err(last.unwrap_or_else(|| DevClusterError::InvalidOptions(format!("{what}: no attempt made"))))
}

// ---------------------------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------------------------

/// Finds `redis-server` on `PATH`.
///
/// # Errors
/// [`DevClusterError::MissingBinary`] when it is not there.
pub fn redis_server_path() -> Result<PathBuf> {
    find_on_path("redis-server").ok_or(DevClusterError::MissingBinary {
        binary: "redis-server",
        package: "redis-server",
    })
}

/// Finds `redis-cli` on `PATH` (needed to create clusters).
///
/// # Errors
/// [`DevClusterError::MissingBinary`] when it is not there.
pub fn redis_cli_path() -> Result<PathBuf> {
    find_on_path("redis-cli").ok_or(DevClusterError::MissingBinary {
        binary: "redis-cli",
        package: "redis-tools",
    })
}

/// Returns the first executable file called `name` in the directories of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            fs::metadata(candidate)
                .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

// ---------------------------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------------------------

/// The process-wide port cursor. It starts at a random offset so that concurrent test binaries
/// rarely probe the same ports, and it only moves forward so that concurrent threads of one
/// process never get the same port.
static PORT_CURSOR: OnceLock<AtomicU32> = OnceLock::new();

/// Returns the next candidate port in `PORT_MIN..=PORT_MAX`, wrapping around.
fn next_candidate_port() -> u16 {
    let span = u32::from(PORT_MAX - PORT_MIN) + 1;
    let cursor = PORT_CURSOR.get_or_init(|| AtomicU32::new(rand::random_range(0..span)));
    let offset = cursor.fetch_add(1, Ordering::Relaxed) % span;
    // The offset is below `span`, which fits in a u16 together with PORT_MIN.
    PORT_MIN + offset as u16
}

/// Tells whether `port` and its bus port can both be bound on 127.0.0.1 right now.
fn port_pair_free(port: u16) -> bool {
    let client = TcpListener::bind((Ipv4Addr::LOCALHOST, port));
    let bus = TcpListener::bind((Ipv4Addr::LOCALHOST, port + BUS_PORT_OFFSET));
    client.is_ok() && bus.is_ok()
}

/// Hands out a port whose client and bus ports are both free right now.
fn allocate_port() -> Result<u16> {
    for _ in 0..PORT_CANDIDATES {
        let port = next_candidate_port();
        if port_pair_free(port) {
            return Ok(port);
        }
    }
    Err(DevClusterError::Io {
        context: format!(
            "finding a free port pair in {PORT_MIN}..={PORT_MAX} after {PORT_CANDIDATES} candidates"
        ),
        source: io::Error::from(io::ErrorKind::AddrInUse),
    })
}

// ---------------------------------------------------------------------------------------------
// Spawner thread and pid registry
// ---------------------------------------------------------------------------------------------

/// One request to the spawner thread.
struct SpawnRequest {
    /// The binary to run.
    program: PathBuf,
    /// Its arguments.
    args: Vec<OsString>,
    /// Where the child's stdout and stderr go (Redis writes early config errors there).
    output: File,
    /// Where the spawned child (or the spawn error) is sent back.
    reply: mpsc::Sender<io::Result<Child>>,
}

/// The sending side of the spawner thread's channel, created on first use and never dropped.
static SPAWNER: Mutex<Option<mpsc::Sender<SpawnRequest>>> = Mutex::new(None);

/// Returns a sender to the spawner thread, starting the thread on first use.
fn spawner() -> Result<mpsc::Sender<SpawnRequest>> {
    let mut guard = SPAWNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(sender) = guard.as_ref() {
        return Ok(sender.clone());
    }
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("devcluster-spawner".to_owned())
        .spawn(move || spawner_loop(receiver))
        .map_err(io_error("starting the devcluster spawner thread"))?;
    *guard = Some(sender.clone());
    Ok(sender)
}

/// The body of the spawner thread: spawn, register, reply, forever.
fn spawner_loop(receiver: mpsc::Receiver<SpawnRequest>) {
    while let Ok(request) = receiver.recv() {
        let result = spawn_with_deathsig(&request.program, &request.args, request.output);
        if let Ok(child) = &result {
            register_pid(child.id());
        }
        if let Err(mpsc::SendError(Ok(mut child))) = request.reply.send(result) {
            // Nobody waits for this child any more, so it must not outlive this call.
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            unregister_pid(pid);
        }
    }
    // The sender lives in a static and is never dropped, so the loop above never ends. Should it
    // end anyway, this thread must stay alive: its exit would SIGKILL every server it spawned.
    loop {
        thread::park();
    }
}

/// Spawns `program` so that the kernel SIGKILLs it when the calling thread exits.
fn spawn_with_deathsig(program: &Path, args: &[OsString], output: File) -> io::Result<Child> {
    let stderr = output.try_clone()?;
    // The parent's pid is read before forking so that the child can tell whether its parent
    // already died before the death signal was armed.
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(output))
        .stderr(Stdio::from(stderr));
    // SAFETY: the closure runs in the child between fork and exec. It only calls prctl and
    // getppid, which are async-signal-safe, and builds errors without allocating.
    unsafe {
        command.pre_exec(move || {
            let signal = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Asks the spawner thread to spawn a process and waits for the result.
fn spawn_via_spawner(program: &Path, args: &[OsString], output: File) -> Result<Child> {
    let (reply, receive) = mpsc::channel();
    let request = SpawnRequest {
        program: program.to_owned(),
        args: args.to_vec(),
        output,
        reply,
    };
    let context = || format!("spawning {}", program.display());
    spawner()?.send(request).map_err(|_| DevClusterError::Io {
        context: context(),
        source: io::Error::other("the spawner thread is gone"),
    })?;
    match receive.recv() {
        Ok(result) => result.map_err(io_error(context())),
        Err(_) => Err(DevClusterError::Io {
            context: context(),
            source: io::Error::other("the spawner thread dropped the request"),
        }),
    }
}

/// The number of pids the registry can hold; beyond it, pids rely on PR_SET_PDEATHSIG alone.
const REGISTRY_SLOTS: usize = 1024;

/// Live server pids, 0 for a free slot. Lock-free so the `atexit` handler can never block.
static LIVE_PIDS: [AtomicI32; REGISTRY_SLOTS] = [const { AtomicI32::new(0) }; REGISTRY_SLOTS];

/// Guards the one-time installation of the `atexit` handler.
static ATEXIT_INSTALLED: Once = Once::new();

/// Adds `pid` to the registry and makes sure the `atexit` handler is installed.
fn register_pid(pid: u32) {
    ATEXIT_INSTALLED.call_once(|| {
        // SAFETY: the handler is a plain extern "C" function that only touches atomics and kill.
        if unsafe { libc::atexit(kill_registered_pids) } != 0 {
            tracing::debug!("atexit registration failed; servers rely on PR_SET_PDEATHSIG alone");
        }
    });
    let Ok(pid) = i32::try_from(pid) else { return };
    for slot in &LIVE_PIDS {
        if slot
            .compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
    tracing::debug!(
        pid,
        "pid registry full; this server relies on PR_SET_PDEATHSIG alone"
    );
}

/// Removes `pid` from the registry.
fn unregister_pid(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    for slot in &LIVE_PIDS {
        if slot
            .compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// The `atexit` handler: SIGKILLs every server that is still registered.
extern "C" fn kill_registered_pids() {
    for slot in &LIVE_PIDS {
        let pid = slot.swap(0, Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A minimal RESP client
// ---------------------------------------------------------------------------------------------

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nfoo`.
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`.
    Nil,
    /// `*2 ...`.
    Array(Vec<Reply>),
}

/// Encodes one command as a RESP array of bulk strings.
fn encode_command(args: &[&str], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one CRLF-terminated line without the terminator.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Parses a length or integer field of a RESP header.
fn parse_number(text: &str) -> io::Result<i64> {
    text.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad RESP number {text:?}"),
        )
    })
}

/// Reads one RESP2 reply.
fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(parse_number(rest)?)),
        "$" => {
            let Ok(len) = usize::try_from(parse_number(rest)?) else {
                return Ok(Reply::Nil);
            };
            let mut data = vec![0; len + 2];
            reader.read_exact(&mut data)?;
            data.truncate(len);
            Ok(Reply::Bulk(data))
        }
        "*" => {
            let Ok(len) = usize::try_from(parse_number(rest)?) else {
                return Ok(Reply::Nil);
            };
            (0..len)
                .map(|_| read_reply(reader))
                .collect::<io::Result<_>>()
                .map(Reply::Array)
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected RESP line {line:?}"),
        )),
    }
}

/// Sends `commands` pipelined over one fresh connection and reads one reply per command.
///
/// `timeout` bounds the connect and every single socket read and write.
fn round_trip(port: u16, commands: &[&[&str]], timeout: Duration) -> io::Result<Vec<Reply>> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut request = Vec::new();
    for command in commands {
        encode_command(command, &mut request);
    }
    (&stream).write_all(&request)?;
    let mut reader = BufReader::new(&stream);
    commands.iter().map(|_| read_reply(&mut reader)).collect()
}

/// Appends the text form of `reply` (see [`cli`]) to `out`.
fn write_reply_text(reply: &Reply, out: &mut String) {
    match reply {
        Reply::Simple(text) | Reply::Error(text) => out.push_str(text),
        Reply::Integer(value) => out.push_str(&value.to_string()),
        Reply::Bulk(data) => out.push_str(&String::from_utf8_lossy(data)),
        Reply::Nil => {}
        Reply::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push('\n');
                }
                write_reply_text(item, out);
            }
        }
    }
}

/// Sends one command to `127.0.0.1:port` and returns the reply as text, like `redis-cli` does
/// when its output is not a terminal, but without the trailing newline.
///
/// The text format: a status or bulk string is returned verbatim (bulk strings decoded as lossy
/// UTF-8; `INFO` and `CLUSTER INFO` keep their `\r\n` line ends, which [`str::lines`] strips); an
/// integer in decimal; a nil as the empty string; an array as its elements' texts joined with
/// `\n`, nested arrays flattened (so `HGETALL` gives `field\nvalue\nfield\nvalue`). An error
/// nested in an array appears as its message. Arguments are sent as binary-safe bulk strings, so
/// no quoting is needed. Uses a 10 s socket timeout; see [`cli_with_timeout`].
///
/// # Errors
/// [`DevClusterError::Command`] when the reply is an error;
/// [`DevClusterError::Io`] when the node cannot be reached or does not answer in time.
pub fn cli(port: u16, args: &[&str]) -> Result<String> {
    cli_with_timeout(port, args, DEFAULT_COMMAND_TIMEOUT)
}

/// Like [`cli`], with `timeout` bounding the connect and every socket read and write.
///
/// A short timeout is how a test tells that a paused (SIGSTOPped) node does not answer.
///
/// # Errors
/// As for [`cli`]; a timeout is a [`DevClusterError::Io`] whose source has kind `TimedOut`.
pub fn cli_with_timeout(port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    let command_line = args.join(" ");
    let replies = round_trip(port, &[args], timeout).map_err(|source| DevClusterError::Io {
        context: format!("sending `{command_line}` to 127.0.0.1:{port}"),
        source: name_timeout(source, timeout),
    })?;
    let mut text = String::new();
    for reply in &replies {
        if let Reply::Error(message) = reply {
            return Err(DevClusterError::Command {
                port,
                command: command_line,
                message: message.clone(),
            });
        }
        write_reply_text(reply, &mut text);
    }
    Ok(text)
}

/// Replaces the opaque "Resource temporarily unavailable" of a socket timeout with a message
/// that says what happened; other errors pass through.
fn name_timeout(error: io::Error, timeout: Duration) -> io::Error {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        ),
        _ => error,
    }
}

/// Sends `PING` to `127.0.0.1:port` and checks for `PONG`, waiting at most `timeout` per step.
///
/// # Errors
/// As for [`cli_with_timeout`], plus [`DevClusterError::Command`] for any reply but `PONG`.
pub fn ping(port: u16, timeout: Duration) -> Result<()> {
    let reply = cli_with_timeout(port, &["PING"], timeout)?;
    if reply == "PONG" {
        Ok(())
    } else {
        Err(DevClusterError::Command {
            port,
            command: "PING".to_owned(),
            message: format!("unexpected reply {reply:?}"),
        })
    }
}

/// Returns the value of `field` in an `INFO`-style `field:value` text.
fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

// ---------------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------------

/// Calls `check` every `step` until it returns `Ok` or `timeout` has passed.
///
/// `check` returns why the condition is still false; the last reason ends up in the error.
fn poll_until<T>(
    timeout: Duration,
    step: Duration,
    condition: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last_seen) if started.elapsed() >= timeout => {
                return Err(DevClusterError::Timeout {
                    condition: condition.to_owned(),
                    waited: started.elapsed(),
                    last_seen,
                })
            }
            Err(_) => thread::sleep(step),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One server process
// ---------------------------------------------------------------------------------------------

/// The role a node was started in. A cluster's live roles come from [`Cluster::topology`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRole {
    /// A lone server.
    Standalone,
    /// The primary of a [`PrimaryReplica`].
    Primary,
    /// A replica of a [`PrimaryReplica`], started with `--replicaof 127.0.0.1 <primary_port>`.
    Replica {
        /// The primary's client port.
        primary_port: u16,
    },
    /// A member of a [`Cluster`].
    ClusterNode,
}

/// How to start a node, apart from its port.
#[derive(Clone, Debug)]
struct NodeSpec {
    /// The role, which decides the replication and cluster arguments.
    role: NodeRole,
    /// `cluster-node-timeout` in ms, for cluster nodes.
    cluster_node_timeout_ms: u64,
    /// Extra arguments appended to the command line, one argv word each.
    extra_args: Vec<String>,
}

/// Where a node's output files ended before a start, so that a failure report shows only what
/// this start wrote.
#[derive(Clone, Copy, Debug)]
struct LogOffsets {
    /// Length of `redis.log` before the start.
    log: u64,
    /// Length of `redis.stdio` before the start.
    stdio: u64,
}

/// The outcome of one readiness probe.
enum Probe {
    /// Our process answers `PONG`.
    Ready,
    /// Another process (with this pid) answers on our port.
    Foreign(u32),
    /// Not ready yet, for this reason.
    NotYet(String),
}

/// One `redis-server` process on 127.0.0.1, in its own temporary directory.
///
/// All methods take `&self` (the process handle sits behind a mutex), so a node can be shared
/// across threads, e.g. a fault-injection thread pausing it while a test reads. Dropping the node
/// SIGKILLs its process and removes its directory.
#[derive(Debug)]
pub struct RedisNode {
    /// The client port; the cluster bus, if any, is `port + 10000`.
    port: u16,
    /// The node's directory: `redis.log`, `redis.stdio`, `nodes.conf`. Removed on drop.
    dir: PathBuf,
    /// The role the node was started in.
    role: NodeRole,
    /// The `redis-server` binary, kept for `restart`.
    program: PathBuf,
    /// The full argument list, kept so that `restart` starts the very same server.
    args: Vec<OsString>,
    /// The current process, `None` once it has been reaped. Signals are only sent while `Some`.
    process: Mutex<Option<Child>>,
    /// The pid of the most recently started process, kept after it exits for tests to check.
    last_pid: AtomicU32,
}

impl RedisNode {
    /// Creates the node's directory and spawns its process, without waiting for it to answer.
    fn spawn(program: &Path, port: u16, spec: &NodeSpec) -> Result<RedisNode> {
        let dir = create_node_dir(port)?;
        let args = server_args(port, &dir, spec);
        let node = RedisNode {
            port,
            dir,
            role: spec.role,
            program: program.to_owned(),
            args,
            process: Mutex::new(None),
            last_pid: AtomicU32::new(0),
        };
        // From here on, dropping `node` cleans up the directory and any process.
        let mut process = node.lock_process();
        node.spawn_locked(&mut process)?;
        drop(process);
        Ok(node)
    }

    /// Spawns a new process into `process` (which must be `None`).
    fn spawn_locked(&self, process: &mut Option<Child>) -> Result<()> {
        let stdio_path = self.dir.join("redis.stdio");
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stdio_path)
            .map_err(io_error(format!("opening {}", stdio_path.display())))?;
        let child = spawn_via_spawner(&self.program, &self.args, output)?;
        tracing::debug!(port = self.port, pid = child.id(), role = ?self.role, "spawned redis-server");
        self.last_pid.store(child.id(), Ordering::SeqCst);
        *process = Some(child);
        Ok(())
    }

    /// Waits until the node's own process answers `PING`.
    ///
    /// Fails with [`Attempt::PortTaken`] when the process exits with "Address already in use" in
    /// its log, or when another process answers on the port; the process is then killed.
    fn await_ready(&self, offsets: LogOffsets) -> Result<(), Attempt> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.poll_exit()? {
                return Err(
                    self.start_failure(offsets, format!("exited while starting ({status})"))
                );
            }
            let last_seen = match self.probe() {
                Probe::Ready => {
                    tracing::debug!(port = self.port, elapsed = ?started.elapsed(), "redis-server ready");
                    return Ok(());
                }
                Probe::Foreign(pid) => {
                    let _ = self.kill();
                    let reason = format!("another redis-server (pid {pid}) answers on the port");
                    let failure = self.start_failure(offsets, reason).into_error();
                    return Err(Attempt::PortTaken(failure));
                }
                Probe::NotYet(reason) => reason,
            };
            if started.elapsed() >= READY_TIMEOUT {
                let _ = self.kill();
                return Err(Attempt::Fatal(DevClusterError::Timeout {
                    condition: format!("redis-server on port {} to answer PING", self.port),
                    waited: started.elapsed(),
                    last_seen,
                }));
            }
            thread::sleep(POLL_STEP);
        }
    }

    /// Asks the port who answers and whether it is ready.
    fn probe(&self) -> Probe {
        let replies = match round_trip(self.port, &[&["INFO", "server"], &["PING"]], PROBE_TIMEOUT)
        {
            Ok(replies) => replies,
            Err(error) => return Probe::NotYet(format!("connect or read failed: {error}")),
        };
        let answering_pid = match replies.first() {
            Some(Reply::Bulk(info)) => info_field(&String::from_utf8_lossy(info), "process_id")
                .and_then(|pid| pid.parse().ok()),
            other => return Probe::NotYet(format!("INFO server answered {other:?}")),
        };
        let own_pid = self.last_pid.load(Ordering::SeqCst);
        match (answering_pid, replies.get(1)) {
            (Some(pid), _) if pid != own_pid => Probe::Foreign(pid),
            (Some(_), Some(Reply::Simple(pong))) if pong == "PONG" => Probe::Ready,
            (_, other) => Probe::NotYet(format!("PING answered {other:?}")),
        }
    }

    /// Builds the start failure for the current start, classifying "Address already in use".
    fn start_failure(&self, offsets: LogOffsets, reason: String) -> Attempt {
        let new_output = format!(
            "{}{}",
            read_from(&self.log_path(), offsets.log),
            read_from(&self.dir.join("redis.stdio"), offsets.stdio)
        );
        let error = DevClusterError::StartFailed {
            port: self.port,
            reason,
            log: self.log_path().display().to_string(),
            log_tail: tail_lines(&new_output, LOG_TAIL_LINES),
        };
        if new_output.contains(ADDR_IN_USE) {
            Attempt::PortTaken(error)
        } else {
            Attempt::Fatal(error)
        }
    }

    /// Records how long the output files are now.
    fn log_offsets(&self) -> LogOffsets {
        let len = |path: &Path| fs::metadata(path).map(|meta| meta.len()).unwrap_or(0);
        LogOffsets {
            log: len(&self.log_path()),
            stdio: len(&self.dir.join("redis.stdio")),
        }
    }

    /// Locks the process handle, ignoring poisoning (the handle stays consistent).
    fn lock_process(&self) -> MutexGuard<'_, Option<Child>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reaps the process if it has exited, returning its status then.
    fn poll_exit(&self) -> Result<Option<ExitStatus>> {
        let mut process = self.lock_process();
        reap_if_exited(self.port, &mut process)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address clients connect to: `"127.0.0.1:<port>"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A URL for a client of this one node: `"redis://127.0.0.1:<port>"`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The pid of the most recently started process. It stays readable after the process has
    /// exited, so that a test can check the process is gone; see [`RedisNode::is_running`].
    pub fn pid(&self) -> u32 {
        self.last_pid.load(Ordering::SeqCst)
    }

    /// The role the node was started in.
    pub fn role(&self) -> NodeRole {
        self.role
    }

    /// The node's temporary directory (removed when the node is dropped).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's log file, `<dir>/redis.log`.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Tells whether the process exists and has not exited; a paused process counts as running.
    pub fn is_running(&self) -> bool {
        matches!(self.poll_exit(), Ok(None)) && self.lock_process().is_some()
    }

    /// Stops the process with SIGSTOP: it keeps its sockets but answers nothing until resumed.
    ///
    /// # Errors
    /// [`DevClusterError::NotRunning`] when the process is gone; [`DevClusterError::Io`] when the
    /// signal cannot be sent.
    pub fn pause(&self) -> Result<()> {
        self.signal(libc::SIGSTOP, "pausing")
    }

    /// Continues a paused process with SIGCONT.
    ///
    /// # Errors
    /// As for [`RedisNode::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(libc::SIGCONT, "resuming")
    }

    /// Sends `signal` to the live process.
    fn signal(&self, signal: libc::c_int, what: &str) -> Result<()> {
        let mut process = self.lock_process();
        if reap_if_exited(self.port, &mut process)?.is_some() {
            return Err(DevClusterError::NotRunning { port: self.port });
        }
        let Some(child) = process.as_ref() else {
            return Err(DevClusterError::NotRunning { port: self.port });
        };
        tracing::debug!(port = self.port, pid = child.id(), "{what} redis-server");
        send_signal(child.id(), signal).map_err(io_error(format!(
            "{what} redis-server on port {}",
            self.port
        )))
    }

    /// Kills the process with SIGKILL and reaps it. Does nothing if it is already gone.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the process cannot be waited for.
    pub fn kill(&self) -> Result<()> {
        let mut process = self.lock_process();
        match process.take() {
            Some(child) => kill_and_reap(self.port, child),
            None => Ok(()),
        }
    }

    /// Tells whether the process is stopped by a signal (e.g. by [`RedisNode::pause`]), as
    /// reported by `/proc/<pid>/stat`.
    pub fn is_paused(&self) -> bool {
        let process = self.lock_process();
        let Some(child) = process.as_ref() else {
            return false;
        };
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may contain spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        matches!(state, Some("T" | "t"))
    }

    /// Sends `SHUTDOWN NOSAVE` and waits (up to 10 s) for the process to exit.
    ///
    /// # Errors
    /// [`DevClusterError::NotRunning`] when the process is gone; [`DevClusterError::Command`] when
    /// the node is paused (a queued SHUTDOWN would run at the next resume, so none is sent) or
    /// the server refuses; [`DevClusterError::Timeout`] when it does not exit in time.
    pub fn shutdown_nosave(&self) -> Result<()> {
        if !self.is_running() {
            return Err(DevClusterError::NotRunning { port: self.port });
        }
        if self.is_paused() {
            return Err(DevClusterError::Command {
                port: self.port,
                command: "SHUTDOWN NOSAVE".to_owned(),
                message: "the process is paused; resume it first, or use kill".to_owned(),
            });
        }
        match round_trip(self.port, &[&["SHUTDOWN", "NOSAVE"]], PROBE_TIMEOUT) {
            Ok(replies) => {
                if let Some(Reply::Error(message)) = replies.first() {
                    return Err(DevClusterError::Command {
                        port: self.port,
                        command: "SHUTDOWN NOSAVE".to_owned(),
                        message: message.clone(),
                    });
                }
            }
            // A server that shuts down closes the connection without replying.
            Err(error) => tracing::debug!(port = self.port, %error, "SHUTDOWN NOSAVE sent"),
        }
        poll_until(
            EXIT_TIMEOUT,
            POLL_STEP,
            &format!(
                "redis-server on port {} to exit after SHUTDOWN NOSAVE",
                self.port
            ),
            || match self.poll_exit() {
                Ok(Some(_)) => Ok(()),
                Ok(None) if self.lock_process().is_none() => Ok(()),
                Ok(None) => Err("the process is still running".to_owned()),
                Err(error) => Err(error.to_string()),
            },
        )
    }

    /// Starts a new process on the same port, with the same directory and arguments (so a
    /// cluster node reloads its `nodes.conf`), and waits until it answers `PING`. A process
    /// that is still running is SIGKILLed first.
    ///
    /// The dataset is not kept: nodes run without persistence, so a restarted node is empty.
    ///
    /// # Errors
    /// [`DevClusterError::StartFailed`] (with the log tail) or [`DevClusterError::Timeout`] when
    /// the new process does not come up.
    pub fn restart(&self) -> Result<()> {
        let mut last_error = None;
        for attempt in 1..=RESTART_ATTEMPTS {
            {
                let mut process = self.lock_process();
                if let Some(child) = process.take() {
                    kill_and_reap(self.port, child)?;
                }
                let offsets = self.log_offsets();
                self.spawn_locked(&mut process)?;
                drop(process);
                match self.await_ready(offsets) {
                    Ok(()) => return Ok(()),
                    Err(Attempt::Fatal(error)) => return Err(error),
                    Err(Attempt::PortTaken(error)) => {
                        tracing::debug!(port = self.port, attempt, %error, "port briefly taken, retrying restart");
                        last_error = Some(error);
                    }
                }
            }
            // The port is fixed, so the only option is to wait for whoever holds it to let go.
            thread::sleep(POLL_STEP * 5 * attempt as u32);
        }
        Err(last_error.unwrap_or(DevClusterError::NotRunning { port: self.port }))
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if let Err(error) = self.kill() {
            tracing::debug!(port = self.port, %error, "killing redis-server on drop failed");
        }
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), %error, "removing node directory failed");
        }
    }
}

/// Reaps `process` if it has exited, leaving `None` behind.
fn reap_if_exited(port: u16, process: &mut Option<Child>) -> Result<Option<ExitStatus>> {
    let Some(child) = process.as_mut() else {
        return Ok(None);
    };
    let pid = child.id();
    let status = child
        .try_wait()
        .map_err(io_error(format!("checking redis-server on port {port}")))?;
    if status.is_some() {
        *process = None;
        unregister_pid(pid);
    }
    Ok(status)
}

/// SIGKILLs `child`, reaps it and unregisters its pid.
fn kill_and_reap(port: u16, mut child: Child) -> Result<()> {
    let pid = child.id();
    // ESRCH cannot happen for an unreaped child; any other failure shows up in `wait` below.
    let _ = send_signal(pid, libc::SIGKILL);
    let waited = child.wait();
    unregister_pid(pid);
    tracing::debug!(port, pid, "killed redis-server");
    waited
        .map(|_| ())
        .map_err(io_error(format!("reaping redis-server on port {port}")))
}

/// Sends `signal` to `pid`.
fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The prefix of every node directory: `<temp dir>/hotsplit-devcluster-<owner pid>-<port>-<random>`.
const NODE_DIR_PREFIX: &str = "hotsplit-devcluster-";

/// Guards the one-time sweep of directories left behind by dead processes.
static STALE_DIRS_SWEPT: Once = Once::new();

/// Removes node directories whose owning process no longer exists. A process that is killed,
/// or that leaks a node, never runs `Drop`, so its directories stay behind until this sweep.
fn sweep_stale_node_dirs(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|name| name.strip_prefix(NODE_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let owner_gone = unsafe { libc::kill(owner, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if owner_gone {
            let path = entry.path();
            tracing::debug!(dir = %path.display(), "removing node directory of a dead process");
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Creates a fresh, uniquely named directory for a node under the system temp dir.
fn create_node_dir(port: u16) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    STALE_DIRS_SWEPT.call_once(|| sweep_stale_node_dirs(&base));
    let mut last_error = None;
    for _ in 0..8 {
        let name = format!(
            "{NODE_DIR_PREFIX}{}-{port}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let dir = base.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) => last_error = Some(error),
        }
    }
    Err(DevClusterError::Io {
        context: format!("creating a node directory under {}", base.display()),
        source: last_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)),
    })
}

/// Builds the `redis-server` command line for a node.
fn server_args(port: u16, dir: &Path, spec: &NodeSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |name: &str, value: OsString| {
        args.push(OsString::from(name));
        args.push(value);
    };
    push("--port", port.to_string().into());
    push("--bind", "127.0.0.1".into());
    push("--save", "".into());
    push("--appendonly", "no".into());
    push("--dir", dir.as_os_str().to_owned());
    push("--logfile", dir.join("redis.log").into_os_string());
    push("--daemonize", "no".into());
    push("--repl-diskless-sync", "yes".into());
    push("--repl-diskless-sync-delay", "0".into());
    push("--enable-debug-command", "local".into());
    match spec.role {
        NodeRole::Replica { primary_port } => {
            args.push("--replicaof".into());
            args.push("127.0.0.1".into());
            args.push(primary_port.to_string().into());
        }
        NodeRole::ClusterNode => {
            args.push("--cluster-enabled".into());
            args.push("yes".into());
            args.push("--cluster-config-file".into());
            args.push(dir.join("nodes.conf").into_os_string());
            args.push("--cluster-node-timeout".into());
            args.push(spec.cluster_node_timeout_ms.to_string().into());
        }
        NodeRole::Standalone | NodeRole::Primary => {}
    }
    args.extend(spec.extra_args.iter().map(OsString::from));
    args
}

/// Reads a file from `offset` to its end, as lossy UTF-8; a missing file reads as empty.
fn read_from(path: &Path, offset: u64) -> String {
    let mut text = Vec::new();
    if let Ok(mut file) = File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_end(&mut text);
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Returns the last `count` lines of `text`.
fn tail_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Spawns one node per port, then waits for all of them; any failure drops (kills) them all.
fn start_nodes(
    program: &Path,
    ports: &[u16],
    specs: &[NodeSpec],
) -> Result<Vec<RedisNode>, Attempt> {
    let mut nodes = Vec::with_capacity(ports.len());
    for (port, spec) in ports.iter().zip(specs) {
        nodes.push(RedisNode::spawn(program, *port, spec)?);
    }
    let fresh = LogOffsets { log: 0, stdio: 0 };
    for node in &nodes {
        node.await_ready(fresh)?;
    }
    Ok(nodes)
}

/// Allocates `count` ports.
fn allocate_ports(count: usize) -> Result<Vec<u16>> {
    (0..count).map(|_| allocate_port()).collect()
}

// ---------------------------------------------------------------------------------------------
// Standalone
// ---------------------------------------------------------------------------------------------

/// One standalone server.
#[derive(Debug)]
pub struct Standalone {
    /// The server.
    pub node: RedisNode,
}

impl Standalone {
    /// Starts a standalone server on a free port and waits until it answers `PING`.
    ///
    /// # Errors
    /// [`DevClusterError::MissingBinary`], [`DevClusterError::StartFailed`] (with the log tail),
    /// [`DevClusterError::Timeout`] or [`DevClusterError::Io`].
    pub fn start() -> Result<Standalone> {
        Standalone::start_with_args(&[])
    }

    /// Like [`Standalone::start`], appending `extra_args` (one argv word each, e.g.
    /// `["--maxmemory", "10mb"]`) to the server's command line.
    ///
    /// # Errors
    /// As for [`Standalone::start`].
    pub fn start_with_args(extra_args: &[&str]) -> Result<Standalone> {
        let program = redis_server_path()?;
        let spec = NodeSpec {
            role: NodeRole::Standalone,
            cluster_node_timeout_ms: 0,
            extra_args: extra_args.iter().map(|arg| (*arg).to_owned()).collect(),
        };
        with_port_retries("starting a standalone redis-server", || {
            let port = allocate_port()?;
            let mut nodes = start_nodes(&program, &[port], std::slice::from_ref(&spec))?;
            let node = nodes
                .pop()
                .ok_or_else(|| DevClusterError::InvalidOptions("no node was started".to_owned()))?;
            Ok(Standalone { node })
        })
    }

    /// The client URL: `"redis://127.0.0.1:<port>"`.
    pub fn url(&self) -> String {
        self.node.url()
    }
}

// ---------------------------------------------------------------------------------------------
// Primary with replicas
// ---------------------------------------------------------------------------------------------

/// A primary and its replicas (plain replication, no cluster, no sentinel).
#[derive(Debug)]
pub struct PrimaryReplica {
    /// The primary.
    pub primary: RedisNode,
    /// The replicas, each started with `--replicaof 127.0.0.1 <primary port>`.
    pub replicas: Vec<RedisNode>,
}

impl PrimaryReplica {
    /// Starts a primary and `replica_count` replicas, and waits until every replica reports
    /// `master_link_status:up`.
    ///
    /// # Errors
    /// As for [`Standalone::start`]; [`DevClusterError::Timeout`] names the replica that did not
    /// sync.
    pub fn start(replica_count: usize) -> Result<PrimaryReplica> {
        PrimaryReplica::start_with_args(replica_count, &[])
    }

    /// Like [`PrimaryReplica::start`], appending `extra_args` (one argv word each) to every
    /// server's command line.
    ///
    /// # Errors
    /// As for [`PrimaryReplica::start`].
    pub fn start_with_args(replica_count: usize, extra_args: &[&str]) -> Result<PrimaryReplica> {
        let program = redis_server_path()?;
        let extra_args: Vec<String> = extra_args.iter().map(|arg| (*arg).to_owned()).collect();
        with_port_retries("starting a primary with replicas", || {
            let ports = allocate_ports(replica_count + 1)?;
            let primary_port = ports[0];
            let spec = |role| NodeSpec {
                role,
                cluster_node_timeout_ms: 0,
                extra_args: extra_args.clone(),
            };
            let mut specs = vec![spec(NodeRole::Primary)];
            specs.extend((0..replica_count).map(|_| spec(NodeRole::Replica { primary_port })));
            let mut nodes = start_nodes(&program, &ports, &specs)?.into_iter();
            let primary = nodes.next().ok_or_else(|| {
                DevClusterError::InvalidOptions("no primary was started".to_owned())
            })?;
            let group = PrimaryReplica {
                primary,
                replicas: nodes.collect(),
            };
            for replica in &group.replicas {
                wait_replica_link_up(replica.port, REPLICA_SYNC_TIMEOUT)?;
            }
            Ok(group)
        })
    }

    /// The primary's client URL: `"redis://127.0.0.1:<port>"`.
    pub fn url(&self) -> String {
        self.primary.url()
    }
}

/// Waits until the replica on `port` reports `master_link_status:up`.
fn wait_replica_link_up(port: u16, timeout: Duration) -> Result<()> {
    poll_until(
        timeout,
        POLL_STEP,
        &format!("replica on port {port} to report master_link_status:up"),
        || {
            let info = cli_with_timeout(port, &["INFO", "replication"], PROBE_TIMEOUT)
                .map_err(|error| error.to_string())?;
            match info_field(&info, "master_link_status") {
                Some("up") => Ok(()),
                other => Err(format!("master_link_status is {other:?}")),
            }
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------------------------

/// How to start a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The number of masters; at least 3, because `redis-cli --cluster create` refuses fewer.
    /// Default: 3.
    pub masters: usize,
    /// The number of replicas of each master. Default: 1.
    pub replicas_per_master: usize,
    /// `cluster-node-timeout` in milliseconds: how long a node may be unreachable before it is
    /// flagged failed (a paused master is replaced after roughly twice this). Default: 2000.
    pub node_timeout_ms: u64,
    /// Extra arguments for every node's command line, one argv word per element, e.g.
    /// `["--cluster-require-full-coverage", "no"]`. Default: none.
    pub extra_args: Vec<String>,
    /// How long [`Cluster::start`] waits for the new cluster to be healthy. Default: 30 s.
    pub ready_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// One line of `CLUSTER NODES`: a node as one member of the cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The 40-character node id.
    pub id: String,
    /// The client address, `"127.0.0.1:<port>"` (empty while the address is unknown).
    pub addr: String,
    /// The client port, 0 while the address is unknown.
    pub port: u16,
    /// The raw flags, e.g. `["myself", "master"]`, `["slave"]`, `["master", "fail"]`.
    pub flags: Vec<String>,
    /// The id of the master this node replicates, `None` for a master.
    pub master_id: Option<String>,
    /// Whether the reporting node's cluster bus link to this node is connected.
    pub connected: bool,
    /// The node's config epoch.
    pub config_epoch: u64,
    /// The slot ranges this node serves, inclusive, in `CLUSTER NODES` order (slots being
    /// imported or migrated are left out).
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    /// Tells whether the node has the `master` flag.
    pub fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    /// Tells whether the node has the `slave` flag.
    pub fn is_replica(&self) -> bool {
        self.has_flag("slave")
    }

    /// Tells whether the node is flagged `fail` (agreed failed by a majority of masters).
    pub fn is_failed(&self) -> bool {
        self.has_flag("fail")
    }

    /// Tells whether the node is flagged `fail?` (suspected by the reporting node).
    pub fn is_suspected(&self) -> bool {
        self.has_flag("fail?")
    }

    /// Tells whether this line describes the reporting node itself.
    pub fn is_myself(&self) -> bool {
        self.has_flag("myself")
    }

    /// Tells whether the node serves `slot`.
    pub fn serves_slot(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| first <= slot && slot <= last)
    }

    /// The number of slots the node serves.
    pub fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(first, last)| usize::from(last - first) + 1)
            .sum()
    }

    /// Tells whether `flag` is among the flags.
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|own| own == flag)
    }
}

/// Parses the text of `CLUSTER NODES`.
fn parse_cluster_nodes(text: &str) -> Result<Vec<NodeInfo>, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(parse_cluster_nodes_line)
        .collect()
}

/// Parses one line of `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <config-epoch>
/// <link-state> <slot> ...`.
fn parse_cluster_nodes_line(line: &str) -> Result<NodeInfo, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return Err(format!("short CLUSTER NODES line: {line:?}"));
    }
    let addr = fields[1].split(['@', ',']).next().unwrap_or_default();
    let port = addr
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(0);
    let addr = if port == 0 {
        String::new()
    } else {
        addr.to_owned()
    };
    let mut slots = Vec::new();
    for token in &fields[8..] {
        if token.starts_with('[') {
            continue;
        }
        let (first, last) = token.split_once('-').unwrap_or((token, token));
        match (first.parse(), last.parse()) {
            (Ok(first), Ok(last)) => slots.push((first, last)),
            _ => return Err(format!("bad slot range {token:?} in {line:?}")),
        }
    }
    Ok(NodeInfo {
        id: fields[0].to_owned(),
        addr,
        port,
        flags: fields[2].split(',').map(str::to_owned).collect(),
        master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        connected: fields[7] == "connected",
        config_epoch: fields[6].parse().unwrap_or(0),
        slots,
    })
}

/// A Redis Cluster of throwaway nodes on 127.0.0.1, created with `redis-cli --cluster create`.
///
/// Dropping it kills every node and removes their directories.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, in start order (the first `masters` were the initial masters).
    nodes: Vec<RedisNode>,
    /// The addresses of the masters right after creation, for [`Cluster::url`].
    seed_masters: Vec<String>,
}

impl Cluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, joins them into a cluster, and waits
    /// until it is healthy (see [`Cluster::wait_healthy`]).
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] for fewer than 3 masters; otherwise as for
    /// [`Standalone::start`], plus [`DevClusterError::Command`] when `redis-cli --cluster create`
    /// fails and [`DevClusterError::Timeout`] when the cluster does not become healthy.
    pub fn start(options: ClusterOptions) -> Result<Cluster> {
        if options.masters < 3 {
            return Err(DevClusterError::InvalidOptions(format!(
                "a cluster needs at least 3 masters, got {}",
                options.masters
            )));
        }
        let program = redis_server_path()?;
        let cli_program = redis_cli_path()?;
        let total = options.masters * (1 + options.replicas_per_master);
        let spec = NodeSpec {
            role: NodeRole::ClusterNode,
            cluster_node_timeout_ms: options.node_timeout_ms,
            extra_args: options.extra_args.clone(),
        };
        let started = Instant::now();
        let nodes = with_port_retries("starting a cluster", || {
            let ports = allocate_ports(total)?;
            let specs = vec![spec.clone(); total];
            start_nodes(&program, &ports, &specs)
        })?;
        tracing::debug!(elapsed = ?started.elapsed(), total, "cluster nodes answer PING");
        let mut cluster = Cluster {
            nodes,
            seed_masters: Vec::new(),
        };
        cluster.create(&cli_program, options.replicas_per_master)?;
        tracing::debug!(elapsed = ?started.elapsed(), "redis-cli --cluster create done");
        cluster.wait_healthy(options.ready_timeout)?;
        let mut seed_masters: Vec<NodeInfo> = cluster
            .topology()?
            .into_iter()
            .filter(|info| info.is_master() && !info.slots.is_empty())
            .collect();
        seed_masters.sort_by_key(|info| info.slots.first().copied());
        cluster.seed_masters = seed_masters.into_iter().map(|info| info.addr).collect();
        tracing::debug!(elapsed = ?started.elapsed(), url = %cluster.url(), "cluster healthy");
        Ok(cluster)
    }

    /// Runs `redis-cli --cluster create` over every node, bounded by [`CLUSTER_CREATE_TIMEOUT`].
    fn create(&self, cli_program: &Path, replicas_per_master: usize) -> Result<()> {
        let first = &self.nodes[0];
        let log_path = first.dir().join("cluster-create.log");
        let context = || {
            format!(
                "running redis-cli --cluster create, output in {}",
                log_path.display()
            )
        };
        let output = File::create(&log_path).map_err(io_error(context()))?;
        let stderr = output.try_clone().map_err(io_error(context()))?;
        let mut command = Command::new(cli_program);
        command.arg("--cluster").arg("create");
        command.args(self.nodes.iter().map(RedisNode::addr));
        command
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::from(output))
            .stderr(Stdio::from(stderr));
        let mut child = command.spawn().map_err(io_error(context()))?;
        let waited = poll_until(
            CLUSTER_CREATE_TIMEOUT,
            POLL_STEP,
            "redis-cli --cluster create to finish",
            || match child.try_wait() {
                Ok(Some(status)) => Ok(Ok(status)),
                Ok(None) => Err("still running".to_owned()),
                Err(error) => Ok(Err(error)),
            },
        );
        let status = match waited {
            Ok(status) => status.map_err(io_error(context()))?,
            Err(timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(timeout);
            }
        };
        if status.success() {
            return Ok(());
        }
        Err(DevClusterError::Command {
            port: first.port,
            command: "redis-cli --cluster create".to_owned(),
            message: format!(
                "{status}; output tail:\n{}",
                tail_lines(&read_from(&log_path, 0), LOG_TAIL_LINES)
            ),
        })
    }

    /// The cluster URL listing the masters as they were right after creation:
    /// `"redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"`.
    ///
    /// fred's `Config::from_url` does not parse this comma-separated form; use
    /// [`Cluster::fred_url`] for fred.
    pub fn url(&self) -> String {
        format!("redis-cluster://{}", self.seed_masters.join(","))
    }

    /// The same masters in the form fred's `Config::from_url` parses:
    /// `"redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&node=127.0.0.1:P3"`.
    pub fn fred_url(&self) -> String {
        let mut url = String::from("redis-cluster://");
        for (index, addr) in self.seed_masters.iter().enumerate() {
            url.push_str(match index {
                0 => "",
                1 => "?node=",
                _ => "&node=",
            });
            url.push_str(addr);
        }
        url
    }

    /// Every node, in start order, whatever its current role or state.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// The node listening on `port`, if it belongs to this cluster.
    pub fn node(&self, port: u16) -> Option<&RedisNode> {
        self.nodes.iter().find(|node| node.port == port)
    }

    /// The cluster as the first running node (in start order) that answers within 500 ms sees
    /// it, parsed from `CLUSTER NODES`.
    ///
    /// # Errors
    /// [`DevClusterError::NotRunning`] or the last node's error when no node answers.
    pub fn topology(&self) -> Result<Vec<NodeInfo>> {
        let mut last_error = None;
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            match self.topology_from(node.port) {
                Ok(topology) => return Ok(topology),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(DevClusterError::NotRunning {
            port: self.nodes.first().map_or(0, |node| node.port),
        }))
    }

    /// The cluster as the node on `port` sees it, parsed from `CLUSTER NODES`.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the node does not answer within 500 ms;
    /// [`DevClusterError::Command`] when it answers with an error or an unparsable text.
    pub fn topology_from(&self, port: u16) -> Result<Vec<NodeInfo>> {
        let text = cli_with_timeout(port, &["CLUSTER", "NODES"], PROBE_TIMEOUT)?;
        parse_cluster_nodes(&text).map_err(|message| DevClusterError::Command {
            port,
            command: "CLUSTER NODES".to_owned(),
            message,
        })
    }

    /// The nodes currently serving as masters: flagged `master`, not flagged `fail`, and serving
    /// at least one slot, according to [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn masters(&self) -> Result<Vec<&RedisNode>> {
        let topology = self.topology()?;
        Ok(self.nodes_matching(&topology, |info| {
            info.is_master() && !info.is_failed() && !info.slots.is_empty()
        }))
    }

    /// The nodes currently serving as replicas: flagged `slave` and not flagged `fail`, according
    /// to [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn replicas(&self) -> Result<Vec<&RedisNode>> {
        let topology = self.topology()?;
        Ok(self.nodes_matching(&topology, |info| info.is_replica() && !info.is_failed()))
    }

    /// Our nodes whose topology entry satisfies `predicate`, in start order.
    fn nodes_matching(
        &self,
        topology: &[NodeInfo],
        predicate: impl Fn(&NodeInfo) -> bool,
    ) -> Vec<&RedisNode> {
        self.nodes
            .iter()
            .filter(|node| {
                topology
                    .iter()
                    .any(|info| info.port == node.port && predicate(info))
            })
            .collect()
    }

    /// The master that serves `slot` according to [`Cluster::topology`] (it may be flagged
    /// failed if the failover has not happened yet; check [`NodeInfo::is_failed`]).
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn master_for_slot(&self, slot: u16) -> Result<Option<NodeInfo>> {
        Ok(self
            .topology()?
            .into_iter()
            .find(|info| info.is_master() && info.serves_slot(slot)))
    }

    /// The nodes that replicate the master with id `master_id`, according to
    /// [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn replicas_of(&self, master_id: &str) -> Result<Vec<NodeInfo>> {
        Ok(self
            .topology()?
            .into_iter()
            .filter(|info| info.master_id.as_deref() == Some(master_id))
            .collect())
    }

    /// Waits until the cluster is healthy, as [`Cluster::start`] does; usable after a failover
    /// or a restart.
    ///
    /// Healthy means, for every node whose process is running: `CLUSTER INFO` says
    /// `cluster_state:ok`, `cluster_slots_assigned:16384`, `cluster_slots_ok:16384` and
    /// `cluster_known_nodes` equal to the number of nodes; the node is either a master serving
    /// slots or a replica reporting `master_link_status:up`; its `CLUSTER NODES` flags no running
    /// node `fail` or `fail?`; and all running nodes agree on every running node's id and master
    /// and on which masters serve which slots. Nodes that are not running are skipped (they still
    /// count as known nodes).
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] with the first unmet condition of the last check.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let ports: Vec<u16> = self.nodes.iter().map(|node| node.port).collect();
        poll_until(
            timeout,
            CLUSTER_POLL_STEP,
            &format!("cluster on ports {ports:?} to be healthy"),
            || self.health(),
        )
    }

    /// Checks the condition of [`Cluster::wait_healthy`] once, returning the first unmet part.
    fn health(&self) -> Result<(), String> {
        let running: Vec<&RedisNode> = self.nodes.iter().filter(|node| node.is_running()).collect();
        if running.is_empty() {
            return Err("no node is running".to_owned());
        }
        let total = self.nodes.len().to_string();
        let mut agreed_layout: Option<(u16, Vec<LayoutEntry>)> = None;
        for node in &running {
            let port = node.port;
            let commands: [&[&str]; 3] = [
                &["CLUSTER", "INFO"],
                &["INFO", "replication"],
                &["CLUSTER", "NODES"],
            ];
            let replies = round_trip(port, &commands, PROBE_TIMEOUT)
                .map_err(|error| format!("port {port}: {error}"))?;
            let [cluster_info, replication, cluster_nodes] = replies_as_text(port, &replies)?;
            for (field, expected) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", total.as_str()),
            ] {
                let actual = info_field(&cluster_info, field);
                if actual != Some(expected) {
                    return Err(format!(
                        "port {port}: {field} is {actual:?}, want {expected:?}"
                    ));
                }
            }
            if info_field(&replication, "role") == Some("slave") {
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("port {port}: master_link_status is {link:?}"));
                }
            }
            let view = parse_cluster_nodes(&cluster_nodes)
                .map_err(|error| format!("port {port}: {error}"))?;
            let myself = view
                .iter()
                .find(|info| info.is_myself())
                .ok_or_else(|| format!("port {port}: CLUSTER NODES has no myself line"))?;
            if myself.is_master() && myself.slots.is_empty() {
                return Err(format!(
                    "port {port} is a master without slots (not attached as a replica yet)"
                ));
            }
            let mut layout: Vec<LayoutEntry> = Vec::new();
            for info in view {
                let is_running = running.iter().any(|node| node.port == info.port);
                if is_running && (info.is_failed() || info.is_suspected()) {
                    return Err(format!(
                        "port {port} flags running node {} as {:?}",
                        info.addr, info.flags
                    ));
                }
                if is_running || (info.is_master() && !info.slots.is_empty()) {
                    layout.push((info.id, info.port, info.master_id, info.slots));
                }
            }
            layout.sort();
            match &agreed_layout {
                None => agreed_layout = Some((port, layout)),
                Some((first_port, agreed)) if *agreed != layout => {
                    return Err(format!(
                        "ports {first_port} and {port} disagree on roles or the slot map"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Polls [`Cluster::topology`] until `predicate` holds, and returns that topology. `what`
    /// names the condition in the timeout error.
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] naming `what`, with the last topology error if there was one.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut predicate: impl FnMut(&[NodeInfo]) -> bool,
    ) -> Result<Vec<NodeInfo>> {
        poll_until(timeout, CLUSTER_POLL_STEP, what, || match self.topology() {
            Ok(topology) if predicate(&topology) => Ok(topology),
            Ok(_) => Err("the predicate is false".to_owned()),
            Err(error) => Err(error.to_string()),
        })
    }
}

/// One node of a cluster as a health check compares views: id, port, master id, slot ranges.
type LayoutEntry = (String, u16, Option<String>, Vec<(u16, u16)>);

/// Turns the three replies of a health probe into texts, or says which one is an error.
fn replies_as_text(port: u16, replies: &[Reply]) -> Result<[String; 3], String> {
    let text = |index: usize| -> Result<String, String> {
        match replies.get(index) {
            Some(Reply::Error(message)) => Err(format!("port {port}: {message}")),
            Some(reply) => {
                let mut text = String::new();
                write_reply_text(reply, &mut text);
                Ok(text)
            }
            None => Err(format!("port {port}: missing reply")),
        }
    };
    Ok([text(0)?, text(1)?, text(2)?])
}

// ---------------------------------------------------------------------------------------------
// Slots
// ---------------------------------------------------------------------------------------------

/// The Redis Cluster hash slot of `key`: CRC16-XMODEM of the key (or of its hash tag) mod 16384.
///
/// The hash tag is the text between the first `{` and the first `}` after it, when that text is
/// not empty; `{user1}.a` and `{user1}.b` share a slot, `a{}b` hashes whole.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16_xmodem(hash_tag(key).unwrap_or(key)) % CLUSTER_SLOTS
}

/// Returns the non-empty hash tag of `key`, if any.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&byte| byte == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&byte| byte == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC16 with the XMODEM parameters (polynomial 0x1021, initial value 0), as Redis uses.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_xmodem_check_value() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
    }

    #[test]
    fn key_slot_matches_known_redis_values() {
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn key_slot_uses_the_first_non_empty_hash_tag() {
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            crc16_xmodem(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_eq!(
            key_slot(b"foo{bar"),
            crc16_xmodem(b"foo{bar") % CLUSTER_SLOTS
        );
    }

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002,host master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [93->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,fail,noaddr - 1 2 5 disconnected 10923 10924-16383
";
        let nodes = parse_cluster_nodes(text).unwrap();
        assert_eq!(nodes.len(), 4);
        assert!(nodes[0].is_replica());
        assert_eq!(
            nodes[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(nodes[1].addr, "127.0.0.1:30002");
        assert_eq!(nodes[1].port, 30002);
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert!(nodes[2].is_myself() && nodes[2].is_master());
        assert_eq!(nodes[2].slots, vec![(0, 5460)]);
        assert!(nodes[3].is_failed() && !nodes[3].connected);
        assert_eq!(nodes[3].port, 0);
        assert_eq!(nodes[3].slot_count(), 16384 - 10923);
        assert!(nodes[3].serves_slot(10923));
    }

    #[test]
    fn replies_render_like_redis_cli_raw_output() {
        let reply = Reply::Array(vec![
            Reply::Bulk(b"f".to_vec()),
            Reply::Integer(7),
            Reply::Nil,
            Reply::Array(vec![Reply::Simple("OK".into())]),
        ]);
        let mut text = String::new();
        write_reply_text(&reply, &mut text);
        assert_eq!(text, "f\n7\n\nOK");
    }

    #[test]
    fn resp_replies_parse() {
        let wire = b"*3\r\n$3\r\nfoo\r\n$-1\r\n:12\r\n-ERR bad\r\n+PONG\r\n";
        let mut reader = &wire[..];
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Array(vec![
                Reply::Bulk(b"foo".to_vec()),
                Reply::Nil,
                Reply::Integer(12)
            ])
        );
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Error("ERR bad".into())
        );
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Reply::Simple("PONG".into())
        );
    }

    #[test]
    fn ports_stay_in_range() {
        for _ in 0..100 {
            let port = next_candidate_port();
            assert!((PORT_MIN..=PORT_MAX).contains(&port));
        }
    }
}
