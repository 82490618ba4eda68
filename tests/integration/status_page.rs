//! The live status page in a real headless Chromium (`browser`), on a real cluster with two
//! instances: the page served by one shows both (the other's figures gathered through the
//! store), every figure it renders is the one `/v1/fleet` gave it, those match each instance's
//! own JSON endpoints, a family and keys named `<svg/onload=alert(1)>` show as text with no
//! script run and no CSP violation, and a paused master shows up on the page as a growing
//! retry queue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hotsplit::store::now_unix_ms;
use hotsplit::store::registry::INSTANCES_KEY;
use reqwest::StatusCode;
use serde_json::Value;

use crate::browser::Browser;
use crate::harness::{config_from_toml, get_json, owner_port, poll, Service};

/// A family prefix, and so key names, that would run script if rendered as HTML.
const HOSTILE: &str = "<svg/onload=alert(1)>";

/// A limit against a hang while the page catches up, not a speed check.
const PAGE_LIMIT: Duration = Duration::from_secs(30);

/// The page's state in one evaluation: the `/v1/fleet` answer it last rendered (by its
/// `at_ms`), every figure cell, and what the watcher recorded.
const SNAPSHOT: &str = r#"(() => {
  const summary = document.getElementById("summary");
  const at = summary ? summary.getAttribute("data-at") : null;
  const cells = Array.from(document.querySelectorAll("[data-field]")).map((e) => ({
    instance: e.dataset.instance || null, field: e.dataset.field, text: e.textContent,
    replica: e.dataset.replica || null, class_name: e.dataset.class_name || null,
    family: e.dataset.family || null, reason: e.dataset.reason || null,
    name: e.dataset.name || null,
  }));
  const handlers = Array.from(document.querySelectorAll("*"))
    .filter((e) => Array.from(e.attributes).some((a) => a.name.startsWith("on"))).length;
  const foreignSvg = Array.from(document.querySelectorAll("svg"))
    .filter((e) => !e.classList.contains("spark")).length;
  return { at, body: at ? (window.__fleet[at] || null) : null, cells, handlers, foreignSvg,
    violations: window.__violations, dialogs: window.__dialogs };
})()"#;

/// One figure cell of the page.
#[derive(Debug, serde::Deserialize)]
struct Cell {
    instance: Option<String>,
    field: String,
    text: String,
    replica: Option<String>,
    class_name: Option<String>,
    family: Option<String>,
    reason: Option<String>,
    name: Option<String>,
}

/// What [`SNAPSHOT`] returns.
#[derive(Debug)]
struct Snapshot {
    /// The `/v1/fleet` answer the page rendered last.
    body: Option<Value>,
    cells: Vec<Cell>,
    /// Elements with an `on…` attribute (none may exist).
    handlers: u64,
    /// `<svg>` elements other than the page's own sparklines (none may exist).
    foreign_svg: u64,
    violations: Vec<String>,
    dialogs: Vec<String>,
}

async fn snapshot(browser: &mut Browser) -> Snapshot {
    let value = browser.eval(SNAPSHOT).await;
    let strings = |name: &str| -> Vec<String> {
        serde_json::from_value(value[name].clone()).unwrap_or_default()
    };
    Snapshot {
        body: value["body"]
            .as_str()
            .map(|text| serde_json::from_str(text).expect("a /v1/fleet body")),
        cells: serde_json::from_value(value["cells"].clone()).expect("cells"),
        handlers: value["handlers"].as_u64().expect("handlers"),
        foreign_svg: value["foreignSvg"].as_u64().expect("foreignSvg"),
        violations: strings("violations"),
        dialogs: strings("dialogs"),
    }
}

impl Snapshot {
    /// The text of the one cell of `instance` named `field` whose extra attribute `key` (if
    /// any) is `value`.
    fn text(&self, instance: &str, field: &str, extra: Option<(&str, &str)>) -> &str {
        let found: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|cell| cell.instance.as_deref() == Some(instance) && cell.field == field)
            .filter(|cell| match extra {
                None => true,
                Some((key, value)) => {
                    let attribute = match key {
                        "replica" => &cell.replica,
                        "class_name" => &cell.class_name,
                        "family" => &cell.family,
                        "reason" => &cell.reason,
                        "name" => &cell.name,
                        _ => panic!("unknown attribute {key}"),
                    };
                    attribute.as_deref() == Some(value)
                }
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one cell {field} {extra:?} of {instance}: {found:?}"
        );
        &found[0].text
    }

