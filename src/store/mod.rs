//! Storage of copies: the one place that holds values.
//!
//! The rest of the crate speaks to the store through small traits, one per role ([`roles`]:
//! [`CopyStore`], [`LayoutStore`], [`FleetStore`], [`ScrubStore`], [`TopologyStore`],
//! [`LibraryStore`]). They have two implementations: [`memory::MemoryStore`], the embedded
//! default for trying hotsplit and for unit tests, and [`redis::RedisStore`], the only module in
//! the crate that talks to Redis (through fred). Both apply the same versioned compare-and-set,
//! so a copy only ever moves forward:
//!
//! - a write whose version is greater than the stored one is `applied`;
//! - a write whose version equals the stored one is `current` (retries are idempotent), except
//!   that a tombstone replaces a value of its own version and a value never replaces a tombstone
//!   of its own version (it is `stale`), so both arrival orders end as the tombstone;
//! - a write whose version equals the stored one with a different body is a `conflict` (a
//!   version issued twice) and changes nothing;
//! - a write whose version is smaller is `stale` and changes nothing;
//! - the expiry is absolute, fixed at publish time, so a retry never extends a value's life.
//!
//! # Expiry never brings an older version back
//! A copy has two instants. `expire_at_ms` (the jittered, per-copy expiry) is when it stops
//! being *served*: every read treats a copy whose expiry is not after the reader's clock as
//! missing, so the copies of a hot key still go missing, and are refilled from the source, at
//! different instants. The stored record itself lives `version_retention` longer
//! ([`retain_until_ms`]), so the compare-and-set still knows the version after the value stopped
//! being served, and a late older write is `stale` on every copy whatever its siblings' expiry.
//! A write of the stored version to a copy no longer served refills it (`applied`, new value and
//! expiry). Once the retention has passed too the record is gone, and an older write is applied
//! like a first publish: the retention bounds how late an older write may arrive.
//! A value and a tombstone of the same version resolve to the tombstone in both stores.

pub mod config;
pub mod library;
pub mod memory;
pub mod redis;
pub mod registry;
pub mod roles;

pub use config::StoreConfig;
pub use registry::InstanceRecord;
pub use roles::{
    CopyStore, FeedConnection, FeedEvent, FeedStore, FleetStore, LayoutStore, LibraryStore,
    ScrubStore, SplitStore, TopologyStore,
};

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;
use crate::key::{CopyKey, Version};

/// What one copy write carries: a value, or a tombstone that blocks older writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The value bytes.
    Value(Bytes),
    /// A deletion marker; readers get "not found", older writes are refused.
    Tombstone,
}

/// One compare-and-set to apply to one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyWrite {
    /// The copy to write.
    pub copy_key: CopyKey,
    /// The version of the edit; the write applies only if it is newer than the stored one.
    pub version: Version,
    /// The value or tombstone.
    pub payload: Payload,
    /// Absolute expiry, Unix milliseconds, fixed when the edit was published.
    pub expire_at_ms: u64,
}

/// The result of a compare-and-set that reached the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The write was newer and is now stored.
    Applied,
    /// The copy already held exactly this version.
    Current,
    /// The copy holds a newer version, which is kept.
    Stale {
        /// The version the copy holds.
        stored: Version,
    },
    /// The copy holds this version with a different body: the version was issued twice (a
    /// counter that lost increments in a failover). Nothing changed.
    Conflict {
        /// The version the copy holds (the one written).
        stored: Version,
    },
}

/// The result of a compare-and-set of a layout record ([`LayoutStore::write_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSwap {
    /// The record held the expected layout and now holds the new one.
    Applied,
    /// The record held something else (`None`: no record), which is kept.
    Changed(Option<Layout>),
}

/// The outcome of one [`CopyWrite`], in the order the writes were given.
#[derive(Debug, Clone)]
pub struct WriteResult {
    /// The node that owns the copy (`host:port`, or `embedded`).
    pub node: NodeLabel,
    /// The compare-and-set outcome, or why the write did not complete.
    pub outcome: Result<CasOutcome>,
}

/// What a copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRecord {
    /// The version stored in the copy.
    pub version: Version,
    /// The value, or [`Payload::Tombstone`].
    pub payload: Payload,
    /// Absolute expiry, Unix milliseconds.
    pub expire_at_ms: u64,
}

impl CopyRecord {
    /// Whether this record comes after `held` in the copies' order: a higher version, or at an
    /// equal version a tombstone after a value (tombstones win ties, as in the compare-and-set).
    /// The expiry plays no part.
    pub(crate) fn supersedes(&self, held: &CopyRecord) -> bool {
        self.version > held.version
            || (self.version == held.version
                && matches!(self.payload, Payload::Tombstone)
                && matches!(held.payload, Payload::Value(_)))
    }
}

