//! The figures of one partition scenario: what its nemesis did ([`NemesisRecord`]) and the
//! row made from it, its publishes and its history ([`figures`] → [`PartitionRow`]), judged
//! by the shared checkers ([`super::checkers::monotonic_reads`],
//! [`super::checkers::read_your_writes`]); plus the registry listing the registry scenario
//! notes.
//!
//! A publish is *lost* when it was acknowledged and the copies never held it after the heal.
//! Versions only grow, so without a failover that means a version above the one every copy
//! converged to. In the split brain the survivor is the promoted replica: a publish through
//! the isolated instance that was applied there (answered 200) is lost when it is above what
//! that replica held at the promotion, unless nothing was published on the majority side and
//! the copies converged to it or above; one that was queued (202) lands after the heal or is
//! superseded by a newer version there, so only one above the converged version is lost.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checkers::{monotonic_reads, read_your_writes};
use super::history::{Event, Op, Outcome};
use super::partition_traffic::Published;
use super::recorder::Recorder;

/// Whether a row's losses fail the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judged {
    /// Any acknowledged publish lost fails the run.
    Judged,
    /// The losses are shown, not judged: the row without the rule.
    Shown,
}

/// A row's name and how it is judged.
pub(super) struct RowSpec {
    /// The scenario's name.
    pub(super) scenario: &'static str,
    /// Its family publishes with `sync_replicas = 1`.
    pub(super) rule: bool,
    /// Whether its losses fail the run.
    pub(super) judged: Judged,
}

/// What a scenario's nemesis did.
pub(super) struct NemesisRecord {
    /// The key the scenario used.
    pub(super) key: String,
    /// The run's clock (the history's).
    pub(super) clock: Recorder,
    /// The partition, as the network labels it.
    pub(super) label: String,
    /// The first cut, µs.
    pub(super) cut_from_us: u64,
    /// The last heal, µs.
    pub(super) cut_to_us: u64,
    /// How many cuts were made.
    pub(super) cuts: u32,
    /// The split brain's survivor: the isolated instance and the version the promoted replica
    /// held at the promotion.
    pub(super) survivor: Option<(usize, u64)>,
    /// The version every copy held once converged, and when (µs).
    pub(super) converged: Option<(u64, u64)>,
    /// What the scenario noted besides the figures.
    pub(super) note: String,
}

impl NemesisRecord {
    /// A record of nothing yet, for `key`, on `clock`.
    pub(super) fn new(key: String, clock: Recorder) -> NemesisRecord {
        NemesisRecord {
            key,
            clock,
            label: String::new(),
            cut_from_us: 0,
            cut_to_us: 0,
            cuts: 0,
            survivor: None,
            converged: None,
            note: String::new(),
        }
    }

    /// The version every copy must reach after the heal: the newest answered publish, or in a
    /// split brain the newest answered on the majority side (at least what survived).
    pub(super) fn target(&self, published: &[Published]) -> u64 {
        let newest = |keep: &dyn Fn(&Published) -> bool| {
            published
                .iter()
                .filter(|p| p.answered() && keep(p))
                .map(|p| p.version)
                .max()
                .unwrap_or(0)
        };
        match self.survivor {
            Some((isolated, held)) => held.max(newest(&|p| p.door != isolated)),
            None => newest(&|_| true),
        }
    }
}

