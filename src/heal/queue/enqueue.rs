//! The publisher's side of the queue: failed copies are offered, sent to the spool under the
//! lock and admitted once their record is synced, so `queued` always means durable; a direct
//! write clears the entries it covers.

use tokio::sync::oneshot;

use super::super::spool;
use super::table::{covers, entry_cost, Entry};
use super::{Admission, Core, DropReason, FailedCopy, RetryQueue};
use crate::key::{CopyKey, Key, Version};
use crate::metrics::RetryDrop;
use crate::store::{now_unix_ms, Payload};

/// Resolves with a spool record's outcome once it is synced (or failed).
type Settled = oneshot::Receiver<std::result::Result<(), String>>;

impl Core {
    /// A spool record was synced (`Ok`) or failed: its entries join the queue, or are dropped.
    fn settle(
        &self,
        record: u64,
        entries: Vec<Entry>,
        reserved_bytes: usize,
        outcome: &std::result::Result<(), String>,
    ) {
        let mut state = self.state();
        state.unsynced.remove(&record);
        state.reserved_entries = state.reserved_entries.saturating_sub(entries.len());
        state.reserved_bytes = state.reserved_bytes.saturating_sub(reserved_bytes);
        let admitted = outcome.is_ok() && !entries.is_empty();
        match outcome {
            Ok(()) => {
                for entry in entries {
                    self.admit(&mut state, entry, true);
                }
            }
            Err(err) => {
                tracing::error!(error = %err, copies = entries.len(), "failed copy writes could not be made durable: reporting them dropped, not retrying them");
                for _ in &entries {
                    self.metrics.retry_drop(RetryDrop::Spool);
                }
            }
        }
        self.publish_gauges(&state);
        drop(state);
        if admitted {
            self.wake.notify_one();
        }
    }
}

