//! Consistency experiments: the history of a run and the checkers that judge it.
//!
//! [`history`] is the record of every operation a run made (JSON lines); [`checkers`] are pure
//! functions over a history that count what the hotsplit claims forbid: a session's reads going
//! back in time, a writer not seeing its own write, copies that do not converge or that regress,
//! and how stale advisory reads were. They are shared by `hotsplit check` (a seeded experiment on
//! a throwaway cluster) and by unit tests over hand-written histories, which show that each
//! checker catches what it claims.
//!
//! [`cli`] is the command line (flags, the options they make, the printed verdict). The
//! experiment itself, in the shape of `audit/`: [`run`] (orchestration: start
//! the cluster and the service, run each phase, write the histories and the report), `options`
//! (`CheckOptions`, which `run` and `services` read), `services`
//! (the two services under test, near cache off and on: configured, started, stopped), `workload`
//! (one mode's writers, readers and sampler), `resp` (the `resp` mode's clients on the
//! Redis-protocol door), `client_cache` (the `client-cache` mode, named by `--mode`: readers
//! with a client-side cache by redis-py's rules on one service's door, writers through the
//! other service and through it, the feed cuts, and the bound a cached answer is judged
//! against, by [`checkers::client_cache`]), `resp3` (its readers' RESP3 connection and frame
//! parser), `presence` (the presence experiment), `faults`
//! (the seeded fault schedule and replica lag), `recorder` (the shared history, requests and
//! direct copy samples) and [`report`] (the pure figures: judging a history, the report).
//! [`fleet`] is `--instances 2`: two `hotsplit serve` processes, sessions spread over both
//! (`fleet_phase`, the workload of each row),
//! and the convergence after one is SIGKILLed with its spool deleted; [`autosplit`] its row
//! where keys of one copy are split by hot-key detection and merged mid-run. [`partition`] is
//! `--nemesis partition`: real network partitions between network namespaces (a namespaced
//! cluster and two instances), one row per scenario; `partition_scenarios` (the scenarios and
//! their nemeses), `partition_traffic` (writers and readers of one key) and
//! `partition_figures` (a row from a history: the shared checkers, losses, availability,
//! convergence).
//!
//! This module is part of the `hotsplit` binary, not of the library: it starts servers with
//! `hotsplit-devcluster`, which the library does not depend on.

pub mod autosplit;
pub mod checkers;
pub mod cli;
mod client_cache;
mod faults;
pub mod fleet;
mod fleet_phase;
pub mod history;
mod options;
pub mod partition;
mod partition_figures;
mod partition_scenarios;
mod partition_traffic;
mod presence;
mod recorder;
pub mod report;
mod resp;
mod resp3;
pub mod run;
mod services;
mod workload;
