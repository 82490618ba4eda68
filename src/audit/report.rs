//! The audit's report: what was audited and the [`Figures`], as markdown tables or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::figures::{Figures, LaggingCopy, ReadRole, RoleFigures};

/// A replica that could not be connected; its reads count as failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnreachableNode {
    /// The replica, `host:port`.
    pub node: String,
    /// Why it could not be connected.
    pub error: String,
}

/// One audit round: the deployment, the sample and the figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The URL audited.
    pub target: String,
    /// Whether it is a Redis Cluster.
    pub cluster: bool,
    /// Primaries found.
    pub primaries: usize,
    /// Replicas found.
    pub replicas: usize,
    /// Replicas that could not be connected.
    pub unreachable_replicas: Vec<UnreachableNode>,
    /// The key prefix audited, if any.
    pub prefix: Option<String>,
    /// How copy counts were chosen: `config`, `fixed` or `inferred`.
    pub copy_counts: &'static str,
    /// Keys SCAN returned.
    pub scanned_keys: u64,
    /// Whether every primary was scanned to the end.
    pub scan_complete: bool,
    /// Keys skipped because they have one copy.
    pub unsplit_keys: u64,
    /// Copies of sampled keys at an index at or beyond their copy count.
    pub stray_copies: u64,
    /// The copy-read pace, per second.
    pub rate: u32,
    /// How long the round took.
    pub elapsed_ms: u64,
    /// The figures.
    #[serde(flatten)]
    pub figures: Figures,
}

impl Report {
    /// Whether any copy read on a primary is behind or disagrees with its key's newest version
    /// (what `--fail-on-behind` fails on; replica lag alone does not count).
    pub fn primaries_disagree(&self) -> bool {
        self.figures.primary.inconsistent_reads > 0
    }

    /// The report as indented JSON.
    pub fn json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The report as one JSON line.
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The report as markdown: a summary, one table row per role, the worst keys.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let figures = &self.figures;
        let kind = if self.cluster {
            "cluster"
        } else {
            "standalone"
        };
        let _ = writeln!(out, "# hotsplit audit\n");
        let _ = writeln!(
            out,
            "Target `{}` ({kind}; primaries: {}, replicas: {}). {} keys read{}, sampled from {} scanned keys ({}); copy counts {}; {:.1} s at up to {} copy reads/s.\n",
            self.target,
            self.primaries,
            self.replicas,
            figures.keys,
            self.prefix
                .as_deref()
                .map(|prefix| format!(" with prefix `{prefix}`"))
                .unwrap_or_default(),
            self.scanned_keys,
            if self.scan_complete {
                "scan complete"
            } else {
                "scan stopped at the sample size"
            },
            match self.copy_counts {
                "config" => "from the config's families",
                "fixed" => "from --copies",
                _ => "inferred (highest index seen + 1)",
            },
            self.elapsed_ms as f64 / 1000.0,
            self.rate,
        );
        role_table(&mut out, figures);
        let _ = writeln!(
            out,
            "\nSkew is in versions: a key's newest version minus its oldest present copy read in that role. Replica reads include replication lag at the moment of the read; a primary copy behind missed a write (it heals on the next publish, retry or read repair).\n"
        );
        let _ = writeln!(
            out,
            "Keys: {} inconsistent, {} vanished (no copy left when read), {} unsplit skipped; {} stray copies beyond N.",
            figures.inconsistent_keys, figures.vanished_keys, self.unsplit_keys, self.stray_copies
        );
        for unreachable in &self.unreachable_replicas {
            let _ = writeln!(
                out,
                "Unreachable replica {}: {}.",
                unreachable.node, unreachable.error
            );
        }
        if figures.worst_keys.is_empty() {
            let _ = writeln!(
                out,
                "\nEvery copy read agrees with its key's newest version."
            );
            return out;
        }
        let _ = writeln!(
            out,
            "\n## Worst keys\n\n| key | N | newest | skew | copies behind or disagreeing |\n|---|---:|---:|---:|---|"
        );
        for key in &figures.worst_keys {
            let lagging: Vec<String> = key.lagging.iter().map(describe).collect();
            let _ = writeln!(
                out,
                "| `{}` | {} | {}{} | {} | {} |",
                key.key,
                key.copies,
                key.newest,
                if key.newest_tombstone {
                    " (tombstone)"
                } else {
                    ""
                },
                key.skew,
                lagging.join("; ")
            );
        }
        if figures.inconsistent_keys > figures.worst_keys.len() {
            let _ = writeln!(
                out,
                "\n… and {} more inconsistent keys.",
                figures.inconsistent_keys - figures.worst_keys.len()
            );
        }
        out
    }
}

