//! The invalidation feed between instances (`src/feed/`), on a 3-master/3-replica cluster with
//! two instances: a publish through B reaches A's client-side caches (redis-py, node-redis) and
//! A's near cache long before the 10 s lease would end, never going back; a cut feed (its
//! connection killed, its master paused) pushes every key A's tracking connections hold (the
//! flush), is counted, shows in `/readyz`, and caps leases meanwhile. The same on a real
//! partition (an instance cut from one master with nftables) is `feed_partition.rs`.

use std::process::Command;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{self, metrics_text, poll};
use crate::resp_clients::{assert_ok, client, scripts, serve};

/// A class whose answers live 10 s in a cache (near or client-side), and a family read with it.
pub(crate) const FEED_FAMILY: &str = "[classes.feed10]\nroute = \"replica\"\nreason = \"feed test: ten seconds is long enough to see the feed beat the lease\"\nstaleness_budget = \"10s\"\nnear_cache_max_age = \"10s\"\n[[family]]\nprefix = \"fd:\"\ncopies = 4\nversioning = \"allocated\"\ndefault_class = \"feed10\"\n";

/// The built-in replica classes with leases of seconds (their defaults: 125 ms and 1 s).
pub(crate) const PATIENT_CLASSES: &str = "[classes.advisory]\nroute = \"replica\"\nreason = \"feed test\"\nstaleness_budget = \"10s\"\nnear_cache_max_age = \"5s\"\n[classes.re-derivable]\nroute = \"replica\"\nreason = \"feed test\"\nstaleness_budget = \"10s\"\nnear_cache_max_age = \"5s\"\n";

/// The `[store]` section for `url`.
fn store(url: &str) -> String {
    format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{}\"\n",
        harness::command_timeout_toml()
    )
}

