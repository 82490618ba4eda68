//! One mode's workload ([`Experiment::run_mode`]): writers publishing increasing versions (or
//! invalidating, in `delete` mode), reader sessions reading the way the mode says, a direct
//! sampler of every copy, replica lag and the seeded master faults, then a heal that waits until
//! every copy converged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::checkers;
use super::faults::{inject, lag_replicas, schedule};
use super::history::Op;
use super::recorder::{event, outcome_of, sample_copies, send};
use super::report::Mode;
use super::resp;
use super::run::{Experiment, Phase};
use hotsplit::wire::query::{CLASS, CLIENT, COPY, MIN_VERSION, VERSION};

/// How many phase lengths the `random-suffix` phase may last at most, waiting for its first
/// monotonic-read violation (see [`wait_for_a_violation`]).
const CONTROL_STRETCH: u32 = 5;

/// Returns once the phase's history holds a monotonic-read violation, at `until`, or when `stop`
/// is cancelled. `random-suffix` is the control that shows the checkers catch the flip-flop:
/// with the suite running at load 17-26 on 2 cores, reads were so slow and so often refused on
/// the faulted masters (a few hundred in a 2 s phase) that some runs ended before any reader
/// met a lagging copy. The phase then goes on, with replica lag and no master fault, until one
/// has; a run where replicas lag and none does within the stretch still shows none.
async fn wait_for_a_violation(
    recorder: &super::recorder::Recorder,
    stop: &tokio_util::sync::CancellationToken,
    until: Instant,
) {
    while Instant::now() < until && !stop.is_cancelled() {
        let shown = !checkers::monotonic_reads(
            &recorder
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .is_empty();
        if shown {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => {}
        }
    }
}

impl Experiment {
    /// Runs one mode's phase: writers, readers, the direct sampler, replica lag and the seeded
    /// fault schedule for [`Experiment::phase_length`] (`random-suffix` longer, until its first
    /// violation: [`wait_for_a_violation`]), then heals and samples until every copy
    /// converged (at most 10 s). Returns the windows in which a fault lost writes.
    pub(super) async fn run_mode(&self, mode: Mode, rng: &mut StdRng) -> Vec<(u64, u64)> {
        let phase = self.phase();
        let phase_length = self.phase_length;
        let keys: Vec<String> = (0..self.keys)
            .map(|k| format!("check:{}{}:{k}", mode.as_str(), self.key_tag))
            .collect();
        // The source of truth: each key's current version.
        let source: Arc<Vec<AtomicU64>> =
            Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
        let mut tasks = tokio::task::JoinSet::new();

        for (index, key) in keys.iter().enumerate() {
            // Writers publish through `write_base`: the readers' own service, or in the
            // near-cache rows the other one.
            let (http, _, recorder, stop) = phase.service_handles();
            if let (Mode::Resp, Some(doors)) = (mode, &self.resp) {
                tasks.spawn(resp::writer(
                    doors.clone(),
                    index,
                    key.clone(),
                    source.clone(),
                    recorder,
                    stop,
                ));
                continue;
            }
            let base = phase.write_base.clone();
            let (key, source) = (key.clone(), source.clone());
            tasks.spawn(async move {
                let session = format!("writer-{index}");
                while !stop.is_cancelled() {
                    let start = recorder.now_us();
                    let (op, version, answer) = if mode == Mode::Delete {
                        // Values are even versions; an edit invalidates at the odd version below, and
                        // readers refill the value at the even one.
                        let value_version = source[index].fetch_add(2, Ordering::SeqCst) + 2;
                        let answer = send(http.delete(format!(
                            "{base}/v1/keys/{key}?{VERSION}={}",
                            value_version - 1
                        )))
                        .await;
                        (Op::Delete, value_version - 1, answer)
                    } else {
                        let version = source[index].fetch_add(1, Ordering::SeqCst) + 1;
                        let answer = send(
                            http.put(format!(
                                "{base}/v1/keys/{key}?{VERSION}={version}&{CLIENT}={session}"
                            ))
                            .body(format!("v{version}")),
                        )
                        .await;
                        (Op::Write, version, answer)
                    };
                    let mut record = event(
                        &session,
                        op,
                        &key,
                        start,
                        recorder.now_us(),
                        outcome_of(&answer),
                    );
                    record.version = Some(version);
                    recorder.push(record);
                    if mode != Mode::Delete {
                        // The writer reads its own key back, as `advisory`: its own-write floor
                        // must keep it from reading an older version from a lagging replica.
                        let start = recorder.now_us();
                        let answer = send(http.get(format!(
                            "{base}/v1/keys/{key}?{CLIENT}={session}&{CLASS}=advisory"
                        )))
                        .await;
                        recorder.push_read(&session, &key, start, &answer);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }

        for reader in 0..self.readers {
            let (http, base, recorder, stop) = phase.service_handles();
            let (keys, source) = (keys.clone(), source.clone());
            let mut rng = StdRng::seed_from_u64(rng.random());
            if let (Mode::Resp, Some(doors)) = (mode, &self.resp) {
                tasks.spawn(resp::reader(
                    doors.clone(),
                    reader,
                    keys,
                    rng,
                    recorder,
                    stop,
                ));
                continue;
            }
            let copies = self.copies;
            tasks.spawn(async move {
            let session = format!("reader-{reader}");
            let mut floors: BTreeMap<usize, u64> = BTreeMap::new();
            while !stop.is_cancelled() {
                let index = rng.random_range(0..keys.len());
                let key = &keys[index];
                let copy = rng.random_range(0..copies);
                // Reads are `advisory`: replicas may serve them within the staleness budget,
                // which is where lagging copies become visible.
                let url = match mode {
                    Mode::RandomSuffix => format!("{base}/v1/keys/{key}?{COPY}={copy}&{CLASS}=advisory"),
                    Mode::Affine | Mode::Delete | Mode::Resp => format!("{base}/v1/keys/{key}?{CLIENT}={session}&{CLASS}=advisory"),
                    Mode::Floor => match floors.get(&index) {
                        Some(floor) => {
                            format!("{base}/v1/keys/{key}?{COPY}={copy}&{MIN_VERSION}={floor}&{CLASS}=advisory")
                        }
                        None => format!("{base}/v1/keys/{key}?{COPY}={copy}&{CLASS}=advisory"),
                    },
                };
                let start = recorder.now_us();
                let answer = send(http.get(url)).await;
                recorder.push_read(&session, key, start, &answer);
                if let Some(version) = answer.version.filter(|_| answer.status == 200) {
                    let floor = floors.entry(index).or_insert(version);
                    *floor = (*floor).max(version);
                }
                if mode == Mode::Delete && answer.status == 404 {
                    // A miss: load from the source of truth and refill the cache at its version.
                    let start = recorder.now_us();
                    let version = source[index].load(Ordering::SeqCst);
                    if version > 0 {
                        let refill = send(
                            http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                                .body(format!("v{version}")),
                        )
                        .await;
                        let mut load = event(
                            &session,
                            Op::SourceLoad,
                            key,
                            start,
                            recorder.now_us(),
                            outcome_of(&refill),
                        );
                        load.version = Some(version);
                        recorder.push(load);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        }

        {
            let (cluster, recorder, stop) = (
                phase.cluster.clone(),
                phase.recorder.clone(),
                phase.stop.clone(),
            );
            let keys = keys.clone();
            let copies = self.copies;
            tasks.spawn(async move {
                while !stop.is_cancelled() {
                    sample_copies(&cluster, &keys, copies, &recorder).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }

        // Replication lag throughout the phase (see `faults::lag_replicas`).
        tasks.spawn(lag_replicas(
            phase.cluster.clone(),
            phase.recorder.clone(),
            phase.stop.clone(),
            StdRng::seed_from_u64(rng.random()),
        ));
        let Phase {
            http,
            base,
            cluster,
            recorder,
            stop,
            ..
        } = phase;

        // The seeded fault schedule, at fixed fractions of the phase.
        let phase_start = Instant::now();
        let mut loss_windows = Vec::new();
        for (fraction, fault) in schedule(phase_length) {
            let at = phase_length.mul_f64(fraction);
            tokio::select! {
                () = tokio::time::sleep(at.saturating_sub(phase_start.elapsed())) => {}
                () = stop.cancelled() => break,
            }
            let pick = rng.random_range(0..3);
            if let Some(window) = inject(fault, pick, &cluster, &recorder).await {
                loss_windows.push(window);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(phase_length.saturating_sub(phase_start.elapsed())) => {}
            () = stop.cancelled() => {}
        }
        if mode == Mode::RandomSuffix {
            let until = phase_start + phase_length * CONTROL_STRETCH;
            wait_for_a_violation(&recorder, &stop, until).await;
        }
        stop.cancel();
        while tasks.join_next().await.is_some() {}

        // Heal: once the cluster is healthy, re-send each key's last version (always safe) and
        // sample until every copy holds it.
        let healthy = cluster.clone();
        let _ = tokio::task::spawn_blocking(move || healthy.wait_healthy(Duration::from_secs(30)))
            .await;
        for (index, key) in keys.iter().enumerate() {
            let version = source[index].load(Ordering::SeqCst);
            let request = if mode == Mode::Delete {
                http.delete(format!("{base}/v1/keys/{key}?{VERSION}={}", version - 1))
            } else {
                http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                    .body(format!("v{version}"))
            };
            let _ = send(request).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.shutdown.is_cancelled() {
            sample_copies(&cluster, &keys, self.copies, &recorder).await;
            let converged = checkers::convergence(
                &recorder
                    .events
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .lagging_at_end
            .is_empty();
            if converged {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        loss_windows
    }
}
