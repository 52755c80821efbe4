//! [`RedisCluster`]: three Redis Cluster masters serving all 16384 slots, with no replicas
//! or with one replica each (which a failover promotes).

use std::{
    io,
    net::SocketAddr,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use crate::{RedisServer, TestCa, redis_server::info_field, wait::wait_until};

/// Number of masters; each gets a third of the slots.
const MASTERS: usize = 3;

/// How long the cluster gets to report `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// `cluster-node-timeout` of a cluster without replicas: nothing fails over, so it only
/// decides how soon a node that stops answering is flagged.
const NODE_TIMEOUT_MS: &str = "2000";

/// `cluster-node-timeout` of a cluster with replicas: a master that stops answering is
/// flagged failing after this long, and its replica is elected about a second later.
const FAILOVER_NODE_TIMEOUT_MS: &str = "1000";

/// A Redis Cluster on free loopback ports, created with
/// `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`:
///
/// - [`RedisCluster::start`]: three masters, no replicas (`R = 0`);
/// - [`RedisCluster::start_with_replicas`]: three masters with one replica each (`R = 1`,
///   six nodes), with a short `cluster-node-timeout` (1 s) so that killing a master gets
///   its replica promoted within a few seconds ([`RedisCluster::wait_master`] waits for
///   that).
///
/// Each node is a [`RedisServer`] with `--cluster-enabled yes` and its `nodes.conf` in its
/// own temp dir, so [`RedisServer::restart`] brings a node back into the cluster with its
/// node id and, unless its replica took them over meanwhile, its slots (and an empty
/// dataset). Dropping the cluster kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's `CLUSTER MYID`, in the order of `nodes`.
    ids: Vec<String>,
}

/// One line of `CLUSTER NODES`, as one node sees another.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    /// `myself`, `master`, `slave`, `fail?`, `fail`, ...
    flags: Vec<String>,
    /// The master's id for a replica, `-` for a master.
    master: String,
    /// The slot ranges it serves, inclusive (none for a replica).
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    /// Parses `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch>
    /// <link> <slot>...`; `None` for anything else.
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        let addr = fields[1].split(['@', ',']).next()?;
        let port = addr.rsplit_once(':')?.1.parse().ok()?;
        let slots = fields[8..]
            .iter()
            // `[slot->-id]` / `[slot-<-id]`: a slot being migrated, not served.
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| match range.split_once('-') {
                Some((first, last)) => Some((first.parse().ok()?, last.parse().ok()?)),
                None => range.parse().ok().map(|slot| (slot, slot)),
            })
            .collect();
        Some(Self {
            id: fields[0].to_owned(),
            port,
            flags: fields[2].split(',').map(str::to_owned).collect(),
            master: fields[3].to_owned(),
            slots,
        })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A master not flagged as failing.
    fn is_healthy_master(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.has("fail?")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| (first..=last).contains(&slot))
    }
}

impl RedisCluster {
    /// Starts three masters, joins them into one cluster and waits (at most 30 s) until
    /// every node reports `cluster_state:ok`; panics otherwise.
    pub fn start() -> Self {
        Self::create(0, NODE_TIMEOUT_MS, None)
    }

    /// Like [`RedisCluster::start`], every node speaking TLS only (its clients' port
    /// and the cluster bus), with certificates of one fresh [`TestCa`]: clients must
    /// trust [`RedisCluster::ca`], and [`RedisCluster::urls`] are `rediss://`.
    pub fn start_tls() -> Self {
        Self::create(0, NODE_TIMEOUT_MS, Some(Arc::new(TestCa::new())))
    }

    /// The CA of a [`RedisCluster::start_tls`] cluster's certificates.
    pub fn ca(&self) -> Option<&TestCa> {
        self.nodes.first().and_then(RedisServer::tls)
    }

    /// Starts six nodes and joins them into a cluster of three masters with one replica
    /// each (`cluster-node-timeout` 1 s, `cluster-replica-validity-factor 0` so a replica
    /// may always take over), then waits (at most 30 s) until every node reports
    /// `cluster_state:ok` and every replica is in sync with its master; panics otherwise.
    ///
    /// Which node is a master is decided by `redis-cli`: ask
    /// [`RedisCluster::master_of`] and [`RedisCluster::replica_of`].
    pub fn start_with_replicas() -> Self {
        Self::create(1, FAILOVER_NODE_TIMEOUT_MS, None)
    }

    /// Like [`RedisCluster::start_with_replicas`], with a `cluster-node-timeout` of
    /// `node_timeout_ms`: a killed master's replica is promoted about a second after
    /// that.
    pub fn start_with_replicas_timeout(node_timeout_ms: u64) -> Self {
        Self::create(1, &node_timeout_ms.to_string(), None)
    }

