//! The store by role: one small trait per job the rest of the crate asks of the store, as
//! fred's `commands/interfaces` gives each command family its own trait over one client.
//!
//! | Role | What it holds | Who uses it |
//! |---|---|---|
//! | [`CopyStore`] | the copies `K#i`, their version counters | publish, read, retry queue, repair, scrub |
//! | [`LayoutStore`] | family layout records, their writers, the live sets | `layout` |
//! | [`SplitStore`] | each family's split keys and their phases | `split` |
//! | [`FleetStore`] | the instance registry, the session key, status summaries | `fleet`, `status`, the server |
//! | [`ScrubStore`] | the walk over every stored key, the scrub lease | `heal::scrub` |
//! | [`TopologyStore`] | primaries and replicas, heartbeats, offsets, pings | `route`, `/readyz`, `heal::health` |
//! | [`LibraryStore`] | the function library on each primary | `fleet::retire`, `/readyz`, the lag monitor |
//!
//! [`super::redis::RedisStore`] implements every role, one file of `store/redis/` each;
//! [`super::memory::MemoryStore`] implements every role but the scrub's, saying in its own
//! impls what a store inside one process has of each (no replicas, no heartbeats, no library);
//! the server runs the scrub with Redis only.
//! `heal::HealthStore` wraps the copy role only. The server builds the store once and hands
//! each part the roles it uses.
//!
//! Methods return boxed futures so a part can hold an `Arc<dyn Role>` and the store is picked
//! at startup.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{
    CopyRead, CopyRecord, CopyWrite, InstanceRecord, KeyPage, Layout, LayoutSwap, LayoutWriter,
    Lease, NodeLabel, ReplicaSet, WriteResult,
};
use crate::error::Result;
use crate::key::{CopyKey, Key, Version};

/// The copies: where each lives, the versioned compare-and-set, reads from a primary or a
/// replica, deletes, and the per-key version counters. What a publish and a read need.
pub trait CopyStore: Send + Sync + 'static {
    /// The node that owns `copy_key` as far as this instance knows.
    fn node_of(&self, copy_key: &CopyKey) -> NodeLabel;

    /// The node that holds `key`'s version counter, when the store has nodes.
    fn counter_node(&self, key: &Key) -> Option<NodeLabel>;

    /// Applies each write with the versioned compare-and-set, concurrently, and returns one
    /// result per write in the same order. A failure of one write never fails the others.
    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>>;

    /// Applies each write like [`CopyStore::write_copies`], on a connection dedicated to synced
    /// writes, then issues `WAIT replicas timeout_ms` on each written node through that same
    /// connection (WAIT counts only that connection's writes and blocks it). Returns, per write,
    /// its result and the acknowledged replica count (`None` when the write or the wait
    /// failed, or the store has no replicas).
    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>>;

    /// Reads one copy from the node that owns it.
    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead>;

    /// Reads one copy from `replica`, a replica of the copy's owner.
    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead>;

    /// Reads one copy from the node that owns it as stored, a record past its `exp` included
    /// (which [`CopyStore::read_copy`] reads as missing): the scrub tells a copy that expired
    /// on its own jitter from one that missed an edit.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`], [`crate::ErrorKind::Timeout`] or
    /// [`crate::ErrorKind::NodeFailing`] when the read fails.
    fn read_copy_stored<'a>(
        &'a self,
        copy_key: &'a CopyKey,
    ) -> BoxFuture<'a, Result<Option<CopyRecord>>>;

    /// Deletes copies (removed by shrinking a family), each on its own node, concurrently.
    /// Returns how many existed.
    ///
    /// # Errors
    /// The first failure; the other deletes still run.
    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>>;

    /// Allocates the next version of `key` from its per-key counter: `max(counter, floor) + 1`.
    /// The counter lives at least `ttl_ms` after this call, and its time to live only grows.
    /// `floor` is 0, or the highest version the copies reported after a refused publish, so a
    /// counter that lost increments or expired early continues above every version in use.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails;
    /// [`crate::ErrorKind::InvalidVersion`] when the counter is exhausted (2^63 - 1).
    fn allocate_version<'a>(
        &'a self,
        key: &'a Key,
        ttl_ms: u64,
        floor: u64,
    ) -> BoxFuture<'a, Result<Version>>;
}

