//! Anti-entropy: a background scrub that walks the split families' keys, and the split keys of
//! the others, and repairs any copy that is missing or behind a sibling, so a copy whose heal
//! was lost (the spool of an instance that never came back, a master restarted empty, a lossy
//! failover) does not stay behind until it expires.
//!
//! A pass `SCAN`s every primary (`MATCH` on the prefixes of the families of more than one copy,
//! `TYPE hash`), then walks the split keys of the one-copy families from the split index (below:
//! a one-copy family has more copies only while split, so its keyspace is not scanned), reads
//! every copy `K#0..N` of each key found (under each naming its family writes), and writes the
//! newest record still served to the copies that are missing or older, through the same
//! compare-and-set as a publish ([`crate::store::CopyStore::write_copies`]) with that record's
//! own version, payload and `exp`.
//! So a repair never moves a copy backwards, a tombstone stays a tombstone, and nothing lives
//! longer than the newest copy of its edit; a copy past its own `exp` that holds the newest
//! version is left to expire ([`pass::repairs`]). Only copy keys of a valid key named as its
//! family's publishes name copies (`K#<digits>`, and `K#<digits>{tag}` too in a `spread` family,
//! whose keys are checked under both namings; see [`crate::placement`]) with an index below
//! the key's N are touched; a family whose layout record disagrees with this instance's config
//! is skipped while it does.
//!
//! **Split keys** ([`crate::split`]). A key's N is its family's copies, or its split copies
//! while publishes write them (phases writing, reading and leaving; not draining, nor after the
//! record went). The one-copy families walked are those whose `split` table is in mode
//! `split`, and those the index holds split keys of (split by an instance whose config
//! differs); their keys come from the index, the others' from the scan. The scrub learns the
//! layouts from the split index in [`Layouts::splits`] (refreshed by the split driver every
//! `heal.layout_interval`, L): no extra round trip, one look-up per key, made again just before
//! a key's copies are read and once more before its repairs are sent (a repair of a copy the
//! key no longer has is dropped). A copy beyond the layout is never written: the index is used
//! only while the last read of the
//! family's records was sent at most `split_index_max_age` (L + the command timeout `T`) ago.
//! Why that suffices: a merge deletes the split copies only a settle time (L + 2T) after the
//! draining record was written, on the mover's clock from when it saw it; a view that still
//! names the copies was read before that record, so a repair sent within L + T of that read
//! lands (within T) before the deletion. An instance whose refreshes fail thus stops scrubbing
//! split copies (its publishes keep writing them; `crate::split` names that limit).
//!
//! **One scrubber at a time.** The instances share one lease, `#hotsplit#lease#scrub`
//! (`FCALL hotsplit_lease_v2`: taken when free, renewed by its holder every third of
//! `scrub.lease_ttl`, never taken from a live holder). Only the holder scrubs, one pass every
//! `scrub.interval`, at most `scrub.max_keys_per_second` keys per second; the others try the
//! lease as often as the holder renews it, so a holder that dies is replaced within about one
//! `lease_ttl`. The lease saves work, not correctness: two scrubbers at once (a holder that
//! stalled past its lease) only repeat compare-and-sets, which never move a copy backwards.
//!
//! **What it cannot restore**: an edit none of whose copies landed (every copy queued in a
//! spool that was then lost) is on no copy, so there is nothing to copy; the copies keep the
//! previous version until the source publishes again or they expire.
//!
//! # Layout
//! - `mod.rs`: [`Scrubber`], the background task (lease, pacing, the walk).
//! - `pass.rs`: the pure parts: which patterns a pass walks, which keys it checks, which
//!   repairs a key's copies call for.
//! - `status.rs`: [`ScrubStatus`] (the metrics and what `GET /v1/scrub` shows).
//! - `config.rs`: [`ScrubConfig`], `[scrub]`.

pub mod config;
mod pass;
pub mod status;

pub use config::ScrubConfig;
pub use status::{PassFigures, ScrubStatus, ScrubView};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use crate::family::{Families, Family};
use crate::key::{Key, Placement};
use crate::store::{now_unix_ms, CasOutcome, CopyStore, Lease, ScrubStore};

