//! Test helpers shared by the queue's unit tests: a key, failed copies, values, an in-memory
//! queue that answers at once, and spool-backed queues.

use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;

use super::{Admission, FailedCopy, RetryQueue};
use crate::heal::config::HealConfig;
use crate::key::{Key, Version};
use crate::metrics::Metrics;
use crate::store::{now_unix_ms, NodeLabel, Payload};

pub(super) fn key() -> Key {
    Key::parse("hot").unwrap()
}

pub(super) fn failed(index: u32, node: &str) -> FailedCopy {
    FailedCopy {
        copy_key: key().copy_key(index, crate::key::Placement::Suffix),
        node: NodeLabel::new(node),
        expire_at_ms: now_unix_ms() + 60_000,
        error: "timeout".into(),
    }
}

pub(super) fn value(n: usize) -> Payload {
    Payload::Value(Bytes::from(vec![b'v'; n]))
}

pub(super) fn queue() -> RetryQueue {
    RetryQueue::in_memory(HealConfig::default(), Metrics::new())
}

/// Offers to an in-memory queue, which answers at once.
pub(super) fn offer(
    queue: &RetryQueue,
    version: u64,
    payload: &Payload,
    failed: Vec<FailedCopy>,
) -> Vec<Admission> {
    queue
        .enqueue(&key(), Version::new(version).unwrap(), payload, failed)
        .now_or_never()
        .expect("an in-memory queue answers at once")
}

pub(super) fn spool_config(dir: &std::path::Path) -> HealConfig {
    HealConfig {
        spool_dir: dir.to_owned(),
        ..HealConfig::default()
    }
}

pub(super) async fn reopen(config: &HealConfig) -> RetryQueue {
    for _ in 0..200 {
        match RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), |_| {
            NodeLabel::new("a")
        }) {
            Ok(queue) => return queue,
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    panic!("the spool stayed locked");
}
