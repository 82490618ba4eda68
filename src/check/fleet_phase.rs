//! The workload every row of `check --instances 2` runs ([`phase`]): writers publish through
//! one instance and read their write back through the other, readers alternate instances, each
//! session carrying its session token or not, while replicas lag; then the check that no
//! accepted edit was lost. [`super::fleet`] runs its rows with it, [`super::autosplit`] its
//! split row.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use super::faults::lag_replicas;
use super::recorder::{send, Recorder};
use hotsplit::wire::header::SESSION;
use hotsplit::wire::query::{CLASS, CLIENT, COPY, VERSION};
use hotsplit_devcluster::{Cluster, TlsFiles};

/// What `--instances 2` runs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// How long the workload phases run, all rows together (each row a quarter).
    pub duration: Duration,
    /// Seed of the readers' choices and the replica pauses.
    pub seed: u64,
    /// Hot keys.
    pub keys: u32,
    /// Reader sessions.
    pub readers: u32,
    /// Copies per hot key.
    pub copies: u32,
    /// TLS end to end, as for the one-instance check (`CheckOptions::tls`). Default: none.
    pub tls: Option<TlsFiles>,
}

/// How a session's reads pick a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadMode {
    /// Each read names a random copy (`?copy=i`).
    RandomSuffix,
    /// Each read carries the session's client id (its affine copy).
    Affine,
}

impl ReadMode {
    /// The mode's name in the report, as in the one-instance check.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ReadMode::RandomSuffix => "random-suffix",
            ReadMode::Affine => "affine",
        }
    }
}

/// The counts of one phase.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FleetFigures {
    /// Publishes answered 2xx.
    pub writes: u64,
    /// Reads answered 200.
    pub reads: u64,
    /// Reads served an older version than the session had been served before.
    pub monotonic_violations: u64,
    /// Read-backs served an older version than the writer had just written.
    pub read_your_writes_violations: u64,
    /// Keys whose last accepted publish a `primary` read did not serve once the row ended (and
    /// the heals had [`LOST_EDIT_LIMIT`] to land): edits lost.
    pub lost_edits: u64,
    /// How many distinct copies served the row's reads.
    pub copies_served: u32,
}

/// How long a reader waits between reads unless its row says otherwise.
pub(super) const READER_PAUSE_MS: u64 = 2;

/// How long, once a row ends, its last accepted edits have to be served by a `primary` read
/// (a copy whose write was queued heals meanwhile) before they count as lost.
const LOST_EDIT_LIMIT: Duration = Duration::from_secs(10);

/// What one row runs.
pub(super) struct Row {
    /// How reads pick a copy.
    pub(super) mode: ReadMode,
    /// Whether sessions send back their session token.
    pub(super) token: bool,
    /// The prefix of the row's keys (inside the `fleet:` family, or the split row's own).
    pub(super) prefix: String,
    /// How long each reader waits between reads, in ms; the split row changes it mid-row to
    /// make its keys hot, then cool.
    pub(super) reader_pause: Arc<AtomicU64>,
}

/// A session's last token, sent with its next request when the row carries tokens.
#[derive(Default)]
struct Session {
    /// The last `Hotsplit-Session` answered, if any.
    token: Option<String>,
}

impl Session {
    /// `request` with the session's token when `carry` is set.
    fn attach(&self, carry: bool, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (&self.token, carry) {
            (Some(token), true) => request.header(SESSION, token),
            _ => request,
        }
    }

    /// Reads `url` with the session's token when `carry` is set, and keeps the token answered.
    async fn read(
        &mut self,
        http: &reqwest::Client,
        carry: bool,
        url: String,
    ) -> super::recorder::Answer {
        let read = send(self.attach(carry, http.get(url))).await;
        self.keep(&read);
        read
    }

    /// Keeps the token an answer carried.
    fn keep(&mut self, answer: &super::recorder::Answer) {
        if let Some(token) = &answer.session {
            self.token = Some(token.clone());
        }
    }
}