/// Who holds a named lease after [`ScrubStore::hold_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// The caller holds it now (taken or renewed), or released it.
    Held,
    /// Another holder has it; the caller's call changed nothing.
    Taken {
        /// The other holder's name.
        holder: String,
    },
}

/// One page of a scan of a node's keys ([`ScrubStore::scan_page`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// The cursor of the next page; 0 when the scan of the node is complete.
    pub next: u64,
    /// The keys of this page (a scan may return a key more than once).
    pub keys: Vec<String>,
}

/// The version and kind of what a copy holds, without the value: what `hotsplit audit` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyStamp {
    /// The version stored in the copy.
    pub version: Version,
    /// Whether the copy holds a tombstone rather than a value.
    pub tombstone: bool,
}

/// The result of reading one copy.
#[derive(Debug, Clone)]
pub struct CopyRead {
    /// Which node answered (or was asked, when the read failed).
    pub served_by: ServedBy,
    /// The record, `None` when the copy does not exist, or why the read failed.
    pub record: Result<Option<CopyRecord>>,
}

/// A node's address as `host:port`, or `embedded` for the in-memory store. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeLabel(Arc<str>);

impl NodeLabel {
    /// The label of the embedded store.
    pub fn embedded() -> NodeLabel {
        NodeLabel(Arc::from("embedded"))
    }

    /// A label from text, usually `host:port`.
    pub fn new(label: impl AsRef<str>) -> NodeLabel {
        NodeLabel(Arc::from(label.as_ref()))
    }

    /// The label as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The role of the node that served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A primary (master) node.
    Primary,
    /// A replica node.
    Replica,
    /// The embedded in-memory store.
    Embedded,
}

/// Which node served a read, rendered in the `Hotsplit-Served-By` header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServedBy {
    /// The node's label.
    pub node: NodeLabel,
    /// The node's role.
    pub role: Role,
}

impl ServedBy {
    /// The embedded store.
    pub fn embedded() -> ServedBy {
        ServedBy {
            node: NodeLabel::embedded(),
            role: Role::Embedded,
        }
    }

    /// A primary node.
    pub fn primary(node: NodeLabel) -> ServedBy {
        ServedBy {
            node,
            role: Role::Primary,
        }
    }

    /// A replica node.
    pub fn replica(node: NodeLabel) -> ServedBy {
        ServedBy {
            node,
            role: Role::Replica,
        }
    }
}

/// A primary and the replicas this instance knows for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSet {
    /// The primary, `host:port`.
    pub primary: NodeLabel,
    /// Its replicas, `host:port`, in a stable order.
    pub replicas: Vec<NodeLabel>,
}

impl fmt::Display for ServedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            Role::Embedded => f.write_str("embedded"),
            Role::Primary => write!(f, "{};role=primary", self.node),
            Role::Replica => write!(f, "{};role=replica", self.node),
        }
    }
}

/// A family's copy layout as recorded in the store, shared by every instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The copy count the last instance to start with this family configured.
    pub copies: u32,
    /// The largest copy count ever recorded: copies `copies..max_copies` may still exist from
    /// before a shrink, and are deleted when their key is next published.
    pub max_copies: u32,
}

impl Layout {
    /// The stored text, `copies:max_copies`.
    pub fn encode(self) -> String {
        format!("{}:{}", self.copies, self.max_copies)
    }

    /// Parses the stored text; `None` when it is not `copies:max_copies`.
    pub(crate) fn decode(text: &str) -> Option<Layout> {
        let (copies, max_copies) = text.split_once(':')?;
        Some(Layout {
            copies: copies.parse().ok()?,
            max_copies: max_copies.parse().ok()?,
        })
    }
}

/// The store key of a family's split records (a hash: key → `crate::split::SplitRecord` text).
/// Like [`layout_key`] it starts with `#`, so it is no user key.
pub fn splits_key(family: &str) -> String {
    format!("#hotsplit#splits#{family}")
}

/// The store key of a family's layout record. It starts with `#`, so it is no user key, copy key
/// or counter key (those start with a non-empty user key).
pub fn layout_key(family: &str) -> String {
    format!("#hotsplit#layout#{family}")
}

/// The store key of the record of who wrote a family's layout record (a hash of
/// [`LAYOUT_WRITER_FIELDS`]). The layout record keeps its `copies:max_copies` text, which every
/// release parses; its writer is kept apart, so the format never changes. Like [`layout_key`]
/// it starts with `#`.
pub fn layout_writer_key(family: &str) -> String {
    format!("#hotsplit#layout-writer#{family}")
}

