//! What a run observes: the [`Recorder`] (the shared, append-only history with a monotonic
//! clock), requests to the service reduced to what the history needs ([`send`], [`Answer`]), and
//! direct samples of every copy on its master ([`sample_copies`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hotsplit::wire;
use hotsplit_devcluster::{self as devcluster, Cluster};

use super::history::{Event, Op, Outcome};

/// A shared, append-only history with a monotonic clock.
#[derive(Clone)]
pub(super) struct Recorder {
    /// The run's time origin.
    origin: Instant,
    /// Every event so far.
    pub(super) events: Arc<Mutex<Vec<Event>>>,
    /// Operations recorded, for progress.
    pub(super) count: Arc<AtomicU64>,
}

impl Recorder {
    pub(super) fn new() -> Recorder {
        Recorder {
            origin: Instant::now(),
            events: Arc::new(Mutex::new(Vec::new())),
            count: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(super) fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The span of an operation that started at `start_us` and ends now.
    pub(super) fn since(&self, start_us: u64) -> Span {
        Span {
            start_us,
            end_us: self.now_us(),
        }
    }

    pub(super) fn push(&self, event: Event) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    /// Records a read through hotsplit that started at `start_us` and just ended with `answer`.
    pub(super) fn push_read(&self, session: &str, key: &str, start_us: u64, answer: &Answer) {
        let mut read = event(
            session,
            Op::Read,
            key,
            self.since(start_us),
            outcome_of(answer),
        );
        read.version = answer.version;
        read.copy = answer.copy;
        read.served_by = answer.served_by.clone();
        read.route = answer.route.clone();
        self.push(read);
    }

    pub(super) fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// When an operation ran, in µs on the recorder's clock ([`Recorder::now_us`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    /// When the operation started.
    pub(super) start_us: u64,
    /// When it ended (a sample or a fault: when it was taken or done).
    pub(super) end_us: u64,
}

/// An event of `session` on `key` that ran over `span`, with no version, copy, server or route
/// yet (the caller sets those it knows).
pub(super) fn event(session: &str, op: Op, key: &str, span: Span, outcome: Outcome) -> Event {
    let Span { start_us, end_us } = span;
    Event {
        session: session.to_owned(),
        op,
        key: key.to_owned(),
        version: None,
        copy: None,
        served_by: None,
        route: None,
        start_us,
        end_us,
        outcome,
    }
}

/// A response reduced to what the history needs.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) version: Option<u64>,
    pub(super) copy: Option<u32>,
    pub(super) served_by: Option<String>,
    pub(super) route: Option<String>,
    pub(super) code: Option<String>,
    /// The session token the answer carried (`Hotsplit-Session`).
    pub(super) session: Option<String>,
}

pub(super) async fn send(request: reqwest::RequestBuilder) -> Answer {
    match request.send().await {
        Ok(response) => {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
            };
            let status = response.status().as_u16();
            let version = header(wire::header::VERSION).and_then(|text| text.parse().ok());
            let copy = header(wire::header::COPY).and_then(|text| text.parse().ok());
            let served_by = header(wire::header::SERVED_BY);
            let route = header(wire::header::ROUTE);
            let session = header(wire::header::SESSION);
            let code = if status >= 400 {
                response
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|body| body["code"].as_str().map(str::to_owned))
            } else {
                None
            };
            Answer {
                status,
                version,
                copy,
                served_by,
                route,
                code,
                session,
            }
        }
        Err(_) => Answer {
            status: 0,
            version: None,
            copy: None,
            served_by: None,
            route: None,
            code: Some("transport".into()),
            session: None,
        },
    }
}

pub(super) fn outcome_of(answer: &Answer) -> Outcome {
    match answer.status {
        200 | 202 => Outcome::Ok,
        304 => Outcome::NotModified,
        404 => Outcome::NotFound,
        _ => Outcome::Error(
            answer
                .code
                .clone()
                .unwrap_or_else(|| format!("http {}", answer.status)),
        ),
    }
}

/// The owning master's port of `key`, from a cached topology.
pub(super) fn owner_port(topology: &[devcluster::NodeInfo], key: &str) -> Option<u16> {
    let slot = fred::util::redis_keyslot(key.as_bytes());
    topology
        .iter()
        .find(|node| node.is_master() && !node.is_failed() && node.serves_slot(slot))
        .map(|node| node.port)
}

/// Reads every copy of `keys` directly from their masters, recording a sample per copy.
pub(super) async fn sample_copies(
    cluster: &Arc<Cluster>,
    keys: &[String],
    copies: u32,
    recorder: &Recorder,
) {
    let cluster = cluster.clone();
    let keys = keys.to_vec();
    let recorder = recorder.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(topology) = cluster.topology() else {
            return;
        };
        for key in &keys {
            let Ok(parsed) = hotsplit::key::Key::parse(key) else {
                continue;
            };
            for copy in 0..copies {
                // The check's families keep the default naming, `K#i`.
                let copy_key = parsed
                    .copy_key(copy, hotsplit::key::Placement::Suffix)
                    .to_string();
                let Some(port) = owner_port(&topology, &copy_key) else {
                    continue;
                };
                let start = recorder.now_us();
                let Ok(text) = cluster.cli_with_timeout(
                    port,
                    &["HGET", &copy_key, "ver"],
                    Duration::from_millis(200),
                ) else {
                    continue;
                };
                let mut sample = event(
                    "sampler",
                    Op::Sample,
                    key,
                    recorder.since(start),
                    Outcome::Ok,
                );
                sample.copy = Some(copy);
                sample.version = text.parse().ok();
                if sample.version.is_none() {
                    sample.outcome = Outcome::NotFound;
                }
                sample.served_by = Some(format!("127.0.0.1:{port}"));
                recorder.push(sample);
            }
        }
    })
    .await;
}
