//! What a publish or invalidate reports: one line per copy, the counts, and how it ends.

use serde::Serialize;

use crate::error::{Error, ErrorKind};
use crate::key::{Key, Version};
use crate::store::{CasOutcome, CopyWrite, WriteResult};

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
    /// The copy holds this version with a different body (a version used twice), which was
    /// kept.
    Conflict,
    /// The write failed (an error or a timeout) and no retry queue took it; retrying the same
    /// version is safe.
    Failed,
    /// The write failed and was durably queued: hotsplit retries it until it lands or expires.
    Queued,
    /// The write failed and could not be queued (the queue was full, the entry had expired, or
    /// the spool failed); retrying the same version is safe.
    Dropped,
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
    /// For a failed (queued or dropped) write, the error class: `timeout`, `unavailable`,
    /// `node_failing` (not sent: the node is known to be failing, see [`crate::heal::health`]),
    /// or `deadline_exceeded` (no answer before the request's deadline; the write may still
    /// land, see [`crate::deadline`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `sync_replicas`: how many replicas of the copy's node acknowledged the write
    /// within `sync_timeout_ms` (the reply of `WAIT`); absent when the wait failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_acked: Option<u32>,
}

/// What a publish or invalidate did to every copy.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PublishReport {
    /// The key.
    pub key: String,
    /// The version written (allocated by hotsplit for `allocated` families).
    #[schema(value_type = u64)]
    pub version: Version,
    /// How many copies were written: the family's copy count, or more while a live instance
    /// with more copies of the family reads them.
    pub copies: u32,
    /// Copies that now hold this version.
    pub applied: u32,
    /// Copies that already held it.
    pub current: u32,
    /// Copies that hold a newer version.
    pub stale: u32,
    /// Copies that hold this version with a different body.
    pub conflict: u32,
    /// Copies whose write failed (including those queued or dropped).
    pub failed: u32,
    /// Failed copies durably queued for retry.
    pub queued: u32,
    /// Failed copies that could not be queued.
    pub dropped: u32,
    /// One line per copy, in copy order.
    pub outcomes: Vec<CopyReport>,
    /// When the last copy this edit applied or queued expires, Unix ms: how long what it stored
    /// (or will store) can be read. `None` when it applied none and queued none (a `current`
    /// copy kept its own expiry, which the compare-and-set does not report).
    #[serde(skip)]
    pub(super) lasts_until_ms: Option<u64>,
}

/// How a [`PublishReport`] ends, which the HTTP layer maps to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStatus {
    /// No copy failed, and at least one applied or all are current.
    Done,
    /// Some copy holds this version with a different body: the version was used for two
    /// bodies (a caller's mistake, or an allocated version after three re-allocations).
    Conflict,
    /// Nothing applied, some copy holds a newer version, none failed.
    Stale,
    /// Some copy failed and every failed copy was durably queued for retry.
    Queued,
    /// Some copy failed and was not queued; retrying the same version is safe.
    Incomplete,
}

impl PublishReport {
    /// When the last copy this edit applied or queued expires, Unix ms; `None` when it applied
    /// and queued none.
    pub fn lasts_until_ms(&self) -> Option<u64> {
        self.lasts_until_ms
    }

    /// Why an edit that ended `Stale`, `Conflict` or `Incomplete` did not land, in words of no
    /// door (each door adds what its caller should do); `None` for `Done` and `Queued`.
    pub fn shortfall(&self) -> Option<String> {
        let version = self.version;
        match self.status() {
            PublishStatus::Done | PublishStatus::Queued => None,
            PublishStatus::Stale => Some(format!(
                "no copy applied version {version}: every copy that answered holds a newer version"
            )),
            PublishStatus::Conflict => Some(format!(
                "{} copies hold version {version} with a different body",
                self.conflict
            )),
            PublishStatus::Incomplete => Some(format!(
                "{} of {} copy writes failed and {} could not be queued",
                self.failed,
                self.copies,
                self.failed - self.queued
            )),
        }
    }

    /// The overall result.
    pub fn status(&self) -> PublishStatus {
        if self.conflict > 0 {
            PublishStatus::Conflict
        } else if self.failed > 0 && self.queued == self.failed {
            PublishStatus::Queued
        } else if self.failed > 0 {
            PublishStatus::Incomplete
        } else if self.applied == 0 && self.stale > 0 {
            PublishStatus::Stale
        } else {
            PublishStatus::Done
        }
    }
}

impl PublishReport {
    /// The report of an edit of `key` at `version` to `copies` copies, before any outcome.
    pub(super) fn new(key: &Key, version: Version, copies: u32) -> PublishReport {
        PublishReport {
            key: key.to_string(),
            version,
            copies,
            applied: 0,
            current: 0,
            stale: 0,
            conflict: 0,
            failed: 0,
            queued: 0,
            dropped: 0,
            outcomes: Vec::with_capacity(copies as usize),
            lasts_until_ms: None,
        }
    }

    /// Adds the line of `write`, which ended as `result` (with `replicas_acked` replicas
    /// acknowledging it), and counts it.
    pub(super) fn record(
        &mut self,
        write: &CopyWrite,
        result: WriteResult,
        replicas_acked: Option<u32>,
    ) {
        let (outcome, error) = match result.outcome {
            Ok(CasOutcome::Applied) => (CopyOutcome::Applied, None),
            Ok(CasOutcome::Current) => (CopyOutcome::Current, None),
            Ok(CasOutcome::Stale { .. }) => (CopyOutcome::Stale, None),
            Ok(CasOutcome::Conflict { .. }) => (CopyOutcome::Conflict, None),
            Err(err) => {
                tracing::warn!(copy_key = %write.copy_key, node = %result.node, error = %err, "copy write failed");
                (CopyOutcome::Failed, Some(error_class(&err).to_owned()))
            }
        };
        match outcome {
            CopyOutcome::Applied => {
                self.applied += 1;
                self.lasts_until_ms = self.lasts_until_ms.max(Some(write.expire_at_ms));
            }
            CopyOutcome::Current => self.current += 1,
            CopyOutcome::Stale => self.stale += 1,
            CopyOutcome::Conflict => self.conflict += 1,
            CopyOutcome::Failed | CopyOutcome::Queued | CopyOutcome::Dropped => self.failed += 1,
        }
        self.outcomes.push(CopyReport {
            copy: write.copy_key.index(),
            copy_key: write.copy_key.to_string(),
            node: result.node.to_string(),
            outcome,
            error,
            replicas_acked,
        });
    }

    /// Marks the failed line at `position` queued (its copy expiring at `expire_at_ms`) or
    /// dropped.
    pub(super) fn settle_failed(&mut self, position: usize, queued: bool, expire_at_ms: u64) {
        let Some(line) = self.outcomes.get_mut(position) else {
            return;
        };
        if queued {
            line.outcome = CopyOutcome::Queued;
            self.queued += 1;
            self.lasts_until_ms = self.lasts_until_ms.max(Some(expire_at_ms));
        } else {
            line.outcome = CopyOutcome::Dropped;
            self.dropped += 1;
        }
    }
}

/// The class a failed copy write is reported with.
fn error_class(err: &Error) -> &'static str {
    match err.kind() {
        ErrorKind::Timeout => "timeout",
        ErrorKind::NodeFailing => "node_failing",
        ErrorKind::DeadlineExceeded => "deadline_exceeded",
        _ => "unavailable",
    }
}