/// The value of the counter `name{labels}` in `text`, 0 when absent.
pub(crate) fn counter(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Polls until `/metrics` of `base` shows a feed open to each of the three primaries (whether
/// each is current at a given moment depends on the machine's load: a silence is flushed).
pub(crate) async fn wait_feed_up(base: &str) {
    let http = reqwest::Client::new();
    poll(
        "a feed to every primary",
        Duration::from_secs(20),
        || async {
            let text = metrics_text(&http, base).await;
            counter(&text, "hotsplit_feed_connections ") == 3.0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_through_b_reaches_a_s_client_caches_and_near_cache_by_the_feed() {
    let (Some(python), Some(node_path)) = (
        client("HOTSPLIT_REDIS_PY", "redis-py"),
        client("HOTSPLIT_IOREDIS_NODE_PATH", "node-redis"),
    ) else {
        return;
    };
    let cluster = harness::shared_cluster();
    let dir = tempfile::tempdir().unwrap();
    // The built-in classes' leases raised, so the feed's silence bound can be 2 s: a loaded
    // machine running a debug build then proves every feed current (a silence flush would make
    // every client re-read, which the steady phase counts); the bound itself is `a_cut_feed_…`'s.
    let config = format!(
        "{}{PATIENT_CLASSES}[feed]\nmax_silence = \"2s\"\n{FEED_FAMILY}",
        store(&cluster.url())
    );
    let (a, a_port) = serve(dir.path(), &config).await;
    let (b, b_port) = serve(dir.path(), &config).await;
    wait_feed_up(&a.base).await;
    wait_feed_up(&b.base).await;
    let output = Command::new(&python)
        .arg(scripts().join("pyfeed.py"))
        .args([&a_port.to_string(), &b_port.to_string(), "fd:py", "200"])
        .arg(format!("{}/metrics", a.base))
        .output()
        .expect("run python");
    assert_ok(
        &output,
        "redis-py and the near cache of A, publishes through B",
        &a,
    );
    let output = Command::new("node")
        .env("NODE_PATH", &node_path)
        .arg(scripts().join("nodefeed.js"))
        .args([&a_port.to_string(), &b_port.to_string(), "fd:node", "200"])
        .output()
        .expect("run node");
    assert_ok(&output, "node-redis on A, publishes through B", &a);
    let text = metrics_text(&reqwest::Client::new(), &a.base).await;
    assert!(
        counter(&text, "hotsplit_feed_keys_total ") >= 400.0,
        "{text}"
    );
    drop(b);
}

/// A RESP3 connection to `port` with `CLIENT TRACKING ON`, reading what it is sent.
pub(crate) struct Tracked {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl Tracked {
    async fn connect(port: u16) -> Tracked {
        Tracked::connect_to(("127.0.0.1", port)).await
    }

    /// A tracking connection to `addr` (from the calling thread's network namespace).
    pub(crate) async fn connect_to(addr: impl tokio::net::ToSocketAddrs) -> Tracked {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut tracked = Tracked {
            stream,
            seen: Vec::new(),
        };
        tracked.send("HELLO 3\r\nCLIENT TRACKING ON\r\n").await;
        tracked.until(b"+OK\r\n", Duration::from_secs(5)).await;
        tracked
    }

    /// Writes `key` (`SET key held`), then reads it until it is held with a lease (no push of
    /// the key before the reply: an answer read just after a change may not be cached), which
    /// a flush ends with the key's push.
    pub(crate) async fn hold(&mut self, key: &str) {
        self.send(&format!("SET {key} held\r\n")).await;
        self.until(b"+OK\r\n", Duration::from_secs(10)).await;
        self.read_leased(key, "held").await;
    }

    /// Reads `key` (holding `value`) until the answer carries a lease (no push of the key
    /// before the reply). A read a paused node did not answer (`-UNAVAILABLE …`, its push
    /// before it) is read again.
    pub(crate) async fn read_leased(&mut self, key: &str, value: &str) {
        let push = push_of(key);
        let reply = format!("${}\r\n{value}\r\n", value.len()).into_bytes();
        let reply = reply.as_slice();
        let unavailable: &[u8] = b"-UNAVAILABLE";
        let within = Duration::from_secs(10);
        let started = Instant::now();
        loop {
            self.send(&format!("GET {key}\r\n")).await;
            match self.first_of(&[&push, reply, unavailable], within).await {
                Some((1, _)) => return,
                Some((2, _)) => {
                    self.until(b"\r\n", within).await;
                }
                Some(_) => {
                    // Not cacheable: its reply (or error) follows.
                    if let Some((1, _)) = self.first_of(&[reply, unavailable], within).await {
                        self.until(b"\r\n", within).await;
                    }
                }
                None => panic!("no answer to GET {key} within 10 s"),
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "GET {key} never answered with a lease"
            );
        }
    }

    pub(crate) async fn send(&mut self, text: &str) {
        self.stream.write_all(text.as_bytes()).await.unwrap();
    }

    /// Reads until `needle` was seen (consuming up to it); panics after `within`.
    pub(crate) async fn until(&mut self, needle: &[u8], within: Duration) -> Duration {
        self.until_any(&[needle], within).await
    }

    /// Reads until one of `needles` was seen (consuming up to the first); panics after
    /// `within`.
    pub(crate) async fn until_any(&mut self, needles: &[&[u8]], within: Duration) -> Duration {
        match self.first_of(needles, within).await {
            Some((_, took)) => took,
            None => panic!(
                "{:?} not received within {within:?}; got {:?}",
                String::from_utf8_lossy(needles[0]),
                String::from_utf8_lossy(&self.seen)
            ),
        }
    }

    /// Forgets what was read and not consumed yet.
    pub(crate) fn forget(&mut self) {
        self.seen.clear();
    }

    /// Reads until one of `needles` was seen, consuming up to the first to end: which one
    /// (its index) and how long it took; `None` when none came within `within` (what was read
    /// is kept).
    pub(crate) async fn first_of(
        &mut self,
        needles: &[&[u8]],
        within: Duration,
    ) -> Option<(usize, Duration)> {
        let start = Instant::now();
        loop {
            let found = needles
                .iter()
                .enumerate()
                .filter_map(|(index, needle)| {
                    let at = self
                        .seen
                        .windows(needle.len())
                        .position(|window| window == *needle)?;
                    Some((at + needle.len(), index))
                })
                .min();
            if let Some((end, index)) = found {
                self.seen.drain(..end);
                return Some((index, start.elapsed()));
            }
            let left = within.checked_sub(start.elapsed())?;
            let mut buf = [0u8; 4096];
            match tokio::time::timeout(left, self.stream.read(&mut buf)).await {
                Ok(Ok(0)) => panic!(
                    "the connection closed; got {:?}",
                    String::from_utf8_lossy(&self.seen)
                ),
                Ok(Ok(read)) => self.seen.extend_from_slice(&buf[..read]),
                Ok(Err(err)) => panic!("read: {err}"),
                Err(_) => {}
            }
        }
    }
}

/// Kills every connection on `node` whose last command was `CLIENT TRACKING` (the
/// instances' invalidation feeds: a cut feed); answers how many.
pub(crate) fn kill_feed_connections(node: &hotsplit_devcluster::RedisNode) -> usize {
    let clients = node.cli(&["CLIENT", "LIST"]).unwrap();
    let mut killed = 0;
    for line in clients
        .lines()
        .filter(|line| line.contains("cmd=client|tracking"))
    {
        let id = line.split(' ').next().unwrap().trim_start_matches("id=");
        node.cli(&["CLIENT", "KILL", "ID", id]).unwrap();
        killed += 1;
    }
    killed
}

/// The push of `key`'s invalidation.
pub(crate) fn push_of(key: &str) -> Vec<u8> {
    format!(
        ">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{key}\r\n",
        key.len()
    )
    .into_bytes()
}

/// The invalidations pushed by flushes so far (`/metrics` of `base`).
pub(crate) async fn flush_pushes(base: &str) -> f64 {
    let text = metrics_text(&reqwest::Client::new(), base).await;
    counter(
        &text,
        "hotsplit_resp_tracking_invalidations_total{cause=\"flush\"} ",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_feed_flushes_every_tracking_connection_counts_it_and_caps_leases() {
    let cluster = harness::own_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[feed]\nmax_silence = \"100ms\"\n{FEED_FAMILY}",
        store(&cluster.url())
    );
    let (a, a_port) = serve(dir.path(), &config).await;
    wait_feed_up(&a.base).await;
    let http = reqwest::Client::new();
    let mut tracked = Tracked::connect(a_port).await;
    tracked.hold("fd:held-1").await;

    // Its feed connection on one master killed: flushed (the held key pushed), counted,
    // reconnected.
    let masters = cluster.masters().unwrap();
    let master = masters[0];
    kill_feed_connections(master);
    tracked
        .until(&push_of("fd:held-1"), Duration::from_secs(10))
        .await;
    poll(
        "the closed feed is counted and reopened",
        Duration::from_secs(10),
        || async {
            let text = metrics_text(&http, &a.base).await;
            counter(&text, "hotsplit_feed_flushes_total{cause=\"closed\"} ") >= 1.0
                && counter(&text, "hotsplit_feed_reconnects_total ") >= 1.0
        },
    )
    .await;
    wait_feed_up(&a.base).await;

    // A key held before the pause, and one written (its own push comes first: SET changed it).
    tracked.hold("fd:held-2").await;
    let key = "fd:capped";
    tracked
        .send(&format!("GET {key}\r\nSET {key} hello\r\n"))
        .await;
    tracked.until(b"+OK\r\n", Duration::from_secs(10)).await;

    // A master paused: its feed falls silent, every tracking connection is flushed, /readyz
    // says so, and a lease given meanwhile is capped at max_silence (not the class's 10 s).
    master.pause().unwrap();
    tracked
        .until(&push_of("fd:held-2"), Duration::from_secs(10))
        .await;
    poll(
        "/readyz shows the feed down",
        Duration::from_secs(10),
        || async {
            let ready = http.get(format!("{}/readyz", a.base)).send().await;
            match ready {
                Ok(answer) => answer
                    .text()
                    .await
                    .unwrap_or_default()
                    .contains("\"feed_down\":true"),
                Err(_) => false,
            }
        },
    )
    .await;
    tracked.read_leased(key, "hello").await;
    // Its lease ends at max_silence (or a flush drops it sooner), not at the class's 10 s.
    let capped = tracked.until(&push_of(key), Duration::from_secs(5)).await;
    eprintln!("a lease given while the feed was down ended after {capped:?}");
    master.resume().unwrap();
    wait_feed_up(&a.base).await;
    let text = metrics_text(&http, &a.base).await;
    assert!(
        counter(&text, "hotsplit_feed_flushes_total{cause=\"silence\"} ") >= 1.0,
        "{text}"
    );
}
