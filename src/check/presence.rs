//! The presence experiment ([`Experiment::presence`]): a claimer takes and releases a claim
//! while askers ask "is it held?" through the `advisory` and `decides-on-presence` read classes,
//! and the claim's replica has its replication paused within the advisory budget.

use std::sync::PoisonError;
use std::time::Duration;

use super::history::Op;
use super::recorder::{event, outcome_of, owner_port, send};
use super::report::{judge_presence, PresenceResult};
use super::run::Experiment;
use hotsplit::wire::query::{CLASS, CLIENT, VERSION};

impl Experiment {
    /// Asks "is the claim held?" through `advisory` and `decides-on-presence` while the claim's
    /// replica has its replication paused for less than the advisory budget.
    pub(super) async fn presence(&self) -> Vec<PresenceResult> {
        let phase = self.phase();
        let key = "claim:1";
        let mut tasks = tokio::task::JoinSet::new();
        {
            let (http, base, recorder, stop) = phase.service_handles();
            tasks.spawn(async move {
                let mut version = 0u64;
                while !stop.is_cancelled() {
                    version += 1;
                    let start = recorder.now_us();
                    let (op, request) = if version % 2 == 1 {
                        (
                            Op::Write,
                            http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                                .body("held"),
                        )
                    } else {
                        (
                            Op::Delete,
                            http.delete(format!("{base}/v1/keys/{key}?{VERSION}={version}")),
                        )
                    };
                    let answer = send(request).await;
                    let mut record = event(
                        "claimer",
                        op,
                        key,
                        recorder.since(start),
                        outcome_of(&answer),
                    );
                    record.version = Some(version);
                    recorder.push(record);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            });
        }
        {
            // Pause the claim's replica's replication for 150 ms every 300 ms: within the 250 ms
            // advisory budget, so the budget never sends those reads to the primary.
            let (cluster, stop) = (phase.cluster.clone(), phase.stop.clone());
            tasks.spawn(async move {
                while !stop.is_cancelled() {
                    let cluster = cluster.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        let topology = cluster.topology().ok()?;
                        let master = owner_port(&topology, key)?;
                        let master_id =
                            topology.iter().find(|node| node.port == master)?.id.clone();
                        for replica in cluster.replicas_of(&master_id).ok()? {
                            let _ = cluster.cli_with_timeout(
                                replica.port,
                                &["CLIENT", "PAUSE", "150", "WRITE"],
                                Duration::from_millis(200),
                            );
                        }
                        Some(())
                    })
                    .await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
        }
        for class in ["advisory", "decides-on-presence"] {
            let (http, base, recorder, stop) = phase.service_handles();
            tasks.spawn(async move {
                while !stop.is_cancelled() {
                    let start = recorder.now_us();
                    // One client id per class: a read the primary serves leaves the reader a
                    // seen floor, so an asker shared by both classes would carry the
                    // `decides-on-presence` reads' versions into its `advisory` reads.
                    let answer = send(http.get(format!(
                        "{base}/v1/keys/{key}?{CLIENT}=asker-{class}&{CLASS}={class}"
                    )))
                    .await;
                    recorder.push_read(class, key, start, &answer);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            });
        }
        tokio::select! {
            () = tokio::time::sleep(self.phase_length) => {}
            () = phase.stop.cancelled() => {}
        }
        phase.stop.cancel();
        while tasks.join_next().await.is_some() {}
        let events = phase
            .recorder
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        ["advisory", "decides-on-presence"]
            .iter()
            .map(|class| judge_presence(class, &events))
            .collect()
    }
}
