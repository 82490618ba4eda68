//! Network namespaces for partition tests: a [`Network`] of [`Host`]s (one namespace each, on a
//! bridge in a switch namespace), partitions as values ([`Partition`]: a two-way cut, a one-way
//! drop, a group isolated from everyone else) made and healed with nftables, and the ways to run
//! code and processes inside a host (a thread that joins its namespace, [`Host::run`]; a child
//! under `ip netns exec`, [`Host::command`]).
//!
//! # Invariants
//! - Nothing is added to the machine's own namespace: the veth pairs are created inside the
//!   switch namespace with their peer placed straight into the host's namespace, and every
//!   address lives inside a namespace this module made. Deleting the namespaces removes every
//!   interface and rule.
//! - Namespaces are named `hsp-<pid>-<run>-<name>`: a [`Network`] deletes its own when dropped
//!   (also while a panic unwinds), and every new [`Network`] deletes those of processes that
//!   no longer exist (a run that was killed), so an interrupted run cannot break
//!   the next.
//! - Rules live in one nftables table (`inet hsp`) per host namespace, on its input hook: a
//!   packet from a cut peer is dropped on arrival, which leaves TCP connections open and silent,
//!   as a real partition does. [`Network::heal`] deletes every table.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;

use crate::child::ProcessBuilder;
use crate::error::{io_error, DevClusterError, Result};
use crate::process::{join_netns, lock_exclusive, process_gone};

/// The prefix of every namespace this module makes.
const PREFIX: &str = "hsp-";

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/var/run/netns";

/// The /24 every network uses; hosts get `.1`, `.2`, … in creation order. Each network has its
/// own bridge in its own namespaces, so networks of concurrent tests never meet.
const SUBNET: [u8; 3] = [10, 77, 0];

/// The most hosts one network holds (the /24 minus the network and broadcast addresses).
const MAX_HOSTS: usize = 253;

/// Numbers the networks of this process.
static NEXT_RUN: AtomicU32 = AtomicU32::new(0);

/// One namespace of a [`Network`]: a name, a namespace and an address on the bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The name given at creation, e.g. `"r1"` or `"driver"`.
    name: String,
    /// The namespace, `hsp-<pid>-<run>-<name>`.
    namespace: String,
    /// Its address on the bridge, `10.77.0.<index + 1>`.
    ip: Ipv4Addr,
    /// Its place in the network's list.
    index: usize,
}

