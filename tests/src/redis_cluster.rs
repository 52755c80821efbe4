//! [`RedisCluster`]: three Redis Cluster masters (no replicas) serving all 16384 slots.

use std::{
    io,
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use crate::{RedisServer, redis_server::info_field, wait::wait_until};

/// Number of masters; each gets a third of the slots.
const MASTERS: usize = 3;

/// How long the cluster gets to report `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// A three-master Redis Cluster on free loopback ports, created with
/// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
///
/// Each node is a [`RedisServer`] with `--cluster-enabled yes` and its `nodes.conf` in its
/// own temp dir, so [`RedisServer::restart`] brings a node back into the cluster with its
/// slots (and an empty dataset). Dropping the cluster kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three masters, joins them into one cluster and waits (at most 30 s) until
    /// every node reports `cluster_state:ok`; panics otherwise.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..MASTERS)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|node| node.addr().to_string()).collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    panic!(
                        "`redis-cli` is not on PATH: install Redis with `apt-get install \
                         redis-server redis-tools redis-sentinel`, or run `cargo xtask test`"
                    )
                }
                panic!("cannot run `redis-cli --cluster create`: {e}")
            });
        assert!(
            output.status.success(),
            "`redis-cli --cluster create {}` exited with {}:\n{}\n{}",
            addrs.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        cluster
    }

    /// The three masters, in creation order (slots 0-5460, 5461-10922, 10923-16383).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Every node's `127.0.0.1:PORT`.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// Every node's `redis://127.0.0.1:PORT/`, the seed list a cluster client takes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits (at most 30 s) until every node reports `cluster_state:ok`, knows all three
    /// masters and sees every slot assigned, e.g. after restarting a node; panics
    /// otherwise.
    pub fn wait_ok(&self) {
        for node in &self.nodes {
            wait_until(
                &format!("cluster_state:ok on {}", node.addr()),
                CLUSTER_TIMEOUT,
                || {
                    let info = node.query(&["CLUSTER", "INFO"]);
                    let info = info.as_str().unwrap_or_default();
                    let wanted = [
                        ("cluster_state", "ok"),
                        ("cluster_slots_assigned", "16384"),
                        ("cluster_known_nodes", "3"),
                        ("cluster_size", "3"),
                    ];
                    match wanted
                        .iter()
                        .find(|(name, value)| info_field(info, name) != Some(value))
                    {
                        None => Ok(()),
                        Some((name, value)) => Err(format!("wanted {name}:{value} in\n{info}")),
                    }
                },
            );
        }
    }
}
