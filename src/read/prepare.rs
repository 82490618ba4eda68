//! What a read settles before it consults any copy: the copy, the route and the floors, in one
//! value ([`Prepared`]) that the rest of the read path carries.

use std::sync::Arc;
use std::time::Duration;

use super::{Caller, Carried, ReadRequest, Reader};
use crate::affinity;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Version;
use crate::near::NearCache;
use crate::route::{Plan, PlanRoute, RouteReason};

/// What a read settles before it consults any copy: which copy, the route, and the floors.
pub(super) struct Prepared<'a> {
    /// How many copies the key's family has.
    pub(super) copies: u32,
    /// The affine copy (or the named one).
    pub(super) affine: u32,
    /// The client id of an affine read; `None` for a named copy.
    pub(super) client: Option<&'a str>,
    /// The route, holding the session token's floors too.
    pub(super) plan: Plan,
    /// The floors the request carries itself (`min_version`, `If-None-Match`, the carried
    /// exact floor).
    pub(super) client_floor: Option<Version>,
    /// The floor a value must meet to answer: `min_version` and the carried exact floor.
    pub(super) min_version: Option<Version>,
    /// Every floor (the request's and those held for the client) and the carried estimate
    /// ([`Carried::estimate`]), which may over-state: a copy below it is passed over while
    /// another consulted copy holds more, but the answer is refused only below the hard floors
    /// (`min_version`, the plan's held floors).
    pub(super) preferred: Option<Version>,
    /// The near cache and the class's max age, when this read may be answered from memory.
    pub(super) near: Option<(&'a Arc<NearCache>, Duration)>,
}

impl Reader {
    /// Chooses the copy and plans the route of `request`: no store call, no await.
    pub(super) fn prepare<'a>(
        &'a self,
        request: &'a ReadRequest,
        carried: Carried,
    ) -> Result<Prepared<'a>> {
        let copies = self.key_copies(&request.key);
        let floor = request
            .min_version
            .max(request.if_none_match)
            .max(carried.floor);
        let affine = match &request.caller {
            Caller::Named(copy) if *copy >= copies => {
                return Err(Error::new(
                    ErrorKind::InvalidCopy,
                    format!(
                        "copy {copy} is out of range: {} has {copies} copies (0..{copies})",
                        request.key
                    ),
                ))
            }
            Caller::Named(copy) => *copy,
            Caller::Client(client) if client.is_empty() => {
                return Err(Error::new(ErrorKind::MissingClient, "client id is empty"))
            }
            Caller::Client(client) => affinity::copy_index(client, copies),
            Caller::Pooled(client) => affinity::copy_index(client, copies),
        };
        let client = request.caller.client_id();
        let mut plan = self.router.plan(
            &request.key,
            request.class.as_deref(),
            client,
            request.request_id.as_deref(),
        )?;
        // The session token's floors count as this instance's own memory of the client.
        plan.own_floor = plan.own_floor.max(carried.session.written);
        plan.seen_floor = plan.seen_floor.max(carried.session.seen);
        let client_floor = floor;
        let floor = floor.max(plan.held_floor());
        let near = self
            .near_max_age(&plan)
            .and_then(|max_age| Some((self.near.as_ref()?, max_age)));
        Ok(Prepared {
            copies,
            affine,
            client,
            plan,
            client_floor,
            min_version: request.min_version.max(carried.floor),
            preferred: floor.max(carried.estimate),
            near,
        })
    }

    /// The max age at which a read planned as `plan` may be answered from the near cache
    /// (`near`), `None` when it may not be: a request pin has no version an entry could be
    /// checked against.
    fn near_max_age(&self, plan: &Plan) -> Option<Duration> {
        self.near.as_ref()?;
        if plan.route == PlanRoute::Primary(RouteReason::RequestPin) {
            return None;
        }
        self.router.classes().get(plan.class).near_cache
    }
}
