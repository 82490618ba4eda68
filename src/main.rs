//! The `hotsplit` binary: `serve` loads and validates the config, sets up tracing, builds the
//! service ([`hotsplit::server::Service::build`]), binds, and serves; or it runs `check`,
//! `audit` or `spool drain` (`spool_cmd`). Each command's flags and code live in its own module
//! of `cmd`; this file parses the command line and dispatches.
//!
//! `check` is a module of the binary, not of the library: it starts throwaway Redis servers
//! with `hotsplit-devcluster`, which the library does not depend on.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod cmd;
mod spool_cmd;

use check::cli::CheckArgs;
// What `spool_cmd` takes from the shared command code.
use cmd::common::{
    init_tracing, redis_password_from_env, runtime, LogArgs, LogStream, PASSWORD_HELP,
};
use cmd::serve::ServeArgs;

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
    Audit(Box<cmd::audit::AuditArgs>),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Openapi => {
            print!("{}", hotsplit::http::openapi::openapi_json());
            ExitCode::SUCCESS
        }
        Command::Serve(args) => cmd::serve::serve(args),
        Command::Check(args) => cmd::check::check(args),
        Command::Audit(args) => cmd::audit::audit(*args),
        Command::Probe(args) => hotsplit::probe::run(&args),
        Command::Config(ConfigCommand::Check(args)) => cmd::serve::config_check(&args),
        Command::Spool(command) => spool_cmd::run(command),
    }
}
