//! `hotsplit spool drain DIR` on a real Redis Cluster: the spool of an instance SIGKILLed with
//! queued copies (its victim master refusing `FCALL`) is refused while a live instance holds
//! it, then replayed by the command into the recovered store; the exit statuses.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use hotsplit_devcluster as devcluster;
use serde_json::Value;

use crate::harness::{self, owner_port, Binary};
use crate::heal::{retry_queue, stored_version};

/// Runs `hotsplit spool drain` with `args`.
fn drain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["spool", "drain"])
        .args(args)
        .env_remove("HOTSPLIT_CONFIG")
        .env_remove("HOTSPLIT_REDIS")
        .output()
        .expect("run hotsplit spool drain")
}

/// The summary line `name` of a drain's stdout, as a number.
fn summary(output: &Output, name: &str) -> u64 {
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix(name))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name:?} line in:\n{text}"))
}

fn described(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_drain_replays_a_dead_instances_spool_and_refuses_a_live_ones() {
    let cluster = harness::own_cluster().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let spool = dir.path().join("spool");
    let spool_arg = spool.display().to_string();
    let config = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"300ms\"\n[heal]\nspool_dir = \"{spool_arg}\"\n\
         [[family]]\nprefix = \"drain:\"\ncopies = 4\nttl = \"10m\"\n",
        cluster.url(),
    );
    let mut first = Binary::spawn(dir.path(), "first", &config);
    first.wait_ready().await;

    // The fault: one master refuses FCALL, so its copy writes fail at once and are queued.
    let victim = owner_port(&cluster, "drain:0#0");
    devcluster::cli(victim, &["ACL", "SETUSER", "default", "-fcall"]).expect("ACL -fcall");
    let http = reqwest::Client::new();
    let mut queued: HashMap<String, u64> = HashMap::new();
    for key in 0..16 {
        let answer = http
            .put(format!("{}/v1/keys/drain:{key}?version=7", first.base))
            .body(format!("value {key}"))
            .send()
            .await
            .expect("publish");
        let body: Value = answer.json().await.expect("a publish report");
        for line in body["outcomes"].as_array().into_iter().flatten() {
            if line["outcome"] == "queued" {
                let copy_key = line["copy_key"].as_str().expect("copy_key").to_owned();
                queued.insert(copy_key, 7);
            }
        }
    }
    assert!(!queued.is_empty(), "some copies live on the victim");
    first.sigkill();

    // While a live instance holds the spool, the drain refuses it (exit 3) and changes nothing.
    let mut second = Binary::spawn(dir.path(), "second", &config);
    second.wait_ready().await;
    let refused = drain(&[&spool_arg, "--redis", &cluster.url()]);
    assert_eq!(refused.status.code(), Some(3), "{}", described(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("locked by a live process"),
        "{}",
        described(&refused)
    );
    let pending = retry_queue(&http, &second.base).await["depth"]
        .as_u64()
        .expect("depth");
    assert_eq!(
        pending,
        queued.len() as u64,
        "the live instance replayed the spool"
    );
    second.sigkill();
    for copy_key in queued.keys() {
        assert_eq!(
            stored_version(victim, copy_key),
            0,
            "{copy_key} is still missing"
        );
    }

    // The master recovers, and one queued copy meanwhile got a newer version (8). The drain
    // replays every other queued copy, never moves that one back, and leaves the spool empty.
    devcluster::cli(victim, &["ACL", "SETUSER", "default", "+fcall"]).expect("ACL +fcall");
    let newer = queued.keys().next().expect("a queued copy").clone();
    let exp = (hotsplit::store::now_unix_ms() + 600_000).to_string();
    devcluster::cli(
        victim,
        &[
            "HSET", &newer, "ver", "8", "val", "newer", "tomb", "0", "exp", &exp,
        ],
    )
    .expect("a newer copy");
    let drained = drain(&[&spool_arg, "--redis", &cluster.url()]);
    assert_eq!(drained.status.code(), Some(0), "{}", described(&drained));
    let replayed = queued.len() as u64 - 1;
    assert_eq!(
        summary(&drained, "replayed"),
        replayed,
        "{}",
        described(&drained)
    );
    assert_eq!(
        summary(&drained, "already newer"),
        1,
        "{}",
        described(&drained)
    );
    assert_eq!(summary(&drained, "left in spool"), 0);
    assert_eq!(summary(&drained, "failed writes"), 0);
    for (copy_key, version) in &queued {
        let expected = if *copy_key == newer { 8 } else { *version };
        assert_eq!(stored_version(victim, copy_key), expected, "{copy_key}");
    }

    // Drained again: nothing left; an older entry would have counted as already newer.
    let again = drain(&[&spool_arg, "--redis", &cluster.url()]);
    assert_eq!(again.status.code(), Some(0), "{}", described(&again));
    assert_eq!(summary(&again, "replayed"), 0, "{}", described(&again));

    // A directory without a spool is a usage error, and nothing is created there.
    let empty = dir.path().join("no-spool");
    let missing = drain(&[&empty.display().to_string(), "--redis", &cluster.url()]);
    assert_eq!(missing.status.code(), Some(2), "{}", described(&missing));
    assert!(!Path::new(&empty).exists());
}
