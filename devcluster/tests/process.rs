//! `Process`: a child of any program (here `sh` and `sleep`), its log, readiness waits, signals
//! and the kill on drop.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::thread;
use std::time::Duration;

use hotsplit_devcluster::{DevClusterError, Process};

/// Tells whether a process with this pid exists (a zombie would count, but `Process` reaps).
fn pid_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// `sh -c script`.
fn sh(script: &str) -> hotsplit_devcluster::ProcessBuilder {
    Process::builder("sh").args(["-c", script])
}

/// Answers every HTTP request on a loopback port with the next of `answers` (the last one
/// repeats); returns the base URL.
fn http_server(answers: Vec<&'static str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        for (served, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            // The whole request, as a real server reads it, before the answer and the close.
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&chunk[..read]),
                }
            }
            let answer = answers[served.min(answers.len() - 1)];
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    base
}

const UNAVAILABLE: &str =
    "HTTP/1.0 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nwarming up";
const OK: &str = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";

#[test]
fn a_process_logs_to_its_file_is_killed_and_dies_on_drop() {
    let dir = tempfile_free::Dir::new();
    let log = dir.path().join("sh.log");
    let mut process = sh("echo started; echo to-stderr >&2; echo \"$A-${B-unset}\"; exec sleep 60")
        .env("A", "1")
        .env("B", "2")
        .env_remove("B")
        .spawn(&log)
        .unwrap();
    assert_eq!(process.log_path(), log);
    let pid = process.pid();
    assert!(pid_exists(pid));
    process
        .wait_until(
            "three lines",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || match process_log(&log).lines().count() {
                3 => Ok(()),
                lines => Err(format!("{lines} lines")),
            },
        )
        .unwrap();
    assert_eq!(process.log_text(), "started\nto-stderr\n1-unset\n");
    assert_eq!(process.log_tail(1), "1-unset");
    let status = process.kill().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(!pid_exists(pid), "pid {pid} still exists after kill");
    assert_eq!(
        process.kill().unwrap(),
        status,
        "a second kill reports the same end"
    );
    assert!(
        process.signal(libc::SIGTERM).is_err(),
        "no signal goes to a reaped pid"
    );

    let dropped = sh("exec sleep 60")
        .spawn(dir.path().join("drop.log"))
        .unwrap();
    let pid = dropped.pid();
    assert!(pid_exists(pid));
    drop(dropped);
    assert!(!pid_exists(pid), "pid {pid} still exists after drop");
}

/// The log file's text (the process may still be writing it).
fn process_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_process_that_exits_first_fails_the_wait_with_its_status_and_log_tail() {
    let dir = tempfile_free::Dir::new();
    let mut process = sh("echo first; echo the cause >&2; exit 3")
        .spawn(dir.path().join("exit.log"))
        .unwrap();
    let error = process
        .wait_until(
            "it to be ready",
            Duration::from_secs(30),
            Duration::from_millis(10),
            || Err("never".to_owned()),
        )
        .unwrap_err();
    let DevClusterError::ExitedBeforeReady {
        status,
        ref log_tail,
        ref condition,
        ..
    } = error
    else {
        panic!("expected ExitedBeforeReady, got {error}");
    };
    assert_eq!(status.code(), Some(3));
    assert_eq!(log_tail, "first\nthe cause");
    assert_eq!(condition, "it to be ready");
    let text = error.to_string();
    assert!(
        text.contains("exited (exit status: 3)") && text.ends_with("first\nthe cause"),
        "{text}"
    );
    assert_eq!(process.try_wait().unwrap(), Some(status));
}