/// The URL of a read of `key` through `base` in `mode`.
fn read_url(base: &str, key: &str, mode: ReadMode, session: &str, copy: u32) -> String {
    match mode {
        ReadMode::RandomSuffix => format!("{base}/v1/keys/{key}?{COPY}={copy}&{CLASS}=advisory"),
        ReadMode::Affine => format!("{base}/v1/keys/{key}?{CLIENT}={session}&{CLASS}=advisory"),
    }
}

/// What a phase runs against: the instances under test and the cluster under them.
pub(super) struct Fleet<'a> {
    /// The HTTP client every request of the check uses (it sends the token).
    pub(super) http: &'a reqwest::Client,
    /// The base URL of each instance; writers and readers take turns through them, and the
    /// lost-edit check reads through the first.
    pub(super) bases: &'a [String],
    /// The cluster both instances run on; its replicas are paused to make them lag.
    pub(super) cluster: &'a Arc<Cluster>,
}

/// What every task of one phase shares: the instances, the row's counts and accepted versions,
/// how it reads, and when to stop. Cheap to clone: each task takes its own copy.
#[derive(Clone)]
struct PhaseTasks {
    /// The HTTP client of the check.
    http: reqwest::Client,
    /// The base URL of each instance, taken in turns.
    bases: Vec<String>,
    /// Writes, reads, monotonic-read and read-your-writes violations, and a bit per copy that
    /// served a read.
    counts: Arc<[AtomicU64; 5]>,
    /// Each key's last version answered 2xx.
    accepted: Arc<Vec<AtomicU64>>,
    /// How reads pick a copy.
    mode: ReadMode,
    /// Whether sessions send back their session token.
    carry: bool,
    /// Copies per hot key.
    copies: u32,
    /// Cancelled when the phase ends.
    stop: CancellationToken,
}

/// One workload phase over both instances, until `stop` is cancelled; then the check that no
/// accepted edit was lost.
pub(super) async fn phase(
    fleet: &Fleet<'_>,
    options: &FleetOptions,
    row: &Row,
    stop: CancellationToken,
) -> FleetFigures {
    let keys: Vec<String> = (0..options.keys)
        .map(|k| format!("{}{k}", row.prefix))
        .collect();
    let shared = PhaseTasks {
        http: fleet.http.clone(),
        bases: fleet.bases.to_vec(),
        counts: Arc::new(Default::default()),
        accepted: Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect()),
        mode: row.mode,
        carry: row.token,
        copies: options.copies,
        stop: stop.clone(),
    };
    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut tasks = tokio::task::JoinSet::new();
    for (index, key) in keys.iter().enumerate() {
        let rng = StdRng::seed_from_u64(rng.random());
        tasks.spawn(write_and_read_back(shared.clone(), index, key.clone(), rng));
    }
    for reader in 0..options.readers {
        let rng = StdRng::seed_from_u64(rng.random());
        let pause = row.reader_pause.clone();
        tasks.spawn(read_in_turns(
            shared.clone(),
            reader,
            keys.clone(),
            pause,
            rng,
        ));
    }
    tasks.spawn(lag_replicas(
        fleet.cluster.clone(),
        Recorder::new(),
        stop.clone(),
        StdRng::seed_from_u64(options.seed.wrapping_add(1)),
    ));
    stop.cancelled().await;
    while tasks.join_next().await.is_some() {}
    let lost_edits = count_lost_edits(fleet, &keys, &shared.accepted).await;
    let counts = &shared.counts;
    FleetFigures {
        writes: counts[0].load(Ordering::Relaxed),
        reads: counts[1].load(Ordering::Relaxed),
        monotonic_violations: counts[2].load(Ordering::Relaxed),
        read_your_writes_violations: counts[3].load(Ordering::Relaxed),
        lost_edits,
        copies_served: counts[4].load(Ordering::Relaxed).count_ones(),
    }
}

