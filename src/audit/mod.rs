//! `hotsplit audit`: how far apart are the copies of live keys? Measured read-only.
//!
//! In the spirit of Meta's Polaris and Uber's Cache Inspector, an audit samples keys of split
//! families (and, with a config, split keys: their split records say how many copies they have)
//! on a live deployment and reads every copy of each, on the primary that owns it and
//! on each of that primary's replicas, then reports version skew between copies, the share of
//! copies behind and inconsistency per million copy reads, separately for primary and replica
//! reads (replica lag is expected; a primary copy behind missed a write), with the worst keys.
//! `--watch` repeats it and exports the figures as Prometheus metrics.
//!
//! # Layout
//! - [`figures`]: the definitions and their computation, pure functions over hand-made inputs.
//! - `sample`: the I/O: SCAN every primary, choose the sample, read every copy everywhere at a
//!   bounded rate.
//! - [`report`]: the [`report::Report`], as markdown tables or JSON.
//! - [`metrics`]: the Prometheus metrics of `--watch` and their `/metrics` router.
//!
//! # Safe to point at production
//! An audit only reads. Every Redis command goes through
//! [`store::redis`](crate::store::redis) (`ReadOnlyNodes`), which sends `INFO`, `CLUSTER NODES`,
//! `SCAN`, `HMGET` (`ver` and `tomb` only, never the value), `HGETALL` of the split records of
//! a config's families with a `split` table, and `READONLY` on Cluster replicas; fred's connection handshake adds `PING`, `CLIENT ID`, `INFO server` and `ROLE`. It never
//! writes and never loads the function library. Copy reads are paced (`rate`), at most
//! 16 keys are in flight, one SCAN page per primary is in flight, and
//! every command has a timeout. The integration test compares `INFO commandstats` and
//! `rdb_changes_since_last_save` on every node before and after an audit.

pub mod figures;
pub mod metrics;
pub mod report;
mod sample;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{Error, ErrorKind, Result};
use crate::family::{Families, MAX_COPIES};
use crate::key::Key;
use crate::store::redis::{ReadOnlyNodes, RedisOptions, RedisSecurity, RedisTarget};
use report::{Report, UnreachableNode};

/// How many keys an audit samples by default.
pub const DEFAULT_SAMPLE: usize = 1000;

/// The default pace, in copy reads per second (each node read of one copy is one read).
pub const DEFAULT_RATE: u32 = 2000;

/// The default `COUNT` of each SCAN page.
pub const DEFAULT_SCAN_COUNT: u32 = 1000;

/// How long `--watch` waits for its metrics server to stop after a signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How the copy count N of a sampled key is chosen.
#[derive(Debug, Clone)]
pub enum CopyCount {
    /// From the families of a config file (longest prefix, else the default family).
    Config(Families),
    /// The same N for every key (`--copies`).
    Fixed(u32),
    /// The highest copy index the scan saw, plus one.
    Inferred,
}

impl CopyCount {
    /// `config`, `fixed` or `inferred`, as the report says.
    pub fn as_str(&self) -> &'static str {
        match self {
            CopyCount::Config(_) => "config",
            CopyCount::Fixed(_) => "fixed",
            CopyCount::Inferred => "inferred",
        }
    }
}

/// What to audit and how gently.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// The deployment: a standalone primary (its replicas are found with `INFO replication`) or
    /// cluster seed nodes (every node is found with `CLUSTER NODES`). Required.
    pub target: RedisTarget,
    /// TLS and credentials of every connection. Default: plain TCP, the `default` user.
    pub security: RedisSecurity,
    /// Only keys starting with this prefix. Default: none (every copy key, `*#*`).
    pub prefix: Option<String>,
    /// How N is chosen per key. Default: [`CopyCount::Inferred`].
    pub copies: CopyCount,
    /// The most keys to sample. Default: [`DEFAULT_SAMPLE`].
    pub sample: usize,
    /// The `COUNT` of each SCAN page. Default: [`DEFAULT_SCAN_COUNT`].
    pub scan_count: u32,
    /// Copy reads per second, all nodes together. Default: [`DEFAULT_RATE`].
    pub rate: u32,
    /// How long one command may take. Default: 500 ms.
    pub command_timeout: Duration,
    /// How long connecting to one node may take. Default: 2 s.
    pub connect_timeout: Duration,
}

