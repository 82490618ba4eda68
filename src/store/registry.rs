//! The instance registry's record and where it is kept: what one running instance says about
//! itself, shared through the store so instances (and operators) see each other.
//!
//! In Redis each instance is a hash `#hotsplit#{fleet}#instance#<id>` with a time to live that
//! the instance's registrar refreshes, and its id is a member of the sorted set
//! `#hotsplit#{fleet}#instances` (scored by when the entry lapses, on the instance's clock). The
//! hash's time to live is what decides whether an instance is registered: a member whose hash
//! has expired is dropped from the set when the registry is next listed. Both keys carry the hash
//! tag `{fleet}`, so they live in one slot (one node) of a cluster, and start with `#`, so they
//! are no user key, copy key or counter key. Beside each record, `#hotsplit#{fleet}#status#<id>`
//! holds the instance's status summary for the status page (`crate::status`), with the same
//! time to live. The embedded store keeps the same records in
//! memory (a one-instance registry). The deployment's session key lives beside them.

use serde::Serialize;

/// The sorted set of registered instance ids (member: id; score: when the entry lapses, Unix
/// milliseconds).
pub const INSTANCES_KEY: &str = "#hotsplit#{fleet}#instances";

/// The deployment's session key (`fleet::session`), 32 hex digits, created by the first
/// instance to start (`SET NX`) and never expiring.
pub(crate) const SESSION_KEY_KEY: &str = "#hotsplit#{fleet}#session-key";

/// The hash fields of an instance record, in the order [`InstanceRecord::fields`] gives them.
pub(crate) const INSTANCE_FIELDS: [&str; 7] = [
    "id",
    "listen",
    "admin",
    "release",
    "library",
    "started_ms",
    "heartbeat_ms",
];

/// The store key of the record of instance `id`.
pub fn instance_key(id: &str) -> String {
    format!("#hotsplit#{{fleet}}#instance#{id}")
}

/// The store key of instance `id`'s status summary (`crate::status`): a JSON string the
/// instance rewrites every heartbeat interval, living as long as its registry entry.
pub(crate) fn status_key(id: &str) -> String {
    format!("#hotsplit#{{fleet}}#status#{id}")
}

/// What one instance says about itself in the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct InstanceRecord {
    /// The instance's id: unique per process (pid and a random suffix).
    pub id: String,
    /// Where it serves the API (`fleet.advertise`, else its bound listen address).
    pub listen: String,
    /// Where it serves the admin endpoints, when it has an admin listener of its own.
    pub admin: Option<String>,
    /// The release it runs (the package version).
    pub release: String,
    /// The Redis function library it runs; `None` on the embedded store.
    pub library: Option<String>,
    /// When it started, Unix milliseconds.
    pub started_ms: u64,
    /// When it last refreshed its entry, Unix milliseconds (its own clock).
    pub heartbeat_ms: u64,
}

impl InstanceRecord {
    /// The record as hash field values, in [`INSTANCE_FIELDS`] order (an absent admin address
    /// or library is the empty string).
    pub fn fields(&self) -> [String; 7] {
        [
            self.id.clone(),
            self.listen.clone(),
            self.admin.clone().unwrap_or_default(),
            self.release.clone(),
            self.library.clone().unwrap_or_default(),
            self.started_ms.to_string(),
            self.heartbeat_ms.to_string(),
        ]
    }

    /// Reads a record back from its field values in [`INSTANCE_FIELDS`] order; `None` when a
    /// field is missing (an expired hash reads as all missing) or a number does not parse.
    pub(crate) fn from_fields(values: &[Option<String>]) -> Option<InstanceRecord> {
        let [id, listen, admin, release, library, started, heartbeat] = values else {
            return None;
        };
        Some(InstanceRecord {
            id: id.clone()?,
            listen: listen.clone()?,
            admin: admin.clone().filter(|admin| !admin.is_empty()),
            release: release.clone()?,
            library: library.clone().filter(|library| !library.is_empty()),
            started_ms: started.as_deref()?.parse().ok()?,
            heartbeat_ms: heartbeat.as_deref()?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(admin: Option<&str>) -> InstanceRecord {
        InstanceRecord {
            id: "12-abcd".to_owned(),
            listen: "127.0.0.1:7070".to_owned(),
            admin: admin.map(str::to_owned),
            release: "0.1.0".to_owned(),
            library: Some("hotsplit".to_owned()),
            started_ms: 1,
            heartbeat_ms: 2,
        }
    }

    #[test]
    fn a_record_reads_back_from_its_fields() {
        for admin in [None, Some("127.0.0.1:7071")] {
            let record = record(admin);
            let values: Vec<Option<String>> = record.fields().into_iter().map(Some).collect();
            assert_eq!(InstanceRecord::from_fields(&values), Some(record));
        }
    }

    #[test]
    fn an_expired_or_damaged_record_reads_as_none() {
        assert_eq!(InstanceRecord::from_fields(&vec![None; 7]), None);
        let mut values: Vec<Option<String>> = record(None).fields().into_iter().map(Some).collect();
        values[5] = Some("soon".to_owned());
        assert_eq!(InstanceRecord::from_fields(&values), None);
        assert_eq!(InstanceRecord::from_fields(&values[..3]), None);
    }

    #[test]
    fn registry_keys_share_one_slot_and_are_no_user_keys() {
        let tag = |key: &str| {
            let open = key.find('{').unwrap();
            let close = key[open..].find('}').unwrap() + open;
            key[open + 1..close].to_owned()
        };
        assert_eq!(tag(INSTANCES_KEY), tag(&instance_key("1-a")));
        assert_eq!(tag(INSTANCES_KEY), tag(SESSION_KEY_KEY));
        assert_eq!(tag(INSTANCES_KEY), tag(&status_key("1-a")));
        assert!(INSTANCES_KEY.starts_with('#') && instance_key("1-a").starts_with('#'));
        assert!(status_key("1-a").starts_with('#'));
    }
}