    fn create(replicas: usize, node_timeout_ms: &str, tls: Option<Arc<TestCa>>) -> Self {
        let tls_args: &[&str] = if tls.is_some() {
            &["--tls-cluster", "yes", "--tls-replication", "yes"]
        } else {
            &[]
        };
        let nodes: Vec<RedisServer> = (0..MASTERS * (1 + replicas))
            .map(|_| {
                let args = [
                    tls_args,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        node_timeout_ms,
                        "--cluster-replica-validity-factor",
                        "0",
                        // A replica's first full sync starts at once, not after 5 s.
                        "--repl-diskless-sync-delay",
                        "0",
                    ],
                ]
                .concat();
                match &tls {
                    Some(ca) => RedisServer::start_tls_with(&args, ca),
                    None => RedisServer::start_with(&args),
                }
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|node| node.addr().to_string()).collect();
        let mut cli = Command::new("redis-cli");
        if tls.is_some() {
            cli.arg("--tls")
                .arg("--cacert")
                .arg(nodes[0].dir().join(crate::tls::CA_FILE));
        }
        let output = cli
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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
        let ids = nodes
            .iter()
            .map(|node| {
                node.query(&["CLUSTER", "MYID"])
                    .as_str()
                    .unwrap_or_else(|| panic!("{}: CLUSTER MYID answered no id", node.addr()))
                    .to_owned()
            })
            .collect();
        let cluster = Self { nodes, ids };
        cluster.wait_ok();
        cluster.wait_topology(replicas);
        cluster.wait_replicas_in_sync();
        cluster
    }

    /// Every node, in creation order. For [`RedisCluster::start`], the three masters
    /// (slots 0-5460, 5461-10922, 10923-16383); for [`RedisCluster::start_with_replicas`],
    /// all six, masters and replicas.
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

