//! The two services a `hotsplit check` run tests ([`Services`]): one with its near cache off and
//! one with it on, on the run's cluster, each with a spool of its own, the run's token and a
//! Redis-protocol door; started on ports of their own, waited for until ready and until they
//! measure the replicas' lag, and stopped at the end of the run, their files removed.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::client_cache::CacheBound;
use super::options::CheckOptions;
use hotsplit::config::Config;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit_devcluster::Cluster;

/// The two services under test on the run's cluster (near cache off, and on), ready, with the
/// client that speaks to them and the files made for them.
pub(super) struct Services {
    /// The HTTP client of the run: every request sends the run's token.
    pub(super) http: reqwest::Client,
    /// The base URL of the service with its near cache off.
    pub(super) base: String,
    /// The base URL of the service with its near cache on.
    pub(super) near_base: String,
    /// The Redis-protocol door of the service with its near cache off.
    pub(super) resp_address: std::net::SocketAddr,
    /// The Redis-protocol door of the service with its near cache on.
    pub(super) near_resp_address: std::net::SocketAddr,
    /// The run's token (read, write and admin scopes).
    pub(super) token: String,
    /// The service with its near cache off.
    pub(super) service: tokio::task::JoinHandle<Result<()>>,
    /// The service with its near cache on.
    pub(super) near_service: tokio::task::JoinHandle<Result<()>>,
    /// Cancelled to stop both services.
    pub(super) stop: CancellationToken,
    /// The spools and the tokens file, removed when the run ends.
    pub(super) files: RunFiles,
    /// What a client-side cache's answer of the near-cache service is judged against (the
    /// `client-cache` mode reads its door).
    pub(super) cache_bound: CacheBound,
}

/// The files a run makes for its services, removed when it ends: never a spool another process
/// owns.
pub(super) struct RunFiles {
    /// The spool of the service with its near cache off.
    spool: PathBuf,
    /// The `[auth] tokens_file` both services read.
    tokens_file: PathBuf,
    /// The spool of the service with its near cache on.
    near_spool: PathBuf,
}

impl RunFiles {
    /// Removes the files, ignoring those already gone.
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.spool);
        let _ = std::fs::remove_file(&self.tokens_file);
        let _ = std::fs::remove_dir_all(&self.near_spool);
    }
}

impl Services {
    /// Configures both services on `cluster` (a spool each, the run's token, a Redis-protocol
    /// door each), starts them on ports of their own and waits until both are ready.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when a service stops or is not ready within 20 s;
    /// [`ErrorKind::Config`] for a token that is not visible ASCII; I/O errors writing the tokens
    /// file or binding.
    pub(super) async fn start(options: &CheckOptions, cluster: &Cluster) -> Result<Services> {
        let mut config = service_config(options, cluster)?;
        // The run's own spool, removed with the run: never a spool another process owns.
        let spool = std::env::temp_dir().join(format!(
            "hotsplit-check-{}-{}",
            std::process::id(),
            options.seed
        ));
        config.heal.spool_dir = spool.clone();
        // The service asks for a token, so every request of the run passes the token check too.
        let token = options
            .token
            .clone()
            .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let tokens_file = spool.with_extension("tokens");
        std::fs::write(
            &tokens_file,
            format!(
                "{} read,write,admin  # hotsplit check\n",
                hotsplit::auth::hash_line(&token)
            ),
        )?;
        config.auth.tokens_file = Some(tokens_file.clone());
        // The same service with its near cache on, for the near-cache rows; a spool of its own.
        let mut near_config = config.clone();
        near_config.near_cache.enabled = true;
        let near_spool = spool.with_extension("near");
        near_config.heal.spool_dir = near_spool.clone();
        let cache_bound = CacheBound::of(&near_config)?;
        // Each service's Redis-protocol door, for the `resp` mode, on a port free a moment ago.
        let resp_address = free_address().await?;
        let near_resp_address = free_address().await?;
        config.resp.listen = Some(resp_address);
        near_config.resp.listen = Some(near_resp_address);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let near_listener = TcpListener::bind("127.0.0.1:0").await?;
        let near_base = format!("http://{}", near_listener.local_addr()?);
        let stop = CancellationToken::new();
        let mut service = tokio::spawn(hotsplit::server::run(listener, config, {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        }));
        let mut near_service = tokio::spawn(hotsplit::server::run(near_listener, near_config, {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        }));
        let http = run_client(&token)?;
        wait_ready(&http, &base, &mut service).await?;
        wait_ready(&http, &near_base, &mut near_service).await?;
        Ok(Services {
            http,
            base,
            near_base,
            resp_address,
            near_resp_address,
            token,
            service,
            near_service,
            stop,
            cache_bound,
            files: RunFiles {
                spool,
                tokens_file,
                near_spool,
            },
        })
    }

    /// Waits until both services measure the lag of all three replicas.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when a service does not within 30 s.
    pub(super) async fn wait_replicas_measured(&self) -> Result<()> {
        wait_replicas_measured(&self.http, &self.base).await?;
        wait_replicas_measured(&self.http, &self.near_base).await
    }

    /// Stops both services and waits for them; gives back the files to remove.
    pub(super) async fn stop(self) -> RunFiles {
        self.stop.cancel();
        let _ = self.service.await;
        let _ = self.near_service.await;
        self.files
    }
}

