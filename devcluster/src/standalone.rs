//! A lone server ([`Standalone`]) and a primary with replicas ([`PrimaryReplica`]).

use std::path::PathBuf;
use std::time::Duration;

use hotsplit_redis_info::info_field;

use crate::error::{with_port_retries, DevClusterError, Result};
use crate::node::{allocate_ports, start_nodes, NodeRole, NodeSpec, RedisNode};
use crate::process::{allocate_port, redis_server_path};
use crate::tls::TlsFiles;
use crate::{poll_until, POLL_STEP, PROBE_TIMEOUT, REPLICA_SYNC_TIMEOUT};

/// How to start standalone servers, apart from their ports.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The server binary, e.g. a `valkey-server`. Default: `redis-server` on `PATH`.
    pub program: Option<PathBuf>,
    /// TLS files: every server listens with TLS only. Default: none, plain TCP.
    pub tls: Option<TlsFiles>,
    /// Extra arguments for every server's command line, one argv word each. Default: none.
    pub extra_args: Vec<String>,
}

impl ServerOptions {
    /// The server binary to run.
    pub(crate) fn program(&self) -> Result<PathBuf> {
        match &self.program {
            Some(program) => Ok(program.clone()),
            None => redis_server_path(),
        }
    }
}

/// One standalone server.
#[derive(Debug)]
pub struct Standalone {
    /// The server.
    pub node: RedisNode,
}

impl Standalone {
    /// Starts a standalone server on a free port and waits until it answers `PING`.
    ///
    /// # Errors
    /// [`DevClusterError::MissingBinary`], [`DevClusterError::StartFailed`] (with the log tail),
    /// [`DevClusterError::Timeout`] or [`DevClusterError::Io`].
    pub fn start() -> Result<Standalone> {
        Standalone::start_with_args(&[])
    }

    /// Like [`Standalone::start`], appending `extra_args` (one argv word each, e.g.
    /// `["--maxmemory", "10mb"]`) to the server's command line.
    ///
    /// # Errors
    /// As for [`Standalone::start`].
    pub fn start_with_args(extra_args: &[&str]) -> Result<Standalone> {
        Standalone::start_with_options(&ServerOptions {
            extra_args: extra_args.iter().map(|arg| (*arg).to_owned()).collect(),
            ..ServerOptions::default()
        })
    }

    /// Like [`Standalone::start`], with another binary, TLS or extra arguments.
    ///
    /// # Errors
    /// As for [`Standalone::start`], and [`DevClusterError::Io`] when a TLS file is unusable.
    pub fn start_with_options(options: &ServerOptions) -> Result<Standalone> {
        let program = options.program()?;
        let spec = NodeSpec {
            role: NodeRole::Standalone,
            cluster_node_timeout_ms: 0,
            extra_args: options.extra_args.clone(),
            tls: options.tls.clone(),
        };
        with_port_retries("starting a standalone redis-server", || {
            let port = allocate_port()?;
            let mut nodes = start_nodes(&program, &[port], std::slice::from_ref(&spec))?;
            let node = nodes
                .pop()
                .ok_or_else(|| DevClusterError::InvalidOptions("no node was started".to_owned()))?;
            Ok(Standalone { node })
        })
    }

    /// The client URL: `"redis://127.0.0.1:<port>"` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        self.node.url()
    }
}

// ---------------------------------------------------------------------------------------------
// Primary with replicas
// ---------------------------------------------------------------------------------------------

/// A primary and its replicas (plain replication, no cluster, no sentinel).
#[derive(Debug)]
pub struct PrimaryReplica {
    /// The primary.
    pub primary: RedisNode,
    /// The replicas, each started with `--replicaof 127.0.0.1 <primary port>`.
    pub replicas: Vec<RedisNode>,
}

impl PrimaryReplica {
    /// Starts a primary and `replica_count` replicas, and waits until every replica reports
    /// `master_link_status:up`.
    ///
    /// # Errors
    /// As for [`Standalone::start`]; [`DevClusterError::Timeout`] names the replica that did not
    /// sync.
    pub fn start(replica_count: usize) -> Result<PrimaryReplica> {
        PrimaryReplica::start_with_args(replica_count, &[])
    }

    /// Like [`PrimaryReplica::start`], appending `extra_args` (one argv word each) to every
    /// server's command line.
    ///
    /// # Errors
    /// As for [`PrimaryReplica::start`].
    pub fn start_with_args(replica_count: usize, extra_args: &[&str]) -> Result<PrimaryReplica> {
        PrimaryReplica::start_with_options(
            replica_count,
            &ServerOptions {
                extra_args: extra_args.iter().map(|arg| (*arg).to_owned()).collect(),
                ..ServerOptions::default()
            },
        )
    }

    /// Like [`PrimaryReplica::start`], with another binary, TLS or extra arguments.
    ///
    /// # Errors
    /// As for [`PrimaryReplica::start`].
    pub fn start_with_options(
        replica_count: usize,
        options: &ServerOptions,
    ) -> Result<PrimaryReplica> {
        let program = options.program()?;
        let extra_args = options.extra_args.clone();
        with_port_retries("starting a primary with replicas", || {
            let ports = allocate_ports(replica_count + 1)?;
            let primary_port = ports[0];
            let spec = |role| NodeSpec {
                role,
                cluster_node_timeout_ms: 0,
                extra_args: extra_args.clone(),
                tls: options.tls.clone(),
            };
            let mut specs = vec![spec(NodeRole::Primary)];
            specs.extend((0..replica_count).map(|_| spec(NodeRole::Replica { primary_port })));
            let mut nodes = start_nodes(&program, &ports, &specs)?.into_iter();
            let primary = nodes.next().ok_or_else(|| {
                DevClusterError::InvalidOptions("no primary was started".to_owned())
            })?;
            let group = PrimaryReplica {
                primary,
                replicas: nodes.collect(),
            };
            for replica in &group.replicas {
                wait_replica_link_up(replica, REPLICA_SYNC_TIMEOUT)?;
            }
            Ok(group)
        })
    }

    /// The primary's client URL: `"redis://127.0.0.1:<port>"`.
    pub fn url(&self) -> String {
        self.primary.url()
    }
}

/// Waits until `replica` reports `master_link_status:up`.
fn wait_replica_link_up(replica: &RedisNode, timeout: Duration) -> Result<()> {
    let port = replica.port();
    poll_until(
        timeout,
        POLL_STEP,
        &format!("replica on port {port} to report master_link_status:up"),
        || {
            let info = replica
                .cli_with_timeout(&["INFO", "replication"], PROBE_TIMEOUT)
                .map_err(|error| error.to_string())?;
            match info_field(&info, "master_link_status") {
                Some("up") => Ok(()),
                other => Err(format!("master_link_status is {other:?}")),
            }
        },
    )
}
