//! The Redis store: the only module in the crate that talks to Redis (through fred).
//!
//! A [`RedisStore`] connects to one server (`redis://host:port`) or to a Redis Cluster
//! (`redis-cluster://host:port[,host:port...]`, seed nodes), and keeps every copy `K#i` as a
//! hash with the fields `ver`, `val`, `tomb` and `exp`.
//!
//! # How it talks to Redis
//! - **Writes** go through the Redis Functions library in `hotsplit.lua` (`FCALL
//!   hotsplit_cas_v2`; the names carry the library's version, `store::library`), loaded with
//!   `FUNCTION LOAD REPLACE` of this version's library on every primary that accepts it at
//!   connect time; the
//!   others are retried in the background, at most once a second each, and their writes fail
//!   (so their copies queue) meanwhile. Functions replicate and survive failovers, unlike
//!   `SCRIPT LOAD`. A node that lost its functions (a restart without persistence) answers
//!   `ERR Function not found`: the store reloads the library on that node only and retries
//!   those writes once.
//! - **Fan-out**: [`CopyStore::write_copies`] groups the writes by owning node (the store's copy
//!   of fred's slot map, renewed on each of fred's re-reads: `replicas::follow_slot_map`, so
//!   finding a key's node clones nothing) and sends each group as one fred pipeline, all nodes
//!   at once: one round trip, not N.
//!   fred routes each pipelined command by its own key and gives one timeout to the whole
//!   pipeline, so one pipeline per node means a paused node fails only the copies it owns, each
//!   within the command timeout.
//! - **Reads** are one `HMGET key ver val tomb exp` on the primary that owns the key; no script.
//!   A primary read goes on the store's own pipelined connection to that node (`direct.rs`)
//!   when it is up, and through fred otherwise or when the node refuses it (`MOVED`, …).
//!   Replica reads send the same `HMGET` through a client of the named replica's own (one per
//!   replica, configured for a standalone primary, discovered in Cluster mode), so a replica
//!   read can fail but never turns into a primary read.
//! - **Heartbeats** are `SET hotsplit:hb:{tag}:<instance> <µs> PX 60000` on each primary (the
//!   tag is one whose slot that primary owns) and `GET` of that key on each replica, so
//!   `INFO commandstats` tells heartbeat reads (`GET`) from data reads (`HMGET`).
//! - **Synced writes** (`sync_replicas`) go through a second client, write then `WAIT` on each
//!   node: `WAIT` counts only its own connection's writes, and blocks that connection.
//! - **Version counters** use `FCALL hotsplit_alloc_v2` (a floor, INCR and a TTL that only grows,
//!   atomic), not MULTI/EXEC: fred 10 runs a transaction inside its router task after draining
//!   every connection, so one slow node would stall every command of the client.
//! - **The scrub** walks each primary with `SCAN … MATCH … TYPE hash`, reads copies as stored
//!   (`HMGET`, a copy past `exp` included), repairs through `hotsplit_cas`, and shares the work
//!   through a lease (`FCALL hotsplit_lease_v2` on `#hotsplit#lease#scrub`).
//! - **Audits** (`hotsplit audit`) go through `ReadOnlyNodes`, apart from [`RedisStore`]: one
//!   centralized client per node (discovered with `CLUSTER NODES` or `INFO replication`) that
//!   sends only `SCAN … TYPE hash`, `HMGET key ver tomb exp` and `READONLY`, and never loads the
//!   function library, so an audit cannot write.
//!
//! # Layout
//! Each role of [`crate::store::roles`] is implemented in one file:
//! - `copies.rs`: [`CopyStore`]: placement, the per-node compare-and-set pipelines, the reload
//!   after `ERR Function not found`, copy reads and deletes, and the version counter.
//! - `layouts.rs`: [`crate::store::LayoutStore`]: layout records, their writers, the live sets.
//! - `registry.rs`: [`crate::store::FleetStore`]: the instance registry (`store::registry`),
//!   the session key, status summaries.
//! - `scrub.rs`: [`crate::store::ScrubStore`]: a paged `SCAN` of one primary, and the lease.
//! - `topology.rs`: [`TopologyStore`]: kind, primaries and replicas, the refresh, pings,
//!   heartbeat writes and reads and their keys.
//! - `library.rs`: [`LibraryStore`]: the function library (`hotsplit.lua` beside it, named in
//!   `store::library`), which primaries lack it, the rate-limited loads on them, and the
//!   listing and deletion of other releases' libraries (`FUNCTION LIST`, `FUNCTION DELETE`).
//!
//! Beside them, what the roles share:
//! - `mod.rs`: [`RedisStore`] (the client, [`RedisStore::connect`], its `Drop`).
//! - `target.rs`: [`RedisTarget`] and [`RedisOptions`], the URL and `host:port` parsing; no fred.
//! - `direct.rs`: `DirectReads`, one pipelined connection per primary for copy reads, with its
//!   own RESP encoding and reply parser, one timer per connection, TLS and `AUTH`.
//! - `failure.rs`: `Failure`, the classification of fred errors, and `RedisStore::fail`.
//! - `replicas.rs`: replica clients, the `CLUSTER SLOTS` replica map, key placement (and the
//!   copy of fred's slot map it reads), replica reads and replication offsets.
//! - `wait.rs`: synced writes (of the copy role), the compare-and-set followed by `WAIT`.
//! - `readonly.rs`: `ReadOnlyNodes` and `NodeClient`, the read-only access used by `audit`.
//! - `replies.rs`: pure parsers of Redis replies, with their unit tests.
//!
//! # Invariants
//! - Every command has a timeout (fred has none by default): no caller hangs on a paused node.
//! - fred errors are classified in one place (`Failure::of`), counted with
//!   [`Metrics::store_error`], and mapped to [`ErrorKind::Timeout`] or
//!   [`ErrorKind::Unavailable`].
//! - Versions cross into Lua as canonical decimal strings and are never converted to numbers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{
    ClusterDiscoveryPolicy, Config, ReconnectError, ReconnectPolicy, Server, ServerConfig,
    UnresponsiveConfig,
};
use fred::types::{Builder, ConnectHandle, Key as FredKey};

