//! Publish and invalidate: fan one edit out to every copy of a key.
//!
//! An edit carries a [`Version`]. It is written to all N copies at once with the store's
//! compare-and-set ([`Store::write_copies`] groups them per node), so a copy only moves forward
//! and a retry of the same version is idempotent. An invalidation writes a versioned tombstone
//! the same way, so a late write of an older version cannot resurrect the value.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use crate::config::{Families, Family, Versioning};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{Key, Version};
use crate::metrics::{Metrics, WriteOp};
use crate::store::{now_unix_ms, CasOutcome, CopyWrite, Payload, Store};

/// The outcome of one copy write, as reported to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CopyOutcome {
    /// The copy now holds this version.
    Applied,
    /// The copy already held exactly this version.
    Current,
    /// The copy holds a newer version, which was kept.
    Stale,
    /// The write failed (an error or a timeout); retrying the same version is safe.
    Failed,
}

/// One copy's line in a [`PublishReport`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CopyReport {
    /// The copy index.
    pub copy: u32,
    /// The stored key, `K#i`.
    pub copy_key: String,
    /// The node that owns the copy (`host:port`, or `embedded`).
    pub node: String,
    /// What happened.
    pub outcome: CopyOutcome,
    /// For a failed write, the error class (`timeout` or `unavailable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a publish or invalidate did to every copy.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PublishReport {
    /// The key.
    pub key: String,
    /// The version written (allocated by hotsplit for `allocated` families).
    #[schema(value_type = u64)]
    pub version: Version,
    /// How many copies the key has.
    pub copies: u32,
    /// Copies that now hold this version.
    pub applied: u32,
    /// Copies that already held it.
    pub current: u32,
    /// Copies that hold a newer version.
    pub stale: u32,
    /// Copies whose write failed.
    pub failed: u32,
    /// One line per copy, in copy order.
    pub outcomes: Vec<CopyReport>,
}

/// How a [`PublishReport`] ends, which the HTTP layer maps to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStatus {
    /// No copy failed, and at least one applied or all are current.
    Done,
    /// Nothing applied, some copy holds a newer version, none failed.
    Stale,
    /// Some copy failed; retrying the same version is safe.
    Incomplete,
}

impl PublishReport {
    /// The overall result.
    pub fn status(&self) -> PublishStatus {
        if self.failed > 0 {
            PublishStatus::Incomplete
        } else if self.applied == 0 && self.stale > 0 {
            PublishStatus::Stale
        } else {
            PublishStatus::Done
        }
    }
}

/// Which version an edit carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionChoice {
    /// The caller's version (required by `caller` families, refused by `allocated` ones).
    Given(Version),
    /// No version given: `allocated` families allocate one, `caller` families refuse.
    Unspecified,
}

impl From<Option<Version>> for VersionChoice {
    fn from(version: Option<Version>) -> Self {
        match version {
            Some(version) => VersionChoice::Given(version),
            None => VersionChoice::Unspecified,
        }
    }
}

/// Publishes and invalidates keys.
pub struct Publisher {
    /// Where copies live.
    store: Arc<dyn Store>,
    /// Copies, TTL and versioning per key family.
    families: Arc<Families>,
    /// Outcome counters.
    metrics: Arc<Metrics>,
}

impl Publisher {
    /// A publisher writing through `store`.
    pub fn new(store: Arc<dyn Store>, families: Arc<Families>, metrics: Arc<Metrics>) -> Publisher {
        Publisher {
            store,
            families,
            metrics,
        }
    }

    /// Writes `value` at `version` to every copy of `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidVersion`] when the version does not fit the family's versioning;
    /// store errors from allocating a version. Failed copy writes are not errors: they are
    /// reported per copy, and [`PublishReport::status`] is then `Incomplete`.
    pub async fn publish(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
    ) -> Result<PublishReport> {
        self.write(key, version, Payload::Value(value), WriteOp::Publish)
            .await
    }

    /// Writes a tombstone at `version` to every copy of `key`.
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub async fn invalidate(&self, key: &Key, version: VersionChoice) -> Result<PublishReport> {
        self.write(key, version, Payload::Tombstone, WriteOp::Invalidate)
            .await
    }