/// The family layouts shared by every instance: each family's layout record and who wrote it,
/// the live set of the instances running it, and the scan that finds the copies a shrink left.
/// What `layout` needs.
pub trait LayoutStore: Send + Sync + 'static {
    /// Reads the layout recorded for the family named `family` (its prefix, or `default`).
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails.
    fn read_layout<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Option<Layout>>>;

    /// Records `layout` for the family named `family` when the record holds `expected` (`None`:
    /// no record): a compare-and-set, so a concurrent change is never overwritten blindly.
    ///
    /// # Errors
    /// As [`LayoutStore::read_layout`].
    fn write_layout<'a>(
        &'a self,
        family: &'a str,
        expected: Option<Layout>,
        layout: Layout,
    ) -> BoxFuture<'a, Result<LayoutSwap>>;

    /// Records which instance and release wrote `family`'s layout record
    /// ([`super::layout_writer_key`]). Called after each write of the record.
    ///
    /// # Errors
    /// As [`LayoutStore::read_layout`].
    fn write_layout_writer<'a>(
        &'a self,
        family: &'a str,
        writer: &'a LayoutWriter,
    ) -> BoxFuture<'a, Result<()>>;

    /// Reads who wrote `family`'s layout record; `None` when nobody recorded it (a release
    /// before writer records wrote the layout).
    ///
    /// # Errors
    /// As [`LayoutStore::read_layout`].
    fn read_layout_writer<'a>(
        &'a self,
        family: &'a str,
    ) -> BoxFuture<'a, Result<Option<LayoutWriter>>>;

    /// Marks this instance live in the family named `family` with `copies` copies until
    /// `ttl_ms` from the store's clock (a join or a refresh), drops the members whose time ran
    /// out, and returns the copy counts of the other live instances. `instance` names this
    /// process (letters, digits, `-`, `_`, `.`), so instances with the same copy count stay
    /// apart and one leaving never hides another.
    ///
    /// # Errors
    /// As [`LayoutStore::read_layout`]; [`crate::ErrorKind::Config`] for an invalid `instance`.
    fn join_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        box_in_place!(async move {
            let others = self.join_live(family, copies, instance, ttl_ms).await?;
            Ok(others.into_iter().map(|member| member.copies).collect())
        })
    }

    /// [`LayoutStore::join_layout`], returning the other live members whole: each one's copy
    /// count (or code) and instance name. The gates that ask whether every live instance of a
    /// family is in another set (the split set, the placement set) match these names: counts
    /// would let a member that left one set stand in for an instance missing from the other.
    ///
    /// # Errors
    /// As [`LayoutStore::join_layout`].
    fn join_live<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<super::LiveMember>>>;

    /// Removes this instance's live entry from the family named `family` (at shutdown).
    ///
    /// # Errors
    /// As [`LayoutStore::join_layout`].
    fn leave_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<()>>;

    /// Lists up to `limit` stored keys matching the glob `pattern` on every primary (SCAN),
    /// for the sweep of copies removed by a shrink.
    ///
    /// # Errors
    /// As [`LayoutStore::read_layout`].
    fn scan_keys<'a>(
        &'a self,
        pattern: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>>>;
}

/// Each family's split keys: one hash per family, field = key, value = the record's text
/// (`crate::split::SplitRecord`). What `split` needs.
pub trait SplitStore: Send + Sync + 'static {
    /// Every (key, record text) of `family`'s split keys.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails.
    fn read_splits<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>>;

    /// Sets `key`'s record in `family` to `record` (`None`: removes it) when it holds
    /// `expected` (`None`: no record): a compare-and-set. Returns whether it applied.
    ///
    /// # Errors
    /// As [`SplitStore::read_splits`].
    fn swap_split<'a>(
        &'a self,
        family: &'a str,
        key: &'a str,
        expected: Option<&'a str>,
        record: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool>>;
}

