//! `hotsplit check`: runs the seeded consistency experiment of [`crate::check`] (one instance,
//! or `--instances 2`) on the runtime, stopping on ctrl-c or SIGTERM.

use std::process::ExitCode;

use hotsplit::door::LogFormat;

use super::common::{init_tracing, runtime, shutdown_signal, LogStream};
use crate::check;
use crate::check::cli::{CheckArgs, Nemesis};

pub(crate) fn check(args: CheckArgs) -> ExitCode {
    if args.nemesis == Nemesis::Partition {
        return check_partition(&args);
    }
    let runtime = match runtime(0) {
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

/// `check --instances 2`: the fleet experiment (`check::fleet`).
pub(crate) fn check_fleet(runtime: &tokio::runtime::Runtime, args: &CheckArgs) -> ExitCode {
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

/// `check --nemesis partition`: the partition experiment (`check::partition`). It makes its own
/// runtime inside the driver's network namespace; an interrupted run's children die with it
/// (their parent-death signal) and its namespaces are deleted by the next run.
fn check_partition(args: &CheckArgs) -> ExitCode {
    if let Some(filter) = &args.log {
        if let Err(err) = init_tracing(Some(filter), "off", LogFormat::default(), LogStream::Stderr)
        {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    }
    let options = match args.partition_options() {
        Ok(options) => options,
        Err(err) => {
            eprintln!("hotsplit check: {err}");
            return ExitCode::from(2);
        }
    };
    check::cli::finish_partition(check::partition::run(&options), args.out.as_deref())
}
