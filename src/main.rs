//! The `hotsplit` binary: `serve` loads and validates the config, sets up tracing, builds the
//! service ([`hotsplit::server::Service::build`]), binds, and serves; or it runs `check`,
//! `audit` or `spool drain` (`spool_cmd`).
//!
//! `check` is a module of the binary, not of the library: it starts throwaway Redis servers
//! with `hotsplit-devcluster`, which the library does not depend on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hotsplit::config::Config;
use hotsplit::http::config::LogFormat;
use hotsplit::http::RequestIdFormat;
use hotsplit::server::Service;

mod check;
use check::cli::CheckArgs;
mod spool_cmd;

/// mimalloc instead of glibc malloc: the read path allocates small buffers on both tokio workers,
/// and glibc's arena lock showed up as 13% of the service's CPU under load (docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Split copies of hot Redis values with versioned publish and client-affine, monotonic reads.
#[derive(Debug, Parser)]
#[command(name = "hotsplit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service (on the embedded store unless a Redis URL is given).
    Serve(ServeArgs),
    /// Print the OpenAPI document.
    Openapi,
    /// Run a seeded consistency experiment on a throwaway Redis cluster and report what it finds.
    Check(CheckArgs),
    /// Measure version skew between the copies of live keys, read-only (safe on production).
    Audit(Box<AuditArgs>),
    /// GET a URL once: exit 0 when it answers 2xx in time, 1 otherwise (a container health check).
    Probe(hotsplit::probe::ProbeArgs),
    /// Work with the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Work on a retry spool: `drain DIR` replays a dead instance's spool into the store.
    #[command(subcommand)]
    Spool(spool_cmd::SpoolCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate the effective configuration (the file, HOTSPLIT_* variables and flags, as serve
    /// would run it, the tokens file included) and print it as TOML with secrets redacted: exit
    /// 0, or 2 with a message naming the field.
    Check(ServeArgs),
}

/// The help text on the Redis password, which has no flag (a flag would show in `ps`).
const PASSWORD_HELP: &str = "Environment:\n  HOTSPLIT_REDIS_PASSWORD  the Redis password (overrides store.password_file; never printed)";

#[derive(Debug, clap::Args)]
#[command(after_help = PASSWORD_HELP)]
struct AuditArgs {
    /// redis://host:port (a standalone primary; its replicas are found with INFO replication)
    /// or redis-cluster://host:port[,host:port] (seed nodes); rediss:// and rediss-cluster://
    /// for TLS; valkey[s]:// synonyms. Default: store.redis of --config.
    #[arg(long, env = "HOTSPLIT_REDIS", hide_env_values = true)]
    redis: Option<String>,
    /// PEM file of the CAs that sign the servers' certificates (rediss URLs). Default:
    /// store.tls_ca_file of --config, else the system's roots.
    #[arg(long)]
    tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS. Default: store.tls_cert_file of --config.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM key of --tls-cert-file. Default: store.tls_key_file of --config.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// The ACL user (see README, the read-only audit user). Default: store.username of
    /// --config, else the user of the URL or `default`.
    #[arg(long)]
    username: Option<String>,
    /// A file holding the password. Default: store.password_file of --config.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// A hotsplit TOML config: copy counts come from its families (and --redis from store.redis).
    #[arg(
        long,
        env = "HOTSPLIT_CONFIG",
        hide_env_values = true,
        conflicts_with = "copies"
    )]
    config: Option<PathBuf>,
    /// The copy count of every sampled key. Without it or --config, N is the highest copy index
    /// seen + 1.
    #[arg(long)]
    copies: Option<u32>,
    /// Audit only keys that start with this prefix (a family prefix, e.g. post:).
    #[arg(long)]
    prefix: Option<String>,
    /// The most keys to sample.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_SAMPLE)]
    sample: usize,
    /// Copy reads per second, every node together.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_RATE)]
    rate: u32,
    /// The COUNT of each SCAN page.
    #[arg(long, default_value_t = hotsplit::audit::DEFAULT_SCAN_COUNT)]
    scan_count: u32,
    /// How long one Redis command may take.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    /// How long connecting to one node may take.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    connect_timeout: std::time::Duration,
    /// Print the report as JSON instead of markdown (one line per round with --watch).
    #[arg(long)]
    json: bool,
    /// Exit with status 3 when a copy read on a primary is behind or disagrees (replica lag
    /// alone does not count).
    #[arg(long, conflicts_with = "watch")]
    fail_on_behind: bool,
    /// Repeat the audit every INTERVAL (e.g. 30s) and serve the figures at --metrics-addr.
    #[arg(long, value_parser = humantime::parse_duration)]
    watch: Option<std::time::Duration>,
    /// Where --watch serves Prometheus metrics (/metrics).
    #[arg(long, default_value = "127.0.0.1:9464", requires = "watch")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
}

