//! Replicas and placement: one client per replica ([`ReplicaClient`]), the replica map read with
//! `CLUSTER SLOTS`, where a key lives ([`Placement`]), replica reads and replication offsets.

use std::sync::Arc;

use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, HashesInterface};
use fred::types::cluster::ClusterRouting;
use fred::types::config::{ReconnectError, Server, ServerConfig};
use fred::types::Value;
use hotsplit_redis_info::info_number;

use super::failure::Failure;
use super::readonly::NodeClient;
use super::replies::{parse_served_copy, replicas_from_cluster_slots};
use super::target::{format_address, parse_address, RedisOptions};
use super::{client_builder, copy_fields, RedisStore};
use crate::error::{Error, ErrorKind, Result};
use crate::key::CopyKey;
use crate::metrics::Metrics;
use crate::store::{now_unix_ms, CopyRead, NodeLabel, ReplicaSet, ServedBy};

/// Where keys live, captured once per operation.
pub(super) enum Placement {
    /// Every key lives on the one server.
    Standalone(NodeLabel),
    /// Keys live where fred's slot map last said ([`SlotOwners`]); `None` before the first
    /// discovery.
    Cluster(Option<Arc<SlotOwners>>),
}

impl Placement {
    /// The primary that owns `key`, or `unknown` when the slot map does not say.
    pub(super) fn node_of(&self, key: &str) -> NodeLabel {
        match self {
            Placement::Standalone(node) => node.clone(),
            Placement::Cluster(owners) => owners
                .as_ref()
                .and_then(|owners| owners.owner(fred::util::redis_keyslot(key.as_bytes())))
                .cloned()
                .unwrap_or_else(|| NodeLabel::new("unknown")),
        }
    }
}

/// fred's slot map as the store reads it on every command: each slot range with its primary's
/// label, sorted. fred's own map can only be had as a clone (`cached_cluster_state`: a vector
/// and a vector of replicas per range, each read), so it is copied into this once each time
/// fred re-reads it ([`follow_slot_map`]), and finding a key's owner allocates nothing.
#[derive(Debug)]
pub(super) struct SlotOwners {
    /// First slot, last slot, primary; sorted by first slot.
    ranges: Vec<(u16, u16, NodeLabel)>,
}

impl SlotOwners {
    fn of(routing: &ClusterRouting) -> SlotOwners {
        let mut ranges: Vec<(u16, u16, NodeLabel)> = routing
            .slots()
            .iter()
            .map(|range| (range.start, range.end, server_label(&range.primary)))
            .collect();
        ranges.sort_by_key(|(start, _, _)| *start);
        SlotOwners { ranges }
    }

    /// The primary that serves `slot`.
    fn owner(&self, slot: u16) -> Option<&NodeLabel> {
        let after = self.ranges.partition_point(|(start, _, _)| *start <= slot);
        let (_, end, node) = self.ranges.get(after.checked_sub(1)?)?;
        (slot <= *end).then_some(node)
    }
}

/// How often [`follow_slot_map`] copies fred's map even without a change notice: a bound on
/// how long a missed notice could leave the copy behind.
const SLOT_MAP_RECOPY: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps `owners` a copy of `client`'s slot map: copied now, again whenever fred re-reads it
/// (its cluster change notice follows every re-read: a `MOVED`, a reconnect, a sync), and
/// once a second in any case. The task runs until aborted (the store's `Drop`).
pub(super) fn follow_slot_map(
    client: &Client,
    owners: Arc<arc_swap::ArcSwapOption<SlotOwners>>,
) -> tokio::task::JoinHandle<()> {
    use tokio::sync::broadcast::error::RecvError;
    // Subscribed before the first copy, so a re-read after it is never missed.
    let mut changes = client.cluster_change_rx();
    copy_slot_map(client, &owners);
    let client = client.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                change = changes.recv() => {
                    if let Err(RecvError::Closed) = change {
                        // fred replaces its notice channels when the client quits.
                        changes = client.cluster_change_rx();
                    }
                }
                () = tokio::time::sleep(SLOT_MAP_RECOPY) => {}
            }
            copy_slot_map(&client, &owners);
        }
    })
}

/// Stores a copy of `client`'s slot map in `owners` (none before the first discovery).
fn copy_slot_map(client: &Client, owners: &arc_swap::ArcSwapOption<SlotOwners>) {
    owners.store(
        client
            .cached_cluster_state()
            .map(|routing| Arc::new(SlotOwners::of(&routing))),
    );
}

/// A fred server as a node label, `host:port`.
pub(super) fn server_label(server: &Server) -> NodeLabel {
    NodeLabel::new(format_address(&server.host, server.port))
}

/// A client of one replica.
///
/// Each replica has a client of its own, in Cluster mode too: fred's centralized `replicas()`
/// reads the primary, and fred's cluster replica routing (its `replicas` feature, not built
/// here) hides which node served and can fall back to the primary on its own. A client per
/// replica confines a dead replica to that replica, and lets the router name the exact replica
/// that serves.
pub(super) struct ReplicaClient {
    /// The replica, `host:port`.
    pub(super) label: NodeLabel,
    /// Its own connection: reads sent here are served by that replica, never the primary. A
    /// Cluster replica answers reads of its primary's slots only after `READONLY`, which a
    /// reconnect forgets, so `READONLY` is sent again with every heartbeat read.
    pub(super) node: NodeClient,
}

