//! The read path's use of the near cache: hits, single-flight fills, floors and high-water
//! versions.
//!
//! A read uses the near cache when its class has a near-cache max age and no request pin sends
//! it to the primary (a pin has no version an entry could be checked against); a read of a named
//! copy uses that copy's entry like an affine read (an operator who wants what Redis holds names
//! the `primary` class). Then, for the affine (or named) copy:
//! 1. an entry whose age bound is within the class's max age and whose version meets every
//!    floor the read carries answers (a hit); a hit within one fill time of the max age (up
//!    to `near_cache.refresh_lead_max` of it) also starts a background refresh;
//! 2. an entry young enough that misses a floor is not used: the copy is read from Redis as
//!    without a cache (counted as a floor read), and what Redis holds is offered to the cache;
//! 3. otherwise the read waits for the one fill of the copy from its source (a replica within
//!    the class's budget, else the primary), started by the first miss and shared by every
//!    concurrent one (a miss that finds no fill because one just ended is answered by the
//!    entry it left, looked up again under the fills' lock); a fill below the copy's
//!    high-water version is re-read from the primary. A read whose floor (or the high-water
//!    version) the fill does not meet reads Redis as without a cache.
//!
//! The high-water version joins the read's floor for the sibling fallback, so the affine copy
//! set back (by hand, or by a restart that lost writes) is not served while a sibling holds
//! more. When no consulted copy reaches it the older version is served, counted as a rollback,
//! and the copy's entry and record are dropped so later fills take what Redis holds now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt};

use super::consult::{breach, Floors};
use super::prepare::Prepared;
use super::{Consulted, Decision, ReadAnswer, Reader};
use crate::error::Result;
use crate::key::{CopyKey, Key, Version};
use crate::near::{Entry, Filled, Flight, Lookup, NearCache, Now, Offer};
use crate::route::{Plan, RouteReason, Target};
use crate::store::{CopyRead, CopyRecord, CopyStore, Role};

/// What the near cache gave a read for its affine copy.
pub(super) struct NearConsult {
    /// The affine copy's record, from the cache, a fill or a store read.
    pub(super) consulted: Consulted,
    /// The entry's age bound when the answer came from the cache.
    pub(super) age: Option<Duration>,
    /// The copy's high-water version when the read began.
    pub(super) high_water: Option<Version>,
}

/// Where a fill reads the copy.
enum FillSource {
    /// A replica within the class's budget, and its lag when the fill began.
    Replica {
        /// The replica.
        node: crate::store::NodeLabel,
        /// Its current lag.
        lag: Duration,
    },
    /// The primary, for this reason.
    Primary(RouteReason),
}

/// Whether `record` (`None`: the copy is missing) is below `floor`.
fn below(record: Option<&CopyRecord>, floor: Option<Version>) -> bool {
    match (record, floor) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(record), Some(floor)) => record.version < floor,
    }
}

impl Reader {
    /// The affine copy of `key` from its near-cache entry, when the read may use the cache and
    /// the entry is young enough for the class and meets every floor (step 1 of the module
    /// doc): counted as a hit, and a refresh started when one is due. No store call, and the
    /// copy's key is built on the stack (an owned one only for a refresh). `None` when the read
    /// needs the store, and, uncounted, when the entry is below `held_to` and a primary filled
    /// it (an answer the rollback guard would read again: `Reader::read_now`). The entry's
    /// expiry and age are taken by `now`, the read's clock (read here, and only for a class
    /// with a near cache, when the caller has none).
    pub(super) fn consult_near_hit(
        &self,
        key: &Key,
        prepared: &Prepared<'_>,
        held_to: Option<Version>,
        now: Option<Now>,
    ) -> Option<NearConsult> {
        let (near, max_age) = prepared.near?;
        let now = now.unwrap_or_else(Now::read);
        let copy = prepared.affine;
        let placement = self.read_placement(key);
        let Lookup::Fresh(entry, age) = key.with_copy_key_text(copy, placement, |copy_key| {
            near.lookup_text_at(copy_key, max_age, now)
        }) else {
            return None;
        };
        if below(Some(&entry.record), prepared.preferred)
            || (below(Some(&entry.record), held_to) && entry.served_by.role == Role::Primary)
        {
            return None;
        }
        Some(self.serve_entry(near, (&entry, age), prepared, || self.copy_key(key, copy)))
    }

