//! The layout role ([`LayoutStore`]) of the Redis store: each family's layout record (`GET`,
//! and its compare-and-set `FCALL hotsplit_layout_v2`), who wrote it (`HSET` and `HMGET` of
//! `#hotsplit#layout-writer#<family>`, [`crate::store::layout_writer_key`]), the live sets
//! (`FCALL hotsplit_live_v2`), and the scan of every primary for the copies a shrink left.

use fred::interfaces::{HashesInterface, KeysInterface};
use fred::types::Value;
use futures_util::future::BoxFuture;

use super::replies::{parse_layout_reply, parse_live_reply};
use super::RedisStore;
use crate::error::Result;
use crate::store::{
    layout_key, layout_writer_key, live_key, live_member, Layout, LayoutStore, LayoutSwap,
    LayoutWriter, LiveMember, LAYOUT_WRITER_FIELDS,
};

impl LayoutStore for RedisStore {
    fn read_layout<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Option<Layout>>> {
        box_in_place!(async move {
            let key = layout_key(family);
            let text: Option<String> = self
                .client
                .get(key.as_str())
                .await
                .map_err(|err| self.fail(format_args!("read of layout record {key}"), &err))?;
            match text {
                None => Ok(None),
                Some(text) => Layout::decode(&text).map(Some).ok_or_else(|| {
                    self.corrupt(format!("layout record {key} is corrupt: {text:?}"))
                }),
            }
        })
    }

    fn write_layout<'a>(
        &'a self,
        family: &'a str,
        expected: Option<Layout>,
        layout: Layout,
    ) -> BoxFuture<'a, Result<LayoutSwap>> {
        box_in_place!(self.swap_layout(layout_key(family), expected, layout))
    }

    fn write_layout_writer<'a>(
        &'a self,
        family: &'a str,
        writer: &'a LayoutWriter,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(self.record_layout_writer(family, writer))
    }

    fn read_layout_writer<'a>(
        &'a self,
        family: &'a str,
    ) -> BoxFuture<'a, Result<Option<LayoutWriter>>> {
        box_in_place!(self.layout_writer(family))
    }

    fn join_live<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<LiveMember>>> {
        // A ttl of 0 would remove the member: a join always lasts at least a millisecond.
        box_in_place!(self.refresh_live(
            live_key(family),
            live_member(copies, instance),
            ttl_ms.max(1),
        ))
    }

    fn leave_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        box_in_place!(async move {
            self.refresh_live(live_key(family), live_member(copies, instance), 0)
                .await
                .map(drop)
        })
    }

    fn scan_keys<'a>(
        &'a self,
        pattern: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        box_in_place!(async move {
            let mut keys = Vec::new();
            for node in self.scan_node_labels() {
                let mut cursor = 0;
                loop {
                    let page = self.scan_page_on(&node, cursor, pattern, 1000).await?;
                    keys.extend(page.keys);
                    cursor = page.next;
                    if cursor == 0 || keys.len() >= limit {
                        break;
                    }
                }
                if keys.len() >= limit {
                    break;
                }
            }
            keys.truncate(limit);
            Ok(keys)
        })
    }
}

impl RedisStore {
    /// Writes the layout record `key` when it holds `expected` (`FCALL hotsplit_layout_v2`). The
    /// body of [`LayoutStore::write_layout`].
    async fn swap_layout(
        &self,
        key: String,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<LayoutSwap> {
        let args = vec![
            Value::from(expected.map(Layout::encode).unwrap_or_default()),
            Value::from(layout.encode()),
        ];
        let reply = self
            .fcall_reloading(self.functions.layout, &key, args)
            .await
            .map_err(|err| self.fail(format_args!("write of layout record {key}"), &err))?;
        parse_layout_reply(reply).map_err(|why| self.corrupt(format!("layout record {key}: {why}")))
    }

    /// Refreshes (`ttl_ms > 0`) or removes (`ttl_ms == 0`) `member` of the live set `key`
    /// (`FCALL hotsplit_live_v2`) and returns the other live members' copy counts. The body of
    /// [`LayoutStore::join_layout`] and [`LayoutStore::leave_layout`].
    async fn refresh_live(
        &self,
        key: String,
        member: String,
        ttl_ms: u64,
    ) -> Result<Vec<LiveMember>> {
        let args = vec![Value::from(member), Value::from(ttl_ms.to_string())];
        let reply = self
            .fcall_reloading(self.functions.live, &key, args)
            .await
            .map_err(|err| self.fail(format_args!("refresh of live set {key}"), &err))?;
        parse_live_reply(reply).map_err(|why| self.corrupt(format!("live set {key}: {why}")))
    }

    /// `HSET` of `family`'s layout writer record. The body of
    /// [`LayoutStore::write_layout_writer`].
    async fn record_layout_writer(&self, family: &str, writer: &LayoutWriter) -> Result<()> {
        let key = layout_writer_key(family);
        let fields: Vec<(&str, String)> = LAYOUT_WRITER_FIELDS
            .into_iter()
            .zip(writer.fields())
            .collect();
        self.client
            .hset::<Value, _, _>(key.as_str(), fields)
            .await
            .map_err(|err| self.fail(format_args!("write of {key}"), &err))?;
        Ok(())
    }

    /// `HMGET` of `family`'s layout writer record. The body of
    /// [`LayoutStore::read_layout_writer`].
    async fn layout_writer(&self, family: &str) -> Result<Option<LayoutWriter>> {
        let key = layout_writer_key(family);
        let values: Vec<Option<String>> = self
            .client
            .hmget(key.as_str(), LAYOUT_WRITER_FIELDS.to_vec())
            .await
            .map_err(|err| self.fail(format_args!("read of {key}"), &err))?;
        Ok(LayoutWriter::from_fields(&values))
    }
}