    async fn write(
        &self,
        key: &Key,
        version: VersionChoice,
        payload: Payload,
        op: WriteOp,
    ) -> Result<PublishReport> {
        let family = self.families.resolve(key);
        let version = self.choose_version(key, family, version).await?;
        let expire_at_ms = now_unix_ms().saturating_add(duration_ms(family.ttl));
        let writes: Vec<CopyWrite> = (0..family.copies)
            .map(|index| CopyWrite {
                copy_key: key.copy_key(index),
                version,
                payload: payload.clone(),
                expire_at_ms,
            })
            .collect();
        let results = self.store.write_copies(&writes).await;

        let mut report = PublishReport {
            key: key.to_string(),
            version,
            copies: family.copies,
            applied: 0,
            current: 0,
            stale: 0,
            failed: 0,
            outcomes: Vec::with_capacity(writes.len()),
        };
        for (write, result) in writes.iter().zip(results) {
            self.metrics
                .copy_outcome(op, result.outcome.as_ref().ok().copied());
            let (outcome, error) = match result.outcome {
                Ok(CasOutcome::Applied) => (CopyOutcome::Applied, None),
                Ok(CasOutcome::Current) => (CopyOutcome::Current, None),
                Ok(CasOutcome::Stale { .. }) => (CopyOutcome::Stale, None),
                Err(err) => {
                    tracing::warn!(copy_key = %write.copy_key, node = %result.node, error = %err, "copy write failed");
                    let class = if err.kind() == ErrorKind::Timeout {
                        "timeout"
                    } else {
                        "unavailable"
                    };
                    (CopyOutcome::Failed, Some(class.to_owned()))
                }
            };
            match outcome {
                CopyOutcome::Applied => report.applied += 1,
                CopyOutcome::Current => report.current += 1,
                CopyOutcome::Stale => report.stale += 1,
                CopyOutcome::Failed => report.failed += 1,
            }
            report.outcomes.push(CopyReport {
                copy: write.copy_key.index(),
                copy_key: write.copy_key.to_string(),
                node: result.node.to_string(),
                outcome,
                error,
            });
        }
        Ok(report)
    }

    async fn choose_version(
        &self,
        key: &Key,
        family: &Family,
        version: VersionChoice,
    ) -> Result<Version> {
        match (family.versioning, version) {
            (Versioning::Caller, VersionChoice::Given(version)) => Ok(version),
            (Versioning::Caller, VersionChoice::Unspecified) => Err(Error::new(
                ErrorKind::InvalidVersion,
                format!(
                    "family {:?} takes versions from the caller: send ?version=V",
                    family.name()
                ),
            )),
            (Versioning::Allocated, VersionChoice::Unspecified) => {
                // The counter outlives every copy it versioned, so a later allocation never
                // restarts below a live copy.
                let counter_ttl_ms = duration_ms(family.ttl).saturating_mul(2);
                self.store.allocate_version(key, counter_ttl_ms).await
            }
            (Versioning::Allocated, VersionChoice::Given(_)) => Err(Error::new(
                ErrorKind::InvalidVersion,
                format!(
                    "family {:?} allocates versions: do not send ?version",
                    family.name()
                ),
            )),
        }
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::memory::MemoryStore;

    fn publisher(config: &str) -> Publisher {
        let config = Config::from_toml(config).unwrap();
        config.validate().unwrap();
        Publisher::new(
            Arc::new(MemoryStore::new()),
            Arc::new(Families::from_config(&config)),
            Metrics::new(),
        )
    }

    fn v(n: u64) -> VersionChoice {
        VersionChoice::Given(Version::new(n).unwrap())
    }

    #[tokio::test]
    async fn publish_reports_every_copy() {
        let publisher = publisher("[[family]]\nprefix = \"p:\"\ncopies = 4");
        let key = Key::parse("p:1").unwrap();
        let report = publisher
            .publish(&key, v(3), Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(
            (report.copies, report.applied, report.status()),
            (4, 4, PublishStatus::Done)
        );
        let copies: Vec<u32> = report.outcomes.iter().map(|line| line.copy).collect();
        assert_eq!(copies, vec![0, 1, 2, 3]);

        let again = publisher
            .publish(&key, v(3), Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!((again.current, again.status()), (4, PublishStatus::Done));
        let older = publisher
            .publish(&key, v(2), Bytes::from_static(b"y"))
            .await
            .unwrap();
        assert_eq!((older.stale, older.status()), (4, PublishStatus::Stale));
    }

    #[tokio::test]
    async fn versioning_rules_are_enforced() {
        let publisher =
            publisher("[[family]]\nprefix = \"a:\"\ncopies = 2\nversioning = \"allocated\"");
        let caller_key = Key::parse("c:1").unwrap();
        let err = publisher
            .publish(&caller_key, VersionChoice::Unspecified, Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidVersion);

        let allocated_key = Key::parse("a:1").unwrap();
        let err = publisher
            .publish(&allocated_key, v(1), Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidVersion);
        let first = publisher
            .publish(&allocated_key, VersionChoice::Unspecified, Bytes::new())
            .await
            .unwrap();
        let second = publisher
            .invalidate(&allocated_key, VersionChoice::Unspecified)
            .await
            .unwrap();
        assert_eq!((first.version.get(), second.version.get()), (1, 2));
        assert_eq!(second.applied, 2);
    }
}