impl RedisStore {
    /// Every primary with its replicas: the configured ones of a standalone primary, or the
    /// cluster's from fred's slot map and this store's replica map. The body of
    /// [`crate::store::TopologyStore::topology`].
    pub(super) fn replica_sets(&self) -> Vec<ReplicaSet> {
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

    /// Reads the replica map (Cluster mode) and connects or drops replica clients to match.
    /// The body of [`crate::store::TopologyStore::refresh_topology`].
    pub(super) async fn refresh_replicas(&self) -> Result<()> {
        if self.standalone_node.is_some() {
            self.sync_replica_clients().await;
            return Ok(());
        }
        let read = self.read_replica_map().await;
        self.sync_replica_clients().await;
        read
    }

    /// Reads a copy on the named replica through its own client: a failure is an error, never
    /// a primary read. The body of [`crate::store::CopyStore::read_replica_copy`].
    pub(super) async fn read_copy_on_replica(
        &self,
        copy_key: &CopyKey,
        replica: &NodeLabel,
    ) -> CopyRead {
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
            Ok(reply) => parse_served_copy(reply, now_unix_ms()).map_err(|why| {
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
    }

    /// The replication offset of `node` from `INFO replication`: `master_repl_offset` on a
    /// primary, `slave_repl_offset` on a replica. The body of [`crate::store::TopologyStore::replication_offset`].
    pub(super) async fn replication_offset_of(&self, node: &NodeLabel) -> Result<u64> {
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
    }

    /// The configured standalone replica called `label`.
    pub(super) fn replica_client(&self, label: &NodeLabel) -> Option<Arc<ReplicaClient>> {
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
            .replica_sets()
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
    pub(super) fn primary_server(&self, label: &NodeLabel) -> Option<Server> {
        self.primary_servers()
            .into_iter()
            .find(|server| server_label(server) == *label)
    }

    /// The cluster primary a replica called `label` replicates.
    pub(super) fn primary_of_replica(&self, label: &NodeLabel) -> Option<Server> {
        let primary = self
            .replica_sets()
            .into_iter()
            .find(|set| set.replicas.contains(label))?
            .primary;
        self.primary_server(&primary)
    }

    /// The replicas of `primary` in the slot map this store read itself (`CLUSTER SLOTS`, see
    /// [`crate::store::TopologyStore::refresh_topology`]); none before the first read.
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

    /// The primaries of the cluster from fred's cached slot map (empty in standalone mode).
    pub(super) fn primary_servers(&self) -> Vec<Server> {
        self.client
            .cached_cluster_state()
            .map(|routing| routing.unique_primary_nodes())
            .unwrap_or_default()
    }

    /// The primaries of the cluster from fred's cached slot map; an error (counted as
    /// `cluster`) when none is known.
    pub(super) fn known_primaries(&self) -> Result<Vec<Server>> {
        let primaries = self.primary_servers();
        if primaries.is_empty() {
            self.metrics.store_error(Failure::Cluster.as_str());
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("no primary of {} is known", self.target),
            ));
        }
        Ok(primaries)
    }

    /// A snapshot of where keys live.
    pub(super) fn placement(&self) -> Placement {
        match &self.standalone_node {
            Some(node) => Placement::Standalone(node.clone()),
            None => Placement::Cluster(self.slot_owners.load_full()),
        }
    }
}

/// Connects a client of one standalone replica at `address`.
pub(super) async fn connect_replica(
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
    )?;
    let node = NodeClient::connect(
        builder,
        ("replica ", &label),
        options,
        cluster,
        Some(metrics),
    )
    .await?;
    Ok(ReplicaClient { label, node })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_placement_without_a_slot_map_is_unknown() {
        assert_eq!(Placement::Cluster(None).node_of("k#0").as_str(), "unknown");
        let node = NodeLabel::new("h:1");
        assert_eq!(Placement::Standalone(node.clone()).node_of("k#0"), node);
    }

    #[test]
    fn a_slot_is_owned_by_the_range_that_holds_it_and_a_gap_by_none() {
        let [a, b, c] = ["a:1", "b:2", "c:3"].map(NodeLabel::new);
        // Slot 10923 is in no range (being migrated, or not yet assigned).
        let owners = SlotOwners {
            ranges: vec![
                (0, 5_460, a.clone()),
                (5_461, 10_922, b.clone()),
                (10_924, 16_383, c.clone()),
            ],
        };
        for (slot, owner) in [
            (0, Some(&a)),
            (5_460, Some(&a)),
            (5_461, Some(&b)),
            (10_922, Some(&b)),
            (10_923, None),
            (10_924, Some(&c)),
            (16_383, Some(&c)),
        ] {
            assert_eq!(owners.owner(slot), owner, "slot {slot}");
        }
        assert_eq!(SlotOwners { ranges: Vec::new() }.owner(0), None);
    }
}