use super::library::FunctionLibrary;
#[cfg(doc)]
use super::CopyStore;
#[cfg(doc)]
use super::TopologyStore;
use super::{LibraryStore, NodeLabel};
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;

mod copies;
mod direct;
mod failure;
mod feed;
mod layouts;
mod library;
mod readonly;
mod registry;
mod replicas;
mod replies;
mod scrub;
mod splits;
pub mod target;
mod tls;
mod topology;
mod wait;

use failure::Failure;
pub(crate) use readonly::ReadOnlyNodes;
use replicas::{connect_replica, server_label, ReplicaClient};
use replies::ReplicaMap;
use target::{format_address, parse_address};
pub use target::{Password, RedisOptions, RedisSecurity, RedisTarget, RedisUrl, TlsOptions};

/// The hash fields of a copy, in the order `read_copy` asks for them.
const COPY_FIELDS: [&str; 4] = ["ver", "val", "tomb", "exp"];

/// [`COPY_FIELDS`] as fred arguments. `Key::from_static_str` borrows the static text, where
/// `Key::from(&str)` copies each field name into a new buffer on every read.
fn copy_fields() -> Vec<FredKey> {
    COPY_FIELDS.map(FredKey::from_static_str).to_vec()
}

/// How long [`RedisStore::connect`] waits for a half-open client to quit after the connect
/// timeout fired.
const QUIT_AFTER_TIMEOUT: Duration = Duration::from_millis(200);

