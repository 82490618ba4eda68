//! Automatic split and merge: a key the detector ([`crate::hot`]) finds hot in a family with a
//! `split` policy gets copies of its own (`split.max_copies`), under a per-key layout kept
//! beside the family's, and merges back to the family's copies once it cools.
//!
//! # Records
//! Each family's split keys are one hash, `#hotsplit#splits#<family>`, field = key, value =
//! [`SplitRecord`] (`<copies>:<phase>:<since_ms>:<seen_ms>`). The family's layout record and its
//! `copies:max_copies` format are never touched, so older releases keep parsing it. One hash per
//! family (not one record per key beside its copy 0) because nothing on the request path reads
//! it: each instance reads every family's hash once per `heal.layout_interval` (`HGETALL`, at
//! most `max_split_keys` fields) and writes it at most a few times per split, so the master that
//! holds it sees a handful of commands per instance per interval whichever master it is. Moves
//! are a compare-and-set of one field (a short Lua script), so two instances moving the same key
//! never both win.
//!
//! # The index
//! [`SplitIndex`] is the in-memory copy every publish and read consults (a lock-free load of an
//! `Arc`, then one map look-up; no store call), replaced whole for each family by the
//! [`crate::layout::Splitter`] every layout interval, and loaded once at startup before the instance serves.
//! Every family's hash is read, whatever this instance's config says of splitting, so an
//! instance whose config has no `split` table still writes every copy another instance's readers
//! use. The index of a family holds what the store holds; the splitters keep it at
//! `max_split_keys` keys (a new split is refused at the bound).
//!
//! # The protocol, and why it holds
//! A key's copies while split are `0..copies` (`copies = split.max_copies`); the family's are
//! `0..family.copies`, always written, and copy 0 is in both. Phases ([`Phase`]):
//! - **Writing** (`w`): publishes write `0..copies`; reads use the family's copies. Created by
//!   an instance whose detector calls the key hot (at or above `split.threshold`), under
//!   `max_split_keys` and `max_splits_per_minute`.
//! - **Reading** (`r`): reads use `0..copies` too. An instance moves `w` to `r` only once it has
//!   seen that record for the resize protocol's settle time `L + 2 × command timeout`
//!   ([`crate::layout::Liveness::settle`]) *and* it has filled the new copies: it reads the
//!   family's copies from their primaries, takes the newest, and writes it to the new copies by
//!   the same compare-and-set a publish uses (so a fill never moves a copy backwards, and an
//!   edit that lands after it is kept). Why no reader is served a copy that missed an edit:
//!   every instance re-reads the records within L of the `w` record being written, and a
//!   publish that started with the older view ends within a command timeout, so after the settle
//!   time every publish writes the new copies; an edit made before that is on the family's
//!   copies, and the fill (made after the settle time) carries the newest of them. An instance
//!   that has not yet learned of the split writes only the family's copies, but no reader uses
//!   the new ones until it must have learned. The settle time is counted on the clock of the
//!   instance that moves the record, from the moment it first saw the phase, so clocks need not
//!   agree.
//! - **Leaving** (`m`): readers leave first: reads use the family's copies again, which every
//!   publish wrote all along (an edit on a split copy is on copy 0 too, as one publish writes
//!   both). Entered once no instance has seen the key hot for `split.cool_down` (each instance
//!   that sees it hot refreshes `seen_ms` every quarter of the cool-down).
//! - **Draining** (`d`): after the settle time (every reader has left), writers leave.
//! - After another settle time (no publish writes the split copies any more), the copies
//!   `family.copies..copies` are deleted and the record removed.
//!
//! **Older releases.** An instance of a release before per-key layouts reads no record and writes
//! only the family's copies. So every instance of this release keeps itself in each family's
//! *split set* (a live set of its own, `#hotsplit#live##split#<family>`, joined at startup before
//! the family's live set and refreshed every L), and a driver that sees fewer other members in
//! the split set than in the family's live set starts no split, admits no readers (`w` stays),
//! and moves `r` records to `m` at once, all decided by `record::decide` from `Facts::all_aware`
//! (tests: `split::no_key_splits_while_a_live_instance_does_not_know_of_splits`,
//! `split::tests::while_a_live_instance_knows_no_per_key_layouts_no_split_admits_readers_and_readers_leave`). An older instance that
//! starts while a key is `r` is seen within one L; edits it makes meanwhile miss the split copies
//! (a limit, below).
//!
//! A key hot again while `m` or `d` goes back to `w` (a new stage, so the settle time and the
//! fill start over: copies that stopped being written are refilled before anyone reads them);
//! one hot again after its record went is split anew the same way. A restart loses nothing: the
//! records are in the store, the restarted instance loads them before serving and any instance
//! continues the moves. Reads keep their guarantees across the moves: client floors and session
//! tokens are per key (`route::pins`), so a client that moves from copy `i` of N to copy `j` of
//! M keeps its floors, and the read path serves no copy below them (it falls back to siblings and
//! to copy 0); the near cache keeps entries and high-water versions per copy name, so a copy
//! read for the first time starts with no entry. Tombstones are versioned edits like values and
//! are filled and written the same way. Presence reads are refused on any family with a `split`
//! table (a split key's copies may disagree on presence), and config validation refuses such a
//! family whose default class decides on presence.
//!
//! Everything else that names copies follows the records too: the scrub ([`crate::heal::scrub`])
//! checks a split key's copies up to its split count from this index (only while its last read
//! is recent enough, [`SplitIndex::write_copies_read_since`]), and `hotsplit audit --config`
//! reads the hashes itself, counting copies beyond a key's split count as strays.
//!
//! Tests: `split::tests` (the state machine, the index, the driver on the embedded store) and
//! the integration tests `split::*` (split and merge on standalone Redis and a 3×3 cluster, two
//! instances learning at different moments, a restart mid-split, older releases).
//!
//! Limits: an instance of an older release that starts while a key is `r` is noticed within one
//! L, and readers of the split copies may miss its edits until then; an instance whose refreshes of the records fail keeps its last index (logged), and
//! is then not known to write a split it has not seen; an instance that has not read a family's
//! records once since it started refuses publishes to that family (503 `unavailable`) rather
//! than write only the family's copies (the resize protocol has the same limit
//! for its live sets); a retry-queue entry of a split copy may land after that copy was deleted
//! (it expires with its TTL); the family's shrink sweep skips split keys, but a family grow's
//! startup cleanup may delete split copies in its range (reads fall back and repair refills them).

