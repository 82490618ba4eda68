//! A publish or invalidate for a caller: which publisher call it is, and the floors its outcome
//! leaves (the writer's own-write pin, its request pin, its session's written floor).

use bytes::Bytes;

use super::{ClientSession, Ops};
use crate::deadline::Deadline;
use crate::error::{Error, ErrorKind, Result};
use crate::fleet::session::SessionFloor;
use crate::key::{Key, Version};
use crate::publish::{PublishReport, PublishStatus, SyncReplicas, VersionChoice};
use crate::store::now_unix_ms;

/// What an edit writes to every copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// A value (publish).
    Value(Bytes),
    /// A versioned tombstone (invalidate).
    Tombstone,
}

/// Who wrote: the identities a write carried, for the floors it leaves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writer {
    /// The writer's client id: its reads of the key on this instance hold the version written
    /// for the family's `pin_window`.
    pub client: Option<String>,
    /// The writer's request id: reads carrying it go to primaries for
    /// `route.request_pin_window`.
    pub request_id: Option<String>,
}

/// One publish or invalidate, as a door parsed it.
#[derive(Debug, Clone)]
pub struct PublishCall {
    /// The key.
    pub key: Key,
    /// The caller's version (`caller` families), or `None` (`allocated` families).
    pub version: Option<Version>,
    /// The value or the tombstone.
    pub edit: Edit,
    /// Who wrote.
    pub writer: Writer,
    /// Wait for replicas after writing (values only).
    pub sync: Option<SyncReplicas>,
    /// When the edit must be answered (see the module doc); `None`: only the store's own
    /// command timeout bounds each copy write.
    pub deadline: Option<Deadline>,
}

/// The floor an edit's outcome leaves its writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorLeft {
    /// The version written.
    pub version: Version,
    /// When the session's written floor expires, Unix ms.
    pub expire_at_ms: u64,
}

/// What a publish or invalidate did, and what it left.
#[derive(Debug, Clone)]
pub struct PublishOutcome {
    /// Every copy's outcome.
    pub report: PublishReport,
    /// How the report ends (the report's [`PublishReport::status`]).
    pub status: PublishStatus,
    /// The floor the edit left in the instance's pins and the caller's session, and that a
    /// door reports (HTTP: `Hotsplit-Version`); `None` for an edit that left none.
    pub floor: Option<FloorLeft>,
}

impl Ops {
    /// Publishes or invalidates `call.key`, then leaves the writer the floor of what the edit
    /// did ([`Ops::floor_left`]): the instance's own-write pin for the writer's client id and
    /// the request pin for its request id (both through [`crate::route::Router::record_write`]),
    /// and a written floor in `session`.
    ///
    /// # Errors
    /// As [`crate::publish::Publisher::publish_within`] and
    /// [`crate::publish::Publisher::publish_synced`]; [`ErrorKind::InvalidParameter`] for an
    /// invalidation that asks to wait for replicas. An error leaves no floor.
    pub async fn publish(
        &self,
        call: PublishCall,
        session: &mut ClientSession,
    ) -> Result<PublishOutcome> {
        let PublishCall {
            key,
            version,
            edit,
            writer,
            sync,
            deadline,
        } = call;
        let version = VersionChoice::from(version);
        let publisher = self.publisher();
        let report = match (edit, sync, deadline) {
            (Edit::Value(value), sync, Some(deadline)) => {
                publisher
                    .publish_within(&key, version, value, sync, deadline)
                    .await?
            }
            (Edit::Value(value), None, None) => publisher.publish(&key, version, value).await?,
            (Edit::Value(value), Some(sync), None) => {
                publisher.publish_synced(&key, version, value, sync).await?
            }
            (Edit::Tombstone, Some(_), _) => {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    "an invalidation does not wait for replicas",
                ))
            }
            (Edit::Tombstone, None, Some(deadline)) => {
                publisher.invalidate_within(&key, version, deadline).await?
            }
            (Edit::Tombstone, None, None) => publisher.invalidate(&key, version).await?,
        };
        let now_ms = now_unix_ms();
        let status = report.status();
        let floor = self.floor_left(&key, &report, now_ms);
        if let Some(floor) = floor {
            // The write reached at least one copy, or is queued for retry: the writer's reads of
            // this key hold this floor, and its request's reads go to primaries.
            self.router().record_write(
                &key,
                floor.version,
                writer.client.as_deref(),
                writer.request_id.as_deref(),
            );
            let sessions = self.sessions();
            let written = SessionFloor {
                key_hash: sessions.key_hash(&key),
                version: floor.version,
                expire_at_ms: floor.expire_at_ms,
                written: true,
            };
            session.record(sessions, written, now_ms);
        }
        Ok(PublishOutcome {
            report,
            status,
            floor,
        })
    }

    /// The floor an edit whose copies ended as `report` leaves, at `now_ms`: none when it was
    /// refused (`stale` or `conflict`: some copy holds a newer version or another body);
    /// otherwise the version written, for the family's TTL from now, which bounds every copy's
    /// expiry, jittered or a tombstone.
    pub fn floor_left(&self, key: &Key, report: &PublishReport, now_ms: u64) -> Option<FloorLeft> {
        if matches!(
            report.status(),
            PublishStatus::Stale | PublishStatus::Conflict
        ) {
            return None;
        }
        let ttl = self.reader().families().resolve(key).ttl;
        let expire_at_ms = now_ms.saturating_add(crate::duration::millis(ttl));
        Some(FloorLeft {
            version: report.version,
            expire_at_ms,
        })
    }
}