/// The Redis-backed store, every role of [`crate::store::roles`]. Create it with
/// [`RedisStore::connect`]; share one `Arc<RedisStore>` as the role objects each part uses
/// (`Arc<dyn CopyStore>`, `Arc<dyn TopologyStore>`, …).
pub struct RedisStore {
    /// The fred client; it multiplexes every command over one connection per node.
    client: Client,
    /// The task that drives fred's connections; aborted when the store is dropped.
    connection_task: ConnectHandle,
    /// What was configured, for messages and [`TopologyStore::kind`].
    target: RedisTarget,
    /// The configured server's label in standalone mode; `None` for a cluster.
    standalone_node: Option<NodeLabel>,
    /// The command timeout, for messages.
    command_timeout: Duration,
    /// How long a copy's hash outlives its expiry, milliseconds
    /// ([`RedisOptions::version_retention`]).
    version_retention_ms: u64,
    /// Where store errors are counted.
    metrics: Arc<Metrics>,
    /// One client per replica: the configured ones of a standalone primary, or, in Cluster
    /// mode, every replica in the slot map (kept in step by [`TopologyStore::refresh_topology`]).
    /// Never locked across an await.
    replica_clients: std::sync::RwLock<Vec<Arc<ReplicaClient>>>,
    /// The configured replicas of a standalone primary (empty in Cluster mode).
    standalone_replicas: Vec<NodeLabel>,
    /// The options replica clients are connected with.
    replica_options: RedisOptions,
    /// The client of synced writes (`sync_replicas`), connected on first use: `WAIT` blocks
    /// its connection and counts only that connection's writes, so it is kept apart from the
    /// shared one.
    sync_client: tokio::sync::OnceCell<(Client, ConnectHandle)>,
    /// The client of the lag monitor (heartbeat writes, `INFO` on primaries, `CLUSTER SLOTS`)
    /// and of node probes (`ping_node`), connected in [`RedisStore::connect`]. Apart from the
    /// data client because a command that names a node that is down makes fred schedule a
    /// reconnection of the whole client, which must never stall the data client.
    monitor_client: tokio::sync::OnceCell<(Client, ConnectHandle)>,
    /// Cluster mode: the slot map last read with `CLUSTER SLOTS` by the topology refresh, for
    /// the replicas (fred's cached map leaves out replicas that joined after it was read).
    replica_map: std::sync::RwLock<Option<ReplicaMap>>,
    /// Cluster mode: the heartbeat hash tag found for each primary (a tag whose slot it owns).
    heartbeat_tags: std::sync::Mutex<std::collections::HashMap<NodeLabel, String>>,
    /// The primaries known to lack the function library, retried in the background.
    library: library::LibraryState,
    /// Cluster mode: fred's slot map as `replicas::Placement` reads it, kept a copy of fred's by
    /// `slot_map_task` (`replicas::follow_slot_map`).
    slot_owners: Arc<arc_swap::ArcSwapOption<replicas::SlotOwners>>,
    /// Cluster mode: the task that keeps `slot_owners`; aborted when the store is dropped.
    slot_map_task: Option<tokio::task::JoinHandle<()>>,
    /// The direct connections of primary copy reads (`direct.rs`); `None` when
    /// [`RedisOptions::direct_reads`] is off.
    direct: Option<direct::DirectReads>,
    /// The function library this store loads and calls: this release's
    /// ([`FunctionLibrary::CURRENT`]) unless connected with [`RedisStore::connect_with_library`].
    functions: FunctionLibrary,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Nothing else holds the client, so stopping its connection task closes its sockets.
        self.connection_task.abort();
        if let Some(task) = &self.slot_map_task {
            task.abort();
        }
        if let Some((_, task)) = self.sync_client.get() {
            task.abort();
        }
        if let Some((_, task)) = self.monitor_client.get() {
            task.abort();
        }
    }
}

/// The client's server config for `target`, and the node label of a standalone primary.
///
/// # Errors
/// Why an address is malformed, or that a cluster has no seed.
fn server_config(
    target: &RedisTarget,
) -> std::result::Result<(ServerConfig, Option<NodeLabel>), String> {
    match target {
        RedisTarget::Standalone(address) => {
            let (host, port) = parse_address(address)?;
            let label = NodeLabel::new(format_address(&host, port));
            Ok((ServerConfig::new_centralized(host, port), Some(label)))
        }
        RedisTarget::Cluster(addresses) => {
            if addresses.is_empty() {
                return Err("a cluster needs at least one seed node".to_owned());
            }
            let hosts = addresses
                .iter()
                .map(|address| parse_address(address).map(|(host, port)| Server::new(host, port)))
                .collect::<std::result::Result<Vec<Server>, String>>()?;
            let server = ServerConfig::Clustered {
                hosts,
                // Also try nodes from the last slot map when the seeds are gone.
                policy: ClusterDiscoveryPolicy::UseCache,
            };
            Ok((server, None))
        }
    }
}

/// Starts `client`'s connection within one connect timeout per cluster seed plus one.
///
/// # Errors
/// [`ErrorKind::Unavailable`] naming the URL when Redis cannot be reached in time.
async fn init_client(
    client: &Client,
    options: &RedisOptions,
    metrics: &Metrics,
) -> Result<ConnectHandle> {
    let url = options.url();
    // fred tries the seeds one after another, each within the connect timeout, then
    // connects every primary at once: a paused seed costs one connect timeout when another
    // seed answers, so the whole connection may take one per seed plus one.
    let seeds = match &options.target {
        RedisTarget::Standalone(_) => 0,
        RedisTarget::Cluster(addresses) => addresses.len(),
    };
    let init_timeout = options
        .connect_timeout
        .saturating_mul(u32::try_from(seeds).unwrap_or(u32::MAX).saturating_add(1));
    match tokio::time::timeout(init_timeout, client.init()).await {
        Ok(Ok(task)) => Ok(task),
        Ok(Err(err)) => {
            metrics.store_error(Failure::of(&err).as_str());
            Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "could not connect to redis at {url}: {}{}",
                    failure::details(&err),
                    Failure::connect_hint(&err)
                ),
            ))
        }
        Err(_) => {
            metrics.store_error(Failure::Timeout.as_str());
            // The connection task outlives the dropped `init` future; ask it to stop.
            let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
            Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "could not connect to redis at {url} within {} ms",
                    init_timeout.as_millis()
                ),
            ))
        }
    }
}