    /// Waits (at most 30 s) until every running node reports `cluster_state:ok`, knows
    /// every node (a killed one included) and sees every slot assigned to three masters,
    /// e.g. after restarting a node or after a failover; panics otherwise.
    pub fn wait_ok(&self) {
        let known = self.nodes.len().to_string();
        for node in self.running() {
            wait_until(
                &format!("cluster_state:ok on {}", node.addr()),
                CLUSTER_TIMEOUT,
                || {
                    let info = node.query(&["CLUSTER", "INFO"]);
                    let info = info.as_str().unwrap_or_default();
                    let wanted = [
                        ("cluster_state", "ok"),
                        ("cluster_slots_assigned", "16384"),
                        ("cluster_known_nodes", known.as_str()),
                        ("cluster_size", "3"),
                    ];
                    match wanted
                        .iter()
                        .find(|(name, value)| info_field(info, name) != Some(*value))
                    {
                        None => Ok(()),
                        Some((name, value)) => Err(format!("wanted {name}:{value} in\n{info}")),
                    }
                },
            );
        }
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node). Panics when
    /// no node is running.
    pub fn key_slot(&self, key: &str) -> u16 {
        let node = self.any_running();
        match node.query(&["CLUSTER", "KEYSLOT", key]) {
            crate::resp::Reply::Integer(slot) => u16::try_from(slot)
                .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key} answered {slot}")),
            other => panic!("{}: CLUSTER KEYSLOT {key} answered {other:?}", node.addr()),
        }
    }

    /// The node serving `key`'s slot now, as a running node's `CLUSTER NODES` says (a
    /// master not flagged as failing). Panics when none serves it.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        self.master_of_slot(self.key_slot(key))
    }

    /// The node serving `slot` now; see [`RedisCluster::master_of`].
    pub fn master_of_slot(&self, slot: u16) -> &RedisServer {
        let view = self.view(self.any_running());
        let line = view
            .iter()
            .find(|line| line.is_healthy_master() && line.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {view:?}"));
        self.node_at(line.port)
    }

    /// The replica of `master` (the first, if it has several), as a running node's
    /// `CLUSTER NODES` says; `None` when it has none.
    pub fn replica_of(&self, master: &RedisServer) -> Option<&RedisServer> {
        let id = self.id_of(master);
        self.view(self.any_running())
            .iter()
            .find(|line| line.has("slave") && line.master == id)
            .map(|line| self.node_at(line.port))
    }

    /// Waits (at most 30 s) until every replica of `master` has applied everything
    /// `master` has written so far (its `slave_repl_offset` reaches the master's
    /// `master_repl_offset`), so a failover loses none of it; panics otherwise.
    pub fn wait_replicated(&self, master: &RedisServer) {
        let offset = |node: &RedisServer, field: &str| -> Option<u64> {
            let info = node.query(&["INFO", "replication"]);
            info_field(info.as_str().unwrap_or_default(), field)?
                .parse()
                .ok()
        };
        let written = offset(master, "master_repl_offset")
            .unwrap_or_else(|| panic!("{}: INFO names no master_repl_offset", master.addr()));
        let id = self.id_of(master).to_owned();
        let replicas: Vec<&RedisServer> = self
            .view(self.any_running())
            .iter()
            .filter(|line| line.has("slave") && line.master == id)
            .map(|line| self.node_at(line.port))
            .collect();
        for replica in replicas {
            wait_until(
                &format!(
                    "{} to apply {written} bytes of {}",
                    replica.addr(),
                    master.addr()
                ),
                CLUSTER_TIMEOUT,
                || match offset(replica, "slave_repl_offset") {
                    Some(applied) if applied >= written => Ok(()),
                    other => Err(format!("slave_repl_offset is {other:?}")),
                },
            );
        }
    }

    /// Waits (at most `timeout`) until `node` serves slots as a master and every running
    /// node says so and reports `cluster_state:ok`: e.g. for a replica whose master was
    /// killed, until its promotion is complete and known cluster-wide. Panics otherwise.
    pub fn wait_master(&self, node: &RedisServer, timeout: Duration) {
        let id = self.id_of(node).to_owned();
        wait_until(
            &format!("{} to be promoted to master", node.addr()),
            timeout,
            || {
                for other in self.running() {
                    let info = other.query(&["CLUSTER", "INFO"]);
                    let info = info.as_str().unwrap_or_default();
                    if info_field(info, "cluster_state") != Some("ok") {
                        return Err(format!("{}: cluster_state is not ok", other.addr()));
                    }
                    let view = self.view(other);
                    let promoted = view.iter().any(|line| {
                        line.id == id && line.is_healthy_master() && !line.slots.is_empty()
                    });
                    if !promoted {
                        return Err(format!(
                            "{} does not see it serving slots as master: {view:?}",
                            other.addr()
                        ));
                    }
                }
                Ok(())
            },
        );
    }

    /// Waits until every node sees three masters serving slots, each with
    /// `replicas` replicas (replicas learn their roles by gossip, after
    /// `cluster_state:ok`).
    fn wait_topology(&self, replicas: usize) {
        for node in self.running() {
            wait_until(
                &format!(
                    "{} to see {MASTERS} masters with {replicas} replicas each",
                    node.addr()
                ),
                CLUSTER_TIMEOUT,
                || {
                    let view = self.view(node);
                    let masters: Vec<&NodeLine> = view
                        .iter()
                        .filter(|line| line.is_healthy_master() && !line.slots.is_empty())
                        .collect();
                    let complete = masters.len() == MASTERS
                        && masters.iter().all(|master| {
                            view.iter()
                                .filter(|line| line.has("slave") && line.master == master.id)
                                .count()
                                == replicas
                        });
                    if complete {
                        Ok(())
                    } else {
                        Err(format!("CLUSTER NODES: {view:?}"))
                    }
                },
            );
        }
    }

    /// Waits until every replica reports its link to its master up, so that its data is
    /// current and a failover can promote it.
    fn wait_replicas_in_sync(&self) {
        for node in &self.nodes {
            let info = node.query(&["INFO", "replication"]);
            if info_field(info.as_str().unwrap_or_default(), "role") != Some("slave") {
                continue;
            }
            wait_until(
                &format!("{} to sync with its master", node.addr()),
                CLUSTER_TIMEOUT,
                || {
                    let info = node.query(&["INFO", "replication"]);
                    let info = info.as_str().unwrap_or_default();
                    match info_field(info, "master_link_status") {
                        Some("up") => Ok(()),
                        other => Err(format!("master_link_status is {other:?}")),
                    }
                },
            );
        }
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.is_running())
    }

    fn any_running(&self) -> &RedisServer {
        self.running()
            .next()
            .unwrap_or_else(|| panic!("no node of the cluster is running"))
    }

    /// `node`'s `CLUSTER NODES`, parsed.
    fn view(&self, node: &RedisServer) -> Vec<NodeLine> {
        let reply = node.query(&["CLUSTER", "NODES"]);
        let text = reply
            .as_str()
            .unwrap_or_else(|| panic!("{}: CLUSTER NODES answered {reply:?}", node.addr()));
        text.lines().filter_map(NodeLine::parse).collect()
    }

    fn id_of(&self, node: &RedisServer) -> &str {
        let index = self
            .nodes
            .iter()
            .position(|n| n.port() == node.port())
            .unwrap_or_else(|| panic!("{} is not a node of this cluster", node.addr()));
        &self.ids[index]
    }

    fn node_at(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("CLUSTER NODES names port {port}, not one of ours"))
    }
}

#[cfg(test)]
mod tests {
    use super::NodeLine;

    #[test]
    fn cluster_nodes_lines_are_parsed() {
        let master = NodeLine::parse(
            "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004,host \
             myself,master - 0 1426238317239 4 connected 0-5460 5462 [5463->-e7d1eecce]",
        )
        .unwrap();
        assert_eq!(master.port, 30004);
        assert!(master.is_healthy_master() && master.has("myself"));
        assert_eq!(master.slots, [(0, 5460), (5462, 5462)]);
        assert!(master.serves(0) && master.serves(5460) && master.serves(5462));
        assert!(!master.serves(5461) && !master.serves(5463));

        let failed = NodeLine::parse(
            "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 master,fail - \
             1426238316232 1426238315000 1 disconnected",
        )
        .unwrap();
        assert!(!failed.is_healthy_master() && failed.slots.is_empty());

        let replica = NodeLine::parse(
            "6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@40005 slave \
             07c37dfeb235213a872192d90877d0cd55635b91 0 1426238316232 5 connected",
        )
        .unwrap();
        assert!(replica.has("slave"));
        assert_eq!(replica.master, "07c37dfeb235213a872192d90877d0cd55635b91");
        assert!(NodeLine::parse("garbage").is_none());
    }
}
