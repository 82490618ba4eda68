//! The crate's error type, and the retry of a start whose ports were taken under its feet.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use crate::START_ATTEMPTS;

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
    /// A [`Process`](crate::Process) exited while its readiness was waited for.
    #[error(
        "{program} (pid {pid}) exited ({status}) while waiting for {condition}; its log ends:\n{log_tail}"
    )]
    ExitedBeforeReady {
        /// The program that was run.
        program: String,
        /// Its pid.
        pid: u32,
        /// What was waited for, e.g. "GET http://127.0.0.1:8080/readyz to answer 2xx".
        condition: String,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log file ([`Process::log_path`](crate::Process::log_path)).
        log_tail: String,
    },
    /// A [`Process`](crate::Process) kept running but did not become ready in time.
    #[error(
        "{program} (pid {pid}) was not ready after {waited:?} waiting for {condition}; last seen: {last_seen}; its log ends:\n{log_tail}"
    )]
    NotReady {
        /// The program that was run.
        program: String,
        /// Its pid.
        pid: u32,
        /// What was waited for.
        condition: String,
        /// How long was waited.
        waited: Duration,
        /// Why the condition was still false at the last check.
        last_seen: String,
        /// The last lines of its log file ([`Process::log_path`](crate::Process::log_path)).
        log_tail: String,
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
    /// `ip` or `nft` refused to make or change a network namespace, an interface or a rule
    /// (not root, the tool missing, or a kernel without network namespaces).
    #[error("`{command}` failed: {message}")]
    Network {
        /// The command line.
        command: String,
        /// Its exit status and stderr, or why it could not run.
        message: String,
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

/// The crate's result type.
pub type Result<T, E = DevClusterError> = std::result::Result<T, E>;

/// Wraps an [`io::Error`] with what was being done.
pub(crate) fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> DevClusterError {
    let context = context.into();
    move |source| DevClusterError::Io { context, source }
}

/// The outcome of one start attempt that did not produce a usable server.
#[derive(Debug)]
pub(crate) enum Attempt {
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
    pub(crate) fn into_error(self) -> DevClusterError {
        match self {
            Attempt::PortTaken(error) | Attempt::Fatal(error) => error,
        }
    }
}

/// Runs `attempt` until it succeeds, fails fatally, or ports were taken [`START_ATTEMPTS`] times.
pub(crate) fn with_port_retries<T>(
    what: &str,
    mut attempt: impl FnMut() -> Result<T, Attempt>,
) -> Result<T> {
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
