//! `hotsplit audit`: read-only measurement of the skew between live copies, once or every
//! `--watch` interval with metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use hotsplit::config::Config;

use super::common::{
    init_tracing, redis_password_from_env, runtime, shutdown_signal, LogArgs, LogStream,
    PASSWORD_HELP,
};

#[derive(Debug, clap::Args)]
#[command(after_help = PASSWORD_HELP)]
pub(crate) struct AuditArgs {
    /// redis://host:port (a standalone primary; its replicas are found with INFO replication)
    /// or redis-cluster://host:port[,host:port] (seed nodes); rediss:// and rediss-cluster://
    /// for TLS; valkey[s]:// synonyms. Default: store.redis of --config.
    #[arg(long, env = "HOTSPLIT_REDIS", hide_env_values = true)]
    pub(crate) redis: Option<String>,
    /// PEM file of the CAs that sign the servers' certificates (rediss URLs). Default:
    /// store.tls_ca_file of --config, else the system's roots.
    #[arg(long)]
    pub(crate) tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS. Default: store.tls_cert_file of --config.
    #[arg(long, requires = "tls_key_file")]
    pub(crate) tls_cert_file: Option<PathBuf>,
    /// PEM key of --tls-cert-file. Default: store.tls_key_file of --config.
    #[arg(long, requires = "tls_cert_file")]
    pub(crate) tls_key_file: Option<PathBuf>,
    /// The ACL user (see README, the read-only audit user). Default: store.username of
    /// --config, else the user of the URL or `default`.
    #[arg(long)]
    pub(crate) username: Option<String>,
    /// A file holding the password. Default: store.password_file of --config.
    #[arg(long)]
    pub(crate) password_file: Option<PathBuf>,
    /// A hotsplit TOML config: copy counts come from its families (and --redis from store.redis).
    #[arg(
        long,
        env = "HOTSPLIT_CONFIG",
        hide_env_values = true,
        conflicts_with = "copies"
    )]
    pub(crate) config: Option<PathBuf>,
    /// The copy count of every sampled key. Without it or --config, N is the highest copy index
    /// seen + 1.
    #[arg(long)]
    pub(crate) copies: Option<u32>,
    /// Audit only keys that start with this prefix (a family prefix, e.g. post:).
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// The most keys to sample.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_SAMPLE)]
    pub(crate) sample: usize,
    /// Copy reads per second, every node together.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_RATE)]
    pub(crate) rate: u32,
    /// The COUNT of each SCAN page.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_SCAN_COUNT)]
    pub(crate) scan_count: u32,
    /// How long one Redis command may take.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub(crate) timeout: std::time::Duration,
    /// How long connecting to one node may take.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: std::time::Duration,
    /// Print the report as JSON instead of markdown (one line per round with --watch).
    #[arg(long)]
    pub(crate) json: bool,
    /// Exit with status 3 when a copy read on a primary is behind or disagrees (replica lag
    /// alone does not count).
    #[arg(long, conflicts_with = "watch")]
    pub(crate) fail_on_behind: bool,
    /// Repeat the audit every INTERVAL (e.g. 30s) and serve the figures at --metrics-addr.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) watch: Option<std::time::Duration>,
    /// Where --watch serves Prometheus metrics (/metrics).
    #[arg(long, default_value = "127.0.0.1:9464", requires = "watch")]
    pub(crate) metrics_addr: SocketAddr,
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// Exit status of an audit that found a primary copy behind, with `--fail-on-behind`.
pub(crate) const EXIT_BEHIND: u8 = 3;

/// Exit status of an audit stopped by ctrl-c or SIGTERM before it finished (one-shot mode).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

pub(crate) fn audit(args: AuditArgs) -> ExitCode {
    if let Err(err) = init_tracing(
        args.log.filter.as_deref(),
        "warn",
        args.log.log_format.unwrap_or_default(),
        LogStream::Stderr,
    ) {
        eprintln!("hotsplit audit: {err}");
        return ExitCode::from(2);
    }
    let options = match audit_options(&args) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("hotsplit audit: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime(0) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match args.watch {
        Some(interval) => audit_watch(&runtime, &options, &args, interval),
        None => audit_once(&runtime, &options, &args),
    }
}