/// One row of the partition table.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    /// The scenario.
    pub scenario: &'static str,
    /// Its family publishes under the rule (`sync_replicas = 1`).
    pub rule: bool,
    /// Whether its losses fail the run.
    pub judged: Judged,
    /// The key.
    pub key: String,
    /// The partition made.
    pub partition: String,
    /// Cuts made.
    pub cuts: u32,
    /// From the first cut to the last heal, ms.
    pub cut_ms: u64,
    /// Publishes sent.
    pub publishes: usize,
    /// Reads sent.
    pub reads: usize,
    /// Reads served (a version answered) to the readers without the token (`ca`, `cb`).
    pub served_client: usize,
    /// Reads served to the readers carrying the session token (`sa`, `sb`).
    pub served_session: usize,
    /// Monotonic-read violations of readers with an explicit client id and no token (the
    /// writers, which carry their token, counted here too).
    pub monotonic_client: usize,
    /// Monotonic-read violations of the readers carrying the session token.
    pub monotonic_session: usize,
    /// Read-your-writes violations.
    pub read_your_writes: usize,
    /// Publishes acknowledged (under the rule: `replicas_acked >= 1` on every line; without:
    /// answered 200 or 202).
    pub acknowledged: usize,
    /// Acknowledged publishes lost, by version.
    pub acknowledged_lost: Vec<u64>,
    /// Publishes answered 200 or 202 and lost, by version (under the rule, those said
    /// `replicas_acked: 0`).
    pub answered_lost: Vec<u64>,
    /// Reads answered during the cut.
    pub cut_reads_answered: usize,
    /// Reads refused (or unanswered) during the cut.
    pub cut_reads_refused: usize,
    /// Why reads were refused during the cut: problem code (or `http <status>`, `transport`)
    /// → count.
    pub cut_refusals: BTreeMap<String, usize>,
    /// Publishes answered 200 or 202 during the cut.
    pub cut_publishes_answered: usize,
    /// Publishes refused (or unanswered) during the cut.
    pub cut_publishes_refused: usize,
    /// The version every copy converged to.
    pub converged_version: Option<u64>,
    /// From the last heal until every copy held it, ms; `None`: not within the limit.
    pub converge_ms: Option<u64>,
    /// What the scenario noted.
    pub note: String,
    /// Every operation of the scenario (written as JSON lines beside the summary).
    #[serde(skip)]
    pub history: Vec<Event>,
}

impl PartitionRow {
    /// Why this row fails the run (empty: it passes).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let monotonic = self.monotonic_client + self.monotonic_session;
        if monotonic > 0 {
            failures.push(format!("{monotonic} monotonic-read violations"));
        }
        if self.read_your_writes > 0 {
            failures.push(format!(
                "{} read-your-writes violations",
                self.read_your_writes
            ));
        }
        if self.judged == Judged::Judged && !self.acknowledged_lost.is_empty() {
            failures.push(format!(
                "acknowledged publishes lost: {:?}",
                self.acknowledged_lost
            ));
        }
        if self.converge_ms.is_none() {
            failures.push("the copies did not converge after the heal".to_owned());
        }
        if self.served_client == 0 || self.served_session == 0 {
            failures.push(format!(
                "reads served: {} without the token, {} with it; a row must serve both",
                self.served_client, self.served_session
            ));
        }
        if self.acknowledged == 0 && self.judged == Judged::Judged && !self.rule {
            failures.push("no publish was answered, so the row proves nothing".to_owned());
        }
        failures
    }
}

/// The row of a scenario.
pub(super) fn figures(
    spec: &RowSpec,
    nemesis: &NemesisRecord,
    published: &[Published],
    events: &[Event],
) -> PartitionRow {
    let monotonic = monotonic_reads(events);
    let monotonic_session = monotonic
        .iter()
        .filter(|violation| violation.session.starts_with('s'))
        .count();
    let final_version = nemesis.converged.map_or(u64::MAX, |(version, _)| version);
    let lost = |acknowledged: &dyn Fn(&Published) -> bool| {
        lost_versions(published, final_version, nemesis.survivor, acknowledged)
    };
    let during = |at_us: u64| (nemesis.cut_from_us..=nemesis.cut_to_us).contains(&at_us);
    let cut_reads: Vec<&Event> = events
        .iter()
        .filter(|event| event.op == Op::Read && during(event.start_us))
        .collect();
    let cut_reads_refused = cut_reads
        .iter()
        .filter(|event| matches!(event.outcome, Outcome::Error(_)))
        .count();
    let mut cut_refusals = BTreeMap::new();
    for event in &cut_reads {
        if let Outcome::Error(code) = &event.outcome {
            *cut_refusals.entry(code.clone()).or_insert(0) += 1;
        }
    }
    let cut_publishes: Vec<&Published> = published.iter().filter(|p| during(p.start_us)).collect();
    let cut_publishes_answered = cut_publishes.iter().filter(|p| p.answered()).count();
    let served = |prefix: char| {
        events
            .iter()
            .filter(|event| event.session.starts_with(prefix) && event.read_version().is_some())
            .count()
    };
    PartitionRow {
        scenario: spec.scenario,
        rule: spec.rule,
        judged: spec.judged,
        key: nemesis.key.clone(),
        partition: nemesis.label.clone(),
        cuts: nemesis.cuts,
        cut_ms: nemesis.cut_to_us.saturating_sub(nemesis.cut_from_us) / 1000,
        publishes: published.len(),
        reads: events.iter().filter(|event| event.op == Op::Read).count(),
        served_client: served('c'),
        served_session: served('s'),
        monotonic_client: monotonic.len() - monotonic_session,
        monotonic_session,
        read_your_writes: read_your_writes(events).len(),
        acknowledged: published
            .iter()
            .filter(|p| p.acknowledged(spec.rule))
            .count(),
        acknowledged_lost: lost(&|p| p.acknowledged(spec.rule)),
        answered_lost: lost(&Published::answered),
        cut_reads_answered: cut_reads.len() - cut_reads_refused,
        cut_reads_refused,
        cut_refusals,
        cut_publishes_answered,
        cut_publishes_refused: cut_publishes.len() - cut_publishes_answered,
        converged_version: nemesis.converged.map(|(version, _)| version),
        converge_ms: nemesis
            .converged
            .map(|(_, at_us)| at_us.saturating_sub(nemesis.cut_to_us) / 1000),
        note: nemesis.note.clone(),
        history: events.to_vec(),
    }
}

