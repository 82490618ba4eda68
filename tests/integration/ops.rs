//! One scripted sequence run twice on real Redis (a primary and a replica, two service
//! instances): once through the operations layer directly (`hotsplit::ops`, as a second door
//! would call it), once through HTTP, step by step compared: a publish, a read with a floor, a
//! read moved to the primary by a paused replica (`CLIENT PAUSE … WRITE`), a refused publish
//! (stale version), and the session token carried to the second instance, with an error answer
//! there. Each step's outcome (status, code, version, route reason, serving role) and the floors
//! of the token it leaves must be the same through both, and an error answer carries the token.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use hotsplit::fleet::session::Session;
use hotsplit::http::problem::ApiError;
use hotsplit::key::{Key, Version};
use hotsplit::ops::{Caller, ClientSession, Edit, Ops, PublishCall, ReadRequest, Writer};
use hotsplit::publish::PublishStatus;
use hotsplit::read::ReadAnswer;
use hotsplit::server::Service;
use hotsplit::store::{now_unix_ms, Role};
use hotsplit_devcluster::{self as devcluster, PrimaryReplica};
use reqwest::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::harness::{self, config_from_toml, poll};

/// `op:` keys read the replica under a 30 s budget; the near cache is off, so every read says
/// which node served it.
fn config(group: &PrimaryReplica) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"{}\"\n[[family]]\nprefix = \"op:\"\ncopies = 4\ndefault_class = \"lenient\"\n[classes.lenient]\nroute = \"replica\"\nreason = \"test class\"\nstaleness_budget = \"30s\"\n[near_cache]\nenabled = false\n",
        group.url(),
        group.replicas[0].url(),
        harness::command_timeout_toml()
    ))
}

/// A served instance and its operations.
struct Instance {
    /// `http://127.0.0.1:P`.
    base: String,
    /// The operations behind its HTTP door.
    ops: Ops,
    /// Resolving it stops the instance.
    stop: Option<oneshot::Sender<()>>,
    /// The serving task.
    task: tokio::task::JoinHandle<hotsplit::Result<()>>,
}

impl Instance {
    /// Builds a service from `config`, keeps its operations, serves it and waits until ready.
    async fn start(mut config: hotsplit::config::Config) -> Instance {
        config.server.drain_delay = Duration::ZERO;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let service = Service::build(config).await.expect("build the service");
        let ops = service.ops();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(service.serve(listener, async move {
            let _ = stopped.await;
        }));
        let http = reqwest::Client::new();
        poll("the instance is ready", Duration::from_secs(30), || async {
            http.get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|answer| answer.status().is_success())
        })
        .await;
        Instance {
            base,
            ops,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("join").expect("serve");
    }
}

/// What one step answered, with nothing that depends on the key's name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// The status (through the operations: the status the HTTP door renders it with).
    status: u16,
    /// The problem's code, for an error.
    code: Option<String>,
    /// The version the answer names (`Hotsplit-Version`, or the read's version).
    version: Option<u64>,
    /// The route's reason, for a read.
    reason: Option<String>,
    /// Whether a primary or a replica served a read.
    role: Option<String>,
    /// The token's floors for the key afterwards: (written, seen).
    floors: (Option<u64>, Option<u64>),
    /// Whether the answer carries a token at all.
    token_sent_back: bool,
    /// Whether the token the answer carries is the one the step sent, byte for byte.
    token_unchanged: bool,
}

/// One side of the comparison: a way to run each step.
trait Door {
    /// Publishes `version` of `key` as alice, through instance `on`.
    fn publish(&mut self, on: usize, version: u64) -> impl Future<Output = Outcome>;
    /// Reads `key` as alice through instance `on`, with `min_version`.
    fn read(&mut self, on: usize, min_version: Option<u64>) -> impl Future<Output = Outcome>;
}

/// The floors `token` holds for `key`, decoded with `ops`'s deployment key.
fn floors_of(ops: &Ops, key: &Key, session: &Session) -> (Option<u64>, Option<u64>) {
    let floors = session.floors(ops.sessions().key_hash(key), now_unix_ms());
    (
        floors.written.map(Version::get),
        floors.seen.map(Version::get),
    )
}

/// The operations called directly, the token carried between calls as its text, as a client
/// echoes it.
struct Direct<'a> {
    instances: [&'a Instance; 2],
    key: Key,
    /// The token text the last answer carried.
    token: Option<Bytes>,
}