#[test]
fn a_process_that_never_becomes_ready_fails_the_wait_with_the_last_answer() {
    let dir = tempfile_free::Dir::new();
    let mut process = sh("echo still starting; exec sleep 60")
        .spawn(dir.path().join("slow.log"))
        .unwrap();
    let base = http_server(vec![UNAVAILABLE]);
    let url = format!("{base}/readyz");
    let error = process
        .wait_for_http(&url, Duration::from_millis(300), Duration::from_millis(20))
        .unwrap_err();
    let DevClusterError::NotReady {
        ref last_seen,
        ref log_tail,
        waited,
        ..
    } = error
    else {
        panic!("expected NotReady, got {error}");
    };
    assert_eq!(last_seen, "503 Service Unavailable: warming up");
    assert_eq!(log_tail, "still starting");
    assert!(waited >= Duration::from_millis(300));
    assert!(error
        .to_string()
        .contains(&format!("GET {url} to answer 2xx")));
    assert_eq!(process.try_wait().unwrap(), None, "it still runs");

    // Nothing listening: the last answer says so.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/readyz", listener.local_addr().unwrap())
    };
    let error = process
        .wait_for_http(
            &closed,
            Duration::from_millis(100),
            Duration::from_millis(20),
        )
        .unwrap_err();
    assert!(
        matches!(&error, DevClusterError::NotReady { last_seen, .. } if last_seen.starts_with("no answer: ")),
        "{error}"
    );
    assert!(process
        .wait_for_http("https://127.0.0.1:1/", Duration::ZERO, Duration::ZERO)
        .is_err_and(|error| matches!(error, DevClusterError::InvalidOptions(_))));
}

#[test]
fn wait_for_http_returns_once_the_url_answers_2xx() {
    let dir = tempfile_free::Dir::new();
    let mut process = sh("exec sleep 60")
        .spawn(dir.path().join("ready.log"))
        .unwrap();
    let base = http_server(vec![UNAVAILABLE, UNAVAILABLE, OK]);
    process
        .wait_for_http(
            &format!("{base}/readyz"),
            Duration::from_secs(10),
            Duration::from_millis(10),
        )
        .unwrap();
}

#[test]
fn readiness_driven_by_the_caller_fails_once_the_time_is_up() {
    let dir = tempfile_free::Dir::new();
    let mut process = sh("exec sleep 60")
        .spawn(dir.path().join("steps.log"))
        .unwrap();
    let mut readiness = process.readiness("the caller's check", Duration::from_millis(100));
    readiness.not_yet("first try").unwrap();
    thread::sleep(Duration::from_millis(120));
    let error = readiness.not_yet("second try").unwrap_err();
    assert!(
        matches!(&error, DevClusterError::NotReady { last_seen, condition, .. }
            if last_seen == "second try" && condition == "the caller's check"),
        "{error}"
    );
}

/// Waits until `process` has logged `armed` (its trap is set).
fn wait_armed(process: &mut Process) {
    let log = process.log_path().to_owned();
    process
        .wait_until(
            "the trap to be armed",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || match process_log(&log).contains("armed") {
                true => Ok(()),
                false => Err("not yet".to_owned()),
            },
        )
        .unwrap();
}

#[test]
fn terminate_sends_sigterm_and_waits_for_the_exit() {
    let dir = tempfile_free::Dir::new();
    // The trap runs between two short sleeps, so the exit status is the trap's.
    let mut trapping = sh("trap 'exit 7' TERM; echo armed; while :; do sleep 0.02; done")
        .spawn(dir.path().join("trap.log"))
        .unwrap();
    wait_armed(&mut trapping);
    let status = trapping.terminate(Duration::from_secs(10)).unwrap();
    assert_eq!(status.code(), Some(7));

    let mut plain = sh("exec sleep 60")
        .spawn(dir.path().join("plain.log"))
        .unwrap();
    let status = plain.terminate(Duration::from_secs(10)).unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert_eq!(plain.terminate(Duration::ZERO).unwrap(), status);

    // A process that ignores SIGTERM is still running when the wait gives up.
    let mut stubborn = sh("trap '' TERM; echo armed; while :; do sleep 0.02; done")
        .spawn(dir.path().join("stubborn.log"))
        .unwrap();
    wait_armed(&mut stubborn);
    assert!(matches!(
        stubborn.terminate(Duration::from_millis(200)),
        Err(DevClusterError::Timeout { .. })
    ));
    assert_eq!(stubborn.try_wait().unwrap(), None);
    assert_eq!(
        stubborn.kill().unwrap().signal(),
        Some(libc::SIGKILL),
        "SIGKILL still ends it"
    );
}

/// A temporary directory without the `tempfile` crate (devcluster does not depend on it).
mod tempfile_free {
    use std::path::{Path, PathBuf};

    /// A directory under the system temp dir, removed on drop.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            let path = std::env::temp_dir().join(format!(
                "hotsplit-process-test-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir(&path).unwrap();
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
