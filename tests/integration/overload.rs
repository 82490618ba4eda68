//! Request limits on real Redis: the request deadline with a paused master (a read answers
//! `deadline_exceeded` long before the store's command timeout would; a publish reports the
//! paused copies `queued`, and they heal after SIGCONT), and the in-flight bound (requests past
//! it are shed at once, the held ones succeed, a shed publish writes nothing, a session token
//! does not get a request past it). A near-cache fill is bounded by the deadline of every read
//! that waits for it, and a pipelined run of Redis-door `GET`s by the run's one deadline.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::harness::{
    self, config_from_toml, copy_on_owner, get, metrics_text, owner_port, poll, problem,
    publish_expecting, Edit, Service,
};
use crate::heal::wait_drained;
use crate::resp_conn::{command, Client, Value as Reply};

/// Far longer than any deadline here: an answer that comes in time came from the deadline.
const COMMAND_TIMEOUT: &str = "30s";

/// How long the test waits for any one answer: well under the command timeout, well over the
/// deadlines.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Asserts a problem+json answer with `status`, `code` and a `Retry-After` header.
async fn retry_later_problem(answer: Response, status: StatusCode, code: &str, what: &str) {
    assert_eq!(
        answer.headers()["content-type"],
        "application/problem+json",
        "{what}"
    );
    assert!(
        answer.headers().get("retry-after").is_some(),
        "{what}: {:?}",
        answer.headers()
    );
    problem(answer, status, code, what).await;
}