/// One audit round, printed to stdout; progress on stderr.
pub(crate) fn audit_once(
    runtime: &tokio::runtime::Runtime,
    options: &hotsplit::audit::AuditOptions,
    args: &AuditArgs,
) -> ExitCode {
    let mut progress = |progress: &hotsplit::audit::Progress| eprintln!("{progress}");
    let result = runtime.block_on(async {
        tokio::select! {
            () = shutdown_signal() => None,
            result = hotsplit::audit::audit(options, &mut progress) => Some(result),
        }
    });
    match result {
        None => {
            eprintln!("hotsplit audit: interrupted");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Some(Ok(report)) => {
            if args.json {
                println!("{}", report.json_pretty());
            } else {
                print!("{}", report.markdown());
            }
            if args.fail_on_behind && report.primaries_disagree() {
                eprintln!(
                    "hotsplit audit: {} copy reads on primaries disagree with their key's newest version",
                    report.figures.primary.inconsistent_reads
                );
                return ExitCode::from(EXIT_BEHIND);
            }
            ExitCode::SUCCESS
        }
        Some(Err(err)) => {
            eprintln!("hotsplit audit: {err}");
            audit_exit_code(&err)
        }
    }
}

/// Audit rounds every `interval` until ctrl-c or SIGTERM, with metrics at `--metrics-addr`;
/// each round's report goes to stdout, a summary line to stderr.
pub(crate) fn audit_watch(
    runtime: &tokio::runtime::Runtime,
    options: &hotsplit::audit::AuditOptions,
    args: &AuditArgs,
    interval: std::time::Duration,
) -> ExitCode {
    let mut progress = |progress: &hotsplit::audit::Progress| eprintln!("{progress}");
    let mut round = 0u64;
    let on_round = |result: Result<&hotsplit::audit::report::Report, &hotsplit::Error>| {
        round += 1;
        match result {
            Ok(report) => {
                let figures = &report.figures;
                eprintln!(
                    "hotsplit audit: round {round}: {} keys, behind on primaries {} / replicas {}, max skew {} / {}, {:.1} s",
                    figures.keys,
                    figures.primary.copies_behind,
                    figures.replica.copies_behind,
                    figures.primary.skew.max,
                    figures.replica.skew.max,
                    report.elapsed_ms as f64 / 1000.0
                );
                if args.json {
                    println!("{}", report.json_line());
                } else {
                    println!("{}", report.markdown());
                }
            }
            Err(err) => eprintln!("hotsplit audit: round {round} failed: {err}"),
        }
    };
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.metrics_addr)
            .await
            .map_err(|err| {
                hotsplit::Error::new(
                    hotsplit::ErrorKind::Io,
                    format!("cannot listen on {}: {err}", args.metrics_addr),
                )
            })?;
        if let Ok(address) = listener.local_addr() {
            eprintln!(
                "hotsplit audit: metrics at http://{address}/metrics, a round every {}",
                humantime::format_duration(interval)
            );
        }
        hotsplit::audit::watch(
            (options, interval),
            listener,
            shutdown_signal(),
            on_round,
            &mut progress,
        )
        .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hotsplit audit: {err}");
            audit_exit_code(&err)
        }
    }
}

/// 2 for a usage or config error, 1 for anything else (Redis could not be reached or read).
pub(crate) fn audit_exit_code(err: &hotsplit::Error) -> ExitCode {
    match err.kind() {
        hotsplit::ErrorKind::Config => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

/// The audit's options from its flags and the optional config file, validated.
pub(crate) fn audit_options(args: &AuditArgs) -> hotsplit::Result<hotsplit::audit::AuditOptions> {
    use hotsplit::audit::{AuditOptions, CopyCount};
    let config = match &args.config {
        Some(path) => {
            let config = Config::from_file(path)?;
            config.validate()?;
            Some(config)
        }
        None => None,
    };
    // The store section of --config (or an empty one), with the flags over it: one place
    // turns URLs, TLS files and credentials into connection options, for serve and audit.
    let mut store = config
        .as_ref()
        .map(|config| config.store.clone())
        .unwrap_or_default();
    if let Some(url) = &args.redis {
        store.redis = Some(url.clone());
    }
    if store.redis.is_none() {
        return Err(hotsplit::Error::new(
            hotsplit::ErrorKind::Config,
            "--redis: required (or store.redis in --config)",
        ));
    }
    store.replicas.clear();
    let flags = [
        (&args.tls_ca_file, &mut store.tls_ca_file),
        (&args.tls_cert_file, &mut store.tls_cert_file),
        (&args.tls_key_file, &mut store.tls_key_file),
        (&args.password_file, &mut store.password_file),
    ];
    for (flag, field) in flags {
        if flag.is_some() {
            field.clone_from(flag);
        }
    }
    if args.username.is_some() {
        store.username.clone_from(&args.username);
    }
    store.password = redis_password_from_env();
    store.validate().map_err(|err| {
        hotsplit::Error::new(
            hotsplit::ErrorKind::Config,
            format!("--redis and the tls/credential flags: {err}"),
        )
    })?;
    let redis = store
        .redis_options()?
        .ok_or_else(|| hotsplit::Error::new(hotsplit::ErrorKind::Config, "--redis: required"))?;
    let target = redis.target.clone();
    let mut options = AuditOptions::new(target);
    options.security = redis.security;
    options.copies = match (&config, args.copies) {
        (Some(config), _) => CopyCount::Config(config.families()),
        (None, Some(copies)) => CopyCount::Fixed(copies),
        (None, None) => CopyCount::Inferred,
    };
    options.prefix = args.prefix.clone();
    options.sample = args.sample;
    options.rate = args.rate;
    options.scan_count = args.scan_count;
    options.command_timeout = args.timeout;
    options.connect_timeout = args.connect_timeout;
    if args.watch.is_some_and(|interval| interval.is_zero()) {
        return Err(hotsplit::Error::new(
            hotsplit::ErrorKind::Config,
            "--watch: the interval must be positive",
        ));
    }
    options.validate()?;
    Ok(options)
}
