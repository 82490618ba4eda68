//! The after-answer step: every floor an answer leaves, recorded in one place.
//!
//! A read's path ([`crate::read::Reader::read`]) and a publish's outcome only *say* which floors
//! they leave; [`Ops::leave`] records them all, and is the only caller of each writer:
//! - the caller's **session** ([`ClientSession`], sent back as its token): the version shown
//!   (a value's, a "not modified"'s, a tombstone's) as a seen floor, a write's as a written one;
//! - this instance's **pins** ([`crate::route::Router::record_seen`] for a read served away from
//!   where the client's next read goes, [`crate::route::Router::record_write`] for a write's
//!   own-write and request pins);
//! - the **near cache**: a rollback's copy voided ([`crate::read::Reader::void_near`]);
//! - the instance **high-water** ([`super::HighWater`]): the version shown or written, for every
//!   caller, so pooled readers never see it go back.
//!
//! Each floor lasts until the copy that carried it expires (a write's: until the last copy it
//! applied or queued expires).

use super::{ClientSession, Ops};
use crate::fleet::session::SessionFloor;
use crate::key::{CopyKey, Key, Version};

/// The floors one answer leaves, as the read path or the publish found them.
#[derive(Debug)]
pub(crate) struct Left<'a> {
    /// The key answered.
    pub(crate) key: &'a Key,
    /// The key's session hash (`Sessions::key_hash`), as the caller computed it already.
    pub(crate) key_hash: u64,
    /// The moment the answer was decided, Unix ms.
    pub(crate) now_ms: u64,
    /// The version the answer showed or wrote and when it expires, Unix ms; `None`: the
    /// answer leaves no floor (nothing found, a refused or lost write).
    pub(crate) floor: Option<(Version, u64)>,
    /// Whether the floor is a write's (a written floor) rather than a read's (a seen one).
    pub(crate) written: bool,
    /// The pins this instance keeps.
    pub(crate) pins: Pins<'a>,
    /// The near-cache copy a rollback voids.
    pub(crate) void_near: Option<CopyKey>,
}

/// The pins an answer leaves on this instance.
#[derive(Debug)]
pub(crate) enum Pins<'a> {
    /// None.
    None,
    /// A seen floor at this version for the client (a read served away from where its next
    /// read goes).
    Seen {
        /// The client's id.
        client: &'a str,
        /// The version served.
        version: Version,
    },
    /// A write's own-write pin for its client and request pin for its request id, at the
    /// answer's floor.
    Write {
        /// The writer's client id.
        client: Option<&'a str>,
        /// The writer's request id.
        request_id: Option<&'a str>,
    },
}

impl Ops {
    /// Records every floor `left` names (see the module documentation).
    pub(crate) fn leave(&self, left: Left<'_>, session: &mut ClientSession) {
        let Left {
            key,
            key_hash,
            now_ms,
            floor,
            written,
            pins,
            void_near,
        } = left;
        if let Some(copy_key) = void_near {
            self.reader().void_near(&copy_key);
        }
        match pins {
            Pins::None => {}
            Pins::Seen { client, version } => self.router().record_seen(key, version, client),
            Pins::Write { client, request_id } => {
                if let Some((version, _)) = floor {
                    self.router().record_write(key, version, client, request_id);
                }
            }
        }
        let Some((version, expire_at_ms)) = floor else {
            return;
        };
        let sessions = self.sessions();
        let session_floor = SessionFloor {
            key_hash,
            version,
            expire_at_ms,
            written,
        };
        session.record(sessions, session_floor, now_ms);
        self.high_water().record(key, version, expire_at_ms, now_ms);
    }
}
