//! What the binary's commands share: the log flags and tracing set-up, the runtime, the Redis
//! password from the environment, and the shutdown signal.

use std::process::ExitCode;

use hotsplit::door::LogFormat;
use hotsplit::http::RequestIdFormat;

/// The help text on the Redis password, which has no flag (a flag would show in `ps`).
pub(crate) const PASSWORD_HELP: &str = "Environment:\n  HOTSPLIT_REDIS_PASSWORD  the Redis password (overrides store.password_file; never printed)";

/// The log flags of the commands that log (`serve`, `audit`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LogArgs {
    /// The log filter: a default level and target=level pairs (e.g. info, or warn,hotsplit=debug).
    /// Default: server.log_level of --config (re-read on SIGHUP), else info, for serve; warn for
    /// audit.
    #[arg(long = "log", value_name = "FILTER", env = "HOTSPLIT_LOG")]
    pub(crate) filter: Option<String>,
    /// Log lines as text or json (one object a line; a request's lines carry its request_id).
    /// Default: server.log_format of --config, else text.
    #[arg(long, value_name = "FORMAT", env = "HOTSPLIT_LOG_FORMAT", value_parser = clap::value_parser!(LogFormat))]
    pub(crate) log_format: Option<LogFormat>,
}

/// Where a command's log lines go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LogStream {
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
pub(crate) fn init_tracing(
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

/// The multi-threaded tokio runtime the subcommands run on, with `worker_threads` workers (`0`:
/// one per CPU, `server.worker_threads`).
pub(crate) fn runtime(worker_threads: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder.enable_all().build().map_err(|err| {
        eprintln!("hotsplit: cannot start the runtime: {err}");
        ExitCode::FAILURE
    })
}

/// The Redis password from `HOTSPLIT_REDIS_PASSWORD`, if set and not empty. The binary reads
/// it here, beside the other `HOTSPLIT_*` variables, so nothing below `main` reads the
/// environment.
pub(crate) fn redis_password_from_env() -> Option<hotsplit::store::redis::Password> {
    std::env::var("HOTSPLIT_REDIS_PASSWORD")
        .ok()
        .filter(|password| !password.is_empty())
        .map(hotsplit::store::redis::Password::new)
}

/// Resolves on ctrl-c or SIGTERM. Both handlers are installed when this is called, not when the
/// future is first polled: a signal that finds no handler ends the process with its default
/// action, so `serve` calls this before it binds, and a SIGTERM that arrives as soon as
/// `/readyz` answers drains instead of killing. Call it inside the runtime.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
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
