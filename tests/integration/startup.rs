//! Startup order: the `hotsplit` binary builds everything that can fail before it binds its
//! port, so an unreachable Redis or a spool another process owns stops it with exit status 1
//! and a message naming the cause, and the port is never taken.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use crate::harness;

/// A `hotsplit serve` child, killed if the test ends first.
struct Serve {
    /// The process.
    child: Child,
}

impl Serve {
    /// Starts `hotsplit serve --config <dir>/<name>.toml` with `config`; stderr is piped, the
    /// log (stdout) discarded.
    fn spawn(dir: &Path, name: &str, config: &str) -> Serve {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let child = harness::serve_command()
            .arg("--config")
            .arg(&path)
            .current_dir(dir)
            .env("HOTSPLIT_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hotsplit");
        Serve { child }
    }

    /// The exit status, once the process has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll hotsplit")
    }

    /// Everything the exited process wrote to stderr.
    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Whether the process holds a listening TCP socket on `address`'s port. It looks at the
    /// process's own descriptors, not at the port: a port the test freed can be taken by
    /// another test of the suite at any time (and a connect to a free port in the ephemeral
    /// range can even connect to itself), so "something accepts on it" does not say the
    /// service bound it.
    fn listens_on(&self, address: SocketAddr) -> bool {
        let fds = format!("/proc/{}/fd", self.child.id());
        let Ok(entries) = std::fs::read_dir(&fds) else {
            return false; // exited (or not yet started): nothing bound
        };
        let sockets: Vec<String> = entries
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_string_lossy();
                Some(
                    target
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_string(),
                )
            })
            .collect();
        let port = format!(":{:04X}", address.port());
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
            std::fs::read_to_string(table)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // local_address, st (0A is LISTEN) and inode
                    fields.len() > 9
                        && fields[1].ends_with(&port)
                        && fields[3] == "0A"
                        && sockets.iter().any(|inode| inode == fields[9])
                })
        })
    }
}

/// Polls until `serve` exits, asserting at every poll that it holds no listening socket on
/// `port`; returns the exit status.
async fn exits_without_binding(serve: &mut Serve, port: SocketAddr) -> ExitStatus {
    let mut status = None;
    harness::poll("hotsplit exits", Duration::from_secs(30), || {
        assert!(
            !serve.listens_on(port),
            "hotsplit bound {port} before its startup failed"
        );
        status = serve.exited();
        std::future::ready(status.is_some())
    })
    .await;
    status.expect("exited")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_an_unreachable_redis_exits_1_before_the_port_is_bound() {
    // A "Redis" that accepts connections and never answers a byte.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let port = SocketAddr::from(([127, 0, 0, 1], harness::free_port()));
    let dir = tempfile::tempdir().unwrap();
    let mut serve = Serve::spawn(
        dir.path(),
        "silent",
        &format!(
            "[server]\nlisten = \"{port}\"\n[store]\nredis = \"redis://127.0.0.1:{silent_port}\"\nconnect_timeout = \"1s\"\n"
        ),
    );

    // Wait until the service is connecting: the silent listener has accepted it. The
    // connection is kept open (and unanswered) until the service gives up.
    let (_connection, _) = tokio::time::timeout(Duration::from_secs(30), silent.accept())
        .await
        .expect("hotsplit connects to the configured redis")
        .unwrap();
    // While it connects, its port is free; and it stays free until the service exits.
    assert!(
        !serve.listens_on(port),
        "hotsplit bound {port} before connecting to redis"
    );
    let status = exits_without_binding(&mut serve, port).await;
    let stderr = serve.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not connect to redis")
            && stderr.contains(&format!("127.0.0.1:{silent_port}")),
        "the message names the cause: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_a_spool_locked_by_another_instance_exits_1_before_the_port_is_bound() {
    let redis = harness::shared_standalone().url();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let config = |port: SocketAddr| {
        format!(
            "[server]\nlisten = \"{port}\"\nshutdown_grace = \"2s\"\n[store]\nredis = \"{redis}\"\n[heal]\nspool_dir = \"{}\"\n",
            spool.display()
        )
    };
    let owner_port = SocketAddr::from(([127, 0, 0, 1], harness::free_port()));
    let mut owner = Serve::spawn(dir.path(), "owner", &config(owner_port));
    let http = reqwest::Client::new();
    harness::poll(
        "the first instance answers /readyz",
        Duration::from_secs(30),
        || {
            assert!(owner.exited().is_none(), "the first instance exited");
            let answer = http.get(format!("http://{owner_port}/readyz")).send();
            async move {
                answer
                    .await
                    .is_ok_and(|answer| answer.status().is_success())
            }
        },
    )
    .await;

    // The second instance's port is held by the test: had it bound before locking the spool,
    // it would fail on the port ("cannot listen on"), not on the lock.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second_port = held.local_addr().unwrap();
    let mut second = Serve::spawn(dir.path(), "second", &config(second_port));
    let mut status = None;
    harness::poll("the second instance exits", Duration::from_secs(30), || {
        status = second.exited();
        std::future::ready(status.is_some())
    })
    .await;
    let stderr = second.stderr();
    assert_eq!(status.and_then(|status| status.code()), Some(1), "{stderr}");
    assert!(
        stderr.contains("locked by another process")
            && stderr.contains(&spool.display().to_string()),
        "the message names the lock: {stderr}"
    );
    assert!(!stderr.contains("cannot listen"), "{stderr}");

    // With the port free, the second instance still stops on the lock and never binds it.
    drop(held);
    let mut third = Serve::spawn(dir.path(), "third", &config(second_port));
    let status = exits_without_binding(&mut third, second_port).await;
    let stderr = third.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("locked by another process"), "{stderr}");

    // The first instance kept its spool and its port throughout.
    assert!(
        owner.exited().is_none(),
        "the first instance is still serving"
    );
    assert!(owner.listens_on(owner_port));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_a_sigterm_as_soon_as_the_port_accepts_drains_and_exits_0() {
    // The SIGTERM handler must be in place before the port is bound: a SIGTERM that finds none
    // ends the process by the signal's default action, with no drain. The moment after the bind
    // is the narrowest; each round aims a SIGTERM at it.
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let port = SocketAddr::from(([127, 0, 0, 1], harness::free_port()));
        let mut serve = Serve::spawn(
            dir.path(),
            &format!("early-term-{round}"),
            &format!("[server]\nlisten = \"{port}\"\ndrain_delay = \"0s\"\n"),
        );
        let started = std::time::Instant::now();
        // A connection to a port nobody holds is refused at once on loopback, so this loop
        // notices the bind within a connect's round trip.
        while TcpStream::connect(port).is_err() {
            assert!(
                serve.exited().is_none(),
                "hotsplit exited before binding: {}",
                serve.stderr()
            );
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "hotsplit did not bind {port} within 30 s"
            );
            std::thread::yield_now();
        }
        // SAFETY: sending SIGTERM to our own child process.
        unsafe { libc::kill(serve.child.id() as libc::pid_t, libc::SIGTERM) };
        let mut status = None;
        harness::poll(
            "hotsplit exits after SIGTERM",
            Duration::from_secs(30),
            || {
                status = serve.exited();
                std::future::ready(status.is_some())
            },
        )
        .await;
        let status = status.expect("exited");
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}: a SIGTERM right after the bind must drain and exit 0, not end the process by its default action ({status}): {}",
            serve.stderr()
        );
    }
}
