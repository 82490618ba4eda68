//! [`Process`]: a throwaway child process of any program (`hotsplit serve` for the tests, the
//! benches and `hotsplit check --instances 2`), with its stdout and stderr in a log file, a
//! readiness wait that quotes the log's tail when it fails, signals, and SIGKILL + reap on drop.
//!
//! It is spawned the way the Redis servers are (`process.rs`): by the spawner thread, with
//! `PR_SET_PDEATHSIG` set to `SIGKILL` and its pid in the registry, so it dies with this process
//! however this process ends. A signal only goes to a child that has not been reaped yet.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{io_error, DevClusterError, Result};
use crate::process::{
    read_from, send_signal, spawn_via_spawner, tail_lines, unregister_pid, EnvChange,
};
use crate::{LOG_TAIL_LINES, POLL_STEP};

/// The socket timeout (connect, write, each read) of one HTTP readiness probe: a probe is
/// retried until the wait's own timeout, so this only bounds a server that accepts and stalls.
const HTTP_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of an HTTP answer a readiness probe reads (status line, headers and body).
const HTTP_ANSWER_LIMIT: u64 = 64 * 1024;

/// What to run: a program, its arguments and changes to the environment it inherits.
///
/// ```no_run
/// # fn main() -> hotsplit_devcluster::Result<()> {
/// use hotsplit_devcluster::Process;
///
/// let mut serve = Process::builder("target/debug/hotsplit")
///     .args(["serve", "--config", "a.toml"])
///     .env_remove("HOTSPLIT_REDIS")
///     .env("HOTSPLIT_LOG", "warn")
///     .spawn("a.log")?;
/// serve.wait_for_http(
///     "http://127.0.0.1:8080/readyz",
///     std::time::Duration::from_secs(30),
///     std::time::Duration::from_millis(50),
/// )?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ProcessBuilder {
    /// The executable.
    program: PathBuf,
    /// Its arguments, in order.
    args: Vec<OsString>,
    /// Variables set (`Some`) or removed (`None`) in what it inherits, applied in order.
    env: Vec<EnvChange>,
}

impl ProcessBuilder {
    /// Runs `program` with no arguments and this process's environment.
    pub fn new(program: impl Into<PathBuf>) -> ProcessBuilder {
        ProcessBuilder {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> ProcessBuilder {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments, in order.
    pub fn args<I>(mut self, args: I) -> ProcessBuilder
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets the variable `key` to `value` in its environment.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> ProcessBuilder {
        self.env.push((key.into(), Some(value.into())));
        self
    }

    /// Removes the variable `key` from the environment it inherits.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> ProcessBuilder {
        self.env.push((key.into(), None));
        self
    }

    /// Runs the program inside the network namespace `namespace` (one a [`Network`](crate::Network)
    /// made): the command becomes `ip netns exec <namespace> <program> <args>`, and `ip` execs
    /// the program in place, so the pid, the signals and the death signal are the program's.
    pub fn in_netns(self, namespace: &str) -> ProcessBuilder {
        let mut args: Vec<OsString> = vec!["netns".into(), "exec".into(), namespace.into()];
        args.push(self.program.into_os_string());
        args.extend(self.args);
        ProcessBuilder {
            program: PathBuf::from("ip"),
            args,
            env: self.env,
        }
    }

    /// Creates (or truncates) the file `log`, spawns the program with its stdout and stderr
    /// going to that file and its stdin empty, and returns the guard; does not wait for
    /// anything.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the log file cannot be created or the program cannot be
    /// spawned.
    pub fn spawn(self, log: impl Into<PathBuf>) -> Result<Process> {
        let log = log.into();
        let output = File::create(&log).map_err(io_error(format!("creating {}", log.display())))?;
        let child = spawn_via_spawner(&self.program, &self.args, &self.env, output)?;
        let pid = child.id();
        tracing::debug!(program = %self.program.display(), pid, "spawned a process");
        Ok(Process {
            program: self.program,
            pid,
            child: Some(child),
            exit: None,
            log,
        })
    }
}

/// A running child process, SIGKILLed and reaped when dropped.
///
/// Made by [`ProcessBuilder::spawn`] (or [`Process::builder`]). Its stdout and stderr go to its
/// log file ([`Process::log_path`]), which outlives it. Wait until it is ready with
/// [`Process::wait_for_http`] or [`Process::wait_until`] (blocking), or drive a
/// [`Readiness`] from an async loop ([`Process::readiness`]); stop it with [`Process::kill`]
/// (SIGKILL, a crash) or [`Process::terminate`] (SIGTERM, a clean stop), or send it any signal
/// with [`Process::signal`].
#[derive(Debug)]
pub struct Process {
    /// The executable, for messages.
    program: PathBuf,
    /// Its pid, kept after it is reaped for messages.
    pid: u32,
    /// The child until it is reaped, `None` after: a signal goes only to an unreaped child,
    /// whose pid the kernel cannot have handed to another process.
    child: Option<Child>,
    /// How it ended, once reaped.
    exit: Option<ExitStatus>,
    /// The file its stdout and stderr go to.
    log: PathBuf,
}

impl Process {
    /// A [`ProcessBuilder`] for `program`.
    pub fn builder(program: impl Into<PathBuf>) -> ProcessBuilder {
        ProcessBuilder::new(program)
    }

    /// Its pid (it stays known after the process is reaped).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The program it runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The file its stdout and stderr go to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything it has written so far (lossy UTF-8; empty if the file cannot be read).
    pub fn log_text(&self) -> String {
        read_from(&self.log, 0)
    }

    /// The last `lines` lines of [`Process::log_text`].
    pub fn log_tail(&self, lines: usize) -> String {
        tail_lines(&self.log_text(), lines)
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when its state cannot be read.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            return Ok(self.exit);
        };
        let status = child
            .try_wait()
            .map_err(io_error(format!("checking {}", self.describe())))?;
        if let Some(status) = status {
            self.reaped(status);
        }
        Ok(status)
    }

    /// Starts a readiness wait of at most `timeout` for `condition` (e.g. "hotsplit serves
    /// /readyz"), for a caller that checks the condition itself, e.g. from an async loop:
    /// after each failed check it calls [`Readiness::not_yet`], which fails once the process
    /// has exited or the time is up.
    pub fn readiness(&mut self, condition: impl Into<String>, timeout: Duration) -> Readiness<'_> {
        Readiness {
            process: self,
            condition: condition.into(),
            timeout,
            started: Instant::now(),
        }
    }