impl AuditOptions {
    /// Options for `target` with every other field at its default.
    pub fn new(target: RedisTarget) -> AuditOptions {
        AuditOptions {
            target,
            security: RedisSecurity::default(),
            prefix: None,
            copies: CopyCount::Inferred,
            sample: DEFAULT_SAMPLE,
            scan_count: DEFAULT_SCAN_COUNT,
            rate: DEFAULT_RATE,
            command_timeout: RedisOptions::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: RedisOptions::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the flag: a prefix that is not a valid key prefix, a fixed
    /// copy count outside 2..=1024, or a zero sample, scan count, rate or timeout.
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: String| Err(Error::new(ErrorKind::Config, why));
        if let Some(prefix) = &self.prefix {
            if let Err(err) = Key::parse(prefix) {
                return invalid(format!("--prefix: not a valid key prefix: {err}"));
            }
        }
        if let CopyCount::Fixed(copies) = self.copies {
            if !(2..=MAX_COPIES).contains(&copies) {
                return invalid(format!(
                    "--copies: must be in 2..={MAX_COPIES} (a key with one copy has nothing to compare), got {copies}"
                ));
            }
        }
        if self.sample == 0 {
            return invalid("--sample: must be positive".to_owned());
        }
        if self.scan_count == 0 {
            return invalid("--scan-count: must be positive".to_owned());
        }
        if self.rate == 0 {
            return invalid("--rate: must be positive".to_owned());
        }
        if self.command_timeout.is_zero() || self.connect_timeout.is_zero() {
            return invalid("--timeout and --connect-timeout: must be positive".to_owned());
        }
        Ok(())
    }

    /// The options of the read-only connections.
    fn redis_options(&self) -> RedisOptions {
        let mut options = RedisOptions::new(self.target.clone());
        options.command_timeout = self.command_timeout;
        options.connect_timeout = self.connect_timeout;
        options.security = self.security.clone();
        options
    }
}

/// Which part of a round is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Scanning primaries for copy keys.
    Scan,
    /// Reading the sampled keys' copies.
    Read,
}

/// How far a round has come, reported at most once a second and at the end of each phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The phase.
    pub phase: Phase,
    /// Time since the round started.
    pub elapsed: Duration,
    /// Keys SCAN returned so far (scan phase).
    pub scanned_keys: u64,
    /// Keys sampled so far (scan phase) or in the sample (read phase).
    pub sampled_keys: usize,
    /// Keys whose copies were read (read phase).
    pub read_keys: usize,
    /// Copy reads made (read phase).
    pub copy_reads: u64,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let elapsed = self.elapsed.as_secs_f64();
        match self.phase {
            Phase::Scan => write!(
                f,
                "[{elapsed:>6.1}s] scan: {} keys scanned, {} split keys sampled",
                self.scanned_keys, self.sampled_keys
            ),
            Phase::Read => write!(
                f,
                "[{elapsed:>6.1}s] read: {}/{} keys, {} copy reads",
                self.read_keys, self.sampled_keys, self.copy_reads
            ),
        }
    }
}