/// The fleet's shared records: the instance registry (`store::registry`), the deployment's
/// session key, and each instance's status summary. What `fleet::registry`, `status` and the
/// server's startup need.
pub trait FleetStore: Send + Sync + 'static {
    /// Registers `record` in the instance registry, or refreshes it, for `ttl_ms` from now
    /// (`store::registry`): the entry lapses unless it is refreshed within that time.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails;
    /// [`crate::ErrorKind::Config`] for an invalid instance id (see
    /// [`super::valid_live_instance`]).
    fn register_instance<'a>(
        &'a self,
        record: &'a InstanceRecord,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>>;

    /// Removes instance `id` from the registry (at shutdown).
    ///
    /// # Errors
    /// As [`FleetStore::register_instance`].
    fn deregister_instance<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>>;

    /// Every registered instance whose entry has not lapsed, ordered by id. Entries found
    /// lapsed are dropped from the registry's index on the way.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails.
    fn instances(&self) -> BoxFuture<'_, Result<Vec<InstanceRecord>>>;

    /// The deployment's session key (`fleet::session`): the stored one, or `candidate` (32
    /// hex digits) once stored because none was. Every instance of a deployment gets the same
    /// key, whichever started first.
    ///
    /// # Errors
    /// As [`FleetStore::instances`].
    fn session_key<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<String>>;

    /// Stores instance `id`'s status summary (`crate::status::InstanceStatus` as JSON) for
    /// `ttl_ms` from now, where the other instances' `GET /v1/fleet` reads it
    /// (`registry::status_key`).
    ///
    /// # Errors
    /// As [`FleetStore::register_instance`].
    fn publish_status<'a>(
        &'a self,
        id: &'a str,
        summary: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>>;

    /// The status summaries stored for `ids`, in order: `None` where none is (it lapsed, or the
    /// instance runs a release that publishes none).
    ///
    /// # Errors
    /// As [`FleetStore::instances`].
    fn instance_statuses<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<String>>>>;
}

/// The anti-entropy scrub's access: a paged walk over every primary's keys, and the lease that
/// lets one instance at a time scrub. What `heal::scrub` needs besides the copies.
pub trait ScrubStore: Send + Sync + 'static {
    /// The nodes a walk over every stored key visits: each primary.
    fn scan_nodes(&self) -> Vec<NodeLabel>;

    /// One page of `SCAN cursor MATCH pattern COUNT count` on `node` (one of
    /// [`ScrubStore::scan_nodes`]); cursor 0 starts a walk.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the store fails,
    /// or for an unknown node.
    fn scan_page<'a>(
        &'a self,
        node: &'a NodeLabel,
        cursor: u64,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<KeyPage>>;

    /// Takes or renews the lease `name` for `holder` (letters, digits, `-`, `_`, `.`; at most
    /// 64) until `ttl_ms` from now when it is free or already `holder`'s; a `ttl_ms` of 0
    /// releases it when `holder` has it. Used so one instance at a time runs a fleet-wide job
    /// (the scrub).
    ///
    /// # Errors
    /// As [`ScrubStore::scan_page`]; [`crate::ErrorKind::Config`] for an invalid `holder`.
    fn hold_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Lease>>;
}

