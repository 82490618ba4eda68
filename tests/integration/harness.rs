//! Shared Redis servers and helpers for the integration tests.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hotsplit::config::Config;
use hotsplit::devcluster::{Cluster, ClusterOptions, Standalone};
use hotsplit::metrics::Metrics;
use hotsplit::store::redis::{RedisOptions, RedisStore, RedisTarget};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A standalone server shared by every test that does not inject faults.
pub fn shared_standalone() -> &'static Standalone {
    static SERVER: OnceLock<Standalone> = OnceLock::new();
    SERVER.get_or_init(|| Standalone::start().expect("start the shared standalone redis-server"))
}

/// A 3-master/3-replica cluster shared by every test that does not inject faults.
pub fn shared_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(ClusterOptions::default()).expect("start the shared redis cluster")
    })
}

/// A cluster of the test's own, for fault injection.
pub fn own_cluster() -> Cluster {
    Cluster::start(ClusterOptions::default()).expect("start a redis cluster")
}

/// Connects a Redis store to `url` with a short command timeout.
pub async fn redis_store(url: &str, command_timeout: Duration) -> Arc<RedisStore> {
    let mut options = RedisOptions::new(RedisTarget::parse(url).expect("parse the redis url"));
    options.command_timeout = command_timeout;
    Arc::new(
        RedisStore::connect(options, Metrics::new())
            .await
            .expect("connect to redis"),
    )
}

/// A hotsplit service running on a real socket.
pub struct Service {
    /// `http://127.0.0.1:P`.
    pub base: String,
    /// Resolving it starts graceful shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The server task.
    task: Option<JoinHandle<hotsplit::Result<()>>>,
}

impl Service {
    /// Starts `hotsplit::server::run` on a port-0 listener with `config`.
    pub async fn start(config: Config) -> Service {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hotsplit::server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        let service = Service {
            base,
            stop: Some(stop),
            task: Some(task),
        };
        let client = reqwest::Client::new();
        poll(
            "the service answers /readyz",
            Duration::from_secs(10),
            || {
                let url = format!("{}/readyz", service.base);
                let client = client.clone();
                async move {
                    client
                        .get(url)
                        .send()
                        .await
                        .map(|r| r.status().is_success())
                        .unwrap_or(false)
                }
            },
        )
        .await;
        service
    }

    /// Stops the service and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `check` every 20 ms until it returns true; panics naming `what` after `limit`.
pub async fn poll<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A config for a service on `redis_url` with one split family `prefix` of `copies` copies.
pub fn config_with_family(redis_url: Option<&str>, prefix: &str, copies: u32) -> Config {
    let mut text = format!("[[family]]\nprefix = \"{prefix}\"\ncopies = {copies}\nttl = \"10m\"\n");
    text.push_str("[[family]]\nprefix = \"alloc:\"\ncopies = 4\nversioning = \"allocated\"\n");
    text.push_str("[store]\ncommand_timeout = \"300ms\"\n");
    let mut config = Config::from_toml(&text).expect("test config parses");
    config.store.redis = redis_url.map(str::to_owned);
    config.heal.spool_dir = spool_dir();
    config.validate().expect("test config is valid");
    config
}

/// A fresh spool directory under the system temp dir, kept after the test (a service may still
/// be flushing it when the test ends; the OS temp cleaner removes it).
pub fn spool_dir() -> std::path::PathBuf {
    tempfile::Builder::new()
        .prefix("hotsplit-spool-")
        .tempdir()
        .expect("create a spool dir")
        .keep()
}