use super::health::NodeHealth;
use crate::layout::Layouts;
use status::ScrubFailure;

/// The name of the scrub's lease.
pub(crate) const LEASE: &str = "scrub";

/// How many keys one `SCAN` call asks a node for.
const SCAN_COUNT: u32 = 100;

/// The most keys a pass remembers as checked (a key's copies live on several nodes, so several
/// nodes' scans find it); past this the memory is cleared, which costs only repeated checks.
const SEEN_LIMIT: usize = 1_000_000;

/// The background scrub of one instance.
pub struct Scrubber {
    /// Where the copies live (through node health, so a failing node costs no timeout).
    pub copies: Arc<dyn CopyStore>,
    /// The walk over every primary's keys, and the lease.
    pub scan: Arc<dyn ScrubStore>,
    /// Which nodes are failing: a failing node's scan would wait out the command timeout, so
    /// the walk skips it until the next pass (and a scan that times out marks it failing).
    pub health: Arc<NodeHealth>,
    /// The families: which keys are split, and into how many copies.
    pub families: Arc<Families>,
    /// The recorded layouts: a family in mismatch is skipped.
    pub layouts: Arc<Layouts>,
    /// Counters and the view.
    pub status: Arc<ScrubStatus>,
    /// `[scrub]`.
    pub config: ScrubConfig,
    /// This instance's name as a lease holder.
    pub instance: String,
    /// How old the split index of a family may be when the scrub writes the split copies it
    /// names: `heal.layout_interval` + `store.command_timeout` (see the module documentation).
    pub split_index_max_age: Duration,
}

/// One pass's progress: when it started, its pace, and the keys it checked (by hash, at most
/// `SEEN_LIMIT`, so a key found twice is checked once).
struct Walk {
    /// When the pass started.
    started: Instant,
    /// Its pace.
    pacer: Pacer,
    /// The keys checked so far.
    seen: HashSet<u64>,
}

/// Spaces key checks `1 / rate` apart on average.
struct Pacer {
    /// The time one key is worth.
    per_key: Duration,
    /// When the next key may start.
    next: tokio::time::Instant,
}

impl Pacer {
    /// Waits for the next key's turn.
    async fn admit(&mut self) {
        let now = tokio::time::Instant::now();
        // A pass that fell behind (slow reads) does not burst to catch up.
        let start = self.next.max(now);
        self.next = start + self.per_key;
        tokio::time::sleep_until(start).await;
    }
}

/// The lease as a pass sees it: held since the last renewal, or not taken at all (a pass run
/// directly, in tests).
struct LeaseClock {
    /// When the lease must be renewed next; `None`: the pass holds no lease.
    renew_at: Option<Instant>,
}

