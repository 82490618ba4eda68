//! A Redis Cluster of throwaway nodes ([`Cluster`]): created with `redis-cli --cluster create`,
//! waited for until healthy, and read through `CLUSTER NODES` ([`NodeInfo`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hotsplit_redis_info::{info_field, parse_cluster_nodes};

use crate::error::{io_error, with_port_retries, DevClusterError, Result};
use crate::node::{allocate_ports, start_nodes, NodeRole, NodeSpec, RedisNode};
use crate::process::{read_from, redis_cli_path, redis_server_path, tail_lines};
use crate::resp::{endpoint_cli, round_trip, write_reply_text, Endpoint, Reply};
use crate::tls::TlsFiles;
use crate::{
    poll_until, NodeInfo, CLUSTER_CREATE_TIMEOUT, CLUSTER_POLL_STEP, LOG_TAIL_LINES, POLL_STEP,
    PROBE_TIMEOUT,
};

/// How to start a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The number of masters; at least 3, because `redis-cli --cluster create` refuses fewer.
    /// Default: 3.
    pub masters: usize,
    /// The number of replicas of each master. Default: 1.
    pub replicas_per_master: usize,
    /// `cluster-node-timeout` in milliseconds: how long a node may be unreachable before it is
    /// flagged failed (a paused master is replaced after roughly twice this). Default: 2000.
    pub node_timeout_ms: u64,
    /// Extra arguments for every node's command line, one argv word per element, e.g.
    /// `["--cluster-require-full-coverage", "no"]`. Default: none.
    pub extra_args: Vec<String>,
    /// How long [`Cluster::start`] waits for the new cluster to be healthy. Default: 30 s.
    pub ready_timeout: Duration,
    /// The server binary, e.g. a `valkey-server`. Default: `redis-server` on `PATH`.
    pub program: Option<PathBuf>,
    /// TLS files: every node serves clients, replication and the cluster bus with TLS only.
    /// Default: none, plain TCP.
    pub tls: Option<TlsFiles>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(30),
            program: None,
            tls: None,
        }
    }
}

/// Dropping it kills every node and removes their directories.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, in start order (the first `masters` were the initial masters).
    nodes: Vec<RedisNode>,
    /// The addresses of the masters right after creation, for [`Cluster::url`].
    seed_masters: Vec<String>,
    /// The TLS files of every node, for `redis-cli` and [`Cluster::url`]; `None` for plain TCP.
    tls: Option<TlsFiles>,
}

