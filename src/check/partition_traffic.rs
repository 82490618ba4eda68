//! The traffic of one partition scenario ([`Traffic`]): two writer sessions (`wa` publishes
//! through instance A, `wb` through B; a scenario switches which one writes), readers with an
//! explicit client id pinned to one instance each (`ca`, `cb`: across instances only the
//! reader's own floor carries over), and readers that carry the session token as well as their
//! client id and roam over both instances (`sa`, `sb`: the token carries their floors from one
//! instance to the other). Every operation goes to the shared [`Recorder`]; every
//! publish is also kept as a [`Published`], with whether each answer line said
//! `replicas_acked >= 1`.
//!
//! Each task draws its pauses and its choice of instance from its own generator seeded by the
//! run's seed, so the interleaving a seed asks for is repeatable up to the timing of the
//! answers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::history::{Op, Outcome};
use super::recorder::{event, send, Answer, Recorder};
use hotsplit::wire::{header, query};

/// Instance A's index in [`Traffic::bases`].
pub(super) const A: usize = 0;

/// Instance B's index in [`Traffic::bases`].
pub(super) const B: usize = 1;

/// [`Traffic::set_writer`]'s value for "nobody publishes".
const NO_WRITER: usize = 2;

/// The writer session of each instance.
const WRITERS: [&str; 2] = ["wa", "wb"];

/// One publish and how it was answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Published {
    /// The version sent (from one counter shared by both writers, so versions only grow).
    pub(super) version: u64,
    /// The instance it went through ([`A`] or [`B`]).
    pub(super) door: usize,
    /// When it was sent, the run's µs.
    pub(super) start_us: u64,
    /// The HTTP status (0: no answer).
    pub(super) status: u16,
    /// Every answer line said `replicas_acked >= 1`.
    pub(super) replica_acked: bool,
}

impl Published {
    /// Answered 200 or 202: the service took it (applied, or queued durably).
    pub(super) fn answered(&self) -> bool {
        matches!(self.status, 200 | 202)
    }

    /// Acknowledged as the scenario's rule defines it: under `sync_replicas = 1`, answered 200
    /// with a replica's acknowledgement on every line; without the rule, answered.
    pub(super) fn acknowledged(&self, rule: bool) -> bool {
        if rule {
            self.status == 200 && self.replica_acked
        } else {
            self.answered()
        }
    }
}

/// The state the tasks of one scenario share.
pub(super) struct Traffic {
    /// The client every task uses (each request bounded).
    pub(super) http: reqwest::Client,
    /// The history.
    pub(super) recorder: Recorder,
    /// The one key the scenario publishes and reads.
    pub(super) key: String,
    /// `http://<ip>:<port>` of A and of B.
    pub(super) bases: [String; 2],
    /// The next version to publish.
    next_version: AtomicU64,
    /// Which instance's writer publishes now: [`A`], [`B`] or [`NO_WRITER`].
    writer: AtomicUsize,
    /// Publishes under way (counted before the writer checks [`Traffic::writer`], so that
    /// [`Traffic::stop_writers`] sees every publish that may still start).
    in_flight: AtomicUsize,
    /// Every publish so far.
    published: Mutex<Vec<Published>>,
    /// The seed of the tasks' generators.
    seed: u64,
}

impl Traffic {
    /// The traffic of `key` through the instances at `bases`; A's writer publishes first.
    pub(super) fn new(
        http: reqwest::Client,
        recorder: Recorder,
        key: String,
        bases: [String; 2],
        seed: u64,
    ) -> Arc<Traffic> {
        Arc::new(Traffic {
            http,
            recorder,
            key,
            bases,
            next_version: AtomicU64::new(1),
            writer: AtomicUsize::new(A),
            in_flight: AtomicUsize::new(0),
            published: Mutex::new(Vec::new()),
            seed,
        })
    }

    /// Makes `door`'s writer the one that publishes ([`NO_WRITER`]: none). A publish in flight
    /// finishes.
    pub(super) fn set_writer(&self, door: usize) {
        self.writer.store(door, Ordering::SeqCst);
    }