pub mod config;
pub mod record;

pub use config::{SplitConfig, SplitMode};
pub use record::{Phase, SplitRecord};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::error::{Error, ErrorKind, Result};

/// Family name → key → record: every split key this instance knows of.
type Records = BTreeMap<String, HashMap<String, SplitRecord>>;

/// The per-key layouts this instance knows (see the module documentation).
#[derive(Debug, Default)]
pub struct SplitIndex {
    /// The records, replaced whole per family on each refresh.
    records: ArcSwap<Records>,
    /// Family name → its `split` table, as this instance's config says (for `/v1/hot-keys`).
    policies: ArcSwap<BTreeMap<String, SplitConfig>>,
    /// Family name → when the read of its records last loaded here was sent: the scrub writes
    /// split copies only from a view read recently enough (`crate::heal::scrub`). Behind a
    /// lock, not in `records`: only the refresh and the scrub's split keys take it, never a
    /// request.
    read_at: Mutex<HashMap<String, Instant>>,
    /// The families whose records this instance must read before it publishes to them
    /// ([`SplitIndex::expect`]) and has not read yet.
    unread: Mutex<HashSet<String>>,
    /// Whether `unread` holds any family: every publish's check is this one load while none.
    any_unread: AtomicBool,
}

impl SplitIndex {
    /// Sets the families' `split` tables.
    pub fn set_policies(&self, policies: BTreeMap<String, SplitConfig>) {
        self.policies.store(Arc::new(policies));
    }

    /// `family`'s `split` table, when it has one.
    pub fn policy(&self, family: &str) -> Option<SplitConfig> {
        self.policies.load().get(family).cloned()
    }

