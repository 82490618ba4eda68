//! The faults a run injects: the seeded schedule of master faults per phase ([`Fault`],
//! [`schedule`], [`inject`]) and the replica replication pauses that run throughout a phase
//! ([`lag_replicas`]).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use hotsplit_devcluster::Cluster;

use super::history::{Op, Outcome};
use super::recorder::{event, Recorder, Span};

/// A fault applied to one master, on a blocking thread.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// `CLIENT PAUSE <ms> WRITE` on the master: its copies stay readable at their old version
    /// while writes to them stall; nothing fails over.
    StallWrites(Duration),
    /// SIGSTOP for this long, shorter than the node timeout, then SIGCONT.
    ShortPause(Duration),
    /// SIGSTOP long enough for its replica to be promoted, then SIGCONT.
    Failover(Duration),
    /// `SHUTDOWN NOSAVE` and an immediate restart: it returns empty within the node timeout.
    RestartEmpty,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::StallWrites(_) => "client-pause-write",
            Fault::ShortPause(_) => "sigstop-short",
            Fault::Failover(_) => "sigstop-failover",
            Fault::RestartEmpty => "shutdown-nosave-restart",
        }
    }

    fn loses_writes(self) -> bool {
        matches!(self, Fault::Failover(_) | Fault::RestartEmpty)
    }
}

/// Applies `fault` to a master chosen by `pick`, records it, and returns its loss window.
pub(super) async fn inject(
    fault: Fault,
    pick: usize,
    cluster: &Arc<Cluster>,
    recorder: &Recorder,
) -> Option<(u64, u64)> {
    let cluster = cluster.clone();
    let recorder = recorder.clone();
    tokio::task::spawn_blocking(move || {
        let masters = cluster.masters().ok()?;
        let port = masters.get(pick % masters.len().max(1))?.port();
        let node = cluster.node(port)?;
        let start = recorder.now_us();
        let applied = match fault {
            Fault::StallWrites(hold) => {
                let millis = hold.as_millis().to_string();
                node.cli(&["CLIENT", "PAUSE", &millis, "WRITE"]).is_ok() && {
                    std::thread::sleep(hold);
                    true
                }
            }
            Fault::ShortPause(hold) | Fault::Failover(hold) => {
                node.pause().is_ok() && {
                    std::thread::sleep(hold);
                    node.resume().is_ok()
                }
            }
            Fault::RestartEmpty => node.shutdown_nosave().is_ok() && node.restart().is_ok(),
        };
        let _ = cluster.wait_healthy(Duration::from_secs(30));
        let end = recorder.now_us();
        let mut record = event(
            "faults",
            Op::Fault,
            "",
            Span {
                start_us: start,
                end_us: end,
            },
            Outcome::Error(fault.name().to_owned()),
        );
        record.served_by = Some(format!("127.0.0.1:{port}"));
        if !applied {
            record.outcome = Outcome::Error(format!("{} (not applied)", fault.name()));
        }
        recorder.push(record);
        // Reads just after the cluster healed may still see the loss: widen the window by 1 s.
        (applied && fault.loses_writes()).then_some((start, end + 1_000_000))
    })
    .await
    .ok()
    .flatten()
}

/// The seeded fault schedule of one phase: which fault to inject at which fraction of
/// `phase_length`. A failover needs a phase of at least 10 s.
pub(super) fn schedule(phase_length: Duration) -> Vec<(f64, Fault)> {
    let mut schedule = vec![
        (
            0.10,
            Fault::StallWrites(Duration::from_millis(1500).min(phase_length / 3)),
        ),
        (
            0.45,
            Fault::ShortPause(Duration::from_millis(800).min(phase_length / 6)),
        ),
        (0.60, Fault::RestartEmpty),
    ];
    if phase_length >= Duration::from_secs(10) {
        schedule.push((0.75, Fault::Failover(Duration::from_secs(5))));
    }
    schedule
}

/// Replication lag throughout a phase, until `stop`: a seeded replica at a time has its
/// replication paused for 200 ms (within the 250 ms advisory budget), so its copies stay
/// readable and old. Every pause is recorded as a fault.
pub(super) async fn lag_replicas(
    cluster: Arc<Cluster>,
    recorder: Recorder,
    stop: CancellationToken,
    mut rng: StdRng,
) {
    while !stop.is_cancelled() {
        let pick = rng.random_range(0..1024usize);
        let cluster = cluster.clone();
        let recorder = recorder.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let replicas = cluster.replicas().ok()?;
            let port = replicas.get(pick % replicas.len().max(1))?.port();
            let start = recorder.now_us();
            cluster
                .cli_with_timeout(
                    port,
                    &["CLIENT", "PAUSE", "200", "WRITE"],
                    Duration::from_millis(200),
                )
                .ok()?;
            let mut record = event(
                "faults",
                Op::Fault,
                "",
                Span {
                    start_us: start,
                    end_us: start + 200_000,
                },
                Outcome::Error("replica-replication-pause".into()),
            );
            record.served_by = Some(format!("127.0.0.1:{port}"));
            recorder.push(record);
            Some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
