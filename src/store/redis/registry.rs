//! The fleet role ([`FleetStore`]) of the Redis store: the instance registry
//! (`store::registry` says what is kept where): `HSET` and `PEXPIRE` of the instance's hash and
//! `ZADD` of its id to the index to register; `ZRANGE` of the index and one `HMGET` per id to
//! list (an id whose hash expired is removed with `ZREM`); `DEL` and `ZREM` to leave. The
//! deployment's session key is `GET`, else `SET NX` and `GET`. An instance's status summary is
//! one `SET PX` per heartbeat, read with one `GET` per id. Every key carries the `{fleet}` hash
//! tag, so in a cluster the registry is one slot on one node, and the least-privilege ACL needs
//! no command it did not already grant.

use fred::interfaces::{HashesInterface, KeysInterface, SortedSetsInterface};
use fred::types::{Expiration, SetOptions, Value};
use futures_util::future::{join_all, BoxFuture};

use super::RedisStore;
use crate::error::{Error, ErrorKind, Result};
use crate::store::registry::{
    instance_key, status_key, INSTANCES_KEY, INSTANCE_FIELDS, SESSION_KEY_KEY,
};
use crate::store::{now_unix_ms, valid_live_instance, FleetStore, InstanceRecord};

impl FleetStore for RedisStore {
    fn register_instance<'a>(
        &'a self,
        record: &'a InstanceRecord,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(self.register(record, ttl_ms))
    }

    fn deregister_instance<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        box_in_place!(self.deregister(id))
    }

    fn instances(&self) -> BoxFuture<'_, Result<Vec<InstanceRecord>>> {
        box_in_place!(self.registered())
    }

    fn session_key<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<String>> {
        box_in_place!(self.shared_session_key(candidate))
    }

    fn publish_status<'a>(
        &'a self,
        id: &'a str,
        summary: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(self.store_status(id, summary, ttl_ms))
    }

    fn instance_statuses<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<String>>>> {
        box_in_place!(self.stored_statuses(ids))
    }
}

