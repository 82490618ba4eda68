//! The topology role ([`TopologyStore`]) of the Redis store: its kind, primaries and replicas
//! (the replica clients and the `CLUSTER SLOTS` map are in `replicas.rs`), the refresh, pings,
//! and heartbeats: `SET hotsplit:hb:{tag}:<instance> <µs> PX 60000` on each primary (the tag
//! is one whose slot that primary owns) and `GET` of that key on each replica, so
//! `INFO commandstats` tells heartbeat reads (`GET`) from data reads (`HMGET`).

use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface, KeysInterface};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};
use futures_util::future::{join_all, BoxFuture};

use super::replicas::server_label;
use super::RedisStore;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{NodeLabel, ReplicaSet, TopologyStore};

/// How long heartbeat keys live after their last write.
const HEARTBEAT_TTL_MS: i64 = 60_000;

/// The heartbeat key of `instance` under hash tag `tag` (empty in standalone mode).
fn heartbeat_key(tag: &str, instance: &str) -> String {
    if tag.is_empty() {
        format!("hotsplit:hb:{instance}")
    } else {
        format!("hotsplit:hb:{{{tag}}}:{instance}")
    }
}

impl TopologyStore for RedisStore {
    fn kind(&self) -> &'static str {
        self.target.kind()
    }

    fn topology(&self) -> Vec<ReplicaSet> {
        self.replica_sets()
    }

    fn primaries(&self) -> Vec<NodeLabel> {
        match &self.standalone_node {
            Some(node) => vec![node.clone()],
            None => self.primary_servers().iter().map(server_label).collect(),
        }
    }

    fn refresh_topology(&self) -> BoxFuture<'_, Result<()>> {
        box_in_place!(async move {
            // The background retry of primaries that lack the library rides on the refresh,
            // which runs every second while one does (see `LagMonitor`).
            self.reload_missing_library().await;
            self.refresh_replicas().await
        })
    }

    fn write_heartbeat<'a>(
        &'a self,
        primary: &'a NodeLabel,
        instance: &'a str,
        stamp_us: u64,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(self.heartbeat_write(primary, instance, stamp_us))
    }

    fn read_heartbeat<'a>(
        &'a self,
        replica: &'a NodeLabel,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        box_in_place!(self.heartbeat_read(replica, instance))
    }

    fn replication_offset<'a>(&'a self, node: &'a NodeLabel) -> BoxFuture<'a, Result<u64>> {
        box_in_place!(self.replication_offset_of(node))
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        box_in_place!(async move {
            if let Some(node) = &self.standalone_node {
                return self
                    .client
                    .ping::<Value>(None)
                    .await
                    .map(drop)
                    .map_err(|err| self.fail(format_args!("ping of {node}"), &err));
            }
            let primaries = self.known_primaries()?;
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

    fn ping_node<'a>(
        &'a self,
        node: &'a NodeLabel,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(async move {
            let ping = async {
                // A replica through its own client; a primary through the lag monitor's client,
                // so a probe of a paused node never stalls the data client.
                let reply = if let Some(replica) = self.replica_client(node) {
                    replica.node.client.ping::<Value>(None).await
                } else {
                    let client = self.monitor_client().await?;
                    if self.standalone_node.is_some() {
                        client.ping::<Value>(None).await
                    } else {
                        let server = self.primary_server(node).ok_or_else(|| {
                            Error::new(
                                ErrorKind::Unavailable,
                                format!("{node} is not a known node"),
                            )
                        })?;
                        client.with_cluster_node(server).ping::<Value>(None).await
                    }
                };
                reply
                    .map(drop)
                    .map_err(|err| self.fail(format_args!("probe of {node}"), &err))
            };
            tokio::time::timeout(timeout, ping)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Timeout,
                        format!("probe of {node} timed out after {} ms", timeout.as_millis()),
                    ))
                })
        })
    }
}

impl RedisStore {
    /// Writes this instance's heartbeat on `primary` through the monitor client. The body of
    /// [`TopologyStore::write_heartbeat`].
    async fn heartbeat_write(
        &self,
        primary: &NodeLabel,
        instance: &str,
        stamp_us: u64,
    ) -> Result<()> {
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
    }

    /// Reads this instance's heartbeat on `replica` through the replica's own client. The body
    /// of [`TopologyStore::read_heartbeat`].
    async fn heartbeat_read(&self, replica: &NodeLabel, instance: &str) -> Result<Option<u64>> {
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
        let text =
            reply.map_err(|err| self.fail(format_args!("heartbeat read on {replica}"), &err))?;
        Ok(text.and_then(|text| text.parse::<u64>().ok()))
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
}
