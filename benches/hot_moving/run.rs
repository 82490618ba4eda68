//! The run, step by step: start the fleet, start the observers, load through part 1 and part 2,
//! stop everything, then print the report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::analysis::{split_figures, Measured};
use crate::fleet::{publish, Fleet};
use crate::keys::{unix_ms, KeyId, Schedule};
use crate::load::{load_task, Load, Tally};
use crate::observe::Observers;
use crate::options::Options;
use crate::report::{load_average, render, Context};
use crate::{BoxError, AFTER_SPREAD, SPLIT_KEY};

/// The whole bench: one run, one table on stdout.
pub(crate) async fn run(options: Options) -> Result<(), BoxError> {
    let context = Context {
        load_before: load_average(),
        started: Instant::now(),
        options: options.clone(),
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(options.concurrency + 8)
        .timeout(Duration::from_secs(5))
        .build()?;
    let fleet = Fleet::start(&options).await?;
    let offsets = options.move_offsets();
    publish_keys(&http, &fleet.bases[0], offsets.len()).await?;

    // Observers first, then the load.
    let schedule = Schedule {
        start: Instant::now(),
        start_ms: unix_ms(),
        part1: options.duration,
        moves: offsets,
    };
    let observers = Observers::start(&http, &fleet, &schedule, &options);
    let load = Arc::new(Load {
        http: http.clone(),
        bases: fleet.bases.clone(),
        schedule: schedule.clone(),
        options: options.clone(),
        stop: AtomicBool::new(false),
    });
    let tasks: Vec<_> = (0..options.concurrency)
        .map(|task| tokio::spawn(load_task(load.clone(), task)))
        .collect();
    run_part1(&options, &schedule).await;
    run_part2(&options, &schedule, &observers).await;
    load.stop.store(true, Ordering::Relaxed);
    let tally = gather(tasks).await?;
    let load_ended_ms = unix_ms();
    let observed = observers.stop().await?;
    let masters = fleet.masters.len();
    // The instances and the cluster go now; the work directory (their logs) at the end.
    let _dir = fleet.stop();

    let measured = Measured::of(&schedule, tally, observed, load_ended_ms, masters);
    print!("{}", render(&context, &measured));
    Ok(())
}

/// Publishes version 1 of each of part 1's `moves` hot keys and of [`SPLIT_KEY`] through `base`.
async fn publish_keys(http: &reqwest::Client, base: &str, moves: usize) -> Result<(), BoxError> {
    eprintln!("hot_moving: instances ready; publishing {moves} hot keys and {SPLIT_KEY}");
    for m in 0..moves {
        publish(http, base, &KeyId::Hot(m as u32).name()).await?;
    }
    publish(http, base, SPLIT_KEY).await
}

/// Part 1, the moving hotspot: waits out `--duration` while the load moves its hot key.
async fn run_part1(options: &Options, schedule: &Schedule) {
    eprintln!(
        "hot_moving: part 1, {} moves about every {} for {}",
        schedule.moves.len(),
        humantime::format_duration(options.hot_every),
        humantime::format_duration(options.duration)
    );
    tokio::time::sleep_until((schedule.start + options.duration).into()).await;
}

/// Part 2, the split: waits until the masters' samples show [`SPLIT_KEY`] spread, then
/// [`AFTER_SPREAD`] more, or `--split-hold` without it.
async fn run_part2(options: &Options, schedule: &Schedule, observers: &Observers) {
    eprintln!("hot_moving: part 2, the hotspot on {SPLIT_KEY} (split family)");
    let moved = schedule.part2_ms();
    let part2_until = Instant::now() + options.split_hold;
    let mut spread_at: Option<Instant> = None;
    loop {
        tokio::time::sleep(options.interval).await;
        let now = Instant::now();
        if spread_at.is_some_and(|at| now >= at + AFTER_SPREAD) || now >= part2_until {
            break;
        }
        if spread_at.is_none()
            && observers
                .with_samples(|samples| split_figures(moved, samples, &[]).spread_ms.is_some())
        {
            spread_at = Some(now);
        }
    }
}

/// Every load task's tally, summed (the tasks have been told to stop).
async fn gather(tasks: Vec<JoinHandle<Tally>>) -> Result<Tally, BoxError> {
    let mut tally = Tally::default();
    for task in tasks {
        let part = task.await?;
        tally.reads.extend(part.reads);
        tally.found += part.found;
        tally.missing += part.missing;
        tally.other += part.other;
        tally.failed += part.failed;
    }
    Ok(tally)
}
