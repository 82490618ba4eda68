//! The library role ([`LibraryStore`]) of the Redis store: the function library on each
//! primary, loaded with `FUNCTION LOAD REPLACE` where it is
//! missing, one primary at a time, at most once per [`RELOAD_INTERVAL`] per primary.
//!
//! The library and its functions carry their version in their names (`store::library`), so the
//! `REPLACE` only ever replaces this version's library, whose source one version names exactly;
//! the library of another release, and the functions it registers, are left alone.
//!
//! The store starts with the primaries that accept the library and records the others in
//! [`LibraryState`]; their writes fail (`ERR Function not found`, so the publisher queues the
//! copies) until a later attempt loads it there. Attempts come from three places: the topology
//! refresh (in the background, every second while a primary lacks the library), a write that
//! met `ERR Function not found` on a node (that node only, never every primary), and
//! `/readyz`, which also lists the primaries still without it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike, FunctionInterface};
use fred::types::config::Options;
use fred::types::Value;
use futures_util::future::{join_all, BoxFuture};

use super::failure::Failure;
use super::replicas::server_label;
use super::replies::parse_library_names;
use super::RedisStore;
use crate::error::{Error, Result};
use crate::store::library::LibraryVersion;
use crate::store::{LibraryStore, NodeLabel};

/// The shortest time between two attempts to load the library on one primary: a primary that
/// refuses it (`NOREPLICAS`, a paused node) is not asked again by every write that meets it.
pub(super) const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The primaries known to lack the library, with the time of the last attempt on each.
#[derive(Debug, Default)]
pub(super) struct LibraryState {
    /// Primary → when the library was last sent to it (`None`: never by this instance).
    /// Never locked across an await.
    missing: std::sync::Mutex<BTreeMap<NodeLabel, Option<Instant>>>,
}

impl LibraryState {
    /// The primaries known to lack the library, in label order.
    pub(super) fn missing(&self) -> Vec<NodeLabel> {
        self.lock().keys().cloned().collect()
    }

    /// Records that `node` lacks the library (a write met `ERR Function not found` there).
    fn mark_missing(&self, node: &NodeLabel) {
        self.lock().entry(node.clone()).or_insert(None);
    }

    /// Of `nodes`, those due for an attempt (none within [`RELOAD_INTERVAL`]); each one
    /// returned is stamped now, so concurrent callers do not send the same load twice.
    fn take_due(&self, nodes: &[NodeLabel], now: Instant) -> Vec<NodeLabel> {
        let mut missing = self.lock();
        nodes
            .iter()
            .filter(|node| match missing.get_mut(*node) {
                None => false,
                Some(last) => {
                    let due = last.is_none_or(|at| now.duration_since(at) >= RELOAD_INTERVAL);
                    if due {
                        *last = Some(now);
                    }
                    due
                }
            })
            .cloned()
            .collect()
    }

