//! The Redis store: the only module in the crate that talks to Redis (through fred).
//!
//! A [`RedisStore`] connects to one server (`redis://host:port`) or to a Redis Cluster
//! (`redis-cluster://host:port[,host:port...]`, seed nodes), and keeps every copy `K#i` as a
//! hash with the fields `ver`, `val`, `tomb` and `exp`.
//!
//! # How it talks to Redis
//! - **Writes** go through the Redis Functions library in `hotsplit.lua` (`FCALL hotsplit_cas`),
//!   loaded with `FUNCTION LOAD REPLACE` on every primary at connect time. Functions replicate
//!   and survive failovers, unlike `SCRIPT LOAD`. A node that lost its functions (a restart
//!   without persistence) answers `ERR Function not found`: the store reloads the library on every
//!   primary and retries those writes once.
//! - **Fan-out**: [`Store::write_copies`] groups the writes by owning node (fred's cached slot
//!   map) and sends each group as one fred pipeline, all nodes at once: one round trip, not N.
//!   fred routes each pipelined command by its own key and gives one timeout to the whole
//!   pipeline, so one pipeline per node means a paused node fails only the copies it owns, each
//!   within the command timeout.
//! - **Reads** are one `HMGET key ver val tomb exp` on the primary that owns the key; no script.
//!   Replica reads send the same `HMGET` through a client of the named replica's own (one per
//!   replica, configured for a standalone primary, discovered in Cluster mode), so a replica
//!   read can fail but never turns into a primary read.
//! - **Heartbeats** are `SET hotsplit:hb:{tag}:<instance> <µs> PX 60000` on each primary (the
//!   tag is one whose slot that primary owns) and `GET` of that key on each replica, so
//!   `INFO commandstats` tells heartbeat reads (`GET`) from data reads (`HMGET`).
//! - **Synced writes** (`sync_replicas`) go through a second client, write then `WAIT` on each
//!   node: `WAIT` counts only its own connection's writes, and blocks that connection.
//! - **Version counters** use `FCALL hotsplit_alloc` (INCR + PEXPIRE, atomic), not MULTI/EXEC:
//!   fred 10 runs a transaction inside its router task after draining every connection, so one
//!   slow node would stall every command of the client.
//! - **Audits** (`hotsplit audit`) go through `ReadOnlyNodes`, apart from [`RedisStore`]: one
//!   centralized client per node (discovered with `CLUSTER NODES` or `INFO replication`) that
//!   sends only `SCAN … TYPE hash`, `HMGET key ver tomb` and `READONLY`, and never loads the
//!   function library, so an audit cannot write.
//!
//! # Invariants
//! - Every command has a timeout (fred has none by default): no caller hangs on a paused node.
//! - fred errors are classified in one place (`Failure::of`), counted with
//!   [`Metrics::store_error`], and mapped to [`ErrorKind::Timeout`] or
//!   [`ErrorKind::Unavailable`].
//! - Versions cross into Lua as canonical decimal strings and are never converted to numbers.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{
    ClientLike, ClusterInterface, FredResult, FunctionInterface, HashesInterface, KeysInterface,
    ServerInterface,
};
use fred::types::cluster::ClusterRouting;
use fred::types::config::{
    ClusterDiscoveryPolicy, Config, ReconnectError, ReconnectPolicy, Server, ServerConfig,
};
use fred::types::{Builder, ClusterHash, ConnectHandle, CustomCommand, Key as FredKey, Value};
use futures_util::future::{join_all, BoxFuture};

use super::{
    layout_key, CasOutcome, CopyRead, CopyRecord, CopyStamp, CopyWrite, Layout, NodeLabel, Payload,
    ReplicaSet, ServedBy, Store, WriteResult,
};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};
use crate::metrics::Metrics;

/// The Redis Functions library (`#!lua name=hotsplit`), loaded on every primary.
const LIBRARY: &str = include_str!("hotsplit.lua");

/// The library's compare-and-set function.
const CAS_FUNCTION: &str = "hotsplit_cas";

/// The library's version-counter function.
const ALLOC_FUNCTION: &str = "hotsplit_alloc";

/// The hash fields of a copy, in the order `read_copy` asks for them.
const COPY_FIELDS: [&str; 4] = ["ver", "val", "tomb", "exp"];

/// [`COPY_FIELDS`] as fred arguments. `Key::from_static_str` borrows the static text, where
/// `Key::from(&str)` copies each field name into a new buffer on every read.
fn copy_fields() -> Vec<FredKey> {
    COPY_FIELDS.map(FredKey::from_static_str).to_vec()
}

/// The port used when a URL names none.
const DEFAULT_PORT: u16 = 6379;

/// The largest millisecond value (expiry or time to live) the library accepts: 18 digits, so
/// `PEXPIREAT`/`PEXPIRE` can never overflow after the hash was written. Larger values are clamped
/// to it (it is about 31 million years).
const MAX_MILLIS: u64 = 999_999_999_999_999_999;

/// How long [`RedisStore::connect`] waits for a half-open client to quit after the connect
/// timeout fired.
const QUIT_AFTER_TIMEOUT: Duration = Duration::from_millis(200);

/// Where Redis is: one server, or the seed nodes of a Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, as `host:port`.
    Standalone(String),
    /// Seed nodes of a Redis Cluster, each `host:port`; the other nodes are discovered.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses `redis://host[:port]` (one server) or `redis-cluster://host[:port][,host[:port]...]`
    /// (cluster seed nodes). The port defaults to 6379. IPv6 hosts go in brackets (`[::1]:6379`).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the scheme is neither `redis://` nor `redis-cluster://`, when the
    /// URL carries credentials, a path, a database or a query, when `redis://` names more than one
    /// server, or when a host or port is empty or malformed. The message names what is wrong.
    pub fn parse(url: &str) -> Result<RedisTarget> {
        let invalid = |why: String| Error::new(ErrorKind::Config, why);
        let url = url.trim();
        if url.is_empty() {
            return Err(invalid("redis url is empty".to_owned()));
        }
        let (cluster, rest) = if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, rest)
        } else if url.starts_with("rediss://") {
            return Err(invalid(format!(
                "redis url {url:?} uses tls (rediss://), which is not supported"
            )));
        } else {
            return Err(invalid(format!(
                "redis url {url:?} must start with redis:// (one server) or redis-cluster:// (cluster seed nodes)"
            )));
        };
        // Checked before anything that echoes the URL, so a password never reaches a log.
        if rest.contains('@') {
            return Err(invalid(
                "credentials (user:password@) in the redis url are not supported".to_owned(),
            ));
        }
        let (authority, trailing) = match rest.find(['/', '?', '#']) {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if !trailing.is_empty() && trailing != "/" {
            return Err(invalid(format!(
                "redis url {url:?} has {trailing:?} after host:port; paths, databases and queries are not supported"
            )));
        }
        let addresses = authority
            .split(',')
            .map(|address| {
                parse_address(address)
                    .map(|(host, port)| format_address(&host, port))
                    .map_err(|why| invalid(format!("redis url {url:?}: {why}")))
            })
            .collect::<Result<Vec<String>>>()?;
        if cluster {
            return Ok(RedisTarget::Cluster(addresses));
        }
        match <[String; 1]>::try_from(addresses) {
            Ok([address]) => Ok(RedisTarget::Standalone(address)),
            Err(addresses) => Err(invalid(format!(
                "redis url {url:?} names {} servers; redis:// takes one host:port, use redis-cluster:// for cluster seed nodes",
                addresses.len()
            ))),
        }
    }

    /// `redis` or `redis-cluster`.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTarget::Standalone(_) => "redis",
            RedisTarget::Cluster(_) => "redis-cluster",
        }
    }
}

impl fmt::Display for RedisTarget {
    /// The target as a URL, `redis://host:port` or `redis-cluster://host:port,...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Standalone(address) => write!(f, "redis://{address}"),
            RedisTarget::Cluster(addresses) => write!(f, "redis-cluster://{}", addresses.join(",")),
        }
    }
}

/// Splits `host[:port]` or `[ipv6][:port]` into a host (without brackets) and a port.
fn parse_address(address: &str) -> std::result::Result<(String, u16), String> {
    if address.is_empty() {
        return Err("a host:port is empty".to_owned());
    }
    let (host, port) = if let Some(bracketed) = address.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(format!("{address:?} opens '[' without a closing ']'"));
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!(
                "{address:?} does not hold an ipv6 address in brackets"
            ));
        }
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => {
                    return Err(format!(
                        "{address:?} has {after:?} after ']'; expected ':port'"
                    ))
                }
            },
        }
    } else {
        let (host, port) = match address.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        };
        if host.is_empty() {
            return Err(format!("the host is empty in {address:?}"));
        }
        if let Some(bad) = host
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(format!(
                "host {host:?} contains {bad:?}; hosts are names or ipv4 addresses (ipv6 goes in brackets)"
            ));
        }
        (host, port)
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => {
                return Err(format!(
                    "port {text:?} in {address:?} is not a number in 1..=65535"
                ))
            }
        },
    };
    Ok((host.to_owned(), port))
}

/// Renders a host and port as `host:port`, bracketing IPv6 hosts.
fn format_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// The server or cluster to connect to. Default: none, it is required.
    pub target: RedisTarget,
    /// How long one command may take before it fails with [`ErrorKind::Timeout`]; it bounds
    /// every call on a slow or paused node. Default: 500 ms.
    pub command_timeout: Duration,
    /// How long connecting (TCP, cluster discovery) may take at startup. Default: 2 s.
    pub connect_timeout: Duration,
    /// Replicas of a standalone primary, each `host:port`, read through a client of their
    /// own (fred's centralized `replicas()` reads the primary). Must be empty for a cluster,
    /// whose replicas are discovered. Default: none.
    pub replicas: Vec<String>,
}

impl RedisOptions {
    /// The default [`RedisOptions::command_timeout`].
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

    /// The default [`RedisOptions::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    /// Options for `target` with every other field at its default.
    pub fn new(target: RedisTarget) -> RedisOptions {
        RedisOptions {
            target,
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            replicas: Vec::new(),
        }
    }
}

/// A stable class of store failure: the `kind` label of `hotsplit_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The command did not answer within the command timeout.
    Timeout,
    /// The connection failed.
    Io,
    /// A cluster error (MOVED/ASK beyond the redirection limit, CLUSTERDOWN) or no route.
    Cluster,
    /// `ERR Function not found`: the node lost the library.
    FunctionMissing,
    /// `READONLY`: the write reached a replica.
    ReadOnly,
    /// `NOSCRIPT`: a script cache miss.
    NoScript,
    /// The client is closing, or the command was dropped.
    Canceled,
    /// fred's command queue is full.
    Backpressure,
    /// Anything else, including replies the store cannot parse.
    Other,
}