impl Scrubber {
    /// Runs until `shutdown`: tries the lease every third of `scrub.lease_ttl` and, while it
    /// holds it, starts a pass every `scrub.interval` (the first one interval after it
    /// starts). Releases the lease when it stops.
    pub async fn run(self, shutdown: CancellationToken) {
        let renewal = self.config.lease_renewal();
        let mut ticker = tokio::time::interval(renewal);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first pass starts one interval after startup: a fleet that restarts together
        // does not scrub at once, and a short-lived instance does not scrub at all.
        let mut next_pass = Instant::now() + self.config.interval;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if !self.take_lease().await || Instant::now() < next_pass {
                continue;
            }
            next_pass = Instant::now() + self.config.interval;
            let mut clock = LeaseClock {
                renew_at: Some(Instant::now() + renewal),
            };
            self.walk(&shutdown, &mut clock).await;
            ticker.reset();
        }
        if self.status.view().holds_lease {
            // A clean stop hands the lease on at once rather than after its ttl.
            match self.scan.hold_lease(LEASE, &self.instance, 0).await {
                Ok(_) => self.status.lease(None),
                Err(err) => tracing::debug!(error = %err, "cannot release the scrub lease"),
            }
        }
    }

    /// Runs one pass now without the lease (for tests): every key, at the configured
    /// rate, until done or `shutdown`. Returns its figures.
    #[cfg(any(test, feature = "test-util"))]
    pub async fn pass(&self, shutdown: &CancellationToken) -> PassFigures {
        self.walk(shutdown, &mut LeaseClock { renew_at: None })
            .await;
        self.status.view().last.unwrap_or_default()
    }

    /// Takes or renews the lease; whether this instance holds it.
    async fn take_lease(&self) -> bool {
        let ttl_ms = crate::duration::millis(self.config.lease_ttl);
        match self.scan.hold_lease(LEASE, &self.instance, ttl_ms).await {
            Ok(Lease::Held) => {
                if !self.status.view().holds_lease {
                    tracing::info!(instance = %self.instance, "took the scrub lease");
                }
                self.status.lease(Some(self.instance.clone()));
                true
            }
            Ok(Lease::Taken { holder }) => {
                if self.status.view().holds_lease {
                    tracing::warn!(holder = %holder, "lost the scrub lease");
                }
                self.status.lease(Some(holder));
                false
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot take or renew the scrub lease");
                self.status.lease(None);
                false
            }
        }
    }

    /// Renews the lease when due; false when it was lost (the pass stops).
    async fn keep_lease(&self, clock: &mut LeaseClock) -> bool {
        match clock.renew_at {
            Some(at) if Instant::now() >= at => {
                clock.renew_at = Some(Instant::now() + self.config.lease_renewal());
                self.take_lease().await
            }
            _ => true,
        }
    }

    /// One pass over every pattern and node, counted in the status.
    async fn walk(&self, shutdown: &CancellationToken, clock: &mut LeaseClock) {
        let started = Instant::now();
        let paused = self.layouts.mismatches();
        if !paused.is_empty() {
            tracing::info!(families = ?paused, "scrub skips families whose layout record disagrees with this instance");
        }
        self.status.start(now_unix_ms(), paused.clone());
        let pacer = Pacer {
            per_key: Duration::from_secs(1) / self.config.max_keys_per_second.max(1),
            next: tokio::time::Instant::now(),
        };
        let mut complete = true;
        let splits = self.layouts.splits();
        let mut walk = Walk {
            started,
            pacer,
            seen: HashSet::new(),
        };
        'walk: {
            for pattern in pass::patterns(&self.families) {
                for node in self.scan.scan_nodes() {
                    let mut cursor = 0;
                    loop {
                        if shutdown.is_cancelled() || !self.keep_lease(clock).await {
                            complete = false;
                            break 'walk;
                        }
                        let page = match self
                            .health
                            .unless_failing(
                                &node,
                                || format!("scan for {pattern}"),
                                self.scan.scan_page(&node, cursor, &pattern, SCAN_COUNT),
                            )
                            .await
                        {
                            Ok(page) => page,
                            Err(err) => {
                                tracing::warn!(node = %node, error = %err, "scrub scan failed: the rest of this node waits for the next pass");
                                self.status.failed(ScrubFailure::Scan);
                                complete = false;
                                break;
                            }
                        };
                        self.status.scanned(page.keys.len() as u64);
                        for stored in &page.keys {
                            let Some((key, family)) = pass::checked_key(
                                stored,
                                &self.families,
                                &paused,
                                |family, key| self.split_copies(family, key),
                            ) else {
                                continue;
                            };
                            if !self.visit(&key, family, &mut walk, shutdown).await {
                                complete = false;
                                break 'walk;
                            }
                        }
                        cursor = page.next;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
            }
            // A one-copy family has more copies only while split: its split keys are walked
            // from the index, with no scan of the keyspace.
            for family in pass::indexed(&self.families, |family| splits.count(family) > 0) {
                if paused.iter().any(|name| name == family.name()) {
                    continue;
                }
                let mut keys: Vec<String> = splits.family(family.name()).into_keys().collect();
                keys.sort();
                self.status.scanned(keys.len() as u64);
                for raw in keys {
                    if shutdown.is_cancelled() || !self.keep_lease(clock).await {
                        complete = false;
                        break 'walk;
                    }
                    let Ok(key) = Key::parse(&raw) else {
                        continue;
                    };
                    if self
                        .split_copies(family, &key)
                        .is_none_or(|copies| copies <= 1)
                    {
                        continue;
                    }
                    if !self.visit(&key, family, &mut walk, shutdown).await {
                        complete = false;
                        break 'walk;
                    }
                }
            }
        }
        let duration = started.elapsed();
        self.status.finish(duration, complete);
        tracing::debug!(?duration, complete, "scrub pass finished");
    }

    /// Checks `key` of `family` once a pass (paced), under each naming its publishes write;
    /// `false` when the pass must stop (shutdown).
    async fn visit(
        &self,
        key: &Key,
        family: &Family,
        walk: &mut Walk,
        shutdown: &CancellationToken,
    ) -> bool {
        if walk.seen.len() >= SEEN_LIMIT {
            walk.seen.clear();
        }
        if !walk
            .seen
            .insert(xxhash_rust::xxh3::xxh3_64(key.as_str().as_bytes()))
        {
            return true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = walk.pacer.admit() => {}
        }
        // The namings publishes write are kept: both while a `spread` family's compatibility
        // window is open, the tagged ones only once it closed (its `K#i` is deleted, and a
        // repair must not bring back a copy no publish keeps current, `layout::placing`).
        for &placement in self.layouts.write_placements(family) {
            self.check(key, family, placement).await;
        }
        self.status.tick(walk.started.elapsed());
        true
    }

    /// The split copies of `key` publishes write, as a split index read within
    /// `split_index_max_age` says (`None`: not split, or the index is older).
    fn split_copies(&self, family: &Family, key: &Key) -> Option<u32> {
        let since = Instant::now().checked_sub(self.split_index_max_age)?;
        self.layouts
            .splits()
            .write_copies_read_since(family.name(), key.as_str(), since)
    }

    /// Reads every copy of `key` (named under `placement`) and repairs those missing or behind.
    /// Its copy count is looked up now (the scan found the key a while ago), and again before
    /// the repairs are sent: a split copy that stopped being written meanwhile is not written.
    async fn check(&self, key: &Key, family: &Family, placement: Placement) {
        let copies = pass::copy_count(family, self.split_copies(family, key));
        if copies <= 1 {
            return;
        }
        let copy_keys: Vec<_> = (0..copies)
            .map(|index| key.copy_key(index, placement))
            .collect();
        let reads = join_all(
            copy_keys
                .iter()
                .map(|copy_key| self.copies.read_copy_stored(copy_key)),
        )
        .await;
        self.status.checked();
        let reads: Vec<_> = reads
            .into_iter()
            .map(|read| {
                read.map_err(|err| {
                    tracing::debug!(key = %key, error = %err, "scrub read failed");
                    self.status.failed(ScrubFailure::Read);
                })
            })
            .collect();
        let mut planned = pass::repairs(key, placement, &reads, now_unix_ms());
        let limit = pass::copy_count(family, self.split_copies(family, key));
        planned.retain(|(write, _)| write.copy_key.index() < limit);
        if planned.is_empty() {
            return;
        }
        let writes: Vec<_> = planned.iter().map(|(write, _)| write.clone()).collect();
        let results = self.copies.write_copies(&writes).await;
        for ((write, cause), result) in planned.iter().zip(results) {
            match result.outcome {
                Ok(CasOutcome::Applied) => {
                    tracing::info!(copy_key = %write.copy_key, version = %write.version, cause = cause.as_str(), "scrub repaired a copy");
                    self.status.repaired(*cause);
                }
                // A write or another repair got there first: nothing to do.
                Ok(
                    CasOutcome::Current | CasOutcome::Stale { .. } | CasOutcome::Conflict { .. },
                ) => {}
                Err(err) => {
                    tracing::debug!(copy_key = %write.copy_key, error = %err, "scrub repair failed");
                    self.status.failed(ScrubFailure::Write);
                }
            }
        }
    }
}
