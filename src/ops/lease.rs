//! How long a client may keep an answer in its own cache (client-side caching's lease): what
//! a read's answer means for a cache outside the instance, decided once here for every door.
//!
//! An answer is cacheable when its class has a near-cache age bound (`near_cache_max_age`: by
//! default `advisory` and `re-derivable`); its lease is that bound less the answer's own age
//! when it is sent (a near-cache answer's age bound; a replica's current lag; zero for a
//! primary or the embedded store), and never past the moment its copy expires. Any other
//! answer (a class routed to primaries, `decides-on-presence`, a class without a near-cache
//! age, a replica whose lag is unknown) has no lease: it must not be cached.
//!
//! A miss (no value, or a tombstone) carries no word of who served it, so its age is taken at
//! the class's staleness budget when the class reads replicas: it is cacheable only when the
//! class's age bound is above its budget, which no class allows (`route::classes`), so misses
//! of replica-routed classes are not cached. Tests: `ops::lease::tests`.

use std::time::Duration;

use super::Ops;
use crate::key::Key;
use crate::read::ReadAnswer;
use crate::route::Route;
use crate::store::Role;

impl Ops {
    /// The lease of `answer` of `key` (read as `now_ms`, Unix ms): `None` when it must not be
    /// cached. An answer current before a change of the key this instance was already told of
    /// (a replica behind it, a near-cache entry filled before it) is not cached.
    pub fn lease(&self, key: &Key, answer: &ReadAnswer, now_ms: u64) -> Option<Duration> {
        let (route, served_by, expire_at_ms, copy) = match answer {
            ReadAnswer::Value {
                route,
                served_by,
                expire_at_ms,
                copy,
                ..
            }
            | ReadAnswer::NotModified {
                route,
                served_by,
                expire_at_ms,
                copy,
                ..
            } => (route, served_by, *expire_at_ms, *copy),
        };
        let router = self.router();
        let bound = router.classes().get(route.class).near_cache?;
        let age = match (route.near_cache_age, served_by.role) {
            (Some(age), _) => age,
            (None, Role::Replica) => router.lag_of_replica(&served_by.node)?,
            (None, Role::Primary | Role::Embedded) => Duration::ZERO,
        };
        let as_of = tokio::time::Instant::now()
            .checked_sub(age)
            .unwrap_or_else(tokio::time::Instant::now);
        if self.tracking().changed_after(key.as_str(), as_of) {
            // A near-cache entry filled before the change would keep every answer from it
            // uncacheable for its whole age: it is dropped (its floor record kept), so the
            // next read refills it from a source current after the change.
            if let (Some(near), Some(_)) = (self.reader().near_cache(), route.near_cache_age) {
                near.drop_entry(self.reader().copy_key(key, copy).as_str());
            }
            return None;
        }
        let left = Duration::from_millis(expire_at_ms.saturating_sub(now_ms));
        let lease = self.tracking().capped(bound.checked_sub(age)?.min(left));
        Some(lease).filter(|lease| !lease.is_zero())
    }

    /// The lease of a miss of `key` read with `class` (the connection's or the call's; `None`:
    /// the family's default): `None` when it must not be cached.
    pub fn miss_lease(&self, key: &Key, class: Option<&str>) -> Option<Duration> {
        let router = self.router();
        let plan = router.plan(key, class, None, None).ok()?;
        let classes = router.classes();
        let def = classes.get(plan.class);
        let bound = def.near_cache?;
        let age = match def.route {
            Route::Primary => Duration::ZERO,
            Route::Replica { budget, .. } => budget,
        };
        bound
            .checked_sub(age)
            .map(|lease| self.tracking().capped(lease))
            .filter(|lease| !lease.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::key::Version;
    use crate::read::RouteNote;
    use crate::route::RouteReason;
    use crate::store::{NodeLabel, ServedBy};

    fn ops() -> Ops {
        crate::ops::fixture::ops(
            "[[family]]\nprefix = \"a:\"\ncopies = 4\ndefault_class = \"advisory\"\n[[family]]\nprefix = \"p:\"\ncopies = 4\n",
        )
        .0
    }

    fn answer(
        ops: &Ops,
        class: &str,
        near_age: Option<u64>,
        role: Role,
        expire_at_ms: u64,
    ) -> ReadAnswer {
        let class = ops.router().classes().by_name(class).unwrap();
        ReadAnswer::Value {
            value: Bytes::from_static(b"v"),
            version: Version::MIN,
            copy: 0,
            served_by: ServedBy {
                node: NodeLabel::embedded(),
                role,
            },
            route: RouteNote {
                class,
                reason: RouteReason::Class,
                near_cache_age: near_age.map(Duration::from_millis),
            },
            expire_at_ms,
        }
    }

    #[test]
    fn a_lease_is_the_class_bound_less_the_answer_age_and_never_past_its_copy() {
        let ops = ops();
        let k = Key::parse("a:1").unwrap();
        let far = u64::MAX;
        // advisory: 250 ms budget, near cache half of it.
        let bound = Duration::from_millis(125);
        assert_eq!(
            ops.lease(&k, &answer(&ops, "advisory", None, Role::Primary, far), 0),
            Some(bound)
        );
        assert_eq!(
            ops.lease(
                &k,
                &answer(&ops, "advisory", Some(25), Role::Primary, far),
                0
            ),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            ops.lease(
                &k,
                &answer(&ops, "advisory", Some(125), Role::Primary, far),
                0
            ),
            None
        );
        assert_eq!(
            ops.lease(
                &k,
                &answer(&ops, "advisory", None, Role::Embedded, 1_040),
                1_000
            ),
            Some(Duration::from_millis(40))
        );
        // A change told after the answer was current: not cacheable.
        ops.tracking().changed(["a:1"]);
        assert_eq!(
            ops.lease(
                &k,
                &answer(&ops, "advisory", Some(25), Role::Primary, far),
                0
            ),
            None
        );
        assert!(ops
            .lease(&k, &answer(&ops, "advisory", None, Role::Primary, far), 0)
            .is_some());
        // A replica whose lag is unknown: not cacheable.
        assert_eq!(
            ops.lease(&k, &answer(&ops, "advisory", None, Role::Replica, far), 0),
            None
        );
        for class in ["primary", "decides-on-presence"] {
            assert_eq!(
                ops.lease(&k, &answer(&ops, class, None, Role::Primary, far), 0),
                None,
                "{class}"
            );
        }
    }

    #[test]
    fn a_miss_is_cacheable_only_where_its_age_is_known() {
        let ops = ops();
        let key = |text: &str| Key::parse(text).unwrap();
        assert_eq!(ops.miss_lease(&key("a:1"), None), None);
        assert_eq!(ops.miss_lease(&key("p:1"), None), None);
        assert_eq!(ops.miss_lease(&key("p:1"), Some("nope")), None);
    }
}