impl Failure {
    /// Classifies a fred error. This is the one place that looks at error kinds and details:
    /// NOSCRIPT, READONLY and `ERR Function not found` all arrive as [`FredErrorKind::Unknown`].
    fn of(err: &FredError) -> Failure {
        match err.kind() {
            FredErrorKind::Timeout => Failure::Timeout,
            FredErrorKind::IO => Failure::Io,
            FredErrorKind::Cluster | FredErrorKind::Routing => Failure::Cluster,
            FredErrorKind::Canceled => Failure::Canceled,
            FredErrorKind::Backpressure => Failure::Backpressure,
            FredErrorKind::Unknown => {
                let details = err.details();
                if details.starts_with("ERR Function not found") {
                    Failure::FunctionMissing
                } else if details.starts_with("READONLY") {
                    Failure::ReadOnly
                } else if details.starts_with("NOSCRIPT") {
                    Failure::NoScript
                } else {
                    Failure::Other
                }
            }
            _ => Failure::Other,
        }
    }

    /// The metric label.
    fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Io => "io",
            Failure::Cluster => "cluster",
            Failure::FunctionMissing => "function_missing",
            Failure::ReadOnly => "readonly",
            Failure::NoScript => "noscript",
            Failure::Canceled => "canceled",
            Failure::Backpressure => "backpressure",
            Failure::Other => "other",
        }
    }
}

/// Where keys live, captured once per operation.
enum Placement {
    /// Every key lives on the one server.
    Standalone(NodeLabel),
    /// Keys live where fred's cached slot map says; `None` before the first discovery.
    Cluster(Option<ClusterRouting>),
}

impl Placement {
    /// The primary that owns `key`, or `unknown` when the slot map does not say.
    fn node_of(&self, key: &str) -> NodeLabel {
        match self {
            Placement::Standalone(node) => node.clone(),
            Placement::Cluster(routing) => routing
                .as_ref()
                .and_then(|routing| routing.get_server(fred::util::redis_keyslot(key.as_bytes())))
                .map(server_label)
                .unwrap_or_else(|| NodeLabel::new("unknown")),
        }
    }
}

/// A fred server as a node label, `host:port`.
fn server_label(server: &Server) -> NodeLabel {
    NodeLabel::new(format_address(&server.host, server.port))
}

/// The Redis-backed [`Store`]. Create it with [`RedisStore::connect`]; share it as
/// `Arc<dyn Store>`.
pub struct RedisStore {
    /// The fred client; it multiplexes every command over one connection per node.
    client: Client,
    /// The task that drives fred's connections; aborted when the store is dropped.
    connection_task: ConnectHandle,
    /// What was configured, for messages and [`Store::kind`].
    target: RedisTarget,
    /// The configured server's label in standalone mode; `None` for a cluster.
    standalone_node: Option<NodeLabel>,
    /// The command timeout, for messages.
    command_timeout: Duration,
    /// Where store errors are counted.
    metrics: Arc<Metrics>,
    /// One client per replica: the configured ones of a standalone primary, or, in Cluster
    /// mode, every replica in the slot map (kept in step by [`Store::refresh_topology`]).
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
    /// The client of the lag monitor (heartbeat writes, `INFO` on primaries, `CLUSTER SLOTS`),
    /// connected on first use: a command that names a node that is down makes fred schedule a
    /// reconnection of the whole client, which must never stall the data client.
    monitor_client: tokio::sync::OnceCell<(Client, ConnectHandle)>,
    /// Cluster mode: the slot map last read with `CLUSTER SLOTS` by the topology refresh, for
    /// the replicas (fred's cached map leaves out replicas that joined after it was read).
    replica_map: std::sync::RwLock<Option<ReplicaMap>>,
    /// Cluster mode: the heartbeat hash tag found for each primary (a tag whose slot it owns).
    heartbeat_tags: std::sync::Mutex<std::collections::HashMap<NodeLabel, String>>,
}

/// A client of one replica.
///
/// Each replica has a client of its own, in Cluster mode too: fred's centralized `replicas()`
/// reads the primary, and fred's cluster replica routing (its `replicas` feature, not built
/// here) hides which node served and can fall back to the primary on its own. A client per
/// replica confines a dead replica to that replica, and lets the router name the exact replica
/// that serves.
struct ReplicaClient {
    /// The replica, `host:port`.
    label: NodeLabel,
    /// Its own connection: reads sent here are served by that replica, never the primary. A
    /// Cluster replica answers reads of its primary's slots only after `READONLY`, which a
    /// reconnect forgets, so `READONLY` is sent again with every heartbeat read.
    node: NodeClient,
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
        if let Some((_, task)) = self.sync_client.get() {
            task.abort();
        }
        if let Some((_, task)) = self.monitor_client.get() {
            task.abort();
        }
    }
}

