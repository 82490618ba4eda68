//! The copy role ([`CopyStore`]) of the Redis store: placement, the per-node
//! `FCALL hotsplit_cas_v2` pipelines of [`CopyStore::write_copies`], the reload (on the failing
//! node only, see `library.rs`) and single retry after `ERR Function not found`, reads of a copy
//! (`HMGET` on its owner; on a replica through `replicas.rs`; as stored, for the scrub), deletes,
//! and the version counter (`FCALL hotsplit_alloc_v2`). Synced writes are in `wait.rs`. The
//! function names are the store's library's ([`crate::store::library`]).
//!
//! Versions cross into Lua as canonical decimal strings and are never converted to numbers.

use std::collections::BTreeMap;

use bytes::Bytes;
use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{FredResult, FunctionInterface};
use fred::types::Value;
use futures_util::future::join_all;

use fred::interfaces::{HashesInterface, KeysInterface};
use futures_util::future::BoxFuture;

use super::direct::DirectReply;
use super::failure::Failure;
use super::replies::{parse_cas_reply, parse_copy, parse_served_copy};
use super::{copy_fields, RedisStore};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};
use crate::store::{
    now_unix_ms, retain_until_ms, CasOutcome, CopyRead, CopyRecord, CopyStore, CopyWrite,
    NodeLabel, Payload, ServedBy, WriteResult,
};

/// The largest floor `hotsplit_alloc` accepts: INCR works on signed 64-bit integers.
const MAX_COUNTER_FLOOR: u64 = i64::MAX as u64 - 1;

/// The largest millisecond value (expiry or time to live) the library accepts: 18 digits, so
/// `PEXPIREAT`/`PEXPIRE` can never overflow after the hash was written. Larger values are clamped
/// to it (it is about 31 million years).
const MAX_MILLIS: u64 = 999_999_999_999_999_999;

impl CopyStore for RedisStore {
    fn node_of(&self, copy_key: &CopyKey) -> NodeLabel {
        self.placement().node_of(copy_key.as_str())
    }

    fn counter_node(&self, key: &Key) -> Option<NodeLabel> {
        Some(self.placement().node_of(&key.counter_key()))
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        box_in_place!(self.cas_copies(writes))
    }

    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>> {
        box_in_place!(self.cas_copies_synced(writes, replicas, timeout_ms))
    }

    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead> {
        let node = self.placement().node_of(copy_key.as_str());
        let sent = self
            .direct
            .as_ref()
            .and_then(|direct| direct.send(&node, copy_key.as_str()));
        match sent {
            Some(reply) => box_in_place!(self.read_copy_direct(node, copy_key, reply)),
            None => box_in_place!(self.read_copy_through_client(node, copy_key)),
        }
    }

    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead> {
        box_in_place!(self.read_copy_on_replica(copy_key, replica))
    }

    fn read_copy_stored<'a>(
        &'a self,
        copy_key: &'a CopyKey,
    ) -> BoxFuture<'a, Result<Option<CopyRecord>>> {
        box_in_place!(self.read_stored(copy_key))
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        box_in_place!(async move {
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

    fn allocate_version<'a>(
        &'a self,
        key: &'a Key,
        ttl_ms: u64,
        floor: u64,
    ) -> BoxFuture<'a, Result<Version>> {
        box_in_place!(self.next_version(key, ttl_ms, floor))
    }
}

impl RedisStore {
    /// A primary read of `copy_key` sent on the direct connection to `node`
    /// ([`super::direct`]): its reply, or its failure; a read the node refused goes again
    /// through fred, which follows a redirection or classifies the error.
    async fn read_copy_direct(
        &self,
        node: NodeLabel,
        copy_key: &CopyKey,
        reply: tokio::sync::oneshot::Receiver<DirectReply>,
    ) -> CopyRead {
        let record = match reply.await {
            Ok(DirectReply::Fields(fields)) => self.served_copy(fields, copy_key, &node),
            Ok(DirectReply::Refused(why)) => {
                if let Some(direct) = &self.direct {
                    direct.count_refused();
                }
                tracing::trace!(copy = %copy_key, node = %node, refusal = %why, "direct read refused; sent through the client");
                return Box::pin(self.read_copy_through_client(node, copy_key)).await;
            }
            Ok(DirectReply::Failed(failure, why)) => Err(self.fail_as(
                format_args!("read of copy {copy_key} on {node}"),
                failure,
                &why,
            )),
            Err(_) => Err(self.fail_as(
                format_args!("read of copy {copy_key} on {node}"),
                Failure::Canceled,
                "the direct connection was dropped",
            )),
        };
        CopyRead {
            served_by: ServedBy::primary(node),
            record,
        }
    }

    /// A primary read of `copy_key` on `node` through fred.
    async fn read_copy_through_client(&self, node: NodeLabel, copy_key: &CopyKey) -> CopyRead {
        let record = match self
            .client
            .hmget::<Value, _, _>(copy_key.as_str(), copy_fields())
            .await
        {
            Ok(reply) => self.served_copy(reply, copy_key, &node),
            Err(err) => Err(self.fail(format_args!("read of copy {copy_key} on {node}"), &err)),
        };
        CopyRead {
            served_by: ServedBy::primary(node),
            record,
        }
    }

