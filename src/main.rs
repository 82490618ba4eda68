//! The `hotsplit` binary: parse config, set up tracing, bind, call [`hotsplit::server::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hotsplit::config::Config;

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
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Total duration of the workload phases (modes and presence), e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: std::time::Duration,
    /// Seed of the fault schedule and the readers' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hot keys per mode.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    keys: u32,
    /// Reader sessions per mode.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    readers: u32,
    /// Copies per hot key.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    copies: u32,
    /// Write report.md, summary.json and the histories (JSON lines) here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// A TOML config file (see hotsplit.example.toml).
    #[arg(long, env = "HOTSPLIT_CONFIG")]
    config: Option<PathBuf>,
    /// The address to listen on. Default: 127.0.0.1:7070.
    #[arg(long, env = "HOTSPLIT_LISTEN")]
    listen: Option<SocketAddr>,
    /// redis://host:port or redis-cluster://host:port[,host:port]. Default: the embedded store.
    #[arg(long, env = "HOTSPLIT_REDIS")]
    redis: Option<String>,
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
    }
}

/// The multi-threaded tokio runtime both subcommands run on.
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
    let options = hotsplit::check::run::CheckOptions {
        duration: args.duration,
        seed: args.seed,
        keys: args.keys,
        readers: args.readers,
        copies: args.copies,
        out: args.out,
    };
    let result = runtime.block_on(async move {
        let cancel = tokio_util::sync::CancellationToken::new();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            eprintln!("hotsplit check: interrupted; stopping and killing the servers it started");
            on_signal.cancel();
        });
        hotsplit::check::run::run(options, cancel, |progress| {
            eprintln!(
                "[{:>6.1}s] {:<60} {} operations",
                progress.elapsed.as_secs_f64(),
                progress.phase,
                progress.operations
            );
        })
        .await
    });
    match result {
        Ok(report) => {
            println!("{}", report.markdown());
            let failures = report.failures();
            if failures.is_empty() {
                println!("PASS: no floor violation, no affine violation outside loss windows, no wrong decides-on-presence decision.");
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

fn serve(args: ServeArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HOTSPLIT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("hotsplit: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .map_err(|err| {
                hotsplit::Error::new(
                    hotsplit::ErrorKind::Io,
                    format!("cannot listen on {}: {err}", config.server.listen),
                )
            })?;
        hotsplit::server::run(listener, config, shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hotsplit: {err}");
            ExitCode::FAILURE
        }
    }
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
    config.validate()?;
    Ok(config)
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
        () = ctrl_c => tracing::info!("ctrl-c received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}