/// The hash fields of a layout writer record, in the order [`LayoutWriter::fields`] gives them.
pub(crate) const LAYOUT_WRITER_FIELDS: [&str; 4] = ["instance", "release", "copies", "written_ms"];

/// Which instance and release last wrote a family's layout record, kept beside it
/// ([`layout_writer_key`]), so a mismatch names who runs the other layout.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct LayoutWriter {
    /// The writer's instance id (its name in the registry and the live sets).
    pub instance: String,
    /// The release it runs.
    pub release: String,
    /// The copy count it recorded.
    pub copies: u32,
    /// When it wrote the record, Unix milliseconds (its own clock).
    pub written_ms: u64,
}

impl LayoutWriter {
    /// The record as hash field values, in [`LAYOUT_WRITER_FIELDS`] order.
    pub fn fields(&self) -> [String; 4] {
        [
            self.instance.clone(),
            self.release.clone(),
            self.copies.to_string(),
            self.written_ms.to_string(),
        ]
    }

    /// Reads a record back from its field values in [`LAYOUT_WRITER_FIELDS`] order; `None` when
    /// a field is missing (no record: a release before writer records wrote the layout) or a
    /// number does not parse.
    pub(crate) fn from_fields(values: &[Option<String>]) -> Option<LayoutWriter> {
        let [instance, release, copies, written_ms] = values else {
            return None;
        };
        Some(LayoutWriter {
            instance: instance.clone()?,
            release: release.clone()?,
            copies: copies.as_deref()?.parse().ok()?,
            written_ms: written_ms.as_deref()?.parse().ok()?,
        })
    }
}

/// The store key of the lease `name` (`#hotsplit#lease#<name>`, a string holding the holder's
/// name, expiring with the lease). Like [`layout_key`] it starts with `#`.
pub(crate) fn lease_key(name: &str) -> String {
    format!("#hotsplit#lease#{name}")
}

/// The store key of the set of instances live in a family (a sorted set: member
/// `<copies>:<instance>`, score the Unix millisecond at which the entry lapses). Like
/// [`layout_key`] it starts with `#`.
pub(crate) fn live_key(family: &str) -> String {
    format!("#hotsplit#live#{family}")
}

/// The live-set member of an instance with `copies` copies: `<copies>:<instance>`.
/// One other member of a live set ([`LayoutStore::join_live`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMember {
    /// Its copy count (a family's live set) or code (a placement set).
    pub copies: u32,
    /// The instance's name.
    pub instance: String,
}

impl LiveMember {
    /// The names of `live` that are not in `set`: the live instances another set misses.
    pub fn missing_from(live: &[LiveMember], set: &[LiveMember]) -> Vec<String> {
        live.iter()
            .filter(|member| !set.iter().any(|other| other.instance == member.instance))
            .map(|member| member.instance.clone())
            .collect()
    }
}

pub(crate) fn live_member(copies: u32, instance: &str) -> String {
    format!("{copies}:{instance}")
}

/// Whether `instance` may name a live-set member: 1..=64 letters, digits, `-`, `_` or `.`
/// (the Lua library checks the same).
pub(crate) fn valid_live_instance(instance: &str) -> bool {
    (1..=64).contains(&instance.len())
        && instance
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// How long a copy's record outlives its expiry by default: one hour, the default family TTL.
pub const DEFAULT_VERSION_RETENTION_MS: u64 = 3_600_000;

/// When the record of a copy that expires (stops being served) at `expire_at_ms` is deleted:
/// `retention_ms` later. Until then the compare-and-set refuses older versions.
pub(crate) fn retain_until_ms(expire_at_ms: u64, retention_ms: u64) -> u64 {
    expire_at_ms.saturating_add(retention_ms)
}

/// The current wall-clock time in Unix milliseconds.
pub fn now_unix_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_writer_reads_back_and_a_missing_one_reads_as_none() {
        let writer = LayoutWriter {
            instance: "12-abcd".to_owned(),
            release: "0.2.0".to_owned(),
            copies: 8,
            written_ms: 1_700_000_000_000,
        };
        let values: Vec<Option<String>> = writer.fields().into_iter().map(Some).collect();
        assert_eq!(LayoutWriter::from_fields(&values), Some(writer));
        // No record (a release before writer records), or a damaged one.
        assert_eq!(LayoutWriter::from_fields(&[None, None, None, None]), None);
        let mut damaged = values.clone();
        damaged[2] = Some("many".to_owned());
        assert_eq!(LayoutWriter::from_fields(&damaged), None);
        // The writer key is apart from the record, and no user, copy or counter key.
        assert_ne!(layout_writer_key("p:"), layout_key("p:"));
        assert!(layout_writer_key("p:").starts_with('#'));
    }
}