impl RedisStore {
    /// Connects to `options.target`, waits for the connection (at most `connect_timeout`) and
    /// loads the `hotsplit` function library with `FUNCTION LOAD REPLACE` on every primary.
    ///
    /// Every command the store sends afterwards is bounded by `command_timeout`. A node that
    /// drops its connection is reconnected with exponential backoff (100 ms to 2 s, forever);
    /// `CLUSTERDOWN` and `LOADING` replies also trigger a reconnect, `READONLY` does not, so a write
    /// that reaches a demoted primary fails at once.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when a target address is malformed; [`ErrorKind::Unavailable`] when
    /// Redis cannot be reached within `connect_timeout` (the message names the URL) or the
    /// library cannot be loaded; [`ErrorKind::Timeout`] when loading the library timed out.
    pub async fn connect(options: RedisOptions, metrics: Arc<Metrics>) -> Result<RedisStore> {
        let url = options.target.to_string();
        let config_error =
            |why: String| Error::new(ErrorKind::Config, format!("redis target {url:?}: {why}"));
        let (server, standalone_node) = match &options.target {
            RedisTarget::Standalone(address) => {
                let (host, port) = parse_address(address).map_err(config_error)?;
                let label = NodeLabel::new(format_address(&host, port));
                (ServerConfig::new_centralized(host, port), Some(label))
            }
            RedisTarget::Cluster(addresses) => {
                if addresses.is_empty() {
                    return Err(config_error(
                        "a cluster needs at least one seed node".to_owned(),
                    ));
                }
                let hosts = addresses
                    .iter()
                    .map(|address| {
                        parse_address(address).map(|(host, port)| Server::new(host, port))
                    })
                    .collect::<std::result::Result<Vec<Server>, String>>()
                    .map_err(config_error)?;
                let server = ServerConfig::Clustered {
                    hosts,
                    // Also try nodes from the last slot map when the seeds are gone.
                    policy: ClusterDiscoveryPolicy::UseCache,
                };
                (server, None)
            }
        };

        // READONLY is left out of the reconnect errors: a write that reaches a replica should
        // fail now, not after a reconnect loop.
        let builder = client_builder(
            server,
            &options,
            vec![ReconnectError::ClusterDown, ReconnectError::Loading],
        );
        let client = builder.build().map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "invalid redis client configuration for {url}: {}",
                    err.details()
                ),
            )
        })?;

        let connection_task =
            match tokio::time::timeout(options.connect_timeout, client.init()).await {
                Ok(Ok(task)) => task,
                Ok(Err(err)) => {
                    metrics.store_error(Failure::of(&err).as_str());
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("could not connect to redis at {url}: {}", err.details()),
                    ));
                }
                Err(_) => {
                    metrics.store_error(Failure::Timeout.as_str());
                    // The connection task outlives the dropped `init` future; ask it to stop.
                    let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "could not connect to redis at {url} within {} ms",
                            options.connect_timeout.as_millis()
                        ),
                    ));
                }
            };

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

        let store = RedisStore {
            client,
            connection_task,
            target: options.target.clone(),
            standalone_node,
            command_timeout: options.command_timeout,
            metrics,
            replica_clients: std::sync::RwLock::new(replica_clients),
            standalone_replicas,
            replica_options: options.clone(),
            sync_client: tokio::sync::OnceCell::new(),
            monitor_client: tokio::sync::OnceCell::new(),
            replica_map: std::sync::RwLock::new(None),
            heartbeat_tags: std::sync::Mutex::new(std::collections::HashMap::new()),
        };
        store.load_library().await.map_err(|err| {
            Error::new(
                err.kind(),
                format!(
                    "connected to redis at {url} but could not load the function library: {err}"
                ),
            )
        })?;
        Ok(store)
    }

    /// The primaries as far as this instance knows: every master of the cluster, or the one
    /// server.
    pub fn primaries(&self) -> Vec<NodeLabel> {
        match &self.standalone_node {
            Some(node) => vec![node.clone()],
            None => self.primary_servers().iter().map(server_label).collect(),
        }
    }

    /// (Re)loads the function library with `FUNCTION LOAD REPLACE` on every primary, one
    /// command per primary, concurrently.
    ///
    /// Each primary is addressed directly rather than through fred's `function_load_cluster`:
    /// fred sends such all-node commands only after draining every connection, which would wait
    /// on a paused node without a bound.
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] or [`ErrorKind::Unavailable`] for the first primary that failed;
    /// [`ErrorKind::Unavailable`] when no primary is known.
    pub async fn load_library(&self) -> Result<()> {
        if let Some(node) = &self.standalone_node {
            return self
                .client
                .function_load::<Value, _>(true, LIBRARY)
                .await
                .map(drop)
                .map_err(|err| {
                    self.fail(format_args!("loading the function library on {node}"), &err)
                });
        }
        let primaries = self.primary_servers();
        if primaries.is_empty() {
            self.metrics.store_error(Failure::Cluster.as_str());
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("no primary of {} is known", self.target),
            ));
        }
        let loads = primaries.iter().map(|server| async move {
            self.client
                .with_cluster_node(server.clone())
                .function_load::<Value, _>(true, LIBRARY)
                .await
                .map(drop)
                .map_err(|err| {
                    self.fail(
                        format_args!("loading the function library on {}", server_label(server)),
                        &err,
                    )
                })
        });
        join_all(loads).await.into_iter().collect()
    }

    /// The dedicated client of synced writes, connected on first use.
    async fn sync_client(&self) -> Result<&Client> {
        self.dedicated_client(&self.sync_client, "the synced-write client")
            .await
    }

    /// The lag monitor's own client, connected on first use.
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

    /// Writes `batch` (all owned by `node`) through `client`, then `WAIT`s on that node.
    async fn cas_then_wait(
        &self,
        client: &Client,
        node: &NodeLabel,
        batch: &[&CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> (Vec<FredResult<Value>>, Option<u32>) {
        let replies = self.cas_pipeline_on(client, batch).await;
        if replies.iter().all(Result::is_err) {
            return (replies, None);
        }
        let cluster_node = if self.standalone_node.is_some() {
            None
        } else {
            match self.primary_server(node) {
                Some(server) => Some(server),
                None => return (replies, None),
            }
        };
        let options = fred::types::config::Options {
            timeout: Some(Duration::from_millis(timeout_ms) + self.command_timeout),
            cluster_node,
            ..Default::default()
        };
        let acked = client
            .with_options(&options)
            .wait::<i64>(
                i64::from(replicas),
                i64::try_from(timeout_ms).unwrap_or(i64::MAX),
            )
            .await;
        match acked {
            Ok(count) => (replies, u32::try_from(count).ok()),
            Err(err) => {
                let err = self.fail(format_args!("WAIT on {node}"), &err);
                tracing::warn!(error = %err, "waiting for replicas failed");
                (replies, None)
            }
        }
    }

    /// The configured standalone replica called `label`.
    fn replica_client(&self, label: &NodeLabel) -> Option<Arc<ReplicaClient>> {
        self.replica_clients
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|replica| replica.label == *label)
            .cloned()
    }

    /// Connects clients for replicas that joined the cluster and drops those of replicas that
    /// left. A replica that cannot be connected now is tried again at the next refresh.
    async fn sync_replica_clients(&self) {
        let wanted: Vec<NodeLabel> = self
            .topology()
            .into_iter()
            .flat_map(|set| set.replicas)
            .collect();
        let known: Vec<NodeLabel> = self
            .replica_clients
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|replica| replica.label.clone())
            .collect();
        let mut added = Vec::new();
        let cluster = self.standalone_node.is_none();
        for label in wanted.iter().filter(|label| !known.contains(label)) {
            match connect_replica(
                label.as_str(),
                &self.replica_options,
                &self.metrics,
                cluster,
            )
            .await
            {
                Ok(replica) => added.push(Arc::new(replica)),
                Err(err) => {
                    tracing::warn!(replica = %label, error = %err, "could not connect to a cluster replica")
                }
            }
        }
        let mut clients = self
            .replica_clients
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        clients.retain(|replica| wanted.contains(&replica.label));
        for replica in added {
            if !clients.iter().any(|known| known.label == replica.label) {
                clients.push(replica);
            }
        }
    }

    /// The cluster primary called `label`, as a fred server.
    fn primary_server(&self, label: &NodeLabel) -> Option<Server> {
        self.primary_servers()
            .into_iter()
            .find(|server| server_label(server) == *label)
    }

    /// The cluster primary a replica called `label` replicates.
    fn primary_of_replica(&self, label: &NodeLabel) -> Option<Server> {
        let primary = self
            .topology()
            .into_iter()
            .find(|set| set.replicas.contains(label))?
            .primary;
        self.primary_server(&primary)
    }

    /// The replicas of `primary` in the slot map this store read itself (`CLUSTER SLOTS`, see
    /// [`Store::refresh_topology`]); none before the first read.
    fn cluster_replicas(&self, primary: &Server) -> Vec<NodeLabel> {
        self.replica_map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .and_then(|map| map.get(&server_label(primary)).cloned())
            .unwrap_or_default()
    }

    /// Reads `CLUSTER SLOTS` from the first primary that answers, for its replicas. This is a
    /// plain command with the command timeout: fred's own `sync_cluster` would hold its router
    /// task (every command of the client) while it reconnects to a node that is down.
    async fn read_replica_map(&self) -> Result<()> {
        // No node is named: fred sends a keyless command over a connection it has, so a node
        // that is down is never addressed (naming one makes fred schedule a reconnection).
        let reply = self
            .monitor_client()
            .await?
            .cluster_slots::<Value>()
            .await
            .map_err(|err| self.fail(format_args!("CLUSTER SLOTS"), &err))?;
        let map = replicas_from_cluster_slots(&reply)
            .map_err(|why| self.corrupt(format!("CLUSTER SLOTS reply: {why}")))?;
        *self
            .replica_map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(map);
        Ok(())
    }

    /// A hash tag whose slot `primary` owns, cached per primary and checked on every use.
    fn heartbeat_tag(&self, primary: &Server) -> Option<String> {
        let routing = self.client.cached_cluster_state()?;
        let label = server_label(primary);
        let owns = |tag: &str| {
            routing
                .get_server(fred::util::redis_keyslot(tag.as_bytes()))
                .is_some_and(|owner| owner == primary)
        };
        let mut tags = self
            .heartbeat_tags
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tag) = tags.get(&label) {
            if owns(tag) {
                return Some(tag.clone());
            }
        }
        let tag = (0..100_000u32)
            .map(|n| format!("hb{n}"))
            .find(|tag| owns(tag))?;
        tags.insert(label, tag.clone());
        Some(tag)
    }

    /// The primaries of the cluster from fred's cached slot map (empty in standalone mode).
    fn primary_servers(&self) -> Vec<Server> {
        self.client
            .cached_cluster_state()
            .map(|routing| routing.unique_primary_nodes())
            .unwrap_or_default()
    }

    /// A snapshot of where keys live.
    fn placement(&self) -> Placement {
        match &self.standalone_node {
            Some(node) => Placement::Standalone(node.clone()),
            None => Placement::Cluster(self.client.cached_cluster_state()),
        }
    }

    /// Maps a fred error to the crate's error and counts it. This is the one place where store
    /// errors are classified; `what` names the operation, the copy and the node.
    fn fail(&self, what: fmt::Arguments<'_>, err: &FredError) -> Error {
        let failure = Failure::of(err);
        self.metrics.store_error(failure.as_str());
        match failure {
            Failure::Timeout => Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what} timed out after {} ms",
                    self.command_timeout.as_millis()
                ),
            ),
            _ => Error::new(
                ErrorKind::Unavailable,
                format!("{what} failed ({}): {}", failure.as_str(), err.details()),
            ),
        }
    }

    /// An answer from Redis the store cannot interpret; counted as `other`.
    fn corrupt(&self, message: String) -> Error {
        self.metrics.store_error(Failure::Other.as_str());
        Error::new(ErrorKind::Unavailable, message)
    }

    /// Sends `FCALL hotsplit_cas` for the writes at `indexes`: one pipeline per owning node
    /// (from `nodes`, aligned with `writes`), every node at once. Returns one reply per index, in
    /// the order of `indexes`.
    async fn cas_per_node(
        &self,
        writes: &[CopyWrite],
        nodes: &[NodeLabel],
        indexes: &[usize],
    ) -> Vec<FredResult<Value>> {
        // Positions into `indexes`, grouped by node.
        let mut groups: BTreeMap<&NodeLabel, Vec<usize>> = BTreeMap::new();
        for (position, &at) in indexes.iter().enumerate() {
            groups.entry(&nodes[at]).or_default().push(position);
        }
        let sent = join_all(groups.into_values().map(|positions| async move {
            let batch: Vec<&CopyWrite> = positions
                .iter()
                .map(|&position| &writes[indexes[position]])
                .collect();
            let replies = self.cas_pipeline(&batch).await;
            (positions, replies)
        }))
        .await;

        let mut replies: Vec<Option<FredResult<Value>>> = indexes.iter().map(|_| None).collect();
        for (positions, group_replies) in sent {
            for (position, reply) in positions.into_iter().zip(group_replies) {
                replies[position] = Some(reply);
            }
        }
        replies
            .into_iter()
            .map(|reply| {
                reply.unwrap_or_else(|| {
                    Err(FredError::new(
                        FredErrorKind::Protocol,
                        "no reply was matched to this write",
                    ))
                })
            })
            .collect()
    }

    /// Sends the writes as one fred pipeline and returns one reply per write, in order.
    ///
    /// fred routes every command of a pipeline by its own key, waits for all replies with one
    /// timeout (the command timeout) and, through `try_all`, returns each command's reply; when
    /// the pipeline as a whole fails (a timeout), it returns a single error, which then stands
    /// for every write of the batch. Callers keep one batch to one node, so a paused node times
    /// out only its own writes.
    async fn cas_pipeline(&self, batch: &[&CopyWrite]) -> Vec<FredResult<Value>> {
        self.cas_pipeline_on(&self.client, batch).await
    }

    /// [`RedisStore::cas_pipeline`] through `client`.
    async fn cas_pipeline_on(
        &self,
        client: &Client,
        batch: &[&CopyWrite],
    ) -> Vec<FredResult<Value>> {
        let pipeline = client.pipeline();
        let mut queue_errors: Vec<Option<FredError>> = Vec::with_capacity(batch.len());
        for write in batch {
            // Queueing only buffers the command in memory; it answers at once.
            let queued = pipeline
                .fcall::<(), _, _, _>(CAS_FUNCTION, write.copy_key.as_str(), cas_args(write))
                .await;
            queue_errors.push(queued.err());
        }
        let queued = queue_errors.iter().filter(|error| error.is_none()).count();
        let replies = pipeline.try_all::<Value>().await;
        let whole_failure = (replies.len() != queued).then(|| {
            replies
                .iter()
                .find_map(|reply| reply.as_ref().err().cloned())
                .unwrap_or_else(|| {
                    FredError::new(
                        FredErrorKind::Protocol,
                        format!("{} replies to {queued} pipelined commands", replies.len()),
                    )
                })
        });
        let mut replies = replies.into_iter();
        queue_errors
            .into_iter()
            .map(|queue_error| match (queue_error, &whole_failure) {
                (Some(error), _) => Err(error),
                (None, Some(error)) => Err(error.clone()),
                (None, None) => replies.next().unwrap_or_else(|| {
                    Err(FredError::new(
                        FredErrorKind::Protocol,
                        "a pipelined reply is missing",
                    ))
                }),
            })
            .collect()
    }

    /// Sends one `FCALL`; on `ERR Function not found` reloads the library and retries once.
    async fn fcall_reloading(
        &self,
        function: &str,
        key: &str,
        args: Vec<Value>,
    ) -> FredResult<Value> {
        let first = self.client.fcall(function, key, args.clone()).await;
        match first {
            Err(err) if Failure::of(&err) == Failure::FunctionMissing => {
                self.reload_after_missing_function(1).await;
                self.client.fcall(function, key, args).await
            }
            other => other,
        }
    }

    /// Counts `failed` commands answered with `ERR Function not found` and reloads the library.
    /// A failure to reload is only logged: the retried commands report it.
    async fn reload_after_missing_function(&self, failed: usize) {
        for _ in 0..failed {
            self.metrics.store_error(Failure::FunctionMissing.as_str());
        }
        match self.load_library().await {
            Ok(()) => {
                tracing::info!(target = %self.target, "reloaded the hotsplit function library")
            }
            Err(err) => {
                tracing::warn!(target = %self.target, error = %err, "could not reload the hotsplit function library")
            }
        }
    }

    /// Turns one `hotsplit_cas` reply into an outcome.
    fn cas_outcome(
        &self,
        write: &CopyWrite,
        node: &NodeLabel,
        reply: FredResult<Value>,
    ) -> Result<CasOutcome> {
        let copy = &write.copy_key;
        let reply =
            reply.map_err(|err| self.fail(format_args!("write of copy {copy} on {node}"), &err))?;
        parse_cas_reply(reply).map_err(|why| {
            self.corrupt(format!(
                "unexpected reply to {CAS_FUNCTION} for copy {copy} on {node}: {why}"
            ))
        })
    }
}