impl Direct<'_> {
    /// The session the token text decodes to on instance `on`.
    fn session(&self, on: usize) -> ClientSession {
        let lines: Vec<&[u8]> = self.token.iter().map(|token| &token[..]).collect();
        self.instances[on].ops.session(&lines, now_unix_ms())
    }

    /// Keeps the token `session` sends back; fills the token fields of `outcome`.
    fn settle(&mut self, on: usize, session: &ClientSession, mut outcome: Outcome) -> Outcome {
        let ops = &self.instances[on].ops;
        outcome.token_sent_back = session.carries_token();
        let sent = session.carries_token().then(|| ops.session_token(session));
        outcome.token_unchanged = sent.is_some() && sent == self.token;
        outcome.floors = floors_of(ops, &self.key, session.floors());
        if sent.is_some() {
            self.token = sent;
        }
        outcome
    }
}

/// An outcome with `status` and `code` and nothing else yet.
fn answered(status: u16, code: Option<&str>) -> Outcome {
    Outcome {
        status,
        code: code.map(str::to_owned),
        version: None,
        reason: None,
        role: None,
        floors: (None, None),
        token_sent_back: false,
        token_unchanged: false,
    }
}

/// An error's outcome as the HTTP door renders it.
fn error_outcome(err: hotsplit::Error) -> Outcome {
    let api = ApiError::from(err);
    answered(api.code().status().as_u16(), Some(api.code().as_str()))
}

impl Door for Direct<'_> {
    async fn publish(&mut self, on: usize, version: u64) -> Outcome {
        let mut session = self.session(on);
        let call = PublishCall {
            key: self.key.clone(),
            version: Some(Version::new(version).expect("a version")),
            edit: Edit::Value(Bytes::from(format!("value {version}"))),
            writer: Writer {
                caller: Some(Caller::Client("alice".into())),
                request_id: None,
            },
            sync: None,
            deadline: None,
        };
        let outcome = match self.instances[on].ops.publish(call, &mut session).await {
            Ok(published) => {
                let (status, code) = match published.status {
                    PublishStatus::Done => (200, None),
                    PublishStatus::Queued => (202, None),
                    PublishStatus::Stale => (409, Some("stale_version")),
                    PublishStatus::Conflict => (409, Some("version_conflict")),
                    PublishStatus::Incomplete => (503, Some("publish_incomplete")),
                };
                Outcome {
                    version: published.floor.map(|floor| floor.version.get()),
                    ..answered(status, code)
                }
            }
            Err(err) => error_outcome(err),
        };
        self.settle(on, &session, outcome)
    }

    async fn read(&mut self, on: usize, min_version: Option<u64>) -> Outcome {
        let mut session = self.session(on);
        let call = ReadRequest {
            key: self.key.clone(),
            caller: Caller::Client("alice".into()),
            min_version: min_version.map(|floor| Version::new(floor).expect("a version")),
            if_none_match: None,
            class: None,
            request_id: None,
            deadline: None,
        };
        let outcome = match self.instances[on].ops.read(call, &mut session).await {
            Ok(ReadAnswer::Value {
                version,
                served_by,
                route,
                ..
            }) => Outcome {
                version: Some(version.get()),
                reason: Some(route.reason.as_str().to_owned()),
                role: Some(
                    match served_by.role {
                        Role::Replica => "replica",
                        _ => "primary",
                    }
                    .to_owned(),
                ),
                ..answered(200, None)
            },
            Ok(other) => panic!("a read without If-None-Match answered {other:?}"),
            Err(err) => error_outcome(err),
        };
        self.settle(on, &session, outcome)
    }
}

/// The same steps over HTTP.
struct Http<'a> {
    instances: [&'a Instance; 2],
    key: Key,
    http: reqwest::Client,
    token: Option<String>,
}

impl Http<'_> {
    async fn send(&mut self, on: usize, request: reqwest::RequestBuilder) -> Outcome {
        let mut request = request.header("hotsplit-client", "alice");
        if let Some(token) = &self.token {
            request = request.header("hotsplit-session", token);
        }
        let answer = request.send().await.expect("send");
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let route = header("hotsplit-route");
        let token = header("hotsplit-session");
        let version = header("hotsplit-version").and_then(|version| version.parse().ok());
        let role = header("hotsplit-served-by")
            .and_then(|served| served.rsplit_once("role=").map(|(_, role)| role.to_owned()));
        let status = answer.status();
        let body: serde_json::Value = if status == StatusCode::OK && route.is_some() {
            serde_json::Value::Null
        } else {
            answer.json().await.unwrap_or_default()
        };
        let ops = &self.instances[on].ops;
        let floors = token.as_deref().map_or((None, None), |token| {
            let session = ops.session(&[token.as_bytes()], now_unix_ms());
            floors_of(ops, &self.key, session.floors())
        });
        let outcome = Outcome {
            status: status.as_u16(),
            code: body["code"].as_str().map(str::to_owned),
            version,
            reason: route.as_deref().and_then(|route| {
                route
                    .split(';')
                    .find_map(|part| part.strip_prefix("reason="))
                    .map(str::to_owned)
            }),
            role,
            floors,
            token_sent_back: token.is_some(),
            token_unchanged: token.is_some() && token == self.token,
        };
        if token.is_some() {
            self.token = token;
        }
        outcome
    }
}