/// A request bounded by [`ANSWER_WITHIN`]: it must be answered, not hang.
async fn answered(what: &str, request: reqwest::RequestBuilder) -> Response {
    tokio::time::timeout(ANSWER_WITHIN, request.send())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {ANSWER_WITHIN:?}"))
        .unwrap_or_else(|err| panic!("{what}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_a_paused_master_costs_a_read_its_deadline_and_a_publish_queues_its_copies() {
    let cluster = harness::own_cluster().await;
    // No health probes of healthy primaries (`heal.probe_misses = 0`): they would mark the
    // paused master failing within a few hundred ms, and its copies would then be queued at once
    // (`node_failing`, tested in `degraded`) instead of at the deadline, which is tested here.
    let mut config = config_from_toml(&format!(
        "[server]\nrequest_deadline = \"700ms\"\n\
         [store]\ncommand_timeout = \"{COMMAND_TIMEOUT}\"\n\
         [heal]\nprobe_misses = 0\n\
         [[family]]\nprefix = \"one:\"\ncopies = 1\n\
         [[family]]\nprefix = \"dl:\"\ncopies = 8\n"
    ));
    config.store.redis = Some(cluster.url());
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = &service.base;
    publish_expecting(&http, base, Edit::new("one:1", 1, "one"), StatusCode::OK).await;
    publish_expecting(&http, base, Edit::new("dl:1", 1, "one"), StatusCode::OK).await;

    // Owners are looked up before the pause: the lookup asks the cluster.
    let victim = owner_port(&cluster, "one:1#0");
    let on_victim: Vec<bool> = (0..8)
        .map(|copy| owner_port(&cluster, &format!("dl:1#{copy}")) == victim)
        .collect();
    cluster
        .node(victim)
        .expect("node")
        .pause()
        .expect("SIGSTOP");

    // A read of the one copy, on the paused master: 503 deadline_exceeded, within the test's
    // bound and so long before the 30 s command timeout.
    let read = answered(
        "a read on the paused master",
        http.get(format!("{base}/v1/keys/one:1?client=c")),
    )
    .await;
    retry_later_problem(
        read,
        StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded",
        "a read on the paused master",
    )
    .await;

    // A publish: the copies on the paused master are queued at the deadline, the others applied.
    let publish = answered(
        "a publish with copies on the paused master",
        http.put(format!("{base}/v1/keys/dl:1?version=2"))
            .body("two"),
    )
    .await;
    assert_eq!(publish.status(), StatusCode::ACCEPTED);
    let report: Value = publish.json().await.unwrap();
    let mut queued = 0;
    for (line, on_victim) in report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&on_victim)
    {
        let copy_key = line["copy_key"].as_str().unwrap();
        if *on_victim {
            assert_eq!(line["outcome"], "queued", "{copy_key}: {report}");
            assert_eq!(line["error"], "deadline_exceeded", "{copy_key}: {report}");
            queued += 1;
        } else {
            assert_eq!(line["outcome"], "applied", "{copy_key}: {report}");
        }
    }
    assert!(queued > 0, "some copy of dl:1 lives on the paused master");
    assert_eq!(report["queued"].as_u64(), Some(queued), "{report}");
    assert_eq!(report["dropped"].as_u64(), Some(0), "{report}");

    cluster
        .node(victim)
        .expect("node")
        .resume()
        .expect("SIGCONT");
    wait_drained(&http, base).await;
    for copy in 0..8 {
        let copy_key = format!("dl:1#{copy}");
        let fields = copy_on_owner(&cluster, &copy_key);
        assert_eq!(
            fields.get("ver").map(String::as_str),
            Some("2"),
            "{copy_key}"
        );
        assert_eq!(
            fields.get("val").map(String::as_str),
            Some("two"),
            "{copy_key}"
        );
    }
    let read = get(&http, &format!("{base}/v1/keys/one:1?client=c"), &[]).await;
    assert_eq!(read.status(), StatusCode::OK);

    let metrics = metrics_text(&http, base).await;
    assert!(
        metrics.contains(r#"hotsplit_http_deadline_exceeded_total{route="/v1/keys/{key}"} 1"#),
        "{metrics}"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_requests_past_the_in_flight_bound_are_shed_at_once_and_the_held_ones_succeed() {
    const BOUND: usize = 4;
    let server = tokio::task::spawn_blocking(hotsplit_devcluster::Standalone::start)
        .await
        .unwrap()
        .expect("start redis-server");
    let mut config = config_from_toml(&format!(
        "[server]\nmax_in_flight = {BOUND}\nrequest_deadline = \"20s\"\n\
         [store]\ncommand_timeout = \"{COMMAND_TIMEOUT}\"\n\
         [[family]]\nprefix = \"shed:\"\ncopies = 1\n"
    ));
    config.store.redis = Some(server.url());
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_expecting(&http, &base, Edit::new("shed:1", 1, "one"), StatusCode::OK).await;

    // The paused server holds every read sent to it: BOUND of them fill the bound.
    server.node.pause().expect("SIGSTOP");
    let held: Vec<_> = (0..BOUND)
        .map(|reader| {
            let http = http.clone();
            let url = format!("{base}/v1/keys/shed:1?client=held-{reader}");
            tokio::spawn(async move { answered("a held read", http.get(url)).await })
        })
        .collect();
    poll(
        "the held reads fill the in-flight bound",
        ANSWER_WITHIN,
        || async {
            metrics_text(&http, &base)
                .await
                .contains(&format!("hotsplit_http_requests_in_flight {BOUND}\n"))
        },
    )
    .await;

    // Past the bound: answered at once (the server is still paused), with Retry-After; a
    // session token changes nothing (it is read below the bound, by the handler).
    for reader in 0..3 {
        let shed = answered(
            "a read past the bound",
            http.get(format!("{base}/v1/keys/shed:1?client=extra-{reader}"))
                .header("hotsplit-session", "AQAAAA"),
        )
        .await;
        retry_later_problem(
            shed,
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "a read past the bound",
        )
        .await;
    }
    // A publish past the bound is refused before any copy is written.
    let shed = answered(
        "a publish past the bound",
        http.put(format!("{base}/v1/keys/shed:1?version=2"))
            .body("two"),
    )
    .await;
    retry_later_problem(
        shed,
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "a publish past the bound",
    )
    .await;
    // Liveness is exempt.
    let alive = answered("/healthz", http.get(format!("{base}/healthz"))).await;
    assert_eq!(alive.status(), StatusCode::OK);

    server.node.resume().expect("SIGCONT");
    for read in held {
        let read = read.await.unwrap();
        assert_eq!(read.status(), StatusCode::OK);
        assert_eq!(read.text().await.unwrap(), "one");
    }
    // The shed publish wrote nothing: the copy still holds version 1.
    let fields = harness::hgetall(server.node.port(), "shed:1#0");
    assert_eq!(
        fields.get("ver").map(String::as_str),
        Some("1"),
        "{fields:?}"
    );
    let metrics = metrics_text(&http, &base).await;
    assert!(
        metrics.contains(r#"hotsplit_http_requests_shed_total{route="/v1/keys/{key}"} 4"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("hotsplit_http_requests_in_flight 0\n"),
        "{metrics}"
    );
    // Under the bound again, a request is served.
    publish_expecting(
        &http,
        &base,
        Edit::new("shed:1", 3, "three"),
        StatusCode::OK,
    )
    .await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_a_near_cache_fill_from_a_paused_node_costs_its_readers_their_deadline() {
    let server = tokio::task::spawn_blocking(hotsplit_devcluster::Standalone::start)
        .await
        .unwrap()
        .expect("start redis-server");
    // A replica-routed class with a near cache on a store with no replica: its fills read the
    // primary, which the test pauses.
    let mut config = config_from_toml(&format!(
        "[server]\nrequest_deadline = \"700ms\"\n\
         [store]\ncommand_timeout = \"{COMMAND_TIMEOUT}\"\n\
         [[family]]\nprefix = \"ncd:\"\ncopies = 1\ndefault_class = \"cached\"\n\
         [classes.cached]\nroute = \"replica\"\nreason = \"test class\"\n\
         staleness_budget = \"30s\"\nnear_cache_max_age = \"30s\"\n"
    ));
    config.store.redis = Some(server.url());
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    publish_expecting(&http, &base, Edit::new("ncd:1", 1, "one"), StatusCode::OK).await;

    let url = format!("{base}/v1/keys/ncd:1?client=r0");
    let first = get(&http, &url, &[]).await;
    assert_eq!(first.status(), StatusCode::OK);
    server.node.pause().expect("SIGSTOP");

    // A cached copy is still answered from memory while the node is paused…
    let cached = answered("a cached read", http.get(&url)).await;
    assert_eq!(cached.status(), StatusCode::OK);
    assert_eq!(cached.text().await.unwrap(), "one");
    // …while a copy with no entry needs a fill: two readers at once share the one fill from
    // the paused node, and each is cut at its own deadline.
    let fill_readers: Vec<_> = (0..2)
        .map(|reader| {
            let http = http.clone();
            let url = format!("{base}/v1/keys/ncd:unread?client=r{reader}");
            tokio::spawn(async move { answered("a read waiting for a fill", http.get(url)).await })
        })
        .collect();
    for read in fill_readers {
        retry_later_problem(
            read.await.unwrap(),
            StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded",
            "a read waiting for a fill from the paused node",
        )
        .await;
    }
    server.node.resume().expect("SIGCONT");
    // Once the node answers again (and the health probes have seen it back), the key is read: a
    // 404, since it was never published.
    poll(
        "a read after SIGCONT answers 404",
        ANSWER_WITHIN,
        || async {
            answered(
                "a read after SIGCONT",
                http.get(format!("{base}/v1/keys/ncd:unread?client=r0")),
            )
            .await
            .status()
                == StatusCode::NOT_FOUND
        },
    )
    .await;
    let metrics = metrics_text(&http, &base).await;
    assert!(
        metrics.contains(r#"hotsplit_http_deadline_exceeded_total{route="/v1/keys/{key}"} 2"#),
        "{metrics}"
    );
    // The waits were on near-cache fills: at least one fill started, and the cached read hit.
    let counter = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        counter("hotsplit_near_cache_misses_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        counter("hotsplit_near_cache_hits_total") >= 1.0,
        "{metrics}"
    );
    service.stop().await;
}

/// The value of an unlabelled metric in the exposition text.
fn gauge(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Opens a connection and sends a publish's head and the first 10 of 1000 declared body bytes,
/// holding the rest back.
async fn slow_publish(base: &str, key: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "PUT /v1/keys/{key}?version=1 HTTP/1.1\r\nHost: {address}\r\nContent-Length: 1000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&[b's'; 10]).await.unwrap();
    stream
}

/// Finding 5 of issue 21 on the binary: with `request_deadline = 1s`, `body_read_timeout = 6s`
/// and `max_in_flight = 2`, two publishes whose bodies trickle in held both in-flight slots for
/// the body timeout, and a read 1.5 s later was shed. A publish now takes its slot only once its
/// body has arrived: the read is answered, a body past `max_receiving_bodies` is refused
/// `overloaded`, and a slow body that does arrive is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_slow_publish_bodies_do_not_take_the_slots_reads_need() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let service = harness::Binary::start(
        dir.path(),
        "slow-bodies",
        "request_deadline = \"1s\"\nbody_read_timeout = \"6s\"\nmax_in_flight = 2\nmax_receiving_bodies = 2\n",
    )
    .await;
    let http = reqwest::Client::new();
    let started = tokio::time::Instant::now();
    let mut first = slow_publish(&service.base, "slow:1").await;
    let _second = slow_publish(&service.base, "slow:2").await;
    poll(
        "both slow publishes are being handled",
        ANSWER_WITHIN,
        || async {
            let text = metrics_text(&http, &service.base).await;
            gauge(&text, "hotsplit_http_bodies_receiving") == Some(2)
                || gauge(&text, "hotsplit_http_requests_in_flight") == Some(2)
        },
    )
    .await;
    // Past the request deadline, well within the body timeout.
    tokio::time::sleep_until(started + Duration::from_millis(1500)).await;
    let read = answered(
        "a read while two bodies trickle in",
        http.get(format!("{}/v1/keys/other?client=c", service.base)),
    )
    .await;
    assert_eq!(
        read.status(),
        StatusCode::NOT_FOUND,
        "{:?}",
        read.text().await
    );

    // A third body past max_receiving_bodies is refused before it is read.
    let third = answered(
        "a third publish",
        http.put(format!("{}/v1/keys/slow:3?version=1", service.base))
            .body(vec![b'x'; 10]),
    )
    .await;
    retry_later_problem(
        third,
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "third",
    )
    .await;

    // The first body arrives whole: it is published.
    first.write_all(&[b's'; 990]).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = tokio::time::timeout(ANSWER_WITHIN, first.read(&mut buffer))
            .await
            .expect("the first publish is answered")
            .unwrap();
        assert!(read > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buffer[..read]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let stored = get(
        &http,
        &format!("{}/v1/keys/slow:1?client=c", service.base),
        &[],
    )
    .await;
    assert_eq!(stored.status(), StatusCode::OK);
}

/// A pipelined run of Redis-door `GET`s that all need a paused node (decision reads, on the
/// store's direct connection): the run's reads are awaited under its one deadline, not a timer
/// each, so every `GET` of the run is answered `DEADLINE` in its turn, long before the command
/// timeout, and the command after the run is answered after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_a_pipelined_run_of_reads_on_a_paused_node_is_answered_at_its_deadline() {
    let server = tokio::task::spawn_blocking(hotsplit_devcluster::Standalone::start)
        .await
        .unwrap()
        .expect("start redis-server");
    let resp_port = harness::free_port();
    let mut config = config_from_toml(&format!(
        "[server]\nrequest_deadline = \"700ms\"\n\
         [store]\ncommand_timeout = \"{COMMAND_TIMEOUT}\"\n\
         [heal]\nprobe_misses = 0\n\
         [resp]\nlisten = \"127.0.0.1:{resp_port}\"\n\
         [[family]]\nprefix = \"prim:\"\ncopies = 1\ndefault_class = \"primary\"\n"
    ));
    config.store.redis = Some(server.url());
    let service = Service::start(config).await;
    let http = reqwest::Client::new();
    for key in 1..=4 {
        let key = format!("prim:{key}");
        publish_expecting(
            &http,
            &service.base,
            Edit::new(&key, 1, "one"),
            StatusCode::OK,
        )
        .await;
    }
    let batch: Vec<u8> = (1..=4)
        .flat_map(|key| command(&["GET", &format!("prim:{key}")]))
        .chain(command(&["PING"]))
        .collect();
    let mut client = Client::connect(std::net::SocketAddr::from(([127, 0, 0, 1], resp_port))).await;
    client.send(&batch).await;
    answers_the_values(&mut client, "before the pause").await;

    let ahead = "hotsplit_resp_gets_ahead_total";
    let before = harness::sample(&metrics_text(&http, &service.base).await, ahead);
    server.node.pause().expect("SIGSTOP");
    client.send(&batch).await;
    // `Client::reply` waits 10 s at most: a third of the 30 s command timeout.
    for key in 1..=4 {
        match client.reply().await {
            Reply::Error(text) if text.starts_with("DEADLINE ") => {}
            other => panic!("prim:{key} on the paused node: {other:?}"),
        }
    }
    assert_eq!(client.reply().await, Reply::Simple("PONG".to_owned()));
    let after = harness::sample(&metrics_text(&http, &service.base).await, ahead);
    assert_eq!(after - before, 4, "the four GETs ran as one run");

    server.node.resume().expect("SIGCONT");
    client.send(&batch).await;
    answers_the_values(&mut client, "after the pause").await;
    service.stop().await;
}

/// Reads the replies to the batch of four `GET prim:N` and a `PING`: each value, then `PONG`.
async fn answers_the_values(client: &mut Client, when: &str) {
    for key in 1..=4 {
        assert_eq!(
            client.reply().await,
            Reply::Bulk(Some(b"one".to_vec())),
            "prim:{key} {when}"
        );
    }
    assert_eq!(client.reply().await, Reply::Simple("PONG".to_owned()));
}