/// A fred builder for `server` with the store's timeouts (every command has one), the given
/// reconnect errors, and exponential reconnects from 100 ms to 2 s, forever.
fn client_builder(
    server: ServerConfig,
    options: &RedisOptions,
    reconnect_errors: Vec<ReconnectError>,
) -> Builder {
    let mut builder = client_builder_without_reconnects(server, options, reconnect_errors);
    builder.set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2));
    builder
}

/// A fred builder with the options' command and connect timeouts and `reconnect_errors`, and
/// no reconnect policy: a connection that drops stays down.
fn client_builder_without_reconnects(
    server: ServerConfig,
    options: &RedisOptions,
    reconnect_errors: Vec<ReconnectError>,
) -> Builder {
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
    builder
}

/// Connects a client of one standalone replica at `address`.
async fn connect_replica(
    address: &str,
    options: &RedisOptions,
    metrics: &Arc<Metrics>,
    cluster: bool,
) -> Result<ReplicaClient> {
    let (host, port) = parse_address(address)
        .map_err(|why| Error::new(ErrorKind::Config, format!("replica {address:?}: {why}")))?;
    let label = NodeLabel::new(format_address(&host, port));
    let builder = client_builder(
        ServerConfig::new_centralized(host, port),
        options,
        vec![ReconnectError::Loading],
    );
    let client = builder.build().map_err(|err| {
        Error::new(
            ErrorKind::Config,
            format!(
                "invalid replica client configuration for {label}: {}",
                err.details()
            ),
        )
    })?;
    match tokio::time::timeout(options.connect_timeout, client.init()).await {
        Ok(Ok(connection_task)) => Ok(ReplicaClient {
            label,
            node: NodeClient {
                client,
                connection_task,
                cluster_replica: cluster,
            },
        }),
        Ok(Err(err)) => {
            metrics.store_error(Failure::of(&err).as_str());
            Err(Error::new(
                ErrorKind::Unavailable,
                format!("could not connect to replica {label}: {}", err.details()),
            ))
        }
        Err(_) => {
            metrics.store_error(Failure::Timeout.as_str());
            let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
            Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "could not connect to replica {label} within {} ms",
                    options.connect_timeout.as_millis()
                ),
            ))
        }
    }
}

/// The heartbeat key of `instance` under hash tag `tag` (empty in standalone mode).
fn heartbeat_key(tag: &str, instance: &str) -> String {
    if tag.is_empty() {
        format!("hotsplit:hb:{instance}")
    } else {
        format!("hotsplit:hb:{{{tag}}}:{instance}")
    }
}

/// Each cluster primary's replicas, `host:port` labels, sorted.
type ReplicaMap = std::collections::HashMap<NodeLabel, Vec<NodeLabel>>;

/// Each primary's replicas, read out of a `CLUSTER SLOTS` reply: an array of
/// `[start, end, primary, replica…]` where every node is `[host, port, id, …]`.
///
/// This is parsed here rather than by fred: fred's replica support (its `replicas` feature)
/// busy-loops its router task on a command whose node has no connection (fred 10.1,
/// `create_replica_connection` re-queues such a command with its attempt restored, forever),
/// which pinned a core and stopped runtime shutdown after a master failover.
fn replicas_from_cluster_slots(reply: &Value) -> std::result::Result<ReplicaMap, String> {
    fn node(value: &Value) -> std::result::Result<NodeLabel, String> {
        let Value::Array(fields) = value else {
            return Err(format!("a node is not an array: {value:?}"));
        };
        let host = fields
            .first()
            .and_then(Value::as_string)
            .ok_or_else(|| format!("a node has no host: {value:?}"))?;
        let port = fields
            .get(1)
            .and_then(Value::as_u64)
            .and_then(|port| u16::try_from(port).ok())
            .ok_or_else(|| format!("a node has no port: {value:?}"))?;
        Ok(NodeLabel::new(format_address(&host, port)))
    }
    let Value::Array(ranges) = reply else {
        return Err(format!("not an array: {reply:?}"));
    };
    let mut map = ReplicaMap::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(format!("a slot range is not an array: {range:?}"));
        };
        let primary = node(
            parts
                .get(2)
                .ok_or_else(|| format!("a slot range has no primary: {range:?}"))?,
        )?;
        let replicas = map.entry(primary).or_default();
        for replica in parts.iter().skip(3) {
            let replica = node(replica)?;
            if !replicas.contains(&replica) {
                replicas.push(replica);
            }
        }
        replicas.sort();
    }
    Ok(map)
}

/// Reads `field:<number>` out of an INFO reply.
fn info_number(info: &str, field: &str) -> Option<u64> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)?
            .strip_prefix(':')?
            .parse::<u64>()
            .ok()
    })
}

/// How long heartbeat keys live after their last write.
const HEARTBEAT_TTL_MS: i64 = 60_000;

/// The `FCALL hotsplit_cas` arguments of a write: version, payload, tomb, expire_at_ms.
fn cas_args(write: &CopyWrite) -> Vec<Value> {
    let (payload, tomb) = match &write.payload {
        Payload::Value(bytes) => (bytes.clone(), "0"),
        Payload::Tombstone => (Bytes::new(), "1"),
    };
    vec![
        write.version.to_string().into(),
        payload.into(),
        tomb.into(),
        write.expire_at_ms.min(MAX_MILLIS).to_string().into(),
    ]
}

/// Parses `{"applied"|"current"|"stale", version}`.
fn parse_cas_reply(reply: Value) -> std::result::Result<CasOutcome, String> {
    let fields = reply.into_array();
    let [status, version] = <[Value; 2]>::try_from(fields)
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let version = version
        .as_str()
        .ok_or_else(|| format!("the version is not text: {version:?}"))?
        .parse::<Version>()
        .map_err(|err| err.message().to_owned())?;
    match status.as_str().as_deref() {
        Some("applied") => Ok(CasOutcome::Applied),
        Some("current") => Ok(CasOutcome::Current),
        Some("stale") => Ok(CasOutcome::Stale { stored: version }),
        _ => Err(format!("unknown status {status:?}")),
    }
}

