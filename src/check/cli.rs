//! `hotsplit check`'s command line: its flags ([`CheckArgs`]), the run they ask for
//! ([`CheckArgs::options`], [`CheckArgs::fleet_options`]), and how a finished run is printed
//! and turned into the exit status ([`finish`], [`finish_fleet`]). `main.rs` keeps the runtime
//! and the signal handling.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hotsplit_devcluster::TlsFiles;

use super::fleet::{FleetOptions, FleetReport};
use super::partition::{PartitionOptions, PartitionReport};
use super::report::{CheckReport, Mode};
use super::run::CheckOptions;

/// The help text on the API token, which has no flag (a flag would show in `ps`).
const TOKEN_HELP: &str = "Environment:\n  HOTSPLIT_TOKEN  the API bearer token (when --token-file is not given; never printed)";

#[derive(Debug, clap::Args)]
#[command(after_help = TOKEN_HELP)]
pub struct CheckArgs {
    /// The faults the run injects. `process` (the default): the seeded process faults on a
    /// loopback cluster (replica pauses, CLIENT PAUSE, SIGSTOP, restarts, a failover).
    /// `partition`: real network partitions (nftables cuts between network namespaces, which
    /// needs root) on a 3-master/3-replica cluster with two instances, one row per scenario:
    /// an instance cut from one master, a master cut from its replica, the split brain under
    /// `sync_replicas = 1` and without it, an instance cut from the registry master, flapping
    /// cuts; --duration sets each cut to about a sixth of it (at least 1.5 s), --seed picks the
    /// instance, master, key, cut lengths and interleaving, --out gets partition.md,
    /// partition.json and each scenario's history (partition-<n>.jsonl). --keys, --readers, --copies and --token-file do not apply to it.
    #[arg(long, value_enum, default_value_t = Nemesis::Process)]
    pub(crate) nemesis: Nemesis,
    /// Total duration of the workload phases (modes and presence), e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) duration: std::time::Duration,
    /// Seed of the fault schedule and the readers' choices.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The modes to run, comma-separated or repeated: random-suffix, affine, floor, delete,
    /// resp, client-cache. Without it: every mode but client-cache, then the presence
    /// experiment; with it, only the modes named (affine, floor and resp also against the
    /// near-cache service), no presence, and --duration is shared by those phases alone.
    /// client-cache: readers with a client-side cache by redis-py's rules (RESP3, CLIENT
    /// TRACKING ON, plain GET) on one instance's door while writers publish through the other
    /// and through it, under the process faults and two cuts of the invalidation feed; judged
    /// from the acknowledged publishes (no reader going back, no cached answer older than the
    /// lease plus the feed's delivery bound plus a slack).
    #[arg(long = "mode", value_enum, value_delimiter = ',')]
    pub(crate) modes: Vec<Mode>,
    /// Hot keys per mode.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) keys: u32,
    /// Reader sessions per mode.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) readers: u32,
    /// Copies per hot key.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) copies: u32,
    /// Write report.md, summary.json and the histories (JSON lines) here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// A file holding the bearer token the run's service asks for and every request sends.
    /// Default: HOTSPLIT_TOKEN, else a random token.
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// 2: run the fleet experiment instead: two instances, each session round-robin over
    /// both, without and with the session token, and the convergence after the instance
    /// holding queued heals is SIGKILLed and its spool deleted. --duration is its four
    /// workload rows together; --out gets fleet.md and fleet.json.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub(crate) instances: u32,
    /// Run over TLS end to end: PEM file of the CA that signs --tls-cert-file. The cluster's
    /// nodes then serve clients, replication and the cluster bus over TLS only and require a
    /// client certificate; hotsplit and the run's own connections present --tls-cert-file and
    /// verify every node against this CA and the name 127.0.0.1. Default: plain TCP.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert_file", "tls_key_file"])]
    pub(crate) tls_ca_file: Option<PathBuf>,
    /// PEM certificate (chain) every node serves and every client presents: signed by
    /// --tls-ca-file, with the IP address 127.0.0.1 among its subject alternative names, and
    /// usable for both server and client authentication.
    #[arg(long, value_name = "FILE", requires = "tls_ca_file")]
    pub(crate) tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_ca_file")]
    pub(crate) tls_key_file: Option<PathBuf>,
    /// The log filter of the run's in-process services, on stderr (e.g. warn, or
    /// warn,hotsplit=debug). Default: none, their log lines are not shown.
    #[arg(
        long = "log",
        value_name = "FILTER",
        env = "HOTSPLIT_LOG",
        hide_env_values = true
    )]
    pub(crate) log: Option<String>,
}

