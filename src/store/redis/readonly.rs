//! Read-only access to every node, for `hotsplit audit`: [`ReadOnlyNodes`], and [`NodeClient`],
//! the centralized client of one node that replica reads use too.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, ClusterInterface, HashesInterface, KeysInterface};
use fred::types::config::ServerConfig;
use fred::types::{Builder, ClusterHash, ConnectHandle, CustomCommand, Value};
use futures_util::future::join_all;
use hotsplit_redis_info::info_number;

use super::failure::{self, read_only_error, Failure};
use super::replies::{
    parse_cluster_nodes, parse_info_replicas, parse_scan_page, parse_stamp, ScanPage, Shard,
};
use super::target::{parse_address, RedisOptions, RedisTarget};
#[cfg(doc)]
use super::RedisStore;
use super::{client_builder_without_reconnects, QUIT_AFTER_TIMEOUT};
use crate::error::{Error, ErrorKind, Result};
use crate::key::CopyKey;
use crate::metrics::Metrics;
use crate::store::{CopyStamp, NodeLabel};

/// The fields `hotsplit audit` reads of a copy: the version and the tombstone flag, never the
/// value, so an audit stays cheap.
pub(super) const STAMP_FIELDS: [&str; 3] = ["ver", "tomb", "exp"];

/// A centralized fred client of one node: a replica the router reads, or any node the audit
/// reads.
pub(super) struct NodeClient {
    /// A centralized client: every command it sends is served by this node.
    pub(super) client: Client,
    /// Drives the connection; aborted on drop, which closes the socket without sending QUIT.
    pub(super) connection_task: ConnectHandle,
    /// A Cluster replica: reads need `READONLY` first to be served for its primary's slots.
    pub(super) cluster_replica: bool,
}

impl NodeClient {
    /// Builds a centralized client of the node `label` from `builder` and connects it within
    /// `options.connect_timeout`; a client that did not connect in time is asked to quit.
    /// `noun` comes before `label` in messages (`"replica "`, or `""`); `metrics`, when
    /// given, counts a failed connection (the audit has no service metrics).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when fred rejects the configuration; [`ErrorKind::Unavailable`]
    /// when the node cannot be reached within the connect timeout.
    pub(super) async fn connect(
        builder: Builder,
        (noun, label): (&str, &NodeLabel),
        options: &RedisOptions,
        cluster_replica: bool,
        metrics: Option<&Metrics>,
    ) -> Result<NodeClient> {
        let client = builder.build().map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "invalid {noun}client configuration for {label}: {}",
                    failure::details(&err)
                ),
            )
        })?;
        match tokio::time::timeout(options.connect_timeout, client.init()).await {
            Ok(Ok(connection_task)) => Ok(NodeClient {
                client,
                connection_task,
                cluster_replica,
            }),
            Ok(Err(err)) => {
                if let Some(metrics) = metrics {
                    metrics.store_error(Failure::of(&err).as_str());
                }
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "could not connect to {noun}{label}: {}{}",
                        failure::details(&err),
                        Failure::connect_hint(&err)
                    ),
                ))
            }
            Err(_) => {
                if let Some(metrics) = metrics {
                    metrics.store_error(Failure::Timeout.as_str());
                }
                let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "could not connect to {noun}{label} within {} ms",
                        options.connect_timeout.as_millis()
                    ),
                ))
            }
        }
    }
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

/// Connects the first seed of `options.target` that answers.
///
/// # Errors
/// [`ErrorKind::Unavailable`] naming every seed's failure when none answers.
async fn connect_seed(options: &RedisOptions) -> Result<(NodeLabel, NodeClient)> {
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
    let Some(seed) = seed else {
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
    Ok(seed)
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
        let (seed_label, seed) = connect_seed(options).await?;
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

    /// Reads the version and tombstone flag (`HMGET key ver tomb exp`) of each of `copies` on
    /// `node`, as one pipeline (after `READONLY` on a Cluster replica). Returns one result per
    /// copy, in order: `None` for a copy that does not exist or is past its expiry.
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
        let now_ms = crate::store::now_unix_ms();
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
                parse_stamp(reply, now_ms).map_err(|why| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("copy {copy} on {node} is corrupt: {why}"),
                    )
                })
            })
            .collect()
    }

    /// Every (key, record text) of `family`'s split records (`HGETALL` of
    /// [`crate::store::splits_key`] on the primary that owns it).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] or [`ErrorKind::Unavailable`] when that primary fails, is not
    /// connected or no primary serves the hash's slot.
    pub(crate) async fn read_split_records(&self, family: &str) -> Result<Vec<(String, String)>> {
        let key = crate::store::splits_key(family);
        let shard = self.shard_of(&key).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("no primary serves the slot of {key}"),
            )
        })?;
        let node = &self.shards[shard].primary;
        let records: HashMap<String, String> = self
            .client(node)?
            .client
            .hgetall(key.as_str())
            .await
            .map_err(|err| {
                read_only_error(
                    format_args!("HGETALL {key} on {node}"),
                    &err,
                    self.command_timeout,
                )
            })?;
        Ok(records.into_iter().collect())
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
    )?;
    NodeClient::connect(builder, ("", label), options, cluster_replica, None).await
}