    /// Records the outcome of one attempt on `node`.
    fn record(&self, node: &NodeLabel, loaded: bool, now: Instant) {
        let mut missing = self.lock();
        if loaded {
            missing.remove(node);
        } else {
            missing.insert(node.clone(), Some(now));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeLabel, Option<Instant>>> {
        // A panic while the lock was held cannot leave the map inconsistent: every update is
        // a single insert or remove.
        self.missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LibraryStore for RedisStore {
    fn library_missing(&self) -> Vec<NodeLabel> {
        self.library.missing()
    }

    fn library_name(&self) -> Option<&'static str> {
        Some(self.functions.name)
    }

    fn function_libraries(&self) -> BoxFuture<'_, Result<Vec<(String, usize)>>> {
        box_in_place!(self.list_libraries())
    }

    fn delete_function_library<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<usize>> {
        box_in_place!(self.delete_library(name))
    }
}

impl RedisStore {
    /// Loads the library on every primary this instance knows, concurrently, and records the
    /// primaries that refused or did not answer as missing it. Returns how many accepted it.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unavailable`] when no primary is known, or when a primary refused
    /// the load for lack of permission (`NOPERM`: the ACL user needs `FUNCTION LOAD`, which
    /// no retry fixes).
    pub(super) async fn load_library_everywhere(&self) -> Result<usize> {
        let primaries = match &self.standalone_node {
            Some(node) => vec![node.clone()],
            None => self
                .known_primaries()?
                .iter()
                .map(server_label)
                .collect::<Vec<_>>(),
        };
        let now = Instant::now();
        for node in &primaries {
            self.library.mark_missing(node);
        }
        let due = self.library.take_due(&primaries, now);
        let failures = self.load_library_on(&due).await;
        let mut failed = 0;
        for failure in failures.into_iter().flatten() {
            if failure.0 == Failure::NoPermission {
                return Err(failure.1);
            }
            failed += 1;
        }
        Ok(primaries.len() - failed)
    }

    /// Loads the library on the primaries known to lack it whose last attempt is older than
    /// [`RELOAD_INTERVAL`]; the background retry, called by the topology refresh.
    pub(super) async fn reload_missing_library(&self) {
        let missing = self.library.missing();
        if missing.is_empty() {
            return;
        }
        let due = self.library.take_due(&missing, Instant::now());
        self.load_library_on(&due).await;
    }

    /// Marks `nodes` (writes there met `ERR Function not found`) as missing the library and
    /// loads it on each that is due; the other primaries are left alone.
    pub(super) async fn reload_library_on(&self, nodes: &[NodeLabel]) {
        for node in nodes {
            self.library.mark_missing(node);
        }
        let due = self.library.take_due(nodes, Instant::now());
        self.load_library_on(&due).await;
    }

    /// Sends `FUNCTION LOAD REPLACE` to each of `nodes`, one command per node, concurrently,
    /// and records each outcome; returns, per node, how it failed (`None`: loaded).
    ///
    /// Each primary is addressed directly rather than through fred's `function_load_cluster`:
    /// fred sends such all-node commands only after draining every connection, which would wait
    /// on a paused node without a bound.
    async fn load_library_on(&self, nodes: &[NodeLabel]) -> Vec<Option<(Failure, Error)>> {
        let servers = match &self.standalone_node {
            Some(_) => Vec::new(),
            None => self.primary_servers(),
        };
        let loads = nodes.iter().map(|node| {
            let server = servers
                .iter()
                .find(|server| server_label(server) == *node)
                .cloned();
            async move {
                let reply = match (&self.standalone_node, server) {
                    (Some(_), _) => {
                        self.client
                            .function_load::<Value, _>(true, self.functions.source)
                            .await
                    }
                    (None, Some(server)) => {
                        self.client
                            .with_cluster_node(server)
                            .function_load::<Value, _>(true, self.functions.source)
                            .await
                    }
                    // No longer a primary (a failover): its successor has the library through
                    // replication, or meets `ERR Function not found` and is marked then.
                    (None, None) => {
                        self.library.record(node, true, Instant::now());
                        return None;
                    }
                };
                let failed = match reply {
                    Ok(_) => {
                        tracing::info!(node = %node, library = self.functions.name, "loaded the hotsplit function library");
                        None
                    }
                    Err(err) => {
                        let failure = Failure::of(&err);
                        let err = self
                            .fail(format_args!("loading the function library on {node}"), &err);
                        tracing::warn!(node = %node, library = self.functions.name, error = %err, "could not load the hotsplit function library; its copies queue until a retry loads it");
                        Some((failure, err))
                    }
                };
                self.library.record(node, failed.is_none(), Instant::now());
                failed
            }
        });
        join_all(loads).await
    }
}

impl RedisStore {
    /// Every primary, each with the client that addresses it.
    fn primary_clients(&self) -> Result<Vec<(NodeLabel, WithOptions<Client>)>> {
        match &self.standalone_node {
            Some(node) => Ok(vec![(
                node.clone(),
                self.client.with_options(&Options::default()),
            )]),
            None => Ok(self
                .known_primaries()?
                .into_iter()
                .map(|server| {
                    let label = server_label(&server);
                    let client = self.client.with_cluster_node(server);
                    (label, client)
                })
                .collect()),
        }
    }

    /// `FUNCTION LIST LIBRARYNAME hotsplit*` on every primary at once: each hotsplit library
    /// (`LibraryVersion::of` knows its name) with how many primaries hold it, by name. The body
    /// of [`LibraryStore::function_libraries`].
    async fn list_libraries(&self) -> Result<Vec<(String, usize)>> {
        let lists = self
            .primary_clients()?
            .into_iter()
            .map(|(node, client)| async move {
                let reply = client
                    .function_list::<Value, _>(Some(LIBRARY_PATTERN), false)
                    .await
                    .map_err(|err| {
                        self.fail(
                            format_args!("listing the function libraries on {node}"),
                            &err,
                        )
                    })?;
                parse_library_names(reply)
                    .map_err(|why| self.corrupt(format!("the function list of {node}: {why}")))
            });
        let mut held: BTreeMap<String, usize> = BTreeMap::new();
        for names in join_all(lists).await {
            for name in names? {
                if LibraryVersion::of(&name).is_some() {
                    *held.entry(name).or_default() += 1;
                }
            }
        }
        Ok(held.into_iter().collect())
    }

    /// `FUNCTION DELETE name` on every primary at once; a primary that does not hold it
    /// (`ERR Library not found`) is skipped. Returns on how many it was deleted. The body of
    /// [`LibraryStore::delete_function_library`].
    async fn delete_library(&self, name: &str) -> Result<usize> {
        let deletes = self
            .primary_clients()?
            .into_iter()
            .map(|(node, client)| async move {
                match client.function_delete::<Value, _>(name).await {
                    Ok(_) => Ok(true),
                    Err(err) if Failure::of(&err) == Failure::LibraryMissing => Ok(false),
                    Err(err) => Err(self.fail(
                        format_args!("deleting the function library {name} on {node}"),
                        &err,
                    )),
                }
            });
        let mut deleted = 0;
        let mut failed = None;
        for outcome in join_all(deletes).await {
            match outcome {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(err) => failed = Some(err),
            }
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(deleted),
        }
    }
}

/// The `FUNCTION LIST LIBRARYNAME` pattern that finds every hotsplit library (and possibly
/// another application's that starts alike, which `LibraryVersion::of` then leaves out).
const LIBRARY_PATTERN: &str = "hotsplit*";

#[cfg(test)]
mod tests {
    use super::*;

    fn label(text: &str) -> NodeLabel {
        NodeLabel::new(text)
    }

    #[test]
    fn a_missing_primary_is_due_once_per_interval() {
        let state = LibraryState::default();
        let a = label("127.0.0.1:1");
        let b = label("127.0.0.1:2");
        let start = Instant::now();
        // Unknown nodes are never due: only primaries known to lack the library are loaded.
        assert!(state.take_due(std::slice::from_ref(&a), start).is_empty());
        state.mark_missing(&a);
        state.mark_missing(&b);
        assert_eq!(
            state.take_due(std::slice::from_ref(&a), start),
            vec![a.clone()]
        );
        assert!(
            state.take_due(std::slice::from_ref(&a), start).is_empty(),
            "stamped"
        );
        state.record(&a, false, start);
        let later = start + RELOAD_INTERVAL;
        assert_eq!(
            state.take_due(&[a.clone(), b.clone()], later),
            vec![a.clone(), b.clone()]
        );
        state.record(&a, true, later);
        assert_eq!(state.missing(), vec![b]);
    }
}