/// What `--nemesis` injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Nemesis {
    /// Process faults on a loopback cluster (the default).
    Process,
    /// Network partitions between network namespaces (needs root).
    Partition,
}

impl CheckArgs {
    /// The one-instance run these flags ask for.
    ///
    /// # Errors
    /// A message naming the flag when a TLS file cannot be found or the token file cannot be
    /// read.
    pub(crate) fn options(&self) -> Result<CheckOptions, String> {
        Ok(CheckOptions {
            duration: self.duration,
            seed: self.seed,
            keys: self.keys,
            readers: self.readers,
            modes: self.modes.clone(),
            copies: self.copies,
            out: self.out.clone(),
            token: token_from(self.token_file.as_deref())?,
            tls: self.tls()?,
        })
    }

    /// The `--instances 2` run these flags ask for.
    ///
    /// # Errors
    /// A message naming the flag when a TLS file cannot be found.
    pub(crate) fn fleet_options(&self) -> Result<FleetOptions, String> {
        if !self.modes.is_empty() {
            return Err("--instances 2 runs rows of its own; drop --mode".to_owned());
        }
        Ok(FleetOptions {
            duration: self.duration,
            seed: self.seed,
            keys: self.keys,
            readers: self.readers,
            copies: self.copies,
            tls: self.tls()?,
        })
    }

    /// The `--nemesis partition` run these flags ask for.
    ///
    /// # Errors
    /// A message naming the flag that does not apply to it: `--instances 2` (it runs its own
    /// two instances) or the TLS files (its nodes speak plain TCP in their namespaces).
    pub(crate) fn partition_options(&self) -> Result<PartitionOptions, String> {
        if self.instances != 1 {
            return Err(
                "--nemesis partition runs two instances of its own; drop --instances".to_owned(),
            );
        }
        if !self.modes.is_empty() {
            return Err("--nemesis partition runs scenarios of its own; drop --mode".to_owned());
        }
        if self.tls_ca_file.is_some() {
            return Err("--nemesis partition runs without TLS; drop --tls-ca-file, --tls-cert-file and --tls-key-file".to_owned());
        }
        Ok(PartitionOptions {
            duration: self.duration,
            seed: self.seed,
        })
    }

    /// The TLS files of `--tls-ca-file`, `--tls-cert-file` and `--tls-key-file` (clap requires
    /// all three together), as absolute paths (the servers run in directories of their own);
    /// `None` without them.
    ///
    /// # Errors
    /// A message naming the flag when a file cannot be found.
    fn tls(&self) -> Result<Option<TlsFiles>, String> {
        let (Some(ca_file), Some(cert_file), Some(key_file)) =
            (&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file)
        else {
            return Ok(None);
        };
        let absolute = |flag: &str, path: &PathBuf| {
            std::fs::canonicalize(path).map_err(|err| format!("{flag} {}: {err}", path.display()))
        };
        Ok(Some(TlsFiles {
            ca_file: absolute("--tls-ca-file", ca_file)?,
            cert_file: absolute("--tls-cert-file", cert_file)?,
            key_file: absolute("--tls-key-file", key_file)?,
        }))
    }
}

