//! Synced writes (`sync_replicas`): the compare-and-set through a client of their own, then
//! `WAIT` on each node. `WAIT` counts only its own connection's writes, and blocks that
//! connection, so the shared client never carries it.

use std::collections::BTreeMap;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, FredResult, ServerInterface};
use fred::types::Value;
use futures_util::future::join_all;

use super::RedisStore;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{CopyWrite, NodeLabel, WriteResult};

impl RedisStore {
    /// Writes every copy through the synced-write client, one pipeline per owning node, then
    /// `WAIT`s on each node for `replicas` within `timeout_ms`. The body of
    /// [`crate::store::CopyStore::write_copies_synced`].
    pub(super) async fn cas_copies_synced(
        &self,
        writes: &[CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> Vec<(WriteResult, Option<u32>)> {
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
                .cas_then_wait(client, node, &batch, (replicas, timeout_ms))
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
    }

    /// The dedicated client of synced writes, connected on first use.
    async fn sync_client(&self) -> Result<&Client> {
        self.dedicated_client(&self.sync_client, "the synced-write client")
            .await
    }

    /// Writes `batch` (all owned by `node`) through `client`, then `WAIT`s on that node.
    async fn cas_then_wait(
        &self,
        client: &Client,
        node: &NodeLabel,
        batch: &[&CopyWrite],
        (replicas, timeout_ms): (u32, u64),
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
}
