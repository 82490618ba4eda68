//! `GET /v1/fleet`: every registered instance with its figures, as one answer for the status
//! page. The registry gives the instances; the store gives each one's last published
//! [`InstanceStatus`] (one `GET` per instance); this instance's own figures are sampled live, so
//! it reports itself even when the registry's node does not answer.

use serde::Serialize;
use serde_json::Value;

use super::{InstanceStatus, Sources};
use crate::fleet::Registry;
use crate::store::{now_unix_ms, FleetStore, InstanceRecord};

/// What `GET /v1/fleet` answers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FleetView {
    /// The id of the instance that answered.
    pub this: String,
    /// When it answered, Unix milliseconds on its clock.
    pub at_ms: u64,
    /// How often instances publish their figures (`fleet.heartbeat_interval`), in
    /// milliseconds: the page polls at this pace (at least once a second).
    pub interval_ms: u64,
    /// Why the registry could not be read, when it could not (then only this instance is
    /// listed); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry_error: Option<String>,
    /// Every registered instance, by id; this one always.
    pub instances: Vec<FleetMember>,
}

/// One instance in a [`FleetView`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FleetMember {
    /// Its registry record.
    pub instance: InstanceRecord,
    /// Its figures: sampled now for the answering instance, else the last ones it published;
    /// absent when none is stored (its entry lapsed, or it runs a release that publishes
    /// none). Another release's figures are passed on as that release wrote them.
    #[schema(value_type = Option<InstanceStatus>)]
    pub status: Option<Value>,
}

/// The deployment as the status page shows it: every instance `registry` lists, each with its
/// stored figures from `store`, and this instance's figures from `sources`, live.
pub(crate) async fn fleet_view(
    registry: &Registry,
    store: &dyn FleetStore,
    sources: &Sources,
    interval_ms: u64,
) -> FleetView {
    let own = registry.record();
    let (mut records, registry_error) = match store.instances().await {
        Ok(records) => (records, None),
        Err(err) => {
            tracing::debug!(error = %err, "status page: the instance registry cannot be read");
            (Vec::new(), Some(err.to_string()))
        }
    };
    if !records.iter().any(|record| record.id == own.id) {
        // Not registered yet (the registrar's first write is under way), or the registry
        // cannot be read: this instance still reports itself.
        records.push(own.clone());
        records.sort_by(|a, b| a.id.cmp(&b.id));
    }
    let peers: Vec<String> = records
        .iter()
        .filter(|record| record.id != own.id)
        .map(|record| record.id.clone())
        .collect();
    let mut stored = match store.instance_statuses(&peers).await {
        Ok(stored) => stored,
        Err(err) => {
            tracing::debug!(error = %err, "status page: the other instances' figures cannot be read");
            vec![None; peers.len()]
        }
    }
    .into_iter();
    let live = serde_json::to_value(sources.sample()).ok();
    let instances = records
        .into_iter()
        .map(|instance| {
            let status = if instance.id == own.id {
                live.clone()
            } else {
                stored
                    .next()
                    .flatten()
                    .and_then(|text| parse(&instance.id, &text))
            };
            FleetMember { instance, status }
        })
        .collect();
    FleetView {
        this: own.id,
        at_ms: now_unix_ms(),
        interval_ms,
        registry_error,
        instances,
    }
}

/// A stored summary as JSON; `None` (logged) when it is not a JSON object.
fn parse(id: &str, text: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) if value.is_object() => Some(value),
        _ => {
            tracing::debug!(instance = %id, "status page: an instance's stored figures are not a JSON object; shown without them");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_stored_summary_is_shown_only_when_it_is_a_json_object() {
        assert!(parse("1-a", r#"{"at_ms": 1}"#).is_some());
        for damaged in ["", "[1]", "{\"at_ms\":", "null"] {
            assert_eq!(parse("1-a", damaged), None, "{damaged:?}");
        }
    }
}
