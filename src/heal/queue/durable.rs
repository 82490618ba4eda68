//! Keeping the spool in step with the queue: replay at startup, completion records, the reset of
//! a drained spool, and compaction to the live entries.

use std::collections::HashMap;

use bytes::Bytes;

use super::super::spool::{self, Record, Replay};
use super::table::{covers, Entry, State};
use super::RetryQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Placement, Version};
use crate::metrics::RetryDrop;
use crate::store::{now_unix_ms, NodeLabel, Payload};

/// The placement a spool record's placement code names.
fn placement_of_code(code: u8) -> Result<Placement> {
    match code {
        spool::PLACED_SUFFIX => Ok(Placement::Suffix),
        spool::PLACED_SPREAD => Ok(Placement::Spread),
        other => Err(Error::new(
            ErrorKind::Io,
            format!("spool record has an unknown placement code {other}"),
        )),
    }
}

/// The placement code a spool record keeps for `copy_key`'s naming.
pub(super) fn code_of(copy_key: &CopyKey) -> u8 {
    match copy_key.placement() {
        Placement::Suffix => spool::PLACED_SUFFIX,
        Placement::Spread => spool::PLACED_SPREAD,
    }
}

/// One enqueue record as replayed: every copy with its placement code.
struct Replayed {
    /// The hot key.
    key: String,
    /// The version queued.
    version: u64,
    /// Whether the edit is a deletion.
    tombstone: bool,
    /// The value (empty for a tombstone).
    value: Vec<u8>,
    /// Each copy: index, expiry (Unix ms) and placement code.
    copies: Vec<(u32, u64, u8)>,
}

impl RetryQueue {
    /// Admits the copies of one replayed enqueue record, each under the name its placement
    /// gives it.
    fn replay_enqueue(
        &self,
        state: &mut State,
        record: Replayed,
        node_of: &impl Fn(&CopyKey) -> NodeLabel,
        now_ms: u64,
    ) -> Result<()> {
        let Replayed {
            key,
            version,
            tombstone,
            value,
            copies,
        } = record;
        let key = Key::parse(&key).map_err(|err| {
            Error::new(ErrorKind::Io, format!("spool record has a bad key: {err}"))
        })?;
        let version = Version::new(version).map_err(|err| {
            Error::new(
                ErrorKind::Io,
                format!("spool record has a bad version: {err}"),
            )
        })?;
        let payload = if tombstone {
            Payload::Tombstone
        } else {
            Payload::Value(Bytes::from(value))
        };
        for (index, expire_at_ms, code) in copies {
            let copy_key = key.copy_key(index, placement_of_code(code)?);
            let node = node_of(&copy_key);
            // Replay ignores the bounds: these entries were accepted before.
            self.core.admit(
                state,
                Entry {
                    copy_key,
                    version,
                    payload: payload.clone(),
                    expire_at_ms,
                    node,
                    attempts: 0,
                    last_error: None,
                    queued_at_ms: now_ms,
                },
                false,
            );
        }
        Ok(())
    }

    pub(super) fn replay(
        &self,
        replay: Replay,
        node_of: impl Fn(&CopyKey) -> NodeLabel,
    ) -> Result<()> {
        let now_ms = now_unix_ms();
        let records = replay.records.len();
        let mut state = self.core.state();
        for record in replay.records {
            match record {
                Record::Enqueue {
                    key,
                    version,
                    tombstone,
                    value,
                    copies,
                } => {
                    // Formats 0 and 1 knew one naming: `K#i`.
                    let copies = copies
                        .into_iter()
                        .map(|(index, expire_at_ms)| (index, expire_at_ms, spool::PLACED_SUFFIX))
                        .collect();
                    let record = Replayed {
                        key,
                        version,
                        tombstone,
                        value,
                        copies,
                    };
                    self.replay_enqueue(&mut state, record, &node_of, now_ms)?;
                }
                Record::EnqueuePlaced {
                    key,
                    version,
                    tombstone,
                    value,
                    copies,
                } => {
                    let record = Replayed {
                        key,
                        version,
                        tombstone,
                        value,
                        copies,
                    };
                    self.replay_enqueue(&mut state, record, &node_of, now_ms)?;
                }
                Record::Complete {
                    copy_key,
                    version,
                    tombstone,
                } => {
                    if let Ok(version) = Version::new(version) {
                        self.core.remove_if(&mut state, &copy_key, |entry| {
                            covers(version, tombstone, entry.version, entry.is_tombstone())
                        });
                    }
                }
            }
        }
        let expired: Vec<String> = state
            .entries
            .values()
            .filter(|entry| entry.expire_at_ms <= now_ms)
            .map(|entry| entry.copy_key.as_str().to_owned())
            .collect();
        for copy_key in &expired {
            self.core.remove_if(&mut state, copy_key, |_| true);
            self.core.metrics.retry_drop(RetryDrop::Expired);
        }
        self.core
            .metrics
            .spool_damage(replay.damage.regions, replay.damage.skipped_bytes);
        tracing::info!(
            records,
            entries = state.entries.len(),
            expired = expired.len(),
            format = replay.format,
            damaged_regions = replay.damage.regions,
            skipped_bytes = replay.damage.skipped_bytes,
            torn_bytes = replay.torn_bytes,
            kept_aside = replay
                .kept_aside
                .as_ref()
                .map(|path| path.display().to_string()),
            "replayed the retry spool"
        );
        self.compact_locked(&state);
        self.core.publish_gauges(&state);
        Ok(())
    }

