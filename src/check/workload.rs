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
use tokio::task::JoinSet;

use super::checkers;
use super::client_cache;
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

/// What every task of one mode's phase shares about the workload: the mode, its keys, the
/// source of truth and the copies per key. Cheap enough to clone: each task takes its own copy.
#[derive(Clone)]
struct Workload {
    /// The mode the phase runs.
    mode: Mode,
    /// The phase's hot keys, `check:<mode><tag>:<k>`.
    keys: Vec<String>,
    /// The source of truth: each key's current version (index as in `keys`).
    source: Arc<Vec<AtomicU64>>,
    /// Copies per hot key.
    copies: u32,
}

impl Experiment {
    /// Runs one mode's phase: writers, readers, the direct sampler, replica lag and the seeded
    /// fault schedule for [`Experiment::phase_length`] (`random-suffix` longer, until its first
    /// violation: [`wait_for_a_violation`]), then heals and samples until every copy
    /// converged (at most 10 s). Returns the windows in which a fault lost writes.
    pub(super) async fn run_mode(&self, mode: Mode, rng: &mut StdRng) -> Vec<(u64, u64)> {
        let phase = self.phase();
        let workload = self.workload(mode);
        let mut tasks = tokio::task::JoinSet::new();
        self.spawn_writers(&phase, &workload, &mut tasks);
        self.spawn_readers(&phase, &workload, rng, &mut tasks);
        spawn_sampler(&phase, &workload, &mut tasks);
        // Replication lag throughout the phase (see `faults::lag_replicas`).
        tasks.spawn(lag_replicas(
            phase.cluster.clone(),
            phase.recorder.clone(),
            phase.stop.clone(),
            StdRng::seed_from_u64(rng.random()),
        ));
        if mode == Mode::ClientCache {
            tasks.spawn(client_cache::feed_cuts(
                phase.cluster.clone(),
                phase.recorder.clone(),
                phase.stop.clone(),
                self.phase_length,
                StdRng::seed_from_u64(rng.random()),
            ));
        }
        let loss_windows = self.inject_faults_until_the_end(&phase, mode, rng).await;
        phase.stop.cancel();
        while tasks.join_next().await.is_some() {}
        self.heal_and_converge(&phase, &workload).await;
        loss_windows
    }

    /// The workload of `mode`'s phase: its keys (tagged with [`Experiment::key_tag`]), each at
    /// version 0 in the source of truth.
    fn workload(&self, mode: Mode) -> Workload {
        let keys: Vec<String> = (0..self.keys)
            .map(|k| format!("check:{}{}:{k}", mode.as_str(), self.key_tag))
            .collect();
        let source = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
        Workload {
            mode,
            keys,
            source,
            copies: self.copies,
        }
    }

    /// Spawns one writer per key: on the Redis-protocol door in the `resp` mode, else over HTTP
    /// ([`http_writer`]).
    fn spawn_writers(&self, phase: &Phase, workload: &Workload, tasks: &mut JoinSet<()>) {
        for (index, key) in workload.keys.iter().enumerate() {
            if let (Mode::ClientCache, Some(doors)) = (workload.mode, &self.resp) {
                tasks.spawn(client_cache::writer(
                    resp_client(doors, phase),
                    index,
                    key.clone(),
                    workload.source.clone(),
                ));
                continue;
            }
            if let (Mode::Resp, Some(doors)) = (workload.mode, &self.resp) {
                let client = resp_client(doors, phase);
                tasks.spawn(resp::writer(
                    client,
                    index,
                    key.clone(),
                    workload.source.clone(),
                ));
                continue;
            }
            tasks.spawn(http_writer(phase.clone(), workload.clone(), index));
        }
    }