    /// Every text of `field` cells of `instance`.
    fn texts(&self, instance: &str, field: &str) -> Vec<&str> {
        self.cells
            .iter()
            .filter(|cell| cell.instance.as_deref() == Some(instance) && cell.field == field)
            .map(|cell| cell.text.as_str())
            .collect()
    }

    /// The status of `instance` in the rendered body.
    fn status(&self, instance: &str) -> Option<&Value> {
        self.body.as_ref()?["instances"]
            .as_array()?
            .iter()
            .find(|member| member["instance"]["id"] == instance)
            .map(|member| &member["status"])
            .filter(|status| status.is_object())
    }

    /// Asserts that nothing ran that the page did not mean to run.
    fn assert_no_script_ran(&self) {
        assert!(
            self.violations.is_empty(),
            "CSP violations: {:?}",
            self.violations
        );
        assert!(self.dialogs.is_empty(), "dialogs: {:?}", self.dialogs);
        assert_eq!(self.handlers, 0, "elements with event handler attributes");
        assert_eq!(self.foreign_svg, 0, "svg elements the page did not draw");
    }
}

/// A number as the page shows it: `digits` decimals, or `–` for none.
fn assert_shown(text: &str, value: &Value, digits: usize, what: &str) {
    match value.as_f64() {
        None => assert_eq!(text, "–", "{what}"),
        Some(value) => {
            let shown: f64 = text
                .trim_end_matches('%')
                .parse()
                .unwrap_or_else(|_| panic!("{what}: {text:?} is a number"));
            let half = 0.5 / 10f64.powi(i32::try_from(digits).unwrap_or(0));
            assert!(
                (shown - value).abs() <= half + 1e-9,
                "{what}: shown {text:?}, given {value}"
            );
        }
    }
}

/// Every figure the page shows for `id` is the one the rendered `/v1/fleet` body gave it.
fn assert_rendered_as_given(page: &Snapshot, id: &str) {
    let status = page
        .status(id)
        .unwrap_or_else(|| panic!("{id} has figures"));
    assert_queue_and_lag_rendered(page, id, status);
    assert_routing_rendered(page, id, status);
    assert_near_cache_and_scrub_rendered(page, id, status);
    assert_families_rendered(page, id, status);
}

