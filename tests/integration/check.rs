//! `hotsplit check` end to end: short seeded runs, each on its own throwaway cluster, one of
//! them over TLS end to end.

use std::path::Path;
use std::process::{Command, Output};

use hotsplit_devcluster::{namespaces_or_skip, TlsFiles};
use serde_json::Value;

use crate::tls_pki::pki;

/// Short seeded runs, each on its own throwaway cluster, with seeds other than the README's 1.
/// They run one after the other in one test: two clusters of six servers side by side would
/// compete for the same two cores. The second runs over TLS (`--tls-ca-file`, `--tls-cert-file`,
/// `--tls-key-file`: nodes that speak TLS only and require a client certificate), so TLS costs
/// CI no third run; its verdicts are judged by the same assertions.
#[test]
fn short_checks_pass_and_their_checkers_fire_where_they_should() {
    short_check("7", None);
    short_check("11", Some(&pki().files));
}

/// Runs `hotsplit check` for 10 s with `seed` (over TLS with `tls`) and asserts its verdicts.
fn short_check(seed: &str, tls: Option<&TlsFiles>) {
    let out = tempfile::tempdir().unwrap();
    let output = run_check(seed, tls, out.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "seed {seed}: stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("| random-suffix |"), "{stdout}");
    assert!(stderr.contains("operations"), "progress is shown: {stderr}");
    if tls.is_some() {
        assert!(
            stderr.contains("redis cluster over tls"),
            "the run says it uses TLS: {stderr}"
        );
        assert_the_runs_own_connections_spoke_tls(out.path());
    }

    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    assert_judged_modes(seed, &summary);
    assert_near_cache_modes(seed, &summary);
    assert_read_your_writes_and_presence(seed, &summary);
    for name in [
        "report.md",
        "history-random-suffix.jsonl",
        "history-affine.jsonl",
        "history-floor.jsonl",
        "history-delete.jsonl",
        "history-presence.jsonl",
    ] {
        assert!(out.path().join(name).is_file(), "{name} is written");
    }
}

/// `hotsplit check` for 10 s with `seed` (over TLS with `tls`), its files under `out`.
fn run_check(seed: &str, tls: Option<&TlsFiles>, out: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hotsplit"));
    command.args(["check", "--duration", "10s", "--seed", seed, "--out"]);
    command.arg(out);
    if let Some(tls) = tls {
        command
            .arg("--tls-ca-file")
            .arg(&tls.ca_file)
            .arg("--tls-cert-file")
            .arg(&tls.cert_file)
            .arg("--tls-key-file")
            .arg(&tls.key_file);
    }
    command.output().expect("run hotsplit check")
}

/// The run's own connections spoke TLS too: the sampler read copies' versions from the
/// masters, and replica pauses (recorded only once a node accepted them) were sent.
fn assert_the_runs_own_connections_spoke_tls(out: &Path) {
    let history = std::fs::read_to_string(out.join("history-affine.jsonl")).unwrap();
    let events: Vec<Value> = history
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|event| event["op"] == "sample" && event["version"].is_u64()),
        "no copy was sampled over TLS"
    );
    assert!(
        events
            .iter()
            .any(|event| event["outcome"]["error"] == "replica-replication-pause"),
        "no replica was paused over TLS"
    );
}

