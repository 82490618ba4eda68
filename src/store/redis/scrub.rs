//! The scrub role ([`ScrubStore`]) of the Redis store: a paged `SCAN` of one primary (also
//! the walk of [`crate::store::LayoutStore::scan_keys`]), and the lease
//! (`FCALL hotsplit_lease_v2`) that lets one instance at a time scrub. The read of a copy as
//! stored is the copy role's (`copies.rs`).

use fred::interfaces::KeysInterface;
use fred::types::Value;
use futures_util::future::BoxFuture;

use super::replies::{parse_lease_reply, parse_scan_page};
use super::{server_label, RedisStore};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{lease_key, valid_live_instance, KeyPage, Lease, NodeLabel, ScrubStore};

impl ScrubStore for RedisStore {
    fn scan_nodes(&self) -> Vec<NodeLabel> {
        self.scan_node_labels()
    }

    fn scan_page<'a>(
        &'a self,
        node: &'a NodeLabel,
        cursor: u64,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<KeyPage>> {
        box_in_place!(self.scan_page_on(node, cursor, pattern, count))
    }

    fn hold_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Lease>> {
        box_in_place!(self.lease(name, holder, ttl_ms))
    }
}

impl RedisStore {
    /// The primaries a walk over every key visits: the standalone node, or every primary of
    /// fred's cached slot map.
    pub(super) fn scan_node_labels(&self) -> Vec<NodeLabel> {
        match &self.standalone_node {
            Some(node) => vec![node.clone()],
            None => self.primary_servers().iter().map(server_label).collect(),
        }
    }

    /// `SCAN cursor MATCH pattern COUNT count TYPE hash` on `node` (copies are hashes, so
    /// counters and layout records never come back).
    pub(super) async fn scan_page_on(
        &self,
        node: &NodeLabel,
        cursor: u64,
        pattern: &str,
        count: u32,
    ) -> Result<KeyPage> {
        let hash = Some(fred::types::scan::ScanType::Hash);
        let reply = if self.standalone_node.as_ref() == Some(node) {
            self.client
                .scan_page::<Value, _, _>(cursor.to_string(), pattern, Some(count), hash)
                .await
        } else {
            let server = self.primary_server(node).ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("{node} is not a known primary"),
                )
            })?;
            self.client
                .with_cluster_node(server)
                .scan_page::<Value, _, _>(cursor.to_string(), pattern, Some(count), hash)
                .await
        }
        .map_err(|err| self.fail(format_args!("scan for {pattern} on {node}"), &err))?;
        let page = parse_scan_page(reply)
            .map_err(|why| self.corrupt(format!("scan for {pattern} on {node}: {why}")))?;
        let next = match page.next {
            None => 0,
            Some(next) => next.parse().map_err(|_| {
                self.corrupt(format!("scan of {node}: cursor {next:?} is not a number"))
            })?,
        };
        Ok(KeyPage {
            next,
            keys: page.keys,
        })
    }

    /// `FCALL` of the library's lease function (`hotsplit_lease_v2`) on the lease `name`.
    async fn lease(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<Lease> {
        if !valid_live_instance(holder) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("lease holder {holder:?} is not 1..=64 letters, digits, -, _ or ."),
            ));
        }
        let Some(function) = self.functions.lease else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("function library {} has no lease", self.functions.name),
            ));
        };
        let key = lease_key(name);
        let args = vec![Value::from(holder), Value::from(ttl_ms.to_string())];
        let reply = self
            .fcall_reloading(function, &key, args)
            .await
            .map_err(|err| self.fail(format_args!("lease {key}"), &err))?;
        parse_lease_reply(reply).map_err(|why| self.corrupt(format!("lease {key}: {why}")))
    }
}