    /// Answers the affine copy from its fresh near-cache `entry`, `age` old: counted as a hit,
    /// and a refresh of the copy (whose key `copy_key` builds, only then) started when one is
    /// due within the class's max age.
    fn serve_entry(
        &self,
        near: &Arc<NearCache>,
        (entry, age): (&Entry, Duration),
        prepared: &Prepared<'_>,
        copy_key: impl FnOnce() -> CopyKey,
    ) -> NearConsult {
        let plan = &prepared.plan;
        near.served(entry, plan.class, age);
        if prepared
            .near
            .is_some_and(|(_, max_age)| near.refresh_due(entry, age, max_age))
        {
            self.refresh(near, &copy_key(), plan);
        }
        NearConsult {
            consulted: Consulted {
                copy: prepared.affine,
                read: CopyRead {
                    served_by: entry.served_by.clone(),
                    record: Ok(Some(entry.record.clone())),
                },
                reason: entry.reason,
            },
            age: Some(age),
            high_water: Some(entry.record.version),
        }
    }

    /// Consults the affine copy of `key` through the near cache (see the module doc), for a read
    /// whose class has a near-cache max age.
    pub(super) async fn consult_near(
        &self,
        key: &Key,
        prepared: &Prepared<'_>,
    ) -> Result<NearConsult> {
        let Prepared {
            affine: copy,
            ref plan,
            preferred: floor,
            near: Some((near, max_age)),
            ..
        } = *prepared
        else {
            // Not a read the cache may answer: the copy as without a cache.
            let consulted = self
                .consult(key, prepared.affine, Floors::of(prepared))
                .await?;
            return Ok(NearConsult {
                consulted,
                age: None,
                high_water: None,
            });
        };
        let floors = Floors::of(prepared);
        let copy_key = self.copy_key(key, copy);
        if let Lookup::Fresh(entry, age) = near.lookup(&copy_key, max_age) {
            return self
                .answer_entry(near, (key, &copy_key), (&entry, age), prepared)
                .await;
        }
        let high_water = near.high_water(&copy_key);
        let Some((source, label)) = self.fill_source(plan, &copy_key)? else {
            // The replica's lag is unknown again (a topology change): no fill.
            let consulted = self
                .consult_offered(near, key, copy, floors.at_least(high_water))
                .await?;
            return Ok(NearConsult {
                consulted,
                age: None,
                high_water,
            });
        };
        let flight = near.fill(&copy_key, &label, Some(max_age), || {
            fill(
                self.store.clone(),
                near.clone(),
                copy_key.clone(),
                source,
                high_water,
            )
        });
        let filling = match flight {
            Flight::Joined(filling) => {
                near.metrics().coalesced.inc();
                filling
            }
            Flight::Started(filling) => {
                near.metrics().misses.inc();
                filling
            }
            // A fill ended between the lookup above and the join: its entry answers.
            Flight::Landed((entry, age)) => {
                return self
                    .answer_entry(near, (key, &copy_key), (&entry, age), prepared)
                    .await;
            }
        };
        if let Some(filled) = filling.await {
            let usable = match &filled.read.record {
                Ok(record) => !below(record.as_ref(), floor) && !below(record.as_ref(), high_water),
                // The fill already fell back to the primary: siblings answer next.
                Err(_) => true,
            };
            if usable {
                return Ok(NearConsult {
                    consulted: Consulted {
                        copy,
                        read: filled.read.clone(),
                        reason: filled.reason,
                    },
                    age: None,
                    high_water,
                });
            }
        }
        let consulted = self
            .consult_offered(near, key, copy, floors.at_least(high_water))
            .await?;
        Ok(NearConsult {
            consulted,
            age: None,
            high_water,
        })
    }

