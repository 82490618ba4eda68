//! Processes and the files around them: finding the binaries, handing out ports, spawning every
//! server from one long-lived spawner thread with `PR_SET_PDEATHSIG`, the pid registry and its
//! `atexit` handler, signals, and the nodes' temporary directories.
//!
//! This is the only file of the crate with `unsafe` code (`pre_exec`, `atexit`, `kill`,
//! `setns`); each block says why it is sound.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, Once, OnceLock, PoisonError};
use std::thread;

use crate::error::{io_error, DevClusterError, Result};
use crate::{BUS_PORT_OFFSET, PORT_CANDIDATES, PORT_MAX, PORT_MIN};

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

/// The process-wide port cursor. It starts at a random offset so that concurrent test binaries
/// rarely probe the same ports, and it only moves forward so that concurrent threads of one
/// process never get the same port.
static PORT_CURSOR: OnceLock<AtomicU32> = OnceLock::new();

/// Returns the next candidate port in `PORT_MIN..=PORT_MAX`, wrapping around.
pub(crate) fn next_candidate_port() -> u16 {
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
pub(crate) fn allocate_port() -> Result<u16> {
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

/// One change to the environment a child inherits: set a variable (`Some`) or remove it (`None`).
pub(crate) type EnvChange = (OsString, Option<OsString>);

/// One request to the spawner thread.
struct SpawnRequest {
    /// The binary to run.
    program: PathBuf,
    /// Its arguments.
    args: Vec<OsString>,
    /// Changes to the environment it inherits from this process, applied in order.
    env: Vec<EnvChange>,
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
        let result = spawn_with_deathsig(
            &request.program,
            &request.args,
            &request.env,
            request.output,
        );
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
fn spawn_with_deathsig(
    program: &Path,
    args: &[OsString],
    env: &[EnvChange],
    output: File,
) -> io::Result<Child> {
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
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
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
pub(crate) fn spawn_via_spawner(
    program: &Path,
    args: &[OsString],
    env: &[EnvChange],
    output: File,
) -> Result<Child> {
    let (reply, receive) = mpsc::channel();
    let request = SpawnRequest {
        program: program.to_owned(),
        args: args.to_vec(),
        env: env.to_vec(),
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
pub(crate) fn unregister_pid(pid: u32) {
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

/// Reaps `process` if it has exited, leaving `None` behind.
pub(crate) fn reap_if_exited(port: u16, process: &mut Option<Child>) -> Result<Option<ExitStatus>> {
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

/// SIGKILLs `child` (a redis-server), reaps it and unregisters its pid.
pub(crate) fn kill_and_reap(port: u16, mut child: Child) -> Result<()> {
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
pub(crate) fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Moves the calling thread (only it: a network namespace is per thread) into the network
/// namespace `handle` refers to (an open `/var/run/netns/<name>`); threads it spawns later
/// start there too.
pub(crate) fn join_netns(handle: &File) -> io::Result<()> {
    // SAFETY: setns only reads the descriptor, which `handle` keeps open for the call.
    if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes an exclusive `flock` on `file`, waiting for it; it is released when `file` closes.
pub(crate) fn lock_exclusive(file: &File) -> io::Result<()> {
    // SAFETY: flock only acts on the descriptor, which `file` keeps open for the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Tells whether no process with this pid exists any more.
pub(crate) fn process_gone(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks whether the process exists.
    let failed = unsafe { libc::kill(pid, 0) } != 0;
    failed && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
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
pub(crate) fn create_node_dir(port: u16) -> Result<PathBuf> {
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

/// Reads a file from `offset` to its end, as lossy UTF-8; a missing file reads as empty.
pub(crate) fn read_from(path: &Path, offset: u64) -> String {
    let mut text = Vec::new();
    if let Ok(mut file) = File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_end(&mut text);
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Returns the last `count` lines of `text`.
pub(crate) fn tail_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_stay_in_range() {
        for _ in 0..100 {
            let port = next_candidate_port();
            assert!((PORT_MIN..=PORT_MAX).contains(&port));
        }
    }
}
