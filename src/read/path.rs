//! The affine read itself, after [`Reader::prepare`]: consult the affine copy (through the near
//! cache when the class has one, `near`), fall back to siblings, decide, repair and remember the
//! reader's floor. It calls `near` and `consult`; neither calls back.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::consult::Floors;
use super::prepare::Prepared;
use super::{
    decide, repair_of, Caller, Concluded, Consulted, Decision, Found, ReadAnswer, ReadRequest,
    Reader, RouteNote, Served, Trail,
};
use crate::error::{ErrorKind, Result};
use crate::key::{Key, Version};
use crate::near::Now;
use crate::route::{RouteReason, ServedRole};
use crate::store::{Role, ServedBy};

/// What the near cache told of the affine copy: the entry's age bound when it answered, and the
/// copy's high-water version when the read began.
#[derive(Clone, Copy, Default)]
struct NearSeen {
    /// The entry's age bound when the answer came from the cache.
    age: Option<Duration>,
    /// The copy's high-water version when the read began.
    high_water: Option<Version>,
}

impl Reader {
    /// The answer when the affine copy's near-cache entry gives it (see `near::consult_near_hit`,
    /// which `held_to` and the read's clock `now` are passed to): decided at once, with no
    /// store call and no await. `None` when the read needs the store.
    pub(super) fn near_hit(
        &self,
        request: &ReadRequest,
        prepared: &Prepared<'_>,
        held_to: Option<Version>,
        now: Option<Now>,
    ) -> Option<Result<Concluded>> {
        let found = self.consult_near_hit(&request.key, prepared, held_to, now)?;
        // An entry that meets every floor is the whole answer: no sibling is consulted.
        let seen = NearSeen {
            age: found.age,
            high_water: found.high_water,
        };
        Some(self.conclude(request, prepared, [found.consulted], seen))
    }

    /// The read of `request` from the store (through the near cache's fills when it has one),
    /// after [`Reader::prepare`] and a [`Reader::near_hit`] that did not answer.
    pub(super) async fn read_rest(
        &self,
        request: &ReadRequest,
        prepared: Prepared<'_>,
    ) -> Result<Concluded> {
        let Prepared {
            copies,
            affine,
            near,
            ..
        } = prepared;
        let (first, seen) = match near {
            Some(_) => {
                let found = self.consult_near(&request.key, &prepared).await?;
                let seen = NearSeen {
                    age: found.age,
                    high_water: found.high_water,
                };
                (found.consulted, seen)
            }
            None => {
                let floors = Floors::of(&prepared);
                let first = self.consult(&request.key, affine, floors).await?;
                (first, NearSeen::default())
            }
        };
        // Below what this instance already served from the copy, the affine copy is not the
        // answer while a sibling holds more (`near::high_water`).
        let floors = Floors::of(&prepared).at_least(seen.high_water);
        let floor = floors.preferred;
        let satisfied = matches!(&first.read.record, Ok(Some(record)) if floor.is_none_or(|floor| record.version >= floor));
        let named = matches!(request.caller, Caller::Named(_));
        if satisfied || named || copies == 1 {
            return self.conclude(request, &prepared, [first], seen);
        }
        let siblings_started = Instant::now();
        let siblings = (1..=self.config.fallback_copies.min(copies - 1))
            .map(|step| self.consult(&request.key, (affine + step) % copies, floors));
        let mut all = vec![first];
        for sibling in join_all(siblings).await {
            all.push(sibling?);
        }
        if let Some((near, _)) = near {
            for sibling in &all[1..] {
                self.offer(near, &request.key, sibling, siblings_started);
            }
        }
        // Every consulted copy is missing: after a family grew, new copies are empty until
        // repaired, so ask copy 0, which exists in every layout, before answering 404.
        let all_missing = all.iter().all(|c| matches!(c.read.record, Ok(None)));
        if all_missing && all.iter().all(|c| c.copy != 0) {
            all.push(self.consult(&request.key, 0, floors).await?);
        }
        self.conclude(request, &prepared, all, seen)
    }