    /// Answers a read from a fresh `entry` of its affine copy, or, when the entry is below the
    /// reader's floor, from the copy read at or above the floor and the copy's high-water mark.
    async fn answer_entry(
        &self,
        near: &Arc<NearCache>,
        (key, copy_key): (&Key, &CopyKey),
        (entry, age): (&Arc<Entry>, Duration),
        prepared: &Prepared<'_>,
    ) -> Result<NearConsult> {
        if !below(Some(&entry.record), prepared.preferred) {
            return Ok(self.serve_entry(near, (entry, age), prepared, || copy_key.clone()));
        }
        near.metrics().floor_reads.inc();
        let high_water = near.high_water(copy_key);
        let floors = Floors::of(prepared).at_least(high_water);
        let consulted = self
            .consult_offered(near, key, prepared.affine, floors)
            .await?;
        Ok(NearConsult {
            consulted,
            age: None,
            high_water,
        })
    }

    /// Consults one copy as without a cache, and offers what it found.
    async fn consult_offered(
        &self,
        near: &Arc<NearCache>,
        key: &Key,
        copy: u32,
        floors: Floors<'_>,
    ) -> Result<Consulted> {
        let started = Instant::now();
        let consulted = self.consult(key, copy, floors).await?;
        self.offer(near, key, &consulted, started);
        Ok(consulted)
    }

    /// Offers what a consult that began at `started` found to the cache: as of `started`, less
    /// the replica's current lag when a replica served (nothing is offered when that lag is
    /// unknown), filled in the time since `started`.
    pub(super) fn offer(
        &self,
        near: &NearCache,
        key: &Key,
        consulted: &Consulted,
        started: Instant,
    ) {
        let Ok(Some(record)) = &consulted.read.record else {
            return;
        };
        let copy_key = self.copy_key(key, consulted.copy);
        let as_of = match consulted.read.served_by.role {
            Role::Replica => {
                let primary = self.store.node_of(&copy_key);
                let Some(lag) = self
                    .router
                    .replica_lag(&primary, &consulted.read.served_by.node)
                else {
                    return;
                };
                started.checked_sub(lag).unwrap_or(started)
            }
            Role::Primary | Role::Embedded => started,
        };
        near.offer(
            &copy_key,
            Offer {
                record: record.clone(),
                served_by: consulted.read.served_by.clone(),
                reason: consulted.reason,
                as_of,
                fill_time: Some(started.elapsed()),
            },
        );
    }

    /// After a read of the affine copy decided: when the answer is below the copy's high-water
    /// version (every consulted copy was set back), the copy whose near-cache entry and record
    /// the rollback voids (the after-answer step drops them, [`Reader::void_near`], so the next
    /// fill takes what the copies hold now).
    pub(super) fn rollback_of(
        &self,
        key: &Key,
        affine: u32,
        high_water: Option<Version>,
        decision: &Result<Decision>,
    ) -> Option<CopyKey> {
        let high_water = high_water?;
        let served = match decision {
            Ok(Decision::Answer(
                ReadAnswer::Value { version, .. } | ReadAnswer::NotModified { version, .. },
            ))
            | Ok(Decision::Invalidated { version, .. }) => Some(*version),
            Err(err) if err.kind() == crate::ErrorKind::NotFound => None,
            Err(_) => return None,
        };
        if served.is_some_and(|served| served >= high_water) {
            return None;
        }
        let copy_key = self.copy_key(key, affine);
        tracing::warn!(copy_key = %copy_key, high_water = %high_water, served = ?served.map(|v| v.get()), "every consulted copy is below the version this instance served: serving the older one (a rollback)");
        Some(copy_key)
    }

    /// Drops `copy_key`'s near-cache entry and record after a rollback ([`Reader::rollback_of`]).
    /// Called by the after-answer step only (`crate::ops`).
    pub fn void_near(&self, copy_key: &CopyKey) {
        if let Some(near) = &self.near {
            near.forget(copy_key);
        }
    }

    /// Where a fill of `copy_key` under `plan` reads, with the source's label: `None` when the
    /// chosen replica's lag is not known (it left the topology).
    ///
    /// # Errors
    /// [`crate::ErrorKind::StalenessBudgetExceeded`] when the class fails over budget.
    fn fill_source(
        &self,
        plan: &Plan,
        copy_key: &CopyKey,
    ) -> Result<Option<(FillSource, crate::store::NodeLabel)>> {
        let primary = self.store.node_of(copy_key);
        Ok(match self.router.target(plan, &primary) {
            Target::Replica(replica) => self.router.replica_lag(&primary, &replica).map(|lag| {
                (
                    FillSource::Replica {
                        node: replica.clone(),
                        lag,
                    },
                    replica,
                )
            }),
            Target::Primary(reason) => Some((FillSource::Primary(reason), primary)),
            Target::Breach { lag, budget } => return Err(breach(lag, budget)),
        })
    }

