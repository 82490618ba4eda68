//! Throwaway `redis-server` processes on loopback: standalone, primary with replicas, and
//! cluster; the same cluster in network namespaces, for partitions; and throwaway child
//! processes of any other program (`hotsplit serve`).
//!
//! This crate owns starting, signalling and stopping real Redis servers and `hotsplit serve`
//! processes for hotsplit's integration tests, its benches and `hotsplit check`. It is test and experiment
//! tooling, not the product path: the service talks to Redis only through its `store::redis`
//! module and fred, and the `hotsplit` library does not depend on this crate (only the binary,
//! for `check`, and the tests and benches do). Everything here is synchronous std code (no
//! tokio).
//!
//! # Layout
//! - [`Standalone`] and [`PrimaryReplica`] (`standalone.rs`) and [`Cluster`] (`cluster.rs`):
//!   started, waited for until usable, and killed (with their temporary directories removed)
//!   when dropped.
//! - [`RedisNode`] (`node.rs`): one server process, with fault injection (`pause`, `resume`,
//!   `kill`, `shutdown_nosave`, `restart`).
//! - [`cli`], [`cli_with_timeout`] and [`ping`] (`resp.rs`): a minimal RESP client for sending a
//!   command to a node and reading the reply as text; [`RedisNode::cli`] speaks TLS to a TLS
//!   node.
//! - [`TlsFiles`] (`tls.rs`): the PEM files of TLS nodes (`--tls-port`, `--tls-replication`,
//!   `--tls-cluster`) and the rustls configuration of the RESP client's probes.
//! - [`Process`] and [`ProcessBuilder`] (`child.rs`): a child process of any program with its
//!   stdout and stderr in a log file, a readiness wait ([`Process::wait_for_http`],
//!   [`Process::wait_until`], or a [`Readiness`] driven by an async caller) whose errors quote
//!   the log's tail, SIGKILL ([`Process::kill`]), SIGTERM ([`Process::terminate`]), any signal,
//!   and SIGKILL + reap on drop.
//! - [`ServerOptions`] and [`ClusterOptions`]: another server binary (e.g. `valkey-server`),
//!   TLS, extra arguments.
//! - [`Network`], [`Host`] and [`Partition`] (`netns.rs`): hosts in network namespaces on a
//!   bridge, code and processes run inside them, and partitions (cut, one-way drop, isolate)
//!   made and healed with nftables; [`NetCluster`] and [`Topology`] (`netcluster.rs`): a Redis
//!   Cluster whose nodes each live in a namespace, with a driver and instance hosts beside it.
//! - `process.rs`: binaries, ports, the spawner thread, the pid registry, signals and node
//!   directories; the only file with `unsafe` code.
//! - [`NodeInfo`]: the parsed `CLUSTER NODES` view, from the `hotsplit-redis-info` crate that the
//!   store shares; the hash slot of a key is fred's `redis_keyslot`
//!   ([`Cluster::master_for_key`]).
//!
//! # Invariants
//! - Every server and every [`Process`] is spawned by one long-lived "spawner" thread with
//!   `PR_SET_PDEATHSIG` set to `SIGKILL`. Linux delivers that signal when the *thread* that
//!   forked the child exits, and test threads exit after every test, so no other thread ever
//!   spawns a child. The spawner thread never exits, so children die exactly when the test
//!   process dies, however it dies.
//! - Every live child's pid is in a process-wide registry, and an `atexit` handler sends
//!   `SIGKILL` to every pid still registered when the process exits normally (statics are never
//!   dropped).
//! - A signal is only ever sent to a pid that has not been reaped yet, so a recycled pid is never
//!   hit by mistake.
//! - Ports come from `20000..=50000` (never the developer's Redis on 6379), and a port is only
//!   used if both it and its cluster bus port (port + 10000) can be bound on 127.0.0.1.
//! - A namespaced node ([`NetCluster`]) listens on [`NET_PORT`] inside its own namespace, never
//!   on the machine's; its namespaces are named per run and deleted on drop, and those of dead
//!   runs at the next [`Network::new`].
//! - Nothing is printed to stdout; progress goes to `tracing::debug!`.

use std::thread;
use std::time::{Duration, Instant};

mod child;
mod cluster;
mod error;
mod netcluster;
mod netns;
mod node;
mod process;
mod resp;
mod standalone;
mod tls;

pub use child::{Process, ProcessBuilder, Readiness};
pub use cluster::{Cluster, ClusterOptions};
pub use error::{DevClusterError, Result};
pub use hotsplit_redis_info::ClusterNode as NodeInfo;
pub use netcluster::{NetCluster, NetClusterOptions, NetNode, Topology, NET_PORT};
pub use netns::{add_namespace, namespaces_or_skip, netns_support, Host, Network, Partition};
pub use node::{NodeRole, RedisNode};
pub use process::{redis_cli_path, redis_server_path};
pub use resp::{cli, cli_at, cli_with_timeout, ping};
pub use standalone::{PrimaryReplica, ServerOptions, Standalone};
pub use tls::TlsFiles;

/// The lowest client port this module hands out.
pub(crate) const PORT_MIN: u16 = 20_000;
/// The highest client port this module hands out (its bus port is 60000).
pub(crate) const PORT_MAX: u16 = 50_000;
/// Redis Cluster listens for its bus on the client port plus this offset.
pub(crate) const BUS_PORT_OFFSET: u16 = 10_000;
/// How many candidate ports one allocation tries before giving up.
pub(crate) const PORT_CANDIDATES: usize = 2_000;
/// How many times a start is retried with fresh ports when a port is taken under our feet.
pub(crate) const START_ATTEMPTS: usize = 6;
/// How many times `restart` retries when its (fixed) port is briefly taken by someone else.
pub(crate) const RESTART_ATTEMPTS: usize = 10;
/// How long a freshly spawned server has to answer `PING`.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica has to report `master_link_status:up`.
pub(crate) const REPLICA_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `shutdown_nosave` waits for the process to exit.
pub(crate) const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `redis-cli --cluster create` may run.
pub(crate) const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// The step of the readiness and health polls.
pub(crate) const POLL_STEP: Duration = Duration::from_millis(20);
/// The step of the cluster-wide polls, which open one connection per node per step.
pub(crate) const CLUSTER_POLL_STEP: Duration = Duration::from_millis(50);
/// The socket timeout of the probes used by polls; a paused node must not stall a poll for long.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The socket timeout of [`cli`].
pub(crate) const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How many log lines a start failure carries.
pub(crate) const LOG_TAIL_LINES: usize = 25;
/// The text Redis logs when it cannot bind a port. Redis gives no structured signal for this, so
/// the log is the only place to learn it.
pub(crate) const ADDR_IN_USE: &str = "Address already in use";

// ---------------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------------

/// Calls `check` every `step` until it returns `Ok` or `timeout` has passed.
///
/// `check` returns why the condition is still false; the last reason ends up in the error.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    step: Duration,
    condition: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last_seen) if started.elapsed() >= timeout => {
                return Err(DevClusterError::Timeout {
                    condition: condition.to_owned(),
                    waited: started.elapsed(),
                    last_seen,
                })
            }
            Err(_) => thread::sleep(step),
        }
    }
}
