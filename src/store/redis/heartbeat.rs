//! Heartbeats: `SET hotsplit:hb:{tag}:<instance> <µs> PX 60000` on each primary (the tag is one
//! whose slot that primary owns) and `GET` of that key on each replica, so `INFO commandstats`
//! tells heartbeat reads (`GET`) from data reads (`HMGET`).

use fred::interfaces::{ClientLike, ClusterInterface, KeysInterface};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::replicas::server_label;
use super::RedisStore;
use crate::error::{Error, ErrorKind, Result};
use crate::store::NodeLabel;
#[cfg(doc)]
use crate::store::Store;

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

impl RedisStore {
    /// Writes this instance's heartbeat on `primary` through the monitor client. The body of
    /// [`Store::write_heartbeat`].
    pub(super) async fn heartbeat_write(
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
    /// of [`Store::read_heartbeat`].
    pub(super) async fn heartbeat_read(
        &self,
        replica: &NodeLabel,
        instance: &str,
    ) -> Result<Option<u64>> {
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
