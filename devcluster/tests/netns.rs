//! Network namespaces and partitions end to end: real namespaces, a bridge, nftables rules and
//! `redis-server` processes inside them. Needs root; skipped with a message elsewhere, and a
//! failure (never a skip) when `CI` is set.

use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hotsplit_devcluster::{
    add_namespace, cli_at, namespaces_or_skip, redis_server_path, Host, NetCluster,
    NetClusterOptions, NetNode, Network, Partition, Topology, NET_PORT,
};

/// Tells whether a datagram sent from `from` reaches `to` within 300 ms.
fn reaches(from: &Host, to: &Host, port: u16) -> bool {
    let to_ip = to.ip();
    let receiver = to.run(|| UdpSocket::bind((to_ip, port))).unwrap().unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let from_ip = from.ip();
    from.run(|| {
        let sender = UdpSocket::bind((from_ip, 0)).unwrap();
        sender.send_to(b"hello", (to_ip, port)).unwrap();
    })
    .unwrap();
    let mut buffer = [0u8; 16];
    receiver.recv_from(&mut buffer).is_ok()
}

/// Whether `ip netns list` still shows `namespace`.
fn namespace_exists(namespace: &str) -> bool {
    Path::new("/var/run/netns").join(namespace).exists()
}

#[test]
fn netns_a_cut_blocks_a_tcp_peer_and_heal_restores_it() {
    if !namespaces_or_skip("netns_a_cut_blocks_a_tcp_peer_and_heal_restores_it") {
        return;
    }
    let network = Network::new(&["a", "b", "c"]).unwrap();
    let [a, b, c] = [0, 1, 2].map(|i| network.hosts()[i].clone());
    let dir = std::env::temp_dir().join(format!("{}-redis.log", network.run_id()));
    let _server = a
        .command(redis_server_path().unwrap())
        .args([
            "--bind",
            &a.ip().to_string(),
            "--port",
            "7000",
            "--save",
            "",
        ])
        .args(["--protected-mode", "no"])
        .spawn(&dir)
        .unwrap();
    let ping = |from: &Host, timeout_ms: u64| {
        from.run(|| cli_at(a.ip(), 7000, &["PING"], Duration::from_millis(timeout_ms)))
            .unwrap()
    };
    let started = Instant::now();
    while let Err(error) = ping(&b, 300) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server never answered: {error}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The machine's own namespace has no route to the namespace address.
    assert!(cli_at(a.ip(), 7000, &["PING"], Duration::from_millis(300)).is_err());

    network.apply(&Partition::cut(&a, &b)).unwrap();
    let refused = ping(&b, 300).expect_err("b reached a across the cut");
    assert!(
        refused.to_string().contains("no answer within 300ms"),
        "{refused}"
    );
    assert_eq!(ping(&c, 2000).unwrap(), "PONG", "c is not cut from a");

    network.heal().unwrap();
    assert_eq!(
        ping(&b, 2000).unwrap(),
        "PONG",
        "heal did not restore b -> a"
    );
    let _ = std::fs::remove_file(dir);
}

#[test]
fn netns_a_one_way_drop_and_an_isolated_group() {
    if !namespaces_or_skip("netns_a_one_way_drop_and_an_isolated_group") {
        return;
    }
    let network = Network::new(&["a", "b", "c", "d"]).unwrap();
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| network.hosts()[i].clone());
    assert!(reaches(&a, &b, 9001) && reaches(&b, &a, 9002));

    let one_way = Partition::drop(&b, &a);
    assert_eq!(one_way.label(), "drop(b -> a)");
    network.apply(&one_way).unwrap();
    assert!(!reaches(&b, &a, 9003), "b -> a passed a one-way drop");
    assert!(reaches(&a, &b, 9004), "a -> b was dropped by drop(b -> a)");
    network.heal().unwrap();
    assert!(reaches(&b, &a, 9005), "heal did not restore b -> a");

    let isolated = network.isolate(&[&a, &b]);
    assert_eq!(isolated.label(), "isolate(a, b)");
    network.apply(&isolated).unwrap();
    assert!(
        reaches(&a, &b, 9006) && reaches(&b, &a, 9007),
        "inside the group"
    );
    assert!(reaches(&c, &d, 9008), "outside the group");
    for (from, to) in [(&a, &c), (&c, &a), (&b, &d), (&d, &b)] {
        assert!(
            !reaches(from, to, 9009),
            "{} reached {}",
            from.name(),
            to.name()
        );
    }
    network.heal().unwrap();
    assert!(reaches(&a, &c, 9010) && reaches(&d, &b, 9011));
}