/// The log flags of the commands that log (`serve`, `audit`).
#[derive(Debug, Clone, clap::Args)]
struct LogArgs {
    /// The log filter: a default level and target=level pairs (e.g. info, or warn,hotsplit=debug).
    /// Default: server.log_level of --config (re-read on SIGHUP), else info, for serve; warn for
    /// audit.
    #[arg(long = "log", value_name = "FILTER", env = "HOTSPLIT_LOG")]
    filter: Option<String>,
    /// Log lines as text or json (one object a line; a request's lines carry its request_id).
    /// Default: server.log_format of --config, else text.
    #[arg(long, value_name = "FORMAT", env = "HOTSPLIT_LOG_FORMAT", value_parser = clap::value_parser!(LogFormat))]
    log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = PASSWORD_HELP)]
struct ServeArgs {
    /// A TOML config file (see hotsplit.example.toml).
    #[arg(long, env = "HOTSPLIT_CONFIG", hide_env_values = true)]
    config: Option<PathBuf>,
    /// The address to listen on. Default: 127.0.0.1:7070.
    #[arg(long, env = "HOTSPLIT_LISTEN", hide_env_values = true)]
    listen: Option<SocketAddr>,
    /// redis://host:port or redis-cluster://host:port[,host:port]; rediss:// and
    /// rediss-cluster:// for TLS; valkey[s]:// synonyms. Default: the embedded store.
    #[arg(long, env = "HOTSPLIT_REDIS", hide_env_values = true)]
    redis: Option<String>,
    #[command(flatten)]
    log: LogArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Openapi => {
            print!("{}", hotsplit::http::openapi::openapi_json());
            ExitCode::SUCCESS
        }
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
        Command::Audit(args) => audit(*args),
        Command::Probe(args) => hotsplit::probe::run(&args),
        Command::Config(ConfigCommand::Check(args)) => config_check(&args),
        Command::Spool(command) => spool_cmd::run(command),
    }
}

/// The multi-threaded tokio runtime the subcommands run on.
/// Where a command's log lines go.
#[derive(Debug, Clone, Copy)]
enum LogStream {
    /// `serve`: its output is the log.
    Stdout,
    /// `audit`: stdout carries the report, so the log goes beside it.
    Stderr,
}

/// Sets up tracing for one command: the filter from `--log` / `HOTSPLIT_LOG`, else
/// `default_filter`; lines as `format` says; colours only in text on a terminal.
///
/// Returns the filter, which a reload may replace ([`hotsplit::logging::LogFilter`]).
///
/// # Errors
/// The filter's parse error, for the caller to report (exit status 2).
fn init_tracing(
    filter: Option<&str>,
    default_filter: &str,
    format: LogFormat,
    stream: LogStream,
) -> Result<hotsplit::logging::LogFilter, String> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // `Targets` is a static filter: unlike `EnvFilter`, it keeps no per-span state, so entering
    // and leaving a span takes no lock (that lock cost ~18% of HTTP read throughput at `info`
    // while every request had a span). `LogFilter` keeps it so, and lets a SIGHUP replace it.
    let targets: tracing_subscriber::filter::Targets = filter
        .unwrap_or(default_filter)
        .parse()
        .map_err(|err| format!("--log / HOTSPLIT_LOG: {err}"))?;
    let filter = hotsplit::logging::LogFilter::new(targets);
    let registry = tracing_subscriber::registry().with(filter.clone());
    let layer = tracing_subscriber::fmt::layer();
    // A line written while a request is handled carries its request id where a `request` span's
    // fields would go (hotsplit::http::RequestIdFormat; a span per request cost ~8% of the read
    // throughput). The text format sets its own colours, since such a line is written into a
    // buffer first.
    let text =
        |ansi: bool| RequestIdFormat::text(tracing_subscriber::fmt::format().with_ansi(ansi));
    let json = || {
        RequestIdFormat::json(
            tracing_subscriber::fmt::format()
                .json()
                .with_current_span(false)
                .with_span_list(false),
        )
    };
    match (format, stream) {
        (LogFormat::Text, LogStream::Stdout) => {
            let ansi = std::io::stdout().is_terminal();
            registry
                .with(layer.with_ansi(ansi).event_format(text(ansi)))
                .init()
        }
        (LogFormat::Text, LogStream::Stderr) => {
            let ansi = std::io::stderr().is_terminal();
            registry
                .with(
                    layer
                        .with_writer(std::io::stderr)
                        .with_ansi(ansi)
                        .event_format(text(ansi)),
                )
                .init()
        }
        (LogFormat::Json, LogStream::Stdout) => {
            registry.with(layer.json().event_format(json())).init()
        }
        (LogFormat::Json, LogStream::Stderr) => registry
            .with(
                layer
                    .json()
                    .event_format(json())
                    .with_writer(std::io::stderr),
            )
            .init(),
    }
    Ok(filter)
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            eprintln!("hotsplit: cannot start the runtime: {err}");
            ExitCode::FAILURE
        })
}

