//! `hotsplit serve` and `hotsplit config check`: load and validate the configuration, set up
//! tracing, build the service, bind, serve until a signal; or print the effective configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use hotsplit::config::Config;
use hotsplit::server::Service;

use super::common::{
    init_tracing, redis_password_from_env, runtime, shutdown_signal, LogArgs, LogStream,
    PASSWORD_HELP,
};

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = PASSWORD_HELP)]
pub(crate) struct ServeArgs {
    /// A TOML config file (see hotsplit.example.toml).
    #[arg(long, env = "HOTSPLIT_CONFIG", hide_env_values = true)]
    pub(crate) config: Option<PathBuf>,
    /// The address to listen on. Default: 127.0.0.1:7070.
    #[arg(long, env = "HOTSPLIT_LISTEN", hide_env_values = true)]
    pub(crate) listen: Option<SocketAddr>,
    /// The address of the Redis-protocol listener (`resp.listen`). Default: none (off).
    #[arg(long, env = "HOTSPLIT_RESP_LISTEN", hide_env_values = true)]
    pub(crate) resp_listen: Option<SocketAddr>,
    /// redis://host:port or redis-cluster://host:port[,host:port]; rediss:// and
    /// rediss-cluster:// for TLS; valkey[s]:// synonyms. Default: the embedded store.
    #[arg(long, env = "HOTSPLIT_REDIS", hide_env_values = true)]
    pub(crate) redis: Option<String>,
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

pub(crate) fn serve(args: ServeArgs) -> ExitCode {
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
    if let Err(err) = open_file_limit().and_then(|limit| config.check_file_limit(limit)) {
        eprintln!("hotsplit: invalid configuration: {err}");
        return ExitCode::from(2);
    }
    let runtime = match runtime(config.server.worker_threads) {
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
pub(crate) enum Startup {
    /// [`Service::build`] failed: nothing was bound.
    Build(hotsplit::Error),
    /// Binding the port or serving failed.
    Serve(hotsplit::Error),
}

/// Raises the soft open-file limit to the hard one (systemd and most shells start services
/// at 1024, far below what `server.max_connections` asks for) and returns it.
pub(crate) fn open_file_limit() -> hotsplit::Result<u64> {
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
pub(crate) fn config_check(args: &ServeArgs) -> ExitCode {
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
    print_placements(&config);
    print!("{text}");
    eprintln!("hotsplit config check: the configuration is valid");
    ExitCode::SUCCESS
}

/// One comment line per family: the placement it runs and why. A family whose config names
/// none runs `spread` when it has no copies yet, and keeps `suffix` when it already has `K#i`
/// copies or live readers of them; which, `serve` decides at startup and logs.
fn print_placements(config: &Config) {
    use hotsplit::placement::PlacementReason;
    for family in config.families().iter() {
        let name = family.name();
        match family.placement_reason {
            PlacementReason::Configured => println!(
                "# family {name:?}: placement {} (configured)",
                family.placement.as_str()
            ),
            _ => println!(
                "# family {name:?}: placement not set: spread (default for a new family), or suffix kept if the family already has suffix copies in Redis (decided at startup, logged)"
            ),
        }
    }
}

pub(crate) fn load_config(args: &ServeArgs) -> hotsplit::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(resp_listen) = args.resp_listen {
        config.resp.listen = Some(resp_listen);
    }
    if let Some(redis) = &args.redis {
        config.store.redis = Some(redis.clone());
    }
    config.store.password = redis_password_from_env();
    config.validate()?;
    Ok(config)
}
