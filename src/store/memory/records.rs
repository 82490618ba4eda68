//! What the embedded store has of the roles beyond the copies: the shared records (layouts,
//! live sets, the registry, the session key) kept in this process, and the shape of a store
//! that is one process, said here rather than in trait defaults: no replicas, no heartbeats, no
//! function library. It has no scrub role ([`crate::store::ScrubStore`]): its copies never
//! fall behind one another (it never fails a copy write), and the server runs the scrub with
//! Redis only.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{glob_matches, MemoryStore};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{
    live_member, now_unix_ms, valid_live_instance, FleetStore, InstanceRecord, Layout, LayoutStore,
    LayoutSwap, LayoutWriter, LibraryStore, LiveMember, NodeLabel, ReplicaSet, TopologyStore,
};

impl LayoutStore for MemoryStore {
    fn read_layout<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Option<Layout>>> {
        let layout = self.state().layouts.get(family).copied();
        Box::pin(std::future::ready(Ok(layout)))
    }

    fn write_layout_writer<'a>(
        &'a self,
        family: &'a str,
        writer: &'a LayoutWriter,
    ) -> BoxFuture<'a, Result<()>> {
        self.state()
            .layout_writers
            .insert(family.to_owned(), writer.clone());
        Box::pin(std::future::ready(Ok(())))
    }

    fn read_layout_writer<'a>(
        &'a self,
        family: &'a str,
    ) -> BoxFuture<'a, Result<Option<LayoutWriter>>> {
        let writer = self.state().layout_writers.get(family).cloned();
        Box::pin(std::future::ready(Ok(writer)))
    }

    fn write_layout<'a>(
        &'a self,
        family: &'a str,
        expected: Option<Layout>,
        layout: Layout,
    ) -> BoxFuture<'a, Result<LayoutSwap>> {
        let mut state = self.state();
        let current = state.layouts.get(family).copied();
        let swap = if current == expected {
            state.layouts.insert(family.to_owned(), layout);
            LayoutSwap::Applied
        } else {
            LayoutSwap::Changed(current)
        };
        Box::pin(std::future::ready(Ok(swap)))
    }

    fn join_live<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<LiveMember>>> {
        if !valid_live_instance(instance) {
            return Box::pin(std::future::ready(Err(Error::new(
                ErrorKind::Config,
                format!("invalid live-set instance name {instance:?}"),
            ))));
        }
        // Like the Lua library: lapsed members go first, then this one is (re)added.
        let now_ms = now_unix_ms();
        let mut state = self.state();
        let live = state.live.entry(family.to_owned()).or_default();
        live.retain(|_, (_, lapse_ms)| *lapse_ms > now_ms);
        let own = live_member(copies, instance);
        live.insert(own.clone(), (copies, now_ms.saturating_add(ttl_ms)));
        let others = live
            .iter()
            .filter(|(name, _)| **name != own)
            .map(|(name, (copies, _))| LiveMember {
                copies: *copies,
                instance: name
                    .split_once(':')
                    .map_or(name.as_str(), |(_, instance)| instance)
                    .to_owned(),
            })
            .collect();
        Box::pin(std::future::ready(Ok(others)))
    }

    fn leave_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        if let Some(live) = self.state().live.get_mut(family) {
            live.remove(&live_member(copies, instance));
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn scan_keys<'a>(
        &'a self,
        pattern: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        let keys = self
            .state()
            .copies
            .keys()
            .filter(|key| glob_matches(pattern.as_bytes(), key.as_bytes()))
            .take(limit)
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(keys)))
    }
}

impl FleetStore for MemoryStore {
    fn register_instance<'a>(
        &'a self,
        record: &'a InstanceRecord,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>> {
        if !valid_live_instance(&record.id) {
            return Box::pin(std::future::ready(Err(Error::new(
                ErrorKind::Config,
                format!("invalid instance id {:?}", record.id),
            ))));
        }
        let lapse_ms = now_unix_ms().saturating_add(ttl_ms);
        self.state()
            .instances
            .insert(record.id.clone(), (record.clone(), lapse_ms));
        Box::pin(std::future::ready(Ok(())))
    }

    fn deregister_instance<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        self.state().instances.remove(id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn instances(&self) -> BoxFuture<'_, Result<Vec<InstanceRecord>>> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        state
            .instances
            .retain(|_, (_, lapse_ms)| *lapse_ms > now_ms);
        let mut records: Vec<InstanceRecord> = state
            .instances
            .values()
            .map(|(record, _)| record.clone())
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Box::pin(std::future::ready(Ok(records)))
    }

    fn session_key<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<String>> {
        let key = self
            .state()
            .session_key
            .get_or_insert_with(|| candidate.to_owned())
            .clone();
        Box::pin(std::future::ready(Ok(key)))
    }

    fn publish_status<'a>(
        &'a self,
        _id: &'a str,
        _summary: &'a str,
        _ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>> {
        // Only this process uses the embedded store: no other instance reads a summary.
        Box::pin(std::future::ready(Ok(())))
    }

    fn instance_statuses<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<String>>>> {
        // None is kept (see `publish_status`).
        Box::pin(std::future::ready(Ok(vec![None; ids.len()])))
    }
}

impl TopologyStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn topology(&self) -> Vec<ReplicaSet> {
        // No replicas: replica-routed reads go to the one copy there is.
        Vec::new()
    }

    fn primaries(&self) -> Vec<NodeLabel> {
        // No node to probe: nothing here fails on its own.
        Vec::new()
    }

    fn refresh_topology(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn write_heartbeat<'a>(
        &'a self,
        _primary: &'a NodeLabel,
        _instance: &'a str,
        _stamp_us: u64,
    ) -> BoxFuture<'a, Result<()>> {
        // Never called (no primaries are known); nothing replicates a heartbeat here.
        Box::pin(std::future::ready(Ok(())))
    }

    fn read_heartbeat<'a>(
        &'a self,
        _replica: &'a NodeLabel,
        _instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn replication_offset<'a>(&'a self, node: &'a NodeLabel) -> BoxFuture<'a, Result<u64>> {
        Box::pin(std::future::ready(Err(Error::new(
            ErrorKind::Unavailable,
            format!("{node} has no replication offset"),
        ))))
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn ping_node<'a>(
        &'a self,
        _node: &'a NodeLabel,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        // Its one node is this process.
        self.ping()
    }
}

impl LibraryStore for MemoryStore {
    fn library_missing(&self) -> Vec<NodeLabel> {
        // The embedded store runs no function library, so none is missing.
        Vec::new()
    }

    fn library_name(&self) -> Option<&'static str> {
        None
    }

    fn function_libraries(&self) -> BoxFuture<'_, Result<Vec<(String, usize)>>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    fn delete_function_library<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<usize>> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

impl crate::store::SplitStore for MemoryStore {
    fn read_splits<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>> {
        let records = self
            .state()
            .splits
            .get(family)
            .map(|records| {
                records
                    .iter()
                    .map(|(key, text)| (key.clone(), text.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Box::pin(std::future::ready(Ok(records)))
    }

    fn swap_split<'a>(
        &'a self,
        family: &'a str,
        key: &'a str,
        expected: Option<&'a str>,
        record: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool>> {
        let mut state = self.state();
        let records = state.splits.entry(family.to_owned()).or_default();
        let applied = records.get(key).map(String::as_str) == expected;
        if applied {
            match record {
                Some(text) => records.insert(key.to_owned(), text.to_owned()),
                None => records.remove(key),
            };
        }
        Box::pin(std::future::ready(Ok(applied)))
    }
}
