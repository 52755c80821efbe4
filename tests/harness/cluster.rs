//! `RedisCluster`: three masters serving every slot; a restarted node rejoins; with a
//! replica per master, a killed master's replica takes over its slots.

use redislimit_tests::RedisCluster;

/// Lines of `CLUSTER NODES` that describe a master.
fn masters(cluster: &RedisCluster) -> usize {
    let nodes = cluster.nodes()[0].query(&["CLUSTER", "NODES"]);
    let nodes = nodes
        .as_str()
        .expect("CLUSTER NODES is a bulk string")
        .to_owned();
    nodes
        .lines()
        .filter(|line| line.split(' ').nth(2).is_some_and(|f| f.contains("master")))
        .count()
}

#[test]
fn cluster_is_ok_with_three_masters() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.urls().len(), 3);
    for node in cluster.nodes() {
        let info = node.command(&["CLUSTER", "INFO"]);
        assert!(
            info.contains("cluster_state:ok\r\n"),
            "{}: {info}",
            node.addr()
        );
        assert!(
            info.contains("cluster_size:3\r\n"),
            "{}: {info}",
            node.addr()
        );
    }
    assert_eq!(masters(&cluster), 3);

    // Every node owns some slots: a key is served by exactly one node, the others redirect.
    let replies: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| node.command(&["SET", "some-key", "1"]))
        .collect();
    assert_eq!(
        replies.iter().filter(|r| *r == "+OK\r\n").count(),
        1,
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|r| r.starts_with("-MOVED ")).count(),
        2,
        "{replies:?}"
    );
}

#[test]
fn a_restarted_node_rejoins_the_cluster() {
    let cluster = RedisCluster::start();
    let node = &cluster.nodes()[1];
    node.restart();
    cluster.wait_ok();
    assert_eq!(masters(&cluster), 3);
    assert!(
        node.command(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok\r\n")
    );
}

#[test]
fn a_killed_master_is_replaced_by_its_replica() {
    let cluster = RedisCluster::start_with_replicas();
    assert_eq!(cluster.nodes().len(), 6);
    let key = "some-key";
    let master = cluster.master_of(key);
    assert_eq!(master.command(&["SET", key, "1"]), "+OK\r\n");
    cluster.wait_replicated(master);
    let replica = cluster
        .replica_of(master)
        .expect("every master has a replica");
    assert_ne!(replica.port(), master.port());
    master.kill();
    cluster.wait_master(replica, std::time::Duration::from_secs(20));
    cluster.wait_ok();
    assert_eq!(cluster.master_of(key).port(), replica.port());
    assert_eq!(
        replica.command(&["GET", key]),
        "$1\r\n1\r\n",
        "the write was replicated"
    );
}