#[test]
fn netns_namespaces_are_removed_after_a_panic_and_leftovers_at_start() {
    if !namespaces_or_skip("netns_namespaces_are_removed_after_a_panic_and_leftovers_at_start") {
        return;
    }
    // A namespace of a run whose process is gone: a pid that has just exited.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let leftover = format!("hsp-{dead_pid}-0-x");
    add_namespace(&leftover).unwrap();

    let made = Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(|| {
        let network = Network::new(&["a", "b"]).unwrap();
        *made.lock().unwrap() = network.namespaces();
        for namespace in network.namespaces() {
            assert!(namespace_exists(&namespace), "{namespace}");
        }
        panic!("a test fails while its network is up");
    });
    assert!(outcome.is_err());
    let made = made.into_inner().unwrap();
    assert_eq!(made.len(), 3, "{made:?}");
    for namespace in &made {
        assert!(
            !namespace_exists(namespace),
            "{namespace} survived the panic"
        );
    }
    assert!(
        !namespace_exists(&leftover),
        "the leftover {leftover} was not removed"
    );
}

#[test]
fn netns_cluster_announces_namespace_addresses_and_fails_over_an_isolated_master() {
    if !namespaces_or_skip(
        "netns_cluster_announces_namespace_addresses_and_fails_over_an_isolated_master",
    ) {
        return;
    }
    let topology = Topology::start(3, 1, &NetClusterOptions::default()).unwrap();
    let cluster = &topology.cluster;
    let view = cluster.topology().unwrap();
    assert_eq!(view.len(), 6);
    for info in &view {
        assert!(info.host.starts_with("10.77.0."), "{}", info.addr());
        assert_eq!(info.port, NET_PORT);
    }
    assert!(cluster.url().starts_with("redis-cluster://10.77.0.1:7000,"));
    let master = cluster.master_for_key(b"greeting").unwrap();
    assert_eq!(
        cluster.cli(master, &["SET", "greeting", "hello"]).unwrap(),
        "OK"
    );
    let replicas = cluster.replicas_of(master).unwrap();
    assert_eq!(replicas.len(), 1, "{view:#?}");
    let replica = replicas[0];
    let replica_ip = replica.host().ip().to_string();
    // Replication is asynchronous: the cut must not come before the replica has the write.
    // (`WAIT` cannot say so here: `cli` opens a connection per command, and `WAIT` counts only
    // the writes of its own connection, so it answered 1 at once. The promoted replica then
    // showed `master_repl_offset:0`.) The replica's offset must reach the master's, which
    // counts the write.
    let written = repl_offset(cluster, master);
    let replicated = (0..100).any(|_| {
        let caught_up = repl_offset(cluster, replica) >= written;
        if !caught_up {
            std::thread::sleep(Duration::from_millis(100));
        }
        caught_up
    });
    assert!(
        replicated,
        "the replica did not reach the master's offset {written} within 10 s"
    );
    let replication = cluster.cli(master, &["INFO", "replication"]).unwrap();
    assert!(
        replication.contains(&format!("ip={replica_ip},")),
        "the master's own replica is not the one the topology names ({replica_ip}): {replication}"
    );

    // The master alone in a minority (with an instance host): the majority promotes its replica.
    let cut = topology
        .network
        .isolate(&[master.host(), &topology.instances[0]]);
    topology.network.apply(&cut).unwrap();
    let started = Instant::now();
    let promoted = cluster
        .wait_until(
            Duration::from_secs(20),
            "the replica to be promoted",
            |view| {
                view.iter().any(|info| {
                    info.host == replica_ip && info.is_master() && !info.slots.is_empty()
                })
            },
        )
        .unwrap();
    eprintln!("failover after {:?}", started.elapsed());
    assert!(promoted
        .iter()
        .any(|info| info.host == replica_ip && info.is_master()));
    assert_serves_greeting(cluster, replica);

    topology.network.heal().unwrap();
    cluster.wait_healthy(Duration::from_secs(30)).unwrap();
    let now_master = cluster.master_for_key(b"greeting").unwrap();
    assert_eq!(now_master.host().ip().to_string(), replica_ip);
    let namespaces = topology.network.namespaces();
    drop(topology);
    for namespace in namespaces {
        assert!(!namespace_exists(&namespace), "{namespace}");
    }
}

/// `node`'s `master_repl_offset`.
fn repl_offset(cluster: &NetCluster, node: &NetNode) -> u64 {
    let info = cluster.cli(node, &["INFO", "replication"]).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("master_repl_offset:"))
        .and_then(|value| value.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no master_repl_offset in {info}"))
}

/// Asserts the promoted `replica` serves `greeting` (polled 5 s); prints what the node says of
/// itself when it does not.
fn assert_serves_greeting(cluster: &NetCluster, replica: &NetNode) {
    // The promoted replica serves the write it had. Polled, and what the node says of itself
    // is printed when it does not come.
    let mut last = String::new();
    let served = (0..50).any(|_| {
        last = cluster
            .cli(replica, &["GET", "greeting"])
            .unwrap_or_else(|error| error.to_string());
        let found = last == "hello";
        if !found {
            std::thread::sleep(Duration::from_millis(100));
        }
        found
    });
    if !served {
        for section in [
            &["INFO", "replication"][..],
            &["INFO", "keyspace"],
            &["CLUSTER", "INFO"],
        ] {
            eprintln!(
                "the promoted replica's {}: {:?}",
                section.join(" "),
                cluster.cli(replica, section)
            );
        }
    }
    assert!(
        served,
        "the promoted replica answered {last:?} for the replicated write"
    );
}