impl RedisStore {
    /// Connects to `options.target`, waits for the connection (at most `connect_timeout`, or
    /// one `connect_timeout` per cluster seed plus one: fred tries the seeds in turn) and loads
    /// this release's function library ([`FunctionLibrary::CURRENT`], `hotsplit_v2`) with
    /// `FUNCTION LOAD REPLACE` on every primary. A primary
    /// that refuses the library does not stop the connection: it is retried in the background
    /// and listed by [`LibraryStore::library_missing`].
    ///
    /// Every command the store sends afterwards is bounded by `command_timeout`. A node that
    /// drops its connection is reconnected with exponential backoff (100 ms to 2 s, forever);
    /// `CLUSTERDOWN` and `LOADING` replies also trigger a reconnect, `READONLY` does not, so a write
    /// that reaches a demoted primary fails at once.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when a target address is malformed; [`ErrorKind::Unavailable`] when
    /// Redis cannot be reached in time (the message names the URL) or no primary is known.
    pub async fn connect(options: RedisOptions, metrics: Arc<Metrics>) -> Result<RedisStore> {
        RedisStore::connect_with_library(options, metrics, FunctionLibrary::CURRENT).await
    }

    /// [`RedisStore::connect`], loading and calling `functions` instead of this release's
    /// library: what an instance of another release does (the rolling-upgrade test runs the
    /// previous release's library through it, `tests/integration/upgrade.rs`).
    ///
    /// # Errors
    /// As [`RedisStore::connect`].
    pub async fn connect_with_library(
        options: RedisOptions,
        metrics: Arc<Metrics>,
        functions: FunctionLibrary,
    ) -> Result<RedisStore> {
        let url = options.url();
        let config_error =
            |why: String| Error::new(ErrorKind::Config, format!("redis target {url:?}: {why}"));
        let (server, standalone_node) = server_config(&options.target).map_err(config_error)?;

        // READONLY is left out of the reconnect errors: a write that reaches a replica should
        // fail now, not after a reconnect loop.
        let builder = client_builder(
            server,
            &options,
            vec![ReconnectError::ClusterDown, ReconnectError::Loading],
        )?;
        let client = builder.build().map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "invalid redis client configuration for {url}: {}",
                    failure::details(&err)
                ),
            )
        })?;

        let connection_task = init_client(&client, &options, &metrics).await?;

        let mut replica_clients = Vec::with_capacity(options.replicas.len());
        if !options.replicas.is_empty() && standalone_node.is_none() {
            return Err(config_error(
                "replicas are discovered in cluster mode; configure none".to_owned(),
            ));
        }
        let mut standalone_replicas = Vec::with_capacity(options.replicas.len());
        for address in &options.replicas {
            let (host, port) = parse_address(address).map_err(config_error)?;
            standalone_replicas.push(NodeLabel::new(format_address(&host, port)));
            // A configured replica that is down does not stop startup: its lag stays unknown
            // (over every budget) and the topology refresh connects it later.
            match connect_replica(address, &options, &metrics, false).await {
                Ok(replica) => replica_clients.push(Arc::new(replica)),
                Err(err) => {
                    tracing::warn!(replica = %address, error = %err, "replica not connected yet; reads go to the primary until it is")
                }
            }
        }

        let direct = direct::DirectReads::new(&options, Arc::clone(&metrics))?;
        let slot_owners = Arc::new(arc_swap::ArcSwapOption::empty());
        let slot_map_task = standalone_node
            .is_none()
            .then(|| replicas::follow_slot_map(&client, Arc::clone(&slot_owners)));
        let store = RedisStore {
            slot_owners,
            slot_map_task,
            direct,
            client,
            connection_task,
            target: options.target.clone(),
            standalone_node,
            command_timeout: options.command_timeout,
            version_retention_ms: u64::try_from(options.version_retention.as_millis())
                .unwrap_or(u64::MAX),
            metrics,
            replica_clients: std::sync::RwLock::new(replica_clients),
            standalone_replicas,
            replica_options: options.clone(),
            sync_client: tokio::sync::OnceCell::new(),
            monitor_client: tokio::sync::OnceCell::new(),
            replica_map: std::sync::RwLock::new(None),
            heartbeat_tags: std::sync::Mutex::new(std::collections::HashMap::new()),
            library: library::LibraryState::default(),
            functions,
        };
        // Start with the primaries that accept the library: the others are retried in the
        // background (`library.rs`), and their copies queue meanwhile.
        let loaded = store.load_library_everywhere().await.map_err(|err| {
            Error::new(
                err.kind(),
                format!(
                    "connected to redis at {url} but could not load the function library: {err}"
                ),
            )
        })?;
        let missing = store.library_missing();
        if !missing.is_empty() {
            tracing::warn!(target = %url, loaded, missing = ?missing.iter().map(NodeLabel::to_string).collect::<Vec<_>>(), "started without the function library on some primaries; retrying them in the background");
        }
        // The monitor client probes failing nodes and pings the healthy ones for `/readyz`, so
        // it is connected now, while every primary answers. Connected on first use instead, a
        // node that stalls during that first connection (its handshake never answered) failed
        // every connection attempt, and with it every probe and readiness ping of the healthy
        // primaries, for as long as the node stayed stalled. Once connected, fred reconnects
        // each node on its own. A failure here is retried on first use.
        if let Err(err) = store.monitor_client().await {
            tracing::warn!(target = %url, error = %err, "the lag monitor's client is not connected yet; retrying on first use");
        }
        Ok(store)
    }

    /// The lag monitor's own client, connected in [`RedisStore::connect`] (or, when that failed,
    /// on first use).
    async fn monitor_client(&self) -> Result<&Client> {
        self.dedicated_client(&self.monitor_client, "the lag monitor's client")
            .await
    }

    /// A client of its own (its own connections, so its commands never queue behind the data
    /// client's), connected once into `cell`, within the command timeout (at least 1 s).
    async fn dedicated_client<'a>(
        &self,
        cell: &'a tokio::sync::OnceCell<(Client, ConnectHandle)>,
        what: &str,
    ) -> Result<&'a Client> {
        let (client, _) = cell
            .get_or_try_init(|| async {
                let client = self.client.clone_new();
                match tokio::time::timeout(
                    self.command_timeout.max(Duration::from_secs(1)),
                    client.init(),
                )
                .await
                {
                    Ok(Ok(task)) => Ok((client, task)),
                    Ok(Err(err)) => Err(self.fail(format_args!("connecting {what}"), &err)),
                    Err(_) => {
                        let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
                        Err(Error::new(
                            ErrorKind::Timeout,
                            format!("connecting {what} timed out"),
                        ))
                    }
                }
            })
            .await?;
        Ok(client)
    }
}