/// Runs one audit: discovers the nodes, samples keys, reads their copies everywhere and
/// computes the figures. Progress goes to `progress`.
///
/// # Errors
/// [`ErrorKind::Config`] for invalid options or a `redis://` URL that names a replica;
/// [`ErrorKind::Unavailable`] or [`ErrorKind::Timeout`] when no seed answers, a primary cannot
/// be connected or scanned, or every copy read on the primaries failed. Failed reads of some
/// copies, or of an unreachable replica, are no error: the report counts them.
pub async fn audit(options: &AuditOptions, progress: &mut impl FnMut(&Progress)) -> Result<Report> {
    options.validate()?;
    let started = Instant::now();
    let nodes = ReadOnlyNodes::connect(&options.redis_options()).await?;
    let sampled = sample::sample_keys(&nodes, options, started, progress).await?;
    let samples = sample::read_keys(&nodes, &sampled.keys, options, started, progress).await;
    sample::check_primaries_answered(&samples)?;
    let figures = figures::compute(&samples);
    let shards = nodes.shards();
    Ok(Report {
        target: options.redis_options().url(),
        cluster: nodes.is_cluster(),
        primaries: shards.len(),
        replicas: shards.iter().map(|shard| shard.replicas.len()).sum(),
        unreachable_replicas: nodes
            .unreachable()
            .iter()
            .map(|(node, err)| UnreachableNode {
                node: node.to_string(),
                error: err.message().to_owned(),
            })
            .collect(),
        prefix: options.prefix.clone(),
        copy_counts: options.copies.as_str(),
        scanned_keys: sampled.scanned,
        scan_complete: sampled.complete,
        unsplit_keys: sampled.unsplit_keys,
        stray_copies: sampled.stray_copies,
        rate: options.rate,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        figures,
    })
}

/// Runs an audit every `interval` (start to start; a round that overruns is followed at
/// once) until `shutdown` resolves, serving the last round's figures as Prometheus metrics at
/// `/metrics` on `listener`. Each round's outcome goes to `on_round`; a failed round is counted
/// and the next one runs as planned.
///
/// Shutdown: the signal interrupts a running round or the wait, the metrics server is told to
/// stop, and it gets 5 s to finish.
///
/// # Errors
/// [`ErrorKind::Config`] for invalid options, before anything is served.
pub async fn watch(
    (options, interval): (&AuditOptions, Duration),
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    mut on_round: impl FnMut(std::result::Result<&Report, &Error>),
    progress: &mut impl FnMut(&Progress),
) -> Result<()> {
    options.validate()?;
    let audit_metrics = Arc::new(metrics::AuditMetrics::new());
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let app = metrics::router(Arc::clone(&audit_metrics));
    let stop_serving = cancel.clone();
    tracker.spawn(async move {
        if let Err(err) = axum::serve(listener, app)
            .with_graceful_shutdown(stop_serving.cancelled_owned())
            .await
        {
            tracing::error!(error = %err, "the metrics server failed");
        }
    });
    tracker.close();

    tokio::pin!(shutdown);
    loop {
        let round_started = tokio::time::Instant::now();
        tokio::select! {
            () = &mut shutdown => break,
            result = audit(options, progress) => match result {
                Ok(report) => {
                    audit_metrics.record(&report);
                    on_round(Ok(&report));
                }
                Err(err) => {
                    audit_metrics.round_failed();
                    on_round(Err(&err));
                }
            },
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(round_started + interval) => {}
        }
    }
    cancel.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "the metrics server did not stop within the grace period");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_naming_the_flag() {
        let target = RedisTarget::Standalone("127.0.0.1:1".to_owned());
        AuditOptions::new(target.clone()).validate().unwrap();
        type Change = fn(&mut AuditOptions);
        let cases: [(Change, &str); 6] = [
            (|o| o.prefix = Some("a#".to_owned()), "--prefix"),
            (|o| o.copies = CopyCount::Fixed(1), "--copies"),
            (|o| o.copies = CopyCount::Fixed(1025), "--copies"),
            (|o| o.sample = 0, "--sample"),
            (|o| o.rate = 0, "--rate"),
            (|o| o.scan_count = 0, "--scan-count"),
        ];
        for (change, flag) in cases {
            let mut options = AuditOptions::new(target.clone());
            change(&mut options);
            let err = options.validate().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.message().contains(flag), "{err}");
        }
    }

    #[test]
    fn progress_lines_say_the_phase() {
        let progress = Progress {
            phase: Phase::Read,
            elapsed: Duration::from_millis(1500),
            scanned_keys: 0,
            sampled_keys: 10,
            read_keys: 4,
            copy_reads: 64,
        };
        assert_eq!(
            progress.to_string(),
            "[   1.5s] read: 4/10 keys, 64 copy reads"
        );
    }
}
