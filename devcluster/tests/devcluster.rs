//! The crate end to end: real throwaway `redis-server` processes on loopback.

use std::thread;
use std::time::{Duration, Instant};

use hotsplit_devcluster::{cli, ping, Cluster, ClusterOptions, PrimaryReplica, Standalone};

/// Tells whether a process with this pid exists (a zombie would count, but nodes reap on drop).
fn pid_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn standalone_answers_ping_and_dies_on_drop() {
    let started = Instant::now();
    let standalone = Standalone::start().unwrap();
    eprintln!(
        "standalone started in {:?} at {}",
        started.elapsed(),
        standalone.url()
    );
    let port = standalone.node.port();
    assert_eq!(standalone.url(), format!("redis://127.0.0.1:{port}"));
    assert_eq!(cli(port, &["PING"]).unwrap(), "PONG");
    assert_eq!(cli(port, &["SET", "k", "v w"]).unwrap(), "OK");
    assert_eq!(cli(port, &["GET", "k"]).unwrap(), "v w");
    assert_eq!(cli(port, &["GET", "missing"]).unwrap(), "");
    assert!(cli(port, &["NOSUCHCOMMAND"]).is_err());
    assert_eq!(cli(port, &["DEBUG", "SLEEP", "0"]).unwrap(), "OK");
    let pid = standalone.node.pid();
    let dir = standalone.node.dir().to_owned();
    assert!(pid_exists(pid));
    assert!(standalone.node.is_running());
    drop(standalone);
    assert!(!pid_exists(pid), "pid {pid} still exists after drop");
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
}

#[test]
fn standalone_shutdown_restart_and_kill() {
    let standalone = Standalone::start().unwrap();
    let node = &standalone.node;
    let first_pid = node.pid();
    node.shutdown_nosave().unwrap();
    assert!(!node.is_running());
    assert!(!pid_exists(first_pid));
    node.restart().unwrap();
    assert_ne!(node.pid(), first_pid);
    ping(node.port(), Duration::from_secs(1)).unwrap();
    node.kill().unwrap();
    node.kill().unwrap();
    assert!(!node.is_running());
    assert!(node.pause().is_err());
}

#[test]
fn replica_receives_a_key_written_on_the_primary() {
    let started = Instant::now();
    let group = PrimaryReplica::start(1).unwrap();
    eprintln!("primary+replica started in {:?}", started.elapsed());
    let replica = &group.replicas[0];
    assert_eq!(
        cli(group.primary.port(), &["SET", "greeting", "hello"]).unwrap(),
        "OK"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if cli(replica.port(), &["GET", "greeting"]).unwrap() == "hello" {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never saw the key");
        thread::sleep(Duration::from_millis(10));
    }
    let info = cli(replica.port(), &["INFO", "replication"]).unwrap();
    assert!(
        info.lines().any(|line| line == "master_link_status:up"),
        "{info}"
    );
}

#[test]
fn cluster_starts_with_full_coverage_and_survives_a_paused_master() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    eprintln!(
        "3x1 cluster started in {:?}: {}",
        started.elapsed(),
        cluster.url()
    );
    assert_eq!(cluster.nodes().len(), 6);
    assert!(cluster.url().starts_with("redis-cluster://127.0.0.1:"));
    assert_eq!(cluster.url().matches(',').count(), 2);
    assert_eq!(cluster.fred_url().matches("node=").count(), 2);

    let topology = cluster.topology().unwrap();
    let masters: Vec<_> = topology.iter().filter(|info| info.is_master()).collect();
    assert_eq!(masters.len(), 3);
    for master in &masters {
        assert_eq!(cluster.replicas_of(&master.id).unwrap().len(), 1);
    }
    let covered: usize = masters.iter().map(|master| master.slot_count()).sum();
    assert_eq!(covered, 16384);
    for slot in [0, 5000, 16383] {
        assert!(cluster.master_for_slot(slot).unwrap().is_some());
    }
    assert_eq!(cluster.masters().unwrap().len(), 3);
    assert_eq!(cluster.replicas().unwrap().len(), 3);
    let info = cli(cluster.nodes()[0].port(), &["CLUSTER", "INFO"]).unwrap();
    assert!(
        info.lines().any(|line| line == "cluster_state:ok"),
        "{info}"
    );

    let port = cluster.nodes()[0].port();
    for key in [
        "foo",
        "bar",
        "",
        "{user1000}.following",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "hot#3",
        "a{b}c{d}",
    ] {
        let expected: u16 = cli(port, &["CLUSTER", "KEYSLOT", key])
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            fred::util::redis_keyslot(key.as_bytes()),
            expected,
            "key {key:?}"
        );
        // The owner lookup by key agrees with the owner of the slot Redis names.
        let by_key = cluster.master_for_key(key.as_bytes()).unwrap().unwrap();
        let by_slot = cluster.master_for_slot(expected).unwrap().unwrap();
        assert_eq!(by_key.id, by_slot.id, "key {key:?}");
        assert!(by_key.serves_slot(expected), "key {key:?}");
    }

    let master = cluster.masters().unwrap()[0];
    master.pause().unwrap();
    assert!(ping(master.port(), Duration::from_millis(200)).is_err());
    master.resume().unwrap();
    ping(master.port(), Duration::from_secs(1)).unwrap();
    cluster.wait_healthy(Duration::from_secs(10)).unwrap();
}

#[test]
fn cluster_master_restart_rejoins() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let master = cluster.masters().unwrap()[0];
    let id_before = cluster
        .topology_from(master.port())
        .unwrap()
        .into_iter()
        .find(|info| info.is_myself())
        .unwrap()
        .id;
    master.shutdown_nosave().unwrap();
    let started = Instant::now();
    master.restart().unwrap();
    cluster.wait_healthy(Duration::from_secs(20)).unwrap();
    eprintln!(
        "master restarted and cluster healthy again in {:?}",
        started.elapsed()
    );
    let me = cluster
        .topology_from(master.port())
        .unwrap()
        .into_iter()
        .find(|info| info.is_myself())
        .unwrap();
    assert_eq!(me.id, id_before, "nodes.conf was not reused");
}

#[test]
fn two_clusters_start_concurrently() {
    let started = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|_| thread::spawn(|| Cluster::start(ClusterOptions::default())))
        .collect();
    let clusters: Vec<Cluster> = handles
        .into_iter()
        .map(|handle| handle.join().unwrap().unwrap())
        .collect();
    eprintln!(
        "two clusters started concurrently in {:?}",
        started.elapsed()
    );
    let mut ports: Vec<u16> = clusters
        .iter()
        .flat_map(|cluster| cluster.nodes().iter().map(|node| node.port()))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 12);
    for cluster in &clusters {
        assert_eq!(cluster.masters().unwrap().len(), 3);
    }
    // The spawning test threads are gone; the servers must still be alive (PDEATHSIG is tied to
    // the spawner thread, not to them).
    for cluster in &clusters {
        for node in cluster.nodes() {
            ping(node.port(), Duration::from_secs(1)).unwrap();
        }
    }
}