    /// The record of `key` in `family`, when split.
    pub fn record(&self, family: &str, key: &str) -> Option<SplitRecord> {
        let records = self.records.load();
        if records.is_empty() {
            return None;
        }
        records.get(family)?.get(key).copied()
    }

    /// The copies reads of `key` use, when more than its family's.
    pub fn read_copies(&self, family: &str, key: &str) -> Option<u32> {
        self.record(family, key)
            .filter(|record| record.phase.reads())
            .map(|record| record.copies)
    }

    /// The copies publishes of `key` write, when more than its family's.
    pub fn write_copies(&self, family: &str, key: &str) -> Option<u32> {
        self.record(family, key)
            .filter(|record| record.phase.writes())
            .map(|record| record.copies)
    }

    /// Every record of `family`.
    pub fn family(&self, family: &str) -> HashMap<String, SplitRecord> {
        self.records.load().get(family).cloned().unwrap_or_default()
    }

    /// Says that `families`' records must be read once before a publish to them: until then
    /// [`SplitIndex::ensure_read`] refuses it (the split driver calls this when it is made).
    pub fn expect<'a>(&self, families: impl IntoIterator<Item = &'a str>) {
        let mut unread = self.unread.lock().unwrap_or_else(PoisonError::into_inner);
        unread.extend(families.into_iter().map(str::to_owned));
        self.any_unread.store(!unread.is_empty(), Ordering::Release);
    }

    /// Whether a publish to `family` may go: its records were read at least once, or were
    /// never expected.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] while `family`'s records have not been read since startup:
    /// a split key's publish must write the copies other instances' readers use, and which
    /// keys are split (with how many copies) is only in the records. Writing a split policy's
    /// `max_copies` for every key instead would multiply every write and still miss a split
    /// another instance's policy made larger.
    pub fn ensure_read(&self, family: &str) -> Result<()> {
        if !self.any_unread.load(Ordering::Acquire) {
            return Ok(());
        }
        let unread = self.unread.lock().unwrap_or_else(PoisonError::into_inner);
        if !unread.contains(family) {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!("the split records of family {family} could not be read since this instance started, so a publish could miss the split copies other instances read; nothing was written, retry later"),
        ))
    }

    /// Replaces what is known of `family` with the records a read sent at `read_at` returned.
    pub fn load(&self, family: &str, records: HashMap<String, SplitRecord>, read_at: Instant) {
        self.replace(family, records);
        if self.any_unread.load(Ordering::Acquire) {
            let mut unread = self.unread.lock().unwrap_or_else(PoisonError::into_inner);
            if unread.remove(family) {
                tracing::info!(
                    family,
                    "the split records are read: publishes to the family go again"
                );
            }
            self.any_unread.store(!unread.is_empty(), Ordering::Release);
        }
        self.read_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(family.to_owned(), read_at);
    }

    /// The copies publishes of `key` write, when more than its family's, as records read from
    /// the store at or after `since` say: `None` too when `family`'s records were last read
    /// before `since` (a failing refresh) or never, since a merge may have deleted the copies
    /// meanwhile.
    pub fn write_copies_read_since(&self, family: &str, key: &str, since: Instant) -> Option<u32> {
        let copies = self.write_copies(family, key)?;
        let read_at = self
            .read_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(family)
            .copied()?;
        (read_at >= since).then_some(copies)
    }

    /// Replaces what is known of `family`.
    pub fn replace(&self, family: &str, records: HashMap<String, SplitRecord>) {
        self.records.rcu(|current| {
            let mut next = Records::clone(current);
            if records.is_empty() {
                next.remove(family);
            } else {
                next.insert(family.to_owned(), records.clone());
            }
            Arc::new(next)
        });
    }

    /// Records one key's record (`None`: removed) after this instance moved it.
    pub fn set(&self, family: &str, key: &str, record: Option<SplitRecord>) {
        let mut records = self.family(family);
        match record {
            Some(record) => records.insert(key.to_owned(), record),
            None => records.remove(key),
        };
        self.replace(family, records);
    }

    /// How many keys of `family` are split (in any phase).
    pub fn count(&self, family: &str) -> usize {
        self.records.load().get(family).map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests;