    /// Calls `check` every `step` until it returns `Ok`, for at most `timeout`; `check`
    /// returns why the condition is still false, which the timeout error quotes. Blocks the
    /// calling thread.
    ///
    /// # Errors
    /// [`DevClusterError::ExitedBeforeReady`] when the process exits first,
    /// [`DevClusterError::NotReady`] when `timeout` passes (both quote the log's tail),
    /// [`DevClusterError::Io`] when its state cannot be read.
    pub fn wait_until(
        &mut self,
        condition: &str,
        timeout: Duration,
        step: Duration,
        mut check: impl FnMut() -> Result<(), String>,
    ) -> Result<()> {
        let mut readiness = self.readiness(condition, timeout);
        loop {
            match check() {
                Ok(()) => return Ok(()),
                Err(last_seen) => readiness.not_yet(&last_seen)?,
            }
            thread::sleep(step);
        }
    }

    /// Sends `GET url` every `step` until it is answered with a 2xx status, for at most
    /// `timeout` ([`Process::wait_until`] with an HTTP/1.0 probe). Only `http://` URLs.
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] when `url` is not `http://host:port/path`; else as
    /// [`Process::wait_until`], the last answer (`503 Service Unavailable: <body>`) or
    /// `no answer: <error>` in the timeout error.
    pub fn wait_for_http(&mut self, url: &str, timeout: Duration, step: Duration) -> Result<()> {
        let (authority, path) = split_http_url(url).ok_or_else(|| {
            DevClusterError::InvalidOptions(format!("not an http://host:port/path URL: {url}"))
        })?;
        let condition = format!("GET {url} to answer 2xx");
        self.wait_until(&condition, timeout, step, || {
            http_get_succeeds(authority, path)
        })
    }

    /// Sends `signal` (e.g. `libc::SIGHUP`) to it.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when it has already been reaped (its pid may belong to another
    /// process by now, so nothing is sent) or when `kill` fails.
    pub fn signal(&self, signal: libc::c_int) -> Result<()> {
        let context = || format!("sending signal {signal} to {}", self.describe());
        if self.child.is_none() {
            return Err(DevClusterError::Io {
                context: context(),
                source: std::io::Error::other("it has exited and been reaped"),
            });
        }
        send_signal(self.pid, signal).map_err(io_error(context()))
    }

    /// SIGKILLs it (a crash: no cleanup runs) and reaps it; returns how it ended. Once it has
    /// been reaped, returns that exit status again.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when it cannot be reaped.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            return self.exit.ok_or_else(|| self.never_ran());
        };
        // ESRCH cannot happen for an unreaped child; any other failure shows up in `wait`.
        let _ = send_signal(self.pid, libc::SIGKILL);
        let status = child
            .wait()
            .map_err(io_error(format!("reaping {}", self.describe())))?;
        self.reaped(status);
        tracing::debug!(program = %self.program.display(), pid = self.pid, "killed a process");
        Ok(status)
    }

    /// Sends SIGTERM (a clean stop) and waits up to `timeout` for it to exit; returns how it
    /// ended. Once it has been reaped, returns that exit status again.
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] when it still runs after `timeout` (it is left running;
    /// dropping the guard kills it), [`DevClusterError::Io`] when the signal cannot be sent or
    /// its state cannot be read.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if self.child.is_none() {
            return self.exit.ok_or_else(|| self.never_ran());
        }
        self.signal(libc::SIGTERM)?;
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() >= timeout {
                return Err(DevClusterError::Timeout {
                    condition: format!("{} to exit after SIGTERM", self.describe()),
                    waited: started.elapsed(),
                    last_seen: "still running".to_owned(),
                });
            }
            thread::sleep(POLL_STEP);
        }
    }

    /// Records that the child was reaped with `status`.
    fn reaped(&mut self, status: ExitStatus) {
        self.child = None;
        self.exit = Some(status);
        unregister_pid(self.pid);
    }

    /// "`<program>` (pid N)", for messages.
    fn describe(&self) -> String {
        format!("{} (pid {})", self.program.display(), self.pid)
    }

    /// The error for a guard with neither a child nor an exit status, which `reaped` rules out.
    fn never_ran(&self) -> DevClusterError {
        DevClusterError::Io {
            context: format!("stopping {}", self.describe()),
            source: std::io::Error::other("no child and no exit status"),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.kill();
        }
    }
}