impl Host {
    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's name, for `ip netns exec`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Its address on the bridge (reachable only from the network's own namespaces).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// `program` run inside this host's namespace (see [`ProcessBuilder::in_netns`]).
    pub fn command(&self, program: impl Into<PathBuf>) -> ProcessBuilder {
        ProcessBuilder::new(program).in_netns(&self.namespace)
    }

    /// Runs `work` on a fresh thread that has joined this host's namespace, and returns its
    /// result: every socket it opens, and every thread it spawns (a tokio runtime built inside
    /// it, say), lives in the namespace. A panic in `work` is resumed on the caller.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the namespace cannot be opened or joined.
    pub fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> Result<T> {
        let handle = self.handle()?;
        let context = format!("joining network namespace {}", self.namespace);
        thread::scope(|scope| {
            let worker = scope.spawn(move || join_netns(&handle).map(|()| work()));
            match worker.join() {
                Ok(result) => result.map_err(io_error(context)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Moves the calling thread into this host's namespace for the rest of its life (threads it
    /// spawns afterwards start there too). Meant for a test's own thread; the crate's spawner
    /// thread is unaffected.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when the namespace cannot be opened or joined.
    pub fn enter(&self) -> Result<()> {
        let handle = self.handle()?;
        join_netns(&handle).map_err(io_error(format!(
            "joining network namespace {}",
            self.namespace
        )))
    }

    /// Opens `/var/run/netns/<namespace>`.
    fn handle(&self) -> Result<File> {
        let path = PathBuf::from(NETNS_DIR).join(&self.namespace);
        File::open(&path).map_err(io_error(format!("opening {}", path.display())))
    }
}

/// A set of dropped directions between hosts, applied with [`Network::apply`]: a value, so a
/// test or a nemesis can build, print and combine partitions before making them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// `(from, to)` host indexes: packets from `from` are dropped when they reach `to`.
    edges: BTreeSet<(usize, usize)>,
    /// A readable description, e.g. `cut(r1, i1) + drop(i2 -> r3)`.
    label: String,
}

impl Partition {
    /// `a` and `b` cannot reach each other, in either direction.
    pub fn cut(a: &Host, b: &Host) -> Partition {
        Partition {
            edges: BTreeSet::from([(a.index, b.index), (b.index, a.index)]),
            label: format!("cut({}, {})", a.name, b.name),
        }
    }

    /// Packets from `from` to `to` are dropped; the other direction passes (a TCP connection
    /// either way stalls, as its acknowledgements are lost; datagrams show the difference).
    pub fn drop(from: &Host, to: &Host) -> Partition {
        Partition {
            edges: BTreeSet::from([(from.index, to.index)]),
            label: format!("drop({} -> {})", from.name, to.name),
        }
    }

    /// This partition and `other` at once.
    pub fn and(mut self, other: Partition) -> Partition {
        self.edges.extend(other.edges);
        self.label = match (self.label.is_empty(), other.label.is_empty()) {
            (true, _) => other.label,
            (false, true) => self.label,
            (false, false) => format!("{} + {}", self.label, other.label),
        };
        self
    }

    /// Tells whether it drops nothing.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Its description, e.g. `isolate(r1, i1)`.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Hosts, each in its own network namespace, on one bridge; the namespaces are deleted when it
/// is dropped.
#[derive(Debug)]
pub struct Network {
    /// `hsp-<pid>-<run>`, the prefix of every namespace of this network.
    run: String,
    /// The switch namespace holding the bridge; `None` until it exists.
    switch: Option<String>,
    /// The hosts made so far, in order.
    hosts: Vec<Host>,
    /// The directions dropped now.
    dropped: Mutex<BTreeSet<(usize, usize)>>,
}

impl Network {
    /// Makes a switch namespace with a bridge and one namespace per name, each with a veth on
    /// the bridge, the address `10.77.0.<n>` and its loopback up. Removes the namespaces of
    /// earlier runs whose process is gone first.
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] for an empty, repeated or unusable name, or too many;
    /// [`DevClusterError::Network`] when `ip` refuses (not root, no namespaces: see
    /// [`netns_support`]). What was made before the failure is removed.
    pub fn new(names: &[&str]) -> Result<Network> {
        validate_names(names)?;
        sweep_leftovers();
        let run = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT_RUN.fetch_add(1, Ordering::SeqCst)
        );
        let mut network = Network {
            run,
            switch: None,
            hosts: Vec::new(),
            dropped: Mutex::new(BTreeSet::new()),
        };
        let switch = format!("{}-sw", network.run);
        add_namespace(&switch)?;
        network.switch = Some(switch.clone());
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        ip(&["-n", &switch, "link", "set", "lo", "up"])?;
        for (index, name) in names.iter().enumerate() {
            let namespace = format!("{}-{name}", network.run);
            add_namespace(&namespace)?;
            let [a, b, c] = SUBNET;
            let octet = u8::try_from(index + 1).map_err(|_| {
                DevClusterError::InvalidOptions(format!("more than {MAX_HOSTS} hosts"))
            })?;
            let host = Host {
                name: (*name).to_owned(),
                namespace: namespace.clone(),
                ip: Ipv4Addr::new(a, b, c, octet),
                index,
            };
            network.hosts.push(host.clone());
            let port = format!("p{index}");
            ip(&[
                "-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &namespace,
            ])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &switch, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", host.ip);
            ip(&["-n", &namespace, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        }
        tracing::debug!(run = %network.run, hosts = names.len(), "network namespaces made");
        Ok(network)
    }

    /// The prefix of its namespaces, `hsp-<pid>-<run>`.
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// Every namespace it made (the switch's last), for checks that they are gone.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.hosts.iter().map(|h| h.namespace.clone()).collect();
        names.extend(self.switch.clone());
        names
    }

    /// Its hosts, in creation order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`.
    ///
    /// # Errors
    /// [`DevClusterError::InvalidOptions`] when there is none.
    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .ok_or_else(|| DevClusterError::InvalidOptions(format!("no host named {name:?}")))
    }

    /// The hosts of `group` cut from every host outside it (both ways); inside the group, and
    /// outside it, everyone still reaches everyone.
    pub fn isolate(&self, group: &[&Host]) -> Partition {
        let inside: BTreeSet<usize> = group.iter().map(|host| host.index).collect();
        let mut edges = BTreeSet::new();
        for host in &self.hosts {
            if inside.contains(&host.index) {
                continue;
            }
            for member in &inside {
                edges.insert((host.index, *member));
                edges.insert((*member, host.index));
            }
        }
        let names: Vec<&str> = group.iter().map(|host| host.name.as_str()).collect();
        Partition {
            edges,
            label: format!("isolate({})", names.join(", ")),
        }
    }

    /// Adds `partition` to what is dropped now (partitions accumulate until [`Network::heal`]),
    /// rewriting the rules of every host that receives a dropped direction in one atomic
    /// `nft -f` each.
    ///
    /// # Errors
    /// [`DevClusterError::Network`] when `nft` refuses.
    pub fn apply(&self, partition: &Partition) -> Result<()> {
        let mut dropped = self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        dropped.extend(partition.edges.iter().copied());
        let receivers: BTreeSet<usize> = partition.edges.iter().map(|(_, to)| *to).collect();
        for to in receivers {
            let sources: Vec<String> = dropped
                .iter()
                .filter(|(_, receiver)| *receiver == to)
                .filter_map(|(from, _)| self.hosts.get(*from))
                .map(|host| host.ip.to_string())
                .collect();
            let Some(host) = self.hosts.get(to) else {
                continue;
            };
            let rules = format!(
                "table inet hsp\ndelete table inet hsp\ntable inet hsp {{\n  chain input {{\n    \
                 type filter hook input priority 0; policy accept;\n    ip saddr {{ {} }} drop\n  \
                 }}\n}}\n",
                sources.join(", ")
            );
            nft(&host.namespace, &rules)?;
        }
        tracing::debug!(run = %self.run, partition = %partition.label, "partition applied");
        Ok(())
    }

    /// Removes every rule: all hosts reach each other again (connections that survived the
    /// cut resume; the kernel retransmits what was dropped).
    ///
    /// # Errors
    /// [`DevClusterError::Network`] when `nft` refuses.
    pub fn heal(&self) -> Result<()> {
        let mut dropped = self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        let receivers: BTreeSet<usize> = dropped.iter().map(|(_, to)| *to).collect();
        for to in receivers {
            if let Some(host) = self.hosts.get(to) {
                nft(&host.namespace, "table inet hsp\ndelete table inet hsp\n")?;
            }
        }
        dropped.clear();
        tracing::debug!(run = %self.run, "network healed");
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for namespace in self.namespaces() {
            if let Err(error) = ip(&["netns", "del", &namespace]) {
                tracing::debug!(%namespace, %error, "deleting a network namespace failed");
            }
        }
    }
}

/// Checks that this machine lets us make network namespaces (root, `ip` and `nft` installed, a
/// kernel that allows it) by making and deleting one, with an nftables table in it.
///
/// # Errors
/// [`DevClusterError::Network`] saying what was refused.
pub fn netns_support() -> Result<()> {
    let network = Network::new(&["probe"])?;
    let host = network.host("probe")?;
    nft(&host.namespace, "table inet hsp\ndelete table inet hsp\n")?;
    drop(network);
    Ok(())
}

/// Serializes making and sweeping namespaces in this process. A sweep by one test
/// ([`sweep_leftovers`]) must not delete a namespace another test is still adding: `ip netns
/// add` creates the file under `/var/run/netns` first and bind-mounts the namespace on it
/// after, so a sweep in between fails the add ("Bind /proc/self/ns/net -> … failed: No such
/// file or directory"). [`NAMESPACES_LOCK`]'s `flock` holds it across processes too.
static NAMESPACES: Mutex<()> = Mutex::new(());

/// The file whose `flock` serializes adding and sweeping namespaces between processes.
const NAMESPACES_LOCK: &str = "/run/hsp-netns.lock";

/// Holds both locks of [`NAMESPACES`] until dropped.
struct NamespacesHeld {
    _in_process: std::sync::MutexGuard<'static, ()>,
    _file: Option<File>,
}

/// Takes [`NAMESPACES`] and the `flock` beside it (without the file, as on a read-only `/run`,
/// the in-process lock still holds).
fn hold_namespaces() -> NamespacesHeld {
    let in_process = NAMESPACES.lock().unwrap_or_else(PoisonError::into_inner);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(NAMESPACES_LOCK)
        .ok()
        .filter(|file| lock_exclusive(file).is_ok());
    NamespacesHeld {
        _in_process: in_process,
        _file: file,
    }
}

/// Makes the named network namespace with `ip netns add`, never while a sweep runs (see
/// [`NAMESPACES`]). Tests that make a namespace by hand go through this too.
///
/// # Errors
/// [`DevClusterError::Network`] when `ip` refuses (not root, the name exists).
pub fn add_namespace(name: &str) -> Result<()> {
    let _held = hold_namespaces();
    ip(&["netns", "add", name])
}

/// For a test that needs namespaces: `true` when [`netns_support`] says they work here;
/// otherwise says why on stderr and returns `false` (the test skips), or panics when `CI` is set
/// (CI runs as root, so a namespace test never skips there).
///
/// # Panics
/// When namespaces are refused and `CI` is set.
pub fn namespaces_or_skip(test: &str) -> bool {
    match netns_support() {
        Ok(()) => true,
        Err(error) if std::env::var_os("CI").is_some() => {
            panic!("{test}: network namespaces are required in CI (run as root): {error}")
        }
        Err(error) => {
            eprintln!("SKIPPED {test}: this machine refuses network namespaces: {error}");
            false
        }
    }
}

/// Names must be non-empty, distinct, short and plain (they end up in namespace names).
fn validate_names(names: &[&str]) -> Result<()> {
    if names.len() > MAX_HOSTS {
        return Err(DevClusterError::InvalidOptions(format!(
            "{} hosts asked for, at most {MAX_HOSTS}",
            names.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for name in names {
        let plain = !name.is_empty()
            && name.len() <= 16
            && name.bytes().all(|b| b.is_ascii_alphanumeric())
            && *name != "sw";
        if !plain {
            return Err(DevClusterError::InvalidOptions(format!(
                "host name {name:?}: use 1 to 16 ASCII letters or digits (not \"sw\")"
            )));
        }
        if !seen.insert(*name) {
            return Err(DevClusterError::InvalidOptions(format!(
                "host name {name:?} given twice"
            )));
        }
    }
    Ok(())
}

/// Deletes the namespaces of earlier runs whose process no longer exists.
fn sweep_leftovers() {
    let _held = hold_namespaces();
    let Ok(entries) = fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let owner = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok());
        if owner.is_some_and(process_gone) {
            tracing::debug!(namespace = name, "deleting a namespace of a dead run");
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Runs `ip <args>`.
fn ip(args: &[&str]) -> Result<()> {
    run_tool("ip", args, None)
}

/// Runs `ip netns exec <namespace> nft -f -` with `rules` on its stdin.
fn nft(namespace: &str, rules: &str) -> Result<()> {
    run_tool(
        "ip",
        &["netns", "exec", namespace, "nft", "-f", "-"],
        Some(rules),
    )
}

/// Runs `program args` with `input` on its stdin and fails with its stderr when it fails.
fn run_tool(program: &str, args: &[&str], input: Option<&str>) -> Result<()> {
    let command_line = format!("{program} {}", args.join(" "));
    let failed = |message: String| DevClusterError::Network {
        command: command_line.clone(),
        message,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| {
            failed(format!(
                "cannot run it: {error} (install iproute2 and nftables)"
            ))
        })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|error| failed(format!("writing its input: {error}")))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|error| failed(format!("waiting for it: {error}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(failed(format!(
        "{}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}
