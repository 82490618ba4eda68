//! A publish or invalidate for a caller: which publisher call it is, and the floors its outcome
//! leaves (the writer's own-write pin, its request pin, its session's written floor).

use std::time::Duration;

use bytes::Bytes;

use super::after::{Left, Pins};
use super::{ClientSession, Ops};
use crate::deadline::Deadline;
use crate::error::{Error, ErrorKind, Refusal, Result};
use crate::key::{Key, Version};
use crate::publish::{PublishReport, PublishStatus, SyncReplicas, VersionChoice, Within};
use crate::read::Caller;
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
    /// Who the writer reads as ([`Caller::Client`] or [`Caller::Pooled`]): its reads of the key
    /// on this instance hold the version written for the family's `pin_window`. `None`: no
    /// client (an HTTP publish without `client_id`).
    pub caller: Option<Caller>,
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
    /// When the session's written floor expires, Unix ms: when the last copy the edit applied
    /// or queued expires; for an edit every copy of which already held it (`current`, whose
    /// stored expiry the compare-and-set does not report), the own-write pin's window from now,
    /// at most the family's TTL.
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

impl Writer {
    /// The writer's client id, if it has one.
    pub fn client_id(&self) -> Option<&str> {
        self.caller.as_ref().and_then(Caller::client_id)
    }
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
        self.check_edit(&call.key, call.version, &call.edit)?;
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
                    .publish_within(&key, version, value, Within { sync, deadline })
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
        let status = report.status();
        let now_ms = now_unix_ms();
        let floor = self.floor_left(&key, &report, now_ms);
        // A write that reached at least one copy, or is queued for retry, leaves its version:
        // the writer's reads of this key hold it, and its request's reads go to primaries.
        self.leave(
            Left {
                key: &key,
                key_hash: self.sessions().key_hash(&key),
                now_ms,
                floor: floor.map(|floor| (floor.version, floor.expire_at_ms)),
                written: true,
                pins: Pins::Write {
                    client: writer.client_id(),
                    request_id: writer.request_id.as_deref(),
                },
                void_near: None,
            },
            session,
        );
        Ok(PublishOutcome {
            report,
            status,
            floor,
        })
    }

    /// Whether an edit of `key` naming `version` (or none) and writing `edit` may be tried: the
    /// family's versioning rule ([`crate::family::Family::check_version`]) and the value bound
    /// (`server.max_value_bytes`). [`Ops::publish`] applies it first; a door that writes several
    /// keys in one command checks each before writing any.
    ///
    /// # Errors
    /// [`Error::refused`] with the [`Refusal`] broken.
    pub fn check_edit(&self, key: &Key, version: Option<Version>, edit: &Edit) -> Result<()> {
        if let Edit::Value(value) = edit {
            let limit = self.max_value_bytes();
            if value.len() > limit {
                return Err(Error::refused(Refusal::ValueTooLarge {
                    bytes: value.len(),
                    limit,
                }));
            }
        }
        self.reader()
            .families()
            .resolve(key)
            .check_version(version.is_some())
            .map_err(Error::refused)
    }

    /// The floor an edit whose copies ended as `report` leaves, at `now_ms`: none when it was
    /// refused (`stale` or `conflict`: some copy holds a newer version or another body) or
    /// landed on no copy and queued none (every copy failed and was dropped); otherwise the
    /// version written, until the last copy it applied or queued expires. An edit every copy
    /// of which was already `current` changed no expiry and the stored one is not reported:
    /// its floor lasts the family's `pin_window` (at most its TTL), as the own-write pin does.
    pub fn floor_left(&self, key: &Key, report: &PublishReport, now_ms: u64) -> Option<FloorLeft> {
        if matches!(
            report.status(),
            PublishStatus::Stale | PublishStatus::Conflict
        ) {
            return None;
        }
        let expire_at_ms = match report.lasts_until_ms() {
            Some(expire_at_ms) => expire_at_ms,
            None if report.current > 0 => {
                let family = self.reader().families().resolve(key);
                let window: Duration = family.pin_window.min(family.ttl);
                now_ms.saturating_add(crate::duration::millis(window))
            }
            // Nothing landed and nothing waits to land.
            None => return None,
        };
        Some(FloorLeft {
            version: report.version,
            expire_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::CopyStore;

    /// Operations over an embedded store: `p:` has 4 copies, a 10 s TTL and a 2 s pin window,
    /// with no expiry jitter.
    fn ops() -> (Ops, Arc<MemoryStore>) {
        crate::ops::fixture::ops(
            "[[family]]\nprefix = \"p:\"\ncopies = 4\nttl = \"10s\"\npin_window = \"2s\"",
        )
    }

    fn call(version: u64, edit: Edit) -> PublishCall {
        PublishCall {
            key: Key::parse("p:1").unwrap(),
            version: Some(Version::new(version).unwrap()),
            edit,
            writer: Writer {
                caller: Some(Caller::Client("alice".into())),
                request_id: None,
            },
            sync: None,
            deadline: None,
        }
    }

    fn value(version: u64) -> PublishCall {
        call(version, Edit::Value(Bytes::from_static(b"v")))
    }

    #[tokio::test]
    async fn an_applied_write_leaves_its_floor_until_the_copies_it_wrote_expire() {
        let (ops, store) = ops();
        let mut session = ClientSession::none();
        let outcome = ops.publish(value(5), &mut session).await.unwrap();
        let stored = store
            .read_copy(
                &Key::parse("p:1")
                    .unwrap()
                    .copy_key(0, crate::key::Placement::Suffix),
            )
            .await
            .record
            .unwrap()
            .unwrap()
            .expire_at_ms;
        assert_eq!(
            outcome.floor,
            Some(FloorLeft {
                version: Version::new(5).unwrap(),
                expire_at_ms: stored
            })
        );
        assert_eq!(session.floors().len(), 1);
        let floors = ops
            .router()
            .plan(&Key::parse("p:1").unwrap(), None, Some("alice"), None);
        assert_eq!(floors.unwrap().own_floor, Version::new(5).ok());
    }

    #[tokio::test]
    async fn a_resend_that_found_every_copy_current_does_not_stretch_the_floor_to_the_ttl() {
        let (ops, _) = ops();
        let mut session = ClientSession::none();
        ops.publish(value(5), &mut session).await.unwrap();
        let before = now_unix_ms();
        let again = ops.publish(value(5), &mut session).await.unwrap();
        assert_eq!(again.report.current, 4);
        let floor = again.floor.expect("a current write leaves a floor");
        // The pin window (2 s), not the TTL (10 s) from now.
        assert!(floor.expire_at_ms >= before + 2_000, "{floor:?}");
        assert!(floor.expire_at_ms <= now_unix_ms() + 2_000, "{floor:?}");
    }

    #[tokio::test]
    async fn a_refused_write_leaves_no_floor_and_an_invalidation_cannot_wait_for_replicas() {
        let (ops, _) = ops();
        let mut session = ClientSession::none();
        ops.publish(value(5), &mut session).await.unwrap();
        let mut other = ClientSession::none();
        let stale = ops.publish(value(4), &mut other).await.unwrap();
        assert_eq!((stale.status, stale.floor), (PublishStatus::Stale, None));
        assert!(other.floors().is_empty());
        let mut synced = call(9, Edit::Tombstone);
        synced.sync = Some(SyncReplicas {
            replicas: 1,
            timeout_ms: 10,
        });
        let err = ops.publish(synced, &mut other).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidParameter);
    }
}