/// The table of one row per role: reads, failures, copies behind and the skew.
fn role_table(out: &mut String, figures: &Figures) {
    let _ = writeln!(
        *out,
        "| reads on | copy reads | failed | behind | of which missing | share behind | inconsistent per million | skew p50 | skew p99 | skew max | keys |"
    );
    let _ = writeln!(
        *out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for role in ReadRole::ALL {
        let RoleFigures {
            copy_reads,
            failed_reads,
            copies_behind,
            missing_copies,
            share_behind,
            inconsistency_per_million,
            skew,
            ..
        } = figures.role(role);
        let _ = writeln!(
            out,
            "| {} | {copy_reads} | {failed_reads} | {copies_behind} | {missing_copies} | {:.4}% | {inconsistency_per_million:.1} | {} | {} | {} | {} |",
            role.as_str(),
            share_behind * 100.0,
            skew.p50,
            skew.p99,
            skew.max,
            skew.keys,
        );
    }
}

/// `#2 on 10.0.0.1:7000 (primary): 41`, `… missing`, `… 42 value (newest is a tombstone)`.
fn describe(copy: &LaggingCopy) -> String {
    let state = match (copy.version, copy.behind) {
        (None, _) => "missing".to_owned(),
        (Some(version), true) => format!(
            "{version}{}",
            if copy.tombstone { " (tombstone)" } else { "" }
        ),
        (Some(version), false) => format!(
            "{version} {} where the newest is {}",
            if copy.tombstone { "tombstone" } else { "value" },
            if copy.tombstone {
                "a value"
            } else {
                "a tombstone"
            }
        ),
    };
    format!(
        "#{} on {} ({}): {state}",
        copy.copy,
        copy.node,
        copy.role.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::figures::{compute, CopyObservation, CopyState, KeySample};
    use crate::key::Version;
    use crate::store::{CopyStamp, NodeLabel};

    fn report(samples: &[KeySample]) -> Report {
        Report {
            target: "redis-cluster://127.0.0.1:30001".to_owned(),
            cluster: true,
            primaries: 3,
            replicas: 3,
            unreachable_replicas: Vec::new(),
            prefix: Some("post:".to_owned()),
            copy_counts: "fixed",
            scanned_keys: 8,
            scan_complete: true,
            unsplit_keys: 0,
            stray_copies: 0,
            rate: 2000,
            elapsed_ms: 12,
            figures: compute(samples),
        }
    }

    fn read(copy: u32, node: &str, role: ReadRole, version: u64) -> CopyObservation {
        CopyObservation {
            copy,
            node: NodeLabel::new(node),
            role,
            state: CopyState::Present(CopyStamp {
                version: Version::new(version).unwrap(),
                tombstone: false,
            }),
        }
    }

    #[test]
    fn markdown_and_json_name_the_copy_behind() {
        let sample = KeySample {
            key: "post:9".to_owned(),
            copies: 2,
            reads: vec![
                read(0, "n1:1", ReadRole::Primary, 9),
                read(0, "n4:1", ReadRole::Replica, 9),
                read(1, "n2:1", ReadRole::Primary, 6),
                read(1, "n5:1", ReadRole::Replica, 6),
            ],
        };
        let report = report(&[sample]);
        let markdown = report.markdown();
        assert!(
            markdown.contains("| primary | 2 | 0 | 1 | 0 | 50.0000% | 500000.0 | 3 | 3 | 3 | 1 |"),
            "{markdown}"
        );
        assert!(
            markdown.contains(
                "| `post:9` | 2 | 9 | 3 | #1 on n2:1 (primary): 6; #1 on n5:1 (replica): 6 |"
            ),
            "{markdown}"
        );
        assert!(report.primaries_disagree());

        let json: serde_json::Value = serde_json::from_str(&report.json_pretty()).unwrap();
        assert_eq!(json["primary"]["copies_behind"], 1);
        assert_eq!(json["replica"]["skew"]["max"], 3);
        assert_eq!(json["worst_keys"][0]["lagging"][1]["role"], "replica");
        assert_eq!(json["keys"], 1);
        assert!(!report.json_line().contains('\n'));
    }

    #[test]
    fn a_consistent_report_says_so() {
        let sample = KeySample {
            key: "post:1".to_owned(),
            copies: 1,
            reads: vec![read(0, "n1:1", ReadRole::Primary, 2)],
        };
        let report = report(&[sample]);
        assert!(!report.primaries_disagree());
        assert!(report
            .markdown()
            .contains("Every copy read agrees with its key's newest version."));
    }
}