fn check(args: CheckArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    if let Some(filter) = &args.log {
        if let Err(err) = init_tracing(Some(filter), "off", LogFormat::default(), LogStream::Stderr)
        {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    }
    if args.instances == 2 {
        return check_fleet(&runtime, &args);
    }
    let options = match args.options() {
        Ok(options) => options,
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        let cancel = tokio_util::sync::CancellationToken::new();
        let on_signal = cancel.clone();
        let signal = shutdown_signal();
        tokio::spawn(async move {
            signal.await;
            eprintln!("hotsplit check: interrupted; stopping and killing the servers it started");
            on_signal.cancel();
        });
        check::run::run(options, cancel, |progress| {
            eprintln!(
                "[{:>6.1}s] {:<60} {} operations",
                progress.elapsed.as_secs_f64(),
                progress.phase,
                progress.operations
            );
        })
        .await
    });
    check::cli::finish(result)
}

/// Exit status of an audit that found a primary copy behind, with `--fail-on-behind`.
const EXIT_BEHIND: u8 = 3;

/// Exit status of an audit stopped by ctrl-c or SIGTERM before it finished (one-shot mode).
const EXIT_INTERRUPTED: u8 = 130;

/// `check --instances 2`: the fleet experiment (`check::fleet`).
fn check_fleet(runtime: &tokio::runtime::Runtime, args: &CheckArgs) -> ExitCode {
    let options = match args.fleet_options() {
        Ok(options) => options,
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        let cancel = tokio_util::sync::CancellationToken::new();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            on_signal.cancel();
        });
        eprintln!("hotsplit check --instances 2: starting a cluster and two instances");
        check::fleet::run(options, cancel).await
    });
    check::cli::finish_fleet(result, args.out.as_deref())
}

fn audit(args: AuditArgs) -> ExitCode {
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
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match args.watch {
        Some(interval) => audit_watch(&runtime, &options, &args, interval),
        None => audit_once(&runtime, &options, &args),
    }
}