/// The retry queue's and the replicas' lag figures for `id` are rendered as given.
fn assert_queue_and_lag_rendered(page: &Snapshot, id: &str, status: &Value) {
    let queue = &status["retry_queue"];
    assert_eq!(
        page.text(id, "queue-depth", None),
        queue["depth"].to_string()
    );
    assert_eq!(
        page.text(id, "queue-bytes", None),
        queue["bytes"].to_string()
    );
    let keys: Vec<&str> = queue["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["copy_key"].as_str().expect("copy_key"))
        .collect();
    assert_eq!(page.texts(id, "entry-key"), keys);
    for line in status["lag"].as_array().expect("lag") {
        let replica = line["replica"].as_str().expect("replica");
        let at = Some(("replica", replica));
        assert_eq!(page.text(id, "lag-replica", at), replica);
        assert_eq!(page.text(id, "lag-primary", at), line["primary"]);
        for (field, figure) in [("lag-now", "now"), ("lag-p50", "p50"), ("lag-p99", "p99")] {
            assert_shown(page.text(id, field, at), &line["lag_ms"][figure], 1, field);
        }
    }
}

/// The routing figures of every class for `id` are rendered as given.
fn assert_routing_rendered(page: &Snapshot, id: &str, status: &Value) {
    for line in status["routing"].as_array().expect("routing") {
        let class = line["class"].as_str().expect("class");
        let at = Some(("class_name", class));
        assert_eq!(
            page.text(id, "routing-reads", at),
            line["reads"].to_string()
        );
        assert_eq!(
            page.text(id, "routing-primary", at),
            line["primary"].to_string()
        );
        let share = line["primary_fraction"].as_f64().expect("fraction") * 100.0;
        assert_shown(page.text(id, "routing-share", at), &share.into(), 1, class);
        for (reason, count) in line["primary_by_reason"].as_object().expect("reasons") {
            if count.as_u64() > Some(0) {
                let shown = page
                    .cells
                    .iter()
                    .find(|cell| {
                        cell.instance.as_deref() == Some(id)
                            && cell.field == "routing-reason"
                            && cell.class_name.as_deref() == Some(class)
                            && cell.reason.as_deref() == Some(reason)
                    })
                    .unwrap_or_else(|| panic!("{class} {reason} shown"));
                assert_eq!(shown.text, format!("{reason}: {count}"));
            }
        }
    }
}

/// The near cache's and the scrub's figures for `id` are rendered as given.
fn assert_near_cache_and_scrub_rendered(page: &Snapshot, id: &str, status: &Value) {
    let near = &status["near_cache"];
    for (field, figure) in [
        ("near-hits", "hits"),
        ("near-misses", "misses"),
        ("near-entries", "entries"),
        ("near-bytes", "bytes"),
    ] {
        assert_eq!(
            page.text(id, field, None),
            near[figure].to_string(),
            "{field}"
        );
    }
    // The scrub's figures: its top-level ones and those of its last pass, as rendered.
    let scrub = &status["scrub"];
    for name in ["enabled", "holds_lease", "passes"] {
        assert_eq!(
            page.text(id, "scrub-value", Some(("name", name))),
            scrub[name].to_string(),
            "scrub {name}"
        );
    }
    if let Some(last) = scrub["last"].as_object() {
        for figure in ["repaired_missing", "repaired_behind", "keys_checked"] {
            let name = format!("last.{figure}");
            assert_eq!(
                page.text(id, "scrub-value", Some(("name", &name))),
                last[figure].to_string(),
                "scrub {name}"
            );
        }
    }
}

/// The families and their copy counts for `id` are rendered as given.
fn assert_families_rendered(page: &Snapshot, id: &str, status: &Value) {
    let families: Vec<&str> = status["families"]
        .as_array()
        .expect("families")
        .iter()
        .map(|family| family["family"].as_str().expect("family"))
        .collect();
    assert_eq!(page.texts(id, "family"), families);
    for family in status["families"].as_array().expect("families") {
        let at = Some(("family", family["family"].as_str().expect("family")));
        assert_eq!(
            page.text(id, "family-copies", at),
            family["copies"].to_string()
        );
        assert_eq!(
            page.text(id, "family-writes", at),
            family["write_copies"].to_string()
        );
        assert_eq!(
            page.text(id, "family-max-copies", at),
            family["max_copies"].to_string()
        );
    }
}

/// The figures `/v1/fleet` gave for an instance are the ones its own JSON endpoints answer
/// (with no traffic in between).
async fn assert_matches_endpoints(http: &reqwest::Client, status: &Value, base: &str) {
    let queue = get_json(http, &format!("{base}/v1/retry-queue")).await;
    assert_eq!(status["retry_queue"]["depth"], queue["depth"]);
    let routing = get_json(http, &format!("{base}/v1/routing")).await;
    for (shown, own) in status["routing"]
        .as_array()
        .expect("routing")
        .iter()
        .zip(routing.as_array().expect("routing"))
    {
        for figure in ["class", "reads", "replica", "primary", "primary_by_reason"] {
            assert_eq!(shown[figure], own[figure], "routing {figure}");
        }
    }
    let near = get_json(http, &format!("{base}/v1/near-cache")).await;
    for figure in ["enabled", "hits", "misses", "coalesced", "floor_reads"] {
        assert_eq!(
            status["near_cache"][figure], near[figure],
            "near cache {figure}"
        );
    }
    let lag = get_json(http, &format!("{base}/v1/lag")).await;
    let pairs = |lines: &Value| -> Vec<(String, String)> {
        lines
            .as_array()
            .expect("lag lines")
            .iter()
            .map(|line| (line["replica"].to_string(), line["primary"].to_string()))
            .collect()
    };
    assert_eq!(pairs(&status["lag"]), pairs(&lag));
    assert!(!pairs(&lag).is_empty(), "a cluster has replicas");
    let classes = get_json(http, &format!("{base}/v1/classes")).await;
    for (shown, own) in status["classes"]
        .as_array()
        .expect("classes")
        .iter()
        .zip(classes.as_array().expect("classes"))
    {
        assert_eq!(shown["class"], own["name"]);
        assert_eq!(shown["staleness_budget_ms"], own["staleness_budget_ms"]);
    }
}

/// `key` percent-encoded for a path segment.
fn path_segment(key: &str) -> String {
    key.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_shows_both_instances_as_text_and_a_paused_master_as_a_growing_queue() {
    let Some(mut browser) = Browser::launch().await else {
        return;
    };
    let cluster = crate::harness::own_cluster_without_failover().await;
    let config = || {
        config_from_toml(&format!(
            "[[family]]\nprefix = {HOSTILE:?}\ncopies = 8\nttl = \"10m\"\n\
             [store]\nredis = {:?}\ncommand_timeout = \"{}\"\n\
             [fleet]\nheartbeat_interval = \"500ms\"\n",
            cluster.url(),
            crate::harness::command_timeout_toml()
        ))
    };
    let a = Service::start(config()).await;
    let b = Service::start(config()).await;
    let http = reqwest::Client::new();
    let id_of = |view: Value| view["this"].as_str().expect("this").to_owned();
    let a_id = id_of(get_json(&http, &format!("{}/v1/instances", a.base)).await);
    let b_id = id_of(get_json(&http, &format!("{}/v1/instances", b.base)).await);

    wait_until_every_lag_is_measured(&http, [&a, &b]).await;

    // Traffic on both, so the bill and the near cache have figures.
    publish_and_read_a_hostile_key(&http, &a.base, &b.base).await;
    let quiet_since = now_unix_ms();

    // The page, from A: wait until it rendered both instances with figures taken after the
    // traffic (B's come from the store, published every 500 ms).
    browser.navigate(&format!("{}/status", a.base)).await;
    let page = page_with_fresh_figures(&mut browser, [&a_id, &b_id], quiet_since).await;
    assert!(browser.errors().is_empty(), "{:#?}", browser.errors());
    page.assert_no_script_ran();
    for (id, base) in [(&a_id, &a.base), (&b_id, &b.base)] {
        assert_rendered_as_given(&page, id);
        assert_matches_endpoints(&http, page.status(id).expect("figures"), base).await;
        // The hostile family name is shown as the text it is.
        assert!(page.texts(id, "family").contains(&HOSTILE), "{id}");
    }
    let b_status = page.status(&b_id).expect("b's figures");
    assert!(b_status["routing"]
        .as_array()
        .expect("routing")
        .iter()
        .any(|line| line["reads"].as_u64() > Some(0)));

    // A master not holding the registry's slot stops; B keeps publishing new keys, whose copies
    // on that master are queued. A's page shows B's queue growing.
    let registry_node = owner_port(&cluster, INSTANCES_KEY);
    let victim = cluster
        .masters()
        .expect("masters")
        .iter()
        .map(|node| node.port())
        .find(|port| *port != registry_node)
        .expect("a master without the registry");
    cluster
        .node(victim)
        .expect("victim")
        .pause()
        .expect("SIGSTOP");
    let paused_at = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(publish_new_keys(b.base.clone(), stop.clone()));
    let (page, depth, first) = wait_for_the_queue_to_grow(&mut browser, &b_id, paused_at).await;
    let (first_depth, first_after) = first.expect("a first depth");
    println!(
        "status page: B's queue shown at {first_depth} {first_after:?} after the pause, {depth} {:?} after it",
        paused_at.elapsed()
    );
    // The oldest entries are the hostile copy keys, shown as text.
    let entries = page.texts(&b_id, "entry-key");
    assert!(!entries.is_empty());
    for entry in &entries {
        assert!(
            entry.starts_with(HOSTILE) && entry.contains('#'),
            "{entry:?}"
        );
    }
    assert_ne!(page.text(&b_id, "queue-oldest-age", None), "0.0 s");
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    cluster
        .node(victim)
        .expect("victim")
        .resume()
        .expect("SIGCONT");
    assert!(browser.errors().is_empty(), "{:#?}", browser.errors());

    an_injected_inline_handler_is_refused(&mut browser).await;
    drop(browser);
    a.stop().await;
    b.stop().await;
}

/// Waits until each of `services` has measured every replica's lag.
async fn wait_until_every_lag_is_measured(http: &reqwest::Client, services: [&Service; 2]) {
    for service in services {
        poll("every replica's lag is measured", PAGE_LIMIT, || async {
            let lines = get_json(http, &format!("{}/v1/lag", service.base)).await;
            lines.as_array().is_some_and(|lines| {
                lines.len() == 3 && lines.iter().all(|line| line["lag_ms"]["p99"].is_number())
            })
        })
        .await;
    }
}

/// Publishes a hostile key through `a_base` and reads it there and through `b_base` with a few
/// clients.
async fn publish_and_read_a_hostile_key(http: &reqwest::Client, a_base: &str, b_base: &str) {
    let key = format!("{HOSTILE}0");
    let answer = http
        .put(format!(
            "{}/v1/keys/{}?version=1",
            a_base,
            path_segment(&key)
        ))
        .body("v1")
        .send()
        .await
        .expect("publish");
    assert_eq!(answer.status(), StatusCode::OK);
    for (base, client) in [
        (a_base, "c1"),
        (a_base, "c1"),
        (b_base, "c2"),
        (b_base, "c3"),
    ] {
        let answer = http
            .get(format!(
                "{base}/v1/keys/{}?client={client}",
                path_segment(&key)
            ))
            .send()
            .await
            .expect("read");
        assert_eq!(answer.status(), StatusCode::OK);
    }
}

/// Snapshots of the page until it renders both `ids` with figures taken after `quiet_since`.
async fn page_with_fresh_figures(
    browser: &mut Browser,
    ids: [&str; 2],
    quiet_since: u64,
) -> Snapshot {
    let deadline = Instant::now() + PAGE_LIMIT;
    loop {
        let page = snapshot(browser).await;
        let fresh = |id: &str| {
            page.status(id)
                .and_then(|status| status["at_ms"].as_u64())
                .is_some_and(|at| at > quiet_since)
        };
        if fresh(ids[0]) && fresh(ids[1]) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "the page shows both instances: {:?}",
            page.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes new hostile keys through `base`, one every 50 ms, until `stop`.
async fn publish_new_keys(base: String, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let mut n = 1u64;
    while !stop.load(Ordering::Relaxed) {
        let key = path_segment(&format!("{HOSTILE}{n}"));
        let _ = http
            .put(format!("{base}/v1/keys/{key}?version=1"))
            .body("v1")
            .send()
            .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await; // Pacing, not a wait.
    }
}

/// Snapshots of the page until `id`'s queue depth, once shown above zero, grows; returns that
/// page, its depth, and the first depth above zero with how long after `paused_at` it showed.
async fn wait_for_the_queue_to_grow(
    browser: &mut Browser,
    id: &str,
    paused_at: Instant,
) -> (Snapshot, u64, Option<(u64, Duration)>) {
    let mut first: Option<(u64, Duration)> = None;
    loop {
        let page = snapshot(browser).await;
        page.assert_no_script_ran();
        let depth: u64 = page.text(id, "queue-depth", None).parse().expect("a depth");
        match first {
            None if depth > 0 => first = Some((depth, paused_at.elapsed())),
            Some((seen, _)) if depth > seen => return (page, depth, first),
            _ => {}
        }
        assert!(
            paused_at.elapsed() < PAGE_LIMIT,
            "B's queue grows on A's page: {depth} after {:?}",
            paused_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The detector can fail: markup with an inline handler, put in the page by hand, is refused by
/// the policy and seen as a violation, and its script does not run.
async fn an_injected_inline_handler_is_refused(browser: &mut Browser) {
    browser
        .eval(r#"(() => { const d = document.createElement("div"); d.innerHTML = '<img src="status/status.css" onerror="alert(2)">'; document.body.append(d); return true; })()"#)
        .await;
    let deadline = Instant::now() + PAGE_LIMIT;
    while browser.eval("window.__violations.length").await.as_u64() == Some(0) {
        assert!(Instant::now() < deadline, "the injected handler is refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(browser.eval("window.__dialogs.length").await, 0);
}