/// Prints a one-instance run's tables and verdict; exit 0 when it passes, 1 when a claim
/// failed, 2 when the run could not be made.
pub(crate) fn finish(result: hotsplit::Result<CheckReport>) -> ExitCode {
    match result {
        Ok(report) => {
            println!("{}", report.markdown());
            let failures = report.failures();
            if failures.is_empty() {
                println!("PASS: no monotonic-read violation outside loss windows in the modes that claim monotonic reads (none at all in floor mode), no read-your-writes violation, no wrong decides-on-presence decision.");
                if report.modes.iter().any(|mode| mode.client_cache.is_some()) {
                    println!("PASS (client-cache): cache hits and feed flushes seen, no reader went back outside loss windows, no cached answer older than the lease plus the feed's delivery bound plus the slack.");
                }
                ExitCode::SUCCESS
            } else {
                for failure in failures {
                    println!("FAIL: {failure}");
                }
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            ExitCode::from(2)
        }
    }
}

/// Prints a fleet run's tables (and writes `fleet.md` and `fleet.json` under `out`); exit 0
/// when it passes, 1 otherwise.
pub(crate) fn finish_fleet(result: hotsplit::Result<FleetReport>, out: Option<&Path>) -> ExitCode {
    match result {
        Ok(report) => {
            println!("{}", report.markdown());
            if let Some(dir) = out {
                let json = serde_json::to_vec_pretty(&report).unwrap_or_default();
                let written = std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(dir.join("fleet.md"), report.markdown()))
                    .and_then(|()| std::fs::write(dir.join("fleet.json"), json));
                if let Err(err) = written {
                    eprintln!("hotsplit check: cannot write {}: {err}", dir.display());
                }
            }
            let failures = report.failures();
            for failure in &failures {
                println!("FAIL: {failure}");
            }
            if failures.is_empty() {
                println!("PASS: no accepted edit lost in any row, no monotonic-read or read-your-writes violation with the session token, the split and merge happened, and the scrub levelled every copy after the spool was lost.");
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a partition run's table and verdict (and writes `partition.md` and `partition.json`
/// under `out`); exit 0 when it passes, 1 when a claim failed, 2 when the run could not be made
/// (namespaces refused, say).
pub(crate) fn finish_partition(
    result: hotsplit::Result<PartitionReport>,
    out: Option<&Path>,
) -> ExitCode {
    let report = match result {
        Ok(report) => report,
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    };
    println!("{}", report.markdown());
    if let Some(dir) = out {
        let json = serde_json::to_vec_pretty(&report).unwrap_or_default();
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(dir.join("partition.md"), report.markdown()))
            .and_then(|()| std::fs::write(dir.join("partition.json"), json))
            .map_err(|err| err.to_string())
            .and_then(|()| write_partition_histories(dir, &report));
        if let Err(err) = written {
            eprintln!("hotsplit check: cannot write {}: {err}", dir.display());
            return ExitCode::from(2);
        }
    }
    let failures = report.failures();
    if failures.is_empty() {
        println!("PASS: no monotonic-read and no read-your-writes violation in any partition scenario, no acknowledged publish lost under the rule or where nothing failed over, every copy converged after every heal (the losses without the rule are shown, not judged).");
        return ExitCode::SUCCESS;
    }
    for failure in failures {
        println!("FAIL: {failure}");
    }
    ExitCode::FAILURE
}

/// Writes each scenario's history as `partition-<n>.jsonl` (`n` from 1, in the table's
/// order) under `dir`.
fn write_partition_histories(dir: &Path, report: &PartitionReport) -> Result<(), String> {
    for (index, row) in report.rows.iter().enumerate() {
        let path = dir.join(format!("partition-{}.jsonl", index + 1));
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|err| format!("{}: {err}", path.display()))?,
        );
        super::history::write_jsonl(&mut file, &row.history)
            .and_then(|()| std::io::Write::flush(&mut file).map_err(Into::into))
            .map_err(|err| format!("{}: {err}", path.display()))?;
    }
    Ok(())
}

/// The API token from `file` (its content, one trailing newline dropped), else from
/// `HOTSPLIT_TOKEN` if set and not empty.
///
/// # Errors
/// `--token-file` when the file cannot be read or is empty (the message never holds the token).
fn token_from(file: Option<&std::path::Path>) -> Result<Option<String>, String> {
    let Some(file) = file else {
        return Ok(std::env::var("HOTSPLIT_TOKEN")
            .ok()
            .filter(|token| !token.is_empty()));
    };
    let text = std::fs::read_to_string(file)
        .map_err(|err| format!("--token-file: cannot read {}: {err}", file.display()))?;
    let token = text.strip_suffix('\n').unwrap_or(&text);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.is_empty() {
        return Err(format!("--token-file: {} is empty", file.display()));
    }
    Ok(Some(token.to_owned()))
}