/// Parses the `HMGET ver val tomb exp` reply of a copy: `None` when the copy does not exist.
fn parse_copy(reply: Value) -> std::result::Result<Option<CopyRecord>, String> {
    let fields = reply.into_array();
    let [ver, val, tomb, exp] = <[Value; 4]>::try_from(fields)
        .map_err(|fields| format!("expected 4 fields, got {}", fields.len()))?;
    if ver.is_null() && val.is_null() && tomb.is_null() && exp.is_null() {
        return Ok(None);
    }
    // The fields are borrowed from the reply (a `Cow`), not copied: this runs on every read.
    fn text<'v>(name: &str, value: &'v Value) -> std::result::Result<Cow<'v, str>, String> {
        match value.as_str() {
            Some(text) => Ok(text),
            None if value.is_null() => Err(format!("field {name} is missing")),
            None => Err(format!("field {name} is not text")),
        }
    }
    let version = Version::from_str(&text("ver", &ver)?)
        .map_err(|err| format!("field ver: {}", err.message()))?;
    let expire_at_ms = {
        let exp = text("exp", &exp)?;
        exp.parse::<u64>()
            .map_err(|_| format!("field exp {exp:?} is not a millisecond timestamp"))?
    };
    let payload = match text("tomb", &tomb)?.as_ref() {
        "1" => Payload::Tombstone,
        "0" => Payload::Value(val.into_bytes().ok_or("field val is missing")?),
        other => return Err(format!("field tomb {other:?} is neither \"0\" nor \"1\"")),
    };
    Ok(Some(CopyRecord {
        version,
        payload,
        expire_at_ms,
    }))
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        self.target.kind()
    }

    fn node_of(&self, copy_key: &CopyKey) -> NodeLabel {
        self.placement().node_of(copy_key.as_str())
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        Box::pin(async move {
            let placement = self.placement();
            let nodes: Vec<NodeLabel> = writes
                .iter()
                .map(|write| placement.node_of(write.copy_key.as_str()))
                .collect();
            let everything: Vec<usize> = (0..writes.len()).collect();
            let mut replies = self.cas_per_node(writes, &nodes, &everything).await;

            let missing: Vec<usize> = replies
                .iter()
                .enumerate()
                .filter(|(_, reply)| {
                    matches!(reply, Err(err) if Failure::of(err) == Failure::FunctionMissing)
                })
                .map(|(at, _)| at)
                .collect();
            if !missing.is_empty() {
                // One reload for the whole batch, then each of those writes is retried once.
                self.reload_after_missing_function(missing.len()).await;
                let retried = self.cas_per_node(writes, &nodes, &missing).await;
                for (at, reply) in missing.into_iter().zip(retried) {
                    replies[at] = reply;
                }
            }

            writes
                .iter()
                .zip(nodes)
                .zip(replies)
                .map(|((write, node), reply)| {
                    let outcome = self.cas_outcome(write, &node, reply);
                    WriteResult { node, outcome }
                })
                .collect()
        })
    }

    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead> {
        Box::pin(async move {
            let node = self.placement().node_of(copy_key.as_str());
            let record = match self
                .client
                .hmget::<Value, _, _>(copy_key.as_str(), copy_fields())
                .await
            {
                Ok(reply) => parse_copy(reply).map_err(|why| {
                    self.corrupt(format!("copy {copy_key} on {node} is corrupt: {why}"))
                }),
                Err(err) => Err(self.fail(format_args!("read of copy {copy_key} on {node}"), &err)),
            };
            CopyRead {
                served_by: ServedBy::primary(node),
                record,
            }
        })
    }

    fn allocate_version<'a>(&'a self, key: &'a Key, ttl_ms: u64) -> BoxFuture<'a, Result<Version>> {
        Box::pin(async move {
            let counter = key.counter_key();
            let node = self.placement().node_of(&counter);
            let args = vec![Value::from(ttl_ms.min(MAX_MILLIS).to_string())];
            let reply = self
                .fcall_reloading(ALLOC_FUNCTION, &counter, args)
                .await
                .map_err(|err| {
                    self.fail(format_args!("version allocation for {key} on {node}"), &err)
                })?;
            let text = reply
                .as_str()
                .map(|text| text.into_owned())
                .unwrap_or_default();
            text.parse::<Version>().map_err(|err| {
                self.corrupt(format!(
                    "version counter {counter} on {node} holds an invalid version: {}",
                    err.message()
                ))
            })
        })
    }

    fn topology(&self) -> Vec<ReplicaSet> {
        if let Some(node) = &self.standalone_node {
            if self.standalone_replicas.is_empty() {
                return Vec::new();
            }
            return vec![ReplicaSet {
                primary: node.clone(),
                replicas: self.standalone_replicas.clone(),
            }];
        }
        let Some(routing) = self.client.cached_cluster_state() else {
            return Vec::new();
        };
        routing
            .unique_primary_nodes()
            .into_iter()
            .map(|primary| {
                let replicas = self.cluster_replicas(&primary);
                ReplicaSet {
                    primary: server_label(&primary),
                    replicas,
                }
            })
            .collect()
    }

    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>> {
        Box::pin(async move {
            let placement = self.placement();
            let nodes: Vec<NodeLabel> = writes
                .iter()
                .map(|write| placement.node_of(write.copy_key.as_str()))
                .collect();
            let client = match self.sync_client().await {
                Ok(client) => client,
                Err(err) => {
                    return nodes
                        .into_iter()
                        .map(|node| {
                            (
                                WriteResult {
                                    node,
                                    outcome: Err(err.clone()),
                                },
                                None,
                            )
                        })
                        .collect()
                }
            };
            let mut groups: BTreeMap<&NodeLabel, Vec<usize>> = BTreeMap::new();
            for (at, node) in nodes.iter().enumerate() {
                groups.entry(node).or_default().push(at);
            }
            let sent = join_all(groups.into_iter().map(|(node, positions)| async move {
                let batch: Vec<&CopyWrite> = positions.iter().map(|&at| &writes[at]).collect();
                let (replies, acked) = self
                    .cas_then_wait(client, node, &batch, replicas, timeout_ms)
                    .await;
                (positions, replies, acked)
            }))
            .await;
            let mut results: Vec<Option<(WriteResult, Option<u32>)>> =
                writes.iter().map(|_| None).collect();
            for (positions, replies, acked) in sent {
                for (at, reply) in positions.into_iter().zip(replies) {
                    let node = nodes[at].clone();
                    let outcome = self.cas_outcome(&writes[at], &node, reply);
                    let acked = if outcome.is_ok() { acked } else { None };
                    results[at] = Some((WriteResult { node, outcome }, acked));
                }
            }
            results
                .into_iter()
                .zip(nodes)
                .map(|(result, node)| {
                    result.unwrap_or_else(|| {
                        (
                            WriteResult {
                                node,
                                outcome: Err(Error::new(
                                    ErrorKind::Unavailable,
                                    "no reply was matched to this write",
                                )),
                            },
                            None,
                        )
                    })
                })
                .collect()
        })
    }

    fn refresh_topology(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if self.standalone_node.is_some() {
                self.sync_replica_clients().await;
                return Ok(());
            }
            let read = self.read_replica_map().await;
            self.sync_replica_clients().await;
            read
        })
    }

    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead> {
        Box::pin(async move {
            let fields = copy_fields();
            // The replica's own client: a failure is an error here, never a primary read.
            let reply = match self.replica_client(replica) {
                Some(replica) => {
                    replica
                        .node
                        .client
                        .hmget::<Value, _, _>(copy_key.as_str(), fields)
                        .await
                }
                None => Err(FredError::new(
                    FredErrorKind::Routing,
                    format!("{replica} has no client"),
                )),
            };
            let record = match reply {
                Ok(reply) => parse_copy(reply).map_err(|why| {
                    self.corrupt(format!(
                        "copy {copy_key} on replica {replica} is corrupt: {why}"
                    ))
                }),
                Err(err) => Err(self.fail(
                    format_args!("read of copy {copy_key} on replica {replica}"),
                    &err,
                )),
            };
            CopyRead {
                served_by: ServedBy::replica(replica.clone()),
                record,
            }
        })
    }

    fn read_layout<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Option<Layout>>> {
        Box::pin(async move {
            let key = layout_key(family);
            let text: Option<String> = self
                .client
                .get(key.as_str())
                .await
                .map_err(|err| self.fail(format_args!("read of layout record {key}"), &err))?;
            match text {
                None => Ok(None),
                Some(text) => Layout::decode(&text).map(Some).ok_or_else(|| {
                    self.corrupt(format!("layout record {key} is corrupt: {text:?}"))
                }),
            }
        })
    }

    fn write_heartbeat<'a>(
        &'a self,
        primary: &'a NodeLabel,
        instance: &'a str,
        stamp_us: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let key = if self.standalone_node.is_some() {
                heartbeat_key("", instance)
            } else {
                let server = self.primary_server(primary).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("primary {primary} is not known"),
                    )
                })?;
                let tag = self.heartbeat_tag(&server).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("no slot of {primary} is known"),
                    )
                })?;
                heartbeat_key(&tag, instance)
            };
            self.monitor_client()
                .await?
                .set::<Value, _, _>(
                    key,
                    stamp_us.to_string(),
                    Some(fred::types::Expiration::PX(HEARTBEAT_TTL_MS)),
                    None,
                    false,
                )
                .await
                .map(drop)
                .map_err(|err| self.fail(format_args!("heartbeat write on {primary}"), &err))
        })
    }

    fn read_heartbeat<'a>(
        &'a self,
        replica: &'a NodeLabel,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            let client = self.replica_client(replica).ok_or_else(|| {
                Error::new(ErrorKind::Unavailable, format!("{replica} has no client"))
            })?;
            let reply = if self.standalone_node.is_some() {
                client
                    .node
                    .client
                    .get::<Option<String>, _>(heartbeat_key("", instance))
                    .await
            } else {
                let primary = self.primary_of_replica(replica).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("replica {replica} is not known"),
                    )
                })?;
                let tag = self.heartbeat_tag(&primary).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("no slot of {replica}'s primary is known"),
                    )
                })?;
                if client.node.cluster_replica {
                    // Pipelined ahead of the GET on the same connection: one round trip.
                    let readonly = client.node.client.custom::<Value, Value>(
                        CustomCommand::new_static("READONLY", ClusterHash::Random, false),
                        Vec::new(),
                    );
                    let get = client
                        .node
                        .client
                        .get::<Option<String>, _>(heartbeat_key(&tag, instance));
                    let (readonly, get) = futures_util::future::join(readonly, get).await;
                    if let Err(err) = readonly {
                        tracing::debug!(replica = %replica, error = %err, "READONLY failed");
                    }
                    get
                } else {
                    client
                        .node
                        .client
                        .get::<Option<String>, _>(heartbeat_key(&tag, instance))
                        .await
                }
            };
            let text = reply
                .map_err(|err| self.fail(format_args!("heartbeat read on {replica}"), &err))?;
            Ok(text.and_then(|text| text.parse::<u64>().ok()))
        })
    }

    fn replication_offset<'a>(&'a self, node: &'a NodeLabel) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let kind = Some(fred::types::InfoKind::Replication);
            let monitor = self.monitor_client().await?;
            let (info, field) = if self.standalone_node.as_ref() == Some(node) {
                (monitor.info::<String>(kind).await, "master_repl_offset")
            } else if let Some(replica) = self.replica_client(node) {
                (
                    replica.node.client.info::<String>(kind).await,
                    "slave_repl_offset",
                )
            } else if let Some(server) = self.primary_server(node) {
                (
                    monitor.with_cluster_node(server).info::<String>(kind).await,
                    "master_repl_offset",
                )
            } else {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{node} is not known"),
                ));
            };
            let info =
                info.map_err(|err| self.fail(format_args!("INFO replication on {node}"), &err))?;
            info_number(&info, field)
                .ok_or_else(|| self.corrupt(format!("INFO replication on {node} has no {field}")))
        })
    }

    fn write_layout<'a>(&'a self, family: &'a str, layout: Layout) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let key = layout_key(family);
            self.client
                .set::<(), _, _>(key.as_str(), layout.encode(), None, None, false)
                .await
                .map_err(|err| self.fail(format_args!("write of layout record {key}"), &err))
        })
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            // One DEL per key: in a cluster the copies live in different slots.
            let deletes = copy_keys.iter().map(|copy_key| async move {
                self.client
                    .del::<u64, _>(copy_key.as_str())
                    .await
                    .map_err(|err| self.fail(format_args!("delete of copy {copy_key}"), &err))
            });
            let mut removed = 0;
            let mut first_error = None;
            for result in join_all(deletes).await {
                match result {
                    Ok(count) => removed += count,
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                }
            }
            match first_error {
                Some(err) => Err(err),
                None => Ok(removed),
            }
        })
    }

    fn scan_keys<'a>(
        &'a self,
        pattern: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let nodes: Vec<Option<Server>> = match &self.standalone_node {
                Some(_) => vec![None],
                None => self.primary_servers().into_iter().map(Some).collect(),
            };
            let mut keys = Vec::new();
            for server in nodes {
                let mut cursor = "0".to_owned();
                loop {
                    let page = match &server {
                        None => {
                            self.client
                                .scan_page::<Value, _, _>(cursor.clone(), pattern, Some(1000), None)
                                .await
                        }
                        Some(server) => {
                            self.client
                                .with_cluster_node(server.clone())
                                .scan_page::<Value, _, _>(cursor.clone(), pattern, Some(1000), None)
                                .await
                        }
                    }
                    .map_err(|err| self.fail(format_args!("scan for {pattern}"), &err))?;
                    let [next, found] =
                        <[Value; 2]>::try_from(page.into_array()).map_err(|_| {
                            self.corrupt(format!("unexpected SCAN reply for {pattern}"))
                        })?;
                    keys.extend(
                        found
                            .into_array()
                            .into_iter()
                            .filter_map(|key| key.as_string()),
                    );
                    cursor = next.as_string().unwrap_or_else(|| "0".to_owned());
                    if cursor == "0" || keys.len() >= limit {
                        break;
                    }
                }
                if keys.len() >= limit {
                    break;
                }
            }
            keys.truncate(limit);
            Ok(keys)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if let Some(node) = &self.standalone_node {
                return self
                    .client
                    .ping::<Value>(None)
                    .await
                    .map(drop)
                    .map_err(|err| self.fail(format_args!("ping of {node}"), &err));
            }
            let primaries = self.primary_servers();
            if primaries.is_empty() {
                self.metrics.store_error(Failure::Cluster.as_str());
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("no primary of {} is known", self.target),
                ));
            }
            let pings = primaries.iter().map(|server| async move {
                self.client
                    .with_cluster_node(server.clone())
                    .ping::<Value>(None)
                    .await
                    .map(drop)
                    .map_err(|err| {
                        self.fail(format_args!("ping of {}", server_label(server)), &err)
                    })
            });
            join_all(pings).await.into_iter().collect()
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Read-only access to every node, for `hotsplit audit`
// ---------------------------------------------------------------------------------------------

