//! The fleet: a cluster and two `hotsplit serve` processes, started and published to.

use std::path::Path;
use std::time::Duration;

use hotsplit::hot::HotKeysConfig;
use hotsplit_devcluster::{Cluster, ClusterOptions, Process};
use tempfile::TempDir;

use crate::options::Options;
use crate::{BoxError, SPLIT_COPIES};

/// The cluster and the two instances on it, and the directory of their configs and logs.
pub(crate) struct Fleet {
    /// The 3-master/3-replica cluster (its processes killed when dropped).
    cluster: Cluster,
    /// The masters' ports, whose `HMGET` counts part 2 samples.
    pub(crate) masters: Vec<u16>,
    /// The work directory: the instances' configs, spools and logs (removed when dropped).
    dir: TempDir,
    /// The two `hotsplit serve` processes.
    instances: Vec<Instance>,
    /// The instances' bases, `http://127.0.0.1:P`, by instance.
    pub(crate) bases: Vec<String>,
}

impl Fleet {
    /// Starts a 3x3 cluster (full coverage not required) and both instances on it.
    pub(crate) async fn start(options: &Options) -> Result<Fleet, BoxError> {
        eprintln!("hot_moving: starting a 3x3 cluster");
        let cluster = tokio::task::spawn_blocking(|| {
            Cluster::start(ClusterOptions {
                extra_args: vec!["--cluster-require-full-coverage".into(), "no".into()],
                ..ClusterOptions::default()
            })
        })
        .await??;
        let masters: Vec<u16> = cluster.masters()?.iter().map(|node| node.port()).collect();
        let dir = tempfile::tempdir()?;
        let instances = {
            let (dir, cluster_url, options) =
                (dir.path().to_owned(), cluster.url(), options.clone());
            tokio::task::spawn_blocking(move || start_instances(&dir, &cluster_url, &options))
                .await??
        };
        let bases: Vec<String> = instances
            .iter()
            .map(|instance| instance.base.clone())
            .collect();
        Ok(Fleet {
            cluster,
            masters,
            dir,
            instances,
            bases,
        })
    }

    /// Kills the instances, then the cluster; returns the work directory, which keeps each
    /// instance's log until it is dropped.
    pub(crate) fn stop(self) -> TempDir {
        drop(self.instances);
        drop(self.cluster);
        self.dir
    }
}

/// A running `hotsplit serve`.
struct Instance {
    /// `http://127.0.0.1:P`.
    base: String,
    /// The process (SIGKILLed and reaped when dropped); its stdout and stderr go to its log.
    process: Process,
}

/// How long an instance may take to answer `/readyz` with a 2xx.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A loopback port no socket was bound to a moment ago.
fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The config both instances share but for `port` and `spool`.
fn instance_config(url: &str, port: u16, spool: &Path, options: &Options) -> String {
    let hot = HotKeysConfig::default();
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nshutdown_grace = \"1s\"\n\
         [store]\nredis = \"{url}\"\n\
         [heal]\nspool_dir = {spool:?}\nlayout_interval = \"{layout}\"\n\
         [scrub]\nenabled = false\n\
         [[family]]\nprefix = \"mv:\"\ncopies = 1\nttl = \"10m\"\n\
         [[family]]\nprefix = \"sp:\"\ncopies = 1\nttl = \"10m\"\nplacement = \"spread\"\n\
         split = {{ mode = \"split\", max_copies = {SPLIT_COPIES}, threshold = {threshold:?}, cool_down = \"60s\" }}\n",
        spool = spool.display().to_string(),
        layout = humantime::format_duration(options.layout_interval),
        threshold = hot.threshold,
    )
}

/// Starts `hotsplit serve` named `name` in `dir` on the cluster at `cluster_url`.
fn spawn_instance(
    dir: &Path,
    name: &str,
    cluster_url: &str,
    options: &Options,
) -> Result<Instance, BoxError> {
    let port = free_port()?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        instance_config(
            cluster_url,
            port,
            &dir.join(format!("{name}-spool")),
            options,
        ),
    )?;
    let process = Process::builder(env!("CARGO_BIN_EXE_hotsplit"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("HOTSPLIT_REDIS")
        .env_remove("HOTSPLIT_LISTEN")
        .env_remove("HOTSPLIT_CONFIG")
        .env("HOTSPLIT_LOG", "warn")
        .spawn(dir.join(format!("{name}.log")))?;
    Ok(Instance {
        base: format!("http://127.0.0.1:{port}"),
        process,
    })
}

/// Starts both instances, then waits until each answers `/readyz` with a 2xx (polled every
/// 50 ms, for at most [`READY_WITHIN`]; the error quotes the tail of its log). Blocks.
fn start_instances(
    dir: &Path,
    cluster_url: &str,
    options: &Options,
) -> Result<Vec<Instance>, BoxError> {
    let mut instances = vec![
        spawn_instance(dir, "hotsplit-0", cluster_url, options)?,
        spawn_instance(dir, "hotsplit-1", cluster_url, options)?,
    ];
    for instance in &mut instances {
        instance.process.wait_for_http(
            &format!("{}/readyz", instance.base),
            READY_WITHIN,
            Duration::from_millis(50),
        )?;
    }
    Ok(instances)
}

/// Publishes version 1 of `key` through `base`.
pub(crate) async fn publish(http: &reqwest::Client, base: &str, key: &str) -> Result<(), BoxError> {
    let answer = http
        .put(format!("{base}/v1/keys/{key}?version=1"))
        .body("v".repeat(64))
        .send()
        .await?;
    if !answer.status().is_success() {
        let status = answer.status();
        return Err(format!("publish {key}: {status}: {}", answer.text().await?).into());
    }
    Ok(())
}