/// The versions of the publishes `acknowledged` keeps that the copies never held after the
/// heal (see the module doc); `final_version` is what every copy converged to.
fn lost_versions(
    published: &[Published],
    final_version: u64,
    survivor: Option<(usize, u64)>,
    acknowledged: &dyn Fn(&Published) -> bool,
) -> Vec<u64> {
    let majority_published = survivor
        .is_some_and(|(isolated, _)| published.iter().any(|p| p.door != isolated && p.answered()));
    published
        .iter()
        .filter(|p| acknowledged(p))
        .filter(|p| match survivor {
            // Applied on the isolated master alone: gone with it. A queued one (202) lands
            // after the heal, or finds a newer version there: superseded, not lost.
            Some((isolated, held)) if p.door == isolated && p.status == 200 => {
                p.version > held && (p.version > final_version || majority_published)
            }
            _ => p.version > final_version,
        })
        .map(|p| p.version)
        .collect()
}

/// The id `base` gives itself in `/v1/instances`.
pub(super) async fn instance_id(http: &reqwest::Client, base: &str) -> Option<String> {
    let view = instances(http, base).await?;
    view["this"].as_str().map(str::to_owned)
}

/// Whether `base`'s `/v1/instances` lists `id`; `None` when it does not answer.
pub(super) async fn lists(http: &reqwest::Client, base: &str, id: &str) -> Option<bool> {
    let view = instances(http, base).await?;
    Some(
        view["instances"]
            .as_array()?
            .iter()
            .any(|entry| entry["id"].as_str() == Some(id)),
    )
}

/// `base`'s `/v1/instances`.
async fn instances(http: &reqwest::Client, base: &str) -> Option<serde_json::Value> {
    http.get(format!("{base}/v1/instances"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(version: u64, door: usize, status: u16, replica_acked: bool) -> Published {
        Published {
            version,
            door,
            start_us: version,
            status,
            replica_acked,
        }
    }

    #[test]
    fn without_a_failover_a_version_above_the_converged_one_is_lost() {
        let all = [published(1, 0, 200, false), published(2, 0, 202, false)];
        assert!(lost_versions(&all, 2, None, &Published::answered).is_empty());
        assert_eq!(lost_versions(&all, 1, None, &Published::answered), vec![2]);
    }

    #[test]
    fn in_a_split_brain_the_isolated_side_above_the_survivor_is_lost() {
        // A (door 0) published 1..=3, the promoted replica held 1, B (door 1) published 4.
        let all = [
            published(1, 0, 200, true),
            published(2, 0, 200, false),
            published(3, 0, 202, false),
            published(4, 1, 200, false),
        ];
        let survivor = Some((0, 1));
        // 2 was applied on the isolated master alone; 3 was queued and found 4 after the heal.
        assert_eq!(
            lost_versions(&all, 4, survivor, &Published::answered),
            vec![2]
        );
        assert!(lost_versions(&all, 4, survivor, &|p| p.acknowledged(true)).is_empty());
        // Nothing published on the majority side: A's queued 3 landed after the heal.
        let alone = &all[..3];
        assert!(lost_versions(alone, 3, survivor, &Published::answered).is_empty());
        assert_eq!(
            lost_versions(alone, 1, survivor, &Published::answered),
            vec![2, 3]
        );
    }

    #[test]
    fn the_target_in_a_split_brain_ignores_the_isolated_side() {
        let all = [published(5, 0, 200, false), published(6, 1, 200, false)];
        let mut record = NemesisRecord::new("k".into(), Recorder::new());
        assert_eq!(record.target(&all), 6);
        record.survivor = Some((0, 3));
        assert_eq!(record.target(&all[..1]), 3);
        assert_eq!(record.target(&all), 6);
    }
}