/// The fields `hotsplit audit` reads of a copy: the version and the tombstone flag, never the
/// value, so an audit stays cheap.
const STAMP_FIELDS: [&str; 2] = ["ver", "tomb"];

/// A primary and its replicas, as [`ReadOnlyNodes`] discovered them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    /// The primary, `host:port`.
    pub(crate) primary: NodeLabel,
    /// Its replicas, `host:port`, sorted.
    pub(crate) replicas: Vec<NodeLabel>,
    /// Cluster mode: the slot ranges it serves, inclusive; empty for a standalone primary.
    slots: Vec<(u16, u16)>,
}

/// One page of a `SCAN` on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanPage {
    /// The cursor of the next page; `None` when the scan of this node is complete.
    pub(crate) next: Option<String>,
    /// The keys of this page (a key may come back more than once in a scan).
    pub(crate) keys: Vec<String>,
}

/// A centralized fred client of one node: a replica the router reads, or any node the audit
/// reads.
struct NodeClient {
    /// A centralized client: every command it sends is served by this node.
    client: Client,
    /// Drives the connection; aborted on drop, which closes the socket without sending QUIT.
    connection_task: ConnectHandle,
    /// A Cluster replica: reads need `READONLY` first to be served for its primary's slots.
    cluster_replica: bool,
}

impl Drop for NodeClient {
    fn drop(&mut self) {
        self.connection_task.abort();
    }
}

/// Read-only connections to every node of a deployment: what `hotsplit audit` reads through.
///
/// It discovers the nodes with `INFO cluster`, then `CLUSTER NODES` (Cluster mode) or
/// `INFO replication` (a standalone primary and its `slaveN` replicas), and opens one
/// centralized fred client per node. Afterwards it sends only `SCAN ... TYPE hash`, `HMGET key ver
/// tomb` and, on Cluster replicas, `READONLY`. fred's own connection handshake adds `PING`,
/// `CLIENT ID`, `INFO server` and `ROLE`. Nothing it sends writes, and it never loads the function
/// library (which [`RedisStore::connect`] does). Connections are closed by dropping their
/// sockets, not with `QUIT`. There is no reconnection: a node that drops fails its own reads.
pub(crate) struct ReadOnlyNodes {
    /// Whether the deployment is a Redis Cluster.
    cluster: bool,
    /// Every primary with its replicas; one entry for a standalone primary.
    shards: Vec<Shard>,
    /// One client per connected node.
    clients: HashMap<NodeLabel, NodeClient>,
    /// Replicas that could not be connected, with why; their reads fail.
    unreachable: Vec<(NodeLabel, Error)>,
    /// The command timeout, for messages.
    command_timeout: Duration,
}

impl fmt::Debug for ReadOnlyNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyNodes")
            .field("cluster", &self.cluster)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl ReadOnlyNodes {
    /// Discovers the nodes of `options.target` from the first seed that answers and connects a
    /// client to each, every node at once, each within `options.connect_timeout`. Every
    /// command is bounded by `options.command_timeout`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when an address is malformed or a `redis://` URL names a replica;
    /// [`ErrorKind::Unavailable`] (or [`ErrorKind::Timeout`]) when no seed answers, discovery
    /// fails, or a primary cannot be connected. A replica that cannot be connected is no error:
    /// it is listed by [`ReadOnlyNodes::unreachable`].
    pub(crate) async fn connect(options: &RedisOptions) -> Result<ReadOnlyNodes> {
        let seeds: Vec<String> = match &options.target {
            RedisTarget::Standalone(address) => vec![address.clone()],
            RedisTarget::Cluster(addresses) => addresses.clone(),
        };
        let mut failures = Vec::new();
        let mut seed = None;
        for address in &seeds {
            let label = NodeLabel::new(address);
            match connect_node(&label, options, false).await {
                Ok(client) => {
                    seed = Some((label, client));
                    break;
                }
                Err(err) => failures.push(err.message().to_owned()),
            }
        }
        let Some((seed_label, seed)) = seed else {
            let why = failures.join("; ");
            return Err(Error::new(
                ErrorKind::Unavailable,
                match &options.target {
                    RedisTarget::Standalone(_) => why,
                    RedisTarget::Cluster(_) => {
                        format!("no seed node of {} answers: {why}", options.target)
                    }
                },
            ));
        };
        let timeout = options.command_timeout;
        let cluster_info = seed
            .client
            .info::<String>(Some(fred::types::InfoKind::Cluster))
            .await
            .map_err(|err| {
                read_only_error(format_args!("INFO cluster on {seed_label}"), &err, timeout)
            })?;
        let cluster = info_number(&cluster_info, "cluster_enabled") == Some(1);
        let shards = if cluster {
            let text = seed.client.cluster_nodes::<String>().await.map_err(|err| {
                read_only_error(format_args!("CLUSTER NODES on {seed_label}"), &err, timeout)
            })?;
            parse_cluster_nodes(&text).map_err(|why| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("CLUSTER NODES on {seed_label}: {why}"),
                )
            })?
        } else {
            let text = seed
                .client
                .info::<String>(Some(fred::types::InfoKind::Replication))
                .await
                .map_err(|err| {
                    read_only_error(
                        format_args!("INFO replication on {seed_label}"),
                        &err,
                        timeout,
                    )
                })?;
            let replicas = parse_info_replicas(&text)
                .map_err(|why| Error::new(ErrorKind::Config, format!("{seed_label}: {why}")))?;
            vec![Shard {
                primary: seed_label.clone(),
                replicas,
                slots: Vec::new(),
            }]
        };
        drop(seed);
        if shards.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("CLUSTER NODES on {seed_label} lists no primary serving slots"),
            ));
        }

        let nodes: Vec<(NodeLabel, bool)> = shards
            .iter()
            .flat_map(|shard| {
                std::iter::once((shard.primary.clone(), false))
                    .chain(shard.replicas.iter().map(|replica| (replica.clone(), true)))
            })
            .collect();
        let connected = join_all(nodes.iter().map(|(label, replica)| async move {
            (
                label.clone(),
                *replica,
                connect_node(label, options, cluster && *replica).await,
            )
        }))
        .await;
        let mut clients = HashMap::new();
        let mut unreachable = Vec::new();
        for (label, replica, result) in connected {
            match result {
                Ok(client) => {
                    clients.insert(label, client);
                }
                Err(err) if replica => unreachable.push((label, err)),
                Err(err) => {
                    return Err(Error::new(
                        err.kind(),
                        format!("cannot connect to primary {label}: {}", err.message()),
                    ))
                }
            }
        }
        Ok(ReadOnlyNodes {
            cluster,
            shards,
            clients,
            unreachable,
            command_timeout: options.command_timeout,
        })
    }

    /// Whether the deployment is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Every primary with its replicas.
    pub(crate) fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Replicas that could not be connected, with why.
    pub(crate) fn unreachable(&self) -> &[(NodeLabel, Error)] {
        &self.unreachable
    }

    /// The index in [`ReadOnlyNodes::shards`] of the shard that owns `key`: the one standalone
    /// primary, or the primary serving the key's slot; `None` when no primary serves it.
    pub(crate) fn shard_of(&self, key: &str) -> Option<usize> {
        if !self.cluster {
            return Some(0);
        }
        let slot = fred::util::redis_keyslot(key.as_bytes());
        self.shards.iter().position(|shard| {
            shard
                .slots
                .iter()
                .any(|&(first, last)| first <= slot && slot <= last)
        })
    }

    /// Sends one `SCAN cursor MATCH pattern COUNT count TYPE hash` to `node` (start with cursor
    /// `"0"`).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] or [`ErrorKind::Unavailable`] when the node fails or is not
    /// connected.
    pub(crate) async fn scan_page(
        &self,
        node: &NodeLabel,
        cursor: &str,
        pattern: &str,
        count: u32,
    ) -> Result<ScanPage> {
        let client = self.client(node)?;
        let reply = client
            .client
            .scan_page::<Value, _, _>(
                cursor.to_owned(),
                pattern.to_owned(),
                Some(count),
                Some(fred::types::scan::ScanType::Hash),
            )
            .await
            .map_err(|err| {
                read_only_error(
                    format_args!("SCAN {pattern} on {node}"),
                    &err,
                    self.command_timeout,
                )
            })?;
        parse_scan_page(reply).map_err(|why| {
            Error::new(
                ErrorKind::Unavailable,
                format!("SCAN {pattern} on {node}: {why}"),
            )
        })
    }

    /// Reads the version and tombstone flag (`HMGET key ver tomb`) of each of `copies` on
    /// `node`, as one pipeline (after `READONLY` on a Cluster replica). Returns one result per
    /// copy, in order: `None` for a copy that does not exist.
    pub(crate) async fn read_stamps(
        &self,
        node: &NodeLabel,
        copies: &[CopyKey],
    ) -> Vec<Result<Option<CopyStamp>>> {
        let client = match self.client(node) {
            Ok(client) => client,
            Err(err) => return copies.iter().map(|_| Err(err.clone())).collect(),
        };
        let pipeline = client.client.pipeline();
        let mut queued = 0usize;
        let mut queue_error = None;
        if client.cluster_replica {
            match pipeline
                .custom::<(), Value>(
                    CustomCommand::new_static("READONLY", ClusterHash::Random, false),
                    Vec::new(),
                )
                .await
            {
                Ok(()) => queued += 1,
                Err(err) => queue_error = Some(err),
            }
        }
        for copy in copies {
            if queue_error.is_some() {
                break;
            }
            match pipeline
                .hmget::<(), _, _>(copy.as_str(), STAMP_FIELDS.to_vec())
                .await
            {
                Ok(()) => queued += 1,
                Err(err) => queue_error = Some(err),
            }
        }
        let fail = |err: &FredError| {
            read_only_error(
                format_args!("read of {} copies on {node}", copies.len()),
                err,
                self.command_timeout,
            )
        };
        if let Some(err) = queue_error {
            let err = fail(&err);
            return copies.iter().map(|_| Err(err.clone())).collect();
        }
        let replies = pipeline.try_all::<Value>().await;
        if replies.len() != queued {
            let err = replies
                .iter()
                .find_map(|reply| reply.as_ref().err())
                .map(fail)
                .unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("{} replies to {queued} commands on {node}", replies.len()),
                    )
                });
            return copies.iter().map(|_| Err(err.clone())).collect();
        }
        let skip = usize::from(client.cluster_replica);
        replies
            .into_iter()
            .skip(skip)
            .zip(copies)
            .map(|(reply, copy)| {
                let reply = reply.map_err(|err| {
                    read_only_error(
                        format_args!("read of copy {copy} on {node}"),
                        &err,
                        self.command_timeout,
                    )
                })?;
                parse_stamp(reply).map_err(|why| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("copy {copy} on {node} is corrupt: {why}"),
                    )
                })
            })
            .collect()
    }

    /// The client of `node`.
    fn client(&self, node: &NodeLabel) -> Result<&NodeClient> {
        self.clients
            .get(node)
            .ok_or_else(|| Error::new(ErrorKind::Unavailable, format!("{node} is not connected")))
    }
}