impl Cluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, joins them into a cluster, and waits
    /// until it is healthy (see [`Cluster::wait_healthy`]).
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] for fewer than 3 masters; otherwise as for
    /// [`Standalone::start`], plus [`DevClusterError::Command`] when `redis-cli --cluster create`
    /// fails and [`DevClusterError::Timeout`] when the cluster does not become healthy.
    pub fn start(options: ClusterOptions) -> Result<Cluster> {
        if options.masters < 3 {
            return Err(DevClusterError::InvalidOptions(format!(
                "a cluster needs at least 3 masters, got {}",
                options.masters
            )));
        }
        let program = match &options.program {
            Some(program) => program.clone(),
            None => redis_server_path()?,
        };
        let cli_program = redis_cli_path()?;
        let total = options.masters * (1 + options.replicas_per_master);
        let spec = NodeSpec {
            role: NodeRole::ClusterNode,
            cluster_node_timeout_ms: options.node_timeout_ms,
            extra_args: options.extra_args.clone(),
            tls: options.tls.clone(),
        };
        let started = Instant::now();
        let nodes = with_port_retries("starting a cluster", || {
            let ports = allocate_ports(total)?;
            let specs = vec![spec.clone(); total];
            start_nodes(&program, &ports, &specs)
        })?;
        tracing::debug!(elapsed = ?started.elapsed(), total, "cluster nodes answer PING");
        let mut cluster = Cluster {
            nodes,
            seed_masters: Vec::new(),
            tls: options.tls.clone(),
        };
        cluster.create(&cli_program, options.replicas_per_master)?;
        tracing::debug!(elapsed = ?started.elapsed(), "redis-cli --cluster create done");
        cluster.wait_healthy(options.ready_timeout)?;
        let mut seed_masters: Vec<NodeInfo> = cluster
            .topology()?
            .into_iter()
            .filter(|info| info.is_master() && !info.slots.is_empty())
            .collect();
        seed_masters.sort_by_key(|info| info.slots.first().copied());
        cluster.seed_masters = seed_masters.into_iter().map(|info| info.addr()).collect();
        tracing::debug!(elapsed = ?started.elapsed(), url = %cluster.url(), "cluster healthy");
        Ok(cluster)
    }

    /// Runs `redis-cli --cluster create` over every node, bounded by [`CLUSTER_CREATE_TIMEOUT`].
    fn create(&self, cli_program: &Path, replicas_per_master: usize) -> Result<()> {
        let first = &self.nodes[0];
        let log_path = first.dir().join("cluster-create.log");
        let context = || {
            format!(
                "running redis-cli --cluster create, output in {}",
                log_path.display()
            )
        };
        let output = File::create(&log_path).map_err(io_error(context()))?;
        let stderr = output.try_clone().map_err(io_error(context()))?;
        let mut command = Command::new(cli_program);
        if let Some(tls) = &self.tls {
            command.args(tls.cli_args());
        }
        command.arg("--cluster").arg("create");
        command.args(self.nodes.iter().map(RedisNode::addr));
        command
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::from(output))
            .stderr(Stdio::from(stderr));
        let mut child = command.spawn().map_err(io_error(context()))?;
        let waited = poll_until(
            CLUSTER_CREATE_TIMEOUT,
            POLL_STEP,
            "redis-cli --cluster create to finish",
            || match child.try_wait() {
                Ok(Some(status)) => Ok(Ok(status)),
                Ok(None) => Err("still running".to_owned()),
                Err(error) => Ok(Err(error)),
            },
        );
        let status = match waited {
            Ok(status) => status.map_err(io_error(context()))?,
            Err(timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(timeout);
            }
        };
        if status.success() {
            return Ok(());
        }
        Err(DevClusterError::Command {
            port: first.port(),
            command: "redis-cli --cluster create".to_owned(),
            message: format!(
                "{status}; output tail:\n{}",
                tail_lines(&read_from(&log_path, 0), LOG_TAIL_LINES)
            ),
        })
    }

    /// The cluster URL listing the masters as they were right after creation:
    /// `"redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"` (`rediss-cluster://` for a
    /// TLS cluster).
    ///
    /// fred's `Config::from_url` does not parse this comma-separated form; use
    /// [`Cluster::fred_url`] for fred.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss-cluster"
        } else {
            "redis-cluster"
        };
        format!("{scheme}://{}", self.seed_masters.join(","))
    }

    /// The same masters in the form fred's `Config::from_url` parses:
    /// `"redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&node=127.0.0.1:P3"`.
    pub fn fred_url(&self) -> String {
        let mut url = String::from("redis-cluster://");
        for (index, addr) in self.seed_masters.iter().enumerate() {
            url.push_str(match index {
                0 => "",
                1 => "?node=",
                _ => "&node=",
            });
            url.push_str(addr);
        }
        url
    }

    /// Every node, in start order, whatever its current role or state.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// How to reach the node on `port`: its own endpoint, or plain TCP for a stranger.
    fn endpoint(&self, port: u16) -> Endpoint {
        self.node(port)
            .map_or_else(|| Endpoint::plain(port), |node| node.endpoint().clone())
    }

    /// The node listening on `port`, if it belongs to this cluster.
    pub fn node(&self, port: u16) -> Option<&RedisNode> {
        self.nodes.iter().find(|node| node.port() == port)
    }

    /// Sends one command to the node on `port` and returns the reply as text, as
    /// [`cli`](crate::cli) does, but over TLS when the cluster speaks TLS: the call for a port
    /// read from `CLUSTER NODES` ([`Cluster::topology`]). Uses a 10 s socket timeout.
    ///
    /// # Errors
    /// As for [`cli`](crate::cli).
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String> {
        self.cli_with_timeout(port, args, crate::DEFAULT_COMMAND_TIMEOUT)
    }

    /// Like [`Cluster::cli`], with `timeout` bounding the connect and every read and write.
    ///
    /// # Errors
    /// As for [`cli_with_timeout`](crate::cli_with_timeout).
    pub fn cli_with_timeout(&self, port: u16, args: &[&str], timeout: Duration) -> Result<String> {
        endpoint_cli(&self.endpoint(port), args, timeout)
    }

    /// The TLS files the nodes serve with; `None` for plain TCP.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The cluster as the first running node (in start order) that answers within 500 ms sees
    /// it, parsed from `CLUSTER NODES`.
    ///
    /// # Errors
    /// [`DevClusterError::NotRunning`] or the last node's error when no node answers.
    pub fn topology(&self) -> Result<Vec<NodeInfo>> {
        let mut last_error = None;
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            match self.topology_from(node.port()) {
                Ok(topology) => return Ok(topology),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(DevClusterError::NotRunning {
            port: self.nodes.first().map_or(0, |node| node.port()),
        }))
    }

    /// The cluster as the node on `port` sees it, parsed from `CLUSTER NODES`.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the node does not answer within 500 ms;
    /// [`DevClusterError::Command`] when it answers with an error or an unparsable text.
    pub fn topology_from(&self, port: u16) -> Result<Vec<NodeInfo>> {
        let text = endpoint_cli(&self.endpoint(port), &["CLUSTER", "NODES"], PROBE_TIMEOUT)?;
        parse_cluster_nodes(&text).map_err(|message| DevClusterError::Command {
            port,
            command: "CLUSTER NODES".to_owned(),
            message,
        })
    }

    /// The nodes currently serving as masters: flagged `master`, not flagged `fail`, and serving
    /// at least one slot, according to [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn masters(&self) -> Result<Vec<&RedisNode>> {
        let topology = self.topology()?;
        Ok(self.nodes_matching(&topology, |info| {
            info.is_master() && !info.is_failed() && !info.slots.is_empty()
        }))
    }

    /// The nodes currently serving as replicas: flagged `slave` and not flagged `fail`, according
    /// to [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn replicas(&self) -> Result<Vec<&RedisNode>> {
        let topology = self.topology()?;
        Ok(self.nodes_matching(&topology, |info| info.is_replica() && !info.is_failed()))
    }

    /// Our nodes whose topology entry satisfies `predicate`, in start order.
    fn nodes_matching(
        &self,
        topology: &[NodeInfo],
        predicate: impl Fn(&NodeInfo) -> bool,
    ) -> Vec<&RedisNode> {
        self.nodes
            .iter()
            .filter(|node| {
                topology
                    .iter()
                    .any(|info| info.port == node.port() && predicate(info))
            })
            .collect()
    }

    /// The master that serves `slot` according to [`Cluster::topology`] (it may be flagged
    /// failed if the failover has not happened yet; check [`NodeInfo::is_failed`]).
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn master_for_slot(&self, slot: u16) -> Result<Option<NodeInfo>> {
        Ok(self
            .topology()?
            .into_iter()
            .find(|info| info.is_master() && info.serves_slot(slot)))
    }

    /// The master that serves the slot of `key` (the Redis Cluster hash slot, computed with
    /// `fred::util::redis_keyslot` as the store does), as [`Cluster::master_for_slot`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn master_for_key(&self, key: &[u8]) -> Result<Option<NodeInfo>> {
        self.master_for_slot(fred::util::redis_keyslot(key))
    }

    /// The nodes that replicate the master with id `master_id`, according to
    /// [`Cluster::topology`].
    ///
    /// # Errors
    /// As for [`Cluster::topology`].
    pub fn replicas_of(&self, master_id: &str) -> Result<Vec<NodeInfo>> {
        Ok(self
            .topology()?
            .into_iter()
            .filter(|info| info.master_id.as_deref() == Some(master_id))
            .collect())
    }

    /// Waits until the cluster is healthy, as [`Cluster::start`] does; usable after a failover
    /// or a restart.
    ///
    /// Healthy means, for every node whose process is running: `CLUSTER INFO` says
    /// `cluster_state:ok`, `cluster_slots_assigned:16384`, `cluster_slots_ok:16384` and
    /// `cluster_known_nodes` equal to the number of nodes; the node is either a master serving
    /// slots or a replica reporting `master_link_status:up`; its `CLUSTER NODES` flags no running
    /// node `fail` or `fail?`; and all running nodes agree on every running node's id and master
    /// and on which masters serve which slots. Nodes that are not running are skipped (they still
    /// count as known nodes).
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] with the first unmet condition of the last check.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let ports: Vec<u16> = self.nodes.iter().map(|node| node.port()).collect();
        poll_until(
            timeout,
            CLUSTER_POLL_STEP,
            &format!("cluster on ports {ports:?} to be healthy"),
            || self.health(),
        )
    }

    /// Checks the condition of [`Cluster::wait_healthy`] once, returning the first unmet part.
    fn health(&self) -> Result<(), String> {
        let running: Vec<&RedisNode> = self.nodes.iter().filter(|node| node.is_running()).collect();
        if running.is_empty() {
            return Err("no node is running".to_owned());
        }
        let total = self.nodes.len().to_string();
        let mut agreed_layout: Option<(u16, Vec<LayoutEntry>)> = None;
        for node in &running {
            let port = node.port();
            let commands: [&[&str]; 3] = [
                &["CLUSTER", "INFO"],
                &["INFO", "replication"],
                &["CLUSTER", "NODES"],
            ];
            let replies = round_trip(node.endpoint(), &commands, PROBE_TIMEOUT)
                .map_err(|error| format!("port {port}: {error}"))?;
            let [cluster_info, replication, cluster_nodes] = replies_as_text(port, &replies)?;
            for (field, expected) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", total.as_str()),
            ] {
                let actual = info_field(&cluster_info, field);
                if actual != Some(expected) {
                    return Err(format!(
                        "port {port}: {field} is {actual:?}, want {expected:?}"
                    ));
                }
            }
            if info_field(&replication, "role") == Some("slave") {
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("port {port}: master_link_status is {link:?}"));
                }
            }
            let view = parse_cluster_nodes(&cluster_nodes)
                .map_err(|error| format!("port {port}: {error}"))?;
            let myself = view
                .iter()
                .find(|info| info.is_myself())
                .ok_or_else(|| format!("port {port}: CLUSTER NODES has no myself line"))?;
            if myself.is_master() && myself.slots.is_empty() {
                return Err(format!(
                    "port {port} is a master without slots (not attached as a replica yet)"
                ));
            }
            let mut layout: Vec<LayoutEntry> = Vec::new();
            for info in view {
                let is_running = running.iter().any(|node| node.port() == info.port);
                if is_running && (info.is_failed() || info.is_suspected()) {
                    return Err(format!(
                        "port {port} flags running node {} as {:?}",
                        info.addr(),
                        info.flags
                    ));
                }
                if is_running || (info.is_master() && !info.slots.is_empty()) {
                    layout.push((info.id, info.port, info.master_id, info.slots));
                }
            }
            layout.sort();
            match &agreed_layout {
                None => agreed_layout = Some((port, layout)),
                Some((first_port, agreed)) if *agreed != layout => {
                    return Err(format!(
                        "ports {first_port} and {port} disagree on roles or the slot map"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Polls [`Cluster::topology`] until `predicate` holds, and returns that topology. `what`
    /// names the condition in the timeout error.
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] naming `what`, with the last topology error if there was one.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut predicate: impl FnMut(&[NodeInfo]) -> bool,
    ) -> Result<Vec<NodeInfo>> {
        poll_until(timeout, CLUSTER_POLL_STEP, what, || match self.topology() {
            Ok(topology) if predicate(&topology) => Ok(topology),
            Ok(_) => Err("the predicate is false".to_owned()),
            Err(error) => Err(error.to_string()),
        })
    }
}

/// One node of a cluster as a health check compares views: id, port, master id, slot ranges.
type LayoutEntry = (String, u16, Option<String>, Vec<(u16, u16)>);

/// Turns the three replies of a health probe into texts, or says which one is an error.
fn replies_as_text(port: u16, replies: &[Reply]) -> Result<[String; 3], String> {
    let text = |index: usize| -> Result<String, String> {
        match replies.get(index) {
            Some(Reply::Error(message)) => Err(format!("port {port}: {message}")),
            Some(reply) => {
                let mut text = String::new();
                write_reply_text(reply, &mut text);
                Ok(text)
            }
            None => Err(format!("port {port}: missing reply")),
        }
    };
    Ok([text(0)?, text(1)?, text(2)?])
}
