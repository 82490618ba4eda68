//! The files under `deploy/`: the compose file's hotsplit config is valid, and the Grafana
//! dashboard and the alert rules name only metrics the service exports (so a renamed metric
//! fails here, not on an operator's empty panel).

use std::collections::BTreeSet;
use std::path::Path;

use hotsplit::config::Config;

use crate::harness;

/// The text of `deploy/NAME`.
fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

/// Every `hotsplit_…` metric name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("hotsplit_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The series names a `/metrics` body can hold, from its `# TYPE` lines (a family appears there
/// even before its first sample): counters as `_total`, histograms as `_bucket`, `_sum`,
/// `_count` (and the family name, which descriptions mention), info metrics as `_info`, gauges as
/// they are.
fn exported_series(exposition: &str) -> BTreeSet<String> {
    let mut series = BTreeSet::new();
    for line in exposition.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = declaration.split_whitespace();
        let (Some(family), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                series.insert(format!("{family}_total"));
            }
            "histogram" => {
                for suffix in ["", "_bucket", "_sum", "_count"] {
                    series.insert(format!("{family}{suffix}"));
                }
            }
            "info" => {
                series.insert(format!("{family}_info"));
            }
            _ => {
                series.insert(family.to_owned());
            }
        }
    }
    series
}

#[test]
fn the_compose_config_is_a_valid_hotsplit_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/hotsplit.toml");
    let config = Config::from_file(&path).expect("deploy/hotsplit.toml parses");
    config.validate().expect("deploy/hotsplit.toml is valid");
    assert!(
        config
            .store
            .redis
            .as_deref()
            .is_some_and(|url| url.starts_with("redis-cluster://")),
        "the compose config points at the compose file's cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_name_only_exported_metrics() {
    let service = harness::Service::start(harness::config_with_family(None, "post:", 4)).await;
    let exposition = harness::metrics_text(&reqwest::Client::new(), &service.base).await;
    service.stop().await;
    let exported = exported_series(&exposition);
    assert!(
        exported.contains("hotsplit_reads_total"),
        "the exposition declares its families: {exposition}"
    );

    let dashboard = deploy_file("grafana-dashboard.json");
    let parsed: serde_json::Value =
        serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let exprs = parsed["panels"]
        .as_array()
        .expect("the dashboard has panels")
        .iter()
        .filter_map(|panel| panel["targets"].as_array())
        .flatten()
        .filter_map(|target| target["expr"].as_str())
        .count();
    assert!(exprs >= 10, "the dashboard has {exprs} queries");

    for (file, text) in [
        ("grafana-dashboard.json", dashboard),
        ("alerts.yaml", deploy_file("alerts.yaml")),
    ] {
        let named = metric_names(&text);
        assert!(named.len() >= 8, "{file} names {named:?}");
        let unknown: Vec<_> = named.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics /metrics does not export: {unknown:?}"
        );
    }
}