/// Connects a centralized, read-only client of the node `label` (`host:port`), within the
/// connect timeout, with no reconnection.
async fn connect_node(
    label: &NodeLabel,
    options: &RedisOptions,
    cluster_replica: bool,
) -> Result<NodeClient> {
    let (host, port) = parse_address(label.as_str())
        .map_err(|why| Error::new(ErrorKind::Config, format!("node {label:?}: {why}")))?;
    let builder = client_builder_without_reconnects(
        ServerConfig::new_centralized(host, port),
        options,
        Vec::new(),
    );
    let client = builder.build().map_err(|err| {
        Error::new(
            ErrorKind::Config,
            format!(
                "invalid client configuration for {label}: {}",
                err.details()
            ),
        )
    })?;
    match tokio::time::timeout(options.connect_timeout, client.init()).await {
        Ok(Ok(connection_task)) => Ok(NodeClient {
            client,
            connection_task,
            cluster_replica,
        }),
        Ok(Err(err)) => Err(Error::new(
            ErrorKind::Unavailable,
            format!("could not connect to {label}: {}", err.details()),
        )),
        Err(_) => {
            let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
            Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "could not connect to {label} within {} ms",
                    options.connect_timeout.as_millis()
                ),
            ))
        }
    }
}

/// Maps a fred error of a read-only client to the crate's error (nothing is counted: the audit
/// has no service metrics).
fn read_only_error(what: fmt::Arguments<'_>, err: &FredError, timeout: Duration) -> Error {
    match Failure::of(err) {
        Failure::Timeout => Error::new(
            ErrorKind::Timeout,
            format!("{what} timed out after {} ms", timeout.as_millis()),
        ),
        failure => Error::new(
            ErrorKind::Unavailable,
            format!("{what} failed ({}): {}", failure.as_str(), err.details()),
        ),
    }
}

/// Parses the text of `CLUSTER NODES` into shards: every master that is not flagged `fail`,
/// `handshake` or `noaddr` and serves slots, with its replicas (same exclusions), sorted by
/// first slot. Slots being imported or migrated (`[...]`) are left out.
fn parse_cluster_nodes(text: &str) -> std::result::Result<Vec<Shard>, String> {
    struct Line {
        id: String,
        label: NodeLabel,
        master: bool,
        replica_of: Option<String>,
        slots: Vec<(u16, u16)>,
    }
    let mut lines = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(format!("a line has {} fields: {line:?}", fields.len()));
        }
        let flags: Vec<&str> = fields[2].split(',').collect();
        if flags
            .iter()
            .any(|flag| matches!(*flag, "fail" | "handshake" | "noaddr"))
        {
            continue;
        }
        // ip:port@cport[,hostname]
        let address = fields[1].split('@').next().unwrap_or_default();
        let Some((host, port)) = address.rsplit_once(':') else {
            return Err(format!("address {:?} has no port", fields[1]));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("address {:?} has a bad port", fields[1]))?;
        if host.is_empty() || port == 0 {
            continue;
        }
        let mut slots = Vec::new();
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue;
            }
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let parse = |slot: &str| {
                slot.parse::<u16>()
                    .map_err(|_| format!("slot range {range:?} does not parse"))
            };
            slots.push((parse(first)?, parse(last)?));
        }
        lines.push(Line {
            id: fields[0].to_owned(),
            label: NodeLabel::new(format_address(host.trim_matches(['[', ']']), port)),
            master: flags.contains(&"master"),
            replica_of: (flags.contains(&"slave") && fields[3] != "-")
                .then(|| fields[3].to_owned()),
            slots,
        });
    }
    let mut shards: Vec<(String, Shard)> = lines
        .iter()
        .filter(|line| line.master && !line.slots.is_empty())
        .map(|line| {
            let mut slots = line.slots.clone();
            slots.sort_unstable();
            (
                line.id.clone(),
                Shard {
                    primary: line.label.clone(),
                    replicas: Vec::new(),
                    slots,
                },
            )
        })
        .collect();
    for line in &lines {
        let Some(master) = &line.replica_of else {
            continue;
        };
        if let Some((_, shard)) = shards.iter_mut().find(|(id, _)| id == master) {
            shard.replicas.push(line.label.clone());
        }
    }
    for (_, shard) in &mut shards {
        shard.replicas.sort();
    }
    shards.sort_by_key(|(_, shard)| shard.slots.first().copied());
    Ok(shards.into_iter().map(|(_, shard)| shard).collect())
}

