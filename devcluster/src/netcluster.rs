//! [`NetCluster`]: a Redis Cluster whose nodes each run in their own network namespace (a
//! [`Host`] of a [`Network`](crate::Network)), announcing their namespace address
//! (`cluster-announce-ip`), so that partitions between nodes are real; [`Topology`]: such a
//! cluster (3 masters, 3 replicas by default) with a driver host and N instance hosts on the same
//! bridge.
//!
//! Every node listens on [`NET_PORT`] in its namespace (its bus on `NET_PORT + 10000`, below
//! 32768): the namespaces are private, so there is no port to allocate and none to lose to a
//! concurrent test. The crate's own probes (readiness, health, [`NetCluster::cli`]) run on a
//! thread that joins the driver's namespace ([`Host::run`]); the processes are [`Process`]
//! guards under `ip netns exec`, so they die with this process however it ends.

use std::ffi::OsString;
use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hotsplit_redis_info::{info_field, parse_cluster_nodes};

use crate::child::Process;
use crate::error::{io_error, DevClusterError, Result};
use crate::netns::{Host, Network};
use crate::process::{create_node_dir, read_from, redis_cli_path, redis_server_path, tail_lines};
use crate::resp::{endpoint_cli, round_trip, write_reply_text, Endpoint, Reply};
use crate::{
    poll_until, NodeInfo, CLUSTER_CREATE_TIMEOUT, CLUSTER_POLL_STEP, DEFAULT_COMMAND_TIMEOUT,
    LOG_TAIL_LINES, POLL_STEP, PROBE_TIMEOUT, READY_TIMEOUT,
};

/// The client port of every node of a [`NetCluster`] (in its own namespace).
pub const NET_PORT: u16 = 7000;

/// How long a freshly created cluster has to become healthy.
const NET_HEALTHY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a [`NetCluster`].
#[derive(Clone, Debug)]
pub struct NetClusterOptions {
    /// Replicas per master; the masters are the other nodes. Default: 1.
    pub replicas_per_master: usize,
    /// `cluster-node-timeout` in ms. Default: 2000.
    pub node_timeout_ms: u64,
    /// Extra `redis-server` arguments for every node, one argv word each (e.g.
    /// `--min-replicas-to-write 1`). Default: none.
    pub extra_args: Vec<String>,
}

impl Default for NetClusterOptions {
    fn default() -> Self {
        NetClusterOptions {
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            extra_args: Vec::new(),
        }
    }
}

/// One `redis-server` of a [`NetCluster`], in its host's namespace; killed and its directory
/// removed when dropped.
#[derive(Debug)]
pub struct NetNode {
    /// Its namespace and address.
    host: Host,
    /// Its directory: `redis.log`, `nodes.conf`, `redis.stdio`.
    dir: PathBuf,
    /// The process, `None` once killed.
    process: Mutex<Option<Process>>,
}

impl NetNode {
    /// Its host (namespace and address).
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// `ip:port`, as the cluster announces it.
    pub fn addr(&self) -> String {
        format!("{}:{NET_PORT}", self.host.ip())
    }

    /// Its directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// What it has logged (`redis.log`).
    pub fn log_text(&self) -> String {
        read_from(&self.dir.join("redis.log"), 0)
    }

    /// SIGKILLs it and reaps it; does nothing once it is gone.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when it cannot be reaped.
    pub fn kill(&self) -> Result<()> {
        match self.lock().take() {
            Some(mut process) => process.kill().map(|_| ()),
            None => Ok(()),
        }
    }

    /// The process guard.
    fn lock(&self) -> MutexGuard<'_, Option<Process>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the crate's client reaches it.
    fn endpoint(&self) -> Endpoint {
        Endpoint::at(self.host.ip(), NET_PORT)
    }
}

impl Drop for NetNode {
    fn drop(&mut self) {
        let _ = self.kill();
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), %error, "removing node directory failed");
        }
    }
}

