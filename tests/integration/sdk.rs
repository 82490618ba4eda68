//! The Python and TypeScript SDKs (`sdk/python`, `sdk/typescript`) against two `hotsplit
//! serve` binaries on a 3-master/3-replica cluster whose replicas are held back (`CLIENT PAUSE
//! … WRITE` on each replica, under an `advisory` budget raised so the paused replicas stay
//! within it): each SDK's script writes through instance A and reads through instance B with
//! its session 100 times (every write seen) beside plain redis-py/ioredis calls without a
//! session (their misses counted and required above 0, so the test can fail); 16 calls at once
//! on one session each leave their floor; a token the Python process hands over keeps
//! read-your-writes in the TypeScript one.
//!
//! `scripts/test.sh` builds and installs both packages under `target/` and points
//! `HOTSPLIT_SDK_PY` (a python with the `hotsplit` package) and `HOTSPLIT_SDK_NODE_PATH` (a
//! `node_modules` with the `hotsplit` package) at them; without them the test skips, saying
//! so, unless `HOTSPLIT_REQUIRE_RESP_CLIENTS` is set (then it fails).

use std::process::{Command, Output};
use std::time::Duration;

use hotsplit_devcluster::{self as devcluster, Cluster};

use crate::harness::{self, get_json, poll, Binary};
use crate::resp_clients::{client, serve};

/// `sdk:` is read as `advisory`, from replicas, under a budget the paused replicas stay within
/// for the whole test.
const SDK_FAMILY: &str = "[classes.advisory]\nroute = \"replica\"\nreason = \"shown to people\"\nstaleness_budget = \"300s\"\n[[family]]\nprefix = \"sdk:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"advisory\"\n";

/// Polls `/v1/lag` until the three replicas have a measured lag.
async fn wait_for_measured_replicas(base: &str) {
    let http = reqwest::Client::new();
    poll(
        "the lag monitor measured the three replicas",
        Duration::from_secs(20),
        || async {
            let lag = get_json(&http, &format!("{base}/v1/lag")).await;
            lag.as_array().is_some_and(|lines| {
                lines.len() == 3 && lines.iter().all(|line| line["lag_ms"]["now"].is_number())
            })
        },
    )
    .await;
}

/// Shows everything when `output` did not succeed or did not end with `ok`.
fn assert_ok(output: &Output, what: &str, binaries: [&Binary; 2]) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{what}:\n{}", stdout.trim_end());
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\nlog A:\n{}\nlog B:\n{}",
        output.status,
        binaries[0].log_text(),
        binaries[1].log_text()
    );
}

/// The replicas' ports.
fn replicas(cluster: &Cluster) -> Vec<u16> {
    cluster
        .replicas()
        .expect("the cluster's replicas")
        .iter()
        .map(|node| node.port())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_sessions_read_their_writes_across_instances_at_once_and_across_languages() {
    let (Some(python), Some(node_path)) = (
        client("HOTSPLIT_SDK_PY", "the Python SDK"),
        client("HOTSPLIT_SDK_NODE_PATH", "the TypeScript SDK"),
    ) else {
        return;
    };
    let cluster = harness::own_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "[store]\nredis = \"{}\"\ncommand_timeout = \"{}\"\n{SDK_FAMILY}",
        cluster.url(),
        harness::command_timeout_toml()
    );
    let (a, a_port) = serve(dir.path(), &store).await;
    let b_dir = tempfile::tempdir().unwrap();
    let (b, b_port) = serve(b_dir.path(), &store).await;
    for binary in [&a, &b] {
        wait_for_measured_replicas(&binary.base).await;
    }
    // Every replica holds back replication; reads keep working on them.
    let paused = replicas(&cluster);
    for port in &paused {
        devcluster::cli(*port, &["CLIENT", "PAUSE", "120000", "WRITE"]).expect("CLIENT PAUSE");
    }
    let run = format!("{:08x}", rand::random::<u32>());
    let env = |command: &mut Command| {
        command
            .env("HOTSPLIT_A_PORT", a_port.to_string())
            .env("HOTSPLIT_B_PORT", b_port.to_string())
            .env("HOTSPLIT_RUN", &run);
    };
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");

    let mut py = Command::new(&python);
    py.arg(scripts.join("python/tests/sdk_e2e.py"));
    env(&mut py);
    let output = py.output().expect("run python");
    assert_ok(&output, "the Python SDK", [&a, &b]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let handoff = stdout
        .lines()
        .find_map(|line| line.strip_prefix("handoff "))
        .and_then(|rest| rest.split_once(' '))
        .expect("the Python script handed over a key and its token");

    let mut node = Command::new("node");
    node.env("NODE_PATH", &node_path)
        .env("HOTSPLIT_HANDOFF_KEY", handoff.0)
        .env("HOTSPLIT_HANDOFF_TOKEN", handoff.1)
        .arg(scripts.join("typescript/test/sdk_e2e.js"));
    env(&mut node);
    let output = node.output().expect("run node");
    assert_ok(&output, "the TypeScript SDK", [&a, &b]);

    for port in &paused {
        devcluster::cli(*port, &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    }
}

#[test]
fn the_sdks_are_versioned_with_the_service() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let version = env!("CARGO_PKG_VERSION");
    let pyproject = read("sdk/python/pyproject.toml");
    assert!(
        pyproject.contains(&format!("\nversion = \"{version}\"\n")),
        "sdk/python/pyproject.toml is not at {version}"
    );
    assert!(
        read("sdk/python/src/hotsplit/__init__.py")
            .contains(&format!("__version__ = \"{version}\"")),
        "hotsplit.__version__ is not {version}"
    );
    let package: serde_json::Value =
        serde_json::from_str(&read("sdk/typescript/package.json")).expect("package.json");
    assert_eq!(package["version"], version, "sdk/typescript/package.json");
    assert_eq!(package["types"], "dist/index.d.ts");
    assert!(
        read("scripts/test.sh").contains(&format!("hotsplit-{version}.tgz")),
        "scripts/test.sh installs another tarball than hotsplit-{version}.tgz"
    );
}