impl RetryQueue {
    /// Offers the failed copy writes of one edit of `key` at `version`, and answers once each
    /// is settled: `Queued` only when a durable spool record (this edit's, or a newer pending
    /// entry's) holds it, so a crash after the answer loses nothing answered `Queued`.
    ///
    /// An offered copy joins the queue only after its record is synced; if the spool fails, the
    /// copy is `Dropped(Spool)` and is not retried. Dropping the returned future does not
    /// change what happens to the copies, only who hears of it.
    pub async fn enqueue(
        &self,
        key: &Key,
        version: Version,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> Vec<Admission> {
        let (mut admissions, waiting) = self.offer(key, version, payload, failed);
        let Some((positions, durable)) = waiting else {
            return admissions;
        };
        let outcome = durable
            .await
            .unwrap_or_else(|_| Err("the spool writer has stopped".to_owned()));
        if outcome.is_err() {
            for position in positions {
                if let Some(admission) = admissions.get_mut(position) {
                    *admission = Admission::Dropped(DropReason::Spool);
                }
            }
        }
        admissions
    }

    /// The synchronous part of [`RetryQueue::enqueue`]: decides each copy under the lock and
    /// sends the spool record; returns the admissions (those waiting for the record are
    /// `Queued` provisionally) and, when a record was sent, their positions and its outcome.
    fn offer(
        &self,
        key: &Key,
        version: Version,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> (Vec<Admission>, Option<(Vec<usize>, Settled)>) {
        let now_ms = now_unix_ms();
        let mut admissions = Vec::with_capacity(failed.len());
        let mut offered: Vec<Entry> = Vec::new();
        let mut positions: Vec<usize> = Vec::new();
        let (tombstone, value_len) = match payload {
            Payload::Value(bytes) => (false, bytes.len()),
            Payload::Tombstone => (true, 0),
        };
        let mut state = self.core.state();
        let config = &self.core.config;
        let mut reserve_bytes = 0usize;
        for copy in failed {
            if copy.expire_at_ms <= now_ms {
                self.core.metrics.retry_drop(RetryDrop::Expired);
                admissions.push(Admission::Dropped(DropReason::Expired));
                continue;
            }
            if let Some(held) = state.entries.get(copy.copy_key.as_str()) {
                if covers(held.version, held.is_tombstone(), version, tombstone) {
                    // A newer (or equal) entry will heal this copy past this version, and an
                    // entry is in the queue only once its record is durable.
                    self.core.metrics.retry_superseded();
                    admissions.push(Admission::Queued);
                    continue;
                }
            }
            let shares_value = !offered.is_empty()
                || state.values.contains_key(&(
                    copy.copy_key.base().to_owned(),
                    version.get(),
                    tombstone,
                ));
            let adds = entry_cost(&copy.copy_key) + if shares_value { 0 } else { value_len };
            if state.entries.len() + state.reserved_entries + offered.len() >= config.max_entries
                || state.bytes + state.reserved_bytes + reserve_bytes + adds > config.max_bytes
            {
                self.core.metrics.retry_drop(RetryDrop::Overflow);
                tracing::warn!(copy_key = %copy.copy_key, node = %copy.node, "retry queue full: dropping a failed copy write");
                admissions.push(Admission::Dropped(DropReason::Overflow));
                continue;
            }
            reserve_bytes += adds;
            positions.push(admissions.len());
            admissions.push(Admission::Queued);
            offered.push(Entry {
                copy_key: copy.copy_key,
                version,
                payload: payload.clone(),
                expire_at_ms: copy.expire_at_ms,
                node: copy.node,
                attempts: 0,
                last_error: Some(copy.error),
                queued_at_ms: now_ms,
            });
        }
        if offered.is_empty() {
            return (admissions, None);
        }
        let Some(spool) = &self.spool else {
            // An in-memory queue: nothing to wait for.
            for entry in offered {
                self.core.admit(&mut state, entry, true);
            }
            self.core.publish_gauges(&state);
            drop(state);
            self.core.wake.notify_one();
            return (admissions, None);
        };
        let record = match spool_record(key, version, payload, &offered) {
            Ok(record) => record,
            Err(err) => {
                tracing::error!(error = %err, "cannot encode a spool record: reporting the copies dropped");
                for position in positions {
                    self.core.metrics.retry_drop(RetryDrop::Spool);
                    admissions[position] = Admission::Dropped(DropReason::Spool);
                }
                return (admissions, None);
            }
        };
        let id = state.next_record;
        state.next_record += 1;
        state.unsynced.insert(id, record.clone());
        state.reserved_entries += offered.len();
        state.reserved_bytes += reserve_bytes;
        let (tell, settled) = oneshot::channel();
        let core = self.core.clone();
        let done: spool::Done = Box::new(move |outcome| {
            core.settle(id, offered, reserve_bytes, &outcome);
            let _ = tell.send(outcome);
        });
        // Sent under the lock, so the spool's order is the queue's order.
        if let Err(done) = spool.append_durable(record, done) {
            drop(done);
            state.unsynced.remove(&id);
            state.reserved_entries -= positions.len();
            state.reserved_bytes -= reserve_bytes;
            tracing::error!("the spool writer has stopped: reporting failed copies dropped");
            for &position in &positions {
                self.core.metrics.retry_drop(RetryDrop::Spool);
                admissions[position] = Admission::Dropped(DropReason::Spool);
            }
            return (admissions, None);
        }
        (admissions, Some((positions, settled)))
    }

    /// A direct write of `version` reached `copy_key` (applied, current, or a newer version is
    /// stored): pending entries it covers are done.
    pub fn clear_covered(&self, copy_key: &CopyKey, version: Version, tombstone: bool) {
        let mut state = self.core.state();
        if !state.entries.contains_key(copy_key.as_str()) {
            return;
        }
        let removed = self.core.remove_if(&mut state, copy_key.as_str(), |entry| {
            covers(version, tombstone, entry.version, entry.is_tombstone())
        });
        if removed {
            self.spool_complete(copy_key.as_str(), version, tombstone);
            self.reset_if_drained(&state);
            self.core.publish_gauges(&state);
        }
    }
}

/// The spool record of `offered` (the copies of `key` at `version` admitted together).
///
/// # Errors
/// As `spool::encode_enqueue`.
fn spool_record(
    key: &Key,
    version: Version,
    payload: &Payload,
    offered: &[Entry],
) -> crate::error::Result<bytes::Bytes> {
    let copies: Vec<(u32, u64, u8)> = offered
        .iter()
        .map(|entry| {
            (
                entry.copy_key.index(),
                entry.expire_at_ms,
                super::durable::code_of(&entry.copy_key),
            )
        })
        .collect();
    let (tombstone, value): (bool, &[u8]) = match payload {
        Payload::Value(bytes) => (false, bytes),
        Payload::Tombstone => (true, &[]),
    };
    spool::encode_enqueue(key.as_str(), version.get(), tombstone, value, &copies)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::super::test_util::*;
    use super::*;
    use crate::heal::config::HealConfig;
    use crate::metrics::Metrics;
    use crate::store::NodeLabel;

    #[test]
    fn bounds_drop_with_a_reason() {
        let config = HealConfig {
            max_entries: 2,
            ..HealConfig::default()
        };
        let queue = RetryQueue::in_memory(config, Metrics::new());
        let admissions = offer(
            &queue,
            1,
            &value(1),
            vec![failed(0, "a"), failed(1, "a"), failed(2, "a")],
        );
        assert_eq!(
            admissions,
            vec![
                Admission::Queued,
                Admission::Queued,
                Admission::Dropped(DropReason::Overflow)
            ]
        );
        let mut old = failed(3, "a");
        old.expire_at_ms = now_unix_ms() - 1;
        let admissions = offer(&queue, 2, &value(1), vec![old]);
        assert_eq!(admissions, vec![Admission::Dropped(DropReason::Expired)]);
    }

    /// Issue 14 item 6: a copy covered by a pending entry of a newer version is answered
    /// `queued` only once that entry's record is synced. The writer is held so the newer
    /// record waits for its sync; then the process "crashes" (the writer stops without
    /// writing). Everything answered `queued` must be in the spool after the crash.
    #[tokio::test]
    async fn a_covered_copy_is_not_queued_before_its_cover_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        let answered: Vec<(u64, Vec<Admission>)>;
        {
            let (queue, gate) =
                RetryQueue::open_held(config.clone(), Metrics::new(), |_| NodeLabel::new("a"))
                    .unwrap();
            // Replay's compaction is the first batch: let it through.
            gate.send(spool::Gate::Go).unwrap();
            let (key, value) = (key(), value(4));
            // Version 9 of copy 0 is offered; its record waits for the held writer.
            let mut newer = Box::pin(queue.enqueue(
                &key,
                Version::new(9).unwrap(),
                &value,
                vec![failed(0, "a")],
            ));
            assert_eq!((&mut newer).now_or_never(), None);
            // Version 8 of the same copy fails while version 9 is unsynced: it must not be
            // answered before a durable record holds it.
            let mut older = Box::pin(queue.enqueue(
                &key,
                Version::new(8).unwrap(),
                &value,
                vec![failed(0, "a")],
            ));
            let early = (&mut older).now_or_never();
            assert_eq!(early, None, "a covered copy was answered before any sync");
            // The crash: the held batch is never written.
            gate.send(spool::Gate::Crash).unwrap();
            let (newer, older) = tokio::join!(newer, older);
            answered = vec![(9, newer), (8, older)];
        }
        let queue = reopen(&config).await;
        let held = queue
            .view(1)
            .entries
            .first()
            .map_or(0, |entry| entry.version.get());
        for (version, admissions) in &answered {
            if admissions.contains(&Admission::Queued) {
                assert!(
                    held >= *version,
                    "version {version} was answered queued; the spool holds {held}"
                );
            }
        }
        assert!(
            answered
                .iter()
                .all(|(_, admissions)| admissions == &vec![Admission::Dropped(DropReason::Spool)]),
            "{answered:?}"
        );

        drop(queue);

        // Without the crash both are queued, and the spool holds version 9.
        {
            let mut opened = None;
            for _ in 0..200 {
                match RetryQueue::open_held(config.clone(), Metrics::new(), |_| NodeLabel::new("a"))
                {
                    Ok(queue) => {
                        opened = Some(queue);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            let (queue, gate) = opened.expect("the spool reopens");
            // Every batch goes through, until the writer stops.
            std::thread::spawn(move || while gate.send(spool::Gate::Go).is_ok() {});
            let (key, value) = (key(), value(4));
            let newer = queue.enqueue(&key, Version::new(9).unwrap(), &value, vec![failed(0, "a")]);
            let older = queue.enqueue(&key, Version::new(8).unwrap(), &value, vec![failed(0, "a")]);
            let (newer, older) = tokio::join!(newer, older);
            assert_eq!(
                (newer, older),
                (vec![Admission::Queued], vec![Admission::Queued])
            );
            assert_eq!(queue.view(1).entries[0].version.get(), 9);
            // The queue's gauge and the covered answer agree: a covered offer now answers at once.
            let covered = queue
                .enqueue(&key, Version::new(7).unwrap(), &value, vec![failed(0, "a")])
                .now_or_never();
            assert_eq!(covered, Some(vec![Admission::Queued]));
        }
        let queue = reopen(&config).await;
        assert_eq!(queue.view(1).entries[0].version.get(), 9);
    }
}