/// The store's shape and liveness: what kind it is, its primaries and their replicas, the
/// heartbeats and replication offsets replica lag is measured by, and pings. What the lag
/// monitor, the warm-up, `/readyz` and the health prober need.
pub trait TopologyStore: Send + Sync + 'static {
    /// A short description for logs and `/readyz`: `embedded`, `redis` or `redis-cluster`.
    fn kind(&self) -> &'static str;

    /// Every primary with the replicas known for it: discovered in Cluster mode, configured
    /// for a standalone primary.
    fn topology(&self) -> Vec<ReplicaSet>;

    /// Every primary this instance knows: the masters of a cluster, or the one standalone
    /// server, with or without replicas (the health prober pings each).
    fn primaries(&self) -> Vec<NodeLabel>;

    /// Refreshes the topology from the servers (Cluster mode: `CLUSTER SLOTS` and fred's
    /// replica routing), for a cluster whose replicas joined after this instance connected.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] when the refresh fails.
    fn refresh_topology(&self) -> BoxFuture<'_, Result<()>>;

    /// Writes this instance's heartbeat `stamp_us` on `primary`, under a key whose slot that
    /// primary owns.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the write fails.
    fn write_heartbeat<'a>(
        &'a self,
        primary: &'a NodeLabel,
        instance: &'a str,
        stamp_us: u64,
    ) -> BoxFuture<'a, Result<()>>;

    /// Reads this instance's heartbeat on `replica`: `None` when it holds none yet.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when the read fails.
    fn read_heartbeat<'a>(
        &'a self,
        replica: &'a NodeLabel,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>>>;

    /// The replication offset of `node`: `master_repl_offset` on a primary, `slave_repl_offset`
    /// read on a replica itself.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] when the node is unknown or does not answer.
    fn replication_offset<'a>(&'a self, node: &'a NodeLabel) -> BoxFuture<'a, Result<u64>>;

    /// Checks that the store answers (every primary).
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when it does not.
    fn ping(&self) -> BoxFuture<'_, Result<()>>;

    /// Sends one `PING` to `node` (a primary or a replica), bounded by `timeout`: the probe
    /// that tells when a failing node is back.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] or [`crate::ErrorKind::Timeout`] when it does not
    /// answer in time.
    fn ping_node<'a>(&'a self, node: &'a NodeLabel, timeout: Duration)
        -> BoxFuture<'a, Result<()>>;
}

/// The store's function library (`store::library`): which primaries lack it, its name, and
/// the libraries of every release loaded on the primaries. What `/readyz`, the lag monitor's
/// refresh, the registry entry and `fleet::retire` need.
pub trait LibraryStore: Send + Sync + 'static {
    /// The primaries known to lack the store's function library (they refused it or did not
    /// answer; their writes fail until a background retry loads it), for `/readyz`.
    fn library_missing(&self) -> Vec<NodeLabel>;

    /// The name of the function library this instance loads into the store, for the instance
    /// registry; `None` when the store has none.
    fn library_name(&self) -> Option<&'static str>;

    /// The hotsplit function libraries loaded on the store's primaries (`hotsplit`,
    /// `hotsplit_v<N>`: every release's, this one's included), by name, each with how many
    /// primaries hold it.
    ///
    /// # Errors
    /// A store error when a primary cannot be asked: a partial list could hide a library.
    fn function_libraries(&self) -> BoxFuture<'_, Result<Vec<(String, usize)>>>;

    /// Deletes the function library `name` (`FUNCTION DELETE`) from every primary that holds
    /// it, and returns on how many it was deleted.
    ///
    /// # Errors
    /// A store error when a primary refuses or does not answer (the others are still asked).
    fn delete_function_library<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<usize>>;
}

/// The invalidation feed's connections (`crate::feed`): one per primary, on which the store
/// tells of every key a write changed there, whoever wrote it.
pub trait FeedStore: Send + Sync + 'static {
    /// Opens the feed of `primary`: a connection on which it pushes the name of every key a
    /// write changed (Redis's `CLIENT TRACKING ON BCAST`), until the connection closes.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] when the primary cannot be reached or refuses
    /// tracking (an ACL user without `client|tracking`, say).
    fn open_feed<'a>(&'a self, primary: &'a NodeLabel) -> BoxFuture<'a, Result<FeedConnection>>;
}

/// What a feed connection tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedEvent {
    /// These keys (stored names) changed.
    Keys(Vec<String>),
    /// Every key may have changed (Redis's null invalidation after a flush, or pushes the
    /// feed could not keep up with).
    Flush,
    /// The connection closed: nothing more comes.
    Closed,
}

/// One open feed connection: its events, and what closes it when dropped.
pub struct FeedConnection {
    /// The events, in the order the primary sent them.
    pub events: tokio::sync::mpsc::Receiver<FeedEvent>,
    /// Closes the connection when dropped.
    pub guard: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for FeedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedConnection").finish_non_exhaustive()
    }
}
