//! One `redis-server` process ([`RedisNode`]): spawning it with its command line, waiting until
//! it answers, fault injection (pause, resume, kill, shutdown, restart) and cleanup on drop.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use hotsplit_redis_info::info_field;

use crate::error::{io_error, Attempt, DevClusterError, Result};
use crate::process::{
    allocate_port, create_node_dir, kill_and_reap, read_from, reap_if_exited, send_signal,
    spawn_via_spawner, tail_lines,
};
use crate::resp::{endpoint_cli, round_trip, Endpoint, Reply};
use crate::tls::TlsFiles;
use crate::{
    poll_until, ADDR_IN_USE, EXIT_TIMEOUT, LOG_TAIL_LINES, POLL_STEP, PROBE_TIMEOUT, READY_TIMEOUT,
    RESTART_ATTEMPTS,
};

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
pub(crate) struct NodeSpec {
    /// The role, which decides the replication and cluster arguments.
    pub(crate) role: NodeRole,
    /// `cluster-node-timeout` in ms, for cluster nodes.
    pub(crate) cluster_node_timeout_ms: u64,
    /// Extra arguments appended to the command line, one argv word each.
    pub(crate) extra_args: Vec<String>,
    /// TLS files: the node listens with TLS only. `None` for plain TCP.
    pub(crate) tls: Option<TlsFiles>,
}

/// Where a node's output files ended before a start, so that a failure report shows only what
/// this start wrote.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogOffsets {
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
    /// How this crate's RESP client reaches the node (with its TLS configuration, if any).
    endpoint: Endpoint,
}

impl RedisNode {
    /// Creates the node's directory and spawns its process, without waiting for it to answer.
    fn spawn(program: &Path, port: u16, spec: &NodeSpec) -> Result<RedisNode> {
        let endpoint = Endpoint {
            ip: std::net::Ipv4Addr::LOCALHOST,
            port,
            tls: spec.tls.as_ref().map(TlsFiles::client_config).transpose()?,
        };
        let dir = create_node_dir(port)?;
        let args = server_args(port, &dir, spec);
        let node = RedisNode {
            endpoint,
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
        let child = spawn_via_spawner(&self.program, &self.args, &[], output)?;
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
        let replies = match round_trip(
            &self.endpoint,
            &[&["INFO", "server"], &["PING"]],
            PROBE_TIMEOUT,
        ) {
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

    /// A URL for a client of this one node: `"redis://127.0.0.1:<port>"`, or
    /// `"rediss://127.0.0.1:<port>"` for a TLS node.
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Whether the node listens with TLS only.
    pub fn is_tls(&self) -> bool {
        self.endpoint.tls.is_some()
    }

    /// Sends one command to this node, over TLS for a TLS node, and returns the reply as text
    /// (the format of [`cli`](crate::cli)), with a 10 s socket timeout.
    ///
    /// # Errors
    /// As for [`cli`](crate::cli).
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        self.cli_with_timeout(args, crate::DEFAULT_COMMAND_TIMEOUT)
    }

    /// Like [`RedisNode::cli`], with `timeout` bounding the connect and every read and write.
    ///
    /// # Errors
    /// As for [`cli_with_timeout`](crate::cli_with_timeout).
    pub fn cli_with_timeout(&self, args: &[&str], timeout: Duration) -> Result<String> {
        endpoint_cli(&self.endpoint, args, timeout)
    }

    /// How this crate's RESP client reaches the node.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
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
        match round_trip(&self.endpoint, &[&["SHUTDOWN", "NOSAVE"]], PROBE_TIMEOUT) {
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

/// Builds the `redis-server` command line for a node.
fn server_args(port: u16, dir: &Path, spec: &NodeSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |name: &str, value: OsString| {
        args.push(OsString::from(name));
        args.push(value);
    };
    // A TLS node has no plain port; its TLS port is added below.
    let plain_port = if spec.tls.is_some() { 0 } else { port };
    push("--port", plain_port.to_string().into());
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
    if let Some(tls) = &spec.tls {
        args.extend(tls.server_args(port).into_iter().map(OsString::from));
    }
    args.extend(spec.extra_args.iter().map(OsString::from));
    args
}

/// Spawns one node per port, then waits for all of them; any failure drops (kills) them all.
pub(crate) fn start_nodes(
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
pub(crate) fn allocate_ports(count: usize) -> Result<Vec<u16>> {
    (0..count).map(|_| allocate_port()).collect()
}