    /// Spawns the reader sessions, each with a generator seeded from `rng`: on the
    /// Redis-protocol door in the `resp` mode, else over HTTP ([`http_reader`]).
    fn spawn_readers(
        &self,
        phase: &Phase,
        workload: &Workload,
        rng: &mut StdRng,
        tasks: &mut JoinSet<()>,
    ) {
        for reader in 0..self.readers {
            let rng = StdRng::seed_from_u64(rng.random());
            if let (Mode::ClientCache, Some(doors)) = (workload.mode, &self.resp) {
                // A blocking reader, as redis-py's sockets are: its own thread.
                let (client, keys) = (resp_client(doors, phase), workload.keys.clone());
                tasks.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || {
                        client_cache::reader(client, reader, keys, rng);
                    })
                    .await;
                });
                continue;
            }
            if let (Mode::Resp, Some(doors)) = (workload.mode, &self.resp) {
                let client = resp_client(doors, phase);
                tasks.spawn(resp::reader(client, reader, workload.keys.clone(), rng));
                continue;
            }
            tasks.spawn(http_reader(phase.clone(), workload.clone(), reader, rng));
        }
    }

    /// The seeded fault schedule, at fixed fractions of the phase, then the rest of the phase
    /// (for `random-suffix`, until its first violation: [`wait_for_a_violation`]); ends early
    /// when the phase's `stop` is cancelled. Returns the windows in which a fault lost writes.
    async fn inject_faults_until_the_end(
        &self,
        phase: &Phase,
        mode: Mode,
        rng: &mut StdRng,
    ) -> Vec<(u64, u64)> {
        let Phase {
            cluster,
            recorder,
            stop,
            ..
        } = phase;
        let phase_length = self.phase_length;
        let phase_start = Instant::now();
        let mut loss_windows = Vec::new();
        for (fraction, fault) in schedule(phase_length) {
            let at = phase_length.mul_f64(fraction);
            tokio::select! {
                () = tokio::time::sleep(at.saturating_sub(phase_start.elapsed())) => {}
                () = stop.cancelled() => break,
            }
            let pick = rng.random_range(0..3);
            if let Some(window) = inject(fault, pick, cluster, recorder).await {
                loss_windows.push(window);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(phase_length.saturating_sub(phase_start.elapsed())) => {}
            () = stop.cancelled() => {}
        }
        if mode == Mode::RandomSuffix {
            let until = phase_start + phase_length * CONTROL_STRETCH;
            wait_for_a_violation(recorder, stop, until).await;
        }
        loss_windows
    }

    /// Heal: once the cluster is healthy, re-send each key's last version (always safe) and
    /// sample until every copy holds it (at most 10 s, or until the run's shutdown).
    async fn heal_and_converge(&self, phase: &Phase, workload: &Workload) {
        let Phase {
            http,
            base,
            cluster,
            recorder,
            ..
        } = phase;
        let healthy = cluster.clone();
        let _ = tokio::task::spawn_blocking(move || healthy.wait_healthy(Duration::from_secs(30)))
            .await;
        for (index, key) in workload.keys.iter().enumerate() {
            let version = workload.source[index].load(Ordering::SeqCst);
            let request = if workload.mode == Mode::Delete {
                http.delete(format!("{base}/v1/keys/{key}?{VERSION}={}", version - 1))
            } else {
                http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                    .body(format!("v{version}"))
            };
            let _ = send(request).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.shutdown.is_cancelled() {
            sample_copies(cluster, &workload.keys, self.copies, recorder).await;
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
    }
}

/// The handles of a `resp` client task of `phase`.
fn resp_client(doors: &Arc<resp::RespDoors>, phase: &Phase) -> resp::RespClient {
    resp::RespClient {
        doors: doors.clone(),
        recorder: phase.recorder.clone(),
        stop: phase.stop.clone(),
    }
}

/// Spawns the direct sampler: every copy of every key on its master, every 50 ms, until the
/// phase's `stop`.
fn spawn_sampler(phase: &Phase, workload: &Workload, tasks: &mut JoinSet<()>) {
    let (cluster, recorder, stop) = (
        phase.cluster.clone(),
        phase.recorder.clone(),
        phase.stop.clone(),
    );
    let keys = workload.keys.clone();
    let copies = workload.copies;
    tasks.spawn(async move {
        while !stop.is_cancelled() {
            sample_copies(&cluster, &keys, copies, &recorder).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// The HTTP writer of key `index`, until the phase's `stop`: publishes the key's next version
/// (in `delete` mode, invalidates at the odd version below the next value) through the phase's
/// `write_base` (the readers' own service, or in the near-cache rows the other one), and
/// outside `delete` mode reads its own write back.
async fn http_writer(phase: Phase, workload: Workload, index: usize) {
    let Workload {
        mode, keys, source, ..
    } = workload;
    let key = &keys[index];
    let (http, _, recorder, stop) = phase.service_handles();
    let base = phase.write_base;
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
            key,
            recorder.since(start),
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
            recorder.push_read(&session, key, start, &answer);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One HTTP reader session, until the phase's `stop`: reads a random key the way the mode says
/// ([`read_url`]), keeps the highest version served per key (the `floor` mode's floors), and in
/// `delete` mode refills a miss from the source of truth ([`refill_from_source`]).
async fn http_reader(phase: Phase, workload: Workload, reader: u32, mut rng: StdRng) {
    let (http, base, recorder, stop) = phase.service_handles();
    let session = format!("reader-{reader}");
    let mut floors: BTreeMap<usize, u64> = BTreeMap::new();
    while !stop.is_cancelled() {
        let index = rng.random_range(0..workload.keys.len());
        let key = &workload.keys[index];
        let copy = rng.random_range(0..workload.copies);
        let url = read_url(
            &format!("{base}/v1/keys/{key}"),
            workload.mode,
            &session,
            copy,
            floors.get(&index).copied(),
        );
        let start = recorder.now_us();
        let answer = send(http.get(url)).await;
        recorder.push_read(&session, key, start, &answer);
        if let Some(version) = answer.version.filter(|_| answer.status == 200) {
            let floor = floors.entry(index).or_insert(version);
            *floor = (*floor).max(version);
        }
        if workload.mode == Mode::Delete && answer.status == 404 {
            refill_from_source(&phase, &workload, index, &session).await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The URL of a reader's read of the key at `key_url` in `mode`. Reads are `advisory`: replicas
/// may serve them within the staleness budget, which is where lagging copies become visible.
fn read_url(key_url: &str, mode: Mode, session: &str, copy: u32, floor: Option<u64>) -> String {
    match mode {
        Mode::RandomSuffix => format!("{key_url}?{COPY}={copy}&{CLASS}=advisory"),
        Mode::Affine | Mode::Delete | Mode::Resp | Mode::ClientCache => {
            format!("{key_url}?{CLIENT}={session}&{CLASS}=advisory")
        }
        Mode::Floor => match floor {
            Some(floor) => {
                format!("{key_url}?{COPY}={copy}&{MIN_VERSION}={floor}&{CLASS}=advisory")
            }
            None => format!("{key_url}?{COPY}={copy}&{CLASS}=advisory"),
        },
    }
}

/// A `delete`-mode reader's miss on key `index`: loads the key from the source of truth and
/// refills the cache at its version (nothing while the key has none yet), recorded as a source
/// load.
async fn refill_from_source(phase: &Phase, workload: &Workload, index: usize, session: &str) {
    let Phase {
        http,
        base,
        recorder,
        ..
    } = phase;
    let key = &workload.keys[index];
    let start = recorder.now_us();
    let version = workload.source[index].load(Ordering::SeqCst);
    if version > 0 {
        let refill = send(
            http.put(format!("{base}/v1/keys/{key}?{VERSION}={version}"))
                .body(format!("v{version}")),
        )
        .await;
        let mut load = event(
            session,
            Op::SourceLoad,
            key,
            recorder.since(start),
            outcome_of(&refill),
        );
        load.version = Some(version);
        recorder.push(load);
    }
}