/// Parses `INFO replication` of a standalone server: its replicas (`slaveN:ip=…,port=…`), or
/// an error when the server is itself a replica.
fn parse_info_replicas(text: &str) -> std::result::Result<Vec<NodeLabel>, String> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.trim_end().split_once(':')?;
            (key == name).then_some(value)
        })
    };
    if field("role") == Some("slave") {
        let primary = match (field("master_host"), field("master_port")) {
            (Some(host), Some(port)) => format!(" of {host}:{port}"),
            _ => String::new(),
        };
        return Err(format!(
            "it is a replica{primary}; point the audit at the primary, whose replicas it finds"
        ));
    }
    let mut replicas = Vec::new();
    for line in text.lines().map(str::trim_end) {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let is_slave_line = key
            .strip_prefix("slave")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_slave_line {
            continue;
        }
        let item = |name: &str| {
            value.split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                (key == name).then_some(value)
            })
        };
        let (Some(ip), Some(port)) = (item("ip"), item("port")) else {
            return Err(format!("cannot read the replica in {line:?}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("cannot read the replica port in {line:?}"))?;
        replicas.push(NodeLabel::new(format_address(ip, port)));
    }
    replicas.sort();
    Ok(replicas)
}

/// Parses a `SCAN` reply: `[cursor, [key, ...]]`.
fn parse_scan_page(reply: Value) -> std::result::Result<ScanPage, String> {
    let [cursor, keys] = <[Value; 2]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let cursor = cursor.as_string().ok_or("the cursor is not text")?;
    let keys = keys
        .into_array()
        .into_iter()
        .map(|key| key.as_string().ok_or("a key is not text"))
        .collect::<std::result::Result<Vec<String>, _>>()?;
    Ok(ScanPage {
        next: (cursor != "0").then_some(cursor),
        keys,
    })
}

/// Parses the `HMGET ver tomb` reply of a copy: `None` when the copy does not exist.
fn parse_stamp(reply: Value) -> std::result::Result<Option<CopyStamp>, String> {
    let [ver, tomb] = <[Value; 2]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    if ver.is_null() && tomb.is_null() {
        return Ok(None);
    }
    let ver = ver.as_str().ok_or("field ver is missing or not text")?;
    let version = Version::from_str(&ver).map_err(|err| format!("field ver: {}", err.message()))?;
    let tombstone = match tomb.as_str().as_deref() {
        Some("1") => true,
        Some("0") => false,
        Some(other) => return Err(format!("field tomb {other:?} is neither \"0\" nor \"1\"")),
        None => return Err("field tomb is missing".to_owned()),
    };
    Ok(Some(CopyStamp { version, tombstone }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standalone(address: &str) -> RedisTarget {
        RedisTarget::Standalone(address.to_owned())
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::from(host),
            Value::Integer(port),
            Value::from("0123456789abcdef"),
        ])
    }

    #[test]
    fn reads_each_primarys_replicas_out_of_cluster_slots() {
        let range = |start, end, nodes: Vec<Value>| {
            let mut parts = vec![Value::Integer(start), Value::Integer(end)];
            parts.extend(nodes);
            Value::Array(parts)
        };
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![
                    node("10.0.0.1", 7000),
                    node("10.0.0.5", 7004),
                    node("10.0.0.4", 7003),
                ],
            ),
            // A primary with two ranges lists its replicas once.
            range(
                5461,
                5470,
                vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
            ),
            range(5471, 16383, vec![node("10.0.0.2", 7001)]),
        ]);
        let map = replicas_from_cluster_slots(&reply).unwrap();
        assert_eq!(
            map[&NodeLabel::new("10.0.0.1:7000")],
            vec![
                NodeLabel::new("10.0.0.4:7003"),
                NodeLabel::new("10.0.0.5:7004")
            ]
        );
        assert!(map[&NodeLabel::new("10.0.0.2:7001")].is_empty());
        assert_eq!(map.len(), 2);

        let bad = Value::Array(vec![range(0, 1, vec![Value::from("no-node")])]);
        assert!(replicas_from_cluster_slots(&bad).is_err());
        assert!(replicas_from_cluster_slots(&Value::Null).is_err());
    }

    #[test]
    fn parses_standalone_urls() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:7000").unwrap(),
            standalone("127.0.0.1:7000")
        );
        assert_eq!(
            RedisTarget::parse("redis://cache.internal").unwrap(),
            standalone("cache.internal:6379")
        );
        assert_eq!(
            RedisTarget::parse("redis://localhost:6380/").unwrap(),
            standalone("localhost:6380")
        );
        assert_eq!(
            RedisTarget::parse(" redis://h:1 ").unwrap(),
            standalone("h:1")
        );
        assert_eq!(
            RedisTarget::parse("redis://[::1]").unwrap(),
            standalone("[::1]:6379")
        );
        assert_eq!(
            RedisTarget::parse("redis://[::1]:7001").unwrap(),
            standalone("[::1]:7001")
        );
    }

    #[test]
    fn parses_cluster_urls() {
        assert_eq!(
            RedisTarget::parse("redis-cluster://10.0.0.1:7000,10.0.0.2,node-3:7002").unwrap(),
            RedisTarget::Cluster(vec![
                "10.0.0.1:7000".to_owned(),
                "10.0.0.2:6379".to_owned(),
                "node-3:7002".to_owned(),
            ])
        );
        assert_eq!(
            RedisTarget::parse("redis-cluster://seed").unwrap(),
            RedisTarget::Cluster(vec!["seed:6379".to_owned()])
        );
    }

    #[test]
    fn rejects_bad_urls_with_a_message_naming_the_problem() {
        let cases = [
            ("", "empty"),
            ("http://x:1", "must start with redis://"),
            ("127.0.0.1:6379", "must start with redis://"),
            ("rediss://x:1", "tls"),
            ("redis://user:secret@x:1", "credentials"),
            ("redis://x:1/0", "databases"),
            ("redis://x:1?timeout=1", "queries"),
            ("redis://", "empty"),
            ("redis://:6379", "host is empty"),
            ("redis://x:", "port \"\""),
            ("redis://x:0", "1..=65535"),
            ("redis://x:65536", "1..=65535"),
            ("redis://x:+1", "1..=65535"),
            ("redis://x:1:2", "1..=65535"),
            ("redis://a b:1", "contains ' '"),
            ("redis://::1", "host is empty"),
            ("redis://[::1", "closing ']'"),
            ("redis://[::1]x", "expected ':port'"),
            ("redis://[zz]:1", "ipv6"),
            ("redis://a:1,b:2", "use redis-cluster://"),
            ("redis-cluster://a:1,", "empty"),
            ("redis-cluster://a:1,b:x", "port \"x\""),
        ];
        for (url, expected) in cases {
            let err = RedisTarget::parse(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url:?}");
            assert!(
                err.message().contains(expected),
                "{url:?}: {}",
                err.message()
            );
            let first = err.message().chars().next().unwrap();
            assert!(!first.is_uppercase(), "{url:?}: {}", err.message());
        }
        // The password never shows up in the message.
        let err = RedisTarget::parse("redis://user:hunter2@x:1").unwrap_err();
        assert!(!err.message().contains("hunter2"), "{}", err.message());
    }

    #[test]
    fn targets_render_as_urls() {
        let urls = ["redis://127.0.0.1:7000", "redis-cluster://a:1,b:2"];
        for url in urls {
            assert_eq!(RedisTarget::parse(url).unwrap().to_string(), url);
        }
        assert_eq!(standalone("x:1").kind(), "redis");
        assert_eq!(RedisTarget::Cluster(vec![]).kind(), "redis-cluster");
    }

    #[test]
    fn options_have_documented_defaults() {
        let options = RedisOptions::new(standalone("x:1"));
        assert_eq!(options.command_timeout, Duration::from_millis(500));
        assert_eq!(options.connect_timeout, Duration::from_secs(2));
    }

    #[test]
    fn classifies_fred_errors() {
        let cases = [
            (
                FredErrorKind::Timeout,
                "Request timed out.",
                Failure::Timeout,
            ),
            (FredErrorKind::IO, "Connection reset", Failure::Io),
            (
                FredErrorKind::Cluster,
                "CLUSTERDOWN The cluster is down",
                Failure::Cluster,
            ),
            (
                FredErrorKind::Routing,
                "Failed to route command.",
                Failure::Cluster,
            ),
            (
                FredErrorKind::Unknown,
                "ERR Function not found",
                Failure::FunctionMissing,
            ),
            (
                FredErrorKind::Unknown,
                "READONLY You can't write against a read only replica.",
                Failure::ReadOnly,
            ),
            (
                FredErrorKind::Unknown,
                "NOSCRIPT No matching script.",
                Failure::NoScript,
            ),
            (FredErrorKind::Canceled, "Canceled.", Failure::Canceled),
            (
                FredErrorKind::Backpressure,
                "Max in-flight commands reached.",
                Failure::Backpressure,
            ),
            (
                FredErrorKind::Unknown,
                "ERR hotsplit_cas: version is not canonical",
                Failure::Other,
            ),
            (
                FredErrorKind::InvalidArgument,
                "WRONGTYPE Operation against a key",
                Failure::Other,
            ),
        ];
        for (kind, details, expected) in cases {
            assert_eq!(
                Failure::of(&FredError::new(kind, details)),
                expected,
                "{details}"
            );
        }
    }

    fn text(value: &str) -> Value {
        Value::String(value.into())
    }

    #[test]
    fn parses_cas_replies() {
        let reply = |status: &str, version: &str| Value::Array(vec![text(status), text(version)]);
        assert_eq!(
            parse_cas_reply(reply("applied", "7")),
            Ok(CasOutcome::Applied)
        );
        assert_eq!(
            parse_cas_reply(reply("current", "7")),
            Ok(CasOutcome::Current)
        );
        assert_eq!(
            parse_cas_reply(reply("stale", "18446744073709551615")),
            Ok(CasOutcome::Stale {
                stored: Version::new(u64::MAX).unwrap()
            })
        );
        assert!(parse_cas_reply(reply("maybe", "7")).is_err());
        assert!(parse_cas_reply(reply("stale", "07")).is_err());
        assert!(parse_cas_reply(Value::Array(vec![text("applied")])).is_err());
        assert!(parse_cas_reply(Value::Null).is_err());
    }

    #[test]
    fn parses_copies() {
        let reply = |fields: [Option<&str>; 4]| {
            Value::Array(
                fields
                    .iter()
                    .map(|field| field.map(text).unwrap_or(Value::Null))
                    .collect(),
            )
        };
        assert_eq!(parse_copy(reply([None, None, None, None])), Ok(None));
        assert_eq!(
            parse_copy(reply([
                Some("9007199254740993"),
                Some("hello"),
                Some("0"),
                Some("1700000000000")
            ])),
            Ok(Some(CopyRecord {
                version: Version::new(9_007_199_254_740_993).unwrap(),
                payload: Payload::Value(Bytes::from_static(b"hello")),
                expire_at_ms: 1_700_000_000_000,
            }))
        );
        let binary = Value::Array(vec![
            text("3"),
            Value::Bytes(Bytes::from_static(&[0xff, 0x00])),
            text("0"),
            text("5"),
        ]);
        assert_eq!(
            parse_copy(binary).unwrap().unwrap().payload,
            Payload::Value(Bytes::from_static(&[0xff, 0x00]))
        );
        assert_eq!(
            parse_copy(reply([Some("3"), Some(""), Some("1"), Some("5")]))
                .unwrap()
                .unwrap()
                .payload,
            Payload::Tombstone
        );
        for corrupt in [
            [Some("x"), Some("v"), Some("0"), Some("5")],
            [None, Some("v"), Some("0"), Some("5")],
            [Some("3"), None, Some("0"), Some("5")],
            [Some("3"), Some("v"), Some("2"), Some("5")],
            [Some("3"), Some("v"), Some("0"), Some("-5")],
            [Some("3"), Some("v"), Some("0"), None],
        ] {
            assert!(parse_copy(reply(corrupt)).is_err(), "{corrupt:?}");
        }
        assert!(parse_copy(Value::Array(vec![text("1")])).is_err());
    }

    #[test]
    fn cluster_placement_without_a_slot_map_is_unknown() {
        assert_eq!(Placement::Cluster(None).node_of("k#0").as_str(), "unknown");
        let node = NodeLabel::new("h:1");
        assert_eq!(Placement::Standalone(node.clone()).node_of("k#0"), node);
    }

    #[test]
    fn parses_cluster_nodes_into_shards() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383 [93->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 slave 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 5 connected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30006@31006 slave,fail 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 1426238317741 6 disconnected
aaaafe116063bc5fcf9f4ffd895bc17aee7731ac3 :0@0 slave,noaddr 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 0 6 disconnected
bbbbfe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30007@31007 master - 0 0 7 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5459 5460
";
        let shards = parse_cluster_nodes(text).unwrap();
        let label = NodeLabel::new;
        assert_eq!(
            shards,
            [
                Shard {
                    primary: label("127.0.0.1:30001"),
                    replicas: vec![label("127.0.0.1:30004")],
                    slots: vec![(0, 5459), (5460, 5460)],
                },
                Shard {
                    primary: label("127.0.0.1:30002"),
                    replicas: vec![label("127.0.0.1:30005")],
                    slots: vec![(5461, 10922)],
                },
                Shard {
                    // Its replica failed; the master without slots is left out.
                    primary: label("127.0.0.1:30003"),
                    replicas: vec![],
                    slots: vec![(10923, 16383)],
                },
            ]
        );
        assert!(parse_cluster_nodes("id 127.0.0.1:1@2 master").is_err());
        assert!(parse_cluster_nodes("").unwrap().is_empty());
    }

    #[test]
    fn finds_standalone_replicas_in_info_replication() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=30002,state=online,offset=123,lag=0\r\nslave1:ip=10.0.0.5,port=6380,state=wait_bgsave,offset=0,lag=0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:123\r\n";
        assert_eq!(
            parse_info_replicas(text).unwrap(),
            [
                NodeLabel::new("10.0.0.5:6380"),
                NodeLabel::new("127.0.0.1:30002")
            ]
        );
        assert!(parse_info_replicas("role:master\r\nconnected_slaves:0\r\n")
            .unwrap()
            .is_empty());
        let err = parse_info_replicas("role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:7000\r\n")
            .unwrap_err();
        assert!(err.contains("replica of 10.0.0.1:7000"), "{err}");
        assert!(parse_info_replicas("role:master\r\nslave0:ip=x,state=online\r\n").is_err());
    }

    #[test]
    fn parses_scan_pages_and_stamps() {
        let page = Value::Array(vec![
            text("17"),
            Value::Array(vec![text("a#1"), text("b#0")]),
        ]);
        assert_eq!(
            parse_scan_page(page).unwrap(),
            ScanPage {
                next: Some("17".to_owned()),
                keys: vec!["a#1".to_owned(), "b#0".to_owned()],
            }
        );
        let last = Value::Array(vec![text("0"), Value::Array(vec![])]);
        assert_eq!(parse_scan_page(last).unwrap().next, None);
        assert!(parse_scan_page(Value::Null).is_err());

        let stamp = |ver: Option<&str>, tomb: Option<&str>| {
            parse_stamp(Value::Array(vec![
                ver.map(text).unwrap_or(Value::Null),
                tomb.map(text).unwrap_or(Value::Null),
            ]))
        };
        assert_eq!(stamp(None, None), Ok(None));
        assert_eq!(
            stamp(Some("18446744073709551615"), Some("1")),
            Ok(Some(CopyStamp {
                version: Version::new(u64::MAX).unwrap(),
                tombstone: true,
            }))
        );
        assert_eq!(
            stamp(Some("4"), Some("0")).unwrap().map(|s| s.tombstone),
            Some(false)
        );
        for corrupt in [
            (Some("04"), Some("0")),
            (Some("4"), None),
            (None, Some("0")),
            (Some("4"), Some("2")),
        ] {
            assert!(stamp(corrupt.0, corrupt.1).is_err(), "{corrupt:?}");
        }
    }

    #[test]
    fn the_library_is_named_and_prefixed() {
        assert!(LIBRARY.starts_with("#!lua name=hotsplit\n"));
        for name in [CAS_FUNCTION, ALLOC_FUNCTION] {
            assert!(name.starts_with("hotsplit_"));
            assert!(
                LIBRARY.contains(&format!("redis.register_function('{name}'")),
                "{name}"
            );
        }
    }
}