/// The configuration both services start from: the check's families (`check:` with
/// `options.copies` copies, `claim:` with one) on `cluster`, with TLS when the run has it, and
/// the near cache off.
///
/// # Errors
/// [`ErrorKind::Config`] if the configuration does not parse (it always should).
fn service_config(options: &CheckOptions, cluster: &Cluster) -> Result<Config> {
    // A 2 s command timeout, as `--instances 2` and the integration tests use: at 300 ms, healthy
    // masters timed out on a loaded 2-core machine (load 13-26) and were marked failing, so more
    // than half of a phase's reads were refused `unavailable`, no reader met a lagging replica,
    // and the random-suffix control showed no violation. A stopped master is still found at once
    // by the health probes; the faults still lose writes and stall them.
    // `check:` names `placement = "suffix"`: the recorder reads its copies on their masters by
    // their `K#i` names.
    let mut config = Config::from_toml(&format!(
        "[store]\ncommand_timeout = \"2s\"\n[[family]]\nprefix = \"check:\"\ncopies = {}\nttl = \"10m\"\ndefault_class = \"advisory\"\nplacement = \"suffix\"\n[[family]]\nprefix = \"claim:\"\ncopies = 1\nttl = \"10m\"\ndefault_class = \"advisory\"\n[near_cache]\nenabled = false\n",
        options.copies
    ))?;
    config.store.redis = Some(cluster.url());
    if let Some(tls) = &options.tls {
        config.store.tls_ca_file = Some(tls.ca_file.clone());
        config.store.tls_cert_file = Some(tls.cert_file.clone());
        config.store.tls_key_file = Some(tls.key_file.clone());
    }
    Ok(config)
}

/// The run's HTTP client: a 5 s timeout, and `token` as the bearer of every request.
///
/// # Errors
/// [`ErrorKind::Config`] when the token is not visible ASCII; [`ErrorKind::Io`] when the client
/// cannot be built.
fn run_client(token: &str) -> Result<reqwest::Client> {
    let mut authorization = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Error::new(ErrorKind::Config, "the token must be visible ASCII"))?;
    authorization.set_sensitive(true);
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .default_headers(
            [(reqwest::header::AUTHORIZATION, authorization)]
                .into_iter()
                .collect(),
        )
        .build()
        .map_err(|err| Error::new(ErrorKind::Io, format!("http client: {err}")))
}

/// A loopback address no socket was bound to a moment ago (the service binds it next).
async fn free_address() -> Result<std::net::SocketAddr> {
    let probe = TcpListener::bind("127.0.0.1:0").await?;
    Ok(probe.local_addr()?)
}

/// Polls `ready` every 50 ms until it holds; after `limit`, an error saying `what` did not happen.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut ready: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !ready().await {
        if Instant::now() > deadline {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{what} within {} s", limit.as_secs()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Polls `base`'s `/readyz` until it answers 2xx; fails at once, with its error, when the
/// service at `base` (`service`) stops first, e.g. because it could not connect to the cluster,
/// and after 20 s with the last answer (or why there was none).
async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    service: &mut tokio::task::JoinHandle<Result<()>>,
) -> Result<()> {
    let last = Mutex::new(String::from("no answer yet"));
    let waited = wait_for(
        "hotsplit did not become ready on the cluster",
        Duration::from_secs(20),
        || async {
            if service.is_finished() {
                return true;
            }
            let seen = match http.get(format!("{base}/readyz")).send().await {
                Ok(answer) if answer.status().is_success() => return true,
                Ok(answer) => {
                    let status = answer.status();
                    format!("{status}: {}", answer.text().await.unwrap_or_default())
                }
                Err(err) => err.to_string(),
            };
            *last.lock().unwrap_or_else(PoisonError::into_inner) = seen;
            false
        },
    )
    .await;
    if let Err(err) = waited {
        let last = last.into_inner().unwrap_or_else(PoisonError::into_inner);
        return Err(Error::new(
            err.kind(),
            format!("{}; the last /readyz: {last}", err.message()),
        ));
    }
    if !service.is_finished() {
        return Ok(());
    }
    let why = match service.await {
        Ok(Ok(())) => "it stopped without an error".to_owned(),
        Ok(Err(err)) => err.to_string(),
        Err(err) => format!("its task failed: {err}"),
    };
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("hotsplit could not start on the cluster: {why}"),
    ))
}

/// Waits until `/v1/lag` lists three replicas with a measured lag within the advisory budget,
/// so the first mode does not run while replicas are still being discovered.
async fn wait_replicas_measured(http: &reqwest::Client, base: &str) -> Result<()> {
    wait_for(
        "hotsplit did not measure the lag of three replicas",
        Duration::from_secs(30),
        || async {
            let Ok(answer) = http.get(format!("{base}/v1/lag")).send().await else {
                return false;
            };
            let Ok(serde_json::Value::Array(replicas)) = answer.json::<serde_json::Value>().await
            else {
                return false;
            };
            let measured = replicas
                .iter()
                .filter(|replica| replica["within_budget"]["advisory"] == true)
                .count();
            measured >= 3
        },
    )
    .await
}