    pub(super) fn spool_complete(&self, copy_key: &str, version: Version, tombstone: bool) {
        if let Some(spool) = &self.spool {
            match spool::encode(&Record::Complete {
                copy_key: copy_key.to_owned(),
                version: version.get(),
                tombstone,
            }) {
                Ok(body) => spool.append(body),
                Err(err) => tracing::warn!(error = %err, "cannot record a completion"),
            }
        }
    }

    /// Truncates the spool to its header when the queue holds nothing (no entry, no unsynced
    /// record): sent under the lock, so every later record follows the reset. Resetting in
    /// place needs no free space, so a full disk does not keep a drained spool full.
    pub(super) fn reset_if_drained(&self, state: &State) {
        if let Some(spool) = &self.spool {
            if state.entries.is_empty()
                && state.unsynced.is_empty()
                && spool.size_bytes() > spool::HEADER_LEN
            {
                spool.reset();
            }
        }
    }

    /// Rewrites the spool with only the live entries when it has grown well past them.
    pub(crate) fn maybe_compact(&self) {
        let Some(spool) = &self.spool else {
            return;
        };
        let size = spool.size_bytes();
        let state = self.core.state();
        if size > 4 * 1024 * 1024 && size > 4 * state.bytes as u64 {
            self.compact_locked(&state);
        }
    }

    /// Sends the live entries (one record per edit) as the spool's new content. Called with the
    /// lock held, so no record can slip between the snapshot and the compaction.
    fn compact_locked(&self, state: &State) {
        let Some(spool) = &self.spool else {
            return;
        };
        if state.entries.is_empty() && state.unsynced.is_empty() {
            spool.reset();
            return;
        }
        let mut edits: HashMap<EditId<'_>, EditCopies<'_>> = HashMap::new();
        for entry in state.entries.values() {
            edits
                .entry((
                    entry.copy_key.base(),
                    entry.version.get(),
                    entry.is_tombstone(),
                ))
                .or_insert_with(|| (&entry.payload, Vec::new()))
                .1
                .push((
                    entry.copy_key.index(),
                    entry.expire_at_ms,
                    code_of(&entry.copy_key),
                ));
        }
        let mut bodies = Vec::with_capacity(edits.len());
        for ((key, version, tombstone), (payload, copies)) in edits {
            let value: &[u8] = match payload {
                Payload::Value(bytes) => bytes,
                Payload::Tombstone => &[],
            };
            match spool::encode_enqueue(key, version, tombstone, value, &copies) {
                Ok(body) => bodies.push(body),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot compact the spool");
                    return;
                }
            }
        }
        // Records sent but not yet synced are carried over: they may be written to the old
        // file just before it is replaced.
        bodies.extend(state.unsynced.values().cloned());
        spool.compact(bodies);
    }
}

/// One edit in a compaction: (key, version, tombstone).
type EditId<'a> = (&'a str, u64, bool);

/// An edit's payload and its pending copies: (copy index, expiry, placement code).
type EditCopies<'a> = (&'a Payload, Vec<(u32, u64, u8)>);
#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::Admission;
    use super::*;
    use crate::metrics::Metrics;

    #[tokio::test]
    async fn the_spool_replays_into_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        {
            let queue = RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), |_| {
                NodeLabel::new("a")
            })
            .unwrap();
            let admissions = queue
                .enqueue(
                    &key(),
                    Version::new(7).unwrap(),
                    &value(3),
                    vec![failed(0, "a"), failed(1, "a")],
                )
                .await;
            assert!(admissions.iter().all(|a| *a == Admission::Queued));
            let batch = queue.batch(&NodeLabel::new("a"), 1);
            queue.completed(&batch.writes[0]);
        }
        let queue = reopen(&config).await;
        assert_eq!(queue.depth(), 1);
        assert_eq!(queue.view(1).entries[0].version.get(), 7);
    }

    #[tokio::test]
    async fn a_drained_queue_resets_the_spool_to_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        let queue =
            RetryQueue::open(config, 1 << 20, Metrics::new(), |_| NodeLabel::new("a")).unwrap();
        queue
            .enqueue(
                &key(),
                Version::new(1).unwrap(),
                &value(100),
                vec![failed(0, "a"), failed(1, "a")],
            )
            .await;
        assert!(queue.spool_bytes() > spool::HEADER_LEN);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        for write in &batch.writes {
            queue.completed(write);
        }
        assert_eq!(queue.depth(), 0);
        // The reset is processed by the writer after the completions; a durable append behind
        // it proves it ran.
        queue
            .enqueue(
                &key(),
                Version::new(2).unwrap(),
                &value(1),
                vec![failed(2, "a")],
            )
            .await;
        let one_record = std::fs::metadata(dir.path().join("spool.log"))
            .unwrap()
            .len();
        assert_eq!(one_record, queue.spool_bytes());
        assert!(one_record < spool::HEADER_LEN + 100, "{one_record}");
    }
}