/// A Redis Cluster of nodes in network namespaces; the nodes die when it is dropped.
#[derive(Debug)]
pub struct NetCluster {
    /// Every node, in start order (the first `masters` were created as masters).
    nodes: Vec<NetNode>,
    /// The host the crate's probes run from.
    driver: Host,
    /// How many masters it was created with.
    masters: usize,
}

impl NetCluster {
    /// Starts one `redis-server` in each of `hosts`, creates the cluster with `redis-cli
    /// --cluster create` run from `driver`'s namespace (the first `hosts.len() / (1 +
    /// replicas_per_master)` become masters), and waits until it is healthy.
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] for a node count the options cannot split;
    /// [`DevClusterError::MissingBinary`], [`DevClusterError::ExitedBeforeReady`],
    /// [`DevClusterError::Timeout`] or [`DevClusterError::Command`] when a node or the cluster
    /// does not come up. Whatever was started is killed.
    pub fn start(
        hosts: &[&Host],
        driver: &Host,
        options: &NetClusterOptions,
    ) -> Result<NetCluster> {
        let group = 1 + options.replicas_per_master;
        if hosts.len() < 3 * group || !hosts.len().is_multiple_of(group) {
            return Err(DevClusterError::InvalidOptions(format!(
                "{} nodes cannot make at least 3 masters with {} replicas each",
                hosts.len(),
                options.replicas_per_master
            )));
        }
        let server = redis_server_path()?;
        let mut nodes = Vec::with_capacity(hosts.len());
        for host in hosts {
            let dir = create_node_dir(NET_PORT)?;
            let args = server_args(host, &dir, options);
            let node = NetNode {
                host: (*host).clone(),
                dir,
                process: Mutex::new(None),
            };
            let process = host
                .command(&server)
                .args(args)
                .spawn(node.dir.join("redis.stdio"))?;
            *node.lock() = Some(process);
            nodes.push(node);
        }
        let cluster = NetCluster {
            nodes,
            driver: driver.clone(),
            masters: hosts.len() / group,
        };
        for node in &cluster.nodes {
            cluster.await_ping(node)?;
        }
        cluster.create(options.replicas_per_master)?;
        cluster.wait_healthy(NET_HEALTHY_TIMEOUT)?;
        tracing::debug!(nodes = cluster.nodes.len(), "namespaced cluster healthy");
        Ok(cluster)
    }

    /// Waits until `node` answers PING from the driver's namespace, failing early if it exits.
    fn await_ping(&self, node: &NetNode) -> Result<()> {
        let endpoint = node.endpoint();
        let mut guard = node.lock();
        let Some(process) = guard.as_mut() else {
            return Err(DevClusterError::InvalidOptions(
                "node already killed".to_owned(),
            ));
        };
        let condition = format!("redis-server at {} to answer PING", node.addr());
        self.driver.run(|| {
            process.wait_until(&condition, READY_TIMEOUT, POLL_STEP, || {
                match round_trip(&endpoint, &[&["PING"]], PROBE_TIMEOUT) {
                    Ok(replies) if replies.first() == Some(&Reply::Simple("PONG".to_owned())) => {
                        Ok(())
                    }
                    Ok(replies) => Err(format!("PING answered {replies:?}")),
                    Err(error) => Err(format!("no answer: {error}")),
                }
            })
        })?
    }

    /// Runs `redis-cli --cluster create` in the driver's namespace.
    fn create(&self, replicas_per_master: usize) -> Result<()> {
        let cli = redis_cli_path()?;
        let log_path = self.nodes[0].dir.join("cluster-create.log");
        let context = || {
            format!(
                "running redis-cli --cluster create, output in {}",
                log_path.display()
            )
        };
        let output = File::create(&log_path).map_err(io_error(context()))?;
        let stderr = output.try_clone().map_err(io_error(context()))?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", self.driver.namespace()])
            .arg(cli)
            .args(["--cluster", "create"])
            .args(self.nodes.iter().map(NetNode::addr))
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
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
            port: NET_PORT,
            command: "redis-cli --cluster create".to_owned(),
            message: format!(
                "{status}; output tail:\n{}",
                tail_lines(&read_from(&log_path, 0), LOG_TAIL_LINES)
            ),
        })
    }

    /// The URL hotsplit's `[store] redis` takes, listing the masters as created:
    /// `redis-cluster://10.77.0.1:7000,10.77.0.2:7000,10.77.0.3:7000`.
    pub fn url(&self) -> String {
        let masters: Vec<String> = self.nodes[..self.masters]
            .iter()
            .map(NetNode::addr)
            .collect();
        format!("redis-cluster://{}", masters.join(","))
    }

    /// Every node, in start order.
    pub fn nodes(&self) -> &[NetNode] {
        &self.nodes
    }

    /// The host its probes run from.
    pub fn driver(&self) -> &Host {
        &self.driver
    }

    /// The node whose host is named `name`.
    pub fn node(&self, name: &str) -> Option<&NetNode> {
        self.nodes.iter().find(|node| node.host.name() == name)
    }

    /// The node listening on `ip` (as `CLUSTER NODES` writes it).
    pub fn node_at(&self, ip: &str) -> Option<&NetNode> {
        self.nodes
            .iter()
            .find(|node| node.host.ip().to_string() == ip)
    }

    /// Sends one command to `node` from the driver's namespace and returns the reply as text
    /// (as [`cli`](crate::cli) does), with a 10 s socket timeout.
    ///
    /// # Errors
    /// As for [`cli`](crate::cli); [`DevClusterError::Io`] when the driver's namespace cannot
    /// be joined.
    pub fn cli(&self, node: &NetNode, args: &[&str]) -> Result<String> {
        self.cli_with_timeout(node, args, DEFAULT_COMMAND_TIMEOUT)
    }

    /// Like [`NetCluster::cli`], with `timeout` bounding the connect and each read and write (a
    /// node behind a cut answers nothing: the timeout is how a test sees the cut).
    ///
    /// # Errors
    /// As for [`NetCluster::cli`].
    pub fn cli_with_timeout(
        &self,
        node: &NetNode,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String> {
        let endpoint = node.endpoint();
        self.driver.run(|| endpoint_cli(&endpoint, args, timeout))?
    }

    /// The cluster as `node` sees it (`CLUSTER NODES`), within 500 ms.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when it does not answer; [`DevClusterError::Command`] when its
    /// answer does not parse.
    pub fn topology_from(&self, node: &NetNode) -> Result<Vec<NodeInfo>> {
        let text = self.cli_with_timeout(node, &["CLUSTER", "NODES"], PROBE_TIMEOUT)?;
        parse_cluster_nodes(&text).map_err(|message| DevClusterError::Command {
            port: NET_PORT,
            command: "CLUSTER NODES".to_owned(),
            message,
        })
    }

    /// The cluster as the first running node that answers sees it.
    ///
    /// # Errors
    /// The last node's error when none answers.
    pub fn topology(&self) -> Result<Vec<NodeInfo>> {
        let mut last = None;
        for node in self.nodes.iter().filter(|node| node.lock().is_some()) {
            match self.topology_from(node) {
                Ok(topology) => return Ok(topology),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or(DevClusterError::NotRunning { port: NET_PORT }))
    }

    /// The node that `view` says serves the slot of `key` (it may be flagged failed).
    ///
    /// # Errors
    /// [`DevClusterError::Command`] when no master in `view` serves the slot or it is not one
    /// of ours.
    pub fn master_for_key_in<'a>(&'a self, view: &[NodeInfo], key: &[u8]) -> Result<&'a NetNode> {
        let slot = fred::util::redis_keyslot(key);
        view.iter()
            .find(|info| info.is_master() && !info.is_failed() && info.serves_slot(slot))
            .and_then(|info| self.node_at(&info.host))
            .ok_or_else(|| DevClusterError::Command {
                port: NET_PORT,
                command: "CLUSTER NODES".to_owned(),
                message: format!("no master serves slot {slot}"),
            })
    }

    /// The master serving the slot of `key` now, as [`NetCluster::topology`] sees it.
    ///
    /// # Errors
    /// As for [`NetCluster::topology`] and [`NetCluster::master_for_key_in`].
    pub fn master_for_key(&self, key: &[u8]) -> Result<&NetNode> {
        let view = self.topology()?;
        self.master_for_key_in(&view, key)
    }

    /// The nodes replicating `master`, as [`NetCluster::topology`] sees it.
    ///
    /// # Errors
    /// As for [`NetCluster::topology`].
    pub fn replicas_of(&self, master: &NetNode) -> Result<Vec<&NetNode>> {
        let view = self.topology()?;
        let ip = master.host.ip().to_string();
        let Some(id) = view
            .iter()
            .find(|info| info.host == ip)
            .map(|info| info.id.clone())
        else {
            return Ok(Vec::new());
        };
        Ok(view
            .iter()
            .filter(|info| info.master_id.as_deref() == Some(id.as_str()))
            .filter_map(|info| self.node_at(&info.host))
            .collect())
    }

    /// Polls [`NetCluster::topology`] until `predicate` holds, and returns that view.
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] naming `what`.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        mut predicate: impl FnMut(&[NodeInfo]) -> bool,
    ) -> Result<Vec<NodeInfo>> {
        poll_until(timeout, CLUSTER_POLL_STEP, what, || match self.topology() {
            Ok(view) if predicate(&view) => Ok(view),
            Ok(_) => Err("the predicate is false".to_owned()),
            Err(error) => Err(error.to_string()),
        })
    }

    /// Waits until every running node says `cluster_state:ok` with all 16384 slots ok and
    /// every node known, every replica's link is up, no node flags a running node `fail` or
    /// `fail?`, and all running nodes agree on every node's master and every master's slots.
    ///
    /// # Errors
    /// [`DevClusterError::Timeout`] with the first unmet condition of the last check.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        self.driver.run(|| {
            poll_until(
                timeout,
                CLUSTER_POLL_STEP,
                "the namespaced cluster to be healthy",
                || self.health(),
            )
        })?
    }

    /// One check of [`NetCluster::wait_healthy`], from the calling thread's namespace.
    fn health(&self) -> Result<(), String> {
        let running: Vec<&NetNode> = self
            .nodes
            .iter()
            .filter(|node| node.lock().is_some())
            .collect();
        let running_ips: Vec<String> = running
            .iter()
            .map(|node| node.host.ip().to_string())
            .collect();
        let total = self.nodes.len().to_string();
        let mut agreed: Option<Vec<LayoutEntry>> = None;
        for node in running {
            let addr = node.addr();
            let commands: [&[&str]; 3] = [
                &["CLUSTER", "INFO"],
                &["INFO", "replication"],
                &["CLUSTER", "NODES"],
            ];
            let replies = round_trip(&node.endpoint(), &commands, PROBE_TIMEOUT)
                .map_err(|error| format!("{addr}: {error}"))?;
            let texts: Vec<String> = replies
                .iter()
                .map(|reply| {
                    let mut text = String::new();
                    write_reply_text(reply, &mut text);
                    text
                })
                .collect();
            let [info, replication, nodes] = texts.as_slice() else {
                return Err(format!("{addr}: {} replies to 3 commands", texts.len()));
            };
            for (field, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", total.as_str()),
            ] {
                let have = info_field(info, field);
                if have != Some(want) {
                    return Err(format!("{addr}: {field} is {have:?}, want {want:?}"));
                }
            }
            if info_field(replication, "role") == Some("slave") {
                let link = info_field(replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("{addr}: master_link_status is {link:?}"));
                }
            }
            let view = parse_cluster_nodes(nodes).map_err(|error| format!("{addr}: {error}"))?;
            let addresses: std::collections::HashMap<String, String> = view
                .iter()
                .map(|info| (info.id.clone(), info.host.clone()))
                .collect();
            let mut layout = Vec::new();
            for info in view {
                if running_ips.contains(&info.host) && (info.is_failed() || info.is_suspected()) {
                    return Err(format!("{addr} flags {} as {:?}", info.addr(), info.flags));
                }
                if info.is_myself() && info.is_master() && info.slots.is_empty() {
                    return Err(format!("{addr} is a master without slots"));
                }
                // Every node's master (by address) and every master's slots.
                let master = info
                    .master_id
                    .as_ref()
                    .and_then(|id| addresses.get(id))
                    .cloned();
                layout.push((info.host, master, info.slots));
            }
            layout.sort();
            match &agreed {
                None => agreed = Some(layout),
                Some(first) if *first != layout => {
                    return Err(format!("{addr} disagrees on the roles or the slot map"));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// One node as a health check compares views: its address, its master's address, its slots.
type LayoutEntry = (String, Option<String>, Vec<(u16, u16)>);

/// The `redis-server` command line of a node on `host`.
fn server_args(host: &Host, dir: &std::path::Path, options: &NetClusterOptions) -> Vec<OsString> {
    let ip = host.ip().to_string();
    let mut args: Vec<OsString> = Vec::new();
    for (name, value) in [
        ("--port", NET_PORT.to_string()),
        ("--bind", ip.clone()),
        ("--protected-mode", "no".to_owned()),
        ("--save", String::new()),
        ("--appendonly", "no".to_owned()),
        ("--daemonize", "no".to_owned()),
        ("--repl-diskless-sync", "yes".to_owned()),
        ("--repl-diskless-sync-delay", "0".to_owned()),
        ("--enable-debug-command", "local".to_owned()),
        ("--cluster-enabled", "yes".to_owned()),
        (
            "--cluster-node-timeout",
            options.node_timeout_ms.to_string(),
        ),
        ("--cluster-announce-ip", ip),
    ] {
        args.push(name.into());
        args.push(value.into());
    }
    args.push("--dir".into());
    args.push(dir.as_os_str().to_owned());
    args.push("--logfile".into());
    args.push(dir.join("redis.log").into_os_string());
    args.push("--cluster-config-file".into());
    args.push(dir.join("nodes.conf").into_os_string());
    args.extend(options.extra_args.iter().map(OsString::from));
    args
}

/// A namespaced Redis Cluster with a driver host and instance hosts on one [`Network`]: hosts
/// `r1`… for the nodes, `driver`, and `i1`… for the instances. Fields drop in order: the
/// cluster's processes die before the namespaces are deleted.
#[derive(Debug)]
pub struct Topology {
    /// The cluster.
    pub cluster: NetCluster,
    /// The hosts meant for `hotsplit serve` instances, `i1`….
    pub instances: Vec<Host>,
    /// The host the test's own clients run in.
    pub driver: Host,
    /// The namespaces and the partitions between them.
    pub network: Network,
}

impl Topology {
    /// Makes the network (`masters * (1 + replicas_per_master)` node hosts, a driver and
    /// `instances` instance hosts) and starts the cluster on it.
    ///
    /// # Errors
    /// As for [`Network::new`] and [`NetCluster::start`].
    pub fn start(
        masters: usize,
        instances: usize,
        options: &NetClusterOptions,
    ) -> Result<Topology> {
        let node_count = masters * (1 + options.replicas_per_master);
        let node_names: Vec<String> = (1..=node_count).map(|n| format!("r{n}")).collect();
        let instance_names: Vec<String> = (1..=instances).map(|n| format!("i{n}")).collect();
        let mut names: Vec<&str> = node_names.iter().map(String::as_str).collect();
        names.push("driver");
        names.extend(instance_names.iter().map(String::as_str));
        let network = Network::new(&names)?;
        let node_hosts: Vec<&Host> = network.hosts()[..node_count].iter().collect();
        let driver = network.host("driver")?.clone();
        let cluster = NetCluster::start(&node_hosts, &driver, options)?;
        let instances = network.hosts()[node_count + 1..].to_vec();
        Ok(Topology {
            cluster,
            instances,
            driver,
            network,
        })
    }
}
