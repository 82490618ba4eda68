//! The binary's `hotsplit spool drain DIR`: replays the retry spool a dead instance left into
//! the store ([`hotsplit::heal::drain_spool`]), with progress on stderr and a summary on
//! stdout.
//!
//! Exit statuses: 0 when every entry was written, found already newer or expired; 1 when some
//! writes failed (they stay in the spool: run it again) or the store cannot be reached; 2 for a
//! usage or config error (no spool in `DIR`); 3 when a live process holds the spool's lock.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hotsplit::config::Config;
use hotsplit::heal::{spool, DrainProgress, DrainSummary};
use hotsplit::store::redis::RedisStore;

use super::{init_tracing, redis_password_from_env, runtime, LogArgs, LogStream, PASSWORD_HELP};

/// `hotsplit spool …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum SpoolCommand {
    /// Replay the retry spool a dead instance left in DIR into the store.
    Drain(DrainArgs),
}

#[derive(Debug, clap::Args)]
#[command(after_help = PASSWORD_HELP)]
pub(crate) struct DrainArgs {
    /// The spool directory (the dead instance's heal.spool_dir).
    dir: PathBuf,
    /// The dead instance's TOML config: its store (and TLS, user), its retention and value
    /// limit. Its heal.spool_dir is ignored.
    #[arg(long, env = "HOTSPLIT_CONFIG", hide_env_values = true)]
    config: Option<PathBuf>,
    /// redis://host:port or redis-cluster://host:port[,host:port] (rediss for TLS). Default:
    /// store.redis of --config.
    #[arg(long, env = "HOTSPLIT_REDIS", hide_env_values = true)]
    redis: Option<String>,
    #[command(flatten)]
    log: LogArgs,
}

/// Runs a `spool` subcommand.
pub(crate) fn run(command: SpoolCommand) -> ExitCode {
    match command {
        SpoolCommand::Drain(args) => drain(args),
    }
}

fn drain_config(args: &DrainArgs) -> hotsplit::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(redis) = &args.redis {
        config.store.redis = Some(redis.clone());
    }
    config.store.password = redis_password_from_env();
    config.heal.spool_dir = args.dir.clone();
    config.validate()?;
    Ok(config)
}

fn drain(args: DrainArgs) -> ExitCode {
    const NAME: &str = "hotsplit spool drain";
    if let Err(err) = init_tracing(
        args.log.filter.as_deref(),
        "warn",
        args.log.log_format.unwrap_or_default(),
        LogStream::Stderr,
    ) {
        eprintln!("{NAME}: {err}");
        return ExitCode::from(2);
    }
    let config = match drain_config(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{NAME}: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let dir = args.dir.display().to_string();
    if !spool::exists(&args.dir) {
        eprintln!("{NAME}: {dir} holds no spool.log: nothing to drain");
        return ExitCode::from(2);
    }
    if spool::locked_by_another_process(&args.dir) {
        eprintln!("{NAME}: the spool in {dir} is locked by a live process: stop that instance first, or let it drain its own spool");
        return ExitCode::from(3);
    }
    let options = match config.store.redis_options() {
        Ok(Some(mut options)) => {
            options.version_retention = config.version_retention();
            options
        }
        Ok(None) => {
            eprintln!("{NAME}: no Redis to drain into: give --redis or store.redis in --config");
            return ExitCode::from(2);
        }
        Err(err) => {
            eprintln!("{NAME}: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime(0) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let store = RedisStore::connect(options, hotsplit::metrics::Metrics::new()).await?;
        let started = Instant::now();
        let mut last = Instant::now();
        let mut progress = |progress: &DrainProgress| {
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                eprintln!(
                    "{NAME}: {} done, {} pending ({:.1} s)",
                    progress.done,
                    progress.pending,
                    started.elapsed().as_secs_f64()
                );
            }
        };
        hotsplit::heal::drain_spool(
            config.heal.clone(),
            config.server.max_value_bytes,
            Arc::new(store),
            &mut progress,
        )
        .await
    });
    match result {
        Ok(summary) => {
            print!("{}", summary_text(&dir, &summary));
            if summary.left == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "{NAME}: {} entries are left in the spool: run the drain again once the store answers",
                    summary.left
                );
                ExitCode::FAILURE
            }
        }
        Err(err) if err.kind() == hotsplit::ErrorKind::Config => {
            eprintln!("{NAME}: invalid configuration: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("{NAME}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The summary printed on stdout.
fn summary_text(dir: &str, summary: &DrainSummary) -> String {
    format!(
        "spool {dir}: {} entries\n  replayed       {}\n  already newer  {}\n  expired        {}\n  failed writes  {}\n  left in spool  {}\n",
        summary.entries,
        summary.replayed,
        summary.already_newer,
        summary.expired,
        summary.failed,
        summary.left
    )
}
