//! One copy read where the plan sends it: a replica within the class's budget, else the
//! primary, with the reason; the store read every other read step builds on.

use std::time::Duration;

use super::{Consulted, Reader};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{Key, Version};
use crate::route::{Plan, RouteReason, Target};

/// The floors one copy read answers to: the plan (its own-write floor among them), the reader's
/// floor and the floor it prefers (the reader's, or an instance high-water mark above it).
#[derive(Clone, Copy)]
pub(super) struct Floors<'a> {
    /// Where the read goes, and the reader's own-write floor.
    pub(super) plan: &'a Plan,
    /// The reader's floor.
    pub(super) client: Option<Version>,
    /// The floor the read prefers to meet.
    pub(super) preferred: Option<Version>,
}

impl<'a> Floors<'a> {
    /// The floors of a prepared read.
    pub(super) fn of(prepared: &'a super::prepare::Prepared<'_>) -> Floors<'a> {
        Floors {
            plan: &prepared.plan,
            client: prepared.client_floor,
            preferred: prepared.preferred,
        }
    }

    /// These floors with `preferred` raised to `floor`.
    pub(super) fn at_least(self, floor: Option<Version>) -> Floors<'a> {
        Floors {
            preferred: self.preferred.max(floor),
            ..self
        }
    }
}

impl Reader {
    /// Reads one copy where the plan sends it. A replica copy below the floor is re-read from
    /// the primary (reason `own-write` when the reader's own write floor is what it missed,
    /// `version-floor` otherwise); a replica that cannot be read hands over to the primary
    /// (reason `no-replica`).
    pub(super) async fn consult(
        &self,
        key: &Key,
        copy: u32,
        floors: Floors<'_>,
    ) -> Result<Consulted> {
        let Floors {
            plan,
            client: client_floor,
            preferred: floor,
        } = floors;
        let copy_key = self.copy_key(key, copy);
        let primary = self.store.node_of(&copy_key);
        let reason = match self.router.target(plan, &primary) {
            Target::Replica(replica) => {
                let read = self.store.read_replica_copy(&copy_key, &replica).await;
                // Under a floor, a replica's copy that is below it or missing (the replica may
                // not have received the key yet) is never the answer: the primary's copy is.
                let below = |floor: Option<Version>| match &read.record {
                    Ok(Some(record)) => floor.is_some_and(|floor| record.version < floor),
                    Ok(None) => floor.is_some(),
                    Err(_) => false,
                };
                let reason = match &read.record {
                    Err(err) => {
                        tracing::debug!(copy_key = %copy_key, replica = %replica, error = %err, "replica read failed; reading the primary");
                        RouteReason::NoReplica
                    }
                    Ok(_) if below(floor) => {
                        if below(plan.own_floor) && !below(client_floor) {
                            RouteReason::OwnWrite
                        } else {
                            RouteReason::VersionFloor
                        }
                    }
                    Ok(_) => {
                        return Ok(Consulted {
                            copy,
                            read,
                            reason: RouteReason::Class,
                        })
                    }
                };
                reason
            }
            Target::Primary(reason) => reason,
            Target::Breach { lag, budget } => return Err(breach(lag, budget)),
        };
        let read = self.store.read_copy(&copy_key).await;
        if let Err(err) = &read.record {
            tracing::debug!(copy_key = %copy_key, served_by = %read.served_by, error = %err, "copy read failed");
        }
        Ok(Consulted { copy, read, reason })
    }
}
/// The error of a read whose class fails over budget: every replica is over it.
pub(super) fn breach(lag: Option<Duration>, budget: Duration) -> Error {
    Error::new(
        ErrorKind::StalenessBudgetExceeded,
        match lag {
            Some(lag) => format!(
                "every replica of the copy's owner is {} ms behind, over the class's {} ms budget",
                lag.as_millis(),
                budget.as_millis()
            ),
            None => format!(
                "no replica of the copy's owner has shown a heartbeat; the class's budget is {} ms",
                budget.as_millis()
            ),
        },
    )
}