    /// The record a primary's `HMGET` reply holds, if it is still served.
    fn served_copy(
        &self,
        reply: Value,
        copy_key: &CopyKey,
        node: &NodeLabel,
    ) -> Result<Option<CopyRecord>> {
        parse_served_copy(reply, now_unix_ms())
            .map_err(|why| self.corrupt(format!("copy {copy_key} on {node} is corrupt: {why}")))
    }

    /// Writes every copy with `FCALL hotsplit_cas_v2`, one pipeline per owning node, all nodes
    /// at once; after `ERR Function not found`, reloads the library on those nodes and retries
    /// those writes once. The body of [`CopyStore::write_copies`].
    pub(super) async fn cas_copies(&self, writes: &[CopyWrite]) -> Vec<WriteResult> {
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
            // One reload per node that lacks the library, then each of those writes is retried
            // once; the other primaries are left alone.
            let mut lacking: Vec<NodeLabel> = missing.iter().map(|&at| nodes[at].clone()).collect();
            lacking.sort();
            lacking.dedup();
            self.reload_after_missing_function(missing.len(), &lacking)
                .await;
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
    }

    /// The next version of `key` from its counter, `max(counter, floor) + 1`
    /// (`FCALL hotsplit_alloc_v2`, reloading the library once if it is missing). The body of
    /// [`CopyStore::allocate_version`].
    pub(super) async fn next_version(&self, key: &Key, ttl_ms: u64, floor: u64) -> Result<Version> {
        let counter = key.counter_key();
        let node = self.placement().node_of(&counter);
        if floor > MAX_COUNTER_FLOOR {
            return Err(Error::new(
                ErrorKind::InvalidVersion,
                format!("the version counter of {key} is exhausted"),
            ));
        }
        let args = vec![
            Value::from(ttl_ms.min(MAX_MILLIS).to_string()),
            Value::from(floor.to_string()),
        ];
        let reply = self
            .fcall_reloading(self.functions.alloc, &counter, args)
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
    }

    /// Sends `FCALL hotsplit_cas_v2` for the writes at `indexes`: one pipeline per owning node
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
    pub(super) async fn cas_pipeline_on(
        &self,
        client: &Client,
        batch: &[&CopyWrite],
    ) -> Vec<FredResult<Value>> {
        let pipeline = client.pipeline();
        let mut queue_errors: Vec<Option<FredError>> = Vec::with_capacity(batch.len());
        let now_ms = now_unix_ms();
        for write in batch {
            // Queueing only buffers the command in memory; it answers at once.
            let args = cas_args(write, self.version_retention_ms, now_ms);
            let queued = pipeline
                .fcall::<(), _, _, _>(self.functions.cas, write.copy_key.as_str(), args)
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

    /// `HMGET copy ver val tomb exp` on the copy's owner, without hiding a copy past `exp`.
    async fn read_stored(&self, copy_key: &CopyKey) -> Result<Option<CopyRecord>> {
        let node = self.placement().node_of(copy_key.as_str());
        let reply = self
            .client
            .hmget::<Value, _, _>(copy_key.as_str(), copy_fields())
            .await
            .map_err(|err| self.fail(format_args!("read of copy {copy_key} on {node}"), &err))?;
        parse_copy(reply)
            .map_err(|why| self.corrupt(format!("copy {copy_key} on {node} is corrupt: {why}")))
    }

    /// Sends one `FCALL`; on `ERR Function not found` reloads the library and retries once.
    pub(super) async fn fcall_reloading(
        &self,
        function: &str,
        key: &str,
        args: Vec<Value>,
    ) -> FredResult<Value> {
        let first = self.client.fcall(function, key, args.clone()).await;
        match first {
            Err(err) if Failure::of(&err) == Failure::FunctionMissing => {
                let node = self.placement().node_of(key);
                self.reload_after_missing_function(1, &[node]).await;
                self.client.fcall(function, key, args).await
            }
            other => other,
        }
    }

    /// Counts `failed` commands answered with `ERR Function not found` and reloads the library
    /// on `nodes`, where they failed (each at most once per `library::RELOAD_INTERVAL`). A
    /// failure to reload is only logged: the retried commands report it.
    async fn reload_after_missing_function(&self, failed: usize, nodes: &[NodeLabel]) {
        for _ in 0..failed {
            self.metrics.store_error(Failure::FunctionMissing.as_str());
        }
        self.reload_library_on(nodes).await;
    }

    /// Turns one `hotsplit_cas` reply into an outcome.
    pub(super) fn cas_outcome(
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
                "unexpected reply to {} for copy {copy} on {node}: {why}",
                self.functions.cas
            ))
        })
    }
}

/// The `FCALL hotsplit_cas_v2` arguments of a write: version, payload, tomb, expire_at_ms,
/// retain_until_ms (`retention_ms` after the expiry) and now_ms (this instance's clock, the one
/// that computed the expiry).
fn cas_args(write: &CopyWrite, retention_ms: u64, now_ms: u64) -> Vec<Value> {
    let (payload, tomb) = match &write.payload {
        Payload::Value(bytes) => (bytes.clone(), "0"),
        Payload::Tombstone => (Bytes::new(), "1"),
    };
    vec![
        write.version.to_string().into(),
        payload.into(),
        tomb.into(),
        write.expire_at_ms.min(MAX_MILLIS).to_string().into(),
        retain_until_ms(write.expire_at_ms, retention_ms)
            .min(MAX_MILLIS)
            .to_string()
            .into(),
        now_ms.min(MAX_MILLIS).to_string().into(),
    ]
}