/// The writer of key `index`, until `stop`: publishes the next version through one instance
/// and, once accepted, reads it back through the other, counting read-your-writes violations.
async fn write_and_read_back(shared: PhaseTasks, index: usize, key: String, mut rng: StdRng) {
    let PhaseTasks {
        http,
        bases,
        counts,
        accepted,
        mode,
        carry,
        copies,
        stop,
    } = shared;
    let session = format!("writer-{index}");
    let mut held = Session::default();
    let mut turn = 0usize;
    for version in 1u64.. {
        if stop.is_cancelled() {
            break;
        }
        let write = send(
            held.attach(
                carry,
                http.put(format!(
                    "{}/v1/keys/{key}?{VERSION}={version}&{CLIENT}={session}",
                    bases[turn % bases.len()]
                )),
            )
            .body(format!("v{version}")),
        )
        .await;
        held.keep(&write);
        turn += 1;
        if !(200..300).contains(&write.status) {
            continue;
        }
        counts[0].fetch_add(1, Ordering::Relaxed);
        accepted[index].fetch_max(version, Ordering::Relaxed);
        let copy = rng.random_range(0..copies);
        let url = read_url(&bases[turn % bases.len()], &key, mode, &session, copy);
        let read = held.read(&http, carry, url).await;
        turn += 1;
        if read.status == 200 {
            counts[1].fetch_add(1, Ordering::Relaxed);
            note_copy(&counts[4], &read);
            if read.version.is_some_and(|served| served < version) {
                counts[3].fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reader session `reader`, until `stop`: reads random keys through the instances in turn,
/// counting monotonic-read violations, and waits `pause` ms between reads.
async fn read_in_turns(
    shared: PhaseTasks,
    reader: u32,
    keys: Vec<String>,
    pause: Arc<AtomicU64>,
    mut rng: StdRng,
) {
    let PhaseTasks {
        http,
        bases,
        counts,
        mode,
        carry,
        copies,
        stop,
        ..
    } = shared;
    let session = format!("reader-{reader}");
    let mut held = Session::default();
    let mut seen = vec![0u64; keys.len()];
    let mut turn = 0usize;
    while !stop.is_cancelled() {
        let index = rng.random_range(0..keys.len());
        let copy = rng.random_range(0..copies);
        let url = read_url(
            &bases[turn % bases.len()],
            &keys[index],
            mode,
            &session,
            copy,
        );
        let read = held.read(&http, carry, url).await;
        turn += 1;
        if let Some(version) = read.version.filter(|_| read.status == 200) {
            counts[1].fetch_add(1, Ordering::Relaxed);
            note_copy(&counts[4], &read);
            if version < seen[index] {
                counts[2].fetch_add(1, Ordering::Relaxed);
            }
            seen[index] = seen[index].max(version);
        }
        tokio::time::sleep(Duration::from_millis(pause.load(Ordering::Relaxed))).await;
    }
}

/// How many keys' last accepted version a `primary` read through the first instance did not
/// serve within [`LOST_EDIT_LIMIT`]: edits lost.
async fn count_lost_edits(fleet: &Fleet<'_>, keys: &[String], accepted: &[AtomicU64]) -> u64 {
    let mut lost_edits = 0;
    for (key, accepted) in keys.iter().zip(accepted.iter()) {
        let accepted = accepted.load(Ordering::Relaxed);
        if accepted > 0 && !served_at_least(fleet.http, &fleet.bases[0], key, accepted).await {
            lost_edits += 1;
        }
    }
    lost_edits
}

/// Sets the bit of the copy that served `read` (copies 0..63; the check splits into fewer).
fn note_copy(bits: &AtomicU64, read: &super::recorder::Answer) {
    if let Some(copy) = read.copy.filter(|copy| *copy < 64) {
        bits.fetch_or(1 << copy, Ordering::Relaxed);
    }
}

/// Whether a `primary` read of `key` through `base` serves `version` or newer within
/// [`LOST_EDIT_LIMIT`], polled.
async fn served_at_least(http: &reqwest::Client, base: &str, key: &str, version: u64) -> bool {
    let deadline = Instant::now() + LOST_EDIT_LIMIT;
    loop {
        let read = send(http.get(format!(
            "{base}/v1/keys/{key}?{CLASS}=primary&{CLIENT}=lost-edit-check"
        )))
        .await;
        if read.status == 200 && read.version.is_some_and(|served| served >= version) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