    /// Starts a background refresh of `copy_key`'s entry from where `plan` reads it, unless a
    /// fill of it from there is in flight.
    fn refresh(&self, near: &Arc<NearCache>, copy_key: &CopyKey, plan: &Plan) {
        let Ok(Some((source, label))) = self.fill_source(plan, copy_key) else {
            return;
        };
        let high_water = near.high_water(copy_key);
        let flight = near.fill(copy_key, &label, None, || {
            fill(
                self.store.clone(),
                near.clone(),
                copy_key.clone(),
                source,
                high_water,
            )
        });
        if matches!(flight, Flight::Started(_)) {
            near.metrics().refreshes.inc();
        }
    }
}

/// One fill: reads `copy_key` from `source`; a replica's copy below `high_water` (or failing)
/// is re-read from the primary. What it finds is offered to `near`, as of the start of the
/// read that found it less the replica's lag.
fn fill(
    store: Arc<dyn CopyStore>,
    near: Arc<NearCache>,
    copy_key: CopyKey,
    source: FillSource,
    high_water: Option<Version>,
) -> BoxFuture<'static, Filled> {
    async move {
        let started = Instant::now();
        // The read that answered, when it began, and the lag of its source.
        let (read, reason, began, lag) = match source {
            FillSource::Replica { node, lag } => {
                let read = store.read_replica_copy(&copy_key, &node).await;
                match &read.record {
                    Ok(record) if !below(record.as_ref(), high_water) => {
                        (read, RouteReason::Class, started, lag)
                    }
                    Ok(_) => {
                        near.metrics().below_high_water.inc();
                        let again = Instant::now();
                        (
                            store.read_copy(&copy_key).await,
                            RouteReason::VersionFloor,
                            again,
                            Duration::ZERO,
                        )
                    }
                    Err(err) => {
                        tracing::debug!(copy_key = %copy_key, replica = %node, error = %err, "replica fill failed; reading the primary");
                        let again = Instant::now();
                        (
                            store.read_copy(&copy_key).await,
                            RouteReason::NoReplica,
                            again,
                            Duration::ZERO,
                        )
                    }
                }
            }
            FillSource::Primary(reason) => (
                store.read_copy(&copy_key).await,
                reason,
                started,
                Duration::ZERO,
            ),
        };
        let fill_time = began.elapsed();
        if let Ok(Some(record)) = &read.record {
            if below(Some(record), high_water) {
                near.metrics().below_high_water.inc();
            } else {
                near.offer(&copy_key, Offer { record: record.clone(), served_by: read.served_by.clone(), reason, as_of: began.checked_sub(lag).unwrap_or(began), fill_time: Some(fill_time) });
            }
        }
        Filled { read, reason }
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::family::fixture;
    use crate::metrics::Metrics;
    use crate::near::{NearCacheConfig, NearMetrics};
    use crate::publish::{Publisher, VersionChoice};
    use crate::read::{Caller, ReadRequest};
    use crate::route::Router;
    use crate::store::memory::MemoryStore;
    use crate::store::now_unix_ms;
    use crate::ErrorKind;

    const CONFIG: &str = "[[family]]\nprefix = \"p:\"\ncopies = 8\ndefault_class = \"advisory\"\n[classes.advisory]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"250ms\"\nnear_cache_max_age = \"40ms\"";

    impl Fixture {
        fn reader(&self) -> &Reader {
            &self.reader
        }

        fn publisher(&self) -> &Publisher {
            &self.publisher
        }

        /// Reads as a caller with no session ([`Reader::read_for_tests`]).
        async fn read_raw(&self, request: &ReadRequest) -> Result<ReadAnswer> {
            self.reader.read_for_tests(request).await
        }
    }

    struct Fixture {
        store: Arc<MemoryStore>,
        publisher: Publisher,
        reader: Reader,
        near: Arc<NearCache>,
    }

    fn fixture() -> Fixture {
        let config = crate::route::fixture::sections(CONFIG);
        config.route.validate().unwrap();
        let families = Arc::new(fixture::families(CONFIG));
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        let router = Arc::new(Router::for_tests(
            &config.route,
            &config.classes,
            families.clone(),
        ));
        let near = Arc::new(NearCache::new(
            &NearCacheConfig::default(),
            NearMetrics::detached(&router.classes()),
            TaskTracker::new(),
        ));
        Fixture {
            publisher: Publisher::new(store.clone(), families.clone(), metrics.clone())
                .with_near_cache(near.clone()),
            reader: Reader::new(
                store.clone(),
                families,
                crate::read::ReadConfig::default(),
                metrics,
                router,
            )
            .with_near_cache(near.clone()),
            store,
            near,
        }
    }

    fn key() -> Key {
        Key::parse("p:1").unwrap()
    }

    fn v(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    fn request(client: &str) -> ReadRequest {
        ReadRequest {
            key: key(),
            caller: Caller::Client(client.into()),
            min_version: None,
            if_none_match: None,
            class: None,
            request_id: None,
            deadline: None,
        }
    }

    /// The version read and whether the near cache answered.
    async fn read(fixture: &Fixture, request: &ReadRequest) -> Result<(u64, bool)> {
        match fixture.read_raw(request).await? {
            ReadAnswer::Value { version, route, .. }
            | ReadAnswer::NotModified { version, route, .. } => {
                Ok((version.get(), route.near_cache_age.is_some()))
            }
        }
    }

    async fn publish(fixture: &Fixture, n: u64) {
        fixture
            .publisher()
            .publish(
                &key(),
                VersionChoice::Given(v(n)),
                Bytes::from(format!("value {n}")),
            )
            .await
            .unwrap();
    }

    /// Sets copy `copy` to version `n` by hand, bypassing the compare-and-set.
    fn set_copy(fixture: &Fixture, copy: u32, n: u64) {
        fixture.store.overwrite_for_test(
            &key().copy_key(copy, crate::key::Placement::Suffix),
            Some(CopyRecord {
                version: v(n),
                payload: crate::store::Payload::Value(Bytes::from(format!("value {n}"))),
                expire_at_ms: now_unix_ms() + 60_000,
            }),
        );
    }

    /// Waits until the entry of `copy` is older than the class's 40 ms.
    async fn age_out(fixture: &Fixture, copy: u32) {
        let copy_key = key().copy_key(copy, crate::key::Placement::Suffix);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(
            fixture.near.lookup(&copy_key, Duration::from_millis(40)),
            Lookup::Fresh(..)
        ) {
            assert!(Instant::now() < deadline, "the entry never aged out");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_publish_through_the_instance_is_seen_by_the_next_read_and_the_cache_answers() {
        let fixture = fixture();
        publish(&fixture, 5).await;
        // The publish offered every copy: the first read is already a hit.
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (5, true));
        let affine = crate::affinity::copy_index("alice", 8);
        // A change behind the instance's back is not seen within the max age...
        set_copy(&fixture, affine, 6);
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (5, true));
        // ...a publish through it is, at once.
        publish(&fixture, 7).await;
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (7, true));
        assert!(fixture.near.metrics().hits.get() >= 3);
    }

    #[tokio::test]
    async fn a_floor_above_the_entry_reads_the_store_and_raises_the_entry() {
        let fixture = fixture();
        publish(&fixture, 5).await;
        let affine = crate::affinity::copy_index("alice", 8);
        set_copy(&fixture, affine, 6);
        let mut floored = request("alice");
        floored.min_version = Some(v(6));
        assert_eq!(read(&fixture, &floored).await.unwrap(), (6, false));
        assert_eq!(fixture.near.metrics().floor_reads.get(), 1);
        // The store's answer became the entry.
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (6, true));
        // If-None-Match is a floor too.
        let mut tagged = request("alice");
        tagged.if_none_match = Some(v(9));
        let err = fixture.read_raw(&tagged).await;
        assert!(
            matches!(err, Ok(ReadAnswer::NotModified { route, .. }) if route.near_cache_age.is_none())
        );
    }

    #[tokio::test]
    async fn request_pins_and_primary_classes_bypass_the_cache_and_named_copies_use_it() {
        let fixture = fixture();
        publish(&fixture, 5).await;
        fixture
            .reader()
            .router()
            .record_write(&key(), v(5), None, Some("req-1"));
        let mut pinned = request("alice");
        pinned.request_id = Some("req-1".into());
        assert_eq!(read(&fixture, &pinned).await.unwrap(), (5, false));
        let mut named = request("alice");
        named.caller = Caller::Named(3);
        assert_eq!(read(&fixture, &named).await.unwrap(), (5, true));
        let mut primary = request("alice");
        primary.class = Some("primary".into());
        assert_eq!(read(&fixture, &primary).await.unwrap(), (5, false));
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (5, true));
    }

    #[tokio::test]
    async fn an_invalidation_leaves_a_tombstone_entry_that_an_older_fill_cannot_replace() {
        let fixture = fixture();
        publish(&fixture, 5).await;
        fixture
            .publisher()
            .invalidate(&key(), VersionChoice::Given(v(6)))
            .await
            .unwrap();
        // A fill that began before the invalidation lands after it, with the old value.
        let affine = crate::affinity::copy_index("alice", 8);
        let taken = fixture.near.offer(
            &key().copy_key(affine, crate::key::Placement::Suffix),
            Offer {
                record: CopyRecord {
                    version: v(5),
                    payload: crate::store::Payload::Value(Bytes::from_static(b"value 5")),
                    expire_at_ms: now_unix_ms() + 60_000,
                },
                served_by: crate::store::ServedBy::embedded(),
                reason: RouteReason::Class,
                as_of: Instant::now(),
                fill_time: Some(Duration::from_millis(1)),
            },
        );
        assert!(!taken);
        let err = fixture.read_raw(&request("alice")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert_eq!(err.invalidated_at(), Some(6));
    }

    #[tokio::test]
    async fn a_copy_set_back_after_its_entry_aged_out_is_not_served_while_a_sibling_holds_more() {
        let fixture = fixture();
        publish(&fixture, 5).await;
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (5, true));
        let affine = crate::affinity::copy_index("alice", 8);
        set_copy(&fixture, affine, 4);
        age_out(&fixture, affine).await;
        // The refill finds 4, below the 5 this instance served: a sibling's 5 answers.
        assert_eq!(read(&fixture, &request("alice")).await.unwrap(), (5, false));
        assert!(fixture.near.metrics().below_high_water.get() >= 1);
        // Every copy set back (a restart that lost the write). Alice now holds a seen floor
        // of 5 (her read moved to a sibling), so she is refused rather than sent back; a reader
        // of the same copy without a floor is served the older version, counted as a
        // rollback, and the cache starts again from what the copies hold.
        for copy in 0..8 {
            set_copy(&fixture, copy, 4);
        }
        age_out(&fixture, affine).await;
        let err = read(&fixture, &request("alice")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BelowVersionFloor);
        let bob = (0..1000)
            .map(|n| format!("reader-{n}"))
            .find(|client| crate::affinity::copy_index(client, 8) == affine)
            .unwrap();
        age_out(&fixture, affine).await;
        assert_eq!(read(&fixture, &request(&bob)).await.unwrap(), (4, false));
        assert_eq!(fixture.near.metrics().rollbacks.get(), 1);
        // The next read refills the copy's entry, the one after is answered from it.
        assert_eq!(read(&fixture, &request(&bob)).await.unwrap(), (4, false));
        assert_eq!(read(&fixture, &request(&bob)).await.unwrap(), (4, true));
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_fill() {
        let fixture = Arc::new(fixture());
        // Written behind the instance's back: nothing is cached.
        for copy in 0..8 {
            set_copy(&fixture, copy, 3);
        }
        let reads = (0..200).map(|_| {
            let fixture = fixture.clone();
            async move { read(&fixture, &request("alice")).await.unwrap() }
        });
        let answers = futures_util::future::join_all(reads).await;
        assert!(answers.iter().all(|(version, _)| *version == 3));
        let metrics = fixture.near.metrics();
        assert_eq!(
            metrics.misses.get() + metrics.coalesced.get() + metrics.hits.get(),
            200
        );
        assert_eq!(metrics.misses.get(), 1, "one fill");
    }
}
