//! The split role ([`SplitStore`]) of the Redis store: each family's split records, one hash
//! (`#hotsplit#splits#<family>`, [`crate::store::splits_key`]) read with `HGETALL` and moved
//! field by field with a compare-and-set script (`split.lua`, sent with `EVAL`: it is not part of
//! the function library, so no library version changes for it).

use fred::interfaces::{HashesInterface, LuaInterface};
use futures_util::future::BoxFuture;

use super::RedisStore;
use crate::error::Result;
use crate::store::{splits_key, SplitStore};

/// The compare-and-set of one split record.
const SWAP_SPLIT: &str = include_str!("split.lua");

impl SplitStore for RedisStore {
    fn read_splits<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>> {
        box_in_place!(async move {
            let key = splits_key(family);
            let records: std::collections::HashMap<String, String> = self
                .client
                .hgetall(key.as_str())
                .await
                .map_err(|err| self.fail(format_args!("read of split records {key}"), &err))?;
            Ok(records.into_iter().collect())
        })
    }

    fn swap_split<'a>(
        &'a self,
        family: &'a str,
        key: &'a str,
        expected: Option<&'a str>,
        record: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool>> {
        box_in_place!(async move {
            let hash = splits_key(family);
            let args = vec![
                key.to_owned(),
                expected.unwrap_or_default().to_owned(),
                record.unwrap_or_default().to_owned(),
            ];
            let applied: i64 = self
                .client
                .eval(SWAP_SPLIT, hash.as_str(), args)
                .await
                .map_err(|err| self.fail(format_args!("write of split record {hash}"), &err))?;
            Ok(applied == 1)
        })
    }
}
