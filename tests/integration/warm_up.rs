//! The readiness warm-up (`server.readiness_warm_up`) on a real primary and replica: `/readyz`
//! answers 503 `warming_up` until the replica's first lag sample, and replica-routed reads go
//! to the primary meanwhile with reason `lag-unmeasured`, counted in the capacity bill; a
//! replica that never answers leaves the instance ready at the bound with the replica named; a
//! config whose classes all read primaries has no warm-up.
//!
//! A replica is kept unmeasured by `CLIENT PAUSE … WRITE` sent to it (it answers reads but
//! applies nothing from its primary, so this instance's heartbeat never shows there) or by
//! SIGSTOP (it answers nothing).

use std::time::{Duration, Instant};

use hotsplit::config::Config;
use hotsplit_devcluster::{self as devcluster, PrimaryReplica};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::harness::{
    self, config_from_toml, get_json, metrics_text, poll, problem, publish_expecting, Edit, Service,
};
use crate::route::{read, wait_for_read, Read, NEAR_CACHE_OFF};

/// Every class reads primaries: the built-in replica classes are redefined.
const PRIMARY_CLASSES_ONLY: &str = r#"
[classes.advisory]
route = "primary"
reason = "test: every class reads primaries"

[classes.re-derivable]
route = "primary"
reason = "test: every class reads primaries"
"#;

/// A service over `group` (its replica configured) with one advisory family `w:`, the near
/// cache off and a warm-up of `warm_up`; `extra` is appended to the TOML.
fn config(group: &PrimaryReplica, warm_up: Duration, extra: &str) -> Config {
    let mut config = config_from_toml(&format!(
        "[store]\nredis = \"{}\"\nreplicas = [\"{}\"]\ncommand_timeout = \"{}\"\nconnect_timeout = \"500ms\"\n\n[[family]]\nprefix = \"w:\"\ncopies = 2\ndefault_class = \"advisory\"\n{NEAR_CACHE_OFF}{extra}",
        group.url(),
        group.replicas[0].url(),
        harness::command_timeout_toml()
    ));
    config.server.readiness_warm_up = warm_up;
    config
}

/// The line of `/v1/routing` for `class`.
async fn routing_of(http: &reqwest::Client, base: &str, class: &str) -> Value {
    let routing = get_json(http, &format!("{base}/v1/routing")).await;
    routing
        .as_array()
        .and_then(|lines| lines.iter().find(|line| line["class"] == class))
        .cloned()
        .unwrap_or_else(|| panic!("/v1/routing has no line for {class}: {routing}"))
}

/// The value of the bill counter of `class` read from a primary for `reason`, from `/metrics`.
async fn primary_reads(http: &reqwest::Client, base: &str, class: &str, reason: &str) -> u64 {
    let text = metrics_text(http, base).await;
    let prefix = format!(
        r#"hotsplit_route_reads_total{{class="{class}",served_by="primary",reason="{reason}"}} "#
    );
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("/metrics has no line starting {prefix:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_warms_up_until_the_replicas_first_lag_sample_and_reads_meanwhile_are_lag_unmeasured(
) {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    let replica_label = replica.addr();
    // Replication held back: the replica answers reads but never shows a heartbeat.
    devcluster::cli(replica.port(), &["CLIENT", "PAUSE", "60000", "WRITE"]).expect("CLIENT PAUSE");
    let http = reqwest::Client::new();

    // Every class reads primaries: nothing to wait for, so the instance is ready (within the
    // harness's limit, far below the 60 s bound) although the replica is unmeasured.
    let service = Service::start(config(
        &group,
        Duration::from_secs(60),
        PRIMARY_CLASSES_ONLY,
    ))
    .await;
    let ready = get_json(&http, &format!("{}/readyz", service.base)).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready.get("warm_up_pending").is_none(), "{ready}");
    service.stop().await;

    // Advisory reads replicas: `/readyz` answers 503 while the replica is unmeasured.
    let service = Service::spawn(config(&group, Duration::from_secs(60), "")).await;
    let base = service.base.clone();
    let url = format!("{base}/readyz");
    let answer = harness::get(&http, &url, &[]).await;
    assert!(answer.headers().get("retry-after").is_some());
    let body = problem(answer, StatusCode::SERVICE_UNAVAILABLE, "warming_up", &url).await;
    assert_eq!(
        body["warm_up_pending"],
        json!({ "replicas_unmeasured": [replica_label] }),
        "{body}"
    );

    // A replica-routed read meanwhile: the primary serves, and the bill says why.
    publish_expecting(&http, &base, Edit::new("w:1", 1, "one"), StatusCode::OK).await;
    let w_1 = format!("{base}/v1/keys/w:1?client=a");
    let Read {
        status,
        body,
        served_by,
        route,
    } = read(&http, &w_1, &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "one"));
    assert_eq!(served_by, format!("{};role=primary", group.primary.addr()));
    assert_eq!(route, "class=advisory;reason=lag-unmeasured");
    let advisory = routing_of(&http, &base, "advisory").await;
    assert_eq!(
        advisory["primary_by_reason"]["lag-unmeasured"], 1,
        "{advisory}"
    );
    assert_eq!(
        primary_reads(&http, &base, "advisory", "lag-unmeasured").await,
        1
    );

    // Replication resumes: the first heartbeat reaches the replica, the instance turns ready
    // with nothing pending, and advisory reads are the replica's.
    devcluster::cli(replica.port(), &["CLIENT", "UNPAUSE"]).expect("CLIENT UNPAUSE");
    poll("/readyz answers 200", Duration::from_secs(30), || async {
        harness::get(&http, &url, &[]).await.status() == StatusCode::OK
    })
    .await;
    let ready = get_json(&http, &url).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready.get("warm_up_pending").is_none(), "{ready}");
    wait_for_read(
        &http,
        &w_1,
        "an advisory read served by the replica",
        Duration::from_secs(10),
        |read| {
            read.body == "one"
                && read.served_by == format!("{replica_label};role=replica")
                && read.route == "class=advisory;reason=class"
        },
    )
    .await;
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_answers_leaves_the_instance_ready_at_the_bound_and_named() {
    let group = PrimaryReplica::start(1).expect("primary and replica");
    let replica = &group.replicas[0];
    replica.pause().expect("SIGSTOP the replica");
    let bound = Duration::from_secs(2);
    let started = Instant::now();
    let service = Service::start(config(&group, bound, "")).await;
    // The replica never answered, so only the bound can have ended the warm-up.
    assert!(
        started.elapsed() >= bound,
        "ready after {:?}, before the {bound:?} bound",
        started.elapsed()
    );
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let ready = get_json(&http, &format!("{base}/readyz")).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(
        ready["warm_up_pending"],
        json!({ "replicas_unmeasured": [replica.addr()] }),
        "{ready}"
    );
    // Its reads still go to the primary, as not measured.
    publish_expecting(&http, &base, Edit::new("w:2", 1, "one"), StatusCode::OK).await;
    let Read {
        served_by, route, ..
    } = read(&http, &format!("{base}/v1/keys/w:2?client=a"), &[]).await;
    assert_eq!(served_by, format!("{};role=primary", group.primary.addr()));
    assert_eq!(route, "class=advisory;reason=lag-unmeasured");
    replica.resume().expect("SIGCONT the replica");
    service.stop().await;
}