impl Door for Http<'_> {
    async fn publish(&mut self, on: usize, version: u64) -> Outcome {
        let url = format!(
            "{}/v1/keys/{}?version={version}",
            self.instances[on].base, self.key
        );
        let request = self.http.put(url).body(format!("value {version}"));
        self.send(on, request).await
    }

    async fn read(&mut self, on: usize, min_version: Option<u64>) -> Outcome {
        let mut url = format!("{}/v1/keys/{}", self.instances[on].base, self.key);
        if let Some(floor) = min_version {
            url.push_str(&format!("?min_version={floor}"));
        }
        let request = self.http.get(url);
        self.send(on, request).await
    }
}

/// Polls until the replica's copy of `key` that alice reads holds `version`.
async fn replica_holds(port: u16, key: &Key, version: u64) {
    let copy_key = key.copy_key(
        hotsplit::affinity::copy_index("alice", 4),
        hotsplit::key::Placement::Suffix,
    );
    poll(
        &format!("the replica's {copy_key} holds {version}"),
        Duration::from_secs(10),
        || {
            let held =
                devcluster::cli(port, &["HGET", copy_key.as_str(), "ver"]).unwrap_or_default();
            std::future::ready(held == version.to_string())
        },
    )
    .await;
}

/// The script: every step's outcome, in order.
async fn script(door: &mut impl Door, replica: u16, key: &Key) -> Vec<(&'static str, Outcome)> {
    let mut steps = Vec::new();
    steps.push(("publish 1 on A", door.publish(0, 1).await));
    replica_holds(replica, key, 1).await;
    steps.push(("read with a floor on A", door.read(0, Some(1)).await));
    devcluster::cli(replica, &["CLIENT", "PAUSE", "30000", "WRITE"]).expect("CLIENT PAUSE");
    steps.push((
        "publish 2 on A, the replica paused",
        door.publish(0, 2).await,
    ));
    steps.push(("read moved to the primary on A", door.read(0, None).await));
    steps.push(("refused publish of 1 on A", door.publish(0, 1).await));
    steps.push(("read on B with the token", door.read(1, None).await));
    steps.push(("read on B over every copy", door.read(1, Some(3)).await));
    devcluster::cli(replica, &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    replica_holds(replica, key, 2).await;
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_through_the_operations_and_through_http_answers_the_same() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = group.replicas[0].port();
    let a = Instance::start(config(&group)).await;
    let b = Instance::start(config(&group)).await;

    let direct_key = Key::parse("op:direct").expect("key");
    let mut direct = Direct {
        instances: [&a, &b],
        key: direct_key.clone(),
        token: None,
    };
    let through_ops = script(&mut direct, replica, &direct_key).await;

    let http_key = Key::parse("op:http").expect("key");
    let mut http = Http {
        instances: [&a, &b],
        key: http_key.clone(),
        http: reqwest::Client::new(),
        token: None,
    };
    let through_http = script(&mut http, replica, &http_key).await;

    for ((step, ops), (_, http)) in through_ops.iter().zip(&through_http) {
        assert_eq!(ops, http, "{step}: the operations and HTTP disagree");
    }
    // What the script is about, so a regression on both sides is caught too.
    let outcome = |at: usize| &through_http[at].1;
    assert_eq!(
        (outcome(0).status, outcome(0).version, outcome(0).floors),
        (200, Some(1), (Some(1), None))
    );
    assert_eq!(
        (outcome(1).role.as_deref(), outcome(1).floors),
        (Some("replica"), (Some(1), None)),
        "one floor per key: the version served equals the one written, which stays written"
    );
    assert_eq!(
        (
            outcome(3).version,
            outcome(3).reason.as_deref(),
            outcome(3).role.as_deref()
        ),
        (Some(2), Some("own-write"), Some("primary")),
        "the replica is paused at 1: the writer's floor moves its read"
    );
    assert_eq!(
        (
            outcome(4).status,
            outcome(4).code.as_deref(),
            outcome(4).version,
            outcome(4).token_unchanged
        ),
        (409, Some("stale_version"), None, true),
        "a refused publish leaves no floor and sends the token back as it came"
    );
    assert_eq!(
        (
            outcome(5).version,
            outcome(5).reason.as_deref(),
            outcome(5).floors
        ),
        (Some(2), Some("own-write"), (Some(2), None)),
        "the token's written floor holds on the instance that never saw the write"
    );
    assert_eq!(
        (
            outcome(6).status,
            outcome(6).code.as_deref(),
            outcome(6).token_sent_back,
            outcome(6).token_unchanged
        ),
        (503, Some("below_version_floor"), true, true),
        "an error answer carries the token"
    );
    a.stop().await;
    b.stop().await;
}