/// The row of mode `name` without the near cache in `summary`.
fn mode(summary: &Value, name: &str) -> Value {
    summary["modes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|mode| mode["mode"] == name && mode["near_cache"] == false)
        .unwrap()
        .clone()
}

/// Every monotonic-read violation of `mode`, whatever explains it.
fn violations(mode: &Value) -> u64 {
    [
        "monotonic_violations",
        "monotonic_violations_in_loss_windows",
        "monotonic_violations_across_copies",
        "monotonic_violations_across_roles",
    ]
    .iter()
    .map(|field| mode[field].as_u64().unwrap())
    .sum::<u64>()
}

/// Random suffixes break monotonic reads; outside loss windows no judged mode does.
fn assert_judged_modes(seed: &str, summary: &Value) {
    let random = mode(summary, "random-suffix");
    assert!(
        violations(&random) > 0,
        "seed {seed}: random suffixes under lagging replicas must break monotonic reads: {random}"
    );
    // Outside loss windows, no judged mode shows a violation of any scope, nor a writer one of
    // its own writes (the exit status says so too; this names the mode).
    for name in ["affine", "floor", "delete", "resp"] {
        let judged = mode(summary, name);
        assert!(
            judged["reads"].as_u64().unwrap() > 0,
            "seed {seed}: {name} read nothing: {judged}"
        );
        let outside = violations(&judged)
            - judged["monotonic_violations_in_loss_windows"]
                .as_u64()
                .unwrap();
        assert_eq!(outside, 0, "seed {seed}: {judged}");
    }
    let floor = mode(summary, "floor");
    assert_eq!(violations(&floor), 0, "seed {seed}: {floor}");
}

/// The same three modes against a service answering from its near cache: judged by the same
/// rules, with the staleness of every read and Redis's copy reads measured.
fn assert_near_cache_modes(seed: &str, summary: &Value) {
    let near_rows: Vec<Value> = summary["modes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|mode| mode["near_cache"] == true)
        .cloned()
        .collect();
    let names: Vec<&str> = near_rows
        .iter()
        .map(|mode| mode["mode"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["affine", "floor", "resp"], "seed {seed}");
    for row in &near_rows {
        assert!(row["reads"].as_u64().unwrap() > 0, "seed {seed}: {row}");
        let outside = violations(row)
            - row["monotonic_violations_in_loss_windows"]
                .as_u64()
                .unwrap();
        assert_eq!(outside, 0, "seed {seed}: {row}");
        assert_eq!(
            row["read_your_writes_violations"].as_u64(),
            Some(0),
            "{row}"
        );
        assert!(row["staleness"]["count"].as_u64().unwrap() > 0, "{row}");
        // The near cache answered some of them, and their staleness is shown apart.
        assert!(
            row["near_cache_hit_staleness"]["count"].as_u64().unwrap() > 0,
            "{row}"
        );
        assert!(row["redis_reads_per_s"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert_eq!(
        violations(&near_rows[1]),
        0,
        "seed {seed}: {}",
        near_rows[1]
    );
}

/// No mode reads past its own writes; invalidation costs source loads; only the primary
/// decides on presence without a wrong answer.
fn assert_read_your_writes_and_presence(seed: &str, summary: &Value) {
    for name in ["random-suffix", "affine", "floor", "delete"] {
        let judged = mode(summary, name);
        assert_eq!(
            judged["read_your_writes_violations"].as_u64(),
            Some(0),
            "seed {seed}: {judged}"
        );
    }
    assert!(
        mode(summary, "delete")["source_loads"].as_u64().unwrap() > 0,
        "invalidation costs source loads"
    );

    let presence = |class: &str| {
        summary["presence"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["class"] == class)
            .unwrap()
            .clone()
    };
    let advisory = presence("advisory");
    let primary = presence("decides-on-presence");
    assert!(
        advisory["wrong"].as_u64().unwrap() > 0,
        "a staleness budget cannot save a presence decision: {advisory}"
    );
    assert!(primary["decisions"].as_u64().unwrap() > 0, "{primary}");
    assert_eq!(primary["wrong"].as_u64(), Some(0), "{primary}");
}

/// Runs `hotsplit check ARGS --out OUT`, asserts it exits 0 (showing both streams when it does
/// not) and returns its stdout.
fn passing_check(args: &[&str], out: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_hotsplit"))
        .arg("check")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run hotsplit check");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(0),
        "hotsplit check {args:?}\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `check --mode client-cache`, short: readers with a client-side cache by redis-py's rules on
/// one instance's door while writers publish through the other and through it, under the process
/// faults and feed cuts. It passes (no reader goes back, no cached answer is older than the
/// bound), its readers answered from their caches, and the feed cuts flushed keys they held
/// (pushed one by one: hotsplit sends no null invalidation).
#[test]
fn check_client_cache_mode_passes_with_cache_hits_and_feed_flushes() {
    let out = tempfile::tempdir().unwrap();
    let stdout = passing_check(
        &["--mode", "client-cache", "--duration", "15s", "--seed", "3"],
        out.path(),
    );
    assert!(stdout.contains("## Client-side caching"), "{stdout}");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    let modes = summary["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 1, "only the mode named runs: {summary}");
    let row = &modes[0]["client_cache"];
    for figure in [
        "cache_hits",
        "door_reads",
        "flush_pushes",
        "feed_flushes",
        "feed_cuts",
    ] {
        assert!(row[figure].as_u64().unwrap() > 0, "{figure}: {row}");
    }
    for figure in ["over_bound", "monotonic_violations"] {
        assert_eq!(row[figure].as_u64(), Some(0), "{figure}: {row}");
    }
    assert!(
        row["cached_staleness"]["max_ms"].as_f64().unwrap() <= row["bound_ms"].as_f64().unwrap(),
        "{row}"
    );
    assert!(out.path().join("history-client-cache-near.jsonl").is_file());
}

/// `check --instances 2`, short: two `hotsplit serve` processes on one throwaway cluster, every
/// session round-robin over both. With the session token no session goes back in time nor
/// misses its own write in either mode, and no row loses an accepted edit; keys of one copy
/// split by detection and merge once cool, mid-run, with neither; the instance holding queued
/// heals is SIGKILLed, its spool deleted, and the surviving instance's scrub levels every copy.
#[test]
fn check_across_two_instances_holds_with_the_token_and_the_scrub_levels_a_lost_spool() {
    let out = tempfile::tempdir().unwrap();
    passing_check(
        &["--instances", "2", "--duration", "12s", "--seed", "5"],
        out.path(),
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("fleet.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{report}");
    for row in rows.iter().filter(|row| row["token"] == true) {
        let figures = &row["figures"];
        assert!(figures["reads"].as_u64().unwrap() > 0, "{row}");
        assert!(figures["writes"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(figures["monotonic_violations"].as_u64(), Some(0), "{row}");
        assert_eq!(
            figures["read_your_writes_violations"].as_u64(),
            Some(0),
            "{row}"
        );
    }
    for row in rows {
        assert_eq!(row["figures"]["lost_edits"].as_u64(), Some(0), "{row}");
    }
    // Keys of one copy split by detection and merged once cool, mid-run, with no violation.
    let split = &report["split"];
    let figures = &split["figures"];
    assert!(split["split_after_ms"].as_u64().is_some(), "{split}");
    assert!(split["merged_after_ms"].as_u64().is_some(), "{split}");
    assert!(figures["copies_served"].as_u64().unwrap() > 1, "{split}");
    for figure in [
        "monotonic_violations",
        "read_your_writes_violations",
        "lost_edits",
    ] {
        assert_eq!(figures[figure].as_u64(), Some(0), "{figure}: {split}");
    }
    let convergence = &report["convergence"];
    assert!(convergence["queued"].as_u64().unwrap() > 0, "{convergence}");
    assert!(
        convergence["level_after_ms"].as_u64().is_some(),
        "{convergence}"
    );
    assert!(
        convergence["scrub_repairs"].as_u64().unwrap() > 0,
        "{convergence}"
    );
    assert!(out.path().join("fleet.md").is_file());
}

/// `hotsplit check --nemesis partition`, short: every scenario's row is printed and written,
/// the run passes, and the row without the rule shows the losses the rule prevents.
#[test]
fn check_partition_nemesis_passes_with_a_row_per_scenario() {
    if !namespaces_or_skip("check_partition_nemesis") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let stdout = passing_check(
        &["--nemesis", "partition", "--duration", "6s", "--seed", "3"],
        out.path(),
    );
    assert!(stdout.contains("PASS"), "{stdout}");
    let scenarios = [
        "instance cut from one master",
        "master cut from its replica",
        "split brain, under the rule",
        "split brain, without the rule",
        "instance cut from the registry master",
        "flapping cuts",
    ];
    for scenario in scenarios {
        assert!(
            stdout.contains(&format!("| {scenario} |")),
            "{scenario}: {stdout}"
        );
    }
    let markdown = std::fs::read_to_string(out.path().join("partition.md")).unwrap();
    for n in 1..=scenarios.len() {
        let history =
            std::fs::read_to_string(out.path().join(format!("partition-{n}.jsonl"))).unwrap();
        assert!(history.contains(r#""op":"write""#), "history {n}");
    }
    assert!(
        markdown.contains("| split brain, under the rule |"),
        "{markdown}"
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("partition.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|row| row["scenario"].as_str())
        .collect();
    assert_eq!(names, scenarios);
    for row in rows {
        for figure in ["monotonic_client", "monotonic_session", "read_your_writes"] {
            assert_eq!(row[figure].as_u64(), Some(0), "{figure}: {row}");
        }
        assert!(row["converge_ms"].is_u64(), "{row}");
        assert!(row["reads"].as_u64().unwrap() > 0, "{row}");
        if row["judged"] == "judged" {
            assert_eq!(row["acknowledged_lost"], serde_json::json!([]), "{row}");
        }
    }
    // The row without the rule is shown, not judged. Whether a 6 s run loses anything in it
    // depends on whether the isolated instance had a publish answered 200 before its master
    // stopped taking writes (one CI run had none: 0 lost of 190), so that losses happen without
    // the rule is asserted by the integration test of the same split brain,
    // `partition::partition_split_brain_without_the_rule_loses_answered_publishes_but_no_reader_goes_back`;
    // here the row must be there, unjudged, with its count.
    let without = &rows[3];
    assert_eq!(without["rule"], false, "{without}");
    assert_eq!(without["judged"], "shown", "{without}");
    assert!(without["answered_lost"].is_array(), "{without}");
}