/// A readiness wait in progress (see [`Process::readiness`]): the caller checks its condition,
/// and after each failed check calls [`Readiness::not_yet`] before it tries again.
#[derive(Debug)]
pub struct Readiness<'a> {
    /// The process waited for.
    process: &'a mut Process,
    /// What is waited for, for the errors.
    condition: String,
    /// The longest the wait lasts.
    timeout: Duration,
    /// When the wait began.
    started: Instant,
}

impl Readiness<'_> {
    /// Records a failed check (`last_seen` says why it failed): `Ok` while the process runs
    /// and the time is not up, so the caller checks again after its step.
    ///
    /// # Errors
    /// [`DevClusterError::ExitedBeforeReady`] when the process has exited,
    /// [`DevClusterError::NotReady`] when the timeout has passed (both quote the last
    /// [`LOG_TAIL_LINES`] lines of its log), [`DevClusterError::Io`] when its state cannot be
    /// read.
    pub fn not_yet(&mut self, last_seen: &str) -> Result<()> {
        let process = &mut *self.process;
        if let Some(status) = process.try_wait()? {
            return Err(DevClusterError::ExitedBeforeReady {
                program: process.program.display().to_string(),
                pid: process.pid,
                condition: self.condition.clone(),
                status,
                log_tail: process.log_tail(LOG_TAIL_LINES),
            });
        }
        let waited = self.started.elapsed();
        if waited >= self.timeout {
            return Err(DevClusterError::NotReady {
                program: process.program.display().to_string(),
                pid: process.pid,
                condition: self.condition.clone(),
                waited,
                last_seen: last_seen.to_owned(),
                log_tail: process.log_tail(LOG_TAIL_LINES),
            });
        }
        Ok(())
    }
}

/// Splits `http://authority/path` into the authority and the path (`/` when there is none).
fn split_http_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, "/"),
    };
    (!authority.is_empty()).then_some((authority, path))
}

/// Sends one `GET path` to `authority` over HTTP/1.0 (so the answer is never chunked and the
/// server closes the connection after it); `Ok` for a 2xx answer, else why not.
fn http_get_succeeds(authority: &str, path: &str) -> Result<(), String> {
    let no_answer = |error: std::io::Error| format!("no answer: {error}");
    let address = authority
        .to_socket_addrs()
        .map_err(no_answer)?
        .next()
        .ok_or_else(|| format!("no answer: {authority} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, HTTP_PROBE_TIMEOUT).map_err(no_answer)?;
    stream
        .set_read_timeout(Some(HTTP_PROBE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_PROBE_TIMEOUT)))
        .map_err(no_answer)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(no_answer)?;
    let mut answer = Vec::new();
    stream
        .take(HTTP_ANSWER_LIMIT)
        .read_to_end(&mut answer)
        .map_err(no_answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    // "HTTP/1.1 503 Service Unavailable" → "503 Service Unavailable".
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_once(' '))
        .map(|(_, status)| status.trim())
        .unwrap_or_default();
    let code = status
        .split(' ')
        .next()
        .and_then(|code| code.parse::<u16>().ok());
    match code {
        Some(200..=299) => Ok(()),
        Some(_) => Err(format!("{status}: {body}")),
        None => Err(format!(
            "not an HTTP answer: {:?}",
            head.lines().next().unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_split_into_authority_and_path() {
        assert_eq!(
            split_http_url("http://127.0.0.1:80/readyz"),
            Some(("127.0.0.1:80", "/readyz"))
        );
        assert_eq!(
            split_http_url("http://127.0.0.1:80"),
            Some(("127.0.0.1:80", "/"))
        );
        assert_eq!(split_http_url("https://127.0.0.1:80/readyz"), None);
        assert_eq!(split_http_url("http:///readyz"), None);
    }
}