    /// Stops both writers and waits until no publish is under way (each is bounded by the
    /// client's timeout), so the publishes are final.
    pub(super) async fn stop_writers(&self) {
        self.set_writer(NO_WRITER);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every publish so far.
    pub(super) fn published(&self) -> Vec<Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts the writers and readers on `tracker`; they stop when `stop` is cancelled.
    pub(super) fn start(self: &Arc<Self>, tracker: &TaskTracker, stop: &CancellationToken) {
        for door in [A, B] {
            let (traffic, stop) = (Arc::clone(self), stop.clone());
            tracker.spawn(async move { traffic.write_loop(door, stop).await });
        }
        for (index, reader) in ["ca", "cb", "sa", "sb"].into_iter().enumerate() {
            let (traffic, stop) = (Arc::clone(self), stop.clone());
            tracker.spawn(async move { traffic.read_loop(index, reader, stop).await });
        }
    }

    /// A generator for task `salt`, from the run's seed.
    fn rng(&self, salt: u64) -> StdRng {
        StdRng::seed_from_u64(self.seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// `door`'s writer: while it is the one that publishes, publishes the next version with its
    /// client id and token, then (one time in two, seeded) reads it back through the same
    /// instance.
    async fn write_loop(self: Arc<Self>, door: usize, stop: CancellationToken) {
        let mut rng = self.rng(100 + door as u64);
        let mut token: Option<String> = None;
        let session = WRITERS[door];
        while !stop.is_cancelled() {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if self.writer.load(Ordering::SeqCst) != door {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            self.publish(door, &mut token).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if rng.random_bool(0.5) {
                self.read(door, session, true, &mut token).await;
            }
            pause(&mut rng, &stop, 5..40).await;
        }
    }

    /// One reader: `ca` reads through A and `cb` through B with their client ids and no
    /// token; `sa` and `sb` send their client id and the session token, and pick an instance at
    /// random for every read.
    async fn read_loop(self: Arc<Self>, index: usize, session: &str, stop: CancellationToken) {
        let mut rng = self.rng(200 + index as u64);
        let mut token: Option<String> = None;
        let carries_token = session.starts_with('s');
        while !stop.is_cancelled() {
            let door = match session {
                "ca" => A,
                "cb" => B,
                _ => rng.random_range(A..=B),
            };
            self.read(door, session, carries_token, &mut token).await;
            pause(&mut rng, &stop, 5..40).await;
        }
    }

    /// Reads the key through `door` with `session` as the client id (and, with
    /// `carries_token`, the session token, keeping the one answered), and records the read.
    async fn read(
        &self,
        door: usize,
        session: &str,
        carries_token: bool,
        token: &mut Option<String>,
    ) {
        let url = format!(
            "{}/v1/keys/{}?{}={session}",
            self.bases[door],
            self.key,
            query::CLIENT
        );
        let mut request = self.http.get(url);
        if let Some(token) = token.as_deref().filter(|_| carries_token) {
            request = request.header(header::SESSION, token);
        }
        let start_us = self.recorder.now_us();
        let answer = send(request).await;
        keep_token(token, &answer);
        self.recorder
            .push_read(session, &self.key, start_us, &answer);
    }

    /// Publishes the next version through `door` as its writer, and records it.
    async fn publish(&self, door: usize, token: &mut Option<String>) {
        let version = self.next_version.fetch_add(1, Ordering::SeqCst);
        let session = WRITERS[door];
        let url = format!(
            "{}/v1/keys/{}?{}={version}&{}={session}",
            self.bases[door],
            self.key,
            query::VERSION,
            query::CLIENT
        );
        let mut request = self.http.put(url).body(format!("v{version}"));
        if let Some(token) = token.as_deref() {
            request = request.header(header::SESSION, token);
        }
        let start_us = self.recorder.now_us();
        let (status, replica_acked, answered_token) = match request.send().await {
            Ok(answer) => {
                let status = answer.status().as_u16();
                let answered_token = answer
                    .headers()
                    .get(header::SESSION)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let report: Value = answer.json().await.unwrap_or(Value::Null);
                (status, every_line_acked(&report), answered_token)
            }
            Err(_) => (0, false, None),
        };
        if answered_token.is_some() {
            *token = answered_token;
        }
        let published = Published {
            version,
            door,
            start_us,
            status,
            replica_acked,
        };
        let outcome = if published.answered() {
            Outcome::Ok
        } else {
            Outcome::Error(format!("http {status}"))
        };
        let mut write = event(
            session,
            Op::Write,
            &self.key,
            self.recorder.since(start_us),
            outcome,
        );
        write.version = Some(version);
        self.recorder.push(write);
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(published);
    }
}

/// Whether a publish report's every line says `replicas_acked >= 1` (and there is a line).
fn every_line_acked(report: &Value) -> bool {
    report["outcomes"].as_array().is_some_and(|lines| {
        !lines.is_empty()
            && lines
                .iter()
                .all(|line| line["replicas_acked"].as_u64().is_some_and(|n| n >= 1))
    })
}

/// Keeps the session token `answer` carried, if any.
fn keep_token(token: &mut Option<String>, answer: &Answer) {
    if let Some(answered) = &answer.session {
        *token = Some(answered.clone());
    }
}

/// Sleeps a seeded number of milliseconds in `range_ms`, or until `stop`.
async fn pause(rng: &mut StdRng, stop: &CancellationToken, range_ms: std::ops::Range<u64>) {
    let ms = rng.random_range(range_ms);
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
        () = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledged_depends_on_the_rule() {
        let published = |status, replica_acked| Published {
            version: 1,
            door: A,
            start_us: 0,
            status,
            replica_acked,
        };
        assert!(published(202, false).acknowledged(false));
        assert!(!published(202, false).acknowledged(true));
        assert!(!published(200, false).acknowledged(true));
        assert!(published(200, true).acknowledged(true));
        assert!(!published(503, false).acknowledged(false));
    }

    #[test]
    fn every_line_must_carry_a_replica_ack() {
        let report = |acks: &[u64]| {
            serde_json::json!({
                "outcomes": acks.iter().map(|n| serde_json::json!({"replicas_acked": n})).collect::<Vec<_>>()
            })
        };
        assert!(every_line_acked(&report(&[1, 2])));
        assert!(!every_line_acked(&report(&[1, 0])));
        assert!(!every_line_acked(&report(&[])));
        assert!(!every_line_acked(&Value::Null));
    }
}