impl RedisStore {
    /// Stores `candidate` as the session key unless one is stored, then reads the stored one.
    /// The body of [`FleetStore::session_key`].
    async fn shared_session_key(&self, candidate: &str) -> Result<String> {
        // Read first: a node that refuses writes (NOREPLICAS, a full disk) still serves the key
        // every instance but the first finds there.
        let stored: Option<String> = self
            .client
            .get(SESSION_KEY_KEY)
            .await
            .map_err(|err| self.fail(format_args!("read of {SESSION_KEY_KEY}"), &err))?;
        if let Some(stored) = stored {
            return Ok(stored);
        }
        self.client
            .set::<Value, _, _>(
                SESSION_KEY_KEY,
                candidate,
                None,
                Some(SetOptions::NX),
                false,
            )
            .await
            .map_err(|err| self.fail(format_args!("creation of {SESSION_KEY_KEY}"), &err))?;
        let stored: Option<String> = self
            .client
            .get(SESSION_KEY_KEY)
            .await
            .map_err(|err| self.fail(format_args!("read of {SESSION_KEY_KEY}"), &err))?;
        stored.ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{SESSION_KEY_KEY} vanished right after it was set"),
            )
        })
    }

    /// Writes `record` under its key for `ttl_ms` and adds its id to the index. The body of
    /// [`FleetStore::register_instance`].
    async fn register(&self, record: &InstanceRecord, ttl_ms: u64) -> Result<()> {
        if !valid_live_instance(&record.id) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("invalid instance id {:?}", record.id),
            ));
        }
        let key = instance_key(&record.id);
        let fields: Vec<(&str, String)> =
            INSTANCE_FIELDS.into_iter().zip(record.fields()).collect();
        let ttl = i64::try_from(ttl_ms.max(1)).unwrap_or(i64::MAX);
        let lapse_ms = now_unix_ms().saturating_add(ttl_ms) as f64;
        self.client
            .hset::<Value, _, _>(key.as_str(), fields)
            .await
            .map_err(|err| self.fail(format_args!("registration of {key}"), &err))?;
        self.client
            .pexpire::<Value, _>(key.as_str(), ttl, None)
            .await
            .map_err(|err| self.fail(format_args!("expiry of {key}"), &err))?;
        self.client
            .zadd::<Value, _, _>(
                INSTANCES_KEY,
                None,
                None,
                false,
                false,
                (lapse_ms, record.id.as_str()),
            )
            .await
            .map_err(|err| self.fail(format_args!("index of {key}"), &err))?;
        Ok(())
    }

    /// Deletes instance `id`'s hash and its index entry. The body of
    /// [`FleetStore::deregister_instance`].
    async fn deregister(&self, id: &str) -> Result<()> {
        let key = instance_key(id);
        self.client
            .del::<Value, _>(key.as_str())
            .await
            .map_err(|err| self.fail(format_args!("removal of {key}"), &err))?;
        self.client
            .zrem::<Value, _, _>(INSTANCES_KEY, id)
            .await
            .map_err(|err| self.fail(format_args!("removal of {id} from the index"), &err))?;
        Ok(())
    }

    /// Reads every indexed instance's hash; ids whose hash has expired leave the index. The
    /// body of [`FleetStore::instances`].
    async fn registered(&self) -> Result<Vec<InstanceRecord>> {
        let ids: Vec<String> = self
            .client
            .zrange(INSTANCES_KEY, 0, -1, None, false, None, false)
            .await
            .map_err(|err| self.fail(format_args!("read of {INSTANCES_KEY}"), &err))?;
        let reads = ids.iter().map(|id| async move {
            let key = instance_key(id);
            let values: Vec<Option<String>> = self
                .client
                .hmget(key.as_str(), INSTANCE_FIELDS.to_vec())
                .await
                .map_err(|err| self.fail(format_args!("read of {key}"), &err))?;
            Ok::<_, Error>((id, InstanceRecord::from_fields(&values)))
        });
        let mut records = Vec::with_capacity(ids.len());
        for read in join_all(reads).await {
            match read? {
                (_, Some(record)) => records.push(record),
                (id, None) => {
                    // The hash expired (the instance stopped refreshing it) or is damaged.
                    if let Err(err) = self
                        .client
                        .zrem::<Value, _, _>(INSTANCES_KEY, id.as_str())
                        .await
                    {
                        tracing::debug!(instance = %id, error = %err, "could not drop a lapsed instance from the registry index");
                    }
                }
            }
        }
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    /// Stores instance `id`'s status summary for `ttl_ms`. The body of
    /// [`FleetStore::publish_status`].
    async fn store_status(&self, id: &str, summary: &str, ttl_ms: u64) -> Result<()> {
        if !valid_live_instance(id) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("invalid instance id {id:?}"),
            ));
        }
        let key = status_key(id);
        let ttl = i64::try_from(ttl_ms.max(1)).unwrap_or(i64::MAX);
        self.client
            .set::<Value, _, _>(
                key.as_str(),
                summary,
                Some(Expiration::PX(ttl)),
                None,
                false,
            )
            .await
            .map_err(|err| self.fail(format_args!("write of {key}"), &err))?;
        Ok(())
    }

    /// Reads the status summaries of `ids`, all at once (one `GET` each: the keys share a slot,
    /// but the least-privilege ACL grants `GET`, not `MGET`). The body of
    /// [`FleetStore::instance_statuses`].
    async fn stored_statuses(&self, ids: &[String]) -> Result<Vec<Option<String>>> {
        let reads = ids.iter().map(|id| async move {
            let key = status_key(id);
            self.client
                .get::<Option<String>, _>(key.as_str())
                .await
                .map_err(|err| self.fail(format_args!("read of {key}"), &err))
        });
        join_all(reads).await.into_iter().collect()
    }
}