    /// Decides the read from the copies it consulted (the affine copy first), then repairs and
    /// counts, and gathers the floors the answer leaves ([`Trail`]): the version shown, a seen
    /// floor, a near-cache rollback. It records none of them (the caller's after-answer step
    /// does).
    fn conclude<C>(
        &self,
        request: &ReadRequest,
        prepared: &Prepared<'_>,
        consulted: C,
        seen: NearSeen,
    ) -> Result<Concluded>
    where
        C: AsRef<[Consulted]> + IntoIterator<Item = Consulted>,
    {
        let Prepared {
            affine,
            ref plan,
            near,
            min_version,
            ..
        } = *prepared;
        let NearSeen {
            age: near_cache_age,
            high_water,
        } = seen;
        let repair = self.repairer.as_ref().and_then(|_| {
            repair_of(
                &request.key,
                affine,
                self.read_placement(&request.key),
                consulted.as_ref(),
            )
        });
        let min_version = min_version.max(plan.held_floor());
        // A read that ends without a value (not found, below the floor) was still served by
        // someone: the affine copy's node and reason are what the bill counts for it.
        let first = consulted
            .as_ref()
            .first()
            .map(|first| (first.read.served_by.clone(), first.reason));
        let decision = decide(consulted, min_version, request.if_none_match, plan.class);
        let mut trail = Trail {
            void_near: near
                .and_then(|_| self.rollback_of(&request.key, affine, high_water, &decision)),
            ..Trail::default()
        };
        if let (Some(repairer), Some(write)) = (&self.repairer, repair) {
            if decision.is_ok() {
                repairer.repair(write);
            }
        }
        let answer = match decision {
            Ok(Decision::Answer(mut answer)) => {
                let (ReadAnswer::Value { route, .. } | ReadAnswer::NotModified { route, .. }) =
                    &mut answer;
                route.near_cache_age = near_cache_age;
                answer
            }
            Ok(Decision::Invalidated {
                version,
                expire_at_ms,
                copy,
                served_by,
                reason,
            }) => {
                // A near-cache answer leaves no seen floor (see below), nor counts in the bill.
                if near_cache_age.is_none() {
                    trail.seen = self.remember(prepared, copy, &served_by, version);
                    self.bill(&request.key, &served_by, plan, reason);
                }
                trail.shown = Some((version, expire_at_ms));
                return Ok(Concluded {
                    found: Found::Invalidated {
                        version,
                        expire_at_ms,
                    },
                    served: Served::of(copy, affine),
                    trail,
                });
            }
            Err(err) => {
                if let (
                    ErrorKind::NotFound | ErrorKind::BelowVersionFloor,
                    Some((served_by, reason)),
                ) = (err.kind(), first)
                {
                    self.bill(&request.key, &served_by, plan, reason);
                }
                if err.kind() == ErrorKind::NotFound {
                    return Ok(Concluded {
                        found: Found::Missing,
                        served: Served::Affine,
                        trail,
                    });
                }
                return Err(err);
            }
        };
        Ok(self.answered(prepared, answer, trail, near_cache_age))
    }

    /// The answer's conclusion: which copy served it, the version shown, and the reader's
    /// seen floor when the store (not the near cache) served it.
    fn answered(
        &self,
        prepared: &Prepared<'_>,
        answer: ReadAnswer,
        mut trail: Trail,
        near_cache_age: Option<Duration>,
    ) -> Concluded {
        let (ReadAnswer::Value {
            copy,
            version,
            served_by,
            expire_at_ms,
            ..
        }
        | ReadAnswer::NotModified {
            copy,
            version,
            served_by,
            expire_at_ms,
            ..
        }) = &answer;
        let served = Served::of(*copy, prepared.affine);
        trail.shown = Some((*version, *expire_at_ms));
        // A near-cache answer leaves no seen floor: the copy's high-water version keeps every
        // reader of the copy through this instance from going below it.
        if near_cache_age.is_none() {
            trail.seen = self.remember(prepared, *copy, served_by, *version);
        }
        Concluded {
            found: Found::Answer(answer),
            served,
            trail,
        }
    }

    /// Counts a read the store served (not the near cache) in the bill and the route metrics.
    fn bill(
        &self,
        key: &Key,
        served_by: &ServedBy,
        plan: &crate::route::Plan,
        reason: RouteReason,
    ) {
        let note = RouteNote {
            class: plan.class,
            reason,
            near_cache_age: None,
        };
        self.count(key, served_by, note);
    }

    /// Leaves the reader a seen floor when its read was served from somewhere its next read may
    /// not go: a sibling instead of its own copy, or a primary while this instance knows
    /// replicas or is still discovering them (the startup warm-up) (for any reason:
    /// `lag-breach`, `lag-unmeasured`, `no-replica`, a floor that sent it there, or a
    /// class that reads primaries, since the reader's next read may use a replica class). The
    /// answer may be newer than what the reader's usual place holds, so the version served (a
    /// tombstone's for a 404) is held as the reader's floor for the family's `pin_window`: its
    /// next read, back on a replica still behind or on its own copy that missed the write, does
    /// not go back.
    ///
    /// Nothing is recorded when the version is not above the floor the reader already holds:
    /// every window stays bounded (a reader kept on the primary by its floor does not extend the
    /// floor forever), and the common path, served where it usually is, only looks the floor up.
    /// A floor started when a version was first served outlives the replica's lag: a replica
    /// within its budget holds every version older than the budget.
    ///
    /// A read of a named copy has no client to remember. The floor is returned for the
    /// after-answer step to record (`crate::ops`), never recorded here.
    fn remember(
        &self,
        prepared: &Prepared<'_>,
        copy: u32,
        served_by: &ServedBy,
        version: Version,
    ) -> Option<Version> {
        prepared.client?;
        if prepared
            .plan
            .held_floor()
            .is_some_and(|held| held >= version)
        {
            return None;
        }
        let lag = self.router.lag();
        let moved = copy != prepared.affine
            || (served_by.role == Role::Primary && (lag.replicated() || lag.warming()));
        moved.then_some(version)
    }

    /// Counts a served read in the routing bill and logs where it was served.
    pub(super) fn count(&self, key: &Key, served_by: &ServedBy, route: RouteNote) {
        let role = if served_by.role == Role::Replica {
            ServedRole::Replica
        } else {
            ServedRole::Primary
        };
        self.router.count(route.class, role, route.reason);
        tracing::debug!(key = %key, node = %served_by, class = %self.router.classes().get(route.class).name, reason = route.reason.as_str(), "read served");
    }
}