/// A fred builder for `server` with the store's timeouts (every command has one), the given
/// reconnect errors, and exponential reconnects from 100 ms to 2 s, forever.
///
/// # Errors
/// As for [`client_builder_without_reconnects`].
/// The least time a connection may go without replies before it is closed as unresponsive.
const UNRESPONSIVE_MIN: Duration = Duration::from_secs(1);

fn client_builder(
    server: ServerConfig,
    options: &RedisOptions,
    reconnect_errors: Vec<ReconnectError>,
) -> Result<Builder> {
    let mut builder = client_builder_without_reconnects(server, options, reconnect_errors)?;
    builder.set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2));
    // A connection whose replies stop (a node cut off by a partition, its TCP connection open
    // and silent) is closed and reconnected after twice the command timeout, at least 1 s:
    // the reconnect re-reads the slot map, so a replica promoted in the meantime is found
    // instead of every read of its slots timing out on the old master until a redirect.
    let unresponsive = options
        .command_timeout
        .saturating_mul(2)
        .max(UNRESPONSIVE_MIN);
    builder.with_connection_config(|conn| {
        conn.unresponsive = UnresponsiveConfig {
            max_timeout: Some(unresponsive),
            interval: (unresponsive / 4).max(Duration::from_millis(10)),
        };
    });
    Ok(builder)
}

/// A fred builder with the options' command and connect timeouts and `reconnect_errors`, the
/// options' TLS and credentials (every client hotsplit opens is built here, or cloned from
/// one that was), and no reconnect policy: a connection that drops stays down.
///
/// # Errors
/// [`ErrorKind::Config`] when a TLS file cannot be read or is not usable.
fn client_builder_without_reconnects(
    server: ServerConfig,
    options: &RedisOptions,
    reconnect_errors: Vec<ReconnectError>,
) -> Result<Builder> {
    let mut builder = Builder::from_config(Config {
        server,
        ..Config::default()
    });
    builder
        .with_performance_config(|perf| {
            perf.default_command_timeout = options.command_timeout;
        })
        .with_connection_config(|conn| {
            conn.connection_timeout = options.connect_timeout;
            conn.internal_command_timeout = options.connect_timeout;
            conn.reconnect_errors = reconnect_errors;
        });
    tls::secure(&mut builder, &options.security)?;
    Ok(builder)
}