/// One audit round, printed to stdout; progress on stderr.
fn audit_once(
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
fn audit_watch(
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
            options,
            interval,
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
fn audit_exit_code(err: &hotsplit::Error) -> ExitCode {
    match err.kind() {
        hotsplit::ErrorKind::Config => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

/// The audit's options from its flags and the optional config file, validated.
fn audit_options(args: &AuditArgs) -> hotsplit::Result<hotsplit::audit::AuditOptions> {
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

fn serve(args: ServeArgs) -> ExitCode {
    // The config comes first: it may name the log format. Its errors go to stderr directly.
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("hotsplit: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let log_filter = match init_tracing(
        args.log.filter.as_deref(),
        config
            .server
            .log_level
            .as_deref()
            .unwrap_or(hotsplit::reload::DEFAULT_LOG_LEVEL),
        args.log.log_format.unwrap_or(config.server.log_format),
        LogStream::Stdout,
    ) {
        Ok(filter) => filter,
        Err(err) => {
            eprintln!("hotsplit: {err}");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = open_file_limit().and_then(|limit| config.server.check_file_limit(limit)) {
        eprintln!("hotsplit: invalid configuration: {err}");
        return ExitCode::from(2);
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    // SIGHUP re-reads the same file with the same flags and environment over it.
    let log_overridden = args.log.filter.is_some();
    let source_args = args.clone();
    let source: hotsplit::reload::ConfigSource = Box::new(move || load_config(&source_args));
    // Build, then bind, then serve: everything that can fail (the store, its library, the
    // layout records, the spool's lock) fails before the port is taken.
    let result = runtime.block_on(async move {
        let service = match Service::build(config).await {
            Ok(service) => service.reload_on_hangup(source, Some(log_filter), log_overridden),
            Err(err) => return Err(Startup::Build(err)),
        };
        // Before the port is taken: a SIGTERM as soon as the port answers must find its handler.
        let shutdown = shutdown_signal();
        let listeners = match service.bind().await {
            Ok(listeners) => listeners,
            Err(err) => {
                service.close().await;
                return Err(Startup::Serve(err));
            }
        };
        service
            .serve_on(listeners, shutdown)
            .await
            .map_err(Startup::Serve)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Startup::Build(err)) if err.kind() == hotsplit::ErrorKind::Config => {
            eprintln!("hotsplit: invalid configuration: {err}");
            ExitCode::from(2)
        }
        Err(Startup::Build(err)) => {
            eprintln!("hotsplit: cannot start: {err}");
            ExitCode::FAILURE
        }
        Err(Startup::Serve(err)) => {
            eprintln!("hotsplit: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Where `serve` failed: building the service (exit status 2 for a config error, else 1), or
/// binding and serving (1).
enum Startup {
    /// [`Service::build`] failed: nothing was bound.
    Build(hotsplit::Error),
    /// Binding the port or serving failed.
    Serve(hotsplit::Error),
}

/// Raises the soft open-file limit to the hard one (systemd and most shells start services
/// at 1024, far below what `server.max_connections` asks for) and returns it.
fn open_file_limit() -> hotsplit::Result<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            tracing::debug!(open_files = limit, "open-file limit");
            Ok(limit)
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot raise the open-file limit");
            rlimit::Resource::NOFILE
                .get()
                .map(|(soft, _hard)| soft)
                .map_err(|err| {
                    hotsplit::Error::new(
                        hotsplit::ErrorKind::Io,
                        format!("cannot read the open-file limit: {err}"),
                    )
                })
        }
    }
}

/// `hotsplit config check`: what `serve` would run, validated (tokens file and log filter
/// included) and printed with secrets redacted, as `nutcracker -t` does. Exit 0, or 2.
fn config_check(args: &ServeArgs) -> ExitCode {
    let checked = load_config(args).and_then(|config| {
        let tokens = config.auth.load_tokens()?;
        if let Some(filter) = &args.log.filter {
            filter
                .parse::<tracing_subscriber::filter::Targets>()
                .map_err(|err| {
                    hotsplit::Error::new(
                        hotsplit::ErrorKind::Config,
                        format!("--log / HOTSPLIT_LOG: {err}"),
                    )
                })?;
        }
        Ok((config.redacted_toml()?, config, tokens))
    });
    let (text, config, tokens) = match checked {
        Ok(checked) => checked,
        Err(err) => {
            eprintln!("hotsplit config check: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    println!("# The effective configuration: the file, HOTSPLIT_* variables and flags; secrets redacted.");
    if config.store.password.is_some() {
        println!("# store: the password comes from HOTSPLIT_REDIS_PASSWORD (not shown).");
    }
    if let Some(tokens) = &tokens {
        let names: Vec<String> = tokens
            .ids()
            .map(|id| format!("{} ({})", id.name, id.scopes))
            .collect();
        println!(
            "# auth.tokens_file: {} tokens: {}",
            tokens.len(),
            names.join(", ")
        );
    }
    if let Some(filter) = &args.log.filter {
        println!("# --log / HOTSPLIT_LOG sets the log filter ({filter}) over server.log_level.");
    }
    print!("{text}");
    eprintln!("hotsplit config check: the configuration is valid");
    ExitCode::SUCCESS
}

fn load_config(args: &ServeArgs) -> hotsplit::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(redis) = &args.redis {
        config.store.redis = Some(redis.clone());
    }
    config.store.password = redis_password_from_env();
    config.validate()?;
    Ok(config)
}

/// The Redis password from `HOTSPLIT_REDIS_PASSWORD`, if set and not empty. The binary reads
/// it here, beside the other `HOTSPLIT_*` variables, so nothing below `main` reads the
/// environment.
fn redis_password_from_env() -> Option<hotsplit::store::redis::Password> {
    std::env::var("HOTSPLIT_REDIS_PASSWORD")
        .ok()
        .filter(|password| !password.is_empty())
        .map(hotsplit::store::redis::Password::new)
}

/// Resolves on ctrl-c or SIGTERM. Both handlers are installed when this is called, not when the
/// future is first polled: a signal that finds no handler ends the process with its default
/// action, so `serve` calls this before it binds, and a SIGTERM that arrives as soon as
/// `/readyz` answers drains instead of killing. Call it inside the runtime.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let interrupt = signal(SignalKind::interrupt());
    let terminate = signal(SignalKind::terminate());
    async move {
        let interrupt = async {
            match interrupt {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for ctrl-c");
                    std::future::pending::<()>().await;
                }
            }
        };
        let terminate = async {
            match terminate {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = interrupt => tracing::info!("ctrl-c received"),
            () = terminate => tracing::info!("SIGTERM received"),
        }
    }
}
